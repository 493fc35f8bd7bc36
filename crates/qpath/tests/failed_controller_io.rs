//! The target fails a controller (as its keep-alive timer does after a link outage longer
//! than KATO) while the controller's I/O queue is still open and the host keeps writing:
//! the commands that arrive on that queue must not come back as "command sequence error,
//! do not retry" (an I/O error the host cannot fail over). The target closes the queue
//! instead, as nvmet tears a failed controller's queues down; the host reconnects and the
//! writes complete, and read back, with no error. Found by `qpath lab flaps --mode link`
//! with the host's and the target's KATO both 5 s and 5 s outages.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod read_back;

use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use target::config::Config;
use target::reactor::{PollMode, ReactorOptions};
use uring::{IoBuf, Wait};

#[test]
fn writes_to_a_controller_the_target_failed_are_retried_not_failed() {
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports.truncate(1);
    c.ports[0].addr = "127.0.0.1:0".into();
    c.subsystems[0].namespaces[0].size = Some(target::config::SizeValue::Text("16M".into()));
    let server = c.start().unwrap();
    let addr = server.state.ports()[0].addr;
    let subsys = server.state.subsystem(target::config::DEFAULT_NQN).expect("the default subsystem");
    let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.reconnect_delay = Duration::from_millis(100);
    let ctrl = Controller::connect(o).unwrap();
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();

    const BLOCKS: u64 = 512;
    const QD: u64 = 16;
    const ROUNDS: u32 = 3;
    let mut value = vec![0u8; BLOCKS as usize];
    let (mut next, mut in_flight, mut byte) = (0u64, 0u64, 1u8);
    let mut errors = Vec::new();
    let mut failed_ctrls = 0u32;
    let t0 = Instant::now();
    // Each round: write for 300 ms, fail the target's controller, write on for 1.2 s.
    let round = Duration::from_millis(1500);
    let end = round * ROUNDS;
    while t0.elapsed() < end || in_flight > 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "writes did not drain; errors: {errors:?}");
        let now = t0.elapsed();
        let due = now.as_millis() / round.as_millis();
        if now < end && now.as_millis() % round.as_millis() >= 300 && u128::from(failed_ctrls) <= due {
            let live = subsys.controllers();
            for c in &live {
                c.fail("test: as a keep-alive timeout would");
            }
            if !live.is_empty() {
                failed_ctrls += 1;
            }
        }
        while now < end && in_flight < QD {
            let block = next;
            next = (next + 1) % BLOCKS;
            if next == 0 {
                byte = byte.wrapping_add(1).max(1);
            }
            let v = (block as u8) ^ byte;
            let mut b = IoBuf::new(4096);
            b.set_len(4096);
            b.fill(v);
            ctx.submit(dev, Op::Write, block * 4096, 4096, Some(b), block).map_err(|(e, _)| e).unwrap();
            value[block as usize] = v;
            in_flight += 1;
        }
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        for c in ctx.completions() {
            in_flight -= 1;
            if !c.status.is_success() {
                errors.push((c.token, c.status));
            }
        }
    }
    assert!(failed_ctrls >= 2, "the target's controller was failed in {failed_ctrls} rounds");
    assert!(errors.is_empty(), "{} writes failed, e.g. {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert!(ctrl.info().reconnects >= 1, "the host reconnected: {:?}", ctrl.info());

    read_back::check_last_writes(&mut ctx, dev, &value, Duration::from_secs(60));
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}
