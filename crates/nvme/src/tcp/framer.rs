//! The receive side of an NVMe/TCP queue, without I/O: splits the byte
//! stream into PDU headers, data chunks and data digests (NVMe/TCP 1.0 §3.6:
//! a PDU is header, optional header digest, padding up to PDO, data, optional
//! data digest). Both ends use it; what a PDU means stays with them.
//!
//! The caller owns the bytes. It hands [`Framer::next`] what it has received
//! past its read position and moves that position on by what the framer says
//! it consumed:
//!
//! ```text
//!   Header ──(header + digest + padding)──► Header(info) ──data_len == 0──► Header
//!                                                 │ data_len > 0
//!                                                 ▼
//!                                   Data(chunk) … Data(chunk) ──► DataEnd { digest_ok } ──► Header
//!                                                                  (consumes the 4 digest bytes
//!                                                                   if the PDU has one, else none)
//! ```
//!
//! A data chunk is a slice of the caller's buffer (no copy here), and the data
//! digest is computed over the chunks as they pass (§3.6.2.4: CRC32C). Bytes
//! the caller received elsewhere (straight into a command's buffer) are
//! accounted with [`Framer::data_placed`]. Nothing allocates.

use super::digest::{CRC32C_EMPTY, crc32c_append};
use super::pdu::{CH_LEN, Decoded, Decoder, DecoderConfig, FatalError, PduInfo};

/// Bytes of a data digest (CRC32C).
const DIGEST_LEN: usize = 4;

/// Where the framer is in the PDU being received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start of a PDU.
    Header,
    /// Inside a PDU's data.
    Data { remaining: usize, ddgst: bool, crc: u32 },
    /// The data is all in; its digest (if any) is next.
    End { ddgst: bool, crc: u32 },
}

/// What the next bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Not enough bytes: at least this many (from the read position) are needed.
    NeedMore(usize),
    /// A valid PDU header; its data (`info.layout.data_len` bytes, maybe 0) follows.
    Header(PduInfo),
    /// The next piece of the current PDU's data, in order.
    Data(&'a [u8]),
    /// The current PDU's data is complete: whether its data digest matched (true when
    /// the PDU carries none).
    DataEnd {
        /// The received digest equals the CRC32C of the data (or there is no digest).
        digest_ok: bool,
    },
}

/// Splits received bytes into PDUs; holds only where it is in the current one.
#[derive(Clone, Debug)]
pub struct Framer {
    /// Validates headers; update its configuration after ICReq/ICResp and Connect.
    pub decoder: Decoder,
    state: State,
}

impl Framer {
    /// A framer at the start of a connection.
    pub fn new(config: DecoderConfig) -> Framer {
        Framer { decoder: Decoder::new(config), state: State::Header }
    }

    /// Whether the next bytes start a PDU (nothing of one is half-received).
    #[inline]
    pub fn at_header(&self) -> bool {
        self.state == State::Header
    }

    /// Bytes of the current PDU's data still to come (`None` outside data).
    #[inline]
    pub fn data_remaining(&self) -> Option<usize> {
        match self.state {
            State::Data { remaining, .. } => Some(remaining),
            _ => None,
        }
    }

    /// Looks at `avail` (the received bytes from the read position on) and says what
    /// they are, with how many of them to consume. `Err` is a fatal error for the
    /// connection (the header is bad); the framer stays where it was.
    #[inline]
    pub fn next<'a>(&mut self, avail: &'a [u8]) -> Result<(usize, Frame<'a>), FatalError> {
        match self.state {
            // Not even a common header: what the decoder would say, without calling it (a
            // receive's bytes all framed end here).
            State::Header if avail.len() < CH_LEN => Ok((0, Frame::NeedMore(CH_LEN))),
            State::Header => self.header(avail),
            State::Data { remaining, ddgst, crc } => {
                let n = avail.len().min(remaining);
                if n == 0 {
                    return Ok((0, Frame::NeedMore(1)));
                }
                let chunk = &avail[..n];
                self.advance(remaining, ddgst, crc, chunk);
                Ok((n, Frame::Data(chunk)))
            }
            State::End { ddgst: false, .. } => {
                self.state = State::Header;
                Ok((0, Frame::DataEnd { digest_ok: true }))
            }
            State::End { ddgst: true, crc } => {
                let Some(d) = avail.first_chunk::<DIGEST_LEN>() else {
                    return Ok((0, Frame::NeedMore(DIGEST_LEN)));
                };
                self.state = State::Header;
                Ok((DIGEST_LEN, Frame::DataEnd { digest_ok: u32::from_le_bytes(*d) == crc }))
            }
        }
    }

    /// `data` (the next bytes of the current PDU's data, at most
    /// [`Framer::data_remaining`]) went straight to the caller's own buffer: count them
    /// and fold them into the digest. Whether that ended the data (a
    /// [`Frame::DataEnd`] is next).
    pub fn data_placed(&mut self, data: &[u8]) -> bool {
        if let State::Data { remaining, ddgst, crc } = self.state {
            self.advance(remaining, ddgst, crc, &data[..data.len().min(remaining)]);
        }
        matches!(self.state, State::End { .. })
    }

    fn header<'a>(&mut self, avail: &'a [u8]) -> Result<(usize, Frame<'a>), FatalError> {
        let info = match self.decoder.decode_header(avail)? {
            Decoded::NeedMore(n) => return Ok((0, Frame::NeedMore(n))),
            Decoded::Pdu(info) => info,
        };
        // Header, header digest and the padding up to PDO are consumed together.
        let skip = info.layout.data_offset.min(info.layout.plen);
        if avail.len() < skip {
            return Ok((0, Frame::NeedMore(skip)));
        }
        if info.layout.data_len > 0 {
            self.state = State::Data { remaining: info.layout.data_len, ddgst: info.layout.ddgst, crc: CRC32C_EMPTY };
        }
        Ok((skip, Frame::Header(info)))
    }

    #[inline]
    fn advance(&mut self, remaining: usize, ddgst: bool, crc: u32, chunk: &[u8]) {
        let crc = if ddgst { crc32c_append(crc, chunk) } else { crc };
        let remaining = remaining - chunk.len();
        self.state = if remaining > 0 { State::Data { remaining, ddgst, crc } } else { State::End { ddgst, crc } };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cid;
    use crate::Sqe;
    use crate::tcp::digest::crc32c;
    use crate::tcp::pdu::{DataHeader, Digests, EncoderConfig, Fes, Header, Role};

    /// Both digests on, 8 KiB in-capsule and data PDUs.
    fn config(digests: Digests) -> DecoderConfig {
        DecoderConfig {
            receiver: Role::Controller,
            digests,
            established: true,
            data_align: 4,
            max_in_capsule: 8192,
            max_data_pdu: 8192,
        }
    }

    /// An H2CData PDU carrying `data`, as the host encodes it.
    fn h2c(digests: Digests, data: &[u8]) -> Vec<u8> {
        h2c_aligned(digests, data, 4)
    }

    /// The same with the data at a multiple of `align` bytes (padding after the header).
    fn h2c_aligned(digests: Digests, data: &[u8], align: usize) -> Vec<u8> {
        let enc = EncoderConfig { digests, data_align: align };
        let mut out = Vec::new();
        let hdr = DataHeader {
            cccid: Cid(3),
            ttag: 1,
            datao: 0,
            datal: u32::try_from(data.len()).unwrap(),
            last: true,
            success: false,
        };
        let w = enc.h2c_data(&mut out, &hdr);
        out.extend_from_slice(data);
        if w.ddgst {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        out
    }

    /// A CapsuleCmd without data.
    fn cmd(digests: Digests) -> Vec<u8> {
        let enc = EncoderConfig { digests, data_align: 4 };
        let mut out = Vec::new();
        let mut sqe = Sqe::new(0x02);
        sqe.set_cid(Cid(9));
        enc.capsule_cmd(&mut out, &sqe, 0);
        out
    }

    /// What a receiver sees, PDU by PDU: (header type, data, digest ok).
    #[derive(Debug, Default, PartialEq)]
    struct Seen {
        headers: Vec<usize>,
        data: Vec<u8>,
        ends: Vec<bool>,
    }

    /// Feeds `stream` to a framer `step` bytes at a time (the caller's buffer grows by
    /// `step` per receive), consuming as told.
    fn run(cfg: DecoderConfig, stream: &[u8], step: usize) -> Result<Seen, FatalError> {
        let mut f = Framer::new(cfg);
        let mut seen = Seen::default();
        let (mut pos, mut have) = (0, 0);
        while have < stream.len() {
            have = (have + step).min(stream.len());
            loop {
                let (n, frame) = f.next(&stream[pos..have])?;
                pos += n;
                match frame {
                    Frame::NeedMore(want) => {
                        assert!(want > have - pos, "asks for more than it has");
                        break;
                    }
                    Frame::Header(info) => seen.headers.push(info.layout.plen),
                    Frame::Data(chunk) => seen.data.extend_from_slice(chunk),
                    Frame::DataEnd { digest_ok } => seen.ends.push(digest_ok),
                }
            }
        }
        assert_eq!(pos, stream.len(), "consumed every byte");
        assert!(f.at_header(), "ends between PDUs");
        Ok(seen)
    }

    fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect()
    }

    #[test]
    fn splits_at_every_byte_give_the_same_pdus() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let data = payload(300);
            let mut stream = cmd(digests);
            stream.extend(h2c(digests, &data));
            stream.extend(cmd(digests));
            let whole = run(config(digests), &stream, stream.len()).unwrap();
            assert_eq!(whole.headers.len(), 3);
            assert_eq!(whole.data, data);
            assert_eq!(whole.ends, vec![true]);
            for step in 1..stream.len() {
                assert_eq!(run(config(digests), &stream, step).unwrap(), whole, "{digests:?}, {step} bytes at a time");
            }
        }
    }

    #[test]
    fn padding_up_to_pdo_is_consumed_with_the_header() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let cfg = DecoderConfig { data_align: 32, ..config(digests) };
            let data = payload(40);
            let stream = h2c_aligned(digests, &data, 32);
            let mut f = Framer::new(cfg);
            // Header (and digest) complete, padding not yet: nothing is consumed.
            assert_eq!(f.next(&stream[..31]).unwrap(), (0, Frame::NeedMore(32)), "{digests:?}");
            assert!(matches!(f.next(&stream[..32]).unwrap(), (32, Frame::Header(_))), "{digests:?}");
            for step in 1..stream.len() {
                let seen = run(cfg, &stream, step).unwrap();
                assert_eq!((seen.data.as_slice(), seen.ends.as_slice()), (&data[..], &[true][..]), "{step}");
            }
        }
    }

    #[test]
    fn a_bad_data_digest_is_reported_once_at_the_end() {
        let digests = Digests { header: true, data: true };
        let data = payload(64);
        let mut stream = h2c(digests, &data);
        let last = stream.len() - 1;
        stream[last] ^= 0x01;
        stream.extend(cmd(digests));
        for step in [1, 5, stream.len()] {
            let seen = run(config(digests), &stream, step).unwrap();
            assert_eq!(seen.data, data, "the data is handed over as received");
            assert_eq!(seen.ends, vec![false], "{step}: one DataEnd, digest bad");
            assert_eq!(seen.headers.len(), 2, "the next PDU is still framed");
        }
    }

    #[test]
    fn a_corrupt_data_byte_fails_the_digest() {
        let digests = Digests { header: false, data: true };
        let mut stream = h2c(digests, &payload(64));
        let data_start = stream.len() - 4 - 64;
        stream[data_start + 10] ^= 0x80;
        assert_eq!(run(config(digests), &stream, 7).unwrap().ends, vec![false]);
    }

    #[test]
    fn a_bad_header_digest_is_fatal() {
        let digests = Digests { header: true, data: false };
        let mut stream = cmd(digests);
        stream[10] ^= 0x01;
        let e = run(config(digests), &stream, 3).unwrap_err();
        assert_eq!(e.fes, Fes::HeaderDigestError);
    }

    #[test]
    fn oversize_lengths_are_refused_before_any_data() {
        let digests = Digests::default();
        let data = payload(8193);
        let stream = h2c(digests, &data);
        let mut f = Framer::new(config(digests));
        // The common header alone (8 bytes) already says the PDU is too long.
        let e = f.next(&stream[..8]).unwrap_err();
        assert_eq!(e.fes, Fes::DataLimitExceeded);
        assert!(f.at_header(), "the framer did not move");
        // A PLEN below the header length.
        let mut short = cmd(digests);
        short[4..8].copy_from_slice(&8u32.to_le_bytes());
        assert_eq!(Framer::new(config(digests)).next(&short).unwrap_err().fes, Fes::InvalidHeaderField);
    }

    #[test]
    fn data_placed_elsewhere_counts_toward_the_digest() {
        let digests = Digests { header: false, data: true };
        let data = payload(100);
        let stream = h2c(digests, &data);
        let hdr_len = stream.len() - 100 - 4;
        let mut f = Framer::new(config(digests));
        let (n, frame) = f.next(&stream).unwrap();
        assert_eq!(n, hdr_len);
        assert!(matches!(frame, Frame::Header(i) if matches!(i.header, Header::H2CData(_))));
        // 40 bytes through the buffer, 60 straight into the caller's memory.
        let (n, frame) = f.next(&stream[hdr_len..hdr_len + 40]).unwrap();
        assert_eq!((n, frame), (40, Frame::Data(&data[..40])));
        assert_eq!(f.data_remaining(), Some(60));
        assert!(!f.data_placed(&data[40..70]));
        assert!(f.data_placed(&data[70..]));
        assert_eq!(f.data_remaining(), None);
        assert_eq!(f.next(&stream[hdr_len + 100..hdr_len + 102]).unwrap(), (0, Frame::NeedMore(4)));
        assert_eq!(f.next(&stream[hdr_len + 100..]).unwrap(), (4, Frame::DataEnd { digest_ok: true }));
        assert!(f.at_header());
    }

    #[test]
    fn without_a_data_digest_the_end_consumes_nothing() {
        let digests = Digests::default();
        let stream = h2c(digests, &payload(10));
        let mut f = Framer::new(config(digests));
        let (n, _) = f.next(&stream).unwrap();
        let (m, frame) = f.next(&stream[n..]).unwrap();
        assert_eq!(frame, Frame::Data(&stream[n..]));
        assert_eq!(f.next(&[]).unwrap(), (0, Frame::DataEnd { digest_ok: true }));
        assert_eq!(n + m, stream.len());
        assert_eq!(f.next(&[]).unwrap(), (0, Frame::NeedMore(8)));
    }
}
