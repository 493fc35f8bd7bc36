//! A `qpath target` process for tests of the command line: the embedded default (or a
//! config) on free loopback ports, one reactor that blocks in the kernel, its own RPC
//! socket. Killed by its pid when dropped; every call to it is bounded in time.

#![allow(dead_code)] // each test crate uses a part

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A started target must be listening within this long (a loaded 2-core machine).
pub const START_WITHIN: Duration = Duration::from_secs(30);
/// One `qpath rpc` (or any short `qpath` command) must end within this long.
pub const CALL_WITHIN: Duration = Duration::from_secs(30);

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port").local_addr().expect("its address").port()
}

/// A directory of its own for one test, removed at the end.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("qpath-cli-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
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

/// A running `qpath target`.
pub struct TargetProcess {
    pub child: Child,
    /// Its I/O ports, in port order.
    pub addrs: Vec<SocketAddr>,
    pub rpc: PathBuf,
    pub log: PathBuf,
}

impl TargetProcess {
    /// `qpath target` with no config (the embedded default's two ports moved to free
    /// loopback ports with `--listen`), plus `extra` arguments.
    pub fn start_default(dir: &Dir, name: &str, extra: &[&str]) -> TargetProcess {
        let addrs: Vec<SocketAddr> = (0..2).map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap()).collect();
        let mut args: Vec<String> = vec!["--reactors".into(), "1".into(), "--poll".into(), "block".into()];
        for a in &addrs {
            args.push("--listen".into());
            args.push(a.to_string());
        }
        args.extend(extra.iter().map(|s| (*s).to_string()));
        Self::start(dir, name, &args, addrs)
    }

    /// `qpath target ARGS --rpc-socket DIR/NAME.sock`, waiting until `addrs` accept
    /// connections and the RPC socket answers.
    pub fn start(dir: &Dir, name: &str, args: &[String], addrs: Vec<SocketAddr>) -> TargetProcess {
        let rpc = dir.path(&format!("{name}.sock"));
        let log = dir.path(&format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
            .arg("target")
            .args(args)
            .arg("--rpc-socket")
            .arg(&rpc)
            .env("RUST_LOG", "warn,qpath_target=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut t = TargetProcess { child, addrs, rpc, log };
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Some(status) = t.child.try_wait().unwrap() {
                panic!("target {name} exited ({status}): {}", t.log_text());
            }
            let listening = t.addrs.iter().all(|a| TcpStream::connect(a).is_ok());
            if listening && t.rpc.exists() && t.rpc("get_target", &[]).is_ok() {
                return t;
            }
            assert!(Instant::now() < deadline, "target {name} did not start within {START_WITHIN:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `qpath rpc --socket S METHOD PARAMS...`: Ok(stdout) or Err(stderr).
    pub fn rpc(&self, method: &str, params: &[&str]) -> Result<String, String> {
        rpc_at(&self.rpc, method, params)
    }

    /// SIGKILL, by pid, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `qpath rpc --socket SOCKET METHOD PARAMS...`: Ok(stdout) or Err(stderr).
pub fn rpc_at(socket: &Path, method: &str, params: &[&str]) -> Result<String, String> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
    c.arg("rpc").arg("--socket").arg(socket).arg(method).args(params);
    let (ok, out, err) = run(c, CALL_WITHIN);
    if ok { Ok(out) } else { Err(err) }
}

/// Runs `qpath ARGS` to its end (killed by pid and the test failed after `within`):
/// (exit success, stdout, stderr).
pub fn qpath(args: &[&str], within: Duration) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
    c.args(args);
    run(c, within)
}

/// Runs a command to its end, both pipes drained on threads: (exit success, stdout, stderr).
pub fn run(mut cmd: Command, within: Duration) -> (bool, String, String) {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
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
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} ran longer than {within:?}; stderr:\n{}", t_err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), t_out.join().unwrap(), t_err.join().unwrap())
}
