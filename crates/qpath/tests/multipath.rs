//! Multipath heads against our target with two ports: round-robin spreads
//! I/O, an ANA flip and a dropped path move I/O to the other path with no
//! error, and the policy switches at runtime.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod loopback;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use host::context::{Completion, Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use host::head::Head;
use host::mpath::{PathClass, PathIndex, Policy, Selection};
use nvme::{AnaGrpId, AnaState};
use uring::{IoBuf, Wait};

fn connect(addr: std::net::SocketAddr) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.reconnect_delay = Duration::from_millis(100);
    o.kato_ms = 2000;
    Controller::connect(o).unwrap()
}

fn run_io(ctx: &mut Context, dev: DeviceId, n: u64, seed: u64) {
    // Writes then reads back, QD 8.
    let mut pending = 0;
    let mut done: Vec<Completion> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..n {
        let mut b = IoBuf::new(4096);
        b.set_len(4096);
        b.fill((i + seed) as u8);
        ctx.submit(dev, Op::Write, i * 4096, 4096, Some(b), i).map_err(|(e, _)| e).unwrap();
        pending += 1;
        while pending >= 8 {
            assert!(Instant::now() < deadline, "timed out");
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
            for c in ctx.completions() {
                pending -= 1;
                done.push(c);
            }
        }
    }
    while pending > 0 {
        assert!(Instant::now() < deadline, "timed out");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        for c in ctx.completions() {
            pending -= 1;
            done.push(c);
        }
    }
    let bad: Vec<_> = done.iter().filter(|c| !c.status.is_success()).map(|c| c.status).collect();
    assert!(bad.is_empty(), "I/O errors surfaced (seed {seed}): {bad:?}");
    for i in (0..n).step_by(7) {
        ctx.submit(dev, Op::Read, i * 4096, 4096, Some(IoBuf::new(4096)), i).map_err(|(e, _)| e).unwrap();
        let c = loop {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
            if let Some(c) = ctx.completions().next() {
                break c;
            }
            assert!(Instant::now() < deadline);
        };
        assert!(c.status.is_success());
        assert!(c.buf.unwrap().iter().all(|&b| b == (i + seed) as u8), "data at block {i}");
    }
}

#[test]
fn head_fails_over_on_ana_and_link_loss() {
    let (server, addrs) = loopback::target(1, "64M");
    let ctrls: Vec<_> = addrs.iter().map(|a| connect(*a)).collect();
    let heads = Head::build(&ctrls, Policy::ROUND_ROBIN);
    assert_eq!(heads.len(), 1, "one namespace, two paths");
    let head = &heads[0];
    assert_eq!(head.path_count(), 2);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(head).unwrap();

    run_io(&mut ctx, dev, 200, 1);
    let r = ctx.path_report(dev);
    assert!(r.iter().all(|p| p.ios > 50), "round-robin uses both paths: {r:?}");

    // ANA: port 1's group becomes inaccessible; the host learns it from the AEN.
    server.state.set_ana_state(1, AnaGrpId(1), AnaState::Inaccessible).unwrap();
    let before: Vec<u64> = ctx.path_report(dev).iter().map(|p| p.ios).collect();
    run_io(&mut ctx, dev, 200, 2);
    let after: Vec<u64> = ctx.path_report(dev).iter().map(|p| p.ios).collect();
    let path0_new = after[0] - before[0];
    assert!(path0_new < 20, "few I/Os on the inaccessible path (only until the AEN arrived): {path0_new}");
    let t = Instant::now();
    while ctx.path_report(dev)[0].class != PathClass::Transient && t.elapsed() < Duration::from_secs(5) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
    }
    assert_eq!(ctx.path_report(dev)[0].class, PathClass::Transient);
    server.state.set_ana_state(1, AnaGrpId(1), AnaState::Optimized).unwrap();

    // Link loss: every connection on port 2 drops; I/O continues on port 1 and
    // port 2 comes back by itself.
    let t = Instant::now();
    while ctx.path_report(dev)[0].class != PathClass::Optimized && t.elapsed() < Duration::from_secs(5) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
    }
    server.state.port(2).unwrap().faults.drop_generation.fetch_add(1, Ordering::Relaxed);
    run_io(&mut ctx, dev, 300, 3);
    let t = Instant::now();
    while ctrls[1].info().reconnects == 0 && t.elapsed() < Duration::from_secs(10) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
    }
    assert!(ctrls[1].info().reconnects >= 1, "the dropped path reconnected");

    // Policy switch at runtime: queue-depth.
    head.set_policy(Policy::QueueDepth);
    run_io(&mut ctx, dev, 100, 4);

    // Seed 000's reference selectors carry real I/O too (for the lab's same-run comparison).
    use host::head::ReferenceSelector;
    use host::mpath::reference::{SharedAtomic, SumPerQueue};
    let classes = [PathClass::Optimized, PathClass::Optimized];
    head.set_reference(Some(ReferenceSelector::SumPerQueue(Arc::new(SumPerQueue::new(&classes, 32)))));
    run_io(&mut ctx, dev, 100, 5);
    let shared = Arc::new(SharedAtomic::new(&classes));
    head.set_reference(Some(ReferenceSelector::SharedAtomic(Arc::clone(&shared))));
    run_io(&mut ctx, dev, 100, 6);
    // The context counts its I/O in the reference: up while a write is in flight (on the
    // first path, ties going to the first), down when it completes.
    assert_eq!(shared.select(), Selection::Submit(PathIndex(0)), "nothing in flight");
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    ctx.submit(dev, Op::Write, 0, 4096, Some(b), 99).map_err(|(e, _)| e).unwrap();
    assert_eq!(shared.select(), Selection::Submit(PathIndex(1)), "the write counted on the first path");
    let t = Instant::now();
    while ctx.completions().next().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "the write completes");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
    }
    assert_eq!(shared.select(), Selection::Submit(PathIndex(0)), "counted down at completion");
    head.set_reference(None);
    run_io(&mut ctx, dev, 50, 7);
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    server.shutdown();
}
