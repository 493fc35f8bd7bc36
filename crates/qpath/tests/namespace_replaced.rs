//! A namespace removed from the target and another added under the same NSID while a
//! host device is open on it: once the host's controllers have rescanned (after the
//! Namespace Attribute Changed event), the device refuses I/O with the error a removed
//! namespace gives, and nothing it was asked to write reaches the new namespace, which a
//! second, fresh controller reads back as zeros. As Linux, which removes a disk whose
//! namespace's identifiers changed (`nvme_validate_ns` in `drivers/nvme/host/core.c`).
//!
//! A namespace only removed: the device refuses I/O at once too, rather than sending it
//! for the target to answer Invalid Namespace.
//!
//! The new namespace is added as an operator would, without identifiers of its own: the
//! target gives a namespace added while it runs a new UUID, NGUID and EUI-64.

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use host::error::ErrorKind;
use host::head::Head;
use host::mpath::Policy;
use nvme::{Nsid, Status};
use serde_json::json;
use target::config::DEFAULT_NQN;
use target::rpc::call;
use target::server::Server;
use uring::Wait;

fn connect(addr: std::net::SocketAddr) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.kato_ms = 2000;
    Controller::connect(o).expect("the host connects")
}

/// [`loopback::io_4k`], a refusal at submission as its kind and message.
fn io(
    ctx: &mut Context,
    dev: DeviceId,
    op: Op,
    offset: u64,
    byte: u8,
) -> Result<(Status, Vec<u8>), (ErrorKind, String)> {
    loopback::io_4k(ctx, dev, op, offset, byte).map_err(|e| (e.kind, e.to_string()))
}

/// Removes namespace 1 and adds a new RAM namespace under NSID 1 (no identifiers given),
/// then waits (at most 10 s) until every controller's rescan lists the new one: another
/// NGUID than the old one's.
fn replace_namespace(server: &Server, ctrls: &[&Arc<Controller>]) {
    let old = ctrls[0].namespace(Nsid(1)).expect("namespace 1 is listed").nguid;
    call(server, "remove_namespace", &json!({"nqn": DEFAULT_NQN, "nsid": 1})).expect("the target removes it");
    let add = json!({"nqn": DEFAULT_NQN, "nsid": 1, "backend": "ram", "size": "16M"});
    call(server, "add_namespace", &add).expect("the target adds another under NSID 1");
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in ctrls {
        while c.namespace(Nsid(1)).is_none_or(|n| n.nguid == old) {
            assert!(Instant::now() < deadline, "the host's controller did not rescan");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes 0x5a at block offsets 0 and 1 MiB of `dev` (acknowledged by the old namespace),
/// replaces the namespace, and checks that every I/O is refused from the next poll turn on.
fn write_replace_refuse(server: &Server, ctrls: &[&Arc<Controller>], ctx: &mut Context, dev: DeviceId) {
    for off in [0, 1 << 20] {
        assert_eq!(io(ctx, dev, Op::Write, off, 0x5a).map(|r| r.0), Ok(Status::SUCCESS));
    }
    replace_namespace(server, ctrls);
    // One poll turn: the context compares the identifiers of the devices whose
    // controllers changed.
    ctx.poll(Wait::Poll).unwrap();
    for (op, off) in [(Op::Write, 0), (Op::Write, 2 << 20), (Op::Read, 0), (Op::Flush, 0)] {
        let (kind, why) = io(ctx, dev, op, off, 0xa5).map(|r| r.0).expect_err("the device refuses I/O");
        assert_eq!(kind, ErrorKind::NamespaceGone, "{op:?}: {why}");
        assert!(why.contains("namespace 1 was replaced"), "{why}");
    }
}

/// Reads namespace 1 through a fresh controller: the new namespace holds only zeros
/// where the host wrote before and tried to write after.
fn assert_new_namespace_untouched(addr: std::net::SocketAddr) {
    let fresh = connect(addr);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&fresh, Nsid(1)).unwrap();
    for off in [0, 1 << 20, 2 << 20] {
        let (st, data) = io(&mut ctx, dev, Op::Read, off, 0xee).expect("the fresh controller reads");
        assert_eq!(st, Status::SUCCESS);
        assert!(data.iter().all(|&b| b == 0), "offset {off}: the new namespace holds no write of the old device");
    }
    drop(ctx);
    fresh.delete();
}

#[test]
fn a_device_refuses_io_once_another_namespace_is_under_its_nsid_and_writes_none_to_it() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect(addrs[0]);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    write_replace_refuse(&server, &[&ctrl], &mut ctx, dev);
    assert_new_namespace_untouched(addrs[0]);
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn a_multipath_head_refuses_io_once_every_path_has_another_namespace_under_its_nsid() {
    let (server, addrs) = loopback::target(1, "16M");
    let (a, b) = (connect(addrs[0]), connect(addrs[1]));
    let heads = Head::build(&[Arc::clone(&a), Arc::clone(&b)], Policy::RoundRobin { rr_min_io: 1 });
    assert_eq!((heads.len(), heads[0].path_count()), (1, 2), "one head over both ports");
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(&heads[0]).unwrap();
    write_replace_refuse(&server, &[&a, &b], &mut ctx, dev);
    assert_new_namespace_untouched(addrs[1]);
    drop(ctx);
    a.delete();
    b.delete();
    server.shutdown();
}

#[test]
fn a_device_whose_namespace_was_removed_fails_io_at_once_instead_of_sending_it() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect(addrs[0]);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    assert_eq!(io(&mut ctx, dev, Op::Write, 0, 0x5a).map(|r| r.0), Ok(Status::SUCCESS));
    call(&server, "remove_namespace", &json!({"nqn": DEFAULT_NQN, "nsid": 1})).expect("the target removes it");
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctrl.namespace(Nsid(1)).is_some() {
        assert!(Instant::now() < deadline, "the host's controller did not rescan");
        std::thread::sleep(Duration::from_millis(10));
    }
    ctx.poll(Wait::Poll).unwrap();
    let (kind, why) = io(&mut ctx, dev, Op::Write, 0, 0xa5).map(|r| r.0).expect_err("refused at submission");
    assert_eq!(kind, ErrorKind::NamespaceGone, "{why}");
    assert!(why.contains("namespace 1 was removed"), "{why}");
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

/// A head made for a namespace is opened again (an NBD client connecting to an export, a
/// ublk queue starting) after the target replaced the namespace: the open is refused, so a
/// new device never reaches the other namespace, which stays untouched.
#[test]
fn a_head_is_not_opened_again_once_another_namespace_is_under_its_nsid() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect(addrs[0]);
    let heads = Head::build(&[Arc::clone(&ctrl)], Policy::Numa);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(&heads[0]).expect("the head opens while its namespace is there");
    assert_eq!(io(&mut ctx, dev, Op::Write, 0, 0x5a).map(|r| r.0), Ok(Status::SUCCESS));
    drop(ctx);
    replace_namespace(&server, &[&ctrl]);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let e = ctx.open_head(&heads[0]).expect_err("a head is not opened on another namespace");
    assert_eq!(e.kind, ErrorKind::NamespaceGone, "{e}");
    assert!(e.to_string().contains("namespace 1 of") && e.to_string().contains("was replaced"), "{e}");
    drop(ctx);
    assert_new_namespace_untouched(addrs[0]);
    ctrl.delete();
    server.shutdown();
}
