//! # blk: the user-space multi-queue block core
//!
//! This crate owns what Linux's blk-mq owns, without knowing the transport:
//! tags (a tag is the u16 the host uses as the NVMe command id), tag sets
//! shared fairly between devices (seed 003), CPU → queue maps, the
//! assignment of queues to completion contexts (seed 004), preallocated
//! requests indexed by tag, and per-queue statistics. It has no socket, no
//! NVMe type and no `unsafe`; the host's NVMe/TCP queue plugs in through
//! [`HwQueue`].
//!
//! ```text
//!  CPU ──QueueMaps──► QueueIndex ──ContextMap──► ContextId (one thread, run to completion)
//!
//!  CompletionContext ── owns ──┬── Hctx (queue 0) ── HwQueue (host: NVMe/TCP queue; tests: NullQueue)
//!    active list:              │     ├── tags: TagSet (private) | TagUser ──► SharedTagSet (D tags,
//!    queues with I/O           │     │                                          several users, fair)
//!    in flight, the only       │     ├── RequestPool: Request per tag (op, offset, token, times, state)
//!    ones poll() visits        │     └── QueueStats: counters + latency histograms per direction
//!                              └── Hctx (queue 1) ...
//!
//!  submit: alloc tag ─► fill request ─► HwQueue::submit ─► InFlight, queue joins the active list
//!  poll:   HwQueue::poll ─► (tag, status) ─► stats ─► release request ─► free tag ─► Done to caller
//! ```
//!
//! Rules of the I/O path, kept by every type here: no lock, no allocation,
//! no scan over idle queues; per-thread state is owned by its thread, and
//! in the common case no cache line another thread uses is written. (A
//! shared tag set under the `Windows` policy keeps that rule; `Unfair` and
//! `LinuxFair` write a shared bitmap word per I/O, as Linux does, and exist
//! to measure against: only with the `lab-baselines` cargo feature, which
//! production builds leave off.) Set-up (`new`, `add_queue`, `register_user`)
//! may allocate and lock.
//!
//! ```
//! use blk::{
//!     CompletionContext, ContextId, ContextMap, ContextSpread, IoSpec, NullQueue, QueueMaps, QueueTags,
//!     QueueType, SharedTagPolicy, SharedTagSet, TagSet,
//! };
//!
//! // 2 CPUs, 4 default queues, driven by 2 contexts (threads); this is context 0.
//! let maps = QueueMaps::new(2, 4, 0, 0)?;
//! let contexts = ContextMap::new(4, 2, ContextSpread::Contiguous)?;
//! let me = ContextId(0);
//!
//! // Two namespaces share one tag space of 170 (seed 003); queue 1 is one of its users.
//! let shared = SharedTagSet::new(170, SharedTagPolicy::Windows)?;
//! let mut ctx: CompletionContext<NullQueue, QueueTags> = CompletionContext::new(me);
//! for &q in contexts.queues_of(me) {
//!     let tags = if q.0 == 1 {
//!         QueueTags::Shared(shared.register_user(Some(70))?)
//!     } else {
//!         QueueTags::Private(TagSet::new(128)?)
//!     };
//!     ctx.add_queue(q, NullQueue::new(128, 1), tags, 3);
//! }
//!
//! // CPU 0 submits a 4 KiB read on its queue, and the context reaps it.
//! let queue = maps.queue(QueueType::Default, 0);
//! ctx.submit(queue, IoSpec::read(0, 4096), 7, (), 1_000).expect("a free tag");
//! let mut tokens = Vec::new();
//! ctx.poll(3_500, |done| tokens.push((done.token, done.latency_ns)));
//! assert_eq!(tokens, vec![(7, 2_500)]);
//! assert_eq!(ctx.hctx(queue).unwrap().stats().ios(), 1);
//! # Ok::<(), blk::Error>(())
//! ```
#![warn(missing_docs)]

pub mod context;
pub mod error;
pub mod null;
pub mod queue_map;
pub mod request;
pub mod shared_tags;
pub mod stats;
pub mod tag;

pub use context::{
    ActiveList, CompletionContext, ContextId, ContextMap, ContextSpread, Done, Hctx, HwQueue, QueueRefused, SubmitError,
};
pub use error::{Error, ErrorKind, Result};
pub use null::{NullQueue, NullStatus};
pub use queue_map::{QueueIndex, QueueMap, QueueMaps, QueueType};
pub use request::{IoSpec, Op, Request, RequestEvent, RequestPool, RequestState, RetriesExhausted};
pub use shared_tags::{SharedTagOptions, SharedTagPolicy, SharedTagSet, TagUser};
pub use stats::{Direction, DirectionStats, LATENCY_NS_MAX, LatencySummary, Outcome, QueueStats};
pub use tag::{QueueTags, Tag, TagAllocator, TagSet};
