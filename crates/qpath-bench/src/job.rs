//! Job files: fio's ini format turned into resolved, per-thread [`JobSpec`]s.
//!
//! Resolution follows fio's `init.c`: a `[global]` section sets defaults for the jobs
//! *after* it; each job section starts from those defaults; `numjobs=N` clones a job
//! N times under the same name; `stonewall` (or `new_group`) starts a new reporting
//! group; `stonewall` also makes the job wait for everything before it.

pub mod ini;
pub mod option;
pub mod value;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

pub use value::CpuSet;

use crate::error::{Error, ErrorKind, Result};
use crate::filename::{Target, TargetKind};

/// Most job threads one run may start (fio's REAL_MAX_JOBS is 4096).
pub const THREADS_MAX: usize = 4096;
/// Largest job file we read.
pub const JOBFILE_MAX_BYTES: u64 = 4 << 20;
/// fio's default `randseed` (FIO_RANDSEED).
pub const DEFAULT_RANDSEED: u64 = 0xb189_9bed;

/// Sequential or random offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwPattern {
    /// `read`, `write`, `rw`.
    Sequential,
    /// `randread`, `randwrite`, `randrw`.
    Random,
}

/// Which data directions a job issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwDirs {
    /// Reads only.
    Read,
    /// Writes only.
    Write,
    /// Both, mixed by `rwmixread`.
    Mixed,
}

/// `verify=` method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyKind {
    /// No verification (default).
    None,
    /// A header with a CRC32C of the block ([`crate::verify`]).
    Crc32c,
}

/// `cpus_allowed_policy=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuPolicy {
    /// Every clone may run on all of `cpus_allowed` (fio's default).
    Shared,
    /// Clone *i* runs on the *i*-th CPU of the set (round robin).
    Split,
}

/// Where a resolved job sits in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobPlace {
    /// 1-based thread number across the run (fio's `thread_number`).
    pub thread_number: usize,
    /// 0 for the job itself, 1.. for its `numjobs` clones (fio's `subjob_number`).
    pub clone: usize,
    /// Reporting group (fio's `groupid`).
    pub groupid: usize,
    /// Stonewall batch: batches run one after the other.
    pub batch: usize,
}

/// One job thread's fully resolved options. Defaults are fio 3.33's.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// Job name (section name, or `name=`).
    pub name: String,
    /// `description=`.
    pub description: Option<String>,
    /// `ioengine=` as written; `None` lets the resolver pick (psync locally, qpath remotely).
    pub ioengine: Option<String>,
    /// Sequential or random.
    pub rw_pattern: RwPattern,
    /// Directions.
    pub rw_dirs: RwDirs,
    /// Percentage of reads in a mixed job (`rwmixread`, default 50).
    pub rwmix_read: u32,
    /// Block size range per direction, `[read, write]`, each `(min, max)` bytes.
    pub bs: [(u64, u64); 2],
    /// `iodepth` (default 1).
    pub iodepth: u32,
    /// `iodepth_batch_submit` after fixup (1..=iodepth).
    pub iodepth_batch_submit: u32,
    /// `iodepth_batch_complete_min` (default 1).
    pub iodepth_batch_complete_min: u32,
    /// `iodepth_batch_complete_max` after fixup (>= min).
    pub iodepth_batch_complete_max: u32,
    /// `numjobs` of the section this thread came from.
    pub numjobs: u32,
    /// `runtime`; `None` = until `size` is done.
    pub runtime: Option<Duration>,
    /// `time_based`: keep going until `runtime` even after `size` is done.
    pub time_based: bool,
    /// `ramp_time`: run this long before statistics start.
    pub ramp_time: Duration,
    /// `size`: bytes of I/O per pass.
    pub size: Option<u64>,
    /// `filesize`: size of the file to lay out.
    pub filesize: Option<u64>,
    /// `offset`: start of the I/O region.
    pub offset: u64,
    /// `direct` (O_DIRECT).
    pub direct: bool,
    /// `filename` exactly as written.
    pub filename: Option<String>,
    /// `directory`.
    pub directory: Option<String>,
    /// Parsed target (filled in by resolution; `directory` + job name when no filename).
    pub target: Target,
    /// `cpus_allowed`.
    pub cpus_allowed: Option<CpuSet>,
    /// `cpus_allowed_policy`.
    pub cpus_allowed_policy: CpuPolicy,
    /// `group_reporting`.
    pub group_reporting: bool,
    /// `randrepeat` (default true): same offsets every run.
    pub randrepeat: bool,
    /// `randseed`.
    pub randseed: u64,
    /// `norandommap`: random offsets may repeat within a pass.
    pub norandommap: bool,
    /// `thread` as written (jobs always run as threads).
    pub thread: bool,
    /// `verify`.
    pub verify: VerifyKind,
    /// `do_verify` (default true): read back written blocks after the write phase.
    pub do_verify: bool,
    /// `verify_fatal`: stop the job at the first verify failure.
    pub verify_fatal: bool,
    /// `lat_percentiles`.
    pub lat_percentiles: bool,
    /// `clat_percentiles` (default true).
    pub clat_percentiles: bool,
    /// `slat_percentiles`.
    pub slat_percentiles: bool,
    /// `percentile_list`, sorted.
    pub percentile_list: Vec<f64>,
    /// Decimals used when printing percentiles (fio's `percentile_precision`).
    pub percentile_precision: usize,
    /// `stonewall`.
    pub stonewall: bool,
    /// `new_group`.
    pub new_group: bool,
    /// `loops` (default 1).
    pub loops: u32,
    /// `invalidate` (default true): drop the page cache of a local file's I/O range
    /// before the job, as fio does, so buffered reads start from the storage.
    pub invalidate: bool,
    /// `fsync=N`: flush after every N writes (0 = never).
    pub fsync_every: u32,
    /// `zero_buffers`.
    pub zero_buffers: bool,
    /// `refill_buffers`.
    pub refill_buffers: bool,
    /// `kb_base` (1024 or 1000).
    pub kb_base: u32,
    /// `significant_figures` for the text report (default 4).
    pub sig_figs: u32,
    /// Engine-specific options (`hipri`, `fixedbufs`, `hostnqn`, ...), verbatim.
    pub engine_options: Vec<(String, Option<String>)>,
    /// This job section's own options, canonical names, for JSON `job options`.
    pub options: Vec<(String, Option<String>)>,
    /// Position in the run.
    pub place: JobPlace,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            name: String::new(),
            description: None,
            ioengine: None,
            rw_pattern: RwPattern::Sequential,
            rw_dirs: RwDirs::Read,
            rwmix_read: 50,
            bs: [(4096, 4096); 2],
            iodepth: 1,
            iodepth_batch_submit: 1,
            iodepth_batch_complete_min: 1,
            iodepth_batch_complete_max: 0,
            numjobs: 1,
            runtime: None,
            time_based: false,
            ramp_time: Duration::ZERO,
            size: None,
            filesize: None,
            offset: 0,
            direct: false,
            filename: None,
            directory: None,
            target: Target { kind: TargetKind::Embedded, raw: String::new() },
            cpus_allowed: None,
            cpus_allowed_policy: CpuPolicy::Shared,
            group_reporting: false,
            randrepeat: true,
            randseed: DEFAULT_RANDSEED,
            norandommap: false,
            thread: false,
            verify: VerifyKind::None,
            do_verify: true,
            verify_fatal: false,
            lat_percentiles: false,
            clat_percentiles: true,
            slat_percentiles: false,
            percentile_list: vec![
                1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99,
            ],
            percentile_precision: 2,
            stonewall: false,
            new_group: false,
            loops: 1,
            invalidate: true,
            fsync_every: 0,
            zero_buffers: false,
            refill_buffers: false,
            kb_base: 1024,
            sig_figs: 4,
            engine_options: Vec::new(),
            options: Vec::new(),
            place: JobPlace::default(),
        }
    }
}

impl JobSpec {
    /// fio's `ddir_str` for this job: `read`, `randwrite`, `rw`, `randrw`...
    pub fn rw_str(&self) -> &'static str {
        match (self.rw_pattern, self.rw_dirs) {
            (RwPattern::Sequential, RwDirs::Read) => "read",
            (RwPattern::Sequential, RwDirs::Write) => "write",
            (RwPattern::Sequential, RwDirs::Mixed) => "rw",
            (RwPattern::Random, RwDirs::Read) => "randread",
            (RwPattern::Random, RwDirs::Write) => "randwrite",
            (RwPattern::Random, RwDirs::Mixed) => "randrw",
        }
    }

    /// Whether the job issues reads.
    pub fn reads(&self) -> bool {
        self.rw_dirs != RwDirs::Write
    }

    /// Whether the job issues writes.
    pub fn writes(&self) -> bool {
        self.rw_dirs != RwDirs::Read
    }

    /// Percentage of reads actually issued (100 for read-only, 0 for write-only).
    pub fn effective_rwmix_read(&self) -> u32 {
        match self.rw_dirs {
            RwDirs::Read => 100,
            RwDirs::Write => 0,
            RwDirs::Mixed => self.rwmix_read,
        }
    }

    /// Largest block size the job may issue in any direction.
    pub fn max_bs(&self) -> u64 {
        self.bs[0].1.max(self.bs[1].1)
    }

    /// Smallest block size the job may issue in any direction it uses.
    pub fn min_bs(&self) -> u64 {
        match self.rw_dirs {
            RwDirs::Read => self.bs[0].0,
            RwDirs::Write => self.bs[1].0,
            RwDirs::Mixed => self.bs[0].0.min(self.bs[1].0),
        }
    }

    /// The value of an engine option (`Some(None)` for a bare flag).
    pub fn engine_option(&self, name: &str) -> Option<Option<&str>> {
        self.engine_options.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_deref())
    }

    /// The CPUs this thread may run on, after `cpus_allowed_policy`.
    pub fn cpus_for_thread(&self) -> Option<Vec<usize>> {
        let set = self.cpus_allowed.as_ref()?;
        match self.cpus_allowed_policy {
            CpuPolicy::Shared => Some(set.cpus.clone()),
            CpuPolicy::Split => Some(vec![set.cpus[self.place.clone % set.cpus.len()]]),
        }
    }

    fn fixup(&mut self) -> std::result::Result<(), String> {
        // fio fixup_options(): batch 0 or > iodepth means iodepth; max batch >= min batch.
        if self.iodepth_batch_submit == 0 || self.iodepth_batch_submit > self.iodepth {
            self.iodepth_batch_submit = self.iodepth;
        }
        if self.iodepth_batch_complete_min > self.iodepth_batch_complete_max {
            self.iodepth_batch_complete_max = self.iodepth_batch_complete_min;
        }
        if self.time_based && self.runtime.is_none() {
            return Err("time_based needs runtime=".into());
        }
        if self.verify == VerifyKind::Crc32c {
            let used: Vec<(u64, u64)> = match self.rw_dirs {
                RwDirs::Read => vec![self.bs[0]],
                RwDirs::Write => vec![self.bs[1]],
                RwDirs::Mixed => vec![self.bs[0], self.bs[1]],
            };
            if used.iter().any(|&(lo, hi)| lo != hi) || used.windows(2).any(|w| w[0] != w[1]) {
                return Err("verify=crc32c needs one fixed block size for all directions".into());
            }
            if used[0].0 < crate::verify::HEADER_LEN as u64 {
                return Err(format!("verify=crc32c needs bs >= {} bytes for its header", crate::verify::HEADER_LEN));
            }
        }
        for (lo, hi) in self.bs {
            if hi % lo != 0 && lo != hi {
                return Err(format!("bsrange {lo}-{hi}: the maximum must be a multiple of the minimum"));
            }
        }
        Ok(())
    }
}

/// An option qpath does not know, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownOption {
    /// Section name.
    pub section: String,
    /// `key` or `key=value` as written.
    pub text: String,
    /// 1-based line (0 for command-line options).
    pub line: usize,
}

/// A parsed and resolved job file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFile {
    /// Where it came from (path or `<string>`), for messages.
    pub origin: String,
    /// Options from `[global]` sections, canonical names, for JSON `global options`.
    pub global_options: Vec<(String, Option<String>)>,
    /// One entry per job thread, in start order (clones follow their job).
    pub jobs: Vec<JobSpec>,
    /// Options nobody understood.
    pub unknown: Vec<UnknownOption>,
    /// Options accepted without effect, one line each.
    pub notes: Vec<String>,
}

struct Collected {
    canonical: &'static str,
    value: Option<String>,
    line: usize,
    section: String,
}

impl JobFile {
    /// Read and resolve a job file.
    pub fn load(path: &Path) -> Result<JobFile> {
        let origin = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("job file {origin}"), e))?;
        if meta.len() > JOBFILE_MAX_BYTES {
            return Err(Error::new(ErrorKind::JobFile, format!("{origin} is larger than {JOBFILE_MAX_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("job file {origin}"), e))?;
        Self::parse(&text, &origin)
    }

    /// Resolve job-file text; `origin` names it in messages.
    pub fn parse(text: &str, origin: &str) -> Result<JobFile> {
        Self::from_sections(ini::parse(text, origin)?, origin)
    }

    /// Resolve fio-style command-line jobs (`--name=a --rw=read ...`).
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<JobFile> {
        Self::from_sections(ini::parse_args(args)?, "<command line>")
    }

    fn from_sections(sections: Vec<ini::Section>, origin: &str) -> Result<JobFile> {
        let mut file = JobFile {
            origin: origin.to_string(),
            global_options: Vec::new(),
            jobs: Vec::new(),
            unknown: Vec::new(),
            notes: Vec::new(),
        };
        let mut globals: Vec<Collected> = Vec::new();
        let mut specs: Vec<JobSpec> = Vec::new();
        for sec in sections {
            let mut own = Vec::new();
            for opt in sec.options {
                match option::canonical(&opt.key) {
                    Some(c) => own.push(Collected {
                        canonical: c,
                        value: opt.value,
                        line: opt.line,
                        section: sec.name.clone(),
                    }),
                    None => file.unknown.push(UnknownOption {
                        section: sec.name.clone(),
                        text: match &opt.value {
                            Some(v) => format!("{}={v}", opt.key),
                            None => opt.key.clone(),
                        },
                        line: opt.line,
                    }),
                }
            }
            // fio `sort_options`: within a section, kb_base/unit_base/cpus_allowed_policy
            // are parsed first and filename last; the JSON option lists keep this order.
            own.sort_by_key(|c| -option::prio(c.canonical));
            if sec.global {
                file.global_options.extend(own.iter().map(|c| (c.canonical.to_string(), c.value.clone())));
                globals.extend(own);
                continue;
            }
            let mut spec = JobSpec { name: sec.name.clone(), ..JobSpec::default() };
            for c in globals.iter().chain(own.iter()) {
                let applied = option::apply(&mut spec, c.canonical, c.value.as_deref()).map_err(|why| {
                    let kind = if why.contains("not supported") { ErrorKind::Unsupported } else { ErrorKind::Option };
                    let shown = match &c.value {
                        Some(v) => format!("{}={v}", c.canonical),
                        None => c.canonical.to_string(),
                    };
                    Error::new(kind, format!("{origin} line {} [{}] {shown}: {why}", c.line, c.section))
                })?;
                if let option::Applied::NoEffect(why) = applied {
                    let note = format!("{} has no effect: {why}", c.canonical);
                    if !file.notes.contains(&note) {
                        file.notes.push(note);
                    }
                }
            }
            spec.options = own.iter().map(|c| (c.canonical.to_string(), c.value.clone())).collect();
            spec.fixup().map_err(|why| Error::new(ErrorKind::Option, format!("{origin} [{}]: {why}", sec.name)))?;
            specs.push(spec);
        }
        file.jobs = expand(specs)?;
        if file.jobs.is_empty() {
            return Err(Error::new(ErrorKind::JobFile, format!("{origin}: no jobs defined")));
        }
        Ok(file)
    }

    /// Error out if there are unknown options, as fio does (`fio: bad option`): a job
    /// run without an option it asks for is a different workload (`qpath bench`
    /// refuses unless `--lenient`).
    pub fn check_strict(&self) -> Result<()> {
        match self.unknown_line() {
            Some(line) => Err(Error::new(
                ErrorKind::UnknownOption,
                format!(
                    "{line} (qpath bench refuses options it does not know, as fio does; --lenient warns and runs without them)"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Every unknown option with its section and line, on one line
    /// (`job.fio: [global] foo=1 (line 2), [a] bar (line 6)`), or `None` if there are none.
    pub fn unknown_line(&self) -> Option<String> {
        if self.unknown.is_empty() {
            return None;
        }
        let list: Vec<String> = self
            .unknown
            .iter()
            .map(|u| {
                if u.line > 0 {
                    format!("[{}] {} (line {})", u.section, u.text, u.line)
                } else {
                    format!("[{}] {}", u.section, u.text)
                }
            })
            .collect();
        Some(format!("{}: {}", self.origin, list.join(", ")))
    }

    /// Whether some job has neither `filename` nor `directory`, so the caller must start
    /// an embedded target (the `qpath` bin does).
    pub fn needs_embedded_target(&self) -> bool {
        self.jobs.iter().any(|j| j.target.kind == TargetKind::Embedded)
    }

    /// Point every job without `filename`/`directory` at `target` (e.g. the embedded
    /// target the `qpath` bin just started: `nvme+tcp://127.0.0.1:4420/<nqn>/1`).
    /// Returns how many job threads were changed.
    pub fn use_embedded_target(&mut self, target: &str) -> Result<usize> {
        let t = Target::parse(Some(target))?;
        if !t.is_remote() {
            return Err(Error::new(
                ErrorKind::Target,
                format!("embedded target '{target}' must be a remote NVMe/TCP target"),
            ));
        }
        let mut n = 0;
        for j in &mut self.jobs {
            if j.target.kind == TargetKind::Embedded {
                j.target = t.clone();
                n += 1;
            }
        }
        Ok(n)
    }

    /// Cap every job's `runtime` (and `ramp_time`) at `cap`, for smoke tests of long job
    /// files (`qpath bench --runtime-cap`). Jobs without a runtime get one, so size-bound
    /// jobs stop at the cap too, as fio's `runtime` stops them. Returns how many job
    /// threads changed; a note says so.
    pub fn cap_runtime(&mut self, cap: Duration) -> usize {
        let mut n = 0;
        for j in &mut self.jobs {
            let before = (j.runtime, j.ramp_time);
            j.runtime = Some(j.runtime.map_or(cap, |r| r.min(cap)));
            j.ramp_time = j.ramp_time.min(cap);
            if (j.runtime, j.ramp_time) != before {
                n += 1;
            }
        }
        if n > 0 {
            self.notes
                .push(format!("runtime capped at {:.1} s for {n} job thread(s) (--runtime-cap)", cap.as_secs_f64()));
        }
        n
    }

    /// A short table of the resolved job threads, one line each.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for j in &self.jobs {
            let bs = if j.bs[0] == j.bs[1] && j.bs[0].0 == j.bs[0].1 {
                j.bs[0].0.to_string()
            } else {
                format!("{}-{}/{}-{}", j.bs[0].0, j.bs[0].1, j.bs[1].0, j.bs[1].1)
            };
            let target = match &j.target.kind {
                TargetKind::Local(p) => p.display().to_string(),
                TargetKind::Remote(r) => format!("nvme+tcp://{}:{}/{}/{}", r.traddr, r.trsvcid, r.subnqn, r.nsid),
                TargetKind::Embedded => "(embedded target)".into(),
            };
            let _ = writeln!(
                s,
                "{}[{}] g={} rw={} bs={} iodepth={} engine={} target={}",
                j.name,
                j.place.clone,
                j.place.groupid,
                j.rw_str(),
                bs,
                j.iodepth,
                j.ioengine.as_deref().unwrap_or("(default)"),
                target
            );
        }
        s
    }
}

/// Clone each job `numjobs` times and assign thread numbers, groups and batches (fio
/// `add_job`: clones inherit the job's group; `stonewall`/`new_group` on a job start a
/// new group if the current one already has jobs).
fn expand(specs: Vec<JobSpec>) -> Result<Vec<JobSpec>> {
    let total: usize = specs.iter().map(|s| s.numjobs as usize).sum();
    if total > THREADS_MAX {
        return Err(Error::new(
            ErrorKind::Option,
            format!("{total} job threads requested; the limit is {THREADS_MAX}"),
        ));
    }
    let mut out = Vec::with_capacity(total);
    let (mut groupid, mut group_jobs) = (0usize, 0usize);
    let (mut batch, mut batch_jobs) = (0usize, 0usize);
    for spec in specs {
        if (spec.stonewall || spec.new_group) && group_jobs > 0 {
            groupid += 1;
            group_jobs = 0;
        }
        if spec.stonewall && batch_jobs > 0 {
            batch += 1;
            batch_jobs = 0;
        }
        for clone in 0..spec.numjobs as usize {
            let mut j = spec.clone();
            j.place = JobPlace { thread_number: out.len() + 1, clone, groupid, batch };
            j.target = resolve_target(&j)?;
            group_jobs += 1;
            batch_jobs += 1;
            out.push(j);
        }
    }
    Ok(out)
}

fn resolve_target(j: &JobSpec) -> Result<Target> {
    let with_job = |e: Error| Error::new(e.kind, format!("job {}: {}", j.name, e.context));
    match (&j.filename, &j.directory) {
        (Some(f), Some(d)) => {
            let t = Target::parse(Some(f)).map_err(with_job)?;
            match t.kind {
                TargetKind::Local(p) if p.is_relative() => {
                    Ok(Target { kind: TargetKind::Local(Path::new(d).join(p)), raw: t.raw })
                }
                _ => Ok(t),
            }
        }
        (Some(f), None) => Target::parse(Some(f)).map_err(with_job),
        // fio's default file name: $jobname.$jobnum.$filenum in `directory`.
        (None, Some(d)) => {
            let p = Path::new(d).join(format!("{}.{}.0", j.name, j.place.clone));
            Ok(Target { raw: p.display().to_string(), kind: TargetKind::Local(p) })
        }
        (None, None) => Target::parse(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_000: &str = "[global]\nioengine=libaio\nrandrepeat=1\ndirect=1\ngroup_reporting\nblocksize=512k\n\
        iodepth=1\nnumjobs=1\nruntime=15\ntime_based\nrw=randread\n\n[JOB1]\ncpus_allowed=1\nfilename=/dev/nvme4n1\n";

    #[test]
    fn seed_000_resolves() {
        let f = JobFile::parse(SEED_000, "seed").unwrap();
        assert_eq!(f.jobs.len(), 1);
        let j = &f.jobs[0];
        assert_eq!(j.name, "JOB1");
        assert_eq!(j.bs, [(512 << 10, 512 << 10); 2]);
        assert_eq!(j.runtime, Some(Duration::from_secs(15)));
        assert!(j.time_based && j.direct && j.group_reporting);
        assert_eq!(j.rw_str(), "randread");
        assert_eq!(j.cpus_allowed.as_ref().unwrap().cpus, vec![1]);
        assert_eq!(j.target.local_path(), Some(Path::new("/dev/nvme4n1")));
        // JSON job options are the job section's own, with canonical names.
        assert_eq!(j.options[1].0, "filename");
        // bare flags are in the global list with no value
        assert!(f.global_options.iter().any(|(k, v)| k == "time_based" && v.is_none()));
        assert!(f.unknown.is_empty());
    }

    #[test]
    fn numjobs_stonewall_and_groups() {
        let text = "[global]\nsize=1m\nnumjobs=2\nfilename=/tmp/x\n[a]\nrw=write\n[b]\nstonewall\nrw=read\n\
            [c]\nnew_group\nrw=read\n";
        let f = JobFile::parse(text, "t").unwrap();
        let places: Vec<(&str, usize, usize, usize, usize)> = f
            .jobs
            .iter()
            .map(|j| (j.name.as_str(), j.place.thread_number, j.place.clone, j.place.groupid, j.place.batch))
            .collect();
        assert_eq!(
            places,
            vec![
                ("a", 1, 0, 0, 0),
                ("a", 2, 1, 0, 0),
                ("b", 3, 0, 1, 1),
                ("b", 4, 1, 1, 1),
                ("c", 5, 0, 2, 1),
                ("c", 6, 1, 2, 1),
            ]
        );
    }

    #[test]
    fn globals_apply_only_to_later_jobs() {
        let text = "[a]\nfilename=/tmp/x\nsize=1m\n[global]\nbs=8k\n[b]\nfilename=/tmp/x\nsize=1m\n";
        let f = JobFile::parse(text, "t").unwrap();
        assert_eq!(f.jobs[0].bs[0].0, 4096);
        assert_eq!(f.jobs[1].bs[0].0, 8192);
    }

    #[test]
    fn unknown_options_are_reported_and_strict_fails() {
        let text = "[global]\nfoo=1\n[a]\nfilename=/tmp/x\nsize=1m\nbar\n";
        let f = JobFile::parse(text, "t.fio").unwrap();
        let line = f.unknown_line().unwrap();
        assert!(line.contains("[global] foo=1 (line 2)"), "{line}");
        assert!(line.contains("[a] bar (line 6)"), "{line}");
        assert_eq!(f.check_strict().unwrap_err().kind, ErrorKind::UnknownOption);
    }

    #[test]
    fn option_errors_name_line_and_section() {
        let e = JobFile::parse("[a]\nbs=4q\n", "t.fio").unwrap_err();
        assert!(e.context.contains("t.fio line 2 [a] bs=4q"), "{e}");
        let e = JobFile::parse("[a]\nverify=md5\n", "t.fio").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        let e = JobFile::parse("[a]\nrw=randread:8\n", "t.fio").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
    }

    #[test]
    fn batch_fixups_follow_fio() {
        let f =
            JobFile::parse("[a]\niodepth=128\niodepth_batch_submit=0\niodepth_batch_complete_min=32\n", "t").unwrap();
        let j = &f.jobs[0];
        assert_eq!(j.iodepth_batch_submit, 128);
        assert_eq!(j.iodepth_batch_complete_min, 32);
        assert_eq!(j.iodepth_batch_complete_max, 32);
    }

    #[test]
    fn directory_gives_per_clone_files() {
        let f = JobFile::parse("[hogs]\ndirectory=/mnt/big\nnumjobs=2\nfilesize=1m\n", "t").unwrap();
        assert_eq!(f.jobs[0].target.local_path(), Some(Path::new("/mnt/big/hogs.0.0")));
        assert_eq!(f.jobs[1].target.local_path(), Some(Path::new("/mnt/big/hogs.1.0")));
        assert!(!f.needs_embedded_target());
        let mut f = JobFile::parse("[a]\nrw=read\n[b]\nfilename=/tmp/x\nsize=1m\n", "t").unwrap();
        assert!(f.needs_embedded_target());
        assert_eq!(f.use_embedded_target("nvme+tcp://127.0.0.1:4420/nqn.x:y/1").unwrap(), 1);
        assert!(!f.needs_embedded_target());
        assert!(f.jobs[0].target.is_remote() && !f.jobs[1].target.is_remote());
        assert!(f.use_embedded_target("/tmp/file").is_err());
    }

    #[test]
    fn split_cpu_policy() {
        let f = JobFile::parse("[a]\ncpus_allowed=0-1\ncpus_allowed_policy=split\nnumjobs=3\n", "t").unwrap();
        let cpus: Vec<Vec<usize>> = f.jobs.iter().map(|j| j.cpus_for_thread().unwrap()).collect();
        assert_eq!(cpus, vec![vec![0], vec![1], vec![0]]);
    }

    #[test]
    fn verify_needs_fixed_bs() {
        assert!(JobFile::parse("[a]\nrw=randrw\nbs=4k,8k\nverify=crc32c\n", "t").is_err());
        assert!(JobFile::parse("[a]\nrw=randwrite\nbs=4k\nverify=crc32c\n", "t").is_ok());
    }
}
