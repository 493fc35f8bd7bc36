//! Controllers: one per admin queue Connect, with the properties, features,
//! asynchronous events and keep-alive state the host sees.
//!
//! Control-plane state lives behind a mutex (Connect, admin commands, RPC);
//! the I/O path reads only [`Controller::is_dead`] and the subsystem's
//! namespace generation, both relaxed loads of read-mostly lines.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nvme::fabrics::{Cap, Cc, csts, version};
use nvme::features::AsyncEvent;
use nvme::log::{ErrorLogEntry, ResvNotification, resv_notice, trtype};
use nvme::opcode::io;
use nvme::{Cntlid, Nsid, QueueId, Sqe, Status};

use crate::namespace::NsMap;
use crate::port::Port;
use crate::reservation::Notice;
use crate::subsystem::{SubsysKind, Subsystem};

/// Controller lifecycle (NVMe 2.0 §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CtrlState {
    /// Admin queue connected, CC.EN = 0: only Fabrics commands are accepted.
    Disabled,
    /// CC.EN = 1 and CSTS.RDY = 1: I/O queues may connect, commands run.
    Ready,
    /// CC.SHN was set: shutdown processing complete (CSTS.SHST = 10b).
    ShutDown,
    /// Keep-alive expired, admin queue lost or fatal error: sticky until the
    /// controller is deleted; every queue closes.
    Failed,
}

/// Why a lifecycle transition was refused (the convention of [`nvme::state`]).
pub type BadTransition = nvme::state::BadTransition<CtrlState>;

impl CtrlState {
    /// The one place lifecycle changes are decided.
    #[must_use = "a refused transition must be handled"]
    pub fn transition(self, to: CtrlState) -> Result<CtrlState, BadTransition> {
        use CtrlState::*;
        match (self, to) {
            (Disabled, Ready) | (Ready, Disabled) | (Ready, ShutDown) | (ShutDown, Disabled) | (ShutDown, ShutDown) => {
                Ok(to)
            }
            (Disabled, Disabled) | (Ready, Ready) => Ok(to),
            // Anything but a failed controller can fail; failure is sticky.
            (Disabled | Ready | ShutDown, Failed) => Ok(Failed),
            (Failed, _) | (Disabled, ShutDown) | (ShutDown, Ready) => Err(BadTransition { from: self, to }),
        }
    }
}

/// Maximum outstanding AERs (AERL + 1).
pub const MAX_AERS: usize = 4;
/// Error log entries kept.
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Keep-alive granularity reported in KAS, in 100 ms units (1 s, like nvmet).
pub const KAS: u16 = 10;
/// CAP.TO: CSTS.RDY transitions complete within 7.5 s (15 × 500 ms).
pub const CAP_TO: u8 = 15;

/// AEN configuration bits this target can generate (NS attribute, ANA, discovery log change).
/// Reservation Log Page Available has no bit: the Reservation Notification Mask (FID 82h)
/// filters it per namespace, and OAES has no bit to announce it either.
pub const AEN_SUPPORTED: u32 = (1 << 8) | (1 << 11) | (1 << 31);
/// Reservation Notification log pages a controller keeps unread; further notifications
/// are lost (and counted, so the Log Page Count shows the gap), as nvmet's 64-entry queue.
pub const RESV_LOG_ENTRIES: usize = 64;
/// The Reservation Notification Mask bits (FID 82h): 1 << each notification type.
pub const RESV_MASK_BITS: u32 = (1 << resv_notice::REGISTRATION_PREEMPTED)
    | (1 << resv_notice::RESERVATION_RELEASED)
    | (1 << resv_notice::RESERVATION_PREEMPTED);

/// One bit per log page identifier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LidSet([u64; 4]);

impl LidSet {
    fn has(&self, lid: u8) -> bool {
        self.0[usize::from(lid >> 6)] & (1 << (lid & 63)) != 0
    }
    fn set(&mut self, lid: u8, on: bool) {
        let (w, b) = (usize::from(lid >> 6), 1u64 << (lid & 63));
        if on { self.0[w] |= b } else { self.0[w] &= !b }
    }
}

struct Inner {
    state: CtrlState,
    cc: Cc,
    aen_enabled: u32,
    events: VecDeque<AsyncEvent>,
    /// Log pages whose event was reported and not yet read: further events of that kind wait.
    masked_logs: LidSet,
    /// Reservation Notification log pages not read yet, oldest first (at most
    /// [`RESV_LOG_ENTRIES`]; `available` is filled in when one is read).
    resv_log: VecDeque<ResvNotification>,
    /// The Log Page Count given to the last notification, stored or lost.
    resv_count: u64,
    /// Notifications lost since the last one stored (the queue was full).
    resv_lost: u64,
    /// Reservation Notification Mask per NSID (only non-zero masks; at most one per NSID).
    resv_masks: std::collections::BTreeMap<u32, u32>,
    changed_ns: Vec<Nsid>,
    changed_ns_overflow: bool,
    num_io_queues: u16,
    queues: Vec<bool>,
    error_log: VecDeque<ErrorLogEntry>,
    error_count: u64,
}

/// Abort commands one controller may have outstanding (Identify Controller ACL is this - 1).
pub const ABORTS_MAX: usize = 4;

/// An Abort command's question to the owner of an I/O queue.
#[derive(Debug)]
pub struct AbortRequest {
    /// The queue.
    pub sqid: u16,
    /// The command to abort.
    pub cid: u16,
    /// Where the queue's owner answers.
    pub answer: Arc<AbortAnswer>,
}

/// The answer to an [`AbortRequest`]: pending until the queue's owner looks.
#[derive(Debug, Default)]
pub struct AbortAnswer(std::sync::atomic::AtomicU8);

impl AbortAnswer {
    const PENDING: u8 = 0;
    const ABORTED: u8 = 1;
    const NOT_ABORTED: u8 = 2;

    /// Whether the command was aborted: `None` while the queue has not looked yet.
    pub fn aborted(&self) -> Option<bool> {
        match self.0.load(Ordering::Acquire) {
            Self::PENDING => None,
            a => Some(a == Self::ABORTED),
        }
    }

    /// The queue's owner answers.
    pub fn set(&self, aborted: bool) {
        self.0.store(if aborted { Self::ABORTED } else { Self::NOT_ABORTED }, Ordering::Release);
    }
}

/// One controller.
pub struct Controller {
    /// Controller id.
    pub cntlid: Cntlid,
    /// Its subsystem.
    pub subsys: Arc<Subsystem>,
    /// The port its admin queue came through.
    pub port: Arc<Port>,
    /// Host NQN of the Connect.
    pub hostnqn: String,
    /// Host id of the Connect.
    pub hostid: [u8; 16],
    inner: Mutex<Inner>,
    dead: AtomicBool,
    kato_ms: AtomicU32,
    /// Last time (ms since the target epoch) traffic was seen on any queue.
    last_traffic_ms: AtomicU64,
    /// Set when events are waiting for an AER; the admin queue polls it.
    aen_pending: AtomicBool,
    /// Abort commands waiting for their I/O queue's owner to look ([`Controller::request_abort`]).
    aborts: Mutex<Vec<AbortRequest>>,
    /// Set while `aborts` holds a request; the I/O queues read it on their tick.
    aborts_pending: AtomicBool,
    /// Bumped when CC.EN goes to 0: I/O queues bound to an older value close.
    io_generation: AtomicU64,
    /// The namespaces this controller's host sees (set by the subsystem, which also bumps
    /// its namespace generation so that queues re-read it).
    ns_view: Mutex<Arc<NsMap>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("cntlid", &self.cntlid)
            .field("subnqn", &self.subsys.nqn)
            .field("hostnqn", &self.hostnqn)
            .field("port", &self.port.id)
            .finish()
    }
}

/// A controller as `list_controllers` reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ControllerInfo {
    /// Controller id.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Port id.
    pub port: u16,
    /// Lifecycle state.
    pub state: CtrlState,
    /// Keep-alive timeout in ms.
    pub kato_ms: u32,
    /// I/O queues granted by Set Features.
    pub num_io_queues: u16,
    /// Connected I/O queue ids.
    pub io_queues: Vec<u16>,
}

impl Controller {
    /// A controller for an admin queue Connect.
    pub fn new(
        cntlid: Cntlid,
        subsys: Arc<Subsystem>,
        port: Arc<Port>,
        hostnqn: String,
        hostid: [u8; 16],
        kato_ms: u32,
        now_ms: u64,
    ) -> Controller {
        let max_q = subsys.limits.max_io_queues;
        Controller {
            cntlid,
            subsys,
            port,
            hostnqn,
            hostid,
            inner: Mutex::new(Inner {
                state: CtrlState::Disabled,
                cc: Cc(0),
                aen_enabled: 0,
                events: VecDeque::new(),
                masked_logs: LidSet::default(),
                resv_log: VecDeque::new(),
                resv_count: 0,
                resv_lost: 0,
                resv_masks: std::collections::BTreeMap::new(),
                changed_ns: Vec::new(),
                changed_ns_overflow: false,
                num_io_queues: max_q,
                queues: vec![false; usize::from(max_q) + 1],
                error_log: VecDeque::new(),
                error_count: 0,
            }),
            dead: AtomicBool::new(false),
            kato_ms: AtomicU32::new(kato_ms),
            last_traffic_ms: AtomicU64::new(now_ms),
            aen_pending: AtomicBool::new(false),
            aborts: Mutex::new(Vec::new()),
            aborts_pending: AtomicBool::new(false),
            io_generation: AtomicU64::new(0),
            ns_view: Mutex::new(Arc::new(NsMap::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this is a discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subsys.kind == SubsysKind::Discovery
    }

    /// Whether the controller failed or was deleted (every queue must close).
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Current lifecycle state.
    pub fn state(&self) -> CtrlState {
        self.lock().state
    }

    /// Fails the controller (sticky) and wakes every queue to close.
    pub fn fail(&self, why: &str) {
        let mut g = self.lock();
        if let Ok(s) = g.state.transition(CtrlState::Failed) {
            if g.state != CtrlState::Failed {
                tracing::info!(cntlid = self.cntlid.0, subnqn = %self.subsys.nqn, "controller failed: {why}");
            }
            g.state = s;
        }
        drop(g);
        self.dead.store(true, Ordering::Release);
        self.subsys.unregister_controller(self.cntlid);
    }

    /// Deletes the controller because its admin queue went away: the host
    /// disconnected (normal) or the connection broke. Every queue closes.
    pub fn delete(&self, why: &str) {
        let was = {
            let mut g = self.lock();
            let was = g.state;
            if let Ok(s) = g.state.transition(CtrlState::Failed) {
                g.state = s;
            }
            was
        };
        if was != CtrlState::Failed {
            tracing::info!(cntlid = self.cntlid.0, subnqn = %self.subsys.nqn, hostnqn = %self.hostnqn, "controller deleted: {why}");
        }
        self.dead.store(true, Ordering::Release);
        self.subsys.unregister_controller(self.cntlid);
    }

    /// Whether commands other than Fabrics ones may run (CC.EN = 1, CSTS.RDY = 1).
    pub fn is_ready(&self) -> bool {
        self.lock().state == CtrlState::Ready
    }

    /// CAP.
    pub fn cap(&self) -> u64 {
        Cap {
            mqes: self.subsys.limits.max_queue_entries.saturating_sub(1),
            cqr: true,
            to: CAP_TO,
            css_nvm: true,
            mpsmin: 0,
            mpsmax: 0,
        }
        .to_u64()
    }

    /// VS.
    pub fn vs(&self) -> u32 {
        version(2, 0, 0)
    }

    /// CC.
    pub fn cc(&self) -> u32 {
        self.lock().cc.0
    }

    /// CSTS.
    pub fn csts(&self) -> u32 {
        let g = self.lock();
        match g.state {
            CtrlState::Disabled => 0,
            CtrlState::Ready => csts::RDY,
            CtrlState::ShutDown => csts::RDY | csts::SHST_COMPLETE,
            CtrlState::Failed => csts::CFS,
        }
    }

    /// Property Set CC (NVMe 2.0 §3.1.4.5): enable, disable (reset) or shut down.
    pub fn set_cc(&self, v: u32) -> Result<(), Status> {
        let new = Cc(v);
        let mut g = self.lock();
        let old = g.cc;
        let next = if new.shn() != 0 && old.en() {
            CtrlState::ShutDown
        } else if new.en() && !old.en() {
            // NVMe 2.0 §3.5.1: the host must select the NVM command set, 4 KiB pages,
            // 64-byte SQEs and 16-byte CQEs; anything else fails the enable.
            if new.css() != 0 || new.mps() != 0 || new.iosqes() != 6 || new.iocqes() != 4 {
                g.cc = new;
                if let Ok(s) = g.state.transition(CtrlState::Failed) {
                    g.state = s;
                }
                return Ok(());
            }
            CtrlState::Ready
        } else if !new.en() && old.en() {
            CtrlState::Disabled
        } else {
            g.state
        };
        match g.state.transition(next) {
            Ok(s) => {
                if s == CtrlState::Disabled && g.state != CtrlState::Disabled {
                    // Controller reset: every I/O queue goes away.
                    self.io_generation.fetch_add(1, Ordering::Release);
                    g.queues.iter_mut().for_each(|q| *q = false);
                    g.aen_enabled = 0;
                    g.events.clear();
                    g.masked_logs = LidSet::default();
                    // The Log Page Count starts at 0 after a controller reset.
                    g.resv_log.clear();
                    (g.resv_count, g.resv_lost) = (0, 0);
                }
                g.state = s;
                g.cc = new;
                Ok(())
            }
            Err(_) => Err(Status::INVALID_FIELD),
        }
    }

    /// The value I/O queues record at Connect; when it moves they close.
    pub fn io_generation(&self) -> u64 {
        self.io_generation.load(Ordering::Acquire)
    }

    /// Keep-alive timeout in ms (0 = disabled).
    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Relaxed)
    }

    /// Sets the keep-alive timeout; the value is rounded up to the KAS granularity.
    pub fn set_kato_ms(&self, ms: u32, now_ms: u64) -> u32 {
        let g = u32::from(KAS) * 100;
        let v = ms.div_ceil(g).saturating_mul(g);
        self.kato_ms.store(v, Ordering::Relaxed);
        self.last_traffic_ms.store(now_ms, Ordering::Relaxed);
        v
    }

    /// Records traffic: the keep-alive timer restarts (traffic-based keep alive, TBKAS).
    #[inline]
    pub fn touch(&self, at_ms: u64) {
        if self.last_traffic_ms.load(Ordering::Relaxed) < at_ms {
            self.last_traffic_ms.fetch_max(at_ms, Ordering::Relaxed);
        }
    }

    /// Whether the keep-alive timer expired at `now_ms`.
    pub fn keep_alive_expired(&self, now_ms: u64) -> bool {
        let kato = u64::from(self.kato_ms());
        kato != 0 && now_ms.saturating_sub(self.last_traffic_ms.load(Ordering::Relaxed)) > kato
    }

    /// Set Features Number of Queues: grants min(requested, limit).
    pub fn set_num_queues(&self, nsq: u32, ncq: u32) -> u16 {
        let want = nsq.min(ncq).max(1);
        let granted = u16::try_from(want.min(u32::from(self.subsys.limits.max_io_queues))).unwrap_or(1);
        self.lock().num_io_queues = granted;
        granted
    }

    /// I/O queues granted.
    pub fn num_io_queues(&self) -> u16 {
        self.lock().num_io_queues
    }

    /// Marks I/O queue `qid` connected; false if out of range or taken.
    pub fn attach_io_queue(&self, qid: QueueId) -> bool {
        let mut g = self.lock();
        let n = g.num_io_queues;
        match g.queues.get_mut(usize::from(qid.0)) {
            Some(slot) if qid.0 >= 1 && qid.0 <= n && !*slot => {
                *slot = true;
                true
            }
            _ => false,
        }
    }

    /// Marks I/O queue `qid` gone.
    pub fn detach_io_queue(&self, qid: QueueId) {
        if let Some(slot) = self.lock().queues.get_mut(usize::from(qid.0)) {
            *slot = false;
        }
    }

    /// Async event configuration.
    pub fn set_aen_enabled(&self, mask: u32) -> Result<u32, Status> {
        if mask & !AEN_SUPPORTED != 0 {
            return Err(Status::INVALID_FIELD);
        }
        self.lock().aen_enabled = mask;
        Ok(mask)
    }

    /// Async event configuration.
    pub fn aen_enabled(&self) -> u32 {
        self.lock().aen_enabled
    }

    /// Queues an asynchronous event if the host enabled it and the same kind
    /// is not waiting to be read.
    pub fn add_event(&self, ev: AsyncEvent) {
        let mut g = self.lock();
        let enabled = ev.always_reported() || ev.config_bit().is_some_and(|b| g.aen_enabled & b != 0);
        if !enabled || g.masked_logs.has(ev.log_page) || g.events.contains(&ev) {
            return;
        }
        g.events.push_back(ev);
        drop(g);
        self.aen_pending.store(true, Ordering::Release);
    }

    /// Takes the next event to report, masking its kind until its log page is read.
    pub fn take_event(&self) -> Option<AsyncEvent> {
        if !self.aen_pending.load(Ordering::Acquire) {
            return None;
        }
        let mut g = self.lock();
        let ev = g.events.pop_front();
        if let Some(e) = ev {
            g.masked_logs.set(e.log_page, true);
        }
        if g.events.is_empty() {
            self.aen_pending.store(false, Ordering::Release);
        }
        ev
    }

    /// Whether events wait for an AER (one relaxed load).
    #[inline]
    pub fn has_events(&self) -> bool {
        self.aen_pending.load(Ordering::Relaxed)
    }

    /// An Abort command for command `cid` of I/O queue `sqid`: `None` when there is nothing
    /// to ask (no such queue of this controller: not aborted), else the answer its queue's
    /// owner fills in on its next tick ([`AbortAnswer`]). At most [`ABORTS_MAX`] at once
    /// (Identify Controller ACL + 1), else Abort Command Limit Exceeded.
    pub fn request_abort(&self, sqid: u16, cid: u16) -> Result<Option<Arc<AbortAnswer>>, Status> {
        let attached = sqid >= 1 && self.lock().queues.get(usize::from(sqid)).copied().unwrap_or(false);
        if !attached {
            return Ok(None);
        }
        let mut a = self.aborts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        a.retain(|r| Arc::strong_count(&r.answer) > 1);
        if a.len() >= ABORTS_MAX {
            return Err(Status::ABORT_COMMAND_LIMIT_EXCEEDED);
        }
        let answer = Arc::new(AbortAnswer::default());
        a.push(AbortRequest { sqid, cid, answer: Arc::clone(&answer) });
        self.aborts_pending.store(true, Ordering::Release);
        Ok(Some(answer))
    }

    /// Whether Abort requests wait for an I/O queue (one load, on the queues' tick).
    #[inline]
    pub fn aborts_pending(&self) -> bool {
        self.aborts_pending.load(Ordering::Acquire)
    }

    /// The Abort requests for I/O queue `sqid`, taken off the list.
    pub fn take_aborts(&self, sqid: u16) -> Vec<AbortRequest> {
        let mut a = self.aborts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mine, rest) = std::mem::take(&mut *a).into_iter().partition(|r| r.sqid == sqid);
        *a = rest;
        if a.is_empty() {
            self.aborts_pending.store(false, Ordering::Release);
        }
        mine
    }

    /// A log page was read with RAE clear: its event kind may be reported again.
    pub fn log_read(&self, lid: u8) {
        self.lock().masked_logs.set(lid, false);
    }

    /// A reservation notification for this controller's host about namespace `nsid`
    /// ([`resv_notice`] type): unless the host masked that type for the namespace (FID
    /// 82h), a Reservation Notification log page is queued and Reservation Log Page
    /// Available is raised (NVMe Base 2.0 §8.19; nvmet `nvmet_pr_add_resv_log`).
    pub fn reservation_notice(&self, nsid: Nsid, notice: u8) {
        {
            let mut g = self.lock();
            let mask = g.resv_masks.get(&nsid.0).copied().unwrap_or(0);
            if mask & (1 << (notice & 31)) != 0 {
                return;
            }
            // 64-bit, wraps to 1: 0 marks an empty page.
            g.resv_count = g.resv_count.checked_add(1).unwrap_or(1);
            if g.resv_log.len() < RESV_LOG_ENTRIES {
                let count = g.resv_count;
                g.resv_log.push_back(ResvNotification { count, notice, available: 0, nsid });
                // The count of the page just stored shows the ones lost before it.
                g.resv_lost = 0;
            } else {
                g.resv_lost += 1;
                tracing::debug!(cntlid = self.cntlid.0, nsid = nsid.0, "reservation notification lost: log full");
            }
        }
        self.add_event(AsyncEvent::RESERVATION_LOG);
    }

    /// Get Log Page 80h: takes the oldest notification (an empty page when none waits),
    /// with the number still waiting after it. When it is the last and notifications were
    /// lost after it, its count is that of the last lost one, so the host sees the gap now
    /// rather than at the next notification (as nvmet reports its lost count).
    pub fn take_reservation_log(&self) -> ResvNotification {
        let mut g = self.lock();
        let Some(mut page) = g.resv_log.pop_front() else {
            return ResvNotification::default();
        };
        page.available = u8::try_from(g.resv_log.len()).unwrap_or(u8::MAX);
        if g.resv_log.is_empty() && g.resv_lost > 0 {
            page.count = g.resv_count;
            g.resv_lost = 0;
        }
        page
    }

    /// Reservation notifications waiting to be read.
    pub fn reservation_log_len(&self) -> usize {
        self.lock().resv_log.len()
    }

    /// The Reservation Notification Mask of namespace `nsid` (FID 82h).
    pub fn resv_mask(&self, nsid: Nsid) -> u32 {
        self.lock().resv_masks.get(&nsid.0).copied().unwrap_or(0)
    }

    /// Sets the Reservation Notification Mask of the namespaces `nsids`: kept per
    /// controller, as Set Features is the host's choice for itself (nvmet and SPDK keep one
    /// mask per namespace for every controller: one host masking a type silences it for
    /// all). Refuses bits other than [`RESV_MASK_BITS`].
    pub fn set_resv_mask(&self, nsids: impl IntoIterator<Item = Nsid>, mask: u32) -> Result<(), Status> {
        if mask & !RESV_MASK_BITS != 0 {
            return Err(Status::INVALID_FIELD);
        }
        let mut g = self.lock();
        for n in nsids {
            if mask == 0 {
                g.resv_masks.remove(&n.0);
            } else {
                g.resv_masks.insert(n.0, mask);
            }
        }
        Ok(())
    }

    /// The namespaces this controller's host sees. Queues cache it and re-read it when the
    /// subsystem's namespace generation moves (see [`Subsystem::namespaces_of`]).
    pub fn namespaces(&self) -> Arc<NsMap> {
        Arc::clone(&self.ns_view.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Replaces the namespaces its host sees; returns the previous map (the subsystem
    /// compares them to tell the host what changed).
    pub(crate) fn set_namespaces(&self, view: Arc<NsMap>) -> Arc<NsMap> {
        std::mem::replace(&mut *self.ns_view.lock().unwrap_or_else(std::sync::PoisonError::into_inner), view)
    }

    /// A namespace was added, removed or changed.
    pub fn namespace_changed(&self, nsid: Nsid) {
        {
            let mut g = self.lock();
            if !g.changed_ns.contains(&nsid) {
                if g.changed_ns.len() >= 1024 {
                    g.changed_ns_overflow = true;
                } else {
                    g.changed_ns.push(nsid);
                }
            }
        }
        self.add_event(AsyncEvent::NS_CHANGED);
    }

    /// Takes the changed namespace list (`None` = overflowed).
    pub fn take_changed_ns(&self) -> Option<Vec<Nsid>> {
        let mut g = self.lock();
        let overflow = std::mem::take(&mut g.changed_ns_overflow);
        let list = std::mem::take(&mut g.changed_ns);
        if overflow { None } else { Some(list) }
    }

    /// Records command `sqe`, which failed with `status` on queue `sqid`, in the error log
    /// (NVMe Base 2.0 §5.16.1.2). Every failed command gets an entry, as every one nvmet
    /// gives an error location does; the completion's More bit is left clear (a host
    /// learns of entries from the SMART page's count, which Linux hosts read anyway).
    pub fn log_error(&self, sqid: u16, sqe: &Sqe, status: Status) {
        let admin = sqid == 0;
        let mut g = self.lock();
        g.error_count += 1;
        let e = ErrorLogEntry {
            error_count: g.error_count,
            sqid,
            cid: sqe.cid().0,
            status: status.to_wire(),
            param_error_location: error_location(admin, sqe.opcode(), status),
            lba: if !admin && has_lba(sqe.opcode()) { sqe.slba() } else { 0 },
            nsid: sqe.nsid().0,
            // A data digest error is the transport's; the rest are the command's.
            trtype: if status == Status::TRANSIENT_TRANSPORT_ERROR { trtype::TCP } else { 0 },
        };
        if g.error_log.len() == ERROR_LOG_ENTRIES {
            g.error_log.pop_back();
        }
        g.error_log.push_front(e);
    }

    /// The error log, newest first, and the total error count.
    pub fn error_log(&self) -> (Vec<ErrorLogEntry>, u64) {
        let g = self.lock();
        (g.error_log.iter().copied().collect(), g.error_count)
    }

    /// A report line for RPC.
    pub fn info(&self) -> ControllerInfo {
        let g = self.lock();
        ControllerInfo {
            cntlid: self.cntlid.0,
            subnqn: self.subsys.nqn.clone(),
            hostnqn: self.hostnqn.clone(),
            port: self.port.id,
            state: g.state,
            kato_ms: self.kato_ms(),
            num_io_queues: g.num_io_queues,
            io_queues: g
                .queues
                .iter()
                .enumerate()
                .filter(|(_, c)| **c)
                .filter_map(|(i, _)| u16::try_from(i).ok())
                .collect(),
        }
    }
}

/// Hands the notices of a reservation change on namespace `nsid` of `subsys` to every
/// controller of each host named (a host with several controllers, one per path, hears on
/// each, as in nvmet).
pub fn notify_reservation(subsys: &Subsystem, nsid: Nsid, notices: &[Notice]) {
    if notices.is_empty() {
        return;
    }
    for c in subsys.controllers() {
        for n in notices.iter().filter(|n| n.hostid == c.hostid) {
            c.reservation_notice(nsid, n.notice);
        }
    }
}

/// Whether an I/O opcode carries a starting LBA in CDW10-11 (the error log's LBA field).
fn has_lba(opcode: u8) -> bool {
    matches!(opcode, io::READ | io::WRITE | io::WRITE_ZEROES | io::COMPARE | io::VERIFY | io::WRITE_UNCORRECTABLE)
}

/// The Parameter Error Location of a failed command: the SQE byte (and bit) the status
/// is about, where one field is (as nvmet's `req->error_loc`), else "not applicable".
fn error_location(admin: bool, opcode: u8, status: Status) -> u16 {
    // SQE layout: opcode byte 0, NSID 4-7, DPTR 24-39 (SGL: address 24, length 32,
    // identifier 39), CDW10 at 40.
    let at = |byte, bit| nvme::log::error_location(byte, bit);
    match status {
        Status::INVALID_OPCODE | Status::RESERVATION_CONFLICT => at(0, 0),
        Status::INVALID_NS => at(4, 0),
        Status::SGL_OFFSET_INVALID => at(24, 0),
        Status::DATA_SGL_LENGTH_INVALID => at(32, 0),
        Status::SGL_DESCRIPTOR_TYPE_INVALID => at(39, 0),
        Status::LBA_OUT_OF_RANGE | Status::CAPACITY_EXCEEDED if !admin && has_lba(opcode) => at(40, 0),
        Status::INVALID_LOG_PAGE | Status::FEATURE_NOT_CHANGEABLE | Status::FEATURE_NOT_NS_SPECIFIC if admin => {
            at(40, 0)
        }
        // Set Features CDW10 bit 31: SV.
        Status::FEATURE_NOT_SAVEABLE if admin => at(43, 7),
        _ => nvme::log::NO_ERROR_LOCATION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::PortKind;
    use crate::subsystem::{HostAccess, SubsysLimits};

    fn ctrl() -> Controller {
        let s = Arc::new(
            Subsystem::new("nqn.t", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).unwrap(),
        );
        let p = Arc::new(Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io));
        Controller::new(Cntlid(1), s, p, "nqn.h".into(), [0; 16], 5000, 0)
    }

    #[test]
    fn lifecycle() {
        let c = ctrl();
        assert_eq!(c.csts(), 0);
        c.set_cc(Cc::enable_value().0).unwrap();
        assert_eq!(c.state(), CtrlState::Ready);
        assert_eq!(c.csts() & csts::RDY, csts::RDY);
        assert!(c.attach_io_queue(QueueId(1)));
        assert!(!c.attach_io_queue(QueueId(1)));
        let g = c.io_generation();
        c.set_cc(0).unwrap();
        assert_eq!(c.state(), CtrlState::Disabled);
        assert_ne!(c.io_generation(), g);
        assert!(c.attach_io_queue(QueueId(1)));
        c.set_cc(Cc::enable_value().0).unwrap();
        c.set_cc(Cc::enable_value().0 | (1 << 14)).unwrap();
        assert_eq!(c.csts() & csts::SHST_MASK, csts::SHST_COMPLETE);
    }

    #[test]
    fn bad_enable_fails_controller() {
        let c = ctrl();
        c.set_cc(1 | (7 << 16)).unwrap();
        assert_eq!(c.state(), CtrlState::Failed);
        assert_eq!(c.csts(), csts::CFS);
        assert!(CtrlState::Failed.transition(CtrlState::Ready).is_err());
    }

    #[test]
    fn events_mask_until_log_read() {
        let c = ctrl();
        c.add_event(AsyncEvent::ANA_CHANGE);
        assert_eq!(c.take_event(), None, "disabled by default");
        c.set_aen_enabled(AEN_SUPPORTED).unwrap();
        c.add_event(AsyncEvent::ANA_CHANGE);
        c.add_event(AsyncEvent::ANA_CHANGE);
        assert_eq!(c.take_event(), Some(AsyncEvent::ANA_CHANGE));
        assert_eq!(c.take_event(), None);
        c.add_event(AsyncEvent::ANA_CHANGE);
        assert_eq!(c.take_event(), None, "masked until the ANA log is read");
        c.log_read(nvme::log::lid::ANA);
        c.add_event(AsyncEvent::ANA_CHANGE);
        assert_eq!(c.take_event(), Some(AsyncEvent::ANA_CHANGE));
        assert!(c.set_aen_enabled(1).is_err());
    }

    #[test]
    fn error_log_entries_locate_the_field_and_keep_the_newest() {
        use nvme::{Cid, SglDescriptor};
        let c = ctrl();
        let read = Sqe::rw(io::READ, Cid(7), Nsid(1), 5000, 7, SglDescriptor::transport(4096));
        c.log_error(2, &read, Status::LBA_OUT_OF_RANGE);
        let mut gl = Sqe::get_log_page(Cid(8), Nsid::BROADCAST, 0x42, 0, false, 512, 0);
        c.log_error(0, &gl, Status::INVALID_LOG_PAGE);
        gl.set_cid(Cid(9));
        c.log_error(1, &gl, Status::TRANSIENT_TRANSPORT_ERROR);
        let (entries, count) = c.error_log();
        assert_eq!(count, 3);
        let (newest, lba_err) = (entries[0], entries[2]);
        assert_eq!((lba_err.error_count, lba_err.sqid, lba_err.cid, lba_err.nsid), (1, 2, 7, 1));
        assert_eq!((lba_err.lba, lba_err.param_error_location), (5000, 40));
        assert_eq!(Status::from_wire(lba_err.status), Status::LBA_OUT_OF_RANGE);
        assert_eq!(lba_err.status & 1, 0, "phase tag");
        assert_eq!((entries[1].lba, entries[1].param_error_location), (0, 40), "admin: no LBA, LID field");
        assert_eq!((newest.error_count, newest.trtype, newest.param_error_location), (3, trtype::TCP, 0xffff));
        for _ in 0..ERROR_LOG_ENTRIES {
            c.log_error(1, &read, Status::INTERNAL);
        }
        let (entries, count) = c.error_log();
        assert_eq!((entries.len(), count), (ERROR_LOG_ENTRIES, 3 + ERROR_LOG_ENTRIES as u64));
        assert_eq!(entries[0].error_count, count, "newest first");
    }

    #[test]
    fn reservation_notifications_queue_mask_count_and_report_losses() {
        use nvme::log::resv_notice::*;
        let c = ctrl();
        assert_eq!(c.take_reservation_log(), ResvNotification::default(), "empty page");
        c.reservation_notice(Nsid(1), REGISTRATION_PREEMPTED);
        c.reservation_notice(Nsid(2), RESERVATION_RELEASED);
        // The event is raised without any Asynchronous Event Configuration bit, once.
        assert_eq!(c.take_event(), Some(AsyncEvent::RESERVATION_LOG));
        c.reservation_notice(Nsid(1), RESERVATION_PREEMPTED);
        assert_eq!(c.take_event(), None, "masked until LID 80h is read");
        let p = c.take_reservation_log();
        assert_eq!((p.count, p.notice, p.available, p.nsid), (1, REGISTRATION_PREEMPTED, 2, Nsid(1)));
        let p = c.take_reservation_log();
        assert_eq!((p.count, p.notice, p.available, p.nsid), (2, RESERVATION_RELEASED, 1, Nsid(2)));
        c.log_read(nvme::log::lid::RESERVATION);
        // The mask is per namespace: namespace 1's releases are masked, namespace 2's not.
        assert_eq!(c.set_resv_mask([Nsid(1)], 1 << 4), Err(Status::INVALID_FIELD));
        c.set_resv_mask([Nsid(1)], 1 << RESERVATION_RELEASED).unwrap();
        assert_eq!((c.resv_mask(Nsid(1)), c.resv_mask(Nsid(2))), (1 << RESERVATION_RELEASED, 0));
        c.reservation_notice(Nsid(1), RESERVATION_RELEASED);
        c.reservation_notice(Nsid(2), RESERVATION_RELEASED);
        assert_eq!(c.take_event(), Some(AsyncEvent::RESERVATION_LOG));
        assert_eq!(c.take_reservation_log().count, 3);
        assert_eq!(c.take_reservation_log().count, 4, "namespace 2's; namespace 1's was masked");
        assert_eq!(c.take_reservation_log(), ResvNotification::default());
        // A full queue loses notifications; the last page read shows how many.
        for _ in 0..RESV_LOG_ENTRIES + 3 {
            c.reservation_notice(Nsid(2), RESERVATION_PREEMPTED);
        }
        assert_eq!(c.reservation_log_len(), RESV_LOG_ENTRIES);
        let first = c.take_reservation_log();
        assert_eq!((first.count, usize::from(first.available)), (5, RESV_LOG_ENTRIES - 1));
        let mut last = first;
        while c.reservation_log_len() > 0 {
            last = c.take_reservation_log();
        }
        assert_eq!(last.count, 4 + RESV_LOG_ENTRIES as u64 + 3, "the 3 lost ones are counted");
        c.reservation_notice(Nsid(2), RESERVATION_PREEMPTED);
        assert_eq!(c.take_reservation_log().count, last.count + 1, "no gap after it");
        // A controller reset starts the count again.
        c.set_cc(Cc::enable_value().0).unwrap();
        c.reservation_notice(Nsid(2), RESERVATION_PREEMPTED);
        c.set_cc(0).unwrap();
        assert_eq!(c.take_reservation_log(), ResvNotification::default());
        c.reservation_notice(Nsid(2), RESERVATION_PREEMPTED);
        assert_eq!(c.take_reservation_log().count, 1);
    }

    #[test]
    fn keep_alive() {
        let c = ctrl();
        assert_eq!(c.set_kato_ms(4500, 0), 5000);
        assert!(!c.keep_alive_expired(5000));
        assert!(c.keep_alive_expired(5001));
        c.touch(5001);
        assert!(!c.keep_alive_expired(9000));
    }
}
