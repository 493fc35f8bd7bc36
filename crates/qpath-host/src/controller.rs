//! Controllers: bring-up, the admin thread (keep-alive, asynchronous
//! events, ANA), and reconnect with the options Linux and SPDK users know.
//!
//! ```text
//!            connect()                    admin queue or an I/O queue fails
//!   New ──► Connecting ──► Live ───────────────────────────► Resetting
//!               ▲  │ bring-up failed             │ delete()       │
//!               │  ▼ (retry every reconnect_delay)▼                ▼
//!               └── Connecting ◄────────────── Deleting ──► Dead ◄─ ctrl_loss_tmo
//! ```
//!
//! I/O queues are TCP connections made by the admin thread (blocking
//! handshakes: control plane) and handed to the [`crate::context::Context`]
//! that owns each one through the context's mailbox; from then on the
//! context's thread does all of that queue's I/O. After a reconnect the new
//! connection of queue `i` goes to the same owner.

use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme::features::AsyncEvent;
use nvme::identify::IdentifyController;
use nvme::{AnaGrpId, AnaState, Cntlid, Nsid, Sqe};
use uring::MailboxSender;

mod bell;
pub mod bringup;
pub mod machine;

use bell::{Bell, BellRx};
pub use machine::{Action, AdminCmd, CtrlMachine, MachineConfig};

use crate::admin::{self, ADMIN_TIMEOUT};
use crate::error::{BadTransition, Error, ErrorKind, Result};
use crate::queue::{DataDir, Done, HostQueue, Io, QueueConfig};
use crate::sync::SyncQueue;

/// Options of `connect` (names as in `nvme connect` and SPDK's `bdev_nvme_attach_controller`).
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Controller address.
    pub traddr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host id.
    pub hostid: [u8; 16],
    /// I/O queues to ask for (0 = one per online CPU).
    pub nr_io_queues: u16,
    /// Extra I/O queues reserved for user-owned queue pairs ([`crate::passthru::QueuePair`]):
    /// the block core never maps them (seed 001's "user_poll" queues).
    pub nr_user_queues: u16,
    /// Entries per I/O queue (Linux default 128, range 16..=1024).
    pub queue_size: u16,
    /// Header digest (`-g`).
    pub hdr_digest: bool,
    /// Data digest (`-G`).
    pub data_digest: bool,
    /// Keep-alive timeout, ms (Linux default 5 s).
    pub kato_ms: u32,
    /// Delay between reconnect attempts (Linux `reconnect_delay`, default 10 s).
    pub reconnect_delay: Duration,
    /// Give up and delete the controller after this long without a connection
    /// (`ctrl_loss_tmo`, default 600 s; `None` = retry forever).
    pub ctrl_loss_tmo: Option<Duration>,
    /// DH-HMAC-CHAP host secret, `DHHC-1:..` (`nvme connect --dhchap-secret`): used when
    /// the controller requires in-band authentication.
    pub dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP controller secret (`--dhchap-ctrl-secret`): the controller must prove it too.
    pub dhchap_ctrl_secret: Option<String>,
    /// Fail I/O waiting for a reconnect after this long (`fast_io_fail_tmo`, default off:
    /// I/O waits until the controller is back or lost).
    pub fast_io_fail_tmo: Option<Duration>,
    /// Socket connect and handshake timeout.
    pub connect_timeout: Duration,
    /// Disable SQ flow control so reads complete with C2HData SUCCESS (one PDU less per read).
    pub disable_sqflow: bool,
    /// Command ids of I/O queues span `0..tag_space` (for tag sets shared across
    /// queues; `None` = the queue size).
    pub tag_space: Option<u16>,
    /// TCP congestion control of every queue's connection, by its kernel name (`reno`,
    /// `cubic`, `bbr`, ...; `None` = the system's). BBR paces its sends, which on short
    /// round trips costs a request/response stream bandwidth (BENCHMARKS.md).
    pub tcp_congestion: Option<String>,
    /// Run every queue inside a TLS 1.3 channel with this key (`nvme connect --tls
    /// --tls-key`; see [`crate::tls`]).
    pub tls: Option<crate::tls::HostTls>,
    /// Secure channel concatenation (`nvme connect --concat`, NVMe Base 2.1 §8.3.4.5): the
    /// admin queue authenticates in plaintext (DH-HMAC-CHAP with a DH group, SC_C
    /// `NEWTLSPSK`), which generates a TLS PSK; the admin queue then connects again and
    /// every I/O queue connects inside TLS with it, with no second transaction. Every
    /// reconnect does it again: the PSK lives as long as the association. Needs
    /// `dhchap_secret`; excludes `tls`.
    pub concat: bool,
    /// Hand each TLS queue's records to kernel TLS after its handshake where the kernel
    /// offers it (auto, the default), or keep them in user space (off).
    pub tls_offload: tls::kernel::Offload,
    /// The Command Quiesce Time assumed when the controller reports none (CQT 0 in
    /// Identify Controller); `None`: one keep-alive timeout. Part of the failover hold
    /// ([`crate::failover::hold_time`]): a write whose connection failed is sent again
    /// only after it.
    pub command_quiesce_time: Option<Duration>,
}

impl ConnectOptions {
    /// Defaults for `subnqn` at `traddr`.
    pub fn new(traddr: SocketAddr, subnqn: &str) -> ConnectOptions {
        let (hostnqn, hostid) = default_host_identity();
        ConnectOptions {
            traddr,
            subnqn: subnqn.to_string(),
            hostnqn,
            hostid,
            nr_io_queues: 0,
            nr_user_queues: 0,
            queue_size: 128,
            hdr_digest: false,
            data_digest: false,
            kato_ms: 5000,
            reconnect_delay: Duration::from_secs(10),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            fast_io_fail_tmo: None,
            connect_timeout: Duration::from_secs(5),
            disable_sqflow: true,
            tag_space: None,
            tcp_congestion: None,
            tls: None,
            concat: false,
            tls_offload: tls::kernel::Offload::Auto,
            command_quiesce_time: None,
        }
    }
}

/// The host identity: `/etc/nvme/hostnqn` and `/etc/nvme/hostid` when present (as nvme-cli),
/// else one derived from the machine id, else a fixed qpath one.
pub fn default_host_identity() -> (String, [u8; 16]) {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    if let Some(nqn) = read("/etc/nvme/hostnqn") {
        let id = read("/etc/nvme/hostid").and_then(|s| nvme::nqn::parse_uuid(&s)).unwrap_or([0x51; 16]);
        return (nqn, id);
    }
    let mut id = read("/etc/machine-id").and_then(|s| nvme::nqn::parse_uuid(&s)).unwrap_or(*b"qpath-host-0001\0");
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    (nvme::nqn::uuid_hostnqn(&id), id)
}

/// Controller lifecycle (Linux `nvme_ctrl_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlState {
    /// Created, never connected.
    New,
    /// Admin and I/O queues being (re)established.
    Connecting,
    /// Serving I/O.
    Live,
    /// A queue failed: tearing down before reconnecting.
    Resetting,
    /// Being deleted on request.
    Deleting,
    /// Gone for good (deleted, or ctrl_loss_tmo expired): queued I/O fails.
    Dead,
}

impl CtrlState {
    /// The one place controller lifecycle changes are decided (Linux `nvme_change_ctrl_state`).
    #[must_use = "a refused transition leaves the state as it was"]
    pub fn transition(self, to: CtrlState) -> std::result::Result<CtrlState, BadTransition<CtrlState>> {
        use CtrlState::*;
        let ok = matches!(
            (self, to),
            (New, Connecting)
                | (Connecting, Live)
                | (Connecting, Connecting)
                | (Live, Resetting)
                | (Resetting, Connecting)
                | (Connecting | Live | Resetting | New, Deleting)
                | (Connecting | Deleting, Dead)
        );
        if ok { Ok(to) } else { Err(BadTransition { from: self, to }) }
    }
}

/// What the host knows about one namespace through this controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsInfo {
    /// NSID.
    pub nsid: Nsid,
    /// Blocks.
    pub nsze: u64,
    /// log2 of the block size.
    pub block_shift: u8,
    /// ANA group.
    pub anagrpid: AnaGrpId,
    /// ANA state through this controller.
    pub ana_state: AnaState,
    /// NGUID.
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
    /// UUID, when reported.
    pub uuid: Option<[u8; 16]>,
    /// May be shared by several controllers (NMIC bit 0).
    pub shared: bool,
}

impl NsInfo {
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift
    }

    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nsze << self.block_shift
    }

    /// Its identifiers, as the block core compares them to tell another namespace under
    /// the same NSID ([`crate::context::ctrlview::NsIds`]).
    pub fn ids(&self) -> crate::context::ctrlview::NsIds {
        crate::context::ctrlview::NsIds { nguid: self.nguid, eui64: self.eui64, uuid: self.uuid }
    }

    /// The identity multipath groups paths by: NGUID, else EUI-64, else UUID.
    pub fn unique_id(&self) -> Option<[u8; 16]> {
        if self.nguid != [0; 16] {
            return Some(self.nguid);
        }
        if self.eui64 != [0; 8] {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(&self.eui64);
            return Some(v);
        }
        self.uuid
    }
}

/// Messages from a controller to a context that owns one of its queues.
// One per (re)connect or control command, never per I/O: the queue moves by value.
#[allow(clippy::large_enum_variant)]
pub enum QueueMsg {
    /// A (re)connected I/O queue: `index` is the queue's position (qid − 1).
    Queue {
        /// The controller.
        ctrl: Arc<Controller>,
        /// Queue index (qid − 1).
        index: u16,
        /// Controller generation this connection belongs to.
        generation: u64,
        /// The socket.
        stream: TcpStream,
        /// The live queue.
        queue: HostQueue,
    },
    /// A control command for I/O queue `index` of `ctrl` (a re-authentication's
    /// Authentication Send or Receive): sent beside the queue's I/O under its reserved
    /// tag, its completion (or why it could not be sent) goes back through `reply`.
    Command {
        /// The controller.
        ctrl: Arc<Controller>,
        /// Queue index (qid − 1).
        index: u16,
        /// The controller generation the command is meant for (an older or newer
        /// connection of the queue refuses it).
        generation: u64,
        /// The command.
        io: Io,
        /// Where the completion goes (a channel of one: sending never blocks).
        reply: SyncSender<Result<Done>>,
    },
}

impl std::fmt::Debug for QueueMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueMsg::Queue { index, generation, .. } => write!(f, "Queue(index {index}, gen {generation})"),
            QueueMsg::Command { index, generation, .. } => write!(f, "Command(index {index}, gen {generation})"),
        }
    }
}

struct QueueSlot {
    owner: Option<MailboxSender<QueueMsg>>,
    parked: Option<(TcpStream, HostQueue)>,
    /// Reserved for user-owned queue pairs.
    user: bool,
}

struct Inner {
    /// The lifecycle, keep-alive, AER/ANA, reset, reconnect and ctrl-loss decisions
    /// (stepped by the admin thread; read by every caller of `state`, `should_fail_io`).
    m: CtrlMachine,
    cntlid: Cntlid,
    id: IdentifyController,
    namespaces: Vec<NsInfo>,
    slots: Vec<QueueSlot>,
    reauths: u64,
    reauth_failures: u64,
}

enum AdminReq {
    Command {
        io: Io,
        reply: SyncSender<Result<Done>>,
    },
    /// Re-authenticate the admin queue with the controller's current keys by `deadline`.
    Authenticate {
        deadline: Instant,
        reply: SyncSender<Result<()>>,
    },
    Delete {
        reply: SyncSender<()>,
    },
}

/// An NVMe/TCP controller.
pub struct Controller {
    /// Connect options.
    pub opts: ConnectOptions,
    inner: Mutex<Inner>,
    /// The machine's clock: its times are ns since this instant.
    origin: Instant,
    /// The machine's generation, mirrored for one load: bumped at every new
    /// association; queues of an older generation are stale.
    generation: AtomicU64,
    /// Bumped when ANA states or the namespace list change (multipath heads re-read).
    change_count: AtomicU64,
    live: AtomicBool,
    /// Set by a context whose queue of this controller failed.
    io_failed: AtomicBool,
    /// Set by a context that saw an ANA status: the admin thread re-reads the ANA log.
    ana_refresh: AtomicBool,
    /// The failover hold of this controller's connection, ns ([`crate::failover`]): set
    /// from Identify Controller at every (re)connect, read by contexts with one load.
    failover_hold_ns: AtomicU64,
    admin_tx: Mutex<Option<SyncSender<AdminReq>>>,
    /// Wakes the admin thread: rung after a request is queued or a flag above is set
    /// (the thread sleeps until the admin socket is readable, this rings, or its next
    /// keep-alive is due); dropping it wakes the thread to end.
    bell: Bell,
    /// Times the admin thread woke (operators see an idle controller cost nothing).
    admin_wakeups: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// DH-HMAC-CHAP secrets: `opts`' at first, replaced by [`Controller::reauthenticate`]
    /// (reconnects use the newest, as Linux after a write to `dhchap_secret`).
    keys: Mutex<Option<crate::auth::DhchapKeys>>,
    /// One re-authentication at a time.
    reauth: Mutex<()>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("traddr", &self.opts.traddr)
            .field("subnqn", &self.opts.subnqn)
            .field("state", &self.state())
            .finish()
    }
}

/// What [`Controller::reauthenticate`] did.
#[derive(Clone, Debug)]
pub struct Reauthenticated {
    /// I/O queues re-authenticated (the admin queue was, or it is an error).
    pub io_queues: usize,
    /// I/O queues whose transaction failed: queue id and why.
    pub failed: Vec<(u16, String)>,
    /// From the start to the last queue's end.
    pub took: Duration,
}

/// A live I/O queue that a context or a user queue pair owns, as an
/// [`crate::auth::Exchange`]: each command goes to the owner's mailbox and its
/// completion comes back on a channel.
struct OwnedQueue {
    owner: MailboxSender<QueueMsg>,
    ctrl: Arc<Controller>,
    index: u16,
    generation: u64,
}

impl crate::auth::Exchange for OwnedQueue {
    fn qid(&self) -> u16 {
        self.index + 1
    }

    fn execute(&mut self, io: Io, timeout: Duration) -> Result<Done> {
        let (tx, rx) = sync_channel(1);
        let (index, generation) = (self.index, self.generation);
        let msg = QueueMsg::Command { ctrl: Arc::clone(&self.ctrl), index, generation, io, reply: tx };
        self.owner.send(msg).map_err(|_| Error::new(ErrorKind::Gone, "the queue's owner is gone"))?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(Error::new(
                ErrorKind::Timeout,
                format!("queue {}: no answer in time (is the owning context polled?)", index + 1),
            )),
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::new(ErrorKind::Gone, format!("queue {}: closed before the answer", index + 1)))
            }
        }
    }
}

/// A summary for `list-subsys`.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    /// Address.
    pub traddr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller id.
    pub cntlid: Cntlid,
    /// Lifecycle state.
    pub state: CtrlState,
    /// Model.
    pub model: String,
    /// Serial.
    pub serial: String,
    /// Firmware.
    pub firmware: String,
    /// I/O queues.
    pub io_queues: usize,
    /// Reconnects so far.
    pub reconnects: u64,
    /// Re-authentications in which every queue's transaction succeeded.
    pub reauths: u64,
    /// Re-authentications in which the admin queue's or an I/O queue's failed.
    pub reauth_failures: u64,
    /// Times the admin thread woke: for a keep-alive, an answer, an event or a request
    /// (an idle controller wakes about twice per keep-alive timeout, and at least once
    /// a second).
    pub admin_wakeups: u64,
    /// Last error.
    pub last_error: Option<String>,
}

struct Bringup {
    admin: SyncQueue,
    cntlid: Cntlid,
    id: IdentifyController,
    namespaces: Vec<NsInfo>,
    io: Vec<(TcpStream, HostQueue)>,
}

impl Controller {
    /// Connects (admin queue, enable, identify, I/O queues, namespaces, ANA) and starts the admin thread.
    pub fn connect(opts: ConnectOptions) -> Result<Arc<Controller>> {
        nvme::nqn::validate(&opts.subnqn).map_err(|e| Error::new(ErrorKind::Invalid, format!("subsystem NQN: {e}")))?;
        nvme::nqn::validate(&opts.hostnqn).map_err(|e| Error::new(ErrorKind::Invalid, format!("host NQN: {e}")))?;
        if !(2..=4096).contains(&opts.queue_size) {
            return Err(Error::new(ErrorKind::Invalid, "queue_size must be in 2..=4096"));
        }
        let keys = crate::auth::DhchapKeys::parse(opts.dhchap_secret.as_deref(), opts.dhchap_ctrl_secret.as_deref())?;
        // Refused before anything is sent, as Linux `nvmf_parse_options` refuses them.
        if opts.concat && keys.is_none() {
            return Err(Error::new(
                ErrorKind::Invalid,
                "secure channel concatenation (--concat) needs a DH-HMAC-CHAP secret (--dhchap-secret): \
                 its transaction makes the TLS key",
            ));
        }
        if opts.concat && opts.tls.is_some() {
            return Err(Error::new(
                ErrorKind::Invalid,
                "secure channel concatenation (--concat) makes its own TLS key: it cannot be combined with \
                 a configured one (--tls-key)",
            ));
        }
        let b = bring_up(&opts, keys.as_ref(), None)?;
        let hold = hold_ns(&opts, &b.id);
        let nq = b.io.len();
        let nuser = usize::from(opts.nr_user_queues).min(nq.saturating_sub(1));
        let (tx, rx) = sync_channel(16);
        let (bell, bell_rx) = bell::pair().map_err(|e| Error::io("admin thread's wake-up socket", &e))?;
        let ctrl = Arc::new(Controller {
            inner: Mutex::new(Inner {
                m: CtrlMachine::live(MachineConfig::of(&opts), 0),
                cntlid: b.cntlid,
                id: b.id,
                namespaces: b.namespaces,
                slots: b
                    .io
                    .into_iter()
                    .enumerate()
                    .map(|(i, q)| QueueSlot { owner: None, parked: Some(q), user: i >= nq - nuser })
                    .collect(),
                reauths: 0,
                reauth_failures: 0,
            }),
            origin: Instant::now(),
            generation: AtomicU64::new(1),
            change_count: AtomicU64::new(1),
            live: AtomicBool::new(true),
            io_failed: AtomicBool::new(false),
            ana_refresh: AtomicBool::new(false),
            failover_hold_ns: AtomicU64::new(hold),
            admin_tx: Mutex::new(None),
            bell,
            admin_wakeups: AtomicU64::new(0),
            thread: Mutex::new(None),
            keys: Mutex::new(keys),
            reauth: Mutex::new(()),
            opts,
        });
        *ctrl.admin_tx.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let weak = Arc::downgrade(&ctrl);
        let admin = b.admin;
        let t = std::thread::Builder::new()
            .name(format!("qpath-admin-{}", ctrl.cntlid().0))
            .spawn(move || admin_thread(&weak, admin, &rx, &bell_rx))
            .map_err(|e| Error::io("spawn admin thread", &e))?;
        *ctrl.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        tracing::info!(traddr = %ctrl.opts.traddr, subnqn = %ctrl.opts.subnqn, cntlid = ctrl.cntlid().0, io_queues = nq, "controller live");
        Ok(ctrl)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lifecycle state.
    pub fn state(&self) -> CtrlState {
        self.lock().m.state()
    }

    /// The machine's time now (ns since `origin`).
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs `f` on the machine at the time now, then mirrors its generation and
    /// liveness into the atomics the I/O path loads.
    fn step<R>(&self, f: impl FnOnce(&mut CtrlMachine, u64) -> R) -> R {
        let now = self.now_ns();
        let mut g = self.lock();
        let r = f(&mut g.m, now);
        self.generation.store(g.m.generation(), Ordering::Release);
        self.live.store(g.m.is_live(), Ordering::Release);
        r
    }

    /// Whether the controller is live (one relaxed load).
    #[inline]
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Controller id.
    pub fn cntlid(&self) -> Cntlid {
        self.lock().cntlid
    }

    /// Identify Controller data.
    pub fn identify(&self) -> IdentifyController {
        self.lock().id.clone()
    }

    /// Connection generation (bumped at every reconnect).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How long a command that changes data and whose connection to this controller
    /// failed is held before it is sent again ([`crate::failover::hold_time`] of the
    /// controller's KATO, CTRATT and CQT). One relaxed load.
    #[inline]
    pub fn failover_hold(&self) -> Duration {
        Duration::from_nanos(self.failover_hold_ns.load(Ordering::Relaxed))
    }

    /// Bumped when namespaces or ANA states change.
    #[inline]
    pub fn change_count(&self) -> u64 {
        self.change_count.load(Ordering::Acquire)
    }

    /// The namespaces this controller exposes.
    pub fn namespaces(&self) -> Vec<NsInfo> {
        self.lock().namespaces.clone()
    }

    /// One namespace.
    pub fn namespace(&self, nsid: Nsid) -> Option<NsInfo> {
        self.lock().namespaces.iter().find(|n| n.nsid == nsid).cloned()
    }

    /// Number of I/O queues (block-core queues and user queues).
    pub fn io_queue_count(&self) -> usize {
        self.lock().slots.len()
    }

    /// Number of I/O queues the block core may map (user queues excluded).
    pub fn block_queue_count(&self) -> usize {
        self.lock().slots.iter().filter(|s| !s.user).count()
    }

    /// How long the controller has been down, if it is.
    pub fn down_for(&self) -> Option<Duration> {
        let now = self.now_ns();
        self.lock().m.down_for(now)
    }

    /// Whether I/O waiting for this controller should fail now (fast_io_fail_tmo passed, or dead).
    pub fn should_fail_io(&self) -> bool {
        let now = self.now_ns();
        self.lock().m.should_fail_io(now)
    }

    /// A summary.
    pub fn info(&self) -> ControllerInfo {
        let g = self.lock();
        ControllerInfo {
            traddr: self.opts.traddr,
            subnqn: self.opts.subnqn.clone(),
            cntlid: g.cntlid,
            state: g.m.state(),
            model: g.id.mn.clone(),
            serial: g.id.sn.clone(),
            firmware: g.id.fr.clone(),
            io_queues: g.slots.len(),
            reconnects: g.m.reconnects(),
            reauths: g.reauths,
            reauth_failures: g.reauth_failures,
            admin_wakeups: self.admin_wakeups.load(Ordering::Relaxed),
            last_error: g.m.last_error().map(str::to_string),
        }
    }

    /// Claims I/O queue `index` for the context behind `owner`: returns the
    /// connection if it is parked here; after reconnects, new connections of
    /// this queue are sent to `owner`. `None` if the index is out of range or
    /// owned by another context.
    pub fn claim_queue(
        &self,
        index: u16,
        owner: MailboxSender<QueueMsg>,
    ) -> Option<Option<(TcpStream, HostQueue, u64)>> {
        let mut g = self.lock();
        let generation = self.generation();
        let slot = g.slots.get_mut(usize::from(index))?;
        if slot.owner.is_some() {
            return None;
        }
        slot.owner = Some(owner);
        Some(slot.parked.take().map(|(s, q)| (s, q, generation)))
    }

    /// Gives a queue back (its context is going away).
    pub fn release_queue(&self, index: u16, conn: Option<(TcpStream, HostQueue)>) {
        let mut g = self.lock();
        if let Some(slot) = g.slots.get_mut(usize::from(index)) {
            slot.owner = None;
            slot.parked = conn;
        }
    }

    /// Indices of block-core queues no context owns.
    pub fn free_queues(&self) -> Vec<u16> {
        self.free_where(false)
    }

    /// Indices of user queues no queue pair owns.
    pub fn free_user_queues(&self) -> Vec<u16> {
        self.free_where(true)
    }

    fn free_where(&self, user: bool) -> Vec<u16> {
        self.lock()
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.owner.is_none() && s.user == user)
            .filter_map(|(i, _)| u16::try_from(i).ok())
            .collect()
    }

    /// A context reports that one of this controller's I/O queues failed: the admin thread resets.
    pub fn report_io_failure(&self, why: &str) {
        if !self.io_failed.swap(true, Ordering::AcqRel) {
            tracing::warn!(traddr = %self.opts.traddr, "I/O queue failed: {why}");
            self.lock().m.set_last_error(why.to_string());
            self.bell.ring();
        }
    }

    /// A context saw an ANA status on this controller: re-read the ANA log soon
    /// (on the admin thread; the I/O path only sets a flag).
    pub fn request_ana_refresh(&self) {
        if !self.ana_refresh.swap(true, Ordering::AcqRel) {
            self.bell.ring();
        }
    }

    /// The DH-HMAC-CHAP secrets new connections and re-authentications use.
    pub fn keys(&self) -> Option<crate::auth::DhchapKeys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-authenticates the live controller's queues with DH-HMAC-CHAP (NVMe 2.x
    /// §8.13.4; Linux `nvme_ctrl_auth_work`, run when `dhchap_secret` is written):
    /// the admin queue first (on the admin thread), then every I/O queue at once, each
    /// beside its I/O. With `keys` the host's secrets change first (a key rotation: the
    /// controller must hold the new ones; later reconnects use them too). A failure on
    /// the admin queue is the error; failures of I/O queues are in the report (Linux
    /// warns and goes on: the controller decides whether such a queue may stay). A
    /// controller connected with concatenation re-authenticates its admin queue only, with
    /// `REPLACETLSPSK` (as Linux).
    ///
    /// Blocks the caller for up to `timeout`, so it must not be the thread that polls a
    /// context owning one of the queues: that queue's commands would wait for it.
    pub fn reauthenticate(
        self: &Arc<Self>,
        keys: Option<crate::auth::DhchapKeys>,
        timeout: Duration,
    ) -> Result<Reauthenticated> {
        let _one = self.reauth.lock().unwrap_or_else(|e| e.into_inner());
        if self.state() != CtrlState::Live {
            return Err(Error::new(ErrorKind::Invalid, format!("controller is {:?}, not live", self.state())));
        }
        if let Some(k) = keys {
            *self.keys.lock().unwrap_or_else(|e| e.into_inner()) = Some(k);
        }
        if self.keys().is_none() {
            return Err(Error::new(ErrorKind::Invalid, "no DH-HMAC-CHAP secret to authenticate with"));
        }
        let start = Instant::now();
        let deadline = start + timeout;
        let generation = self.generation();
        let tx = self.admin_tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tx = tx.ok_or_else(|| Error::new(ErrorKind::Gone, "admin thread gone"))?;
        let (rtx, rrx) = sync_channel(1);
        tx.send(AdminReq::Authenticate { deadline, reply: rtx })
            .map_err(|_| Error::new(ErrorKind::Gone, "admin thread gone"))?;
        self.bell.ring();
        // The admin thread answers by the deadline or fails the transaction; the margin
        // covers a keep-alive round it may be in.
        let admin = rrx
            .recv_timeout(timeout + ADMIN_TIMEOUT)
            .map_err(|_| Error::new(ErrorKind::Timeout, "admin queue re-authentication: no answer"))
            .and_then(|r| r);
        if let Err(e) = admin {
            let mut g = self.lock();
            g.reauth_failures += 1;
            g.m.set_last_error(format!("re-authentication: {e}"));
            return Err(e);
        }
        // With concatenation only the admin queue re-authenticates (as Linux): the I/O
        // queues run inside the channel and never authenticated.
        let n = if self.opts.concat { 0 } else { self.io_queue_count() };
        let (keys, hostnqn, subnqn) = (self.keys(), &self.opts.hostnqn, &self.opts.subnqn);
        // Each transaction's DH work runs at auth::REAUTH_NICE (Occasion::Reauthentication).
        let io = run_parallel(n, false, &|i| {
            let index = u16::try_from(i).unwrap_or(u16::MAX);
            self.reauthenticate_io(index, generation, keys.as_ref(), hostnqn, subnqn, deadline)
        });
        let failed: Vec<(u16, String)> = io
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().err().map(|e| (u16::try_from(i + 1).unwrap_or(u16::MAX), e.to_string())))
            .collect();
        for (qid, e) in &failed {
            tracing::warn!(traddr = %self.opts.traddr, qid, "re-authentication failed: {e}");
        }
        let took = start.elapsed();
        {
            let mut g = self.lock();
            if failed.is_empty() {
                g.reauths += 1;
            } else {
                g.reauth_failures += 1;
            }
        }
        let (ms, nfailed) = (took.as_millis(), failed.len());
        tracing::info!(traddr = %self.opts.traddr, io_queues = n, failed = nfailed, ms, "re-authenticated");
        Ok(Reauthenticated { io_queues: n - failed.len(), failed, took })
    }

    /// One I/O queue's transaction: through its owner, or on the parked connection itself.
    fn reauthenticate_io(
        self: &Arc<Self>,
        index: u16,
        generation: u64,
        keys: Option<&crate::auth::DhchapKeys>,
        hostnqn: &str,
        subnqn: &str,
        deadline: Instant,
    ) -> Result<()> {
        let (owner, parked) = {
            let mut g = self.lock();
            let slot =
                g.slots.get_mut(usize::from(index)).ok_or_else(|| Error::new(ErrorKind::Gone, "no such queue"))?;
            (slot.owner.clone(), if slot.owner.is_none() { slot.parked.take() } else { None })
        };
        if let Some(owner) = owner {
            let mut q = OwnedQueue { owner, ctrl: Arc::clone(self), index, generation };
            return crate::auth::authenticate(
                &mut q,
                keys,
                hostnqn,
                subnqn,
                deadline,
                crate::auth::Occasion::Reauthentication,
            );
        }
        let Some((stream, queue)) = parked else {
            return Err(Error::new(ErrorKind::Gone, "the queue is not connected"));
        };
        // No context has claimed it: the transaction runs on the connection here, and the
        // connection goes back where it belongs now (a context may have claimed it
        // meanwhile), whatever the outcome: a controller that closes it on a failure
        // fails it for its next owner, one that keeps it (failure is soft state for
        // Linux) keeps it usable. Only a connection of an older association is dropped.
        let mut q = SyncQueue::from_parts(stream, queue);
        let r =
            crate::auth::authenticate(&mut q, keys, hostnqn, subnqn, deadline, crate::auth::Occasion::Reauthentication);
        if self.generation() == generation {
            let (stream, queue) = q.into_parts();
            let mut g = self.lock();
            if let Some(slot) = g.slots.get_mut(usize::from(index)) {
                match &slot.owner {
                    Some(o) => {
                        let msg = QueueMsg::Queue { ctrl: Arc::clone(self), index, generation, stream, queue };
                        let _ = o.send(msg);
                    }
                    None => slot.parked = Some((stream, queue)),
                }
            }
        }
        r
    }

    /// Runs an admin command on the admin thread (control plane; blocks the caller).
    pub fn admin_command(&self, io: Io) -> Result<Done> {
        let tx = self.admin_tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tx = tx.ok_or_else(|| Error::new(ErrorKind::Gone, "controller deleted"))?;
        let (rtx, rrx) = sync_channel(1);
        tx.send(AdminReq::Command { io, reply: rtx }).map_err(|_| Error::new(ErrorKind::Gone, "admin thread gone"))?;
        self.bell.ring();
        rrx.recv_timeout(ADMIN_TIMEOUT * 2).map_err(|_| Error::new(ErrorKind::Timeout, "admin command timed out"))?
    }

    /// Disconnects: shuts the controller down and stops the admin thread.
    pub fn delete(&self) {
        let tx = self.admin_tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = tx {
            let (rtx, rrx) = sync_channel(1);
            if tx.send(AdminReq::Delete { reply: rtx }).is_ok() {
                self.bell.ring();
                let _ = rrx.recv_timeout(Duration::from_secs(10));
            }
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.admin_tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// A queue's configuration; `tls`: what its secure channel presents (a configured key's,
/// or concatenation's generated one), if it has one.
fn queue_cfg(
    opts: &ConnectOptions,
    qid: u16,
    entries: u16,
    cntlid: Cntlid,
    tls: Option<&crate::tls::QueueTls>,
) -> QueueConfig {
    let mut c = QueueConfig::io(qid, entries, cntlid, &opts.subnqn, &opts.hostnqn, opts.hostid);
    c.digests = nvme::tcp::Digests { header: opts.hdr_digest, data: opts.data_digest };
    c.disable_sqflow = opts.disable_sqflow;
    c.tag_space = opts.tag_space.unwrap_or(entries).max(entries);
    c.tcp_congestion.clone_from(&opts.tcp_congestion);
    c.tls = tls.cloned();
    c.tls_offload = opts.tls_offload;
    c
}

/// The admin queue's configuration (without its TLS).
fn admin_cfg(opts: &ConnectOptions, dhchap: Option<&crate::auth::DhchapKeys>) -> QueueConfig {
    let mut acfg = queue_cfg(opts, 0, 32, Cntlid::DYNAMIC, None);
    acfg.dhchap = dhchap.cloned();
    acfg.kato_ms = opts.kato_ms;
    acfg.disable_sqflow = false;
    acfg.concat = opts.concat;
    acfg
}

/// Secure channel concatenation's first step (NVMe Base 2.1 §8.3.4.5; Linux
/// `nvme_tcp_setup_ctrl`): the admin queue connects in plaintext and authenticates with
/// SC_C `NEWTLSPSK`; the connection is then closed (Linux tears it down and connects the
/// admin queue again inside TLS: nothing else runs on it). What the queues after it present.
fn concatenate(opts: &ConnectOptions, dhchap: Option<&crate::auth::DhchapKeys>) -> Result<crate::tls::QueueTls> {
    let mut admin = SyncQueue::connect(opts.traddr, admin_cfg(opts, dhchap), opts.connect_timeout)?;
    let psk = admin.take_generated_psk().ok_or_else(|| {
        Error::new(
            ErrorKind::Protocol,
            "secure channel concatenation: the controller did not ask the plaintext admin queue to \
             authenticate, so no TLS key was made (does it hold a DH-HMAC-CHAP key for this host?)",
        )
    })?;
    drop(admin);
    let t = crate::tls::QueueTls::generated(&psk, &opts.hostnqn, &opts.subnqn);
    tracing::info!(traddr = %opts.traddr, hash = psk.hash().name(), "secure channel concatenation: TLS PSK generated");
    Ok(t)
}

/// Brings up the admin queue and every I/O queue. `want_queues` keeps the
/// queue count of an earlier connection across reconnects.
/// The failover hold for a controller that identified itself with `id`, in ns.
fn hold_ns(opts: &ConnectOptions, id: &IdentifyController) -> u64 {
    let hold = crate::failover::hold_time(crate::failover::HoldInputs {
        kato_ms: opts.kato_ms,
        kas: id.kas,
        ctratt: id.ctratt,
        cqt_ms: id.cqt,
        quiesce_default: opts.command_quiesce_time,
    });
    u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX)
}

fn bring_up(
    opts: &ConnectOptions,
    dhchap: Option<&crate::auth::DhchapKeys>,
    want_queues: Option<usize>,
) -> Result<Bringup> {
    // Concatenation makes the TLS key anew at every (re)connect; else a configured key's.
    let mut tls = if opts.concat {
        Some(concatenate(opts, dhchap)?)
    } else {
        opts.tls.as_ref().map(|t| t.for_queue(&opts.hostnqn, &opts.subnqn))
    };
    let dhchap = dhchap.cloned();
    let mut acfg = admin_cfg(opts, dhchap.as_ref());
    acfg.tls.clone_from(&tls);
    let mut admin = SyncQueue::connect(opts.traddr, acfg, opts.connect_timeout)?;
    // A controller that asks the admin queue inside the generated channel to authenticate
    // gets REPLACETLSPSK (as Linux's host sends then), and the I/O queues take the new PSK.
    if let Some(psk) = admin.take_generated_psk() {
        tls = Some(crate::tls::QueueTls::generated(&psk, &opts.hostnqn, &opts.subnqn));
    }
    let cntlid = admin.queue().cntlid();
    let want = match want_queues {
        Some(n) => n,
        None if opts.nr_io_queues == 0 => uring::online_cpus().max(1) + usize::from(opts.nr_user_queues),
        None => usize::from(opts.nr_io_queues) + usize::from(opts.nr_user_queues),
    };
    let mut io = Vec::new();
    let mut m = bringup::Bringup::new(bringup::BringupConfig { want_queues: want, queue_size: opts.queue_size });
    let b = drive(&mut admin, &mut m, |count, entries, max_in_capsule| {
        let connect_io = |i: usize| -> Result<(TcpStream, HostQueue)> {
            let qid = u16::try_from(i + 1).map_err(|_| Error::new(ErrorKind::Invalid, "too many queues"))?;
            let mut cfg = queue_cfg(opts, qid, entries, cntlid, tls.as_ref());
            cfg.max_in_capsule = max_in_capsule;
            cfg.dhchap.clone_from(&dhchap);
            Ok(SyncQueue::connect(opts.traddr, cfg, opts.connect_timeout)?.into_parts())
        };
        io = if dhchap.is_some() {
            run_parallel(count, true, &connect_io).into_iter().collect::<Result<Vec<_>>>()?
        } else {
            (0..count).map(connect_io).collect::<Result<_>>()?
        };
        Ok(())
    })?;
    Ok(Bringup { admin, cntlid, id: b.id, namespaces: b.namespaces, io })
}

/// The admin steps of a bring-up, an enable or a namespace scan, as [`drive`] runs them.
pub(crate) trait AdminSteps {
    /// The outcome.
    type Out;
    fn poll(&mut self, now_ns: u64) -> bringup::Next<Self::Out>;
    fn on_done(&mut self, now_ns: u64, d: &Done);
    fn on_error(&mut self, e: Error);
    /// Only a bring-up asks for I/O queues.
    fn io_connected(&mut self) {}
}

impl AdminSteps for bringup::Bringup {
    type Out = bringup::Brought;
    fn poll(&mut self, now_ns: u64) -> bringup::Next<Self::Out> {
        bringup::Bringup::poll(self, now_ns)
    }
    fn on_done(&mut self, now_ns: u64, d: &Done) {
        bringup::Bringup::on_done(self, now_ns, d);
    }
    fn on_error(&mut self, e: Error) {
        bringup::Bringup::on_error(self, e);
    }
    fn io_connected(&mut self) {
        bringup::Bringup::io_connected(self);
    }
}

impl AdminSteps for bringup::NsScan {
    type Out = Vec<NsInfo>;
    fn poll(&mut self, now_ns: u64) -> bringup::Next<Self::Out> {
        bringup::NsScan::poll(self, now_ns)
    }
    fn on_done(&mut self, _now_ns: u64, d: &Done) {
        bringup::NsScan::on_done(self, d);
    }
    fn on_error(&mut self, e: Error) {
        bringup::NsScan::on_error(self, e);
    }
}

impl AdminSteps for bringup::Enable {
    type Out = nvme::fabrics::Cap;
    fn poll(&mut self, now_ns: u64) -> bringup::Next<Self::Out> {
        bringup::Enable::poll(self, now_ns)
    }
    fn on_done(&mut self, now_ns: u64, d: &Done) {
        bringup::Enable::on_done(self, now_ns, d);
    }
    fn on_error(&mut self, e: Error) {
        bringup::Enable::on_error(self, e);
    }
}

/// Runs admin steps over a blocking admin queue, each command within [`ADMIN_TIMEOUT`],
/// on the wall clock; `connect_io(count, entries, max_in_capsule)` connects the I/O
/// queues when the steps ask for them.
pub(crate) fn drive<M: AdminSteps>(
    admin: &mut SyncQueue,
    m: &mut M,
    mut connect_io: impl FnMut(usize, u16, usize) -> Result<()>,
) -> Result<M::Out> {
    let origin = Instant::now();
    let now = || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    loop {
        match m.poll(now()) {
            bringup::Next::Command { io, .. } => match admin.execute(io, ADMIN_TIMEOUT) {
                Ok(d) => m.on_done(now(), &d),
                Err(e) => m.on_error(e),
            },
            bringup::Next::Sleep { until_ns } => {
                std::thread::sleep(Duration::from_nanos(until_ns.saturating_sub(now())))
            }
            bringup::Next::ConnectIo { count, entries, max_in_capsule } => {
                match connect_io(count, entries, max_in_capsule) {
                    Ok(()) => m.io_connected(),
                    Err(e) => m.on_error(e),
                }
            }
            // Every command is answered before the next poll here.
            bringup::Next::Wait => {
                return Err(Error::new(ErrorKind::Protocol, "internal error: a step left outstanding"));
            }
            bringup::Next::Done(out) => return Ok(out),
            bringup::Next::Failed(e) => return Err(e),
        }
    }
}

/// Most I/O queues brought up at once (see [`run_parallel`]).
const PARALLEL_CONNECTS_MAX: usize = 8;

/// Runs `f(0..n)` on up to [`PARALLEL_CONNECTS_MAX`] threads (no more than CPUs),
/// results in index order. With `stop_on_error` no new index starts after a failure
/// (those that did not run come back as errors after it, so the first error in index
/// order is the failure's). For queues that authenticate: each spends two
/// Diffie-Hellman steps on each side (16 ms apiece for ffdhe8192 here), and one at a
/// time a controller of 32 queues took seconds to connect, reconnect and
/// re-authenticate. Plain queues connect one after another: a thread would cost more
/// than their handshake.
fn run_parallel<T: Send>(n: usize, stop_on_error: bool, f: &(dyn Fn(usize) -> Result<T> + Sync)) -> Vec<Result<T>> {
    let threads = n.min(uring::online_cpus().max(1)).min(PARALLEL_CONNECTS_MAX);
    let slots: Vec<Mutex<Option<Result<T>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            let r = f(i);
            let failed = r.is_err();
            *slots[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(r);
            if failed && stop_on_error {
                // No new indices after a failure; the ones under way finish.
                next.store(n, Ordering::Relaxed);
                return;
            }
        }
    };
    if threads <= 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| {
            slot.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Protocol, format!("I/O queue {}: not started", i + 1))))
        })
        .collect()
}

/// The namespace scan over the live admin queue; a `rescan` reads the Changed Namespace
/// List first (which re-arms its notice).
fn scan_namespaces(admin: &mut SyncQueue, id: &IdentifyController, rescan: bool) -> Result<Vec<NsInfo>> {
    let mut scan = if rescan { bringup::NsScan::rescan(id) } else { bringup::NsScan::new(id) };
    drive(admin, &mut scan, |_, _, _| Err(Error::new(ErrorKind::Protocol, "a namespace scan connects no queue")))
}

fn submit(admin: &mut SyncQueue, sqe: Sqe) -> Option<u64> {
    admin.submit(Io { sqe, buf: None, len: 0, dir: DataDir::None, token: 0 }).ok()
}

/// Whether the admin thread goes on (`Break`: it ends).
type Step = ControlFlow<()>;

/// The admin thread: the driver of the controller's [`CtrlMachine`]. It serves control
/// requests on the live admin queue, feeds the machine what the admin queue and the
/// I/O side report (answers, events, failures, ANA refresh requests) and does what the
/// machine asks (send a Keep Alive, keep an AER outstanding, re-read ANA or rescan,
/// tear the association down, bring up a new one, shut down or give up).
///
/// Between turns of a live controller it sleeps until the admin socket has input, the
/// bell rings (a request, an I/O queue's failure, an ANA refresh) or the machine's next
/// deadline (the keep-alive), holding no reference to the controller: an idle controller
/// costs about two wake-ups per keep-alive timeout instead of one every 20 ms, and a
/// request is served at once instead of at the next turn. While it reconnects it sleeps
/// until the next attempt (or `ctrl_loss_tmo`), or a delete.
fn admin_thread(weak: &std::sync::Weak<Controller>, admin: SyncQueue, rx: &Receiver<AdminReq>, bell: &BellRx) {
    let mut d = Driver { admin: Some(admin), ka: None, aer: None, readable: true, delete_reply: None };
    // Not on the I/O path: it must not take a tick from a CPU a polling reactor or a
    // pinned job thread spins on.
    let mut place = uring::placement::Helper::default();
    loop {
        if let Err(e) = place.refresh() {
            tracing::debug!("admin thread keeps its CPUs: {e}");
        }
        let Some(ctrl) = weak.upgrade() else { return };
        ctrl.admin_wakeups.fetch_add(1, Ordering::Relaxed);
        if d.turn(&ctrl, rx).is_break() {
            return;
        }
        let (state, wait) = ctrl.step(|m, now| {
            let wait = m.next_deadline().map_or(IDLE_WAKE, |t| Duration::from_nanos(t.saturating_sub(now)));
            (m.state(), wait.min(IDLE_WAKE))
        });
        drop(ctrl);
        match (state, d.admin.as_ref()) {
            (CtrlState::Live, Some(q)) => d.readable = bell.wait(q.stream(), wait),
            (CtrlState::Connecting, _) => {
                d.readable = true;
                if d.wait_for_retry(weak, rx, wait).is_break() {
                    return;
                }
            }
            _ => d.readable = true,
        }
    }
}

/// The longest an admin thread sleeps between turns, whatever its keep-alive timeout
/// (a safety net: everything that needs it sooner rings its bell).
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// What the admin thread holds across turns: the association's admin queue and the
/// commands the machine has outstanding on it.
struct Driver {
    admin: Option<SyncQueue>,
    /// The Keep Alive in flight.
    ka: Option<u64>,
    /// The outstanding Asynchronous Event Request.
    aer: Option<u64>,
    /// Whether the admin socket may have input (the last sleep did not rule it out).
    readable: bool,
    /// The caller of a delete, answered once it is done.
    delete_reply: Option<SyncSender<()>>,
}

impl Driver {
    /// One turn: the inputs (requests, the admin queue's answers and state, the I/O
    /// side's reports) go to the machine, then every action it hands out is done.
    fn turn(&mut self, ctrl: &Arc<Controller>, rx: &Receiver<AdminReq>) -> Step {
        if ctrl.state() == CtrlState::Live
            && let Some(q) = self.admin.as_mut()
        {
            loop {
                match rx.try_recv() {
                    Ok(AdminReq::Delete { reply }) => {
                        self.delete_reply = Some(reply);
                        ctrl.step(|m, _| m.delete());
                    }
                    Ok(req) => serve_request(ctrl, q, req),
                    // The controller is being dropped: shut it down.
                    Err(TryRecvError::Disconnected) => {
                        ctrl.step(|m, _| m.delete());
                        break;
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            // Input the sleep saw (or, after a turn that did not sleep, may be there): one
            // read, which waits at most 20 ms.
            let pumped = if std::mem::take(&mut self.readable) {
                q.pump(Instant::now() + Duration::from_millis(20))
            } else {
                Ok(())
            };
            if let Some(t) = self.ka
                && let Some(d) = q.take(t)
            {
                self.ka = None;
                ctrl.step(|m, _| m.on_admin_done(AdminCmd::KeepAlive, d.cqe.status.is_success()));
            }
            if let Some(t) = self.aer
                && let Some(d) = q.take(t)
            {
                self.aer = None;
                if d.cqe.status.is_success() {
                    ctrl.step(|m, _| m.on_event(AsyncEvent::from_dw0(d.cqe.dw0)));
                } else {
                    ctrl.step(|m, _| m.on_admin_done(AdminCmd::AsyncEventRequest, false));
                }
            }
            let failed = match &pumped {
                Err(e) if e.kind != ErrorKind::Timeout => Some(e.to_string()),
                _ if q.queue().state() == crate::queue::QueueState::Failed => Some("admin queue failed".to_string()),
                _ => None,
            };
            if let Some(why) = failed {
                ctrl.step(|m, now| m.on_lost(now, &why));
            }
        }
        if ctrl.io_failed.swap(false, Ordering::AcqRel) {
            ctrl.step(|m, now| {
                let why = m.last_error().unwrap_or("an I/O queue failed").to_string();
                m.on_lost(now, &why);
            });
        }
        if ctrl.ana_refresh.swap(false, Ordering::AcqRel) {
            ctrl.step(|m, _| m.request_ana_refresh());
        }
        while let Some(a) = ctrl.step(CtrlMachine::poll) {
            self.act(ctrl, a)?;
        }
        Step::Continue(())
    }

    /// Does what the machine asked.
    fn act(&mut self, ctrl: &Arc<Controller>, a: Action) -> Step {
        match a {
            Action::Send(cmd) => self.send(ctrl, cmd),
            Action::TearDown => {
                // The machine moved to a new generation: queues no context has claimed
                // yet belong to the old association, and a context that claims one
                // during the reconnect gets the new one instead.
                (self.admin, self.ka, self.aer) = (None, None, None);
                for slot in &mut ctrl.lock().slots {
                    slot.parked = None;
                }
            }
            Action::Connect => self.reconnect(ctrl),
            Action::Delete { shutdown } => {
                if shutdown && let Some(q) = self.admin.as_mut() {
                    let _ = admin::shutdown(q);
                }
                self.admin = None;
                if let Some(r) = self.delete_reply.take() {
                    let _ = r.send(());
                }
                return Step::Break(());
            }
            Action::Lost => {
                self.admin = None;
                ctrl.change_count.fetch_add(1, Ordering::AcqRel);
                return Step::Break(());
            }
        }
        Step::Continue(())
    }

    /// Sends one admin command the machine asked for: the Keep Alive and the event request
    /// go out and are answered at a later turn; the ANA and namespace reads block here.
    fn send(&mut self, ctrl: &Controller, cmd: AdminCmd) {
        let Some(q) = self.admin.as_mut() else {
            ctrl.step(|m, _| m.on_admin_done(cmd, false));
            return;
        };
        match cmd {
            AdminCmd::KeepAlive => {
                self.ka = submit(q, Sqe::keep_alive(nvme::Cid(0)));
                if self.ka.is_none() {
                    ctrl.step(|m, _| m.on_admin_done(cmd, false));
                }
            }
            AdminCmd::AsyncEventRequest => {
                self.aer = submit(q, Sqe::async_event_request(nvme::Cid(0)));
                if self.aer.is_none() {
                    ctrl.step(|m, _| m.on_admin_done(cmd, false));
                }
            }
            AdminCmd::AnaLog | AdminCmd::Rescan => {
                let id = ctrl.identify();
                let r = scan_namespaces(q, &id, cmd == AdminCmd::Rescan);
                let ok = r.is_ok();
                match r {
                    Ok(ns) => {
                        ctrl.lock().namespaces = ns;
                        ctrl.change_count.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(e) => tracing::warn!(traddr = %ctrl.opts.traddr, "rescan failed: {e}"),
                }
                ctrl.step(|m, _| m.on_admin_done(cmd, ok));
            }
        }
    }

    /// One connect attempt (the bring-up blocks here): on success every I/O queue goes
    /// to the context that owns its slot (or is parked until one claims it).
    fn reconnect(&mut self, ctrl: &Arc<Controller>) {
        let nq = ctrl.io_queue_count();
        let keys = ctrl.keys();
        let b = match bring_up(&ctrl.opts, keys.as_ref(), Some(nq)) {
            Ok(b) if b.io.len() == nq => b,
            Ok(b) => {
                let why = format!("reconnect got {} I/O queues, had {nq}", b.io.len());
                ctrl.step(|m, now| m.on_connected(now, Err(why)));
                return;
            }
            Err(e) => {
                ctrl.step(|m, now| m.on_connected(now, Err(e.to_string())));
                return;
            }
        };
        {
            let mut g = ctrl.lock();
            g.cntlid = b.cntlid;
            ctrl.failover_hold_ns.store(hold_ns(&ctrl.opts, &b.id), Ordering::Relaxed);
            g.id = b.id;
            g.namespaces = b.namespaces;
        }
        ctrl.io_failed.store(false, Ordering::Release);
        ctrl.step(|m, now| m.on_connected(now, Ok(())));
        if !ctrl.is_live() {
            // Refused (logged): the new connections are dropped here.
            return;
        }
        let generation = ctrl.generation();
        let mut to_send = Vec::new();
        {
            let mut g = ctrl.lock();
            for (i, conn) in b.io.into_iter().enumerate() {
                let slot = &mut g.slots[i];
                match &slot.owner {
                    Some(o) => to_send.push((o.clone(), u16::try_from(i).unwrap_or(0), conn)),
                    None => slot.parked = Some(conn),
                }
            }
        }
        ctrl.change_count.fetch_add(1, Ordering::AcqRel);
        for (owner, index, (stream, queue)) in to_send {
            let _ = owner.send(QueueMsg::Queue { ctrl: Arc::clone(ctrl), index, generation, stream, queue });
        }
        (self.admin, self.ka, self.aer) = (Some(b.admin), None, None);
        tracing::info!(traddr = %ctrl.opts.traddr, "controller reconnected");
    }

    /// Sleeps until the next attempt (`wait`), or until a request comes: a delete goes to
    /// the machine, other requests are refused (their callers see the controller is not
    /// live).
    fn wait_for_retry(&mut self, weak: &std::sync::Weak<Controller>, rx: &Receiver<AdminReq>, wait: Duration) -> Step {
        match rx.recv_timeout(wait) {
            Ok(AdminReq::Delete { reply }) => {
                self.delete_reply = Some(reply);
                if let Some(c) = weak.upgrade() {
                    c.step(|m, _| m.delete());
                }
                Step::Continue(())
            }
            Ok(_) | Err(RecvTimeoutError::Timeout) => Step::Continue(()),
            // The controller is gone (every sender dropped): nothing to reconnect for.
            Err(RecvTimeoutError::Disconnected) => Step::Break(()),
        }
    }
}

/// Serves one control request on the live admin queue.
fn serve_request(ctrl: &Controller, q: &mut SyncQueue, req: AdminReq) {
    match req {
        AdminReq::Command { io, reply } => {
            let _ = reply.send(q.execute(io, ADMIN_TIMEOUT));
        }
        AdminReq::Authenticate { deadline, reply } => {
            let _ = reply.send(authenticate_admin(ctrl, q, deadline));
        }
        // Taken by the caller.
        AdminReq::Delete { reply } => {
            let _ = reply.send(());
        }
    }
}

/// Re-authenticates the live admin queue by `deadline`.
fn authenticate_admin(ctrl: &Controller, q: &mut SyncQueue, deadline: Instant) -> Result<()> {
    if ctrl.opts.concat {
        // Linux `nvme_ctrl_auth_work` with concatenation: the admin queue, inside
        // the generated channel, replaces its PSK (REPLACETLSPSK). The new PSK keys
        // no connection here: the queues are connected, and a reconnect concatenates
        // again from plaintext (the PSK lives as long as the association).
        let keys = ctrl.keys();
        let (hostnqn, subnqn) = (&ctrl.opts.hostnqn, &ctrl.opts.subnqn);
        crate::auth::authenticate_concat(
            q,
            keys.as_ref(),
            hostnqn,
            subnqn,
            deadline,
            crate::auth::Occasion::Reauthentication,
            crate::auth::Concat::ReplaceTlsPsk,
        )
        .map(drop)
    } else if q.queue().was_authenticated() {
        let keys = ctrl.keys();
        let (hostnqn, subnqn) = (&ctrl.opts.hostnqn, &ctrl.opts.subnqn);
        crate::auth::authenticate(q, keys.as_ref(), hostnqn, subnqn, deadline, crate::auth::Occasion::Reauthentication)
    } else {
        // Linux re-authenticates only queues that authenticated at connect.
        Err(Error::new(
            ErrorKind::Invalid,
            "the controller did not ask for authentication at connect: nothing to renew",
        ))
    }
}

/// The block core's view of a controller ([`crate::context::ctrlview`]): the same calls as
/// the methods of the same names, each one load, except `path_class`,
/// `namespace_geometry` and `namespace_ids`, which lock the controller briefly and are called per poll turn
/// at most, when a change count moved.
impl crate::context::ctrlview::CoreController for Controller {
    type Head = crate::head::Head;

    #[inline]
    fn generation(&self) -> u64 {
        Controller::generation(self)
    }

    #[inline]
    fn change_count(&self) -> u64 {
        Controller::change_count(self)
    }

    #[inline]
    fn is_live(&self) -> bool {
        Controller::is_live(self)
    }

    fn should_fail_io(&self) -> bool {
        Controller::should_fail_io(self)
    }

    #[inline]
    fn failover_hold(&self) -> Duration {
        Controller::failover_hold(self)
    }

    fn ctrl_loss_tmo(&self) -> Option<Duration> {
        self.opts.ctrl_loss_tmo
    }

    fn report_io_failure(&self, why: &str) {
        Controller::report_io_failure(self, why);
    }

    fn request_ana_refresh(&self) {
        Controller::request_ana_refresh(self);
    }

    fn path_class(&self, nsid: Nsid) -> crate::mpath::PathClass {
        crate::head::class_of(self, nsid)
    }

    fn namespace_geometry(&self, nsid: Nsid) -> Option<(u8, u64)> {
        let g = self.lock();
        g.namespaces.iter().find(|n| n.nsid == nsid).map(|n| (n.block_shift, n.nsze))
    }

    fn namespace_ids(&self, nsid: Nsid) -> Option<crate::context::ctrlview::NsIds> {
        // The list is replaced only by a scan that succeeded (a failed rescan keeps it).
        let g = self.lock();
        g.namespaces.iter().find(|n| n.nsid == nsid).map(NsInfo::ids)
    }

    fn traddr(&self) -> SocketAddr {
        self.opts.traddr
    }

    fn cntlid(&self) -> u16 {
        Controller::cntlid(self).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_states_follow_linux_and_refuse_the_rest_with_both_states() {
        use CtrlState::*;
        let all = [New, Connecting, Live, Resetting, Deleting, Dead];
        let legal = [
            (New, Connecting),
            (Connecting, Live),
            (Connecting, Connecting),
            (Live, Resetting),
            (Resetting, Connecting),
            (New, Deleting),
            (Connecting, Deleting),
            (Live, Deleting),
            (Resetting, Deleting),
            (Connecting, Dead),
            (Deleting, Dead),
        ];
        for from in all {
            for to in all {
                let got = from.transition(to);
                if legal.contains(&(from, to)) {
                    assert_eq!(got, Ok(to), "{from:?} -> {to:?}");
                } else {
                    assert_eq!(got, Err(BadTransition { from, to }), "{from:?} -> {to:?}");
                }
            }
        }
        // A dead controller never comes back; a live one must reset before it reconnects.
        assert!(Dead.transition(Connecting).is_err());
        assert!(Live.transition(Connecting).is_err());
        let e = Live.transition(Live).unwrap_err();
        assert_eq!(e.to_string(), "state Live cannot change to Live");
    }

    #[test]
    fn parallel_connects_keep_queue_order_and_report_the_first_failure() {
        let threads = Mutex::new(std::collections::HashSet::new());
        let ok = run_parallel(20, true, &|i| {
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(2));
            Ok(i * 10)
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap();
        assert_eq!(ok, (0..20).map(|i| i * 10).collect::<Vec<_>>(), "results in queue order");
        let used = threads.lock().unwrap().len();
        assert!(used <= uring::online_cpus().clamp(1, PARALLEL_CONNECTS_MAX), "{used} threads");

        let started = std::sync::atomic::AtomicUsize::new(0);
        let e = run_parallel(50, true, &|i| {
            started.fetch_add(1, Ordering::Relaxed);
            if i == 3 || i == 7 {
                return Err(Error::new(ErrorKind::Protocol, format!("queue {i} refused")));
            }
            // A handshake takes a while: the failure is seen before the others finish.
            std::thread::sleep(Duration::from_millis(5));
            Ok(i)
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap_err();
        assert!(e.to_string().contains("queue 3 refused"), "the first failure in queue order: {e}");
        assert!(started.load(Ordering::Relaxed) < 50, "no new queue is started after a failure");

        // Without stop_on_error every index runs (a re-authentication tries every queue).
        let started = std::sync::atomic::AtomicUsize::new(0);
        let all = run_parallel(30, false, &|i| {
            started.fetch_add(1, Ordering::Relaxed);
            if i % 10 == 3 { Err(Error::new(ErrorKind::Protocol, format!("queue {i} refused"))) } else { Ok(i) }
        });
        assert_eq!(started.load(Ordering::Relaxed), 30);
        let failed: Vec<usize> = all.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
        assert_eq!(failed, [3, 13, 23]);
    }
}
