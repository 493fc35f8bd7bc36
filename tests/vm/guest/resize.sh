#!/bin/sh
# resize.sh — a namespace grows while the Linux host is connected. The guest connects both
# ports (one multipath head), checks the size (sysfs, as lsblk reads it, and nvme id-ns),
# writes the last 4 KiB before the old end, asks the host to grow the namespace
# (QPATH-ASK resize-grow: rpc resize_namespace), and must see the new size on the head
# within RESIZE_WAIT seconds without reconnecting: the kernel reads the Changed Namespace
# List after the Namespace Attribute Changed event and revalidates the disk. Then it
# writes and reads back past the old end (dd at both ends of the new part, fio verify over
# its first 64 MiB) and checks the old end's data is unchanged.
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), OLD_BYTES NEW_BYTES (the sizes
# before and after; the host side sets them), RESIZE_WAIT (30)
. /vmlab/qpath-lib.sh
OLD_BYTES=${OLD_BYTES:-1073741824}
NEW_BYTES=${NEW_BYTES:-1610612736}
RESIZE_WAIT=${RESIZE_WAIT:-30}
bytes_of() { echo $(( $(cat "/sys/block/$1/size") * 512 )); }   # what lsblk shows
size_is() { [ "$(bytes_of "$1")" = "$2" ]; }
nsze_of() { nvme id-ns "$1" 2>/dev/null | awk '$1 == "nsze" { print $3 }'; }
md5_at() {   # DEV OFFSET_BYTES: md5 of the 4 KiB there, read with O_DIRECT
  dd if="$1" bs=4096 skip=$(($2 / 4096)) count=1 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1
}
write_at() { # DEV OFFSET_BYTES SEED: 4 KiB of a pattern there, O_DIRECT; prints its md5
  _f=/tmp/pattern-$3
  awk -v s="$3" 'BEGIN { for (i = 0; i < 4096; i++) printf "%c", 33 + (i * 7 + s) % 90 }' > "$_f"
  dd if="$_f" of="$1" bs=4096 seek=$(($2 / 4096)) count=1 oflag=direct conv=notrunc 2>/dev/null || return 1
  md5sum < "$_f" | cut -d' ' -f1
}

step "resize: kernel $(uname -r), target $ADDR:$PORT1/$PORT2 $NQN, $OLD_BYTES -> $NEW_BYTES bytes"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
connect_both
[ -b "$DEV" ] || { fail "resize: no multipath block device"; disconnect_all_check; finish; }
H=$(basename "$DEV")
lbads=$(nvme id-ns "$DEV" | awk '/in use/ { for (i = 1; i <= NF; i++) if ($i ~ /^lbads:/) { split($i, a, ":"); print a[2] } }')
bs=$((1 << ${lbads:-9}))
echo "head $DEV: $(bytes_of "$H") bytes, nsze $(nsze_of "$DEV"), block size $bs"
size_is "$H" "$OLD_BYTES" && pass "resize: $DEV is $OLD_BYTES bytes before (sysfs size)" \
  || fail "resize: $DEV is $(bytes_of "$H") bytes before, want $OLD_BYTES"
[ "$(( $(nsze_of "$DEV") ))" = $((OLD_BYTES / bs)) ] && pass "resize: nvme id-ns nsze $(nsze_of "$DEV") before" \
  || fail "resize: nvme id-ns nsze $(nsze_of "$DEV") before, want $((OLD_BYTES / bs)) blocks"
last_old=$((OLD_BYTES - 4096))
m_old=$(write_at "$DEV" $last_old 1) && pass "resize: wrote the last 4 KiB before the old end" \
  || fail "resize: write at $last_old failed"
past=$(dd if="$DEV" bs=4096 skip=$((OLD_BYTES / 4096)) count=1 iflag=direct 2>/dev/null | wc -c)
[ "$past" = 0 ] && pass "resize: a read past the old end finds the end of the device before the resize" \
  || fail "resize: a read past the old end returned $past bytes before the resize"

t0=$(uptime_s)
ask_host resize-grow && pass "resize: host grew the namespace to $NEW_BYTES bytes" \
  || fail "resize: host did not grow the namespace"
if wait_until "$RESIZE_WAIT" size_is "$H" "$NEW_BYTES"; then
  pass "resize: $DEV is $NEW_BYTES bytes $(( $(uptime_s) - t0 ))s after the request, without a reconnect"
else
  fail "resize: $DEV is $(bytes_of "$H") bytes ${RESIZE_WAIT}s after the request, want $NEW_BYTES"
fi
for c in $(ctrls); do
  p=$(path_of "$c")
  echo "  path $c/$p: $(( $(cat /sys/class/nvme/$c/$p/size 2>/dev/null || echo 0) * 512 )) bytes, state $(ctrl_state "$c")"
done
[ "$(( $(nsze_of "$DEV") ))" = $((NEW_BYTES / bs)) ] && pass "resize: nvme id-ns nsze $(nsze_of "$DEV") after" \
  || fail "resize: nvme id-ns nsze $(nsze_of "$DEV") after, want $((NEW_BYTES / bs)) blocks"
[ "$(echo $(ctrls) | count)" = 2 ] && all_live && pass "resize: both controllers stayed live" \
  || { fail "resize: controllers after the resize:"; show_ctrls; }
dmesg | grep -iE 'nvme.*(capacity|size|change)' | tail -6

step "I/O past the old end"
m1=$(write_at "$DEV" "$OLD_BYTES" 2) && [ "$(md5_at "$DEV" "$OLD_BYTES")" = "$m1" ] \
  && pass "resize: wrote and read back the first 4 KiB past the old end" \
  || fail "resize: the first 4 KiB past the old end did not read back"
last_new=$((NEW_BYTES - 4096))
m2=$(write_at "$DEV" $last_new 3) && [ "$(md5_at "$DEV" $last_new)" = "$m2" ] \
  && pass "resize: wrote and read back the new last 4 KiB" \
  || fail "resize: the new last 4 KiB did not read back"
[ "$(md5_at "$DEV" $last_old)" = "$m_old" ] && pass "resize: the old end's data is unchanged" \
  || fail "resize: the old end's data changed"
fio_check resize-tail 180 --filename="$DEV" --rw=randwrite --bs=4k --ioengine=libaio --direct=1 \
  --iodepth=16 --offset="$OLD_BYTES" --size=64m --verify=crc32c --do_verify=1
show_ctrls
disconnect_all_check
finish
