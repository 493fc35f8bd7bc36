//! Completion Queue Entry: the 16-byte response (NVMe 2.0 §4.2.3).

use crate::ids::{Cid, QueueId};
use crate::status::Status;
use crate::wire::{get_u16, get_u32, put_u16, put_u32};

/// Size of a completion queue entry.
pub const CQE_SIZE: usize = 16;

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (DW0).
    pub dw0: u32,
    /// Command specific result (DW1).
    pub dw1: u32,
    /// SQ head pointer after this command was fetched.
    pub sqhd: u16,
    /// SQ identifier.
    pub sqid: QueueId,
    /// The completed command's identifier.
    pub cid: Cid,
    /// Completion status.
    pub status: Status,
    /// More (status field bit 14 with the phase tag): an Error Information log entry
    /// describes this failure (NVMe Base 2.0 §4.2.3). A property of this completion, not
    /// of the status, so a status compares the same with or without it.
    pub more: bool,
}

/// The More bit in a CQE's status half-word (bit 13 of the status field, after the phase tag).
const MORE_BIT: u16 = 1 << 14;

impl Cqe {
    /// A successful completion for `cid`.
    pub fn success(cid: Cid) -> Cqe {
        Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: QueueId(0), cid, status: Status::SUCCESS, more: false }
    }

    /// A completion for `cid` with `status`.
    pub fn with_status(cid: Cid, status: Status) -> Cqe {
        Cqe { status, ..Cqe::success(cid) }
    }

    /// The 64-bit result (DW1:DW0), as Property Get returns it.
    pub fn result64(&self) -> u64 {
        u64::from(self.dw0) | (u64::from(self.dw1) << 32)
    }

    /// Decodes from 16 bytes (zero-filled if shorter).
    pub fn decode(b: &[u8]) -> Cqe {
        Cqe {
            dw0: get_u32(b, 0),
            dw1: get_u32(b, 4),
            sqhd: get_u16(b, 8),
            sqid: QueueId(get_u16(b, 10)),
            cid: Cid(get_u16(b, 12)),
            status: Status::from_wire(get_u16(b, 14)),
            more: get_u16(b, 14) & MORE_BIT != 0,
        }
    }

    /// Encodes into 16 bytes.
    pub fn encode(&self, b: &mut [u8]) {
        put_u32(b, 0, self.dw0);
        put_u32(b, 4, self.dw1);
        put_u16(b, 8, self.sqhd);
        put_u16(b, 10, self.sqid.0);
        put_u16(b, 12, self.cid.0);
        put_u16(b, 14, self.status.to_wire() | if self.more { MORE_BIT } else { 0 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Cqe {
            dw0: 0xdead_beef,
            dw1: 1,
            sqhd: 5,
            sqid: QueueId(3),
            cid: Cid(99),
            status: Status::LBA_OUT_OF_RANGE,
            more: false,
        };
        let mut b = [0u8; CQE_SIZE];
        c.encode(&mut b);
        assert_eq!(Cqe::decode(&b), c);
        assert_eq!(c.result64(), 0x1_dead_beef);
        // Linux nvmet: NVME_SC_LBA_RANGE | NVME_SC_MORE | NVME_SC_DNR = 0x6080 (after the phase tag).
        let m = Cqe { more: true, ..c };
        m.encode(&mut b);
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x6080 << 1);
        assert_eq!(Cqe::decode(&b), m);
        assert_eq!(Cqe::decode(&b).status, Status::LBA_OUT_OF_RANGE);
    }
}
