//! # qpath-target: an NVMe/TCP target
//!
//! Owns ports, the discovery service, NVM subsystems, controllers,
//! namespaces, ANA groups and backends, and serves them over NVMe/TCP.
//!
//! ```text
//!             TargetState (control plane: Connect, admin, RPC)
//!    ports ─┬─ subsystems ─┬─ namespaces (NsMap, read per I/O) ─ backends null/RAM/file
//!           │              │    └─ range locks: fused Compare and Write vs every write
//!           │              ├─ controllers (CC/CSTS, features, AEN, keep-alive)
//!           │              └─ hosts: allowed NQNs, DH-HMAC-CHAP keys (auth::HostAuth)
//!           └─ ANA state per (port, group)
//!
//!    reactor thread k (one per core)                       ◄── accept ── listeners
//!       io_uring ── recv/send ──► tcp::Connection (sans-I/O queue state machine)
//!                                   └─ auth::QueueAuth until the queue authenticates
//!                └─ file I/O ───► backend::FileOp
//! ```
//!
//! Each connection is owned by one reactor thread for its whole life; the
//! I/O path takes no lock, allocates nothing and never hands work to another
//! thread (see `docs/design.md`).
//!
//! The `fault-injection` cargo feature adds the faults a port injects per command
//! (`set_port_fault`'s `stall_opcode` and `delay_us`, [`port::PortFaults`]); without it
//! the command path does not read them and the RPC refuses them. The `qpath` binary
//! turns it on by default.
//!
//! ```
//! use std::sync::Arc;
//! use qpath_target::registry::{TargetOptions, TargetState};
//! use qpath_target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
//! use qpath_target::namespace::NamespaceSpec;
//! use qpath_target::backend::Backend;
//! use qpath_target::port::PortKind;
//!
//! let target = Arc::new(TargetState::new(TargetOptions::default()));
//! target.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
//! let s = target
//!     .add_subsystem(Subsystem::new("nqn.2024-01.io.qpath:doc", SubsysKind::Nvm, "doc1", "qpath",
//!         HostAccess { allow_any: true, hosts: vec![] }, SubsysLimits::default()).unwrap())
//!     .unwrap();
//! let nsid = s
//!     .add_namespace(NamespaceSpec { nsid: 0, backend: Backend::ram(1 << 20).unwrap(), size: None,
//!         block_size: 512, anagrpid: 1, uuid: None, readonly: false,
//!         ptpl_file: None })
//!     .unwrap();
//! assert_eq!(nsid.0, 1);
//! assert_eq!(target.discovery_log("nqn.any", &target.port(1).unwrap()).entries.len(), 2);
//! ```

pub mod admin;
pub mod auth;
pub mod backend;
pub mod config;
pub mod controller;
pub mod dealloc;
pub mod error;
pub mod fabrics;
pub mod io_cmd;
pub mod limits;
pub mod metrics;
pub mod namespace;
pub mod offload;
pub mod persist;
pub mod pool;
pub mod port;
pub mod qos;
pub mod range_lock;
pub mod reactor;
pub mod registry;
pub mod reservation;
pub mod rpc;
pub mod server;
pub mod stats;
pub mod subsystem;
pub mod supported;
pub mod tcp;
pub mod tls;

pub use error::{Error, ErrorKind, Result};

// qpath targets 64-bit Linux: byte offsets (u64) always fit a usize.
const _: () = assert!(usize::BITS == 64, "qpath needs a 64-bit target");

/// A u64 byte offset or length as usize (lossless on the 64-bit targets qpath supports).
#[inline]
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn us(v: u64) -> usize {
    v as usize
}
pub use registry::{TargetOptions, TargetState};
