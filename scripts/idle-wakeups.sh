#!/usr/bin/env bash
# idle-wakeups.sh PID [SECONDS] — how often each thread of a running process woke (context
# switches, voluntary and not) over SECONDS (default 5): what `qpath target` or a host
# process costs a machine while it has nothing to do.
#
#   qpath target --poll block &
#   scripts/idle-wakeups.sh $! 5
set -euo pipefail
pid=${1:?usage: $0 PID [SECONDS]}
secs=${2:-5}
[ -d "/proc/$pid/task" ] || { echo "no process $pid" >&2; exit 1; }
snap() {
  local t
  for t in /proc/"$pid"/task/*; do
    printf '%s %s %s\n' "${t##*/}" "$(tr ' ' _ < "$t/comm")" \
      "$(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$t/status")"
  done | sort
}
a=$(snap)
sleep "$secs"
b=$(snap)
join <(echo "$a") <(echo "$b") | awk -v s="$secs" '
  { d = $5 - $3; total += d; printf "%-8s %-20s %6d wake-ups (%.1f/s)\n", $1, $2, d, d / s }
  END { printf "%-29s %6d wake-ups (%.1f/s)\n", "all threads", total, total / s }'
