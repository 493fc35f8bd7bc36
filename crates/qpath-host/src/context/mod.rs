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
//! Failures: a queue that fails gives its commands back with a path error.
//! On a single-path device they wait for the controller to reconnect (or fail
//! after fast_io_fail_tmo / ctrl_loss_tmo, as Linux). On a multipath head they
//! go to another path at once; with no usable path they wait for one.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blk::{
    ContextId, ContextMap, Direction, QueueMap, QueueStats, QueueTags, SharedTagSet, Tag, TagAllocator, TagSet, TagUser,
};
use nvme::opcode::io as opc;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::conn::{ConnOps, OpKind, Token};
use uring::{Completion as RingCompletion, IoBuf, Mailbox, MailboxSender, Payload, Ring, RingConfig, Wait};

use crate::control::Control;
use crate::controller::{Controller, QueueMsg};
use crate::error::{Error, ErrorKind, Result};
use crate::failover::{Disposition, disposition};
use crate::head::{Head, ReferenceSelector, class_of, path_id};
use crate::mpath::{Outcome, PathClass, PathIndex, PathState, Selection, Selector};
use crate::queue::{DataDir, HostQueue, Io, QueueState};
use crate::stats::{DeviceView, HostStats, QueueView, Recorder, STATS_INTERVAL_DEFAULT};

mod req;

use req::{Claim, OnWire, Req, ReqState};

/// An I/O operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read into the buffer.
    Read,
    /// Write from the buffer.
    Write,
    /// Flush the volatile write cache.
    Flush,
    /// Write zeroes (no buffer).
    WriteZeroes,
    /// Deallocate (discard) the range (no buffer).
    Deallocate,
}

impl Op {
    fn direction(self) -> Direction {
        match self {
            Op::Read => Direction::Read,
            Op::Write | Op::WriteZeroes => Direction::Write,
            Op::Deallocate => Direction::Trim,
            Op::Flush => Direction::Sync,
        }
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
        }
    }
}

/// The kind bits of a ring token ([`uring::conn::Token`]) of an operation the context's
/// owner queued on its ring ([`Context::ring`]); the other 60 bits are the owner's.
const USER_KIND: u64 = OpKind::User as u64;

struct Conn {
    stream: TcpStream,
    q: HostQueue,
    /// The controller's connection generation this queue belongs to: once the
    /// controller resets (the generation moves on), the queue is dead even if its
    /// socket is not (a link that went down fails nothing for minutes).
    ctrl_generation: u64,
    qkey: usize,
    /// Its receive and send in flight, and its life: once it fails it closes (detached
    /// from its queue entry) and is freed when nothing of it is in flight.
    ops: ConnOps,
    /// A re-authentication's command, sent beside the I/O under the reserved tag.
    control: Control,
}

struct QEntry {
    ctrl: Arc<Controller>,
    index: u16,
    conn: Option<usize>,
    entries: u16,
    tags: QueueTags,
    /// Requests bound to this queue waiting for a tag or a connection.
    waiting: VecDeque<u32>,
    in_flush_list: bool,
    stats: QueueStats,
}

struct LocalPath {
    ctrl: Arc<Controller>,
    nsid: Nsid,
    qkey: usize,
    /// An ANA error was seen: the path counts as transient until the controller's change count moves.
    suspect_at: Option<u64>,
}

struct Multi {
    head: Arc<Head>,
    sel: Selector,
    /// Seed 000's shared selectors, when the head runs one instead of `sel`.
    reference: Option<ReferenceSelector>,
    /// Bumped whenever `reference` changes: a completion is counted down only by
    /// the reference that counted its submission.
    ref_gen: u32,
    paths: Vec<Option<LocalPath>>,
    /// The view the selector was last given (head generation, controller changes, local state).
    seen: u64,
    seen_head: u64,
    /// I/Os completed on each path slot (not counting path errors).
    ios: Vec<u64>,
    /// Their lengths, summed (bytes).
    bytes: Vec<u64>,
}

impl Multi {
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

enum DevKind {
    Single {
        qkey: usize,
        nsid: Nsid,
    },
    /// One namespace over several queues of this context (seed 004).
    Spread(Box<SpreadDev>),
    Multi(Box<Multi>),
}

struct DevEntry {
    kind: DevKind,
    block_shift: u8,
    nsze: u64,
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

/// A per-thread completion context.
pub struct Context {
    opts: ContextOptions,
    ring: Ring,
    mailbox: Mailbox<QueueMsg>,
    sender: MailboxSender<QueueMsg>,
    conns: Vec<Option<Conn>>,
    free_conns: Vec<usize>,
    conn_gen: u64,
    queues: Vec<QEntry>,
    devices: Vec<DevEntry>,
    reqs: Vec<Req>,
    free_reqs: Vec<u32>,
    done: Vec<Completion>,
    ring_done: Vec<RingCompletion>,
    /// Completions of the owner's own ring operations ([`Context::user_token`]).
    user_done: Vec<RingCompletion>,
    flush_list: Vec<usize>,
    touched: Vec<usize>,
    dsm_bufs: Vec<IoBuf>,
    /// Requests that change data, held after their connection failed until the old
    /// controller can no longer execute them ([`crate::failover`]). Allocated for every
    /// request at creation: holding one never allocates.
    held: VecDeque<u32>,
    last_tick: Instant,
    /// The time of the poll turn or submission in progress, read once for all its
    /// requests (None outside them). fio likewise reads the clock once per batch of
    /// reaped completions (`init_icd`), and blk-mq caches it in the plug
    /// (`blk_time_get_ns`): a read per timestamp was five per I/O here.
    clock: Option<Instant>,
    has_multi: bool,
    stalls: Vec<StallReport>,
    /// Statistics for a [`HostStats`] (inert without one).
    rec: Recorder,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("queues", &self.queues.len()).field("devices", &self.devices.len()).finish()
    }
}

const TICK: Duration = Duration::from_millis(10);
/// Requests in flight from which a blocking poll holds its sends' completions
/// ([`ContextOptions::send_hold`]).
const SEND_HOLD_IN_FLIGHT_MIN: usize = 2;
/// A connection with more commands than this in flight is deep: served after the others.
const SHALLOW_OUTSTANDING_MAX: usize = 4;

/// Nanoseconds from `t` to `now`, 0 if `t` is later (a request issued after its turn's clock).
fn nanos_since(t: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(t).as_nanos()).unwrap_or(u64::MAX)
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
        let n = opts.max_requests.clamp(1, 1 << 20);
        let now = Instant::now();
        let reqs = (0..n).map(|_| Req::free(now)).collect();
        Ok(Context {
            ring,
            mailbox,
            sender,
            conns: Vec::new(),
            free_conns: Vec::new(),
            conn_gen: 0,
            queues: Vec::new(),
            devices: Vec::new(),
            reqs,
            free_reqs: (0..u32::try_from(n).unwrap_or(u32::MAX)).rev().collect(),
            done: Vec::with_capacity(n),
            ring_done: Vec::with_capacity(1024),
            user_done: Vec::with_capacity(256),
            flush_list: Vec::new(),
            touched: Vec::new(),
            dsm_bufs: Vec::new(),
            held: VecDeque::with_capacity(n),
            last_tick: now,
            clock: None,
            has_multi: false,
            stalls: Vec::new(),
            rec: Recorder::new(opts.stats.clone(), opts.stats_interval),
            opts,
        })
    }

    /// The CPU this context prefers (for queue maps).
    pub fn cpu(&self) -> usize {
        self.opts.cpu.unwrap_or(0)
    }

    // ----------------------------------------------------------- topology

    /// Claims one I/O queue of `ctrl` for this context: the queue the CPU maps
    /// to (blk's contiguous spread over the controller's block queues) if
    /// free, else the next free one. Returns the queue's key in this context.
    pub fn attach(&mut self, ctrl: &Arc<Controller>) -> Result<usize> {
        if let Some(k) = self.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, ctrl)) {
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
        let qkey = self.queues.len();
        let placeholder = TagSet::new(1).map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
        self.queues.push(QEntry {
            ctrl: Arc::clone(ctrl),
            index,
            conn: None,
            entries: 0,
            tags: QueueTags::Private(placeholder),
            waiting: VecDeque::new(),
            in_flush_list: false,
            stats: QueueStats::new(),
        });
        self.rec.on_attach(qkey, ctrl, index);
        if let Some((stream, q, generation)) = claimed {
            self.install(qkey, stream, q, generation);
        }
        Ok(qkey)
    }

    fn install(&mut self, qkey: usize, stream: TcpStream, q: HostQueue, ctrl_generation: u64) {
        let _ = stream.set_nodelay(true);
        let entries = q.entries();
        self.conn_gen = self.conn_gen.wrapping_add(1);
        let key = self.free_conns.pop().unwrap_or(self.conns.len());
        let conn = Conn {
            stream,
            q,
            ctrl_generation,
            qkey,
            ops: ConnOps::new(u32::try_from(key).expect("fewer than 2^32 connections"), self.conn_gen),
            control: Control::default(),
        };
        if key == self.conns.len() {
            self.conns.push(Some(conn));
        } else {
            self.conns[key] = Some(conn);
        }
        self.rec.on_connect(qkey);
        let qe = &mut self.queues[qkey];
        qe.conn = Some(key);
        qe.entries = entries;
        // A fresh tag set: the old connection's commands were all failed or retried.
        if let Ok(t) = TagSet::new(entries.max(1)) {
            qe.tags = QueueTags::Private(t);
        }
        self.arm_recv(key);
        self.dispatch_queue_waiting(qkey);
        self.has_multi_refresh();
    }

    fn has_multi_refresh(&mut self) {
        if self.has_multi {
            for d in &mut self.devices {
                if let DevKind::Multi(m) = &mut d.kind {
                    m.seen = 0;
                }
            }
        }
    }

    fn new_device(&mut self, kind: DevKind, block_shift: u8, nsze: u64, depth_limit: Option<u16>) -> Result<DeviceId> {
        let id =
            DeviceId(u32::try_from(self.devices.len()).map_err(|_| Error::new(ErrorKind::Busy, "too many devices"))?);
        let after_tag = self.opts.depth_limit_order != DepthLimitOrder::BeforeTag;
        let (tag_limit, budget) = if after_tag { (None, depth_limit) } else { (depth_limit, None) };
        let tags = match &self.opts.shared_tags {
            Some(set) => Some(set.register_user(tag_limit).map_err(|e| Error::new(ErrorKind::Busy, e.to_string()))?),
            None => None,
        };
        let budget = if tags.is_some() { budget } else { None };
        if budget == Some(0) {
            return Err(Error::new(ErrorKind::Invalid, "a device's depth limit must be at least 1"));
        }
        self.devices.push(DevEntry {
            kind,
            block_shift,
            nsze,
            waiting: VecDeque::new(),
            tags,
            budget,
            budget_used: 0,
            budget_waiting: VecDeque::new(),
        });
        Ok(id)
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
        if qkey >= self.queues.len() {
            return Err(Error::new(ErrorKind::Invalid, "no such queue"));
        }
        self.new_device(DevKind::Single { qkey, nsid }, block_shift, nsze, depth_limit)
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
            if mine.iter().any(|&k| self.queues[k].index == i) || !ctrl.free_queues().contains(&i) {
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
        mine.sort_by_key(|&k| self.queues[k].index);
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
        (0..self.queues.len()).filter(|&k| Arc::ptr_eq(&self.queues[k].ctrl, ctrl)).collect()
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
        if qkeys.iter().any(|&k| k >= self.queues.len()) {
            return Err(Error::new(ErrorKind::Invalid, "no such queue"));
        }
        let ctrl = Arc::clone(&self.queues[first].ctrl);
        if qkeys.iter().any(|&k| !Arc::ptr_eq(&self.queues[k].ctrl, &ctrl)) {
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
        self.new_device(DevKind::Spread(Box::new(dev)), ns.block_shift, ns.nsze, None)
    }

    /// Opens a multipath head: attaches a queue of every path's controller.
    pub fn open_head(&mut self, head: &Arc<Head>) -> Result<DeviceId> {
        let slots = head.paths();
        let mut paths = Vec::with_capacity(slots.len());
        let mut geometry = None;
        for s in &slots {
            paths.push(match s {
                Some((c, nsid)) => {
                    if geometry.is_none()
                        && let Some(ns) = c.namespace(*nsid)
                    {
                        geometry = Some((ns.block_shift, ns.nsze));
                    }
                    let qkey = self.attach(c)?;
                    Some(LocalPath { ctrl: Arc::clone(c), nsid: *nsid, qkey, suspect_at: None })
                }
                None => None,
            });
        }
        let (block_shift, nsze) =
            geometry.ok_or_else(|| Error::new(ErrorKind::Invalid, "the head has no path with a known namespace"))?;
        let sel = Selector::new(head.policy(), self.cpu());
        let n = paths.len();
        let m = Multi {
            head: Arc::clone(head),
            sel,
            reference: head.reference(),
            ref_gen: 1,
            paths,
            seen: 0,
            seen_head: head.generation(),
            ios: vec![0; n],
            bytes: vec![0; n],
        };
        self.has_multi = true;
        let id = self.new_device(DevKind::Multi(Box::new(m)), block_shift, nsze, None)?;
        self.refresh_paths(id.0 as usize);
        Ok(id)
    }

    /// Block size of a device.
    pub fn block_size(&self, dev: DeviceId) -> u32 {
        self.devices.get(dev.0 as usize).map_or(512, |d| 1 << d.block_shift)
    }

    /// Capacity of a device in bytes.
    pub fn capacity(&self, dev: DeviceId) -> u64 {
        self.devices.get(dev.0 as usize).map_or(0, |d| d.nsze << d.block_shift)
    }

    /// Tags a device holds from the shared set now (in flight, waiting for
    /// budget, or kept in its window); `None` without a shared set.
    pub fn tags_held(&self, dev: DeviceId) -> Option<u16> {
        self.devices.get(dev.0 as usize)?.tags.as_ref().map(TagUser::held)
    }

    /// Requests in flight (waiting or on the wire).
    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free_reqs.len()
    }

    /// Per-queue statistics: (controller address, queue index, stats).
    pub fn queue_stats(&self) -> impl Iterator<Item = (std::net::SocketAddr, u16, &QueueStats)> {
        self.queues.iter().map(|q| (q.ctrl.opts.traddr, q.index, &q.stats))
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
        if !self.rec.enabled() {
            return;
        }
        for (qkey, qe) in self.queues.iter().enumerate() {
            let conn = qe.conn.and_then(|k| self.conns.get(k)).and_then(Option::as_ref);
            let view = QueueView {
                stats: &qe.stats,
                outstanding: conn.map_or(0, |c| c.q.outstanding()),
                waiting: qe.waiting.len(),
                connected: conn.is_some(),
                secure_channel: conn.and_then(|c| c.q.secure_channel_parts()),
            };
            self.rec.publish_queue(qkey, &view, force);
        }
        let queues = &self.queues;
        let ctrl_of = |qkey: usize| queues.get(qkey).map(|q| &q.ctrl);
        for (dev, d) in self.devices.iter().enumerate() {
            let view = DeviceView { multipath: matches!(d.kind, DevKind::Multi(_)), ctrl_of: &ctrl_of };
            self.rec.publish_device(dev, &view, force);
        }
        self.rec.published(Instant::now());
    }

    /// The paths of a multipath device, as this context has used them.
    pub fn path_report(&self, dev: DeviceId) -> Vec<PathReport> {
        let Some(DevEntry { kind: DevKind::Multi(m), .. }) = self.devices.get(dev.0 as usize) else {
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
        let Some(d) = self.devices.get(dev.0 as usize) else {
            return Err((Error::new(ErrorKind::Invalid, "no such device"), buf));
        };
        let bs = 1u64 << d.block_shift;
        let len64 = u64::from(len);
        if !offset.is_multiple_of(bs) || !len64.is_multiple_of(bs) || (len == 0 && matches!(op, Op::Read | Op::Write)) {
            return Err((
                Error::new(ErrorKind::Invalid, format!("offset {offset} / length {len} not multiples of {bs}")),
                buf,
            ));
        }
        let slba = offset >> d.block_shift;
        let nlb = len64 >> d.block_shift;
        if op != Op::Flush && slba.checked_add(nlb).is_none_or(|e| e > d.nsze) {
            return Err((Error::new(ErrorKind::Invalid, "beyond the end of the device"), buf));
        }
        if matches!(op, Op::Read | Op::Write) && buf.as_ref().is_none_or(|b| b.capacity() < len as usize) {
            return Err((Error::new(ErrorKind::Invalid, "buffer smaller than the transfer"), buf));
        }
        if nlb > 65536 {
            return Err((Error::new(ErrorKind::Invalid, "more than 65536 blocks in one command"), buf));
        }
        let Some(rid) = self.free_reqs.pop() else {
            return Err((Error::new(ErrorKind::Busy, "too many requests in flight"), buf));
        };
        let r = &mut self.reqs[rid as usize];
        r.dev = dev.0;
        r.op = op;
        r.slba = slba;
        r.nlb = u32::try_from(nlb).unwrap_or(0);
        r.len = len;
        r.buf = buf;
        r.token = token;
        let now = Instant::now();
        r.start = now;
        r.retries = 0;
        r.was_sent = false;
        r.submitter = submitter;
        let outer = self.clock.replace(now);
        if self.set_state(rid, ReqState::Waiting) {
            self.route(rid);
        }
        self.clock = outer;
        Ok(())
    }

    /// Picks the queue (and path) for a request and sends it, or parks it.
    fn route(&mut self, rid: u32) {
        let dev = self.reqs[rid as usize].dev as usize;
        let d = &mut self.devices[dev];
        let (qkey, nsid, path) = match &mut d.kind {
            DevKind::Single { qkey, nsid } => (*qkey, *nsid, 0u16),
            DevKind::Spread(sp) => (sp.pick(self.reqs[rid as usize].submitter), sp.nsid, 0u16),
            DevKind::Multi(m) => match m.select() {
                Selection::Submit(p) => match m.paths.get(p.get()).and_then(Option::as_ref) {
                    Some(lp) => (lp.qkey, lp.nsid, p.0),
                    None => {
                        d.waiting.push_back(rid);
                        return;
                    }
                },
                Selection::Requeue => {
                    d.waiting.push_back(rid);
                    return;
                }
                Selection::Fail => {
                    self.complete(rid, Status::HOST_PATH_ERROR);
                    return;
                }
            },
        };
        let r = &mut self.reqs[rid as usize];
        r.qkey = qkey;
        r.nsid = nsid;
        r.path = path;
        self.send_bound(rid);
    }

    /// Sends a request on the queue it is bound to, or parks it there (or on
    /// its device, for a shared tag).
    fn send_bound(&mut self, rid: u32) {
        let r = &self.reqs[rid as usize];
        let (qkey, dev) = (r.qkey, r.dev as usize);
        let qe = &mut self.queues[qkey];
        let Some(ckey) = qe.conn else {
            self.park(rid);
            return;
        };
        let Some(Some(conn)) = self.conns.get(ckey) else {
            self.park(rid);
            return;
        };
        if conn.q.outstanding() >= usize::from(qe.entries) {
            qe.waiting.push_back(rid);
            return;
        }
        let d = &mut self.devices[dev];
        let (tag, shared) = match d.tags.as_mut() {
            Some(u) => match u.alloc() {
                Some(t) => (t, true),
                None => {
                    d.waiting.push_back(rid);
                    self.queues[qkey].stats.record_busy();
                    return;
                }
            },
            None => match qe.tags.alloc() {
                Some(t) => (t, false),
                None => {
                    qe.waiting.push_back(rid);
                    qe.stats.record_busy();
                    return;
                }
            },
        };
        let tag = tag.get();
        let d = &mut self.devices[dev];
        let mut budgeted = false;
        if AFTER_TAG_BUILT && let Some(budget) = d.budget {
            // DepthLimitOrder::AfterTag: the tag is taken; now the device's budget.
            if d.budget_used >= budget {
                if self.set_state(rid, ReqState::Budget { tag, shared }) {
                    self.devices[dev].budget_waiting.push_back(rid);
                }
                return;
            }
            d.budget_used += 1;
            budgeted = true;
        }
        self.issue(rid, ckey, qkey, dev, Claim { tag, shared, budgeted });
    }

    /// Moves request `rid` to `to` ([`ReqState::transition`]). A refusal is a bug of the
    /// core: logged at error level, in release builds too, and the request fails (unless
    /// it is already free: a second completion is dropped). Returns whether it moved; the
    /// caller stops handling the request when it did not.
    fn set_state(&mut self, rid: u32, to: ReqState) -> bool {
        let r = &mut self.reqs[rid as usize];
        match r.state.transition(to) {
            Ok(s) => {
                r.state = s;
                true
            }
            Err(e) => {
                tracing::error!(request = rid, token = r.token, "request lifecycle: {e}; the request fails");
                self.fail_refused(rid);
                false
            }
        }
    }

    /// Fails a request whose state change was refused: gives back what it holds (a tag
    /// waiting for budget, a budget) and completes it with an internal error. A request
    /// on the wire keeps its tag with its command: its late completion finds the request
    /// no longer outstanding and is dropped.
    fn fail_refused(&mut self, rid: u32) {
        let r = &self.reqs[rid as usize];
        let (dev, qkey, state) = (r.dev as usize, r.qkey, r.state);
        match state {
            ReqState::Free => return,
            ReqState::Budget { tag, shared } => {
                self.devices[dev].budget_waiting.retain(|&x| x != rid);
                self.free_tag(dev, qkey, tag, shared);
            }
            ReqState::Outstanding(w) => self.release_budget(dev, w.budgeted),
            ReqState::Waiting | ReqState::Held { .. } => {}
        }
        self.reqs[rid as usize].state = ReqState::Waiting;
        self.complete(rid, Status::INTERNAL);
    }

    /// The time of the turn or submission in progress, or the clock's.
    fn now(&self) -> Instant {
        self.clock.unwrap_or_else(Instant::now)
    }

    /// Sends a request that holds its tag (and budget, as `claim` says) on connection
    /// `ckey` of queue `qkey`.
    fn issue(&mut self, rid: u32, ckey: usize, qkey: usize, dev: usize, claim: Claim) {
        let mut wire = OnWire::new(claim, self.now());
        if self.reqs[rid as usize].state.transition(ReqState::Outstanding(wire)).is_err() {
            // Refused before anything goes on the wire (a held or free request sent).
            self.free_tag(dev, qkey, claim.tag, claim.shared);
            self.release_budget(dev, claim.budgeted);
            let _ = self.set_state(rid, ReqState::Outstanding(wire));
            return;
        }
        let r = &mut self.reqs[rid as usize];
        let cid = Cid(wire.tag);
        let nsid = r.nsid;
        let (sqe, dir, len, buf) = match r.op {
            Op::Read => (
                Sqe::rw(opc::READ, cid, nsid, r.slba, r.nlb, SglDescriptor::transport(r.len)),
                DataDir::FromController,
                r.len,
                r.buf.take(),
            ),
            Op::Write => (
                Sqe::rw(opc::WRITE, cid, nsid, r.slba, r.nlb, SglDescriptor::transport(r.len)),
                DataDir::ToController,
                r.len,
                r.buf.take(),
            ),
            Op::Flush => (Sqe::flush(cid, nsid), DataDir::None, 0, r.buf.take()),
            Op::WriteZeroes => (Sqe::write_zeroes(cid, nsid, r.slba, r.nlb, false), DataDir::None, 0, r.buf.take()),
            Op::Deallocate => {
                let mut b = self.dsm_bufs.pop().unwrap_or_else(|| IoBuf::new(4096));
                b.set_len(16);
                b.fill(0);
                b[4..8].copy_from_slice(&r.nlb.to_le_bytes());
                b[8..16].copy_from_slice(&r.slba.to_le_bytes());
                (Sqe::dsm_deallocate(cid, nsid, 1, SglDescriptor::transport(16)), DataDir::ToController, 16, Some(b))
            }
        };
        let io = Io { sqe, buf, len, dir, token: u64::from(rid) };
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        match conn.q.submit(cid.0, io) {
            Ok(()) => {
                if let DevKind::Multi(m) = &mut self.devices[dev].kind {
                    wire.via_reference = m.on_submit(PathIndex(self.reqs[rid as usize].path), qkey);
                }
                self.reqs[rid as usize].was_sent = true;
                if !self.set_state(rid, ReqState::Outstanding(wire)) {
                    return;
                }
                let qe = &mut self.queues[qkey];
                if !qe.in_flush_list {
                    qe.in_flush_list = true;
                    self.flush_list.push(qkey);
                }
            }
            Err((e, io)) => {
                self.free_tag(dev, qkey, wire.tag, wire.shared);
                self.release_budget(dev, wire.budgeted);
                let r = &mut self.reqs[rid as usize];
                if r.op == Op::Deallocate {
                    if let Some(b) = io.buf {
                        self.dsm_bufs.push(b);
                    }
                } else {
                    r.buf = io.buf;
                }
                tracing::debug!("submit refused ({e}); request waits for the queue");
                if matches!(self.reqs[rid as usize].state, ReqState::Budget { .. })
                    && !self.set_state(rid, ReqState::Waiting)
                {
                    return;
                }
                self.park(rid);
            }
        }
    }

    /// Parks a request whose queue has no connection: a multipath request
    /// goes back to its device for another path; a single-path one waits for
    /// the reconnect on its queue.
    fn park(&mut self, rid: u32) {
        let r = &self.reqs[rid as usize];
        let dev = r.dev as usize;
        match &self.devices[dev].kind {
            DevKind::Multi(_) => self.devices[dev].waiting.push_back(rid),
            DevKind::Single { .. } | DevKind::Spread(_) => self.queues[r.qkey].waiting.push_back(rid),
        }
    }

    /// Gives back a tag of device `dev` (shared) or of queue `qkey` (its own).
    fn free_tag(&mut self, dev: usize, qkey: usize, tag: u16, shared: bool) {
        let tag = Tag::new(tag);
        if shared {
            if let Some(u) = self.devices[dev].tags.as_mut()
                && u.is_in_flight(tag)
            {
                u.free(tag);
            }
        } else {
            let qe = &mut self.queues[qkey];
            if qe.tags.is_in_flight(tag) {
                qe.tags.free(tag);
            }
        }
    }

    /// Gives back the device budget a request held (`budgeted`: it left the wire).
    fn release_budget(&mut self, dev: usize, budgeted: bool) {
        if AFTER_TAG_BUILT && budgeted {
            self.devices[dev].budget_used -= 1;
        }
    }

    /// `DepthLimitOrder::AfterTag`: sends requests that hold a tag, as budget allows.
    fn dispatch_budget_waiting(&mut self, dev: usize) {
        loop {
            let d = &mut self.devices[dev];
            if d.budget.is_none_or(|b| d.budget_used >= b) {
                return;
            }
            let Some(rid) = d.budget_waiting.pop_front() else { return };
            let r = &self.reqs[rid as usize];
            let qkey = r.qkey;
            let Some((tag, shared)) = r.state.tag() else {
                tracing::error!(request = rid, state = ?r.state, "a request waits for budget without a tag");
                continue;
            };
            let qe = &self.queues[qkey];
            let conn = qe.conn.and_then(|ckey| Some((ckey, self.conns.get(ckey)?.as_ref()?.q.outstanding())));
            match conn {
                None => {
                    // The queue lost its connection: the tag goes back, the request waits for the queue.
                    self.free_tag(dev, qkey, tag, shared);
                    if self.set_state(rid, ReqState::Waiting) {
                        self.park(rid);
                    }
                }
                Some((_, outstanding)) if outstanding >= usize::from(qe.entries) => {
                    self.devices[dev].budget_waiting.push_front(rid);
                    return;
                }
                Some((ckey, _)) => {
                    self.devices[dev].budget_used += 1;
                    self.issue(rid, ckey, qkey, dev, Claim { tag, shared, budgeted: true });
                }
            }
        }
    }

    fn dispatch_queue_waiting(&mut self, qkey: usize) {
        let n = self.queues[qkey].waiting.len();
        for _ in 0..n {
            let qe = &self.queues[qkey];
            if qe.conn.is_none() {
                return;
            }
            let Some(rid) = self.queues[qkey].waiting.pop_front() else { return };
            let before = self.queues[qkey].waiting.len();
            self.send_bound(rid);
            if self.queues[qkey].waiting.len() > before {
                // It went back to the end: out of tags or queue slots; stop for now.
                return;
            }
        }
    }

    fn dispatch_device_waiting(&mut self, dev: usize) {
        let n = self.devices[dev].waiting.len();
        for _ in 0..n {
            let Some(rid) = self.devices[dev].waiting.pop_front() else { return };
            let before = self.devices[dev].waiting.len();
            if matches!(self.devices[dev].kind, DevKind::Multi(_)) {
                self.route(rid);
            } else {
                self.send_bound(rid);
            }
            if self.devices[dev].waiting.len() > before {
                return;
            }
        }
    }

    // ------------------------------------------------------------- polling

    /// Sends queued commands, waits per `wait`, processes what completed.
    /// Returns how many completions are ready in [`Context::completions`] and
    /// [`Context::user_completions`].
    pub fn poll(&mut self, wait: Wait) -> Result<usize> {
        self.flush();
        let wait = if self.done.is_empty() && self.user_done.is_empty() { wait } else { Wait::Poll };
        // A batch's send completion is held only while several requests are out: with one,
        // the response is the very next completion, and sleeping inside the submitting call
        // to save the second system call made QD1 slower (a wake-up from idle per I/O).
        self.ring.hold_sends(self.in_flight() >= SEND_HOLD_IN_FLIGHT_MIN);
        let mut rd = std::mem::take(&mut self.ring_done);
        let r = self.ring.turn(wait, |_, c| rd.push(c));
        // Everything this turn reaped completed by now; what it issues goes out with the
        // next turn. Cleared before returning.
        let outer = self.clock.replace(Instant::now());
        for c in rd.drain(..) {
            self.on_ring(c);
        }
        self.ring_done = rd;
        if let Err(e) = r {
            self.clock = outer;
            return Err(Error::new(ErrorKind::Io, format!("io_uring: {e}")));
        }
        let mut msgs = Vec::new();
        self.mailbox.drain(|m| msgs.push(m));
        for m in msgs {
            self.on_msg(m);
        }
        let mut touched = std::mem::take(&mut self.touched);
        // Shallow connections' completions first (see `conn_is_deep`), then the rest and
        // whatever servicing touched on the way.
        for slot in touched.iter_mut() {
            if !self.conn_is_deep(*slot) {
                self.service(*slot);
                *slot = usize::MAX;
            }
        }
        let mut i = 0;
        while i < touched.len() {
            if touched[i] != usize::MAX {
                self.service(touched[i]);
            }
            i += 1;
            if !self.touched.is_empty() {
                touched.append(&mut self.touched);
            }
        }
        touched.clear();
        self.touched = touched;
        if self.has_multi {
            for d in 0..self.devices.len() {
                self.refresh_paths(d);
            }
        }
        self.flush();
        let now = self.now();
        if now.saturating_duration_since(self.last_tick) >= TICK {
            self.last_tick = now;
            self.tick();
            if self.rec.due(now) {
                self.publish(false);
            }
        }
        self.clock = outer;
        Ok(self.done.len() + self.user_done.len())
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
        std::mem::take(&mut self.stalls)
    }

    /// Completed I/Os since the last drain.
    pub fn completions(&mut self) -> std::vec::Drain<'_, Completion> {
        self.done.drain(..)
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

    /// Whether a queue's connection keeps more than a few commands in flight: its sends
    /// and completions wait behind those of shallow queues in a poll (a QD1 command is
    /// not sent after a flood's batch, whose loopback send runs the target's receive
    /// inline, nor completed after the flood's responses).
    fn conn_is_deep(&self, ckey: usize) -> bool {
        self.conns.get(ckey).and_then(Option::as_ref).is_some_and(|c| c.q.outstanding() > SHALLOW_OUTSTANDING_MAX)
    }

    /// Sends the batches of the queues that took commands since the last flush, shallow
    /// queues first (two passes over the flush list, never over all queues).
    fn flush(&mut self) {
        let list = std::mem::take(&mut self.flush_list);
        for deep in [false, true] {
            for &qkey in &list {
                if let Some(ckey) = self.queues[qkey].conn
                    && self.queues[qkey].in_flush_list
                    && self.conn_is_deep(ckey) == deep
                {
                    self.send(ckey);
                }
            }
        }
        for &qkey in &list {
            self.queues[qkey].in_flush_list = false;
        }
        self.flush_list = list;
        self.flush_list.clear();
    }

    fn send(&mut self, ckey: usize) {
        let Some(Some(c)) = self.conns.get_mut(ckey) else { return };
        if !c.ops.may_send() {
            return;
        }
        let Some(msg) = c.q.take_send() else { return };
        let fd = c.stream.as_raw_fd();
        let t = c.ops.token(OpKind::Send, 0);
        // Kernel TLS refuses MSG_WAITALL (the ring resubmits short sends either way).
        let sent =
            if c.q.kernel_tls() { self.ring.send_without_waitall(fd, msg, t) } else { self.ring.send(fd, msg, t) };
        match sent {
            Ok(()) => c.ops.send_started(),
            Err((e, msg)) => {
                c.q.on_send_done(msg, Err(std::io::Error::other(e.to_string())));
                self.touched.push(ckey);
            }
        }
    }

    fn arm_recv(&mut self, ckey: usize) {
        let Some(Some(c)) = self.conns.get_mut(ckey) else { return };
        if !c.ops.may_recv() {
            return;
        }
        let Some((buf, range)) = c.q.take_recv_buf() else { return };
        let fd = c.stream.as_raw_fd();
        match self.ring.recv(fd, buf, range, c.ops.token(OpKind::Recv, 0)) {
            Ok(()) => c.ops.recv_started(),
            Err((e, buf)) => {
                c.q.on_recv_none(buf);
                c.q.set_failed(&format!("recv submit: {e}"));
                self.touched.push(ckey);
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
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
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
                            conn.q.on_recv(buf, n);
                        }
                        Err(e) => {
                            conn.q.on_recv_none(buf);
                            if conn.ops.is_open() {
                                let why = conn.q.recv_error_text(&e);
                                conn.q.set_failed(&why);
                            }
                        }
                    }
                }
            }
            OpKind::Send => {
                conn.ops.send_done();
                let res = c.io_result().map(|_| ());
                if let Payload::Msg(m) = c.payload {
                    conn.q.on_send_done(m, res);
                }
            }
            OpKind::File | OpKind::User => return,
        }
        self.touched.push(ckey);
    }

    /// After a connection's completions: deliver finished commands, re-arm, handle failure.
    fn service(&mut self, ckey: usize) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        let qkey = conn.qkey;
        let dying = !conn.ops.is_open();
        let control_tag = conn.q.control_tag();
        let mut done = std::mem::take(conn.q.completions());
        for d in done.drain(..) {
            if d.tag == control_tag {
                if let Some(Some(conn)) = self.conns.get_mut(ckey) {
                    conn.control.complete(d);
                }
                continue;
            }
            let rid = u32::try_from(d.token).unwrap_or(u32::MAX);
            if let Some(w) = self.on_wire(rid, d.tag) {
                if !dying {
                    let r = &self.reqs[rid as usize];
                    self.free_tag(r.dev as usize, r.qkey, w.tag, w.shared);
                }
                self.finish(rid, d.cqe.status, d.buf);
            }
        }
        if let Some(Some(conn)) = self.conns.get_mut(ckey) {
            *conn.q.completions() = done;
        }
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        if conn.q.state() == QueueState::Failed && conn.ops.is_open() {
            self.fail_conn(ckey);
            return;
        }
        if !conn.ops.is_open() {
            if conn.ops.can_free() {
                // Nothing in flight on it: close now (the FIN must not wait for another turn).
                drop(self.conns[ckey].take());
                self.free_conns.push(ckey);
            } else if conn.ops.take_cancel() {
                let _ = self.ring.cancel_fd(conn.stream.as_raw_fd());
            }
            return;
        }
        if conn.control.is_waiting() {
            // Before anything of the caller's takes the entry that just came free.
            conn.control.retry(&mut conn.q);
        }
        self.arm_recv(ckey);
        if self.conns[ckey].as_ref().is_some_and(|c| c.q.has_pending_send()) {
            self.send(ckey);
        }
        if AFTER_TAG_BUILT && self.opts.shared_tags.is_some() {
            // Requests that already hold a tag go first.
            for d in 0..self.devices.len() {
                if !self.devices[d].budget_waiting.is_empty() {
                    self.dispatch_budget_waiting(d);
                }
            }
        }
        self.dispatch_queue_waiting(qkey);
        if self.opts.shared_tags.is_some() {
            for d in 0..self.devices.len() {
                if !self.devices[d].waiting.is_empty() {
                    self.dispatch_device_waiting(d);
                }
            }
        }
    }

    /// A connection failed: its outstanding commands fail over (multipath) or
    /// wait for the reconnect, and the controller resets.
    fn fail_conn(&mut self, ckey: usize) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        conn.ops.close();
        let why = conn.q.error().unwrap_or("queue failed").to_string();
        conn.q.abort_all(Status::HOST_PATH_ERROR);
        conn.control.fail(&why);
        let control_tag = conn.q.control_tag();
        let qkey = conn.qkey;
        let conn_generation = conn.ctrl_generation;
        let mut done = std::mem::take(conn.q.completions());
        if let Some(i) = done.iter().position(|d| d.tag == control_tag) {
            conn.control.complete(done.swap_remove(i));
        }
        self.rec.on_failure(qkey);
        let qe = &mut self.queues[qkey];
        qe.conn = None;
        // Only a queue of the controller's current connection says something about it: an
        // older one failing (retired after a reset or a reconnect) must not reset the
        // controller again, or every reconnect would start the next reset.
        if qe.ctrl.generation() == conn_generation {
            qe.ctrl.report_io_failure(&why);
        }
        // Tags of the dead connection are gone with it; shared-set tags go back to their device.
        for d in done.drain(..) {
            let rid = u32::try_from(d.token).unwrap_or(u32::MAX);
            if let Some(w) = self.on_wire(rid, d.tag) {
                if w.shared {
                    let r = &self.reqs[rid as usize];
                    self.free_tag(r.dev as usize, r.qkey, w.tag, w.shared);
                }
                self.finish(rid, d.cqe.status, d.buf);
            }
        }
        // Multipath requests that waited for this queue pick another path.
        let waiting: Vec<u32> = self.queues[qkey].waiting.drain(..).collect();
        for rid in waiting {
            self.park(rid);
        }
        self.has_multi_refresh();
        self.touched.push(ckey);
    }

    /// The request a queue's completion (its token and tag) is for, if that request is
    /// on the wire under that tag: anything else (a token out of range, a request that
    /// completed already) is not its completion.
    fn on_wire(&self, rid: u32, tag: u16) -> Option<OnWire> {
        match self.reqs.get(rid as usize)?.state {
            ReqState::Outstanding(w) if w.tag == tag => Some(w),
            _ => None,
        }
    }

    /// A command finished: complete it to the caller, or send it again.
    fn finish(&mut self, rid: u32, status: Status, buf: Option<IoBuf>) {
        let ReqState::Outstanding(wire) = self.reqs[rid as usize].state else {
            tracing::error!(request = rid, state = ?self.reqs[rid as usize].state, "a completion for a request not on the wire");
            return;
        };
        let dev = self.reqs[rid as usize].dev as usize;
        self.release_budget(dev, wire.budgeted);
        let now = self.now();
        let r = &mut self.reqs[rid as usize];
        if r.op == Op::Deallocate {
            if let Some(b) = buf {
                self.dsm_bufs.push(b);
            }
        } else {
            r.buf = buf;
        }
        let latency = nanos_since(wire.sent, now);
        let qkey = r.qkey;
        let path = r.path;
        let path_error = status.is_path_error();
        if let DevKind::Multi(m) = &mut self.devices[dev].kind {
            let counted = wire.via_reference;
            m.on_complete(
                PathIndex(path),
                qkey,
                latency,
                if path_error { Outcome::PathError } else { Outcome::Done },
                counted,
            );
            if !path_error && let Some(c) = m.ios.get_mut(usize::from(path)) {
                *c += 1;
                if let Some(b) = m.bytes.get_mut(usize::from(path)) {
                    *b += u64::from(self.reqs[rid as usize].len);
                }
            }
            if path_error
                && status.is_ana_error()
                && let Some(Some(lp)) = m.paths.get_mut(usize::from(path))
            {
                lp.ctrl.request_ana_refresh();
                lp.suspect_at = Some(lp.ctrl.change_count());
                m.seen = 0;
            }
        }
        let multipath = matches!(self.devices[dev].kind, DevKind::Multi(_));
        let retries = self.reqs[rid as usize].retries;
        let queues = &self.queues;
        let disposition = disposition(status, multipath, retries, &self.opts, || queues[qkey].ctrl.should_fail_io());
        if disposition != Disposition::Complete
            && crate::failover::must_hold(op_code(self.reqs[rid as usize].op), status)
        {
            // NVMe Base 2.1 §3.9 (TP4129): the lost controller may still execute this
            // write; sent again before it quiesced, the old copy could land after a newer
            // acknowledged write (the simulator's seed 0).
            let hold = self.queues[qkey].ctrl.failover_hold();
            if !hold.is_zero() {
                self.hold(rid, hold, now);
                return;
            }
        }
        match disposition {
            Disposition::Complete => {}
            Disposition::Failover => {
                self.reqs[rid as usize].retries += 1;
                if !self.set_state(rid, ReqState::Waiting) {
                    return;
                }
                self.queues[qkey].stats.record_requeue();
                self.refresh_paths(dev);
                self.route(rid);
                return;
            }
            Disposition::Requeue => {
                // Transport failures on a single path wait for the reconnect (Linux requeues them).
                self.reqs[rid as usize].retries += 1;
                if !self.set_state(rid, ReqState::Waiting) {
                    return;
                }
                self.queues[qkey].stats.record_requeue();
                self.queues[qkey].waiting.push_back(rid);
                return;
            }
        }
        let r = &self.reqs[rid as usize];
        let outcome = if status.is_success() { blk::Outcome::Success } else { blk::Outcome::Error };
        let total = nanos_since(r.start, now);
        self.queues[qkey].stats.record(r.op.direction(), u64::from(r.len), total, outcome);
        self.complete(rid, status);
    }

    /// Holds a request whose command may still execute on its lost controller for
    /// `hold` ([`crate::failover`]), within the controller's `ctrl_loss_tmo`.
    fn hold(&mut self, rid: u32, hold: Duration, now: Instant) {
        let qkey = self.reqs[rid as usize].qkey;
        let ctrl = &self.queues[qkey].ctrl;
        // A held request ends within ctrl_loss_tmo, and never by being sent early: a hold
        // longer than that fails it then.
        let (until, fails) = match ctrl.opts.ctrl_loss_tmo {
            Some(tmo) if tmo < hold => (now + tmo, true),
            _ => (now + hold, false),
        };
        tracing::debug!(
            traddr = %ctrl.opts.traddr,
            hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
            "a write's connection failed: held until the controller has quiesced it"
        );
        self.reqs[rid as usize].retries += 1;
        if !self.set_state(rid, ReqState::Held { until, fails }) {
            return;
        }
        self.queues[qkey].stats.record_requeue();
        self.held.push_back(rid);
    }

    /// Sends again (or fails) the held requests whose hold is over; a single-path
    /// request whose controller is past fast_io_fail_tmo or gone fails at once (failing
    /// is always safe, sending early is not).
    fn release_held(&mut self, now: Instant) {
        for _ in 0..self.held.len() {
            let Some(rid) = self.held.pop_front() else { return };
            let r = &self.reqs[rid as usize];
            let (qkey, dev) = (r.qkey, r.dev as usize);
            let ReqState::Held { until, fails } = r.state else {
                tracing::error!(request = rid, state = ?r.state, "a request in the held list is not held");
                continue;
            };
            let single = !matches!(self.devices[dev].kind, DevKind::Multi(_));
            let due = until <= now;
            let fail = (due && fails) || (single && self.queues[qkey].ctrl.should_fail_io());
            if !due && !fail {
                self.held.push_back(rid);
                continue;
            }
            if fail {
                self.complete(rid, Status::HOST_PATH_ERROR);
            } else if !self.set_state(rid, ReqState::Waiting) {
                continue;
            } else if single {
                self.queues[qkey].waiting.push_back(rid);
                self.dispatch_queue_waiting(qkey);
            } else {
                self.route(rid);
            }
        }
    }

    /// Completes a request to the caller and frees its slot.
    fn complete(&mut self, rid: u32, status: Status) {
        if !self.set_state(rid, ReqState::Free) {
            return;
        }
        let now = self.now();
        let r = &mut self.reqs[rid as usize];
        let latency_ns = nanos_since(r.start, now);
        let buf = r.buf.take();
        let last = r.was_sent.then_some((r.path, r.qkey, r.nsid));
        self.rec.record(r.dev, last, r.op.direction(), r.len, latency_ns, status.is_success());
        self.done.push(Completion { token: r.token, status, buf, latency_ns });
        self.free_reqs.push(rid);
    }

    /// Re-reads the path states of a multipath device when anything they
    /// depend on moved (head, controllers, local connections), then retries
    /// requests waiting for a path.
    fn refresh_paths(&mut self, dev: usize) {
        let DevKind::Multi(m) = &mut self.devices[dev].kind else { return };
        let head_gen = m.head.generation();
        if head_gen != m.seen_head {
            // Paths added or removed, or the policy switched.
            m.seen_head = head_gen;
            m.seen = 0;
            let policy = m.head.policy();
            if m.sel.policy() != policy {
                m.sel.set_policy(policy);
            }
            m.reference = m.head.reference();
            m.ref_gen = m.ref_gen.wrapping_add(1).max(1);
            let slots = m.head.paths();
            let mut attach = Vec::new();
            for (i, s) in slots.iter().enumerate() {
                let have = m.paths.get(i).and_then(Option::as_ref).map(|lp| (Arc::as_ptr(&lp.ctrl), lp.nsid));
                let want = s.as_ref().map(|(c, n)| (Arc::as_ptr(c), *n));
                if have != want {
                    if m.paths.len() <= i {
                        m.paths.resize_with(i + 1, || None);
                        m.ios.resize(i + 1, 0);
                        m.bytes.resize(i + 1, 0);
                    }
                    m.paths[i] = None;
                    if let Some((c, n)) = s {
                        attach.push((i, Arc::clone(c), *n));
                    }
                }
            }
            for (i, c, n) in attach {
                if let Ok(qkey) = self.attach(&c)
                    && let DevKind::Multi(m) = &mut self.devices[dev].kind
                {
                    m.paths[i] = Some(LocalPath { ctrl: c, nsid: n, qkey, suspect_at: None });
                }
            }
        }
        let DevKind::Multi(m) = &mut self.devices[dev].kind else { return };
        // The view key: cheap relaxed loads only.
        let mut key = m.seen_head.wrapping_mul(0x100_0000_01b3) | 1;
        for lp in m.paths.iter().flatten() {
            let conn = self.queues[lp.qkey].conn.is_some();
            key = key
                .wrapping_mul(31)
                .wrapping_add(lp.ctrl.change_count())
                .wrapping_mul(3)
                .wrapping_add(u64::from(lp.ctrl.is_live()) * 2 + u64::from(conn));
        }
        if key == m.seen {
            return;
        }
        m.seen = key;
        let mut states = Vec::with_capacity(m.paths.len());
        for (i, p) in m.paths.iter_mut().enumerate() {
            states.push(match p {
                None => PathState::new(u64::MAX - i as u64, PathClass::Gone),
                Some(lp) => {
                    if lp.suspect_at.is_some_and(|at| at != lp.ctrl.change_count()) {
                        lp.suspect_at = None;
                    }
                    let mut class = class_of(&lp.ctrl, lp.nsid);
                    let conn = self.queues[lp.qkey].conn.is_some();
                    if class.is_usable() && (!conn || lp.suspect_at.is_some()) {
                        class = PathClass::Transient;
                    }
                    PathState::new(path_id(&lp.ctrl, lp.nsid), class)
                }
            });
        }
        m.sel.set_paths(&states);
        if !self.devices[dev].waiting.is_empty() {
            self.dispatch_device_waiting(dev);
        }
    }

    fn on_msg(&mut self, m: QueueMsg) {
        match m {
            QueueMsg::Queue { ctrl, index, generation, stream, queue } => {
                let Some(qkey) = self.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, &ctrl) && q.index == index)
                else {
                    ctrl.release_queue(index, Some((stream, queue)));
                    return;
                };
                if let Some(old) = self.queues[qkey].conn {
                    // A reconnect raced a failure we had not noticed: retire the old connection.
                    self.fail_conn(old);
                }
                tracing::debug!(index, generation, "queue (re)connected");
                self.install(qkey, stream, queue, generation);
            }
            QueueMsg::Command { ctrl, index, generation, io, reply } => {
                let conn = self
                    .queues
                    .iter()
                    .find(|q| Arc::ptr_eq(&q.ctrl, &ctrl) && q.index == index)
                    .and_then(|q| q.conn)
                    .filter(|&k| {
                        self.conns.get(k).and_then(Option::as_ref).is_some_and(|c| {
                            c.ops.is_open() && c.ctrl_generation == generation && c.q.state() == QueueState::Live
                        })
                    });
                let Some(ckey) = conn else {
                    let _ = reply.send(Err(Error::new(
                        ErrorKind::Gone,
                        format!("queue {}: no live connection of that generation here", index + 1),
                    )));
                    return;
                };
                if let Some(Some(c)) = self.conns.get_mut(ckey) {
                    c.control.offer(&mut c.q, io, reply);
                }
                self.touched.push(ckey);
            }
        }
    }

    /// Periodic work: fail waiting I/O of controllers that are gone or past
    /// fast_io_fail_tmo; reset controllers with timed-out commands; let
    /// shared-tag users return idle tags.
    fn tick(&mut self) {
        let now = self.now();
        for qkey in 0..self.queues.len() {
            let qe = &self.queues[qkey];
            // The controller reset (keep-alive timeout, admin queue lost, another queue
            // failed): this queue's commands will never complete, fail them over now
            // (Linux's error recovery cancels every request of the old queues).
            if let Some(ckey) = qe.conn
                && let Some(Some(conn)) = self.conns.get_mut(ckey)
                && conn.ops.is_open()
                && conn.q.state() != QueueState::Failed
                && qe.ctrl.generation() != conn.ctrl_generation
            {
                tracing::debug!(traddr = %qe.ctrl.opts.traddr, index = qe.index, "controller reset: failing its queue");
                conn.q.set_failed("controller reset");
                self.touched.push(ckey);
            }
            let qe = &self.queues[qkey];
            if qe.conn.is_none() && !qe.waiting.is_empty() && qe.ctrl.should_fail_io() {
                let waiting: Vec<u32> = self.queues[qkey].waiting.drain(..).collect();
                for rid in waiting {
                    let dev = self.reqs[rid as usize].dev as usize;
                    if matches!(self.devices[dev].kind, DevKind::Multi(_)) {
                        self.devices[dev].waiting.push_back(rid);
                    } else {
                        self.complete(rid, Status::HOST_PATH_ERROR);
                    }
                }
            }
        }
        if !self.held.is_empty() {
            self.release_held(now);
        }
        for d in &mut self.devices {
            if let Some(u) = d.tags.as_mut() {
                u.tick();
            }
        }
        for d in 0..self.devices.len() {
            if !self.devices[d].budget_waiting.is_empty() {
                self.dispatch_budget_waiting(d);
            }
        }
        for d in 0..self.devices.len() {
            if !self.devices[d].waiting.is_empty() {
                if let DevKind::Multi(m) = &mut self.devices[d].kind {
                    m.seen = 0;
                }
                self.refresh_paths(d);
                self.dispatch_device_waiting(d);
            }
        }
        let timeout = self.opts.io_timeout;
        let stall = self.opts.stall_threshold;
        for i in 0..self.reqs.len() {
            let r = &self.reqs[i];
            let ReqState::Outstanding(w) = r.state else {
                continue;
            };
            let age = now.saturating_duration_since(w.sent);
            if age > stall && !w.stall_reported {
                let qe = &self.queues[r.qkey];
                let conn = qe.conn.and_then(|k| self.conns.get(k)).and_then(Option::as_ref);
                let opcode = conn.and_then(|c| c.q.sqe_of(w.tag)).map_or_else(|| op_code(r.op), nvme::Sqe::opcode);
                let report = StallReport {
                    traddr: qe.ctrl.opts.traddr,
                    cntlid: qe.ctrl.cntlid().0,
                    qid: qe.index + 1,
                    cid: w.tag,
                    opcode,
                    age,
                    queue_outstanding: conn.map_or(0, |c| c.q.outstanding()),
                    queue_connected: conn.is_some(),
                };
                tracing::warn!(
                    traddr = %report.traddr, cntlid = report.cntlid, qid = report.qid, cid = report.cid,
                    opcode = report.opcode, age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
                    queue_outstanding = report.queue_outstanding, queue_connected = report.queue_connected,
                    "I/O stall"
                );
                self.stalls.push(report);
                if let ReqState::Outstanding(w) = &mut self.reqs[i].state {
                    w.stall_reported = true;
                }
            }
            let r = &self.reqs[i];
            if age > timeout {
                let qe = &self.queues[r.qkey];
                if let Some(ckey) = qe.conn {
                    tracing::warn!(request = i, "I/O timeout: resetting the controller");
                    if let Some(Some(c)) = self.conns.get_mut(ckey) {
                        c.q.set_failed("I/O timeout");
                    }
                    self.touched.push(ckey);
                }
            }
        }
    }
}

fn op_code(op: Op) -> u8 {
    match op {
        Op::Read => opc::READ,
        Op::Write => opc::WRITE,
        Op::Flush => opc::FLUSH,
        Op::WriteZeroes => opc::WRITE_ZEROES,
        Op::Deallocate => opc::DATASET_MANAGEMENT,
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Final numbers first: what a hub shows after this context is exact.
        self.publish(true);
        self.rec.retire();
        // Give idle connections back to their controllers so another context can claim them.
        for qkey in 0..self.queues.len() {
            let ckey = self.queues[qkey].conn.take();
            let index = self.queues[qkey].index;
            let ctrl = Arc::clone(&self.queues[qkey].ctrl);
            let conn = ckey.and_then(|k| self.conns.get_mut(k).and_then(Option::take));
            match conn {
                Some(mut c) if c.q.outstanding() == 0 && !c.ops.send_in_flight() => {
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
                                    c.q.on_recv_none(b);
                                    c.ops.recv_done();
                                }
                            }
                        }
                    }
                    if c.ops.recv_in_flight() {
                        ctrl.release_queue(index, None);
                    } else {
                        ctrl.release_queue(index, Some((c.stream, c.q)));
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

    fn opts(max_retries: u32, max_failovers: u32) -> ContextOptions {
        ContextOptions { max_retries, max_failovers, ..ContextOptions::default() }
    }

    fn never_asked() -> bool {
        panic!("the controller was asked whether it is gone for a status that does not need it")
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
    fn multi_with_reference() -> (Multi, Arc<crate::mpath::reference::SharedAtomic>) {
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
        ctx.has_multi = true;
        let dev = ctx.new_device(DevKind::Multi(Box::new(m)), 9, nsze, None).unwrap();
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
        let DevKind::Multi(m) = &mut ctx.devices[dev.0 as usize].kind else { unreachable!() };
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
