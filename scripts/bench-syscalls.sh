#!/usr/bin/env bash
# scripts/bench-syscalls.sh — system calls per I/O of the host stack, counted by the kernel
# (perf's syscall tracepoints; machine-independent, unlike IOPS): `qpath bench` 4k randread
# at QD32 and QD1 (the job thread spins, qpath bench's way), and `qpath nbd serve` driven by
# `qemu-img bench` 4k reads at QD1 and QD16 (the serving loop sleeps in the kernel, the ublk
# and NBD servers' way). Each against its own `qpath target` (the embedded default, one
# reactor on CPU 0, busy polling) on loopback; the host side on CPU 1.
#
#   scripts/bench-syscalls.sh                       # target/release/qpath, 2 rounds
#   QPATH_BIN=/path/a QPATH_BIN_B=/path/b ROUNDS=3 scripts/bench-syscalls.sh   # A/B, alternating
#
# Prints, per round and binary: IOPS (only ratios within a run mean anything on a shared
# machine), io_uring_enter calls per I/O and all system calls per I/O of the host process
# (for qpath bench: the whole process, so connection setup and the admin queue's keep-alive
# are in it, spread over the run). Needs perf (linux-perf) with syscall tracepoints, root,
# python3, and qemu-img (qemu-utils) for the NBD half (skipped without it).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${QPATH_BIN:-$PWD/target/release/qpath}
B=${QPATH_BIN_B:-}
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
[ -x "$A" ] || { echo "no qpath binary at $A (cargo build --release -p qpath)"; exit 1; }
command -v perf > /dev/null || { echo "SKIP: perf not installed"; exit 0; }
# (grep -c reads everything: grep -q would leave perf a broken pipe, failing under pipefail)
[ "$(perf list 2> /dev/null | grep -c 'syscalls:sys_enter_io_uring_enter')" -gt 0 ] \
  || { echo "SKIP: perf has no syscall tracepoints here (root, tracefs)"; exit 0; }
W=$(mktemp -d "${TMPDIR:-/tmp}/qpath-bench-syscalls.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done; wait 2> /dev/null; rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NQN=nqn.2026-11.io.qpath:default
EVENTS=syscalls:sys_enter_io_uring_enter,raw_syscalls:sys_enter

start_target() { # bin -> sets TP, P1
  P1=$(port)
  "$1" target --listen "127.0.0.1:$P1" --listen "127.0.0.1:$(port)" --reactors 1 --cpus 0 --poll busy \
    --rpc-socket "$W/t.sock" > "$W/target.log" 2>&1 &
  TP=$!
  PIDS+=("$TP")
  for _ in $(seq 100); do "$1" rpc --socket "$W/t.sock" get_target > /dev/null 2>&1 && return; sleep 0.1; done
  echo "the target did not start: $(tail -3 "$W/target.log")"; exit 1
}
stop() { kill "$1" 2> /dev/null || true; wait "$1" 2> /dev/null || true; }
counts() { # perf -x output -> "enters all"
  awk -F, '/io_uring_enter/{e=$1} /raw_syscalls/{a=$1} END{print e+0, a+0}' "$1"
}

bench_one() { # label bin qd
  local label=$1 bin=$2 qd=$3
  start_target "$bin"
  perf stat -x, -e "$EVENTS" -o "$W/perf" -- taskset -c 1 "$bin" bench --output-format=json --output "$W/b.json" \
    -- --name=x --ioengine=qpath --rw=randread --bs=4k --iodepth="$qd" --size=256m --time_based \
    --runtime="$RUNTIME" --filename="nvme+tcp://127.0.0.1:$P1/$NQN/1" > /dev/null 2>&1
  stop "$TP"
  read -r e a <<< "$(counts "$W/perf")"
  python3 - "$W/b.json" "$label" "$qd" "$e" "$a" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
n = r["total_ios"]
print("%-4s qpath bench QD%-3s %9.0f IOPS  io_uring_enter/IO %.3f  syscalls/IO %.3f"
      % (sys.argv[2], sys.argv[3], r["iops"], int(sys.argv[4]) / n, int(sys.argv[5]) / n))
PY
}

nbd_one() { # label bin
  local label=$1 bin=$2 d c t0 t1
  start_target "$bin"
  rm -f "$W/nbd.sock"
  taskset -c 1 "$bin" nbd serve -a 127.0.0.1 -s "$P1" -n "$NQN" --socket "$W/nbd.sock" > "$W/nbd.log" 2>&1 &
  local np=$!
  PIDS+=("$np")
  for _ in $(seq 100); do [ -S "$W/nbd.sock" ] && break; sleep 0.1; done
  for d in 1 16; do
    c=$((d == 1 ? 30000 : 200000))
    perf stat -x, -e "$EVENTS" -p "$np" -o "$W/perf" 2> /dev/null &
    local pp=$!
    sleep 0.3
    t0=$(date +%s.%N)
    qemu-img bench -f raw -t none -c "$c" -d "$d" -s 4096 "nbd+unix:///qpath?socket=$W/nbd.sock" > /dev/null 2>&1
    t1=$(date +%s.%N)
    kill -INT "$pp"
    wait "$pp" 2> /dev/null || true
    read -r e a <<< "$(counts "$W/perf")"
    python3 -c "import sys; c, e, a, t = $c, $e, $a, $t1 - $t0
print('%-4s nbd serve   QD%-3s %9.0f IOPS  io_uring_enter/IO %.3f  syscalls/IO %.3f' % ('$label', $d, c / t, e / c, a / c))"
  done
  stop "$np"
  stop "$TP"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  echo "round $r"
  for qd in 32 1; do
    bench_one A "$A" "$qd"
    [ -n "$B" ] && bench_one B "$B" "$qd"
  done
  if command -v qemu-img > /dev/null; then
    nbd_one A "$A"
    [ -n "$B" ] && nbd_one B "$B"
  else
    echo "SKIP: NBD half: qemu-img not installed (qemu-utils)"
  fi
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
