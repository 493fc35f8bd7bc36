//! Running one scenario of a vmlab script (`tests/vm/run.sh`, `tests/vm-auth/run.sh`)
//! from a test: skip with a printed reason where it cannot run, bound its time, and turn
//! its exit status into pass, skip or failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The scripts' exit status for "cannot run on this machine".
const SKIP_RC: i32 = 77;

/// Like `eprintln!`, but not captured by the test harness: a SKIP line must show even when
/// the test passes (libtest captures only the print macros, not writes to the stderr handle).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

fn is_root() -> bool {
    // "Uid:\treal\teffective\tsaved\tfs" in /proc/self/status; std has no geteuid.
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
    })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

fn vmlab_dir() -> PathBuf {
    std::env::var_os("VMLAB_DIR").map_or_else(|| repo_root().join("../shared/vmlab"), PathBuf::from)
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
    let vmlab = vmlab_dir();
    if !vmlab.join("boot.sh").is_file() {
        return Some(format!("no vmlab at {} (set VMLAB_DIR)", vmlab.display()));
    }
    None
}

/// Runs `script` (relative to the repository) with `args` under `timeout -k 10 SECS`
/// and asserts that it passed; `what` names the scenario in the lines it prints. The
/// script's output goes straight to this process's stdout/stderr (not captured by the
/// harness), so a CI log shows its PASS/FAIL lines and the paths of its logs.
pub fn run(script: &str, args: &[&str], what: &str, timeout_s: u32) {
    if let Some(why) = skip_reason() {
        say(&format!("SKIP: {what}: {why}"));
        return;
    }
    let bin = std::env::var_os("QPATH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_qpath")), PathBuf::from);
    if !bin.to_string_lossy().contains("release") {
        say(&format!(
            "note: {} is not a release build; scripts/test.sh passes QPATH_BIN=.../release/qpath",
            bin.display()
        ));
    }
    let path = repo_root().join(script);
    let started = Instant::now();
    let status = Command::new("timeout")
        .args(["-k", "10", &timeout_s.to_string()])
        .arg(&path)
        .args(args)
        .env("QPATH_BIN", &bin)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    let secs = started.elapsed().as_secs();
    match status.code() {
        Some(0) => say(&format!("{what}: passed in {secs} s")),
        Some(SKIP_RC) => say(&format!("SKIP: {what}: {script} cannot run here (its SKIP line says why)")),
        Some(124) => panic!("{what}: timed out after {timeout_s} s"),
        code => panic!("{what}: {script} exited {code:?} after {secs} s; its FAIL lines and log paths are above"),
    }
}
