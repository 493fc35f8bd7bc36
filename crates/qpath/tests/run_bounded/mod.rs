//! Run the `qpath` binary under test with a deadline, both pipes drained on their own
//! threads so a chatty child never blocks on a full pipe.

#![allow(dead_code)] // each test crate uses a part

use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `cmd` (with its arguments set) is run with `RUST_LOG=warn`; killed, and the test
/// failed, if it runs longer than `timeout`. Returns its status, stdout and stderr.
pub fn run(mut cmd: Command, timeout: Duration) -> (ExitStatus, String, String) {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} ran longer than {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, t_out.join().unwrap(), t_err.join().unwrap())
}

/// Runs `qpath lab <args>` with a plot into a fresh directory; returns the JSON and the SVG.
pub fn run_lab(name: &str, args: &[&str], timeout: Duration) -> (serde_json::Value, String) {
    // One directory per call: tests of one lab run in parallel in one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("qpath-lab-{name}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join(format!("{name}.svg"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.arg("lab").arg(name).args(args).args(["--json", "--plot"]).arg(&plot);
    let (status, stdout, stderr) = run(cmd, timeout);
    assert!(status.success(), "qpath lab {name} failed:\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let svg = std::fs::read_to_string(&plot).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (v, svg)
}

/// The lab's table rows: `n` of them, each with every column, and 0 in each of the
/// `zero` columns (its error counts).
pub fn full_rows<'a>(v: &'a serde_json::Value, n: usize, zero: &[&str]) -> &'a [serde_json::Value] {
    let columns = v["columns"].as_array().unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), n, "{rows:?}");
    for r in rows {
        assert_eq!(r.as_object().unwrap().len(), columns.len(), "{r}");
        for c in zero {
            assert_eq!(r[*c], 0.0, "{c}: {r}");
        }
    }
    rows
}
