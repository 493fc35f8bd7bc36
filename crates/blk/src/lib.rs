//! # blk: tags, queue maps and queue statistics for a multi-queue block stack
//!
//! The pieces of Linux's blk-mq that the qpath host, target, simulator and
//! labs share, without knowing the transport:
//!
//! - tags: the u16 the host uses as the NVMe command id, from a queue's own
//!   [`TagSet`] or as a [`TagUser`] of a [`SharedTagSet`] that several devices
//!   share fairly (seed 003); [`QueueTags`] is either, behind [`TagAllocator`];
//! - maps: CPU → queue ([`QueueMaps`], [`QueueMap`]) and queue → completion
//!   context ([`ContextMap`], seed 004: more queues than threads);
//! - statistics: per-queue counters and latency histograms per direction
//!   ([`QueueStats`]), which the host and the target both report.
//!
//! The block core that runs I/O (requests, the event loop, submission and
//! completion over NVMe/TCP queues) is the host's completion context
//! (`host::Context`); it builds on these types. It has no socket, no NVMe
//! type and no `unsafe`.
//!
//! Rules of the I/O path, kept by every type here: no lock, no allocation;
//! per-thread state is owned by its thread, and in the common case no cache
//! line another thread uses is written. (A shared tag set under the `Windows`
//! policy keeps that rule; `Unfair` and `LinuxFair` write a shared bitmap
//! word per I/O, as Linux does, and exist to measure against: only with the
//! `lab-baselines` cargo feature, which production builds leave off.) Set-up
//! (`new`, `register_user`) may allocate and lock.
//!
//! ```
//! use blk::{ContextId, ContextMap, ContextSpread, QueueMaps, QueueTags, QueueType, SharedTagPolicy, SharedTagSet, TagAllocator, TagSet};
//!
//! // 4 CPUs, 4 default queues (one each), driven by 2 contexts (threads), 2 queues each.
//! let maps = QueueMaps::new(4, 4, 0, 0)?;
//! let contexts = ContextMap::new(4, 2, ContextSpread::Contiguous)?;
//! let queue = maps.queue(QueueType::Default, 3);
//! assert_eq!(contexts.context_of(queue), Some(ContextId(1)));
//!
//! // Two namespaces share one tag space of 170 (seed 003); this queue is one of its users.
//! let shared = SharedTagSet::new(170, SharedTagPolicy::Windows)?;
//! let mut tags = QueueTags::Shared(shared.register_user(Some(70))?);
//! let tag = tags.alloc().expect("a free tag");
//! tags.free(tag);
//! let mut private = QueueTags::Private(TagSet::new(128)?);
//! assert!(private.alloc().is_some());
//! # Ok::<(), blk::Error>(())
//! ```
#![warn(missing_docs)]

pub mod context;
pub mod error;
pub mod hist;
pub mod queue_map;
pub mod shared_tags;
pub mod stats;
pub mod tag;

pub use context::{ContextId, ContextMap, ContextSpread};
pub use error::{Error, ErrorKind, Result};
pub use hist::HdrCounts;
pub use queue_map::{QueueIndex, QueueMap, QueueMaps, QueueType};
pub use shared_tags::{SharedTagOptions, SharedTagPolicy, SharedTagSet, TagUser};
pub use stats::{Direction, DirectionStats, LATENCY_NS_MAX, LatencySummary, Outcome, QueueStats};
pub use tag::{QueueTags, Tag, TagAllocator, TagSet};
