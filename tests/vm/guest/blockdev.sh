#!/bin/sh
# blockdev scenario, guest side: the three block-device scenarios in one boot (what CI runs),
# one after the other, each a script of its own (/vmlab/part-*.sh, the host puts them there)
# with its own PASS:/FAIL: lines: ublk.sh (/dev/ublkb0 over qpath target here), nbd.sh (the
# kernel's nbd on qpath nbd serve) and ublk-nvmet.sh (/dev/ublkb0 on this guest's nvmet).
# Each part ends with its own device deleted and its qpath process stopped.
. /vmlab/qpath-lib.sh
for part in ublk nbd ublk-nvmet; do
  step "part $part"
  case $part in
    ublk-nvmet) UBLK_FIO_RUNTIME=${UBLK_NVMET_FIO_RUNTIME:-20} sh /vmlab/part-$part.sh; rc=$? ;;
    *) sh /vmlab/part-$part.sh; rc=$? ;;
  esac
  [ $rc = 0 ] && pass "part $part passed" || fail "part $part failed (exit $rc)"
done
finish
