//! `qpath target` under systemd's `Type=notify`: with `$NOTIFY_SOCKET` naming a datagram
//! socket (here one the test binds), the target says `READY=1` only once its port accepts
//! connections and its RPC socket answers, with a `STATUS=` naming what it serves; a SIGHUP
//! brings `RELOADING=1`, then `READY=1` with the new status (a reload that fails says so,
//! without quoting the file); SIGTERM brings `STOPPING=1` before it exits.

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A directory of its own, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("qpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the test directory");
        Dir(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The target, killed by its PID if the test ends early.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

const NQN_A: &str = "nqn.2026-11.io.qpath:notify-a";
const NQN_B: &str = "nqn.2026-11.io.qpath:notify-b";

fn config(port: u16, nqns: &[&str]) -> String {
    let mut s = format!("[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n");
    for nqn in nqns {
        s += &format!(
            "[[subsystem]]\nnqn = \"{nqn}\"\nallow_any_host = true\n[[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"16M\"\n"
        );
    }
    s
}

/// The next notification, within 30 s (a loaded 2-core machine).
fn next(sock: &UnixDatagram, log: &Path) -> String {
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8(buf[..n].to_vec()).expect("a notification is UTF-8"),
        Err(e) => panic!("no notification within 30 s ({e}); the target's log:\n{}", read(log)),
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().expect("run kill");
    assert!(ok.success(), "kill -{sig} {pid}");
}

#[test]
fn ready_reloading_and_stopping_reach_the_notify_socket_in_order() {
    let dir = Dir::new("service-notify");
    let (cfg, rpc, log) = (dir.path("target.toml"), dir.path("rpc.sock"), dir.path("target.log"));
    let notify_path = dir.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind the notify socket");
    let port = free_port();
    std::fs::write(&cfg, config(port, &[NQN_A])).unwrap();

    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .arg("target")
        .arg("--config")
        .arg(&cfg)
        .arg("--rpc-socket")
        .arg(&rpc)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("spawn qpath target");
    let mut target = Target(child);
    let pid = target.0.id();

    // READY: by then the port accepts connections and the RPC socket answers.
    let ready = next(&notify, &log);
    TcpStream::connect(("127.0.0.1", port)).expect("the port accepts connections once READY=1 is sent");
    let answer = target::rpc::client_call(&rpc, "get_target", serde_json::json!({}));
    assert!(answer.is_ok(), "the RPC socket answers once READY=1 is sent: {answer:?}");
    assert_eq!(ready, format!("READY=1\nSTATUS=serving 1 subsystem (1 namespace) on 127.0.0.1:{port}"));

    // A reload that adds a subsystem: RELOADING=1, then READY=1 with what runs now.
    std::fs::write(&cfg, config(port, &[NQN_A, NQN_B])).unwrap();
    signal(pid, "HUP");
    assert_eq!(next(&notify, &log), "RELOADING=1");
    let reloaded = next(&notify, &log);
    assert_eq!(
        reloaded,
        format!(
            "READY=1\nSTATUS=serving 2 subsystems (2 namespaces) on 127.0.0.1:{port}; reloaded: 1 change(s) applied, 0 refused"
        ),
        "log:\n{}",
        read(&log)
    );

    // A file that does not parse changes nothing, and STATUS (which every user may read)
    // does not quote it.
    std::fs::write(&cfg, "[[subsystem]]\nnqn = \"nqn.2026-11.io.qpath:x\"\nwhat = \"DHHC-1:00:not-a-key:\"\n").unwrap();
    signal(pid, "HUP");
    assert_eq!(next(&notify, &log), "RELOADING=1");
    let failed = next(&notify, &log);
    assert_eq!(
        failed,
        format!(
            "READY=1\nSTATUS=serving 2 subsystems (2 namespaces) on 127.0.0.1:{port}; the last reload failed, nothing changed (see the log)"
        )
    );
    assert!(!failed.contains("DHHC-1"), "{failed}");

    // SIGTERM: STOPPING=1, then the process ends.
    signal(pid, "TERM");
    assert_eq!(next(&notify, &log), "STOPPING=1\nSTATUS=shutting down");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = target.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the target did not exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}; log:\n{}", read(&log));
}

#[test]
fn an_abstract_notify_socket_hears_ready_too() {
    let dir = Dir::new("service-notify-abstract");
    let (cfg, rpc, log) = (dir.path("target.toml"), dir.path("rpc.sock"), dir.path("target.log"));
    let name = format!("qpath-service-notify-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
            .unwrap();
    let notify = UnixDatagram::bind_addr(&addr).expect("bind the abstract notify socket");
    let port = free_port();
    std::fs::write(&cfg, config(port, &[NQN_A])).unwrap();
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["target", "--config"])
        .arg(&cfg)
        .arg("--rpc-socket")
        .arg(&rpc)
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("spawn qpath target");
    let target = Target(child);
    let ready = next(&notify, &log);
    assert!(ready.starts_with("READY=1\nSTATUS=serving 1 subsystem"), "{ready}");
    signal(target.0.id(), "TERM");
    assert_eq!(next(&notify, &log), "STOPPING=1\nSTATUS=shutting down");
}
