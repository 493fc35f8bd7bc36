//! Range locks: what makes a fused Compare and Write atomic against every other write to
//! the same blocks, from any queue on any reactor, without costing ordinary writes a lock.
//!
//! NVMe Base 2.0 §3.4.2: the two commands of a fused operation "shall be executed in
//! sequence as an atomic unit" — no other write may land between the Compare's read and
//! the Write (VMware's VMFS takes its on-disk locks this way; SPDK's bdev layer takes an
//! LBA range lock, `bdev_lock_lba_range`, around its emulation for the same reason). A
//! write here is a Write, a Write Zeroes, a Dataset Management deallocate or the
//! destination of a Copy.
//!
//! # Protocol
//!
//! Per namespace there is one `active` word (lock requests pending or granted), an
//! in-flight gauge per reactor shard, and, behind a mutex, a list of registered entries.
//!
//! ```text
//!  write (every one):   gauge[shard] += 1            (SeqCst)
//!                       active == 0 ?                (SeqCst load)
//!                         yes: fast path; gauge[shard] -= 1 when the write is done
//!                         no:  gauge[shard] -= 1; register a Write entry (mutex) and
//!                              wait while an earlier overlapping Lock entry exists
//!  lock (fused op):     active += 1                  (SeqCst)
//!                       register a Lock entry (mutex); granted once no earlier
//!                       overlapping entry exists and every gauge reads 0 (SeqCst)
//!                       ... read, compare, write ...
//!                       remove the entry; active -= 1
//! ```
//!
//! Waiting never blocks a thread: a request that is not granted keeps its entry (its
//! place in line) and asks again from its connection's timers ([`RangeLocks::poll`]).
//!
//! # Why it is correct
//!
//! - *No fast-path write overlaps a granted lock.* The write's increment and the lock's
//!   increment of `active` are SeqCst read-modify-writes, and each side's following load
//!   is SeqCst, so they sit in one total order (the Dekker / store-buffer pattern that
//!   SeqCst forbids from failing both ways). If the write's increment comes first, the
//!   lock's later scan sees the gauge non-zero until the write ends. If the lock's comes
//!   first, the write's load sees `active` non-zero and it takes the slow path. A gauge
//!   counts every fast write of its shard whatever its range, and after `active` is set
//!   no new fast write starts, so the gauges drain within the longest write in flight.
//! - *No slow-path write overlaps a granted lock, and no two granted locks overlap.*
//!   Entries are decided under the mutex in arrival order: a Write waits for every earlier
//!   overlapping Lock, a Lock for every earlier overlapping entry. Whichever of two
//!   overlapping entries came second waits for the first to be removed.
//! - *Nothing waits forever.* Every wait is on an earlier entry (the order is a queue, so
//!   there is no cycle) or on gauges that only go down. A steady stream of writes cannot
//!   starve a lock: once it is queued they queue behind it.
//! - *Data is ordered too.* A fast write's decrement (Release) is read by the lock's
//!   SeqCst scan, and the lock's decrement of `active` is read by the next fast write's
//!   load, so each side's data happens-before the other's (RAM regions are plain memory
//!   shared by the reactors); slow-path entries are ordered by the mutex.
//!
//! # Cost
//!
//! A write with no fused operation active pays one atomic increment of a gauge its shard
//! owns (no cache line shared with other reactors), one load of a word that only changes
//! when a fused operation starts or ends, and one decrement: no lock, no allocation, no
//! wake-up of another thread (`BENCHMARKS.md`, `cargo bench -p qpath-target --bench
//! range_lock`). Only while a fused operation is active on the namespace do its writes
//! take the mutex.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// In-flight gauges per namespace; reactor `k` counts in gauge `k % SHARDS`. Reactors
/// beyond it share gauges, which stays correct (the gauges are atomic counters) and only
/// costs a shared cache line.
pub const SHARDS: usize = 64;

/// One gauge on its own cache lines (128 bytes: the adjacent-line prefetcher pairs lines).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Gauge(AtomicU64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write,
    Lock,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    id: u64,
    blocks: (u64, u64),
    kind: Kind,
    granted: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// Registered entries in arrival order (ids ascending). At most one per request in
    /// flight, so bounded by the queues' depths.
    entries: Vec<Entry>,
    next_id: u64,
}

/// What a request holds in a namespace's [`RangeLocks`]; given back with [`RangeLocks::end`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Hold {
    /// Nothing.
    #[default]
    None,
    /// A write on the fast path, counted in this gauge.
    Fast(u16),
    /// A registered write or lock (granted or waiting its turn).
    Entry(u64),
}

/// The range locks of one namespace (see the module documentation).
#[derive(Debug)]
pub struct RangeLocks {
    /// Lock entries registered (pending or granted): writes take the slow path while non-zero.
    active: AtomicU64,
    gauges: Box<[Gauge]>,
    inner: Mutex<Inner>,
}

impl Default for RangeLocks {
    fn default() -> Self {
        RangeLocks {
            active: AtomicU64::new(0),
            gauges: (0..SHARDS).map(|_| Gauge::default()).collect(),
            inner: Mutex::new(Inner::default()),
        }
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl RangeLocks {
    /// A write of `blocks` from reactor `shard` starts: its hold, and whether it may go
    /// ahead now (if not, [`RangeLocks::poll`] it later; either way [`RangeLocks::end`] it).
    #[inline]
    pub fn write_begin(&self, shard: usize, blocks: Range<u64>) -> (Hold, bool) {
        let shard = shard % SHARDS;
        let gauge = &self.gauges[shard].0;
        gauge.fetch_add(1, Ordering::SeqCst);
        if self.active.load(Ordering::SeqCst) == 0 {
            return (Hold::Fast(u16::try_from(shard).unwrap_or(0)), true);
        }
        gauge.fetch_sub(1, Ordering::Release);
        self.register(Kind::Write, blocks)
    }

    /// A fused operation wants `blocks` to itself: its hold, and whether it has them now
    /// (if not, [`RangeLocks::poll`] it later; either way [`RangeLocks::end`] it).
    pub fn lock_begin(&self, blocks: Range<u64>) -> (Hold, bool) {
        // Before the entry is visible and before any gauge is read (see "Why it is correct").
        self.active.fetch_add(1, Ordering::SeqCst);
        self.register(Kind::Lock, blocks)
    }

    fn register(&self, kind: Kind, blocks: Range<u64>) -> (Hold, bool) {
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = g.next_id;
        g.next_id += 1;
        g.entries.push(Entry { id, blocks: (blocks.start, blocks.end), kind, granted: false });
        let at = g.entries.len() - 1;
        let granted = self.decide(&mut g, at);
        (Hold::Entry(id), granted)
    }

    /// Whether the entry at `at` may go ahead now; remembers a grant.
    fn decide(&self, g: &mut Inner, at: usize) -> bool {
        let e = g.entries[at];
        if e.granted {
            return true;
        }
        let blocked = g.entries[..at]
            .iter()
            .any(|o| overlaps(o.blocks, e.blocks) && (e.kind == Kind::Lock || o.kind == Kind::Lock));
        if blocked {
            return false;
        }
        if e.kind == Kind::Lock && self.gauges.iter().any(|c| c.0.load(Ordering::SeqCst) != 0) {
            // Fast-path writes that started before this lock's `active` increment still run.
            return false;
        }
        g.entries[at].granted = true;
        true
    }

    /// Whether the request holding `hold` may go ahead now.
    pub fn poll(&self, hold: Hold) -> bool {
        let Hold::Entry(id) = hold else { return true };
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match g.entries.iter().position(|e| e.id == id) {
            Some(at) => self.decide(&mut g, at),
            // Not registered (cannot happen for a live hold): nothing to wait for.
            None => true,
        }
    }

    /// Gives `hold` back (the write is done, or the fused operation, or the request is
    /// abandoned while it waited).
    #[inline]
    pub fn end(&self, hold: Hold) {
        match hold {
            Hold::None => {}
            Hold::Fast(shard) => {
                // Release: the write's data before the count a lock waits on.
                self.gauges[usize::from(shard) % SHARDS].0.fetch_sub(1, Ordering::Release);
            }
            Hold::Entry(id) => {
                let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(at) = g.entries.iter().position(|e| e.id == id) {
                    let e = g.entries.remove(at);
                    if e.kind == Kind::Lock {
                        self.active.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
        }
    }

    /// Whether a fused operation holds or waits for a lock here (writes take the slow path).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed) != 0
    }

    /// Entries registered now (slow-path writes and locks).
    pub fn entries(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn writes_are_fast_while_no_lock_is_active() {
        let l = RangeLocks::default();
        let (h, ok) = l.write_begin(3, 0..8);
        assert_eq!((h, ok), (Hold::Fast(3), true));
        let (h2, ok2) = l.write_begin(3 + SHARDS, 0..8);
        assert_eq!((h2, ok2), (Hold::Fast(3), true), "reactors beyond SHARDS share a gauge");
        l.end(h);
        l.end(h2);
        assert_eq!(l.entries(), 0);
        assert!(!l.is_active());
    }

    #[test]
    fn a_lock_waits_for_fast_writes_to_drain() {
        let l = RangeLocks::default();
        let (w, _) = l.write_begin(1, 100..108);
        // Any range: fast writes carry none, so the lock waits for all of them.
        let (k, ok) = l.lock_begin(0..8);
        assert!(!ok, "a fast write is in flight");
        assert!(!l.poll(k));
        l.end(w);
        assert!(l.poll(k), "drained");
        l.end(k);
        assert!(!l.is_active());
    }

    #[test]
    fn writes_wait_for_an_overlapping_lock_only() {
        let l = RangeLocks::default();
        let (k, ok) = l.lock_begin(10..20);
        assert!(ok);
        let (a, ok_a) = l.write_begin(0, 19..21);
        let (b, ok_b) = l.write_begin(0, 20..30);
        let (c, ok_c) = l.write_begin(0, 0..10);
        assert!(!ok_a, "overlaps the lock's last block");
        assert!(ok_b && ok_c, "adjacent ranges do not overlap");
        assert!(matches!(a, Hold::Entry(_)) && matches!(b, Hold::Entry(_)), "slow path while a lock is active");
        assert!(!l.poll(a));
        l.end(k);
        assert!(l.poll(a));
        for h in [a, b, c] {
            l.end(h);
        }
        assert_eq!(l.entries(), 0);
        // The next write is fast again.
        assert!(matches!(l.write_begin(0, 10..20).0, Hold::Fast(0)));
    }

    #[test]
    fn first_come_first_served() {
        let l = RangeLocks::default();
        let (k1, ok1) = l.lock_begin(0..8);
        assert!(ok1);
        // A write that overlaps, then a second lock that overlaps the write but not k1.
        let (w, okw) = l.write_begin(0, 4..12);
        let (k2, ok2) = l.lock_begin(10..16);
        assert!(!okw && !ok2, "k2 queues behind the earlier write, which queues behind k1");
        // A later write behind k2 waits although k2 is not granted: it cannot starve k2.
        let (w2, okw2) = l.write_begin(0, 15..16);
        assert!(!okw2);
        l.end(k1);
        assert!(l.poll(w));
        assert!(!l.poll(k2) && !l.poll(w2));
        l.end(w);
        assert!(l.poll(k2));
        assert!(!l.poll(w2));
        l.end(k2);
        assert!(l.poll(w2));
        l.end(w2);
        assert!(!l.is_active() && l.entries() == 0);
    }

    #[test]
    fn overlapping_locks_take_turns() {
        let l = RangeLocks::default();
        let (a, oka) = l.lock_begin(0..4);
        let (b, okb) = l.lock_begin(3..5);
        let (c, okc) = l.lock_begin(5..6);
        assert!(oka && !okb && okc);
        l.end(a);
        assert!(l.poll(b));
        l.end(b);
        l.end(c);
        // Ending twice, or a hold that is not there, changes nothing.
        l.end(c);
        assert!(!l.is_active());
    }

    /// Two "block" words that a whole write sets together, with a pause between them so a
    /// write that overlaps another is caught mid-way.
    struct Block([AtomicU64; 2]);

    impl Block {
        fn read(&self) -> (u64, u64) {
            (self.0[0].load(Ordering::Relaxed), self.0[1].load(Ordering::Relaxed))
        }
        fn write(&self, v: u64) {
            self.0[0].store(v, Ordering::Relaxed);
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
            self.0[1].store(v, Ordering::Relaxed);
        }
    }

    /// A granted hold, given back when dropped (also when a failed assertion unwinds, so
    /// the other threads are not left waiting for it).
    struct Held<'a>(&'a RangeLocks, Hold);

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            self.0.end(self.1);
        }
    }

    fn spin_until(l: &RangeLocks, (h, ok): (Hold, bool)) -> Held<'_> {
        let held = Held(l, h);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        if !ok {
            while !l.poll(h) {
                assert!(std::time::Instant::now() < deadline, "not granted within 20 s");
                std::thread::yield_now();
            }
        }
        held
    }

    /// Two threads increment a counter block by compare-and-write (read, lock, compare,
    /// write, unlock; retry on a miscompare) while a third rewrites the same block with
    /// what it reads there through the write path, the way any write can land on blocks
    /// a fused operation holds. If a write interleaved with a locked compare-and-write (or
    /// the reverse), either the compare-and-write would read a half-written block, or the
    /// writer would put back a stale value and lose increments: the final count must equal
    /// the successful compare-and-writes, and no read under the lock may be torn.
    #[test]
    fn compare_and_write_hammer_loses_no_update() {
        let l = Arc::new(RangeLocks::default());
        let block = Arc::new(Block([AtomicU64::new(0), AtomicU64::new(0)]));
        let stop = Arc::new(AtomicBool::new(false));
        let increments_per_thread = 5000u64;
        let cas = |shard: usize| {
            let (l, block) = (Arc::clone(&l), Arc::clone(&block));
            std::thread::spawn(move || {
                let mut done = 0u64;
                let mut miscompares = 0u64;
                while done < increments_per_thread {
                    let seen = block.0[1].load(Ordering::Relaxed);
                    let held = spin_until(&l, l.lock_begin(0..1));
                    let (a, b) = block.read();
                    assert_eq!(a, b, "a write interleaved with a locked compare (reactor {shard})");
                    if a == seen {
                        block.write(seen + 1);
                        done += 1;
                    } else {
                        miscompares += 1;
                    }
                    drop(held);
                    // Time with no lock active, so the writer also takes the fast path and
                    // the next lock has to wait for it to drain.
                    for _ in 0..200 {
                        std::hint::spin_loop();
                    }
                    std::thread::yield_now();
                }
                miscompares
            })
        };
        let writer = {
            let (l, block, stop) = (Arc::clone(&l), Arc::clone(&block), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut writes = 0u64;
                let mut fast = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Blocks 0..4 overlap the counter's block 0.
                    let held = spin_until(&l, l.write_begin(7, 0..4));
                    fast += u64::from(matches!(held.1, Hold::Fast(_)));
                    let (a, _) = block.read();
                    block.write(a);
                    drop(held);
                    writes += 1;
                }
                (writes, fast)
            })
        };
        let a = cas(0);
        let b = cas(1);
        let (a, b) = (a.join(), b.join());
        stop.store(true, Ordering::Relaxed);
        let (writes, fast) = writer.join().unwrap();
        let miscompares = a.unwrap() + b.unwrap();
        assert_eq!(block.read(), (2 * increments_per_thread, 2 * increments_per_thread), "lost updates");
        assert!(fast > 0 && writes > fast, "the writer took both paths");
        assert!(!l.is_active() && l.entries() == 0);
        eprintln!("{writes} writes ({fast} fast), {miscompares} miscompares");
    }
}
