//! A path that goes silent (a link lost: no FIN, no RST, the socket stays open) must not
//! hold the I/O sent on it: the unanswered keep-alive resets the controller after KATO,
//! the context fails that controller's queues, and their writes complete on the other
//! path with no error once the failover hold is over (3 × KATO + the quiesce time: the
//! target may still execute them until then, `host::failover`). Without root there are no veth links to take down, so a TCP relay
//! in front of port 1 stops relaying (and leaves every socket open) for the outage; when
//! it resumes, the connections that lived through the outage are closed, as the first
//! packet after a real link comes back would find them gone.
//!
//! ```text
//!   Context ── head (round-robin) ─┬─ ctrl 1 ─► relay (frozen 6.5 s) ─► target port 1
//!                                  └─ ctrl 2 ───────────────────────► target port 2
//! ```

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod loopback;
mod read_back;
mod relay;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::head::Head;
use host::mpath::Policy;
use relay::Relay;
use uring::{IoBuf, Wait};

#[test]
fn writes_on_a_silent_path_fail_over_after_the_keep_alive_timeout() {
    let (server, ports) = loopback::target(1, "16M");
    let relay = Relay::start(ports[0]);
    let ctrls: Vec<Arc<Controller>> = [relay.addr, ports[1]]
        .iter()
        .map(|a| {
            let mut o = ConnectOptions::new(*a, target::config::DEFAULT_NQN);
            o.nr_io_queues = 1;
            o.kato_ms = 1000;
            o.reconnect_delay = Duration::from_millis(200);
            // The hold: 3 × KATO (our target's traffic-based keep-alive) + 200 ms.
            o.command_quiesce_time = Some(Duration::from_millis(200));
            Controller::connect(o).unwrap()
        })
        .collect();
    let heads = Head::build(&ctrls, Policy::ROUND_ROBIN);
    let head = heads.iter().find(|h| h.path_count() == 2).expect("one namespace, two paths");
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(head).unwrap();

    // Writes at QD 16, block i gets byte (i + round); each block is written by one I/O at a time.
    const BLOCKS: u64 = 1024;
    const QD: u64 = 16;
    let mut value = vec![0u8; BLOCKS as usize];
    let mut in_flight = 0u64;
    let (mut next, mut round) = (0u64, 1u8);
    let mut errors = Vec::new();
    let t0 = Instant::now();
    let (freeze_at, thaw_at, end_at) =
        (Duration::from_millis(500), Duration::from_millis(7000), Duration::from_millis(8500));
    // Completions in the last 1.5 s of the outage: only a failover can give them, since
    // round-robin puts every slot on the frozen path within a few I/Os (the keep-alive
    // notices the loss by about 2 s, the hold ends about 3.2 s later).
    let mut late_in_outage = 0u64;
    let mut frozen = false;
    let mut thawed = false;
    while t0.elapsed() < end_at || in_flight > 0 {
        let now = t0.elapsed();
        assert!(now < Duration::from_secs(60), "the writes did not drain; errors so far: {errors:?}");
        if !frozen && now >= freeze_at && now < thaw_at {
            relay.freeze();
            frozen = true;
        }
        if frozen && now >= thaw_at && !thawed {
            relay.thaw();
            thawed = true;
        }
        while now < end_at && in_flight < QD {
            let block = next;
            next = (next + 1) % BLOCKS;
            if next == 0 {
                round = round.wrapping_add(1).max(1);
            }
            let byte = (block as u8).wrapping_add(round);
            let mut b = IoBuf::new(4096);
            b.set_len(4096);
            b.fill(byte);
            ctx.submit(dev, Op::Write, block * 4096, 4096, Some(b), block).map_err(|(e, _)| e).unwrap();
            value[block as usize] = byte;
            in_flight += 1;
        }
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        for c in ctx.completions() {
            in_flight -= 1;
            if !c.status.is_success() {
                errors.push((c.token, c.status));
            }
            let t = t0.elapsed();
            if t >= thaw_at - Duration::from_millis(1500) && t < thaw_at {
                late_in_outage += 1;
            }
        }
    }
    assert!(errors.is_empty(), "writes failed: {errors:?}");
    assert!(late_in_outage > 0, "no write completed late in the outage: the silent path held them");

    // The path comes back (reconnected: its controller was reset); the read-back finds
    // every block's last write.
    let t = Instant::now();
    while !ctrls[0].is_live() || ctrls[0].info().reconnects == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "path 1 never came back: {:?}", ctrls[0].info());
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(10)) }).unwrap();
    }
    read_back::check_last_writes(&mut ctx, dev, &value, Duration::from_secs(60));
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    drop(relay);
    server.shutdown();
}
