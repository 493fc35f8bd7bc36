//! What `qpath bench` does, end to end; the bin only parses arguments and calls [`bench()`].
//! The labs (`qpath lab`) use its placement helpers too: [`default_cpus`],
//! [`place_jobs`], [`pin_hook`].
//!
//! ```text
//! qpath bench JOBFILE
//!   load jobs ─► --runtime-cap ─► embedded target needed? (no filename, or --embedded-target)
//!     yes: plan namespaces, place threads (reactor CPU 0, jobs on the other CPUs)
//!   physical baseline (raw TCP ping-pong + stream, same placement)   [--baseline, default with the embedded target]
//!   start the embedded target, point the jobs at it
//!   run with every engine (qpath, qpath-passthru, io_uring, psync, sync, null)
//!   report: fio text / JSON + qpath section (target, baseline, ratios, SPDK reference)
//!   [--rpc-socket / --metrics: host and embedded-target statistics served throughout,
//!    --linger: and for a while after the jobs]
//!   disconnect, stop the target
//! ```

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use target::reactor::PollMode;
use target::registry::TcpCongestion;

use crate::baseline::{self, BaselineOptions, Placement, WaitMode};
use crate::embedded_target::{self, Embedded, EmbeddedOptions};
use crate::engine::EngineRegistry;
use crate::engine::remote::Controllers;
use crate::error::{Error, ErrorKind, Result};
use crate::job::{CpuPolicy, CpuSet, JobFile};
use crate::report::Baseline;
use crate::run::{PinFn, RunOptions};
use crate::{BenchArgs, Comparisons, Outcome};

/// Environment variable that caps job runtimes like `--runtime-cap` (seconds).
pub const RUNTIME_CAP_ENV: &str = "QPATH_BENCH_RUNTIME_CAP";

/// `busy`, `adaptive` or `block`: the `--target-poll` option of `bench` and every lab.
pub fn parse_poll(s: &str) -> std::result::Result<PollMode, String> {
    s.parse()
}

/// A number of seconds in (0, `MAX`]: the `--runtime`-style options of every lab.
pub fn seconds_up_to<const MAX: u32>(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= f64::from(MAX) => Ok(v),
        _ => Err(format!("{s:?}: a number of seconds in (0, {MAX}]")),
    }
}

fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    seconds_up_to::<86_400>(s)
}

/// Arguments of `qpath bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct CmdArgs {
    /// The job file, output format and output file.
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Cap every job's runtime (and ramp_time) at SECONDS, for smoke tests of long job
    /// files; also $QPATH_BENCH_RUNTIME_CAP.
    #[arg(long = "runtime-cap", value_name = "SECONDS", value_parser = parse_seconds)]
    pub runtime_cap: Option<f64>,
    /// Measure the physical baseline (raw TCP ping-pong and stream) right before the
    /// jobs; the default when the embedded target runs.
    #[arg(long, conflicts_with = "no_baseline")]
    pub baseline: bool,
    /// Skip the physical baseline.
    #[arg(long = "no-baseline")]
    pub no_baseline: bool,
    /// How the embedded target's reactor waits: adaptive (spin 200 us, then sleep), busy or block.
    #[arg(long = "target-poll", value_name = "MODE", default_value = "adaptive", value_parser = parse_poll)]
    pub target_poll: PollMode,
    /// TCP congestion control of every connection of the run (the embedded target's, the
    /// host's unless a filename URI names `tcp_congestion`, and the physical baseline's):
    /// system (default), reno, cubic, bbr or dctcp. BBR paces its sends; on loopback that
    /// costs the 128k read stream bandwidth (BENCHMARKS.md).
    #[arg(long = "tcp-congestion", value_name = "NAME", default_value = "system")]
    pub tcp_congestion: TcpCongestion,
    /// Start the embedded target even when jobs have filenames, and point the jobs that
    /// name its default subsystem (nqn.2026-11.io.qpath:default on loopback, as the seed
    /// job files in examples/ do) at it.
    #[arg(long = "embedded-target")]
    pub embedded_target: bool,
    /// Serve the run's statistics on this JSON-RPC socket while it runs (`qpath stats
    /// --socket PATH`; with the embedded target, `qpath stats --socket PATH --target`).
    #[arg(long = "rpc-socket", value_name = "PATH")]
    pub rpc_socket: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics (`GET /metrics`: qpath_host_*, the embedded target's
    /// qpath_target_*, qpath_bench_running) on this address, e.g. 127.0.0.1:9421
    /// (port 0: any free port, printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Keep the RPC socket and /metrics up this long after the jobs end (until a client
    /// calls the RPC method `release`), so a scraper sees the final counts.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub linger: Option<f64>,
}

impl CmdArgs {
    /// Arguments for running `path` as `qpath bench path` would.
    pub fn for_jobfile(path: impl Into<std::path::PathBuf>) -> CmdArgs {
        CmdArgs {
            bench: BenchArgs::for_jobfile(path),
            runtime_cap: None,
            baseline: false,
            no_baseline: false,
            target_poll: PollMode::Adaptive,
            tcp_congestion: TcpCongestion::System,
            embedded_target: false,
            rpc_socket: None,
            metrics: None,
            linger: None,
        }
    }

    /// The runtime cap from the option, else from the environment.
    pub fn runtime_cap(&self) -> Result<Option<Duration>> {
        let secs = match (self.runtime_cap, std::env::var(RUNTIME_CAP_ENV)) {
            (Some(s), _) => Some(s),
            (None, Ok(v)) if !v.trim().is_empty() => Some(
                parse_seconds(v.trim())
                    .map_err(|why| Error::new(ErrorKind::Option, format!("{RUNTIME_CAP_ENV}={v}: {why}")))?,
            ),
            _ => None,
        };
        Ok(secs.map(Duration::from_secs_f64))
    }
}

/// A `cpus_allowed` pin hook over [`uring::pin_current_thread`], which pins to one
/// CPU: a set that covers every online CPU leaves the thread unpinned; any other set
/// pins successive threads to its CPUs in turn.
pub fn pin_hook() -> Arc<PinFn> {
    let next = AtomicUsize::new(0);
    let online = uring::online_cpus();
    Arc::new(move |cpus: &[usize]| {
        if cpus.is_empty() || (0..online).all(|c| cpus.contains(&c)) {
            return Ok(());
        }
        let k = next.fetch_add(1, Ordering::Relaxed);
        let cpu = cpus[k % cpus.len()];
        uring::pin_current_thread(cpu)?;
        // A pinned job thread spins waiting for completions: the process's helper
        // threads keep off its CPU while it lives (when another CPU is left).
        JOB_CPU.with(|c| *c.borrow_mut() = Some(uring::placement::claim(cpu, uring::placement::Spinner::Job)));
        Ok(())
    })
}

thread_local! {
    /// The CPU the calling job thread was pinned to, claimed until the thread ends.
    static JOB_CPU: std::cell::RefCell<Option<uring::placement::Claim>> = const { std::cell::RefCell::new(None) };
}

/// Where the embedded target's reactor and the job threads run: the reactor on CPU 0
/// and jobs on the others when there is more than one CPU; nothing pinned otherwise.
pub fn default_cpus(online: usize) -> (Option<usize>, Vec<usize>) {
    if online > 1 { (Some(0), (1..online).collect()) } else { (None, Vec::new()) }
}

/// Jobs without `cpus_allowed` run on `cpus` (clone *i* on the *i*-th, round robin).
/// Returns how many job threads were placed.
pub fn place_jobs(file: &mut JobFile, cpus: &[usize]) -> usize {
    if cpus.is_empty() {
        return 0;
    }
    let mut n = 0;
    for j in &mut file.jobs {
        if j.cpus_allowed.is_none() {
            j.cpus_allowed = Some(CpuSet { cpus: cpus.to_vec() });
            j.cpus_allowed_policy = CpuPolicy::Split;
            n += 1;
        }
    }
    n
}

/// Run a job file as `qpath bench` does. Diagnostics go to stderr.
pub fn bench(args: &CmdArgs) -> Result<Outcome> {
    let mut stderr = std::io::stderr();
    let mut file = args.bench.load_jobs()?;
    if let Some(cap) = args.runtime_cap()? {
        file.cap_runtime(cap);
    }
    let online = uring::online_cpus();
    let jobs = embedded_target::embedded_jobs(&file, args.embedded_target);
    let want_embedded = !jobs.is_empty();
    let (reactor_cpu, job_cpus) = default_cpus(online);
    let mut target_desc = None;
    let mut embedded_opts = None;
    if want_embedded {
        place_jobs(&mut file, &job_cpus);
        let (namespaces, notes) = embedded_target::plan_namespaces(&file, &jobs, embedded_target::memory_available());
        file.notes.extend(notes);
        embedded_opts = Some(EmbeddedOptions {
            poll: args.target_poll,
            reactor_cpu,
            namespaces,
            tcp_congestion: args.tcp_congestion,
        });
    } else if file.jobs.iter().any(|j| j.target.is_remote()) {
        let mut raws: Vec<&str> = Vec::new();
        for j in &file.jobs {
            if j.target.is_remote() && !raws.contains(&j.target.raw.as_str()) {
                raws.push(&j.target.raw);
            }
        }
        target_desc = Some(format!("remote: {}", raws.join(", ")));
    }
    let run_baseline = !args.no_baseline && (args.baseline || want_embedded);
    let physical = if run_baseline {
        let placement = Placement {
            server_cpu: if want_embedded { reactor_cpu } else { None },
            client_cpu: file.jobs.first().and_then(|j| j.cpus_for_thread()).and_then(|c| c.first().copied()),
            server_wait: if args.target_poll == PollMode::Block { WaitMode::Block } else { WaitMode::Busy },
            client_wait: WaitMode::Busy,
        };
        let _ = writeln!(stderr, "qpath bench: measuring the physical baseline (raw loopback TCP, ~2 s)");
        let opts =
            BaselineOptions { placement, tcp_congestion: args.tcp_congestion.name(), ..BaselineOptions::default() };
        Some(baseline::measure(&opts)?)
    } else {
        None
    };
    let server = match embedded_opts {
        Some(o) => {
            let s = Embedded::start(o)?;
            s.redirect(&mut file, &jobs)?;
            let mut desc = s.describe();
            if !job_cpus.is_empty() {
                desc.push_str(&format!("; job threads without cpus_allowed on CPU {job_cpus:?}"));
            }
            let _ = writeln!(stderr, "qpath bench: {desc}");
            target_desc = Some(desc);
            Some(s)
        }
        None => None,
    };
    let ctrls = Arc::new(Controllers::for_jobs(&file).with_tcp_congestion(args.tcp_congestion.name()));
    let endpoints = if args.rpc_socket.is_some() || args.metrics.is_some() {
        let src =
            crate::observe::Sources { host: Arc::clone(ctrls.stats()), target: server.as_ref().map(Embedded::state) };
        let e = crate::observe::Endpoints::start(args.rpc_socket.as_deref(), args.metrics, src)?;
        if let Some(p) = &args.rpc_socket {
            let _ = writeln!(stderr, "qpath bench: statistics on RPC socket {}", p.display());
        }
        if let Some(a) = e.metrics_addr() {
            let _ = writeln!(stderr, "qpath bench: metrics on http://{a}/metrics");
        }
        Some(e)
    } else {
        None
    };
    let registry = EngineRegistry::with_all_engines(&ctrls);
    let opts = RunOptions { pin: Some(pin_hook()), ..RunOptions::default() };
    let references =
        if file.jobs.iter().any(|j| j.target.is_remote()) { Baseline::spdk_loopback_2026_11() } else { Vec::new() };
    let cmp = Comparisons { references, physical, target: target_desc };
    let outcome = crate::run_file_compared(&file, &args.bench, &registry, &opts, &cmp);
    drop(registry);
    if let Some(e) = &endpoints {
        // Every job's context is gone: the host's counts are final.
        e.finished();
        if let Some(secs) = args.linger {
            let _ = writeln!(stderr, "qpath bench: jobs done; serving statistics for {secs} s (RPC `release` ends it)");
            e.linger(Duration::from_secs_f64(secs));
        }
    }
    drop(endpoints);
    ctrls.disconnect_all();
    if let Some(s) = server {
        s.shutdown();
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_default_to_the_cpus_the_reactor_leaves() {
        assert_eq!(default_cpus(1), (None, vec![]));
        assert_eq!(default_cpus(2), (Some(0), vec![1]));
        assert_eq!(default_cpus(4), (Some(0), vec![1, 2, 3]));
        let mut f = JobFile::parse("[a]\nsize=1m\nnumjobs=3\n[b]\nsize=1m\ncpus_allowed=0\n", "t").unwrap();
        assert_eq!(place_jobs(&mut f, &[1, 2]), 3);
        let cpus: Vec<Vec<usize>> = f.jobs.iter().map(|j| j.cpus_for_thread().unwrap()).collect();
        assert_eq!(cpus, vec![vec![1], vec![2], vec![1], vec![0]]);
    }

    #[test]
    fn runtime_cap_from_option() {
        let mut a = CmdArgs::for_jobfile("x.fio");
        a.runtime_cap = Some(1.5);
        assert_eq!(a.runtime_cap().unwrap(), Some(Duration::from_millis(1500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("nan").is_err());
    }
}
