//! The Linux kernel NVMe/TCP host, in a vmlab QEMU guest, against `qpath target`:
//! one test per scenario of `tests/vm/run.sh` (what each checks: `tests/vm/README.md`).
//!
//! ```text
//!   netns vmlab                                   QEMU guest (Linux 6.1 or 7.2)
//!   qpath target 10.213.0.1:4420/4421  ◄── tap ──  nvme-tcp host, nvme-cli, fio
//!        ▲ qpath rpc (ANA flips, list_controllers)   │ "QPATH-ASK ..." on the serial console
//!   tests/vm/run.sh ◄─────────────────────────────────┘ replies on TCP 5599
//! ```
//!
//! They need root, QEMU, `/dev/net/tun` and a prepared vmlab (`scripts/install-deps.sh`),
//! take one to two minutes each and share one network namespace, so they are ignored by a
//! plain `cargo test` and run one at a time by `scripts/test.sh`:
//!
//! ```sh
//! cargo build --release -p qpath
//! QPATH_BIN=target/release/qpath cargo test -p qpath --test vm_linux_host -- --ignored --test-threads=1
//! ```
//!
//! Each test skips with a printed reason (and passes) when not root, without QEMU or vmlab,
//! or with `QPATH_SKIP_VM=1`; `tests/vm/run.sh` exits 77 for the finer reasons (no kernel
//! image prepared, no tap device, no tshark) and the test skips on that too.

mod vm_script;

/// Upper bound for one scenario, seconds (the slowest takes about two minutes here).
const SCENARIO_TIMEOUT_S: u32 = 1500;

/// Runs `tests/vm/run.sh --kernel KERNEL [OPTIONS] SCENARIO` and asserts that it passed.
fn run_scenario(kernel: &str, options: &[&str], scenario: &str) {
    let what = format!("vm {scenario} {} on KERNEL={kernel}", options.join(" "));
    let mut args = vec!["--kernel", kernel];
    args.extend_from_slice(options);
    args.push(scenario);
    vm_script::run("tests/vm/run.sh", &args, &what, SCENARIO_TIMEOUT_S);
}

/// Acceptance 1-3 on Linux 6.1, with the run's traffic captured on the tap and decoded
/// by Wireshark's NVMe/TCP dissector.
#[test]
#[ignore = "needs root, QEMU, vmlab and tshark; scripts/test.sh runs it with --ignored"]
fn vm_interop_and_tshark_capture_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &["--capture"], "interop");
}

/// Acceptance 1-2 on Linux 7.2.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_interop_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "interop");
}

/// ANA failover under I/O with iopolicy queue-depth, which 6.1 does not have.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_ana_flip_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "ana");
}

/// Acceptance 4 (file backend survives kill -9 + restart) on Linux 6.1; the target runs
/// with `--persist`, and a host and a namespace added over RPC before the crash are there
/// after it (the guest gets back in by its saved host NQN and verifies namespace 2).
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_file_durability_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &[], "durability");
}

/// Acceptance 4 on Linux 7.2.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_file_durability_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "durability");
}

/// Issue #4 acceptance 5: Linux 7.2's iopolicy queue-depth sends most I/O to the path
/// whose port is not delayed by +2 ms; round-robin splits evenly (per-path sysfs counts).
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_queue_depth_avoids_delayed_port_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "qdpolicy");
}

/// Namespace reservations between two hosts on Linux 6.1: the guest registers and takes
/// Write Exclusive with nvme-cli; `qpath resv` with another Host Identifier gets Reservation
/// Conflict on writes and reads fine, preempts it with Exclusive Access (the guest's reads now
/// fail with EBADE, no failover), and clears it (the guest reads and writes again). Then the
/// guest takes Write Exclusive with CPTPL on (a file namespace with a ptpl_file), the target
/// is killed (-9) and restarted, and after Linux reconnects the reservation is as it was.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_reservations_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &[], "resv");
}

/// Namespace reservations between two hosts on Linux 7.2.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_reservations_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "resv");
}

/// A namespace resized while Linux 6.1 is connected over both ports: the multipath head
/// shows the new size (sysfs, `nvme id-ns`) without a reconnect, takes writes past the old
/// end (fio verify there) and keeps the data at the old end.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_namespace_resize_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &[], "resize");
}

/// A namespace resized while Linux 7.2 is connected.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_namespace_resize_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "resize");
}

/// Issue #3 acceptance 1: our host (`qpath discover`, `connect`, `bench` with
/// verify=crc32c on both ports and with digests) against Linux 6.1's nvmet-tcp.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_our_host_against_nvmet_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &[], "nvmet");
}

/// Issue #3 acceptance 1 against Linux 7.2's nvmet-tcp.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_our_host_against_nvmet_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "nvmet");
}

/// Issue #4 acceptance 3c: `qpath lab flaps --mode nvmet`, our host writing with crc32c
/// verify through a 2-path head while Linux 7.2's nvmet removes and re-adds one port's
/// subsystem link through configfs (5 s of every 10, 2 minutes), then reading back: zero
/// errors, zero verify failures, both paths reconnected.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_path_flaps_against_nvmet_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "flaps");
}

/// The differential conformance suite on Linux 6.1: the same nvme-cli commands (Identify,
/// every log page and feature, data commands, bad input, reservations) against the guest's
/// nvmet and against qpath target; every difference must be one `tests/vm/conformance.py`
/// explains.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_conformance_against_nvmet_linux_6_1_needs_root_and_qemu() {
    run_scenario("bookworm", &[], "conformance");
}

/// The differential conformance suite on Linux 7.2.
#[test]
#[ignore = "needs root, QEMU and vmlab; scripts/test.sh runs it with --ignored"]
fn vm_conformance_against_nvmet_linux_7_2_needs_root_and_qemu() {
    run_scenario("sid", &[], "conformance");
}
