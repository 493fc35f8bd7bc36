//! Counters: per queue, and the monotonic totals each namespace and each port keep.
//!
//! Each queue counter has exactly one writer (the reactor thread that owns the
//! queue), which updates it with a relaxed load and store: no locked
//! instruction and no shared cache line written per I/O. Readers (RPC,
//! metrics) load them relaxed and may see values a few I/Os old.
//!
//! ```text
//!   per I/O:   Connection.ns_local / local_stats   (owned, plain adds)
//!   per tick:  ──deltas──► Namespace.counters (NsTotals)   ─► SMART log, /metrics, stats RPC
//!              ──deltas──► port totals (PortTotals)        ─► /metrics, stats RPC
//!   on close:  the same, once more (nothing unpublished is lost)
//! ```
//!
//! The totals only grow (relaxed `fetch_add` of a connection's deltas, once per tick):
//! a host that disconnects takes its queue's series away, never part of a `_total`.

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
    /// Most PDUs one input pass parsed while other queues of the reactor had work (at most
    /// `rx_budget_pdus` when it is set; a queue alone on its reactor is not cut).
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
    /// Most PDUs one input pass parsed while other queues of the reactor had work.
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

/// I/O counters of one namespace: a queue's since its last publish, or a namespace's
/// totals ([`NsTotals::snapshot`]).
///
/// Two views of the same completions: `reads`/`writes` and their bytes follow the I/O
/// direction the latency statistics use (Write Zeroes is a write of its range), the
/// `host_*`/`data_*` fields follow the SMART / Health log's rules
/// ([`crate::supported::Smart`]: Read and Compare, Write; Write Zeroes not counted).
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
    /// SMART Host Read Commands.
    pub host_read_commands: u64,
    /// SMART Host Write Commands.
    pub host_write_commands: u64,
    /// Bytes behind SMART Data Units Read.
    pub data_read_bytes: u64,
    /// Bytes behind SMART Data Units Written.
    pub data_written_bytes: u64,
    /// SMART Media and Data Integrity Errors: commands the backend failed (a status of
    /// the Media and Data Integrity Errors type).
    pub media_errors: u64,
}

impl NsCounters {
    /// Adds `o` into these.
    pub fn add(&mut self, o: &NsCounters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.errors += o.errors;
        self.host_read_commands += o.host_read_commands;
        self.host_write_commands += o.host_write_commands;
        self.data_read_bytes += o.data_read_bytes;
        self.data_written_bytes += o.data_written_bytes;
        self.media_errors += o.media_errors;
    }

    /// The counters as an array, in one fixed order (for [`NsTotals`]).
    fn values(&self) -> [u64; NS_COUNTERS] {
        [
            self.reads,
            self.writes,
            self.read_bytes,
            self.write_bytes,
            self.errors,
            self.host_read_commands,
            self.host_write_commands,
            self.data_read_bytes,
            self.data_written_bytes,
            self.media_errors,
        ]
    }

    fn from_values(nsid: u32, v: [u64; NS_COUNTERS]) -> NsCounters {
        let [reads, writes, read_bytes, write_bytes, errors, hr, hw, dr, dw, media] = v;
        NsCounters {
            nsid,
            reads,
            writes,
            read_bytes,
            write_bytes,
            errors,
            host_read_commands: hr,
            host_write_commands: hw,
            data_read_bytes: dr,
            data_written_bytes: dw,
            media_errors: media,
        }
    }

    /// Whether nothing was counted.
    pub fn is_zero(&self) -> bool {
        self.values().iter().all(|&v| v == 0)
    }
}

const NS_COUNTERS: usize = 10;

/// A namespace's monotonic counters since it was added: its connections add their
/// deltas on their tick and when they close ([`NsCounters`] fields; never decrease).
#[derive(Debug, Default)]
pub struct NsTotals([AtomicU64; NS_COUNTERS]);

impl NsTotals {
    /// Adds a connection's deltas (its tick, or its close).
    pub fn add(&self, d: &NsCounters) {
        for (t, v) in self.0.iter().zip(d.values()) {
            if v != 0 {
                t.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// The totals now, labelled `nsid`.
    pub fn snapshot(&self, nsid: u32) -> NsCounters {
        NsCounters::from_values(nsid, std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// A port's monotonic I/O counters by direction ([`blk::Direction::ALL`] order), added
/// to by its connections on their tick and when they close.
#[derive(Debug, Default)]
pub struct PortTotals {
    ios: [AtomicU64; 4],
    bytes: [AtomicU64; 4],
    errors: [AtomicU64; 4],
}

/// A port's totals by direction ([`blk::Direction::ALL`] order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Completed I/O commands.
    pub ios: [u64; 4],
    /// Bytes moved by the successful ones.
    pub bytes: [u64; 4],
    /// Failed ones.
    pub errors: [u64; 4],
}

impl PortTotals {
    /// Adds a connection's statistics since its last publish.
    pub fn add(&self, d: &blk::QueueStats) {
        for (i, dir) in blk::Direction::ALL.iter().enumerate() {
            let s = d.direction(*dir);
            for (t, v) in [(&self.ios[i], s.ios), (&self.bytes[i], s.bytes), (&self.errors[i], s.errors)] {
                if v != 0 {
                    t.fetch_add(v, Ordering::Relaxed);
                }
            }
        }
    }

    /// The totals now.
    pub fn snapshot(&self) -> PortCounters {
        let load = |a: &[AtomicU64; 4]| std::array::from_fn(|i| a[i].load(Ordering::Relaxed));
        PortCounters { ios: load(&self.ios), bytes: load(&self.bytes), errors: load(&self.errors) }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_deltas_and_never_lose_a_field() {
        let t = NsTotals::default();
        let d = NsCounters {
            nsid: 1,
            reads: 1,
            writes: 2,
            read_bytes: 3,
            write_bytes: 4,
            errors: 5,
            host_read_commands: 6,
            host_write_commands: 7,
            data_read_bytes: 8,
            data_written_bytes: 9,
            media_errors: 10,
        };
        t.add(&d);
        t.add(&d);
        let mut twice = d;
        twice.add(&d);
        assert_eq!(t.snapshot(1), twice);
        assert!(!twice.is_zero() && NsCounters::default().is_zero());
        let p = PortTotals::default();
        let mut q = blk::QueueStats::new();
        q.record(blk::Direction::Read, 4096, 10, blk::Outcome::Success);
        q.record(blk::Direction::Write, 512, 10, blk::Outcome::Error);
        p.add(&q);
        p.add(&q);
        let s = p.snapshot();
        assert_eq!((s.ios, s.bytes, s.errors), ([2, 2, 0, 0], [8192, 0, 0, 0], [0, 2, 0, 0]));
    }
}
