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

fn connect(addr: std::net::SocketAddr) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.reconnect_delay = Duration::from_millis(100);
    o.kato_ms = KATO_MS;
    o.command_quiesce_time = Some(QUIESCE);
    Controller::connect(o).unwrap()
}

fn block(fill: u8) -> IoBuf {
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    b.fill(fill);
    b
}

#[test]
fn a_write_lost_with_its_connection_waits_for_the_quiesce_hold_and_a_read_does_not() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrls: Vec<_> = addrs.iter().map(|a| connect(*a)).collect();
    // Our target does traffic-based keep-alive and reports no CQT: 3 × KATO + the
    // configured quiesce time.
    let hold = Duration::from_millis(3 * u64::from(KATO_MS)) + QUIESCE;
    for c in &ctrls {
        assert_eq!(c.identify().cqt, 0, "the target promises no quiesce time");
        assert_eq!(c.failover_hold(), hold);
    }
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
    let (mut write_at, mut read_at) = (None, None);
    while write_at.is_none() || read_at.is_none() {
        assert!(dropped.elapsed() < Duration::from_secs(20), "both complete on the other path");
        poll(&mut ctx);
        for c in ctx.completions() {
            assert!(c.status.is_success(), "token {}: {}", c.token, c.status);
            match c.token {
                1 => write_at = Some(dropped.elapsed()),
                2 => read_at = Some(dropped.elapsed()),
                t => panic!("unexpected token {t}"),
            }
        }
    }
    let (write_at, read_at) = (write_at.unwrap(), read_at.unwrap());
    assert!(read_at < Duration::from_secs(2), "the read failed over at once: {read_at:?}");
    assert!(write_at >= hold, "the write was sent again {write_at:?} after the loss, before the {hold:?} hold");
    assert!(write_at < hold + Duration::from_secs(3), "and soon after it: {write_at:?}");

    // The write landed.
    ctx.submit(dev, Op::Read, 0, 4096, Some(IoBuf::new(4096)), 3).map_err(|(e, _)| e).unwrap();
    let t = Instant::now();
    let c = loop {
        poll(&mut ctx);
        if let Some(c) = ctx.completions().next() {
            break c;
        }
        assert!(t.elapsed() < Duration::from_secs(10));
    };
    assert!(c.status.is_success());
    assert!(c.buf.unwrap().iter().all(|&b| b == 2), "block 0 holds the held write's data");
}
