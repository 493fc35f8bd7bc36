//! A ublk device that follows its namespace's size: the namespace grows or shrinks on the
//! target (Namespace Attribute Changed, a rescan), each queue's completion context reads
//! the new size on its next poll turn, and the device's size thread tells the kernel
//! (`UBLK_U_CMD_UPDATE_SIZE`, Linux 6.16+) so that `/dev/ublkbN` has the new capacity.
//!
//! ```text
//!   queue thread k: ctx.poll() ─► capacity changed ─► Sizes::report(k, bytes) ──┐ (rare: a resize)
//!                   plan() serves up to the new end at once                      ▼
//!   size thread (control plane, /dev/ublk-control): target = min over queues ─► UPDATE_SIZE
//! ```
//!
//! Which order is safe. The target changes the namespace first; the host learns of it
//! afterwards, so nothing here can make the kernel shrink before the target refuses: the
//! target already refuses past its new end (LBA Out of Range), and only shrinks over blocks
//! that hold no data. What this order decides is what an application sees:
//!
//! - grow: the queues serve past the old end before the kernel is told (the kernel sends
//!   nothing past its own end), and the kernel grows only once *every* queue has seen the
//!   new size (the smallest size the queues report), so no request past the old end
//!   reaches a queue that would still refuse it;
//! - shrink: the smallest report wins, so the kernel shrinks as soon as one queue saw it;
//!   a request already past the new end is refused by its queue (`EREMOTEIO`, as the
//!   target's LBA Out of Range becomes in Linux's host) and, after UPDATE_SIZE, by the
//!   block layer itself.
//!
//! A kernel without UPDATE_SIZE (GET_FEATURES lacks `UBLK_F_UPDATE_SIZE`) keeps the
//! device's size: the size thread says so once per device, a grown namespace's new blocks
//! are not reachable through the device, and a shrunk one's requests past the new end fail.
//!
//! UPDATE_SIZE is sent only while the disk exists (the thread starts after START_DEV or
//! END_USER_RECOVERY and is stopped before STOP_DEV): older kernels do not check for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use uring::ublk::{Control, flags, state};

/// How often the size thread looks even when no queue reported (a missed wake-up, or
/// the stop flag).
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// What the queues of one device have seen of its namespace's size, and the size
/// thread's wake-up.
#[derive(Debug)]
pub struct Sizes {
    /// Per queue: the namespace's size in bytes its context read last.
    seen: Vec<AtomicU64>,
    /// Set by a report, cleared by the size thread.
    kicked: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Sizes {
    /// `queues` queues that all start at `bytes`.
    pub fn new(queues: u16, bytes: u64) -> Arc<Sizes> {
        Arc::new(Sizes {
            seen: (0..queues).map(|_| AtomicU64::new(bytes)).collect(),
            kicked: Mutex::new(false),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        })
    }

    /// Queue `q`'s context now reads `bytes` (called by the queue's thread when it
    /// changed, never per I/O); wakes the size thread.
    pub fn report(&self, q: u16, bytes: u64) {
        if let Some(s) = self.seen.get(usize::from(q)) {
            s.store(bytes, Ordering::Release);
        }
        self.kick();
    }

    fn kick(&self) {
        *self.kicked.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.wake.notify_one();
    }

    /// The size the device may have now: the smallest any queue has seen (a grow once
    /// every queue serves it, a shrink as soon as one refuses past it).
    pub fn namespace_size(&self) -> u64 {
        self.seen.iter().map(|s| s.load(Ordering::Acquire)).min().unwrap_or(0)
    }

    /// Waits for a report, at most `t`; false once stopped.
    fn wait(&self, t: Duration) -> bool {
        let g = self.kicked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut g, _) = self
            .wake
            .wait_timeout_while(g, t, |k| !*k && !self.stop.load(Ordering::Relaxed))
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g = false;
        !self.stop.load(Ordering::Relaxed)
    }

    /// Ends the size thread (it sends nothing more).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.kick();
    }
}

/// What the size thread does about a namespace of `want` bytes and a disk of `have`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The disk has the namespace's size (or the namespace is unusable: size 0).
    Nothing,
    /// UPDATE_SIZE to this many 512 B sectors.
    Update(u64),
    /// The kernel cannot: the disk keeps its size.
    Keep,
}

/// The decision, apart from the kernel (tested alone).
pub fn step(have: u64, want: u64, kernel_can: bool) -> Step {
    // 0: the namespace's block size changed and its device refuses every request; a disk
    // of no size would say something else (that it is empty), so it keeps its size.
    if want == have || want == 0 {
        Step::Nothing
    } else if kernel_can {
        Step::Update(want >> 9)
    } else {
        Step::Keep
    }
}

/// Runs device `dev_id`'s size thread until `sizes` is stopped: the disk has `have` bytes
/// now (its parameters at START_DEV, or what a recovered device had).
pub fn run(dev_id: u32, sizes: &Sizes, mut have: u64) {
    let mut ctl = match Control::open() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(dev_id, error = %e, "ublk device: no control device for its size; it keeps its size");
            return;
        }
    };
    let kernel_can = match ctl.features() {
        Ok(f) => f & flags::UPDATE_SIZE != 0,
        Err(e) => {
            tracing::debug!(dev_id, error = %e, "ublk GET_FEATURES failed: taken as no UPDATE_SIZE");
            false
        }
    };
    let mut told_keep = false;
    // The size a failed UPDATE_SIZE asked for: not asked again until the namespace moves.
    let mut failed: Option<u64> = None;
    loop {
        let want = sizes.namespace_size();
        match step(have, want, kernel_can) {
            Step::Nothing => {}
            Step::Keep => {
                if !told_keep {
                    told_keep = true;
                    let what = if want > have {
                        "the namespace's new blocks are out of reach until the device is added again"
                    } else {
                        "its requests past the namespace's new end fail"
                    };
                    tracing::warn!(
                        dev_id,
                        device_bytes = have,
                        namespace_bytes = want,
                        "the namespace was resized but /dev/ublkb{dev_id} keeps its size, as this kernel's ublk \
                         cannot change a device's size (UPDATE_SIZE, Linux 6.16+): {what}"
                    );
                }
            }
            Step::Update(sectors) if failed != Some(want) => {
                // The disk must exist (older kernels do not check): a device deleted from
                // outside has no disk, and its queues are ending.
                let live = ctl.dev_info(dev_id).is_ok_and(|i| i.state == state::LIVE || i.state == state::QUIESCED);
                if !live {
                    tracing::debug!(dev_id, "ublk device not live: its size is left alone");
                } else {
                    match ctl.update_size(dev_id, sectors) {
                        Ok(()) => {
                            tracing::info!(dev_id, bytes = want, was = have, "ublk device resized with its namespace");
                            have = want;
                            failed = None;
                        }
                        Err(e) => {
                            tracing::warn!(dev_id, bytes = want, error = %e, "ublk device: UPDATE_SIZE failed; it keeps its size");
                            failed = Some(want);
                        }
                    }
                }
            }
            Step::Update(_) => {}
        }
        if !sizes.wait(LOOK_EVERY) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_follows_the_smallest_size_a_queue_serves() {
        let s = Sizes::new(2, 16 << 20);
        assert_eq!(s.namespace_size(), 16 << 20);
        s.report(0, 24 << 20);
        assert_eq!(s.namespace_size(), 16 << 20, "a grow waits for every queue to serve it");
        s.report(1, 24 << 20);
        assert_eq!(s.namespace_size(), 24 << 20);
        s.report(1, 8 << 20);
        assert_eq!(s.namespace_size(), 8 << 20, "a shrink counts as soon as one queue refuses past it");
        s.report(9, 1);
        assert_eq!(s.namespace_size(), 8 << 20, "a queue that does not exist changes nothing");
    }

    #[test]
    fn update_size_only_when_the_kernel_can_and_the_size_moved() {
        assert_eq!(step(16 << 20, 24 << 20, true), Step::Update(24 << 11));
        assert_eq!(step(24 << 20, 8 << 20, true), Step::Update(8 << 11));
        assert_eq!(step(16 << 20, 16 << 20, true), Step::Nothing);
        assert_eq!(step(16 << 20, 24 << 20, false), Step::Keep);
        assert_eq!(step(16 << 20, 0, true), Step::Nothing, "a namespace whose block size changed: no zero-size disk");
    }

    #[test]
    fn a_report_wakes_the_size_thread_and_stop_ends_it() {
        let s = Sizes::new(1, 0);
        let t = std::time::Instant::now();
        s.report(0, 1);
        assert!(s.wait(Duration::from_secs(10)), "not stopped");
        assert!(t.elapsed() < Duration::from_secs(5), "the report woke it");
        s.stop();
        assert!(!s.wait(Duration::from_secs(10)));
    }
}
