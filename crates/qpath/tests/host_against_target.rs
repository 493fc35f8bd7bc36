//! Our host against our target over loopback TCP: bring-up, I/O of every
//! size with verification, digests, flush/zeroes/discard, and a target
//! restart inside ctrl_loss_tmo that the host rides through without errors.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Completion, Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller, CtrlState};
use nvme::Nsid;
use target::config::{Config, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};
use uring::{IoBuf, Wait};

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:hosttest";

fn config(port: u16) -> Config {
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports = vec![PortConfig::io(1, format!("127.0.0.1:{port}"))];
    c.subsystems = vec![SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "64M")])];
    c
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

fn pattern(len: usize, seed: u64) -> IoBuf {
    let mut b = IoBuf::new(len.next_multiple_of(4096));
    b.set_len(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8;
    }
    b
}

fn write_read(ctx: &mut Context, dev: DeviceId, offset: u64, len: usize, seed: u64) {
    let w = pattern(len, seed);
    let expect = w[..len].to_vec();
    ctx.submit(dev, Op::Write, offset, len as u32, Some(w), 1).map_err(|(e, _)| e).unwrap();
    let c = wait_done(ctx, 1);
    assert!(c[0].status.is_success(), "write {len} at {offset}: {}", c[0].status);
    ctx.submit(dev, Op::Read, offset, len as u32, Some(IoBuf::new(len.next_multiple_of(4096))), 2)
        .map_err(|(e, _)| e)
        .unwrap();
    let c = wait_done(ctx, 1);
    assert!(c[0].status.is_success());
    let got = c.into_iter().next().unwrap().buf.unwrap();
    assert!(got.as_full()[..len] == expect[..], "read back {len} at {offset}");
}

fn connect(port: u16, digests: bool) -> Arc<Controller> {
    let mut o = ConnectOptions::new(format!("127.0.0.1:{port}").parse().unwrap(), NQN);
    o.nr_io_queues = 2;
    o.hdr_digest = digests;
    o.data_digest = digests;
    o.reconnect_delay = Duration::from_millis(200);
    o.kato_ms = 2000;
    Controller::connect(o).unwrap()
}

#[test]
fn io_sizes_and_commands() {
    for digests in [false, true] {
        let port = free_port();
        let server = config(port).start().unwrap();
        let ctrl = connect(port, digests);
        assert_eq!(ctrl.state(), CtrlState::Live);
        let ns = ctrl.namespace(Nsid(1)).unwrap();
        assert_eq!(ns.size_bytes(), 64 << 20);
        let mut ctx = Context::new(ContextOptions::default()).unwrap();
        let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
        for (i, len) in [512usize, 4096, 8192, 12288, 65536, 256 * 1024, 1 << 20].into_iter().enumerate() {
            write_read(&mut ctx, dev, (i as u64) << 21, len, i as u64 + 7);
        }
        // Large reads in flight together: their payloads follow each other on the stream,
        // each received straight into its own buffer (host) from the RAM region (target).
        let big = 128 * 1024;
        for i in 0..16u64 {
            let b = pattern(big, 100 + i);
            ctx.submit(dev, Op::Write, 16 << 20 | (i << 17), big as u32, Some(b), i).map_err(|(e, _)| e).unwrap();
        }
        assert!(wait_done(&mut ctx, 16).iter().all(|c| c.status.is_success()));
        for i in 0..16u64 {
            let b = IoBuf::new(big);
            ctx.submit(dev, Op::Read, 16 << 20 | (i << 17), big as u32, Some(b), i).map_err(|(e, _)| e).unwrap();
        }
        for c in wait_done(&mut ctx, 16) {
            assert!(c.status.is_success(), "read {}: {}", c.token, c.status);
            let got = c.buf.unwrap();
            assert!(got[..big] == pattern(big, 100 + c.token)[..big], "read {} (digests {digests})", c.token);
        }
        // Many in flight at once (deeper than the queue: the rest wait for tags).
        let n = 300;
        for i in 0..n {
            let b = pattern(4096, i);
            ctx.submit(dev, Op::Write, 32 << 20 | (i << 12), 4096, Some(b), i).map_err(|(e, _)| e).unwrap();
        }
        let done = wait_done(&mut ctx, n as usize);
        assert!(done.iter().all(|c| c.status.is_success()));
        for op in [Op::Flush, Op::WriteZeroes, Op::Deallocate] {
            ctx.submit(dev, op, 0, 8192, None, 9).map_err(|(e, _)| e).unwrap();
            let c = wait_done(&mut ctx, 1);
            assert!(c[0].status.is_success(), "{op:?}: {}", c[0].status);
        }
        ctx.submit(dev, Op::Read, 0, 8192, Some(IoBuf::new(8192)), 3).map_err(|(e, _)| e).unwrap();
        let c = wait_done(&mut ctx, 1);
        assert!(c[0].buf.as_ref().unwrap()[..8192].iter().all(|&b| b == 0), "zeroed then discarded");
        drop(ctx);
        ctrl.delete();
        assert_eq!(ctrl.state(), CtrlState::Dead);
        server.shutdown();
    }
}

#[test]
fn target_restart_inside_ctrl_loss_tmo() {
    let port = free_port();
    let server = config(port).start().unwrap();
    let ctrl = connect(port, false);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    write_read(&mut ctx, dev, 0, 4096, 1);
    // Kill the target, submit while it is down, then bring it back on the same port.
    server.shutdown();
    for i in 0..16u64 {
        ctx.submit(dev, Op::Write, i << 12, 4096, Some(pattern(4096, 100 + i)), i).map_err(|(e, _)| e).unwrap();
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        assert_eq!(ctx.completions().count(), 0, "no I/O fails while the controller reconnects");
    }
    let server = config(port).start().unwrap();
    let done = wait_done(&mut ctx, 16);
    assert!(
        done.iter().all(|c| c.status.is_success()),
        "writes survived the restart: {:?}",
        done.iter().map(|c| c.status).collect::<Vec<_>>()
    );
    assert_eq!(ctrl.state(), CtrlState::Live);
    assert!(ctrl.info().reconnects >= 1);
    // The data written across the restart is there (RAM is new, so rewrite and verify).
    write_read(&mut ctx, dev, 1 << 20, 65536, 5);
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn user_queue_pair_raw_commands() {
    use host::passthru::{PtCompletion, QueuePair};
    use host::queue::DataDir;
    use nvme::opcode::io;
    use nvme::{Cid, SglDescriptor, Sqe};

    let port = free_port();
    let server = config(port).start().unwrap();
    let mut o = ConnectOptions::new(format!("127.0.0.1:{port}").parse().unwrap(), NQN);
    o.nr_io_queues = 1;
    o.nr_user_queues = 1;
    let ctrl = Controller::connect(o).unwrap();
    assert_eq!(ctrl.block_queue_count(), 1);
    assert_eq!(ctrl.free_user_queues().len(), 1);
    let mut qp = QueuePair::new(&ctrl).unwrap();
    assert!(QueuePair::new(&ctrl).is_err(), "only one user queue");
    let data = pattern(8192, 3);
    let expect = data[..8192].to_vec();
    let w = Sqe::rw(io::WRITE, Cid(0), Nsid(1), 64, 16, SglDescriptor::transport(8192));
    qp.submit(w, Some(data), 8192, DataDir::ToController, 1).map_err(|(e, _)| e).unwrap();
    let r = Sqe::rw(io::READ, Cid(0), Nsid(1), 64, 16, SglDescriptor::transport(8192));
    let mut out: Vec<PtCompletion> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.is_empty() {
        assert!(Instant::now() < deadline);
        qp.poll(&mut out).unwrap();
    }
    assert!(out[0].cqe.status.is_success());
    qp.submit(r, Some(IoBuf::new(8192)), 8192, DataDir::FromController, 2).map_err(|(e, _)| e).unwrap();
    while out.len() < 2 {
        assert!(Instant::now() < deadline);
        qp.poll(&mut out).unwrap();
    }
    assert_eq!(out[1].user_data, 2);
    assert!(out[1].buf.as_ref().unwrap()[..8192] == expect[..]);
    // The block core does not map the user queue: a context gets the other one.
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    write_read(&mut ctx, dev, 0, 4096, 9);
    drop(ctx);
    drop(qp);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn stuck_command_is_reported_once() {
    let port = free_port();
    let server = config(port).start().unwrap();
    // Target-side fault: reads on this port are never completed.
    server
        .state
        .port(1)
        .unwrap()
        .faults
        .stall_opcode
        .store(u64::from(nvme::opcode::io::READ) + 1, std::sync::atomic::Ordering::Relaxed);
    let ctrl = connect(port, false);
    let mut ctx =
        Context::new(ContextOptions { stall_threshold: Duration::from_millis(100), ..Default::default() }).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    write_read_write_only(&mut ctx, dev);
    ctx.submit(dev, Op::Read, 4096, 4096, Some(IoBuf::new(4096)), 77).map_err(|(e, _)| e).unwrap();
    let mut reports = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(600) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        reports.extend(ctx.take_stall_reports());
    }
    assert_eq!(reports.len(), 1, "exactly one report for one stuck command: {reports:?}");
    let r = &reports[0];
    assert_eq!(r.opcode, nvme::opcode::io::READ);
    assert_eq!(r.qid, 1);
    assert_eq!(r.cntlid, ctrl.cntlid().0);
    assert_eq!(r.traddr, ctrl.opts.traddr);
    assert!(r.age >= Duration::from_millis(100));
    assert!(r.queue_connected);
    assert_eq!(r.queue_outstanding, 1);
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

fn write_read_write_only(ctx: &mut Context, dev: DeviceId) {
    ctx.submit(dev, Op::Write, 0, 4096, Some(pattern(4096, 1)), 1).map_err(|(e, _)| e).unwrap();
    let c = wait_done(ctx, 1);
    assert!(c[0].status.is_success());
}

/// `TCP_CONGESTION` on both sides: a target whose ports use reno and a host asking for
/// reno move data; a name the kernel does not know fails the connect and says why.
#[test]
fn tcp_congestion_control_on_both_sides() {
    let port = free_port();
    let mut c = config(port);
    c.options.tcp_congestion = target::registry::TcpCongestion::Reno;
    let server = c.start().unwrap();
    let mut o = ConnectOptions::new(format!("127.0.0.1:{port}").parse().unwrap(), NQN);
    o.nr_io_queues = 1;
    o.tcp_congestion = Some("reno".into());
    let ctrl = Controller::connect(o.clone()).unwrap();
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    write_read(&mut ctx, dev, 0, 128 * 1024, 3);
    drop(ctx);
    ctrl.delete();
    o.tcp_congestion = Some("no-such-cc".into());
    let e = Controller::connect(o).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("congestion control"), "{e}");
    server.shutdown();
}

/// The context reads the clock once per poll turn and once per submission: a completion's
/// latency still runs from its own submission to the turn that reaped it, never from an
/// earlier turn's clock (an I/O submitted after an idle gap), never shorter than the
/// target's added delay, never longer than the caller saw.
#[test]
fn completion_latency_is_its_own_wait() {
    const DELAY: Duration = Duration::from_millis(3);
    let port = free_port();
    let mut cfg = config(port);
    cfg.subsystems[0].namespaces[0].qos.delay_us = u64::try_from(DELAY.as_micros()).unwrap();
    let server = cfg.start().unwrap();
    let ctrl = connect(port, false);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    for (i, gap) in [0u64, 30, 0, 50].into_iter().enumerate() {
        // An idle gap with polls: the turns before the submission must not date it.
        let idle = Instant::now();
        while idle.elapsed() < Duration::from_millis(gap) {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        }
        let t0 = Instant::now();
        ctx.submit(dev, Op::Read, 0, 4096, Some(IoBuf::new(4096)), i as u64).map_err(|(e, _)| e).unwrap();
        let c = wait_done(&mut ctx, 1);
        let wall = t0.elapsed();
        assert!(c[0].status.is_success(), "read {i}: {}", c[0].status);
        let lat = Duration::from_nanos(c[0].latency_ns);
        assert!(lat >= DELAY, "read {i} after {gap} ms idle: latency {lat:?} below the target's {DELAY:?} delay");
        assert!(lat <= wall, "read {i} after {gap} ms idle: latency {lat:?} above the {wall:?} the caller waited");
    }
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}
