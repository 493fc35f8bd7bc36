#!/usr/bin/env bash
# run.sh — DH-HMAC-CHAP interop with Linux, in a vmlab QEMU guest (Linux 7.2, KERNEL=sid).
#
#   tests/vm-auth/run.sh [--kernel sid|trixie|bpo] linux-host|linux-target|all
#
# linux-host    the guest's kernel NVMe/TCP host authenticates to `qpath target`: per case the
#               guest makes secrets with `nvme gen-dhchap-key`, this script hands them to the
#               target (`qpath rpc set_host_auth`), `nvme connect --dhchap-secret
#               [--dhchap-ctrl-secret]` must succeed (kernel logs the hash and DH group) and a
#               short fio crc32c verify runs; a wrong host secret, a wrong controller secret and
#               no secret must be refused. On one case the guest rotates the host secret of the
#               live controller (auth-rotate-N: the target gets the new one first) under fio:
#               Linux re-authenticates every queue, this script checks the target saw one
#               accepted transaction per queue on the same controller (reauth-check-N); then a
#               rotation to a secret the target lacks must be refused (reauth-refused-N).
# linux-target  `qpath connect -S [-C]` authenticates to the guest's kernel target (nvmet,
#               configfs hosts/<nqn>/dhchap_key, dhchap_ctrl_key, dhchap_hash, dhchap_dhgroup)
#               and, once live, re-authenticates every queue (--reauthenticate); wrong
#               secrets must be refused.
# Cases: SHA-256/384/512 with null, ffdhe2048, 3072, 4096, 8192, uni- and bidirectional
# (tests/vm-auth/guest/*.sh, CASES). The helpers (target start, guest boot, QPATH-ASK
# answers, process cleanup) are tests/vm/lib.sh's, and the guest side uses tests/vm/guest/lib.sh.
# Environment: KERNEL (sid), QPATH_BIN (default: cargo build --release), VMLAB_DIR, VMLAB_WORK.
# Exit status: 0 passed, 1 failed, 77 cannot run here (a "SKIP: reason" line says why).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/vm/lib.sh
. "$HERE/../vm/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) KERNEL=$2; shift ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
SCENARIO=${1:-}
case "$SCENARIO" in
  linux-host|linux-target) ;;
  all)
    rc=0
    for s in linux-host linux-target; do
      "$0" --kernel "${KERNEL:-sid}" "$s" || { r=$?; [ $r = "$SKIP_RC" ] || rc=1; }
    done
    exit $rc ;;
  *) echo "usage: $0 [--kernel sid] linux-host|linux-target|all" >&2; exit 2 ;;
esac
export KERNEL=${KERNEL:-sid}
case "$KERNEL" in
  bookworm) skip "KERNEL=bookworm is Linux 6.1: its nvmet has no DH-HMAC-CHAP (6.12+ has)" ;;
esac

[ "$(id -u)" = 0 ] || skip "needs root (network namespace, tap device, QEMU on the tap)"
[ -f "$VMLAB_DIR/lib.sh" ] && [ -x "$VMLAB_DIR/boot.sh" ] || skip "no vmlab at $VMLAB_DIR (set VMLAB_DIR)"
for t in qemu-system-x86_64 ip python3 setsid ps flock timeout cpio gzip; do
  command -v "$t" > /dev/null || skip "$t not installed (scripts/install-deps.sh)"
done
[ -c /dev/net/tun ] || skip "/dev/net/tun missing (tap networking)"
[ -f "$(initrd)" ] && [ -f "$(kdir)/KVER" ] \
  || skip "no vmlab kernel/initramfs for KERNEL=$KERNEL under $VMLAB_WORK (KERNEL=$KERNEL $VMLAB_DIR/setup.sh)"
find "$(kdir)" -name 'nvme-auth.ko*' | grep -q . \
  || skip "the KERNEL=$KERNEL image has no nvme-auth module"

if [ -z "${QPATH_BIN:-}" ]; then
  say "building qpath (release)"
  (cd "$REPO" && cargo build --release -q -p qpath)
  QPATH_BIN=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/qpath
fi
[ -x "$QPATH_BIN" ] || { echo "FAIL: host: no qpath binary at $QPATH_BIN"; exit 1; }
QPATH_BIN=$(cd "$(dirname "$QPATH_BIN")" && pwd)/$(basename "$QPATH_BIN")

# The same lock as tests/vm/run.sh: both suites use the netns, the tap and the ports.
mkdir -p "$VMLAB_WORK"
exec 9> "$VMLAB_WORK/qpath-vm.lock"
flock -w 900 9 || { echo "FAIL: host: another qpath VM run holds $VMLAB_WORK/qpath-vm.lock"; exit 1; }
D=$(mktemp -d "$VMLAB_WORK/qpath-vm-auth-$SCENARIO-$KERNEL.XXXXXX")
T0=$SECONDS
say "scenario $SCENARIO, KERNEL=$KERNEL ($(kver)), qpath $QPATH_BIN, logs in $D"
"$VMLAB_DIR/netns.sh" up > /dev/null

# auth_line NAME: the guest's "QPATH-AUTH case=N ..." line for QPATH-ASK NAME (N = NAME's number).
auth_field() {   # auth_field CASE FIELD: one field of that line
  grep -ao "QPATH-AUTH case=$1 .*" "$SERIAL" | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p" | tr -d '\r'
}

reauth_field() {  # reauth_field CASE FIELD: one field of the guest's "QPATH-REAUTH case=CASE ..." line
  grep -ao "QPATH-REAUTH case=$1 .*" "$SERIAL" | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p" | tr -d '\r'
}
log_since() { tail -n +"$(($1 + 1))" "$D/target.log"; }   # the target log after its line $1
log_lines() { wc -l < "$D/target.log"; }

scenario_linux-host() {
  set_keys() {     # set_keys CASE: rpc set_host_auth with the keys of the guest's QPATH-AUTH line
    local n=$1 host hash group key ckey args
    host=$(auth_field "$n" host); hash=$(auth_field "$n" hash); group=$(auth_field "$n" dhgroup)
    key=$(auth_field "$n" key); ckey=$(auth_field "$n" ckey)
    args=(nqn="$QPATH_NQN" host="$host" dhchap_key="$key" hash="$hash" dhgroup="$group")
    [ "$ckey" != none ] && args+=(dhchap_ctrl_key="$ckey")
    if rpc set_host_auth "${args[@]}" > /dev/null; then
      pass "case $n: rpc set_host_auth host=$host hash=$hash dhgroup=$group bidirectional=$([ "$ckey" != none ] && echo yes || echo no)"
    else
      fail "case $n: rpc set_host_auth failed"; return 1
    fi
  }
  # reauth_check CASE: after the guest's rotation, the target answered one re-authentication
  # per queue (cntlid and queue count from the guest) on the controller it already had, and
  # refused nothing. The "accepted" line is the target's debug line of a bidirectional
  # transaction's Success2; waits at most 20 s for the I/O queues' transactions.
  reauth_check() {
    local n=$1 cntlid queues got=0 i bad ctl
    cntlid=$(reauth_field "$n" cntlid); queues=$(reauth_field "$n" queues)
    for i in $(seq 20); do
      got=$(log_since "$REAUTH_MARK" | grep -c "host accepted the controller's response" || true)
      [ "$got" -ge "${queues:-1}" ] && break
      sleep 1
    done
    bad=$(log_since "$REAUTH_MARK" | grep -E "authentication failed|response mismatch|controller deleted|closing:" | head -5)
    ctl=$(rpc list_controllers | python3 -c '
import json, sys
for c in json.load(sys.stdin):
    if c.get("subnqn") == sys.argv[1] and str(c.get("cntlid")) == sys.argv[2]:
        print("%s io_queues=%d" % (c.get("state"), len(c.get("io_queues", []))))' "$QPATH_NQN" "$cntlid" 2>&1)
    say "case $n re-authentication: $got accepted transaction(s) for $queues queue(s); cntlid $cntlid: ${ctl:-not listed}"
    log_since "$REAUTH_MARK" | grep -E "auth|deleted|closing" | tail -8 | sed 's/^/    /'
    local rc=0
    if [ "$got" -ge "${queues:-1}" ] && [ "${queues:-0}" -ge 2 ]; then
      pass "case $n: target: $got re-authentication transaction(s) accepted (Success2) for the $queues queues"
    else fail "case $n: target: $got accepted re-authentication transaction(s), want one per queue (${queues:-?})"; rc=1; fi
    local renewals
    renewals=$(( $(renewed || echo 0) - RENEWED_MARK ))
    if [ "$renewals" = "${queues:-x}" ]; then
      pass "case $n: target stats: reauthentications_accepted +$renewals (one per queue)"
    else fail "case $n: target stats: reauthentications_accepted +$renewals, want +${queues:-?}"; rc=1; fi
    if [ -z "$bad" ]; then pass "case $n: target: no refusal, no closed queue, no deleted controller during the rotation"
    else fail "case $n: target logged during the rotation: $bad"; rc=1; fi
    if [ -n "$ctl" ] && [ "${ctl##*io_queues=}" = $((queues - 1)) ]; then
      pass "case $n: target: controller cntlid $cntlid still there with its $((queues - 1)) I/O queues ($ctl)"
    else fail "case $n: target: controller cntlid $cntlid: ${ctl:-not listed} (want $((queues - 1)) I/O queues)"; rc=1; fi
    return $rc
  }
  # reauth_refused CASE: after the guest's rotation to a secret the target lacks, the target
  # found the host's response wrong and deleted that controller (waits at most 15 s).
  reauth_refused() {
    local n=$1 cntlid i ok=0
    cntlid=$(reauth_field "wrong-$n" cntlid)
    for i in $(seq 15); do
      if log_since "$REAUTH_MARK" | grep -q "host response mismatch" \
         && log_since "$REAUTH_MARK" | grep -q "controller deleted: .*in-band authentication failed cntlid=$cntlid "; then
        ok=1; break
      fi
      sleep 1
    done
    log_since "$REAUTH_MARK" | grep -E "mismatch|authentication failed|deleted" | head -6 | sed 's/^/    /'
    if [ $ok = 1 ]; then pass "case $n: target: wrong secret at re-authentication: response mismatch, AUTH_Failure1, controller $cntlid deleted"
    else fail "case $n: target did not log the refusal of the re-authentication and the deletion of cntlid $cntlid"; return 1; fi
  }
  REAUTH_MARK=0    # target log line count at the last rotation step
  RENEWED_MARK=0   # the target's re-authentications accepted then (`qpath rpc stats`)
  renewed() {      # re-authentications the target accepted so far
    rpc stats | python3 -c 'import json, sys; print(json.load(sys.stdin)["auth"]["reauthentications_accepted"])'
  }
  on_ask() {
    case "$1" in
      auth-keys-*) set_keys "${1#auth-keys-}" ;;
      auth-rotate-*)
        REAUTH_MARK=$(log_lines)
        RENEWED_MARK=$(renewed || echo 0)
        set_keys "rotate-${1#auth-rotate-}" ;;
      reauth-check-*)
        local rc=0
        reauth_check "${1#reauth-check-}" || rc=1
        REAUTH_MARK=$(log_lines)
        return $rc ;;
      reauth-refused-*) reauth_refused "${1#reauth-refused-}" ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  start_target || return 0
  boot_guest "$HERE/guest/linux-host.sh"
  serve_guest
  check_guest
  check_target_after
  local n
  n=$(grep -c "in-band authentication failed\|authentication failed" "$D/target.log" || true)
  say "target log: $n authentication failure line(s) (the guest's refusal cases)"
}

scenario_linux-target() {
  QPATH_NQN=nqn.2024-01.io.vmlab:auth
  on_ask() {
    local n=${1#connect-} host expect key ckey out rc
    [ "$n" != "$1" ] || { fail "unexpected request from the guest: $1"; return 1; }
    host=$(auth_field "$n" host); expect=$(auth_field "$n" expect)
    key=$(auth_field "$n" key); ckey=$(auth_field "$n" ckey)
    local args=(connect -a "$VMLAB_GUEST_IP" -s 4420 -n "$QPATH_NQN" -q "$host" -i 2 -S "$key")
    [ "$ckey" != none ] && args+=(-C "$ckey")
    # Connected: every queue re-authenticates at once on the live controller (nvmet restarts
    # the transaction at the Negotiate, re-reading the host's keys from configfs).
    [ "$expect" = ok ] && args+=(--reauthenticate)
    out=$(ip netns exec "$VMLAB_NETNS" timeout 120 env RUST_LOG=info "$QPATH_BIN" "${args[@]}" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -8 | sed 's/^/    /'
    case "$expect:$rc" in
      ok:0)
        if printf '%s' "$out" | grep -q 'nsid *1 '; then
          pass "case $n: qpath connect -S$([ "$ckey" != none ] && echo ' -C') to Linux nvmet: $(printf '%s' "$out" | grep -o 'hash="[^"]*" group="[^"]*" bidirectional=[a-z]*' | head -1 | tr -d '"'), namespace listed"
        else fail "case $n: qpath connect rc=0 but no namespace listed"; return 1; fi
        if printf '%s' "$out" | grep -qE 're-authenticated admin \+ 2 I/O queues'; then
          pass "case $n: $(printf '%s' "$out" | grep -oE 're-authenticated admin \+ 2 I/O queues in [0-9]+ ms') (live controller, Linux nvmet)"
        else fail "case $n: the live controller did not re-authenticate"; return 1; fi ;;
      ok:*) fail "case $n: qpath connect failed (rc=$rc)"; return 1 ;;
      bad*:0) fail "case $n: qpath connect succeeded with a wrong secret ($expect)"; return 1 ;;
      bad*:*)
        # A wrong host key: nvmet answers AUTH_Failure1, or (a race in nvmet, seen once with
        # 7.2) tears the controller down first, closing the connection while we wait for
        # Success1. Either is its refusal; a close at any other step is not.
        local refused='AUTH_Failure1|controller.s response is wrong'
        [ "$expect" = badkey ] && refused="$refused|authentication \\(Success1\\): connection closed by the controller"
        if printf '%s' "$out" | grep -qiE "$refused"; then
          pass "case $n: qpath connect refused as it should ($expect, rc=$rc)"
        else fail "case $n: qpath connect failed for another reason ($expect, rc=$rc)"; return 1; fi ;;
    esac
  }
  boot_guest "$HERE/guest/linux-target.sh"
  serve_guest
  check_guest
}

set +e
"scenario_$SCENARIO"
cleanup
echo
say "scenario $SCENARIO on KERNEL=$KERNEL ($(kver)): $NPASS host checks passed, $NFAIL failed, $((SECONDS - T0)) s"
say "serial log: ${SERIAL:-none}   target log: $D/target.log"
grep -aE '^(PASS|FAIL): ' "${SERIAL:-/dev/null}" | sed 's/^/  guest /' || true
if [ "$NFAIL" = 0 ]; then
  echo "RESULT: PASS $SCENARIO KERNEL=$KERNEL ($((SECONDS - T0)) s)"
  exit 0
fi
echo "RESULT: FAIL $SCENARIO KERNEL=$KERNEL: see $D (serial log ${SERIAL:-none})"
exit 1
