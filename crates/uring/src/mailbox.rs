//! [`Mailbox`]: cross-thread control messages into a reactor (new connections, shutdown,
//! configuration), not per-I/O traffic.
//!
//! A sender pushes into a `std::sync::mpsc` channel and, on the first message since the
//! reactor last drained, writes the ring's eventfd so a ring sleeping in
//! [`Wait::Block`](crate::Wait::Block) wakes. The reactor calls [`Mailbox::drain`] each
//! turn; when nothing is pending that costs one relaxed atomic load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use crate::error::Error;
use crate::ring::{Ring, Waker};

struct Shared {
    /// Set by a sender after pushing; cleared by the reactor before draining.
    pending: AtomicBool,
    waker: Waker,
}

/// The reactor's end of a mailbox. Owned by the ring's thread.
pub struct Mailbox<T> {
    rx: mpsc::Receiver<T>,
    shared: Arc<Shared>,
}

/// The senders' end: `Send + Clone` (for `T: Send`), usable from any thread.
pub struct MailboxSender<T> {
    tx: mpsc::Sender<T>,
    shared: Arc<Shared>,
}

impl<T> Clone for MailboxSender<T> {
    fn clone(&self) -> Self {
        MailboxSender { tx: self.tx.clone(), shared: Arc::clone(&self.shared) }
    }
}

impl<T> Mailbox<T> {
    /// Creates a mailbox whose senders wake `ring` (see [`Ring::waker`]).
    pub fn new(ring: &mut Ring) -> Result<(MailboxSender<T>, Mailbox<T>), Error> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared { pending: AtomicBool::new(false), waker: ring.waker()? });
        Ok((MailboxSender { tx, shared: Arc::clone(&shared) }, Mailbox { rx, shared }))
    }

    /// Hands every pending message to `f`; returns how many. One atomic load when empty
    /// (inlined into the reactor's turn: no call either).
    #[inline]
    pub fn drain(&mut self, f: impl FnMut(T)) -> usize {
        if !self.shared.pending.load(Ordering::Relaxed) {
            return 0;
        }
        self.drain_pending(f)
    }

    #[inline(never)]
    fn drain_pending(&mut self, mut f: impl FnMut(T)) -> usize {
        // Clear before draining: a message pushed while we drain sets the flag again (and
        // wakes the ring), so it is picked up next turn if not this one.
        self.shared.pending.swap(false, Ordering::AcqRel);
        let mut count = 0;
        while let Ok(message) = self.rx.try_recv() {
            f(message);
            count += 1;
        }
        count
    }
}

impl<T> MailboxSender<T> {
    /// Sends `message` and wakes the ring if it has not been woken since its last drain.
    /// Hands the message back if the mailbox has been dropped.
    pub fn send(&self, message: T) -> Result<(), T> {
        self.tx.send(message).map_err(|error| error.0)?;
        if !self.shared.pending.swap(true, Ordering::AcqRel) {
            self.shared.waker.wake();
        }
        Ok(())
    }
}

impl<T> std::fmt::Debug for Mailbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("pending", &self.shared.pending.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for MailboxSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailboxSender").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{RingConfig, Wait};
    use std::time::Duration;

    #[test]
    fn messages_arrive_in_order_and_empty_drain_is_cheap() {
        let mut ring = Ring::new(RingConfig::default()).expect("ring");
        let (tx, mut mailbox) = Mailbox::<u32>::new(&mut ring).expect("mailbox");
        assert_eq!(mailbox.drain(|_| panic!("empty")), 0);
        let tx2 = tx.clone();
        tx.send(1).expect("send");
        tx2.send(2).expect("send");
        let mut got = Vec::new();
        assert_eq!(mailbox.drain(|m| got.push(m)), 2);
        assert_eq!(got, vec![1, 2]);
        // The wake itself is consumed internally by a turn and never delivered.
        let delivered = ring.turn(Wait::Block { timeout: Some(Duration::from_millis(100)) }, |_, _| {}).expect("turn");
        assert_eq!(delivered, 0);
        drop(mailbox);
        assert_eq!(tx.send(3), Err(3));
    }
}
