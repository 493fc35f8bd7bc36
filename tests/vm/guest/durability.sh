#!/bin/sh
# durability.sh — file backend durability across a target crash (issue #2, acceptance 4).
# Writes a crc32c-tagged pattern with O_DIRECT and an fsync at close; fills the next
# ZONE_MB with random data, then deallocates and zeroes ranges of it: blkdiscard twice,
# one `nvme dsm --ad` with three ranges in one command, `nvme write-zeroes` with and
# without DEAC, and an `nvme flush`. Asks the host to kill -9 the target and start it again
# (QPATH-ASK restart-target), waits until the kernel host has reconnected both paths by
# itself (default reconnect_delay / ctrl_loss_tmo), then reads everything back: fio
# --verify_only, an md5 of the pattern, every deallocated or zeroed range reads zeros and the
# zone's md5 is the one read before the crash.
# The target runs with --persist: before the crash the guest asks the host for the
# operator's changes (QPATH-ASK persist-changes: this host allowed by name and no other, a
# second namespace added over RPC); the namespace must appear here without a reconnect
# (the namespace-changed event), take a fio pattern, and after the crash the guest must get
# back in (its host NQN was saved) and read the pattern back from it.
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), DUR_MB (64), ZONE_MB (16)
. /vmlab/qpath-lib.sh
DUR_MB=${DUR_MB:-64}
ZONE_MB=${ZONE_MB:-16}
MB=1048576
ZONE=$((DUR_MB * MB))                     # the zone starts where the fio pattern ends
# The ranges the guest deallocates or zeroes, "offset:length" in bytes from the zone's start.
DISCARDS="$((1 * MB)):262144 $((3 * MB)):$MB"
DSM_RANGES="$((5 * MB)):65536 $((7 * MB + 4096)):131072 $((9 * MB)):524288"
WZ_RANGE="$((11 * MB)):262144"
WZ_DEAC_RANGE="$((13 * MB)):65536"

# zeros_at WHAT OFF:LEN: the range (from the zone's start) reads as zeros.
zeros_at() {
  _off=$((ZONE + ${2%%:*})); _len=${2##*:}
  _got=$(timeout 60 dd if="$DEV" bs=4096 skip=$((_off / 4096)) count=$((_len / 4096)) iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
  _want=$(dd if=/dev/zero bs=4096 count=$((_len / 4096)) 2>/dev/null | md5sum | cut -d' ' -f1)
  [ "$_got" = "$_want" ] && pass "$1: $_len bytes at zone+${2%%:*} read zeros" \
    || fail "$1: $_len bytes at zone+${2%%:*} do not read zeros"
}
zone_md5() { timeout 120 dd if="$DEV" bs=1M skip="$DUR_MB" count="$ZONE_MB" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }
all_zero_ranges() { echo $DISCARDS $DSM_RANGES $WZ_RANGE $WZ_DEAC_RANGE; }

step "durability: kernel $(uname -r), target $ADDR:$PORT1/$PORT2 $NQN, ${DUR_MB} MiB"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
connect_both
[ -b "$DEV" ] || { fail "durability: no multipath block device"; disconnect_all_check; finish; }
HEAD=$DEV
job="--filename=$DEV --rw=write --bs=128k --ioengine=libaio --direct=1 --iodepth=8 --size=${DUR_MB}M --verify=crc32c"
FIO_EXPECT_READ=0
fio_check dur-write 300 $job --do_verify=0 --fsync_on_close=1 --verify_state_save=0
FIO_EXPECT_READ=1
before=$(timeout 120 dd if="$DEV" bs=1M count="$DUR_MB" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
echo "md5 of the first $DUR_MB MiB before the crash: $before"

step "deallocate and zero ranges of the next $ZONE_MB MiB"
NAME=$(basename "$DEV")
for f in discard_max_bytes write_zeroes_max_bytes write_zeroes_unmap_max_bytes; do
  [ -f "/sys/block/$NAME/queue/$f" ] && echo "  queue/$f = $(cat /sys/block/$NAME/queue/$f)"
done
dlfeat=$(nvme id-ns "$DEV" 2>/dev/null | awk '$1 == "dlfeat" {print $3}')
[ "$dlfeat" = 9 ] && pass "durability: id-ns dlfeat 9 (deallocated blocks read zeros, Write Zeroes DEAC)" \
  || fail "durability: id-ns dlfeat '${dlfeat}', want 9 on a file namespace"
[ "$(cat /sys/block/$NAME/queue/discard_max_bytes)" -gt 0 ] && pass "durability: the kernel discards to this namespace" \
  || fail "durability: discard_max_bytes is 0"
# Linux 6.17+ lets Write Zeroes unmap only when DLFEAT promises zeros (nvme_update_ns_info_block).
if [ -f "/sys/block/$NAME/queue/write_zeroes_unmap_max_bytes" ]; then
  [ "$(cat /sys/block/$NAME/queue/write_zeroes_unmap_max_bytes)" -gt 0 ] \
    && pass "durability: Write Zeroes may unmap (write_zeroes_unmap_max_bytes > 0)" \
    || fail "durability: write_zeroes_unmap_max_bytes is 0"
fi
SS=$(blockdev --getss "$DEV")
timeout 120 dd if=/dev/urandom of="$DEV" bs=1M seek="$DUR_MB" count="$ZONE_MB" oflag=direct conv=fsync 2>/dev/null \
  && pass "durability: $ZONE_MB MiB of random data at $DUR_MB MiB" || fail "durability: filling the zone"
for r in $DISCARDS; do
  blkdiscard -o $((ZONE + ${r%%:*})) -l "${r##*:}" "$DEV" && pass "blkdiscard -o zone+${r%%:*} -l ${r##*:}" \
    || fail "blkdiscard -o zone+${r%%:*} -l ${r##*:}"
done
slbs=""; blocks=""
for r in $DSM_RANGES; do
  slbs="$slbs${slbs:+,}$(((ZONE + ${r%%:*}) / SS))"; blocks="$blocks${blocks:+,}$((${r##*:} / SS))"
done
timeout 60 nvme dsm "$DEV" --ad --slbs="$slbs" --blocks="$blocks" && pass "nvme dsm --ad: 3 ranges in one command ($slbs / $blocks)" \
  || fail "nvme dsm --ad --slbs=$slbs --blocks=$blocks"
r=$WZ_RANGE
timeout 60 nvme write-zeroes "$DEV" --start-block=$(((ZONE + ${r%%:*}) / SS)) --block-count=$((${r##*:} / SS - 1)) \
  && pass "nvme write-zeroes (no DEAC) at zone+${r%%:*}" || fail "nvme write-zeroes at zone+${r%%:*}"
r=$WZ_DEAC_RANGE
timeout 60 nvme write-zeroes "$DEV" --deac --start-block=$(((ZONE + ${r%%:*}) / SS)) --block-count=$((${r##*:} / SS - 1)) \
  && pass "nvme write-zeroes --deac at zone+${r%%:*}" || fail "nvme write-zeroes --deac at zone+${r%%:*}"
timeout 60 nvme flush "$DEV" && pass "nvme flush" || fail "nvme flush"
for r in $(all_zero_ranges); do zeros_at "before the crash" "$r"; done
zone_before=$(zone_md5)
echo "md5 of the zone before the crash: $zone_before"

step "the operator's changes over RPC, saved by --persist"
two_heads() { [ "$(heads | count)" = 2 ]; }
ask_host persist-changes 60 && pass "durability: host added this host's NQN and namespace 2 over RPC" \
  || fail "durability: host did not make the changes"
if wait_until 30 two_heads; then pass "durability: namespace 2 appeared without a reconnect: heads $(heads | tr '\n' ' ')"
else fail "durability: namespace 2 did not appear: heads $(heads | tr '\n' ' ')"; fi
NS2=/dev/$(heads | grep -vx "$(basename "$HEAD")" | head -1)
timeout 30 nvme list
job2="--filename=$NS2 --rw=write --bs=128k --ioengine=libaio --direct=1 --iodepth=8 --size=32M --verify=crc32c"
FIO_EXPECT_READ=0
fio_check ns2-write 300 $job2 --do_verify=0 --fsync_on_close=1 --verify_state_save=0
FIO_EXPECT_READ=1

t0=$(uptime_s)
ask_host restart-target 180 && pass "durability: host killed (-9) and restarted the target" \
  || fail "durability: host did not restart the target"
# The kernel host must have seen the connections drop (else the read-back below could not
# tell a restarted target from the old one); it reconnects every reconnect_delay (10 s).
after_restart durability "$t0"
cur=$DEV

fio_check dur-verify 300 $job --verify_only --verify_state_load=0
after=$(timeout 120 dd if="$cur" bs=1M count="$DUR_MB" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
echo "md5 after the restart: $after"
[ -n "$before" ] && [ "$before" = "$after" ] && pass "durability: md5 of $DUR_MB MiB unchanged across kill -9 + restart" \
  || fail "durability: md5 before $before, after $after"
DEV=$cur
if wait_until 30 two_heads && [ -b "$NS2" ]; then pass "durability: namespace 2 ($NS2) is there after the restart"
else fail "durability: namespace 2 is gone after the restart: heads $(heads | tr '\n' ' ')"; fi
fio_check ns2-verify 300 $job2 --verify_only --verify_state_load=0
for r in $(all_zero_ranges); do zeros_at "after the restart" "$r"; done
zone_after=$(zone_md5)
echo "md5 of the zone after the restart: $zone_after"
[ -n "$zone_before" ] && [ "$zone_before" = "$zone_after" ] \
  && pass "durability: the zone (deallocated and zeroed ranges, the rest random) unchanged across kill -9 + restart" \
  || fail "durability: zone md5 before $zone_before, after $zone_after"
disconnect_all_check
finish
