#!/bin/sh
# ublk-nvmet scenario, guest side: the guest's own Linux nvmet serves a 256 MiB brd namespace
# (reservations on) on 127.0.0.1:4420 and :4421; `qpath host` serves /dev/ublkb0 over both
# paths; fio verify; then another host (another Host Identifier, `qpath resv`) takes a Write
# Exclusive reservation: the application's writes fail at once with EBADE ("Invalid
# exchange", as with Linux's own NVMe host), its reads go on; clearing it heals the device.
# Settings: UBLK_FIO_RUNTIME (s).
. /vmlab/qpath-lib.sh
. /usr/share/vmlab/nvmet-lib.sh
Q=/vmlab/qpath
SOCK=/tmp/qpath-host.sock
RT=${UBLK_FIO_RUNTIME:-20}
OTHER_ID=51515151-5151-5151-5151-515151515151
OTHER="-a 127.0.0.1 -s 4420 -n $NQN -q nqn.2014-08.org.nvmexpress:uuid:$OTHER_ID --hostid $OTHER_ID"
export RUST_LOG=${GUEST_RUST_LOG:-info}

step "nvmet: brd namespace with reservations, two ports"
[ -c /dev/ublk-control ] || insmod /vmlab/modules/ublk_drv.ko || fail "insmod ublk_drv"
modprobe brd rd_nr=1 rd_size=262144 || fail "brd"
nvmet_subsys "$NQN" || fail "nvmet subsystem"
NS=/sys/kernel/config/nvmet/subsystems/$NQN/namespaces/1
mkdir -p $NS && printf /dev/ram0 > $NS/device_path
if [ -f $NS/resv_enable ]; then echo 1 > $NS/resv_enable && pass "nvmet namespace: reservations enabled"
else fail "this nvmet has no resv_enable (Linux 6.13+)"; fi
echo 1 > $NS/enable
nvmet_port 1 127.0.0.1 4420 && nvmet_port 2 127.0.0.1 4421 && nvmet_link 1 "$NQN" && nvmet_link 2 "$NQN" \
  && pass "nvmet serves $NQN on 127.0.0.1:4420 and :4421" || fail "nvmet ports"

step "qpath host, /dev/ublkb0 on nvmet's namespace over both paths"
$Q host --rpc-socket $SOCK --state-dir /tmp/st > /tmp/host.log 2>&1 &
HOSTPID=$!
wait_until 30 $Q ublk list --rpc-socket $SOCK > /dev/null 2>&1 || { fail "qpath host"; tail /tmp/host.log; finish; }
DEV=$($Q ublk add --rpc-socket $SOCK -a 127.0.0.1 -s 4420 -s 4421 -n "$NQN" -c 1 --iopolicy round-robin 2>/tmp/add.err)
if [ "$DEV" = /dev/ublkb0 ] && [ -b $DEV ]; then pass "qpath ublk add: $DEV ($(cat /sys/block/ublkb0/size) sectors)"
else fail "qpath ublk add: '$DEV' $(cat /tmp/add.err)"; tail -20 /tmp/host.log; finish; fi
fio --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --verify=crc32c --name=nvmet --rw=randrw --bs=4k \
  --iodepth=16 --size=64m --runtime=$RT --time_based --verify_backlog=512 --group_reporting > /tmp/fio.nvmet 2>&1
if grep -q "err= 0" /tmp/fio.nvmet && ! grep -qE "err= *[1-9]|verify: bad|crc32c:" /tmp/fio.nvmet; then
  pass "fio randrw crc32c verify on nvmet through /dev/ublkb0: err=0 ($(grep -E '^ +(read|write): IOPS' /tmp/fio.nvmet | tr -s ' ' | tr '\n' ' '))"
else fail "fio on nvmet:"; grep -E "err=|verify" /tmp/fio.nvmet | head; fi

step "another host takes Write Exclusive: writes fail with EBADE at once, reads go on"
$Q resv $OTHER register --nrkey 0x5151 && $Q resv $OTHER acquire --crkey 0x5151 --rtype 1 \
  && pass "host $OTHER_ID registered and holds Write Exclusive" || fail "qpath resv register/acquire"
$Q resv $OTHER report | head -12
T0=$(cut -d. -f1 /proc/uptime)
out=$(timeout 60 dd if=/dev/zero of=/dev/ublkb0 bs=4k count=1 seek=100 oflag=direct 2>&1); rc=$?
T1=$(cut -d. -f1 /proc/uptime)
echo "dd write: rc=$rc after $((T1 - T0)) s: $out"
if [ $rc != 0 ] && [ $rc != 124 ] && echo "$out" | grep -q "Invalid exchange"; then
  pass "the application's write failed with EBADE (Invalid exchange) in $((T1 - T0)) s, not a hang"
else fail "write under another host's reservation: rc=$rc ($out)"; fi
if timeout 60 dd if=/dev/ublkb0 of=/dev/null bs=4k count=1 skip=100 iflag=direct 2>/dev/null; then
  pass "reads still work under Write Exclusive"
else fail "read under Write Exclusive"; fi
dmesg | grep -iE "ublk|I/O error" | tail -3
$Q resv $OTHER release --crkey 0x5151 --rrela 1 && pass "the other host cleared the reservation" || fail "clear"
if timeout 60 dd if=/dev/zero of=/dev/ublkb0 bs=4k count=1 seek=100 oflag=direct 2>/dev/null; then
  pass "writes work again once the reservation is gone"
else fail "write after the clear"; fi
$Q ublk list --rpc-socket $SOCK --json | grep -E '"errors"|"requests"' | head -4

step "ublk del, nvmet down"
$Q ublk del --rpc-socket $SOCK -n 0 && pass "qpath ublk del" || fail "ublk del"
kill -TERM $HOSTPID; wait_until 20 sh -c "! kill -0 $HOSTPID 2>/dev/null" || fail "qpath host did not stop"
tail -4 /tmp/host.log
nvmet_clear
finish
