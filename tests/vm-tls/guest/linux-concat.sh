#!/bin/sh
# Guest: the Linux kernel NVMe/TCP host connects to `qpath target` with secure channel
# concatenation (`nvme connect --concat --dhchap-secret`, NVMe Base 2.1 §8.3.4.5): the admin
# queue authenticates in plaintext with SC_C NEWTLSPSK on a port with tls = "allowed", the
# kernel derives the generated PSK (NVMe1G identity, .nvme keyring) and reconnects the admin
# queue and every I/O queue inside TLS (tlshd runs the handshakes). Steps: connect --concat,
# the controller's TLS key in sysfs, fio randrw crc32c verify, a reconnect (disconnect and
# connect --concat again: a new PSK), a target restart (kill -9: the kernel authenticates
# again in plaintext and comes back inside TLS), disconnect-all.
# Settings (vmlab.env.*): NQN, ADDR, PORT1 (tests/vm/guest/lib.sh), HOSTNQN, HOSTID,
#   FIO_RUNTIME (15). The DH-HMAC-CHAP secret comes as the file /vmlab/dhchap.key.
. /vmlab/qpath-lib.sh
HOSTNQN=${HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01}
HOSTID=${HOSTID:-3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01}
FIO_RUNTIME=${FIO_RUNTIME:-15}

. /vmlab/tls-lib.sh
SECRET=$(cat /vmlab/dhchap.key)
mkdir -p /etc/nvme
echo "$HOSTNQN" > /etc/nvme/hostnqn; echo "$HOSTID" > /etc/nvme/hostid
modprobe nvme-tcp
step "nvme-cli $($SNVME version 2>&1 | head -1); kernel $(uname -r)"
start_tlshd
# Output of nvme-cli without any key material.
clean() { grep -v -e NVMeTLSkey -e DHHC-1; }

one_live() {             # exactly one controller of $NQN, live
  _c=$(ctrls) || return 1
  [ "$(echo $_c | count)" = 1 ] && [ "$(ctrl_state $_c)" = live ]
}
head_ready() { one_live && _h=$(heads) && [ -b "/dev/$_h" ]; }

# connect_concat WHAT: nvme connect --concat, one live controller inside TLS with a
# generated key (sysfs tls_key names its keyring serial; dmesg the NVMe1G identity).
connect_concat() {
  out=$(timeout 120 $SNVME connect -t tcp -a "$ADDR" -s "$PORT1" -n "$NQN" -q "$HOSTNQN" -I "$HOSTID" \
    --dhchap-secret="$SECRET" --concat 2>&1); rc=$?
  echo "$out" | clean
  [ $rc = 0 ] && pass "$1: connect --concat rc=0" || { fail "$1: connect --concat rc=$rc"; dmesg | tail -20; tlshd_log; return 1; }
  if wait_until 60 head_ready; then pass "$1: one live controller and its namespace $(heads)"
  else fail "$1: controller not live"; show_ctrls; return 1; fi
  C=$(ctrls)
  k=$(cat /sys/class/nvme/$C/tls_key 2>/dev/null)
  [ -n "$k" ] && pass "$1: $C runs inside TLS (tls_key $k)" || fail "$1: $C has no tls_key: not inside TLS"
  grep -i "NVMe1G" /proc/keys | sed 's/^[0-9a-f]* //' | head -3
  grep -qi "NVMe1G" /proc/keys && pass "$1: a generated PSK (NVMe1G identity) is in the keyring" \
    || fail "$1: no NVMe1G key in the keyring"
  dmesg | grep -iE "nvme|tls" | grep -v DHHC | tail -8
  DEV=/dev/$(heads | head -1)
}

step "nvme connect --concat to $ADDR:$PORT1"
connect_concat first || { tlshd_log; finish; }
HEAD=$DEV
fio_check concat-randrw $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
  --direct=1 --iodepth=16 --size=128m --runtime="$FIO_RUNTIME" --time_based --verify=crc32c --verify_backlog=1024

step "reconnect: disconnect, connect --concat again"
timeout 60 $SNVME disconnect -n "$NQN"; rc=$?
[ $rc = 0 ] && pass "disconnect rc=0" || fail "disconnect rc=$rc"
wait_until 20 sh -c "! ls /sys/class/nvme/ 2>/dev/null | grep -q ." || fail "controller left after disconnect"
connect_concat reconnect || { tlshd_log; finish; }
HEAD=$DEV
fio_check concat-after-reconnect $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
  --direct=1 --iodepth=16 --size=64m --runtime=10 --time_based --verify=crc32c --verify_backlog=256

step "target restart (kill -9): the host concatenates again"
T0=$(uptime_s)
ask_host restart-target 120 || fail "host did not restart the target"
if wait_until 120 head_ready; then pass "restart: controller live again $(( $(uptime_s) - T0 ))s after the request"
else fail "restart: controller not live 120 s after the restart"; show_ctrls; dmesg | tail -20; tlshd_log; fi
C=$(ctrls)
[ -n "$(cat /sys/class/nvme/$C/tls_key 2>/dev/null)" ] && pass "restart: $C inside TLS again" || fail "restart: $C has no tls_key"
DEV=/dev/$(heads | head -1)
fio_check concat-after-restart $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
  --direct=1 --iodepth=16 --size=64m --runtime=10 --time_based --verify=crc32c --verify_backlog=256

step "nvme disconnect-all"
timeout 60 $SNVME disconnect-all; rc=$?
[ $rc = 0 ] && pass "disconnect-all: rc=0" || fail "disconnect-all: rc=$rc"
grep -iE "error|fail" /tmp/tlshd.log | grep -v NVMeTLSkey | head -5
kill $TLSHD 2>/dev/null
finish
