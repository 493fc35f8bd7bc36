//! In-band authentication: DH-HMAC-CHAP (NVMe 2.x §8.3.4 "Authentication
//! Send/Receive", §8.13 "Fabrics Secure Channel and Authentication"; TP 8006),
//! carried in Fabrics Authentication Send / Receive commands.
//!
//! ```text
//!   host                                              controller
//!   Connect ─────────────────────────────────────────► CQE DW0 bit 17 (ATR): authenticate
//!   Auth Send    AUTH_Negotiate (hashes, DH groups) ──►
//!   Auth Receive ◄── DH-HMAC-CHAP_Challenge (hash, group, S1, C1, g^x)
//!   Auth Send    DH-HMAC-CHAP_Reply (R1, [C2, S2], g^y) ──►
//!   Auth Receive ◄── DH-HMAC-CHAP_Success1 ([R2])  or  _Failure1
//!   Auth Send    DH-HMAC-CHAP_Success2 (bidirectional only)  or  _Failure2 ──►
//! ```
//!
//! This module owns the bytes (message formats with bounded decoders that
//! never panic, the SQE fields, the identifier spaces) and, in its submodules,
//! the `DHHC-1` secrets ([`secret`]), the HMAC computations ([`dhchap`]) and
//! the FFDHE groups ([`ffdhe`]), shared by the target and the host so both
//! compute the same bytes. Layouts follow Linux `include/linux/nvme.h`
//! (`struct nvmf_auth_*`).

pub mod dhchap;
pub mod ffdhe;
pub mod secret;

pub use secret::{Secret, SecretError};

use crate::ids::Cid;
use crate::opcode::fctype;
use crate::sgl::SglDescriptor;
use crate::sqe::Sqe;
use crate::wire::{get_u8, get_u16, get_u32, len_u8, len_u16, put_u8, put_u16, put_u32};

/// SECP of DH-HMAC-CHAP ("NVMe-oF in-band authentication", NVMe 2.x §5.x Security Protocols).
pub const SECP_DHCHAP: u8 = 0xe9;
/// SPSP0 and SPSP1 of DH-HMAC-CHAP.
pub const SPSP_DHCHAP: u8 = 0x01;
/// The largest message either side sends or takes (Linux `CHAP_BUF_SIZE`; an
/// ffdhe8192 SHA-512 reply is 16 + 2·64 + 1024 = 1168 bytes).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// The largest hash (SHA-512).
pub const MAX_HASH_LEN: usize = 64;
/// Connect response DW0 bit 17: Authentication Transaction Required (ATR).
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response DW0 bit 18: Authentication and Secure Channel Required (ASCR).
pub const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;
/// AUTH_Negotiate protocol descriptor AUTHID of DH-HMAC-CHAP.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// Most hash or DH group ids a descriptor may list (its 60-byte list is split 30 / 30).
pub const MAX_IDS: usize = 30;

/// Secure channel concatenation (SC_C, AUTH_Negotiate byte 6; NVMe Base 2.1 §8.3.4.5.2,
/// Linux `NVME_AUTH_SECP_*`).
pub mod sc_c {
    /// No secure channel concatenation.
    pub const NOSC: u8 = 0x00;
    /// A secure channel is already in place (not concatenation; refused by Linux nvmet too).
    pub const SC: u8 = 0x01;
    /// Generate a new TLS PSK from this transaction (on a queue not inside TLS).
    pub const NEWTLSPSK: u8 = 0x02;
    /// Replace the TLS PSK the channel was set up with (on a queue inside TLS).
    pub const REPLACETLSPSK: u8 = 0x03;
}

/// Message families (AUTH_TYPE, byte 0).
pub mod auth_type {
    /// Common messages: AUTH_Negotiate and the failures.
    pub const COMMON: u8 = 0x00;
    /// DH-HMAC-CHAP messages.
    pub const DHCHAP: u8 = 0x01;
}

/// Message identifiers (AUTH_ID, byte 1).
pub mod msg_id {
    /// AUTH_Negotiate (common).
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (common; host to controller).
    pub const FAILURE2: u8 = 0xf0;
    /// AUTH_Failure1 (common; controller to host).
    pub const FAILURE1: u8 = 0xf1;
}

/// Failure reason code explanations (AUTH_Failure RCEXP; reason code 01h "authentication failure").
pub mod failure {
    /// Reason code: authentication failure (the only one defined).
    pub const REASON_FAILED: u8 = 0x01;
    /// Authentication failed.
    pub const FAILED: u8 = 0x01;
    /// Authentication protocol not usable.
    pub const NOT_USABLE: u8 = 0x02;
    /// Secure channel concatenation mismatch.
    pub const CONCAT_MISMATCH: u8 = 0x03;
    /// Hash function not usable.
    pub const HASH_UNUSABLE: u8 = 0x04;
    /// DH group not usable.
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    /// Incorrect payload.
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    /// Incorrect protocol message.
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// DH-HMAC-CHAP hash functions (NVMe 2.x Figure "DH-HMAC-CHAP Hash Function Identifiers").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashId {
    /// SHA-256 (01h).
    Sha256,
    /// SHA-384 (02h).
    Sha384,
    /// SHA-512 (03h).
    Sha512,
}

impl HashId {
    /// Every hash, in preference order of the host's AUTH_Negotiate (as Linux lists them).
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// From the wire identifier.
    pub fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }

    /// The wire identifier.
    pub fn id(self) -> u8 {
        match self {
            HashId::Sha256 => 1,
            HashId::Sha384 => 2,
            HashId::Sha512 => 3,
        }
    }

    /// Digest length in bytes.
    pub fn len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// Never true.
    pub fn is_empty(self) -> bool {
        false
    }

    /// The name Linux configfs uses (`dhchap_hash`: "hmac(sha256)").
    pub fn linux_name(self) -> &'static str {
        match self {
            HashId::Sha256 => "hmac(sha256)",
            HashId::Sha384 => "hmac(sha384)",
            HashId::Sha512 => "hmac(sha512)",
        }
    }

    /// Parses "sha256", "hmac(sha256)", "SHA-256" (and the others alike).
    pub fn parse(s: &str) -> Option<HashId> {
        let t = s.trim().to_ascii_lowercase().replace('-', "");
        let t = t.strip_prefix("hmac(").and_then(|x| x.strip_suffix(')')).unwrap_or(&t);
        match t {
            "sha256" => Some(HashId::Sha256),
            "sha384" => Some(HashId::Sha384),
            "sha512" => Some(HashId::Sha512),
            _ => None,
        }
    }
}

/// DH-HMAC-CHAP Diffie-Hellman groups (NVMe 2.x Figure "DH-HMAC-CHAP Diffie-Hellman Group Identifiers").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h).
    Null,
    /// ffdhe2048 (01h).
    Ffdhe2048,
    /// ffdhe3072 (02h).
    Ffdhe3072,
    /// ffdhe4096 (03h).
    Ffdhe4096,
    /// ffdhe6144 (04h).
    Ffdhe6144,
    /// ffdhe8192 (05h).
    Ffdhe8192,
}

impl DhGroup {
    /// Every group, in the order Linux offers them.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// From the wire identifier.
    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.get(usize::from(id)).copied()
    }

    /// The wire identifier.
    pub fn id(self) -> u8 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 1,
            DhGroup::Ffdhe3072 => 2,
            DhGroup::Ffdhe4096 => 3,
            DhGroup::Ffdhe6144 => 4,
            DhGroup::Ffdhe8192 => 5,
        }
    }

    /// Length of a public value (DHVLEN) in bytes: the prime's length; 0 for null.
    pub fn value_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }

    /// The name Linux uses ("null", "ffdhe2048", ...).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<DhGroup> {
        let t = s.trim().to_ascii_lowercase();
        DhGroup::ALL.into_iter().find(|g| g.name() == t)
    }
}

/// A local failure of the cryptography (not a protocol outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// The operating system's random source failed.
    #[error("no randomness from the operating system")]
    Rng,
    /// A peer's Diffie-Hellman public value is out of range or of the wrong length.
    #[error("invalid Diffie-Hellman public value")]
    PublicValue,
    /// A length outside what the algorithm takes.
    #[error("invalid length")]
    Length,
}

/// Fills `buf` from the operating system's random source.
pub fn fill_random(buf: &mut [u8]) -> Result<(), CryptoError> {
    getrandom::fill(buf).map_err(|_| CryptoError::Rng)
}

/// A random nonzero sequence number (Linux `nvme_auth_get_seqnum` never uses 0,
/// which in a reply means "no bidirectional authentication").
pub fn random_seqnum() -> Result<u32, CryptoError> {
    for _ in 0..8 {
        let mut b = [0u8; 4];
        fill_random(&mut b)?;
        let v = u32::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
    Err(CryptoError::Rng)
}

/// The fields of an Authentication Send / Receive SQE (NVMe 2.x §6.2/§6.3):
/// CDW10 = SECP (31:24) | SPSP1 (23:16) | SPSP0 (15:8); CDW11 = TL (send) or AL (receive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthCmd {
    /// Security protocol.
    pub secp: u8,
    /// Security protocol specific 0.
    pub spsp0: u8,
    /// Security protocol specific 1.
    pub spsp1: u8,
    /// Transfer length (send) or allocation length (receive).
    pub len: u32,
}

impl AuthCmd {
    /// DH-HMAC-CHAP with a transfer/allocation length.
    pub fn dhchap(len: u32) -> AuthCmd {
        AuthCmd { secp: SECP_DHCHAP, spsp0: SPSP_DHCHAP, spsp1: SPSP_DHCHAP, len }
    }

    /// Reads the fields from an SQE.
    pub fn from_sqe(s: &Sqe) -> AuthCmd {
        AuthCmd { spsp0: get_u8(&s.0, 41), spsp1: get_u8(&s.0, 42), secp: get_u8(&s.0, 43), len: get_u32(&s.0, 44) }
    }

    /// Whether SECP/SPSP name DH-HMAC-CHAP.
    pub fn is_dhchap(&self) -> bool {
        self.secp == SECP_DHCHAP && self.spsp0 == SPSP_DHCHAP && self.spsp1 == SPSP_DHCHAP
    }

    fn sqe(&self, cid: Cid, fct: u8) -> Sqe {
        let mut s = Sqe::fabrics(cid, fct);
        s.set_sgl(SglDescriptor::transport(self.len));
        put_u8(&mut s.0, 41, self.spsp0);
        put_u8(&mut s.0, 42, self.spsp1);
        put_u8(&mut s.0, 43, self.secp);
        put_u32(&mut s.0, 44, self.len);
        s
    }

    /// An Authentication Send SQE (the data pointer is the host queue's to set).
    pub fn send_sqe(&self, cid: Cid) -> Sqe {
        self.sqe(cid, fctype::AUTH_SEND)
    }

    /// An Authentication Receive SQE.
    pub fn receive_sqe(&self, cid: Cid) -> Sqe {
        self.sqe(cid, fctype::AUTH_RECEIVE)
    }
}

/// AUTH_Negotiate with one DH-HMAC-CHAP protocol descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction id.
    pub tid: u16,
    /// Secure channel concatenation (0 = none).
    pub sc_c: u8,
    /// Number of protocol descriptors the sender claimed.
    pub napd: u8,
    /// AUTHID of the first descriptor.
    pub authid: u8,
    /// Hash ids offered (raw, at most 30).
    pub hash_ids: Vec<u8>,
    /// DH group ids offered (raw, at most 30).
    pub dh_groups: Vec<u8>,
}

impl Negotiate {
    /// What the host offers: every hash and group (as Linux does), no secure channel.
    pub fn offer_all(tid: u16) -> Negotiate {
        Negotiate {
            tid,
            sc_c: 0,
            napd: 1,
            authid: AUTHID_DHCHAP,
            hash_ids: HashId::ALL.iter().map(|h| h.id()).collect(),
            dh_groups: DhGroup::ALL.iter().map(|g| g.id()).collect(),
        }
    }
}

/// DH-HMAC-CHAP_Challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Transaction id.
    pub tid: u16,
    /// Hash id (raw).
    pub hash_id: u8,
    /// DH group id (raw).
    pub dh_group: u8,
    /// S1.
    pub seqnum: u32,
    /// C1 (HL bytes).
    pub c1: Vec<u8>,
    /// The controller's DH public value (DHVLEN bytes; empty for null).
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Transaction id.
    pub tid: u16,
    /// R1 (HL bytes).
    pub r1: Vec<u8>,
    /// C2, when the host asks the controller to authenticate too (CVALID).
    pub c2: Option<Vec<u8>>,
    /// S2 (0: no bidirectional authentication).
    pub seqnum: u32,
    /// The host's DH public value.
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Success1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Success1 {
    /// Transaction id.
    pub tid: u16,
    /// Hash length.
    pub hl: u8,
    /// R2, when the host asked (RVALID).
    pub r2: Option<Vec<u8>>,
}

/// AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to controller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Transaction id.
    pub tid: u16,
    /// Reason code (01h).
    pub rescode: u8,
    /// Reason code explanation ([`failure`]).
    pub rescode_exp: u8,
}

/// One authentication message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1.
    Success1(Success1),
    /// DH-HMAC-CHAP_Success2 (its transaction id).
    Success2(u16),
    /// AUTH_Failure1.
    Failure1(Failure),
    /// AUTH_Failure2.
    Failure2(Failure),
}

/// Why a message could not be decoded (each maps to a failure explanation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Shorter than its header or than the lengths it states.
    #[error("message shorter than its fields")]
    Short,
    /// Unknown AUTH_TYPE / AUTH_ID pair.
    #[error("unknown message type {0:#04x}/{1:#04x}")]
    Unknown(u8, u8),
    /// A length field above its limit (HL > 64, DHVLEN > 1024, more than 30 ids).
    #[error("a length field is out of range")]
    Length,
}

impl MessageError {
    /// The AUTH_Failure explanation that reports this error.
    pub fn rescode_exp(self) -> u8 {
        match self {
            MessageError::Unknown(..) => failure::INCORRECT_MESSAGE,
            MessageError::Short | MessageError::Length => failure::INCORRECT_PAYLOAD,
        }
    }
}

/// Size of the fixed part of Challenge, Reply, Success1 and Success2.
const HDR: usize = 16;
/// Size of AUTH_Negotiate's header (before the descriptors).
const NEG_HDR: usize = 8;
/// Size of a protocol descriptor.
const DESC: usize = 64;
/// Size of an AUTH_Failure message.
const FAILURE_LEN: usize = 8;

impl Message {
    /// The transaction id.
    pub fn tid(&self) -> u16 {
        match self {
            Message::Negotiate(m) => m.tid,
            Message::Challenge(m) => m.tid,
            Message::Reply(m) => m.tid,
            Message::Success1(m) => m.tid,
            Message::Success2(t) => *t,
            Message::Failure1(f) | Message::Failure2(f) => f.tid,
        }
    }

    /// Encodes (no padding; Auth Receive data is zero-filled to AL by the sender).
    pub fn encode(&self) -> Vec<u8> {
        let (ty, id) = match self {
            Message::Negotiate(_) => (auth_type::COMMON, msg_id::NEGOTIATE),
            Message::Challenge(_) => (auth_type::DHCHAP, msg_id::CHALLENGE),
            Message::Reply(_) => (auth_type::DHCHAP, msg_id::REPLY),
            Message::Success1(_) => (auth_type::DHCHAP, msg_id::SUCCESS1),
            Message::Success2(_) => (auth_type::DHCHAP, msg_id::SUCCESS2),
            Message::Failure1(_) => (auth_type::COMMON, msg_id::FAILURE1),
            Message::Failure2(_) => (auth_type::COMMON, msg_id::FAILURE2),
        };
        let mut b = match self {
            Message::Negotiate(m) => {
                let mut b = vec![0u8; NEG_HDR + DESC];
                put_u8(&mut b, 6, m.sc_c);
                // One descriptor is encoded; NAPD is the caller's (1 from `offer_all`).
                put_u8(&mut b, 7, m.napd);
                let d = &mut b[NEG_HDR..];
                let nh = m.hash_ids.len().min(MAX_IDS);
                let nd = m.dh_groups.len().min(MAX_IDS);
                put_u8(d, 0, m.authid);
                put_u8(d, 2, len_u8(nh));
                put_u8(d, 3, len_u8(nd));
                d[4..4 + nh].copy_from_slice(&m.hash_ids[..nh]);
                d[4 + MAX_IDS..4 + MAX_IDS + nd].copy_from_slice(&m.dh_groups[..nd]);
                b
            }
            Message::Challenge(m) => {
                let mut b = vec![0u8; HDR];
                put_u8(&mut b, 6, len_u8(m.c1.len()));
                put_u8(&mut b, 8, m.hash_id);
                put_u8(&mut b, 9, m.dh_group);
                put_u16(&mut b, 10, len_u16(m.dhv.len()));
                put_u32(&mut b, 12, m.seqnum);
                b.extend_from_slice(&m.c1);
                b.extend_from_slice(&m.dhv);
                b
            }
            Message::Reply(m) => {
                let mut b = vec![0u8; HDR];
                let hl = m.r1.len();
                put_u8(&mut b, 6, len_u8(hl));
                put_u8(&mut b, 8, u8::from(m.c2.is_some()));
                put_u16(&mut b, 10, len_u16(m.dhv.len()));
                put_u32(&mut b, 12, m.seqnum);
                b.extend_from_slice(&m.r1);
                // Linux always carries the C2 field (zeros without CVALID).
                match &m.c2 {
                    Some(c2) => b.extend_from_slice(c2),
                    None => b.resize(HDR + 2 * hl, 0),
                }
                b.extend_from_slice(&m.dhv);
                b
            }
            Message::Success1(m) => {
                let mut b = vec![0u8; HDR];
                put_u8(&mut b, 6, m.hl);
                put_u8(&mut b, 8, u8::from(m.r2.is_some()));
                if let Some(r2) = &m.r2 {
                    b.extend_from_slice(r2);
                }
                b
            }
            Message::Success2(_) => vec![0u8; HDR],
            Message::Failure1(f) | Message::Failure2(f) => {
                let mut b = vec![0u8; FAILURE_LEN];
                put_u8(&mut b, 6, f.rescode);
                put_u8(&mut b, 7, f.rescode_exp);
                b
            }
        };
        put_u8(&mut b, 0, ty);
        put_u8(&mut b, 1, id);
        put_u16(&mut b, 4, self.tid());
        b
    }

    /// Decodes a message from `b` (which may be zero-padded past its end). Every
    /// length is checked against its limit and against `b` before it is used.
    pub fn decode(b: &[u8]) -> Result<Message, MessageError> {
        let b = &b[..b.len().min(MAX_MESSAGE_LEN)];
        if b.len() < FAILURE_LEN {
            return Err(MessageError::Short);
        }
        let (ty, id, tid) = (b[0], b[1], get_u16(b, 4));
        let field = |off: usize, len: usize| -> Result<Vec<u8>, MessageError> {
            b.get(off..off + len).map(<[u8]>::to_vec).ok_or(MessageError::Short)
        };
        let hl = |v: u8| -> Result<usize, MessageError> {
            let v = usize::from(v);
            if v == 0 || v > MAX_HASH_LEN { Err(MessageError::Length) } else { Ok(v) }
        };
        let dhvlen = |v: u16| -> Result<usize, MessageError> {
            let v = usize::from(v);
            if v > DhGroup::Ffdhe8192.value_len() { Err(MessageError::Length) } else { Ok(v) }
        };
        Ok(match (ty, id) {
            (auth_type::COMMON, msg_id::NEGOTIATE) => {
                if b.len() < NEG_HDR + DESC {
                    return Err(MessageError::Short);
                }
                let d = &b[NEG_HDR..NEG_HDR + DESC];
                let (nh, nd) = (usize::from(d[2]), usize::from(d[3]));
                if nh > MAX_IDS || nd > MAX_IDS {
                    return Err(MessageError::Length);
                }
                Message::Negotiate(Negotiate {
                    tid,
                    sc_c: b[6],
                    napd: b[7],
                    authid: d[0],
                    hash_ids: d[4..4 + nh].to_vec(),
                    dh_groups: d[4 + MAX_IDS..4 + MAX_IDS + nd].to_vec(),
                })
            }
            (auth_type::DHCHAP, msg_id::CHALLENGE) => {
                let n = hl(get_u8(b, 6))?;
                let dv = dhvlen(get_u16(b, 10))?;
                Message::Challenge(Challenge {
                    tid,
                    hash_id: get_u8(b, 8),
                    dh_group: get_u8(b, 9),
                    seqnum: get_u32(b, 12),
                    c1: field(HDR, n)?,
                    dhv: field(HDR + n, dv)?,
                })
            }
            (auth_type::DHCHAP, msg_id::REPLY) => {
                let n = hl(get_u8(b, 6))?;
                let dv = dhvlen(get_u16(b, 10))?;
                let cvalid = get_u8(b, 8) & 1 != 0;
                let c2 = field(HDR + n, n)?;
                Message::Reply(Reply {
                    tid,
                    r1: field(HDR, n)?,
                    c2: cvalid.then_some(c2),
                    seqnum: get_u32(b, 12),
                    dhv: field(HDR + 2 * n, dv)?,
                })
            }
            (auth_type::DHCHAP, msg_id::SUCCESS1) => {
                let raw = get_u8(b, 6);
                let rvalid = get_u8(b, 8) & 1 != 0;
                let r2 = if rvalid { Some(field(HDR, hl(raw)?)?) } else { None };
                Message::Success1(Success1 { tid, hl: raw, r2 })
            }
            (auth_type::DHCHAP, msg_id::SUCCESS2) => Message::Success2(tid),
            (auth_type::COMMON, msg_id::FAILURE1 | msg_id::FAILURE2) => {
                let f = Failure { tid, rescode: b[6], rescode_exp: b[7] };
                if id == msg_id::FAILURE1 { Message::Failure1(f) } else { Message::Failure2(f) }
            }
            (t, i) => return Err(MessageError::Unknown(t, i)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiate_matches_linux_layout() {
        // Linux `nvme_auth_set_dhchap_negotiate_data`: 8 + 64 bytes, halen 3, dhlen 6,
        // hash ids at idlist[0..], groups at idlist[30..].
        let b = Message::Negotiate(Negotiate::offer_all(7)).encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], &[0, 0, 0, 0, 7, 0, 0, 1]);
        assert_eq!(&b[8..15], &[1, 0, 3, 6, 1, 2, 3]);
        assert_eq!(&b[8 + 4 + 30..8 + 4 + 36], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(Message::decode(&b).unwrap(), Message::Negotiate(Negotiate::offer_all(7)));
    }

    #[test]
    fn round_trips() {
        let msgs = [
            Message::Challenge(Challenge {
                tid: 3,
                hash_id: 2,
                dh_group: 1,
                seqnum: 0xdead_beef,
                c1: vec![5; 48],
                dhv: vec![9; 256],
            }),
            Message::Reply(Reply { tid: 3, r1: vec![1; 32], c2: Some(vec![2; 32]), seqnum: 77, dhv: vec![] }),
            Message::Reply(Reply { tid: 3, r1: vec![1; 64], c2: None, seqnum: 0, dhv: vec![4; 1024] }),
            Message::Success1(Success1 { tid: 3, hl: 32, r2: Some(vec![8; 32]) }),
            Message::Success1(Success1 { tid: 3, hl: 32, r2: None }),
            Message::Success2(3),
            Message::Failure1(Failure { tid: 3, rescode: 1, rescode_exp: failure::FAILED }),
            Message::Failure2(Failure { tid: 3, rescode: 1, rescode_exp: failure::INCORRECT_PAYLOAD }),
        ];
        for m in msgs {
            let mut b = m.encode();
            assert_eq!(Message::decode(&b).unwrap(), m);
            // Zero padding (Auth Receive fills AL) changes nothing.
            b.resize(4096, 0);
            assert_eq!(Message::decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn hostile_lengths_are_refused() {
        let mut b =
            Message::Challenge(Challenge { tid: 1, hash_id: 1, dh_group: 0, seqnum: 1, c1: vec![1; 32], dhv: vec![] })
                .encode();
        b[6] = 65;
        assert_eq!(Message::decode(&b), Err(MessageError::Length));
        b[6] = 32;
        put_u16(&mut b, 10, 1025);
        assert_eq!(Message::decode(&b), Err(MessageError::Length));
        put_u16(&mut b, 10, 8);
        assert_eq!(Message::decode(&b), Err(MessageError::Short));
        assert_eq!(Message::decode(&[0, 0, 0]), Err(MessageError::Short));
        assert_eq!(Message::decode(&[9, 9, 0, 0, 0, 0, 0, 0]), Err(MessageError::Unknown(9, 9)));
        let mut n = Message::Negotiate(Negotiate::offer_all(1)).encode();
        n[8 + 2] = 31;
        assert_eq!(Message::decode(&n), Err(MessageError::Length));
        assert_eq!(Message::decode(&n[..40]), Err(MessageError::Short));
        // Every prefix of every message decodes or fails; none panics.
        for m in [Message::Negotiate(Negotiate::offer_all(1)), Message::Success2(1)] {
            let b = m.encode();
            for i in 0..b.len() {
                let _ = Message::decode(&b[..i]);
            }
        }
    }

    #[test]
    fn auth_sqe_fields() {
        let s = AuthCmd::dhchap(72).send_sqe(Cid(5));
        assert_eq!(s.fctype(), fctype::AUTH_SEND);
        // Linux `nvmf_auth_send_command`: resv3 @40, spsp0 @41, spsp1 @42, secp @43, tl @44.
        assert_eq!(&s.0[40..48], &[0, 1, 1, 0xe9, 72, 0, 0, 0]);
        assert_eq!(AuthCmd::from_sqe(&s), AuthCmd::dhchap(72));
        assert!(AuthCmd::from_sqe(&s).is_dhchap());
        assert_eq!(AuthCmd::dhchap(4096).receive_sqe(Cid(1)).fctype(), fctype::AUTH_RECEIVE);
    }

    #[test]
    fn ids_and_names() {
        for h in HashId::ALL {
            assert_eq!(HashId::from_id(h.id()), Some(h));
            assert_eq!(HashId::parse(h.linux_name()), Some(h));
        }
        assert_eq!(HashId::parse("SHA-384"), Some(HashId::Sha384));
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
            assert_eq!(DhGroup::parse(g.name()), Some(g));
        }
        assert_eq!(DhGroup::from_id(6), None);
    }
}
