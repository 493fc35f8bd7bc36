//! The `qpath` engine: our NVMe/TCP host through its block core.
//!
//! One [`host::context::Context`] per job thread, created on that thread; the
//! controller is shared by the run's job threads ([`super::remote::Controllers`]) and
//! each context attaches an I/O queue of its own. A unit maps to one
//! `Context::submit(dev, Read | Write | Flush, offset, len, buf, token = unit index)`:
//! the unit's [`uring::IoBuf`] moves into the host and comes back in the completion,
//! so data is never copied by the engine.
//!
//! Waiting ([`Spinner`]): `getevents` polls the context, spinning while fewer than `min`
//! completions are ready. After [`SPIN_BEFORE_BLOCK`] without progress it sleeps in the
//! kernel (`Wait::Block`) so that oversubscribed runs (more job threads than cores) leave
//! the core to their neighbours; `hipri` (fio's polled completions) spins always.
//! `direct` is implied: there is no page cache on this path.
//!
//! Multipath ([`super::mpath`]): a filename naming several transport addresses
//! (`nvme+tcp://A,B/nqn/1`) or a job setting `mpath_policy` opens a multipath head
//! (`Context::open_head`) over one controller per address, shared with the run's other
//! job threads on the same paths and policy; [`Engine::multipath`] reports per-path counts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use nvme::{Nsid, Status};
use uring::Wait;

use super::mpath::{self, Heads, MultipathStats, PathStat, PolicyChoice};
use super::remote::{ControllerKey, Controllers};
use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued, Ready, uring_buf};
use crate::error::{Error, ErrorKind, Result};
use crate::filename::TargetKind;
use crate::io_u::{Ddir, IoError, IoResult, IoU};

/// Spin this long without a completion before sleeping in the kernel (unless `hipri`).
/// A loopback round trip here is ~15 µs, so a spinning waiter normally sees its
/// completion long before this; a thread that waits longer is probably sharing its core.
pub const SPIN_BEFORE_BLOCK: Duration = Duration::from_micros(50);
/// Longest kernel sleep before the engine re-checks the caller's deadline.
const BLOCK_SLICE: Duration = Duration::from_millis(10);

/// Factory for `ioengine=qpath` (and what the registry maps fio's engines to on remote
/// targets).
#[derive(Debug)]
pub struct QpathFactory {
    ctrls: Arc<Controllers>,
    heads: Arc<Heads>,
}

impl QpathFactory {
    /// A factory whose engines get their controllers from `ctrls`.
    pub fn new(ctrls: Arc<Controllers>) -> QpathFactory {
        QpathFactory { ctrls, heads: Arc::new(Heads::default()) }
    }
}

impl EngineFactory for QpathFactory {
    fn name(&self) -> &str {
        "qpath"
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        // The runner never has more than iodepth units out; the context queues what its
        // I/O queue cannot take (seed 003's iodepth=10000) in software.
        let max_requests = usize::try_from(ctx.iodepth.max(1)).unwrap_or(1);
        let stats = Some(Arc::clone(self.ctrls.stats()));
        let context = Context::new(ContextOptions { max_requests, stats, ..ContextOptions::default() })
            .map_err(|e| Error::new(ErrorKind::Engine, format!("qpath: context: {e}")))?;
        Ok(Box::new(QpathEngine {
            ctrls: Arc::clone(&self.ctrls),
            heads: Arc::clone(&self.heads),
            mpath_policy: None,
            ctx: context,
            dev: None,
            ready: Ready::with_capacity(max_requests),
            spinner: Spinner::new(super::hipri(ctx.job)),
            write_op: if super::writefua(ctx.job) { Op::WriteFua } else { Op::Write },
            used: Vec::new(),
        }))
    }
}

/// When a waiting loop may sleep: after `SPIN_BEFORE_BLOCK` without progress, never
/// with `always` (hipri).
#[derive(Debug)]
pub struct Spinner {
    always: bool,
    last_progress: Instant,
    /// Other spinning threads pinned to this thread's CPU.
    neighbours: uring::placement::Neighbours,
}

impl Spinner {
    /// A spinner for the calling thread; `always` = never sleep.
    pub fn new(always: bool) -> Spinner {
        Spinner::with_neighbours(always, uring::placement::Neighbours::current())
    }

    /// A spinner whose CPU's other spinning threads are `neighbours`.
    pub fn with_neighbours(always: bool, neighbours: uring::placement::Neighbours) -> Spinner {
        Spinner { always, last_progress: Instant::now(), neighbours }
    }

    /// After a poll that found nothing: whether to give the CPU to a neighbour now
    /// (`sched_yield`). Two job threads pinned to one CPU that both spin would otherwise
    /// take turns only when the scheduler preempts one, a tick (4 ms at HZ=250) later,
    /// and every completion of the waiting one waits that long.
    pub fn should_yield(&mut self) -> bool {
        self.neighbours.shared()
    }

    /// Something completed.
    pub fn progress(&mut self, now: Instant) {
        self.last_progress = now;
    }

    /// Something completed just now. Reads the clock only for a spinner that may block:
    /// one that always spins has no use for the time, and on the per-I/O path every
    /// clock read counts (one is ~40 ns on the VMs we measure on).
    pub fn progressed(&mut self) {
        if !self.always {
            self.last_progress = Instant::now();
        }
    }

    /// How the next poll should wait, given the caller's deadline.
    pub fn wait(&self, now: Instant, deadline: Option<Instant>) -> Wait {
        if self.always || now.saturating_duration_since(self.last_progress) < SPIN_BEFORE_BLOCK {
            return Wait::Poll;
        }
        let left = deadline.map_or(BLOCK_SLICE, |d| d.saturating_duration_since(now).min(BLOCK_SLICE));
        Wait::Block { timeout: Some(left) }
    }
}

/// The result of an NVMe completion for the unit that carried `len` bytes.
pub fn io_result(status: Status, len: u32) -> IoResult {
    if status.is_success() {
        IoResult::Done { bytes: len }
    } else {
        IoResult::Error(IoError::Nvme { sct: status.sct as u8, sc: status.sc })
    }
}

struct QpathEngine {
    ctrls: Arc<Controllers>,
    heads: Arc<Heads>,
    /// The policy's name when `dev` is a multipath head.
    mpath_policy: Option<String>,
    /// What a write unit becomes: `Op::WriteFua` with `writefua=1`.
    write_op: Op,
    ctx: Context,
    dev: Option<DeviceId>,
    /// Indices of completed units, until `event` takes them.
    ready: Ready,
    spinner: Spinner,
    /// The controllers `dev` goes through, to say which was lost when I/O fails.
    used: Vec<Arc<host::controller::Controller>>,
}

/// Why I/O to `ctrl` failed with a host path error: its address, how long it has been
/// down and the timeout in force, and its last error. A controller still live lost the
/// connection of the queue the I/O was on (a user queue pair fails at once).
fn lost(ctrl: &host::controller::Controller) -> String {
    use host::controller::CtrlState;
    let state = ctrl.state();
    let why = if state == CtrlState::Live {
        "the connection of the I/O's queue was lost".to_string()
    } else if state == CtrlState::Dead {
        "deleted (ctrl_loss_tmo expired, or disconnected)".to_string()
    } else {
        let down = ctrl.down_for().map_or_else(|| "a while".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
        let tmo = ctrl.opts.fast_io_fail_tmo.map_or_else(|| "off".to_string(), |t| format!("{} s", t.as_secs()));
        format!("no connection for {down} (fast_io_fail_tmo={tmo})")
    };
    let last = ctrl.info().last_error.map_or_else(String::new, |e| format!("; last error: {e}"));
    format!("lost the target {} ({}): {why}{last}", ctrl.opts.traddr, ctrl.opts.subnqn)
}

/// [`Engine::explain`] for the NVMe/TCP engines: a host path error (NVMe Base 2.x Figure
/// 103, SCT 3h SC 70h) is what the host completes I/O with when it gives up on a lost
/// controller; say which of `ctrls` is down.
pub(crate) fn explain_path_error(error: IoError, ctrls: &[Arc<host::controller::Controller>]) -> Option<String> {
    let path_error = Status::HOST_PATH_ERROR;
    if error != (IoError::Nvme { sct: path_error.sct as u8, sc: path_error.sc }) {
        return None;
    }
    // On a multipath head, the paths that are down (all of them, for I/O to fail).
    let down: Vec<String> =
        ctrls.iter().filter(|c| c.state() != host::controller::CtrlState::Live).map(|c| lost(c)).collect();
    match (down.is_empty(), ctrls) {
        (false, _) => Some(down.join("; ")),
        (true, [one]) => Some(lost(one)),
        (true, _) => None,
    }
}

impl QpathEngine {
    fn poll(&mut self, units: &mut [IoU], wait: Wait) -> Result<usize> {
        let found = self.ctx.poll(wait).map_err(|e| Error::new(ErrorKind::Engine, format!("qpath: poll: {e}")))?;
        // The host logs stalled I/O itself; drop the reports so they do not pile up.
        drop(self.ctx.take_stall_reports());
        if found == 0 {
            // Most polls of a waiting loop find nothing: no completion list to open and close.
            return Ok(0);
        }
        let before = self.ready.len();
        for c in self.ctx.completions() {
            let idx = usize::try_from(c.token).unwrap_or(usize::MAX);
            let Some(unit) = units.get_mut(idx) else {
                panic!("qpath completion for unit {idx}, which the job does not have");
            };
            if let Some(b) = c.buf {
                uring_buf::put(unit, b);
            }
            unit.result = io_result(c.status, unit.len);
            self.ready.push(unit.index);
        }
        Ok(self.ready.len() - before)
    }
}

impl Engine for QpathEngine {
    fn name(&self) -> &str {
        "qpath"
    }

    fn capabilities(&self) -> Capabilities {
        // Polled: sends (R2T data included) and receives only move when the thread polls.
        Capabilities { sync: false, buf_align: uring::IO_ALIGN, polled: true, max_depth: 0, flush: true }
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let TargetKind::Remote(remote) = &ctx.target.kind else {
            return Err(Error::new(
                ErrorKind::Engine,
                format!("qpath: needs a remote filename (nvme+tcp://...), not '{}'", ctx.target.raw),
            ));
        };
        let choice = mpath::policy_of(ctx.job)?;
        let dev = if remote.path_count() > 1 || choice.is_some() {
            let choice = choice.unwrap_or(PolicyChoice::DEFAULT);
            let paths = remote.paths();
            let keys: Vec<ControllerKey> = paths.iter().map(|p| ControllerKey::of(p, Some(ctx.job))).collect();
            let ctrls = paths.iter().map(|p| self.ctrls.get(p, Some(ctx.job))).collect::<Result<Vec<_>>>()?;
            self.used.clone_from(&ctrls);
            let head = self.heads.get(&keys, &ctrls, remote.nsid, &choice)?;
            let dev = self.ctx.open_head(&head).map_err(|e| {
                Error::new(ErrorKind::Engine, format!("qpath: open multipath namespace {}: {e}", remote.nsid))
            })?;
            self.mpath_policy = Some(choice.name());
            dev
        } else {
            let ctrl = self.ctrls.get(remote, Some(ctx.job))?;
            self.used = vec![Arc::clone(&ctrl)];
            self.ctx.open(&ctrl, Nsid(remote.nsid)).map_err(|e| {
                Error::new(
                    ErrorKind::Engine,
                    format!("qpath: open namespace {} of {}: {e}", remote.nsid, ctrl.opts.subnqn),
                )
            })?
        };
        self.dev = Some(dev);
        Ok(FileInfo { size: self.ctx.capacity(dev), block_size: self.ctx.block_size(dev) })
    }

    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        uring_buf::install(units);
        Ok(())
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        let Some(dev) = self.dev else {
            unit.result = IoResult::Error(IoError::Failed("engine not open"));
            return Queued::Completed;
        };
        let (op, buf) = match unit.ddir {
            Ddir::Read => (Op::Read, uring_buf::take(unit)),
            Ddir::Write => (self.write_op, uring_buf::take(unit)),
            Ddir::Sync => (Op::Flush, None),
        };
        // The host stamps the request with the time the job loop prepared it (read just
        // before this call) rather than reading the clock again: one read fewer per I/O.
        match self.ctx.submit_at(dev, op, unit.offset, unit.len, buf, u64::from(unit.index), unit.prepared) {
            Ok(()) => Queued::Queued,
            Err((e, buf)) => {
                if let Some(b) = buf {
                    uring_buf::put(unit, b);
                }
                if e.kind == host::ErrorKind::Busy {
                    return Queued::Busy;
                }
                tracing::debug!(offset = unit.offset, len = unit.len, "qpath: submit refused: {e}");
                let errno = if e.kind == host::ErrorKind::Invalid { libc::EINVAL } else { libc::EIO };
                unit.result = IoResult::Error(IoError::Os(errno));
                Queued::Completed
            }
        }
    }

    fn commit(&mut self, units: &mut [IoU]) -> Result<()> {
        // Send now only if there is nothing to hand back: while completions are still
        // waiting to be reaped, the runner comes straight back to getevents and the next
        // poll sends every command queued meanwhile in one batch (as SPDK's fio plugin
        // flushes its socket when it polls). Sending each command on its own costs a
        // TCP segment and a system call per I/O on both sides: at QD32 that capped the
        // stack at ~80K IOPS here, one round trip's worth of work per I/O.
        if self.ready.is_empty() && self.poll(units, Wait::Poll)? > 0 {
            self.spinner.progressed();
        }
        Ok(())
    }

    fn getevents(&mut self, units: &mut [IoU], min: usize, max: usize, timeout: Option<Duration>) -> Result<usize> {
        // The runner takes one completion per call (fio's iodepth_batch_complete_max=1): while
        // completions wait in `ready` it gets one without a clock read. The waiting loop
        // reads no clock of its own: every turn of it follows a poll (the one here when it
        // is entered, `ready` < `min` <= `min.max(1)`), whose turn read the clock.
        if self.ready.len() < min.max(1) && self.poll(units, Wait::Poll)? > 0 {
            self.spinner.progressed();
        }
        let mut deadline = None;
        while self.ready.len() < min {
            let now = self.ctx.last_clock();
            let deadline = *deadline.get_or_insert_with(|| timeout.map(|t| now + t));
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let wait = self.spinner.wait(now, deadline);
            if self.poll(units, wait)? > 0 {
                self.spinner.progressed();
            } else if wait == Wait::Poll && self.spinner.should_yield() {
                std::thread::yield_now();
            }
        }
        Ok(self.ready.hand_out(min, max))
    }

    fn event(&mut self, index: usize) -> u32 {
        let _ = index;
        self.ready.take()
    }

    fn multipath(&self) -> Option<MultipathStats> {
        let policy = self.mpath_policy.clone()?;
        let paths = self
            .ctx
            .path_report(self.dev?)
            .into_iter()
            .map(|p| PathStat { traddr: p.traddr.to_string(), ios: p.ios, bytes: p.bytes })
            .collect();
        Some(MultipathStats { policy, paths })
    }

    fn explain(&self, error: IoError) -> Option<String> {
        explain_path_error(error, &self.used)
    }

    fn close(&mut self) -> Result<()> {
        self.dev = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_blocks_unless_hipri() {
        let t0 = Instant::now();
        let mut s = Spinner::new(false);
        s.progress(t0);
        assert_eq!(s.wait(t0 + Duration::from_micros(10), None), Wait::Poll);
        assert!(matches!(s.wait(t0 + Duration::from_micros(60), None), Wait::Block { .. }));
        let deadline = t0 + Duration::from_micros(70);
        assert_eq!(
            s.wait(t0 + Duration::from_micros(60), Some(deadline)),
            Wait::Block { timeout: Some(Duration::from_micros(10)) }
        );
        let mut h = Spinner::new(true);
        h.progress(t0);
        assert_eq!(h.wait(t0 + Duration::from_secs(1), None), Wait::Poll);
    }

    #[test]
    fn progressed_restarts_the_spin_of_a_spinner_that_may_block() {
        let long_ago = Instant::now().checked_sub(Duration::from_secs(1)).expect("the clock runs for a second");
        let mut s = Spinner::new(false);
        s.progress(long_ago);
        let before = Instant::now();
        assert!(matches!(s.wait(before, None), Wait::Block { .. }), "a second without progress");
        s.progressed();
        assert_eq!(s.wait(before, None), Wait::Poll, "progress now: spin again");
        // One that always spins keeps spinning without the time.
        let mut h = Spinner::new(true);
        h.progress(long_ago);
        h.progressed();
        assert_eq!(h.wait(Instant::now(), None), Wait::Poll);
    }

    #[test]
    fn a_spinner_yields_only_to_another_spinner_pinned_to_its_cpu() {
        // A CPU number no test pins to: claims are only bookkeeping.
        let cpu = 1001;
        let mut s = Spinner::with_neighbours(false, uring::placement::Neighbours::new(Some(cpu)));
        let me = uring::placement::claim(cpu, uring::placement::Spinner::Job);
        assert!(!s.should_yield(), "alone on its CPU it keeps spinning");
        let other = uring::placement::claim(cpu, uring::placement::Spinner::Job);
        assert!(s.should_yield(), "another job thread spins on its CPU");
        drop(other);
        assert!(!s.should_yield(), "alone again");
        drop(me);
    }

    #[test]
    fn nvme_errors_keep_their_codes() {
        assert_eq!(io_result(Status::SUCCESS, 4096), IoResult::Done { bytes: 4096 });
        // Media error: Unrecovered Read Error (SCT 2h, SC 81h).
        let st = Status { sct: nvme::Sct::Media, sc: 0x81, crd: 0, dnr: true };
        assert_eq!(io_result(st, 4096), IoResult::Error(IoError::Nvme { sct: 2, sc: 0x81 }));
    }
}
