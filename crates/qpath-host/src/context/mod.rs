//! Completion contexts: one per thread, owning an io_uring and the I/O
//! queues it drives (blk-mq's hardware contexts and their interrupt
//! vector rolled into one run-to-completion loop).
//!
//! ```text
//!   application thread
//!     submit(dev, op) ─► request slot ─► [multipath: Selector picks a path]
//!                     ─► tag (private per queue, or a share of a host-wide set)
//!                     ─► HostQueue::submit (bytes batched)
//!     poll(wait)      ─► flush batches ─► io_uring_enter ─► recv/send completions
//!                     ◄─ completions(): (token, status, buffer)
//!   controller admin thread ── QueueMsg (new connection after reconnect) ──► mailbox
//! ```
//!
//! Everything on the I/O path happens on the context's thread: no lock, no
//! allocation (request slots, tags, send batches and receive buffers are
//! preallocated and reused), no wakeup of another thread. A context may own
//! several queues (of one controller or many): seed 004's "more queues than
//! completion vectors".
//!
//! The decisions (request slots, tags, routing, failover, holds, timeouts) are the block
//! core's ([`blockcore`]), which has no ring, socket, mailbox or clock: this context owns
//! those around it, reads the clock once per poll turn and passes it in.
//!
//! Failures: a queue that fails gives its commands back with a path error.
//! On a single-path device they wait for the controller to reconnect (or fail
//! after fast_io_fail_tmo / ctrl_loss_tmo, as Linux). On a multipath head they
//! go to another path at once; with no usable path they wait for one.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blk::{ContextId, ContextMap, Direction, QueueMap, QueueStats, QueueTags, SharedTagSet, TagUser};
use nvme::{Nsid, Status};
use uring::conn::{ConnOps, OpKind, Token};
use uring::{Completion as RingCompletion, IoBuf, Mailbox, MailboxSender, Payload, Ring, RingConfig, Wait};

use crate::control::Control;
use crate::controller::{Controller, QueueMsg};
use crate::error::{Error, ErrorKind, Result};
use crate::head::{Head, ReferenceSelector, class_of};
use crate::mpath::{Outcome, PathClass, PathIndex, Selection, Selector};
use crate::queue::{HostQueue, QueueState};
use crate::stats::{DeviceView, HostStats, QueueView, STATS_INTERVAL_DEFAULT};

pub mod blockcore;
pub mod ctrlview;
mod req;

pub use blockcore::{BlockCore, PathAttach};
use ctrlview::CoreController;

/// An I/O operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read into the buffer.
    Read,
    /// Write from the buffer.
    Write,
    /// Write from the buffer with Force Unit Access: the data is on non-volatile media
    /// when the write completes (NVM Command Set 1.0 §3.2.6, CDW12 bit 30), so a
    /// volatile write cache needs no Flush after it for this range.
    WriteFua,
    /// Flush the volatile write cache.
    Flush,
    /// Write zeroes (no buffer).
    WriteZeroes,
    /// Write zeroes with Force Unit Access (NVM Command Set 1.0 §3.2.8: Write Zeroes
    /// carries FUA in CDW12 bit 30 as Write does).
    WriteZeroesFua,
    /// Deallocate (discard) the range (no buffer). Dataset Management has no FUA bit:
    /// a caller that needs a deallocation durable follows it with a Flush.
    Deallocate,
}

impl Op {
    fn direction(self) -> Direction {
        match self {
            Op::Read => Direction::Read,
            Op::Write | Op::WriteFua | Op::WriteZeroes | Op::WriteZeroesFua => Direction::Write,
            Op::Deallocate => Direction::Trim,
            Op::Flush => Direction::Sync,
        }
    }

    /// Whether the command carries Force Unit Access.
    pub fn fua(self) -> bool {
        matches!(self, Op::WriteFua | Op::WriteZeroesFua)
    }

    /// Whether the caller's buffer carries the data (a read's or a write's).
    pub fn has_data(self) -> bool {
        matches!(self, Op::Read | Op::Write | Op::WriteFua)
    }
}

/// A finished I/O.
#[derive(Debug)]
pub struct Completion {
    /// The caller's token.
    pub token: u64,
    /// NVMe status (success, or why it failed).
    pub status: Status,
    /// The caller's buffer, back.
    pub buf: Option<IoBuf>,
    /// Submit to completion, ns.
    pub latency_ns: u64,
}

/// A device opened in a context: a namespace through one controller, or a multipath head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(pub u32);

/// How a context runs.
#[derive(Clone, Debug)]
pub struct ContextOptions {
    /// Pin the thread that creates the context to this CPU (also picks its default queue).
    pub cpu: Option<usize>,
    /// Requests in flight at most (submissions beyond it are refused with `Busy`).
    pub max_requests: usize,
    /// io_uring submission queue entries.
    pub ring_entries: u32,
    /// A request outstanding longer than this resets its controller (Linux `io_timeout`, 30 s).
    pub io_timeout: Duration,
    /// Retries of an I/O on a single-path device after transport failures.
    pub max_retries: u32,
    /// Path changes an I/O of a multipath head may go through before it fails.
    pub max_failovers: u32,
    /// An I/O outstanding longer than this is reported once (controller,
    /// queue, command id, opcode, age, queue state): see [`Context::take_stall_reports`].
    pub stall_threshold: Duration,
    /// Publish this context's per-queue, per-path and per-namespace statistics
    /// here (`qpath stats`, `/metrics`): copied every `stats_interval` and when
    /// the context is dropped, never per I/O.
    pub stats: Option<Arc<HostStats>>,
    /// How often statistics are published to `stats` (default 100 ms).
    pub stats_interval: Duration,
    /// Draw every device's tags from this host-wide shared set instead of
    /// each queue's own tags (seed 003). The controllers must be connected
    /// with `ConnectOptions::tag_space` ≥ the set's depth.
    pub shared_tags: Option<Arc<SharedTagSet>>,
    /// With a shared tag set: whether a device's depth limit (`open_limited`)
    /// caps the tags it holds, or is a dispatch budget taken after the tag.
    pub depth_limit_order: DepthLimitOrder,
    /// How long a blocking [`Context::poll`] that sends commands may hold the sends'
    /// completions while it waits for a response or a request of the owner's
    /// ([`uring::RingConfig::send_hold`]): a batch's send completes inside the system
    /// call that submits it, and waking for that alone cost a second system call per
    /// batch (ublk, NBD). Only while at least two requests are in flight: at QD1 the
    /// response is the next completion anyway, and the thread is better awake for it.
    /// Linux 6.12+; `None` wakes for the send alone.
    pub send_hold: Option<Duration>,
    /// A blocking [`Context::poll`] with answers due on several sockets waits for one
    /// receive on each (within [`ContextOptions::send_hold`], or twice their latency when
    /// that is longer) instead of waking for the first: one wake-up per batch spread over
    /// several paths, for an owner that passes completions on in batches anyway (the ublk
    /// server). Off by default: an owner that sends a new command for each completion
    /// (qpath bench) would leave the first socket's queue idle while the turn waits.
    pub wait_every_path: bool,
}

/// Where a device's queue-depth limit (its LUN queue depth, [`Context::open_limited`])
/// applies when the context draws tags from a shared set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DepthLimitOrder {
    /// The limit caps the tags the device holds: a device at its limit takes no
    /// more tags, so the rest of the set stays free for the other devices.
    #[default]
    BeforeTag,
    /// Linux SCSI's order (seed 003): a request takes a tag from the whole set
    /// first, then waits for the device's budget (`scsi_mq_get_budget`) while
    /// holding it. A device with a deep queue can then sit on every tag with
    /// requests that wait for its own budget. A baseline for seed 003's lab: built
    /// only with the `lab-baselines` feature.
    #[cfg(feature = "lab-baselines")]
    AfterTag,
}

/// Whether [`DepthLimitOrder`] has its `AfterTag` baseline: without it no device has
/// a budget, and the budget checks on the I/O path fold away.
const AFTER_TAG_BUILT: bool = cfg!(feature = "lab-baselines");

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            cpu: None,
            max_requests: 4096,
            ring_entries: 256,
            io_timeout: Duration::from_secs(30),
            max_retries: 5,
            max_failovers: 1000,
            stall_threshold: Duration::from_secs(5),
            stats: None,
            stats_interval: STATS_INTERVAL_DEFAULT,
            shared_tags: None,
            depth_limit_order: DepthLimitOrder::BeforeTag,
            send_hold: Some(uring::SEND_HOLD_DEFAULT),
            wait_every_path: false,
        }
    }
}

/// The kind bits of a ring token ([`uring::conn::Token`]) of an operation the context's
/// owner queued on its ring ([`Context::ring`]); the other 60 bits are the owner's.
const USER_KIND: u64 = OpKind::User as u64;

/// A connection's socket side, kept by the context under the key of its queue in the
/// block core ([`QueueConn`]).
struct Conn {
    stream: TcpStream,
    /// Its receive and send in flight, and its life: once it fails it closes (detached
    /// from its queue entry) and is freed when nothing of it is in flight.
    ops: ConnOps,
    /// A re-authentication's command, sent beside the I/O under the reserved tag.
    control: Control,
}

/// A connection's queue, in the block core.
struct QueueConn {
    q: HostQueue,
    /// The controller's connection generation this queue belongs to: once the
    /// controller resets (the generation moves on), the queue is dead even if its
    /// socket is not (a link that went down fails nothing for minutes).
    ctrl_generation: u64,
    qkey: usize,
    /// Not failed yet (its socket side closes at the same time: [`ConnOps::close`]).
    open: bool,
    /// Its commands' send-to-completion time, moving average (ns; 0 before the first):
    /// whether a blocking poll waits for its answers too ([`wake_needs`]).
    latency_ewma_ns: u64,
    /// When it last made progress: its last answer, or the send that gave an idle
    /// connection work (what [`stalled`] measures from); the core's nanoseconds.
    progress_at: u64,
}

impl QueueConn {
    /// Folds one command's send-to-completion time into [`QueueConn::latency_ewma_ns`]
    /// (weight 1/8, as TCP's smoothed RTT, RFC 6298); the answer is progress at `now`.
    fn record_latency(&mut self, ns: u64, now: u64) {
        self.latency_ewma_ns = latency_average(self.latency_ewma_ns, ns);
        self.progress_at = now;
    }
}

/// Whether a connection with commands outstanding has answered nothing for longer than
/// [`WAIT_LATENCY_RATIO_MAX`] times its latency average `avg_ns` (0: no answer yet, never
/// stalled): a blocking poll stops waiting for its answers beside the others' ([`wake_needs`]),
/// so a path that went silent (a dead link, a hung controller) delays the others' answers by
/// one hold at most, not at every wake until its keep-alive gives it up.
fn stalled(avg_ns: u64, since_progress_ns: u64) -> bool {
    avg_ns > 0 && since_progress_ns > avg_ns.saturating_mul(WAIT_LATENCY_RATIO_MAX)
}

/// A latency average `avg` (0: none yet) with one more sample `ns`, weight 1/8; never 0.
fn latency_average(avg: u64, ns: u64) -> u64 {
    if avg == 0 { ns.max(1) } else { (avg - avg / 8).saturating_add(ns / 8).max(1) }
}

struct QEntry<C> {
    ctrl: Arc<C>,
    index: u16,
    conn: Option<usize>,
    entries: u16,
    tags: QueueTags,
    /// Requests bound to this queue waiting for a tag or a connection.
    waiting: VecDeque<u32>,
    in_flush_list: bool,
    stats: QueueStats,
}

struct LocalPath<C> {
    ctrl: Arc<C>,
    nsid: Nsid,
    qkey: usize,
    /// An ANA error was seen: the path counts as transient until the controller's change count moves.
    suspect_at: Option<u64>,
    /// The namespace under `nsid` through this controller is not the device's any more
    /// (other identifiers): the path is out of the path set.
    other_ns: bool,
}

impl<C> LocalPath<C> {
    fn new(ctrl: Arc<C>, nsid: Nsid, qkey: usize) -> LocalPath<C> {
        LocalPath { ctrl, nsid, qkey, suspect_at: None, other_ns: false }
    }
}

struct Multi<C: CoreController> {
    head: Arc<C::Head>,
    sel: Selector,
    /// Seed 000's shared selectors, when the head runs one instead of `sel`.
    reference: Option<ReferenceSelector>,
    /// Bumped whenever `reference` changes: a completion is counted down only by
    /// the reference that counted its submission.
    ref_gen: u32,
    paths: Vec<Option<LocalPath<C>>>,
    /// The view the selector was last given (head generation, controller changes, local state).
    seen: u64,
    seen_head: u64,
    /// I/Os completed on each path slot (not counting path errors).
    ios: Vec<u64>,
    /// Their lengths, summed (bytes).
    bytes: Vec<u64>,
}

impl<C: CoreController> Multi<C> {
    #[inline]
    fn select(&mut self) -> Selection {
        match &self.reference {
            None => self.sel.select(),
            Some(r) => r.select(),
        }
    }

    /// Counts a submission; returns the generation of the reference selector
    /// that counted it too (0 = none): its completion must be counted down by
    /// that same reference, and by no other.
    #[inline]
    fn on_submit(&mut self, path: PathIndex, qkey: usize) -> u32 {
        // The local selector keeps counting under a reference too, so switching back is exact.
        self.sel.on_submit(path);
        match &self.reference {
            None => 0,
            Some(r) => {
                r.on_submit(path, qkey);
                self.ref_gen
            }
        }
    }

    #[inline]
    fn on_complete(&mut self, path: PathIndex, qkey: usize, latency_ns: u64, outcome: Outcome, counted_by: u32) {
        self.sel.on_complete(path, latency_ns, outcome);
        if let Some(r) = &self.reference
            && counted_by != 0
            && counted_by == self.ref_gen
        {
            r.on_complete(path, qkey);
        }
    }
}

/// How a device opened over several queues of one context picks the queue of
/// each submission ([`Context::open_spread`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueSpread {
    /// Submission k goes to queue k mod N: one submitter's commands over all the queues.
    RoundRobin,
    /// Submitter s of `submitters` goes to queue `s * N / submitters` (blk's
    /// contiguous CPU → queue map): each submitter keeps to its own queue, as each
    /// CPU does on blk-mq. [`Context::submit`] submits as the context's CPU.
    BySubmitter {
        /// How many submitters (CPUs, streams) the map covers.
        submitters: usize,
    },
}

/// A single-path device spread over several queues of one controller.
struct SpreadDev {
    nsid: Nsid,
    /// The context's queue keys, in queue order.
    qkeys: Box<[usize]>,
    /// Submitter → position in `qkeys` (`BySubmitter`); empty for round robin.
    map: Box<[u16]>,
    next: usize,
}

impl SpreadDev {
    #[inline]
    fn pick(&mut self, submitter: u32) -> usize {
        if self.map.is_empty() {
            let k = self.next;
            self.next = if k + 1 == self.qkeys.len() { 0 } else { k + 1 };
            self.qkeys[k]
        } else {
            let s = submitter as usize;
            let i = self.map.get(s).copied().unwrap_or_else(|| self.map[s % self.map.len()]);
            self.qkeys[usize::from(i)]
        }
    }
}

enum DevKind<C: CoreController> {
    Single {
        qkey: usize,
        nsid: Nsid,
    },
    /// One namespace over several queues of this context (seed 004).
    Spread(Box<SpreadDev>),
    Multi(Box<Multi<C>>),
}

struct DevEntry<C: CoreController> {
    kind: DevKind<C>,
    block_shift: u8,
    nsze: u64,
    /// The change counts of the device's controllers (folded) when `nsze` was last
    /// re-read ([`BlockCore::refresh_sizes`]): a namespace resized (Namespace Attribute
    /// Changed, a rescan) moves them.
    size_seen: u64,
    /// The identifiers of the namespace the device was opened on (`None`: not known).
    ids: Option<ctrlview::NsIds>,
    /// Whether that namespace is still there ([`blockcore::identity`]).
    presence: blockcore::identity::NsPresence,
    /// Requests waiting for a path (multipath) or a shared tag.
    waiting: VecDeque<u32>,
    /// This device's share of the host-wide tag set, if one is used.
    tags: Option<TagUser>,
    /// `DepthLimitOrder::AfterTag`: the device's depth limit, taken after the tag.
    budget: Option<u16>,
    /// Requests of this device holding budget (on the wire).
    budget_used: u16,
    /// Requests holding a tag, waiting for budget.
    budget_waiting: VecDeque<u32>,
}

/// An I/O that has been outstanding longer than the stall threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallReport {
    /// Controller address.
    pub traddr: std::net::SocketAddr,
    /// Controller id.
    pub cntlid: u16,
    /// Queue id (index + 1).
    pub qid: u16,
    /// Command id (tag).
    pub cid: u16,
    /// Opcode.
    pub opcode: u8,
    /// Time since the command was sent.
    pub age: Duration,
    /// The queue's state: commands outstanding on it and whether it is connected.
    pub queue_outstanding: usize,
    /// Whether the queue had a live connection.
    pub queue_connected: bool,
}

/// A per-thread completion context: the block core ([`BlockCore`]) inside the ring, the
/// sockets, the mailbox and the clock.
pub struct Context {
    ring: Ring,
    mailbox: Mailbox<QueueMsg>,
    sender: MailboxSender<QueueMsg>,
    /// The sockets of the core's connections, under the same keys.
    conns: Vec<Option<Conn>>,
    conn_gen: u64,
    core: BlockCore<Controller>,
    ring_done: Vec<RingCompletion>,
    /// Completions of the owner's own ring operations ([`Context::user_token`]).
    user_done: Vec<RingCompletion>,
    /// The last tick's time, in the core's nanoseconds ([`BlockCore::now_ns`]).
    last_tick_ns: u64,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("queues", &self.core.queues.len())
            .field("devices", &self.core.devices.len())
            .finish()
    }
}

/// The period of [`BlockCore::tick`], ns.
const TICK_NS: u64 = 10_000_000;
/// Requests in flight from which a blocking poll holds its sends' completions
/// ([`ContextOptions::send_hold`]).
const SEND_HOLD_IN_FLIGHT_MIN: usize = 2;
/// A connection whose answers take more than this many times the fastest one's is not
/// waited for beside it ([`wake_needs`]): a slow path must not hold a fast one's answers.
const WAIT_LATENCY_RATIO_MAX: u64 = 2;
/// The longest hold [`wake_needs`] asks for, whatever the latencies.
const HOLD_MAX: Duration = Duration::from_millis(100);

/// What a blocking poll's wake-up is worth waiting for ([`uring::Ring::hold_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WakeNeed {
    /// Completions besides the turn's sends'; 0: do not hold.
    completions: u32,
    /// The minimum wait that bounds the hold; `None`: no hold.
    hold: Option<Duration>,
}

/// How many completions besides its sends' a blocking poll's wake-up is worth waiting for,
/// and how long to hold them at most, given the requests in flight, the configured hold
/// ([`ContextOptions::send_hold`]), the turn's timeout and, for each open connection with
/// commands outstanding and its receive armed, its latency average (ns, 0 before the first
/// answer).
///
/// - Below [`SEND_HOLD_IN_FLIGHT_MIN`] requests: no hold (at QD1 the answer is the next
///   completion, and holding cost a wake-up from idle).
/// - With `every_path` ([`ContextOptions::wait_every_path`]), one receive completes per
///   socket with answers due: with several paths a batch's
///   answers come in on several sockets, and waking for the first costs one more system
///   call for each of the others. A connection counts only within
///   [`WAIT_LATENCY_RATIO_MAX`] times the fastest's average, so a slow path (a delayed link,
///   a busy controller) is not waited for beside a fast one. Without it, one completion
///   (the first answer) besides the sends'.
/// - The hold (io_uring's minimum wait, from the start of the wait: after it any completion
///   ends the wait) is twice the slowest counted connection's average, at least the
///   configured hold, at most half the turn's timeout and [`HOLD_MAX`]: a hold shorter than
///   the answers take ends with the sends' completions alone (a wake for nothing), so on a
///   slow network (a VM, a WAN) it follows the latency; on a fast one it stays the
///   configured hold, which is then all a stalled counted path can delay the others by.
fn wake_needs(
    in_flight: usize,
    conns: impl Iterator<Item = u64> + Clone,
    hold: Option<Duration>,
    timeout: Option<Duration>,
    every_path: bool,
) -> WakeNeed {
    if in_flight < SEND_HOLD_IN_FLIGHT_MIN {
        return WakeNeed { completions: 0, hold: None };
    }
    let (Some(hold), Some(timeout)) = (hold, timeout) else { return WakeNeed { completions: 1, hold } };
    // Before its first answer a connection is taken to be as fast as the fastest.
    let fastest = conns.clone().filter(|&ns| ns > 0).min().unwrap_or(0);
    // Not waiting for every path: the first answer ends the wait, the fastest's.
    let bound = if every_path { fastest.saturating_mul(WAIT_LATENCY_RATIO_MAX) } else { fastest };
    let counted = conns.filter(|&ns| ns <= bound);
    let due = if every_path { counted.clone().count() } else { 1 };
    let slowest = counted.max().unwrap_or(0);
    let follow = Duration::from_nanos(slowest.saturating_mul(2));
    let hold = follow.min(HOLD_MAX).min(timeout / 2).max(hold);
    WakeNeed { completions: u32::try_from(due).unwrap_or(u32::MAX).max(1), hold: Some(hold) }
}

/// A path of a multipath device as this context sees it.
#[derive(Clone, Debug)]
pub struct PathReport {
    /// Slot.
    pub index: usize,
    /// Controller address.
    pub traddr: std::net::SocketAddr,
    /// I/Os this context completed on the path.
    pub ios: u64,
    /// The lengths of those I/Os, summed (bytes).
    pub bytes: u64,
    /// I/Os in flight on it now.
    pub in_flight: u32,
    /// The selector's view of the path.
    pub class: PathClass,
    /// The latency policy's EWMA, if any.
    pub latency_ewma_ns: Option<u64>,
}

impl Context {
    /// A context for the calling thread (pinned to `opts.cpu` if given).
    pub fn new(opts: ContextOptions) -> Result<Context> {
        if let Some(cpu) = opts.cpu {
            uring::pin_current_thread(cpu).map_err(|e| Error::io(format!("pin to CPU {cpu}"), &e))?;
        }
        let config = RingConfig { entries: opts.ring_entries, send_hold: opts.send_hold, ..RingConfig::default() };
        let mut ring = Ring::new(config).map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        let (sender, mailbox) =
            Mailbox::new(&mut ring).map_err(|e| Error::new(ErrorKind::Io, format!("mailbox: {e}")))?;
        let core = BlockCore::new(opts, Instant::now());
        Ok(Context {
            ring,
            mailbox,
            sender,
            conns: Vec::new(),
            conn_gen: 0,
            last_tick_ns: core.now_ns,
            core,
            ring_done: Vec::with_capacity(1024),
            user_done: Vec::with_capacity(256),
        })
    }

    /// The CPU this context prefers (for queue maps).
    pub fn cpu(&self) -> usize {
        self.core.opts.cpu.unwrap_or(0)
    }

    // ----------------------------------------------------------- topology

    /// Claims one I/O queue of `ctrl` for this context: the queue the CPU maps
    /// to (blk's contiguous spread over the controller's block queues) if
    /// free, else the next free one. Returns the queue's key in this context.
    pub fn attach(&mut self, ctrl: &Arc<Controller>) -> Result<usize> {
        if let Some(k) = self.core.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, ctrl)) {
            return Ok(k);
        }
        let n = ctrl.block_queue_count();
        let n16 = u16::try_from(n).map_err(|_| Error::new(ErrorKind::Invalid, "too many queues"))?;
        if n == 0 {
            return Err(Error::new(ErrorKind::Busy, "controller has no I/O queues"));
        }
        let cpus = uring::online_cpus().max(self.cpu() + 1);
        let pref = QueueMap::spread(cpus, n16).map(|m| usize::from(m.queue(self.cpu()).0)).unwrap_or(self.cpu() % n);
        let free = ctrl.free_queues();
        // Another thread's context may claim a queue between `free_queues` and the claim
        // (job threads attaching at once): try the free ones in order of preference
        // until a claim succeeds. Only the claim itself fails with Busy.
        for i in (0..n).map(|i| (pref + i) % n) {
            let Ok(i) = u16::try_from(i) else { continue };
            if !free.contains(&i) {
                continue;
            }
            match self.attach_index(ctrl, i) {
                Err(e) if e.kind == ErrorKind::Busy => continue,
                r => return r,
            }
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!("all {n} I/O queues of {} are owned by other contexts", ctrl.opts.traddr),
        ))
    }

    /// Claims I/O queue `index` of `ctrl` (several per controller are allowed:
    /// seed 004's N queues on one context).
    pub fn attach_index(&mut self, ctrl: &Arc<Controller>, index: u16) -> Result<usize> {
        let claimed = ctrl
            .claim_queue(index, self.sender.clone())
            .ok_or_else(|| Error::new(ErrorKind::Busy, format!("I/O queue {index} is taken or does not exist")))?;
        let qkey = self.core.add_queue(ctrl, index)?;
        self.core.rec.on_attach(qkey, ctrl, index);
        if let Some((stream, q, generation)) = claimed {
            self.install(qkey, stream, q, generation, Instant::now());
        }
        Ok(qkey)
    }

    fn install(&mut self, qkey: usize, stream: TcpStream, q: HostQueue, ctrl_generation: u64, now: Instant) {
        let _ = stream.set_nodelay(true);
        self.conn_gen = self.conn_gen.wrapping_add(1);
        let key = self.core.install(qkey, q, ctrl_generation, now);
        let conn = Conn {
            stream,
            ops: ConnOps::new(u32::try_from(key).expect("fewer than 2^32 connections"), self.conn_gen),
            control: Control::default(),
        };
        if self.conns.len() <= key {
            self.conns.resize_with(key + 1, || None);
        }
        self.conns[key] = Some(conn);
        self.arm_recv(key);
        self.settle_paths(now);
    }

    /// Claims a queue of the controllers the core's multipath devices gained paths on
    /// (a head changed), gives the paths their queues and re-reads the paths.
    fn settle_paths(&mut self, now: Instant) {
        if !self.core.has_attaches() {
            return;
        }
        let attaches = self.core.take_attaches();
        let mut devs = Vec::new();
        for a in attaches {
            if let Ok(qkey) = self.attach(&a.ctrl) {
                self.core.set_path(a.dev, a.slot, LocalPath::new(a.ctrl, a.nsid, qkey));
                devs.push(a.dev);
            }
        }
        devs.dedup();
        for d in devs {
            self.core.refresh_device(d, now);
        }
    }

    /// Opens namespace `nsid` of `ctrl` on this context (attaching a queue if needed).
    pub fn open(&mut self, ctrl: &Arc<Controller>, nsid: Nsid) -> Result<DeviceId> {
        self.open_limited(ctrl, nsid, None)
    }

    /// Opens a namespace with a per-device queue-depth limit (a LUN queue
    /// depth: only with a shared tag set, where it bounds this device's share).
    pub fn open_limited(&mut self, ctrl: &Arc<Controller>, nsid: Nsid, depth_limit: Option<u16>) -> Result<DeviceId> {
        let ns = ctrl.namespace(nsid).ok_or_else(|| Error::new(ErrorKind::Invalid, format!("no namespace {nsid}")))?;
        let qkey = self.attach(ctrl)?;
        self.open_on(qkey, nsid, ns.block_shift, ns.nsze, depth_limit)
    }

    /// Opens a namespace on a specific attached queue.
    pub fn open_on(
        &mut self,
        qkey: usize,
        nsid: Nsid,
        block_shift: u8,
        nsze: u64,
        depth_limit: Option<u16>,
    ) -> Result<DeviceId> {
        self.core.open_single(qkey, nsid, block_shift, nsze, depth_limit)
    }

    /// Claims `n` I/O queues of `ctrl` for this context, starting with the one
    /// [`Context::attach`] prefers (the CPU's) and going on through the free ones
    /// in index order. Queues this context already owns count. Returns their keys
    /// in queue-index order.
    pub fn attach_queues(&mut self, ctrl: &Arc<Controller>, n: usize) -> Result<Vec<usize>> {
        let total = ctrl.block_queue_count();
        if n == 0 || n > total {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{n} queues asked of a controller with {total} block-core I/O queues"),
            ));
        }
        self.attach(ctrl)?;
        let mut mine = self.queue_keys_of(ctrl);
        for i in 0..total {
            if mine.len() >= n {
                break;
            }
            let Ok(i) = u16::try_from(i) else { break };
            if mine.iter().any(|&k| self.core.queues[k].index == i) || !ctrl.free_queues().contains(&i) {
                continue;
            }
            match self.attach_index(ctrl, i) {
                Ok(k) => mine.push(k),
                Err(e) if e.kind == ErrorKind::Busy => {}
                Err(e) => return Err(e),
            }
        }
        if mine.len() < n {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("only {} of {n} I/O queues of {} are free for this context", mine.len(), ctrl.opts.traddr),
            ));
        }
        mine.sort_by_key(|&k| self.core.queues[k].index);
        mine.truncate(n);
        Ok(mine)
    }

    /// Claims the queues `map` deals to context `me` (queues → completion
    /// contexts: blk's [`ContextMap`], seed 004). The map must cover exactly the
    /// controller's block-core queues. Returns their keys in queue-index order.
    pub fn attach_mapped(&mut self, ctrl: &Arc<Controller>, map: &ContextMap, me: ContextId) -> Result<Vec<usize>> {
        let total = ctrl.block_queue_count();
        if map.nr_queues() != total {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("the context map covers {} queues; the controller has {total}", map.nr_queues()),
            ));
        }
        let mut keys = Vec::new();
        for q in map.queues_of(me) {
            keys.push(self.attach_index(ctrl, q.0)?);
        }
        Ok(keys)
    }

    /// Keys of this context's queues of `ctrl`.
    fn queue_keys_of(&self, ctrl: &Arc<Controller>) -> Vec<usize> {
        (0..self.core.queues.len()).filter(|&k| Arc::ptr_eq(&self.core.queues[k].ctrl, ctrl)).collect()
    }

    /// Opens namespace `nsid` over several of this context's queues (of one
    /// controller, from [`Context::attach_queues`] or [`Context::attach_mapped`]):
    /// each submission goes to one of them as `spread` says, and waits on that
    /// queue if it is reconnecting. Seed 004's "more queues than completion
    /// vectors": the queues are independent connections, reaped by this one context.
    pub fn open_spread(&mut self, qkeys: &[usize], nsid: Nsid, spread: QueueSpread) -> Result<DeviceId> {
        let Some(&first) = qkeys.first() else {
            return Err(Error::new(ErrorKind::Invalid, "a spread device needs at least one queue"));
        };
        if qkeys.iter().any(|&k| k >= self.core.queues.len()) {
            return Err(Error::new(ErrorKind::Invalid, "no such queue"));
        }
        let ctrl = Arc::clone(&self.core.queues[first].ctrl);
        if qkeys.iter().any(|&k| !Arc::ptr_eq(&self.core.queues[k].ctrl, &ctrl)) {
            return Err(Error::new(ErrorKind::Invalid, "a spread device's queues belong to one controller"));
        }
        let n = u16::try_from(qkeys.len()).map_err(|_| Error::new(ErrorKind::Invalid, "too many queues"))?;
        let ns = ctrl.namespace(nsid).ok_or_else(|| Error::new(ErrorKind::Invalid, format!("no namespace {nsid}")))?;
        let map: Box<[u16]> = match spread {
            QueueSpread::RoundRobin => Box::new([]),
            QueueSpread::BySubmitter { submitters } => {
                let m = QueueMap::spread(submitters, n).map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
                (0..submitters).map(|s| m.queue(s).0).collect()
            }
        };
        let dev = SpreadDev { nsid, qkeys: qkeys.into(), map, next: 0 };
        self.core.new_device(DevKind::Spread(Box::new(dev)), ns.block_shift, ns.nsze, None)
    }

    /// Opens a multipath head: attaches a queue of every path's controller whose namespace
    /// is the head's. A path whose controller lists another namespace under the NSID (other
    /// identifiers: the target replaced it since the head was made) is left out, and with no
    /// path left to the head's namespace the open is refused: a device made for a namespace
    /// never reaches another one (an NBD client connecting, a ublk queue starting).
    pub fn open_head(&mut self, head: &Arc<Head>) -> Result<DeviceId> {
        let slots = head.paths();
        let mut paths = Vec::with_capacity(slots.len());
        let mut geometry = None;
        let mut replaced = None;
        for s in &slots {
            paths.push(match s {
                Some((c, nsid)) => {
                    let ns = c.namespace(*nsid);
                    if head.uid != [0; 16]
                        && let Some(n) = ns.as_ref().filter(|n| n.unique_id() != Some(head.uid))
                    {
                        tracing::warn!(
                            traddr = %c.opts.traddr, nsid = n.nsid.0,
                            "the namespace under the NSID through this path is not the one the device was made for \
                             (other identifiers): the path is left out"
                        );
                        replaced = Some(n.nsid);
                        None
                    } else {
                        if geometry.is_none()
                            && let Some(ns) = ns
                        {
                            geometry = Some((ns.block_shift, ns.nsze));
                        }
                        let qkey = self.attach(c)?;
                        Some((Arc::clone(c), *nsid, qkey))
                    }
                }
                None => None,
            });
        }
        let (block_shift, nsze) = geometry.ok_or_else(|| match replaced {
            Some(nsid) => Error::new(
                ErrorKind::NamespaceGone,
                format!(
                    "namespace {} of {} was replaced by another namespace under the same NSID: it is not the one \
                     the device was made for",
                    nsid.0, head.subnqn
                ),
            ),
            None => Error::new(
                ErrorKind::Invalid,
                "no path's controller lists the namespace (removed from the target, or not visible to this host)",
            ),
        })?;
        let now = Instant::now();
        let id = self.core.open_multi(head, paths, block_shift, nsze, self.cpu(), now)?;
        self.settle_paths(now);
        Ok(id)
    }

    /// Block size of a device.
    pub fn block_size(&self, dev: DeviceId) -> u32 {
        self.core.devices.get(dev.0 as usize).map_or(512, |d| 1 << d.block_shift)
    }

    /// Capacity of a device in bytes.
    pub fn capacity(&self, dev: DeviceId) -> u64 {
        self.core.devices.get(dev.0 as usize).map_or(0, |d| d.nsze << d.block_shift)
    }

    /// Tags a device holds from the shared set now (in flight, waiting for
    /// budget, or kept in its window); `None` without a shared set.
    pub fn tags_held(&self, dev: DeviceId) -> Option<u16> {
        self.core.devices.get(dev.0 as usize)?.tags.as_ref().map(TagUser::held)
    }

    /// The time this context last read the clock: the last poll turn's (taken right after
    /// the turn reaped) or a later submission's. A caller that just polled may use it
    /// instead of reading the clock again; it is never later than now.
    pub fn last_clock(&self) -> Instant {
        self.core.now
    }

    /// Requests in flight (waiting or on the wire).
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// Per-queue statistics: (controller address, queue index, stats).
    pub fn queue_stats(&self) -> impl Iterator<Item = (std::net::SocketAddr, u16, &QueueStats)> {
        self.core.queues.iter().map(|q| (q.ctrl.opts.traddr, q.index, &q.stats))
    }

    /// Publishes this context's statistics to its [`HostStats`] now (waiting
    /// for readers), so they are exact until the next I/O. Contexts also publish
    /// every `stats_interval` while polled, and when dropped.
    pub fn publish_stats(&mut self) {
        self.publish(true);
    }

    /// Copies the statistics that changed since the last publish into the
    /// hub's slots (control plane: every `stats_interval`, not per I/O).
    fn publish(&mut self, force: bool) {
        if !self.core.rec.enabled() {
            return;
        }
        for (qkey, qe) in self.core.queues.iter().enumerate() {
            let conn = qe.conn.and_then(|k| self.core.conns.get(k)).and_then(Option::as_ref);
            let view = QueueView {
                stats: &qe.stats,
                outstanding: conn.map_or(0, |c| c.q.outstanding()),
                waiting: qe.waiting.len(),
                connected: conn.is_some(),
                secure_channel: conn.and_then(|c| c.q.secure_channel_parts()),
            };
            self.core.rec.publish_queue(qkey, &view, force);
        }
        let queues = &self.core.queues;
        let ctrl_of = |qkey: usize| queues.get(qkey).map(|q| &q.ctrl);
        for (dev, d) in self.core.devices.iter().enumerate() {
            let view = DeviceView { multipath: matches!(d.kind, DevKind::Multi(_)), ctrl_of: &ctrl_of };
            self.core.rec.publish_device(dev, &view, force);
        }
        self.core.rec.published(Instant::now());
    }

    /// The paths of a multipath device, as this context has used them.
    pub fn path_report(&self, dev: DeviceId) -> Vec<PathReport> {
        let Some(DevEntry { kind: DevKind::Multi(m), .. }) = self.core.devices.get(dev.0 as usize) else {
            return Vec::new();
        };
        m.paths
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                let idx = PathIndex(u16::try_from(i).ok()?);
                Some(PathReport {
                    index: i,
                    traddr: p.ctrl.opts.traddr,
                    ios: m.ios.get(i).copied().unwrap_or(0),
                    bytes: m.bytes.get(i).copied().unwrap_or(0),
                    in_flight: if i < m.sel.paths() { m.sel.in_flight(idx) } else { 0 },
                    class: class_of(&p.ctrl, p.nsid),
                    latency_ewma_ns: if i < m.sel.paths() { m.sel.latency_ewma_ns(idx) } else { None },
                })
            })
            .collect()
    }

    // ----------------------------------------------------------- submission

    /// Submits an I/O of `len` bytes at byte `offset` (both multiples of the
    /// block size). The buffer is needed for reads and writes; it comes back
    /// in the completion. On refusal the buffer comes back at once.
    pub fn submit(
        &mut self,
        dev: DeviceId,
        op: Op,
        offset: u64,
        len: u32,
        buf: Option<IoBuf>,
        token: u64,
    ) -> std::result::Result<(), (Error, Option<IoBuf>)> {
        let me = u32::try_from(self.cpu()).unwrap_or(0);
        self.submit_from(dev, me, op, offset, len, buf, token)
    }

    /// [`Context::submit`] for a caller that has just read the clock: `now` (when the
    /// caller prepared the I/O, at most a moment ago) is the request's submission time,
    /// which its latency and its timeout count from, instead of one more clock read.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_at(
        &mut self,
        dev: DeviceId,
        op: Op,
        offset: u64,
        len: u32,
        buf: Option<IoBuf>,
        token: u64,
        now: Instant,
    ) -> std::result::Result<(), (Error, Option<IoBuf>)> {
        let me = u32::try_from(self.cpu()).unwrap_or(0);
        self.core.submit(dev, me, op, offset, len, buf, token, now)
    }

    /// [`Context::submit`] on behalf of `submitter` (a CPU or stream): a device
    /// opened with [`QueueSpread::BySubmitter`] sends it on that submitter's queue;
    /// other devices ignore it.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_from(
        &mut self,
        dev: DeviceId,
        submitter: u32,
        op: Op,
        offset: u64,
        len: u32,
        buf: Option<IoBuf>,
        token: u64,
    ) -> std::result::Result<(), (Error, Option<IoBuf>)> {
        self.core.submit(dev, submitter, op, offset, len, buf, token, Instant::now())
    }

    // ------------------------------------------------------------- polling

    /// Sends queued commands, waits per `wait`, processes what completed.
    /// Returns how many completions are ready in [`Context::completions`] and
    /// [`Context::user_completions`].
    pub fn poll(&mut self, wait: Wait) -> Result<usize> {
        self.flush();
        let wait = if self.core.done.is_empty() && self.user_done.is_empty() { wait } else { Wait::Poll };
        // A batch's send completion is held only while several requests are out: with one,
        // the response is the very next completion, and sleeping inside the submitting call
        // to save the second system call made QD1 slower (a wake-up from idle per I/O).
        // With answers due on several sockets the turn waits for one receive on each.
        let need = self.wake_needs(wait);
        self.ring.hold_for(need.completions, need.hold);
        let mut rd = std::mem::take(&mut self.ring_done);
        let r = self.ring.turn(wait, |_, c| rd.push(c));
        // Everything this turn reaped completed by now; what it issues goes out with the
        // next turn. The one clock read of the turn: the core gets it with every call.
        let now = Instant::now();
        for c in rd.drain(..) {
            self.on_ring(c);
        }
        self.ring_done = rd;
        r.map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        let mut msgs = Vec::new();
        self.mailbox.drain(|m| msgs.push(m));
        for m in msgs {
            self.on_msg(m, now);
        }
        self.service_touched(now);
        self.core.refresh_sizes();
        self.core.refresh_all_paths(now);
        self.settle_paths(now);
        self.flush();
        // The core's clock is the turn's (`refresh_all_paths` gave it `now`): one subtraction.
        if self.core.now_ns.saturating_sub(self.last_tick_ns) >= TICK_NS {
            self.last_tick_ns = self.core.now_ns;
            self.core.tick(now);
            if self.core.rec.due(now) {
                self.publish(false);
            }
        }
        Ok(self.core.done.len() + self.user_done.len())
    }

    /// [`wake_needs`] for the next turn.
    fn wake_needs(&self, wait: Wait) -> WakeNeed {
        let timeout = match wait {
            Wait::Block { timeout } => timeout,
            Wait::Poll => None,
        };
        let now = self.core.now_ns;
        let due = self.core.conns.iter().enumerate().filter_map(move |(key, qc)| {
            let qc = qc.as_ref()?;
            let armed = self.conns.get(key).and_then(Option::as_ref).is_some_and(|c| c.ops.recv_in_flight());
            let silent = now.saturating_sub(qc.progress_at);
            (qc.open && armed && qc.q.outstanding() > 0 && !stalled(qc.latency_ewma_ns, silent))
                .then_some(qc.latency_ewma_ns)
        });
        let opts = &self.core.opts;
        wake_needs(self.in_flight(), due, opts.send_hold, timeout, opts.wait_every_path)
    }

    /// Services the connections the turn touched: shallow connections' completions first
    /// (see [`BlockCore::conn_is_deep`]), then the rest and whatever servicing touched on
    /// the way.
    fn service_touched(&mut self, now: Instant) {
        if self.core.touched.is_empty() {
            return;
        }
        let mut touched = std::mem::take(&mut self.core.touched);
        for slot in touched.iter_mut() {
            if !self.core.conn_is_deep(*slot) {
                self.service(*slot, now);
                *slot = usize::MAX;
            }
        }
        let mut i = 0;
        while i < touched.len() {
            if touched[i] != usize::MAX {
                self.service(touched[i], now);
            }
            i += 1;
            if !self.core.touched.is_empty() {
                touched.append(&mut self.core.touched);
            }
        }
        touched.clear();
        self.core.touched = touched;
    }

    /// The context's ring, for the owner's own operations beside the NVMe/TCP queues (a
    /// block device's commands, a client socket): one thread, one ring, no handoff. Queue
    /// them with tokens from [`Context::user_token`]; they go to the kernel with the next
    /// [`Context::poll`], and their completions come back in [`Context::user_completions`].
    pub fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    /// A ring token for an operation of the owner's: `value` keeps its low 60 bits.
    pub fn user_token(value: u64) -> u64 {
        (USER_KIND << 60) | (value & ((1 << 60) - 1))
    }

    /// The owner's value in a token from [`Context::user_token`].
    pub fn user_value(token: u64) -> u64 {
        token & ((1 << 60) - 1)
    }

    /// Completions of the owner's ring operations since the last drain.
    pub fn user_completions(&mut self) -> std::vec::Drain<'_, RingCompletion> {
        self.user_done.drain(..)
    }

    /// Stall reports since the last call (each stalled I/O is reported once).
    pub fn take_stall_reports(&mut self) -> Vec<StallReport> {
        std::mem::take(&mut self.core.stalls)
    }

    /// Completed I/Os since the last drain.
    pub fn completions(&mut self) -> std::vec::Drain<'_, Completion> {
        self.core.done.drain(..)
    }

    /// Polls (spinning) until at least one completion is ready or `timeout` passes.
    pub fn wait_one(&mut self, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll(Wait::Poll)?;
            if n > 0 || Instant::now() >= deadline {
                return Ok(n);
            }
        }
    }

    /// Sends the batches of the queues that took commands since the last flush, shallow
    /// queues first (two passes over the flush list, never over all queues).
    fn flush(&mut self) {
        if self.core.flush_list.is_empty() {
            return;
        }
        let list = std::mem::take(&mut self.core.flush_list);
        for deep in [false, true] {
            for &qkey in &list {
                if let Some(ckey) = self.core.queues[qkey].conn
                    && self.core.queues[qkey].in_flush_list
                    && self.core.conn_is_deep(ckey) == deep
                {
                    self.send(ckey);
                }
            }
        }
        for &qkey in &list {
            self.core.queues[qkey].in_flush_list = false;
        }
        self.core.flush_list = list;
        self.core.flush_list.clear();
    }

    fn send(&mut self, ckey: usize) {
        let (Some(Some(c)), Some(Some(qc))) = (self.conns.get_mut(ckey), self.core.conns.get_mut(ckey)) else {
            return;
        };
        if !c.ops.may_send() {
            return;
        }
        let Some(msg) = qc.q.take_send() else { return };
        let fd = c.stream.as_raw_fd();
        let t = c.ops.token(OpKind::Send, 0);
        // Kernel TLS refuses MSG_WAITALL (the ring resubmits short sends either way).
        let sent =
            if qc.q.kernel_tls() { self.ring.send_without_waitall(fd, msg, t) } else { self.ring.send(fd, msg, t) };
        match sent {
            Ok(()) => c.ops.send_started(),
            Err((e, msg)) => {
                qc.q.on_send_done(msg, Err(std::io::Error::other(e.to_string())));
                self.core.touched.push(ckey);
            }
        }
    }

    fn arm_recv(&mut self, ckey: usize) {
        let (Some(Some(c)), Some(Some(qc))) = (self.conns.get_mut(ckey), self.core.conns.get_mut(ckey)) else {
            return;
        };
        if !c.ops.may_recv() {
            return;
        }
        let Some((buf, range)) = qc.q.take_recv_buf() else { return };
        let fd = c.stream.as_raw_fd();
        match self.ring.recv(fd, buf, range, c.ops.token(OpKind::Recv, 0)) {
            Ok(()) => c.ops.recv_started(),
            Err((e, buf)) => {
                qc.q.on_recv_none(buf);
                qc.q.set_failed(&format!("recv submit: {e}"));
                self.core.touched.push(ckey);
            }
        }
    }

    fn on_ring(&mut self, c: RingCompletion) {
        let Some(t) = Token::from_u64(c.token) else { return };
        if t.kind == OpKind::User {
            self.user_done.push(c);
            return;
        }
        let ckey = t.key as usize;
        let (Some(Some(conn)), Some(Some(qc))) = (self.conns.get_mut(ckey), self.core.conns.get_mut(ckey)) else {
            return;
        };
        if !conn.ops.owns(&t) {
            return;
        }
        match t.kind {
            OpKind::Recv => {
                conn.ops.recv_done();
                let res = c.io_result();
                if let Payload::Buf(mut buf) = c.payload {
                    match res {
                        Ok(n) => {
                            let len = buf.len();
                            buf.set_len(len - n);
                            qc.q.on_recv(buf, n);
                        }
                        Err(e) => {
                            qc.q.on_recv_none(buf);
                            if conn.ops.is_open() {
                                let why = qc.q.recv_error_text(&e);
                                qc.q.set_failed(&why);
                            }
                        }
                    }
                }
            }
            OpKind::Send => {
                conn.ops.send_done();
                let res = c.io_result().map(|_| ());
                if let Payload::Msg(m) = c.payload {
                    qc.q.on_send_done(m, res);
                }
            }
            OpKind::File | OpKind::User => return,
        }
        self.core.touched.push(ckey);
    }

    /// After a connection's completions: deliver finished commands, re-arm, handle failure.
    fn service(&mut self, ckey: usize, now: Instant) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        let Some(Some(qc)) = self.core.conns.get(ckey) else { return };
        let qkey = qc.qkey;
        let dying = !conn.ops.is_open();
        self.core.deliver(ckey, dying, now, |d| conn.control.complete(d));
        let Some(Some(qc)) = self.core.conns.get_mut(ckey) else { return };
        if qc.q.state() == QueueState::Failed && conn.ops.is_open() {
            self.fail_conn(ckey, now);
            return;
        }
        if !conn.ops.is_open() {
            if conn.ops.can_free() {
                // Nothing in flight on it: close now (the FIN must not wait for another turn).
                drop(self.conns[ckey].take());
                self.core.free_conn(ckey);
            } else if conn.ops.take_cancel() {
                let _ = self.ring.cancel_fd(conn.stream.as_raw_fd());
            }
            return;
        }
        if conn.control.is_waiting() {
            // Before anything of the caller's takes the entry that just came free.
            conn.control.retry(&mut qc.q);
        }
        self.arm_recv(ckey);
        if self.core.conns[ckey].as_ref().is_some_and(|c| c.q.has_pending_send()) {
            self.send(ckey);
        }
        self.core.dispatch_after_service(qkey, now);
    }

    /// A connection failed: its socket side closes and its control command fails; the
    /// core fails over or requeues its commands, and the controller resets.
    fn fail_conn(&mut self, ckey: usize, now: Instant) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        conn.ops.close();
        let Some(why) = self.core.abort_conn(ckey) else { return };
        conn.control.fail(&why);
        self.core.fail_conn(ckey, &why, now, |d| conn.control.complete(d));
    }

    fn on_msg(&mut self, m: QueueMsg, now: Instant) {
        match m {
            QueueMsg::Queue { ctrl, index, generation, stream, queue } => {
                let Some(qkey) = self.core.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, &ctrl) && q.index == index)
                else {
                    ctrl.release_queue(index, Some((stream, queue)));
                    return;
                };
                if let Some(old) = self.core.queues[qkey].conn {
                    // A reconnect raced a failure we had not noticed: retire the old connection.
                    self.fail_conn(old, now);
                }
                tracing::debug!(index, generation, "queue (re)connected");
                self.install(qkey, stream, queue, generation, now);
            }
            QueueMsg::Command { ctrl, index, generation, io, reply } => {
                let conn = self
                    .core
                    .queues
                    .iter()
                    .find(|q| Arc::ptr_eq(&q.ctrl, &ctrl) && q.index == index)
                    .and_then(|q| q.conn)
                    .filter(|&k| {
                        let open = self.conns.get(k).and_then(Option::as_ref).is_some_and(|c| c.ops.is_open());
                        open && self
                            .core
                            .conns
                            .get(k)
                            .and_then(Option::as_ref)
                            .is_some_and(|c| c.ctrl_generation == generation && c.q.state() == QueueState::Live)
                    });
                let Some(ckey) = conn else {
                    let _ = reply.send(Err(Error::new(
                        ErrorKind::Gone,
                        format!("queue {}: no live connection of that generation here", index + 1),
                    )));
                    return;
                };
                if let (Some(Some(c)), Some(Some(qc))) = (self.conns.get_mut(ckey), self.core.conns.get_mut(ckey)) {
                    c.control.offer(&mut qc.q, io, reply);
                }
                self.core.touched.push(ckey);
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Final numbers first: what a hub shows after this context is exact.
        self.publish(true);
        self.core.rec.retire();
        // Give idle connections back to their controllers so another context can claim them.
        for qkey in 0..self.core.queues.len() {
            let ckey = self.core.queues[qkey].conn.take();
            let index = self.core.queues[qkey].index;
            let ctrl = Arc::clone(&self.core.queues[qkey].ctrl);
            let conn = ckey.and_then(|k| {
                let c = self.conns.get_mut(k).and_then(Option::take)?;
                Some((c, self.core.conns.get_mut(k).and_then(Option::take)?))
            });
            match conn {
                Some((mut c, mut qc)) if qc.q.outstanding() == 0 && !c.ops.send_in_flight() => {
                    if c.ops.recv_in_flight() {
                        let _ = self.ring.cancel_fd(c.stream.as_raw_fd());
                        let deadline = Instant::now() + Duration::from_millis(200);
                        while c.ops.recv_in_flight() && Instant::now() < deadline {
                            let mut rd = Vec::new();
                            let _ = self
                                .ring
                                .turn(Wait::Block { timeout: Some(Duration::from_millis(10)) }, |_, x| rd.push(x));
                            for x in rd {
                                // Only this connection's receive (not another's, still in the ring).
                                if let Some(t) = Token::from_u64(x.token)
                                    && t.kind == OpKind::Recv
                                    && c.ops.owns(&t)
                                    && let Payload::Buf(b) = x.payload
                                {
                                    qc.q.on_recv_none(b);
                                    c.ops.recv_done();
                                }
                            }
                        }
                    }
                    if c.ops.recv_in_flight() {
                        ctrl.release_queue(index, None);
                    } else {
                        ctrl.release_queue(index, Some((c.stream, qc.q)));
                    }
                }
                _ => ctrl.release_queue(index, None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The block core's decisions that need no ring, socket or controller.

    use super::*;
    use crate::failover::{Disposition, disposition};
    use crate::mpath::PathState;

    fn opts(max_retries: u32, max_failovers: u32) -> ContextOptions {
        ContextOptions { max_retries, max_failovers, ..ContextOptions::default() }
    }

    #[test]
    fn a_blocking_poll_waits_for_one_receive_per_socket_with_answers_due_from_two_in_flight() {
        let ms = Duration::from_millis;
        let (hold, timeout) = (Some(ms(2)), Some(ms(20)));
        let us = |v: &[u64]| v.iter().map(|u| u * 1000).collect::<Vec<u64>>();
        let needs =
            |in_flight, lat: &[u64]| wake_needs(in_flight, us(lat).into_iter(), hold, timeout, true).completions;
        // QD1 keeps today's path: no hold at all, whatever the sockets.
        for every_path in [true, false] {
            let need = wake_needs(1, us(&[50, 60]).into_iter(), hold, timeout, every_path);
            assert_eq!(need, WakeNeed { completions: 0, hold: None });
        }
        assert_eq!(needs(0, &[]), 0);
        assert_eq!(needs(1, &[50]), 0, "one request cannot be on two sockets");
        // One socket with answers due: its sends and one more, as before.
        assert_eq!(needs(2, &[]), 1, "nothing outstanding on a socket: still one completion");
        assert_eq!(needs(16, &[50]), 1);
        // A batch spread over two or three paths: one receive on each.
        assert_eq!(needs(16, &[50, 60]), 2);
        assert_eq!(needs(16, &[50, 60, 100]), 3, "within 2x the fastest");
        assert_eq!(needs(16, &[0, 60]), 2, "no answer yet: counted as fast");
        assert_eq!(needs(16, &[0, 0]), 2);
        // A slow path is not waited for beside a fast one.
        assert_eq!(needs(32, &[500, 2500]), 1, "a path 2 ms slower (the mpath-delay lab)");
        assert_eq!(needs(32, &[50, 101]), 1, "just over 2x the fastest");
        assert_eq!(needs(32, &[50, 100, 101]), 2);
        // Without a hold configured or a timeout, nothing bounds a wait: one completion, as before.
        assert_eq!(
            wake_needs(16, us(&[50, 60]).into_iter(), None, timeout, true),
            WakeNeed { completions: 1, hold: None }
        );
        assert_eq!(wake_needs(16, us(&[50, 60]).into_iter(), hold, None, true).completions, 1);
        // An owner that did not ask to wait for every path: the first answer, as before.
        assert_eq!(wake_needs(16, us(&[50, 60]).into_iter(), hold, timeout, false), WakeNeed { completions: 1, hold });
        assert_eq!(wake_needs(16, us(&[0, 0]).into_iter(), hold, timeout, false).completions, 1, "no answers yet");
        let slow = wake_needs(16, us(&[3000, 4000]).into_iter(), hold, Some(Duration::from_millis(100)), false);
        assert_eq!(slow, WakeNeed { completions: 1, hold: Some(Duration::from_millis(6)) }, "the fastest's latency");
    }

    #[test]
    fn a_blocking_poll_holds_twice_the_slowest_counted_latency_between_the_configured_hold_and_half_its_timeout() {
        let ms = Duration::from_millis;
        let us = |v: &[u64]| v.iter().map(|u| u * 1000).collect::<Vec<u64>>();
        let hold = |lat: &[u64], timeout| wake_needs(16, us(lat).into_iter(), Some(ms(2)), Some(timeout), true).hold;
        // Loopback or LAN latencies: the configured hold, as before.
        assert_eq!(hold(&[50, 60], ms(20)), Some(ms(2)));
        assert_eq!(hold(&[50], ms(20)), Some(ms(2)));
        // Slower answers (a VM under emulation): twice the slowest counted, so the hold does
        // not end before the answers come; the slow path left out does not count.
        assert_eq!(hold(&[3000, 4000], ms(100)), Some(ms(8)));
        assert_eq!(hold(&[3000, 9000], ms(100)), Some(ms(6)), "9 ms is over 2x the fastest");
        // At most half the turn's timeout (the kernel ends a wait at the minimum wait when
        // there is no longer timeout) and HOLD_MAX.
        assert_eq!(hold(&[30_000, 40_000], ms(20)), Some(ms(10)));
        assert_eq!(hold(&[300_000], Duration::from_secs(10)), Some(HOLD_MAX));
        // Never below the configured hold (a timeout shorter than it: the ring holds nothing).
        assert_eq!(hold(&[30_000], ms(3)), Some(ms(2)));
    }

    #[test]
    fn a_connection_silent_for_more_than_twice_its_latency_is_not_waited_for() {
        assert!(!stalled(0, u64::MAX), "no answer yet: as fast as the fastest, never stalled");
        assert!(!stalled(100_000, 150_000), "answering within its usual time");
        assert!(!stalled(100_000, 200_000), "twice its latency is still its time");
        assert!(stalled(100_000, 200_001), "silent for longer: a dead link or a hung controller");
        assert!(!stalled(u64::MAX, u64::MAX), "saturates rather than wrapping");
    }

    #[test]
    fn a_connection_latency_average_starts_at_its_first_answer_and_moves_an_eighth() {
        assert_eq!(latency_average(0, 800), 800, "the first answer");
        assert_eq!(latency_average(800, 1600), 900);
        assert_eq!(latency_average(900, 0), 788);
        assert_eq!(latency_average(0, 0), 1, "0 stays 'no answer yet'");
        assert_eq!(latency_average(u64::MAX, u64::MAX), u64::MAX, "saturates");
    }

    fn never_asked() -> bool {
        panic!("the controller was asked whether it is gone for a status that does not need it")
    }

    #[test]
    fn last_clock_is_the_time_of_the_last_poll_turn() {
        // Callers that just polled wait on this time instead of reading the clock again
        // (qpath bench's waiting loop): it must be the turn's, not an older one.
        let mut ctx = Context::new(ContextOptions::default()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let before = Instant::now();
        ctx.poll(Wait::Poll).unwrap();
        let after = Instant::now();
        let t = ctx.last_clock();
        assert!(before <= t && t <= after, "the last turn's time is within the poll call");
    }

    #[test]
    fn a_single_path_requeues_transport_failures_until_its_retries_run_out_or_the_controller_is_gone() {
        let o = opts(2, 1000);
        let d = |status, retries, gone: bool| disposition(status, false, retries, &o, || gone);
        assert_eq!(d(Status::HOST_PATH_ERROR, 0, false), Disposition::Requeue);
        assert_eq!(d(Status::HOST_PATH_ERROR, 1, false), Disposition::Requeue);
        assert_eq!(d(Status::HOST_PATH_ERROR, 2, false), Disposition::Complete, "max_retries reached");
        assert_eq!(d(Status::HOST_PATH_ERROR, 0, true), Disposition::Complete, "past fast_io_fail_tmo or dead");
        // Nothing else is retried on a single path: not an ANA state (no other path to
        // take), not a media error, not success; and the controller is not asked.
        for status in [Status::SUCCESS, Status::LBA_OUT_OF_RANGE, Status::ANA_INACCESSIBLE, Status::INTERNAL] {
            assert_eq!(disposition(status, false, 0, &o, never_asked), Disposition::Complete, "{status}");
        }
        assert_eq!(
            disposition(Status::HOST_PATH_ERROR.with_dnr(true), false, 0, &o, never_asked),
            Disposition::Complete
        );
        // A queue that lost its authentication: the command was not executed; the queue
        // waits for its reconnect (which authenticates again), within the same bounds.
        assert_eq!(d(Status::AUTH_REQUIRED, 0, false), Disposition::Requeue);
        assert_eq!(d(Status::AUTH_REQUIRED, 2, false), Disposition::Complete, "max_retries reached");
        assert_eq!(d(Status::AUTH_REQUIRED, 0, true), Disposition::Complete, "past fast_io_fail_tmo or dead");
    }

    #[test]
    fn a_multipath_device_fails_over_path_errors_until_its_failovers_run_out() {
        let o = opts(0, 3);
        for status in [
            Status::HOST_PATH_ERROR,
            Status::ANA_INACCESSIBLE,
            Status::ANA_TRANSITION,
            Status::ANA_PERSISTENT_LOSS,
            Status::TRANSIENT_TRANSPORT_ERROR,
            Status::AUTH_REQUIRED,
        ] {
            for retries in 0..3 {
                assert_eq!(disposition(status, true, retries, &o, never_asked), Disposition::Failover, "{status}");
            }
            assert_eq!(disposition(status, true, 3, &o, never_asked), Disposition::Complete, "{status}");
        }
        for status in [Status::SUCCESS, Status::LBA_OUT_OF_RANGE, Status::INVALID_FIELD] {
            assert_eq!(disposition(status, true, 0, &o, never_asked), Disposition::Complete, "{status}");
        }
    }

    fn spread(n: usize, map: &[u16]) -> SpreadDev {
        SpreadDev { nsid: Nsid(1), qkeys: (10..10 + n).collect(), map: map.into(), next: 0 }
    }

    #[test]
    fn a_spread_device_round_robins_or_keeps_each_submitter_on_its_queue() {
        let mut rr = spread(3, &[]);
        let picks: Vec<usize> = (0..7).map(|_| rr.pick(5)).collect();
        assert_eq!(picks, [10, 11, 12, 10, 11, 12, 10], "the submitter does not matter");
        // Four submitters over two queues, contiguous (blk's CPU map): 0,1 -> 0 and 2,3 -> 1.
        let mut by = spread(2, &[0, 0, 1, 1]);
        assert_eq!((0..4).map(|s| by.pick(s)).collect::<Vec<_>>(), [10, 10, 11, 11]);
        assert_eq!(by.pick(2), 11, "the same submitter, the same queue");
        // A submitter beyond the map wraps onto it.
        assert_eq!(by.pick(6), 11);
        assert_eq!(by.pick(4), 10);
    }

    #[test]
    fn user_tokens_keep_the_owners_value_and_are_told_from_connections() {
        for v in [0, 1, (1 << 60) - 1] {
            let t = Context::user_token(v);
            assert_eq!(Context::user_value(t), v);
            assert_eq!(Token::from_u64(t).map(|t| t.kind), Some(OpKind::User));
        }
        let conn = ConnOps::new(3, 1);
        assert_ne!(Token::from_u64(conn.token(OpKind::Recv, 0)).map(|t| t.kind), Some(OpKind::User));
    }

    /// A multipath device whose head runs seed 000's shared-atomic reference over two
    /// optimized paths.
    #[cfg(feature = "lab-baselines")]
    fn multi_with_reference() -> (Multi<Controller>, Arc<crate::mpath::reference::SharedAtomic>) {
        let classes = [PathClass::Optimized; 2];
        let reference = Arc::new(crate::mpath::reference::SharedAtomic::new(&classes));
        let policy = crate::mpath::Policy::RoundRobin { rr_min_io: 1 };
        let mut sel = Selector::new(policy, 0);
        sel.set_paths(&[PathState::new(1, PathClass::Optimized), PathState::new(2, PathClass::Optimized)]);
        let m = Multi {
            head: Head::new("nqn.2026-11.io.qpath:unit", [0; 16], policy),
            sel,
            reference: Some(ReferenceSelector::SharedAtomic(Arc::clone(&reference))),
            ref_gen: 1,
            paths: vec![None, None],
            seen: 0,
            seen_head: 0,
            ios: vec![0; 2],
            bytes: vec![0; 2],
        };
        (m, reference)
    }

    #[test]
    #[cfg(feature = "lab-baselines")]
    fn a_completion_is_counted_down_only_by_the_reference_that_counted_its_submission() {
        let (mut m, first) = multi_with_reference();
        let counted: Vec<u32> = (0..2).map(|_| m.on_submit(PathIndex(0), 0)).collect();
        assert_eq!(counted, [1, 1]);
        assert_eq!(first.select(), Selection::Submit(PathIndex(1)), "path 0 holds two I/Os");
        // The head switches to a new reference while those two are in flight.
        let second = Arc::new(crate::mpath::reference::SharedAtomic::new(&[PathClass::Optimized; 2]));
        m.reference = Some(ReferenceSelector::SharedAtomic(Arc::clone(&second)));
        m.ref_gen = 2;
        assert_eq!(m.on_submit(PathIndex(1), 0), 2);
        for c in counted {
            m.on_complete(PathIndex(0), 0, 1000, Outcome::Done, c);
        }
        // The new reference never counted them: its path 0 is idle, not below zero.
        assert_eq!(second.select(), Selection::Submit(PathIndex(0)));
        assert_eq!(m.select(), Selection::Submit(PathIndex(0)));
        m.on_complete(PathIndex(1), 0, 1000, Outcome::Done, 2);
        // Without a reference (gen 0) nothing is counted down either.
        m.reference = None;
        assert_eq!(m.on_submit(PathIndex(1), 0), 0);
    }

    /// A context (an io_uring, no socket) with one multipath device of `nsze` 512-byte
    /// blocks whose two paths the selector sees as `class`, and no controller behind them.
    fn pathless(max_requests: usize, nsze: u64, class: PathClass) -> (Context, DeviceId) {
        let mut ctx = Context::new(ContextOptions { max_requests, ..ContextOptions::default() }).unwrap();
        let policy = crate::mpath::Policy::RoundRobin { rr_min_io: 1 };
        let head = Head::new("nqn.2026-11.io.qpath:unit", [0; 16], policy);
        let mut sel = Selector::new(policy, 0);
        sel.set_paths(&[PathState::new(1, class), PathState::new(2, class)]);
        let seen_head = head.generation();
        let m = Multi {
            head,
            sel,
            reference: None,
            ref_gen: 1,
            paths: vec![None, None],
            // The view key of a head with no local paths (`refresh_paths`): the selector
            // keeps `class` until the test says otherwise.
            seen: seen_head.wrapping_mul(0x100_0000_01b3) | 1,
            seen_head,
            ios: vec![0; 2],
            bytes: vec![0; 2],
        };
        ctx.core.has_multi = true;
        let dev = ctx.core.new_device(DevKind::Multi(Box::new(m)), 9, nsze, None).unwrap();
        (ctx, dev)
    }

    fn buf() -> Option<IoBuf> {
        Some(IoBuf::new(4096))
    }

    #[test]
    fn submissions_are_checked_against_the_device_before_taking_a_request() {
        let (mut ctx, dev) = pathless(4, 16, PathClass::Transient);
        let refused = |r: std::result::Result<(), (Error, Option<IoBuf>)>| {
            let (e, b) = r.unwrap_err();
            (e.kind, e.to_string(), b.is_some())
        };
        let (kind, why, back) = refused(ctx.submit(DeviceId(7), Op::Read, 0, 512, buf(), 1));
        assert_eq!((kind, why.as_str(), back), (ErrorKind::Invalid, "no such device", true));
        let (kind, why, back) = refused(ctx.submit(dev, Op::Read, 100, 512, buf(), 1));
        assert!(kind == ErrorKind::Invalid && why.contains("not multiples of 512") && back, "{why}");
        let (kind, why, _) = refused(ctx.submit(dev, Op::Read, 0, 0, buf(), 1));
        assert!(kind == ErrorKind::Invalid && why.contains("length 0"), "{why}");
        let (_, why, _) = refused(ctx.submit(dev, Op::Write, 15 * 512, 1024, buf(), 1));
        assert_eq!(why, "beyond the end of the device");
        let (_, why, back) = refused(ctx.submit(dev, Op::Read, 0, 4096, None, 1));
        assert_eq!((why.as_str(), back), ("buffer smaller than the transfer", false));
        let (_, why, _) = refused(ctx.submit(dev, Op::Read, 0, 8192, buf(), 1));
        assert_eq!(why, "buffer smaller than the transfer");
        // A flush has no range, so no end to pass.
        ctx.submit(dev, Op::Flush, 0, 0, None, 2).map_err(|(e, _)| e).unwrap();
        assert_eq!(ctx.in_flight(), 1, "only the flush took a request");
    }

    #[test]
    fn a_request_submitted_at_a_time_counts_from_it() {
        let (mut ctx, dev) = pathless(4, 1 << 20, PathClass::Transient);
        let t = Instant::now().checked_sub(Duration::from_secs(1)).expect("the clock runs for a second");
        ctx.submit_at(dev, Op::Read, 0, 4096, buf(), 21, t).map_err(|(e, _)| e).unwrap();
        ctx.submit(dev, Op::Read, 4096, 4096, buf(), 22).map_err(|(e, _)| e).unwrap();
        let start = |token| ctx.core.reqs.iter().find(|r| r.token == token).map(|r| r.start);
        // A second before the context was made: still that time, not the context's start.
        let t_ns = ctx.core.clock_ns(t);
        assert!(t_ns > 0 && t_ns < ctx.core.clock_ns(Instant::now()) - 999_000_000);
        assert_eq!(start(21), Some(t_ns), "the caller's time");
        assert!(start(22).is_some_and(|s| s > t_ns), "submit reads the clock itself");
    }

    #[test]
    fn requests_wait_for_a_path_run_out_at_max_requests_and_fail_in_order_when_no_path_can_come_back() {
        let (mut ctx, dev) = pathless(3, 1 << 20, PathClass::Transient);
        for token in 10..13 {
            ctx.submit(dev, Op::Read, token * 4096, 4096, buf(), token).map_err(|(e, _)| e).unwrap();
        }
        // Every request waits for a path that may come back: none completes.
        assert_eq!(ctx.in_flight(), 3);
        assert_eq!(ctx.poll(Wait::Poll).unwrap(), 0);
        // The request table is full: the next is refused at once, its buffer handed back.
        let (e, b) = ctx.submit(dev, Op::Write, 0, 4096, buf(), 13).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Busy);
        assert!(b.is_some());
        // Both paths are gone for good (the view changes): the waiting requests fail with a
        // path error, in the order they were submitted, each with its buffer.
        let DevKind::Multi(m) = &mut ctx.core.devices[dev.0 as usize].kind else { unreachable!() };
        m.seen = 0;
        assert_eq!(ctx.poll(Wait::Poll).unwrap(), 3);
        let done: Vec<(u64, Status, bool)> = ctx.completions().map(|c| (c.token, c.status, c.buf.is_some())).collect();
        assert_eq!(
            done,
            [
                (10, Status::HOST_PATH_ERROR, true),
                (11, Status::HOST_PATH_ERROR, true),
                (12, Status::HOST_PATH_ERROR, true)
            ]
        );
        assert_eq!(ctx.in_flight(), 0);
        // The requests are free again; with no path, a new one fails at once.
        ctx.submit(dev, Op::Read, 0, 4096, buf(), 14).map_err(|(e, _)| e).unwrap();
        assert_eq!(ctx.in_flight(), 0);
        let c = ctx.completions().next().unwrap();
        assert_eq!((c.token, c.status), (14, Status::HOST_PATH_ERROR));
    }
}
