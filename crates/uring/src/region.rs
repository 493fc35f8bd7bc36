//! [`SharedRegion`]: a large zeroed memory region that several reactor threads read and
//! write concurrently, like a RAM disk.
//!
//! # Why the copies are word-sized atomics
//!
//! Two reactors may copy into the same bytes at the same time (two hosts writing the same
//! LBA). With plain `ptr::copy_nonoverlapping` that is a data race, which the Rust memory
//! model makes undefined behaviour no matter how the pointer was obtained; "it is only
//! bytes" is not an argument the optimiser honours. So every access this module makes to
//! region memory is a `Relaxed` [`AtomicU64`] load or store on an 8-byte-aligned word (a
//! compare-exchange for the partial words at the ends of an unaligned range). All accesses
//! have one size, so they never form a mixed-size race either. On x86-64 a relaxed atomic
//! load or store is a plain `mov`; the price is that the copy is not vectorised (see the
//! `region_copy` criterion bench for the measured cost of a 4 KiB copy).
//!
//! The memory is never viewed through a Rust reference to `[u8]`: it is reached only
//! through the raw base pointer, and only as `&AtomicU64` for the duration of one access.
//!
//! # Torn writes
//!
//! Concurrent writers to the same bytes leave an unspecified mix of their data, like a disk
//! without atomic-write guarantees: each aligned 8-byte word holds the bytes of one writer,
//! and nothing is promised across words. A reader racing a writer sees, per word, old or new
//! bytes. Callers that need more (NVMe's atomic write unit) must serialise themselves.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ErrorKind};

/// Size of one access to region memory.
const WORD: usize = size_of::<u64>();

/// How to map a [`SharedRegion`].
#[derive(Debug, Default, Clone, Copy)]
pub struct RegionOptions {
    /// Fault every page in at construction (`MAP_POPULATE`), so the first I/O to each page
    /// does not pay for a page fault and zeroing.
    pub populate: bool,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`), fewer TLB misses for a
    /// large RAM disk. Best effort: refused advice is logged, not an error.
    pub huge_pages: bool,
}

/// A page-aligned, zeroed, anonymous memory region shared by reference (`Arc`) between
/// threads, with bounds-checked copies in and out. `Send + Sync`; unmapped on drop.
///
/// See the [module docs](self) for the memory model and the torn-write semantics.
pub struct SharedRegion {
    /// Start of the mapping; valid for `map_len` bytes until `drop` unmaps it.
    base: NonNull<u8>,
    /// Bytes the caller asked for; accesses are checked against this.
    len: usize,
    /// Bytes actually mapped: `len` rounded up to the page size (so whole-word accesses at
    /// the end of an unaligned `len` stay inside the mapping).
    map_len: usize,
}

// SAFETY: the region owns its mapping; every access through `&SharedRegion` is an atomic
// word access (see the module docs), so sharing and sending it between threads is sound.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Maps a zeroed region of `len` bytes with default options.
    pub fn new(len: usize) -> Result<SharedRegion, Error> {
        SharedRegion::with_options(len, RegionOptions::default())
    }

    /// Maps a zeroed region of `len` bytes.
    pub fn with_options(len: usize, options: RegionOptions) -> Result<SharedRegion, Error> {
        if len == 0 {
            return Err(Error::new(ErrorKind::InvalidArgument, "SharedRegion length must be non-zero"));
        }
        let page = page_size();
        let map_len = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "SharedRegion length overflows"))?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if options.populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: an anonymous mapping at an address the kernel chooses touches no existing
        // memory; the result is checked before use.
        let raw =
            unsafe { libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(Error::with_context(
                ErrorKind::Os,
                format!("mmap of a {len}-byte SharedRegion (check RLIMIT_AS and free memory)"),
            )
            .caused_by(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(raw.cast::<u8>()).expect("mmap returned null without failing");
        let region = SharedRegion { base, len, map_len };
        if options.huge_pages {
            // SAFETY: the range is exactly the mapping created above and owned by `region`.
            let rc = unsafe { libc::madvise(raw, map_len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "MADV_HUGEPAGE refused; SharedRegion uses normal pages"
                );
            }
        }
        Ok(region)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: construction refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    pub fn copy_from_region(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let range = self.check(offset, dst.len())?;
        let mut out = 0;
        self.for_each_word(range, |word_offset, in_word, take| {
            let bytes = self.word(word_offset).load(Ordering::Relaxed).to_ne_bytes();
            dst[out..out + take].copy_from_slice(&bytes[in_word..in_word + take]);
            out += take;
        });
        Ok(())
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn copy_to_region(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let range = self.check(offset, src.len())?;
        let mut consumed = 0;
        self.for_each_word(range, |word_offset, in_word, take| {
            let piece = &src[consumed..consumed + take];
            self.store_bytes(word_offset, in_word, piece);
            consumed += take;
        });
        Ok(())
    }

    /// Zeroes `range` (like a deallocate or write-zeroes on a disk).
    pub fn fill_zero(&self, range: Range<usize>) -> Result<(), Error> {
        let length = range
            .end
            .checked_sub(range.start)
            .ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "SharedRegion::fill_zero: reversed range"))?;
        let range = self.check(range.start, length)?;
        const ZEROS: [u8; WORD] = [0; WORD];
        self.for_each_word(range, |word_offset, in_word, take| {
            self.store_bytes(word_offset, in_word, &ZEROS[..take]);
        });
        Ok(())
    }

    /// Checks `offset..offset + length` against the region.
    pub(crate) fn check(&self, offset: usize, length: usize) -> Result<Range<usize>, Error> {
        match offset.checked_add(length) {
            Some(end) if end <= self.len => Ok(offset..end),
            _ => Err(Error::new(ErrorKind::InvalidArgument, "SharedRegion access out of bounds")),
        }
    }

    /// Base address, for building iovecs the kernel reads from (see `SendMsg::push_region`).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// Calls `f(word_offset, offset_in_word, bytes)` for each aligned word that `range`
    /// touches, in order; `bytes` is how many bytes of the range fall in that word.
    fn for_each_word(&self, range: Range<usize>, mut f: impl FnMut(usize, usize, usize)) {
        let mut pos = range.start;
        while pos < range.end {
            let word_offset = pos & !(WORD - 1);
            let in_word = pos - word_offset;
            let take = (WORD - in_word).min(range.end - pos);
            f(word_offset, in_word, take);
            pos += take;
        }
    }

    /// Writes `bytes` at `in_word` inside the word at `word_offset`: a plain atomic store
    /// for a whole word, a compare-exchange loop that keeps the other bytes otherwise.
    fn store_bytes(&self, word_offset: usize, in_word: usize, bytes: &[u8]) {
        let word = self.word(word_offset);
        if let Ok(whole) = <[u8; WORD]>::try_from(bytes) {
            word.store(u64::from_ne_bytes(whole), Ordering::Relaxed);
            return;
        }
        let merge = |old: u64| {
            let mut merged = old.to_ne_bytes();
            merged[in_word..in_word + bytes.len()].copy_from_slice(bytes);
            Some(u64::from_ne_bytes(merged))
        };
        // The closure always returns `Some`, so the update always succeeds.
        let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, merge);
    }

    /// The aligned word at `word_offset`, as an atomic.
    fn word(&self, word_offset: usize) -> &AtomicU64 {
        assert!(
            word_offset.is_multiple_of(WORD) && word_offset + WORD <= self.map_len,
            "SharedRegion word {word_offset} misaligned or past the mapping"
        );
        // SAFETY: the pointer is inside the mapping (checked above), 8-byte aligned (the
        // base is page-aligned and the offset a multiple of 8), and the mapping lives as
        // long as `&self`, which bounds the returned reference. All accesses to region
        // memory from Rust are `AtomicU64` accesses of this same size (module docs), so
        // concurrent use from other threads is not a data race.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(word_offset).cast::<u64>()) }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `base..base + map_len` is the mapping created in `with_options`, owned by
        // `self` alone; nothing can reach it after drop (a `SendMsg` that sends from the
        // region holds an `Arc` to it, so the region cannot drop while the kernel reads it).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "munmap of SharedRegion failed");
        }
    }
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion").field("len", &self.len).finish_non_exhaustive()
    }
}

/// The system page size.
fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_and_round_trips_unaligned_ranges() {
        let region = SharedRegion::new(100).expect("map");
        let mut out = [0xffu8; 100];
        region.copy_from_region(0, &mut out).expect("read");
        assert!(out.iter().all(|&b| b == 0));

        let data: Vec<u8> = (1..=37).collect();
        region.copy_to_region(3, &data).expect("write");
        let mut back = vec![0; 37];
        region.copy_from_region(3, &mut back).expect("read");
        assert_eq!(back, data);
        let mut around = [0u8; 3];
        region.copy_from_region(0, &mut around).expect("read");
        assert_eq!(around, [0, 0, 0], "bytes before the write untouched");
        region.copy_from_region(40, &mut around).expect("read");
        assert_eq!(around, [0, 0, 0], "bytes after the write untouched");
    }

    #[test]
    fn bounds_are_checked() {
        let region = SharedRegion::new(64).expect("map");
        let mut buf = [0u8; 8];
        assert!(region.copy_from_region(57, &mut buf).is_err());
        assert!(region.copy_to_region(usize::MAX, &buf).is_err());
        assert!(region.copy_to_region(56, &buf).is_ok());
        assert!(region.fill_zero(60..65).is_err());
        assert!(SharedRegion::new(0).is_err());
    }

    #[test]
    fn fill_zero_clears_only_the_range() {
        let region = SharedRegion::new(32).expect("map");
        region.copy_to_region(0, &[7u8; 32]).expect("write");
        region.fill_zero(5..27).expect("zero");
        let mut out = [0u8; 32];
        region.copy_from_region(0, &mut out).expect("read");
        assert!(out[..5].iter().all(|&b| b == 7));
        assert!(out[5..27].iter().all(|&b| b == 0));
        assert!(out[27..].iter().all(|&b| b == 7));
    }

    #[test]
    fn options_populate_and_huge_pages_map() {
        let options = RegionOptions { populate: true, huge_pages: true };
        let region = SharedRegion::with_options(4 << 20, options).expect("map");
        region.copy_to_region((4 << 20) - 4, b"tail").expect("write");
    }
}
