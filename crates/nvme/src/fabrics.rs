//! Fabrics commands and controller properties (NVMe-oF 1.1 §3.3, §6; NVMe 2.0 §3.1.4).
//!
//! Connect creates the admin queue (QID 0, which also creates the controller)
//! or binds an I/O queue to an existing controller. Property Get/Set replace
//! the memory-mapped registers of PCIe controllers.

use crate::ids::{Cid, Cntlid, QueueId};
use crate::opcode::fctype;
use crate::sgl::SglDescriptor;
use crate::sqe::Sqe;
use crate::wire::{get_u8, get_u16, get_u32, get_u64, len_u16, len_u32, put_str, put_u8, put_u16, put_u32, put_u64};

/// Size of the Connect command's data.
pub const CONNECT_DATA_SIZE: usize = 1024;
/// Maximum NQN length in bytes (NVMe 2.0 §4.5: 223 bytes, the field is 256 with NUL padding).
pub const NQN_MAX_LEN: usize = 223;

/// Connect command fields (in the SQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectCmd {
    /// Record format (must be 0).
    pub recfmt: u16,
    /// Queue to create.
    pub qid: QueueId,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (bit 2: disable SQ flow control).
    pub cattr: u8,
    /// Keep alive timeout in ms (admin queue only; 0 disables).
    pub kato_ms: u32,
}

/// CATTR bit 2: the host does not use SQ head pointers (NVMe-oF 1.1 §3.3).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

impl ConnectCmd {
    /// Reads the Connect fields from an SQE.
    pub fn from_sqe(s: &Sqe) -> ConnectCmd {
        ConnectCmd {
            recfmt: get_u16(&s.0, 40),
            qid: QueueId(get_u16(&s.0, 42)),
            sqsize: get_u16(&s.0, 44),
            cattr: get_u8(&s.0, 46),
            kato_ms: get_u32(&s.0, 48),
        }
    }

    /// Builds the Connect SQE (with in-capsule data of 1024 bytes).
    pub fn to_sqe(&self, cid: Cid) -> Sqe {
        let mut s = Sqe::fabrics(cid, fctype::CONNECT);
        s.set_sgl(SglDescriptor::in_capsule(len_u32(CONNECT_DATA_SIZE)));
        put_u16(&mut s.0, 40, self.recfmt);
        put_u16(&mut s.0, 42, self.qid.0);
        put_u16(&mut s.0, 44, self.sqsize);
        put_u8(&mut s.0, 46, self.cattr);
        put_u32(&mut s.0, 48, self.kato_ms);
        s
    }

    /// Whether SQ flow control is disabled for this queue.
    pub fn sqflow_disabled(&self) -> bool {
        self.cattr & CATTR_DISABLE_SQFLOW != 0
    }
}

/// Connect command data (1024 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller id: [`Cntlid::DYNAMIC`] for the admin queue of a dynamic controller.
    pub cntlid: Cntlid,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

/// Why Connect data could not be accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectDataError {
    /// Shorter than 1024 bytes.
    TooShort,
    /// An NQN field has no NUL terminator within 256 bytes or is not UTF-8.
    BadNqn {
        /// Byte offset of the field in the data.
        offset: u16,
    },
}

impl ConnectData {
    /// Decodes and checks the 1024-byte Connect data.
    pub fn decode(b: &[u8]) -> Result<ConnectData, ConnectDataError> {
        if b.len() < CONNECT_DATA_SIZE {
            return Err(ConnectDataError::TooShort);
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        let nqn = |off: usize| -> Result<String, ConnectDataError> {
            let field = &b[off..off + 256];
            let end = field.iter().position(|&c| c == 0);
            match end {
                Some(n) if n <= NQN_MAX_LEN => core::str::from_utf8(&field[..n])
                    .map(str::to_string)
                    .map_err(|_| ConnectDataError::BadNqn { offset: len_u16(off) }),
                _ => Err(ConnectDataError::BadNqn { offset: len_u16(off) }),
            }
        };
        Ok(ConnectData { hostid, cntlid: Cntlid(get_u16(b, 16)), subnqn: nqn(256)?, hostnqn: nqn(512)? })
    }

    /// Encodes into 1024 bytes.
    pub fn encode(&self) -> [u8; CONNECT_DATA_SIZE] {
        let mut b = [0u8; CONNECT_DATA_SIZE];
        b[0..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid.0);
        put_str(&mut b, 256, 256, self.subnqn.as_bytes(), 0);
        put_str(&mut b, 512, 256, self.hostnqn.as_bytes(), 0);
        b
    }
}

/// The DW0 of a Connect response carrying "Connect Invalid Parameters":
/// IATTR (bit 16: 0 = field in the SQE, 1 = in the data) and IPO (bits 15:0:
/// the byte offset of the invalid field) (NVMe-oF 1.1 §3.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectInvalid {
    /// The invalid field is in the Connect data (else in the SQE).
    pub in_data: bool,
    /// Byte offset of the invalid field.
    pub offset: u16,
}

impl ConnectInvalid {
    /// The CQE DW0 value.
    pub fn dw0(self) -> u32 {
        (u32::from(self.in_data) << 16) | u32::from(self.offset)
    }
    /// Invalid SQE field at `offset`.
    pub fn sqe(offset: u16) -> ConnectInvalid {
        ConnectInvalid { in_data: false, offset }
    }
    /// Invalid data field at `offset`.
    pub fn data(offset: u16) -> ConnectInvalid {
        ConnectInvalid { in_data: true, offset }
    }
}

/// Byte offsets of Connect data fields, for [`ConnectInvalid`].
pub mod connect_data_offset {
    /// HOSTID.
    pub const HOSTID: u16 = 0;
    /// CNTLID.
    pub const CNTLID: u16 = 16;
    /// SUBNQN.
    pub const SUBNQN: u16 = 256;
    /// HOSTNQN.
    pub const HOSTNQN: u16 = 512;
}

/// Byte offsets of Connect SQE fields, for [`ConnectInvalid`].
pub mod connect_sqe_offset {
    /// RECFMT.
    pub const RECFMT: u16 = 40;
    /// QID.
    pub const QID: u16 = 42;
    /// SQSIZE.
    pub const SQSIZE: u16 = 44;
    /// KATO.
    pub const KATO: u16 = 48;
}

/// Property Set / Property Get fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyCmd {
    /// Property size: false = 4 bytes, true = 8 bytes (ATTRIB bits 2:0).
    pub size8: bool,
    /// Property offset.
    pub offset: u32,
    /// Value to set (Property Set only).
    pub value: u64,
}

impl PropertyCmd {
    /// Reads a Property Get/Set command.
    pub fn from_sqe(s: &Sqe) -> PropertyCmd {
        PropertyCmd { size8: get_u8(&s.0, 40) & 7 == 1, offset: get_u32(&s.0, 44), value: get_u64(&s.0, 48) }
    }

    /// Builds a Property Get.
    pub fn get_sqe(cid: Cid, offset: u32, size8: bool) -> Sqe {
        let mut s = Sqe::fabrics(cid, fctype::PROPERTY_GET);
        put_u8(&mut s.0, 40, u8::from(size8));
        put_u32(&mut s.0, 44, offset);
        s
    }

    /// Builds a Property Set.
    pub fn set_sqe(cid: Cid, offset: u32, size8: bool, value: u64) -> Sqe {
        let mut s = Sqe::fabrics(cid, fctype::PROPERTY_SET);
        put_u8(&mut s.0, 40, u8::from(size8));
        put_u32(&mut s.0, 44, offset);
        put_u64(&mut s.0, 48, value);
        s
    }
}

/// Property offsets (NVMe 2.0 §3.1.4, Figure 33).
pub mod prop {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = 0x20;
}

/// Controller Capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries supported, 0's based.
    pub mqes: u16,
    /// Contiguous queues required.
    pub cqr: bool,
    /// Timeout for CSTS.RDY transitions, in 500 ms units.
    pub to: u8,
    /// NVM command set supported (CSS bit 0).
    pub css_nvm: bool,
    /// Minimum memory page size, as 2^(12 + mpsmin).
    pub mpsmin: u8,
    /// Maximum memory page size, as 2^(12 + mpsmax).
    pub mpsmax: u8,
}

impl Cap {
    /// Encodes the 64-bit register.
    pub fn to_u64(self) -> u64 {
        u64::from(self.mqes)
            | (u64::from(self.cqr) << 16)
            | (u64::from(self.to) << 24)
            | (u64::from(self.css_nvm) << 37)
            | (u64::from(self.mpsmin & 0xf) << 48)
            | (u64::from(self.mpsmax & 0xf) << 52)
    }
    /// Decodes the 64-bit register.
    pub fn from_u64(v: u64) -> Cap {
        Cap {
            mqes: (v & 0xffff) as u16,
            cqr: v & (1 << 16) != 0,
            to: ((v >> 24) & 0xff) as u8,
            css_nvm: v & (1 << 37) != 0,
            mpsmin: ((v >> 48) & 0xf) as u8,
            mpsmax: ((v >> 52) & 0xf) as u8,
        }
    }
}

/// Controller Configuration fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable.
    pub fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O command set selected (bits 6:4).
    pub fn css(self) -> u8 {
        ((self.0 >> 4) & 7) as u8
    }
    /// Memory page size (bits 10:7).
    pub fn mps(self) -> u8 {
        ((self.0 >> 7) & 0xf) as u8
    }
    /// Arbitration mechanism (bits 13:11).
    pub fn ams(self) -> u8 {
        ((self.0 >> 11) & 7) as u8
    }
    /// Shutdown notification (bits 15:14): 0 none, 1 normal, 2 abrupt.
    pub fn shn(self) -> u8 {
        ((self.0 >> 14) & 3) as u8
    }
    /// I/O SQ entry size as a power of two (bits 19:16).
    pub fn iosqes(self) -> u8 {
        ((self.0 >> 16) & 0xf) as u8
    }
    /// I/O CQ entry size as a power of two (bits 23:20).
    pub fn iocqes(self) -> u8 {
        ((self.0 >> 20) & 0xf) as u8
    }
    /// The value a host writes to enable an NVM controller with 4 KiB pages.
    pub fn enable_value() -> Cc {
        Cc(1 | (6 << 16) | (4 << 20))
    }
}

/// Controller Status bits.
pub mod csts {
    /// Ready.
    pub const RDY: u32 = 1 << 0;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    /// Shutdown processing occurring.
    pub const SHST_OCCURRING: u32 = 1 << 2;
    /// Shutdown processing complete.
    pub const SHST_COMPLETE: u32 = 2 << 2;
    /// Shutdown status mask.
    pub const SHST_MASK: u32 = 3 << 2;
}

/// NVMe version value for the VS property (major.minor.tertiary).
pub const fn version(major: u32, minor: u32, ter: u32) -> u32 {
    (major << 16) | (minor << 8) | ter
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_round_trip() {
        let c = ConnectCmd { recfmt: 0, qid: QueueId(3), sqsize: 127, cattr: 0, kato_ms: 0 };
        let s = c.to_sqe(Cid(9));
        assert!(s.is_connect());
        assert_eq!(ConnectCmd::from_sqe(&s), c);
        let d = ConnectData {
            hostid: [7; 16],
            cntlid: Cntlid(5),
            subnqn: "nqn.2024-01.io.qpath:a".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        assert_eq!(ConnectData::decode(&d.encode()).unwrap(), d);
    }

    #[test]
    fn connect_data_rejects_unterminated_nqn() {
        let mut b = [b'a'; CONNECT_DATA_SIZE];
        b[16] = 0xff;
        b[17] = 0xff;
        assert_eq!(ConnectData::decode(&b), Err(ConnectDataError::BadNqn { offset: 256 }));
        assert_eq!(ConnectData::decode(&b[..100]), Err(ConnectDataError::TooShort));
    }

    #[test]
    fn cap_round_trip() {
        let c = Cap { mqes: 1023, cqr: true, to: 15, css_nvm: true, mpsmin: 0, mpsmax: 0 };
        assert_eq!(Cap::from_u64(c.to_u64()), c);
    }

    #[test]
    fn cc_enable_fields() {
        let cc = Cc::enable_value();
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.shn(), 0);
    }
}
