//! [`SharedRegion`]: a large zeroed memory region that several reactor threads read and
//! write concurrently, like a RAM disk.
//!
//! The memory model and torn-write semantics are documented on [`SharedRegion`].

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
/// bytes. [`SharedRegion::lend_for_read`] lends a range the same way to other code outside
/// it (the TLS record layer gives it to OpenSSL's AES-GCM, which encrypts straight from the
/// region instead of from a copy): a raw pointer, never a Rust reference.
///
/// # Torn writes
///
/// Concurrent writers to the same bytes leave an unspecified mix of their data, like a disk
/// without atomic-write guarantees: each aligned 8-byte word holds the bytes of one writer,
/// and nothing is promised across words. A reader racing a writer sees, per word, old or new
/// bytes. Callers that need more (NVMe's atomic write unit) must serialise themselves.
///
/// # Growing and shrinking while other threads copy
///
/// A region made with [`SharedRegion::growable`] reserves address space for `max_len`
/// bytes up front: the part past the first `len` bytes is mapped `PROT_NONE` (no memory,
/// no commit charge; touching it would fault). [`SharedRegion::resize`] changes the length
/// while other threads copy, without a lock on their side:
///
/// ```text
///   base                 len            mapped                          reserved
///    |--- copies allowed --|-- read/write, |------------ PROT_NONE ---------|
///                            no copies     |  (mprotect'ed to read/write on growth)
/// ```
///
/// * Every copy checks its range against `len` (one `Acquire` load) before it touches a
///   byte, and `len <= mapped` always holds.
/// * Growing first makes the pages up to the new length readable and writable
///   (`mprotect`), zeroes bytes left from an earlier, larger length, publishes `mapped`,
///   and only then publishes the new `len` with a `Release` store. A copy that sees the new
///   length therefore finds its pages mapped: no copy can touch a `PROT_NONE` page.
/// * Shrinking publishes the smaller `len` first and never unmaps or protects anything:
///   it only hands whole pages past the new end back to the kernel (`MADV_DONTNEED`, after
///   which they read as zeros). A copy (or a send) that checked its range against the old
///   length just before reads zeros or the old bytes there; it can never fault.
/// * The mapping is unmapped only on drop, when no copy can run (`&self` is gone, and a
///   `SendMsg` sending from the region holds an `Arc` to it).
pub struct SharedRegion {
    /// Start of the mapping; valid for `reserved` bytes until `drop` unmaps it.
    base: NonNull<u8>,
    /// Bytes callers may access; accesses are checked against this. At most `mapped`.
    len: AtomicUsize,
    /// Bytes from `base` that are readable and writable: `len` rounded up to the page size
    /// at its largest so far (so whole-word accesses at the end of an unaligned `len` stay
    /// inside it). Only grows.
    mapped: AtomicUsize,
    /// The largest length [`SharedRegion::resize`] accepts.
    max_len: usize,
    /// Bytes of address space mapped at construction (`max_len` rounded up to the page size).
    reserved: usize,
    /// How the region was mapped; growth maps new pages the same way.
    options: RegionOptions,
    /// Serialises resizes (control plane only; copies never take it).
    resizing: Mutex<()>,
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

    /// Maps a zeroed region of `len` bytes (it cannot grow beyond `len`).
    pub fn with_options(len: usize, options: RegionOptions) -> Result<SharedRegion, Error> {
        SharedRegion::growable(len, len, options)
    }

    /// Maps a zeroed region of `len` bytes that [`SharedRegion::resize`] may grow up to
    /// `max_len` bytes. The address space for `max_len` is reserved now (`PROT_NONE`: it
    /// costs no memory); memory is committed as the region grows.
    pub fn growable(len: usize, max_len: usize, options: RegionOptions) -> Result<SharedRegion, Error> {
        if len == 0 {
            return Err(Error::new(ErrorKind::InvalidArgument, "a shared memory region must not be empty (length 0)"));
        }
        if max_len < len {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a shared memory region's maximum length is below its length",
            ));
        }
        let map_len = round_up_to_page(len)?;
        let reserved = round_up_to_page(max_len)?;
        let growable = reserved > map_len;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // With huge pages the advice must come before the pages are faulted in, or they
        // are faulted as 4 KiB pages; so that case populates after the madvise instead (as
        // does a growable region, whose pages become writable only after the mmap).
        if options.populate && !options.huge_pages && !growable {
            flags |= libc::MAP_POPULATE;
        }
        let prot = if growable { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: an anonymous mapping at an address the kernel chooses touches no existing
        // memory; the result is checked before use.
        let raw = unsafe { libc::mmap(std::ptr::null_mut(), reserved, prot, flags, -1, 0) };
        if raw == libc::MAP_FAILED {
            return Err(Error::with_context(
                ErrorKind::Os,
                format!(
                    "mapping {len} bytes of shared memory (reserving {max_len}) failed (check free memory and RLIMIT_AS)"
                ),
            )
            .caused_by(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(raw.cast::<u8>()).expect("mmap returned null without failing");
        // From here on `region`'s drop unmaps the reservation, also on the error paths.
        let region = SharedRegion {
            base,
            len: AtomicUsize::new(0),
            mapped: AtomicUsize::new(if growable { 0 } else { map_len }),
            max_len,
            reserved,
            options,
            resizing: Mutex::new(()),
        };
        if options.huge_pages {
            // SAFETY: the range is exactly the reservation created above and owned by `region`.
            let rc = unsafe { libc::madvise(raw, reserved, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "transparent huge pages refused (MADV_HUGEPAGE); the memory uses normal pages"
                );
            }
        }
        if growable {
            region.map_pages(0, map_len)?;
            region.mapped.store(map_len, Ordering::Release);
        }
        if options.populate && (options.huge_pages || growable) {
            region.populate_write(0..map_len);
        }
        region.len.store(len, Ordering::Release);
        Ok(region)
    }

    /// Makes `start..end` (page-aligned, inside the reservation, not yet mapped) readable
    /// and writable.
    fn map_pages(&self, start: usize, end: usize) -> Result<(), Error> {
        assert!(
            start.is_multiple_of(page_size())
                && end.is_multiple_of(page_size())
                && start <= end
                && end <= self.reserved,
            "shared memory region pages {start}..{end} misaligned or outside the reservation"
        );
        if start == end {
            return Ok(());
        }
        // SAFETY: the range is page-aligned and inside this region's reservation (asserted
        // above), which the region owns; it is `PROT_NONE` so no copy can be using it, and
        // widening the protection cannot invalidate any access.
        let rc = unsafe {
            libc::mprotect(self.base.as_ptr().add(start).cast(), end - start, libc::PROT_READ | libc::PROT_WRITE)
        };
        if rc != 0 {
            return Err(Error::with_context(
                ErrorKind::Os,
                format!(
                    "mprotect of {} bytes of a shared memory region to read/write (check free memory)",
                    end - start
                ),
            )
            .caused_by(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Gives the whole pages of `start..end` back to the kernel: they stay mapped and read
    /// as zeros (`MADV_DONTNEED` on a private anonymous mapping). Best effort.
    fn discard_pages(&self, start: usize, end: usize) {
        let start = start.next_multiple_of(page_size());
        let end = end - end % page_size();
        if start >= end {
            return;
        }
        assert!(end <= self.mapped.load(Ordering::Acquire), "shared memory region discard past the mapped pages");
        // SAFETY: the range is page-aligned and inside the mapped part of this region's own
        // mapping (asserted above). DONTNEED keeps it mapped, so a copy racing it reads zeros
        // or old bytes and never faults; the kernel changes the bytes outside the Rust memory
        // model, like the kernel's reads of region memory during a send (type docs).
        let rc = unsafe { libc::madvise(self.base.as_ptr().add(start).cast(), end - start, libc::MADV_DONTNEED) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "MADV_DONTNEED on a shared memory region refused");
        }
    }

    /// Changes the length to `new_len` (at most the `max_len` given at construction) while
    /// other threads may copy (see the type docs for why that is safe). Bytes that become
    /// reachable read as zeros, also where the region was longer once and then shrank.
    /// Memory of pages past a smaller length is handed back to the kernel.
    pub fn resize(&self, new_len: usize) -> Result<(), Error> {
        let _only_one = self.resizing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if new_len == 0 {
            return Err(Error::new(ErrorKind::InvalidArgument, "shared memory region length must be non-zero"));
        }
        if new_len > self.max_len {
            return Err(Error::with_context(
                ErrorKind::InvalidArgument,
                format!("{new_len} bytes is beyond the {} bytes reserved for this shared memory region", self.max_len),
            ));
        }
        let old = self.len.load(Ordering::Acquire);
        if new_len < old {
            self.len.store(new_len, Ordering::Release);
            self.discard_pages(new_len, old.next_multiple_of(page_size()));
            return Ok(());
        }
        let mapped = self.mapped.load(Ordering::Acquire);
        // Bytes between the old end and the mapped end may hold data from before a shrink
        // (or a write that raced it): no copy can reach them now, so zero them before the
        // new length makes them reachable.
        self.zero_unreachable(old, new_len.min(mapped));
        let want = round_up_to_page(new_len)?;
        if want > mapped {
            self.map_pages(mapped, want)?;
            self.mapped.store(want, Ordering::Release);
        }
        if self.options.populate {
            self.populate_write(old - old % page_size()..want);
        }
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    /// Zeroes `start..end`, a range past `len` but inside the mapped pages: whole pages are
    /// discarded (they read as zeros after), the partial pages at the edges are stored to.
    fn zero_unreachable(&self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let first_page = start.next_multiple_of(page_size()).min(end);
        let last_page = (end - end % page_size()).max(first_page);
        self.zero_words(start..first_page);
        self.discard_pages(first_page, last_page);
        self.zero_words(last_page..end);
    }

    /// The largest length [`SharedRegion::resize`] accepts.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Faults the pages of `range` (page-aligned) in for writing (`MADV_POPULATE_WRITE`,
    /// Linux 5.14), or, where the kernel refuses that, by an atomic read-modify-write of one
    /// word per page that leaves its value unchanged.
    fn populate_write(&self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        assert!(
            range.end <= self.mapped.load(Ordering::Acquire),
            "shared memory region populate past the mapped pages"
        );
        // SAFETY: the range is inside the mapped part of this region's own mapping (asserted
        // above); populating changes no byte.
        let rc = unsafe {
            libc::madvise(self.base.as_ptr().add(range.start).cast(), range.len(), libc::MADV_POPULATE_WRITE)
        };
        if rc == 0 {
            return;
        }
        for offset in range.step_by(page_size()) {
            self.word(offset).fetch_or(0, Ordering::Relaxed);
        }
    }

    /// Length in bytes (one `Acquire` load: it changes with [`SharedRegion::resize`]).
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether the region is empty (never: construction and resize refuse zero).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// The address of `offset..offset + length`, checked against the region, for code
    /// outside the Rust abstract machine that reads it as the kernel does during a send (an
    /// FFI call into a separately compiled library or assembly, e.g. a cipher that encrypts
    /// from it). The pointer stays valid for reads of `length` bytes while `&self` lives
    /// (the mapping is only unmapped on drop; a shrink leaves it mapped, reading zeros).
    ///
    /// Whoever dereferences it must never form a Rust reference to the bytes (other threads
    /// may store to them at any time, see the type docs) and must treat what it reads as a
    /// racing reader does: per aligned word, old or new bytes.
    pub fn lend_for_read(&self, offset: usize, length: usize) -> Result<*const u8, Error> {
        self.check(offset, length)?;
        // SAFETY: `offset + length <= len <= mapped` (checked above), so the offset stays
        // inside this region's own mapping.
        Ok(unsafe { self.base.as_ptr().add(offset) }.cast_const())
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region the way a send from
    /// the region reads them: on x86-64 with the CPU's string copy (`rep movsb`, what the
    /// kernel's copy to a socket uses), in one instruction outside the Rust memory model
    /// like [`SharedRegion::lend_for_read`]'s readers; elsewhere as
    /// [`SharedRegion::copy_from_region`]. For bytes that leave the machine (a TLS record's
    /// content): a writer racing it leaves old or new bytes, as it would in a plaintext
    /// send, at the granularity of the CPU's copy rather than per word. About 2.7 times
    /// faster than the word-by-word copy for a cached 4 KiB block (42 against 112 ns,
    /// `region_copy` bench of `cargo bench -p uring --bench ring`).
    pub fn copy_for_send(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        #[cfg(target_arch = "x86_64")]
        {
            let src = self.lend_for_read(offset, dst.len())?;
            // SAFETY: `lend_for_read` checked `offset..offset + dst.len()` against the
            // region, whose mapping outlives this call; `dst` is a `&mut` to other memory,
            // writable for `dst.len()` bytes, so the ranges do not overlap. The region's
            // bytes are read only by the instruction (no Rust reference to them is formed).
            // The direction flag is clear on entry (Rust's inline-asm contract), so `rep
            // movsb` copies forward; it changes no flags and uses no stack.
            unsafe {
                core::arch::asm!(
                    "rep movsb",
                    inout("rcx") dst.len() => _,
                    inout("rsi") src => _,
                    inout("rdi") dst.as_mut_ptr() => _,
                    options(nostack, preserves_flags)
                );
            }
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.copy_from_region(offset, dst)
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
            .ok_or(Error::new(ErrorKind::InvalidArgument, "zeroing shared memory: reversed range"))?;
        self.check(range.start, length)?;
        self.zero_words(range);
        Ok(())
    }

    /// Stores zeros over `range`, which must lie inside the mapped pages (checked by the
    /// word accessors; callers check it against `len` when a caller's range).
    fn zero_words(&self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        let span = Span::new(range.start, range.len());
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
    }

    /// The offset of the first non-zero byte in `range`, if any (an O(range) scan, for the
    /// control plane: e.g. whether bytes past a smaller length hold data).
    pub fn find_nonzero(&self, range: Range<usize>) -> Result<Option<usize>, Error> {
        let length = range
            .end
            .checked_sub(range.start)
            .ok_or(Error::new(ErrorKind::InvalidArgument, "scanning shared memory: reversed range"))?;
        self.check(range.start, length)?;
        let mut chunk = vec![0u8; length.min(64 << 10)];
        let mut at = range.start;
        while at < range.end {
            let n = (range.end - at).min(chunk.len());
            self.copy_from_region(at, &mut chunk[..n])?;
            if let Some(i) = chunk[..n].iter().position(|&b| b != 0) {
                return Ok(Some(at + i));
            }
            at += n;
        }
        Ok(None)
    }

    /// Checks `offset..offset + length` against the region.
    pub(crate) fn check(&self, offset: usize, length: usize) -> Result<Range<usize>, Error> {
        match offset.checked_add(length) {
            Some(end) if end <= self.len() => Ok(offset..end),
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
            word_offset.is_multiple_of(WORD) && word_offset + WORD <= self.mapped.load(Ordering::Acquire),
            "shared memory region word {word_offset} misaligned or past the mapping"
        );
        // SAFETY: the pointer is inside the read/write pages of the mapping (checked above;
        // they stay mapped until drop, see the type docs), 8-byte aligned (the
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
            word_offset.is_multiple_of(WORD) && word_offset + count * WORD <= self.mapped.load(Ordering::Acquire),
            "shared memory region words {word_offset}+{count} misaligned or past the mapping"
        );
        // SAFETY: as in `word`, for each of the `count` words: inside the read/write pages
        // of the mapping (checked above), 8-byte aligned, alive for `&self`, and only ever accessed atomically with
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
        // SAFETY: `base..base + reserved` is the mapping created in `growable`, owned by
        // `self` alone; nothing can reach it after drop (a `SendMsg` that sends from the
        // region holds an `Arc` to it, so the region cannot drop while the kernel reads it).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.reserved) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "munmap of a shared memory region failed");
        }
    }
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("shared memory region")
            .field("len", &self.len())
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

/// `len` rounded up to the page size.
fn round_up_to_page(len: usize) -> Result<usize, Error> {
    len.checked_next_multiple_of(page_size())
        .ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "shared memory region length overflows"))
}

/// The system page size.
pub(crate) fn page_size() -> usize {
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
        let mapped = region.mapped.load(Ordering::Acquire);
        let mut vec = vec![0u8; mapped / page_size()];
        // SAFETY: the range is the region's mapped pages; `vec` has one byte per page of it.
        let rc = unsafe { libc::mincore(region.base.as_ptr().cast(), mapped, vec.as_mut_ptr()) };
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

    #[test]
    fn growable_region_grows_in_place_and_keeps_its_data() {
        let region = SharedRegion::growable(5000, 64 << 20, RegionOptions::default()).expect("map");
        assert_eq!((region.len(), region.max_len()), (5000, 64 << 20));
        assert_eq!(region.mapped.load(Ordering::Acquire), 2 * page_size(), "only the first pages are mapped");
        region.copy_to_region(4990, b"0123456789").expect("write at the end");
        assert!(region.copy_to_region(4995, b"0123456789").is_err(), "past the end before growing");
        region.resize(3 << 20).expect("grow");
        assert_eq!(region.len(), 3 << 20);
        let mut back = [0u8; 10];
        region.copy_from_region(4990, &mut back).expect("read");
        assert_eq!(&back, b"0123456789", "data kept across growth");
        region.copy_to_region((3 << 20) - 8, b"lastword").expect("write at the new end");
        assert_eq!(region.find_nonzero(5000..3 << 20).unwrap(), Some((3 << 20) - 8));
        assert!(region.resize((64 << 20) + 1).is_err(), "beyond the reservation");
        assert!(region.resize(0).is_err());
        assert!(SharedRegion::growable(8192, 4096, RegionOptions::default()).is_err());
    }

    #[test]
    fn bytes_past_a_shrink_read_as_zeros_when_grown_back() {
        let region = SharedRegion::growable(1 << 20, 4 << 20, RegionOptions::default()).expect("map");
        region.copy_to_region(0, &[0xab; 1 << 20]).expect("fill");
        region.resize(3000).expect("shrink");
        assert_eq!(region.len(), 3000);
        let mut b = [0u8; 8];
        assert!(region.copy_from_region(2996, &mut b).is_err(), "past the new end");
        region.resize(2 << 20).expect("grow back");
        let mut all = vec![0xffu8; 2 << 20];
        region.copy_from_region(0, &mut all).expect("read");
        assert!(all[..3000].iter().all(|&x| x == 0xab), "bytes below the shrink kept");
        assert_eq!(region.find_nonzero(3000..2 << 20).unwrap(), None, "bytes past the shrink read as zeros");
    }

    #[test]
    fn populate_extends_to_grown_pages() {
        let page = page_size();
        let region = SharedRegion::growable(4 * page, 64 * page, RegionOptions { populate: true, huge_pages: false })
            .expect("map");
        assert_eq!(resident_pages(&region), 4);
        region.resize(10 * page).expect("grow");
        assert_eq!(resident_pages(&region), 10, "grown pages are faulted in at once");
    }

    #[test]
    fn copies_race_growth_without_faulting() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let region = Arc::new(SharedRegion::growable(4096, 33 << 20, RegionOptions::default()).expect("map"));
        let stop = Arc::new(AtomicBool::new(false));
        let copied = Arc::new(AtomicU64::new(0));
        let reader = {
            let (region, stop, copied) = (Arc::clone(&region), Arc::clone(&stop), Arc::clone(&copied));
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    // Always the last 4 KiB of whatever the length is now.
                    let len = region.len();
                    region.copy_to_region(len - 4096, &[1; 4096]).expect("write below the length");
                    region.copy_from_region(len - 4096, &mut buf).expect("read below the length");
                    copied.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        for step in 1..=256 {
            region.resize(4096 + step * (128 << 10)).expect("grow");
            // Let the reader copy at the new end before the next step (bounded wait).
            let seen = copied.load(Ordering::Relaxed);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while copied.load(Ordering::Relaxed) < seen + 2
                && std::time::Instant::now() < deadline
                && !reader.is_finished()
            {
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("no fault or failed copy in the reader");
        assert!(copied.load(Ordering::Relaxed) >= 256, "the reader copied while the region grew");
        assert_eq!(region.len(), 4096 + 256 * (128 << 10));
    }
}
