//! `qpath lab seed-004`: more I/O queues than completion contexts.
//!
//! The seed (Keith Busch, linux-nvme, 2014): on a 32-core machine with one MSI-x
//! vector, 32 I/O queues sharing that vector beat one I/O queue by up to 22% on
//! "per-cpu 4k O_DIRECT async rand read" (one fio job per CPU, libaio, iodepth 64),
//! and were never worse. Here a completion context ([`host::context::Context`], one
//! thread that submits and reaps run-to-completion) plays the vector, and an I/O
//! queue is an NVMe/TCP connection.
//!
//! ```text
//!   streams (the seed's per-CPU jobs: 4k random reads, QD 64 each)
//!     s0 s1 ...                    s0 s1 ...                    s0        s1
//!      \ /                          |   |                        |         |
//!   (i) 1 queue, 1 context     (ii) N queues, 1 context    (iii) N queues, N contexts
//!      ctx ── q0                  ctx ── q0, q1 ...           ctx0 ── q0   ctx1 ── q1
//!        \__________________________|____________________________|_________|
//!                       loopback NVMe/TCP, one connection per queue
//!        target reactor(s): connections dealt round-robin (admin queue first)
//! ```
//!
//! A stream submits through [`Context::submit_from`] with its own index: the device
//! is opened with [`QueueSpread::BySubmitter`], so stream `s` of `S` goes to queue
//! `s * N / S` (blk's CPU → queue map). Which queues each context owns in (iii)
//! comes from blk's [`ContextMap`] (contiguous), and each stream runs on the context
//! that owns its queue.
//!
//! Where the seed's win came from, and what is left of it here: on Linux 3.13 every
//! CPU that submitted to a queue took that queue's `q_lock`, so 32 CPUs on one queue
//! fought over one lock and one doorbell; a queue per CPU removed that, and the one
//! shared vector did not cost it back. A qpath context owns its queues outright
//! (one thread, no lock), so that contention does not exist in (i) to begin with.
//! What more queues still change here is on the wire and in the target: each queue is
//! its own TCP connection (its own socket buffers, its own in-order byte stream) and
//! the target deals connections to its reactors round-robin, so N queues can be
//! served by N target cores where one queue is served by one. On a 2-core machine,
//! with one core for the host, the target has one core: (ii) is expected to equal
//! (i), and the lab checks that it is never below; the +20% needs target cores to
//! spare (`--reactors`, `--target-cpus` on a bigger machine).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use blk::{ContextId, ContextMap, ContextSpread};
use host::context::{Context, ContextOptions, Op, QueueSpread};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use serde_json::{Value, json};
use target::config::{Config, NamespaceConfig, SizeValue};
use target::reactor::{PollMode, ReactorOptions};
use uring::IoBuf;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::engine::qpath::Spinner;
use bench::{Error, ErrorKind, Result};

const NQN: &str = "nqn.2026-11.io.qpath:seed-004";
/// The namespace the streams read (RAM, mapped lazily: reads of never-written
/// blocks cost no memory).
const NS_BYTES: u64 = 4 << 30;
/// How long a context may take to drain its outstanding reads after the window.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Most streams (each holds `iodepth` buffers).
const STREAMS_MAX: usize = 64;
/// Most queues per controller the lab asks for.
const QUEUES_MAX: u16 = 64;

fn parse_cpus(s: &str) -> std::result::Result<Vec<usize>, String> {
    s.split(',').map(|c| c.trim().parse::<usize>().map_err(|e| format!("{c:?}: {e}"))).collect()
}

/// Arguments of `qpath lab seed-004`.
#[derive(Debug, Clone, clap::Args)]
pub struct Seed004Args {
    /// Seconds each case is measured, after its warm-up.
    #[arg(long, default_value = "5", value_parser = crate::seconds_up_to::<3600>)]
    pub runtime: f64,
    /// Seconds of warm-up per case.
    #[arg(long, default_value = "1", value_parser = crate::seconds_up_to::<3600>)]
    pub warmup: f64,
    /// Runs of every case, interleaved ((i), (ii), (iii), (i), ...); the table shows
    /// the run with the median IOPS of each case.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// A short run for smoke tests: 0.5 s per case, 0.2 s warm-up, one round.
    #[arg(long)]
    pub quick: bool,
    /// Streams: the seed's per-CPU jobs (4k random reads at `iodepth` each).
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
    /// N: I/O queues of cases (ii) and (iii) (default: one per stream, as the seed).
    #[arg(long)]
    pub queues: Option<u16>,
    /// Reads each stream keeps outstanding (the seed's iodepth=64).
    #[arg(long, default_value_t = 64)]
    pub iodepth: u32,
    /// Block size in bytes (the seed's bs=4k).
    #[arg(long, default_value_t = 4096)]
    pub bs: u32,
    /// Target reactor threads.
    #[arg(long, default_value_t = 1)]
    pub reactors: usize,
    /// CPUs of the target's reactors (reactor k on the k-th, round robin).
    #[arg(long = "target-cpus", value_parser = parse_cpus)]
    pub target_cpus: Option<Vec<usize>>,
    /// CPUs of the host contexts (context k on the k-th, round robin).
    #[arg(long = "host-cpus", value_parser = parse_cpus)]
    pub host_cpus: Option<Vec<usize>>,
    /// How the target's reactors wait: busy, adaptive or block.
    #[arg(long = "target-poll", default_value = "busy", value_parser = crate::parse_poll)]
    pub target_poll: PollMode,
    /// Host contexts never sleep (fio's hipri); otherwise they spin 50 us, then sleep.
    #[arg(long)]
    pub hipri: bool,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for Seed004Args {
    fn default() -> Self {
        Seed004Args {
            runtime: 5.0,
            warmup: 1.0,
            rounds: 3,
            quick: false,
            streams: 2,
            queues: None,
            iodepth: 64,
            bs: 4096,
            reactors: 1,
            target_cpus: None,
            host_cpus: None,
            target_poll: PollMode::Busy,
            hipri: false,
            output: LabOutputArgs::default(),
        }
    }
}

impl Seed004Args {
    fn times(&self) -> (Duration, Duration, u32) {
        if self.quick {
            (Duration::from_millis(500), Duration::from_millis(200), 1)
        } else {
            (Duration::from_secs_f64(self.runtime), Duration::from_secs_f64(self.warmup), self.rounds)
        }
    }

    fn queues(&self) -> u16 {
        self.queues.unwrap_or_else(|| u16::try_from(self.streams).unwrap_or(QUEUES_MAX))
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::Option, m));
        if self.streams == 0 || self.streams > STREAMS_MAX {
            return bad(format!("--streams {}: 1..={STREAMS_MAX}", self.streams));
        }
        let n = self.queues();
        if !(2..=QUEUES_MAX).contains(&n) {
            return bad(format!("--queues {n}: 2..={QUEUES_MAX}"));
        }
        if self.iodepth == 0 || self.iodepth > 1024 {
            return bad(format!("--iodepth {}: 1..=1024", self.iodepth));
        }
        if self.bs < 512 || !self.bs.is_power_of_two() || self.bs > 1 << 20 {
            return bad(format!("--bs {}: a power of two in 512..=1M", self.bs));
        }
        if self.rounds == 0 || self.rounds > 20 {
            return bad(format!("--rounds {}: 1..=20", self.rounds));
        }
        if self.reactors == 0 || self.reactors > 16 {
            return bad(format!("--reactors {}: 1..=16", self.reactors));
        }
        Ok(())
    }

    /// Default placement: the target on CPU 0, the host on the others (as `qpath bench`).
    fn placement(&self) -> (Vec<usize>, Vec<usize>) {
        let (reactor_cpu, host) = crate::default_cpus(uring::online_cpus());
        let target = self.target_cpus.clone().unwrap_or_else(|| reactor_cpu.into_iter().collect());
        let host = self.host_cpus.clone().unwrap_or(host);
        (target, host)
    }
}

/// The three layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One queue, one context.
    OneQueue,
    /// N queues on one context.
    QueuesOnOne,
    /// N queues on N contexts.
    QueuesOnMany,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::OneQueue, Layout::QueuesOnOne, Layout::QueuesOnMany];

    fn name(self, n: u16) -> String {
        match self {
            Layout::OneQueue => "(i) 1 queue, 1 context".into(),
            Layout::QueuesOnOne => format!("(ii) {n} queues, 1 context"),
            Layout::QueuesOnMany => format!("(iii) {n} queues, {n} contexts"),
        }
    }

    fn short(self) -> &'static str {
        match self {
            Layout::OneQueue => "1q-1ctx",
            Layout::QueuesOnOne => "Nq-1ctx",
            Layout::QueuesOnMany => "Nq-Nctx",
        }
    }
}

/// What one context thread measured.
#[derive(Debug, Default, Clone)]
struct CtxStats {
    /// Successful reads completed inside the window.
    ios: u64,
    /// The window as this thread saw it.
    secs: f64,
    /// Completions over the whole run.
    total_ios: u64,
    /// Failed completions and refused submissions.
    errors: u64,
    /// Reads left outstanding when the drain timed out.
    undrained: u64,
    /// Sum of window latencies, ns.
    latency_ns_sum: u64,
    /// User + system CPU time of the thread inside the window, ns.
    cpu_ns: u64,
    /// Reads per queue index, whole run.
    per_queue: Vec<(u16, u64)>,
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// A point in time and the thread's CPU time then.
type Mark = (Instant, Duration);

fn cpu_time() -> Option<Duration> {
    bench::cpu::proc_thread_usage().map(|u| u.user + u.system)
}

/// What a context thread runs: its CPU, its queues, and its streams.
#[derive(Debug, Clone)]
struct CtxPlan {
    cpu: Option<usize>,
    /// Queue indices to claim (empty = let `attach` pick one).
    queues: Vec<u16>,
    /// Stream indices it runs.
    streams: Vec<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    streams: usize,
    iodepth: u32,
    bs: u32,
    hipri: bool,
}

fn xorshift(s: &mut u64) -> u64 {
    let mut x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    x
}

fn run_context(
    ctrl: &Arc<Controller>,
    plan: &CtxPlan,
    shape: Shape,
    phase: &AtomicU8,
    started: &Barrier,
) -> Result<CtxStats> {
    let host_err = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Engine, format!("{what}: {e}"));
    let depth = shape.iodepth as usize;
    let opened = (|| {
        let mut ctx = Context::new(ContextOptions {
            cpu: plan.cpu,
            max_requests: depth * plan.streams.len(),
            ..ContextOptions::default()
        })
        .map_err(|e| host_err("context", &e))?;
        let mut keys = Vec::with_capacity(plan.queues.len());
        for &q in &plan.queues {
            keys.push(ctx.attach_index(ctrl, q).map_err(|e| host_err("attach", &e))?);
        }
        let dev = ctx
            .open_spread(&keys, Nsid(1), QueueSpread::BySubmitter { submitters: shape.streams })
            .map_err(|e| host_err("open", &e))?;
        Ok::<_, Error>((ctx, dev))
    })();
    started.wait();
    let (mut ctx, dev) = opened?;
    let blocks = ctx.capacity(dev) / u64::from(shape.bs);
    let mut st = CtxStats::default();
    let mut rng: Vec<u64> =
        plan.streams.iter().map(|&s| 0x9e37_79b9_7f4a_7c15 ^ ((s as u64 + 1) * 0x2545_f491)).collect();
    let mut outstanding = 0u64;
    let bs = shape.bs as usize;
    // token = local stream index << 32 | slot
    for (ls, &s) in plan.streams.iter().enumerate() {
        for slot in 0..depth {
            let off = (xorshift(&mut rng[ls]) % blocks) * u64::from(shape.bs);
            let token = ((ls as u64) << 32) | slot as u64;
            let submitter = u32::try_from(s).unwrap_or(0);
            match ctx.submit_from(dev, submitter, Op::Read, off, shape.bs, Some(IoBuf::new(bs)), token) {
                Ok(()) => outstanding += 1,
                Err(_) => st.errors += 1,
            }
        }
    }
    let mut spinner = Spinner::new(shape.hipri);
    // (wall clock, thread CPU time) when the window opened and when it closed.
    let mut window: [Option<Mark>; 2] = [None, None];
    let mut done = Vec::with_capacity(depth * plan.streams.len());
    loop {
        let now = Instant::now();
        let n = ctx.poll(spinner.wait(now, None)).map_err(|e| host_err("poll", &e))?;
        if n > 0 {
            spinner.progress(now);
        }
        let ph = phase.load(Ordering::Relaxed);
        if ph >= MEASURE && window[0].is_none() {
            window[0] = Some((Instant::now(), cpu_time().unwrap_or_default()));
        }
        if ph == STOP && window[1].is_none() {
            window[1] = Some((Instant::now(), cpu_time().unwrap_or_default()));
        }
        let measuring = ph == MEASURE;
        done.extend(ctx.completions());
        for c in done.drain(..) {
            st.total_ios += 1;
            outstanding -= 1;
            if !c.status.is_success() {
                st.errors += 1;
            } else if measuring {
                st.ios += 1;
                st.latency_ns_sum += c.latency_ns;
            }
            if ph != STOP {
                let ls = usize::try_from(c.token >> 32).unwrap_or(0);
                let off = (xorshift(&mut rng[ls]) % blocks) * u64::from(shape.bs);
                let submitter = u32::try_from(plan.streams[ls]).unwrap_or(0);
                let buf = c.buf.unwrap_or_else(|| IoBuf::new(bs));
                match ctx.submit_from(dev, submitter, Op::Read, off, shape.bs, Some(buf), c.token) {
                    Ok(()) => outstanding += 1,
                    Err(_) => st.errors += 1,
                }
            }
        }
        if let Some((end, _)) = window[1] {
            if outstanding == 0 {
                break;
            }
            if end.elapsed() > DRAIN_TIMEOUT {
                st.undrained = outstanding;
                break;
            }
        }
    }
    if let [Some((a, ca)), Some((b, cb))] = window {
        st.secs = b.duration_since(a).as_secs_f64();
        st.cpu_ns = u64::try_from(cb.saturating_sub(ca).as_nanos()).unwrap_or(u64::MAX);
    }
    st.per_queue = ctx.queue_stats().map(|(_, i, s)| (i, s.ios())).collect();
    Ok(st)
}

/// One case's outcome.
#[derive(Debug)]
struct CaseResult {
    layout: Layout,
    contexts: Vec<CtxStats>,
    /// Target reactor threads' CPU time in the window, ns (sum).
    target_cpu_ns: u64,
    /// Errors over every round of this case (set when rounds are merged).
    errors_all_rounds: u64,
}

impl CaseResult {
    fn ios(&self) -> u64 {
        self.contexts.iter().map(|c| c.ios).sum()
    }

    fn secs(&self) -> f64 {
        self.contexts.iter().map(|c| c.secs).fold(0.0, f64::max)
    }

    fn iops(&self) -> f64 {
        let s = self.secs();
        if s > 0.0 { self.ios() as f64 / s } else { 0.0 }
    }

    fn errors(&self) -> u64 {
        self.contexts.iter().map(|c| c.errors + c.undrained).sum()
    }

    fn latency_us(&self) -> f64 {
        let ios = self.ios();
        if ios == 0 {
            return f64::NAN;
        }
        self.contexts.iter().map(|c| c.latency_ns_sum).sum::<u64>() as f64 / ios as f64 / 1e3
    }

    fn host_cpu_ns_per_io(&self) -> f64 {
        let ios = self.ios();
        if ios == 0 {
            return f64::NAN;
        }
        self.contexts.iter().map(|c| c.cpu_ns).sum::<u64>() as f64 / ios as f64
    }
}

fn target_config(args: &Seed004Args, target_cpus: &[usize]) -> Config {
    let mut cfg = Config::embedded_default();
    cfg.ports.truncate(1);
    cfg.ports[0].addr = "127.0.0.1:0".into();
    let spin_us = if args.target_poll == PollMode::Adaptive { bench::embedded_target::ADAPTIVE_SPIN_US } else { 0 };
    cfg.reactor =
        ReactorOptions { reactors: args.reactors, cpus: target_cpus.to_vec(), poll: args.target_poll, spin_us };
    let sub = &mut cfg.subsystems[0];
    sub.nqn = NQN.into();
    let template = sub.namespaces[0].clone();
    sub.namespaces =
        vec![NamespaceConfig { nsid: 1, backend: "ram".into(), size: Some(SizeValue::Bytes(NS_BYTES)), ..template }];
    cfg
}

/// CPU time of this process's threads named `qpath-reactor-*`, ns.
fn reactor_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0 };
    let mut sum = 0;
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("qpath-reactor") {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |k: usize| f.get(k - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        sum += (ticks(14) + ticks(15)) * 10_000_000;
    }
    sum
}

fn plans(layout: Layout, args: &Seed004Args, host_cpus: &[usize]) -> Result<Vec<CtxPlan>> {
    let n = args.queues();
    let cpu = |k: usize| if host_cpus.is_empty() { None } else { Some(host_cpus[k % host_cpus.len()]) };
    let all: Vec<usize> = (0..args.streams).collect();
    Ok(match layout {
        Layout::OneQueue => vec![CtxPlan { cpu: cpu(0), queues: vec![0], streams: all }],
        Layout::QueuesOnOne => vec![CtxPlan { cpu: cpu(0), queues: (0..n).collect(), streams: all }],
        Layout::QueuesOnMany => {
            let cmap = ContextMap::new(n, n, ContextSpread::Contiguous)
                .map_err(|e| Error::new(ErrorKind::Option, e.to_string()))?;
            let qmap =
                blk::QueueMap::spread(args.streams, n).map_err(|e| Error::new(ErrorKind::Option, e.to_string()))?;
            (0..n)
                .map(|c| {
                    let me = ContextId(c);
                    let queues: Vec<u16> = cmap.queues_of(me).iter().map(|q| q.0).collect();
                    let streams =
                        all.iter().copied().filter(|&s| queues.contains(&qmap.queue(s).0)).collect::<Vec<_>>();
                    CtxPlan { cpu: cpu(usize::from(c)), queues, streams }
                })
                .filter(|p| !p.streams.is_empty())
                .collect()
        }
    })
}

fn run_case(layout: Layout, args: &Seed004Args, runtime: Duration, warmup: Duration) -> Result<CaseResult> {
    let (target_cpus, host_cpus) = args.placement();
    let server = target_config(args, &target_cpus)
        .start()
        .map_err(|e| Error::new(ErrorKind::Target, format!("seed-004 target: {e}")))?;
    let addr = server.local_addr(1).ok_or_else(|| Error::new(ErrorKind::Target, "seed-004 target: no port 1"))?;
    let mut copts = ConnectOptions::new(addr, NQN);
    copts.nr_io_queues = if layout == Layout::OneQueue { 1 } else { args.queues() };
    copts.queue_size = u16::try_from((args.iodepth as usize * args.streams).clamp(128, 1024)).unwrap_or(1024);
    let ctrl = match Controller::connect(copts) {
        Ok(c) => c,
        Err(e) => {
            server.shutdown();
            return Err(Error::new(ErrorKind::Target, format!("seed-004: connect: {e}")));
        }
    };
    let plans = plans(layout, args, &host_cpus)?;
    let shape = Shape { streams: args.streams, iodepth: args.iodepth, bs: args.bs, hipri: args.hipri };
    let phase = AtomicU8::new(WARMUP);
    let barrier = Barrier::new(plans.len() + 1);
    let outcome = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (k, plan) in plans.iter().enumerate() {
            let (ctrl, phase, barrier) = (&ctrl, &phase, &barrier);
            let h = std::thread::Builder::new()
                .name(format!("seed-004 ctx {k}"))
                .spawn_scoped(s, move || run_context(ctrl, plan, shape, phase, barrier))
                .map_err(|e| Error::io("spawn a context thread", e))?;
            handles.push(h);
        }
        barrier.wait();
        std::thread::sleep(warmup);
        let t0 = reactor_cpu_ns();
        phase.store(MEASURE, Ordering::Relaxed);
        std::thread::sleep(runtime);
        phase.store(STOP, Ordering::Relaxed);
        let t1 = reactor_cpu_ns();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.join().map_err(|_| Error::new(ErrorKind::Engine, "a context thread panicked"))??);
        }
        Ok::<_, Error>((out, t1.saturating_sub(t0)))
    });
    ctrl.delete();
    server.shutdown();
    let (contexts, target_cpu_ns) = outcome?;
    Ok(CaseResult { layout, contexts, target_cpu_ns, errors_all_rounds: 0 })
}

/// Runs every case and builds the report (does not print it).
pub fn run(args: &Seed004Args, progress: &mut dyn std::io::Write) -> Result<LabResult> {
    args.check()?;
    let (runtime, warmup, rounds) = args.times();
    let mut runs: Vec<Vec<CaseResult>> = Layout::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (k, layout) in Layout::ALL.into_iter().enumerate() {
            let _ = writeln!(
                progress,
                "seed-004: round {}/{rounds}: {} ({:.1} s + {:.1} s warm-up)",
                round + 1,
                layout.name(args.queues()),
                runtime.as_secs_f64(),
                warmup.as_secs_f64()
            );
            runs[k].push(run_case(layout, args, runtime, warmup)?);
        }
    }
    let mut results = Vec::with_capacity(Layout::ALL.len());
    let mut all_iops = Vec::with_capacity(Layout::ALL.len());
    for mut v in runs {
        all_iops.push(v.iter().map(CaseResult::iops).collect::<Vec<f64>>());
        let errors: u64 = v.iter().map(CaseResult::errors).sum();
        v.sort_by(|a, b| a.iops().total_cmp(&b.iops()));
        let mut median = v.swap_remove(v.len() / 2);
        median.errors_all_rounds = errors;
        results.push(median);
    }
    Ok(report(args, &results, &all_iops, runtime, warmup, rounds))
}

fn report(
    args: &Seed004Args,
    results: &[CaseResult],
    all_iops: &[Vec<f64>],
    runtime: Duration,
    warmup: Duration,
    rounds: u32,
) -> LabResult {
    let n = args.queues();
    let mut r = LabResult::new("seed-004", "more I/O queues than completion contexts");
    let (target_cpus, host_cpus) = args.placement();
    r.note(format!(
        "{} streams x iodepth {} x {} B random reads; {n} queues in (ii)/(iii); target: {} reactor(s) on CPUs {:?} \
         ({:?}); host contexts on CPUs {:?}; {:.1} s per case after {:.1} s warm-up; {rounds} round(s), \
         interleaved, the median run of each case shown",
        args.streams,
        args.iodepth,
        args.bs,
        args.reactors,
        target_cpus,
        args.target_poll,
        host_cpus,
        runtime.as_secs_f64(),
        warmup.as_secs_f64()
    ));
    r.note(format!(
        "seed: 32 CPUs, one MSI-x vector, fio per-cpu 4k O_DIRECT libaio randread at iodepth 64 (one job per CPU): 32 \
         queues on the vector vs 1 queue, up to +22%, never below. Scaled to this machine ({} online CPUs): {} \
         streams play the per-CPU jobs, N = {n} queues, a completion context plays the vector; the target's reactors \
         need cores too, so the host gets {:?}.",
        uring::online_cpus(),
        args.streams,
        host_cpus
    ));
    r.note(
        "win mechanism: the seed's was per-queue lock and doorbell contention between CPUs sharing one queue; a \
         qpath context owns its queues (one thread, no lock), so what N queues add here is N TCP connections that \
         the target deals to its reactors round-robin. With one target core there is nothing to spread over: \
         (ii) should match (i), and 'never below' is the goal that applies; the +20% is shown only with target \
         cores to spare (--reactors, --target-cpus).",
    );
    r.columns(&["case", "IOPS", "vs 1 queue", "lat us", "host CPU ns/IO", "target CPU ns/IO", "errors"]);
    let one = results.iter().find(|c| c.layout == Layout::OneQueue).map_or(f64::NAN, CaseResult::iops);
    for c in results {
        r.row(vec![
            Cell::text(c.layout.name(n)),
            Cell::num(c.iops(), "IOPS"),
            Cell::num(c.iops() / one, ""),
            Cell::num(c.latency_us(), "us"),
            Cell::num(c.host_cpu_ns_per_io(), "ns"),
            Cell::num(if c.ios() > 0 { c.target_cpu_ns as f64 / c.ios() as f64 } else { f64::NAN }, "ns"),
            Cell::num(c.errors_all_rounds as f64, ""),
        ]);
    }
    if let Some(c) = results.iter().find(|c| c.layout == Layout::QueuesOnOne) {
        r.goal(Goal::at_least(format!("{n} queues on 1 context / 1 queue (never below)"), c.iops(), one, 1.0));
        r.goal(Goal::at_least(format!("{n} queues on 1 context / 1 queue (the seed's win)"), c.iops(), one, 1.2));
    }
    let groups: Vec<String> = results.iter().map(|c| c.layout.short().to_string()).collect();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    r.bars("IOPS", &groups, vec![("4k randread".into(), results.iter().map(CaseResult::iops).collect())]);
    let cases: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "case": c.layout.name(n),
                "iops": c.iops(),
                "errors": c.errors_all_rounds,
                "iops_all_rounds": all_iops.get(i).cloned().unwrap_or_default(),
                "target_cpu_ns": c.target_cpu_ns,
                "contexts": c.contexts.iter().map(|x| json!({
                    "ios": x.ios, "seconds": x.secs, "total_ios": x.total_ios, "errors": x.errors,
                    "undrained": x.undrained, "cpu_ns": x.cpu_ns,
                    "per_queue": x.per_queue.iter().map(|(q, n)| json!({"queue": q, "ios": n})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    r.extra.insert("cases".into(), Value::Array(cases));
    r
}

/// `qpath lab seed-004`: run, print as asked, write the plot.
pub fn lab(args: &Seed004Args) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// Errors (failed or refused reads, or reads left undrained) over every case.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(cases)) = r.extra.get("cases") else { return 0 };
    cases.iter().map(|c| c["errors"].as_u64().unwrap_or(0)).sum()
}
