//! Path selection policies: one [`Selector`] per (multipath head, submitting
//! thread), owned by that thread.
//!
//! Per I/O the context calls [`Selector::select`], then [`Selector::on_submit`]
//! on the path it sent the I/O on, then [`Selector::on_complete`] when it
//! finishes. None of them locks, allocates, or writes memory another thread
//! reads; each is O(1) (latency: O(1) amortised) whatever the number of paths.
//! [`Selector::set_paths`] (ANA change, controller state change, path added or
//! removed) and [`Selector::set_policy`] are the rare, O(paths) operations.
//!
//! Rules shared by every policy (Linux `nvme_find_path` / `nvme_available_path`):
//!
//! - The *tier* is the usable paths of the best class present: the optimized
//!   ones if any, else the non-optimized ones. A policy only ever picks from
//!   the tier, so a non-optimized path is never chosen while an optimized one
//!   is usable.
//! - An empty tier gives [`Selection::Requeue`] if some path is
//!   [`PathClass::Transient`], else [`Selection::Fail`] (also with no path at all).
//! - Ties are broken the same way everywhere: in path-index order, starting
//!   at `thread_index % tier length`, so threads with equal views spread over
//!   the tier instead of all starting on path 0.

use super::path::{PATHS_MAX, PathClass, PathIndex, PathSlot, PathState, Selection};

/// A path selection policy (Linux `iopolicy`, SPDK `bdev_nvme_set_multipath_policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Stay on one path per thread, picked by thread index among the tier so
    /// threads spread; keep it until it leaves the tier (Linux `numa` with a
    /// single node: the cached `current_path`).
    Numa,
    /// Next path of the tier after every `rr_min_io` I/Os (Linux
    /// `round-robin` is `rr_min_io = 1`; SPDK's `rr_min_io`). 0 counts as 1.
    RoundRobin {
        /// I/Os sent on a path before moving to the next.
        rr_min_io: u32,
    },
    /// Fewest of this thread's I/Os in flight (Linux 6.11+ `queue-depth`,
    /// SPDK's per-qpair queue depth).
    ///
    /// Other threads' I/O is not counted: when every thread balances its own
    /// I/O the sum is balanced too, and a slow path shows up in this
    /// thread's own counts (its I/Os stay in flight longer). What it misses is
    /// load this thread cannot see (threads on other policies, other hosts);
    /// the latency policy reacts to that, through the latency it causes.
    QueueDepth,
    /// Weighted round robin by per-path service time (the adaptive policy
    /// proposed for Linux in 2025; dm's historical-service-time).
    Latency(LatencyParams),
}

impl Policy {
    /// Linux's `round-robin` (switch every I/O).
    pub const ROUND_ROBIN: Policy = Policy::RoundRobin { rr_min_io: 1 };
    /// The latency policy with its default parameters.
    pub const LATENCY: Policy = Policy::Latency(LatencyParams::DEFAULT);
}

/// Parameters of [`Policy::Latency`].
///
/// Each path's service time is an EWMA of its completion latencies, kept by
/// the thread. Once per weighted round robin round the EWMAs become integer
/// weights in `1..=weight_max`, proportional to `(fastest EWMA / path EWMA)²`
/// (the fastest path gets `weight_max`). A round gives each path exactly its
/// weight in I/Os, interleaved; so a round is at most `weight_max × paths`
/// I/Os long and every usable path gets at least one I/O per round: that I/O
/// is the *re-probe* that lets a recovered path earn its weight back.
///
/// Why squared: a job at a fixed queue depth is a closed loop, and an I/O
/// holds its slot for its path's latency, so a path's share of the slots is
/// its share of the I/Os times its latency. Weights ∝ `1 / latency` (the 2025
/// Linux proposal's) make every path hold the *same* number of slots, which is
/// exactly what queue-depth does: a path delayed +2 ms kept half of a QD32
/// job's slots waiting (`tests/mpath_latency_closed_loop.rs`). Weights ∝
/// `1 / latency²` give each path a share of the slots ∝ `1 / latency`: a path
/// twice as slow holds half as many, one 20× slower only its probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyParams {
    /// EWMA gain `2^-ewma_shift`. Default 3 (1/8, TCP's SRTT gain, RFC 6298):
    /// smooths per-I/O jitter yet follows a 10× change within ~20 samples
    /// (the residue shrinks by 7/8 per sample). Clamped to `0..=16`.
    pub ewma_shift: u8,
    /// Weight of the fastest path, `2..=64`. Default 64 (as the Linux
    /// proposal): weights resolve latency ratios up to 8:1 (√64), and a path
    /// 8× slower than the best or worse gets 1 I/O per round (the probe).
    /// Larger would only lengthen rounds and delay the reaction to change.
    pub weight_max: u8,
    /// A path with no latency sample in this many completions of the
    /// selector is stale. With no I/O in flight its estimate is forgotten:
    /// it is probed at full weight (e.g. a path coming back into the tier
    /// after a long time out of it). With I/O in flight but nothing
    /// completing, it drops to weight 1 (it looks hung; the controller's
    /// I/O timeout will take it out of the tier). Default 16384 (a few
    /// hundred milliseconds of a busy thread, far beyond any round).
    pub stale_after_ios: u32,
    /// A failed I/O counts as a sample of `error_penalty ×` the current
    /// estimate (at least its own latency): errors often return fast and
    /// must not make a failing path look attractive. Default 8: one error
    /// about doubles the estimate at gain 1/8.
    pub error_penalty: u8,
}

impl LatencyParams {
    /// The defaults (documented on each field).
    pub const DEFAULT: LatencyParams =
        LatencyParams { ewma_shift: 3, weight_max: 64, stale_after_ios: 16384, error_penalty: 8 };
}

impl Default for LatencyParams {
    fn default() -> Self {
        LatencyParams::DEFAULT
    }
}

/// How an I/O ended, as far as path selection cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed (any NVMe status that is not a path error).
    Done,
    /// Failed with a path or transport error.
    PathError,
}

/// Path selection for one multipath head on one thread. See the module docs.
#[derive(Debug)]
pub struct Selector {
    /// Per-path counters, indexed by [`PathIndex`]; only ever grows (up to `PATHS_MAX`).
    slots: Vec<PathSlot>,
    /// Paths in the last `set_paths` (slots beyond are gone).
    len: usize,
    /// The tier: usable paths of the best class, ascending index.
    tier: Vec<u16>,
    /// Where ties start in the tier: `thread_index % tier.len()`.
    tier_rot: usize,
    /// The answer when the tier is empty.
    fallback: Selection,
    thread_index: usize,
    state: State,
}

/// `repr(u8)`: an explicit tag byte, so dispatch is one compare instead of
/// decoding a niche in one variant's `Vec`.
#[derive(Debug)]
#[repr(u8)]
enum State {
    Numa(Numa),
    RoundRobin(RoundRobin),
    QueueDepth(QueueDepth),
    Latency(Latency),
}

impl Selector {
    /// A selector for the thread with index `thread_index` (its CPU, or its
    /// position among the submitting threads: only used to spread threads),
    /// with no path yet: [`Selector::select`] fails until [`Selector::set_paths`].
    pub fn new(policy: Policy, thread_index: usize) -> Selector {
        Selector {
            slots: Vec::new(),
            len: 0,
            tier: Vec::new(),
            tier_rot: 0,
            fallback: Selection::Fail,
            thread_index,
            state: State::new(policy),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        match &self.state {
            State::Numa(_) => Policy::Numa,
            State::RoundRobin(s) => Policy::RoundRobin { rr_min_io: s.rr_min_io },
            State::QueueDepth(_) => Policy::QueueDepth,
            State::Latency(s) => Policy::Latency(s.params),
        }
    }

    /// Switches policy. In-flight counts carry over (they are kept under
    /// every policy), so I/O outstanding across the switch is accounted for.
    pub fn set_policy(&mut self, policy: Policy) {
        if self.policy() == policy {
            return;
        }
        self.state = State::new(policy);
        self.rebuild();
    }

    /// Replaces the path set (rare: ANA change, controller state change, path added or removed).
    ///
    /// `paths[i]` is path slot `i`. Slots are stable: keep a path at its
    /// index; add one by appending it (or by reusing the slot of a removed
    /// path, with a new [`PathState::id`]); remove one by giving it class
    /// [`PathClass::Gone`] or by leaving it off the end of the slice. A slot
    /// is never forgotten: one left off counts as gone, and its in-flight
    /// count survives like every slot's, so completions of I/O sent before
    /// the change are accounted for whatever the head does meanwhile.
    ///
    /// # Panics
    ///
    /// If `paths` has more than [`PATHS_MAX`] entries.
    pub fn set_paths(&mut self, paths: &[PathState]) {
        assert!(paths.len() <= PATHS_MAX, "a multipath head has at most {PATHS_MAX} paths, got {}", paths.len());
        for (i, p) in paths.iter().enumerate() {
            match self.slots.get_mut(i) {
                Some(s) => {
                    s.class = p.class;
                    s.id = p.id;
                }
                None => self.slots.push(PathSlot::new(*p)),
            }
        }
        for s in self.slots.iter_mut().skip(paths.len()) {
            s.class = PathClass::Gone;
        }
        self.len = paths.len();
        self.rebuild();
    }

    /// Recomputes the tier and the fallback, then the policy's state.
    fn rebuild(&mut self) {
        let best = self.slots.iter().map(|s| s.class).filter(|c| c.is_usable()).min();
        self.tier.clear();
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.in_tier = Some(s.class) == best;
            if s.in_tier {
                // PATHS_MAX < u16::MAX (asserted in set_paths).
                self.tier.push(u16::try_from(i).expect("path index fits u16 (PATHS_MAX)"));
            }
        }
        self.tier_rot = if self.tier.is_empty() { 0 } else { self.thread_index % self.tier.len() };
        self.fallback = if self.slots.iter().any(|s| s.class == PathClass::Transient) {
            Selection::Requeue
        } else {
            Selection::Fail
        };
        let view = View { slots: &self.slots, tier: &self.tier, rot: self.tier_rot };
        match &mut self.state {
            State::Numa(s) => s.rebuild(&view),
            State::RoundRobin(s) => s.rebuild(&view),
            State::QueueDepth(s) => s.rebuild(&view),
            State::Latency(s) => s.rebuild(&view),
        }
    }

    /// Picks the path for the next I/O. O(1); latency O(1) amortised.
    #[inline(always)]
    pub fn select(&mut self) -> Selection {
        if self.tier.is_empty() {
            return self.fallback;
        }
        match &mut self.state {
            State::Numa(s) => Selection::Submit(PathIndex(s.current)),
            State::RoundRobin(s) => s.select(&self.tier),
            State::QueueDepth(s) => s.select(),
            State::Latency(s) => s.select(&View { slots: &self.slots, tier: &self.tier, rot: self.tier_rot }),
        }
    }

    /// An I/O was sent on `path` (normally the one [`Selector::select`]
    /// returned; any usable path is accepted, e.g. a retry elsewhere).
    #[inline(always)]
    pub fn on_submit(&mut self, path: PathIndex) {
        let i = path.get();
        let Some(slot) = self.slots.get_mut(i) else { return };
        let old = slot.in_flight;
        slot.in_flight = old.saturating_add(1);
        if slot.in_tier
            && let State::QueueDepth(s) = &mut self.state
        {
            s.on_submit(path.0, old);
        }
    }

    /// An I/O sent on `path` finished after `latency_ns` (submit to completion).
    #[inline(always)]
    pub fn on_complete(&mut self, path: PathIndex, latency_ns: u64, outcome: Outcome) {
        let i = path.get();
        let Some(slot) = self.slots.get_mut(i) else { return };
        let old = slot.in_flight;
        debug_assert!(old > 0, "completion on path {i} without a submission on it");
        if old == 0 {
            return;
        }
        slot.in_flight = old - 1;
        match &mut self.state {
            State::QueueDepth(s) if slot.in_tier => s.on_complete(path.0, old),
            State::Latency(s) => s.sample(i, latency_ns, outcome),
            _ => {}
        }
    }

    /// Number of paths in the last [`Selector::set_paths`].
    pub fn paths(&self) -> usize {
        self.len
    }

    /// This thread's I/Os in flight on `path`.
    pub fn in_flight(&self, path: PathIndex) -> u32 {
        self.slots.get(path.get()).map_or(0, |s| s.in_flight)
    }

    /// The usable paths selection picks from (all of the best class present).
    pub fn tier(&self) -> impl ExactSizeIterator<Item = PathIndex> + '_ {
        self.tier.iter().map(|&p| PathIndex(p))
    }

    /// The latency policy's service-time estimate of `path`, ns (`None`:
    /// another policy, or no sample yet).
    pub fn latency_ewma_ns(&self, path: PathIndex) -> Option<u64> {
        match &self.state {
            State::Latency(s) => s.ewma_ns.get(path.get()).copied().filter(|&e| e != 0),
            _ => None,
        }
    }

    /// The latency policy's weight of `path` in the current round (`None`:
    /// another policy, or not in the tier).
    pub fn latency_weight(&self, path: PathIndex) -> Option<u8> {
        match &self.state {
            State::Latency(s) => {
                self.slots.get(path.get()).filter(|sl| sl.in_tier).and_then(|_| s.weight.get(path.get()).copied())
            }
            _ => None,
        }
    }
}

/// What a policy sees of the selector when it rebuilds or recomputes.
struct View<'a> {
    slots: &'a [PathSlot],
    tier: &'a [u16],
    rot: usize,
}

impl View<'_> {
    /// The tier in tie-break order: from `rot`, wrapping.
    fn rotated(&self) -> impl Iterator<Item = u16> + '_ {
        let (a, b) = self.tier.split_at(self.rot);
        b.iter().chain(a).copied()
    }
}

impl State {
    fn new(policy: Policy) -> State {
        match policy {
            Policy::Numa => State::Numa(Numa { current: NIL, current_id: 0 }),
            Policy::RoundRobin { rr_min_io } => {
                State::RoundRobin(RoundRobin { rr_min_io: rr_min_io.max(1), pos: 0, count: 0, current: NIL })
            }
            Policy::QueueDepth => State::QueueDepth(QueueDepth::new()),
            Policy::Latency(params) => State::Latency(Latency::new(params)),
        }
    }
}

// ------------------------------------------------------------------ numa

#[derive(Debug)]
struct Numa {
    /// The thread's path (valid while the tier is not empty; `NIL` before the first).
    current: u16,
    /// Its id, to notice the slot being given to another path.
    current_id: u64,
}

impl Numa {
    fn rebuild(&mut self, v: &View<'_>) {
        let keep = v.slots.get(usize::from(self.current)).is_some_and(|s| s.in_tier && s.id == self.current_id);
        if !keep && let Some(p) = v.rotated().next() {
            self.current = p;
            self.current_id = v.slots[usize::from(p)].id;
        }
    }
}

// ----------------------------------------------------------- round robin

#[derive(Debug)]
struct RoundRobin {
    rr_min_io: u32,
    /// Position of `current` in the tier.
    pos: usize,
    /// I/Os sent on `current` since it was picked.
    count: u32,
    /// The path being used (`NIL` before the first tier).
    current: u16,
}

impl RoundRobin {
    fn rebuild(&mut self, v: &View<'_>) {
        if v.tier.is_empty() {
            return;
        }
        // Continue from the current path if it is still in the tier; else start over at the thread's offset.
        match v.tier.binary_search(&self.current) {
            Ok(pos) => self.pos = pos,
            Err(_) => {
                self.pos = v.rot;
                self.count = 0;
                self.current = v.tier[v.rot];
            }
        }
    }

    #[inline(always)]
    fn select(&mut self, tier: &[u16]) -> Selection {
        if self.count >= self.rr_min_io {
            self.count = 0;
            self.pos += 1;
            if self.pos >= tier.len() {
                self.pos = 0;
            }
            self.current = tier[self.pos];
        }
        self.count += 1;
        Selection::Submit(PathIndex(self.current))
    }
}

// ----------------------------------------------------------- queue depth

/// In-flight counts at or above `QD_BUCKETS - 1` share the last bucket: up
/// to that depth per path and thread (twice Linux's default queue size) the
/// choice is exact; beyond it, saturated paths are used in turn.
const QD_BUCKETS: u16 = 256;
const NIL: u16 = u16::MAX;

/// Tier paths bucketed by in-flight count: one FIFO list per count, and the
/// lowest non-empty bucket `min`.
///
/// `select` is the first path of bucket `min`: two loads. A submit moves the
/// path from bucket `c` to the tail of `c + 1`, a completion to the tail of
/// `c - 1`; `min` follows in O(1): a submit can only empty bucket `min` by
/// moving its last path to `min + 1`, and a completion can only lower `min`
/// to `c - 1`. Appending at the tail makes ties go to the path that has
/// waited longest at that depth: at low depth the policy round-robins
/// instead of sticking to one path (which per-thread counts would otherwise
/// do at queue depth 1, where every count is 0 at each selection).
///
/// The lists are circular and doubly linked through one array of 4-byte
/// nodes: nodes `0..QD_BUCKETS` are the buckets' sentinels, node
/// `QD_BUCKETS + p` is path `p`. Sentinels make unlink and append
/// branch-free, and one array means one bounds check and a few cache lines
/// (1 KiB of sentinels plus 4 bytes per path).
#[derive(Debug)]
struct QueueDepth {
    nodes: Vec<Link>,
    /// The lowest non-empty bucket (while the tier is not empty).
    min: u16,
}

/// A node of the circular lists (indices into `QueueDepth::nodes`).
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u16,
    next: u16,
}

/// The bucket (and sentinel node) of a path with `in_flight` I/Os.
#[inline(always)]
fn bucket(in_flight: u32) -> u16 {
    u16::from(u8::try_from(in_flight).unwrap_or(u8::MAX))
}

const _: () = assert!(QD_BUCKETS == u8::MAX as u16 + 1, "bucket() maps counts onto u8");
const _: () = assert!(QD_BUCKETS as usize + PATHS_MAX < u16::MAX as usize, "node indices fit u16");

/// The node of path `p`.
#[inline(always)]
fn node(p: u16) -> u16 {
    QD_BUCKETS + p
}

impl QueueDepth {
    fn new() -> QueueDepth {
        QueueDepth { nodes: Vec::new(), min: 0 }
    }

    fn rebuild(&mut self, v: &View<'_>) {
        self.nodes.clear();
        // Every sentinel points at itself (an empty list); path nodes are linked as they join.
        self.nodes.extend((0..QD_BUCKETS).map(|b| Link { prev: b, next: b }));
        self.nodes.resize(usize::from(QD_BUCKETS) + v.slots.len(), Link { prev: 0, next: 0 });
        for p in v.rotated() {
            self.push_tail(node(p), bucket(v.slots[usize::from(p)].in_flight));
        }
        self.min = (0..QD_BUCKETS).find(|&b| !self.is_empty(b)).unwrap_or(0);
    }

    #[inline(always)]
    fn is_empty(&self, b: u16) -> bool {
        self.nodes[usize::from(b)].next == b
    }

    #[inline(always)]
    fn select(&self) -> Selection {
        let n = self.nodes[usize::from(self.min)].next;
        debug_assert!(n >= QD_BUCKETS, "queue-depth: bucket min ({}) empty with a non-empty tier", self.min);
        Selection::Submit(PathIndex(n.wrapping_sub(QD_BUCKETS)))
    }

    #[inline(always)]
    fn unlink(&mut self, n: u16) {
        let Link { prev, next } = self.nodes[usize::from(n)];
        self.nodes[usize::from(prev)].next = next;
        self.nodes[usize::from(next)].prev = prev;
    }

    #[inline(always)]
    fn push_tail(&mut self, n: u16, b: u16) {
        let last = self.nodes[usize::from(b)].prev;
        self.nodes[usize::from(n)] = Link { prev: last, next: b };
        self.nodes[usize::from(last)].next = n;
        self.nodes[usize::from(b)].prev = n;
    }

    /// `p`'s count went from `old` to `old + 1`.
    #[inline(always)]
    fn on_submit(&mut self, p: u16, old: u32) {
        let (from, to) = (bucket(old), bucket(old.saturating_add(1)));
        self.unlink(node(p));
        self.push_tail(node(p), to);
        if from == self.min && self.is_empty(from) {
            self.min = to;
        }
    }

    /// `p`'s count went from `old` (≥ 1) to `old - 1`.
    #[inline(always)]
    fn on_complete(&mut self, p: u16, old: u32) {
        let to = bucket(old - 1);
        self.unlink(node(p));
        self.push_tail(node(p), to);
        if to < self.min {
            self.min = to;
        }
    }
}

// --------------------------------------------------------------- latency

/// Interleaved weighted round robin over the tier by service time.
///
/// The tier is kept sorted by weight, heaviest first (`order`; equal weights
/// in tie-break order). A round is `weight_max` passes; pass `k` visits the
/// paths whose weight exceeds `k`, which is a prefix of `order` that only
/// shrinks (`eligible`). So a round gives path `i` exactly `weight[i]` I/Os,
/// spread over the round rather than in one burst, for O(1) work per
/// selection plus one O(paths) recomputation per round (a round has at least
/// `weight_max + paths - 1` selections, so O(1) amortised).
#[derive(Debug)]
struct Latency {
    params: LatencyParams,
    /// Service-time EWMA per slot, ns; 0 = unknown.
    ewma_ns: Vec<u64>,
    /// `clock` at each slot's last sample.
    last_sample: Vec<u64>,
    /// The slot id the history belongs to.
    ids: Vec<u64>,
    /// Weight per slot (meaningful for tier paths).
    weight: Vec<u8>,
    /// Tier paths, heaviest first.
    order: Vec<u16>,
    /// Paths of `order` still in the current pass (weight > `pass`).
    eligible: usize,
    pass: u8,
    /// Next position in `order`.
    pos: usize,
    /// Completions seen (the staleness clock: I/Os, not time, so behaviour
    /// is deterministic and no clock is read per I/O).
    clock: u64,
}

impl Latency {
    fn new(params: LatencyParams) -> Latency {
        let params = LatencyParams {
            ewma_shift: params.ewma_shift.min(16),
            weight_max: params.weight_max.clamp(2, 64),
            stale_after_ios: params.stale_after_ios.max(1),
            error_penalty: params.error_penalty.max(1),
        };
        Latency {
            params,
            ewma_ns: Vec::new(),
            last_sample: Vec::new(),
            ids: Vec::new(),
            weight: Vec::new(),
            order: Vec::new(),
            eligible: 0,
            pass: 0,
            pos: 0,
            clock: 0,
        }
    }

    fn rebuild(&mut self, v: &View<'_>) {
        let n = v.slots.len();
        self.ewma_ns.resize(n, 0);
        self.last_sample.resize(n, self.clock);
        self.weight.resize(n, 0);
        for (i, s) in v.slots.iter().enumerate() {
            if self.ids.get(i) != Some(&s.id) {
                // A new path in this slot: forget the old one's history.
                if i < self.ids.len() {
                    self.ids[i] = s.id;
                } else {
                    self.ids.push(s.id);
                }
                self.ewma_ns[i] = 0;
                self.last_sample[i] = self.clock;
            }
        }
        self.recompute(v);
    }

    /// New weights from the EWMAs and a new round.
    fn recompute(&mut self, v: &View<'_>) {
        let wmax = self.params.weight_max;
        let stale_after = u64::from(self.params.stale_after_ios);
        for &p in v.tier {
            let i = usize::from(p);
            if self.ewma_ns[i] != 0 && self.clock - self.last_sample[i] > stale_after && v.slots[i].in_flight == 0 {
                self.ewma_ns[i] = 0;
            }
        }
        let best = v.tier.iter().map(|&p| self.ewma_ns[usize::from(p)]).filter(|&e| e != 0).min();
        for &p in v.tier {
            let i = usize::from(p);
            let e = self.ewma_ns[i];
            self.weight[i] = match best {
                _ if e == 0 => wmax,
                _ if self.clock - self.last_sample[i] > stale_after => 1,
                Some(best) => {
                    // Rounded wmax × (best / e)², in 1..=wmax (best ≤ e); see LatencyParams for
                    // why squared. u128: e² of an hours-long EWMA still fits.
                    let e2 = u128::from(e) * u128::from(e);
                    let w = (u128::from(wmax) * u128::from(best) * u128::from(best) + e2 / 2) / e2;
                    u8::try_from(w).unwrap_or(wmax).clamp(1, wmax)
                }
                None => wmax,
            };
        }
        // Counting sort by weight, heaviest first, stable in tie-break order.
        let mut start = [0usize; 65];
        for &p in v.tier {
            start[usize::from(self.weight[usize::from(p)])] += 1;
        }
        let mut acc = 0;
        for w in (1..=64).rev() {
            let c = start[w];
            start[w] = acc;
            acc += c;
        }
        self.order.clear();
        self.order.resize(v.tier.len(), NIL);
        for p in v.rotated() {
            let w = usize::from(self.weight[usize::from(p)]);
            self.order[start[w]] = p;
            start[w] += 1;
        }
        self.eligible = self.order.len();
        self.pass = 0;
        self.pos = 0;
    }

    #[inline(always)]
    fn select(&mut self, v: &View<'_>) -> Selection {
        let p = self.order[self.pos];
        let fastest = self.order[0];
        self.pos += 1;
        if self.pos >= self.eligible {
            self.next_pass(v);
        }
        // A slower path never gets more of this thread's I/Os in flight than the
        // fastest has: the weights set how often it is used, this caps how many of a
        // closed loop's slots it can hold when its estimate lags (at most what
        // queue-depth would give it). Equal counts pass, so an idle path is still probed.
        let p = if v.slots[usize::from(p)].in_flight > v.slots[usize::from(fastest)].in_flight { fastest } else { p };
        Selection::Submit(PathIndex(p))
    }

    fn next_pass(&mut self, v: &View<'_>) {
        self.pass += 1;
        self.pos = 0;
        while self.eligible > 0 && self.weight[usize::from(self.order[self.eligible - 1])] <= self.pass {
            self.eligible -= 1;
        }
        if self.eligible == 0 {
            self.recompute(v);
        }
    }

    #[inline(always)]
    fn sample(&mut self, i: usize, latency_ns: u64, outcome: Outcome) {
        self.clock += 1;
        let (Some(e), Some(last)) = (self.ewma_ns.get_mut(i), self.last_sample.get_mut(i)) else { return };
        let s = match outcome {
            Outcome::Done => latency_ns,
            Outcome::PathError => latency_ns.max(e.saturating_mul(u64::from(self.params.error_penalty))),
        }
        .max(1);
        let shift = self.params.ewma_shift;
        // e + (s - e) / 2^shift, without a data-dependent branch (the sign of
        // s - e flips from path to path and would mispredict); the integer
        // form loses under 2 × 2^shift ns. The first sample is taken as is.
        *e = if *e == 0 { s } else { *e - (*e >> shift) + (s >> shift) };
        *last = self.clock;
    }
}
