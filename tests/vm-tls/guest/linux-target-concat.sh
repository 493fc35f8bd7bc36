#!/bin/sh
# Guest: the Linux kernel NVMe/TCP target (nvmet) set up for secure channel concatenation
# (NVMe Base 2.1 §8.3.4.5, Linux 6.15+), and `qpath` on the host side connecting with it
# (`concat=1` in a bench job's URI, as `nvme connect --concat`). nvmet: ports 4420 and 4421
# with addr_tsas tls1.3 and addr_treq "not required" (the host's first admin connection is
# plaintext), the host's DH-HMAC-CHAP key from /vmlab/dhchap.key with hmac(sha256) and
# ffdhe2048 (concatenation needs a DH group), tlshd serving the handshakes from the .nvme
# keyring, where nvmet puts the PSK each transaction generates. Steps: a qpath bench job
# (randrw 4k, crc32c verify) starts (bench-start); its controller's transaction made an
# NVMe1G key and its queues run inside TLS (tlshd's handshakes); the guest takes port 4420
# away for 8 s and gives it back, so the host reconnects and concatenates again (a new
# NVMe1G key); the job ends with its data verified (bench-check).
# Settings (vmlab.env.*): NQN, HOSTNQN (the host's), PORT1.
. /vmlab/qpath-lib.sh
. /usr/share/vmlab/nvmet-lib.sh
HOSTNQN=${HOSTNQN:?HOSTNQN}
. /vmlab/tls-lib.sh
start_tlshd
# Serials of the NVMe1G keys in the keyring (nvmet inserts one per concatenating
# transaction and revokes the one it replaces).
g_serials() { grep "NVMe1G" /proc/keys | cut -d' ' -f1 | sort; }

step "nvmet: $NQN on $PORT1 and $((PORT1 + 1)), TLS 1.3 allowed (not required), DH-HMAC-CHAP for $HOSTNQN"
modprobe brd rd_nr=1 rd_size=$((256 * 1024))
nvmet_subsys "$NQN" && nvmet_ns "$NQN" 1 /dev/ram0 || fail "nvmet subsystem"
echo 0 > "$NVMET/subsystems/$NQN/attr_allow_any_host"
H=$NVMET/hosts/$HOSTNQN
mkdir -p "$H" && ln -s "$H" "$NVMET/subsystems/$NQN/allowed_hosts/$HOSTNQN" || fail "nvmet host $HOSTNQN"
cat /vmlab/dhchap.key > "$H/dhchap_key" || fail "write dhchap_key"
echo "hmac(sha256)" > "$H/dhchap_hash" || fail "write dhchap_hash"
echo ffdhe2048 > "$H/dhchap_dhgroup" || fail "write dhchap_dhgroup"
echo "nvmet host: hash $(cat $H/dhchap_hash), dhgroup $(cat $H/dhchap_dhgroup)"
id=1
for p in $PORT1 $((PORT1 + 1)); do
  nvmet_port $id 0.0.0.0 $p
  echo tls1.3 > $NVMET/ports/$id/addr_tsas || fail "port $p: addr_tsas tls1.3"
  echo "not required" > $NVMET/ports/$id/addr_treq || fail "port $p: addr_treq not required"
  nvmet_link $id "$NQN"
  id=$((id + 1))
done
grep -H . $NVMET/ports/*/addr_tsas $NVMET/ports/*/addr_treq
dmesg -c > /dev/null

ask_host bench-start 300 || fail "host: bench did not start"
sleep 3
S1=$(g_serials)
n1=$(echo $S1 | wc -w)
[ "$n1" -ge 2 ] && pass "nvmet made $n1 generated PSKs (NVMe1G identity), one per path's controller" \
  || fail "$n1 NVMe1G keys in the keyring: nvmet generated no PSK for a path"
grep "NVMe1G" /proc/keys | sed 's/^[0-9a-f]* //' | cut -c1-90 | head -3
h1=$(grep -c "Handshake with .* succeeded" /tmp/tlshd.log || true)
[ "$h1" -ge 4 ] && pass "tlshd: $h1 successful handshakes (admin and I/O queues of both paths inside TLS)" \
  || { fail "tlshd: $h1 successful handshakes"; tlshd_log; }
dmesg | grep -iE "nvmet" | grep -v DHHC | tail -8

step "path loss: unlink $NQN from port $PORT1 for 8 s (the host reconnects and concatenates again)"
rm "$NVMET/ports/1/subsystems/$NQN" && pass "port $PORT1 unlinked (its connections close)" || fail "unlink port 1"
sleep 8
nvmet_link 1 "$NQN" && pass "port $PORT1 linked again" || fail "link port 1"
new_key() { for s in $(g_serials); do echo "$S1" | grep -qx "$s" || return 0; done; return 1; }
if wait_until 60 new_key; then pass "after the reconnect: a new NVMe1G key (the host concatenated again)"
else fail "no new NVMe1G key after the reconnect"; grep "NVMe1G" /proc/keys | cut -c1-60; fi
ask_host bench-check 400 && pass "host: the bench job verified its data across the reconnect" || fail "host: bench job"
dmesg | grep -iE "nvmet|tls" | grep -v DHHC | tail -15
tlshd_log 20
kill $TLSHD 2>/dev/null
for l in "$NVMET"/subsystems/*/allowed_hosts/*; do [ -L "$l" ] && rm "$l"; done
nvmet_clear
rmdir "$H" 2>/dev/null
finish
