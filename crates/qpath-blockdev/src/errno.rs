//! What an application sees when an NVMe command fails: the errno Linux's own NVMe host
//! would give for the same status (`nvme_error_status` in `drivers/nvme/host/core.c`, then
//! `blk_status_to_errno` in `block/blk-core.c`), and the NBD error a client gets.
//!
//! ```text
//!   NVMe status                       Linux blk_status_t     errno        NBD error
//!   success                           BLK_STS_OK             0            0
//!   Capacity Exceeded                 BLK_STS_NOSPC          ENOSPC       NBD_ENOSPC
//!   LBA Out of Range, Namespace Not   BLK_STS_TARGET         EREMOTEIO    NBD_EINVAL
//!     Ready, Command Interrupted
//!   Invalid Opcode / Field / NS       BLK_STS_NOTSUPP        EOPNOTSUPP   NBD_ENOTSUP
//!   Write Fault, Unrecovered Read     BLK_STS_MEDIUM         ENODATA      NBD_EIO
//!     Error, Access Denied, Compare
//!     Failure, Attempted Write to
//!     Read Only Range
//!   Reservation Conflict              BLK_STS_RESV_CONFLICT  EBADE        NBD_EPERM
//!   Namespace is Write Protected      BLK_STS_IOERR          EIO          NBD_EPERM
//!   no usable path any more           (bio_io_error)         EIO          NBD_EIO
//!   anything else                     BLK_STS_IOERR          EIO          NBD_EIO
//! ```
//!
//! An I/O the host's context refuses before sending it (its device's namespace was
//! removed, or another namespace is under its NSID; a range past the end) gets the
//! status of [`refusal_status`]: EIO, as Linux fails a bio of a disk it removed
//! (`bio_queue_enter` finds the disk dead and ends the bio with `bio_io_error`) or one
//! past a disk's end (`bio_check_eod`). Not ENODEV: that is what opening a removed disk's
//! node gives, not its I/O, and NBD has no such error value.
//!
//! "No usable path any more" is the status the host's context completes an I/O with once
//! every path is gone for longer than `fast_io_fail_tmo` / `ctrl_loss_tmo`
//! (`Status::HOST_PATH_ERROR` with the context's own meaning): Linux's multipath head fails
//! such a bio with `bio_io_error` (EIO) in `nvme_ns_head_submit_bio`, not with the
//! transport status a controller would send.

use nvme::{Sct, Status};

/// Linux errno values (asm-generic/errno-base.h, errno.h), as positive numbers.
pub mod linux {
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// No space left on device.
    pub const ENOSPC: i32 = 28;
    /// Invalid exchange: a reservation conflict (`BLK_STS_RESV_CONFLICT`).
    pub const EBADE: i32 = 52;
    /// No data available: a medium error (`BLK_STS_MEDIUM`).
    pub const ENODATA: i32 = 61;
    /// Illegal byte sequence: a protection information error (`BLK_STS_PROTECTION`).
    pub const EILSEQ: i32 = 84;
    /// Operation not supported (`BLK_STS_NOTSUPP`).
    pub const EOPNOTSUPP: i32 = 95;
    /// Remote I/O error: the target refused the range (`BLK_STS_TARGET`).
    pub const EREMOTEIO: i32 = 121;
    /// No such device: a ublk I/O command aborted (`UBLK_IO_RES_ABORT`).
    pub const ENODEV: i32 = 19;
}

/// The status an I/O gets when the host's context refuses it before sending it
/// (`kind`: its error's kind): a device whose namespace is gone fails as a device with no
/// path left (EIO, NBD_EIO, "no path to the namespace"), as the requests of that device
/// that were waiting do; any other refusal as an internal error (EIO).
pub fn refusal_status(kind: host::ErrorKind) -> Status {
    match kind {
        host::ErrorKind::NamespaceGone => Status::HOST_PATH_ERROR,
        _ => Status::INTERNAL,
    }
}

/// NBD error values (the NBD protocol document, "Error values").
pub mod nbd {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Cannot allocate memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left on device.
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported.
    pub const ENOTSUP: u32 = 95;
    /// Server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// The errno (positive; 0 for success) Linux's NVMe host would give an application for a
/// command that completed with `status`.
pub fn errno_of(status: Status) -> i32 {
    if status.is_success() {
        return 0;
    }
    match (status.sct, status.sc) {
        // Generic: Capacity Exceeded.
        (Sct::Generic, 0x81) => linux::ENOSPC,
        // Generic: LBA Out of Range, Namespace Not Ready, Command Interrupted.
        (Sct::Generic, 0x80 | 0x82 | 0x21) => linux::EREMOTEIO,
        // Generic: Invalid Opcode, Invalid Field, Invalid Namespace; command specific:
        // Conflicting Attributes (0x80), ONCS not supported is reported the same way.
        (Sct::Generic, 0x01 | 0x02 | 0x0b) | (Sct::CommandSpecific, 0x80) => linux::EOPNOTSUPP,
        // Reservation Conflict.
        (Sct::Generic, 0x83) => linux::EBADE,
        // Command specific: Attempted Write to Read Only Range (0x82); media: Write Fault,
        // Unrecovered Read Error, Compare Failure, Access Denied, Deallocated or Unwritten
        // Logical Block.
        (Sct::CommandSpecific, 0x82) | (Sct::Media, 0x80 | 0x81 | 0x85 | 0x86 | 0x87) => linux::ENODATA,
        // Command specific: Invalid Protection Information; media: guard, application tag
        // and reference tag check errors.
        (Sct::CommandSpecific, 0x81) | (Sct::Media, 0x82..=0x84) => linux::EILSEQ,
        _ => linux::EIO,
    }
}

/// The NBD error (0 for success) a client gets for a command that completed with `status`.
/// NBD has only eight error values; a reservation conflict or a write-protected namespace
/// is "operation not permitted", a refused range "invalid argument".
pub fn nbd_error_of(status: Status) -> u32 {
    if status == Status::NS_WRITE_PROTECTED.with_dnr(status.dnr) {
        return nbd::EPERM;
    }
    match errno_of(status) {
        0 => 0,
        linux::ENOSPC => nbd::ENOSPC,
        linux::EREMOTEIO => nbd::EINVAL,
        linux::EOPNOTSUPP => nbd::ENOTSUP,
        linux::EBADE => nbd::EPERM,
        _ => nbd::EIO,
    }
}

/// A short human-readable reason for an NBD structured error chunk.
pub fn reason_of(status: Status) -> &'static str {
    match errno_of(status) {
        0 => "success",
        linux::ENOSPC => "capacity exceeded",
        linux::EREMOTEIO => "the target refused the range",
        linux::EOPNOTSUPP => "not supported by the namespace",
        linux::EBADE => "reservation conflict: another host holds the namespace",
        linux::ENODATA => "medium error",
        linux::EILSEQ => "protection information error",
        _ if status == Status::HOST_PATH_ERROR.with_dnr(status.dnr) => "no path to the namespace",
        _ if status == Status::NS_WRITE_PROTECTED.with_dnr(status.dnr) => "the namespace is write protected",
        _ => "I/O error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_conflict_is_ebade_as_linux_gives_it() {
        assert_eq!(errno_of(Status::RESERVATION_CONFLICT), linux::EBADE);
        assert_eq!(nbd_error_of(Status::RESERVATION_CONFLICT), nbd::EPERM);
    }

    #[test]
    fn each_row_of_the_table() {
        assert_eq!(errno_of(Status::SUCCESS), 0);
        assert_eq!(errno_of(Status::CAPACITY_EXCEEDED), linux::ENOSPC);
        assert_eq!(errno_of(Status::LBA_OUT_OF_RANGE), linux::EREMOTEIO);
        assert_eq!(errno_of(Status::NS_NOT_READY), linux::EREMOTEIO);
        assert_eq!(errno_of(Status::INVALID_OPCODE), linux::EOPNOTSUPP);
        assert_eq!(errno_of(Status::INVALID_FIELD), linux::EOPNOTSUPP);
        assert_eq!(errno_of(Status::INVALID_NS), linux::EOPNOTSUPP);
        assert_eq!(errno_of(Status::WRITE_FAULT), linux::ENODATA);
        assert_eq!(errno_of(Status::UNRECOVERED_READ_ERROR), linux::ENODATA);
        assert_eq!(errno_of(Status::COMPARE_FAILURE), linux::ENODATA);
        assert_eq!(errno_of(Status::ACCESS_DENIED), linux::ENODATA);
        assert_eq!(errno_of(Status::HOST_PATH_ERROR), linux::EIO);
        assert_eq!(errno_of(Status::INTERNAL), linux::EIO);
        assert_eq!(errno_of(Status::NS_WRITE_PROTECTED), linux::EIO);
        assert_eq!(nbd_error_of(Status::NS_WRITE_PROTECTED), nbd::EPERM);
        assert_eq!(nbd_error_of(Status::LBA_OUT_OF_RANGE), nbd::EINVAL);
        assert_eq!(nbd_error_of(Status::HOST_PATH_ERROR), nbd::EIO);
        assert_eq!(nbd_error_of(Status::SUCCESS), 0);
    }

    #[test]
    fn an_io_to_a_namespace_removed_or_replaced_fails_eio_as_linux_fails_a_removed_disks() {
        let s = refusal_status(host::ErrorKind::NamespaceGone);
        assert_eq!((errno_of(s), nbd_error_of(s)), (linux::EIO, nbd::EIO));
        assert_eq!(reason_of(s), "no path to the namespace");
        // Other refusals: EIO too (an internal error), with their own reason.
        let s = refusal_status(host::ErrorKind::Invalid);
        assert_eq!((errno_of(s), nbd_error_of(s), reason_of(s)), (linux::EIO, nbd::EIO, "I/O error"));
    }

    #[test]
    fn dnr_does_not_change_the_errno() {
        assert_eq!(errno_of(Status::RESERVATION_CONFLICT.with_dnr(false)), linux::EBADE);
        assert_eq!(errno_of(Status::HOST_PATH_ERROR.with_dnr(true)), linux::EIO);
    }
}
