#!/bin/sh
# ublk scenario, guest side: `qpath host` in the guest serves /dev/ublkb0 over both paths of
# `qpath target` on the host (netns vmlab); a file system, fstrim, fio verify under path
# flaps, the namespace grown and shrunk under the device, a target kill -9 + restart, a
# kill -9 + restart of qpath itself (user recovery), and a device that `qpath host --config
# --persist` brings back after a "reboot".
# Settings: UBLK_FIO_RUNTIME (s, per fio phase); UBLK_SIZE, UBLK_GROWN (the namespace's bytes
# before and after the grow).
. /vmlab/qpath-lib.sh
Q=/vmlab/qpath
SOCK=/tmp/qpath-host.sock
STATE=/tmp/qpath-state
RT=${UBLK_FIO_RUNTIME:-30}
export RUST_LOG=${GUEST_RUST_LOG:-info}
HOSTS=0

step "modules"
for m in $(cat /vmlab/modules/order); do
  [ -d "/sys/module/$m" ] || insmod "/vmlab/modules/$m.ko" || fail "insmod $m"
done
[ -c /dev/ublk-control ] && pass "ublk_drv loaded: /dev/ublk-control" || { fail "no /dev/ublk-control"; finish; }

start_host() {   # a qpath host on $SOCK; sets HOSTPID
  HOSTS=$((HOSTS + 1))
  $Q host --rpc-socket $SOCK --state-dir $STATE > /tmp/host.$HOSTS.log 2>&1 &
  HOSTPID=$!
  wait_until 30 $Q ublk list --rpc-socket $SOCK > /dev/null 2>&1
}
show_host_log() { echo "---- qpath host log $1 (tail)"; tail -${2:-15} /tmp/host.$1.log; }
# fio_ok FILE WHAT: the fio run wrote and read back, no error, no verify failure
fio_ok() {
  if grep -q "err= 0" "$1" && ! grep -qE "err= *[1-9]|verify: bad|bad magic|crc32c:" "$1" \
      && grep -qE "^ +read: IOPS" "$1"; then
    pass "$2: fio err=0, no verify failure ($(grep -E '^ +(read|write): IOPS' "$1" | tr -s ' ' | tr '\n' ' '))"
  else
    fail "$2: fio reported errors:"; grep -E "err=|verify|error" "$1" | head -20
  fi
}
FIO="fio --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --verify=crc32c --group_reporting"

step "qpath host and ublk add over both paths"
start_host && pass "qpath host answers on $SOCK" || { fail "qpath host did not start"; show_host_log 1; finish; }
# --max-transfer above the target's MDTS (1 MiB): the device's largest request must be MDTS.
DEV=$($Q ublk add --rpc-socket $SOCK -a "$ADDR" -s "$PORT1" -s "$PORT2" -n "$NQN" -c 1 -l -1 \
  --iopolicy round-robin --queues 2 --depth 64 --max-transfer 2097152 2>/tmp/add.err)
if [ "$DEV" = /dev/ublkb0 ] && [ -b /dev/ublkb0 ]; then pass "qpath ublk add: $DEV"
else fail "qpath ublk add: '$DEV' $(cat /tmp/add.err)"; show_host_log 1 30; finish; fi
$Q ublk list --rpc-socket $SOCK
# A name names one device: a second device under a name already served is refused, and
# `ublk del --name` deletes the one it names.
D2=$($Q ublk add --rpc-socket $SOCK --name twin -a "$ADDR" -s "$PORT1" -n "$NQN" -c 1 2>/tmp/add.twin.err)
if [ -b "$D2" ] && ! $Q ublk add --rpc-socket $SOCK --name twin -a "$ADDR" -s "$PORT2" -n "$NQN" -c 1 2>/tmp/add.twin2.err \
    && grep -q "is taken by $D2" /tmp/add.twin2.err && $Q ublk del --rpc-socket $SOCK --name twin && [ ! -b "$D2" ]; then
  pass "a second device named twin refused ($(head -1 /tmp/add.twin2.err)); ublk del --name deleted $D2"
else fail "device names: '$D2' $(cat /tmp/add.twin.err /tmp/add.twin2.err)"; fi
Q_=/sys/block/ublkb0/queue
echo "limits: logical=$(cat $Q_/logical_block_size) physical=$(cat $Q_/physical_block_size)" \
  "max_sectors_kb=$(cat $Q_/max_sectors_kb) discard_max=$(cat $Q_/discard_max_bytes)" \
  "discard_gran=$(cat $Q_/discard_granularity) write_zeroes_max=$(cat $Q_/write_zeroes_max_bytes)" \
  "write_cache=$(cat $Q_/write_cache) size=$(cat /sys/block/ublkb0/size)"
[ "$(cat /sys/block/ublkb0/size)" = $((256 * 2048)) ] && pass "size: 256 MiB (the namespace's)" || fail "size $(cat /sys/block/ublkb0/size) sectors"
[ "$(cat $Q_/discard_max_bytes)" -gt 0 ] && pass "discard offered (ONCS DSM)" || fail "no discard"
[ "$(cat $Q_/write_zeroes_max_bytes)" -gt 0 ] && pass "write zeroes offered (ONCS Write Zeroes)" || fail "no write zeroes"
# The kernel's limits are the namespace's (qpath target: 512 B blocks, no NPWG/NPDG, MDTS
# 1 MiB, a volatile write cache on a file namespace) and what qpath reports of it.
J=$($Q ublk list --rpc-socket $SOCK --json | tr -d ' \n')
n=0; for kv in '"block_size":512' '"max_transfer":1048576' '"volatile_cache":true'; do
  case "$J" in *"$kv"*) n=$((n + 1));; esac; done
[ $n = 3 ] && pass "qpath ublk list: 512 B blocks, 1 MiB largest request (MDTS), a volatile cache" \
  || fail "qpath ublk list --json: $J"
L="$(cat $Q_/logical_block_size) $(cat $Q_/physical_block_size) $(cat $Q_/max_hw_sectors_kb) $(cat $Q_/discard_granularity)"
[ "$L" = "512 512 1024 512" ] && pass "logical 512, physical 512, max_hw_sectors_kb 1024 (MDTS, below the 2 MiB asked), discard granularity 512" \
  || fail "limits (logical physical max_hw_sectors_kb discard_granularity): $L"
[ "$(cat $Q_/write_cache)" = "write back" ] && pass "write cache: write back (VWC), so the block layer sends flushes" \
  || fail "write_cache: $(cat $Q_/write_cache)"
[ "$(cat $Q_/fua)" = 1 ] && pass "FUA offered with the volatile cache (a FUA write is one NVMe Write with FUA)" \
  || fail "queue/fua: $(cat $Q_/fua)"

step "ext4: mkfs, files, remount, verify"
if /usr/sbin/mkfs.ext4 -q -F -b 4096 -E nodiscard /dev/ublkb0 && mkdir -p /mnt/u && mount -t ext4 /dev/ublkb0 /mnt/u; then
  pass "mkfs.ext4 + mount"
  for i in 1 2 3 4 5 6; do dd if=/dev/urandom of=/mnt/u/f$i bs=1M count=4 2>/dev/null; done
  mkdir -p /mnt/u/d; for i in $(seq 50); do echo "small file $i $(cat /proc/sys/kernel/random/uuid)" > /mnt/u/d/s$i; done
  (cd /mnt/u && md5sum f* d/*) > /tmp/sums
  sync; umount /mnt/u && mount -t ext4 /dev/ublkb0 /mnt/u || fail "remount"
  if (cd /mnt/u && md5sum -c /tmp/sums > /tmp/sums.out 2>&1); then
    pass "56 files read back identical after umount + mount ($(wc -l < /tmp/sums) checksums)"
  else fail "file verification: $(grep -v OK /tmp/sums.out | head -5)"; fi

  step "fsync reaches the target as Flush (a journal commit's PREFLUSH; its FUA write goes as NVMe FUA)"
  ask_host flush-before || fail "host did not take the flush counters"
  dd if=/dev/urandom of=/mnt/u/fsynced bs=4k count=16 conv=fsync 2>/dev/null || fail "dd conv=fsync"
  ask_host flush-after && pass "the target counted Flush commands after fsync" || fail "the target saw no Flush"

  step "fstrim reaches the target as Deallocate and the blocks read back as zeros"
  dd if=/dev/urandom of=/mnt/u/big bs=1M count=32 2>/dev/null; sync
  filefrag -v /mnt/u/big > /tmp/frag
  BS=$(sed -n 's/.*blocks of \([0-9]*\) bytes.*/\1/p' /tmp/frag)
  awk -F'[ :.]+' '/^ *[0-9]+: /{print $5, $6 - $5 + 1}' /tmp/frag > /tmp/extents
  echo "big's extents (fs block, count; $BS B blocks): $(tr '\n' ';' < /tmp/extents)"
  rm /mnt/u/big; sync
  ask_host trim-before || fail "host did not take the trim counters"
  out=$(fstrim -v /mnt/u 2>&1); echo "fstrim: $out"
  ask_host trim-after && pass "the target counted Deallocate commands after fstrim" || fail "the target saw no Deallocate"
  nz=0; n=0
  while read -r start count; do
    [ -n "$count" ] || continue
    n=$((n + 1))
    z=$(dd if=/dev/ublkb0 bs=$BS skip=$start count=$count iflag=direct 2>/dev/null | od -An -tx1 | tr -d ' \n*' | tr -d 0 | wc -c)
    [ "$z" = 0 ] || nz=$((nz + 1))
  done < /tmp/extents
  if [ $n -gt 0 ] && [ $nz = 0 ]; then pass "all $n extents of the deleted file read back as zeros after fstrim"
  else fail "$nz of $n trimmed extents did not read back as zeros"; fi
  umount /mnt/u
else
  fail "mkfs.ext4 or mount failed"
fi

step "write zeroes: BLKZEROOUT on /dev/ublkb0"
# 1 MiB of random data at 250 MiB (the fio runs below overwrite it), then zeroed by
# util-linux blkdiscard -z (busybox's has no -z; -f: the ext4 above is still on the
# device): the range must read zeros. The device offers write zeroes, so the kernel sends
# REQ_OP_WRITE_ZEROES, which the server turns into NVMe Write Zeroes (queue.rs's tests);
# the target's counters do not tell it from a write.
nonzero() { dd if=/dev/ublkb0 bs=1M skip=250 count=1 iflag=direct 2>/dev/null | od -An -tx1 | tr -d ' \n*' | tr -d 0 | wc -c; }
dd if=/dev/urandom of=/dev/ublkb0 bs=1M seek=250 count=1 oflag=direct 2>/dev/null
before=$(nonzero)
if [ -x /usr/sbin/blkdiscard ] && /usr/sbin/blkdiscard -f -z -o $((250 << 20)) -l $((1 << 20)) /dev/ublkb0; then
  after=$(nonzero)
  [ "$before" -gt 0 ] && [ "$after" = 0 ] && pass "blkdiscard -z: 1 MiB of random data reads back as zeros" \
    || fail "blkdiscard -z: nonzero bytes before $before, after $after"
else fail "blkdiscard -z on /dev/ublkb0"; fi

step "the namespace grows and shrinks under /dev/ublkb0: the device follows (UBLK_U_CMD_UPDATE_SIZE)"
# Linux 6.16+ offers UPDATE_SIZE; an older kernel keeps the device's size (the host's log says so).
OLD=${UBLK_SIZE:-268435456}; NEW=${UBLK_GROWN:-335544320}
getsize() { /usr/sbin/blockdev --getsize64 /dev/ublkb0; }
size_is() { [ "$(getsize)" = "$1" ]; }
listed_size() { $Q ublk list --rpc-socket $SOCK --json | tr -d ' \n' | grep -o '"size":[0-9]*' | head -1 | cut -d: -f2; }
if ask_host ublk-grow; then
  if wait_until 20 size_is $NEW; then pass "blockdev --getsize64 /dev/ublkb0: $NEW after the grow"
  else fail "blockdev --getsize64 /dev/ublkb0: $(getsize) after the grow to $NEW"; show_host_log $HOSTS 10; fi
  [ "$(listed_size)" = $NEW ] && pass "qpath ublk list: size $NEW" || fail "qpath ublk list: size $(listed_size), not $NEW"
  # 1 MiB of random data 16 MiB past the old end, written and read back through the device.
  dd if=/dev/urandom of=/tmp/past bs=1M count=1 2>/dev/null
  at=$(((OLD >> 20) + 16))
  if dd if=/tmp/past of=/dev/ublkb0 bs=1M seek=$at count=1 oflag=direct 2>/tmp/dd.err \
      && dd if=/dev/ublkb0 of=/tmp/past.back bs=1M skip=$at count=1 iflag=direct 2>>/tmp/dd.err \
      && cmp -s /tmp/past /tmp/past.back; then pass "1 MiB written at $at MiB (past the old end) reads back identical"
  else fail "write/read-back past the old end: $(cat /tmp/dd.err)"; fi
  # The target shrinks only over unwritten blocks: deallocate what lies past the old end.
  /usr/sbin/blkdiscard -f -o $OLD -l $((NEW - OLD)) /dev/ublkb0 || fail "blkdiscard past the old end"
  if ask_host ublk-shrink; then
    if wait_until 20 size_is $OLD; then pass "blockdev --getsize64 /dev/ublkb0: $OLD after the shrink"
    else fail "blockdev --getsize64 /dev/ublkb0: $(getsize) after the shrink to $OLD"; show_host_log $HOSTS 10; fi
    [ "$(listed_size)" = $OLD ] && pass "qpath ublk list: size $OLD" || fail "qpath ublk list: size $(listed_size), not $OLD"
    n=$(dd if=/dev/ublkb0 of=/dev/null bs=1M skip=$((OLD >> 20)) count=1 iflag=direct 2>&1 | sed -n 's/^\([0-9]*\)+\([0-9]*\) records in.*/\1\2/p')
    [ "$n" = 00 ] && pass "a read at the new end gets nothing (the block layer's end)" || fail "read at the new end: '$n' records"
  else fail "the host did not shrink the namespace"; fi
else fail "the host did not grow the namespace"; fi
grep -E "resized with its namespace|keeps its size" /tmp/host.$HOSTS.log | tail -3

step "fio randrw crc32c verify on /dev/ublkb0 while one path flaps every 10 s"
ask_host flap-start || fail "host did not start flapping"
$FIO --name=flaps --rw=randrw --bs=4k --iodepth=16 --size=128m --runtime=$RT --time_based \
  --verify_backlog=1024 > /tmp/fio.flaps 2>&1
ask_host flap-stop && pass "the host flapped port 1 during fio" || fail "flaps did not happen"
fio_ok /tmp/fio.flaps "path flaps"

step "the target killed (-9) and restarted during fio"
$FIO --name=restart --rw=randrw --bs=4k --iodepth=16 --size=64m --offset=128m --runtime=$RT --time_based \
  --verify_backlog=512 > /tmp/fio.restart 2>&1 &
F=$!
sleep 8
ask_host restart-target || fail "target restart"
wait $F; echo "fio exit $?"
fio_ok /tmp/fio.restart "target kill -9 + restart"

step "qpath killed (-9) and restarted during fio: user recovery"
$FIO --name=recovery --rw=randrw --bs=4k --iodepth=16 --size=64m --offset=192m --runtime=$RT --time_based \
  --verify_backlog=512 > /tmp/fio.recovery 2>&1 &
F=$!
sleep 8
OLD=$HOSTPID
kill -9 $OLD; sleep 3
st=$($Q ublk list --kernel --json 2>&1 | tr -d ' \n')
echo "kernel view with no server: $st"
case "$st" in *'"state":"quiesced"'*) pass "/dev/ublkb0 is quiesced while no server runs (I/O held)";;
  *) fail "device not quiesced after the server was killed";; esac
# One path down while the new server starts: the takeover is tried again as the
# controllers would reconnect (-c 1, -l -1), the kernel holding the I/O meanwhile.
ask_host port1-down || fail "port 1 down"
start_host && pass "a new qpath host started" || fail "second qpath host"
st=$($Q ublk list --rpc-socket $SOCK --json | tr -d ' \n')
case "$st" in *'"takeover":"retrying"'*) pass "with port 1 down the takeover waits and is retried (ublk list: takeover retrying)";;
  *) fail "with port 1 down: no takeover retrying in ublk list: $st";; esac
ask_host port1-up || fail "port 1 up"
wait_until 30 grep -q "ublkb0: taken over" /tmp/host.$HOSTS.log
show_host_log $HOSTS 6
grep -q "ublkb0: taken over" /tmp/host.$HOSTS.log && pass "the new qpath host took /dev/ublkb0 over once port 1 was back" \
  || fail "the new qpath host did not take the device over"
wait $F; echo "fio exit $?"
fio_ok /tmp/fio.recovery "qpath kill -9 + restart"

step "a request past the end fails, the device goes on"
out=$(dd if=/dev/zero of=/dev/ublkb0 bs=4k seek=65536 count=1 oflag=direct 2>&1); rc=$?
[ $rc != 0 ] && pass "a write past the end fails: $(echo "$out" | head -1)" || fail "a write past the end succeeded"
dd if=/dev/ublkb0 of=/dev/null bs=4k count=16 iflag=direct 2>/dev/null && pass "the device serves the next request" \
  || fail "read after the refused write"

step "syscalls per I/O: the ublk server (ring counters and strace -c) and qpath bench, the same job"
counters() {   # requests ring_enters, summed over the queues
  $Q ublk list --rpc-socket $SOCK --json | awk -F: '/"requests"/{gsub(/[ ,]/,"",$2); r+=$2}
    /"ring_enters"/{gsub(/[ ,]/,"",$2); e+=$2} END{print r+0, e+0}'
}
calls_of() { awk -v s=${2:-io_uring_enter} '$NF == s {print $4}' "$1" | tail -1; }
# count_syscalls TAG QB: the counts below, with the server the running qpath host and qpath
# bench run from QB; TAG (" build=a round=1", or empty) goes after each result line's name.
count_syscalls() {
  TAG=$1; QB=$2
  counters > /tmp/c.before
  strace -c -f -e trace=io_uring_enter -p $HOSTPID -o /tmp/strace.ublk 2>/dev/null &
  ST=$!
  sleep 1
  # fio's own io_submit calls: the application's batches (each hands the kernel one or more I/Os).
  strace --seccomp-bpf -f -c -e trace=io_submit -o /tmp/strace.fio \
    fio --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --name=count --rw=randread --bs=4k --iodepth=16 \
    --size=128m --runtime=10 --time_based --group_reporting > /tmp/fio.count 2>&1
  sleep 1; kill -INT $ST; wait $ST
  counters > /tmp/c.after
  read rb eb < /tmp/c.before; read ra ea < /tmp/c.after
  R=$((ra - rb)); E=$((ea - eb)); SU=$(calls_of /tmp/strace.ublk); SF=$(calls_of /tmp/strace.fio io_submit)
  echo "UBLK-SYSCALLS$TAG requests=$R io_uring_enter(ring counters)=$E io_uring_enter(strace)=${SU:-?} per_request=$(awk -v r=$R -v e=$E 'BEGIN{printf "%.3f", e / (r ? r : 1)}') fio_io_submit=${SF:-?}"
  [ $R -gt 0 ] && [ $E -le $R ] && pass "at most one io_uring_enter per request ($E for $R), ublk and NVMe/TCP on the same ring" \
    || fail "more ring enters ($E) than requests ($R)"
  printf '[count]\nioengine=qpath\nfilename=nvme+tcp://%s:%s,%s:%s/%s/1?reconnect_delay=1\nmpath_policy=round-robin\nrw=randread\nbs=4k\niodepth=16\nsize=128m\nruntime=10\ntime_based\n' \
    "$ADDR" "$PORT1" "$ADDR" "$PORT2" "$NQN" > /tmp/count.fio
  strace -c -f -e trace=io_uring_enter -o /tmp/strace.bench $QB bench /tmp/count.fio --no-baseline > /tmp/bench.count 2>&1
  BI=$(sed -n 's/.*issued rwts: total=\([0-9]*\),.*/\1/p' /tmp/bench.count | head -1)
  SB=$(calls_of /tmp/strace.bench)
  echo "BENCH-SYSCALLS$TAG ios=${BI:-?} io_uring_enter(strace)=${SB:-?}"
  if [ -n "$BI" ] && [ -n "$SB" ] && [ -n "$SU" ] && [ "$BI" -gt 0 ] && [ "$R" -gt 0 ]; then
    echo "SYSCALLS-PER-IO$TAG ublk_server=$(awk -v c=$SU -v n=$R 'BEGIN{printf "%.3f", c / n}') qpath_bench=$(awk -v c=$SB -v n=$BI 'BEGIN{printf "%.3f", c / n}')"
    # The design goal's measure: the enters the server makes beyond what qpath bench needs for
    # the same number of I/Os, per batch the application handed the kernel (fio's io_submit).
    [ -n "$SF" ] && echo "SYSCALLS-PER-BATCH$TAG app_batches=$SF ios_per_batch=$(awk -v r=$R -v b=$SF 'BEGIN{printf "%.2f", r / b}')" \
      "extra_enters_per_batch=$(awk -v e=$E -v r=$R -v sb=$SB -v bi=$BI -v b=$SF 'BEGIN{printf "%.3f", (e - r * sb / bi) / b}')"
    pass "syscalls counted with strace -c: ublk server and qpath bench (SYSCALLS-PER-IO line)"
  else
    fail "could not count syscalls: bench ios '${BI}', strace '${SB}' / '${SU}'"; tail -5 /tmp/bench.count
  fi
  # fio above hands the kernel one I/O per io_submit (its default); the same job again with
  # batches of 8 (submitted together, reaped 8 at a time), the server counted by its rings
  # alone, and qpath bench given the same batches.
  echo "queue counters$TAG before: $($Q ublk list --rpc-socket $SOCK --json | tr -d ' \n' | sed 's/.*"queue_stats":\(.*\),"queues".*/\1/')"
  counters > /tmp/c.before
  strace --seccomp-bpf -f -c -e trace=io_submit -o /tmp/strace.fio8 \
    fio --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --name=count8 --rw=randread --bs=4k --iodepth=16 \
    --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --size=128m --runtime=10 --time_based \
    --group_reporting > /tmp/fio.count8 2>&1
  counters > /tmp/c.after
  echo "queue counters$TAG after: $($Q ublk list --rpc-socket $SOCK --json | tr -d ' \n' | sed 's/.*"queue_stats":\(.*\),"queues".*/\1/')"
  read rb eb < /tmp/c.before; read ra ea < /tmp/c.after
  R8=$((ra - rb)); E8=$((ea - eb)); S8=$(calls_of /tmp/strace.fio8 io_submit)
  { cat /tmp/count.fio; printf 'iodepth_batch_submit=8\niodepth_batch_complete_min=8\n'; } > /tmp/count8.fio
  strace -c -f -e trace=io_uring_enter -o /tmp/strace.bench8 $QB bench /tmp/count8.fio --no-baseline > /tmp/bench.count8 2>&1
  BI8=$(sed -n 's/.*issued rwts: total=\([0-9]*\),.*/\1/p' /tmp/bench.count8 | head -1)
  SB8=$(calls_of /tmp/strace.bench8)
  echo "BENCH-SYSCALLS$TAG batched: ios=${BI8:-?} io_uring_enter(strace)=${SB8:-?}"
  if [ -n "$S8" ] && [ "$R8" -gt 0 ] && [ -n "$BI8" ] && [ -n "$SB8" ] && [ "$BI8" -gt 0 ]; then
    echo "SYSCALLS-PER-BATCH$TAG batched: requests=$R8 io_uring_enter(ring counters)=$E8 app_batches=$S8" \
      "ios_per_batch=$(awk -v r=$R8 -v b=$S8 'BEGIN{printf "%.2f", r / b}') per_request=$(awk -v e=$E8 -v r=$R8 'BEGIN{printf "%.3f", e / r}')" \
      "qpath_bench_per_io=$(awk -v c=$SB8 -v n=$BI8 'BEGIN{printf "%.3f", c / n}')" \
      "extra_enters_per_batch=$(awk -v e=$E8 -v r=$R8 -v sb=$SB8 -v bi=$BI8 -v b=$S8 'BEGIN{printf "%.3f", (e - r * sb / bi) / b}')"
    pass "batched fio counted (SYSCALLS-PER-BATCH batched line)"
  else
    fail "could not count the batched run: requests $R8, io_submit '$S8', bench '$BI8' '$SB8'"; tail -5 /tmp/fio.count8 /tmp/bench.count8
  fi

}
# serve_with BIN: the running qpath host killed (-9) and BIN's taking /dev/ublkb0 over (user
# recovery, as in the step above), so that two builds serve the same device in one boot.
serve_with() {
  kill -9 $HOSTPID; wait $HOSTPID 2>/dev/null; sleep 2
  HOSTS=$((HOSTS + 1))
  $1 host --rpc-socket $SOCK --state-dir $STATE > /tmp/host.$HOSTS.log 2>&1 &
  HOSTPID=$!
  wait_until 30 $Q ublk list --rpc-socket $SOCK > /dev/null 2>&1 \
    && wait_until 30 grep -q "ublkb0: taken over" /tmp/host.$HOSTS.log \
    || { fail "$1 did not take /dev/ublkb0 over"; show_host_log $HOSTS 10; return 1; }
}
# With a second build in the guest (run.sh's QPATH_BIN_B: /vmlab/qpath-b), both are counted in
# one boot, alternating (a b a b ...: SYSCALLS_ROUNDS rounds), and the first serves on after.
if [ -x /vmlab/qpath-b ]; then
  for r in $(seq ${SYSCALLS_ROUNDS:-2}); do
    for bin in a b; do
      if [ $bin = a ]; then B=$Q; else B=/vmlab/qpath-b; fi
      if [ $r = 1 ] && [ $bin = a ] || serve_with $B; then count_syscalls " build=$bin round=$r" $B; fi
    done
  done
  serve_with $Q || true
else
  count_syscalls "" $Q
fi

step "an idle device: its queues sleep (no NVMe command in flight: 250 ms waits)"
read r0 e0 <<EOF_C
$(counters)
EOF_C
sleep 4
read r1 e1 <<EOF_C
$(counters)
EOF_C
echo "IDLE-ENTERS requests=$((r1 - r0)) io_uring_enter=$((e1 - e0)) in 4 s over 2 queues"
# 2 queues x 4 s at one wake per 250 ms is 32 (plus a wake for a keep-alive or path event);
# at one per 20 ms it would be 400.
[ $((r1 - r0)) = 0 ] && [ $((e1 - e0)) -le 60 ] && pass "idle: $((e1 - e0)) ring enters in 4 s over 2 queues (at most 60)" \
  || fail "idle: $((e1 - e0)) ring enters and $((r1 - r0)) requests in 4 s over 2 queues"

step "qpath ublk del"
$Q ublk del --rpc-socket $SOCK -n 0 && pass "qpath ublk del -n 0" || fail "ublk del"
wait_until 10 sh -c '! [ -b /dev/ublkb0 ]' && pass "/dev/ublkb0 is gone" || fail "/dev/ublkb0 still there"
kill -TERM $HOSTPID; wait_until 20 sh -c "! kill -0 $HOSTPID 2>/dev/null" && pass "qpath host stops on SIGTERM" || fail "qpath host did not stop"
show_host_log $HOSTS 8

step "host.toml: a device added under --persist comes back after a reboot (host kill -9, kernel device and state gone)"
CFG=/tmp/host.toml
: > $CFG
start_host_cfg() {   # a qpath host serving $CFG with --persist; sets HOSTPID
  HOSTS=$((HOSTS + 1))
  $Q host --config $CFG --persist --rpc-socket $SOCK --state-dir $STATE > /tmp/host.$HOSTS.log 2>&1 &
  HOSTPID=$!
  wait_until 60 $Q ublk list --rpc-socket $SOCK > /dev/null 2>&1
}
start_host_cfg && pass "qpath host --config $CFG --persist answers (an empty file: no device)" \
  || { fail "qpath host --config did not start"; show_host_log $HOSTS; finish; }
DEV=$($Q ublk add --rpc-socket $SOCK --name boot -a "$ADDR" -s "$PORT1" -s "$PORT2" -n "$NQN" -c 1 -l -1 2>/tmp/add.boot.err)
if [ "$DEV" = /dev/ublkb0 ] && grep -q 'name = "boot"' $CFG; then pass "ublk add --name boot: $DEV, saved to $CFG"
else fail "ublk add --name boot: '$DEV' $(cat /tmp/add.boot.err)"; cat $CFG; show_host_log $HOSTS; fi
dd if=/dev/urandom of=/tmp/boot.data bs=1M count=4 2>/dev/null
dd if=/tmp/boot.data of=/dev/ublkb0 bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null \
  && pass "4 MiB of random data written at 8 MiB" || fail "write to /dev/ublkb0"
# The "reboot": the server killed, its kernel device deleted (as a reboot loses it), /run emptied.
kill -9 $HOSTPID; sleep 2
$Q ublk del --rpc-socket $SOCK -n 0 && wait_until 20 sh -c '! [ -e /sys/class/ublk-char/ublkc0 ]' \
  && pass "the kernel device deleted with no server (STOP_DEV, DEL_DEV)" || fail "deleting the orphaned /dev/ublkb0"
rm -rf $STATE
start_host_cfg && pass "a new qpath host --config started" || fail "qpath host --config after the reboot"
show_host_log $HOSTS 6
if wait_until 30 test -b /dev/ublkb0 && grep -q "boot: /dev/ublkb0" /tmp/host.$HOSTS.log; then
  pass "host.toml brought /dev/ublkb0 back (created, not taken over: no state was left)"
else fail "/dev/ublkb0 did not come back from $CFG"; cat $CFG; fi
$Q ublk list --rpc-socket $SOCK --json | tr -d ' \n' | grep -q '"name":"boot"' && pass "ublk list names it boot" \
  || fail "ublk list: $($Q ublk list --rpc-socket $SOCK --json | tr -d ' \n')"
if dd if=/dev/ublkb0 of=/tmp/boot.back bs=1M skip=8 count=4 iflag=direct 2>/dev/null && cmp -s /tmp/boot.data /tmp/boot.back; then
  pass "the 4 MiB written before the reboot read back identical (same namespace)"
else fail "the data written before the reboot did not read back"; fi
$Q ublk del --rpc-socket $SOCK --name boot && ! grep -q 'name = "boot"' $CFG && pass "ublk del --name boot: deleted and out of $CFG" \
  || fail "ublk del --name boot"
kill -TERM $HOSTPID; wait_until 20 sh -c "! kill -0 $HOSTPID 2>/dev/null" || fail "qpath host --config did not stop"
dmesg | grep -i ublk | tail -5
finish
