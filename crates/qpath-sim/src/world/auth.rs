//! In-band authentication in the simulated world: in a share of seeds the simulated
//! subsystem requires DH-HMAC-CHAP of this host (its keys set through the target's real
//! configuration path, as `qpath target` and the `set_host_auth` RPC set them), and every
//! queue the host connects runs the production host's step machine
//! ([`host::auth::Authenticator`]) against the target's real transaction, over the
//! simulated links, in virtual time.
//!
//! Key rotation: at a seeded step the operator gives the target a new key for this host
//! (the RPC's function, [`target::subsystem::Subsystem::set_host_auth`]) and, a seeded
//! moment later, the host the same key; the host then re-authenticates its live queues
//! (the target takes a Negotiate on a connected queue, with the keys it holds at that
//! moment: `target::auth`), beside their I/O. In half of those seeds the operator first
//! re-authenticates the host with its old key, which the target must refuse.
//!
//! Invariants: no queue completes a transaction with a host key the target no longer
//! holds (unless the key changed while that transaction ran); a host that holds the
//! target's keys is never refused; a failed transaction ends its path with a trace line
//! (the path reconnects), never a hang; the I/O checks of the world hold throughout.

use host::auth::{Authenticator, DhchapKeys, Next, Occasion};
use host::queue::{Done, HostQueue, Io, QueueState, SubmitError};
use nvme::auth::Secret;

use super::{HOSTNQN, NQN, World};
use crate::rng::Rng;

/// The token of authentication commands (no I/O's request index, no admin token).
pub(super) const TOKEN_AUTH: u64 = 1 << 63;
/// A transaction must end within this (virtual) time, or it fails and its path resets.
const AUTH_TIMEOUT_NS: u64 = 800_000_000;
/// The host learns the new key this long after the target (at most).
const OPERATOR_GAP_NS: u64 = 100_000_000;

/// The seed's authentication settings and the operator's keys.
pub(super) struct SimAuth {
    rng: Rng,
    /// The target's settings for this host: hash and DH group (its configuration's names).
    hash: &'static str,
    dhgroup: &'static str,
    /// The controller proves its key too.
    bidirectional: bool,
    /// The keys the operator gave the target (generation `target_gen`).
    target_keys: DhchapKeys,
    pub(super) target_gen: u64,
    /// The keys the host holds.
    host_keys: DhchapKeys,
    /// When the host gets the target's keys (a rotation under way).
    pub(super) host_update_at: Option<u64>,
    /// The step at which the keys rotate (none once they have).
    pub(super) rotate_at_step: Option<u64>,
    /// Links whose target connection closed because its transaction failed (the target
    /// may close before its AUTH_Failure1 reaches the host, as Linux nvmet may).
    refused_links: Vec<usize>,
}

/// A queue a transaction runs on, wherever it is kept.
struct AuthQueue<'a> {
    q: &'a mut HostQueue,
    link: usize,
    auth: &'a mut Option<AuthRun>,
}

/// A transaction under way on one queue.
pub(super) struct AuthRun {
    m: Authenticator,
    /// The command the machine handed out that the queue has not taken yet (a live queue
    /// whose entries are all busy).
    pending: Option<Io>,
    /// A live queue's re-authentication (its commands use the queue's reserved tag).
    live: bool,
    /// The host's keys it runs with, and the target's key generation when it started.
    keys: DhchapKeys,
    target_gen: u64,
}

fn secret(rng: &mut Rng) -> Secret {
    let mut key = [0u8; 32];
    for b in &mut key {
        *b = rng.below(256) as u8;
    }
    Secret::new(None, &key).expect("a 32-byte secret")
}

impl SimAuth {
    /// In about 40% of the seeds (their own stream: the schedules of the others stay as
    /// they were), the seed's settings; `steps`: the fault phase's length.
    pub(super) fn draw(seed: u64, steps: u64) -> Option<SimAuth> {
        let mut rng = Rng::new(seed ^ 0xa07b_c4a9);
        if !rng.chance(400_000) {
            return None;
        }
        let hash = ["sha256", "sha384", "sha512"][rng.index(3)];
        // A DH group in one seed of 32 (four modular exponentiations per transaction, about
        // 2.5 ms: in one seed of eight they made the sweep's CPU time 75% longer).
        let dhgroup = if rng.chance(31_250) { "ffdhe2048" } else { "null" };
        let bidirectional = rng.chance(500_000);
        let keys = new_keys(&mut rng, bidirectional);
        let rotate_at_step = rng.chance(750_000).then(|| rng.range(steps / 8, (steps * 3 / 4).max(steps / 8 + 1)));
        Some(SimAuth {
            rng,
            hash,
            dhgroup,
            bidirectional,
            target_keys: keys.clone(),
            target_gen: 1,
            host_keys: keys,
            host_update_at: None,
            rotate_at_step,
            refused_links: Vec::new(),
        })
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "{} {} {}",
            self.hash,
            self.dhgroup,
            if self.bidirectional { "bidirectional" } else { "unidirectional" }
        )
    }
}

fn new_keys(rng: &mut Rng, bidirectional: bool) -> DhchapKeys {
    let host = secret(rng);
    let ctrl = bidirectional.then(|| secret(rng));
    DhchapKeys { host, ctrl }
}

impl World {
    /// Gives the running target the operator's keys for this host, through its
    /// configuration (the `set_host_auth` RPC's path: a host table entry made into the
    /// subsystem's settings).
    pub(super) fn configure_target_auth(&mut self) {
        let (Some(a), Some(state)) = (&self.auth, &self.target.state) else { return };
        let cfg = target::config::HostAuthConfig {
            nqn: HOSTNQN.to_string(),
            dhchap_key: Some(a.target_keys.host.to_string()),
            dhchap_ctrl_key: a.target_keys.ctrl.as_ref().map(Secret::to_string),
            dhchap_key_file: None,
            dhchap_ctrl_key_file: None,
            hash: Some(a.hash.to_string()),
            dhgroup: Some(a.dhgroup.to_string()),
            tls_key: None,
            tls_key_file: None,
        };
        let auth = cfg.to_host_auth().expect("the simulated host's DH-HMAC-CHAP settings");
        let subsys = state.subsystem(NQN).expect("the simulated subsystem");
        subsys.set_host_auth(HOSTNQN, auth);
    }

    /// Queue `admin` or I/O of path `p`: the simulator's while it connects, the block
    /// core's once the I/O queue is live (its transaction kept beside it).
    fn conn_mut(&mut self, p: usize, admin: bool) -> Option<AuthQueue<'_>> {
        let path = &mut self.paths[p];
        if admin {
            return path.admin.as_mut().map(|c| AuthQueue { q: &mut c.q, link: c.link, auth: &mut c.auth });
        }
        if let Some(c) = path.io.as_mut() {
            return Some(AuthQueue { q: &mut c.q, link: c.link, auth: &mut c.auth });
        }
        let (ckey, link) = path.io_conn?;
        Some(AuthQueue { q: self.core.queue_mut(ckey)?, link, auth: &mut path.io_auth })
    }

    /// A completion of an authentication command.
    pub(super) fn auth_done(&mut self, p: usize, admin: bool, d: Done) {
        let status = d.cqe.status;
        let Some(run) = self.conn_mut(p, admin).and_then(|c| c.auth.as_mut()) else {
            self.violate(format!("path {p}: an authentication completion ({status}) no transaction waits for"));
            return;
        };
        let step = run.m.step();
        run.m.on_done(d);
        let q = if admin { 0 } else { 1 };
        self.event(format_args!("path {p} queue {q} auth {step:?} answered: {status}"));
    }

    /// Starts a transaction on the queue: at its bring-up (Connect asked for one) or, with
    /// `live`, as a re-authentication of a live queue.
    fn start_auth(&mut self, p: usize, admin: bool, live: bool) {
        let now = self.now;
        let Some(a) = &self.auth else { return };
        let (keys, generation) = (a.host_keys.clone(), a.target_gen);
        let qid = if admin { 0 } else { 1 };
        // The DH work runs inline (`BringUp`) for a re-authentication too: the simulator
        // runs on one thread.
        let m = Authenticator::new(qid, Some(&keys), HOSTNQN, NQN, None, Occasion::BringUp, now, now + AUTH_TIMEOUT_NS)
            .expect("keys are given and no concatenation is asked");
        if let Some(c) = self.conn_mut(p, admin) {
            *c.auth = Some(AuthRun { m, pending: None, live, keys, target_gen: generation });
        }
        let what = if live { "re-authenticates" } else { "authenticates" };
        // (Not the transaction id: the host counts those per process, not per run.)
        self.event(format_args!("path {p} queue {qid} {what} (the target's keys: generation {generation})"));
    }

    /// Moves the queue's transaction as far as it goes now; `false` when it failed and
    /// reset the path.
    pub(super) fn drive_auth(&mut self, p: usize, admin: bool) -> bool {
        let Some(c) = self.conn_mut(p, admin) else { return true };
        if c.auth.is_none() && c.q.state() == QueueState::Authenticating {
            self.start_auth(p, admin, false);
        }
        let qid = if admin { 0 } else { 1 };
        loop {
            let now = self.now;
            let Some(c) = self.conn_mut(p, admin) else { return true };
            let Some(run) = c.auth.as_mut() else { return true };
            if let Some(io) = run.pending.take() {
                let r = if run.live { c.q.submit_control(io) } else { c.q.submit(0, io) };
                match r {
                    Ok(()) => {}
                    // Every entry is busy: sent when one frees (the I/O completions come first).
                    Err((SubmitError::Full, io)) => {
                        run.pending = Some(io);
                        return true;
                    }
                    // The queue failed: the path resets with it.
                    Err(_) => return true,
                }
                continue;
            }
            let step = run.m.step();
            match run.m.poll(now) {
                Next::Command { mut io, .. } => {
                    io.token = TOKEN_AUTH;
                    run.pending = Some(io);
                    let what = if run.m.refusing() { "sends AUTH_Failure2" } else { "sends" };
                    self.event(format_args!("path {p} queue {qid} auth {step:?}: {what}"));
                }
                Next::Wait => return true,
                Next::Done(_) => {
                    let Some(run) = c.auth.take() else { return true };
                    if !run.live {
                        c.q.authenticated();
                    }
                    self.sum.auths += 1;
                    self.event(format_args!("path {p} queue {qid} authenticated at {step:?}"));
                    self.check_auth_keys(p, qid, &run);
                    return true;
                }
                Next::Failed(e) => {
                    let Some(run) = c.auth.take() else { return true };
                    self.sum.auth_failures += 1;
                    self.event(format_args!("path {p} queue {qid} authentication failed: {e}"));
                    let refused = run.m.controller_refused();
                    self.check_refusal(p, qid, &run, refused);
                    self.fail_path(p, "in-band authentication failed");
                    return false;
                }
            }
        }
    }

    /// A queue authenticated: with a key the target holds, or held when it began.
    fn check_auth_keys(&mut self, p: usize, qid: u16, run: &AuthRun) {
        let Some(a) = &self.auth else { return };
        if run.keys.host != a.target_keys.host && run.target_gen == a.target_gen {
            self.violate(format!(
                "path {p} queue {qid}: authenticated with a host key the target no longer holds (key generation \
                 {} is the target's, since before the transaction began)",
                a.target_gen
            ));
        }
    }

    /// A transaction failed: the controller may refuse only a host whose keys are not its own.
    fn check_refusal(&mut self, p: usize, qid: u16, run: &AuthRun, refused: bool) {
        let Some(a) = &self.auth else { return };
        if refused && run.keys == a.target_keys && run.target_gen == a.target_gen {
            self.violate(format!(
                "path {p} queue {qid}: the target refused the host, which holds the target's keys (generation {})",
                a.target_gen
            ));
        }
    }

    /// The target closed the connection on link `l` because its transaction failed.
    pub(super) fn auth_refused_link(&mut self, l: usize) {
        if let Some(a) = self.auth.as_mut() {
            a.refused_links.push(l);
        }
    }

    /// The path's connections are lost: a transaction under way on one ends with them,
    /// with a trace line, as refused when the target closed that connection for it.
    pub(super) fn auth_cut_off(&mut self, p: usize) {
        for admin in [true, false] {
            let Some(c) = self.conn_mut(p, admin) else { continue };
            let link = c.link;
            let Some(run) = c.auth.take() else { continue };
            let qid = if admin { 0 } else { 1 };
            let refused = self.auth.as_ref().is_some_and(|a| a.refused_links.contains(&link));
            self.sum.auth_failures += 1;
            let why = if refused { "the target refused it and closed the queue" } else { "the connection was lost" };
            self.event(format_args!("path {p} queue {qid} authentication failed at {:?}: {why}", run.m.step()));
            self.check_refusal(p, qid, &run, refused);
        }
    }

    /// When the operator's change on the host side is due.
    pub(super) fn auth_due(&self) -> Option<u64> {
        self.auth.as_ref().and_then(|a| a.host_update_at)
    }

    /// A transaction is under way on some queue, or the operator's change is not complete.
    pub(super) fn auth_busy(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| a.host_update_at.is_some())
            || self.paths.iter().any(|p| {
                p.io_auth.is_some() || [p.admin.as_ref(), p.io.as_ref()].into_iter().flatten().any(|c| c.auth.is_some())
            })
    }

    /// The operator rotates the target's key for this host.
    pub(super) fn rotate_keys(&mut self) {
        let Some(a) = self.auth.as_mut() else { return };
        a.rotate_at_step = None;
        let bidirectional = a.bidirectional;
        a.target_keys = new_keys(&mut a.rng, bidirectional);
        a.target_gen += 1;
        let generation = a.target_gen;
        let gap = a.rng.range(1_000_000, OPERATOR_GAP_NS);
        let stale_first = a.rng.chance(500_000);
        a.host_update_at = Some(self.now + gap);
        self.sum.key_rotations += 1;
        self.configure_target_auth();
        self.event(format_args!(
            "fault: the operator rotates the target's DH-HMAC-CHAP keys for the host (generation {generation}); \
             the host gets them in {gap} ns"
        ));
        if stale_first {
            // Out of order: the host re-authenticates with its old key, which must be refused.
            self.event(format_args!("fault: the host re-authenticates with its old key"));
            self.reauthenticate();
        }
    }

    /// The host's keys become the target's, and the host re-authenticates its live queues.
    pub(super) fn update_host_keys(&mut self) {
        let Some(a) = self.auth.as_mut() else { return };
        a.host_update_at = None;
        a.host_keys = a.target_keys.clone();
        let generation = a.target_gen;
        self.event(format_args!("the operator gives the host the target's keys (generation {generation})"));
        self.reauthenticate();
    }

    /// Every live queue that authenticated re-authenticates with the host's keys (as the
    /// production controller's `reauthenticate`), unless one is under way on it.
    fn reauthenticate(&mut self) {
        for p in 0..self.paths.len() {
            for admin in [true, false] {
                let ready = self
                    .conn_mut(p, admin)
                    .is_some_and(|c| c.auth.is_none() && c.q.state() == QueueState::Live && c.q.was_authenticated());
                if ready {
                    self.sum.reauths += 1;
                    self.start_auth(p, admin, true);
                }
            }
        }
    }

    /// At the end: the operator's change is complete (host and target hold the same keys).
    pub(super) fn auth_final_checks(&mut self) {
        let Some(a) = &self.auth else { return };
        if a.host_keys != a.target_keys {
            let generation = a.target_gen;
            self.violate(format!("the host does not hold the target's keys (generation {generation}) at the end"));
        }
    }
}
