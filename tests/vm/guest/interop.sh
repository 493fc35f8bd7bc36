#!/bin/sh
# interop.sh — the guest kernel's NVMe/TCP host against qpath target (issue #2, acceptance 1-2):
#   nvme discover lists both ports; nvme connect to both gives one multipath namespace with
#   two paths; fio 4k randrw + crc32c verify and a 128k sequential write + verify pass;
#   nvme disconnect-all is clean. One round per entry of ROUNDS ("plain": no digests,
#   "digest": nvme connect -g -G, header and data digests).
# Settings (vmlab.env.*): NQN ADDR PORT1 PORT2 (lib.sh), ROUNDS ("plain digest"),
#   RANDRW_RUNTIME (30 s; 0 = size-bounded by RANDRW_SIZE), RANDRW_SIZE (1G: region, or I/O
#   amount when RANDRW_RUNTIME=0), DIGEST_RUNTIME (= RANDRW_RUNTIME), SEQ_SIZE (128M),
#   IOPOLICY (round-robin: both paths carry I/O)
. /vmlab/qpath-lib.sh
ROUNDS=${ROUNDS:-"plain digest"}
RANDRW_RUNTIME=${RANDRW_RUNTIME:-30}
DIGEST_RUNTIME=${DIGEST_RUNTIME:-$RANDRW_RUNTIME}
RANDRW_SIZE=${RANDRW_SIZE:-1G}
SEQ_SIZE=${SEQ_SIZE:-128M}
IOPOLICY=${IOPOLICY:-round-robin}

step "interop: kernel $(uname -r), $(nproc) vCPU, target $ADDR:$PORT1/$PORT2 $NQN, rounds: $ROUNDS"
modprobe nvme-tcp || fail "modprobe nvme-tcp"
echo "nvme_core multipath=$(cat /sys/module/nvme_core/parameters/multipath)"
discover_check

for round in $ROUNDS; do
  case "$round" in
    plain)  opts=; rt=$RANDRW_RUNTIME ;;
    digest) opts="-g -G"; rt=$DIGEST_RUNTIME ;;
    *) fail "unknown round $round"; continue ;;
  esac
  step "round $round"
  connect_both $opts
  if [ ! -b "$DEV" ]; then
    fail "round $round: no multipath block device, skipping I/O"
    disconnect_all_check
    continue
  fi
  S=$(subsys_dir)
  echo "$IOPOLICY" > "$S/iopolicy" 2>/dev/null
  echo "$(basename $S) iopolicy=$(cat $S/iopolicy)"
  P1=$(path_of "$(ctrl_for_port $PORT1)"); P2=$(path_of "$(ctrl_for_port $PORT2)")
  a1=$(ios_of "$P1"); a2=$(ios_of "$P2")

  if [ "$rt" -gt 0 ]; then
    bound="--size=$RANDRW_SIZE --runtime=$rt --time_based"
  else
    bound="--size=$RANDRW_SIZE"
  fi
  # verify_backlog: verify written blocks while the time-based job runs (not only at the end)
  fio_check "randrw-$round" $((rt + 240)) --filename="$DEV" --rw=randrw --bs=4k --ioengine=libaio \
      --direct=1 --iodepth=16 $bound --verify=crc32c --verify_backlog=1024 --group_reporting
  # 128k writes exceed the in-capsule data size: R2T + H2CData on every write
  fio_check "seqwrite-$round" 300 --filename="$DEV" --rw=write --bs=128k --ioengine=libaio \
      --direct=1 --iodepth=8 --size="$SEQ_SIZE" --verify=crc32c --do_verify=1

  b1=$(ios_of "$P1"); b2=$(ios_of "$P2")
  if [ "$IOPOLICY" = round-robin ]; then
    if [ $((b1 - a1)) -gt 0 ] && [ $((b2 - a2)) -gt 0 ]; then
      pass "round $round: both paths carried I/O ($P1 +$((b1 - a1)), $P2 +$((b2 - a2)))"
    else
      fail "round $round: I/O per path $P1 +$((b1 - a1)), $P2 +$((b2 - a2)) (round-robin should use both)"
    fi
  fi
  disconnect_all_check
done
finish
