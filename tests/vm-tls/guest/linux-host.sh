#!/bin/sh
# Guest: the Linux kernel NVMe/TCP host reaches `qpath target` over TLS 1.3 on two ports.
# tlshd (ktls-utils) runs the kernel's handshakes; nvme-cli (sid's, from /vmlab/tls-tools.tar,
# run through sid's loader) derives the TLS PSK from the configured key in /vmlab/tls.key
# and puts it in the .nvme keyring. Steps: discovery inside TLS (TREQ required, TSAS TLS 1.3),
# connect both ports with --tls, fio randrw crc32c verify over the multipath head, an ANA
# flip of port 1 (I/O goes on through port 2), a restart of the target (kill -9: both
# controllers reconnect over TLS, a new verify job runs), disconnect-all.
# Settings (vmlab.env.*): NQN, ADDR, PORT1, PORT2 (tests/vm/guest/lib.sh), HOSTNQN, HOSTID,
#   FIO_RUNTIME (15), IDENTITY (nvme-cli's default when unset), GUEST_KEY (2: the key is made
#   here with `nvme gen-tls-key --hmac=2`, handed to the host through /host, and the target
#   started with it: guest-key).
. /vmlab/qpath-lib.sh
HOSTNQN=${HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01}
HOSTID=${HOSTID:-3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01}
FIO_RUNTIME=${FIO_RUNTIME:-15}

. /vmlab/tls-lib.sh
KEY=$(cat /vmlab/tls.key)
mkdir -p /etc/nvme
echo "$HOSTNQN" > /etc/nvme/hostnqn; echo "$HOSTID" > /etc/nvme/hostid
modprobe nvme-tcp
step "nvme-cli $($SNVME version 2>&1 | head -1); kernel $(uname -r)"
start_tlshd

if [ "${GUEST_KEY:-}" = 2 ]; then
  step "nvme gen-tls-key --hmac=2: a key of hash 02 (SHA-384), for both ends"
  # Printed by nvme-cli on its output only: kept in a variable and a 0600 file, never shown.
  KEY=$(timeout 60 $SNVME gen-tls-key --hmac=2 2>/dev/null | grep -oE '^NVMeTLSkey-1:02:[A-Za-z0-9+/=]{72}:$' | head -1)
  if [ -n "$KEY" ]; then pass "gen-tls-key --hmac=2: a key of hash 02 (${#KEY} characters)"
  else fail "gen-tls-key --hmac=2 printed no key of hash 02"; finish; fi
  (umask 077; printf '%s\n' "$KEY" > /host/tls.key) || fail "writing the key to /host"
  ask_host guest-key 120 && pass "host: the target runs with this key" || { fail "host: target with the guest's key"; finish; }
fi

step "nvme discover --tls on $PORT1"
# The PSKs go into the .nvme keyring once, by identity (IDENTITY, default version 1: with the
# digest; version 0 is the one Linux 6.7-6.13 present, which a newer kernel falls back to), for the
# discovery NQN and the subsystem, as Linux documents (nvme check-tls-key --insert); connects
# then name no key and the kernel finds it by identity. (Passing --tls-key to each connect
# inserts it again: the second insert of an identity replaces the first key, and the first
# controller's reconnect then asks tlshd for a key that no longer exists.)
for sub in nqn.2014-08.org.nvmexpress.discovery "$NQN"; do
  out=$(timeout 60 $SNVME check-tls-key --keydata="$KEY" --hostnqn="$HOSTNQN" --subsysnqn="$sub" --identity="${IDENTITY:-1}" --insert 2>&1); rc=$?
  echo "$out" | grep -v NVMeTLSkey
  [ $rc = 0 ] && pass "check-tls-key --insert for $sub" || fail "check-tls-key --insert ($sub) rc=$rc"
done
grep -i "psk" /proc/keys | sed 's/^[0-9a-f]* //' | head -5
OUT=$(timeout 120 $SNVME discover -t tcp -a "$ADDR" -s "$PORT1" -q "$HOSTNQN" --tls 2>&1); RC=$?
echo "$OUT" | grep -v "NVMeTLSkey"
if [ $RC = 0 ]; then pass "discover over TLS: rc=0"
else
  fail "discover over TLS: rc=$RC"; tlshd_log 60
  finish                                # the rest needs a channel
fi
for p in $PORT1 $PORT2; do
  echo "$OUT" | grep -qE "^trsvcid:[[:space:]]+$p[[:space:]]*\$" && pass "discover: lists trsvcid $p" || fail "discover: no trsvcid $p"
done
echo "$OUT" | grep -qE "^treq:.*required" && ! echo "$OUT" | grep -qE "^treq:.*not required" \
  && pass "discover: TREQ says a secure channel is required" || fail "discover: TREQ does not say required"
echo "$OUT" | grep -qiE "sectype:[[:space:]]*tls13" && pass "discover: TSAS SECTYPE tls13" || fail "discover: no sectype tls13"

step "nvme connect --tls to both ports"
for p in $PORT1 $PORT2; do
  out=$(timeout 120 $SNVME connect -t tcp -a "$ADDR" -s "$p" -n "$NQN" -q "$HOSTNQN" -I "$HOSTID" --tls 2>&1); rc=$?
  echo "$out" | grep -v "NVMeTLSkey"
  [ $rc = 0 ] && pass "connect --tls: port $p rc=0" || fail "connect --tls: port $p rc=$rc"
done
if wait_until 60 multipath_ready; then
  pass "multipath over TLS: controllers [$(ctrls | tr '\n' ' ')] and one head $(heads)"
else
  fail "multipath over TLS: not ready"; show_ctrls
  tlshd_log
  finish                                # nothing below can run without the controllers
fi
for c in $(ctrls); do
  k=$(cat /sys/class/nvme/$c/tls_key 2>/dev/null)
  [ -n "$k" ] && pass "$c: TLS key in use ($k)" || fail "$c: no tls_key in sysfs"
done
dmesg | grep -iE "tls|nvme" | tail -8
DEV=/dev/$(heads | head -1); HEAD=$DEV

fio_check tls-randrw $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
  --direct=1 --iodepth=16 --size=256m --runtime="$FIO_RUNTIME" --time_based --verify=crc32c --verify_backlog=1024
fio_check tls-write128k 300 --filename="$DEV" --rw=write --bs=128k --ioengine=libaio --direct=1 --iodepth=8 \
  --size=64m --verify=crc32c

step "ANA: port $PORT1 inaccessible while I/O runs"
C1=$(ctrl_for_port $PORT1); C2=$(ctrl_for_port $PORT2); P1=$(path_of $C1); P2=$(path_of $C2)
timeout -k 10 $((FIO_RUNTIME + 120)) fio --name=ana --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio --direct=1 \
  --iodepth=16 --size=64m --runtime="$FIO_RUNTIME" --time_based --verify=crc32c --verify_backlog=256 > /tmp/fio-ana.log 2>&1 &
FIO=$!
sleep 2
ask_host ana-inaccessible || fail "host did not flip ANA"
state_is() { [ "$(cat /sys/block/$1/ana_state 2>/dev/null)" = "$2" ]; }
wait_until 30 state_is "$P1" inaccessible && pass "ANA: $P1 inaccessible" || fail "ANA: $P1 is $(cat /sys/block/$P1/ana_state)"
b=$(ios_of "$P2"); sleep 3; a=$(ios_of "$P2")
[ "$a" -gt "$b" ] && pass "ANA: I/O goes on through $P2 ($((a - b)) I/Os in 3 s)" || fail "ANA: no I/O on $P2"
ask_host ana-optimized || fail "host did not flip ANA back"
wait_until 30 state_is "$P1" optimized && pass "ANA: $P1 optimized again" || fail "ANA: $P1 is $(cat /sys/block/$P1/ana_state)"
wait $FIO; fio_verdict ana $?

step "target restart (kill -9): reconnect over TLS"
T0=$(uptime_s)
ask_host restart-target 120 || fail "host did not restart the target"
after_restart "restart" "$T0"
fio_check after-restart $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
  --direct=1 --iodepth=16 --size=64m --runtime=10 --time_based --verify=crc32c --verify_backlog=256

step "nvme disconnect-all"
timeout 60 $SNVME disconnect-all; rc=$?
[ $rc = 0 ] && pass "disconnect-all: rc=0" || fail "disconnect-all: rc=$rc"
wait_until 20 sh -c "! ls /sys/class/nvme/ 2>/dev/null | grep -q ." && pass "disconnect-all: no controllers left" \
  || fail "disconnect-all: controllers left"
grep -iE "error|fail" /tmp/tlshd.log | grep -v NVMeTLSkey | head -5
kill $TLSHD 2>/dev/null
finish
