//! Compare, Compare and Write, Copy and Verify on a connection: the NVM commands that take
//! more than one backend operation, as short state machines over the request slot
//! ([`Step`]), plus the range-lock gate every write passes ([`crate::range_lock`]).
//!
//! ```text
//!  Compare        null: data == zeros   RAM: region == data   file: read -> compare
//!  Compare+Write  (FUSE 01b Compare, then FUSE 10b Write with the same NSID, SLBA and NLB)
//!                 both data in -> lock the blocks -> read, compare -> write -> unlock
//!                 miscompare: Compare Failure, Write "Failed Fused Command", nothing written
//!  Copy           check every range and the destination -> gather all sources in one
//!                 buffer -> take the destination's write gate -> write it once
//!  Verify         null, RAM: nothing to read; file: read the range in MDTS chunks
//! ```
//!
//! Buffers come from the reactor's pool before any lock is taken (a request that holds
//! blocks never waits for memory), and a request waiting for blocks waits in its slot,
//! retried from the connection's timers: nothing here blocks the thread.

use std::cmp::Reverse;
use std::sync::Arc;

use nvme::copy::{RANGE_SIZE, SourceRange};
use nvme::opcode::{fuse, io};
use nvme::{Sqe, Status};
use uring::IoBuf;

use super::{ConnCtx, ConnState, Connection, Fused, FusedFirst, ReqKind, ReqState, Step};
use crate::backend::{Backend, FileOp};
use crate::io_cmd::{self, IoKind};
use crate::namespace::Namespace;
use crate::range_lock::Hold;

/// First wait before a range-lock retry; it doubles up to [`RANGE_RETRY_MAX_NS`]. A lock
/// on RAM drains within a reactor turn, one on a file within a write.
const RANGE_RETRY_MIN_NS: u32 = 20_000;
const RANGE_RETRY_MAX_NS: u32 = 1_000_000;

/// A Copy's second and later source ranges are read through a buffer of this size (then
/// copied to their place among the gathered sources): the file backend reads into the
/// start of a buffer.
const COPY_CHUNK_BYTES: usize = 64 * 1024;

/// Compare chunk on the stack (RAM regions are read out in pieces this size).
const COMPARE_CHUNK_BYTES: usize = 4096;

type Verdict = Result<(ReqKind, u32, u32), Status>;

fn block_range(ns: &Namespace, offset: u64, len: u64) -> std::ops::Range<u64> {
    (offset >> ns.block_shift)..((offset + len) >> ns.block_shift)
}

/// Whether the region's bytes at `offset` equal `data` (read out through a stack buffer).
fn region_equals(region: &uring::SharedRegion, offset: usize, data: &[u8]) -> Result<bool, uring::Error> {
    let mut tmp = [0u8; COMPARE_CHUNK_BYTES];
    for (i, want) in data.chunks(COMPARE_CHUNK_BYTES).enumerate() {
        let got = &mut tmp[..want.len()];
        region.copy_from_region(offset + i * COMPARE_CHUNK_BYTES, got)?;
        if got != want {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The `k`th source range of a Copy's data.
fn copy_range(data: &[u8], k: u64) -> SourceRange {
    let at = usize::try_from(k).unwrap_or(usize::MAX).saturating_mul(RANGE_SIZE);
    SourceRange::decode(data.get(at..).unwrap_or(&[]))
}

/// NVMe Base 2.0 §3.4.2: the commands of a fused operation name the same blocks.
fn same_blocks(compare: &Sqe, write: &Sqe) -> bool {
    compare.nsid() == write.nsid() && compare.slba() == write.slba() && compare.nlb() == write.nlb()
}

impl Connection {
    // ------------------------------------------------------------ fused pairs

    /// Applies the fused-operation rules to a command that just arrived on an I/O queue
    /// (NVMe Base 2.0 §3.4.2; NVM Command Set 1.0 §3.2.3 Compare and Write): the first
    /// command (FUSE 01b) must be a Compare and the very next command on the queue its
    /// Write (FUSE 10b) over the same blocks. Returns the command's verdict, failed as
    /// the rules say.
    ///
    /// - no Write next: the Compare ends with Missing Fused Command (as SPDK does);
    /// - a FUSE 10b command with no Compare before it: Missing Fused Command;
    /// - the first command failed (any status): its Write ends with Failed Fused Command;
    /// - the Write fails its own checks: it ends with that status, the Compare with
    ///   Failed Fused Command;
    /// - a FUSE 10b command that is not a Write: Invalid Field, the Compare Missing
    ///   Fused Command; a Write over other blocks: both Invalid Field (the spec's
    ///   "should be aborted with Invalid Field in Command");
    /// - FUSE 11b (reserved), or FUSE 01b on anything but a Compare: Invalid Field (only
    ///   Compare and Write is offered, Identify Controller FUSES bit 0).
    pub(super) fn pair_fused(&mut self, slot: u16, verdict: Verdict, ctx: &mut ConnCtx<'_>) -> Verdict {
        let sqe = self.reqs[usize::from(slot)].sqe;
        let f = if sqe.is_fabrics() { fuse::NONE } else { sqe.fuse() };
        let pending = self.fused_first.take();
        if f != fuse::SECOND
            && let Some(FusedFirst::Pending(first)) = pending
        {
            self.abort_first(first, Status::FUSED_MISSING, ctx);
        }
        match f {
            fuse::NONE => verdict,
            fuse::FIRST => match verdict {
                Ok((ReqKind::Io(IoKind::Compare { .. }), ..)) => {
                    self.reqs[usize::from(slot)].fused = Fused::First(None);
                    self.fused_first = Some(FusedFirst::Pending(slot));
                    verdict
                }
                Ok(_) => {
                    self.fused_first = Some(FusedFirst::Failed);
                    Err(Status::INVALID_FIELD)
                }
                Err(s) => {
                    self.fused_first = Some(FusedFirst::Failed);
                    Err(s)
                }
            },
            fuse::SECOND => match pending {
                None => Err(Status::FUSED_MISSING),
                Some(FusedFirst::Failed) => Err(Status::FUSED_FAILED),
                Some(FusedFirst::Pending(first)) => {
                    let compare = self.reqs[usize::from(first)].sqe;
                    match verdict {
                        Ok((ReqKind::Io(IoKind::Write { .. }), ..)) if same_blocks(&compare, &sqe) => {
                            self.reqs[usize::from(first)].fused = Fused::First(Some(slot));
                            self.reqs[usize::from(slot)].fused = Fused::Second(first);
                            verdict
                        }
                        Ok((ReqKind::Io(IoKind::Write { .. }), ..)) => {
                            self.abort_first(first, Status::INVALID_FIELD, ctx);
                            Err(Status::INVALID_FIELD)
                        }
                        Ok(_) => {
                            self.abort_first(first, Status::FUSED_MISSING, ctx);
                            Err(Status::INVALID_FIELD)
                        }
                        Err(s) => {
                            let why =
                                if sqe.opcode() == io::WRITE { Status::FUSED_FAILED } else { Status::FUSED_MISSING };
                            self.abort_first(first, why, ctx);
                            Err(s)
                        }
                    }
                }
            },
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Fails the Compare of a fused operation that will not run: now if its data is in,
    /// else when its data arrives (the host still sends what it was asked for).
    fn abort_first(&mut self, first: u16, status: Status, ctx: &mut ConnCtx<'_>) {
        let r = &mut self.reqs[usize::from(first)];
        r.status = status;
        r.fused = Fused::None;
        if r.state == ReqState::FusedWait {
            self.respond(first, ctx);
        }
    }

    /// A command of a fused operation is being answered on its own (it failed before the
    /// operation ran): the other one is aborted with Failed Fused Command.
    pub(super) fn fused_unlink(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let partner = match std::mem::replace(&mut self.reqs[usize::from(slot)].fused, Fused::None) {
            Fused::None => return,
            Fused::First(None) => {
                if self.fused_first == Some(FusedFirst::Pending(slot)) {
                    self.fused_first = Some(FusedFirst::Failed);
                }
                return;
            }
            Fused::First(Some(p)) | Fused::Second(p) => p,
        };
        let p = &mut self.reqs[usize::from(partner)];
        if p.fused == Fused::None || p.state == ReqState::Free {
            return;
        }
        p.fused = Fused::None;
        if p.status.is_success() {
            p.status = Status::FUSED_FAILED;
        }
        if p.state == ReqState::FusedWait {
            self.respond(partner, ctx);
        }
    }

    /// On the tick: a Compare whose Write has not arrived within the PDU timeout ends with
    /// Missing Fused Command (a host sends both capsules back to back).
    pub(super) fn fused_timeout(&mut self, ctx: &mut ConnCtx<'_>) {
        let Some(FusedFirst::Pending(first)) = self.fused_first else { return };
        let limit_ns = self.target.limits.pdu_timeout_ms().saturating_mul(1_000_000);
        if ctx.now_ns.saturating_sub(self.reqs[usize::from(first)].start_ns) > limit_ns {
            self.fused_first = None;
            self.abort_first(first, Status::FUSED_MISSING, ctx);
        }
    }

    /// A command of a fused operation has its data: the operation runs once both have.
    pub(super) fn fused_exec(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        // The Write retrying its blocks' lock (the operation has started) stays where it is,
        // keeping its backoff; a command whose data just came in waits for the other.
        let retry = matches!(self.reqs[usize::from(slot)].state, ReqState::RangeWait { .. });
        if !retry && !self.req_to(slot, ReqState::FusedWait, ctx) {
            return;
        }
        let (first, second) = match self.reqs[usize::from(slot)].fused {
            Fused::First(Some(second)) => (slot, second),
            Fused::Second(first) => (first, slot),
            // The Write has not arrived yet.
            Fused::First(None) | Fused::None => return,
        };
        let waiting = |s: u16| s == slot || self.reqs[usize::from(s)].state == ReqState::FusedWait;
        if waiting(first) && waiting(second) {
            self.caw_start(first, second, ns, ctx);
        }
    }

    /// Compare and Write: buffers, then the blocks' lock, then the compare. The Write's
    /// slot drives it (its timers, its file operations); the Compare waits in FusedWait.
    fn caw_start(&mut self, first: u16, second: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Compare { offset, len } = self.io_kind(first) else {
            return self.caw_internal(first, second, ctx);
        };
        let blocks = block_range(ns, offset, u64::from(len));
        let len = len as usize;
        if let Backend::Null = ns.backend {
            // No data, no lock: deallocated blocks read as zeros, writes are dropped.
            let equal = self.reqs[usize::from(first)].buf.as_ref().is_some_and(|b| b[..len].iter().all(|&x| x == 0));
            return self.caw_compared(first, second, equal, ns, ctx);
        }
        if matches!(ns.backend, Backend::File(_)) && !self.exec_buf(second, len, ctx) {
            return;
        }
        if !self.range_lock(second, ns, blocks.clone(), ctx) {
            return;
        }
        // Under the lock, the Write's capacity and reservation again: a shrink may have cut
        // its blocks off, a preempting host fenced this one, while the pair waited (see
        // `Connection::size_recheck`, `Connection::resv_recheck`).
        if let Err(status) = Self::size_recheck(ns, &blocks).and_then(|()| self.resv_recheck(second, ns)) {
            self.reqs[usize::from(first)].status = Status::FUSED_FAILED;
            self.reqs[usize::from(second)].status = status;
            return self.caw_finish(first, second, ctx);
        }
        match &ns.backend {
            Backend::Ram(region) => {
                let data = self.reqs[usize::from(first)].buf.as_ref().map(|b| &b[..len]);
                match data.map(|d| region_equals(region, crate::us(offset), d)) {
                    Some(Ok(equal)) => self.caw_compared(first, second, equal, ns, ctx),
                    _ => self.caw_internal(first, second, ctx),
                }
            }
            Backend::File(f) => {
                let aux = self.reqs[usize::from(second)].aux.take().unwrap_or_else(|| IoBuf::new(4096));
                self.reqs[usize::from(second)].step = Step::CawRead;
                self.step_submit(second, ns, FileOp::Read { file: f.file(), buf: aux, len, offset }, ctx);
            }
            Backend::Null => {}
        }
    }

    /// The compare is done (`equal` or not), under the lock: write, or end both.
    fn caw_compared(&mut self, first: u16, second: u16, equal: bool, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        if !equal {
            // NVM Command Set 1.0 §3.2.3: the Write is aborted and the blocks are unchanged.
            self.reqs[usize::from(first)].status = Status::COMPARE_FAILURE;
            self.reqs[usize::from(second)].status = Status::FUSED_FAILED;
            return self.caw_finish(first, second, ctx);
        }
        let IoKind::Write { offset, len, fua } = self.io_kind(second) else {
            return self.caw_internal(first, second, ctx);
        };
        let len = len as usize;
        match &ns.backend {
            Backend::Null => {}
            Backend::Ram(region) => {
                let r = &mut self.reqs[usize::from(second)];
                let written = r.buf.as_ref().map(|b| region.copy_to_region(crate::us(offset), &b[..len]));
                if !matches!(written, Some(Ok(()))) {
                    r.status = Status::INTERNAL;
                }
            }
            Backend::File(f) => {
                let r = &mut self.reqs[usize::from(second)];
                let buf = r.buf.take().unwrap_or_else(|| IoBuf::new(4096));
                r.step = Step::CawWrite;
                r.cursor = u64::from(fua);
                return self.step_submit(second, ns, FileOp::Write { file: f.file(), buf, len, offset }, ctx);
            }
        }
        self.caw_finish(first, second, ctx);
    }

    /// Something that cannot happen did (a fused pair without its data): both fail.
    fn caw_internal(&mut self, first: u16, second: u16, ctx: &mut ConnCtx<'_>) {
        tracing::error!(first, second, "compare and write without its commands' data");
        self.reqs[usize::from(first)].status = Status::INTERNAL;
        self.reqs[usize::from(second)].status = Status::FUSED_FAILED;
        self.caw_finish(first, second, ctx);
    }

    /// Ends a Compare and Write: unlocks its blocks and answers both commands.
    fn caw_finish(&mut self, first: u16, second: u16, ctx: &mut ConnCtx<'_>) {
        self.reqs[usize::from(first)].fused = Fused::None;
        self.reqs[usize::from(second)].fused = Fused::None;
        self.reqs[usize::from(second)].step = Step::Idle;
        self.range_release(second);
        if let Some(b) = self.reqs[usize::from(second)].aux.take() {
            self.buf_put(ctx, b);
        }
        self.respond(first, ctx);
        self.finish_io(second, ctx);
    }

    // ------------------------------------------------------------ range locks

    /// The write gate of `blocks` for `slot` (see [`crate::range_lock`]): true when the write
    /// may go ahead; false when it waits (retried from the timers).
    pub(super) fn range_gate(
        &mut self,
        slot: u16,
        ns: &Arc<Namespace>,
        blocks: std::ops::Range<u64>,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        if let Backend::Null = ns.backend {
            return true;
        }
        let r = &mut self.reqs[usize::from(slot)];
        let granted = if r.hold == Hold::None {
            let (hold, granted) = ns.locks.write_begin(self.shard, blocks);
            r.hold = hold;
            r.ns_addr = Arc::as_ptr(ns) as usize;
            granted
        } else {
            ns.locks.poll(r.hold)
        };
        if !granted {
            self.wait_range(slot, ctx);
        }
        granted
    }

    /// A data-changing command's blocks against the capacity again, once past its write gate
    /// or lock: a shrink may have cut them off since the command was checked on arrival (it
    /// waited for its data, a buffer, QoS). With the gate's handshake, a write the shrink
    /// does not wait out reads the smaller capacity here (see [`crate::namespace`]).
    pub(super) fn size_recheck(ns: &Namespace, blocks: &std::ops::Range<u64>) -> Result<(), Status> {
        if ns.still_within(blocks) { Ok(()) } else { Err(Status::LBA_OUT_OF_RANGE) }
    }

    /// A fused operation's lock on `blocks`: true once granted; false while it waits.
    pub(super) fn range_lock(
        &mut self,
        slot: u16,
        ns: &Arc<Namespace>,
        blocks: std::ops::Range<u64>,
        ctx: &mut ConnCtx<'_>,
    ) -> bool {
        let r = &mut self.reqs[usize::from(slot)];
        let granted = if r.hold == Hold::None {
            let (hold, granted) = ns.locks.lock_begin(blocks);
            r.hold = hold;
            r.ns_addr = Arc::as_ptr(ns) as usize;
            granted
        } else {
            ns.locks.poll(r.hold)
        };
        if !granted {
            self.wait_range(slot, ctx);
        }
        granted
    }

    /// Parks `slot` until its next range-lock retry (exponential backoff on the timers: no
    /// other thread wakes this one).
    fn wait_range(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let backoff_ns = match self.reqs[usize::from(slot)].state {
            ReqState::RangeWait { backoff_ns, .. } => backoff_ns,
            _ => 0,
        };
        let backoff_ns = backoff_ns.saturating_mul(2).clamp(RANGE_RETRY_MIN_NS, RANGE_RETRY_MAX_NS);
        let due_ns = ctx.now_ns + u64::from(backoff_ns);
        if self.req_to(slot, ReqState::RangeWait { due_ns, backoff_ns }, ctx) {
            self.timers.push(Reverse((due_ns, slot)));
        }
    }

    /// Gives back what `slot` holds in its namespace's range locks (done, failed, or
    /// abandoned with its connection). A namespace removed meanwhile takes its locks with it.
    pub(super) fn range_release(&mut self, slot: u16) {
        let Some(r) = self.reqs.get_mut(usize::from(slot)) else { return };
        let hold = std::mem::take(&mut r.hold);
        if hold == Hold::None {
            return;
        }
        let (nsid, addr) = (r.sqe.nsid(), r.ns_addr);
        let same = |n: &&Arc<Namespace>| Arc::as_ptr(n) as usize == addr;
        let ns =
            self.ns.get(nsid).filter(same).or_else(|| self.retired_ns.iter().find_map(|m| m.get(nsid).filter(same)));
        match ns {
            Some(ns) => ns.locks.end(hold),
            None => tracing::debug!(nsid = nsid.0, "range lock of a namespace that is gone"),
        }
    }

    // ----------------------------------------------------------------- buffers

    /// A buffer of `len` bytes for `slot`. The per-connection cap is not applied against
    /// the buffers the request and its fused partner already hold (their data is in, and
    /// they wait for each other), so a fused operation cannot wait for itself; the
    /// reactor's pool cap still applies.
    pub(super) fn buf_get_for(&mut self, slot: u16, len: usize, ctx: &mut ConnCtx<'_>) -> Option<IoBuf> {
        let bytes = |r: &super::Req| -> usize {
            [&r.buf, &r.aux, &r.aux2].iter().filter_map(|b| b.as_ref()).map(IoBuf::capacity).sum()
        };
        let r = &self.reqs[usize::from(slot)];
        let partner = match r.fused {
            Fused::Second(p) | Fused::First(Some(p)) => bytes(&self.reqs[usize::from(p)]),
            _ => 0,
        };
        if self.buf_bytes <= bytes(r) + partner {
            ctx.pool.get(len).inspect(|b| self.buf_bytes += b.capacity())
        } else {
            self.buf_get(ctx, len)
        }
    }

    /// Gives `slot` its execution buffer (`aux`) of `len` bytes unless it has one; false: it
    /// waits for one ([`Connection::pump`]).
    fn exec_buf(&mut self, slot: u16, len: usize, ctx: &mut ConnCtx<'_>) -> bool {
        if self.reqs[usize::from(slot)].aux.is_some() {
            return true;
        }
        let b = self.buf_get_for(slot, len, ctx);
        let r = &mut self.reqs[usize::from(slot)];
        match b {
            Some(mut b) => {
                b.set_len(len);
                r.aux = Some(b);
                true
            }
            None => {
                self.wait_buffer(slot, ReqState::AwaitExecBuffer, ctx);
                false
            }
        }
    }

    fn io_kind(&self, slot: u16) -> IoKind {
        match self.reqs[usize::from(slot)].kind {
            ReqKind::Io(k) => k,
            _ => IoKind::Flush,
        }
    }

    // ------------------------------------------------------------------ Compare

    /// Compare (not fused): the blocks against the host's data; a difference is Compare
    /// Failure (NVM Command Set 1.0 §3.2.1).
    pub(super) fn compare_exec(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Compare { offset, len } = self.io_kind(slot) else { return };
        let len = len as usize;
        let r = &mut self.reqs[usize::from(slot)];
        let equal = match &ns.backend {
            Backend::Null => r.buf.as_ref().map(|b| b[..len].iter().all(|&x| x == 0)),
            Backend::Ram(region) => {
                r.buf.as_ref().and_then(|b| region_equals(region, crate::us(offset), &b[..len]).ok())
            }
            Backend::File(f) => {
                if !self.exec_buf(slot, len, ctx) {
                    return;
                }
                let r = &mut self.reqs[usize::from(slot)];
                let aux = r.aux.take().unwrap_or_else(|| IoBuf::new(4096));
                r.step = Step::CompareRead;
                return self.step_submit(slot, ns, FileOp::Read { file: f.file(), buf: aux, len, offset }, ctx);
            }
        };
        self.compared(slot, equal, ctx);
    }

    fn compared(&mut self, slot: u16, equal: Option<bool>, ctx: &mut ConnCtx<'_>) {
        let r = &mut self.reqs[usize::from(slot)];
        r.status = match equal {
            Some(true) => Status::SUCCESS,
            Some(false) => Status::COMPARE_FAILURE,
            None => Status::INTERNAL,
        };
        r.step = Step::Idle;
        if let Some(b) = r.aux.take() {
            self.buf_put(ctx, b);
        }
        self.finish_io(slot, ctx);
    }

    // ------------------------------------------------------------------- Verify

    /// Verify (NVM Command Set 1.0 §3.2.8): null and RAM blocks are always readable; a
    /// file's are read in MDTS chunks into one buffer and dropped. With FUA the file is
    /// flushed first.
    pub(super) fn verify_exec(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Verify { len, fua, .. } = self.io_kind(slot) else { return };
        let Backend::File(f) = &ns.backend else { return self.finish_io(slot, ctx) };
        let chunk = usize::try_from(len).unwrap_or(usize::MAX).min(self.target.opts.max_transfer());
        if !self.exec_buf(slot, chunk, ctx) {
            return;
        }
        if fua {
            self.reqs[usize::from(slot)].step = Step::VerifySync;
            return self.step_submit(slot, ns, FileOp::Sync { file: f.file() }, ctx);
        }
        self.verify_next(slot, ns, ctx);
    }

    fn verify_next(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Verify { offset, len, .. } = self.io_kind(slot) else { return };
        let r = &mut self.reqs[usize::from(slot)];
        let (Backend::File(f), Some(aux)) = (&ns.backend, r.aux.take()) else {
            r.step = Step::Idle;
            return self.finish_io(slot, ctx);
        };
        if r.cursor >= len || !r.status.is_success() {
            r.step = Step::Idle;
            self.buf_put(ctx, aux);
            return self.finish_io(slot, ctx);
        }
        let n = usize::try_from(len - r.cursor).unwrap_or(usize::MAX).min(aux.capacity());
        r.step = Step::VerifyRead;
        let op = FileOp::Read { file: f.file(), buf: aux, len: n, offset: offset + r.cursor };
        self.step_submit(slot, ns, op, ctx);
    }

    // --------------------------------------------------------------------- Copy

    /// Copy (NVM Command Set 1.0 §3.2.2): every source range and the destination are
    /// checked before anything moves; the sources are gathered into one buffer (so a
    /// source that overlaps the destination copies as it was), then the destination is
    /// written once under its write gate. The data never crosses the network.
    pub(super) fn copy_exec(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        match self.reqs[usize::from(slot)].step {
            Step::Idle => self.copy_begin(slot, ns, ctx),
            Step::CopyGate => self.copy_gate(slot, ns, ctx),
            // A file operation is in flight: its completion moves on.
            _ => {}
        }
    }

    fn copy_begin(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Copy { sdlba, nr, fua, .. } = self.io_kind(slot) else { return };
        let r = &mut self.reqs[usize::from(slot)];
        let want = nr as usize * RANGE_SIZE;
        let data = r.buf.as_ref().map_or(&[][..], |b| &b[..want.min(b.len())]);
        let total = match io_cmd::copy_ranges(data, ns, sdlba) {
            Ok(t) => t,
            Err(s) => {
                r.status = s;
                return self.finish_io(slot, ctx);
            }
        };
        let bytes = total << ns.block_shift;
        r.kind = ReqKind::Io(IoKind::Copy { sdlba, nr, len: bytes, fua });
        if let Backend::Null = ns.backend {
            return self.finish_io(slot, ctx);
        }
        let bytes = crate::us(bytes);
        if !self.exec_buf(slot, bytes, ctx) {
            return;
        }
        match &ns.backend {
            Backend::Ram(region) => {
                let r = &mut self.reqs[usize::from(slot)];
                let (Some(data), Some(aux)) = (r.buf.as_ref(), r.aux.as_mut()) else { return };
                let mut pos = 0;
                for k in 0..u64::from(nr) {
                    let src = copy_range(data, k);
                    let n = crate::us(u64::from(src.nlb) << ns.block_shift);
                    let from = crate::us(src.slba << ns.block_shift);
                    if region.copy_from_region(from, &mut aux.as_full_mut()[pos..pos + n]).is_err() {
                        r.status = Status::INTERNAL;
                        return self.copy_end(slot, ctx);
                    }
                    pos += n;
                }
                r.step = Step::CopyGate;
                self.copy_gate(slot, ns, ctx);
            }
            Backend::File(_) => {
                let r = &mut self.reqs[usize::from(slot)];
                (r.cursor, r.pos) = (0, 0);
                self.copy_read_next(slot, ns, ctx);
            }
            Backend::Null => {}
        }
    }

    /// File Copy: reads the next piece of source range `cursor`. The first range goes
    /// straight into the gather buffer; later ones through `aux2` in [`COPY_CHUNK_BYTES`].
    fn copy_read_next(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Copy { nr, .. } = self.io_kind(slot) else { return };
        let Backend::File(f) = &ns.backend else { return };
        let r = &mut self.reqs[usize::from(slot)];
        if r.cursor >= u64::from(nr) {
            r.step = Step::CopyGate;
            return self.copy_gate(slot, ns, ctx);
        }
        let Some(data) = r.buf.as_ref() else { return };
        let k = r.cursor;
        let src = copy_range(data, k);
        let range_bytes = u64::from(src.nlb) << ns.block_shift;
        let range_start: u64 = (0..k).map(|j| u64::from(copy_range(data, j).nlb) << ns.block_shift).sum();
        let done = r.pos - range_start;
        let offset = (src.slba << ns.block_shift) + done;
        r.step = Step::CopyRead;
        if k == 0 {
            let aux = r.aux.take().unwrap_or_else(|| IoBuf::new(4096));
            let len = crate::us(range_bytes);
            return self.step_submit(slot, ns, FileOp::Read { file: f.file(), buf: aux, len, offset }, ctx);
        }
        if r.aux2.is_none() {
            let b = ctx.pool.get_unbounded(COPY_CHUNK_BYTES);
            self.buf_bytes += b.capacity();
            self.reqs[usize::from(slot)].aux2 = Some(b);
        }
        let r = &mut self.reqs[usize::from(slot)];
        let aux2 = r.aux2.take().unwrap_or_else(|| IoBuf::new(4096));
        let len = crate::us(range_bytes - done).min(aux2.capacity()).min(COPY_CHUNK_BYTES);
        self.step_submit(slot, ns, FileOp::Read { file: f.file(), buf: aux2, len, offset }, ctx);
    }

    /// The sources are gathered: the destination's write gate, then the write.
    fn copy_gate(&mut self, slot: u16, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Copy { sdlba, len, .. } = self.io_kind(slot) else { return };
        let dest = block_range(ns, sdlba << ns.block_shift, len);
        if !self.range_gate(slot, ns, dest.clone(), ctx) {
            return;
        }
        if let Err(status) = Self::size_recheck(ns, &dest) {
            self.reqs[usize::from(slot)].status = status;
            return self.copy_end(slot, ctx);
        }
        let len = crate::us(len);
        let offset = sdlba << ns.block_shift;
        let r = &mut self.reqs[usize::from(slot)];
        match &ns.backend {
            Backend::Ram(region) => {
                let written = r.aux.as_ref().map(|a| region.copy_to_region(crate::us(offset), &a.as_full()[..len]));
                if !matches!(written, Some(Ok(()))) {
                    r.status = Status::INTERNAL;
                }
                self.copy_end(slot, ctx);
            }
            Backend::File(f) => {
                let mut aux = r.aux.take().unwrap_or_else(|| IoBuf::new(4096));
                aux.set_len(len.min(aux.capacity()));
                r.step = Step::CopyWrite;
                self.step_submit(slot, ns, FileOp::Write { file: f.file(), buf: aux, len, offset }, ctx);
            }
            Backend::Null => self.copy_end(slot, ctx),
        }
    }

    fn copy_end(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let r = &mut self.reqs[usize::from(slot)];
        r.step = Step::Idle;
        let bufs = [r.aux.take(), r.aux2.take()];
        for b in bufs.into_iter().flatten() {
            self.buf_put(ctx, b);
        }
        self.finish_io(slot, ctx);
    }

    // ------------------------------------------------------- file operations

    /// Submits one step's file operation; a submission that fails ends the command.
    fn step_submit(&mut self, slot: u16, ns: &Arc<Namespace>, op: FileOp<'_>, ctx: &mut ConnCtx<'_>) {
        self.reqs[usize::from(slot)].ns_addr = Arc::as_ptr(ns) as usize;
        let token = ctx.token | u64::from(slot);
        // In flight before it is submitted: a completion never finds the slot elsewhere.
        if !self.req_to(slot, ReqState::Executing { op_len: super::op_len(&op) }, ctx) {
            return self.op_unsubmitted(op, ctx);
        }
        match ctx.file_io.submit(op, token) {
            Ok(()) => self.file_ops += 1,
            Err((e, buf)) => {
                tracing::warn!("file op submit failed: {e}");
                self.step_done(slot, Err(e), buf, ctx);
            }
        }
    }

    /// A step's file operation finished (or failed to start): the next step, or the end.
    pub(super) fn step_done(
        &mut self,
        slot: u16,
        result: std::io::Result<usize>,
        buf: Option<IoBuf>,
        ctx: &mut ConnCtx<'_>,
    ) {
        let r = &mut self.reqs[usize::from(slot)];
        let step = r.step;
        // What the operation had to move (it is still in flight's state, or failed to start).
        let op_len = match r.state {
            ReqState::Executing { op_len } => op_len,
            _ => 0,
        };
        // The buffer goes back where the step took it from.
        match step {
            Step::CawWrite => r.buf = buf,
            Step::CopyRead if r.cursor > 0 => r.aux2 = buf,
            _ => {
                if let Some(b) = buf {
                    r.aux = Some(b);
                }
            }
        }
        let result = match result {
            // Short: the file shrank under us, or the file system is full.
            Ok(n) if n < op_len => Err(std::io::Error::other(format!("short transfer: {n} of {op_len} bytes"))),
            other => other,
        };
        if matches!(self.state, ConnState::Closing | ConnState::Closed) {
            if let Fused::Second(first) = self.reqs[usize::from(slot)].fused {
                self.release_slot(first, ctx);
            }
            return self.release_slot(slot, ctx);
        }
        let (nsid, addr) = (self.reqs[usize::from(slot)].sqe.nsid(), self.reqs[usize::from(slot)].ns_addr);
        let Some(ns) = self.ns.get(nsid).filter(|n| Arc::as_ptr(n) as usize == addr).cloned() else {
            // The namespace was removed (or replaced under its NSID) while the command ran:
            // its next steps do not go to another namespace's blocks.
            self.reqs[usize::from(slot)].status = Status::INVALID_NS;
            if let Fused::Second(first) = self.reqs[usize::from(slot)].fused {
                self.reqs[usize::from(first)].status = Status::INVALID_NS;
                self.reqs[usize::from(first)].fused = Fused::None;
                self.respond(first, ctx);
            }
            self.reqs[usize::from(slot)].fused = Fused::None;
            return self.respond(slot, ctx);
        };
        if let Err(e) = &result {
            tracing::warn!(slot, ?step, "backend I/O failed: {e}");
        }
        let failed = result.is_err();
        let read_error = Status::UNRECOVERED_READ_ERROR;
        match step {
            Step::CompareRead => self.compare_read_done(slot, failed, op_len, ctx),
            Step::CawRead | Step::CawWrite | Step::CawSync => self.caw_step_done(slot, step, failed, op_len, &ns, ctx),
            Step::VerifySync | Step::VerifyRead => {
                let r = &mut self.reqs[usize::from(slot)];
                if failed {
                    r.status = if step == Step::VerifySync { Status::WRITE_FAULT } else { read_error };
                } else if step == Step::VerifyRead {
                    r.cursor += op_len as u64;
                }
                self.verify_next(slot, &ns, ctx);
            }
            Step::CopyRead => self.copy_read_done(slot, failed, op_len, &ns, ctx),
            Step::CopyWrite | Step::CopySync => self.copy_write_done(slot, step, failed, &ns, ctx),
            Step::Idle | Step::CopyGate | Step::PreemptDrain => {}
        }
    }

    /// Compare's read of the blocks finished: compare them with the host's data, or fail.
    fn compare_read_done(&mut self, slot: u16, failed: bool, len: usize, ctx: &mut ConnCtx<'_>) {
        let r = &self.reqs[usize::from(slot)];
        let equal = match (&r.buf, &r.aux) {
            (Some(d), Some(a)) if !failed => Some(d[..len] == a[..len]),
            _ => None,
        };
        if failed {
            self.reqs[usize::from(slot)].status = Status::UNRECOVERED_READ_ERROR;
            self.reqs[usize::from(slot)].step = Step::Idle;
            if let Some(b) = self.reqs[usize::from(slot)].aux.take() {
                self.buf_put(ctx, b);
            }
            return self.finish_io(slot, ctx);
        }
        self.compared(slot, equal, ctx);
    }

    /// One read of Copy's source ranges finished: gather it, move to the next range once
    /// this one is all read, and read on.
    fn copy_read_done(&mut self, slot: u16, failed: bool, n: usize, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let r = &mut self.reqs[usize::from(slot)];
        if failed {
            r.status = Status::UNRECOVERED_READ_ERROR;
            return self.copy_end(slot, ctx);
        }
        if r.cursor > 0 {
            let pos = crate::us(r.pos);
            if let (Some(a2), Some(a)) = (r.aux2.as_ref(), r.aux.as_mut()) {
                a.as_full_mut()[pos..pos + n].copy_from_slice(&a2[..n]);
            }
        }
        r.pos += n as u64;
        // The range is done once the gathered bytes reach its end.
        let data = r.buf.as_ref().map_or(&[][..], |b| &b[..]);
        let end: u64 = (0..=r.cursor).map(|j| u64::from(copy_range(data, j).nlb) << ns.block_shift).sum();
        if r.pos >= end {
            r.cursor += 1;
        }
        self.copy_read_next(slot, ns, ctx);
    }

    /// Copy's write (or its FUA sync) finished: sync when FUA asks for it, else the end.
    fn copy_write_done(&mut self, slot: u16, step: Step, failed: bool, ns: &Arc<Namespace>, ctx: &mut ConnCtx<'_>) {
        let IoKind::Copy { fua, .. } = self.io_kind(slot) else { return };
        let r = &mut self.reqs[usize::from(slot)];
        if failed {
            r.status = Status::WRITE_FAULT;
        } else if step == Step::CopyWrite
            && fua
            && let Backend::File(f) = &ns.backend
        {
            r.step = Step::CopySync;
            return self.step_submit(slot, ns, FileOp::Sync { file: f.file() }, ctx);
        }
        self.copy_end(slot, ctx);
    }

    fn caw_step_done(
        &mut self,
        second: u16,
        step: Step,
        failed: bool,
        len: usize,
        ns: &Arc<Namespace>,
        ctx: &mut ConnCtx<'_>,
    ) {
        let Fused::Second(first) = self.reqs[usize::from(second)].fused else {
            // The pair was undone (cannot happen while a step runs): end the Write.
            self.reqs[usize::from(second)].status = Status::INTERNAL;
            return self.respond(second, ctx);
        };
        match step {
            Step::CawRead if failed => {
                self.reqs[usize::from(first)].status = Status::UNRECOVERED_READ_ERROR;
                self.reqs[usize::from(second)].status = Status::FUSED_FAILED;
                self.caw_finish(first, second, ctx);
            }
            Step::CawRead => {
                let equal = match (&self.reqs[usize::from(first)].buf, &self.reqs[usize::from(second)].aux) {
                    (Some(d), Some(a)) => d[..len] == a[..len],
                    _ => return self.caw_internal(first, second, ctx),
                };
                self.caw_compared(first, second, equal, ns, ctx);
            }
            // NVM Command Set 1.0 §3.2.3: a failed Write leaves the Compare's status as it was.
            _ if failed => {
                self.reqs[usize::from(second)].status = Status::WRITE_FAULT;
                self.caw_finish(first, second, ctx);
            }
            Step::CawWrite if self.reqs[usize::from(second)].cursor == 1 => {
                let Backend::File(f) = &ns.backend else { return self.caw_finish(first, second, ctx) };
                self.reqs[usize::from(second)].step = Step::CawSync;
                self.step_submit(second, ns, FileOp::Sync { file: f.file() }, ctx);
            }
            _ => self.caw_finish(first, second, ctx),
        }
    }
}
