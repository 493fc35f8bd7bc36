//! A host queue's secure channel ([`crate::tls`]): where its bytes pass through TLS. The
//! queue keeps its receive buffer and send batches; the channel receives ciphertext, opens
//! records into the receive buffer (then the queue parses them) and seals the queue's
//! batches as they are sent. Large reads are not received straight into the command's
//! buffer on a TLS queue: records are opened into the receive buffer first.

use uring::{IoBuf, SendMsg};

use super::{HostQueue, QueueState};

impl HostQueue {
    /// Ciphertext arrived (`n` bytes after the buffer's length; 0: the controller closed).
    pub(super) fn tls_recv(&mut self, buf: IoBuf, n: usize) {
        let Some(ch) = self.tls.as_mut() else { return };
        ch.on_recv(buf, n);
        if n == 0 {
            self.fail("connection closed by the controller".into());
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
            let Some(ch) = self.tls.as_mut() else { return };
            if self.state == QueueState::Failed || !ch.has_plaintext() {
                return;
            }
            let Some(mut buf) = self.rx.take() else { return };
            let end = buf.len();
            if self.rx_pos == end {
                self.rx_pos = 0;
                buf.set_len(0);
            } else if self.rx_pos > 0 && buf.capacity() - end < buf.capacity() / 2 {
                let pos = self.rx_pos;
                buf.as_full_mut().copy_within(pos..end, 0);
                buf.set_len(end - pos);
                self.rx_pos = 0;
            }
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
