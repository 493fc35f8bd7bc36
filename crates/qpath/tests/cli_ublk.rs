//! `qpath host` and `qpath ublk` on a machine without the ublk driver (this one): the
//! control socket, its checks, the state files a previous server left, and errors that say
//! what to do. The ublk data path itself runs in the Linux 7.2 guest (`vm_blockdev.rs`).

mod target_process;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use target_process::{Dir, TargetProcess};

const NQN: &str = "nqn.2026-11.io.qpath:default";

fn qpath(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run qpath");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn no_ublk_here() -> bool {
    if std::path::Path::new("/dev/ublk-control").exists() {
        println!("SKIP: this machine has ublk_drv loaded; the test checks the errors of a machine without it");
        return false;
    }
    true
}

#[test]
fn ublk_add_without_the_driver_says_to_load_it_and_leaves_no_controller() {
    if !no_ublk_here() {
        return;
    }
    let dir = Dir::new("ublk-nodrv");
    let t = TargetProcess::start_default(&dir, "target", &[]);
    let (p1, p2) = (t.addrs[0].port().to_string(), t.addrs[1].port().to_string());
    let state = dir.path("state");
    let (ok, out) = qpath(&[
        "ublk",
        "add",
        "--foreground",
        "-a",
        "127.0.0.1",
        "-s",
        &p1,
        "-s",
        &p2,
        "-n",
        NQN,
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("modprobe ublk_drv"), "the error says what to do: {out}");
    // The paths it connected are disconnected again, and no state file is left.
    let t0 = Instant::now();
    loop {
        let (_, list) = qpath(&["rpc", "--socket", t.rpc.to_str().unwrap(), "list_controllers"]);
        if !list.contains(NQN) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "controllers left on the target: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(std::fs::read_dir(&state).map_or(true, |mut d| d.next().is_none()), "no state file");
}

#[test]
fn qpath_host_answers_checks_its_parameters_and_forgets_devices_the_kernel_lost() {
    if !no_ublk_here() {
        return;
    }
    let dir = Dir::new("ublk-host");
    let state = dir.path("state");
    std::fs::create_dir_all(&state).unwrap();
    // A state file a previous qpath host left for a device this kernel does not have.
    let left = json!({"dev_id": 5, "spec": {"paths": ["127.0.0.1:9"], "subnqn": NQN}, "max_transfer": 524288});
    std::fs::write(state.join("ublk-5.json"), left.to_string()).unwrap();
    let sock = dir.path("host.sock");
    let log = std::fs::File::create(dir.path("host.log")).unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["host", "--rpc-socket", sock.to_str().unwrap(), "--state-dir", state.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "qpath host never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = sock.to_str().unwrap();
    let (ok, out) = qpath(&["rpc", "--socket", s, "ublk_list"]);
    assert!(ok && out.trim() == "[]", "{out}");
    assert!(!state.join("ublk-5.json").exists(), "the state of a device the kernel no longer has is removed");
    let (ok, out) =
        qpath(&["rpc", "--socket", s, "ublk_add", "paths:=[\"127.0.0.1:9\"]", &format!("subnqn={NQN}"), "quues=2"]);
    assert!(!ok && out.contains("quues"), "an unknown parameter is named: {out}");
    let (ok, out) = qpath(&["rpc", "--socket", s, "ublk_add", "paths:=[]", &format!("subnqn={NQN}")]);
    assert!(!ok && out.contains("paths"), "{out}");
    let (ok, out) = qpath(&["ublk", "add", "--rpc-socket", s, "-a", "127.0.0.1", "-s", "9", "-n", NQN]);
    assert!(!ok && out.contains("127.0.0.1:9"), "the path that failed is named: {out}");
    let (ok, out) = qpath(&["ublk", "list", "--rpc-socket", s]);
    assert!(ok && out.contains("device"), "{out}");
    let (ok, out) = qpath(&["ublk", "list", "--rpc-socket", dir.path("nobody.sock").to_str().unwrap()]);
    assert!(!ok && out.contains("nobody.sock"), "a socket given and not answering is an error: {out}");
    // A second qpath host on the same state directory is refused, naming the first; on
    // the same socket too; the first keeps serving.
    let other_sock = dir.path("other.sock");
    let (ok, out) =
        qpath(&["host", "--rpc-socket", other_sock.to_str().unwrap(), "--state-dir", state.to_str().unwrap()]);
    assert!(!ok && out.contains(&format!("used by another qpath host (process {})", host.id())), "{out}");
    assert!(!other_sock.exists(), "the refused host made no socket");
    let (ok, out) = qpath(&["host", "--rpc-socket", s, "--state-dir", dir.path("state2").to_str().unwrap()]);
    assert!(!ok && out.contains("another process serves"), "{out}");
    assert!(qpath(&["rpc", "--socket", s, "ublk_list"]).0);
    // SIGTERM: it stops and removes its socket.
    Command::new("kill").args(["-TERM", &host.id().to_string()]).status().unwrap();
    let t0 = Instant::now();
    while host.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "qpath host did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!sock.exists(), "the control socket is removed");
    let log = std::fs::read_to_string(dir.path("host.log")).unwrap();
    assert!(log.contains("/dev/ublkb5: not taken over: no such device"), "{log}");
}

/// A running `qpath host`, killed when dropped.
struct HostProcess {
    child: std::process::Child,
    sock: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl HostProcess {
    fn start(dir: &Dir, tag: &str, extra: &[&str]) -> HostProcess {
        let sock = dir.path(&format!("{tag}.sock"));
        let log = dir.path(&format!("{tag}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let state = dir.path("state");
        let mut args = vec!["host", "--rpc-socket", sock.to_str().unwrap(), "--state-dir", state.to_str().unwrap()];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !sock.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "qpath host never listened: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        HostProcess { child, sock, log }
    }

    fn rpc(&self, args: &[&str]) -> (bool, String) {
        let mut a = vec!["rpc", "--socket", self.sock.to_str().unwrap()];
        a.extend_from_slice(args);
        qpath(&a)
    }

    fn list(&self) -> Vec<serde_json::Value> {
        let (ok, out) = self.rpc(&["ublk_list"]);
        assert!(ok, "{out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap().as_array().unwrap().clone()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    fn stop(mut self) {
        self.signal("-TERM");
        let t0 = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(20), "qpath host did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn names(list: &[serde_json::Value]) -> Vec<String> {
    list.iter().filter_map(|d| d["name"].as_str().map(str::to_string)).collect()
}

/// `qpath host --config --persist` on a machine without ublk_drv: a configured device that
/// cannot be created is named with its reason and the host serves on; `ublk_add` over the
/// socket is saved before it answers (and kept though it failed: it may work after
/// `modprobe ublk_drv`), with the secret's file and never its text; `ublk_del` by name takes
/// entries out of the file; SIGHUP picks up an edit; --check names a bad line's key.
#[test]
fn qpath_host_config_persist_keeps_devices_it_could_not_create_and_never_a_secret() {
    if !no_ublk_here() {
        return;
    }
    let dir = Dir::new("ublk-config");
    let t = TargetProcess::start_default(&dir, "target", &[]);
    let file = dir.path("host.toml");
    let f = file.to_str().unwrap();
    // Port 9 (discard) listens nowhere here: db's paths cannot connect. disk's do, and its
    // device cannot be made (no ublk_drv).
    std::fs::write(
        &file,
        format!(
            "[[ublk]]\nname = \"db\"\npaths = [\"127.0.0.1:9\"]\nsubnqn = \"{NQN}\"\nctrl_loss_tmo = -1\nreconnect_delay = 1\n\n\
             [[ublk]]\nname = \"disk\"\npaths = [\"{}\"]\nsubnqn = \"{NQN}\"\n",
            t.addrs[0]
        ),
    )
    .unwrap();
    let (ok, out) = qpath(&["host", "--config", f, "--check"]);
    assert!(
        ok && out.contains("db: /dev/ublkb? (the kernel picks) over namespace 1 of") && out.contains("2 device(s)"),
        "{out}"
    );
    let bad = dir.path("bad.toml");
    std::fs::write(&bad, format!("[[ublk]]\npaths = [\"127.0.0.1:9\"]\nsubnqn = \"{NQN}\"\n\nquues = 2\n")).unwrap();
    let (ok, out) = qpath(&["host", "--config", bad.to_str().unwrap(), "--check"]);
    assert!(!ok && out.contains("bad.toml: line 5: unknown key `quues`"), "{out}");
    let (ok, out) =
        qpath(&["host", "--config", bad.to_str().unwrap(), "--rpc-socket", dir.path("bad.sock").to_str().unwrap()]);
    assert!(!ok && out.contains("line 5: unknown key `quues`"), "a wrong file is refused at start: {out}");
    assert!(!dir.path("bad.sock").exists());

    let host = HostProcess::start(&dir, "host1", &["--config", f, "--persist"]);
    assert!(host.log().contains("configured device \"db\" not created: connecting"), "{}", host.log());
    assert!(host.log().contains("configured device \"disk\" not created") && host.log().contains("modprobe ublk_drv"));
    let list = host.list();
    assert_eq!(names(&list), ["db", "disk"], "{list:?}");
    assert_eq!((&list[0]["state"], &list[1]["state"]), (&json!("not created"), &json!("not created")));
    assert!(list[0]["error"].as_str().unwrap().contains("127.0.0.1:9"), "{list:?}");
    assert_eq!(list[0]["retrying"], true, "ctrl_loss_tmo -1: tried again as a controller reconnects");
    // And it is (reconnect_delay = 1 s); disk is not.
    let t0 = Instant::now();
    while host.list()[0]["attempts"].as_u64().unwrap() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(20), "db not tried again: {:?}", host.list());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(host.list()[1]["attempts"], 1, "{:?}", host.list());
    assert!(list[1]["error"].as_str().unwrap().contains("modprobe ublk_drv"), "{list:?}");
    assert_eq!(list[1]["retrying"], false, "no driver: tried again at the next start or SIGHUP, not in a loop");
    // disk's paths, connected to find its namespace, are disconnected again.
    let t0 = Instant::now();
    loop {
        let (_, ctrls) = qpath(&["rpc", "--socket", t.rpc.to_str().unwrap(), "list_controllers"]);
        if !ctrls.contains(NQN) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "controllers left on the target: {ctrls}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // ublk_add over the socket, with a secret file: it fails (nothing listens), is kept,
    // and the file names the secret's file only.
    let secret = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    let key = dir.path("host.key");
    std::fs::write(&key, format!("{secret}\n")).unwrap();
    let s = host.sock.to_str().unwrap();
    let (ok, out) = qpath(&[
        "ublk",
        "add",
        "--rpc-socket",
        s,
        "--name",
        "web",
        "-a",
        "127.0.0.1",
        "-s",
        "9",
        "-n",
        NQN,
        "--dhchap-secret-file",
        key.to_str().unwrap(),
        "--queues",
        "2",
    ]);
    assert!(!ok && out.contains("stays in") && out.contains("\"web\""), "{out}");
    assert!(!out.contains("ia6zGodOr4"), "{out}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("name = \"web\"") && text.contains("host.key") && text.contains("queues = 2"), "{text}");
    assert!(!text.contains("DHHC") && !text.contains("ia6zGodOr4"), "a secret in the file: {text}");
    assert!(dir.path("host.toml.bak").exists(), "the previous file kept");
    // The same device again (same name) is refused, naming why.
    let (ok, out) =
        qpath(&["ublk", "add", "--rpc-socket", s, "--name", "web", "-a", "127.0.0.1", "-s", "9", "-n", NQN]);
    assert!(!ok && out.contains("a device named \"web\" is configured already"), "{out}");
    let (ok, out) = qpath(&["ublk", "list", "--rpc-socket", s]);
    assert!(ok && out.contains("db ") && out.contains("web "), "{out}");
    // A configured device that is not there says so on a line of its own, with its tries.
    assert!(out.lines().any(|l| l.trim_start().starts_with("not created after ")), "{out}");
    let log = host.log();
    assert!(!log.contains("ia6zGodOr4"), "a secret in the log");

    // Deleted by name: out of the file.
    let (ok, out) = qpath(&["ublk", "del", "--rpc-socket", s, "--name", "web"]);
    assert!(ok, "{out}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("web") && text.contains("name = \"db\"") && text.contains("name = \"disk\""), "{text}");
    let (ok, out) = host.rpc(&["ublk_del", "name=nothing"]);
    assert!(!ok && out.contains("no device named \"nothing\""), "{out}");

    // SIGHUP: an edited file's new device is tried; the one the edit removed is forgotten.
    std::fs::write(
        &file,
        format!("[[ublk]]\nname = \"logs\"\nid = 7\npaths = [\"127.0.0.1:9\"]\nsubnqn = \"{NQN}\"\n"),
    )
    .unwrap();
    host.signal("-HUP");
    let t0 = Instant::now();
    // Tried, not only listed: its error is its paths'.
    let tried = |l: &[serde_json::Value]| {
        l.len() == 1 && l[0]["name"] == "logs" && l[0]["error"].as_str().is_some_and(|e| e.contains("127.0.0.1:9"))
    };
    while !tried(&host.list()) {
        assert!(t0.elapsed() < Duration::from_secs(20), "SIGHUP did not apply: {:?}", host.list());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(host.log().contains("configuration reloaded"), "{}", host.log());
    // A configured device deleted by its number (it has one, though not created).
    let (ok, out) = qpath(&["ublk", "del", "--rpc-socket", s, "--id", "7"]);
    assert!(ok, "{out}");
    assert!(host.list().is_empty());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.lines().any(|l| l.starts_with("[[ublk]]")), "{text}");
    host.stop();

    // Without --persist the file is only read.
    let host = HostProcess::start(&dir, "host2", &["--config", f]);
    let before = std::fs::read_to_string(&file).unwrap();
    let (ok, _) =
        qpath(&["ublk", "add", "--rpc-socket", host.sock.to_str().unwrap(), "-a", "127.0.0.1", "-s", "9", "-n", NQN]);
    assert!(!ok);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "without --persist nothing is written");
    host.stop();
}

/// Under systemd (`Type=notify`): READY=1 once the control socket answers and the
/// configured devices were tried, with a STATUS= that counts those not created;
/// RELOADING=1 then READY=1 around a SIGHUP; STOPPING=1 at SIGTERM.
#[test]
fn qpath_host_tells_systemd_it_is_ready_after_trying_its_devices() {
    if !no_ublk_here() {
        return;
    }
    let dir = Dir::new("ublk-notify");
    let notify = dir.path("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    listener.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let file = dir.path("host.toml");
    std::fs::write(&file, format!("[[ublk]]\nname = \"db\"\npaths = [\"127.0.0.1:9\"]\nsubnqn = \"{NQN}\"\n")).unwrap();
    let sock = dir.path("host.sock");
    let log = std::fs::File::create(dir.path("host.log")).unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["host", "--config", file.to_str().unwrap(), "--rpc-socket", sock.to_str().unwrap()])
        .args(["--state-dir", dir.path("state").to_str().unwrap()])
        .env("NOTIFY_SOCKET", &notify)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let next = || {
        let mut buf = [0u8; 1024];
        let n = listener.recv(&mut buf).expect("a notification within 30 s");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    };
    let ready = next();
    assert_eq!(ready, "READY=1\nSTATUS=serving 0 ublk device(s); 1 configured device(s) not created (qpath ublk list)");
    assert!(sock.exists(), "the control socket is up before READY=1");
    let (ok, out) = qpath(&["rpc", "--socket", sock.to_str().unwrap(), "ublk_list"]);
    assert!(ok && out.contains("\"db\""), "the device was tried before READY=1: {out}");
    assert!(Command::new("kill").args(["-HUP", &host.id().to_string()]).status().unwrap().success());
    assert_eq!(next(), "RELOADING=1");
    assert!(next().starts_with("READY=1\nSTATUS=serving 0 ublk device(s)"));
    assert!(Command::new("kill").args(["-TERM", &host.id().to_string()]).status().unwrap().success());
    assert_eq!(next(), "STOPPING=1\nSTATUS=shutting down");
    assert!(host.wait().unwrap().success());
}
