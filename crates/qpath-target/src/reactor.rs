//! Reactor threads: each owns an io_uring and the connections handed to it,
//! for their whole life.
//!
//! Acceptor threads (one per port, see [`crate::server`]) deal new
//! connections out round-robin (one mailbox message per connection, never
//! per I/O). After that, everything a connection does — receive, parse, execute, file I/O,
//! send — happens on its reactor's thread: no lock, no cross-thread wakeup,
//! no allocation per I/O.
//!
//! ```text
//!  loop {
//!     turn(Poll | Block{timeout})   one io_uring_enter: submit + reap
//!       recv done  -> conn.queue_input -> ready list (shallow or deep)
//!       send done  -> conn.on_send_done
//!       file done  -> conn.on_file_done
//!     due timers (held completions), ticks every 10 ms (keep-alive, AEN, teardown)
//!     mailbox: new connections, authentication workers' DH results, shutdown
//!     ready lists, shallow then deep, round-robin: conn.process_input (≤ rx_budget_pdus
//!       each), until tx_deadline_us; connections with input left wait for the next turn
//!     touched connections, shallow first: take_send() -> ring.send, recv re-armed
//!  }
//! ```
//!
//! Fairness (seed 002; Linux nvmet-tcp's receive/send budgets and nvme-tcp's io_work
//! deadline): a connection parses at most `rx_budget_pdus` PDUs per turn and sends at
//! most `tx_batch_bytes` per batch, one batch in flight, so a flooded queue cannot hold
//! the reactor. The budgets are work-conserving: they apply while more than one
//! connection has work (and for 1 ms after); a connection alone on its reactor parses all
//! it has and sends in the largest batches. Queues whose host keeps few commands in flight ([`Connection::is_deep`])
//! are parsed, and their sends queued in the ring, before deep ones: a QD1 command waits
//! for at most one budget of a flood's work, not for its whole queue.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uring::conn::{ConnOps, OpKind, Token};
use uring::{Completion, FsyncMode, IoBuf, Mailbox, MailboxSender, Payload, Ring, RingConfig, Wait};

use crate::backend::{FileIo, FileOp};
use crate::error::Error;
use crate::limits::ConnTicket;
use crate::pool::BufPool;
use crate::port::Port;
use crate::registry::TargetState;
use crate::tcp::{ConnCtx, ConnState, Connection};

/// How a reactor waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Spin forever: lowest latency, one core per reactor at 100%.
    Busy,
    /// Spin for `spin_us` after the last activity, then sleep in the kernel.
    Adaptive,
    /// Always sleep when idle: no CPU when idle, a wakeup (~27 µs here) per idle period.
    Block,
}

impl std::str::FromStr for PollMode {
    type Err = String;

    /// `busy`, `adaptive` or `block` (command-line options).
    fn from_str(s: &str) -> Result<PollMode, String> {
        match s {
            "busy" => Ok(PollMode::Busy),
            "adaptive" => Ok(PollMode::Adaptive),
            "block" => Ok(PollMode::Block),
            _ => Err(format!("{s:?}: busy, adaptive or block")),
        }
    }
}

/// How reactors run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReactorOptions {
    /// Number of reactor threads (0 = one per online CPU).
    pub reactors: usize,
    /// CPUs to pin reactor k to (`cpus[k % len]`); empty = no pinning.
    pub cpus: Vec<usize>,
    /// Waiting strategy.
    pub poll: PollMode,
    /// Adaptive mode: spin this long after the last completion before sleeping.
    pub spin_us: u64,
}

impl Default for ReactorOptions {
    fn default() -> Self {
        ReactorOptions { reactors: 0, cpus: Vec::new(), poll: PollMode::Adaptive, spin_us: 200 }
    }
}

/// An accepted connection on its way to a reactor.
#[derive(Debug)]
pub struct NewConn {
    /// The socket.
    pub stream: TcpStream,
    /// The port it came in on.
    pub port: Arc<Port>,
    /// The peer's address.
    pub peer: Option<SocketAddr>,
    /// Its place under the connection limits, given back when the reactor frees it.
    pub ticket: ConnTicket,
}

/// Messages into a reactor (control plane only).
pub enum ReactorMsg {
    /// Serve this accepted connection.
    Conn(Box<NewConn>),
    /// Close every connection and exit.
    Shutdown,
    /// The Diffie-Hellman step a connection's request (token) handed to the
    /// [`crate::offload`] workers is done.
    AuthComputed(u64, Box<crate::auth::DhDone>),
}

impl std::fmt::Debug for ReactorMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReactorMsg::Conn(c) => write!(f, "Conn(port {}, {:?})", c.port.id, c.peer),
            ReactorMsg::Shutdown => write!(f, "Shutdown"),
            ReactorMsg::AuthComputed(t, d) => write!(f, "AuthComputed({t:#x}, {d:?})"),
        }
    }
}

/// A running reactor thread.
#[derive(Debug)]
pub struct ReactorHandle {
    /// Sends it control messages.
    pub sender: MailboxSender<ReactorMsg>,
    thread: Option<JoinHandle<()>>,
}

impl ReactorHandle {
    /// Asks the reactor to stop and waits for it.
    pub fn shutdown(mut self) {
        let _ = self.sender.send(ReactorMsg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Entry {
    conn: Connection,
    stream: Option<TcpStream>,
    /// Given back (dropped) when the entry is freed.
    _ticket: ConnTicket,
    /// Its ring operations (tokens with the connection's generation, the receive and send
    /// in flight) and its life: closed once the protocol is, freed once nothing of it is
    /// in flight (file operations counted by the connection).
    ops: ConnOps,
    timer_armed: bool,
    /// On a ready list: received input waits to be parsed.
    ready: bool,
    /// The turn it went on the ready list.
    ready_turn: u64,
}

/// Starts reactor `index`.
pub fn spawn(index: usize, target: Arc<TargetState>, opts: ReactorOptions) -> Result<ReactorHandle, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("qpath-reactor-{index}"))
        .spawn(move || {
            let busy = opts.poll == PollMode::Busy;
            // A polling reactor owns its CPU: the process's other threads keep off it
            // while this thread lives (a blocking one sleeps when idle and shares).
            let mut _owns_cpu = None;
            if !opts.cpus.is_empty() {
                let cpu = opts.cpus[index % opts.cpus.len()];
                match uring::pin_current_thread(cpu) {
                    Ok(()) if opts.poll != PollMode::Block => {
                        _owns_cpu = Some(uring::placement::claim(cpu, uring::placement::Spinner::Reactor));
                    }
                    Ok(()) => {}
                    Err(e) => tracing::warn!(reactor = index, cpu, "cannot pin: {e}"),
                }
            }
            let ring = Ring::new(RingConfig { entries: 1024, busy_poll: false, ..RingConfig::default() });
            let mut ring = match ring {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(Error::new(crate::error::ErrorKind::Io, format!("io_uring: {e}"))));
                    return;
                }
            };
            let (sender, mailbox) = match Mailbox::new(&mut ring) {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(Err(Error::new(crate::error::ErrorKind::Io, format!("mailbox: {e}"))));
                    return;
                }
            };
            let _ = tx.send(Ok(sender.clone()));
            let mut r = Reactor::new(index, target, ring, (sender, mailbox), opts, busy);
            r.run();
        })
        .map_err(|e| Error::io("spawn reactor", e))?;
    let sender =
        rx.recv().map_err(|_| Error::new(crate::error::ErrorKind::Io, "reactor thread died at start-up"))??;
    Ok(ReactorHandle { sender, thread: Some(thread) })
}

/// Hands a connection's Diffie-Hellman step to the target's workers; the result comes
/// back as [`ReactorMsg::AuthComputed`].
struct ReactorOffload<'a> {
    workers: &'a crate::offload::AuthWorkers,
    reply: &'a MailboxSender<ReactorMsg>,
}

impl crate::offload::Offload for ReactorOffload<'_> {
    fn submit(
        &self,
        work: crate::auth::DhWork,
        token: u64,
        host: &str,
        waiter: &crate::offload::Waiter,
    ) -> Result<(), crate::auth::DhWork> {
        let reply = self.reply.clone();
        self.workers.submit(
            work,
            token,
            host,
            waiter.clone(),
            Box::new(move |token, done| {
                // A reactor that has stopped takes no more messages; its connections are gone.
                let _ = reply.send(ReactorMsg::AuthComputed(token, Box::new(done)));
            }),
        )
    }
}

struct RingFileIo<'a> {
    ring: &'a mut Ring,
}

impl FileIo for RingFileIo<'_> {
    fn submit(&mut self, op: FileOp<'_>, token: u64) -> Result<(), (std::io::Error, Option<IoBuf>)> {
        let os = |e: uring::Error| std::io::Error::other(e.to_string());
        match op {
            FileOp::Read { file, buf, len, offset } => {
                self.ring.read_at(file.as_raw_fd(), buf, len, offset, token).map_err(|(e, b)| (os(e), Some(b)))
            }
            FileOp::Write { file, buf, len, offset } => {
                self.ring.write_at(file.as_raw_fd(), buf, 0..len, offset, token).map_err(|(e, b)| (os(e), Some(b)))
            }
            FileOp::Sync { file } => {
                self.ring.fsync(file.as_raw_fd(), FsyncMode::Data, token).map_err(|e| (os(e), None))
            }
            FileOp::Fallocate { file, mode, offset, len } => {
                self.ring.fallocate(file.as_raw_fd(), mode, offset, len, token).map_err(|e| (os(e), None))
            }
        }
    }
}

struct Reactor {
    index: usize,
    target: Arc<TargetState>,
    ring: Ring,
    mailbox: Mailbox<ReactorMsg>,
    /// Its own mailbox, for the authentication workers' results.
    to_self: MailboxSender<ReactorMsg>,
    opts: ReactorOptions,
    busy: bool,
    pool: BufPool,
    /// Where the pool's numbers are published on each tick.
    buffers: Arc<crate::registry::BufferStats>,
    conns: Vec<Option<Entry>>,
    free_keys: Vec<usize>,
    generation: u64,
    touched: Vec<usize>,
    /// Completions of the current turn; kept across turns so a turn allocates nothing.
    done: Vec<Completion>,
    /// Connections with input to parse: latency-sensitive ones, then deep ones (each
    /// served round-robin), and scratch for the ones served in a turn.
    ready_shallow: VecDeque<usize>,
    ready_deep: VecDeque<usize>,
    ready_served: Vec<usize>,
    /// Loop turns so far.
    turn: u64,
    /// When a turn last found more than one connection with work, and whether that was
    /// within [`CONTENDED_FOR`]: the budgets of each connection apply only then.
    contended_at: Option<Instant>,
    contended: bool,
    timer_keys: Vec<usize>,
    last_tick: Instant,
    last_activity: Instant,
    stop: bool,
}

/// How often a reactor looks at its connections' clocks and at what other threads may
/// have changed for them (a controller failed or reset elsewhere, a port removed): every
/// [`TICK`] while it carries I/O, every [`IDLE_TICK`] once it has had none for
/// [`IDLE_AFTER`], never while it has no connection (a new one comes with a mailbox
/// message, which wakes it). An idle target sleeps instead of waking 100 times a second
/// per reactor.
const TICK: Duration = Duration::from_millis(10);
const IDLE_TICK: Duration = Duration::from_millis(100);
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// How long after a turn with two or more busy connections the reactor still counts as
/// shared: the fairness budgets stay on across the gaps of a QD1 host's round trips
/// (tens of µs), and come off once a lone stream has had the reactor to itself this long.
const CONTENDED_FOR: Duration = Duration::from_millis(1);

impl Reactor {
    fn new(
        index: usize,
        target: Arc<TargetState>,
        ring: Ring,
        (to_self, mailbox): (MailboxSender<ReactorMsg>, Mailbox<ReactorMsg>),
        opts: ReactorOptions,
        busy: bool,
    ) -> Reactor {
        let pool = BufPool::new(target.opts.max_transfer(), target.opts.buffer_pool_bytes);
        let buffers = target.register_buffers(index);
        Reactor {
            index,
            target,
            ring,
            mailbox,
            to_self,
            opts,
            busy,
            pool,
            buffers,
            conns: Vec::new(),
            free_keys: Vec::new(),
            generation: 0,
            touched: Vec::with_capacity(256),
            done: Vec::with_capacity(256),
            ready_shallow: VecDeque::with_capacity(256),
            ready_deep: VecDeque::with_capacity(256),
            ready_served: Vec::with_capacity(256),
            turn: 0,
            contended_at: None,
            contended: true,
            timer_keys: Vec::new(),
            last_tick: Instant::now(),
            last_activity: Instant::now(),
            stop: false,
        }
    }

    fn run(&mut self) {
        tracing::debug!(reactor = self.index, "reactor running");
        while !self.stop || self.conns.iter().any(Option::is_some) {
            let wait = self.wait_mode();
            let mut touched = std::mem::take(&mut self.touched);
            let mut done = std::mem::take(&mut self.done);
            let res = self.ring.turn(wait, |_, c| done.push(c));
            if let Err(e) = res {
                tracing::error!(reactor = self.index, "io_uring turn failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
            self.turn += 1;
            let turn_start = Instant::now();
            if !done.is_empty() {
                self.last_activity = turn_start;
            }
            for c in done.drain(..) {
                self.complete(c, &mut touched);
            }
            self.done = done;
            self.touched = touched;
            self.run_timers();
            if self.tick_period().is_some_and(|p| self.last_tick.elapsed() >= p) {
                self.last_tick = Instant::now();
                self.tick();
            }
            let mut msgs = Vec::new();
            self.mailbox.drain(|m| msgs.push(m));
            for m in msgs {
                self.on_msg(m);
            }
            self.note_contention(turn_start);
            self.process_ready(turn_start);
            let touched = std::mem::take(&mut self.touched);
            // Shallow queues' sends go into the ring, and out of it, first.
            for deep in [false, true] {
                for &k in &touched {
                    if self.conns.get(k).and_then(Option::as_ref).is_some_and(|e| e.conn.is_deep() == deep) {
                        self.drive(k);
                    }
                }
            }
            self.touched = touched;
            self.touched.clear();
            if self.stop {
                for k in 0..self.conns.len() {
                    if let Some(e) = self.conns[k].as_mut() {
                        e.conn.close("target shutting down");
                    }
                    self.drive(k);
                }
            }
        }
        tracing::debug!(reactor = self.index, "reactor stopped");
    }

    /// Work-conserving fairness: the reactor is shared when this turn has more than one
    /// connection with completions or input to parse, and for [`CONTENDED_FOR`] after.
    fn note_contention(&mut self, now: Instant) {
        let ready = self.ready_shallow.len() + self.ready_deep.len();
        let first_ready = self.ready_shallow.front().or(self.ready_deep.front());
        let busy = self.touched.len() > 1
            || ready > 1
            || (self.touched.len() == 1 && first_ready.is_some_and(|k| *k != self.touched[0]));
        if busy {
            self.contended_at = Some(now);
        }
        self.contended = self.contended_at.is_some_and(|t| now.saturating_duration_since(t) < CONTENDED_FOR);
    }

    fn wait_mode(&self) -> Wait {
        if self.busy || !self.touched.is_empty() || !self.ready_shallow.is_empty() || !self.ready_deep.is_empty() {
            return Wait::Poll;
        }
        let mut timeout = self.tick_period().map(|p| p.saturating_sub(self.last_tick.elapsed()));
        if let Some(t) = self.next_timer_in() {
            timeout = Some(timeout.map_or(t, |d| d.min(t)));
        }
        match self.opts.poll {
            PollMode::Busy => Wait::Poll,
            PollMode::Adaptive if self.last_activity.elapsed() < Duration::from_micros(self.opts.spin_us) => Wait::Poll,
            _ if timeout.is_some_and(|d| d.is_zero()) => Wait::Poll,
            _ => Wait::Block { timeout },
        }
    }

    /// How often to tick now ([`TICK`]); `None` with no connection.
    fn tick_period(&self) -> Option<Duration> {
        if self.conns.len() == self.free_keys.len() {
            None
        } else if self.last_activity.elapsed() >= IDLE_AFTER {
            Some(IDLE_TICK)
        } else {
            Some(TICK)
        }
    }

    fn next_timer_in(&self) -> Option<Duration> {
        let now = self.target.now_ns();
        self.timer_keys
            .iter()
            .filter_map(|&k| self.conns.get(k)?.as_ref()?.conn.next_timer())
            .min()
            .map(|t| Duration::from_nanos(t.saturating_sub(now)))
    }

    fn with_conn(&mut self, key: usize, f: impl FnOnce(&mut Entry, &mut ConnCtx<'_>)) {
        let now = self.target.now_ns();
        let Some(Some(e)) = self.conns.get_mut(key) else { return };
        e.conn.set_contended(self.contended);
        let base = e.ops.token(OpKind::File, 0);
        let mut io = RingFileIo { ring: &mut self.ring };
        let offload = ReactorOffload { workers: &self.target.auth_workers, reply: &self.to_self };
        let mut ctx =
            ConnCtx { pool: &mut self.pool, file_io: &mut io, token: base, now_ns: now, offload: Some(&offload) };
        f(e, &mut ctx);
    }

    fn complete(&mut self, c: Completion, touched: &mut Vec<usize>) {
        let t = Token::from_u64(c.token);
        let key = t.map_or(usize::MAX, |t| t.key as usize);
        let live = t.is_some_and(|t| matches!(self.conns.get(key), Some(Some(e)) if e.ops.owns(&t)));
        let Some(Token { kind, slot, .. }) = t.filter(|_| live) else {
            // A completion for a connection already freed cannot happen (we wait for
            // every op before freeing); drop the memory defensively.
            if let Payload::Buf(b) = c.payload {
                self.pool.put(b);
            }
            return;
        };
        match kind {
            OpKind::Recv => {
                let res = c.io_result();
                let start = c.result;
                let buf = c.into_buf();
                self.with_conn(key, |e, ctx| {
                    e.ops.recv_done();
                    let Some(buf) = buf else { return };
                    match res {
                        Ok(n) => {
                            // The ring set len = range.start + n; the connection expects len = range.start.
                            let mut buf = buf;
                            let len = buf.len();
                            buf.set_len(len - n);
                            e.conn.queue_input(buf, n, ctx.now_ns);
                        }
                        Err(err) => {
                            if tls::kernel::control_record(&err) && e.conn.kernel_tls() {
                                e.conn.kernel_tls_control_record();
                            }
                            e.conn.queue_input(buf, 0, ctx.now_ns);
                            if err.raw_os_error() != Some(libc::ECANCELED) {
                                e.conn.close(&format!("recv failed: {err}"));
                            }
                        }
                    }
                    let _ = start;
                });
                self.make_ready(key);
            }
            OpKind::Send => {
                let res = c.io_result().map(|_| ());
                let msg = c.into_msg();
                self.with_conn(key, |e, ctx| {
                    e.ops.send_done();
                    if let Some(m) = msg {
                        e.conn.on_send_done(m, res, ctx);
                    }
                });
                // Input resumed after the send may have stopped at the PDU budget.
                self.make_ready(key);
            }
            OpKind::File => {
                let res = c.io_result();
                let buf = match c.payload {
                    Payload::Buf(b) => Some(b),
                    _ => None,
                };
                self.with_conn(key, |e, ctx| e.conn.on_file_done(slot, res, buf, ctx));
            }
            OpKind::User => {}
        }
        if !touched.contains(&key) {
            touched.push(key);
        }
    }

    /// Puts a connection with input to parse at the back of the ready list its depth picks.
    fn make_ready(&mut self, key: usize) {
        let turn = self.turn;
        let Some(Some(e)) = self.conns.get_mut(key) else { return };
        if e.ready || !e.conn.has_input() {
            return;
        }
        e.ready = true;
        e.ready_turn = turn;
        if e.conn.is_deep() {
            self.ready_deep.push_back(key);
        } else {
            self.ready_shallow.push_back(key);
        }
    }

    /// Parses the input of ready connections, each within its PDU budget: every shallow
    /// one (a few PDUs each), then deep ones round-robin until `tx_deadline_us` after the
    /// turn began (at least one, so they never starve). Deep connections not served keep
    /// their place at the front; served ones with input left go to the back.
    fn process_ready(&mut self, turn_start: Instant) {
        let deadline_us = self.target.limits.tx_deadline_us();
        let deadline = (deadline_us > 0).then(|| turn_start + Duration::from_micros(deadline_us));
        let mut served = std::mem::take(&mut self.ready_served);
        for deep in [false, true] {
            let waiting = if deep { self.ready_deep.len() } else { self.ready_shallow.len() };
            for i in 0..waiting {
                if deep && i > 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let list = if deep { &mut self.ready_deep } else { &mut self.ready_shallow };
                let Some(key) = list.pop_front() else { break };
                let turn = self.turn;
                let Some(Some(e)) = self.conns.get_mut(key) else { continue };
                e.ready = false;
                e.conn.info().stats.ready_wait_turns_max.max(turn - e.ready_turn);
                self.with_conn(key, |e, ctx| e.conn.process_input(ctx));
                served.push(key);
                if !self.touched.contains(&key) {
                    self.touched.push(key);
                }
            }
        }
        for &key in &served {
            self.make_ready(key);
        }
        served.clear();
        self.ready_served = served;
    }

    /// Submits whatever the connection wants next, and frees it when it is done.
    fn drive(&mut self, key: usize) {
        let Some(Some(e)) = self.conns.get_mut(key) else { return };
        let fd = match &e.stream {
            Some(s) => s.as_raw_fd(),
            None => return,
        };
        if e.conn.has_waiting() {
            self.with_conn(key, |e, ctx| e.conn.pump(ctx));
        }
        let Some(Some(e)) = self.conns.get_mut(key) else { return };
        // Kernel TLS: the keys go to the socket while nothing is in flight on it (a receive
        // posted before would return ciphertext, a send would be sealed twice).
        if !e.ops.send_in_flight()
            && !e.ops.recv_in_flight()
            && let Some(h) = e.conn.kernel_tls_handover()
            && let Some(s) = e.stream.as_ref()
        {
            e.conn.kernel_tls_installed(tls::kernel::install(std::os::fd::AsFd::as_fd(s), &h));
        }
        if e.ops.may_send()
            && let Some(msg) = e.conn.take_send()
        {
            // Kernel TLS refuses MSG_WAITALL (the ring resubmits short sends either way).
            let t = e.ops.token(OpKind::Send, 0);
            let sent = if e.conn.kernel_tls() {
                self.ring.send_without_waitall(fd, msg, t)
            } else {
                self.ring.send(fd, msg, t)
            };
            match sent {
                Ok(()) => e.ops.send_started(),
                Err((err, msg)) => {
                    tracing::warn!("send submit failed: {err}");
                    let mut io = RingFileIo { ring: &mut self.ring };
                    let mut ctx =
                        ConnCtx { pool: &mut self.pool, file_io: &mut io, token: 0, now_ns: 0, offload: None };
                    e.conn.on_send_done(msg, Err(std::io::Error::other(err.to_string())), &mut ctx);
                }
            }
        }
        if e.ops.may_recv()
            && let Some((buf, range)) = e.conn.take_recv_buf()
        {
            match self.ring.recv(fd, buf, range, e.ops.token(OpKind::Recv, 0)) {
                Ok(()) => e.ops.recv_started(),
                Err((err, buf)) => {
                    tracing::warn!("recv submit failed: {err}");
                    let mut io = RingFileIo { ring: &mut self.ring };
                    let mut ctx =
                        ConnCtx { pool: &mut self.pool, file_io: &mut io, token: 0, now_ns: 0, offload: None };
                    e.conn.on_recv(buf, 0, &mut ctx);
                }
            }
        }
        if e.conn.next_timer().is_some() && !e.timer_armed {
            e.timer_armed = true;
            self.timer_keys.push(key);
        }
        if e.conn.state() == ConnState::Closed {
            e.ops.close();
            if e.ops.take_cancel() {
                let _ = self.ring.cancel_fd(fd);
            }
            if e.ops.can_free() && e.conn.file_ops_in_flight() == 0 {
                self.free(key);
            }
        }
    }

    fn free(&mut self, key: usize) {
        self.with_conn(key, |e, ctx| e.conn.release(ctx));
        if let Some(Some(mut e)) = self.conns.get_mut(key).map(Option::take) {
            // No operation is in flight on it any more: close synchronously, so the
            // peer sees the FIN even if the reactor is about to exit.
            drop(e.stream.take());
            tracing::debug!(reactor = self.index, peer = ?e.conn.info().peer, reason = ?e.conn.close_reason(), "connection freed");
            if e.ready {
                self.ready_shallow.retain(|&k| k != key);
                self.ready_deep.retain(|&k| k != key);
            }
            self.free_keys.push(key);
            if self.conns.len() == self.free_keys.len() {
                // The last connection: no tick follows to publish what it gave back.
                self.buffers.publish(&self.pool);
            }
        }
    }

    fn run_timers(&mut self) {
        if self.timer_keys.is_empty() {
            return;
        }
        let now = self.target.now_ns();
        let keys = std::mem::take(&mut self.timer_keys);
        let mut keep = Vec::with_capacity(keys.len());
        for k in keys {
            let due = match self.conns.get(k) {
                Some(Some(e)) => e.conn.next_timer(),
                _ => continue,
            };
            match due {
                Some(t) if t <= now => {
                    self.with_conn(k, |e, ctx| e.conn.on_timers(ctx));
                    if !self.touched.contains(&k) {
                        self.touched.push(k);
                    }
                    if let Some(Some(e)) = self.conns.get_mut(k) {
                        if e.conn.next_timer().is_some() {
                            keep.push(k);
                        } else {
                            e.timer_armed = false;
                        }
                    }
                }
                Some(_) => keep.push(k),
                None => {
                    if let Some(Some(e)) = self.conns.get_mut(k) {
                        e.timer_armed = false;
                    }
                }
            }
        }
        self.timer_keys = keep;
    }

    fn tick(&mut self) {
        self.buffers.publish(&self.pool);
        for k in 0..self.conns.len() {
            if self.conns[k].is_some() {
                self.with_conn(k, |e, ctx| e.conn.tick(ctx));
                self.drive(k);
            }
        }
    }

    fn on_msg(&mut self, m: ReactorMsg) {
        match m {
            ReactorMsg::Conn(c) => self.add_conn(*c),
            ReactorMsg::Shutdown => self.stop = true,
            ReactorMsg::AuthComputed(token, done) => {
                let Some(t) = Token::from_u64(token) else { return };
                let (key, slot) = (t.key as usize, t.slot);
                if !matches!(self.conns.get(key), Some(Some(e)) if e.ops.owns(&t)) {
                    // The connection is gone: nobody waits for the result.
                    return;
                }
                self.with_conn(key, |e, ctx| e.conn.on_auth_computed(slot, *done, ctx));
                if !self.touched.contains(&key) {
                    self.touched.push(key);
                }
            }
        }
    }

    fn add_conn(&mut self, c: NewConn) {
        let NewConn { stream, port, peer, ticket } = c;
        if self.stop {
            return;
        }
        self.generation = self.generation.wrapping_add(1);
        let conn = Connection::new(Arc::clone(&self.target), port, peer, self.index);
        let key = self.free_keys.pop().unwrap_or(self.conns.len());
        let e = Entry {
            conn,
            stream: Some(stream),
            _ticket: ticket,
            ops: ConnOps::new(u32::try_from(key).expect("fewer than 2^32 connections"), self.generation),
            timer_armed: false,
            ready: false,
            ready_turn: 0,
        };
        if key == self.conns.len() {
            self.conns.push(Some(e));
        } else {
            self.conns[key] = Some(e);
        }
        self.drive(key);
    }
}
