//! Namespace and discovery administration seen by our host over loopback TCP: a resize
//! the host's controller picks up by itself (event, rescan) and writes past the old end;
//! per-host visibility with two host NQNs; a referral that `qpath discover` follows to a
//! second target; a removed port that takes its controller's queues with it while a
//! discovery controller on the other port hears about it.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use host::queue::{DataDir, Io, QueueConfig};
use host::sync::SyncQueue;
use nvme::features::{AsyncEvent, fid};
use nvme::log::subtype;
use nvme::{Nsid, Sqe};
use serde_json::json;
use target::config::{Config, DEFAULT_NQN, NamespaceConfig, SubsystemConfig, VisibleTo};
use target::rpc::call;
use target::server::Server;
use uring::{IoBuf, Wait};

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b";

fn connect_as(addr: std::net::SocketAddr, nqn: &str, hostnqn: &str) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, nqn);
    o.hostnqn = hostnqn.to_string();
    o.nr_io_queues = 1;
    o.kato_ms = 2000;
    o.reconnect_delay = Duration::from_millis(200);
    o.ctrl_loss_tmo = Some(Duration::from_secs(2));
    Controller::connect(o).expect("the host connects")
}

/// Waits (at most 10 s) until `what` holds.
fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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

fn filled(byte: u8) -> IoBuf {
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    b.fill(byte);
    b
}

#[test]
fn our_host_sees_a_resize_and_writes_past_the_old_end() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect_as(addrs[0], DEFAULT_NQN, HOST_A);
    assert_eq!(ctrl.namespace(Nsid(1)).unwrap().size_bytes(), 16 << 20);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let old = ctx.open(&ctrl, Nsid(1)).unwrap();
    assert_eq!(io(&mut ctx, old, Op::Write, (16 << 20) - 4096, filled(0x61)).0, nvme::Status::SUCCESS);

    let r = call(&server, "resize_namespace", &json!({"nqn": DEFAULT_NQN, "nsid": 1, "size": "24M"})).unwrap();
    assert_eq!(r["previous_size"], json!(16 << 20));
    // The controller's admin thread gets the event, reads the changed list, rescans.
    wait_for("the host's Identify shows 24 MiB", || {
        ctrl.namespace(Nsid(1)).is_some_and(|n| n.size_bytes() == 24 << 20)
    });

    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    assert_eq!(ctx.capacity(dev), 24 << 20);
    assert_eq!(
        io(&mut ctx, dev, Op::Write, (24 << 20) - 4096, filled(0x62)).0,
        nvme::Status::SUCCESS,
        "past the old end"
    );
    let (st, back) = io(&mut ctx, dev, Op::Read, (24 << 20) - 4096, IoBuf::new(4096));
    assert!(st.is_success() && back.unwrap().iter().all(|&b| b == 0x62));
    let (st, back) = io(&mut ctx, dev, Op::Read, (16 << 20) - 4096, IoBuf::new(4096));
    assert!(st.is_success() && back.unwrap().iter().all(|&b| b == 0x61), "the old end's data kept");
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn two_host_nqns_see_what_is_listed_for_them() {
    let mut c = Config::embedded_default();
    c.reactor.reactors = 1;
    for p in &mut c.ports {
        p.addr = "127.0.0.1:0".into();
    }
    let mut listed = NamespaceConfig::ram(2, "8M");
    listed.visible = VisibleTo::Listed;
    listed.hosts = vec![HOST_A.into()];
    c.subsystems = vec![SubsystemConfig::open(DEFAULT_NQN, vec![NamespaceConfig::ram(1, "8M"), listed])];
    let server = c.start().unwrap();
    let addr = server.local_addr(1).unwrap();
    let a = connect_as(addr, DEFAULT_NQN, HOST_A);
    let b = connect_as(addr, DEFAULT_NQN, HOST_B);
    let nsids = |c: &Controller| c.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>();
    assert_eq!(nsids(&a), vec![Nsid(1), Nsid(2)]);
    assert_eq!(nsids(&b), vec![Nsid(1)], "B's Active Namespace List lacks NSID 2");

    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let da = ctx.open(&a, Nsid(2)).unwrap();
    assert!(io(&mut ctx, da, Op::Write, 0, filled(0x5a)).0.is_success());
    assert!(ctx.open(&b, Nsid(2)).is_err(), "B cannot open what it does not see");

    let a_changes = a.change_count();
    let r = call(&server, "ns_add_host", &json!({"nqn": DEFAULT_NQN, "nsid": 2, "host": HOST_B})).unwrap();
    assert_eq!(r, json!({"changed": true}));
    wait_for("B sees NSID 2 after ns_add_host", || nsids(&b) == vec![Nsid(1), Nsid(2)]);
    let db = ctx.open(&b, Nsid(2)).unwrap();
    let (st, back) = io(&mut ctx, db, Op::Read, 0, IoBuf::new(4096));
    assert!(st.is_success() && back.unwrap().iter().all(|&x| x == 0x5a), "B reads what A wrote");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.change_count(), a_changes, "A's view did not change: no event, no rescan");

    call(&server, "ns_remove_host", &json!({"nqn": DEFAULT_NQN, "nsid": 2, "host": HOST_B})).unwrap();
    wait_for("NSID 2 is gone from B after ns_remove_host", || nsids(&b) == vec![Nsid(1)]);
    drop(ctx);
    a.delete();
    b.delete();
    server.shutdown();
}

/// A second target, serving `nqn` on one loopback port.
fn second_target(nqn: &str) -> Server {
    let mut c = Config::embedded_default();
    c.reactor.reactors = 1;
    c.ports.truncate(1);
    c.ports[0].addr = "127.0.0.1:0".into();
    c.subsystems = vec![SubsystemConfig::open(nqn, vec![NamespaceConfig::ram(1, "4M")])];
    c.start().unwrap()
}

#[test]
fn qpath_discover_follows_a_referral_to_another_target() {
    let (a, addrs) = loopback::target(1, "4M");
    let remote_nqn = "nqn.2026-11.io.qpath:referred";
    let b = second_target(remote_nqn);
    let b_addr = b.local_addr(1).unwrap();
    let r = json!({"address": "127.0.0.1", "port": b_addr.port()});
    call(&a, "add_referral", &r).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["discover", "-a", "127.0.0.1", "-s", &addrs[0].port().to_string(), "-q", HOST_A])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "qpath discover: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let entries: Vec<&str> = text.split("=====Discovery Log Entry").skip(1).collect();
    let referral = entries.iter().find(|e| e.contains("subtype: referral")).expect("A lists the referral");
    assert!(referral.contains(&format!("trsvcid: {}", b_addr.port())), "{referral}");
    let remote = entries
        .iter()
        .find(|e| e.contains(&format!("subnqn:  {remote_nqn}")))
        .unwrap_or_else(|| panic!("B's subsystem, found through the referral:\n{text}"));
    assert!(remote.contains(&format!("via:     {b_addr}")), "{remote}");
    assert!(remote.contains("subtype: nvme subsystem"));

    call(&a, "remove_referral", &r).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["discover", "-a", "127.0.0.1", "-s", &addrs[0].port().to_string(), "-q", HOST_A])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(remote_nqn), "the referral is gone");
    a.shutdown();
    b.shutdown();
}

#[test]
fn a_removed_port_drops_its_controller_and_the_other_port_announces_it() {
    let (server, addrs) = loopback::target(1, "4M");
    let ctrl = connect_as(addrs[0], DEFAULT_NQN, HOST_A);
    assert!(ctrl.is_live());

    // A persistent discovery controller on port 2: KATO, discovery log change events, an AER.
    let mut cfg = QueueConfig::io(0, 32, nvme::Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, HOST_B, [0xb; 16]);
    cfg.kato_ms = 10_000;
    let mut d = SyncQueue::connect(addrs[1], cfg, Duration::from_secs(5)).unwrap();
    host::admin::enable(&mut d).unwrap();
    d.command(Sqe::set_features(nvme::Cid(0), fid::ASYNC_EVENT, 1 << 31), Duration::from_secs(5)).unwrap();
    let before = host::admin::discovery_log(&mut d).unwrap();
    assert_eq!(before.entries.iter().filter(|e| e.subtype == subtype::NVM).count(), 2);
    let aer = Io { sqe: Sqe::async_event_request(nvme::Cid(0)), buf: None, len: 0, dir: DataDir::None, token: 0 };
    let aer = d.submit(aer).unwrap();

    call(&server, "remove_port", &json!({"id": 1})).unwrap();

    // The discovery controller on port 2 hears of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        if let Some(done) = d.take(aer) {
            break done;
        }
        d.pump(deadline).expect("the AER completes in time");
    };
    assert_eq!(done.cqe.dw0, AsyncEvent::DISCOVERY_CHANGE.to_dw0());
    let after = host::admin::discovery_log(&mut d).unwrap();
    assert!(after.genctr > before.genctr);
    let nvm: Vec<_> = after.entries.iter().filter(|e| e.subtype == subtype::NVM).map(|e| e.portid).collect();
    assert_eq!(nvm, vec![2], "only port 2 is left");

    // The host's controller on port 1 lost its queues as on a link failure; the target
    // has no controller on port 1 any more.
    wait_for("the host's controller leaves the live state", || !ctrl.is_live());
    wait_for("no controller left on port 1", || {
        let list = call(&server, "list_controllers", &json!({})).unwrap();
        list.as_array().unwrap().iter().all(|c| c["port"] != json!(1))
    });
    assert_eq!(call(&server, "remove_port", &json!({"id": 1})).unwrap_err().to_string(), "no port 1");
    ctrl.delete();
    server.shutdown();
}
