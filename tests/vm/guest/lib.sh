# tests/vm/guest/lib.sh — helpers for the qpath VM guest scripts (busybox sh, sourced).
# boot.sh puts this file at /vmlab/qpath-lib.sh; the scenario script is /vmlab/run.sh.
#
# Settings (kernel command line, boot.sh --append 'vmlab.env.X=Y'):
#   NQN       subsystem to connect to          (nqn.2026-11.io.qpath:default)
#   ADDR      target address                   ($VMLAB_PEER, the host side of the tap)
#   PORT1 PORT2  the two target ports          (4420 4421)
#   CTL_PORT  TCP port on which the guest waits for the host's replies (5599)
#   EXPECT_KVER  the kernel release the host meant to boot (checked once, below)
#
# Every check prints one "PASS: ..." or "FAIL: ..." line; finish prints
# "QPATH-GUEST-RESULT pass=N fail=M" and exits non-zero when anything failed.
# The guest asks the host for something (flip ANA, restart the target) by printing
# "QPATH-ASK <name>" on the serial console; the host answers "ok <name>" on CTL_PORT.

ADDR=${ADDR:-$VMLAB_PEER}
NQN=${NQN:-nqn.2026-11.io.qpath:default}
PORT1=${PORT1:-4420}
PORT2=${PORT2:-4421}
CTL_PORT=${CTL_PORT:-5599}
NPASS=0
NFAIL=0

pass() { NPASS=$((NPASS + 1)); echo "PASS: $*"; }
fail() { NFAIL=$((NFAIL + 1)); echo "FAIL: $*"; }
step() { echo "== $* (guest uptime $(cut -d' ' -f1 /proc/uptime)s)"; }
uptime_s() { cut -d. -f1 /proc/uptime; }

# finish: summary line, the kernel's nvme messages (evidence), exit status.
finish() {
  step "kernel log (nvme, last 40 lines)"
  dmesg | grep -i 'nvme' | grep -v 'ommand line' | tail -40
  echo "QPATH-GUEST-RESULT pass=$NPASS fail=$NFAIL"
  [ "$NFAIL" = 0 ]
  exit $?
}

# ask_host NAME [TIMEOUT]: print QPATH-ASK NAME and wait for the host's "ok NAME" on CTL_PORT.
ask_host() {
  _name=$1; _t=${2:-90}
  rm -f /tmp/host-reply
  timeout "$_t" nc -l -p "$CTL_PORT" > /tmp/host-reply 2>/dev/null &
  _nc=$!
  sleep 0.5                                  # let nc listen before the host can connect
  echo "QPATH-ASK $_name"
  wait $_nc
  _reply=$(cat /tmp/host-reply 2>/dev/null)
  echo "host replied to $_name: ${_reply:-<nothing within ${_t}s>}"
  [ "$_reply" = "ok $_name" ]
}

# wait_until TIMEOUT CMD...: run CMD once a second until it succeeds (at most TIMEOUT tries).
wait_until() {
  _n=$1; shift
  while [ "$_n" -gt 0 ]; do
    "$@" && return 0
    _n=$((_n - 1)); sleep 1
  done
  return 1
}

# ---- sysfs views ---------------------------------------------------------------------
subsys_dir() {           # the nvme-subsystem directory of $NQN
  for _s in /sys/class/nvme-subsystem/nvme-subsys*; do
    [ -f "$_s/subsysnqn" ] && [ "$(cat "$_s/subsysnqn")" = "$NQN" ] && { echo "$_s"; return 0; }
  done
  return 1
}
ctrls() { _s=$(subsys_dir) && ls "$_s" | grep -E '^nvme[0-9]+$'; }               # controllers
heads() { _s=$(subsys_dir) && ls "$_s" | grep -E '^nvme[0-9]+n[0-9]+$'; }         # multipath heads
count() { wc -w | tr -d ' '; }
ctrl_for_port() {        # controller (nvmeN) of $NQN whose trsvcid is $1
  for _c in $(ctrls); do
    case ",$(cat /sys/class/nvme/$_c/address)," in *",trsvcid=$1,"*) echo "$_c"; return 0 ;; esac
  done
  return 1
}
path_of() { ls "/sys/class/nvme/$1" | grep -E '^nvme[0-9]+c[0-9]+n1$' | head -1; }  # nvmeXcYn1 of ctrl $1
ctrl_state() { cat "/sys/class/nvme/$1/state" 2>/dev/null; }
all_live() {             # both controllers of $NQN exist and are live
  _c=$(ctrls) || return 1
  [ "$(echo $_c | count)" = 2 ] || return 1
  for _x in $_c; do [ "$(ctrl_state $_x)" = live ] || return 1; done
}

# after_restart WHAT T0: the kernel host noticed that the target was killed (not every
# controller live), both controllers are live again within 90 s of T0 (guest uptime), under
# the same multipath head $HEAD; sets DEV to the head.
after_restart() {
  _what=$1; _t0=$2
  _st=$(for c in $(ctrls); do printf '%s=%s ' "$c" "$(ctrl_state $c)"; done)
  if all_live; then fail "$_what: controllers still all live right after the restart ($_st)"
  else pass "$_what: the kernel host noticed the crash ($_st)"; fi
  if wait_until 90 all_live; then
    pass "$_what: both controllers live again $(( $(uptime_s) - _t0 ))s after the request"
  else
    fail "$_what: controllers not live 90 s after the restart"
  fi
  show_ctrls
  dmesg | grep -iE 'nvme' | tail -12
  DEV=/dev/$(heads | head -1)
  [ "$DEV" = "$HEAD" ] && [ -b "$DEV" ] && pass "$_what: same multipath head $HEAD after the reconnect" \
    || fail "$_what: head was $HEAD, now $DEV"
}
multipath_ready() {      # 2 live controllers, 1 head with a block device
  all_live || return 1
  _h=$(heads) || return 1
  [ "$(echo $_h | count)" = 1 ] && [ -b "/dev/$_h" ]
}
show_ctrls() {
  for _c in /sys/class/nvme/nvme*; do
    [ -d "$_c" ] || continue
    echo "  $(basename $_c): state=$(cat $_c/state) address=$(cat $_c/address | tr '\n' ' ')" \
         "queue_count=$(cat $_c/queue_count 2>/dev/null) sqsize=$(cat $_c/sqsize 2>/dev/null)" \
         "subsysnqn=$(cat $_c/subsysnqn 2>/dev/null)"
  done
}
# I/Os completed (reads + writes) by a block device, from its stat file.
ios_of() { awk '{print $1 + $5}' "/sys/block/$1/stat" 2>/dev/null || echo 0; }

# ---- nvme-cli steps -------------------------------------------------------------------
# discover_check: nvme discover on PORT1 lists both ports of $NQN.
discover_check() {
  step "nvme discover -t tcp -a $ADDR -s $PORT1"
  _out=$(timeout 60 nvme discover -t tcp -a "$ADDR" -s "$PORT1" 2>&1); _rc=$?
  echo "$_out"
  [ $_rc = 0 ] && pass "discover: nvme discover rc=0" || fail "discover: nvme discover rc=$_rc"
  for _p in $PORT1 $PORT2; do
    # one entry per port: "trsvcid: 4420" (nvme-cli 2.3 pads the value)
    if echo "$_out" | grep -qE "^trsvcid:[[:space:]]+$_p[[:space:]]*\$"; then
      pass "discover: log page lists trsvcid $_p"
    else
      fail "discover: log page does not list trsvcid $_p"
    fi
  done
  echo "$_out" | grep -q "subnqn:[[:space:]]*$NQN" && pass "discover: log page lists $NQN" \
    || fail "discover: log page does not list $NQN"
}

# connect_both [nvme connect options]: connect both ports, wait for one head with two paths.
connect_both() {
  for _p in $PORT1 $PORT2; do
    step "nvme connect -t tcp -a $ADDR -s $_p -n $NQN $*"
    _out=$(timeout 60 nvme connect -t tcp -a "$ADDR" -s "$_p" -n "$NQN" "$@" 2>&1); _rc=$?
    echo "$_out"
    [ $_rc = 0 ] && pass "connect: port $_p $* rc=0" || fail "connect: port $_p $* rc=$_rc"
  done
  if wait_until 30 multipath_ready; then
    pass "multipath: $(subsys_dir | xargs basename) has controllers [$(ctrls | tr '\n' ' ')] and one head $(heads)"
  else
    fail "multipath: want 2 live controllers + 1 head for $NQN; have controllers [$(ctrls | tr '\n' ' ')] heads [$(heads | tr '\n' ' ')]"
  fi
  show_ctrls
  timeout 30 nvme list-subsys
  timeout 30 nvme list
  DEV=/dev/$(heads | head -1)
}

# disconnect_all_check: nvme disconnect-all, then no controller of $NQN is left.
disconnect_all_check() {
  step "nvme disconnect-all"
  timeout 60 nvme disconnect-all; _rc=$?
  [ $_rc = 0 ] && pass "disconnect-all: rc=0" || fail "disconnect-all: rc=$_rc"
  if wait_until 20 sh -c "! ls /sys/class/nvme/ 2>/dev/null | grep -q ."; then
    pass "disconnect-all: no controllers left"
  else
    fail "disconnect-all: controllers left: $(ls /sys/class/nvme/ | tr '\n' ' ')"; show_ctrls
  fi
}

# ---- fio ------------------------------------------------------------------------------
# fio_check NAME TIMEOUT fio-args...: runs fio, prints its report, and checks exit status,
# every "err=" value, and that no verify failure was printed. Extra check: unless
# FIO_EXPECT_READ=0 (a write-only job), the job must have read something back, so a
# verify that never ran does not pass.
fio_check() {
  _n=$1; _t=$2; shift 2
  step "fio $_n: $*"
  timeout "$_t" fio --name="$_n" "$@" > "/tmp/fio-$_n.log" 2>&1; _rc=$?
  cat "/tmp/fio-$_n.log"
  fio_verdict "$_n" "$_rc"
}
fio_verdict() {          # NAME RC: judge /tmp/fio-NAME.log
  _log=/tmp/fio-$1.log
  _errs=$(grep -oE 'err= *[0-9]+' "$_log" | grep -vcE 'err= *0$')
  _zero=$(grep -cE 'err= *0' "$_log")
  _verr=$(grep -ciE 'verify: bad|verify failed|bad magic|bad header|verify_fatal' "$_log")
  _reads=$(grep -cE '^ +read: IOPS=' "$_log")
  if [ "$2" = 0 ] && [ "$_errs" = 0 ] && [ "$_zero" -ge 1 ] && [ "$_verr" = 0 ] \
     && { [ "${FIO_EXPECT_READ:-1}" = 0 ] || [ "$_reads" -ge 1 ]; }; then
    pass "fio $1: rc=0, err=0, no verify errors ($(grep -E '^ +(read|write): IOPS=' "$_log" | sed 's/,.*//; s/^ *//' | tr '\n' ' '))"
  else
    fail "fio $1: rc=$2 nonzero-err-lines=$_errs err0-lines=$_zero verify-error-lines=$_verr read-lines=$_reads"
    grep -E 'err=|verify|fio:' "$_log" | head -20
  fi
}

# The host names the kernel it booted; a mix-up would make every result misleading.
if [ -n "$EXPECT_KVER" ]; then
  [ "$(uname -r)" = "$EXPECT_KVER" ] && pass "kernel is $EXPECT_KVER" \
    || fail "kernel is $(uname -r), the host meant $EXPECT_KVER"
fi
