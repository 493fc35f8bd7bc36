#!/usr/bin/env bash
# run.sh — the qpath VM interop suite: the Linux kernel NVMe/TCP host (in a vmlab QEMU
# guest) against `qpath target` (on this machine, inside netns vmlab, 10.213.0.1:4420/4421).
#
#   tests/vm/run.sh [--kernel bookworm|sid] [--capture] SCENARIO
#
# SCENARIO (see tests/vm/README.md):
#   interop     discover; connect both ports = one multipath namespace, two paths; fio 4k randrw
#               + crc32c verify (RANDRW_RUNTIME s) and a 128k sequential write + verify; again
#               with header and data digests (DIGEST_RUNTIME s); disconnect-all; target alive
#   ana         ANA flip to inaccessible and back under fio, iopolicy queue-depth (7.2 only)
#   durability  file backend; the guest writes, deallocates ranges (blkdiscard, a 3-range nvme dsm)
#               and zeroes others (nvme write-zeroes with and without DEAC), flushes; kill -9 +
#               restart of the target; the guest reconnects and verifies data and zeros; here:
#               the file's size, its md5s, and the deallocated ranges are holes. The target
#               runs with --persist: before the crash the host adds the guest's host NQN
#               (and forbids any other host) and a second namespace over RPC, which the
#               restarted target must serve again (the guest writes and verifies it)
#   qdpolicy    port 1 delayed by QD_DELAY_US (2000); iopolicy queue-depth must send most I/O to
#               port 2, round-robin splits it evenly (per-path sysfs counts; 7.2 only)
#   resv        namespace reservations: the guest (nvme-cli) registers and takes Write Exclusive;
#               `qpath resv` here, another Host Identifier, gets Reservation Conflict on writes
#               and reads fine, preempts it with Exclusive Access (the guest's reads now fail),
#               clears it (the guest reads and writes again); then, on a file namespace with a
#               ptpl_file, the guest registers with CPTPL on and takes Write Exclusive, the target
#               is killed (-9) and restarted: the reservation is back (report, ptpls 1, the
#               other host still refused), the guest writes, releases and unregisters
#   resize      the namespace grows by RPC while the guest is connected (both ports, one head):
#               the new size shows in sysfs and nvme id-ns within RESIZE_WAIT s (30) without a
#               reconnect; writes and reads past the old end, fio verify there, old end intact
#   nvmet       our host against the guest kernel's nvmet-tcp: qpath discover, connect, bench
#               with verify=crc32c on both ports and with digests (issue 3 acceptance 1)
#   flaps       issue 4 acceptance 3c: `qpath lab flaps --mode nvmet`, our host's 4k randwrite +
#               crc32c verify through a 2-path head while the guest's nvmet removes and re-adds
#               one port's subsystem link in configfs (FLAPS_DOWN s every FLAPS_PERIOD s for
#               FLAPS_RUNTIME s: 5/10/120), then a read-back: zero errors, zero verify failures
#   conformance the differential conformance suite: the same nvme-cli commands (identify, every
#               log page and feature, data commands, bad input, reservations) against the
#               guest's Linux nvmet (file namespaces) and qpath target (file namespaces of the
#               same size); tests/vm/conformance.py prints the table and fails on any
#               difference it cannot explain
#   ublk        our host as a block device (7.2): `qpath host` in the guest serves /dev/ublkb0
#               over both ports of the target here; ext4 with files verified across a remount,
#               fstrim reaching the target as Deallocate (its trim counters) with the trimmed
#               blocks reading zeros, fio randrw crc32c verify while port 1 flaps every 10 s,
#               during a target kill -9 + restart, and during a kill -9 + restart of qpath
#               itself (user recovery); io_uring_enter calls per request; ublk del
#   ublk-nvmet  the same host against the guest's Linux nvmet: /dev/ublkb0 on nvmet's namespace,
#               fio verify, then another Host Identifier takes a reservation: the
#               application's writes fail with EBADE at once, reads go on, release heals
#   nbd         `qpath nbd serve` in the guest over both ports here, the guest kernel's nbd
#               (nbd-client) on it: fio randrw crc32c verify, a path flap during it
#   blockdev    ublk, nbd and ublk-nvmet in one boot (what `all` and CI run)
#   all         every scenario on the kernels it applies to (6.1 interop with --capture)
# --capture: tshark records the scenario's NVMe/TCP traffic on the tap; afterwards Wireshark's
#   dissector must find no malformed frame, expert error, unknown PDU type or bad digest, and
#   every PDU type of a read/write workload (tests/vm/pcap-check.sh).
# Environment: KERNEL (bookworm = 6.1, sid = 7.2), QPATH_BIN (default: cargo build --release),
#   QPATH_BIN_B (ublk: a second build whose syscall counts alternate with QPATH_BIN's in one boot),
#   VMLAB_DIR (default ../shared/vmlab from the repo root), VMLAB_WORK, RANDRW_RUNTIME (30),
#   DIGEST_RUNTIME (30), ANA_FIO_RUNTIME (45), RESIZE_WAIT (30), QPATH_VM_RUST_LOG (debug),
#   QPATH_VM_KEEP_PCAP=1
# Exit status: 0 passed, 1 failed, 77 cannot run here (a "SKIP: reason" line says why).
# Logs: $VMLAB_WORK/qpath-vm-SCENARIO-KERNEL.XXXXXX/{serial.log,target.log,boot.out,...}
set -euo pipefail
# shellcheck source=tests/vm/lib.sh
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"

CAPTURE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) KERNEL=$2; shift ;;
    --capture) CAPTURE=1 ;;
    -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
SCENARIO=${1:-}
case "$SCENARIO" in
  interop|ana|durability|qdpolicy|nvmet|flaps|resv|resize|conformance|ublk|ublk-nvmet|nbd|blockdev) ;;
  all)
    rc=0
    for s in "bookworm interop --capture" "bookworm durability" "sid interop" "sid ana" "sid durability" \
      "sid qdpolicy" "bookworm resv" "sid resv" "bookworm resize" "sid resize" \
      "bookworm nvmet" "sid nvmet" "sid flaps" "bookworm conformance" "sid conformance" \
      "sid blockdev"; do
      set -- $s
      "$0" --kernel "$1" ${3:-} "$2" || { r=$?; [ $r = "$SKIP_RC" ] || rc=1; }
    done
    exit $rc ;;
  *) echo "usage: $0 [--kernel bookworm|sid] [--capture] interop|ana|durability|qdpolicy|nvmet|flaps|resv|resize|conformance|ublk|ublk-nvmet|nbd|blockdev|all" >&2; exit 2 ;;
esac
export KERNEL=${KERNEL:-bookworm}     # boot.sh and setup.sh read it from the environment

# ---- can this machine run it? ----------------------------------------------------------
require_vm_host
case "$SCENARIO:$KERNEL" in
  ana:bookworm|qdpolicy:bookworm)
    skip "$SCENARIO needs iopolicy queue-depth (Linux >= 6.11); KERNEL=$KERNEL is 6.1" ;;
  ublk:bookworm|ublk-nvmet:bookworm|nbd:bookworm|blockdev:bookworm)
    skip "$SCENARIO runs on the 7.2 guest (KERNEL=sid): its scripts and tools are set up for it" ;;
esac
if [ "$CAPTURE" = 1 ]; then
  for t in tshark text2pcap; do command -v $t > /dev/null || skip "$t not installed (scripts/install-deps.sh)"; done
fi

resolve_qpath_bin
begin_vm_run "qpath-vm-$SCENARIO-$KERNEL" 600

# ---- scenarios --------------------------------------------------------------------------
# file_target_toml OUT IMG [LINE...]: a target config serving $QPATH_NQN on both ports with
# one 256 MiB file namespace at IMG; each LINE is added to the namespace's table.
file_target_toml() {
  local out=$1 img=$2
  shift 2
  {
    cat <<EOF
# written by tests/vm/run.sh $SCENARIO
[[port]]
id = 1
addr = "$VMLAB_HOST_IP:4420"
[[port]]
id = 2
addr = "$VMLAB_HOST_IP:4421"
[[subsystem]]
nqn = "$QPATH_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "$img"
size = "256M"
ana_group = 1
EOF
    [ $# = 0 ] || printf '%s\n' "$@"
  } > "$out"
}

scenario_interop() {   # [extra vmlab.env.* for the guest]
  start_target || return 0
  boot_guest "$VM_DIR/guest/interop.sh" "vmlab.env.RANDRW_RUNTIME=${RANDRW_RUNTIME:-30}" \
    "vmlab.env.DIGEST_RUNTIME=${DIGEST_RUNTIME:-${RANDRW_RUNTIME:-30}}" "$@"
  serve_guest
  check_guest
  check_target_after
}

scenario_ana() {
  on_ask() {
    local state
    case "$1" in
      ana-inaccessible) state=inaccessible ;;
      ana-optimized) state=optimized ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
    if rpc set_ana_state port:=1 group:=1 state=$state; then
      pass "rpc set_ana_state port:=1 group:=1 state=$state"
    else
      fail "rpc set_ana_state port:=1 group:=1 state=$state"; return 1
    fi
    echo "list_queues after the flip to $state:"; queue_summary
  }
  start_target || return 0
  boot_guest "$VM_DIR/guest/ana.sh" "vmlab.env.ANA_FIO_RUNTIME=${ANA_FIO_RUNTIME:-45}"
  serve_guest
  check_guest
  check_target_after
}

# Namespace reservations between two hosts: the guest (nvme-cli resv-*, guest/resv.sh) and
# `qpath resv` here with another Host Identifier (RESV_HOSTID), each call one connection.
# The namespace is a file with a ptpl_file, so the reservation the guest takes with CPTPL on
# must survive a kill -9 and restart of the target (QPATH-ASK resv-restart-HOSTID).
RESV_HOSTID=51515151-5151-5151-5151-515151515151
scenario_resv() {
  local img=$D/resv-ns1.img
  RESV_PTPL=$D/resv-ns1.ptpl
  file_target_toml "$D/resv.toml" "$img" "ptpl_file = \"$RESV_PTPL\""
  resv_host() {    # qpath resv ARGS... as the second host; its output on stdout
    ip netns exec "$VMLAB_NETNS" timeout 60 "$QPATH_BIN" resv -a "$VMLAB_HOST_IP" -s 4420 \
      -n "$QPATH_NQN" --hostid "$RESV_HOSTID" "$@" 2>&1
  }
  resv_ok() {      # WHAT ARGS...: the call must succeed
    local what=$1 out rc; shift
    out=$(resv_host "$@"); rc=$?
    printf '%s\n' "$out" | sed 's/^/  qpath resv: /'
    if [ $rc = 0 ]; then pass "qpath resv $*: $what"; else fail "qpath resv $*: exit $rc ($what)"; return 1; fi
  }
  resv_report() {  # WHAT RTYPE HOLDER_HOSTID32 HOLDER_RKEY: --json report; the holder entry matches
    local out rc
    out=$(resv_host --json report); rc=$?
    printf '%s\n' "$out" | sed 's/^/  qpath resv --json report: /'
    if [ $rc = 0 ] && printf '%s' "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
rtype, hostid, rkey = int(sys.argv[1]), sys.argv[2], int(sys.argv[3], 0)
held = [e for e in r["regctlext"] if e["rcsts"] & 1]
ok = r["rtype"] == rtype and len(held) == 1 and held[0]["hostid"] == hostid and held[0]["rkey"] == rkey
sys.exit(0 if ok else 1)' "$2" "$3" "$4"; then
      pass "qpath resv --json report ($1): rtype $2, the holder is $3 with key $4"
    else
      fail "qpath resv --json report ($1): exit $rc; want rtype $2 and one holder entry (rcsts 1) hostid $3 rkey $4"
      return 1
    fi
  }
  resv_foreign() { # WHEN GUEST_HOSTID32 GUEST_RKEY: the guest holds Write Exclusive with that key
    local out rc bad=0 me=${RESV_HOSTID//-/}
    out=$(resv_host write --slba 8); rc=$?
    printf '%s\n' "$out" | sed 's/^/  qpath resv write: /'
    if [ $rc != 0 ] && printf '%s' "$out" | grep -q RESERVATION_CONFLICT; then
      pass "qpath resv write (host $me) under the guest's Write Exclusive ($1): refused, RESERVATION_CONFLICT"
    else
      fail "qpath resv write (host $me) under the guest's Write Exclusive ($1): exit $rc, want RESERVATION_CONFLICT"; bad=1
    fi
    resv_ok "a read under Write Exclusive is allowed ($1)" read --slba 8 || bad=1
    resv_report "guest holds, $1" 1 "$2" "$3" || bad=1
    return $bad
  }
  ptpl_file_check() {  # WHAT RTYPE HOLDER_HOSTID32|none RKEY|none: what $RESV_PTPL holds
    local out
    out=$(cat "$RESV_PTPL" 2>&1)
    printf '%s\n' "$out" | sed 's/^/  ptpl_file: /'
    if printf '%s' "$out" | python3 -c '
import json, sys
f = json.loads(sys.stdin.read())
rtype, holder, rkey = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if holder == "none":
    ok = f["ptpl"] and f["rtype"] == 0 and f["holder"] is None and f["registrants"] == []
else:
    ok = (f["ptpl"] and f["rtype"] == rtype and f["holder"] == holder
          and f["registrants"] == [{"hostid": holder, "rkey": int(rkey, 0)}])
sys.exit(0 if ok else 1)' "$2" "$3" "$4"; then
      pass "ptpl_file $RESV_PTPL ($1): ptpl on, rtype $2, holder $3, key $4"
    else
      fail "ptpl_file $RESV_PTPL ($1): want ptpl on, rtype $2, holder $3 as the only registrant with key $4"
      return 1
    fi
  }
  resv_restart() {     # GUEST_HOSTID32: kill -9 the target, check the file, start it again
    local old=$TARGET_QPATH_PID wrapper=$TARGET_PID i out bad=0
    kill -KILL "$old"
    for i in $(seq 100); do kill -0 "$wrapper" 2>/dev/null || break; sleep 0.1; done
    wait "$wrapper" 2>/dev/null || true
    if kill -0 "$old" 2>/dev/null; then fail "qpath target pid $old survived kill -9"; return 1; fi
    pass "qpath target pid $old killed with SIGKILL"
    ptpl_file_check "at the crash" 1 "$1" 0xabc2 || bad=1
    start_target --config "$D/resv.toml" || return 1
    pass "qpath target restarted with the same config (pid $TARGET_QPATH_PID)"
    out=$(rpc get_reservation nqn="$QPATH_NQN" nsid:=1 2>&1)
    echo "  rpc get_reservation after the restart: $out"
    if printf '%s' "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
ok = r["rtype"] == 1 and r["registrants"] == [{"hostid": sys.argv[1], "rkey": 0xabc2, "holds": True}]
sys.exit(0 if ok else 1)' "$1"; then
      pass "rpc get_reservation after the restart: rtype 1, the guest ($1) holds with key 0xabc2"
    else
      fail "rpc get_reservation after the restart: want rtype 1 and the guest ($1) holding with key 0xabc2"; bad=1
    fi
    return $bad
  }
  on_ask() {
    local bad=0 me=${RESV_HOSTID//-/}
    case "$1" in
      resv-restart-*)
        resv_restart "${1#resv-restart-}" ;;
      resv-foreign-after-restart-*)   # the guest holds Write Exclusive with key 0xabc2 (PTPL)
        resv_foreign "after the restart" "${1#resv-foreign-after-restart-}" 0xabc2 ;;
      resv-foreign-*)    # the guest holds Write Exclusive with key 0xabc1
        resv_foreign "before the preempt" "${1#resv-foreign-}" 0xabc1 ;;
      resv-preempt)
        resv_ok "register the host's key" register --nrkey 0x5151 --rrega 0 || bad=1
        resv_ok "preempt the guest's key, taking Exclusive Access" \
          acquire --crkey 0x5151 --prkey 0xabc1 --rtype 2 --racqa 1 || bad=1
        resv_report "after the preempt" 2 "$me" 0x5151 || bad=1
        return $bad ;;
      resv-clear)
        resv_ok "clear every registration and the reservation" release --crkey 0x5151 --rrela 1 ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  start_target --config "$D/resv.toml" || return 0
  boot_guest "$VM_DIR/guest/resv.sh"
  serve_guest
  check_guest
  check_target_after
  # the guest's release and unregister were written through as well
  ptpl_file_check "after the guest released and unregistered" 0 none none
  rm -f "$img"
}

# A namespace resized while the kernel host is connected: the embedded default's 1 GiB RAM
# namespace grows to 1.5 GiB when the guest asks (QPATH-ASK resize-grow).
RESIZE_OLD=$((1 << 30)) RESIZE_NEW=$((3 << 29))
scenario_resize() {
  on_ask() {
    [ "$1" = resize-grow ] || { fail "unexpected request from the guest: $1"; return 1; }
    local out
    if out=$(rpc resize_namespace nqn="$QPATH_NQN" nsid=1 size=$RESIZE_NEW 2>&1); then
      pass "rpc resize_namespace nqn=$QPATH_NQN nsid=1 size=$RESIZE_NEW: $out"
    else
      fail "rpc resize_namespace nqn=$QPATH_NQN nsid=1 size=$RESIZE_NEW: $out"; return 1
    fi
    echo "list_subsystems after the resize:"
    rpc list_subsystems | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    for n in s["namespaces"]:
        print("  %s nsid %s: %s bytes" % (s["nqn"], n["nsid"], n["size"]))' || echo "  (list_subsystems failed)"
  }
  start_target || return 0
  boot_guest "$VM_DIR/guest/resize.sh" "vmlab.env.OLD_BYTES=$RESIZE_OLD" "vmlab.env.NEW_BYTES=$RESIZE_NEW" \
    "vmlab.env.RESIZE_WAIT=${RESIZE_WAIT:-30}"
  serve_guest
  check_guest
  check_target_after
}

scenario_durability() {
  QPATH_NQN=nqn.2026-11.io.qpath:durable
  local img=$D/ns1.img img2=$D/ns2.img dur_mb=64
  file_target_toml "$D/durable.toml" "$img"
  GUEST_HOSTNQN=
  on_ask() {
    case "$1" in
      persist-changes) persist_changes ;;
      restart-target) restart_target ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  # The operator's changes, over RPC, that the restart must keep (--persist saves each one
  # before it answers): the guest's host NQN allowed by name and no other host (so the
  # guest gets back in only if that was saved), and a second file namespace.
  persist_changes() {
    local out
    GUEST_HOSTNQN=$(rpc_json list_controllers '{}' | python3 -c '
import json, sys
print(next(c["hostnqn"] for c in json.load(sys.stdin) if c["subnqn"] == sys.argv[1]))' "$QPATH_NQN") \
      || { fail "no controller of the guest to take its host NQN from"; return 1; }
    for call in "add_host {\"nqn\": \"$QPATH_NQN\", \"host\": \"$GUEST_HOSTNQN\"}" \
        "set_allow_any_host {\"nqn\": \"$QPATH_NQN\", \"allow\": false}" \
        "add_namespace {\"nqn\": \"$QPATH_NQN\", \"nsid\": 2, \"backend\": \"file\", \"path\": \"$img2\", \"size\": \"64M\"}"; do
      if out=$(rpc_json "${call%% *}" "${call#* }" 2>&1); then pass "rpc $call: $out"
      else fail "rpc $call: $out"; return 1; fi
    done
    if grep -q "$GUEST_HOSTNQN" "$D/durable.toml" && grep -q "allow_any_host = false" "$D/durable.toml" \
        && grep -q "$img2" "$D/durable.toml" && [ -f "$D/durable.toml.bak" ]; then
      pass "--persist: durable.toml holds the host, allow_any_host = false and namespace 2; the previous file kept as .bak"
    else
      fail "--persist: durable.toml lacks the changes:"; cat "$D/durable.toml"; return 1
    fi
  }
  restart_target() {
    local old=$TARGET_QPATH_PID wrapper=$TARGET_PID i
    kill -KILL "$old"
    for i in $(seq 100); do kill -0 "$wrapper" 2>/dev/null || break; sleep 0.1; done
    wait "$wrapper" 2>/dev/null || true
    if kill -0 "$old" 2>/dev/null; then fail "qpath target pid $old survived kill -9"; return 1; fi
    pass "qpath target pid $old killed with SIGKILL"
    start_target --config "$D/durable.toml" --persist || return 1
    pass "qpath target restarted with the same command line (pid $TARGET_QPATH_PID)"
    local subs
    subs=$(rpc_json list_subsystems '{}')
    if printf '%s' "$subs" | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]
ok = s["allow_any_host"] is False and s["hosts"] == [sys.argv[1]] and [n["nsid"] for n in s["namespaces"]] == [1, 2]
sys.exit(0 if ok else 1)' "$GUEST_HOSTNQN"; then
      pass "after kill -9 and the restart: only the guest's host NQN allowed, namespaces 1 and 2"
    else
      fail "after the restart the target runs something else: $subs"; return 1
    fi
  }
  start_target --config "$D/durable.toml" --persist || return 0
  boot_guest "$VM_DIR/guest/durability.sh" "vmlab.env.DUR_MB=$dur_mb"
  serve_guest
  check_guest
  check_target_after
  # the bytes the guest read back are the bytes in the file on this side
  local guest_md5 file_md5
  guest_md5=$(grep -ao 'md5 after the restart: [0-9a-f]*' "$SERIAL" | tail -1 | awk '{print $NF}')
  file_md5=$(dd if="$img" bs=1M count=$dur_mb 2>/dev/null | md5sum | cut -d' ' -f1)
  if [ -n "$guest_md5" ] && [ "$guest_md5" = "$file_md5" ]; then
    pass "backing file's first $dur_mb MiB have the md5 the guest read ($file_md5)"
  else
    fail "backing file md5 $file_md5, guest read ${guest_md5:-nothing}"
  fi
  # The zone the guest deallocated and zeroed ranges of (durability.sh: ZONE_MB after DUR_MB).
  local zone_mb=16 size
  guest_md5=$(grep -ao 'md5 of the zone after the restart: [0-9a-f]*' "$SERIAL" | tail -1 | awk '{print $NF}')
  file_md5=$(dd if="$img" bs=1M skip=$dur_mb count=$zone_mb 2>/dev/null | md5sum | cut -d' ' -f1)
  if [ -n "$guest_md5" ] && [ "$guest_md5" = "$file_md5" ]; then
    pass "backing file's zone ($zone_mb MiB at $dur_mb MiB) has the md5 the guest read ($file_md5)"
  else
    fail "backing file zone md5 $file_md5, guest read ${guest_md5:-nothing}"
  fi
  size=$(stat -c %s "$img")
  [ "$size" = $((256 << 20)) ] && pass "backing file still 256 MiB after kill -9, deallocations and zeroes" \
    || fail "backing file is $size bytes, was 256 MiB"
  # Deallocated ranges gave their space back: holes in the file (blkdiscard x2, nvme dsm x3,
  # write-zeroes --deac), as offset:length from the zone's start.
  if python3 - "$img" $((dur_mb << 20)) 1048576:262144 3145728:1048576 5242880:65536 7344128:131072 \
      9437184:524288 13631488:65536 <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
zone, bad = int(sys.argv[2]), []
for r in sys.argv[3:]:
    off, ln = (int(x) for x in r.split(':'))
    off += zone
    try:
        nxt = os.lseek(fd, off, os.SEEK_DATA)
    except OSError:
        nxt = os.fstat(fd).st_size  # ENXIO: no data after off
    if os.lseek(fd, off, os.SEEK_HOLE) != off or nxt < off + ln:
        bad.append(r)
print("ranges that are not holes:", bad or "none")
sys.exit(1 if bad else 0)
PY
  then pass "backing file: every deallocated range is a hole (its space was returned)"
  else fail "backing file: a deallocated range still holds data blocks"
  fi
  rm -f "$img" "$img2"
}

# The differential conformance suite: the guest runs the same nvme-cli commands against its
# own kernel's nvmet (file namespaces on tmpfs, 4 KiB blocks) and against qpath target (file
# namespaces of the same size and block size, here); the outputs come back through a 9p share
# and tests/vm/conformance.py compares them, command by command and field by field.
scenario_conformance() {
  QPATH_NQN=nqn.2026-11.io.qpath:conformance
  local mb=64 share=$D/share
  mkdir -p "$share"
  cat > "$D/conformance.toml" <<EOF
# written by tests/vm/run.sh conformance
[[port]]
id = 1
addr = "$VMLAB_HOST_IP:4420"
[[port]]
id = 2
addr = "$VMLAB_HOST_IP:4421"
[[subsystem]]
nqn = "$QPATH_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "$D/ns1.img"
size = "${mb}M"
block_size = 4096
[[subsystem.namespace]]
nsid = 2
backend = "file"
path = "$D/ns2.img"
size = "${mb}M"
block_size = 4096
EOF
  start_target --config "$D/conformance.toml" || return 0
  GUEST_SHARE=$share boot_guest "$VM_DIR/guest/conformance.sh" "vmlab.env.NS_MB=$mb"
  serve_guest
  check_guest
  if python3 "$VM_DIR/conformance.py" --kernel "$(kver)" --markdown "$D/conformance.md" "$share"; then
    pass "conformance: every difference from Linux $(kver) nvmet is explained (table: $D/conformance.md)"
  else
    fail "conformance: differences from Linux $(kver) nvmet that no rule explains (table: $D/conformance.md)"
  fi
  check_target_after
  rm -f "$D/ns1.img" "$D/ns2.img"
}

# Issue #4 acceptance 5: the kernel's queue-depth iopolicy avoids the delayed path.
scenario_qdpolicy() {
  local delay=${QD_DELAY_US:-2000}
  on_ask() {   # counters-POLICY: the target's own per-queue counts, cumulative, after each fio run
    case "$1" in counters-*) ;; *) fail "unexpected request from the guest: $1"; return 1 ;; esac
    echo "target-side per-queue counters after ${1#counters-} (port 1 delayed, cumulative):"; queue_summary
  }
  start_target || return 0
  if rpc set_port_fault port:=1 delay_us:="$delay" > /dev/null; then
    pass "rpc set_port_fault port:=1 delay_us:=$delay (every I/O command on port 1 completes $delay us later)"
  else
    fail "rpc set_port_fault port:=1 delay_us:=$delay"; return 0
  fi
  boot_guest "$VM_DIR/guest/qdpolicy.sh" "vmlab.env.QD_RUNTIME=${QD_RUNTIME:-20}" \
    "vmlab.env.QD_DELAY_US=$delay" "vmlab.env.QD_MIN_SHARE=${QD_MIN_SHARE:-55}" \
    "vmlab.env.QD_IODEPTH=${QD_IODEPTH:-16}"
  serve_guest
  check_guest
  grep -a '^QDPOLICY' "$SERIAL" | sed 's/^/  guest /'
  check_target_after
}

# Issue #3 acceptance 1: our host (qpath discover / connect / bench, in netns vmlab) against
# the guest kernel's nvmet-tcp (vmlab's guest/target-serve.sh: a 256 MiB brd namespace on
# ports 4420 and 4421). No qpath target runs in this scenario.
scenario_nvmet() {
  QPATH_NQN=nqn.2026-11.io.qpath:linux-nvmet
  local g=$VMLAB_GUEST_IP i out json rc port
  boot_guest "$VMLAB_DIR/guest/target-serve.sh" "vmlab.env.SERVE_SECONDS=$((BOOT_TIMEOUT - 60))"
  for i in $(seq "$BOOT_TIMEOUT"); do
    grep -aq VMLAB-READY-FOR-HOST "$SERIAL" 2>/dev/null && break
    kill -0 "$BOOT_PID" 2>/dev/null || break
    sleep 1
  done
  if ! grep -aq VMLAB-READY-FOR-HOST "$SERIAL" 2>/dev/null; then
    fail "the guest's nvmet target never became ready (serial log: $SERIAL)"; return 0
  fi
  pass "Linux $(kver) nvmet-tcp serves $QPATH_NQN on $g:4420 and :4421"
  on_host() { ip netns exec "$VMLAB_NETNS" timeout 300 "$QPATH_BIN" "$@"; }

  # Linux nvmet's discovery log lists the (subsystem, port) pairs of the port it is read through.
  for port in 4420 4421; do
    out=$(on_host discover -a "$g" -s $port 2>&1); rc=$?
    echo "$out" | grep -E 'subnqn|trsvcid|Records' | sed "s/^/  discover $port: /"
    if [ $rc = 0 ] && echo "$out" | grep -A3 "trsvcid: $port" | grep -q "subnqn:  $QPATH_NQN"; then
      pass "qpath discover $g:$port lists $QPATH_NQN on port $port"
    else
      fail "qpath discover $g:$port: exit $rc, or the log lacks ($QPATH_NQN, $port)"
    fi
  done
  for port in 4420 4421; do
    out=$(on_host connect -a "$g" -s $port -n "$QPATH_NQN" 2>&1); rc=$?
    echo "$out" | sed "s/^/  connect $port: /"
    if [ $rc = 0 ]; then pass "qpath connect $g:$port $QPATH_NQN (identify, namespaces, disconnect)"
    else fail "qpath connect $g:$port: exit $rc"; fi
  done

  # Writes with crc32c verify through each path, and once with header and data digests
  # (128k writes are larger than nvmet's in-capsule data: R2T + H2CData).
  local base="nvme+tcp://$g"
  cat > "$D/nvmet.fio" <<EOF
[global]
ioengine=qpath
direct=1
verify=crc32c
size=48m

[randwrite-4420]
filename=$base:4420/$QPATH_NQN/1
rw=randwrite
bs=4k
iodepth=16
offset=0

[randwrite-4421]
filename=$base:4421/$QPATH_NQN/1
rw=randwrite
bs=4k
iodepth=16
offset=64m

[write-128k-digests]
filename=$base:4420/$QPATH_NQN/1?hdgst=1&ddgst=1
rw=write
bs=128k
iodepth=4
offset=128m
EOF
  json=$D/nvmet-bench.json
  on_host bench "$D/nvmet.fio" --no-baseline --output-format=json --output "$json" > "$D/bench.out" 2>&1; rc=$?
  sed 's/^/  bench: /' "$D/bench.out" | head -20
  if [ $rc = 0 ] && python3 "$VM_DIR/bench-check.py" "$json" 3; then
    pass "qpath bench: 4k randwrite on each path and 128k write with digests, verify=crc32c: zero errors, every written byte read back and checked"
  else
    fail "qpath bench against nvmet: exit $rc, or a job with errors or without read-back (report: $json)"
  fi
  reply_guest "done"
  for i in $(seq 120); do kill -0 "$BOOT_PID" 2>/dev/null || break; sleep 0.5; done
  BOOT_RC=0; wait "$BOOT_PID" || BOOT_RC=$?
  if [ "$BOOT_RC" = 0 ]; then pass "guest target stopped cleanly"; else fail "guest exit $BOOT_RC"; fi
}

# Issue #4 acceptance 3c: path flaps against Linux nvmet. The guest (guest/nvmet-flaps.sh)
# serves a brd namespace on ports 4420 and 4421 and takes "down N" / "up N" on TCP 5600;
# `qpath lab flaps --mode nvmet` (in netns vmlab) writes through both paths, sends those
# commands on its schedule, reads everything back and reports; no qpath target runs here.
scenario_flaps() {
  QPATH_NQN=nqn.2026-11.io.qpath:flaps
  local g=$VMLAB_GUEST_IP i rc json=$D/flaps.json runtime=${FLAPS_RUNTIME:-120}
  boot_guest "$VM_DIR/guest/nvmet-flaps.sh" "vmlab.env.SERVE_SECONDS=$((BOOT_TIMEOUT - 60))" \
    "vmlab.env.NS_SIZE_MB=256" "vmlab.env.FLAP_PORT=5600"
  for i in $(seq "$BOOT_TIMEOUT"); do
    grep -aq VMLAB-READY-FOR-HOST "$SERIAL" 2>/dev/null && break
    kill -0 "$BOOT_PID" 2>/dev/null || break
    sleep 1
  done
  if ! grep -aq VMLAB-READY-FOR-HOST "$SERIAL" 2>/dev/null; then
    fail "the guest's nvmet target never became ready (serial log: $SERIAL)"; return 0
  fi
  pass "Linux $(kver) nvmet-tcp serves $QPATH_NQN on $g:4420 and :4421"
  say "qpath lab flaps --mode nvmet: $runtime s of writes, ${FLAPS_DOWN:-5} s down every ${FLAPS_PERIOD:-10} s"
  ip netns exec "$VMLAB_NETNS" timeout $((runtime * 3 + 600)) "$QPATH_BIN" lab flaps --mode nvmet \
    --path "$g:4420" --path "$g:4421" --nqn "$QPATH_NQN" --control "$g:5600" --size-mib 256 \
    --runtime "$runtime" --down "${FLAPS_DOWN:-5}" --period "${FLAPS_PERIOD:-10}" \
    --json --output "$json" --plot "$D/flaps.svg" > "$D/flaps.out" 2>&1; rc=$?
  grep -E 'WARN|ERROR' "$D/flaps.out" | head -20 | sed 's/^/  lab: /'
  if [ -s "$json" ] && python3 "$VM_DIR/flaps-check.py" "$json"; then
    pass "qpath lab flaps --mode nvmet: zero I/O errors, zero verify failures, every outage run, both paths reconnected and used (report: $json)"
  else
    fail "qpath lab flaps --mode nvmet: errors, verify failures, a failed flap or a path never back (report: $json, log: $D/flaps.out)"
  fi
  [ "$rc" = 0 ] || fail "qpath lab flaps exited $rc (log: $D/flaps.out)"
  ip netns exec "$VMLAB_NETNS" timeout 30 python3 - "$g" <<'EOF' || fail "could not send 'done' to the guest's flap control"
import socket, sys, time
for attempt in range(40):
    try:
        s = socket.create_connection((sys.argv[1], 5600), timeout=5)
        s.sendall(b"done\n"); s.close(); sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit(1)
EOF
  for i in $(seq 120); do kill -0 "$BOOT_PID" 2>/dev/null || break; sleep 0.5; done
  BOOT_RC=0; wait "$BOOT_PID" || BOOT_RC=$?
  check_guest
}

# ---- the host as a block device (ublk, NBD) ---------------------------------------------
# Tools the guest gets for these scenarios (with their libraries): ext4 tools, fstrim,
# filefrag, the NBD client, strace, util-linux blkdiscard (-z: write zeroes).
BLOCKDEV_TOOLS="/usr/sbin/mkfs.ext4 /usr/sbin/fstrim /usr/sbin/filefrag /usr/sbin/nbd-client /usr/bin/strace
  /usr/sbin/blkdiscard /usr/sbin/blockdev"

dir_ios() {    # DIR: commands of that direction the target counted, all ports (trim: Deallocate, sync: Flush)
  rpc stats | python3 -c 'import json,sys; print(sum(p["dirs"][sys.argv[1]]["ios"] for p in json.load(sys.stdin)["ports"]))' "$1"
}
trim_ios() { dir_ios trim; }
# A background loop that takes port 1 down (connections dropped, connects refused) for
# FLAP_DOWN s every FLAP_PERIOD s until $D/flap.stop appears (at most 60 flaps).
start_flapper() {
  rm -f "$D/flap.stop" "$D/flap.count"
  (
    n=0
    while [ ! -f "$D/flap.stop" ] && [ $n -lt 60 ]; do
      sleep "$((FLAP_PERIOD - FLAP_DOWN))"
      [ -f "$D/flap.stop" ] && break
      rpc set_port_fault port:=1 refuse_connects:=true drop_connections:=true > /dev/null
      n=$((n + 1)); echo $n > "$D/flap.count"
      echo "flap $n: port 1 down $(date +%T)"
      sleep "$FLAP_DOWN"
      rpc set_port_fault port:=1 refuse_connects:=false > /dev/null
      echo "flap $n: port 1 up $(date +%T)"
    done
  ) >> "$D/flaps.log" 2>&1 &
  FLAPPER_PID=$!
  STARTED+=("$FLAPPER_PID")
}
stop_flapper() {
  touch "$D/flap.stop"
  local i
  for i in $(seq 200); do kill -0 "$FLAPPER_PID" 2>/dev/null || break; sleep 0.1; done
  rpc set_port_fault port:=1 refuse_connects:=false > /dev/null
  cat "$D/flaps.log"
  local n; n=$(cat "$D/flap.count" 2>/dev/null || echo 0)
  if [ "$n" -ge 2 ]; then pass "port 1 flapped $n times ($FLAP_DOWN s down every $FLAP_PERIOD s) during fio"
  else fail "port 1 flapped only $n times during fio"; return 1; fi
}
FLAP_PERIOD=${FLAP_PERIOD:-10}
FLAP_DOWN=${FLAP_DOWN:-5}
restart_target_same() {   # CONFIG: kill -9 the target and start it again with CONFIG
  local old=$TARGET_QPATH_PID wrapper=$TARGET_PID i
  kill -KILL "$old"
  for i in $(seq 100); do kill -0 "$wrapper" 2>/dev/null || break; sleep 0.1; done
  wait "$wrapper" 2>/dev/null || true
  if kill -0 "$old" 2>/dev/null; then fail "qpath target pid $old survived kill -9"; return 1; fi
  pass "qpath target pid $old killed with SIGKILL"
  sleep 2
  start_target --config "$1" || return 1
  pass "qpath target restarted with the same config (pid $TARGET_QPATH_PID)"
}

# The host's side of the ublk checks (and the flaps of nbd's): the guest's QPATH-ASKs.
ublk_on_ask() {
    case "$1" in
      trim-before) TRIM_BEFORE=$(trim_ios); echo "target trim commands before fstrim: $TRIM_BEFORE" ;;
      trim-after)
        local i now
        for i in $(seq 20); do now=$(trim_ios); [ "$now" -gt "$TRIM_BEFORE" ] && break; sleep 0.5; done
        echo "target trim commands after fstrim: $now"
        if [ "$now" -gt "$TRIM_BEFORE" ]; then pass "fstrim reached the target: $((now - TRIM_BEFORE)) Deallocate commands"
        else fail "the target counted no Deallocate after fstrim"; return 1; fi ;;
      flush-before) FLUSH_BEFORE=$(dir_ios sync); echo "target flush commands before fsync: $FLUSH_BEFORE" ;;
      flush-after)
        local j n
        for j in $(seq 20); do n=$(dir_ios sync); [ "$n" -gt "$FLUSH_BEFORE" ] && break; sleep 0.5; done
        echo "target flush commands after fsync: $n"
        if [ "$n" -gt "$FLUSH_BEFORE" ]; then pass "fsync reached the target: $((n - FLUSH_BEFORE)) Flush commands"
        else fail "the target counted no Flush after fsync"; return 1; fi ;;
      flap-start) start_flapper ;;
      flap-stop) stop_flapper ;;
      restart-target) restart_target_same "$D/ublk.toml" ;;
      port1-down) rpc set_port_fault port:=1 refuse_connects:=true drop_connections:=true > /dev/null ;;
      port1-up) rpc set_port_fault port:=1 refuse_connects:=false > /dev/null ;;
      ublk-grow) ublk_resize "$UBLK_GROWN" ;;
      ublk-shrink) ublk_resize "$UBLK_SIZE" ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
}
# The ublk part's namespace (file_target_toml's 256 MiB) and the size it grows to.
UBLK_SIZE=$((256 << 20)) UBLK_GROWN=$((320 << 20))
ublk_resize() {   # BYTES: resize_namespace of namespace 1 while /dev/ublkb0 serves it
  local out
  if out=$(rpc resize_namespace nqn="$QPATH_NQN" nsid=1 size="$1" 2>&1); then
    pass "rpc resize_namespace nqn=$QPATH_NQN nsid=1 size=$1 under /dev/ublkb0: $out"
  else
    fail "rpc resize_namespace nqn=$QPATH_NQN nsid=1 size=$1: $out"; return 1
  fi
}

scenario_ublk() {
  local img=$D/ublk-ns1.img
  file_target_toml "$D/ublk.toml" "$img"
  on_ask() { ublk_on_ask "$@"; }
  start_target --config "$D/ublk.toml" || return 0
  guest_payload $BLOCKDEV_TOOLS
  boot_guest "$VM_DIR/guest/ublk.sh" "vmlab.env.UBLK_FIO_RUNTIME=${UBLK_FIO_RUNTIME:-30}" \
    "vmlab.env.PORT1=4420" "vmlab.env.PORT2=4421" "vmlab.env.UBLK_SIZE=$UBLK_SIZE" "vmlab.env.UBLK_GROWN=$UBLK_GROWN"
  serve_guest
  check_guest
  grep -aE '^(UBLK|BENCH)-SYSCALLS|^SYSCALLS-PER-(IO|BATCH)' "$SERIAL" | sed 's/^/  guest /'
  check_target_after
  rm -f "$img"
}

scenario_nbd() {
  local img=$D/nbd-ns1.img
  file_target_toml "$D/nbd.toml" "$img"
  on_ask() {
    case "$1" in
      flap-start) start_flapper ;;
      flap-stop) stop_flapper ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  start_target --config "$D/nbd.toml" || return 0
  guest_payload $BLOCKDEV_TOOLS
  boot_guest "$VM_DIR/guest/nbd.sh" "vmlab.env.NBD_FIO_RUNTIME=${NBD_FIO_RUNTIME:-30}"
  serve_guest
  check_guest
  check_target_after
  rm -f "$img"
}

# Our host as a block device on the guest's own Linux nvmet (no qpath target runs here).
scenario_ublk-nvmet() {
  QPATH_NQN=nqn.2026-11.io.qpath:ublk-nvmet
  guest_payload $BLOCKDEV_TOOLS
  boot_guest "$VM_DIR/guest/ublk-nvmet.sh" "vmlab.env.UBLK_FIO_RUNTIME=${UBLK_FIO_RUNTIME:-20}"
  serve_guest
  check_guest
}

# The three above in one boot (what CI runs: one boot instead of three saves about 50 s):
# guest/blockdev.sh runs ublk.sh, nbd.sh and ublk-nvmet.sh one after the other. The guest's
# nvmet serves the target's NQN on its own loopback, so nothing is shared with the target here.
scenario_blockdev() {
  local img=$D/ublk-ns1.img part
  file_target_toml "$D/ublk.toml" "$img"
  on_ask() { ublk_on_ask "$@"; }
  start_target --config "$D/ublk.toml" || return 0
  guest_payload $BLOCKDEV_TOOLS
  for part in ublk nbd ublk-nvmet; do GUEST_FILES+=(--file "$VM_DIR/guest/$part.sh:/vmlab/part-$part.sh"); done
  boot_guest "$VM_DIR/guest/blockdev.sh" "vmlab.env.UBLK_FIO_RUNTIME=${UBLK_FIO_RUNTIME:-30}" \
    "vmlab.env.NBD_FIO_RUNTIME=${NBD_FIO_RUNTIME:-30}" "vmlab.env.UBLK_NVMET_FIO_RUNTIME=${UBLK_NVMET_FIO_RUNTIME:-20}" \
    "vmlab.env.PORT1=4420" "vmlab.env.PORT2=4421" "vmlab.env.UBLK_SIZE=$UBLK_SIZE" "vmlab.env.UBLK_GROWN=$UBLK_GROWN"
  serve_guest
  check_guest
  grep -aE '^(UBLK|BENCH)-SYSCALLS|^SYSCALLS-PER-(IO|BATCH)' "$SERIAL" | sed 's/^/  guest /'
  check_target_after
  rm -f "$img"
}

# ---- --capture ------------------------------------------------------------------------
start_capture() {
  PCAP=$D/capture.pcap
  local i
  # -B: 64 MiB kernel buffer so the capture keeps up with bursts; -a filesize: a bound (kB)
  setsid timeout -k 5 $((BOOT_TIMEOUT + 300)) ip netns exec "$VMLAB_NETNS" tshark -q -n -i "$VMLAB_TAP" \
    -B 64 -f 'tcp port 4420 or tcp port 4421' -a filesize:4000000 -w "$PCAP" \
    > "$D/tshark.log" 2>&1 < /dev/null &
  TSHARK_PID=$!
  STARTED+=("$TSHARK_PID")
  for i in $(seq 100); do grep -q "Capturing on" "$D/tshark.log" 2>/dev/null && return 0; sleep 0.2; done
  fail "capture: tshark did not start capturing:"; cat "$D/tshark.log"
  return 1
}
check_capture() {
  local i
  sleep 1
  kill -INT "$TSHARK_PID" 2>/dev/null || true     # timeout passes SIGINT on to tshark
  for i in $(seq 100); do kill -0 "$TSHARK_PID" 2>/dev/null || break; sleep 0.2; done
  stop_group "$TSHARK_PID"
  say "capture: $(du -h "$PCAP" | cut -f1) in $PCAP ($(grep -E 'packets (captured|dropped)' "$D/tshark.log" \
    | tr '\n' ' ')); decoding"
  if "$VM_DIR/pcap-check.sh" --self-test; then pass "capture: pcap-check.sh self-test"
  else fail "capture: pcap-check.sh self-test (the check below could pass vacuously)"; fi
  local digests=
  [ "$SCENARIO" = interop ] && digests=--need-digests     # its second round uses -g -G
  if "$VM_DIR/pcap-check.sh" "$PCAP" $digests; then
    pass "capture: Wireshark's NVMe/TCP dissector: no malformed frame, expert error, unknown PDU or bad digest"
    [ "${QPATH_VM_KEEP_PCAP:-0}" = 1 ] || rm -f "$PCAP"
  else
    fail "capture: pcap-check.sh failed (capture kept: $PCAP)"
  fi
}

# ---- run ------------------------------------------------------------------------------
# From here on every check reports PASS/FAIL itself; one failed command must not end the run.
set +e
if [ "$CAPTURE" = 0 ] || start_capture; then
  "scenario_$SCENARIO"
  [ "$CAPTURE" = 1 ] && check_capture
fi
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
