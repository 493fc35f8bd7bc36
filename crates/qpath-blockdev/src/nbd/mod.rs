//! NBD: a multipath head exported over the Network Block Device protocol, for what ublk
//! cannot reach (QEMU, `qemu-img`, older kernels, containers without ublk).
//!
//! ```text
//!   client ── Unix socket or TCP ──► handshake (fixed newstyle, structured replies)
//!                                    framer ─► check ─► Backend (head, split to MDTS)
//!   replies ◄── simple or structured ◄────────────────── completions
//! ```
//!
//! `wire`, `handshake` and `request` are sans I/O (bytes in, bytes out; unit-tested and
//! fuzzed); `server` runs them over a socket on a host completion context's ring.

pub mod handshake;
pub mod request;
pub mod server;
pub mod session;
pub mod wire;
