//! # qpath-blockdev: the qpath host as a block device any program can use
//!
//! The host crate gives Rust programs multipath heads; this crate gives them to everything
//! else on the machine, the way SPDK's `lib/ublk` and `lib/nbd` do:
//!
//! ```text
//!   application (dd, mkfs, a database, QEMU)
//!        │ /dev/ublkbN (Linux ublk_drv)        │ NBD client (qemu-img, kernel nbd)
//!        ▼                                     ▼
//!   ublk queue thread k                   NBD connection thread
//!   URING_CMD fetch/commit ──┐            socket recv/send ──┐
//!                            ▼ same io_uring                  ▼ same io_uring
//!                 host::Context k: multipath head, NVMe/TCP queues
//! ```
//!
//! One I/O is one thread: the block request (a ublk descriptor or an NBD request), the
//! NVMe/TCP commands it becomes and the completion all run on the thread of one completion
//! context, whose ring carries both the device's commands and the NVMe/TCP sockets.
//!
//! - [`errno`]: which errno or NBD error a failed NVMe command becomes (as Linux's host).
//! - [`nbd`]: the NBD protocol (sans I/O) and its server.
//! - [`ublk`]: `/dev/ublkbN` devices (Linux `ublk_drv`), created, served, recovered.
//! - [`service`], [`rpc`]: the devices of one `qpath host` process and its control socket.
//! - [`host_config`]: the devices `qpath host --config` serves, kept across reboots.
//! - [`spec`], [`device`]: a namespace's paths, and the limits a device takes from Identify.

#![forbid(unsafe_code)]

pub mod device;
pub mod errno;
pub mod error;
pub mod host_config;
pub mod nbd;
pub mod rpc;
pub mod service;
pub mod spec;
pub mod ublk;

pub use error::{Error, ErrorKind, Result};
