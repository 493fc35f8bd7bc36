# tls-lib.sh — the guest set-up every tests/vm-tls scenario shares (busybox sh; run.sh ships
# it as /vmlab/tls-lib.sh; source it after /vmlab/qpath-lib.sh). Sourcing it:
#   - unpacks sid's TLS tools (/vmlab/tls-tools.tar: tlshd, nvme-cli, keyctl and their
#     libraries) into /sid; they run through sid's loader: SIDRUN (a command prefix),
#     sid CMD ARGS..., SNVME (sid's nvme as a command line, so `timeout` can run it);
#   - loads the kernel's TLS: ctr and gcm (gcm(aes); run.sh adds them, the initramfs lacks
#     them) and tls;
#   - writes what tlshd looks up: a hosts file with files-only name service (tlshd names its
#     peer with getnameinfo) and /etc/tlshd/config (the .nvme keyring; tlshd keys the
#     kernel's TLS itself after the handshake: GnuTLS's own kTLS stays off, or the socket
#     already has the "tls" ULP when tlshd sets it).
# Then: start_tlshd (TLSHD = its pid, PASS/FAIL), tlshd_log [N] (its last N lines, 40 by
# default, without key material: tlshd names keys by serial and identity).
step "sid's TLS tools into /sid"
mkdir -p /sid && tar -xf /vmlab/tls-tools.tar -C /sid || fail "unpacking tls-tools.tar"
LD=/sid/usr/lib64/ld-linux-x86-64.so.2; [ -e $LD ] || LD=/sid/lib64/ld-linux-x86-64.so.2
SIDRUN="$LD --library-path /sid/usr/lib/x86_64-linux-gnu"
sid() { $SIDRUN "$@"; }
SNVME="$SIDRUN /sid/usr/sbin/nvme"
for m in ctr gcm; do [ -e /vmlab/mods/$m.ko ] && { insmod /vmlab/mods/$m.ko || fail "insmod $m"; }; done
modprobe tls
printf '127.0.0.1 localhost\n%s vmlab-host\n%s vmlab\n' "$VMLAB_PEER" "$VMLAB_GUEST_IP" > /etc/hosts
printf 'hosts: files\n' > /etc/nsswitch.conf
mkdir -p /etc/tlshd
cat > /etc/tlshd/config <<CONF
[debug]
loglevel=7
tls=0
nl=0
[authenticate]
keyrings=.nvme
[authenticate.client]
[authenticate.server]
CONF
tlshd_log() {
  echo "tlshd's log:"
  grep -v -e NVMeTLSkey -e DHHC-1 /tmp/tlshd.log | grep -v 'priority string' | tail -"${1:-40}"
}
start_tlshd() {
  sid /sid/usr/sbin/tlshd -s -c /etc/tlshd/config >> /tmp/tlshd.log 2>&1 &
  TLSHD=$!
  sleep 1
  kill -0 $TLSHD 2>/dev/null && pass "tlshd running (pid $TLSHD)" || { fail "tlshd exited"; tlshd_log; }
}
