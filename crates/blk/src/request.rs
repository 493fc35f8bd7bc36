//! Requests: a pool preallocated at set-up and indexed by tag, so an I/O
//! never allocates (blk-mq's `tags->static_rqs`).
//!
//! A request's lifecycle is [`RequestState`]; every change goes through
//! [`RequestState::transition`], and the pool panics on a change the state
//! machine does not allow (a completion for a request that is not in flight,
//! a tag released twice): those are broken invariants, not I/O errors.
//!
//! ```text
//!   Free ──start──► Allocated ──issue──► InFlight ──complete──► Completed ──release──► Free
//!                     ▲  │                  │                     │
//!                     │  └─release (refused)│                     │
//!                     └──────requeue────────┴───────requeue───────┘
//! ```
//!
//! Units: offsets and lengths are bytes (the host turns them into LBAs with
//! the namespace's LBA size); times are nanoseconds on the caller's clock.

use crate::stats::Direction;
use crate::tag::Tag;

/// An I/O operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read `len_bytes` at `offset_bytes`.
    Read,
    /// Write `len_bytes` at `offset_bytes`.
    Write,
    /// Flush the volatile write cache.
    Flush,
    /// Write zeroes over the range (no data transferred).
    WriteZeroes,
    /// Discard (deallocate) the range.
    Discard,
}

impl Op {
    /// The statistics direction it counts under (fio's read/write/trim/sync).
    #[inline]
    pub const fn direction(self) -> Direction {
        match self {
            Op::Read => Direction::Read,
            Op::Write | Op::WriteZeroes => Direction::Write,
            Op::Discard => Direction::Trim,
            Op::Flush => Direction::Sync,
        }
    }

    /// Whether data moves between host and device (so a buffer travels with it).
    #[inline]
    pub const fn moves_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }
}

/// What the caller asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoSpec {
    /// The operation.
    pub op: Op,
    /// Start, in bytes from the start of the device.
    pub offset_bytes: u64,
    /// Length in bytes (0 for a flush).
    pub len_bytes: u32,
}

impl IoSpec {
    /// A read of `len_bytes` at `offset_bytes`.
    pub const fn read(offset_bytes: u64, len_bytes: u32) -> IoSpec {
        IoSpec { op: Op::Read, offset_bytes, len_bytes }
    }

    /// A write of `len_bytes` at `offset_bytes`.
    pub const fn write(offset_bytes: u64, len_bytes: u32) -> IoSpec {
        IoSpec { op: Op::Write, offset_bytes, len_bytes }
    }

    /// A flush.
    pub const fn flush() -> IoSpec {
        IoSpec { op: Op::Flush, offset_bytes: 0, len_bytes: 0 }
    }
}

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestState {
    /// The slot is unused: its tag is free.
    Free,
    /// Tag allocated and request filled in; not handed to a queue (yet, or again after a requeue).
    Allocated,
    /// Handed to a hardware queue; waiting for its completion.
    InFlight,
    /// Completion received; being handed back to the caller.
    Completed,
}

/// What happens to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestEvent {
    /// A tag was allocated for it and it was filled in.
    Start,
    /// It was handed to the hardware queue.
    Issue,
    /// Its completion arrived.
    Complete,
    /// It goes around again on the same queue (path came back, retryable status).
    Requeue,
    /// It is done (or was refused before issue): its slot and tag are free again.
    Release,
}

impl RequestState {
    /// The state after `event`, or `None` if the event is not allowed in this state.
    #[inline]
    pub const fn transition(self, event: RequestEvent) -> Option<RequestState> {
        use RequestEvent as E;
        use RequestState as S;
        match (self, event) {
            (S::Free, E::Start) => Some(S::Allocated),
            (S::Allocated, E::Issue) => Some(S::InFlight),
            (S::InFlight, E::Complete) => Some(S::Completed),
            (S::InFlight | S::Completed, E::Requeue) => Some(S::Allocated),
            (S::Allocated | S::Completed, E::Release) => Some(S::Free),
            _ => None,
        }
    }
}

/// One request: what to do, for whom, since when, and where it is.
#[derive(Clone, Debug)]
pub struct Request<E = ()> {
    op: Op,
    offset_bytes: u64,
    len_bytes: u32,
    token: u64,
    start_ns: u64,
    issue_ns: u64,
    retries: u8,
    state: RequestState,
    /// The caller's per-request data (the host: the data buffer). Set at
    /// start, taken back at release.
    pub ext: E,
}

impl<E: Default> Request<E> {
    fn free() -> Request<E> {
        Request {
            op: Op::Read,
            offset_bytes: 0,
            len_bytes: 0,
            token: 0,
            start_ns: 0,
            issue_ns: 0,
            retries: 0,
            state: RequestState::Free,
            ext: E::default(),
        }
    }
}

impl<E> Request<E> {
    /// The operation.
    #[inline]
    pub fn op(&self) -> Op {
        self.op
    }

    /// Start in bytes.
    #[inline]
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Length in bytes.
    #[inline]
    pub fn len_bytes(&self) -> u32 {
        self.len_bytes
    }

    /// The caller's token, handed back with the completion.
    #[inline]
    pub fn token(&self) -> u64 {
        self.token
    }

    /// When the caller submitted it (ns): latency is measured from here, across requeues.
    #[inline]
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// When it was last handed to the queue (ns).
    #[inline]
    pub fn issue_ns(&self) -> u64 {
        self.issue_ns
    }

    /// Times it was requeued.
    #[inline]
    pub fn retries(&self) -> u8 {
        self.retries
    }

    /// Its state.
    #[inline]
    pub fn state(&self) -> RequestState {
        self.state
    }

    /// Applies `event`.
    ///
    /// # Panics
    /// If the state machine does not allow `event` now.
    #[inline]
    fn apply(&mut self, tag: Tag, event: RequestEvent) {
        match self.state.transition(event) {
            Some(next) => self.state = next,
            None => panic!("request {tag}: {event:?} is not allowed in state {:?}", self.state),
        }
    }
}

/// A requeue was refused: the request already went around `max_retries` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetriesExhausted {
    /// Times it was requeued.
    pub retries: u8,
}

/// Requests indexed by tag, preallocated for a whole tag space.
#[derive(Debug)]
pub struct RequestPool<E = ()> {
    slots: Box<[Request<E>]>,
    max_retries: u8,
}

impl<E: Default> RequestPool<E> {
    /// A pool for tags `0..tag_space` ([`TagAllocator::tag_space`](crate::TagAllocator::tag_space));
    /// a request may be requeued at most `max_retries` times.
    pub fn new(tag_space: u16, max_retries: u8) -> RequestPool<E> {
        RequestPool { slots: (0..tag_space).map(|_| Request::free()).collect(), max_retries }
    }

    /// Fills in the request of a freshly allocated `tag` (Free → Allocated).
    #[inline]
    pub fn start(&mut self, tag: Tag, io: IoSpec, token: u64, ext: E, now_ns: u64) -> &mut Request<E> {
        let req = self.slot(tag);
        req.apply(tag, RequestEvent::Start);
        req.op = io.op;
        req.offset_bytes = io.offset_bytes;
        req.len_bytes = io.len_bytes;
        req.token = token;
        req.start_ns = now_ns;
        req.issue_ns = now_ns;
        req.retries = 0;
        req.ext = ext;
        req
    }

    /// Records that the request was handed to its queue (Allocated → InFlight).
    #[inline]
    pub fn issue(&mut self, tag: Tag, now_ns: u64) {
        let req = self.slot(tag);
        req.apply(tag, RequestEvent::Issue);
        req.issue_ns = now_ns;
    }

    /// Records its completion (InFlight → Completed).
    #[inline]
    pub fn complete(&mut self, tag: Tag) -> &mut Request<E> {
        let req = self.slot(tag);
        req.apply(tag, RequestEvent::Complete);
        req
    }

    /// Sends it around again (InFlight or Completed → Allocated), unless it
    /// already was `max_retries` times; returns the new retry count.
    pub fn requeue(&mut self, tag: Tag) -> Result<u8, RetriesExhausted> {
        let max = self.max_retries;
        let req = self.slot(tag);
        if req.retries >= max {
            return Err(RetriesExhausted { retries: req.retries });
        }
        req.apply(tag, RequestEvent::Requeue);
        req.retries += 1;
        Ok(req.retries)
    }

    /// Frees the slot (Allocated or Completed → Free) and hands back the caller's data.
    #[inline]
    pub fn release(&mut self, tag: Tag) -> E {
        let req = self.slot(tag);
        req.apply(tag, RequestEvent::Release);
        std::mem::take(&mut req.ext)
    }
}

impl<E> RequestPool<E> {
    #[inline]
    fn slot(&mut self, tag: Tag) -> &mut Request<E> {
        let len = self.slots.len();
        match self.slots.get_mut(tag.index()) {
            Some(req) => req,
            None => panic!("request pool: {tag} beyond the pool's {len} slots (tag from another tag space?)"),
        }
    }

    /// The request of `tag`, if `tag` is in range.
    #[inline]
    pub fn get(&self, tag: Tag) -> Option<&Request<E>> {
        self.slots.get(tag.index())
    }

    /// The request of `tag`, mutably, if `tag` is in range.
    #[inline]
    pub fn get_mut(&mut self, tag: Tag) -> Option<&mut Request<E>> {
        self.slots.get_mut(tag.index())
    }

    /// Whether `tag`'s request is in flight: check a command id read from the
    /// wire with it before completing.
    #[inline]
    pub fn is_in_flight(&self, tag: Tag) -> bool {
        self.get(tag).is_some_and(|r| r.state == RequestState::InFlight)
    }

    /// Slots (the tag space).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the pool has no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Most requeues allowed per request.
    pub fn max_retries(&self) -> u8 {
        self.max_retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [RequestState; 4] =
        [RequestState::Free, RequestState::Allocated, RequestState::InFlight, RequestState::Completed];
    const EVENTS: [RequestEvent; 5] = [
        RequestEvent::Start,
        RequestEvent::Issue,
        RequestEvent::Complete,
        RequestEvent::Requeue,
        RequestEvent::Release,
    ];

    #[test]
    fn transition_table() {
        use RequestEvent as E;
        use RequestState as S;
        let allowed = [
            (S::Free, E::Start, S::Allocated),
            (S::Allocated, E::Issue, S::InFlight),
            (S::Allocated, E::Release, S::Free),
            (S::InFlight, E::Complete, S::Completed),
            (S::InFlight, E::Requeue, S::Allocated),
            (S::Completed, E::Requeue, S::Allocated),
            (S::Completed, E::Release, S::Free),
        ];
        for s in STATES {
            for e in EVENTS {
                let want = allowed.iter().find(|(a, b, _)| *a == s && *b == e).map(|t| t.2);
                assert_eq!(s.transition(e), want, "{s:?} + {e:?}");
            }
        }
    }

    #[test]
    fn lifecycle_with_ext_round_trip() {
        let mut pool: RequestPool<Option<Vec<u8>>> = RequestPool::new(4, 2);
        let tag = Tag::new(3);
        let req = pool.start(tag, IoSpec::write(4096, 512), 77, Some(vec![1; 512]), 1_000);
        assert_eq!((req.op(), req.offset_bytes(), req.len_bytes(), req.token()), (Op::Write, 4096, 512, 77));
        pool.issue(tag, 1_500);
        assert!(pool.is_in_flight(tag));
        assert!(!pool.is_in_flight(Tag::new(2)));
        assert!(!pool.is_in_flight(Tag::new(9)), "out of range is not in flight");
        let req = pool.complete(tag);
        assert_eq!((req.start_ns(), req.issue_ns()), (1_000, 1_500));
        assert_eq!(pool.release(tag).map(|b| b.len()), Some(512));
        assert_eq!(pool.get(tag).unwrap().state(), RequestState::Free);
        assert_eq!(pool.get(tag).unwrap().ext, None, "release takes the ext");
    }

    #[test]
    fn requeue_is_bounded() {
        let mut pool: RequestPool = RequestPool::new(1, 2);
        let tag = Tag::new(0);
        pool.start(tag, IoSpec::read(0, 4096), 1, (), 0);
        pool.issue(tag, 0);
        assert_eq!(pool.requeue(tag), Ok(1));
        pool.issue(tag, 10);
        pool.complete(tag);
        assert_eq!(pool.requeue(tag), Ok(2));
        pool.issue(tag, 20);
        assert_eq!(pool.requeue(tag), Err(RetriesExhausted { retries: 2 }));
        assert_eq!(pool.get(tag).unwrap().state(), RequestState::InFlight, "a refused requeue changes nothing");
        pool.complete(tag);
        pool.release(tag);
    }

    #[test]
    #[should_panic(expected = "Complete is not allowed in state Free")]
    fn completing_a_free_request_panics() {
        let mut pool: RequestPool = RequestPool::new(2, 0);
        pool.complete(Tag::new(1));
    }

    #[test]
    #[should_panic(expected = "beyond the pool")]
    fn tag_beyond_the_pool_panics() {
        let mut pool: RequestPool = RequestPool::new(2, 0);
        pool.issue(Tag::new(2), 0);
    }

    #[test]
    fn op_directions() {
        assert_eq!(Op::WriteZeroes.direction(), Direction::Write);
        assert_eq!(Op::Discard.direction(), Direction::Trim);
        assert_eq!(Op::Flush.direction(), Direction::Sync);
        assert!(Op::Read.moves_data() && !Op::WriteZeroes.moves_data());
    }
}
