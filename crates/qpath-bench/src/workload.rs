//! Workload generation: which I/O comes next for one job thread.
//!
//! ```text
//!   JobSpec ─► Workload::next() ─► Next { ddir, offset, len }
//!                 │  direction: fio's rwmix cycle (get_rw_ddir + set_rwmix_bytes)
//!                 │  offset:    sequential pointer per direction, or random:
//!                 │             Permutation (every slot once per pass, "random map")
//!                 │             or uniform (norandommap)
//!                 └  passes:    size per pass, `loops` passes, endless if time_based
//! ```
//!
//! Offsets lie in `[region.start, region.start + region.len)` on a grid of the
//! smallest block size, and every I/O fits in the region. Nothing here allocates
//! after construction.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::io_u::Ddir;
use crate::job::{JobSpec, RwDirs, RwPattern};
use crate::verify::mix64;

/// The byte range a job does I/O to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The next I/O to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    /// Direction.
    pub ddir: Ddir,
    /// Byte offset (absolute).
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A keyed bijection on `[0, n)`: a 4-round Feistel network on the smallest bit width
/// covering `n` (split into halves that differ by at most a bit), with cycle walking for
/// values `>= n`. Every index is visited exactly once per pass, in an order that looks
/// random, in O(1) memory (fio uses a bitmap, `axmap`, for the same purpose). The domain
/// is less than `2n`, so a lookup takes fewer than two trips through the network on
/// average (one when `n` is a power of two).
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    /// Bits of the low half; the high half has the rest.
    low_bits: u32,
    low_mask: u64,
    high_mask: u64,
    keys: [u64; 4],
}

impl Permutation {
    /// A permutation of `0..n` keyed by `key`.
    pub fn new(n: u64, key: u64) -> Permutation {
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let low_bits = bits.div_ceil(2);
        let keys = [mix64(key), mix64(key ^ 1), mix64(key ^ 2), mix64(key ^ 3)];
        Permutation { n, low_bits, low_mask: (1 << low_bits) - 1, high_mask: (1 << (bits - low_bits)) - 1, keys }
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the permutation is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Size of the domain the network permutes: a power of two, at least `n`.
    pub fn domain(&self) -> u64 {
        (self.high_mask + 1) << self.low_bits
    }

    fn round_trip(&self, x: u64) -> u64 {
        // Each round changes one half by a keyed function of the other: a bijection
        // whatever the halves' widths (a balanced Feistel round without the swap).
        let (mut high, mut low) = (x >> self.low_bits, x & self.low_mask);
        let [k0, k1, k2, k3] = self.keys;
        high ^= mix64(low ^ k0) & self.high_mask;
        low ^= mix64(high ^ k1) & self.low_mask;
        high ^= mix64(low ^ k2) & self.high_mask;
        low ^= mix64(high ^ k3) & self.low_mask;
        (high << self.low_bits) | low
    }

    /// The element at position `i` (`i < n`).
    pub fn get(&self, i: u64) -> u64 {
        assert!(i < self.n, "permutation index {i} out of range {}", self.n);
        // The domain is less than 2n, so the walk takes fewer than two steps on average;
        // it always ends because the Feistel network is a bijection (a cycle through
        // `i` returns to a value < n).
        let mut x = i;
        loop {
            x = self.round_trip(x);
            if x < self.n {
                return x;
            }
        }
    }
}

/// The I/O generator of one job thread.
#[derive(Debug)]
pub struct Workload {
    pattern: RwPattern,
    dirs: RwDirs,
    rwmix: [u32; 2],
    bs: [(u64, u64); 2],
    region: Region,
    grid: u64,
    slots: u64,
    pass_len: u64,
    random_map: bool,
    perm: Permutation,
    perm_pos: u64,
    perm_key: u64,
    seq_pos: [u64; 2],
    rwmix_ddir: usize,
    rwmix_issues: u64,
    issues: [u64; 2],
    mix_rng: SmallRng,
    off_rng: SmallRng,
    bs_rng: SmallRng,
    pass_bytes: u64,
    pass: u32,
    loops: u32,
    endless: bool,
    fsync_every: u32,
    writes_since_sync: u32,
    done: bool,
}

impl Workload {
    /// A generator for `spec` over `region`, seeded with `seed`.
    pub fn new(spec: &JobSpec, region: Region, seed: u64) -> Result<Workload, String> {
        let used: &[usize] = match spec.rw_dirs {
            RwDirs::Read => &[0],
            RwDirs::Write => &[1],
            RwDirs::Mixed => &[0, 1],
        };
        let grid = used.iter().map(|&d| spec.bs[d].0).min().unwrap_or(4096);
        let fit = used.iter().map(|&d| spec.bs[d].0).max().unwrap_or(4096);
        if region.len < fit {
            return Err(format!("the I/O region ({} bytes) is smaller than the block size ({fit} bytes)", region.len));
        }
        let slots = (region.len - fit) / grid + 1;
        let perm_key = mix64(seed ^ 0x7065_726d);
        Ok(Workload {
            pattern: spec.rw_pattern,
            dirs: spec.rw_dirs,
            rwmix: [spec.effective_rwmix_read(), 100 - spec.effective_rwmix_read()],
            bs: spec.bs,
            region,
            grid,
            slots,
            pass_len: region.len - region.len % grid,
            random_map: !spec.norandommap,
            perm: Permutation::new(slots, perm_key),
            perm_pos: 0,
            perm_key,
            seq_pos: [0; 2],
            rwmix_ddir: 0,
            rwmix_issues: 0,
            issues: [0; 2],
            mix_rng: SmallRng::seed_from_u64(mix64(seed ^ 1)),
            off_rng: SmallRng::seed_from_u64(mix64(seed ^ 2)),
            bs_rng: SmallRng::seed_from_u64(mix64(seed ^ 3)),
            pass_bytes: 0,
            pass: 0,
            loops: spec.loops.max(1),
            endless: spec.time_based,
            fsync_every: spec.fsync_every,
            writes_since_sync: 0,
            done: false,
        })
    }

    /// The region this generator covers.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Completed passes so far.
    pub fn passes(&self) -> u32 {
        self.pass
    }

    /// Whether all passes are done (never for time-based jobs).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// fio `get_rw_ddir`: stay in a direction until its issue count reaches
    /// `rwmix_issues`, then draw a new direction with probability `rwmixread`.
    fn pick_ddir(&mut self) -> usize {
        match self.dirs {
            RwDirs::Read => 0,
            RwDirs::Write => 1,
            RwDirs::Mixed => {
                if self.issues[self.rwmix_ddir] >= self.rwmix_issues {
                    let v: u32 = self.mix_rng.random_range(1..=100);
                    let d = if v <= self.rwmix[0] { 0 } else { 1 };
                    if d != self.rwmix_ddir {
                        // fio set_rwmix_bytes(): uses the direction being left.
                        let diff = u64::from(self.rwmix[self.rwmix_ddir ^ 1]);
                        self.rwmix_issues = self.issues[self.rwmix_ddir] * diff / 100;
                    }
                    self.rwmix_ddir = d;
                }
                self.rwmix_ddir
            }
        }
    }

    fn pick_len(&mut self, d: usize) -> u64 {
        let (lo, hi) = self.bs[d];
        if lo == hi {
            return lo;
        }
        let steps = (hi - lo) / lo;
        lo + lo * self.bs_rng.random_range(0..=steps)
    }

    fn end_pass(&mut self) {
        self.pass += 1;
        self.pass_bytes = 0;
        self.perm_pos = 0;
        self.seq_pos = [0; 2];
        if !self.endless && self.pass >= self.loops {
            self.done = true;
        }
        if self.random_map {
            // A fresh order each pass, still reproducible from the seed.
            self.perm = Permutation::new(self.slots, self.perm_key.wrapping_add(u64::from(self.pass)));
        }
    }
}

impl Iterator for Workload {
    type Item = Next;

    /// The next I/O, or `None` when every pass is done.
    fn next(&mut self) -> Option<Next> {
        if self.done {
            return None;
        }
        if self.fsync_every > 0 && self.writes_since_sync >= self.fsync_every {
            self.writes_since_sync = 0;
            return Some(Next { ddir: Ddir::Sync, offset: 0, len: 0 });
        }
        let d = self.pick_ddir();
        let want = self.pick_len(d);
        let rel = match self.pattern {
            RwPattern::Random => {
                let slot = if self.random_map {
                    let s = self.perm.get(self.perm_pos);
                    self.perm_pos += 1;
                    s
                } else {
                    self.off_rng.random_range(0..self.slots)
                };
                slot * self.grid
            }
            RwPattern::Sequential => {
                if self.seq_pos[d] + self.bs[d].0 > self.region.len {
                    self.seq_pos[d] = 0;
                }
                self.seq_pos[d]
            }
        };
        // Shorten the last I/O of the region to whole minimum blocks.
        let room = self.region.len - rel;
        let len = if want <= room { want } else { room - room % self.bs[d].0 };
        if self.pattern == RwPattern::Sequential {
            self.seq_pos[d] = rel + len;
        }
        self.issues[d] += 1;
        self.pass_bytes += len;
        if d == 1 {
            self.writes_since_sync += 1;
        }
        let pass_over = if self.pattern == RwPattern::Random && self.random_map {
            self.perm_pos >= self.slots
        } else {
            self.pass_bytes >= self.pass_len
        };
        if pass_over {
            self.end_pass();
        }
        Some(Next {
            ddir: if d == 0 { Ddir::Read } else { Ddir::Write },
            offset: self.region.start + rel,
            len: u32::try_from(len).expect("block size is capped far below 4 GiB"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobFile;

    fn spec(text: &str) -> JobSpec {
        JobFile::parse(&format!("[j]\nfilename=/tmp/x\n{text}\n"), "t").unwrap().jobs.remove(0)
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 5, 7, 64, 1000, 4097, 8192] {
            let p = Permutation::new(n, 99);
            let mut seen = vec![false; usize::try_from(n).unwrap()];
            for i in 0..n {
                let v = usize::try_from(p.get(i)).unwrap();
                assert!(!seen[v], "n={n}: {v} twice");
                seen[v] = true;
            }
        }
        let a: Vec<u64> = (0..16).map(|i| Permutation::new(1000, 1).get(i)).collect();
        let b: Vec<u64> = (0..16).map(|i| Permutation::new(1000, 2).get(i)).collect();
        assert_ne!(a, b, "different keys give different orders");
        assert_ne!(a, (0..16).collect::<Vec<_>>(), "order is not the identity");
    }

    #[test]
    fn permutation_domain_is_less_than_twice_its_length() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 9, 1000, 4096, 4097, 8192, 1 << 21, (1 << 21) + 1] {
            let d = Permutation::new(n, 5).domain();
            assert!(d.is_power_of_two() && d >= n, "n={n}: domain {d}");
            assert!(d < 2 * n || d == 4, "n={n}: domain {d} makes lookups walk twice on average");
        }
    }

    #[test]
    fn random_map_hits_every_block_once_per_pass() {
        let s = spec("rw=randread\nbs=4k\nsize=1m\nloops=2");
        let mut w = Workload::new(&s, Region { start: 8192, len: 1 << 20 }, 7).unwrap();
        let mut hits = vec![0u32; 256];
        let mut n = 0;
        for io in w.by_ref() {
            assert_eq!(io.len, 4096);
            assert_eq!((io.offset - 8192) % 4096, 0);
            hits[usize::try_from((io.offset - 8192) / 4096).unwrap()] += 1;
            n += 1;
            assert!(n <= 512, "generator did not stop");
        }
        assert_eq!(n, 512);
        assert!(hits.iter().all(|&h| h == 2));
    }

    #[test]
    fn same_seed_same_sequence() {
        let s = spec("rw=randrw\nbs=4k\nsize=1m\nnorandommap");
        let r = Region { start: 0, len: 1 << 20 };
        let mut a = Workload::new(&s, r, 5).unwrap();
        let mut b = Workload::new(&s, r, 5).unwrap();
        let mut c = Workload::new(&s, r, 6).unwrap();
        let sa: Vec<Next> = (0..100).filter_map(|_| a.next()).collect();
        let sb: Vec<Next> = (0..100).filter_map(|_| b.next()).collect();
        let sc: Vec<Next> = (0..100).filter_map(|_| c.next()).collect();
        assert_eq!(sa, sb);
        assert_ne!(sa, sc);
    }

    #[test]
    fn sequential_covers_the_region_in_order() {
        let s = spec("rw=write\nbs=64k\nsize=1m");
        let mut w = Workload::new(&s, Region { start: 0, len: 1 << 20 }, 1).unwrap();
        let offs: Vec<u64> = std::iter::from_fn(|| w.next()).map(|n| n.offset).collect();
        assert_eq!(offs, (0..16).map(|i| i * 65536).collect::<Vec<_>>());
    }

    #[test]
    fn sequential_issues_whole_blocks_only() {
        // fio does not issue a partial block at the end of the region either.
        let s = spec("rw=read\nbs=64k\nsize=100k\nloops=2");
        let mut w = Workload::new(&s, Region { start: 0, len: 100 << 10 }, 1).unwrap();
        let offs: Vec<(u64, u32)> = std::iter::from_fn(|| w.next()).map(|n| (n.offset, n.len)).collect();
        assert_eq!(offs, vec![(0, 65536), (0, 65536)]);
    }

    #[test]
    fn bsrange_sequential_shortens_the_last_io() {
        let s = spec("rw=read\nbsrange=4k-64k\nsize=100k");
        let mut w = Workload::new(&s, Region { start: 0, len: 100 << 10 }, 1).unwrap();
        let total: u64 = std::iter::from_fn(|| w.next()).map(|n| u64::from(n.len)).sum();
        assert_eq!(total, 100 << 10);
    }

    #[test]
    fn rwmix_converges_to_the_ratio() {
        let s = spec("rw=randrw\nrwmixread=70\nbs=4k\nsize=64m\nnorandommap");
        let mut w = Workload::new(&s, Region { start: 0, len: 64 << 20 }, 3).unwrap();
        let mut reads = 0;
        for _ in 0..10_000 {
            if w.next().unwrap().ddir == Ddir::Read {
                reads += 1;
            }
        }
        assert!((6500..7500).contains(&reads), "{reads} reads of 10000");
    }

    #[test]
    fn time_based_wraps_forever_and_fsync_interleaves() {
        let s = spec("rw=write\nbs=4k\nsize=16k\ntime_based\nruntime=1\nfsync=2");
        let mut w = Workload::new(&s, Region { start: 0, len: 16 << 10 }, 1).unwrap();
        let dirs: Vec<Ddir> = (0..9).map(|_| w.next().unwrap().ddir).collect();
        assert_eq!(dirs[2], Ddir::Sync);
        assert_eq!(dirs[5], Ddir::Sync);
        assert!(!w.is_done());
        assert!(w.passes() >= 1);
    }

    #[test]
    fn bsrange_stays_on_grid_and_in_region() {
        let s = spec("rw=randread\nbsrange=4k-16k\nsize=1m");
        let mut w = Workload::new(&s, Region { start: 0, len: 1 << 20 }, 9).unwrap();
        let mut n = 0;
        for io in w.by_ref() {
            assert!(io.len >= 4096 && io.len <= 16384 && io.len % 4096 == 0);
            assert!(io.offset + u64::from(io.len) <= 1 << 20);
            n += 1;
            assert!(n < 10_000);
        }
    }

    #[test]
    fn region_smaller_than_bs_is_an_error() {
        let s = spec("rw=read\nbs=64k");
        assert!(Workload::new(&s, Region { start: 0, len: 4096 }, 1).is_err());
    }
}
