//! The qpath host as a Linux block device, in a vmlab QEMU guest (Linux 7.2, which has
//! `ublk_drv` and `nbd`; this machine's kernel has neither): `tests/vm/run.sh`'s scenarios
//! "ublk", "nbd" and "ublk-nvmet" in one boot (what each checks: `tests/vm/README.md`).
//!
//! ```text
//!   netns vmlab                                   QEMU guest (Linux 7.2)
//!   qpath target 10.213.0.1:4420/4421  ◄── tap ──  qpath host ─► /dev/ublkb0 ─► ext4, fio, fstrim
//!     (kill -9 + restart, port flaps)               (kill -9 + restart: user recovery)
//!                                                   qpath nbd serve ◄─ nbd-client ─► /dev/nbd0 ─► fio
//!                                                   Linux nvmet ◄─ qpath host ─► /dev/ublkb0 (reservations)
//! ```
//!
//! Like `vm_linux_host.rs` it needs root, QEMU, `/dev/net/tun` and a prepared vmlab
//! (`scripts/install-deps.sh`), so a plain `cargo test` ignores it; `scripts/test.sh`
//! runs it:
//!
//! ```sh
//! cargo build --release -p qpath
//! QPATH_BIN=target/release/qpath cargo test -p qpath --test vm_blockdev -- --ignored --test-threads=1
//! ```
//!
//! It skips with a printed reason (and passes) when not root, without QEMU or vmlab,
//! or with `QPATH_SKIP_VM=1`.

mod vm_script;

/// Upper bound for the scenario, seconds (it takes about 4 minutes here).
const SCENARIO_TIMEOUT_S: u32 = 1200;

fn run_scenario(scenario: &str) {
    let what = format!("vm {scenario} on KERNEL=sid");
    vm_script::run("tests/vm/run.sh", &["--kernel", "sid", scenario], &what, SCENARIO_TIMEOUT_S);
}

/// One boot of the Linux 7.2 guest (`tests/vm/run.sh --kernel sid blockdev`) running three
/// parts one after the other:
///
/// * ublk: `qpath host` in the guest serves /dev/ublkb0 over both paths of `qpath target`:
///   the device's limits are the namespace's (block sizes, MDTS, discard, write cache); ext4
///   with files verified across a remount; fsync reaching the target as Flush; fstrim
///   reaching it as Deallocate with the trimmed blocks reading zeros; fio randrw crc32c
///   verify while one path flaps every 10 s, across a target kill -9 + restart and across a
///   kill -9 + restart of qpath itself (user recovery): zero errors, zero verify failures; a
///   write past the end fails alone; at most one io_uring_enter per request.
/// * nbd: the guest kernel's nbd (nbd-client) on `qpath nbd serve`: fio randrw crc32c verify
///   while one path flaps, blkdiscard reads back zeros, zero errors.
/// * ublk-nvmet: /dev/ublkb0 on the guest's Linux nvmet namespace: fio verify, then another
///   Host Identifier takes Write Exclusive: the application's write fails at once with
///   EBADE, reads go on, and writes work again once it is cleared.
///
/// About 4 minutes here (`tests/vm/README.md`, "Durations"); the parts also run alone
/// (`run.sh --kernel sid ublk|nbd|ublk-nvmet`).
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_ublk_nbd_and_ublk_on_nvmet_linux_7_2_needs_root_and_qemu() {
    run_scenario("blockdev");
}
