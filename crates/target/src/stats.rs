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
    /// Sum of command service times in ns (for the mean).
    pub latency_ns_sum: Counter,
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
        }
    }
}
