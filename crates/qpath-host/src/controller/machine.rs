//! The controller's admin life as a step machine with no I/O, no thread and no clock of
//! its own: the lifecycle ([`CtrlState`] and its transition table), the keep-alive
//! schedule, the outstanding Asynchronous Event Request, ANA-log re-reads and namespace
//! rescans, reset on a lost queue, reconnect every `reconnect_delay`, the association's
//! generation, and the `ctrl_loss_tmo` / `fast_io_fail_tmo` deadlines.
//!
//! The admin thread ([`super::Controller`]) drives it over a real admin queue; the
//! simulator drives the same machine over its simulated admin link in virtual time.
//! Time is whatever the driver passes (ns from any origin, never going back).
//!
//! ```text
//!   driver                         CtrlMachine
//!     poll(now) ─────────────────► Send(KeepAlive | AsyncEventRequest | AnaLog | Rescan)
//!                                  TearDown (state Connecting, generation + 1)
//!                                  Connect  (bring up admin + I/O queues)
//!                                  Delete { shutdown } | Lost (state Dead)
//!     on_admin_done(cmd, ok) ────►
//!     on_event(AsyncEvent) ──────► AnaLog / Rescan due, the AER re-armed
//!     on_connected(now, result) ─► Live, or the next attempt after reconnect_delay
//!     on_lost(now, why) ─────────► Resetting (then TearDown)
//!     next_deadline() ◄─────────── when to poll again at the latest
//! ```
//!
//! Each action is handed out once: the machine counts its command as outstanding from
//! then on, and the driver answers it (or reports the association lost).

use std::net::SocketAddr;
use std::time::Duration;

use nvme::features::{AsyncEvent, aer_notice, aer_type};

use super::{ConnectOptions, CtrlState};

/// An admin command the machine asks the driver to send on the live admin queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminCmd {
    /// Keep Alive (NVMe Base 2.x §5.2.12): proves the host is there, and the answer
    /// proves the controller is.
    KeepAlive,
    /// The one Asynchronous Event Request kept outstanding (§5.2.2).
    AsyncEventRequest,
    /// Re-read the ANA states (§5.16.1.12): after an ANA change notice, or an I/O that
    /// completed with an ANA status.
    AnaLog,
    /// A namespace attribute changed (§5.16.1.5): read the Changed Namespace List (which
    /// re-arms the notice) and identify the namespaces again.
    Rescan,
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this command on the live admin queue; answer with [`CtrlMachine::on_admin_done`]
    /// (or, for the event request, [`CtrlMachine::on_event`]).
    Send(AdminCmd),
    /// The association failed: drop its admin queue and every I/O queue. The machine is
    /// `Connecting` under a new generation already; a `Connect` follows.
    TearDown,
    /// Bring up a new association (admin queue, enable, identify, I/O queues, namespaces,
    /// ANA); answer with [`CtrlMachine::on_connected`].
    Connect,
    /// Deleted on request: shut the controller down first if `shutdown` (it was live),
    /// then drop everything. The machine is `Dead`.
    Delete {
        /// The association is live: a normal shutdown (CC.SHN) goes first.
        shutdown: bool,
    },
    /// `ctrl_loss_tmo` passed without a connection: the controller is given up and
    /// `Dead`; I/O waiting for it fails.
    Lost,
}

/// The options the machine follows (names as in `nvme connect`).
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// Where the controller is (for the logs only).
    pub traddr: SocketAddr,
    /// Keep Alive Timeout; zero: no keep-alive.
    pub kato: Duration,
    /// Between reconnect attempts.
    pub reconnect_delay: Duration,
    /// Give up after this long without a connection (`None`: never).
    pub ctrl_loss_tmo: Option<Duration>,
    /// Fail waiting I/O after this long without a connection (`None`: wait).
    pub fast_io_fail_tmo: Option<Duration>,
    /// Keep an Asynchronous Event Request outstanding while live.
    pub aer: bool,
}

impl MachineConfig {
    /// The machine's part of `opts`.
    pub fn of(opts: &ConnectOptions) -> MachineConfig {
        MachineConfig {
            traddr: opts.traddr,
            kato: Duration::from_millis(u64::from(opts.kato_ms)),
            reconnect_delay: opts.reconnect_delay,
            ctrl_loss_tmo: opts.ctrl_loss_tmo,
            fast_io_fail_tmo: opts.fast_io_fail_tmo,
            aer: true,
        }
    }
}

/// Work owed to an admin command kind: nothing, due, or outstanding (and maybe due again
/// once it answers, when asked for meanwhile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Owed {
    due: bool,
    outstanding: bool,
}

/// One controller's admin life (module docs).
#[derive(Debug)]
pub struct CtrlMachine {
    cfg: MachineConfig,
    state: CtrlState,
    /// Bumped at every new association: queues of an older one are stale.
    generation: u64,
    /// When the controller last stopped being live (ns); `None` while live.
    failed_at: Option<u64>,
    /// A `poll` saw `fast_io_fail_tmo` pass (Linux `NVME_CTRL_FAILFAST_EXPIRED`): no
    /// longer a deadline to wake for.
    failfast_expired: bool,
    /// When the next connect attempt may start (ns), while `Connecting`.
    retry_at: u64,
    /// A `Connect` handed out and not answered yet.
    connecting: bool,
    /// When the last Keep Alive went out (or the association went live), ns.
    ka_last: u64,
    ka_outstanding: bool,
    aer_outstanding: bool,
    /// The event request failed: not re-armed until the next association (as Linux, which
    /// stops asking after an aborted one).
    aer_stopped: bool,
    ana: Owed,
    rescan: Owed,
    delete: bool,
    last_error: Option<String>,
    reconnects: u64,
}

impl CtrlMachine {
    /// A controller never connected: the first `poll` asks to connect.
    pub fn new(cfg: MachineConfig) -> CtrlMachine {
        CtrlMachine {
            cfg,
            state: CtrlState::New,
            generation: 0,
            failed_at: None,
            failfast_expired: false,
            retry_at: 0,
            connecting: false,
            ka_last: 0,
            ka_outstanding: false,
            aer_outstanding: false,
            aer_stopped: false,
            ana: Owed::default(),
            rescan: Owed::default(),
            delete: false,
            last_error: None,
            reconnects: 0,
        }
    }

    /// A controller whose first association the caller brought up at `now`: `Live`,
    /// generation 1.
    pub fn live(cfg: MachineConfig, now: u64) -> CtrlMachine {
        let mut m = CtrlMachine::new(cfg);
        m.state = CtrlState::Live;
        m.generation = 1;
        m.ka_last = now;
        m
    }

    /// Lifecycle state.
    pub fn state(&self) -> CtrlState {
        self.state
    }

    /// Whether the controller is live.
    pub fn is_live(&self) -> bool {
        self.state == CtrlState::Live
    }

    /// The association's generation (bumped at each new one).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Reconnects that brought the controller back.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    /// Why the controller last failed (or a connect attempt did).
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Notes an error the driver saw (shown to operators; changes nothing).
    pub fn set_last_error(&mut self, why: String) {
        self.last_error = Some(why);
    }

    /// The options.
    pub fn config(&self) -> &MachineConfig {
        &self.cfg
    }

    /// How long the controller has been down at `now`, if it is.
    pub fn down_for(&self, now: u64) -> Option<Duration> {
        self.failed_at.map(|t| Duration::from_nanos(now.saturating_sub(t)))
    }

    /// Whether I/O waiting for this controller fails at `now`: it is dead (deleted, or
    /// `ctrl_loss_tmo` passed), or down for `fast_io_fail_tmo` (Linux
    /// `nvme_failfast_work`, then `NVME_CTRL_FAILFAST_EXPIRED`).
    pub fn should_fail_io(&self, now: u64) -> bool {
        if self.state == CtrlState::Dead {
            return true;
        }
        match (self.down_for(now), self.cfg.fast_io_fail_tmo) {
            (Some(down), Some(tmo)) => down >= tmo,
            _ => false,
        }
    }

    /// An I/O completed with an ANA status: re-read the ANA log while live.
    pub fn request_ana_refresh(&mut self) {
        self.ana.due = true;
    }

    /// Delete the controller: the next `poll` hands out [`Action::Delete`].
    pub fn delete(&mut self) {
        self.delete = true;
    }

    /// The association was lost (an I/O queue or the admin queue failed, an admin command
    /// timed out): reset, unless it is not live (a connect under way reports through
    /// [`CtrlMachine::on_connected`]).
    pub fn on_lost(&mut self, now: u64, why: &str) {
        if self.state != CtrlState::Live {
            return;
        }
        tracing::warn!(traddr = %self.cfg.traddr, "controller reset: {why}");
        self.last_error = Some(why.to_string());
        let _ = self.go(CtrlState::Resetting, now);
    }

    /// The answer to a [`Action::Send`] (`ok`: it completed with success). A failed
    /// Keep Alive still counts as an answer (the controller is there); a failed ANA log or
    /// rescan is logged and waits for the next reason to read; a failed event request is
    /// not re-armed.
    pub fn on_admin_done(&mut self, cmd: AdminCmd, ok: bool) {
        let outstanding = match cmd {
            AdminCmd::KeepAlive => std::mem::replace(&mut self.ka_outstanding, false),
            AdminCmd::AsyncEventRequest => {
                self.aer_stopped |= !ok;
                std::mem::replace(&mut self.aer_outstanding, false)
            }
            AdminCmd::AnaLog => std::mem::replace(&mut self.ana.outstanding, false),
            AdminCmd::Rescan => std::mem::replace(&mut self.rescan.outstanding, false),
        };
        if !outstanding {
            tracing::error!(traddr = %self.cfg.traddr, ?cmd, "controller: an answer no command waits for");
        }
        if !ok {
            tracing::warn!(traddr = %self.cfg.traddr, ?cmd, "admin command failed");
        }
    }

    /// The event request completed with `ev`: an ANA change notice re-reads the ANA log,
    /// a namespace attribute notice rescans; the request is armed again.
    pub fn on_event(&mut self, ev: AsyncEvent) {
        self.on_admin_done(AdminCmd::AsyncEventRequest, true);
        tracing::info!(traddr = %self.cfg.traddr, ?ev, "asynchronous event");
        if ev.event_type != aer_type::NOTICE {
            return;
        }
        match ev.info {
            aer_notice::ANA_CHANGE => self.ana.due = true,
            aer_notice::NS_ATTR_CHANGED => self.rescan.due = true,
            _ => {}
        }
    }

    /// The answer to [`Action::Connect`]: live at `now`, or the next attempt after
    /// `reconnect_delay`.
    pub fn on_connected(&mut self, now: u64, r: Result<(), String>) {
        if !std::mem::replace(&mut self.connecting, false) {
            tracing::error!(traddr = %self.cfg.traddr, "controller: a connect answer no attempt waits for");
            return;
        }
        match r {
            Ok(()) => {
                if self.go(CtrlState::Live, now).is_ok() {
                    if self.generation > 1 {
                        self.reconnects += 1;
                    }
                    self.ka_last = now;
                    (self.ka_outstanding, self.aer_outstanding, self.aer_stopped) = (false, false, false);
                    (self.ana, self.rescan) = (Owed::default(), Owed::default());
                }
            }
            Err(why) => {
                tracing::debug!(traddr = %self.cfg.traddr, "connect failed: {why}");
                self.last_error = Some(why);
                self.retry_at = now.saturating_add(nanos(self.cfg.reconnect_delay));
            }
        }
    }

    /// The next action at `now`, if any; call until `None`, doing each.
    #[must_use = "an action handed out counts as under way"]
    pub fn poll(&mut self, now: u64) -> Option<Action> {
        if self.failfast_at().is_some_and(|t| now >= t) {
            self.failfast_expired = true;
        }
        match self.state {
            CtrlState::New => {
                if self.delete {
                    return self.retire(now, false);
                }
                self.generation += 1;
                self.go(CtrlState::Connecting, now).ok()?;
                self.connecting = true;
                Some(Action::Connect)
            }
            CtrlState::Live => self.poll_live(now),
            CtrlState::Resetting => {
                if self.delete {
                    return self.retire(now, false);
                }
                // NVMe Base 2.x §3.9: a new association; queues of the old one are stale.
                self.generation += 1;
                self.go(CtrlState::Connecting, now).ok()?;
                self.retry_at = now;
                Some(Action::TearDown)
            }
            CtrlState::Connecting => {
                if self.connecting {
                    return None;
                }
                if self.delete {
                    return self.retire(now, false);
                }
                if self.loss_at().is_some_and(|t| now >= t) {
                    tracing::warn!(traddr = %self.cfg.traddr, "ctrl_loss_tmo expired: controller deleted");
                    self.retire(now, false)?;
                    return Some(Action::Lost);
                }
                if now < self.retry_at {
                    return None;
                }
                self.connecting = true;
                Some(Action::Connect)
            }
            CtrlState::Deleting | CtrlState::Dead => None,
        }
    }

    fn poll_live(&mut self, now: u64) -> Option<Action> {
        if self.delete {
            return self.retire(now, true);
        }
        let kato = nanos(self.cfg.kato);
        if kato != 0 && self.ka_outstanding && now.saturating_sub(self.ka_last) >= kato {
            // Linux gives the Keep Alive a timeout of KATO and starts error recovery when
            // it passes: the link or the controller is gone, and this path's I/O fails over
            // now instead of when TCP gives up (about 15 minutes).
            tracing::warn!(traddr = %self.cfg.traddr, kato_ms = self.cfg.kato.as_millis(), "keep-alive timed out");
            self.last_error = Some(format!("keep-alive timed out after {} ms", self.cfg.kato.as_millis()));
            self.go(CtrlState::Resetting, now).ok()?;
            return self.poll(now);
        }
        // One at half the timeout (Linux sends every kato/2 since 6.x), one at a time.
        if kato != 0 && !self.ka_outstanding && now.saturating_sub(self.ka_last) >= kato / 2 {
            self.ka_outstanding = true;
            self.ka_last = now;
            return Some(Action::Send(AdminCmd::KeepAlive));
        }
        if self.cfg.aer && !self.aer_outstanding && !self.aer_stopped {
            self.aer_outstanding = true;
            return Some(Action::Send(AdminCmd::AsyncEventRequest));
        }
        if self.rescan.due && !self.rescan.outstanding {
            self.rescan = Owed { due: false, outstanding: true };
            return Some(Action::Send(AdminCmd::Rescan));
        }
        if self.ana.due && !self.ana.outstanding {
            self.ana = Owed { due: false, outstanding: true };
            return Some(Action::Send(AdminCmd::AnaLog));
        }
        None
    }

    /// The latest time the driver polls again (ns): the keep-alive's due time or expiry,
    /// the next connect attempt, `ctrl_loss_tmo`, `fast_io_fail_tmo`. `None`: only an
    /// input changes anything.
    pub fn next_deadline(&self) -> Option<u64> {
        let fast_fail = self.failfast_at().filter(|_| !self.failfast_expired && self.state != CtrlState::Dead);
        let own = match self.state {
            CtrlState::Live => {
                let kato = nanos(self.cfg.kato);
                let at = if self.ka_outstanding { kato } else { kato / 2 };
                (kato != 0).then(|| self.ka_last.saturating_add(at))
            }
            CtrlState::Connecting if !self.connecting => {
                Some(self.loss_at().map_or(self.retry_at, |l| l.min(self.retry_at)))
            }
            CtrlState::New | CtrlState::Resetting => Some(0),
            _ => None,
        };
        [own, fast_fail].into_iter().flatten().min()
    }

    /// When `fast_io_fail_tmo` passes, if it can.
    fn failfast_at(&self) -> Option<u64> {
        Some(self.failed_at?.saturating_add(nanos(self.cfg.fast_io_fail_tmo?)))
    }

    /// When `ctrl_loss_tmo` passes, if it can.
    fn loss_at(&self) -> Option<u64> {
        Some(self.failed_at?.saturating_add(nanos(self.cfg.ctrl_loss_tmo?)))
    }

    /// Deleting, then Dead.
    fn retire(&mut self, now: u64, shutdown: bool) -> Option<Action> {
        self.go(CtrlState::Deleting, now).ok()?;
        self.go(CtrlState::Dead, now).ok()?;
        self.connecting = false;
        Some(Action::Delete { shutdown })
    }

    /// The one place the state changes; a refusal is logged (in release builds too) and
    /// leaves the state as it was.
    #[must_use = "a refused transition leaves the state as it was"]
    fn go(&mut self, to: CtrlState, now: u64) -> Result<CtrlState, crate::error::BadTransition<CtrlState>> {
        let s = self.state.transition(to).inspect_err(|e| {
            tracing::error!(traddr = %self.cfg.traddr, from = ?e.from, to = ?e.to, "controller state change refused");
        })?;
        if s != self.state {
            tracing::info!(traddr = %self.cfg.traddr, from = ?self.state, to = ?s, "controller state");
        }
        self.state = s;
        if s == CtrlState::Live {
            self.failed_at = None;
            self.failfast_expired = false;
        } else if self.failed_at.is_none() {
            self.failed_at = Some(now);
        }
        Ok(s)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn cfg() -> MachineConfig {
        MachineConfig {
            traddr: SocketAddr::from(([127, 0, 0, 1], 4420)),
            kato: Duration::from_millis(1000),
            reconnect_delay: Duration::from_secs(2),
            ctrl_loss_tmo: Some(Duration::from_secs(10)),
            fast_io_fail_tmo: Some(Duration::from_secs(5)),
            aer: true,
        }
    }

    /// Every action `m` hands out at `now`.
    fn drain(m: &mut CtrlMachine, now: u64) -> Vec<Action> {
        std::iter::from_fn(|| m.poll(now)).take(32).collect()
    }

    /// A live machine with its event request armed (answered nothing yet).
    fn live_at(now: u64) -> CtrlMachine {
        let mut m = CtrlMachine::live(cfg(), now);
        assert_eq!(drain(&mut m, now), [Action::Send(AdminCmd::AsyncEventRequest)]);
        m
    }

    #[test]
    fn a_new_controller_connects_goes_live_under_generation_one_and_arms_its_event_request() {
        let mut m = CtrlMachine::new(cfg());
        assert_eq!((m.state(), m.generation(), m.next_deadline()), (CtrlState::New, 0, Some(0)));
        assert_eq!(drain(&mut m, 0), [Action::Connect]);
        assert_eq!((m.state(), m.generation()), (CtrlState::Connecting, 1));
        // A connect under way: only its answer moves the machine (and fast_io_fail_tmo
        // passing changes what I/O gets).
        assert_eq!(m.next_deadline(), Some(5 * S));
        m.on_connected(5 * MS, Ok(()));
        assert!(m.is_live());
        assert_eq!(m.reconnects(), 0, "the first association is no reconnect");
        assert_eq!(drain(&mut m, 5 * MS), [Action::Send(AdminCmd::AsyncEventRequest)]);
        assert_eq!(drain(&mut m, 5 * MS), [], "one event request at a time");
        assert_eq!(m.down_for(5 * MS), None);
    }

    #[test]
    fn keep_alive_goes_at_half_the_timeout_one_at_a_time_and_an_answer_keeps_the_controller_live() {
        let mut m = live_at(0);
        assert_eq!(m.next_deadline(), Some(500 * MS));
        assert_eq!(drain(&mut m, 499 * MS), []);
        assert_eq!(drain(&mut m, 500 * MS), [Action::Send(AdminCmd::KeepAlive)]);
        // In flight: the next deadline is its expiry, a KATO after it went out.
        assert_eq!(m.next_deadline(), Some(1500 * MS));
        assert_eq!(drain(&mut m, 1100 * MS), [], "no second keep-alive while one is in flight");
        m.on_admin_done(AdminCmd::KeepAlive, true);
        // Answered: the next goes half a KATO after the last one went out.
        assert_eq!(m.next_deadline(), Some(1000 * MS));
        assert_eq!(drain(&mut m, 1100 * MS), [Action::Send(AdminCmd::KeepAlive)]);
        m.on_admin_done(AdminCmd::KeepAlive, false);
        assert!(m.is_live(), "a keep-alive answered with an error still shows the controller is there");
        for t in (1..20).map(|i| 1100 * MS + i * 600 * MS) {
            assert_eq!(drain(&mut m, t), [Action::Send(AdminCmd::KeepAlive)], "at {t}");
            m.on_admin_done(AdminCmd::KeepAlive, true);
        }
        assert!(m.is_live(), "answered keep-alives never time out");
    }

    #[test]
    fn an_unanswered_keep_alive_resets_after_kato_and_the_new_association_has_a_new_generation() {
        let mut m = live_at(0);
        assert_eq!(drain(&mut m, 500 * MS), [Action::Send(AdminCmd::KeepAlive)]);
        assert_eq!(drain(&mut m, 1499 * MS), []);
        assert!(m.is_live());
        assert_eq!(drain(&mut m, 1500 * MS), [Action::TearDown, Action::Connect]);
        assert_eq!((m.state(), m.generation()), (CtrlState::Connecting, 2));
        assert!(m.last_error().is_some_and(|e| e.contains("keep-alive timed out")));
        assert_eq!(m.down_for(1600 * MS), Some(Duration::from_millis(100)));
        m.on_connected(1600 * MS, Ok(()));
        assert!(m.is_live());
        assert_eq!(m.reconnects(), 1);
        assert_eq!(m.down_for(1600 * MS), None);
        // The old keep-alive is forgotten: a fresh schedule from the reconnect.
        assert_eq!(drain(&mut m, 1600 * MS), [Action::Send(AdminCmd::AsyncEventRequest)]);
        assert_eq!(m.next_deadline(), Some(2100 * MS));
    }

    #[test]
    fn with_kato_zero_no_keep_alive_is_sent_and_none_expires() {
        let mut m = CtrlMachine::live(MachineConfig { kato: Duration::ZERO, ..cfg() }, 0);
        assert_eq!(drain(&mut m, 0), [Action::Send(AdminCmd::AsyncEventRequest)]);
        assert_eq!(m.next_deadline(), None);
        assert_eq!(drain(&mut m, 3600 * S), []);
        assert!(m.is_live());
    }

    #[test]
    fn events_ask_for_ana_reads_and_rescans_and_the_request_is_rearmed() {
        let mut m = live_at(0);
        m.on_event(AsyncEvent { event_type: aer_type::NOTICE, info: aer_notice::ANA_CHANGE, log_page: 0x0c });
        assert_eq!(drain(&mut m, MS), [Action::Send(AdminCmd::AsyncEventRequest), Action::Send(AdminCmd::AnaLog)]);
        // Asked again while the read is out: one more read after it, not two at once.
        m.request_ana_refresh();
        m.request_ana_refresh();
        assert_eq!(drain(&mut m, 2 * MS), []);
        m.on_admin_done(AdminCmd::AnaLog, true);
        assert_eq!(drain(&mut m, 3 * MS), [Action::Send(AdminCmd::AnaLog)]);
        m.on_admin_done(AdminCmd::AnaLog, false);
        assert_eq!(drain(&mut m, 4 * MS), [], "a failed read waits for the next reason");
        m.on_event(AsyncEvent::NS_CHANGED);
        assert_eq!(drain(&mut m, 5 * MS), [Action::Send(AdminCmd::AsyncEventRequest), Action::Send(AdminCmd::Rescan)]);
        m.on_admin_done(AdminCmd::Rescan, true);
        // Other notices only re-arm; a failed request is not re-armed.
        m.on_event(AsyncEvent { event_type: aer_type::NOTICE, info: 0x7f, log_page: 0 });
        assert_eq!(drain(&mut m, 6 * MS), [Action::Send(AdminCmd::AsyncEventRequest)]);
        m.on_admin_done(AdminCmd::AsyncEventRequest, false);
        assert_eq!(drain(&mut m, 7 * MS), []);
        assert!(m.is_live());
        // Without event requests (a driver whose controller cannot send events), none.
        let mut q = CtrlMachine::live(MachineConfig { aer: false, ..cfg() }, 0);
        assert_eq!(drain(&mut q, 0), []);
    }

    #[test]
    fn a_lost_queue_resets_and_failed_attempts_retry_every_reconnect_delay() {
        let mut m = live_at(0);
        m.on_lost(S, "I/O queue 1: connection reset");
        assert_eq!(m.state(), CtrlState::Resetting);
        assert_eq!(m.next_deadline(), Some(0), "a reset is due at once");
        assert_eq!(drain(&mut m, S), [Action::TearDown, Action::Connect]);
        m.on_lost(S, "again");
        assert_eq!(m.state(), CtrlState::Connecting, "a loss while not live changes nothing");
        m.on_connected(S + 10 * MS, Err("connection refused".into()));
        assert_eq!(m.last_error(), Some("connection refused"));
        assert_eq!(m.generation(), 2, "failed attempts of one reset share its generation");
        assert_eq!(m.next_deadline(), Some(S + 10 * MS + 2 * S));
        assert_eq!(drain(&mut m, 3 * S), []);
        assert_eq!(drain(&mut m, 3 * S + 10 * MS), [Action::Connect]);
        m.on_connected(3 * S + 20 * MS, Ok(()));
        assert_eq!((m.state(), m.generation(), m.reconnects()), (CtrlState::Live, 2, 1));
        // A second loss: a third generation.
        m.on_lost(4 * S, "x");
        assert_eq!(drain(&mut m, 4 * S), [Action::TearDown, Action::Connect]);
        assert_eq!(m.generation(), 3);
    }

    #[test]
    fn io_fails_fast_after_fast_io_fail_tmo_and_the_controller_is_lost_at_ctrl_loss_tmo() {
        let mut m = live_at(0);
        assert!(!m.should_fail_io(0));
        m.on_lost(S, "link down");
        assert_eq!(drain(&mut m, S), [Action::TearDown, Action::Connect]);
        let (mut t, mut attempt) = (S, true);
        loop {
            if attempt {
                m.on_connected(t, Err("no route".into()));
            }
            let next = m.next_deadline().expect("a retry or the loss is due");
            assert!(next > t || attempt, "a deadline already passed is not handed out again: {next} at {t}");
            assert!(next <= S + 10 * S, "never sleeps past ctrl_loss_tmo: {next}");
            assert_eq!(m.should_fail_io(next - 1), next > 6 * S, "fast_io_fail_tmo at {next}");
            t = next;
            match drain(&mut m, t).as_slice() {
                [Action::Connect] => attempt = t < 11 * S,
                [] => {
                    assert_eq!(t, 6 * S, "only the fast-fail deadline passes without an action");
                    attempt = false;
                }
                [Action::Lost] => break,
                other => panic!("{other:?} at {t}"),
            }
        }
        assert_eq!(t, 11 * S, "lost exactly ctrl_loss_tmo after it went down");
        assert_eq!(m.state(), CtrlState::Dead);
        assert!(m.should_fail_io(t));
        assert_eq!((m.next_deadline(), drain(&mut m, 100 * S)), (None, vec![]), "dead for good");
    }

    #[test]
    fn without_timeouts_io_waits_and_reconnects_go_on_forever() {
        let mut m = CtrlMachine::live(MachineConfig { ctrl_loss_tmo: None, fast_io_fail_tmo: None, ..cfg() }, 0);
        m.on_lost(0, "x");
        assert_eq!(drain(&mut m, 0), [Action::TearDown, Action::Connect]);
        for i in 0..100 {
            m.on_connected(i * 2 * S, Err("refused".into()));
            assert_eq!(drain(&mut m, (i + 1) * 2 * S), [Action::Connect]);
        }
        assert!(!m.should_fail_io(1_000 * S));
        assert_eq!(m.state(), CtrlState::Connecting);
    }

    #[test]
    fn delete_shuts_a_live_controller_down_and_ends_any_other_without() {
        let mut m = live_at(0);
        m.delete();
        assert_eq!(drain(&mut m, 1), [Action::Delete { shutdown: true }]);
        assert_eq!(m.state(), CtrlState::Dead);
        for (mut m, what) in [
            (CtrlMachine::new(cfg()), "new"),
            (
                {
                    let mut m = live_at(0);
                    m.on_lost(0, "x");
                    m
                },
                "resetting",
            ),
            (
                {
                    let mut m = live_at(0);
                    m.on_lost(0, "x");
                    let _ = drain(&mut m, 0);
                    m.on_connected(0, Err("refused".into()));
                    m
                },
                "waiting to reconnect",
            ),
        ] {
            m.delete();
            assert_eq!(drain(&mut m, 1), [Action::Delete { shutdown: false }], "{what}");
            assert_eq!(m.state(), CtrlState::Dead, "{what}");
        }
        // A connect under way is answered first, then the delete.
        let mut m = CtrlMachine::new(cfg());
        assert_eq!(drain(&mut m, 0), [Action::Connect]);
        m.delete();
        assert_eq!(drain(&mut m, 1), []);
        m.on_connected(2, Ok(()));
        assert_eq!(drain(&mut m, 3), [Action::Delete { shutdown: true }]);
    }

    #[test]
    fn answers_nothing_waits_for_change_nothing() {
        let mut m = live_at(0);
        m.on_connected(0, Ok(()));
        m.on_admin_done(AdminCmd::KeepAlive, true);
        assert_eq!((m.state(), m.generation()), (CtrlState::Live, 1));
        assert_eq!(drain(&mut m, 500 * MS), [Action::Send(AdminCmd::KeepAlive)]);
    }
}
