//! `verify=crc32c`: every written block carries a header, modelled on fio's
//! `struct verify_header`, and pseudo-random data derived from (seed, offset,
//! generation); reads check the header and a CRC32C of the whole block.
//!
//! Header layout (32 bytes, little-endian):
//!
//! ```text
//!  0  magic u16 = 0xacca (fio's VERIFY_MAGIC)    2  kind u16 = 1 (crc32c)
//!  4  len u32: block length                      8  offset u64: where the block was written
//! 16  seed u64: the job's data seed             24  generation u32: which write this was
//! 28  crc32c u32 of the whole block with these 4 bytes zeroed
//! ```
//!
//! The generation lets a read tell "this block holds the data of the *last* write to it"
//! from "it holds older data that happens to be intact" (a lost write).

use std::fmt;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

/// Header length in bytes.
pub const HEADER_LEN: usize = 32;
/// fio's verify magic.
pub const MAGIC: u16 = 0xacca;
/// The `kind` value for CRC32C.
pub const KIND_CRC32C: u16 = 1;

const CRC_AT: usize = 28;

/// Why a block failed verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The magic is wrong: the block was never written with a header.
    BadMagic {
        /// What was found.
        got: u16,
    },
    /// The header names another verify method.
    BadKind {
        /// What was found.
        got: u16,
    },
    /// The header's length differs from the block length.
    BadLength {
        /// Block length.
        expected: u32,
        /// Header's length.
        got: u32,
    },
    /// The header was written for another offset (misdirected write or read).
    BadOffset {
        /// Expected offset.
        expected: u64,
        /// Header's offset.
        got: u64,
    },
    /// The CRC32C stored in the header does not match the data.
    BadCrc {
        /// Stored in the header.
        expected: u32,
        /// Computed over the data read.
        got: u32,
    },
    /// Intact data, but from an older write than the last one (a lost write).
    Stale {
        /// Generation of the last write to this block.
        expected: u32,
        /// Generation found.
        got: u32,
    },
}

/// A failed check, with where it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset of the block.
    pub offset: u64,
    /// Block length.
    pub len: u32,
    /// What was wrong.
    pub failure: Failure,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (off, len) = (self.offset, self.len);
        match self.failure {
            Failure::BadMagic { got } => {
                write!(f, "verify: bad magic header {got:#06x}, wanted {MAGIC:#06x} at offset {off} (length {len})")
            }
            Failure::BadKind { got } => {
                write!(f, "verify: header kind {got} is not crc32c ({KIND_CRC32C}) at offset {off} (length {len})")
            }
            Failure::BadLength { expected, got } => {
                write!(f, "verify: bad header length {got}, wanted {expected} at offset {off}")
            }
            Failure::BadOffset { expected, got } => {
                write!(f, "verify: bad header offset {got}, wanted {expected} (length {len})")
            }
            Failure::BadCrc { expected, got } => write!(
                f,
                "verify: bad crc32c at offset {off} (length {len}): expected {expected:#010x}, got {got:#010x}"
            ),
            Failure::Stale { expected, got } => write!(
                f,
                "verify: stale data at offset {off} (length {len}): expected generation {expected}, got {got}"
            ),
        }
    }
}

/// splitmix64: a cheap, well-mixed 64-bit hash for deriving per-block seeds.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fill `block` with a header and the data for (`seed`, `offset`, `generation`).
pub fn fill(block: &mut [u8], seed: u64, offset: u64, generation: u32) {
    assert!(block.len() >= HEADER_LEN, "verify block of {} bytes is shorter than its header", block.len());
    let len = u32::try_from(block.len()).expect("verify block length fits u32");
    let data_seed = mix64(seed ^ mix64(offset ^ (u64::from(generation) << 40)));
    SmallRng::seed_from_u64(data_seed).fill_bytes(&mut block[HEADER_LEN..]);
    block[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    block[2..4].copy_from_slice(&KIND_CRC32C.to_le_bytes());
    block[4..8].copy_from_slice(&len.to_le_bytes());
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&seed.to_le_bytes());
    block[24..28].copy_from_slice(&generation.to_le_bytes());
    block[CRC_AT..HEADER_LEN].fill(0);
    let crc = block_crc(block);
    block[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// CRC32C of `block` as if its CRC field were zero.
fn block_crc(block: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&block[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &[0u8; HEADER_LEN - CRC_AT]);
    crc32c::crc32c_append(crc, &block[HEADER_LEN..])
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The generation stored in a block's header (valid only after [`check`] passed).
pub fn generation_of(block: &[u8]) -> u32 {
    le_u32(&block[24..28])
}

/// Check a block read from `offset`. `expected_generation` is the last generation this
/// job wrote there, if it knows one; `None` checks the header and CRC only.
pub fn check(block: &[u8], offset: u64, expected_generation: Option<u32>) -> Result<(), Mismatch> {
    let len = u32::try_from(block.len()).unwrap_or(u32::MAX);
    let fail = |failure| Err(Mismatch { offset, len, failure });
    if block.len() < HEADER_LEN {
        return fail(Failure::BadLength { expected: len, got: 0 });
    }
    let magic = le_u16(&block[0..2]);
    if magic != MAGIC {
        return fail(Failure::BadMagic { got: magic });
    }
    let kind = le_u16(&block[2..4]);
    if kind != KIND_CRC32C {
        return fail(Failure::BadKind { got: kind });
    }
    let hdr_len = le_u32(&block[4..8]);
    if hdr_len != len {
        return fail(Failure::BadLength { expected: len, got: hdr_len });
    }
    let hdr_off = le_u64(&block[8..16]);
    if hdr_off != offset {
        return fail(Failure::BadOffset { expected: offset, got: hdr_off });
    }
    let stored = le_u32(&block[CRC_AT..HEADER_LEN]);
    let computed = block_crc(block);
    if stored != computed {
        return fail(Failure::BadCrc { expected: stored, got: computed });
    }
    if let Some(expected) = expected_generation {
        let got = generation_of(block);
        if got != expected {
            return fail(Failure::Stale { expected, got });
        }
    }
    Ok(())
}

/// Per-block write generations for one job: which blocks it wrote and with which
/// generation, plus how many writes to each block are in flight.
///
/// One `u32` per block: the low 28 bits hold the generation (0 = never written by this
/// job), the next 3 count in-flight writes, the top one says two writes to the block
/// were in flight at once: which lands last is then undefined (NVMe orders no two
/// commands), so once both completed the block is forgotten, as after a failed write. A
/// write held for its failover hold (the host's, after a lost connection) overlaps
/// later writes to its block that way. Sized once at job start.
#[derive(Debug)]
pub struct GenerationMap {
    entries: Vec<u32>,
    next: u32,
}

const GEN_MASK: u32 = (1 << 28) - 1;
const INFLIGHT_ONE: u32 = 1 << 28;
const INFLIGHT_MASK: u32 = 0b111 << 28;
const INFLIGHT_MAX: u32 = 7;
/// Two writes to the block were in flight at once.
const OVERLAPPED: u32 = 1 << 31;

/// Most blocks a job may verify (the map costs 4 bytes per block: 1 GiB at this size).
pub const BLOCKS_MAX: u64 = 1 << 28;

/// What a read should expect of a block when it is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// This job never wrote the block: check header and CRC only, or skip if the job
    /// also writes (the block holds layout data).
    Unwritten,
    /// A write to the block is in flight; the result is undefined, skip the check.
    Racing,
    /// The block's last completed-or-issued write had this generation.
    Generation(u32),
}

impl GenerationMap {
    /// A map for `blocks` blocks.
    pub fn new(blocks: u64) -> Result<GenerationMap, String> {
        if blocks > BLOCKS_MAX {
            return Err(format!(
                "verify over {blocks} blocks needs more than {BLOCKS_MAX} entries; use a larger bs or smaller size"
            ));
        }
        let n = usize::try_from(blocks).map_err(|e| e.to_string())?;
        Ok(GenerationMap { entries: vec![0; n], next: 1 })
    }

    /// Number of blocks tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map tracks no blocks.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A write to `block` is being issued: returns the generation to stamp into it.
    pub fn begin_write(&mut self, block: usize) -> u32 {
        let generation = self.next;
        self.next = if self.next >= GEN_MASK { 1 } else { self.next + 1 };
        let e = self.entries[block];
        let inflight = (e & INFLIGHT_MASK) >> 28;
        let overlapped = if inflight > 0 { OVERLAPPED } else { e & OVERLAPPED };
        self.entries[block] = overlapped | ((inflight.min(INFLIGHT_MAX - 1) + 1) << 28) | generation;
        generation
    }

    /// A write to `block` completed; `ok` = it succeeded.
    pub fn end_write(&mut self, block: usize, ok: bool) {
        let e = self.entries[block];
        let e = if e & INFLIGHT_MASK != 0 { e - INFLIGHT_ONE } else { e };
        // A failed write leaves unknown data: forget the block. So does the last of
        // overlapping writes: any of them may have landed last.
        let idle = e & INFLIGHT_MASK == 0;
        self.entries[block] = if ok && e & OVERLAPPED == 0 {
            e
        } else if idle {
            0
        } else if ok {
            e
        } else {
            e & !GEN_MASK
        };
    }

    /// What a read of `block` issued now should find.
    pub fn expect(&self, block: usize) -> Expect {
        let e = self.entries[block];
        if e & INFLIGHT_MASK != 0 {
            Expect::Racing
        } else if e & GEN_MASK == 0 {
            Expect::Unwritten
        } else {
            Expect::Generation(e & GEN_MASK)
        }
    }

    /// The current generation of `block` (0 if never written), ignoring in-flight state.
    pub fn current(&self, block: usize) -> u32 {
        self.entries[block] & GEN_MASK
    }

    /// The first block at or after `from` that this job wrote, with its generation.
    pub fn next_written(&self, from: usize) -> Option<(usize, u32)> {
        let tail = self.entries.get(from..)?;
        tail.iter().position(|e| e & GEN_MASK != 0).map(|i| (from + i, self.entries[from + i] & GEN_MASK))
    }

    /// Blocks this job wrote successfully, in offset order.
    pub fn written(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.entries.iter().enumerate().filter(|(_, e)| **e & GEN_MASK != 0).map(|(i, e)| (i, e & GEN_MASK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_passes() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 42, 8192, 7);
        assert_eq!(check(&b, 8192, Some(7)), Ok(()));
        assert_eq!(check(&b, 8192, None), Ok(()));
        assert_eq!(generation_of(&b), 7);
    }

    #[test]
    fn each_corruption_is_named() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 1, 0, 1);
        let mut c = b.clone();
        c[100] ^= 1;
        assert!(matches!(check(&c, 0, None).unwrap_err().failure, Failure::BadCrc { .. }));
        assert!(matches!(check(&b, 4096, None).unwrap_err().failure, Failure::BadOffset { .. }));
        assert!(matches!(check(&b, 0, Some(2)).unwrap_err().failure, Failure::Stale { expected: 2, got: 1 }));
        assert!(matches!(check(&vec![0u8; 4096], 0, None).unwrap_err().failure, Failure::BadMagic { got: 0 }));
        assert!(matches!(check(&b[..2048], 0, None).unwrap_err().failure, Failure::BadLength { .. }));
        let msg = check(&c, 0, None).unwrap_err().to_string();
        assert!(msg.starts_with("verify: bad crc32c at offset 0 (length 4096): expected 0x"), "{msg}");
    }

    #[test]
    fn data_depends_on_generation() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill(&mut a, 1, 0, 1);
        fill(&mut b, 1, 0, 2);
        assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..]);
    }

    #[test]
    fn generation_map_tracks_inflight_writes() {
        let mut m = GenerationMap::new(4).unwrap();
        assert_eq!(m.expect(0), Expect::Unwritten);
        let g1 = m.begin_write(0);
        assert_eq!(m.expect(0), Expect::Racing);
        m.end_write(0, true);
        assert_eq!(m.expect(0), Expect::Generation(g1));
        // Two writes in flight at once: either may land last, so neither is expected.
        m.begin_write(0);
        m.begin_write(0);
        m.end_write(0, true);
        assert_eq!(m.expect(0), Expect::Racing);
        m.end_write(0, true);
        assert_eq!(m.expect(0), Expect::Unwritten);
        let g4 = m.begin_write(0);
        m.end_write(0, true);
        assert_eq!(m.expect(0), Expect::Generation(g4), "one write at a time again");
        m.begin_write(1);
        m.end_write(1, false);
        assert_eq!(m.expect(1), Expect::Unwritten);
        assert_eq!(m.written().count(), 1);
        assert_eq!(m.next_written(0), Some((0, g4)));
        assert_eq!(m.next_written(1), None);
        assert_eq!(m.next_written(99), None);
        assert!(GenerationMap::new(BLOCKS_MAX + 1).is_err());
    }
}
