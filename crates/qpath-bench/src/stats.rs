//! Per-thread statistics, kept the way fio 3.33 keeps them (`stat.c`, `io_u.c`), so
//! the reports compute the same numbers from the same inputs:
//!
//! - [`LatStat`]: min/max plus a running mean and sum of squares (Welford), fio's
//!   `struct io_stat` and `add_stat_sample`; merged with fio's parallel formula.
//! - [`LatHist`]: an HDR histogram (3 significant digits, 1 ns .. 1 h) for latency
//!   percentiles; fio uses its own log-linear buckets with ~1.6% error, we use ~0.1%.
//! - Depth, submit, complete and latency-bucket counters, as fio's `io_u_map`,
//!   `io_u_submit`, `io_u_complete`, `io_u_lat_{n,u,m}`.
//! - bw/iops samples every 500 ms (fio's `bw_avg_time`/`iops_avg_time` defaults).

use blk::HdrCounts;
use hdrhistogram::Histogram;

/// Highest latency the histograms resolve (1 hour); larger values are clamped.
pub const HIST_MAX_NS: u64 = 3_600_000_000_000;
/// fio's default `bw_avg_time` and `iops_avg_time`, in milliseconds.
pub const SAMPLE_INTERVAL_MS: u64 = 500;

/// min/max/mean/variance of a series (fio `struct io_stat`).
#[derive(Debug, Clone, PartialEq)]
pub struct LatStat {
    /// Smallest sample (`u64::MAX` while empty, as fio's `ULONG_MAX`).
    pub min: u64,
    /// Largest sample.
    pub max: u64,
    /// Running mean.
    pub mean: f64,
    /// Running sum of squared deviations (Welford's S).
    pub s: f64,
    /// Number of samples.
    pub samples: u64,
}

impl Default for LatStat {
    fn default() -> Self {
        LatStat { min: u64::MAX, max: 0, mean: 0.0, s: 0.0, samples: 0 }
    }
}

/// What the reports print for a [`LatStat`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Minimum.
    pub min: u64,
    /// Maximum.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1), 0 for one sample.
    pub dev: f64,
}

#[allow(clippy::cast_precision_loss)] // sample counts and ns values fit f64's 53 bits in practice
fn as_f64(v: u64) -> f64 {
    v as f64
}

impl LatStat {
    /// Add one sample (fio `add_stat_sample`).
    pub fn add(&mut self, value: u64) {
        self.max = self.max.max(value);
        self.min = self.min.min(value);
        let val = as_f64(value);
        let delta = val - self.mean;
        if delta != 0.0 {
            self.mean += delta / (as_f64(self.samples) + 1.0);
            self.s += delta * (val - self.mean);
        }
        self.samples += 1;
    }

    /// Merge a time series from another thread (fio `__sum_stat`, the parallel
    /// variance formula).
    pub fn merge(&mut self, src: &LatStat) {
        if src.samples == 0 {
            return;
        }
        self.min = self.min.min(src.min);
        self.max = self.max.max(src.max);
        if self.samples == 0 {
            self.mean = src.mean;
            self.s = src.s;
        } else {
            let (n1, n2) = (as_f64(self.samples), as_f64(src.samples));
            let delta = src.mean - self.mean;
            self.mean = (src.mean * n2 + self.mean * n1) / (n1 + n2);
            self.s = src.s + self.s + delta * delta * (n1 * n2) / (n1 + n2);
        }
        self.samples += src.samples;
    }

    /// Add up rate samples of jobs in one group (fio `sum_stat(..., pure_sum=true)`):
    /// min, max, mean and S are summed, so the group's bw min is the sum of minimums.
    pub fn sum(&mut self, src: &LatStat) {
        if src.samples == 0 {
            return;
        }
        if self.samples == 0 {
            *self = src.clone();
        } else {
            self.min += src.min;
            self.max += src.max;
            self.samples += src.samples;
            self.mean += src.mean;
            self.s += src.s;
        }
    }

    /// fio `calc_lat`: `None` without samples.
    pub fn summary(&self) -> Option<Summary> {
        if self.samples == 0 {
            return None;
        }
        let n = as_f64(self.samples);
        let dev = if self.samples > 1 { (self.s / (n - 1.0)).sqrt() } else { 0.0 };
        Some(Summary { min: self.min, max: self.max, mean: self.mean, dev })
    }

    /// A stat with the given summary (for golden tests and replays).
    pub fn from_summary(min: u64, max: u64, mean: f64, dev: f64, samples: u64) -> LatStat {
        let s = if samples > 1 { dev * dev * (as_f64(samples) - 1.0) } else { 0.0 };
        LatStat { min, max, mean, s, samples }
    }
}

/// A latency histogram in nanoseconds: HDR buckets (3 significant digits, 1 ns .. 1 h)
/// counted as plain slots ([`blk::HdrCounts`], one increment per sample), read through an
/// `hdrhistogram` built from the counts when a report asks, which gives what recording
/// into that histogram directly gives, for a fraction of the work per sample.
#[derive(Debug, Clone)]
pub struct LatHist {
    counts: HdrCounts,
    len: u64,
}

impl Default for LatHist {
    fn default() -> Self {
        Self::new()
    }
}

impl LatHist {
    /// An empty histogram (about 270 KiB).
    pub fn new() -> LatHist {
        LatHist { counts: HdrCounts::new(HIST_MAX_NS, 3), len: 0 }
    }

    /// Record one latency (one over an hour counts as an hour).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts.record(ns.min(HIST_MAX_NS));
        self.len += 1;
    }

    /// Record `count` samples of one latency.
    pub fn record_n(&mut self, ns: u64, count: u64) {
        self.counts.record_n(ns.min(HIST_MAX_NS), count);
        self.len = self.len.saturating_add(count);
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, other: &LatHist) {
        self.counts.add(&other.counts);
        self.len = self.len.saturating_add(other.len);
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no samples were recorded.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Clear all counts.
    pub fn reset(&mut self) {
        self.counts.reset();
        self.len = 0;
    }

    /// The same counts in an `hdrhistogram` of the same bounds.
    fn to_hdr(&self) -> Histogram<u64> {
        self.counts.to_hdr()
    }

    /// The value at each percentile of `list` (0..=100): the smallest bucket whose
    /// cumulative count reaches `p/100 * n` (fio's rule), reported as the bucket's upper
    /// bound clamped to the largest sample.
    pub fn percentiles(&self, list: &[f64]) -> Vec<u64> {
        let hist = self.to_hdr();
        let max = hist.max();
        list.iter().map(|p| hist.value_at_quantile(p / 100.0).min(max)).collect()
    }

    /// Non-empty buckets as `(value, count)` (for `--output-format=json+` "bins").
    pub fn bins(&self) -> Vec<(u64, u64)> {
        let hist = self.to_hdr();
        hist.iter_recorded().map(|v| (hist.highest_equivalent(v.value_iterated_to()), v.count_at_value())).collect()
    }
}

/// Statistics of one data direction (read or write).
#[derive(Debug, Clone, Default)]
pub struct DirStats {
    /// Bytes completed.
    pub io_bytes: u64,
    /// I/Os issued.
    pub total_ios: u64,
    /// I/Os that completed with fewer bytes than asked.
    pub short_ios: u64,
    /// I/Os dropped (always 0 here; fio counts I/Os dropped by its rate limiter).
    pub drop_ios: u64,
    /// Time spent in this direction, ms (fio `ts->runtime[ddir]`).
    pub runtime_ms: u64,
    /// Submission latency: allocation to "submitted" (async engines only).
    pub slat: LatStat,
    /// Completion latency: submitted to completed.
    pub clat: LatStat,
    /// Total latency: allocation to completed.
    pub lat: LatStat,
    /// slat percentiles (`slat_percentiles=1`).
    pub slat_hist: Option<LatHist>,
    /// clat percentiles (`clat_percentiles=1`, the default).
    pub clat_hist: Option<LatHist>,
    /// lat percentiles (`lat_percentiles=1`).
    pub lat_hist: Option<LatHist>,
    /// Bandwidth samples in KiB/s.
    pub bw: LatStat,
    /// IOPS samples.
    pub iops: LatStat,
}

impl DirStats {
    fn reset(&mut self) {
        let keep = (self.slat_hist.is_some(), self.clat_hist.is_some(), self.lat_hist.is_some());
        for h in [&mut self.slat_hist, &mut self.clat_hist, &mut self.lat_hist].into_iter().flatten() {
            h.reset();
        }
        let (s, c, l) = (self.slat_hist.take(), self.clat_hist.take(), self.lat_hist.take());
        *self = DirStats {
            slat_hist: if keep.0 { s } else { None },
            clat_hist: if keep.1 { c } else { None },
            lat_hist: if keep.2 { l } else { None },
            ..DirStats::default()
        };
    }

    fn merge(&mut self, src: &DirStats) {
        self.clat.merge(&src.clat);
        self.slat.merge(&src.slat);
        self.lat.merge(&src.lat);
        self.bw.sum(&src.bw);
        self.iops.sum(&src.iops);
        self.io_bytes += src.io_bytes;
        self.total_ios += src.total_ios;
        self.short_ios += src.short_ios;
        self.drop_ios += src.drop_ios;
        self.runtime_ms = self.runtime_ms.max(src.runtime_ms);
        merge_hist(&mut self.slat_hist, &src.slat_hist);
        merge_hist(&mut self.clat_hist, &src.clat_hist);
        merge_hist(&mut self.lat_hist, &src.lat_hist);
    }
}

fn merge_hist(dst: &mut Option<LatHist>, src: &Option<LatHist>) {
    match (dst.as_mut(), src) {
        (Some(d), Some(s)) => d.merge(s),
        (None, Some(s)) => *dst = Some(s.clone()),
        _ => {}
    }
}

/// Verification counters of a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Blocks whose header and CRC were checked.
    pub checked: u64,
    /// Blocks that failed.
    pub failures: u64,
    /// Message of the first failure.
    pub first_failure: Option<String>,
}

/// Everything one job thread (or a merged group) measured.
#[derive(Debug, Clone, Default)]
pub struct ThreadStat {
    /// `[read, write]`.
    pub dirs: [DirStats; 2],
    /// Flush latency (`fsync=N`).
    pub sync: LatStat,
    /// Flush latency percentiles.
    pub sync_hist: Option<LatHist>,
    /// Flushes issued.
    pub sync_total: u64,
    /// User CPU time, µs.
    pub usr_us: u64,
    /// System CPU time, µs.
    pub sys_us: u64,
    /// Context switches.
    pub ctx: u64,
    /// Major page faults.
    pub majf: u64,
    /// Minor page faults.
    pub minf: u64,
    /// Job run time, ms (fio `total_run_time`).
    pub total_run_time_ms: u64,
    /// I/O depth at issue, buckets 1, 2, 4, 8, 16, 32, >=64 (fio `io_u_map`).
    pub io_u_map: [u64; 7],
    /// I/Os per submit call, buckets 0, 4, 8, 16, 32, 64, >64.
    pub io_u_submit: [u64; 7],
    /// I/Os per reap call, same buckets.
    pub io_u_complete: [u64; 7],
    /// Submit calls.
    pub total_submit: u64,
    /// Reap calls.
    pub total_complete: u64,
    /// clat buckets below 1 µs: 2, 4, 10, 20, 50, 100, 250, 500, 750, 1000 ns.
    pub lat_n: [u64; 10],
    /// clat buckets in µs, same edges.
    pub lat_u: [u64; 10],
    /// clat buckets in ms: same edges plus 2000 and >=2000.
    pub lat_m: [u64; 12],
    /// Verification counters.
    pub verify: VerifyStats,
}

fn depth_bucket(depth: u32) -> usize {
    match depth {
        1 => 0,
        2..=3 => 1,
        4..=7 => 2,
        8..=15 => 3,
        16..=31 => 4,
        32..=63 => 5,
        _ => 6,
    }
}

fn batch_bucket(nr: usize) -> usize {
    match nr {
        0 => 0,
        1..=4 => 1,
        5..=8 => 2,
        9..=16 => 3,
        17..=32 => 4,
        33..=64 => 5,
        _ => 6,
    }
}

fn lat_bucket(v: u64) -> usize {
    match v {
        0..=1 => 0,
        2..=3 => 1,
        4..=9 => 2,
        10..=19 => 3,
        20..=49 => 4,
        50..=99 => 5,
        100..=249 => 6,
        250..=499 => 7,
        500..=749 => 8,
        _ => 9,
    }
}

impl ThreadStat {
    /// Stats with histograms allocated for the directions and kinds that will be used.
    pub fn with_hists(dirs_used: [bool; 2], slat: bool, clat: bool, lat: bool, sync: bool) -> ThreadStat {
        let mut t = ThreadStat::default();
        for (d, used) in dirs_used.iter().enumerate() {
            if *used {
                let ds = &mut t.dirs[d];
                ds.slat_hist = slat.then(LatHist::new);
                ds.clat_hist = clat.then(LatHist::new);
                ds.lat_hist = lat.then(LatHist::new);
            }
        }
        t.sync_hist = (sync && clat).then(LatHist::new);
        t
    }

    /// fio `io_u_mark_depth`: `nr` I/Os went out while `depth` were outstanding.
    pub fn mark_depth(&mut self, depth: u32, nr: u64) {
        self.io_u_map[depth_bucket(depth)] += nr;
    }

    /// fio `io_u_mark_submit`: one submit call carried `nr` I/Os.
    pub fn mark_submit(&mut self, nr: usize) {
        self.io_u_submit[batch_bucket(nr)] += 1;
        self.total_submit += 1;
    }

    /// fio `io_u_mark_complete`: one reap call returned `nr` I/Os.
    pub fn mark_complete(&mut self, nr: usize) {
        self.io_u_complete[batch_bucket(nr)] += 1;
        self.total_complete += 1;
    }

    /// fio `io_u_mark_latency` (by completion latency).
    pub fn mark_latency(&mut self, ns: u64) {
        if ns < 1_000 {
            self.lat_n[lat_bucket(ns)] += 1;
        } else if ns < 1_000_000 {
            self.lat_u[lat_bucket(ns / 1_000)] += 1;
        } else {
            let ms = ns / 1_000_000;
            let idx = match ms {
                0..=999 => lat_bucket(ms),
                1000..=1999 => 10,
                _ => 11,
            };
            self.lat_m[idx] += 1;
        }
    }

    /// fio `reset_io_stats` (end of `ramp_time`): drop everything measured so far.
    pub fn reset_io(&mut self) {
        for d in &mut self.dirs {
            d.reset();
        }
        self.sync = LatStat::default();
        if let Some(h) = self.sync_hist.as_mut() {
            h.reset();
        }
        self.sync_total = 0;
        self.io_u_map = [0; 7];
        self.io_u_submit = [0; 7];
        self.io_u_complete = [0; 7];
        self.total_submit = 0;
        self.total_complete = 0;
        self.lat_n = [0; 10];
        self.lat_u = [0; 10];
        self.lat_m = [0; 12];
    }

    /// Fold another thread's stats into this one (fio `sum_thread_stats`).
    pub fn merge(&mut self, src: &ThreadStat) {
        for (d, s) in self.dirs.iter_mut().zip(src.dirs.iter()) {
            d.merge(s);
        }
        self.sync.merge(&src.sync);
        merge_hist(&mut self.sync_hist, &src.sync_hist);
        self.sync_total += src.sync_total;
        self.usr_us += src.usr_us;
        self.sys_us += src.sys_us;
        self.ctx += src.ctx;
        self.majf += src.majf;
        self.minf += src.minf;
        for k in 0..7 {
            self.io_u_map[k] += src.io_u_map[k];
            self.io_u_submit[k] += src.io_u_submit[k];
            self.io_u_complete[k] += src.io_u_complete[k];
        }
        for (a, b) in self.lat_n.iter_mut().zip(src.lat_n) {
            *a += b;
        }
        for (a, b) in self.lat_u.iter_mut().zip(src.lat_u) {
            *a += b;
        }
        for (a, b) in self.lat_m.iter_mut().zip(src.lat_m) {
            *a += b;
        }
        self.total_run_time_ms += src.total_run_time_ms;
        self.total_submit += src.total_submit;
        self.total_complete += src.total_complete;
        self.verify.checked += src.verify.checked;
        self.verify.failures += src.verify.failures;
        if self.verify.first_failure.is_none() {
            self.verify.first_failure.clone_from(&src.verify.first_failure);
        }
    }

    /// I/Os issued in both directions (fio `ddir_rw_sum(total_io_u)`).
    pub fn total_ios(&self) -> u64 {
        self.dirs[0].total_ios + self.dirs[1].total_ios
    }
}

/// The every-500-ms bandwidth and IOPS sampler of one thread (fio `__add_samples`).
///
/// fio samples from a helper thread that wakes on time; we sample from the I/O loop,
/// which a slow I/O can delay. Samples are therefore due on a fixed grid (500, 1000,
/// 1500 ms... after stats start) rather than 500 ms after the previous, late, sample;
/// each rate still uses the time that actually passed since the previous sample.
#[derive(Debug, Clone)]
pub struct RateSampler {
    last_ms: u64,
    next_due_ms: u64,
    last_bytes: [u64; 2],
    last_ios: [u64; 2],
    interval_ms: u64,
}

/// fio's LOG_MSEC_SLACK: a sample may be taken this many ms early.
const SAMPLE_SLACK_MS: u64 = 1;

impl RateSampler {
    /// A sampler starting at `now_ms`.
    pub fn new(now_ms: u64) -> RateSampler {
        RateSampler {
            last_ms: now_ms,
            next_due_ms: now_ms + SAMPLE_INTERVAL_MS - SAMPLE_SLACK_MS,
            last_bytes: [0; 2],
            last_ios: [0; 2],
            interval_ms: SAMPLE_INTERVAL_MS,
        }
    }

    /// Milliseconds at which the next sample is due.
    pub fn due_ms(&self) -> u64 {
        self.next_due_ms
    }

    /// Take a sample if one is due: `bytes`/`ios` are the totals since stats start.
    pub fn maybe_sample(&mut self, now_ms: u64, bytes: [u64; 2], ios: [u64; 2], dirs: &mut [DirStats; 2]) {
        if now_ms < self.next_due_ms {
            return;
        }
        let spent = now_ms.saturating_sub(self.last_ms);
        for d in 0..2 {
            let db = bytes[d] - self.last_bytes[d];
            if db > 0 && spent > 0 {
                dirs[d].bw.add(db * 1000 / spent / 1024);
            }
            let di = ios[d] - self.last_ios[d];
            if di > 0 && spent > 0 {
                dirs[d].iops.add(di * 1000 / spent);
            }
        }
        self.last_bytes = bytes;
        self.last_ios = ios;
        self.last_ms = now_ms;
        // Next grid point after now (skipping any missed while the loop was stalled).
        let grid = (now_ms + SAMPLE_SLACK_MS) / self.interval_ms + 1;
        self.next_due_ms = grid * self.interval_ms - SAMPLE_SLACK_MS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_two_pass() {
        let vals = [10u64, 20, 30, 40, 1000];
        let mut s = LatStat::default();
        vals.iter().for_each(|v| s.add(*v));
        let sum = s.summary().unwrap();
        let mean = 1100.0 / 5.0;
        let var: f64 = vals.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((sum.mean - mean).abs() < 1e-9);
        assert!((sum.dev - var.sqrt()).abs() < 1e-9);
        assert_eq!((sum.min, sum.max), (10, 1000));
        assert!(LatStat::default().summary().is_none());
    }

    #[test]
    fn merge_equals_one_series() {
        let (mut a, mut b, mut all) = (LatStat::default(), LatStat::default(), LatStat::default());
        for v in 0..100u64 {
            let x = v * v % 97;
            if v % 3 == 0 {
                a.add(x)
            } else {
                b.add(x)
            }
            all.add(x);
        }
        a.merge(&b);
        let (m, t) = (a.summary().unwrap(), all.summary().unwrap());
        assert!((m.mean - t.mean).abs() < 1e-9 && (m.dev - t.dev).abs() < 1e-9);
        assert_eq!((m.min, m.max), (t.min, t.max));
    }

    #[test]
    fn group_rates_are_summed() {
        let mut a = LatStat::default();
        a.add(100);
        a.add(200);
        let mut b = LatStat::default();
        b.add(50);
        a.sum(&b);
        assert_eq!((a.min, a.max, a.samples), (150, 250, 3));
    }

    #[test]
    fn buckets_follow_fio() {
        let mut t = ThreadStat::default();
        t.mark_latency(999);
        t.mark_latency(1_500);
        t.mark_latency(1_999_999);
        t.mark_latency(2_500_000_000);
        assert_eq!(t.lat_n[9], 1);
        assert_eq!(t.lat_u[0], 1);
        assert_eq!(t.lat_m[0], 1);
        assert_eq!(t.lat_m[11], 1);
        t.mark_depth(1, 1);
        t.mark_depth(32, 2);
        t.mark_depth(128, 1);
        assert_eq!(t.io_u_map, [1, 0, 0, 0, 0, 2, 1]);
        t.mark_submit(1);
        t.mark_submit(32);
        assert_eq!(t.io_u_submit, [0, 1, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn histogram_counts_as_hdrhistogram_records() {
        // Slot edges, bucket edges, the clamp at one hour, and a spread of latencies.
        let mut values = vec![0, 1, 2, 1023, 1024, 2047, 2048, 2049, 4095, 4096, 4097, 1 << 20, HIST_MAX_NS];
        values.extend([HIST_MAX_NS + 1, u64::MAX]);
        let mut x = 7u64;
        for _ in 0..5000 {
            x = crate::verify::mix64(x);
            values.push(x >> (x % 64));
        }
        let mut ours = LatHist::new();
        let mut hdr = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3).unwrap();
        for &v in &values {
            ours.record(v);
            hdr.saturating_record(v.min(HIST_MAX_NS));
        }
        ours.record_n(12_345, 3);
        hdr.saturating_record_n(12_345, 3);
        let got = ours.to_hdr();
        assert_eq!(got.len(), hdr.len());
        assert_eq!(ours.len(), hdr.len());
        assert_eq!((got.min_nz(), got.max()), (hdr.min_nz(), hdr.max()));
        assert!(got.iter_recorded().eq(hdr.iter_recorded()), "the same buckets with the same counts");
        let list = [1.0, 5.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0];
        let want: Vec<u64> = list.iter().map(|p| hdr.value_at_quantile(p / 100.0).min(hdr.max())).collect();
        assert_eq!(ours.percentiles(&list), want);
    }

    #[test]
    fn percentiles_use_fio_rule() {
        let mut h = LatHist::new();
        for v in 1..=100u64 {
            h.record(v * 1000);
        }
        let p = h.percentiles(&[1.0, 50.0, 99.0, 100.0]);
        assert_eq!(p[0], 1000);
        assert!((50_000..=50_050).contains(&p[1]), "{p:?}");
        assert!((99_000..=99_100).contains(&p[2]), "{p:?}");
        assert_eq!(p[3], h.percentiles(&[100.0])[0]);
        assert!(p[3] <= 100_000 + 100);
    }

    #[test]
    fn sampler_rates() {
        let mut d: [DirStats; 2] = Default::default();
        let mut s = RateSampler::new(0);
        s.maybe_sample(100, [1 << 20, 0], [256, 0], &mut d);
        assert_eq!(d[0].bw.samples, 0);
        s.maybe_sample(500, [1 << 20, 0], [256, 0], &mut d);
        assert_eq!(d[0].bw.samples, 1);
        assert_eq!(d[0].bw.min, 2048); // 1 MiB in 0.5 s = 2048 KiB/s
        assert_eq!(d[0].iops.min, 512);
        assert_eq!(d[1].bw.samples, 0);
        // A late sample does not push the next one off the grid.
        let mut d: [DirStats; 2] = Default::default();
        let mut s = RateSampler::new(0);
        s.maybe_sample(540, [1 << 20, 0], [256, 0], &mut d);
        assert_eq!(s.due_ms(), 999);
        s.maybe_sample(999, [2 << 20, 0], [512, 0], &mut d);
        assert_eq!(d[0].bw.samples, 2);
        assert_eq!(s.due_ms(), 1499);
        // A long stall skips the grid points it missed.
        s.maybe_sample(2600, [3 << 20, 0], [768, 0], &mut d);
        assert_eq!(s.due_ms(), 2999);
    }

    #[test]
    fn ramp_reset_keeps_histogram_allocation() {
        let mut t = ThreadStat::with_hists([true, false], false, true, false, false);
        t.dirs[0].clat_hist.as_mut().unwrap().record(5);
        t.dirs[0].io_bytes = 9;
        t.reset_io();
        assert_eq!(t.dirs[0].io_bytes, 0);
        assert!(t.dirs[0].clat_hist.as_ref().unwrap().is_empty());
        assert!(t.dirs[1].clat_hist.is_none());
    }
}
