//! Latency counts in an HDR histogram's slot layout.
//!
//! Recording into an `hdrhistogram::Histogram` does its slot arithmetic from fields,
//! range and saturation checks and min/max tracking on every sample (about a hundred
//! instructions). [`HdrCounts`] keeps only the counts, in the layout of a histogram of
//! 1 ns .. `max` at the given significant digits, one increment per sample, and builds
//! that histogram from them when a report asks ([`HdrCounts::to_hdr`]): its buckets,
//! count, min, max, mean and percentiles are those of a histogram recorded into
//! directly with `saturating_record`.

use hdrhistogram::Histogram;

/// Sample counts of an HDR histogram of 1 ns .. `max` ns with `sigfig` significant digits.
#[derive(Clone, Debug)]
pub struct HdrCounts {
    counts: Box<[u64]>,
    /// log2 of the sub-buckets per bucket (the histogram's `sub_bucket_count`).
    sub_bits: u32,
    /// The slot `max` falls in, where larger values are counted (saturation).
    max_slot: usize,
    max: u64,
    sigfig: u8,
}

impl HdrCounts {
    /// Empty counts (allocates them: `8 * distinct_values` bytes of the histogram).
    ///
    /// # Panics
    /// If `sigfig` is above 5 or `max` below 2, which `hdrhistogram` refuses too.
    pub fn new(max: u64, sigfig: u8) -> HdrCounts {
        assert!(sigfig <= 5 && max >= 2, "histogram bounds");
        // The smallest power of two covering 2 * 10^sigfig (single-unit resolution).
        let sub_bits = (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two().trailing_zeros();
        // Buckets needed to cover max, as the histogram counts them.
        let mut buckets = 1u32;
        let mut untrackable = 1u64 << sub_bits;
        while untrackable <= max {
            if untrackable > u64::MAX / 2 {
                buckets += 1;
                break;
            }
            untrackable <<= 1;
            buckets += 1;
        }
        let len = usize::try_from(u64::from(buckets + 1) << (sub_bits - 1)).expect("histogram slots fit usize");
        let mut h = HdrCounts { counts: Box::default(), sub_bits, max_slot: 0, max, sigfig };
        h.max_slot = h.slot(max);
        h.counts = vec![0; len].into_boxed_slice();
        h
    }

    /// The slot of `ns` (may be past the end for a value above the last bucket).
    #[inline]
    fn slot(&self, ns: u64) -> usize {
        let bucket = (64 - self.sub_bits) - (ns | ((1 << self.sub_bits) - 1)).leading_zeros();
        let slot = (u64::from(bucket) << (self.sub_bits - 1)) + (ns >> bucket);
        // A slot past usize::MAX is past the end too.
        usize::try_from(slot).unwrap_or(usize::MAX)
    }

    /// The smallest value of slot `slot`.
    fn slot_value(&self, slot: usize) -> u64 {
        let slot = slot as u64;
        let half = 1u64 << (self.sub_bits - 1);
        if slot < half { slot } else { (half + slot % half) << (slot / half - 1) }
    }

    /// Counts one sample; a value past the last bucket counts as `max`.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.record_n(ns, 1);
    }

    /// Counts `n` samples of one value; a value past the last bucket counts as `max`.
    pub fn record_n(&mut self, ns: u64, n: u64) {
        let slot = self.slot(ns);
        let slot = if slot < self.counts.len() { slot } else { self.max_slot };
        self.counts[slot] = self.counts[slot].saturating_add(n);
    }

    /// Adds the counts of `other` (the same bounds).
    ///
    /// # Panics
    /// If the bounds differ.
    pub fn add(&mut self, other: &HdrCounts) {
        assert!(self.max == other.max && self.sigfig == other.sigfig, "histograms of the same bounds");
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// Zeroes the counts (keeps their memory).
    pub fn reset(&mut self) {
        self.counts.fill(0);
    }

    /// Slots of the layout (the histogram's `distinct_values`).
    pub fn slots(&self) -> usize {
        self.counts.len()
    }

    /// The histogram these counts describe (allocates it).
    pub fn to_hdr(&self) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, self.max, self.sigfig).expect("bounds checked in new");
        for (slot, &n) in self.counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            h.saturating_record_n(self.slot_value(slot), n);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(ours: &HdrCounts, hdr: &Histogram<u64>) {
        let built = ours.to_hdr();
        assert_eq!(ours.slots(), hdr.distinct_values());
        assert_eq!((built.len(), built.min(), built.max()), (hdr.len(), hdr.min(), hdr.max()));
        assert_eq!(built.mean().to_bits(), hdr.mean().to_bits());
        for p in [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0] {
            assert_eq!(built.value_at_percentile(p), hdr.value_at_percentile(p), "p{p}");
        }
        let bins = |h: &Histogram<u64>| {
            h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect::<Vec<_>>()
        };
        assert_eq!(bins(&built), bins(hdr));
    }

    #[test]
    fn counts_give_the_histogram_recorded_directly() {
        // The host's bounds (60 s, 2 digits) and a benchmark's (1 h, 3 digits).
        for (max, sigfig) in [(60_000_000_000u64, 2u8), (3_600_000_000_000, 3), (1000, 1)] {
            let mut ours = HdrCounts::new(max, sigfig);
            let mut hdr = Histogram::<u64>::new_with_bounds(1, max, sigfig).unwrap();
            let mut values = vec![0, 1, 2, 127, 128, 255, 256, 257, 1023, 1024, 2047, 2048, 2049, 4097, 1 << 20];
            values.extend([max - 1, max, max + 1, max + max / 10, 2 * max, u64::MAX / 2, u64::MAX]);
            // A spread of latencies (a fixed linear congruential sequence).
            let mut x = 12345u64;
            for _ in 0..20_000 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                values.push((x >> 40) % 5_000_000);
            }
            for &v in &values {
                ours.record(v);
                hdr.saturating_record(v);
            }
            same(&ours, &hdr);
            for slot in 0..ours.slots() {
                assert_eq!(ours.slot(ours.slot_value(slot)), slot, "slot {slot}");
            }
        }
    }

    #[test]
    fn add_and_reset() {
        let mut a = HdrCounts::new(60_000_000_000, 2);
        let mut b = HdrCounts::new(60_000_000_000, 2);
        let mut hdr = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 2).unwrap();
        for v in [10, 10_000, 5_000_000] {
            a.record(v);
            hdr.saturating_record(v);
        }
        for v in [77, 70_000_000_000] {
            b.record(v);
            hdr.saturating_record(v);
        }
        a.add(&b);
        same(&a, &hdr);
        a.reset();
        assert_eq!(a.to_hdr().len(), 0);
    }
}
