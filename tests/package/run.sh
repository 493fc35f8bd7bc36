#!/usr/bin/env bash
# tests/package/run.sh DEB — the qpath package on a clean Debian, as an operator installs it.
#
# A Debian 12 "minbase" system with systemd (debootstrap, cached as a tarball under
# $QPATH_PKGTEST_CACHE, default $VMLAB_WORK/qpath-pkgtest or /tmp/vmlab/qpath-pkgtest) is
# unpacked into a temporary directory and booted with systemd-nspawn, with a network of
# its own (loopback only). Inside, tests/package/inside.sh installs the package with
# dpkg -i, starts the service with systemctl (the real unit, sandbox and all), talks to
# it (discovery, RPC, a change saved by --persist, a reload, a restart after kill -9),
# then removes and purges the package and lists what is left.
# Without systemd-nspawn (or with QPATH_PKGTEST_MODE=chroot) it falls back to a chroot:
# dpkg -i, `qpath target` started by hand on the shipped configuration, dpkg -r / --purge;
# no systemd there.
# Needs root and debootstrap; prints "SKIP: reason" and exits 0 where it cannot run.
# Every step is bounded in time; the temporary system is removed at the end.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEB=${1:?usage: tests/package/run.sh path/to/qpath_VERSION_ARCH.deb}
[ -f "$DEB" ] || { echo "no package at $DEB"; exit 1; }
SUITE=${QPATH_PKGTEST_SUITE:-bookworm}
CACHE=${QPATH_PKGTEST_CACHE:-${VMLAB_WORK:-${TMPDIR:-/tmp}/vmlab}/qpath-pkgtest}
INCLUDE=systemd,systemd-sysv
TARBALL=$CACHE/debian-$SUITE-minbase-systemd.tar

skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root: debootstrap, chroot and systemd-nspawn need root"
command -v debootstrap > /dev/null || skip "debootstrap is not installed (apt-get install debootstrap; scripts/install-deps.sh does)"
command -v dpkg-deb > /dev/null || skip "dpkg-deb is not installed"

# ---- the clean system, built once --------------------------------------------------------
if [ ! -s "$TARBALL" ]; then
  mkdir -p "$CACHE"
  build=$(mktemp -d "$CACHE/build.XXXXXX")
  echo "package test: debootstrap --variant=minbase $SUITE (once; cached in $TARBALL)"
  # debootstrap's own default mirror unless QPATH_DEBIAN_MIRROR names another.
  if ! timeout 900 debootstrap --variant=minbase --include=$INCLUDE "$SUITE" "$build/root" \
    ${QPATH_DEBIAN_MIRROR:-} > "$build/debootstrap.log" 2>&1; then
    tail -20 "$build/debootstrap.log"
    rm -rf "$build"
    skip "debootstrap $SUITE failed (no network to the Debian archive?)"
  fi
  tar -C "$build/root" -cf "$TARBALL.new" .
  mv "$TARBALL.new" "$TARBALL"
  rm -rf "$build"
fi

# ---- a fresh copy of it for this run ------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/qpath-pkgtest.XXXXXX")
ROOT=$WORK/root
MOUNTS=()
cleanup() {
  local m
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    m=${MOUNTS[$i]}
    umount "$m" 2> /dev/null || umount -l "$m" 2> /dev/null || true
  done
  # Nothing may still be mounted below ROOT before it is removed.
  if grep -q " $ROOT" /proc/self/mounts; then
    echo "package test: mounts left under $ROOT; not removing it"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
mkdir -p "$ROOT"
timeout 300 tar -C "$ROOT" -xf "$TARBALL"
cp "$DEB" "$ROOT/root/qpath.deb"
cp "$HERE/inside.sh" "$ROOT/root/inside.sh"
chmod +x "$ROOT/root/inside.sh"
echo "package test: $(dpkg-deb --field "$DEB" Package Version Architecture | tr '\n' ' ')on a clean Debian $SUITE"

if command -v systemd-nspawn > /dev/null && [ "${QPATH_PKGTEST_MODE:-boot}" = boot ]; then
  MODE=boot
  # A unit of the test that runs inside.sh once the system is up, then powers it off
  # whatever the outcome.
  cat > "$ROOT/etc/systemd/system/qpath-pkgtest.service" << 'UNIT'
[Unit]
Description=qpath package test
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
Environment=MODE=boot
ExecStart=/root/inside.sh
StandardOutput=file:/root/pkgtest.log
StandardError=inherit
TimeoutStartSec=420
[Install]
WantedBy=multi-user.target
UNIT
  mkdir -p "$ROOT/etc/systemd/system/multi-user.target.wants"
  ln -s /etc/systemd/system/qpath-pkgtest.service "$ROOT/etc/systemd/system/multi-user.target.wants/"
  echo "package test: booting it with systemd-nspawn (a network of its own)"
  rc=0
  timeout 600 systemd-nspawn --quiet --register=no --keep-unit --private-network \
    --machine="qpath-pkgtest-$$" -D "$ROOT" --boot > "$WORK/boot.log" 2>&1 || rc=$?
  if [ ! -f "$ROOT/root/pkgtest.log" ]; then
    tail -40 "$WORK/boot.log"
    echo "FAIL: the container did not run the test (systemd-nspawn exit $rc)"
    exit 1
  fi
else
  MODE=chroot
  echo "package test: a chroot, without systemd (systemd-nspawn boots it: apt-get install systemd-container)"
  for m in proc sys dev dev/pts; do
    mkdir -p "$ROOT/$m"
    case $m in
      proc) mount -t proc proc "$ROOT/proc" ;;
      sys) mount -t sysfs sysfs "$ROOT/sys" ;;
      *) mount --bind "/$m" "$ROOT/$m" ;;
    esac
    MOUNTS+=("$ROOT/$m")
  done
  # The host's network: the target listens on free loopback ports chosen inside.
  timeout 420 chroot "$ROOT" env MODE=chroot PATH=/usr/sbin:/usr/bin:/sbin:/bin /root/inside.sh > "$ROOT/root/pkgtest.log" 2>&1 || true
fi

sed 's/^/    /' "$ROOT/root/pkgtest.log"
if grep -q '^FAIL' "$ROOT/root/pkgtest.log" || ! grep -q '^PASS' "$ROOT/root/pkgtest.log"; then
  echo "package test ($MODE): FAILED"
  exit 1
fi
echo "package test ($MODE): passed"
