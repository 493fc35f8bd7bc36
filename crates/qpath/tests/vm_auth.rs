//! DH-HMAC-CHAP interop with Linux 7.2 in a vmlab QEMU guest: one test per scenario of
//! `tests/vm-auth/run.sh` (what each checks: that script's header).
//!
//! ```text
//!   netns vmlab                                       QEMU guest (Linux 7.2, KERNEL=sid)
//!   qpath target 10.213.0.1:4420  ◄──────── tap ───── nvme connect --dhchap-secret [--dhchap-ctrl-secret]
//!   qpath connect -S [-C]         ─────────────────►  nvmet, configfs hosts/<nqn>/dhchap_*
//!   tests/vm-auth/run.sh ◄── "QPATH-AUTH ... key=DHHC-1:..." + "QPATH-ASK ..." on the serial console
//! ```
//!
//! Like `vm_linux_host.rs` they need root, QEMU, `/dev/net/tun` and a prepared vmlab
//! (`scripts/install-deps.sh`), take about a minute each and share the network namespace,
//! so a plain `cargo test` ignores them:
//!
//! ```sh
//! cargo build --release -p qpath
//! QPATH_BIN=target/release/qpath cargo test -p qpath --test vm_auth -- --ignored --test-threads=1
//! ```
//!
//! Each test skips with a printed reason (and passes) when not root, without QEMU or vmlab,
//! or with `QPATH_SKIP_VM=1`; `tests/vm-auth/run.sh` exits 77 for the finer reasons (no
//! sid kernel prepared, no nvme-auth module) and the test skips on that too.

mod vm_script;

/// Upper bound for one scenario, seconds.
const SCENARIO_TIMEOUT_S: u32 = 1200;

fn run_scenario(scenario: &str) {
    let what = format!("vm-auth {scenario}");
    vm_script::run("tests/vm-auth/run.sh", &["--kernel", "sid", scenario], &what, SCENARIO_TIMEOUT_S);
}

/// The Linux 7.2 kernel host (`nvme connect --dhchap-secret --dhchap-ctrl-secret`, secrets from
/// `nvme gen-dhchap-key`) authenticates to `qpath target`, moves data, and is refused with wrong secrets.
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_auth_linux_host_to_qpath_target_needs_root_and_qemu() {
    run_scenario("linux-host");
}

/// `qpath connect -S [-C]` authenticates to the Linux 7.2 kernel target (nvmet configfs dhchap_*).
#[test]
#[ignore = "needs root, QEMU and vmlab; run with --ignored (see the file's doc)"]
fn vm_auth_qpath_host_to_linux_target_needs_root_and_qemu() {
    run_scenario("linux-target");
}
