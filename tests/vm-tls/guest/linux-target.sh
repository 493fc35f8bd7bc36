#!/bin/sh
# Guest: the Linux kernel NVMe/TCP target (nvmet) requires TLS 1.3 on two ports, with the PSK
# nvme-cli derives from /vmlab/tls.key in the .nvme keyring and tlshd running its
# handshakes; `qpath` connects to it from the host. Steps: nvmet with addr_tsas tls1.3 and
# addr_treq required on 4420 and 4421 (brd namespace), the key inserted for the host's NQN
# (identity version 1), then the host's checks: qpath connect --tls (connect-tls), a wrong
# key refused (connect-wrong-key), and a two-path qpath bench job with crc32c verify
# (bench-start) that survives the loss of port 4420's path (the guest unlinks the
# subsystem from it for 10 s, then links it back) and ends with no error (bench-check).
# Settings (vmlab.env.*): NQN, HOSTNQN (the host's), PORT1, PORT2.
. /vmlab/qpath-lib.sh
. /usr/share/vmlab/nvmet-lib.sh
HOSTNQN=${HOSTNQN:?HOSTNQN}
. /vmlab/tls-lib.sh
KEY=$(cat /vmlab/tls.key)
start_tlshd

step "nvmet: $NQN on $PORT1 and $PORT2, TLS 1.3 required"
modprobe brd rd_nr=1 rd_size=$((256 * 1024))
nvmet_subsys "$NQN" && nvmet_ns "$NQN" 1 /dev/ram0 || fail "nvmet subsystem"
id=1
for p in $PORT1 $PORT2; do
  nvmet_port $id 0.0.0.0 $p
  echo tls1.3 > $NVMET/ports/$id/addr_tsas || fail "port $p: addr_tsas tls1.3"
  echo required > $NVMET/ports/$id/addr_treq || fail "port $p: addr_treq required"
  nvmet_link $id "$NQN"
  id=$((id + 1))
done
grep -H . $NVMET/ports/*/addr_tsas $NVMET/ports/*/addr_treq
out=$(timeout 60 $SNVME check-tls-key --keydata="$KEY" --hostnqn="$HOSTNQN" --subsysnqn="$NQN" --identity=1 --insert 2>&1); rc=$?
echo "$out" | grep -v NVMeTLSkey
[ $rc = 0 ] && pass "nvme check-tls-key --insert: the derived PSK is in the keyring (identity 1)" || fail "check-tls-key --insert rc=$rc"
grep -i "nvme" /proc/keys | sed 's/ [0-9a-f]\{8\} / /' | head -5

ask_host connect-tls 300 && pass "host: qpath connect --tls to nvmet" || fail "host: qpath connect --tls"
ask_host connect-wrong-key 300 && pass "host: a wrong key is refused" || fail "host: wrong key"
ask_host bench-start 300 || fail "host: bench did not start"
sleep 8
step "path loss: unlink $NQN from port $PORT1 for 10 s"
rm "$NVMET/ports/1/subsystems/$NQN" && pass "port $PORT1 unlinked (its connections close)" || fail "unlink port 1"
sleep 10
nvmet_link 1 "$NQN" && pass "port $PORT1 linked again" || fail "link port 1"
sleep 8
ask_host bench-check 400 && pass "host: the bench job verified its data across the path loss" || fail "host: bench job"
dmesg | grep -iE "nvmet|tls" | tail -15
tlshd_log 25
kill $TLSHD 2>/dev/null
nvmet_clear
finish
