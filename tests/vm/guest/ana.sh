#!/bin/sh
# ana.sh — ANA failover with the guest kernel's queue-depth iopolicy (needs Linux >= 6.11;
# 6.1 rejects queue-depth). With fio running, the host flips port 1's ANA group 1 to
# inaccessible (QPATH-ASK ana-inaccessible): the 4420 path's ana_state must change in
# sysfs and I/O must continue on the 4421 path; then the host flips it back
# (QPATH-ASK ana-optimized). fio must finish with zero errors.
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), ANA_FIO_RUNTIME (45), IOPOLICY (queue-depth)
. /vmlab/qpath-lib.sh
ANA_FIO_RUNTIME=${ANA_FIO_RUNTIME:-45}
IOPOLICY=${IOPOLICY:-queue-depth}
ana_of() { cat "/sys/block/$1/ana_state" 2>/dev/null; }
ana_is() { [ "$(ana_of "$1")" = "$2" ]; }

step "ana: kernel $(uname -r), target $ADDR:$PORT1/$PORT2 $NQN"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
connect_both
[ -b "$DEV" ] || { fail "ana: no multipath block device"; disconnect_all_check; finish; }
S=$(subsys_dir)
if echo "$IOPOLICY" > "$S/iopolicy" && [ "$(cat $S/iopolicy)" = "$IOPOLICY" ]; then
  pass "ana: iopolicy $IOPOLICY accepted"
else
  fail "ana: iopolicy $IOPOLICY rejected (now $(cat $S/iopolicy))"
fi
C1=$(ctrl_for_port $PORT1); C2=$(ctrl_for_port $PORT2)
P1=$(path_of "$C1"); P2=$(path_of "$C2")
echo "path via $PORT1: $C1/$P1 ana_state=$(ana_of $P1); via $PORT2: $C2/$P2 ana_state=$(ana_of $P2)"
if ana_is "$P1" optimized && ana_is "$P2" optimized; then pass "ana: both paths start optimized"
else fail "ana: start states $P1=$(ana_of $P1) $P2=$(ana_of $P2)"; fi

step "fio randrw + verify, ${ANA_FIO_RUNTIME}s, in the background"
( timeout $((ANA_FIO_RUNTIME + 240)) fio --name=ana --filename="$DEV" --rw=randrw --bs=4k \
    --ioengine=libaio --direct=1 --iodepth=16 --size=1G --runtime="$ANA_FIO_RUNTIME" --time_based \
    --verify=crc32c --verify_backlog=1024 > /tmp/fio-ana.log 2>&1; echo $? > /tmp/fio-ana.rc ) &
FIO=$!
sleep 5

t0=$(uptime_s)
ask_host ana-inaccessible && pass "ana: host set port 1 group 1 inaccessible" || fail "ana: host did not flip to inaccessible"
if wait_until 30 ana_is "$P1" inaccessible; then
  pass "ana: $P1 (port $PORT1) ana_state=inaccessible, seen $(( $(uptime_s) - t0 ))s after the request"
else
  fail "ana: $P1 (port $PORT1) ana_state=$(ana_of $P1) 30s after the flip (want inaccessible)"
fi
ana_is "$P2" optimized && pass "ana: $P2 (port $PORT2) still optimized" || fail "ana: $P2 ana_state=$(ana_of $P2)"
a1=$(ios_of "$P1"); a2=$(ios_of "$P2"); sleep 6; b1=$(ios_of "$P1"); b2=$(ios_of "$P2")
kill -0 $FIO 2>/dev/null || fail "ana: fio ended before the inaccessible window was over (raise ANA_FIO_RUNTIME)"
if [ $((b2 - a2)) -gt 0 ]; then
  pass "ana: I/O continued on $P2 while $P1 was inaccessible ($P2 +$((b2 - a2)) I/Os, $P1 +$((b1 - a1)))"
else
  fail "ana: no I/O completed on $P2 in 6 s while $P1 was inaccessible ($P1 +$((b1 - a1)))"
fi

t0=$(uptime_s)
ask_host ana-optimized && pass "ana: host set port 1 group 1 optimized" || fail "ana: host did not flip back"
if wait_until 30 ana_is "$P1" optimized; then
  pass "ana: $P1 (port $PORT1) ana_state=optimized again, seen $(( $(uptime_s) - t0 ))s after the request"
else
  fail "ana: $P1 ana_state=$(ana_of $P1) 30s after the flip back (want optimized)"
fi
a1=$(ios_of "$P1"); sleep 3; b1=$(ios_of "$P1")
kill -0 $FIO 2>/dev/null || fail "ana: fio ended before the flip back was exercised (raise ANA_FIO_RUNTIME)"
[ $((b1 - a1)) -gt 0 ] && pass "ana: I/O back on $P1 (+$((b1 - a1)) I/Os in 3 s)" \
  || fail "ana: no I/O on $P1 in 3 s after it became optimized again"

step "waiting for fio"
wait $FIO
cat /tmp/fio-ana.log
fio_verdict ana "$(cat /tmp/fio-ana.rc 2>/dev/null || echo 255)"
show_ctrls
disconnect_all_check
finish
