//! The qpath host as a Linux block device, in a vmlab QEMU guest (Linux 7.2, which has
//! `ublk_drv` and `nbd`; this machine's kernel has neither): one test per scenario of
//! `tests/vm/run.sh` (what each checks: `tests/vm/README.md`, "ublk", "ublk-nvmet", "nbd").
//!
//! ```text
//!   netns vmlab                                   QEMU guest (Linux 7.2)
//!   qpath target 10.213.0.1:4420/4421  ◄── tap ──  qpath host ─► /dev/ublkb0 ─► ext4, fio, fstrim
//!     (kill -9 + restart, port flaps)               (kill -9 + restart: user recovery)
//!                                                   qpath nbd serve ◄─ nbd-client ─► /dev/nbd0 ─► fio
//!                                                   Linux nvmet ◄─ qpath host ─► /dev/ublkb0 (reservations)
//! ```
//!
//! Like `vm_linux_host.rs` they need root, QEMU, `/dev/net/tun` and a prepared vmlab
//! (`scripts/install-deps.sh`), so a plain `cargo test` ignores them; `scripts/test.sh`
//! runs them one at a time:
//!
//! ```sh
//! cargo build --release -p qpath
//! QPATH_BIN=target/release/qpath cargo test -p qpath --test vm_blockdev -- --ignored --test-threads=1
//! ```
//!
//! Each test skips with a printed reason (and passes) when not root, without QEMU or vmlab,
//! or with `QPATH_SKIP_VM=1`.

mod vm_script;

/// Upper bound for one scenario, seconds (the slowest takes under three minutes here).
const SCENARIO_TIMEOUT_S: u32 = 1200;

fn run_scenario(scenario: &str) {
    let what = format!("vm {scenario} on KERNEL=sid");
    vm_script::run("tests/vm/run.sh", &["--kernel", "sid", scenario], &what, SCENARIO_TIMEOUT_S);
}

/// `qpath host` in the guest serves /dev/ublkb0 over both paths of `qpath target`: ext4 with
/// files verified across a remount, fstrim reaching the target as Deallocate with the trimmed
/// blocks reading zeros, fio randrw crc32c verify while one path flaps every 10 s, across a
/// target kill -9 + restart and across a kill -9 + restart of qpath itself (user recovery):
/// zero errors, zero verify failures; at most one io_uring_enter per request.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_ublk_device_failover_and_recovery_linux_7_2_needs_root_and_qemu() {
    run_scenario("ublk");
}

/// /dev/ublkb0 on the guest's Linux nvmet namespace: fio verify, then another Host Identifier
/// takes a Write Exclusive reservation: the application's write fails at once with EBADE,
/// reads go on, and writes work again once it is cleared.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_ublk_on_linux_nvmet_with_a_reservation_conflict_linux_7_2_needs_root_and_qemu() {
    run_scenario("ublk-nvmet");
}

/// `qpath nbd serve` in the guest, the guest kernel's nbd on it through nbd-client: fio randrw
/// crc32c verify while one path flaps, blkdiscard reads back zeros, zero errors.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_kernel_nbd_on_qpath_nbd_serve_linux_7_2_needs_root_and_qemu() {
    run_scenario("nbd");
}
