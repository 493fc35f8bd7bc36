//! Control commands on a live I/O queue: the commands of a re-authentication
//! ([`crate::controller::Controller::reauthenticate`]) that a thread other than the
//! queue's owner runs. The transaction stays on that thread; each of its commands
//! reaches the owner (a [`crate::context::Context`] or a
//! [`crate::passthru::QueuePair`]) through its mailbox
//! ([`crate::controller::QueueMsg::Command`]), goes out beside the owner's I/O under
//! the queue's reserved tag ([`HostQueue::submit_control`]), and its completion goes
//! back on a channel of one. One control command per queue at a time; nothing of this
//! runs per I/O but one tag comparison per completion.

use std::sync::mpsc::SyncSender;

use crate::error::{Error, ErrorKind, Result};
use crate::queue::{Done, HostQueue, Io, SubmitError};

/// The control command of one queue: waiting for room in the SQ, or in flight.
#[derive(Default)]
pub(crate) struct Control {
    waiting: Option<(Io, SyncSender<Result<Done>>)>,
    inflight: Option<SyncSender<Result<Done>>>,
}

impl Control {
    /// A command for `q` arrived: it is sent now if the submission queue has room,
    /// else once a command completes ([`Control::retry`]).
    pub(crate) fn offer(&mut self, q: &mut HostQueue, io: Io, reply: SyncSender<Result<Done>>) {
        if self.waiting.is_some() || self.inflight.is_some() {
            let _ =
                reply.send(Err(Error::new(ErrorKind::Busy, "a control command is already outstanding on the queue")));
            return;
        }
        self.waiting = Some((io, reply));
        self.retry(q);
    }

    /// Sends the waiting command if the queue has room now.
    pub(crate) fn retry(&mut self, q: &mut HostQueue) {
        let Some((io, reply)) = self.waiting.take() else { return };
        match q.submit_control(io) {
            Ok(()) => self.inflight = Some(reply),
            Err((SubmitError::Full, io)) => self.waiting = Some((io, reply)),
            Err((e, _)) => {
                let _ =
                    reply.send(Err(Error::new(ErrorKind::Io, format!("queue {}: control command: {e}", q.qid().0))));
            }
        }
    }

    /// Whether a command waits for room in the submission queue.
    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// The completion of the control command (its tag is the queue's control tag).
    pub(crate) fn complete(&mut self, d: Done) {
        if let Some(reply) = self.inflight.take() {
            let _ = reply.send(Ok(d));
        }
    }

    /// The queue failed or closed: a waiting command is refused (one in flight comes
    /// back through [`HostQueue::abort_all`] and [`Control::complete`]).
    pub(crate) fn fail(&mut self, why: &str) {
        if let Some((_, reply)) = self.waiting.take() {
            let _ = reply.send(Err(Error::new(ErrorKind::Io, format!("control command not sent: {why}"))));
        }
    }
}
