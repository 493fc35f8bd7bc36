//! A host queue's secure channel ([`crate::tls`]): where its bytes pass through TLS. The
//! queue keeps its receive buffer and send batches; the channel receives ciphertext, opens
//! records into the receive buffer (then the queue parses them) and seals the queue's
//! batches as they are sent. A large C2H payload is opened straight into the command's
//! buffer once nothing of it waits in the receive buffer (as the plaintext queue receives
//! it there), so its bytes are written once, by the cipher.

use tls::kernel::{Handover, InstallError, RecordPath};
use uring::{IoBuf, SendMsg};

use super::{DIRECT_RECV_MIN, HostQueue, QueueState, RxPdu};

impl HostQueue {
    /// Ciphertext arrived (`n` bytes after the buffer's length; 0: the controller closed).
    pub(super) fn tls_recv(&mut self, buf: IoBuf, n: usize) {
        let Some(ch) = self.tls.as_mut() else { return };
        ch.on_recv(buf, n);
        if n == 0 {
            // A controller that finds no PSK for the identity (Linux's tlshd) closes without
            // an alert: say that the handshake is where it happened.
            let why = if ch.is_open() {
                "connection closed by the controller".to_string()
            } else {
                "TLS handshake: the controller closed the connection before the handshake finished \
                 (it holds no PSK for this host and subsystem, or another one)"
                    .to_string()
            };
            self.fail(why);
            return;
        }
        if let Some(e) = ch.error() {
            let why = format!("TLS: {e}");
            self.fail(why);
            return;
        }
        self.tls_read();
    }

    /// Opens received records into the receive buffer and parses them, until no whole
    /// record is left.
    fn tls_read(&mut self) {
        loop {
            let Some(ch) = self.tls.as_ref() else { return };
            if self.state == QueueState::Failed || !ch.has_plaintext() {
                return;
            }
            if self.tls_read_direct() {
                continue;
            }
            let Some(ch) = self.tls.as_mut() else { return };
            let Some(mut buf) = self.rx.take() else { return };
            let cap = buf.capacity();
            buf.compact(&mut self.rx_pos, cap / 2);
            let start = buf.len();
            let n = ch.read(&mut buf.as_full_mut()[start..]);
            buf.set_len(start + n);
            let err = ch.error().map(|e| format!("TLS: {e}"));
            if n > 0 {
                self.process(&buf);
            }
            self.rx = Some(buf);
            if let Some(why) = err {
                self.fail(why);
                return;
            }
            if n == 0 {
                return;
            }
        }
    }

    /// Opens records straight into the command's buffer when the bytes due next are a large
    /// C2H payload and none of it waits in the receive buffer; whether it moved any.
    fn tls_read_direct(&mut self) -> bool {
        let (RxPdu::C2H { tag, offset, .. }, Some(remaining)) = (self.rx_pdu, self.framer.data_remaining()) else {
            return false;
        };
        if remaining < DIRECT_RECV_MIN || self.rx.as_ref().is_none_or(|rx| self.rx_pos != rx.len()) {
            return false;
        }
        let (Some(ch), Some(s)) = (self.tls.as_mut(), self.slots.get_mut(usize::from(tag))) else { return false };
        let start = offset as usize;
        let Some(end) = start.checked_add(remaining) else { return false };
        let Some(b) = s.buf.as_mut().filter(|b| !s.buf_in_flight && end <= b.capacity()) else { return false };
        let n = ch.read(&mut b.as_full_mut()[start..end]);
        if let Some(e) = ch.error() {
            let why = format!("TLS: {e}");
            self.fail(why);
            return false;
        }
        if n == 0 {
            return false;
        }
        self.data_placed(n);
        true
    }

    /// The next ciphertext to send: handshake bytes, then the queue's batches sealed.
    pub(super) fn tls_take_send(&mut self) -> Option<SendMsg> {
        let mut ch = self.tls.take()?;
        let r = ch.take_send(|| self.take_plain_send());
        self.tls = Some(ch);
        match r {
            Ok(m) => m,
            Err(e) => {
                self.fail(format!("TLS: {e}"));
                None
            }
        }
    }

    /// A ciphertext send finished: the queue's batch comes back once all of it is out.
    pub(super) fn tls_send_done(&mut self, msg: SendMsg, result: std::io::Result<()>) {
        let Some(ch) = self.tls.as_mut() else { return };
        let err = result.as_ref().err().map(ToString::to_string);
        match ch.on_send_done(msg, result) {
            Some((batch, res)) => self.plain_send_done(batch, res),
            None => {
                if let Some(e) = err {
                    self.fail(format!("send failed: {e}"));
                }
            }
        }
    }

    /// The channel's record path and cipher suite once open (statistics), if the queue has
    /// one: "tls1.3-user TLS_AES_128_GCM_SHA256", "tls1.3-kernel ..." once the kernel has it.
    pub fn secure_channel(&self) -> Option<String> {
        self.secure_channel_parts().map(|s| s.to_string())
    }

    /// [`HostQueue::secure_channel`] as static parts (statistics publish it without allocating).
    pub fn secure_channel_parts(&self) -> Option<crate::stats::SecureChannel> {
        let (path, suite) = match (self.kernel_tls, self.tls.as_ref()) {
            (Some(suite), _) => (RecordPath::Kernel, suite),
            (None, Some(ch)) => (RecordPath::User, ch.suite()?),
            (None, None) => return None,
        };
        Some(crate::stats::SecureChannel { record_path: path.name(), suite: suite.name() })
    }

    /// The keys for the kernel to take this queue's records over, when the queue wants
    /// kernel TLS and its channel stands at a record boundary both ways. The driver calls it
    /// with no receive or send in flight on the socket, installs the keys
    /// ([`tls::kernel::install`]) and reports with [`HostQueue::kernel_tls_installed`].
    pub fn kernel_tls_handover(&self) -> Option<Handover> {
        if !self.kernel_tls_wanted || self.state == QueueState::Failed {
            return None;
        }
        let ch = self.tls.as_ref().filter(|ch| ch.error().is_none())?;
        ch.kernel_handover()
    }

    /// What the kernel made of [`HostQueue::kernel_tls_handover`]'s keys: it seals and opens
    /// the records from now on (the queue's bytes pass as on a plaintext connection), or
    /// they stay here (said in the log), or the socket is half handed over and the queue fails.
    pub fn kernel_tls_installed(&mut self, result: Result<(), InstallError>) {
        self.kernel_tls_wanted = false;
        let qid = self.cfg.qid.0;
        match result {
            Ok(()) => {
                let suite = self.tls.as_ref().and_then(|ch| ch.suite());
                if let Some(suite) = suite {
                    self.tls = None;
                    self.kernel_tls = Some(suite);
                    tracing::debug!(qid, suite = suite.name(), "TLS records handed to the kernel");
                }
            }
            Err(e) if e.no_ulp() => {
                if !NO_ULP_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!("TLS records stay in user space: {e}");
                }
            }
            Err(e) if e.untouched() => {
                tracing::warn!(qid, "TLS records of this queue stay in user space: {e}");
            }
            Err(e) => self.fail(format!("kernel TLS: {e}")),
        }
    }

    /// Whether the kernel seals and opens this queue's records.
    pub fn kernel_tls(&self) -> bool {
        self.kernel_tls.is_some()
    }

    /// Why a receive failed, in words: EIO on a kernel-TLS socket is a TLS control record
    /// from the controller (an alert or a KeyUpdate), which a plain receive cannot take.
    pub fn recv_error_text(&self, e: &std::io::Error) -> String {
        if self.kernel_tls() && tls::kernel::control_record(e) {
            "recv: the controller sent a TLS control record (an alert or a KeyUpdate) on a kernel TLS connection"
                .to_string()
        } else {
            format!("recv: {e}")
        }
    }
}

/// Said once per process: the kernel has no `tls` ULP, so TLS queues keep their records in
/// user space (each queue would say the same).
static NO_ULP_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
