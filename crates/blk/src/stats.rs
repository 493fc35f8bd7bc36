//! Per-queue statistics: counters and latency histograms, recorded by the
//! queue's owner thread, merged across queues and threads for reports.
//!
//! Recording is plain arithmetic on owned memory plus one increment of a
//! histogram slot ([`HdrCounts`]; no atomics, no allocation). A report clones or merges:
//! the owner sends a copy of its [`QueueStats`] to the reporter (e.g. through
//! its mailbox), which [`merge`](QueueStats::merge)s them.
//!
//! Latencies are nanoseconds at 2 significant digits, 1 ns to
//! [`LATENCY_NS_MAX`]; a longer latency is counted at the maximum (the exact
//! maximum is kept beside the histogram). Each direction's histogram is 30 KiB,
//! allocated at the direction's first successful I/O. Only successful I/Os go
//! into the histogram (as fio does); failed ones are counted in `errors`.

use std::borrow::Cow;

use hdrhistogram::Histogram;

use crate::hist::HdrCounts;

/// The direction an I/O counts under, as fio reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Reads.
    Read,
    /// Writes and write-zeroes.
    Write,
    /// Discards.
    Trim,
    /// Flushes.
    Sync,
}

impl Direction {
    /// All directions, in report order.
    pub const ALL: [Direction; 4] = [Direction::Read, Direction::Write, Direction::Trim, Direction::Sync];

    const fn slot(self) -> usize {
        match self {
            Direction::Read => 0,
            Direction::Write => 1,
            Direction::Trim => 2,
            Direction::Sync => 3,
        }
    }
}

/// How an I/O ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It succeeded.
    Success,
    /// It failed (any error status, after retries).
    Error,
}

/// Longest latency the histograms resolve: 60 s (twice Linux's default I/O timeout).
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Two significant digits (1% resolution) is plenty for operational
/// statistics and keeps a direction's histogram near 30 KB (three digits
/// took ~200 KB, which a target with 1,000 queues cannot afford); benchmark
/// reports keep their own full-resolution histograms.
const SIGFIG: u8 = 2;

fn histogram() -> HdrCounts {
    HdrCounts::new(LATENCY_NS_MAX, SIGFIG)
}

/// An empty histogram for directions that never recorded anything.
fn empty() -> &'static Histogram<u64> {
    static EMPTY: std::sync::OnceLock<Histogram<u64>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| histogram().to_hdr())
}

/// Counters and latencies of one direction.
#[derive(Clone, Debug)]
pub struct DirectionStats {
    /// I/Os completed (successes and errors).
    pub ios: u64,
    /// Bytes moved by successful I/Os.
    pub bytes: u64,
    /// I/Os that failed.
    pub errors: u64,
    /// Largest latency of a successful I/O, exact (the histogram saturates).
    pub latency_ns_max: u64,
    /// Sum of the latencies of the successful I/Os, exact (a Prometheus summary's `_sum`).
    pub latency_ns_sum: u64,
    /// Allocated at the first successful I/O of the direction (idle directions cost nothing).
    latency: Option<HdrCounts>,
}

impl DirectionStats {
    fn new() -> DirectionStats {
        DirectionStats { ios: 0, bytes: 0, errors: 0, latency_ns_max: 0, latency_ns_sum: 0, latency: None }
    }

    /// The latency histogram (ns) of successful I/Os (built from the counts).
    pub fn latency(&self) -> Cow<'static, Histogram<u64>> {
        match &self.latency {
            Some(h) => Cow::Owned(h.to_hdr()),
            None => Cow::Borrowed(empty()),
        }
    }

    fn latency_mut(&mut self) -> &mut HdrCounts {
        self.latency.get_or_insert_with(histogram)
    }

    /// The latency (ns) at `percentile` (0..=100), 0 when nothing was recorded.
    pub fn percentile_ns(&self, percentile: f64) -> u64 {
        self.latency().value_at_percentile(percentile)
    }

    /// The usual percentiles in one go.
    pub fn summary(&self) -> LatencySummary {
        let h = self.latency();
        LatencySummary {
            count: h.len(),
            min_ns: h.min(),
            max_ns: self.latency_ns_max,
            mean_ns: h.mean(),
            p50_ns: h.value_at_percentile(50.0),
            p99_ns: h.value_at_percentile(99.0),
            p99_9_ns: h.value_at_percentile(99.9),
            p99_99_ns: h.value_at_percentile(99.99),
        }
    }
}

/// Latency percentiles of one direction (ns; all 0 when nothing was recorded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencySummary {
    /// Latencies recorded.
    pub count: u64,
    /// Smallest.
    pub min_ns: u64,
    /// Largest (exact).
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p99_9_ns: u64,
    /// 99.99th percentile.
    pub p99_99_ns: u64,
}

/// One queue's statistics.
#[derive(Clone, Debug)]
pub struct QueueStats {
    dirs: [DirectionStats; 4],
    /// Requests sent around again (refused by the queue, or retried by the caller).
    pub requeues: u64,
    /// Submissions refused for want of a tag.
    pub busy: u64,
}

impl Default for QueueStats {
    fn default() -> Self {
        QueueStats::new()
    }
}

impl QueueStats {
    /// Empty statistics (a direction allocates its histogram at its first successful I/O).
    pub fn new() -> QueueStats {
        QueueStats {
            dirs: [DirectionStats::new(), DirectionStats::new(), DirectionStats::new(), DirectionStats::new()],
            requeues: 0,
            busy: 0,
        }
    }

    /// Records one finished I/O.
    #[inline]
    pub fn record(&mut self, dir: Direction, bytes: u64, latency_ns: u64, outcome: Outcome) {
        let d = &mut self.dirs[dir.slot()];
        d.ios += 1;
        match outcome {
            Outcome::Success => {
                d.bytes += bytes;
                d.latency_mut().record(latency_ns.max(1));
                d.latency_ns_max = d.latency_ns_max.max(latency_ns);
                d.latency_ns_sum = d.latency_ns_sum.saturating_add(latency_ns);
            }
            Outcome::Error => d.errors += 1,
        }
    }

    /// Counts a requeue.
    #[inline]
    pub fn record_requeue(&mut self) {
        self.requeues += 1;
    }

    /// Counts a submission refused for want of a tag.
    #[inline]
    pub fn record_busy(&mut self) {
        self.busy += 1;
    }

    /// One direction.
    pub fn direction(&self, dir: Direction) -> &DirectionStats {
        &self.dirs[dir.slot()]
    }

    /// I/Os completed in all directions.
    pub fn ios(&self) -> u64 {
        self.dirs.iter().map(|d| d.ios).sum()
    }

    /// Errors in all directions.
    pub fn errors(&self) -> u64 {
        self.dirs.iter().map(|d| d.errors).sum()
    }

    /// Bytes moved in all directions.
    pub fn bytes(&self) -> u64 {
        self.dirs.iter().map(|d| d.bytes).sum()
    }

    /// The latency (ns) at `percentile` (0..=100) of one direction.
    pub fn percentile_ns(&self, dir: Direction, percentile: f64) -> u64 {
        self.direction(dir).percentile_ns(percentile)
    }

    /// Adds `other` (another queue's or thread's) into these.
    pub fn merge(&mut self, other: &QueueStats) {
        for (d, o) in self.dirs.iter_mut().zip(&other.dirs) {
            d.ios += o.ios;
            d.bytes += o.bytes;
            d.errors += o.errors;
            d.latency_ns_max = d.latency_ns_max.max(o.latency_ns_max);
            d.latency_ns_sum = d.latency_ns_sum.saturating_add(o.latency_ns_sum);
            if let Some(h) = &o.latency {
                d.latency_mut().add(h);
            }
        }
        self.requeues += other.requeues;
        self.busy += other.busy;
    }

    /// Zeroes everything (keeps the histograms' memory).
    pub fn reset(&mut self) {
        for d in &mut self.dirs {
            d.ios = 0;
            d.bytes = 0;
            d.errors = 0;
            d.latency_ns_max = 0;
            d.latency_ns_sum = 0;
            if let Some(h) = d.latency.as_mut() {
                h.reset();
            }
        }
        self.requeues = 0;
        self.busy = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_counts_and_percentiles() {
        let mut s = QueueStats::new();
        for i in 1..=10_000u64 {
            s.record(Direction::Read, 4096, i * 1_000, Outcome::Success);
        }
        s.record(Direction::Read, 4096, 5, Outcome::Error);
        s.record(Direction::Write, 512, 70_000_000_000, Outcome::Success);
        let r = s.direction(Direction::Read);
        assert_eq!((r.ios, r.errors, r.bytes), (10_001, 1, 10_000 * 4096));
        let sum = r.summary();
        assert_eq!(sum.count, 10_000);
        // 2 significant digits: within 1 %.
        let near = |got: u64, want: u64| got.abs_diff(want) * 100 <= want;
        assert!(near(sum.p50_ns, 5_000_000), "{sum:?}");
        assert!(near(sum.p99_ns, 9_900_000), "{sum:?}");
        assert!(near(sum.p99_9_ns, 9_990_000), "{sum:?}");
        assert!(near(sum.p99_99_ns, 9_999_000), "{sum:?}");
        assert_eq!(sum.max_ns, 10_000_000);
        let w = s.direction(Direction::Write).summary();
        assert_eq!(w.max_ns, 70_000_000_000, "the exact maximum survives saturation");
        assert!(w.p50_ns <= LATENCY_NS_MAX + LATENCY_NS_MAX / 100);
        assert_eq!(s.ios(), 10_002);
        assert_eq!(s.direction(Direction::Trim).summary().count, 0);
    }

    #[test]
    fn merge_adds_and_reset_clears() {
        let mut a = QueueStats::new();
        let mut b = QueueStats::new();
        a.record(Direction::Read, 4096, 10_000, Outcome::Success);
        b.record(Direction::Read, 4096, 30_000, Outcome::Success);
        b.record(Direction::Sync, 0, 50_000, Outcome::Error);
        b.record_requeue();
        b.record_busy();
        a.merge(&b);
        assert_eq!((a.ios(), a.errors(), a.bytes(), a.requeues, a.busy), (3, 1, 8192, 1, 1));
        assert_eq!(a.direction(Direction::Read).summary().max_ns, 30_000);
        assert_eq!(a.direction(Direction::Read).latency().len(), 2);
        a.reset();
        assert_eq!((a.ios(), a.requeues, a.direction(Direction::Read).latency().len()), (0, 0, 0));
    }

    #[test]
    fn histogram_memory_is_bounded() {
        // Keep the per-queue footprint in sight: at most ~32 KiB per direction,
        // allocated only for directions that saw I/O.
        let h = histogram();
        assert!(h.slots() * 8 <= 32 * 1024, "{} counts", h.slots());
        let s = QueueStats::new();
        assert!(s.dirs.iter().all(|d| d.latency.is_none()));
    }
}
