//! `qpath lab seed-002`: aggregate 4k bandwidth as the subsystem count grows.
//!
//! The seed (nvme-tcp scalability series, 2024): fio's `tiobench-example.fio` (4k
//! sequential and random writes, then reads, 4 jobs per step, each step after the
//! previous one) on a 96-core host against one, two and four subsystems of two paths
//! with 32 queues each. Linux's write bandwidth fell from 523 MiB/s with one subsystem
//! to 409 MiB/s with four (0.78×), with spurious I/O errors and resets under load
//! from workqueue and socket-callback lock contention.
//!
//! ```text
//!   per configuration (1, 2, 4 subsystems), one fresh target and host:
//!   phase = seq write ─► rand write ─► seq read ─► rand read   (stonewalled, like tiobench)
//!     job thread j (of --jobs, spread evenly over the subsystems)
//!       Context: a multipath head of its subsystem ── queue on path A ─┐
//!                                                  └─ queue on path B ─┤ loopback NVMe/TCP
//!   target: S subsystems x 1 RAM namespace, exposed on ports A and B ◄─┘ (one reactor)
//!   after the run: the host's statistics (host::stats) give I/O errors, reconnects,
//!   failed queues; fio's group bandwidth gives MiB/s per phase
//! ```
//!
//! Every configuration runs the same number of job threads, so the comparison asks
//! what the seed asks: does spreading the same load over more controllers and queues
//! cost throughput?

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use target::config::{Config, SizeValue};
use target::reactor::{PollMode, ReactorOptions};
use target::registry::TcpCongestion;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::engine::EngineRegistry;
use bench::engine::remote::Controllers;
use bench::job::JobFile;
use bench::report::{Report, group_stats};
use bench::run::{self, RunOptions, StatusMode};
use bench::{Error, ErrorKind, Result};

/// The seed's subsystem counts.
pub const SUBSYSTEMS: [usize; 3] = [1, 2, 4];
/// Paths per subsystem (the target's two ports).
pub const PATHS: usize = 2;
/// tiobench's steps in its order: (label, fio `rw=`).
pub const PHASES: [(&str, &str); 4] =
    [("seq write", "write"), ("rand write", "randwrite"), ("seq read", "read"), ("rand read", "randread")];
/// The seed's write bandwidth, 4k sequential, baseline kernel: one and four subsystems (MiB/s).
pub const SEED_SEQ_WRITE_MIBS: (f64, f64) = (523.0, 409.0);
/// Most job threads per phase.
pub const JOBS_MAX: u32 = 64;
/// Most rounds.
pub const ROUNDS_MAX: u32 = 20;
/// Each subsystem's namespace (RAM, pre-faulted unless `--lazy-ram`): what the jobs of one
/// subsystem cover.
const NS_BYTES: u64 = 256 << 20;
const NQN_PREFIX: &str = "nqn.2026-11.io.qpath:seed-002-";
const MIB: f64 = 1024.0 * 1024.0;

fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: a number of seconds in [0.1, 600]")),
    }
}

/// Arguments of `qpath lab seed-002`.
#[derive(Debug, Clone, clap::Args)]
pub struct Seed002Args {
    /// Seconds each phase runs (tiobench's timeout=60; 4 phases x 3 configurations).
    #[arg(long, default_value = "5", value_parser = parse_seconds)]
    pub runtime: f64,
    /// A short run for smoke tests: 0.5 s per phase, one round.
    #[arg(long)]
    pub quick: bool,
    /// Rounds: the three configurations run in turn this many times; each reports its
    /// round with the median all-steps bandwidth (a shared machine's load comes and goes).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Job threads per phase in every configuration, spread evenly over the subsystems
    /// (a multiple of 4; tiobench runs 4 per step on one device).
    #[arg(long, default_value_t = 8)]
    pub jobs: u32,
    /// I/Os each job keeps outstanding (tiobench's psync jobs: 1).
    #[arg(long, default_value_t = 1)]
    pub iodepth: u32,
    /// The multipath heads' path policy (the qpath engine's `mpath_policy`).
    #[arg(long, default_value = "round-robin")]
    pub policy: String,
    /// How the target's reactor waits: adaptive (spin, then sleep), busy or block.
    #[arg(long = "target-poll", value_name = "MODE", default_value = "adaptive", value_parser = crate::parse_poll)]
    pub target_poll: PollMode,
    /// TCP congestion control of the target's and the host's connections: system
    /// (default), reno, cubic, bbr or dctcp. BBR's pacing makes the runs noisier here.
    #[arg(long = "tcp-congestion", value_name = "NAME", default_value = "system")]
    pub tcp_congestion: TcpCongestion,
    /// Map the RAM namespaces lazily, so the first write to each page pays a page fault and
    /// zeroing on the target's core. By default they are pre-faulted: every job starts at
    /// offset 0 of its subsystem's namespace, so four subsystems touch four times the pages
    /// one does, and the comparison would measure first-touch faults, not controllers.
    #[arg(long)]
    pub lazy_ram: bool,
    /// Back the RAM namespaces with transparent huge pages (best effort).
    #[arg(long)]
    pub huge_pages: bool,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for Seed002Args {
    fn default() -> Self {
        Seed002Args {
            runtime: 5.0,
            quick: false,
            rounds: 3,
            jobs: 8,
            iodepth: 1,
            policy: "round-robin".into(),
            target_poll: PollMode::Adaptive,
            tcp_congestion: TcpCongestion::System,
            lazy_ram: false,
            huge_pages: false,
            output: LabOutputArgs::default(),
        }
    }
}

impl Seed002Args {
    fn phase_time(&self) -> Duration {
        if self.quick { Duration::from_millis(500) } else { Duration::from_secs_f64(self.runtime) }
    }

    fn rounds(&self) -> u32 {
        if self.quick { 1 } else { self.rounds }
    }

    fn check(&self) -> Result<()> {
        if self.rounds == 0 || self.rounds > ROUNDS_MAX {
            return Err(Error::new(ErrorKind::Option, format!("--rounds {}: 1..={ROUNDS_MAX}", self.rounds)));
        }
        if self.jobs == 0 || self.jobs > JOBS_MAX || !self.jobs.is_multiple_of(4) {
            return Err(Error::new(
                ErrorKind::Option,
                format!("--jobs {}: a multiple of 4 up to {JOBS_MAX}", self.jobs),
            ));
        }
        if self.iodepth == 0 || self.iodepth > 128 {
            return Err(Error::new(ErrorKind::Option, format!("--iodepth {}: 1..=128", self.iodepth)));
        }
        Ok(())
    }
}

fn nqn(k: usize) -> String {
    format!("{NQN_PREFIX}{k}")
}

/// `subsystems` subsystems of one RAM namespace each, on two loopback ports, one reactor.
fn target_config(
    subsystems: usize,
    reactor_cpu: Option<usize>,
    poll: PollMode,
    cc: TcpCongestion,
    prefault: bool,
    huge_pages: bool,
) -> Config {
    let mut cfg = Config::embedded_default();
    cfg.options.tcp_congestion = cc;
    for p in &mut cfg.ports {
        p.addr = "127.0.0.1:0".into();
    }
    cfg.reactor = ReactorOptions { reactors: 1, cpus: reactor_cpu.into_iter().collect(), poll, ..cfg.reactor };
    let template = cfg.subsystems[0].clone();
    cfg.subsystems = (0..subsystems)
        .map(|k| {
            let mut s = template.clone();
            s.nqn = nqn(k);
            for ns in &mut s.namespaces {
                ns.size = Some(SizeValue::Bytes(NS_BYTES));
                ns.prefault = prefault;
                ns.huge_pages = huge_pages;
            }
            s
        })
        .collect();
    cfg
}

/// The tiobench-style job file: per phase one section per subsystem, the phases
/// stonewalled; every job a multipath head over both ports.
pub fn job_text(subsystems: usize, addrs: [SocketAddr; 2], args: &Seed002Args) -> String {
    let per = args.jobs as usize / subsystems;
    let ms = args.phase_time().as_millis();
    let mut s = format!(
        "; qpath lab seed-002: tiobench-example.fio over {subsystems} subsystem(s) x {PATHS} paths\n\
         [global]\nbs=4k\nsize={NS_BYTES}\niodepth={}\ntime_based=1\nruntime={ms}ms\nmpath_policy={}\n",
        args.iodepth, args.policy
    );
    for (i, (_, rw)) in PHASES.iter().enumerate() {
        for k in 0..subsystems {
            let _ = write!(
                s,
                "\n[{rw}-s{k}]\nrw={rw}\nnumjobs={per}\nfilename=nvme+tcp://{},{}/{}/1\n",
                addrs[0],
                addrs[1],
                nqn(k)
            );
            if i > 0 && k == 0 {
                s.push_str("stonewall\n");
            }
        }
    }
    s
}

/// One phase of one configuration.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    /// Aggregate bandwidth, MiB/s (fio's group `bw=`: bytes over the longest job runtime).
    pub mibs: f64,
    /// Slowest job, MiB/s.
    pub job_min_mibs: f64,
    /// Fastest job, MiB/s.
    pub job_max_mibs: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// The longest job runtime, seconds.
    pub seconds: f64,
}

/// One configuration's results.
#[derive(Debug, Clone)]
pub struct ConfigResult {
    /// Subsystems.
    pub subsystems: usize,
    /// I/O queues per controller carrying I/O at a time (each job thread owns one on each
    /// path of its subsystem; the controller connects one per job thread of all four steps).
    pub queues_per_path: usize,
    /// Per phase, in [`PHASES`] order.
    pub phases: Vec<PhaseResult>,
    /// Jobs that ended with an error.
    pub job_errors: u64,
    /// I/Os that failed to the caller (host statistics, every namespace).
    pub io_errors: u64,
    /// Controller reconnects (association resets).
    pub reconnects: u64,
    /// Queue connections that failed under I/O.
    pub queue_failures: u64,
    /// I/Os the host's queues completed (host statistics).
    pub host_queue_ios: u64,
    /// I/Os the jobs reported.
    pub job_ios: u64,
    /// Per path: (address, I/Os) summed over every head.
    pub paths: Vec<(String, u64)>,
    /// All-steps MiB/s of every round, in run order (this result is the median one's;
    /// its error, reconnect and failure counts are summed over every round).
    pub rounds_mibs: Vec<f64>,
}

impl ConfigResult {
    /// Bytes of every phase over their summed runtimes, MiB/s.
    pub fn all_mibs(&self) -> f64 {
        let bytes: u64 = self.phases.iter().map(|p| p.bytes).sum();
        let secs: f64 = self.phases.iter().map(|p| p.seconds).sum();
        #[allow(clippy::cast_precision_loss)]
        let b = bytes as f64;
        if secs > 0.0 { b / MIB / secs } else { 0.0 }
    }

    fn json(&self) -> Value {
        let phases: Vec<Value> = self
            .phases
            .iter()
            .zip(PHASES)
            .map(|(p, (name, rw))| {
                json!({"phase": name, "rw": rw, "mibs": p.mibs, "job_min_mibs": p.job_min_mibs,
                       "job_max_mibs": p.job_max_mibs, "bytes": p.bytes, "seconds": p.seconds})
            })
            .collect();
        let paths: Vec<Value> = self.paths.iter().map(|(a, n)| json!({"traddr": a, "ios": n})).collect();
        json!({
            "subsystems": self.subsystems, "paths_per_subsystem": PATHS, "queues_per_path": self.queues_per_path,
            "phases": phases, "all_mibs": self.all_mibs(), "job_errors": self.job_errors,
            "io_errors": self.io_errors, "reconnects": self.reconnects, "queue_failures": self.queue_failures,
            "host_queue_ios": self.host_queue_ios, "job_ios": self.job_ios, "paths": paths,
            "rounds_all_mibs": self.rounds_mibs,
        })
    }
}

#[allow(clippy::cast_precision_loss)]
fn mibs(bytes_per_sec: u64) -> f64 {
    bytes_per_sec as f64 / MIB
}

/// Runs one configuration on a fresh target.
fn run_config(subsystems: usize, args: &Seed002Args, diag: &mut dyn std::io::Write) -> Result<ConfigResult> {
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let server =
        target_config(subsystems, reactor_cpu, args.target_poll, args.tcp_congestion, !args.lazy_ram, args.huge_pages)
            .start()
            .map_err(|e| Error::new(ErrorKind::Target, format!("seed-002 target: {e}")))?;
    let addr = |id: u16| {
        server.local_addr(id).ok_or_else(|| Error::new(ErrorKind::Target, format!("seed-002 target: no port {id}")))
    };
    let result = (|| {
        let addrs = [addr(1)?, addr(2)?];
        let mut file = JobFile::parse(&job_text(subsystems, addrs, args), "seed-002")?;
        file.check_strict()?;
        crate::place_jobs(&mut file, &job_cpus);
        let ctrls = Arc::new(Controllers::for_jobs(&file).with_tcp_congestion(args.tcp_congestion.name()));
        let registry = EngineRegistry::with_all_engines(&ctrls);
        let opts = RunOptions { pin: Some(crate::pin_hook()), status: StatusMode::Never, ..RunOptions::default() };
        let run = run::run_jobs(&file, &registry, &opts, diag);
        drop(registry);
        // Every job's context is gone: the host's statistics are final.
        let snap = ctrls.stats().snapshot();
        ctrls.disconnect_all();
        let report = Report::from_run(&file, &run?);
        Ok::<_, Error>(summarize(subsystems, args, &report, &snap))
    })();
    server.shutdown();
    result
}

fn summarize(subsystems: usize, args: &Seed002Args, report: &Report, snap: &host::stats::HostSnapshot) -> ConfigResult {
    let groups = group_stats(&report.jobs, PHASES.len());
    let phases = PHASES
        .iter()
        .enumerate()
        .map(|(i, (_, rw))| {
            let dir = usize::from(!rw.contains("read"));
            let g = groups.get(i);
            let pick = |f: &dyn Fn(&bench::report::GroupStats) -> u64| g.map_or(0, f);
            let min = pick(&|g| g.min_bw[dir]);
            #[allow(clippy::cast_precision_loss)]
            let seconds = pick(&|g| g.max_run[dir]) as f64 / 1000.0;
            PhaseResult {
                mibs: mibs(pick(&|g| g.agg[dir])),
                job_min_mibs: if min == u64::MAX { 0.0 } else { mibs(min) },
                job_max_mibs: mibs(pick(&|g| g.max_bw[dir])),
                bytes: pick(&|g| g.io_bytes[dir]),
                seconds,
            }
        })
        .collect();
    let mut paths: Vec<(String, u64)> = Vec::new();
    for p in report.jobs.iter().filter_map(|j| j.multipath.as_ref()).flat_map(|m| &m.paths) {
        match paths.iter_mut().find(|(a, _)| *a == p.traddr) {
            Some(e) => e.1 += p.ios,
            None => paths.push((p.traddr.clone(), p.ios)),
        }
    }
    paths.sort();
    ConfigResult {
        subsystems,
        queues_per_path: args.jobs as usize / subsystems,
        phases,
        job_errors: report.jobs.iter().filter(|j| j.error != 0).count() as u64,
        io_errors: snap.io_errors(),
        reconnects: snap.reconnects(),
        queue_failures: snap.queue_failures(),
        host_queue_ios: snap.queue_ios(),
        job_ios: report.jobs.iter().map(|j| j.stat.dirs.iter().map(|d| d.total_ios).sum::<u64>()).sum(),
        paths,
        rounds_mibs: Vec::new(),
    }
}

/// The round with the median all-steps bandwidth, with every round's errors, reconnects
/// and failed queues added up (none may hide in a round that was not picked).
fn median_round(mut rounds: Vec<ConfigResult>) -> Option<ConfigResult> {
    let mibs: Vec<f64> = rounds.iter().map(ConfigResult::all_mibs).collect();
    let (job_errors, io_errors, reconnects, queue_failures) = rounds
        .iter()
        .fold((0, 0, 0, 0), |a, r| (a.0 + r.job_errors, a.1 + r.io_errors, a.2 + r.reconnects, a.3 + r.queue_failures));
    rounds.sort_by(|a, b| a.all_mibs().total_cmp(&b.all_mibs()));
    let mid = rounds.len() / 2;
    let mut m = rounds.into_iter().nth(mid)?;
    m.rounds_mibs = mibs;
    (m.job_errors, m.io_errors, m.reconnects, m.queue_failures) = (job_errors, io_errors, reconnects, queue_failures);
    Some(m)
}

/// Round by round, `b / a` (the rounds both have).
fn paired_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).filter(|(x, _)| **x > 0.0).map(|(x, y)| y / x).collect()
}

/// Errors, resets and failed queues over every configuration of a result.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(configs)) = r.extra.get("configurations") else { return 0 };
    configs
        .iter()
        .map(|c| {
            ["job_errors", "io_errors", "reconnects", "queue_failures"]
                .iter()
                .map(|k| c[*k].as_u64().unwrap_or(0))
                .sum::<u64>()
        })
        .sum()
}

/// Indexes into [`SUBSYSTEMS`] in the order round `round` (from 1) runs them: every other
/// round backwards, so no configuration always runs first or last in a round (where the
/// machine's drift over a round, or what the previous configuration left behind, would
/// land on it alone).
fn round_order(round: u32) -> impl Iterator<Item = usize> {
    let n = SUBSYSTEMS.len();
    (0..n).map(move |k| if round.is_multiple_of(2) { n - 1 - k } else { k })
}

/// Runs every configuration and builds the result. Progress goes to `diag`.
pub fn run(args: &Seed002Args, diag: &mut dyn std::io::Write) -> Result<LabResult> {
    args.check()?;
    let mut rounds: Vec<Vec<ConfigResult>> = SUBSYSTEMS.iter().map(|_| Vec::new()).collect();
    for round in 1..=args.rounds() {
        for i in round_order(round) {
            let s = SUBSYSTEMS[i];
            let _ = writeln!(
                diag,
                "seed-002: round {round}/{}: {s} subsystem(s) x {PATHS} paths, {} job threads ...",
                args.rounds(),
                args.jobs
            );
            rounds[i].push(run_config(s, args, diag)?);
        }
    }
    let configs: Vec<ConfigResult> = rounds.into_iter().filter_map(median_round).collect();
    Ok(build(args, &configs))
}

fn build(args: &Seed002Args, configs: &[ConfigResult]) -> LabResult {
    let mut r = LabResult::new("seed-002", "aggregate 4k bandwidth with 1, 2 and 4 subsystems of 2 paths");
    let secs = args.phase_time().as_secs_f64();
    r.note(format!(
        "seed: 96 cores, 1/2/4 subsystems x 2 paths x 32 queues, tiobench (4 jobs per step), nvmet on a P3700; \
         Linux seq write {} -> {} MiB/s (1 -> 4 subsystems, {:.2}x) with I/O errors and resets",
        SEED_SEQ_WRITE_MIBS.0,
        SEED_SEQ_WRITE_MIBS.1,
        SEED_SEQ_WRITE_MIBS.1 / SEED_SEQ_WRITE_MIBS.0
    ));
    r.note(format!(
        "scaled to {} CPUs: {} job threads per step in every configuration, spread evenly over the subsystems \
         (the seed's 4 per subsystem would oversubscribe the cores); each job thread owns one I/O queue on each \
         path of its subsystem, so N = {}/S queues per path carry I/O at a time ({} in use in every \
         configuration); each controller connects one queue per job thread of the whole run, N x 4 steps \
         ({} with one subsystem, the seed's 32 at the default)",
        uring::online_cpus(),
        args.jobs,
        args.jobs,
        args.jobs as usize * PATHS,
        args.jobs as usize * PHASES.len()
    ));
    r.note(format!(
        "job: bs=4k, iodepth={}, {secs} s per step (seq write, rand write, seq read, rand read, stonewalled), \
         multipath heads over both ports (mpath_policy={}); target: one reactor, RAM namespaces of {} MiB ({}), \
         poll {:?}; TCP congestion control {}; fresh target and host per configuration",
        args.iodepth,
        args.policy,
        NS_BYTES >> 20,
        match (args.lazy_ram, args.huge_pages) {
            (true, false) => "mapped lazily",
            (true, true) => "mapped lazily, huge pages",
            (false, false) => "pre-faulted",
            (false, true) => "pre-faulted, huge pages",
        },
        args.target_poll,
        args.tcp_congestion.name().unwrap_or("of the system")
    ));
    r.note(format!(
        "{} round(s), the configurations in turn (every other round in reverse order); each row is the round with the median all-steps MiB/s \
         (every round's: rounds_all_mibs in the JSON); errors, reconnects and failed queues are summed over \
         every round and come from the host's statistics (host::stats), not from fio",
        args.rounds()
    ));
    r.columns(&[
        "subsystems",
        "queues/path",
        "seq write MiB/s",
        "rand write MiB/s",
        "seq read MiB/s",
        "rand read MiB/s",
        "all steps MiB/s",
        "job min MiB/s",
        "job max MiB/s",
        "I/O errors",
        "reconnects",
    ]);
    for c in configs {
        let mut row = vec![Cell::text(c.subsystems.to_string()), Cell::text(c.queues_per_path.to_string())];
        row.extend(c.phases.iter().map(|p| Cell::num(p.mibs, "MiB/s")));
        row.push(Cell::num(c.all_mibs(), "MiB/s"));
        let lo = c.phases.iter().map(|p| p.job_min_mibs).fold(f64::INFINITY, f64::min);
        let hi = c.phases.iter().map(|p| p.job_max_mibs).fold(0.0, f64::max);
        row.push(Cell::num(lo, "MiB/s"));
        row.push(Cell::num(hi, "MiB/s"));
        #[allow(clippy::cast_precision_loss)]
        let errors = (c.io_errors + c.job_errors) as f64;
        #[allow(clippy::cast_precision_loss)]
        let reconnects = (c.reconnects + c.queue_failures) as f64;
        row.push(Cell::num(errors, ""));
        row.push(Cell::num(reconnects, ""));
        r.row(row);
    }
    let by = |s: usize| configs.iter().find(|c| c.subsystems == s);
    if let (Some(one), Some(four)) = (by(1), by(4)) {
        r.goal(Goal::at_least("all steps: 4 subsystems / 1", four.all_mibs(), one.all_mibs(), 1.0));
        r.goal(Goal::at_least(
            "seq write: 4 subsystems / 1 (seed: 0.78)",
            four.phases[0].mibs,
            one.phases[0].mibs,
            1.0,
        ));
        // The goal compares each configuration's median round; the ratio within each round
        // (its configurations ran back to back) says how much of that is the machine's drift.
        let paired = paired_ratios(&one.rounds_mibs, &four.rounds_mibs);
        if let Some(m) = crate::median(paired.clone()) {
            let list: Vec<String> = paired.iter().map(|x| format!("{x:.3}")).collect();
            r.note(format!(
                "all steps 4 subsystems / 1 within each round: {} (median {m:.3}); rounds_ratio_4_1 in the JSON",
                list.join(", ")
            ));
            r.extra.insert("rounds_ratio_4_1".into(), json!(paired));
            r.extra.insert("rounds_ratio_4_1_median".into(), json!(m));
        }
    }
    let groups: Vec<&str> = PHASES.iter().map(|(n, _)| *n).collect();
    let series = configs
        .iter()
        .map(|c| (format!("{} subsystem(s)", c.subsystems), c.phases.iter().map(|p| p.mibs).collect()))
        .collect();
    r.bars("MiB/s", &groups, series);
    r.extra.insert("configurations".into(), Value::Array(configs.iter().map(ConfigResult::json).collect()));
    r.extra.insert(
        "seed".into(),
        json!({"seq_write_mibs_1_subsys": SEED_SEQ_WRITE_MIBS.0, "seq_write_mibs_4_subsys": SEED_SEQ_WRITE_MIBS.1,
               "ratio": SEED_SEQ_WRITE_MIBS.1 / SEED_SEQ_WRITE_MIBS.0}),
    );
    r
}

/// `qpath lab seed-002`: runs, prints as `args.output` says, returns the result.
pub fn lab(args: &Seed002Args) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratios_and_their_median() {
        let r = paired_ratios(&[200.0, 250.0, 0.0, 190.0], &[210.0, 200.0, 5.0, 190.0]);
        assert_eq!(r, [1.05, 0.8, 1.0], "a round without a baseline is skipped");
        assert_eq!(crate::median(r), Some(1.0));
        assert_eq!(crate::median(vec![1.2, 0.8, 1.0, 0.9]), Some(0.95), "even count: the middle two's mean");
        assert_eq!(crate::median(Vec::new()), None);
    }

    #[test]
    fn the_job_file_has_four_stonewalled_steps_over_every_subsystem() {
        let args = Seed002Args::default();
        let addrs = ["127.0.0.1:4420".parse().unwrap(), "127.0.0.1:4421".parse().unwrap()];
        let f = JobFile::parse(&job_text(4, addrs, &args), "t").unwrap();
        f.check_strict().unwrap();
        assert_eq!(f.jobs.len(), 4 * 4 * 2, "4 steps x 4 subsystems x 2 threads");
        let groups: std::collections::BTreeSet<usize> = f.jobs.iter().map(|j| j.place.groupid).collect();
        assert_eq!(groups.len(), 4, "one reporting group per step");
        for j in &f.jobs {
            let bench::filename::TargetKind::Remote(r) = &j.target.kind else { panic!("{:?}", j.target) };
            assert_eq!(r.path_count(), PATHS);
        }
    }

    #[test]
    fn the_median_round_keeps_every_rounds_errors() {
        let round = |mibs: f64, reconnects: u64| ConfigResult {
            subsystems: 1,
            queues_per_path: 8,
            phases: vec![PhaseResult {
                mibs,
                job_min_mibs: 0.0,
                job_max_mibs: 0.0,
                bytes: 1 << 20,
                seconds: 1.0 / mibs,
            }],
            job_errors: 0,
            io_errors: 1,
            reconnects,
            queue_failures: 0,
            host_queue_ios: 0,
            job_ios: 0,
            paths: Vec::new(),
            rounds_mibs: Vec::new(),
        };
        let m = median_round(vec![round(30.0, 0), round(10.0, 2), round(20.0, 0)]).unwrap();
        assert!((m.all_mibs() - 20.0).abs() < 1e-6, "{}", m.all_mibs());
        assert_eq!((m.reconnects, m.io_errors), (2, 3), "summed over the rounds");
        assert_eq!(m.rounds_mibs.len(), 3);
        assert!(median_round(Vec::new()).is_none());
    }

    #[test]
    fn rounds_alternate_the_order_of_the_configurations() {
        assert_eq!(round_order(1).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(round_order(2).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(round_order(3).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn jobs_must_split_evenly() {
        for jobs in [0, 6, 68] {
            assert!(Seed002Args { jobs, ..Seed002Args::default() }.check().is_err(), "{jobs}");
        }
        assert!(Seed002Args::default().check().is_ok());
    }

    #[test]
    fn the_target_has_the_subsystems_on_both_ports() {
        let cfg = target_config(4, None, PollMode::Block, TcpCongestion::System, false, false);
        assert_eq!(cfg.subsystems.len(), 4);
        assert_eq!(cfg.ports.len(), 2);
        assert!(cfg.subsystems.iter().all(|s| s.ports.is_empty()), "every subsystem on every port");
        assert!(cfg.subsystems.iter().flat_map(|s| &s.namespaces).all(|n| !n.prefault));
        let cfg = target_config(2, None, PollMode::Block, TcpCongestion::System, true, true);
        assert!(
            cfg.subsystems.iter().flat_map(|s| &s.namespaces).all(|n| n.prefault && n.huge_pages && n.backend == "ram")
        );
    }
}
