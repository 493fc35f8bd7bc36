//! The NVMe/TCP transport binding: PDUs, digests and the receive framer.

pub mod digest;
pub mod framer;
pub mod pdu;

pub use digest::{crc32c, crc32c_append, digest_bytes};
pub use framer::{Frame, Framer};
pub use pdu::{
    CommonHeader, DataHeader, Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, FatalError, Fes, Header, IcReq,
    IcResp, PduInfo, PduLayout, PduType, R2t, Role, TermReq, Written,
};

/// The NVMe/TCP well-known port for I/O controllers.
pub const IO_PORT: u16 = 4420;
/// The NVMe/TCP well-known port for discovery controllers.
pub const DISCOVERY_PORT: u16 = 8009;
