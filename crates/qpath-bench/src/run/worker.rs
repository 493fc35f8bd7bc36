//! One job thread: set up its engine and I/O units, run the workload with fio's
//! queue/commit/reap discipline, then the verify read-back pass.
//!
//! The loop mirrors fio's `do_io`:
//!
//! ```text
//! loop:
//!   fill: while in_flight < iodepth: take a free unit, prepare it, queue it
//!         (commit after every iodepth_batch_submit queued units)
//!   reap: if the queue is full (or draining, or the engine polls):
//!         commit, getevents(min = iodepth_batch_complete_min, max = ..._max), complete each
//! ```
//!
//! Timing follows fio: `start` is taken when a unit is prepared, `issue` right before
//! `queue` for synchronous engines and right after `commit` for asynchronous ones,
//! completion once per reaped batch. slat = issue - start (asynchronous engines only),
//! clat = completion - issue, lat = completion - start. The loop keeps these times as
//! nanoseconds since the job's clock epoch: each clock read is converted once, and each
//! latency is then a plain subtraction.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use super::{JobError, RunOptions, StartGate};
use crate::engine::{Capabilities, Engine, EngineCtx, EngineFactory, Queued};
use crate::error::{Error, ErrorKind, Result};
use crate::io_u::{Ddir, IoResult, IoU};
use crate::job::{JobSpec, VerifyKind};
use crate::stats::{RateSampler, ThreadStat};
use crate::verify::{self, Expect, GenerationMap};
use crate::workload::{Next, Region, Workload};

/// Most buffer memory one job thread may allocate (iodepth x max block size).
pub const POOL_BYTES_MAX: u64 = 4 << 30;
/// How many verify failures a job prints before it only counts them.
const VERIFY_PRINT_MAX: u64 = 10;
/// How long one `getevents` call may block before the loop re-checks its clocks.
const REAP_SLICE: Duration = Duration::from_millis(100);
/// fio's EILSEQ for verify failures.
const EILSEQ: i32 = 84;

/// Job thread states shown in the status line (fio's run_str letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ThreadState {
    /// Not started or setting up.
    SettingUp = b'P',
    /// In `ramp_time`.
    Ramping = b'/',
    /// Doing I/O; the letter is chosen from the workload when shown.
    Running = b'R',
    /// Verify read-back.
    Verifying = b'V',
    /// Finished.
    Done = b'_',
    /// Finished with an error.
    Failed = b'X',
}

/// Counters a job thread publishes for the status line (single writer, relaxed).
#[derive(Debug, Default)]
pub struct Progress {
    state: AtomicU8,
    bytes: [AtomicU64; 2],
    ios: [AtomicU64; 2],
}

impl Progress {
    /// A fresh progress record.
    pub fn new() -> Progress {
        let p = Progress::default();
        p.state.store(ThreadState::SettingUp as u8, Ordering::Relaxed);
        p
    }

    fn set_state(&self, s: ThreadState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Current state.
    pub fn state(&self) -> ThreadState {
        match self.state.load(Ordering::Relaxed) {
            b'/' => ThreadState::Ramping,
            b'R' => ThreadState::Running,
            b'V' => ThreadState::Verifying,
            b'_' => ThreadState::Done,
            b'X' => ThreadState::Failed,
            _ => ThreadState::SettingUp,
        }
    }

    /// Bytes completed per direction (including ramp).
    pub fn bytes(&self) -> [u64; 2] {
        [self.bytes[0].load(Ordering::Relaxed), self.bytes[1].load(Ordering::Relaxed)]
    }

    /// I/Os completed per direction (including ramp).
    pub fn ios(&self) -> [u64; 2] {
        [self.ios[0].load(Ordering::Relaxed), self.ios[1].load(Ordering::Relaxed)]
    }
}

/// What a job thread hands back.
#[derive(Debug)]
pub struct ThreadOutcome {
    /// Measurements.
    pub stat: ThreadStat,
    /// The error that ended the job, if any.
    pub error: Option<JobError>,
    /// Kernel thread id (fio prints it as `pid=`).
    pub tid: u32,
    /// Messages for the user (depth lowered, etc.).
    pub notes: Vec<String>,
    /// A multipath device's policy and per-path counts, after ramp_time.
    pub multipath: Option<crate::engine::mpath::MultipathStats>,
    /// What the job did with its local file's page cache before it started (`None`:
    /// no page cache on its path, e.g. a remote target or a character device).
    pub page_cache: Option<PageCache>,
}

/// What a job did with the page cache of its local file's I/O range before it started
/// (fio's `invalidate`, default 1: `posix_fadvise(POSIX_FADV_DONTNEED)` on the range, for a
/// regular file or a block device, so that buffered reads start from the storage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageCache {
    /// `invalidate=1`: the range was dropped from the page cache.
    Invalidated,
    /// `invalidate=0`: left as it was; reads may be served from memory.
    Kept,
    /// `invalidate=1`, but the kernel refused (the reason); the job ran anyway, as fio's does.
    Failed(String),
}

impl std::fmt::Display for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageCache::Invalidated => f.write_str("invalidated before the job (invalidate=1)"),
            PageCache::Kept => f.write_str("kept (invalidate=0): reads may be served from memory"),
            PageCache::Failed(why) => write!(f, "not invalidated ({why}): reads may be served from memory"),
        }
    }
}

/// fio's `file_invalidate_cache` for a job's local target: drop the page cache of the
/// job's I/O range (`invalidate=1`) or say it was kept.
fn invalidate_page_cache(spec: &JobSpec, region: Region) -> Option<PageCache> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let path = spec.target.local_path()?;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() && !meta.file_type().is_block_device() {
        return None;
    }
    if !spec.invalidate {
        return Some(PageCache::Kept);
    }
    let dropped =
        std::fs::File::open(path).and_then(|f| uring::fadvise_dontneed(f.as_raw_fd(), region.start, region.len));
    Some(match dropped {
        Ok(()) => PageCache::Invalidated,
        Err(e) => PageCache::Failed(format!("posix_fadvise on {}: {e}", path.display())),
    })
}

/// What the job loop remembers of a unit in flight; times are nanoseconds since the
/// worker's `epoch`.
#[derive(Debug, Clone, Copy)]
struct SlotMeta {
    start: u64,
    issue: u64,
    ddir: Ddir,
    block: usize,
    expect: Expect,
}

#[derive(Debug)]
struct VerifyState {
    map: GenerationMap,
    bs: u64,
    start: u64,
    seed: u64,
    /// Check blocks this job did not write (read-only verify jobs).
    check_unwritten: bool,
    fatal: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Main,
    VerifyBack { cursor: usize },
}

struct Worker<'a> {
    spec: &'a JobSpec,
    engine: Box<dyn Engine>,
    caps: Capabilities,
    depth: u32,
    batch_submit: usize,
    complete_min: usize,
    complete_max: usize,
    /// The job's units, by index, for their whole life (the engine completes them here).
    units: Vec<IoU>,
    /// Indices of the units not in flight, used as a stack.
    free: Vec<u32>,
    meta: Vec<SlotMeta>,
    pending: Vec<u32>,
    in_flight: u32,
    workload: Workload,
    phase: Phase,
    verify: Option<VerifyState>,
    stats: ThreadStat,
    accounting: bool,
    /// The job's clock epoch, before its first I/O: times are kept as nanoseconds since.
    epoch: Instant,
    /// When the measured part of the job began (after ramp_time), since `epoch`.
    stats_start_ns: u64,
    sampler: RateSampler,
    this_bytes: [u64; 2],
    this_ios: [u64; 2],
    /// Totals including ramp, published to `progress`.
    done_bytes: [u64; 2],
    done_ios: [u64; 2],
    error: Option<JobError>,
    stop: bool,
    /// The engine failed (commit/getevents): units inside it are abandoned.
    broken: bool,
    refill: Option<SmallRng>,
    progress: &'a Progress,
    stall_timeout: Duration,
    /// The engine's per-path counts at the end of ramp_time (subtracted at the end).
    multipath_base: Option<crate::engine::mpath::MultipathStats>,
    /// What happened to the local file's page cache before the job.
    page_cache: Option<PageCache>,
}

/// The seed of a job thread: fixed per (randseed, thread) with `randrepeat=1`.
pub fn job_seed(spec: &JobSpec) -> u64 {
    let base = if spec.randrepeat {
        spec.randseed
    } else {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        spec.randseed ^ verify::mix64(u64::from(nanos) ^ u64::from(std::process::id()))
    };
    let thread = u64::try_from(spec.place.thread_number).unwrap_or(0);
    verify::mix64(base ^ thread.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn ns_between(later: Instant, earlier: Instant) -> u64 {
    u64::try_from(later.saturating_duration_since(earlier).as_nanos()).unwrap_or(u64::MAX)
}

fn ms_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// Run one job thread to the end. Never panics on I/O errors; setup failures come back
/// as the outcome's error. Waits at `start` once setup is done (or has failed), so all
/// threads of a batch begin I/O together.
pub fn run_thread(
    spec: &JobSpec,
    factory: &dyn EngineFactory,
    opts: &RunOptions,
    start: &StartGate,
    progress: &Progress,
) -> ThreadOutcome {
    let mut notes = Vec::new();
    let setup = setup(spec, factory, opts, progress, &mut notes);
    start.ready_and_wait();
    let usage_fn = opts.usage;
    let tid = usage_fn().map(|u| u.tid).unwrap_or(0);
    let mut worker = match setup {
        Ok(w) => w,
        Err(e) => {
            progress.set_state(ThreadState::Failed);
            return ThreadOutcome {
                stat: ThreadStat::default(),
                error: Some(JobError { errno: if e.kind == ErrorKind::Io { 5 } else { 22 }, message: e.to_string() }),
                tid,
                notes,
                multipath: None,
                page_cache: None,
            };
        }
    };
    let epoch = Instant::now();
    let ramp_end = (!spec.ramp_time.is_zero()).then(|| epoch + spec.ramp_time);
    // fio counts runtime from the end of ramp_time (reset_all_stats resets the epoch),
    // so the deadline moves to ramp end + runtime once the ramp is over.
    let deadline = spec.runtime.map(|r| epoch + spec.ramp_time + r);
    let mut usage_base = usage_fn();
    worker.stats_start_ns = worker.ns(epoch);
    worker.sampler = RateSampler::new(0);
    worker.accounting = ramp_end.is_none();
    progress.set_state(if ramp_end.is_some() { ThreadState::Ramping } else { ThreadState::Running });

    worker.run_phase(deadline, ramp_end, &mut usage_base, usage_fn);
    let main_elapsed = worker.since_stats_start(Instant::now());
    for d in 0..2 {
        if worker.stats.dirs[d].io_bytes > 0 {
            worker.stats.dirs[d].runtime_ms += ms_ceil(main_elapsed);
        }
    }

    let wrote = worker.verify.as_ref().is_some_and(|v| v.map.next_written(0).is_some());
    if wrote && spec.do_verify && spec.writes() && worker.error.is_none() {
        progress.set_state(ThreadState::Verifying);
        worker.phase = Phase::VerifyBack { cursor: 0 };
        // The read-back is accounted even if the job ended inside ramp_time.
        worker.accounting = true;
        let t0 = Instant::now();
        worker.run_phase(None, None, &mut usage_base, usage_fn);
        worker.stats.dirs[0].runtime_ms += ms_ceil(t0.elapsed());
    }

    let end = Instant::now();
    worker.stats.total_run_time_ms = ms_ceil(worker.since_stats_start(end));
    if let (Some(base), Some(now)) = (usage_base, usage_fn()) {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        worker.stats.usr_us = us(now.user.saturating_sub(base.user));
        worker.stats.sys_us = us(now.system.saturating_sub(base.system));
        worker.stats.ctx = now.ctx.saturating_sub(base.ctx);
        worker.stats.minf = now.minflt.saturating_sub(base.minflt);
        worker.stats.majf = now.majflt.saturating_sub(base.majflt);
    }
    let multipath = match (worker.engine.multipath(), &worker.multipath_base) {
        (Some(now), Some(base)) => Some(now.since(base)),
        (now, _) => now,
    };
    if let Err(e) = worker.engine.close()
        && worker.error.is_none()
    {
        worker.error = Some(JobError { errno: 5, message: e.to_string() });
    }
    if worker.stats.verify.failures > 0 && worker.error.is_none() {
        worker.error = Some(JobError {
            errno: EILSEQ,
            message: format!(
                "{} verify failure(s); first: {}",
                worker.stats.verify.failures,
                worker.stats.verify.first_failure.clone().unwrap_or_default()
            ),
        });
    }
    progress.set_state(if worker.error.is_some() { ThreadState::Failed } else { ThreadState::Done });
    ThreadOutcome { stat: worker.stats, error: worker.error, tid, notes, multipath, page_cache: worker.page_cache }
}

fn setup<'a>(
    spec: &'a JobSpec,
    factory: &dyn EngineFactory,
    opts: &RunOptions,
    progress: &'a Progress,
    notes: &mut Vec<String>,
) -> Result<Worker<'a>> {
    let who = format!("job {}[{}]", spec.name, spec.place.clone);
    if let Some(cpus) = spec.cpus_for_thread() {
        match &opts.pin {
            Some(pin) => pin(&cpus).map_err(|e| Error::io(format!("{who}: pin to CPUs {cpus:?}"), e))?,
            None => notes.push(format!("job {}: cpus_allowed ignored: no pin hook installed", spec.name)),
        }
    }
    let needed_size = spec.filesize.or(spec.size.map(|s| spec.offset + s));
    let mut ctx = EngineCtx { job: spec, target: &spec.target, iodepth: spec.iodepth, needed_size };
    if crate::engine::writefua(spec) && !crate::engine::WRITEFUA_ENGINES.contains(&factory.name()) {
        return Err(Error::new(
            ErrorKind::Option,
            format!(
                "{who}: writefua=1: the {} engine cannot send a write with FUA (only the NVMe engines, \
                 on a remote filename or the embedded target, can)",
                factory.name()
            ),
        ));
    }
    let mut engine = factory.create(&ctx)?;
    let caps = engine.capabilities();
    let mut depth = spec.iodepth;
    if caps.max_depth > 0 && depth > caps.max_depth {
        notes.push(format!(
            "job {}: iodepth={} lowered to {} (the {} engine's limit)",
            spec.name,
            spec.iodepth,
            caps.max_depth,
            engine.name()
        ));
        depth = caps.max_depth;
    }
    if caps.sync && depth > 1 {
        // fio: "both iodepth >= 1 and synchronous I/O engine are selected, queue depth
        // will be capped at 1". The reports still show the configured iodepth.
        notes.push(format!(
            "job {}: the {} engine is synchronous; queue depth is capped at 1 (iodepth={})",
            spec.name,
            engine.name(),
            spec.iodepth
        ));
        depth = 1;
    }
    if spec.fsync_every > 0 && !caps.flush {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{who}: fsync={} but the {} engine cannot flush", spec.fsync_every, engine.name()),
        ));
    }
    ctx.iodepth = depth;
    let info = engine.open(&ctx)?;
    let region_len = match spec.size {
        Some(s) => s,
        None => match spec.filesize {
            Some(f) => f.saturating_sub(spec.offset),
            None => info.size.saturating_sub(spec.offset),
        },
    };
    if region_len == 0 || spec.offset + region_len > info.size {
        return Err(Error::new(
            ErrorKind::Option,
            format!(
                "{who}: I/O region offset={} size={region_len} does not fit the target's {} bytes",
                spec.offset, info.size
            ),
        ));
    }
    if spec.direct {
        let lba = u64::from(info.block_size.max(1));
        let unaligned = !spec.offset.is_multiple_of(lba)
            || spec.bs.iter().any(|(lo, hi)| !lo.is_multiple_of(lba) || !hi.is_multiple_of(lba));
        if unaligned {
            return Err(Error::new(
                ErrorKind::Option,
                format!("{who}: direct=1 needs offset and bs to be multiples of the {lba}-byte block size"),
            ));
        }
    }
    let region = Region { start: spec.offset, len: region_len };
    let page_cache = invalidate_page_cache(spec, region);
    if let Some(PageCache::Failed(why)) = &page_cache {
        notes.push(format!("job {}: page cache not invalidated: {why}", spec.name));
    }
    let seed = job_seed(spec);
    let workload =
        Workload::new(spec, region, seed).map_err(|e| Error::new(ErrorKind::Option, format!("{who}: {e}")))?;
    let verify = match spec.verify {
        VerifyKind::None => None,
        VerifyKind::Crc32c => {
            let bs = spec.min_bs();
            let map = GenerationMap::new(region_len / bs)
                .map_err(|e| Error::new(ErrorKind::Option, format!("{who}: {e}")))?;
            Some(VerifyState {
                map,
                bs,
                start: spec.offset,
                seed,
                check_unwritten: !spec.writes(),
                fatal: spec.verify_fatal,
            })
        }
    };
    let max_bs = spec.max_bs();
    if u64::from(depth) * max_bs > POOL_BYTES_MAX {
        return Err(Error::new(
            ErrorKind::Option,
            format!("{who}: iodepth={depth} x bs={max_bs} needs more than {POOL_BYTES_MAX} bytes of buffers"),
        ));
    }
    let buf_len = usize::try_from(max_bs).map_err(|e| Error::new(ErrorKind::Option, e.to_string()))?;
    let align = caps.buf_align.max(4096);
    let mut units: Vec<IoU> = (0..depth).map(|i| IoU::new(i, buf_len, align)).collect();
    engine.prepare(&mut units)?;
    // The engine may have installed its own buffers; check them, then fill.
    let mut fill_rng = SmallRng::seed_from_u64(seed ^ 0xb0ff);
    for (i, u) in units.iter_mut().enumerate() {
        if u.index as usize != i || u.buf.len() < buf_len {
            return Err(Error::new(
                ErrorKind::Engine,
                format!(
                    "{who}: the {} engine's prepare() left unit {i} with index {} and a {}-byte buffer; \
                     the job needs index {i} and {buf_len} bytes",
                    engine.name(),
                    u.index,
                    u.buf.len()
                ),
            ));
        }
        // fio fills buffers only for jobs that write (init_io_u_buffers): a read-only
        // job's buffers are overwritten by every read.
        if spec.writes() && !spec.zero_buffers {
            fill_rng.fill_bytes(u.buf.as_mut_slice());
        }
    }
    let now = Instant::now();
    let meta =
        vec![SlotMeta { start: 0, issue: 0, ddir: Ddir::Read, block: 0, expect: Expect::Unwritten }; units.len()];
    // `free` is used as a stack; pop from the end so unit 0 goes out first.
    let free: Vec<u32> = (0..depth).rev().collect();
    let dirs_used = [spec.reads() || verify.is_some(), spec.writes()];
    let stats = ThreadStat::with_hists(
        dirs_used,
        spec.slat_percentiles,
        spec.clat_percentiles,
        spec.lat_percentiles,
        spec.fsync_every > 0,
    );
    let depth_usize = units.len();
    Ok(Worker {
        spec,
        engine,
        caps,
        depth,
        batch_submit: usize::try_from(spec.iodepth_batch_submit.min(depth).max(1)).unwrap_or(1),
        complete_min: usize::try_from(spec.iodepth_batch_complete_min).unwrap_or(1),
        complete_max: usize::try_from(spec.iodepth_batch_complete_max).unwrap_or(1),
        units,
        free,
        meta,
        pending: Vec::with_capacity(depth_usize),
        in_flight: 0,
        workload,
        phase: Phase::Main,
        verify,
        stats,
        accounting: false,
        epoch: now,
        stats_start_ns: 0,
        sampler: RateSampler::new(0),
        this_bytes: [0; 2],
        this_ios: [0; 2],
        done_bytes: [0; 2],
        done_ios: [0; 2],
        error: None,
        stop: false,
        broken: false,
        refill: (spec.refill_buffers && !spec.zero_buffers).then(|| SmallRng::seed_from_u64(seed ^ 0x0fee)),
        progress,
        stall_timeout: opts.stall_timeout,
        multipath_base: None,
        page_cache,
    })
}

impl Worker<'_> {
    fn fail(&mut self, errno: i32, message: String) {
        if self.error.is_none() {
            self.error = Some(JobError { errno, message });
        }
        self.stop = true;
    }

    /// `t` in nanoseconds since the job's clock epoch.
    fn ns(&self, t: Instant) -> u64 {
        ns_between(t, self.epoch)
    }

    fn since_stats_start(&self, t: Instant) -> Duration {
        Duration::from_nanos(self.ns(t).saturating_sub(self.stats_start_ns))
    }

    /// Milliseconds since the measured part of the job began, for `now_ns` since the epoch.
    fn now_ms(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.stats_start_ns) / 1_000_000
    }

    /// End of ramp_time: forget what was measured (fio `reset_all_stats`).
    fn end_ramp(
        &mut self,
        now_ns: u64,
        usage_base: &mut Option<crate::cpu::ThreadUsage>,
        usage_fn: crate::cpu::UsageFn,
    ) {
        self.stats.reset_io();
        self.multipath_base = self.engine.multipath();
        self.this_bytes = [0; 2];
        self.this_ios = [0; 2];
        self.stats_start_ns = now_ns;
        self.sampler = RateSampler::new(0);
        self.accounting = true;
        *usage_base = usage_fn();
        self.progress.set_state(ThreadState::Running);
    }

    fn next_io(&mut self) -> Option<Next> {
        match self.phase {
            Phase::Main => self.workload.next(),
            Phase::VerifyBack { cursor } => {
                let v = self.verify.as_ref()?;
                let (block, _) = v.map.next_written(cursor)?;
                self.phase = Phase::VerifyBack { cursor: block + 1 };
                Some(Next {
                    ddir: Ddir::Read,
                    offset: v.start + u64::try_from(block).ok()? * v.bs,
                    len: u32::try_from(v.bs).ok()?,
                })
            }
        }
    }

    /// Fill in a free unit for `next` (fio `get_io_u` + `populate_verify_io_u`).
    fn prepare(&mut self, idx: usize, next: Next) {
        let unit = &mut self.units[idx];
        unit.ddir = next.ddir;
        unit.offset = next.offset;
        unit.len = next.len;
        unit.result = IoResult::Pending;
        let mut block = 0;
        let mut expect = Expect::Unwritten;
        if let Some(v) = self.verify.as_mut()
            && next.ddir != Ddir::Sync
        {
            block = usize::try_from((next.offset - v.start) / v.bs).expect("block index fits usize");
            match next.ddir {
                Ddir::Write => {
                    let generation = v.map.begin_write(block);
                    verify::fill(unit.data_mut(), v.seed, next.offset, generation);
                }
                _ => expect = v.map.expect(block),
            }
        } else if next.ddir == Ddir::Write
            && let Some(rng) = self.refill.as_mut()
        {
            rng.fill_bytes(unit.data_mut());
        }
        let m = &mut self.meta[idx];
        m.ddir = next.ddir;
        m.block = block;
        m.expect = expect;
        let now = Instant::now();
        m.start = ns_between(now, self.epoch);
        unit.prepared = now;
    }

    /// Queue unit `idx`; `true` means the engine was busy (queue it again later).
    fn issue(&mut self, idx: usize) -> bool {
        let ddir = self.units[idx].ddir;
        if self.caps.sync {
            self.meta[idx].issue = self.ns(Instant::now());
        }
        self.count_issue(ddir, 1);
        match self.engine.queue(&mut self.units[idx]) {
            Queued::Completed => {
                let now = self.ns(Instant::now());
                if !self.caps.sync {
                    self.meta[idx].issue = now;
                }
                if self.accounting {
                    self.stats.mark_depth(self.in_flight + 1, 1);
                    if self.caps.sync {
                        self.stats.mark_submit(1);
                        self.stats.mark_complete(1);
                    }
                }
                self.complete(idx, now);
                false
            }
            Queued::Queued => {
                self.in_flight += 1;
                self.pending.push(u32::try_from(idx).expect("slot index fits u32"));
                if self.pending.len() >= self.batch_submit {
                    self.commit();
                }
                false
            }
            Queued::Busy => {
                self.count_issue(ddir, -1);
                true
            }
        }
    }

    fn count_issue(&mut self, ddir: Ddir, delta: i64) {
        if !self.accounting {
            return;
        }
        let slot = match ddir.rw_index() {
            Some(d) => &mut self.stats.dirs[d].total_ios,
            None => &mut self.stats.sync_total,
        };
        *slot = slot.saturating_add_signed(delta);
    }

    /// Submit what is queued (fio `td_io_commit` + `io_u_queued` for slat).
    fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let n = self.pending.len();
        if self.accounting {
            self.stats.mark_depth(self.in_flight, u64::try_from(n).unwrap_or(0));
        }
        if let Err(e) = self.engine.commit(&mut self.units) {
            self.fail(5, format!("{} commit: {e}", self.engine.name()));
            self.broken = true;
        }
        let now = self.ns(Instant::now());
        for i in 0..n {
            let idx = self.pending[i] as usize;
            self.meta[idx].issue = now;
            if self.accounting && !self.caps.sync {
                let slat = now.saturating_sub(self.meta[idx].start);
                // Flushes have no slat in fio's report.
                if let Some(d) = self.meta[idx].ddir.rw_index() {
                    let ds = &mut self.stats.dirs[d];
                    ds.slat.add(slat);
                    if let Some(h) = ds.slat_hist.as_mut() {
                        h.record(slat);
                    }
                }
            }
        }
        self.pending.clear();
        if self.accounting {
            self.stats.mark_submit(n);
        }
    }

    /// Account finished unit `idx`, completed at `now` (ns since the epoch), and return it
    /// to the free stack.
    fn complete(&mut self, idx: usize, now: u64) {
        let unit = &self.units[idx];
        let (ddir, len, result) = (unit.ddir, unit.len, unit.result);
        let m = self.meta[idx];
        match ddir {
            Ddir::Sync => match result {
                IoResult::Done { .. } => {
                    if self.accounting {
                        let clat = now.saturating_sub(m.issue);
                        self.stats.sync.add(clat);
                        if let Some(h) = self.stats.sync_hist.as_mut() {
                            h.record(clat);
                        }
                    }
                }
                IoResult::Error(e) => self.fail(e.errno(), format!("flush failed: {e}")),
                IoResult::Pending => panic!("engine returned unit {idx} without a result"),
            },
            ddir => {
                let d = ddir.rw_index().expect("read or write");
                match result {
                    IoResult::Done { bytes } => {
                        let full = bytes >= len;
                        if let Some(v) = self.verify.as_mut() {
                            if ddir == Ddir::Write {
                                v.map.end_write(m.block, full);
                            } else if full {
                                self.check_read(idx, m);
                            }
                        }
                        if self.accounting {
                            let lat = now.saturating_sub(m.start);
                            let clat = now.saturating_sub(m.issue);
                            let ds = &mut self.stats.dirs[d];
                            ds.lat.add(lat);
                            ds.clat.add(clat);
                            if let Some(h) = ds.lat_hist.as_mut() {
                                h.record(lat);
                            }
                            if let Some(h) = ds.clat_hist.as_mut() {
                                h.record(clat);
                            }
                            ds.io_bytes += u64::from(bytes);
                            if !full {
                                ds.short_ios += 1;
                            }
                            self.stats.mark_latency(clat);
                            self.this_bytes[d] += u64::from(bytes);
                            self.this_ios[d] += 1;
                        }
                        // Single writer: plain stores of thread-local totals, no locked RMW.
                        self.done_bytes[d] += u64::from(bytes);
                        self.done_ios[d] += 1;
                        self.progress.bytes[d].store(self.done_bytes[d], Ordering::Relaxed);
                        self.progress.ios[d].store(self.done_ios[d], Ordering::Relaxed);
                    }
                    IoResult::Error(e) => {
                        if let Some(v) = self.verify.as_mut()
                            && ddir == Ddir::Write
                        {
                            v.map.end_write(m.block, false);
                        }
                        let what = if ddir == Ddir::Read { "read" } else { "write" };
                        let offset = self.units[idx].offset;
                        let mut message = format!("{what} of {len} bytes at offset {offset} failed: {e}");
                        if self.error.is_none()
                            && let Some(why) = self.engine.explain(e)
                        {
                            message = format!("{message}: {why}");
                        }
                        self.fail(e.errno(), message);
                    }
                    IoResult::Pending => panic!("engine returned unit {idx} without a result"),
                }
            }
        }
        self.free.push(u32::try_from(idx).expect("slot index fits u32"));
    }

    fn check_read(&mut self, idx: usize, m: SlotMeta) {
        let Some(v) = self.verify.as_ref() else { return };
        let expected = match m.expect {
            Expect::Racing => return,
            Expect::Unwritten if !v.check_unwritten => return,
            Expect::Unwritten => None,
            Expect::Generation(g) => Some(g),
        };
        let unit = &self.units[idx];
        let result = verify::check(unit.data(), unit.offset, expected);
        self.stats.verify.checked += 1;
        let Err(mismatch) = result else { return };
        // A write to the block issued after this read makes any outcome legal.
        if let Some(g) = expected
            && (v.map.current(m.block) != g || v.map.expect(m.block) == Expect::Racing)
        {
            self.stats.verify.checked -= 1;
            return;
        }
        let fatal = v.fatal;
        self.stats.verify.failures += 1;
        let msg = mismatch.to_string();
        if self.stats.verify.failures <= VERIFY_PRINT_MAX {
            eprintln!("{}: {msg}", self.spec.name);
        } else if self.stats.verify.failures == VERIFY_PRINT_MAX + 1 {
            eprintln!("{}: further verify failures are counted, not printed", self.spec.name);
        }
        if self.stats.verify.first_failure.is_none() {
            self.stats.verify.first_failure = Some(msg.clone());
        }
        if fatal {
            self.fail(EILSEQ, msg);
        }
    }

    /// Reap completions (fio `wait_for_completions` / `io_u_queued_complete`); the time
    /// they completed at, if any did (also in ns since the epoch).
    fn reap(&mut self, min: usize) -> Option<(Instant, u64)> {
        let in_flight = self.in_flight as usize;
        let min = min.min(in_flight);
        let max = self.complete_max.clamp(min.max(1), in_flight.max(1));
        if min > 0 {
            self.commit();
        }
        let timeout = if min == 0 { Some(Duration::ZERO) } else { Some(REAP_SLICE) };
        let n = match self.engine.getevents(&mut self.units, min, max, timeout) {
            Ok(n) => n,
            Err(e) => {
                self.fail(5, format!("{} getevents: {e}", self.engine.name()));
                self.broken = true;
                return None;
            }
        };
        assert!(n <= in_flight, "engine reaped {n} units with only {in_flight} in flight");
        if n == 0 {
            return None;
        }
        if self.accounting {
            self.stats.mark_complete(n);
        }
        let now = Instant::now();
        let now_ns = self.ns(now);
        for i in 0..n {
            let idx = self.engine.event(i) as usize;
            self.in_flight -= 1;
            self.complete(idx, now_ns);
        }
        Some((now, now_ns))
    }

    /// Run the current phase until its source is exhausted, the deadline passes or the
    /// job fails, then drain everything in flight.
    fn run_phase(
        &mut self,
        mut deadline: Option<Instant>,
        mut ramp_end: Option<Instant>,
        usage_base: &mut Option<crate::cpu::ThreadUsage>,
        usage_fn: crate::cpu::UsageFn,
    ) {
        // A unit the engine was busy for, to queue again.
        let mut requeue: Option<usize> = None;
        let mut source_done = false;
        let mut last_progress = Instant::now();
        let mut sample_due_ms = self.sampler.due_ms();
        // The time the last reap's completions were stamped with: the next pass starts right
        // after them and uses it for its deadline, ramp and sampling checks instead of reading
        // the clock again. At 4 KiB QD32 a job thread reaps one completion per pass, and the
        // clock reads of this loop were about 5% of its samples.
        let mut reaped_at: Option<(Instant, u64)> = None;
        loop {
            let (now, now_ns) = reaped_at.take().unwrap_or_else(|| {
                let now = Instant::now();
                (now, self.ns(now))
            });
            if let Some(r) = ramp_end
                && now >= r
            {
                self.end_ramp(now_ns, usage_base, usage_fn);
                sample_due_ms = self.sampler.due_ms();
                ramp_end = None;
                deadline = self.spec.runtime.map(|r| now + r);
            }
            if self.accounting {
                let now_ms = self.now_ms(now_ns);
                if now_ms >= sample_due_ms {
                    self.sampler.maybe_sample(now_ms, self.this_bytes, self.this_ios, &mut self.stats.dirs);
                    sample_due_ms = self.sampler.due_ms();
                }
            }
            let time_up = deadline.is_some_and(|d| now >= d);
            let can_issue = !time_up && !self.stop && !source_done;
            let mut busy = false;
            // At most iodepth units per pass, so the clocks are re-checked even when a
            // synchronous engine completes everything inside `queue`.
            let mut budget = self.depth;
            while can_issue && self.in_flight < self.depth && budget > 0 && !self.stop {
                budget -= 1;
                let idx = match requeue.take() {
                    Some(idx) => idx,
                    None => {
                        let Some(next) = self.next_io() else {
                            source_done = true;
                            break;
                        };
                        let idx = self.free.pop().expect("a free unit exists while in_flight < iodepth") as usize;
                        self.prepare(idx, next);
                        idx
                    }
                };
                if self.issue(idx) {
                    requeue = Some(idx);
                    busy = true;
                    break;
                }
            }
            let draining = !can_issue || source_done || self.stop;
            if draining && let Some(idx) = requeue.take() {
                // Never issued: undo the verify bookkeeping of a prepared write.
                if let (Some(v), Ddir::Write) = (self.verify.as_mut(), self.units[idx].ddir) {
                    v.map.end_write(self.meta[idx].block, false);
                }
                self.free.push(u32::try_from(idx).expect("slot index fits u32"));
            }
            if self.in_flight == 0 {
                self.commit();
                if draining {
                    break;
                }
                continue;
            }
            if self.broken {
                break;
            }
            let full = self.in_flight >= self.depth || busy;
            if full || draining || self.caps.polled {
                let min = if full || draining { self.complete_min.max(1) } else { 0 };
                if let Some(at) = self.reap(min) {
                    last_progress = at.0;
                    reaped_at = Some(at);
                } else if last_progress.elapsed() > self.stall_timeout {
                    let stuck = self.in_flight;
                    self.fail(
                        62, // ETIME
                        format!("no completion for {:?} with {stuck} I/Os in flight", self.stall_timeout),
                    );
                    // The engine still owns the stuck units; stop without them.
                    self.broken = true;
                    break;
                }
            } else if !self.pending.is_empty() && self.pending.len() >= self.batch_submit {
                self.commit();
            }
        }
    }
}
