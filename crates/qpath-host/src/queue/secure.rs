//! A host queue's secure channel ([`crate::tls`]): where its bytes pass through TLS. The
//! queue keeps its receive buffer and send batches; the channel receives ciphertext, opens
//! records into the receive buffer (then the queue parses them) and seals the queue's
//! batches as they are sent. A large C2H payload is opened straight into the command's
//! buffer once nothing of it waits in the receive buffer (as the plaintext queue receives
//! it there), so its bytes are written once, by the cipher.

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

    /// The channel's cipher suite and path once open (statistics), if the queue has one.
    pub fn secure_channel(&self) -> Option<String> {
        let ch = self.tls.as_ref()?;
        let suite = ch.suite()?;
        Some(format!("{} {}", tls::kernel::RecordPath::User.name(), suite.name()))
    }
}
