//! `qpath lab fairness`: a QD1 queue next to a flooded queue on the same target reactor
//! (issue 6, acceptance 2; seed 002's rx/tx fairness and TX deadline).
//!
//! ```text
//!   one host context (CPU 1):  QD1 4k reads on controller A ─┐   ┌─ flood: QD64 4k reads on controller B
//!                                                            ▼   ▼
//!   embedded target, one reactor (CPU 0, busy poll): A's I/O queue and B's I/O queue
//! ```
//!
//! Each case starts a fresh target with its fairness options, measures QD1 read latency
//! alone, then again while the flood runs, and reads the target's per-queue fairness
//! counters. The goal: the QD1 p99 under the flood within 2x of its p99 alone, with the
//! default options; the case without budgets (`unlimited`) is the before.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use serde_json::{Value, json};
use target::config::Config;
use target::reactor::PollMode;
use target::registry::TargetOptions;
use target::stats::QueueStatsSnapshot;
use uring::{IoBuf, Wait};

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::{Error, ErrorKind, Result};

/// Block size of both jobs.
const BS: u32 = 4096;
/// Blocks the flood walks over (64 MiB).
const FLOOD_BLOCKS: u64 = (64 << 20) / BS as u64;
/// Most reads the flood may keep outstanding.
const FLOOD_QD_MAX: u32 = 512;
/// Token of the QD1 read; the flood's are `FLOOD_TOKEN + n`.
const QD1_TOKEN: u64 = 1;
const FLOOD_TOKEN: u64 = 1 << 32;
/// How long the outstanding I/O may take to drain after a phase.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The goal: QD1 p99 under the flood / alone.
pub const GOAL_RATIO: f64 = 2.0;

/// Arguments of `qpath lab fairness`.
#[derive(Debug, Clone, clap::Args)]
pub struct FairnessArgs {
    /// Seconds of each phase (QD1 alone, QD1 under the flood) of each case.
    #[arg(long, default_value = "3", value_parser = crate::seconds_up_to::<600>)]
    pub runtime: f64,
    /// Reads the flooded queue keeps outstanding.
    #[arg(long = "flood-iodepth", default_value_t = 64)]
    pub flood_iodepth: u32,
    /// Adds a third case, `custom`, with this `rx_budget_pdus` (0 = no budget); the
    /// other two custom options default to the target's defaults.
    #[arg(long = "rx-budget-pdus")]
    pub rx_budget_pdus: Option<u32>,
    /// Adds the `custom` case with this `tx_batch_bytes` (0 = no limit).
    #[arg(long = "tx-batch-bytes")]
    pub tx_batch_bytes: Option<usize>,
    /// Adds the `custom` case with this `tx_deadline_us` (0 = none).
    #[arg(long = "tx-deadline-us")]
    pub tx_deadline_us: Option<u64>,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for FairnessArgs {
    fn default() -> Self {
        FairnessArgs {
            runtime: 3.0,
            flood_iodepth: 64,
            rx_budget_pdus: None,
            tx_batch_bytes: None,
            tx_deadline_us: None,
            output: LabOutputArgs::default(),
        }
    }
}

/// The target's fairness options of one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// `rx_budget_pdus`.
    pub rx_budget_pdus: u32,
    /// `tx_batch_bytes`.
    pub tx_batch_bytes: usize,
    /// `tx_deadline_us`.
    pub tx_deadline_us: u64,
}

impl Budgets {
    /// The target's defaults.
    pub fn defaults() -> Budgets {
        let o = TargetOptions::default();
        Budgets { rx_budget_pdus: o.rx_budget_pdus, tx_batch_bytes: o.tx_batch_bytes, tx_deadline_us: o.tx_deadline_us }
    }

    /// No budget, no batch limit, no deadline: every connection's input is parsed and
    /// sent whole each turn (the reactor before fairness).
    pub fn unlimited() -> Budgets {
        Budgets { rx_budget_pdus: 0, tx_batch_bytes: 0, tx_deadline_us: 0 }
    }

    fn apply(self, o: &mut TargetOptions) {
        o.rx_budget_pdus = self.rx_budget_pdus;
        o.tx_batch_bytes = self.tx_batch_bytes;
        o.tx_deadline_us = self.tx_deadline_us;
    }
}

/// One phase's outcome for one job.
#[derive(Debug, Clone)]
pub struct JobStats {
    /// Completed reads.
    pub ios: u64,
    /// Reads that failed or could not be submitted.
    pub errors: u64,
    /// Reads still outstanding when the drain timed out.
    pub undrained: u64,
    /// Completion latencies, ns.
    pub latency: Histogram<u64>,
}

impl JobStats {
    fn new() -> JobStats {
        JobStats { ios: 0, errors: 0, undrained: 0, latency: Histogram::new(3).expect("3 significant digits") }
    }

    /// Latency percentile `q` (0..1), µs.
    pub fn p_us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1e3
    }
}

/// One case: QD1 alone, then QD1 next to the flood, on a fresh target.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Case name.
    pub name: &'static str,
    /// The target's options.
    pub budgets: Budgets,
    /// QD1 alone.
    pub alone: JobStats,
    /// QD1 while the flood runs.
    pub qd1: JobStats,
    /// The flood.
    pub flood: JobStats,
    /// Seconds each phase ran.
    pub secs: f64,
    /// The target's counters of the QD1 queue and of the flooded queue, after the run.
    pub qd1_queue: QueueStatsSnapshot,
    /// See `qd1_queue`.
    pub flood_queue: QueueStatsSnapshot,
    /// The target's mean service time of the QD1 queue's commands (receive reaped to
    /// response queued), µs: alone, and with the flood. What the reactor adds, against
    /// what the host and the wire add.
    pub qd1_target_us: [f64; 2],
}

impl CaseResult {
    /// QD1 p99 under the flood / alone.
    pub fn ratio_p99(&self) -> f64 {
        self.qd1.p_us(0.99) / self.alone.p_us(0.99)
    }

    /// Errors and undrained reads of every job.
    pub fn errors(&self) -> u64 {
        [&self.alone, &self.qd1, &self.flood].iter().map(|j| j.errors + j.undrained).sum()
    }
}

fn target_config(budgets: Budgets, reactor_cpu: Option<usize>) -> Config {
    // Both queues on one reactor, busy-polling: the latency alone is the wire's, so what
    // the flood adds is the reactor's work for the other queue.
    let mut cfg = crate::one_reactor_target(reactor_cpu, PollMode::Busy);
    budgets.apply(&mut cfg.options);
    cfg
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("fairness: {what}: {e}"))
}

/// Runs one case: a fresh target with `budgets`, two controllers of one I/O queue each
/// (both on its one reactor), QD1 alone for `runtime`, then QD1 and a flood of
/// `flood_iodepth` reads for `runtime`.
pub fn run_case(name: &'static str, budgets: Budgets, runtime: Duration, flood_iodepth: u32) -> Result<CaseResult> {
    if flood_iodepth == 0 || flood_iodepth > FLOOD_QD_MAX {
        return Err(Error::new(ErrorKind::Option, format!("--flood-iodepth {flood_iodepth}: 1..={FLOOD_QD_MAX}")));
    }
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let server = target_config(budgets, reactor_cpu).start().map_err(|e| err("target", e))?;
    let result = (|| {
        let addr = server.local_addr(1).ok_or_else(|| err("target", "no port 1"))?;
        let connect = || {
            let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
            o.nr_io_queues = 1;
            Controller::connect(o).map_err(|e| err("connect", e))
        };
        let (a, b) = (connect()?, connect()?);
        let mut ctx = Context::new(ContextOptions { cpu: job_cpus.first().copied(), ..ContextOptions::default() })
            .map_err(|e| err("context", e))?;
        let qd1 = ctx.open(&a, Nsid(1)).map_err(|e| err("open", e))?;
        let flood = ctx.open(&b, Nsid(1)).map_err(|e| err("open", e))?;
        let queue = |c: &Controller| {
            server
                .state
                .queues()
                .into_iter()
                .find(|q| q.cntlid == c.cntlid().0 && q.qid == 1)
                .map(|q| q.stats)
                .unwrap_or_default()
        };
        let mut jobs = Jobs { ctx, qd1, flood };
        let before = queue(&a);
        let (alone, _) = jobs.phase(runtime, 0);
        let between = queue(&a);
        let (qd1_stats, flood_stats) = jobs.phase(runtime, flood_iodepth);
        drop(jobs);
        let (qd1_queue, flood_queue) = (queue(&a), queue(&b));
        let qd1_target_us = [service_us(&before, &between), service_us(&between, &qd1_queue)];
        a.delete();
        b.delete();
        Ok(CaseResult {
            name,
            budgets,
            alone,
            qd1: qd1_stats,
            flood: flood_stats,
            secs: runtime.as_secs_f64(),
            qd1_queue,
            flood_queue,
            qd1_target_us,
        })
    })();
    server.shutdown();
    result
}

/// The mean service time in µs of the commands a queue completed between two snapshots.
fn service_us(from: &QueueStatsSnapshot, to: &QueueStatsSnapshot) -> f64 {
    let done = |s: &QueueStatsSnapshot| s.commands.saturating_sub(s.outstanding);
    let n = done(to).saturating_sub(done(from));
    if n == 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let us = to.latency_ns_sum.saturating_sub(from.latency_ns_sum) as f64 / n as f64 / 1e3;
    us
}

struct Jobs {
    ctx: Context,
    qd1: DeviceId,
    flood: DeviceId,
}

impl Jobs {
    /// QD1 reads for `runtime`, next to `flood_qd` closed-loop reads (0 = none); then
    /// drains. Returns the QD1 and flood statistics.
    fn phase(&mut self, runtime: Duration, flood_qd: u32) -> (JobStats, JobStats) {
        let (mut q, mut f) = (JobStats::new(), JobStats::new());
        let mut outstanding = 0u64;
        let mut flood_n = 0u64;
        let t0 = Instant::now();
        let submit = |ctx: &mut Context, dev: DeviceId, token: u64, offset: u64, buf: Option<IoBuf>| {
            let buf = buf.unwrap_or_else(|| IoBuf::new(BS as usize));
            ctx.submit(dev, Op::Read, offset, BS, Some(buf), token).is_ok()
        };
        for _ in 0..flood_qd {
            flood_n += 1;
            if submit(&mut self.ctx, self.flood, FLOOD_TOKEN + flood_n, (flood_n % FLOOD_BLOCKS) * u64::from(BS), None)
            {
                outstanding += 1;
            } else {
                f.errors += 1;
            }
        }
        if submit(&mut self.ctx, self.qd1, QD1_TOKEN, 0, None) {
            outstanding += 1;
        } else {
            q.errors += 1;
        }
        let mut running = true;
        let deadline = t0 + runtime + DRAIN_TIMEOUT;
        while outstanding > 0 && Instant::now() < deadline {
            running = running && t0.elapsed() < runtime;
            if self.ctx.poll(Wait::Poll).is_err() {
                break;
            }
            let done: Vec<_> = self.ctx.completions().collect();
            for c in done {
                outstanding -= 1;
                let job = if c.token == QD1_TOKEN { &mut q } else { &mut f };
                if c.status.is_success() {
                    job.ios += 1;
                    let _ = job.latency.record(c.latency_ns.max(1));
                } else {
                    job.errors += 1;
                }
                if !running {
                    continue;
                }
                let again = if c.token == QD1_TOKEN {
                    submit(&mut self.ctx, self.qd1, QD1_TOKEN, 0, c.buf)
                } else {
                    flood_n += 1;
                    let offset = (flood_n % FLOOD_BLOCKS) * u64::from(BS);
                    submit(&mut self.ctx, self.flood, FLOOD_TOKEN + flood_n, offset, c.buf)
                };
                if again {
                    outstanding += 1;
                } else if c.token == QD1_TOKEN {
                    q.errors += 1;
                } else {
                    f.errors += 1;
                }
            }
        }
        // What did not drain counts against the flood (the QD1 job has at most one).
        f.undrained += outstanding;
        (q, f)
    }
}

/// The cases of a run: the reactor without budgets (before), then with the defaults.
pub fn cases() -> [(&'static str, Budgets); 2] {
    [("unlimited", Budgets::unlimited()), ("defaults", Budgets::defaults())]
}

impl FairnessArgs {
    /// The `custom` case's options, when any of its flags is given.
    pub fn custom(&self) -> Option<Budgets> {
        if self.rx_budget_pdus.is_none() && self.tx_batch_bytes.is_none() && self.tx_deadline_us.is_none() {
            return None;
        }
        let d = Budgets::defaults();
        Some(Budgets {
            rx_budget_pdus: self.rx_budget_pdus.unwrap_or(d.rx_budget_pdus),
            tx_batch_bytes: self.tx_batch_bytes.unwrap_or(d.tx_batch_bytes),
            tx_deadline_us: self.tx_deadline_us.unwrap_or(d.tx_deadline_us),
        })
    }
}

/// Runs every case; progress lines go to `progress`.
pub fn run(args: &FairnessArgs, progress: &mut dyn std::io::Write) -> Result<LabResult> {
    let runtime = Duration::from_secs_f64(args.runtime);
    let mut results = Vec::new();
    let custom = args.custom().map(|b| ("custom", b));
    for (name, budgets) in cases().into_iter().chain(custom) {
        let _ =
            writeln!(progress, "fairness: {name} ({:.1} s alone, {:.1} s with the flood)", args.runtime, args.runtime);
        results.push(run_case(name, budgets, runtime, args.flood_iodepth)?);
    }
    Ok(report(args, &results))
}

fn budget_label(b: Budgets) -> String {
    let n = |v: u64, unit: &str| if v == 0 { "-".to_string() } else { format!("{v}{unit}") };
    format!(
        "rx {} / tx {} / deadline {}",
        n(u64::from(b.rx_budget_pdus), " PDUs"),
        n(b.tx_batch_bytes as u64 / 1024, " KiB"),
        n(b.tx_deadline_us, " us")
    )
}

fn report(args: &FairnessArgs, results: &[CaseResult]) -> LabResult {
    let mut r = LabResult::new("fairness", "a QD1 queue next to a flooded queue on one target reactor");
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    r.note(format!(
        "4k reads, QD1 (block 0 again and again) on one controller's I/O queue, \
         QD{} (64 MiB in order) on another's, \
         both queues on the target's one reactor (busy poll, CPU {}); one host context (CPU {}) drives both. Each \
         case: a fresh target, {:.1} s of QD1 alone, then {:.1} s of QD1 with the flood.",
        args.flood_iodepth,
        reactor_cpu.map_or_else(|| "unpinned".into(), |c| c.to_string()),
        job_cpus.first().map_or_else(|| "unpinned".into(), ToString::to_string),
        args.runtime,
        args.runtime,
    ));
    r.note(
        "unlimited: no PDU budget, no send batch limit, no deadline (the reactor before fairness); defaults: \
         the target's default budgets (rx_budget_pdus, tx_batch_bytes, tx_deadline_us); custom (when asked): the \
         --rx-budget-pdus/--tx-batch-bytes/--tx-deadline-us given.",
    );
    r.columns(&[
        "case",
        "target options",
        "QD1 p50 alone",
        "QD1 p99 alone",
        "QD1 p50 flood",
        "QD1 p99 flood",
        "p99 flood / alone",
        "QD1 target mean alone",
        "QD1 target mean flood",
        "flood IOPS",
        "errors",
    ]);
    for c in results {
        r.row(vec![
            Cell::text(c.name),
            Cell::text(budget_label(c.budgets)),
            Cell::num(c.alone.p_us(0.5), "us"),
            Cell::num(c.alone.p_us(0.99), "us"),
            Cell::num(c.qd1.p_us(0.5), "us"),
            Cell::num(c.qd1.p_us(0.99), "us"),
            Cell::num(c.ratio_p99(), ""),
            Cell::num(c.qd1_target_us[0], "us"),
            Cell::num(c.qd1_target_us[1], "us"),
            Cell::num(c.flood.ios as f64 / c.secs, "IOPS"),
            Cell::num(c.errors() as f64, ""),
        ]);
    }
    for c in results {
        let what = format!("QD1 p99 with a QD{} flood / alone, {}", args.flood_iodepth, c.name);
        if c.name == "defaults" {
            r.goal(Goal::at_most(what, c.qd1.p_us(0.99), c.alone.p_us(0.99), GOAL_RATIO));
        }
    }
    let groups: Vec<&str> = results.iter().map(|c| c.name).collect();
    r.bars(
        "QD1 p99 read latency, us",
        &groups,
        vec![
            ("alone".into(), results.iter().map(|c| c.alone.p_us(0.99)).collect()),
            ("with the flood".into(), results.iter().map(|c| c.qd1.p_us(0.99)).collect()),
        ],
    );
    let job = |j: &JobStats, secs: f64| {
        json!({
            "ios": j.ios, "iops": j.ios as f64 / secs, "errors": j.errors, "undrained": j.undrained,
            "lat_us": { "p50": j.p_us(0.5), "p90": j.p_us(0.9), "p99": j.p_us(0.99), "p99.9": j.p_us(0.999),
                        "max": j.latency.max() as f64 / 1e3 },
        })
    };
    let cases: Vec<Value> = results
        .iter()
        .map(|c| {
            json!({
                "case": c.name,
                "rx_budget_pdus": c.budgets.rx_budget_pdus,
                "tx_batch_bytes": c.budgets.tx_batch_bytes,
                "tx_deadline_us": c.budgets.tx_deadline_us,
                "qd1_alone": job(&c.alone, c.secs),
                "qd1_flood": job(&c.qd1, c.secs),
                "flood": job(&c.flood, c.secs),
                "p99_ratio": c.ratio_p99(),
                "target_qd1_queue": c.qd1_queue,
                "qd1_target_mean_us": { "alone": c.qd1_target_us[0], "flood": c.qd1_target_us[1] },
                "target_flood_queue": c.flood_queue,
            })
        })
        .collect();
    r.extra.insert("cases".into(), Value::Array(cases));
    r
}

/// `qpath lab fairness`: runs, prints, and returns the result.
pub fn lab(args: &FairnessArgs) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// Errors (failed, refused or undrained reads) over every case of a result.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(cases)) = r.extra.get("cases") else { return 0 };
    cases
        .iter()
        .flat_map(|c| [&c["qd1_alone"], &c["qd1_flood"], &c["flood"]])
        .map(|j| j["errors"].as_u64().unwrap_or(0) + j["undrained"].as_u64().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_time_between_snapshots_is_the_mean_of_the_commands_in_between() {
        let snap = |commands, latency_ns_sum| QueueStatsSnapshot { commands, latency_ns_sum, ..Default::default() };
        // 10 commands at 100 ns, then 10 more at 310 ns: the second window's mean is 310 ns.
        let (a, b) = (snap(10, 1_000), snap(20, 4_100));
        assert!((service_us(&a, &b) - 0.31).abs() < 1e-9, "{}", service_us(&a, &b));
        assert!((service_us(&snap(0, 0), &a) - 0.1).abs() < 1e-9);
        assert_eq!(service_us(&b, &b), 0.0, "no command, no mean");
    }

    #[test]
    fn the_cases_are_before_and_after() {
        let [(n0, before), (n1, after)] = cases();
        assert_eq!((n0, n1), ("unlimited", "defaults"));
        assert_eq!(before, Budgets { rx_budget_pdus: 0, tx_batch_bytes: 0, tx_deadline_us: 0 });
        assert!(after.rx_budget_pdus > 0 && after.tx_batch_bytes > 0 && after.tx_deadline_us > 0, "{after:?}");
        let cfg = target_config(after, Some(0));
        assert_eq!(cfg.reactor.reactors, 1, "both queues on one reactor");
        assert_eq!(cfg.options.rx_budget_pdus, after.rx_budget_pdus);
    }

    #[test]
    fn labels_name_unlimited_as_dashes() {
        assert_eq!(budget_label(Budgets::unlimited()), "rx - / tx - / deadline -");
        let b = Budgets { rx_budget_pdus: 16, tx_batch_bytes: 64 * 1024, tx_deadline_us: 50 };
        assert_eq!(budget_label(b), "rx 16 PDUs / tx 64 KiB / deadline 50 us");
    }

    #[test]
    fn flood_depth_is_bounded() {
        assert!(run_case("x", Budgets::defaults(), Duration::from_millis(1), 0).is_err());
        assert!(run_case("x", Budgets::defaults(), Duration::from_millis(1), FLOOD_QD_MAX + 1).is_err());
    }
}
