//! What an operator changes over RPC survives a crash: `qpath target --config F --persist`
//! takes one change of every kind, is killed with SIGKILL, and started again with the same
//! command line. Subsystems, ports, hosts, key fingerprints, ANA states, QoS, limits and
//! referrals are what they were; our host connects on both ports and a written block reads
//! back; a host whose keys were set over RPC authenticates with them. Each save kept the
//! previous file as `F.bak`, and no secret reached the log or an answer. A save into a
//! read-only directory fails the change's RPC with the reason and leaves the file as it was.

mod loopback;
mod operated_target;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use operated_target::{Dir, TargetProcess};
use serde_json::{Value, json};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:persisted";
const NQN2: &str = "nqn.2026-11.io.qpath:persisted2";
const NQN3: &str = "nqn.2026-11.io.qpath:transient";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b";
const HOST_K: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c";
const HOST_X: &str = "nqn.2014-08.org.nvmexpress:uuid:0d0d0d0d-0d0d-4d0d-8d0d-0d0d0d0d0d0d";

fn key() -> String {
    nvme::auth::Secret::generate(Some(nvme::auth::HashId::Sha256), 32).unwrap().to_string()
}

fn connect(addr: SocketAddr, hostnqn: &str, keys: Option<(&str, &str)>) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, NQN);
    o.hostnqn = hostnqn.to_string();
    o.nr_io_queues = 1;
    o.kato_ms = 5000;
    o.reconnect_delay = Duration::from_millis(200);
    o.ctrl_loss_tmo = Some(Duration::from_secs(2));
    if let Some((k, c)) = keys {
        o.dhchap_secret = Some(k.to_string());
        o.dhchap_ctrl_secret = Some(c.to_string());
    }
    Controller::connect(o).unwrap_or_else(|e| panic!("{hostnqn} connects to {addr}: {e}"))
}

fn io(ctx: &mut Context, dev: DeviceId, op: Op, offset: u64, buf: IoBuf) -> (nvme::Status, Option<IoBuf>) {
    let len = u32::try_from(buf.len().max(4096)).unwrap();
    ctx.submit(dev, op, offset, len, Some(buf), 1).map_err(|(e, _)| e).expect("submitted");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "I/O timed out");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        if let Some(c) = ctx.completions().next() {
            return (c.status, c.buf);
        }
    }
}

/// Writes a block of `byte` at `offset` of namespace `nsid` through `ctrl` and reads it back.
fn write_read(ctrl: &Arc<Controller>, nsid: u32, offset: u64, byte: u8) {
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(ctrl, Nsid(nsid)).unwrap();
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    b.fill(byte);
    assert_eq!(io(&mut ctx, dev, Op::Write, offset, b).0, nvme::Status::SUCCESS, "write at {offset}");
    let (st, back) = io(&mut ctx, dev, Op::Read, offset, IoBuf::new(4096));
    assert!(st.is_success(), "read at {offset}: {st:?}");
    assert!(back.unwrap().iter().all(|&x| x == byte), "the block read back is the one written");
}

/// What must be the same before and after the restart (live controllers aside).
fn observed(t: &TargetProcess) -> Value {
    let mut subs = t.call("list_subsystems", json!({}));
    for s in subs.as_array_mut().unwrap() {
        s.as_object_mut().unwrap().remove("controllers");
    }
    json!({
        "subsystems": subs,
        "ports": t.call("list_ports", json!({})),
        "limits": t.call("get_limits", json!({}))["limits"],
        "referrals": t.call("get_target", json!({}))["referrals"],
    })
}

#[test]
fn every_change_survives_kill_9_and_a_restart() {
    let d = Dir::new("persist-restart");
    let (f, sock, log) = (d.path("target.toml"), d.path("rpc.sock"), d.path("target.log"));
    let (img1, img2, key_file) = (d.path("vol1.img"), d.path("vol2.img"), d.path("k.key"));
    std::fs::File::create(&img1).unwrap().set_len(32 << 20).unwrap();
    let (key_k, key_b, key_c) = (key(), key(), key());
    std::fs::write(&key_file, format!("{key_k}\n")).unwrap();
    let ports: Vec<u16> = (0..4).map(|_| loopback::free_port()).collect();
    std::fs::write(
        &f,
        format!(
            r#"[reactor]
reactors = 1
poll = "block"
[[port]]
id = 1
addr = "127.0.0.1:{}"
[[port]]
id = 2
addr = "127.0.0.1:{}"
[[subsystem]]
nqn = "{NQN}"
hosts = ["{HOST_A}", "{HOST_X}", {{ nqn = "{HOST_K}", dhchap_key_file = "{}" }}]
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "{}"
"#,
            ports[0],
            ports[1],
            key_file.display(),
            img1.display()
        ),
    )
    .unwrap();
    let f_arg = f.to_str().unwrap();
    let args = ["--config", f_arg, "--persist"];
    let t = TargetProcess::start(&args, &sock, &log);

    // One change of every kind that changes the configuration.
    t.call(
        "add_subsystem",
        json!({"nqn": NQN2, "allow_any_host": true, "namespace": [{"backend": "ram", "size": "8M"}]}),
    );
    t.call("set_allow_any_host", json!({"nqn": NQN2, "allow": false}));
    t.call("add_host", json!({"nqn": NQN2, "host": HOST_A}));
    t.call("remove_host", json!({"nqn": NQN, "host": HOST_X}));
    t.call(
        "set_host_auth",
        json!({"nqn": NQN, "host": HOST_B, "dhchap_key": key_b, "dhchap_ctrl_key": key_c, "hash": "sha384", "dhgroup": "ffdhe2048"}),
    );
    t.call("add_namespace", json!({"nqn": NQN, "nsid": 2, "backend": "file", "path": img2, "size": "16M"}));
    t.call(
        "add_namespace",
        json!({"nqn": NQN, "nsid": 3, "backend": "null", "size": "1G", "visible": "listed", "hosts": [HOST_A]}),
    );
    t.call("ns_add_host", json!({"nqn": NQN, "nsid": 3, "host": HOST_B}));
    t.call("ns_remove_host", json!({"nqn": NQN, "nsid": 3, "host": HOST_A}));
    t.call("add_namespace", json!({"nqn": NQN, "nsid": 4, "backend": "null", "size": "1M"}));
    t.call("remove_namespace", json!({"nqn": NQN, "nsid": 4}));
    t.call("resize_namespace", json!({"nqn": NQN, "nsid": 1, "size": "48M"}));
    t.call("set_qos", json!({"nqn": NQN, "nsid": 2, "iops": 50_000, "bytes_per_sec": 400_000_000, "delay_us": 0}));
    t.call("set_ana_state", json!({"port": 2, "group": 1, "state": "non-optimized"}));
    t.call("set_limits", json!({"max_connections_per_host": 100, "connect_timeout_ms": 5000}));
    t.call("add_port", json!({"id": 3, "addr": format!("127.0.0.1:{}", ports[2]), "kind": "discovery"}));
    t.call("add_port", json!({"id": 4, "addr": format!("127.0.0.1:{}", ports[3])}));
    t.call("remove_port", json!({"id": 4}));
    t.call("add_referral", json!({"address": "192.0.2.10"}));
    t.call("add_referral", json!({"address": "192.0.2.11", "port": 4420, "subnqn": NQN2}));
    t.call("remove_referral", json!({"address": "192.0.2.10"}));
    t.call("add_subsystem", json!({"nqn": NQN3, "allow_any_host": true}));
    t.call("remove_subsystem", json!({"nqn": NQN3}));

    let before = observed(&t);
    // The file is what runs, and was written the safe way.
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.starts_with("# Written by qpath "), "{text}");
    assert!(d.path("target.toml.bak").exists(), "the previous file is kept");
    assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600, "it holds a secret inline");
    assert!(text.contains(&format!("dhchap_key_file = \"{}\"", key_file.display())));
    assert!(!text.contains(&key_k), "a key from a file stays in its file");
    assert!(text.contains(&key_b), "a key given over RPC is saved inline");

    t.kill9();
    let t = TargetProcess::start(&args, &sock, &log);
    let after = observed(&t);
    assert_eq!(after, before, "the restarted target runs what the first one ran");
    // Spot checks of what the comparison covers, so it cannot pass on two empty answers.
    let subs = after["subsystems"].as_array().unwrap();
    assert_eq!(subs.len(), 2);
    let s = &subs[0];
    assert_eq!(s["hosts"], json!([HOST_A, HOST_K, HOST_B]));
    let keys = s["host_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter().any(|k| k["nqn"] == HOST_B && k["dhgroup"] == "ffdhe2048" && !k["ctrl_key_fingerprint"].is_null())
    );
    let nss = s["namespaces"].as_array().unwrap();
    assert_eq!(nss.iter().map(|n| n["nsid"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(nss[0]["size"], json!(48 << 20), "the resized size");
    assert_eq!(nss[1]["qos"]["iops"], json!(50_000));
    assert_eq!(nss[2]["visible"], json!({"listed": [HOST_B]}));
    assert_eq!(after["limits"]["max_connections_per_host"], json!(100));
    assert_eq!(after["ports"].as_array().unwrap().len(), 3);
    assert_eq!(after["ports"][1]["ana"], json!([{"group": 1, "state": "non-optimized"}]));
    assert_eq!(after["referrals"].as_array().unwrap().len(), 1);
    assert_eq!(std::fs::metadata(&img1).unwrap().len(), 48 << 20);

    // Our host on both ports: a block past the old end written and read back on each.
    let addrs = [SocketAddr::from(([127, 0, 0, 1], ports[0])), SocketAddr::from(([127, 0, 0, 1], ports[1]))];
    for (i, addr) in (0u8..).zip(addrs.iter()) {
        let c = connect(*addr, HOST_A, None);
        assert_eq!(c.namespace(Nsid(1)).unwrap().size_bytes(), 48 << 20);
        write_read(&c, 1, (40 << 20) + u64::from(i) * 4096, 0x50 + i);
        c.delete();
    }
    // The host whose keys were set over RPC authenticates with them (both directions).
    let c = connect(addrs[0], HOST_B, Some((&key_b, &key_c)));
    assert!(c.namespace(Nsid(3)).is_some(), "HOST_B sees the namespace listed for it");
    write_read(&c, 2, 0, 0x77);
    c.delete();
    // The removed host stays out.
    let mut o = ConnectOptions::new(addrs[0], NQN);
    o.hostnqn = HOST_X.into();
    o.ctrl_loss_tmo = Some(Duration::ZERO);
    o.connect_timeout = Duration::from_secs(2);
    assert!(Controller::connect(o).is_err(), "a removed host is refused after the restart");

    let log_text = t.log_text();
    drop(t);
    for secret in [&key_k, &key_b, &key_c] {
        assert!(!log_text.contains(secret.as_str()), "a secret in the log");
        let b64 = &secret["DHHC-1:01:".len()..secret.len() - 1];
        assert!(!log_text.contains(b64), "a secret's body in the log");
    }
    assert!(log_text.contains("configuration saved"), "the saves are logged:\n{log_text}");
}

/// Mounts a small tmpfs on `dir` (needs root); `None` where that is not possible.
fn mount_tmpfs(dir: &Path) -> Option<()> {
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "qpath-test", dir.to_str()?])
        .status()
        .ok()?
        .success();
    ok.then_some(())
}

fn remount(dir: &Path, how: &str) {
    let ok = std::process::Command::new("mount")
        .args(["-o", &format!("remount,{how}"), dir.to_str().unwrap()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "remount {how}");
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn a_save_into_a_read_only_directory_fails_the_change_and_touches_nothing_root() {
    let d = Dir::new("persist-readonly");
    let conf = d.path("conf");
    std::fs::create_dir(&conf).unwrap();
    if mount_tmpfs(&conf).is_none() {
        println!("SKIP: cannot mount a tmpfs (needs root)");
        return;
    }
    let _unmount = Unmount(&conf);
    let f = conf.join("target.toml");
    let port = loopback::free_port();
    let text = format!(
        "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n[[subsystem]]\nnqn = \"{NQN}\"\nhosts = [\"{HOST_A}\"]\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1G\"\n"
    );
    std::fs::write(&f, &text).unwrap();
    let t = TargetProcess::start(&["--config", f.to_str().unwrap(), "--persist"], &d.path("rpc.sock"), &d.path("log"));
    // A save that works first, so a .bak exists to be left alone too.
    t.call("add_host", json!({"nqn": NQN, "host": HOST_B}));
    let (saved, bak) = (std::fs::read(&f).unwrap(), std::fs::read(conf.join("target.toml.bak")).unwrap());
    assert_eq!(bak, text.as_bytes());
    remount(&conf, "ro");
    let e = t.rpc("add_host", json!({"nqn": NQN, "host": HOST_X})).unwrap_err();
    remount(&conf, "rw");
    assert!(e.starts_with("add_host: the change is in force but not saved: "), "{e}");
    assert!(e.contains(f.to_str().unwrap()) && e.contains("Read-only file system"), "the reason: {e}");
    assert_eq!(std::fs::read(&f).unwrap(), saved, "the file is as it was");
    assert_eq!(std::fs::read(conf.join("target.toml.bak")).unwrap(), bak, "the backup is as it was");
    assert_eq!(std::fs::read_dir(&conf).unwrap().count(), 2, "no file left behind");
    // In force: the host is allowed; and the next save writes it.
    let hosts = t.call("list_subsystems", json!({}))[0]["hosts"].clone();
    assert_eq!(hosts, json!([HOST_A, HOST_B, HOST_X]));
    t.call("save_config", json!({}));
    assert!(std::fs::read_to_string(&f).unwrap().contains(HOST_X));
}

/// A namespace added over RPC under an NSID another namespace had is a new namespace to
/// hosts (every identifier differs from the removed one's, as Linux nvmet's new UUID makes
/// it), and with `--persist` it keeps its identity through a kill -9 and a restart; a
/// namespace of the configuration file keeps the identity derived from its NQN and NSID.
#[test]
fn a_namespace_added_again_under_its_nsid_is_a_new_namespace_that_keeps_its_identity() {
    let d = Dir::new("persist-ns-identity");
    let (f, sock, log, img) = (d.path("target.toml"), d.path("rpc.sock"), d.path("target.log"), d.path("vol1.img"));
    std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
    let port = loopback::free_port();
    std::fs::write(
        &f,
        format!(
            "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nhosts = [\"{HOST_A}\"]\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"{}\"\n",
            img.display()
        ),
    )
    .unwrap();
    let args = ["--config", f.to_str().unwrap(), "--persist"];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ids = |nsid: u32| {
        let c = connect(addr, HOST_A, None);
        let n = c.namespace(Nsid(nsid)).unwrap_or_else(|| panic!("namespace {nsid} is listed"));
        c.delete();
        (n.nguid, n.eui64, n.uuid)
    };
    let t = TargetProcess::start(&args, &sock, &log);
    let file_ns = ids(1);
    t.call("add_namespace", json!({"nqn": NQN, "nsid": 2, "backend": "ram", "size": "8M"}));
    let first = ids(2);
    t.call("remove_namespace", json!({"nqn": NQN, "nsid": 2}));
    t.call("add_namespace", json!({"nqn": NQN, "nsid": 2, "backend": "ram", "size": "8M"}));
    let second = ids(2);
    assert_ne!(first.0, second.0, "the NGUID of a new namespace under NSID 2");
    assert_ne!(first.1, second.1, "the EUI-64 of a new namespace under NSID 2");
    assert_ne!(first.2, second.2, "the UUID of a new namespace under NSID 2");
    assert!(second.2.is_some_and(|u| u[6] >> 4 == 4), "a random (version 4) UUID");

    t.kill9();
    let t = TargetProcess::start(&args, &sock, &log);
    assert_eq!(ids(2), second, "the added namespace after the restart");
    assert_eq!(ids(1), file_ns, "the configuration file's namespace after the restart");
    drop(t);
}
