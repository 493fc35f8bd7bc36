//! **Reference selectors, for the benchmark only.** They reproduce the two
//! queue-depth selectors of seed 000 (the linux-nvme thread of October 2023)
//! so `benches/path_select.rs` can measure [`super::Selector`] against them
//! on the same machine, and `qpath lab seed-000` can run I/O through them (a
//! head's [`crate::head::ReferenceSelector`], `lab-baselines` feature). Do not
//! use them for production I/O: they are shared between threads by design,
//! which is what makes them slow.
//!
//! - [`SumPerQueue`]: every path has one in-flight counter per hardware
//!   queue (blk-mq's per-hctx `nr_active`); selection sums all queues of all
//!   paths. The seed's first version: 46 µs per selection with 64 queues.
//! - [`SharedAtomic`]: one in-flight counter per path (Linux `ctrl->nr_active`),
//!   incremented at submission and decremented at completion by every thread;
//!   selection reads one counter per path. The seed's fix, merged in 6.11.
//!
//! Both keep the Linux scan: every path each time, the least loaded
//! optimized path, else the least loaded non-optimized one (first wins ties).
//! Each counter sits on its own cache line, as hctxs and controllers are
//! separate allocations in the kernel.

use std::sync::atomic::{AtomicU32, Ordering};

use super::path::{PathClass, PathIndex, Selection};

/// Hardware queues per path in the seed's setup (one per CPU, 64 there; 32 is
/// the benchmark's default).
pub const QUEUES_PER_PATH: usize = 32;

/// A counter alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line(AtomicU32);

/// Linux's answer when no path is usable: requeue if a path may come back.
fn fallback(classes: &[PathClass]) -> Selection {
    if classes.contains(&PathClass::Transient) { Selection::Requeue } else { Selection::Fail }
}

/// The Linux scan over `(class, depth)` pairs: least loaded optimized path,
/// else least loaded non-optimized path.
#[inline]
fn scan(paths: impl Iterator<Item = (PathClass, u32)>) -> Option<usize> {
    let (mut best_opt, mut min_opt) = (None, u32::MAX);
    let (mut best_nonopt, mut min_nonopt) = (None, u32::MAX);
    for (i, (class, depth)) in paths.enumerate() {
        match class {
            PathClass::Optimized if depth < min_opt => {
                min_opt = depth;
                best_opt = Some(i);
            }
            PathClass::NonOptimized if depth < min_nonopt => {
                min_nonopt = depth;
                best_nonopt = Some(i);
            }
            _ => {}
        }
    }
    best_opt.or(best_nonopt)
}

fn index(i: usize) -> PathIndex {
    PathIndex(u16::try_from(i).expect("reference selectors hold at most u16::MAX paths"))
}

/// Seed 000, first version: per-queue counters, summed over every queue of
/// every path at each selection. Shared by all submitting threads.
#[derive(Debug)]
pub struct SumPerQueue {
    classes: Vec<PathClass>,
    /// `paths × queues` counters, path-major.
    counters: Vec<Line>,
    queues: usize,
    fallback: Selection,
}

impl SumPerQueue {
    /// Paths of the given classes, each with `queues` hardware queues (at least 1).
    pub fn new(classes: &[PathClass], queues: usize) -> SumPerQueue {
        let queues = queues.max(1);
        SumPerQueue {
            classes: classes.to_vec(),
            counters: (0..classes.len() * queues).map(|_| Line::default()).collect(),
            queues,
            fallback: fallback(classes),
        }
    }

    /// Hardware queues per path.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// Linux `nvme_find_path` with `blk_mq_queue_nr_active` as the depth.
    #[inline]
    pub fn select(&self) -> Selection {
        let depths = self
            .classes
            .iter()
            .zip(self.counters.chunks_exact(self.queues))
            .map(|(&c, qs)| (c, qs.iter().map(|q| q.0.load(Ordering::Relaxed)).fold(0u32, u32::wrapping_add)));
        scan(depths).map_or(self.fallback, |i| Selection::Submit(index(i)))
    }

    /// An I/O went out on `path` through hardware queue `queue` (the submitting CPU's).
    #[inline]
    pub fn on_submit(&self, path: PathIndex, queue: usize) {
        self.counters[path.get() * self.queues + queue % self.queues].0.fetch_add(1, Ordering::Relaxed);
    }

    /// That I/O completed.
    #[inline]
    pub fn on_complete(&self, path: PathIndex, queue: usize) {
        self.counters[path.get() * self.queues + queue % self.queues].0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Seed 000, the fix: one shared atomic in-flight counter per path.
#[derive(Debug)]
pub struct SharedAtomic {
    classes: Vec<PathClass>,
    counters: Vec<Line>,
    fallback: Selection,
}

impl SharedAtomic {
    /// Paths of the given classes.
    pub fn new(classes: &[PathClass]) -> SharedAtomic {
        SharedAtomic {
            classes: classes.to_vec(),
            counters: classes.iter().map(|_| Line::default()).collect(),
            fallback: fallback(classes),
        }
    }

    /// Linux 6.11 `nvme_queue_depth_path`.
    #[inline]
    pub fn select(&self) -> Selection {
        let depths = self.classes.iter().zip(&self.counters).map(|(&c, n)| (c, n.0.load(Ordering::Relaxed)));
        scan(depths).map_or(self.fallback, |i| Selection::Submit(index(i)))
    }

    /// An I/O went out on `path` (Linux `nvme_mpath_start_request`).
    #[inline]
    pub fn on_submit(&self, path: PathIndex) {
        self.counters[path.get()].0.fetch_add(1, Ordering::Relaxed);
    }

    /// That I/O completed (Linux `nvme_mpath_end_request`).
    #[inline]
    pub fn on_complete(&self, path: PathIndex) {
        self.counters[path.get()].0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_pick_least_loaded_optimized_first() {
        use PathClass::*;
        let classes = [NonOptimized, Optimized, Optimized, Gone];
        let sum = SumPerQueue::new(&classes, 4);
        let shared = SharedAtomic::new(&classes);
        assert_eq!(sum.select(), Selection::Submit(PathIndex(1)));
        assert_eq!(shared.select(), Selection::Submit(PathIndex(1)));
        sum.on_submit(PathIndex(1), 3);
        shared.on_submit(PathIndex(1));
        assert_eq!(sum.select(), Selection::Submit(PathIndex(2)));
        assert_eq!(shared.select(), Selection::Submit(PathIndex(2)));
        sum.on_complete(PathIndex(1), 3);
        shared.on_complete(PathIndex(1));
        assert_eq!(sum.select(), Selection::Submit(PathIndex(1)));
        assert_eq!(shared.select(), Selection::Submit(PathIndex(1)));
    }

    #[test]
    fn references_requeue_or_fail() {
        use PathClass::*;
        assert_eq!(SharedAtomic::new(&[Gone, Transient]).select(), Selection::Requeue);
        assert_eq!(SumPerQueue::new(&[Gone, Gone], 2).select(), Selection::Fail);
        assert_eq!(SharedAtomic::new(&[]).select(), Selection::Fail);
    }
}
