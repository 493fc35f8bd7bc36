#!/usr/bin/env bash
# scripts/bench-nbd.sh — what the NBD export costs, measured on this machine (BENCHMARKS.md,
# "The host as a block device"): the same job through `qpath bench` (the host stack used
# directly) and through `qpath nbd serve` driven by `qemu-img bench`, alternating, ROUNDS
# rounds, against one `qpath target` (the embedded default: a 1 GiB RAM namespace, one
# reactor) on loopback.
#
#   scripts/bench-nbd.sh                   # 3 rounds of 4k sequential reads, QD16, 200k I/Os
#   ROUNDS=5 COUNT=400000 DEPTH=16 BS=4096 RW=read scripts/bench-nbd.sh
#
# Per round it prints IOPS of each, and CPU per I/O: of the qpath bench job thread (its
# usr_cpu + sys_cpu, the host stack and the job's own loop), of the whole `qpath nbd serve`
# process (the host stack, NBD framing, the client socket), and of qemu-img (the client).
# The difference between the first two is what the NBD layer adds per I/O (the bench job's
# own loop is small next to it). qemu-img bench reads sequentially (offset 0, step BS), so
# the bench job is rw=read too; RW=write compares writes (qemu-img bench -w).
# COUNT x BS must fit the 1 GiB namespace (the bench job reads `size` once).
# Needs: qemu-img (qemu-utils), python3, a release build (QPATH_BIN or target/release/qpath).
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QPATH_BIN:-$PWD/target/release/qpath}
ROUNDS=${ROUNDS:-3}
COUNT=${COUNT:-200000}
DEPTH=${DEPTH:-16}
BS=${BS:-4096}
RW=${RW:-read}
command -v qemu-img > /dev/null || { echo "SKIP: qemu-img not installed (qemu-utils)"; exit 0; }
[ -x "$Q" ] || { echo "no qpath binary at $Q (cargo build --release -p qpath)"; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/qpath-bench-nbd.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done; wait 2> /dev/null; rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NQN=nqn.2026-11.io.qpath:default
P1=$(port)
"$Q" target --listen "127.0.0.1:$P1" --listen "127.0.0.1:$(port)" --reactors 1 --rpc-socket "$W/t.sock" \
  > "$W/target.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do "$Q" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 && break; sleep 0.1; done
"$Q" nbd serve -a 127.0.0.1 -s "$P1" -n "$NQN" --socket "$W/nbd.sock" > "$W/nbd.log" 2>&1 &
NBD=$!
PIDS+=($NBD)
for _ in $(seq 100); do [ -S "$W/nbd.sock" ] && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
cat > "$W/job.fio" <<EOF
[job]
ioengine=qpath
filename=nvme+tcp://127.0.0.1:$P1/$NQN/1
rw=$RW
bs=$BS
iodepth=$DEPTH
size=$((COUNT * BS))
EOF
wflag=; [ "$RW" = write ] && wflag=-w
printf '%-6s %-28s %10s %16s %16s\n' round path IOPS "server us/IO" "client us/IO"
for r in $(seq "$ROUNDS"); do
  "$Q" bench "$W/job.fio" --no-baseline --output-format=json --output "$W/bench.json" > /dev/null 2>&1
  python3 - "$W/bench.json" "$r" "$RW" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j[sys.argv[3]]
secs = j["job_runtime"] / 1000.0
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * secs
print("%-6s %-28s %10.0f %16.2f %16s" % (sys.argv[2], "qpath bench (host stack)", d["iops"], cpu / d["total_ios"] * 1e6, "-"))
PY
  t0=$(ticks "$NBD")
  out=$(/usr/bin/time -f '%e %U %S' qemu-img bench $wflag -f raw -t none -c "$COUNT" -d "$DEPTH" -s "$BS" \
    "nbd+unix:///qpath?socket=$W/nbd.sock" 2>&1)
  t1=$(ticks "$NBD")
  read -r wall usr sys <<< "$(echo "$out" | tail -1)"
  python3 - "$r" "$COUNT" "$wall" "$usr" "$sys" "$t0" "$t1" "$HZ" <<'PY'
import sys
r, n, wall, usr, sys_, t0, t1, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
server = (t1 - t0) / hz / n * 1e6
client = (usr + sys_) / n * 1e6
print("%-6s %-28s %10.0f %16.2f %16.2f" % (r, "qemu-img bench -> qpath nbd", n / wall, server, client))
PY
done
echo "qpath nbd serve: $(grep stopped: "$W/nbd.log" || echo running); target log: $(grep -c WARN "$W/target.log" || true) warnings"
