//! An in-memory hardware queue (Linux's `null_blk`): completes each request
//! after a set number of polls, with injectable failures and refusals.
//! For tests, examples and measuring the block layer without a transport.

use std::collections::VecDeque;

use crate::context::{HwQueue, QueueRefused};
use crate::request::Request;
use crate::tag::Tag;

/// How a [`NullQueue`] request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NullStatus {
    /// Done.
    Success,
    /// An injected failure.
    Failed,
}

/// An in-memory queue: requests complete in submission order, `latency_polls`
/// polls after they were submitted.
#[derive(Debug)]
pub struct NullQueue<E = ()> {
    /// (tag, poll at which it completes, submission ordinal from 1, ext taken at submit)
    pending: VecDeque<(Tag, u64, u64, Option<E>)>,
    depth: usize,
    polls: u64,
    latency_polls: u64,
    fail_every: u64,
    submitted: u64,
    refusing: bool,
}

impl<E> NullQueue<E> {
    /// A queue that holds up to `depth` requests and completes each on the
    /// `latency_polls`-th poll after its submission (0 or 1: the next poll).
    pub fn new(depth: u16, latency_polls: u32) -> NullQueue<E> {
        NullQueue {
            pending: VecDeque::with_capacity(usize::from(depth)),
            depth: usize::from(depth),
            polls: 0,
            latency_polls: u64::from(latency_polls.max(1)),
            fail_every: 0,
            submitted: 0,
            refusing: false,
        }
    }

    /// Fails every `n`-th request submitted (0: none).
    pub fn fail_every(mut self, n: u64) -> NullQueue<E> {
        self.fail_every = n;
        self
    }

    /// Refuses submissions while `refusing` (a path that is down).
    pub fn set_refusing(&mut self, refusing: bool) {
        self.refusing = refusing;
    }

    /// Requests submitted and not yet reported.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Times it was polled.
    pub fn polls(&self) -> u64 {
        self.polls
    }

    /// Requests accepted so far.
    pub fn submitted(&self) -> u64 {
        self.submitted
    }
}

impl<E: Default> HwQueue for NullQueue<E> {
    type Ext = E;
    type Status = NullStatus;

    fn submit(&mut self, tag: Tag, req: &mut Request<E>) -> Result<(), QueueRefused> {
        if self.refusing || self.pending.len() >= self.depth {
            return Err(QueueRefused);
        }
        self.submitted += 1;
        let ext = std::mem::take(&mut req.ext);
        self.pending.push_back((tag, self.polls + self.latency_polls, self.submitted, Some(ext)));
        Ok(())
    }

    fn poll<F: FnMut(Tag, NullStatus, Option<E>)>(&mut self, mut done: F) -> usize {
        self.polls += 1;
        let mut n = 0;
        while let Some(&(_, due, _, _)) = self.pending.front() {
            if due > self.polls {
                break;
            }
            let Some((tag, _, seq, ext)) = self.pending.pop_front() else { break };
            n += 1;
            let status = if self.fail_every != 0 && seq % self.fail_every == 0 {
                NullStatus::Failed
            } else {
                NullStatus::Success
            };
            done(tag, status, ext);
        }
        n
    }

    fn is_success(status: &NullStatus) -> bool {
        *status == NullStatus::Success
    }
}
