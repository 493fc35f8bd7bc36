//! The failover hold over real loopback TCP: a write whose connection is lost while the
//! target still has it is sent on the other path only after the controller's quiesce
//! hold (NVMe Base 2.1 Command Quiesce Time; `host::failover`), a read at once.
//!
//! The lost path's target has executed both commands and holds their completions (an
//! injected delay), so the commands' fate is unknown to the host when the connection
//! drops: exactly the case where a write sent again at once can be overtaken by the old
//! copy (the simulator's seed 0).

mod loopback;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::head::Head;
use host::mpath::Policy;
use uring::{IoBuf, Wait};

const KATO_MS: u32 = 1000;
const QUIESCE: Duration = Duration::from_millis(500);

fn connect(addr: std::net::SocketAddr, ctrl_loss_tmo: Duration) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.reconnect_delay = Duration::from_millis(100);
    o.kato_ms = KATO_MS;
    o.command_quiesce_time = Some(QUIESCE);
    o.ctrl_loss_tmo = Some(ctrl_loss_tmo);
    Controller::connect(o).unwrap()
}

/// What became of the write and the read the test loses with their connection: their
/// statuses and when they completed, after the loss.
struct Lost {
    write: (nvme::Status, Duration),
    read: (nvme::Status, Duration),
}

/// Sends a write of 2s to block 0 and a read of block 1 on the path the policy uses, has
/// the target execute both and hold their answers, drops that path's connections, and
/// waits for both to complete (the context, device, controllers and target for more).
fn lose_a_write_and_a_read(
    ctrl_loss_tmo: Duration,
) -> (Lost, Context, host::context::DeviceId, Vec<Arc<Controller>>, target::server::Server) {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrls: Vec<_> = addrs.iter().map(|a| connect(*a, ctrl_loss_tmo)).collect();
    let heads = Head::build(&ctrls, Policy::Numa);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(&heads[0]).unwrap();
    let poll = |ctx: &mut Context| ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();

    // Which path the policy uses: that one gets lost.
    ctx.submit(dev, Op::Write, 0, 4096, Some(block(1)), 0).map_err(|(e, _)| e).unwrap();
    let t = Instant::now();
    while ctx.completions().next().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10));
        poll(&mut ctx);
    }
    let used = ctx.path_report(dev).iter().position(|p| p.ios > 0).expect("one path served the write");
    let port = server.state.ports()[used].id;
    let faults = &server.state.port(port).unwrap().faults;

    // The target executes both commands but answers 10 s later...
    faults.delay_us.store(10_000_000, Ordering::Relaxed);
    ctx.submit(dev, Op::Write, 0, 4096, Some(block(2)), 1).map_err(|(e, _)| e).unwrap();
    ctx.submit(dev, Op::Read, 4096, 4096, Some(IoBuf::new(4096)), 2).map_err(|(e, _)| e).unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        poll(&mut ctx);
    }
    assert_eq!(ctx.completions().count(), 0, "both held by the target");
    // ...and the connection drops meanwhile.
    faults.drop_generation.fetch_add(1, Ordering::Relaxed);
    faults.delay_us.store(0, Ordering::Relaxed);
    let dropped = Instant::now();
    let (mut write, mut read) = (None, None);
    while write.is_none() || read.is_none() {
        assert!(dropped.elapsed() < Duration::from_secs(20), "both complete");
        poll(&mut ctx);
        for c in ctx.completions() {
            match c.token {
                1 => write = Some((c.status, dropped.elapsed())),
                2 => read = Some((c.status, dropped.elapsed())),
                t => panic!("unexpected token {t}"),
            }
        }
    }
    (Lost { write: write.unwrap(), read: read.unwrap() }, ctx, dev, ctrls, server)
}

fn block(fill: u8) -> IoBuf {
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    b.fill(fill);
    b
}

#[test]
fn a_write_lost_with_its_connection_waits_for_the_quiesce_hold_and_a_read_does_not() {
    let (lost, mut ctx, dev, ctrls, server) = lose_a_write_and_a_read(Duration::from_secs(600));
    // Our target does traffic-based keep-alive and reports no CQT: 3 × KATO + the
    // configured quiesce time.
    let hold = Duration::from_millis(3 * u64::from(KATO_MS)) + QUIESCE;
    for c in &ctrls {
        assert_eq!(c.identify().cqt, 0, "the target promises no quiesce time");
        assert_eq!(c.failover_hold(), hold);
    }
    let ((ws, write_at), (rs, read_at)) = (lost.write, lost.read);
    assert!(ws.is_success() && rs.is_success(), "write {ws}, read {rs}");
    assert!(read_at < Duration::from_secs(2), "the read failed over at once: {read_at:?}");
    assert!(write_at >= hold, "the write was sent again {write_at:?} after the loss, before the {hold:?} hold");
    assert!(write_at < hold + Duration::from_secs(3), "and soon after it: {write_at:?}");

    // The write landed.
    ctx.submit(dev, Op::Read, 0, 4096, Some(IoBuf::new(4096)), 3).map_err(|(e, _)| e).unwrap();
    let t = Instant::now();
    let c = loop {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        if let Some(c) = ctx.completions().next() {
            break c;
        }
        assert!(t.elapsed() < Duration::from_secs(10));
    };
    assert!(c.status.is_success());
    assert!(c.buf.unwrap().iter().all(|&b| b == 2), "block 0 holds the held write's data");
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    server.shutdown();
}

#[test]
fn a_hold_longer_than_ctrl_loss_tmo_fails_the_write_then_instead_of_sending_it_early() {
    let tmo = Duration::from_secs(1);
    let (lost, ctx, _dev, ctrls, server) = lose_a_write_and_a_read(tmo);
    let ((ws, write_at), (rs, read_at)) = (lost.write, lost.read);
    assert!(rs.is_success() && read_at < tmo, "the read failed over at once: {rs} after {read_at:?}");
    assert_eq!(ws, nvme::Status::HOST_PATH_ERROR, "the write fails: its hold outlasts ctrl_loss_tmo");
    assert!(write_at >= tmo, "not before ctrl_loss_tmo: {write_at:?}");
    assert!(write_at < tmo + Duration::from_secs(2), "but then: {write_at:?}");
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    server.shutdown();
}
