#!/usr/bin/env bash
# scripts/bench-instructions.sh — user-space instructions per I/O of qpath bench's host side,
# counted by valgrind's callgrind: the same total for the same binary and job whatever else
# the machine is doing (repeats agree within 0.2% here), unlike IOPS on a shared machine.
#
#   scripts/bench-instructions.sh                                   # target/release/qpath
#   QPATH_BIN=/path/a QPATH_BIN_B=/path/b CELLS="w32 r32 r1" TOP=25 scripts/bench-instructions.sh
#   SPDK_DIR=/path/to/spdk CELLS="w32n r32n" scripts/bench-instructions.sh   # beside spdk_nvme_perf
#
# For each cell and binary, `qpath bench` runs under callgrind twice against one `qpath target`
# (the A binary, natively, the embedded default on loopback, one reactor on CPU 0), once over
# SIZE_MB and once over three times that, without time_based: the difference divided by the
# I/Os between them is the cost per I/O without start-up, connection and report. Every thread
# of bench is counted (the job thread does nearly all of it). Kernel work (system calls, TCP,
# the copy of write data into the socket) is not: scripts/bench-syscalls.sh counts system
# calls. The job blocks in the kernel between completions (no hipri), so no spinning is
# counted; under callgrind the host is far slower than the target, so each wait reaps a full
# queue's answers: the numbers are the cost of the code at its best batching, for A/B.
# TOP=N also prints the N functions with the most instructions per I/O of their own.
#
# SPDK_DIR=DIR adds SPDK's `spdk_nvme_perf` (your own build; qpath never builds or ships it)
# against the same target. valgrind cannot run code built for AVX-512: configure that build
# with `--target-arch=x86-64-v2` (one built for this CPU stops with "unsupported cpu type").
# perf busy-polls and runs for a time, not a count, so its polls that find nothing are in its
# total, as many as the machine's speed makes. It runs four times (5 s and 10 s, against the
# target sleeping and busy-polling, so that polls per I/O differ), its I/Os being its IOPS
# times its time and its polls the calls of epoll_wait from its socket group. It prints the
# count per I/O with every poll in it (each mode's two runs differenced: on a quiet machine
# perf polls less than once per I/O, and that is its cost), and, where the runs' polls per
# I/O differ enough, a least-squares fit of total = start + a × I/Os + b × polls, whose a is
# its instructions per I/O without the poll loop's own cost (b per poll). The fit is in perf's
# favour (bench's count includes its one wait per batch) and moves with the runs (2441 and
# 2836 for w32n in two runs here): read it as a range, not to the last instruction. perf keeps no random map (it draws offsets with
# rand_r) and no latency histogram; bench keeps fio's: the norandommap cells compare like
# with like on the first.
#
# Cells: w32 (4k randwrite QD32), r32 (4k randread QD32), r1 (4k randread QD1), w1 (4k
# randwrite QD1), r128k (128k read QD16); w32n and r32n are w32 and r32 with norandommap.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${QPATH_BIN:-$PWD/target/release/qpath}
B=${QPATH_BIN_B:-}
CELLS=${CELLS:-w32 r32 r1}
SIZE_MB=${SIZE_MB:-32}
TOP=${TOP:-0}
PERF=
if [ -n "${SPDK_DIR:-}" ]; then
  PERF=$SPDK_DIR/build/bin/spdk_nvme_perf
  [ -x "$PERF" ] || { echo "not an executable: $PERF"; exit 1; }
fi
for x in "$A" ${B:+"$B"}; do [ -x "$x" ] || { echo "not an executable: $x (cargo build --release -p qpath)"; exit 1; }; done
command -v valgrind > /dev/null || { echo "SKIP: valgrind is not installed"; exit 0; }
command -v callgrind_annotate > /dev/null || { echo "SKIP: callgrind_annotate is not installed (valgrind)"; exit 0; }
W=$(mktemp -d "${TMPDIR:-/tmp}/qpath-bench-instructions.XXXXXX")
TP=
stop_target() { [ -n "$TP" ] && kill "$TP" 2> /dev/null && wait "$TP" 2> /dev/null; TP=; }
trap 'stop_target; rm -rf "$W"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NQN=nqn.2026-11.io.qpath:default
start_target() { # [target options...] -> sets TP, P1, URI
  stop_target
  P1=$(port)
  "$A" target --listen "127.0.0.1:$P1" --listen "127.0.0.1:$(port)" --reactors 1 --cpus 0 "$@" \
    --rpc-socket "$W/t.sock" > "$W/target.log" 2>&1 &
  TP=$!
  for _ in $(seq 100); do "$A" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 && break; sleep 0.1; done
  "$A" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 \
    || { echo "the target did not start: $(tail -3 "$W/target.log")"; exit 1; }
  URI="nvme+tcp://127.0.0.1:$P1/$NQN/1"
}

cell_args() { # cell -> "fio options|perf's rw bs qd"
  case $1 in
    w32) echo "--rw=randwrite --bs=4k --iodepth=32|randwrite 4096 32" ;;
    w32n) echo "--rw=randwrite --bs=4k --iodepth=32 --norandommap|randwrite 4096 32" ;;
    r32) echo "--rw=randread --bs=4k --iodepth=32|randread 4096 32" ;;
    r32n) echo "--rw=randread --bs=4k --iodepth=32 --norandommap|randread 4096 32" ;;
    r1) echo "--rw=randread --bs=4k --iodepth=1|randread 4096 1" ;;
    w1) echo "--rw=randwrite --bs=4k --iodepth=1|randwrite 4096 1" ;;
    r128k) echo "--rw=read --bs=128k --iodepth=16|read 131072 16" ;;
    *) echo "unknown cell '$1' (w32 w32n r32 r32n r1 w1 r128k)" >&2; exit 1 ;;
  esac
}

run_bench() { # bin cell size_mb out -> prints the I/O count
  local args
  args=$(cell_args "$2")
  # shellcheck disable=SC2086
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$4" "$1" bench --output-format=json \
    --output "$W/b.json" -- --name=x --ioengine=qpath ${args%%|*} --size="${3}m" --thread --direct=1 \
    --filename="$URI" > "$W/bench.log" 2>&1 || { tail -5 "$W/bench.log" >&2; exit 1; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["read"]["total_ios"]+j["write"]["total_ios"])' "$W/b.json"
}

run_perf() { # cell secs out -> prints the I/O count
  local rw bs qd args
  args=$(cell_args "$1")
  read -r rw bs qd <<< "${args#*|}"
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$3" "$PERF" -q "$qd" -o "$bs" -w "$rw" \
    -t "$2" -a 1 -c 0x2 -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$P1 subnqn:$NQN" \
    --no-huge -s 512 > "$W/perf.log" 2>&1 || { tail -5 "$W/perf.log" >&2; exit 1; }
  awk -v t="$2" '/^Total/{printf "%d\n", $3 * t}' "$W/perf.log"
}

# The report of runs listed in a file of "callgrind-file I/Os" lines.
report() { # runs-file label cell top mode(diff|fit)
  python3 - "$@" << 'PY'
import re, subprocess, sys
label, cell, top, mode = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
runs = [line.split() for line in open(sys.argv[1]) if line.strip()]
def annotate(path, tree):
    return subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", "--tree=" + tree, path],
                          capture_output=True, text=True, check=True).stdout
def load(path):
    total, own = 0, {}
    for line in annotate(path, "none").splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
        else:
            name = re.sub(r" \[[^]]*\]$", "", name).split(":", 1)[-1]
            own[name] = own.get(name, 0) + n
    return total, own
def polls(path):  # perf's socket-group polls: the calls of epoll_wait from posix_sock_group_impl_poll
    n = 0
    for block in annotate(path, "caller").split("\n\n"):
        if re.search(r"\*\s+\S+:epoll_wait ", block):
            n += sum(int(m.replace(",", "")) for m in re.findall(r"< \S+:posix_sock_group_impl_poll \(([\d,]+)x\)", block))
    return n
def solve(rows, y):  # least squares by the normal equations
    k = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * v for r, v in zip(rows, y))] for i in range(k)]
    for i in range(k):
        for j in range(i + 1, k):
            f = m[j][i] / m[i][i]
            m[j] = [a - f * b for a, b in zip(m[j], m[i])]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (m[i][k] - sum(m[i][j] * x[j] for j in range(i + 1, k))) / m[i][i]
    return x
loaded = [(load(f), int(n)) for f, n in runs]
if mode == "diff":
    ((t1, o1), n1), ((t3, o3), n3) = loaded
    ios = n3 - n1
    print("%-4s %-6s %8.0f instructions per I/O (%d I/Os between the two runs)" % (label, cell, (t3 - t1) / ios, ios))
else:
    p = [polls(f) for f, _ in runs]
    rows = [[1.0, n, q] for (_, n), q in zip(loaded, p)]
    y = [t for (t, _), _ in loaded]
    ratio = ", ".join("%.1f" % (q / n) for (_, n), q in zip(loaded, p))
    # Each target mode's 5 s and 10 s runs, differenced: every poll counted in.
    raw = ["%.0f" % ((y[i + 1] - y[i]) / (rows[i + 1][1] - rows[i][1])) for i in (0, 2)]
    print("%-4s %-6s %8s instructions per I/O with its polls (target sleeping, busy; polls per I/O in the runs: %s)"
          % (label, cell, " / ".join(raw), ratio))
    spread = [q / n for (_, n), q in zip(loaded, p)]
    if max(spread) < 1.5 * min(spread):
        print("                without its polls: not determined (polls per I/O hardly differ between the runs)")
    else:
        c, a, b = solve(rows, y)
        worst = max(abs(v - (c + a * r[1] + b * r[2])) / v for r, v in zip(rows, y))
        print("                without its polls: %.0f per I/O, %.0f per poll (fit within %.1f%%)" % (a, b, 100 * worst))
    sys.exit(0)  # (no list of functions: their counts mix I/Os and polls)
rows = sorted(((o3.get(k, 0) - o1.get(k, 0)) / ios, k) for k in set(o1) | set(o3))
for v, k in reversed(rows[-top:] if top else []):
    print("      %7.1f  %s" % (v, k[:140]))
PY
}

measure_bench() { # label bin cell
  local n1 n3
  n1=$(run_bench "$2" "$3" "$SIZE_MB" "$W/cg.1")
  n3=$(run_bench "$2" "$3" $((SIZE_MB * 3)) "$W/cg.3")
  printf '%s %s\n%s %s\n' "$W/cg.1" "$n1" "$W/cg.3" "$n3" > "$W/runs"
  report "$W/runs" "$1" "$3" "$TOP" diff
}

measure_perf() { # cell
  local mode s n
  : > "$W/runs"
  for mode in sleep busy; do
    if [ $mode = busy ]; then start_target --poll busy; else start_target; fi
    for s in 5 10; do
      n=$(run_perf "$1" $s "$W/cg.p$mode$s")
      echo "$W/cg.p$mode$s $n" >> "$W/runs"
    done
  done
  start_target
  report "$W/runs" perf "$1" "$TOP" fit
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (does not change the counts)"
start_target
for cell in $CELLS; do
  cell_args "$cell" > /dev/null
  measure_bench A "$A" "$cell"
  if [ -n "$B" ]; then measure_bench B "$B" "$cell"; fi
  if [ -n "$PERF" ]; then measure_perf "$cell"; fi
done
