//! A simulated disk behind the target's real file backend: the seam is
//! [`target::backend::FileIo`], the trait the reactor's io_uring implements. The target
//! hands it the same [`FileOp`]s it hands the ring; the disk ignores the real file
//! (opened and locked at start-up as usual, never read or written by the run) and keeps
//! the namespace's bytes in two images:
//!
//! - `current`: what a read returns (the device's cache included);
//! - `durable`: what survives a power loss. A completed write is in `current` only
//!   until an fdatasync (the target's Flush, or the sync after a FUA write) completes;
//!   a crash keeps each block written since the last sync, or not, as the seed decides
//!   (NVMe Base 2.x §5.15: data not flushed may or may not be on media).
//!
//! The image is a file's: it has a length, which the namespace's resize changes through
//! the real file (the world mirrors it here with [`SimDisk::set_len`]); a write past the
//! end extends it and a read past the end comes back short, as `pwrite`/`pread` do.
//!
//! Operations complete after a delay the seed draws (a slow disk now and then), in an
//! order the scheduler picks among those due, so completions overtake one another.
//! Every write's data carries its write id (the workload stamps each block); the disk
//! records which ids it executed, so the checker can tell an acknowledged write that no
//! path ever executed.

use std::collections::BTreeSet;

use target::backend::{FileIo, FileOp};
use uring::IoBuf;

use crate::rng::Rng;

/// Bytes per simulated block (the namespace's LBA size).
pub const BLOCK: usize = 512;

/// What an operation does when it completes.
#[derive(Debug)]
enum Kind {
    Read {
        offset: u64,
        len: usize,
    },
    Write {
        offset: u64,
        len: usize,
    },
    Sync,
    /// Refused at completion (fallocate: the simulated disk keeps no holes).
    Unsupported,
}

/// An operation submitted and not completed yet.
#[derive(Debug)]
struct Pending {
    due_ns: u64,
    token: u64,
    kind: Kind,
    buf: Option<IoBuf>,
}

/// A completed operation for the driver to hand to its connection.
pub type Completion = (u64, std::io::Result<usize>, Option<IoBuf>);

/// The simulated disk.
#[derive(Debug)]
pub struct SimDisk {
    /// The file's length in bytes (`current` and `durable` are its largest size).
    len: usize,
    current: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<usize>,
    pending: Vec<Pending>,
    /// Write ids whose data reached `current` (kept across crashes).
    executed: BTreeSet<u64>,
    rng: Rng,
    /// Now, as the driver last set it.
    pub now_ns: u64,
    /// Whether the disk is slow now (a fault the world switches).
    pub slow: bool,
    /// Operations completed so far.
    pub ops: u64,
    /// Operations submitted so far (what the checks count per disk).
    pub submitted: u64,
    /// Of those, writes.
    pub writes: u64,
}

impl SimDisk {
    /// A zeroed disk of `size` bytes that may grow up to `capacity` bytes.
    pub fn new(size: usize, capacity: usize, rng: Rng) -> SimDisk {
        assert!(size <= capacity, "a disk of {size} bytes in {capacity}");
        SimDisk {
            len: size,
            current: vec![0; capacity],
            durable: vec![0; capacity],
            dirty: BTreeSet::new(),
            pending: Vec::new(),
            executed: BTreeSet::new(),
            rng,
            now_ns: 0,
            slow: false,
            ops: 0,
            submitted: 0,
            writes: 0,
        }
    }

    /// Size in bytes (the file's length).
    pub fn size(&self) -> usize {
        self.len
    }

    /// The file's length changes (`ftruncate`): bytes cut off are gone, from the cache and
    /// the media (the length is metadata the file system journals: a crash keeps it), and
    /// an extension reads as zeros.
    pub fn set_len(&mut self, len: usize) {
        let len = len.min(self.current.len());
        if len < self.len {
            self.current[len..self.len].fill(0);
            self.durable[len..self.len].fill(0);
            let first_cut = len.div_ceil(BLOCK);
            self.dirty.retain(|&b| b < first_cut);
        }
        self.len = len;
    }

    /// The write id block `blk` holds now (0: zeros), as a read would see it.
    pub fn block_wid(&self, blk: usize) -> u64 {
        let b = &self.current[blk * BLOCK..(blk + 1) * BLOCK];
        u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))
    }

    /// Gives `file` this image's length, and from byte `from` on its data (the blocks
    /// holding any; the rest a hole), so that code that looks at the real file (the
    /// namespace's resize checks for data past a new end with `SEEK_DATA`, a start checks
    /// its length) sees what this disk holds. `from` is rounded down to a page, the
    /// granularity at which file systems track holes.
    pub fn copy_to(&self, file: &std::fs::File, from: usize) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        let from = from.min(self.len) / 4096 * 4096;
        file.set_len(from as u64)?;
        file.set_len(self.len as u64)?;
        for (i, b) in self.current[from..self.len].chunks(BLOCK).enumerate() {
            if b.iter().any(|&x| x != 0) {
                file.write_all_at(b, (from + i * BLOCK) as u64)?;
            }
        }
        Ok(())
    }

    fn delay_ns(&mut self) -> u64 {
        if self.slow {
            self.rng.range(2_000_000, 200_000_000)
        } else if self.rng.chance(20_000) {
            self.rng.range(1_000_000, 20_000_000)
        } else {
            self.rng.range(5_000, 120_000)
        }
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Indices (into the pending list) of operations due now.
    pub fn due(&self) -> Vec<usize> {
        (0..self.pending.len()).filter(|&i| self.pending[i].due_ns <= self.now_ns).collect()
    }

    /// The earliest time an operation is due.
    pub fn next_due(&self) -> Option<u64> {
        self.pending.iter().map(|p| p.due_ns).min()
    }

    /// Whether a write in flight reaches past byte `offset`.
    pub fn writes_past(&self, offset: usize) -> bool {
        let offset = offset as u64;
        self.pending.iter().any(|p| matches!(p.kind, Kind::Write { offset: o, len } if o + len as u64 > offset))
    }

    /// Whether write `id` was executed by the disk.
    pub fn executed(&self, id: u64) -> bool {
        self.executed.contains(&id)
    }

    /// What pending operation `i` is, for the trace: `write lba 8+4 wid 17`, `read lba 8+4`, `sync`.
    pub fn describe(&self, i: usize) -> String {
        let p = &self.pending[i];
        match &p.kind {
            Kind::Read { offset, len } => format!("read lba {}+{}", offset / BLOCK as u64, len / BLOCK),
            Kind::Write { offset, len } => {
                let wid =
                    p.buf.as_ref().map_or(0, |b| u64::from_le_bytes(b.as_full()[..8].try_into().unwrap_or([0; 8])));
                format!("write lba {}+{} wid {wid}", offset / BLOCK as u64, len / BLOCK)
            }
            Kind::Sync => "sync".to_string(),
            Kind::Unsupported => "fallocate".to_string(),
        }
    }

    /// Completes pending operation `i`: applies it and returns its completion.
    pub fn complete(&mut self, i: usize) -> Completion {
        let p = self.pending.swap_remove(i);
        self.ops += 1;
        let mut buf = p.buf;
        let r = match p.kind {
            Kind::Read { offset, len } => {
                let b = buf.as_mut().expect("a read carries its buffer");
                let o = usize::try_from(offset).unwrap_or(usize::MAX);
                // pread(2): short at the end of the file.
                let n = len.min(self.len.saturating_sub(o));
                b.set_len(n);
                b.as_full_mut()[..n].copy_from_slice(&self.current[o..o + n]);
                Ok(n)
            }
            Kind::Write { offset, len } => {
                let b = buf.as_ref().expect("a write carries its buffer");
                self.apply(offset, &b.as_full()[..len]);
                Ok(len)
            }
            Kind::Sync => {
                for blk in std::mem::take(&mut self.dirty) {
                    let r = blk * BLOCK..(blk + 1) * BLOCK;
                    self.durable[r.clone()].copy_from_slice(&self.current[r]);
                }
                Ok(0)
            }
            Kind::Unsupported => Err(std::io::Error::from_raw_os_error(95)),
        };
        (p.token, r, buf)
    }

    fn apply(&mut self, offset: u64, data: &[u8]) {
        let o = usize::try_from(offset).unwrap_or(usize::MAX);
        self.current[o..o + data.len()].copy_from_slice(data);
        // pwrite(2) past the end extends the file.
        self.len = self.len.max(o + data.len());
        for (k, chunk) in data.chunks(BLOCK).enumerate() {
            self.dirty.insert(o / BLOCK + k);
            self.executed.insert(u64::from_le_bytes(chunk[..8].try_into().unwrap_or([0; 8])));
        }
    }

    /// Power loss: operations in flight are lost (a write among them may have reached the
    /// cache first), each block written since the last sync is kept or lost, and the cache
    /// is what the media holds.
    /// Returns what happened to the operations in flight, for the trace.
    pub fn crash(&mut self) -> Vec<String> {
        let mut lost = Vec::new();
        for i in (0..self.pending.len()).rev() {
            let what = self.describe(i);
            let p = self.pending.swap_remove(i);
            let reached = matches!(p.kind, Kind::Write { .. }) && self.rng.chance(500_000);
            if let (true, Kind::Write { offset, len }, Some(b)) = (reached, &p.kind, &p.buf) {
                self.apply(*offset, &b.as_full()[..*len]);
            }
            lost.push(format!(
                "{what} of conn {} slot {} (due {}){}",
                p.token >> 16,
                p.token & 0xffff,
                p.due_ns,
                if reached { " reached the cache" } else { " lost" }
            ));
        }
        for blk in std::mem::take(&mut self.dirty) {
            if self.rng.chance(500_000) {
                let r = blk * BLOCK..(blk + 1) * BLOCK;
                self.durable[r.clone()].copy_from_slice(&self.current[r]);
            }
        }
        self.current.copy_from_slice(&self.durable);
        self.slow = false;
        lost
    }
}

impl FileIo for SimDisk {
    fn submit(&mut self, op: FileOp<'_>, token: u64) -> Result<(), (std::io::Error, Option<IoBuf>)> {
        // Past the largest size the namespace can have: no command the target plans
        // reaches this (within the file's length or not, see `complete`).
        let size = self.current.len() as u64;
        let in_range = |offset: u64, len: usize| offset.checked_add(len as u64).is_some_and(|e| e <= size);
        let (kind, buf) = match op {
            FileOp::Read { buf, len, offset, .. } => {
                let len = len.min(buf.capacity());
                if !in_range(offset, len) {
                    return Err((std::io::Error::from_raw_os_error(22), Some(buf)));
                }
                (Kind::Read { offset, len }, Some(buf))
            }
            FileOp::Write { buf, len, offset, .. } => {
                let len = len.min(buf.len());
                if !in_range(offset, len) {
                    return Err((std::io::Error::from_raw_os_error(22), Some(buf)));
                }
                (Kind::Write { offset, len }, Some(buf))
            }
            FileOp::Sync { .. } => (Kind::Sync, None),
            FileOp::Fallocate { .. } => (Kind::Unsupported, None),
        };
        self.submitted += 1;
        self.writes += u64::from(matches!(kind, Kind::Write { .. }));
        let due_ns = self.now_ns + self.delay_ns();
        self.pending.push(Pending { due_ns, token, kind, buf });
        Ok(())
    }
}

/// The target's file I/O over two simulated disks: each operation goes to the disk of the
/// file it names (by inode), as the kernel sends it to that file's. `other` is the disk of
/// a namespace the operator put in place of the first one (its file's inode with it).
pub struct Disks<'a> {
    /// The disk of the namespace the host's device was opened on.
    pub first: &'a mut SimDisk,
    /// Another namespace's disk and its file's inode.
    pub other: Option<(&'a mut SimDisk, u64)>,
}

impl FileIo for Disks<'_> {
    fn submit(&mut self, op: FileOp<'_>, token: u64) -> Result<(), (std::io::Error, Option<IoBuf>)> {
        use std::os::unix::fs::MetadataExt as _;
        let file = match &op {
            FileOp::Read { file, .. }
            | FileOp::Write { file, .. }
            | FileOp::Sync { file }
            | FileOp::Fallocate { file, .. } => *file,
        };
        match &mut self.other {
            Some((disk, ino)) if file.metadata().is_ok_and(|m| m.ino() == *ino) => disk.submit(op, token),
            _ => self.first.submit(op, token),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The disk never touches the file its operations name.
    fn file() -> std::fs::File {
        std::fs::File::open("/dev/null").unwrap()
    }

    fn write(d: &mut SimDisk, blk: usize, wid: u8) {
        let mut b = IoBuf::new(4096);
        b.extend_from_slice(&[wid; BLOCK]);
        let f = file();
        d.submit(FileOp::Write { file: &f, buf: b, len: BLOCK, offset: (blk * BLOCK) as u64 }, 0).unwrap();
        let i = d.pending.len() - 1;
        d.complete(i).1.unwrap();
    }

    #[test]
    fn the_image_has_a_file_length() {
        let mut d = SimDisk::new(4 * BLOCK, 8 * BLOCK, Rng::new(1));
        write(&mut d, 5, 9);
        assert_eq!(d.size(), 6 * BLOCK, "a write past the end extends the file");
        d.set_len(5 * BLOCK);
        assert_eq!(d.block_wid(5), 0, "cut off");
        d.set_len(8 * BLOCK);
        assert_eq!(d.block_wid(5), 0, "an extension reads as zeros");
        d.set_len(2 * BLOCK);
        let (b, f) = (IoBuf::new(4096), file());
        d.submit(FileOp::Read { file: &f, buf: b, len: 2 * BLOCK, offset: BLOCK as u64 }, 0).unwrap();
        let (_, r, _) = d.complete(0);
        assert_eq!(r.unwrap(), BLOCK, "a read past the end is short");
    }
}
