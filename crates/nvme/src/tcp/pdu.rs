//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, §3.6).
//!
//! ```text
//!  0      1      2      3      4                8          hlen   hlen+4   pdo          pdo+datal
//!  +------+------+------+------+----------------+---- ... --+------+---- ...+---- ... ----+------+
//!  | type |flags | hlen | pdo  |      plen      | PDU header | HDGST| pad   |    DATA      |DDGST |
//!  +------+------+------+------+----------------+---- ... --+------+---- ...+---- ... ----+------+
//! ```
//!
//! Encoding appends to a caller-owned `Vec<u8>` (no allocation once it has
//! capacity). Decoding is split in two stages so a receiver can place data
//! where it belongs without an intermediate copy:
//! [`Decoder::decode_header`] validates the common header, the PDU-specific
//! header and the header digest, and says where the data is and how long it
//! is; the receiver then consumes the data (and checks the data digest with
//! [`crate::tcp::crc32c`]) itself. Every field read from the wire is checked
//! against its limit before it is used, and a violation is returned as the
//! fatal error the spec says to report in a TermReq (§3.6.2.11, Figure 27).

use crate::cqe::{CQE_SIZE, Cqe};
use crate::ids::Cid;
use crate::sqe::{SQE_SIZE, Sqe};
use crate::tcp::digest::crc32c;
use crate::wire::{get_u8, get_u16, get_u32, len_u8, len_u32, put_u16, put_u32};

/// Common header length.
pub const CH_LEN: usize = 8;
/// Digest length.
pub const DIGEST_LEN: usize = 4;
/// ICReq / ICResp length (header only, no data).
pub const IC_LEN: usize = 128;
/// CapsuleCmd header length (common header + SQE).
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + SQE_SIZE;
/// CapsuleResp header length (common header + CQE).
pub const CAPSULE_RESP_HLEN: usize = CH_LEN + CQE_SIZE;
/// H2CData, C2HData and R2T header length.
pub const DATA_HLEN: usize = 24;
/// H2CTermReq / C2HTermReq header length.
pub const TERM_HLEN: usize = 24;
/// Most bytes of the offending PDU a TermReq carries.
pub const TERM_MAX_DATA: usize = 128;
/// Smallest MAXH2CDATA a controller may report (NVMe/TCP 1.0 §3.6.2.3).
pub const MIN_MAXH2CDATA: u32 = 4096;

/// PDU types (§3.6.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request.
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to Controller Terminate Connection Request.
    H2CTermReq = 0x02,
    /// Controller to Host Terminate Connection Request.
    C2HTermReq = 0x03,
    /// Command Capsule.
    CapsuleCmd = 0x04,
    /// Response Capsule.
    CapsuleResp = 0x05,
    /// Host to Controller Data.
    H2CData = 0x06,
    /// Controller to Host Data.
    C2HData = 0x07,
    /// Ready to Transfer.
    R2T = 0x09,
}

impl PduType {
    /// Decodes a type byte.
    pub fn from_u8(v: u8) -> Option<PduType> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed header length of this type.
    pub fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_LEN,
            PduType::H2CTermReq | PduType::C2HTermReq => TERM_HLEN,
            PduType::CapsuleCmd => CAPSULE_CMD_HLEN,
            PduType::CapsuleResp => CAPSULE_RESP_HLEN,
            PduType::H2CData | PduType::C2HData | PduType::R2T => DATA_HLEN,
        }
    }

    /// Whether this type carries a header digest when header digests are on.
    pub fn has_hdgst(self) -> bool {
        !matches!(self, PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq)
    }

    /// Whether this type may carry data covered by a data digest.
    pub fn may_have_ddgst(self) -> bool {
        matches!(self, PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData)
    }

    /// Who sends this PDU.
    pub fn sender(self) -> Role {
        match self {
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData => Role::Host,
            _ => Role::Controller,
        }
    }
}

/// PDU header flags (§3.6.2.2).
pub mod flags {
    /// Header digest present.
    pub const HDGSTF: u8 = 1 << 0;
    /// Data digest present.
    pub const DDGSTF: u8 = 1 << 1;
    /// Last data PDU of a transfer (H2CData, C2HData).
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command completed successfully; no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Which end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The host (initiator).
    Host,
    /// The controller (target).
    Controller,
}

/// Fatal error status values of a TermReq (§3.6.2.11, Figure 27).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Fes {
    /// Invalid PDU Header Field (FEI = byte offset of the field).
    InvalidHeaderField = 0x01,
    /// PDU Sequence Error.
    PduSequenceError = 0x02,
    /// Header Digest Error.
    HeaderDigestError = 0x03,
    /// Data Transfer Out of Range.
    DataOutOfRange = 0x04,
    /// Data Transfer Limit Exceeded (R2T limit, or data beyond MAXH2CDATA).
    DataLimitExceeded = 0x05,
    /// Unsupported Parameter (FEI = byte offset of the parameter).
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// Decodes a FES value.
    pub fn from_u16(v: u16) -> Option<Fes> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::DataLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A fatal transport error: the connection must be terminated with a TermReq
/// carrying this status, then closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fatal NVMe/TCP error {fes:?} (fei {fei})")]
pub struct FatalError {
    /// Fatal error status.
    pub fes: Fes,
    /// Fatal error information (a byte offset for header field errors).
    pub fei: u32,
}

impl FatalError {
    /// An invalid header field at byte `offset`.
    pub fn field(offset: u32) -> FatalError {
        FatalError { fes: Fes::InvalidHeaderField, fei: offset }
    }
    /// A PDU that is not allowed in the connection's state.
    pub fn sequence() -> FatalError {
        FatalError { fes: Fes::PduSequenceError, fei: 0 }
    }
}

/// Byte offsets of common header fields, for FEI.
pub mod ch_offset {
    /// PDU-type.
    pub const TYPE: u32 = 0;
    /// FLAGS.
    pub const FLAGS: u32 = 1;
    /// HLEN.
    pub const HLEN: u32 = 2;
    /// PDO.
    pub const PDO: u32 = 3;
    /// PLEN.
    pub const PLEN: u32 = 4;
}

/// The 8-byte common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    /// Raw PDU type byte.
    pub pdu_type: u8,
    /// Flags.
    pub flags: u8,
    /// Header length.
    pub hlen: u8,
    /// PDU data offset.
    pub pdo: u8,
    /// Total PDU length.
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the common header from the first 8 bytes, if present.
    pub fn peek(b: &[u8]) -> Option<CommonHeader> {
        if b.len() < CH_LEN {
            return None;
        }
        Some(CommonHeader { pdu_type: b[0], flags: b[1], hlen: b[2], pdo: b[3], plen: get_u32(b, 4) })
    }

    fn write(&self, b: &mut [u8]) {
        b[0] = self.pdu_type;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        put_u32(b, 4, self.plen);
    }
}

/// Digests negotiated for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Digests {
    /// Header digest.
    pub header: bool,
    /// Data digest.
    pub data: bool,
}

impl Digests {
    /// From the ICReq/ICResp DGST byte.
    pub fn from_bits(v: u8) -> Digests {
        Digests { header: v & 1 != 0, data: v & 2 != 0 }
    }
    /// To the ICReq/ICResp DGST byte.
    pub fn bits(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }
}

/// Initialize Connection Request (§3.6.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0 = 1.0).
    pub pfv: u16,
    /// Host PDU data alignment: C2H data starts at a multiple of (hpda+1) dwords.
    pub hpda: u8,
    /// Requested digests.
    pub digests: Digests,
    /// Maximum outstanding R2Ts per command the host supports, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response (§3.6.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version.
    pub pfv: u16,
    /// Controller PDU data alignment for H2C data, in dwords, 0's based.
    pub cpda: u8,
    /// Enabled digests.
    pub digests: Digests,
    /// Maximum data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
}

impl IcReq {
    /// Encodes the 128-byte PDU.
    pub fn encode(&self) -> [u8; IC_LEN] {
        let mut b = [0u8; IC_LEN];
        CommonHeader { pdu_type: PduType::IcReq as u8, flags: 0, hlen: len_u8(IC_LEN), pdo: 0, plen: len_u32(IC_LEN) }
            .write(&mut b);
        put_u16(&mut b, 8, self.pfv);
        b[10] = self.hpda;
        b[11] = self.digests.bits();
        put_u32(&mut b, 12, self.maxr2t);
        b
    }

    fn decode(b: &[u8]) -> IcReq {
        IcReq {
            pfv: get_u16(b, 8),
            hpda: get_u8(b, 10),
            digests: Digests::from_bits(get_u8(b, 11)),
            maxr2t: get_u32(b, 12),
        }
    }
}

impl IcResp {
    /// Encodes the 128-byte PDU.
    pub fn encode(&self) -> [u8; IC_LEN] {
        let mut b = [0u8; IC_LEN];
        CommonHeader { pdu_type: PduType::IcResp as u8, flags: 0, hlen: len_u8(IC_LEN), pdo: 0, plen: len_u32(IC_LEN) }
            .write(&mut b);
        put_u16(&mut b, 8, self.pfv);
        b[10] = self.cpda;
        b[11] = self.digests.bits();
        put_u32(&mut b, 12, self.maxh2cdata);
        b
    }

    fn decode(b: &[u8]) -> IcResp {
        IcResp {
            pfv: get_u16(b, 8),
            cpda: get_u8(b, 10),
            digests: Digests::from_bits(get_u8(b, 11)),
            maxh2cdata: get_u32(b, 12),
        }
    }
}

/// The header of H2CData and C2HData PDUs (§3.6.2.7, §3.6.2.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// Command capsule CID.
    pub cccid: Cid,
    /// Transfer tag from the R2T (H2CData only; reserved in C2HData).
    pub ttag: u16,
    /// Offset of this PDU's data within the command's data.
    pub datao: u32,
    /// Data length of this PDU.
    pub datal: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (C2HData only).
    pub success: bool,
}

/// Ready to Transfer (§3.6.2.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    /// Command capsule CID.
    pub cccid: Cid,
    /// Transfer tag the host echoes in H2CData.
    pub ttag: u16,
    /// Offset of the requested data.
    pub r2to: u32,
    /// Length of the requested data.
    pub r2tl: u32,
}

/// A TermReq's fixed part (§3.6.2.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal error status (raw; see [`Fes`]).
    pub fes: u16,
    /// Fatal error information.
    pub fei: u32,
}

/// A decoded PDU header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq (data: the offending PDU header).
    H2CTermReq(TermReq),
    /// C2HTermReq (data: the offending PDU header).
    C2HTermReq(TermReq),
    /// Command capsule (data: in-capsule data, if any).
    CapsuleCmd(Sqe),
    /// Response capsule.
    CapsuleResp(Cqe),
    /// H2CData.
    H2CData(DataHeader),
    /// C2HData.
    C2HData(DataHeader),
    /// R2T.
    R2T(R2t),
}

/// Where a PDU's parts are, relative to its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PduLayout {
    /// Bytes of header, header digest and padding: data starts here.
    pub data_offset: usize,
    /// Data bytes (0 if none).
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub ddgst: bool,
    /// Total PDU length (PLEN).
    pub plen: usize,
}

/// A PDU whose header has been fully received and validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PduInfo {
    /// The decoded header.
    pub header: Header,
    /// Layout of the PDU.
    pub layout: PduLayout,
}

/// Outcome of looking at the start of a receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The header is not complete: at least this many bytes (from the PDU's
    /// start) are needed before trying again.
    NeedMore(usize),
    /// A complete, valid header.
    Pdu(PduInfo),
}

/// Limits and negotiated options a receiver checks PDUs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderConfig {
    /// The side that receives (it accepts the other side's PDU types).
    pub receiver: Role,
    /// Negotiated digests (ignored until [`DecoderConfig::established`]).
    pub digests: Digests,
    /// Whether ICReq/ICResp has been exchanged.
    pub established: bool,
    /// Data alignment in bytes the receiver asked for (cpda+1)*4 on a
    /// controller, (hpda+1)*4 on a host. A PDO that is not a multiple of it
    /// is an invalid header field.
    pub data_align: usize,
    /// Most in-capsule data bytes accepted in a CapsuleCmd.
    pub max_in_capsule: usize,
    /// Most data bytes accepted in one H2CData or C2HData PDU.
    pub max_data_pdu: usize,
}

impl DecoderConfig {
    /// A fresh connection's receiver: only the IC PDU is acceptable.
    pub fn initial(receiver: Role) -> DecoderConfig {
        DecoderConfig {
            receiver,
            digests: Digests::default(),
            established: false,
            data_align: 4,
            max_in_capsule: 0,
            max_data_pdu: 0,
        }
    }
}

/// Validates and decodes PDU headers.
#[derive(Clone, Copy, Debug)]
pub struct Decoder {
    /// Current limits; update after negotiation.
    pub config: DecoderConfig,
}

impl Decoder {
    /// A decoder with this configuration.
    pub fn new(config: DecoderConfig) -> Decoder {
        Decoder { config }
    }

    /// Looks at the PDU that starts at `buf[0]`.
    ///
    /// Returns [`Decoded::NeedMore`] until the header and its digest are
    /// present; then validates everything a header can get wrong and returns
    /// the header with the layout of the data that follows. The data itself
    /// (and its digest) may not be in `buf` yet.
    pub fn decode_header(&self, buf: &[u8]) -> Result<Decoded, FatalError> {
        match self.response_capsule(buf) {
            Some(info) => Ok(Decoded::Pdu(info)),
            None => self.decode_any_header(buf),
        }
    }

    /// The PDU a host receives most, a response capsule on an established connection
    /// without header digests, in a few compares: exactly what
    /// [`Decoder::decode_any_header`] makes of it (any other header, or a bad one, is
    /// `None`, and goes there).
    #[inline]
    fn response_capsule(&self, buf: &[u8]) -> Option<PduInfo> {
        let c = &self.config;
        let h = buf.first_chunk::<CAPSULE_RESP_HLEN>()?;
        let plain = c.receiver == Role::Host && c.established && !c.digests.header;
        let resp = h[0] == PduType::CapsuleResp as u8 && usize::from(h[2]) == CAPSULE_RESP_HLEN;
        if !(plain && resp && h[1] & flags::HDGSTF == 0 && get_u32(h, 4) as usize == CAPSULE_RESP_HLEN) {
            return None;
        }
        let layout = PduLayout { data_offset: CAPSULE_RESP_HLEN, data_len: 0, ddgst: false, plen: CAPSULE_RESP_HLEN };
        Some(PduInfo { header: Header::CapsuleResp(Cqe::decode(&h[CH_LEN..])), layout })
    }

    /// [`Decoder::decode_header`] of any PDU.
    fn decode_any_header(&self, buf: &[u8]) -> Result<Decoded, FatalError> {
        let Some(ch) = CommonHeader::peek(buf) else {
            return Ok(Decoded::NeedMore(CH_LEN));
        };
        let c = &self.config;
        let ty = PduType::from_u8(ch.pdu_type).ok_or(FatalError::field(ch_offset::TYPE))?;
        if ty.sender() == c.receiver {
            // A PDU only the receiver itself may send.
            return Err(FatalError::field(ch_offset::TYPE));
        }
        let is_ic = matches!(ty, PduType::IcReq | PduType::IcResp);
        let is_term = matches!(ty, PduType::H2CTermReq | PduType::C2HTermReq);
        if !is_term && is_ic == c.established {
            // IC before anything else, and exactly once (§3.6.1). A TermReq may
            // end the connection at any point, even before IC completes.
            return Err(FatalError::sequence());
        }
        let hlen = ty.hlen();
        if usize::from(ch.hlen) != hlen {
            return Err(FatalError::field(ch_offset::HLEN));
        }
        let plen = ch.plen as usize;
        let hdgst = c.established && c.digests.header && ty.has_hdgst();
        let hdr_total = hlen + if hdgst { DIGEST_LEN } else { 0 };
        if plen < hdr_total {
            return Err(FatalError::field(ch_offset::PLEN));
        }
        // Flags: digest flags must match what was negotiated (Linux nvmet and
        // SPDK reject a cleared flag); other bits are type-specific.
        if ty.has_hdgst() && c.established && ((ch.flags & flags::HDGSTF != 0) != hdgst) {
            return Err(FatalError::field(ch_offset::FLAGS));
        }
        let layout = data_layout(c, ty, &ch, plen, hdr_total)?;
        if buf.len() < hdr_total {
            return Ok(Decoded::NeedMore(hdr_total));
        }
        if hdgst {
            let want = crc32c(&buf[..hlen]);
            if get_u32(buf, hlen) != want {
                return Err(FatalError { fes: Fes::HeaderDigestError, fei: 0 });
            }
        }
        let header = header_fields(ty, &ch, &buf[..hlen], &layout)?;
        Ok(Decoded::Pdu(PduInfo { header, layout }))
    }
}

/// Where a PDU's data starts and how long it is, from its common header, checked against
/// the negotiated limits (NVMe/TCP 1.0 §3.6.2: each type's PLEN, PDO and digest rules).
fn data_layout(
    c: &DecoderConfig,
    ty: PduType,
    ch: &CommonHeader,
    plen: usize,
    hdr_total: usize,
) -> Result<PduLayout, FatalError> {
    let has_data_region = plen > hdr_total;
    Ok(match ty {
        PduType::IcReq | PduType::IcResp => {
            if plen != IC_LEN {
                return Err(FatalError::field(ch_offset::PLEN));
            }
            PduLayout { data_offset: IC_LEN, data_len: 0, ddgst: false, plen }
        }
        PduType::H2CTermReq | PduType::C2HTermReq => {
            if plen > TERM_HLEN + TERM_MAX_DATA + 24 {
                return Err(FatalError::field(ch_offset::PLEN));
            }
            PduLayout { data_offset: TERM_HLEN, data_len: plen - TERM_HLEN, ddgst: false, plen }
        }
        PduType::CapsuleResp | PduType::R2T => {
            if plen != hdr_total {
                return Err(FatalError::field(ch_offset::PLEN));
            }
            PduLayout { data_offset: hdr_total, data_len: 0, ddgst: false, plen }
        }
        PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData => {
            if !has_data_region {
                if matches!(ty, PduType::H2CData | PduType::C2HData) {
                    // A data PDU without data.
                    return Err(FatalError::field(ch_offset::PLEN));
                }
                PduLayout { data_offset: hdr_total, data_len: 0, ddgst: false, plen }
            } else {
                let ddgst = c.digests.data;
                if (ch.flags & flags::DDGSTF != 0) != ddgst {
                    return Err(FatalError::field(ch_offset::FLAGS));
                }
                let pdo = usize::from(ch.pdo);
                if pdo < hdr_total || pdo % c.data_align.max(4) != 0 {
                    return Err(FatalError::field(ch_offset::PDO));
                }
                let tail = pdo + if ddgst { DIGEST_LEN } else { 0 };
                if plen <= tail {
                    return Err(FatalError::field(ch_offset::PLEN));
                }
                let data_len = plen - tail;
                let limit = if ty == PduType::CapsuleCmd { c.max_in_capsule } else { c.max_data_pdu };
                if data_len > limit {
                    return Err(if ty == PduType::H2CData {
                        FatalError { fes: Fes::DataLimitExceeded, fei: 0 }
                    } else {
                        FatalError::field(ch_offset::PLEN)
                    });
                }
                PduLayout { data_offset: pdo, data_len, ddgst, plen }
            }
        }
    })
}

/// The type-specific header fields of a complete header `h`, checked.
fn header_fields(ty: PduType, ch: &CommonHeader, h: &[u8], layout: &PduLayout) -> Result<Header, FatalError> {
    Ok(match ty {
        PduType::IcReq => {
            let r = IcReq::decode(h);
            if r.pfv != 0 {
                return Err(FatalError { fes: Fes::UnsupportedParameter, fei: 8 });
            }
            if r.hpda > 31 {
                return Err(FatalError { fes: Fes::UnsupportedParameter, fei: 10 });
            }
            Header::IcReq(r)
        }
        PduType::IcResp => {
            let r = IcResp::decode(h);
            if r.pfv != 0 {
                return Err(FatalError { fes: Fes::UnsupportedParameter, fei: 8 });
            }
            if r.cpda > 31 {
                return Err(FatalError { fes: Fes::UnsupportedParameter, fei: 10 });
            }
            if r.maxh2cdata < MIN_MAXH2CDATA || !r.maxh2cdata.is_multiple_of(4) {
                return Err(FatalError { fes: Fes::UnsupportedParameter, fei: 12 });
            }
            Header::IcResp(r)
        }
        PduType::H2CTermReq => Header::H2CTermReq(TermReq { fes: get_u16(h, 8), fei: get_u32(h, 10) }),
        PduType::C2HTermReq => Header::C2HTermReq(TermReq { fes: get_u16(h, 8), fei: get_u32(h, 10) }),
        PduType::CapsuleCmd => Header::CapsuleCmd(Sqe::from_bytes(&h[CH_LEN..])),
        PduType::CapsuleResp => Header::CapsuleResp(Cqe::decode(&h[CH_LEN..])),
        PduType::H2CData | PduType::C2HData => {
            let d = DataHeader {
                cccid: Cid(get_u16(h, 8)),
                ttag: get_u16(h, 10),
                datao: get_u32(h, 12),
                datal: get_u32(h, 16),
                last: ch.flags & flags::LAST_PDU != 0,
                success: ch.flags & flags::SUCCESS != 0,
            };
            if d.datal as usize != layout.data_len {
                return Err(FatalError::field(16));
            }
            if ty == PduType::H2CData {
                if d.success {
                    return Err(FatalError::field(ch_offset::FLAGS));
                }
                Header::H2CData(d)
            } else {
                if d.success && !d.last {
                    // SUCCESS is only valid with LAST_PDU (§3.6.2.8).
                    return Err(FatalError::field(ch_offset::FLAGS));
                }
                Header::C2HData(d)
            }
        }
        PduType::R2T => {
            let r = R2t { cccid: Cid(get_u16(h, 8)), ttag: get_u16(h, 10), r2to: get_u32(h, 12), r2tl: get_u32(h, 16) };
            if r.r2tl == 0 {
                return Err(FatalError::field(16));
            }
            Header::R2T(r)
        }
    })
}

/// Encoding options of the sending side of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EncoderConfig {
    /// Negotiated digests.
    pub digests: Digests,
    /// Alignment the peer asked for the data of PDUs we send, in bytes ((hpda+1)*4
    /// for a controller sending C2H data, (cpda+1)*4 for a host sending H2C data).
    pub data_align: usize,
}

/// What [`EncoderConfig`] wrote: where the caller appends data and the data digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Bytes of header (+digest +padding) appended.
    pub header_len: usize,
    /// Whether the caller must append a data digest after the data.
    pub ddgst: bool,
}

impl EncoderConfig {
    fn layout(&self, ty: PduType, data_len: usize) -> (u8, usize, usize, bool, u8) {
        let hlen = ty.hlen();
        let hdgst = self.digests.header && ty.has_hdgst();
        let hdr_total = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let ddgst = self.digests.data && data_len > 0 && ty.may_have_ddgst();
        let (pdo, plen) = if data_len > 0 {
            let a = self.data_align.max(4);
            let pdo = hdr_total.div_ceil(a) * a;
            (pdo, pdo + data_len + if ddgst { DIGEST_LEN } else { 0 })
        } else {
            (0, hdr_total)
        };
        let mut fl = 0;
        if hdgst {
            fl |= flags::HDGSTF;
        }
        if ddgst {
            fl |= flags::DDGSTF;
        }
        (u8::try_from(pdo).unwrap_or(u8::MAX), plen, hdr_total, ddgst, fl)
    }

    /// Appends a PDU header with `extra_flags`, `data_len` bytes of data to
    /// follow, and the type-specific bytes written by `fill` into
    /// `hdr[8..hlen]`. Computes the header digest and padding.
    fn put(
        &self,
        out: &mut Vec<u8>,
        ty: PduType,
        extra_flags: u8,
        data_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Written {
        let hlen = ty.hlen();
        let (pdo, plen, hdr_total, ddgst, fl) = self.layout(ty, data_len);
        let start = out.len();
        let header_len = if data_len > 0 { usize::from(pdo) } else { hdr_total };
        out.resize(start + header_len, 0);
        let h = &mut out[start..start + header_len];
        CommonHeader {
            pdu_type: ty as u8,
            flags: fl | extra_flags,
            hlen: len_u8(hlen),
            pdo,
            plen: u32::try_from(plen).unwrap_or(u32::MAX),
        }
        .write(h);
        fill(&mut h[CH_LEN..hlen]);
        if hdr_total > hlen {
            let d = crc32c(&h[..hlen]);
            put_u32(h, hlen, d);
        }
        Written { header_len, ddgst }
    }

    /// Appends a command capsule header with `in_capsule_len` bytes of data to follow.
    pub fn capsule_cmd(&self, out: &mut Vec<u8>, sqe: &Sqe, in_capsule_len: usize) -> Written {
        self.put(out, PduType::CapsuleCmd, 0, in_capsule_len, |h| h[..SQE_SIZE].copy_from_slice(&sqe.0))
    }

    /// Appends a response capsule.
    pub fn capsule_resp(&self, out: &mut Vec<u8>, cqe: &Cqe) -> Written {
        self.put(out, PduType::CapsuleResp, 0, 0, |h| cqe.encode(&mut h[..CQE_SIZE]))
    }

    /// Appends a C2HData header for `d.datal` bytes of data.
    pub fn c2h_data(&self, out: &mut Vec<u8>, d: &DataHeader) -> Written {
        let mut fl = 0;
        if d.last {
            fl |= flags::LAST_PDU;
        }
        if d.success {
            fl |= flags::SUCCESS;
        }
        self.put(out, PduType::C2HData, fl, d.datal as usize, |h| write_data_fields(h, d))
    }

    /// Appends an H2CData header for `d.datal` bytes of data.
    pub fn h2c_data(&self, out: &mut Vec<u8>, d: &DataHeader) -> Written {
        let fl = if d.last { flags::LAST_PDU } else { 0 };
        self.put(out, PduType::H2CData, fl, d.datal as usize, |h| write_data_fields(h, d))
    }

    /// Appends an R2T.
    pub fn r2t(&self, out: &mut Vec<u8>, r: &R2t) -> Written {
        self.put(out, PduType::R2T, 0, 0, |h| {
            put_u16(h, 0, r.cccid.0);
            put_u16(h, 2, r.ttag);
            put_u32(h, 4, r.r2to);
            put_u32(h, 8, r.r2tl);
        })
    }

    /// Appends a complete TermReq from `sender` carrying up to 128 bytes of the offending PDU.
    pub fn term_req(out: &mut Vec<u8>, sender: Role, err: FatalError, offending: &[u8]) {
        let ty = if sender == Role::Host { PduType::H2CTermReq } else { PduType::C2HTermReq };
        let data = &offending[..offending.len().min(TERM_MAX_DATA)];
        let start = out.len();
        out.resize(start + TERM_HLEN, 0);
        let h = &mut out[start..];
        CommonHeader {
            pdu_type: ty as u8,
            flags: 0,
            hlen: len_u8(TERM_HLEN),
            pdo: 0,
            plen: len_u32(TERM_HLEN + data.len()),
        }
        .write(h);
        put_u16(h, 8, err.fes as u16);
        put_u32(h, 10, err.fei);
        out.extend_from_slice(data);
    }
}

fn write_data_fields(h: &mut [u8], d: &DataHeader) {
    put_u16(h, 0, d.cccid.0);
    put_u16(h, 2, d.ttag);
    put_u32(h, 4, d.datao);
    put_u32(h, 8, d.datal);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Nsid;
    use crate::opcode::io;
    use crate::sgl::SglDescriptor;

    fn target_decoder(digests: Digests) -> Decoder {
        Decoder::new(DecoderConfig {
            receiver: Role::Controller,
            digests,
            established: true,
            data_align: 4,
            max_in_capsule: 8192,
            max_data_pdu: 128 * 1024,
        })
    }

    fn host_decoder(digests: Digests) -> Decoder {
        Decoder::new(DecoderConfig { receiver: Role::Host, ..target_decoder(digests).config })
    }

    #[test]
    fn a_response_capsule_decodes_the_same_through_the_short_path_and_the_full_one() {
        let mut cqe = [0u8; 24];
        cqe[..8].copy_from_slice(&[PduType::CapsuleResp as u8, 0, 24, 0, 24, 0, 0, 0]);
        for (b, v) in cqe[8..].iter_mut().zip(0x11u8..) {
            *b = v;
        }
        let mut taken = 0;
        for header in [false, true] {
            for d in [host_decoder(Digests { header, data: false }), target_decoder(Digests { header, data: true })] {
                // Every flag, PDO and a few lengths; the types next to it; a short buffer.
                for (at, values) in [(1, 0..=255u8), (3, 0..=255), (2, 0..=40), (4, 0..=40), (0, 0..=9)] {
                    for v in values {
                        let mut b = cqe;
                        b[at] = v;
                        let fast = d.response_capsule(&b);
                        taken += usize::from(fast.is_some());
                        if let Some(info) = fast {
                            assert_eq!(Ok(Decoded::Pdu(info)), d.decode_any_header(&b), "byte {at} = {v}");
                        }
                        assert_eq!(d.decode_header(&b), d.decode_any_header(&b), "byte {at} = {v}");
                        assert_eq!(d.decode_header(&b[..23]), d.decode_any_header(&b[..23]));
                    }
                }
            }
        }
        assert!(taken > 256, "the short path serves a host's plain responses ({taken})");
    }

    #[test]
    fn icreq_round_trip() {
        let r = IcReq { pfv: 0, hpda: 0, digests: Digests { header: true, data: false }, maxr2t: 0 };
        let b = r.encode();
        let d = Decoder::new(DecoderConfig::initial(Role::Controller));
        assert_eq!(d.decode_header(&b[..7]).unwrap(), Decoded::NeedMore(8));
        match d.decode_header(&b).unwrap() {
            Decoded::Pdu(PduInfo { header: Header::IcReq(x), layout }) => {
                assert_eq!(x, r);
                assert_eq!(layout.plen, 128);
            }
            other => panic!("unexpected {other:?}"),
        }
        // A second ICReq on an established connection is a sequence error.
        assert_eq!(target_decoder(Digests::default()).decode_header(&b), Err(FatalError::sequence()));
    }

    #[test]
    fn capsule_with_data_and_digests() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let enc = EncoderConfig { digests, data_align: 4 };
            let sqe = Sqe::rw(io::WRITE, Cid(5), Nsid(1), 0, 1, SglDescriptor::in_capsule(4096));
            let mut out = Vec::new();
            let w = enc.capsule_cmd(&mut out, &sqe, 4096);
            let data = vec![0xa5u8; 4096];
            out.extend_from_slice(&data);
            if w.ddgst {
                out.extend_from_slice(&crate::tcp::digest::digest_bytes(&data));
            }
            let dec = target_decoder(digests);
            let Decoded::Pdu(info) = dec.decode_header(&out).unwrap() else { panic!("need more") };
            assert_eq!(info.header, Header::CapsuleCmd(sqe));
            assert_eq!(info.layout.data_offset, w.header_len);
            assert_eq!(info.layout.data_len, 4096);
            assert_eq!(info.layout.plen, out.len());
            assert_eq!(info.layout.ddgst, digests.data);
        }
    }

    #[test]
    fn header_digest_error_is_fatal() {
        let enc = EncoderConfig { digests: Digests { header: true, data: false }, data_align: 4 };
        let mut out = Vec::new();
        enc.capsule_cmd(&mut out, &Sqe::flush(Cid(1), Nsid(1)), 0);
        out[20] ^= 1;
        let e = target_decoder(Digests { header: true, data: false }).decode_header(&out).unwrap_err();
        assert_eq!(e.fes, Fes::HeaderDigestError);
    }

    #[test]
    fn oversize_plen_rejected_before_data_arrives() {
        let enc = EncoderConfig { digests: Digests::default(), data_align: 4 };
        let mut out = Vec::new();
        enc.capsule_cmd(&mut out, &Sqe::flush(Cid(1), Nsid(1)), 1 << 20);
        let e = target_decoder(Digests::default()).decode_header(&out).unwrap_err();
        assert_eq!(e, FatalError::field(ch_offset::PLEN));
        let mut h2c = Vec::new();
        enc.h2c_data(
            &mut h2c,
            &DataHeader { cccid: Cid(1), ttag: 0, datao: 0, datal: 1 << 20, last: true, success: false },
        );
        let e = target_decoder(Digests::default()).decode_header(&h2c).unwrap_err();
        assert_eq!(e.fes, Fes::DataLimitExceeded);
        // A PLEN of 4 GiB on a response is caught without reading anything beyond the header.
        let mut resp = Vec::new();
        enc.capsule_resp(&mut resp, &Cqe::success(Cid(0)));
        resp[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(host_decoder(Digests::default()).decode_header(&resp), Err(FatalError::field(ch_offset::PLEN)));
    }

    #[test]
    fn wrong_direction_and_unknown_types() {
        let enc = EncoderConfig::default();
        let mut out = Vec::new();
        enc.capsule_resp(&mut out, &Cqe::success(Cid(0)));
        assert_eq!(target_decoder(Digests::default()).decode_header(&out), Err(FatalError::field(0)));
        out[0] = 0x08;
        assert_eq!(host_decoder(Digests::default()).decode_header(&out), Err(FatalError::field(0)));
    }

    #[test]
    fn c2h_success_needs_last() {
        let enc = EncoderConfig::default();
        let mut out = Vec::new();
        let d = DataHeader { cccid: Cid(3), ttag: 0, datao: 0, datal: 8, last: false, success: true };
        enc.c2h_data(&mut out, &d);
        out.extend_from_slice(&[0; 8]);
        assert_eq!(host_decoder(Digests::default()).decode_header(&out), Err(FatalError::field(1)));
    }

    #[test]
    fn term_req_layout() {
        let mut out = Vec::new();
        EncoderConfig::term_req(&mut out, Role::Controller, FatalError::field(4), &[0xee; 200]);
        assert_eq!(out.len(), 24 + 128);
        assert_eq!(out[0], 0x03);
        assert_eq!(get_u32(&out, 4), 152);
        assert_eq!(get_u16(&out, 8), 1);
        assert_eq!(get_u32(&out, 10), 4);
        let d = host_decoder(Digests::default()).decode_header(&out).unwrap();
        assert!(matches!(d, Decoded::Pdu(PduInfo { header: Header::C2HTermReq(TermReq { fes: 1, fei: 4 }), .. })));
    }

    #[test]
    fn alignment_pads_pdo() {
        let enc = EncoderConfig { digests: Digests::default(), data_align: 32 };
        let mut out = Vec::new();
        let w = enc
            .c2h_data(&mut out, &DataHeader { cccid: Cid(1), ttag: 0, datao: 0, datal: 4, last: true, success: false });
        assert_eq!(w.header_len, 32);
        assert_eq!(out[3], 32);
        let mut dec = host_decoder(Digests::default());
        out.extend_from_slice(&[1, 2, 3, 4]);
        dec.config.data_align = 32;
        assert!(matches!(dec.decode_header(&out), Ok(Decoded::Pdu(_))));
        out[3] = 28;
        out.truncate(out.len());
        assert_eq!(dec.decode_header(&out), Err(FatalError::field(ch_offset::PDO)));
    }
}
