//! [`Ring`]: one io_uring instance per thread, its op slab, and the turn that submits and
//! reaps.
//!
//! How memory lent to the kernel is kept alive is documented on [`Ring`].

use std::io;
use std::marker::PhantomData;
use std::ops::Range;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{IoUring, Probe, cqueue, opcode, squeue, types};

use crate::buf::IoBuf;
use crate::error::{Error, ErrorKind};
use crate::send_msg::SendMsg;
use crate::slab::{self, INTERNAL_INDEX, Slab};
use crate::sys::EventFd;

/// Largest submission queue a ring may ask for (the kernel's own limit).
pub const RING_ENTRIES_MAX: u32 = 32_768;

/// How a [`Ring`] is built.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Submission queue entries (rounded up to a power of two by the kernel), at most
    /// [`RING_ENTRIES_MAX`]. Operations beyond this in one turn flush the queue early.
    pub entries: u32,
    /// Completion queue entries; `None` means four times `entries`, room for multishot
    /// completions and for more operations in flight than one turn submits.
    pub cq_entries: Option<u32>,
    /// Never sleep in the kernel: [`Wait::Block`] spins on non-blocking turns until a
    /// completion arrives or the timeout passes. Trades a core for the ~27 µs it costs to
    /// wake a sleeping thread.
    pub busy_poll: bool,
    /// Pass `MSG_WAITALL` to sends so the kernel itself retries short sends on stream
    /// sockets before posting a completion. The ring resubmits whatever still comes back
    /// short either way; turning this off only moves that work to user space (tests use it
    /// to exercise the resubmission path).
    pub send_waitall: bool,
    /// Op slots allocated up front. The slab grows (doubling) only when more operations
    /// are in flight than ever before.
    pub slots_initial: usize,
    /// Most caller operations in flight at once (multishot ones count while armed); a
    /// submission past it fails with [`ErrorKind::Limit`] and hands its buffer back.
    pub ops_in_flight_max: usize,
    /// The most capable completion mode to try; the ring falls back from it to the next
    /// one when the kernel refuses. Lower it only to test the fallbacks.
    pub task_run: TaskRun,
    /// How long a [`Wait::Block`] turn that submits sends may hold their completions while
    /// it waits for one completion more (a response, a new request). A send's completion
    /// alone only hands its message back: waking for it costs a system call per batch,
    /// since a send that fits the socket buffer completes during the very
    /// `io_uring_enter` that submits it. The turn waits for `1 + sends` completions (or
    /// `n + sends`, [`Ring::hold_for`]: a turn with answers due on `n` sockets, even with no
    /// send) with this as io_uring's minimum wait (`min_wait_usec`, Linux 6.12): once it passes, any
    /// completion ends the wait, so a send the socket holds back never delays a response
    /// longer than this. `None`, a kernel without the minimum wait, or a turn whose
    /// timeout is not longer than this: the turn wakes for the first completion (the
    /// default: a loop opts in).
    pub send_hold: Option<Duration>,
}

/// A [`RingConfig::send_hold`] for request/response loops: far above a loopback or LAN
/// round trip (tens of µs), so a batch's send and its first response are reaped by one
/// wake-up, and short beside the 20 ms idle waits of the serving loops.
pub const SEND_HOLD_DEFAULT: Duration = Duration::from_millis(2);

/// How the kernel runs completion work, from most to least wanted. [`Ring::new`] starts at
/// [`RingConfig::task_run`] and falls back down this list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskRun {
    /// `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG`: completion work runs only when this
    /// thread enters the ring (Linux >= 6.1).
    Deferred,
    /// `COOP_TASKRUN | TASKRUN_FLAG`: completion work waits for the next system call
    /// instead of interrupting the thread (Linux >= 5.19).
    Cooperative,
    /// No task-run flags: the kernel may interrupt the thread to run completion work.
    Plain,
}

impl Default for RingConfig {
    fn default() -> RingConfig {
        RingConfig {
            entries: 256,
            cq_entries: None,
            busy_poll: false,
            send_waitall: true,
            slots_initial: 256,
            ops_in_flight_max: 65_536,
            task_run: TaskRun::Deferred,
            send_hold: None,
        }
    }
}

/// Which optional io_uring features the ring runs with (the kernel may refuse some; the
/// ring falls back and records it here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `IORING_SETUP_SINGLE_ISSUER`: the kernel may skip submission locking.
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN`: completions run only when this thread enters the
    /// ring with `GETEVENTS`, never interrupting it.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN`: the fallback when `defer_taskrun` is refused.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_TASKRUN_FLAG`: the kernel flags pending completion work in the SQ
    /// ring, which lets a [`Wait::Poll`] turn with nothing to submit skip the system call.
    pub taskrun_flag: bool,
    /// `IORING_SETUP_SUBMIT_ALL`: a failing SQE does not stop the rest of the batch.
    pub submit_all: bool,
    /// The ring fd is registered, so `io_uring_enter` skips the fd table lookup.
    pub registered_ring_fd: bool,
    /// `IORING_FEAT_MIN_TIMEOUT` (Linux 6.12): a wait for several completions can end
    /// early once a minimum wait has passed ([`RingConfig::send_hold`]).
    pub min_wait: bool,
}

/// How long a turn may sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Never sleep: submit what is queued and reap what is ready.
    Poll,
    /// Submit, then sleep until at least one completion is ready or `timeout` passes
    /// (`None`: no limit). With [`RingConfig::busy_poll`] the ring spins instead of
    /// sleeping.
    Block {
        /// Longest sleep; `None` waits for a completion however long it takes.
        timeout: Option<Duration>,
    },
}

/// Which operation a [`Completion`] ends (or, for multishot, reports on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// [`Ring::nop`].
    Nop,
    /// [`Ring::recv`].
    Recv,
    /// [`Ring::send`].
    Send,
    /// [`Ring::read_at`].
    Read,
    /// [`Ring::write_at`].
    Write,
    /// [`Ring::fsync`].
    Fsync,
    /// [`Ring::fallocate`].
    Fallocate,
    /// [`Ring::accept_multishot`].
    Accept,
    /// [`Ring::poll_multishot`].
    Poll,
    /// [`Ring::ublk_fetch`] or [`Ring::ublk_commit_and_fetch`].
    UblkIo,
}

/// Whether `fsync` flushes metadata too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncMode {
    /// `fsync(2)`: data and all metadata.
    Full,
    /// `fdatasync(2)`: data and only the metadata needed to read it back.
    Data,
}

/// What an operation owned, handed back when it ends.
#[derive(Debug)]
pub enum Payload {
    /// The operation owned no memory (or is a multishot completion that is not the last).
    None,
    /// The buffer of a recv, read or write.
    Buf(IoBuf),
    /// The message of a send.
    Msg(SendMsg),
}

/// The result of an operation.
#[derive(Debug)]
pub struct Completion {
    /// The caller's token, as given at submission.
    pub token: u64,
    /// Which operation this is.
    pub op: OpKind,
    /// `>= 0`: success (bytes moved, the accepted fd, the poll mask); `< 0`: negative errno.
    ///
    /// Recv: bytes received, 0 at EOF; the buffer's length becomes `range.start + result`.
    /// Send: the whole message length (short sends are finished inside the ring).
    /// Read: bytes read (short only at end of file); the buffer's length becomes `result`.
    /// Write: the whole range length (short writes are finished inside the ring).
    /// Accept: the new connection's fd (blocking, close-on-exec).
    pub result: i32,
    /// Multishot only: the operation is still armed and more completions will follow
    /// under the same token. `false` for every single-shot operation.
    pub more: bool,
    /// The memory the operation owned.
    pub payload: Payload,
}

impl Completion {
    /// `result` as an `io::Result`.
    pub fn io_result(&self) -> io::Result<usize> {
        usize::try_from(self.result).map_err(|_| io::Error::from_raw_os_error(-self.result))
    }

    /// The buffer, for recv, read and write.
    pub fn into_buf(self) -> Option<IoBuf> {
        match self.payload {
            Payload::Buf(buf) => Some(buf),
            _ => None,
        }
    }

    /// The message, for send.
    pub fn into_msg(self) -> Option<SendMsg> {
        match self.payload {
            Payload::Msg(msg) => Some(msg),
            _ => None,
        }
    }
}

/// Counters of what the ring has done (plain integers: the ring is single-threaded).
#[derive(Debug, Clone, Copy, Default)]
pub struct RingStats {
    /// `io_uring_enter` calls made by turns.
    pub enters: u64,
    /// [`Wait::Poll`] turns that skipped the system call (nothing to submit, no pending
    /// completion work).
    pub enters_skipped: u64,
    /// Completions delivered to the caller.
    pub completions: u64,
    /// Sends the kernel completed short and the ring resubmitted.
    pub short_sends: u64,
    /// File writes the kernel completed short and the ring resubmitted.
    pub short_writes: u64,
    /// Multishot operations the kernel ended and the ring re-armed.
    pub rearms: u64,
    /// Early `io_uring_enter` calls because the submission queue was full.
    pub sq_flushes: u64,
    /// [`Wait::Block`] turns that waited for their sends' completions and one or more
    /// others ([`RingConfig::send_hold`], [`Ring::hold_for`]).
    pub held_waits: u64,
}

/// The ring's own SQEs (cancel, close, the waker's poll) carry `kind << 32 | u32::MAX`.
const INTERNAL_CANCEL: u64 = (1 << 32) | INTERNAL_INDEX as u64;
const INTERNAL_CLOSE: u64 = (2 << 32) | INTERNAL_INDEX as u64;
const INTERNAL_WAKE: u64 = (3 << 32) | INTERNAL_INDEX as u64;

// Kernel ABI bits the io-uring crate does not export (include/uapi/linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;
const IORING_REGISTER_RING_FDS: u32 = 20;

/// `struct io_uring_getevents_arg`.
#[repr(C)]
struct GetEventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

/// `struct __kernel_timespec`.
#[repr(C)]
struct KernelTimespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// `struct io_uring_rsrc_update`.
#[repr(C)]
struct RsrcUpdate {
    offset: u32,
    resv: u32,
    data: u64,
}

/// An operation in flight and everything it lent the kernel.
enum Op {
    Nop,
    Recv {
        fd: RawFd,
        buf: IoBuf,
        start: usize,
        len: u32,
    },
    Send {
        fd: RawFd,
        msg: SendMsg,
        /// `MSG_WAITALL` as configured (`false`: never, for socket layers that refuse it).
        waitall: bool,
    },
    Read {
        fd: RawFd,
        buf: IoBuf,
        len: u32,
        offset: u64,
    },
    Write {
        fd: RawFd,
        buf: IoBuf,
        /// Next byte of `buf` to write, and the file offset it goes to.
        pos: usize,
        end: usize,
        offset: u64,
        /// Length of the whole range, reported on success.
        total: usize,
    },
    Fsync {
        fd: RawFd,
        mode: FsyncMode,
    },
    Fallocate {
        fd: RawFd,
        mode: i32,
        offset: u64,
        len: u64,
    },
    Accept {
        fd: RawFd,
    },
    Poll {
        fd: RawFd,
        events: u32,
    },
    /// A ublk FETCH or COMMIT_AND_FETCH; the kernel copies request data into and out of
    /// `buf` while this op owns it.
    UblkIo {
        fd: RawFd,
        cmd_op: u32,
        q_id: u16,
        tag: u16,
        result: i32,
        buf: IoBuf,
    },
}

impl Op {
    /// The fd the op works on, if any.
    fn fd(&self) -> Option<RawFd> {
        match self {
            Op::Nop => None,
            Op::Recv { fd, .. }
            | Op::Send { fd, .. }
            | Op::Read { fd, .. }
            | Op::Write { fd, .. }
            | Op::Fsync { fd, .. }
            | Op::Fallocate { fd, .. }
            | Op::Accept { fd }
            | Op::Poll { fd, .. }
            | Op::UblkIo { fd, .. } => Some(*fd),
        }
    }

    fn kind(&self) -> OpKind {
        match self {
            Op::Nop => OpKind::Nop,
            Op::Recv { .. } => OpKind::Recv,
            Op::Send { .. } => OpKind::Send,
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Fsync { .. } => OpKind::Fsync,
            Op::Fallocate { .. } => OpKind::Fallocate,
            Op::Accept { .. } => OpKind::Accept,
            Op::Poll { .. } => OpKind::Poll,
            Op::UblkIo { .. } => OpKind::UblkIo,
        }
    }

    /// Builds the SQE for the op's current state. Pointers come from memory the op owns.
    /// For a send, `prepare` rebuilds the iovecs from the start of the message.
    fn sqe(&mut self, send_flags: i32) -> Result<squeue::Entry, Error> {
        let entry = match self {
            Op::Nop => opcode::Nop::new().build(),
            Op::Recv { fd, buf, start, len } => {
                opcode::Recv::new(types::Fd(*fd), buf.as_mut_ptr().wrapping_add(*start), *len).build()
            }
            Op::Send { fd, msg, waitall } => {
                let hdr = msg.prepare()?;
                send_sqe(*fd, hdr, op_send_flags(send_flags, *waitall))
            }
            Op::Read { fd, buf, len, offset } => {
                opcode::Read::new(types::Fd(*fd), buf.as_mut_ptr(), *len).offset(*offset).build()
            }
            Op::Write { fd, buf, pos, end, offset, .. } => {
                let len = u32::try_from(*end - *pos).map_err(|_| too_long())?;
                opcode::Write::new(types::Fd(*fd), buf.as_mut_ptr().wrapping_add(*pos).cast_const(), len)
                    .offset(*offset)
                    .build()
            }
            Op::Fsync { fd, mode } => {
                let flags = match mode {
                    FsyncMode::Full => types::FsyncFlags::empty(),
                    FsyncMode::Data => types::FsyncFlags::DATASYNC,
                };
                opcode::Fsync::new(types::Fd(*fd)).flags(flags).build()
            }
            Op::Fallocate { fd, mode, offset, len } => {
                opcode::Fallocate::new(types::Fd(*fd), *len).offset(*offset).mode(*mode).build()
            }
            Op::Accept { fd } => opcode::AcceptMulti::new(types::Fd(*fd)).flags(libc::SOCK_CLOEXEC).build(),
            Op::Poll { fd, events } => opcode::PollAdd::new(types::Fd(*fd), *events).multi(true).build(),
            Op::UblkIo { fd, cmd_op, q_id, tag, result, buf } => {
                let addr = buf.as_mut_ptr() as u64;
                opcode::UringCmd16::new(types::Fd(*fd), *cmd_op)
                    .cmd(crate::ublk::io_cmd(*q_id, *tag, *result, addr))
                    .build()
            }
        };
        Ok(entry)
    }

    /// Turns the finished op into what the caller gets back.
    fn into_payload(self, result: i32) -> Payload {
        match self {
            Op::Recv { mut buf, start, .. } => {
                if let Ok(n) = usize::try_from(result) {
                    buf.set_len(start + n);
                }
                Payload::Buf(buf)
            }
            Op::Read { mut buf, .. } => {
                if let Ok(n) = usize::try_from(result) {
                    buf.set_len(n);
                }
                Payload::Buf(buf)
            }
            Op::Write { buf, .. } | Op::UblkIo { buf, .. } => Payload::Buf(buf),
            Op::Send { msg, .. } => Payload::Msg(msg),
            Op::Nop | Op::Fsync { .. } | Op::Fallocate { .. } | Op::Accept { .. } => Payload::None,
            Op::Poll { .. } => Payload::None,
        }
    }

    /// The buffer of a recv/read/write op (for handing back on a failed submission).
    fn into_buf(self) -> IoBuf {
        match self {
            Op::Recv { buf, .. } | Op::Read { buf, .. } | Op::Write { buf, .. } | Op::UblkIo { buf, .. } => buf,
            _ => unreachable!("into_buf on an op without a buffer"),
        }
    }

    fn into_msg(self) -> SendMsg {
        match self {
            Op::Send { msg, .. } => msg,
            _ => unreachable!("into_msg on an op without a message"),
        }
    }
}

/// The ring's send flags for one send: without `MSG_WAITALL` when the send asked so.
fn op_send_flags(ring_flags: i32, waitall: bool) -> i32 {
    if waitall { ring_flags } else { ring_flags & !libc::MSG_WAITALL }
}

fn send_sqe(fd: RawFd, hdr: *const libc::msghdr, flags: i32) -> squeue::Entry {
    opcode::SendMsg::new(types::Fd(fd), hdr).flags(flags.cast_unsigned()).build()
}

fn too_long() -> Error {
    Error::new(ErrorKind::InvalidArgument, "I/O length exceeds the kernel's 32-bit length field")
}

struct InFlight {
    token: u64,
    op: Op,
    /// The caller cancelled this op (by token, fd or close): never resubmit or re-arm it,
    /// since its fd may be closed and its number reused by then.
    cancelled: bool,
}

/// What to do with a CQE once it has been looked at.
enum Next {
    /// The op is finished: free the slot and deliver `result`.
    Finish(i32),
    /// A multishot op reported and stays armed: deliver without freeing.
    Report(i32),
    /// Push this SQE for the same slot (short send/write, re-armed multishot); deliver
    /// `report` first if given.
    Resubmit { entry: squeue::Entry, report: Option<i32> },
}

/// One io_uring instance, driven by one thread.
///
/// `!Send` and `!Sync`: with `SINGLE_ISSUER | DEFER_TASKRUN` the kernel accepts
/// submissions only from the thread that created the ring, so build the ring on the thread
/// that drives it.
///
/// Sockets may be blocking or non-blocking: the ring never blocks on an fd (the kernel
/// arms an internal poll when a socket is not ready), and accepted sockets are blocking.
///
/// See the [crate docs](crate) for the loop and an example.
///
/// # Ownership of memory lent to the kernel
///
/// Every operation that points the kernel at memory takes ownership of that memory (an
/// [`IoBuf`], a [`SendMsg`]) and stores it in the op slab, in the slot whose index and
/// generation form the SQE's `user_data`. The slot keeps it until the CQE that ends the
/// operation is reaped; only then is the memory handed back in the [`Completion`]. The heap
/// memory behind an `IoBuf` or a `SendMsg` does not move when the slab grows (only the small
/// owning values move), so pointers given to the kernel stay valid. [`Ring`]'s `Drop`
/// cancels whatever is still in flight and waits for the kernel to let go; memory the
/// kernel has not released after a grace period is leaked, never freed.
pub struct Ring {
    uring: IoUring,
    ops: Slab<InFlight>,
    features: Features,
    busy_poll: bool,
    send_flags: i32,
    ops_in_flight_max: usize,
    /// Registered ring index, when `features.registered_ring_fd`.
    ring_index: u32,
    /// [`RingConfig::send_hold`], when the kernel has the minimum wait.
    send_hold: Option<Duration>,
    /// Completions besides its sends' that a useful wake of the next [`Wait::Block`] turns
    /// needs ([`Ring::hold_for`]); 0: do not hold.
    wake_needs: u32,
    /// The minimum wait of those turns ([`Ring::hold_for`]); `None`: `send_hold`.
    hold_next: Option<Duration>,
    /// Sends (and resubmitted short sends) queued since the last turn's wait: each posts
    /// one completion that the next [`Wait::Block`] turn need not wake for alone.
    sends_unwaited: u32,
    cq_capacity: usize,
    /// The waker's eventfd, once [`Ring::waker`] has been called.
    wake: Option<Arc<EventFd>>,
    /// Set by `Drop`: nothing is resubmitted or re-armed any more.
    closing: bool,
    stats: RingStats,
    _one_thread: PhantomData<*const ()>,
}

impl Ring {
    /// Builds a ring, trying `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG | SUBMIT_ALL`
    /// first and falling back to `COOP_TASKRUN | TASKRUN_FLAG`, then to no flags, if the
    /// kernel refuses. Checks every opcode the ring uses and fails with an error that says
    /// what to do if one is missing.
    pub fn new(config: RingConfig) -> Result<Ring, Error> {
        if config.entries == 0 || config.entries > RING_ENTRIES_MAX {
            return Err(Error::new(ErrorKind::InvalidArgument, "RingConfig::entries must be in 1..=32768"));
        }
        let cq_entries = config.cq_entries.unwrap_or(config.entries.saturating_mul(4)).max(config.entries);
        let (uring, mut features) = build_uring(config.entries, cq_entries, config.task_run)?;
        check_kernel(&uring)?;
        let ring_index = register_ring_fd(&uring);
        features.registered_ring_fd = ring_index.is_some();
        features.min_wait = uring.params().is_feature_min_timeout();
        let cq_capacity = uring.params().cq_entries() as usize;
        let mut send_flags = libc::MSG_NOSIGNAL;
        if config.send_waitall {
            send_flags |= libc::MSG_WAITALL;
        }
        tracing::info!(?features, entries = config.entries, cq_entries, "io_uring ready");
        Ok(Ring {
            uring,
            ops: Slab::with_capacity(config.slots_initial),
            features,
            busy_poll: config.busy_poll,
            send_flags,
            ops_in_flight_max: config.ops_in_flight_max,
            ring_index: ring_index.unwrap_or(0),
            send_hold: config.send_hold.filter(|_| features.min_wait),
            sends_unwaited: 0,
            wake_needs: 1,
            hold_next: None,
            cq_capacity,
            wake: None,
            closing: false,
            stats: RingStats::default(),
            _one_thread: PhantomData,
        })
    }

    /// The features the ring runs with.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Counters since the ring was built.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// How many completions besides their sends' the next [`Wait::Block`] turns wait for,
    /// bounded by [`RingConfig::send_hold`] as io_uring's minimum wait: `0` does not hold
    /// (the turn wakes for its first completion: when the one completion that would follow
    /// a send is the one the owner waits for, holding saves the system call but puts the
    /// thread to sleep inside the submitting call, and a response a few µs away then costs
    /// a wake-up from idle that returning to user space and entering again would often
    /// have missed); `1` holds only a turn that submits sends (the default); more holds
    /// every turn for that many,
    /// when the owner knows that many are coming (a receive on each of several sockets
    /// that have answers outstanding): their first would otherwise wake the thread alone,
    /// and the others cost another system call each. `hold` replaces
    /// [`RingConfig::send_hold`] as the minimum wait (the owner knows how long its answers
    /// take: a hold shorter than that wakes for the sends alone); nothing is held without a
    /// `send_hold` configured or without the kernel's minimum wait.
    pub fn hold_for(&mut self, completions: u32, hold: Option<Duration>) {
        self.wake_needs = completions;
        self.hold_next = hold;
    }

    /// The `(min_complete, min_wait)` of a blocking turn that submits `sends` sends with
    /// `timeout`, or `None` for a plain wait for one completion.
    fn held_wait(&self, sends: u32, timeout: Option<Duration>) -> Option<(u32, Duration)> {
        let (hold, timeout) = (self.hold_next.or(self.send_hold).filter(|_| self.send_hold.is_some())?, timeout?);
        let useful = sends > 0 || self.wake_needs > 1;
        (useful && self.wake_needs > 0 && timeout > hold).then(|| (sends.saturating_add(self.wake_needs), hold))
    }

    /// Operations submitted and not yet finished (multishot ones count while armed).
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    // ---------------------------------------------------------------- operations

    /// Queues a no-op (benchmarks, tests, forcing a turn to produce a completion).
    pub fn nop(&mut self, token: u64) -> Result<(), Error> {
        self.submit_op(token, Op::Nop).map_err(|(error, _)| error)
    }

    /// Queues a receive of up to `range.len()` bytes into `buf[range]` (`range` within the
    /// buffer's capacity). On success the buffer's length becomes `range.start + result`;
    /// `result == 0` means the peer closed.
    pub fn recv(&mut self, fd: RawFd, buf: IoBuf, range: Range<usize>, token: u64) -> Result<(), (Error, IoBuf)> {
        if range.start > range.end || range.end > buf.capacity() {
            return Err((Error::new(ErrorKind::InvalidArgument, "recv range outside the buffer's capacity"), buf));
        }
        let Ok(len) = u32::try_from(range.len()) else {
            return Err((too_long(), buf));
        };
        let op = Op::Recv { fd, buf, start: range.start, len };
        self.submit_op(token, op).map_err(|(error, op)| (error, op.into_buf()))
    }

    /// Queues a send of the whole message with `IORING_OP_SENDMSG` and `MSG_NOSIGNAL`.
    /// Short sends are resubmitted inside the ring: the completion means everything was
    /// sent (`result == msg.len()`) or the send failed.
    pub fn send(&mut self, fd: RawFd, msg: SendMsg, token: u64) -> Result<(), (Error, SendMsg)> {
        self.submit_op(token, Op::Send { fd, msg, waitall: true }).map_err(|(error, op)| (error, op.into_msg()))
    }

    /// [`Ring::send`] without `MSG_WAITALL`, for sockets whose layer refuses that flag (Linux's
    /// kernel TLS fails such a send with EOPNOTSUPP: `tls_sw_sendmsg` takes only MSG_MORE,
    /// MSG_DONTWAIT, MSG_NOSIGNAL, MSG_EOR and the kernel's own flags). Short sends are still
    /// resubmitted inside the ring.
    pub fn send_without_waitall(&mut self, fd: RawFd, msg: SendMsg, token: u64) -> Result<(), (Error, SendMsg)> {
        self.submit_op(token, Op::Send { fd, msg, waitall: false }).map_err(|(error, op)| (error, op.into_msg()))
    }

    /// Queues a read of `len` bytes (at most the capacity) at file `offset` into the start
    /// of `buf`. On success the buffer's length becomes `result` (short only at EOF).
    pub fn read_at(
        &mut self,
        fd: RawFd,
        buf: IoBuf,
        len: usize,
        offset: u64,
        token: u64,
    ) -> Result<(), (Error, IoBuf)> {
        if len > buf.capacity() {
            return Err((Error::new(ErrorKind::InvalidArgument, "read_at length beyond capacity"), buf));
        }
        let Ok(len) = u32::try_from(len) else {
            return Err((too_long(), buf));
        };
        let op = Op::Read { fd, buf, len, offset };
        self.submit_op(token, op).map_err(|(error, op)| (error, op.into_buf()))
    }

    /// Queues a write of `buf[range]` (within the buffer's length) at file `offset`. Short
    /// writes are resubmitted inside the ring: the completion means the whole range was
    /// written (`result == range.len()`) or the write failed.
    pub fn write_at(
        &mut self,
        fd: RawFd,
        buf: IoBuf,
        range: Range<usize>,
        offset: u64,
        token: u64,
    ) -> Result<(), (Error, IoBuf)> {
        if range.start > range.end || range.end > buf.len() {
            return Err((Error::new(ErrorKind::InvalidArgument, "write_at range outside the buffer's length"), buf));
        }
        if u32::try_from(range.len()).is_err() || i32::try_from(range.len()).is_err() {
            return Err((too_long(), buf));
        }
        let op = Op::Write { fd, buf, pos: range.start, end: range.end, offset, total: range.len() };
        self.submit_op(token, op).map_err(|(error, op)| (error, op.into_buf()))
    }

    /// Queues an `fsync` or `fdatasync`.
    pub fn fsync(&mut self, fd: RawFd, mode: FsyncMode, token: u64) -> Result<(), Error> {
        self.submit_op(token, Op::Fsync { fd, mode }).map_err(|(error, _)| error)
    }

    /// Queues an `fallocate(fd, mode, offset, len)` (`mode` as in `fallocate(2)`:
    /// `0`, `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_ZERO_RANGE`, ...).
    pub fn fallocate(&mut self, fd: RawFd, mode: i32, offset: u64, len: u64, token: u64) -> Result<(), Error> {
        let op = Op::Fallocate { fd, mode, offset, len };
        self.submit_op(token, op).map_err(|(error, _)| error)
    }

    /// Arms a multishot accept on a listening socket: one completion per connection, whose
    /// `result` is the new fd, with `more == true` while it stays armed.
    ///
    /// If the kernel ends the multishot without an error (it does when the completion
    /// queue overflows) the ring re-arms it transparently. If it ends with an error
    /// (`EMFILE`, a closed listener, a cancel) the completion has `more == false` and the
    /// caller decides whether to arm again.
    pub fn accept_multishot(&mut self, listen_fd: RawFd, token: u64) -> Result<(), Error> {
        self.submit_op(token, Op::Accept { fd: listen_fd }).map_err(|(error, _)| error)
    }

    /// Arms a multishot poll for `events` (`libc::POLLIN as u32`, ...) on `fd`: one
    /// completion per readiness event, `result` the ready mask. Re-armed like
    /// [`accept_multishot`](Self::accept_multishot).
    pub fn poll_multishot(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), Error> {
        self.submit_op(token, Op::Poll { fd, events }).map_err(|(error, _)| error)
    }

    /// Queues a ublk FETCH_REQ for `tag` of queue `q_id` of `dev`: it completes when the
    /// kernel has a request for that tag (its descriptor is then in the queue's
    /// [`crate::ublk::Descriptors`], a write's data in `buf`), or with `-ENODEV` when the
    /// device stops. `buf` must hold the device's `max_io_buf_bytes`.
    pub fn ublk_fetch(
        &mut self,
        dev: &crate::ublk::CharDev,
        q_id: u16,
        tag: u16,
        buf: IoBuf,
        token: u64,
    ) -> Result<(), (Error, IoBuf)> {
        self.ublk_io(dev, crate::ublk::cmd::FETCH_REQ, q_id, tag, 0, buf, token)
    }

    /// Queues a ublk COMMIT_AND_FETCH_REQ: completes `tag`'s request with `result` (bytes
    /// done, or a negative errno; a read's data is copied out of `buf` during submission)
    /// and waits for the tag's next request, as [`Ring::ublk_fetch`].
    pub fn ublk_commit_and_fetch(
        &mut self,
        dev: &crate::ublk::CharDev,
        q_id: u16,
        tag: u16,
        result: i32,
        buf: IoBuf,
        token: u64,
    ) -> Result<(), (Error, IoBuf)> {
        self.ublk_io(dev, crate::ublk::cmd::COMMIT_AND_FETCH_REQ, q_id, tag, result, buf, token)
    }

    #[allow(clippy::too_many_arguments)]
    fn ublk_io(
        &mut self,
        dev: &crate::ublk::CharDev,
        cmd_op: u32,
        q_id: u16,
        tag: u16,
        result: i32,
        buf: IoBuf,
        token: u64,
    ) -> Result<(), (Error, IoBuf)> {
        let info = dev.info();
        if q_id >= info.nr_hw_queues || tag >= info.queue_depth {
            return Err((Error::new(ErrorKind::InvalidArgument, "ublk queue or tag past the device's"), buf));
        }
        // The kernel copies up to max_io_buf_bytes into or out of the buffer.
        if buf.capacity() < info.max_io_buf_bytes as usize {
            return Err((Error::new(ErrorKind::InvalidArgument, "ublk buffer smaller than max_io_buf_bytes"), buf));
        }
        let op = Op::UblkIo { fd: dev.fd(), cmd_op, q_id, tag, result, buf };
        self.submit_op(token, op).map_err(|(error, op)| (error, op.into_buf()))
    }

    /// Asks the kernel to cancel every in-flight operation submitted with `token`; returns
    /// how many it asked about. Each cancelled operation completes (with `-ECANCELED`, or
    /// normally if it won the race) and hands its memory back.
    ///
    /// Control path: scans the op slab. Use [`cancel_fd`](Self::cancel_fd) or
    /// [`close`](Self::close) to tear a connection down.
    pub fn cancel(&mut self, token: u64) -> Result<usize, Error> {
        let mut keys = Vec::new();
        self.ops.for_each_busy_mut(|key, in_flight| {
            if in_flight.token == token {
                in_flight.cancelled = true;
                keys.push(key);
            }
        });
        for &key in &keys {
            let entry = opcode::AsyncCancel::new(key).build().user_data(INTERNAL_CANCEL);
            // SAFETY: a cancel SQE points at no memory; `user_data` only names the target.
            unsafe { self.push(&entry)? };
        }
        Ok(keys.len())
    }

    /// Asks the kernel to cancel every in-flight operation on `fd`. Control path: marks
    /// the fd's ops in the slab so none is resubmitted (a short send) or re-armed.
    pub fn cancel_fd(&mut self, fd: RawFd) -> Result<(), Error> {
        self.mark_cancelled(fd);
        let entry =
            opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all()).build().user_data(INTERNAL_CANCEL);
        // SAFETY: a cancel SQE points at no memory.
        unsafe { self.push(&entry) }
    }

    /// Cancels every in-flight operation on `fd`, then closes it, both asynchronously
    /// (one hard-linked pair of SQEs, sent with the next turn). The cancelled operations
    /// complete with `-ECANCELED` and hand back their memory. Closing alone would not do:
    /// in-flight operations hold their own reference to the file.
    ///
    /// Accepts anything that gives up an fd: a `RawFd`, an `OwnedFd`, a `TcpStream`.
    pub fn close(&mut self, fd: impl IntoRawFd) -> Result<(), Error> {
        let fd = fd.into_raw_fd();
        // After the close the fd number may be reused (by any thread's accept or open): an
        // op on it must never be resubmitted or re-armed.
        self.mark_cancelled(fd);
        // Keep the pair in one submission so the link is not split across batches.
        let free = {
            let sq = self.uring.submission();
            sq.capacity() - sq.len()
        };
        if free < 2 {
            self.flush()?;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
            .build()
            .flags(squeue::Flags::IO_HARDLINK)
            .user_data(INTERNAL_CANCEL);
        let close = opcode::Close::new(types::Fd(fd)).build().user_data(INTERNAL_CLOSE);
        // SAFETY: neither SQE points at memory.
        unsafe {
            self.push(&cancel)?;
            self.push(&close)
        }
    }

    fn mark_cancelled(&mut self, fd: RawFd) {
        self.ops.for_each_busy_mut(|_, in_flight| {
            if in_flight.op.fd() == Some(fd) {
                in_flight.cancelled = true;
            }
        });
    }

    /// A handle other threads use to wake this ring out of a [`Wait::Block`] turn.
    ///
    /// The first call creates an eventfd and arms a multishot poll on it (an internal
    /// operation: its completions are consumed by the ring, never delivered).
    pub fn waker(&mut self) -> Result<Waker, Error> {
        if let Some(efd) = &self.wake {
            return Ok(Waker { efd: Arc::clone(efd) });
        }
        let efd =
            Arc::new(EventFd::new().map_err(|e| Error::new(ErrorKind::Os, "eventfd for the ring waker").caused_by(e))?);
        self.arm_wake(efd.as_raw_fd())?;
        self.wake = Some(Arc::clone(&efd));
        Ok(Waker { efd })
    }

    fn arm_wake(&mut self, fd: RawFd) -> Result<(), Error> {
        let entry =
            opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).multi(true).build().user_data(INTERNAL_WAKE);
        // SAFETY: a poll SQE points at no memory; the eventfd is kept open by `self.wake`
        // (and the request holds its own file reference).
        unsafe { self.push(&entry) }
    }

    // ---------------------------------------------------------------- the turn

    /// One loop turn: [`enter`](Self::enter) with `wait`, then hand every ready completion
    /// to `on_completion`, which gets the ring back so it can submit follow-up operations
    /// (they go to the kernel with the next turn). Returns how many were delivered.
    ///
    /// Delivers at most one completion queue's worth per turn, so a callback that keeps
    /// producing work cannot keep the turn from returning.
    pub fn turn(&mut self, wait: Wait, mut on_completion: impl FnMut(&mut Ring, Completion)) -> Result<usize, Error> {
        self.enter(wait)?;
        let mut delivered = 0;
        while delivered < self.cq_capacity {
            let Some(completion) = self.next_completion() else {
                break;
            };
            on_completion(self, completion);
            delivered += 1;
        }
        Ok(delivered)
    }

    /// The first half of a turn: at most one `io_uring_enter` that submits everything
    /// queued and, per `wait`, sleeps until a completion is ready. Always passes
    /// `GETEVENTS` (with `DEFER_TASKRUN` nothing completes otherwise). A [`Wait::Poll`]
    /// turn with nothing queued skips the system call when the kernel says no completion
    /// work is pending (`TASKRUN_FLAG`). Timeouts and signals are not errors.
    pub fn enter(&mut self, wait: Wait) -> Result<(), Error> {
        match wait {
            Wait::Poll => self.enter_poll(),
            Wait::Block { timeout } if self.busy_poll => self.spin(timeout),
            Wait::Block { timeout } => {
                let to_submit = self.sq_len();
                let sends = std::mem::take(&mut self.sends_unwaited);
                match self.held_wait(sends, timeout) {
                    Some((min_complete, hold)) => {
                        self.stats.held_waits += 1;
                        self.enter_getevents_min(to_submit, min_complete, timeout, hold)
                    }
                    None => self.enter_getevents(to_submit, 1, timeout),
                }
            }
        }
    }

    /// The second half of a turn: the next ready completion, if any. Internal completions
    /// (short-send resubmission, re-arming, the waker) are handled here and not returned.
    pub fn next_completion(&mut self) -> Option<Completion> {
        loop {
            let cqe = self.uring.completion().next()?;
            if let Some(completion) = self.complete(&cqe) {
                return Some(completion);
            }
        }
    }

    fn sq_len(&mut self) -> u32 {
        u32::try_from(self.uring.submission().len()).expect("SQ length fits u32")
    }

    fn enter_poll(&mut self) -> Result<(), Error> {
        let (to_submit, work_pending) = {
            let sq = self.uring.submission();
            (sq.len(), sq.taskrun() || sq.cq_overflow())
        };
        if to_submit == 0 && self.features.taskrun_flag && !work_pending {
            self.stats.enters_skipped += 1;
            return Ok(());
        }
        self.sends_unwaited = 0;
        let to_submit = u32::try_from(to_submit).expect("SQ length fits u32");
        self.enter_getevents(to_submit, 0, None)
    }

    fn spin(&mut self, timeout: Option<Duration>) -> Result<(), Error> {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        loop {
            self.enter_poll()?;
            if !self.uring.completion().is_empty() {
                return Ok(());
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }

    fn enter_getevents(&mut self, to_submit: u32, min_complete: u32, timeout: Option<Duration>) -> Result<(), Error> {
        self.enter_getevents_min(to_submit, min_complete, timeout, Duration::ZERO)
    }

    /// A wait for `min_complete` completions that any completion ends once `min_wait` has
    /// passed (io_uring_enter's `min_wait_usec`, ignored when zero:
    /// `io_cqring_min_timer_wakeup` in Linux's io_uring/io_uring.c wakes at the minimum
    /// wait if the completion queue holds anything, else on the next completion). A
    /// non-zero `min_wait` needs a `timeout` longer than it: without one, the kernel ends
    /// the whole wait at the minimum.
    fn enter_getevents_min(
        &mut self,
        to_submit: u32,
        min_complete: u32,
        timeout: Option<Duration>,
        min_wait: Duration,
    ) -> Result<(), Error> {
        self.stats.enters += 1;
        self.sends_unwaited = 0;
        let result = match timeout {
            None => self.enter_raw(to_submit, min_complete, IORING_ENTER_GETEVENTS, None),
            Some(timeout) => {
                let ts = KernelTimespec {
                    tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
                    tv_nsec: i64::from(timeout.subsec_nanos()),
                };
                let min_wait_usec = u32::try_from(min_wait.as_micros()).unwrap_or(u32::MAX);
                let arg = GetEventsArg { sigmask: 0, sigmask_sz: 0, min_wait_usec, ts: (&raw const ts) as u64 };
                self.enter_raw(to_submit, min_complete, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, Some(&arg))
            }
        };
        match result {
            Ok(_) => Ok(()),
            // Timeout, signal, or a completion queue that must be drained before more can
            // be posted: none is a failure; the caller reaps and turns again. Unsubmitted
            // SQEs stay queued for the next turn.
            Err(error)
                if matches!(error.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)) =>
            {
                Ok(())
            }
            Err(error) => Err(Error::new(ErrorKind::Enter, "io_uring_enter").caused_by(error)),
        }
    }

    /// `io_uring_enter(2)`, through the registered ring index when there is one.
    fn enter_raw(
        &self,
        to_submit: u32,
        min_complete: u32,
        mut flags: u32,
        arg: Option<&GetEventsArg>,
    ) -> io::Result<u32> {
        let fd = if self.features.registered_ring_fd {
            flags |= IORING_ENTER_REGISTERED_RING;
            i32::try_from(self.ring_index).expect("ring index fits i32")
        } else {
            self.uring.as_raw_fd()
        };
        let (arg_ptr, arg_len) = match arg {
            Some(arg) => ((&raw const *arg).cast::<libc::c_void>(), size_of::<GetEventsArg>()),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `arg` (and the timespec it points to) live in the caller's frame for the
        // duration of the call; the SQEs being submitted point only at memory owned by op
        // slots (see `push`); the ring mappings are owned by `self.uring`.
        let rc =
            unsafe { libc::syscall(libc::SYS_io_uring_enter, fd, to_submit, min_complete, flags, arg_ptr, arg_len) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(u32::try_from(rc).unwrap_or(u32::MAX)) }
    }

    /// Submits what is queued without waiting (the SQ is full).
    fn flush(&mut self) -> Result<(), Error> {
        self.stats.sq_flushes += 1;
        let to_submit = self.sq_len();
        self.enter_raw(to_submit, 0, 0, None).map(drop).map_err(|error| {
            Error::new(ErrorKind::SubmissionQueueFull, "flushing a full submission queue").caused_by(error)
        })
    }

    /// Queues `entry`, flushing the SQ to the kernel first if it is full.
    ///
    /// # Safety
    /// Every byte `entry` points at must stay valid, and must not be accessed by Rust code
    /// if the kernel writes it, until the CQE that ends the operation named by
    /// `entry.user_data` has been reaped. For caller operations that memory is owned by the
    /// op slot the `user_data` names; internal SQEs point at no memory.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> Result<(), Error> {
        // SAFETY: forwarded from this function's contract.
        if unsafe { self.uring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        self.flush()?;
        // SAFETY: as above.
        unsafe { self.uring.submission().push(entry) }
            .map_err(|_| Error::new(ErrorKind::SubmissionQueueFull, "submission queue still full after flushing"))
    }

    /// Stores `op` in a slot and queues its SQE; on failure frees the slot and hands the
    /// op back.
    fn submit_op(&mut self, token: u64, op: Op) -> Result<(), (Error, Op)> {
        if self.ops.len() >= self.ops_in_flight_max {
            return Err((
                Error::new(ErrorKind::Limit, "RingConfig::ops_in_flight_max operations already in flight"),
                op,
            ));
        }
        let is_send = matches!(op, Op::Send { .. });
        let key = self.ops.insert(InFlight { token, op, cancelled: false });
        let send_flags = self.send_flags;
        let built = self.ops.get_mut(key).expect("slot just inserted").op.sqe(send_flags);
        let pushed = match built {
            // SAFETY: the SQE points only into memory owned by the op now stored in slot
            // `key` (its IoBuf or SendMsg heap memory, which does not move with the slot);
            // `complete` keeps the op in the slot until the CQE that ends it, and
            // `Ring::drop` waits for in-flight ops or leaks their memory.
            Ok(entry) => unsafe { self.push(&entry.user_data(key)) },
            Err(error) => Err(error),
        };
        match pushed {
            Ok(()) => {
                if is_send {
                    self.sends_unwaited += 1;
                }
                Ok(())
            }
            Err(error) => {
                let op = self.ops.remove(key).expect("slot just inserted").op;
                Err((error, op))
            }
        }
    }

    // ---------------------------------------------------------------- completions

    fn complete(&mut self, cqe: &cqueue::Entry) -> Option<Completion> {
        let key = cqe.user_data();
        let result = cqe.result();
        let more = cqueue::more(cqe.flags());
        if slab::split(key).0 == INTERNAL_INDEX {
            self.complete_internal(key, result, more);
            return None;
        }
        let next = self.next_step(key, result, more);
        match next {
            Next::Finish(result) => Some(self.finish(key, result)),
            Next::Report(result) => Some(self.report(key, result)),
            Next::Resubmit { entry, report } => {
                // SAFETY: `entry` points into memory owned by the op still in slot `key`
                // (the advanced iovecs of its SendMsg, its IoBuf, or nothing for a
                // multishot re-arm); the slot stays busy until the op's final CQE.
                match unsafe { self.push(&entry.user_data(key)) } {
                    Ok(()) => report.map(|result| self.report(key, result)),
                    Err(error) => {
                        tracing::warn!(%error, "resubmission failed; failing the operation");
                        let errno = error.os_error().and_then(io::Error::raw_os_error).unwrap_or(libc::EBUSY);
                        Some(self.finish(key, -errno))
                    }
                }
            }
        }
    }

    /// Decides what a CQE means for the op in slot `key`.
    fn next_step(&mut self, key: u64, result: i32, more: bool) -> Next {
        let send_flags = self.send_flags;
        let closing = self.closing;
        let in_flight = self.ops.get_mut(key).expect("CQE names a free op slot: user_data corrupted or op freed early");
        // Dropping the ring, or the caller cancelled: finish, never resubmit.
        let stop = closing || in_flight.cancelled;
        match &mut in_flight.op {
            Op::Send { fd, msg, waitall } if result > 0 => {
                let accepted = usize::try_from(result).expect("positive");
                if msg.advance(accepted) == 0 {
                    return Next::Finish(i32::try_from(msg.sent()).expect("len <= i32::MAX"));
                }
                if stop {
                    return Next::Finish(-libc::ECANCELED);
                }
                self.stats.short_sends += 1;
                self.sends_unwaited += 1;
                Next::Resubmit {
                    entry: send_sqe(*fd, msg.header_ptr(), op_send_flags(send_flags, *waitall)),
                    report: None,
                }
            }
            // A stream send that accepts nothing of a non-empty message will never finish.
            Op::Send { msg, .. } if result == 0 && !msg.is_empty() => Next::Finish(-libc::EPIPE),
            Op::Write { pos, end, offset, total, .. } if result >= 0 => {
                let written = usize::try_from(result).expect("non-negative");
                if written == 0 && *pos < *end {
                    return Next::Finish(-libc::EIO);
                }
                *pos += written;
                *offset += u64::try_from(written).expect("usize fits u64");
                if *pos >= *end {
                    return Next::Finish(i32::try_from(*total).expect("checked at submit"));
                }
                if stop {
                    return Next::Finish(-libc::ECANCELED);
                }
                self.stats.short_writes += 1;
                match in_flight.op.sqe(send_flags) {
                    Ok(entry) => Next::Resubmit { entry, report: None },
                    Err(_) => Next::Finish(-libc::EINVAL),
                }
            }
            Op::Accept { .. } | Op::Poll { .. } => {
                if more {
                    Next::Report(result)
                } else if result >= 0 && !stop {
                    // The kernel ended the multishot without an error (CQ overflow):
                    // re-arm, and report this completion as one of a continuing series.
                    self.stats.rearms += 1;
                    match in_flight.op.sqe(send_flags) {
                        Ok(entry) => Next::Resubmit { entry, report: Some(result) },
                        Err(_) => Next::Finish(result),
                    }
                } else {
                    Next::Finish(result)
                }
            }
            _ => Next::Finish(result),
        }
    }

    fn finish(&mut self, key: u64, result: i32) -> Completion {
        let InFlight { token, op, .. } = self.ops.remove(key).expect("slot checked busy");
        self.stats.completions += 1;
        Completion { token, op: op.kind(), result, more: false, payload: op.into_payload(result) }
    }

    fn report(&mut self, key: u64, result: i32) -> Completion {
        let in_flight = self.ops.get_mut(key).expect("slot checked busy");
        self.stats.completions += 1;
        Completion { token: in_flight.token, op: in_flight.op.kind(), result, more: true, payload: Payload::None }
    }

    fn complete_internal(&mut self, key: u64, result: i32, more: bool) {
        match key {
            INTERNAL_WAKE => {
                if let Some(efd) = &self.wake {
                    // Reset the counter so the next wake is a fresh event.
                    let _ = efd.read();
                }
                if !more && !self.closing {
                    if result < 0 {
                        tracing::warn!(errno = -result, "waker poll ended; re-arming");
                    }
                    let fd = self.wake.as_ref().map(|efd| efd.as_raw_fd());
                    if let Some(fd) = fd
                        && let Err(error) = self.arm_wake(fd)
                    {
                        tracing::warn!(%error, "could not re-arm the waker poll");
                    }
                }
            }
            INTERNAL_CANCEL => {
                // -ENOENT: nothing left to cancel; -EALREADY: already running, will finish.
                if result < 0 && result != -libc::ENOENT && result != -libc::EALREADY {
                    tracing::debug!(errno = -result, "cancel request failed");
                }
            }
            INTERNAL_CLOSE => {
                if result < 0 {
                    tracing::warn!(errno = -result, "asynchronous close failed");
                }
            }
            _ => panic!("unknown internal user_data {key:#x}"),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.closing = true;
        if self.ops.len() == 0 {
            return;
        }
        // The kernel may still write into buffers the slots own: cancel everything and
        // wait for each op's final CQE before the slots (and their memory) are dropped.
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(INTERNAL_CANCEL);
        // SAFETY: a cancel SQE points at no memory.
        if let Err(error) = unsafe { self.push(&entry) } {
            tracing::warn!(%error, "could not queue cancel-all while dropping the ring");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.ops.len() > 0 && Instant::now() < deadline {
            let to_submit = self.sq_len();
            if let Err(error) = self.enter_getevents(to_submit, 1, Some(Duration::from_millis(20))) {
                tracing::warn!(%error, "io_uring_enter failed while dropping the ring");
                break;
            }
            while let Some(completion) = self.next_completion() {
                drop(completion);
            }
        }
        if self.ops.len() > 0 {
            let stuck = self.ops.take_all();
            tracing::warn!(
                ops = stuck.len(),
                "ops still in flight after cancel; leaking their buffers rather than freeing memory the kernel may write"
            );
            std::mem::forget(stuck);
        }
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("features", &self.features)
            .field("in_flight", &self.ops.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Wakes a [`Ring`] blocked in [`Wait::Block`] from any thread. `Send + Sync + Clone`.
#[derive(Debug, Clone)]
pub struct Waker {
    efd: Arc<EventFd>,
}

impl Waker {
    /// Makes the ring's current (or next) blocking turn return. Costs one `write(2)`.
    pub fn wake(&self) {
        if let Err(error) = self.efd.write(1) {
            tracing::warn!(%error, "waking the ring failed");
        }
    }
}

/// Tries the setup flag sets from most to least wanted.
fn build_uring(entries: u32, cq_entries: u32, best: TaskRun) -> Result<(IoUring, Features), Error> {
    let deferred = Features {
        single_issuer: true,
        defer_taskrun: true,
        taskrun_flag: true,
        submit_all: true,
        ..Features::default()
    };
    let cooperative = Features { coop_taskrun: true, taskrun_flag: true, submit_all: true, ..Features::default() };
    let attempts =
        [(TaskRun::Deferred, deferred), (TaskRun::Cooperative, cooperative), (TaskRun::Plain, Features::default())];
    let mut last_error = None;
    for (_, features) in attempts.into_iter().filter(|(mode, _)| *mode >= best) {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cq_entries).setup_clamp();
        if features.single_issuer {
            builder.setup_single_issuer();
        }
        if features.defer_taskrun {
            builder.setup_defer_taskrun();
        }
        if features.coop_taskrun {
            builder.setup_coop_taskrun();
        }
        if features.taskrun_flag {
            builder.setup_taskrun_flag();
        }
        if features.submit_all {
            builder.setup_submit_all();
        }
        match builder.build(entries) {
            Ok(uring) => return Ok((uring, features)),
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(?features, "kernel refused io_uring setup flags; falling back");
                last_error = Some(error);
            }
            Err(error) => return Err(setup_error(error)),
        }
    }
    Err(setup_error(last_error.expect("at least one attempt")))
}

fn setup_error(error: io::Error) -> Error {
    let advice = match error.raw_os_error() {
        Some(libc::EPERM) => {
            "io_uring_setup: permission denied. io_uring is disabled for this process: set \
             `sysctl kernel.io_uring_disabled=0` (or, when it is 1, add the user to the group \
             in kernel.io_uring_group), and check the container's seccomp profile"
        }
        Some(libc::ENOSYS) => {
            "io_uring_setup: not implemented. The kernel lacks CONFIG_IO_URING or a seccomp \
             filter blocks it; qpath needs Linux >= 5.19 with io_uring enabled"
        }
        Some(libc::ENOMEM) => {
            "io_uring_setup: out of memory. Raise RLIMIT_MEMLOCK (`ulimit -l`; kernels \
             before 5.12 charge rings to it) or lower RingConfig::entries"
        }
        Some(libc::EMFILE | libc::ENFILE) => "io_uring_setup: out of file descriptors; raise `ulimit -n`",
        _ => "io_uring_setup failed",
    };
    Error::new(ErrorKind::Setup, advice).caused_by(error)
}

/// Checks the kernel features and opcodes the ring relies on.
fn check_kernel(uring: &IoUring) -> Result<(), Error> {
    let params = uring.params();
    let required = [
        (params.is_feature_nodrop(), "IORING_FEAT_NODROP", "5.5"),
        (params.is_feature_submit_stable(), "IORING_FEAT_SUBMIT_STABLE", "5.5"),
        (params.is_feature_ext_arg(), "IORING_FEAT_EXT_ARG", "5.11"),
    ];
    for (present, name, version) in required {
        if !present {
            return Err(unsupported(name, version));
        }
    }
    let mut probe = Probe::new();
    uring.submitter().register_probe(&mut probe).map_err(|e| {
        Error::new(ErrorKind::Unsupported, "IORING_REGISTER_PROBE failed; qpath needs Linux >= 5.19").caused_by(e)
    })?;
    let opcodes = [
        (opcode::Nop::CODE, "IORING_OP_NOP", "5.1"),
        (opcode::Recv::CODE, "IORING_OP_RECV", "5.6"),
        (opcode::SendMsg::CODE, "IORING_OP_SENDMSG", "5.3"),
        (opcode::Read::CODE, "IORING_OP_READ", "5.6"),
        (opcode::Write::CODE, "IORING_OP_WRITE", "5.6"),
        (opcode::Fsync::CODE, "IORING_OP_FSYNC", "5.1"),
        (opcode::Fallocate::CODE, "IORING_OP_FALLOCATE", "5.6"),
        (opcode::AcceptMulti::CODE, "IORING_OP_ACCEPT", "5.5"),
        (opcode::PollAdd::CODE, "IORING_OP_POLL_ADD", "5.1"),
        (opcode::AsyncCancel::CODE, "IORING_OP_ASYNC_CANCEL", "5.5"),
        (opcode::Close::CODE, "IORING_OP_CLOSE", "5.6"),
        // Multishot accept and cancel-by-fd arrived in 5.19 with no opcode of their own;
        // IORING_OP_SOCKET arrived in the same release and stands in for them.
        (opcode::Socket::CODE, "IORING_OP_SOCKET (marker for multishot accept and cancel by fd)", "5.19"),
    ];
    for (code, name, version) in opcodes {
        if !probe.is_supported(code) {
            return Err(unsupported(name, version));
        }
    }
    Ok(())
}

fn unsupported(name: &str, version: &str) -> Error {
    Error::with_context(
        ErrorKind::Unsupported,
        format!(
            "the kernel's io_uring lacks {name} (Linux >= {version}); upgrade the kernel, or \
             check that no seccomp or LSM policy restricts io_uring"
        ),
    )
}

/// Registers the ring fd so `io_uring_enter` skips the fd lookup; `None` if refused.
fn register_ring_fd(uring: &IoUring) -> Option<u32> {
    let mut update = RsrcUpdate { offset: u32::MAX, resv: 0, data: u64::try_from(uring.as_raw_fd()).ok()? };
    // SAFETY: `update` is a valid io_uring_rsrc_update owned by this frame for the call;
    // the kernel writes the chosen index into `update.offset`.
    let rc = unsafe {
        libc::syscall(libc::SYS_io_uring_register, uring.as_raw_fd(), IORING_REGISTER_RING_FDS, &raw mut update, 1u32)
    };
    if rc == 1 {
        Some(update.offset)
    } else {
        tracing::info!(
            error = %io::Error::last_os_error(),
            "ring fd registration refused; io_uring_enter uses the plain fd"
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Ring {
        Ring::new(RingConfig { entries: 8, slots_initial: 4, ..RingConfig::default() }).expect("io_uring available")
    }

    #[test]
    fn reports_features_this_kernel_has() {
        let ring = ring();
        let features = ring.features();
        assert!(features.single_issuer && features.defer_taskrun, "{features:?}");
        assert!(features.taskrun_flag);
    }

    #[test]
    fn nops_round_trip_with_tokens() {
        let mut ring = ring();
        for token in 0..5 {
            ring.nop(token).expect("queue nop");
        }
        assert_eq!(ring.in_flight(), 5);
        let mut seen = Vec::new();
        ring.turn(Wait::Block { timeout: Some(Duration::from_secs(5)) }, |_, c| {
            assert_eq!(c.op, OpKind::Nop);
            assert_eq!(c.result, 0);
            seen.push(c.token);
        })
        .expect("turn");
        // All five were submitted by one enter; they may need a second turn to be reaped.
        for _ in 0..10 {
            if seen.len() == 5 {
                break;
            }
            ring.turn(Wait::Poll, |_, c| seen.push(c.token)).expect("turn");
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn full_submission_queue_flushes_instead_of_failing() {
        let mut ring = ring();
        let sq_capacity = ring.uring.submission().capacity();
        for token in 0..(sq_capacity as u64 * 3) {
            ring.nop(token).expect("queue nop past SQ capacity");
        }
        assert!(ring.stats().sq_flushes >= 2);
        let mut count = 0;
        for _ in 0..100 {
            count += ring.turn(Wait::Block { timeout: Some(Duration::from_secs(1)) }, |_, _| {}).expect("turn");
            if ring.in_flight() == 0 {
                break;
            }
        }
        assert_eq!(count, sq_capacity * 3);
    }

    #[test]
    fn idle_poll_turn_skips_the_syscall() {
        let mut ring = ring();
        ring.turn(Wait::Poll, |_, _| {}).expect("turn");
        ring.turn(Wait::Poll, |_, _| {}).expect("turn");
        assert_eq!(ring.stats().enters, 0);
        assert_eq!(ring.stats().enters_skipped, 2);
    }

    #[test]
    fn block_with_timeout_returns_without_completions() {
        let mut ring = ring();
        let start = Instant::now();
        let n = ring
            .turn(Wait::Block { timeout: Some(Duration::from_millis(20)) }, |_, _| {})
            .expect("timeout is not an error");
        assert_eq!(n, 0);
        assert!(start.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn busy_poll_block_spins_until_timeout() {
        let mut ring = Ring::new(RingConfig { busy_poll: true, ..RingConfig::default() }).expect("ring");
        let start = Instant::now();
        ring.turn(Wait::Block { timeout: Some(Duration::from_millis(10)) }, |_, _| {}).expect("turn");
        assert!(start.elapsed() >= Duration::from_millis(10));
        ring.nop(7).expect("nop");
        let mut got = None;
        ring.turn(Wait::Block { timeout: Some(Duration::from_secs(5)) }, |_, c| {
            got = Some(c.token);
        })
        .expect("turn");
        assert_eq!(got, Some(7));
    }

    #[test]
    fn bad_ranges_hand_the_buffer_back() {
        let mut ring = ring();
        let (error, buf) = ring.recv(0, IoBuf::new(4096), 0..4097, 1).expect_err("past capacity");
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
        assert_eq!(buf.capacity(), 4096);
        let (_, buf) = ring.write_at(0, buf, 0..1, 0, 1).expect_err("past len");
        let (_, _) = ring.read_at(0, buf, 8192, 0, 1).expect_err("past capacity");
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn bad_fd_completes_with_an_errno_and_the_buffer() {
        let mut ring = ring();
        ring.read_at(-1, IoBuf::new(4096), 4096, 0, 9).expect("queued");
        let mut got = None;
        ring.turn(Wait::Block { timeout: Some(Duration::from_secs(5)) }, |_, c| got = Some(c)).expect("turn");
        let c = got.expect("completion");
        assert_eq!(c.result, -libc::EBADF);
        assert!(c.io_result().is_err());
        assert_eq!(c.into_buf().expect("buffer back").capacity(), 4096);
    }

    #[test]
    fn every_task_run_mode_builds_and_completes_ops() {
        for (mode, defer, coop) in
            [(TaskRun::Deferred, true, false), (TaskRun::Cooperative, false, true), (TaskRun::Plain, false, false)]
        {
            let mut ring = Ring::new(RingConfig { task_run: mode, ..RingConfig::default() }).expect("ring");
            let features = ring.features();
            assert_eq!((features.defer_taskrun, features.coop_taskrun), (defer, coop), "{mode:?}");
            let (mut left, right) = std::os::unix::net::UnixStream::pair().expect("socketpair");
            ring.recv(right.as_raw_fd(), IoBuf::new(4096), 0..4096, 1).map_err(|(e, _)| e).expect("recv");
            ring.nop(2).expect("nop");
            let mut got = Vec::new();
            for _ in 0..100 {
                if got.len() == 1 {
                    std::io::Write::write_all(&mut left, b"x").expect("write");
                }
                ring.turn(Wait::Block { timeout: Some(Duration::from_millis(50)) }, |_, c| {
                    got.push((c.token, c.result))
                })
                .expect("turn");
                if got.len() == 2 {
                    break;
                }
            }
            assert_eq!(got, vec![(2, 0), (1, 1)], "{mode:?}");
            // Idle busy-poll turns work in every mode (skipping the enter when they can).
            for _ in 0..3 {
                ring.turn(Wait::Poll, |_, c| panic!("idle: {c:?}")).expect("turn");
            }
        }
    }

    #[test]
    fn in_flight_limit_hands_the_buffer_back() {
        let mut ring = Ring::new(RingConfig { ops_in_flight_max: 2, ..RingConfig::default() }).expect("ring");
        ring.nop(1).expect("first");
        ring.nop(2).expect("second");
        assert_eq!(ring.nop(3).expect_err("third").kind(), ErrorKind::Limit);
        let (error, buf) = ring.read_at(0, IoBuf::new(4096), 4096, 0, 4).expect_err("limit");
        assert_eq!((error.kind(), buf.capacity()), (ErrorKind::Limit, 4096));
    }

    #[test]
    fn setup_errors_say_what_to_do() {
        let denied = setup_error(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(denied.kind(), ErrorKind::Setup);
        assert!(denied.context().contains("kernel.io_uring_disabled=0"), "{denied}");
        assert!(setup_error(io::Error::from_raw_os_error(libc::ENOMEM)).context().contains("RLIMIT_MEMLOCK"));
        assert!(unsupported("IORING_OP_X", "9.9").context().contains("Linux >= 9.9"));
    }

    #[test]
    fn config_limits_are_checked() {
        let error = Ring::new(RingConfig { entries: 0, ..RingConfig::default() }).expect_err("zero entries");
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    }
}
