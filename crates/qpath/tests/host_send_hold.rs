//! A blocking poll holds its sends' completions (waits for one completion more) only
//! while several requests are in flight: then a batch's send and its first response
//! are reaped by one system call instead of two. At QD1 it wakes for the send's
//! completion as before: the response is the next completion anyway, and holding put
//! the thread to sleep inside the submitting call, which made each QD1 I/O a few µs
//! slower (a wake-up from idle instead of entering again while the response is close).

mod loopback;

use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use uring::{IoBuf, RingStats, Wait};

/// Runs `n` 4 KiB reads with `depth` in flight, polling `Wait::Block`; the ring's
/// counters over the run.
fn run(ctx: &mut Context, dev: host::context::DeviceId, depth: usize, n: u64) -> RingStats {
    let before = ctx.ring().stats();
    let mut bufs: Vec<IoBuf> = (0..depth).map(|_| IoBuf::new(4096)).collect();
    let (mut sent, mut done) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < n {
        assert!(Instant::now() < deadline, "{done} of {n} reads in 60 s");
        while sent < n
            && let Some(b) = bufs.pop()
        {
            ctx.submit(dev, Op::Read, (sent % 1024) * 4096, 4096, Some(b), sent).map_err(|(e, _)| e).unwrap();
            sent += 1;
        }
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(50)) }).unwrap();
        for c in ctx.completions() {
            assert!(c.status.is_success(), "read {}: {}", c.token, c.status);
            bufs.push(c.buf.unwrap());
            done += 1;
        }
    }
    let after = ctx.ring().stats();
    RingStats {
        enters: after.enters - before.enters,
        held_waits: after.held_waits - before.held_waits,
        completions: after.completions - before.completions,
        ..RingStats::default()
    }
}

#[test]
fn a_blocking_poll_holds_send_completions_only_with_several_requests_in_flight() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = Controller::connect(ConnectOptions::new(addrs[0], target::config::DEFAULT_NQN)).unwrap();
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    if !ctx.ring().features().min_wait {
        println!("SKIP: this kernel's io_uring has no minimum wait (IORING_FEAT_MIN_TIMEOUT, Linux 6.12)");
        return;
    }
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    let qd1 = run(&mut ctx, dev, 1, 500);
    println!("QD1: {qd1:?}");
    assert_eq!(qd1.held_waits, 0, "QD1 never holds: {qd1:?}");
    let qd8 = run(&mut ctx, dev, 8, 4000);
    println!("QD8: {qd8:?}");
    assert!(qd8.held_waits > 0, "QD8 holds the batches' sends: {qd8:?}");
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}
