//! Completion contexts: one per thread, owning an io_uring and the I/O
//! queues it drives (blk-mq's hardware contexts and their interrupt
//! vector rolled into one run-to-completion loop).
//!
//! ```text
//!   application thread
//!     submit(dev, op) ─► request slot ─► tag (command id) ─► HostQueue::submit (bytes batched)
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

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::opcode::io as opc;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::{Completion as RingCompletion, IoBuf, Mailbox, MailboxSender, Payload, Ring, RingConfig, Wait};

use crate::controller::{Controller, QueueMsg};
use crate::error::{Error, ErrorKind, Result};
use crate::queue::{DataDir, HostQueue, Io, QueueState};

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

/// A device opened in a context (a namespace through one controller).
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
    /// Retries of an I/O that failed with a path error before giving up.
    pub max_retries: u32,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            cpu: None,
            max_requests: 4096,
            ring_entries: 256,
            io_timeout: Duration::from_secs(30),
            max_retries: 5,
        }
    }
}

// Ring token: kind (4 bits) | connection generation (12) | connection key (48).
const K_RECV: u64 = 1;
const K_SEND: u64 = 2;

fn tok(kind: u64, generation: u64, key: usize) -> u64 {
    (kind << 60) | ((generation & 0xfff) << 48) | (key as u64 & 0xffff_ffff_ffff)
}

fn untok(t: u64) -> (u64, u64, usize) {
    (t >> 60, (t >> 48) & 0xfff, usize::try_from(t & 0xffff_ffff_ffff).unwrap_or(usize::MAX))
}

struct Conn {
    stream: TcpStream,
    q: HostQueue,
    generation: u64,
    qkey: usize,
    recv_inflight: bool,
    send_inflight: bool,
    cancelled: bool,
    /// Detached from its queue entry (failed): freed once no op is in flight.
    dying: bool,
}

struct QEntry {
    ctrl: Arc<Controller>,
    index: u16,
    conn: Option<usize>,
    tags: Vec<u16>,
    waiting: VecDeque<u32>,
    in_flush_list: bool,
}

struct DevEntry {
    ctrl: Arc<Controller>,
    nsid: Nsid,
    block_shift: u8,
    nsze: u64,
    qkey: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqState {
    Free,
    /// Waiting for a tag or a connection.
    Waiting,
    /// On the wire.
    Outstanding,
}

struct Req {
    state: ReqState,
    dev: u32,
    op: Op,
    slba: u64,
    nlb: u32,
    len: u32,
    buf: Option<IoBuf>,
    token: u64,
    start: Instant,
    retries: u32,
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
    flush_list: Vec<usize>,
    touched: Vec<usize>,
    dsm_bufs: Vec<IoBuf>,
    last_tick: Instant,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("queues", &self.queues.len()).field("devices", &self.devices.len()).finish()
    }
}

const TICK: Duration = Duration::from_millis(10);

impl Context {
    /// A context for the calling thread (pinned to `opts.cpu` if given).
    pub fn new(opts: ContextOptions) -> Result<Context> {
        if let Some(cpu) = opts.cpu {
            uring::pin_current_thread(cpu).map_err(|e| Error::io(format!("pin to CPU {cpu}"), &e))?;
        }
        let mut ring = Ring::new(RingConfig { entries: opts.ring_entries, ..RingConfig::default() })
            .map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        let (sender, mailbox) =
            Mailbox::new(&mut ring).map_err(|e| Error::new(ErrorKind::Io, format!("mailbox: {e}")))?;
        let n = opts.max_requests.clamp(1, 1 << 20);
        let now = Instant::now();
        let reqs = (0..n)
            .map(|_| Req {
                state: ReqState::Free,
                dev: 0,
                op: Op::Read,
                slba: 0,
                nlb: 0,
                len: 0,
                buf: None,
                token: 0,
                start: now,
                retries: 0,
            })
            .collect();
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
            flush_list: Vec::new(),
            touched: Vec::new(),
            dsm_bufs: Vec::new(),
            last_tick: now,
            opts,
        })
    }

    /// The CPU this context prefers (for queue maps).
    pub fn cpu(&self) -> usize {
        self.opts.cpu.unwrap_or(0)
    }

    // ----------------------------------------------------------- topology

    /// Claims one I/O queue of `ctrl` for this context: the preferred index
    /// (`cpu % queues`) if free, else the next free one. Returns the queue's
    /// key in this context.
    pub fn attach(&mut self, ctrl: &Arc<Controller>) -> Result<usize> {
        if let Some(k) = self.queues.iter().position(|q| Arc::ptr_eq(&q.ctrl, ctrl)) {
            return Ok(k);
        }
        let n = ctrl.block_queue_count();
        if n == 0 {
            return Err(Error::new(ErrorKind::Busy, "controller has no I/O queues"));
        }
        let pref = self.cpu() % n;
        let free = ctrl.free_queues();
        let pick = (0..n).map(|i| (pref + i) % n).find_map(|i| {
            let i = u16::try_from(i).ok()?;
            free.contains(&i).then_some(i)
        });
        let index = pick.ok_or_else(|| {
            Error::new(
                ErrorKind::Busy,
                format!("all {n} I/O queues of {} are owned by other contexts", ctrl.opts.traddr),
            )
        })?;
        self.attach_index(ctrl, index)
    }

    /// Claims I/O queue `index` of `ctrl` (several per controller are allowed:
    /// seed 004's N queues on one context).
    pub fn attach_index(&mut self, ctrl: &Arc<Controller>, index: u16) -> Result<usize> {
        let claimed = ctrl
            .claim_queue(index, self.sender.clone())
            .ok_or_else(|| Error::new(ErrorKind::Busy, format!("I/O queue {index} is taken or does not exist")))?;
        let qkey = self.queues.len();
        self.queues.push(QEntry {
            ctrl: Arc::clone(ctrl),
            index,
            conn: None,
            tags: Vec::new(),
            waiting: VecDeque::new(),
            in_flush_list: false,
        });
        if let Some((stream, q, generation)) = claimed {
            self.install(qkey, stream, q, generation);
        }
        Ok(qkey)
    }

    fn install(&mut self, qkey: usize, stream: TcpStream, q: HostQueue, generation: u64) {
        let _ = stream.set_nodelay(true);
        let entries = q.entries();
        self.conn_gen = self.conn_gen.wrapping_add(1);
        let conn = Conn {
            stream,
            q,
            generation: self.conn_gen & 0xfff,
            qkey,
            recv_inflight: false,
            send_inflight: false,
            cancelled: false,
            dying: false,
        };
        let _ = generation;
        let key = match self.free_conns.pop() {
            Some(k) => {
                self.conns[k] = Some(conn);
                k
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        };
        let qe = &mut self.queues[qkey];
        qe.conn = Some(key);
        qe.tags = (0..entries).rev().collect();
        self.arm_recv(key);
        // Requests that waited for this queue go out now.
        self.dispatch_waiting(qkey);
    }

    /// Opens namespace `nsid` of `ctrl` on this context (attaching a queue if needed).
    pub fn open(&mut self, ctrl: &Arc<Controller>, nsid: Nsid) -> Result<DeviceId> {
        let ns = ctrl.namespace(nsid).ok_or_else(|| Error::new(ErrorKind::Invalid, format!("no namespace {nsid}")))?;
        let qkey = self.attach(ctrl)?;
        self.open_on(ctrl, nsid, qkey, ns.block_shift, ns.nsze)
    }

    /// Opens a namespace on a specific attached queue.
    pub fn open_on(
        &mut self,
        ctrl: &Arc<Controller>,
        nsid: Nsid,
        qkey: usize,
        block_shift: u8,
        nsze: u64,
    ) -> Result<DeviceId> {
        let id =
            DeviceId(u32::try_from(self.devices.len()).map_err(|_| Error::new(ErrorKind::Busy, "too many devices"))?);
        self.devices.push(DevEntry { ctrl: Arc::clone(ctrl), nsid, block_shift, nsze, qkey });
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

    /// Requests in flight (waiting or on the wire).
    pub fn in_flight(&self) -> usize {
        self.reqs.len() - self.free_reqs.len()
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
        let qkey = d.qkey;
        let r = &mut self.reqs[rid as usize];
        r.state = ReqState::Waiting;
        r.dev = dev.0;
        r.op = op;
        r.slba = slba;
        r.nlb = u32::try_from(nlb).unwrap_or(0);
        r.len = len;
        r.buf = buf;
        r.token = token;
        r.start = Instant::now();
        r.retries = 0;
        self.dispatch(qkey, rid);
        Ok(())
    }

    /// Sends request `rid` on queue `qkey` now, or parks it until a tag or a connection frees up.
    fn dispatch(&mut self, qkey: usize, rid: u32) {
        let qe = &mut self.queues[qkey];
        let Some(ckey) = qe.conn else {
            qe.waiting.push_back(rid);
            return;
        };
        let Some(tag) = qe.tags.pop() else {
            qe.waiting.push_back(rid);
            return;
        };
        let r = &mut self.reqs[rid as usize];
        let d = &self.devices[r.dev as usize];
        let nsid = d.nsid;
        let (sqe, dir, len, buf) = match r.op {
            Op::Read => (
                Sqe::rw(opc::READ, Cid(tag), nsid, r.slba, r.nlb, SglDescriptor::transport(r.len)),
                DataDir::FromController,
                r.len,
                r.buf.take(),
            ),
            Op::Write => (
                Sqe::rw(opc::WRITE, Cid(tag), nsid, r.slba, r.nlb, SglDescriptor::transport(r.len)),
                DataDir::ToController,
                r.len,
                r.buf.take(),
            ),
            Op::Flush => (Sqe::flush(Cid(tag), nsid), DataDir::None, 0, r.buf.take()),
            Op::WriteZeroes => {
                (Sqe::write_zeroes(Cid(tag), nsid, r.slba, r.nlb, false), DataDir::None, 0, r.buf.take())
            }
            Op::Deallocate => {
                let mut b = self.dsm_bufs.pop().unwrap_or_else(|| IoBuf::new(4096));
                b.set_len(16);
                b.fill(0);
                b[4..8].copy_from_slice(&r.nlb.to_le_bytes());
                b[8..16].copy_from_slice(&r.slba.to_le_bytes());
                (
                    Sqe::dsm_deallocate(Cid(tag), nsid, 1, SglDescriptor::transport(16)),
                    DataDir::ToController,
                    16,
                    Some(b),
                )
            }
        };
        r.state = ReqState::Outstanding;
        let io = Io { sqe, buf, len, dir, token: u64::from(rid) };
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        match conn.q.submit(tag, io) {
            Ok(()) => {
                if !qe.in_flush_list {
                    qe.in_flush_list = true;
                    self.flush_list.push(qkey);
                }
            }
            Err((e, io)) => {
                qe.tags.push(tag);
                let r = &mut self.reqs[rid as usize];
                if r.op != Op::Deallocate {
                    r.buf = io.buf;
                } else if let Some(b) = io.buf {
                    self.dsm_bufs.push(b);
                }
                r.state = ReqState::Waiting;
                tracing::debug!("submit refused ({e}); request waits for the queue");
                qe.waiting.push_back(rid);
            }
        }
    }

    fn dispatch_waiting(&mut self, qkey: usize) {
        let n = self.queues[qkey].waiting.len();
        for _ in 0..n {
            let qe = &self.queues[qkey];
            if qe.conn.is_none() || qe.tags.is_empty() {
                return;
            }
            let Some(rid) = self.queues[qkey].waiting.pop_front() else { return };
            self.dispatch(qkey, rid);
        }
    }

    // ------------------------------------------------------------- polling

    /// Sends queued commands, waits per `wait`, processes what completed.
    /// Returns how many completions are ready in [`Context::completions`].
    pub fn poll(&mut self, wait: Wait) -> Result<usize> {
        self.flush();
        let wait = if self.done.is_empty() { wait } else { Wait::Poll };
        let mut rd = std::mem::take(&mut self.ring_done);
        let r = self.ring.turn(wait, |_, c| rd.push(c));
        for c in rd.drain(..) {
            self.on_ring(c);
        }
        self.ring_done = rd;
        r.map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        let mut msgs = Vec::new();
        self.mailbox.drain(|m| msgs.push(m));
        for m in msgs {
            self.on_msg(m);
        }
        let touched = std::mem::take(&mut self.touched);
        for &k in &touched {
            self.service(k);
        }
        self.touched = touched;
        self.touched.clear();
        self.flush();
        if self.last_tick.elapsed() >= TICK {
            self.last_tick = Instant::now();
            self.tick();
        }
        Ok(self.done.len())
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

    fn flush(&mut self) {
        let list = std::mem::take(&mut self.flush_list);
        for &qkey in &list {
            self.queues[qkey].in_flush_list = false;
            if let Some(ckey) = self.queues[qkey].conn {
                self.send(ckey);
            }
        }
        self.flush_list = list;
        self.flush_list.clear();
    }

    fn send(&mut self, ckey: usize) {
        let Some(Some(c)) = self.conns.get_mut(ckey) else { return };
        if c.send_inflight || c.dying {
            return;
        }
        let Some(msg) = c.q.take_send() else { return };
        let fd = c.stream.as_raw_fd();
        match self.ring.send(fd, msg, tok(K_SEND, c.generation, ckey)) {
            Ok(()) => c.send_inflight = true,
            Err((e, msg)) => {
                c.q.on_send_done(msg, Err(std::io::Error::other(e.to_string())));
                self.touched.push(ckey);
            }
        }
    }

    fn arm_recv(&mut self, ckey: usize) {
        let Some(Some(c)) = self.conns.get_mut(ckey) else { return };
        if c.recv_inflight || c.dying {
            return;
        }
        let Some((buf, range)) = c.q.take_recv_buf() else { return };
        let fd = c.stream.as_raw_fd();
        match self.ring.recv(fd, buf, range, tok(K_RECV, c.generation, ckey)) {
            Ok(()) => c.recv_inflight = true,
            Err((e, buf)) => {
                c.q.on_recv_none(buf);
                c.q.set_failed(&format!("recv submit: {e}"));
                self.touched.push(ckey);
            }
        }
    }

    fn on_ring(&mut self, c: RingCompletion) {
        let (kind, generation, ckey) = untok(c.token);
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        if conn.generation != generation {
            return;
        }
        match kind {
            K_RECV => {
                conn.recv_inflight = false;
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
                            if !conn.dying {
                                conn.q.set_failed(&format!("recv: {e}"));
                            }
                        }
                    }
                }
            }
            K_SEND => {
                conn.send_inflight = false;
                let res = c.io_result().map(|_| ());
                if let Payload::Msg(m) = c.payload {
                    conn.q.on_send_done(m, res);
                }
            }
            _ => return,
        }
        self.touched.push(ckey);
    }

    /// After a connection's completions: deliver finished commands, re-arm, handle failure.
    fn service(&mut self, ckey: usize) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        let qkey = conn.qkey;
        let dying = conn.dying;
        let mut done = std::mem::take(conn.q.completions());
        for d in done.drain(..) {
            if !dying {
                self.queues[qkey].tags.push(d.tag);
            }
            self.finish(d.token, d.cqe.status, d.buf);
        }
        if let Some(Some(conn)) = self.conns.get_mut(ckey) {
            *conn.q.completions() = done;
        }
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        if conn.q.state() == QueueState::Failed && !conn.dying {
            self.fail_conn(ckey);
            return;
        }
        if conn.dying {
            if !conn.recv_inflight && !conn.send_inflight {
                // Nothing in flight on it: close now (the FIN must not wait for another turn).
                drop(self.conns[ckey].take());
                self.free_conns.push(ckey);
            } else if !conn.cancelled {
                conn.cancelled = true;
                let _ = self.ring.cancel_fd(conn.stream.as_raw_fd());
            }
            return;
        }
        self.arm_recv(ckey);
        if self.conns[ckey].as_ref().is_some_and(|c| c.q.has_pending_send()) {
            self.send(ckey);
        }
        self.dispatch_waiting(qkey);
    }

    /// A connection failed: its outstanding commands wait for the reconnect
    /// (or fail per fast_io_fail_tmo / ctrl_loss_tmo), the controller resets.
    fn fail_conn(&mut self, ckey: usize) {
        let Some(Some(conn)) = self.conns.get_mut(ckey) else { return };
        conn.dying = true;
        let why = conn.q.error().unwrap_or("queue failed").to_string();
        conn.q.abort_all(Status::HOST_PATH_ERROR);
        let qkey = conn.qkey;
        let mut done = std::mem::take(conn.q.completions());
        let qe = &mut self.queues[qkey];
        qe.conn = None;
        qe.tags.clear();
        qe.ctrl.report_io_failure(&why);
        for d in done.drain(..) {
            self.finish(d.token, d.cqe.status, d.buf);
        }
        self.touched.push(ckey);
    }

    /// A command finished: complete it to the caller, or park it for a retry.
    fn finish(&mut self, token: u64, status: Status, buf: Option<IoBuf>) {
        let rid = u32::try_from(token).unwrap_or(u32::MAX);
        let Some(r) = self.reqs.get_mut(rid as usize) else { return };
        if r.state != ReqState::Outstanding {
            return;
        }
        if r.op == Op::Deallocate {
            if let Some(b) = buf {
                self.dsm_bufs.push(b);
            }
        } else {
            r.buf = buf;
        }
        let dev = &self.devices[r.dev as usize];
        // Transport failures (HOST_PATH_ERROR from a failed queue) wait for the
        // reconnect instead of surfacing (Linux requeues them the same way).
        let retry =
            status == Status::HOST_PATH_ERROR && r.retries < self.opts.max_retries && !dev.ctrl.should_fail_io();
        if retry {
            r.retries += 1;
            r.state = ReqState::Waiting;
            let qkey = dev.qkey;
            self.queues[qkey].waiting.push_back(rid);
            return;
        }
        self.complete(rid, status);
    }

    fn complete(&mut self, rid: u32, status: Status) {
        let r = &mut self.reqs[rid as usize];
        r.state = ReqState::Free;
        let latency_ns = u64::try_from(r.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let buf = r.buf.take();
        self.done.push(Completion { token: r.token, status, buf, latency_ns });
        self.free_reqs.push(rid);
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
        }
    }

    /// Periodic work: fail waiting I/O of controllers that are gone or past
    /// fast_io_fail_tmo; reset controllers with timed-out commands.
    fn tick(&mut self) {
        for qkey in 0..self.queues.len() {
            let qe = &self.queues[qkey];
            if qe.conn.is_none() && !qe.waiting.is_empty() && qe.ctrl.should_fail_io() {
                let waiting: Vec<u32> = self.queues[qkey].waiting.drain(..).collect();
                for rid in waiting {
                    self.complete(rid, Status::HOST_PATH_ERROR);
                }
            }
        }
        let timeout = self.opts.io_timeout;
        for i in 0..self.reqs.len() {
            let r = &self.reqs[i];
            if r.state == ReqState::Outstanding && r.start.elapsed() > timeout {
                let qkey = self.devices[r.dev as usize].qkey;
                let qe = &self.queues[qkey];
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

impl Drop for Context {
    fn drop(&mut self) {
        // Give idle connections back to their controllers so another context can claim them.
        for qkey in 0..self.queues.len() {
            let ckey = self.queues[qkey].conn.take();
            let index = self.queues[qkey].index;
            let ctrl = Arc::clone(&self.queues[qkey].ctrl);
            let conn = ckey.and_then(|k| self.conns.get_mut(k).and_then(Option::take));
            match conn {
                Some(mut c) if c.q.outstanding() == 0 && !c.send_inflight => {
                    if c.recv_inflight {
                        let _ = self.ring.cancel_fd(c.stream.as_raw_fd());
                        let deadline = Instant::now() + Duration::from_millis(200);
                        while c.recv_inflight && Instant::now() < deadline {
                            let mut rd = Vec::new();
                            let _ = self
                                .ring
                                .turn(Wait::Block { timeout: Some(Duration::from_millis(10)) }, |_, x| rd.push(x));
                            for x in rd {
                                if untok(x.token).0 == K_RECV
                                    && let Payload::Buf(b) = x.payload
                                {
                                    c.q.on_recv_none(b);
                                    c.recv_inflight = false;
                                }
                            }
                        }
                    }
                    if c.recv_inflight {
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
