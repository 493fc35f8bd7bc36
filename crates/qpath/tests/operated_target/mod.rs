//! A `qpath target` process of a test's own, with its log in a file, its RPC socket, and
//! the signals an operator sends it (SIGKILL, SIGHUP), for tests of what survives a
//! restart or a reload.

#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A directory of its own for one test, removed at the end.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("qpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the test directory");
        Dir(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `qpath target`; killed with SIGKILL when dropped.
pub struct TargetProcess {
    child: Child,
    /// Its RPC socket.
    pub sock: PathBuf,
    /// Its log (stdout and stderr), appended to across restarts.
    pub log: PathBuf,
}

impl TargetProcess {
    /// Starts `qpath target ARGS --rpc-socket SOCK` and waits (at most 20 s) for its RPC.
    pub fn start(args: &[&str], sock: &Path, log: &Path) -> TargetProcess {
        let _ = std::fs::remove_file(sock);
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open the log");
        let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
            .env("RUST_LOG", "info")
            .arg("target")
            .args(args)
            .arg("--rpc-socket")
            .arg(sock)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn qpath target");
        let mut t = TargetProcess { child, sock: sock.to_path_buf(), log: log.to_path_buf() };
        let t0 = Instant::now();
        while t.rpc("get_target", serde_json::json!({})).is_err() {
            if let Ok(Some(status)) = t.child.try_wait() {
                panic!("qpath target exited ({status}):\n{}", t.log_text());
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "the target's RPC never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        t
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One RPC call: its result, or its error message.
    pub fn rpc(&self, method: &str, params: Value) -> Result<Value, String> {
        target::rpc::client_call(&self.sock, method, params).map_err(|e| e.to_string())
    }

    /// [`TargetProcess::rpc`] that must succeed.
    pub fn call(&self, method: &str, params: Value) -> Value {
        self.rpc(method, params.clone()).unwrap_or_else(|e| panic!("{method} {params}: {e}"))
    }

    /// Sends a signal ("HUP", "KILL") to the process, by its PID.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status().expect("run kill");
        assert!(ok.success(), "kill -{sig} {}", self.pid());
    }

    /// `kill -9` by PID, and waits for the process to be gone.
    pub fn kill9(mut self) {
        self.signal("KILL");
        self.child.wait().expect("reap the target");
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (at most `secs` s) until `ok` holds.
pub fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
