//! A connection's secure channel ([`crate::tls`]): the few places where the queue's bytes
//! pass through TLS. The queue keeps its own plaintext receive buffer and send batches; the
//! channel receives ciphertext, opens records into that buffer as the queue makes room, and
//! seals the queue's batches as they are sent.
//!
//! ```text
//!   take_recv_buf ─► channel's ciphertext buffer      queue_input ─► tls_input ─► handshake | tls_fill
//!   process_input ─► parse ─► tls_fill (open more records into the room parsing made)
//!   take_send ─► channel.take_send(queue's batch)      on_send_done ─► the batch back once sent
//!   driver, nothing in flight ─► kernel_tls_handover ─► tls::kernel::install ─► kernel_tls_installed
//!     └─ Link::Kernel: the queue's bytes pass as on a plaintext connection
//! ```

use nvme::Status;
use tls::kernel::{Handover, InstallError, RecordPath};
use uring::{IoBuf, SendMsg};

use super::{ConnCtx, ConnState, Connection};
use crate::fabrics::ConnectError;
use crate::tls::{KernelLink, Link, TLS_HANDSHAKE};

/// Said once per process: the kernel has no `tls` ULP, so TLS connections keep their
/// records in user space (each connection would say the same).
static NO_ULP_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Connection {
    /// Whether the channel has a send in flight.
    pub(super) fn tls_send_in_flight(&self) -> bool {
        matches!(&self.tls, Some(Link::Tls(ch)) if ch.send_in_flight())
    }

    /// Whether the channel has bytes to send (handshake, alert, the rest of a batch).
    pub(super) fn tls_has_output(&self) -> bool {
        matches!(&self.tls, Some(Link::Tls(ch)) if ch.has_output())
    }

    /// The connection's first bytes decide, on a port that takes TLS: a handshake record
    /// starts the channel; anything else is plaintext NVMe/TCP where the port allows it.
    pub(super) fn tls_sniff(&mut self, now_ns: u64) {
        let Some(first) = self.rx.as_ref().and_then(|b| b.get(self.rx_pos).copied()) else { return };
        let required = matches!(self.tls, Some(Link::Require));
        if first != TLS_HANDSHAKE {
            self.tls = None;
            if required {
                tracing::info!(port = self.port.id, peer = ?self.peer, "plaintext NVMe/TCP on a port that requires TLS: closed");
                self.rx_pending = false;
                self.close("plaintext NVMe/TCP on a port that requires TLS");
            }
            return;
        }
        let mut ch = match crate::tls::channel(&self.target) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(port = self.port.id, "TLS unavailable: {e}");
                self.tls = None;
                self.rx_pending = false;
                self.close(&format!("TLS unavailable: {e}"));
                return;
            }
        };
        if let Some(mut buf) = self.rx.take() {
            tls::channel::feed(&mut ch, &buf[self.rx_pos..]);
            buf.set_len(0);
            self.rx_pos = 0;
            self.rx = Some(buf);
        }
        self.rx_pending = false;
        self.tls = Some(Link::Tls(Box::new(ch)));
        self.tls_after_input(now_ns);
    }

    /// Ciphertext arrived (`n` bytes at the end of `buf`; 0: the peer closed).
    pub(super) fn tls_input(&mut self, buf: IoBuf, n: usize, now_ns: u64) {
        let Some(Link::Tls(ch)) = self.tls.as_mut() else { return };
        ch.on_recv(buf, n);
        if n == 0 {
            self.close("peer closed the connection");
            return;
        }
        self.traffic_ms = now_ns / 1_000_000;
        self.tls_after_input(now_ns);
    }

    fn tls_after_input(&mut self, now_ns: u64) {
        let Some(Link::Tls(ch)) = &self.tls else { return };
        if let Some(e) = ch.error() {
            let why = format!("TLS: {e}");
            tracing::info!(port = self.port.id, peer = ?self.peer, "{why}");
            self.close(&why);
            return;
        }
        if ch.is_open() {
            let mut sc = self.info.secure_channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if sc.is_none() {
                let what = crate::tls::describe(RecordPath::User, ch.suite());
                if let Some(id) = ch.identity() {
                    tracing::debug!(port = self.port.id, peer = ?self.peer, identity = %id, "TLS channel open: {what}");
                }
                *sc = Some(what);
            }
        }
        if !self.rx_pending {
            self.rx_ns = now_ns;
        }
        self.tls_fill();
    }

    /// Opens the records received so far into the queue's receive buffer, as far as it has
    /// room; the queue parses them on its next turn.
    pub(super) fn tls_fill(&mut self) {
        if self.rx_paused || !matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live) {
            return;
        }
        let Some(Link::Tls(ch)) = self.tls.as_mut() else { return };
        if !ch.has_plaintext() {
            return;
        }
        let Some(mut buf) = self.rx.take() else { return };
        let cap = buf.capacity();
        buf.compact(&mut self.rx_pos, cap / 2);
        let start = buf.len();
        let n = ch.read(&mut buf.as_full_mut()[start..]);
        buf.set_len(start + n);
        let failed = ch.error().map(|e| format!("TLS: {e}"));
        self.rx = Some(buf);
        if n > 0 {
            self.rx_pending = true;
        }
        if let Some(why) = failed {
            tracing::info!(port = self.port.id, peer = ?self.peer, "{why}");
            self.close(&why);
        }
    }

    /// The next ciphertext to send: the channel's own bytes, then the queue's batches sealed.
    pub(super) fn tls_take_send(&mut self) -> Option<SendMsg> {
        if self.state == ConnState::Closed {
            return None;
        }
        let Some(Link::Tls(mut ch)) = self.tls.take() else { return None };
        let r = ch.take_send(|| self.take_plain_send());
        self.tls = Some(Link::Tls(ch));
        match r {
            Ok(m) => m,
            Err(e) => {
                self.close(&format!("TLS: {e}"));
                None
            }
        }
    }

    /// A ciphertext send finished: once the queue's whole batch is out, the queue hears of it.
    pub(super) fn tls_send_done(&mut self, msg: SendMsg, result: std::io::Result<()>, ctx: &mut ConnCtx<'_>) {
        let Some(Link::Tls(ch)) = self.tls.as_mut() else { return };
        let err = result.as_ref().err().map(ToString::to_string);
        match ch.on_send_done(msg, result) {
            Some((batch, res)) => self.plain_send_done(batch, res, ctx),
            None => {
                if let Some(e) = err {
                    self.close(&format!("send failed: {e}"));
                    self.set_state(ConnState::Closed);
                    return;
                }
            }
        }
        if self.state == ConnState::Closing && !self.tx_pending() && !self.tx_inflight && !self.tls_send_in_flight() {
            self.set_state(ConnState::Closed);
        }
    }

    /// The PSK identity of the TLS channel the queue runs in, if it does.
    pub(super) fn tls_identity(&self) -> Option<&tls::psk::Identity> {
        match &self.tls {
            Some(Link::Tls(ch)) => ch.identity(),
            Some(Link::Kernel(k)) => Some(&k.identity),
            _ => None,
        }
    }

    /// Inside a TLS channel the Connect must be the identity's host and subsystem.
    pub(super) fn tls_connect_check(&self, data: &[u8]) -> Option<ConnectError> {
        let id = self.tls_identity()?;
        // A Connect whose data does not decode is refused by `fabrics::connect` itself.
        let d = nvme::fabrics::ConnectData::decode(data).ok()?;
        let why = crate::tls::connect_mismatch(id, &d.hostnqn, &d.subnqn)?;
        tracing::info!(port = self.port.id, peer = ?self.peer, "{why}: refused");
        Some(ConnectError { status: Status::CONNECT_INVALID_HOST, dw0: 0 })
    }

    // ---------------------------------------------------------- kernel TLS

    /// The keys for the kernel to take this connection's records over, when the port wants
    /// kernel TLS and the channel stands at a record boundary both ways. The driver calls it
    /// with no receive or send in flight on the socket, installs the keys
    /// ([`tls::kernel::install`]) and reports with [`Connection::kernel_tls_installed`].
    pub fn kernel_tls_handover(&self) -> Option<Handover> {
        if !self.kernel_tls_wanted
            || !matches!(self.state, ConnState::AwaitIcReq | ConnState::AwaitConnect | ConnState::Live)
        {
            return None;
        }
        match &self.tls {
            Some(Link::Tls(ch)) if ch.error().is_none() => ch.kernel_handover(),
            _ => None,
        }
    }

    /// What the kernel made of [`Connection::kernel_tls_handover`]'s keys: it seals and opens
    /// the records from now on, or they stay here (said in the log), or the socket is left
    /// half-handed over and the connection closes.
    pub fn kernel_tls_installed(&mut self, result: Result<(), InstallError>) {
        self.kernel_tls_wanted = false;
        let (port, peer) = (self.port.id, self.peer);
        match result {
            Ok(()) => {
                let Some(Link::Tls(ch)) = self.tls.take() else { return };
                let (Some(identity), suite) = (ch.identity().cloned(), ch.suite()) else {
                    self.tls = Some(Link::Tls(ch));
                    return;
                };
                let what = crate::tls::describe(RecordPath::Kernel, suite);
                tracing::debug!(port, ?peer, identity = %identity, "TLS records handed to the kernel: {what}");
                *self.info.secure_channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(what);
                self.tls = suite.map(|suite| Link::Kernel(Box::new(KernelLink { identity, suite })));
            }
            Err(e) if e.no_ulp() => {
                if !NO_ULP_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(port, "TLS records stay in user space: {e}");
                }
            }
            Err(e) if e.untouched() => {
                tracing::warn!(port, ?peer, "TLS records of this connection stay in user space: {e}");
            }
            Err(e) => {
                let why = format!("kernel TLS: {e}");
                tracing::warn!(port, ?peer, "{why}: connection closed");
                self.close(&why);
            }
        }
    }

    /// Whether the kernel seals and opens this connection's records.
    pub fn kernel_tls(&self) -> bool {
        matches!(self.tls, Some(Link::Kernel(_)))
    }

    /// A receive on the kernel-TLS socket failed with EIO: the host sent a TLS control
    /// record (an alert such as close_notify, or a KeyUpdate), which the kernel hands only to
    /// a receive that asks for the record type. NVMe/TCP has nothing to say after it: closed.
    pub fn kernel_tls_control_record(&mut self) {
        let why = "the host sent a TLS control record (an alert or a KeyUpdate) on a kernel TLS connection";
        tracing::info!(port = self.port.id, peer = ?self.peer, "{why}: connection closed");
        self.close(why);
    }
}
