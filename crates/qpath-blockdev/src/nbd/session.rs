//! One NBD client in the transmission phase, run to completion on one thread: the
//! client's socket and the head's NVMe/TCP queues on the same io_uring (the host context's
//! ring), so a request is received, split into NVMe commands, completed and answered
//! without handing anything to another thread.
//!
//! ```text
//!   recv (256 KiB) ─► Framer ─► check ─► Slot (one per request, at most REQUESTS_MAX)
//!                                         │ split into chunks of max_transfer bytes, or
//!                                         │ zero_blocks_max blocks (trim, write zeroes)
//!                                         ▼
//!                          Context::submit (at most COMMANDS_MAX in flight)
//!                                         │ FUA: NVMe FUA writes; a FUA trim adds a Flush
//!                                         ▼
//!                          reply (simple, or structured for reads) ─► one SENDMSG
//! ```
//!
//! A namespace resized under a session: NBD has no message that tells a client a new size
//! (the protocol's `NBD_OPT_INFO`/`NBD_OPT_GO` give it once, during negotiation; the
//! experimental RESIZE extension's `NBD_CMD_RESIZE` is a client asking the server to
//! resize), so the export keeps the size the client was given. A grown namespace's new blocks are not offered; a
//! shrunk one's requests past the new end are refused, each with its own error (`ENOSPC`
//! for a write or write zeroes, `EINVAL` otherwise, as past the export's end), from the
//! poll turn on which the context read the new size.
//!
//! Limits: at most [`REQUESTS_MAX`] requests and [`DATA_MAX`] bytes of data held per
//! client; past them the session stops parsing and stops receiving, so TCP pushes back on
//! the client. Buffers come from a per-session pool and are reused (no allocation per I/O
//! once warm). A client that goes away mid-request ends only its own session: its NVMe
//! commands are waited for (their buffers are the kernel's until they complete), their
//! replies dropped.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use host::context::{Context, DeviceId, Op};
use nvme::Status;
use uring::{IoBuf, Payload, SEND_SEGMENTS_MAX, SendMsg, Wait};

use super::request::{Command, Frame, Framer, Limits, PAYLOAD_HARD_MAX, Refusal, Request, check};
use super::wire::{error_chunk, offset_data_header, simple_reply};
use crate::device::DeviceInfo;
use crate::errno::{nbd, nbd_error_of, reason_of, refusal_status};

/// Requests one client may have in flight.
pub const REQUESTS_MAX: usize = 64;
/// Read and write data one client may have held in memory at once (one request of the
/// largest payload always fits).
pub const DATA_MAX: u64 = 64 << 20;
/// NVMe commands one client may have in flight.
pub const COMMANDS_MAX: usize = 256;
/// The receive buffer.
const RECV_BUF: usize = 256 << 10;
/// How long a poll sleeps when nothing happens (the context's timers run every 10 ms of
/// polling; this bounds how late a failover timer or a stop request is noticed).
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// How long a closing session waits for a client to read its last replies.
const SEND_GRACE: Duration = Duration::from_secs(10);

const TOKEN_RECV: u64 = 1;
const TOKEN_SEND: u64 = 2;
/// The chunk index of a FUA trim's closing Flush.
const FLUSH_CHUNK: u32 = u32::MAX;

/// What a session did, for the log and the server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionReport {
    /// Requests answered (success or error).
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests the client sent that were still unanswered when it went away.
    pub abandoned: u64,
    /// Why the session ended.
    pub end: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Free,
    /// A write whose payload is still arriving.
    Receiving,
    /// Chunks being sent or completing.
    Running,
    /// Waiting for its reply to be queued.
    Ready,
}

struct Slot {
    phase: Phase,
    req: Request,
    cmd: Command,
    /// Chunks in all, issued, completed.
    chunks: u32,
    issued: u32,
    done: u32,
    /// Bytes per chunk (reads, writes) or blocks per chunk (trim, write zeroes).
    per_chunk: u64,
    bufs: Vec<Option<IoBuf>>,
    /// Write payload bytes received.
    received: u32,
    status: Status,
    refusal: Option<Refusal>,
    /// A FUA trim's Flush went out.
    flushing: bool,
    /// Data bytes this request holds in memory.
    held: u64,
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            phase: Phase::Free,
            req: Request { flags: 0, kind: 0, cookie: 0, offset: 0, length: 0 },
            cmd: Command::Nothing,
            chunks: 0,
            issued: 0,
            done: 0,
            per_chunk: 0,
            bufs: Vec::new(),
            received: 0,
            status: Status::SUCCESS,
            refusal: None,
            flushing: false,
            held: 0,
        }
    }
}

impl Slot {
    /// The host context refused the next chunk: the request fails, and the chunks not
    /// submitted (this one and the rest) count as done, since no completion will come for
    /// them. True when nothing is left in flight, so the request can be answered now;
    /// otherwise the last outstanding chunk's completion answers it.
    fn refuse_unissued(&mut self, status: Status) -> bool {
        self.status = status;
        self.done += self.chunks - self.issued;
        self.issued = self.chunks;
        self.done >= self.chunks
    }
}

/// The NVMe operation of each chunk of `cmd` (not a Flush or nothing) on a namespace
/// with a volatile write cache (`vwc`) or not. NBD_CMD_FLAG_FUA asks that the reply wait
/// until the data is durable: a write and a write zeroes carry it as NVMe FUA (CDW12 bit
/// 30, NVM Command Set 1.0 §3.2.6 and §3.2.8), one command per chunk instead of the
/// chunks and then a Flush; without a volatile cache every completed write is durable
/// and FUA asks for nothing more (NVMe Base 2.1, Identify Controller VWC).
fn nvme_op(cmd: Command, vwc: bool) -> Op {
    match cmd {
        Command::Read => Op::Read,
        Command::Write { fua } if fua && vwc => Op::WriteFua,
        Command::Write { .. } => Op::Write,
        Command::WriteZeroes { fua } if fua && vwc => Op::WriteZeroesFua,
        Command::WriteZeroes { .. } => Op::WriteZeroes,
        Command::Trim { .. } => Op::Deallocate,
        Command::Flush | Command::Disconnect | Command::Nothing => Op::Flush,
    }
}

/// Whether `cmd`'s reply waits for a Flush after its chunks: a trim with FUA on a volatile
/// cache, as Dataset Management has no FUA bit of its own.
fn closing_flush(cmd: Command, vwc: bool) -> bool {
    vwc && cmd == Command::Trim { fua: true }
}

/// The transmission phase of one client.
pub struct Session<'a> {
    ctx: &'a mut Context,
    dev: DeviceId,
    fd: RawFd,
    info: DeviceInfo,
    lim: Limits,
    /// The size the client was given: `lim.size` never grows past it.
    export_size: u64,
    framer: Framer,
    rbuf: Option<IoBuf>,
    rpos: usize,
    rlen: usize,
    recv_inflight: bool,
    /// The client closed its side, broke the protocol, sent NBD_CMD_DISC, or the server stops.
    closing: Option<String>,
    /// Sending failed: the client cannot hear replies any more.
    gone: bool,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// The write whose payload the framer is returning.
    cur_write: Option<u16>,
    issuing: VecDeque<u16>,
    ready: VecDeque<u16>,
    commands: usize,
    held: u64,
    pool: Vec<IoBuf>,
    /// A turn's completions, moved out of the context; their room is taken once.
    turn_done: Vec<host::context::Completion>,
    turn_user: Vec<uring::Completion>,
    buf_cap: usize,
    out: SendMsg,
    spare: Option<SendMsg>,
    send_inflight: bool,
    /// When the session started closing, and whether its receive was cancelled.
    closing_since: Option<Instant>,
    recv_cancelled: bool,
    send_cancelled: bool,
    stop: Arc<AtomicBool>,
    report: SessionReport,
}

impl<'a> Session<'a> {
    /// A session on `fd` (whose negotiation is done) for device `dev` of `ctx`.
    pub fn new(
        ctx: &'a mut Context,
        dev: DeviceId,
        fd: RawFd,
        info: DeviceInfo,
        lim: Limits,
        stop: Arc<AtomicBool>,
    ) -> Session<'a> {
        let buf_cap = (info.max_transfer as usize).div_ceil(uring::IO_ALIGN) * uring::IO_ALIGN;
        Session {
            ctx,
            dev,
            fd,
            info,
            lim,
            export_size: lim.size,
            framer: Framer::new(),
            rbuf: Some(IoBuf::new(RECV_BUF)),
            rpos: 0,
            rlen: 0,
            recv_inflight: false,
            closing: None,
            gone: false,
            slots: (0..REQUESTS_MAX).map(|_| Slot::empty()).collect(),
            free: (0..u16::try_from(REQUESTS_MAX).expect("REQUESTS_MAX fits u16")).rev().collect(),
            cur_write: None,
            issuing: VecDeque::with_capacity(REQUESTS_MAX),
            ready: VecDeque::with_capacity(REQUESTS_MAX),
            commands: 0,
            held: 0,
            pool: Vec::new(),
            turn_done: Vec::with_capacity(REQUESTS_MAX),
            turn_user: Vec::with_capacity(4),
            buf_cap,
            out: SendMsg::with_capacity(4096, 256),
            spare: Some(SendMsg::with_capacity(4096, 256)),
            send_inflight: false,
            closing_since: None,
            recv_cancelled: false,
            send_cancelled: false,
            stop,
            report: SessionReport::default(),
        }
    }

    /// Bytes the client sent after its negotiation, to be parsed before anything received.
    pub fn preload(&mut self, bytes: &[u8]) {
        if let Some(b) = self.rbuf.as_mut() {
            let n = bytes.len().min(b.capacity());
            b.as_full_mut()[..n].copy_from_slice(&bytes[..n]);
            self.rpos = 0;
            self.rlen = n;
        }
    }

    /// Runs until the client is gone and every command it started has completed.
    pub fn run(mut self) -> SessionReport {
        loop {
            if self.closing.is_none() && self.stop.load(Ordering::Relaxed) {
                self.closing = Some("the server is stopping".into());
            }
            self.parse();
            self.pump();
            self.fill_out();
            self.send();
            self.arm_recv();
            if self.finished() {
                break;
            }
            self.cancel_when_closing();
            if let Err(e) = self.ctx.poll(Wait::Block { timeout: Some(IDLE_WAIT) }) {
                self.closing.get_or_insert_with(|| format!("ring: {e}"));
                self.gone = true;
            }
            // The namespace's size as the context read it this turn (a resize).
            self.lim.size = self.ctx.capacity(self.dev).min(self.export_size);
            let mut done = std::mem::take(&mut self.turn_done);
            done.extend(self.ctx.completions());
            for c in done.drain(..) {
                self.on_done(c.token, c.status, c.buf);
            }
            self.turn_done = done;
            let mut user = std::mem::take(&mut self.turn_user);
            user.extend(self.ctx.user_completions());
            for c in user.drain(..) {
                match Context::user_value(c.token) {
                    TOKEN_RECV => self.on_recv(c.result, c.payload),
                    TOKEN_SEND => self.on_sent(c.result, c.payload),
                    _ => {}
                }
            }
            self.turn_user = user;
        }
        self.report.abandoned = (REQUESTS_MAX - self.free.len()) as u64;
        self.report.end = self.closing.take().unwrap_or_default();
        self.report
    }

    /// A closing session does not wait for a client that sends nothing (its receive is
    /// cancelled at once) or reads nothing (its send after `SEND_GRACE`).
    fn cancel_when_closing(&mut self) {
        if self.closing.is_none() {
            return;
        }
        let since = *self.closing_since.get_or_insert_with(Instant::now);
        if self.recv_inflight && !self.recv_cancelled {
            self.recv_cancelled = true;
            let _ = self.ctx.ring().cancel(Context::user_token(TOKEN_RECV));
        }
        if self.send_inflight && !self.send_cancelled && since.elapsed() > SEND_GRACE {
            self.send_cancelled = true;
            let _ = self.ctx.ring().cancel(Context::user_token(TOKEN_SEND));
        }
    }

    fn finished(&self) -> bool {
        if self.closing.is_none() || self.recv_inflight || self.commands > 0 || self.send_inflight {
            return false;
        }
        // Replies still owed are sent unless the client cannot hear them.
        self.gone || (self.ready.is_empty() && self.out.is_empty())
    }

    // ---------------------------------------------------------------- receiving

    fn arm_recv(&mut self) {
        if self.recv_inflight || self.closing.is_some() || self.rpos < self.rlen {
            return;
        }
        let Some(buf) = self.rbuf.take() else { return };
        let cap = buf.capacity();
        match self.ctx.ring().recv(self.fd, buf, 0..cap, Context::user_token(TOKEN_RECV)) {
            Ok(()) => self.recv_inflight = true,
            Err((e, buf)) => {
                self.rbuf = Some(buf);
                self.closing = Some(format!("recv: {e}"));
            }
        }
    }

    fn on_recv(&mut self, result: i32, payload: Payload) {
        self.recv_inflight = false;
        if let Payload::Buf(b) = payload {
            self.rbuf = Some(b);
        }
        match usize::try_from(result) {
            Ok(0) => {
                self.closing.get_or_insert_with(|| "the client closed the connection".into());
            }
            Ok(n) => {
                self.rpos = 0;
                self.rlen = n;
            }
            Err(_) => {
                self.closing.get_or_insert_with(|| format!("recv: errno {}", -result));
                self.gone = true;
            }
        }
    }

    /// Whether a new request may start: a free slot, and room for the largest payload.
    fn admit(&self) -> bool {
        !self.free.is_empty() && (self.held == 0 || self.held + u64::from(PAYLOAD_HARD_MAX) <= DATA_MAX)
    }

    fn parse(&mut self) {
        let Some(buf) = self.rbuf.take() else { return };
        while self.rpos < self.rlen {
            if self.framer.payload_left() == 0 && (self.closing.is_some() || !self.admit()) {
                break;
            }
            match self.framer.next(&buf.as_full()[self.rpos..self.rlen]) {
                Ok((n, frame)) => {
                    self.rpos += n;
                    match frame {
                        Frame::NeedMore => {}
                        Frame::Header(r) => self.on_header(r),
                        Frame::Payload(p) => self.on_payload(p),
                    }
                }
                Err(e) => {
                    self.closing = Some(format!("protocol error: {e}"));
                    self.rpos = self.rlen;
                }
            }
        }
        if self.rpos >= self.rlen {
            self.rpos = 0;
            self.rlen = 0;
        }
        self.rbuf = Some(buf);
    }

    fn on_header(&mut self, req: Request) {
        let i = self.free.pop().expect("admit() checked a free slot");
        let s = &mut self.slots[usize::from(i)];
        *s = Slot { bufs: std::mem::take(&mut s.bufs), ..Slot::empty() };
        s.req = req;
        match check(&req, &self.lim) {
            Err(refusal) => {
                s.refusal = Some(refusal);
                s.phase = Phase::Ready;
                self.ready.push_back(i);
                // A refused write's payload is read and dropped (cur_write stays None).
            }
            Ok(Command::Disconnect) => {
                self.free.push(i);
                self.closing = Some("the client disconnected (NBD_CMD_DISC)".into());
            }
            Ok(Command::Nothing) => {
                s.cmd = Command::Nothing;
                s.phase = Phase::Ready;
                self.ready.push_back(i);
            }
            Ok(cmd) => self.start(i, cmd),
        }
    }

    /// Sets a request's chunks up and queues it (a write waits for its payload first).
    fn start(&mut self, i: u16, cmd: Command) {
        let bs = u64::from(self.info.block_size());
        let s = &mut self.slots[usize::from(i)];
        s.cmd = cmd;
        let len = u64::from(s.req.length);
        let (chunks, per_chunk) = match cmd {
            Command::Read | Command::Write { .. } => {
                let per = u64::from(self.info.max_transfer);
                (len.div_ceil(per), per)
            }
            Command::Trim { .. } | Command::WriteZeroes { .. } => {
                let per = self.info.zero_blocks_max;
                ((len / bs).div_ceil(per), per)
            }
            Command::Flush => (u64::from(self.info.volatile_cache), 0),
            Command::Disconnect | Command::Nothing => (0, 0),
        };
        s.chunks = u32::try_from(chunks).expect("a request of at most 4 GiB has few chunks");
        s.per_chunk = per_chunk;
        s.bufs.clear();
        if matches!(cmd, Command::Read | Command::Write { .. }) {
            s.held = len;
            self.held += len;
            for c in 0..chunks {
                let n = usize::try_from((len - c * per_chunk).min(per_chunk)).expect("a chunk fits usize");
                let mut b = self.pool.pop().unwrap_or_else(|| IoBuf::new(self.buf_cap));
                b.set_len(n);
                self.slots[usize::from(i)].bufs.push(Some(b));
            }
        }
        let s = &mut self.slots[usize::from(i)];
        if matches!(cmd, Command::Write { .. }) {
            s.phase = Phase::Receiving;
            self.cur_write = Some(i);
        } else if s.chunks == 0 {
            s.phase = Phase::Ready;
            self.ready.push_back(i);
        } else {
            s.phase = Phase::Running;
            self.issuing.push_back(i);
        }
    }

    fn on_payload(&mut self, piece: &[u8]) {
        let Some(i) = self.cur_write else { return };
        let s = &mut self.slots[usize::from(i)];
        let mut at = u64::from(s.received);
        let mut rest = piece;
        while !rest.is_empty() {
            let c = usize::try_from(at / s.per_chunk).expect("chunk index fits usize");
            let off = usize::try_from(at % s.per_chunk).expect("chunk offset fits usize");
            let b = s.bufs[c].as_mut().expect("a write's chunk buffers are set up at its header");
            let n = rest.len().min(b.len() - off);
            b[off..off + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            at += n as u64;
        }
        s.received = u32::try_from(at).expect("a payload is at most 32 MiB");
        if s.received == s.req.length {
            s.phase = Phase::Running;
            self.cur_write = None;
            self.issuing.push_back(i);
        }
    }

    // ---------------------------------------------------------------- NVMe side

    /// Sends chunks of queued requests while the command budget allows.
    fn pump(&mut self) {
        while self.commands < COMMANDS_MAX {
            let Some(&i) = self.issuing.front() else { return };
            let s = &self.slots[usize::from(i)];
            if s.issued >= s.chunks {
                self.issuing.pop_front();
                continue;
            }
            if !self.issue(i) {
                return;
            }
        }
    }

    /// Submits the next chunk of slot `i`; false if the context is full (try later).
    fn issue(&mut self, i: u16) -> bool {
        let bs_shift = self.info.block_shift;
        let s = &mut self.slots[usize::from(i)];
        let c = s.issued;
        let token = (u64::from(i) << 32) | u64::from(if s.flushing { FLUSH_CHUNK } else { c });
        let (op, offset, len, buf) = if s.flushing {
            (Op::Flush, 0, 0, None)
        } else {
            match s.cmd {
                Command::Read | Command::Write { .. } => {
                    let off = u64::from(c) * s.per_chunk;
                    let b = s.bufs[c as usize].take();
                    let n = b.as_ref().map_or(0, |b| b.len());
                    let op = nvme_op(s.cmd, self.info.volatile_cache);
                    (op, s.req.offset + off, u32::try_from(n).expect("a chunk is at most max_transfer"), b)
                }
                Command::Trim { .. } | Command::WriteZeroes { .. } => {
                    let blocks = u64::from(s.req.length) >> bs_shift;
                    let first = u64::from(c) * s.per_chunk;
                    let n = (blocks - first).min(s.per_chunk);
                    let op = nvme_op(s.cmd, self.info.volatile_cache);
                    let bytes = u32::try_from(n << bs_shift).expect("zero_blocks_max keeps a command under 2 GiB");
                    (op, s.req.offset + (first << bs_shift), bytes, None)
                }
                Command::Flush => (Op::Flush, 0, 0, None),
                Command::Disconnect | Command::Nothing => unreachable!("nothing to issue"),
            }
        };
        match self.ctx.submit(self.dev, op, offset, len, buf, token) {
            Ok(()) => {
                s.issued += 1;
                self.commands += 1;
                true
            }
            Err((e, buf)) => {
                if let Some(b) = buf {
                    s.bufs[c as usize] = Some(b);
                }
                if e.kind == host::ErrorKind::Busy && self.commands > 0 {
                    return false;
                }
                if e.kind == host::ErrorKind::NamespaceGone {
                    // The host said it once at warn level; every request gets it now.
                    tracing::debug!(error = %e, offset, len, "NBD request refused by the host context");
                } else {
                    // Checked before submission, so this is a bug or a namespace that shrank.
                    tracing::warn!(error = %e, offset, len, "NBD request refused by the host context");
                }
                if s.refuse_unissued(refusal_status(e.kind)) {
                    self.complete(i);
                }
                true
            }
        }
    }

    fn on_done(&mut self, token: u64, status: Status, buf: Option<IoBuf>) {
        self.commands -= 1;
        let i = u16::try_from(token >> 32).expect("tokens carry a slot index");
        let chunk = (token & 0xffff_ffff) as u32;
        let s = &mut self.slots[usize::from(i)];
        if chunk != FLUSH_CHUNK {
            s.done += 1;
            if let Some(b) = buf {
                if s.cmd == Command::Read {
                    s.bufs[chunk as usize] = Some(b);
                } else {
                    self.pool.push(b);
                }
            }
        } else {
            s.done = s.chunks;
            s.flushing = false;
            s.chunks = 0;
        }
        if !status.is_success() && s.status.is_success() {
            s.status = status;
        }
        if s.done >= s.chunks && s.issued >= s.chunks {
            self.complete(i);
        }
    }

    /// All chunks of slot `i` completed: a FUA trim on a volatile cache flushes first.
    fn complete(&mut self, i: u16) {
        let vwc = self.info.volatile_cache;
        let s = &mut self.slots[usize::from(i)];
        if closing_flush(s.cmd, vwc) && s.status.is_success() && s.chunks > 0 {
            // NBD_CMD_FLAG_FUA: the reply waits until the deallocation is durable (an
            // NVMe Flush covers every command completed before it, NVMe Base 2.0 §7.1).
            s.flushing = true;
            s.chunks = 1;
            s.issued = 0;
            s.done = 0;
            self.issuing.push_back(i);
            return;
        }
        s.phase = Phase::Ready;
        self.ready.push_back(i);
    }

    // ---------------------------------------------------------------- replies

    fn fill_out(&mut self) {
        while let Some(&i) = self.ready.front() {
            let s = &self.slots[usize::from(i)];
            let segs = 2 + s.bufs.len();
            if self.out.segments() + segs > SEND_SEGMENTS_MAX {
                return;
            }
            self.ready.pop_front();
            self.reply(i);
        }
    }

    fn reply(&mut self, i: u16) {
        let structured = self.lim.structured;
        let s = &mut self.slots[usize::from(i)];
        let (cookie, read) = (s.req.cookie, s.cmd == Command::Read && s.refusal.is_none());
        let error = match (&s.refusal, s.status.is_success()) {
            (Some(r), _) => Some((r.error, r.message)),
            (None, true) => None,
            (None, false) => Some((nbd_error_of(s.status), reason_of(s.status))),
        };
        self.report.requests += 1;
        match error {
            Some((code, message)) => {
                self.report.errors += 1;
                let code = if code == 0 { nbd::EIO } else { code };
                if structured {
                    let mut b = Vec::with_capacity(64);
                    error_chunk(&mut b, cookie, code, message);
                    self.out.push_bytes(&b);
                } else {
                    self.out.push_bytes(&simple_reply(code, cookie));
                }
                for b in s.bufs.drain(..).flatten() {
                    self.pool.push(b);
                }
            }
            None if read => {
                if structured {
                    self.out.push_bytes(&offset_data_header(cookie, s.req.offset, s.req.length));
                } else {
                    self.out.push_bytes(&simple_reply(0, cookie));
                }
                for b in s.bufs.drain(..).flatten() {
                    let n = b.len();
                    if let Err((_, b)) = self.out.push_buf(b, 0..n) {
                        self.pool.push(b);
                    }
                }
            }
            None => self.out.push_bytes(&simple_reply(0, cookie)),
        }
        self.held -= s.held;
        s.held = 0;
        s.phase = Phase::Free;
        self.free.push(i);
    }

    fn send(&mut self) {
        if self.send_inflight || self.out.is_empty() {
            return;
        }
        if self.gone {
            for b in self.out.drain_bufs() {
                self.pool.push(b);
            }
            return;
        }
        let next = self.spare.take().unwrap_or_default();
        let msg = std::mem::replace(&mut self.out, next);
        match self.ctx.ring().send(self.fd, msg, Context::user_token(TOKEN_SEND)) {
            Ok(()) => self.send_inflight = true,
            Err((e, mut msg)) => {
                self.closing.get_or_insert_with(|| format!("send: {e}"));
                self.gone = true;
                for b in msg.drain_bufs() {
                    self.pool.push(b);
                }
                self.spare = Some(msg);
            }
        }
    }

    fn on_sent(&mut self, result: i32, payload: Payload) {
        self.send_inflight = false;
        if let Payload::Msg(mut m) = payload {
            for b in m.drain_bufs() {
                self.pool.push(b);
            }
            self.spare = Some(m);
        }
        if result < 0 {
            self.closing.get_or_insert_with(|| format!("send: errno {}", -result));
            self.gone = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request the host context refused is answered: at once when none of its chunks
    /// is in flight, else when the last one in flight completes (a refused single-chunk
    /// write used to wait for a completion that never came, and its client for a reply).
    #[test]
    fn a_refused_request_is_answered_once_nothing_of_it_is_in_flight() {
        let mut s = Slot::empty();
        s.chunks = 1;
        assert!(s.refuse_unissued(Status::INTERNAL), "one chunk, refused: nothing in flight");
        assert!(!s.status.is_success());
        let mut s = Slot::empty();
        (s.chunks, s.issued, s.done) = (4, 2, 1);
        assert!(!s.refuse_unissued(Status::INTERNAL), "the second chunk is still in flight");
        assert_eq!((s.issued, s.done), (4, 3));
        s.done += 1; // its completion (on_done)
        assert!(s.done >= s.chunks && s.issued >= s.chunks, "on_done answers it now");
        let mut s = Slot::empty();
        (s.chunks, s.issued, s.done) = (3, 2, 2);
        assert!(s.refuse_unissued(Status::INTERNAL), "the issued chunks completed already");
    }

    #[test]
    fn fua_goes_as_nvme_fua_where_the_command_has_it_and_as_a_closing_flush_where_not() {
        let ops = |vwc| {
            [Command::Write { fua: true }, Command::WriteZeroes { fua: true }, Command::Trim { fua: true }]
                .map(|c| (nvme_op(c, vwc), closing_flush(c, vwc)))
        };
        assert_eq!(ops(true), [(Op::WriteFua, false), (Op::WriteZeroesFua, false), (Op::Deallocate, true)]);
        // No volatile cache: a completed command is durable; nothing more to ask.
        assert_eq!(ops(false), [(Op::Write, false), (Op::WriteZeroes, false), (Op::Deallocate, false)]);
        let plain = [Command::Read, Command::Write { fua: false }, Command::WriteZeroes { fua: false }]
            .map(|c| (nvme_op(c, true), closing_flush(c, true)));
        assert_eq!(plain, [(Op::Read, false), (Op::Write, false), (Op::WriteZeroes, false)]);
        assert!(!closing_flush(Command::Trim { fua: false }, true));
    }
}
