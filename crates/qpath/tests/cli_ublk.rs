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
