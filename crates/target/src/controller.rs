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
use nvme::log::ErrorLogEntry;
use nvme::{Cntlid, Nsid, QueueId, Status};

use crate::namespace::NsMap;
use crate::port::Port;
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

/// Why a lifecycle transition was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadTransition {
    /// State before.
    pub from: CtrlState,
    /// Requested state.
    pub to: CtrlState,
}

impl CtrlState {
    /// The one place lifecycle changes are decided.
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
pub const AEN_SUPPORTED: u32 = (1 << 8) | (1 << 11) | (1 << 31);

struct Inner {
    state: CtrlState,
    cc: Cc,
    aen_enabled: u32,
    events: VecDeque<AsyncEvent>,
    /// Log pages whose event was reported and not yet read: further events of that kind wait.
    masked_logs: u32,
    changed_ns: Vec<Nsid>,
    changed_ns_overflow: bool,
    num_io_queues: u16,
    queues: Vec<bool>,
    error_log: VecDeque<ErrorLogEntry>,
    error_count: u64,
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
                masked_logs: 0,
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
        let enabled = ev.config_bit().is_some_and(|b| g.aen_enabled & b != 0);
        let bit = 1u32 << (ev.log_page & 31);
        if !enabled || g.masked_logs & bit != 0 || g.events.contains(&ev) {
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
            g.masked_logs |= 1u32 << (e.log_page & 31);
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

    /// A log page was read with RAE clear: its event kind may be reported again.
    pub fn log_read(&self, lid: u8) {
        self.lock().masked_logs &= !(1u32 << (lid & 31));
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

    /// Records a failed command in the error log.
    pub fn log_error(&self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        let mut g = self.lock();
        g.error_count += 1;
        let e = ErrorLogEntry {
            error_count: g.error_count,
            sqid,
            cid,
            status: status.to_wire(),
            param_error_location: 0xffff,
            lba,
            nsid,
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
    fn keep_alive() {
        let c = ctrl();
        assert_eq!(c.set_kato_ms(4500, 0), 5000);
        assert!(!c.keep_alive_expired(5000));
        assert!(c.keep_alive_expired(5001));
        c.touch(5001);
        assert!(!c.keep_alive_expired(9000));
    }
}
