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
    let dh_nice = (occasion == Occasion::Reauthentication).then_some(REAUTH_NICE);
    transaction(q, keys, hostnqn, subnqn, deadline, dh_nice, sc_c::NOSC).map(|_| ())
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
    if q.qid() != 0 {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("queue {}: secure channel concatenation runs on the admin queue only", q.qid()),
        ));
    }
    let dh_nice = (occasion == Occasion::Reauthentication).then_some(REAUTH_NICE);
    transaction(q, keys, hostnqn, subnqn, deadline, dh_nice, concat.sc_c())?
        .ok_or_else(|| Error::new(ErrorKind::Protocol, "queue 0: secure channel concatenation generated no TLS PSK"))
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

fn transaction(
    q: &mut dyn Exchange,
    keys: Option<&DhchapKeys>,
    hostnqn: &str,
    subnqn: &str,
    deadline: Instant,
    dh_nice: Option<i32>,
    sc_c: u8,
) -> Result<Option<RetainedPsk>> {
    let qid = nvme::QueueId(q.qid());
    let Some(keys) = keys else {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "queue {qid}: the controller requires in-band authentication (DH-HMAC-CHAP); no dhchap secret given"
            ),
        ));
    };
    let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
    let mut t = Transaction { q, tid, deadline, step: Step::Negotiate, qid: qid.0, dh_nice, sc_c };
    let start = Instant::now();
    match t.run(keys, hostnqn, subnqn) {
        Ok((hash, group, psk)) => {
            let (hash, group, bidirectional) = (hash.linux_name(), group.name(), keys.ctrl.is_some());
            // Like Linux, the admin queue's outcome at info, the I/O queues' at debug.
            let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            let concat = psk.is_some();
            if qid.is_admin() {
                tracing::info!(qid = qid.0, hash, group, bidirectional, concat, us, "authenticated (DH-HMAC-CHAP)");
            } else {
                tracing::debug!(qid = qid.0, hash, group, bidirectional, us, "authenticated (DH-HMAC-CHAP)");
            }
            Ok(psk)
        }
        Err(Fail::Refused(e)) => Err(e),
        Err(Fail::Local(rescode_exp, e)) => {
            // Tell the controller why (AUTH_Failure2), as Linux does; the queue is dropped either way.
            let f = Message::Failure2(Failure { tid, rescode: failure::REASON_FAILED, rescode_exp });
            let _ = t.send(&f);
            Err(e)
        }
    }
}

enum Fail {
    /// The controller refused (AUTH_Failure1 or an error status): nothing more to send.
    Refused(Error),
    /// The host refuses: an AUTH_Failure2 with this explanation follows.
    Local(u8, Error),
}

struct Transaction<'a> {
    q: &'a mut dyn Exchange,
    tid: u16,
    deadline: Instant,
    step: Step,
    qid: u16,
    /// Where the DH work runs ([`at_nice`]).
    dh_nice: Option<i32>,
    /// SC_C of the Negotiate (00h: no concatenation).
    sc_c: u8,
}

impl Transaction<'_> {
    fn err(&self, why: String) -> Error {
        Error::new(ErrorKind::Protocol, format!("queue {} authentication ({:?}): {why}", self.qid, self.step))
    }

    fn local(&self, rescode_exp: u8, why: &str) -> Fail {
        Fail::Local(rescode_exp, self.err(why.to_string()))
    }

    fn left(&self) -> Result<Duration> {
        let d = self.deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            return Err(self.err("timed out".into()));
        }
        Ok(d)
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

    fn send(&mut self, m: &Message) -> Result<()> {
        let io = send_io(m).ok_or_else(|| self.err("message too large".into()))?;
        let left = self.left()?;
        let d = self.q.execute(io, left)?;
        if !d.cqe.status.is_success() {
            return Err(Error::status(format!("queue {} Authentication Send", self.qid), d.cqe.status));
        }
        Ok(())
    }

    fn receive(&mut self) -> std::result::Result<Message, Fail> {
        let len = u32::try_from(MAX_MESSAGE_LEN).unwrap_or(4096);
        let left = self.left().map_err(Fail::Refused)?;
        // The step goes with a transport error too: Linux nvmet, rejecting our response,
        // may tear the controller down before its AUTH_Failure1 is sent, so the refusal
        // arrives as "(Success1): connection closed by the controller".
        let (_, data) = self
            .q
            .read_data(AuthCmd::dhchap(len).receive_sqe(Cid(0)), MAX_MESSAGE_LEN, left)
            .map_err(|e| Fail::Refused(self.err(e.to_string())))?;
        match Message::decode(&data) {
            Ok(Message::Failure1(f)) => {
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
                Err(Fail::Refused(self.err(format!(
                    "controller refused (AUTH_Failure1, reason {:#04x}, explanation {:#04x}: {}){hint}",
                    f.rescode,
                    f.rescode_exp,
                    explain(f.rescode_exp)
                ))))
            }
            Ok(m) if m.tid() != self.tid => Err(self.local(failure::INCORRECT_MESSAGE, "wrong transaction id")),
            Ok(m) => Ok(m),
            Err(e) => Err(self.local(e.rescode_exp(), &format!("undecodable message: {e}"))),
        }
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

    fn run(
        &mut self,
        keys: &DhchapKeys,
        hostnqn: &str,
        subnqn: &str,
    ) -> std::result::Result<(HashId, DhGroup, Option<RetainedPsk>), Fail> {
        let concat = self.sc_c != sc_c::NOSC;
        self.send(&Message::Negotiate(self.negotiate())).map_err(Fail::Refused)?;
        self.advance(Step::Challenge)?;
        let Message::Challenge(c) = self.receive()? else {
            return Err(self.local(failure::INCORRECT_MESSAGE, "expected a Challenge"));
        };
        let hash = HashId::from_id(c.hash_id)
            .filter(|h| h.len() == c.c1.len())
            .ok_or_else(|| self.local(failure::HASH_UNUSABLE, "unknown hash or wrong challenge length"))?;
        let group =
            DhGroup::from_id(c.dh_group).ok_or_else(|| self.local(failure::DHGROUP_UNUSABLE, "unknown DH group"))?;
        let psk_hash = self.concat_choice(concat, hash, group)?;
        let (dhv, session_key) = self.dh_exchange(group, &c.dhv)?;
        let host_key = keys.host.transformed(hostnqn);
        // R1 covers SC_C (NVMe Base 2.1 §8.3.4.5.5), so a request for a PSK cannot be stripped.
        let r1 = dhchap::response_sc(
            Role::Host,
            &ResponseInput {
                hash,
                key: &host_key,
                challenge: &dhchap::challenge(hash, session_key.as_deref(), &c.c1),
                seqnum: c.seqnum,
                tid: self.tid,
                hostnqn,
                subnqn,
            },
            self.sc_c,
        );
        // C2: the controller's challenge when it must prove its key (S2 nonzero), and the
        // PSK's second input with concatenation, where S2 0 asks for no proof (as Linux).
        let c2 = if keys.ctrl.is_some() || concat {
            let mut c2 = vec![0u8; hash.len()];
            nvme::auth::fill_random(&mut c2).map_err(|e| self.local(failure::FAILED, &e.to_string()))?;
            Some(c2)
        } else {
            None
        };
        let bidi = match (&keys.ctrl, &c2) {
            (Some(_), Some(c2)) => {
                let s2 = nvme::auth::random_seqnum().map_err(|e| self.local(failure::FAILED, &e.to_string()))?;
                Some((s2, c2.clone()))
            }
            _ => None,
        };
        self.advance(Step::Reply)?;
        let reply = Reply { tid: self.tid, r1, c2: c2.clone(), seqnum: bidi.as_ref().map_or(0, |(s2, _)| *s2), dhv };
        self.send(&Message::Reply(reply)).map_err(Fail::Refused)?;
        self.advance(Step::Success1)?;
        let Message::Success1(s) = self.receive()? else {
            return Err(self.local(failure::INCORRECT_MESSAGE, "expected Success1"));
        };
        if usize::from(s.hl) != hash.len() {
            return Err(self.local(failure::HASH_UNUSABLE, "Success1 hash length"));
        }
        if let (Some((s2, c2)), Some(ck)) = (&bidi, &keys.ctrl) {
            let ctrl_key = ck.transformed(subnqn);
            let expect = dhchap::response(
                Role::Controller,
                &ResponseInput {
                    hash,
                    key: &ctrl_key,
                    challenge: &dhchap::challenge(hash, session_key.as_deref(), c2),
                    seqnum: *s2,
                    tid: self.tid,
                    hostnqn,
                    subnqn,
                },
            );
            match &s.r2 {
                Some(r2) if dhchap::ct_eq(r2, &expect) => {}
                Some(_) => return Err(self.local(failure::FAILED, "the controller's response is wrong")),
                None => return Err(self.local(failure::FAILED, "the controller did not answer the host's challenge")),
            }
            self.advance(Step::Success2)?;
            self.send(&Message::Success2(self.tid)).map_err(Fail::Refused)?;
        }
        // The generated PSK (NVMe Base 2.1 §8.3.4.5.9; Linux `nvme_auth_secure_concat`).
        let psk = match (psk_hash.filter(|_| concat), session_key.as_deref(), c2.as_deref()) {
            (Some(h), Some(ks), Some(c2)) => Some(RetainedPsk::generated(h, ks, &c.c1, c2)),
            _ => None,
        };
        Ok((hash, group, psk))
    }
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
