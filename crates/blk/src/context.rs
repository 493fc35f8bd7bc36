//! Which completion context (a thread that submits and reaps on its own)
//! drives which hardware queue (seed 004: more queues than interrupt vectors;
//! here, more queues than threads).
//!
//! [`ContextMap`] deals queues to contexts: contiguous groups (queues `0..k`
//! on context 0, ...: pairs with the contiguous CPU groups of
//! [`QueueMap`](crate::QueueMap), so a CPU's queue is driven by a context near
//! it) or round-robin (queue `q` on context `q % n`, as Linux shares vectors).
//! The contexts themselves (event loop, active-queue list, submission and
//! completion) live in the host, next to the NVMe/TCP queues they drive.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};
use crate::queue_map::{QueueIndex, spread_index};

/// A completion context (one per driving thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContextId(pub u16);

impl fmt::Display for ContextId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "context {}", self.0)
    }
}

/// How queues are dealt to contexts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ContextSpread {
    /// Contiguous, even groups: queue `q` on context `q * contexts / queues`.
    #[default]
    Contiguous,
    /// Queue `q` on context `q % contexts` (Linux's `i % nr_vecs`).
    RoundRobin,
}

/// Which context drives each hardware queue, and the reverse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextMap {
    /// Indexed by queue.
    context_of: Box<[u16]>,
    /// Queues grouped by context, ascending within a group.
    queues: Box<[QueueIndex]>,
    /// `queues[starts[c]..starts[c + 1]]` are context `c`'s.
    starts: Box<[usize]>,
}

impl ContextMap {
    /// Deals `nr_queues` queues (0..) to `nr_contexts` contexts. With more
    /// contexts than queues, the contexts above `nr_queues` drive none.
    pub fn new(nr_queues: u16, nr_contexts: u16, spread: ContextSpread) -> Result<ContextMap> {
        if nr_queues == 0 || nr_contexts == 0 {
            return Err(Error::new(
                ErrorKind::InvalidCount,
                format!("context map: {nr_queues} queues over {nr_contexts} contexts (at least 1 each)"),
            ));
        }
        let (nq, nc) = (usize::from(nr_queues), usize::from(nr_contexts));
        let context_of: Box<[u16]> = (0..nq)
            .map(|q| {
                let c = match spread {
                    ContextSpread::Contiguous => spread_index(q, nq, nc),
                    ContextSpread::RoundRobin => q % nc,
                };
                u16::try_from(c).expect("context index below nr_contexts")
            })
            .collect();
        let mut starts = vec![0usize; nc + 1];
        for &c in &context_of {
            starts[usize::from(c) + 1] += 1;
        }
        for c in 0..nc {
            starts[c + 1] += starts[c];
        }
        let mut fill = starts.clone();
        let mut queues = vec![QueueIndex(0); nq];
        for (q, &c) in (0..nr_queues).zip(context_of.iter()) {
            queues[fill[usize::from(c)]] = QueueIndex(q);
            fill[usize::from(c)] += 1;
        }
        Ok(ContextMap { context_of, queues: queues.into(), starts: starts.into() })
    }

    /// The context that drives `queue` (`None` beyond the map).
    #[inline]
    pub fn context_of(&self, queue: QueueIndex) -> Option<ContextId> {
        self.context_of.get(queue.index()).map(|&c| ContextId(c))
    }

    /// The queues `context` drives, ascending (empty beyond the map).
    pub fn queues_of(&self, context: ContextId) -> &[QueueIndex] {
        let c = usize::from(context.0);
        match (self.starts.get(c), self.starts.get(c + 1)) {
            (Some(&a), Some(&b)) => &self.queues[a..b],
            _ => &[],
        }
    }

    /// Queues in the map.
    pub fn nr_queues(&self) -> usize {
        self.context_of.len()
    }

    /// Contexts in the map.
    pub fn nr_contexts(&self) -> usize {
        self.starts.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_and_round_robin_maps() {
        let m = ContextMap::new(5, 2, ContextSpread::Contiguous).unwrap();
        assert_eq!(m.queues_of(ContextId(0)), &[QueueIndex(0), QueueIndex(1), QueueIndex(2)]);
        assert_eq!(m.queues_of(ContextId(1)), &[QueueIndex(3), QueueIndex(4)]);
        assert_eq!(m.context_of(QueueIndex(2)), Some(ContextId(0)));
        let m = ContextMap::new(5, 2, ContextSpread::RoundRobin).unwrap();
        assert_eq!(m.queues_of(ContextId(0)), &[QueueIndex(0), QueueIndex(2), QueueIndex(4)]);
        assert_eq!(m.queues_of(ContextId(1)), &[QueueIndex(1), QueueIndex(3)]);
        assert_eq!(m.context_of(QueueIndex(5)), None);
        assert_eq!(m.queues_of(ContextId(7)), &[] as &[QueueIndex]);
    }

    #[test]
    fn every_queue_in_exactly_one_context() {
        for spread in [ContextSpread::Contiguous, ContextSpread::RoundRobin] {
            for nq in 1..=9u16 {
                for nc in 1..=9u16 {
                    let m = ContextMap::new(nq, nc, spread).unwrap();
                    assert_eq!((m.nr_queues(), m.nr_contexts()), (usize::from(nq), usize::from(nc)));
                    let mut seen = vec![0; usize::from(nq)];
                    for c in 0..nc {
                        let qs = m.queues_of(ContextId(c));
                        let (lo, hi) = (nq / nc, nq.div_ceil(nc));
                        let n = u16::try_from(qs.len()).unwrap();
                        assert!(n == 0 && nc > nq || (lo..=hi).contains(&n), "{spread:?} {nq}/{nc}: {n}");
                        for &q in qs {
                            seen[q.index()] += 1;
                            assert_eq!(m.context_of(q), Some(ContextId(c)));
                        }
                    }
                    assert!(seen.iter().all(|&s| s == 1), "{spread:?} {nq}/{nc}");
                }
            }
        }
    }

    #[test]
    fn refuses_empty_maps() {
        assert_eq!(ContextMap::new(0, 1, ContextSpread::Contiguous).unwrap_err().kind, ErrorKind::InvalidCount);
        assert_eq!(ContextMap::new(1, 0, ContextSpread::RoundRobin).unwrap_err().kind, ErrorKind::InvalidCount);
    }
}
