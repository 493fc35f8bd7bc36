#!/usr/bin/env bash
# scripts/bench-instructions.sh — user-space instructions per I/O of qpath bench's host side,
# counted by valgrind's callgrind: the same total for the same binary and job whatever else
# the machine is doing (repeats agree within 0.2% here), unlike IOPS on a shared machine.
#
#   scripts/bench-instructions.sh                                   # target/release/qpath
#   QPATH_BIN=/path/a QPATH_BIN_B=/path/b CELLS="w32 r32 r1" TOP=25 scripts/bench-instructions.sh
#
# For each cell and binary, `qpath bench` runs under callgrind twice against one `qpath target`
# (the A binary, natively, the embedded default on loopback, one reactor on CPU 0), once over
# SIZE and once over three times SIZE, without time_based: the difference divided by the I/Os
# between them is the cost per I/O without start-up, connection and report. Every thread of
# bench is counted (the job thread does nearly all of it). Kernel work (system calls, TCP, the
# copy of write data into the socket) is not: see scripts/bench-syscalls.sh for system calls.
# The job blocks in the kernel between completions (no hipri), so no spinning is counted;
# under callgrind the host is about 50 times slower than the target, so each wait reaps a
# full queue's answers: the numbers are the cost of the code at its best batching, for A/B.
# TOP=N also prints the N functions with the most instructions per I/O of their own.
#
# Cells: w32 (4k randwrite QD32), r32 (4k randread QD32), r1 (4k randread QD1), w1 (4k
# randwrite QD1), r128k (128k read QD16).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${QPATH_BIN:-$PWD/target/release/qpath}
B=${QPATH_BIN_B:-}
CELLS=${CELLS:-w32 r32 r1}
SIZE_MB=${SIZE_MB:-32}
TOP=${TOP:-0}
for x in "$A" ${B:+"$B"}; do [ -x "$x" ] || { echo "not an executable: $x (cargo build --release -p qpath)"; exit 1; }; done
command -v valgrind > /dev/null || { echo "SKIP: valgrind is not installed"; exit 0; }
command -v callgrind_annotate > /dev/null || { echo "SKIP: callgrind_annotate is not installed (valgrind)"; exit 0; }
W=$(mktemp -d "${TMPDIR:-/tmp}/qpath-bench-instructions.XXXXXX")
TP=
cleanup() { [ -n "$TP" ] && kill "$TP" 2> /dev/null && wait "$TP" 2> /dev/null; rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P1=$(port)
"$A" target --listen "127.0.0.1:$P1" --listen "127.0.0.1:$(port)" --reactors 1 --cpus 0 \
  --rpc-socket "$W/t.sock" > "$W/target.log" 2>&1 &
TP=$!
for _ in $(seq 100); do "$A" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 && break; sleep 0.1; done
"$A" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 || { echo "the target did not start: $(tail -3 "$W/target.log")"; exit 1; }
URI="nvme+tcp://127.0.0.1:$P1/nqn.2026-11.io.qpath:default/1"

cell_args() { # cell -> fio options
  case $1 in
    w32) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
    r32) echo "--rw=randread --bs=4k --iodepth=32" ;;
    r1) echo "--rw=randread --bs=4k --iodepth=1" ;;
    w1) echo "--rw=randwrite --bs=4k --iodepth=1" ;;
    r128k) echo "--rw=read --bs=128k --iodepth=16" ;;
    *) echo "unknown cell '$1' (w32 r32 r1 w1 r128k)" >&2; exit 1 ;;
  esac
}

run_one() { # bin cell size_mb out -> prints the I/O count
  local bin=$1 cell=$2 mb=$3 out=$4
  # shellcheck disable=SC2046
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" bench --output-format=json \
    --output "$W/b.json" -- --name=x --ioengine=qpath $(cell_args "$cell") --size="${mb}m" --thread \
    --direct=1 --filename="$URI" > "$W/bench.log" 2>&1 || { tail -5 "$W/bench.log"; exit 1; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["read"]["total_ios"]+j["write"]["total_ios"])' "$W/b.json"
}

measure() { # label bin cell
  local label=$1 bin=$2 cell=$3 n1 n3 big=$((SIZE_MB * 3))
  n1=$(run_one "$bin" "$cell" "$SIZE_MB" "$W/cg.1")
  n3=$(run_one "$bin" "$cell" "$big" "$W/cg.3")
  python3 - "$W/cg.1" "$W/cg.3" "$n1" "$n3" "$label" "$cell" "$TOP" << 'PY'
import re, subprocess, sys
def load(path):
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--tree=none", "--auto=no", path],
                         capture_output=True, text=True, check=True).stdout
    total, own = 0, {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
        elif not re.search(r"\(\d[\d,]*x\)$", name):
            name = re.sub(r" \[[^]]*\]$", "", name).split(":", 1)[-1]
            own[name] = own.get(name, 0) + n
    return total, own
(t1, o1), (t3, o3) = load(sys.argv[1]), load(sys.argv[2])
ios = int(sys.argv[4]) - int(sys.argv[3])
label, cell, top = sys.argv[5], sys.argv[6], int(sys.argv[7])
print("%-3s %-6s %8.0f instructions per I/O (%d I/Os between the two runs)" % (label, cell, (t3 - t1) / ios, ios))
rows = sorted(((o3.get(k, 0) - o1.get(k, 0)) / ios, k) for k in set(o1) | set(o3))
for v, k in reversed(rows[-top:] if top else []):
    print("      %7.1f  %s" % (v, k[:140]))
PY
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (does not change the counts)"
for cell in $CELLS; do
  cell_args "$cell" > /dev/null
  measure A "$A" "$cell"
  [ -n "$B" ] && measure B "$B" "$cell"
done
