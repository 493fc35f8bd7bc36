#!/bin/sh
# Guest: the Linux kernel NVMe/TCP host authenticates to `qpath target` with DH-HMAC-CHAP.
# For each case the guest makes fresh secrets with `nvme gen-dhchap-key`, prints them
# ("QPATH-AUTH ..."), asks the host to give them to the target (QPATH-ASK auth-keys-N:
# `qpath rpc set_host_auth`), then `nvme connect --dhchap-secret [--dhchap-ctrl-secret]`
# must succeed and the kernel must log the negotiated hash and group; one case runs fio
# with crc32c verify. Then the refusals: a wrong host secret and a wrong controller secret
# must both fail to connect.
# Settings (vmlab.env.*): NQN, ADDR, PORT1 (tests/vm/guest/lib.sh), HOSTNQN, FIO_RUNTIME (5),
#   CASES ("hmac:dhgroup:hash:bidi ..."; hmac is gen-dhchap-key -m, hash the target's preference)
. /vmlab/qpath-lib.sh
HOSTNQN=${HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:9a1b6c0e-5d2f-4e43-8f1a-0c7d3e2b4a01}
HOSTID=${HOSTID:-9a1b6c0e-5d2f-4e43-8f1a-0c7d3e2b4a01}
FIO_RUNTIME=${FIO_RUNTIME:-5}
CASES=${CASES:-"1:null:sha256:0 1:ffdhe2048:sha256:1 2:ffdhe3072:sha384:1 3:ffdhe4096:sha512:0 3:ffdhe8192:sha512:1"}

modprobe nvme-tcp
step "nvme-cli $(nvme version 2>&1 | head -1); kernel $(uname -r)"
lsmod | grep -E '^nvme_auth' > /dev/null && pass "module nvme_auth loaded" || fail "module nvme_auth not loaded"

gen() {   # gen HMAC NQN: a fresh DHHC-1 secret from nvme-cli
  nvme gen-dhchap-key -m "$1" -n "$2" 2>&1 | grep -o 'DHHC-1:[0-9][0-9]:[A-Za-z0-9+/=]*:' | head -1
}
conn() {  # conn [nvme connect options]: connect PORT1 as HOSTNQN; prints nvme-cli's output
  timeout 300 nvme connect -t tcp -a "$ADDR" -s "$PORT1" -n "$NQN" --hostnqn "$HOSTNQN" --hostid "$HOSTID" "$@" 2>&1
}
one_ctrl_live() { _c=$(ctrls) && [ "$(echo $_c | count)" = 1 ] && [ "$(ctrl_state $_c)" = live ]; }
no_ctrls() { ! ls /sys/class/nvme/ 2>/dev/null | grep -q .; }

i=0
for c in $CASES; do
  i=$((i + 1))
  set -- $(echo "$c" | tr ':' ' ')
  m=$1; group=$2; hash=$3; bidi=$4
  step "case $i: gen-dhchap-key -m $m, target hash $hash, dhgroup $group, bidirectional $bidi"
  KEY=$(gen "$m" "$HOSTNQN")
  CKEY=none
  [ "$bidi" = 1 ] && CKEY=$(gen "$m" "$NQN")
  case "$KEY" in DHHC-1:0$m:*) pass "case $i: nvme gen-dhchap-key -m $m made $KEY" ;;
    *) fail "case $i: nvme gen-dhchap-key -m $m printed '$KEY'"; continue ;; esac
  echo "QPATH-AUTH case=$i host=$HOSTNQN hash=$hash dhgroup=$group key=$KEY ckey=$CKEY"
  if ! ask_host "auth-keys-$i"; then fail "case $i: the host did not configure the target"; continue; fi
  dmesg -c > /dev/null
  # Under TCG the kernel's first ffdhe8192 use runs its crypto self-tests (~75 s here): a
  # transaction step may take KATO (as on Linux nvmet), so give this case a long one.
  kato=; [ "$group" = ffdhe8192 ] && kato="-k 150"
  if [ "$bidi" = 1 ]; then out=$(conn $kato --dhchap-secret "$KEY" --dhchap-ctrl-secret "$CKEY"); rc=$?
  else out=$(conn $kato --dhchap-secret "$KEY"); rc=$?; fi
  echo "$out"
  [ $rc = 0 ] && pass "case $i: nvme connect --dhchap-secret${CKEY:+ (ctrl secret: $bidi)} rc=0" \
    || fail "case $i: nvme connect rc=$rc"
  if wait_until 30 one_ctrl_live; then pass "case $i: controller $(ctrls) live"; else fail "case $i: no live controller"; fi
  show_ctrls
  log=$(dmesg | grep -i 'nvme')
  echo "$log"
  want="authenticated with hash hmac($hash) dhgroup $group"
  echo "$log" | grep -q "qid 0: $want" && pass "case $i: kernel: qid 0: $want" \
    || fail "case $i: kernel did not log 'qid 0: $want'"
  if [ "$bidi" = 1 ]; then
    echo "$log" | grep -q "qid 0: controller authenticated" && pass "case $i: kernel: qid 0: controller authenticated" \
      || fail "case $i: kernel did not log 'qid 0: controller authenticated'"
  fi
  echo "$log" | grep -qiE 'authentication failed|auth.*error' && fail "case $i: kernel logged an authentication error"
  q=$(cat /sys/class/nvme/$(ctrls)/queue_count 2>/dev/null)
  [ "${q:-0}" -ge 2 ] && pass "case $i: $q queues (admin + I/O, each authenticated)" || fail "case $i: queue_count ${q:-?}"
  DEV=/dev/$(heads | head -1)
  if [ "$i" = 2 ] && [ -b "$DEV" ]; then
    fio_check "auth-randrw" $((FIO_RUNTIME + 120)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
      --direct=1 --iodepth=8 --size=32m --runtime="$FIO_RUNTIME" --time_based --verify=crc32c \
      --verify_backlog=256 --group_reporting
  fi
  disconnect_all_check
done

step "refusal: a wrong host secret"
BAD=$(gen 1 "$HOSTNQN")
dmesg -c > /dev/null
out=$(conn --dhchap-secret "$BAD"); rc=$?
echo "$out"; dmesg | grep -i nvme | tail -5
if [ $rc != 0 ] && wait_until 10 no_ctrls; then pass "refusal: wrong host secret: nvme connect rc=$rc, no controller"
else fail "refusal: wrong host secret: rc=$rc, controllers [$(ls /sys/class/nvme/ | tr '\n' ' ')]"; nvme disconnect-all; fi

step "refusal: a wrong controller secret (the last case's host secret is still configured)"
dmesg -c > /dev/null
out=$(conn --dhchap-secret "$KEY" --dhchap-ctrl-secret "$BAD"); rc=$?
echo "$out"; dmesg | grep -i nvme | tail -5
if [ $rc != 0 ] && wait_until 10 no_ctrls; then pass "refusal: wrong controller secret: nvme connect rc=$rc, no controller"
else fail "refusal: wrong controller secret: rc=$rc, controllers [$(ls /sys/class/nvme/ | tr '\n' ' ')]"; nvme disconnect-all; fi

step "refusal: no secret at all"
out=$(conn); rc=$?
echo "$out"
if [ $rc != 0 ] && wait_until 10 no_ctrls; then pass "refusal: no secret: nvme connect rc=$rc"
else fail "refusal: no secret: rc=$rc"; nvme disconnect-all; fi
finish
