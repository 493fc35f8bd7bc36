//! Reservation wire values (NVMe Base 2.x §8.19): the reservation types of Acquire,
//! Release and the report, the actions of each command, and the report's layout.

/// Write Exclusive.
pub const WRITE_EXCLUSIVE: u8 = 1;
/// Exclusive Access.
pub const EXCLUSIVE_ACCESS: u8 = 2;
/// Write Exclusive - Registrants Only.
pub const WRITE_EXCLUSIVE_REG_ONLY: u8 = 3;
/// Exclusive Access - Registrants Only.
pub const EXCLUSIVE_ACCESS_REG_ONLY: u8 = 4;
/// Write Exclusive - All Registrants.
pub const WRITE_EXCLUSIVE_ALL_REGS: u8 = 5;
/// Exclusive Access - All Registrants.
pub const EXCLUSIVE_ACCESS_ALL_REGS: u8 = 6;

/// Register's RREGA: register a key.
pub const REGISTER: u8 = 0;
/// Register's RREGA: unregister.
pub const UNREGISTER: u8 = 1;
/// Register's RREGA: replace the key.
pub const REPLACE: u8 = 2;
/// Acquire's RACQA: acquire.
pub const ACQUIRE: u8 = 0;
/// Acquire's RACQA: preempt the holders of PRKEY.
pub const PREEMPT: u8 = 1;
/// Acquire's RACQA: preempt and abort.
pub const PREEMPT_AND_ABORT: u8 = 2;
/// Release's RRELA: release.
pub const RELEASE: u8 = 0;
/// Release's RRELA: clear every registration and the reservation.
pub const CLEAR: u8 = 1;

/// The extended Reservation Status header.
pub const REPORT_HEADER: usize = 64;
/// One Registered Controller extended data structure.
pub const REPORT_ENTRY: usize = 64;
