//! The per-core io_uring event loop, and the crate that holds qpath's `unsafe` code (the one
//! other place is the TLS handshake's declarations of OpenSSL's session PSK callbacks,
//! `tls::handshake`'s `session`).
//!
//! This crate owns everything between qpath's sans-IO protocol state machines and the
//! kernel: one [`Ring`] per thread, the buffers lent to it ([`IoBuf`], [`SendMsg`]), the
//! shared RAM-disk memory ([`SharedRegion`]), cross-thread control messages
//! ([`Mailbox`], [`Waker`]), thread helpers (pinning, CPU time, socket options), and the
//! atomic save of an operator's configuration file ([`mod@file`]). It knows nothing about NVMe.
//!
//! ```text
//!   protocol state machines (target / host)                 other threads
//!        |  recv/send/read_at/...(token, owned buffer)        |  MailboxSender::send
//!        v                                                    v
//!   +---------------------------- Ring (one per thread) ------------------+
//!   |  op slab: slot = index|generation = SQE user_data, owns the buffer  |
//!   |  SQ  --- one io_uring_enter(GETEVENTS) per turn --->  kernel        |
//!   |  CQ  <-------------------------------------------    (eventfd poll) |
//!   +----------|----------------------------------------------------------+
//!              v
//!   Completion { token, op, result, more, payload: buffer handed back }
//!
//!   loop {
//!       ring.turn(Wait::Poll or Wait::Block { timeout }, |ring, completion| {
//!           // drive the state machine; queue follow-up ops on `ring`
//!       })?;
//!       mailbox.drain(|message| ...);   // one atomic load when empty
//!   }
//! ```
//!
//! Run-to-completion: the thread that drives a ring does all its I/O; nothing locks or
//! allocates per I/O in steady state. Operations take ownership of their memory and the
//! completion gives it back; a submission that fails hands it back at once
//! (`Result<(), (Error, T)>`). A completion's `result` is the kernel's (a negative errno
//! on failure); [`Error`] is only for local failures.
//!
//! # Example: a loopback echo through the ring
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::os::fd::AsRawFd;
//! use std::time::Duration;
//! use uring::{IoBuf, Payload, Ring, RingConfig, SendMsg, Wait};
//!
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let mut client = TcpStream::connect(listener.local_addr()?)?;
//! let (server, _) = listener.accept()?;
//! let fd = server.as_raw_fd();
//!
//! let mut ring = Ring::new(RingConfig::default())?;
//! const RECV: u64 = 1;
//! const SEND: u64 = 2;
//! ring.recv(fd, IoBuf::new(4096), 0..4096, RECV).map_err(|(e, _)| e)?;
//! client.write_all(b"ping")?;
//!
//! let mut echoed = false;
//! for _ in 0..100 {
//!     ring.turn(Wait::Block { timeout: Some(Duration::from_secs(1)) }, |ring, c| {
//!         match (c.token, c.payload) {
//!             (RECV, Payload::Buf(buf)) => {
//!                 assert_eq!(&buf[..], b"ping");
//!                 let mut msg = SendMsg::new();
//!                 msg.push_bytes(b"echo:");
//!                 msg.push_buf(buf, 0..4).map_err(|(e, _)| e).unwrap();
//!                 ring.send(fd, msg, SEND).map_err(|(e, _)| e).unwrap();
//!             }
//!             (SEND, Payload::Msg(mut msg)) => {
//!                 assert_eq!(c.result, 9);
//!                 let recycled: Vec<IoBuf> = msg.drain_bufs().collect();
//!                 assert_eq!(recycled.len(), 1);
//!                 echoed = true;
//!             }
//!             _ => unreachable!(),
//!         }
//!     })?;
//!     if echoed {
//!         break;
//!     }
//! }
//! let mut reply = [0u8; 9];
//! client.read_exact(&mut reply)?;
//! assert_eq!(&reply, b"echo:ping");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Limits and what is not here
//!
//! - `SEND_ZC`, provided buffer rings, multishot recv and `SQPOLL` are not used: with one
//!   receive buffer per connection and 4 KiB-shaped I/O, plain `RECV` and `SENDMSG` are
//!   the simpler fit (`SEND_ZC` pays off only well above 4 KiB per send), and `SQPOLL`
//!   would take one of the machine's two cores.
//! - A short send or write is resubmitted from the completion path, so each short piece
//!   costs one more turn. Sends use `MSG_WAITALL` by default, so on stream sockets the
//!   kernel finishes them itself and the ring path is a safety net.
//! - [`Ring::cancel`] (by token) scans the op slab; it is for teardown, not the I/O path.
//! - Dropping a `Ring` cancels and waits up to 2 s for in-flight operations; memory the
//!   kernel still holds after that is leaked (never freed while the kernel may write it).
//! - No io_uring timeouts or linked timeouts: timers belong to the caller's loop, which
//!   passes its nearest deadline as the [`Wait::Block`] timeout.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc_count;
mod buf;
pub mod conn;
mod error;
pub mod file;
mod mailbox;
pub mod placement;
mod region;
mod ring;
mod send_msg;
mod slab;
mod sys;
pub mod ublk;

pub use buf::{IO_ALIGN, IoBuf};
pub use error::{Error, ErrorKind};
pub use mailbox::{Mailbox, MailboxSender};
pub use region::{RegionOptions, SharedRegion};
pub use ring::{
    Completion, Features, FsyncMode, OpKind, Payload, RING_ENTRIES_MAX, Ring, RingConfig, RingStats, SEND_HOLD_DEFAULT,
    TaskRun, Wait, Waker,
};
pub use send_msg::{Piece, SEND_BYTES_MAX, SEND_SEGMENTS_MAX, SendMsg};
pub use sys::{
    CpuTime, EventFd, FileLock, LockHolder, PeerCredentials, congestion_control, current_affinity, current_thread_nice,
    enter_netns, fadvise_dontneed, fallocate, file_lock_holder, online_cpus, peer_credentials, physical_memory,
    pin_current_thread, raise_fd_limit, seek_data, send_buffer_size, set_congestion_control, set_current_affinity,
    set_current_thread_nice, set_direct_io, set_linger_zero, set_nodelay, set_nonblocking, set_recv_buffer_size,
    set_send_buffer_size, thread_cpu_clock, thread_cpu_time, try_lock_file, wait_readable,
};

/// Compile-time checks of the thread-safety contract other crates rely on.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<IoBuf>();
    send_sync::<SendMsg>();
    send_sync::<SharedRegion>();
    send_sync::<Waker>();
    send::<Completion>();
    send::<MailboxSender<u64>>();
};

/// `Ring` must stay on the thread that built it (`SINGLE_ISSUER`):
///
/// ```compile_fail
/// fn send<T: Send>() {}
/// send::<uring::Ring>();
/// ```
///
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<uring::Ring>();
/// ```
#[cfg(doctest)]
struct RingIsThreadBound;
