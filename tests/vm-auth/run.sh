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
#               secrets must be refused. Last, a background `qpath bench` job (crc32c verify)
#               rotates its live controller to the new secrets the guest gave nvmet
#               (rotate-start-N, rotate-N: reauthenticate over the bench's RPC socket, I/O
#               before and after), then to a secret nvmet lacks (rotate-bad-N: AUTH_Failure1,
#               nvmet tears the controller down), and the job must end with the dead
#               controller's host path error and no verify failure (rotate-stop-N).
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

require_vm_host
find "$(kdir)" -name 'nvme-auth.ko*' | grep -q . \
  || skip "the KERNEL=$KERNEL image has no nvme-auth module"

resolve_qpath_bin
begin_vm_run "qpath-vm-auth-$SCENARIO-$KERNEL" 900

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
  # ---- key rotation under I/O (the guest's last case) ----------------------------------
  # A background `qpath bench` job (randrw 4k, crc32c verify) holds a live controller
  # authenticated with K1/C1; its RPC socket re-authenticates that controller with the K2/C2
  # the guest gave nvmet (rotate-N), then with a K4 nvmet lacks (rotate-bad-N): nvmet answers
  # AUTH_Failure1 and tears the controller down, the host's reconnects (K4) are refused
  # alike, and after ctrl_loss_tmo (3 s in the URI) the controller is dead and the job ends
  # with an I/O error, never a verify error (rotate-stop-N).
  BENCH_SOCK=$D/host.sock BENCH_PID= BENCH_RUNTIME=40
  bench_ctl() {    # "state=.. cntlid=.. ..." of the bench's controller, from its RPC socket
    timeout 10 "$QPATH_BIN" rpc --socket "$BENCH_SOCK" stats 2>/dev/null | python3 -c '
import json, sys
for c in json.load(sys.stdin).get("controllers", []):
    if c.get("subnqn") == sys.argv[1]:
        print(" ".join("%s=%s" % (k, c.get(k)) for k in ("state", "cntlid", "io_queues", "reads", "writes", "errors",
                                                          "reauths", "reauth_failures", "reconnects")))
        break' "$QPATH_NQN" 2>/dev/null
  }
  kv() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }   # kv "a=1 b=2" b -> 2
  bench_reauth() { # bench_reauth KEY CKEY: the reauthenticate RPC's answer
    timeout 60 "$QPATH_BIN" rpc --socket "$BENCH_SOCK" reauthenticate dhchap_secret="$1" dhchap_ctrl_secret="$2" 2>&1
  }
  # reauth_verdict CHECK: the reauthenticate answer on stdin must be a JSON array of one
  # controller, bound to `e` for CHECK (Python: prints the verdict, exits 0 or 1).
  reauth_verdict() {
    python3 -c 'import json, re, sys
try:
    v = json.load(sys.stdin)
except ValueError:
    print("not JSON"); sys.exit(1)
if not (isinstance(v, list) and len(v) == 1):
    print("want one controller, got %d" % len(v) if isinstance(v, list) else "not an array"); sys.exit(1)
e = v[0]
'"$1"
  }
  rotate_start() {
    local n=$1 host key ckey uri i ctl=
    host=$(auth_field "$n" host); key=$(auth_field "$n" key); ckey=$(auth_field "$n" ckey)
    enc() { printf '%s' "$1" | sed 's|%|%25|g; s|/|%2F|g; s|+|%2B|g; s|=|%3D|g'; }
    uri="nvme+tcp://$VMLAB_GUEST_IP:4420/$QPATH_NQN/1?hostnqn=$host&dhchap_secret=$(enc "$key")&dhchap_ctrl_secret=$(enc "$ckey")&reconnect_delay=1&ctrl_loss_tmo=3"
    rm -f "$BENCH_SOCK"
    setsid timeout -k 5 $((BENCH_RUNTIME + 90)) ip netns exec "$VMLAB_NETNS" env RUST_LOG=info "$QPATH_BIN" bench \
      --output-format=json --rpc-socket "$BENCH_SOCK" -- --name=rot --ioengine=qpath --rw=randrw --bs=4k \
      --iodepth=8 --size=16M --time_based --runtime="$BENCH_RUNTIME" --verify=crc32c --filename="$uri" \
      > "$D/bench.json" 2> "$D/bench.log" < /dev/null &
    BENCH_PID=$!
    STARTED+=("$BENCH_PID")
    for i in $(seq 120); do
      ctl=$(bench_ctl)
      [ "$(kv "$ctl" state)" = live ] && break
      kill -0 "$BENCH_PID" 2>/dev/null || break
      sleep 0.5
    done
    say "case $n: bench (pid $BENCH_PID): ${ctl:-no controller}"
    if [ "$(kv "$ctl" state)" = live ]; then
      pass "case $n: qpath bench job (randrw 4k iodepth 8, crc32c verify, K1/C1 in its URI) has a live controller on Linux nvmet (cntlid $(kv "$ctl" cntlid), $(kv "$ctl" io_queues) I/O queues)"
    else
      fail "case $n: the bench's controller is not live within 60 s (${ctl:-stats did not answer})"
      tail -5 "$D/bench.log" | sed 's/^/    /'; return 1
    fi
  }
  rotate_good() {
    local n=$1 key ckey before out rc right after verdict rc2=0
    key=$(auth_field "rotate-$n" key); ckey=$(auth_field "rotate-$n" ckey)
    sleep 2                                 # I/O before the rotation
    before=$(bench_ctl)
    out=$(bench_reauth "$key" "$ckey"); rc=$?
    right=$(bench_ctl)
    sleep 3                                 # I/O after it
    after=$(bench_ctl)
    echo "    reauthenticate (K2/C2): rc=$rc $out"
    printf '    before: %s\n    right after: %s\n    3 s later: %s\n' "$before" "$right" "$after"
    verdict=$(printf '%s' "$out" | reauth_verdict '
if e.get("ok") is True and e.get("failed") == [] and e.get("io_queues", 0) >= 1:
    print("ok, admin + %d I/O queues re-authenticated in %.0f ms" % (e["io_queues"], e.get("ms", -1)))
else:
    print("ok=%s failed=%s io_queues=%s error=%s" % (e.get("ok"), e.get("failed"), e.get("io_queues"), e.get("error"))); sys.exit(1)') || rc=1
    if [ "$rc" = 0 ]; then pass "case $n: rpc reauthenticate with new secrets K2/C2 on the live controller under I/O: $verdict"
    else fail "case $n: rpc reauthenticate with K2/C2: $verdict"; rc2=1; fi
    if [ "$(kv "$before" reads)" -gt 0 ] 2>/dev/null && [ "$(kv "$before" writes)" -gt 0 ]; then
      pass "case $n: I/O before the rotation ($(kv "$before" reads) reads, $(kv "$before" writes) writes)"
    else fail "case $n: no I/O before the rotation ($before)"; rc2=1; fi
    if [ "$(kv "$after" reads)" -gt "$(kv "$right" reads)" ] 2>/dev/null && [ "$(kv "$after" writes)" -gt "$(kv "$right" writes)" ]; then
      pass "case $n: I/O after the rotation ($(($(kv "$after" reads) - $(kv "$right" reads))) reads, $(($(kv "$after" writes) - $(kv "$right" writes))) writes in 3 s)"
    else fail "case $n: no I/O after the rotation (right after: $right; 3 s later: $after)"; rc2=1; fi
    if [ "$(kv "$after" state)" = live ] && [ "$(kv "$after" cntlid)" = "$(kv "$before" cntlid)" ] && [ "$(kv "$after" errors)" = 0 ] \
       && [ "$(kv "$after" reauths)" = 1 ] && [ "$(kv "$after" reauth_failures)" = 0 ] && [ "$(kv "$after" reconnects)" = 0 ]; then
      pass "case $n: controller still live, same cntlid $(kv "$after" cntlid), 1 re-authentication, no I/O error, no reconnect"
    else fail "case $n: controller after the rotation: $after (want live, cntlid $(kv "$before" cntlid), errors=0 reauths=1 reauth_failures=0 reconnects=0)"; rc2=1; fi
    return $rc2
  }
  rotate_bad() {
    local n=$1 key ckey out verdict i ctl=
    key=$(auth_field "bad-$n" key); ckey=$(auth_field "bad-$n" ckey)
    out=$(bench_reauth "$key" "$ckey")
    echo "    reauthenticate (K4, nvmet has K3): $out"
    # nvmet refuses the Reply (host response mismatch) with AUTH_Failure1, explanation 0x01
    # (failed), and tears the controller down in the same step, so the connection may close
    # before the AUTH_Failure1 arrives: either way the admin queue's Success1 step fails.
    verdict=$(printf '%s' "$out" | reauth_verdict '
err = e.get("error") or ""
m = re.search(r"queue 0 authentication \(Success1\): (controller refused \(AUTH_Failure1, reason 0x01, explanation 0x01[^)]*\)|connection closed by the controller)", err)
if e.get("ok") is False and m:
    print(m.group(0)); sys.exit(0)
print("ok=%s error=%s" % (e.get("ok"), err)); sys.exit(1)')
    if [ $? = 0 ]; then pass "case $n: rpc reauthenticate with a key nvmet lacks: ok false, $verdict"
    else fail "case $n: rpc reauthenticate with a key nvmet lacks: $verdict"; return 1; fi
    for i in $(seq 20); do
      ctl=$(bench_ctl)
      [ -n "$ctl" ] && [ "$(kv "$ctl" state)" != live ] && break
      sleep 0.5
    done
    echo "    controller after the refusal: ${ctl:-stats did not answer}"
    if [ "$(kv "$ctl" reauth_failures)" = 1 ] && [ "$(kv "$ctl" state)" != live ]; then
      pass "case $n: the controller left live (state $(kv "$ctl" state)), 1 failed re-authentication"
    else fail "case $n: controller after the refused re-authentication: ${ctl:-stats did not answer}"; return 1; fi
  }
  rotate_stop() {
    local n=$1 i rc verdict
    [ -n "$BENCH_PID" ] || { fail "case $n: no bench job was started"; return 1; }
    for i in $(seq 60); do kill -0 "$BENCH_PID" 2>/dev/null || break; sleep 1; done
    if kill -0 "$BENCH_PID" 2>/dev/null; then
      fail "case $n: the bench job still runs 60 s after the refusal; stopping it (pid $BENCH_PID)"
      stop_group "$BENCH_PID"; BENCH_PID=; return 1
    fi
    rc=0; wait "$BENCH_PID" || rc=$?
    BENCH_PID=
    grep -vE '^ *$' "$D/bench.log" | tail -6 | sed 's/^/    bench: /'
    # The job: I/O both ways, reads verified, no verify failure; it ends with the I/O error
    # of the dead controller (ctrl_loss_tmo after the refused re-authentication): errno 5,
    # NVMe status Host Pathing Error (sct 0x3, sc 0x70), not a verify error (84).
    verdict=$(python3 - "$D/bench.json" "$rc" <<'EOF'
import json, sys
try:
    out = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print("no JSON report (bench rc %s): %s" % (sys.argv[2], e)); sys.exit(1)
j, q = out["jobs"][0], out["qpath"]["jobs"][0]
v = q.get("verify", {})
r, w = j["read"]["total_ios"], j["write"]["total_ios"]
print("bench rc %s, job error %s (%s), %d reads, %d writes, verify checked %s failures %s" % (
    sys.argv[2], j["error"], q.get("error_message", ""), r, w, v.get("checked"), v.get("failures")))
ok = (r > 0 and w > 0 and v.get("checked", 0) > 0 and v.get("failures") == 0 and j["error"] == 5
      and "failed: NVMe status sct=0x3 sc=0x70" in q.get("error_message", ""))
sys.exit(0 if ok else 1)
EOF
)
    if [ $? = 0 ]; then pass "case $n: job ended after the refusal with a host path error (dead controller), no verify failure: $verdict"
    else fail "case $n: job: $verdict"; return 1; fi
    if grep -q 'DHHC-1:[0-9][0-9]:[A-Za-z0-9]' "$D/bench.json" "$D/bench.log"; then
      fail "case $n: a secret is printed in the bench's report or log"; return 1
    fi
  }
  on_ask() {
    case "$1" in
      rotate-start-*) rotate_start "${1#rotate-start-}"; return ;;
      rotate-bad-*) rotate_bad "${1#rotate-bad-}"; return ;;
      rotate-stop-*) rotate_stop "${1#rotate-stop-}"; return ;;
      rotate-*) rotate_good "${1#rotate-}"; return ;;
    esac
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
