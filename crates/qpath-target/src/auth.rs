//! In-band authentication on the target: DH-HMAC-CHAP per queue (NVMe 2.x
//! §8.13; Linux `target/fabrics-cmd-auth.c`, `target/auth.c`).
//!
//! A host with a key in its subsystem's [`HostAuth`] must authenticate every
//! queue it connects, admin and I/O: Connect answers with ATR set in DW0 and,
//! until the transaction succeeds, the queue takes only Authentication Send and
//! Receive; any other command fails with AUTH_REQUIRED. A failed transaction
//! hands the host an AUTH_Failure1 and the queue is closed. Each Negotiate (the
//! first, or a live queue's re-authentication) takes the host's keys as the
//! subsystem holds them at that moment, so keys rotated with `set_host_auth`
//! apply to the next re-authentication; removed keys refuse it.
//!
//! ```text
//!  AwaitNegotiate ─Send(Negotiate)─► SendChallenge ─Recv─► AwaitReply ─Send(Reply ok)─► SendSuccess1
//!        ▲                                                     │ bad reply                │ Recv
//!        │ Send(Negotiate): re-authentication                  ▼                          ▼
//!       Done ◄──────────── Send(Success2) ◄── AwaitSuccess2 ◄── (R2 sent)   Done (unidirectional)
//!                      any protocol error ─► SendFailure1 ─Recv(Failure1)─► Failed ─► queue closed
//! ```
//!
//! Secure channel concatenation (NVMe Base 2.1 §8.3.4.5, TP 8018; Linux
//! `nvmet_auth_negotiate`, `nvmet_auth_insert_psk`): a Negotiate with SC_C `NEWTLSPSK`
//! (admin queue, not inside TLS, on a port that takes TLS) or `REPLACETLSPSK` (admin
//! queue inside TLS) makes the transaction generate a TLS PSK, `HMAC(Ks, C1 || C2)`: it
//! needs a DH group (the session key Ks) and the host's C2, which the host sends with
//! SEQNUM 0 when it does not ask the controller to authenticate. The host's R1 covers
//! the SC_C. On success [`QueueAuth::take_generated_psk`] hands the PSK to the
//! connection, which keeps it for the host and subsystem ([`crate::tls`]).
//!
//! The connection ([`crate::tcp`]) only routes the two commands here and asks
//! [`QueueAuth::is_authenticated`] / [`QueueAuth::is_failed`].
//!
//! The two Diffie-Hellman steps (the controller's key pair at Negotiate, the shared
//! secret at Reply) are a modular exponentiation each: 0.6 ms for ffdhe2048, 16 ms for
//! ffdhe8192 on the machine of `BENCHMARKS.md`. [`QueueAuth::on_send`] hands them back
//! as a [`DhWork`] instead of doing them, so the connection's driver can run them off
//! its reactor (the target's [`crate::offload`] workers) while the reactor goes on
//! serving the other queues; the command is answered when [`QueueAuth::on_computed`]
//! takes the result. Until then the step timer does not run: the wait is ours.

use std::sync::Arc;

use nvme::auth::dhchap::{self, ResponseInput, Role};
use nvme::auth::ffdhe::DhKeyPair;
use nvme::auth::{AuthCmd, CryptoError, DhGroup, Failure, HashId, Message, Reply, Secret, Success1, failure};
use nvme::opcode::fctype;
use nvme::state::BadTransition;
use nvme::{Sqe, Status};

/// The DH-HMAC-CHAP settings of one host of a subsystem (Linux configfs
/// `hosts/<nqn>/dhchap_{key,ctrl_key,hash,dhgroup}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAuth {
    /// The host's secret: the host proves it knows it.
    pub host_key: Secret,
    /// The controller's secret: when set and the host asks, the controller proves it knows it.
    pub ctrl_key: Option<Secret>,
    /// Preferred hash (Linux default SHA-256); another one the host offers is used if it does not offer this.
    pub hash: HashId,
    /// Required DH group (Linux default null). Not downgraded: a host that does not offer it is refused.
    pub dhgroup: DhGroup,
    /// The files the keys were read from (`dhchap_key_file`, `dhchap_ctrl_key_file`), if
    /// they came from files: a saved configuration names the file again, not the secret.
    pub key_files: KeyFiles,
}

/// Where a host's DH-HMAC-CHAP keys were read from (none: given inline).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyFiles {
    /// The host key's file.
    pub host: Option<std::path::PathBuf>,
    /// The controller key's file.
    pub ctrl: Option<std::path::PathBuf>,
}

impl HostAuth {
    /// Keys with Linux's defaults for the rest (SHA-256, null DH group).
    pub fn new(host_key: Secret, ctrl_key: Option<Secret>) -> HostAuth {
        HostAuth { host_key, ctrl_key, hash: HashId::Sha256, dhgroup: DhGroup::Null, key_files: KeyFiles::default() }
    }
}

/// Where a queue runs, as far as secure channel concatenation cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Channel {
    /// The admin queue: concatenation is negotiated only there (Linux nvmet refuses it on
    /// I/O queues).
    pub admin: bool,
    /// The queue runs inside a TLS channel (`REPLACETLSPSK` only; `NEWTLSPSK` never).
    pub tls: bool,
    /// The queue's port takes TLS connections (`tls = "allowed"` or `"required"`): a new
    /// PSK is generated only where the host can use it.
    pub port_tls: bool,
}

/// The largest Authentication Send/Receive transfer the target takes.
pub const MAX_TRANSFER: u32 = 4096;
const _: () = assert!(MAX_TRANSFER as usize == nvme::auth::MAX_MESSAGE_LEN, "one message limit on both sides");

/// Where a queue's transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthState {
    /// Waiting for AUTH_Negotiate.
    AwaitNegotiate,
    /// Negotiated; the host reads the Challenge next.
    SendChallenge,
    /// Challenge sent; waiting for the Reply.
    AwaitReply,
    /// Reply verified; the host reads Success1 next.
    SendSuccess1,
    /// Success1 carried R2; waiting for Success2.
    AwaitSuccess2,
    /// A protocol error; the host reads AUTH_Failure1 next.
    SendFailure1,
    /// Authenticated.
    Done,
    /// Failed: the queue is refused.
    Failed,
}

impl AuthState {
    /// The one place the transaction's state changes are decided (the convention of
    /// [`nvme::state`]). Failure is sticky: failing a failed transaction again is a no-op.
    #[must_use = "a refused transition must be handled"]
    pub fn transition(self, to: AuthState) -> Result<AuthState, BadTransition<AuthState>> {
        use AuthState::*;
        match (self, to) {
            (Failed, Failed | SendFailure1) => Ok(Failed),
            (Failed, _) => Err(BadTransition::new(self, to)),
            (_, Failed | SendFailure1) => Ok(to),
            (AwaitNegotiate, SendChallenge)
            | (SendChallenge, AwaitReply)
            | (AwaitReply, SendSuccess1)
            | (SendSuccess1, AwaitSuccess2 | Done)
            | (AwaitSuccess2, Done)
            // A Negotiate restarts the transaction (and re-authenticates a live queue).
            | (SendChallenge | AwaitReply | SendSuccess1 | AwaitSuccess2 | Done, SendChallenge) => Ok(to),
            (from, to) => Err(BadTransition::new(from, to)),
        }
    }
}

/// How a transaction ended, for the target's counters ([`QueueAuth::take_outcome`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The host proved its key (and took the controller's, when it asked).
    Accepted {
        /// A live queue's re-authentication, not its first transaction.
        renewal: bool,
    },
    /// Refused by either side (AUTH_Failure1 on its way, or the host's AUTH_Failure2).
    Refused {
        /// A live queue's re-authentication, not its first transaction.
        renewal: bool,
    },
}

/// Transactions the target ended, over every queue (control plane: once per
/// transaction, never per I/O).
#[derive(Debug, Default)]
pub struct AuthCounters {
    /// Transactions in which the host proved its key.
    pub accepted: std::sync::atomic::AtomicU64,
    /// Of those, re-authentications of live queues.
    pub renewed: std::sync::atomic::AtomicU64,
    /// Transactions refused by either side.
    pub refused: std::sync::atomic::AtomicU64,
    /// Of those, re-authentications of live queues.
    pub renewals_refused: std::sync::atomic::AtomicU64,
}

impl AuthCounters {
    /// Counts one ended transaction.
    pub fn record(&self, o: Outcome) {
        use std::sync::atomic::Ordering::Relaxed;
        let (all, renewals, renewal) = match o {
            Outcome::Accepted { renewal } => (&self.accepted, &self.renewed, renewal),
            Outcome::Refused { renewal } => (&self.refused, &self.renewals_refused, renewal),
        };
        all.fetch_add(1, Relaxed);
        if renewal {
            renewals.fetch_add(1, Relaxed);
        }
    }
}

/// One queue's authentication.
pub struct QueueAuth {
    state: AuthState,
    /// The queue may carry commands (set on success; a failure clears it).
    authenticated: bool,
    keys: Arc<HostAuth>,
    /// The host's keys were removed from the subsystem since the Connect: a new
    /// transaction (re-authentication) has nothing to check the host against.
    revoked: bool,
    hostnqn: String,
    subnqn: String,
    channel: Channel,
    /// SC_C of the transaction's Negotiate (00h: no concatenation).
    sc_c: u8,
    /// The host's C2 kept for the generated PSK (concatenation only).
    psk_c2: Option<Vec<u8>>,
    /// The PSK the last concatenating transaction generated, until the connection takes it.
    generated: Option<tls::psk::RetainedPsk>,
    /// When the last transaction message arrived (the Connect, at first).
    step_ns: u64,
    tid: u16,
    hash: HashId,
    dh: Option<DhKeyPair>,
    session_key: Option<Vec<u8>>,
    s1: u32,
    c1: Vec<u8>,
    /// S2 and C2 when the host asked the controller to authenticate.
    bidi: Option<(u32, Vec<u8>)>,
    rescode_exp: u8,
    /// The Send whose Diffie-Hellman work is being computed (its command is not
    /// answered until [`QueueAuth::on_computed`]).
    computing: Option<Computing>,
    /// The transaction under way re-authenticates a live queue.
    renewal: bool,
    /// How the last transaction ended, until taken.
    outcome: Option<Outcome>,
}

/// The Diffie-Hellman work of one transaction step, handed to the caller of
/// [`QueueAuth::on_send`] to run where it does not hold up other queues.
pub enum DhWork {
    /// The controller's key pair for a Negotiate.
    Generate(DhGroup),
    /// The shared secret with the host's public value from a Reply.
    Shared {
        /// The key pair made at Negotiate.
        pair: DhKeyPair,
        /// The host's public value.
        peer: Vec<u8>,
    },
}

/// What [`DhWork::run`] computed.
pub enum DhDone {
    /// A key pair (`None` only for the null group, never asked for).
    Generated(Result<Option<DhKeyPair>, CryptoError>),
    /// The shared secret, with the key pair it was made with.
    Shared {
        /// The key pair, handed back.
        pair: DhKeyPair,
        /// The secret.
        secret: Result<Vec<u8>, CryptoError>,
    },
}

impl DhWork {
    /// Computes: one modular exponentiation in the group's prime (ms for the large groups).
    pub fn run(self) -> DhDone {
        match self {
            DhWork::Generate(group) => DhDone::Generated(DhKeyPair::generate(group)),
            DhWork::Shared { pair, peer } => {
                let secret = pair.shared_secret(&peer);
                DhDone::Shared { pair, secret }
            }
        }
    }
}

impl std::fmt::Debug for DhWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DhWork::Generate(g) => write!(f, "Generate({g:?})"),
            DhWork::Shared { pair, .. } => write!(f, "Shared({:?})", pair.group()),
        }
    }
}

impl std::fmt::Debug for DhDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DhDone::Generated(r) => write!(f, "Generated(ok: {})", r.is_ok()),
            DhDone::Shared { secret, .. } => write!(f, "Shared(ok: {})", secret.is_ok()),
        }
    }
}

/// What an Authentication Send needs next.
#[derive(Debug)]
pub enum SendOutcome {
    /// Answer the command with this status now.
    Status(Status),
    /// Run this, then answer with what [`QueueAuth::on_computed`] returns.
    Compute(DhWork),
}

/// The Send waiting for its Diffie-Hellman result.
enum Computing {
    Negotiate,
    Reply(Box<Reply>),
}

impl std::fmt::Debug for QueueAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAuth")
            .field("state", &self.state)
            .field("authenticated", &self.authenticated)
            .field("hostnqn", &self.hostnqn)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

/// The queue a Connect binds must authenticate if the host has keys there.
pub fn on_connect(
    keys: Option<Arc<HostAuth>>,
    hostnqn: &str,
    subnqn: &str,
    channel: Channel,
    now_ns: u64,
) -> Option<QueueAuth> {
    keys.map(|keys| QueueAuth {
        state: AuthState::AwaitNegotiate,
        authenticated: false,
        hash: keys.hash,
        keys,
        revoked: false,
        hostnqn: hostnqn.to_string(),
        subnqn: subnqn.to_string(),
        channel,
        sc_c: nvme::auth::sc_c::NOSC,
        psk_c2: None,
        generated: None,
        step_ns: now_ns,
        tid: 0,
        dh: None,
        session_key: None,
        s1: 0,
        c1: Vec::new(),
        bidi: None,
        rescode_exp: 0,
        computing: None,
        renewal: false,
        outcome: None,
    })
}

/// A queue inside a TLS channel keyed with the PSK a concatenating transaction generated
/// for this host and subsystem: the channel already proves the host (Linux nvmet asks
/// no DH-HMAC-CHAP of a queue inside TLS, `nvmet_has_auth`). It starts authenticated and
/// may still re-authenticate, on the admin queue with `REPLACETLSPSK`.
pub fn on_connect_generated(
    keys: Option<Arc<HostAuth>>,
    hostnqn: &str,
    subnqn: &str,
    channel: Channel,
    now_ns: u64,
) -> Option<QueueAuth> {
    let mut a = on_connect(keys, hostnqn, subnqn, channel, now_ns)?;
    a.authenticated = true;
    a.state = AuthState::Done;
    Some(a)
}

/// Whether an Authentication Send's data is an AUTH_Negotiate (a transaction starts).
pub fn is_negotiate(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == nvme::auth::auth_type::COMMON && data[1] == nvme::auth::msg_id::NEGOTIATE
}

/// Data lengths of an Authentication Send (host to controller) or Receive
/// (controller to host): `(h2c, c2h)`, checked against their limits.
pub fn transfer(sqe: &Sqe) -> Result<(u32, u32), Status> {
    let cmd = AuthCmd::from_sqe(sqe);
    // Linux nvmet: SECP/SPSP other than DH-HMAC-CHAP's, or a zero length, is an invalid field.
    if !cmd.is_dhchap() || cmd.len == 0 || cmd.len > MAX_TRANSFER {
        return Err(Status::INVALID_FIELD);
    }
    if sqe.sgl().length != cmd.len {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    match sqe.fctype() {
        fctype::AUTH_SEND => Ok((cmd.len, 0)),
        _ => Ok((0, cmd.len)),
    }
}

impl QueueAuth {
    /// The queue may carry other commands.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// The transaction failed: close the queue once the response is out.
    pub fn is_failed(&self) -> bool {
        self.state == AuthState::Failed
    }

    /// Transaction state.
    pub fn state(&self) -> AuthState {
        self.state
    }

    /// The queue is not authenticated and its transaction has waited for the
    /// host's next message longer than `limit_ms` (Linux `auth_expired_work`).
    /// Never while the target computes a step: that wait is not the host's.
    pub fn expired(&self, now_ns: u64, limit_ms: u64) -> bool {
        !self.authenticated && self.computing.is_none() && now_ns.saturating_sub(self.step_ns) / 1_000_000 > limit_ms
    }

    /// A Send's Diffie-Hellman work is being computed.
    pub fn is_computing(&self) -> bool {
        self.computing.is_some()
    }

    /// The host NQN the queue's Connect named.
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// The host's keys as its subsystem holds them now, given before a Negotiate (see
    /// [`is_negotiate`]): a new transaction, and so a live queue's re-authentication, uses
    /// rotated keys (Linux nvmet re-reads them at each Negotiate on the admin queue,
    /// `nvmet_setup_auth`). `None`: the keys were removed, the transaction is refused.
    pub fn rekey(&mut self, keys: Option<Arc<HostAuth>>) {
        match keys {
            Some(k) => {
                self.keys = k;
                self.revoked = false;
            }
            None => self.revoked = true,
        }
    }

    /// The subsystem NQN the queue's Connect named.
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// A transaction message arrived at `now_ns`: the step timer restarts.
    pub fn touch(&mut self, now_ns: u64) {
        self.step_ns = now_ns;
    }

    /// The PSK a concatenating transaction generated, once, when it succeeded (the
    /// connection keeps it for the host and subsystem). Never logged.
    pub fn take_generated_psk(&mut self) -> Option<tls::psk::RetainedPsk> {
        self.generated.take()
    }

    /// The transaction succeeded: with concatenation, the generated PSK
    /// (Linux `nvmet_auth_insert_psk`, at the same two points).
    fn succeeded(&mut self) {
        self.authenticated = true;
        let c2 = self.psk_c2.take();
        if self.sc_c == nvme::auth::sc_c::NOSC {
            return;
        }
        // Negotiate refused concatenation without a DH group or with a hash TLS has no suite for.
        let (Some(ks), Some(c2), Some(hash)) =
            (self.session_key.as_deref(), c2, tls::psk::PskHash::from_id(self.hash.id()))
        else {
            tracing::warn!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, "no TLS PSK generated: the transaction lacks its inputs");
            return;
        };
        let psk = zeroize::Zeroizing::new(dhchap::generated_psk(self.hash, ks, &self.c1, &c2));
        self.generated = Some(tls::psk::RetainedPsk::from_bytes(hash, &psk));
        tracing::info!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, "TLS PSK generated by secure channel concatenation");
    }

    /// How the last transaction ended, once (the connection counts it).
    pub fn take_outcome(&mut self) -> Option<Outcome> {
        self.outcome.take()
    }

    fn set(&mut self, to: AuthState) {
        let from = self.state;
        self.state = match from.transition(to) {
            Ok(s) => s,
            // Loud in release builds too; the transaction fails (the host reads
            // AUTH_Failure1 next, or the queue stays refused).
            Err(e) => {
                tracing::error!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, "authentication state change refused: {e}");
                self.authenticated = false;
                if from == AuthState::Failed { AuthState::Failed } else { AuthState::SendFailure1 }
            }
        };
        if self.state == AuthState::Failed {
            self.authenticated = false;
        }
        let ended = |s: AuthState| matches!(s, AuthState::SendFailure1 | AuthState::Failed);
        let renewal = self.renewal;
        if ended(self.state) && !ended(from) {
            self.outcome = Some(Outcome::Refused { renewal });
        } else if self.state == AuthState::Done && from != AuthState::Done {
            self.outcome = Some(Outcome::Accepted { renewal });
        }
        tracing::trace!(hostnqn = %self.hostnqn, ?from, to = ?self.state, "authentication state");
    }

    fn fail(&mut self, rescode_exp: u8) {
        tracing::info!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, rescode_exp, state = ?self.state, "authentication failed");
        self.rescode_exp = rescode_exp;
        self.authenticated = false;
        // A step still being computed is not waited for any more.
        self.computing = None;
        self.set(AuthState::SendFailure1);
    }

    /// Authentication Send with its data: the command's status (protocol
    /// failures are reported in the next Receive's AUTH_Failure1, not here), or the
    /// Diffie-Hellman work to run before it can be answered.
    pub fn on_send(&mut self, data: &[u8]) -> SendOutcome {
        match self.state {
            AuthState::Failed => return SendOutcome::Status(Status::AUTH_REQUIRED),
            // The transaction already failed: the host reads AUTH_Failure1 next, and a
            // Negotiate does not buy it another try on this queue (found by fuzzing).
            AuthState::SendFailure1 => return SendOutcome::Status(Status::SUCCESS),
            _ => {}
        }
        if self.computing.take().is_some() {
            // A second Send before the first was answered: the host is out of step. The
            // pending result is dropped when it comes.
            self.fail(failure::INCORRECT_MESSAGE);
            return SendOutcome::Status(Status::SUCCESS);
        }
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                self.fail(e.rescode_exp());
                return SendOutcome::Status(Status::SUCCESS);
            }
        };
        match msg {
            Message::Negotiate(n) => {
                self.tid = n.tid;
                self.renewal = self.authenticated;
                match self.negotiate(&n) {
                    Ok(DhGroup::Null) => self.set(AuthState::SendChallenge),
                    Ok(group) => {
                        self.computing = Some(Computing::Negotiate);
                        return SendOutcome::Compute(DhWork::Generate(group));
                    }
                    Err(exp) => self.fail(exp),
                }
            }
            _ if msg.tid() != self.tid => self.fail(failure::INCORRECT_PAYLOAD),
            Message::Reply(r) if self.state == AuthState::AwaitReply => match self.check_reply_dh(&r) {
                Ok(Some(work)) => {
                    self.computing = Some(Computing::Reply(Box::new(r)));
                    return SendOutcome::Compute(work);
                }
                Ok(None) => match self.check_reply(&r) {
                    Ok(()) => self.set(AuthState::SendSuccess1),
                    Err(exp) => self.fail(exp),
                },
                Err(exp) => self.fail(exp),
            },
            Message::Success2(_) if self.state == AuthState::AwaitSuccess2 => {
                tracing::debug!(hostnqn = %self.hostnqn, "host accepted the controller's response");
                self.succeeded();
                self.set(AuthState::Done);
            }
            Message::Failure2(f) => {
                // The host refused our response (R2): the queue is done for.
                tracing::info!(hostnqn = %self.hostnqn, rescode_exp = f.rescode_exp, "host rejected the controller (AUTH_Failure2)");
                self.authenticated = false;
                self.set(AuthState::Failed);
            }
            _ => self.fail(failure::INCORRECT_MESSAGE),
        }
        SendOutcome::Status(Status::SUCCESS)
    }

    /// The result of the [`DhWork`] a Send handed out: that Send's status. A result
    /// nobody waits for any more (the transaction failed meanwhile) is dropped.
    pub fn on_computed(&mut self, done: DhDone) -> Status {
        match (self.computing.take(), done) {
            (Some(Computing::Negotiate), DhDone::Generated(Ok(Some(pair)))) => {
                self.dh = Some(pair);
                self.set(AuthState::SendChallenge);
            }
            (Some(Computing::Negotiate), DhDone::Generated(_)) => self.fail(failure::FAILED),
            (Some(Computing::Reply(r)), DhDone::Shared { pair, secret }) => {
                self.dh = Some(pair);
                match secret {
                    Ok(k) => {
                        self.session_key = Some(k);
                        match self.check_reply(&r) {
                            Ok(()) => self.set(AuthState::SendSuccess1),
                            Err(exp) => self.fail(exp),
                        }
                    }
                    Err(_) => self.fail(failure::DHGROUP_UNUSABLE),
                }
            }
            (Some(_), _) => self.fail(failure::FAILED),
            (None, _) => {}
        }
        Status::SUCCESS
    }

    /// Negotiates hash and group; the group whose key pair is to be made.
    fn negotiate(&mut self, n: &nvme::auth::Negotiate) -> Result<DhGroup, u8> {
        if self.revoked {
            return Err(failure::FAILED);
        }
        use nvme::auth::sc_c;
        self.sc_c = sc_c::NOSC;
        self.psk_c2 = None;
        self.generated = None;
        let concat = n.sc_c != sc_c::NOSC;
        if concat {
            // NVMe Base 2.1 §8.3.4.5.2; Linux `nvmet_auth_negotiate`: only on the admin queue,
            // a new PSK outside TLS, a replacement inside it; SC (01h) and reserved values never.
            let ok = self.channel.admin
                && match n.sc_c {
                    sc_c::NEWTLSPSK => !self.channel.tls && self.channel.port_tls,
                    sc_c::REPLACETLSPSK => self.channel.tls,
                    _ => false,
                };
            if !ok {
                tracing::info!(
                    hostnqn = %self.hostnqn, subnqn = %self.subnqn, sc_c = n.sc_c, admin = self.channel.admin,
                    inside_tls = self.channel.tls, port_tls = self.channel.port_tls,
                    "secure channel concatenation refused on this queue"
                );
                return Err(failure::CONCAT_MISMATCH);
            }
        }
        if n.napd == 0 || n.authid != nvme::auth::AUTHID_DHCHAP {
            return Err(failure::INCORRECT_PAYLOAD);
        }
        let offered: Vec<HashId> = n
            .hash_ids
            .iter()
            .filter_map(|&i| HashId::from_id(i))
            // The generated PSK keys the channel's TLS 1.3 suite of its hash: SHA-256 or
            // SHA-384 (NVMe/TCP 1.1 §3.6.1.1); SHA-512 has no suite.
            .filter(|h| !concat || tls::psk::PskHash::from_id(h.id()).is_some())
            .collect();
        // The configured hash if the host offers it, else the host's first (Linux nvmet does the same).
        self.hash = if offered.contains(&self.keys.hash) {
            self.keys.hash
        } else {
            *offered.first().ok_or(failure::HASH_UNUSABLE)?
        };
        let group = self.keys.dhgroup;
        if !n.dh_groups.contains(&group.id()) {
            return Err(failure::DHGROUP_UNUSABLE);
        }
        if concat && group == DhGroup::Null {
            // The PSK is keyed with the session key: no DH group, no PSK (Linux refuses the same).
            tracing::info!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, "secure channel concatenation needs a DH group for this host");
            return Err(failure::CONCAT_MISMATCH);
        }
        self.sc_c = n.sc_c;
        self.dh = None;
        self.session_key = None;
        self.bidi = None;
        Ok(group)
    }

    /// A Reply's shape against the negotiated group: the shared secret to compute, if any.
    fn check_reply_dh(&mut self, r: &Reply) -> Result<Option<DhWork>, u8> {
        if r.r1.len() != self.hash.len() {
            return Err(failure::HASH_UNUSABLE);
        }
        match (self.dh.take(), r.dhv.is_empty()) {
            (None, true) => Ok(None),
            (None, false) => Err(failure::INCORRECT_PAYLOAD),
            (Some(_), true) => Err(failure::DHGROUP_UNUSABLE),
            (Some(pair), false) => Ok(Some(DhWork::Shared { pair, peer: r.dhv.clone() })),
        }
    }

    /// Verifies R1 (with the session key, if the group made one) and takes C2.
    fn check_reply(&mut self, r: &Reply) -> Result<(), u8> {
        let hl = self.hash.len();
        let key = self.keys.host_key.transformed(&self.hostnqn);
        let ca = dhchap::challenge(self.hash, self.session_key.as_deref(), &self.c1);
        let expect = dhchap::response_sc(
            Role::Host,
            &ResponseInput {
                hash: self.hash,
                key: &key,
                challenge: &ca,
                seqnum: self.s1,
                tid: self.tid,
                hostnqn: &self.hostnqn,
                subnqn: &self.subnqn,
            },
            self.sc_c,
        );
        if !dhchap::ct_eq(&expect, &r.r1) {
            tracing::info!(hostnqn = %self.hostnqn, subnqn = %self.subnqn, "host response mismatch");
            return Err(failure::FAILED);
        }
        if self.sc_c != nvme::auth::sc_c::NOSC {
            // The PSK takes C2: a concatenating host always sends one (Linux refuses the same).
            match &r.c2 {
                Some(c2) if c2.len() == hl => self.psk_c2 = Some(c2.clone()),
                _ => return Err(failure::FAILED),
            }
        }
        // S2 = 0 with a C2: no controller authentication (the C2 only seeds a TLS PSK).
        self.bidi = match &r.c2 {
            Some(c2) if r.seqnum != 0 => {
                if c2.len() != hl || self.keys.ctrl_key.is_none() {
                    // Asked to prove a controller key we do not have.
                    return Err(failure::FAILED);
                }
                Some((r.seqnum, c2.clone()))
            }
            _ => None,
        };
        Ok(())
    }

    /// Authentication Receive: fills `out` (zero-padded) with the next message.
    pub fn on_receive(&mut self, out: &mut [u8]) -> Status {
        out.fill(0);
        let msg = match self.state {
            AuthState::SendChallenge => match self.challenge() {
                Ok(m) => m,
                Err(exp) => {
                    self.fail(exp);
                    self.failure1()
                }
            },
            AuthState::SendSuccess1 => self.success1(),
            AuthState::SendFailure1 => self.failure1(),
            // Nothing to read here: the host is out of step.
            AuthState::AwaitNegotiate
            | AuthState::AwaitReply
            | AuthState::AwaitSuccess2
            | AuthState::Done
            | AuthState::Failed => {
                self.fail(failure::INCORRECT_MESSAGE);
                self.failure1()
            }
        };
        let b = msg.encode();
        if b.len() > out.len() {
            // AL too small for the message: the transaction cannot go on.
            self.fail(failure::INCORRECT_PAYLOAD);
            self.set(AuthState::Failed);
            return Status::INVALID_FIELD;
        }
        out[..b.len()].copy_from_slice(&b);
        match msg {
            Message::Challenge(_) => self.set(AuthState::AwaitReply),
            Message::Success1(ref s) => {
                if s.r2.is_some() {
                    self.set(AuthState::AwaitSuccess2);
                } else {
                    self.succeeded();
                    self.set(AuthState::Done);
                }
            }
            _ => self.set(AuthState::Failed),
        }
        Status::SUCCESS
    }

    fn challenge(&mut self) -> Result<Message, u8> {
        let mut c1 = vec![0u8; self.hash.len()];
        nvme::auth::fill_random(&mut c1).map_err(|_| failure::FAILED)?;
        self.s1 = nvme::auth::random_seqnum().map_err(|_| failure::FAILED)?;
        self.c1 = c1;
        Ok(Message::Challenge(nvme::auth::Challenge {
            tid: self.tid,
            hash_id: self.hash.id(),
            dh_group: self.keys.dhgroup.id(),
            seqnum: self.s1,
            c1: self.c1.clone(),
            dhv: self.dh.as_ref().map(|d| d.public().to_vec()).unwrap_or_default(),
        }))
    }

    fn success1(&mut self) -> Message {
        let r2 = match (&self.bidi, &self.keys.ctrl_key) {
            (Some((s2, c2)), Some(ck)) => {
                let key = ck.transformed(&self.subnqn);
                let ca = dhchap::challenge(self.hash, self.session_key.as_deref(), c2);
                Some(dhchap::response(
                    Role::Controller,
                    &ResponseInput {
                        hash: self.hash,
                        key: &key,
                        challenge: &ca,
                        seqnum: *s2,
                        tid: self.tid,
                        hostnqn: &self.hostnqn,
                        subnqn: &self.subnqn,
                    },
                ))
            }
            _ => None,
        };
        let hl = u8::try_from(self.hash.len()).unwrap_or(64);
        Message::Success1(Success1 { tid: self.tid, hl, r2 })
    }

    fn failure1(&self) -> Message {
        Message::Failure1(Failure {
            tid: self.tid,
            rescode: failure::REASON_FAILED,
            rescode_exp: if self.rescode_exp == 0 { failure::FAILED } else { self.rescode_exp },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::auth::Negotiate;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    const SUB: &str = "nqn.2026-11.io.qpath:auth";

    fn keys(group: DhGroup, ctrl: bool) -> Arc<HostAuth> {
        let mut k = HostAuth::new(
            Secret::generate(Some(HashId::Sha256), 32).unwrap(),
            ctrl.then(|| Secret::generate(Some(HashId::Sha512), 64).unwrap()),
        );
        k.dhgroup = group;
        k.hash = HashId::Sha384;
        Arc::new(k)
    }

    /// A Send, with its Diffie-Hellman work (if any) run inline.
    fn send(a: &mut QueueAuth, data: &[u8]) -> Status {
        match a.on_send(data) {
            SendOutcome::Status(s) => s,
            SendOutcome::Compute(w) => a.on_computed(w.run()),
        }
    }

    fn read(a: &mut QueueAuth) -> Message {
        let mut out = vec![0u8; 4096];
        assert_eq!(a.on_receive(&mut out), Status::SUCCESS);
        Message::decode(&out).unwrap()
    }

    /// Runs the host side by hand; `tamper` spoils R1.
    fn run(group: DhGroup, bidi: bool, tamper: bool) -> (QueueAuth, Message) {
        let k = keys(group, bidi);
        let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, Channel::default(), 0).unwrap();
        let m = transact(&mut a, &k, tamper);
        (a, m)
    }

    /// One transaction on `a`, the host side using `k`'s secrets and group; the
    /// controller's last message (Success1 or Failure1).
    fn transact(a: &mut QueueAuth, k: &HostAuth, tamper: bool) -> Message {
        let (group, bidi) = (k.dhgroup, k.ctrl_key.is_some());
        // A live queue stays authenticated while it re-authenticates; a new one is not yet.
        let live = a.is_authenticated();
        assert_eq!(send(a, &Message::Negotiate(Negotiate::offer_all(9)).encode()), Status::SUCCESS);
        let Message::Challenge(c) = read(a) else { panic!("no challenge") };
        assert_eq!(c.hash_id, HashId::Sha384.id());
        assert_eq!(c.dh_group, group.id());
        let hash = HashId::Sha384;
        let (dhv, ks) = match DhKeyPair::generate(group).unwrap() {
            Some(mine) => (mine.public().to_vec(), Some(mine.shared_secret(&c.dhv).unwrap())),
            None => (vec![], None),
        };
        let key = k.host_key.transformed(HOST);
        let ca = dhchap::challenge(hash, ks.as_deref(), &c.c1);
        let mut r1 = dhchap::response(
            Role::Host,
            &ResponseInput { hash, key: &key, challenge: &ca, seqnum: c.seqnum, tid: 9, hostnqn: HOST, subnqn: SUB },
        );
        if tamper {
            r1[0] ^= 1;
        }
        let c2 = vec![0x5a; hash.len()];
        let reply =
            Reply { tid: 9, r1, c2: bidi.then(|| c2.clone()), seqnum: if bidi { 1234 } else { 0 }, dhv: dhv.clone() };
        assert_eq!(send(a, &Message::Reply(reply).encode()), Status::SUCCESS);
        let m = read(a);
        if let (Message::Success1(s), Some(ck)) = (&m, &k.ctrl_key) {
            let key = ck.transformed(SUB);
            let ca = dhchap::challenge(hash, ks.as_deref(), &c2);
            let r2 = dhchap::response(
                Role::Controller,
                &ResponseInput { hash, key: &key, challenge: &ca, seqnum: 1234, tid: 9, hostnqn: HOST, subnqn: SUB },
            );
            assert_eq!(s.r2.as_deref(), Some(&r2[..]));
            assert_eq!(a.is_authenticated(), live, "bidirectional: not before Success2");
            assert_eq!(send(a, &Message::Success2(9).encode()), Status::SUCCESS);
        }
        m
    }

    #[test]
    fn unidirectional_and_bidirectional_succeed() {
        for (group, bidi) in [(DhGroup::Null, false), (DhGroup::Null, true), (DhGroup::Ffdhe2048, true)] {
            let (a, m) = run(group, bidi, false);
            assert!(matches!(m, Message::Success1(_)), "{group:?} {bidi}: {m:?}");
            assert!(a.is_authenticated());
            assert_eq!(a.state(), AuthState::Done);
        }
    }

    #[test]
    fn a_negotiate_takes_the_keys_the_subsystem_holds_now() {
        let old = keys(DhGroup::Null, false);
        let mut a = on_connect(Some(Arc::clone(&old)), HOST, SUB, Channel::default(), 0).unwrap();
        assert!(matches!(transact(&mut a, &old, false), Message::Success1(_)));
        assert_eq!(a.take_outcome(), Some(Outcome::Accepted { renewal: false }));
        assert_eq!(a.take_outcome(), None, "counted once");
        // The keys rotate (and the group with them): the live queue re-authenticates with the new ones.
        let new = keys(DhGroup::Ffdhe2048, true);
        a.rekey(Some(Arc::clone(&new)));
        assert!(matches!(transact(&mut a, &new, false), Message::Success1(_)));
        assert!(a.is_authenticated() && a.state() == AuthState::Done);
        assert_eq!(a.take_outcome(), Some(Outcome::Accepted { renewal: true }));
        // The old host secret no longer passes.
        let stale = HostAuth { host_key: old.host_key.clone(), ..(*new).clone() };
        a.rekey(Some(Arc::clone(&new)));
        let m = transact(&mut a, &stale, false);
        assert_eq!(m, Message::Failure1(Failure { tid: 9, rescode: 1, rescode_exp: failure::FAILED }));
        assert!(a.is_failed() && !a.is_authenticated());
        assert_eq!(a.take_outcome(), Some(Outcome::Refused { renewal: true }), "refused once, not again at Failed");
        let counters = AuthCounters::default();
        for o in [
            Outcome::Accepted { renewal: false },
            Outcome::Accepted { renewal: true },
            Outcome::Refused { renewal: true },
        ] {
            counters.record(o);
        }
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!([load(&counters.accepted), load(&counters.renewed)], [2, 1]);
        assert_eq!([load(&counters.refused), load(&counters.renewals_refused)], [1, 1]);
        // Keys removed since the Connect: the next transaction is refused at its Negotiate.
        let mut a = on_connect(Some(Arc::clone(&old)), HOST, SUB, Channel::default(), 0).unwrap();
        assert!(matches!(transact(&mut a, &old, false), Message::Success1(_)));
        a.rekey(None);
        assert_eq!(send(&mut a, &Message::Negotiate(Negotiate::offer_all(10)).encode()), Status::SUCCESS);
        let Message::Failure1(f) = read(&mut a) else { panic!("a revoked host got past Negotiate") };
        assert_eq!(f.rescode_exp, failure::FAILED);
        assert!(a.is_failed() && !a.is_authenticated());
        assert!(is_negotiate(&Message::Negotiate(Negotiate::offer_all(1)).encode()));
        assert!(!is_negotiate(&Message::Success2(1).encode()) && !is_negotiate(&[0]));
    }

    #[test]
    fn wrong_response_gets_failure1_and_fails_the_queue() {
        let (a, m) = run(DhGroup::Null, false, true);
        assert_eq!(m, Message::Failure1(Failure { tid: 9, rescode: 1, rescode_exp: failure::FAILED }));
        assert!(a.is_failed() && !a.is_authenticated());
    }

    #[test]
    fn out_of_order_and_garbage() {
        let mut a = on_connect(Some(keys(DhGroup::Null, false)), HOST, SUB, Channel::default(), 0).unwrap();
        // A Receive before Negotiate: Failure1, then refused.
        assert!(matches!(read(&mut a), Message::Failure1(_)));
        assert!(a.is_failed());
        assert_eq!(send(&mut a, &Message::Negotiate(Negotiate::offer_all(1)).encode()), Status::AUTH_REQUIRED);

        let mut a = on_connect(Some(keys(DhGroup::Null, false)), HOST, SUB, Channel::default(), 0).unwrap();
        assert_eq!(send(&mut a, &[0xff; 20]), Status::SUCCESS);
        // A Negotiate after the failure does not restart the transaction.
        assert_eq!(send(&mut a, &Message::Negotiate(Negotiate::offer_all(1)).encode()), Status::SUCCESS);
        assert_eq!(a.state(), AuthState::SendFailure1);
        let Message::Failure1(f) = read(&mut a) else { panic!() };
        assert_eq!(f.rescode_exp, failure::INCORRECT_MESSAGE);
        assert!(a.is_failed());

        // A required DH group the host does not offer: no downgrade.
        let mut a = on_connect(Some(keys(DhGroup::Ffdhe3072, false)), HOST, SUB, Channel::default(), 0).unwrap();
        let mut n = Negotiate::offer_all(1);
        n.dh_groups = vec![0, 1];
        send(&mut a, &Message::Negotiate(n).encode());
        let Message::Failure1(f) = read(&mut a) else { panic!() };
        assert_eq!(f.rescode_exp, failure::DHGROUP_UNUSABLE);

        // Bidirectional asked of a controller without a key.
        let (_, m) = {
            let k = keys(DhGroup::Null, false);
            let mut a = on_connect(Some(k), HOST, SUB, Channel::default(), 0).unwrap();
            send(&mut a, &Message::Negotiate(Negotiate::offer_all(2)).encode());
            let Message::Challenge(_) = read(&mut a) else { panic!() };
            let reply = Reply { tid: 2, r1: vec![0; 48], c2: Some(vec![1; 48]), seqnum: 5, dhv: vec![] };
            send(&mut a, &Message::Reply(reply).encode());
            let m = read(&mut a);
            (a, m)
        };
        assert!(matches!(m, Message::Failure1(_)));
    }

    #[test]
    fn step_timer() {
        let mut a = on_connect(Some(keys(DhGroup::Null, false)), HOST, SUB, Channel::default(), 0).unwrap();
        assert!(!a.expired(5_000_000_000, 5_000));
        assert!(a.expired(5_000_000_001 + 1_000_000, 5_000));
        a.touch(4_000_000_000);
        assert!(!a.expired(8_000_000_000, 5_000), "each message restarts the step timer");
    }

    #[test]
    fn dh_steps_are_handed_out_and_answered_when_computed() {
        let mut a = on_connect(Some(keys(DhGroup::Ffdhe2048, false)), HOST, SUB, Channel::default(), 0).unwrap();
        let SendOutcome::Compute(work) = a.on_send(&Message::Negotiate(Negotiate::offer_all(4)).encode()) else {
            panic!("a DH group's Negotiate needs a key pair made first");
        };
        assert!(matches!(work, DhWork::Generate(DhGroup::Ffdhe2048)), "{work:?}");
        assert!(a.is_computing() && a.state() == AuthState::AwaitNegotiate);
        assert!(!a.expired(3_600_000_000_000, 5_000), "the step timer waits for the host, not for us");
        assert_eq!(a.on_computed(work.run()), Status::SUCCESS);
        assert!(!a.is_computing() && a.state() == AuthState::SendChallenge);
        assert!(a.expired(3_600_000_000_000, 5_000), "and runs again once the step is answered");
        let Message::Challenge(c) = read(&mut a) else { panic!("no challenge") };
        assert_eq!(c.dhv.len(), DhGroup::Ffdhe2048.value_len());

        // A Receive while the key pair is computed: out of step, and the late result is dropped.
        let mut a = on_connect(Some(keys(DhGroup::Ffdhe2048, false)), HOST, SUB, Channel::default(), 0).unwrap();
        let SendOutcome::Compute(work) = a.on_send(&Message::Negotiate(Negotiate::offer_all(4)).encode()) else {
            panic!("no work");
        };
        assert!(matches!(read(&mut a), Message::Failure1(_)));
        assert_eq!(a.on_computed(work.run()), Status::SUCCESS);
        assert!(a.is_failed(), "{:?}", a.state());

        // A host public value out of range fails the shared secret: DHGROUP_UNUSABLE.
        let mut a = on_connect(Some(keys(DhGroup::Ffdhe2048, false)), HOST, SUB, Channel::default(), 0).unwrap();
        let _ = send(&mut a, &Message::Negotiate(Negotiate::offer_all(5)).encode());
        let Message::Challenge(_) = read(&mut a) else { panic!("no challenge") };
        let reply = Reply { tid: 5, r1: vec![0; 48], c2: None, seqnum: 0, dhv: vec![0; 256] };
        let SendOutcome::Compute(work) = a.on_send(&Message::Reply(reply).encode()) else { panic!("no work") };
        assert_eq!(a.on_computed(work.run()), Status::SUCCESS);
        let Message::Failure1(f) = read(&mut a) else { panic!("no Failure1") };
        assert_eq!(f.rescode_exp, failure::DHGROUP_UNUSABLE);
    }

    const ADMIN_PLAIN: Channel = Channel { admin: true, tls: false, port_tls: true };

    /// A concatenating host by hand: Negotiate with `sc_c`, the DH step, and R1 assembled
    /// byte by byte from NVMe Base 2.1 §8.3.4.5.5 (`Ca || le32 S1 || le16 T || SC_C ||
    /// "HostHost" || NQNh || 00h || NQNc`) with `r1_sc_c` as its SC_C byte; C2 with SEQNUM
    /// `s2`. Returns the controller's last message and the PSK the host computes,
    /// `HMAC(Ks, C1 || C2)`.
    fn concat_host(a: &mut QueueAuth, k: &HostAuth, sc_c: u8, r1_sc_c: u8, s2: u32) -> (Message, Vec<u8>) {
        let mut n = Negotiate::offer_all(21);
        n.sc_c = sc_c;
        assert_eq!(send(a, &Message::Negotiate(n).encode()), Status::SUCCESS);
        let c = match read(a) {
            Message::Challenge(c) => c,
            m => return (m, Vec::new()),
        };
        let hash = HashId::from_id(c.hash_id).unwrap();
        let mine = DhKeyPair::generate(k.dhgroup).unwrap().expect("a DH group");
        let ks = mine.shared_secret(&c.dhv).unwrap();
        let ca = dhchap::hmac(hash, &dhchap::digest(hash, &ks), &[&c.c1]);
        let mut m = ca.clone();
        m.extend_from_slice(&c.seqnum.to_le_bytes());
        m.extend_from_slice(&21u16.to_le_bytes());
        m.push(r1_sc_c);
        m.extend_from_slice(b"HostHost");
        m.extend_from_slice(HOST.as_bytes());
        m.push(0);
        m.extend_from_slice(SUB.as_bytes());
        let r1 = dhchap::hmac(hash, &k.host_key.transformed(HOST), &[&m]);
        let c2 = vec![0xc2; hash.len()];
        let reply = Reply { tid: 21, r1, c2: Some(c2.clone()), seqnum: s2, dhv: mine.public().to_vec() };
        assert_eq!(send(a, &Message::Reply(reply).encode()), Status::SUCCESS);
        let last = read(a);
        if let (Message::Success1(s1), Some(ck)) = (&last, &k.ctrl_key) {
            assert!(s2 != 0 && s1.r2.is_some());
            // R2 keeps 00h for SC_C.
            let key = ck.transformed(SUB);
            let cc = dhchap::challenge(hash, Some(&ks), &c2);
            let r2 = dhchap::response(
                Role::Controller,
                &ResponseInput { hash, key: &key, challenge: &cc, seqnum: s2, tid: 21, hostnqn: HOST, subnqn: SUB },
            );
            assert_eq!(s1.r2.as_deref(), Some(&r2[..]));
            assert!(a.take_generated_psk().is_none(), "no PSK before Success2");
            assert_eq!(send(a, &Message::Success2(21).encode()), Status::SUCCESS);
        }
        let mut psk = c.c1.clone();
        psk.extend_from_slice(&c2);
        (last, dhchap::hmac(hash, &ks, &[&psk]))
    }

    fn same_psk(got: &tls::psk::RetainedPsk, want: &[u8]) -> bool {
        let want = tls::psk::RetainedPsk::from_bytes(got.hash(), want);
        got.digest(HOST, SUB) == want.digest(HOST, SUB)
    }

    #[test]
    fn newtlspsk_on_a_plaintext_admin_queue_generates_the_psk() {
        use nvme::auth::sc_c::NEWTLSPSK;
        for ctrl in [false, true] {
            let k = keys(DhGroup::Ffdhe2048, ctrl);
            let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
            // SEQNUM 0 with C2 (the Linux host's way), or bidirectional with a controller key.
            let s2 = if ctrl { 77 } else { 0 };
            let (m, psk) = concat_host(&mut a, &k, NEWTLSPSK, NEWTLSPSK, s2);
            assert!(matches!(m, Message::Success1(_)), "{m:?}");
            assert!(a.is_authenticated() && a.state() == AuthState::Done);
            let got = a.take_generated_psk().expect("a generated PSK");
            assert_eq!(got.hash(), tls::psk::PskHash::Sha384, "the configured hash, offered: a SHA-384 PSK");
            assert!(same_psk(&got, &psk), "the PSK is HMAC(Ks, C1 || C2)");
            assert!(a.take_generated_psk().is_none(), "handed over once");
        }
        // R1 computed with SC_C 00h does not pass a concatenating transaction.
        let k = keys(DhGroup::Ffdhe2048, false);
        let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
        let (m, _) = concat_host(&mut a, &k, NEWTLSPSK, 0, 0);
        assert!(matches!(m, Message::Failure1(Failure { rescode_exp: failure::FAILED, .. })), "{m:?}");
        assert!(a.is_failed() && a.take_generated_psk().is_none());
        // Without concatenation no PSK is made, C2 with SEQNUM 0 or not.
        let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
        let (m, _) = concat_host(&mut a, &k, 0, 0, 0);
        assert!(matches!(m, Message::Success1(_)), "{m:?}");
        assert!(a.take_generated_psk().is_none());
    }

    #[test]
    fn concatenation_is_refused_where_it_cannot_apply() {
        use nvme::auth::sc_c::{NEWTLSPSK, REPLACETLSPSK, SC};
        let k = keys(DhGroup::Ffdhe2048, false);
        let io = Channel { admin: false, ..ADMIN_PLAIN };
        let in_tls = Channel { tls: true, ..ADMIN_PLAIN };
        let no_tls_port = Channel { port_tls: false, ..ADMIN_PLAIN };
        for (channel, sc_c) in [
            (io, NEWTLSPSK),
            (Channel { tls: true, ..io }, REPLACETLSPSK),
            (in_tls, NEWTLSPSK),
            (no_tls_port, NEWTLSPSK),
            (ADMIN_PLAIN, REPLACETLSPSK),
            (ADMIN_PLAIN, SC),
            (ADMIN_PLAIN, 0x04),
        ] {
            let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, channel, 0).unwrap();
            let (m, _) = concat_host(&mut a, &k, sc_c, sc_c, 0);
            assert_eq!(
                m,
                Message::Failure1(Failure { tid: 21, rescode: 1, rescode_exp: failure::CONCAT_MISMATCH }),
                "{channel:?} {sc_c}"
            );
        }
        // The null DH group makes no session key, so no PSK.
        let null = keys(DhGroup::Null, false);
        let mut a = on_connect(Some(Arc::clone(&null)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
        let mut n = Negotiate::offer_all(3);
        n.sc_c = NEWTLSPSK;
        send(&mut a, &Message::Negotiate(n).encode());
        assert!(matches!(read(&mut a), Message::Failure1(Failure { rescode_exp: failure::CONCAT_MISMATCH, .. })));
        // SHA-512 only: no TLS suite for the PSK's hash.
        let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
        let mut n = Negotiate::offer_all(4);
        n.sc_c = NEWTLSPSK;
        n.hash_ids = vec![3];
        send(&mut a, &Message::Negotiate(n).encode());
        assert!(matches!(read(&mut a), Message::Failure1(Failure { rescode_exp: failure::HASH_UNUSABLE, .. })));
        // A concatenating Reply without C2.
        let mut a = on_connect(Some(Arc::clone(&k)), HOST, SUB, ADMIN_PLAIN, 0).unwrap();
        let mut n = Negotiate::offer_all(5);
        n.sc_c = NEWTLSPSK;
        send(&mut a, &Message::Negotiate(n).encode());
        let Message::Challenge(c) = read(&mut a) else { panic!("no challenge") };
        let mine = DhKeyPair::generate(DhGroup::Ffdhe2048).unwrap().unwrap();
        let ks = mine.shared_secret(&c.dhv).unwrap();
        // The controller's hash (the configured SHA-384): a right R1, only C2 is missing.
        let hash = HashId::from_id(c.hash_id).unwrap();
        let ca = dhchap::challenge(hash, Some(&ks), &c.c1);
        let r1 = dhchap::response_sc(
            Role::Host,
            &ResponseInput {
                hash,
                key: &k.host_key.transformed(HOST),
                challenge: &ca,
                seqnum: c.seqnum,
                tid: 5,
                hostnqn: HOST,
                subnqn: SUB,
            },
            NEWTLSPSK,
        );
        let reply = Reply { tid: 5, r1, c2: None, seqnum: 0, dhv: mine.public().to_vec() };
        send(&mut a, &Message::Reply(reply).encode());
        assert!(matches!(read(&mut a), Message::Failure1(Failure { rescode_exp: failure::FAILED, .. })));
        assert!(a.take_generated_psk().is_none());
    }

    #[test]
    fn replacetlspsk_inside_tls_and_generated_channels_start_authenticated() {
        use nvme::auth::sc_c::REPLACETLSPSK;
        let k = keys(DhGroup::Ffdhe2048, false);
        let in_tls = Channel { tls: true, ..ADMIN_PLAIN };
        // A queue inside a channel keyed with a generated PSK owes no transaction...
        let mut a = on_connect_generated(Some(Arc::clone(&k)), HOST, SUB, in_tls, 0).unwrap();
        assert!(a.is_authenticated() && a.state() == AuthState::Done);
        assert!(!a.expired(u64::MAX, 1), "nothing to wait for");
        // ...and may replace the PSK by re-authenticating.
        let (m, psk) = concat_host(&mut a, &k, REPLACETLSPSK, REPLACETLSPSK, 0);
        assert!(matches!(m, Message::Success1(_)), "{m:?}");
        assert!(same_psk(&a.take_generated_psk().expect("a replacement PSK"), &psk));
        assert_eq!(a.take_outcome(), Some(Outcome::Accepted { renewal: true }));
    }

    #[test]
    fn a_refused_transition_fails_the_transaction() {
        let mut a = on_connect(Some(keys(DhGroup::Null, false)), HOST, SUB, Channel::default(), 0).unwrap();
        assert_eq!(a.state, AuthState::AwaitNegotiate);
        // Skipping the whole exchange is refused: the transaction fails instead of
        // staying where it was (or, as before, only in debug builds).
        a.set(AuthState::Done);
        assert_eq!(a.state, AuthState::SendFailure1);
        assert!(!a.authenticated);
        assert_eq!(a.take_outcome(), Some(Outcome::Refused { renewal: false }));
    }

    #[test]
    fn transitions() {
        use AuthState::*;
        assert_eq!(AwaitNegotiate.transition(SendChallenge), Ok(SendChallenge));
        assert_eq!(Done.transition(SendChallenge), Ok(SendChallenge));
        assert_eq!(Failed.transition(Failed), Ok(Failed));
        assert_eq!(Failed.transition(SendFailure1), Ok(Failed));
        assert_eq!(AwaitReply.transition(SendFailure1), Ok(SendFailure1));
        // Refused, in release builds too: nothing leaves Failed, no step is skipped.
        assert_eq!(Failed.transition(Done), Err(BadTransition::new(Failed, Done)));
        assert!(AwaitNegotiate.transition(Done).is_err());
        assert!(AwaitReply.transition(AwaitSuccess2).is_err());
    }
}
