#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 20 s each), or
# until RUNS executions when RUNS is set. Installs cargo-fuzz when missing.
# Works on the stable toolchain: targets are built with `-s none` (no
# sanitizer flags that need nightly); libFuzzer's coverage still applies.
#   scripts/fuzz.sh [SECONDS]          # CI: bounded smoke run
#   RUNS=10000000 scripts/fuzz.sh      # long local run, prints execution counts
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-20}
if ! command -v cargo-fuzz >/dev/null 2>&1 && ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${TMPDIR:-/tmp}/qpath-fuzz-target}
cargo fuzz build -s none >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/qpath-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
status=0
for t in $(cargo fuzz list); do
  mkdir -p "$work/$t"
  if [ -n "${RUNS:-}" ]; then limit=(-runs="$RUNS"); else limit=(-max_total_time="$secs"); fi
  if out=$(cargo fuzz run -s none "$t" "$work/$t" "corpus/$t" -- "${limit[@]}" -print_final_stats=1 2>&1); then
    runs=$(printf '%s\n' "$out" | sed -n 's/^stat::number_of_executed_units: *//p' | tail -1)
    echo "fuzz: $t: ${runs:-?} executions, no crash"
  else
    echo "fuzz: $t: FAILED"; printf '%s\n' "$out" | tail -40; status=1
  fi
done
exit $status
