//! The `io_uring` engine for local files and block devices (fio's `io_uring`; the
//! registry also runs `ioengine=libaio` and `posixaio` on it).
//!
//! Each job thread owns one [`uring::Ring`]. A unit's buffer is a [`uring::IoBuf`]
//! ([`super::uring_buf`]) that moves into the ring's `read_at`/`write_at` and comes back
//! in the completion; flushes are `fsync`. `commit` is one `io_uring_enter` that
//! submits what was queued. `getevents` sleeps in the kernel for completions, or spins
//! on non-blocking turns when the job sets `hipri` (fio's polled completions).
//! `direct=1` opens the file with `O_DIRECT`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use uring::{Completion, FsyncMode, Payload, Ring, RingConfig, Wait};

use super::psync::open_local;
use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued, Ready, uring_buf};
use crate::error::{Error, ErrorKind, Result};
use crate::io_u::{Ddir, IoError, IoResult, IoU};

/// Largest submission queue the engine asks for; deeper jobs flush it early.
const RING_ENTRIES_MAX: u32 = 4096;
/// Longest sleep of one kernel wait before the engine re-checks the caller's deadline.
const BLOCK_SLICE: Duration = Duration::from_millis(100);

/// Factory for `ioengine=io_uring` on local targets.
#[derive(Debug)]
pub struct IoUringFactory;

impl EngineFactory for IoUringFactory {
    fn name(&self) -> &str {
        "io_uring"
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        let entries = ctx.iodepth.clamp(1, RING_ENTRIES_MAX).next_power_of_two();
        let ring = Ring::new(RingConfig { entries, ..RingConfig::default() })
            .map_err(|e| Error::new(ErrorKind::Engine, format!("io_uring: {e}")))?;
        Ok(Box::new(UringEngine {
            ring,
            file: None,
            ready: Ready::default(),
            done: Vec::new(),
            hipri: super::hipri(ctx.job),
        }))
    }
}

/// A unit in flight has its buffer in the ring; a completion puts it back into the
/// unit its token (the unit index) names, and the index waits in `ready` for `event`.
struct UringEngine {
    ring: Ring,
    file: Option<File>,
    /// Indexed by unit index.
    ready: Ready,
    /// Scratch for one turn's completions.
    done: Vec<Completion>,
    hipri: bool,
}

fn submit_error(e: &uring::Error) -> IoError {
    match e.os_error().and_then(std::io::Error::raw_os_error) {
        Some(errno) => IoError::Os(errno),
        None => IoError::Failed("io_uring submission failed"),
    }
}

impl UringEngine {
    fn turn(&mut self, units: &mut [IoU], wait: Wait) -> Result<()> {
        let mut done = std::mem::take(&mut self.done);
        let r = self.ring.turn(wait, |_, c| done.push(c));
        for c in done.drain(..) {
            self.complete(units, c);
        }
        self.done = done;
        r.map(|_| ()).map_err(|e| Error::new(ErrorKind::Engine, format!("io_uring: {e}")))
    }

    fn complete(&mut self, units: &mut [IoU], c: Completion) {
        let idx = usize::try_from(c.token).unwrap_or(usize::MAX);
        let Some(unit) = units.get_mut(idx) else {
            panic!("io_uring completion for unit {idx}, which the job does not have");
        };
        let result = c.result;
        if let Payload::Buf(b) = c.payload {
            uring_buf::put(unit, b);
        }
        unit.result = match u32::try_from(result) {
            Ok(bytes) => IoResult::Done { bytes },
            Err(_) => IoResult::Error(IoError::Os(-result)),
        };
        self.ready.push(unit.index);
    }
}

impl Engine for UringEngine {
    fn name(&self) -> &str {
        "io_uring"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { sync: false, buf_align: uring::IO_ALIGN, polled: self.hipri, max_depth: 0, flush: true }
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let (file, info) = open_local("io_uring", ctx)?;
        self.file = Some(file);
        Ok(info)
    }

    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        uring_buf::install(units);
        Ok(())
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        let Some(fd) = self.file.as_ref().map(AsRawFd::as_raw_fd) else {
            unit.result = IoResult::Error(IoError::Failed("engine not open"));
            return Queued::Completed;
        };
        let idx = unit.index as usize;
        let token = u64::from(unit.index);
        let submitted = match unit.ddir {
            Ddir::Sync => self.ring.fsync(fd, FsyncMode::Full, token),
            Ddir::Read | Ddir::Write => {
                let Some(buf) = uring_buf::take(unit) else {
                    panic!("unit {idx} was queued without its buffer (prepare() not called?)");
                };
                let len = buf.len();
                let r = if unit.ddir == Ddir::Read {
                    self.ring.read_at(fd, buf, len, unit.offset, token)
                } else {
                    self.ring.write_at(fd, buf, 0..len, unit.offset, token)
                };
                r.map_err(|(e, buf)| {
                    uring_buf::put(unit, buf);
                    e
                })
            }
        };
        match submitted {
            Ok(()) => Queued::Queued,
            Err(e) if e.kind() == uring::ErrorKind::Limit => Queued::Busy,
            Err(e) => {
                unit.result = IoResult::Error(submit_error(&e));
                Queued::Completed
            }
        }
    }

    fn commit(&mut self, units: &mut [IoU]) -> Result<()> {
        self.turn(units, Wait::Poll)
    }

    fn getevents(&mut self, units: &mut [IoU], min: usize, max: usize, timeout: Option<Duration>) -> Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.turn(units, Wait::Poll)?;
        while self.ready.len() < min {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let wait = if self.hipri {
                Wait::Poll
            } else {
                let left = deadline.map_or(BLOCK_SLICE, |d| d.saturating_duration_since(now).min(BLOCK_SLICE));
                Wait::Block { timeout: Some(left) }
            };
            self.turn(units, wait)?;
        }
        Ok(self.ready.hand_out(min, max))
    }

    fn event(&mut self, index: usize) -> u32 {
        let _ = index;
        self.ready.take()
    }

    fn close(&mut self) -> Result<()> {
        self.file = None;
        Ok(())
    }
}
