//! NVMe/TCP over TLS 1.3 with Linux 7.2 in a vmlab QEMU guest: one test per scenario of
//! `tests/vm-tls/run.sh` (what each checks: that script's header).
//!
//! ```text
//!   netns vmlab                                       QEMU guest (Linux 7.2, KERNEL=sid)
//!   qpath target 10.213.0.1:4420/4421 (tls=required) ◄── tap ── nvme connect --tls (tlshd, kTLS)
//!   qpath target 10.213.0.1:4420 (tls=allowed)       ◄── tap ── nvme connect --concat (DH-HMAC-CHAP, then TLS)
//!   qpath connect/bench --tls ── tap ──► nvmet 10.213.0.2:4420/4421 (addr_treq required, tlshd)
//!   qpath bench concat=1      ── tap ──► nvmet 10.213.0.2:4420/4421 (addr_treq not required, tlshd)
//!   in the guest: qpath target (tls ULP) ◄── nvme connect --tls, qpath bench --tls (both kernel TLS)
//!   tshark on the tap: TLS records only              tests/vm-tls/guest/*.sh
//! ```
//!
//! Like `vm_auth.rs` they need root, QEMU, `/dev/net/tun` and a prepared vmlab
//! (`scripts/install-deps.sh`; the guest's tlshd and nvme-cli come from Debian sid through
//! `tests/vm-tls/guest-tools.sh`), take a few minutes and share the network namespace, so a
//! plain `cargo test` ignores them:
//!
//! ```sh
//! cargo build --release -p qpath
//! QPATH_BIN=target/release/qpath cargo test -p qpath --test vm_tls -- --ignored --test-threads=1
//! ```
//!
//! Each test skips with a printed reason (and passes) when not root, without QEMU or vmlab,
//! or with `QPATH_SKIP_VM=1`; `tests/vm-tls/run.sh` exits 77 for the finer reasons (no sid
//! kernel, no TLS in it, the guest tools cannot be fetched) and the test skips on that too.

mod vm_script;

/// Upper bound for one scenario, seconds.
const SCENARIO_TIMEOUT_S: u32 = 1500;

fn run_scenario(scenario: &str) {
    let what = format!("vm-tls {scenario}");
    vm_script::run("tests/vm-tls/run.sh", &["--kernel", "sid", scenario], &what, SCENARIO_TIMEOUT_S);
}

/// A scenario with a key of hash 02 (SHA-384, TLS_AES_256_GCM_SHA384).
fn run_scenario_sha384(scenario: &str) {
    let what = format!("vm-tls --hmac 2 {scenario}");
    vm_script::run("tests/vm-tls/run.sh", &["--kernel", "sid", "--hmac", "2", scenario], &what, SCENARIO_TIMEOUT_S);
}

/// The Linux 7.2 kernel host (`nvme connect --tls`, tlshd) discovers and connects to `qpath
/// target` over TLS on two ports, verifies I/O across an ANA flip and a target restart, and
/// the capture shows TLS records only.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_linux_host_to_qpath_target_needs_root_and_qemu() {
    run_scenario("linux-host");
}

/// `linux-host` with the PSK in the guest's keyring under the older identity (version 0, no
/// digest: what Linux 6.7-6.13 present; 7.2 falls back to it): every channel the target opens
/// shows that identity.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_linux_host_older_identity_to_qpath_target_needs_root_and_qemu() {
    let what = "vm-tls --identity 0 linux-host";
    vm_script::run(
        "tests/vm-tls/run.sh",
        &["--kernel", "sid", "--identity", "0", "linux-host"],
        what,
        SCENARIO_TIMEOUT_S,
    );
}

/// `linux-host` with a key of hash 02 that the guest makes (`nvme gen-tls-key --hmac=2`):
/// every channel runs TLS_AES_256_GCM_SHA384.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_linux_host_sha384_key_to_qpath_target_needs_root_and_qemu() {
    run_scenario_sha384("linux-host");
}

/// `linux-target` with a key of hash 02 (`qpath gen-tls-key --hmac 2`): our host against
/// nvmet and tlshd with TLS_AES_256_GCM_SHA384.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_qpath_host_sha384_key_to_linux_target_needs_root_and_qemu() {
    run_scenario_sha384("linux-target");
}

/// `ktls` with a key of hash 02: kernel TLS with AES-256-GCM on our target and host.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_kernel_tls_sha384_key_on_qpath_target_and_host_needs_root_and_qemu() {
    run_scenario_sha384("ktls");
}

/// `qpath connect --tls` and a two-path `qpath bench` job reach the Linux 7.2 kernel target
/// (nvmet, TLS required on both ports, tlshd serving), a wrong key is refused, and the job
/// keeps its data (crc32c verify) across the loss of one path.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_qpath_host_to_linux_target_needs_root_and_qemu() {
    run_scenario("linux-target");
}

/// The Linux 7.2 kernel host connects with secure channel concatenation (`nvme connect
/// --concat --dhchap-secret`): DH-HMAC-CHAP on a plaintext admin queue, then the admin and
/// I/O queues inside TLS with the generated PSK; verified I/O, a reconnect and a target
/// restart.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_linux_host_concat_to_qpath_target_needs_root_and_qemu() {
    run_scenario("linux-concat");
}

/// A two-path `qpath bench` job connects with secure channel concatenation (`concat=1`) to
/// the Linux 7.2 kernel target (nvmet, TLS allowed, the host's DH-HMAC-CHAP key with a DH
/// group, tlshd serving): DH-HMAC-CHAP on plaintext admin queues, then every queue inside
/// TLS with the PSKs nvmet generated; the job keeps its data (crc32c verify) across a path
/// loss whose reconnect concatenates again.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_qpath_host_concat_to_linux_target_needs_root_and_qemu() {
    run_scenario("linux-target-concat");
}

/// Kernel TLS on qpath's side, inside the Linux 7.2 guest (the `tls` ULP): `qpath target`'s
/// TLS port hands each connection's records to the kernel after the handshake; the guest's
/// Linux host runs fio crc32c verify and `qpath bench` a verified job over it; every queue
/// reports `tls1.3-kernel` and a capture holds TLS records only.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_tls_kernel_tls_on_qpath_target_and_host_needs_root_and_qemu() {
    run_scenario("ktls");
}
