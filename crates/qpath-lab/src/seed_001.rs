//! `qpath lab seed-001`: a user-owned queue pair against the block path.
//!
//! The seed (Xiaoguang Wang, linux-nvme, 2023): io_uring NVMe passthrough on
//! `/dev/ng1n1` gained only 10% over polled O_DIRECT block I/O (891K vs 808K IOPS,
//! `t/io_uring -b512 -d128 -c32 -s32 -p1`, one submitter on CPU 1) because it still
//! went through blk-mq (stats, cgroup, RCU, deep poll chains). The proposal: queues
//! the block layer never sees, owned and polled by the application.
//!
//! Here both paths run as `qpath bench` jobs against the embedded target, in the same
//! run and with the same harness, one after the other:
//!
//! ```text
//!   job thread (CPU 1), randread, iodepth 128, batches of 32, hipri
//!     block:    engine qpath          Context: request slot ─► tag ─► queue ─► stats
//!     passthru: engine qpath-passthru QueuePair: raw SQE ─► command id ─► socket
//!                 │ loopback NVMe/TCP
//!   embedded target: one reactor (CPU 0, busy-polling), RAM namespace
//! ```
//!
//! On loopback the target's core does most of the work of a read (its send carries
//! the data through the kernel's TCP stack, receive side included), so both paths
//! can be capped by the target before the host's core is full. The lab therefore
//! measures the host's cost too: every engine is wrapped by a meter that reaps with
//! single non-blocking polls and times the ones that find nothing. The submitting
//! thread's CPU time minus that idle time is the host's busy time; busy ns per I/O
//! is what the host core pays for an I/O on each path, and `1e9 / busy ns` is the
//! IOPS one host core could carry if the target kept up.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use target::reactor::PollMode;
use target::registry::TcpCongestion;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::embedded_target::{Embedded, EmbeddedOptions, NAMESPACE_BYTES_MIN};
use bench::engine::remote::Controllers;
use bench::engine::{Capabilities, Engine, EngineCtx, EngineFactory, EngineRegistry, FileInfo, Queued};
use bench::io_u::IoU;
use bench::job::JobFile;
use bench::run::{RunOptions, StatusMode};
use bench::{Error, ErrorKind, Result};

/// The seed's queue depth (`-d128`).
pub const IODEPTH: u32 = 128;
/// The seed's submit and complete batches (`-s32 -c32`).
pub const BATCH: u32 = 32;
/// Block sizes: the seed's 512 bytes, and 4 KiB as the issue asks.
pub const BLOCK_SIZES: [u32; 2] = [512, 4096];

/// Arguments of `qpath lab seed-001`.
#[derive(Debug, Clone, clap::Args)]
pub struct Seed001Args {
    /// Seconds each job runs (the seed's t/io_uring ran until stopped).
    #[arg(long, default_value = "5", value_parser = crate::seconds_up_to::<3600>)]
    pub runtime: f64,
    /// Runs of every case, interleaved (block, passthru, block, ...); the table shows
    /// the median of each case.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// A short run for smoke tests: 0.5 s per job, one round.
    #[arg(long)]
    pub quick: bool,
    /// How the embedded target's reactor waits: busy (default, as SPDK), adaptive or block.
    #[arg(long = "target-poll", default_value = "busy", value_parser = crate::parse_poll)]
    pub target_poll: PollMode,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for Seed001Args {
    fn default() -> Self {
        Seed001Args {
            runtime: 5.0,
            rounds: 3,
            quick: false,
            target_poll: PollMode::Busy,
            output: LabOutputArgs::default(),
        }
    }
}

impl Seed001Args {
    fn plan(&self) -> Result<(Duration, u32)> {
        if self.quick {
            return Ok((Duration::from_millis(500), 1));
        }
        if self.rounds == 0 || self.rounds > 20 {
            return Err(Error::new(ErrorKind::Option, format!("--rounds {}: 1..=20", self.rounds)));
        }
        Ok((Duration::from_secs_f64(self.runtime), self.rounds))
    }
}

/// The two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `ioengine=qpath`: the block core (request slots, tags, queue map, stats).
    Block,
    /// `ioengine=qpath-passthru`: a user-owned queue pair.
    Passthru,
}

impl Path {
    const ALL: [Path; 2] = [Path::Block, Path::Passthru];

    /// The engine that runs it.
    pub fn engine(self) -> &'static str {
        match self {
            Path::Block => "qpath",
            Path::Passthru => "qpath-passthru",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Path::Block => "block (qpath)",
            Path::Passthru => "user queue pair (qpath-passthru)",
        }
    }
}

// ------------------------------------------------------------------ meter

/// What a metered engine saw: polls, and the time spent in polls that found nothing.
/// Written only by the job thread that owns the engine.
#[derive(Debug, Default)]
pub struct Meter {
    polls: AtomicU64,
    empty_polls: AtomicU64,
    idle_ns: AtomicU64,
}

impl Meter {
    fn add(c: &AtomicU64, v: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    /// Polls made, polls that found nothing, and the time spent in those (ns).
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.polls.load(Ordering::Relaxed),
            self.empty_polls.load(Ordering::Relaxed),
            self.idle_ns.load(Ordering::Relaxed),
        )
    }
}

/// Wraps a factory so that its engines reap through single polls whose idle time is
/// measured ([`Meter`]).
pub struct MeteredFactory {
    inner: Arc<dyn EngineFactory>,
    meter: Arc<Meter>,
}

impl std::fmt::Debug for MeteredFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredFactory").field("engine", &self.inner.name()).finish()
    }
}

impl MeteredFactory {
    /// Wraps `inner`; its engines count into `meter`.
    pub fn new(inner: Arc<dyn EngineFactory>, meter: Arc<Meter>) -> MeteredFactory {
        MeteredFactory { inner, meter }
    }
}

impl EngineFactory for MeteredFactory {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        Ok(Box::new(Metered {
            inner: self.inner.create(ctx)?,
            meter: Arc::clone(&self.meter),
            ready: VecDeque::new(),
            reaped: VecDeque::new(),
        }))
    }
}

struct Metered {
    inner: Box<dyn Engine>,
    meter: Arc<Meter>,
    ready: VecDeque<u32>,
    reaped: VecDeque<u32>,
}

impl Engine for Metered {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        self.inner.open(ctx)
    }

    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        self.inner.prepare(units)
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        self.inner.queue(unit)
    }

    fn commit(&mut self, units: &mut [IoU]) -> Result<()> {
        self.inner.commit(units)
    }

    fn getevents(&mut self, units: &mut [IoU], min: usize, max: usize, timeout: Option<Duration>) -> Result<usize> {
        assert!(self.reaped.is_empty(), "getevents called before the previous events were taken");
        let deadline = timeout.map(|t| Instant::now() + t);
        let max = max.max(min).max(1);
        let (mut polls, mut empty, mut idle) = (0u64, 0u64, 0u64);
        loop {
            let t0 = Instant::now();
            let n = self.inner.getevents(units, 0, max, Some(Duration::ZERO))?;
            for i in 0..n {
                self.ready.push_back(self.inner.event(i));
            }
            let t1 = Instant::now();
            polls += 1;
            if n == 0 {
                empty += 1;
                idle += u64::try_from(t1.saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
            }
            if self.ready.len() >= min || deadline.is_some_and(|d| t1 >= d) {
                break;
            }
        }
        Meter::add(&self.meter.polls, polls);
        Meter::add(&self.meter.empty_polls, empty);
        Meter::add(&self.meter.idle_ns, idle);
        let n = self.ready.len().min(max);
        self.reaped.extend(self.ready.drain(..n));
        Ok(n)
    }

    fn event(&mut self, index: usize) -> u32 {
        let _ = index;
        self.reaped.pop_front().expect("event() index within the last getevents count")
    }

    fn close(&mut self) -> Result<()> {
        self.inner.close()
    }
}

// ------------------------------------------------------------------ cases

/// One job's measurement.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which path.
    pub path: Path,
    /// Block size.
    pub bs: u32,
    /// Round (0-based).
    pub round: u32,
    /// Reads completed.
    pub ios: u64,
    /// Job runtime, ms.
    pub runtime_ms: u64,
    /// Submitting thread's user + system CPU time, µs.
    pub cpu_us: u64,
    /// Time in polls that found nothing, ns.
    pub idle_ns: u64,
    /// Polls and empty polls.
    pub polls: (u64, u64),
    /// Mean completion latency, µs.
    pub clat_us: f64,
    /// I/O errors (the job's error, if any, counts as one).
    pub errors: u64,
}

impl Sample {
    /// Reads per second.
    pub fn iops(&self) -> f64 {
        if self.runtime_ms == 0 { 0.0 } else { self.ios as f64 * 1000.0 / self.runtime_ms as f64 }
    }

    /// Host CPU per read (user + system), ns: with a spinning submitter this
    /// includes the time spent waiting for the target.
    pub fn cpu_ns_per_io(&self) -> f64 {
        if self.ios == 0 { f64::NAN } else { self.cpu_us as f64 * 1000.0 / self.ios as f64 }
    }

    /// Host CPU per read without the empty polls, ns.
    pub fn busy_ns_per_io(&self) -> f64 {
        if self.ios == 0 {
            return f64::NAN;
        }
        (self.cpu_us as f64 * 1000.0 - self.idle_ns as f64).max(0.0) / self.ios as f64
    }

    /// The submitting thread's CPU time over the job's runtime. The meter times
    /// empty polls by the wall clock, so busy ns per I/O holds only while the thread
    /// keeps its core (≈ 1 here): a thread preempted inside an empty poll counts the
    /// preemption as idle, and busy time comes out too low (0 on a loaded machine).
    pub fn on_cpu_share(&self) -> f64 {
        if self.runtime_ms == 0 { f64::NAN } else { self.cpu_us as f64 / (self.runtime_ms as f64 * 1000.0) }
    }

    /// Share of the submitting thread's CPU time spent in empty polls.
    pub fn idle_share(&self) -> f64 {
        if self.cpu_us == 0 { f64::NAN } else { (self.idle_ns as f64 / (self.cpu_us as f64 * 1000.0)).min(1.0) }
    }
}

fn job_text(path: Path, bs: u32, runtime: Duration, uri: &str, cpu: Option<usize>) -> String {
    let cpus = cpu.map_or_else(String::new, |c| format!("cpus_allowed={c}\n"));
    format!(
        "[{}-{bs}]\nioengine={}\nhipri\nfilename={uri}\nrw=randread\nbs={bs}\niodepth={IODEPTH}\n\
         iodepth_batch_submit={BATCH}\niodepth_batch_complete_min={BATCH}\niodepth_batch_complete_max={BATCH}\n\
         direct=1\nthread\n{cpus}time_based\nruntime={}ms\nsize={NAMESPACE_BYTES_MIN}\n",
        path.engine(),
        path.engine(),
        runtime.as_millis().max(1)
    )
}

fn run_one(
    path: Path,
    bs: u32,
    round: u32,
    runtime: Duration,
    server: &Embedded,
    cpu: Option<usize>,
) -> Result<Sample> {
    let file = JobFile::parse(&job_text(path, bs, runtime, &server.uri(1), cpu), "seed-001")?;
    let ctrls = Arc::new(Controllers::for_jobs(&file));
    let all = EngineRegistry::with_all_engines(&ctrls);
    let meter = Arc::new(Meter::default());
    let mut registry = EngineRegistry::with_local_engines();
    let inner =
        all.get(path.engine()).ok_or_else(|| Error::new(ErrorKind::Engine, format!("no {} engine", path.engine())))?;
    registry.register(Arc::new(MeteredFactory::new(inner, Arc::clone(&meter))));
    let opts = RunOptions { pin: Some(crate::pin_hook()), status: StatusMode::Never, ..RunOptions::default() };
    let result = bench::run::run_jobs(&file, &registry, &opts, &mut std::io::sink());
    drop(registry);
    drop(all);
    ctrls.disconnect_all();
    let result = result?;
    let job = result.jobs.first().ok_or_else(|| Error::new(ErrorKind::Engine, "seed-001: no job ran"))?;
    let st = &job.outcome.stat;
    let d = &st.dirs[0];
    let (polls, empty, idle_ns) = meter.get();
    Ok(Sample {
        path,
        bs,
        round,
        ios: d.io_bytes / u64::from(bs),
        runtime_ms: d.runtime_ms,
        cpu_us: st.usr_us + st.sys_us,
        idle_ns,
        polls: (polls, empty),
        clat_us: d.clat.mean / 1e3,
        errors: u64::from(job.outcome.error.is_some()),
    })
}

/// Runs every case and builds the report (does not print it).
pub fn run(args: &Seed001Args, progress: &mut dyn std::io::Write) -> Result<LabResult> {
    let (runtime, rounds) = args.plan()?;
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let job_cpu = job_cpus.first().copied();
    let server = Embedded::start(EmbeddedOptions {
        poll: args.target_poll,
        reactor_cpu,
        namespaces: vec![(1, NAMESPACE_BYTES_MIN)],
        tcp_congestion: TcpCongestion::System,
    })?;
    let _ = writeln!(progress, "seed-001: {}", server.describe());
    let mut samples = Vec::new();
    let mut failed = None;
    'all: for round in 0..rounds {
        for bs in BLOCK_SIZES {
            // Alternate which path goes first, so drift over the run does not favour one.
            let order = if round % 2 == 0 { Path::ALL } else { [Path::Passthru, Path::Block] };
            for path in order {
                let _ = writeln!(
                    progress,
                    "seed-001: round {}/{rounds}: {} bs={bs} ({:.1} s)",
                    round + 1,
                    path.engine(),
                    runtime.as_secs_f64()
                );
                match run_one(path, bs, round, runtime, &server, job_cpu) {
                    Ok(s) => samples.push(s),
                    Err(e) => {
                        failed = Some(e);
                        break 'all;
                    }
                }
            }
        }
    }
    let desc = server.describe();
    server.shutdown();
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(report(&samples, runtime, rounds, &desc, job_cpu))
}

/// The median of `f` over the samples of one case.
fn med(samples: &[Sample], path: Path, bs: u32, f: impl Fn(&Sample) -> f64) -> f64 {
    crate::median(samples.iter().filter(|s| s.path == path && s.bs == bs).map(f).collect()).unwrap_or(f64::NAN)
}

fn report(samples: &[Sample], runtime: Duration, rounds: u32, target: &str, job_cpu: Option<usize>) -> LabResult {
    let mut r = LabResult::new("seed-001", "randread at iodepth 128 on one core: block path vs user queue pair");
    r.note(format!(
        "seed: t/io_uring -b512 -d128 -c32 -s32 -p1 on CPU 1 of a server, NVMe SSD; passthrough 891K vs block 808K \
         IOPS (+10%). Here: bs 512 and 4096, iodepth {IODEPTH}, batches of {BATCH} (iodepth_batch_submit / \
         complete_min / complete_max), hipri, one job thread on {}; {target}.",
        job_cpu.map_or_else(|| "an unpinned CPU".to_string(), |c| format!("CPU {c}"))
    ));
    r.note(format!(
        "{rounds} round(s) of {:.1} s per case, paths alternating first; medians shown. 'host busy ns/IO' = (the \
         job thread's user+system CPU time - time in polls that found nothing) / reads; 'host idle' = that empty-poll \
         share of its CPU time; 'host on-CPU' = its CPU time / the job's runtime: the busy figures hold only near 1 \
         (a thread preempted in an empty poll counts the preemption as idle, so on a loaded machine busy ns/IO \
         reads too low, down to 0). A host that idles is waiting for the target: then IOPS measure the target, and \
         '1-core host capacity' (1e9 / busy ns) is what the host core alone would carry.",
        runtime.as_secs_f64()
    ));
    r.columns(&[
        "bs",
        "path",
        "IOPS",
        "IOPS vs block",
        "clat us",
        "host CPU ns/IO",
        "host busy ns/IO",
        "host idle",
        "host on-CPU",
        "1-core host capacity",
        "capacity vs block",
        "errors",
    ]);
    let mut bars_iops = Vec::new();
    let mut bars_cap = Vec::new();
    let mut groups = Vec::new();
    for bs in BLOCK_SIZES {
        let iops_block = med(samples, Path::Block, bs, Sample::iops);
        let busy_block = med(samples, Path::Block, bs, Sample::busy_ns_per_io);
        for path in Path::ALL {
            let iops = med(samples, path, bs, Sample::iops);
            let busy = med(samples, path, bs, Sample::busy_ns_per_io);
            let errors: u64 = samples.iter().filter(|s| s.path == path && s.bs == bs).map(|s| s.errors).sum();
            r.row(vec![
                Cell::num(f64::from(bs), "B"),
                Cell::text(path.label()),
                Cell::num(iops, "IOPS"),
                Cell::num(iops / iops_block, ""),
                Cell::num(med(samples, path, bs, |s| s.clat_us), "us"),
                Cell::num(med(samples, path, bs, Sample::cpu_ns_per_io), "ns"),
                Cell::num(busy, "ns"),
                Cell::num(med(samples, path, bs, Sample::idle_share), ""),
                Cell::num(med(samples, path, bs, Sample::on_cpu_share), ""),
                Cell::num(1e9 / busy, "IOPS"),
                Cell::num(busy_block / busy, ""),
                Cell::num(errors as f64, ""),
            ]);
            bars_iops.push(iops);
            bars_cap.push(1e9 / busy);
            groups.push(format!("{bs} B {}", if path == Path::Block { "block" } else { "passthru" }));
        }
        let iops_pt = med(samples, Path::Passthru, bs, Sample::iops);
        let busy_pt = med(samples, Path::Passthru, bs, Sample::busy_ns_per_io);
        r.goal(Goal::at_least(format!("{bs} B IOPS, user queue pair / block"), iops_pt, iops_block, 1.3));
        r.goal(Goal::at_least(
            format!("{bs} B host capacity (1e9 / busy ns per I/O), user queue pair / block"),
            1e9 / busy_pt,
            1e9 / busy_block,
            1.3,
        ));
    }
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    r.bars(
        "reads per second",
        &groups,
        vec![("measured IOPS".into(), bars_iops), ("1-core host capacity".into(), bars_cap)],
    );
    let raw: Vec<Value> = samples
        .iter()
        .map(|s| {
            json!({
                "path": s.path.engine(),
                "bs": s.bs,
                "round": s.round,
                "ios": s.ios,
                "runtime_ms": s.runtime_ms,
                "iops": s.iops(),
                "cpu_us": s.cpu_us,
                "idle_ns": s.idle_ns,
                "polls": s.polls.0,
                "empty_polls": s.polls.1,
                "clat_us_mean": s.clat_us,
                "cpu_ns_per_io": s.cpu_ns_per_io(),
                "busy_ns_per_io": s.busy_ns_per_io(),
                "on_cpu_share": s.on_cpu_share(),
                "errors": s.errors,
            })
        })
        .collect();
    r.extra.insert("samples".into(), Value::Array(raw));
    r
}

/// `qpath lab seed-001`: run, print as asked, write the plot.
pub fn lab(args: &Seed001Args) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// I/O errors over every sample of a result.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(samples)) = r.extra.get("samples") else { return 0 };
    samples.iter().map(|s| s["errors"].as_u64().unwrap_or(0)).sum()
}
