#!/usr/bin/env bash
# scripts/test.sh — the project's single test command (CI: .ci/run = install-deps + this).
#   1. cargo fmt --all --check; .ci/long-fns.sh (no function over 100 lines in host, target,
#      uring, nvme, blk)
#   2. cargo clippy --workspace --all-targets -- -D warnings
#   3. cargo test --workspace                      (debug; the VM tests are #[ignore]d here)
#      and the production configuration: blk, host, target and bench without the labs'
#      features (clippy and tests), the qpath binary without its default features (clippy)
#   4. cargo build --release -p qpath              (the binary the VM tests run as the target)
#      and a 500-seed simulator sweep with it (qpath sim, about 10 s)
#   5. the VM interop suite, one scenario at a time (crates/qpath/tests/vm_linux_host.rs ->
#      tests/vm/run.sh): Linux 6.1 and 7.2 kernel hosts in QEMU against qpath target.
#      Each scenario skips with a reason where it cannot run (not root, no QEMU/vmlab);
#      QPATH_SKIP_VM=1 skips them all.
#      Then the block-device scenarios (crates/qpath/tests/vm_blockdev.rs: ublk, the kernel's
#      nbd on qpath nbd serve, ublk on nvmet; one boot of the Linux 7.2 guest:
#      5-6.5 min measured under load, tests/vm/README.md "Durations").
#   6. the DH-HMAC-CHAP VM suite (crates/qpath/tests/vm_auth.rs -> tests/vm-auth/run.sh), same rules;
#      then the TLS VM suite (crates/qpath/tests/vm_tls.rs -> tests/vm-tls/run.sh).
#   7. every cargo-fuzz target for a few seconds (scripts/fuzz.sh; QPATH_FUZZ_SECS, default 5);
#      skipped with a reason when cargo-fuzz is missing (scripts/install-deps.sh installs it).
#   8. the Debian package (scripts/build-deb.sh) installed, run as a systemd service, removed
#      and purged on a clean Debian booted in a container (tests/package/run.sh); skipped with
#      a reason without cargo-deb, root or debootstrap; QPATH_SKIP_PACKAGE=1 skips it.
# Prints the time of each phase. Measured on the 2-core CI-class machine: see tests/vm/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
phase() { echo; echo "==== [$((SECONDS - T0)) s] $*"; }

phase "cargo fmt --all --check"
cargo fmt --all --check

phase "no function over 100 lines in the I/O path crates (.ci/long-fns.sh)"
.ci/long-fns.sh

phase "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

phase "cargo test --workspace"
cargo test --workspace

# The workspace build turns on every crate's lab features (the lab crate is a member);
# production builds leave them out (docs/design.md, "Lab baselines"): check that build too.
phase "production configuration: blk, host, target, bench without the labs' features"
cargo clippy -p blk -p qpath-host -p qpath-target -p qpath-bench --all-targets -- -D warnings
cargo clippy -p qpath --no-default-features -- -D warnings
cargo test -p blk -p qpath-host -p qpath-target -p qpath-bench

phase "cargo build --release -p qpath"
cargo build --release -p qpath
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR=$PWD/$TARGET_DIR ;; esac

# The workspace tests sweep 24 seeds in a debug build; the release binary sweeps 500 in
# about 10 s (faults such as a namespace replaced under its NSID come up in 1 seed of 13:
# crates/qpath-sim/MUTATIONS.md). The longer sweep: qpath sim --seeds 0..5000.
phase "simulator sweep (qpath sim --seeds 0..500 --steps 5000 --shrink-under-writes, release)"
sim_log=$TARGET_DIR/sim-sweep.log
if "$TARGET_DIR/release/qpath" sim --seeds 0..500 --steps 5000 --shrink-under-writes > "$sim_log"; then
  tail -1 "$sim_log"
else
  tail -3 "$sim_log"; exit 1
fi

phase "VM interop suite (tests/vm, Linux 6.1 + 7.2 hosts against qpath target)"
QPATH_BIN=$TARGET_DIR/release/qpath \
  cargo test -p qpath --test vm_linux_host -- --ignored --test-threads=1

phase "VM block-device suite (tests/vm blockdev: ublk and nbd in one Linux 7.2 guest boot)"
QPATH_BIN=$TARGET_DIR/release/qpath \
  cargo test -p qpath --test vm_blockdev -- --ignored --test-threads=1

phase "VM DH-HMAC-CHAP suite (tests/vm-auth, Linux 7.2 host and target against qpath)"
QPATH_BIN=$TARGET_DIR/release/qpath \
  cargo test -p qpath --test vm_auth -- --ignored --test-threads=1

phase "VM TLS suite (tests/vm-tls, Linux 7.2 host against qpath target over TLS 1.3)"
QPATH_BIN=$TARGET_DIR/release/qpath \
  cargo test -p qpath --test vm_tls -- --ignored --test-threads=1

phase "fuzz smoke run (scripts/fuzz.sh, every target ${QPATH_FUZZ_SECS:-5} s)"
if cargo fuzz --version > /dev/null 2>&1; then
  # Its own target directory: cargo fuzz builds with instrumentation flags of its own.
  CARGO_TARGET_DIR=$TARGET_DIR/fuzz scripts/fuzz.sh "${QPATH_FUZZ_SECS:-5}"
else
  echo "SKIP: cargo-fuzz is not installed (scripts/install-deps.sh installs it); no fuzz smoke run"
fi

phase "Debian package on a clean Debian (scripts/build-deb.sh, tests/package/run.sh)"
if [ "${QPATH_SKIP_PACKAGE:-}" = 1 ]; then
  echo "SKIP: QPATH_SKIP_PACKAGE=1"
elif ! cargo deb --version > /dev/null 2>&1; then
  echo "SKIP: cargo-deb is not installed (scripts/install-deps.sh installs it); no package test"
else
  deb=$(scripts/build-deb.sh --fast | tail -1)
  tests/package/run.sh "$deb"
fi

phase "all tests passed"
