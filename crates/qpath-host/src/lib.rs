//! # qpath-host: an NVMe/TCP host
//!
//! Owns controllers (bring-up, keep-alive, asynchronous events, reconnect),
//! their queues (a sans-I/O NVMe/TCP state machine), and the per-thread
//! completion contexts that drive I/O run-to-completion on io_uring.
//!
//! ```text
//!   Controller (admin thread: keep-alive, AER, ANA, reconnect)
//!      │ I/O queue connections (DH-HMAC-CHAP on bring-up when asked: auth),
//!      │ handed over once per (re)connect
//!      ▼
//!   Context (one per application thread: io_uring, sockets, mailbox, clock) around
//!   BlockCore (context::blockcore: requests, tags, routing, failover; sans-I/O)
//!      submit(dev, op, offset, buf) ─► tag ─► HostQueue ─► socket
//!      poll() ◄─ CQE / C2HData ◄────────────────────────────┘
//! ```
//!
//! ```no_run
//! use qpath_host::context::{Context, ContextOptions, Op};
//! use qpath_host::controller::{ConnectOptions, Controller};
//! use uring::{IoBuf, Wait};
//!
//! let ctrl = Controller::connect(ConnectOptions::new(
//!     "127.0.0.1:4420".parse().unwrap(),
//!     "nqn.2026-11.io.qpath:default",
//! ))?;
//! let mut ctx = Context::new(ContextOptions::default())?;
//! let dev = ctx.open(&ctrl, nvme::Nsid(1))?;
//! ctx.submit(dev, Op::Read, 0, 4096, Some(IoBuf::new(4096)), 7).map_err(|(e, _)| e)?;
//! while ctx.poll(Wait::Poll)? == 0 {}
//! let done = ctx.completions().next().unwrap();
//! assert_eq!(done.token, 7);
//! assert!(done.status.is_success());
//! # Ok::<(), qpath_host::error::Error>(())
//! ```
//!
//! The `lab-baselines` cargo feature adds what only the labs use: seed 000's reference
//! path selectors in a head ([`head::ReferenceSelector`]) and seed 003's tag-then-budget
//! order ([`context::DepthLimitOrder`]'s `AfterTag`). Without it (production builds) a
//! context's I/O path carries no check for either.

pub mod admin;
pub mod auth;
pub mod context;
mod control;
pub mod controller;
pub mod discovery;
pub mod error;
pub mod failover;
pub mod head;
pub mod metrics;
pub mod mpath;
pub mod passthru;
pub mod queue;
pub mod reservation;
pub mod stats;
pub mod sync;
pub mod tls;

pub use error::{BadTransition, Error, ErrorKind, Result};
