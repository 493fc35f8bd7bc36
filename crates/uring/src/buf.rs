//! [`IoBuf`]: an owned, zeroed, page-aligned buffer for O_DIRECT file I/O and sockets.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment and capacity granule of an [`IoBuf`]: one page, which satisfies O_DIRECT's
/// logical-block alignment on every device we target (512 B and 4 KiB).
pub const IO_ALIGN: usize = 4096;

/// An owned heap buffer, aligned to [`IO_ALIGN`], zeroed at construction, with a fixed
/// capacity (a multiple of [`IO_ALIGN`]) and a length `len <= capacity`.
///
/// `Deref<Target = [u8]>` covers `[..len]`; [`as_full`](Self::as_full) and
/// [`as_full_mut`](Self::as_full_mut) cover the whole capacity. Every byte of the capacity is
/// always initialised (zeroed at allocation, then only ever written with bytes), so exposing
/// the whole capacity is safe.
///
/// The buffer allocates once, in [`new`](Self::new), and never reallocates: operations lend
/// it to the kernel by moving it into the [`Ring`](crate::Ring), which hands it back in the
/// [`Completion`](crate::Completion). The heap memory does not move when the `IoBuf` value
/// moves, which is what makes that lending sound.
pub struct IoBuf {
    /// Start of the allocation: `capacity` bytes, aligned to `IO_ALIGN`, all initialised.
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: an `IoBuf` is the unique owner of its allocation, exactly like a `Box<[u8]>`:
// moving it to another thread moves that ownership, and `&IoBuf` only gives `&[u8]`.
unsafe impl Send for IoBuf {}
// SAFETY: as above: shared references only allow reads of initialised bytes.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// Allocates a zeroed buffer of `capacity` bytes with `len == 0`.
    ///
    /// # Panics
    /// If `capacity` is zero or not a multiple of [`IO_ALIGN`] (a caller bug: pools size
    /// their buffers from constants). Aborts through [`alloc::handle_alloc_error`] if the
    /// allocator fails, like `Vec`.
    pub fn new(capacity: usize) -> IoBuf {
        assert!(
            capacity > 0 && capacity.is_multiple_of(IO_ALIGN),
            "IoBuf capacity {capacity} must be a non-zero multiple of {IO_ALIGN}"
        );
        let layout = Self::layout(capacity);
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        IoBuf { ptr, capacity, len: 0 }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, IO_ALIGN).expect("IoBuf layout: capacity overflows")
    }

    /// The fixed capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the length. Bytes past the old length keep whatever they held (all bytes of an
    /// `IoBuf` are initialised, so this is safe).
    ///
    /// # Panics
    /// If `len > capacity`.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "IoBuf::set_len({len}) beyond capacity {}", self.capacity);
        self.len = len;
    }

    /// Sets the length to zero (keeps the bytes).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `data` after `len` and grows `len`.
    ///
    /// # Panics
    /// If `data` does not fit in the spare capacity: a buffer never reallocates.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self.len + data.len();
        assert!(
            end <= self.capacity,
            "IoBuf::extend_from_slice: {} bytes do not fit in {} spare",
            data.len(),
            self.capacity - self.len
        );
        let start = self.len;
        self.as_full_mut()[start..end].copy_from_slice(data);
        self.len = end;
    }

    /// The whole capacity, ignoring `len`.
    pub fn as_full(&self) -> &[u8] {
        // SAFETY: `ptr` owns `capacity` initialised bytes for as long as `self` lives; the
        // returned borrow of `self` keeps them alive and forbids mutation through `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole capacity, ignoring `len`, mutably.
    pub fn as_full_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_full`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    /// The spare capacity `[len..capacity]`, to fill before [`set_len`](Self::set_len).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.as_full_mut()[len..]
    }

    /// Makes room for more input after a reader consumed `*pos` bytes from the front: when
    /// everything is consumed the buffer empties; otherwise, when fewer than `min_spare`
    /// bytes are free after `len`, the unconsumed tail moves to the front. Either way `*pos`
    /// becomes 0. Returns whether the tail moved (offsets into the old tail are stale).
    /// The one compaction of every receive buffer (both NVMe/TCP ends and the TLS channel).
    pub fn compact(&mut self, pos: &mut usize, min_spare: usize) -> bool {
        let end = self.len;
        if *pos == end {
            *pos = 0;
            self.len = 0;
            false
        } else if *pos > 0 && self.capacity - end < min_spare {
            let from = *pos;
            self.as_full_mut().copy_within(from..end, 0);
            self.len = end - from;
            *pos = 0;
            true
        } else {
            false
        }
    }

    /// Raw pointer to the start of the allocation, for handing to the kernel. Derived from
    /// the raw `NonNull` (never from a reference), so it stays valid when `self` moves.
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout and is
        // freed only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl Deref for IoBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.as_full()[..self.len]
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.as_full_mut()[..len]
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_buffer_is_aligned_zeroed_and_empty() {
        let buf = IoBuf::new(2 * IO_ALIGN);
        assert_eq!(buf.as_full().as_ptr() as usize % IO_ALIGN, 0);
        assert_eq!(buf.capacity(), 2 * IO_ALIGN);
        assert!(buf.is_empty());
        assert!(buf.as_full().iter().all(|&b| b == 0));
    }

    #[test]
    fn compact_empties_moves_or_keeps() {
        let cap = IO_ALIGN;
        let mut buf = IoBuf::new(cap);
        buf.extend_from_slice(b"abcdef");
        // All consumed: empty, nothing moved.
        let mut pos = 6;
        assert!(!buf.compact(&mut pos, cap));
        assert_eq!((pos, buf.len()), (0, 0));
        // Room enough after the tail: kept where it is.
        buf.extend_from_slice(b"abcdef");
        let mut pos = 2;
        assert!(!buf.compact(&mut pos, cap - 6));
        assert_eq!((pos, &buf[..]), (2, &b"abcdef"[..]));
        // Too little room: the unconsumed tail moves to the front.
        assert!(buf.compact(&mut pos, cap - 5));
        assert_eq!((pos, &buf[..]), (0, &b"cdef"[..]));
        // Nothing consumed: nothing to move, however full.
        assert!(!buf.compact(&mut pos, cap));
        assert_eq!(&buf[..], b"cdef");
    }

    #[test]
    fn len_bounds_deref_and_spare() {
        let mut buf = IoBuf::new(IO_ALIGN);
        buf.extend_from_slice(b"hello");
        assert_eq!(&buf[..], b"hello");
        assert_eq!(buf.spare_mut().len(), IO_ALIGN - 5);
        buf.spare_mut()[..3].copy_from_slice(b"abc");
        buf.set_len(8);
        assert_eq!(&buf[..], b"helloabc");
        buf[0] = b'H';
        assert_eq!(&buf[..5], b"Hello");
        buf.clear();
        assert!(buf.is_empty());
        assert_eq!(&buf.as_full()[..5], b"Hello", "clear keeps the bytes");
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_past_capacity_panics() {
        IoBuf::new(IO_ALIGN).set_len(IO_ALIGN + 1);
    }

    #[test]
    #[should_panic(expected = "multiple of 4096")]
    fn unaligned_capacity_panics() {
        let _ = IoBuf::new(1000);
    }

    #[test]
    fn moving_the_value_keeps_the_heap_address() {
        let buf = IoBuf::new(IO_ALIGN);
        let before = buf.as_mut_ptr();
        let moved = std::thread::spawn(move || buf).join().expect("thread");
        assert_eq!(moved.as_mut_ptr(), before);
    }
}
