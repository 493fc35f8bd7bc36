//! Shared by the scenario tests: a small seeded PRNG, so every run replays.

#![allow(dead_code, reason = "each test file uses a different subset")]

use blk::SharedTagPolicy;

/// The shared tag policies of this build, `Windows` last: the two baselines (`Unfair`,
/// `LinuxFair`) exist only with the `lab-baselines` feature (`cargo test -p blk
/// --features lab-baselines`; `cargo test --workspace` has it). Without them the
/// comparisons that need them are skipped, and this says so.
pub fn policies() -> Vec<SharedTagPolicy> {
    #[cfg(feature = "lab-baselines")]
    return vec![SharedTagPolicy::Unfair, SharedTagPolicy::LinuxFair, SharedTagPolicy::Windows];
    #[cfg(not(feature = "lab-baselines"))]
    {
        println!("SKIP: the Unfair and LinuxFair baselines (built only with the lab-baselines feature)");
        vec![SharedTagPolicy::Windows]
    }
}

/// Whether `policy` is first come, first served (it starves a light user).
pub fn is_unfair(policy: SharedTagPolicy) -> bool {
    match policy {
        #[cfg(feature = "lab-baselines")]
        SharedTagPolicy::Unfair => true,
        _ => false,
    }
}

/// SplitMix64: tiny, seeded, good enough to pick interleavings.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(n).unwrap()).unwrap()
    }

    /// Uniform in `lo..=hi`.
    pub fn range_u16(&mut self, lo: u16, hi: u16) -> u16 {
        lo + u16::try_from(self.below(usize::from(hi - lo) + 1)).unwrap()
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }
}
