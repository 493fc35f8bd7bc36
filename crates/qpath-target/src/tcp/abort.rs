//! The Abort command (NVMe Base 2.0 §5.1) on a connection: the admin queue asks, the I/O
//! queue that holds the command answers.
//!
//! ```text
//!  admin queue (reactor i)                       I/O queue SQID (reactor j)
//!  Abort SQID/CID -> Controller::request_abort  -> on its tick: the command is
//!  AbortWait, polled on the timers <- answer --     QosWait / AwaitBuffer / RangeWait: completed
//!  DW0 bit 0: 0 aborted, 1 not aborted              now with Command Abort Requested;
//!                                                   AwaitH2C: completed so once its data is in;
//!                                                   anything executing or done: not aborted
//! ```
//!
//! Only a command that has not started executing is aborted, so "aborted" always means
//! "it changed nothing". The queues look for requests on their tick (every reactor turn
//! at most, 10 ms at least): no lock, no atomic per I/O, no thread woken for it.

use std::cmp::Reverse;
use std::sync::Arc;

use nvme::Status;

use super::{ConnCtx, Connection, Fused, ReqKind, ReqState};
use crate::controller::Controller;

/// How often a waiting Abort looks for its answer.
const ABORT_POLL_NS: u64 = 1_000_000;
/// How long an Abort waits for the queue's answer: a queue whose reactor does not tick in
/// that long is not answering; the command is reported not aborted.
const ABORT_WAIT_NS: u64 = 1_000_000_000;

impl Connection {
    /// An Abort arrived on this admin queue for command `cid` of I/O queue `sqid`.
    pub(super) fn abort_ask(&mut self, slot: u16, ctrl: &Arc<Controller>, sqid: u16, cid: u16, ctx: &mut ConnCtx<'_>) {
        match ctrl.request_abort(sqid, cid) {
            Err(status) => {
                self.reqs[usize::from(slot)].status = status;
                self.respond(slot, ctx);
            }
            Ok(None) => {
                // No such I/O queue (the admin queue's commands run at once): not aborted.
                self.reqs[usize::from(slot)].dw0 = 1;
                self.respond(slot, ctx);
            }
            Ok(Some(answer)) => {
                let until_ns = ctx.now_ns + ABORT_WAIT_NS;
                if self.req_to(slot, ReqState::AbortWait { until_ns }, ctx) {
                    self.aborts.push((slot, answer));
                    self.timers.push(Reverse((ctx.now_ns + ABORT_POLL_NS, slot)));
                }
            }
        }
    }

    /// A waiting Abort looks for its answer (from the timers).
    pub(super) fn abort_poll(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) {
        let ReqState::AbortWait { until_ns } = self.reqs[usize::from(slot)].state else { return };
        let Some(i) = self.aborts.iter().position(|(s, _)| *s == slot) else { return };
        let aborted = match self.aborts[i].1.aborted() {
            Some(a) => a,
            None if ctx.now_ns < until_ns => {
                self.timers.push(Reverse((ctx.now_ns + ABORT_POLL_NS, slot)));
                return;
            }
            None => false,
        };
        self.aborts.swap_remove(i);
        self.reqs[usize::from(slot)].dw0 = u32::from(!aborted);
        self.respond(slot, ctx);
    }

    /// This I/O queue answers the Abort requests for it (on its tick).
    pub(super) fn serve_aborts(&mut self, ctrl: &Controller, ctx: &mut ConnCtx<'_>) {
        let Some(qid) = self.qid() else { return };
        for req in ctrl.take_aborts(qid.0) {
            let aborted = self.abort_command(req.cid, ctx);
            tracing::debug!(cntlid = ctrl.cntlid.0, sqid = qid.0, cid = req.cid, aborted, "abort requested");
            req.answer.set(aborted);
        }
    }

    /// Aborts command `cid` if it has not started executing; whether it did.
    fn abort_command(&mut self, cid: u16, ctx: &mut ConnCtx<'_>) -> bool {
        let found = self
            .reqs
            .iter()
            .position(|r| r.state != ReqState::Free && r.sqe.cid().0 == cid && matches!(r.kind, ReqKind::Io(_)));
        let Some(slot) = found.and_then(|i| u16::try_from(i).ok()) else { return false };
        let r = &mut self.reqs[usize::from(slot)];
        if r.fused != Fused::None || !r.status.is_success() {
            // Half of a fused pair, or already failing: left to complete as it is.
            return false;
        }
        match r.state {
            ReqState::QosWait { .. } | ReqState::AwaitBuffer | ReqState::RangeWait { .. } => {
                r.status = Status::ABORT_REQUESTED;
                self.waiting.retain(|&s| s != slot);
                self.range_release(slot);
                self.respond(slot, ctx);
                true
            }
            ReqState::AwaitH2C { .. } => {
                // Its data still comes (the host was sent an R2T): the command completes
                // with the abort status once it is in, and never executes.
                r.status = Status::ABORT_REQUESTED;
                true
            }
            _ => false,
        }
    }
}
