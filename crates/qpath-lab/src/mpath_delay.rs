//! `qpath lab mpath-delay`: issue 4's acceptance 4. One of two paths gets +2 ms from the
//! target's port fault injection, and a throughput workload runs under round-robin,
//! queue-depth and latency: the policies that see the slow path should keep most I/O
//! off it.
//!
//! ```text
//!  embedded target: port 1 ─────────────── path 1 ─┐
//!                   port 2 (delay_us=2000) ─ path 2 ─┴─ head ── job threads (CPU 1)
//!  cases: no delay + round-robin (the healthy reference), then with the delay:
//!         round-robin, queue-depth, latency
//!    [global] bs=4k iodepth=32 numjobs=2 rw=randread time_based paths=2 mpath_policy=<case>
//!    ─► IOPS, clat, per-path I/O counts
//! ```
//!
//! The Linux adaptive-policy RFC (2025) reported, with one path throttled by ~30 ms:
//! 350 MiB/s under its latency policy, 230 under queue-depth, 105 under round-robin.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use target::reactor::PollMode;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use crate::seed_000::{CaseResult, LabTarget, policy_lines, run_rounds};
use bench::engine::mpath::PolicyChoice;
use bench::{Error, ErrorKind, Result};
use host::mpath::Policy;

/// Arguments of `qpath lab mpath-delay`.
#[derive(Debug, Clone, clap::Args)]
pub struct MpathDelayArgs {
    /// Seconds each case runs.
    #[arg(long, value_name = "SECONDS", default_value = "12", value_parser = crate::seconds_up_to::<3600>)]
    pub runtime: f64,
    /// Rounds: every case runs `runtime / rounds` seconds per round, cases interleaved.
    /// On a shared 2-core machine one case moved by up to 2x between 2 s slices, so the
    /// default spreads each case over 6 of them.
    #[arg(long, value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Microseconds the target adds to every I/O on the second port.
    #[arg(long = "delay-us", value_name = "US", default_value_t = 2000)]
    pub delay_us: u64,
    /// Job threads (fio numjobs).
    #[arg(long, default_value_t = 2)]
    pub jobs: u32,
    /// Queue depth per job thread.
    #[arg(long, default_value_t = 32)]
    pub iodepth: u32,
    /// Block size (fio syntax).
    #[arg(long, default_value = "4k")]
    pub bs: String,
    /// How the embedded target's reactor waits: adaptive (spin 200 us, then sleep), busy or block.
    #[arg(long = "target-poll", value_name = "MODE", default_value = "adaptive", value_parser = crate::parse_poll)]
    pub target_poll: PollMode,
    /// Output: --json, --plot FILE, --no-plot, --output FILE.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl MpathDelayArgs {
    /// The defaults with `runtime` seconds per case.
    pub fn with_runtime(runtime: f64) -> MpathDelayArgs {
        MpathDelayArgs {
            runtime,
            rounds: 1,
            delay_us: 2000,
            jobs: 2,
            iodepth: 32,
            bs: "4k".into(),
            target_poll: PollMode::Adaptive,
            output: LabOutputArgs::default(),
        }
    }
}

/// The most a case may ask the target to hold each I/O.
const DELAY_US_MAX: u64 = 1_000_000;

/// `(label, policy, delayed)` in the order the cases run.
fn cases() -> Vec<(&'static str, PolicyChoice, bool)> {
    vec![
        ("no delay, round-robin", PolicyChoice::Policy(Policy::ROUND_ROBIN), false),
        ("round-robin", PolicyChoice::Policy(Policy::ROUND_ROBIN), true),
        ("queue-depth", PolicyChoice::Policy(Policy::QueueDepth), true),
        ("latency", PolicyChoice::Policy(Policy::LATENCY), true),
    ]
}

/// The job of a case, `{runtime}` left for [`run_rounds`] to fill in.
fn job_text(args: &MpathDelayArgs, choice: &PolicyChoice) -> String {
    format!(
        "[global]\nioengine=libaio\ndirect=1\ngroup_reporting\nrw=randread\nbs={}\niodepth={}\nnumjobs={}\n\
         runtime={{runtime}}\ntime_based\nrandrepeat=1\npaths=2\n\n[delayed-path]\n{}\n",
        args.bs,
        args.iodepth,
        args.jobs,
        policy_lines(choice)
    )
}

/// Runs the lab. Progress goes to `diag`.
pub fn run(args: &MpathDelayArgs, diag: &mut dyn Write) -> Result<LabResult> {
    if args.delay_us == 0 || args.delay_us > DELAY_US_MAX {
        return Err(Error::new(ErrorKind::Option, format!("--delay-us {}: 1..={DELAY_US_MAX}", args.delay_us)));
    }
    if args.jobs == 0 || args.jobs > 64 || args.iodepth == 0 || args.iodepth > 1024 {
        return Err(Error::new(ErrorKind::Option, "--jobs 1..=64 and --iodepth 1..=1024"));
    }
    let cases = cases();
    let labels: Vec<String> = cases.iter().map(|(l, _, _)| (*l).to_string()).collect();
    let jobs: Vec<String> = cases.iter().map(|(_, c, _)| job_text(args, c)).collect();
    let delays: Vec<u64> = cases.iter().map(|&(_, _, d)| if d { args.delay_us } else { 0 }).collect();
    let lab = LabTarget::start(args.target_poll)?;
    let delayed_port = lab.target.port(1);
    let results = run_rounds(
        &lab,
        &labels,
        &jobs,
        Duration::from_secs_f64(args.runtime),
        args.rounds,
        &mut |i| delayed_port.faults.delay_us.store(delays[i], Ordering::Relaxed),
        diag,
    );
    delayed_port.faults.delay_us.store(0, Ordering::Relaxed);
    let target_desc = lab.target.describe();
    let addrs = lab.target.addrs();
    lab.shutdown();
    let results: Vec<(CaseResult, u64)> = results?.into_iter().zip(delays).collect();
    Ok(build(args, &results, &target_desc, addrs))
}

/// Runs the lab with progress on stderr and prints it as `args.output` asks.
pub fn lab(args: &MpathDelayArgs) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

fn build(
    args: &MpathDelayArgs,
    results: &[(CaseResult, u64)],
    target_desc: &str,
    addrs: [std::net::SocketAddr; 2],
) -> LabResult {
    let mut r = LabResult::new(
        "mpath-delay",
        format!(
            "{} randread, {} jobs x QD{}, path 2 delayed +{} us by the target",
            args.bs, args.jobs, args.iodepth, args.delay_us
        ),
    );
    r.note(format!(
        "with one path delayed (target-side injection, +2 ms), throughput under latency should \
         be at least queue-depth's, and both beat round-robin; here path 1 = {} and path 2 = {} (port 2's delay_us = \
         {}), {:.1} s per case in {} interleaved round(s)",
        addrs[0], addrs[1], args.delay_us, args.runtime, args.rounds
    ));
    r.note(format!("{target_desc}; job threads on the other CPU"));
    r.note(
        "scaled to this 2-core machine: loopback paths, one target reactor and the job threads on the other core, so \
         the healthy path's throughput is CPU-bound; the Linux adaptive-policy RFC (2025) throttled one path by ~30 ms \
         and reported 350 MiB/s (latency) vs 230 (queue-depth) vs 105 (round-robin)",
    );
    r.columns(&[
        "case",
        "path 2 delay us",
        "IOPS",
        "MiB/s",
        "clat avg us",
        "clat p99 us",
        "path 1 ios",
        "path 2 ios",
        "% on path 2",
        "errors",
    ]);
    for (c, delay) in results {
        let total = c.path_ios(0) + c.path_ios(1);
        #[allow(clippy::cast_precision_loss)]
        let share = if total > 0 { 100.0 * c.path_ios(1) as f64 / total as f64 } else { 0.0 };
        #[allow(clippy::cast_precision_loss)]
        r.row(vec![
            Cell::text(c.name.clone()),
            Cell::num(*delay as f64, "us"),
            Cell::num(c.iops(), "IOPS"),
            Cell::num(c.bw_bytes() / f64::from(1u32 << 20), "MiB/s"),
            Cell::num(c.clat_ns() / 1000.0, "us"),
            Cell::num(c.clat_p99_ns() / 1000.0, "us"),
            Cell::num(c.path_ios(0) as f64, "ios"),
            Cell::num(c.path_ios(1) as f64, "ios"),
            Cell::num(share, "%"),
            Cell::num(f64::from(u8::from(c.error != 0)), ""),
        ]);
    }
    let iops = |name: &str| results.iter().find(|(c, d)| c.name == name && *d > 0).map(|(c, _)| c.iops());
    if let (Some(rr), Some(qd), Some(lat)) = (iops("round-robin"), iops("queue-depth"), iops("latency")) {
        r.goal(Goal::at_least("IOPS latency / queue-depth (path 2 delayed)", lat, qd, 1.0));
        r.goal(Goal::at_least("IOPS queue-depth / round-robin (path 2 delayed)", qd, rr, 1.0));
        r.goal(Goal::at_least("IOPS latency / round-robin (path 2 delayed)", lat, rr, 1.0));
    }
    if let Some((healthy, _)) = results.iter().find(|(_, d)| *d == 0)
        && let Some(lat) = iops("latency")
    {
        r.note(format!(
            "latency keeps {:.0}% of the healthy round-robin's IOPS ({:.0}) with path 2 delayed",
            100.0 * lat / healthy.iops().max(1.0),
            healthy.iops()
        ));
    }
    let labels: Vec<String> = results.iter().map(|(c, _)| c.name.clone()).collect();
    let groups: Vec<&str> = labels.iter().map(String::as_str).collect();
    r.bars("IOPS", &groups, vec![("IOPS".into(), results.iter().map(|(c, _)| c.iops()).collect())]);
    r.extra.insert(
        "cases".into(),
        serde_json::Value::Array(
            results
                .iter()
                .map(|(c, d)| {
                    let mut v = c.json();
                    v["path2_delay_us"] = json!(d);
                    v
                })
                .collect(),
        ),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_text_parses_for_every_case() {
        let a = MpathDelayArgs::with_runtime(0.5);
        for (_, c, _) in cases() {
            let f = bench::job::JobFile::parse(&job_text(&a, &c).replace("{runtime}", "1s"), "t").unwrap();
            f.check_strict().unwrap();
            assert_eq!(f.jobs.len(), 2);
            assert_eq!(bench::engine::mpath::policy_of(&f.jobs[0]).unwrap(), Some(c));
        }
    }
}
