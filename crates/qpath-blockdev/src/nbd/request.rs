//! NBD transmission requests, sans I/O: the framer that cuts the client's byte stream into
//! request headers and write payloads, and the check of one request against the export.
//!
//! ```text
//!   bytes ─► Framer::next ─► Frame::Header(Request) ─► check(&Request, &Limits)
//!                         │                              ├─ Ok(Command)    -> run it
//!                         │                              └─ Err(Refusal)   -> error reply
//!                         └► Frame::Payload(&[u8]) ... (a write's data, in pieces)
//! ```
//!
//! A header with a wrong magic, or a write payload longer than [`PAYLOAD_HARD_MAX`], cannot
//! be skipped safely: the framer reports [`Malformed`] and the connection is closed (a hard
//! disconnect, which the protocol allows on a broken mandatory condition). Everything
//! else that is wrong with a request is that request's error, and the connection goes on:
//! a refused write's payload is still read (and dropped) so the stream stays in step.

use super::wire::{REQUEST_LEN, REQUEST_MAGIC, be16, be32, be64, cmd, cmd_flags, flags};
use crate::errno::nbd;

/// The largest write payload read at all: 32 MiB, which the protocol says no server should
/// treat as a denial of service. Anything larger closes the connection.
pub const PAYLOAD_HARD_MAX: u32 = 32 << 20;

/// A request header as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Request type (`wire::cmd`).
    pub kind: u16,
    /// The client's cookie, echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

impl Request {
    /// Decodes a 28-byte header; `None` if the magic is wrong.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Option<Request> {
        if be32(b, 0) != REQUEST_MAGIC {
            return None;
        }
        Some(Request {
            flags: be16(b, 4),
            kind: be16(b, 6),
            cookie: be64(b, 8),
            offset: be64(b, 16),
            length: be32(b, 24),
        })
    }

    /// Encodes into 28 bytes (for clients in tests and fuzzing).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.kind == cmd::WRITE { self.length } else { 0 }
    }
}

/// The stream is broken beyond one request: close the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// A request header did not start with `NBD_REQUEST_MAGIC`.
    #[error("request magic {0:#010x} is not NBD_REQUEST_MAGIC")]
    Magic(u32),
    /// A write announced more payload than any server reads.
    #[error("write of {0} bytes is larger than the 32 MiB any request may carry")]
    PayloadTooLarge(u32),
}

/// One piece of the transmission stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Not enough bytes for anything yet.
    NeedMore,
    /// A request header; a write's payload follows as `Payload` frames.
    Header(Request),
    /// The next bytes of the current write's payload.
    Payload(&'a [u8]),
}

/// Cuts the client's stream into headers and payload pieces.
#[derive(Debug, Default)]
pub struct Framer {
    hdr: [u8; REQUEST_LEN],
    have: usize,
    payload_left: u32,
}

impl Framer {
    /// A framer at the start of the transmission phase.
    pub fn new() -> Framer {
        Framer::default()
    }

    /// Bytes of the current write's payload not yet returned.
    pub fn payload_left(&self) -> u32 {
        self.payload_left
    }

    /// The next frame from `input`, and how many bytes of `input` it used.
    pub fn next<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Frame<'a>), Malformed> {
        if self.payload_left > 0 {
            if input.is_empty() {
                return Ok((0, Frame::NeedMore));
            }
            let n = input.len().min(self.payload_left as usize);
            self.payload_left -= u32::try_from(n).expect("n <= payload_left");
            return Ok((n, Frame::Payload(&input[..n])));
        }
        let n = (REQUEST_LEN - self.have).min(input.len());
        self.hdr[self.have..self.have + n].copy_from_slice(&input[..n]);
        self.have += n;
        if self.have < REQUEST_LEN {
            return Ok((n, Frame::NeedMore));
        }
        self.have = 0;
        let req = Request::decode(&self.hdr).ok_or(Malformed::Magic(be32(&self.hdr, 0)))?;
        let payload = req.payload_len();
        if payload > PAYLOAD_HARD_MAX {
            return Err(Malformed::PayloadTooLarge(payload));
        }
        self.payload_left = payload;
        Ok((n, Frame::Header(req)))
    }
}

/// What the export allows, as negotiated with this client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes.
    pub size: u64,
    /// Requests must be aligned to this (a power of two).
    pub block_min: u32,
    /// Largest read or write.
    pub payload_max: u32,
    /// Transmission flags sent to this client.
    pub flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
}

/// What a checked request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read `length` bytes at `offset`.
    Read,
    /// Write the payload at `offset`; `fua`: durable before the reply.
    Write {
        /// Force unit access.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Discard the range (NVMe Deallocate).
    Trim {
        /// Force unit access.
        fua: bool,
    },
    /// Zero the range.
    WriteZeroes {
        /// Force unit access.
        fua: bool,
    },
    /// The client disconnects (soft disconnect; no reply).
    Disconnect,
    /// A zero-length read, write, trim or zeroing: nothing to do, success.
    Nothing,
}

/// Why a request is refused: an NBD error and a message for the structured error chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// NBD error value.
    pub error: u32,
    /// For humans.
    pub message: &'static str,
}

fn refuse(error: u32, message: &'static str) -> Result<Command, Refusal> {
    Err(Refusal { error, message })
}

/// Checks a request against the export (NBD protocol, "Request types", "Error values",
/// "Size constraints").
pub fn check(r: &Request, lim: &Limits) -> Result<Command, Refusal> {
    let has = |f: u16| lim.flags & f != 0;
    // FUA is valid on every command once SEND_FUA is advertised (the server MUST accept it).
    let mut allowed = if has(flags::SEND_FUA) { cmd_flags::FUA } else { 0 };
    match r.kind {
        cmd::READ if has(flags::SEND_DF) => allowed |= cmd_flags::DF,
        cmd::WRITE_ZEROES => allowed |= cmd_flags::NO_HOLE,
        _ => {}
    }
    let fua = r.flags & cmd_flags::FUA != 0;
    match r.kind {
        cmd::DISC => return Ok(Command::Disconnect),
        cmd::READ | cmd::WRITE | cmd::FLUSH | cmd::TRIM | cmd::WRITE_ZEROES => {}
        cmd::BLOCK_STATUS => return refuse(nbd::EINVAL, "no metadata context was negotiated"),
        _ => return refuse(nbd::EINVAL, "unknown or unsupported command"),
    }
    if r.flags & !allowed != 0 {
        return refuse(nbd::EINVAL, "a command flag this command does not take");
    }
    let writes = matches!(r.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    if writes && has(flags::READ_ONLY) {
        return refuse(nbd::EPERM, "the export is read-only");
    }
    if r.kind == cmd::FLUSH {
        if !has(flags::SEND_FLUSH) {
            return refuse(nbd::EINVAL, "flush is not offered");
        }
        if r.offset != 0 || r.length != 0 {
            return refuse(nbd::EINVAL, "flush takes no offset or length");
        }
        return Ok(Command::Flush);
    }
    if r.kind == cmd::TRIM && !has(flags::SEND_TRIM) {
        return refuse(nbd::EINVAL, "trim is not offered");
    }
    if r.kind == cmd::WRITE_ZEROES && !has(flags::SEND_WRITE_ZEROES) {
        return refuse(nbd::EINVAL, "write zeroes is not offered");
    }
    let bs = u64::from(lim.block_min.max(1));
    if !r.offset.is_multiple_of(bs) || !u64::from(r.length).is_multiple_of(bs) {
        return refuse(nbd::EINVAL, "offset or length not a multiple of the minimum block size");
    }
    if r.offset.checked_add(u64::from(r.length)).is_none_or(|end| end > lim.size) {
        return refuse(
            if writes && r.kind != cmd::TRIM { nbd::ENOSPC } else { nbd::EINVAL },
            "past the end of the export",
        );
    }
    if matches!(r.kind, cmd::READ | cmd::WRITE) && r.length > lim.payload_max {
        return refuse(nbd::EINVAL, "longer than the maximum payload");
    }
    if r.length == 0 {
        return Ok(Command::Nothing);
    }
    Ok(match r.kind {
        cmd::READ => Command::Read,
        cmd::WRITE => Command::Write { fua },
        cmd::TRIM => Command::Trim { fua },
        _ => Command::WriteZeroes { fua },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request { flags, kind, cookie: 7, offset, length }
    }

    const LIM: Limits = Limits {
        size: 1 << 20,
        block_min: 512,
        payload_max: 64 << 10,
        flags: flags::HAS_FLAGS | flags::SEND_FLUSH | flags::SEND_FUA | flags::SEND_TRIM | flags::SEND_WRITE_ZEROES,
        structured: true,
    };

    #[test]
    fn framer_cuts_headers_and_payloads_in_any_pieces() {
        let mut stream = req(cmd::WRITE, 0, 4096, 1000).encode().to_vec();
        stream.extend(std::iter::repeat_n(0xab, 1000));
        stream.extend(req(cmd::READ, 0, 0, 512).encode());
        for piece in [1usize, 3, 27, 28, 29, 500, 4096] {
            let mut f = Framer::new();
            let (mut hdrs, mut payload) = (Vec::new(), 0usize);
            for chunk in stream.chunks(piece) {
                let mut c = chunk;
                loop {
                    let (n, frame) = f.next(c).unwrap();
                    c = &c[n..];
                    match frame {
                        Frame::NeedMore => break,
                        Frame::Header(r) => hdrs.push(r),
                        Frame::Payload(p) => {
                            assert!(p.iter().all(|&b| b == 0xab));
                            payload += p.len();
                        }
                    }
                    if c.is_empty() && f.payload_left() == 0 {
                        break;
                    }
                }
            }
            assert_eq!(hdrs.len(), 2, "piece {piece}");
            assert_eq!(payload, 1000);
            assert_eq!(hdrs[1], req(cmd::READ, 0, 0, 512));
        }
    }

    #[test]
    fn framer_refuses_bad_magic_and_huge_payloads() {
        let mut b = req(cmd::READ, 0, 0, 512).encode();
        b[0] = 0;
        assert!(matches!(Framer::new().next(&b), Err(Malformed::Magic(_))));
        let b = req(cmd::WRITE, 0, 0, PAYLOAD_HARD_MAX + 1).encode();
        assert_eq!(Framer::new().next(&b), Err(Malformed::PayloadTooLarge(PAYLOAD_HARD_MAX + 1)));
        // A huge read carries no payload: it is the request's error, not the stream's.
        let b = req(cmd::READ, 0, 0, u32::MAX).encode();
        assert!(matches!(Framer::new().next(&b), Ok((28, Frame::Header(_)))));
    }

    #[test]
    fn checks() {
        assert_eq!(check(&req(cmd::READ, 0, 512, 512), &LIM), Ok(Command::Read));
        assert_eq!(check(&req(cmd::WRITE, cmd_flags::FUA, 0, 4096), &LIM), Ok(Command::Write { fua: true }));
        assert_eq!(check(&req(cmd::FLUSH, 0, 0, 0), &LIM), Ok(Command::Flush));
        assert_eq!(check(&req(cmd::TRIM, 0, 0, 1 << 20), &LIM), Ok(Command::Trim { fua: false }));
        assert_eq!(
            check(&req(cmd::WRITE_ZEROES, cmd_flags::NO_HOLE, 0, 1 << 20), &LIM),
            Ok(Command::WriteZeroes { fua: false })
        );
        assert_eq!(check(&req(cmd::DISC, 0, 0, 0), &LIM), Ok(Command::Disconnect));
        assert_eq!(check(&req(cmd::READ, 0, 0, 0), &LIM), Ok(Command::Nothing));
        let err = |r: Request| check(&r, &LIM).unwrap_err().error;
        assert_eq!(err(req(cmd::READ, 0, 100, 512)), nbd::EINVAL, "unaligned");
        assert_eq!(err(req(cmd::READ, 0, (1 << 20) - 512, 1024)), nbd::EINVAL, "read past the end");
        assert_eq!(err(req(cmd::WRITE, 0, (1 << 20) - 512, 1024)), nbd::ENOSPC, "write past the end");
        assert_eq!(err(req(cmd::WRITE_ZEROES, 0, u64::MAX - 511, 1024)), nbd::ENOSPC, "offset overflow");
        assert_eq!(err(req(cmd::TRIM, 0, 1 << 20, 512)), nbd::EINVAL, "trim past the end");
        assert_eq!(err(req(cmd::READ, 0, 0, 128 << 10)), nbd::EINVAL, "longer than payload_max");
        assert_eq!(err(req(cmd::READ, cmd_flags::DF, 0, 512)), nbd::EINVAL, "DF not offered here");
        assert_eq!(err(req(cmd::WRITE_ZEROES, cmd_flags::FAST_ZERO, 0, 512)), nbd::EINVAL);
        assert_eq!(err(req(cmd::FLUSH, 0, 512, 0)), nbd::EINVAL);
        assert_eq!(err(req(cmd::BLOCK_STATUS, 0, 0, 512)), nbd::EINVAL);
        assert_eq!(err(req(cmd::CACHE, 0, 0, 512)), nbd::EINVAL);
        assert_eq!(err(req(77, 0, 0, 512)), nbd::EINVAL);
        let ro = Limits { flags: LIM.flags | flags::READ_ONLY, ..LIM };
        assert_eq!(check(&req(cmd::WRITE, 0, 0, 512), &ro).unwrap_err().error, nbd::EPERM);
        let bare = Limits { flags: flags::HAS_FLAGS, ..LIM };
        for k in [cmd::FLUSH, cmd::TRIM, cmd::WRITE_ZEROES] {
            assert_eq!(check(&req(k, 0, 0, 0), &bare).unwrap_err().error, nbd::EINVAL);
        }
        assert_eq!(check(&req(cmd::WRITE, cmd_flags::FUA, 0, 512), &bare).unwrap_err().error, nbd::EINVAL);
    }
}
