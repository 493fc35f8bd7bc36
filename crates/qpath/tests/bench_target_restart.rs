//! Issue 3, acceptance 5: `qpath target` (a separate process, file backend) is killed with
//! SIGKILL in the middle of a `qpath bench` write job with `verify=crc32c` and started again
//! on the same port and file inside `ctrl_loss_tmo`. The host reconnects, re-sends what was
//! in flight, and the job ends with zero errors, every block written and every block read
//! back and checked.
//!
//! The backing file lives in the page cache across the kill (a process crash, not a power
//! loss), so what the dead target acknowledged is still there for the verify pass.

mod loopback;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:restart";
/// The job writes this many 4 KiB blocks, then reads each back.
const JOB_BYTES: u64 = 64 << 20;

fn qpath() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
    c.env("RUST_LOG", "warn");
    c
}

/// A target process; killed with SIGKILL when dropped if still running.
struct Target(Child);

impl Target {
    fn start(config: &Path, sock: &Path) -> Target {
        let _ = std::fs::remove_file(sock);
        let child = qpath()
            .args(["target", "--config"])
            .arg(config)
            .arg("--rpc-socket")
            .arg(sock)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn qpath target");
        let t = Target(child);
        let t0 = Instant::now();
        while rpc(sock, "list_queues").is_none() {
            assert!(t0.elapsed() < Duration::from_secs(20), "target RPC never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        t
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL the target");
        self.0.wait().unwrap();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rpc(sock: &Path, method: &str) -> Option<Value> {
    let out = qpath().args(["rpc", "--socket"]).arg(sock).arg(method).stderr(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Writes the target has completed on its I/O queues (its own per-queue counters).
fn target_writes(sock: &Path) -> u64 {
    let Some(Value::Array(queues)) = rpc(sock, "list_queues") else { return 0 };
    queues.iter().map(|q| q["stats"]["writes"].as_u64().unwrap_or(0)).sum()
}

#[test]
fn target_killed_and_restarted_during_a_verify_job() {
    let dir = std::env::temp_dir().join(format!("qpath-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let img: PathBuf = dir.join("ns1.img");
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"{}\"\nsize = \"128M\"\n",
            img.display()
        ),
    )
    .unwrap();
    let sock = dir.join("rpc.sock");
    let target = Target::start(&config, &sock);

    // reconnect_delay=1: the host retries every second (Linux's default is 10 s).
    let filename = format!("--filename=nvme+tcp://127.0.0.1:{port}/{NQN}/1?reconnect_delay=1&ctrl_loss_tmo=60");
    let size = format!("--size={JOB_BYTES}");
    let mut bench = qpath()
        .args(["bench", "--output-format=json", "--", "--name=restart", "--ioengine=qpath", "--rw=randwrite"])
        .args(["--bs=4k", "--iodepth=16", "--verify=crc32c", &size, &filename])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qpath bench");

    // Kill the target once the job is well under way but far from done.
    let blocks = JOB_BYTES / 4096;
    let t0 = Instant::now();
    let at_kill = loop {
        let w = target_writes(&sock);
        if w >= 500 {
            break w;
        }
        assert!(bench.try_wait().unwrap().is_none(), "bench ended before the target saw 500 writes");
        assert!(t0.elapsed() < Duration::from_secs(120), "the job never got going ({w} writes)");
        std::thread::sleep(Duration::from_millis(5));
    };
    target.kill();
    assert!(at_kill < blocks, "killed mid-job: {at_kill} of {blocks} writes done");
    assert!(bench.try_wait().unwrap().is_none(), "the job waits for the controller, it does not fail");
    std::thread::sleep(Duration::from_millis(1500));
    let target = Target::start(&config, &sock);

    let t0 = Instant::now();
    let mut after = 0;
    let status = loop {
        if let Some(s) = bench.try_wait().unwrap() {
            break s;
        }
        after = after.max(target_writes(&sock));
        assert!(t0.elapsed() < Duration::from_secs(240), "bench did not finish after the restart");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = bench.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "bench failed\nstderr:\n{stderr}\nstdout:\n{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{stdout}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert_eq!(job["write"]["io_bytes"].as_u64(), Some(JOB_BYTES), "every block written");
    assert!(job["read"]["io_bytes"].as_u64().unwrap() >= JOB_BYTES, "every block read back and verified: {job}");
    // The restarted target served the rest of the job: the host reconnected.
    assert!(after > 0, "the restarted target saw the job's remaining writes");
    eprintln!("killed after {at_kill} of {blocks} writes; the restarted target completed {after} more");
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
