//! NVM I/O commands: decoding and checking Read, Write, Flush, Write Zeroes,
//! Dataset Management, Compare, Verify and Copy against the namespace and the path's
//! ANA state (NVM Command Set 1.0 §3; Linux `io-cmd-bdev.c` / `io-cmd-file.c`, SPDK
//! `lib/nvmf/ctrlr_bdev.c`).

use std::ops::Range;

use nvme::copy::{RANGE_SIZE, SourceRange};
use nvme::opcode::io;
use nvme::{AnaState, Sqe, Status};

use crate::namespace::Namespace;
use crate::port::Port;

/// Bytes of one Copy source range entry (format 0h), as a transfer length.
#[allow(clippy::cast_possible_truncation, reason = "32, asserted below")]
const RANGE_BYTES: u32 = RANGE_SIZE as u32;
const _: () = assert!(RANGE_SIZE == 32, "Copy format 0h entries are 32 bytes");

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
        /// Force Unit Access: durable before completion.
        fua: bool,
    },
    /// Dataset Management with `nr` 16-byte ranges at the start of `len` bytes of data.
    Dsm {
        /// Number of ranges.
        nr: u32,
        /// Data bytes the SGL carries: `nr` x 16 up to [`DSM_DATA_MAX`] (see [`plan`]).
        len: u32,
        /// Attribute Deallocate.
        deallocate: bool,
    },
    /// Compare `len` bytes at `offset` with the host's data (NVM Command Set 1.0 §3.2.1);
    /// with FUSE, the first half of a Compare and Write.
    Compare {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Check that `len` bytes at `offset` can be read (§3.2.8); no data moves.
    Verify {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Flush volatile cache over the range first.
        fua: bool,
    },
    /// Copy `nr` source ranges (in the data, format 0h) to `sdlba` (§3.2.2).
    Copy {
        /// Starting destination LBA.
        sdlba: u64,
        /// Number of source ranges.
        nr: u32,
        /// Bytes copied: 0 until the ranges are decoded.
        len: u64,
        /// Force Unit Access: durable before completion.
        fua: bool,
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
            IoKind::Dsm { len, .. } => *len,
            IoKind::Compare { len, .. } => *len,
            IoKind::Copy { nr, .. } => nr * RANGE_BYTES,
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
            IoKind::Compare { len, .. } => Some((blk::Direction::Read, u64::from(len))),
            IoKind::Copy { len, .. } => Some((blk::Direction::Write, len)),
            // Moves nothing to or from the host: a command, not I/O.
            IoKind::Verify { .. } | IoKind::Reservation { .. } => None,
        }
    }

    /// The blocks a write-like command changes, for the range locks ([`crate::range_lock`]):
    /// Write, Write Zeroes and a deallocating Dataset Management (its ranges are in its
    /// data, so it counts as the whole namespace). A Copy takes its destination itself
    /// once its ranges are decoded.
    pub fn write_blocks(&self, ns: &Namespace) -> Option<Range<u64>> {
        let blocks = |offset: u64, len: u64| (offset >> ns.block_shift)..((offset + len) >> ns.block_shift);
        match *self {
            IoKind::Write { offset, len, .. } => Some(blocks(offset, u64::from(len))),
            IoKind::WriteZeroes { offset, len, .. } => Some(blocks(offset, len)),
            IoKind::Dsm { deallocate: true, .. } => Some(0..ns.nblocks()),
            _ => None,
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
                if ns.write_protected() {
                    return Err(Status::NS_WRITE_PROTECTED);
                }
                Ok(IoKind::Write { offset, len, fua: sqe.fua() })
            }
        }
        io::FLUSH => Ok(IoKind::Flush),
        io::WRITE_ZEROES => {
            if ns.write_protected() {
                return Err(Status::NS_WRITE_PROTECTED);
            }
            let (offset, len) = range(sqe.slba(), u64::from(sqe.nlb()))?;
            Ok(IoKind::WriteZeroes { offset, len, deallocate: sqe.wz_deallocate(), fua: sqe.fua() })
        }
        io::DATASET_MANAGEMENT => plan_dsm(sqe, ns),
        io::COMPARE => {
            let (offset, len) = range(sqe.slba(), u64::from(sqe.nlb()))?;
            match u32::try_from(len) {
                // The host's data to compare against: within MDTS like a Write's.
                Ok(len) if len <= max_transfer => Ok(IoKind::Compare { offset, len }),
                _ => Err(Status::INVALID_FIELD),
            }
        }
        io::VERIFY => {
            // No data moves, so MDTS does not apply (the file backend reads in MDTS chunks).
            let (offset, len) = range(sqe.slba(), u64::from(sqe.nlb()))?;
            Ok(IoKind::Verify { offset, len, fua: sqe.fua() })
        }
        io::COPY => plan_copy(sqe, ns),
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

/// Dataset Management: the number of ranges and the length of their data checked.
fn plan_dsm(sqe: &Sqe, ns: &Namespace) -> Result<IoKind, Status> {
    if ns.write_protected() {
        return Err(Status::NS_WRITE_PROTECTED);
    }
    // NVM Command Set 1.0 §3.2.3: NR (CDW10 bits 7:0) is 0's based; of the attributes
    // (CDW11) only Deallocate (bit 2) asks for anything, IDR and IDW are hints.
    let nr = (sqe.cdw(10) & 0xff) + 1;
    // The data holds NR ranges, but Linux always sends room for 256 (4096 bytes:
    // `nvme_setup_discard` allocates NVME_DSM_MAX_RANGES ranges because some devices
    // read that much whatever NR says). As Linux nvmet (`nvmet_check_data_len_lte`)
    // and SPDK do, an SGL of NR x 16 up to 4096 bytes is taken and its first NR x 16
    // bytes read; a shorter or a longer one is refused.
    let len = sqe.sgl().length;
    if (len as usize) < nr as usize * DSM_RANGE_BYTES || len > DSM_DATA_MAX {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(IoKind::Dsm { nr, len, deallocate: sqe.cdw(11) & (1 << 2) != 0 })
}

/// Copy: the descriptor format and the number of source ranges checked.
fn plan_copy(sqe: &Sqe, ns: &Namespace) -> Result<IoKind, Status> {
    if ns.readonly {
        return Err(Status::NS_WRITE_PROTECTED);
    }
    // NVM Command Set 1.0 §3.2.2: a format OCFS does not advertise is an invalid
    // field; more ranges than MSRC allows exceed the command size limit.
    if sqe.copy_format() != nvme::copy::FORMAT_0 {
        return Err(Status::INVALID_FIELD);
    }
    let nr = sqe.copy_ranges();
    if nr > COPY_RANGES_MAX {
        return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
    }
    Ok(IoKind::Copy { sdlba: sqe.copy_sdlba(), nr, len: 0, fua: sqe.fua() })
}

/// Bytes of one Dataset Management range (NVM Command Set 1.0 §3.2.3.1, Figure 40): context
/// attributes (bytes 3:0, hints: ignored), length in logical blocks (7:4, 1's based: 0 names
/// no block), starting LBA (15:8).
pub const DSM_RANGE_BYTES: usize = 16;

/// Most ranges in one Dataset Management command: NR is 8 bits, 0's based.
pub const DSM_RANGES_MAX: u32 = 256;

/// Most Dataset Management data bytes taken: room for the most ranges.
pub const DSM_DATA_MAX: u32 = 4096;
const _: () = assert!(DSM_DATA_MAX as usize == DSM_RANGES_MAX as usize * DSM_RANGE_BYTES);

/// Range `i` of Dataset Management data as (starting LBA, blocks); `None` past the data.
/// Reads the host's buffer in place (the I/O path allocates nothing).
pub fn dsm_range(data: &[u8], i: usize) -> Option<(u64, u32)> {
    let r = data.get(i.checked_mul(DSM_RANGE_BYTES)?..)?.get(..DSM_RANGE_BYTES)?;
    let nlb = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
    let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
    Some((slba, nlb))
}

/// Range `i` in bytes of namespace `ns` (offset, length), once [`dsm_check`] passed.
pub fn dsm_bytes(data: &[u8], i: usize, ns: &Namespace) -> Option<(u64, u64)> {
    let (slba, nlb) = dsm_range(data, i)?;
    Some((slba << ns.block_shift, u64::from(nlb) << ns.block_shift))
}

/// Checks Dataset Management data before any range is executed: it holds `nr` ranges (the
/// SGL length was checked when the command arrived; bytes after them are not read), and
/// every range that names blocks lies inside namespace `ns`. One bad range fails the command
/// with LBA Out of Range and nothing is changed (NVM Command Set 1.0 §3.2.3). A range of
/// length 0 names no block: it is neither checked nor executed.
pub fn dsm_check(data: &[u8], nr: u32, ns: &Namespace) -> Result<(), Status> {
    if nr == 0 || nr > DSM_RANGES_MAX || data.len() < nr as usize * DSM_RANGE_BYTES {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let nblocks = ns.nblocks();
    for i in 0..nr as usize {
        let Some((slba, nlb)) = dsm_range(data, i) else { return Err(Status::DATA_SGL_LENGTH_INVALID) };
        if nlb == 0 {
            continue;
        }
        match slba.checked_add(u64::from(nlb)) {
            Some(end) if end <= nblocks => {}
            _ => return Err(Status::LBA_OUT_OF_RANGE),
        }
    }
    Ok(())
}

/// Most bytes one Copy may copy (MCL, in blocks of the namespace): all of it is read into
/// one buffer before any of it is written, so sources that overlap the destination copy
/// as if read first, and one Copy holds at most this much buffer.
pub const COPY_BYTES_MAX: u64 = 1 << 20;

/// Most source ranges in one Copy (MSRC + 1): 4 KiB of range data.
pub const COPY_RANGES_MAX: u32 = 128;

/// The Copy limits a namespace advertises in Identify Namespace (MSSRL, MCL, MSRC), all
/// enforced by [`copy_ranges`]: `(mssrl, mcl, msrc)`.
pub fn copy_limits(ns: &Namespace) -> (u16, u32, u8) {
    let mcl = COPY_BYTES_MAX >> ns.block_shift;
    let mcl = u32::try_from(mcl).unwrap_or(u32::MAX);
    // MSSRL is a 16-bit count: a single range is never longer than the whole copy.
    let mssrl = u16::try_from(mcl).unwrap_or(u16::MAX);
    (mssrl, mcl, u8::try_from(COPY_RANGES_MAX - 1).unwrap_or(u8::MAX))
}

/// Checks a Copy's source ranges (`data`: `nr` format 0h entries) and its destination
/// against the namespace and the limits [`copy_limits`] advertises; returns the blocks to
/// copy. Nothing is read or written before this passes (NVM Command Set 1.0 §3.2.2:
/// Command Size Limit Exceeded for MSSRL and MCL, LBA Out of Range for any range).
pub fn copy_ranges(data: &[u8], ns: &Namespace, sdlba: u64) -> Result<u64, Status> {
    let (mssrl, mcl, _) = copy_limits(ns);
    let nblocks = ns.nblocks();
    let mut total = 0u64;
    for r in data.chunks_exact(RANGE_SIZE).map(SourceRange::decode) {
        if r.nlb > u32::from(mssrl) {
            return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
        }
        if r.slba.checked_add(u64::from(r.nlb)).is_none_or(|end| end > nblocks) {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        total += u64::from(r.nlb);
    }
    if total > u64::from(mcl) {
        return Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED);
    }
    if sdlba.checked_add(total).is_none_or(|end| end > nblocks) {
        return Err(Status::LBA_OUT_OF_RANGE);
    }
    Ok(total)
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

    fn ns_with(block_size: u32, readonly: bool) -> Namespace {
        let spec = NamespaceSpec {
            nsid: 1,
            backend: Backend::Null,
            size: Some(1 << 30),
            block_size,
            anagrpid: 1,
            uuid: None,
            readonly,
            ptpl_file: None,
        };
        Namespace::new("nqn.t", Nsid(1), spec).unwrap()
    }

    #[test]
    fn compare_and_verify_decode() {
        let (n, p) = (ns(), port());
        let c = Sqe::rw(io::COMPARE, Cid(1), Nsid(1), 16, 8, SglDescriptor::in_capsule(4096));
        let k = plan(&c, Some(&n), &p, 1 << 20).unwrap();
        assert_eq!(k, IoKind::Compare { offset: 16 * 512, len: 4096 });
        assert_eq!((k.h2c_len(), k.c2h_len()), (4096, 0), "the host sends the data to compare");
        let c = Sqe::rw(io::COMPARE, Cid(1), Nsid(1), 2047, 2, SglDescriptor::in_capsule(1024));
        assert_eq!(plan(&c, Some(&n), &p, 1 << 20), Err(Status::LBA_OUT_OF_RANGE));
        let c = Sqe::rw(io::COMPARE, Cid(1), Nsid(1), 0, 16, SglDescriptor::transport(8192));
        assert_eq!(plan(&c, Some(&n), &p, 4096), Err(Status::INVALID_FIELD), "beyond MDTS");
        assert_eq!(plan(&c, None, &p, 1 << 20), Err(Status::INVALID_NS));

        // Verify moves no data, so MDTS does not limit it; a read-only namespace may verify.
        let v = Sqe::verify(Cid(1), Nsid(1), 0, 2048);
        let k = plan(&v, Some(&ns_with(512, true)), &p, 4096).unwrap();
        assert_eq!(k, IoKind::Verify { offset: 0, len: 1 << 20, fua: false });
        assert_eq!((k.h2c_len(), k.c2h_len(), k.stats_direction()), (0, 0, None));
        let v = Sqe::verify(Cid(1), Nsid(1), 1, 2048);
        assert_eq!(plan(&v, Some(&n), &p, 4096), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(crate::reservation::group(io::COMPARE), crate::reservation::Group::Read);
        assert_eq!(crate::reservation::group(io::VERIFY), crate::reservation::Group::Read);
    }

    #[test]
    fn copy_decode_and_limits() {
        let (n, p) = (ns(), port());
        let c = Sqe::copy(Cid(1), Nsid(1), 100, 3, SglDescriptor::in_capsule(96));
        let k = plan(&c, Some(&n), &p, 1 << 20).unwrap();
        assert_eq!(k, IoKind::Copy { sdlba: 100, nr: 3, len: 0, fua: false });
        assert_eq!((k.h2c_len(), k.c2h_len()), (96, 0));
        assert_eq!(crate::reservation::group(io::COPY), crate::reservation::Group::Write);
        let c128 = Sqe::copy(Cid(1), Nsid(1), 0, 128, SglDescriptor::in_capsule(4096));
        assert!(plan(&c128, Some(&n), &p, 1 << 20).is_ok(), "MSRC 127 is 128 ranges");
        let c129 = Sqe::copy(Cid(1), Nsid(1), 0, 129, SglDescriptor::in_capsule(4128));
        assert_eq!(plan(&c129, Some(&n), &p, 1 << 20), Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED));
        let mut f1 = c;
        f1.set_cdw(12, f1.cdw(12) | (1 << 8));
        assert_eq!(plan(&f1, Some(&n), &p, 1 << 20), Err(Status::INVALID_FIELD), "format 1h is not offered");
        assert_eq!(plan(&c, Some(&ns_with(512, true)), &p, 1 << 20), Err(Status::NS_WRITE_PROTECTED));

        // 512-byte blocks: MCL 2048 blocks (1 MiB), MSSRL the same, MSRC 127; 4 KiB: 256.
        assert_eq!(copy_limits(&n), (2048, 2048, 127));
        assert_eq!(copy_limits(&ns_with(4096, false)), (256, 256, 127));
        assert_eq!(copy_limits(&ns_with(65536, false)), (16, 16, 127));
        let r = |slba, nlb| SourceRange { slba, nlb };
        let d = SourceRange::encode_list(&[r(0, 8), r(2040, 8)]);
        assert_eq!(copy_ranges(&d, &n, 100), Ok(16));
        assert_eq!(copy_ranges(&d, &n, 2032), Ok(16), "the destination may end at the last block");
        assert_eq!(copy_ranges(&d, &n, 2033), Err(Status::LBA_OUT_OF_RANGE), "destination");
        assert_eq!(copy_ranges(&d, &n, u64::MAX), Err(Status::LBA_OUT_OF_RANGE));
        let d = SourceRange::encode_list(&[r(0, 8), r(2041, 8)]);
        assert_eq!(copy_ranges(&d, &n, 0), Err(Status::LBA_OUT_OF_RANGE), "a source");
        let d = SourceRange::encode_list(&[r(u64::MAX, 1)]);
        assert_eq!(copy_ranges(&d, &n, 0), Err(Status::LBA_OUT_OF_RANGE));
        let big = ns_with(512, false);
        let d = SourceRange::encode_list(&[r(0, 2049)]);
        assert_eq!(copy_ranges(&d, &big, 10_000), Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED), "MSSRL");
        let d = SourceRange::encode_list(&[r(0, 2048), r(5000, 1)]);
        assert_eq!(copy_ranges(&d, &big, 10_000), Err(Status::COMMAND_SIZE_LIMIT_EXCEEDED), "MCL");
        let d = SourceRange::encode_list(&[r(0, 2047), r(5000, 1)]);
        assert_eq!(copy_ranges(&d, &big, 10_000), Ok(2048));
    }

    #[test]
    fn write_blocks_for_range_locks() {
        let n = ns();
        let w = IoKind::Write { offset: 8 * 512, len: 4096, fua: false };
        assert_eq!(w.write_blocks(&n), Some(8..16));
        let z = IoKind::WriteZeroes { offset: 0, len: 512, deallocate: true, fua: false };
        assert_eq!(z.write_blocks(&n), Some(0..1));
        assert_eq!(IoKind::Dsm { nr: 1, len: 16, deallocate: true }.write_blocks(&n), Some(0..2048));
        assert_eq!(IoKind::Dsm { nr: 1, len: 16, deallocate: false }.write_blocks(&n), None);
        assert_eq!(IoKind::Read { offset: 0, len: 512 }.write_blocks(&n), None);
        assert_eq!(IoKind::Compare { offset: 0, len: 512 }.write_blocks(&n), None);
    }

    fn range(d: &mut [u8], i: usize, slba: u64, nlb: u32) {
        let r = &mut d[i * 16..i * 16 + 16];
        r[0..4].copy_from_slice(&0xdead_beefu32.to_le_bytes()); // context attributes: hints
        r[4..8].copy_from_slice(&nlb.to_le_bytes());
        r[8..16].copy_from_slice(&slba.to_le_bytes());
    }

    #[test]
    fn dsm() {
        let n = ns();
        let mut d = [0u8; 48];
        range(&mut d, 0, 16, 8);
        range(&mut d, 1, 2040, 8);
        range(&mut d, 2, 5000, 1);
        assert_eq!(dsm_check(&d[..32], 2, &n), Ok(()));
        assert_eq!(dsm_bytes(&d, 0, &n), Some((16 * 512, 8 * 512)));
        assert_eq!(dsm_range(&d, 1), Some((2040, 8)));
        assert_eq!(dsm_range(&d, 3), None);
        // The third range ends past the namespace: the whole command is refused.
        assert_eq!(dsm_check(&d, 3, &n), Err(Status::LBA_OUT_OF_RANGE));
        range(&mut d, 2, u64::MAX, 2);
        assert_eq!(dsm_check(&d, 3, &n), Err(Status::LBA_OUT_OF_RANGE));
        // A range of length 0 names no block, wherever it starts.
        range(&mut d, 2, u64::MAX, 0);
        assert_eq!(dsm_check(&d, 3, &n), Ok(()));
        // Less data than NR x 16; more is fine (only NR ranges are read: the third range,
        // out of the namespace, is not looked at with NR = 2).
        assert_eq!(dsm_check(&d[..32], 3, &n), Err(Status::DATA_SGL_LENGTH_INVALID));
        range(&mut d, 2, 5000, 1);
        assert_eq!(dsm_check(&d, 2, &n), Ok(()));
        assert_eq!(dsm_check(&[], 0, &n), Err(Status::DATA_SGL_LENGTH_INVALID));
    }

    #[test]
    fn dsm_and_write_zeroes_decoding() {
        let n = ns();
        let p = port();
        let mut s = Sqe::dsm_deallocate(Cid(1), Nsid(1), 256, SglDescriptor::transport(4096));
        assert_eq!(plan(&s, Some(&n), &p, 1 << 20), Ok(IoKind::Dsm { nr: 256, len: 4096, deallocate: true }));
        assert_eq!(IoKind::Dsm { nr: 256, len: 4096, deallocate: true }.h2c_len(), 4096);
        s.set_cdw(11, 0b011); // IDR | IDW: hints only
        assert_eq!(plan(&s, Some(&n), &p, 1 << 20), Ok(IoKind::Dsm { nr: 256, len: 4096, deallocate: false }));
        // Linux: one range in a 4096-byte buffer.
        let one = Sqe::dsm_deallocate(Cid(1), Nsid(1), 1, SglDescriptor::in_capsule(4096));
        assert_eq!(plan(&one, Some(&n), &p, 1 << 20), Ok(IoKind::Dsm { nr: 1, len: 4096, deallocate: true }));
        // Less than NR x 16, or more than 256 ranges' room.
        let short = Sqe::dsm_deallocate(Cid(1), Nsid(1), 3, SglDescriptor::in_capsule(32));
        assert_eq!(plan(&short, Some(&n), &p, 1 << 20), Err(Status::DATA_SGL_LENGTH_INVALID));
        let long = Sqe::dsm_deallocate(Cid(1), Nsid(1), 3, SglDescriptor::transport(4112));
        assert_eq!(plan(&long, Some(&n), &p, 1 << 20), Err(Status::DATA_SGL_LENGTH_INVALID));
        let mut w = Sqe::write_zeroes(Cid(1), Nsid(1), 8, 16, true);
        w.set_fua(true);
        assert_eq!(
            plan(&w, Some(&n), &p, 1 << 20),
            Ok(IoKind::WriteZeroes { offset: 8 * 512, len: 16 * 512, deallocate: true, fua: true })
        );
    }
}
