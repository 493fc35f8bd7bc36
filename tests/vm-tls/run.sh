#!/usr/bin/env bash
# run.sh — NVMe/TCP over TLS 1.3 with Linux, in a vmlab QEMU guest (Linux 7.2, KERNEL=sid).
#
#   tests/vm-tls/run.sh [--kernel sid] [--hmac 1|2] [--identity 0|1] linux-host|linux-target|linux-concat|linux-target-concat|ktls
#
# --identity 0  linux-host: the guest's keyring holds the PSK under the older identity
#             (`NVMe0R0x <hostnqn> <subnqn>`, no digest: what Linux 6.7-6.13 present; 7.2
#             falls back to it), and every channel the target opens must show that identity.
# --hmac 2    the TLS key is of hash 02 (48 bytes, SHA-384: TLS_AES_256_GCM_SHA384) instead of
#             01. linux-host: the guest makes it (`nvme gen-tls-key --hmac=2`) and hands it to
#             the host through the 9p share before the target starts; the target's log must
#             show TLS_AES_256_GCM_SHA384 for every channel. linux-target: `qpath gen-tls-key
#             --hmac 2` makes it (and the wrong key), nvmet takes it from the keyring. ktls:
#             `qpath gen-tls-key --hmac 2` makes the key both ends in the guest use. The
#             concatenation scenarios use no configured key. Every capture is checked for the
#             suite its ServerHellos chose.
#
# linux-host  the guest's kernel NVMe/TCP host (tlshd from ktls-utils runs its handshakes;
#             sid's nvme-cli derives and inserts the PSK) reaches `qpath target`, whose two
#             ports require TLS, with a key from `qpath gen-tls-key`: discovery inside TLS,
#             both ports connected, fio randrw + 128k writes with crc32c verify, an ANA flip
#             (ana-inaccessible / ana-optimized), a target kill -9 and restart (reconnect over
#             TLS), disconnect-all (tests/vm-tls/guest/linux-host.sh). tshark records the tap
#             the whole time (both scenarios): every record must be TLS (handshake, then
#             application data) and no NVMe/TCP PDU may show in the clear.
# linux-target  `qpath` against the guest's kernel target (nvmet: addr_tsas tls1.3, addr_treq
#             required on 4420 and 4421; the PSK inserted with `nvme check-tls-key --insert`,
#             tlshd serving the handshakes): qpath connect --tls succeeds, a wrong key is
#             refused, and a two-path qpath bench job (randrw 4k, crc32c verify) keeps its data
#             while the guest takes port 4420's path away for 10 s and gives it back
#             (tests/vm-tls/guest/linux-target.sh).
# linux-concat  the guest's kernel host connects with secure channel concatenation (`nvme
#             connect --concat --dhchap-secret`, Linux 6.15+) to `qpath target`, whose port
#             takes both plaintext and TLS (tls = "allowed") and holds the host's DH-HMAC-CHAP
#             key (group ffdhe2048): the admin queue authenticates in plaintext, then the
#             admin and I/O queues come back inside TLS with the generated PSK; fio randrw
#             crc32c verify, a reconnect (a new PSK), a target kill -9 and restart, and
#             disconnect-all (tests/vm-tls/guest/linux-concat.sh). No capture check: the first
#             admin connection is plaintext by design.
# linux-target-concat  `qpath` connects with secure channel concatenation (a bench job's URI
#             `concat=1` with `dhchap_secret`, as `nvme connect --concat`) to the guest's kernel
#             target (nvmet: addr_tsas tls1.3, addr_treq "not required" on 4420 and 4421; the
#             host's DH-HMAC-CHAP key with hmac(sha256) and ffdhe2048; tlshd serving the
#             handshakes with the PSKs nvmet generates): a two-path bench job (randrw 4k, crc32c
#             verify) whose controllers authenticate in plaintext, then run every queue inside
#             TLS with the generated PSK; the guest takes port 4420 away for 8 s, the host
#             reconnects and concatenates again (a new NVMe1G key), and the job ends with its
#             data verified (tests/vm-tls/guest/linux-target-concat.sh). No capture check: the
#             first admin connection is plaintext by design.
# ktls        kernel TLS on qpath's side: `qpath target` runs in the guest (shipped with its
#             libraries, and dumpcap for a capture of the guest's loopback), whose kernel
#             has the "tls" ULP (modprobe tls); its TLS port's connections hand their records
#             to the kernel after the handshake. The guest's Linux host (tlshd, nvme-cli)
#             connects and runs fio crc32c verify, then `qpath bench` in the guest runs a
#             verified TLS job; list_queues says tls1.3-kernel for every queue, the bench's
#             host log says its queues handed their records over, and the capture (written
#             to the host through 9p) holds only TLS records (tests/vm-tls/guest/ktls.sh).
#             About 80 s once the VM lock is taken; pass --kernel sid (the vmlab default
#             kernel, bookworm's 6.1, has no NVMe/TCP TLS).
# The guest's tools come from Debian sid (tests/vm-tls/guest-tools.sh: tlshd, nvme-cli 2.x,
# keyctl and their libraries, run in the guest through sid's loader); the kernel's TLS needs
# gcm(aes), whose modules (ctr, gcm) the vmlab initramfs lacks: they come from the same
# kernel package. The helpers are tests/vm/lib.sh's. Measured on the 2-core machine (with
# other guests running): linux-host about 2 min, linux-target about 5 min once the VM
# lock is taken, most of it tshark reading the capture. Environment: KERNEL (sid), QPATH_BIN (default: cargo build --release),
# VMLAB_DIR, VMLAB_WORK. Exit status: 0 passed, 1 failed, 77 cannot run here ("SKIP: reason").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/vm/lib.sh
. "$HERE/../vm/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) KERNEL=$2; shift ;;
    --hmac) TLS_HMAC=$2; shift ;;
    --identity) TLS_IDENTITY=$2; shift ;;
    -h|--help) sed -n '2,/^# VMLAB_DIR/p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
SCENARIO=${1:-}
case "$SCENARIO" in
  linux-host|linux-target|linux-concat|linux-target-concat|ktls) ;;
  *) echo "usage: $0 [--kernel sid] linux-host|linux-target|linux-concat|linux-target-concat|ktls" >&2; exit 2 ;;
esac
TLS_HMAC=${TLS_HMAC:-1}
case "$TLS_HMAC" in 1|2) ;; *) echo "--hmac is 1 or 2" >&2; exit 2 ;; esac
# The TLS PSK identity the guest's kernel host presents (linux-host): 1 (with the PSK's
# digest, Linux 6.14+) or 0 (Linux 6.7-6.13's; a newer kernel falls back to it when the
# keyring holds only that identity).
TLS_IDENTITY=${TLS_IDENTITY:-1}
case "$TLS_IDENTITY" in 0|1) ;; *) echo "--identity is 0 or 1" >&2; exit 2 ;; esac
export KERNEL=${KERNEL:-sid}
case "$KERNEL" in
  bookworm) skip "KERNEL=bookworm is Linux 6.1: no NVMe/TCP TLS (6.7+ has it)" ;;
esac
require_vm_host xz tshark
grep -q '^CONFIG_NVME_TCP_TLS=y' "$(kdir)"/root/*/lib/modules/*/config "$(kdir)"/root/boot/config-* 2> /dev/null \
  || skip "the KERNEL=$KERNEL image has no NVMe/TCP TLS (CONFIG_NVME_TCP_TLS)"
TOOLS=$(VMLAB_DIR=$VMLAB_DIR "$HERE/guest-tools.sh" | tail -1) || skip "guest TLS tools: $TOOLS"
[ -s "$TOOLS" ] || skip "guest TLS tools were not made"

resolve_qpath_bin
begin_vm_run "qpath-vm-tls-$SCENARIO-$KERNEL-hmac$TLS_HMAC-id$TLS_IDENTITY" 900

HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:3c1d7a52-6b2e-4f0a-9d11-5e2a7b8c9d01
QPATH_NQN=nqn.2026-11.io.qpath:tls

# A fresh key for this run, in a file only root reads; the target and the guest read it
# from their files (never from a command line or a log).
umask 077
"$QPATH_BIN" gen-tls-key --hmac "$TLS_HMAC" > "$D/tls.key"
cat > "$D/target.toml" <<TOML
[[port]]
id = 1
addr = "$VMLAB_HOST_IP:4420"
tls = "required"

[[port]]
id = 2
addr = "$VMLAB_HOST_IP:4421"
tls = "required"

[[subsystem]]
nqn = "$QPATH_NQN"
hosts = [{ nqn = "$HOSTNQN", tls_key_file = "$D/tls.key" }]

[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "1G"
TOML
# secure channel concatenation: a DH-HMAC-CHAP secret (DHHC-1, 32 random bytes and their
# CRC-32, as `nvme gen-dhchap-key` makes it) in a file only root reads, and a port that
# takes plaintext (the first admin connection) and TLS (every one after it).
python3 - > "$D/dhchap.key" <<'PY'
import base64, os, struct, zlib
k = os.urandom(32)
print("DHHC-1:00:%s:" % base64.b64encode(k + struct.pack("<I", zlib.crc32(k))).decode())
PY
cat > "$D/concat.toml" <<TOML
[[port]]
id = 1
addr = "$VMLAB_HOST_IP:4420"
tls = "allowed"

[[port]]
id = 2
addr = "$VMLAB_HOST_IP:4421"
tls = "allowed"

[[subsystem]]
nqn = "$QPATH_NQN"
hosts = [{ nqn = "$HOSTNQN", dhchap_key_file = "$D/dhchap.key", dhgroup = "ffdhe2048" }]

[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "1G"
TOML
umask 022

start_capture() {
  PCAP=$D/capture.pcap
  local i
  setsid timeout -k 5 $((BOOT_TIMEOUT + 300)) ip netns exec "$VMLAB_NETNS" tshark -q -n -i "$VMLAB_TAP" \
    -B 64 -f 'tcp port 4420 or tcp port 4421' -a filesize:4000000 -w "$PCAP" > "$D/tshark.log" 2>&1 < /dev/null &
  TSHARK_PID=$!
  STARTED+=("$TSHARK_PID")
  for i in $(seq 100); do grep -q "Capturing on" "$D/tshark.log" 2>/dev/null && return 0; sleep 0.2; done
  fail "capture: tshark did not start capturing:"; cat "$D/tshark.log"; return 1
}

# check_capture: the capture holds TLS handshakes and application data on both ports, only
# TLS record types, and not one NVMe/TCP PDU in the clear. (TLS 1.3 protected records show
# as tls.record.opaque_type 23; handshake, change_cipher_spec and plaintext alerts as
# tls.record.content_type 22, 20, 21. Decoded as NVMe/TCP instead, every connection starts
# with a TLS record type (0x16), never with a PDU type 0-9 such as an ICReq.)
# Counts what capture $1 holds on the NVMe/TCP ports that follow, decoded as TLS: sets hello
# (ClientHellos), app (frames of TLS application data), other (records of any other type:
# content types 20-22 in the clear, opaque type 23 when protected) and pdus (NVMe/TCP PDUs in
# the clear, the same frames decoded as NVMe/TCP).
count_tls_records() {
  local pcap=$1 p tls=() nvme=()
  shift
  for p in "$@"; do tls+=(-d "tcp.port==$p,tls"); nvme+=(-d "tcp.port==$p,nvme-tcp"); done
  hello=$(tshark -r "$pcap" "${tls[@]}" -Y 'tls.handshake.type == 1' 2>/dev/null | wc -l)
  app=$(tshark -r "$pcap" "${tls[@]}" -Y 'tls.record.opaque_type == 23' 2>/dev/null | wc -l)
  other=$(tshark -r "$pcap" "${tls[@]}" -Y 'tls.record' -T fields -e tls.record.content_type -e tls.record.opaque_type 2>/dev/null \
    | awk -F'\t' '{ n = split($1, c, ","); for (i = 1; i <= n; i++) if (c[i] != 20 && c[i] != 21 && c[i] != 22) bad++
                    n = split($2, o, ","); for (i = 1; i <= n; i++) if (o[i] != 23) bad++ }
                  END { print bad + 0 }')
  # NVMe/TCP's dissector forced onto ciphertext now and then finds a type byte <= 9 where it
  # lost the stream's framing; such a "PDU" is garbage (a CI capture: hlen 39, plen 210 MB)
  # and tshark marks it malformed. A PDU really sent in the clear decodes whole.
  pdus=$(tshark -r "$pcap" "${nvme[@]}" -Y 'nvme-tcp.type <= 9 && !_ws.malformed' 2>/dev/null | wc -l)
}

# check_suites PCAP PORT...: every ServerHello in the capture chose the key's suite
# (0x1301 TLS_AES_128_GCM_SHA256 for hash 01, 0x1302 TLS_AES_256_GCM_SHA384 for hash 02).
check_suites() {
  local pcap=$1 p tls=() want=0x1301 suites
  shift
  for p in "$@"; do tls+=(-d "tcp.port==$p,tls"); done
  [ "$TLS_HMAC" = 2 ] && want=0x1302
  suites=$(tshark -r "$pcap" "${tls[@]}" -Y 'tls.handshake.type == 2' -T fields -e tls.handshake.ciphersuite 2>/dev/null \
    | tr ',' '\n' | sort | uniq -c | tr '\n' ' ')
  [ -n "$suites" ] && [ "$(printf '%s' "$suites" | grep -o '0x[0-9a-f]*' | sort -u)" = "$want" ] \
    && pass "capture: every ServerHello chose suite $want ($suites)" || fail "capture: ServerHello suites: $suites (want $want)"
}

check_capture() {
  local i
  sleep 1
  kill -INT "$TSHARK_PID" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$TSHARK_PID" 2>/dev/null || break; sleep 0.2; done
  stop_group "$TSHARK_PID"
  say "capture: $(du -h "$PCAP" | cut -f1) in $PCAP"
  local tls=(-r "$PCAP" -d tcp.port==4420,tls -d tcp.port==4421,tls)
  local hello app other pdus ports
  count_tls_records "$PCAP" 4420 4421
  ports=$(tshark "${tls[@]}" -Y 'tls.record.opaque_type == 23' -T fields -e tcp.dstport -e tcp.srcport 2>/dev/null \
    | tr '\t' '\n' | grep -E '^442[01]$' | sort -u | tr '\n' ' ')
  say "capture: $hello ClientHello(s), $app frames of TLS application data (ports $ports), $other other record types, $pdus clear NVMe/TCP PDUs"
  [ "$hello" -ge 4 ] && pass "capture: $hello TLS ClientHellos (every queue, and again after the restart or the path loss)" \
    || fail "capture: $hello ClientHellos"
  [ "$app" -gt 100 ] && [ "$ports" = "4420 4421 " ] && pass "capture: TLS application data on both ports ($app frames)" \
    || fail "capture: TLS application data: $app frames on ports $ports"
  [ "$other" = 0 ] && pass "capture: only TLS record types (handshake, change_cipher_spec, alert, application data)" \
    || fail "capture: $other frames with other record types"
  [ "$pdus" = 0 ] && pass "capture: no NVMe/TCP PDU in the clear (no ICReq, ICResp, capsule or data PDU)" \
    || fail "capture: $pdus clear NVMe/TCP PDUs"
  check_suites "$PCAP" 4420 4421
  if [ "$pdus" = 0 ] && [ "$app" -gt 100 ]; then rm -f "$PCAP"; fi
}

# A two-path `qpath bench` job against the guest's nvmet (randrw 4k at QD16, crc32c verify,
# round-robin, reconnects every second up to 120 s), started in the background: $1 names the
# job, $2 holds the URI's own options (a secret among them goes into the job file, mode 0600,
# never on a command line or in a log), $3 its runtime in seconds. Sets bench_pid; whether
# the job is still running 5 s later.
start_two_path_bench() {
  local name=$1 opts=$2 runtime=$3 g=$VMLAB_GUEST_IP
  umask 077
  cat > "$D/bench.fio" <<FIO
[$name]
ioengine=qpath
filename=nvme+tcp://$g:4420,$g:4421/$QPATH_NQN/1?hostnqn=$HOSTNQN&$opts&reconnect_delay=1&ctrl_loss_tmo=120
rw=randrw
bs=4k
iodepth=16
size=64m
time_based
runtime=$runtime
verify=crc32c
mpath_policy=round-robin
FIO
  umask 022
  setsid timeout -k 5 240 ip netns exec "$VMLAB_NETNS" env RUST_LOG=info "$QPATH_BIN" bench --output-format=json \
    "$D/bench.fio" > "$D/bench.json" 2> "$D/bench.log" < /dev/null &
  bench_pid=$!
  STARTED+=("$bench_pid")
  sleep 5
  kill -0 "$bench_pid" 2>/dev/null
}

# Waits (up to 200 s) for the job start_two_path_bench started and judges its JSON report:
# sets verdict to one line of it; returns 0 when the job exited 0 with no error, did reads
# and writes, and verified blocks with no failure. Not in a subshell: it waits for its child.
judge_two_path_bench() {
  local i rc=0
  for i in $(seq 200); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 1; done
  wait "$bench_pid" || rc=$?
  verdict=$(python3 - "$D/bench.json" "$rc" <<'PY'
import json, sys
try:
    out = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print("no JSON report (rc %s): %s" % (sys.argv[2], e)); sys.exit(1)
j, q = out["jobs"][0], out["qpath"]["jobs"][0]
v = q.get("verify", {})
paths = [p.get("ios", p.get("completed", 0)) for p in q.get("multipath", {}).get("paths", [])]
r, w = j["read"]["total_ios"], j["write"]["total_ios"]
print("rc %s, error %s, %d reads, %d writes, verify checked %s failures %s, per-path %s" % (
    sys.argv[2], j["error"], r, w, v.get("checked"), v.get("failures"), paths))
sys.exit(0 if (sys.argv[2] == "0" and j["error"] == 0 and r > 0 and w > 0 and v.get("failures") == 0
               and v.get("checked", 0) > 0) else 1)
PY
)
}

scenario_linux-host() {
  on_ask() {
    case "$1" in
      guest-key)
        # The guest's `nvme gen-tls-key --hmac=2` key, through the share (mode 0600 there):
        # it replaces the host-made one, and the target starts with it.
        install -m 600 "$GUEST_SHARE/tls.key" "$D/tls.key" && rm -f "$GUEST_SHARE/tls.key" \
          || { fail "no key from the guest in the share"; return 1; }
        if grep -qE '^NVMeTLSkey-1:02:[A-Za-z0-9+/=]{72}:$' "$D/tls.key"; then
          pass "the guest's key is of hash 02 (48 bytes and CRC, as nvme gen-tls-key --hmac=2 prints it)"
        else fail "the guest's key is not a key of hash 02"; return 1; fi
        start_target --config "$D/target.toml" ;;
      ana-inaccessible) rpc set_ana_state port=1 group=1 state=inaccessible > /dev/null ;;
      ana-optimized) rpc set_ana_state port=1 group=1 state=optimized > /dev/null ;;
      restart-target)
        kill -9 "$TARGET_QPATH_PID"
        stop_group "$TARGET_PID"
        say "target killed (-9); starting it again with the same configuration"
        start_target --config "$D/target.toml" ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  local guest_key=()
  if [ "$TLS_HMAC" = 2 ]; then
    GUEST_SHARE=$D/share
    mkdir -m 700 -p "$GUEST_SHARE"
    guest_key=(vmlab.env.GUEST_KEY=2)
  else
    start_target --config "$D/target.toml" || return 0
  fi
  boot_guest "$HERE/guest/linux-host.sh" "vmlab.env.HOSTNQN=$HOSTNQN" "vmlab.env.IDENTITY=$TLS_IDENTITY" \
    ${guest_key[@]+"${guest_key[@]}"}
  serve_guest
  check_guest
  local q suite n
  q=$(grep -c "TLS channel open" "$D/target.log" || true)
  [ "$q" -ge 4 ] && pass "target: $q queues opened a TLS channel" || fail "target: $q TLS channels opened"
  suite=TLS_AES_128_GCM_SHA256; [ "$TLS_HMAC" = 2 ] && suite=TLS_AES_256_GCM_SHA384
  n=$(grep "TLS channel open" "$D/target.log" | grep -c "$suite" || true)
  [ "$q" -ge 4 ] && [ "$n" = "$q" ] && pass "target: every channel ran $suite ($n)" \
    || fail "target: $n of $q channels ran $suite"
  n=$(grep "TLS channel open" "$D/target.log" | grep -c "identity=NVMe${TLS_IDENTITY}R0" || true)
  [ "$q" -ge 4 ] && [ "$n" = "$q" ] && pass "target: every channel's PSK identity is of version $TLS_IDENTITY ($n)" \
    || fail "target: $n of $q channels presented an identity of version $TLS_IDENTITY"
  if grep -aq "NVMeTLSkey-1" "$D/target.log" "$SERIAL"; then fail "a TLS key is printed in a log"; else pass "no TLS key in the target log or the serial log"; fi
  check_target_after
}

scenario_linux-concat() {
  on_ask() {
    case "$1" in
      restart-target)
        kill -9 "$TARGET_QPATH_PID"
        stop_group "$TARGET_PID"
        say "target killed (-9); starting it again with the same configuration"
        start_target --config "$D/concat.toml" ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  BOOT_FILES+=("$D/dhchap.key:/vmlab/dhchap.key")
  start_target --config "$D/concat.toml" || return 0
  boot_guest "$HERE/guest/linux-concat.sh" "vmlab.env.HOSTNQN=$HOSTNQN"
  serve_guest
  check_guest
  local n q
  n=$(grep -c "TLS PSK generated by secure channel concatenation" "$D/target.log" || true)
  [ "$n" -ge 2 ] && pass "target: $n PSKs generated by concatenation (connect, reconnect, restart)" \
    || fail "target: $n PSKs generated"
  q=$(grep -c "TLS channel open" "$D/target.log" || true)
  [ "$q" -ge 2 ] && pass "target: $q queues opened a TLS channel" || fail "target: $q TLS channels opened"
  if grep -aqE "DHHC-1:[0-9][0-9]:[A-Za-z0-9]|NVMeTLSkey-1" "$D/target.log" "$SERIAL"; then
    fail "a secret is printed in a log"
  else pass "no DH-HMAC-CHAP secret or TLS key in the target log or the serial log"; fi
  check_target_after
}

scenario_linux-target() {
  QPATH_NQN=nqn.2024-01.io.vmlab:tls
  local g=$VMLAB_GUEST_IP bench_pid=
  on_host() { ip netns exec "$VMLAB_NETNS" timeout 300 env RUST_LOG=info "$QPATH_BIN" "$@"; }
  on_ask() {
    local out rc
    case "$1" in
      connect-tls)
        out=$(on_host connect -a "$g" -s 4420 -n "$QPATH_NQN" -q "$HOSTNQN" -i 2 --tls --tls-key "$D/tls.key" 2>&1); rc=$?
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
        if [ $rc = 0 ] && printf '%s' "$out" | grep -q 'nsid *1 '; then
          pass "qpath connect --tls to Linux nvmet: live, namespace listed"
        else fail "qpath connect --tls to Linux nvmet: rc=$rc"; return 1; fi ;;
      connect-wrong-key)
        umask 077; "$QPATH_BIN" gen-tls-key --hmac "$TLS_HMAC" > "$D/wrong.key"; umask 022
        out=$(on_host connect -a "$g" -s 4420 -n "$QPATH_NQN" -q "$HOSTNQN" -i 2 --tls --tls-key "$D/wrong.key" -l 0 2>&1); rc=$?
        printf '%s\n' "$out" | tail -3 | sed 's/^/    /'
        if [ $rc != 0 ] && printf '%s' "$out" | grep -q 'TLS'; then pass "qpath connect with a wrong key: refused in the TLS handshake"
        else fail "qpath connect with a wrong key: rc=$rc"; return 1; fi ;;
      bench-start)
        start_two_path_bench tls-paths "tls_key=$(cat "$D/tls.key")" 45 \
          && pass "qpath bench (two TLS paths, randrw crc32c verify) running" \
          || { fail "qpath bench exited at once"; tail -5 "$D/bench.log"; return 1; } ;;
      bench-check)
        local verdict
        judge_two_path_bench
        local ok=$?
        grep -vE '^ *$' "$D/bench.log" | tail -4 | sed 's/^/    bench: /'
        if grep -q 'NVMeTLSkey-1' "$D/bench.json" "$D/bench.log"; then fail "the TLS key is printed in the bench's report or log"; fi
        if [ $ok = 0 ]; then pass "bench across the path loss: $verdict"; else fail "bench: $verdict"; return 1; fi ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  boot_guest "$HERE/guest/linux-target.sh" "vmlab.env.HOSTNQN=$HOSTNQN"
  serve_guest
  check_guest
}

scenario_linux-target-concat() {
  QPATH_NQN=nqn.2024-01.io.vmlab:concat
  local bench_pid=
  on_ask() {
    local verdict ok n
    case "$1" in
      bench-start)
        start_two_path_bench concat-paths "dhchap_secret=$(cat "$D/dhchap.key")&concat=1" 40 \
          && pass "qpath bench (two paths, concat=1, randrw crc32c verify) running" \
          || { fail "qpath bench exited at once"; tail -5 "$D/bench.log"; return 1; } ;;
      bench-check)
        judge_two_path_bench
        ok=$?
        grep -vE '^ *$' "$D/bench.log" | grep -v DHHC | tail -4 | sed 's/^/    bench: /'
        n=$(grep -c "secure channel concatenation: TLS PSK generated" "$D/bench.log" || true)
        [ "$n" -ge 3 ] && pass "qpath: $n TLS PSKs generated (both paths, then the reconnect of 4420's)" \
          || fail "qpath: $n TLS PSKs generated (want both paths and the reconnect)"
        if grep -qE "DHHC-1:[0-9][0-9]:[A-Za-z0-9]" "$D/bench.json" "$D/bench.log"; then
          fail "the DH-HMAC-CHAP secret is printed in the bench's report or log"
        else pass "no DH-HMAC-CHAP secret in the bench's report or log"; fi
        if [ $ok = 0 ]; then pass "bench across the reconnect: $verdict"; else fail "bench: $verdict"; return 1; fi ;;
      *) fail "unexpected request from the guest: $1"; return 1 ;;
    esac
  }
  BOOT_FILES+=("$D/dhchap.key:/vmlab/dhchap.key")
  boot_guest "$HERE/guest/linux-target-concat.sh" "vmlab.env.HOSTNQN=$HOSTNQN"
  serve_guest
  check_guest
}

scenario_ktls() {
  on_ask() { fail "unexpected request from the guest: $1"; return 1; }
  # qpath (and dumpcap, where this machine has it) with their libraries into the guest;
  # the capture comes back through the 9p share.
  guest_payload /usr/bin/dumpcap
  GUEST_SHARE=$D/share
  mkdir -p "$GUEST_SHARE"
  boot_guest "$HERE/guest/ktls.sh" "vmlab.env.HOSTNQN=$HOSTNQN"
  serve_guest
  check_guest
  local pcap=$GUEST_SHARE/ktls.pcap hello app other pdus
  if [ ! -s "$pcap" ]; then
    say "SKIP: capture: the guest wrote none (see the serial log's SKIP line)"
    return
  fi
  count_tls_records "$pcap" 4420
  say "capture: $(du -h "$pcap" | cut -f1), $hello ClientHello(s), $app frames of TLS application data, $other other record types, $pdus clear NVMe/TCP PDUs"
  [ "$hello" -ge 4 ] && pass "capture: $hello TLS ClientHellos (the Linux host's and the bench's queues)" \
    || fail "capture: $hello ClientHellos"
  [ "$app" -gt 100 ] && pass "capture: $app frames of TLS application data (sealed by the kernel)" \
    || fail "capture: $app frames of TLS application data"
  [ "$other" = 0 ] && pass "capture: only TLS record types" || fail "capture: $other frames with other record types"
  [ "$pdus" = 0 ] && pass "capture: no NVMe/TCP PDU in the clear" || fail "capture: $pdus clear NVMe/TCP PDUs"
  check_suites "$pcap" 4420
  if [ "$pdus" = 0 ] && [ "$app" -gt 100 ]; then rm -f "$pcap"; fi
  if grep -aq "NVMeTLSkey-1" "$SERIAL"; then fail "a TLS key is printed in the serial log"; else pass "no TLS key in the serial log"; fi
}

set +e
# Concatenation starts in plaintext: its scenarios have no capture (start_capture stands in).
# The ktls scenario's connections stay inside the guest: it captures there.
case "$SCENARIO" in linux-concat|linux-target-concat|ktls) start_capture() { :; }; check_capture() { :; } ;; esac
start_capture && {
  # The key reaches the guest as a file (boot.sh --file), not on its command line.
  # tls-lib.sh: the guest set-up every scenario shares (sid's tools, the TLS modules, tlshd).
  BOOT_FILES=("$TOOLS:/vmlab/tls-tools.tar" "$D/tls.key:/vmlab/tls.key" "$HERE/guest/tls-lib.sh:/vmlab/tls-lib.sh")
  # The kernel's TLS (tlshd keys it after the handshake) needs gcm(aes), whose modules the
  # vmlab initramfs does not hold: they come from the same kernel package, unpacked.
  mkdir -p "$D/mods"
  for m in ctr gcm; do
    ko=$(find "$(kdir)/root" -name "$m.ko*" -path '*/kernel/crypto/*' | head -1)
    if [ -z "$ko" ]; then fail "host: no $m module in the KERNEL=$KERNEL package"; continue; fi
    case "$ko" in *.xz) xz -dc "$ko" > "$D/mods/$m.ko" ;; *.zst) zstd -qdc "$ko" > "$D/mods/$m.ko" ;; *) cp "$ko" "$D/mods/$m.ko" ;; esac
    BOOT_FILES+=("$D/mods/$m.ko:/vmlab/mods/$m.ko")
  done
  "scenario_$SCENARIO"
  check_capture
}
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
