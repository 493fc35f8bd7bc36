//! Completion contexts: the thread that drives a group of hardware queues,
//! submitting and reaping on its own (seed 004: more queues than interrupt
//! vectors; here, more queues than threads).
//!
//! - [`ContextMap`] says which context drives which hardware queue:
//!   contiguous groups (queues `0..k` on context 0, ...: pairs with the
//!   contiguous CPU groups of [`QueueMap`](crate::QueueMap), so a CPU's
//!   queue is driven by a context near it) or round-robin (queue `q` on
//!   context `q % n`, as Linux shares vectors).
//! - [`HwQueue`] is what a transport's queue implements (the host's NVMe/TCP
//!   queue; [`NullQueue`](crate::NullQueue) in memory): take a request under
//!   a tag, report finished tags. Nothing here knows about sockets or NVMe.
//! - [`CompletionContext`] owns its queues, each as an [`Hctx`] (queue, tags,
//!   request pool, stats), and an [`ActiveList`] of the queues with requests
//!   in flight: [`poll`](CompletionContext::poll) visits only those, so idle
//!   queues cost nothing per I/O; a queue joins the list when its first
//!   request goes out and leaves it when its last completes.
//!
//! What stays in the host: the clock, the event loop (busy-poll or sleep),
//! I/O buffers, path selection and what to do with a failed I/O. The context
//! reports each completion with its latency and hands back the caller's
//! per-request data; a retry is a new submission.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};
use crate::queue_map::{QueueIndex, spread_index};
use crate::request::{IoSpec, Op, RequestPool};
use crate::stats::{Outcome, QueueStats};
use crate::tag::{QueueTags, Tag, TagAllocator};

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

/// A set of small indices (a context's queues) with O(1) insert, remove and
/// membership, iterated without visiting the absent ones: the interest list
/// of queues with requests in flight.
#[derive(Clone, Debug, Default)]
pub struct ActiveList {
    /// The members, in no particular order.
    dense: Vec<u16>,
    /// `pos[i]` = where `i` is in `dense`, or `ABSENT`.
    pos: Vec<u16>,
}

impl ActiveList {
    const ABSENT: u16 = u16::MAX;

    /// A list for indices `0..capacity` (at most 65,535).
    pub fn new(capacity: u16) -> ActiveList {
        let cap = usize::from(capacity);
        ActiveList { dense: Vec::with_capacity(cap), pos: vec![Self::ABSENT; cap] }
    }

    /// Makes room for indices `0..capacity` (set-up time only).
    pub fn grow(&mut self, capacity: u16) {
        let cap = usize::from(capacity);
        if cap > self.pos.len() {
            self.pos.resize(cap, Self::ABSENT);
            self.dense.reserve_exact(cap - self.dense.len());
        }
    }

    /// Adds `i`; returns whether it was absent.
    #[inline]
    pub fn insert(&mut self, i: u16) -> bool {
        let slot = &mut self.pos[usize::from(i)];
        if *slot != Self::ABSENT {
            return false;
        }
        // dense.len() < capacity <= 65,535, so it fits and never equals ABSENT.
        *slot = u16::try_from(self.dense.len()).expect("active list within capacity");
        self.dense.push(i);
        true
    }

    /// Removes `i`; returns whether it was present.
    #[inline]
    pub fn remove(&mut self, i: u16) -> bool {
        let at = self.pos[usize::from(i)];
        if at == Self::ABSENT {
            return false;
        }
        self.remove_at(usize::from(at));
        true
    }

    /// Removes the member at position `at` (the last member moves there).
    #[inline]
    fn remove_at(&mut self, at: usize) {
        let i = self.dense.swap_remove(at);
        self.pos[usize::from(i)] = Self::ABSENT;
        if let Some(&moved) = self.dense.get(at) {
            self.pos[usize::from(moved)] = u16::try_from(at).expect("position within capacity");
        }
    }

    /// Whether `i` is a member.
    #[inline]
    pub fn contains(&self, i: u16) -> bool {
        self.pos.get(usize::from(i)).is_some_and(|&p| p != Self::ABSENT)
    }

    /// Members.
    #[inline]
    pub fn len(&self) -> usize {
        self.dense.len()
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.dense.is_empty()
    }

    /// The members, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.dense.iter().copied()
    }
}

/// A hardware queue refused a request (not live, or full): nothing was sent;
/// the caller keeps the request and may retry or go elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRefused;

/// What a transport's queue implements to be driven by a [`CompletionContext`].
///
/// Contract: `poll` reports only tags given to `submit`, each once; a
/// refusing `submit` leaves `req.ext` in place. A command id read from the
/// wire is validated by the implementation (it owns the wire) before it is
/// reported; the context panics on a tag that is not in flight.
pub trait HwQueue {
    /// Per-request data the caller hands in and gets back (the host: the I/O buffer).
    type Ext: Default;
    /// A completion's status as the transport reports it (the host: an NVMe status).
    type Status;

    /// Starts `req` under command id `tag`. The queue may take `req.ext`
    /// (e.g. a write buffer that travels in a send batch) and must then
    /// return it through `poll`.
    fn submit(&mut self, tag: Tag, req: &mut crate::Request<Self::Ext>) -> std::result::Result<(), QueueRefused>;

    /// Reports finished commands without blocking: `done(tag, status, ext)`
    /// for each, with the ext it took at submit (or `None`). Returns how many.
    fn poll<F: FnMut(Tag, Self::Status, Option<Self::Ext>)>(&mut self, done: F) -> usize;

    /// Whether `status` is a success (for the statistics).
    fn is_success(status: &Self::Status) -> bool;
}

/// One hardware queue as its context holds it: the queue, its tags, a
/// request per tag and its statistics (blk-mq's `blk_mq_hw_ctx`).
pub struct Hctx<Q: HwQueue, T> {
    index: QueueIndex,
    queue: Q,
    tags: T,
    requests: RequestPool<Q::Ext>,
    stats: QueueStats,
}

impl<Q: HwQueue, T: TagAllocator> Hctx<Q, T> {
    /// Its index.
    pub fn index(&self) -> QueueIndex {
        self.index
    }

    /// The transport queue.
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// The transport queue, mutably (for the host's own events: reconnect, data arrival).
    pub fn queue_mut(&mut self) -> &mut Q {
        &mut self.queue
    }

    /// Its tags.
    pub fn tags(&self) -> &T {
        &self.tags
    }

    /// Its requests.
    pub fn requests(&self) -> &RequestPool<Q::Ext> {
        &self.requests
    }

    /// Its statistics.
    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }

    /// Its statistics, mutably (to count the caller's retries, or reset after a report).
    pub fn stats_mut(&mut self) -> &mut QueueStats {
        &mut self.stats
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u16 {
        self.tags.in_flight()
    }
}

impl<Q: HwQueue + fmt::Debug, T: TagAllocator + fmt::Debug> fmt::Debug for Hctx<Q, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hctx")
            .field("index", &self.index)
            .field("queue", &self.queue)
            .field("tags", &self.tags)
            .field("in_flight", &self.tags.in_flight())
            .field("ios", &self.stats.ios())
            .finish_non_exhaustive()
    }
}

/// Why a submission did not go out. The caller's ext comes back with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// This context does not drive that queue.
    UnknownQueue,
    /// No tag free (queue depth, limit or fair share reached): retry after a completion.
    NoTag,
    /// The queue refused it (not live, full).
    Refused,
}

/// A finished request, as handed back by [`CompletionContext::poll`].
#[derive(Debug)]
pub struct Done<S, E> {
    /// The queue it ran on.
    pub queue: QueueIndex,
    /// Its tag (already free again).
    pub tag: Tag,
    /// The caller's token.
    pub token: u64,
    /// What it was.
    pub op: Op,
    /// Its length in bytes.
    pub len_bytes: u32,
    /// How it ended.
    pub status: S,
    /// Submission to completion, ns.
    pub latency_ns: u64,
    /// The caller's per-request data, back.
    pub ext: E,
}

/// The queues one thread drives, and the bookkeeping to drive them.
pub struct CompletionContext<Q: HwQueue, T = QueueTags> {
    id: ContextId,
    hctxs: Vec<Hctx<Q, T>>,
    /// Indexed by queue: position in `hctxs`, or `NONE`.
    local_of: Vec<u16>,
    /// Positions in `hctxs` of the queues with requests in flight.
    active: ActiveList,
}

impl<Q: HwQueue + fmt::Debug, T: TagAllocator + fmt::Debug> fmt::Debug for CompletionContext<Q, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionContext")
            .field("id", &self.id)
            .field("hctxs", &self.hctxs)
            .field("active", &self.active)
            .finish_non_exhaustive()
    }
}

impl<Q: HwQueue, T: TagAllocator> CompletionContext<Q, T> {
    const NONE: u16 = u16::MAX;

    /// An empty context.
    pub fn new(id: ContextId) -> Self {
        CompletionContext { id, hctxs: Vec::new(), local_of: Vec::new(), active: ActiveList::default() }
    }

    /// Adds a queue this context will drive (set-up time: allocates its request pool).
    /// `max_retries` bounds requeues of a request on this queue.
    ///
    /// # Panics
    /// If the context already drives `index`, or drives 65,535 queues.
    pub fn add_queue(&mut self, index: QueueIndex, queue: Q, tags: T, max_retries: u8) {
        let i = index.index();
        if i >= self.local_of.len() {
            self.local_of.resize(i + 1, Self::NONE);
        }
        assert!(self.local_of[i] == Self::NONE, "{}: {index} added twice", self.id);
        let local = u16::try_from(self.hctxs.len())
            .ok()
            .filter(|&l| l != Self::NONE)
            .unwrap_or_else(|| panic!("{}: at most 65,534 queues per context", self.id));
        let requests = RequestPool::new(tags.tag_space(), max_retries);
        self.hctxs.push(Hctx { index, queue, tags, requests, stats: QueueStats::new() });
        self.local_of[i] = local;
        self.active.grow(local + 1);
    }

    #[inline]
    fn local(&self, queue: QueueIndex) -> Option<usize> {
        match self.local_of.get(queue.index()) {
            Some(&l) if l != Self::NONE => Some(usize::from(l)),
            _ => None,
        }
    }

    /// Submits `io` on `queue` for the caller's `token`, with per-request data
    /// `ext`, at `now_ns`. Returns the tag it runs under; on failure hands
    /// `ext` back.
    #[inline]
    pub fn submit(
        &mut self,
        queue: QueueIndex,
        io: IoSpec,
        token: u64,
        ext: Q::Ext,
        now_ns: u64,
    ) -> std::result::Result<Tag, (SubmitError, Q::Ext)> {
        let Some(local) = self.local(queue) else {
            return Err((SubmitError::UnknownQueue, ext));
        };
        let h = &mut self.hctxs[local];
        let Some(tag) = h.tags.alloc() else {
            h.stats.record_busy();
            return Err((SubmitError::NoTag, ext));
        };
        let req = h.requests.start(tag, io, token, ext, now_ns);
        if h.queue.submit(tag, req) == Err(QueueRefused) {
            let ext = h.requests.release(tag);
            h.tags.free(tag);
            h.stats.record_requeue();
            return Err((SubmitError::Refused, ext));
        }
        h.requests.issue(tag, now_ns);
        // local < NONE (checked at add_queue).
        self.active.insert(u16::try_from(local).unwrap_or(Self::NONE));
        Ok(tag)
    }

    /// Reaps completions from the queues with requests in flight (only
    /// those), at `now_ns`; calls `on_done` for each. Returns how many.
    pub fn poll<F: FnMut(Done<Q::Status, Q::Ext>)>(&mut self, now_ns: u64, mut on_done: F) -> usize {
        let mut reaped = 0;
        let mut at = 0;
        while let Some(&local) = self.active.dense.get(at) {
            let Hctx { index, queue, tags, requests, stats } = &mut self.hctxs[usize::from(local)];
            let index = *index;
            reaped += queue.poll(|tag, status, ext_back| {
                assert!(
                    requests.is_in_flight(tag),
                    "{index}: the queue completed {tag}, which is not in flight (HwQueue contract)"
                );
                let req = requests.complete(tag);
                if let Some(ext) = ext_back {
                    req.ext = ext;
                }
                let (op, len_bytes, token) = (req.op(), req.len_bytes(), req.token());
                let latency_ns = now_ns.saturating_sub(req.start_ns());
                let outcome = if Q::is_success(&status) { Outcome::Success } else { Outcome::Error };
                stats.record(op.direction(), u64::from(len_bytes), latency_ns, outcome);
                let ext = requests.release(tag);
                tags.free(tag);
                on_done(Done { queue: index, tag, token, op, len_bytes, status, latency_ns, ext });
            });
            if tags.in_flight() == 0 {
                // The last member moves into `at`: look at `at` again.
                self.active.remove_at(at);
            } else {
                at += 1;
            }
        }
        reaped
    }

    /// Periodic housekeeping (about every millisecond, and when idle): lets
    /// shared-tag users give back tags. Visits every queue, so never per I/O.
    pub fn tick(&mut self) {
        for h in &mut self.hctxs {
            h.tags.tick();
        }
    }

    /// Its id.
    pub fn id(&self) -> ContextId {
        self.id
    }

    /// One queue.
    pub fn hctx(&self, queue: QueueIndex) -> Option<&Hctx<Q, T>> {
        self.local(queue).map(|l| &self.hctxs[l])
    }

    /// One queue, mutably.
    pub fn hctx_mut(&mut self, queue: QueueIndex) -> Option<&mut Hctx<Q, T>> {
        self.local(queue).map(|l| &mut self.hctxs[l])
    }

    /// All its queues.
    pub fn hctxs(&self) -> impl Iterator<Item = &Hctx<Q, T>> + '_ {
        self.hctxs.iter()
    }

    /// The queues with requests in flight (what `poll` visits).
    pub fn active_queues(&self) -> impl Iterator<Item = QueueIndex> + '_ {
        self.active.iter().map(|l| self.hctxs[usize::from(l)].index)
    }

    /// Requests in flight over all its queues.
    pub fn in_flight(&self) -> usize {
        self.active.iter().map(|l| usize::from(self.hctxs[usize::from(l)].in_flight())).sum()
    }

    /// All its queues' statistics merged (for a report; allocates).
    pub fn stats(&self) -> QueueStats {
        let mut all = QueueStats::new();
        for h in &self.hctxs {
            all.merge(&h.stats);
        }
        all
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
    fn active_list_insert_remove() {
        let mut a = ActiveList::new(8);
        assert!(a.insert(3) && a.insert(5) && a.insert(0));
        assert!(!a.insert(5));
        assert!(a.remove(3));
        assert!(!a.remove(3));
        assert!(a.contains(5) && a.contains(0) && !a.contains(3) && !a.contains(100));
        let mut got: Vec<u16> = a.iter().collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 5]);
        assert!(a.remove(0) && a.remove(5) && a.is_empty());
    }

    #[test]
    fn refuses_empty_maps() {
        assert_eq!(ContextMap::new(0, 1, ContextSpread::Contiguous).unwrap_err().kind, ErrorKind::InvalidCount);
        assert_eq!(ContextMap::new(1, 0, ContextSpread::RoundRobin).unwrap_err().kind, ErrorKind::InvalidCount);
    }
}
