//! A `qpath bench` job whose target is not up yet when the job starts. With
//! `reconnect_delay`/`ctrl_loss_tmo` in the URI the first connect is retried like any
//! later one, and the job runs once the target comes up; without them it fails at once,
//! as `nvme connect` does. (The soak's drops could land on a job's first connect.)

mod loopback;
mod run_bounded;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:first-connect";
const JOB_BYTES: u64 = 4 << 20;

/// A target process, killed when dropped.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `qpath target --config CONFIG` with an RPC socket of its own beside the config (the
/// default socket may be another target's, which a target never takes).
fn start_target(config: &Path) -> Target {
    let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["target", "--config"])
        .arg(config)
        .arg("--rpc-socket")
        .arg(config.with_extension("sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn qpath target");
    Target(child)
}

/// A sequential read of the whole job size through `uri`.
fn bench(uri: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
    c.args(["bench", "--output-format=json", "--", "--name=first", "--ioengine=qpath", "--rw=read"]).args([
        "--bs=4k",
        "--iodepth=4",
        &format!("--size={JOB_BYTES}"),
        &format!("--filename={uri}"),
    ]);
    c
}

#[test]
fn a_job_whose_target_comes_up_late_connects_when_the_uri_asks_for_reconnects() {
    let dir = std::env::temp_dir().join(format!("qpath-first-connect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"16M\"\n"
        ),
    )
    .unwrap();
    let plain = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1");

    // Nothing listens: without reconnect options the job fails at once.
    let t0 = Instant::now();
    let (status, _, stderr) = run_bounded::run(bench(&plain), Duration::from_secs(30));
    assert!(!status.success(), "no target, no reconnect options: the job fails\n{stderr}");
    assert!(stderr.contains("connect to"), "the error says which connect failed:\n{stderr}");
    let failed_after = t0.elapsed();

    // With them, the job waits for the target, which comes up 1.5 s later.
    let cmd = bench(&format!("{plain}?reconnect_delay=1&ctrl_loss_tmo=30"));
    let job = std::thread::spawn(move || run_bounded::run(cmd, Duration::from_secs(60)));
    std::thread::sleep(Duration::from_millis(1500));
    let target = start_target(&config);
    let (status, stdout, stderr) = job.join().expect("the bench thread");
    assert!(status.success(), "bench failed\nstderr:\n{stderr}\nstdout:\n{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{stdout}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert_eq!(job["read"]["io_bytes"].as_u64(), Some(JOB_BYTES), "the whole size read: {job}");
    assert!(stderr.contains("first connect failed, retrying"), "the retries are logged:\n{stderr}");
    eprintln!("without reconnect options the job failed after {failed_after:?}; with them it waited and ran");
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
