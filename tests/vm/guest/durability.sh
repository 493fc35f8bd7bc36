#!/bin/sh
# durability.sh — file backend durability across a target crash (issue #2, acceptance 4).
# Writes a crc32c-tagged pattern with O_DIRECT and an fsync at close, asks the host to
# kill -9 the target and start it again (QPATH-ASK restart-target), waits until the kernel
# host has reconnected both paths by itself (default reconnect_delay / ctrl_loss_tmo), then
# reads everything back: fio --verify_only plus an md5 of the whole region.
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), DUR_MB (64)
. /vmlab/qpath-lib.sh
DUR_MB=${DUR_MB:-64}

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
disconnect_all_check
finish
