//! User-owned queue pairs: an I/O queue the block core never sees (seed
//! 001's "user_poll" queues).
//!
//! A [`QueuePair`] owns one of a controller's reserved user queues
//! (`ConnectOptions::nr_user_queues`) and its own io_uring. The caller builds
//! raw SQEs, owns its data buffers, picks its command ids, and polls
//! completions on its own thread: no request slots, tags, queue maps, fair
//! sharing, statistics, retries or multipath in between — each of those is
//! the application's business. Admin passthrough (like `nvme admin-passthru`)
//! goes through [`Controller::admin_command`].
//!
//! ```no_run
//! use qpath_host::controller::{ConnectOptions, Controller};
//! use qpath_host::passthru::{PtCompletion, QueuePair};
//! use qpath_host::queue::DataDir;
//! use nvme::{Cid, Nsid, SglDescriptor, Sqe, opcode::io};
//! use uring::IoBuf;
//!
//! let mut o = ConnectOptions::new("127.0.0.1:4420".parse().unwrap(), "nqn.2026-11.io.qpath:default");
//! o.nr_user_queues = 1;
//! let ctrl = Controller::connect(o)?;
//! let mut qp = QueuePair::new(&ctrl)?;
//! let sqe = Sqe::rw(io::READ, Cid(0), Nsid(1), 0, 8, SglDescriptor::transport(4096));
//! qp.submit(sqe, Some(IoBuf::new(4096)), 4096, DataDir::FromController, 42).map_err(|(e, _)| e)?;
//! let mut done: Vec<PtCompletion> = Vec::new();
//! while done.is_empty() {
//!     qp.poll(&mut done)?;
//! }
//! assert!(done[0].cqe.status.is_success());
//! # Ok::<(), qpath_host::error::Error>(())
//! ```

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use nvme::{Cqe, Sqe};
use uring::conn::{ConnOps, OpKind, Token};
use uring::{IoBuf, Mailbox, MailboxSender, Payload, Ring, RingConfig, Wait};

use crate::control::Control;
use crate::controller::{Controller, QueueMsg};
use crate::error::{Error, ErrorKind, Result};
use crate::queue::{DataDir, HostQueue, Io, QueueState, SubmitError};

/// A finished raw command.
#[derive(Debug)]
pub struct PtCompletion {
    /// The caller's value.
    pub user_data: u64,
    /// The completion entry, as the controller sent it (CID = the tag used).
    pub cqe: Cqe,
    /// The data buffer, back.
    pub buf: Option<IoBuf>,
}

/// A user-owned I/O queue pair.
pub struct QueuePair {
    ctrl: Arc<Controller>,
    index: u16,
    ring: Ring,
    mailbox: Mailbox<QueueMsg>,
    _sender: MailboxSender<QueueMsg>,
    conn: Option<(TcpStream, HostQueue)>,
    /// The ring side of `conn` (what is in flight, closing, its tokens).
    ops: ConnOps,
    free: Vec<u16>,
    /// Connections installed so far (the generation of `ops`).
    installed: u64,
    /// The controller generation of the connection (`conn`).
    ctrl_gen: u64,
    /// A re-authentication's command, beside the caller's.
    control: Control,
    /// Completions reaped by [`QueuePair::execute`] for other commands.
    stash: Vec<PtCompletion>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("index", &self.index).finish()
    }
}

impl QueuePair {
    /// Takes a free user queue of `ctrl` for the calling thread.
    pub fn new(ctrl: &Arc<Controller>) -> Result<QueuePair> {
        let mut ring =
            Ring::new(RingConfig::default()).map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        let (sender, mailbox) =
            Mailbox::new(&mut ring).map_err(|e| Error::new(ErrorKind::Io, format!("mailbox: {e}")))?;
        let index = *ctrl
            .free_user_queues()
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Busy, "no free user queue (set ConnectOptions::nr_user_queues)"))?;
        let claimed =
            ctrl.claim_queue(index, sender.clone()).ok_or_else(|| Error::new(ErrorKind::Busy, "user queue taken"))?;
        let mut qp = QueuePair {
            ctrl: Arc::clone(ctrl),
            index,
            ring,
            mailbox,
            _sender: sender,
            conn: None,
            ops: ConnOps::new(0, 0),
            free: Vec::new(),
            installed: 0,
            ctrl_gen: 0,
            control: Control::default(),
            stash: Vec::new(),
        };
        if let Some((s, q, generation)) = claimed {
            qp.install(s, q, generation);
        }
        Ok(qp)
    }

    fn install(&mut self, s: TcpStream, q: HostQueue, ctrl_gen: u64) {
        self.free = (0..q.entries()).rev().collect();
        if let Some((old, _)) = self.conn.take()
            && (self.ops.recv_in_flight() || self.ops.send_in_flight())
        {
            // Cancelled and closed on the ring (closing it here would let its number be
            // reused under the cancel); its operations complete under its generation,
            // which the new connection's tokens do not match.
            let _ = self.ring.close(old);
        }
        self.installed += 1;
        self.ops = ConnOps::new(0, self.installed);
        self.ctrl_gen = ctrl_gen;
        self.control = Control::default();
        self.conn = Some((s, q));
        self.arm_recv();
    }

    /// Queue entries (the most commands in flight).
    pub fn depth(&self) -> usize {
        self.conn.as_ref().map_or(0, |(_, q)| usize::from(q.entries()))
    }

    /// Whether the queue is connected.
    pub fn is_live(&self) -> bool {
        self.conn.as_ref().is_some_and(|(_, q)| q.state() == QueueState::Live)
    }

    /// Submits a raw command (its CID is replaced by a free tag). The command
    /// goes out with the next [`QueuePair::poll`] (or [`QueuePair::flush`]).
    pub fn submit(
        &mut self,
        sqe: Sqe,
        buf: Option<IoBuf>,
        len: u32,
        dir: DataDir,
        user_data: u64,
    ) -> std::result::Result<(), (Error, Option<IoBuf>)> {
        let Some((_, q)) = self.conn.as_mut() else {
            return Err((Error::new(ErrorKind::Io, "queue not connected"), buf));
        };
        let Some(tag) = self.free.pop() else {
            return Err((Error::new(ErrorKind::Busy, "queue full"), buf));
        };
        match q.submit(tag, Io { sqe, buf, len, dir, token: user_data }) {
            Ok(()) => Ok(()),
            Err((e, io)) => {
                self.free.push(tag);
                // Full: a re-authentication's command holds one entry for now.
                let kind = if e == SubmitError::Full { ErrorKind::Busy } else { ErrorKind::Invalid };
                Err((Error::new(kind, e.to_string()), io.buf))
            }
        }
    }

    /// Submits a fused operation (NVMe Base 2.0 §3.4.2; qpath's target offers Compare and
    /// Write): `first` gets FUSE 01b and `second` FUSE 10b, and they go out as adjacent
    /// entries of this queue in one send, or neither is submitted (both come back). Each
    /// completes on its own, with its `token` as user data. A refusal hands both back
    /// (boxed: the error path only).
    pub fn submit_fused(&mut self, mut first: Io, mut second: Io) -> std::result::Result<(), Box<(Error, Io, Io)>> {
        let Some((_, q)) = self.conn.as_mut() else {
            return Err(Box::new((Error::new(ErrorKind::Io, "queue not connected"), first, second)));
        };
        // Everything the queue would refuse the second for, checked before the first goes:
        // a first command sent alone fails as "Missing Fused Command".
        let short = |io: &Io| io.dir != DataDir::None && io.buf.as_ref().is_none_or(|b| b.capacity() < io.len as usize);
        if short(&first) || short(&second) {
            return Err(Box::new((
                Error::new(ErrorKind::Invalid, "a data buffer shorter than its length"),
                first,
                second,
            )));
        }
        if self.free.len() < 2 || q.outstanding() + 2 > usize::from(q.entries()) {
            let e = Error::new(ErrorKind::Busy, "no room for both commands of a fused operation");
            return Err(Box::new((e, first, second)));
        }
        first.sqe.set_fuse(nvme::opcode::fuse::FIRST);
        second.sqe.set_fuse(nvme::opcode::fuse::SECOND);
        let (Some(t1), Some(t2)) = (self.free.pop(), self.free.pop()) else {
            unreachable!("two free tags were checked")
        };
        if let Err((e, first)) = q.submit(t1, first) {
            self.free.extend([t2, t1]);
            return Err(Box::new((Error::new(ErrorKind::Invalid, e.to_string()), first, second)));
        }
        if let Err((e, _)) = q.submit(t2, second) {
            panic!("the second command of a fused pair refused after its first was queued: {e}");
        }
        Ok(())
    }

    /// Sends queued commands without reaping.
    pub fn flush(&mut self) {
        if !self.ops.may_send() {
            return;
        }
        let Some((s, q)) = self.conn.as_mut() else { return };
        if let Some(msg) = q.take_send() {
            let t = self.ops.token(OpKind::Send, 0);
            // Kernel TLS refuses MSG_WAITALL (the ring resubmits short sends either way).
            let sent = if q.kernel_tls() {
                self.ring.send_without_waitall(s.as_raw_fd(), msg, t)
            } else {
                self.ring.send(s.as_raw_fd(), msg, t)
            };
            match sent {
                Ok(()) => self.ops.send_started(),
                Err((e, msg)) => q.on_send_done(msg, Err(std::io::Error::other(e.to_string()))),
            }
        }
    }

    fn arm_recv(&mut self) {
        if !self.ops.may_recv() {
            return;
        }
        let Some((s, q)) = self.conn.as_mut() else { return };
        if let Some((buf, range)) = q.take_recv_buf() {
            match self.ring.recv(s.as_raw_fd(), buf, range, self.ops.token(OpKind::Recv, 0)) {
                Ok(()) => self.ops.recv_started(),
                Err((_, buf)) => q.on_recv_none(buf),
            }
        }
    }

    /// Submits one command and polls until it completes, within `timeout`: `nvme
    /// io-passthru`'s shape, for control commands between I/O (reservations, ...).
    /// Completions of other commands reaped meanwhile are kept for the next [`Self::poll`].
    /// The command goes with `user_data` `u64::MAX`: other commands must not use it.
    pub fn execute(
        &mut self,
        sqe: Sqe,
        buf: Option<IoBuf>,
        len: u32,
        dir: DataDir,
        timeout: std::time::Duration,
    ) -> Result<PtCompletion> {
        const TOKEN: u64 = u64::MAX;
        self.submit(sqe, buf, len, dir, TOKEN).map_err(|(e, _)| e)?;
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            self.poll_queue(&mut out)?;
            if let Some(i) = out.iter().position(|c| c.user_data == TOKEN) {
                let done = out.swap_remove(i);
                self.stash.append(&mut out);
                return Ok(done);
            }
            if std::time::Instant::now() > deadline {
                self.stash.append(&mut out);
                return Err(Error::new(ErrorKind::Timeout, format!("no completion within {timeout:?}")));
            }
        }
    }

    /// Sends, reaps (never sleeps) and appends finished commands to `out`.
    pub fn poll(&mut self, out: &mut Vec<PtCompletion>) -> Result<usize> {
        let stashed = self.stash.len();
        out.append(&mut self.stash);
        Ok(stashed + self.poll_queue(out)?)
    }

    fn poll_queue(&mut self, out: &mut Vec<PtCompletion>) -> Result<usize> {
        self.flush();
        let before = out.len();
        let ops = self.ops;
        let mut recv_done = None;
        let mut send_done = None;
        self.ring
            .turn(Wait::Poll, |_, c| {
                let Some(t) = Token::from_u64(c.token).filter(|t| ops.owns(t)) else {
                    return;
                };
                let res = c.io_result();
                match (t.kind, c.payload) {
                    (OpKind::Recv, Payload::Buf(b)) => recv_done = Some((b, res)),
                    (OpKind::Send, Payload::Msg(m)) => send_done = Some((m, res.map(|_| ()))),
                    _ => {}
                }
            })
            .map_err(|e| Error::new(ErrorKind::Io, format!("io_uring: {e}")))?;
        if let Some((_, q)) = self.conn.as_mut() {
            if let Some((mut b, res)) = recv_done {
                self.ops.recv_done();
                match res {
                    Ok(n) => {
                        let len = b.len();
                        b.set_len(len - n);
                        q.on_recv(b, n);
                    }
                    Err(e) => {
                        q.on_recv_none(b);
                        q.set_failed(&format!("recv: {e}"));
                    }
                }
            }
            if let Some((m, res)) = send_done {
                self.ops.send_done();
                q.on_send_done(m, res);
            }
            let control_tag = q.control_tag();
            for d in q.completions().drain(..) {
                if d.tag == control_tag {
                    self.control.complete(d);
                    continue;
                }
                self.free.push(d.tag);
                out.push(PtCompletion { user_data: d.token, cqe: d.cqe, buf: d.buf });
            }
            if self.control.is_waiting() {
                self.control.retry(q);
            }
            if q.state() == QueueState::Failed && self.ops.is_open() {
                // Outstanding commands fail back to the caller: a user queue has no retries.
                q.abort_all(nvme::Status::HOST_PATH_ERROR);
                self.control.fail(q.error().unwrap_or("queue failed"));
                for d in q.completions().drain(..) {
                    if d.tag == control_tag {
                        self.control.complete(d);
                        continue;
                    }
                    out.push(PtCompletion { user_data: d.token, cqe: d.cqe, buf: d.buf });
                }
                self.ctrl.report_io_failure("user queue failed");
                self.ops.close();
            }
        }
        self.retire_if_closed();
        self.serve_mailbox();
        self.arm_recv();
        self.flush();
        Ok(out.len() - before)
    }

    /// A failed connection goes once nothing of it is in flight; what is (a receive on a
    /// socket that is still up) is cancelled first.
    fn retire_if_closed(&mut self) {
        if let Some((s, _)) = &self.conn
            && !self.ops.is_open()
        {
            if self.ops.take_cancel() {
                let _ = self.ring.cancel_fd(s.as_raw_fd());
            }
            if self.ops.can_free() {
                self.conn = None;
            }
        }
    }

    /// New connections of this queue and the controller's commands for it.
    fn serve_mailbox(&mut self) {
        let mut msgs = Vec::new();
        self.mailbox.drain(|m| msgs.push(m));
        for m in msgs {
            match m {
                QueueMsg::Queue { stream, queue, generation, .. } => self.install(stream, queue, generation),
                QueueMsg::Command { ctrl, index, generation, io, reply } => match self.conn.as_mut() {
                    Some((_, q))
                        if Arc::ptr_eq(&ctrl, &self.ctrl)
                            && index == self.index
                            && generation == self.ctrl_gen
                            && q.state() == QueueState::Live =>
                    {
                        self.control.offer(q, io, reply);
                    }
                    _ => {
                        let _ = reply.send(Err(Error::new(
                            ErrorKind::Gone,
                            format!("user queue {}: no live connection of that generation", index + 1),
                        )));
                    }
                },
            }
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.ctrl.release_queue(self.index, None);
    }
}
