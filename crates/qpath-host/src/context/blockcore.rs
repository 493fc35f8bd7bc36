//! The block core: request slots, the devices' waiting lists, tags and budgets, and the
//! decisions of a request's life (route, send, requeue, fail over, hold, time out,
//! complete), with no ring, socket, mailbox or clock of its own.
//!
//! ```text
//!   owner (Context, a simulator) ── submit(.., now) ──► BlockCore ── HostQueue::submit
//!        │  bytes to and from the sockets                  │  (what to send: flush_list)
//!        └── HostQueue::on_recv ─► deliver(conn, .., now) ─┘──► done: (token, status, buffer)
//!            queue failed        ─► fail_conn(conn, .., now)
//!            every few ms        ─► tick(now)
//! ```
//!
//! The owner reads the clock once per poll turn and passes it in; it owns the sockets,
//! moves the bytes of each connection's [`HostQueue`] (which the core submits commands
//! to and takes completions from), and attaches the queues the core asks for
//! ([`BlockCore::take_attaches`]). The core is generic over its controllers
//! ([`CoreController`], and their heads [`super::ctrlview::CoreHead`]): `Context` runs it
//! over [`crate::controller::Controller`], its unit tests over a small test controller, and
//! a simulator can run it over its own path state.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blk::{Tag, TagAllocator, TagSet};
use nvme::opcode::io as opc;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::IoBuf;

use self::identity::NsPresence;
use super::ctrlview::{CoreController, CoreHead, NsIds};
use super::req::{Claim, OnWire, Req, ReqState};
use super::{
    AFTER_TAG_BUILT, Completion, ContextOptions, DepthLimitOrder, DevEntry, DevKind, DeviceId, LocalPath, Multi, Op,
    QEntry, QueueConn, StallReport,
};
use crate::error::{Error, ErrorKind, Result};
use crate::failover::{Disposition, disposition, lost_authentication};
use crate::head::path_id;
use crate::mpath::{Outcome, PathClass, PathIndex, PathState, Selection};
use crate::queue::{DataDir, Done, HostQueue, Io, QueueState};
use crate::stats::Recorder;

/// How long before its creation a core's nanosecond clock starts: a
/// caller's clock read from before the core was made (a submission time) still counts
/// from its own time.
const EPOCH_LEAD_NS: u64 = 86_400 * 1_000_000_000;

/// A connection with more commands than this in flight is deep: served after the others.
const SHALLOW_OUTSTANDING_MAX: usize = 4;

/// A path of a multipath device whose controller this context has no queue of yet:
/// the owner claims one and gives it back with [`BlockCore::set_path`].
pub struct PathAttach<C> {
    /// The multipath device.
    pub dev: usize,
    /// Its path slot.
    pub slot: usize,
    /// The path's controller.
    pub ctrl: Arc<C>,
    /// The namespace through it.
    pub nsid: Nsid,
}

/// The block core of one context (see the module's text).
pub struct BlockCore<C: CoreController> {
    pub(super) opts: ContextOptions,
    /// The time of the call in progress (its caller's clock read).
    pub(super) now: Instant,
    /// The same as nanoseconds since `epoch`: the core keeps its times so (a request's
    /// start and send), and a duration is one subtraction, not one per `Instant` pair.
    pub(super) now_ns: u64,
    /// Time zero of its nanosecond clock: [`EPOCH_LEAD_NS`] before the core's creation.
    epoch: Instant,
    /// Connections' queues by connection key (the owner keeps their sockets under the same key).
    pub(super) conns: Vec<Option<QueueConn>>,
    pub(super) free_conns: Vec<usize>,
    pub(super) queues: Vec<QEntry<C>>,
    pub(super) devices: Vec<DevEntry<C>>,
    pub(super) reqs: Vec<Req>,
    pub(super) free_reqs: Vec<u32>,
    pub(super) done: Vec<Completion>,
    /// Queues that took commands since the owner last sent their batches.
    pub(super) flush_list: Vec<usize>,
    /// Connections to service (completions to deliver, a failure to handle).
    pub(super) touched: Vec<usize>,
    dsm_bufs: Vec<IoBuf>,
    /// Requests that change data, held after their connection failed until the old
    /// controller can no longer execute them ([`crate::failover`]). Allocated for every
    /// request at creation: holding one never allocates.
    held: VecDeque<u32>,
    pub(super) has_multi: bool,
    pub(super) stalls: Vec<StallReport>,
    /// Statistics for a [`crate::stats::HostStats`] (inert without one).
    pub(super) rec: Recorder,
    attaches: Vec<PathAttach<C>>,
}

impl<C: CoreController> BlockCore<C> {
    /// A core with `opts.max_requests` request slots (clamped to 1..=2^20).
    pub fn new(opts: ContextOptions, now: Instant) -> BlockCore<C> {
        let n = opts.max_requests.clamp(1, 1 << 20);
        let epoch = now.checked_sub(Duration::from_nanos(EPOCH_LEAD_NS)).unwrap_or(now);
        BlockCore {
            now,
            now_ns: nanos_since(epoch, now),
            epoch,
            conns: Vec::new(),
            free_conns: Vec::new(),
            queues: Vec::new(),
            devices: Vec::new(),
            reqs: (0..n).map(|_| Req::free()).collect(),
            free_reqs: (0..u32::try_from(n).unwrap_or(u32::MAX)).rev().collect(),
            done: Vec::with_capacity(n),
            flush_list: Vec::new(),
            touched: Vec::new(),
            dsm_bufs: Vec::new(),
            held: VecDeque::with_capacity(n),
            has_multi: false,
            stalls: Vec::new(),
            rec: Recorder::new(opts.stats.clone(), opts.stats_interval),
            attaches: Vec::new(),
            opts,
        }
    }

    /// Makes `now` the time of the call in progress. The calls of one poll turn share
    /// their clock read: only a new one is converted to the nanosecond clock.
    #[inline]
    fn set_now(&mut self, now: Instant) {
        if now != self.now {
            self.now = now;
            self.now_ns = self.clock_ns(now);
        }
    }

    /// `t` on the core's nanosecond clock (0 for a time more than [`EPOCH_LEAD_NS`] before
    /// the core's creation).
    #[inline]
    pub(super) fn clock_ns(&self, t: Instant) -> u64 {
        nanos_since(self.epoch, t)
    }

    /// Requests in flight (waiting or on the wire).
    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free_reqs.len()
    }

    /// A queue the owner claimed: its requests go to queue `qkey` from now on.
    pub fn add_queue(&mut self, ctrl: &Arc<C>, index: u16) -> Result<usize> {
        let qkey = self.queues.len();
        let placeholder = TagSet::new(1).map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
        self.queues.push(QEntry {
            ctrl: Arc::clone(ctrl),
            index,
            conn: None,
            entries: 0,
            tags: blk::QueueTags::Private(placeholder),
            waiting: VecDeque::new(),
            in_flush_list: false,
            stats: blk::QueueStats::new(),
        });
        Ok(qkey)
    }

    /// A live connection of queue `qkey` (of controller generation `ctrl_generation`):
    /// returns its connection key; the requests waiting for the queue go out on it.
    pub fn install(&mut self, qkey: usize, q: HostQueue, ctrl_generation: u64, now: Instant) -> usize {
        self.set_now(now);
        let entries = q.entries();
        let key = self.free_conns.pop().unwrap_or(self.conns.len());
        let progress_at = self.now_ns;
        let conn = QueueConn { q, ctrl_generation, qkey, open: true, latency_ewma_ns: 0, progress_at };
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
            qe.tags = blk::QueueTags::Private(t);
        }
        self.dispatch_queue_waiting(qkey);
        self.has_multi_refresh();
        key
    }

    /// Frees a closed connection's key (nothing of it in flight any more).
    pub fn free_conn(&mut self, ckey: usize) {
        if self.conns.get_mut(ckey).and_then(Option::take).is_some() {
            self.free_conns.push(ckey);
        }
    }

    /// Submits an I/O of `len` bytes at byte `offset` of `dev` at time `now`
    /// ([`super::Context::submit_from`]).
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        dev: DeviceId,
        submitter: u32,
        op: Op,
        offset: u64,
        len: u32,
        buf: Option<IoBuf>,
        token: u64,
        now: Instant,
    ) -> std::result::Result<(), (Error, Option<IoBuf>)> {
        let Some(d) = self.devices.get(dev.0 as usize) else {
            return Err((Error::new(ErrorKind::Invalid, "no such device"), buf));
        };
        if d.presence.refuses() {
            // The namespace may be back since the last poll turn (only a refusal looks).
            self.refresh_size(dev.0 as usize);
            if let Some(e) = self.refusal(dev.0 as usize) {
                return Err((e, buf));
            }
        }
        let d = &self.devices[dev.0 as usize];
        let bs = 1u64 << d.block_shift;
        let len64 = u64::from(len);
        if !offset.is_multiple_of(bs) || !len64.is_multiple_of(bs) || (len == 0 && op.has_data()) {
            return Err((
                Error::new(ErrorKind::Invalid, format!("offset {offset} / length {len} not multiples of {bs}")),
                buf,
            ));
        }
        let slba = offset >> d.block_shift;
        let nlb = len64 >> d.block_shift;
        if op != Op::Flush && slba.checked_add(nlb).is_none_or(|e| e > d.nsze) {
            // The namespace may have grown since the last poll turn (not a per-I/O cost:
            // only a refusal looks, with one load per controller).
            let nsze = self.refresh_size(dev.0 as usize);
            if let Some(e) = self.refusal(dev.0 as usize) {
                return Err((e, buf));
            }
            if slba.checked_add(nlb).is_none_or(|e| e > nsze) {
                return Err((Error::new(ErrorKind::Invalid, "beyond the end of the device"), buf));
            }
        }
        if op.has_data() && buf.as_ref().is_none_or(|b| b.capacity() < len as usize) {
            return Err((Error::new(ErrorKind::Invalid, "buffer smaller than the transfer"), buf));
        }
        if nlb > 65536 {
            return Err((Error::new(ErrorKind::Invalid, "more than 65536 blocks in one command"), buf));
        }
        let Some(rid) = self.free_reqs.pop() else {
            return Err((Error::new(ErrorKind::Busy, "too many requests in flight"), buf));
        };
        self.set_now(now);
        let r = &mut self.reqs[rid as usize];
        r.dev = dev.0;
        r.op = op;
        r.slba = slba;
        r.nlb = u32::try_from(nlb).unwrap_or(0);
        r.len = len;
        r.buf = buf;
        r.token = token;
        r.start = self.now_ns;
        r.retries = 0;
        r.was_sent = false;
        r.submitter = submitter;
        if self.set_state(rid, ReqState::Waiting) {
            self.route(rid);
        }
        Ok(())
    }

    /// Delivers the completions connection `ckey`'s queue has (after bytes came in or a
    /// send finished): each to its request, which completes or goes out again. The
    /// queue's control command's completion goes to `control`. A `dying` connection
    /// (failed, its tags gone with it) gives no tag back.
    pub fn deliver(&mut self, ckey: usize, dying: bool, now: Instant, mut control: impl FnMut(Done)) {
        self.set_now(now);
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        if conn.q.completions().is_empty() {
            // A send's completion, a receive of part of a PDU: nothing finished.
            return;
        }
        let control_tag = conn.q.control_tag();
        let mut done = std::mem::take(conn.q.completions());
        for d in done.drain(..) {
            if d.tag == control_tag {
                control(d);
                continue;
            }
            let rid = u32::try_from(d.token).unwrap_or(u32::MAX);
            if let Some(w) = self.on_wire(rid, d.tag) {
                let now_ns = self.now_ns;
                if let Some(Some(conn)) = self.conns.get_mut(ckey) {
                    conn.record_latency(now_ns.saturating_sub(w.sent), now_ns);
                }
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
    }

    /// After a connection was serviced: requests waiting for budget, for its queue and
    /// (with a shared tag set) for a tag go out as far as they can.
    pub fn dispatch_after_service(&mut self, qkey: usize, now: Instant) {
        self.set_now(now);
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

    /// Connection `ckey` failed: its queue gives back every command with a path error.
    /// Returns why it failed. Then [`BlockCore::fail_conn`].
    pub fn abort_conn(&mut self, ckey: usize) -> Option<String> {
        let conn = self.conns.get_mut(ckey)?.as_mut()?;
        conn.open = false;
        let why = conn.q.error().unwrap_or("queue failed").to_string();
        conn.q.abort_all(Status::HOST_PATH_ERROR);
        Some(why)
    }

    /// A connection failed (after [`BlockCore::abort_conn`]): its outstanding commands
    /// fail over (multipath) or wait for the reconnect, and the controller resets.
    pub fn fail_conn(&mut self, ckey: usize, why: &str, now: Instant, mut control: impl FnMut(Done)) {
        self.set_now(now);
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        let control_tag = conn.q.control_tag();
        let qkey = conn.qkey;
        let conn_generation = conn.ctrl_generation;
        let mut done = std::mem::take(conn.q.completions());
        if let Some(i) = done.iter().position(|d| d.tag == control_tag) {
            control(done.swap_remove(i));
        }
        self.rec.on_failure(qkey);
        let qe = &mut self.queues[qkey];
        qe.conn = None;
        // Only a queue of the controller's current connection says something about it: an
        // older one failing (retired after a reset or a reconnect) must not reset the
        // controller again, or every reconnect would start the next reset.
        if qe.ctrl.generation() == conn_generation {
            qe.ctrl.report_io_failure(why);
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

    /// Whether [`BlockCore::take_attaches`] has anything (a look, no move).
    #[inline]
    pub fn has_attaches(&self) -> bool {
        !self.attaches.is_empty()
    }

    /// Paths whose controllers the owner must claim a queue of (after a head changed).
    pub fn take_attaches(&mut self) -> Vec<PathAttach<C>> {
        std::mem::take(&mut self.attaches)
    }

    /// Gives a path the owner was asked for ([`BlockCore::take_attaches`]) the queue
    /// `qkey` it claimed of that controller ([`BlockCore::add_queue`]).
    pub fn attach_path(&mut self, a: PathAttach<C>, qkey: usize) {
        self.set_path(a.dev, a.slot, LocalPath::new(a.ctrl, a.nsid, qkey));
    }

    /// Opens namespace `nsid` on queue `qkey` (one path): `block_shift` and `nsze` as the
    /// controller identified them; `depth_limit` caps its requests on the wire.
    pub fn open_single(
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

    /// Opens a multipath head whose path slots are `paths` (each a controller, the
    /// namespace through it, and the queue of it the owner claimed), as
    /// [`super::Context::open_head`] does; `cpu` seeds its selector.
    pub fn open_multi(
        &mut self,
        head: &Arc<C::Head>,
        paths: Vec<Option<(Arc<C>, Nsid, usize)>>,
        block_shift: u8,
        nsze: u64,
        cpu: usize,
        now: Instant,
    ) -> Result<DeviceId> {
        if paths.iter().flatten().any(|(_, _, qkey)| *qkey >= self.queues.len()) {
            return Err(Error::new(ErrorKind::Invalid, "no such queue"));
        }
        let n = paths.len();
        let paths = paths.into_iter().map(|p| p.map(|(ctrl, nsid, qkey)| LocalPath::new(ctrl, nsid, qkey)));
        let m = Multi {
            head: Arc::clone(head),
            sel: crate::mpath::Selector::new(CoreHead::policy(&**head), cpu),
            reference: CoreHead::reference(&**head),
            ref_gen: 1,
            paths: paths.collect(),
            seen: 0,
            seen_head: CoreHead::generation(&**head),
            ios: vec![0; n],
            bytes: vec![0; n],
        };
        self.has_multi = true;
        let id = self.new_device(DevKind::Multi(Box::new(m)), block_shift, nsze, None)?;
        self.refresh_device(id.0 as usize, now);
        Ok(id)
    }

    /// The queue of connection `ckey`, whose bytes the owner moves.
    pub fn queue_mut(&mut self, ckey: usize) -> Option<&mut HostQueue> {
        Some(&mut self.conns.get_mut(ckey)?.as_mut()?.q)
    }

    /// Completed requests since the last drain.
    pub fn completions(&mut self) -> std::vec::Drain<'_, Completion> {
        self.done.drain(..)
    }

    /// The connections to service since the last call (completions to deliver, a
    /// failure to handle): the owner delivers each, or fails it.
    pub fn take_touched(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.touched)
    }

    /// The connections of the queues that took commands since the last call: the owner
    /// sends their batches.
    pub fn take_flushes(&mut self) -> Vec<usize> {
        let list = std::mem::take(&mut self.flush_list);
        let mut conns = Vec::with_capacity(list.len());
        for qkey in list {
            let qe = &mut self.queues[qkey];
            qe.in_flush_list = false;
            conns.extend(qe.conn);
        }
        conns
    }

    /// The caller's token of the request on the wire under command id `cid` on
    /// connection `ckey` (an owner that watches what goes out: a simulator's checks).
    /// Not for the I/O path: it looks at every request slot.
    pub fn token_on_wire(&self, ckey: usize, cid: u16) -> Option<u64> {
        let qkey = self.conns.get(ckey)?.as_ref()?.qkey;
        self.reqs
            .iter()
            .find(|r| r.qkey == qkey && matches!(r.state, ReqState::Outstanding(w) if w.tag == cid))
            .map(|r| r.token)
    }

    /// Device `dev`'s size in blocks as the core last read it.
    pub fn capacity(&self, dev: DeviceId) -> Option<u64> {
        self.devices.get(dev.0 as usize).map(|d| d.nsze)
    }

    /// Stall reports since the last call.
    pub fn take_stalls(&mut self) -> Vec<StallReport> {
        std::mem::take(&mut self.stalls)
    }

    /// Gives path `slot` of multipath device `dev` its local path.
    pub(super) fn set_path(&mut self, dev: usize, slot: usize, lp: LocalPath<C>) {
        if let DevKind::Multi(m) = &mut self.devices[dev].kind
            && let Some(p) = m.paths.get_mut(slot)
        {
            *p = Some(lp);
            m.seen = 0;
        }
    }

    /// Re-reads the paths of device `dev` (a multipath head that changed).
    pub fn refresh_device(&mut self, dev: usize, now: Instant) {
        self.set_now(now);
        self.refresh_paths(dev);
    }

    /// Re-reads every multipath device's paths (once per poll turn).
    pub fn refresh_all_paths(&mut self, now: Instant) {
        self.set_now(now);
        if self.has_multi {
            for d in 0..self.devices.len() {
                self.refresh_paths(d);
            }
        }
    }

    /// Follows every device's namespace size (once per poll turn): a device whose
    /// controllers' change counts moved re-reads it ([`BlockCore::refresh_size`]).
    pub fn refresh_sizes(&mut self) {
        for dev in 0..self.devices.len() {
            self.refresh_size(dev);
        }
    }

    /// The change counts a device's size depends on, folded: its controller's (single,
    /// spread) or its present paths' and its head's (multipath): one load each.
    #[inline]
    fn size_key(&self, dev: usize) -> u64 {
        match &self.devices[dev].kind {
            DevKind::Single { qkey, .. } => self.queues[*qkey].ctrl.change_count(),
            DevKind::Spread(sp) => sp.qkeys.first().map_or(0, |&k| self.queues[k].ctrl.change_count()),
            DevKind::Multi(m) => {
                m.paths.iter().flatten().fold(CoreHead::generation(&*m.head), |k, lp| {
                    k.wrapping_mul(31).wrapping_add(lp.ctrl.change_count())
                })
            }
        }
    }

    /// Re-reads device `dev`'s size if its controllers changed since it was last read
    /// (Linux revalidates a disk's capacity after a Namespace Attribute Changed event:
    /// `nvme_update_ns_info`); returns the size in blocks. A multipath device takes the
    /// smallest size its live paths report (a path whose controller has not rescanned
    /// yet keeps a grown device at its old end for a moment, never lets a shrunk one be
    /// written past its new end; one that is down keeps its last size until it is back
    /// and has rescanned), or all its paths' when none is live. A namespace whose block size changed refuses all I/O:
    /// every offset the caller computes would land elsewhere.
    #[inline]
    fn refresh_size(&mut self, dev: usize) -> u64 {
        let key = self.size_key(dev);
        let d = &self.devices[dev];
        if key == d.size_seen {
            return d.nsze;
        }
        self.reread_size(dev, key)
    }

    /// [`BlockCore::refresh_size`] of a device whose change counts moved (to `key`).
    #[cold]
    #[inline(never)]
    fn reread_size(&mut self, dev: usize, key: u64) -> u64 {
        self.refresh_presence(dev);
        let d = &self.devices[dev];
        let geometry = match &d.kind {
            DevKind::Single { qkey, nsid } => self.queues[*qkey].ctrl.namespace_geometry(*nsid),
            DevKind::Spread(sp) => sp.qkeys.first().and_then(|&k| self.queues[k].ctrl.namespace_geometry(sp.nsid)),
            DevKind::Multi(m) => {
                // Live paths' sizes: a controller that is down keeps its last rescan's.
                let smallest = |live_only: bool| {
                    m.paths
                        .iter()
                        .flatten()
                        .filter(|lp| !live_only || lp.ctrl.is_live())
                        .filter_map(|lp| lp.ctrl.namespace_geometry(lp.nsid))
                        .min_by_key(|&(shift, nsze)| (shift != d.block_shift, nsze))
                };
                smallest(true).or_else(|| smallest(false))
            }
        };
        let d = &mut self.devices[dev];
        d.size_seen = key;
        let Some((shift, nsze)) = geometry else {
            // Gone from the controller's list: the device refuses I/O (`refresh_presence`).
            return d.nsze;
        };
        let nsze = if shift == d.block_shift {
            nsze
        } else {
            tracing::warn!(
                device = dev,
                was = 1u64 << d.block_shift,
                now = 1u64 << shift,
                "the namespace's block size changed: its device refuses I/O"
            );
            0
        };
        if nsze != d.nsze {
            tracing::info!(device = dev, blocks = nsze, was = d.nsze, "the namespace was resized");
            d.nsze = nsze;
        }
        nsze
    }

    /// The (controller, NSID) a device of `kind` reaches its namespace through: its queue's
    /// of a single device, the first queue's of a spread one, every present path's of a
    /// multipath one. No allocation (read where sizes are re-read, and on a refusal).
    fn dev_paths<'a>(&'a self, kind: &'a DevKind<C>) -> impl Iterator<Item = (&'a C, Nsid)> + 'a {
        let (one, paths) = match kind {
            DevKind::Single { qkey, nsid } => (Some((&*self.queues[*qkey].ctrl, *nsid)), None),
            DevKind::Spread(sp) => (sp.qkeys.first().map(|&k| (&*self.queues[k].ctrl, sp.nsid)), None),
            DevKind::Multi(m) => (None, Some(m.paths.iter().flatten().map(|lp| (&*lp.ctrl, lp.nsid)))),
        };
        one.into_iter().chain(paths.into_iter().flatten())
    }

    /// The identifiers device `dev`'s namespace has now, as its controllers list it (at
    /// its opening: the first present path's of a multipath device).
    fn listed_ids(&self, kind: &DevKind<C>) -> Option<NsIds> {
        self.dev_paths(kind).find_map(|(c, nsid)| c.namespace_ids(nsid))
    }

    /// The NSID device `dev` addresses (the first path's of a multipath device).
    fn dev_nsid(&self, dev: usize) -> Option<Nsid> {
        self.dev_paths(&self.devices[dev].kind).map(|(_, nsid)| nsid).next()
    }

    /// Compares device `dev`'s namespace, as its controllers' last successful scans list
    /// it, with the one it was opened on ([`identity`]); called where its size is re-read
    /// (a change count moved). A namespace removed or replaced fails every request of
    /// the device not yet on the wire, and the device refuses I/O; the same namespace
    /// listed again takes I/O again. Said once in the log at each change.
    fn refresh_presence(&mut self, dev: usize) {
        let d = &self.devices[dev];
        let opened = d.ids;
        // One path (single, spread) says it alone; a multipath device's paths together.
        let seen =
            identity::fold(self.dev_paths(&d.kind).map(|(c, nsid)| identity::seen(opened, c.namespace_ids(nsid))));
        let Some(seen) = seen else { return };
        let was = d.presence;
        let now = was.transition(seen);
        if now == was {
            return;
        }
        self.devices[dev].presence = now;
        let nsid = self.dev_nsid(dev).map_or(0, |n| n.0);
        let old = opened.map_or_else(|| "none".to_string(), |i| i.to_string());
        match (now, seen) {
            (NsPresence::Replaced, identity::Seen::Replaced(new)) => tracing::warn!(
                device = dev, nsid, old = %old, new = %new,
                "another namespace is under the NSID the device was opened on: the device refuses I/O from now on"
            ),
            (NsPresence::Removed, _) => tracing::warn!(
                device = dev, nsid, ids = %old,
                "the namespace was removed from the controller: the device refuses I/O until it is back"
            ),
            (NsPresence::Present, _) => tracing::info!(device = dev, nsid, ids = %old, "the namespace is back"),
            (NsPresence::Replaced, _) => {}
        }
        if now.refuses() {
            self.fail_unsent(dev);
        }
    }

    /// The error a submission to device `dev` gets while its namespace is gone.
    fn refusal(&self, dev: usize) -> Option<Error> {
        let nsid = self.dev_nsid(dev).map_or(0, |n| n.0);
        match self.devices[dev].presence {
            NsPresence::Present => None,
            NsPresence::Removed => Some(Error::new(
                ErrorKind::NamespaceGone,
                format!("namespace {nsid} was removed from the target: the device refuses I/O"),
            )),
            NsPresence::Replaced => Some(Error::new(
                ErrorKind::NamespaceGone,
                format!(
                    "namespace {nsid} was replaced by another namespace under the same NSID: the device refuses I/O"
                ),
            )),
        }
    }

    /// Fails every request of device `dev` that is not on the wire (waiting for a queue,
    /// a path, a tag or budget, or held after a lost connection): its namespace is gone,
    /// and nothing of it may go out any more, to another namespace under its NSID least
    /// of all. Completed with the status of a device that has no path left (EIO, as
    /// Linux fails a bio of a disk it removed).
    fn fail_unsent(&mut self, dev: usize) {
        let reqs = &self.reqs;
        let of_dev = |rid: &u32| reqs[*rid as usize].dev as usize == dev;
        let mut unsent: Vec<u32> = Vec::new();
        for qe in &mut self.queues {
            unsent.extend(qe.waiting.iter().copied().filter(of_dev));
            qe.waiting.retain(|r| !of_dev(r));
        }
        unsent.extend(self.held.iter().copied().filter(of_dev));
        self.held.retain(|r| !of_dev(r));
        let d = &mut self.devices[dev];
        unsent.extend(d.waiting.drain(..));
        let budget: Vec<u32> = d.budget_waiting.drain(..).collect();
        for rid in budget {
            let r = &self.reqs[rid as usize];
            if let Some((tag, shared)) = r.state.tag() {
                self.free_tag(dev, r.qkey, tag, shared);
            }
            if self.set_state(rid, ReqState::Waiting) {
                unsent.push(rid);
            }
        }
        for rid in unsent {
            self.complete(rid, Status::HOST_PATH_ERROR);
        }
    }

    pub(super) fn has_multi_refresh(&mut self) {
        if self.has_multi {
            for d in &mut self.devices {
                if let DevKind::Multi(m) = &mut d.kind {
                    m.seen = 0;
                }
            }
        }
    }

    pub(super) fn new_device(
        &mut self,
        kind: DevKind<C>,
        block_shift: u8,
        nsze: u64,
        depth_limit: Option<u16>,
    ) -> Result<DeviceId> {
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
        let ids = self.listed_ids(&kind);
        self.devices.push(DevEntry {
            ids,
            presence: NsPresence::Present,
            kind,
            block_shift,
            nsze,
            // Re-read at the first poll turn: the size may have moved since the caller read it.
            size_seen: 0,
            waiting: VecDeque::new(),
            tags,
            budget,
            budget_used: 0,
            budget_waiting: VecDeque::new(),
        });
        Ok(id)
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
    #[inline]
    fn set_state(&mut self, rid: u32, to: ReqState) -> bool {
        let r = &mut self.reqs[rid as usize];
        if r.state.allows(&to) {
            r.state = to;
            return true;
        }
        self.refuse_state(rid, to);
        false
    }

    /// [`BlockCore::set_state`] refused `to`: logged, and the request fails.
    #[cold]
    #[inline(never)]
    fn refuse_state(&mut self, rid: u32, to: ReqState) {
        let r = &self.reqs[rid as usize];
        if let Err(e) = r.state.transition(to) {
            tracing::error!(request = rid, token = r.token, "request lifecycle: {e}; the request fails");
        }
        self.fail_refused(rid);
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

    /// Sends a request that holds its tag (and budget, as `claim` says) on connection
    /// `ckey` of queue `qkey`.
    fn issue(&mut self, rid: u32, ckey: usize, qkey: usize, dev: usize, claim: Claim) {
        let mut wire = OnWire::new(claim, self.now_ns);
        if !self.reqs[rid as usize].state.allows(&ReqState::Outstanding(wire)) {
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
            Op::Write | Op::WriteFua => {
                let mut sqe = Sqe::rw(opc::WRITE, cid, nsid, r.slba, r.nlb, SglDescriptor::transport(r.len));
                sqe.set_fua(r.op.fua());
                (sqe, DataDir::ToController, r.len, r.buf.take())
            }
            Op::Flush => (Sqe::flush(cid, nsid), DataDir::None, 0, r.buf.take()),
            Op::WriteZeroes | Op::WriteZeroesFua => {
                let mut sqe = Sqe::write_zeroes(cid, nsid, r.slba, r.nlb, false);
                sqe.set_fua(r.op.fua());
                (sqe, DataDir::None, 0, r.buf.take())
            }
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
        let now = self.now_ns;
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        let idle = conn.q.outstanding() == 0;
        match conn.q.submit(cid.0, io) {
            Ok(()) => {
                if idle {
                    // An idle connection given work: its silence counts from now.
                    conn.progress_at = now;
                }
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
    #[inline]
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

    pub(super) fn dispatch_queue_waiting(&mut self, qkey: usize) {
        let n = self.queues[qkey].waiting.len();
        for _ in 0..n {
            let qe = &self.queues[qkey];
            if qe.conn.is_none() {
                return;
            }
            let Some(rid) = self.queues[qkey].waiting.pop_front() else { return };
            let before = self.queues[qkey].waiting.len();
            self.send_bound(rid);
            let waiting = &mut self.queues[qkey].waiting;
            if waiting.len() > before {
                // Out of tags or queue slots: it went back to the end; it goes first
                // again (the requests behind it must not overtake it), and the rest wait.
                if let Some(back) = waiting.pop_back() {
                    waiting.push_front(back);
                }
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
            let waiting = &mut self.devices[dev].waiting;
            if waiting.len() > before {
                // No tag or no path: first again, the rest wait behind it.
                if let Some(back) = waiting.pop_back() {
                    waiting.push_front(back);
                }
                return;
            }
        }
    }

    /// Whether a queue's connection keeps more than a few commands in flight: its sends
    /// and completions wait behind those of shallow queues in a poll (a QD1 command is
    /// not sent after a flood's batch, whose loopback send runs the target's receive
    /// inline, nor completed after the flood's responses).
    pub(super) fn conn_is_deep(&self, ckey: usize) -> bool {
        self.conns.get(ckey).and_then(Option::as_ref).is_some_and(|c| c.q.outstanding() > SHALLOW_OUTSTANDING_MAX)
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
        let now = self.now;
        let now_ns = self.now_ns;
        let r = &mut self.reqs[rid as usize];
        if r.op == Op::Deallocate {
            if let Some(b) = buf {
                self.dsm_bufs.push(b);
            }
        } else {
            r.buf = buf;
        }
        let latency = now_ns.saturating_sub(wire.sent);
        let qkey = r.qkey;
        let path = r.path;
        let lost_auth = lost_authentication(status);
        if lost_auth {
            self.fail_unauthenticated_queue(qkey);
        }
        let path_error = status.is_path_error() || lost_auth;
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
        let mut disposition =
            disposition(status, multipath, retries, &self.opts, || queues[qkey].ctrl.should_fail_io());
        if self.devices[dev].presence.refuses() {
            // The namespace is gone: a path error ends here, never sent (or held) again.
            disposition = Disposition::Complete;
        }
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
        let total = now_ns.saturating_sub(r.start);
        self.queues[qkey].stats.record(r.op.direction(), u64::from(r.len), total, outcome);
        self.complete(rid, status);
    }

    /// Queue `qkey`'s connection answered a command with Authentication Required: the
    /// target no longer has it authenticated and will answer every command so until it
    /// closes it. The connection fails (its owner sees the failed queue after this
    /// delivery and runs [`BlockCore::abort_conn`] and [`BlockCore::fail_conn`]: its
    /// commands fail over or wait, and the controller resets and reconnects, which
    /// authenticates again with the host's current key).
    fn fail_unauthenticated_queue(&mut self, qkey: usize) {
        let Some(ckey) = self.queues[qkey].conn else { return };
        let Some(Some(c)) = self.conns.get_mut(ckey) else { return };
        if c.q.state() == QueueState::Failed {
            return;
        }
        tracing::warn!(
            traddr = %self.queues[qkey].ctrl.traddr(),
            "the target answered Authentication Required: the queue is no longer authenticated; reconnecting"
        );
        c.q.set_failed("the target no longer has the queue authenticated (Authentication Required)");
        self.touched.push(ckey);
    }

    /// Holds a request whose command may still execute on its lost controller for
    /// `hold` ([`crate::failover`]), within the controller's `ctrl_loss_tmo`.
    fn hold(&mut self, rid: u32, hold: Duration, now: Instant) {
        let qkey = self.reqs[rid as usize].qkey;
        let ctrl = &self.queues[qkey].ctrl;
        // A held request ends within ctrl_loss_tmo, and never by being sent early: a hold
        // longer than that fails it then.
        let (until, fails) = match ctrl.ctrl_loss_tmo() {
            Some(tmo) if tmo < hold => (now + tmo, true),
            _ => (now + hold, false),
        };
        tracing::debug!(
            traddr = %ctrl.traddr(),
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
        let now_ns = self.now_ns;
        let r = &mut self.reqs[rid as usize];
        let latency_ns = now_ns.saturating_sub(r.start);
        let buf = r.buf.take();
        let last = r.was_sent.then_some((r.path, r.qkey, r.nsid));
        self.rec.record(r.dev, last, r.op.direction(), r.len, latency_ns, status.is_success());
        self.done.push(Completion { token: r.token, status, buf, latency_ns });
        self.free_reqs.push(rid);
    }

    /// Re-reads the path states of a multipath device when anything they
    /// depend on moved (head, controllers, local connections), then retries
    /// requests waiting for a path.
    pub(super) fn refresh_paths(&mut self, dev: usize) {
        let DevKind::Multi(m) = &mut self.devices[dev].kind else { return };
        let head_gen = CoreHead::generation(&*m.head);
        if head_gen != m.seen_head {
            // Paths added or removed, or the policy switched.
            m.seen_head = head_gen;
            m.seen = 0;
            let policy = CoreHead::policy(&*m.head);
            if m.sel.policy() != policy {
                m.sel.set_policy(policy);
            }
            m.reference = CoreHead::reference(&*m.head);
            m.ref_gen = m.ref_gen.wrapping_add(1).max(1);
            let slots = CoreHead::paths(&*m.head);
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
                // A controller this context has a queue of: that queue. Another claims a
                // queue of it, which is the owner's to do (`take_attaches`).
                match self.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, &c)) {
                    Some(qkey) => self.set_path(dev, i, LocalPath::new(c, n, qkey)),
                    None => self.attaches.push(PathAttach { dev, slot: i, ctrl: c, nsid: n }),
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
        let opened = self.devices[dev].ids;
        let DevKind::Multi(m) = &mut self.devices[dev].kind else { return };
        let mut states = Vec::with_capacity(m.paths.len());
        for (i, p) in m.paths.iter_mut().enumerate() {
            states.push(match p {
                None => PathState::new(u64::MAX - i as u64, PathClass::Gone),
                Some(lp) => {
                    if lp.suspect_at.is_some_and(|at| at != lp.ctrl.change_count()) {
                        lp.suspect_at = None;
                    }
                    let mut class = lp.ctrl.path_class(lp.nsid);
                    let conn = self.queues[lp.qkey].conn.is_some();
                    if class.is_usable() && (!conn || lp.suspect_at.is_some()) {
                        class = PathClass::Transient;
                    }
                    if path_has_other_ns(dev, lp, opened) {
                        class = PathClass::Gone;
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

    /// Periodic work: fail waiting I/O of controllers that are gone or past
    /// fast_io_fail_tmo; reset controllers with timed-out commands; let
    /// shared-tag users return idle tags.
    pub fn tick(&mut self, now: Instant) {
        self.set_now(now);
        for qkey in 0..self.queues.len() {
            let qe = &self.queues[qkey];
            // The controller reset (keep-alive timeout, admin queue lost, another queue
            // failed): this queue's commands will never complete, fail them over now
            // (Linux's error recovery cancels every request of the old queues).
            if let Some(ckey) = qe.conn
                && let Some(Some(conn)) = self.conns.get_mut(ckey)
                && conn.open
                && conn.q.state() != QueueState::Failed
                && qe.ctrl.generation() != conn.ctrl_generation
            {
                tracing::debug!(traddr = %qe.ctrl.traddr(), index = qe.index, "controller reset: failing its queue");
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
            let age = Duration::from_nanos(self.now_ns.saturating_sub(w.sent));
            if age > stall && !w.stall_reported {
                let qe = &self.queues[r.qkey];
                let conn = qe.conn.and_then(|k| self.conns.get(k)).and_then(Option::as_ref);
                let opcode = conn.and_then(|c| c.q.sqe_of(w.tag)).map_or_else(|| op_code(r.op), nvme::Sqe::opcode);
                let report = StallReport {
                    traddr: qe.ctrl.traddr(),
                    cntlid: qe.ctrl.cntlid(),
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

/// Whether the namespace under path `lp`'s NSID is another than the one device `dev`
/// was opened on (`opened`): such a path is out of the device's path set, its I/O goes to
/// the others (Linux removes that path's disk from the head the same way). Read when the
/// device's path view moved (a change count among it), not per I/O; said once in the log.
fn path_has_other_ns<C: CoreController>(dev: usize, lp: &mut LocalPath<C>, opened: Option<NsIds>) -> bool {
    let other = match identity::seen(opened, lp.ctrl.namespace_ids(lp.nsid)) {
        identity::Seen::Replaced(new) => {
            if !lp.other_ns {
                tracing::warn!(
                    device = dev, nsid = lp.nsid.0, traddr = %lp.ctrl.traddr(),
                    old = %opened.map_or_else(|| "none".to_string(), |i| i.to_string()), new = %new,
                    "another namespace is under the NSID through this path: the path leaves the device's path set"
                );
            }
            true
        }
        identity::Seen::Same | identity::Seen::Removed => false,
    };
    lp.other_ns = other;
    other
}

pub(super) fn op_code(op: Op) -> u8 {
    match op {
        Op::Read => opc::READ,
        Op::Write | Op::WriteFua => opc::WRITE,
        Op::Flush => opc::FLUSH,
        Op::WriteZeroes | Op::WriteZeroesFua => opc::WRITE_ZEROES,
        Op::Deallocate => opc::DATASET_MANAGEMENT,
    }
}

/// Nanoseconds from `t` to `now`, 0 if `t` is later (a request issued after its turn's clock).
pub(super) fn nanos_since(t: Instant, now: Instant) -> u64 {
    let d = now.saturating_duration_since(t);
    d.as_secs().saturating_mul(1_000_000_000).saturating_add(u64::from(d.subsec_nanos()))
}

pub(crate) mod identity;
#[cfg(test)]
mod tests;
