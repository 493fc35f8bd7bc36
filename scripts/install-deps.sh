#!/usr/bin/env bash
# scripts/install-deps.sh — install what the tests need; idempotent, quiet unless something fails.
#   0. cargo-fuzz and cargo-deb (cargo install), for the fuzz smoke run and the Debian
#      package (scripts/build-deb.sh) of scripts/test.sh; the Python prometheus-client (pip),
#      whose parser checks the /metrics text in a test
#   1. apt packages for the VM interop suite (tests/vm): QEMU, nvme-cli, fio, busybox-static,
#      cpio, kmod, xz-utils, zstd, iproute2, netcat-openbsd, tshark, python3; for the block-device
#      tests qemu-utils (qemu-img, qemu-io), nbd-client, e2fsprogs and util-linux (mkfs.ext4,
#      filefrag, fstrim: copied into the guest); for the package test (tests/package):
#      debootstrap, systemd (systemd-analyze), systemd-container (systemd-nspawn)
#   2. vmlab (../shared/vmlab from the repo root, or $VMLAB_DIR): a Debian kernel and a guest
#      initramfs for KERNEL=bookworm (Linux 6.1) and KERNEL=sid (Linux 7.2), under $VMLAB_WORK
# The Rust toolchain is not installed here. Nothing in this script fails the CI run because the
# VM part cannot be prepared (not root, no vmlab, apt or a kernel download failing): it prints
# "SKIP: ..." or "WARN: ..." with the reason and exits 0; the VM tests then skip themselves
# with a reason of their own.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VMLAB_DIR=${VMLAB_DIR:-$REPO/../shared/vmlab}
PACKAGES="qemu-system-x86 nvme-cli fio busybox-static cpio kmod xz-utils zstd gzip iproute2
  netcat-openbsd tshark python3 qemu-utils nbd-client e2fsprogs util-linux debootstrap systemd
  systemd-container"
KERNELS=${QPATH_VM_KERNELS:-"bookworm sid"}
LOG=$(mktemp "${TMPDIR:-/tmp}/qpath-install-deps.XXXXXX")
trap 'rm -f "$LOG"' EXIT
T0=$SECONDS

note() { echo "install-deps: $*"; }
show_log() { sed 's/^/    /' "$LOG" | tail -40; }

# ---- 0. cargo-fuzz (scripts/fuzz.sh; the test command's fuzz smoke run) ------------------
# A cargo tool, not a system package: installed for the user running CI, root or not.
if command -v cargo > /dev/null && ! cargo fuzz --version > /dev/null 2>&1; then
  if cargo install cargo-fuzz --locked --quiet > "$LOG" 2>&1; then
    note "installed cargo-fuzz ($((SECONDS - T0)) s)"
  else
    note "WARN: cargo install cargo-fuzz failed; the fuzz smoke run will skip:"
    show_log
  fi
fi

# cargo-deb builds the .deb (scripts/build-deb.sh); from crates.io, like cargo-fuzz.
if command -v cargo > /dev/null && ! cargo deb --version > /dev/null 2>&1; then
  t=$SECONDS
  if cargo install cargo-deb --locked --quiet > "$LOG" 2>&1; then
    note "installed cargo-deb ($((SECONDS - t)) s)"
  else
    note "WARN: cargo install cargo-deb failed; the package test will skip:"
    show_log
  fi
fi

# ---- 0b. the Prometheus exposition parser (crates/qpath/tests/observability.rs) -----------
if command -v python3 > /dev/null && ! python3 -c 'import prometheus_client' 2> /dev/null; then
  if python3 -m pip install --quiet --disable-pip-version-check prometheus-client==0.21.1 > "$LOG" 2>&1; then
    note "installed prometheus-client (Python), the Prometheus text parser the metrics test uses"
  else
    note "WARN: pip install prometheus-client failed; the metrics parser test will skip:"
    show_log
  fi
fi

if [ "$(id -u)" != 0 ]; then
  note "SKIP: not root, so no apt-get and no vmlab setup; the VM tests will skip"
  exit 0
fi

# ---- 1. packages -------------------------------------------------------------------------
missing=()
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get > /dev/null; then
    note "WARN: no apt-get; missing packages: ${missing[*]}"
  else
    # tshark asks whether non-root users may capture; answer no, without a prompt
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2> /dev/null
    if apt-get update -qq > "$LOG" 2>&1 \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >> "$LOG" 2>&1; then
      note "installed ${missing[*]} ($((SECONDS - T0)) s)"
    else
      note "WARN: apt-get install ${missing[*]} failed; the tests that need them will skip:"
      show_log
    fi
  fi
fi

# ---- 2. vmlab kernels + initramfs ---------------------------------------------------------
if [ ! -x "$VMLAB_DIR/setup.sh" ]; then
  note "SKIP: no vmlab at $VMLAB_DIR (set VMLAB_DIR); the VM tests will skip"
  exit 0
fi
for k in $KERNELS; do
  t=$SECONDS
  # --skip-apt: the packages above are a superset of setup.sh's list
  if KERNEL=$k timeout 900 "$VMLAB_DIR/setup.sh" --skip-apt > "$LOG" 2>&1; then
    grep -qE 'extracted|initramfs built' "$LOG" && note "vmlab KERNEL=$k prepared ($((SECONDS - t)) s)"
  else
    note "WARN: vmlab setup for KERNEL=$k failed; its VM tests will skip:"
    show_log
  fi
done
exit 0
