//! Copy command source ranges (NVM Command Set 1.0 §3.2.2): the data of a Copy is a list
//! of Source Range entries; descriptor format 0h (the only one qpath supports) is 32
//! bytes per entry:
//!
//! ```text
//!  bytes  0..8   reserved
//!         8..16  SLBA: first block of the range
//!        16..18  NLB: blocks in the range, 0's based
//!        18..24  reserved
//!        24..32  EILBRT, ELBAT, ELBATM: end-to-end protection (no metadata here: ignored)
//! ```

use crate::wire::{get_u16, get_u64, put_u16, put_u64};

/// Bytes of one format 0h Source Range entry.
pub const RANGE_SIZE: usize = 32;

/// The most Source Range entries a Copy can name (NR is 8 bits, 0's based).
pub const RANGES_MAX: usize = 256;

/// Descriptor format 0h (CDW12 bits 11:8).
pub const FORMAT_0: u8 = 0;

/// One source range of a Copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SourceRange {
    /// Starting LBA.
    pub slba: u64,
    /// Number of blocks (1..=65536; the wire holds it 0's based).
    pub nlb: u32,
}

impl SourceRange {
    /// Decodes the first entry of `b` (short input reads as zeros).
    pub fn decode(b: &[u8]) -> SourceRange {
        SourceRange { slba: get_u64(b, 8), nlb: u32::from(get_u16(b, 16)) + 1 }
    }

    /// Encodes into `out[..RANGE_SIZE]` (the reserved and protection fields zero).
    pub fn encode(&self, out: &mut [u8]) {
        let n = out.len().min(RANGE_SIZE);
        out[..n].fill(0);
        put_u64(out, 8, self.slba);
        put_u16(out, 16, u16::try_from(self.nlb.saturating_sub(1)).unwrap_or(u16::MAX));
    }

    /// The Copy data for `ranges`, in format 0h.
    pub fn encode_list(ranges: &[SourceRange]) -> Vec<u8> {
        let mut v = vec![0u8; ranges.len() * RANGE_SIZE];
        for (r, out) in ranges.iter().zip(v.chunks_exact_mut(RANGE_SIZE)) {
            r.encode(out);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_libnvme() {
        // libnvme struct nvme_copy_range: rsvd0[8], slba (le64), nlb (le16, 0's based), ...
        let mut b = [0xffu8; RANGE_SIZE];
        SourceRange { slba: 0x0102_0304_0506_0708, nlb: 8 }.encode(&mut b);
        assert_eq!(&b[..8], &[0; 8]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..18], &[7, 0]);
        assert!(b[18..].iter().all(|&x| x == 0));
        assert_eq!(SourceRange::decode(&b), SourceRange { slba: 0x0102_0304_0506_0708, nlb: 8 });
        // NLB 0xffff is 65536 blocks.
        b[16..18].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(SourceRange::decode(&b).nlb, 65536);
        let l = SourceRange::encode_list(&[SourceRange { slba: 1, nlb: 1 }, SourceRange { slba: 9, nlb: 2 }]);
        assert_eq!(l.len(), 64);
        assert_eq!(SourceRange::decode(&l[32..]), SourceRange { slba: 9, nlb: 2 });
    }
}
