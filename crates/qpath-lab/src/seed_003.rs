//! `qpath lab seed-003`: a slow device starved of tags by a fast one on the same tag
//! set, and fair sharing without a shared atomic per I/O.
//!
//! The seed: two devices behind one SCSI host tag set of 170 (LUN queue depths 70
//! and 10); 32 random-read hogs at iodepth 10,000 on the fast device (18,000 IOPS /
//! 750 MB/s provisioned) took the WAL job's 8k sequential writes at iodepth 3 on the
//! slow device (3,500 IOPS / 170 MB/s) from 29 MB/s alone down to 5 MB/s.
//!
//! ```text
//!   hog thread (context A)                      WAL thread (context B)
//!   32 jobs x N reads of 16k, random            3 writes of 8k, sequential
//!        │ tag ─► budget 70 ─► queue 1               │ tag ─► budget 10 ─► queue 2
//!        └──────────── one host-wide SharedTagSet of 170 ────┘
//!                                  │ loopback NVMe/TCP
//!   embedded target: ns 1 (18,000 IOPS, 750 MB/s)   ns 2 (3,500 IOPS, 170 MB/s)
//! ```
//!
//! Every case starts a fresh target and controller, starts the hogs, lets them take
//! the tags, starts the WAL, warms up, then measures both for `--runtime` seconds.
//! The LUN depth is taken after the tag, as Linux SCSI does
//! ([`DepthLimitOrder::AfterTag`]): that is how a depth-70 device holds all 170 tags
//! (the other 100 with requests waiting for its budget). The last case uses qpath's
//! own order instead ([`DepthLimitOrder::BeforeTag`]), where the LUN depth caps the
//! tags a device holds.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use blk::{SharedTagPolicy, SharedTagSet};
use hdrhistogram::Histogram;
use host::context::{Context, ContextOptions, DepthLimitOrder, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use target::config::{Config, NamespaceConfig, SizeValue};
use target::qos::QosSettings;
use target::reactor::PollMode;
use uring::{IoBuf, Wait};

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::{Error, ErrorKind, Result};

/// The seed's host tag set depth (`nr_requests`).
pub const TAG_DEPTH: u16 = 170;
/// The fast device's LUN queue depth.
pub const FAST_LUN_DEPTH: u16 = 70;
/// The slow device's LUN queue depth.
pub const SLOW_LUN_DEPTH: u16 = 10;
/// Provisioned IOPS of the fast device.
pub const FAST_IOPS: u64 = 18_000;
/// Provisioned bandwidth of the fast device, bytes per second (750 MB/s).
pub const FAST_BYTES_PER_SEC: u64 = 750_000_000;
/// Provisioned IOPS of the slow device.
pub const SLOW_IOPS: u64 = 3_500;
/// Provisioned bandwidth of the slow device, bytes per second (170 MB/s).
pub const SLOW_BYTES_PER_SEC: u64 = 170_000_000;
/// Hog block size (the seed's `bs=16k`).
const HOG_BS: u32 = 16 << 10;
/// WAL block size (`bs=8k`).
const WAL_BS: u32 = 8 << 10;
/// WAL queue depth (`iodepth=3`).
const WAL_DEPTH: usize = 3;
/// The seed's file sizes, used as namespace sizes (RAM, mapped lazily: the hogs only
/// read, which costs no memory; the WAL writes `runtime x 29 MB/s` per case).
const FAST_NS_BYTES: u64 = 10 << 30;
const SLOW_NS_BYTES: u64 = 4 << 30;
/// Most hog reads outstanding (each holds a 16 KiB buffer: 256 MiB).
const HOG_OUTSTANDING_MAX: u32 = 16_384;
/// How long a job may take to drain its outstanding I/O after the run.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest sleep in the kernel before a job re-checks the phase.
const POLL_SLICE: Duration = Duration::from_millis(2);
/// The hogs run alone this long before the WAL starts, so they hold the tags first.
const HOG_HEAD_START: Duration = Duration::from_millis(200);
const NQN: &str = "nqn.2026-11.io.qpath:seed-003";

/// Arguments of `qpath lab seed-003`.
#[derive(Debug, Clone, clap::Args)]
pub struct Seed003Args {
    /// Seconds each case is measured, after its warm-up (the seed ran 1000 s).
    #[arg(long, default_value = "10", value_parser = crate::seconds_up_to::<3600>)]
    pub runtime: f64,
    /// Seconds of warm-up per case, after the WAL started.
    #[arg(long, default_value = "1", value_parser = crate::seconds_up_to::<3600>)]
    pub warmup: f64,
    /// A short run for smoke tests: 1 s per case, 0.3 s warm-up.
    #[arg(long)]
    pub quick: bool,
    /// Hog jobs (the seed's numjobs=32); all run in one thread.
    #[arg(long = "hog-jobs", default_value_t = 32)]
    pub hog_jobs: u32,
    /// Reads each hog job keeps outstanding (the seed's iodepth=10000).
    #[arg(long = "hog-iodepth", default_value_t = 64)]
    pub hog_iodepth: u32,
    /// Latency the target adds to every I/O of both devices, in microseconds.
    #[arg(long = "latency-us", default_value_t = 0)]
    pub latency_us: u64,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for Seed003Args {
    fn default() -> Self {
        Seed003Args {
            runtime: 10.0,
            warmup: 1.0,
            quick: false,
            hog_jobs: 32,
            hog_iodepth: 64,
            latency_us: 0,
            output: LabOutputArgs::default(),
        }
    }
}

impl Seed003Args {
    fn times(&self) -> (Duration, Duration) {
        if self.quick {
            (Duration::from_secs(1), Duration::from_millis(300))
        } else {
            (Duration::from_secs_f64(self.runtime), Duration::from_secs_f64(self.warmup))
        }
    }

    fn hog_outstanding(&self) -> Result<usize> {
        let n = u64::from(self.hog_jobs) * u64::from(self.hog_iodepth);
        if n == 0 || n > u64::from(HOG_OUTSTANDING_MAX) {
            return Err(Error::new(
                ErrorKind::Option,
                format!("hog-jobs x hog-iodepth = {n}: must be in 1..={HOG_OUTSTANDING_MAX}"),
            ));
        }
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

/// How the two devices get their tags in a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tags {
    /// One host-wide set of 170 under this policy.
    Shared(SharedTagPolicy),
    /// A set of 170 of each device's own (the seed's patch).
    PerDevice,
}

/// One experiment.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    hogs: bool,
    wal: bool,
    tags: Tags,
    order: DepthLimitOrder,
}

const ALONE: &str = "WAL alone";
const HOGS_ALONE: &str = "hogs alone";
const UNFAIR: &str = "shared, no fairness";
const LINUX_FAIR: &str = "shared, linux-fair";
const WINDOWS: &str = "shared, windows";
const PER_DEVICE: &str = "per-device sets";
const UNFAIR_BEFORE: &str = "shared, no fairness, LUN depth before tag";

const CASES: [Case; 7] = [
    Case {
        name: ALONE,
        hogs: false,
        wal: true,
        tags: Tags::Shared(SharedTagPolicy::Unfair),
        order: DepthLimitOrder::AfterTag,
    },
    Case {
        name: HOGS_ALONE,
        hogs: true,
        wal: false,
        tags: Tags::Shared(SharedTagPolicy::Unfair),
        order: DepthLimitOrder::AfterTag,
    },
    Case {
        name: UNFAIR,
        hogs: true,
        wal: true,
        tags: Tags::Shared(SharedTagPolicy::Unfair),
        order: DepthLimitOrder::AfterTag,
    },
    Case {
        name: LINUX_FAIR,
        hogs: true,
        wal: true,
        tags: Tags::Shared(SharedTagPolicy::LinuxFair),
        order: DepthLimitOrder::AfterTag,
    },
    Case {
        name: WINDOWS,
        hogs: true,
        wal: true,
        tags: Tags::Shared(SharedTagPolicy::Windows),
        order: DepthLimitOrder::AfterTag,
    },
    Case { name: PER_DEVICE, hogs: true, wal: true, tags: Tags::PerDevice, order: DepthLimitOrder::AfterTag },
    Case {
        name: UNFAIR_BEFORE,
        hogs: true,
        wal: true,
        tags: Tags::Shared(SharedTagPolicy::Unfair),
        order: DepthLimitOrder::BeforeTag,
    },
];

fn policy_name(p: SharedTagPolicy) -> &'static str {
    match p {
        SharedTagPolicy::Unfair => "unfair",
        SharedTagPolicy::LinuxFair => "linux-fair",
        SharedTagPolicy::Windows => "windows",
    }
}

impl Case {
    fn tags_label(&self) -> String {
        let order = match self.order {
            DepthLimitOrder::AfterTag => "tag, then LUN budget",
            DepthLimitOrder::BeforeTag => "LUN depth caps tags",
        };
        match self.tags {
            Tags::Shared(p) => format!("1 x {TAG_DEPTH}, {}; {order}", policy_name(p)),
            Tags::PerDevice => format!("2 x {TAG_DEPTH}; {order}"),
        }
    }
}

/// What one job thread measured.
#[derive(Debug)]
struct JobStats {
    /// Successful completions inside the measured window.
    ios: u64,
    /// The window as this thread saw it.
    secs: f64,
    /// Completions over the whole run (warm-up and drain included).
    total_ios: u64,
    /// Failed completions and refused submissions over the whole run.
    errors: u64,
    /// Outstanding I/O left when the drain timed out.
    undrained: usize,
    /// Latency (submission to completion, ns) of the window's I/Os.
    latency: Histogram<u64>,
    /// Tags the device held, sampled about every millisecond in the window.
    tags_held_sum: u64,
    tags_held_samples: u64,
}

impl JobStats {
    fn rate(&self) -> f64 {
        if self.secs > 0.0 { self.ios as f64 / self.secs } else { 0.0 }
    }

    fn tags_held_avg(&self) -> f64 {
        if self.tags_held_samples > 0 { self.tags_held_sum as f64 / self.tags_held_samples as f64 } else { 0.0 }
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy)]
struct JobSpec {
    nsid: u32,
    op: Op,
    bs: u32,
    depth: usize,
    random: bool,
    lun_depth: u16,
    cpu: Option<usize>,
    seed: u64,
}

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// Runs one job on the calling thread until the phase says stop, then drains.
fn run_job(
    ctrl: &Arc<Controller>,
    tags: Arc<SharedTagSet>,
    order: DepthLimitOrder,
    spec: JobSpec,
    phase: &AtomicU8,
    started: &Barrier,
) -> Result<JobStats> {
    let host_err = |what: &str, e: &dyn std::fmt::Display| Error::new(ErrorKind::Engine, format!("{what}: {e}"));
    let opened = (|| {
        let mut ctx = Context::new(ContextOptions {
            cpu: spec.cpu,
            max_requests: spec.depth,
            shared_tags: Some(tags),
            depth_limit_order: order,
            ..ContextOptions::default()
        })
        .map_err(|e| host_err("context", &e))?;
        let dev = ctx.open_limited(ctrl, Nsid(spec.nsid), Some(spec.lun_depth)).map_err(|e| host_err("open", &e))?;
        Ok::<_, Error>((ctx, dev))
    })();
    // Release the main thread whether or not the job could start.
    started.wait();
    let (mut ctx, dev) = opened?;
    let capacity = ctx.capacity(dev);
    let bs = u64::from(spec.bs);
    let slots = capacity / bs;
    if slots == 0 {
        return Err(Error::new(ErrorKind::Engine, format!("namespace {} smaller than one block", spec.nsid)));
    }
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let mut next_seq = 0u64;
    let mut next_offset = move || {
        if spec.random {
            rng.random_range(0..slots) * bs
        } else {
            let o = next_seq * bs;
            next_seq = (next_seq + 1) % slots;
            o
        }
    };
    let mut st = JobStats {
        ios: 0,
        secs: 0.0,
        total_ios: 0,
        errors: 0,
        undrained: 0,
        latency: Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("static histogram bounds"),
        tags_held_sum: 0,
        tags_held_samples: 0,
    };
    let mut outstanding = 0usize;
    for token in 0..spec.depth {
        let mut buf = IoBuf::new(spec.bs as usize);
        buf.set_len(spec.bs as usize);
        buf.fill(0x5a);
        match ctx.submit(dev, spec.op, next_offset(), spec.bs, Some(buf), token as u64) {
            Ok(()) => outstanding += 1,
            Err(_) => st.errors += 1,
        }
    }
    let mut done = Vec::with_capacity(spec.depth);
    let (mut window_start, mut window_end): (Option<Instant>, Option<Instant>) = (None, None);
    let mut last_sample = Instant::now();
    loop {
        ctx.poll(Wait::Block { timeout: Some(POLL_SLICE) }).map_err(|e| host_err("poll", &e))?;
        let now = Instant::now();
        let ph = phase.load(Ordering::Relaxed);
        if ph >= MEASURE && window_start.is_none() {
            window_start = Some(now);
        }
        if ph == STOP && window_end.is_none() {
            window_end = Some(now);
        }
        let measuring = ph == MEASURE;
        done.extend(ctx.completions());
        for c in done.drain(..) {
            st.total_ios += 1;
            if !c.status.is_success() {
                st.errors += 1;
            } else if measuring {
                st.ios += 1;
                let _ = st.latency.record(c.latency_ns.max(1));
            }
            outstanding -= 1;
            if ph != STOP {
                let buf = c.buf.unwrap_or_else(|| IoBuf::new(spec.bs as usize));
                match ctx.submit(dev, spec.op, next_offset(), spec.bs, Some(buf), c.token) {
                    Ok(()) => outstanding += 1,
                    Err(_) => st.errors += 1,
                }
            }
        }
        if measuring && now.duration_since(last_sample) >= Duration::from_millis(1) {
            last_sample = now;
            st.tags_held_sum += u64::from(ctx.tags_held(dev).unwrap_or(0));
            st.tags_held_samples += 1;
        }
        if let Some(end) = window_end {
            if outstanding == 0 {
                break;
            }
            if now.duration_since(end) > DRAIN_TIMEOUT {
                st.undrained = outstanding;
                break;
            }
        }
    }
    if let (Some(a), Some(b)) = (window_start, window_end) {
        st.secs = b.duration_since(a).as_secs_f64();
    }
    Ok(st)
}

/// One case's outcome.
#[derive(Debug)]
struct CaseResult {
    case: Case,
    wal: Option<JobStats>,
    hogs: Option<JobStats>,
}

fn target_config(latency_us: u64, reactor_cpu: Option<usize>) -> Config {
    let mut cfg = crate::one_reactor_target(reactor_cpu, PollMode::Block);
    let sub = &mut cfg.subsystems[0];
    sub.nqn = NQN.into();
    let template = sub.namespaces[0].clone();
    let ns = |nsid: u32, bytes: u64, iops: u64, bytes_per_sec: u64| NamespaceConfig {
        nsid,
        backend: "ram".into(),
        size: Some(SizeValue::Bytes(bytes)),
        qos: QosSettings { iops, bytes_per_sec, delay_us: latency_us },
        ..template.clone()
    };
    sub.namespaces =
        vec![ns(1, FAST_NS_BYTES, FAST_IOPS, FAST_BYTES_PER_SEC), ns(2, SLOW_NS_BYTES, SLOW_IOPS, SLOW_BYTES_PER_SEC)];
    cfg
}

fn run_case(case: Case, args: &Seed003Args, runtime: Duration, warmup: Duration) -> Result<CaseResult> {
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let job_cpu = job_cpus.first().copied();
    let server = target_config(args.latency_us, reactor_cpu)
        .start()
        .map_err(|e| Error::new(ErrorKind::Target, format!("seed-003 target: {e}")))?;
    let addr = server.local_addr(1).ok_or_else(|| Error::new(ErrorKind::Target, "seed-003 target: no port 1"))?;
    let mut copts = ConnectOptions::new(addr, NQN);
    copts.nr_io_queues = 2;
    copts.tag_space = Some(TAG_DEPTH);
    let ctrl = match Controller::connect(copts) {
        Ok(c) => c,
        Err(e) => {
            server.shutdown();
            return Err(Error::new(ErrorKind::Target, format!("seed-003: connect: {e}")));
        }
    };
    let new_set = |policy| {
        SharedTagSet::new(TAG_DEPTH, policy).map_err(|e| Error::new(ErrorKind::Option, format!("tag set: {e}")))
    };
    let (hog_tags, wal_tags) = match case.tags {
        Tags::Shared(p) => {
            let s = new_set(p)?;
            (Arc::clone(&s), s)
        }
        Tags::PerDevice => (new_set(SharedTagPolicy::Unfair)?, new_set(SharedTagPolicy::Unfair)?),
    };
    let hog_spec = JobSpec {
        nsid: 1,
        op: Op::Read,
        bs: HOG_BS,
        depth: args.hog_outstanding()?,
        random: true,
        lun_depth: FAST_LUN_DEPTH,
        cpu: job_cpu,
        seed: 3,
    };
    let wal_spec = JobSpec {
        nsid: 2,
        op: Op::Write,
        bs: WAL_BS,
        depth: WAL_DEPTH,
        random: false,
        lun_depth: SLOW_LUN_DEPTH,
        cpu: job_cpu,
        seed: 0,
    };
    let phase = AtomicU8::new(WARMUP);
    let outcome = std::thread::scope(|s| {
        let start = |spec: JobSpec, tags: Arc<SharedTagSet>, name: &str| {
            let barrier = Arc::new(Barrier::new(2));
            let b = Arc::clone(&barrier);
            let (ctrl, phase) = (&ctrl, &phase);
            let h = std::thread::Builder::new()
                .name(format!("seed-003 {name}"))
                .spawn_scoped(s, move || run_job(ctrl, tags, case.order, spec, phase, &b))
                .map_err(|e| Error::io("spawn a job thread", e));
            if h.is_ok() {
                barrier.wait();
            }
            h
        };
        let hogs = if case.hogs { Some(start(hog_spec, hog_tags, "hogs")?) } else { None };
        if hogs.is_some() {
            std::thread::sleep(HOG_HEAD_START);
        }
        let wal = if case.wal { Some(start(wal_spec, wal_tags, "wal")?) } else { None };
        std::thread::sleep(warmup);
        phase.store(MEASURE, Ordering::Relaxed);
        std::thread::sleep(runtime);
        phase.store(STOP, Ordering::Relaxed);
        let join = |h: Option<std::thread::ScopedJoinHandle<'_, Result<JobStats>>>| -> Result<Option<JobStats>> {
            match h {
                None => Ok(None),
                Some(h) => h.join().map_err(|_| Error::new(ErrorKind::Engine, "a job thread panicked"))?.map(Some),
            }
        };
        let hogs = join(hogs);
        let wal = join(wal);
        Ok::<_, Error>((hogs?, wal?))
    });
    ctrl.delete();
    server.shutdown();
    let (hogs, wal) = outcome?;
    Ok(CaseResult { case, wal, hogs })
}

/// Runs every case and builds the report (does not print it).
pub fn run(args: &Seed003Args, progress: &mut dyn std::io::Write) -> Result<LabResult> {
    let (runtime, warmup) = args.times();
    let hog_outstanding = args.hog_outstanding()?;
    let mut results = Vec::with_capacity(CASES.len());
    for case in CASES {
        let _ = writeln!(
            progress,
            "seed-003: {} ({:.1} s + {:.1} s warm-up)",
            case.name,
            runtime.as_secs_f64(),
            warmup.as_secs_f64()
        );
        results.push(run_case(case, args, runtime, warmup)?);
    }
    Ok(report(args, &results, runtime, warmup, hog_outstanding))
}

fn find<'a>(results: &'a [CaseResult], name: &str) -> Option<&'a CaseResult> {
    results.iter().find(|r| r.case.name == name)
}

fn wal_mb_s(r: &CaseResult) -> f64 {
    r.wal.as_ref().map_or(f64::NAN, |w| w.rate() * f64::from(WAL_BS) / 1e6)
}

fn hog_iops(r: &CaseResult) -> f64 {
    r.hogs.as_ref().map_or(f64::NAN, JobStats::rate)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn report(
    args: &Seed003Args,
    results: &[CaseResult],
    runtime: Duration,
    warmup: Duration,
    hog_outstanding: usize,
) -> LabResult {
    let mut r = LabResult::new("seed-003", "WAL writes next to random-read hogs on one tag set of 170");
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let cpu = |c: Option<usize>| c.map_or_else(|| "unpinned".to_string(), |c| format!("CPU {c}"));
    r.note(format!(
        "seed: 16-core VM, 32 hog threads x iodepth 10000 + 1 WAL thread, 1000 s. Here {} CPUs shared with the \
         target: the {} hog jobs run in one thread (one context = one user of the tag set, as the seed's one \
         request queue) with {} reads outstanding each ({hog_outstanding} in all, {:.0}x the {TAG_DEPTH} tags); \
         the WAL (8k sequential writes, iodepth {WAL_DEPTH}) in a second thread with its own context; both on {}, \
         the target's reactor (block mode) on {}.",
        uring::online_cpus(),
        args.hog_jobs,
        args.hog_iodepth,
        hog_outstanding as f64 / f64::from(TAG_DEPTH),
        cpu(job_cpus.first().copied()),
        cpu(reactor_cpu),
    ));
    r.note(format!(
        "not scaled: tag depth {TAG_DEPTH}, LUN depths {FAST_LUN_DEPTH}/{SLOW_LUN_DEPTH}, provisioned \
         {FAST_IOPS} IOPS / 750 MB/s (ns 1, hogs, 16k random reads) and {SLOW_IOPS} IOPS / 170 MB/s (ns 2, WAL), \
         enforced by the target (GCRA per namespace), added latency {} us; 21,500 IOPS are a few percent of what \
         loopback does here. Runtime 1000 s -> {:.1} s per case after {:.1} s warm-up (hogs start {} ms first).",
        args.latency_us,
        runtime.as_secs_f64(),
        warmup.as_secs_f64(),
        HOG_HEAD_START.as_millis(),
    ));
    r.note(
        "LUN depth order: Linux SCSI takes the tag, then the LUN budget, so the 70-deep device can hold all 170 \
         tags (100 with requests waiting for its budget); every case but the last runs in that order. The last \
         case uses qpath's own order, where the LUN depth caps the tags a device holds.",
    );
    r.note(
        "recommended default: windows (SharedTagPolicy::default()): per-user allocation windows, no shared \
         atomic per I/O (crates/blk/BENCHMARKS.md); linux-fair is blk-mq's hctx_may_queue with its shared bitmap \
         and active-user count.",
    );
    r.columns(&[
        "case",
        "tags",
        "WAL MB/s",
        "WAL / alone",
        "WAL p99 ms",
        "hog IOPS",
        "hogs / provisioned",
        "hog tags held",
        "errors",
    ]);
    let alone = find(results, ALONE).map_or(f64::NAN, wal_mb_s);
    let provisioned = FAST_IOPS as f64;
    for c in results {
        let wal = wal_mb_s(c);
        let hogs = hog_iops(c);
        let errors = c.wal.as_ref().map_or(0, |w| w.errors + w.undrained as u64)
            + c.hogs.as_ref().map_or(0, |h| h.errors + h.undrained as u64);
        r.row(vec![
            Cell::text(c.case.name),
            Cell::text(c.case.tags_label()),
            Cell::num(wal, "MB/s"),
            Cell::num(wal / alone, ""),
            Cell::num(c.wal.as_ref().map_or(f64::NAN, |w| ms(w.latency.value_at_quantile(0.99))), "ms"),
            Cell::num(hogs, "IOPS"),
            Cell::num(hogs / provisioned, ""),
            Cell::num(c.hogs.as_ref().map_or(f64::NAN, JobStats::tags_held_avg), "tags"),
            Cell::num(errors as f64, ""),
        ]);
    }
    if let Some(u) = find(results, UNFAIR) {
        r.goal(Goal::at_most("starvation reproduced: WAL shared, no fairness / alone", wal_mb_s(u), alone, 0.5));
    }
    for name in [WINDOWS, LINUX_FAIR] {
        if let Some(c) = find(results, name) {
            r.goal(Goal::at_least(format!("WAL {name} / alone"), wal_mb_s(c), alone, 0.95));
            r.goal(Goal::at_least(format!("hog IOPS {name} / provisioned"), hog_iops(c), provisioned, 0.95));
        }
    }
    let groups: Vec<&str> = results.iter().map(|c| c.case.name).collect();
    r.bars(
        "% of reference",
        &groups,
        vec![
            ("WAL MB/s, % of alone".into(), results.iter().map(|c| 100.0 * wal_mb_s(c) / alone).collect()),
            ("hog IOPS, % of provisioned".into(), results.iter().map(|c| 100.0 * hog_iops(c) / provisioned).collect()),
        ],
    );
    let cases: Vec<Value> = results
        .iter()
        .map(|c| {
            let job = |s: &Option<JobStats>, bs: u32| match s {
                None => Value::Null,
                Some(s) => json!({
                    "ios": s.ios,
                    "seconds": s.secs,
                    "iops": s.rate(),
                    "mb_s": s.rate() * f64::from(bs) / 1e6,
                    "total_ios": s.total_ios,
                    "errors": s.errors,
                    "undrained": s.undrained,
                    "lat_ms": {
                        "mean": s.latency.mean() / 1e6,
                        "p50": ms(s.latency.value_at_quantile(0.5)),
                        "p99": ms(s.latency.value_at_quantile(0.99)),
                        "max": ms(s.latency.max()),
                    },
                    "tags_held_avg": s.tags_held_avg(),
                }),
            };
            json!({
                "case": c.case.name,
                "tags": c.case.tags_label(),
                "policy": match c.case.tags { Tags::Shared(p) => policy_name(p), Tags::PerDevice => "per-device" },
                "lun_depth_order": match c.case.order {
                    DepthLimitOrder::AfterTag => "after_tag",
                    DepthLimitOrder::BeforeTag => "before_tag",
                },
                "wal": job(&c.wal, WAL_BS),
                "hogs": job(&c.hogs, HOG_BS),
            })
        })
        .collect();
    r.extra.insert("cases".into(), Value::Array(cases));
    r.extra.insert(
        "scale".into(),
        json!({
            "hog_jobs": args.hog_jobs,
            "hog_iodepth": args.hog_iodepth,
            "hog_outstanding": hog_outstanding,
            "runtime_s": runtime.as_secs_f64(),
            "warmup_s": warmup.as_secs_f64(),
            "latency_us": args.latency_us,
            "tag_depth": TAG_DEPTH,
            "lun_depths": [FAST_LUN_DEPTH, SLOW_LUN_DEPTH],
            "provisioned": {
                "fast": {"iops": FAST_IOPS, "bytes_per_sec": FAST_BYTES_PER_SEC},
                "slow": {"iops": SLOW_IOPS, "bytes_per_sec": SLOW_BYTES_PER_SEC},
            },
        }),
    );
    r
}

/// `qpath lab seed-003`: run, print as asked, write the plot.
pub fn lab(args: &Seed003Args) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// Errors (failed or refused I/O, or I/O left undrained) over every case of a result.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(cases)) = r.extra.get("cases") else { return 0 };
    cases
        .iter()
        .flat_map(|c| [&c["wal"], &c["hogs"]])
        .filter(|j| !j.is_null())
        .map(|j| j["errors"].as_u64().unwrap_or(0) + j["undrained"].as_u64().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_the_issue() {
        let names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
        for want in [ALONE, UNFAIR, LINUX_FAIR, WINDOWS, PER_DEVICE] {
            assert!(names.contains(&want), "{want}");
        }
        assert!(CASES.iter().filter(|c| matches!(c.tags, Tags::Shared(_)) && c.hogs && c.wal).count() >= 3);
        assert_eq!(SharedTagPolicy::default(), SharedTagPolicy::Windows, "the notes name windows the default");
    }

    #[test]
    fn hog_outstanding_is_bounded() {
        let mut a = Seed003Args::default();
        assert_eq!(a.hog_outstanding().unwrap(), 2048);
        a.hog_iodepth = 10_000;
        assert!(a.hog_outstanding().is_err());
        a.hog_jobs = 0;
        assert!(a.hog_outstanding().is_err());
        a.quick = true;
        assert_eq!(a.times().0, Duration::from_secs(1));
    }

    #[test]
    fn target_has_the_seed_limits() {
        let cfg = target_config(0, None);
        let ns = &cfg.subsystems[0].namespaces;
        assert_eq!((ns[0].qos.iops, ns[0].qos.bytes_per_sec), (18_000, 750_000_000));
        assert_eq!((ns[1].qos.iops, ns[1].qos.bytes_per_sec), (3_500, 170_000_000));
    }
}
