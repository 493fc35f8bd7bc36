//! placeholder
#![warn(missing_docs)]

pub mod error;
pub mod queue_map;
pub mod shared_tags;
pub mod tag;

pub use error::{Error, ErrorKind, Result};
pub use queue_map::{QueueIndex, QueueMap, QueueMaps, QueueType};
pub use shared_tags::{SharedTagOptions, SharedTagPolicy, SharedTagSet, TagUser};
pub use tag::{QueueTags, Tag, TagAllocator, TagSet};
