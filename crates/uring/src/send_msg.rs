//! [`SendMsg`]: a reusable gather list that owns its pieces, sent with one
//! `IORING_OP_SENDMSG`.

use std::ops::Range;
use std::sync::Arc;

use crate::buf::IoBuf;
use crate::error::{Error, ErrorKind};
use crate::region::SharedRegion;

/// Most iovecs one `sendmsg` accepts (`UIO_MAXIOV` on Linux).
pub const SEND_SEGMENTS_MAX: usize = 1024;

/// Most bytes one message may carry: the completion reports the total in an `i32`.
pub const SEND_BYTES_MAX: usize = i32::MAX as usize;

/// One piece of the message, in send order.
#[derive(Debug, Clone, Copy)]
enum Segment {
    /// `header[start..end]`.
    Header { start: usize, end: usize },
    /// `bufs[index][start..end]`.
    Buf { index: usize, start: usize, end: usize },
    /// `regions[index]` bytes `start..end`.
    Region { index: usize, start: usize, end: usize },
}

/// A piece of a [`SendMsg`], in send order ([`SendMsg::pieces`]).
#[derive(Debug)]
pub enum Piece<'a> {
    /// Bytes the message owns (copied header bytes or a buffer's range).
    Bytes(&'a [u8]),
    /// Bytes `range` of a shared region.
    Region(&'a Arc<SharedRegion>, Range<usize>),
}

/// The kernel-facing view of a message: the iovec array and the `msghdr` pointing at it.
///
/// Both live on the heap (`iov` in its vector, `hdr` inside the boxed [`Parts`]), so their
/// addresses do not change when the `SendMsg` moves; `iov` is rebuilt from the segments on
/// every submission.
struct KernelMsg {
    iov: Vec<libc::iovec>,
    hdr: libc::msghdr,
    /// Index of the first iovec not yet fully sent (advanced on short sends).
    first: usize,
}

// SAFETY: the raw pointers in `iov` and `hdr` point only into memory owned by the same
// `SendMsg` (its header vector, its `IoBuf`s, its `Arc<SharedRegion>`s, its own `iov`),
// which moves together with them; they are dereferenced only by the kernel while the ring
// owns the whole message.
unsafe impl Send for KernelMsg {}
// SAFETY: `&KernelMsg` exposes nothing; see `Send` above.
unsafe impl Sync for KernelMsg {}

impl KernelMsg {
    fn new(segments: usize) -> KernelMsg {
        // SAFETY: `msghdr` is plain old data (integers and raw pointers); all-zero is the
        // valid "no name, no iovecs, no control data" value.
        let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        KernelMsg { iov: Vec::with_capacity(segments), hdr, first: 0 }
    }

    /// Points the header at `iov[first..]`.
    fn point_header(&mut self) {
        let rest = &mut self.iov[self.first..];
        self.hdr.msg_iov = rest.as_mut_ptr();
        self.hdr.msg_iovlen = rest.len();
    }
}

/// A reusable gather list that owns its pieces, sent with one `IORING_OP_SENDMSG`.
///
/// A message is a sequence of segments, in the order the caller pushes them: bytes copied
/// into the message's own header area ([`SendMsg::push_bytes`]), ranges of owned
/// [`IoBuf`]s ([`SendMsg::push_buf`]), and ranges of a [`SharedRegion`]
/// ([`SendMsg::push_region`]). The iovec array and the `msghdr` live in heap storage owned
/// by the message, built when the ring submits it, so they stay put while the kernel reads
/// them even if the message value moves (the ring's op slab may grow).
///
/// Steady state allocates nothing: [`SendMsg::drain_bufs`] / [`SendMsg::clear`] keep every
/// vector's capacity, and attached regions stay attached across `clear`.
///
/// ```
/// use uring::{IoBuf, SendMsg};
/// let mut payload = IoBuf::new(4096);
/// payload.extend_from_slice(b"data");
/// let mut msg = SendMsg::new();
/// msg.push_bytes(b"hdr:");
/// msg.push_buf(payload, 0..4).map_err(|(e, _)| e)?;
/// msg.push_bytes(b"!");
/// assert_eq!(msg.len(), 9);
/// assert_eq!(msg.to_vec(), b"hdr:data!");
/// let bufs: Vec<_> = msg.drain_bufs().collect(); // give them back to the pool
/// assert_eq!(bufs.len(), 1);
/// assert!(msg.is_empty());
/// # Ok::<(), uring::Error>(())
/// ```
pub struct SendMsg {
    p: Box<Parts>,
}

/// The message's state, boxed so that a `SendMsg` is one pointer: cheap to move through
/// completions, and the `msghdr` inside never moves while the kernel may read it.
struct Parts {
    header: Vec<u8>,
    segments: Vec<Segment>,
    bufs: Vec<IoBuf>,
    /// Regions this message has sent from. Kept across `clear` so that a connection that
    /// keeps sending from the same RAM disk touches no shared reference count per I/O.
    regions: Vec<Arc<SharedRegion>>,
    kernel: KernelMsg,
    /// Total bytes in the segments.
    len: usize,
    /// Bytes the kernel has accepted so far in the current submission.
    sent: usize,
}

impl Default for SendMsg {
    fn default() -> SendMsg {
        SendMsg::new()
    }
}

impl SendMsg {
    /// An empty message with room for a typical NVMe/TCP PDU (a 128-byte header area and
    /// four segments); it grows on first use if it needs more, then keeps that capacity.
    pub fn new() -> SendMsg {
        SendMsg::with_capacity(128, 4)
    }

    /// An empty message with room for `header_bytes` of copied bytes and `segments` pieces.
    pub fn with_capacity(header_bytes: usize, segments: usize) -> SendMsg {
        SendMsg {
            p: Box::new(Parts {
                header: Vec::with_capacity(header_bytes),
                segments: Vec::with_capacity(segments),
                bufs: Vec::with_capacity(segments),
                regions: Vec::new(),
                kernel: KernelMsg::new(segments),
                len: 0,
                sent: 0,
            }),
        }
    }

    /// Total bytes the message carries.
    pub fn len(&self) -> usize {
        self.p.len
    }

    /// Whether the message carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.p.len == 0
    }

    /// Number of segments (adjacent `push_bytes` calls share one).
    pub fn segments(&self) -> usize {
        self.p.segments.len()
    }

    /// The copied-bytes area (all `push_bytes` data, concatenated).
    pub fn header(&self) -> &[u8] {
        &self.p.header
    }

    /// Appends a copy of `bytes` (a PDU header, a digest). Consecutive calls coalesce into
    /// one segment.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        self.push_with(|h| h.extend_from_slice(bytes));
    }

    /// Appends the bytes `write` appends to the vector it is given (a PDU header encoded in
    /// place, not through a scratch vector and a copy), as [`SendMsg::push_bytes`] appends
    /// them. The vector holds the message's copied bytes so far: `write` only appends.
    ///
    /// # Panics
    ///
    /// If `write` shortened the vector (its length is restored first, so every segment
    /// stays within it).
    pub fn push_with<R>(&mut self, write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let start = self.p.header.len();
        let r = write(&mut self.p.header);
        let end = self.p.header.len();
        if end < start {
            self.p.header.resize(start, 0);
            panic!("SendMsg::push_with: the writer removed bytes the message sends");
        }
        if end == start {
            return r;
        }
        self.p.len += end - start;
        self.extend_header_segment(start, end);
        r
    }

    /// `header[start..end]` was appended: the last segment grows if it ends at `start`.
    #[inline]
    fn extend_header_segment(&mut self, start: usize, end: usize) {
        if let Some(Segment::Header { end: last_end, .. }) = self.p.segments.last_mut()
            && *last_end == start
        {
            *last_end = end;
            return;
        }
        self.p.segments.push(Segment::Header { start, end });
    }

    /// Appends `buf[range]` (within `buf.len()`), moving the buffer into the message.
    /// Hands the buffer back if the range is out of bounds.
    pub fn push_buf(&mut self, buf: IoBuf, range: Range<usize>) -> Result<(), (Error, IoBuf)> {
        if range.start > range.end || range.end > buf.len() {
            return Err((
                Error::new(ErrorKind::InvalidArgument, "SendMsg::push_buf: range outside the buffer's length"),
                buf,
            ));
        }
        self.p.len += range.len();
        self.p.segments.push(Segment::Buf { index: self.p.bufs.len(), start: range.start, end: range.end });
        self.p.bufs.push(buf);
        Ok(())
    }

    /// Appends bytes `range` of `region`, sent straight from the region without a copy.
    ///
    /// The message keeps a clone of the `Arc` (so the region outlives the send) and keeps
    /// it across [`clear`](Self::clear): pushing from a region the message already holds
    /// compares pointers and clones nothing, so steady-state sends touch no shared atomic.
    /// [`detach_regions`](Self::detach_regions) lets them go.
    ///
    /// The kernel reads the bytes when it runs the send; concurrent writers to that range
    /// give a mix of old and new bytes, like a disk (see [`SharedRegion`]).
    pub fn push_region(&mut self, region: &Arc<SharedRegion>, range: Range<usize>) -> Result<(), Error> {
        let length = range
            .end
            .checked_sub(range.start)
            .ok_or(Error::new(ErrorKind::InvalidArgument, "SendMsg::push_region: reversed range"))?;
        region.check(range.start, length)?;
        let index = match self.p.regions.iter().position(|r| Arc::ptr_eq(r, region)) {
            Some(index) => index,
            None => {
                self.p.regions.push(Arc::clone(region));
                self.p.regions.len() - 1
            }
        };
        self.p.len += length;
        self.p.segments.push(Segment::Region { index, start: range.start, end: range.end });
        Ok(())
    }

    /// Empties the message and yields its buffers, to return them to their pools. Keeps
    /// all capacity and the attached regions.
    pub fn drain_bufs(&mut self) -> std::vec::Drain<'_, IoBuf> {
        self.reset();
        self.p.bufs.drain(..)
    }

    /// Empties the message, dropping (freeing) any buffers still in it; use
    /// [`drain_bufs`](Self::drain_bufs) to recycle them instead. Keeps all capacity and the
    /// attached regions.
    pub fn clear(&mut self) {
        self.reset();
        self.p.bufs.clear();
    }

    /// Drops the message's references to the regions it has sent from.
    pub fn detach_regions(&mut self) {
        self.clear();
        self.p.regions.clear();
    }

    /// The message's bytes in send order, piece by piece, without copying: slices of its
    /// header area and buffers, and ranges of its regions (which may change under a reader,
    /// so they are named rather than lent: read them with `SharedRegion::copy_from_region`,
    /// or lend them to code outside Rust with `SharedRegion::lend_for_read`). A record layer
    /// encrypts a message from here (the `tls` crate); the iterator clones, to look ahead.
    pub fn pieces(&self) -> impl Iterator<Item = Piece<'_>> + Clone + '_ {
        self.p.segments.iter().map(move |segment| match *segment {
            Segment::Header { start, end } => Piece::Bytes(&self.p.header[start..end]),
            Segment::Buf { index, start, end } => Piece::Bytes(&self.p.bufs[index][start..end]),
            Segment::Region { index, start, end } => Piece::Region(&self.p.regions[index], start..end),
        })
    }

    /// Copies the message's bytes into a new vector, in send order (tests, debugging).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.p.len];
        let mut at = 0;
        for segment in &self.p.segments {
            match *segment {
                Segment::Header { start, end } => {
                    out[at..at + end - start].copy_from_slice(&self.p.header[start..end]);
                    at += end - start;
                }
                Segment::Buf { index, start, end } => {
                    out[at..at + end - start].copy_from_slice(&self.p.bufs[index][start..end]);
                    at += end - start;
                }
                Segment::Region { index, start, end } => {
                    self.p.regions[index]
                        .copy_from_region(start, &mut out[at..at + end - start])
                        .expect("segment was bounds-checked at push");
                    at += end - start;
                }
            }
        }
        out
    }

    fn reset(&mut self) {
        self.p.header.clear();
        self.p.segments.clear();
        self.p.kernel.iov.clear();
        self.p.kernel.first = 0;
        self.p.len = 0;
        self.p.sent = 0;
    }

    /// Builds the iovec array and `msghdr` for a fresh submission and returns the header
    /// pointer for `IORING_OP_SENDMSG`.
    ///
    /// The pointer and everything it reaches stay valid while `self` is not mutated or
    /// dropped: they point into heap memory owned by `self`, which does not move when `self`
    /// moves.
    pub(crate) fn prepare(&mut self) -> Result<*const libc::msghdr, Error> {
        if self.p.segments.len() > SEND_SEGMENTS_MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "SendMsg has more segments than sendmsg accepts (1024)",
            ));
        }
        if self.p.len > SEND_BYTES_MAX {
            return Err(Error::new(ErrorKind::InvalidArgument, "SendMsg carries more than i32::MAX bytes"));
        }
        self.p.kernel.iov.clear();
        for segment in &self.p.segments {
            let (base, start, end) = match *segment {
                Segment::Header { start, end } => (self.p.header.as_ptr(), start, end),
                Segment::Buf { index, start, end } => (self.p.bufs[index].as_mut_ptr().cast_const(), start, end),
                Segment::Region { index, start, end } => (self.p.regions[index].as_ptr(), start, end),
            };
            if start == end {
                continue;
            }
            // `wrapping_add` keeps this free of `unsafe`: the offset is in bounds (checked
            // at push), and only the kernel dereferences the result.
            self.p
                .kernel
                .iov
                .push(libc::iovec { iov_base: base.wrapping_add(start).cast_mut().cast(), iov_len: end - start });
        }
        self.p.kernel.first = 0;
        self.p.sent = 0;
        self.p.kernel.point_header();
        Ok(&raw const self.p.kernel.hdr)
    }

    /// Records that the kernel accepted `n` more bytes; returns the bytes still to send.
    /// Advances the iovecs past what was sent so a resubmission sends only the rest.
    pub(crate) fn advance(&mut self, n: usize) -> usize {
        self.p.sent += n;
        assert!(
            self.p.sent <= self.p.len,
            "kernel reported {} bytes sent of a {}-byte message",
            self.p.sent,
            self.p.len
        );
        let mut left = n;
        while left > 0 {
            let iov = &mut self.p.kernel.iov[self.p.kernel.first];
            if left >= iov.iov_len {
                left -= iov.iov_len;
                self.p.kernel.first += 1;
            } else {
                iov.iov_base = iov.iov_base.cast::<u8>().wrapping_add(left).cast();
                iov.iov_len -= left;
                left = 0;
            }
        }
        self.p.kernel.point_header();
        self.p.len - self.p.sent
    }

    /// Bytes accepted by the kernel in the current submission.
    pub(crate) fn sent(&self) -> usize {
        self.p.sent
    }

    /// The header pointer for a resubmission after [`advance`](Self::advance).
    pub(crate) fn header_ptr(&self) -> *const libc::msghdr {
        &raw const self.p.kernel.hdr
    }
}

impl std::fmt::Debug for SendMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendMsg")
            .field("len", &self.p.len)
            .field("segments", &self.p.segments.len())
            .field("bufs", &self.p.bufs.len())
            .field("regions", &self.p.regions.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf_with(bytes: &[u8]) -> IoBuf {
        let mut buf = IoBuf::new(4096);
        buf.extend_from_slice(bytes);
        buf
    }

    /// What the kernel would read from the current iovecs.
    fn iov_bytes(msg: &SendMsg) -> Vec<u8> {
        let hdr = &msg.p.kernel.hdr;
        let mut out = Vec::new();
        for i in 0..hdr.msg_iovlen {
            // SAFETY: test-only read of iovecs built by `prepare` over memory owned by
            // `msg`, which is borrowed (alive and unmodified) for this whole function.
            let iov = unsafe { &*hdr.msg_iov.add(i) };
            // SAFETY: as above; each iovec covers bytes inside one of `msg`'s buffers.
            let bytes = unsafe { std::slice::from_raw_parts(iov.iov_base.cast::<u8>(), iov.iov_len) };
            out.extend_from_slice(bytes);
        }
        out
    }

    #[test]
    fn bytes_written_in_place_join_the_copied_bytes_and_a_writer_that_removes_some_panics() {
        let mut msg = SendMsg::new();
        msg.push_bytes(b"ab");
        let n = msg.push_with(|h| {
            h.extend_from_slice(b"cd");
            h.len()
        });
        assert_eq!(n, 4, "the writer sees the bytes so far and appends after them");
        assert_eq!((msg.segments(), msg.len()), (1, 4));
        msg.push_with(|_| ());
        assert_eq!((msg.segments(), msg.len()), (1, 4), "nothing written, nothing added");
        msg.push_buf(buf_with(b"xyz"), 0..3).expect("in range");
        msg.push_with(|h| h.push(b'e'));
        assert_eq!(msg.to_vec(), b"abcdxyze");
        let shrink = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| msg.push_with(|h| h.clear())));
        assert!(shrink.is_err());
        assert_eq!(msg.header().len(), 5, "every segment still within the copied bytes");
        assert_eq!(msg.to_vec().len(), 8);
    }

    #[test]
    fn header_pushes_coalesce_and_bufs_interleave() {
        let mut msg = SendMsg::new();
        msg.push_bytes(b"ab");
        msg.push_bytes(b"cd");
        assert_eq!(msg.segments(), 1);
        msg.push_buf(buf_with(b"0123456789"), 2..5).expect("in range");
        msg.push_bytes(b"ef");
        assert_eq!(msg.segments(), 3);
        assert_eq!(msg.to_vec(), b"abcd234ef");
        msg.prepare().expect("prepare");
        assert_eq!(iov_bytes(&msg), b"abcd234ef");
    }

    #[test]
    fn pieces_walk_every_segment_in_order() {
        let region = Arc::new(SharedRegion::new(4096).expect("map"));
        region.copy_to_region(10, b"RR").expect("write");
        let mut msg = SendMsg::new();
        msg.push_bytes(b"h1");
        msg.push_buf(buf_with(b"0123"), 1..3).expect("in range");
        msg.push_region(&region, 10..12).expect("in range");
        msg.push_bytes(b"h2");
        let mut out = Vec::new();
        for p in msg.pieces() {
            match p {
                Piece::Bytes(b) => out.extend_from_slice(b),
                Piece::Region(r, range) => {
                    let mut tmp = vec![0; range.len()];
                    r.copy_from_region(range.start, &mut tmp).expect("in range");
                    out.extend_from_slice(&tmp);
                }
            }
        }
        assert_eq!(out, msg.to_vec());
        assert_eq!(out, b"h112RRh2");
    }

    #[test]
    fn push_buf_out_of_range_hands_buffer_back() {
        let mut msg = SendMsg::new();
        let (error, buf) = msg.push_buf(buf_with(b"abc"), 1..4).expect_err("past len");
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
        assert_eq!(&buf[..], b"abc");
        assert!(msg.is_empty());
    }

    #[test]
    fn advance_walks_iovecs_across_boundaries() {
        let mut msg = SendMsg::new();
        msg.push_bytes(b"hello ");
        msg.push_buf(buf_with(b"big world"), 0..9).expect("in range");
        msg.push_bytes(b"!");
        msg.prepare().expect("prepare");
        assert_eq!(msg.advance(3), 13);
        assert_eq!(iov_bytes(&msg), b"lo big world!");
        assert_eq!(msg.advance(3), 10, "exactly the end of the first iovec");
        assert_eq!(iov_bytes(&msg), b"big world!");
        assert_eq!(msg.advance(9), 1);
        assert_eq!(iov_bytes(&msg), b"!");
        assert_eq!(msg.advance(1), 0);
        assert_eq!(msg.sent(), 16);
    }

    #[test]
    fn region_segments_send_region_bytes_and_stay_attached() {
        let region = Arc::new(SharedRegion::new(8192).expect("map"));
        region.copy_to_region(100, b"from-region").expect("write");
        let mut msg = SendMsg::new();
        msg.push_bytes(b"<");
        msg.push_region(&region, 100..111).expect("in range");
        msg.push_bytes(b">");
        assert!(msg.push_region(&region, 8000..8193).is_err());
        msg.prepare().expect("prepare");
        assert_eq!(iov_bytes(&msg), b"<from-region>");
        assert_eq!(Arc::strong_count(&region), 2);
        msg.clear();
        msg.push_region(&region, 0..1).expect("in range");
        assert_eq!(Arc::strong_count(&region), 2, "no clone for an attached region");
        msg.detach_regions();
        assert_eq!(Arc::strong_count(&region), 1);
    }

    #[test]
    fn drain_bufs_empties_and_keeps_capacity() {
        let mut msg = SendMsg::new();
        msg.push_bytes(&[0; 100]);
        msg.push_buf(buf_with(b"x"), 0..1).expect("in range");
        msg.prepare().expect("prepare");
        let header_capacity = msg.p.header.capacity();
        assert_eq!(msg.drain_bufs().count(), 1);
        assert!(msg.is_empty());
        assert_eq!(msg.segments(), 0);
        assert_eq!(msg.p.header.capacity(), header_capacity);
    }

    #[test]
    fn too_many_segments_is_refused() {
        let mut msg = SendMsg::new();
        for i in 0..=SEND_SEGMENTS_MAX {
            msg.push_buf(buf_with(&[u8::try_from(i % 251).expect("small")]), 0..1).expect("in range");
        }
        assert!(msg.prepare().is_err());
    }
}
