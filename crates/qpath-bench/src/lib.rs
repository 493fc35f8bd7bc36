//! `qpath bench`: fio job files in, fio-compatible text and JSON out.
//!
//! This crate owns the benchmark: parsing fio job files ([`job`]), what a job's
//! `filename` names ([`filename`]: a local file or a remote namespace), generating I/O ([`workload`]), `verify=crc32c` ([`verify`]), the engine
//! interface and registry ([`engine`]) with the engines (`psync`/`sync`/`null`,
//! `io_uring` for local files, `qpath` and `qpath-passthru` over our NVMe/TCP host),
//! the job threads ([`mod@run`]), statistics ([`stats`]), fio 3.33's text and JSON
//! reports ([`report`]), the physical baseline measured in the same run ([`baseline`])
//! and what `qpath bench` does end to end ([`cmd`]), with the target it embeds when a job
//! names none ([`embedded_target`]).
//!
//! ```text
//!  job file ─► job::JobFile ──► run::run_jobs ──────────────► report::Report ─► text / JSON
//!  (fio ini)   (JobSpec per     │ per job thread:             (fio's merge
//!               thread)         │  workload::Workload ─┐       and group math)
//!                               │  verify              ├─► engine::Engine (psync, sync,
//!                               │  stats::ThreadStat ◄─┘      io_uring, qpath ...)
//!                               └ engine::EngineRegistry picks the engine per job
//! ```
//!
//! Parse a job file and look at the resolved job threads:
//!
//! ```
//! use qpath_bench::job::JobFile;
//!
//! let text = "\
//! [global]
//! rw=randread
//! bs=4k
//! iodepth=32
//! size=64m
//!
//! [reader]
//! filename=nvme+tcp://127.0.0.1:4420/nqn.2016-06.io.spdk:cnode1/1
//! numjobs=2
//!
//! [writer]
//! stonewall
//! rw=randwrite
//! verify=crc32c
//! filename=/tmp/qpath-example.dat
//! ";
//! let file = JobFile::parse(text, "example.fio")?;
//! print!("{}", file.describe());
//! assert_eq!(file.jobs.len(), 3);
//! assert_eq!(file.jobs[2].place.groupid, 1);
//! assert!(file.jobs[0].target.is_remote());
//! # Ok::<(), qpath_bench::Error>(())
//! ```
//!
//! Running a job file with the local engines only:
//!
//! ```no_run
//! use qpath_bench::{BenchArgs, EngineRegistry, RunOptions};
//!
//! let args = BenchArgs::for_jobfile("examples/local-file.fio");
//! let outcome = qpath_bench::run(&args, &EngineRegistry::with_local_engines(), &RunOptions::default())?;
//! std::process::exit(if outcome.failed { 1 } else { 0 });
//! # Ok::<(), qpath_bench::Error>(())
//! ```
//!
//! What `qpath bench examples/quickstart.fio` does (embedded target, baseline, every engine):
//!
//! ```no_run
//! let outcome = qpath_bench::cmd::bench(&qpath_bench::cmd::CmdArgs::for_jobfile("examples/quickstart.fio"))?;
//! assert!(!outcome.failed);
//! # Ok::<(), qpath_bench::Error>(())
//! ```
//!
//! Other crates import this package as `bench` (the workspace renames `qpath-bench`);
//! doctests and integration tests use `qpath_bench`.
//!
//! # Plugging in an engine
//!
//! Implement [`engine::EngineFactory`] and [`engine::Engine`] and register the factory
//! in an [`engine::EngineRegistry`] under the name the resolver maps to. Engines that
//! need their own buffer type install it in `prepare` with [`io_u::IoBuf::foreign`]
//! (the io_uring and NVMe/TCP engines install `uring::IoBuf`s that move into the ring
//! or the host and back: [`engine::uring_buf`]). CPU pinning and thread CPU time come
//! from [`run::RunOptions`] hooks ([`cmd::pin_hook`] pins with `uring`).
//!
//! # Where it differs from fio
//!
//! - Percentiles come from an HDR histogram (~0.1% resolution) instead of fio's
//!   log-linear buckets (~1.6%); same selection rule, slightly different values.
//! - Jobs always run as threads (`Starting N threads`); the status line goes to stderr
//!   and only when it is a terminal; times are printed in UTC; JSON `eta` is 0;
//!   `Disk stats`/`disk_util` are not produced; CPU times come from
//!   `/proc/thread-self` at 10 ms resolution unless a better hook is given.
//! - `verify=crc32c` uses our own header layout (not fio's), so data written by fio
//!   with verify cannot be verified by qpath and vice versa.
//!
//! # What is missing
//!
//! - fio features not implemented: trim workloads, `rw=...:N` suffixes, several files
//!   per job, `bssplit`, `rate*`, `thinktime`, `%` sizes, `include`, `unified_rw_reporting`,
//!   `latency_target`, `offset_increment`, log files, terse output, and verify methods
//!   other than crc32c. Unknown options are an error, as in fio (`--lenient` warns and
//!   runs without them); options accepted without effect are listed as notes.
//! - `cpus_allowed` with several CPUs (but not all) pins each thread to one of them in
//!   turn: `uring` pins to single CPUs only.

#![forbid(unsafe_code)]

pub mod baseline;
pub mod cmd;
pub mod cpu;
pub mod embedded_target;
pub mod engine;
pub mod error;
pub mod filename;
pub mod io_u;
pub mod job;
pub mod layout;
pub mod observe;
pub mod report;
pub mod run;
pub mod stats;
pub mod status;
pub mod verify;
pub mod workload;

use std::io::Write;
use std::path::PathBuf;

pub use baseline::Physical;
pub use engine::{Capabilities, Engine, EngineCtx, EngineFactory, EngineRegistry, FileInfo, Queued};
pub use error::{Error, ErrorKind, Result};
pub use filename::{RemoteTarget, Target, TargetKind};
pub use io_u::{Ddir, ForeignBuf, IoBuf, IoError, IoResult, IoU};
pub use job::{JobFile, JobSpec};
pub use report::{Baseline, Report};
pub use run::{RunOptions, RunResult, StatusMode};

/// Report formats (`--output-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputFormats {
    /// fio's normal text.
    pub normal: bool,
    /// fio's JSON.
    pub json: bool,
    /// JSON with latency histogram bins (`json+`).
    pub json_plus: bool,
}

impl OutputFormats {
    /// Parse `normal`, `json`, `json+` or a comma-separated list of them.
    pub fn parse(text: &str) -> Result<OutputFormats> {
        let mut f = OutputFormats::default();
        for part in text.split(',').map(str::trim) {
            match part {
                "normal" => f.normal = true,
                "json" => f.json = true,
                "json+" => f.json_plus = true,
                "terse" => {
                    return Err(Error::new(ErrorKind::Unsupported, "--output-format=terse is not supported"));
                }
                other => {
                    return Err(Error::new(
                        ErrorKind::Option,
                        format!("--output-format={other}: expected normal, json or json+"),
                    ));
                }
            }
        }
        Ok(f)
    }
}

/// Arguments of `qpath bench` (a `clap` argument group the bin can flatten).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BenchArgs {
    /// fio job file to run.
    pub jobfile: Option<PathBuf>,
    /// normal, json, json+ (comma-separated for several).
    #[arg(long = "output-format", default_value = "normal")]
    pub output_format: String,
    /// Write the report to this file instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Warn about unknown job options and run without them, instead of refusing the job
    /// file (fio refuses them: `fio: bad option`). The jobs then differ from what the
    /// file asks for.
    #[arg(long)]
    pub lenient: bool,
    /// Unknown job options are an error (the default; kept for scripts that pass it).
    #[arg(long, hide = true, conflicts_with = "lenient")]
    pub strict: bool,
    /// fio-style command-line jobs after `--`: `-- --name=a --rw=randread --size=1g`.
    #[arg(last = true)]
    pub job_args: Vec<String>,
}

impl BenchArgs {
    /// Arguments for running `path` with normal output to stdout.
    pub fn for_jobfile(path: impl Into<PathBuf>) -> BenchArgs {
        BenchArgs { jobfile: Some(path.into()), output_format: "normal".into(), ..BenchArgs::default() }
    }

    /// Load the job file or the command-line jobs; unknown options are an error unless
    /// `--lenient`.
    pub fn load_jobs(&self) -> Result<JobFile> {
        let file = match (&self.jobfile, self.job_args.is_empty()) {
            (Some(p), true) => JobFile::load(p)?,
            (None, false) => JobFile::from_args(&self.job_args)?,
            (Some(_), false) => {
                return Err(Error::new(
                    ErrorKind::JobFile,
                    "give either a job file or command-line jobs after --, not both",
                ));
            }
            (None, true) => return Err(Error::new(ErrorKind::JobFile, "no job file given")),
        };
        if !self.lenient {
            file.check_strict()?;
        }
        Ok(file)
    }
}

/// What [`run()`] hands back.
#[derive(Debug)]
pub struct Outcome {
    /// The report that was printed.
    pub report: Report,
    /// Whether some job failed (exit non-zero).
    pub failed: bool,
}

/// Run a benchmark end to end: load the jobs, refuse unknown options (or warn about
/// them under `--lenient`), print fio's job header lines, run, print the reports.
/// Notes, warnings and the status line go to stderr.
///
/// A caller that provides an embedded target loads the jobs first, points the jobs
/// without a filename at it, then calls [`run_file`]:
///
/// ```no_run
/// # use qpath_bench::*;
/// # fn start_embedded_target() -> String { String::new() }
/// # let (args, registry) = (BenchArgs::for_jobfile("examples/quickstart.fio"), EngineRegistry::new());
/// let mut file = args.load_jobs()?;
/// if file.needs_embedded_target() {
///     let uri = start_embedded_target(); // "nvme+tcp://127.0.0.1:4420/<nqn>/1"
///     file.use_embedded_target(&uri)?;
/// }
/// let outcome = run_file(&file, &args, &registry, &RunOptions::default(), &Baseline::spdk_loopback_2026_11())?;
/// # Ok::<(), Error>(())
/// ```
pub fn run(args: &BenchArgs, registry: &EngineRegistry, opts: &RunOptions) -> Result<Outcome> {
    let file = args.load_jobs()?;
    run_file(&file, args, registry, opts, &[])
}

/// [`run()`] for an already loaded job file, with optional reference numbers for the
/// `qpath` JSON key ([`Baseline::spdk_loopback_2026_11`] for remote targets).
pub fn run_file(
    file: &JobFile,
    args: &BenchArgs,
    registry: &EngineRegistry,
    opts: &RunOptions,
    baselines: &[Baseline],
) -> Result<Outcome> {
    let cmp = Comparisons { references: baselines.to_vec(), ..Comparisons::default() };
    run_file_compared(file, args, registry, opts, &cmp)
}

/// What a report compares its jobs with, and says about the run.
#[derive(Debug, Clone, Default)]
pub struct Comparisons {
    /// Numbers measured elsewhere (SPDK), matched by job shape.
    pub references: Vec<Baseline>,
    /// The physical baseline of this run ([`baseline::measure`]).
    pub physical: Option<Physical>,
    /// Which target the jobs used, for the report.
    pub target: Option<String>,
}

/// [`run_file`] with a physical baseline and a target description ([`cmd::bench`]
/// uses it).
pub fn run_file_compared(
    file: &JobFile,
    args: &BenchArgs,
    registry: &EngineRegistry,
    opts: &RunOptions,
    cmp: &Comparisons,
) -> Result<Outcome> {
    let formats = OutputFormats::parse(&args.output_format)?;
    let mut stderr = std::io::stderr();
    if !args.lenient {
        file.check_strict()?;
    } else if let Some(line) = file.unknown_line() {
        let _ = writeln!(stderr, "warning: unknown options ignored (--lenient), the jobs run without them: {line}");
    }
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| Error::io(format!("create {}", p.display()), e))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let write_err = |e| Error::io("write report", e);
    let version = report::version_string();
    if formats.normal {
        let mut names = Vec::with_capacity(file.jobs.len());
        for j in &file.jobs {
            names.push(registry.resolve(j)?.factory.name().to_string());
        }
        let pairs: Vec<(&JobSpec, &str)> = file.jobs.iter().zip(names.iter().map(String::as_str)).collect();
        let headers = report::text::job_headers(&pairs, &version);
        out.write_all(filename::redact_secrets(&headers).as_bytes()).map_err(write_err)?;
        out.flush().map_err(write_err)?;
    }
    let result = run::run_jobs(file, registry, opts, &mut stderr)?;
    for j in &result.jobs {
        if let Some(e) = &j.outcome.error {
            let _ = writeln!(
                stderr,
                "qpath bench: job {}[{}]: error {}: {}",
                j.spec.name,
                j.spec.place.clone,
                e.errno,
                filename::redact_secrets(&e.message)
            );
        }
    }
    let mut rep = Report::from_run(file, &result);
    rep.baselines.clone_from(&cmp.references);
    rep.physical = cmp.physical;
    rep.target.clone_from(&cmp.target);
    // The reports show each job's filename: a remote URI's secrets are left out.
    if formats.json || formats.json_plus {
        let json = report::json::render(&rep, formats.json_plus);
        out.write_all(filename::redact_secrets(&json).as_bytes()).map_err(write_err)?;
    }
    if formats.normal {
        out.write_all(filename::redact_secrets(&report::text::render(&rep)).as_bytes()).map_err(write_err)?;
    }
    out.flush().map_err(write_err)?;
    Ok(Outcome { failed: result.failed(), report: rep })
}

/// The README's host API example, run as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn cli_arguments() {
        let c = Cli::try_parse_from(["bench", "job.fio", "--output-format=json+", "--output", "o.json", "--lenient"])
            .unwrap();
        assert_eq!(c.args.jobfile.as_deref(), Some(std::path::Path::new("job.fio")));
        assert_eq!(c.args.output_format, "json+");
        assert!(c.args.lenient);
        assert!(Cli::try_parse_from(["bench", "job.fio", "--strict"]).unwrap().args.strict, "still accepted");
        assert!(Cli::try_parse_from(["bench", "job.fio", "--strict", "--lenient"]).is_err());
        let c =
            Cli::try_parse_from(["bench", "--", "--name=a", "--rw=read", "--size=1m", "--filename=/tmp/x"]).unwrap();
        assert!(c.args.jobfile.is_none());
        let f = c.args.load_jobs().unwrap();
        assert_eq!(f.jobs[0].name, "a");
        assert!(Cli::try_parse_from(["bench"]).unwrap().args.load_jobs().is_err());
    }

    #[test]
    fn unknown_options_are_refused_unless_lenient() {
        let c = Cli::try_parse_from([
            "bench",
            "--",
            "--name=a",
            "--rw=read",
            "--size=1m",
            "--filename=/tmp/x",
            "--bogus=1",
        ])
        .unwrap();
        let e = c.args.load_jobs().unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownOption);
        assert!(e.to_string().contains("bogus=1") && e.to_string().contains("--lenient"), "{e}");
        let mut lenient = c.args.clone();
        lenient.lenient = true;
        assert_eq!(lenient.load_jobs().unwrap().unknown.len(), 1, "--lenient loads it, noting the option");
    }

    #[test]
    fn output_formats() {
        let f = OutputFormats::parse("normal,json").unwrap();
        assert!(f.normal && f.json && !f.json_plus);
        assert!(OutputFormats::parse("json+").unwrap().json_plus);
        assert_eq!(OutputFormats::parse("terse").unwrap_err().kind, ErrorKind::Unsupported);
        assert!(OutputFormats::parse("xml").is_err());
    }
}
