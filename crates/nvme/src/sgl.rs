//! SGL descriptors as NVMe/TCP uses them (NVMe 2.0 §4.3.2, NVMe/TCP 1.0 §3.3.3).
//!
//! NVMe/TCP supports two data descriptors in the SQE's DPTR:
//! - in-capsule data: a Data Block descriptor with the Offset sub-type (0x01),
//!   whose address is the offset into the capsule's data (must be 0 here
//!   because ICDOFF is 0);
//! - data transferred by C2HData / R2T+H2CData: a Transport SGL Data Block
//!   descriptor, type 0x5 sub-type 0xA (0x5A), with a length only.

use crate::wire::{get_u8, get_u32, get_u64, put_u8, put_u32, put_u64};

/// SGL identifier byte for in-capsule data (Data Block, Offset).
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01;
/// SGL identifier byte for transport data (Transport SGL Data Block, Transport specific A).
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

/// The 16-byte SGL descriptor in an SQE's DPTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SglDescriptor {
    /// Address (an offset for in-capsule data).
    pub address: u64,
    /// Length in bytes.
    pub length: u32,
    /// SGL identifier: type in bits 7:4, sub-type in bits 3:0.
    pub sgl_id: u8,
}

/// What a DPTR descriptor asks the transport to do with data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglKind {
    /// Data travels in the command capsule at this offset.
    InCapsule {
        /// Offset into the in-capsule data.
        offset: u64,
    },
    /// Data travels in C2HData or R2T/H2CData PDUs.
    Transport,
    /// A descriptor NVMe/TCP does not support.
    Unsupported,
}

impl SglDescriptor {
    /// Decodes from the 16 DPTR bytes.
    pub fn decode(b: &[u8]) -> SglDescriptor {
        SglDescriptor { address: get_u64(b, 0), length: get_u32(b, 8), sgl_id: get_u8(b, 15) }
    }

    /// Encodes into 16 DPTR bytes.
    pub fn encode(&self, b: &mut [u8]) {
        put_u64(b, 0, self.address);
        put_u32(b, 8, self.length);
        put_u8(b, 12, 0);
        put_u8(b, 13, 0);
        put_u8(b, 14, 0);
        put_u8(b, 15, self.sgl_id);
    }

    /// An in-capsule data descriptor of `length` bytes at offset 0.
    pub fn in_capsule(length: u32) -> SglDescriptor {
        SglDescriptor { address: 0, length, sgl_id: SGL_DATA_BLOCK_OFFSET }
    }

    /// A transport data descriptor of `length` bytes (0 for commands without data).
    pub fn transport(length: u32) -> SglDescriptor {
        SglDescriptor { address: 0, length, sgl_id: SGL_TRANSPORT_DATA_BLOCK }
    }

    /// Classifies the descriptor.
    pub fn kind(&self) -> SglKind {
        match self.sgl_id {
            SGL_DATA_BLOCK_OFFSET => SglKind::InCapsule { offset: self.address },
            SGL_TRANSPORT_DATA_BLOCK => SglKind::Transport,
            _ => SglKind::Unsupported,
        }
    }
}
