//! Queue maps: which hardware queue a CPU submits on (blk-mq's
//! `blk_mq_queue_map` and `blk_mq_map_queues`).
//!
//! There is one map per [`QueueType`]. A map spreads `nr_cpus` CPUs over its
//! `nr_queues` queues in contiguous groups, as even as they divide (group
//! sizes differ by at most one): CPU `c` goes to queue `c * nr_queues /
//! nr_cpus`, so neighbouring CPUs (SMT siblings, one NUMA node) share a queue.
//! With more queues than CPUs, CPU `c` gets queue `c` and the queues above
//! `nr_cpus` have no CPU (they remain usable, e.g. as user-owned queue pairs).
//!
//! Queue indices are global across the types: the default queues come first,
//! then the read queues, then the poll queues (`queue_offset`), as nvme-pci
//! lays them out. A type with no queues of its own falls back to the default
//! map, resolved once at construction, so a lookup is one load.

use std::fmt;
use std::ops::Range;

use crate::error::{Error, ErrorKind, Result};

/// A hardware queue's index in its controller's (or tag set's) queue array,
/// from 0. The host's NVMe I/O queue id is this plus one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueIndex(pub u16);

impl QueueIndex {
    /// As an index into per-queue tables.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for QueueIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "queue {}", self.0)
    }
}

/// The kinds of hardware queue (blk-mq's `hctx_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueType {
    /// Everything not sent elsewhere.
    Default,
    /// Reads, when the controller has dedicated read queues.
    Read,
    /// Polled I/O (no completion notification; the submitter polls).
    Poll,
}

impl QueueType {
    /// All types, in queue-index order.
    pub const ALL: [QueueType; 3] = [QueueType::Default, QueueType::Read, QueueType::Poll];

    const fn slot(self) -> usize {
        match self {
            QueueType::Default => 0,
            QueueType::Read => 1,
            QueueType::Poll => 2,
        }
    }
}

/// Where `item` of `n_items` lands among `n_bins` in contiguous, even groups.
#[inline]
pub(crate) fn spread_index(item: usize, n_items: usize, n_bins: usize) -> usize {
    if n_bins >= n_items { item } else { item * n_bins / n_items }
}

/// The items of `n_items` that [`spread_index`] sends to `bin`.
pub(crate) fn spread_range(bin: usize, n_items: usize, n_bins: usize) -> Range<usize> {
    if n_bins >= n_items {
        if bin < n_items { bin..bin + 1 } else { n_items..n_items }
    } else {
        // item * n_bins / n_items == bin  <=>  bin * n_items / n_bins <= item < (bin + 1) * n_items / n_bins
        (bin * n_items).div_ceil(n_bins)..((bin + 1) * n_items).div_ceil(n_bins)
    }
}

/// One queue type's map: CPU → hardware queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMap {
    /// Indexed by CPU: the global queue index.
    mq_map: Box<[u16]>,
    nr_queues: u16,
    queue_offset: u16,
}

impl QueueMap {
    /// Spreads `nr_cpus` CPUs over queues `0..nr_queues`.
    pub fn spread(nr_cpus: usize, nr_queues: u16) -> Result<QueueMap> {
        QueueMap::spread_at(nr_cpus, nr_queues, 0)
    }

    /// Spreads `nr_cpus` CPUs over queues `queue_offset..queue_offset + nr_queues`.
    pub fn spread_at(nr_cpus: usize, nr_queues: u16, queue_offset: u16) -> Result<QueueMap> {
        if nr_cpus == 0 || nr_cpus > usize::from(u16::MAX) {
            return Err(Error::new(ErrorKind::InvalidCount, format!("queue map: {nr_cpus} CPUs (1..=65535)")));
        }
        if nr_queues == 0 || queue_offset.checked_add(nr_queues - 1).is_none() {
            return Err(Error::new(
                ErrorKind::InvalidCount,
                format!("queue map: {nr_queues} queues at offset {queue_offset} (at least 1, indices below 65536)"),
            ));
        }
        let mq_map = (0..nr_cpus)
            .map(|cpu| {
                let q = spread_index(cpu, nr_cpus, usize::from(nr_queues));
                // q < nr_queues, and offset + nr_queues - 1 fits in u16 (checked above).
                queue_offset + u16::try_from(q).expect("spread_index stays below nr_queues")
            })
            .collect();
        Ok(QueueMap { mq_map, nr_queues, queue_offset })
    }

    /// The queue CPU `cpu` submits on. A CPU beyond the map (hot-added after
    /// it was built) wraps around instead of failing the I/O.
    #[inline]
    pub fn queue(&self, cpu: usize) -> QueueIndex {
        match self.mq_map.get(cpu) {
            Some(&q) => QueueIndex(q),
            None => self.queue_wrapped(cpu),
        }
    }

    #[cold]
    fn queue_wrapped(&self, cpu: usize) -> QueueIndex {
        QueueIndex(self.mq_map[cpu % self.mq_map.len()])
    }

    /// The CPUs that submit on `queue` (contiguous; empty for a queue no CPU maps to).
    pub fn cpus(&self, queue: QueueIndex) -> Range<usize> {
        let n = self.nr_cpus();
        match queue.0.checked_sub(self.queue_offset) {
            Some(local) if local < self.nr_queues => spread_range(usize::from(local), n, usize::from(self.nr_queues)),
            _ => n..n,
        }
    }

    /// Queues in this map.
    pub fn nr_queues(&self) -> u16 {
        self.nr_queues
    }

    /// Global index of this map's first queue.
    pub fn queue_offset(&self) -> u16 {
        self.queue_offset
    }

    /// CPUs the map covers.
    pub fn nr_cpus(&self) -> usize {
        self.mq_map.len()
    }

    /// This map's queues.
    pub fn queues(&self) -> impl Iterator<Item = QueueIndex> + use<> {
        let start = self.queue_offset;
        (0..self.nr_queues).map(move |q| QueueIndex(start + q))
    }
}

/// The maps of all three queue types, with fallback to the default map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMaps {
    /// Effective maps (a type without queues holds a copy of the default map).
    maps: [QueueMap; 3],
    /// Queues each type asked for (0 = falls back to default).
    own: [u16; 3],
}

impl QueueMaps {
    /// Maps `nr_cpus` CPUs onto `default` default queues (at least 1), then
    /// `read` read queues and `poll` poll queues (0 = use the default queues).
    pub fn new(nr_cpus: usize, default: u16, read: u16, poll: u16) -> Result<QueueMaps> {
        let total = u32::from(default) + u32::from(read) + u32::from(poll);
        if total > u32::from(u16::MAX) {
            return Err(Error::new(ErrorKind::InvalidCount, format!("queue maps: {total} queues (at most 65535)")));
        }
        let default_map = QueueMap::spread_at(nr_cpus, default, 0)?;
        let own = [default, read, poll];
        let mut offset = default;
        let mut typed = |n: u16| -> Result<QueueMap> {
            if n == 0 {
                return Ok(default_map.clone());
            }
            let map = QueueMap::spread_at(nr_cpus, n, offset)?;
            offset += n;
            Ok(map)
        };
        let read_map = typed(read)?;
        let poll_map = typed(poll)?;
        Ok(QueueMaps { maps: [default_map, read_map, poll_map], own })
    }

    /// The queue a CPU submits I/O of type `ty` on.
    #[inline]
    pub fn queue(&self, ty: QueueType, cpu: usize) -> QueueIndex {
        self.maps[ty.slot()].queue(cpu)
    }

    /// The effective map for `ty` (the default map for a type without queues).
    pub fn map(&self, ty: QueueType) -> &QueueMap {
        &self.maps[ty.slot()]
    }

    /// Whether `ty` has queues of its own (otherwise it falls back to default).
    pub fn has_own_queues(&self, ty: QueueType) -> bool {
        self.own[ty.slot()] > 0
    }

    /// All hardware queues across the types.
    pub fn total_queues(&self) -> u16 {
        // new() checked the sum fits.
        self.own.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cpu_count_over_every_queue_count() {
        for nr_cpus in 1..=8usize {
            for nr_queues in 1..=8u16 {
                let map = QueueMap::spread(nr_cpus, nr_queues).unwrap();
                let used = usize::from(nr_queues).min(nr_cpus);
                let mut per_queue = vec![0usize; usize::from(nr_queues)];
                let mut prev = 0;
                for cpu in 0..nr_cpus {
                    let q = map.queue(cpu);
                    assert!(q.0 < nr_queues, "{nr_cpus}x{nr_queues}: cpu {cpu} -> {q}");
                    assert!(q.0 >= prev, "{nr_cpus}x{nr_queues}: groups are contiguous and ordered");
                    prev = q.0;
                    per_queue[q.index()] += 1;
                    assert!(map.cpus(q).contains(&cpu), "{nr_cpus}x{nr_queues}: cpus() agrees with queue()");
                }
                // The first `used` queues each get floor or ceil of cpus/queues; the rest none.
                let (lo, hi) = (nr_cpus / used, nr_cpus.div_ceil(used));
                for (q, &n) in per_queue.iter().enumerate() {
                    if q < used {
                        assert!((lo..=hi).contains(&n), "{nr_cpus}x{nr_queues}: queue {q} has {n} cpus");
                    } else {
                        assert_eq!(n, 0, "{nr_cpus}x{nr_queues}: queue {q} beyond the cpus");
                    }
                    let q16 = QueueIndex(u16::try_from(q).unwrap());
                    assert_eq!(map.cpus(q16).len(), n, "{nr_cpus}x{nr_queues}: queue {q}");
                }
            }
        }
    }

    #[test]
    fn groups_are_contiguous_like_blk_mq() {
        let map = QueueMap::spread(8, 3).unwrap();
        let got: Vec<u16> = (0..8).map(|c| map.queue(c).0).collect();
        assert_eq!(got, vec![0, 0, 0, 1, 1, 1, 2, 2]);
        assert_eq!(map.cpus(QueueIndex(2)), 6..8);
    }

    #[test]
    fn cpu_beyond_the_map_wraps() {
        let map = QueueMap::spread(2, 2).unwrap();
        assert_eq!(map.queue(5), QueueIndex(1));
    }

    #[test]
    fn typed_maps_are_offset_and_fall_back() {
        let maps = QueueMaps::new(4, 2, 2, 0).unwrap();
        assert_eq!(maps.total_queues(), 4);
        assert_eq!(maps.queue(QueueType::Default, 3), QueueIndex(1));
        assert_eq!(maps.queue(QueueType::Read, 0), QueueIndex(2));
        assert_eq!(maps.queue(QueueType::Read, 3), QueueIndex(3));
        assert!(!maps.has_own_queues(QueueType::Poll));
        assert_eq!(maps.queue(QueueType::Poll, 3), QueueIndex(1), "poll falls back to default");
        assert_eq!(maps.map(QueueType::Read).queue_offset(), 2);
        assert_eq!(maps.map(QueueType::Read).queues().collect::<Vec<_>>(), vec![QueueIndex(2), QueueIndex(3)]);

        let maps = QueueMaps::new(2, 1, 0, 1).unwrap();
        assert_eq!(maps.queue(QueueType::Read, 1), QueueIndex(0), "read falls back to default");
        assert_eq!(maps.queue(QueueType::Poll, 1), QueueIndex(1), "poll queues follow default ones");
    }

    #[test]
    fn refuses_empty_and_oversized_maps() {
        assert_eq!(QueueMap::spread(0, 1).unwrap_err().kind, ErrorKind::InvalidCount);
        assert_eq!(QueueMap::spread(1, 0).unwrap_err().kind, ErrorKind::InvalidCount);
        assert_eq!(QueueMaps::new(1, 0, 1, 1).unwrap_err().kind, ErrorKind::InvalidCount);
        assert_eq!(QueueMaps::new(1, u16::MAX, 1, 0).unwrap_err().kind, ErrorKind::InvalidCount);
        assert!(QueueMap::spread_at(1, 2, u16::MAX - 1).is_ok());
        assert!(QueueMap::spread_at(1, 3, u16::MAX - 1).is_err());
    }
}
