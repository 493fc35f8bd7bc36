//! The `qpath-passthru` engine (fio's `io_uring_cmd` on remote targets): raw NVMe
//! commands on a user-owned queue pair ([`host::passthru::QueuePair`]), no block core.
//!
//! The engine builds each SQE itself (Read, Write, Flush with the unit's LBA range),
//! the queue pair picks the command id, and completions are polled. The controller is
//! shared like the `qpath` engine's and reserves one user queue per passthru job
//! thread ([`super::remote`]). The queue pair's depth is the queue size: deeper jobs
//! are lowered to it by the runner (a user queue has no software queue behind it).
//!
//! A queue pair never sleeps in the kernel, so waiting spins; without `hipri` a waiter
//! that made no progress for [`super::qpath::SPIN_BEFORE_BLOCK`] yields its core
//! between polls so oversubscribed runs still move.

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::controller::Controller;
use host::passthru::{PtCompletion, QueuePair};
use host::queue::DataDir;
use nvme::opcode::io as opc;
use nvme::{Cid, Nsid, SglDescriptor, Sqe};
use uring::Wait;

use super::qpath::{Spinner, io_result};
use super::remote::Controllers;
use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued, Ready, uring_buf};
use crate::error::{Error, ErrorKind, Result};
use crate::filename::TargetKind;
use crate::io_u::{Ddir, IoError, IoResult, IoU};

/// Factory for `ioengine=qpath-passthru` / `io_uring_cmd` on remote targets.
#[derive(Debug)]
pub struct PassthruFactory {
    ctrls: Arc<Controllers>,
}

impl PassthruFactory {
    /// A factory whose engines get their controllers from `ctrls`.
    pub fn new(ctrls: Arc<Controllers>) -> PassthruFactory {
        PassthruFactory { ctrls }
    }
}

impl EngineFactory for PassthruFactory {
    fn name(&self) -> &str {
        "qpath-passthru"
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        // The queue pair is made here (on the job thread) because its depth is the
        // engine's max_depth, which the runner asks for before open.
        let TargetKind::Remote(remote) = &ctx.target.kind else {
            return Err(Error::new(
                ErrorKind::Engine,
                format!("qpath-passthru: needs a remote filename (nvme+tcp://...), not '{}'", ctx.target.raw),
            ));
        };
        if remote.path_count() > 1 {
            // A user queue pair is one queue of one controller (as io_uring_cmd is one
            // NVMe char device): no head to choose paths.
            return Err(Error::new(
                ErrorKind::Engine,
                format!("qpath-passthru: one path only; '{}' names {}", ctx.target.raw, remote.path_count()),
            ));
        }
        let ctrl = self.ctrls.get(remote, Some(ctx.job))?;
        let qp = QueuePair::new(&ctrl).map_err(|e| {
            Error::new(ErrorKind::Engine, format!("qpath-passthru: user queue of {}: {e}", ctrl.opts.subnqn))
        })?;
        Ok(Box::new(PassthruEngine {
            ctrl,
            qp,
            nsid: Nsid(remote.nsid),
            block_shift: 9,
            done: Vec::new(),
            ready: Ready::default(),
            spinner: Spinner::new(super::hipri(ctx.job)),
            writefua: super::writefua(ctx.job),
        }))
    }
}

struct PassthruEngine {
    ctrl: Arc<Controller>,
    qp: QueuePair,
    nsid: Nsid,
    block_shift: u8,
    done: Vec<PtCompletion>,
    ready: Ready,
    spinner: Spinner,
    /// Writes carry FUA (`writefua=1`).
    writefua: bool,
}

impl PassthruEngine {
    fn poll(&mut self, units: &mut [IoU]) -> Result<usize> {
        self.qp
            .poll(&mut self.done)
            .map_err(|e| Error::new(ErrorKind::Engine, format!("qpath-passthru: poll: {e}")))?;
        let n = self.done.len();
        for c in self.done.drain(..) {
            let idx = usize::try_from(c.user_data).unwrap_or(usize::MAX);
            let Some(unit) = units.get_mut(idx) else {
                panic!("passthru completion for unit {idx}, which the job does not have");
            };
            if let Some(b) = c.buf {
                uring_buf::put(unit, b);
            }
            unit.result = io_result(c.cqe.status, unit.len);
            self.ready.push(unit.index);
        }
        Ok(n)
    }

    fn sqe(&self, unit: &IoU) -> std::result::Result<(Sqe, DataDir), IoError> {
        let mask = (1u64 << self.block_shift) - 1;
        if unit.ddir == Ddir::Sync {
            return Ok((Sqe::flush(Cid(0), self.nsid), DataDir::None));
        }
        if unit.offset & mask != 0 || u64::from(unit.len) & mask != 0 || unit.len == 0 {
            return Err(IoError::Os(libc::EINVAL));
        }
        let slba = unit.offset >> self.block_shift;
        let nlb = unit.len >> self.block_shift;
        let sgl = SglDescriptor::transport(unit.len);
        Ok(match unit.ddir {
            Ddir::Read => (Sqe::rw(opc::READ, Cid(0), self.nsid, slba, nlb, sgl), DataDir::FromController),
            _ => {
                let mut sqe = Sqe::rw(opc::WRITE, Cid(0), self.nsid, slba, nlb, sgl);
                sqe.set_fua(self.writefua);
                (sqe, DataDir::ToController)
            }
        })
    }
}

impl Engine for PassthruEngine {
    fn name(&self) -> &str {
        "qpath-passthru"
    }

    fn capabilities(&self) -> Capabilities {
        let depth = u32::try_from(self.qp.depth()).unwrap_or(u32::MAX).max(1);
        Capabilities { sync: false, buf_align: uring::IO_ALIGN, polled: true, max_depth: depth, flush: true }
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let ns = self.ctrl.namespace(self.nsid).ok_or_else(|| {
            Error::new(
                ErrorKind::Engine,
                format!("qpath-passthru: {} has no namespace {}", self.ctrl.opts.subnqn, self.nsid.0),
            )
        })?;
        let _ = ctx;
        self.block_shift = ns.block_shift;
        Ok(FileInfo { size: ns.size_bytes(), block_size: ns.block_size() })
    }

    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        uring_buf::install(units);
        Ok(())
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        let (sqe, dir) = match self.sqe(unit) {
            Ok(x) => x,
            Err(e) => {
                unit.result = IoResult::Error(e);
                return Queued::Completed;
            }
        };
        let buf = if dir == DataDir::None { None } else { uring_buf::take(unit) };
        let len = if dir == DataDir::None { 0 } else { unit.len };
        match self.qp.submit(sqe, buf, len, dir, u64::from(unit.index)) {
            Ok(()) => Queued::Queued,
            Err((e, buf)) => {
                if let Some(b) = buf {
                    uring_buf::put(unit, b);
                }
                if e.kind == host::ErrorKind::Busy {
                    return Queued::Busy;
                }
                tracing::debug!("qpath-passthru: submit refused: {e}");
                // A queue pair whose connection closed refuses new commands: that is the
                // same lost path its in-flight commands completed with, and `explain`
                // names the target for it. Any other refusal is the engine's own error.
                unit.result = if self.qp.is_live() {
                    IoResult::Error(IoError::Os(libc::EIO))
                } else {
                    let s = nvme::Status::HOST_PATH_ERROR;
                    IoResult::Error(IoError::Nvme { sct: s.sct as u8, sc: s.sc })
                };
                Queued::Completed
            }
        }
    }

    fn commit(&mut self, _units: &mut [IoU]) -> Result<()> {
        self.qp.flush();
        Ok(())
    }

    fn getevents(&mut self, units: &mut [IoU], min: usize, max: usize, timeout: Option<Duration>) -> Result<usize> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if self.poll(units)? > 0 {
            self.spinner.progress(start);
        }
        while self.ready.len() < min {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            if self.spinner.wait(now, deadline) != Wait::Poll {
                // No kernel wait on a queue pair: give the core away for a moment.
                std::thread::yield_now();
            }
            if self.poll(units)? > 0 {
                self.spinner.progress(Instant::now());
            }
        }
        Ok(self.ready.hand_out(min, max))
    }

    fn event(&mut self, index: usize) -> u32 {
        let _ = index;
        self.ready.take()
    }

    fn explain(&self, error: IoError) -> Option<String> {
        super::qpath::explain_path_error(error, std::slice::from_ref(&self.ctrl))
    }
}
