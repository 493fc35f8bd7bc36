//! Shared tag sets: one tag space of depth `D` used by several queues
//! ("users": one namespace's queue each, possibly on different threads and
//! controllers), with fair sharing (seed 003).
//!
//! Tags stay unique across the whole set, so a tag can be the NVMe command id
//! on any queue that shares it. Each user may have a depth limit of its own
//! (the "LUN queue depth" of seed 003: 70 for the big device, 10 for the
//! journal). The limit is enforced when the tag is allocated: seed 003's
//! starvation came from Linux SCSI allocating the tag *before* the LUN budget,
//! so a depth-70 device could still sit on all 170 tags with requests that
//! waited for budget. Here a user never holds more tags than its limit.
//!
//! # Policies
//!
//! - [`SharedTagPolicy::Unfair`]: first come, first served from a shared
//!   atomic bitmap. A busy user that reallocates as soon as it frees starves
//!   a light one (seed 003's write job at 5 MB/s instead of 29).
//! - [`SharedTagPolicy::LinuxFair`]: blk-mq's `hctx_may_queue`, done as Linux
//!   does it: the same shared bitmap, plus a shared atomic count of active
//!   users read on every allocation; a user may allocate while its in-flight
//!   count is below `max(ceil(D / active_users), 4)`. A user becomes active at
//!   its first allocation and idle after `idle_ticks` quiet ticks (Linux idles
//!   a queue from its timeout work). Per I/O: one atomic RMW on a shared
//!   bitmap word to allocate, one to free, one shared read. (Linux also
//!   counts each queue's in-flight requests in an atomic; a user here has one
//!   owner thread, so that count is a plain integer.)
//! - [`SharedTagPolicy::Windows`] (the default): per-user allocation windows.
//!
//! `Unfair` and `LinuxFair` are baselines to measure `Windows` against (seed 003's
//! lab, `benches/tags.rs`): they exist only with the `lab-baselines` cargo feature.
//! Without it `SharedTagPolicy` has the one variant, so the per-I/O policy checks
//! below fold away and a production build carries none of the bitmap paths.
//!
//! # The `Windows` policy
//!
//! Every tag value is in exactly one of three places: the shared **pool**
//! (an atomic bitmap), one user's **window** (tags it holds but has not in
//! flight, a plain LIFO stack owned by the user's thread), or one user's
//! **in-flight** set. A user's `held` count is `in_flight + window`.
//!
//! Each user has a **quota**: how many tags it may hold. Quotas change only
//! when a user becomes active or idle, registers or is dropped; the change is
//! made under the set's registry lock (at most once per idle period per
//! user, never per I/O) by water-filling `D` over the active users: a user
//! whose depth limit is below the equal share gets its limit, the rest split
//! what remains evenly (the remainder one tag each to the first users). Idle
//! users' quota is 0. So a lone user's quota is `min(limit, D)`: it can use
//! the whole depth.
//!
//! - **alloc**: pop the window. Only when it is empty (the slow path): if
//!   the user is idle, activate it (re-balance); then, if `held < quota`,
//!   take a batch of `min(quota - held, batch_max)` tags from the pool, one
//!   atomic `fetch_and` per bitmap word touched.
//! - **free**: push the tag on the window, unless `held` would exceed the
//!   quota (one relaxed load of the user's own quota word, written only by a
//!   re-balance): then the tag and the window's excess go back to the pool.
//! - **tick** (the owner calls it periodically, e.g. every millisecond and
//!   when idle): give back window tags beyond the quota; after `idle_ticks`
//!   ticks with nothing in flight and no allocation, return the window and
//!   go idle (lazily, so a QD1 user does not re-balance between I/Os).
//! - **drop**: everything the user holds returns to the pool.
//!
//! The common-case alloc and free touch only the user's own memory: no
//! atomic read-modify-write, no write to a shared cache line.
//!
//! ## Invariants
//!
//! 1. *Uniqueness*: each tag is in exactly one place (pool, one window, one
//!    in-flight set). Putting a tag into the pool that is already there, or
//!    handing a user a tag it already has in flight, panics.
//! 2. *Quotas fit*: the quotas of all users sum to at most `D`; an idle
//!    user's is 0; an active user's is at most its limit and at least
//!    `min(limit, floor(D / active_users))`.
//! 3. *Users never take beyond their quota*: a batch is at most
//!    `quota - held`; so `held <= limit` always, and `held <= quota` except
//!    after a quota drop, until the user's next free or tick sheds the window
//!    excess and its in-flight excess drains (each completion returns its tag).
//! 4. *Idle users hold nothing*.
//!
//! ## Fairness
//!
//! From (1) `sum(held) + pool = D`, and from (2) `sum(quota) <= D`, so for an
//! active user `u` with `held_u < quota_u`:
//! `pool >= (quota_u - held_u) + sum over v != u of (quota_v - held_v)`.
//! Users below their quota take at most their own deficit (3), so once every
//! other user is at or below its quota, `u`'s deficit is in the pool for it to
//! take. Another user gets there at its next free or tick (window excess) plus
//! at most `held_v - quota_v` completions (in-flight excess): `u` gets its share
//! `min(limit, D / active_users)` within a bounded number of steps. (Linux's
//! minimum of 4 tags over-commits when more than `D / 4` users are active; the
//! water-filling here never over-commits, and a set refuses more users than
//! tags, so every active user's quota is at least 1.)
//!
//! The windows are sets of tags rather than fixed ranges of the bitmap (the
//! 2026 RFC's shape): tags are only names, so nothing needs them contiguous,
//! and sets let a lone user hold the whole depth and re-balance without moving
//! any range.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{Error, ErrorKind, Result};
use crate::tag::{Bits, Tag, TagAllocator, TagStack};

/// How a shared tag set divides its tags among its users.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SharedTagPolicy {
    /// First come, first served (only per-user depth limits apply). A baseline
    /// (feature `lab-baselines`).
    #[cfg(feature = "lab-baselines")]
    Unfair,
    /// blk-mq's `hctx_may_queue`: in flight below `max(ceil(D / active), 4)`, checked per
    /// allocation. A baseline (feature `lab-baselines`).
    #[cfg(feature = "lab-baselines")]
    LinuxFair,
    /// Per-user windows with quotas re-balanced when users come and go.
    #[default]
    Windows,
}

impl SharedTagPolicy {
    /// Whether users go active and idle under this policy (every policy but `Unfair`).
    #[inline]
    const fn counts_active_users(self) -> bool {
        match self {
            SharedTagPolicy::Windows => true,
            #[cfg(feature = "lab-baselines")]
            SharedTagPolicy::LinuxFair => true,
            #[cfg(feature = "lab-baselines")]
            SharedTagPolicy::Unfair => false,
        }
    }
}

/// Tunables of a shared tag set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedTagOptions {
    /// `Windows`: most tags taken from the pool at once.
    pub batch_max: u16,
    /// Fair policies: quiet ticks (nothing in flight, no allocation) before a user goes idle.
    pub idle_ticks: u32,
}

impl Default for SharedTagOptions {
    fn default() -> Self {
        // 32: one bitmap word's worth, one atomic. 8 ticks: ~8 ms at a 1 ms tick.
        SharedTagOptions { batch_max: 32, idle_ticks: 8 }
    }
}

/// Keeps a hot atomic on cache lines of its own (128 bytes: x86 prefetches lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// The tags no user holds: an atomic bitmap, set bit = tag in the pool.
/// Laid out like Linux's sbitmap: each word on its own cache line, and
/// fewer bits per word for small depths so users spread over several words.
#[derive(Debug)]
struct Pool {
    words: Box<[Padded<AtomicU64>]>,
    /// log2 of the bits used per word.
    shift: u32,
}

impl Pool {
    fn new(depth: u16) -> Pool {
        // sbitmap_calculate_shift(): at least 4 words when the depth allows.
        let mut shift = 6;
        if depth >= 4 {
            while (4u32 << shift) > u32::from(depth) {
                shift -= 1;
            }
        }
        let per_word = 1usize << shift;
        let depth = usize::from(depth);
        let words = (0..depth.div_ceil(per_word))
            .map(|w| {
                let bits = per_word.min(depth - w * per_word);
                Padded(AtomicU64::new(if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 }))
            })
            .collect();
        Pool { words, shift }
    }

    #[inline]
    fn split(&self, tag: u16) -> (usize, u64) {
        let per_word_mask = (1u16 << self.shift) - 1;
        (usize::from(tag) >> self.shift, 1u64 << (tag & per_word_mask))
    }

    #[inline]
    fn tag(&self, word: usize, bit: u64) -> u16 {
        let tag = (word << self.shift) | bit.trailing_zeros() as usize;
        u16::try_from(tag).expect("pool: only tags below the depth are ever in the pool")
    }

    /// Takes one tag, starting at word `*hint`; leaves `*hint` at the word it came from.
    #[cfg(any(feature = "lab-baselines", test))]
    #[inline]
    fn take_one(&self, hint: &mut usize) -> Option<u16> {
        let n = self.words.len();
        let mut w = *hint;
        for _ in 0..n {
            let word = &self.words[w].0;
            let mut v = word.load(Ordering::Relaxed);
            while v != 0 {
                let bit = v & v.wrapping_neg();
                let old = word.fetch_and(!bit, Ordering::Acquire);
                if old & bit != 0 {
                    *hint = w;
                    return Some(self.tag(w, bit));
                }
                v = old; // lost the race for that bit; try the word's others
            }
            w = if w + 1 == n { 0 } else { w + 1 };
        }
        None
    }

    /// Takes up to `want` tags, handing each to `out`; one `fetch_and` per word touched.
    fn take_batch(&self, hint: &mut usize, want: u16, mut out: impl FnMut(u16)) -> u16 {
        let n = self.words.len();
        let mut got = 0u16;
        let mut w = *hint;
        for _ in 0..n {
            let word = &self.words[w].0;
            let mut v = word.load(Ordering::Relaxed);
            while v != 0 && got < want {
                let mask = lowest_set_bits(v, want - got);
                let old = word.fetch_and(!mask, Ordering::Acquire);
                let mut mine = old & mask;
                // popcount <= 64: fits in u16.
                got += u16::try_from(mine.count_ones()).unwrap_or(0);
                while mine != 0 {
                    let bit = mine & mine.wrapping_neg();
                    out(self.tag(w, bit));
                    mine ^= bit;
                }
                v = old & !mask;
            }
            if got == want {
                *hint = w;
                break;
            }
            w = if w + 1 == n { 0 } else { w + 1 };
        }
        got
    }

    /// Puts one tag back.
    #[inline]
    #[cfg(any(feature = "lab-baselines", test))]
    fn put(&self, tag: u16) {
        let (w, bit) = self.split(tag);
        let old = self.words[w].0.fetch_or(bit, Ordering::Release);
        assert!(old & bit == 0, "shared tag set: tag {tag} returned to the pool while already in it (two owners)");
    }

    /// Puts tags back, one `fetch_or` per run of tags in the same word.
    fn put_many(&self, tags: impl Iterator<Item = u16>) {
        let mut run: Option<(usize, u64)> = None;
        for tag in tags {
            let (w, bit) = self.split(tag);
            match &mut run {
                Some((rw, mask)) if *rw == w => {
                    assert!(*mask & bit == 0, "shared tag set: tag {tag} returned twice in one batch");
                    *mask |= bit;
                }
                _ => {
                    if let Some((rw, mask)) = run {
                        self.put_mask(rw, mask);
                    }
                    run = Some((w, bit));
                }
            }
        }
        if let Some((w, mask)) = run {
            self.put_mask(w, mask);
        }
    }

    fn put_mask(&self, w: usize, mask: u64) {
        let old = self.words[w].0.fetch_or(mask, Ordering::Release);
        assert!(old & mask == 0, "shared tag set: tags {:#x} of word {w} returned to the pool while in it", old & mask);
    }

    /// Tags in the pool now (a racy snapshot; for reports and tests).
    fn count(&self) -> u32 {
        self.words.iter().map(|w| w.0.load(Ordering::Relaxed).count_ones()).sum()
    }
}

/// The lowest `n` set bits of `v` (all of them if it has no more than `n`).
fn lowest_set_bits(mut v: u64, n: u16) -> u64 {
    if v.count_ones() <= u32::from(n) {
        return v;
    }
    let mut mask = 0;
    for _ in 0..n {
        let bit = v & v.wrapping_neg();
        mask |= bit;
        v ^= bit;
    }
    mask
}

/// A registered user, as the registry sees it.
#[derive(Debug)]
struct Entry {
    id: u64,
    limit: u16,
    active: bool,
    quota: Arc<Padded<AtomicUsize>>,
    /// Scratch for water-filling.
    settled: bool,
}

#[derive(Debug, Default)]
struct Registry {
    users: Vec<Entry>,
    next_id: u64,
}

/// A tag space of depth `D` shared by several users. See the module docs.
#[derive(Debug)]
pub struct SharedTagSet {
    depth: u16,
    policy: SharedTagPolicy,
    options: SharedTagOptions,
    pool: Pool,
    /// `Windows`: an upper bound on the tags in the pool (added to before tags
    /// go in, subtracted from after they come out), so a waiting user can see
    /// an empty pool with one load instead of a scan of the bitmap.
    pooled: Padded<AtomicU32>,
    /// Active users (`LinuxFair`: Linux's `active_queues`, read per allocation;
    /// `Windows`: written at re-balance, for reports).
    active_users: Padded<AtomicU32>,
    registry: Mutex<Registry>,
}

impl SharedTagSet {
    /// A shared set of `depth` tags (1..=65,535) under `policy`, default options.
    pub fn new(depth: u16, policy: SharedTagPolicy) -> Result<Arc<SharedTagSet>> {
        SharedTagSet::with_options(depth, policy, SharedTagOptions::default())
    }

    /// A shared set with explicit options.
    pub fn with_options(depth: u16, policy: SharedTagPolicy, options: SharedTagOptions) -> Result<Arc<SharedTagSet>> {
        if depth == 0 {
            return Err(Error::new(ErrorKind::InvalidDepth, "shared tag set depth must be at least 1"));
        }
        if options.batch_max == 0 {
            return Err(Error::new(ErrorKind::InvalidDepth, "shared tag set batch_max must be at least 1"));
        }
        Ok(Arc::new(SharedTagSet {
            depth,
            policy,
            options,
            pool: Pool::new(depth),
            pooled: Padded(AtomicU32::new(u32::from(depth))),
            active_users: Padded(AtomicU32::new(0)),
            registry: Mutex::new(Registry::default()),
        }))
    }

    /// Registers a user (a queue) with an optional depth limit (its LUN queue
    /// depth; `None` = the whole depth). The returned [`TagUser`] belongs to
    /// the thread that drives the queue. A set takes at most `depth` users.
    pub fn register_user(self: &Arc<Self>, depth_limit: Option<u16>) -> Result<TagUser> {
        let limit = match depth_limit {
            Some(0) => return Err(Error::new(ErrorKind::InvalidDepth, "a user's depth limit must be at least 1")),
            Some(l) => l.min(self.depth),
            None => self.depth,
        };
        let mut reg = self.lock();
        if reg.users.len() >= usize::from(self.depth) {
            return Err(Error::new(
                ErrorKind::TooManyUsers,
                format!("shared tag set of depth {} already has {} users", self.depth, reg.users.len()),
            ));
        }
        let id = reg.next_id;
        reg.next_id += 1;
        let quota = Arc::new(Padded(AtomicUsize::new(0)));
        reg.users.push(Entry { id, limit, active: false, quota: Arc::clone(&quota), settled: false });
        // Start users on different bitmap words so the shared-bitmap policies
        // do not all hammer word 0 (sbitmap's per-CPU hints, in spirit).
        let hint = reg.users.len().wrapping_sub(1) % self.pool.words.len();
        drop(reg);
        let window = TagStack::with_capacity(if self.policy == SharedTagPolicy::Windows { limit } else { 0 });
        Ok(TagUser {
            set: Arc::clone(self),
            quota,
            id,
            policy: self.policy,
            depth: self.depth,
            limit,
            in_flight: 0,
            owned: Bits::new(self.depth),
            window,
            active: false,
            busy: false,
            idle_ticks: 0,
            hint,
        })
    }

    /// The depth `D`: tags are `0..D`.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// The policy.
    pub fn policy(&self) -> SharedTagPolicy {
        self.policy
    }

    /// The options.
    pub fn options(&self) -> SharedTagOptions {
        self.options
    }

    /// Users that are active now (a snapshot).
    pub fn active_users(&self) -> u32 {
        self.active_users.0.load(Ordering::Relaxed)
    }

    /// Registered users.
    pub fn users(&self) -> usize {
        self.lock().users.len()
    }

    /// Tags no user holds now (a racy snapshot: exact only when no user is
    /// between taking and using, e.g. in single-threaded tests).
    pub fn pooled(&self) -> u32 {
        self.pool.count()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic elsewhere (a broken invariant) must not wedge the other users' teardown.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns tags to the pool (`Windows` keeps `pooled` an upper bound: add first).
    fn give_back(&self, tags: impl ExactSizeIterator<Item = u16>) {
        if self.policy == SharedTagPolicy::Windows {
            let n = u32::try_from(tags.len()).expect("at most 65,535 tags");
            self.pooled.0.fetch_add(n, Ordering::Relaxed);
        }
        self.pool.put_many(tags);
    }

    /// Sets every user's quota by water-filling `D` over the active users.
    /// Called with the registry locked, when the set of active users changed.
    fn rebalance(&self, reg: &mut Registry) {
        let mut remaining = usize::from(self.depth);
        let mut unsettled = 0usize;
        for e in &mut reg.users {
            e.settled = !e.active;
            if e.active {
                unsettled += 1;
            } else {
                e.quota.0.store(0, Ordering::Relaxed);
            }
        }
        let active = unsettled;
        // Users whose limit is below the equal share get their limit; repeat
        // while the share grows.
        while let Some(share) = remaining.checked_div(unsettled) {
            let mut changed = false;
            for e in reg.users.iter_mut().filter(|e| !e.settled) {
                if usize::from(e.limit) <= share {
                    e.settled = true;
                    e.quota.0.store(usize::from(e.limit), Ordering::Relaxed);
                    remaining -= usize::from(e.limit);
                    unsettled -= 1;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        if let Some(base) = remaining.checked_div(unsettled) {
            let extra = remaining % unsettled;
            for (k, e) in reg.users.iter_mut().filter(|e| !e.settled).enumerate() {
                let quota = base + usize::from(k < extra);
                debug_assert!(quota <= usize::from(e.limit), "rebalance: quota {quota} above limit {}", e.limit);
                e.quota.0.store(quota, Ordering::Relaxed);
            }
        }
        self.active_users.0.store(u32::try_from(active).unwrap_or(u32::MAX), Ordering::Relaxed);
    }
}

/// One user's share of a [`SharedTagSet`]: owned by the thread that drives
/// the user's queue (it is `Send`, and every method takes `&mut self` or `&self`
/// on that thread). Dropping it returns every tag it holds to the set.
///
/// Register it on that thread: its window and in-flight bitmap are written
/// on every I/O, and memory allocated by the owner comes from the owner's
/// malloc arena, not from next to another user's.
#[derive(Debug)]
pub struct TagUser {
    set: Arc<SharedTagSet>,
    /// `Windows`: how many tags this user may hold; written by re-balances.
    quota: Arc<Padded<AtomicUsize>>,
    id: u64,
    policy: SharedTagPolicy,
    depth: u16,
    limit: u16,
    in_flight: u16,
    /// The tags this user has in flight.
    owned: Bits,
    /// `Windows`: held, not in flight; the top is reused first.
    window: TagStack,
    /// Counted in the set's active users.
    active: bool,
    /// Allocated since the last tick.
    busy: bool,
    idle_ticks: u32,
    /// Pool word to look at first.
    hint: usize,
}

impl TagUser {
    /// A free tag, or `None` (limit, fair share or quota reached, or the set is empty).
    // `always`: a few instructions on the common path, called per I/O across crates.
    #[inline(always)]
    pub fn alloc(&mut self) -> Option<Tag> {
        // Only the window pop is inline: the bitmap policies pay for atomics anyway.
        let tag = match self.policy {
            SharedTagPolicy::Windows => match self.window.pop() {
                Some(tag) => {
                    debug_assert!(self.in_flight < self.limit, "a window tag while at the depth limit");
                    tag
                }
                None => self.alloc_windows_slow()?,
            },
            #[cfg(feature = "lab-baselines")]
            SharedTagPolicy::Unfair | SharedTagPolicy::LinuxFair => self.alloc_from_bitmap()?,
        };
        if self.owned.set(tag) {
            broken_uniqueness(tag);
        }
        self.in_flight += 1;
        self.busy = true;
        Some(Tag::new(tag))
    }

    #[cold]
    #[inline(never)]
    fn alloc_windows_slow(&mut self) -> Option<u16> {
        // A user waiting for tags is busy: it must not go idle (and re-balance) while it waits.
        self.busy = true;
        if !self.active {
            self.set_active(true);
        }
        // The window is empty: held == in_flight.
        let quota = self.quota.0.load(Ordering::Relaxed);
        let deficit = quota.saturating_sub(usize::from(self.in_flight));
        if deficit == 0 || self.set.pooled.0.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let want = u16::try_from(deficit).unwrap_or(u16::MAX).min(self.set.options.batch_max);
        let window = &mut self.window;
        let got = self.set.pool.take_batch(&mut self.hint, want, |tag| window.push(tag));
        if got > 0 {
            self.set.pooled.0.fetch_sub(u32::from(got), Ordering::Relaxed);
        }
        self.window.pop()
    }

    /// `Unfair` and `LinuxFair`: one tag straight from the shared bitmap.
    #[cfg(feature = "lab-baselines")]
    #[inline(never)]
    fn alloc_from_bitmap(&mut self) -> Option<u16> {
        if self.in_flight >= self.limit {
            return None;
        }
        if self.policy == SharedTagPolicy::Unfair {
            return self.set.pool.take_one(&mut self.hint);
        }
        self.busy = true;
        if !self.active {
            // blk_mq_tag_busy(): counted active from the first allocation attempt.
            self.active = true;
            self.set.active_users.0.fetch_add(1, Ordering::Relaxed);
        }
        // hctx_may_queue(): "don't try dividing an ant" (depth 1), else the share, at least 4.
        if self.depth > 1 {
            let users = self.set.active_users.0.load(Ordering::Relaxed).max(1);
            let share = u32::from(self.depth).div_ceil(users).max(4);
            if u32::from(self.in_flight) >= share {
                return None;
            }
        }
        self.set.pool.take_one(&mut self.hint)
    }

    /// Returns a tag this user allocated.
    ///
    /// # Panics
    /// If `tag` is not in flight with this user (double free, another user's
    /// tag, or out of range): tags would no longer be unique.
    #[inline(always)]
    pub fn free(&mut self, tag: Tag) {
        let raw = tag.get();
        if raw >= self.depth || !self.owned.clear(raw) {
            not_in_flight(tag);
        }
        self.in_flight -= 1;
        match self.policy {
            SharedTagPolicy::Windows => {
                // Cannot outgrow the capacity: held is unchanged by the push.
                self.window.push(raw);
                if usize::from(self.in_flight) + self.window.len() > self.quota.0.load(Ordering::Relaxed) {
                    self.shed();
                }
            }
            #[cfg(feature = "lab-baselines")]
            SharedTagPolicy::LinuxFair | SharedTagPolicy::Unfair => self.free_to_bitmap(raw),
        }
    }

    /// `Unfair` and `LinuxFair`: the tag goes straight back to the shared bitmap.
    #[cfg(feature = "lab-baselines")]
    #[inline(never)]
    fn free_to_bitmap(&self, raw: u16) {
        self.set.pool.put(raw);
    }

    /// `Windows`: gives back the window's tags beyond the quota, the bottom of
    /// the stack first (the top was freed last and is still in cache).
    #[cold]
    #[inline(never)]
    fn shed(&mut self) {
        let room = self.quota.0.load(Ordering::Relaxed).saturating_sub(usize::from(self.in_flight));
        let excess = self.window.len().saturating_sub(room);
        if excess > 0 {
            let set = &self.set;
            self.window.remove_bottom(excess, |tags| set.give_back(tags.iter().copied()));
        }
    }

    /// Periodic housekeeping, on the owner thread (about every millisecond,
    /// and while idle). Fair policies: a user with nothing in flight and no
    /// allocation for `idle_ticks` ticks goes idle (`Windows`: returning its
    /// window). `Windows`: window tags beyond a lowered quota go back.
    pub fn tick(&mut self) {
        if self.policy.counts_active_users() && self.active {
            if self.in_flight == 0 && !self.busy {
                self.idle_ticks += 1;
            } else {
                self.idle_ticks = 0;
            }
            if self.idle_ticks >= self.set.options.idle_ticks {
                self.idle_ticks = 0;
                match self.policy {
                    SharedTagPolicy::Windows => {
                        let set = &self.set;
                        self.window.remove_bottom(usize::MAX, |tags| set.give_back(tags.iter().copied()));
                        self.set_active(false);
                    }
                    #[cfg(feature = "lab-baselines")]
                    SharedTagPolicy::LinuxFair | SharedTagPolicy::Unfair => {
                        self.active = false;
                        self.set.active_users.0.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            } else if self.policy == SharedTagPolicy::Windows
                && usize::from(self.in_flight) + self.window.len() > self.quota.0.load(Ordering::Relaxed)
            {
                self.shed();
            }
        }
        self.busy = false;
    }

    /// `Windows`: marks this user active or idle and re-balances every quota.
    fn set_active(&mut self, active: bool) {
        debug_assert!(active || self.in_flight == 0 && self.window.is_empty(), "an idle user holds no tags");
        let mut reg = self.set.lock();
        let entry = reg.users.iter_mut().find(|e| e.id == self.id).expect("a live user is registered");
        entry.active = active;
        self.set.rebalance(&mut reg);
        self.active = active;
    }

    /// Tags in flight.
    #[inline]
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// Whether `tag` is in flight with this user.
    #[inline]
    pub fn is_in_flight(&self, tag: Tag) -> bool {
        self.owned.get(tag.get())
    }

    /// Tags held: in flight plus (`Windows`) the window.
    pub fn held(&self) -> u16 {
        // window.len() <= limit <= u16::MAX
        self.in_flight + u16::try_from(self.window.len()).unwrap_or(u16::MAX)
    }

    /// `Windows`: tags this user may hold now (0 while idle). Other policies: the depth limit.
    pub fn quota(&self) -> u16 {
        match self.policy {
            SharedTagPolicy::Windows => u16::try_from(self.quota.0.load(Ordering::Relaxed)).unwrap_or(u16::MAX),
            #[cfg(feature = "lab-baselines")]
            SharedTagPolicy::LinuxFair | SharedTagPolicy::Unfair => self.limit,
        }
    }

    /// Whether this user counts as active in the fair share.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The user's depth limit (`D` when registered without one).
    pub fn depth_limit(&self) -> u16 {
        self.limit
    }

    /// The set's depth: tag values are `0..tag_space()`.
    pub fn tag_space(&self) -> u16 {
        self.depth
    }

    /// The set this user shares.
    pub fn set(&self) -> &Arc<SharedTagSet> {
        &self.set
    }
}

#[cold]
#[inline(never)]
fn broken_uniqueness(tag: u16) -> ! {
    panic!("TagUser: tag {tag} handed out while already in flight with this user (tags no longer unique)");
}

#[cold]
#[inline(never)]
fn not_in_flight(tag: Tag) -> ! {
    panic!("TagUser: {tag} freed but not in flight with this user (double free, or another user's tag)");
}

impl TagAllocator for TagUser {
    #[inline]
    fn alloc(&mut self) -> Option<Tag> {
        TagUser::alloc(self)
    }

    #[inline]
    fn free(&mut self, tag: Tag) {
        TagUser::free(self, tag);
    }

    #[inline]
    fn in_flight(&self) -> u16 {
        self.in_flight
    }

    #[inline]
    fn is_in_flight(&self, tag: Tag) -> bool {
        TagUser::is_in_flight(self, tag)
    }

    #[inline]
    fn tag_space(&self) -> u16 {
        self.depth
    }

    #[inline]
    fn depth_max(&self) -> u16 {
        self.limit
    }

    #[inline]
    fn tick(&mut self) {
        TagUser::tick(self);
    }
}

impl Drop for TagUser {
    fn drop(&mut self) {
        // Tags still in flight are abandoned with the queue that owned them.
        let mut tags: Vec<u16> = self.owned.iter().collect();
        tags.extend_from_slice(self.window.as_slice());
        self.set.give_back(tags.into_iter());
        let mut reg = self.set.lock();
        reg.users.retain(|e| e.id != self.id);
        if self.active {
            match self.policy {
                SharedTagPolicy::Windows => self.set.rebalance(&mut reg),
                #[cfg(feature = "lab-baselines")]
                SharedTagPolicy::LinuxFair | SharedTagPolicy::Unfair => {
                    self.set.active_users.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(depth: u16, policy: SharedTagPolicy) -> Arc<SharedTagSet> {
        SharedTagSet::new(depth, policy).unwrap()
    }

    #[cfg(feature = "lab-baselines")]
    const POLICIES: [SharedTagPolicy; 3] =
        [SharedTagPolicy::Unfair, SharedTagPolicy::LinuxFair, SharedTagPolicy::Windows];
    #[cfg(not(feature = "lab-baselines"))]
    const POLICIES: [SharedTagPolicy; 1] = [SharedTagPolicy::Windows];
    /// The policies that count active users and go idle.
    #[cfg(feature = "lab-baselines")]
    const COUNTING: [SharedTagPolicy; 2] = [SharedTagPolicy::LinuxFair, SharedTagPolicy::Windows];
    #[cfg(not(feature = "lab-baselines"))]
    const COUNTING: [SharedTagPolicy; 1] = [SharedTagPolicy::Windows];

    #[test]
    fn pool_layout_follows_sbitmap() {
        // 170 tags: 32 bits per word, 6 words; 4 tags: 1 bit per word.
        let p = Pool::new(170);
        assert_eq!((p.shift, p.words.len(), p.count()), (5, 6, 170));
        let p = Pool::new(4);
        assert_eq!((p.shift, p.words.len(), p.count()), (0, 4, 4));
        let p = Pool::new(3);
        assert_eq!((p.shift, p.words.len(), p.count()), (6, 1, 3));
        let p = Pool::new(u16::MAX);
        assert_eq!((p.shift, p.words.len(), p.count()), (6, 1024, 65_535));
    }

    #[test]
    fn pool_batches_and_returns() {
        let p = Pool::new(170);
        let mut hint = 0;
        let mut out = Vec::new();
        assert_eq!(p.take_batch(&mut hint, 40, |t| out.push(t)), 40);
        assert_eq!(out.len(), 40);
        assert_eq!(p.count(), 130);
        p.put_many(out.drain(..));
        assert_eq!(p.count(), 170);
        let mut all = Vec::new();
        assert_eq!(p.take_batch(&mut hint, 500, |t| all.push(t)), 170);
        all.sort_unstable();
        assert_eq!(all, (0..170).collect::<Vec<_>>());
        assert_eq!(p.take_one(&mut hint), None);
    }

    #[test]
    #[should_panic(expected = "already in it")]
    fn pool_refuses_a_tag_twice() {
        let p = Pool::new(8);
        p.put(3);
    }

    #[test]
    fn lowest_bits() {
        assert_eq!(lowest_set_bits(0b1011_0110, 2), 0b0000_0110);
        assert_eq!(lowest_set_bits(0b1011_0110, 9), 0b1011_0110);
        assert_eq!(lowest_set_bits(0, 3), 0);
    }

    #[test]
    fn refuses_bad_arguments() {
        assert_eq!(SharedTagSet::new(0, SharedTagPolicy::Windows).unwrap_err().kind, ErrorKind::InvalidDepth);
        let s = set(2, SharedTagPolicy::Windows);
        assert_eq!(s.register_user(Some(0)).unwrap_err().kind, ErrorKind::InvalidDepth);
        let _a = s.register_user(None).unwrap();
        let _b = s.register_user(None).unwrap();
        assert_eq!(s.register_user(None).unwrap_err().kind, ErrorKind::TooManyUsers);
    }

    #[test]
    fn lone_user_gets_the_whole_depth_under_every_policy() {
        for policy in POLICIES {
            let s = set(170, policy);
            let mut u = s.register_user(None).unwrap();
            let tags: Vec<Tag> = std::iter::from_fn(|| u.alloc()).collect();
            assert_eq!(tags.len(), 170, "{policy:?}");
            let mut sorted: Vec<u16> = tags.iter().map(|t| t.get()).collect();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..170).collect::<Vec<_>>(), "{policy:?}: tags unique");
            for t in tags {
                u.free(t);
            }
            assert_eq!(u.in_flight(), 0);
        }
    }

    #[test]
    fn depth_limit_caps_a_user() {
        for policy in POLICIES {
            let s = set(170, policy);
            let mut u = s.register_user(Some(10)).unwrap();
            assert_eq!(std::iter::from_fn(|| u.alloc()).count(), 10, "{policy:?}");
        }
    }

    #[test]
    fn windows_quotas_water_fill_around_limits() {
        let s = set(170, SharedTagPolicy::Windows);
        let mut big = s.register_user(Some(70)).unwrap();
        let mut small = s.register_user(Some(10)).unwrap();
        let mut free = s.register_user(None).unwrap();
        for u in [&mut big, &mut small, &mut free] {
            let _ = u.alloc();
        }
        // 170 over three: small 10 (its limit), then 160 over two: 80 each, big capped at 70, free 90.
        assert_eq!((big.quota(), small.quota(), free.quota()), (70, 10, 90));
        assert_eq!(s.active_users(), 3);
    }

    #[test]
    fn windows_remainder_goes_one_each_and_sums_to_depth() {
        let s = set(10, SharedTagPolicy::Windows);
        let mut users: Vec<TagUser> = (0..3).map(|_| s.register_user(None).unwrap()).collect();
        for u in &mut users {
            // The first takes the whole pool; the others only activate.
            let _ = u.alloc();
        }
        let quotas: Vec<u16> = users.iter().map(TagUser::quota).collect();
        assert_eq!(quotas, vec![4, 3, 3]);
    }

    #[test]
    fn windows_quota_drop_sheds_window_on_free() {
        let s = set(128, SharedTagPolicy::Windows);
        let mut a = s.register_user(None).unwrap();
        let tags: Vec<Tag> = std::iter::from_fn(|| a.alloc()).collect();
        assert_eq!(tags.len(), 128);
        // Complete 96: they stay in a's window (quota 128).
        for &t in &tags[..96] {
            a.free(t);
        }
        assert_eq!((a.in_flight(), a.held(), s.pooled()), (32, 128, 0));
        let mut b = s.register_user(None).unwrap();
        assert_eq!(b.alloc(), None, "pool empty until a sheds");
        assert_eq!(a.quota(), 64);
        a.free(tags[96]);
        assert_eq!((a.in_flight(), a.held()), (31, 64), "one free sheds the excess");
        assert!(b.alloc().is_some());
    }

    #[test]
    fn windows_tick_sheds_and_idles() {
        let s =
            SharedTagSet::with_options(64, SharedTagPolicy::Windows, SharedTagOptions { batch_max: 64, idle_ticks: 2 })
                .unwrap();
        let mut a = s.register_user(None).unwrap();
        let t = a.alloc().unwrap();
        a.free(t);
        assert_eq!(a.held(), 64, "a batch of 64 went to the window");
        let mut b = s.register_user(None).unwrap();
        assert_eq!(b.alloc(), None);
        a.tick();
        assert_eq!(a.held(), 32, "tick gives back window tags beyond the quota");
        assert!(b.alloc().is_some());
        // a is quiet: two more ticks and it is idle, its window back in the pool.
        a.tick();
        a.tick();
        assert!(!a.is_active());
        assert_eq!((a.held(), a.quota(), b.quota()), (0, 0, 64));
        assert_eq!(s.active_users(), 1);
    }

    #[test]
    fn a_user_waiting_for_tags_stays_active() {
        for policy in COUNTING {
            let opts = SharedTagOptions { batch_max: 8, idle_ticks: 2 };
            let s = SharedTagSet::with_options(8, policy, opts).unwrap();
            let mut a = s.register_user(None).unwrap();
            let tags: Vec<Tag> = std::iter::from_fn(|| a.alloc()).collect();
            let mut b = s.register_user(None).unwrap();
            for _ in 0..5 {
                assert_eq!(b.alloc(), None, "{policy:?}: a has all 8 in flight");
                b.tick();
                a.tick();
                assert!(b.is_active(), "{policy:?}: waiting is not idling");
                assert_eq!(s.active_users(), 2, "{policy:?}");
            }
            for t in tags {
                a.free(t);
            }
            assert!(b.alloc().is_some(), "{policy:?}");
        }
    }

    #[test]
    fn drop_returns_everything() {
        for policy in POLICIES {
            let s = set(50, policy);
            let mut a = s.register_user(None).unwrap();
            for _ in 0..20 {
                a.alloc().unwrap();
            }
            drop(a);
            assert_eq!(s.pooled(), 50, "{policy:?}");
            assert_eq!(s.users(), 0);
            assert_eq!(s.active_users(), 0, "{policy:?}");
        }
    }

    #[test]
    #[cfg(feature = "lab-baselines")]
    fn linux_share_has_a_floor_of_four() {
        let s = set(10, SharedTagPolicy::LinuxFair);
        let mut users: Vec<TagUser> = (0..5).map(|_| s.register_user(None).unwrap()).collect();
        for u in &mut users {
            u.alloc().unwrap();
        }
        // ceil(10 / 5) = 2, floored at 4: the first users take 4 each and run the set dry.
        let mut got = vec![1u16; 5];
        for (u, g) in users.iter_mut().zip(&mut got) {
            while u.alloc().is_some() {
                *g += 1;
            }
        }
        assert_eq!(got, vec![4, 3, 1, 1, 1]);
    }

    #[test]
    #[should_panic(expected = "not in flight with this user")]
    fn freeing_another_users_tag_panics() {
        let s = set(8, SharedTagPolicy::Windows);
        let mut a = s.register_user(None).unwrap();
        let mut b = s.register_user(None).unwrap();
        let t = a.alloc().unwrap();
        b.free(t);
    }

    #[test]
    fn user_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<TagUser>();
        fn assert_sync<T: Send + Sync>() {}
        assert_sync::<SharedTagSet>();
    }
}
