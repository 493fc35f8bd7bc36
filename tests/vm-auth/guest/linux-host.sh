#!/bin/sh
# Guest: the Linux kernel NVMe/TCP host authenticates to `qpath target` with DH-HMAC-CHAP.
# For each case the guest makes fresh secrets with `nvme gen-dhchap-key`, prints them
# ("QPATH-AUTH ..."), asks the host to give them to the target (QPATH-ASK auth-keys-N:
# `qpath rpc set_host_auth`), then `nvme connect --dhchap-secret [--dhchap-ctrl-secret]`
# must succeed and the kernel must log the negotiated hash and group. On one case
# (ROTATE_CASE) the host secret is rotated on the live controller while fio runs with crc32c
# verify: the target is given the new secret (QPATH-ASK auth-rotate-N), the guest writes it
# to /sys/class/nvme/<ctrl>/dhchap_secret, and Linux re-authenticates the admin queue and
# every I/O queue; the controller must stay live, unreset, and fio must verify. Then the
# same controller is rotated to a secret the target was NOT given: the re-authentication
# must fail and the controller must not stay live with I/O served. Then the refusals: a
# wrong host secret and a wrong controller secret must both fail to connect.
# Settings (vmlab.env.*): NQN, ADDR, PORT1 (tests/vm/guest/lib.sh), HOSTNQN, FIO_RUNTIME (5),
#   CASES ("hmac:dhgroup:hash:bidi ..."; hmac is gen-dhchap-key -m, hash the target's preference),
#   ROTATE_CASE (2; the number of a bidirectional case, whose target log evidence the host checks)
. /vmlab/qpath-lib.sh
HOSTNQN=${HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:9a1b6c0e-5d2f-4e43-8f1a-0c7d3e2b4a01}
HOSTID=${HOSTID:-9a1b6c0e-5d2f-4e43-8f1a-0c7d3e2b4a01}
FIO_RUNTIME=${FIO_RUNTIME:-5}
CASES=${CASES:-"1:null:sha256:0 1:ffdhe2048:sha256:1 2:ffdhe3072:sha384:1 3:ffdhe4096:sha512:0 3:ffdhe8192:sha512:1"}
ROTATE_CASE=${ROTATE_CASE:-2}

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
kmsg_has() { dmesg | grep -q "$1"; }   # kmsg_has TEXT: the kernel logged TEXT since the last dmesg -c
# What Linux logs when a controller is reset or reconnected (core.c, tcp.c, fabrics.c):
RESET_RE='error recovery|[Rr]econnect|resetting|Removing ctrl|Removing controller|Failed reconnect|I/O tag .* timeout|Property Set error'

# rotate CASE HMAC HASH GROUP CKEY: on the one live controller, with fio verify running,
# hand the target a new host secret (auth-rotate-CASE), write it to dhchap_secret; Linux
# re-authenticates every queue of the live controller (host/auth.c nvme_ctrl_auth_work) and
# logs only for qid 0 ("re-authenticating controller", "qid 0: authenticated with hash ...",
# "qid 0: controller authenticated"; an I/O queue logs only a failure), so the host checks
# the target's side (reauth-check-CASE): one accepted transaction per queue, same cntlid.
rotate() {
  r_n=$1; r_m=$2; r_hash=$3; r_group=$4; r_ckey=$5
  RC=$(ctrls); r_cid=$(cat /sys/class/nvme/$RC/cntlid); r_q=$(cat /sys/class/nvme/$RC/queue_count)
  step "case $r_n: rotate the host secret of live $RC (cntlid $r_cid, $r_q queues) while fio verify runs"
  r_new=$(gen "$r_m" "$HOSTNQN")
  case "$r_new" in DHHC-1:0$r_m:*) ;; *) fail "case $r_n: rotation: gen-dhchap-key printed '$r_new'"; return 1 ;; esac
  echo "QPATH-AUTH case=rotate-$r_n host=$HOSTNQN hash=$r_hash dhgroup=$r_group key=$r_new ckey=$r_ckey"
  if ask_host "auth-rotate-$r_n"; then pass "case $r_n: rotation: the target holds the new host secret"
  else fail "case $r_n: rotation: the host did not give the target the new secret"; return 1; fi
  r_rt=$((FIO_RUNTIME + 5))
  step "fio reauth-randrw (background, ${r_rt} s): randrw 4k crc32c verify on $DEV"
  timeout -k 10 $((r_rt + 120)) fio --name=reauth-randrw --filename="$DEV" --rw=randrw --bs=4k \
    --ioengine=libaio --direct=1 --iodepth=8 --size=32m --runtime="$r_rt" --time_based \
    --verify=crc32c --verify_backlog=256 --group_reporting > /tmp/fio-reauth-randrw.log 2>&1 &
  r_fio=$!
  sleep 2
  dmesg -c > /dev/null
  if printf '%s' "$r_new" > /sys/class/nvme/$RC/dhchap_secret; then
    pass "case $r_n: rotation: new secret written to /sys/class/nvme/$RC/dhchap_secret"
  else fail "case $r_n: rotation: writing dhchap_secret failed"; fi
  r_want="qid 0: authenticated with hash hmac($r_hash) dhgroup $r_group"
  r_done="$r_want"; [ "$r_ckey" != none ] && r_done="qid 0: controller authenticated"
  if wait_until 30 kmsg_has "$r_done"; then pass "case $r_n: rotation: kernel: re-authenticated ('$r_done')"
  else fail "case $r_n: rotation: kernel did not log '$r_done' within 30 s"; fi
  if kill -0 $r_fio 2>/dev/null; then pass "case $r_n: rotation: re-authentication ended while fio was still running"
  else fail "case $r_n: rotation: fio had already ended, the re-authentication was not under I/O"; fi
  echo "QPATH-REAUTH case=$r_n cntlid=$r_cid queues=$r_q"
  if ask_host "reauth-check-$r_n"; then pass "case $r_n: rotation: the target saw one accepted transaction per queue on cntlid $r_cid"
  else fail "case $r_n: rotation: the target's side of the re-authentication does not hold (see the host's lines)"; fi
  wait $r_fio; r_rc=$?
  cat /tmp/fio-reauth-randrw.log
  fio_verdict reauth-randrw $r_rc
  r_log=$(dmesg | grep -i nvme); echo "$r_log"
  for r_w in "re-authenticating controller" "$r_want" "$r_done"; do
    echo "$r_log" | grep -q "$r_w" && pass "case $r_n: rotation: kernel: $r_w" || fail "case $r_n: rotation: kernel did not log '$r_w'"
  done
  if echo "$r_log" | grep -qiE 'authentication failed|auth.*error'; then fail "case $r_n: rotation: kernel logged an authentication failure"
  else pass "case $r_n: rotation: no 'authentication failed' in the kernel log"; fi
  if echo "$r_log" | grep -qE "$RESET_RE"; then fail "case $r_n: rotation: the kernel reset or reconnected the controller"
  else pass "case $r_n: rotation: no reset, error recovery or reconnect in the kernel log"; fi
  if [ "$(ctrls)" = "$RC" ] && [ "$(ctrl_state $RC)" = live ] && [ "$(cat /sys/class/nvme/$RC/cntlid)" = "$r_cid" ]; then
    pass "case $r_n: rotation: $RC still live with cntlid $r_cid (not reconnected)"
  else fail "case $r_n: rotation: controllers [$(ctrls | tr '\n' ' ')] state $(ctrl_state $RC) cntlid $(cat /sys/class/nvme/$RC/cntlid 2>/dev/null)"; fi
  [ "$(cat /sys/class/nvme/$RC/dhchap_secret)" = "$r_new" ] && pass "case $r_n: rotation: dhchap_secret reads back the new secret" \
    || fail "case $r_n: rotation: dhchap_secret reads '$(cat /sys/class/nvme/$RC/dhchap_secret)'"
  show_ctrls
}

# rotate_wrong CASE HMAC: rotate RC's host secret to one the target was never given. Linux
# warns "qid 0: authentication failed"; our target answers AUTH_Failure1 and closes the
# admin queue, so the controller is torn down and its reconnect fails with the same key.
# It must not be left live with I/O served; disconnect-all must then clean up in time.
rotate_wrong() {
  r_n=$1; r_cid=$(cat /sys/class/nvme/$RC/cntlid)
  step "case $r_n: rotate the host secret of $RC (cntlid $r_cid) to one the target was not given"
  r_bad=$(gen "$2" "$HOSTNQN")
  dmesg -c > /dev/null
  printf '%s' "$r_bad" > /sys/class/nvme/$RC/dhchap_secret || fail "case $r_n: wrong key: writing dhchap_secret failed"
  if wait_until 30 kmsg_has "qid 0: authentication failed"; then
    pass "case $r_n: wrong key: kernel: $(dmesg | grep -m1 'qid 0: authentication failed' | sed 's/^\[[^]]*\] //')"
  else fail "case $r_n: wrong key: kernel did not log 'qid 0: authentication failed' within 30 s"; fi
  not_live() { [ "$(ctrl_state $RC)" != live ]; }
  if wait_until 30 not_live; then pass "case $r_n: wrong key: $RC left live (state now: $(ctrl_state $RC || echo gone))"
  else fail "case $r_n: wrong key: $RC still live 30 s after the failed re-authentication"; fi
  echo "QPATH-REAUTH case=wrong-$r_n cntlid=$r_cid"
  if ask_host "reauth-refused-$r_n"; then pass "case $r_n: wrong key: the target refused the reply and closed the controller"
  else fail "case $r_n: wrong key: the target's side of the refusal does not hold (see the host's lines)"; fi
  # A read now must not be served: it fails (no controller) or waits (controller not live).
  timeout -k 5 40 fio --name=wrongkey-read --filename="$DEV" --rw=read --bs=4k --size=64k \
    --direct=1 --ioengine=psync > /tmp/fio-wrongkey-read.log 2>&1 &
  r_fio=$!
  # The default reconnect_delay is 10 s: watch past one reconnect attempt.
  r_states=; r_live=0
  for r_s in $(seq 15); do
    r_st=$(ctrl_state $RC); r_st=${r_st:-gone}
    case " $r_states " in *" $r_st "*) ;; *) r_states="$r_states $r_st" ;; esac
    [ "$r_st" = live ] && r_live=1
    sleep 1
  done
  if [ $r_live = 0 ]; then pass "case $r_n: wrong key: $RC not live again within 15 s (states seen:$r_states)"
  else fail "case $r_n: wrong key: $RC came back live with a secret the target does not hold (states seen:$r_states)"; fi
  r_pending=0
  if kill -0 $r_fio 2>/dev/null; then
    r_pending=1; pass "case $r_n: wrong key: a 4k read of $DEV is not served (still waiting after 15 s)"
  else
    wait $r_fio; r_rc=$?
    if [ $r_rc != 0 ]; then pass "case $r_n: wrong key: a 4k read of $DEV was not served: it failed (fio rc=$r_rc)"
    else fail "case $r_n: wrong key: a 4k read of $DEV was served"; cat /tmp/fio-wrongkey-read.log; fi
  fi
  grep -E 'err=|error' /tmp/fio-wrongkey-read.log | head -3 | sed 's/^/    /'
  dmesg | grep -i nvme
  show_ctrls
  disconnect_all_check
  if [ $r_pending = 1 ]; then
    if wait_until 30 sh -c "! kill -0 $r_fio 2>/dev/null"; then
      wait $r_fio; pass "case $r_n: wrong key: the pending read ended after disconnect-all (fio rc=$?)"
    else fail "case $r_n: wrong key: the read still hangs 30 s after disconnect-all"; kill -9 $r_fio 2>/dev/null; fi
  fi
}

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
  if [ "$i" = "$ROTATE_CASE" ]; then
    if [ -b "$DEV" ] && one_ctrl_live; then
      rotate "$i" "$m" "$hash" "$group" "$CKEY" && rotate_wrong "$i" "$m"
    else fail "case $i: no live controller with a block device to rotate the key on"; fi
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
