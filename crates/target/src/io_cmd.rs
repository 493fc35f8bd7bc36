//! NVM I/O commands: decoding and checking Read, Write, Flush, Write Zeroes
//! and Dataset Management against the namespace and the path's ANA state
//! (NVM Command Set 1.0 §3; Linux `io-cmd-bdev.c` / `io-cmd-file.c`).

use nvme::opcode::io;
use nvme::{AnaState, Sqe, Status};

use crate::namespace::Namespace;
use crate::port::Port;

/// What an I/O command asks the backend to do, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// Read `len` bytes at `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Write `len` bytes at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Force Unit Access: durable before completion.
        fua: bool,
    },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The host allows deallocation.
        deallocate: bool,
    },
    /// Dataset Management with `nr` 16-byte ranges in the data.
    Dsm {
        /// Number of ranges.
        nr: u32,
        /// Attribute Deallocate.
        deallocate: bool,
    },
    /// A reservation command ([`crate::reservation`]).
    Reservation {
        /// Which one.
        op: ResvOp,
        /// Its data bytes: host-to-controller keys, or the report's length.
        len: u32,
    },
}

/// The reservation commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResvOp {
    /// Reservation Register (16 bytes of keys in).
    Register,
    /// Reservation Acquire (16 bytes of keys in).
    Acquire,
    /// Reservation Release (8 bytes: the current key).
    Release,
    /// Reservation Report (NUMD dwords out).
    Report,
}

impl IoKind {
    /// Host-to-controller data bytes the command carries.
    pub fn h2c_len(&self) -> u32 {
        match self {
            IoKind::Write { len, .. } => *len,
            IoKind::Dsm { nr, .. } => nr * 16,
            IoKind::Reservation { op, len } if *op != ResvOp::Report => *len,
            _ => 0,
        }
    }

    /// How the I/O statistics count the command: its direction and the namespace bytes it
    /// moves. Reservation commands move none: counted as commands, not as I/O.
    pub fn stats_direction(&self) -> Option<(blk::Direction, u64)> {
        match *self {
            IoKind::Read { len, .. } => Some((blk::Direction::Read, u64::from(len))),
            IoKind::Write { len, .. } => Some((blk::Direction::Write, u64::from(len))),
            IoKind::WriteZeroes { len, .. } => Some((blk::Direction::Write, len)),
            IoKind::Dsm { .. } => Some((blk::Direction::Trim, 0)),
            IoKind::Flush => Some((blk::Direction::Sync, 0)),
            IoKind::Reservation { .. } => None,
        }
    }

    /// Controller-to-host data bytes.
    pub fn c2h_len(&self) -> u32 {
        match self {
            IoKind::Read { len, .. } => *len,
            IoKind::Reservation { op: ResvOp::Report, len } => *len,
            _ => 0,
        }
    }
}

/// Checks an I/O command against namespace `ns` (looked up by the caller;
/// `None` = no such namespace) and the ANA state of its group through `port`.
pub fn plan(sqe: &Sqe, ns: Option<&Namespace>, port: &Port, max_transfer: u32) -> Result<IoKind, Status> {
    let ns = ns.ok_or(Status::INVALID_NS)?;
    // NVMe 2.0 §8.1.1.4: commands on an inaccessible path fail with an ANA status.
    match port.ana_state(ns.anagrpid) {
        AnaState::Optimized | AnaState::NonOptimized => {}
        AnaState::Inaccessible => return Err(Status::ANA_INACCESSIBLE),
        AnaState::PersistentLoss => return Err(Status::ANA_PERSISTENT_LOSS),
        AnaState::Change => return Err(Status::ANA_TRANSITION),
    }
    let op = sqe.opcode();
    // The capacity may change under I/O (resize): read it once for this command.
    let nblocks = ns.nblocks();
    let range = |slba: u64, nlb: u64| -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= nblocks => Ok((slba << ns.block_shift, nlb << ns.block_shift)),
            _ => Err(Status::LBA_OUT_OF_RANGE),
        }
    };
    match op {
        io::READ | io::WRITE => {
            let (offset, len) = range(sqe.slba(), u64::from(sqe.nlb()))?;
            let len = u32::try_from(len).map_err(|_| Status::INVALID_FIELD)?;
            if len > max_transfer {
                return Err(Status::INVALID_FIELD);
            }
            if op == io::READ {
                Ok(IoKind::Read { offset, len })
            } else {
                if ns.readonly {
                    return Err(Status::NS_WRITE_PROTECTED);
                }
                Ok(IoKind::Write { offset, len, fua: sqe.fua() })
            }
        }
        io::FLUSH => Ok(IoKind::Flush),
        io::WRITE_ZEROES => {
            if ns.readonly {
                return Err(Status::NS_WRITE_PROTECTED);
            }
            let (offset, len) = range(sqe.slba(), u64::from(sqe.nlb()))?;
            Ok(IoKind::WriteZeroes { offset, len, deallocate: sqe.wz_deallocate() })
        }
        io::DATASET_MANAGEMENT => {
            if ns.readonly {
                return Err(Status::NS_WRITE_PROTECTED);
            }
            Ok(IoKind::Dsm { nr: (sqe.cdw(10) & 0xff) + 1, deallocate: sqe.cdw(11) & (1 << 2) != 0 })
        }
        io::RESV_REGISTER => Ok(IoKind::Reservation { op: ResvOp::Register, len: 16 }),
        io::RESV_ACQUIRE => Ok(IoKind::Reservation { op: ResvOp::Acquire, len: 16 }),
        io::RESV_RELEASE => Ok(IoKind::Reservation { op: ResvOp::Release, len: 8 }),
        io::RESV_REPORT => {
            let len = crate::reservation::Reservations::report_len(sqe.cdw(10));
            match u32::try_from(len) {
                Ok(len) if len <= max_transfer => Ok(IoKind::Reservation { op: ResvOp::Report, len }),
                _ => Err(Status::INVALID_FIELD),
            }
        }
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// Decodes DSM ranges (16 bytes each: attributes, length in blocks, starting LBA)
/// into byte ranges, checking each against the namespace.
pub fn dsm_ranges(data: &[u8], ns: &Namespace) -> Result<Vec<(u64, u64)>, Status> {
    let nblocks = ns.nblocks();
    data.chunks_exact(16)
        .map(|r| {
            let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            match slba.checked_add(nlb) {
                Some(end) if end <= nblocks => Ok((slba << ns.block_shift, nlb << ns.block_shift)),
                _ => Err(Status::LBA_OUT_OF_RANGE),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::namespace::NamespaceSpec;
    use crate::port::PortKind;
    use nvme::{AnaGrpId, Cid, Nsid, SglDescriptor};

    fn ns() -> Namespace {
        let spec = NamespaceSpec {
            nsid: 1,
            backend: Backend::Null,
            size: Some(1 << 20),
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        };
        Namespace::new("nqn.t", Nsid(1), spec).unwrap()
    }

    fn port() -> Port {
        Port::new(1, "127.0.0.1:1".parse().unwrap(), PortKind::Io)
    }

    #[test]
    fn read_range_checks() {
        let n = ns();
        let p = port();
        let r = Sqe::rw(io::READ, Cid(1), Nsid(1), 2040, 8, SglDescriptor::transport(4096));
        assert_eq!(plan(&r, Some(&n), &p, 1 << 20), Ok(IoKind::Read { offset: 2040 * 512, len: 4096 }));
        let r = Sqe::rw(io::READ, Cid(1), Nsid(1), 2041, 8, SglDescriptor::transport(4096));
        assert_eq!(plan(&r, Some(&n), &p, 1 << 20), Err(Status::LBA_OUT_OF_RANGE));
        let r = Sqe::rw(io::READ, Cid(1), Nsid(1), u64::MAX, 8, SglDescriptor::transport(4096));
        assert_eq!(plan(&r, Some(&n), &p, 1 << 20), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(plan(&r, None, &p, 1 << 20), Err(Status::INVALID_NS));
        let big = Sqe::rw(io::READ, Cid(1), Nsid(1), 0, 2048, SglDescriptor::transport(1 << 20));
        assert_eq!(plan(&big, Some(&n), &p, 4096), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn ana_states_gate_io() {
        let n = ns();
        let p = port();
        let r = Sqe::rw(io::READ, Cid(1), Nsid(1), 0, 1, SglDescriptor::transport(512));
        p.set_ana_state(AnaGrpId(1), AnaState::Inaccessible, 1);
        assert_eq!(plan(&r, Some(&n), &p, 1 << 20), Err(Status::ANA_INACCESSIBLE));
        p.set_ana_state(AnaGrpId(1), AnaState::Change, 2);
        assert_eq!(plan(&r, Some(&n), &p, 1 << 20), Err(Status::ANA_TRANSITION));
        p.set_ana_state(AnaGrpId(1), AnaState::NonOptimized, 3);
        assert!(plan(&r, Some(&n), &p, 1 << 20).is_ok());
    }

    #[test]
    fn dsm() {
        let n = ns();
        let mut d = [0u8; 32];
        d[4..8].copy_from_slice(&8u32.to_le_bytes());
        d[8..16].copy_from_slice(&16u64.to_le_bytes());
        d[20..24].copy_from_slice(&1u32.to_le_bytes());
        d[24..32].copy_from_slice(&5000u64.to_le_bytes());
        assert_eq!(dsm_ranges(&d[..16], &n), Ok(vec![(16 * 512, 8 * 512)]));
        assert_eq!(dsm_ranges(&d, &n), Err(Status::LBA_OUT_OF_RANGE));
    }
}
