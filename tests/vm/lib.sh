# tests/vm/lib.sh — host side of the qpath VM interop suite (sourced by run.sh).
# Starts qpath target inside the vmlab network namespace, boots a vmlab guest with one
# of tests/vm/guest/*.sh, answers the guest's QPATH-ASK requests, and stops every
# process it started (by PID or by the process group it created) on exit.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM_DIR=$REPO/tests/vm
VMLAB_DIR=${VMLAB_DIR:-$REPO/../shared/vmlab}
VMLAB_DIR=$(cd "$VMLAB_DIR" 2>/dev/null && pwd || echo "$VMLAB_DIR")
if [ -f "$VMLAB_DIR/lib.sh" ]; then
  # shellcheck source=/dev/null
  . "$VMLAB_DIR/lib.sh"          # VMLAB_WORK, KERNEL, VMLAB_NETNS/TAP/HOST_IP/GUEST_IP, kdir, initrd
fi
QPATH_NQN=${QPATH_NQN:-nqn.2026-11.io.qpath:default}
CTL_PORT=5599                    # the guest listens here for the host's replies (guest/lib.sh)

say() { printf '[qpath-vm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
NPASS=0; NFAIL=0
pass() { NPASS=$((NPASS + 1)); echo "PASS: host: $*"; }
fail() { NFAIL=$((NFAIL + 1)); echo "FAIL: host: $*"; }
SKIP_RC=77                       # "cannot run here" (automake convention); the Rust tests map it to a skip
skip() { echo "SKIP: $*"; exit $SKIP_RC; }

# ---- the run's preamble, shared by tests/vm, tests/vm-auth and tests/vm-tls ------------
# require_vm_host [TOOL...]: skip (exit 77 with the reason) unless this machine can boot a
# vmlab guest for $KERNEL on a tap: root, the vmlab scripts, the tools (plus each TOOL),
# /dev/net/tun, and the guest's kernel and initramfs.
require_vm_host() {
  [ "$(id -u)" = 0 ] || skip "needs root (network namespace, tap device, QEMU on the tap)"
  [ -f "$VMLAB_DIR/lib.sh" ] && [ -x "$VMLAB_DIR/boot.sh" ] || skip "no vmlab at $VMLAB_DIR (set VMLAB_DIR)"
  local t
  for t in qemu-system-x86_64 ip python3 setsid ps flock timeout cpio gzip "$@"; do
    command -v "$t" > /dev/null || skip "$t not installed (scripts/install-deps.sh)"
  done
  [ -c /dev/net/tun ] || skip "/dev/net/tun missing (tap networking)"
  [ -f "$(initrd)" ] && [ -f "$(kdir)/KVER" ] \
    || skip "no vmlab kernel/initramfs for KERNEL=$KERNEL under $VMLAB_WORK (KERNEL=$KERNEL $VMLAB_DIR/setup.sh)"
}

# resolve_qpath_bin: QPATH_BIN as an absolute path; unset, the repository's release build
# (built here first).
resolve_qpath_bin() {
  if [ -z "${QPATH_BIN:-}" ]; then
    say "building qpath (release)"
    (cd "$REPO" && cargo build --release -q -p qpath)
    QPATH_BIN=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/qpath
  fi
  [ -x "$QPATH_BIN" ] || { echo "FAIL: host: no qpath binary at $QPATH_BIN"; exit 1; }
  QPATH_BIN=$(cd "$(dirname "$QPATH_BIN")" && pwd)/$(basename "$QPATH_BIN")
  if [ -n "${QPATH_BIN_B:-}" ]; then
    [ -x "$QPATH_BIN_B" ] || { echo "FAIL: host: no qpath binary at QPATH_BIN_B=$QPATH_BIN_B"; exit 1; }
    QPATH_BIN_B=$(cd "$(dirname "$QPATH_BIN_B")" && pwd)/$(basename "$QPATH_BIN_B")
  fi
}

# begin_vm_run NAME WAIT_S: one suite run at a time on this machine (they share the netns,
# the tap and the ports): wait up to WAIT_S for the lock (held on fd 9 until the shell
# exits), make the run's log folder D, start the clock T0 and bring the netns up.
begin_vm_run() {
  mkdir -p "$VMLAB_WORK"
  exec 9> "$VMLAB_WORK/qpath-vm.lock"
  flock -w "$2" 9 || { echo "FAIL: host: another qpath VM run holds $VMLAB_WORK/qpath-vm.lock"; exit 1; }
  D=$(mktemp -d "$VMLAB_WORK/$1.XXXXXX")
  T0=$SECONDS
  say "scenario $SCENARIO, KERNEL=$KERNEL ($(kver)), qpath $QPATH_BIN, logs in $D"
  "$VMLAB_DIR/netns.sh" up > /dev/null
}

# ---- process bookkeeping --------------------------------------------------------------
# Every background process is started with setsid, so it leads a process group of its
# own. stop_group signals that group and, by PID, every descendant it has at that moment:
# some live in groups of their own (GNU timeout, e.g. boot.sh's `timeout qemu`, moves
# itself into a new process group), so the group signal alone would miss them.
# What is left after a grace period gets SIGKILL.
STARTED=()
descendants() {  # PID: all descendants, parents before children
  local kids k
  kids=$(ps -o pid= --ppid "$1" 2>/dev/null | tr -d ' ')
  for k in $kids; do echo "$k"; descendants "$k"; done
}
stop_group() {   # PID [SIGNAL]
  local pid=$1 sig=${2:-TERM} i p procs
  kill -0 "$pid" 2>/dev/null || return 0
  procs="$pid $(descendants "$pid" | tr '\n' ' ')"
  if [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ]; then
    kill -"$sig" -- "-$pid" 2>/dev/null || true
  fi
  for p in $procs; do kill -"$sig" "$p" 2>/dev/null || true; done
  for i in $(seq 50); do
    for p in $procs; do kill -0 "$p" 2>/dev/null && break; p=; done
    [ -z "$p" ] && break
    sleep 0.1
  done
  for p in $procs; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local p
  for p in "${STARTED[@]}"; do stop_group "$p"; done
  STARTED=()
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

child_of() {     # the single child of PID (the program a `timeout` wrapper runs)
  ps -o pid= --ppid "$1" 2>/dev/null | head -1 | tr -d ' '
}

# ---- the target -----------------------------------------------------------------------
# start_target [qpath target args...]: runs `qpath target` in the netns on
# $VMLAB_HOST_IP:4420/4421 with its RPC socket in $D, bounded by TARGET_TIMEOUT.
# Sets TARGET_PID (the timeout wrapper) and TARGET_QPATH_PID (qpath itself).
TARGET_TIMEOUT=${TARGET_TIMEOUT:-1200}
start_target() {
  RPC_SOCK=$D/rpc.sock
  echo "---- qpath target started $(date +%T): $*" >> "$D/target.log"
  setsid timeout -k 5 "$TARGET_TIMEOUT" ip netns exec "$VMLAB_NETNS" \
    env RUST_LOG="${QPATH_VM_RUST_LOG:-debug}" "$QPATH_BIN" target \
    --listen "$VMLAB_HOST_IP:4420" --listen "$VMLAB_HOST_IP:4421" --rpc-socket "$RPC_SOCK" "$@" \
    >> "$D/target.log" 2>&1 < /dev/null &
  TARGET_PID=$!
  STARTED+=("$TARGET_PID")
  local i
  for i in $(seq 100); do
    kill -0 "$TARGET_PID" 2>/dev/null || { fail "qpath target exited at start (log: $D/target.log)"; tail -20 "$D/target.log"; return 1; }
    rpc get_target > /dev/null 2>&1 && break
    sleep 0.1
  done
  TARGET_QPATH_PID=$(child_of "$TARGET_PID")
  if ! rpc get_target > /dev/null 2>&1 || [ -z "$TARGET_QPATH_PID" ]; then
    fail "qpath target did not answer RPC within 10 s (log: $D/target.log)"; return 1
  fi
  say "qpath target running (pid $TARGET_QPATH_PID) on $VMLAB_HOST_IP:4420/4421 in netns $VMLAB_NETNS, rpc $RPC_SOCK"
}
rpc() { timeout 10 "$QPATH_BIN" rpc --socket "$RPC_SOCK" "$@"; }
# rpc_json METHOD JSON: one JSON-RPC call with JSON params, straight to the socket (no
# command-line parsing of values); prints the result, exits non-zero with the error message.
rpc_json() {
  timeout 10 python3 - "$RPC_SOCK" "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": sys.argv[2], "params": json.loads(sys.argv[3])}) + "\n").encode())
r = json.loads(s.makefile().readline())
if "error" in r:
    print(r["error"]["message"]); sys.exit(1)
print(json.dumps(r["result"]))
PY
}
queue_summary() {  # one line per queue from `qpath rpc list_queues`
  rpc list_queues | python3 -c '
import json, sys
for q in json.load(sys.stdin):
    s = q.get("stats", {})
    print("  port %s cntlid %s qid %s: commands=%s errors=%s reads=%s writes=%s outstanding=%s" % (
        q.get("port"), q.get("cntlid"), q.get("qid"), s.get("commands"), s.get("errors"),
        s.get("reads"), s.get("writes"), s.get("outstanding")))' || echo "  (list_queues failed)"
}

# check_target_after: the target is still running, RPC answers, and no controller of
# $QPATH_NQN is left once the guest has disconnected (bounded wait).
check_target_after() {
  if kill -0 "$TARGET_QPATH_PID" 2>/dev/null; then pass "qpath target (pid $TARGET_QPATH_PID) still running"
  else fail "qpath target (pid $TARGET_QPATH_PID) is gone (log: $D/target.log)"; return; fi
  local out i n=-1
  for i in $(seq 15); do
    out=$(rpc list_controllers 2>&1) || { n=-1; sleep 1; continue; }
    n=$(printf '%s' "$out" | python3 -c 'import json,sys; print(sum(1 for c in json.load(sys.stdin) if c.get("subnqn") == sys.argv[1]))' "$QPATH_NQN" 2>/dev/null || echo -1)
    [ "$n" = 0 ] && break
    sleep 1
  done
  echo "list_controllers: $out" | head -40
  case "$n" in
    -1) fail "qpath rpc list_controllers did not answer with JSON" ;;
    0) pass "qpath rpc list_controllers answers; no controller of $QPATH_NQN left after disconnect-all" ;;
    *) fail "qpath rpc list_controllers: $n controller(s) of $QPATH_NQN still listed 15 s after disconnect-all" ;;
  esac
  if grep -q "panicked" "$D/target.log"; then fail "target log has a panic:"; grep -m5 -A3 panicked "$D/target.log"; fi
}

# ---- the guest ------------------------------------------------------------------------
# boot_guest SCRIPT [vmlab.env.X=Y ...]: boots the guest in the background (BOOT_PID) and
# returns once its init has run (VMLAB-BOOTED). A guest kernel that panics before its init
# runs (seen once with Linux 7.2 under TCG: an int3 oops in timekeeping 2 s into boot, no
# NVMe code reached yet) is booted again, up to BOOT_RETRIES times, with its serial log
# kept; a panic after init is the scenario's to judge and is never retried.
# A second build (QPATH_BIN_B) adds about 4 min of alternated counts to the ublk guest.
BOOT_TIMEOUT=${BOOT_TIMEOUT:-$([ -n "${QPATH_BIN_B:-}" ] && echo 1200 || echo 600)}
BOOT_RETRIES=${BOOT_RETRIES:-2}
boot_guest() {
  local try
  for try in $(seq 0 "$BOOT_RETRIES"); do
    start_guest "$@"
    guest_init_ran && return 0
    [ "$try" -lt "$BOOT_RETRIES" ] || break
    mv "$SERIAL" "$SERIAL.panic-$try"
    say "NOTE: the guest kernel panicked before its init ran (log kept: $SERIAL.panic-$try); not a qpath failure, booting again"
  done
  say "the guest kernel panicked before its init ran $((BOOT_RETRIES + 1)) times; the scenario goes on and will fail"
}

start_guest() {
  local script=$1; shift
  local append="vmlab.env.NQN=$QPATH_NQN vmlab.env.EXPECT_KVER=$(kver) $*"
  SERIAL=$D/serial.log
  say "booting KERNEL=$KERNEL guest with $(basename "$script") (serial log $SERIAL)"
  local share=() f
  [ -z "${GUEST_SHARE:-}" ] || share=(--share "$GUEST_SHARE")   # 9p: host dir at /host
  for f in ${BOOT_FILES[@]+"${BOOT_FILES[@]}"}; do share+=(--file "$f"); done   # SRC:DST, more files
  setsid "$VMLAB_DIR/boot.sh" --net tap --script "$script" "${share[@]}" ${GUEST_FILES[@]+"${GUEST_FILES[@]}"} \
    --file "$VM_DIR/guest/lib.sh:/vmlab/qpath-lib.sh" --timeout "$BOOT_TIMEOUT" \
    --append "$append" --log "$SERIAL" > "$D/boot.out" 2>&1 < /dev/null &
  BOOT_PID=$!
  STARTED+=("$BOOT_PID")
}

# guest_payload TOOL...: puts the qpath binary (/vmlab/qpath), the guest kernel's ublk_drv,
# nbd and ext4 modules (/vmlab/modules/*.ko, load order in /vmlab/modules/order) and the
# given host tools (e.g. /usr/sbin/mke2fs) into the next guest, each program with the shared
# libraries ldd names, at the host's paths. Sets GUEST_FILES for start_guest.
GUEST_FILES=()
guest_payload() {
  local pl=$D/payload kv kroot m f lib
  rm -rf "$pl"; mkdir -p "$pl/modules"
  kv=$(kver); kroot=$(kdir)/root
  : > "$pl/modules/order"
  for m in ublk_drv nbd crc16 mbcache jbd2 ext4; do
    f=$(find "$kroot" -path "*/modules/$kv/*" -name "$m.ko*" | head -1)
    [ -n "$f" ] || { say "guest payload: module $m not in $kv (skipped)"; continue; }
    case "$f" in
      *.xz) xz -dc "$f" > "$pl/modules/$m.ko" ;;
      *.zst) zstd -qdc "$f" > "$pl/modules/$m.ko" ;;
      *) cp "$f" "$pl/modules/$m.ko" ;;
    esac
    echo "$m" >> "$pl/modules/order"
  done
  GUEST_FILES=(--file "$QPATH_BIN:/vmlab/qpath" --file "$pl/modules:/vmlab/modules")
  # Programs and libraries are copied with links followed (boot.sh copies with cp -a), to
  # their real directory (/lib is a link to /usr/lib on the host and in the guest).
  local progs=("$QPATH_BIN") t real n=0
  # A second build to compare with in the same boot (ublk's syscalls step): /vmlab/qpath-b.
  if [ -n "${QPATH_BIN_B:-}" ]; then
    GUEST_FILES+=(--file "$QPATH_BIN_B:/vmlab/qpath-b"); progs+=("$QPATH_BIN_B")
  fi
  mkdir -p "$pl/files"
  for t in "$@"; do
    [ -x "$t" ] || { say "guest payload: $t not on this machine (skipped)"; continue; }
    progs+=("$t")
    n=$((n + 1)); cp -L "$t" "$pl/files/$n"
    GUEST_FILES+=(--file "$pl/files/$n:$t")
  done
  for lib in $(ldd "${progs[@]}" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u); do
    real="$(readlink -f "$(dirname "$lib")")/$(basename "$lib")"
    n=$((n + 1)); cp -L "$lib" "$pl/files/$n"
    GUEST_FILES+=(--file "$pl/files/$n:$real")
  done
}

# guest_init_ran: waits (at most 180 s) for the guest's init; fails only when the boot
# ended without it and the serial log shows a kernel panic.
guest_init_ran() {
  local i
  for i in $(seq 360); do
    grep -aq VMLAB-BOOTED "$SERIAL" 2>/dev/null && return 0
    if ! kill -0 "$BOOT_PID" 2>/dev/null; then
      grep -aq VMLAB-BOOTED "$SERIAL" 2>/dev/null && return 0
      ! grep -aq "Kernel panic" "$SERIAL" 2>/dev/null
      return
    fi
    sleep 0.5
  done
  return 0
}

# serve_guest: until the guest powers off, answer each new "QPATH-ASK NAME" line of the
# serial log by calling on_ask NAME (defined by the scenario) and sending the guest
# "ok NAME" (on success) on TCP $CTL_PORT. Sets BOOT_RC (boot.sh's exit status: the
# guest script's, 124 on timeout).
serve_guest() {
  local handled=0 deadline=$((SECONDS + BOOT_TIMEOUT + 60)) asks name
  while kill -0 "$BOOT_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    mapfile -t asks < <(grep -ao 'QPATH-ASK [a-z0-9-]*' "$SERIAL" 2>/dev/null || true)
    while [ "$handled" -lt "${#asks[@]}" ]; do
      name=${asks[$handled]#QPATH-ASK }
      handled=$((handled + 1))
      say "guest asks: $name"
      if on_ask "$name"; then reply_guest "ok $name"; else reply_guest "failed $name"; fi
    done
    sleep 0.5
  done
  if kill -0 "$BOOT_PID" 2>/dev/null; then
    fail "guest still running after $((BOOT_TIMEOUT + 60)) s; stopping it"
    stop_group "$BOOT_PID"
  fi
  BOOT_RC=0; wait "$BOOT_PID" || BOOT_RC=$?
}
on_ask() { fail "unexpected request from the guest: $1"; return 1; }

reply_guest() {   # MSG: one TCP message to the guest's nc -l (retried for up to 10 s)
  ip netns exec "$VMLAB_NETNS" timeout 20 python3 - "$VMLAB_GUEST_IP" "$CTL_PORT" "$1" <<'EOF' || fail "could not send '$1' to the guest"
import socket, sys, time
for attempt in range(20):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        s.sendall(sys.argv[3].encode() + b"\n"); s.close(); sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit(1)
EOF
}

# check_guest: the guest script exited 0 and reported no failed check.
check_guest() {
  local res
  res=$(grep -ao 'QPATH-GUEST-RESULT pass=[0-9]* fail=[0-9]*' "$SERIAL" | tail -1)
  if [ "$BOOT_RC" = 0 ] && [ -n "$res" ] && [ "${res##*fail=}" = 0 ]; then
    pass "guest: ${res#QPATH-GUEST-RESULT } (exit 0)"
  else
    fail "guest: exit $BOOT_RC, ${res:-no QPATH-GUEST-RESULT line} (124 = timeout, 125 = no VMLAB-EXIT)"
  fi
}
