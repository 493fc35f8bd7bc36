#!/bin/sh
# Guest: the Linux kernel target (nvmet) requires DH-HMAC-CHAP; `qpath connect -S [-C]` on
# the host side must authenticate to it. Per case the guest makes fresh secrets with
# `nvme gen-dhchap-key`, writes them to configfs (hosts/<hostnqn>/dhchap_key, dhchap_ctrl_key,
# dhchap_hash, dhchap_dhgroup; attr_allow_any_host=0), prints them ("QPATH-AUTH ...") and asks
# the host to connect (QPATH-ASK connect-N); the host answers ok when qpath behaved as the
# case expects (connected, or refused for the wrong-secret cases).
# Settings (vmlab.env.*): NQN, HOSTPFX, CASES ("hmac:hash:dhgroup:bidi:expect ...").
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
nvmet_clear
finish
