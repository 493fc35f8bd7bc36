//! The host's I/O path allocates nothing in steady state: a completion context drives
//! reads and writes (4 KiB and 128 KiB, so in-capsule data, R2T with H2C data and
//! several C2H data PDUs) against our target, first spinning (`Wait::Poll`, qpath
//! bench's way) then sleeping in the kernel (`Wait::Block`, the ublk and NBD servers'
//! way), and a counting global allocator sees no allocation on the context's thread
//! once the warm-up has grown every reusable buffer (request slots, send batches,
//! receive buffers, completion lists) to what the workload needs.
//!
//! The counter is per thread: the target's reactors in this process allocate as they
//! please; only the host's thread is held to zero.

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use host::stats::HostStats;
use nvme::Nsid;
use uring::alloc_count::{CountingAllocator, allocations_in};
use uring::{IoBuf, Wait};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The embedded default's subsystem, which `loopback::target` serves.
const NQN: &str = "nqn.2026-11.io.qpath:default";
const DEPTH: usize = 32;
const BIG: u32 = 128 * 1024;
const SMALL: u32 = 4096;
/// Blocks of 128 KiB the I/Os spread over (8 MiB).
const SPAN: u64 = 64;

/// A closed loop of `DEPTH` slots, each resubmitted as it completes; the op and size
/// of each I/O come from a small generator (no allocation in the loop itself).
struct Load {
    dev: DeviceId,
    bufs: Vec<Option<IoBuf>>,
    seed: u64,
    done: u64,
}

impl Load {
    fn next(&mut self) -> (Op, u64, u32) {
        self.seed = self.seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let r = self.seed >> 33;
        let op = if r & 1 == 0 { Op::Read } else { Op::Write };
        let len = if r & 6 == 0 { BIG } else { SMALL };
        let offset = ((r >> 3) % SPAN) * u64::from(BIG);
        (op, offset, len)
    }

    fn submit(&mut self, ctx: &mut Context, slot: usize) {
        let io = self.next();
        self.submit_io(ctx, slot, io);
    }

    fn submit_io(&mut self, ctx: &mut Context, slot: usize, (op, offset, len): (Op, u64, u32)) {
        let mut buf = self.bufs[slot].take().expect("the slot's buffer is home");
        buf.set_len(len as usize);
        ctx.submit(self.dev, op, offset, len, Some(buf), slot as u64).map_err(|(e, _)| e).unwrap();
    }

    /// Every slot at once with the same op and size, then waits for all: the largest
    /// batches this load can make (a send batch holds at most `DEPTH` commands, and
    /// `DEPTH` in-capsule writes are its largest), so every reusable buffer reaches its
    /// high-water mark. Each queue alternates two send batches: done more than twice.
    fn burst(&mut self, ctx: &mut Context, op: Op, len: u32) {
        for slot in 0..DEPTH {
            self.submit_io(ctx, slot, (op, slot as u64 * u64::from(BIG), len));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while ctx.in_flight() > 0 {
            assert!(Instant::now() < deadline, "a burst did not finish in 60 s");
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(20)) }).unwrap();
            for c in ctx.completions() {
                assert!(c.status.is_success(), "I/O {}: {}", c.token, c.status);
                self.bufs[usize::try_from(c.token).unwrap()] = c.buf;
            }
        }
    }

    /// Runs until `n` more I/Os completed.
    fn run(&mut self, ctx: &mut Context, n: u64, wait: Wait) {
        let target = self.done + n;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.done < target {
            assert!(Instant::now() < deadline, "{} of {n} I/Os in 60 s", n - (target - self.done));
            ctx.poll(wait).unwrap();
            let mut again = [0usize; DEPTH];
            let mut k = 0;
            for c in ctx.completions() {
                assert!(c.status.is_success(), "I/O {}: {}", c.token, c.status);
                let slot = usize::try_from(c.token).unwrap();
                self.bufs[slot] = c.buf;
                again[k] = slot;
                k += 1;
            }
            self.done += k as u64;
            for &slot in &again[..k] {
                self.submit(ctx, slot);
            }
        }
    }
}

fn steady_state(stats: Option<Arc<HostStats>>, stats_interval: Duration) {
    // The counter works (this binary's allocator is the counting one).
    let (v, n) = allocations_in(|| vec![0u8; 64]);
    assert_eq!((v.len(), n), (64, 1));
    let (server, addrs) = loopback::target(1, "16M");
    let addr = addrs[0];
    let mut o = ConnectOptions::new(addr, NQN);
    o.nr_io_queues = 1;
    o.queue_size = 64;
    let ctrl = Controller::connect(o).unwrap();
    let mut ctx =
        Context::new(ContextOptions { max_requests: DEPTH, stats, stats_interval, ..ContextOptions::default() })
            .unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    let mut load = Load { dev, bufs: (0..DEPTH).map(|_| Some(IoBuf::new(BIG as usize))).collect(), seed: 7, done: 0 };
    // Warm-up: the largest batches of each kind, then the mixed load both ways. Reusable
    // vectors (send batches, completion lists) grow to a high-water mark bounded by the
    // queue depth and never shrink; after that the path must not allocate.
    for _ in 0..4 {
        for (op, len) in [(Op::Write, SMALL), (Op::Write, BIG), (Op::Read, SMALL), (Op::Read, BIG)] {
            load.burst(&mut ctx, op, len);
        }
    }
    for slot in 0..DEPTH {
        load.submit(&mut ctx, slot);
    }
    let block = Wait::Block { timeout: Some(Duration::from_millis(20)) };
    load.run(&mut ctx, 4000, Wait::Poll);
    load.run(&mut ctx, 2000, block);
    for (name, wait) in [("spinning", Wait::Poll), ("blocking", block)] {
        let enters = ctx.ring().stats().enters;
        let n = 20_000;
        let ((), allocations) = allocations_in(|| load.run(&mut ctx, n, wait));
        let per_io = (ctx.ring().stats().enters - enters) as f64 / n as f64;
        println!("{name}: {n} I/Os at QD{DEPTH}, {allocations} allocations, {per_io:.3} io_uring_enter per I/O");
        assert_eq!(allocations, 0, "{name}: the host's thread allocated {allocations} times in {n} I/Os");
    }
    // Drain before the context goes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while ctx.in_flight() > 0 && Instant::now() < deadline {
        ctx.poll(block).unwrap();
        ctx.completions().for_each(drop);
    }
    drop(ctx);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn a_context_allocates_nothing_per_io_once_warm() {
    steady_state(None, Duration::from_millis(100));
}

/// qpath bench's contexts record every I/O for a statistics hub (`qpath stats`,
/// `/metrics`): recording allocates nothing. Publishing the copies to the hub (every
/// 100 ms by default, not per I/O) does allocate (the histograms are cloned before the
/// hub's lock is taken): the interval is set past the test's end to keep it out.
#[test]
fn a_context_recording_statistics_allocates_nothing_per_io_once_warm() {
    steady_state(Some(HostStats::new()), Duration::from_secs(3600));
}
