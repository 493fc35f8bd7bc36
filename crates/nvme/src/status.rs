//! Completion status: the Status Field of a CQE (NVMe 2.0 §4.2.3).
//!
//! An NVMe status is a value that goes on the wire, not a Rust error: target
//! code returns a [`Status`] for every failed command, and host code inspects
//! the one it received to decide between retrying on another path
//! ([`Status::is_path_error`]) and completing the I/O with an error.

use core::fmt;

/// Status Code Type (bits 11:9 of the status field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Sct {
    /// Generic command status.
    Generic = 0,
    /// Command specific status.
    CommandSpecific = 1,
    /// Media and data integrity errors.
    Media = 2,
    /// Path related status (ANA, transport).
    Path = 3,
    /// Reserved value, kept as received.
    Reserved4 = 4,
    /// Reserved value, kept as received.
    Reserved5 = 5,
    /// Reserved value, kept as received.
    Reserved6 = 6,
    /// Vendor specific.
    Vendor = 7,
}

impl Sct {
    fn from_bits(v: u8) -> Sct {
        match v & 7 {
            0 => Sct::Generic,
            1 => Sct::CommandSpecific,
            2 => Sct::Media,
            3 => Sct::Path,
            4 => Sct::Reserved4,
            5 => Sct::Reserved5,
            6 => Sct::Reserved6,
            _ => Sct::Vendor,
        }
    }
}

/// A command's completion status.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status code type.
    pub sct: Sct,
    /// Status code, interpreted within `sct`.
    pub sc: u8,
    /// Command retry delay index (0 = none, 1..3 = CRDT1..3).
    pub crd: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

macro_rules! statuses {
    ($($(#[$doc:meta])* $name:ident = ($sct:ident, $sc:expr, $dnr:expr);)*) => {
        impl Status {
            $($(#[$doc])* pub const $name: Status = Status { sct: Sct::$sct, sc: $sc, crd: 0, dnr: $dnr };)*
        }
        /// Every named status code: command specific codes are reused by different
        /// commands, so one code may have several names.
        const NAMES: &[(Sct, u8, &str)] = &[$((Sct::$sct, $sc, stringify!($name)),)*];
    };
}

statuses! {
    /// Successful completion.
    SUCCESS = (Generic, 0x00, false);
    /// Invalid Command Opcode.
    INVALID_OPCODE = (Generic, 0x01, true);
    /// Invalid Field in Command.
    INVALID_FIELD = (Generic, 0x02, true);
    /// Command ID Conflict.
    CID_CONFLICT = (Generic, 0x03, true);
    /// Data Transfer Error.
    DATA_TRANSFER_ERROR = (Generic, 0x04, false);
    /// Internal Error.
    INTERNAL = (Generic, 0x06, false);
    /// Command Abort Requested.
    ABORT_REQUESTED = (Generic, 0x07, false);
    /// Command Aborted due to SQ Deletion.
    ABORT_SQ_DELETED = (Generic, 0x08, false);
    /// Command Aborted due to Failed Fused Command: the other command of the fused
    /// operation failed (a Compare and Write's Write after a miscompare).
    FUSED_FAILED = (Generic, 0x09, true);
    /// Command Aborted due to Missing Fused Command: the adjacent submission queue entry
    /// does not hold the other command of the fused operation.
    FUSED_MISSING = (Generic, 0x0a, true);
    /// Invalid Namespace or Format.
    INVALID_NS = (Generic, 0x0b, true);
    /// Command Sequence Error.
    COMMAND_SEQUENCE_ERROR = (Generic, 0x0c, true);
    /// Invalid SGL Segment Descriptor.
    INVALID_SGL_SEGMENT = (Generic, 0x0d, true);
    /// Data SGL Length Invalid.
    DATA_SGL_LENGTH_INVALID = (Generic, 0x0f, true);
    /// SGL Descriptor Type Invalid.
    SGL_DESCRIPTOR_TYPE_INVALID = (Generic, 0x11, true);
    /// SGL Offset Invalid.
    SGL_OFFSET_INVALID = (Generic, 0x16, true);
    /// Host Identifier Inconsistent Format (a Reservation Report without the extended
    /// structure from a host with a 128-bit Host Identifier).
    HOST_ID_INCONSISTENT = (Generic, 0x18, true);
    /// Keep Alive Timer Expired.
    KEEP_ALIVE_EXPIRED = (Generic, 0x19, false);
    /// Keep Alive Timeout Invalid.
    KEEP_ALIVE_INVALID = (Generic, 0x1a, true);
    /// Namespace is Write Protected.
    NS_WRITE_PROTECTED = (Generic, 0x20, true);
    /// Command Interrupted: retry.
    COMMAND_INTERRUPTED = (Generic, 0x21, false);
    /// Transient Transport Error.
    TRANSIENT_TRANSPORT_ERROR = (Generic, 0x22, false);
    /// LBA Out of Range.
    LBA_OUT_OF_RANGE = (Generic, 0x80, true);
    /// Capacity Exceeded.
    CAPACITY_EXCEEDED = (Generic, 0x81, true);
    /// Namespace Not Ready.
    NS_NOT_READY = (Generic, 0x82, false);
    /// Reservation Conflict.
    RESERVATION_CONFLICT = (Generic, 0x83, true);
    /// Invalid Queue Identifier.
    INVALID_QID = (CommandSpecific, 0x01, true);
    /// Invalid Queue Size.
    INVALID_QUEUE_SIZE = (CommandSpecific, 0x02, true);
    /// Asynchronous Event Request Limit Exceeded.
    AER_LIMIT_EXCEEDED = (CommandSpecific, 0x05, true);
    /// Invalid Log Page.
    INVALID_LOG_PAGE = (CommandSpecific, 0x09, true);
    /// Feature Identifier Not Saveable.
    FEATURE_NOT_SAVEABLE = (CommandSpecific, 0x0d, true);
    /// Feature Not Changeable.
    FEATURE_NOT_CHANGEABLE = (CommandSpecific, 0x0e, true);
    /// Feature Not Namespace Specific.
    FEATURE_NOT_NS_SPECIFIC = (CommandSpecific, 0x0f, true);
    /// Connect: Incompatible Format.
    CONNECT_INCOMPATIBLE_FORMAT = (CommandSpecific, 0x80, true);
    /// Connect: Controller Busy.
    CONNECT_CONTROLLER_BUSY = (CommandSpecific, 0x81, false);
    /// Connect: Invalid Parameters (the CQE's DW0 says which, see [`crate::fabrics::ConnectInvalid`]).
    CONNECT_INVALID_PARAMETERS = (CommandSpecific, 0x82, true);
    /// Connect: Restart Discovery.
    CONNECT_RESTART_DISCOVERY = (CommandSpecific, 0x83, true);
    /// Connect: Invalid Host (host NQN not allowed).
    CONNECT_INVALID_HOST = (CommandSpecific, 0x84, true);
    /// Command Size Limit Exceeded: a Copy with more source ranges than MSRC allows, a
    /// range longer than MSSRL or more blocks in all than MCL (NVM Command Set 1.0 §3.2.2).
    COMMAND_SIZE_LIMIT_EXCEEDED = (CommandSpecific, 0x83, true);
    /// Abort Command Limit Exceeded: more Abort commands outstanding than ACL allows.
    ABORT_COMMAND_LIMIT_EXCEEDED = (CommandSpecific, 0x03, true);
    /// Authentication Required.
    AUTH_REQUIRED = (CommandSpecific, 0x91, true);
    /// Write Fault.
    WRITE_FAULT = (Media, 0x80, false);
    /// Unrecovered Read Error.
    UNRECOVERED_READ_ERROR = (Media, 0x81, false);
    /// Compare Failure.
    COMPARE_FAILURE = (Media, 0x85, true);
    /// Access Denied.
    ACCESS_DENIED = (Media, 0x86, true);
    /// Internal Path Error.
    INTERNAL_PATH_ERROR = (Path, 0x00, false);
    /// Asymmetric Access Persistent Loss.
    ANA_PERSISTENT_LOSS = (Path, 0x01, false);
    /// Asymmetric Access Inaccessible.
    ANA_INACCESSIBLE = (Path, 0x02, false);
    /// Asymmetric Access Transition.
    ANA_TRANSITION = (Path, 0x03, false);
    /// Controller Pathing Error.
    CONTROLLER_PATH_ERROR = (Path, 0x60, false);
    /// Host Pathing Error (used by a host for transport failures).
    HOST_PATH_ERROR = (Path, 0x70, false);
    /// Command Aborted By Host.
    ABORTED_BY_HOST = (Path, 0x71, false);
}

impl Status {
    /// Decodes the 15 status bits of a CQE's status half-word (bit 0 is the phase tag).
    /// The More bit (14 here) is not part of what a status is: [`crate::Cqe::more`] has it.
    pub fn from_wire(raw: u16) -> Status {
        let v = raw >> 1;
        Status {
            sc: (v & 0xff) as u8,
            sct: Sct::from_bits(((v >> 8) & 7) as u8),
            crd: ((v >> 11) & 3) as u8,
            dnr: v & (1 << 14) != 0,
        }
    }

    /// Encodes into a CQE's status half-word with the phase tag and the More bit cleared
    /// (NVMe/TCP does not use the phase tag; [`crate::Cqe::encode`] sets More).
    pub fn to_wire(self) -> u16 {
        let v = u16::from(self.sc)
            | (u16::from(self.sct as u8) << 8)
            | (u16::from(self.crd & 3) << 11)
            | (u16::from(self.dnr) << 14);
        v << 1
    }

    /// Whether the command succeeded.
    pub fn is_success(self) -> bool {
        self.sct == Sct::Generic && self.sc == 0
    }

    /// The same status with Do Not Retry set or cleared.
    pub fn with_dnr(mut self, dnr: bool) -> Status {
        self.dnr = dnr;
        self
    }

    /// An ANA status: the path cannot serve this namespace now.
    pub fn is_ana_error(self) -> bool {
        self.sct == Sct::Path && (0x01..=0x03).contains(&self.sc)
    }

    /// Whether another path may succeed where this one failed (Linux
    /// `nvme_is_path_error`: every path-related status, plus transport
    /// errors that a host maps to one).
    pub fn is_path_error(self) -> bool {
        self.sct == Sct::Path || self == Status::TRANSIENT_TRANSPORT_ERROR.with_dnr(self.dnr)
    }

    /// Whether a retry on the same path is allowed (DNR clear).
    pub fn is_retryable(self) -> bool {
        !self.is_success() && !self.dnr
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = NAMES.iter().filter(|(sct, sc, _)| *sct == self.sct && *sc == self.sc).map(|(_, _, n)| n);
        match names.next() {
            Some(n) => {
                write!(f, "{n}")?;
                // A command specific code shared by several commands: every name it has.
                for n in names {
                    write!(f, " or {n}")?;
                }
            }
            None => write!(f, "sct={:?} sc={:#04x}", self.sct, self.sc)?,
        }
        if self.dnr {
            write!(f, " (DNR)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip() {
        for s in [
            Status::SUCCESS,
            Status::INVALID_FIELD,
            Status::CONNECT_INVALID_PARAMETERS,
            Status::ANA_INACCESSIBLE,
            Status::LBA_OUT_OF_RANGE,
            Status::FUSED_FAILED,
            Status::FUSED_MISSING,
            Status::COMMAND_SIZE_LIMIT_EXCEEDED,
            Status::COMPARE_FAILURE,
        ] {
            assert_eq!(Status::from_wire(s.to_wire()), s);
        }
        // Linux NVME_SC_INVALID_FIELD | NVME_SC_DNR = 0x4002, shifted by the phase bit.
        assert_eq!(Status::INVALID_FIELD.to_wire(), 0x4002 << 1);
        // NVME_SC_ANA_INACCESSIBLE = 0x302.
        assert_eq!(Status::ANA_INACCESSIBLE.to_wire(), 0x302 << 1);
        // Linux NVME_SC_FUSED_FAIL 0x9, NVME_SC_FUSED_MISSING 0xa, NVME_SC_COMPARE_FAILED 0x285
        // and the command specific 0x183 (SPDK SPDK_NVME_SC_CMD_SIZE_LIMIT_SIZE_EXCEEDED), with DNR.
        assert_eq!(Status::FUSED_FAILED.to_wire(), 0x4009 << 1);
        assert_eq!(Status::FUSED_MISSING.to_wire(), 0x400a << 1);
        assert_eq!(Status::COMPARE_FAILURE.to_wire(), 0x4285 << 1);
        assert_eq!(Status::COMMAND_SIZE_LIMIT_EXCEEDED.to_wire(), 0x4183 << 1);
    }

    #[test]
    fn path_errors() {
        assert!(Status::ANA_TRANSITION.is_path_error());
        assert!(Status::ANA_TRANSITION.is_ana_error());
        assert!(Status::HOST_PATH_ERROR.is_path_error());
        assert!(!Status::HOST_PATH_ERROR.is_ana_error());
        assert!(Status::TRANSIENT_TRANSPORT_ERROR.is_path_error());
        assert!(!Status::LBA_OUT_OF_RANGE.is_path_error());
        assert!(!Status::LBA_OUT_OF_RANGE.is_retryable());
    }

    #[test]
    fn display_names() {
        assert_eq!(Status::LBA_OUT_OF_RANGE.to_string(), "LBA_OUT_OF_RANGE (DNR)");
        assert_eq!(
            Status::COMMAND_SIZE_LIMIT_EXCEEDED.to_string(),
            "CONNECT_RESTART_DISCOVERY or COMMAND_SIZE_LIMIT_EXCEEDED (DNR)"
        );
        let odd = Status { sct: Sct::Vendor, sc: 0x42, crd: 0, dnr: false };
        assert_eq!(odd.to_string(), "sct=Vendor sc=0x42");
    }
}
