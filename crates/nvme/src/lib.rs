//! # nvme: NVMe and NVMe/TCP wire types
//!
//! This crate owns the bytes: submission and completion queue entries,
//! opcodes, status codes, Identify structures, log pages, Fabrics commands and
//! properties, and the NVMe/TCP PDUs with their digests. It does no I/O, so
//! every other layer (the target, the host, the fuzzers) shares one codec.
//!
//! ```text
//!   target ──┐                     ┌── host
//!            ▼                     ▼
//!   tcp::Decoder ─► Header::CapsuleCmd(Sqe) ─► admin/io handling
//!   tcp::EncoderConfig ◄─ Cqe / DataHeader / R2t ◄─┘
//!   identify / log / features / fabrics: structures carried as data
//! ```
//!
//! Decoding never panics and never trusts a length: every field read from
//! the wire is checked against its limit, and violations come back as the
//! [`tcp::FatalError`] the transport spec says to report.
//!
//! ```
//! use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Header, Role};
//! use nvme::{Cid, Nsid, Sqe, SglDescriptor, opcode};
//!
//! // A host encodes a 4 KiB read ...
//! let enc = EncoderConfig { digests: Digests { header: true, data: true }, data_align: 4 };
//! let sqe = Sqe::rw(opcode::io::READ, Cid(1), Nsid(1), 0, 8, SglDescriptor::transport(4096));
//! let mut wire = Vec::new();
//! enc.capsule_cmd(&mut wire, &sqe, 0);
//!
//! // ... and the controller decodes and validates it.
//! let dec = Decoder::new(DecoderConfig {
//!     receiver: Role::Controller,
//!     digests: Digests { header: true, data: true },
//!     established: true,
//!     data_align: 4,
//!     max_in_capsule: 8192,
//!     max_data_pdu: 1 << 20,
//! });
//! let Decoded::Pdu(info) = dec.decode_header(&wire).unwrap() else { unreachable!() };
//! assert_eq!(info.header, Header::CapsuleCmd(sqe));
//! assert_eq!(info.layout.plen, 72 + 4);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod copy;
pub mod cqe;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod ids;
pub mod log;
pub mod nqn;
pub mod opcode;
pub mod reservation;
pub mod sgl;
pub mod sqe;
pub mod state;
pub mod status;
pub mod tcp;
mod wire;

pub use cqe::Cqe;
pub use ids::{AnaGrpId, Cid, Cntlid, Nsid, QueueId};
pub use log::AnaState;
pub use sgl::{SglDescriptor, SglKind};
pub use sqe::Sqe;
pub use status::{Sct, Status};
