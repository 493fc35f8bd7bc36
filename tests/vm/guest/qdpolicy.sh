#!/bin/sh
# qdpolicy.sh — issue #4 acceptance 5: the Linux host's iopolicy queue-depth (Linux >= 6.11)
# against qpath target with port 1 delayed (the host set `set_port_fault port=1 delay_us=N`
# before the guest booted). fio 4k randread runs once per iopolicy; per-path I/O counts come
# from the hidden per-path block devices' stat files (/sys/block/nvmeXcYn1/stat).
#
# PASS criterion: under queue-depth the undelayed path (port PORT2) completes at least
# QD_MIN_SHARE percent of the I/O (default 55: "most", with a margin; under TCG a guest I/O
# takes several ms by itself, so +2 ms gives at most about 2:1: 66-67% measured on a quiet
# machine, 61% with a load average of 8) and at least 5 points more than under round-robin,
# which, run the same way for contrast, must split
# within 50 +- 15 percent; both fio runs finish with zero errors. Every count is printed
# as "QDPOLICY policy=... delayed=N undelayed=M share=P%".
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), QD_RUNTIME (20), QD_IODEPTH (16),
#   QD_MIN_SHARE (55), QD_DELAY_US (what the host set; printed only)
. /vmlab/qpath-lib.sh
QD_RUNTIME=${QD_RUNTIME:-20}
QD_IODEPTH=${QD_IODEPTH:-16}
QD_MIN_SHARE=${QD_MIN_SHARE:-55}

step "qdpolicy: kernel $(uname -r), target $ADDR:$PORT1 (delayed ${QD_DELAY_US:-?} us) / $PORT2, $NQN"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
connect_both
[ -b "$DEV" ] || { fail "qdpolicy: no multipath block device"; disconnect_all_check; finish; }
S=$(subsys_dir)
C1=$(ctrl_for_port $PORT1); C2=$(ctrl_for_port $PORT2)
P1=$(path_of "$C1"); P2=$(path_of "$C2")
echo "delayed path via $PORT1: $C1/$P1; undelayed path via $PORT2: $C2/$P2"
[ -n "$P1" ] && [ -n "$P2" ] || { fail "qdpolicy: per-path block devices not found"; disconnect_all_check; finish; }

# run_policy POLICY: set it, run fio, print and keep the per-path deltas in D1 D2 SHARE.
run_policy() {
  if echo "$1" > "$S/iopolicy" && [ "$(cat $S/iopolicy)" = "$1" ]; then
    pass "qdpolicy: iopolicy $1 accepted"
  else
    fail "qdpolicy: iopolicy $1 rejected (now $(cat $S/iopolicy))"
  fi
  a1=$(ios_of "$P1"); a2=$(ios_of "$P2")
  fio_check "qd-$1" $((QD_RUNTIME + 120)) --filename="$DEV" --rw=randread --bs=4k --ioengine=libaio \
    --direct=1 --iodepth="$QD_IODEPTH" --size=1G --runtime="$QD_RUNTIME" --time_based
  b1=$(ios_of "$P1"); b2=$(ios_of "$P2")
  D1=$((b1 - a1)); D2=$((b2 - a2))
  SHARE=0
  [ $((D1 + D2)) -gt 0 ] && SHARE=$((D2 * 100 / (D1 + D2)))
  echo "QDPOLICY policy=$1 delayed=$D1 undelayed=$D2 share=$SHARE% ($P1 via $PORT1 delayed, $P2 via $PORT2)"
  ask_host "counters-$1" 30 || echo "(the host did not print its counters)"
}

run_policy queue-depth
QD_D1=$D1; QD_D2=$D2; QD_SHARE=$SHARE
if [ $((QD_D1 + QD_D2)) -gt 0 ] && [ "$QD_SHARE" -ge "$QD_MIN_SHARE" ]; then
  pass "qdpolicy: queue-depth sent $QD_SHARE% of the I/O to the undelayed path ($QD_D2 vs $QD_D1; need >= $QD_MIN_SHARE%)"
else
  fail "qdpolicy: queue-depth sent $QD_SHARE% of the I/O to the undelayed path ($QD_D2 vs $QD_D1; need >= $QD_MIN_SHARE%)"
fi

run_policy round-robin
if [ $((D1 + D2)) -gt 0 ] && [ "$SHARE" -ge 35 ] && [ "$SHARE" -le 65 ]; then
  pass "qdpolicy: round-robin split the I/O evenly ($SHARE% undelayed: $D2 vs $D1)"
else
  fail "qdpolicy: round-robin sent $SHARE% to the undelayed path ($D2 vs $D1; want 35-65%)"
fi
if [ "$QD_SHARE" -ge $((SHARE + 5)) ]; then
  pass "qdpolicy: queue-depth favours the undelayed path $((QD_SHARE - SHARE)) points more than round-robin"
else
  fail "qdpolicy: queue-depth's undelayed share $QD_SHARE% is not 5 points above round-robin's $SHARE%"
fi
echo "QDPOLICY-SUMMARY queue-depth=$QD_SHARE% round-robin=$SHARE% (undelayed share)"
show_ctrls
disconnect_all_check
finish
