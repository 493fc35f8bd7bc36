//! The NVMe/TCP queue: one TCP connection, from ICReq to close, as a
//! sans-I/O state machine (Linux `target/tcp.c`, SPDK `lib/nvmf/tcp.c`).
//!
//! The connection never touches a socket. Its driver (the reactor, or the
//! in-process loopback used by tests and fuzzing) lends it received bytes,
//! takes batches of bytes to send, runs its file operations and calls its
//! timers. That keeps one implementation for the socket path, the loopback
//! path and the fuzzer:
//!
//! ```text
//!   driver                               Connection
//!   recv into take_recv_buf() ──bytes──► on_recv ─► PDU decode ─► command ─► backend
//!   send take_send()          ◄─SendMsg─ C2HData / R2T / CapsuleResp / TermReq
//!   FileIo completions        ──────────► on_file_done
//!   timers                    ──────────► on_timers / tick
//! ```
//!
//! Per command the connection does no allocation (request slots, buffers
//! and send batches are reused) and takes no lock; the shared state it reads
//! per command is a relaxed load of the subsystem's namespace generation, and for a
//! write the namespace's range-lock gauge and word ([`crate::range_lock`]).
//! Compare, Compare and Write, Copy and Verify run as short state machines in
//! [`nvm`] (`tcp/nvm.rs`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use nvme::opcode::fctype;
use nvme::state::BadTransition;
use nvme::tcp::{
    DataHeader, DecoderConfig, Digests, EncoderConfig, FatalError, Fes, Frame, Framer, Header, IcResp, PduInfo, R2t,
    Role, crc32c,
};
use nvme::{Cqe, Nsid, QueueId, SglKind, Sqe, Status};
use uring::{IoBuf, SendMsg};

use crate::admin::{self, Outcome};
use crate::auth::{self, QueueAuth};
use crate::backend::{Backend, FileIo, FileOp};
use crate::dealloc::{self, Batch, Method};
use crate::fabrics::{self, Binding};
use crate::io_cmd::{self, IoKind, ResvOp};
use crate::limits::HostTicket;
use crate::namespace::NsMap;
use crate::offload::Offload;
use crate::pool::BufPool;
use crate::port::Port;
use crate::range_lock::Hold;
use crate::registry::{QueueInfo, TargetState};
use crate::reservation::{self, AccessCache};

mod abort;
#[cfg(feature = "fault-injection")]
mod fault;
mod nvm;
mod secure;

/// What a connection needs from its driver while it handles input.
pub struct ConnCtx<'a> {
    /// The reactor's buffer pool.
    pub pool: &'a mut BufPool,
    /// Executes file-backend operations.
    pub file_io: &'a mut dyn FileIo,
    /// Base of this connection's file-operation tokens; the low 16 bits carry the request slot.
    pub token: u64,
    /// Now, in ns since the target epoch.
    pub now_ns: u64,
    /// Runs authentication's Diffie-Hellman steps off this thread; `None`: inline.
    pub offload: Option<&'a dyn Offload>,
}

/// Lifecycle of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Waiting for the host's ICReq.
    AwaitIcReq,
    /// ICResp sent; waiting for the Fabrics Connect.
    AwaitConnect,
    /// Bound to an admin or I/O queue.
    Live,
    /// No more input is read; queued output is flushed, then the connection closes.
    Closing,
    /// Done: the driver frees it once no operation is in flight.
    Closed,
}

impl ConnState {
    /// The one place connection lifecycle changes are decided (the convention of
    /// [`nvme::state`]). Closing and closing again are no-ops; nothing leaves Closed.
    #[must_use = "a refused transition must be handled"]
    pub fn transition(self, to: ConnState) -> Result<ConnState, BadTransition<ConnState>> {
        use ConnState::*;
        match (self, to) {
            (AwaitIcReq, AwaitConnect) | (AwaitConnect, Live) => Ok(to),
            (Closed, Closing | Closed) => Ok(Closed),
            (Closing | AwaitIcReq | AwaitConnect | Live, Closing | Closed) => Ok(to),
            (from, to) => Err(BadTransition::new(from, to)),
        }
    }
}

/// Lifecycle of a request slot: where its command stands, with the data only that place
/// has (what every state needs, the command, its buffers and status, stays on [`Req`]).
/// Changes go through [`ReqState::transition`], applied by [`Connection::req_to`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqState {
    /// No command: the slot is on the free list.
    Free,
    /// Receiving in-capsule data; `received` bytes are in.
    InCapsule { received: u32 },
    /// Waiting for a data buffer from the pool.
    AwaitBuffer,
    /// R2T sent (one per command: offset 0, all of its data), receiving H2CData; `received`
    /// bytes are in, and the next H2CData must start there (NVMe/TCP 1.0 §3.6.2.7).
    AwaitH2C { received: u32 },
    /// A file operation is in flight; it must move `op_len` bytes (0 for sync and fallocate),
    /// fewer is a failure.
    Executing { op_len: usize },
    /// Done; completion held until `due_ns` (an injected delay).
    #[cfg(feature = "fault-injection")]
    Delayed { due_ns: u64 },
    /// An Asynchronous Event Request waiting for an event.
    Aer,
    /// Injected fault: never completes.
    #[cfg(feature = "fault-injection")]
    Stalled,
    /// Data received; waiting for the other command of its fused operation (or its data).
    FusedWait,
    /// Waiting for a range lock or write gate ([`crate::range_lock`]); retried from the timers
    /// at `due_ns`, after `backoff_ns` (doubled on each retry up to `RANGE_RETRY_MAX_NS`).
    RangeWait { due_ns: u64, backoff_ns: u32 },
    /// Data received; waiting for a buffer to execute with (a read to compare, a Copy's
    /// gathered sources); retried by [`Connection::pump`].
    AwaitExecBuffer,
    /// Not executed yet: held until `due_ns`, the device time its namespace's provisioned rate
    /// gives it ([`crate::qos`]); an Abort can still take it back.
    QosWait { due_ns: u64 },
    /// An Abort command waiting for the answer of the queue it names (polled on the timers)
    /// until `until_ns`, when the command it names counts as not aborted.
    AbortWait { until_ns: u64 },
}

// A request's state data stays within two words: the slot (one per queue entry) does not
// grow with it (its wait times, counts and lengths replaced fields of the request).
const _: () = assert!(std::mem::size_of::<ReqState>() <= 16, "ReqState outgrew two words");

impl ReqState {
    /// The one place request lifecycle changes are decided (the convention of
    /// [`nvme::state`]). Only a new command leaves `Free`; every command can end (`Free`);
    /// data is asked for (R2T) only before the command runs; the admin queue's parked
    /// commands (AER, Abort) and the injected holds end only by completing; the rate is
    /// applied once, before anything runs. The data a state carries does not take part.
    #[must_use = "a refused transition must be handled"]
    #[inline]
    fn transition(self, to: ReqState) -> Result<ReqState, BadTransition<ReqState>> {
        if self.may_become(to) { Ok(to) } else { Err(BadTransition::new(self, to)) }
    }

    /// The states a command runs from: its data is in, or it waits for something on its way
    /// to the backend (and, while a file operation is in flight, Executing).
    #[inline]
    fn is_running(self) -> bool {
        use ReqState::*;
        matches!(
            self,
            InCapsule { .. }
                | AwaitH2C { .. }
                | AwaitBuffer
                | AwaitExecBuffer
                | QosWait { .. }
                | RangeWait { .. }
                | FusedWait
                | Executing { .. }
        )
    }

    #[inline]
    fn may_become(self, to: ReqState) -> bool {
        use ReqState::*;
        match to {
            Free => !matches!(self, Free),
            InCapsule { .. } => matches!(self, Free),
            AwaitH2C { .. } | Aer | AbortWait { .. } => matches!(self, InCapsule { .. } | AwaitBuffer),
            QosWait { .. } => matches!(self, InCapsule { .. } | AwaitH2C { .. }),
            FusedWait => matches!(self, InCapsule { .. } | AwaitH2C { .. } | AwaitExecBuffer | QosWait { .. }),
            AwaitBuffer => {
                matches!(self, InCapsule { .. } | AwaitBuffer | QosWait { .. } | RangeWait { .. } | Executing { .. })
            }
            AwaitExecBuffer => {
                matches!(self, InCapsule { .. } | AwaitH2C { .. } | AwaitExecBuffer | QosWait { .. } | FusedWait)
            }
            RangeWait { .. } => self.is_running() && !matches!(self, AwaitBuffer),
            Executing { .. } => self.is_running(),
            #[cfg(feature = "fault-injection")]
            Delayed { .. } => self.is_running(),
            #[cfg(feature = "fault-injection")]
            Stalled => {
                matches!(self, InCapsule { .. } | AwaitH2C { .. } | AwaitBuffer | AwaitExecBuffer | QosWait { .. })
            }
        }
    }

    /// Data bytes received so far, while the command receives them.
    fn received(self) -> Option<u32> {
        match self {
            ReqState::InCapsule { received } | ReqState::AwaitH2C { received } => Some(received),
            _ => None,
        }
    }
}

/// Where a multi-step command is ([`nvm`]); its file operations complete into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Not started, or a single-operation command.
    Idle,
    /// Compare: reading the blocks to compare into `aux`.
    CompareRead,
    /// Compare and Write, under the range lock: reading the blocks.
    CawRead,
    /// Compare and Write, under the range lock: writing (then syncing with FUA).
    CawWrite,
    /// Compare and Write, under the range lock: fdatasync after a FUA write.
    CawSync,
    /// Copy: reading source range `cursor` (into `aux`, or `aux2` then into `aux`).
    CopyRead,
    /// Copy: sources gathered in `aux`; taking the destination's write gate.
    CopyGate,
    /// Copy: writing the destination.
    CopyWrite,
    /// Preempt and Abort: the reservation is taken; waiting until the writes that passed
    /// their gate before it are done.
    PreemptDrain,
    /// Copy: fdatasync after a FUA write.
    CopySync,
    /// Verify with FUA: fdatasync before reading.
    VerifySync,
    /// Verify: reading the chunk at byte `cursor` of the range.
    VerifyRead,
}

/// A request's place in a fused operation (NVMe Base 2.0 §3.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fused {
    /// Not fused.
    None,
    /// The Compare (FUSE 01b), with its Write once that arrived.
    First(Option<u16>),
    /// The Write (FUSE 10b) of this Compare.
    Second(u16),
}

/// The first command of a fused operation waiting for the next command on the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FusedFirst {
    /// This Compare waits for its Write.
    Pending(u16),
    /// The first command failed: its Write fails with "Failed Fused Command".
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqKind {
    Connect,
    Fabrics,
    /// Authentication Send / Receive (DH-HMAC-CHAP).
    Auth,
    Admin,
    Io(IoKind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    Respond,
    /// A FUA write: fdatasync before responding.
    Sync,
}

struct Req {
    state: ReqState,
    kind: ReqKind,
    sqe: Sqe,
    buf: Option<IoBuf>,
    /// Data length from the SGL.
    xfer_len: u32,
    /// Data flows controller to host.
    c2h: bool,
    status: Status,
    dw0: u32,
    dw1: u32,
    start_ns: u64,
    after: After,
    /// The file operations of a Deallocate or Write Zeroes on a file backend.
    batch: Batch,
    /// A RAM read sent straight from the namespace's region at this byte offset
    /// (no buffer, no copy in user space).
    ram_src: Option<usize>,
    /// A buffer for execution: the blocks a Compare reads, a Copy's gathered sources, a
    /// Verify's chunk.
    aux: Option<IoBuf>,
    /// A Copy's second buffer: source ranges after the first are read here, then copied
    /// into `aux` at their place.
    aux2: Option<IoBuf>,
    /// Multi-step progress ([`nvm`]).
    step: Step,
    /// Copy: the source range being read; Verify: bytes verified.
    cursor: u64,
    /// Copy: bytes gathered so far.
    pos: u64,
    /// Its range-lock hold.
    hold: Hold,
    /// The namespace its hold and its multi-step file operations are in, by address (the
    /// request keeps no reference, the connection's namespace maps do): a step finds it
    /// again, or sees it removed or replaced.
    ns_addr: usize,
    /// Its fused operation, if any.
    fused: Fused,
    /// Its namespace's provisioned rate has been applied (it is not held again).
    qos_admitted: bool,
}

impl Req {
    fn new() -> Req {
        Req {
            state: ReqState::Free,
            kind: ReqKind::Fabrics,
            sqe: Sqe::default(),
            buf: None,
            xfer_len: 0,
            c2h: false,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            start_ns: 0,
            after: After::Respond,
            batch: Batch::default(),
            ram_src: None,
            aux: None,
            aux2: None,
            step: Step::Idle,
            cursor: 0,
            pos: 0,
            hold: Hold::None,
            ns_addr: 0,
            fused: Fused::None,
            qos_admitted: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    /// In-capsule data of a request.
    InCapsule(u16),
    /// H2CData for a request at a byte offset.
    H2C(u16, u32),
    /// Data nobody wants (a command that already failed).
    Discard,
    /// A TermReq's error data.
    Term,
}

/// Bytes a file operation must move (0 for sync and fallocate): fewer is a failure.
fn op_len(op: &FileOp<'_>) -> usize {
    match op {
        FileOp::Read { len, .. } | FileOp::Write { len, .. } => *len,
        FileOp::Sync { .. } | FileOp::Fallocate { .. } => 0,
    }
}

/// Most bytes of one write of zeros (Write Zeroes where the file system has no ZERO_RANGE);
/// also bounded by the largest transfer, so the buffer comes from the pool.
const ZERO_CHUNK_BYTES_MAX: usize = 128 * 1024;

/// Most segments in one send batch: a full batch is queued and a new one started, so a
/// batch never exceeds what one `sendmsg` takes (`UIO_MAXIOV`), whatever the queue depth.
const TX_BATCH_SEGMENTS: usize = uring::SEND_SEGMENTS_MAX - 8;
/// Output queued beyond a full batch or this many copied bytes stops the parsing of
/// input until a send completes: a peer that does not read its responses is not read
/// either (TCP pushes back on it), instead of growing the send queue without bound.
const TX_PAUSE_BYTES: usize = 64 * 1024;

/// A queue whose input passes parse at most this many PDUs counts as latency-sensitive
/// (see [`Connection::is_deep`]): a QD1 host sends one command per receive.
const SHALLOW_PDUS_MAX: u32 = 2;
/// Bytes of a response beyond its data: C2HData and CapsuleResp headers with digests and
/// the largest data alignment padding (an estimate for `tx_batch_bytes`, never a bound).
const RESPONSE_BYTES_MAX: usize = 24 + 4 + 4 + 128 + 24 + 4;

/// Slots beyond SQSIZE: outstanding AERs on the admin queue.
const EXTRA_SLOTS: usize = crate::controller::MAX_AERS;
/// Slots before Connect (the Connect itself).
const INITIAL_SLOTS: usize = 1;

/// One NVMe/TCP queue.
pub struct Connection {
    state: ConnState,
    target: Arc<TargetState>,
    port: Arc<Port>,
    peer: Option<SocketAddr>,
    info: Arc<QueueInfo>,
    framer: Framer,
    enc: EncoderConfig,
    rx: Option<IoBuf>,
    rx_pos: usize,
    /// Where the data of the PDU being received goes.
    rx_sink: Sink,
    tx: SendMsg,
    /// Full batches waiting for their turn, oldest first.
    tx_full: VecDeque<SendMsg>,
    tx_spares: Vec<SendMsg>,
    tx_inflight: bool,
    /// Input parsing stopped because too much output is queued (resumed when a send completes).
    rx_paused: bool,
    /// A PDU is partly received.
    mid_pdu: bool,
    /// Received bytes wait for [`Connection::process_input`] (the PDU budget stopped the
    /// last pass, or the driver has not given this connection its turn yet).
    rx_pending: bool,
    /// When the input waiting in `rx` was received (the reactor's clock when it reaped
    /// the receive): a command's service time starts there, so it includes the turns
    /// it waited for its queue's turn, not only its execution.
    rx_ns: u64,
    /// PDUs the last input pass parsed: how deep the host drives this queue.
    rx_pass_pdus: u32,
    /// Whether other connections of the driver want its time: the PDU budget and the send
    /// batch size bite only then (work-conserving fairness). A driver that does not say
    /// leaves it on, the conservative choice.
    contended: bool,
    scratch: Vec<u8>,
    binding: Option<Binding>,
    /// The queue's place under the per-host-NQN limit.
    host_ticket: Option<HostTicket>,
    /// Data buffer bytes this connection holds (from the pool), and its cap.
    buf_bytes: usize,
    buf_cap: usize,
    /// PDU headers received; with `stall_*`, what the PDU timeout watches.
    pdus: u64,
    stall_pdus: u64,
    stall_since_ns: u64,
    /// R2Ts sent and R2T transfers completed; with `r2t_*`, what the PDU timeout watches.
    r2t_sent: u64,
    h2c_done: u64,
    r2t_mark: u64,
    r2t_since_ns: u64,
    /// In-band authentication the host owes this queue (until it succeeds only
    /// Authentication Send/Receive are accepted).
    auth: Option<QueueAuth>,
    /// The Authentication Send waiting for its Diffie-Hellman step (see [`crate::offload`]).
    auth_computing: Option<u16>,
    /// Abandoned when the connection closes, so the workers skip a step still queued.
    auth_waiter: Option<crate::offload::Waiter>,
    sqflow_disabled: bool,
    entries: u16,
    sqhd: u16,
    /// The reactor serving this connection: its range-lock gauge ([`crate::range_lock`]).
    shard: usize,
    /// A fused operation's first command waiting for the next command on the queue.
    fused_first: Option<FusedFirst>,
    ns: Arc<NsMap>,
    ns_gen: u64,
    /// This queue's last reservation verdict ([`reservation::Reservations::check`]).
    resv_cache: AccessCache,
    retired_ns: Vec<Arc<NsMap>>,
    reqs: Vec<Req>,
    free: Vec<u16>,
    waiting: VecDeque<u16>,
    aers: Vec<u16>,
    timers: BinaryHeap<Reverse<(u64, u16)>>,
    file_ops: u32,
    created_ns: u64,
    drop_generation: u64,
    /// Last time input arrived (ms), and the value last reported to the controller.
    traffic_ms: u64,
    traffic_reported_ms: u64,
    /// Latency histograms and counters since the last publish (owner thread only), with
    /// the latency sum of the successful I/Os by direction, for the summaries' `_sum`.
    local_stats: blk::QueueStats,
    latency_ns_sum: [u64; 4],
    /// Per-namespace deltas since the last publish, added to the namespaces' totals then.
    ns_local: Vec<crate::stats::NsCounters>,
    /// The port's monotonic totals, added to on each publish.
    port_totals: Arc<crate::stats::PortTotals>,
    stats_dirty: bool,
    close_reason: Option<String>,
    /// Abort commands of this admin queue waiting for their I/O queue's answer: (slot, the
    /// answer); how long each waits is its state's ([`ReqState::AbortWait`]).
    aborts: Vec<(u16, Arc<crate::controller::AbortAnswer>)>,
    /// The secure channel the queue runs in, on a TLS port ([`crate::tls`], `tcp/secure.rs`).
    tls: Option<crate::tls::Link>,
    /// The channel's records go to the kernel once it can take them (the port's
    /// `tls_offload` is "auto" and no handover was tried yet).
    kernel_tls_wanted: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("state", &self.state)
            .field("port", &self.port.id)
            .field("peer", &self.peer)
            .field("qid", &self.binding.as_ref().map(Binding::qid))
            .finish()
    }
}

impl Connection {
    /// A connection accepted on `port` from `peer`, served by reactor `reactor`.
    pub fn new(target: Arc<TargetState>, port: Arc<Port>, peer: Option<SocketAddr>, reactor: usize) -> Connection {
        let info = target.register_queue(port.id, peer, reactor);
        let port_totals = target.port_totals(port.id);
        let rx = IoBuf::new(target.opts.rx_buffer_size.max(8192).next_multiple_of(4096));
        let now = target.now_ns();
        let drop_generation = port.faults.drop_generation.load(std::sync::atomic::Ordering::Relaxed);
        let buf_cap = target.limits.max_buffer_bytes_per_connection();
        let tls = crate::tls::link_for(port.tls.get());
        let kernel_tls_wanted = tls.is_some() && port.tls.offload() == crate::tls::TlsOffload::Auto;
        let mut c = Connection {
            state: ConnState::AwaitIcReq,
            target,
            port,
            peer,
            info,
            framer: Framer::new(DecoderConfig::initial(Role::Controller)),
            enc: EncoderConfig { digests: Digests::default(), data_align: 4 },
            rx: Some(rx),
            rx_pos: 0,
            rx_sink: Sink::Discard,
            tx: SendMsg::with_capacity(4096, 64),
            tx_full: VecDeque::new(),
            tx_spares: vec![SendMsg::with_capacity(4096, 64)],
            tx_inflight: false,
            rx_paused: false,
            mid_pdu: false,
            rx_pending: false,
            rx_ns: 0,
            rx_pass_pdus: 0,
            contended: true,
            scratch: Vec::with_capacity(256),
            binding: None,
            host_ticket: None,
            buf_bytes: 0,
            buf_cap,
            pdus: 0,
            stall_pdus: 0,
            stall_since_ns: now,
            r2t_sent: 0,
            h2c_done: 0,
            r2t_mark: 0,
            r2t_since_ns: now,
            auth: None,
            auth_computing: None,
            auth_waiter: None,
            sqflow_disabled: false,
            entries: 0,
            sqhd: 0,
            shard: reactor,
            fused_first: None,
            ns: Arc::new(NsMap::default()),
            ns_gen: 0,
            resv_cache: AccessCache::default(),
            retired_ns: Vec::new(),
            reqs: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            aers: Vec::new(),
            timers: BinaryHeap::new(),
            file_ops: 0,
            created_ns: now,
            drop_generation,
            traffic_ms: 0,
            traffic_reported_ms: 0,
            local_stats: blk::QueueStats::new(),
            latency_ns_sum: [0; 4],
            ns_local: Vec::new(),
            port_totals,
            stats_dirty: false,
            close_reason: None,
            aborts: Vec::new(),
            tls,
            kernel_tls_wanted,
        };
        c.resize_slots(INITIAL_SLOTS);
        c
    }

    fn resize_slots(&mut self, n: usize) {
        while self.reqs.len() < n {
            self.free.push(u16::try_from(self.reqs.len()).unwrap_or(u16::MAX));
            self.reqs.push(Req::new());
        }
        // Allocate low slots first (keeps the working set small).
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Lifecycle state.
    pub fn state(&self) -> ConnState {
        self.state
    }

    /// Why the connection is closing, if it is.
    pub fn close_reason(&self) -> Option<&str> {
        self.close_reason.as_deref()
    }

    /// The queue id once connected.
    pub fn qid(&self) -> Option<QueueId> {
        self.binding.as_ref().map(Binding::qid)
    }

    /// Counters and identity, as RPC shows them.
    pub fn info(&self) -> &Arc<QueueInfo> {
        &self.info
    }

    /// File operations in flight (the driver must not free the connection before they finish).
    pub fn file_ops_in_flight(&self) -> u32 {
        self.file_ops
    }

    /// Moves the connection to `to`. A change its state machine refuses is logged at
    /// error level (in release builds too) and closes the connection: the code that asked
    /// for it and the protocol no longer agree on where the connection stands.
    fn set_state(&mut self, to: ConnState) {
        match self.state.transition(to) {
            Ok(s) => self.state = s,
            Err(e) => {
                tracing::error!(port = self.port.id, peer = ?self.peer, "connection state change refused: {e}; closing");
                self.close_reason.get_or_insert_with(|| format!("internal error: {e}"));
                if let Ok(s) = self.state.transition(ConnState::Closing) {
                    self.state = s;
                }
            }
        }
    }

    /// Moves request `slot` to `to`: the one place request lifecycle changes are applied
    /// ([`ReqState::transition`] decides them). True when it moved. A refused change is
    /// logged at error level, in release builds too, and ends the command with Internal
    /// Error (or closes the connection, when the slot held no command: the queue's
    /// bookkeeping is lost); false then, and the caller leaves the slot alone.
    #[must_use = "false: the command was answered, the caller must not go on with it"]
    #[inline(always)]
    fn req_to(&mut self, slot: u16, to: ReqState, ctx: &mut ConnCtx<'_>) -> bool {
        let r = &mut self.reqs[usize::from(slot)];
        match r.state.transition(to) {
            Ok(s) => {
                r.state = s;
                true
            }
            Err(e) => {
                self.req_refused(slot, e, ctx);
                false
            }
        }
    }

    /// A request's refused change ([`Connection::req_to`]): never kept silently.
    #[cold]
    fn req_refused(&mut self, slot: u16, e: BadTransition<ReqState>, ctx: &mut ConnCtx<'_>) {
        let cid = self.reqs[usize::from(slot)].sqe.cid().0;
        tracing::error!(port = self.port.id, peer = ?self.peer, qid = ?self.qid(), slot, cid, "request state change refused: {e}");
        if e.from == ReqState::Free || matches!(e.to, ReqState::InCapsule { .. }) {
            // No command in the slot, or a new command given a slot that holds one (the free
            // list is wrong): the queue's bookkeeping is lost; nothing is answered from it.
            self.close(&format!("internal error: {e}"));
            return;
        }
        // Whatever it waited in lets go of it; a timer still due for it finds it moved on.
        self.waiting.retain(|&s| s != slot);
        self.aborts.retain(|(s, _)| *s != slot);
        self.reqs[usize::from(slot)].status = Status::INTERNAL;
        if matches!(self.state, ConnState::Closing | ConnState::Closed) {
            self.release_slot(slot, ctx);
        } else {
            self.respond(slot, ctx);
        }
    }

    /// Stops reading and closes once queued output is sent.
    pub fn close(&mut self, why: &str) {
        if matches!(self.state, ConnState::Closing | ConnState::Closed) {
            return;
        }
        tracing::debug!(port = self.port.id, peer = ?self.peer, qid = ?self.qid(), "closing: {why}");
        if let Some(w) = &self.auth_waiter {
            w.abandon();
        }
        self.close_reason = Some(why.to_string());
        self.set_state(ConnState::Closing);
        if !self.tx_pending() && !self.tx_inflight && !self.tls_send_in_flight() {
            self.set_state(ConnState::Closed);
        }
    }

    /// Data buffer bytes the connection holds now (bounded by `max_buffer_bytes_per_connection`,
    /// plus in-capsule data).
    pub fn buffer_bytes(&self) -> usize {
        self.buf_bytes
    }

    /// Bytes queued to send and not yet handed to the driver.
    pub fn queued_send_bytes(&self) -> usize {
        self.tx.len() + self.tx_full.iter().map(SendMsg::len).sum::<usize>()
    }

    /// Whether input parsing is paused until queued output is sent.
    pub fn input_paused(&self) -> bool {
        self.rx_paused && matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live)
    }

    // ---------------------------------------------------------------- buffers

    /// A data buffer within this connection's cap (the first one is always granted, so a
    /// cap below one transfer still makes progress), or `None`: the caller waits.
    fn buf_get(&mut self, ctx: &mut ConnCtx<'_>, len: usize) -> Option<IoBuf> {
        if self.buf_bytes > 0 && self.buf_bytes + len > self.buf_cap {
            return None;
        }
        let b = ctx.pool.get(len)?;
        self.buf_bytes += b.capacity();
        Some(b)
    }

    /// A buffer for in-capsule data, which is already on the wire and cannot wait: outside
    /// both caps (bounded by queue entries x in-capsule size).
    fn buf_get_in_capsule(&mut self, ctx: &mut ConnCtx<'_>, len: usize) -> IoBuf {
        let b = ctx.pool.get_unbounded(len);
        self.buf_bytes += b.capacity();
        b
    }

    /// Gives a data buffer back to the pool.
    fn buf_put(&mut self, ctx: &mut ConnCtx<'_>, b: IoBuf) {
        self.buf_bytes = self.buf_bytes.saturating_sub(b.capacity());
        ctx.pool.put(b);
    }

    // ------------------------------------------------------------ send queue

    fn tx_pending(&self) -> bool {
        !self.tx.is_empty() || !self.tx_full.is_empty() || self.tls_has_output()
    }

    /// Makes room for `segments` more segments in the current batch, queueing it when full.
    fn tx_room(&mut self, segments: usize) {
        if self.tx.segments() + segments > TX_BATCH_SEGMENTS {
            let fresh = self.tx_spares.pop().unwrap_or_default();
            let full = std::mem::replace(&mut self.tx, fresh);
            self.tx_full.push_back(full);
        }
    }

    /// Appends PDU bytes to the send queue.
    fn tx_bytes(&mut self, bytes: &[u8]) {
        self.tx_room(1);
        self.tx.push_bytes(bytes);
    }

    /// Fairness: queues the batch being filled if `more` bytes would take it past
    /// `TargetOptions::tx_batch_bytes`, so one send never carries a whole flood (a batch
    /// holds at least one response, however large). Only while other connections want the
    /// driver ([`Connection::set_contended`]): a lone stream sends in the largest batches.
    fn tx_seal_batch(&mut self, more: usize) {
        let cap = self.target.limits.tx_batch_bytes();
        if cap == 0 || !self.contended || self.tx.is_empty() || self.tx.len() + more <= cap {
            return;
        }
        let fresh = self.tx_spares.pop().unwrap_or_default();
        let full = std::mem::replace(&mut self.tx, fresh);
        self.tx_full.push_back(full);
    }

    fn tx_over(&self) -> bool {
        !self.tx_full.is_empty() || self.tx.header().len() >= TX_PAUSE_BYTES
    }

    // ---------------------------------------------------------------- receive

    /// The buffer to receive into and the range to fill, if the connection
    /// wants input. The driver gives it back with [`Connection::on_recv`].
    pub fn take_recv_buf(&mut self) -> Option<(IoBuf, std::ops::Range<usize>)> {
        if let Some(crate::tls::Link::Tls(ch)) = self.tls.as_mut() {
            if self.rx_pending
                || self.rx_paused
                || !matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live)
            {
                return None;
            }
            return ch.take_recv_buf();
        }
        if self.rx_pending {
            // What was received is parsed first (no receive buffer to lend meanwhile).
            return None;
        }
        if self.rx_paused || !matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live) {
            return None;
        }
        let mut buf = self.rx.take()?;
        // Compact: move the unparsed tail to the front when space runs low.
        let cap = buf.capacity();
        buf.compact(&mut self.rx_pos, cap / 4);
        let start = buf.len();
        if start == cap {
            // Cannot happen: a header is at most 255 bytes and data is streamed out.
            self.rx = Some(buf);
            self.fail(FatalError::field(4), &[]);
            return None;
        }
        Some((buf, start..cap))
    }

    /// `n` bytes were received at the end of `buf` (0 = the peer closed):
    /// [`Connection::queue_input`] then [`Connection::process_input`].
    pub fn on_recv(&mut self, buf: IoBuf, n: usize, ctx: &mut ConnCtx<'_>) {
        self.queue_input(buf, n, ctx.now_ns);
        self.process_input(ctx);
    }

    /// `n` bytes were received at the end of `buf` (0 = the peer closed). They are parsed
    /// by [`Connection::process_input`] when the driver gives this connection its turn;
    /// no receive is wanted until then.
    pub fn queue_input(&mut self, mut buf: IoBuf, n: usize, now_ns: u64) {
        if matches!(self.tls, Some(crate::tls::Link::Tls(_))) {
            return self.tls_input(buf, n, now_ns);
        }
        if n == 0 {
            self.rx = Some(buf);
            self.close("peer closed the connection");
            return;
        }
        let len = buf.len() + n;
        buf.set_len(len.min(buf.capacity()));
        self.traffic_ms = now_ns / 1_000_000;
        // Input the PDU budget left waiting keeps its older time; a partial PDU's rest
        // completes the command now.
        if !self.rx_pending {
            self.rx_ns = now_ns;
        }
        self.rx = Some(buf);
        self.rx_pending = true;
        if matches!(self.tls, Some(crate::tls::Link::Sniff | crate::tls::Link::Require)) {
            self.tls_sniff(now_ns);
        }
    }

    /// Whether received bytes wait for [`Connection::process_input`].
    pub fn has_input(&self) -> bool {
        self.rx_pending && matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live)
    }

    /// The driver says whether other connections want its time now. While they do, the PDU
    /// budget (`rx_budget_pdus`) and the send batch size (`tx_batch_bytes`) apply; while
    /// none does, the connection parses all its input and sends it in the largest batches,
    /// since no one waits for the turn it would give back (Linux nvmet-tcp's budgets
    /// always apply; a lone deep queue paid for fairness it did not need).
    pub fn set_contended(&mut self, contended: bool) {
        self.contended = contended;
    }

    /// Whether the host keeps this queue busy: its last pass parsed more than
    /// [`SHALLOW_PDUS_MAX`] PDUs or hit the budget, or output waits beyond the batch being
    /// filled. A driver serves the other queues first (a QD1 command does not wait behind
    /// a flood's PDUs or its send).
    pub fn is_deep(&self) -> bool {
        self.rx_pass_pdus > SHALLOW_PDUS_MAX || !self.tx_full.is_empty()
    }

    /// Parses buffered input: at most `TargetOptions::rx_budget_pdus` PDUs while other
    /// connections want the driver, so one busy queue cannot hold its reactor; what is left
    /// stays pending ([`Connection::has_input`]). Alone, it parses all it has.
    pub fn process_input(&mut self, ctx: &mut ConnCtx<'_>) {
        if !self.rx_pending {
            return;
        }
        self.rx_pending = false;
        let Some(mut buf) = self.rx.take() else { return };
        self.process(&mut buf, ctx);
        self.note_rx(&buf);
        self.rx = Some(buf);
        // Records already received are opened into the buffer as the queue makes room.
        self.tls_fill();
    }

    /// Remembers whether a PDU is partly received (for the PDU timeout, checked on the tick).
    fn note_rx(&mut self, buf: &IoBuf) {
        // Paused input is our choice, not the peer's slowness.
        self.mid_pdu = !self.rx_paused && (self.rx_pos < buf.len() || !self.framer.at_header());
    }

    /// Feeds bytes that are not in the connection's own buffer (loopback, fuzzing).
    /// Returns how many it took: fewer than given when it stopped reading (closing, or
    /// paused until the driver sends what is queued, see [`Connection::input_paused`]).
    pub fn feed(&mut self, data: &[u8], ctx: &mut ConnCtx<'_>) -> usize {
        let mut taken = 0;
        while taken < data.len() {
            // Input the PDU budget left is parsed first (each pass parses at least one PDU).
            while self.has_input() {
                self.process_input(ctx);
            }
            let Some((mut buf, range)) = self.take_recv_buf() else { break };
            let n = (data.len() - taken).min(range.len());
            buf.as_full_mut()[range.start..range.start + n].copy_from_slice(&data[taken..taken + n]);
            self.on_recv(buf, n, ctx);
            taken += n;
        }
        // No driver gives this connection turns: what the budget left is parsed now.
        while self.has_input() {
            self.process_input(ctx);
        }
        taken
    }

    fn process(&mut self, buf: &mut IoBuf, ctx: &mut ConnCtx<'_>) {
        let budget = self.target.limits.rx_budget_pdus();
        self.rx_pass_pdus = 0;
        while matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live) {
            let avail = &buf[self.rx_pos..];
            if self.framer.at_header() && self.rx_stops_here(budget, avail) {
                return;
            }
            let (n, frame) = match self.framer.next(avail) {
                Ok(step) => step,
                Err(e) => {
                    let n = avail.len().min(nvme::tcp::pdu::TERM_MAX_DATA);
                    let offending = avail[..n].to_vec();
                    self.fail(e, &offending);
                    return;
                }
            };
            self.rx_pos += n;
            match frame {
                Frame::NeedMore(_) => return,
                Frame::Header(info) => {
                    self.pdus += 1;
                    self.rx_pass_pdus += 1;
                    if self.contended {
                        self.info.stats.rx_pass_pdus_max.max(u64::from(self.rx_pass_pdus));
                    }
                    self.on_header(info, ctx);
                }
                Frame::Data(chunk) => self.sink_data(self.rx_sink, chunk),
                Frame::DataEnd { digest_ok } => {
                    let sink = std::mem::replace(&mut self.rx_sink, Sink::Discard);
                    self.data_done(sink, digest_ok, ctx);
                }
            }
        }
    }

    /// Whether parsing stops before the next PDU: the peer is not taking its responses
    /// (until a send completes), or this pass used its budget while other connections
    /// wait (the rest waits for this connection's next turn).
    fn rx_stops_here(&mut self, budget: u32, avail: &[u8]) -> bool {
        if self.tx_over() {
            self.rx_paused = true;
            return true;
        }
        if budget > 0 && self.contended && self.rx_pass_pdus >= budget {
            self.rx_pending = !avail.is_empty();
            self.info.stats.rx_budget_stops.add(1);
            return true;
        }
        false
    }

    fn sink_data(&mut self, sink: Sink, chunk: &[u8]) {
        let slot = match sink {
            Sink::InCapsule(s) | Sink::H2C(s, _) => s,
            Sink::Discard | Sink::Term => return,
        };
        let r = &mut self.reqs[usize::from(slot)];
        // Only a request receiving data has a count (the sink was chosen by its state).
        let (ReqState::InCapsule { received } | ReqState::AwaitH2C { received }) = &mut r.state else { return };
        if let Some(b) = r.buf.as_mut() {
            let off = *received as usize;
            let end = (off + chunk.len()).min(b.len());
            if off < end {
                b[off..end].copy_from_slice(&chunk[..end - off]);
            }
        }
        *received = received.saturating_add(u32::try_from(chunk.len()).unwrap_or(u32::MAX));
    }

    fn on_header(&mut self, info: PduInfo, ctx: &mut ConnCtx<'_>) {
        let data_len = info.layout.data_len;
        let sink = match info.header {
            Header::IcReq(r) => {
                // HPDA: C2H data alignment the host asks for; MAXR2T: we issue one R2T per command.
                let _ = r.maxr2t;
                self.enc = EncoderConfig { digests: r.digests, data_align: (usize::from(r.hpda) + 1) * 4 };
                let maxh2cdata = self.target.opts.maxh2cdata;
                let resp = IcResp { pfv: 0, cpda: 0, digests: r.digests, maxh2cdata };
                self.tx_bytes(&resp.encode());
                self.framer.decoder.config = DecoderConfig {
                    receiver: Role::Controller,
                    digests: r.digests,
                    established: true,
                    data_align: 4,
                    // The admin queue takes Connect data (1 KiB) and 8 KiB like Linux
                    // (NVME_TCP_ADMIN_CCSZ); I/O queues get IOCCSZ after Connect.
                    max_in_capsule: 8192,
                    max_data_pdu: maxh2cdata as usize,
                };
                self.set_state(ConnState::AwaitConnect);
                None
            }
            Header::H2CTermReq(t) => {
                tracing::info!(port = self.port.id, peer = ?self.peer, fes = t.fes, fei = t.fei, "host terminated the connection");
                self.close("H2CTermReq from host");
                Some(Sink::Term)
            }
            Header::CapsuleCmd(sqe) => Some(self.on_command(sqe, data_len, ctx)),
            Header::H2CData(d) => match self.on_h2c_header(&d) {
                Ok(sink) => Some(sink),
                Err(e) => {
                    self.fail(e, &[]);
                    return;
                }
            },
            // The decoder only lets host PDUs through.
            Header::IcResp(_)
            | Header::C2HTermReq(_)
            | Header::CapsuleResp(_)
            | Header::C2HData(_)
            | Header::R2T(_) => {
                self.fail(FatalError::field(0), &[]);
                return;
            }
        };
        match sink {
            // The framer hands over the data next and ends it with DataEnd.
            Some(sink) if data_len > 0 => self.rx_sink = sink,
            Some(sink) => self.data_done(sink, true, ctx),
            None => {}
        }
    }

    /// A command capsule arrived with `data_len` bytes of in-capsule data to follow.
    fn on_command(&mut self, sqe: Sqe, data_len: usize, ctx: &mut ConnCtx<'_>) -> Sink {
        let Some(slot) = self.free.pop() else {
            // More commands outstanding than SQSIZE allows (NVMe-oF 1.1 §3.3.2.1):
            // the host broke flow control; there is nothing to track the command in.
            self.fail(FatalError::sequence(), &sqe.0);
            return Sink::Discard;
        };
        if !self.req_to(slot, ReqState::InCapsule { received: 0 }, ctx) {
            // The free list gave out a slot that holds a command: the connection closes.
            return Sink::Discard;
        }
        self.info.stats.commands.add(1);
        self.info.stats.outstanding.add(1);
        if self.state == ConnState::Live {
            self.sqhd = (self.sqhd + 1) % self.entries.max(1);
        }
        let r = &mut self.reqs[usize::from(slot)];
        r.sqe = sqe;
        r.status = Status::SUCCESS;
        r.dw0 = 0;
        r.dw1 = 0;
        r.after = After::Respond;
        r.batch = Batch::default();
        r.start_ns = self.rx_ns.min(ctx.now_ns);
        r.c2h = false;
        r.xfer_len = 0;
        r.step = Step::Idle;
        r.cursor = 0;
        r.pos = 0;
        r.fused = Fused::None;
        let verdict = self.classify(slot).and_then(|(kind, h2c, c2h)| {
            self.reqs[usize::from(slot)].kind = kind;
            self.check_sgl(slot, data_len, h2c, c2h).map(|()| (kind, h2c, c2h))
        });
        // Fused operations: only when this command or the last one has FUSE bits.
        let fused = self.fused_first.is_some() || sqe.fuse() != 0;
        let verdict = match &self.binding {
            Some(Binding::Io(..)) if fused => self.pair_fused(slot, verdict, ctx),
            _ => verdict,
        };
        match verdict {
            Ok((kind, h2c, c2h)) => {
                let r = &mut self.reqs[usize::from(slot)];
                r.kind = kind;
                r.c2h = c2h > 0;
                r.xfer_len = h2c.max(c2h);
                if data_len > 0 {
                    // In-capsule data: into a buffer of its own.
                    let b = self.buf_get_in_capsule(ctx, data_len);
                    self.reqs[usize::from(slot)].buf = Some(b);
                }
                Sink::InCapsule(slot)
            }
            Err(s) => {
                // An I/O command on a queue whose controller has failed (keep-alive timeout,
                // fatal error) before this queue's tick closed it: answer nothing and close
                // now, as nvmet tears a failed controller's queues down. The command never
                // ran; the host fails it over. "Command sequence error, do not retry" would
                // end it as an I/O error.
                if let Some(b @ Binding::Io(..)) = &self.binding
                    && !b.controller().is_ready()
                {
                    self.close("I/O command for a failed controller");
                    return Sink::Discard;
                }
                self.fail_cmd(slot, s)
            }
        }
    }

    /// Decides what the command is and how much data it moves each way.
    fn classify(&mut self, slot: u16) -> Result<(ReqKind, u32, u32), Status> {
        let sqe = self.reqs[usize::from(slot)].sqe;
        let sgl_len = sqe.sgl().length;
        if let Some(a) = &self.auth {
            // NVMe 2.x §8.13.1: until the queue authenticates, only the transaction's commands pass.
            let auth_cmd = sqe.is_fabrics() && matches!(sqe.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECEIVE);
            if auth_cmd {
                return auth::transfer(&sqe).map(|(h2c, c2h)| (ReqKind::Auth, h2c, c2h));
            }
            if !a.is_authenticated() {
                return Err(Status::AUTH_REQUIRED);
            }
        }
        if sqe.is_fabrics() {
            return match (sqe.fctype(), &self.binding) {
                (fctype::CONNECT, None) => Ok((ReqKind::Connect, 1024, 0)),
                (fctype::CONNECT, Some(_)) => Err(Status::COMMAND_SEQUENCE_ERROR),
                (fctype::PROPERTY_GET | fctype::PROPERTY_SET, Some(Binding::Admin(_))) => Ok((ReqKind::Fabrics, 0, 0)),
                _ => Err(Status::INVALID_OPCODE),
            };
        }
        let Some(binding) = &self.binding else {
            // Before Connect only Connect is accepted (nvmet: invalid opcode).
            return Err(Status::INVALID_OPCODE);
        };
        let ctrl = Arc::clone(binding.controller());
        if !ctrl.is_ready() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        match binding {
            Binding::Admin(_) => {
                let c2h = admin::c2h_len(&sqe).unwrap_or(0);
                let c2h = u32::try_from(c2h).map_err(|_| Status::INVALID_FIELD)?;
                if c2h > 0 && sgl_len != c2h {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                if c2h == 0 && sgl_len != 0 {
                    // Admin commands with host data (Host ID etc.) are not supported over fabrics.
                    return Err(Status::INVALID_FIELD);
                }
                Ok((ReqKind::Admin, 0, c2h))
            }
            Binding::Io(..) => {
                self.refresh_ns();
                let ns = self.ns.get(sqe.nsid());
                let kind = io_cmd::plan(
                    &sqe,
                    ns.map(|n| &**n),
                    &self.port,
                    u32::try_from(self.target.opts.max_transfer()).unwrap_or(u32::MAX),
                )?;
                if let Some(ns) = ns {
                    let group = reservation::group(sqe.opcode());
                    ns.resv.check(sqe.nsid().0, &ctrl.hostid, group, &mut self.resv_cache)?;
                }
                Ok((ReqKind::Io(kind), kind.h2c_len(), kind.c2h_len()))
            }
        }
    }

    fn check_sgl(&self, slot: u16, data_len: usize, h2c: u32, c2h: u32) -> Result<(), Status> {
        let sgl = self.reqs[usize::from(slot)].sqe.sgl();
        let want = h2c.max(c2h);
        match sgl.kind() {
            SglKind::Unsupported => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            SglKind::InCapsule { offset } => {
                if offset != 0 {
                    return Err(Status::SGL_OFFSET_INVALID);
                }
                // In-capsule data only carries host-to-controller data, all of it.
                if c2h > 0 || sgl.length as usize != data_len || sgl.length != want {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
            }
            SglKind::Transport => {
                if data_len > 0 {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                if sgl.length != want {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
            }
        }
        Ok(())
    }

    /// Fails a command that has not started: its in-capsule data (if any) is skipped.
    fn fail_cmd(&mut self, slot: u16, status: Status) -> Sink {
        let r = &mut self.reqs[usize::from(slot)];
        r.status = status;
        r.c2h = false;
        r.xfer_len = 0;
        r.kind = ReqKind::Fabrics;
        // Answered once its in-capsule data (if any) is consumed, keeping the stream in sync.
        Sink::InCapsule(slot)
    }

    fn on_h2c_header(&mut self, d: &DataHeader) -> Result<Sink, FatalError> {
        let slot = d.ttag;
        let Some(r) = self.reqs.get(usize::from(slot)) else {
            return Err(FatalError::field(10));
        };
        let ReqState::AwaitH2C { received } = r.state else { return Err(FatalError::field(10)) };
        if r.sqe.cid() != d.cccid {
            return Err(FatalError::field(10));
        }
        // Data must arrive in order and inside the R2T's range (§3.6.2.7).
        if d.datao != received || d.datao.checked_add(d.datal).is_none_or(|end| end > r.xfer_len) {
            return Err(FatalError { fes: Fes::DataOutOfRange, fei: 0 });
        }
        Ok(Sink::H2C(slot, d.datao))
    }

    fn data_done(&mut self, sink: Sink, digest_ok: bool, ctx: &mut ConnCtx<'_>) {
        match sink {
            Sink::Discard | Sink::Term => {}
            Sink::InCapsule(slot) => {
                let r = &mut self.reqs[usize::from(slot)];
                if !digest_ok {
                    // NVMe/TCP 1.0 §3.6.2.4: a data digest error fails the command, not the connection.
                    r.status = Status::TRANSIENT_TRANSPORT_ERROR;
                }
                if !r.status.is_success() {
                    self.respond(slot, ctx);
                    return;
                }
                let received = r.state.received().unwrap_or(0);
                let needs_h2c = !r.c2h && r.xfer_len > 0 && received < r.xfer_len;
                if needs_h2c {
                    self.start_r2t(slot, ctx);
                } else {
                    self.execute(slot, ctx);
                }
            }
            Sink::H2C(slot, _) => {
                let r = &mut self.reqs[usize::from(slot)];
                if !digest_ok {
                    r.status = Status::TRANSIENT_TRANSPORT_ERROR;
                }
                if r.state.received().unwrap_or(0) >= r.xfer_len {
                    self.h2c_done += 1;
                    if r.status.is_success() {
                        self.execute(slot, ctx);
                    } else {
                        self.respond(slot, ctx);
                    }
                }
            }
        }
    }

    fn start_r2t(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let len = self.reqs[usize::from(slot)].xfer_len as usize;
        let buf = if self.reqs[usize::from(slot)].fused == Fused::None {
            self.buf_get(ctx, len)
        } else {
            // The other command of its fused operation waits with its data in.
            self.buf_get_for(slot, len, ctx)
        };
        match buf {
            Some(b) => {
                self.reqs[usize::from(slot)].buf = Some(b);
                if !self.req_to(slot, ReqState::AwaitH2C { received: 0 }, ctx) {
                    return;
                }
                let r = &self.reqs[usize::from(slot)];
                let r2t = R2t { cccid: r.sqe.cid(), ttag: slot, r2to: 0, r2tl: r.xfer_len };
                self.scratch.clear();
                self.enc.r2t(&mut self.scratch, &r2t);
                let scratch = std::mem::take(&mut self.scratch);
                self.tx_bytes(&scratch);
                self.scratch = scratch;
                self.r2t_sent += 1;
            }
            None => self.wait_buffer(slot, ReqState::AwaitBuffer, ctx),
        }
    }

    /// Parks `slot` in `to` (AwaitBuffer or AwaitExecBuffer) until [`Connection::pump`] finds
    /// it a buffer.
    fn wait_buffer(&mut self, slot: u16, to: ReqState, ctx: &mut ConnCtx<'_>) {
        if self.req_to(slot, to, ctx) {
            self.waiting.push_back(slot);
        }
    }

    /// Whether requests wait for buffers (the driver calls [`Connection::pump`] when some are freed).
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Retries requests that waited for a buffer.
    pub fn pump(&mut self, ctx: &mut ConnCtx<'_>) {
        let n = self.waiting.len();
        for _ in 0..n {
            let Some(slot) = self.waiting.pop_front() else { break };
            let r = &self.reqs[usize::from(slot)];
            match r.state {
                ReqState::AwaitExecBuffer => self.execute(slot, ctx),
                // Failed while it waited (a fused command aborted): no data is wanted.
                ReqState::AwaitBuffer if !r.status.is_success() => self.respond(slot, ctx),
                // Write Zeroes writing zeros waits for its zeroed buffer.
                ReqState::AwaitBuffer if r.batch.is_active() => self.batch_pump(slot, ctx),
                ReqState::AwaitBuffer if r.c2h => self.execute(slot, ctx),
                ReqState::AwaitBuffer => self.start_r2t(slot, ctx),
                _ => continue,
            }
            if matches!(self.reqs[usize::from(slot)].state, ReqState::AwaitBuffer | ReqState::AwaitExecBuffer) {
                // Still no buffer: it went back to the queue; stop for now.
                break;
            }
        }
    }

    // -------------------------------------------------------------- execution

    fn refresh_ns(&mut self) {
        let Some(b) = &self.binding else { return };
        if b.controller().subsys.ns_generation() == self.ns_gen {
            return;
        }
        // Deltas counted against the old map go to its namespaces first.
        self.publish_ns_counters();
        let Some(b) = &self.binding else { return };
        let ctrl = b.controller();
        // The namespaces this controller's host sees (visibility is per host).
        let (m, g) = ctrl.subsys.namespaces_of(ctrl);
        let old = std::mem::replace(&mut self.ns, m);
        if self.file_ops > 0 {
            // Keep namespaces alive while file operations on them are in flight.
            self.retired_ns.push(old);
        }
        self.ns_gen = g;
    }

    fn execute(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let kind = self.reqs[usize::from(slot)].kind;
        match kind {
            ReqKind::Connect => self.exec_connect(slot, ctx),
            ReqKind::Fabrics => {
                let sqe = self.reqs[usize::from(slot)].sqe;
                if let Some(Binding::Admin(ctrl)) = &self.binding {
                    let ctrl = Arc::clone(ctrl);
                    let r = &mut self.reqs[usize::from(slot)];
                    if sqe.fctype() == fctype::PROPERTY_GET {
                        let (s, v) = fabrics::property_get(&ctrl, &sqe);
                        r.status = s;
                        r.dw0 = (v & 0xffff_ffff) as u32;
                        r.dw1 = (v >> 32) as u32;
                    } else {
                        r.status = fabrics::property_set(&ctrl, &sqe);
                    }
                }
                self.respond(slot, ctx);
            }
            ReqKind::Admin => self.exec_admin(slot, ctx),
            ReqKind::Io(io) => self.exec_io(slot, io, ctx),
            ReqKind::Auth => self.exec_auth(slot, ctx),
        }
    }

    /// Authentication Send/Receive: the transaction lives in [`crate::auth`]; a
    /// failed one closes the queue once its AUTH_Failure1 is sent.
    fn exec_auth(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        if self.auth.is_none() {
            self.reqs[usize::from(slot)].status = Status::INVALID_OPCODE;
            return self.respond(slot, ctx);
        }
        let (c2h, len) = (self.reqs[usize::from(slot)].c2h, self.reqs[usize::from(slot)].xfer_len as usize);
        let buf = match self.reqs[usize::from(slot)].buf.take() {
            None if c2h => self.buf_get(ctx, len),
            b => b,
        };
        let Some(a) = self.auth.as_mut() else { return };
        a.touch(ctx.now_ns);
        let r = &mut self.reqs[usize::from(slot)];
        let mut consumed = None;
        if c2h {
            let Some(mut out) = buf else {
                r.status = Status::INTERNAL;
                return self.respond(slot, ctx);
            };
            r.status = a.on_receive(&mut out[..len]);
            r.buf = Some(out);
        } else {
            let data = buf.as_deref().map_or(&[][..], |d| &d[..len.min(d.len())]);
            if auth::is_negotiate(data)
                && let Some(b) = &self.binding
            {
                a.rekey(b.controller().subsys.host_auth(a.hostnqn()));
            }
            match a.on_send(data) {
                auth::SendOutcome::Status(s) => r.status = s,
                auth::SendOutcome::Compute(work) => {
                    if let Some(b) = buf {
                        self.buf_put(ctx, b);
                    }
                    let token = ctx.token | u64::from(slot);
                    // Answered in on_auth_computed: later, the reactor serving other queues
                    // meanwhile, or now when there is no driver to take the work.
                    self.auth_computing = Some(slot);
                    let work = match ctx.offload {
                        Some(o) => match o.submit(
                            work,
                            token,
                            self.auth.as_ref().map_or("", QueueAuth::hostnqn),
                            self.auth_waiter.get_or_insert_default(),
                        ) {
                            Ok(()) => return,
                            Err(work) => work,
                        },
                        None => work,
                    };
                    return self.on_auth_computed(slot, work.run(), ctx);
                }
            }
            consumed = buf;
        }
        if let Some(b) = consumed {
            self.buf_put(ctx, b);
        }
        self.auth_answered(slot, ctx);
    }

    /// The Diffie-Hellman step of the Authentication Send in `slot` is done (on a worker).
    /// A result for a slot that no longer waits (the queue failed or closed) is dropped.
    pub fn on_auth_computed(&mut self, slot: u16, done: auth::DhDone, ctx: &mut ConnCtx<'_>) {
        if self.auth_computing != Some(slot) {
            return;
        }
        self.auth_computing = None;
        let Some(a) = self.auth.as_mut() else { return };
        // The host's next step starts now.
        a.touch(ctx.now_ns);
        self.reqs[usize::from(slot)].status = a.on_computed(done);
        self.auth_answered(slot, ctx);
    }

    /// Answers an authentication command; a failed transaction closes the queue once
    /// its AUTH_Failure1 is out.
    fn auth_answered(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        if let Some(o) = self.auth.as_mut().and_then(QueueAuth::take_outcome) {
            self.target.auth_outcomes.record(o);
        }
        if let Some(a) = self.auth.as_mut()
            && let Some(psk) = a.take_generated_psk()
        {
            // Secure channel concatenation: the host reconnects inside TLS with this PSK.
            self.target.tls.generated.insert(a.hostnqn(), a.subnqn(), psk);
        }
        let failed = self.auth.as_ref().is_some_and(QueueAuth::is_failed);
        self.respond(slot, ctx);
        if failed {
            self.close("in-band authentication failed");
        }
    }

    fn exec_connect(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let sqe = self.reqs[usize::from(slot)].sqe;
        let data = self.reqs[usize::from(slot)].buf.take();
        let result = match self.tls_connect_check(data.as_deref().unwrap_or(&[])) {
            Some(e) => Err(e),
            None => {
                fabrics::connect(&self.target, &self.port, &sqe, data.as_deref().unwrap_or(&[]), self.tls_identity())
            }
        };
        if let Some(b) = data {
            self.buf_put(ctx, b);
        }
        let r = &mut self.reqs[usize::from(slot)];
        match result {
            Ok(c) => {
                let ctrl = Arc::clone(c.binding.controller());
                r.dw0 = u32::from(ctrl.cntlid.0);
                if c.auth.as_ref().is_some_and(|a| !a.is_authenticated()) {
                    r.dw0 |= nvme::auth::CONNECT_AUTHREQ_ATR;
                }
                self.auth = c.auth;
                self.host_ticket = Some(c.host_ticket);
                self.entries = c.entries;
                self.sqflow_disabled = c.sqflow_disabled;
                let qid = c.binding.qid();
                self.info.bind(&ctrl.subsys.nqn, ctrl.cntlid, qid.0);
                let extra = if qid.is_admin() { EXTRA_SLOTS } else { 0 };
                self.resize_slots(usize::from(c.entries) + extra);
                if !qid.is_admin() {
                    let icd = self.target.opts.in_capsule_data_size as usize;
                    self.framer.decoder.config.max_in_capsule = icd;
                }
                let (m, g) = ctrl.subsys.namespaces_of(&ctrl);
                self.ns = m;
                self.ns_gen = g;
                self.binding = Some(c.binding);
                self.sqhd = 1 % self.entries.max(1);
                self.set_state(ConnState::Live);
            }
            Err(e) => {
                r.status = e.status;
                r.dw0 = e.dw0;
            }
        }
        self.respond(slot, ctx);
    }

    fn exec_admin(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let Some(Binding::Admin(ctrl)) = &self.binding else {
            self.reqs[usize::from(slot)].status = Status::INVALID_OPCODE;
            return self.respond(slot, ctx);
        };
        let ctrl = Arc::clone(ctrl);
        self.refresh_ns();
        let (xfer, c2h) = {
            let r = &self.reqs[usize::from(slot)];
            (r.xfer_len as usize, r.c2h)
        };
        if c2h && self.reqs[usize::from(slot)].buf.is_none() {
            match self.buf_get(ctx, xfer) {
                Some(b) => self.reqs[usize::from(slot)].buf = Some(b),
                None => return self.wait_buffer(slot, ReqState::AwaitBuffer, ctx),
            }
        }
        let now_ms = ctx.now_ns / 1_000_000;
        ctrl.touch(now_ms);
        let sqe = self.reqs[usize::from(slot)].sqe;
        let mut out = self.reqs[usize::from(slot)].buf.take();
        let outcome = admin::execute(
            &self.target,
            &ctrl,
            &self.ns,
            &sqe,
            out.as_deref_mut().unwrap_or(&mut []),
            self.aers.len(),
            now_ms,
        );
        let r = &mut self.reqs[usize::from(slot)];
        r.buf = out;
        match outcome {
            Outcome::Complete(s, dw0, dw1) => {
                r.status = s;
                r.dw0 = dw0;
                r.dw1 = dw1;
                self.respond(slot, ctx);
            }
            Outcome::Abort { sqid, cid } => self.abort_ask(slot, &ctrl, sqid, cid, ctx),
            Outcome::Aer => {
                if let Some(b) = r.buf.take() {
                    self.buf_put(ctx, b);
                }
                if !self.req_to(slot, ReqState::Aer, ctx) {
                    return;
                }
                self.aers.push(slot);
                self.deliver_events(ctx);
            }
        }
    }

    /// Gives the request a buffer for its controller-to-host data, unless it has one; with
    /// the pool empty it waits for [`Connection::pump`] and this returns false.
    fn has_c2h_buf(&mut self, slot: u16, len: usize, ctx: &mut ConnCtx<'_>) -> bool {
        if self.reqs[usize::from(slot)].buf.is_some() {
            return true;
        }
        match self.buf_get(ctx, len) {
            Some(b) => {
                self.reqs[usize::from(slot)].buf = Some(b);
                true
            }
            None => {
                self.wait_buffer(slot, ReqState::AwaitBuffer, ctx);
                false
            }
        }
    }

    fn exec_io(&mut self, slot: u16, io: IoKind, ctx: &mut ConnCtx<'_>) {
        let nsid = self.reqs[usize::from(slot)].sqe.nsid();
        let Some(ns) = self.ns.get(nsid).cloned() else {
            self.reqs[usize::from(slot)].status = Status::INVALID_NS;
            return self.respond(slot, ctx);
        };
        if !self.reqs[usize::from(slot)].status.is_success() {
            // Failed while it waited (its fused operation was aborted): it does not run.
            return self.respond(slot, ctx);
        }
        #[cfg(feature = "fault-injection")]
        if self.injected_stall(slot, ctx) {
            return;
        }
        if self.qos_hold(slot, &ns, ctx) {
            return;
        }
        if self.reqs[usize::from(slot)].fused != Fused::None {
            return self.fused_exec(slot, &ns, ctx);
        }
        if let Some(blocks) = io.write_blocks(&ns) {
            if !self.range_gate(slot, &ns, blocks.clone(), ctx) {
                // Overlaps a fused operation's blocks: retried from the timers.
                return;
            }
            if let Err(status) = Self::size_recheck(&ns, &blocks).and_then(|()| self.resv_recheck(slot, &ns)) {
                self.range_release(slot);
                self.reqs[usize::from(slot)].status = status;
                return self.respond(slot, ctx);
            }
        }
        if self.run_io(slot, io, &ns, ctx) {
            self.finish_io(slot, ctx);
        }
    }

    /// Runs an I/O command that passed every gate on `ns`'s backend. Whether it is done
    /// (status set, to be finished now); false when it went to the backend's ring, waits
    /// (for a buffer, a batch step) or already answered.
    fn run_io(&mut self, slot: u16, io: IoKind, ns: &Arc<crate::namespace::Namespace>, ctx: &mut ConnCtx<'_>) -> bool {
        match io {
            IoKind::Read { offset, .. }
                if matches!(ns.backend, Backend::Ram(_))
                    && !self.enc.digests.data
                    && self.reqs[usize::from(slot)].buf.is_none() =>
            {
                // The response gathers the bytes from the region itself (`respond`).
                self.reqs[usize::from(slot)].ram_src = Some(crate::us(offset));
                true
            }
            IoKind::Read { offset, len } => self.run_read(slot, offset, len, ns, ctx),
            IoKind::Write { offset, len, fua } => self.run_write(slot, offset, len, fua, ns, ctx),
            IoKind::Flush => {
                if let Backend::File(f) = &ns.backend {
                    let token = ctx.token | u64::from(slot);
                    self.submit_file(slot, FileOp::Sync { file: f.file() }, token, ctx);
                    return false;
                }
                true
            }
            IoKind::WriteZeroes { offset, len, deallocate, fua } => {
                self.run_write_zeroes(slot, offset, len, deallocate, fua, ns, ctx)
            }
            IoKind::Reservation { op, len } => self.exec_reservation(slot, op, len, ns, ctx),
            IoKind::Dsm { nr, deallocate, .. } => self.run_dsm(slot, nr, deallocate, ns, ctx),
            IoKind::Compare { .. } => {
                self.compare_exec(slot, ns, ctx);
                false
            }
            IoKind::Verify { .. } => {
                self.verify_exec(slot, ns, ctx);
                false
            }
            IoKind::Copy { .. } => {
                self.copy_exec(slot, ns, ctx);
                false
            }
        }
    }

    /// A Read into the request's buffer: zeros (null), a copy (RAM) or the file's ring.
    fn run_read(
        &mut self,
        slot: u16,
        offset: u64,
        len: u32,
        ns: &crate::namespace::Namespace,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        let token = ctx.token | u64::from(slot);
        if !self.has_c2h_buf(slot, len as usize, ctx) {
            return false;
        }
        let r = &mut self.reqs[usize::from(slot)];
        match &ns.backend {
            Backend::Null => {
                if let Some(b) = r.buf.as_mut() {
                    b.fill(0);
                }
            }
            Backend::Ram(region) => {
                if let Some(b) = r.buf.as_mut()
                    && region.copy_from_region(crate::us(offset), &mut b[..len as usize]).is_err()
                {
                    r.status = Status::INTERNAL;
                }
            }
            Backend::File(f) => {
                let buf = r.buf.take().unwrap_or_else(|| IoBuf::new(4096));
                let op = FileOp::Read { file: f.file(), buf, len: len as usize, offset };
                self.submit_file(slot, op, token, ctx);
                return false;
            }
        }
        true
    }

    /// A Write from the request's buffer: dropped (null), copied (RAM) or to the file's
    /// ring, followed by a sync when FUA.
    fn run_write(
        &mut self,
        slot: u16,
        offset: u64,
        len: u32,
        fua: bool,
        ns: &crate::namespace::Namespace,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        let token = ctx.token | u64::from(slot);
        let r = &mut self.reqs[usize::from(slot)];
        match &ns.backend {
            Backend::Null => {}
            Backend::Ram(region) => {
                if let Some(b) = r.buf.as_ref()
                    && region.copy_to_region(crate::us(offset), &b[..len as usize]).is_err()
                {
                    r.status = Status::INTERNAL;
                }
            }
            Backend::File(f) => {
                let buf = r.buf.take().unwrap_or_else(|| IoBuf::new(4096));
                r.after = if fua { After::Sync } else { After::Respond };
                let op = FileOp::Write { file: f.file(), buf, len: len as usize, offset };
                self.submit_file(slot, op, token, ctx);
                return false;
            }
        }
        true
    }

    /// Write Zeroes: zeros written into RAM, or a batch of file steps (zero range, punch
    /// or writes of zeros, [`Method::for_write_zeroes`]).
    #[allow(clippy::too_many_arguments, reason = "the command's fields, unpacked by the caller's match")]
    fn run_write_zeroes(
        &mut self,
        slot: u16,
        offset: u64,
        len: u64,
        deallocate: bool,
        fua: bool,
        ns: &crate::namespace::Namespace,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        match &ns.backend {
            Backend::Null => {}
            Backend::Ram(region) => {
                let end = crate::us(offset.saturating_add(len));
                if region.fill_zero(crate::us(offset)..end).is_err() {
                    self.reqs[usize::from(slot)].status = Status::INTERNAL;
                }
            }
            Backend::File(f) => {
                let r = &mut self.reqs[usize::from(slot)];
                r.after = if fua { After::Sync } else { After::Respond };
                r.batch = Batch::zeroes(Method::for_write_zeroes(f, deallocate), offset, len);
                self.batch_pump(slot, ctx);
                return false;
            }
        }
        true
    }

    /// Dataset Management: the ranges checked; with Deallocate, zeroed (RAM) or punched
    /// (a file that reads punched blocks back as zeros), else only hints.
    fn run_dsm(
        &mut self,
        slot: u16,
        nr: u32,
        deallocate: bool,
        ns: &crate::namespace::Namespace,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        let r = &mut self.reqs[usize::from(slot)];
        let data = r.buf.as_deref().unwrap_or(&[]);
        match io_cmd::dsm_check(data, nr, ns) {
            Err(s) => r.status = s,
            Ok(()) if deallocate => match &ns.backend {
                Backend::Null => {}
                Backend::Ram(region) => {
                    for i in 0..nr as usize {
                        if let Some((o, l)) = io_cmd::dsm_bytes(data, i, ns)
                            && region.fill_zero(crate::us(o)..crate::us(o + l)).is_err()
                        {
                            r.status = Status::INTERNAL;
                        }
                    }
                }
                // The data stays with the request until the last range is punched.
                Backend::File(f) if f.zeroing.punch() => {
                    r.batch = Batch::deallocate(nr);
                    self.batch_pump(slot, ctx);
                    return false;
                }
                // A punch would not read back as zeros here (DLFEAT 00h): Deallocate
                // is advisory, and left undone.
                Backend::File(_) => {}
            },
            // Only the hints (IDR, IDW): nothing to do.
            Ok(()) => {}
        }
        if let Some(b) = self.reqs[usize::from(slot)].buf.take() {
            self.buf_put(ctx, b);
        }
        true
    }

    /// A reservation command (NVMe Base 2.x §7.x, [`crate::reservation`]). Returns false
    /// when the request already answered or waits (for a buffer, or for Preempt and Abort's
    /// drain), true when it is ready to complete.
    fn exec_reservation(
        &mut self,
        slot: u16,
        op: ResvOp,
        len: u32,
        ns: &Arc<crate::namespace::Namespace>,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        if self.reqs[usize::from(slot)].step == Step::PreemptDrain {
            return self.preempt_drained(slot, ns, ctx);
        }
        let Some(hostid) = self.binding.as_ref().map(|b| b.controller().hostid) else {
            self.reqs[usize::from(slot)].status = Status::COMMAND_SEQUENCE_ERROR;
            self.respond(slot, ctx);
            return false;
        };
        let sqe = self.reqs[usize::from(slot)].sqe;
        if op == ResvOp::Report {
            if !self.has_c2h_buf(slot, len as usize, ctx) {
                return false;
            }
            let r = &mut self.reqs[usize::from(slot)];
            if let Some(b) = r.buf.as_mut() {
                let out = &mut b[..len as usize];
                out.fill(0);
                r.status = ns.resv.report(sqe.cdw(11), out);
            }
            return true;
        }
        let data = self.reqs[usize::from(slot)].buf.take();
        let keys = data.as_deref().unwrap_or(&[]);
        let status = match op {
            ResvOp::Register => ns.resv.register(&hostid, sqe.cdw(10), keys),
            ResvOp::Acquire => ns.resv.acquire(&hostid, sqe.cdw(10), keys),
            _ => ns.resv.release(&hostid, sqe.cdw(10), keys),
        };
        if let Some(b) = &self.binding {
            // Other hosts the change took something from hear of it (LID 80h).
            crate::controller::notify_reservation(&b.controller().subsys, ns.nsid, &ns.resv.take_notices());
        }
        if let Some(b) = data {
            self.buf_put(ctx, b);
        }
        self.reqs[usize::from(slot)].status = status;
        let preempt_and_abort =
            op == ResvOp::Acquire && sqe.cdw(10) & 7 == u32::from(nvme::reservation::PREEMPT_AND_ABORT);
        if preempt_and_abort && status.is_success() {
            // The preempted hosts' new commands are refused from now on (the check on
            // arrival, and again past the write gate); the writes already past the gate
            // are waited out before the command completes (NVMe Base 2.0 §8.19.7: their
            // commands are aborted "or" completed first; as nvmet's pr.c, which waits).
            self.reqs[usize::from(slot)].step = Step::PreemptDrain;
            return self.preempt_drained(slot, ns, ctx);
        }
        true
    }

    /// Preempt and Abort: a lock over the whole namespace, granted once every write that
    /// passed its gate before it is done ([`crate::range_lock`]); given back at once.
    fn preempt_drained(&mut self, slot: u16, ns: &Arc<crate::namespace::Namespace>, ctx: &mut ConnCtx<'_>) -> bool {
        if !matches!(ns.backend, Backend::Null) && !self.range_lock(slot, ns, 0..ns.nblocks(), ctx) {
            return false;
        }
        self.range_release(slot);
        self.reqs[usize::from(slot)].step = Step::Idle;
        true
    }

    /// A writing command's reservation check again, once it has passed its write gate: a
    /// host preempted (and aborted) meanwhile finds its write refused, while the preempting
    /// command waits for the writes that passed before it ([`Connection::preempt_drained`]).
    /// The check comes after the gate so that, with the gate's sequentially consistent
    /// handshake, each write is either waited out or sees the new reservation. One cached
    /// check per write (a load and a compare when nothing changed).
    pub(super) fn resv_recheck(&mut self, slot: u16, ns: &crate::namespace::Namespace) -> Result<(), Status> {
        let Some(b) = &self.binding else { return Ok(()) };
        let hostid = b.controller().hostid;
        let sqe = self.reqs[usize::from(slot)].sqe;
        ns.resv.check(sqe.nsid().0, &hostid, reservation::group(sqe.opcode()), &mut self.resv_cache)
    }

    fn submit_file(&mut self, slot: u16, op: FileOp<'_>, token: u64, ctx: &mut ConnCtx<'_>) {
        // In flight before it is submitted: a completion never finds the slot elsewhere.
        if !self.req_to(slot, ReqState::Executing { op_len: op_len(&op) }, ctx) {
            return self.op_unsubmitted(op, ctx);
        }
        match ctx.file_io.submit(op, token) {
            Ok(()) => self.file_ops += 1,
            Err((e, buf)) => {
                tracing::warn!("file op submit failed: {e}");
                let r = &mut self.reqs[usize::from(slot)];
                r.buf = buf;
                r.status = Status::INTERNAL;
                self.respond(slot, ctx);
            }
        }
    }

    /// A file operation finished.
    pub fn on_file_done(
        &mut self,
        slot: u16,
        result: std::io::Result<usize>,
        buf: Option<IoBuf>,
        ctx: &mut ConnCtx<'_>,
    ) {
        self.file_ops = self.file_ops.saturating_sub(1);
        if self.file_ops == 0 {
            self.retired_ns.clear();
        }
        let Some(r) = self.reqs.get(usize::from(slot)) else { return };
        let ReqState::Executing { op_len } = r.state else {
            if let Some(b) = buf {
                self.buf_put(ctx, b);
            }
            return;
        };
        if self.reqs[usize::from(slot)].step != Step::Idle {
            return self.step_done(slot, result, buf, ctx);
        }
        let r = &mut self.reqs[usize::from(slot)];
        if buf.is_some() {
            r.buf = buf;
        }
        let result = match result {
            // A short read or write (a file shrunk under us, a full file system) is a failure:
            // acknowledging it would report data that is not there.
            Ok(n) if n < op_len => Err(std::io::Error::other(format!("short transfer: {n} of {op_len} bytes"))),
            other => other,
        };
        if r.batch.is_active() {
            return self.on_batch_op_done(slot, &result, ctx);
        }
        if let Err(e) = &result {
            tracing::warn!(slot, "backend I/O failed: {e}");
            r.status = if r.c2h { Status::UNRECOVERED_READ_ERROR } else { Status::WRITE_FAULT };
        }
        self.file_ops_done(slot, ctx);
    }

    /// The request's file operations are over (status set): a FUA sync if asked, then the
    /// response (or the slot's release on a closing connection).
    fn file_ops_done(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let r = &mut self.reqs[usize::from(slot)];
        if r.after == After::Sync && r.status.is_success() {
            r.after = After::Respond;
            let nsid = r.sqe.nsid();
            if let Some(ns) = self.ns.get(nsid).cloned()
                && let Backend::File(f) = &ns.backend
            {
                let token = ctx.token | u64::from(slot);
                return self.submit_file(slot, FileOp::Sync { file: f.file() }, token, ctx);
            }
        }
        if matches!(self.state, ConnState::Closing | ConnState::Closed) {
            self.release_slot(slot, ctx);
            return;
        }
        let nsid = self.reqs[usize::from(slot)].sqe.nsid();
        if self.ns.get(nsid).is_some() {
            self.finish_io(slot, ctx);
        } else {
            self.respond(slot, ctx);
        }
    }

    /// An operation of the request's [`Batch`] finished: record it (the first error decides
    /// the status), then submit more or finish.
    fn on_batch_op_done(&mut self, slot: u16, result: &std::io::Result<usize>, ctx: &mut ConnCtx<'_>) {
        let nsid = self.reqs[usize::from(slot)].sqe.nsid();
        let ns = self.ns.get(nsid).cloned();
        let r = &mut self.reqs[usize::from(slot)];
        let outcome = match ns.as_deref().map(|n| &n.backend) {
            Some(Backend::File(f)) => r.batch.on_done(result, f),
            _ => {
                // The namespace went away meanwhile: start nothing more on it.
                r.batch.stop();
                Err(std::io::Error::other("the namespace was removed"))
            }
        };
        if let Err(e) = outcome {
            tracing::warn!(slot, nsid = nsid.0, "deallocate or write zeroes failed: {e}");
            if r.status.is_success() {
                r.status = Status::WRITE_FAULT;
            }
        }
        self.batch_pump(slot, ctx);
    }

    /// Submits the next operations of the request's [`Batch`] (at most the batch's window
    /// in flight); when none is in flight and none is left, finishes the command.
    fn batch_pump(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let nsid = self.reqs[usize::from(slot)].sqe.nsid();
        let ns = self.ns.get(nsid).cloned();
        let closing = matches!(self.state, ConnState::Closing | ConnState::Closed);
        let chunk = self.target.opts.max_transfer().min(ZERO_CHUNK_BYTES_MAX);
        let token = ctx.token | u64::from(slot);
        loop {
            let r = &mut self.reqs[usize::from(slot)];
            let (Some(ns), false) = (ns.as_deref(), closing) else {
                r.batch.stop();
                break;
            };
            let Backend::File(f) = &ns.backend else {
                r.batch.stop();
                break;
            };
            let Some(step) = r.batch.next_step(r.buf.as_deref().unwrap_or(&[]), ns, chunk) else { break };
            let (op, op_len) = match step {
                dealloc::Step::Fallocate { mode, offset, len } => {
                    (FileOp::Fallocate { file: f.file(), mode, offset, len }, 0)
                }
                dealloc::Step::Write { offset, len } => {
                    let buf = match r.buf.take() {
                        Some(b) => b,
                        None => match self.buf_get(ctx, chunk) {
                            Some(mut b) => {
                                // Pool buffers hold earlier data: zero it once, write it many times.
                                b.fill(0);
                                b
                            }
                            None => {
                                let r = &mut self.reqs[usize::from(slot)];
                                r.batch.unsubmit(step);
                                if r.batch.in_flight() == 0 {
                                    self.wait_buffer(slot, ReqState::AwaitBuffer, ctx);
                                }
                                return;
                            }
                        },
                    };
                    (FileOp::Write { file: f.file(), buf, len, offset }, len)
                }
            };
            if !self.req_to(slot, ReqState::Executing { op_len }, ctx) {
                return self.op_unsubmitted(op, ctx);
            }
            match ctx.file_io.submit(op, token) {
                Ok(()) => self.file_ops += 1,
                Err((e, buf)) => {
                    let r = &mut self.reqs[usize::from(slot)];
                    if buf.is_some() {
                        r.buf = buf;
                    }
                    r.batch.unsubmit(step);
                    if r.batch.in_flight() > 0 {
                        // Tried again when one of the command's operations completes.
                        break;
                    }
                    tracing::warn!("file op submit failed: {e}");
                    r.batch.stop();
                    r.status = Status::INTERNAL;
                    break;
                }
            }
        }
        let r = &mut self.reqs[usize::from(slot)];
        if !r.batch.is_done() {
            // Operations are in flight (each moved it to Executing before it was submitted).
            return;
        }
        r.batch = Batch::default();
        self.file_ops_done(slot, ctx);
    }

    /// Responds, now or (an injected delay) at the due time.
    fn finish_io(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        // The data is written: a held completion keeps no blocks from other writers.
        self.range_release(slot);
        #[cfg(feature = "fault-injection")]
        if self.injected_delay(slot, ctx) {
            return;
        }
        self.respond(slot, ctx);
    }

    /// A provisioned namespace's rate ([`crate::qos`]): the command waits, not executed yet,
    /// until the device time it is given (SPDK's bdev QoS queues before the bdev too), so an
    /// Abort can still take it back. True when it waits; it runs again from the timers.
    fn qos_hold(&mut self, slot: u16, ns: &crate::namespace::Namespace, ctx: &mut ConnCtx<'_>) -> bool {
        let r = &mut self.reqs[usize::from(slot)];
        if std::mem::replace(&mut r.qos_admitted, true) {
            return false;
        }
        match ns.qos.admit(ctx.now_ns, u64::from(r.xfer_len)) {
            Some(due_ns) if due_ns > ctx.now_ns => {
                if self.req_to(slot, ReqState::QosWait { due_ns }, ctx) {
                    self.timers.push(Reverse((due_ns, slot)));
                }
                true
            }
            _ => false,
        }
    }

    /// A file operation that was not submitted (its request's change was refused) gives its
    /// buffer back.
    fn op_unsubmitted(&mut self, op: FileOp<'_>, ctx: &mut ConnCtx<'_>) {
        if let FileOp::Read { buf, .. } | FileOp::Write { buf, .. } = op {
            self.buf_put(ctx, buf);
        }
    }

    /// The earliest time a held completion is due, if any.
    pub fn next_timer(&self) -> Option<u64> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Completes held requests that are due.
    pub fn on_timers(&mut self, ctx: &mut ConnCtx<'_>) {
        while let Some(Reverse((t, slot))) = self.timers.peek().copied() {
            if t > ctx.now_ns {
                break;
            }
            self.timers.pop();
            // A timer set for a state the request has left (an aborted command's, whose slot
            // may hold another command by now) is not this state's: its due time differs.
            match self.reqs[usize::from(slot)].state {
                #[cfg(feature = "fault-injection")]
                ReqState::Delayed { due_ns } if due_ns == t => self.respond(slot, ctx),
                ReqState::RangeWait { due_ns, .. } | ReqState::QosWait { due_ns } if due_ns == t => {
                    self.execute(slot, ctx);
                }
                ReqState::AbortWait { .. } => self.abort_poll(slot, ctx),
                _ => {}
            }
        }
    }

    // -------------------------------------------------------------- responses

    /// Queues the completion of `slot` (C2HData when the command returns data,
    /// then CapsuleResp unless C2HData carried SUCCESS) and frees the slot.
    fn respond(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        self.fused_unlink(slot, ctx);
        let qid = self.qid().unwrap_or(QueueId(0));
        let r = &mut self.reqs[usize::from(slot)];
        let nsid = r.sqe.nsid();
        // A RAM read gathered from the region: the range was checked against the namespace
        // when the command came in, but the namespace may have gone since (RPC).
        let mut ram = None;
        if let Some(off) = r.ram_src.take()
            && r.status.is_success()
        {
            let end = off.checked_add(r.xfer_len as usize);
            match self.ns.get(nsid).map(|n| &n.backend) {
                Some(Backend::Ram(region)) if end.is_some_and(|e| e <= region.len()) => ram = Some(off),
                _ => r.status = Status::INTERNAL,
            }
        }
        let data_bytes = if r.status.is_success() && r.c2h { r.xfer_len as usize } else { 0 };
        self.tx_seal_batch(data_bytes + RESPONSE_BYTES_MAX);
        let r = &mut self.reqs[usize::from(slot)];
        let cid = r.sqe.cid();
        let status = r.status;
        // A failure on a queue of a controller goes into its Error Information log (below):
        // the completion says so with the More bit, as nvmet does.
        let more = !status.is_success() && self.binding.is_some();
        let mut resp_needed = true;
        if status.is_success() && r.c2h && r.xfer_len > 0 && (r.buf.is_some() || ram.is_some()) {
            let len = r.xfer_len as usize;
            let success = self.sqflow_disabled;
            let d = DataHeader { cccid: cid, ttag: 0, datao: 0, datal: r.xfer_len, last: true, success };
            let buf = r.buf.take();
            self.scratch.clear();
            let w = self.enc.c2h_data(&mut self.scratch, &d);
            // Header, data, digest and (below) the response stay in one batch.
            self.tx_room(4);
            self.tx.push_bytes(&self.scratch);
            if let Some(buf) = buf {
                let digest = w.ddgst.then(|| crc32c(&buf[..len]));
                if let Err((e, b)) = self.tx.push_buf(buf, 0..len) {
                    // Only a range outside the buffer fails, and `len` is the buffer's length.
                    tracing::error!("C2HData payload refused: {e}");
                    self.buf_put(ctx, b);
                }
                if let Some(d) = digest {
                    self.tx.push_bytes(&d.to_le_bytes());
                }
            } else if let (Some(off), Some(Backend::Ram(region))) = (ram, self.ns.get(nsid).map(|n| &n.backend)) {
                // No data digest here (`exec_io` copies when digests are on): the kernel
                // reads the bytes straight from the namespace while it sends.
                if let Err(e) = self.tx.push_region(region, off..off + len) {
                    tracing::error!("C2HData region range refused: {e}");
                }
            }
            resp_needed = !success;
        }
        if resp_needed {
            self.tx_room(1);
        }
        let r = &mut self.reqs[usize::from(slot)];
        if resp_needed {
            let cqe = Cqe { dw0: r.dw0, dw1: r.dw1, sqhd: self.sqhd, sqid: qid, cid, status, more };
            self.scratch.clear();
            self.enc.capsule_resp(&mut self.scratch, &cqe);
            self.tx.push_bytes(&self.scratch);
        }
        let stats = &self.info.stats;
        match r.kind {
            ReqKind::Io(IoKind::Read { len, .. }) if status.is_success() => {
                stats.reads.add(1);
                stats.read_bytes.add(u64::from(len));
            }
            ReqKind::Io(IoKind::Write { len, .. }) if status.is_success() => {
                stats.writes.add(1);
                stats.write_bytes.add(u64::from(len));
            }
            _ => {}
        }
        if !status.is_success() {
            stats.errors.add(1);
            if let Some(b) = &self.binding {
                b.controller().log_error(qid.0, &r.sqe, status);
            }
        }
        let latency = ctx.now_ns.saturating_sub(r.start_ns);
        stats.latency_ns_sum.add(latency);
        if let ReqKind::Io(io) = r.kind
            && let Some((dir, bytes)) = io.stats_direction()
        {
            let (opcode, nsid) = (r.sqe.opcode(), r.sqe.nsid().0);
            self.count_io(dir, bytes, latency, status, opcode, nsid);
        }
        self.release_slot(slot, ctx);
    }

    /// Counts a completed I/O command in the queue's histograms and its namespace's deltas
    /// (owned memory, plain adds; published on the tick).
    fn count_io(&mut self, dir: blk::Direction, bytes: u64, latency: u64, status: Status, opcode: u8, nsid: u32) {
        let ok = status.is_success();
        let outcome = if ok { blk::Outcome::Success } else { blk::Outcome::Error };
        self.local_stats.record(dir, bytes, latency, outcome);
        let i = match self.ns_local.iter().position(|n| n.nsid == nsid) {
            Some(i) => i,
            None => {
                self.ns_local.push(crate::stats::NsCounters { nsid, ..Default::default() });
                self.ns_local.len() - 1
            }
        };
        let n = &mut self.ns_local[i];
        if !ok {
            n.errors += 1;
            // SMART Media and Data Integrity Errors: the backend failed the I/O (a read or
            // write error). A miscompare is a Media status too, but not an integrity error.
            if status == Status::UNRECOVERED_READ_ERROR || status == Status::WRITE_FAULT {
                n.media_errors += 1;
            }
            self.stats_dirty = true;
            return;
        }
        let d = match dir {
            blk::Direction::Read => {
                n.reads += 1;
                n.read_bytes += bytes;
                0
            }
            blk::Direction::Write => {
                n.writes += 1;
                n.write_bytes += bytes;
                1
            }
            blk::Direction::Trim => 2,
            blk::Direction::Sync => 3,
        };
        self.latency_ns_sum[d] += latency;
        match crate::supported::SMART_BY_OPCODE[usize::from(opcode)] {
            crate::supported::Smart::Read => {
                n.host_read_commands += 1;
                n.data_read_bytes += bytes;
            }
            crate::supported::Smart::Write => {
                n.host_write_commands += 1;
                n.data_written_bytes += bytes;
            }
            crate::supported::Smart::None => {}
        }
        self.stats_dirty = true;
    }

    /// Publishes what was counted since the last call (on the tick and when the queue
    /// closes, never per I/O): the latency histograms for RPC and metrics readers, and the
    /// deltas of the namespaces' and the port's monotonic totals.
    fn publish_stats(&mut self) {
        if std::mem::take(&mut self.stats_dirty) {
            self.publish_ns_counters();
            self.port_totals.add(&self.local_stats);
            self.info.publish(&mut self.local_stats, &mut self.latency_ns_sum);
        }
    }

    /// Adds the per-namespace deltas to the totals of the namespaces in the map they were
    /// counted against (a namespace removed since takes its deltas with it).
    fn publish_ns_counters(&mut self) {
        for n in &mut self.ns_local {
            if n.is_zero() {
                continue;
            }
            if let Some(ns) = self.ns.get(Nsid(n.nsid)) {
                ns.counters.add(n);
            }
            *n = crate::stats::NsCounters { nsid: n.nsid, ..Default::default() };
        }
    }

    fn release_slot(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        self.range_release(slot);
        let r = &mut self.reqs[usize::from(slot)];
        let bufs = [r.buf.take(), r.aux.take(), r.aux2.take()];
        for b in bufs.into_iter().flatten() {
            self.buf_put(ctx, b);
        }
        let r = &mut self.reqs[usize::from(slot)];
        r.ram_src = None;
        r.fused = Fused::None;
        r.step = Step::Idle;
        r.qos_admitted = false;
        // Releasing a free slot again changes nothing (the closing paths release everything).
        if let Ok(free) = r.state.transition(ReqState::Free) {
            r.state = free;
            self.info.stats.outstanding.sub(1);
            self.free.push(slot);
        }
    }

    fn deliver_events(&mut self, ctx: &mut ConnCtx<'_>) {
        let Some(Binding::Admin(ctrl)) = &self.binding else { return };
        if self.aers.is_empty() || !ctrl.has_events() {
            return;
        }
        let ctrl = Arc::clone(ctrl);
        while !self.aers.is_empty() {
            let Some(ev) = ctrl.take_event() else { break };
            let slot = self.aers.remove(0);
            let r = &mut self.reqs[usize::from(slot)];
            r.status = Status::SUCCESS;
            r.dw0 = ev.to_dw0();
            r.c2h = false;
            self.respond(slot, ctx);
        }
    }

    /// Queues a C2HTermReq for `err` and closes after it is sent.
    fn fail(&mut self, err: FatalError, offending: &[u8]) {
        if matches!(self.state, ConnState::Closing | ConnState::Closed) {
            return;
        }
        tracing::info!(port = self.port.id, peer = ?self.peer, fes = ?err.fes, fei = err.fei, "fatal transport error");
        self.scratch.clear();
        EncoderConfig::term_req(&mut self.scratch, Role::Controller, err, offending);
        self.tx_room(1);
        self.tx.push_bytes(&self.scratch);
        self.close_reason = Some(format!("fatal error {:?} at {}", err.fes, err.fei));
        self.set_state(ConnState::Closing);
    }

    // ------------------------------------------------------------------- send

    /// The next batch to send, if any and if none is in flight.
    pub fn take_send(&mut self) -> Option<SendMsg> {
        if matches!(self.tls, Some(crate::tls::Link::Tls(_))) {
            return self.tls_take_send();
        }
        self.take_plain_send()
    }

    /// The next batch of the queue's own (plaintext) output.
    fn take_plain_send(&mut self) -> Option<SendMsg> {
        let plain_pending = !self.tx.is_empty() || !self.tx_full.is_empty();
        if self.tx_inflight || !plain_pending || self.state == ConnState::Closed {
            return None;
        }
        self.tx_inflight = true;
        if let Some(full) = self.tx_full.pop_front() {
            return Some(full);
        }
        let spare = self.tx_spares.pop().unwrap_or_default();
        Some(std::mem::replace(&mut self.tx, spare))
    }

    /// A batch was sent (or failed). Resumes input parsing paused for output, and
    /// commands that waited for this connection's buffers.
    pub fn on_send_done(&mut self, msg: SendMsg, result: std::io::Result<()>, ctx: &mut ConnCtx<'_>) {
        if matches!(self.tls, Some(crate::tls::Link::Tls(_))) {
            return self.tls_send_done(msg, result, ctx);
        }
        self.plain_send_done(msg, result, ctx);
    }

    /// The queue's own batch is sent (or failed).
    fn plain_send_done(&mut self, mut msg: SendMsg, result: std::io::Result<()>, ctx: &mut ConnCtx<'_>) {
        self.tx_inflight = false;
        for b in msg.drain_bufs() {
            self.buf_put(ctx, b);
        }
        msg.clear();
        if self.tx_spares.len() < 2 {
            self.tx_spares.push(msg);
        }
        if let Err(e) = result {
            self.close(&format!("send failed: {e}"));
            self.set_state(ConnState::Closed);
            return;
        }
        if self.state == ConnState::Closing && !self.tx_pending() {
            self.set_state(ConnState::Closed);
            return;
        }
        if self.has_waiting() {
            self.pump(ctx);
        }
        if self.rx_paused && !self.tx_over() {
            self.rx_paused = false;
            if let Some(mut buf) = self.rx.take() {
                self.process(&mut buf, ctx);
                self.note_rx(&buf);
                self.rx = Some(buf);
            }
            self.tls_fill();
        }
    }

    // ------------------------------------------------------------------ ticks

    /// Periodic work (the driver calls it every few ms): keep-alive, events,
    /// controller teardown, connect timeout, injected drops.
    pub fn tick(&mut self, ctx: &mut ConnCtx<'_>) {
        self.publish_stats();
        let now_ms = ctx.now_ns / 1_000_000;
        let limits = &self.target.limits;
        if matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect)
            && ctx.now_ns.saturating_sub(self.created_ns) / 1_000_000 > limits.connect_timeout_ms()
        {
            limits.count_timeout();
            self.close("no ICReq/Connect within the connect timeout");
            return;
        }
        if let Some(why) = self.pdu_stalled(ctx.now_ns) {
            self.target.limits.count_timeout();
            self.close(why);
            return;
        }
        self.fused_timeout(ctx);
        if let Some(a) = &self.auth
            && !a.is_authenticated()
        {
            // Linux nvmet: each transaction step may take KATO (120 s without keep-alive).
            let kato = u64::from(self.binding.as_ref().map_or(0, |b| b.controller().kato_ms()));
            let limit_ms = if kato == 0 { 120_000 } else { kato.max(self.target.limits.connect_timeout_ms()) };
            if a.expired(ctx.now_ns, limit_ms) {
                self.target.auth_outcomes.record(auth::Outcome::Refused { renewal: false });
                self.close("authentication transaction step timed out");
                return;
            }
            // Keep-alive counts once the queue is authenticated: until then the host can send
            // nothing but the transaction (NVMe 2.x §8.13), whose DH math may take a while.
            if let Some(b) = &self.binding {
                b.controller().touch(now_ms);
            }
        }
        let dropgen = self.port.faults.drop_generation.load(std::sync::atomic::Ordering::Relaxed);
        if dropgen != self.drop_generation {
            self.drop_generation = dropgen;
            self.close("dropped by fault injection");
            self.set_state(ConnState::Closed);
            return;
        }
        if self.port.is_removed() {
            // The operator removed the port: like a link that went away.
            self.close("port removed");
            self.set_state(ConnState::Closed);
            return;
        }
        // An idle queue lets go of a removed namespace too (one load when nothing
        // changed): its map would keep the namespace, and its file open and locked, for
        // as long as the host stays connected without a command.
        self.refresh_ns();
        let Some(b) = &self.binding else { return };
        let ctrl = Arc::clone(b.controller());
        if self.traffic_ms > self.traffic_reported_ms {
            // Traffic-based keep alive: report the time input last arrived, once per tick.
            self.traffic_reported_ms = self.traffic_ms;
            ctrl.touch(self.traffic_ms);
        }
        if ctrl.is_dead() {
            self.close("controller is gone");
            return;
        }
        match b {
            Binding::Admin(_) => {
                if ctrl.keep_alive_expired(now_ms) {
                    tracing::info!(cntlid = ctrl.cntlid.0, "keep-alive timeout: controller torn down");
                    ctrl.fail("keep-alive timeout");
                    self.close("keep-alive timeout");
                    return;
                }
                self.deliver_events(ctx);
            }
            Binding::Io(_, _, generation) => {
                if ctrl.io_generation() != *generation {
                    self.close("controller reset");
                } else if ctrl.aborts_pending() {
                    self.serve_aborts(&ctrl, ctx);
                }
            }
        }
    }

    /// The PDU timeout: a PDU started and no whole one since, or R2Ts outstanding and none
    /// answered, for `pdu_timeout_ms` (checked on the tick: two counters and a flag, nothing
    /// per PDU beyond counting it).
    fn pdu_stalled(&mut self, now_ns: u64) -> Option<&'static str> {
        let limit_ns = self.target.limits.pdu_timeout_ms().saturating_mul(1_000_000);
        if !self.mid_pdu || self.pdus != self.stall_pdus {
            self.stall_pdus = self.pdus;
            self.stall_since_ns = now_ns;
        } else if now_ns.saturating_sub(self.stall_since_ns) > limit_ns {
            return Some("a PDU was not finished within the PDU timeout");
        }
        if self.r2t_sent == self.h2c_done || self.h2c_done != self.r2t_mark {
            // Nothing owed, or an R2T answered since the last tick: the clock restarts.
            self.r2t_mark = self.h2c_done;
            self.r2t_since_ns = now_ns;
        } else if now_ns.saturating_sub(self.r2t_since_ns) > limit_ns {
            return Some("an R2T was not answered within the PDU timeout");
        }
        None
    }

    /// Releases the queue's binding and buffers (the driver calls it once
    /// the connection is closed and no file operation is in flight).
    pub fn release(&mut self, ctx: &mut ConnCtx<'_>) {
        self.publish_stats();
        for i in 0..self.reqs.len() {
            let r = &mut self.reqs[i];
            let bufs = [r.buf.take(), r.aux.take(), r.aux2.take()];
            for b in bufs.into_iter().flatten() {
                self.buf_put(ctx, b);
            }
            // A request that waited for, or held, blocks gives them back.
            self.range_release(u16::try_from(i).unwrap_or(u16::MAX));
        }
        // Output never sent (a failed send, a dropped connection) gives its buffers back too.
        let mut unsent: Vec<SendMsg> = self.tx_full.drain(..).collect();
        unsent.push(std::mem::take(&mut self.tx));
        if let Some(crate::tls::Link::Tls(ch)) = self.tls.as_mut()
            && let Some(b) = ch.take_batch()
        {
            unsent.push(b);
        }
        for mut m in unsent {
            for b in m.drain_bufs() {
                self.buf_put(ctx, b);
            }
            m.clear();
        }
        self.host_ticket = None;
        if let Some(b) = self.binding.take() {
            match b {
                Binding::Admin(ctrl) => {
                    let why = match self.close_reason.as_deref() {
                        Some("peer closed the connection") => "the host closed the admin queue".to_string(),
                        Some(r) => format!("admin queue closed: {r}"),
                        None => "admin queue closed".to_string(),
                    };
                    ctrl.delete(&why);
                }
                Binding::Io(ctrl, qid, _) => ctrl.detach_io_queue(qid),
            }
        }
        self.set_state(ConnState::Closed);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A connection dropped without `release` (the reactor stopping) still hands over
        // what it counted.
        self.publish_stats();
        if let Some(w) = &self.auth_waiter {
            w.abandon();
        }
        // Dropped without `release` (a driver that stopped): range-lock holds are shared
        // with every other queue of their namespace, so they are given back here too.
        for i in 0..self.reqs.len() {
            self.range_release(u16::try_from(i).unwrap_or(u16::MAX));
        }
        if let Some(b) = self.binding.take() {
            match b {
                Binding::Admin(ctrl) => ctrl.delete("admin queue dropped"),
                Binding::Io(ctrl, qid, _) => ctrl.detach_io_queue(qid),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnState::{self, *};

    #[test]
    fn connection_lifecycle() {
        let all = [AwaitIcReq, AwaitConnect, Live, Closing, Closed];
        let legal = |from: ConnState, to: ConnState| {
            matches!((from, to), (AwaitIcReq, AwaitConnect) | (AwaitConnect, Live) | (_, Closing | Closed))
        };
        for from in all {
            for to in all {
                let got = from.transition(to);
                assert_eq!(got.is_ok(), legal(from, to), "{from:?} -> {to:?}");
            }
        }
        // Closing a closed connection leaves it closed; a refusal names both states.
        assert_eq!(Closed.transition(Closing), Ok(Closed));
        let e = Live.transition(AwaitIcReq).unwrap_err();
        assert_eq!((e.from, e.to), (Live, AwaitIcReq));
        assert!(Closed.transition(Live).is_err());
    }
}

#[cfg(test)]
mod req_tests {
    use std::sync::Arc;

    use nvme::fabrics::ConnectCmd;
    use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Header, IcReq, PduInfo, Role};
    use nvme::{Cid, QueueId, SglDescriptor, Status};

    use super::ReqState::{self, *};
    use super::{ConnCtx, Connection};
    use crate::backend::SyncFileIo;
    use crate::pool::BufPool;
    use crate::port::PortKind;
    use crate::registry::{TargetOptions, TargetState};

    /// One state of each kind (the data they carry takes no part in the table).
    fn all() -> Vec<ReqState> {
        let v = vec![
            Free,
            InCapsule { received: 0 },
            AwaitBuffer,
            AwaitH2C { received: 0 },
            Executing { op_len: 0 },
            Aer,
            FusedWait,
            RangeWait { due_ns: 0, backoff_ns: 0 },
            AwaitExecBuffer,
            QosWait { due_ns: 0 },
            AbortWait { until_ns: 0 },
        ];
        #[cfg(feature = "fault-injection")]
        let v = [v, vec![Delayed { due_ns: 0 }, Stalled]].concat();
        v
    }

    /// The edges the connection's code takes, written out by destination (the table
    /// `ReqState::transition` must match exactly).
    fn legal(from: ReqState, to: ReqState) -> bool {
        let k = |s: ReqState| std::mem::discriminant(&s);
        let any = |set: &[ReqState]| set.iter().any(|s| k(*s) == k(from));
        let receiving = [InCapsule { received: 0 }, AwaitH2C { received: 0 }];
        let waits = [
            AwaitBuffer,
            AwaitExecBuffer,
            QosWait { due_ns: 0 },
            RangeWait { due_ns: 0, backoff_ns: 0 },
            FusedWait,
            Executing { op_len: 0 },
        ];
        match to {
            Free => from != Free,
            InCapsule { .. } => from == Free,
            AwaitH2C { .. } | Aer | AbortWait { .. } => any(&[InCapsule { received: 0 }, AwaitBuffer]),
            QosWait { .. } => any(&receiving),
            FusedWait => any(&receiving) || any(&[AwaitExecBuffer, QosWait { due_ns: 0 }]),
            AwaitBuffer => any(&[
                InCapsule { received: 0 },
                AwaitBuffer,
                QosWait { due_ns: 0 },
                RangeWait { due_ns: 0, backoff_ns: 0 },
                Executing { op_len: 0 },
            ]),
            AwaitExecBuffer => any(&receiving) || any(&[AwaitExecBuffer, QosWait { due_ns: 0 }, FusedWait]),
            RangeWait { .. } => any(&receiving) || (any(&waits) && from != AwaitBuffer),
            Executing { .. } => any(&receiving) || any(&waits),
            #[cfg(feature = "fault-injection")]
            Delayed { .. } => any(&receiving) || any(&waits),
            #[cfg(feature = "fault-injection")]
            Stalled => any(&receiving) || any(&[AwaitBuffer, AwaitExecBuffer, QosWait { due_ns: 0 }]),
        }
    }

    #[test]
    fn request_lifecycle_table() {
        let mut accepted = 0;
        for from in all() {
            for to in all() {
                let got = from.transition(to);
                assert_eq!(got.is_ok(), legal(from, to), "{from:?} -> {to:?}");
                if let Ok(s) = got {
                    assert_eq!(s, to, "an accepted change lands where it was asked to");
                    accepted += 1;
                }
            }
        }
        assert!(accepted > 40, "the table is not empty");
    }

    #[test]
    fn request_changes_carry_their_data_and_refuse_what_cannot_happen() {
        // The edges the I/O paths take, with their data.
        let path = [
            (Free, InCapsule { received: 0 }),
            (InCapsule { received: 0 }, AwaitH2C { received: 0 }),
            (AwaitH2C { received: 4096 }, QosWait { due_ns: 7 }),
            (QosWait { due_ns: 7 }, RangeWait { due_ns: 9, backoff_ns: 20_000 }),
            (RangeWait { due_ns: 9, backoff_ns: 20_000 }, RangeWait { due_ns: 49, backoff_ns: 40_000 }),
            (RangeWait { due_ns: 49, backoff_ns: 40_000 }, Executing { op_len: 4096 }),
            (Executing { op_len: 4096 }, Executing { op_len: 0 }),
            (Executing { op_len: 0 }, Free),
            (InCapsule { received: 0 }, AbortWait { until_ns: 5 }),
            (AbortWait { until_ns: 5 }, Free),
        ];
        for (from, to) in path {
            assert_eq!(from.transition(to), Ok(to), "{from:?} -> {to:?}");
        }
        // Data is asked for only before the command runs; parked admin commands only end;
        // the rate applies once; a slot holds one command at a time.
        let refused = [
            (Executing { op_len: 0 }, AwaitH2C { received: 0 }),
            (AwaitH2C { received: 0 }, AwaitH2C { received: 0 }),
            (Aer, Executing { op_len: 0 }),
            (AbortWait { until_ns: 0 }, QosWait { due_ns: 0 }),
            (Executing { op_len: 0 }, QosWait { due_ns: 1 }),
            (QosWait { due_ns: 1 }, QosWait { due_ns: 2 }),
            (Free, Executing { op_len: 0 }),
            (Free, Free),
            (Executing { op_len: 0 }, InCapsule { received: 0 }),
            (AwaitBuffer, RangeWait { due_ns: 0, backoff_ns: 0 }),
        ];
        for (from, to) in refused {
            let e = from.transition(to).unwrap_err();
            assert_eq!((e.from, e.to), (from, to), "a refusal names both states");
        }
    }

    /// Collects what the connection sends, handing each batch back as sent.
    fn sent(c: &mut Connection, ctx: &mut ConnCtx<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(m) = c.take_send() {
            out.extend_from_slice(&m.to_vec());
            c.on_send_done(m, Ok(()), ctx);
        }
        out
    }

    /// The PDU headers in `bytes`, a controller's output (`dec` follows it across calls).
    fn headers(dec: &mut Decoder, mut bytes: &[u8]) -> Vec<Header> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let Ok(Decoded::Pdu(PduInfo { header, layout })) = dec.decode_header(bytes) else { panic!("a whole PDU") };
            bytes = &bytes[layout.plen..];
            if let Header::IcResp(_) = header {
                dec.config = DecoderConfig {
                    receiver: Role::Host,
                    digests: Digests::default(),
                    established: true,
                    data_align: 4,
                    max_in_capsule: 0,
                    max_data_pdu: 1 << 20,
                };
            }
            out.push(header);
        }
        out
    }

    #[test]
    fn a_refused_request_change_fails_the_command_instead_of_hanging_it() {
        let t = Arc::new(TargetState::new(TargetOptions::default()));
        let port = t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
        let mut c = Connection::new(Arc::clone(&t), port, None, 0);
        let (mut pool, mut fio) = (BufPool::new(1 << 20, 64 << 20), SyncFileIo::default());
        let mut ctx = ConnCtx { pool: &mut pool, file_io: &mut fio, token: 0, now_ns: t.now_ns(), offload: None };
        // A Connect whose data the target asks for with an R2T: the command waits in AwaitH2C.
        let mut input = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode().to_vec();
        let mut sqe = ConnectCmd { recfmt: 0, qid: QueueId(0), sqsize: 31, cattr: 0, kato_ms: 0 }.to_sqe(Cid(7));
        sqe.set_sgl(SglDescriptor::transport(1024));
        EncoderConfig { digests: Digests::default(), data_align: 4 }.capsule_cmd(&mut input, &sqe, 0);
        assert_eq!(c.feed(&input, &mut ctx), input.len());
        let mut dec = Decoder::new(DecoderConfig::initial(Role::Host));
        let out = headers(&mut dec, &sent(&mut c, &mut ctx));
        assert!(matches!(out.as_slice(), [Header::IcResp(_), Header::R2T(r)] if r.cccid == Cid(7)), "{out:?}");
        assert_eq!(c.reqs[0].state, AwaitH2C { received: 0 });

        // A change the table refuses: the command ends with Internal Error, the slot is free.
        assert!(!c.req_to(0, Aer, &mut ctx));
        assert_eq!(c.reqs[0].state, Free);
        assert_eq!(c.free, vec![0], "the slot is back on the free list");
        let out = headers(&mut dec, &sent(&mut c, &mut ctx));
        let [Header::CapsuleResp(cqe)] = out.as_slice() else { panic!("one completion, got {out:?}") };
        assert_eq!((cqe.cid, cqe.status), (Cid(7), Status::INTERNAL));
        assert_eq!(c.state(), super::ConnState::AwaitConnect, "only the command failed");

        // A slot that holds no command asked to change: the queue's bookkeeping is lost.
        assert!(!c.req_to(0, Executing { op_len: 0 }, &mut ctx));
        assert!(matches!(c.state(), super::ConnState::Closing | super::ConnState::Closed));
        assert!(c.close_reason().is_some_and(|r| r.starts_with("internal error")), "{:?}", c.close_reason());
    }
}
