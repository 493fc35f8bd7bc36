#!/bin/sh
# Guest: kernel TLS on both ends. `qpath target` runs in the guest (the Linux 7.2 kernel has
# the "tls" TCP ULP once `modprobe tls` ran) with a port that requires TLS and a RAM
# namespace; after each handshake its connections hand their records to the kernel. Then
# (a) the guest's Linux NVMe/TCP host (tlshd runs its handshakes, nvme-cli inserts the PSK)
# connects and runs fio with crc32c verify, and (b) `qpath bench` (qpath's host, in the
# guest) connects over TLS and runs a verified job. list_queues must say "tls1.3-kernel"
# for every queue, the bench's host log that its queues handed their records to the kernel,
# and a capture of the guest's loopback (dumpcap, shipped by run.sh; skipped with a reason
# where it cannot run) must hold only TLS records. The capture goes to /host (9p).
# Settings (vmlab.env.*): NQN, HOSTNQN, HOSTID, FIO_RUNTIME (15).
. /vmlab/qpath-lib.sh
. /vmlab/tls-lib.sh
HOSTNQN=${HOSTNQN:?HOSTNQN}
HOSTID=${HOSTID:-3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01}
FIO_RUNTIME=${FIO_RUNTIME:-15}
Q=/vmlab/qpath
ADDR=127.0.0.1
PORT=4420
RPC=/tmp/rpc.sock

step "the kernel's TLS (tls-lib.sh loaded gcm(aes) and tls)"
KEY=$(cat /vmlab/tls.key)
mkdir -p /etc/nvme
echo "$HOSTNQN" > /etc/nvme/hostnqn; echo "$HOSTID" > /etc/nvme/hostid
modprobe nvme-tcp
if grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp; then
  pass "the kernel offers kernel TLS (tcp_available_ulp: $(cat /proc/sys/net/ipv4/tcp_available_ulp))"
else
  fail "no \"tls\" TCP ULP after modprobe tls"; finish
fi
grep -q . /proc/crypto && grep -qE "^name *: gcm\(aes\)" /proc/crypto && pass "gcm(aes) registered" || echo "NOTE: gcm(aes) not yet listed (loaded on first use)"

step "qpath target in the guest: port $PORT requires TLS, a RAM namespace"
cat > /tmp/target.toml <<TOML
[[port]]
id = 1
addr = "$ADDR:$PORT"
tls = "required"

[[subsystem]]
nqn = "$NQN"
hosts = [{ nqn = "$HOSTNQN", tls_key_file = "/vmlab/tls.key" }]

[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "128M"
TOML
RUST_LOG=debug $Q target --config /tmp/target.toml --rpc-socket $RPC > /tmp/target.log 2>&1 &
TARGET=$!
rpc() { timeout 10 $Q rpc --socket $RPC "$@"; }
wait_until 20 sh -c "$Q rpc --socket $RPC get_target > /dev/null 2>&1" && pass "qpath target answers RPC (pid $TARGET)" \
  || { fail "qpath target did not start"; tail -20 /tmp/target.log; finish; }

# The capture: dumpcap (from the host, with its libraries) on the loopback, into /host.
CAP=
if [ -x /usr/bin/dumpcap ] && [ -d /host ]; then
  /usr/bin/dumpcap -q -i lo -f "tcp port $PORT" -w /host/ktls.pcap > /tmp/dumpcap.log 2>&1 &
  CAP=$!
  sleep 2
  if kill -0 $CAP 2>/dev/null; then pass "capture: dumpcap on lo (pid $CAP)"
  else echo "SKIP: capture: dumpcap did not start in the guest: $(tail -2 /tmp/dumpcap.log)"; CAP=; fi
else
  echo "SKIP: capture: no dumpcap or no /host share in the guest"
fi

# kernel_queues: how many of the target's queues say the kernel record path, and how many
# the user-space one.
kernel_queues() { rpc list_queues 2>/dev/null | grep -o 'tls1\.3-kernel' | wc -l; }
user_queues() { rpc list_queues 2>/dev/null | grep -o 'tls1\.3-user' | wc -l; }

step "(a) the Linux host: nvme connect --tls, fio verify"
start_tlshd
out=$(timeout 60 $SNVME check-tls-key --keydata="$KEY" --hostnqn="$HOSTNQN" --subsysnqn="$NQN" --identity=1 --insert 2>&1); rc=$?
echo "$out" | grep -v NVMeTLSkey
[ $rc = 0 ] && pass "check-tls-key --insert" || fail "check-tls-key --insert rc=$rc"
out=$(timeout 120 $SNVME connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" -q "$HOSTNQN" -I "$HOSTID" --tls 2>&1); rc=$?
echo "$out" | grep -v NVMeTLSkey
[ $rc = 0 ] && pass "nvme connect --tls rc=0" || fail "nvme connect --tls rc=$rc"
one_head() { [ -n "$(heads)" ] && [ -b "/dev/$(heads | head -1)" ]; }
if wait_until 60 one_head; then
  DEV=/dev/$(heads | head -1)
  pass "Linux host over TLS: $DEV"
  n=$(kernel_queues); u=$(user_queues)
  [ "$n" -ge 2 ] && [ "$u" = 0 ] && pass "list_queues: $n queues of the Linux host on the kernel path (tls1.3-kernel), none in user space" \
    || { fail "list_queues: $n kernel, $u user-space queues"; rpc list_queues | head -30; }
  fio_check ktls-randrw $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
    --direct=1 --iodepth=16 --size=64m --runtime="$FIO_RUNTIME" --time_based --verify=crc32c --verify_backlog=256
  fio_check ktls-write128k 300 --filename="$DEV" --rw=write --bs=128k --ioengine=libaio --direct=1 --iodepth=8 \
    --size=32m --verify=crc32c
  timeout 60 $SNVME disconnect-all; rc=$?
  [ $rc = 0 ] && pass "disconnect-all rc=0" || fail "disconnect-all rc=$rc"
else
  fail "Linux host over TLS: no namespace"; tlshd_log 30
fi
kill $TLSHD 2>/dev/null

step "(b) qpath bench in the guest over TLS, crc32c verify"
umask 077
cat > /tmp/bench.fio <<FIO
[ktls]
ioengine=qpath
filename=nvme+tcp://$ADDR:$PORT/$NQN/1?hostnqn=$HOSTNQN&tls_key=$KEY
rw=randrw
bs=4k
iodepth=16
size=64m
time_based
runtime=$FIO_RUNTIME
verify=crc32c
FIO
umask 022
RUST_LOG=info,qpath_host=debug timeout -k 5 $((FIO_RUNTIME + 120)) $Q bench --output-format=json /tmp/bench.fio \
  > /tmp/bench.json 2> /tmp/bench.log &
BENCH=$!
two_kernel_queues() { [ "$(kernel_queues)" -ge 2 ]; }
wait_until 60 two_kernel_queues
n=$(kernel_queues); u=$(user_queues)
[ "$n" -ge 2 ] && [ "$u" = 0 ] && pass "list_queues: $n queues of qpath bench on the kernel path, none in user space" \
  || { fail "list_queues during the bench: $n kernel, $u user-space queues"; rpc list_queues | head -30; }
wait $BENCH; rc=$?
grep -vE '^ *$' /tmp/bench.log | grep -v NVMeTLSkey | tail -4 | sed 's/^/    bench: /'
# The report is pretty-printed: `"checked" : 4617`.
if grep -qE '"failures" *: *0 *,? *$' /tmp/bench.json && grep -qE '"checked" *: *[1-9]' /tmp/bench.json && [ $rc = 0 ]; then
  pass "qpath bench over kernel TLS: rc=0, verify $(grep -oE '"checked" *: *[0-9]+' /tmp/bench.json | head -1), no failure"
else
  fail "qpath bench: rc=$rc"; tail -20 /tmp/bench.json
fi
h=$(grep -c "TLS records handed to the kernel" /tmp/bench.log)
[ "$h" -ge 2 ] && pass "qpath bench's host: $h queues handed their records to the kernel" \
  || { fail "qpath bench's host: $h queues on the kernel path"; grep -i "tls" /tmp/bench.log | grep -v NVMeTLSkey | tail -5; }
grep -q "NVMeTLSkey-1" /tmp/bench.log /tmp/bench.json && fail "the TLS key is printed by the bench" || pass "no TLS key in the bench's log or report"

step "the target's view"
grep -E "kernel TLS|TLS records" /tmp/target.log | grep -v NVMeTLSkey | head -5
echo "connections closed, and why (first 10):"
grep -E "closing:|send failed|recv failed" /tmp/target.log | grep -v NVMeTLSkey | head -10
h=$(grep -c "TLS records handed to the kernel" /tmp/target.log)
[ "$h" -ge 4 ] && pass "target: $h connections handed their records to the kernel" || fail "target: $h connections on the kernel path"
grep -q "stay in user space" /tmp/target.log && fail "target: a connection kept its records in user space" \
  || pass "target: no connection fell back to user-space records"
grep -q "NVMeTLSkey-1" /tmp/target.log && fail "the TLS key is printed in the target log" || pass "no TLS key in the target log"
grep -q panicked /tmp/target.log && fail "target panicked" || pass "target did not panic"
if [ -n "$CAP" ]; then kill -INT $CAP; sleep 2; kill $CAP 2>/dev/null; ls -l /host/ktls.pcap; fi
kill $TARGET 2>/dev/null
finish
