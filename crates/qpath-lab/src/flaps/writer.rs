//! The flaps lab's I/O: 4k random writes carrying `verify=crc32c` blocks through one
//! multipath head for a fixed time, then a read-back pass that checks every block the
//! writes left, both at a fixed queue depth on one [`host::context::Context`].
//!
//! It uses the bench's own verify code ([`bench::verify`]: fio's header layout, a
//! generation per write so a lost or stale write is told from an intact one) and its
//! latency statistics ([`bench::stats`]). Two writes to one block are never in flight at
//! once, so the last completed write of each block is the one the read-back must find.
//! Latency is the host's, from `submit` to the completion the caller sees: time spent
//! waiting for a path and being failed over included.

use std::time::{Duration, Instant};

use host::context::{Context, DeviceId, Op, PathReport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use uring::IoBuf;

use bench::engine::qpath::Spinner;
use bench::stats::{LatHist, LatStat};
use bench::verify::{self, GenerationMap};
use bench::{Error, ErrorKind, Result};

/// How the writer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// I/Os in flight.
    pub iodepth: u32,
    /// Block size, bytes.
    pub bs: u32,
    /// Blocks the writes spread over (from offset 0).
    pub blocks: u64,
    /// Data seed.
    pub seed: u64,
}

/// One phase's numbers.
#[derive(Debug, Clone)]
pub struct PhaseStats {
    /// I/Os that completed successfully.
    pub ios: u64,
    /// I/Os that completed with an error status (the caller saw a failure).
    pub errors: u64,
    /// The first error, as text.
    pub first_error: Option<String>,
    /// Completion latency (submit to completion) of every I/O.
    pub lat: LatStat,
    /// The same as a histogram, for percentiles.
    pub hist: LatHist,
    /// How long the phase ran.
    pub elapsed: Duration,
}

impl PhaseStats {
    fn new() -> PhaseStats {
        PhaseStats {
            ios: 0,
            errors: 0,
            first_error: None,
            lat: LatStat::default(),
            hist: LatHist::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Latency at `p` percent, ns (0 when empty).
    pub fn percentile_ns(&self, p: f64) -> u64 {
        if self.hist.is_empty() { 0 } else { self.hist.percentiles(&[p])[0] }
    }

    /// I/Os per second.
    pub fn iops(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 { as_f64(self.ios) / s } else { 0.0 }
    }

    /// The phase as JSON (latencies in microseconds).
    pub fn json(&self) -> serde_json::Value {
        let us = |ns: u64| as_f64(ns) / 1e3;
        // One histogram built from the counts for the four, not one each.
        let p = if self.hist.is_empty() { vec![0; 4] } else { self.hist.percentiles(&[50.0, 99.0, 99.9, 99.99]) };
        json!({
            "ios": self.ios,
            "errors": self.errors,
            "first_error": self.first_error,
            "seconds": self.elapsed.as_secs_f64(),
            "iops": self.iops(),
            "lat_us": {
                "min": if self.lat.samples > 0 { us(self.lat.min) } else { 0.0 },
                "mean": self.lat.mean / 1e3,
                "p50": us(p[0]),
                "p99": us(p[1]),
                "p99.9": us(p[2]),
                "p99.99": us(p[3]),
                "max": us(self.lat.max),
            },
        })
    }
}

#[allow(clippy::cast_precision_loss)] // counts and ns values fit f64's 53 bits in practice
fn as_f64(v: u64) -> f64 {
    v as f64
}

/// What a writer run measured.
#[derive(Debug, Clone)]
pub struct WriterReport {
    /// The randwrite phase.
    pub write: PhaseStats,
    /// The read-back pass.
    pub read: PhaseStats,
    /// Distinct blocks the writes left data in (what the read-back must check).
    pub blocks_written: u64,
    /// Blocks checked by the read-back.
    pub verify_checked: u64,
    /// Blocks whose data was wrong (bad header or CRC, or an older write's data).
    pub verify_failures: u64,
    /// The first failure, as text.
    pub first_mismatch: Option<String>,
    /// Per-path counts of the head, as the context saw them at the end.
    pub paths: Vec<PathReport>,
    /// I/Os completed on each path by the end of the write phase.
    pub write_paths: Vec<u64>,
    /// Commands sent again on a path after a path error (failovers).
    pub failovers: u64,
    /// Per second since the start: I/Os completed on each path in that second.
    pub timeline: Vec<Vec<u64>>,
}

struct Slot {
    buf: Option<IoBuf>,
    block: usize,
}

/// Drives one head's I/O.
pub struct Writer<'a> {
    ctx: &'a mut Context,
    dev: DeviceId,
    opts: WriterOptions,
    /// `opts.blocks` as an index bound.
    nblocks: usize,
    map: GenerationMap,
    slots: Vec<Slot>,
    free: Vec<usize>,
    in_flight: u32,
    spinner: Spinner,
    t0: Instant,
    timeline: Vec<Vec<u64>>,
    last_sample: (u64, Vec<u64>),
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("opts", &self.opts).field("in_flight", &self.in_flight).finish_non_exhaustive()
    }
}

/// Longest a phase waits for its last I/Os after its time is up (a failover waits for a
/// path at most this long before the lab calls it a failure).
const DRAIN_MAX: Duration = Duration::from_secs(120);

impl<'a> Writer<'a> {
    /// A writer over `dev` (a multipath head opened on `ctx`); `t0` is the run's start.
    pub fn new(ctx: &'a mut Context, dev: DeviceId, opts: WriterOptions, t0: Instant) -> Result<Writer<'a>> {
        let bs = u64::from(opts.bs);
        if (opts.bs as usize) < verify::HEADER_LEN || !opts.bs.is_multiple_of(ctx.block_size(dev)) {
            return Err(Error::new(ErrorKind::Option, format!("bs {} does not fit the device", opts.bs)));
        }
        let blocks = opts.blocks.min(ctx.capacity(dev) / bs);
        if blocks == 0 || opts.iodepth == 0 {
            return Err(Error::new(ErrorKind::Option, "nothing to write: no blocks or iodepth 0"));
        }
        let map = GenerationMap::new(blocks).map_err(|e| Error::new(ErrorKind::Option, e))?;
        let nblocks = map.len();
        let n = opts.iodepth as usize;
        let slots = (0..n).map(|_| Slot { buf: Some(IoBuf::new(opts.bs as usize)), block: 0 }).collect();
        Ok(Writer {
            ctx,
            dev,
            opts: WriterOptions { blocks, ..opts },
            nblocks,
            map,
            slots,
            free: (0..n).rev().collect(),
            in_flight: 0,
            spinner: Spinner::new(false),
            t0,
            timeline: Vec::new(),
            last_sample: (0, Vec::new()),
        })
    }

    /// Writes for `runtime`, then reads every written block back and checks it.
    pub fn run(mut self, runtime: Duration) -> Result<WriterReport> {
        let write = self.write_phase(runtime)?;
        let write_paths = self.ctx.path_report(self.dev).iter().map(|p| p.ios).collect();
        let blocks_written = self.map.written().count() as u64;
        let (read, checked, failures, first) = self.read_phase()?;
        self.sample(true);
        let failovers = self.ctx.queue_stats().map(|(_, _, s)| s.requeues).sum();
        Ok(WriterReport {
            write,
            read,
            blocks_written,
            verify_checked: checked,
            verify_failures: failures,
            first_mismatch: first,
            paths: self.ctx.path_report(self.dev),
            write_paths,
            failovers,
            timeline: self.timeline,
        })
    }

    /// Per-path completions, once a second.
    fn sample(&mut self, force: bool) {
        let sec = self.t0.elapsed().as_secs();
        if !force && sec <= self.last_sample.0 {
            return;
        }
        let now: Vec<u64> = self.ctx.path_report(self.dev).iter().map(|p| p.ios).collect();
        let prev = &self.last_sample.1;
        let delta = now.iter().enumerate().map(|(i, v)| v - prev.get(i).copied().unwrap_or(0)).collect();
        self.timeline.push(delta);
        self.last_sample = (sec.max(self.last_sample.0 + 1), now);
    }

    fn poll(&mut self) -> Result<()> {
        let now = Instant::now();
        let wait = self.spinner.wait(now, None);
        let n = self.ctx.poll(wait).map_err(|e| Error::new(ErrorKind::Engine, format!("flaps: poll: {e}")))?;
        if n > 0 {
            self.spinner.progress(Instant::now());
        }
        drop(self.ctx.take_stall_reports());
        self.sample(false);
        Ok(())
    }

    fn submit(&mut self, op: Op, slot: usize, block: usize, st: &mut PhaseStats) {
        let bs = self.opts.bs;
        let buf = self.slots[slot].buf.take();
        self.slots[slot].block = block;
        match self.ctx.submit(self.dev, op, block as u64 * u64::from(bs), bs, buf, slot as u64) {
            Ok(()) => self.in_flight += 1,
            Err((e, buf)) => {
                self.slots[slot].buf = buf.or_else(|| Some(IoBuf::new(bs as usize)));
                self.free.push(slot);
                if op == Op::Write {
                    self.map.end_write(block, false);
                }
                st.errors += 1;
                st.first_error.get_or_insert_with(|| format!("submit at block {block}: {e}"));
            }
        }
    }

    fn write_phase(&mut self, runtime: Duration) -> Result<PhaseStats> {
        let mut st = PhaseStats::new();
        let mut rng = SmallRng::seed_from_u64(self.opts.seed);
        let start = Instant::now();
        let end = start + runtime;
        let bs = self.opts.bs as usize;
        loop {
            let now = Instant::now();
            let running = now < end;
            while running && let Some(slot) = self.free.pop() {
                // A block with a write in flight is skipped: the read-back then knows the
                // one generation each block must hold.
                let mut block = rng.random_range(0..self.nblocks);
                while self.map.expect(block) == verify::Expect::Racing {
                    block = rng.random_range(0..self.nblocks);
                }
                let generation = self.map.begin_write(block);
                let buf = self.slots[slot].buf.get_or_insert_with(|| IoBuf::new(bs));
                buf.set_len(bs);
                verify::fill(&mut buf[..], self.opts.seed, (block * bs) as u64, generation);
                self.submit(Op::Write, slot, block, &mut st);
            }
            if !running && self.in_flight == 0 {
                break;
            }
            if now > end + DRAIN_MAX {
                return Err(Error::new(
                    ErrorKind::Engine,
                    format!("flaps: {} writes still in flight {DRAIN_MAX:?} after the run ended", self.in_flight),
                ));
            }
            self.poll()?;
            let done: Vec<_> = self.ctx.completions().collect();
            for c in done {
                let slot = usize::try_from(c.token).unwrap_or(usize::MAX);
                let block = self.slots[slot].block;
                self.slots[slot].buf = c.buf;
                self.free.push(slot);
                self.in_flight -= 1;
                let ok = c.status.is_success();
                self.map.end_write(block, ok);
                st.lat.add(c.latency_ns);
                st.hist.record(c.latency_ns);
                if ok {
                    st.ios += 1;
                } else {
                    st.errors += 1;
                    st.first_error.get_or_insert_with(|| format!("write at block {block}: {}", c.status));
                }
            }
        }
        st.elapsed = start.elapsed();
        Ok(st)
    }

    fn read_phase(&mut self) -> Result<(PhaseStats, u64, u64, Option<String>)> {
        let mut st = PhaseStats::new();
        let (mut checked, mut failures, mut first) = (0u64, 0u64, None);
        let start = Instant::now();
        let bs = self.opts.bs as usize;
        let mut cursor = 0usize;
        let mut generations = vec![0u32; self.slots.len()];
        loop {
            while let Some(slot) = self.free.pop() {
                let Some((block, generation)) = self.map.next_written(cursor) else {
                    self.free.push(slot);
                    break;
                };
                cursor = block + 1;
                generations[slot] = generation;
                let buf = self.slots[slot].buf.get_or_insert_with(|| IoBuf::new(bs));
                buf.set_len(bs);
                self.submit(Op::Read, slot, block, &mut st);
            }
            if self.in_flight == 0 {
                break;
            }
            if start.elapsed() > DRAIN_MAX * 5 {
                return Err(Error::new(ErrorKind::Engine, "flaps: the read-back did not finish in 10 minutes"));
            }
            self.poll()?;
            let done: Vec<_> = self.ctx.completions().collect();
            for c in done {
                let slot = usize::try_from(c.token).unwrap_or(usize::MAX);
                let block = self.slots[slot].block;
                self.free.push(slot);
                self.in_flight -= 1;
                st.lat.add(c.latency_ns);
                st.hist.record(c.latency_ns);
                if c.status.is_success() {
                    st.ios += 1;
                    if let Some(b) = c.buf.as_ref() {
                        checked += 1;
                        if let Err(m) = verify::check(&b[..bs], (block * bs) as u64, Some(generations[slot])) {
                            failures += 1;
                            first.get_or_insert_with(|| m.to_string());
                        }
                    }
                } else {
                    st.errors += 1;
                    st.first_error.get_or_insert_with(|| format!("read at block {block}: {}", c.status));
                }
                self.slots[slot].buf = c.buf;
            }
        }
        st.elapsed = start.elapsed();
        Ok((st, checked, failures, first))
    }
}
