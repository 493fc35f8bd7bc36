//! A namespace resized under devices that are open: each device of a context (one
//! controller's namespace, a namespace spread over several queues, a multipath head)
//! follows its namespace's new size without being opened again. Grown: a read past the
//! old end succeeds and returns the new blocks' zeros. Shrunk: I/O past the new end is
//! refused by the host itself, as Linux's block layer does once it revalidated the disk,
//! with the error the host gives for any range beyond a device's end.

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op, QueueSpread};
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

const MIB: u64 = 1 << 20;

fn connect(addr: std::net::SocketAddr, queues: u16) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, DEFAULT_NQN);
    o.nr_io_queues = queues;
    o.kato_ms = 2000;
    Controller::connect(o).expect("the host connects")
}

/// Resizes namespace 1 to `mib` MiB and waits (at most 10 s) until every controller's
/// rescan (after the Namespace Attribute Changed event) shows it.
fn resize(server: &Server, ctrls: &[&Arc<Controller>], mib: u64) {
    let r = call(server, "resize_namespace", &json!({"nqn": DEFAULT_NQN, "nsid": 1, "size": format!("{mib}M")}));
    r.expect("the target resizes the namespace");
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in ctrls {
        while c.namespace(Nsid(1)).is_none_or(|n| n.size_bytes() != mib * MIB) {
            assert!(Instant::now() < deadline, "the host's controller did not see {mib} MiB");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// [`loopback::io_4k`], a refusal at submission as its kind.
fn io(ctx: &mut Context, dev: DeviceId, op: Op, offset: u64, byte: u8) -> Result<(Status, Vec<u8>), ErrorKind> {
    loopback::io_4k(ctx, dev, op, offset, byte).map_err(|e| e.kind)
}

/// Grows 16 → 24 MiB and shrinks to 8 MiB under the open `devs`.
fn grow_then_shrink(server: &Server, ctrls: &[&Arc<Controller>], ctx: &mut Context, devs: &[DeviceId]) {
    for &dev in devs {
        assert_eq!(ctx.capacity(dev), 16 * MIB);
        assert_eq!(io(ctx, dev, Op::Read, 16 * MIB, 0), Err(ErrorKind::Invalid), "past the end before the resize");
    }
    resize(server, ctrls, 24);
    for &dev in devs {
        let (st, data) = io(ctx, dev, Op::Read, 16 * MIB, 0xee).expect("a read past the old end is sent");
        assert_eq!(st, Status::SUCCESS);
        assert!(data.iter().all(|&b| b == 0), "the grown blocks read as zeros");
        assert_eq!(ctx.capacity(dev), 24 * MIB);
        assert_eq!(io(ctx, dev, Op::Write, 24 * MIB - 4096, 0x5a), Ok((Status::SUCCESS, vec![0x5a; 4096])));
        assert_eq!(io(ctx, dev, Op::Read, 24 * MIB - 4096, 0), Ok((Status::SUCCESS, vec![0x5a; 4096])));
        // The target shrinks only over blocks that hold no data.
        assert_eq!(io(ctx, dev, Op::WriteZeroes, 24 * MIB - 4096, 0).map(|r| r.0), Ok(Status::SUCCESS));
    }
    resize(server, ctrls, 8);
    // One poll turn: the context re-reads the sizes of the devices whose controllers changed.
    ctx.poll(Wait::Poll).unwrap();
    for &dev in devs {
        assert_eq!(ctx.capacity(dev), 8 * MIB);
        assert_eq!(io(ctx, dev, Op::Read, 8 * MIB, 0), Err(ErrorKind::Invalid), "refused by the host itself");
        assert_eq!(io(ctx, dev, Op::Write, 16 * MIB, 0), Err(ErrorKind::Invalid));
        assert_eq!(io(ctx, dev, Op::Read, 8 * MIB - 4096, 0).map(|r| r.0), Ok(Status::SUCCESS), "within the new end");
    }
}

#[test]
fn an_open_device_follows_its_namespace_through_a_grow_and_a_shrink() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect(addrs[0], 1);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    grow_then_shrink(&server, &[&ctrl], &mut ctx, &[dev]);
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn a_spread_device_follows_its_namespace_through_a_grow_and_a_shrink() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = connect(addrs[0], 2);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let keys = ctx.attach_queues(&ctrl, 2).unwrap();
    let dev = ctx.open_spread(&keys, Nsid(1), QueueSpread::RoundRobin).unwrap();
    grow_then_shrink(&server, &[&ctrl], &mut ctx, &[dev]);
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn a_multipath_head_follows_its_namespace_through_a_grow_and_a_shrink() {
    let (server, addrs) = loopback::target(1, "16M");
    let (a, b) = (connect(addrs[0], 1), connect(addrs[1], 1));
    let heads = Head::build(&[Arc::clone(&a), Arc::clone(&b)], Policy::RoundRobin { rr_min_io: 1 });
    assert_eq!((heads.len(), heads[0].path_count()), (1, 2), "one head over both ports");
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(&heads[0]).unwrap();
    grow_then_shrink(&server, &[&a, &b], &mut ctx, &[dev]);
    drop(ctx);
    a.delete();
    b.delete();
    server.shutdown();
}
