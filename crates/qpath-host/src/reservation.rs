//! Namespace reservation commands (NVMe Base 2.x §8.19, §7.x Reservation Register /
//! Acquire / Release / Report) for a user queue pair ([`crate::passthru::QueuePair`]): the
//! commands built with their data, and the extended report read back. Linux offers the
//! same to its users through the block device's `pr_ops` and nvme-cli's `resv-*`.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use qpath_host::passthru::QueuePair;
//! # use qpath_host::reservation::{self, ReservationStatus, WRITE_EXCLUSIVE};
//! # fn f(qp: &mut QueuePair) -> Result<(), Box<dyn std::error::Error>> {
//! let nsid = nvme::Nsid(1);
//! let c = reservation::register(nsid, reservation::REGISTER, 0, 0xabc1, false);
//! let done = qp.execute(c.sqe, Some(c.data), c.len, c.dir, Duration::from_secs(5))?;
//! assert!(done.cqe.status.is_success());
//! let c = reservation::acquire(nsid, reservation::ACQUIRE, WRITE_EXCLUSIVE, 0xabc1, 0);
//! qp.execute(c.sqe, Some(c.data), c.len, c.dir, Duration::from_secs(5))?;
//! let c = reservation::report(nsid, 4096);
//! let done = qp.execute(c.sqe, Some(c.data), c.len, c.dir, Duration::from_secs(5))?;
//! let status = ReservationStatus::parse(done.buf.as_deref().unwrap_or(&[]));
//! # Ok(()) }
//! ```

use nvme::opcode::io;
use nvme::{Nsid, Sqe};
use uring::IoBuf;

use crate::queue::DataDir;

pub use nvme::reservation::*;

/// A reservation command ready for [`crate::passthru::QueuePair::execute`] or `submit`.
#[derive(Debug)]
pub struct Command {
    /// The submission entry.
    pub sqe: Sqe,
    /// Its data: the keys going out, or room for the report coming back.
    pub data: IoBuf,
    /// Data bytes.
    pub len: u32,
    /// Data direction.
    pub dir: DataDir,
}

impl Command {
    /// A Register's CPTPL (CDW10 31:30): 0 no change, 2 persistence through power loss off,
    /// 3 on (the namespace must be PTPL capable: Identify Namespace RESCAP bit 0).
    #[must_use]
    pub fn cptpl(mut self, cptpl: u8) -> Command {
        let cdw10 = self.sqe.cdw(10) & !(0b11 << 30);
        self.sqe.set_cdw(10, cdw10 | u32::from(cptpl & 0b11) << 30);
        self
    }
}

fn with_keys(opcode: u8, nsid: Nsid, cdw10: u32, keys: &[u64]) -> Command {
    let len = keys.len() * 8;
    let mut data = IoBuf::new(4096);
    data.set_len(len);
    for (k, out) in keys.iter().zip(data.chunks_exact_mut(8)) {
        out.copy_from_slice(&k.to_le_bytes());
    }
    let mut sqe = Sqe::new(opcode);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cdw10);
    Command { sqe, data, len: u32::try_from(len).unwrap_or(16), dir: DataDir::ToController }
}

/// Reservation Register: `action` is [`REGISTER`], [`UNREGISTER`] or [`REPLACE`];
/// `ignore_key` skips the current key's check (unregister, replace).
pub fn register(nsid: Nsid, action: u8, crkey: u64, nrkey: u64, ignore_key: bool) -> Command {
    let cdw10 = u32::from(action & 7) | u32::from(ignore_key) << 3;
    with_keys(io::RESV_REGISTER, nsid, cdw10, &[crkey, nrkey])
}

/// Reservation Acquire: `action` is [`ACQUIRE`], [`PREEMPT`] or [`PREEMPT_AND_ABORT`].
pub fn acquire(nsid: Nsid, action: u8, rtype: u8, crkey: u64, prkey: u64) -> Command {
    let cdw10 = u32::from(action & 7) | u32::from(rtype) << 8;
    with_keys(io::RESV_ACQUIRE, nsid, cdw10, &[crkey, prkey])
}

/// Reservation Release: `action` is [`RELEASE`] or [`CLEAR`].
pub fn release(nsid: Nsid, action: u8, rtype: u8, crkey: u64) -> Command {
    let cdw10 = u32::from(action & 7) | u32::from(rtype) << 8;
    with_keys(io::RESV_RELEASE, nsid, cdw10, &[crkey])
}

/// Reservation Report, extended data structure (128-bit Host Identifiers), `bytes` long
/// (a multiple of 4, at least 64: the header, then 64 bytes per registrant).
pub fn report(nsid: Nsid, bytes: u32) -> Command {
    let bytes = bytes.max(64) & !3;
    let mut sqe = Sqe::new(io::RESV_REPORT);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, bytes / 4 - 1);
    sqe.set_cdw(11, 1);
    let data = IoBuf::new(usize::try_from(bytes).unwrap_or(4096).next_multiple_of(4096));
    Command { sqe, data, len: bytes, dir: DataDir::FromController }
}

/// One registrant of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrant {
    /// Controller ID (0xffff: a dynamic controller model, the registration is the host's).
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holds: bool,
    /// Its reservation key.
    pub rkey: u64,
    /// Its Host Identifier.
    pub hostid: [u8; 16],
}

/// The extended Reservation Status data structure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationStatus {
    /// GEN: bumped by every successful Register, preempt and Clear.
    pub generation: u32,
    /// RTYPE: the reservation's type, 0 when none is held.
    pub rtype: u8,
    /// REGCTL: how many registrants there are (`registrants` may hold fewer when the
    /// report was shorter than they need).
    pub regctl: u16,
    /// PTPLS: reservations persist through power loss.
    pub ptpls: bool,
    /// The registrants that fit in the report.
    pub registrants: Vec<Registrant>,
}

impl ReservationStatus {
    /// Reads a report; `None` when shorter than its 64-byte header.
    pub fn parse(b: &[u8]) -> Option<ReservationStatus> {
        let h = b.get(..REPORT_HEADER)?;
        let regctl = u16::from_le_bytes([h[5], h[6]]);
        let registrants = b[REPORT_HEADER..]
            .chunks_exact(REPORT_ENTRY)
            .take(usize::from(regctl))
            .map(|e| Registrant {
                cntlid: u16::from_le_bytes([e[0], e[1]]),
                holds: e[2] & 1 == 1,
                rkey: u64::from_le_bytes(e[8..16].try_into().unwrap_or([0; 8])),
                hostid: e[16..32].try_into().unwrap_or([0; 16]),
            })
            .collect();
        Some(ReservationStatus {
            generation: u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
            rtype: h[4],
            regctl,
            ptpls: h[9] & 1 == 1,
            registrants,
        })
    }

    /// The registrant holding the reservation, if any (the first, for the All Registrants
    /// types, where every registrant holds it).
    pub fn holder(&self) -> Option<&Registrant> {
        self.registrants.iter().find(|r| r.holds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_carry_their_fields_and_keys() {
        assert_eq!(register(Nsid(1), REGISTER, 0, 1, false).cptpl(3).sqe.cdw(10), 3 << 30);
        let c = register(Nsid(3), REPLACE, 0x1122, 0x3344, true);
        assert_eq!((c.sqe.opcode(), c.sqe.nsid(), c.sqe.cdw(10), c.len), (0x0d, Nsid(3), 2 | 1 << 3, 16));
        assert_eq!(&c.data[..16], &[0x22, 0x11, 0, 0, 0, 0, 0, 0, 0x44, 0x33, 0, 0, 0, 0, 0, 0]);
        let c = acquire(Nsid(1), PREEMPT, EXCLUSIVE_ACCESS, 5, 6);
        assert_eq!((c.sqe.opcode(), c.sqe.cdw(10), c.len), (0x11, 1 | 2 << 8, 16));
        let c = release(Nsid(1), CLEAR, 0, 5);
        assert_eq!((c.sqe.opcode(), c.sqe.cdw(10), c.len, c.dir), (0x15, 1, 8, DataDir::ToController));
        let c = report(Nsid(1), 1000);
        assert_eq!((c.sqe.opcode(), c.sqe.cdw(10), c.sqe.cdw(11), c.len), (0x0e, 249, 1, 1000));
        assert_eq!(report(Nsid(1), 10).len, 64, "at least the header");
    }

    #[test]
    fn a_report_reads_back_its_registrants_and_holder() {
        let mut b = vec![0u8; 64 + 3 * 64];
        b[0..4].copy_from_slice(&7u32.to_le_bytes());
        b[4] = WRITE_EXCLUSIVE;
        b[5] = 3; // three registrants, two fit below
        for (i, e) in b[64..].chunks_exact_mut(64).take(2).enumerate() {
            e[0..2].copy_from_slice(&0xffffu16.to_le_bytes());
            e[2] = u8::from(i == 1);
            e[8..16].copy_from_slice(&(0x10 + i as u64).to_le_bytes());
            e[16..32].copy_from_slice(&[u8::try_from(i).unwrap(); 16]);
        }
        let s = ReservationStatus::parse(&b[..64 + 2 * 64]).unwrap();
        assert_eq!((s.generation, s.rtype, s.regctl, s.ptpls, s.registrants.len()), (7, 1, 3, false, 2));
        assert_eq!(s.holder(), Some(&Registrant { cntlid: 0xffff, holds: true, rkey: 0x11, hostid: [1; 16] }));
        assert!(ReservationStatus::parse(&b[..63]).is_none());
    }
}
