//! Deallocation and zeroes on a file or block device: Dataset Management's Deallocate
//! (one punch per range) and Write Zeroes (one punch or ZERO_RANGE, or writes of a zeroed
//! buffer where the file system has neither) as a bounded stream of asynchronous file
//! operations (NVM Command Set 1.0 §3.2.3 and §3.2.8). Which mode a backend uses is
//! decided by [`crate::backend::Zeroing`]; the null and RAM backends complete inline.
//!
//! [`Batch`] is sans-I/O and lives in the request: the connection asks it for the next
//! operation, submits it to the reactor's io_uring (or a test executor), and reports each
//! completion. At most [`OPS_IN_FLIGHT_MAX`] operations of one command are in flight, so a
//! 256-range Deallocate takes a bounded share of the ring: a queue of N such commands
//! needs at most N x 8 ring slots, and the ring flushes a full submission queue to the
//! kernel before queueing more. A failed submission with operations of the command still
//! in flight is tried again after the next completion.
//!
//! ```text
//!   exec_io ─► Batch::deallocate / Batch::zeroes
//!   loop: next_step ─► submit ─► on_done ─► (fallback on EOPNOTSUPP) ─► next_step ...
//!   in flight 0 and nothing left (or failed) ─► FUA sync ─► respond
//! ```
//!
//! The first error decides the command's status; operations already in flight finish
//! before it completes, and none is started after it.

use std::io;

use crate::backend::{FileBackend, falloc};
use crate::io_cmd;
use crate::namespace::Namespace;

/// Most file operations of one command in flight at once.
pub const OPS_IN_FLIGHT_MAX: u16 = 8;

/// How Write Zeroes zeroes its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: deallocates; only where it reads back as zeros.
    Punch,
    /// `fallocate(ZERO_RANGE | KEEP_SIZE)`: zeros, the blocks stay allocated.
    ZeroRange,
    /// Writes of a zeroed buffer, one chunk at a time.
    Write,
}

impl Method {
    /// Write Zeroes' method on `f`: punch when the host allows deallocation (DEAC) and a
    /// punch reads back as zeros, else ZERO_RANGE unless refused before, else writes.
    pub fn for_write_zeroes(f: &FileBackend, deallocate: bool) -> Method {
        if deallocate && f.zeroing.punch() {
            Method::Punch
        } else if f.zeroing.zero_range() {
            Method::ZeroRange
        } else {
            Method::Write
        }
    }

    fn mode(self) -> i32 {
        match self {
            Method::Punch => falloc::PUNCH_HOLE | falloc::KEEP_SIZE,
            // KEEP_SIZE: a range ending at the end of the file never grows it.
            Method::ZeroRange => falloc::ZERO_RANGE | falloc::KEEP_SIZE,
            Method::Write => 0,
        }
    }
}

/// One file operation of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `fallocate(mode, offset, len)`.
    Fallocate {
        /// Mode bits ([`falloc`]).
        mode: i32,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Write `len` bytes of a zeroed buffer at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes (at most the chunk size).
        len: usize,
    },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Work {
    /// No batch: the request runs one file operation at a time.
    #[default]
    Idle,
    /// Punch ranges `next..nr` of the Dataset Management data.
    Ranges { nr: u16, next: u16 },
    /// Zero bytes `start..end`; `next` is where the next operation starts.
    Zeroes { method: Method, start: u64, next: u64, end: u64 },
}

/// The file operations of one Deallocate or Write Zeroes command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    work: Work,
    in_flight: u16,
    failed: bool,
}

impl Batch {
    /// Punch every non-empty range of `nr` Dataset Management ranges (checked already by
    /// [`io_cmd::dsm_check`]).
    pub fn deallocate(nr: u32) -> Batch {
        let nr = u16::try_from(nr.min(io_cmd::DSM_RANGES_MAX)).unwrap_or(0);
        Batch { work: Work::Ranges { nr, next: 0 }, ..Batch::default() }
    }

    /// Zero `len` bytes at `offset` with `method`.
    pub fn zeroes(method: Method, offset: u64, len: u64) -> Batch {
        let end = offset.saturating_add(len);
        Batch { work: Work::Zeroes { method, start: offset, next: offset, end }, ..Batch::default() }
    }

    /// Whether a batch runs in this request.
    pub fn is_active(&self) -> bool {
        self.work != Work::Idle
    }

    /// Operations submitted and not finished.
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// Whether an operation failed (the command fails; nothing more is started).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Whether the command is over: nothing in flight, and nothing left or a failure.
    pub fn is_done(&self) -> bool {
        self.in_flight == 0 && (self.failed || !self.has_work())
    }

    /// Starts no more operations (the connection closes, the namespace went away).
    pub fn stop(&mut self) {
        self.failed = true;
    }

    fn has_work(&self) -> bool {
        match self.work {
            Work::Idle => false,
            Work::Ranges { nr, next } => next < nr,
            Work::Zeroes { next, end, .. } => next < end,
        }
    }

    /// The next operation to submit, counted as in flight, or `None` when the window is
    /// full, nothing is left, or the batch failed. `data` is the Dataset Management data
    /// of namespace `ns`; `chunk` bounds one write of zeros.
    pub fn next_step(&mut self, data: &[u8], ns: &Namespace, chunk: usize) -> Option<Step> {
        if self.failed || self.in_flight >= OPS_IN_FLIGHT_MAX {
            return None;
        }
        let step = match &mut self.work {
            Work::Idle => None,
            Work::Ranges { nr, next } => loop {
                if *next >= *nr {
                    break None;
                }
                let (offset, len) = io_cmd::dsm_bytes(data, usize::from(*next), ns)?;
                *next += 1;
                if len > 0 {
                    break Some(Step::Fallocate { mode: Method::Punch.mode(), offset, len });
                }
            },
            Work::Zeroes { next, end, .. } if *next >= *end => None,
            Work::Zeroes { method: Method::Write, next, end, .. } => {
                // One zeroed buffer per command: its writes go one after the other.
                if self.in_flight > 0 {
                    return None;
                }
                let len = usize::try_from(*end - *next).unwrap_or(usize::MAX).min(chunk.max(1));
                let step = Step::Write { offset: *next, len };
                *next += len as u64;
                Some(step)
            }
            Work::Zeroes { method, next, end, .. } => {
                let step = Step::Fallocate { mode: method.mode(), offset: *next, len: *end - *next };
                *next = *end;
                Some(step)
            }
        };
        if step.is_some() {
            self.in_flight += 1;
        }
        step
    }

    /// `step` (from [`next_step`](Self::next_step)) could not be submitted: it is the next
    /// one again.
    pub fn unsubmit(&mut self, step: Step) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match (&mut self.work, step) {
            // Ranges skipped before it had length 0: starting again at it is exact.
            (Work::Ranges { next, .. }, _) => *next = next.saturating_sub(1),
            (Work::Zeroes { next, .. }, Step::Fallocate { offset, .. } | Step::Write { offset, .. }) => {
                *next = offset;
            }
            (Work::Idle, _) => {}
        }
    }

    /// An operation of the batch on `f` finished with `result` (a short write is an error
    /// already). Returns the error that fails the command, if any. `EOPNOTSUPP` is not one
    /// where there is another way: Deallocate is advisory (the remaining ranges are left
    /// as they are), and Write Zeroes falls back from punch to ZERO_RANGE to writes; the
    /// backend stops offering the refused mode.
    pub fn on_done(&mut self, result: &io::Result<usize>, f: &FileBackend) -> Result<(), io::Error> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Err(e) = result else { return Ok(()) };
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            match &mut self.work {
                Work::Ranges { nr, next } => {
                    f.zeroing.refused(Method::Punch.mode(), &f.path);
                    *next = *nr;
                    return Ok(());
                }
                Work::Zeroes { method: method @ (Method::Punch | Method::ZeroRange), start, next, .. } => {
                    // A single fallocate covered the whole range: start it again another way.
                    f.zeroing.refused(method.mode(), &f.path);
                    *method = if *method == Method::Punch && f.zeroing.zero_range() {
                        Method::ZeroRange
                    } else {
                        Method::Write
                    };
                    *next = *start;
                    return Ok(());
                }
                _ => {}
            }
        }
        self.failed = true;
        Err(io::Error::new(e.kind(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, FileBackend};
    use crate::namespace::NamespaceSpec;
    use nvme::Nsid;

    fn ns() -> Namespace {
        let spec = NamespaceSpec {
            nsid: 1,
            backend: Backend::Null,
            size: Some(1 << 30),
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        };
        Namespace::new("nqn.t", Nsid(1), spec).unwrap()
    }

    fn ranges(list: &[(u64, u32)]) -> Vec<u8> {
        list.iter()
            .flat_map(|&(slba, nlb)| {
                let mut r = [0u8; 16];
                r[4..8].copy_from_slice(&nlb.to_le_bytes());
                r[8..16].copy_from_slice(&slba.to_le_bytes());
                r
            })
            .collect()
    }

    fn backend(dir: &std::path::Path) -> FileBackend {
        let path = dir.join("f.img");
        let req = crate::backend::FileRequest {
            path: &path,
            size: Some(1 << 20),
            grow: false,
            access: crate::backend::Access::ReadWrite,
            owner: "namespace 1",
        };
        FileBackend::open(&req).unwrap().0
    }

    fn eopnotsupp() -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    #[test]
    fn deallocate_keeps_at_most_the_window_in_flight_and_skips_empty_ranges() {
        let n = ns();
        let mut list: Vec<(u64, u32)> = (0..256).map(|i| (i * 16, 8)).collect();
        list[3].1 = 0;
        let data = ranges(&list);
        let mut b = Batch::deallocate(256);
        let mut steps = Vec::new();
        while let Some(s) = b.next_step(&data, &n, 4096) {
            steps.push(s);
        }
        assert_eq!(steps.len(), usize::from(OPS_IN_FLIGHT_MAX), "the window bounds the ops in flight");
        let dir = std::env::temp_dir().join(format!("qpath-dealloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = backend(&dir);
        loop {
            if b.in_flight() == 0 {
                break;
            }
            b.on_done(&Ok(0), &f).unwrap();
            while let Some(s) = b.next_step(&data, &n, 4096) {
                steps.push(s);
            }
            assert!(b.in_flight() <= OPS_IN_FLIGHT_MAX);
        }
        assert!(b.is_done() && !b.failed());
        assert_eq!(steps.len(), 255, "one punch per non-empty range");
        let punched: Vec<u64> = steps
            .iter()
            .map(|s| match s {
                Step::Fallocate { mode, offset, len } => {
                    assert_eq!(*mode, falloc::PUNCH_HOLE | falloc::KEEP_SIZE);
                    assert_eq!(*len, 8 * 512);
                    offset / 512
                }
                Step::Write { .. } => panic!("deallocation never writes"),
            })
            .collect();
        assert!(!punched.contains(&48), "the empty range is not executed");
        assert_eq!(punched.last(), Some(&(255 * 16)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn first_error_stops_the_batch_and_unsubmit_retries() {
        let n = ns();
        let data = ranges(&[(0, 1), (8, 1), (16, 1)]);
        let dir = std::env::temp_dir().join(format!("qpath-dealloc-err-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = backend(&dir);
        let mut b = Batch::deallocate(3);
        let s0 = b.next_step(&data, &n, 4096).unwrap();
        let s1 = b.next_step(&data, &n, 4096).unwrap();
        b.unsubmit(s1);
        assert_eq!(b.next_step(&data, &n, 4096), Some(s1), "an unsubmitted step comes again");
        assert!(b.on_done(&Err(io::Error::from_raw_os_error(libc::EIO)), &f).is_err());
        assert_eq!(b.next_step(&data, &n, 4096), None, "nothing starts after a failure");
        assert!(!b.is_done(), "one op still in flight");
        b.on_done(&Ok(0), &f).unwrap();
        assert!(b.is_done() && b.failed());
        let _ = s0;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn write_zeroes_falls_back_from_punch_to_zero_range_to_writes() {
        let n = ns();
        let dir = std::env::temp_dir().join(format!("qpath-dealloc-wz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = backend(&dir);
        let mut b = Batch::zeroes(Method::Punch, 4096, 10_000);
        let s = b.next_step(&[], &n, 4096).unwrap();
        assert_eq!(s, Step::Fallocate { mode: falloc::PUNCH_HOLE | falloc::KEEP_SIZE, offset: 4096, len: 10_000 });
        b.on_done(&eopnotsupp(), &f).unwrap();
        assert!(!f.zeroing.punch(), "a refused punch is not offered again (DLFEAT 00h)");
        let s = b.next_step(&[], &n, 4096).unwrap();
        assert_eq!(s, Step::Fallocate { mode: falloc::ZERO_RANGE | falloc::KEEP_SIZE, offset: 4096, len: 10_000 });
        b.on_done(&eopnotsupp(), &f).unwrap();
        assert!(!f.zeroing.zero_range());
        let mut writes = Vec::new();
        while !b.is_done() {
            let s = b.next_step(&[], &n, 4096).unwrap();
            assert_eq!(b.next_step(&[], &n, 4096), None, "one write of zeros at a time");
            writes.push(s);
            b.on_done(&Ok(0), &f).unwrap();
        }
        assert_eq!(
            writes,
            [
                Step::Write { offset: 4096, len: 4096 },
                Step::Write { offset: 8192, len: 4096 },
                Step::Write { offset: 12288, len: 1808 }
            ]
        );
        assert_eq!(Method::for_write_zeroes(&f, true), Method::Write);
        // A failed write of zeros is an error: there is nothing left to fall back to.
        let mut b = Batch::zeroes(Method::Write, 0, 512);
        b.next_step(&[], &n, 4096).unwrap();
        assert!(b.on_done(&eopnotsupp(), &f).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refused_deallocation_is_advisory() {
        let n = ns();
        let data = ranges(&[(0, 1), (8, 1), (16, 1)]);
        let dir = std::env::temp_dir().join(format!("qpath-dealloc-adv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = backend(&dir);
        let mut b = Batch::deallocate(3);
        b.next_step(&data, &n, 4096).unwrap();
        b.on_done(&eopnotsupp(), &f).unwrap();
        assert_eq!(b.next_step(&data, &n, 4096), None, "the other ranges are left alone");
        assert!(b.is_done() && !b.failed());
        assert_eq!(Backend::File(f).dlfeat(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
