//! Seed 004: I/O queues apart from completion contexts. One context owns N I/O
//! queues of one controller and spreads a device's submissions over them (round
//! robin, or by submitter through blk's queue map); N contexts each own the queues
//! blk's context map deals them. Data written through one queue reads back through
//! another, each queue carries the I/O its map says, and no queue is owned twice.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

use std::sync::Arc;
use std::time::{Duration, Instant};

use blk::{ContextId, ContextMap, ContextSpread, QueueMap};
use host::ErrorKind;
use host::context::{Completion, Context, ContextOptions, DeviceId, Op, QueueSpread};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use target::config::{Config, SizeValue};
use target::reactor::{PollMode, ReactorOptions};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:spread";
const QUEUES: u16 = 4;

fn start_target() -> (target::server::Server, std::net::SocketAddr) {
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 2, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports.truncate(1);
    c.ports[0].addr = "127.0.0.1:0".into();
    let sub = &mut c.subsystems[0];
    sub.nqn = NQN.into();
    sub.namespaces.truncate(1);
    sub.namespaces[0].backend = "ram".into();
    sub.namespaces[0].size = Some(SizeValue::Text("64M".into()));
    let server = c.start().unwrap();
    let addr = server.local_addr(1).expect("the embedded default's port 1");
    (server, addr)
}

fn connect(addr: std::net::SocketAddr) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, NQN);
    o.nr_io_queues = QUEUES;
    o.queue_size = 32;
    Controller::connect(o).unwrap()
}

fn wait_done(ctx: &mut Context, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        assert!(Instant::now() < deadline, "timed out waiting for {n} completions (got {})", out.len());
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        out.extend(ctx.completions());
    }
    out
}

fn pattern(seed: u64) -> IoBuf {
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8;
    }
    b
}

/// Completed I/Os per queue index of this context.
fn ios_by_queue(ctx: &Context) -> Vec<(u16, u64)> {
    let mut v: Vec<(u16, u64)> = ctx.queue_stats().map(|(_, i, s)| (i, s.ios())).collect();
    v.sort_unstable();
    v
}

fn submit(ctx: &mut Context, dev: DeviceId, submitter: u32, op: Op, block: u64, buf: IoBuf) {
    ctx.submit_from(dev, submitter, op, block << 12, 4096, Some(buf), block).map_err(|(e, _)| e).unwrap();
}

#[test]
fn one_context_spreads_a_device_over_its_queues() {
    let (server, addr) = start_target();
    let ctrl = connect(addr);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    assert_eq!(ctx.attach_queues(&ctrl, 0).unwrap_err().kind, ErrorKind::Invalid);
    assert_eq!(ctx.attach_queues(&ctrl, usize::from(QUEUES) + 1).unwrap_err().kind, ErrorKind::Invalid);
    let keys = ctx.attach_queues(&ctrl, usize::from(QUEUES)).unwrap();
    assert_eq!(keys.len(), usize::from(QUEUES));
    assert!(ctrl.free_queues().is_empty(), "the context holds every queue: {:?}", ctrl.free_queues());
    assert_eq!(ctx.open_spread(&[], Nsid(1), QueueSpread::RoundRobin).unwrap_err().kind, ErrorKind::Invalid);

    // Round robin: 128 writes land 32 on each queue, then read back in another order
    // (each block's read goes to a different queue than its write did).
    let rr = ctx.open_spread(&keys, Nsid(1), QueueSpread::RoundRobin).unwrap();
    let n = 128u64;
    for b in 0..n {
        submit(&mut ctx, rr, 0, Op::Write, b, pattern(b));
    }
    assert!(wait_done(&mut ctx, n as usize).iter().all(|c| c.status.is_success()));
    assert_eq!(ios_by_queue(&ctx), (0..QUEUES).map(|q| (q, 32)).collect::<Vec<_>>());
    submit(&mut ctx, rr, 0, Op::Read, 0, IoBuf::new(4096)); // shifts the rotation by one
    for b in (0..n).rev() {
        submit(&mut ctx, rr, 0, Op::Read, b, IoBuf::new(4096));
    }
    let done = wait_done(&mut ctx, n as usize + 1);
    for c in &done {
        assert!(c.status.is_success(), "read {}: {}", c.token, c.status);
        let got = c.buf.as_ref().unwrap();
        assert!(got.as_full()[..4096] == pattern(c.token)[..4096], "block {} reads back", c.token);
    }

    // By submitter: 8 submitters over 4 queues, as blk maps CPUs (2 per queue).
    let submitters = 8usize;
    let by = ctx.open_spread(&keys, Nsid(1), QueueSpread::BySubmitter { submitters }).unwrap();
    let map = QueueMap::spread(submitters, QUEUES).unwrap();
    for s in 0..submitters {
        let before = ios_by_queue(&ctx);
        let k = s as u64 + 1;
        for b in 0..k {
            submit(&mut ctx, by, s as u32, Op::Read, b, IoBuf::new(4096));
        }
        assert!(wait_done(&mut ctx, k as usize).iter().all(|c| c.status.is_success()));
        let after = ios_by_queue(&ctx);
        let mine = map.queue(s).0;
        for ((q, a), (_, b)) in after.iter().zip(&before) {
            let expect = if *q == mine { k } else { 0 };
            assert_eq!(a - b, expect, "submitter {s} (queue {mine}): queue {q}");
        }
    }
    drop(ctx);
    assert_eq!(ctrl.free_queues().len(), usize::from(QUEUES), "a dropped context gives its queues back");
    ctrl.delete();
    server.shutdown();
}

#[test]
fn contexts_own_the_queues_the_context_map_deals_them() {
    let (server, addr) = start_target();
    let ctrl = connect(addr);
    let contexts = 2u16;
    let map = ContextMap::new(QUEUES, contexts, ContextSpread::Contiguous).unwrap();
    let wrong = ContextMap::new(QUEUES + 1, contexts, ContextSpread::Contiguous).unwrap();
    let mut probe = Context::new(ContextOptions::default()).unwrap();
    assert_eq!(probe.attach_mapped(&ctrl, &wrong, ContextId(0)).unwrap_err().kind, ErrorKind::Invalid);
    drop(probe);

    let barrier = std::sync::Barrier::new(usize::from(contexts) + 1);
    let per_context = std::thread::scope(|s| {
        let handles: Vec<_> = (0..contexts)
            .map(|c| {
                let (ctrl, map, barrier) = (&ctrl, &map, &barrier);
                s.spawn(move || {
                    let mut ctx = Context::new(ContextOptions::default()).unwrap();
                    let keys = ctx.attach_mapped(ctrl, map, ContextId(c)).unwrap();
                    let dev = ctx.open_spread(&keys, Nsid(1), QueueSpread::RoundRobin).unwrap();
                    // Every context holds its queues before anyone checks ownership.
                    barrier.wait();
                    let base = u64::from(c) * 1000;
                    for b in 0..64 {
                        submit(&mut ctx, dev, 0, Op::Write, base + b, pattern(base + b));
                    }
                    assert!(wait_done(&mut ctx, 64).iter().all(|c| c.status.is_success()));
                    for b in 0..64 {
                        submit(&mut ctx, dev, 0, Op::Read, base + b, IoBuf::new(4096));
                    }
                    for d in wait_done(&mut ctx, 64) {
                        assert!(d.status.is_success());
                        assert!(d.buf.as_ref().unwrap().as_full()[..4096] == pattern(d.token)[..4096]);
                    }
                    barrier.wait();
                    ios_by_queue(&ctx)
                })
            })
            .collect();
        barrier.wait();
        // The map dealt all the queues: none is left for another context.
        assert!(ctrl.free_queues().is_empty());
        let mut late = Context::new(ContextOptions::default()).unwrap();
        assert_eq!(late.attach_mapped(&ctrl, &map, ContextId(0)).unwrap_err().kind, ErrorKind::Busy);
        drop(late);
        barrier.wait();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    for (c, ios) in per_context.iter().enumerate() {
        let queues: Vec<u16> = map.queues_of(ContextId(c as u16)).iter().map(|q| q.0).collect();
        assert_eq!(ios.iter().map(|(q, _)| *q).collect::<Vec<_>>(), queues, "context {c} owns what the map says");
        // 128 I/Os round robin over its queues.
        let each = 128 / queues.len() as u64;
        assert!(ios.iter().all(|(_, n)| *n == each), "context {c}: {ios:?}");
    }
    ctrl.delete();
    server.shutdown();
}
