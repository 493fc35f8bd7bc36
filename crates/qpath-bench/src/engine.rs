//! The I/O engine interface, shaped like fio's `struct ioengine_ops`, and the
//! registry that picks an engine for each job.
//!
//! ```text
//!  job thread                       engine (one per job thread, never shared)
//!  ──────────                       ──────
//!  open(ctx)            ─────────►  open the target, report its size
//!  prepare(&mut [IoU])  ─────────►  learn buffer addresses (register them...)
//!  queue(&mut io_u)     ─────────►  Queued | Completed | Busy
//!  commit(units)        ─────────►  submit what was queued (one syscall / doorbell)
//!  getevents(units,..)  ─────────►  reap n completions
//!  event(i), i < n      ◄─────────  the index of the i-th completed io_u, result set
//!  close()
//! ```
//!
//! The units stay in the job's table for their whole life (fio's `io_u` array): `queue`
//! gets the unit to start, and the unit's index is the token the engine carries with
//! the I/O, so a completion finds its unit by index, without a search or a move. An
//! engine that moves the unit's buffer out while the I/O is in flight (into a ring or
//! the host) puts it back, and sets the result, in the unit the table passed to
//! `commit`/`getevents` holds at that index. A unit's buffer is a heap block that does
//! not move.
//!
//! The iodepth knobs map directly: the runner calls `commit` after
//! `iodepth_batch_submit` queued units, and `getevents(min, max)` with
//! `min = iodepth_batch_complete_min`, `max = iodepth_batch_complete_max`.

pub mod io_uring;
pub mod mpath;
pub mod null;
pub mod passthru;
pub mod psync;
pub mod qpath;
pub mod remote;
pub mod uring_buf;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::filename::{Target, TargetKind};
use crate::io_u::IoU;
use crate::job::JobSpec;

/// What an engine can do; the runner adapts its loop to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `queue` always finishes the I/O and returns [`Queued::Completed`] (fio's
    /// `FIO_SYNCIO`): no `commit`, no `getevents`, and no submission latency.
    pub sync: bool,
    /// Alignment the engine needs for buffers, a power of two (1 = none). The runner
    /// uses at least 4096 for `direct=1`.
    pub buf_align: usize,
    /// Completions are found by polling: the runner reaps on every loop iteration
    /// (`getevents` with `min = 0`) instead of only when the queue is full.
    pub polled: bool,
    /// Deepest queue the engine supports per thread; 0 = no limit. The runner lowers
    /// `iodepth` to this and says so.
    pub max_depth: u32,
    /// The engine accepts [`crate::io_u::Ddir::Sync`] (flush) units.
    pub flush: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities { sync: false, buf_align: 1, polled: false, max_depth: 0, flush: true }
    }
}

/// Outcome of [`Engine::queue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// Accepted; its index will come back from `event` after a later `getevents`.
    Queued,
    /// Already done (result set).
    Completed,
    /// No room right now: commit and reap, then queue this same unit again.
    Busy,
}

/// Indices of completed units on their way back to the runner, oldest first.
/// `getevents` hands out the oldest `n` ([`Ready::hand_out`]) and `event` takes them
/// from the front ([`Ready::take`]).
#[derive(Debug, Default)]
pub struct Ready {
    units: VecDeque<u32>,
    /// Handed out by the last `getevents`, not taken yet (they are the first of `units`).
    handed_out: usize,
}

impl Ready {
    /// Room for `n` units without growing.
    pub fn with_capacity(n: usize) -> Ready {
        Ready { units: VecDeque::with_capacity(n), handed_out: 0 }
    }

    /// The unit of index `index` completed.
    pub fn push(&mut self, index: u32) {
        self.units.push_back(index);
    }

    /// Completed units not handed out yet.
    pub fn len(&self) -> usize {
        self.units.len() - self.handed_out
    }

    /// Whether no completed unit waits to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hand out the oldest `min.max(1)..=max.max(min)` units there are (fewer if fewer
    /// wait) to be taken with [`Ready::take`]; how many.
    ///
    /// # Panics
    /// If units of the previous hand-out were not all taken.
    pub fn hand_out(&mut self, min: usize, max: usize) -> usize {
        assert!(self.handed_out == 0, "getevents called before the previous events were taken");
        self.handed_out = self.units.len().min(max.max(min).max(1));
        self.handed_out
    }

    /// The index of the oldest unit handed out and not yet taken.
    ///
    /// # Panics
    /// If every unit handed out was taken.
    pub fn take(&mut self) -> u32 {
        assert!(self.handed_out > 0, "event() index within the last getevents count");
        self.handed_out -= 1;
        self.units.pop_front().expect("handed-out units are in the queue")
    }
}

/// What an engine learned when opening its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    /// Size of the file, device or namespace in bytes.
    pub size: u64,
    /// Logical block size: offsets and lengths must be multiples of it for direct I/O.
    pub block_size: u32,
}

/// Everything an engine may want to know about the job thread it serves.
#[derive(Debug, Clone, Copy)]
pub struct EngineCtx<'a> {
    /// The resolved job.
    pub job: &'a JobSpec,
    /// The job's target.
    pub target: &'a Target,
    /// Queue depth the runner will use (iodepth after the engine's `max_depth`).
    pub iodepth: u32,
    /// Bytes the job needs the target to have (offset + size), if known: local
    /// engines extend files to this; remote engines check the namespace size.
    pub needed_size: Option<u64>,
}

/// One engine instance, owned by one job thread.
///
/// Engines need not be `Send`: the factory creates them on the job thread, and all
/// calls come from that thread (fio's `thread` model, no locks on the I/O path).
pub trait Engine {
    /// Engine name as shown in reports (`psync`, `io_uring`, `qpath`...).
    fn name(&self) -> &str;

    /// Capabilities; asked once, after the factory created the engine and before `open`
    /// (the queue depth given to `open` already respects `max_depth`).
    fn capabilities(&self) -> Capabilities;

    /// Open the target (connect, open the file...) and report its size.
    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo>;

    /// Called once with every unit before the first I/O (fio's `io_u_init`/`post_init`):
    /// register buffers, preallocate per-unit state, or replace each unit's buffer with
    /// the engine's own memory ([`crate::io_u::IoBuf::foreign`], at least as long as the
    /// one given). Units must keep their `index`; the runner fills the buffers after this.
    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        let _ = units;
        Ok(())
    }

    /// Start the I/O of `unit`, which stays in the runner's table (at `unit.index`) until
    /// it comes back from `event`. A synchronous engine does the I/O here and returns
    /// `Completed`; so does any engine that fails the unit at once (result set).
    fn queue(&mut self, unit: &mut IoU) -> Queued;

    /// Submit everything queued since the last commit. `units` is the runner's table,
    /// indexed by unit index: an engine that finds completions here puts each one's
    /// buffer back and its result into its unit.
    fn commit(&mut self, units: &mut [IoU]) -> Result<()> {
        let _ = units;
        Ok(())
    }

    /// Wait for at least `min` and at most `max` completions, or until `timeout`
    /// (`None` = no limit; `Some(ZERO)` = just poll), completing their units in `units`
    /// (the runner's table, as for `commit`). Returns how many are ready; their indices
    /// are then taken with `event(0..n)`.
    fn getevents(&mut self, units: &mut [IoU], min: usize, max: usize, timeout: Option<Duration>) -> Result<usize>;

    /// The unit index of the `index`-th completion found by the last `getevents` (that
    /// unit has its result set and its buffer back). Called exactly once for each
    /// `index < n`, in increasing order, before the next `getevents`.
    fn event(&mut self, index: usize) -> u32;

    /// The policy and per-path I/O counts of a multipath device (`None`: one path, or
    /// an engine without multipath). Counts run from `open`; the runner asks at the end
    /// of `ramp_time` and before `close`, and reports the difference.
    fn multipath(&self) -> Option<mpath::MultipathStats> {
        None
    }

    /// What the engine knows about an I/O error beyond its code, for the job's error
    /// message (e.g. which target was lost, and since when); `None`: nothing to add.
    fn explain(&self, error: crate::io_u::IoError) -> Option<String> {
        let _ = error;
        None
    }

    /// Release the target. Every queued unit has been reaped before this is called.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Makes engines; registered by name in an [`EngineRegistry`]. Shared by all job
/// threads, so it must be `Send + Sync`; `create` runs on the job thread.
pub trait EngineFactory: Send + Sync {
    /// The name jobs select it by (`ioengine=`) and the resolver maps to.
    fn name(&self) -> &str;

    /// A fresh engine for one job thread (fio's `init`).
    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>>;
}

/// Whether the job asks for polled completions (fio's `hipri`, a bare flag or `hipri=1`):
/// engines then spin instead of sleeping in the kernel.
pub fn hipri(job: &JobSpec) -> bool {
    match job.engine_option("hipri") {
        None => false,
        Some(None) => true,
        Some(Some(v)) => !matches!(v.trim(), "0" | "false" | "off" | "no"),
    }
}

/// Whether the job's writes go with Force Unit Access (`writefua=1`, the name of fio's sg
/// engine option): each write is durable when it completes (NVM Command Set 1.0 §3.2.6),
/// which costs the target a sync per write where it has a volatile cache.
pub fn writefua(job: &JobSpec) -> bool {
    match job.engine_option("writefua") {
        None => false,
        Some(v) => crate::job::value::parse_bool(v).unwrap_or(false),
    }
}

/// The engines that can send a write with FUA: the NVMe ones.
pub const WRITEFUA_ENGINES: [&str; 2] = ["qpath", "qpath-passthru"];

/// A resolver hook: given the requested `ioengine` (`None` if unset) and the target,
/// return the name of the engine to use, or `None` to fall back to the default rules.
pub type Resolver = dyn Fn(Option<&str>, &Target) -> Option<String> + Send + Sync;

/// The engine chosen for a job.
#[derive(Clone)]
pub struct Resolved {
    /// The factory.
    pub factory: Arc<dyn EngineFactory>,
    /// Why it was chosen when it differs from what the job asked for.
    pub note: Option<String>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved").field("engine", &self.factory.name()).field("note", &self.note).finish()
    }
}

/// Engines by name, plus the rules that map fio engine names onto them.
///
/// Default rules (after the optional [`Resolver`] hook):
///
/// | `ioengine=`                           | local file/device            | remote / embedded target |
/// | ------------------------------------- | ---------------------------- | ------------------------ |
/// | unset                                 | `psync`                      | `qpath`                  |
/// | `psync`, `sync`                       | itself                       | `qpath`                  |
/// | `pvsync`, `pvsync2`                   | `psync`                      | `qpath`                  |
/// | `libaio`, `io_uring`, `posixaio`      | `io_uring`, else `psync`     | `qpath`                  |
/// | `io_uring_cmd`                        | `io_uring_cmd` if registered | `qpath-passthru`         |
/// | `spdk`, `spdk_bdev`, `*spdk_nvme*`    | error                        | `qpath`                  |
/// | any other registered name             | itself                       | itself                   |
#[derive(Default)]
pub struct EngineRegistry {
    factories: BTreeMap<String, Arc<dyn EngineFactory>>,
    resolver: Option<Arc<Resolver>>,
}

impl std::fmt::Debug for EngineRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineRegistry")
            .field("engines", &self.names())
            .field("resolver", &self.resolver.is_some())
            .finish()
    }
}

impl EngineRegistry {
    /// An empty registry.
    pub fn new() -> EngineRegistry {
        EngineRegistry::default()
    }

    /// A registry with the synchronous engines only: `psync`, `sync` and `null`.
    pub fn with_sync_engines() -> EngineRegistry {
        let mut r = EngineRegistry::new();
        r.register(Arc::new(null::NullFactory));
        r.register(Arc::new(psync::PsyncFactory));
        r.register(Arc::new(psync::SyncFactory));
        r
    }

    /// A registry with the engines for local files: `psync`, `sync`, `null` and
    /// `io_uring` (which `ioengine=libaio|io_uring|posixaio` run on).
    pub fn with_local_engines() -> EngineRegistry {
        let mut r = EngineRegistry::with_sync_engines();
        r.register(Arc::new(io_uring::IoUringFactory));
        r
    }

    /// Every engine: the local ones and the NVMe/TCP engines `qpath` and
    /// `qpath-passthru`, which take their controllers from `ctrls` (one connection per
    /// remote target for the whole run; see [`remote::Controllers::for_jobs`]).
    pub fn with_all_engines(ctrls: &Arc<remote::Controllers>) -> EngineRegistry {
        let mut r = EngineRegistry::with_local_engines();
        r.register(Arc::new(qpath::QpathFactory::new(Arc::clone(ctrls))));
        r.register(Arc::new(passthru::PassthruFactory::new(Arc::clone(ctrls))));
        r
    }

    /// Add or replace an engine under its `name()`.
    pub fn register(&mut self, factory: Arc<dyn EngineFactory>) {
        self.factories.insert(factory.name().to_string(), factory);
    }

    /// Install a resolver hook consulted before the default rules.
    pub fn set_resolver(&mut self, resolver: Arc<Resolver>) {
        self.resolver = Some(resolver);
    }

    /// The engine registered as `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn EngineFactory>> {
        self.factories.get(name).cloned()
    }

    /// Registered engine names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    fn pick(&self, name: &str, requested: Option<&str>, why: Option<String>) -> Result<Resolved> {
        let factory = self.get(name).ok_or_else(|| {
            let asked = requested.map(|r| format!(" (for ioengine={r})")).unwrap_or_default();
            Error::new(
                ErrorKind::Engine,
                format!("engine '{name}'{asked} is not available; registered: {}", self.names().join(", ")),
            )
        })?;
        let note = why.or_else(|| match requested {
            Some(r) if r != name => Some(format!("ioengine={r} runs on the '{name}' engine")),
            _ => None,
        });
        Ok(Resolved { factory, note })
    }

    /// Choose the engine for `job`.
    pub fn resolve(&self, job: &JobSpec) -> Result<Resolved> {
        let requested = job.ioengine.as_deref();
        if let Some(hook) = &self.resolver
            && let Some(name) = hook(requested, &job.target)
        {
            return self.pick(&name, requested, None);
        }
        let remote = job.target.is_remote();
        let req = requested.unwrap_or("");
        let is_spdk = req == "spdk" || req == "spdk_bdev" || req.contains("spdk_nvme");
        if remote {
            return match req {
                "io_uring_cmd" | "qpath-passthru" => self.pick("qpath-passthru", requested, None),
                "" | "psync" | "sync" | "pvsync" | "pvsync2" | "libaio" | "io_uring" | "posixaio" | "qpath" => {
                    self.pick("qpath", requested, None)
                }
                _ if is_spdk => self.pick("qpath", requested, None),
                other => self.pick(other, requested, None),
            };
        }
        if let TargetKind::Local(_) = job.target.kind {
            return match req {
                "" => self.pick("psync", requested, None),
                "pvsync" | "pvsync2" => self.pick("psync", requested, None),
                "libaio" | "io_uring" | "posixaio" => {
                    if self.get("io_uring").is_some() {
                        self.pick("io_uring", requested, None)
                    } else {
                        self.pick(
                            "psync",
                            requested,
                            Some(format!(
                                "ioengine={req}: the io_uring engine is not registered yet; using psync \
                                 (one I/O at a time, iodepth has no effect)"
                            )),
                        )
                    }
                }
                "qpath" | "qpath-passthru" => Err(Error::new(
                    ErrorKind::Engine,
                    format!("ioengine={req} needs a remote filename (nvme+tcp://... or trtype=TCP ...)"),
                )),
                _ if is_spdk => Err(Error::new(
                    ErrorKind::Engine,
                    format!("ioengine={req} needs a remote filename (trtype=TCP traddr=... subnqn=... ns=1)"),
                )),
                other => self.pick(other, requested, None),
            };
        }
        unreachable!("a target is local or remote")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobFile;

    #[test]
    fn ready_hands_out_the_oldest_units_in_order() {
        let mut r = Ready::with_capacity(4);
        for i in 0..3 {
            r.push(i);
        }
        assert_eq!(r.hand_out(1, 2), 2);
        assert_eq!(r.len(), 1, "handed-out units no longer wait");
        // A unit completing while the runner takes the hand-out waits for the next one.
        r.push(3);
        assert_eq!(r.take(), 0);
        assert_eq!(r.take(), 1);
        assert_eq!(r.hand_out(0, 8), 2);
        assert_eq!((r.take(), r.take()), (2, 3));
        assert!(r.is_empty());
        assert_eq!(r.hand_out(0, 1), 0, "nothing to hand out");
    }

    #[test]
    #[should_panic(expected = "before the previous events were taken")]
    fn ready_refuses_a_hand_out_before_the_last_is_taken() {
        let mut r = Ready::default();
        r.push(0);
        r.push(1);
        r.hand_out(1, 1);
        r.hand_out(1, 1);
    }

    struct Named(&'static str);
    impl EngineFactory for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn create(&self, _ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
            Err(Error::new(ErrorKind::Engine, "test factory"))
        }
    }

    fn job(text: &str) -> JobSpec {
        JobFile::parse(&format!("[j]\nsize=1m\n{text}\n"), "t").unwrap().jobs.remove(0)
    }

    fn resolve(r: &EngineRegistry, text: &str) -> Result<(String, Option<String>)> {
        r.resolve(&job(text)).map(|x| (x.factory.name().to_string(), x.note))
    }

    #[test]
    fn default_rules() {
        let mut r = EngineRegistry::with_sync_engines();
        assert_eq!(resolve(&r, "filename=/tmp/x").unwrap().0, "psync");
        assert_eq!(resolve(&r, "filename=/tmp/x\nioengine=sync").unwrap().0, "sync");
        let (name, note) = resolve(&r, "filename=/tmp/x\nioengine=libaio").unwrap();
        assert_eq!(name, "psync");
        assert!(note.unwrap().contains("io_uring engine is not registered"));
        // remote without a qpath engine registered: a clear error
        let e = resolve(&r, "filename=nvme+tcp://127.0.0.1/nqn.a/1\nioengine=libaio").unwrap_err();
        assert!(e.context.contains("'qpath' (for ioengine=libaio) is not available"), "{e}");
        r.register(Arc::new(Named("qpath")));
        r.register(Arc::new(Named("qpath-passthru")));
        r.register(Arc::new(Named("io_uring")));
        assert_eq!(resolve(&r, "filename=/tmp/x\nioengine=libaio").unwrap().0, "io_uring");
        assert_eq!(resolve(&r, "filename=nvme+tcp://127.0.0.1/nqn.a/1\nioengine=libaio").unwrap().0, "qpath");
        assert_eq!(resolve(&r, "rw=read").unwrap().0, "qpath");
        assert_eq!(
            resolve(&r, "filename=trtype=TCP traddr=1.2.3.4 subnqn=n\nioengine=io_uring_cmd").unwrap().0,
            "qpath-passthru"
        );
        assert!(resolve(&r, "filename=/tmp/x\nioengine=qpath").is_err());
        assert!(resolve(&r, "filename=/tmp/x\nioengine=nope").is_err());
    }

    #[test]
    fn resolver_hook_goes_first() {
        let mut r = EngineRegistry::with_local_engines();
        r.set_resolver(Arc::new(|req: Option<&str>, _t: &Target| (req == Some("libaio")).then(|| "sync".to_string())));
        assert_eq!(resolve(&r, "filename=/tmp/x\nioengine=libaio").unwrap().0, "sync");
        assert_eq!(resolve(&r, "filename=/tmp/x").unwrap().0, "psync");
    }
}
