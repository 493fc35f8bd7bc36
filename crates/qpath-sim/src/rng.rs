//! The simulator's only source of choice: a seeded SplitMix64 generator (Steele, Lea and
//! Flood, "Fast splittable pseudorandom number generators", 2014). Small, fast, and the
//! same sequence on every platform, which is all a replayable schedule needs.

/// A seeded pseudo-random sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0). The modulo bias is irrelevant at the sizes used here.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0, "below(0)");
        self.next_u64() % n.max(1)
    }

    /// An index into a collection of `n` (> 0) items.
    pub fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True `per_million` times in a million.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.below(1_000_000) < per_million
    }

    /// An independent sequence for one part of the simulation (the disk's choices do not
    /// shift when the network makes one more).
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs, (0..8).map(|_| Rng::new(8).next_u64()).collect::<Vec<_>>());
        assert!((0..1000).all(|_| a.range(3, 5) >= 3 && a.range(3, 5) <= 5));
    }
}
