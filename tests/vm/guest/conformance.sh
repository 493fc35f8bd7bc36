#!/bin/sh
# conformance.sh — the differential conformance suite, guest side: the same nvme-cli commands
# against Linux nvmet (this guest's own kernel target, a file namespace on 127.0.0.1:4420) and
# against qpath target (on the host, a file namespace of the same size on $ADDR:$PORT1).
# Each command's output and exit status go to /host/<target>/<name>.{out,rc} (9p share); the
# host's tests/vm/conformance.py compares them field by field and prints the verdict table.
# The guest judges only what the host cannot see: that the commands could run at all.
# Settings (vmlab.env.*): NQN (qpath's subsystem), ADDR PORT1 (lib.sh), NVMET_NQN, NS_MB (64)
. /vmlab/qpath-lib.sh
NS_MB=${NS_MB:-64}
NVMET_NQN=${NVMET_NQN:-nqn.2026-11.io.qpath:conformance-nvmet}
QPATH_NQN=$NQN
NVMET=/sys/kernel/config/nvmet
OUT=/host

step "conformance: kernel $(uname -r), nvmet $NVMET_NQN on 127.0.0.1:4420, qpath $QPATH_NQN on $ADDR:$PORT1, ${NS_MB} MiB file namespaces"
mountpoint -q /host 2> /dev/null || grep -q ' /host ' /proc/mounts \
  || { fail "conformance: no /host share to write results to"; finish; }
modprobe nvme-tcp || fail "modprobe nvme-tcp"
modprobe nvmet && modprobe nvmet-tcp || fail "modprobe nvmet nvmet-tcp"
mount -t configfs none /sys/kernel/config 2> /dev/null

# ---- Linux nvmet: a file namespace (nsid 1) and a second one (nsid 2) -------------------
# The files live on the guest's tmpfs, which takes no O_DIRECT: buffered_io.
nvmet_ns_file() {   # NSID FILE
  _d=$NVMET/subsystems/$NVMET_NQN/namespaces/$1
  mkdir -p "$_d"
  printf '%s' "$2" > "$_d/device_path"
  echo 1 > "$_d/buffered_io"
  # Reservations are off by default in nvmet (Linux 6.13+ has the switch; 6.1 has none).
  [ -f "$_d/resv_enable" ] && echo 1 > "$_d/resv_enable"
  echo 1 > "$_d/enable"
}
truncate -s "${NS_MB}M" /tmp/nvmet-ns1.img /tmp/nvmet-ns2.img
mkdir -p "$NVMET/subsystems/$NVMET_NQN" && echo 1 > "$NVMET/subsystems/$NVMET_NQN/attr_allow_any_host"
nvmet_ns_file 1 /tmp/nvmet-ns1.img || fail "nvmet: namespace 1"
nvmet_ns_file 2 /tmp/nvmet-ns2.img || fail "nvmet: namespace 2"
_p=$NVMET/ports/1
mkdir -p "$_p" && echo tcp > "$_p/addr_trtype" && echo ipv4 > "$_p/addr_adrfam" \
  && echo 127.0.0.1 > "$_p/addr_traddr" && echo 4420 > "$_p/addr_trsvcid" \
  && ln -s "$NVMET/subsystems/$NVMET_NQN" "$_p/subsystems/$NVMET_NQN" || fail "nvmet: port 1"

# ---- connect to both ----------------------------------------------------------------------
ctrl_of() {          # NQN: the controller nvmeN of that subsystem
  for _s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$_s/subsysnqn" 2> /dev/null)" = "$1" ] || continue
    ls "$_s" | grep -E '^nvme[0-9]+$' | head -1
    return 0
  done
  return 1
}
head_of() {          # NQN NSID: the namespace's block device nvmeXnY
  for _s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ "$(cat "$_s/subsysnqn" 2> /dev/null)" = "$1" ] || continue
    for _h in $(ls "$_s" | grep -E '^nvme[0-9]+n[0-9]+$'); do
      [ "$(cat "$_s/$_h/nsid" 2> /dev/null)" = "$2" ] && { echo "$_h"; return 0; }
    done
  done
  return 1
}
timeout 60 nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NVMET_NQN" && pass "connect: nvmet" || fail "connect: nvmet"
timeout 60 nvme connect -t tcp -a "$ADDR" -s "$PORT1" -n "$QPATH_NQN" && pass "connect: qpath" || fail "connect: qpath"
both_ready() { head_of "$NVMET_NQN" 2 > /dev/null && head_of "$QPATH_NQN" 2 > /dev/null; }
wait_until 30 both_ready || fail "conformance: namespaces 1 and 2 did not appear on both targets"
show_ctrls

# ---- the commands -------------------------------------------------------------------------
# run NAME CMD...: CMD's stdout+stderr and exit status into $OUT/$T/NAME.{out,rc}.
run() {
  _n=$1; shift
  timeout 60 "$@" > "$OUT/$T/$_n.out" 2>&1
  echo $? > "$OUT/$T/$_n.rc"
}
# note NAME TEXT: a finding of the guest's own (a read-back compared here) for the host's table.
note() { printf '%s\n' "$2" > "$OUT/$T/$1.out"; echo 0 > "$OUT/$T/$1.rc"; }

BS=4096                              # both targets: 4 KiB LBAs (nvmet's file namespaces on tmpfs)
dd if=/dev/urandom of=/tmp/pat bs=$BS count=16 2> /dev/null        # 16 blocks of pattern
dd if=/dev/urandom of=/tmp/pat2 bs=$BS count=2 2> /dev/null
zeros_md5() { dd if=/dev/zero bs="$1" count=1 2> /dev/null | md5sum | cut -d' ' -f1; }
# read_md5 DEV SLBA NLB: md5 of NLB blocks read with O_DIRECT from block SLBA
read_md5() { dd if="$1" bs="$BS" skip="$2" count="$3" iflag=direct 2> /dev/null | md5sum | cut -d' ' -f1; }
pat() { dd if=/tmp/pat bs="$BS" skip="$1" count="$2" 2> /dev/null; }   # FIRST NLB of the pattern
pat_md5() { pat "$1" "$2" | md5sum | cut -d' ' -f1; }
# readback NAME WANT GOT: the note "match" or "mismatch" for the host's table
readback() { if [ "$2" = "$3" ]; then note "$1" match; else note "$1" "mismatch (want $2, got $3)"; fi; }

for T in nvmet qpath; do
  mkdir -p "$OUT/$T"
  if [ $T = nvmet ]; then N=$NVMET_NQN; else N=$QPATH_NQN; fi
  C=/dev/$(ctrl_of "$N")
  NS=/dev/$(head_of "$N" 1)
  NS2=/dev/$(head_of "$N" 2)
  step "$T: controller $C, namespaces $NS $NS2"
  [ -c "$C" ] && [ -b "$NS" ] && [ -b "$NS2" ] || { fail "$T: devices missing"; continue; }
  _bs=$(blockdev --getss "$NS")
  [ "$_bs" = $BS ] && pass "$T: $BS-byte blocks" || fail "$T: logical block size $_bs, the suite needs $BS"
  NSZE=$(($(blockdev --getsize64 "$NS") / BS))
  echo "$NSZE" > "$OUT/$T/nsze.txt"

  # Identify
  run id-ctrl nvme id-ctrl "$C" -o json
  run id-ns nvme id-ns "$C" -n 1 -o json
  run id-ns-2 nvme id-ns "$C" -n 2 -o json
  run id-ns-inactive nvme id-ns "$C" -n 7 -o json
  run id-ns-broadcast nvme id-ns "$C" -n 0xffffffff -o json
  run ns-descs nvme ns-descs "$C" -n 1 -o json
  run ns-descs-inactive nvme ns-descs "$C" -n 7 -o json
  run list-ns nvme list-ns "$C" -o json
  run list-ns-after-1 nvme list-ns "$C" -n 1 -o json

  # Log pages (typed where nvme-cli decodes them, the status of a raw read for every LID)
  run error-log nvme error-log "$C" -e 4 -o json
  run smart-log nvme smart-log "$C" -o json
  run smart-log-ns1 nvme smart-log "$C" -n 1 -o json
  run fw-log nvme fw-log "$C" -o json
  # (nvme-cli 2.3's effects-log prints nothing for a fabrics controller: read the pages raw)
  run effects-log nvme get-log "$C" -i 0x05 -l 4096
  run fid-effects-log nvme get-log "$C" -i 0x12 -l 1024
  run supported-log-pages-raw nvme get-log "$C" -i 0x00 -l 1024
  run ana-log nvme ana-log "$C" -o json
  run resv-notif-log nvme resv-notif-log "$C" -o json
  for lid in 0x00 0x01 0x02 0x03 0x04 0x05 0x06 0x07 0x08 0x09 0x0a 0x0b 0x0c 0x0d 0x0e 0x0f 0x70 0x80 0x81 0xc0; do
    run "get-log-$lid" nvme get-log "$C" -i "$lid" -l 512 -r
  done
  run get-log-odd-offset nvme get-log "$C" -i 0x02 -l 64 -o 2 -r

  # Features: current value and capabilities of every mandatory or advertised one
  for f in 0x01 0x02 0x04 0x05 0x06 0x07 0x08 0x0a 0x0b 0x0c 0x0f 0x11 0x80; do
    run "get-feature-$f" nvme get-feature "$C" -f "$f" -s 0
    run "get-feature-$f-supported" nvme get-feature "$C" -f "$f" -s 3
  done
  run get-feature-0x81 nvme get-feature "$C" -f 0x81 -s 0 -l 16     # Host Identifier: 16 bytes of data
  run get-feature-0x81-supported nvme get-feature "$C" -f 0x81 -s 3
  for f in 0x82 0x83 0x84; do
    run "get-feature-$f" nvme get-feature "$C" -f "$f" -n 1 -s 0
    run "get-feature-$f-supported" nvme get-feature "$C" -f "$f" -n 1 -s 3
  done
  aec=$(nvme get-feature "$C" -f 0x0b -s 0 2> /dev/null | sed -n 's/.*Current value:[[:space:]]*\(0x[0-9a-f]*\).*/\1/p')
  run set-feature-0x0b-same nvme set-feature "$C" -f 0x0b -v "${aec:-0}"
  run set-feature-0x0b-save nvme set-feature "$C" -f 0x0b -v "${aec:-0}" -s
  run set-feature-0x01 nvme set-feature "$C" -f 0x01 -v 0
  run set-feature-0x04 nvme set-feature "$C" -f 0x04 -v 0x157
  run set-feature-0x06 nvme set-feature "$C" -f 0x06 -v 0
  run set-feature-0x82 nvme set-feature "$C" -f 0x82 -n 1 -v 0
  run set-feature-0x82-bad-ns nvme set-feature "$C" -f 0x82 -n 9 -v 0
  run set-feature-0x84-ns2-protect nvme set-feature "$C" -f 0x84 -n 2 -v 1
  run set-feature-0xfe nvme set-feature "$C" -f 0xfe -v 0

  # Data commands (namespace 1); nvme-cli's counts are 0's based
  run write nvme write "$NS" -s 16 -c 15 -z 65536 -d /tmp/pat
  readback write-readback "$(pat_md5 0 16)" "$(read_md5 "$NS" 16 16)"
  run read nvme read "$NS" -s 16 -c 15 -z 65536 -d /tmp/rd
  readback read-data "$(pat_md5 0 16)" "$(md5sum < /tmp/rd | cut -d' ' -f1)"
  run compare-same nvme compare "$NS" -s 16 -c 1 -z 8192 -d /tmp/pat
  run compare-differs nvme compare "$NS" -s 16 -c 1 -z 8192 -d /tmp/pat2
  run verify nvme verify "$NS" -s 16 -c 15
  run flush nvme flush "$NS" -n 1
  # Three ranges deallocated in one command; the blocks between them keep their data
  run write-dsm-area nvme write "$NS" -s 1024 -c 15 -z 65536 -d /tmp/pat
  run dsm-3-ranges nvme dsm "$NS" --ad -s 1024,1028,1034 -b 2,2,4
  readback dsm-range-1-zeros "$(zeros_md5 8192)" "$(read_md5 "$NS" 1024 2)"
  readback dsm-range-2-zeros "$(zeros_md5 8192)" "$(read_md5 "$NS" 1028 2)"
  readback dsm-range-3-zeros "$(zeros_md5 16384)" "$(read_md5 "$NS" 1034 4)"
  readback dsm-between-kept "$(pat_md5 2 2)$(pat_md5 6 4)$(pat_md5 14 2)" \
    "$(read_md5 "$NS" 1026 2)$(read_md5 "$NS" 1030 4)$(read_md5 "$NS" 1038 2)"
  run write-zeroes-area nvme write "$NS" -s 1100 -c 15 -z 65536 -d /tmp/pat
  run write-zeroes nvme write-zeroes "$NS" -s 1100 -c 3
  readback write-zeroes-zeros "$(zeros_md5 16384)" "$(read_md5 "$NS" 1100 4)"
  run write-zeroes-deac nvme write-zeroes "$NS" -s 1106 -c 3 --deac
  readback write-zeroes-deac-zeros "$(zeros_md5 16384)" "$(read_md5 "$NS" 1106 4)"
  readback write-zeroes-neighbours-kept "$(pat_md5 4 2)$(pat_md5 10 6)" \
    "$(read_md5 "$NS" 1104 2)$(read_md5 "$NS" 1110 6)"
  run copy nvme copy "$NS" --sdlba=2048 --slbs=16,20 --blocks=1,1
  readback copy-dest "$({ pat 0 2; pat 4 2; } | md5sum | cut -d' ' -f1)" "$(read_md5 "$NS" 2048 4)"

  # Bad input: the status each target gives
  run read-past-end nvme read "$NS" -s "$NSZE" -c 0 -z $BS -d /tmp/rd
  run read-straddles-end nvme read "$NS" -s $((NSZE - 1)) -c 1 -z $((2 * BS)) -d /tmp/rd
  run write-past-end nvme write "$NS" -s "$NSZE" -c 0 -z $BS -d /tmp/pat
  run write-zeroes-past-end nvme write-zeroes "$NS" -s "$NSZE" -c 0
  run dsm-past-end nvme dsm "$NS" --ad -s 0,"$NSZE" -b 1,1
  run compare-past-end nvme compare "$NS" -s "$NSZE" -c 0 -z $BS -d /tmp/pat
  run verify-past-end nvme verify "$NS" -s "$NSZE" -c 0
  run copy-dest-past-end nvme copy "$NS" --sdlba="$NSZE" --slbs=0 --blocks=0
  run copy-source-past-end nvme copy "$NS" --sdlba=0 --slbs="$NSZE" --blocks=0
  # One source range more than the namespace's MSRC allows (nvme-cli sends at most 128)
  msrc=$(nvme id-ns "$C" -n 1 -o json 2> /dev/null | sed -n 's/.*"msrc":\([0-9]*\).*/\1/p')
  nr=$((${msrc:-127} + 2))
  if [ "$nr" -le 128 ]; then
    run copy-too-many-ranges nvme copy "$NS" --sdlba=8192 --slbs="$(seq -s, 0 2 $((2 * nr - 2)))" \
      --blocks="$(seq 1 "$nr" | sed 's/.*/0/' | tr '\n' , | sed 's/,$//')"
  else
    note copy-too-many-ranges "not sent: MSRC allows all 128 ranges nvme-cli can send"
  fi
  # (Linux refuses to send an I/O command whose NSID is not its namespace's, so a bad NSID
  # is tried with admin commands that take one.)
  run smart-log-bad-nsid nvme smart-log "$C" -n 99 -o json
  run get-feature-0x83-bad-nsid nvme get-feature "$C" -f 0x83 -n 99 -s 0
  run unknown-io-opcode nvme io-passthru "$NS" -o 0x7c -n 1
  run unknown-admin-opcode nvme admin-passthru "$C" -o 0x7c
  # Namespace 2 write protected (feature 84h above): its writes are refused until unprotected
  run write-protected nvme write "$NS2" -s 0 -c 0 -z $BS -d /tmp/pat
  run set-feature-0x84-ns2-unprotect nvme set-feature "$C" -f 0x84 -n 2 -v 0
  run write-unprotected nvme write "$NS2" -s 0 -c 0 -z $BS -d /tmp/pat

  # Reservations (namespace 1): register, acquire, report, release, unregister
  run resv-register nvme resv-register "$NS" -n 1 --nrkey=0xabc1 --rrega=0
  run resv-acquire nvme resv-acquire "$NS" -n 1 --crkey=0xabc1 --rtype=1 --racqa=0
  run resv-report nvme resv-report "$NS" -n 1 --eds -o json
  run resv-acquire-wrong-key nvme resv-acquire "$NS" -n 1 --crkey=0x1234 --rtype=1 --racqa=0
  run resv-release nvme resv-release "$NS" -n 1 --crkey=0xabc1 --rtype=1 --rrela=0
  run resv-unregister nvme resv-register "$NS" -n 1 --crkey=0xabc1 --rrega=1
  run resv-report-after nvme resv-report "$NS" -n 1 --eds -o json
  run error-log-after nvme error-log "$C" -e 4 -o json
  run smart-log-after nvme smart-log "$C" -o json
  pass "$T: $(ls "$OUT/$T" | grep -c '\.rc$') commands run"
done

disconnect_all_check
finish
