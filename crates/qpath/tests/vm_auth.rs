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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// `tests/vm-auth/run.sh`'s exit status for "cannot run on this machine".
const SKIP_RC: i32 = 77;
/// Upper bound for one scenario, seconds.
const SCENARIO_TIMEOUT_S: u32 = 1200;

/// Not captured by the test harness, so a SKIP line shows even when the test passes.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
    })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Why the VM tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    if std::env::var("QPATH_SKIP_VM").is_ok_and(|v| v == "1") {
        return Some("QPATH_SKIP_VM=1".into());
    }
    if !is_root() {
        return Some("needs root (network namespace, tap device)".into());
    }
    if !on_path("qemu-system-x86_64") {
        return Some("qemu-system-x86_64 not installed (scripts/install-deps.sh)".into());
    }
    let vmlab = std::env::var_os("VMLAB_DIR").map_or_else(|| repo_root().join("../shared/vmlab"), PathBuf::from);
    if !vmlab.join("boot.sh").is_file() {
        return Some(format!("no vmlab at {} (set VMLAB_DIR)", vmlab.display()));
    }
    None
}

fn run_scenario(scenario: &str) {
    if let Some(why) = skip_reason() {
        say!("SKIP: vm-auth {scenario}: {why}");
        return;
    }
    let bin = std::env::var_os("QPATH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_qpath")), PathBuf::from);
    let script = repo_root().join("tests/vm-auth/run.sh");
    let started = Instant::now();
    let status = Command::new("timeout")
        .args(["-k", "10", &SCENARIO_TIMEOUT_S.to_string()])
        .arg(&script)
        .args(["--kernel", "sid", scenario])
        .env("QPATH_BIN", &bin)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let secs = started.elapsed().as_secs();
    match status.code() {
        Some(0) => say!("vm-auth {scenario}: passed in {secs} s"),
        Some(SKIP_RC) => {
            say!("SKIP: vm-auth {scenario}: tests/vm-auth/run.sh cannot run here (its SKIP line says why)")
        }
        Some(124) => panic!("vm-auth {scenario}: timed out after {SCENARIO_TIMEOUT_S} s"),
        code => panic!("vm-auth {scenario}: tests/vm-auth/run.sh exited {code:?} after {secs} s; see its FAIL lines"),
    }
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
