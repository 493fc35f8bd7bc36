#!/usr/bin/env bash
# pcap-check.sh FILE.pcap [--need-digests] — decode a capture of qpath target traffic with
# Wireshark's NVMe/TCP dissector (issue #2, acceptance 3) and fail if
#   * any frame is malformed (_ws.malformed) or carries an expert error,
#   * any NVMe/TCP PDU has a type the spec does not define, or is a C2H/H2CTermReq,
#   * any header or data digest checks as bad,
#   * the capture lacks ICReq, ICResp, CapsuleCmd, CapsuleResp, H2CData, C2HData or R2T PDUs,
#     or NVMe/TCP on either port 4420 or 4421 (so the check cannot pass on an empty capture),
#   * --need-digests: no PDU with a good header digest and one with a good data digest.
# Prints the number of PDUs per type. Wireshark decodes 4420 as NVMe/TCP by default;
# -d tcp.port==4421,nvme-tcp adds the second port.
#
# pcap-check.sh --self-test: builds two small captures with text2pcap (a C2HData PDU whose
# DATAL runs past its end, which Wireshark reports as malformed, and a PDU of type 0x0b)
# and checks that this script rejects both for the right reason.
set -uo pipefail
PCAP=${1:?usage: pcap-check.sh FILE.pcap [--need-digests] | --self-test}
if [ "$PCAP" = --self-test ]; then
  command -v text2pcap > /dev/null || { echo "FAIL: pcap self-test: text2pcap not installed"; exit 1; }
  T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
  # common header: type, flags, hlen, pdo, plen (LE); C2HData: cccid, rsvd, datao, datal, rsvd
  { echo "000000 07 0c 18 18 28 00 00 00 01 00 00 00 00 00 00 00"     # plen 40, cccid 1, datao 0
    echo "000010 00 10 00 00 00 00 00 00 00 00 00 00 00 00 00 00"     # datal 4096 (> the 16 bytes sent)
    echo "000020 00 00 00 00 00 00 00 00"; } > "$T/malformed.txt"
  printf '000000 0b 00 08 00 08 00 00 00\n' > "$T/unknown.txt"
  ok=1
  for c in "malformed:malformed (" "unknown:unknown NVMe/TCP PDU type 0xb"; do
    name=${c%%:*}; want=${c#*:}
    text2pcap -q -T 4420,40000 -i 6 "$T/$name.txt" "$T/$name.pcap" > /dev/null 2>&1 || { echo "FAIL: pcap self-test: text2pcap"; exit 1; }
    if out=$("$0" "$T/$name.pcap" 2>&1); then
      echo "FAIL: pcap self-test: the $name capture passed:"; echo "$out"; ok=0
    elif ! grep -qF "$want" <<< "$out"; then
      echo "FAIL: pcap self-test: the $name capture failed, but not with '$want':"; echo "$out"; ok=0
    fi
  done
  [ $ok = 1 ] && echo "PASS: pcap self-test: a malformed frame and an unknown PDU type are rejected"
  [ $ok = 1 ]; exit $?
fi
NEED_DIGESTS=0
[ "${2:-}" = --need-digests ] && NEED_DIGESTS=1
command -v tshark > /dev/null || { echo "FAIL: pcap: tshark not installed"; exit 1; }
[ -s "$PCAP" ] || { echo "FAIL: pcap: $PCAP is missing or empty"; exit 1; }

TSHARK=(timeout 900 tshark -n -r "$PCAP" -d tcp.port==4421,nvme-tcp
        -o nvme-tcp.check_hdgst:TRUE -o nvme-tcp.check_ddgst:TRUE)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# One pass: every frame with NVMe/TCP, malformed or with an expert error; one line each.
"${TSHARK[@]}" -Y 'nvme-tcp || _ws.malformed || _ws.expert.severity == error' -T fields \
  -E separator='|' -E occurrence=a -E aggregator=',' \
  -e frame.number -e tcp.srcport -e tcp.dstport -e nvme-tcp.type -e nvme-tcp.hdgst.status \
  -e nvme-tcp.ddgst.status -e _ws.malformed -e _ws.expert.severity -e _ws.expert.message \
  > "$OUT" 2> "$OUT.err"
rc=$?
if [ $rc != 0 ]; then echo "FAIL: pcap: tshark rc=$rc"; cat "$OUT.err"; rm -f "$OUT.err"; exit 1; fi
rm -f "$OUT.err"

python3 - "$OUT" "$NEED_DIGESTS" <<'EOF'
import sys
from collections import Counter

NAMES = {0: "ICReq", 1: "ICResp", 2: "H2CTermReq", 3: "C2HTermReq", 4: "CapsuleCmd",
         5: "CapsuleResp", 6: "H2CData", 7: "C2HData", 9: "R2T"}
REQUIRED = [0, 1, 4, 5, 6, 7, 9]
ERROR_SEVERITY = 0x800000          # PI_ERROR
DIGEST = {"0": "bad", "1": "good", "2": "unverified", "3": "absent", "4": "illegal"}
path, need_digests = sys.argv[1], sys.argv[2] == "1"

types, ports, hd, dd = Counter(), Counter(), Counter(), Counter()
problems = []
frames = 0
for line in open(path, encoding="utf-8", errors="replace"):
    f = line.rstrip("\n").split("|")
    if len(f) < 9:
        continue
    num, sport, dport, ptype, hstat, dstat, malformed, sev, msg = f[:9]
    frames += 1
    for t in filter(None, ptype.split(",")):
        t = int(t, 0)
        types[t] += 1
        if t not in NAMES:
            problems.append(f"frame {num}: unknown NVMe/TCP PDU type {t:#x}")
        elif t in (2, 3):
            problems.append(f"frame {num}: {NAMES[t]} (a peer ended the connection with an error)")
    if ptype:
        for p in (sport, dport):
            if p in ("4420", "4421"):
                ports[p] += 1
    for s in filter(None, hstat.split(",")):
        hd[DIGEST.get(s, s)] += 1
    for s in filter(None, dstat.split(",")):
        dd[DIGEST.get(s, s)] += 1
    if "bad" in (DIGEST.get(s) for s in hstat.split(",") + dstat.split(",")) or \
       "illegal" in (DIGEST.get(s) for s in hstat.split(",") + dstat.split(",")):
        problems.append(f"frame {num}: digest check failed (header {hstat}, data {dstat})")
    if malformed:
        problems.append(f"frame {num}: malformed ({msg})")
    sevs = [int(s, 0) for s in sev.split(",") if s]
    if any(s >= ERROR_SEVERITY for s in sevs):
        problems.append(f"frame {num}: expert error: {msg}")

print(f"pcap: {frames} frames with NVMe/TCP PDUs or problems; NVMe/TCP frames per port: "
      + ", ".join(f"{p}={n}" for p, n in sorted(ports.items())))
for t in sorted(types):
    print(f"  PDU {NAMES.get(t, 'UNKNOWN')} (type {t}): {types[t]}")
print(f"  header digests: {dict(hd)}; data digests: {dict(dd)}")
for t in REQUIRED:
    if types[t] == 0:
        problems.append(f"no {NAMES[t]} PDU in the capture")
for p in ("4420", "4421"):
    if ports[p] == 0:
        problems.append(f"no NVMe/TCP decoded on port {p}")
if need_digests:
    if hd["good"] == 0:
        problems.append("no PDU with a good header digest (the digest round should have them)")
    if dd["good"] == 0:
        problems.append("no PDU with a good data digest (the digest round should have them)")
for p in problems[:40]:
    print(f"FAIL: pcap: {p}")
if len(problems) > 40:
    print(f"FAIL: pcap: ... and {len(problems) - 40} more")
if problems:
    sys.exit(1)
print("PASS: pcap: no malformed frame, no expert error, no unknown PDU type, all required PDU types present")
EOF
