//! Per-queue counters.
//!
//! Each counter has exactly one writer (the reactor thread that owns the
//! queue), which updates it with a relaxed load and store: no locked
//! instruction and no shared cache line written per I/O. Readers (RPC,
//! metrics) load them relaxed and may see values a few I/Os old.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one queue (one connection).
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Commands received.
    pub commands: Counter,
    /// Read commands completed.
    pub reads: Counter,
    /// Write commands completed.
    pub writes: Counter,
    /// Bytes read by the host.
    pub read_bytes: Counter,
    /// Bytes written by the host.
    pub write_bytes: Counter,
    /// Commands completed with an error status.
    pub errors: Counter,
    /// Commands currently outstanding.
    pub outstanding: Counter,
    /// Sum of command service times in ns (for the mean): receive reaped to response queued.
    pub latency_ns_sum: Counter,
    /// Input passes the PDU budget (`rx_budget_pdus`) cut short.
    pub rx_budget_stops: Counter,
    /// Most PDUs one input pass parsed (at most `rx_budget_pdus` when it is set).
    pub rx_pass_pdus_max: Counter,
    /// Most reactor turns this queue's received input waited, other queues served first.
    pub ready_wait_turns_max: Counter,
}

/// A single-writer counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `v` (only from the owning thread).
    #[inline]
    pub fn add(&self, v: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }
    /// Subtracts `v` (only from the owning thread).
    #[inline]
    pub fn sub(&self, v: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_sub(v), Ordering::Relaxed);
    }
    /// Raises the value to `v` if it is larger (only from the owning thread).
    #[inline]
    pub fn max(&self, v: u64) {
        if v > self.0.load(Ordering::Relaxed) {
            self.0.store(v, Ordering::Relaxed);
        }
    }
    /// Current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A snapshot for reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct QueueStatsSnapshot {
    /// Commands received.
    pub commands: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Error completions.
    pub errors: u64,
    /// Outstanding now.
    pub outstanding: u64,
    /// Mean service time in ns.
    pub latency_ns_mean: u64,
    /// Sum of service times in ns (differences of two snapshots give a window's mean).
    pub latency_ns_sum: u64,
    /// Input passes the PDU budget cut short.
    pub rx_budget_stops: u64,
    /// Most PDUs one input pass parsed.
    pub rx_pass_pdus_max: u64,
    /// Most reactor turns received input waited for this queue's turn.
    pub ready_wait_turns_max: u64,
}

impl QueueStats {
    /// A snapshot.
    pub fn snapshot(&self) -> QueueStatsSnapshot {
        let done = self.commands.get().saturating_sub(self.outstanding.get()).max(1);
        QueueStatsSnapshot {
            commands: self.commands.get(),
            reads: self.reads.get(),
            writes: self.writes.get(),
            read_bytes: self.read_bytes.get(),
            write_bytes: self.write_bytes.get(),
            errors: self.errors.get(),
            outstanding: self.outstanding.get(),
            latency_ns_mean: self.latency_ns_sum.get() / done,
            latency_ns_sum: self.latency_ns_sum.get(),
            rx_budget_stops: self.rx_budget_stops.get(),
            rx_pass_pdus_max: self.rx_pass_pdus_max.get(),
            ready_wait_turns_max: self.ready_wait_turns_max.get(),
        }
    }
}

/// I/O counters of one namespace as seen by one queue (published on the queue's tick).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NsCounters {
    /// NSID.
    pub nsid: u32,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Commands that failed.
    pub errors: u64,
}

impl NsCounters {
    /// Adds `o` into these.
    pub fn add(&mut self, o: &NsCounters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.errors += o.errors;
    }
}

/// Latency percentiles of one direction, for reports (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct LatencyReport {
    /// Completions.
    pub ios: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p99_9_us: f64,
    /// Largest, µs.
    pub max_us: f64,
}

impl LatencyReport {
    /// From one direction of blk queue statistics.
    pub fn of(s: &blk::QueueStats, dir: blk::Direction) -> LatencyReport {
        let d = s.direction(dir);
        let sum = d.summary();
        #[allow(clippy::cast_precision_loss)] // report values
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencyReport {
            ios: d.ios,
            mean_us: sum.mean_ns / 1000.0,
            p50_us: us(sum.p50_ns),
            p99_us: us(sum.p99_ns),
            p99_9_us: us(sum.p99_9_ns),
            max_us: us(sum.max_ns),
        }
    }
}
