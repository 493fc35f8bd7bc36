//! [`Channel`]: the secure channel of one NVMe/TCP connection, sans-I/O. It sits between the
//! socket driver and the NVMe/TCP queue's state machine (the target's connection, the host's
//! queue), which keeps its own plaintext buffers:
//!
//! ```text
//!   driver recv ─► take_recv_buf/on_recv ─► handshake (OpenSSL) | records ─► read(dst) ─► queue's rx buffer
//!   driver send ◄─ take_send(queue's batch) ◄─ handshake output, alerts, sealed records
//!                  on_send_done ─► the queue's batch back once all of it is on the wire
//! ```
//!
//! Limits: a record is checked from its 5-byte header before anything else is read (type,
//! version, length ≤ 2^14 + 256); the receive buffer holds whole records and is never lent
//! out while one waits to be read, so a peer cannot make it grow or the queue read ahead of
//! what it parses; a send seals at most [`SEAL_CHUNK`] bytes of the queue's batch, one send
//! in flight. After warm-up nothing is allocated per record.

use std::ops::Range;

use uring::{IoBuf, Piece, SendMsg};

use crate::Error;
use crate::handshake::{ClientConfig, Handshake, Progress, ServerConfig};
use crate::kernel::{CryptoInfo, Handover};
use crate::psk::{Identity, TlsPsk};
use crate::record::{self, CIPHERTEXT_MAX, HEADER_LEN, Keys, OVERHEAD, PLAINTEXT_MAX, Suite, alert, content};

/// Most plaintext one send carries (eight full records: a 128 KiB read's payload and its
/// headers in one send, as the plaintext queue sends it).
pub const SEAL_CHUNK: usize = 8 * PLAINTEXT_MAX + 4096;

/// Receive buffer: eight full records (one receive takes a 128 KiB payload).
const RX_CAPACITY: usize = (8 * (HEADER_LEN + CIPHERTEXT_MAX)).next_multiple_of(uring::IO_ALIGN);

/// Most records one send's chunk is sealed into: each record but the last is full or ends
/// where a piece of at least 2^14 bytes begins ([`seal_range`]), and a chunk holds at most
/// `SEAL_CHUNK / 2^14` (rounded up) of either.
const TX_RECORDS_MAX: usize = 2 * SEAL_CHUNK.div_ceil(PLAINTEXT_MAX) + 1;

/// Ciphertext of one send: a chunk and the overhead of its records.
const TX_CAPACITY: usize = (SEAL_CHUNK + TX_RECORDS_MAX * OVERHEAD).next_multiple_of(uring::IO_ALIGN);

/// Handshake message types handled after the handshake (RFC 8446 §4).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Lifecycle of the channel.
#[derive(Debug)]
enum State {
    /// The TLS handshake runs; nothing of the queue is sent or received.
    Handshake(Box<Handshake>),
    /// Records flow.
    Open,
    /// A fatal error (its alert may wait to be sent); nothing more is read.
    Failed,
}

/// Counters a queue reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChannelStats {
    /// Records sealed and sent.
    pub records_sealed: u64,
    /// Records received and opened.
    pub records_opened: u64,
    /// KeyUpdates received.
    pub key_updates: u64,
}

/// The secure channel of one connection.
pub struct Channel {
    state: State,
    rx: Option<IoBuf>,
    /// Start of the ciphertext not yet opened.
    rx_pos: usize,
    /// Content of a record opened in place that did not fit its destination, still to read.
    plain: Range<usize>,
    /// Handshake output, alerts and KeyUpdates, sent before the next records.
    ctrl: Vec<u8>,
    tx_buf: Option<IoBuf>,
    tx_spare: Option<SendMsg>,
    tx_inflight: bool,
    /// The queue's batch being sealed and sent, and how far.
    batch: Option<SendMsg>,
    batch_off: usize,
    seal: Option<Keys>,
    open: Option<Keys>,
    suite: Option<Suite>,
    identity: Option<Identity>,
    error: Option<String>,
    peer_closed: bool,
    /// A close_notify or fatal alert is queued: no records after it.
    alert_sent: bool,
    stats: ChannelStats,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("state", &self.state)
            .field("suite", &self.suite)
            .field("identity", &self.identity)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Channel {
    fn new(hs: Handshake) -> Channel {
        let mut c = Channel::new_open();
        c.state = State::Handshake(Box::new(hs));
        c.pull_handshake_output();
        c
    }

    /// A target's channel on an accepted connection: waits for the ClientHello.
    pub fn server(cfg: &ServerConfig) -> Result<Channel, Error> {
        Ok(Channel::new(Handshake::server(cfg)?))
    }

    /// A host's channel: its ClientHello is queued at once.
    pub fn client(cfg: &ClientConfig, identity: Identity, psk: TlsPsk) -> Result<Channel, Error> {
        Ok(Channel::new(Handshake::client(cfg, identity, psk)?))
    }

    fn pull_handshake_output(&mut self) {
        if let State::Handshake(hs) = &mut self.state
            && hs.has_output()
        {
            self.ctrl.extend_from_slice(&hs.take_output());
        }
    }

    /// A channel already open with these keys, as if a handshake had made them (fuzzing
    /// and tests of the record layer: no handshake per case).
    pub fn from_keys(seal: Keys, open: Keys, identity: Identity) -> Channel {
        let mut c = Channel::new_open();
        c.suite = Some(seal.suite());
        c.seal = Some(seal);
        c.open = Some(open);
        c.identity = Some(identity);
        c
    }

    fn new_open() -> Channel {
        Channel {
            state: State::Open,
            rx: Some(IoBuf::new(RX_CAPACITY)),
            rx_pos: 0,
            plain: 0..0,
            ctrl: Vec::new(),
            tx_buf: Some(IoBuf::new(TX_CAPACITY)),
            tx_spare: Some(SendMsg::with_capacity(1024, 2)),
            tx_inflight: false,
            batch: None,
            batch_off: 0,
            seal: None,
            open: None,
            suite: None,
            identity: None,
            error: None,
            peer_closed: false,
            alert_sent: false,
            stats: ChannelStats::default(),
        }
    }

    /// Whether the handshake is done and records flow.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open)
    }

    /// Why the channel failed, if it did (no secret in it).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The peer closed (end of stream or close_notify).
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The negotiated cipher suite, once open.
    pub fn suite(&self) -> Option<Suite> {
        self.suite
    }

    /// The PSK identity the connection was made with, once open.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Counters.
    pub fn stats(&self) -> ChannelStats {
        self.stats
    }

    fn fail(&mut self, why: String, alert: Option<u8>) {
        if self.error.is_some() {
            return;
        }
        tracing::debug!("TLS channel failed: {why}");
        self.error = Some(why);
        if let (Some(a), false) = (alert, self.alert_sent) {
            self.queue_alert(a);
        }
        self.state = State::Failed;
    }

    /// Queues an alert (fatal, or close_notify), protected once the handshake is done.
    fn queue_alert(&mut self, description: u8) {
        let level = if description == alert::CLOSE_NOTIFY { 1 } else { 2 };
        if let Some(keys) = self.seal.as_mut() {
            // An alert that cannot be sealed is dropped: the connection closes anyway.
            let _ = record::seal_bytes(keys, content::ALERT, &[level, description], &mut self.ctrl);
        }
        self.alert_sent = true;
    }

    /// Sends close_notify after whatever is queued (an orderly close).
    pub fn close_notify(&mut self) {
        if self.is_open() && !self.alert_sent {
            self.queue_alert(alert::CLOSE_NOTIFY);
        }
    }

    // --------------------------------------------------------------- receive

    fn record_ready(&self) -> Option<usize> {
        let rx = self.rx.as_ref()?;
        let avail = &rx[self.rx_pos..];
        let h: &[u8; HEADER_LEN] = avail.get(..HEADER_LEN)?.try_into().ok()?;
        let len = record::parse_header(h).map_or(0, |l| l);
        // A bad header is "ready" too: reading it fails the channel.
        (avail.len() >= HEADER_LEN + len || len == 0).then_some(HEADER_LEN + len)
    }

    /// Whether plaintext (or a record to open) waits for [`Channel::read`].
    pub fn has_plaintext(&self) -> bool {
        self.is_open() && (!self.plain.is_empty() || self.record_ready().is_some())
    }

    /// The buffer to receive ciphertext into, while the channel wants some: not while a
    /// whole record waits to be read (the queue reads first), nor once failed.
    pub fn take_recv_buf(&mut self) -> Option<(IoBuf, Range<usize>)> {
        if matches!(self.state, State::Failed) || self.peer_closed || self.has_plaintext() {
            return None;
        }
        let mut buf = self.rx.take()?;
        // Compact so a whole record always fits after the unread part.
        if buf.compact(&mut self.rx_pos, HEADER_LEN + CIPHERTEXT_MAX) {
            self.plain = 0..0;
        }
        let start = buf.len();
        let cap = buf.capacity();
        Some((buf, start..cap))
    }

    /// The receive buffer came back without data (a cancelled receive).
    pub fn on_recv_none(&mut self, buf: IoBuf) {
        self.rx = Some(buf);
    }

    /// `n` bytes were received after the buffer's length (0: the peer closed). During the
    /// handshake they go to OpenSSL at once; afterwards [`Channel::read`] opens them.
    pub fn on_recv(&mut self, mut buf: IoBuf, n: usize) {
        if n == 0 {
            self.rx = Some(buf);
            self.peer_closed = true;
            if !self.is_open() && self.error.is_none() {
                self.error = Some("the peer closed the connection during the TLS handshake".into());
                self.state = State::Failed;
            }
            return;
        }
        let len = (buf.len() + n).min(buf.capacity());
        buf.set_len(len);
        self.rx = Some(buf);
        if let State::Handshake(_) = self.state {
            self.handshake_input();
        }
    }

    fn handshake_input(&mut self) {
        let Some(mut buf) = self.rx.take() else { return };
        let input = &buf[self.rx_pos..];
        let State::Handshake(hs) = &mut self.state else {
            self.rx = Some(buf);
            return;
        };
        let result = hs.step(input);
        self.rx_pos = buf.len();
        self.pull_handshake_output();
        match result {
            Ok(Progress::NeedInput) => {}
            Ok(Progress::Done(est)) => {
                let est = *est;
                tracing::debug!(identity = %est.identity, suite = est.suite.name(), "TLS handshake done");
                // What came after the handshake is records: it goes to the front.
                buf.set_len(0);
                self.rx_pos = 0;
                if est.leftover.len() <= buf.capacity() {
                    buf.extend_from_slice(&est.leftover);
                }
                self.suite = Some(est.suite);
                self.identity = Some(est.identity);
                self.seal = Some(est.seal);
                self.open = Some(est.open);
                self.state = State::Open;
            }
            Err(e) => {
                // OpenSSL queued its own alert (in the output taken above).
                self.alert_sent = true;
                self.fail(format!("TLS handshake failed: {e}"), None);
            }
        }
        self.rx = Some(buf);
    }

    /// Opens buffered records into `dst`, up to its length; returns the content bytes
    /// written. Alerts, KeyUpdates and session tickets are handled here; an error fails the
    /// channel (its alert is queued) and is reported by [`Channel::error`].
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let mut written = 0;
        while written < dst.len() && self.is_open() {
            if !self.plain.is_empty() {
                let Some(rx) = self.rx.as_ref() else { break };
                let n = self.plain.len().min(dst.len() - written);
                dst[written..written + n].copy_from_slice(&rx[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                written += n;
                continue;
            }
            let Some(len) = self.record_ready() else { break };
            match self.open_one(len, &mut dst[written..]) {
                Ok(n) => written += n,
                Err(e) => {
                    let a = e.alert();
                    self.fail(e.to_string(), a.or(Some(alert::INTERNAL_ERROR)));
                    break;
                }
            }
        }
        written
    }

    /// Opens the record of `len` bytes at `rx_pos`: application data straight into `dst`
    /// when it fits (else in place, the rest kept in `plain`); returns the bytes given.
    fn open_one(&mut self, len: usize, dst: &mut [u8]) -> Result<usize, Error> {
        let (Some(rx), Some(keys)) = (self.rx.as_mut(), self.open.as_mut()) else { return Ok(0) };
        let h: [u8; HEADER_LEN] = rx[self.rx_pos..self.rx_pos + HEADER_LEN].try_into().unwrap_or([0; HEADER_LEN]);
        let body = record::parse_header(&h)?;
        debug_assert_eq!(body + HEADER_LEN, len, "record_ready measured this record");
        let start = self.rx_pos;
        let rec = &mut rx.as_full_mut()[start..start + len];
        let inner = body - record::TAG_LEN;
        let direct = inner <= dst.len();
        let (ty, n) = record::open(keys, rec, if direct { Some(dst) } else { None })?;
        self.rx_pos += len;
        self.stats.records_opened += 1;
        match ty {
            content::APPLICATION_DATA if direct => Ok(n),
            content::APPLICATION_DATA => {
                let at = start + HEADER_LEN;
                let first = dst.len().min(n);
                dst[..first].copy_from_slice(&rx[at..at + first]);
                self.plain = at + first..at + n;
                Ok(first)
            }
            content::ALERT => {
                let msg: [u8; 2] = if direct {
                    dst.get(..2).and_then(|d| d.try_into().ok()).unwrap_or([0; 2])
                } else {
                    rx[start + HEADER_LEN..].get(..2).and_then(|d| d.try_into().ok()).unwrap_or([0; 2])
                };
                self.on_alert(n, msg)?;
                Ok(0)
            }
            content::HANDSHAKE => {
                let at = start + HEADER_LEN;
                let mut m = [0u8; 5];
                let src = if direct { &dst[..n.min(5)] } else { &rx[at..at + n.min(5)] };
                m[..src.len()].copy_from_slice(src);
                self.on_post_handshake(n, m)?;
                Ok(0)
            }
            _ => Err(Error::record(
                alert::UNEXPECTED_MESSAGE,
                format!("a record of content type {ty} after the handshake"),
            )),
        }
    }

    fn on_alert(&mut self, n: usize, msg: [u8; 2]) -> Result<(), Error> {
        if n != 2 {
            return Err(Error::record(alert::DECODE_ERROR, "an alert that is not two bytes"));
        }
        if msg[1] == alert::CLOSE_NOTIFY {
            self.peer_closed = true;
            self.error = Some("the peer closed the TLS channel (close_notify)".into());
            self.state = State::Failed;
            return Ok(());
        }
        self.alert_sent = true; // no alert answers a fatal alert
        Err(Error::record(alert::CLOSE_NOTIFY, format!("the peer sent TLS alert {}", msg[1])))
    }

    /// A handshake message after the handshake: KeyUpdate moves the receive keys on (and,
    /// when asked, ours too); session tickets are ignored (we never resume); one message
    /// per record (RFC 8446 allows coalescing; no NVMe peer sends more than one).
    fn on_post_handshake(&mut self, n: usize, m: [u8; 5]) -> Result<(), Error> {
        if n < 4 {
            return Err(Error::record(alert::DECODE_ERROR, "a handshake message shorter than its header"));
        }
        let body = usize::from(m[1]) << 16 | usize::from(m[2]) << 8 | usize::from(m[3]);
        if body + 4 != n {
            return Err(Error::record(
                alert::UNEXPECTED_MESSAGE,
                "handshake messages split or coalesced across records",
            ));
        }
        match m[0] {
            NEW_SESSION_TICKET => Ok(()),
            KEY_UPDATE => {
                if body != 1 || m[4] > 1 {
                    return Err(Error::record(alert::DECODE_ERROR, "a malformed KeyUpdate"));
                }
                if let Some(k) = self.open.as_mut() {
                    k.update()?;
                }
                self.stats.key_updates += 1;
                if m[4] == 1 {
                    // update_requested: our KeyUpdate (not requesting one back), then new keys.
                    if let Some(k) = self.seal.as_mut() {
                        record::seal_bytes(k, content::HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0], &mut self.ctrl)?;
                        k.update()?;
                    }
                }
                Ok(())
            }
            t => Err(Error::record(alert::UNEXPECTED_MESSAGE, format!("handshake message {t} after the handshake"))),
        }
    }

    // ---------------------------------------------------------- kernel TLS

    /// The keys for the kernel to take this channel's records over
    /// ([`crate::kernel::install`]), once the channel stands at a record boundary both ways:
    /// open, every byte received opened and read (the first records that came with the
    /// peer's Finished are opened here, so the kernel's receive sequence starts after them),
    /// nothing of ours waiting or in flight (handshake bytes, an alert, a batch). `None`
    /// until then: the caller asks again after its next receive or send.
    pub fn kernel_handover(&self) -> Option<Handover> {
        if !self.is_open()
            || self.alert_sent
            || self.peer_closed
            || self.tx_inflight
            || !self.ctrl.is_empty()
            || self.batch.is_some()
            || !self.plain.is_empty()
        {
            return None;
        }
        // The receive buffer is home (no receive in flight) and holds nothing unopened.
        let rx = self.rx.as_ref()?;
        if self.rx_pos != rx.len() {
            return None;
        }
        Some(Handover { tx: CryptoInfo::new(self.seal.as_ref()?), rx: CryptoInfo::new(self.open.as_ref()?) })
    }

    // ------------------------------------------------------------------ send

    /// Whether bytes wait to be sent (handshake, alerts, or the rest of a batch).
    pub fn has_output(&self) -> bool {
        !self.ctrl.is_empty() || self.batch.as_ref().is_some_and(|b| self.batch_off < b.len())
    }

    /// Whether a send of this channel is in flight.
    pub fn send_in_flight(&self) -> bool {
        self.tx_inflight
    }

    /// The next ciphertext to send, if none is in flight: handshake bytes and alerts first,
    /// then (once open) up to [`SEAL_CHUNK`] bytes of the queue's batch, which `next_batch`
    /// gives when the previous one is all sent.
    pub fn take_send(&mut self, next_batch: impl FnOnce() -> Option<SendMsg>) -> Result<Option<SendMsg>, Error> {
        if self.tx_inflight {
            return Ok(None);
        }
        if self.batch.is_none() && self.is_open() && !self.alert_sent {
            self.batch = next_batch();
            self.batch_off = 0;
        }
        let mut msg = self.tx_spare.take().unwrap_or_default();
        msg.push_bytes(&self.ctrl);
        self.ctrl.clear();
        if !self.alert_sent
            && let (Some(batch), Some(keys)) = (self.batch.as_ref(), self.seal.as_mut())
            && let Some(mut buf) = self.tx_buf.take()
        {
            let from = self.batch_off;
            let to = batch.len().min(from + SEAL_CHUNK);
            if to > from {
                buf.set_len(buf.capacity());
                let r = seal_range(keys, batch, from..to, &mut buf);
                match r {
                    Ok((len, records)) => {
                        self.stats.records_sealed += records;
                        self.batch_off = to;
                        if let Err((e, b)) = msg.push_buf(buf, 0..len) {
                            self.tx_buf = Some(b);
                            return Err(Error::internal(e.to_string()));
                        }
                    }
                    Err(e) => {
                        self.tx_buf = Some(buf);
                        self.fail(e.to_string(), Some(alert::INTERNAL_ERROR));
                        return Err(e);
                    }
                }
            } else {
                self.tx_buf = Some(buf);
            }
        }
        if msg.is_empty() {
            self.tx_spare = Some(msg);
            return Ok(None);
        }
        self.tx_inflight = true;
        Ok(Some(msg))
    }

    /// A send of [`Channel::take_send`] finished. Returns the queue's batch, with the result,
    /// once all of it went out (or the send failed).
    pub fn on_send_done(
        &mut self,
        mut msg: SendMsg,
        result: std::io::Result<()>,
    ) -> Option<(SendMsg, std::io::Result<()>)> {
        self.tx_inflight = false;
        if let Some(b) = msg.drain_bufs().next() {
            self.tx_buf = Some(b);
        }
        msg.clear();
        self.tx_spare = Some(msg);
        let done = self.batch.as_ref().is_some_and(|b| self.batch_off >= b.len());
        if result.is_err() || done || self.alert_sent {
            return self.batch.take().map(|b| (b, result));
        }
        None
    }

    /// The batch being sent, given back unsent (the connection is going away).
    pub fn take_batch(&mut self) -> Option<SendMsg> {
        self.batch.take()
    }
}

fn piece_len(p: &Piece<'_>) -> usize {
    match p {
        Piece::Bytes(b) => b.len(),
        Piece::Region(_, r) => r.len(),
    }
}

/// Content bytes of the record that starts at `pos`, inside `cur` (which starts at
/// `piece_start`; `rest` follows it): at most 2^14 and at most `end - pos`, and ending
/// where a piece of at least 2^14 bytes (a large read's data) begins, so that its data
/// starts a record. The peer can then open those records straight into the command's
/// buffer (our host does, for C2H data of 16 KiB and more) instead of into its receive
/// buffer and copying from there; it costs one short record before each such piece.
fn record_content<'a>(
    cur: Option<&Piece<'a>>,
    mut rest: impl Iterator<Item = Piece<'a>>,
    piece_start: usize,
    pos: usize,
    end: usize,
) -> usize {
    let limit = (end - pos).min(PLAINTEXT_MAX);
    let mut start = piece_start;
    let mut len = cur.map(piece_len);
    while let Some(plen) = len {
        if start >= pos + limit {
            break;
        }
        if start > pos && plen >= PLAINTEXT_MAX {
            return start - pos;
        }
        start += plen;
        len = rest.next().as_ref().map(piece_len);
    }
    limit
}

/// Seals `batch[range]` into `out` as records of at most 2^14 bytes ([`record_content`]);
/// returns the bytes written and the number of records.
fn seal_range(keys: &mut Keys, batch: &SendMsg, range: Range<usize>, out: &mut [u8]) -> Result<(usize, u64), Error> {
    let mut written = 0;
    let mut records = 0;
    let mut pos = range.start;
    let mut pieces = batch.pieces();
    let mut piece_start = 0usize;
    let mut cur: Option<Piece<'_>> = pieces.next();
    while pos < range.end {
        let content = record_content(cur.as_ref(), pieces.clone(), piece_start, pos, range.end);
        let mut s = record::Sealer::begin(keys, &mut out[written..], content)?;
        let mut left = content;
        while left > 0 {
            let Some(p) = cur.as_ref() else { return Err(Error::internal("batch shorter than its length")) };
            let plen = piece_len(p);
            if pos >= piece_start + plen {
                piece_start += plen;
                cur = pieces.next();
                continue;
            }
            let off = pos - piece_start;
            let n = (plen - off).min(left);
            match p {
                Piece::Bytes(b) => s.copy(&b[off..off + n])?,
                Piece::Region(region, r) => s.from_region(region, r.start + off, n)?,
            }
            pos += n;
            left -= n;
        }
        written += s.finish(content::APPLICATION_DATA)?;
        records += 1;
    }
    Ok((written, records))
}

/// Feeds `bytes` to `to` as if received (tests, loopback, fuzzing); returns how many it took
/// (fewer when it stopped reading: failed, or whole records wait to be read).
pub fn feed(to: &mut Channel, mut bytes: &[u8]) -> usize {
    let total = bytes.len();
    while !bytes.is_empty() {
        let Some((mut buf, range)) = to.take_recv_buf() else { break };
        let n = bytes.len().min(range.len());
        buf.as_full_mut()[range.start..range.start + n].copy_from_slice(&bytes[..n]);
        to.on_recv(buf, n);
        bytes = &bytes[n..];
    }
    total - bytes.len()
}

/// Runs two channels' handshake against each other in memory (tests, examples): every
/// byte one sends is fed to the other until neither has anything to send.
pub fn pump(a: &mut Channel, b: &mut Channel) {
    fn one_way(from: &mut Channel, to: &mut Channel) -> bool {
        let mut moved = false;
        while let Ok(Some(msg)) = from.take_send(|| None) {
            let bytes = msg.to_vec();
            feed(to, &bytes);
            from.on_send_done(msg, Ok(()));
            moved = true;
        }
        moved
    }
    for _ in 0..16 {
        let ab = one_way(a, b);
        let ba = one_way(b, a);
        if !ab && !ba {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::handshake::PskLookup;
    use crate::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    const SUB: &str = "nqn.2026-11.io.qpath:s1";

    struct Store(ConfiguredPsk);
    impl PskLookup for Store {
        fn lookup(&self, id: &Identity) -> Option<TlsPsk> {
            if id.subnqn != SUB {
                return None;
            }
            self.0.retained(&id.hostnqn, Derivation::Standard).tls_psk(id)
        }
    }

    fn key(b: u8) -> ConfiguredPsk {
        ConfiguredPsk::new(Some(PskHash::Sha256), &[b; 32]).unwrap()
    }

    fn pair_with(server_key: u8, client_key: u8, version: IdentityVersion, sub: &str) -> (Channel, Channel) {
        let cfg = ServerConfig::new(Arc::new(Store(key(server_key)))).unwrap();
        let r = key(client_key).retained(HOST, Derivation::Standard);
        let id = r.identity(version, HOST, sub);
        let psk = r.tls_psk(&id).unwrap();
        let mut c = Channel::client(&ClientConfig::shared().unwrap(), id, psk).unwrap();
        let mut s = Channel::server(&cfg).unwrap();
        pump(&mut c, &mut s);
        (c, s)
    }

    fn batch(bytes: &[u8]) -> SendMsg {
        let mut m = SendMsg::new();
        m.push_bytes(bytes);
        m
    }

    /// Sends `data` from `a` to `b` through the record layer; returns what `b` reads.
    fn through(a: &mut Channel, b: &mut Channel, data: &[u8]) -> Vec<u8> {
        let mut pending = Some(batch(data));
        let mut out = Vec::new();
        let mut got = vec![0u8; 100_000];
        for _ in 0..1000 {
            let Ok(Some(msg)) = a.take_send(|| pending.take()) else { break };
            let wire = msg.to_vec();
            let mut off = 0;
            while off < wire.len() {
                off += feed(b, &wire[off..]);
                let n = b.read(&mut got);
                out.extend_from_slice(&got[..n]);
                if b.error().is_some() {
                    return out;
                }
            }
            a.on_send_done(msg, Ok(()));
        }
        out
    }

    #[test]
    fn handshake_then_data_both_ways_v0_and_v1() {
        for v in [IdentityVersion::V0, IdentityVersion::V1] {
            let (mut c, mut s) = pair_with(1, 1, v, SUB);
            assert!(c.is_open() && s.is_open(), "{c:?} {s:?}");
            assert_eq!(s.identity().unwrap().hostnqn, HOST);
            assert_eq!(s.identity().unwrap().version(), v);
            assert_eq!(c.suite(), Some(Suite::Aes128GcmSha256));
            let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
            assert_eq!(through(&mut c, &mut s, &big), big);
            assert_eq!(through(&mut s, &mut c, b"answer"), b"answer");
            assert!(s.stats().records_opened >= 13);
        }
    }

    /// The content lengths of the records in `wire`.
    fn record_contents(wire: &[u8]) -> Vec<usize> {
        let mut at = 0;
        let mut lens = Vec::new();
        while at < wire.len() {
            let body = record::parse_header(wire[at..at + HEADER_LEN].try_into().unwrap()).unwrap();
            lens.push(body - record::TAG_LEN - 1);
            at += HEADER_LEN + body;
        }
        lens
    }

    /// A piece of 2^14 bytes or more (a large read's data, from a buffer or a RAM
    /// namespace's region) starts a record, so the host can open its records straight into
    /// the command's buffer; smaller pieces share records; the bytes arrive unchanged.
    #[test]
    fn a_large_piece_starts_a_record() {
        let (mut c, mut s) = pair_with(6, 6, IdentityVersion::V1, SUB);
        let region = std::sync::Arc::new(uring::SharedRegion::new(1 << 20).unwrap());
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
        region.copy_to_region(4096, &data).unwrap();
        let small: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let mut m = SendMsg::new();
        m.push_bytes(&[1; 16]); // a response capsule
        m.push_bytes(&[2; 24]); // a C2HData header
        m.push_region(&region, 4096..4096 + 40_000).unwrap(); // its data
        m.push_bytes(&[3; 24]);
        m.push_bytes(&small); // a 4 KiB read's data shares its record
        m.push_bytes(&[4; 24]);
        // Exactly 2^14 bytes from a buffer (a read from a file namespace). (Bytes pushed
        // with `push_bytes` join the header bytes before them: one piece.)
        let mut buf = IoBuf::new(PLAINTEXT_MAX);
        buf.extend_from_slice(&data[..PLAINTEXT_MAX]);
        m.push_buf(buf, 0..PLAINTEXT_MAX).unwrap();
        let want = m.to_vec();
        let mut pending = Some(m);
        let msg = c.take_send(|| pending.take()).unwrap().unwrap();
        let wire = msg.to_vec();
        assert_eq!(record_contents(&wire), [40, 16384, 16384, 7232 + 24 + 4096 + 24, 16384]);
        feed(&mut s, &wire);
        let mut got = vec![0u8; want.len()];
        let mut n = 0;
        while n < want.len() {
            let k = s.read(&mut got[n..]);
            assert!(k > 0, "{:?}", s.error());
            n += k;
        }
        assert!(got == want, "the bytes arrive unchanged");
    }

    #[test]
    fn wrong_psk_and_unknown_identity_fail_with_an_alert() {
        let (c, s) = pair_with(1, 2, IdentityVersion::V1, SUB);
        assert!(!c.is_open() && !s.is_open());
        assert!(s.error().unwrap().contains("handshake"), "{:?}", s.error());
        assert!(c.error().is_some(), "the client hears the alert");
        let (c, s) = pair_with(1, 1, IdentityVersion::V1, "nqn.2026-11.io.qpath:unknown");
        assert!(!c.is_open() && !s.is_open());
        assert!(s.error().unwrap().contains("no TLS key for identity"), "{:?}", s.error());
    }

    #[test]
    fn corrupted_and_bad_records_fail_the_channel() {
        let (mut c, mut s) = pair_with(3, 3, IdentityVersion::V1, SUB);
        let mut pending = Some(batch(b"a capsule"));
        let msg = c.take_send(|| pending.take()).unwrap().unwrap();
        let mut wire = msg.to_vec();
        let last = wire.len() - 1;
        wire[last] ^= 0x80;
        feed(&mut s, &wire);
        let mut out = [0u8; 64];
        assert_eq!(s.read(&mut out), 0, "nothing of a forged record is read");
        assert!(s.error().unwrap().contains("bad record MAC"), "{:?}", s.error());
        // The alert goes out (a plaintext-length record of type 23 carrying alert 20).
        let alert = s.take_send(|| None).unwrap().unwrap();
        assert_eq!(alert.len(), OVERHEAD + 2);
        // A plaintext record header after the handshake is refused too.
        let (_, mut s2) = pair_with(3, 3, IdentityVersion::V1, SUB);
        feed(&mut s2, &[22, 3, 3, 0, 4, 1, 0, 0, 0]);
        assert_eq!(s2.read(&mut out), 0);
        assert!(s2.error().is_some());
        // An oversized length is refused from the header alone.
        let (_, mut s3) = pair_with(3, 3, IdentityVersion::V1, SUB);
        feed(&mut s3, &[23, 3, 3, 0xff, 0xff]);
        assert_eq!(s3.read(&mut out), 0);
        assert!(s3.error().unwrap().contains("longer"), "{:?}", s3.error());
    }

    #[test]
    fn truncated_record_waits_then_peer_close_is_reported() {
        let (mut c, mut s) = pair_with(4, 4, IdentityVersion::V1, SUB);
        let mut pending = Some(batch(b"half"));
        let msg = c.take_send(|| pending.take()).unwrap().unwrap();
        let wire = msg.to_vec();
        feed(&mut s, &wire[..wire.len() - 3]);
        let mut out = [0u8; 16];
        assert_eq!(s.read(&mut out), 0);
        assert!(s.error().is_none(), "a partial record waits");
        let (buf, _) = s.take_recv_buf().unwrap();
        s.on_recv(buf, 0);
        assert!(s.peer_closed());
    }

    #[test]
    fn tls12_client_hello_is_refused() {
        let cfg = ServerConfig::new(Arc::new(Store(key(1)))).unwrap();
        let mut s = Channel::server(&cfg).unwrap();
        // A TLS 1.2-only ClientHello (no supported_versions extension), AES-GCM PSK suite.
        let mut hello = vec![1, 0, 0, 0, 3, 3];
        hello.extend_from_slice(&[7; 32]);
        hello.extend_from_slice(&[0, 0, 2, 0x00, 0xa8, 1, 0]);
        let len = u32::try_from(hello.len() - 4).unwrap().to_be_bytes();
        hello[1..4].copy_from_slice(&len[1..]);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&u16::try_from(hello.len()).unwrap().to_be_bytes());
        rec.extend_from_slice(&hello);
        feed(&mut s, &rec);
        assert!(s.error().unwrap().contains("handshake failed"), "{:?}", s.error());
        let alert = s.take_send(|| None).unwrap().unwrap().to_vec();
        assert_eq!(alert[0], content::ALERT, "a plaintext alert: {alert:?}");
        assert_eq!(alert[6], 70, "protocol_version");
    }

    #[test]
    fn key_update_from_the_peer_is_followed() {
        let (mut c, mut s) = pair_with(5, 5, IdentityVersion::V1, SUB);
        // The client sends KeyUpdate(update_requested) and moves its keys on.
        let k = c.seal.as_mut().unwrap();
        let mut wire = Vec::new();
        record::seal_bytes(k, content::HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 1], &mut wire).unwrap();
        k.update().unwrap();
        feed(&mut s, &wire);
        let mut out = [0u8; 8];
        assert_eq!(s.read(&mut out), 0);
        assert_eq!(s.stats().key_updates, 1);
        assert_eq!(through(&mut c, &mut s, b"after"), b"after");
        // The server answered with its own KeyUpdate before its next record.
        let mut pending = Some(batch(b"reply"));
        let msg = s.take_send(|| pending.take()).unwrap().unwrap();
        feed(&mut c, &msg.to_vec());
        let mut got = [0u8; 16];
        let n = c.read(&mut got);
        assert_eq!(&got[..n], b"reply");
        assert_eq!(c.stats().key_updates, 1);
    }

    /// The client's Finished and its first record (an ICReq) arrive in one segment: the
    /// server opens that record in user space, and only then offers the kernel its keys,
    /// with the receive sequence after it; the kernel's keys open the client's next record.
    /// No session ticket follows the handshake (PSK only): nothing waits to be sent.
    #[test]
    fn kernel_handover_waits_for_records_read_with_the_finished() {
        let cfg = ServerConfig::new(Arc::new(Store(key(7)))).unwrap();
        let r = key(7).retained(HOST, Derivation::Standard);
        let id = r.identity(IdentityVersion::V1, HOST, SUB);
        let psk = r.tls_psk(&id).unwrap();
        let mut c = Channel::client(&ClientConfig::shared().unwrap(), id, psk).unwrap();
        let mut s = Channel::server(&cfg).unwrap();
        let hello = c.take_send(|| None).unwrap().unwrap();
        feed(&mut s, &hello.to_vec());
        c.on_send_done(hello, Ok(()));
        let flight = s.take_send(|| None).unwrap().unwrap();
        feed(&mut c, &flight.to_vec());
        assert!(s.kernel_handover().is_none(), "a send in flight");
        s.on_send_done(flight, Ok(()));
        assert!(c.is_open());
        assert!(c.kernel_handover().is_none(), "the client's Finished waits to be sent");
        let mut pending = Some(batch(b"an ICReq PDU"));
        let msg = c.take_send(|| pending.take()).unwrap().unwrap();
        feed(&mut s, &msg.to_vec());
        c.on_send_done(msg, Ok(()));
        assert!(s.is_open());
        assert!(!s.has_output(), "no NewSessionTicket after the handshake");
        assert!(s.kernel_handover().is_none(), "a record read with the Finished is not opened yet");
        let mut got = [0u8; 64];
        let n = s.read(&mut got);
        assert_eq!(&got[..n], b"an ICReq PDU");
        let h = s.kernel_handover().expect("at a record boundary both ways");
        let rx = h.rx.as_bytes();
        let seq_at = std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, rec_seq);
        assert_eq!(u64::from_be_bytes(rx[seq_at..seq_at + 8].try_into().unwrap()), 1, "after the one record read");
        let tx = h.tx.as_bytes();
        assert_eq!(u64::from_be_bytes(tx[seq_at..seq_at + 8].try_into().unwrap()), 0, "nothing sent yet");
        // The client's next record opens with the structure's key and nonce.
        let mut pending = Some(batch(b"a Connect"));
        let msg = c.take_send(|| pending.take()).unwrap().unwrap();
        let wire = msg.to_vec();
        let (iv_at, key_at, salt_at) = (
            std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, iv),
            std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, key),
            std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, salt),
        );
        let mut nonce = rx[salt_at..salt_at + 4].to_vec();
        nonce.extend_from_slice(&rx[iv_at..iv_at + 8]);
        nonce[11] ^= 1;
        let (aad, body) = wire.split_at(HEADER_LEN);
        let (ct, tag) = body.split_at(body.len() - record::TAG_LEN);
        let plain = openssl::symm::decrypt_aead(
            openssl::symm::Cipher::aes_128_gcm(),
            &rx[key_at..key_at + 16],
            Some(&nonce),
            aad,
            ct,
            tag,
        )
        .expect("the kernel's receive keys open the client's second record");
        assert_eq!(&plain[..plain.len() - 1], b"a Connect");
    }

    /// Hash 02 on both ends, identities of version 0 and 1: the channel runs
    /// TLS_AES_256_GCM_SHA384 and carries data both ways.
    #[test]
    fn sha384_keys_make_an_aes_256_channel() {
        let k = ConfiguredPsk::new(Some(PskHash::Sha384), &[1; 48]).unwrap();
        let cfg = ServerConfig::new(Arc::new(Store(k.clone()))).unwrap();
        for v in [IdentityVersion::V0, IdentityVersion::V1] {
            let r = k.retained(HOST, Derivation::Standard);
            let id = r.identity(v, HOST, SUB);
            let psk = r.tls_psk(&id).unwrap();
            let mut c = Channel::client(&ClientConfig::shared().unwrap(), id, psk).unwrap();
            let mut s = Channel::server(&cfg).unwrap();
            pump(&mut c, &mut s);
            assert!(c.is_open() && s.is_open(), "{c:?} {s:?}");
            assert_eq!((c.suite(), s.suite()), (Some(Suite::Aes256GcmSha384), Some(Suite::Aes256GcmSha384)));
            assert_eq!(s.identity().unwrap().hash, PskHash::Sha384);
            let big: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
            assert_eq!(through(&mut c, &mut s, &big), big);
            assert_eq!(through(&mut s, &mut c, b"answer"), b"answer");
        }
    }
}
