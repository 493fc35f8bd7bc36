//! A simulated path's controller as the production block core sees it: the
//! [`CoreController`] view of the simulator's path state, and the [`CoreHead`] of the
//! multipath head over the two paths.
//!
//! Each holds the production controller machine ([`CtrlMachine`]): its lifecycle,
//! keep-alive schedule and expiry, AER and ANA re-reads, reset and reconnect timing,
//! generation and `ctrl_loss_tmo` / `fast_io_fail_tmo` are the production decisions,
//! stepped by `world.rs` in virtual time over the simulated admin link, with the
//! production bring-up ([`host::controller::bringup`]) for each association it connects.
//! The host's decisions read this view through the
//! traits the production `Controller` and `Head` implement:
//!
//! ```text
//!   world.rs ── poll / on_* ──► CtrlMachine ── generation, should_fail_io ──► CoreController
//!      ANA / link ── sync ──► SimCtrl (atomics): path_class, hold
//!      the scan's NsInfo ── listed ──► SimCtrl: geometry, identifiers (what the scan read)
//!   ◄── take_io_failure, take_ana_refresh ◄── report_io_failure, request_ana_refresh
//! ```
//!
//! Everything runs on the simulator's one thread: the atomics are there because the
//! traits take `&self`, never for another thread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use host::context::ctrlview::{CoreController, NsIds};
use host::controller::{CtrlMachine, MachineConfig, NsInfo};
use host::head::Head;
use host::mpath::{LinkState, PathClass, Policy};
use nvme::{AnaState, Nsid};

/// The only namespace of the simulated subsystem.
pub const NSID: Nsid = Nsid(1);

/// One path's controller, as its host knows it.
#[derive(Debug)]
pub struct SimCtrl {
    traddr: SocketAddr,
    /// The production controller machine, stepped by the world.
    machine: Mutex<CtrlMachine>,
    /// The world's virtual time, ns (what `should_fail_io` compares with).
    clock: Arc<AtomicU64>,
    change_count: AtomicU64,
    /// The ANA state of the namespace's group as last read (`AnaState as u8`).
    ana: AtomicU8,
    /// The controller is live with its I/O queue connected.
    live: AtomicBool,
    cntlid: AtomicU16,
    hold_ns: AtomicU64,
    /// Namespace 1 as the last successful scan read it (`None`: not listed, the target
    /// removed it), as the production `Controller` keeps its scan's list.
    listed: Mutex<Option<NsInfo>>,
    /// Reports the host's I/O side made that the stand-in has not acted on yet.
    io_failure: Mutex<Option<String>>,
    ana_refresh: AtomicBool,
    /// Whether a write lost with its connection is held ([`Options::failover_quiesce`](crate::Options)).
    quiesce: bool,
}

impl SimCtrl {
    /// A controller not connected yet, following `cfg` in the time of `clock`, its
    /// namespace assumed to be `assumed` (what the application was told to open: the
    /// target's namespace 1 as configured) until a scan reads it. Without `quiesce` its
    /// failover hold is zero (the bug the hold fixes, on purpose).
    pub fn new(cfg: MachineConfig, clock: Arc<AtomicU64>, assumed: NsInfo, quiesce: bool) -> Arc<SimCtrl> {
        Arc::new(SimCtrl {
            traddr: cfg.traddr,
            machine: Mutex::new(CtrlMachine::new(cfg)),
            clock,
            change_count: AtomicU64::new(1),
            ana: AtomicU8::new(AnaState::Change as u8),
            live: AtomicBool::new(false),
            cntlid: AtomicU16::new(0),
            hold_ns: AtomicU64::new(0),
            listed: Mutex::new(Some(assumed)),
            io_failure: Mutex::new(None),
            ana_refresh: AtomicBool::new(false),
            quiesce,
        })
    }

    fn changed(&self) {
        self.change_count.fetch_add(1, Relaxed);
    }

    /// The controller machine (the world steps it; nothing else holds it across a call).
    pub fn machine(&self) -> MutexGuard<'_, CtrlMachine> {
        self.machine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next action of the machine at the world's time now, if any.
    pub fn poll(&self) -> Option<host::controller::Action> {
        let now = self.clock.load(Relaxed);
        let before = self.generation();
        let before = (before, self.machine().state());
        let a = self.machine().poll(now);
        let generation = self.generation();
        let after = (generation, self.machine().state());
        if after != before {
            // A new association (queues of the older one are stale), or the controller
            // given up: the core re-reads its paths.
            self.changed();
        }
        a
    }

    /// The controller came up as `cntlid`, with failover hold `hold`
    /// ([`host::failover::hold_time`] of its Identify Controller).
    pub fn enabled(&self, cntlid: u16, hold: Duration) {
        self.cntlid.store(cntlid, Relaxed);
        self.hold_ns.store(u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// The host's view of the path now: the ANA state it last read and whether the
    /// controller is live with its I/O queue up. A change moves the change count.
    pub fn set_state(&self, ana: AnaState, live: bool) {
        let was = (self.ana.swap(ana as u8, Relaxed), self.live.swap(live, Relaxed));
        if was != (ana as u8, live) {
            self.changed();
        }
    }

    /// A scan succeeded and read namespace 1 as `ns` (`None`: not in the active list). A
    /// change of its size or identifiers moves the change count.
    pub fn listed(&self, ns: Option<&NsInfo>) {
        let key = |n: &NsInfo| (n.block_shift, n.nsze, n.ids());
        let mut l = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = l.as_ref().map(key) != ns.map(key);
        *l = ns.cloned();
        drop(l);
        if changed {
            self.changed();
        }
    }

    fn with_listed<R>(&self, nsid: Nsid, f: impl FnOnce(&NsInfo) -> R) -> Option<R> {
        if nsid != NSID {
            return None;
        }
        self.listed.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(f)
    }

    /// The reset the I/O side asked for ([`CoreController::report_io_failure`]), once.
    pub fn take_io_failure(&self) -> Option<String> {
        self.io_failure.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Whether the I/O side asked for an ANA log read ([`CoreController::request_ana_refresh`]), once.
    pub fn take_ana_refresh(&self) -> bool {
        self.ana_refresh.swap(false, Relaxed)
    }

    fn ana(&self) -> AnaState {
        AnaState::from_u8(self.ana.load(Relaxed)).unwrap_or(AnaState::Change)
    }
}

impl CoreController for SimCtrl {
    type Head = Head<SimCtrl>;

    fn generation(&self) -> u64 {
        self.machine().generation()
    }

    fn change_count(&self) -> u64 {
        self.change_count.load(Relaxed)
    }

    fn is_live(&self) -> bool {
        self.live.load(Relaxed)
    }

    /// The machine's answer at the world's time now.
    fn should_fail_io(&self) -> bool {
        self.machine().should_fail_io(self.clock.load(Relaxed))
    }

    fn failover_hold(&self) -> Duration {
        if !self.quiesce {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hold_ns.load(Relaxed))
    }

    fn ctrl_loss_tmo(&self) -> Option<Duration> {
        self.machine().config().ctrl_loss_tmo
    }

    fn report_io_failure(&self, why: &str) {
        let mut f = self.io_failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.is_none() {
            *f = Some(why.to_string());
        }
    }

    fn request_ana_refresh(&self) {
        self.ana_refresh.store(true, Relaxed);
    }

    fn path_class(&self, nsid: Nsid) -> PathClass {
        if nsid != NSID {
            return PathClass::Gone;
        }
        // As the production head's `class_of`: the machine's state and fail-fast, except
        // that a live controller whose I/O queue is down is reconnecting it; a namespace
        // the last scan did not list is gone through a live controller.
        let state = self.machine().state();
        let fail_fast = self.should_fail_io();
        let link = match LinkState::of(state, fail_fast) {
            LinkState::Live if !self.is_live() => LinkState::Reconnecting,
            l => l,
        };
        PathClass::of_listed(self.with_listed(nsid, |_| self.ana()), link)
    }

    fn namespace_geometry(&self, nsid: Nsid) -> Option<(u8, u64)> {
        self.with_listed(nsid, |n| (n.block_shift, n.nsze))
    }

    /// What the last successful scan read (the production `Controller`'s rule).
    fn namespace_ids(&self, nsid: Nsid) -> Option<NsIds> {
        self.with_listed(nsid, NsInfo::ids)
    }

    fn traddr(&self) -> SocketAddr {
        self.traddr
    }

    fn cntlid(&self) -> u16 {
        self.cntlid.load(Relaxed)
    }
}

/// The multipath head of namespace [`NSID`] through each of `ctrls`: the production
/// [`Head`], over the simulator's controllers (its slots and policy stay as made for the
/// run). The device is opened on it with `BlockCore::open_multi`, which takes the
/// namespace's geometry and identity from the controllers, so the head's unique id is
/// not consulted (zero: unknown).
pub fn head(subnqn: &str, policy: Policy, ctrls: &[Arc<SimCtrl>]) -> Arc<Head<SimCtrl>> {
    let h = Head::new(subnqn, [0; 16], policy);
    for c in ctrls {
        h.add_path(Arc::clone(c), NSID);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> Arc<SimCtrl> {
        let cfg = MachineConfig {
            traddr: SocketAddr::from(([127, 0, 0, 1], 4420)),
            kato: Duration::from_millis(1500),
            reconnect_delay: Duration::from_millis(20),
            ctrl_loss_tmo: Some(Duration::from_secs(3)),
            fast_io_fail_tmo: None,
            aer: false,
        };
        SimCtrl::new(cfg, Arc::new(AtomicU64::new(0)), ns(128, 1), true)
    }

    fn ns(nsze: u64, id: u8) -> NsInfo {
        NsInfo {
            nsid: NSID,
            nsze,
            block_shift: 9,
            anagrpid: nvme::AnaGrpId(1),
            ana_state: AnaState::Optimized,
            nguid: [id; 16],
            eui64: [id; 8],
            uuid: Some([id; 16]),
            shared: true,
        }
    }

    #[test]
    fn the_class_follows_the_ana_state_read_and_the_link_and_every_change_moves_the_count() {
        let c = ctrl();
        assert_eq!(c.path_class(NSID), PathClass::Transient, "not connected yet");
        assert_eq!(c.poll(), Some(host::controller::Action::Connect));
        c.machine().on_connected(0, Ok(()));
        let n0 = c.change_count();
        c.set_state(AnaState::Optimized, true);
        assert_eq!(c.path_class(NSID), PathClass::Optimized);
        let n1 = c.change_count();
        assert!(n1 > n0);
        c.set_state(AnaState::Optimized, true);
        assert_eq!(c.change_count(), n1, "no change, no new count");
        c.set_state(AnaState::Inaccessible, true);
        assert_eq!(c.path_class(NSID), PathClass::Transient);
        c.set_state(AnaState::PersistentLoss, true);
        assert_eq!(c.path_class(NSID), PathClass::Gone);
        c.set_state(AnaState::NonOptimized, false);
        assert_eq!(c.path_class(NSID), PathClass::Transient, "reconnecting");
        assert_eq!(c.path_class(Nsid(2)), PathClass::Gone, "no such namespace");
        let n2 = c.change_count();
        c.listed(Some(&ns(64, 1)));
        assert_eq!(c.namespace_geometry(NSID), Some((9, 64)));
        assert!(c.change_count() > n2, "a resize moves the count");
        let (g, n3) = (c.generation(), c.change_count());
        c.machine().on_lost(1, "link down");
        assert_eq!(c.poll(), Some(host::controller::Action::TearDown));
        assert_eq!(c.generation(), g + 1, "the machine's generation");
        assert!(c.change_count() > n3, "a new association moves the count");
        c.set_state(AnaState::Optimized, true);
        assert_eq!(c.path_class(NSID), PathClass::Transient, "the controller is reconnecting");
    }

    #[test]
    fn the_identifiers_and_size_are_what_the_last_scan_read() {
        let c = ctrl();
        assert_eq!(c.namespace_ids(NSID).map(|i| i.nguid), Some([1; 16]), "as assumed until scanned");
        let n0 = c.change_count();
        c.listed(Some(&ns(128, 1)));
        assert_eq!(c.change_count(), n0, "the same namespace read again: no change");
        c.listed(None);
        assert_eq!((c.namespace_ids(NSID), c.namespace_geometry(NSID)), (None, None), "removed");
        assert!(c.change_count() > n0);
        assert_eq!(c.poll(), Some(host::controller::Action::Connect));
        c.machine().on_connected(0, Ok(()));
        c.set_state(AnaState::Optimized, true);
        assert_eq!(c.path_class(NSID), PathClass::Gone, "not listed by a live controller");
        let n1 = c.change_count();
        c.listed(Some(&ns(128, 2)));
        assert!(c.change_count() > n1, "another namespace under the NSID moves the count");
        assert_eq!(c.namespace_ids(NSID), Some(NsIds { nguid: [2; 16], eui64: [2; 8], uuid: Some([2; 16]) }));
        assert_eq!(c.path_class(NSID), PathClass::Optimized);
        assert_eq!(c.namespace_ids(Nsid(2)), None);
    }

    #[test]
    fn each_report_is_taken_once_and_the_first_reason_kept() {
        let c = ctrl();
        assert_eq!(c.take_io_failure(), None);
        c.report_io_failure("I/O timeout");
        c.report_io_failure("link down");
        assert_eq!(c.take_io_failure().as_deref(), Some("I/O timeout"));
        assert_eq!(c.take_io_failure(), None);
        assert!(!c.take_ana_refresh());
        c.request_ana_refresh();
        assert!(c.take_ana_refresh());
        assert!(!c.take_ana_refresh());
    }

    #[test]
    fn the_head_has_a_slot_per_controller_and_the_hold_is_the_one_set_at_enable() {
        let (a, b) = (ctrl(), ctrl());
        let h = head("nqn.x", Policy::QueueDepth, &[Arc::clone(&a), Arc::clone(&b)]);
        let slots = h.paths();
        assert_eq!(slots.len(), 2);
        assert!(slots[1].as_ref().is_some_and(|(c, n)| Arc::ptr_eq(c, &b) && *n == NSID));
        a.enabled(3, Duration::from_millis(750));
        assert_eq!((a.cntlid(), a.failover_hold()), (3, Duration::from_millis(750)));
        assert!(!a.should_fail_io());
    }

    #[test]
    fn io_fails_once_the_machine_gives_the_controller_up_in_virtual_time() {
        let c = ctrl();
        assert_eq!(c.poll(), Some(host::controller::Action::Connect));
        c.machine().on_connected(0, Err("refused".into()));
        assert!(!c.should_fail_io());
        c.clock.store(3_000_000_000, Relaxed);
        assert_eq!(c.ctrl_loss_tmo(), Some(Duration::from_secs(3)));
        let n = c.change_count();
        assert_eq!(c.poll(), Some(host::controller::Action::Lost));
        assert!(c.should_fail_io(), "dead: waiting I/O fails");
        assert!(c.change_count() > n, "the core re-reads its paths");
        assert_eq!(c.path_class(NSID), PathClass::Gone);
    }
}
