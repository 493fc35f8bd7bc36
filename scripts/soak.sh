#!/usr/bin/env bash
# scripts/soak.sh [--minutes N] [--out DIR] — a bounded soak of our host against our target.
#
# Starts `qpath target` (one file namespace in DIR on a free loopback port, its own RPC socket;
# a file, not RAM, so that the target's RSS is its own memory, not the data) and runs,
# back to back until the time is up, `qpath bench` jobs with verify=crc32c (a mixed 4k randrw
# 70/30 job and a 128k sequential write+verify job at once). Every bench run is a new host
# process (a host restart); every DROP_EVERY seconds the target drops every connection
# (`set_port_fault drop_connections`) and the running host must reconnect and carry on.
# Every SAMPLE_EVERY seconds the target's RSS and open descriptors go to DIR/samples.csv.
#
# Passes when every bench run ended with zero errors (verify included) and, after the warm-up
# (the first 20% of the time, at least one minute), neither RSS nor descriptors grew 5% or more:
# the maximum over the last quarter of the samples against the maximum over the first quarter
# after the warm-up (maxima, because a sample may fall between two host runs).
#   scripts/soak.sh                 # 10 minutes
#   scripts/soak.sh --minutes 2     # a short one
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes N] [--out DIR]" >&2; exit 2 ;;
  esac
done
SAMPLE_EVERY=${SAMPLE_EVERY:-10}
DROP_EVERY=${DROP_EVERY:-10}
RUN_SECS=${RUN_SECS:-30}

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/qpath-soak.XXXXXX")}
mkdir -p "$out"
cargo build --release -q -p qpath
bin=${CARGO_TARGET_DIR:-target}/release/qpath
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=nqn.2026-11.io.qpath:soak
sock=$out/rpc.sock
cat > "$out/target.toml" <<EOF
[reactor]
reactors = 1
poll = "block"
[[port]]
id = 1
addr = "127.0.0.1:$port"
[[subsystem]]
nqn = "$nqn"
allow_any_host = true
[[subsystem.namespace]]
backend = "file"
path = "$out/ns.img"
size = "192M"
EOF
RUST_LOG=warn "$bin" target --config "$out/target.toml" --rpc-socket "$sock" > "$out/target.log" 2>&1 &
tpid=$!
bpid=
cleanup() {
  [ -n "$bpid" ] && kill "$bpid" 2> /dev/null || true
  kill "$tpid" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -f "$out/ns.img"
}
trap cleanup EXIT
for _ in $(seq 100); do "$bin" rpc --socket "$sock" list_queues > /dev/null 2>&1 && break; sleep 0.1; done

url="nvme+tcp://127.0.0.1:$port/$nqn/1?reconnect_delay=1&ctrl_loss_tmo=60"
bench() {
  "$bin" bench --output-format=json -- \
    --name=mix --ioengine=qpath --rw=randrw --rwmixread=70 --bs=4k --iodepth=16 --verify=crc32c \
    --offset=0 --size=128M --runtime="$RUN_SECS" --time_based=1 --filename="$url" \
    --name=seq --ioengine=qpath --rw=write --bs=128k --iodepth=4 --verify=crc32c \
    --offset=128M --size=64M --filename="$url"
}

# Besides RSS and descriptors, each sample records where the memory is: the anonymous part
# of RSS, the resident part of the main heap (glibc's brk arena; other threads' arenas are
# anonymous mappings), and the buffer pools' outstanding and cached bytes (summed
# over reactors) with their allocation and release counts, and the number of live queues
# (connections), from the target's own stats.
pool_py='
import json, sys
d = json.load(sys.stdin)
s = lambda k: sum(x["buffer_" + k] for x in d["reactors"])
print(s("outstanding_bytes") // 1024, s("cached_bytes") // 1024, s("allocations"), s("released"), len(d["queues"]),
      sep=",")'
sample() {
  local rss anon heap fds pool
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$tpid/status")
  anon=$(awk '/^RssAnon:/ {print $2}' "/proc/$tpid/status")
  heap=$(awk '/\[heap\]/ {h = 1; next} h && /^Rss:/ {print $2; exit}' "/proc/$tpid/smaps")
  fds=$(ls "/proc/$tpid/fd" | wc -l)
  pool=$("$bin" rpc --socket "$sock" stats 2> /dev/null | python3 -c "$pool_py" 2> /dev/null || echo ",,,,")
  echo "$(($(date +%s) - t0)),$rss,$fds,$anon,${heap:-0},$pool" >> "$out/samples.csv"
}

echo "seconds,rss_kib,fds,anon_kib,heap_kib,pool_outstanding_kib,pool_cached_kib,pool_allocations,pool_released,queues" \
  > "$out/samples.csv"
t0=$(date +%s)
end=$((t0 + minutes * 60))
runs=0 failed=0 drops=0
next_sample=$t0 next_drop=$((t0 + DROP_EVERY))
while [ "$(date +%s)" -lt "$end" ]; do
  kill -0 "$tpid" 2> /dev/null || { echo "soak: the target died" >&2; exit 1; }
  runs=$((runs + 1))
  bench > "$out/run-$runs.json" 2> "$out/run-$runs.err" &
  bpid=$!
  run_start=$(date +%s)
  while kill -0 "$bpid" 2> /dev/null; do
    now=$(date +%s)
    if [ "$now" -ge "$next_sample" ]; then sample; next_sample=$((next_sample + SAMPLE_EVERY)); fi
    # Drops hit running I/O, not a host's first connect (which, like `nvme connect`, fails
    # instead of retrying): a drop due in a run's first 3 s waits.
    if [ "$now" -ge "$next_drop" ] && [ $((now - run_start)) -ge 3 ]; then
      "$bin" rpc --socket "$sock" set_port_fault '{"port": 1, "drop_connections": true}' > /dev/null
      drops=$((drops + 1)); next_drop=$((now + DROP_EVERY))
    fi
    # Bounded: a run may take its runtime plus reconnects, never 5 minutes.
    if [ "$now" -ge $((end + 300)) ]; then echo "soak: bench run $runs hung" >&2; kill "$bpid"; fi
    sleep 1
  done
  rc=0; wait "$bpid" || rc=$?
  bpid=
  errs=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(j["error"] for j in d["jobs"]))' \
    "$out/run-$runs.json" 2> /dev/null || echo parse)
  if [ "$rc" != 0 ] || [ "$errs" != 0 ]; then
    failed=$((failed + 1)); echo "soak: run $runs failed (exit $rc, errors $errs): $out/run-$runs.err" >&2
  fi
done
sample
# Host-side evidence that the drops were ridden through (a host warns once per reconnect;
# a drop between two host runs finds nothing to drop).
reconnects=$(cat "$out"/run-*.err | grep -c "I/O queue failed" || true)

warm=$((minutes * 60 / 5)); [ "$warm" -lt 60 ] && warm=60
verdict=$(python3 - "$out/samples.csv" "$warm" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["seconds"]) >= int(sys.argv[2])]
if len(rows) < 8:
    print(f"too few samples after the warm-up ({len(rows)}): run longer"); sys.exit(0)
q = len(rows) // 4
bad = []
for k in ("rss_kib", "fds"):
    first = max(int(r[k]) for r in rows[:q]); last = max(int(r[k]) for r in rows[-q:])
    g = 100.0 * (last - first) / first
    print(f"{k} {first} -> {last} ({g:+.1f}%)", end="; ")
    if g >= 5.0: bad.append(k)
print("FAIL: grew " + ", ".join(bad) if bad else "ok")
EOF
)
echo "soak: $minutes min, $runs host runs, $drops target-side drops ($reconnects host reconnects)," \
  "$failed failed runs; $verdict"
echo "soak: samples in $out/samples.csv"
[ "$failed" = 0 ] && [[ "$verdict" == *ok ]]
