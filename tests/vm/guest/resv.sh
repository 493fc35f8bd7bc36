#!/bin/sh
# resv.sh — NVMe namespace reservations between the Linux host (nvme-cli resv-*) and a second
# host on the target machine (`qpath resv`, another Host Identifier), through one multipath head.
# The guest registers key 0xabc1 and takes Write Exclusive (rtype 1); the host then finds its
# writes refused with Reservation Conflict and its reads allowed (QPATH-ASK resv-foreign-HOSTID),
# preempts the guest's key taking Exclusive Access (QPATH-ASK resv-preempt): the guest's reads
# must now fail and its registration be gone; the host clears everything (QPATH-ASK resv-clear)
# and the guest reads and writes again. The namespace is a file with a ptpl_file (run.sh), so it
# is PTPL capable (rescap 0xff): the guest registers key 0xabc2 with CPTPL on and takes Write
# Exclusive again (report: ptpls 1), the host kill -9s and restarts the target
# (QPATH-ASK resv-restart-HOSTID); once both paths are live again the reservation must be as it
# was (the guest writes; the host's write is refused: QPATH-ASK resv-foreign-after-restart-HOSTID)
# and the guest releases and unregisters.
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh)
. /vmlab/qpath-lib.sh
GUEST_KEY=abc1          # hex, as nvme-cli prints it
PTPL_KEY=abc2           # the guest's key for the persistent (CPTPL) registration
HOST_KEY=5151           # the host's key (run.sh scenario_resv)
OFF=65536               # the guest's test block (byte offset)

# field NAME: the value of a "NAME : VALUE" line of /tmp/out
field() { awk -v k="$1" '$1 == k && $2 == ":" { print $3; exit }' /tmp/out; }
# field_is WHEN NAME WANT: a PASS or FAIL line for the report's field NAME against WANT
field_is() {
  _v=$(field "$2")
  [ "$_v" = "$3" ] && pass "report ($1): $2 $3" || fail "report ($1): $2 '$_v' (want $3)"
}
isnum() { echo "$1" | grep -qE '^(0x[0-9a-fA-F]+|[0-9]+)$'; }   # before any $((...)) of it
# entries: one "rcsts rkey hostid" line per regctlext[] entry of a resv-report --eds in /tmp/out
entries() {
  awk '/^regctlext\[/ { n++ } n && $1 == "rcsts" { r = $3 } n && $1 == "rkey" { k = $3 }
       n && $1 == "hostid" { print r, k, $3 }' /tmp/out
}
# is_guest HOSTID: HOSTID (as nvme-cli printed it) is this guest's. nvme-cli 2.3 prints each of
# the 16 bytes with %x, so a byte below 0x10 loses its leading zero; accept either spelling.
is_guest() { [ "$1" = "$HID" ] || [ "$1" = "$HID_UNPADDED" ]; }
# report: nvme resv-report --eds into /tmp/out; prints it
report() {
  step "nvme resv-report $DEV --eds"
  timeout 30 nvme resv-report "$DEV" --eds > /tmp/out 2>&1; _rc=$?
  cat /tmp/out
  [ $_rc = 0 ] && pass "resv-report --eds ($1): rc=0" || fail "resv-report --eds ($1): rc=$_rc"
}
# one_block read|write: one 4 KiB O_DIRECT I/O of $DEV at $OFF (fio aligns its buffers);
# returns fio's exit status, its log in /tmp/fio-one.log
one_block() {
  timeout 60 fio --name=one --filename="$DEV" --rw="$1" --bs=4k --size=4k --offset=$OFF \
    --direct=1 --ioengine=psync --numjobs=1 > /tmp/fio-one.log 2>&1
}
io_ok() {    # read|write WHEN
  one_block "$1"; _rc=$?
  if [ $_rc = 0 ] && grep -qE 'err= *0' /tmp/fio-one.log; then
    pass "O_DIRECT 4k $1 of $DEV ($2): ok"
  else
    fail "O_DIRECT 4k $1 of $DEV ($2): fio rc=$_rc"; cat /tmp/fio-one.log
  fi
}

step "resv: kernel $(uname -r), $(nvme version | head -1), target $ADDR:$PORT1/$PORT2 $NQN"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
connect_both
[ -b "$DEV" ] || { fail "resv: no multipath block device"; disconnect_all_check; finish; }

# The Host Identifier the target tells this host apart by; both controllers must carry the same.
HID=
for _c in $(ctrls); do
  _h=$(tr -d '-' < /sys/class/nvme/$_c/hostid | tr 'A-F' 'a-f')
  echo "$_c hostid $(cat /sys/class/nvme/$_c/hostid) hostnqn $(cat /sys/class/nvme/$_c/hostnqn)"
  if [ -z "$HID" ]; then HID=$_h
  elif [ "$_h" != "$HID" ]; then fail "resv: controllers carry different Host Identifiers ($HID, $_h)"; fi
done
if echo "$HID" | grep -qE '^[0-9a-f]{32}$'; then pass "resv: guest Host Identifier $HID (both controllers)"
else fail "resv: no usable Host Identifier in sysfs ('$HID')"; disconnect_all_check; finish; fi
HID_UNPADDED=$(echo "$HID" | awk '{ for (i = 1; i < 32; i += 2) { b = substr($0, i, 2); sub(/^0/, "", b); s = s b }; print s }')

step "identify: ONCS and RESCAP"
timeout 30 nvme id-ctrl "$DEV" > /tmp/out 2>&1; _rc=$?
ONCS=$(field oncs)
echo "id-ctrl rc=$_rc oncs=$ONCS"
if [ $_rc = 0 ] && isnum "$ONCS" && [ $((ONCS & 0x20)) != 0 ]; then pass "id-ctrl: oncs $ONCS has bit 5 (reservations)"
else fail "id-ctrl: rc=$_rc oncs '$ONCS' (want bit 5 set)"; fi
timeout 30 nvme id-ns "$DEV" > /tmp/out 2>&1; _rc=$?
RESCAP=$(field rescap)
echo "id-ns rc=$_rc rescap=$RESCAP"
# 0xff: the six types, Ignore Existing Key, and bit 0 (Persist Through Power Loss: a ptpl_file)
if [ $_rc = 0 ] && isnum "$RESCAP" && [ $((RESCAP)) = $((0xff)) ]; then pass "id-ns: rescap $RESCAP (PTPL capable)"
else fail "id-ns: rc=$_rc rescap '$RESCAP' (want 0xff)"; fi

step "register key 0x$GUEST_KEY, acquire Write Exclusive"
timeout 30 nvme resv-register "$DEV" --nrkey=0x$GUEST_KEY --rrega=0; _rc=$?
[ $_rc = 0 ] && pass "resv-register --nrkey=0x$GUEST_KEY --rrega=0: rc=0" || fail "resv-register: rc=$_rc"
timeout 30 nvme resv-acquire "$DEV" --crkey=0x$GUEST_KEY --rtype=1 --racqa=0; _rc=$?
[ $_rc = 0 ] && pass "resv-acquire --crkey=0x$GUEST_KEY --rtype=1 --racqa=0: rc=0" || fail "resv-acquire: rc=$_rc"
report "held by the guest"
E=$(entries)
echo "entries (rcsts rkey hostid): $E"
field_is "held by the guest" rtype 1
field_is "held by the guest" regctl 1
set -- $E
if [ $# = 3 ] && [ "$1" = 1 ] && [ "$2" = "$GUEST_KEY" ] && is_guest "$3"; then
  pass "report: the one entry holds (rcsts 1), key $2, the guest's hostid"
else
  fail "report: want one entry 'rcsts 1 key $GUEST_KEY hostid $HID', got '$E'"
fi
io_ok write "the guest holds Write Exclusive"

step "the host, another Host Identifier, against the guest's reservation"
ask_host "resv-foreign-$HID" && pass "host: write refused (Reservation Conflict), read allowed, report names the guest" \
  || fail "host: its checks against the guest's Write Exclusive failed (see the host's lines)"

step "the host preempts the guest's key, taking Exclusive Access"
ask_host resv-preempt && pass "host: registered 0x$HOST_KEY and preempted 0x$GUEST_KEY with rtype 2" \
  || fail "host: preempt failed"
one_block read; _rc=$?
cat /tmp/fio-one.log
_err=$(grep -oE 'fio: io_u error.*' /tmp/fio-one.log | head -1)
echo "what Linux gave fio for the read: ${_err:-nothing}"
if [ $_rc != 0 ] && echo "$_err" | grep -q 'Invalid exchange'; then
  pass "O_DIRECT 4k read fails once the guest is preempted (Exclusive Access held by another host): $_err"
else
  fail "O_DIRECT 4k read after the preempt: fio rc=$_rc, '${_err:-no io_u error}' (want a failure with EBADE 'Invalid exchange')"
fi
# The kernel completes a Reservation Conflict as an error, without failing over to the other
# path: 7.x logs "reservation conflict error", 6.1 (BLK_STS_NEXUS) "critical nexus error".
dmesg | tail -5
if dmesg | grep -qE 'reservation conflict error|critical nexus error'; then
  pass "kernel log: $(dmesg | grep -E 'reservation conflict error|critical nexus error' | tail -1 | sed 's/^\[[^]]*\] //')"
else
  fail "kernel log: no reservation conflict / nexus error line for the failed read"
fi
report "after the preempt"
E=$(entries)
echo "entries (rcsts rkey hostid): $E"
field_is "after the preempt" rtype 2
field_is "after the preempt" regctl 1
set -- $E
if [ $# = 3 ] && [ "$1" = 1 ] && [ "$2" = "$HOST_KEY" ] && ! is_guest "$3"; then
  pass "report: the guest is no longer registered; the holder is host $3 with key $2"
else
  fail "report: want one entry 'rcsts 1 key $HOST_KEY' of another host, got '$E'"
fi

step "the host clears the reservation"
ask_host resv-clear && pass "host: release --rrela 1 (clear)" || fail "host: clear failed"
io_ok read "after the clear"
io_ok write "after the clear"
report "after the clear"
field_is "after the clear" rtype 0
field_is "after the clear" regctl 0

# holds_ptpl WHEN: the report in /tmp/out shows Write Exclusive held by the guest with key
# $PTPL_KEY as the only registrant, and PTPL on
holds_ptpl() {
  E=$(entries)
  echo "entries (rcsts rkey hostid): $E"
  field_is "$1" rtype 1
  field_is "$1" ptpls 1
  field_is "$1" regctl 1
  set -- "$1" $E
  if [ $# = 4 ] && [ "$2" = 1 ] && [ "$3" = "$PTPL_KEY" ] && is_guest "$4"; then
    pass "report ($1): the one entry holds (rcsts 1), key $3, the guest's hostid"
  else
    fail "report ($1): want one entry 'rcsts 1 key $PTPL_KEY hostid $HID', got '$(echo $E)'"
  fi
}

step "persist through power loss: register key 0x$PTPL_KEY with CPTPL on, acquire Write Exclusive"
timeout 30 nvme resv-register "$DEV" --nrkey=0x$PTPL_KEY --rrega=0 --cptpl=3; _rc=$?
[ $_rc = 0 ] && pass "resv-register --nrkey=0x$PTPL_KEY --rrega=0 --cptpl=3: rc=0" || fail "resv-register --cptpl=3: rc=$_rc"
timeout 30 nvme resv-acquire "$DEV" --crkey=0x$PTPL_KEY --rtype=1 --racqa=0; _rc=$?
[ $_rc = 0 ] && pass "resv-acquire --crkey=0x$PTPL_KEY --rtype=1 --racqa=0: rc=0" || fail "resv-acquire: rc=$_rc"
report "held with PTPL on"
holds_ptpl "before the restart"
# Get Features 83h (Reservation Persistence) is namespace-specific: bit 0 is PTPL
_out=$(timeout 30 nvme get-feature "$DEV" -f 0x83 -n 1 2>&1); _rc=$?
echo "$_out"
_val=$(echo "$_out" | sed -n 's/.*[Cc]urrent value: *\(0x[0-9a-fA-F]*\).*/\1/p' | head -1)
if [ $_rc = 0 ] && isnum "$_val" && [ $((_val & 1)) = 1 ]; then pass "get-feature -f 0x83 -n 1: value $_val (PTPL on)"
else fail "get-feature -f 0x83 -n 1: rc=$_rc value '$_val' (want bit 0 set)"; fi

step "the host kills (-9) and restarts the target"
HEAD=$DEV
t0=$(uptime_s)
ask_host "resv-restart-$HID" 180 && pass "host: target killed (-9) and restarted; the ptpl_file named the guest as holder" \
  || fail "host: the restart or its checks failed (see the host's lines)"
after_restart restart "$t0"

report "after the restart"
holds_ptpl "after the restart"
io_ok write "the guest still holds Write Exclusive after the restart"
ask_host "resv-foreign-after-restart-$HID" && pass "host: after the restart its write is still refused, its read allowed, the report names the guest" \
  || fail "host: its checks against the guest's reservation after the restart failed (see the host's lines)"

step "release and unregister"
timeout 30 nvme resv-release "$DEV" --crkey=0x$PTPL_KEY --rtype=1 --rrela=0; _rc=$?
[ $_rc = 0 ] && pass "resv-release --crkey=0x$PTPL_KEY --rtype=1 --rrela=0: rc=0" || fail "resv-release: rc=$_rc"
timeout 30 nvme resv-register "$DEV" --crkey=0x$PTPL_KEY --rrega=1; _rc=$?
[ $_rc = 0 ] && pass "resv-register --crkey=0x$PTPL_KEY --rrega=1 (unregister): rc=0" || fail "resv-register --rrega=1: rc=$_rc"
report "after release and unregister"
field_is "after release and unregister" rtype 0
field_is "after release and unregister" regctl 0
io_ok write "after the release"

show_ctrls
disconnect_all_check
finish
