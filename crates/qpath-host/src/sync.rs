//! A blocking driver for a [`HostQueue`]: used for queue handshakes (ICReq,
//! Connect), the admin queue's keep-alive/AER thread, discovery, and tests.
//! Never on the I/O path.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::queue::{DataDir, Done, HostQueue, Io, QueueConfig, QueueState};

/// A queue over a blocking socket.
#[derive(Debug)]
pub struct SyncQueue {
    stream: TcpStream,
    queue: HostQueue,
    free_tags: Vec<u16>,
    done: VecDeque<Done>,
    next_token: u64,
    /// The PSK the admin queue's concatenating transaction generated, until taken.
    generated: Option<tls::psk::RetainedPsk>,
}

impl SyncQueue {
    /// Connects, exchanges ICReq/ICResp and Fabrics Connect within `timeout`.
    pub fn connect(addr: SocketAddr, cfg: QueueConfig, timeout: Duration) -> Result<SyncQueue> {
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|e| Error::io(format!("connect to {addr}"), &e))?;
        stream.set_nodelay(true).map_err(|e| Error::io("TCP_NODELAY", &e))?;
        // Closing a queue resets it and drops its unsent bytes (Linux: sock_no_linger):
        // commands failed over to another path must not reach the target later from here.
        uring::set_linger_zero(stream.as_raw_fd()).map_err(|e| Error::io("SO_LINGER", &e))?;
        if let Some(cc) = &cfg.tcp_congestion {
            uring::set_congestion_control(stream.as_raw_fd(), cc)
                .map_err(|e| Error::io(format!("TCP congestion control {cc:?}"), &e))?;
        }
        SyncQueue::handshake(stream, cfg, timeout)
    }

    /// Runs the handshake on an already connected socket, and the in-band
    /// authentication when Connect asks for it.
    pub fn handshake(stream: TcpStream, cfg: QueueConfig, timeout: Duration) -> Result<SyncQueue> {
        let deadline = Instant::now() + timeout;
        let mut q = SyncQueue::open(stream, cfg, deadline)?;
        if q.queue.state() == QueueState::Authenticating {
            // Connect asked for in-band authentication (ATR): the queue goes live only after it.
            let c = q.queue.config();
            let (keys, hostnqn, subnqn) = (c.dhchap.clone(), c.hostnqn.clone(), c.subnqn.clone());
            let concat = (c.concat && c.qid.is_admin()).then_some(if c.tls.is_some() {
                crate::auth::Concat::ReplaceTlsPsk
            } else {
                crate::auth::Concat::NewTlsPsk
            });
            let occasion = crate::auth::Occasion::BringUp;
            match concat {
                Some(sc) => {
                    let psk = crate::auth::authenticate_concat(
                        &mut q,
                        keys.as_ref(),
                        &hostnqn,
                        &subnqn,
                        deadline,
                        occasion,
                        sc,
                    )?;
                    q.generated = Some(psk);
                }
                None => crate::auth::authenticate(&mut q, keys.as_ref(), &hostnqn, &subnqn, deadline, occasion)?,
            }
            q.queue.authenticated();
        }
        Ok(q)
    }

    /// ICReq/ICResp and Fabrics Connect on a connected socket within `timeout`, and no
    /// more: a queue whose Connect asked for in-band authentication comes back
    /// `Authenticating`, the transaction left to the caller (tests and labs that play a
    /// host out of step with it).
    pub fn until_connected(stream: TcpStream, cfg: QueueConfig, timeout: Duration) -> Result<SyncQueue> {
        SyncQueue::open(stream, cfg, Instant::now() + timeout)
    }

    fn open(stream: TcpStream, cfg: QueueConfig, deadline: Instant) -> Result<SyncQueue> {
        let entries = cfg.entries;
        let qid = cfg.qid;
        let mut q = SyncQueue {
            stream,
            queue: HostQueue::new(cfg),
            free_tags: (0..entries).rev().collect(),
            done: VecDeque::new(),
            next_token: 1,
            generated: None,
        };
        while !matches!(q.queue.state(), QueueState::Live | QueueState::Authenticating) {
            if q.queue.state() == QueueState::Failed {
                let why = q.queue.error().unwrap_or("failed").to_string();
                return Err(Error::new(ErrorKind::Protocol, format!("queue {qid} bring-up: {why}")));
            }
            q.pump(deadline)?;
        }
        Ok(q)
    }

    /// The queue state machine.
    pub fn queue(&self) -> &HostQueue {
        &self.queue
    }

    /// The queue state machine, to drive it past a step (tests of the target's
    /// authentication pretend to have authenticated).
    pub fn queue_mut(&mut self) -> &mut HostQueue {
        &mut self.queue
    }

    /// A connected queue's socket and state machine (split by [`SyncQueue::into_parts`])
    /// driven blocking again: a parked I/O queue's re-authentication. Nothing may be
    /// outstanding on it.
    pub fn from_parts(stream: TcpStream, queue: HostQueue) -> SyncQueue {
        let entries = queue.entries();
        SyncQueue {
            stream,
            queue,
            free_tags: (0..entries).rev().collect(),
            done: VecDeque::new(),
            next_token: 1,
            generated: None,
        }
    }

    /// The TLS PSK the admin queue's concatenating transaction generated at its handshake
    /// (a queue made with [`QueueConfig::concat`]), once.
    pub fn take_generated_psk(&mut self) -> Option<tls::psk::RetainedPsk> {
        self.generated.take()
    }

    /// Splits into the socket and the live queue (to hand to a context).
    pub fn into_parts(self) -> (TcpStream, HostQueue) {
        (self.stream, self.queue)
    }

    fn flush(&mut self) -> Result<()> {
        // Kernel TLS: a blocking queue has nothing in flight between its calls.
        if let Some(h) = self.queue.kernel_tls_handover() {
            self.queue.kernel_tls_installed(tls::kernel::install(self.stream.as_fd(), &h));
        }
        while let Some(msg) = self.queue.take_send() {
            let bytes = msg.to_vec();
            let r = self.stream.write_all(&bytes);
            self.queue
                .on_send_done(msg, r.as_ref().map(|_| ()).map_err(|e| std::io::Error::new(e.kind(), e.to_string())));
            r.map_err(|e| Error::io("send", &e))?;
        }
        Ok(())
    }

    /// Sends what is queued and receives once (until `deadline`); collects completions.
    pub fn pump(&mut self, deadline: Instant) -> Result<()> {
        self.flush()?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(ErrorKind::Timeout, format!("queue {}: no answer in time", self.queue.qid())));
        }
        self.stream
            .set_read_timeout(Some(left.min(Duration::from_millis(100))))
            .map_err(|e| Error::io("timeout", &e))?;
        let Some((mut buf, range)) = self.queue.take_recv_buf() else {
            return Err(Error::new(ErrorKind::Protocol, self.queue.error().unwrap_or("queue failed").to_string()));
        };
        match self.stream.read(&mut buf.as_full_mut()[range]) {
            Ok(n) => self.queue.on_recv(buf, n),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                self.queue.on_recv_none(buf);
            }
            Err(e) => {
                self.queue.on_recv_none(buf);
                let why = self.queue.recv_error_text(&e);
                self.queue.set_failed(&why);
                return Err(Error::io("recv", &e));
            }
        }
        self.done.extend(self.queue.completions().drain(..));
        self.flush()
    }

    /// Submits without waiting; returns the token.
    pub fn submit(&mut self, mut io: Io) -> Result<u64> {
        let tag = self.free_tags.pop().ok_or_else(|| Error::new(ErrorKind::Busy, "no free command id"))?;
        let token = self.next_token;
        self.next_token += 1;
        io.token = token;
        if let Err((e, _)) = self.queue.submit(tag, io) {
            self.free_tags.push(tag);
            return Err(Error::new(ErrorKind::Protocol, format!("submit: {e}")));
        }
        self.flush()?;
        Ok(token)
    }

    /// Takes a completion with this token if it arrived.
    pub fn take(&mut self, token: u64) -> Option<Done> {
        let i = self.done.iter().position(|d| d.token == token)?;
        let d = self.done.remove(i)?;
        self.free_tags.push(d.tag);
        Some(d)
    }

    /// Takes any completion that arrived (e.g. an AER).
    pub fn take_any(&mut self) -> Option<Done> {
        let d = self.done.pop_front()?;
        self.free_tags.push(d.tag);
        Some(d)
    }

    /// Submits and waits for the completion.
    pub fn execute(&mut self, io: Io, timeout: Duration) -> Result<Done> {
        let token = self.submit(io)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self.take(token) {
                return Ok(d);
            }
            if self.queue.state() == QueueState::Failed {
                return Err(Error::new(ErrorKind::Io, self.queue.error().unwrap_or("queue failed").to_string()));
            }
            self.pump(deadline)?;
        }
    }

    /// Executes a command without data; fails on an error status.
    pub fn command(&mut self, sqe: nvme::Sqe, timeout: Duration) -> Result<nvme::Cqe> {
        let d = self.execute(Io { sqe, buf: None, len: 0, dir: DataDir::None, token: 0 }, timeout)?;
        if !d.cqe.status.is_success() {
            return Err(Error::status(format!("opcode {:#04x}", sqe.opcode()), d.cqe.status));
        }
        Ok(d.cqe)
    }

    /// Sets the socket's read timeout for [`SyncQueue::pump`]-driven loops.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}
