//! 128 KiB reads at QD16 through a two-path head while connections keep failing: path 1
//! goes through a relay that is cut in the middle of whatever passes (so a payload being
//! received straight into its caller's buffer is cut short), and the target drops path
//! 2's connections between PDUs. Every read must complete with the right bytes in a
//! buffer of the right size, failed over or retried, never surfaced as an error.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod loopback;
mod relay;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::head::Head;
use host::mpath::Policy;
use relay::Relay;
use uring::{IoBuf, Wait};

const BS: usize = 128 * 1024;
const BLOCKS: u64 = 64; // 8 MiB
const DEPTH: usize = 16;
const READS: u64 = 1200;
const DROP_EVERY: u64 = 40;

fn byte(block: u64, i: usize) -> u8 {
    (block as usize * 131 + i / 512 * 7 + i) as u8
}

#[test]
fn large_reads_survive_dropped_connections() {
    let (server, ports) = loopback::target(1, "64M");
    let relay = Relay::start(ports[0]);
    let ctrls: Vec<_> = [relay.addr, ports[1]]
        .iter()
        .map(|a| {
            let mut o = ConnectOptions::new(*a, target::config::DEFAULT_NQN);
            o.nr_io_queues = 1;
            o.reconnect_delay = Duration::from_millis(50);
            o.kato_ms = 2000;
            Controller::connect(o).unwrap()
        })
        .collect();
    let heads = Head::build(&ctrls, Policy::ROUND_ROBIN);
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open_head(&heads[0]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let wait = |ctx: &mut Context| {
        assert!(Instant::now() < deadline, "timed out");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        ctx.completions().collect::<Vec<_>>()
    };

    for block in 0..BLOCKS {
        let mut b = IoBuf::new(BS);
        b.set_len(BS);
        for (i, x) in b.iter_mut().enumerate() {
            *x = byte(block, i);
        }
        ctx.submit(dev, Op::Write, block * BS as u64, BS as u32, Some(b), block).map_err(|(e, _)| e).unwrap();
        let done = loop {
            let d = wait(&mut ctx);
            if !d.is_empty() {
                break d;
            }
        };
        assert!(done[0].status.is_success(), "write {block}: {}", done[0].status);
    }

    let (mut submitted, mut completed, mut in_flight, mut drops) = (0u64, 0u64, 0usize, 0u64);
    while completed < READS {
        while in_flight < DEPTH && submitted < READS {
            let block = submitted * 17 % BLOCKS;
            let buf = IoBuf::new(BS);
            ctx.submit(dev, Op::Read, block * BS as u64, BS as u32, Some(buf), block).map_err(|(e, _)| e).unwrap();
            submitted += 1;
            in_flight += 1;
        }
        for c in wait(&mut ctx) {
            in_flight -= 1;
            completed += 1;
            let block = c.token;
            assert!(c.status.is_success(), "read of block {block} failed: {}", c.status);
            let buf = c.buf.expect("the buffer comes back");
            assert_eq!(buf.capacity(), BS, "block {block}: another buffer came back");
            assert_eq!(buf.len(), BS, "block {block}: short read");
            if let Some(i) = (0..BS).find(|&i| buf[i] != byte(block, i)) {
                panic!("block {block}: byte {i} is {} not {}", buf[i], byte(block, i));
            }
            if completed.is_multiple_of(DROP_EVERY) {
                if drops % 2 == 0 {
                    relay.cut();
                } else {
                    server.state.port(2).unwrap().faults.drop_generation.fetch_add(1, Ordering::Relaxed);
                }
                drops += 1;
            }
        }
    }
    let reconnects: u64 = ctrls.iter().map(|c| c.info().reconnects).sum();
    assert!(drops >= 6 && reconnects >= 2, "{drops} drops, {reconnects} reconnects");
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    drop(relay);
    server.shutdown();
}
