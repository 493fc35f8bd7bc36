//! The host side of one NVMe/TCP queue, as a sans-I/O state machine (Linux
//! `host/tcp.c`, SPDK `nvme_tcp.c`).
//!
//! Like the target's connection, it never touches a socket: its driver (a
//! [`crate::context::Context`] on the owning thread, or a blocking driver
//! for handshakes and the admin queue) lends it received bytes and takes
//! batches to send. One state machine serves the io_uring path, the blocking
//! path, the in-process loopback and the fuzzer.
//!
//! ```text
//!  submit(Io) ─► CapsuleCmd (+ in-capsule data, from the caller's buffer) ► target
//!             ◄─ R2T ─► H2CData from the caller's buffer ──────►
//!  on_recv  ◄── C2HData into the caller's buffer / CapsuleResp ◄─
//!           ─► completions(): (token, Cqe, buffer back)
//! ```
//!
//! Per I/O: no allocation (slots indexed by command id, reused send
//! batches), no lock, no copy of write data. A write's buffer travels in a send
//! batch (in-capsule data and H2CData alike); the I/O completes only when both
//! its response arrived and its buffer came back.

use std::ops::Range;

use nvme::fabrics::{ConnectCmd, ConnectData};
use nvme::tcp::pdu::TERM_MAX_DATA;
use nvme::tcp::{
    DataHeader, DecoderConfig, Digests, EncoderConfig, FatalError, Frame, Framer, Header, IcReq, PduInfo, Role, crc32c,
};
use nvme::{Cid, Cntlid, Cqe, QueueId, SglDescriptor, Sqe, Status};
use uring::{IoBuf, SendMsg};

use crate::error::BadTransition;

mod secure;

/// C2H data of at least this many bytes still to come is received straight into the
/// command's buffer instead of through the queue's receive buffer (one copy, not two).
pub const DIRECT_RECV_MIN: usize = 16 * 1024;

/// How much the receive after a directly placed payload asks for: enough for the next
/// headers and responses, little enough that the next large payload is mostly placed
/// directly too. Any other receive asks for the whole free buffer.
const RECV_AFTER_DIRECT: usize = 512;

/// Iovecs one write's in-capsule data may add to a send batch: its range of the caller's
/// buffer, and the header segment after it (the data digest and the next PDUs).
const IN_CAPSULE_SEGMENTS: usize = 2;

/// Static parameters of a queue.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Queue id (0 = admin).
    pub qid: QueueId,
    /// Entries (SQSIZE + 1); command ids 0..entries are the caller's tags.
    pub entries: u16,
    /// Header and data digests to ask for.
    pub digests: Digests,
    /// In-capsule data the controller accepts (IOCCSZ×16 − 64; 8 KiB on the admin queue).
    pub max_in_capsule: usize,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host id.
    pub hostid: [u8; 16],
    /// Controller id (`Cntlid::DYNAMIC` for the admin queue).
    pub cntlid: Cntlid,
    /// Keep-alive timeout for the admin Connect, ms.
    pub kato_ms: u32,
    /// Ask the controller not to track SQ head (lets C2HData carry SUCCESS, saving a PDU per read).
    pub disable_sqflow: bool,
    /// Receive buffer size.
    pub rx_buffer_size: usize,
    /// Command ids the caller may use: `0..tag_space` (at least `entries`; larger
    /// when tags come from a tag set shared with other queues, whose values are
    /// unique across the set).
    pub tag_space: u16,
    /// DH-HMAC-CHAP secrets, for a controller that requires in-band authentication.
    pub dhchap: Option<crate::auth::DhchapKeys>,
    /// The admin queue of a controller connected with secure channel concatenation: its
    /// authentication generates the TLS PSK of the queues after it ([`crate::auth::Concat`]).
    pub concat: bool,
    /// TCP congestion control of the connection by its kernel name (`None` = the system's).
    pub tcp_congestion: Option<String>,
    /// Run the queue inside a TLS 1.3 channel with this identity and PSK ([`crate::tls`]).
    pub tls: Option<crate::tls::QueueTls>,
    /// Whether the channel's records go to kernel TLS after the handshake, where the
    /// kernel offers it (`tls::kernel`; default auto).
    pub tls_offload: tls::kernel::Offload,
}

impl QueueConfig {
    /// An I/O queue's configuration for controller `cntlid`.
    pub fn io(qid: u16, entries: u16, cntlid: Cntlid, subnqn: &str, hostnqn: &str, hostid: [u8; 16]) -> QueueConfig {
        QueueConfig {
            qid: QueueId(qid),
            entries,
            digests: Digests::default(),
            max_in_capsule: 8192,
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn.to_string(),
            hostid,
            cntlid,
            kato_ms: 0,
            disable_sqflow: true,
            rx_buffer_size: 64 * 1024,
            tag_space: entries,
            dhchap: None,
            concat: false,
            tcp_congestion: None,
            tls: None,
            tls_offload: tls::kernel::Offload::Auto,
        }
    }
}

/// Lifecycle of a host queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// ICReq sent, waiting for ICResp.
    AwaitIcResp,
    /// Connect sent, waiting for its response.
    AwaitConnect,
    /// Connected, but the controller requires in-band authentication (ATR):
    /// only Authentication Send/Receive may be submitted until [`HostQueue::authenticated`].
    Authenticating,
    /// Connected: commands flow.
    Live,
    /// A fatal error or closed socket: every outstanding command must be failed or retried elsewhere.
    Failed,
}

impl QueueState {
    /// The one place queue lifecycle changes are decided.
    #[must_use = "a refused transition leaves the state as it was"]
    pub fn transition(self, to: QueueState) -> Result<QueueState, BadTransition<QueueState>> {
        use QueueState::*;
        match (self, to) {
            (AwaitIcResp, AwaitConnect)
            | (AwaitConnect, Live | Authenticating)
            | (Authenticating, Live)
            | (_, Failed) => Ok(to),
            (from, to) => Err(BadTransition { from, to }),
        }
    }
}

/// Direction of a command's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Host to controller (write): the buffer's first `len` bytes are sent.
    ToController,
    /// Controller to host (read): up to `len` bytes land in the buffer.
    FromController,
}

/// A command to submit.
#[derive(Debug)]
pub struct Io {
    /// The command; its CID is set to the tag by [`HostQueue::submit`].
    pub sqe: Sqe,
    /// Data buffer, owned by the queue until completion.
    pub buf: Option<IoBuf>,
    /// Data length.
    pub len: u32,
    /// Direction.
    pub dir: DataDir,
    /// The caller's token, handed back in the completion.
    pub token: u64,
}

/// A finished command.
#[derive(Debug)]
pub struct Done {
    /// The caller's token.
    pub token: u64,
    /// The tag (command id) the command used.
    pub tag: u16,
    /// Completion entry (status, result).
    pub cqe: Cqe,
    /// The data buffer, back to the caller.
    pub buf: Option<IoBuf>,
}

/// Why a submission was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The queue is not live.
    #[error("queue is not live")]
    NotLive,
    /// The tag is out of range or already in use.
    #[error("tag {0} is out of range or busy")]
    BadTag(u16),
    /// The data length does not match the buffer.
    #[error("data length does not fit the buffer")]
    BadLength,
    /// As many commands are outstanding as the submission queue has entries.
    #[error("the submission queue is full")]
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Sent, waiting for data or a response.
    Outstanding,
}

struct Slot {
    state: SlotState,
    token: u64,
    dir: DataDir,
    len: u32,
    buf: Option<IoBuf>,
    /// The buffer is in a send batch (H2C data).
    buf_in_flight: bool,
    /// C2H bytes received.
    received: u32,
    cqe: Option<Cqe>,
    sqe: Sqe,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: SlotState::Free,
            token: 0,
            dir: DataDir::None,
            len: 0,
            buf: None,
            buf_in_flight: false,
            received: 0,
            cqe: None,
            sqe: Sqe::default(),
        }
    }
}

/// What the PDU being received means to the queue (the framer knows where it is in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxPdu {
    /// Nothing beyond its header.
    Other,
    /// C2H data for `tag`; the next bytes go to `offset` in its buffer.
    C2H { tag: u16, offset: u32, success: bool, last: bool },
    /// A C2HTermReq's error data: skipped, then the queue fails.
    Term,
}

/// A receive in flight into a command's own buffer.
#[derive(Clone, Copy, Debug)]
struct Direct {
    tag: u16,
    /// The buffer's length before the receive (the ring sets it to the received end).
    len: usize,
}

/// One host NVMe/TCP queue.
pub struct HostQueue {
    cfg: QueueConfig,
    state: QueueState,
    framer: Framer,
    enc: EncoderConfig,
    maxh2cdata: u32,
    rx: Option<IoBuf>,
    rx_pos: usize,
    rx_pdu: RxPdu,
    /// The receive in flight goes into a command's buffer, not `rx`.
    direct: Option<Direct>,
    /// Most bytes the next receive into `rx` asks for.
    rx_limit: usize,
    tx: SendMsg,
    tx_owners: Vec<u16>,
    tx_spare: Option<SendMsg>,
    tx_inflight: bool,
    inflight_owners: Vec<u16>,
    scratch: Vec<u8>,
    slots: Vec<Slot>,
    done: Vec<Done>,
    outstanding: usize,
    cntlid: Cntlid,
    error: Option<String>,
    /// Bytes of commands queued since the last send (for batching decisions).
    pending_cmds: usize,
    /// The queue went live through an authentication transaction.
    was_authenticated: bool,
    /// A control command holds the reserved tag (the Connect, which also uses it, is
    /// not one: it is not counted as outstanding and never completes to the caller).
    control_inflight: bool,
    /// The secure channel the queue runs in (`crate::tls`): the ICReq waits for its handshake.
    tls: Option<Box<tls::Channel>>,
    /// The kernel seals and opens the channel's records (`tls` is then gone): its suite.
    kernel_tls: Option<tls::record::Suite>,
    /// A handover to kernel TLS is still to be tried (`tls_offload` auto).
    kernel_tls_wanted: bool,
    /// [`HostQueue::abort_all`] ran: nothing more is sent.
    aborted: bool,
}

impl std::fmt::Debug for HostQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostQueue")
            .field("qid", &self.cfg.qid)
            .field("state", &self.state)
            .field("outstanding", &self.outstanding)
            .finish()
    }
}

/// The internal command id of the Fabrics Connect (one past the caller's tags), and
/// of control commands on a live queue ([`HostQueue::submit_control`]): Linux keeps a
/// reserved tag per queue for the same two (`NVMF_RESERVED_TAGS`).
fn connect_tag(tag_space: u16) -> u16 {
    tag_space
}

impl HostQueue {
    /// A new queue; the ICReq is queued for sending at once.
    pub fn new(cfg: QueueConfig) -> HostQueue {
        let entries = usize::from(cfg.tag_space.max(cfg.entries));
        let mut q = HostQueue {
            framer: Framer::new(DecoderConfig::initial(Role::Host)),
            enc: EncoderConfig::default(),
            maxh2cdata: nvme::tcp::pdu::MIN_MAXH2CDATA,
            rx: Some(IoBuf::new(cfg.rx_buffer_size.max(8192).next_multiple_of(4096))),
            rx_pos: 0,
            rx_pdu: RxPdu::Other,
            direct: None,
            rx_limit: usize::MAX,
            tx: SendMsg::with_capacity(4096, 64),
            tx_owners: Vec::with_capacity(64),
            tx_spare: Some(SendMsg::with_capacity(4096, 64)),
            tx_inflight: false,
            inflight_owners: Vec::with_capacity(64),
            scratch: Vec::with_capacity(256),
            slots: (0..=entries).map(|_| Slot::new()).collect(),
            done: Vec::with_capacity(entries + 1),
            outstanding: 0,
            cntlid: cfg.cntlid,
            error: None,
            state: QueueState::AwaitIcResp,
            pending_cmds: 0,
            was_authenticated: false,
            control_inflight: false,
            tls: None,
            kernel_tls: None,
            kernel_tls_wanted: false,
            aborted: false,
            cfg,
        };
        q.kernel_tls_wanted = q.cfg.tls.is_some() && q.cfg.tls_offload == tls::kernel::Offload::Auto;
        if let Some(t) = q.cfg.tls.clone() {
            match t.channel() {
                Ok(ch) => q.tls = Some(Box::new(ch)),
                Err(e) => q.fail(format!("TLS: {e}")),
            }
        }
        let icreq = IcReq { pfv: 0, hpda: 0, digests: q.cfg.digests, maxr2t: 0 };
        q.tx.push_bytes(&icreq.encode());
        q
    }

    /// Lifecycle state.
    pub fn state(&self) -> QueueState {
        self.state
    }

    /// The configuration the queue was made with.
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// The in-band authentication transaction succeeded: the queue goes live.
    pub fn authenticated(&mut self) {
        if self.state == QueueState::Authenticating && self.transition(QueueState::Live) {
            self.was_authenticated = true;
        }
    }

    /// Whether the queue went live through an in-band authentication transaction
    /// (only such queues re-authenticate, as on Linux).
    pub fn was_authenticated(&self) -> bool {
        self.was_authenticated
    }

    /// Queue id.
    pub fn qid(&self) -> QueueId {
        self.cfg.qid
    }

    /// The controller id the Connect returned (admin) or was given (I/O).
    pub fn cntlid(&self) -> Cntlid {
        self.cntlid
    }

    /// Entries (the most commands outstanding at once).
    pub fn entries(&self) -> u16 {
        self.cfg.entries
    }

    /// Command ids the caller may use: `0..tag_space()`.
    pub fn tag_space(&self) -> u16 {
        self.cfg.tag_space.max(self.cfg.entries)
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Why the queue failed.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Negotiated digests.
    pub fn digests(&self) -> Digests {
        self.enc.digests
    }

    /// MAXH2CDATA the controller reported.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Sets the in-capsule limit (after Identify Controller told IOCCSZ).
    pub fn set_max_in_capsule(&mut self, bytes: usize) {
        self.cfg.max_in_capsule = bytes;
    }

    fn fail(&mut self, why: String) {
        if self.state != QueueState::Failed {
            tracing::debug!(qid = self.cfg.qid.0, "queue failed: {why}");
            self.error = Some(why);
            // Every state may fail (QueueState::transition's `(_, Failed)`).
            self.state = QueueState::Failed;
        }
    }

    /// Moves the queue to `to`; whether it did. A transition its state machine refuses
    /// is logged at error level (in release builds too) and fails the queue: its driver
    /// and the protocol no longer agree on where the connection stands.
    #[must_use = "a refused transition fails the queue"]
    fn transition(&mut self, to: QueueState) -> bool {
        match self.state.transition(to) {
            Ok(s) => {
                self.state = s;
                true
            }
            Err(e) => {
                tracing::error!(qid = self.cfg.qid.0, "queue state change refused: {e}");
                self.fail(format!("internal error: {e}"));
                false
            }
        }
    }

    fn fatal(&mut self, e: FatalError, offending: &[u8]) {
        self.scratch.clear();
        EncoderConfig::term_req(&mut self.scratch, Role::Host, e, offending);
        self.tx.push_bytes(&self.scratch);
        self.fail(format!("protocol error from controller: {:?} at byte {}", e.fes, e.fei));
    }

    /// Marks the queue failed (socket error or closed by the driver).
    pub fn set_failed(&mut self, why: &str) {
        self.fail(why.to_string());
    }

    // ------------------------------------------------------------ submission

    /// Queues a command under `tag` (0..entries). The caller's tag allocator
    /// guarantees the tag is free; a busy tag is refused.
    pub fn submit(&mut self, tag: u16, io: Io) -> Result<(), (SubmitError, Io)> {
        self.submit_at(tag, io, false)
    }

    /// Queues a control command of the queue's owner (a re-authentication's
    /// Authentication Send or Receive) under the queue's reserved tag
    /// ([`HostQueue::control_tag`]), beside the caller's commands. One at a time; refused
    /// with [`SubmitError::Full`] while the submission queue is full (try again once a
    /// command completes: a queue that holds a control command takes the caller's
    /// commands only while one entry stays free for it).
    pub fn submit_control(&mut self, io: Io) -> Result<(), (SubmitError, Io)> {
        if self.state != QueueState::Live {
            return Err((SubmitError::NotLive, io));
        }
        self.submit_at(self.control_tag(), io, true)
    }

    /// The tag of [`HostQueue::submit_control`]'s commands (their completions carry it).
    pub fn control_tag(&self) -> u16 {
        connect_tag(self.tag_space())
    }

    /// `control`: `tag` is the reserved one, past the caller's.
    #[inline(always)]
    fn submit_at(&mut self, tag: u16, mut io: Io, control: bool) -> Result<(), (SubmitError, Io)> {
        let auth_cmd = io.sqe.is_fabrics()
            && matches!(io.sqe.fctype(), nvme::opcode::fctype::AUTH_SEND | nvme::opcode::fctype::AUTH_RECEIVE);
        if !(self.state == QueueState::Live || (self.state == QueueState::Authenticating && auth_cmd)) {
            return Err((SubmitError::NotLive, io));
        }
        if (tag >= self.tag_space() && !control) || self.slots[usize::from(tag)].state != SlotState::Free {
            return Err((SubmitError::BadTag(tag), io));
        }
        // The SQ's size (Connect's SQSIZE + 1) bounds what is outstanding, the reserved tag's
        // command included: the controller has no room for more.
        if self.outstanding >= usize::from(self.cfg.entries) {
            return Err((SubmitError::Full, io));
        }
        let len = io.len as usize;
        if io.dir != DataDir::None && io.buf.as_ref().is_none_or(|b| b.capacity() < len) {
            return Err((SubmitError::BadLength, io));
        }
        io.sqe.set_cid(Cid(tag));
        let in_capsule = io.dir == DataDir::ToController && len <= self.cfg.max_in_capsule && len > 0;
        let sgl = if in_capsule { SglDescriptor::in_capsule(io.len) } else { SglDescriptor::transport(io.len) };
        io.sqe.set_sgl(sgl);
        let enc = self.enc;
        let w = self.tx.push_with(|out| enc.capsule_cmd(out, &io.sqe, if in_capsule { len } else { 0 }));
        let mut buf_in_flight = false;
        if in_capsule && let Some(buf) = io.buf.take() {
            let digest = w.ddgst.then(|| crc32c(&buf.as_full()[..len]));
            // The data rides in the batch as a range of the caller's buffer, as SPDK's host
            // gathers it (`nvme_tcp.c`, the capsule's iovecs): the kernel copies it into the
            // socket once, and nothing copies it before. The buffer comes back with the
            // batch, and the command completes once both it and the CQE are back. A batch
            // that would run out of iovecs (a deep queue's worth of writes) copies instead.
            let buf = if self.tx.segments() + IN_CAPSULE_SEGMENTS <= uring::SEND_SEGMENTS_MAX {
                match self.tx.push_buf(buf, 0..len) {
                    Ok(()) => {
                        self.tx_owners.push(tag);
                        buf_in_flight = true;
                        None
                    }
                    Err((_, b)) => Some(b),
                }
            } else {
                Some(buf)
            };
            if let Some(b) = &buf {
                self.tx.push_bytes(&b.as_full()[..len]);
            }
            io.buf = buf;
            if let Some(d) = digest {
                self.tx.push_bytes(&d.to_le_bytes());
            }
        }
        let s = &mut self.slots[usize::from(tag)];
        s.state = SlotState::Outstanding;
        s.token = io.token;
        s.dir = io.dir;
        s.len = io.len;
        s.buf = io.buf;
        s.buf_in_flight = buf_in_flight;
        s.received = 0;
        s.cqe = None;
        s.sqe = io.sqe;
        self.outstanding += 1;
        self.pending_cmds += 1;
        self.control_inflight |= control;
        Ok(())
    }

    /// The command a tag carries (for logs and stall reports).
    pub fn sqe_of(&self, tag: u16) -> Option<&Sqe> {
        self.slots.get(usize::from(tag)).filter(|s| s.state == SlotState::Outstanding).map(|s| &s.sqe)
    }

    // --------------------------------------------------------------- receive

    /// The buffer to receive into and the range to fill, while the queue wants input.
    pub fn take_recv_buf(&mut self) -> Option<(IoBuf, Range<usize>)> {
        if self.state == QueueState::Failed {
            return None;
        }
        if let Some(ch) = self.tls.as_mut() {
            return ch.take_recv_buf();
        }
        if let Some(direct) = self.take_direct() {
            return Some(direct);
        }
        let mut buf = self.rx.take()?;
        let cap = buf.capacity();
        buf.compact(&mut self.rx_pos, cap / 4);
        let start = buf.len();
        let end = if cap - start > self.rx_limit { start + self.rx_limit } else { cap };
        Some((buf, start..end))
    }

    /// The command's own buffer and the range its C2H payload goes to, when the next bytes
    /// are a large payload and none of it waits in the receive buffer. The buffer counts
    /// as in flight (like a write's buffer in a send batch) until the receive returns it.
    fn take_direct(&mut self) -> Option<(IoBuf, Range<usize>)> {
        let (RxPdu::C2H { tag, offset, .. }, Some(remaining)) = (self.rx_pdu, self.framer.data_remaining()) else {
            return None;
        };
        if remaining < DIRECT_RECV_MIN || self.direct.is_some() {
            return None;
        }
        if self.rx.as_ref().is_none_or(|rx| self.rx_pos != rx.len()) {
            return None;
        }
        let start = offset as usize;
        let end = start.checked_add(remaining)?;
        let s = self.slots.get_mut(usize::from(tag))?;
        if s.buf_in_flight || s.buf.as_ref().is_none_or(|b| end > b.capacity()) {
            return None;
        }
        let buf = s.buf.take()?;
        s.buf_in_flight = true;
        self.direct = Some(Direct { tag, len: buf.len() });
        Some((buf, start..end))
    }

    /// A direct receive came back with `n` bytes (or none: `n == 0` with `closed`).
    fn on_direct(&mut self, d: Direct, mut buf: IoBuf, n: usize, closed: bool) {
        buf.set_len(d.len);
        let s = &mut self.slots[usize::from(d.tag)];
        s.buf = Some(buf);
        s.buf_in_flight = false;
        if closed {
            self.fail("connection closed by the controller".into());
        } else if n > 0
            && let (RxPdu::C2H { tag, .. }, Some(remaining)) = (self.rx_pdu, self.framer.data_remaining())
            && tag == d.tag
        {
            let n = n.min(remaining);
            if n == remaining {
                self.rx_limit = RECV_AFTER_DIRECT;
            }
            self.data_placed(n);
        }
        // A command aborted while its buffer was out finishes now that it is back.
        let s = &self.slots[usize::from(d.tag)];
        if self.state == QueueState::Failed && s.state == SlotState::Outstanding && s.cqe.is_some() {
            self.finish(d.tag);
        }
    }

    /// `n` more bytes of the C2H payload being received went straight to its command's
    /// buffer (a direct receive): the framer counts them into the digest, and a payload
    /// that ends without a digest completes now.
    pub(super) fn data_placed(&mut self, n: usize) {
        let RxPdu::C2H { tag, offset, .. } = &mut self.rx_pdu else { return };
        let s = &mut self.slots[usize::from(*tag)];
        let o = *offset as usize;
        let ended = match s.buf.as_ref() {
            Some(b) => self.framer.data_placed(&b.as_full()[o..o + n]),
            None => false,
        };
        s.received += u32::try_from(n).unwrap_or(u32::MAX);
        *offset += u32::try_from(n).unwrap_or(0);
        if ended && let Ok((_, Frame::DataEnd { digest_ok })) = self.framer.next(&[]) {
            self.data_end(digest_ok);
        }
    }

    /// `n` bytes arrived after the buffer's current length (0 = the controller closed).
    pub fn on_recv(&mut self, mut buf: IoBuf, n: usize) {
        if self.tls.is_some() {
            return self.tls_recv(buf, n);
        }
        if let Some(d) = self.direct.take() {
            return self.on_direct(d, buf, n, n == 0);
        }
        self.rx_limit = usize::MAX;
        if n == 0 {
            self.rx = Some(buf);
            let why = if self.state == QueueState::AwaitIcResp {
                // What a port that requires TLS does with a plaintext ICReq (and nvmet too).
                "connection closed by the controller before its ICResp (does the port require TLS?)"
            } else {
                "connection closed by the controller"
            };
            self.fail(why.into());
            return;
        }
        let len = (buf.len() + n).min(buf.capacity());
        buf.set_len(len);
        self.process(&buf);
        self.rx = Some(buf);
    }

    /// The receive buffer comes back without data (a timeout or a cancelled receive).
    pub fn on_recv_none(&mut self, buf: IoBuf) {
        if let Some(ch) = self.tls.as_mut() {
            return ch.on_recv_none(buf);
        }
        if let Some(d) = self.direct.take() {
            return self.on_direct(d, buf, 0, false);
        }
        self.rx = Some(buf);
    }

    /// Feeds bytes from elsewhere (loopback, fuzzing, blocking drivers).
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let Some((mut buf, range)) = self.take_recv_buf() else { return };
            let n = data.len().min(range.len());
            buf.as_full_mut()[range.start..range.start + n].copy_from_slice(&data[..n]);
            self.on_recv(buf, n);
            data = &data[n..];
        }
    }

    fn process(&mut self, buf: &IoBuf) {
        while self.state != QueueState::Failed {
            let avail = &buf[self.rx_pos..];
            let (n, frame) = match self.framer.next(avail) {
                Ok(step) => step,
                Err(e) => {
                    let n = avail.len().min(TERM_MAX_DATA);
                    let off = avail[..n].to_vec();
                    self.fatal(e, &off);
                    return;
                }
            };
            self.rx_pos += n;
            match frame {
                Frame::NeedMore(_) => return,
                Frame::Header(info) => self.on_header(info),
                Frame::Data(chunk) => self.c2h_chunk(chunk),
                Frame::DataEnd { digest_ok } => self.data_end(digest_ok),
            }
        }
    }

    /// The next bytes of the PDU's data, received into the receive buffer.
    fn c2h_chunk(&mut self, chunk: &[u8]) {
        let RxPdu::C2H { tag, offset, .. } = &mut self.rx_pdu else { return };
        let s = &mut self.slots[usize::from(*tag)];
        if let Some(b) = s.buf.as_mut() {
            let o = *offset as usize;
            b.as_full_mut()[o..o + chunk.len()].copy_from_slice(chunk);
        }
        let n = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        s.received += n;
        *offset += n;
    }

    /// The PDU's data is all in (and its digest checked, if it has one).
    fn data_end(&mut self, digest_ok: bool) {
        match std::mem::replace(&mut self.rx_pdu, RxPdu::Other) {
            RxPdu::C2H { tag, success, last, .. } => self.c2h_done(Some(tag), digest_ok, success, last),
            RxPdu::Term => self.fail("controller terminated the connection (C2HTermReq)".into()),
            RxPdu::Other => {}
        }
    }

    fn on_header(&mut self, info: PduInfo) {
        match info.header {
            Header::IcResp(r) => {
                if self.state != QueueState::AwaitIcResp {
                    return self.fatal(FatalError::sequence(), &[]);
                }
                if r.digests != self.cfg.digests {
                    return self
                        .fail(format!("controller enabled digests {:?}, asked {:?}", r.digests, self.cfg.digests));
                }
                self.maxh2cdata = r.maxh2cdata;
                self.enc = EncoderConfig { digests: r.digests, data_align: (usize::from(r.cpda) + 1) * 4 };
                self.framer.decoder.config = DecoderConfig {
                    receiver: Role::Host,
                    digests: r.digests,
                    established: true,
                    data_align: 4,
                    max_in_capsule: 0,
                    max_data_pdu: 64 << 20,
                };
                self.send_connect();
            }
            Header::C2HTermReq(t) => {
                tracing::warn!(qid = self.cfg.qid.0, fes = t.fes, fei = t.fei, "C2HTermReq from controller");
                self.rx_pdu = RxPdu::Term;
                if info.layout.data_len == 0 {
                    self.rx_pdu = RxPdu::Other;
                    self.fail(format!("controller terminated the connection (FES {}, FEI {})", t.fes, t.fei));
                }
            }
            Header::CapsuleResp(cqe) => self.on_cqe(cqe),
            Header::C2HData(d) => {
                let tag = d.cccid.0;
                let ok = self.slots.get(usize::from(tag)).is_some_and(|s| {
                    s.state == SlotState::Outstanding
                        && s.dir == DataDir::FromController
                        && d.datao == s.received
                        && d.datao.checked_add(d.datal).is_some_and(|e| e <= s.len)
                });
                if !ok {
                    return self.fatal(FatalError { fes: nvme::tcp::Fes::DataOutOfRange, fei: 0 }, &[]);
                }
                self.rx_pdu = RxPdu::C2H { tag, offset: d.datao, success: d.success, last: d.last };
            }
            Header::R2T(r) => self.on_r2t(r),
            Header::IcReq(_) | Header::H2CTermReq(_) | Header::CapsuleCmd(_) | Header::H2CData(_) => {
                self.fatal(FatalError::field(0), &[]);
            }
        }
    }

    fn send_connect(&mut self) {
        let ct = connect_tag(self.tag_space());
        let cmd = ConnectCmd {
            recfmt: 0,
            qid: self.cfg.qid,
            sqsize: self.cfg.entries.saturating_sub(1),
            cattr: if self.cfg.disable_sqflow { nvme::fabrics::CATTR_DISABLE_SQFLOW } else { 0 },
            kato_ms: if self.cfg.qid.is_admin() { self.cfg.kato_ms } else { 0 },
        };
        let sqe = cmd.to_sqe(Cid(ct));
        let data = ConnectData {
            hostid: self.cfg.hostid,
            cntlid: self.cfg.cntlid,
            subnqn: self.cfg.subnqn.clone(),
            hostnqn: self.cfg.hostnqn.clone(),
        }
        .encode();
        self.scratch.clear();
        let w = self.enc.capsule_cmd(&mut self.scratch, &sqe, data.len());
        self.tx.push_bytes(&self.scratch);
        self.tx.push_bytes(&data);
        if w.ddgst {
            self.tx.push_bytes(&crc32c(&data).to_le_bytes());
        }
        if self.transition(QueueState::AwaitConnect) {
            self.slots[usize::from(ct)].state = SlotState::Outstanding;
        }
    }

    fn on_cqe(&mut self, cqe: Cqe) {
        let tag = cqe.cid.0;
        if self.state == QueueState::AwaitConnect && tag == connect_tag(self.tag_space()) {
            self.slots[usize::from(tag)].state = SlotState::Free;
            if cqe.status.is_success() {
                if self.cfg.qid.is_admin() {
                    self.cntlid = Cntlid((cqe.dw0 & 0xffff) as u16);
                }
                let ascr = cqe.dw0 & nvme::auth::CONNECT_AUTHREQ_ASCR != 0;
                if ascr && !self.cfg.concat {
                    // Linux `nvmf_connect_admin_queue` refuses the same without `--concat`.
                    return self.fail(
                        "the controller requires authentication with secure channel concatenation \
                         (ASCR): connect with --concat and a DH-HMAC-CHAP secret"
                            .into(),
                    );
                }
                let next = if ascr || cqe.dw0 & nvme::auth::CONNECT_AUTHREQ_ATR != 0 {
                    QueueState::Authenticating
                } else {
                    QueueState::Live
                };
                if !self.transition(next) {
                    // Refused (logged): the queue failed instead.
                    return;
                }
            } else {
                self.fail(format!("Connect refused: {} (dw0 {:#x})", cqe.status, cqe.dw0));
            }
            return;
        }
        let space = self.tag_space();
        match self.slots.get_mut(usize::from(tag)) {
            // The caller's tags, and the reserved one while a control command holds it.
            Some(s) if s.state == SlotState::Outstanding && (tag < space || self.control_inflight) => {
                s.cqe = Some(cqe);
                if !s.buf_in_flight {
                    self.finish(tag);
                }
            }
            _ => {
                self.fail(format!("completion for unknown command id {tag}"));
            }
        }
    }

    fn c2h_done(&mut self, tag: Option<u16>, digest_ok: bool, success: bool, last: bool) {
        let Some(tag) = tag else { return };
        if !digest_ok {
            // A data digest error fails the command (NVMe/TCP 1.0 §3.6.2.4); the
            // connection stays. Record it: the CQE (or SUCCESS) that follows is overridden.
            let s = &mut self.slots[usize::from(tag)];
            s.cqe = Some(Cqe::with_status(Cid(tag), Status::TRANSIENT_TRANSPORT_ERROR));
        }
        if success && last {
            let s = &mut self.slots[usize::from(tag)];
            if s.cqe.is_none() {
                s.cqe = Some(Cqe::success(Cid(tag)));
            }
            self.finish(tag);
        }
    }

    fn on_r2t(&mut self, r: nvme::tcp::R2t) {
        let tag = r.cccid.0;
        let ok = self.slots.get(usize::from(tag)).is_some_and(|s| {
            s.state == SlotState::Outstanding
                && s.dir == DataDir::ToController
                && !s.buf_in_flight
                && s.buf.is_some()
                && r.r2to.checked_add(r.r2tl).is_some_and(|e| e <= s.len)
        });
        if !ok {
            return self.fatal(FatalError { fes: nvme::tcp::Fes::DataOutOfRange, fei: 0 }, &[]);
        }
        let Some(buf) = self.slots[usize::from(tag)].buf.take() else { return };
        let max = self.maxh2cdata.max(4096);
        let mut off = r.r2to;
        let end = r.r2to + r.r2tl;
        let ddgst = self.enc.digests.data;
        let mut digests = [0u32; 64];
        let mut nd = 0;
        // Headers and digests go into the batch; the data segments reference the caller's buffer.
        let mut chunks: [(u32, u32); 64] = [(0, 0); 64];
        while off < end && nd < 64 {
            let n = (end - off).min(max);
            chunks[nd] = (off, n);
            if ddgst {
                digests[nd] = crc32c(&buf.as_full()[off as usize..(off + n) as usize]);
            }
            nd += 1;
            off += n;
        }
        if off < end {
            // More than 64 PDUs for one R2T would need a larger MAXH2CDATA than this controller gives.
            self.slots[usize::from(tag)].buf = Some(buf);
            return self.fail("R2T needs more than 64 H2CData PDUs".into());
        }
        // One send batch carries every PDU; the buffer rides in it once, its ranges as segments.
        // SendMsg owns whole buffers, so the buffer is pushed once with its full used range and
        // the PDU headers are interleaved only when there is a single PDU; otherwise data is copied.
        if nd == 1 {
            let (o, n) = chunks[0];
            let d = DataHeader { cccid: r.cccid, ttag: r.ttag, datao: o, datal: n, last: true, success: false };
            self.scratch.clear();
            self.enc.h2c_data(&mut self.scratch, &d);
            self.tx.push_bytes(&self.scratch);
            match self.tx.push_buf(buf, o as usize..(o + n) as usize) {
                Ok(()) => {
                    self.tx_owners.push(tag);
                    self.slots[usize::from(tag)].buf_in_flight = true;
                }
                Err((e, b)) => {
                    self.slots[usize::from(tag)].buf = Some(b);
                    return self.fail(format!("send batch refused a buffer: {e}"));
                }
            }
            if ddgst {
                self.tx.push_bytes(&digests[0].to_le_bytes());
            }
        } else {
            for (i, &(o, n)) in chunks[..nd].iter().enumerate() {
                let d =
                    DataHeader { cccid: r.cccid, ttag: r.ttag, datao: o, datal: n, last: i + 1 == nd, success: false };
                self.scratch.clear();
                self.enc.h2c_data(&mut self.scratch, &d);
                self.tx.push_bytes(&self.scratch);
                self.tx.push_bytes(&buf.as_full()[o as usize..(o + n) as usize]);
                if ddgst {
                    self.tx.push_bytes(&digests[i].to_le_bytes());
                }
            }
            self.slots[usize::from(tag)].buf = Some(buf);
        }
    }

    fn finish(&mut self, tag: u16) {
        if tag == self.tag_space() {
            self.control_inflight = false;
        }
        let s = &mut self.slots[usize::from(tag)];
        let Some(mut cqe) = s.cqe.take() else { return };
        cqe.cid = Cid(tag);
        let mut buf = s.buf.take();
        if s.dir == DataDir::FromController
            && let Some(b) = buf.as_mut()
        {
            b.set_len((s.received as usize).min(b.capacity()));
        }
        s.state = SlotState::Free;
        self.outstanding -= 1;
        self.done.push(Done { token: s.token, tag, cqe, buf });
    }

    /// Finished commands since the last call (the vector is reused: drain it).
    pub fn completions(&mut self) -> &mut Vec<Done> {
        &mut self.done
    }

    /// Fails every outstanding command with `status` (after the queue failed),
    /// handing back their buffers. Buffers still in a send batch come back
    /// when the driver returns the batch.
    pub fn abort_all(&mut self, status: Status) {
        // The reserved tag only while a control command holds it: an unanswered Connect
        // there is not a command of the caller's (found by fuzzing).
        let end = self.tag_space() + u16::from(self.control_inflight);
        for tag in 0..end {
            let s = &mut self.slots[usize::from(tag)];
            if s.state == SlotState::Outstanding {
                s.cqe = Some(Cqe::with_status(Cid(tag), status));
                if !s.buf_in_flight {
                    self.finish(tag);
                }
            }
        }
        self.aborted = true;
        // A batch the channel holds with no send in flight will not be sent now: its
        // write buffers come back to their commands.
        if let Some(ch) = self.tls.as_mut()
            && !ch.send_in_flight()
            && let Some(b) = ch.take_batch()
        {
            self.plain_send_done(b, Err(std::io::Error::other("queue failed")));
        }
        self.return_unsent();
    }

    // ------------------------------------------------------------------ send

    /// The next batch to send, if any and none is in flight.
    pub fn take_send(&mut self) -> Option<SendMsg> {
        if self.tls.is_some() {
            return self.tls_take_send();
        }
        self.take_plain_send()
    }

    /// The next batch of the queue's own (plaintext) bytes.
    fn take_plain_send(&mut self) -> Option<SendMsg> {
        if self.tx_inflight || self.tx.is_empty() {
            return None;
        }
        let spare = self.tx_spare.take().unwrap_or_default();
        self.tx_inflight = true;
        self.pending_cmds = 0;
        std::mem::swap(&mut self.inflight_owners, &mut self.tx_owners);
        self.tx_owners.clear();
        Some(std::mem::replace(&mut self.tx, spare))
    }

    /// Whether bytes wait to be sent.
    pub fn has_pending_send(&self) -> bool {
        !self.tx.is_empty() || self.tls.as_ref().is_some_and(|ch| ch.has_output())
    }

    /// A batch was sent (or failed); write buffers it carried go back to their commands.
    pub fn on_send_done(&mut self, msg: SendMsg, result: std::io::Result<()>) {
        if self.tls.is_some() {
            return self.tls_send_done(msg, result);
        }
        self.plain_send_done(msg, result);
    }

    /// After [`HostQueue::abort_all`], the queue's own batch that no send took (its driver
    /// sends nothing more once it aborted): the write buffers it gathers come back to their
    /// commands, which finish now. With a send still in flight, that send's return does it.
    fn return_unsent(&mut self) {
        // (`take_plain_send` gives nothing while a batch is out, in the secure channel too.)
        if self.aborted
            && let Some(b) = self.take_plain_send()
        {
            self.plain_send_done(b, Err(std::io::Error::other("queue aborted")));
        }
    }

    /// The queue's own batch went out (or failed).
    fn plain_send_done(&mut self, mut msg: SendMsg, result: std::io::Result<()>) {
        self.tx_inflight = false;
        let mut owners = std::mem::take(&mut self.inflight_owners);
        for (b, tag) in msg.drain_bufs().zip(owners.iter().copied()) {
            let s = &mut self.slots[usize::from(tag)];
            s.buf = Some(b);
            s.buf_in_flight = false;
        }
        msg.clear();
        self.tx_spare = Some(msg);
        if let Err(e) = result {
            self.fail(format!("send failed: {e}"));
        }
        // Writes whose response arrived while their buffer was still being sent.
        for &tag in &owners {
            let s = &self.slots[usize::from(tag)];
            if s.state == SlotState::Outstanding && s.cqe.is_some() {
                self.finish(tag);
            }
        }
        owners.clear();
        self.inflight_owners = owners;
        self.return_unsent();
    }
}

#[cfg(test)]
mod tests {
    //! The queue without a socket: the controller's bytes are encoded here and fed in,
    //! the host's batches are taken and decoded by their common headers.

    use nvme::Nsid;
    use nvme::opcode::io as opc;
    use nvme::tcp::{CommonHeader, IcResp, PduType, R2t};

    use super::*;

    const ENTRIES: u16 = 4;

    fn config(entries: u16, tag_space: u16) -> QueueConfig {
        let cfg = QueueConfig::io(
            1,
            entries,
            Cntlid(1),
            "nqn.2026-11.io.qpath:unit",
            "nqn.2014-08.org.nvmexpress:uuid:unit",
            [0; 16],
        );
        QueueConfig { tag_space, ..cfg }
    }

    /// Everything the queue has to send, each batch completed at once.
    fn sent(q: &mut HostQueue) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(m) = q.take_send() {
            out.extend_from_slice(&m.to_vec());
            q.on_send_done(m, Ok(()));
        }
        out
    }

    /// The PDU types in a byte stream, in order.
    fn pdu_types(mut b: &[u8]) -> Vec<u8> {
        let mut types = Vec::new();
        while let Some(ch) = CommonHeader::peek(b) {
            types.push(ch.pdu_type);
            b = &b[ch.plen as usize..];
        }
        types
    }

    fn ic_resp(q: &mut HostQueue) {
        q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    }

    fn respond(q: &mut HostQueue, cqe: Cqe) {
        let mut out = Vec::new();
        EncoderConfig::default().capsule_resp(&mut out, &cqe);
        q.feed(&out);
    }

    fn connect_response(q: &mut HostQueue, dw0: u32) {
        let mut cqe = Cqe::success(Cid(q.tag_space()));
        cqe.dw0 = dw0;
        respond(q, cqe);
    }

    fn live_with(cfg: QueueConfig) -> HostQueue {
        let mut q = HostQueue::new(cfg);
        sent(&mut q);
        ic_resp(&mut q);
        sent(&mut q);
        connect_response(&mut q, 0);
        assert_eq!(q.state(), QueueState::Live, "{:?}", q.error());
        q
    }

    fn live() -> HostQueue {
        live_with(config(ENTRIES, ENTRIES))
    }

    fn flush_io(token: u64) -> Io {
        Io { sqe: Sqe::flush(Cid(0), Nsid(1)), buf: None, len: 0, dir: DataDir::None, token }
    }

    fn read_io(len: u32, token: u64) -> Io {
        let sqe = Sqe::rw(opc::READ, Cid(0), Nsid(1), 0, len / 512 - 1, SglDescriptor::transport(len));
        Io { sqe, buf: Some(IoBuf::new(len as usize)), len, dir: DataDir::FromController, token }
    }

    fn write_io(len: u32, token: u64) -> Io {
        let sqe = Sqe::rw(opc::WRITE, Cid(0), Nsid(1), 0, len / 512 - 1, SglDescriptor::transport(len));
        let mut buf = IoBuf::new((len as usize).next_multiple_of(4096));
        buf.set_len(len as usize);
        buf.fill(0xa5);
        Io { sqe, buf: Some(buf), len, dir: DataDir::ToController, token }
    }

    fn submit(q: &mut HostQueue, tag: u16, io: Io) {
        q.submit(tag, io).map_err(|(e, _)| e).unwrap();
    }

    fn c2h(tag: u16, datao: u32, data: &[u8], last: bool, success: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let datal = u32::try_from(data.len()).unwrap();
        let d = DataHeader { cccid: Cid(tag), ttag: 0, datao, datal, last, success };
        EncoderConfig::default().c2h_data(&mut out, &d);
        out.extend_from_slice(data);
        out
    }

    fn r2t(tag: u16, r2to: u32, r2tl: u32) -> Vec<u8> {
        let mut out = Vec::new();
        EncoderConfig::default().r2t(&mut out, &R2t { cccid: Cid(tag), ttag: 1, r2to, r2tl });
        out
    }

    /// (token, tag, status, buffer capacity) of the completions so far.
    fn drain(q: &mut HostQueue) -> Vec<(u64, u16, Status, Option<usize>)> {
        q.completions().drain(..).map(|d| (d.token, d.tag, d.cqe.status, d.buf.as_ref().map(IoBuf::capacity))).collect()
    }

    #[test]
    fn queue_states_change_only_along_the_handshake_and_any_state_may_fail() {
        use QueueState::*;
        let all = [AwaitIcResp, AwaitConnect, Authenticating, Live, Failed];
        let legal =
            [(AwaitIcResp, AwaitConnect), (AwaitConnect, Live), (AwaitConnect, Authenticating), (Authenticating, Live)];
        for from in all {
            for to in all {
                let got = from.transition(to);
                if to == Failed || legal.contains(&(from, to)) {
                    assert_eq!(got, Ok(to), "{from:?} -> {to:?}");
                } else {
                    assert_eq!(got, Err(BadTransition { from, to }), "{from:?} -> {to:?}");
                }
            }
        }
        // A failed queue stays failed.
        assert!(Failed.transition(Live).is_err());
        // On the queue: `authenticated` on a live queue changes nothing.
        let mut q = live();
        q.authenticated();
        assert_eq!(q.state(), Live);
        assert!(!q.was_authenticated());
    }

    #[test]
    fn the_handshake_sends_icreq_then_connect_and_only_then_takes_commands() {
        let mut q = HostQueue::new(config(ENTRIES, ENTRIES));
        assert_eq!(q.state(), QueueState::AwaitIcResp);
        assert_eq!(pdu_types(&sent(&mut q)), [PduType::IcReq as u8]);
        assert_eq!(q.submit(0, flush_io(1)).unwrap_err().0, SubmitError::NotLive);

        ic_resp(&mut q);
        assert_eq!(q.state(), QueueState::AwaitConnect);
        let connect = sent(&mut q);
        assert_eq!(pdu_types(&connect), [PduType::CapsuleCmd as u8]);
        // The Connect rides on the reserved tag, one past the caller's (SQE CID at bytes 2..4).
        let sqe = &connect[8..];
        assert_eq!(u16::from_le_bytes([sqe[2], sqe[3]]), ENTRIES);
        assert_eq!(q.maxh2cdata(), 65536);
        assert_eq!(q.submit(0, flush_io(1)).unwrap_err().0, SubmitError::NotLive);

        connect_response(&mut q, 0);
        assert_eq!(q.state(), QueueState::Live);
        assert!(drain(&mut q).is_empty(), "the Connect is not the caller's command");
        assert!(!q.was_authenticated());
        submit(&mut q, 0, flush_io(1));
        assert_eq!(pdu_types(&sent(&mut q)), [PduType::CapsuleCmd as u8]);
    }

    #[test]
    fn a_refused_connect_fails_the_queue_with_its_status() {
        let mut q = HostQueue::new(config(ENTRIES, ENTRIES));
        sent(&mut q);
        ic_resp(&mut q);
        sent(&mut q);
        respond(&mut q, Cqe::with_status(Cid(ENTRIES), Status::INVALID_FIELD));
        assert_eq!(q.state(), QueueState::Failed);
        assert!(q.error().unwrap().starts_with("Connect refused"), "{:?}", q.error());
        assert!(q.take_recv_buf().is_none(), "a failed queue wants no more input");
    }

    #[test]
    fn an_authenticating_queue_takes_only_authentication_commands_until_authenticated() {
        let mut q = HostQueue::new(config(ENTRIES, ENTRIES));
        sent(&mut q);
        ic_resp(&mut q);
        sent(&mut q);
        connect_response(&mut q, nvme::auth::CONNECT_AUTHREQ_ATR);
        assert_eq!(q.state(), QueueState::Authenticating);
        assert_eq!(q.submit(0, flush_io(1)).unwrap_err().0, SubmitError::NotLive);
        let auth = Io {
            sqe: Sqe::fabrics(Cid(0), nvme::opcode::fctype::AUTH_SEND),
            buf: None,
            len: 0,
            dir: DataDir::None,
            token: 2,
        };
        submit(&mut q, 0, auth);
        respond(&mut q, Cqe::success(Cid(0)));
        assert_eq!(drain(&mut q), [(2, 0, Status::SUCCESS, None)]);
        q.authenticated();
        assert_eq!(q.state(), QueueState::Live);
        assert!(q.was_authenticated());
        submit(&mut q, 0, flush_io(3));
    }

    #[test]
    fn a_second_icresp_is_a_sequence_error_answered_with_a_termreq() {
        let mut q = live();
        ic_resp(&mut q);
        assert_eq!(q.state(), QueueState::Failed);
        assert_eq!(pdu_types(&sent(&mut q)), [PduType::H2CTermReq as u8]);
        assert!(q.error().unwrap().contains("protocol error"), "{:?}", q.error());
    }

    #[test]
    fn completions_come_in_the_order_responses_arrive_with_their_tokens_and_statuses() {
        let mut q = live();
        for tag in 0..ENTRIES {
            submit(&mut q, tag, flush_io(100 + u64::from(tag)));
        }
        assert_eq!(pdu_types(&sent(&mut q)), [PduType::CapsuleCmd as u8; ENTRIES as usize]);
        assert_eq!(q.outstanding(), usize::from(ENTRIES));
        let mut order = Vec::new();
        for (tag, status) in [(2, Status::SUCCESS), (0, Status::LBA_OUT_OF_RANGE), (3, Status::SUCCESS)] {
            respond(&mut q, Cqe::with_status(Cid(tag), status));
            order.extend(drain(&mut q));
        }
        assert_eq!(
            order,
            [
                (102, 2, Status::SUCCESS, None),
                (100, 0, Status::LBA_OUT_OF_RANGE, None),
                (103, 3, Status::SUCCESS, None)
            ]
        );
        assert_eq!(q.outstanding(), 1);
        assert_eq!(q.sqe_of(1).map(Sqe::opcode), Some(opc::FLUSH));
        assert!(q.sqe_of(2).is_none(), "a finished tag carries no command");
        // A finished tag is free again; the outstanding one is not.
        submit(&mut q, 2, flush_io(200));
        assert_eq!(q.submit(1, flush_io(201)).unwrap_err().0, SubmitError::BadTag(1));
        // Several responses in one receive complete in their order in it.
        let mut both = Vec::new();
        EncoderConfig::default().capsule_resp(&mut both, &Cqe::success(Cid(1)));
        EncoderConfig::default().capsule_resp(&mut both, &Cqe::success(Cid(2)));
        q.feed(&both);
        assert_eq!(drain(&mut q).iter().map(|d| d.0).collect::<Vec<_>>(), [101, 200]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn tags_run_out_at_the_queue_size_and_a_refused_command_comes_back_whole() {
        // Eight tags (a share of a larger set) over a queue of four entries.
        let mut q = live_with(config(ENTRIES, 8));
        assert_eq!(q.tag_space(), 8);
        for tag in [0, 5, 6, 7] {
            submit(&mut q, tag, flush_io(u64::from(tag)));
        }
        // Every entry is taken: a free tag is refused too.
        let (e, io) = q.submit(1, read_io(4096, 41)).unwrap_err();
        assert_eq!(e, SubmitError::Full);
        assert_eq!((io.token, io.buf.as_ref().map(IoBuf::capacity)), (41, Some(4096)), "the command comes back");
        // Out of range: the reserved tag and beyond.
        assert_eq!(q.submit(8, flush_io(8)).unwrap_err().0, SubmitError::BadTag(8));
        assert_eq!(q.submit(9, flush_io(9)).unwrap_err().0, SubmitError::BadTag(9));
        respond(&mut q, Cqe::success(Cid(6)));
        assert_eq!(drain(&mut q).len(), 1);
        submit(&mut q, 1, io);
        // A buffer smaller than the transfer is refused before anything is sent.
        respond(&mut q, Cqe::success(Cid(7)));
        drain(&mut q);
        let mut short = read_io(4096, 3);
        short.len = 8192;
        assert_eq!(q.submit(2, short).unwrap_err().0, SubmitError::BadLength);
        assert_eq!(q.outstanding(), 3);
    }

    #[test]
    fn a_read_completes_on_its_last_c2h_with_success_and_its_data_in_the_buffer() {
        let mut q = live();
        submit(&mut q, 1, read_io(8192, 7));
        sent(&mut q);
        let data: Vec<u8> = (0..8192u32).map(|i| u8::try_from(i % 251).unwrap()).collect();
        q.feed(&c2h(1, 0, &data[..4096], false, false));
        assert!(drain(&mut q).is_empty(), "half the data");
        q.feed(&c2h(1, 4096, &data[4096..], true, true));
        let d = q.completions().pop().expect("completed without a response capsule");
        assert_eq!((d.token, d.tag, d.cqe.status), (7, 1, Status::SUCCESS));
        let buf = d.buf.unwrap();
        assert_eq!(&buf[..], &data[..], "the data, and the buffer's length set to what arrived");
        // Without SUCCESS the response capsule finishes the read.
        submit(&mut q, 1, read_io(4096, 8));
        q.feed(&c2h(1, 0, &data[..4096], true, false));
        assert!(drain(&mut q).is_empty());
        respond(&mut q, Cqe::success(Cid(1)));
        assert_eq!(drain(&mut q), [(8, 1, Status::SUCCESS, Some(4096))]);
    }

    #[test]
    fn c2h_data_for_an_idle_tag_or_out_of_order_fails_the_queue() {
        let mut q = live();
        q.feed(&c2h(2, 0, &[0; 512], true, true));
        assert_eq!(q.state(), QueueState::Failed);
        assert_eq!(pdu_types(&sent(&mut q)), [PduType::H2CTermReq as u8]);

        let mut q = live();
        submit(&mut q, 0, read_io(8192, 1));
        q.feed(&c2h(0, 4096, &[0; 4096], true, true));
        assert_eq!(q.state(), QueueState::Failed, "data offset past what was received");
        q.abort_all(Status::HOST_PATH_ERROR);
        assert_eq!(drain(&mut q), [(1, 0, Status::HOST_PATH_ERROR, Some(8192))]);
    }

    #[test]
    fn a_write_completes_only_once_its_response_and_its_buffer_are_both_back() {
        let mut q = live();
        // Larger than the in-capsule limit: the controller asks for it with an R2T.
        submit(&mut q, 3, write_io(16384, 9));
        let cmd = sent(&mut q);
        let ch = CommonHeader::peek(&cmd).unwrap();
        assert_eq!((ch.pdu_type, ch.plen), (PduType::CapsuleCmd as u8, 72), "no data in the capsule");
        q.feed(&r2t(3, 0, 16384));
        let batch = q.take_send().expect("H2CData");
        let bytes = batch.to_vec();
        assert_eq!(pdu_types(&bytes), [PduType::H2CData as u8]);
        assert!(bytes[bytes.len() - 16384..].iter().all(|&b| b == 0xa5), "the caller's data");
        // The response overtakes the send's completion: the buffer is still in the batch.
        respond(&mut q, Cqe::success(Cid(3)));
        assert!(drain(&mut q).is_empty(), "completed while the buffer was in flight");
        assert_eq!(q.outstanding(), 1);
        q.on_send_done(batch, Ok(()));
        assert_eq!(drain(&mut q), [(9, 3, Status::SUCCESS, Some(16384))]);
        assert_eq!(q.outstanding(), 0);

        // A small write travels in the capsule, gathered from the caller's buffer: the same
        // rule holds, the response may overtake the batch that carries the data.
        submit(&mut q, 0, write_io(512, 10));
        let batch = q.take_send().expect("the capsule");
        let cmd = batch.to_vec();
        assert_eq!(CommonHeader::peek(&cmd).unwrap().plen, 72 + 512);
        assert!(cmd[72..].iter().all(|&b| b == 0xa5), "the caller's data follows the header");
        respond(&mut q, Cqe::success(Cid(0)));
        assert!(drain(&mut q).is_empty(), "completed while its in-capsule data was in flight");
        q.on_send_done(batch, Ok(()));
        assert_eq!(drain(&mut q), [(10, 0, Status::SUCCESS, Some(4096))]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn in_capsule_writes_send_the_callers_buffer_without_copying_it() {
        let mut q = live();
        for tag in 0..4u16 {
            let mut io = write_io(4096, u64::from(tag));
            io.buf.as_mut().unwrap().fill(tag.to_le_bytes()[0] + 1);
            submit(&mut q, tag, io);
        }
        let batch = q.take_send().expect("four capsules");
        // Only the headers were copied into the batch; each write's data is its own buffer.
        assert_eq!(batch.header().len(), 4 * 72, "capsule headers only");
        assert_eq!(batch.len(), 4 * (72 + 4096));
        let bytes = batch.to_vec();
        for tag in 0..4usize {
            let at = tag * (72 + 4096);
            assert_eq!(pdu_types(&bytes[at..at + 72 + 4096]), [PduType::CapsuleCmd as u8]);
            assert!(
                bytes[at + 72..at + 72 + 4096].iter().all(|&b| b == tag.to_le_bytes()[0] + 1),
                "write {tag}'s data"
            );
        }
        q.on_send_done(batch, Ok(()));
        for tag in 0..4u16 {
            respond(&mut q, Cqe::success(Cid(tag)));
        }
        assert_eq!(drain(&mut q).len(), 4);
    }

    #[test]
    fn a_batch_of_more_writes_than_iovecs_copies_the_rest_and_stays_sendable() {
        let mut q = live_with(config(1024, 1024));
        for tag in 0..700u16 {
            let mut io = write_io(512, u64::from(tag));
            io.buf.as_mut().unwrap().fill(tag.to_le_bytes()[0]);
            submit(&mut q, tag, io);
        }
        let batch = q.take_send().expect("700 capsules");
        assert!(batch.segments() <= uring::SEND_SEGMENTS_MAX, "{} segments", batch.segments());
        let bytes = batch.to_vec();
        assert_eq!(bytes.len(), 700 * (72 + 512));
        for tag in 0..700usize {
            let at = tag * (72 + 512) + 72;
            assert!(bytes[at..at + 512].iter().all(|&b| b == tag.to_le_bytes()[0]), "write {tag}'s data");
        }
        q.on_send_done(batch, Ok(()));
        for tag in 0..700u16 {
            respond(&mut q, Cqe::success(Cid(tag)));
        }
        assert_eq!(drain(&mut q).len(), 700);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn in_capsule_data_keeps_its_digest() {
        let mut cfg = config(ENTRIES, ENTRIES);
        cfg.digests = Digests { header: false, data: true };
        let mut q = HostQueue::new(cfg);
        sent(&mut q);
        q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests { header: false, data: true }, maxh2cdata: 65536 }.encode());
        sent(&mut q);
        connect_response(&mut q, 0);
        assert_eq!(q.state(), QueueState::Live, "{:?}", q.error());
        submit(&mut q, 1, write_io(4096, 1));
        let bytes = sent(&mut q);
        let ch = CommonHeader::peek(&bytes).unwrap();
        assert_eq!(ch.plen as usize, bytes.len());
        let data = &bytes[bytes.len() - 4 - 4096..bytes.len() - 4];
        assert!(data.iter().all(|&b| b == 0xa5));
        assert_eq!(bytes[bytes.len() - 4..], crc32c(data).to_le_bytes(), "the data digest follows the data");
    }

    #[test]
    fn aborting_returns_in_capsule_write_buffers_of_a_batch_never_sent() {
        let mut q = live();
        submit(&mut q, 0, write_io(4096, 1));
        q.set_failed("connection reset");
        q.abort_all(Status::HOST_PATH_ERROR);
        assert_eq!(drain(&mut q), [(1, 0, Status::HOST_PATH_ERROR, Some(4096))]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn aborting_returns_write_buffers_of_a_batch_never_sent() {
        let mut q = live();
        submit(&mut q, 0, write_io(16384, 1));
        sent(&mut q);
        // The H2CData for the R2T gathers the caller's buffer; the queue fails before its
        // driver took that batch, and nothing will send it.
        q.feed(&r2t(0, 0, 16384));
        q.set_failed("connection reset");
        q.abort_all(Status::HOST_PATH_ERROR);
        assert_eq!(drain(&mut q), [(1, 0, Status::HOST_PATH_ERROR, Some(16384))]);
        assert_eq!(q.outstanding(), 0);
        assert!(q.take_send().is_none());
    }

    #[test]
    fn aborting_during_a_send_returns_the_next_batchs_write_buffers_with_it() {
        let mut q = live();
        submit(&mut q, 0, write_io(16384, 1));
        submit(&mut q, 1, write_io(16384, 2));
        sent(&mut q);
        q.feed(&r2t(0, 0, 16384));
        let first = q.take_send().expect("the first H2CData");
        // Gathered while the first batch is out.
        q.feed(&r2t(1, 0, 16384));
        q.set_failed("connection reset");
        q.abort_all(Status::HOST_PATH_ERROR);
        assert!(drain(&mut q).is_empty(), "both buffers are still in batches");
        q.on_send_done(first, Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        let mut done = drain(&mut q);
        done.sort_unstable_by_key(|d| d.0);
        assert_eq!(done, [(1, 0, Status::HOST_PATH_ERROR, Some(16384)), (2, 1, Status::HOST_PATH_ERROR, Some(16384))]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn an_r2t_for_a_read_or_beyond_the_write_fails_the_queue() {
        let mut q = live();
        submit(&mut q, 0, read_io(4096, 1));
        q.feed(&r2t(0, 0, 4096));
        assert_eq!(q.state(), QueueState::Failed);

        let mut q = live();
        submit(&mut q, 0, write_io(16384, 1));
        sent(&mut q);
        q.feed(&r2t(0, 8192, 16384));
        assert_eq!(q.state(), QueueState::Failed);
    }

    #[test]
    fn losing_the_connection_aborts_every_command_and_hands_every_buffer_back() {
        let mut q = live();
        submit(&mut q, 0, read_io(4096, 1));
        submit(&mut q, 1, flush_io(2));
        submit(&mut q, 2, write_io(16384, 3));
        sent(&mut q);
        q.feed(&r2t(2, 0, 16384));
        let batch = q.take_send().expect("H2CData");
        // The controller closes the connection (a receive of 0 bytes).
        let (buf, _) = q.take_recv_buf().unwrap();
        q.on_recv(buf, 0);
        assert_eq!(q.state(), QueueState::Failed);
        assert!(q.error().unwrap().contains("closed"), "{:?}", q.error());
        assert!(q.take_recv_buf().is_none());
        assert_eq!(q.submit(3, flush_io(4)).unwrap_err().0, SubmitError::NotLive);
        q.abort_all(Status::HOST_PATH_ERROR);
        assert_eq!(
            drain(&mut q),
            [(1, 0, Status::HOST_PATH_ERROR, Some(4096)), (2, 1, Status::HOST_PATH_ERROR, None)],
            "the write's buffer is still in the send batch"
        );
        assert_eq!(q.outstanding(), 1);
        q.on_send_done(batch, Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        assert_eq!(drain(&mut q), [(3, 2, Status::HOST_PATH_ERROR, Some(16384))]);
        assert_eq!(q.outstanding(), 0);
        // Aborting again finds nothing.
        q.abort_all(Status::HOST_PATH_ERROR);
        assert!(drain(&mut q).is_empty());
    }

    #[test]
    fn a_failed_send_or_a_response_for_an_unknown_command_fails_the_queue() {
        let mut q = live();
        submit(&mut q, 0, flush_io(1));
        let batch = q.take_send().unwrap();
        assert!(q.take_send().is_none(), "one batch in flight at a time");
        q.on_send_done(batch, Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert_eq!(q.state(), QueueState::Failed);
        assert!(q.error().unwrap().starts_with("send failed"), "{:?}", q.error());

        let mut q = live();
        respond(&mut q, Cqe::success(Cid(3)));
        assert_eq!(q.state(), QueueState::Failed);
        assert!(q.error().unwrap().contains("unknown command id 3"), "{:?}", q.error());
        // The first reason stays.
        q.set_failed("later");
        assert!(q.error().unwrap().contains("unknown command id 3"));
    }

    #[test]
    fn a_termreq_from_the_controller_fails_the_queue_after_its_data() {
        let mut q = live();
        submit(&mut q, 0, flush_io(1));
        let mut term = Vec::new();
        EncoderConfig::term_req(&mut term, Role::Controller, FatalError::field(4), &[1, 2, 3, 4]);
        // Cut in two: the queue keeps skipping the error data, then fails.
        q.feed(&term[..term.len() - 2]);
        assert_eq!(q.state(), QueueState::Live);
        q.feed(&term[term.len() - 2..]);
        assert_eq!(q.state(), QueueState::Failed);
        assert!(q.error().unwrap().contains("C2HTermReq"), "{:?}", q.error());
        q.abort_all(Status::HOST_PATH_ERROR);
        assert_eq!(drain(&mut q), [(1, 0, Status::HOST_PATH_ERROR, None)]);
    }
}
