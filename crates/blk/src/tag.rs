//! Tags: the u16 a request is known by while it is in flight.
//!
//! A tag is the NVMe command id the host puts in the SQE, and the index of
//! the request slot the host keeps for it (`host::Context`).
//! [`TagSet`] hands out tags `0..depth` to one owner thread: a LIFO free
//! list (the tag freed last is reused first, so its request slot is still in
//! cache), O(1) both ways, no atomics. A bitmap beside it records which tags
//! are in use, so that freeing a tag twice, or a tag that was never handed
//! out, panics instead of corrupting the free list.
//!
//! [`TagAllocator`] is what a queue holds: a private [`TagSet`] (the default,
//! one per queue) or a [`TagUser`] of a [`SharedTagSet`](crate::SharedTagSet)
//! (seed 003: several devices sharing one controller's tag space). The
//! [`QueueTags`] enum holds either behind one type with static dispatch.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};
use crate::shared_tags::TagUser;

/// A tag: the command id of one request in flight, `0..tag_space`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(u16);

impl Tag {
    /// The tag with value `raw` (a command id read back from a completion).
    /// Check it with [`TagAllocator::is_in_flight`] before completing it: a
    /// value from the wire is not trusted.
    #[inline]
    pub const fn new(raw: u16) -> Tag {
        Tag(raw)
    }

    /// The tag's value (the NVMe command id).
    #[inline]
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The tag as an index into per-tag tables.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<Tag> for u16 {
    fn from(tag: Tag) -> u16 {
        tag.0
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tag {}", self.0)
    }
}

/// A fixed bitmap in plain memory, owned by one thread.
#[derive(Clone, Debug)]
pub(crate) struct Bits {
    words: Box<[u64]>,
}

impl Bits {
    pub(crate) fn new(len: u16) -> Bits {
        Bits { words: vec![0; usize::from(len).div_ceil(64)].into_boxed_slice() }
    }

    /// Sets bit `i`; returns whether it was already set. `i` must be in range.
    #[inline]
    pub(crate) fn set(&mut self, i: u16) -> bool {
        let (w, m) = (usize::from(i / 64), 1u64 << (i % 64));
        let was = self.words[w] & m != 0;
        self.words[w] |= m;
        was
    }

    /// Clears bit `i`; returns whether it was set.
    #[inline]
    pub(crate) fn clear(&mut self, i: u16) -> bool {
        let (w, m) = (usize::from(i / 64), 1u64 << (i % 64));
        let was = self.words[w] & m != 0;
        self.words[w] &= !m;
        was
    }

    #[inline]
    pub(crate) fn get(&self, i: u16) -> bool {
        self.words.get(usize::from(i / 64)).is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    /// The set bits, lowest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                // w < 1024 (at most 65,535 bits), bit < 64: the tag fits in u16.
                u16::try_from(w * 64 + bit as usize).ok()
            })
        })
    }
}

/// A fixed-capacity stack of tag values in plain memory, owned by one thread
/// (a free list, or a shared-set user's window). No capacity check beyond
/// the slice's bounds check: callers never push more than they hold.
#[derive(Clone, Debug)]
pub(crate) struct TagStack {
    buf: Box<[u16]>,
    len: usize,
}

impl TagStack {
    pub(crate) fn with_capacity(capacity: u16) -> TagStack {
        TagStack { buf: vec![0; usize::from(capacity)].into_boxed_slice(), len: 0 }
    }

    #[inline]
    pub(crate) fn push(&mut self, tag: u16) {
        self.buf[self.len] = tag;
        self.len += 1;
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<u16> {
        let i = self.len.checked_sub(1)?;
        self.len = i;
        Some(self.buf[i])
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values, bottom first.
    pub(crate) fn as_slice(&self) -> &[u16] {
        &self.buf[..self.len]
    }

    /// Removes the bottom `n` values (the coldest), after `take` has seen them.
    pub(crate) fn remove_bottom(&mut self, n: usize, take: impl FnOnce(&[u16])) {
        let n = n.min(self.len);
        take(&self.buf[..n]);
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

/// A fixed-depth tag allocator for one owner thread: tags `0..depth`.
#[derive(Clone, Debug)]
pub struct TagSet {
    /// The free tags; the top one is handed out next.
    free: TagStack,
    in_use: Bits,
    depth: u16,
}

impl TagSet {
    /// A set of `depth` tags (1..=65,535; the queue size the controller granted).
    pub fn new(depth: u16) -> Result<TagSet> {
        if depth == 0 {
            return Err(Error::new(ErrorKind::InvalidDepth, "tag set depth must be at least 1"));
        }
        // Reversed, so the first allocations hand out 0, 1, 2, ...
        let mut free = TagStack::with_capacity(depth);
        for tag in (0..depth).rev() {
            free.push(tag);
        }
        Ok(TagSet { free, in_use: Bits::new(depth), depth })
    }

    /// A free tag, or `None` when all `depth` are in use.
    #[inline]
    pub fn alloc(&mut self) -> Option<Tag> {
        let tag = self.free.pop()?;
        let was = self.in_use.set(tag);
        debug_assert!(!was, "TagSet: tag {tag} was on the free list and in use at once");
        Some(Tag(tag))
    }

    /// Returns `tag` to the set.
    ///
    /// # Panics
    /// If `tag` is not in use (freed twice, never allocated, or out of range):
    /// the invariant "every tag is either free or in use, never both" broke.
    #[inline]
    pub fn free(&mut self, tag: Tag) {
        assert!(
            tag.0 < self.depth && self.in_use.clear(tag.0),
            "TagSet: {tag} freed but not in use (double free, or never allocated from this set of depth {})",
            self.depth
        );
        self.free.push(tag.0);
    }

    /// Tags in use.
    #[inline]
    pub fn in_use(&self) -> u16 {
        // free.len() <= depth, so the difference fits in u16.
        self.depth - u16::try_from(self.free.len()).unwrap_or(self.depth)
    }

    /// Whether `tag` is in use (allocated and not yet freed).
    #[inline]
    pub fn is_in_use(&self, tag: Tag) -> bool {
        self.in_use.get(tag.0)
    }

    /// The depth: tags are `0..depth`.
    #[inline]
    pub fn depth(&self) -> u16 {
        self.depth
    }
}

/// What a queue allocates its tags from. Implemented by [`TagSet`] (private
/// to the queue), [`TagUser`] (a share of a [`SharedTagSet`](crate::SharedTagSet))
/// and [`QueueTags`] (either, chosen at set-up).
///
/// All methods are called by the owner thread only, on the I/O path.
pub trait TagAllocator {
    /// A free tag, or `None` (the caller requeues the I/O and retries later).
    fn alloc(&mut self) -> Option<Tag>;

    /// Returns a tag this allocator handed out. Panics if it is not in flight.
    fn free(&mut self, tag: Tag);

    /// Tags this owner has in flight.
    fn in_flight(&self) -> u16;

    /// Whether `tag` is in flight with this owner: validate a command id read
    /// from the wire with it before completing the request.
    fn is_in_flight(&self, tag: Tag) -> bool;

    /// Tag values are `0..tag_space()`: size per-tag tables (the request pool) with it.
    fn tag_space(&self) -> u16;

    /// Most tags this owner can ever have in flight at once.
    fn depth_max(&self) -> u16;

    /// Periodic housekeeping (about every millisecond, and when idle): lets a
    /// shared-set user give back tags it no longer needs. Never per I/O.
    #[inline]
    fn tick(&mut self) {}
}

impl TagAllocator for TagSet {
    #[inline]
    fn alloc(&mut self) -> Option<Tag> {
        TagSet::alloc(self)
    }

    #[inline]
    fn free(&mut self, tag: Tag) {
        TagSet::free(self, tag);
    }

    #[inline]
    fn in_flight(&self) -> u16 {
        self.in_use()
    }

    #[inline]
    fn is_in_flight(&self, tag: Tag) -> bool {
        self.is_in_use(tag)
    }

    #[inline]
    fn tag_space(&self) -> u16 {
        self.depth
    }

    #[inline]
    fn depth_max(&self) -> u16 {
        self.depth
    }
}

/// A queue's tags: private (the default) or a user of a shared set.
/// One concrete type for the host's queues, dispatched by a `match`.
#[derive(Debug)]
pub enum QueueTags {
    /// The queue's own tag set (tags `0..queue size`).
    Private(TagSet),
    /// A share of a tag set several queues use (seed 003).
    Shared(TagUser),
}

impl TagAllocator for QueueTags {
    #[inline]
    fn alloc(&mut self) -> Option<Tag> {
        match self {
            QueueTags::Private(t) => t.alloc(),
            QueueTags::Shared(t) => t.alloc(),
        }
    }

    #[inline]
    fn free(&mut self, tag: Tag) {
        match self {
            QueueTags::Private(t) => t.free(tag),
            QueueTags::Shared(t) => t.free(tag),
        }
    }

    #[inline]
    fn in_flight(&self) -> u16 {
        match self {
            QueueTags::Private(t) => t.in_use(),
            QueueTags::Shared(t) => t.in_flight(),
        }
    }

    #[inline]
    fn is_in_flight(&self, tag: Tag) -> bool {
        match self {
            QueueTags::Private(t) => t.is_in_use(tag),
            QueueTags::Shared(t) => t.is_in_flight(tag),
        }
    }

    #[inline]
    fn tag_space(&self) -> u16 {
        match self {
            QueueTags::Private(t) => t.depth(),
            QueueTags::Shared(t) => t.tag_space(),
        }
    }

    #[inline]
    fn depth_max(&self) -> u16 {
        match self {
            QueueTags::Private(t) => t.depth(),
            QueueTags::Shared(t) => t.depth_max(),
        }
    }

    #[inline]
    fn tick(&mut self) {
        if let QueueTags::Shared(t) = self {
            t.tick();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_depth_is_refused() {
        assert_eq!(TagSet::new(0).unwrap_err().kind, ErrorKind::InvalidDepth);
    }

    #[test]
    fn hands_out_every_tag_once_then_none() {
        let mut set = TagSet::new(130).unwrap();
        let mut seen = [false; 130];
        for i in 0..130u16 {
            let tag = set.alloc().unwrap();
            assert_eq!(tag.get(), i, "a fresh set hands out tags in order");
            assert!(!seen[tag.index()]);
            seen[tag.index()] = true;
        }
        assert_eq!(set.alloc(), None);
        assert_eq!(set.in_use(), 130);
    }

    #[test]
    fn reuses_the_tag_freed_last() {
        let mut set = TagSet::new(8).unwrap();
        let a = set.alloc().unwrap();
        let b = set.alloc().unwrap();
        set.free(a);
        set.free(b);
        assert_eq!(set.alloc(), Some(b));
        assert_eq!(set.alloc(), Some(a));
        assert_eq!(set.in_use(), 2);
    }

    #[test]
    fn full_depth_u16_max() {
        let mut set = TagSet::new(u16::MAX).unwrap();
        for _ in 0..u16::MAX {
            set.alloc().unwrap();
        }
        assert_eq!(set.alloc(), None);
        set.free(Tag::new(u16::MAX - 1));
        assert_eq!(set.alloc(), Some(Tag::new(u16::MAX - 1)));
    }

    #[test]
    #[should_panic(expected = "freed but not in use")]
    fn double_free_panics() {
        let mut set = TagSet::new(4).unwrap();
        let t = set.alloc().unwrap();
        set.free(t);
        set.free(t);
    }

    #[test]
    #[should_panic(expected = "freed but not in use")]
    fn free_out_of_range_panics() {
        let mut set = TagSet::new(4).unwrap();
        set.alloc().unwrap();
        set.free(Tag::new(4));
    }

    #[test]
    fn bits_iterate_in_order() {
        let mut bits = Bits::new(200);
        for i in [0u16, 63, 64, 130, 199] {
            assert!(!bits.set(i));
        }
        assert!(bits.set(64));
        assert_eq!(bits.iter().collect::<Vec<_>>(), vec![0, 63, 64, 130, 199]);
        assert!(bits.clear(63));
        assert!(!bits.clear(63));
        assert!(!bits.get(63));
        assert!(!bits.get(5000), "out of range reads as clear");
    }
}
