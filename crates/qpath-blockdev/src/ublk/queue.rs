//! One ublk queue, served run to completion on one thread: its tags' FETCH /
//! COMMIT_AND_FETCH commands and the head's NVMe/TCP queues share one io_uring (the host
//! context's ring), so a block request is fetched, sent as an NVMe command, completed and
//! committed by one thread, in one `io_uring_enter` per turn of the loop.
//!
//! ```text
//!   FETCH(tag, buf) x depth ─► poll ─► CQE(tag): Descriptors[tag] ─► plan()
//!        ▲                                           │ Submit: Context::submit(op, buf)
//!        │                                           │ Done(result): commit at once
//!        └── COMMIT_AND_FETCH(tag, result, buf) ◄────┘ NVMe completion: bytes or -errno
//! ```
//!
//! A tag's buffer (`max_io_buf_bytes`) goes back and forth between the ublk command and
//! the NVMe command; nothing is allocated per I/O. The queue ends when every tag's fetch
//! has ended with `UBLK_IO_RES_ABORT` (the device stopped) or the server stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::head::Head;
use nvme::Status;
use uring::IoBuf;
use uring::Wait;
use uring::ublk::{CharDev, IoDesc, op};

use super::size::Sizes;
use crate::device::DeviceInfo;
use crate::errno::{errno_of, linux, refusal_status};

/// What the thread does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Send this NVMe command; commit `ok` when it succeeds.
    Submit {
        /// The host operation.
        op: Op,
        /// Byte offset.
        offset: u64,
        /// Byte length.
        len: u32,
        /// The result committed on success (bytes for reads and writes, 0 otherwise).
        ok: i32,
    },
    /// Commit this result at once (0, or a negative errno).
    Done(i32),
}

/// Turns a ublk descriptor into an NVMe command, or an immediate answer when the request
/// cannot be served: past the end or misaligned (the target would refuse it with LBA Out
/// of Range: `EREMOTEIO`, as Linux gives), longer than the buffer (`EINVAL`), or an
/// operation the namespace does not have (`EOPNOTSUPP`).
pub fn plan(d: &IoDesc, info: &DeviceInfo, buf_cap: usize) -> Planned {
    // A flush carries no range: its start sector is whatever the block layer left there
    // (blk-flush's own requests have -1).
    if d.op == op::FLUSH {
        return if info.volatile_cache {
            Planned::Submit { op: Op::Flush, offset: 0, len: 0, ok: 0 }
        } else {
            Planned::Done(0)
        };
    }
    let refused = -errno_of(Status::LBA_OUT_OF_RANGE);
    let (Some(offset), Some(len)) = (d.start_sector.checked_mul(512), u64::from(d.nr_sectors).checked_mul(512)) else {
        return Planned::Done(refused);
    };
    let bs = u64::from(info.block_size());
    let inside = offset.checked_add(len).is_some_and(|end| end <= info.size);
    let aligned = offset.is_multiple_of(bs) && len.is_multiple_of(bs);
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    match d.op {
        op::READ | op::WRITE => {
            if len == 0 {
                return Planned::Done(0);
            }
            if !inside || !aligned {
                return Planned::Done(refused);
            }
            if len > buf_cap as u64 || len32 > info.max_transfer {
                return Planned::Done(-linux::EINVAL);
            }
            let op = match (d.op, fua(d, info)) {
                (op::READ, _) => Op::Read,
                (_, true) => Op::WriteFua,
                (_, false) => Op::Write,
            };
            Planned::Submit { op, offset, len: len32, ok: i32::try_from(len).unwrap_or(i32::MAX) }
        }
        op::DISCARD | op::WRITE_ZEROES => {
            // A discard's FUA (the kernel sets none) has nothing to ask of Dataset
            // Management, which has no FUA bit; what a deallocated block reads is not
            // data anyone relies on surviving (DLFEAT).
            let (supported, op) = match (d.op, fua(d, info)) {
                (op::DISCARD, _) => (info.discard, Op::Deallocate),
                (_, true) => (info.write_zeroes, Op::WriteZeroesFua),
                (_, false) => (info.write_zeroes, Op::WriteZeroes),
            };
            if !supported {
                return Planned::Done(-linux::EOPNOTSUPP);
            }
            if len == 0 {
                return Planned::Done(0);
            }
            if !inside || !aligned {
                return Planned::Done(refused);
            }
            if len >> info.block_shift > info.zero_blocks_max {
                return Planned::Done(-linux::EINVAL);
            }
            Planned::Submit { op, offset, len: len32, ok: 0 }
        }
        _ => Planned::Done(-linux::EOPNOTSUPP),
    }
}

/// Whether request `d` goes to the namespace with Force Unit Access. The kernel sends
/// `UBLK_IO_F_FUA` only to a device that offered it (`UBLK_ATTR_FUA`, which
/// [`super::params::params_of`] sets with a volatile write cache, as Linux's NVMe driver
/// offers FUA only with VWC, `drivers/nvme/host/core.c`). Without a volatile cache every
/// write is durable when it completes (NVMe Base 2.1, Identify Controller VWC), so the
/// flag asks for nothing more and the command goes without it.
fn fua(d: &IoDesc, info: &DeviceInfo) -> bool {
    d.flags & uring::ublk::io_flags::FUA != 0 && info.volatile_cache
}

/// Counters of one queue, written by its thread alone (a plain store per loop turn, never
/// per I/O), read by anyone.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Requests committed.
    pub requests_total: AtomicU64,
    /// Requests committed with an error.
    pub errors_total: AtomicU64,
    /// `io_uring_enter` calls of the queue's ring (ublk and NVMe/TCP together).
    pub enters_total: AtomicU64,
    /// Ring completions (ublk commands and NVMe/TCP socket operations).
    pub completions_total: AtomicU64,
    /// Loop turns (one blocking `io_uring_enter` each) by what they brought, to show
    /// where a batch's wake-ups go: nothing the queue acts on (a timeout, a send's or a
    /// partial receive's completion), new requests only, NVMe completions only, both.
    pub turns_total: [AtomicU64; 4],
    /// The queue's thread is serving.
    pub running: AtomicBool,
}

/// What a queue thread needs.
pub struct QueueSetup {
    /// The queue.
    pub q_id: u16,
    /// `/dev/ublkcN`.
    pub dev: Arc<CharDev>,
    /// The namespace.
    pub head: Arc<Head>,
    /// Its limits.
    pub info: DeviceInfo,
    /// The completion context's options.
    pub context: ContextOptions,
    /// Set to end the queue (after its requests in flight complete).
    pub stop: Arc<AtomicBool>,
    /// Counters.
    pub stats: Arc<QueueStats>,
    /// Where the queue reports its namespace's size when it changes.
    pub sizes: Arc<Sizes>,
}

/// How long a poll sleeps when nothing happens while NVMe commands are in flight (the
/// context's timers, which time out, fail over and fail them, run on its turns: seconds,
/// so a tenth of one is soon enough). Any completion ends the wait first. Its half bounds
/// how long a turn may hold for its answers (the host context's hold follows their latency):
/// with answers taking tens of ms (a VM under emulation), a 20 ms wait held only 10 ms and
/// woke for the sends' completions alone before them.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// How long a poll sleeps when the queue has no NVMe command in flight: the context's timers
/// have nothing of this queue's to act on, a new request or the device's stop wakes the
/// ring at once (a FETCH completes), and the stop flag alone is seen within this time; so
/// an idle queue wakes 4 times a second, not 50.
const IDLE_WAIT_EMPTY: Duration = Duration::from_millis(250);
/// How long a stopping queue waits for its NVMe commands in flight.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Runs queue `s.q_id` until its device stops or `s.stop` is set; `ready` hears once all
/// its tags are fetched (or why the queue could not start).
pub fn run(mut s: QueueSetup, ready: SyncSender<Result<(), String>>) {
    let q = s.q_id;
    // The kernel's requests come in batches and their commits go back together: a turn
    // waits for a batch's answers on every path rather than waking for each path's.
    let mut ctx = match Context::new(ContextOptions { wait_every_path: true, ..s.context.clone() }) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("queue {q}: completion context: {e}")));
            return;
        }
    };
    let dev = match ctx.open_head(&s.head) {
        Ok(d) => d,
        Err(e) => {
            let _ = ready.send(Err(format!(
                "queue {q}: no I/O queue of the namespace's controllers left for it ({e}); connect with more I/O queues"
            )));
            return;
        }
    };
    let descs = match s.dev.map_queue(q) {
        Ok(d) => d,
        Err(e) => {
            let _ = ready.send(Err(format!("queue {q}: {e}")));
            return;
        }
    };
    let depth = s.dev.info().queue_depth;
    let cap = (s.dev.info().max_io_buf_bytes as usize).next_multiple_of(uring::IO_ALIGN);
    for tag in 0..depth {
        if let Err((e, _)) = ctx.ring().ublk_fetch(&s.dev, q, tag, IoBuf::new(cap), Context::user_token(u64::from(tag)))
        {
            let _ = ready.send(Err(format!("queue {q}: fetch of tag {tag}: {e}")));
            return;
        }
    }
    // The fetches reach the kernel with this turn; START_DEV waits for them.
    if let Err(e) = ctx.poll(Wait::Poll) {
        let _ = ready.send(Err(format!("queue {q}: {e}")));
        return;
    }
    let _ = ready.send(Ok(()));
    s.stats.running.store(true, Ordering::Relaxed);
    let mut bufs: Vec<Option<IoBuf>> = (0..depth).map(|_| None).collect();
    let mut ok: Vec<i32> = vec![0; usize::from(depth)];
    let mut fetching = usize::from(depth);
    let mut nvme = 0usize;
    let (mut requests, mut errors) = (0u64, 0u64);
    let mut stop_at: Option<Instant> = None;
    // A turn's completions, moved out of the context (the loop submits through it while it
    // walks them); their room is taken once here, never per turn.
    let mut fetched = Vec::with_capacity(usize::from(depth));
    let mut done = Vec::with_capacity(usize::from(depth));
    let mut turns = [0u64; 4];
    loop {
        if s.stop.load(Ordering::Relaxed) && stop_at.is_none() {
            stop_at = Some(Instant::now());
        }
        if fetching == 0 && nvme == 0 {
            break;
        }
        if stop_at.is_some_and(|t| t.elapsed() > STOP_GRACE) {
            tracing::warn!(queue = q, in_flight = nvme, "ublk queue stopping with NVMe commands still in flight");
            break;
        }
        if stop_at.is_some() && nvme == 0 {
            // Fetches left in flight are cancelled when the ring goes away (the kernel
            // requeues their requests for the next server: user recovery).
            break;
        }
        let idle = if nvme == 0 && stop_at.is_none() { IDLE_WAIT_EMPTY } else { IDLE_WAIT };
        if let Err(e) = ctx.poll(Wait::Block { timeout: Some(idle) }) {
            tracing::warn!(queue = q, error = %e, "ublk queue ring failed");
            break;
        }
        // The context re-reads the namespace's size on each turn (a resize): this turn's
        // requests are planned against it, and the device's size thread hears of it.
        let size = ctx.capacity(dev);
        if size != s.info.size {
            s.info.size = size;
            s.sizes.report(q, size);
        }
        fetched.extend(ctx.user_completions());
        let turn_had_requests = !fetched.is_empty();
        for c in fetched.drain(..) {
            let tag = u16::try_from(Context::user_value(c.token)).unwrap_or(u16::MAX);
            let buf = match c.payload {
                uring::Payload::Buf(b) => b,
                _ => continue,
            };
            if c.result != 0 {
                // UBLK_IO_RES_ABORT (-ENODEV): the device stopped; anything else: refused.
                if c.result != -linux::ENODEV {
                    tracing::warn!(queue = q, tag, errno = -c.result, "ublk fetch refused by the kernel");
                }
                fetching -= 1;
                drop(buf);
                continue;
            }
            let Some(d) = descs.get(tag) else { continue };
            let idx = usize::from(tag);
            let commit_now = match plan(&d, &s.info, buf.capacity()) {
                Planned::Done(r) => Some((r, buf)),
                Planned::Submit { op, offset, len, ok: done_ok } => {
                    let mut buf = buf;
                    let data = op.has_data();
                    if data {
                        buf.set_len(len as usize);
                    }
                    ok[idx] = done_ok;
                    let (b, keep) = if data { (Some(buf), None) } else { (None, Some(buf)) };
                    match ctx.submit(dev, op, offset, len, b, u64::from(tag)) {
                        Ok(()) => {
                            bufs[idx] = keep;
                            nvme += 1;
                            None
                        }
                        Err((e, back)) => {
                            if e.kind == host::ErrorKind::NamespaceGone {
                                // The host said it once at warn level; every I/O gets it now.
                                tracing::debug!(queue = q, tag, error = %e, "ublk request refused by the host context");
                            } else {
                                tracing::warn!(queue = q, tag, error = %e, "ublk request refused by the host context");
                            }
                            let r = -errno_of(refusal_status(e.kind));
                            Some((r, back.or(keep).expect("the buffer comes back")))
                        }
                    }
                }
            };
            if let Some((r, buf)) = commit_now {
                requests += 1;
                errors += u64::from(r < 0);
                if !commit(&mut ctx, &s.dev, q, tag, r, buf) {
                    fetching -= 1;
                }
            }
        }
        done.extend(ctx.completions());
        turns[usize::from(turn_had_requests) | usize::from(!done.is_empty()) << 1] += 1;
        for c in done.drain(..) {
            nvme -= 1;
            let tag = u16::try_from(c.token).unwrap_or(u16::MAX);
            let idx = usize::from(tag);
            let Some(buf) = c.buf.or_else(|| bufs.get_mut(idx).and_then(Option::take)) else {
                tracing::warn!(queue = q, tag, "ublk request's buffer lost; the tag is retired");
                fetching -= 1;
                continue;
            };
            let r = if c.status.is_success() { ok[idx] } else { -errno_of(c.status) };
            requests += 1;
            if r < 0 {
                errors += 1;
                tracing::debug!(queue = q, tag, status = %c.status, errno = -r, "ublk request failed");
            }
            if !commit(&mut ctx, &s.dev, q, tag, r, buf) {
                fetching -= 1;
            }
        }
        let rs = ctx.ring().stats();
        s.stats.requests_total.store(requests, Ordering::Relaxed);
        s.stats.errors_total.store(errors, Ordering::Relaxed);
        s.stats.enters_total.store(rs.enters, Ordering::Relaxed);
        s.stats.completions_total.store(rs.completions, Ordering::Relaxed);
        for (total, n) in s.stats.turns_total.iter().zip(turns) {
            total.store(n, Ordering::Relaxed);
        }
    }
    s.stats.running.store(false, Ordering::Relaxed);
    tracing::info!(queue = q, requests, errors, "ublk queue ended");
}

/// Commits `tag` and fetches its next request; false if the ring refused (tag retired).
fn commit(ctx: &mut Context, dev: &CharDev, q: u16, tag: u16, result: i32, buf: IoBuf) -> bool {
    match ctx.ring().ublk_commit_and_fetch(dev, q, tag, result, buf, Context::user_token(u64::from(tag))) {
        Ok(()) => true,
        Err((e, _)) => {
            tracing::warn!(queue = q, tag, error = %e, "ublk commit refused by the ring; the tag is retired");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DeviceInfo {
        DeviceInfo {
            subnqn: "nqn.x:y".into(),
            nsid: 1,
            size: 1 << 20,
            block_shift: 12,
            physical_shift: 12,
            io_opt_shift: 0,
            max_transfer: 128 << 10,
            discard: true,
            discard_granularity: 4096,
            write_zeroes: false,
            zero_blocks_max: 65536,
            volatile_cache: false,
            read_only: false,
        }
    }

    fn d(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc { op, flags, nr_sectors, start_sector, addr: 0 }
    }

    #[test]
    fn requests_become_nvme_commands() {
        let i = info();
        assert_eq!(
            plan(&d(op::READ, 0, 8, 8), &i, 128 << 10),
            Planned::Submit { op: Op::Read, offset: 4096, len: 4096, ok: 4096 }
        );
        assert_eq!(
            plan(&d(op::WRITE, 0, 0, 256), &i, 128 << 10),
            Planned::Submit { op: Op::Write, offset: 0, len: 128 << 10, ok: 128 << 10 }
        );
        assert_eq!(
            plan(&d(op::DISCARD, 0, 0, 2048), &i, 0),
            Planned::Submit { op: Op::Deallocate, offset: 0, len: 1 << 20, ok: 0 }
        );
        assert_eq!(plan(&d(op::FLUSH, 0, 0, 0), &i, 0), Planned::Done(0), "no volatile cache: nothing to flush");
        let vwc = DeviceInfo { volatile_cache: true, ..info() };
        assert_eq!(plan(&d(op::FLUSH, 0, 0, 0), &vwc, 0), Planned::Submit { op: Op::Flush, offset: 0, len: 0, ok: 0 });
        // blk-flush's own flush requests start at sector -1 (blk_rq_init): not a range.
        assert_eq!(
            plan(&d(op::FLUSH, 0, u64::MAX, 0), &vwc, 0),
            Planned::Submit { op: Op::Flush, offset: 0, len: 0, ok: 0 }
        );
    }

    #[test]
    fn a_fua_request_is_a_fua_command_on_a_volatile_cache_and_a_plain_one_without() {
        use uring::ublk::io_flags::FUA;
        let vwc = DeviceInfo { volatile_cache: true, write_zeroes: true, ..info() };
        assert_eq!(
            plan(&d(op::WRITE, FUA, 0, 8), &vwc, 128 << 10),
            Planned::Submit { op: Op::WriteFua, offset: 0, len: 4096, ok: 4096 }
        );
        assert_eq!(
            plan(&d(op::WRITE, 0, 0, 8), &vwc, 128 << 10),
            Planned::Submit { op: Op::Write, offset: 0, len: 4096, ok: 4096 },
            "no FUA asked, none sent"
        );
        assert_eq!(
            plan(&d(op::WRITE_ZEROES, FUA, 8, 16), &vwc, 0),
            Planned::Submit { op: Op::WriteZeroesFua, offset: 4096, len: 8192, ok: 0 }
        );
        assert_eq!(
            plan(&d(op::DISCARD, FUA, 8, 16), &vwc, 0),
            Planned::Submit { op: Op::Deallocate, offset: 4096, len: 8192, ok: 0 },
            "Dataset Management has no FUA"
        );
        // Without a volatile cache a completed write is durable: FUA adds nothing.
        let no_vwc = DeviceInfo { write_zeroes: true, ..info() };
        assert_eq!(
            plan(&d(op::WRITE, FUA, 0, 8), &no_vwc, 128 << 10),
            Planned::Submit { op: Op::Write, offset: 0, len: 4096, ok: 4096 }
        );
        assert_eq!(
            plan(&d(op::WRITE_ZEROES, FUA, 8, 16), &no_vwc, 0),
            Planned::Submit { op: Op::WriteZeroes, offset: 4096, len: 8192, ok: 0 }
        );
    }

    #[test]
    fn bad_requests_get_their_own_error() {
        let i = info();
        let past_end = -errno_of(Status::LBA_OUT_OF_RANGE);
        assert_eq!(plan(&d(op::READ, 0, 2040, 16), &i, 128 << 10), Planned::Done(past_end), "past the end");
        assert_eq!(plan(&d(op::WRITE, 0, 1, 8), &i, 128 << 10), Planned::Done(past_end), "not block aligned");
        assert_eq!(
            plan(&d(op::READ, 0, u64::MAX / 256, 8), &i, 128 << 10),
            Planned::Done(past_end),
            "offset overflows"
        );
        assert_eq!(
            plan(&d(op::READ, 0, 0, 512), &i, 128 << 10),
            Planned::Done(-linux::EINVAL),
            "longer than the buffer"
        );
        assert_eq!(plan(&d(op::WRITE_ZEROES, 0, 0, 8), &i, 0), Planned::Done(-linux::EOPNOTSUPP));
        assert_eq!(plan(&d(op::WRITE_SAME, 0, 0, 8), &i, 0), Planned::Done(-linux::EOPNOTSUPP));
        assert_eq!(plan(&d(77, 0, 0, 8), &i, 0), Planned::Done(-linux::EOPNOTSUPP));
        assert_eq!(plan(&d(op::READ, 0, 0, 0), &i, 0), Planned::Done(0));
    }
}
