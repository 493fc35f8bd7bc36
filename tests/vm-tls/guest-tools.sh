#!/usr/bin/env bash
# guest-tools.sh — the Linux TLS tools the vmlab guest needs for NVMe/TCP over TLS, from
# Debian sid: tlshd (ktls-utils: the kernel hands it each TLS handshake), nvme-cli 2.x with
# TLS (`nvme connect --tls`, `nvme check-tls-key --insert`) and keyctl (keyutils), with
# their shared libraries and sid's own C library and loader. The guest's initramfs holds
# this machine's (older) nvme-cli; these run beside it from /sid through sid's loader.
#
#   tests/vm-tls/guest-tools.sh           # -> $VMLAB_WORK/tls-tools.tar (idempotent)
#
# Downloads with apt-get from the isolated sid lists vmlab keeps ($VMLAB_WORK/apt-sid;
# this machine's apt configuration is not changed), unpacks with dpkg-deb, and checks
# that every tool finds all its libraries. Exit 0 with the tarball's path printed; 77
# with "SKIP: reason" when it cannot be made here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VMLAB_DIR=${VMLAB_DIR:-$REPO/../shared/vmlab}
skip() { echo "SKIP: $*"; exit 77; }
[ -f "$VMLAB_DIR/lib.sh" ] || skip "no vmlab at $VMLAB_DIR (set VMLAB_DIR)"
export KERNEL=sid
# shellcheck source=/dev/null
. "$VMLAB_DIR/lib.sh"
OUT=$VMLAB_WORK/tls-tools.tar
W=$VMLAB_WORK/tls-tools
# The tools and the libraries they load (checked below: a missing one fails the script).
PKGS="ktls-utils nvme-cli libnvme1t64 keyutils libkeyutils1 libc6 libglib2.0-0t64 libgnutls30t64
  libnl-3-200 libnl-genl-3-200 libjson-c5 libssl3t64 libp11-kit0 libidn2-0 libunistring5
  libtasn1-6 libnettle8t64 libhogweed6t64 libgmp10 libffi8 libpcre2-8-0 libmount1 libblkid1
  libselinux1 libzstd1 zlib1g libgcc-s1 libatomic1 libuuid1 libdbus-1-3 libsystemd0 libcap2
  liblz4-1 liblzma5 libgcrypt20 libgpg-error0 libbrotli1 liburing2"
TOOLS="usr/sbin/tlshd usr/sbin/nvme bin/keyctl"

[ -s "$OUT" ] && [ "$OUT" -nt "$0" ] && { echo "$OUT"; exit 0; }
command -v dpkg-deb > /dev/null || skip "dpkg-deb missing"
mkdir -p "$W/debs"
if ! ls "$VMLAB_WORK/apt-sid/lists/"*_Packages* > /dev/null 2>&1; then
  apt_iso sid apt-get update -qq > /dev/null 2>&1 || skip "apt-get update (sid lists) failed"
fi
cd "$W/debs"
# Each package alone: one that sid no longer has (renamed) is reported, not fatal here.
for p in $PKGS; do
  ls "${p}"_*.deb > /dev/null 2>&1 && continue
  apt_iso sid apt-get download -qq "$p" > /dev/null 2>&1 || echo "guest-tools: $p: not downloaded" >&2
done
rm -rf "$W/root"; mkdir -p "$W/root"
for d in *.deb; do dpkg-deb -x "$d" "$W/root"; done
R=$W/root
LOADER=$R/usr/lib64/ld-linux-x86-64.so.2
[ -e "$LOADER" ] || LOADER=$R/lib64/ld-linux-x86-64.so.2
[ -e "$LOADER" ] || skip "sid's libc6 did not unpack a loader"
LIBS=$R/usr/lib/x86_64-linux-gnu:$R/lib/x86_64-linux-gnu
for t in $TOOLS; do
  bin=$R/$t; [ -e "$bin" ] || bin=$R/usr/$t
  [ -x "$bin" ] || { echo "guest-tools: $t missing after unpacking" >&2; exit 1; }
  missing=$(LD_TRACE_LOADED_OBJECTS=1 "$LOADER" --library-path "$LIBS" "$bin" 2>&1 | grep "not found" || true)
  [ -z "$missing" ] || { echo "guest-tools: $t: $missing" >&2; exit 1; }
done
# What the guest needs: the tools, libraries, the loader, the C library's data.
tar -C "$R" -cf "$OUT.tmp" --exclude='usr/share/doc' --exclude='usr/share/man' --exclude='usr/share/locale' \
  --exclude='usr/share/lintian' --exclude='usr/lib/systemd' --exclude='etc/systemd' usr etc
mv "$OUT.tmp" "$OUT"
echo "$OUT"
