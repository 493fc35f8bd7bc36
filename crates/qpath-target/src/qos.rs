//! Provisioned-device emulation: per-namespace IOPS and bandwidth limits and
//! an added latency, as a cloud volume has (seed 003: an 18,000 IOPS / 750 MB/s
//! device and a 3,500 IOPS / 170 MB/s one behind the same host).
//!
//! The limit is a virtual-time scheduler (GCRA): each I/O costs
//! `max(1 s / iops, bytes / bandwidth)` of device time; it may start at
//! `max(now, next_free)` and moves `next_free` by its cost. I/Os that must
//! wait are parked by their connection until their start time, so the
//! namespace serves exactly its provisioned rate and queues the rest, like
//! the device would. With no limit set the I/O path does one relaxed load.

use std::sync::atomic::{AtomicU64, Ordering};

/// Limits of one namespace. All zero = unlimited, no added latency.
#[derive(Debug, Default)]
pub struct Qos {
    iops: AtomicU64,
    bytes_per_sec: AtomicU64,
    delay_ns: AtomicU64,
    /// Device time (ns since the target's epoch) at which the device is next free.
    next_free_ns: AtomicU64,
}

/// A snapshot of the settings, for reports and RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct QosSettings {
    /// I/O operations per second (0 = unlimited).
    #[serde(default)]
    pub iops: u64,
    /// Bytes per second (0 = unlimited).
    #[serde(default)]
    pub bytes_per_sec: u64,
    /// Latency added to every I/O, in microseconds.
    #[serde(default)]
    pub delay_us: u64,
}

impl Qos {
    /// Applies new settings.
    pub fn set(&self, s: QosSettings) {
        self.iops.store(s.iops, Ordering::Relaxed);
        self.bytes_per_sec.store(s.bytes_per_sec, Ordering::Relaxed);
        self.delay_ns.store(s.delay_us.saturating_mul(1000), Ordering::Relaxed);
    }

    /// Current settings.
    pub fn get(&self) -> QosSettings {
        QosSettings {
            iops: self.iops.load(Ordering::Relaxed),
            bytes_per_sec: self.bytes_per_sec.load(Ordering::Relaxed),
            delay_us: self.delay_ns.load(Ordering::Relaxed) / 1000,
        }
    }

    /// When an I/O of `bytes` arriving at `now_ns` may complete: `None` when
    /// there is no limit and no added latency (the common case: one load).
    #[inline]
    pub fn admit(&self, now_ns: u64, bytes: u64) -> Option<u64> {
        let iops = self.iops.load(Ordering::Relaxed);
        let bw = self.bytes_per_sec.load(Ordering::Relaxed);
        let delay = self.delay_ns.load(Ordering::Relaxed);
        if iops == 0 && bw == 0 && delay == 0 {
            return None;
        }
        let per_io = 1_000_000_000u64.checked_div(iops).unwrap_or(0);
        let per_byte = bytes.saturating_mul(1_000_000_000).checked_div(bw).unwrap_or(0);
        let cost = per_io.max(per_byte);
        let start = if cost > 0 {
            let mut cur = self.next_free_ns.load(Ordering::Relaxed);
            loop {
                let start = cur.max(now_ns);
                match self.next_free_ns.compare_exchange_weak(cur, start + cost, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break start,
                    Err(v) => cur = v,
                }
            }
        } else {
            now_ns
        };
        Some(start + cost + delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_is_none() {
        assert_eq!(Qos::default().admit(5, 4096), None);
    }

    #[test]
    fn iops_limit_spaces_ios() {
        let q = Qos::default();
        q.set(QosSettings { iops: 1000, bytes_per_sec: 0, delay_us: 0 });
        // 1000 IOPS = 1 ms per I/O; three I/Os arriving together finish 1, 2, 3 ms later.
        assert_eq!(q.admit(0, 4096), Some(1_000_000));
        assert_eq!(q.admit(0, 4096), Some(2_000_000));
        assert_eq!(q.admit(0, 4096), Some(3_000_000));
        // An idle device does not bank credit.
        assert_eq!(q.admit(10_000_000, 4096), Some(11_000_000));
    }

    #[test]
    fn bandwidth_and_delay() {
        let q = Qos::default();
        q.set(QosSettings { iops: 0, bytes_per_sec: 1 << 20, delay_us: 100 });
        // 64 KiB at 1 MiB/s = 62.5 ms, plus 100 us.
        assert_eq!(q.admit(0, 65536), Some(62_500_000 + 100_000));
        assert_eq!(q.get().delay_us, 100);
    }
}
