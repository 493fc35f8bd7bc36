#!/bin/sh
# tests/vm/guest/nvmet-flaps.sh — the guest side of scenario "flaps" (issue #4 acceptance 3c):
# Linux nvmet-tcp serves $NQN (one brd RAM namespace of NS_SIZE_MB) on ports 1 (4420) and
# 2 (4421), then takes flap commands from the host's `qpath lab flaps --mode nvmet`, one per
# TCP connection to FLAP_PORT:
#   down N   remove the subsystem's link from configfs ports/N/subsystems (nvmet deletes the
#            port's controllers and, with no subsystem left, closes its listener)
#   up N     add the link again (the port listens again)
#   done     stop serving
# It stops on "done" or after SERVE_SECONDS, checks that every "down" had its "up", prints
# the kernel's nvmet messages and tears the target down.
# Settings (vmlab.env.*): NQN, NS_SIZE_MB (256), FLAP_PORT (5600), SERVE_SECONDS (600).
. /usr/share/vmlab/nvmet-lib.sh
. /vmlab/qpath-lib.sh
NS_SIZE_MB=${NS_SIZE_MB:-256}; FLAP_PORT=${FLAP_PORT:-5600}; SERVE_SECONDS=${SERVE_SECONDS:-600}

step "nvmet: $NQN, ${NS_SIZE_MB} MiB brd namespace, ports 1 = 4420, 2 = 4421"
modprobe brd rd_nr=1 rd_size=$((NS_SIZE_MB * 1024)) || { fail "modprobe brd"; finish; }
if nvmet_subsys "$NQN" && nvmet_ns "$NQN" 1 /dev/ram0 \
  && nvmet_port 1 0.0.0.0 4420 && nvmet_link 1 "$NQN" \
  && nvmet_port 2 0.0.0.0 4421 && nvmet_link 2 "$NQN"; then
  pass "nvmet serves $NQN on 4420 and 4421"
else
  fail "nvmet configfs set-up"; finish
fi
echo "VMLAB-READY-FOR-HOST"

downs=0; ups=0; bad=0; down_now=""
end=$(($(uptime_s) + SERVE_SECONDS))
while [ "$(uptime_s)" -lt "$end" ]; do
  line=$(timeout $((end - $(uptime_s) + 1)) nc -l -p "$FLAP_PORT" < /dev/null 2>/dev/null | head -1)
  # shellcheck disable=SC2086 # split "down 1" into words
  set -- $line
  link=$NVMET/ports/${2:-0}/subsystems/$NQN
  case "${1:-}:${2:-}" in
    down:1|down:2)
      if rm "$link"; then downs=$((downs + 1)); down_now="$down_now $2"
        echo "flap: port $2 down (uptime $(cut -d' ' -f1 /proc/uptime))"
      else bad=$((bad + 1)); echo "flap: down $2 failed"; fi ;;
    up:1|up:2)
      if ln -s "$NVMET/subsystems/$NQN" "$link"; then ups=$((ups + 1)); down_now=$(echo "$down_now" | sed "s/ $2//")
        echo "flap: port $2 up (uptime $(cut -d' ' -f1 /proc/uptime))"
      else bad=$((bad + 1)); echo "flap: up $2 failed"; fi ;;
    done:*) echo "flap: done"; break ;;
    :) ;;
    *) bad=$((bad + 1)); echo "flap: unknown command '$line'" ;;
  esac
done

if [ "$downs" -gt 0 ] && [ "$downs" = "$ups" ] && [ "$bad" = 0 ] && [ -z "$down_now" ]; then
  pass "$downs port removals through configfs, each re-added"
else
  fail "flaps: $downs removals, $ups re-adds, $bad failed or unknown commands, still down:${down_now:- none}"
fi
step "kernel log (nvmet, last 30 lines)"
dmesg | grep -i 'nvmet' | tail -30
nvmet_clear
finish
