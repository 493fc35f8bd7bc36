//! Reports: the per-job and per-group numbers fio prints, computed as fio 3.33's
//! `__show_run_stats` computes them, and rendered as fio's text ([`text`]) or
//! JSON ([`json`]) output.

pub mod json;
pub mod num2str;
pub mod text;
pub mod time;

use std::time::SystemTime;

use crate::baseline::Physical;
use crate::job::JobFile;
use crate::run::RunResult;
use crate::stats::ThreadStat;

/// fio's `significant_figures` default.
pub const SIG_FIGS_DEFAULT: u32 = 4;

/// One reported job: a thread, or a `group_reporting` group merged (fio's `thread_stat`).
#[derive(Debug, Clone)]
pub struct JobReport {
    /// Name of the first member.
    pub name: String,
    /// `description`.
    pub description: Option<String>,
    /// Reporting group.
    pub groupid: usize,
    /// Threads merged into this report.
    pub members: usize,
    /// First error code among members (0 = none).
    pub error: i32,
    /// Its message.
    pub verror: String,
    /// Thread id of the first member (fio's `pid=`).
    pub pid: u32,
    /// The job section's own options, for JSON `job options`.
    pub options: Vec<(String, Option<String>)>,
    /// Merged statistics.
    pub stat: ThreadStat,
    /// `clat_percentiles`.
    pub clat_percentiles: bool,
    /// `lat_percentiles`.
    pub lat_percentiles: bool,
    /// `slat_percentiles`.
    pub slat_percentiles: bool,
    /// `percentile_list`.
    pub percentile_list: Vec<f64>,
    /// Decimals for percentiles.
    pub percentile_precision: usize,
    /// `significant_figures`.
    pub sig_figs: u32,
    /// `kb_base`.
    pub kb_base: u32,
    /// Queue depth (fio's `latency_depth`, which is iodepth unless `latency_target` is set).
    pub latency_depth: u32,
    /// Engines used by the members.
    pub engines: Vec<String>,
    /// Targets used by the members (raw filenames, or "(embedded)").
    pub targets: Vec<String>,
    /// rw mode, block size and depth of the first member, for baseline matching.
    pub shape: (String, u64, u32),
    /// Multipath members' policy and per-path counts, merged.
    pub multipath: Option<crate::engine::mpath::MultipathStats>,
    /// What the first member did with its local file's page cache (`invalidate`).
    pub page_cache: Option<crate::run::worker::PageCache>,
    /// A remote job's `fast_io_fail_tmo` in seconds (-1 = off): how long its I/O waits
    /// for a lost target before failing.
    pub fast_io_fail_tmo_s: Option<i64>,
}

/// A remote job's `fast_io_fail_tmo` in seconds, -1 when off (`None`: not remote).
fn fast_io_fail_tmo_s(spec: &crate::job::JobSpec) -> Option<i64> {
    let crate::filename::TargetKind::Remote(r) = &spec.target.kind else { return None };
    let path = r.paths().into_iter().next()?;
    let key = crate::engine::remote::ControllerKey::of(&path, Some(spec));
    let tmo = crate::engine::remote::fast_io_fail_tmo(&key).ok()?;
    Some(tmo.map_or(-1, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)))
}

impl JobReport {
    /// IOPS of the job's own directions: reads for read jobs, writes for write jobs
    /// (a verify read-back is not counted), both for mixed jobs.
    pub fn workload_iops(&self) -> f64 {
        let dirs: &[usize] = match self.shape.0.as_str() {
            "read" | "randread" => &[0],
            "write" | "randwrite" => &[1],
            _ => &[0, 1],
        };
        dirs.iter()
            .map(|&d| &self.stat.dirs[d])
            .filter(|d| d.runtime_ms > 0)
            .map(|d| {
                #[allow(clippy::cast_precision_loss)]
                let iops = 1000.0 * d.total_ios as f64 / d.runtime_ms as f64;
                iops
            })
            .sum()
    }
}

/// A reporting group's totals (fio's `group_run_stats`); index 0 read, 1 write, 2 trim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStats {
    /// Group number.
    pub groupid: usize,
    /// Shortest job runtime, ms.
    pub min_run: [u64; 3],
    /// Longest job runtime, ms.
    pub max_run: [u64; 3],
    /// Slowest job, bytes/s.
    pub min_bw: [u64; 3],
    /// Fastest job, bytes/s.
    pub max_bw: [u64; 3],
    /// Bytes moved.
    pub io_bytes: [u64; 3],
    /// Aggregate bandwidth, bytes/s (io_bytes over the longest runtime).
    pub agg: [u64; 3],
    /// `kb_base`.
    pub kb_base: u32,
    /// `significant_figures`.
    pub sig_figs: u32,
}

impl GroupStats {
    fn new(groupid: usize) -> GroupStats {
        GroupStats {
            groupid,
            min_run: [u64::MAX; 3],
            max_run: [0; 3],
            min_bw: [u64::MAX; 3],
            max_bw: [0; 3],
            io_bytes: [0; 3],
            agg: [0; 3],
            kb_base: 1024,
            sig_figs: SIG_FIGS_DEFAULT,
        }
    }
}

/// A measured reference to compare jobs against (e.g. SPDK on the same machine).
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    /// What it is ("spdk nvmf_tgt + spdk_nvme_perf, 2026-11").
    pub label: String,
    /// fio rw mode it applies to.
    pub rw: String,
    /// Block size, bytes.
    pub bs: u64,
    /// Queue depth.
    pub iodepth: u32,
    /// Measured IOPS.
    pub iops: f64,
    /// Measured mean latency, ns, if known.
    pub lat_mean_ns: Option<f64>,
}

impl Baseline {
    /// SPDK's numbers on the project's 2-core loopback machine (docs REFERENCE.md).
    pub fn spdk_loopback_2026_11() -> Vec<Baseline> {
        let label = "SPDK nvmf_tgt + spdk_nvme_perf, loopback, 2 cores, 2026-11";
        let b = |rw: &str, bs: u64, qd: u32, iops: f64, lat: Option<f64>| Baseline {
            label: label.to_string(),
            rw: rw.to_string(),
            bs,
            iodepth: qd,
            iops,
            lat_mean_ns: lat,
        };
        vec![
            b("randread", 4096, 1, 92_000.0, Some(10_800.0)),
            b("randread", 4096, 32, 500_000.0, None),
            b("randread", 4096, 128, 730_000.0, None),
            b("randwrite", 4096, 32, 490_000.0, None),
            // 3.6 GB/s of 128 KiB reads.
            b("read", 131_072, 16, 3.6e9 / 131_072.0, None),
        ]
    }
}

/// A job's result over the physical baseline of the same run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The job's value (ns or bytes/s).
    pub job: f64,
    /// The baseline's value, same unit.
    pub baseline: f64,
}

impl Ratio {
    /// `job / baseline` (0 when the baseline is 0).
    pub fn ratio(&self) -> f64 {
        if self.baseline > 0.0 { self.job / self.baseline } else { 0.0 }
    }
}

/// Which ratios a job gets against the physical baseline.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JobRatios {
    /// QD1 read jobs of at most 4 KiB (the ping-pong's shape): mean completion latency
    /// (`lat`) over the ping-pong's mean round trip. Goal: at most 1.5.
    pub lat_mean: Option<Ratio>,
    /// The same jobs' 99th percentile over the ping-pong's (when the job kept a
    /// histogram: `lat` with `lat_percentiles`, else `clat`).
    pub lat_p99: Option<Ratio>,
    /// Sequential jobs (`read`, `write`, `rw`): bandwidth over one raw TCP stream's.
    /// Goal: at least 0.8.
    pub bw: Option<Ratio>,
}

impl JobRatios {
    /// The ratios of `r` against `p`.
    pub fn of(r: &JobReport, p: &Physical) -> JobRatios {
        let (rw, bs, qd) = (&r.shape.0, r.shape.1, r.shape.2);
        let mut out = JobRatios::default();
        let reads = &r.stat.dirs[0];
        let read_only = rw == "read" || rw == "randread";
        if read_only && qd == 1 && bs <= 4096 && reads.lat.samples > 0 {
            out.lat_mean = Some(Ratio { job: reads.lat.mean, baseline: p.ping_pong.lat_mean_ns });
            let hist = reads.lat_hist.as_ref().or(reads.clat_hist.as_ref()).filter(|h| !h.is_empty());
            if let Some(h) = hist {
                #[allow(clippy::cast_precision_loss)]
                let p99 = h.percentiles(&[99.0])[0] as f64;
                #[allow(clippy::cast_precision_loss)]
                let base = p.ping_pong.lat_p99_ns as f64;
                out.lat_p99 = Some(Ratio { job: p99, baseline: base });
            }
        }
        if matches!(rw.as_str(), "read" | "write" | "rw") {
            let bw: u64 = r.stat.dirs.iter().filter_map(|d| (d.io_bytes * 1000).checked_div(d.runtime_ms)).sum();
            if bw > 0 {
                #[allow(clippy::cast_precision_loss)]
                let bw = bw as f64;
                out.bw = Some(Ratio { job: bw, baseline: p.stream.bw_bytes });
            }
        }
        out
    }

    /// Whether any ratio applies.
    pub fn is_empty(&self) -> bool {
        self.lat_mean.is_none() && self.bw.is_none()
    }
}

/// Everything the renderers need.
#[derive(Debug, Clone)]
pub struct Report {
    /// `"qpath-<version>"`, printed where fio prints `fio-3.33`.
    pub version: String,
    /// When the report was made.
    pub time: SystemTime,
    /// Seconds the run took (JSON `elapsed`).
    pub elapsed_sec: u64,
    /// `[global]` options for JSON.
    pub global_options: Vec<(String, Option<String>)>,
    /// Reported jobs in order.
    pub jobs: Vec<JobReport>,
    /// One entry per reporting group.
    pub groups: Vec<GroupStats>,
    /// Notes (engine substitutions, ignored options) for the `qpath` JSON key.
    pub notes: Vec<String>,
    /// Reference numbers measured elsewhere (SPDK), compared by job shape.
    pub baselines: Vec<Baseline>,
    /// The physical baseline measured in the same run ([`crate::baseline`]).
    pub physical: Option<Physical>,
    /// Which target the run used (the embedded one, or the filenames'), for the header.
    pub target: Option<String>,
}

/// The version string we print in place of fio's.
pub fn version_string() -> String {
    format!("qpath-{}", env!("CARGO_PKG_VERSION"))
}

impl Report {
    /// Build the report of a run (fio `__show_run_stats`: merge threads into reported
    /// jobs, then jobs into groups).
    pub fn from_run(file: &JobFile, run: &RunResult) -> Report {
        let mut jobs: Vec<JobReport> = Vec::new();
        let mut last_group: Option<usize> = None;
        for t in &run.jobs {
            let spec = &t.spec;
            let merge = !jobs.is_empty() && spec.group_reporting && last_group == Some(spec.place.groupid);
            if !merge {
                jobs.push(JobReport {
                    name: spec.name.clone(),
                    description: spec.description.clone(),
                    groupid: spec.place.groupid,
                    members: 0,
                    error: 0,
                    verror: String::new(),
                    pid: t.outcome.tid,
                    options: Vec::new(),
                    stat: ThreadStat::default(),
                    clat_percentiles: spec.clat_percentiles,
                    lat_percentiles: spec.lat_percentiles,
                    slat_percentiles: spec.slat_percentiles,
                    percentile_list: spec.percentile_list.clone(),
                    percentile_precision: spec.percentile_precision,
                    sig_figs: spec.sig_figs,
                    kb_base: spec.kb_base,
                    latency_depth: spec.iodepth,
                    engines: Vec::new(),
                    targets: Vec::new(),
                    shape: (spec.rw_str().to_string(), spec.bs[0].0.max(spec.bs[1].0), spec.iodepth),
                    multipath: None,
                    page_cache: t.outcome.page_cache.clone(),
                    fast_io_fail_tmo_s: fast_io_fail_tmo_s(spec),
                });
            }
            let r = jobs.last_mut().expect("a report exists");
            r.stat.merge(&t.outcome.stat);
            r.members += 1;
            if let Some(m) = &t.outcome.multipath {
                match &mut r.multipath {
                    Some(all) => all.merge(m),
                    None => r.multipath = Some(m.clone()),
                }
            }
            r.options.clone_from(&spec.options);
            r.clat_percentiles = spec.clat_percentiles;
            r.lat_percentiles = spec.lat_percentiles;
            r.slat_percentiles = spec.slat_percentiles;
            r.percentile_list.clone_from(&spec.percentile_list);
            r.percentile_precision = spec.percentile_precision;
            r.latency_depth = spec.iodepth;
            if r.error == 0
                && let Some(e) = &t.outcome.error
            {
                r.error = e.errno;
                r.verror.clone_from(&e.message);
            }
            if !r.engines.contains(&t.engine) {
                r.engines.push(t.engine.clone());
            }
            let target = if spec.target.raw.is_empty() { "(embedded)".to_string() } else { spec.target.raw.clone() };
            if !r.targets.contains(&target) {
                r.targets.push(target);
            }
            last_group = Some(spec.place.groupid);
        }
        let ngroups = file.jobs.iter().map(|j| j.place.groupid).max().map_or(1, |g| g + 1);
        let groups = group_stats(&jobs, ngroups);
        Report {
            version: version_string(),
            time: SystemTime::now(),
            elapsed_sec: run.elapsed.as_secs() + u64::from(run.elapsed.subsec_nanos() > 0),
            global_options: file.global_options.clone(),
            jobs,
            groups,
            notes: run.notes.clone(),
            baselines: Vec::new(),
            physical: None,
            target: None,
        }
    }

    /// Whether some reported job ended with an error.
    pub fn failed(&self) -> bool {
        self.jobs.iter().any(|j| j.error != 0)
    }
}

/// Per-group totals of reported jobs (fio `__show_run_stats`' runstats loop).
pub fn group_stats(jobs: &[JobReport], ngroups: usize) -> Vec<GroupStats> {
    let ngroups = ngroups.max(jobs.iter().map(|r| r.groupid + 1).max().unwrap_or(1));
    let mut groups: Vec<GroupStats> = (0..ngroups).map(GroupStats::new).collect();
    for r in jobs {
        let g = &mut groups[r.groupid];
        g.kb_base = r.kb_base;
        g.sig_figs = r.sig_figs;
        for d in 0..2 {
            let ds = &r.stat.dirs[d];
            if ds.runtime_ms == 0 {
                continue;
            }
            g.min_run[d] = g.min_run[d].min(ds.runtime_ms);
            g.max_run[d] = g.max_run[d].max(ds.runtime_ms);
            let bw = ds.io_bytes * 1000 / ds.runtime_ms;
            g.min_bw[d] = g.min_bw[d].min(bw);
            g.max_bw[d] = g.max_bw[d].max(bw);
            g.io_bytes[d] += ds.io_bytes;
        }
    }
    for g in &mut groups {
        for d in 0..3 {
            if let Some(agg) = (g.io_bytes[d] * 1000).checked_div(g.max_run[d]) {
                g.agg[d] = agg;
            }
        }
    }
    groups
}

/// fio `stat_calc_dist`: counts to percentages of `total`, at least 0.1 if non-zero.
pub fn calc_dist(map: &[u64], total: u64) -> Vec<f64> {
    map.iter()
        .map(|&v| {
            if total == 0 {
                return 0.0;
            }
            let p = ratio(v, total) * 100.0;
            if p < 0.1 && v > 0 { 0.1 } else { p }
        })
        .collect()
}

/// fio `stat_calc_lat`: latency bucket counts to percentages of all I/Os, at least 0.01.
pub fn calc_lat(buckets: &[u64], total: u64) -> Vec<f64> {
    buckets
        .iter()
        .map(|&v| {
            if total == 0 {
                return 0.0;
            }
            let p = ratio(v, total) * 100.0;
            if p < 0.01 && v > 0 { 0.01 } else { p }
        })
        .collect()
}

#[allow(clippy::cast_precision_loss)] // counters well below 2^53
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b as f64
}

/// fio `convert_agg_kbytes_percent`: a job's mean bandwidth (KiB/s, truncated to an
/// integer as fio's `int mean` parameter does) as a share of the group's aggregate.
pub fn agg_percent(g: &GroupStats, ddir: usize, mean_kib: f64) -> f64 {
    #[allow(clippy::cast_possible_truncation)] // fio passes the mean as an int
    let mean = mean_kib as i64;
    if g.agg[ddir] > 1024 {
        #[allow(clippy::cast_precision_loss)]
        let p = mean as f64 * 100.0 / (g.agg[ddir] as f64 / 1024.0);
        p.min(100.0)
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dist_minimums_follow_fio() {
        assert_eq!(calc_dist(&[1, 9999], 10000), vec![0.1, 99.99]);
        assert_eq!(calc_lat(&[1, 0], 1_000_000), vec![0.01, 0.0]);
        assert_eq!(calc_dist(&[0, 0], 0), vec![0.0, 0.0]);
    }
}
