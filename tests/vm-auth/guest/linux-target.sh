#!/bin/sh
# Guest: the Linux kernel target (nvmet) requires DH-HMAC-CHAP; `qpath connect -S [-C]` on
# the host side must authenticate to it. Per case the guest makes fresh secrets with
# `nvme gen-dhchap-key`, writes them to configfs (hosts/<hostnqn>/dhchap_key, dhchap_ctrl_key,
# dhchap_hash, dhchap_dhgroup; attr_allow_any_host=0), prints them ("QPATH-AUTH ...") and asks
# the host to connect (QPATH-ASK connect-N); the host answers ok when qpath behaved as the
# case expects (connected, or refused for the wrong-secret cases). A last case (ROTATE=1)
# rotates the secrets of a live controller that a `qpath bench` job on the host side drives
# (QPATH-ASK rotate-start-N, rotate-N, rotate-bad-N, rotate-stop-N).
# Settings (vmlab.env.*): NQN, HOSTPFX, CASES ("hmac:hash:dhgroup:bidi:expect ..."), ROTATE (1).
. /vmlab/qpath-lib.sh
. /usr/share/vmlab/nvmet-lib.sh
# One host NQN per case (a fresh configfs host: a controller key cannot be unset by writing ""):
HOSTPFX=${HOSTPFX:-nqn.2014-08.org.nvmexpress:uuid:9a1b6c0e-5d2f-4e43-8f1a-0c7d3e2b4b}
CASES=${CASES:-"1:sha256:null:0:ok 1:sha256:ffdhe2048:1:ok 2:sha384:ffdhe3072:1:ok 3:sha512:ffdhe4096:0:ok 3:sha512:ffdhe8192:1:ok 1:sha256:null:0:badkey 1:sha256:ffdhe2048:1:badctrl"}

modprobe brd rd_nr=1 rd_size=$((64 * 1024))
nvmet_subsys "$NQN" || fail "nvmet: cannot create $NQN"
echo 0 > "$NVMET/subsystems/$NQN/attr_allow_any_host"
nvmet_ns "$NQN" 1 /dev/ram0
nvmet_port 1 0.0.0.0 4420
nvmet_link 1 "$NQN"
mkdir -p "$NVMET/hosts/${HOSTPFX}00"; ls "$NVMET/hosts/${HOSTPFX}00"
[ -f "$NVMET/hosts/${HOSTPFX}00/dhchap_key" ] && pass "nvmet: hosts/<nqn>/dhchap_key exists (CONFIG_NVME_TARGET_AUTH)" \
  || fail "nvmet: no dhchap_key attribute under $NVMET/hosts"

gen() { nvme gen-dhchap-key -m "$1" -n "$2" 2>&1 | grep -o 'DHHC-1:[0-9][0-9]:[A-Za-z0-9+/=]*:' | head -1; }
i=0
for c in $CASES; do
  i=$((i + 1))
  set -- $(echo "$c" | tr ':' ' ')
  m=$1; hash=$2; group=$3; bidi=$4; expect=$5
  step "case $i: gen-dhchap-key -m $m, nvmet dhchap_hash hmac($hash), dhchap_dhgroup $group, bidirectional $bidi, expect $expect"
  HOSTNQN=$HOSTPFX$(printf %02d $i); H=$NVMET/hosts/$HOSTNQN
  mkdir -p "$H" && ln -s "$H" "$NVMET/subsystems/$NQN/allowed_hosts/$HOSTNQN"
  KEY=$(gen "$m" "$HOSTNQN")
  CKEY=none
  [ "$bidi" = 1 ] && CKEY=$(gen "$m" "$NQN")
  echo "$KEY" > "$H/dhchap_key" || fail "case $i: write dhchap_key"
  if [ "$bidi" = 1 ]; then echo "$CKEY" > "$H/dhchap_ctrl_key" || fail "case $i: write dhchap_ctrl_key"; fi
  echo "hmac($hash)" > "$H/dhchap_hash" || fail "case $i: write dhchap_hash"
  echo "$group" > "$H/dhchap_dhgroup" || fail "case $i: write dhchap_dhgroup"
  echo "nvmet host: key=$(cat $H/dhchap_key) ctrl_key=$(cat $H/dhchap_ctrl_key) hash=$(cat $H/dhchap_hash) dhgroup=$(cat $H/dhchap_dhgroup)"
  # What the host side gets: the secrets, or a different one for the refusal cases.
  HKEY=$KEY; HCKEY=$CKEY
  [ "$expect" = badkey ] && HKEY=$(gen "$m" "$HOSTNQN")
  [ "$expect" = badctrl ] && HCKEY=$(gen "$m" "$NQN")
  dmesg -c > /dev/null
  echo "QPATH-AUTH case=$i host=$HOSTNQN expect=$expect key=$HKEY ckey=$HCKEY"
  if ask_host "connect-$i" 180; then pass "case $i: qpath connect as expected ($expect)"
  else fail "case $i: qpath connect did not behave as expected ($expect)"; fi
  dmesg | grep -iE 'nvmet' | tail -8
done

# Key rotation under I/O (ROTATE=1): a `qpath bench` job on the host side (randrw, crc32c
# verify) holds a live controller of a fresh host (SHA-256 + ffdhe2048, bidirectional) with
# K1/C1. The guest gives nvmet K2/C2 through configfs; the host side re-authenticates the
# job's controller with them over the bench's RPC socket (nvmet re-reads the host's keys at
# the admin queue's next AUTH_Negotiate, nvmet_setup_auth). Then nvmet gets K3 while the host
# side re-authenticates with K4: nvmet answers AUTH_Failure1 and tears the controller down.
ctrl_log() { dmesg | grep -c "nvmet: ctrl $CNTLID $1" || true; }    # lines about the job's controller
if [ "${ROTATE:-1}" = 1 ]; then
  i=$((i + 1))
  step "case $i: key rotation under I/O: qpath bench job, nvmet hmac(sha256) ffdhe2048 bidirectional, K1/C1 -> K2/C2, then a key nvmet lacks"
  HOSTNQN=$HOSTPFX$(printf %02d $i); H=$NVMET/hosts/$HOSTNQN
  mkdir -p "$H" && ln -s "$H" "$NVMET/subsystems/$NQN/allowed_hosts/$HOSTNQN"
  K1=$(gen 1 "$HOSTNQN"); C1=$(gen 1 "$NQN")
  echo "$K1" > "$H/dhchap_key" || fail "case $i: write dhchap_key"
  echo "$C1" > "$H/dhchap_ctrl_key" || fail "case $i: write dhchap_ctrl_key"
  echo "hmac(sha256)" > "$H/dhchap_hash" || fail "case $i: write dhchap_hash"
  echo ffdhe2048 > "$H/dhchap_dhgroup" || fail "case $i: write dhchap_dhgroup"
  dmesg -c > /dev/null
  echo "QPATH-AUTH case=$i host=$HOSTNQN expect=ok key=$K1 ckey=$C1"
  if ask_host "rotate-start-$i" 120; then
    pass "case $i: a qpath bench job runs on a live controller authenticated with K1/C1"
    CNTLID=$(dmesg | sed -n "s/.*nvmet: Created nvm controller \([0-9]*\) for subsystem $NQN for NQN $HOSTNQN with DH-HMAC-CHAP.*/\1/p" | head -1)
    [ -n "$CNTLID" ] && pass "case $i: nvmet created controller $CNTLID for $HOSTNQN with DH-HMAC-CHAP" \
      || fail "case $i: nvmet logged no DH-HMAC-CHAP controller for $HOSTNQN"

    K2=$(gen 1 "$HOSTNQN"); C2=$(gen 1 "$NQN")
    echo "$K2" > "$H/dhchap_key" || fail "case $i: write the new dhchap_key"
    echo "$C2" > "$H/dhchap_ctrl_key" || fail "case $i: write the new dhchap_ctrl_key"
    [ "$(cat "$H/dhchap_key")" = "$K2" ] && [ "$(cat "$H/dhchap_ctrl_key")" = "$C2" ] && [ "$K2" != "$K1" ] && [ "$C2" != "$C1" ] \
      && pass "case $i: nvmet host now holds new secrets K2/C2" || fail "case $i: nvmet host does not hold K2/C2"
    echo "QPATH-AUTH case=rotate-$i host=$HOSTNQN expect=ok key=$K2 ckey=$C2"
    if ask_host "rotate-$i" 120; then pass "case $i: the host re-authenticated the live controller with K2/C2 under I/O"
    else fail "case $i: the re-authentication with K2/C2 did not go as expected"; fi
    dmesg | grep nvmet | tail -8
    # nvmet logs a refusal (mismatch, failure1, fatal error) but not a re-authentication that
    # succeeds (pr_debug): nothing of the first kind, and no second controller for this host.
    n=$(($(ctrl_log 'qid [0-9]* host response mismatch') + $(ctrl_log 'qid [0-9]* failure1') + $(ctrl_log 'fatal error')))
    m=$(dmesg | grep -c "nvmet: Created nvm controller .* for NQN $HOSTNQN " || true)
    [ "$n" = 0 ] && [ "$m" = 1 ] && pass "case $i: nvmet: no refusal, no fatal error, no other controller for the host during the rotation" \
      || fail "case $i: nvmet: $n refusal/fatal line(s) for ctrl $CNTLID, $m controller(s) created for the host"

    K3=$(gen 1 "$HOSTNQN"); K4=$(gen 1 "$HOSTNQN")
    echo "$K3" > "$H/dhchap_key" || fail "case $i: write dhchap_key K3"
    dmesg -c > /dev/null
    echo "QPATH-AUTH case=bad-$i host=$HOSTNQN expect=refused key=$K4 ckey=$C2"
    if ask_host "rotate-bad-$i" 120; then pass "case $i: re-authentication with a key nvmet lacks refused as expected"
    else fail "case $i: re-authentication with a key nvmet lacks did not fail as expected"; fi
    if wait_until 10 sh -c "dmesg | grep -q 'nvmet: ctrl $CNTLID fatal error occurred'"; then :; fi
    dmesg | grep nvmet | head -12
    # The refusal is the live controller's: its three lines come before any controller the
    # host's reconnect attempts (with K4, refused alike) create.
    line_of() { dmesg | grep -n "$1" | head -1 | cut -d: -f1; }
    a=$(line_of "nvmet: ctrl $CNTLID qid 0 host response mismatch"); b=$(line_of "nvmet: ctrl $CNTLID qid 0 failure1 (1)")
    c=$(line_of "nvmet: ctrl $CNTLID fatal error occurred"); r=$(line_of "nvmet: Created nvm controller")
    if [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ] && [ "$a" -lt "$b" ] && [ "$b" -le "$c" ] && { [ -z "$r" ] || [ "$c" -lt "$r" ]; }; then
      pass "case $i: nvmet: ctrl $CNTLID qid 0 host response mismatch, failure1 (1), fatal error occurred (the live controller torn down)"
    else fail "case $i: nvmet: ctrl $CNTLID lines mismatch@${a:-none} failure1@${b:-none} fatal@${c:-none}, first new controller @${r:-none}"; fi
  else
    fail "case $i: the qpath bench job did not come up"
  fi
  if ask_host "rotate-stop-$i" 180; then pass "case $i: the bench job ended as expected"
  else fail "case $i: the bench job did not end as expected"; fi
  echo "nvmet: $(dmesg | grep -c "Created nvm controller .* for NQN $HOSTNQN " || true) controller(s) created for $HOSTNQN after the refusal (the host's reconnect attempts with K4), $(dmesg | grep -c 'fatal error occurred' || true) fatal error line(s)"
fi
nvmet_clear
finish
