//! placeholder
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
