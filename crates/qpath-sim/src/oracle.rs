//! What the namespace may hold, block by block, from what the application was told.
//!
//! Per block: the values it may hold at its last durable point (`base`, after a crash)
//! and the writes since, in the order their outcome reached the application: acknowledged
//! (success) or uncertain (failed: a path may still have executed it). A read may return
//! the last acknowledged write or an uncertain one after it; with no acknowledged write
//! since the base, any base value or uncertain write. An acknowledged write becomes
//! durable when it was written with FUA, or when a Flush submitted after its
//! acknowledgement succeeds; a crash keeps the writes from the last durable one on (any
//! later one may have reached the media too). Write id 0 stands for never written (zeros).

use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug)]
struct Entry {
    wid: u64,
    acked: bool,
    ack_seq: u64,
}

#[derive(Clone, Debug)]
struct Block {
    base: BTreeSet<u64>,
    hist: Vec<Entry>,
    durable: Option<usize>,
}

/// The model of a namespace's contents.
#[derive(Clone, Debug)]
pub struct Oracle {
    blocks: Vec<Block>,
}

impl Oracle {
    /// `n` blocks never written.
    pub fn new(n: usize) -> Oracle {
        Oracle { blocks: vec![Block { base: BTreeSet::from([0]), hist: Vec::new(), durable: None }; n] }
    }

    /// Write `wid` to `blocks` was acknowledged at sequence `seq`.
    pub fn write_acked(&mut self, blocks: std::ops::Range<usize>, wid: u64, fua: bool, seq: u64) {
        for b in &mut self.blocks[blocks] {
            b.hist.push(Entry { wid, acked: true, ack_seq: seq });
            if fua {
                b.durable = Some(b.hist.len() - 1);
            }
        }
    }

    /// Write `wid` failed: it may or may not have been executed.
    pub fn write_uncertain(&mut self, blocks: std::ops::Range<usize>, wid: u64) {
        for b in &mut self.blocks[blocks] {
            b.hist.push(Entry { wid, acked: false, ack_seq: 0 });
        }
    }

    /// A Flush submitted at sequence `submit_seq` succeeded.
    pub fn flushed(&mut self, submit_seq: u64) {
        for b in &mut self.blocks {
            if let Some(i) = b.hist.iter().rposition(|e| e.acked && e.ack_seq < submit_seq)
                && b.durable.is_none_or(|d| d < i)
            {
                b.durable = Some(i);
            }
        }
    }

    /// The target lost power.
    pub fn crashed(&mut self) {
        for b in &mut self.blocks {
            let keep: Vec<u64> = match b.durable {
                Some(d) => b.hist[d..].iter().map(|e| e.wid).collect(),
                None => b.base.iter().copied().chain(b.hist.iter().map(|e| e.wid)).collect(),
            };
            b.base = keep.into_iter().collect();
            b.hist.clear();
            b.durable = None;
        }
    }

    /// A shrink cut `blocks` off: a grow brings them back never written (a file extended
    /// reads as zeros).
    pub fn cut(&mut self, blocks: std::ops::Range<usize>) {
        for b in &mut self.blocks[blocks] {
            *b = Block { base: BTreeSet::from([0]), hist: Vec::new(), durable: None };
        }
    }

    /// The write ids block `blk` may hold now.
    pub fn allowed(&self, blk: usize) -> BTreeSet<u64> {
        let b = &self.blocks[blk];
        match b.hist.iter().rposition(|e| e.acked) {
            Some(i) => b.hist[i..].iter().map(|e| e.wid).collect(),
            None => b.base.iter().copied().chain(b.hist.iter().map(|e| e.wid)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_block_may_hold() {
        let mut o = Oracle::new(2);
        assert_eq!(o.allowed(0), BTreeSet::from([0]));
        o.write_acked(0..1, 5, false, 1);
        o.write_uncertain(0..1, 6);
        assert_eq!(o.allowed(0), BTreeSet::from([5, 6]));
        o.write_acked(0..1, 7, false, 3);
        assert_eq!(o.allowed(0), BTreeSet::from([7]), "overwritten by a later acknowledged write");
        o.crashed();
        assert_eq!(o.allowed(0), BTreeSet::from([0, 5, 6, 7]), "nothing was durable");
        o.write_acked(0..1, 8, false, 4);
        o.flushed(5);
        o.write_acked(0..1, 9, false, 6);
        o.crashed();
        assert_eq!(o.allowed(0), BTreeSet::from([8, 9]), "the flushed write or a later one");
        o.write_acked(0..2, 10, true, 7);
        o.crashed();
        assert_eq!((o.allowed(0), o.allowed(1)), (BTreeSet::from([10]), BTreeSet::from([10])), "FUA");
        o.cut(1..2);
        assert_eq!((o.allowed(0), o.allowed(1)), (BTreeSet::from([10]), BTreeSet::from([0])), "cut off by a shrink");
    }
}
