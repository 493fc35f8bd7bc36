//! [`SharedRegion`]: a large zeroed memory region that several reactor threads read and
//! write concurrently, like a RAM disk.
//!
//! The memory model and torn-write semantics are documented on [`SharedRegion`].

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
/// # Why the copies are word-sized atomics
///
/// Two reactors may copy into the same bytes at the same time (two hosts writing the same
/// LBA). With plain `ptr::copy_nonoverlapping` that is a data race, which the Rust memory
/// model makes undefined behaviour no matter how the pointer was obtained; "it is only
/// bytes" is not an argument the optimiser honours. So every access this module makes to
/// region memory is a `Relaxed` [`AtomicU64`] load or store on an 8-byte-aligned word (a
/// compare-exchange for the partial words at the ends of an unaligned range). All accesses
/// have one size, so they never form a mixed-size race either. On x86-64 a relaxed atomic
/// load or store is a plain `mov`; the price is that the copy is not vectorised (see the
/// `region_copy` criterion bench for the measured cost of a 4 KiB copy).
///
/// The memory is never viewed through a Rust reference to `[u8]`: it is reached only
/// through the raw base pointer, as `&AtomicU64` / `&[AtomicU64]` for the duration of one
/// copy. The kernel also reads it when a [`SendMsg`](crate::SendMsg) sends from the region;
/// that access is outside the Rust memory model (like DMA) and sees, per word, old or new
/// bytes.
///
/// # Torn writes
///
/// Concurrent writers to the same bytes leave an unspecified mix of their data, like a disk
/// without atomic-write guarantees: each aligned 8-byte word holds the bytes of one writer,
/// and nothing is promised across words. A reader racing a writer sees, per word, old or new
/// bytes. Callers that need more (NVMe's atomic write unit) must serialise themselves.
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
// word access (see the type docs), so sharing and sending it between threads is sound.
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
            return Err(Error::new(ErrorKind::InvalidArgument, "a shared memory region must not be empty (length 0)"));
        }
        let page = page_size();
        let map_len = len.checked_next_multiple_of(page).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "a shared memory region that large cannot be mapped (its length overflows)",
            )
        })?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // With huge pages the advice must come before the pages are faulted in, or they
        // are faulted as 4 KiB pages; so that case populates after the madvise instead.
        if options.populate && !options.huge_pages {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: an anonymous mapping at an address the kernel chooses touches no existing
        // memory; the result is checked before use.
        let raw =
            unsafe { libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(Error::with_context(
                ErrorKind::Os,
                format!("mapping {len} bytes of shared memory failed (check free memory and RLIMIT_AS)"),
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
                    "transparent huge pages refused (MADV_HUGEPAGE); the memory uses normal pages"
                );
            }
            if options.populate {
                region.populate_write();
            }
        }
        Ok(region)
    }

    /// Faults every page in for writing (`MADV_POPULATE_WRITE`, Linux 5.14), or, where the
    /// kernel refuses that, by storing a zero word into each page (the memory is zeroed
    /// already, so the contents do not change).
    fn populate_write(&self) {
        // SAFETY: the range is exactly this region's mapping.
        let rc = unsafe { libc::madvise(self.base.as_ptr().cast(), self.map_len, libc::MADV_POPULATE_WRITE) };
        if rc == 0 {
            return;
        }
        let page = page_size();
        for offset in (0..self.len).step_by(page) {
            // Within `len`, so the copy cannot fail.
            let _ = self.copy_to_region(offset, &[0u8; WORD][..WORD.min(self.len - offset)]);
        }
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
        self.check(offset, dst.len())?;
        let span = Span::new(offset, dst.len());
        let (head, rest) = dst.split_at_mut(span.head_len);
        let (middle, tail) = rest.split_at_mut(span.middle_words * WORD);
        if !head.is_empty() {
            let bytes = self.word(span.head_word).load(Ordering::Relaxed).to_ne_bytes();
            head.copy_from_slice(&bytes[span.head_in_word..span.head_in_word + head.len()]);
        }
        for (chunk, word) in middle.chunks_exact_mut(WORD).zip(self.words(span.middle_start, span.middle_words)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        if !tail.is_empty() {
            let bytes = self.word(span.tail_word).load(Ordering::Relaxed).to_ne_bytes();
            tail.copy_from_slice(&bytes[..tail.len()]);
        }
        Ok(())
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn copy_to_region(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.check(offset, src.len())?;
        let span = Span::new(offset, src.len());
        let (head, rest) = src.split_at(span.head_len);
        let (middle, tail) = rest.split_at(span.middle_words * WORD);
        if !head.is_empty() {
            self.store_bytes(span.head_word, span.head_in_word, head);
        }
        for (chunk, word) in middle.chunks_exact(WORD).zip(self.words(span.middle_start, span.middle_words)) {
            let whole: [u8; WORD] = chunk.try_into().expect("chunks_exact yields whole words");
            word.store(u64::from_ne_bytes(whole), Ordering::Relaxed);
        }
        if !tail.is_empty() {
            self.store_bytes(span.tail_word, 0, tail);
        }
        Ok(())
    }

    /// Zeroes `range` (like a deallocate or write-zeroes on a disk).
    pub fn fill_zero(&self, range: Range<usize>) -> Result<(), Error> {
        let length = range
            .end
            .checked_sub(range.start)
            .ok_or(Error::new(ErrorKind::InvalidArgument, "SharedRegion::fill_zero: reversed range"))?;
        self.check(range.start, length)?;
        let span = Span::new(range.start, length);
        const ZEROS: [u8; WORD] = [0; WORD];
        if span.head_len > 0 {
            self.store_bytes(span.head_word, span.head_in_word, &ZEROS[..span.head_len]);
        }
        for word in self.words(span.middle_start, span.middle_words) {
            word.store(0, Ordering::Relaxed);
        }
        if span.tail_len > 0 {
            self.store_bytes(span.tail_word, 0, &ZEROS[..span.tail_len]);
        }
        Ok(())
    }

    /// Checks `offset..offset + length` against the region.
    pub(crate) fn check(&self, offset: usize, length: usize) -> Result<Range<usize>, Error> {
        match offset.checked_add(length) {
            Some(end) if end <= self.len => Ok(offset..end),
            _ => Err(Error::new(ErrorKind::InvalidArgument, "shared memory region access out of bounds")),
        }
    }

    /// Base address, for building iovecs the kernel reads from (see `SendMsg::push_region`).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.base.as_ptr()
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
        // memory from Rust are `AtomicU64` accesses of this same size (type docs), so
        // concurrent use from other threads is not a data race.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(word_offset).cast::<u64>()) }
    }

    /// `count` aligned words starting at byte `word_offset`, as atomics.
    fn words(&self, word_offset: usize, count: usize) -> &[AtomicU64] {
        if count == 0 {
            // A range inside one word has no middle, and its `middle_start` is unaligned.
            return &[];
        }
        assert!(
            word_offset.is_multiple_of(WORD) && word_offset + count * WORD <= self.map_len,
            "SharedRegion words {word_offset}+{count} misaligned or past the mapping"
        );
        // SAFETY: as in `word`, for each of the `count` words: inside the mapping (checked
        // above), 8-byte aligned, alive for `&self`, and only ever accessed atomically with
        // this one size. `AtomicU64` has the size and alignment of `u64`, so the words form
        // a valid `[AtomicU64]`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(word_offset).cast::<AtomicU64>(), count) }
    }
}

/// How a byte range splits into a partial head word, whole middle words and a partial
/// tail word.
#[derive(Debug, PartialEq, Eq)]
struct Span {
    head_word: usize,
    head_in_word: usize,
    head_len: usize,
    middle_start: usize,
    middle_words: usize,
    tail_word: usize,
    tail_len: usize,
}

impl Span {
    fn new(offset: usize, len: usize) -> Span {
        let head_in_word = offset % WORD;
        let head_len = if head_in_word == 0 { 0 } else { (WORD - head_in_word).min(len) };
        let middle_start = offset + head_len;
        let middle_words = (len - head_len) / WORD;
        let tail_word = middle_start + middle_words * WORD;
        Span {
            head_word: offset - head_in_word,
            head_in_word,
            head_len,
            middle_start,
            middle_words,
            tail_word,
            tail_len: len - head_len - middle_words * WORD,
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `base..base + map_len` is the mapping created in `with_options`, owned by
        // `self` alone; nothing can reach it after drop (a `SendMsg` that sends from the
        // region holds an `Arc` to it, so the region cannot drop while the kernel reads it).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "munmap of a shared memory region failed");
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
    fn spans_split_into_head_middle_tail() {
        let span = Span::new(3, 30);
        assert_eq!((span.head_word, span.head_in_word, span.head_len), (0, 3, 5));
        assert_eq!((span.middle_start, span.middle_words), (8, 3));
        assert_eq!((span.tail_word, span.tail_len), (32, 1));
        let inside = Span::new(9, 2);
        assert_eq!((inside.head_len, inside.middle_words, inside.tail_len), (2, 0, 0));
        let aligned = Span::new(16, 16);
        assert_eq!((aligned.head_len, aligned.middle_words, aligned.tail_len), (0, 2, 0));
    }

    #[test]
    fn every_small_offset_and_length_matches_a_plain_vector() {
        let region = SharedRegion::new(64).expect("map");
        let mut model = [0u8; 64];
        let mut seed = 1u8;
        for offset in 0..17 {
            for len in 0..40 {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(13).wrapping_add(7);
                        seed
                    })
                    .collect();
                region.copy_to_region(offset, &data).expect("write");
                model[offset..offset + len].copy_from_slice(&data);
                if len % 3 == 0 {
                    region.fill_zero(offset..offset + len / 2).expect("zero");
                    model[offset..offset + len / 2].fill(0);
                }
                let mut all = [0u8; 64];
                region.copy_from_region(0, &mut all).expect("read");
                assert_eq!(&all[..], &model[..], "offset {offset} len {len}");
                let mut part = vec![0u8; len];
                region.copy_from_region(offset, &mut part).expect("read");
                assert_eq!(&part[..], &model[offset..offset + len]);
            }
        }
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

    /// Pages of the region the kernel has resident (`mincore`).
    fn resident_pages(region: &SharedRegion) -> usize {
        let mut vec = vec![0u8; region.map_len / page_size()];
        // SAFETY: the range is the region's mapping; `vec` has one byte per page of it.
        let rc = unsafe { libc::mincore(region.base.as_ptr().cast(), region.map_len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populate_faults_every_page_in_and_keeps_it_zeroed() {
        const LEN: usize = 8 << 20;
        let lazy = SharedRegion::new(LEN).expect("map");
        assert_eq!(resident_pages(&lazy), 0, "a lazy region has no page until written");
        for huge_pages in [false, true] {
            let region = SharedRegion::with_options(LEN, RegionOptions { populate: true, huge_pages }).expect("map");
            assert_eq!(resident_pages(&region), LEN / page_size(), "huge_pages {huge_pages}");
            let mut out = vec![0xffu8; LEN];
            region.copy_from_region(0, &mut out).expect("read");
            assert!(out.iter().all(|&b| b == 0), "huge_pages {huge_pages}: zeroed");
        }
    }
}
