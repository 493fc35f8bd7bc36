//! Command opcodes (NVMe 2.0 §5, NVM Command Set 1.0 §3, NVMe-oF 1.1 §6).

/// Admin command opcodes.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics commands share this opcode on every queue; the type is in byte 4.
    pub const FABRICS: u8 = 0x7f;
}

/// NVM command set I/O opcodes.
pub mod io {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Verify.
    pub const VERIFY: u8 = 0x0c;
    /// Reservation Register.
    pub const RESV_REGISTER: u8 = 0x0d;
    /// Reservation Report.
    pub const RESV_REPORT: u8 = 0x0e;
    /// Reservation Acquire.
    pub const RESV_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESV_RELEASE: u8 = 0x15;
    /// Copy (NVM Command Set 1.0 §3.2.2).
    pub const COPY: u8 = 0x19;
}

/// The FUSE field (CDW0 bits 9:8, the flags byte's bits 1:0; NVMe Base 2.0 §3.4.2).
pub mod fuse {
    /// A normal command.
    pub const NONE: u8 = 0b00;
    /// The first command of a fused operation (the Compare of Compare and Write).
    pub const FIRST: u8 = 0b01;
    /// The second command of a fused operation (the Write of Compare and Write).
    pub const SECOND: u8 = 0b10;
}

/// Fabrics command types (SQE byte 4 when the opcode is 0x7F).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTH_RECEIVE: u8 = 0x06;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Data transfer direction implied by an opcode's two low bits (NVMe 2.0 §5: bits 1:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (write-like).
    HostToController,
    /// Controller to host (read-like).
    ControllerToHost,
    /// Bidirectional (not used by NVMe/TCP).
    Bidirectional,
}

/// The transfer direction of a (non-Fabrics) opcode.
pub fn data_direction(opcode: u8) -> DataDirection {
    match opcode & 3 {
        0 => DataDirection::None,
        1 => DataDirection::HostToController,
        2 => DataDirection::ControllerToHost,
        _ => DataDirection::Bidirectional,
    }
}
