//! Host statistics for export: per-queue, per-controller, per-path and
//! per-namespace counters and latency histograms, recorded by each context's
//! own thread and published to a [`HostStats`] that the control plane reads
//! (`qpath stats` over a JSON-RPC socket, Prometheus `/metrics`: [`crate::metrics`]).
//!
//! ```text
//!  Context (owner thread)                       HostStats (shared, control plane)
//!    per I/O: queue stats, path stats ──┐         controllers (Weak, numbered 0, 1, ...)
//!             (owned memory, no atomics) │         QueueSlot per (controller, queue)
//!    every stats_interval, and when the  │ copy    DeviceSlot per (context, device)
//!    context is dropped: what changed ───┴─try_lock─► slot   snapshot() ─► metrics::{stats_json, render}
//! ```
//!
//! Per I/O nothing is shared: the owner records into its own memory (the queue's
//! [`blk::QueueStats`], and with a `HostStats` attached one more per device path).
//! Every [`crate::context::ContextOptions::stats_interval`] the owner copies the
//! statistics that changed since the last publish into their slots: a copy of
//! the histograms that saw I/O (~30 KB a direction) and a `try_lock` that skips
//! the turn rather than wait for a reader. Readers therefore see numbers at most
//! one interval old while I/O runs, and exact numbers once a context has been
//! dropped or has called [`crate::context::Context::publish_stats`].
//!
//! A queue slot outlives the context that owned it: a later context that claims
//! the same queue adds to it, so every exported counter only grows. Devices of a
//! dropped context are folded into per-path totals.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use blk::{Direction, QueueStats};
use nvme::Nsid;

use crate::controller::{Controller, CtrlState};

/// How often a context publishes by default (a scrape every few seconds needs no more).
pub const STATS_INTERVAL_DEFAULT: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counters of one queue: the block core's statistics plus its connection history.
#[derive(Clone, Debug, Default)]
pub struct QueueTotals {
    /// I/Os completed on the queue: counts, bytes, errors, latency histograms
    /// (submit to completion, retries included), requeues, busy refusals.
    pub stats: QueueStats,
    /// Connections installed on the queue (the first one and every reconnect).
    pub connects: u64,
    /// Connections that failed under I/O (each one makes the controller reset).
    pub failures: u64,
}

impl QueueTotals {
    /// Adds `o` into these.
    pub fn merge(&mut self, o: &QueueTotals) {
        self.stats.merge(&o.stats);
        self.connects += o.connects;
        self.failures += o.failures;
    }
}

#[derive(Default)]
struct QueuePublished {
    /// Totals of the contexts that owned the queue before.
    retired: QueueTotals,
    /// The current owner's totals, as of its last publish.
    live: QueueTotals,
    outstanding: u64,
    waiting: u64,
    connected: bool,
    secure_channel: Option<SecureChannel>,
    owner: Option<u32>,
}

/// A queue's secure channel: where its records are sealed and opened, and the suite
/// (`tls::kernel::RecordPath` and `tls::record::Suite` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecureChannel {
    /// "tls1.3-user" or "tls1.3-kernel".
    pub record_path: &'static str,
    /// "TLS_AES_128_GCM_SHA256", ...
    pub suite: &'static str,
}

impl std::fmt::Display for SecureChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.record_path, self.suite)
    }
}

/// One I/O queue of one controller, as published by the context that owns it.
pub(crate) struct QueueSlot {
    ctrl: u32,
    index: u16,
    published: Mutex<QueuePublished>,
}

/// What a context publishes about one of its queues.
pub(crate) struct QueueView<'a> {
    pub stats: &'a QueueStats,
    pub outstanding: usize,
    pub waiting: usize,
    pub connected: bool,
    pub secure_channel: Option<SecureChannel>,
}

/// Statistics of one path of one device, kept by the owner.
#[derive(Clone, Debug, Default)]
struct PathTotals {
    ctrl: u32,
    nsid: u32,
    stats: QueueStats,
}

#[derive(Default)]
struct DevicePublished {
    paths: Vec<PathTotals>,
    /// I/Os failed before any path was tried (a multipath head with no usable path).
    no_path_errors: u64,
}

/// One device (namespace or multipath head) opened in one context.
pub(crate) struct DeviceSlot {
    subnqn: String,
    nsid: u32,
    multipath: bool,
    published: Mutex<DevicePublished>,
}

#[derive(Clone, Debug)]
struct CtrlSeen {
    cntlid: u16,
    state: CtrlState,
    reconnects: u64,
    reauths: u64,
    reauth_failures: u64,
    admin_wakeups: u64,
    io_queues: usize,
    last_error: Option<String>,
}

struct CtrlEntry {
    id: u32,
    ctrl: Weak<Controller>,
    traddr: SocketAddr,
    subnqn: String,
    /// Refreshed whenever the controller is still there; what is reported after it is gone.
    seen: CtrlSeen,
}

impl CtrlEntry {
    fn refresh(&mut self) {
        if let Some(c) = self.ctrl.upgrade() {
            let i = c.info();
            self.seen = CtrlSeen {
                cntlid: i.cntlid.0,
                state: i.state,
                reconnects: i.reconnects,
                reauths: i.reauths,
                reauth_failures: i.reauth_failures,
                admin_wakeups: i.admin_wakeups,
                io_queues: i.io_queues,
                last_error: i.last_error,
            };
        }
    }
}

/// Identifies a path across contexts: (subsystem, namespace of the device, path NSID, controller).
type PathKey = (String, u32, u32, u32);

#[derive(Default)]
struct Registry {
    controllers: Vec<CtrlEntry>,
    queues: Vec<Arc<QueueSlot>>,
    devices: Vec<Arc<DeviceSlot>>,
    /// Paths of devices whose contexts are gone, and their devices' no-path errors.
    retired_paths: BTreeMap<PathKey, QueueStats>,
    retired_no_path: BTreeMap<(String, u32), u64>,
    retired_multipath: BTreeMap<(String, u32), bool>,
}

/// The statistics hub of a host process: contexts publish into it, reports read it.
/// Share it (`Arc`) through [`crate::context::ContextOptions::stats`].
pub struct HostStats {
    inner: Mutex<Registry>,
    next_context: AtomicU32,
    contexts_live: AtomicU32,
}

impl std::fmt::Debug for HostStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = lock(&self.inner);
        f.debug_struct("HostStats")
            .field("controllers", &g.controllers.len())
            .field("queues", &g.queues.len())
            .field("devices", &g.devices.len())
            .finish()
    }
}

impl Default for HostStats {
    fn default() -> Self {
        HostStats {
            inner: Mutex::new(Registry::default()),
            next_context: AtomicU32::new(0),
            contexts_live: AtomicU32::new(0),
        }
    }
}

impl HostStats {
    /// An empty hub.
    pub fn new() -> Arc<HostStats> {
        Arc::new(HostStats::default())
    }

    /// The host-side number of `ctrl` (0, 1, ... in order of first sight; the
    /// `ctrl` label of the metrics), registering it if needed. A controller is
    /// reported (state, reconnects) from then on, even without queues.
    pub fn controller_number(&self, ctrl: &Arc<Controller>) -> u32 {
        let mut g = lock(&self.inner);
        Self::ctrl_id(&mut g, ctrl)
    }

    /// The controllers registered here that still exist, with their numbers.
    pub fn live_controllers(&self) -> Vec<(u32, Arc<Controller>)> {
        lock(&self.inner).controllers.iter().filter_map(|e| Some((e.id, e.ctrl.upgrade()?))).collect()
    }

    fn ctrl_id(g: &mut Registry, ctrl: &Arc<Controller>) -> u32 {
        let ptr = Arc::as_ptr(ctrl);
        // A dead Weak may share the address of a new controller: only live ones match.
        if let Some(e) = g.controllers.iter().find(|e| e.ctrl.strong_count() > 0 && std::ptr::eq(e.ctrl.as_ptr(), ptr))
        {
            return e.id;
        }
        let id = u32::try_from(g.controllers.len()).unwrap_or(u32::MAX);
        let mut e = CtrlEntry {
            id,
            ctrl: Arc::downgrade(ctrl),
            traddr: ctrl.opts.traddr,
            subnqn: ctrl.opts.subnqn.clone(),
            seen: CtrlSeen {
                cntlid: 0,
                state: CtrlState::New,
                reconnects: 0,
                reauths: 0,
                reauth_failures: 0,
                admin_wakeups: 0,
                io_queues: 0,
                last_error: None,
            },
        };
        e.refresh();
        g.controllers.push(e);
        id
    }

    /// The slot of I/O queue `index` of `ctrl` (shared by every context that owns it in turn).
    fn queue_slot(&self, ctrl: &Arc<Controller>, index: u16, context: u32) -> Arc<QueueSlot> {
        let mut g = lock(&self.inner);
        let id = Self::ctrl_id(&mut g, ctrl);
        let slot = match g.queues.iter().find(|q| q.ctrl == id && q.index == index) {
            Some(q) => Arc::clone(q),
            None => {
                let q = Arc::new(QueueSlot { ctrl: id, index, published: Mutex::new(QueuePublished::default()) });
                g.queues.push(Arc::clone(&q));
                q
            }
        };
        drop(g);
        let mut p = lock(&slot.published);
        if let Some(prev) = p.owner.replace(context) {
            // The previous owner did not retire (it cannot claim a queue it still owns): keep its totals.
            tracing::debug!(prev, context, "queue slot taken over");
            let live = std::mem::take(&mut p.live);
            p.retired.merge(&live);
        }
        drop(p);
        slot
    }

    fn device_slot(&self, subnqn: &str, nsid: u32, multipath: bool) -> Arc<DeviceSlot> {
        let d = Arc::new(DeviceSlot {
            subnqn: subnqn.to_string(),
            nsid,
            multipath,
            published: Mutex::new(DevicePublished::default()),
        });
        lock(&self.inner).devices.push(Arc::clone(&d));
        d
    }

    /// A context went away after its last publish: its queues keep their totals,
    /// its devices fold into per-path totals.
    fn retire(&self, context: u32, queues: &[QueueRec], devices: &[Arc<DeviceSlot>]) {
        for q in queues {
            let mut p = lock(&q.slot.published);
            if p.owner == Some(context) {
                let live = std::mem::take(&mut p.live);
                p.retired.merge(&live);
                p.owner = None;
                p.outstanding = 0;
                p.waiting = 0;
                p.connected = false;
                p.secure_channel = None;
            }
        }
        let mut g = lock(&self.inner);
        for d in devices {
            g.devices.retain(|x| !Arc::ptr_eq(x, d));
            let p = lock(&d.published);
            let ns = (d.subnqn.clone(), d.nsid);
            *g.retired_no_path.entry(ns.clone()).or_default() += p.no_path_errors;
            let mp = g.retired_multipath.entry(ns).or_default();
            *mp |= d.multipath;
            for path in &p.paths {
                let key = (d.subnqn.clone(), d.nsid, path.nsid, path.ctrl);
                g.retired_paths.entry(key).or_default().merge(&path.stats);
            }
        }
        for c in &mut g.controllers {
            c.refresh();
        }
        drop(g);
        self.contexts_live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Everything published so far, merged per queue, controller, path and namespace.
    pub fn snapshot(&self) -> HostSnapshot {
        let mut g = lock(&self.inner);
        for c in &mut g.controllers {
            c.refresh();
        }
        let ctrl_of = |id: u32| g.controllers.iter().find(|c| c.id == id);
        let mut queues = Vec::with_capacity(g.queues.len());
        for q in &g.queues {
            let p = lock(&q.published);
            let mut totals = p.retired.clone();
            totals.merge(&p.live);
            let Some(c) = ctrl_of(q.ctrl) else { continue };
            queues.push(QueueSnapshot {
                ctrl: q.ctrl,
                traddr: c.traddr,
                subnqn: c.subnqn.clone(),
                cntlid: c.seen.cntlid,
                qid: q.index + 1,
                context: p.owner,
                connected: p.connected,
                outstanding: p.outstanding,
                waiting: p.waiting,
                secure_channel: p.secure_channel,
                totals,
            });
        }
        queues.sort_by_key(|q| (q.ctrl, q.qid));
        let controllers = g.controllers.iter().map(|c| controller_snapshot(c, &queues)).collect();
        // Paths and namespaces: the retired totals plus every live device.
        let mut paths = g.retired_paths.clone();
        let mut no_path = g.retired_no_path.clone();
        let mut multipath = g.retired_multipath.clone();
        let mut devices_live: BTreeMap<(String, u32), usize> = BTreeMap::new();
        for d in &g.devices {
            let p = lock(&d.published);
            let ns = (d.subnqn.clone(), d.nsid);
            *no_path.entry(ns.clone()).or_default() += p.no_path_errors;
            *multipath.entry(ns.clone()).or_default() |= d.multipath;
            *devices_live.entry(ns).or_default() += 1;
            for path in &p.paths {
                paths.entry((d.subnqn.clone(), d.nsid, path.nsid, path.ctrl)).or_default().merge(&path.stats);
            }
        }
        let mut namespaces: BTreeMap<(String, u32), NamespaceSnapshot> = BTreeMap::new();
        for ((subnqn, nsid), mp) in &multipath {
            namespaces.insert(
                (subnqn.clone(), *nsid),
                NamespaceSnapshot {
                    subnqn: subnqn.clone(),
                    nsid: *nsid,
                    multipath: *mp,
                    paths: 0,
                    devices_open: devices_live.get(&(subnqn.clone(), *nsid)).copied().unwrap_or(0),
                    no_path_errors: no_path.get(&(subnqn.clone(), *nsid)).copied().unwrap_or(0),
                    stats: QueueStats::new(),
                },
            );
        }
        let mut path_list = Vec::with_capacity(paths.len());
        for ((subnqn, ns_nsid, nsid, ctrl), stats) in paths {
            if let Some(n) = namespaces.get_mut(&(subnqn.clone(), ns_nsid)) {
                n.stats.merge(&stats);
                n.paths += 1;
            }
            let traddr = ctrl_of(ctrl).map(|c| c.traddr);
            path_list.push(PathSnapshot { subnqn, namespace_nsid: ns_nsid, nsid, ctrl, traddr, stats });
        }
        HostSnapshot {
            contexts_live: self.contexts_live.load(Ordering::Relaxed),
            queues,
            controllers,
            paths: path_list,
            namespaces: namespaces.into_values().collect(),
        }
    }
}

/// A controller's snapshot: what it last showed, and its queues' totals merged.
fn controller_snapshot(c: &CtrlEntry, queues: &[QueueSnapshot]) -> ControllerSnapshot {
    let mut totals = QueueTotals::default();
    let mut outstanding = 0;
    let mut nq = 0;
    for q in queues.iter().filter(|q| q.ctrl == c.id) {
        totals.merge(&q.totals);
        outstanding += q.outstanding;
        nq += 1;
    }
    ControllerSnapshot {
        ctrl: c.id,
        traddr: c.traddr,
        subnqn: c.subnqn.clone(),
        cntlid: c.seen.cntlid,
        state: c.seen.state,
        present: c.ctrl.strong_count() > 0,
        reconnects: c.seen.reconnects,
        reauths: c.seen.reauths,
        reauth_failures: c.seen.reauth_failures,
        admin_wakeups: c.seen.admin_wakeups,
        io_queues: c.seen.io_queues,
        queues_used: nq,
        outstanding,
        last_error: c.seen.last_error.clone(),
        totals,
    }
}

/// One queue in a [`HostSnapshot`].
#[derive(Clone, Debug)]
pub struct QueueSnapshot {
    /// Host-side controller number.
    pub ctrl: u32,
    /// Controller address.
    pub traddr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller id the target gave (of the current association).
    pub cntlid: u16,
    /// Queue id (1-based, as on the wire).
    pub qid: u16,
    /// The context that owns the queue now (`None`: nobody).
    pub context: Option<u32>,
    /// Whether it had a live connection at the last publish.
    pub connected: bool,
    /// Commands on the wire at the last publish.
    pub outstanding: u64,
    /// Requests bound to the queue waiting for a tag or a connection at the last publish.
    pub waiting: u64,
    /// Its TLS channel at the last publish (none: plaintext).
    pub secure_channel: Option<SecureChannel>,
    /// Totals over every owner.
    pub totals: QueueTotals,
}

/// One controller in a [`HostSnapshot`]: its state and its queues' totals.
#[derive(Clone, Debug)]
pub struct ControllerSnapshot {
    /// Host-side controller number.
    pub ctrl: u32,
    /// Address.
    pub traddr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller id.
    pub cntlid: u16,
    /// Lifecycle state (last seen, if the controller is gone).
    pub state: CtrlState,
    /// Whether the controller object still exists.
    pub present: bool,
    /// Reconnects (each one a reset of the association).
    pub reconnects: u64,
    /// Re-authentications in which every queue succeeded.
    pub reauths: u64,
    /// Re-authentications in which a queue failed.
    pub reauth_failures: u64,
    /// Times the controller's admin thread woke.
    pub admin_wakeups: u64,
    /// I/O queues the controller has.
    pub io_queues: usize,
    /// Queues some context has used.
    pub queues_used: usize,
    /// Commands on the wire over its queues.
    pub outstanding: u64,
    /// Last error the controller saw.
    pub last_error: Option<String>,
    /// Its queues' totals.
    pub totals: QueueTotals,
}

/// One path (a namespace through one controller) in a [`HostSnapshot`].
#[derive(Clone, Debug)]
pub struct PathSnapshot {
    /// Subsystem NQN.
    pub subnqn: String,
    /// NSID of the device the path belongs to (the head's first path's).
    pub namespace_nsid: u32,
    /// NSID through this controller.
    pub nsid: u32,
    /// Host-side controller number.
    pub ctrl: u32,
    /// Controller address (`None` if never registered).
    pub traddr: Option<SocketAddr>,
    /// I/Os that completed to the caller after their last try on this path
    /// (latency submit to completion, failovers included).
    pub stats: QueueStats,
}

/// One namespace (single-path devices and multipath heads of it) in a [`HostSnapshot`].
#[derive(Clone, Debug)]
pub struct NamespaceSnapshot {
    /// Subsystem NQN.
    pub subnqn: String,
    /// NSID.
    pub nsid: u32,
    /// Whether some context opened it as a multipath head.
    pub multipath: bool,
    /// Paths that carried I/O.
    pub paths: usize,
    /// Devices open on it now (one per context that opened it).
    pub devices_open: usize,
    /// I/Os failed with no path to try.
    pub no_path_errors: u64,
    /// Its paths' statistics merged.
    pub stats: QueueStats,
}

impl NamespaceSnapshot {
    /// Every I/O that failed to the caller.
    pub fn errors(&self) -> u64 {
        self.stats.errors() + self.no_path_errors
    }
}

/// Everything a [`HostStats`] knows at one moment.
#[derive(Clone, Debug)]
pub struct HostSnapshot {
    /// Contexts publishing now.
    pub contexts_live: u32,
    /// Per queue, by controller and qid.
    pub queues: Vec<QueueSnapshot>,
    /// Per controller, in order of registration.
    pub controllers: Vec<ControllerSnapshot>,
    /// Per path.
    pub paths: Vec<PathSnapshot>,
    /// Per namespace.
    pub namespaces: Vec<NamespaceSnapshot>,
}

impl HostSnapshot {
    /// I/Os completed over every queue.
    pub fn queue_ios(&self) -> u64 {
        self.queues.iter().map(|q| q.totals.stats.ios()).sum()
    }

    /// I/Os of one direction over every queue.
    pub fn queue_ios_dir(&self, dir: Direction) -> u64 {
        self.queues.iter().map(|q| q.totals.stats.direction(dir).ios).sum()
    }

    /// I/Os that failed to the caller, over every namespace.
    pub fn io_errors(&self) -> u64 {
        self.namespaces.iter().map(NamespaceSnapshot::errors).sum()
    }

    /// Controller reconnects over every controller.
    pub fn reconnects(&self) -> u64 {
        self.controllers.iter().map(|c| c.reconnects).sum()
    }

    /// Queue connections that failed under I/O.
    pub fn queue_failures(&self) -> u64 {
        self.queues.iter().map(|q| q.totals.failures).sum()
    }
}

// ------------------------------------------------------------------ owner side

struct QueueRec {
    slot: Arc<QueueSlot>,
    connects: u64,
    failures: u64,
    /// What the last publish carried, to skip unchanged queues.
    published: (u64, u64, u64, u64, usize, usize, bool, Option<SecureChannel>),
}

/// One path slot of a device, as its owner records it.
struct PathRec {
    stats: QueueStats,
    /// The queue and NSID of the last I/O on the path (its controller, for labels).
    qkey: usize,
    nsid: u32,
}

#[derive(Default)]
struct DeviceRec {
    /// Registered at the device's first publish.
    slot: Option<Arc<DeviceSlot>>,
    /// Per path slot (index = `PathIndex`; 0 for a single-path device).
    paths: Vec<Option<PathRec>>,
    no_path_errors: u64,
    dirty: bool,
}

/// The owner side: what one context records and publishes. Inert without a hub.
pub(crate) struct Recorder {
    hub: Option<Arc<HostStats>>,
    context: u32,
    interval: Duration,
    last: Instant,
    queues: Vec<QueueRec>,
    devices: Vec<DeviceRec>,
}

/// What a publish needs to know about one device of the context.
pub(crate) struct DeviceView<'a> {
    pub multipath: bool,
    /// The controller of each of the context's queues (by queue key).
    pub ctrl_of: &'a dyn Fn(usize) -> Option<&'a Arc<Controller>>,
}

impl Recorder {
    pub(crate) fn new(hub: Option<Arc<HostStats>>, interval: Duration) -> Recorder {
        let context = match &hub {
            Some(h) => {
                h.contexts_live.fetch_add(1, Ordering::Relaxed);
                h.next_context.fetch_add(1, Ordering::Relaxed)
            }
            None => 0,
        };
        Recorder { hub, context, interval, last: Instant::now(), queues: Vec::new(), devices: Vec::new() }
    }

    /// A queue was attached; `qkey` must be the next one (queues are never removed).
    pub(crate) fn on_attach(&mut self, qkey: usize, ctrl: &Arc<Controller>, index: u16) {
        let Some(hub) = &self.hub else { return };
        assert_eq!(qkey, self.queues.len(), "the recorder's queues follow the context's");
        let slot = hub.queue_slot(ctrl, index, self.context);
        self.queues.push(QueueRec {
            slot,
            connects: 0,
            failures: 0,
            published: (u64::MAX, 0, 0, 0, 0, 0, false, None),
        });
    }

    /// A connection was installed on queue `qkey`.
    #[inline]
    pub(crate) fn on_connect(&mut self, qkey: usize) {
        if let Some(q) = self.queues.get_mut(qkey) {
            q.connects += 1;
        }
    }

    /// A connection of queue `qkey` failed.
    #[inline]
    pub(crate) fn on_failure(&mut self, qkey: usize) {
        if let Some(q) = self.queues.get_mut(qkey) {
            q.failures += 1;
        }
    }

    /// An I/O of device `dev` completed to the caller; `last` is the path slot,
    /// queue and NSID of its last try (`None`: never sent).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        dev: u32,
        last: Option<(u16, usize, Nsid)>,
        dir: Direction,
        bytes: u32,
        latency_ns: u64,
        ok: bool,
    ) {
        if self.hub.is_none() {
            return;
        }
        let dev = dev as usize;
        if dev >= self.devices.len() {
            // A device's first I/O (cold: once per device).
            self.devices.resize_with(dev + 1, DeviceRec::default);
        }
        let d = &mut self.devices[dev];
        d.dirty = true;
        let Some((path, qkey, nsid)) = last else {
            d.no_path_errors += u64::from(!ok);
            return;
        };
        let p = usize::from(path);
        if p >= d.paths.len() {
            // A path slot's first I/O (cold: paths are few and change rarely).
            d.paths.resize_with(p + 1, || None);
        }
        let rec = d.paths[p].get_or_insert_with(|| PathRec { stats: QueueStats::new(), qkey, nsid: nsid.0 });
        rec.qkey = qkey;
        rec.nsid = nsid.0;
        let outcome = if ok { blk::Outcome::Success } else { blk::Outcome::Error };
        rec.stats.record(dir, u64::from(bytes), latency_ns, outcome);
    }

    /// Whether a periodic publish is due.
    #[inline]
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.hub.is_some() && now.saturating_duration_since(self.last) >= self.interval
    }

    /// Whether a hub is attached.
    pub(crate) fn enabled(&self) -> bool {
        self.hub.is_some()
    }

    /// Publishes queue `qkey` if it changed. `force` waits for the slot's lock
    /// instead of skipping a turn.
    pub(crate) fn publish_queue(&mut self, qkey: usize, v: &QueueView<'_>, force: bool) {
        let Some(q) = self.queues.get_mut(qkey) else { return };
        let key = (
            v.stats.ios(),
            v.stats.requeues + v.stats.busy,
            q.connects,
            q.failures,
            v.outstanding,
            v.waiting,
            v.connected,
            v.secure_channel,
        );
        if key == q.published {
            return;
        }
        // The copy (and its allocation) happens before the lock: readers never wait for it.
        let live = QueueTotals { stats: v.stats.clone(), connects: q.connects, failures: q.failures };
        let Some(mut g) = lock_or_skip(&q.slot.published, force) else { return };
        let old = std::mem::replace(&mut g.live, live);
        g.outstanding = v.outstanding as u64;
        g.waiting = v.waiting as u64;
        g.connected = v.connected;
        g.secure_channel = v.secure_channel;
        g.owner = Some(self.context);
        drop(g);
        drop(old);
        q.published = key;
    }

    /// Publishes device `dev` if it changed (registering it at its first publish).
    pub(crate) fn publish_device(&mut self, dev: usize, v: &DeviceView<'_>, force: bool) {
        let Some(hub) = self.hub.clone() else { return };
        let Some(d) = self.devices.get_mut(dev) else { return };
        if !d.dirty {
            return;
        }
        let ctrl_nsid = |r: &PathRec| (v.ctrl_of)(r.qkey).map(|c| (c, r.nsid));
        if d.slot.is_none() {
            // Named after its first path that carried I/O (every path has the same subsystem).
            let first = d.paths.iter().flatten().find_map(ctrl_nsid);
            let (subnqn, nsid) = first.map_or((String::new(), 0), |(c, n)| (c.opts.subnqn.clone(), n));
            d.slot = Some(hub.device_slot(&subnqn, nsid, v.multipath));
        }
        let copy: Vec<PathTotals> = d
            .paths
            .iter()
            .flatten()
            .map(|r| {
                let (ctrl, nsid) = ctrl_nsid(r).map_or((u32::MAX, r.nsid), |(c, n)| (hub.controller_number(c), n));
                PathTotals { ctrl, nsid, stats: r.stats.clone() }
            })
            .collect();
        let Some(slot) = d.slot.as_ref() else { return };
        let Some(mut g) = lock_or_skip(&slot.published, force) else { return };
        let old = std::mem::replace(&mut g.paths, copy);
        g.no_path_errors = d.no_path_errors;
        drop(g);
        drop(old);
        d.dirty = false;
    }

    /// Marks the end of a publish round.
    pub(crate) fn published(&mut self, now: Instant) {
        self.last = now;
    }

    /// The context is going away (after a forced publish).
    pub(crate) fn retire(&mut self) {
        if let Some(hub) = self.hub.take() {
            let devices: Vec<Arc<DeviceSlot>> = self.devices.iter().filter_map(|d| d.slot.clone()).collect();
            hub.retire(self.context, &self.queues, &devices);
        }
    }
}

/// The slot's lock; with `force` waits for it, else gives up if a reader holds it.
fn lock_or_skip<T>(m: &Mutex<T>, force: bool) -> Option<MutexGuard<'_, T>> {
    if force {
        return Some(lock(m));
    }
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A context that could not publish its last numbers still gives its queues back.
        self.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_ctrl(_: usize) -> Option<&'static Arc<Controller>> {
        None
    }

    #[test]
    fn an_inert_recorder_records_nothing() {
        let mut r = Recorder::new(None, STATS_INTERVAL_DEFAULT);
        r.record(0, Some((0, 0, Nsid(1))), Direction::Read, 4096, 1000, true);
        r.on_connect(0);
        assert!(!r.enabled());
        assert!(!r.due(Instant::now() + Duration::from_secs(1)));
        assert!(r.devices.is_empty() && r.queues.is_empty());
    }

    #[test]
    fn device_paths_fold_into_namespaces_when_retired() {
        let hub = HostStats::new();
        let mut r = Recorder::new(Some(Arc::clone(&hub)), STATS_INTERVAL_DEFAULT);
        for i in 0..10u64 {
            let path = u16::try_from(i % 2).unwrap();
            r.record(0, Some((path, usize::from(path), Nsid(1))), Direction::Write, 4096, 10_000 + i, true);
        }
        r.record(0, Some((1, 1, Nsid(1))), Direction::Read, 4096, 5_000, false);
        r.record(0, None, Direction::Read, 4096, 5_000, false);
        // No controllers in a unit test: the paths resolve to none.
        r.publish_device(0, &DeviceView { multipath: true, ctrl_of: &no_ctrl }, true);
        let s = hub.snapshot();
        assert_eq!(s.contexts_live, 1);
        assert_eq!(s.namespaces.len(), 1);
        let n = &s.namespaces[0];
        assert_eq!((n.stats.ios(), n.errors(), n.devices_open), (11, 2, 1));
        assert!(n.multipath);
        assert_eq!(s.paths.len(), 1, "both paths resolve to the same unknown controller");
        assert_eq!(s.paths[0].stats.direction(Direction::Write).ios, 10);
        drop(r);
        let s = hub.snapshot();
        assert_eq!(s.contexts_live, 0);
        let n = &s.namespaces[0];
        assert_eq!((n.stats.ios(), n.errors(), n.devices_open), (11, 2, 0), "totals survive the context");
        assert_eq!(n.stats.direction(Direction::Write).bytes, 10 * 4096);
        assert_eq!(s.io_errors(), 2);
    }

    #[test]
    fn unchanged_devices_are_not_copied_again() {
        let hub = HostStats::new();
        let mut r = Recorder::new(Some(Arc::clone(&hub)), STATS_INTERVAL_DEFAULT);
        r.record(0, Some((0, 0, Nsid(2))), Direction::Read, 512, 1_000, true);
        let v = DeviceView { multipath: false, ctrl_of: &no_ctrl };
        r.publish_device(0, &v, false);
        assert!(!r.devices[0].dirty);
        r.publish_device(0, &v, false);
        assert_eq!(hub.snapshot().namespaces[0].stats.ios(), 1);
    }

    #[test]
    fn a_reader_holding_a_slot_makes_the_owner_skip_a_turn() {
        let hub = HostStats::new();
        let mut r = Recorder::new(Some(Arc::clone(&hub)), STATS_INTERVAL_DEFAULT);
        r.record(0, Some((0, 0, Nsid(1))), Direction::Read, 512, 1_000, true);
        let v = DeviceView { multipath: false, ctrl_of: &no_ctrl };
        r.publish_device(0, &v, true);
        r.record(0, Some((0, 0, Nsid(1))), Direction::Read, 512, 1_000, true);
        let slot = Arc::clone(r.devices[0].slot.as_ref().unwrap());
        let held = slot.published.lock().unwrap();
        r.publish_device(0, &v, false);
        assert!(r.devices[0].dirty, "skipped, still to publish");
        drop(held);
        r.publish_device(0, &v, false);
        assert_eq!(hub.snapshot().namespaces[0].stats.ios(), 2);
    }
}
