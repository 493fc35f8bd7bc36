//! Multipath path selection: which path (the namespace through which
//! controller) an I/O of a multipath head goes to.
//!
//! ```text
//!   admin threads: ANA log, controller state ──► head ──► PathState[] (rare)
//!                                                            │ set_paths
//!   submitting thread (its Context)                          ▼
//!     submit ─► Selector::select ─► Submit(path) ─► queue of that path's controller
//!                   │   Requeue (wait for a path) / Fail (no path ever)
//!     on_submit(path) ──► per-thread counters ◄── on_complete(path, latency_ns, outcome)
//! ```
//!
//! A [`Selector`] belongs to one (head, thread) pair and holds only that
//! thread's counters, so selection needs no lock, no atomic and no write to a
//! cache line another core reads: the lesson of seed 000, where summing
//! per-queue counters cost 46 µs per I/O and one shared atomic per path
//! still bounces between cores. The policies are [`Policy::Numa`],
//! [`Policy::RoundRobin`], [`Policy::QueueDepth`] and [`Policy::Latency`];
//! [`mod@reference`] keeps the seed's two selectors for the benchmark, and
//! for `qpath lab seed-000` through a head ([`crate::head::ReferenceSelector`],
//! only with the `lab-baselines` feature: production builds carry no check
//! for them on the I/O path).
//!
//! ```
//! use qpath_host::mpath::{Outcome, PathClass, PathIndex, PathState, Policy, Selection, Selector};
//!
//! let mut sel = Selector::new(Policy::QueueDepth, 0);
//! sel.set_paths(&[
//!     PathState::new(1, PathClass::NonOptimized),
//!     PathState::new(2, PathClass::Optimized),
//!     PathState::new(3, PathClass::Optimized),
//! ]);
//! let Selection::Submit(p) = sel.select() else { unreachable!() };
//! assert_ne!(p, PathIndex(0), "never non-optimized while an optimized path is usable");
//! sel.on_submit(p);
//! // The other optimized path now has fewer of this thread's I/Os in flight.
//! let Selection::Submit(q) = sel.select() else { unreachable!() };
//! assert_ne!(q, p);
//! sel.on_complete(p, 25_000, Outcome::Done);
//!
//! // Every optimized path reconnecting: requeue, do not fail.
//! sel.set_paths(&[
//!     PathState::new(1, PathClass::Gone),
//!     PathState::new(2, PathClass::Transient),
//!     PathState::new(3, PathClass::Transient),
//! ]);
//! assert_eq!(sel.select(), Selection::Requeue);
//! ```

pub mod path;
pub mod policy;
pub mod reference;

pub use path::{LinkState, PATHS_MAX, PathClass, PathIndex, PathState, Selection};
pub use policy::{LatencyParams, Outcome, Policy, Selector};
