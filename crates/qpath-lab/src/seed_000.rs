//! `qpath lab seed-000`: the job of seed 000 (linux-nvme, October 2023, "block: introduce
//! blk_queue_nr_active()") over two paths to the embedded target, under each of qpath's
//! path policies and the seed's two reference selectors, in one run.
//!
//! ```text
//!  embedded target (reactor, CPU 0) ── port 1 ─┐
//!                                   ── port 2 ─┴─ multipath head ── job thread (CPU 1)
//!  for each case: numa, round-robin, queue-depth, latency, ref-sum-queues, ref-shared-atomic
//!    [global] bs=512k iodepth=1 rw=randread time_based runtime=15 ... paths=2 mpath_policy=<case>
//!    ─► slat / clat / lat avg, IOPS, per-path I/O counts
//!  and, on the job CPU, each selector alone: select + on_submit + on_complete per I/O
//! ```
//!
//! The seed measured submission latency (fio's slat) because the path selector runs in
//! the submission path: 78.35 µs with the selector that sums every hardware queue's
//! in-flight count (64 queues), 32.51 µs with one shared atomic per controller; ftrace
//! put 46.1 µs vs 0.46 µs of that in `nvme_find_path`. Here the same difference shows
//! as each case's slat over numa's (numa's selection is one load), and the selectors'
//! own cost is measured alone in the same run.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use target::reactor::PollMode;
use target::registry::TcpCongestion;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::embedded_target::{self, Embedded, EmbeddedOptions};
use bench::engine::EngineRegistry;
use bench::engine::mpath::{MultipathStats, PolicyChoice, REF_QUEUES_DEFAULT};
use bench::engine::remote::Controllers;
use bench::job::JobFile;
use bench::report::Report;
use bench::run::{self, RunOptions, StatusMode};
use bench::stats::ThreadStat;
use bench::{Error, ErrorKind, Result};
use host::mpath::reference::{SharedAtomic, SumPerQueue};
use host::mpath::{Outcome, PathClass, PathState, Policy, Selection, Selector};

/// What the seed measured (fio 3.19, Linux 6.5, in-kernel NVMe/TCP target, 64 I/O queues).
pub mod seed {
    /// slat avg with the selector that sums every hardware queue, µs.
    pub const SLAT_SUM_US: f64 = 78.35;
    /// slat avg with one shared atomic per controller, µs.
    pub const SLAT_ATOMIC_US: f64 = 32.51;
    /// `nvme_find_path` per I/O with the summing selector, ns (ftrace).
    pub const FIND_PATH_SUM_NS: f64 = 46_146.8;
    /// `nvme_find_path` per I/O with the shared atomic, ns (ftrace).
    pub const FIND_PATH_ATOMIC_NS: f64 = 456.3;
    /// clat avg of both runs, µs (a 512 KiB read over a real NIC).
    pub const CLAT_US: [f64; 2] = [1958.35, 1992.77];
    /// IOPS of both runs.
    pub const IOPS: [f64; 2] = [490.0, 493.0];
}

/// The seed's job file, for the policy given by `{policy}` lines (`mpath_policy=...`).
const JOB: &str = "\
[global]
ioengine=libaio
randrepeat=1
direct=1
group_reporting
blocksize=512k
iodepth=1
numjobs=1
runtime={runtime}
time_based
rw=randread
paths=2

[JOB1]
{policy}
";

/// Arguments of `qpath lab seed-000`.
#[derive(Debug, Clone, clap::Args)]
pub struct Seed000Args {
    /// Seconds each case runs (the seed ran 15).
    #[arg(long, value_name = "SECONDS", default_value = "15", value_parser = crate::seconds_up_to::<3600>)]
    pub runtime: f64,
    /// Rounds: every case runs `runtime / rounds` seconds per round, cases interleaved,
    /// so drift in the machine's load spreads over all cases instead of favouring one.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Hardware queues per path the ref-sum-queues selector sums over (the seed's target gave 64).
    #[arg(long = "ref-queues", value_name = "N", default_value_t = REF_QUEUES_DEFAULT)]
    pub ref_queues: usize,
    /// How the embedded target's reactor waits: adaptive (spin 200 us, then sleep), busy or block.
    #[arg(long = "target-poll", value_name = "MODE", default_value = "adaptive", value_parser = crate::parse_poll)]
    pub target_poll: PollMode,
    /// Output: --json, --plot FILE, --no-plot, --output FILE.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Seed000Args {
    /// The defaults with `runtime` seconds per case.
    pub fn with_runtime(runtime: f64) -> Seed000Args {
        Seed000Args {
            runtime,
            rounds: 1,
            ref_queues: REF_QUEUES_DEFAULT,
            target_poll: PollMode::Adaptive,
            output: LabOutputArgs::default(),
        }
    }
}

/// The cases, in the order they run and print.
pub fn cases(ref_queues: usize) -> Vec<PolicyChoice> {
    vec![
        PolicyChoice::Policy(Policy::Numa),
        PolicyChoice::Policy(Policy::ROUND_ROBIN),
        PolicyChoice::Policy(Policy::QueueDepth),
        PolicyChoice::Policy(Policy::LATENCY),
        PolicyChoice::RefSumQueues { queues: ref_queues },
        PolicyChoice::RefSharedAtomic,
    ]
}

/// The `mpath_policy` lines for `choice`.
pub fn policy_lines(choice: &PolicyChoice) -> String {
    match choice {
        PolicyChoice::Policy(Policy::RoundRobin { rr_min_io }) => {
            format!("mpath_policy=round-robin\nrr_min_io={rr_min_io}")
        }
        PolicyChoice::RefSumQueues { queues } => format!("mpath_policy=ref-sum-queues\nmpath_ref_queues={queues}"),
        other => format!("mpath_policy={}", other.name()),
    }
}

/// The embedded target and the CPUs the labs use: reactor on CPU 0, jobs on the others.
pub struct LabTarget {
    /// The running target.
    pub target: Embedded,
    /// CPUs job threads run on (empty: unpinned, one CPU).
    pub job_cpus: Vec<usize>,
}

impl LabTarget {
    /// Starts the embedded target with one 1 GiB RAM namespace.
    pub fn start(poll: PollMode) -> Result<LabTarget> {
        let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
        let target = Embedded::start(EmbeddedOptions {
            poll,
            reactor_cpu,
            namespaces: vec![(1, embedded_target::NAMESPACE_BYTES_MIN)],
            tcp_congestion: TcpCongestion::System,
        })?;
        Ok(LabTarget { target, job_cpus })
    }

    /// Runs `text` (job sections without filenames) against the target, as `qpath bench`
    /// would, without printing fio's report; returns it.
    pub fn run(&self, text: &str, name: &str, diag: &mut dyn Write) -> Result<Report> {
        let mut file = JobFile::parse(text, name)?;
        file.check_strict()?;
        crate::place_jobs(&mut file, &self.job_cpus);
        let jobs = embedded_target::embedded_jobs(&file, false);
        self.target.redirect(&mut file, &jobs)?;
        let ctrls = Arc::new(Controllers::for_jobs(&file));
        let registry = EngineRegistry::with_all_engines(&ctrls);
        let opts = RunOptions { pin: Some(crate::pin_hook()), status: StatusMode::Never, ..RunOptions::default() };
        let result = run::run_jobs(&file, &registry, &opts, diag);
        drop(registry);
        ctrls.disconnect_all();
        Ok(Report::from_run(&file, &result?))
    }

    /// Stops the target.
    pub fn shutdown(self) {
        self.target.shutdown();
    }
}

/// One case's numbers over all its rounds: the reads of the run's only reported job.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's label (the policy's name).
    pub name: String,
    /// Every round's statistics, merged (latency means and histograms over all rounds).
    pub stat: ThreadStat,
    /// Seconds of I/O over all rounds (each round's longest job runtime).
    pub seconds: f64,
    /// The first error of a round (fio's `err=`; 0 = none).
    pub error: i32,
    /// Its message.
    pub error_message: String,
    /// Per-path counts over all rounds.
    pub multipath: Option<MultipathStats>,
    /// Rounds added.
    pub rounds: u32,
}

impl CaseResult {
    /// A case with no round yet.
    pub fn new(name: impl Into<String>) -> CaseResult {
        CaseResult {
            name: name.into(),
            stat: ThreadStat::default(),
            seconds: 0.0,
            error: 0,
            error_message: String::new(),
            multipath: None,
            rounds: 0,
        }
    }

    /// Adds a round: the numbers of `report`'s first (only) job.
    pub fn add(&mut self, report: &Report) -> Result<()> {
        let r = report.jobs.first().ok_or_else(|| Error::new(ErrorKind::Engine, "the run reported no job"))?;
        self.stat.merge(&r.stat);
        #[allow(clippy::cast_precision_loss)]
        let secs = r.stat.dirs.iter().map(|d| d.runtime_ms).max().unwrap_or(0) as f64 / 1000.0;
        self.seconds += secs;
        if self.error == 0 && r.error != 0 {
            self.error = r.error;
            self.error_message.clone_from(&r.verror);
        }
        if let Some(m) = &r.multipath {
            match &mut self.multipath {
                Some(all) => all.merge(m),
                None => self.multipath = Some(m.clone()),
            }
        }
        self.rounds += 1;
        Ok(())
    }

    fn reads(&self) -> &bench::stats::DirStats {
        &self.stat.dirs[0]
    }

    /// Mean submission latency of the reads, ns.
    pub fn slat_ns(&self) -> f64 {
        self.reads().slat.mean
    }

    /// Standard error of that mean, ns.
    pub fn slat_stderr_ns(&self) -> f64 {
        let s = &self.reads().slat;
        #[allow(clippy::cast_precision_loss)]
        let n = s.samples as f64;
        if n > 1.0 { (s.s / (n - 1.0) / n).sqrt() } else { f64::NAN }
    }

    /// Mean completion latency, ns.
    pub fn clat_ns(&self) -> f64 {
        self.reads().clat.mean
    }

    /// Mean total latency, ns.
    pub fn lat_ns(&self) -> f64 {
        self.reads().lat.mean
    }

    /// 99th percentile of completion latency, ns (0 without a histogram).
    pub fn clat_p99_ns(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let p =
            self.reads().clat_hist.as_ref().filter(|h| !h.is_empty()).map_or(0.0, |h| h.percentiles(&[99.0])[0] as f64);
        p
    }

    /// Reads issued (fio's `total_ios`).
    pub fn total_ios(&self) -> u64 {
        self.reads().total_ios
    }

    /// Reads per second over all rounds.
    pub fn iops(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let n = self.total_ios() as f64;
        if self.seconds > 0.0 { n / self.seconds } else { 0.0 }
    }

    /// Bytes per second over all rounds.
    pub fn bw_bytes(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let b = self.reads().io_bytes as f64;
        if self.seconds > 0.0 { b / self.seconds } else { 0.0 }
    }

    /// I/Os on path `i` (0 if there is no such path).
    pub fn path_ios(&self, i: usize) -> u64 {
        self.multipath.as_ref().and_then(|m| m.paths.get(i)).map_or(0, |p| p.ios)
    }

    /// The case as JSON for the lab's `cases` key.
    pub fn json(&self) -> serde_json::Value {
        let paths: Vec<serde_json::Value> = self
            .multipath
            .iter()
            .flat_map(|m| &m.paths)
            .map(|p| json!({"traddr": p.traddr, "ios": p.ios, "io_bytes": p.bytes}))
            .collect();
        json!({
            "policy": self.name,
            "rounds": self.rounds,
            "seconds": self.seconds,
            "slat_mean_ns": self.slat_ns(),
            "slat_mean_stderr_ns": finite(self.slat_stderr_ns()),
            "clat_mean_ns": self.clat_ns(),
            "lat_mean_ns": self.lat_ns(),
            "clat_p99_ns": self.clat_p99_ns(),
            "iops": self.iops(),
            "bw_bytes": self.bw_bytes(),
            "total_ios": self.total_ios(),
            "error": self.error,
            "error_message": self.error_message,
            "paths": paths,
        })
    }
}

/// Issue 4's goal for one queue-depth selection at 64 paths, ns.
pub const SELECT_GOAL_NS: f64 = 20.0;

/// Steps per timed chunk of the selection measurement, and chunks.
const SELECT_CHUNK: u32 = 4096;
const SELECT_CHUNKS: usize = 101;

/// One selector as the seed's job drives it (QD1: select, submit, complete), `paths`
/// optimized paths with 20 µs and 30 µs service times.
trait Step {
    fn step(&mut self, i: u32);
}

impl Step for Selector {
    #[inline(always)]
    fn step(&mut self, i: u32) {
        let Selection::Submit(p) = self.select() else { unreachable!("every path is usable") };
        self.on_submit(p);
        self.on_complete(p, 20_000 + u64::from(p.0 % 2) * 10_000 + u64::from(i & 7), Outcome::Done);
    }
}

struct Sum(SumPerQueue);

impl Step for Sum {
    #[inline(always)]
    fn step(&mut self, _i: u32) {
        let Selection::Submit(p) = self.0.select() else { unreachable!("every path is usable") };
        self.0.on_submit(p, 0);
        self.0.on_complete(p, 0);
    }
}

struct Atomic(SharedAtomic);

impl Step for Atomic {
    #[inline(always)]
    fn step(&mut self, _i: u32) {
        let Selection::Submit(p) = self.0.select() else { unreachable!("every path is usable") };
        self.0.on_submit(p);
        self.0.on_complete(p);
    }
}

/// Median ns per step over [`SELECT_CHUNKS`] timed chunks (a chunk that lost the core
/// to another process drops out as an outlier).
#[inline(never)]
fn median_step_ns(s: &mut impl Step) -> f64 {
    let mut per = Vec::with_capacity(SELECT_CHUNKS);
    for _ in 0..SELECT_CHUNKS {
        let t = Instant::now();
        for i in 0..SELECT_CHUNK {
            s.step(std::hint::black_box(i));
        }
        per.push(t.elapsed().as_secs_f64() * 1e9 / f64::from(SELECT_CHUNK));
    }
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

/// What one selection costs under `choice` (select + on_submit + on_complete), ns,
/// on this thread.
pub fn selection_ns(choice: &PolicyChoice, paths: usize) -> f64 {
    let classes = vec![PathClass::Optimized; paths];
    match *choice {
        PolicyChoice::Policy(policy) => {
            let mut sel = Selector::new(policy, 0);
            let states: Vec<PathState> = (0..paths).map(|i| PathState::new(i as u64, PathClass::Optimized)).collect();
            sel.set_paths(&states);
            median_step_ns(&mut sel)
        }
        PolicyChoice::RefSumQueues { queues } => median_step_ns(&mut Sum(SumPerQueue::new(&classes, queues))),
        PolicyChoice::RefSharedAtomic => median_step_ns(&mut Atomic(SharedAtomic::new(&classes))),
    }
}

/// [`selection_ns`] of every case, measured on a thread pinned to `cpu` (the job CPU).
fn selection_costs(cases: &[PolicyChoice], paths: usize, cpu: Option<usize>) -> Result<Vec<f64>> {
    let cases = cases.to_vec();
    std::thread::Builder::new()
        .name("qpath-select-cost".into())
        .spawn(move || {
            if let Some(c) = cpu {
                let _ = uring::pin_current_thread(c);
            }
            cases.iter().map(|c| selection_ns(c, paths)).collect()
        })
        .map_err(|e| Error::io("spawn the selection measurement", e))?
        .join()
        .map_err(|_| Error::new(ErrorKind::Engine, "the selection measurement panicked"))
}

/// A number for JSON; `null` when it is not finite (JSON has no NaN).
fn finite(v: f64) -> serde_json::Value {
    if v.is_finite() { json!(v) } else { serde_json::Value::Null }
}

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

/// The longest unreported warm-up run before the cases ([`run_rounds`]).
const WARMUP: Duration = Duration::from_millis(500);

/// Runs every case of `cases` for `runtime` in `rounds` interleaved rounds against
/// `lab`; `job(case)` is the case's job text with `{runtime}` left to fill in.
pub fn run_rounds(
    lab: &LabTarget,
    labels: &[String],
    jobs: &[String],
    runtime: Duration,
    rounds: u32,
    before: &mut dyn FnMut(usize),
    diag: &mut dyn Write,
) -> Result<Vec<CaseResult>> {
    let mut results: Vec<CaseResult> = labels.iter().map(CaseResult::new).collect();
    let slice = (runtime / rounds.max(1)).max(Duration::from_millis(1));
    // The first connect, the target's first touch of its RAM and cold caches would all
    // land on the first case: a short unreported run of it goes first.
    if let Some(job) = jobs.first() {
        before(0);
        let warm = slice.min(WARMUP);
        let _ = writeln!(diag, "qpath lab: warm-up: {} for {:.1} s (not reported)", labels[0], warm.as_secs_f64());
        lab.run(&job.replace("{runtime}", &format!("{}ms", warm.as_millis().max(1))), "warm-up", diag)?;
    }
    for round in 0..rounds.max(1) {
        for (i, job) in jobs.iter().enumerate() {
            before(i);
            let _ = writeln!(
                diag,
                "qpath lab: round {}/{rounds}: {} for {:.1} s",
                round + 1,
                labels[i],
                slice.as_secs_f64()
            );
            let text = job.replace("{runtime}", &format!("{}ms", slice.as_millis()));
            let report = lab.run(&text, &labels[i], diag)?;
            results[i].add(&report)?;
        }
    }
    Ok(results)
}

/// Runs the lab. Progress goes to `diag`.
pub fn run(args: &Seed000Args, diag: &mut dyn Write) -> Result<LabResult> {
    if args.ref_queues == 0 || args.ref_queues > bench::engine::mpath::REF_QUEUES_MAX {
        return Err(Error::new(
            ErrorKind::Option,
            format!("--ref-queues {}: 1..={}", args.ref_queues, bench::engine::mpath::REF_QUEUES_MAX),
        ));
    }
    let cases = cases(args.ref_queues);
    let labels: Vec<String> = cases.iter().map(PolicyChoice::name).collect();
    let jobs: Vec<String> = cases.iter().map(|c| JOB.replace("{policy}", &policy_lines(c))).collect();
    let lab = LabTarget::start(args.target_poll)?;
    let runtime = Duration::from_secs_f64(args.runtime);
    let results = run_rounds(&lab, &labels, &jobs, runtime, args.rounds, &mut |_| {}, diag);
    let target_desc = lab.target.describe();
    let addrs = lab.target.addrs();
    let job_cpu = lab.job_cpus.first().copied();
    lab.shutdown();
    let results = results?;
    let _ = writeln!(diag, "qpath lab seed-000: each selector alone (select + submit + complete), 2 and 64 paths");
    let select_ns = selection_costs(&cases, 2, job_cpu)?;
    let select_ns_64 = selection_costs(&cases, 64, job_cpu)?;
    Ok(build(args, &cases, &results, [&select_ns, &select_ns_64], &target_desc, addrs))
}

/// Runs the lab with progress on stderr and prints it as `args.output` asks.
pub fn lab(args: &Seed000Args) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// Cases of a seed-000 or mpath-delay result that ended with an I/O error.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(serde_json::Value::Array(cases)) = r.extra.get("cases") else { return 0 };
    cases.iter().filter(|c| c["error"].as_i64().unwrap_or(0) != 0).map(|_| 1).sum()
}

/// The 95% confidence half-width of the difference of two cases' mean slat, ns.
fn diff_ci95_ns(a: &CaseResult, b: &CaseResult) -> f64 {
    1.96 * (a.slat_stderr_ns().powi(2) + b.slat_stderr_ns().powi(2)).sqrt()
}

fn build(
    args: &Seed000Args,
    cases: &[PolicyChoice],
    results: &[CaseResult],
    [select_ns, select_ns_64]: [&[f64]; 2],
    target_desc: &str,
    addrs: [std::net::SocketAddr; 2],
) -> LabResult {
    let mut r = LabResult::new(
        "seed-000",
        "512 KiB random reads at QD1 over 2 paths: submission latency under each path selector",
    );
    r.note(format!(
        "seed: fio libaio, bs=512k iodepth=1 rw=randread 15 s on CPU 1 of an 80-core host, Linux 6.5 multipath over \
         the in-kernel NVMe/TCP target with 64 I/O queues; here: the same job through the qpath engine over the \
         embedded target's 2 loopback ports ({} = path 1, {} = path 2) as one multipath head, {:.1} s per case in {} \
         interleaved round(s) after a short unreported warm-up",
        addrs[0], addrs[1], args.runtime, args.rounds
    ));
    r.note(format!("{target_desc}; job thread pinned to the other CPU, as the seed's cpus_allowed=1"));
    r.note(format!(
        "scaled to this 2-core machine: one job thread owns one queue per path (no 64 CPUs to give 64 queues), so \
         ref-sum-queues sums {} per-queue counters per path at each I/O, as the seed's selector summed its 64 hctxs; \
         the references are shared (atomics) like the kernel's, qpath's policies are per thread; at QD1 every path's \
         count is 0 when a reference selects, so the references (like Linux's queue-depth) always pick path 1, while \
         qpath's queue-depth breaks ties in turn",
        args.ref_queues
    ));
    r.columns(&[
        "policy",
        "select ns",
        "select ns 64 paths",
        "slat avg us",
        "slat - numa ns",
        "+/- ns (95%)",
        "clat avg us",
        "lat avg us",
        "IOPS",
        "MiB/s",
        "path 1 ios",
        "path 2 ios",
        "errors",
    ]);
    let Some(numa) = results.first() else { return r };
    for ((c, ns), ns64) in results.iter().zip(select_ns).zip(select_ns_64) {
        #[allow(clippy::cast_precision_loss)]
        r.row(vec![
            Cell::text(c.name.clone()),
            Cell::num(*ns, "ns"),
            Cell::num(*ns64, "ns"),
            Cell::num(us(c.slat_ns()), "us"),
            Cell::num(c.slat_ns() - numa.slat_ns(), "ns"),
            Cell::num(diff_ci95_ns(c, numa), "ns"),
            Cell::num(us(c.clat_ns()), "us"),
            Cell::num(us(c.lat_ns()), "us"),
            Cell::num(c.iops(), "IOPS"),
            Cell::num(c.bw_bytes() / f64::from(1u32 << 20), "MiB/s"),
            Cell::num(c.path_ios(0) as f64, "ios"),
            Cell::num(c.path_ios(1) as f64, "ios"),
            Cell::num(f64::from(u8::from(c.error != 0)), ""),
        ]);
    }
    let find = |name: &str| cases.iter().position(|c| c.name().starts_with(name));
    let (qd, lat, sum, atomic) =
        (find("queue-depth"), find("latency"), find("ref-sum-queues"), find("ref-shared-atomic"));
    if let (Some(qd), Some(lat), Some(sum), Some(atomic)) = (qd, lat, sum, atomic) {
        let (q, l, s, a) = (&results[qd], &results[lat], &results[sum], &results[atomic]);
        r.note(format!(
            "seed 000 measured slat {:.2} us (summing) vs {:.2} us (atomic): {:.1} us per I/O in nvme_find_path vs \
             {:.2} us; here slat is {:.2} us (ref-sum-queues) vs {:.2} us (ref-shared-atomic), {:+.0} +/- {:.0} ns \
             apart; the selectors alone cost {:.1} ns (ref-sum-queues) and {:.1} ns (ref-shared-atomic) per I/O at 2 \
             paths, queue-depth {:.1} ns and latency {:.1} ns ({:.1}, {:.1}, {:.1} and {:.1} ns at 64 paths)",
            seed::SLAT_SUM_US,
            seed::SLAT_ATOMIC_US,
            seed::FIND_PATH_SUM_NS / 1000.0,
            seed::FIND_PATH_ATOMIC_NS / 1000.0,
            us(s.slat_ns()),
            us(a.slat_ns()),
            s.slat_ns() - a.slat_ns(),
            diff_ci95_ns(s, a),
            select_ns[sum],
            select_ns[atomic],
            select_ns[qd],
            select_ns[lat],
            select_ns_64[sum],
            select_ns_64[atomic],
            select_ns_64[qd],
            select_ns_64[lat],
        ));
        r.note(format!(
            "what it means: a policy's selection cost shows as its slat minus numa's (numa's selection is one load): \
             queue-depth {:+.0} +/- {:.0} ns, latency {:+.0} +/- {:.0} ns (95% intervals), against the seed's 46 us \
             (summing) and 0.46 us (atomic) in nvme_find_path; a difference inside its interval is noise (slat here \
             is the engine's whole submission, a few us that vary with the machine's load), so the selector-alone \
             columns are the precise figure (criterion at 2/8/64 paths and 2 threads: BENCHMARKS.md)",
            q.slat_ns() - numa.slat_ns(),
            diff_ci95_ns(q, numa),
            l.slat_ns() - numa.slat_ns(),
            diff_ci95_ns(l, numa),
        ));
        r.note(format!(
            "clat here ({:.0} us) is a loopback copy of 512 KiB, not the seed's NIC ({:.0} us): only slat and the \
             selection cost compare across machines",
            us(q.clat_ns()),
            seed::CLAT_US[0]
        ));
        // Each goal's value is an upper bound where noise could flatter it: the slat
        // difference with its 95% half-width added.
        r.goal(Goal::at_most(
            "queue-depth selection alone (ns) / seed's atomic nvme_find_path (ns)",
            select_ns[qd],
            seed::FIND_PATH_ATOMIC_NS,
            1.0,
        ));
        r.goal(Goal::at_most(
            "queue-depth selection alone at 64 paths (ns) / the 20 ns goal",
            select_ns_64[qd],
            SELECT_GOAL_NS,
            1.0,
        ));
        r.goal(Goal::at_most(
            "queue-depth selection / ref-shared-atomic selection",
            select_ns[qd],
            select_ns[atomic],
            1.0,
        ));
        r.goal(Goal::at_most("queue-depth selection / ref-sum-queues selection", select_ns[qd], select_ns[sum], 1.0));
        r.goal(Goal::at_most(
            "queue-depth slat - numa slat + 95% half-width (ns) / seed's atomic nvme_find_path (ns)",
            q.slat_ns() - numa.slat_ns() + diff_ci95_ns(q, numa),
            seed::FIND_PATH_ATOMIC_NS,
            1.0,
        ));
        r.goal(Goal::at_most(
            "latency slat - numa slat + 95% half-width (ns) / seed's atomic nvme_find_path (ns)",
            l.slat_ns() - numa.slat_ns() + diff_ci95_ns(l, numa),
            seed::FIND_PATH_ATOMIC_NS,
            1.0,
        ));
    }
    let names: Vec<String> = results.iter().map(|c| c.name.clone()).collect();
    let groups: Vec<&str> = names.iter().map(String::as_str).collect();
    r.bars("slat avg (us)", &groups, vec![("slat avg".into(), results.iter().map(|c| us(c.slat_ns())).collect())]);
    r.extra.insert(
        "cases".into(),
        serde_json::Value::Array(
            results
                .iter()
                .zip(select_ns.iter().zip(select_ns_64))
                .map(|(c, (ns, ns64))| {
                    let mut v = c.json();
                    v["selection_ns"] = finite(*ns);
                    v["selection_ns_64_paths"] = finite(*ns64);
                    v
                })
                .collect(),
        ),
    );
    r.extra.insert(
        "seed".into(),
        json!({
            "slat_mean_us": {"sum_per_queue": seed::SLAT_SUM_US, "shared_atomic": seed::SLAT_ATOMIC_US},
            "find_path_ns": {"sum_per_queue": seed::FIND_PATH_SUM_NS, "shared_atomic": seed::FIND_PATH_ATOMIC_NS},
            "clat_mean_us": seed::CLAT_US,
            "iops": seed::IOPS,
        }),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_has_job_lines_that_parse() {
        for c in cases(64) {
            let text = JOB.replace("{runtime}", "1").replace("{policy}", &policy_lines(&c));
            assert!(text.contains("runtime=1\n"), "the runtime placeholder is filled");
            let f = JobFile::parse(&text, "t").unwrap();
            f.check_strict().unwrap();
            assert_eq!(bench::engine::mpath::policy_of(&f.jobs[0]).unwrap(), Some(c), "{}", c.name());
            assert_eq!(bench::engine::mpath::paths_of(&f.jobs[0]).unwrap(), Some(2));
        }
    }

    #[test]
    fn selection_is_measured_for_every_case() {
        for c in cases(4) {
            let ns = selection_ns(&c, 2);
            assert!(ns.is_finite() && ns > 0.0, "{}: {ns}", c.name());
        }
    }
}
