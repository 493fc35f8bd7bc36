//! In-band authentication on the host: one DH-HMAC-CHAP transaction per queue
//! whose Connect came back with ATR (NVMe 2.x §8.13; Linux `host/auth.c`
//! `nvme_queue_auth_work`), run on the blocking bring-up path before the queue
//! is handed to anyone, and again on a live queue when the controller
//! re-authenticates ([`crate::controller::Controller::reauthenticate`]): the
//! transaction runs on the caller's thread, its commands go through an
//! [`Exchange`] (the bring-up [`SyncQueue`], or the context that owns the queue,
//! which sends them beside its I/O under the queue's reserved tag).
//!
//! ```text
//!   Auth Send    AUTH_Negotiate (SHA-256/384/512, null + ffdhe2048..8192)
//!   Auth Receive Challenge (hash, group, S1, C1, g^x)      ─ or AUTH_Failure1: refused
//!   Auth Send    Reply (R1, g^y, and C2/S2 with a controller key)
//!   Auth Receive Success1 (R2 when asked)                   ─ or AUTH_Failure1: refused
//!   Auth Send    Success2 (R2 checked)  or  AUTH_Failure2 (R2 wrong or missing)
//! ```
//!
//! The transaction itself is [`Authenticator`], a step machine with no I/O and no clock:
//! it hands out each Authentication Send or Receive, takes its completion and compares
//! the caller's time with its deadline. [`authenticate`] drives it over an [`Exchange`]
//! on the wall clock; the deterministic simulator drives it over simulated links in
//! virtual time.
//!
//! Unlike Linux (which accepts a Success1 without R2 after asking for one), a
//! controller that was asked to prove its key and did not is refused.
//!
//! Secure channel concatenation (NVMe Base 2.1 §8.3.4.5, TP 8018; `qpath connect
//! --concat`, Linux `nvme connect --concat`): the admin queue's transaction carries SC_C
//! `NEWTLSPSK` (plaintext queue) or `REPLACETLSPSK` (inside TLS), its R1 covers that SC_C,
//! the Reply always carries a C2, and both sides then hold the generated PSK
//! `HMAC(Ks, C1 || C2)` ([`authenticate_concat`]) that keys the TLS channel of every queue
//! after it. The PSK needs the DH session key, so such a transaction offers no null group
//! and refuses a Challenge that names it before any response is sent.

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use nvme::Cid;
use nvme::auth::dhchap::{self, ResponseInput, Role};
use nvme::auth::ffdhe::DhKeyPair;
use nvme::auth::{
    AuthCmd, DhGroup, Failure, HashId, MAX_MESSAGE_LEN, Message, Negotiate, Reply, Secret, failure, sc_c,
};
use tls::psk::{PskHash, RetainedPsk};
use uring::IoBuf;

use crate::error::{BadTransition, Error, ErrorKind, Result};
use crate::queue::{DataDir, Done, Io};
use crate::sync::SyncQueue;

/// Where a transaction's commands (and the bring-up's admin commands) go, one at a time.
pub trait Exchange {
    /// The queue's id.
    fn qid(&self) -> u16;
    /// Sends `io` and waits up to `timeout` for its completion.
    fn execute(&mut self, io: Io, timeout: Duration) -> Result<Done>;

    /// Executes a command that returns `len` bytes; fails on an error status.
    fn read_data(&mut self, sqe: nvme::Sqe, len: usize, timeout: Duration) -> Result<(nvme::Cqe, Vec<u8>)> {
        let buf = IoBuf::new(len.max(1).next_multiple_of(4096));
        let len32 = u32::try_from(len).map_err(|_| Error::new(ErrorKind::Invalid, "transfer too large"))?;
        let d =
            self.execute(Io { sqe, buf: Some(buf), len: len32, dir: DataDir::FromController, token: 0 }, timeout)?;
        if !d.cqe.status.is_success() {
            return Err(Error::status(format!("opcode {:#04x}", sqe.opcode()), d.cqe.status));
        }
        let data = d.buf.map(|b| b.as_full()[..len].to_vec()).unwrap_or_default();
        Ok((d.cqe, data))
    }
}

impl Exchange for SyncQueue {
    fn qid(&self) -> u16 {
        self.queue().qid().0
    }

    fn execute(&mut self, io: Io, timeout: Duration) -> Result<Done> {
        SyncQueue::execute(self, io, timeout)
    }
}

/// The host's DH-HMAC-CHAP secrets (`nvme connect --dhchap-secret / --dhchap-ctrl-secret`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhchapKeys {
    /// The host's secret: proves the host to the controller.
    pub host: Secret,
    /// The controller's secret: when set, the controller must prove itself too.
    pub ctrl: Option<Secret>,
}

impl DhchapKeys {
    /// Parses the `DHHC-1` strings; `None` when neither is given.
    pub fn parse(host: Option<&str>, ctrl: Option<&str>) -> Result<Option<DhchapKeys>> {
        let parse =
            |s: &str, what: &str| Secret::parse(s).map_err(|e| Error::new(ErrorKind::Invalid, format!("{what}: {e}")));
        match (host, ctrl) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Error::new(
                ErrorKind::Invalid,
                "a controller secret needs a host secret too (the host authenticates first)",
            )),
            (Some(h), c) => Ok(Some(DhchapKeys {
                host: parse(h, "dhchap secret")?,
                ctrl: c.map(|c| parse(c, "dhchap controller secret")).transpose()?,
            })),
        }
    }
}

/// Transaction ids: one counter per process (Linux counts per controller).
static NEXT_TID: AtomicU16 = AtomicU16::new(1);

/// Where the host's side of a transaction stands (for errors and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sending AUTH_Negotiate.
    Negotiate,
    /// Reading the Challenge.
    Challenge,
    /// Sending the Reply.
    Reply,
    /// Reading Success1.
    Success1,
    /// Sending Success2 (bidirectional).
    Success2,
}

impl Step {
    /// The one place the host's steps advance (the transaction is linear; the convention
    /// of [`nvme::state`]).
    #[must_use = "a refused transition must be handled"]
    pub fn transition(self, to: Step) -> std::result::Result<Step, BadTransition<Step>> {
        use Step::*;
        match (self, to) {
            (Negotiate, Challenge) | (Challenge, Reply) | (Reply, Success1) | (Success1, Success2) => Ok(to),
            (from, to) => Err(BadTransition::new(from, to)),
        }
    }
}

/// The Authentication Send carrying `m` in its capsule; `None` if `m` is too large to
/// describe.
pub fn send_io(m: &Message) -> Option<Io> {
    let data = m.encode();
    let len = u32::try_from(data.len()).ok()?;
    let mut buf = IoBuf::new(data.len().next_multiple_of(4096));
    buf.set_len(data.len());
    buf.copy_from_slice(&data);
    Some(Io { sqe: AuthCmd::dhchap(len).send_sqe(Cid(0)), buf: Some(buf), len, dir: DataDir::ToController, token: 0 })
}

/// Nice value of a re-authentication's Diffie-Hellman work (16 ms per step for
/// ffdhe8192): background work next to the contexts' I/O, as the target's workers'
/// (`target::offload::WORKER_NICE`). `qpath lab auth-stall --reauth` (BENCHMARKS.md):
/// QD1 reads over 1 ms 98-121 with the admin queue's steps at nice 0, 53-78 at 10.
pub const REAUTH_NICE: i32 = 10;

/// Why a transaction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occasion {
    /// A queue's Connect asked for it: the caller waits for the queue, the DH work runs
    /// at the caller's priority.
    BringUp,
    /// A live queue re-authenticates beside its I/O: the DH work runs at
    /// [`REAUTH_NICE`] (on a thread of its own if the caller runs at another priority;
    /// the caller's priority does not change).
    Reauthentication,
}

/// Runs the DH-HMAC-CHAP transaction on `q` by `deadline`.
pub fn authenticate(
    q: &mut dyn Exchange,
    keys: Option<&DhchapKeys>,
    hostnqn: &str,
    subnqn: &str,
    deadline: Instant,
    occasion: Occasion,
) -> Result<()> {
    drive(q, keys, hostnqn, subnqn, deadline, occasion, None).map(|_| ())
}

/// What a concatenating transaction asks for (SC_C, NVMe Base 2.1 §8.3.4.5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concat {
    /// `NEWTLSPSK`: a plaintext admin queue asks for the PSK of a new TLS channel.
    NewTlsPsk,
    /// `REPLACETLSPSK`: an admin queue inside the channel replaces its PSK.
    ReplaceTlsPsk,
}

impl Concat {
    fn sc_c(self) -> u8 {
        match self {
            Concat::NewTlsPsk => sc_c::NEWTLSPSK,
            Concat::ReplaceTlsPsk => sc_c::REPLACETLSPSK,
        }
    }
}

/// Hashes whose generated PSK a TLS channel can use: the PSK keys the cipher suite of its
/// hash (NVMe/TCP 1.1 §3.6.1.1: SHA-256 with TLS_AES_128_GCM_SHA256, SHA-384 with
/// TLS_AES_256_GCM_SHA384; SHA-512 has no suite). A concatenating Negotiate offers only
/// these, and a Challenge with another is refused.
const CONCAT_HASHES: [HashId; 2] = [HashId::Sha256, HashId::Sha384];

/// Runs a concatenating transaction (admin queue only, as Linux and nvmet) on `q` by
/// `deadline`; the generated PSK on success. The PSK is never logged or shown.
pub fn authenticate_concat(
    q: &mut dyn Exchange,
    keys: Option<&DhchapKeys>,
    hostnqn: &str,
    subnqn: &str,
    deadline: Instant,
    occasion: Occasion,
    concat: Concat,
) -> Result<RetainedPsk> {
    let qid = q.qid();
    drive(q, keys, hostnqn, subnqn, deadline, occasion, Some(concat))?.ok_or_else(|| {
        Error::new(ErrorKind::Protocol, format!("queue {qid}: secure channel concatenation generated no TLS PSK"))
    })
}

/// Runs `f` (a transaction's DH work) at `nice`: inline when the thread already runs at
/// it (or `nice` is `None`), else on a scoped thread of that priority.
fn at_nice<T: Send>(nice: Option<i32>, f: impl FnOnce() -> T + Send) -> T {
    match nice {
        Some(n) if uring::current_thread_nice().ok() != Some(n) => std::thread::scope(|s| {
            let t = s.spawn(|| {
                if let Err(e) = uring::set_current_thread_nice(n) {
                    tracing::debug!("re-authentication's DH work keeps its priority: {e}");
                }
                f()
            });
            t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        }),
        _ => f(),
    }
}

/// The blocking transaction: [`Authenticator`] driven over `q`, its clock the wall clock
/// from now, each command given what is left of `deadline`.
fn drive(
    q: &mut dyn Exchange,
    keys: Option<&DhchapKeys>,
    hostnqn: &str,
    subnqn: &str,
    deadline: Instant,
    occasion: Occasion,
    concat: Option<Concat>,
) -> Result<Option<RetainedPsk>> {
    let origin = Instant::now();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let deadline_ns = ns(deadline.saturating_duration_since(origin));
    let mut a = Authenticator::new(q.qid(), keys, hostnqn, subnqn, concat, occasion, 0, deadline_ns)?;
    loop {
        match a.poll(ns(origin.elapsed())) {
            Next::Command { io, left } => match q.execute(io, left) {
                Ok(d) => a.on_done(d),
                Err(e) => a.on_error(e),
            },
            // Nothing is outstanding between two `poll`s here: the machine only waits for
            // a command it handed out, and each one was answered above.
            Next::Wait => {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("queue {}: authentication waits for no command", q.qid()),
                ));
            }
            Next::Done(psk) => return Ok(psk),
            Next::Failed(e) => return Err(e),
        }
    }
}

/// What the host's side of a transaction does next ([`Authenticator::poll`]).
#[derive(Debug)]
pub enum Next {
    /// Submit this Authentication Send or Receive; its completion goes to
    /// [`Authenticator::on_done`], a transport error to [`Authenticator::on_error`]. It
    /// must complete within `left` (the transaction's deadline).
    Command {
        /// The command and its buffer (any command id: the caller sets its tag).
        io: Io,
        /// Time left until the transaction's deadline.
        left: Duration,
    },
    /// The command handed out is still outstanding (and the deadline not passed).
    Wait,
    /// Authenticated: the queue may go live; with concatenation, the generated TLS PSK.
    Done(Option<RetainedPsk>),
    /// Failed, for this reason (an AUTH_Failure2 the host owed the controller was sent
    /// first); the queue must not go live and is dropped.
    Failed(Error),
}

/// Where an [`Authenticator`] stands between its commands.
enum Phase {
    /// The command of the current [`Step`] is next.
    Ready,
    /// The command of the current step is outstanding.
    Outstanding,
    /// The host refuses: an AUTH_Failure2 with this explanation goes next, then the error.
    Refusing(u8, Error),
    /// The AUTH_Failure2 is outstanding; the error follows whatever its completion says.
    Refused(Error),
    /// The outcome, handed out by the next [`Authenticator::poll`].
    Finished(Result<Option<RetainedPsk>>),
    /// The outcome was handed out.
    Over,
}

/// What the Challenge settled, kept for the Reply and the check of Success1.
struct Session {
    hash: HashId,
    group: DhGroup,
    psk_hash: Option<PskHash>,
    session_key: Option<Vec<u8>>,
    c1: Vec<u8>,
    c2: Option<Vec<u8>>,
    /// S2 and C2 when the controller must prove its key.
    bidi: Option<(u32, Vec<u8>)>,
}

/// The host's side of one DH-HMAC-CHAP transaction as a step machine with no I/O and no
/// clock of its own (NVMe 2.x §8.13; the drawing at the top of this file): [`poll`]
/// hands out the next Authentication Send or Receive, [`on_done`] takes its completion,
/// and the caller's time (any origin, ns) is compared with the deadline at each `poll`.
/// The blocking [`authenticate`] drives it over an [`Exchange`]; the simulator drives it
/// over its simulated links in virtual time. The DH work runs inside [`on_done`] (at
/// [`REAUTH_NICE`] on a thread of its own for a re-authentication, as before).
///
/// [`poll`]: Authenticator::poll
/// [`on_done`]: Authenticator::on_done
pub struct Authenticator {
    qid: u16,
    tid: u16,
    /// SC_C of the Negotiate (00h: no concatenation).
    sc_c: u8,
    /// Where the DH work runs ([`at_nice`]).
    dh_nice: Option<i32>,
    keys: DhchapKeys,
    hostnqn: String,
    subnqn: String,
    started_ns: u64,
    deadline_ns: u64,
    step: Step,
    phase: Phase,
    /// The message the current send step carries.
    outgoing: Option<Message>,
    session: Option<Box<Session>>,
    /// The controller answered with AUTH_Failure1.
    failure1: bool,
}

impl std::fmt::Debug for Authenticator {
    // Keys and the session key stay out of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("qid", &self.qid)
            .field("tid", &self.tid)
            .field("step", &self.step)
            .finish()
    }
}

impl Authenticator {
    /// A transaction for queue `qid` whose Connect asked for one, with the host's `keys`,
    /// to end by `deadline_ns` (on the caller's clock, whose time now is `now_ns`);
    /// `concat` (admin queue only) asks for a generated TLS PSK.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        qid: u16,
        keys: Option<&DhchapKeys>,
        hostnqn: &str,
        subnqn: &str,
        concat: Option<Concat>,
        occasion: Occasion,
        now_ns: u64,
        deadline_ns: u64,
    ) -> Result<Authenticator> {
        if concat.is_some() && qid != 0 {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("queue {qid}: secure channel concatenation runs on the admin queue only"),
            ));
        }
        let Some(keys) = keys else {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "queue {qid}: the controller requires in-band authentication (DH-HMAC-CHAP); no dhchap secret given"
                ),
            ));
        };
        let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
        let mut a = Authenticator {
            qid,
            tid,
            sc_c: concat.map_or(sc_c::NOSC, Concat::sc_c),
            dh_nice: (occasion == Occasion::Reauthentication).then_some(REAUTH_NICE),
            keys: keys.clone(),
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            started_ns: now_ns,
            deadline_ns,
            step: Step::Negotiate,
            phase: Phase::Ready,
            outgoing: None,
            session: None,
            failure1: false,
        };
        a.outgoing = Some(Message::Negotiate(a.negotiate()));
        Ok(a)
    }

    /// The step the transaction is at (the command [`Authenticator::poll`] hands out or
    /// waits for).
    pub fn step(&self) -> Step {
        self.step
    }

    /// The transaction id.
    pub fn tid(&self) -> u16 {
        self.tid
    }

    /// The controller refused the host (AUTH_Failure1).
    pub fn controller_refused(&self) -> bool {
        self.failure1
    }

    /// The host refuses: an AUTH_Failure2 follows (as Linux does) before it fails.
    pub fn refusing(&self) -> bool {
        matches!(self.phase, Phase::Refusing(..) | Phase::Refused(_))
    }

    /// The next thing to do at time `now_ns`: a command to submit, waiting for the one
    /// outstanding, or the outcome (handed out once). Past the deadline a transaction
    /// fails (with the AUTH_Failure2 it owed not sent: no time is left for it).
    pub fn poll(&mut self, now_ns: u64) -> Next {
        let late = now_ns >= self.deadline_ns;
        let left = Duration::from_nanos(self.deadline_ns.saturating_sub(now_ns));
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Ready if late => Next::Failed(self.err("timed out".into())),
            Phase::Ready => match self.command() {
                Ok(io) => {
                    self.phase = Phase::Outstanding;
                    Next::Command { io, left }
                }
                Err(e) => Next::Failed(e),
            },
            Phase::Outstanding if late => Next::Failed(self.err("timed out".into())),
            Phase::Refusing(_, e) | Phase::Refused(e) if late => Next::Failed(e),
            p @ (Phase::Outstanding | Phase::Refused(_)) => {
                self.phase = p;
                Next::Wait
            }
            Phase::Refusing(rescode_exp, e) => {
                let f = Message::Failure2(Failure { tid: self.tid, rescode: failure::REASON_FAILED, rescode_exp });
                match send_io(&f) {
                    Some(io) => {
                        self.phase = Phase::Refused(e);
                        Next::Command { io, left }
                    }
                    None => Next::Failed(e),
                }
            }
            Phase::Finished(Ok(psk)) => {
                self.log_success(now_ns, psk.is_some());
                Next::Done(psk)
            }
            Phase::Finished(Err(e)) => Next::Failed(e),
            Phase::Over => Next::Failed(self.err("the transaction is over".into())),
        }
    }

    /// The completion of the command [`Authenticator::poll`] handed out.
    pub fn on_done(&mut self, d: Done) {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Outstanding => {}
            Phase::Refused(e) => {
                // Whatever the controller made of the AUTH_Failure2, the host's reason stands.
                self.phase = Phase::Finished(Err(e));
                return;
            }
            _ => {
                // A completion no command waits for: the driver is out of step with the
                // machine. Logged in release builds too, and the transaction fails.
                tracing::error!(qid = self.qid, step = ?self.step, "authentication: a completion no command waits for");
                self.phase = Phase::Finished(Err(self.err("internal error: a completion no command waits for".into())));
                return;
            }
        }
        let r = if self.sends() { self.sent(&d) } else { self.received(&d) };
        self.phase = match r {
            Ok(p) => p,
            Err(Fail::Refused(e)) => Phase::Finished(Err(e)),
            Err(Fail::Local(x, e)) => Phase::Refusing(x, e),
        };
    }

    /// The command [`Authenticator::poll`] handed out did not complete: the transport
    /// failed (or the caller's timeout passed).
    pub fn on_error(&mut self, e: Error) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Refused(orig) => Phase::Finished(Err(orig)),
            // The step goes with a transport error of a receive: Linux nvmet, rejecting our
            // response, may tear the controller down before its AUTH_Failure1 is sent, so
            // the refusal arrives as "(Success1): connection closed by the controller".
            Phase::Outstanding if !self.sends() => Phase::Finished(Err(self.err(e.to_string()))),
            _ => Phase::Finished(Err(e)),
        };
    }

    /// Whether the current step sends (else it receives).
    fn sends(&self) -> bool {
        matches!(self.step, Step::Negotiate | Step::Reply | Step::Success2)
    }

    fn command(&self) -> Result<Io> {
        if self.sends() {
            let m = self.outgoing.as_ref().ok_or_else(|| self.err("no message to send".into()))?;
            return send_io(m).ok_or_else(|| self.err("message too large".into()));
        }
        let len = u32::try_from(MAX_MESSAGE_LEN).unwrap_or(4096);
        Ok(Io {
            sqe: AuthCmd::dhchap(len).receive_sqe(Cid(0)),
            buf: Some(IoBuf::new(MAX_MESSAGE_LEN.next_multiple_of(4096))),
            len,
            dir: DataDir::FromController,
            token: 0,
        })
    }

    fn err(&self, why: String) -> Error {
        Error::new(ErrorKind::Protocol, format!("queue {} authentication ({:?}): {why}", self.qid, self.step))
    }

    fn local(&self, rescode_exp: u8, why: &str) -> Fail {
        Fail::Local(rescode_exp, self.err(why.to_string()))
    }

    /// Moves to the next step; a step its state machine refuses is logged at error level
    /// (in release builds too) and fails the transaction with AUTH_Failure2.
    fn advance(&mut self, to: Step) -> std::result::Result<(), Fail> {
        match self.step.transition(to) {
            Ok(s) => {
                self.step = s;
                Ok(())
            }
            Err(e) => {
                tracing::error!(qid = self.qid, "authentication step change refused: {e}");
                Err(self.local(failure::FAILED, &format!("internal error: {e}")))
            }
        }
    }

    /// An Authentication Send completed.
    fn sent(&mut self, d: &Done) -> std::result::Result<Phase, Fail> {
        if !d.cqe.status.is_success() {
            return Err(Fail::Refused(Error::status(format!("queue {} Authentication Send", self.qid), d.cqe.status)));
        }
        self.outgoing = None;
        match self.step {
            Step::Negotiate => self.advance(Step::Challenge).map(|()| Phase::Ready),
            Step::Reply => self.advance(Step::Success1).map(|()| Phase::Ready),
            _ => Ok(Phase::Finished(Ok(self.generated_psk()))),
        }
    }

    /// An Authentication Receive completed.
    fn received(&mut self, d: &Done) -> std::result::Result<Phase, Fail> {
        if !d.cqe.status.is_success() {
            let e = Error::status(format!("opcode {:#04x}", nvme::opcode::admin::FABRICS), d.cqe.status);
            return Err(Fail::Refused(self.err(e.to_string())));
        }
        let data = d.buf.as_ref().map(|b| &b.as_full()[..MAX_MESSAGE_LEN.min(b.capacity())]).unwrap_or_default();
        let m = match Message::decode(data) {
            Ok(Message::Failure1(f)) => {
                self.failure1 = true;
                return Err(self.refused(&f));
            }
            Ok(m) if m.tid() != self.tid => return Err(self.local(failure::INCORRECT_MESSAGE, "wrong transaction id")),
            Ok(m) => m,
            Err(e) => return Err(self.local(e.rescode_exp(), &format!("undecodable message: {e}"))),
        };
        match (self.step, m) {
            (Step::Challenge, Message::Challenge(c)) => self.challenge(c),
            (Step::Challenge, _) => Err(self.local(failure::INCORRECT_MESSAGE, "expected a Challenge")),
            (Step::Success1, Message::Success1(s)) => self.success1(&s),
            (_, _) => Err(self.local(failure::INCORRECT_MESSAGE, "expected Success1")),
        }
    }

    /// AUTH_Failure1: the controller refused.
    fn refused(&self, f: &Failure) -> Fail {
        // A controller that holds the null group for this host (or no concatenation)
        // refuses a concatenating Negotiate: say what the user can change.
        let hint = if self.sc_c != sc_c::NOSC
            && matches!(f.rescode_exp, failure::DHGROUP_UNUSABLE | failure::CONCAT_MISMATCH)
        {
            "; secure channel concatenation needs a DH group (ffdhe2048 to ffdhe8192) in the \
             controller's settings for this host, as the TLS PSK is made from the DH session key"
        } else {
            ""
        };
        Fail::Refused(self.err(format!(
            "controller refused (AUTH_Failure1, reason {:#04x}, explanation {:#04x}: {}){hint}",
            f.rescode,
            f.rescode_exp,
            explain(f.rescode_exp)
        )))
    }

    /// The host's AUTH_Negotiate: every hash and group, or, for concatenation, the hashes
    /// whose PSK keys a TLS channel here and every group but the null one.
    fn negotiate(&self) -> Negotiate {
        let mut n = Negotiate::offer_all(self.tid);
        if self.sc_c != sc_c::NOSC {
            n.sc_c = self.sc_c;
            n.hash_ids = CONCAT_HASHES.iter().map(|h| h.id()).collect();
            n.dh_groups = DhGroup::ALL.iter().filter(|g| **g != DhGroup::Null).map(|g| g.id()).collect();
        }
        n
    }

    /// Concatenation: what the controller picked, refused here, before the host's response
    /// goes out, when it was not offered (NVMe Base 2.1 §8.3.4.5.9: the PSK is keyed with
    /// the session key, so the null group can make none); the generated PSK's hash.
    fn concat_choice(&self, concat: bool, hash: HashId, group: DhGroup) -> std::result::Result<Option<PskHash>, Fail> {
        let psk_hash = PskHash::from_id(hash.id()).filter(|_| CONCAT_HASHES.contains(&hash));
        if concat && group == DhGroup::Null {
            return Err(self.local(
                failure::DHGROUP_UNUSABLE,
                "secure channel concatenation needs a DH group, and the controller chose the null group \
                 (give the host a DH group, ffdhe2048 to ffdhe8192, in the controller's settings)",
            ));
        }
        if concat && psk_hash.is_none() {
            return Err(self.local(
                failure::HASH_UNUSABLE,
                &format!("the controller chose {}, whose PSK keys no TLS channel here", hash.linux_name()),
            ));
        }
        Ok(psk_hash)
    }

    /// The host's DH value and the session key for the controller's `group` and DH value
    /// (none with the null group).
    fn dh_exchange(&self, group: DhGroup, peer: &[u8]) -> std::result::Result<(Vec<u8>, Option<Vec<u8>>), Fail> {
        match (group, peer.is_empty()) {
            (DhGroup::Null, true) => Ok((Vec::new(), None)),
            (DhGroup::Null, false) => Err(self.local(failure::INCORRECT_PAYLOAD, "DH value with the null group")),
            (_, true) => Err(self.local(failure::DHGROUP_UNUSABLE, "no DH value")),
            (g, false) => {
                // Both modular exponentiations: the key pair and the shared secret.
                let (public, ks) = at_nice(self.dh_nice, || match DhKeyPair::generate(g).ok().flatten() {
                    None => (None, None),
                    Some(mine) => (Some(mine.public().to_vec()), mine.shared_secret(peer).ok()),
                });
                let public = public.ok_or_else(|| self.local(failure::FAILED, "no DH key pair"))?;
                let ks = ks.ok_or_else(|| self.local(failure::DHGROUP_UNUSABLE, "invalid DH public value"))?;
                Ok((public, Some(ks)))
            }
        }
    }

    /// The Challenge: the Reply (R1, the DH value, C2 and S2 when asked) goes next.
    fn challenge(&mut self, c: nvme::auth::Challenge) -> std::result::Result<Phase, Fail> {
        let concat = self.sc_c != sc_c::NOSC;
        let hash = HashId::from_id(c.hash_id)
            .filter(|h| h.len() == c.c1.len())
            .ok_or_else(|| self.local(failure::HASH_UNUSABLE, "unknown hash or wrong challenge length"))?;
        let group =
            DhGroup::from_id(c.dh_group).ok_or_else(|| self.local(failure::DHGROUP_UNUSABLE, "unknown DH group"))?;
        let psk_hash = self.concat_choice(concat, hash, group)?;
        let (dhv, session_key) = self.dh_exchange(group, &c.dhv)?;
        let host_key = self.keys.host.transformed(&self.hostnqn);
        // R1 covers SC_C (NVMe Base 2.1 §8.3.4.5.5), so a request for a PSK cannot be stripped.
        let r1 = dhchap::response_sc(
            Role::Host,
            &ResponseInput {
                hash,
                key: &host_key,
                challenge: &dhchap::challenge(hash, session_key.as_deref(), &c.c1),
                seqnum: c.seqnum,
                tid: self.tid,
                hostnqn: &self.hostnqn,
                subnqn: &self.subnqn,
            },
            self.sc_c,
        );
        // C2: the controller's challenge when it must prove its key (S2 nonzero), and the
        // PSK's second input with concatenation, where S2 0 asks for no proof (as Linux).
        let c2 = if self.keys.ctrl.is_some() || concat {
            let mut c2 = vec![0u8; hash.len()];
            nvme::auth::fill_random(&mut c2).map_err(|e| self.local(failure::FAILED, &e.to_string()))?;
            Some(c2)
        } else {
            None
        };
        let bidi = match (&self.keys.ctrl, &c2) {
            (Some(_), Some(c2)) => {
                let s2 = nvme::auth::random_seqnum().map_err(|e| self.local(failure::FAILED, &e.to_string()))?;
                Some((s2, c2.clone()))
            }
            _ => None,
        };
        self.advance(Step::Reply)?;
        let reply = Reply { tid: self.tid, r1, c2: c2.clone(), seqnum: bidi.as_ref().map_or(0, |(s2, _)| *s2), dhv };
        self.outgoing = Some(Message::Reply(reply));
        self.session = Some(Box::new(Session { hash, group, psk_hash, session_key, c1: c.c1, c2, bidi }));
        Ok(Phase::Ready)
    }

    /// Success1: checks R2 when the host asked for it; Success2 goes next, or it is done.
    fn success1(&mut self, s: &nvme::auth::Success1) -> std::result::Result<Phase, Fail> {
        let Some(sess) = self.session.as_deref() else {
            return Err(self.local(failure::FAILED, "internal error: Success1 before a Challenge"));
        };
        if usize::from(s.hl) != sess.hash.len() {
            return Err(self.local(failure::HASH_UNUSABLE, "Success1 hash length"));
        }
        // R2 as a controller that holds the host's controller key computes it.
        let expect = match (&sess.bidi, &self.keys.ctrl) {
            (Some((s2, c2)), Some(ck)) => Some(dhchap::response(
                Role::Controller,
                &ResponseInput {
                    hash: sess.hash,
                    key: &ck.transformed(&self.subnqn),
                    challenge: &dhchap::challenge(sess.hash, sess.session_key.as_deref(), c2),
                    seqnum: *s2,
                    tid: self.tid,
                    hostnqn: &self.hostnqn,
                    subnqn: &self.subnqn,
                },
            )),
            _ => None,
        };
        if let Some(expect) = expect {
            match &s.r2 {
                Some(r2) if dhchap::ct_eq(r2, &expect) => {}
                Some(_) => return Err(self.local(failure::FAILED, "the controller's response is wrong")),
                None => return Err(self.local(failure::FAILED, "the controller did not answer the host's challenge")),
            }
            self.advance(Step::Success2)?;
            self.outgoing = Some(Message::Success2(self.tid));
            return Ok(Phase::Ready);
        }
        Ok(Phase::Finished(Ok(self.generated_psk())))
    }

    /// The generated PSK (NVMe Base 2.1 §8.3.4.5.9; Linux `nvme_auth_secure_concat`).
    fn generated_psk(&self) -> Option<RetainedPsk> {
        let sess = self.session.as_deref()?;
        match (sess.psk_hash.filter(|_| self.sc_c != sc_c::NOSC), sess.session_key.as_deref(), sess.c2.as_deref()) {
            (Some(h), Some(ks), Some(c2)) => Some(RetainedPsk::generated(h, ks, &sess.c1, c2)),
            _ => None,
        }
    }

    fn log_success(&self, now_ns: u64, concat: bool) {
        let Some(sess) = self.session.as_deref() else { return };
        let (hash, group, bidirectional) = (sess.hash.linux_name(), sess.group.name(), self.keys.ctrl.is_some());
        // Like Linux, the admin queue's outcome at info, the I/O queues' at debug.
        let us = now_ns.saturating_sub(self.started_ns) / 1000;
        if self.qid == 0 {
            tracing::info!(qid = self.qid, hash, group, bidirectional, concat, us, "authenticated (DH-HMAC-CHAP)");
        } else {
            tracing::debug!(qid = self.qid, hash, group, bidirectional, us, "authenticated (DH-HMAC-CHAP)");
        }
    }
}

enum Fail {
    /// The controller refused (AUTH_Failure1 or an error status): nothing more to send.
    Refused(Error),
    /// The host refuses: an AUTH_Failure2 with this explanation follows.
    Local(u8, Error),
}

/// Text for an AUTH_Failure explanation.
pub fn explain(rescode_exp: u8) -> &'static str {
    match rescode_exp {
        failure::FAILED => "authentication failed",
        failure::NOT_USABLE => "protocol not usable",
        failure::CONCAT_MISMATCH => "secure channel concatenation mismatch",
        failure::HASH_UNUSABLE => "hash function not usable",
        failure::DHGROUP_UNUSABLE => "DH group not usable",
        failure::INCORRECT_PAYLOAD => "incorrect payload",
        failure::INCORRECT_MESSAGE => "incorrect protocol message",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse() {
        let k = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        assert_eq!(DhchapKeys::parse(None, None).unwrap(), None);
        assert!(DhchapKeys::parse(None, Some(k)).is_err());
        assert!(DhchapKeys::parse(Some("DHHC-1:01:x:"), None).is_err());
        let both = DhchapKeys::parse(Some(k), Some(k)).unwrap().unwrap();
        assert!(both.ctrl.is_some());
    }

    /// A controller played by a script: what the host sends is recorded, each Authentication
    /// Receive answers `answer(messages sent so far)`.
    struct Scripted<F: FnMut(&[Message]) -> Message> {
        sent: Vec<Message>,
        answer: F,
    }

    impl<F: FnMut(&[Message]) -> Message> Exchange for Scripted<F> {
        fn qid(&self) -> u16 {
            0
        }

        fn execute(&mut self, mut io: Io, _timeout: Duration) -> Result<Done> {
            let len = io.len as usize;
            if io.sqe.fctype() == nvme::opcode::fctype::AUTH_SEND {
                let b = io.buf.as_ref().expect("a message");
                self.sent.push(Message::decode(&b[..len]).expect("the host sends what decodes"));
            } else {
                let m = (self.answer)(&self.sent).encode();
                let b = io.buf.as_mut().expect("a buffer");
                b.as_full_mut()[..m.len()].copy_from_slice(&m);
            }
            Ok(Done { token: io.token, tag: 0, cqe: nvme::Cqe::success(Cid(0)), buf: io.buf })
        }
    }

    fn tid_of(sent: &[Message]) -> u16 {
        sent.first().map_or(0, Message::tid)
    }

    #[test]
    fn a_concatenating_host_offers_no_null_group_and_sends_no_response_for_it() {
        let keys = DhchapKeys::parse(Some("DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"), None)
            .unwrap()
            .unwrap();
        // A controller that picks the null group anyway.
        let mut q = Scripted {
            sent: Vec::new(),
            answer: |sent: &[Message]| {
                Message::Challenge(nvme::auth::Challenge {
                    tid: tid_of(sent),
                    hash_id: HashId::Sha256.id(),
                    dh_group: DhGroup::Null.id(),
                    seqnum: 1,
                    c1: vec![7; 32],
                    dhv: vec![],
                })
            },
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let e =
            authenticate_concat(&mut q, Some(&keys), "nqn.h", "nqn.s", deadline, Occasion::BringUp, Concat::NewTlsPsk)
                .unwrap_err();
        assert!(e.to_string().contains("needs a DH group"), "{e}");
        let Message::Negotiate(n) = &q.sent[0] else { panic!("{:?}", q.sent) };
        assert_eq!(n.sc_c, sc_c::NEWTLSPSK);
        assert!(!n.dh_groups.contains(&DhGroup::Null.id()) && !n.dh_groups.is_empty(), "{n:?}");
        assert_eq!(n.hash_ids, [HashId::Sha256.id(), HashId::Sha384.id()], "only hashes with a TLS suite");
        // No Reply (no R1, no DH value): an AUTH_Failure2 naming the group follows the Negotiate.
        assert!(
            matches!(&q.sent[1..], [Message::Failure2(f)] if f.rescode_exp == failure::DHGROUP_UNUSABLE),
            "{:?}",
            q.sent
        );

        // Without concatenation the same Challenge is answered, and no PSK is made.
        let mut q = Scripted {
            sent: Vec::new(),
            answer: |sent: &[Message]| match sent.len() {
                1 => Message::Challenge(nvme::auth::Challenge {
                    tid: tid_of(sent),
                    hash_id: HashId::Sha256.id(),
                    dh_group: DhGroup::Null.id(),
                    seqnum: 1,
                    c1: vec![7; 32],
                    dhv: vec![],
                }),
                _ => Message::Success1(nvme::auth::Success1 { tid: tid_of(sent), hl: 32, r2: None }),
            },
        };
        authenticate(&mut q, Some(&keys), "nqn.h", "nqn.s", deadline, Occasion::BringUp).unwrap();
        let Message::Negotiate(n) = &q.sent[0] else { panic!() };
        assert_eq!((n.sc_c, n.dh_groups.contains(&DhGroup::Null.id())), (sc_c::NOSC, true));
        assert!(matches!(&q.sent[1], Message::Reply(r) if r.c2.is_none() && r.seqnum == 0));
    }

    // ------------------------------------------------ the step machine, with no queue

    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0000";
    const SUBNQN: &str = "nqn.2026-11.io.qpath:step";
    const KEY: &str = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    const SECOND: u64 = 1_000_000_000;

    fn bidi_keys() -> DhchapKeys {
        DhchapKeys::parse(Some(KEY), Some(KEY)).unwrap().unwrap()
    }

    /// A fresh machine on a clock at 0 with one second to go.
    fn machine(keys: &DhchapKeys) -> Authenticator {
        Authenticator::new(1, Some(keys), HOSTNQN, SUBNQN, None, Occasion::BringUp, 0, SECOND).unwrap()
    }

    /// The command `poll` hands out at `now`.
    fn command(a: &mut Authenticator, now: u64) -> Io {
        match a.poll(now) {
            Next::Command { io, left } => {
                assert_eq!(left, Duration::from_nanos(SECOND - now));
                io
            }
            n => panic!("expected a command at step {:?}, got {n:?}", a.step()),
        }
    }

    /// The message an Authentication Send carries, and its successful completion.
    fn sent(io: Io) -> (Message, Done) {
        assert_eq!(io.sqe.fctype(), nvme::opcode::fctype::AUTH_SEND);
        let b = io.buf.as_ref().expect("a message");
        let m = Message::decode(&b[..io.len as usize]).expect("the host sends what decodes");
        (m, Done { token: io.token, tag: 0, cqe: nvme::Cqe::success(Cid(0)), buf: io.buf })
    }

    /// An Authentication Receive answered with `m`.
    fn received(mut io: Io, m: &Message) -> Done {
        assert_eq!(io.sqe.fctype(), nvme::opcode::fctype::AUTH_RECEIVE);
        let m = m.encode();
        io.buf.as_mut().expect("a buffer").as_full_mut()[..m.len()].copy_from_slice(&m);
        Done { token: io.token, tag: 0, cqe: nvme::Cqe::success(Cid(0)), buf: io.buf }
    }

    fn failed(a: &mut Authenticator, now: u64) -> String {
        match a.poll(now) {
            Next::Failed(e) => e.to_string(),
            n => panic!("expected a failure, got {n:?}"),
        }
    }

    fn challenge(tid: u16) -> Message {
        Message::Challenge(nvme::auth::Challenge {
            tid,
            hash_id: HashId::Sha256.id(),
            dh_group: DhGroup::Null.id(),
            seqnum: 9,
            c1: vec![7; 32],
            dhv: vec![],
        })
    }

    /// Runs the machine up to its Success1 read (Negotiate, Challenge, Reply); the Reply.
    fn to_success1(a: &mut Authenticator) -> Reply {
        let (m, d) = sent(command(a, 0));
        assert!(matches!(m, Message::Negotiate(ref n) if n.tid == a.tid()), "{m:?}");
        a.on_done(d);
        assert_eq!(a.step(), Step::Challenge);
        let io = command(a, 10);
        a.on_done(received(io, &challenge(a.tid())));
        assert_eq!(a.step(), Step::Reply);
        let (m, d) = sent(command(a, 20));
        let Message::Reply(r) = m else { panic!("expected the Reply, got {m:?}") };
        a.on_done(d);
        assert_eq!(a.step(), Step::Success1);
        r
    }

    /// R2 of a controller that holds `key`, for the host's Reply `r`.
    fn r2(key: &Secret, tid: u16, r: &Reply) -> Vec<u8> {
        dhchap::response(
            Role::Controller,
            &ResponseInput {
                hash: HashId::Sha256,
                key: &key.transformed(SUBNQN),
                challenge: &dhchap::challenge(HashId::Sha256, None, r.c2.as_deref().unwrap()),
                seqnum: r.seqnum,
                tid,
                hostnqn: HOSTNQN,
                subnqn: SUBNQN,
            },
        )
    }

    #[test]
    fn the_machine_takes_every_step_of_a_bidirectional_transaction() {
        let keys = bidi_keys();
        let mut a = machine(&keys);
        assert_eq!(a.step(), Step::Negotiate);
        let reply = to_success1(&mut a);
        // R1: the host's key over C1 and S1 (null group: no session key).
        let expect = dhchap::response(
            Role::Host,
            &ResponseInput {
                hash: HashId::Sha256,
                key: &keys.host.transformed(HOSTNQN),
                challenge: &dhchap::challenge(HashId::Sha256, None, &[7; 32]),
                seqnum: 9,
                tid: a.tid(),
                hostnqn: HOSTNQN,
                subnqn: SUBNQN,
            },
        );
        assert_eq!(reply.r1, expect);
        assert!(reply.c2.as_ref().is_some_and(|c| c.len() == 32) && reply.seqnum != 0, "the host asks for R2");
        // Nothing more is handed out while the Success1 read is outstanding.
        let io = command(&mut a, 30);
        assert!(matches!(a.poll(40), Next::Wait));
        let s1 =
            nvme::auth::Success1 { tid: a.tid(), hl: 32, r2: Some(r2(keys.ctrl.as_ref().unwrap(), a.tid(), &reply)) };
        a.on_done(received(io, &Message::Success1(s1)));
        assert_eq!(a.step(), Step::Success2);
        let (m, d) = sent(command(&mut a, 50));
        assert_eq!(m, Message::Success2(a.tid()));
        a.on_done(d);
        assert!(matches!(a.poll(60), Next::Done(None)), "authenticated, no PSK without concatenation");
        // The outcome is handed out once.
        assert!(failed(&mut a, 70).contains("the transaction is over"));
    }

    #[test]
    fn a_wrong_controller_response_is_answered_with_failure2_and_fails() {
        let keys = bidi_keys();
        let mut a = machine(&keys);
        let reply = to_success1(&mut a);
        let io = command(&mut a, 30);
        // R2 of another controller key.
        let other = Secret::generate(Some(HashId::Sha256), 32).unwrap();
        let s1 = nvme::auth::Success1 { tid: a.tid(), hl: 32, r2: Some(r2(&other, a.tid(), &reply)) };
        a.on_done(received(io, &Message::Success1(s1)));
        assert!(a.refusing());
        let (m, d) = sent(command(&mut a, 40));
        assert!(
            matches!(m, Message::Failure2(f) if f.tid == a.tid() && f.rescode_exp == failure::FAILED),
            "the host tells the controller why"
        );
        a.on_done(d);
        let e = failed(&mut a, 50);
        assert_eq!(e, "queue 1 authentication (Success1): the controller's response is wrong");

        // A controller that does not answer the host's challenge.
        let mut a = machine(&keys);
        to_success1(&mut a);
        let io = command(&mut a, 30);
        a.on_done(received(io, &Message::Success1(nvme::auth::Success1 { tid: a.tid(), hl: 32, r2: None })));
        let _ = sent(command(&mut a, 40));
        a.on_error(Error::new(ErrorKind::Io, "connection reset"));
        let e = failed(&mut a, 50);
        assert!(e.ends_with("the controller did not answer the host's challenge"), "the host's reason stands: {e}");

        // The wrong message, or the wrong transaction id, at the Challenge.
        for (m, why) in [
            (Message::Success1(nvme::auth::Success1 { tid: 0, hl: 32, r2: None }), "expected a Challenge"),
            (challenge(0), "wrong transaction id"),
        ] {
            let mut a = machine(&keys);
            let (_, d) = sent(command(&mut a, 0));
            a.on_done(d);
            let m = match m {
                Message::Success1(mut s) => {
                    s.tid = a.tid();
                    Message::Success1(s)
                }
                m => m,
            };
            let io = command(&mut a, 10);
            a.on_done(received(io, &m));
            let (f, d) = sent(command(&mut a, 20));
            assert!(matches!(f, Message::Failure2(f) if f.rescode_exp == failure::INCORRECT_MESSAGE), "{f:?}");
            a.on_done(d);
            assert_eq!(failed(&mut a, 30), format!("queue 1 authentication (Challenge): {why}"));
        }
    }

    #[test]
    fn a_transaction_times_out_in_the_callers_time() {
        let keys = bidi_keys();
        let mut a = machine(&keys);
        let (_, d) = sent(command(&mut a, 0));
        a.on_done(d);
        let _challenge_read = command(&mut a, SECOND / 2);
        // Outstanding: the machine waits until the deadline, whatever the wall clock says.
        assert!(matches!(a.poll(SECOND - 1), Next::Wait));
        assert_eq!(failed(&mut a, SECOND), "queue 1 authentication (Challenge): timed out");

        // A step not yet sent times out too; an AUTH_Failure2 owed after the deadline is not sent.
        let mut a = machine(&keys);
        assert_eq!(failed(&mut a, SECOND + 1), "queue 1 authentication (Negotiate): timed out");
        let mut a = machine(&keys);
        let (_, d) = sent(command(&mut a, 0));
        a.on_done(d);
        let io = command(&mut a, 10);
        a.on_done(received(io, &challenge(0)));
        assert!(a.refusing());
        assert_eq!(failed(&mut a, SECOND), "queue 1 authentication (Challenge): wrong transaction id");
    }

    #[test]
    fn the_machine_says_why_the_controller_refused() {
        let keys = bidi_keys();
        // AUTH_Failure1: nothing more is sent.
        let mut a = machine(&keys);
        let (_, d) = sent(command(&mut a, 0));
        a.on_done(d);
        let io = command(&mut a, 10);
        let f = Failure { tid: a.tid(), rescode: failure::REASON_FAILED, rescode_exp: failure::FAILED };
        a.on_done(received(io, &Message::Failure1(f)));
        assert!(!a.refusing() && a.controller_refused());
        assert_eq!(
            failed(&mut a, 20),
            "queue 1 authentication (Challenge): controller refused (AUTH_Failure1, reason 0x01, explanation \
             0x01: authentication failed)"
        );

        // An error status on a send, and a transport error on a receive (named by its step).
        let mut a = machine(&keys);
        let (_, mut d) = sent(command(&mut a, 0));
        d.cqe.status = nvme::Status::AUTH_REQUIRED;
        a.on_done(d);
        let e = failed(&mut a, 10);
        assert!(e.starts_with("queue 1 Authentication Send: "), "{e}");
        let mut a = machine(&keys);
        to_success1(&mut a);
        let _ = command(&mut a, 30);
        a.on_error(Error::new(ErrorKind::Io, "connection closed by the controller"));
        assert_eq!(failed(&mut a, 40), "queue 1 authentication (Success1): connection closed by the controller");

        // A completion when no command is outstanding: the driver is out of step; it fails.
        let mut a = machine(&keys);
        a.on_done(Done { token: 0, tag: 0, cqe: nvme::Cqe::success(Cid(0)), buf: None });
        assert!(failed(&mut a, 0).ends_with("internal error: a completion no command waits for"));

        // No keys, or concatenation on an I/O queue: refused before any command.
        let e = Authenticator::new(2, None, HOSTNQN, SUBNQN, None, Occasion::BringUp, 0, SECOND).unwrap_err();
        assert!(e.to_string().contains("no dhchap secret given"), "{e}");
        let c = Some(Concat::NewTlsPsk);
        let e = Authenticator::new(2, Some(&keys), HOSTNQN, SUBNQN, c, Occasion::BringUp, 0, SECOND).unwrap_err();
        assert!(e.to_string().contains("admin queue only"), "{e}");
    }

    #[test]
    fn steps() {
        assert_eq!(Step::Negotiate.transition(Step::Challenge), Ok(Step::Challenge));
        assert_eq!(Step::Success1.transition(Step::Success2), Ok(Step::Success2));
        // Refused in release builds too: no step is skipped or repeated.
        assert_eq!(Step::Negotiate.transition(Step::Reply), Err(BadTransition::new(Step::Negotiate, Step::Reply)));
        assert!(Step::Success2.transition(Step::Success2).is_err());
    }

    #[test]
    fn a_reauthentications_dh_work_runs_in_the_background_and_leaves_the_caller_as_it_was() {
        let caller = (std::thread::current().id(), uring::current_thread_nice().unwrap());
        if caller.1 < REAUTH_NICE {
            let seen =
                at_nice(Some(REAUTH_NICE), || (std::thread::current().id(), uring::current_thread_nice().unwrap()));
            assert_eq!(seen.1, REAUTH_NICE);
            assert_ne!(seen.0, caller.0, "on a thread of its own");
            assert_eq!(uring::current_thread_nice().unwrap(), caller.1, "the caller keeps its priority");
        } else {
            // Run under `nice` (10 by default): the background part needs a caller above it.
            println!("the test runs at nice {}: only the inline cases are checked", caller.1);
        }
        assert_eq!(at_nice(None, || std::thread::current().id()), caller.0, "bring-up: inline");
        // A thread already at that priority runs it inline.
        std::thread::spawn(|| {
            uring::set_current_thread_nice(REAUTH_NICE).unwrap();
            assert_eq!(at_nice(Some(REAUTH_NICE), || std::thread::current().id()), std::thread::current().id());
        })
        .join()
        .unwrap();
    }
}
