#!/bin/sh
# nbd scenario, guest side: `qpath nbd serve` in the guest exports the target's namespace
# (both ports of `qpath target` on the host) on 127.0.0.1:10809; the guest kernel's nbd
# (through nbd-client) uses it: fio randrw crc32c verify while port 1 flaps.
# Settings: NBD_FIO_RUNTIME (s).
. /vmlab/qpath-lib.sh
Q=/vmlab/qpath
RT=${NBD_FIO_RUNTIME:-30}
export RUST_LOG=${GUEST_RUST_LOG:-info}

step "modules"
{ [ -d /sys/module/nbd ] || insmod /vmlab/modules/nbd.ko nbds_max=2; } && [ -b /dev/nbd0 ] && pass "nbd loaded" \
  || { fail "insmod nbd"; finish; }

step "qpath nbd serve over both paths, nbd-client on it"
$Q nbd serve -a "$ADDR" -s 4420 -s 4421 -n "$NQN" -c 1 -l -1 --iopolicy round-robin \
  --listen 127.0.0.1:10809 > /tmp/nbd.log 2>&1 &
SRV=$!
if wait_until 30 sh -c 'nbd-client -l 127.0.0.1 2>/dev/null | grep -q qpath'; then
  pass "the export is listed: $(nbd-client -l 127.0.0.1 2>&1 | tr '\n' ' ')"
else
  fail "qpath nbd serve did not come up"; tail -20 /tmp/nbd.log; finish
fi
if nbd-client -N qpath 127.0.0.1 10809 /dev/nbd0 -b 4096 > /tmp/nbdc.log 2>&1 \
    && wait_until 10 sh -c '[ "$(cat /sys/block/nbd0/size)" != 0 ]'; then
  pass "nbd-client connected /dev/nbd0: $(cat /sys/block/nbd0/size) sectors"
else
  fail "nbd-client: $(cat /tmp/nbdc.log)"; tail -20 /tmp/nbd.log; finish
fi
[ "$(cat /sys/block/nbd0/size)" = $((256 * 2048)) ] && pass "size: 256 MiB (the namespace's)" || fail "size $(cat /sys/block/nbd0/size)"
echo "limits: logical=$(cat /sys/block/nbd0/queue/logical_block_size) discard_max=$(cat /sys/block/nbd0/queue/discard_max_bytes) write_cache=$(cat /sys/block/nbd0/queue/write_cache)"

step "fio randrw crc32c verify on /dev/nbd0 while one path flaps"
ask_host flap-start || fail "host did not start flapping"
fio --filename=/dev/nbd0 --direct=1 --ioengine=libaio --verify=crc32c --name=nbd --rw=randrw --bs=4k \
  --iodepth=16 --size=128m --runtime=$RT --time_based --verify_backlog=1024 --group_reporting > /tmp/fio.nbd 2>&1
ask_host flap-stop && pass "the host flapped port 1 during fio" || fail "flaps did not happen"
if grep -q "err= 0" /tmp/fio.nbd && ! grep -qE "err= *[1-9]|verify: bad|crc32c:" /tmp/fio.nbd \
    && grep -qE "^ +read: IOPS" /tmp/fio.nbd; then
  pass "kernel nbd: fio err=0, no verify failure ($(grep -E '^ +(read|write): IOPS' /tmp/fio.nbd | tr -s ' ' | tr '\n' ' '))"
else
  fail "kernel nbd fio:"; grep -E "err=|verify|error" /tmp/fio.nbd | head
fi
# util-linux blkdiscard (when the host put it here) refuses a device with a file system
# signature unless forced; busybox's has no -f.
BLKDISCARD=blkdiscard; [ -x /usr/sbin/blkdiscard ] && BLKDISCARD="/usr/sbin/blkdiscard -f"
$BLKDISCARD -o 0 -l 1048576 /dev/nbd0 && z=$(dd if=/dev/nbd0 bs=1M count=1 iflag=direct 2>/dev/null | od -An -tx1 | tr -d ' \n*' | tr -d 0 | wc -c) \
  && [ "$z" = 0 ] && pass "blkdiscard on /dev/nbd0 (NBD_CMD_TRIM): the range reads zeros" || fail "blkdiscard / zeros"

step "disconnect"
nbd-client -d /dev/nbd0 && pass "nbd-client -d" || fail "nbd-client -d"
kill -TERM $SRV; wait_until 20 sh -c "! kill -0 $SRV 2>/dev/null" || fail "qpath nbd serve did not stop"
tail -3 /tmp/nbd.log
grep -q "stopped:.* 0 error(s)" /tmp/nbd.log && pass "qpath nbd serve: $(grep stopped: /tmp/nbd.log)" \
  || fail "qpath nbd serve reported errors: $(grep stopped: /tmp/nbd.log)"
finish
