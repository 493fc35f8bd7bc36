//! # qpath-sim: deterministic simulation of qpath's failure paths
//!
//! Runs the real target and the real host protocol code in one thread over a simulated
//! network, disk and clock, every choice drawn from one seed, so a failure found once is
//! a seed that replays exactly (TigerBeetle's VOPR, FoundationDB's simulation testing).
//!
//! ```text
//!   application workload (seeded reads, writes with and without FUA, flushes)
//!        │                     ▲ checks: oracle of what each block may hold
//!        ▼                     │
//!   host::context::blockcore::BlockCore: request slots, Selector over   (real)
//!        │  PathClass::of, tags, failover/requeue/hold, I/O timeout at its tick
//!        ├─ ctrl::SimCtrl per path (CoreController) over host::controller::CtrlMachine:
//!        │  keep-alive, AER, ANA re-reads, reset → reconnect, ctrl-loss,     (real)
//!        │  bring-up steps and namespace scan (controller::bringup)
//!        ├─ host::head::Head over the paths' SimCtrls (CoreHead)          (real)
//!        │  one I/O queue a path, step timeouts                         (simulated)
//!        ├─ host::queue::HostQueue × (admin + I/O) per path               (real)
//!        ▼
//!   net::Link: in-order byte pipes, any split, delays, stalls, resets   (simulated)
//!        ▼
//!   target::tcp::Connection per queue, TargetState, controllers, ANA,   (real)
//!   namespaces, file backend's FileOps
//!        ▼
//!   disk::SimDisk behind the FileIo trait: cache + durable image,       (simulated)
//!   crash keeps only what was synced (and, by the seed, some of the rest);
//!   a second one for a namespace the operator put in place of the first
//! ```
//!
//! Faults include the operator removing the namespace (the target's real
//! `remove_namespace`), then giving it back or putting another under its NSID: each
//! path's controller view reports what the production scan read, and the host's block
//! core tells the same namespace from another by its identifiers.
//!
//! Time is virtual: the target reads it through [`target::TargetState::with_virtual_clock`]
//! and the connections through `ConnCtx::now_ns`; nothing sleeps, nothing spawns a thread,
//! no map is iterated in hash order, so the same seed gives the same events byte for byte
//! ([`Report::trace_hash`]).
//!
//! The host's block core is the production one (`Context` runs the same around its
//! ring), and so is each controller's admin life, the machine the production admin
//! thread drives, and so is the bring-up it asks for: the step machine the production
//! `bring_up()` drives over sockets, driven here over the simulated admin link.
//!
//! ```
//! let opts = qpath_sim::Options {
//!     seed: 1,
//!     steps: 2_000,
//!     trace: false,
//!     failover_quiesce: true,
//!     shrink_under_writes: false,
//!     faults: qpath_sim::Faults::ALL,
//! };
//! let r = qpath_sim::run(opts);
//! assert!(r.violation.is_none(), "{:?}", r.violation);
//! assert!(r.summary.ios > 0);
//! ```

pub mod ctrl;
pub mod disk;
pub mod faults;
pub mod net;
pub mod oracle;
pub mod rng;
pub mod world;

pub use faults::{Fault, Faults};
pub use world::{Options, Report, Summary, Violation, World};

/// Runs one seed; a panic in the code under test is reported as the violation.
pub fn run(opts: Options) -> Report {
    world::STEP.set(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = World::new(opts);
        w.run();
        w.report()
    }));
    match r {
        Ok(rep) => rep,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            Report {
                seed: opts.seed,
                summary: Summary::default(),
                violation: Some(Violation { step: world::STEP.get(), what: format!("panic: {msg}") }),
                trace_hash: 0,
                trace: Vec::new(),
            }
        }
    }
}

impl Report {
    /// One line of counts.
    pub fn summary_line(&self) -> String {
        let s = &self.summary;
        format!(
            "seed {}: {} steps, {:.3} s virtual, {} I/Os ({} failed), {} requeues, {} resets, {} stalls, {} admin-link silences, {} outages of both ports, {} crashes, {} ANA changes, {} slow-disk periods, {} bit flips, {} path resets, {} reconnects, {} keep-alive timeouts, {} reservation preemptions, {} resizes ({} refused), {} authentications ({} failed), {} re-authentications, {} key rotations, {} namespace removals ({} given back, {} replaced), {} submissions refused, {} bytes, trace {:016x}",
            self.seed,
            s.steps,
            s.virtual_ns as f64 / 1e9,
            s.ios,
            s.io_errors,
            s.requeues,
            s.resets,
            s.stalls,
            s.admin_silences,
            s.both_port_outages,
            s.crashes,
            s.ana_changes,
            s.slow_disk,
            s.bit_flips,
            s.path_resets,
            s.reconnects,
            s.keep_alive_timeouts,
            s.preemptions,
            s.resizes,
            s.resizes_refused,
            s.auths,
            s.auth_failures,
            s.reauths,
            s.key_rotations,
            s.ns_removals,
            s.ns_restores,
            s.ns_replacements,
            s.refused,
            s.bytes,
            self.trace_hash
        )
    }
}
