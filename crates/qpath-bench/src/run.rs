//! The runner: one thread per job, stonewall batches in order, results collected.
//!
//! ```text
//! run_jobs(JobFile)
//!   resolve engines for every job (fail early)
//!   for each stonewall batch:
//!     lay out local files
//!     spawn one thread per job ── setup (pin, engine create/open, units) ─┐
//!     open the start gate once all are set up  ◄────────────────────────┘
//!     status line every second while they run (stderr, terminals only)
//!     join: ThreadOutcome per job
//! ```

pub mod worker;

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::cpu::{self, UsageFn};
use crate::engine::{EngineRegistry, Resolved};
use crate::error::{Error, ErrorKind, Result};
use crate::job::{JobFile, JobSpec, RwDirs, RwPattern};
use crate::status::{Snapshot, StatusLine};
use worker::{Progress, ThreadOutcome, ThreadState};

/// Pins the calling thread to a set of CPUs (the `uring` crate provides one).
pub type PinFn = dyn Fn(&[usize]) -> std::io::Result<()> + Send + Sync;

/// When to show the live status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMode {
    /// When stderr is a terminal.
    Auto,
    /// Never.
    Never,
    /// Always (to the diagnostics writer).
    Always,
}

/// Knobs of a run that are not job options.
#[derive(Clone)]
pub struct RunOptions {
    /// Honour `cpus_allowed` with this; without it the option is reported as ignored.
    pub pin: Option<Arc<PinFn>>,
    /// Per-thread CPU usage (defaults to `/proc/thread-self`).
    pub usage: UsageFn,
    /// Live status line.
    pub status: StatusMode,
    /// A job fails if nothing completes for this long.
    pub stall_timeout: Duration,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("pin", &self.pin.is_some())
            .field("status", &self.status)
            .field("stall_timeout", &self.stall_timeout)
            .finish()
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            pin: None,
            usage: cpu::proc_thread_usage,
            status: StatusMode::Auto,
            stall_timeout: Duration::from_secs(60),
        }
    }
}

/// The error that ended a job (fio's `err=` and its message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// errno-style code.
    pub errno: i32,
    /// What happened.
    pub message: String,
}

/// One job thread's result.
#[derive(Debug)]
pub struct ThreadResult {
    /// The job.
    pub spec: JobSpec,
    /// Engine that ran it.
    pub engine: String,
    /// What it measured.
    pub outcome: ThreadOutcome,
}

/// Everything a run produced, ready for the reports.
#[derive(Debug)]
pub struct RunResult {
    /// Per job thread, in thread order.
    pub jobs: Vec<ThreadResult>,
    /// Wall-clock start.
    pub started: SystemTime,
    /// Wall-clock duration.
    pub elapsed: Duration,
    /// Notes for the user (engine substitutions, ignored options, layouts).
    pub notes: Vec<String>,
}

impl RunResult {
    /// Whether any job ended with an error (the bin should exit non-zero).
    pub fn failed(&self) -> bool {
        self.jobs.iter().any(|j| j.outcome.error.is_some())
    }
}

/// Holds job threads until all of a batch are set up, so they start I/O together.
#[derive(Debug, Default)]
pub struct StartGate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl StartGate {
    /// Called by a job thread when its setup is done; returns when the gate opens.
    pub fn ready_and_wait(&self) {
        let mut g = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        g.0 += 1;
        self.cv.notify_all();
        while !g.1 {
            g = self.cv.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn wait_ready_then_open(&self, expected: usize) {
        let mut g = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while g.0 < expected {
            g = self.cv.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        g.1 = true;
        self.cv.notify_all();
    }
}

fn run_letter(spec: &JobSpec, state: ThreadState) -> char {
    match state {
        ThreadState::SettingUp => 'P',
        ThreadState::Ramping => '/',
        ThreadState::Verifying => 'V',
        ThreadState::Done => '_',
        ThreadState::Failed => 'X',
        ThreadState::Running => {
            let random = spec.rw_pattern == RwPattern::Random;
            let c = match (spec.rw_dirs, spec.effective_rwmix_read()) {
                (RwDirs::Read, _) | (RwDirs::Mixed, 100) => 'r',
                (RwDirs::Write, _) | (RwDirs::Mixed, 0) => 'w',
                (RwDirs::Mixed, _) => 'm',
            };
            if random { c } else { c.to_ascii_uppercase() }
        }
    }
}

/// Expected wall time of a job, if its options say (ramp + runtime).
fn planned(spec: &JobSpec) -> Option<Duration> {
    spec.runtime.map(|r| r + spec.ramp_time)
}

/// Run every job of `file`. Notes and the status line go to `diag` (stderr for the bin).
pub fn run_jobs(
    file: &JobFile,
    registry: &EngineRegistry,
    opts: &RunOptions,
    diag: &mut dyn Write,
) -> Result<RunResult> {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let mut notes: Vec<String> = file.notes.clone();
    let mut resolved: Vec<Resolved> = Vec::with_capacity(file.jobs.len());
    for j in &file.jobs {
        let r = registry.resolve(j).map_err(|e| Error::new(e.kind, format!("job {}: {}", j.name, e.context)))?;
        if let Some(n) = &r.note
            && !notes.contains(n)
        {
            notes.push(n.clone());
        }
        resolved.push(r);
    }
    for n in &notes {
        let _ = writeln!(diag, "note: {n}");
    }
    let show_status = match opts.status {
        StatusMode::Always => true,
        StatusMode::Never => false,
        StatusMode::Auto => std::io::stderr().is_terminal(),
    };
    let progress: Vec<Progress> = file.jobs.iter().map(|_| Progress::new()).collect();
    let mut outcomes: Vec<Option<ThreadOutcome>> = file.jobs.iter().map(|_| None).collect();
    let batches = file.jobs.iter().map(|j| j.place.batch).max().map_or(0, |b| b + 1);
    let mut status = StatusLine::default();
    let mut printed_status = false;
    let mut main_place = uring::placement::Helper::default();

    for batch in 0..batches {
        let members: Vec<usize> = (0..file.jobs.len()).filter(|&i| file.jobs[i].place.batch == batch).collect();
        for (path, need) in crate::layout::needs(members.iter().map(|&i| &file.jobs[i])) {
            if let Some(msg) = crate::layout::layout(&path, &need)? {
                let _ = writeln!(diag, "{msg}");
            }
        }
        let gate = StartGate::default();
        std::thread::scope(|scope| -> Result<()> {
            let mut handles = Vec::with_capacity(members.len());
            for &i in &members {
                let spec = &file.jobs[i];
                let factory = resolved[i].factory.clone();
                let prog = &progress[i];
                let gate = &gate;
                let h = std::thread::Builder::new()
                    .name(format!("{}.{}", spec.name, spec.place.clone))
                    .spawn_scoped(scope, move || worker::run_thread(spec, factory.as_ref(), opts, gate, prog));
                match h {
                    Ok(h) => handles.push((i, h)),
                    Err(e) => {
                        gate.wait_ready_then_open(handles.len());
                        return Err(Error::io(format!("spawn thread for job {}", spec.name), e));
                    }
                }
            }
            gate.wait_ready_then_open(handles.len());
            let start = Instant::now();
            let mut prev = (start, [0u64; 2], [0u64; 2]);
            let mut next_status = start + Duration::from_secs(1);
            // Bounded by the jobs themselves: each has a deadline, a finite size or a
            // stall timeout.
            while handles.iter().any(|(_, h)| !h.is_finished()) {
                // This thread wakes every 50 ms: off the CPUs the jobs and an embedded
                // target's reactor spin on, when any other is left.
                let _ = main_place.refresh();
                std::thread::sleep(Duration::from_millis(50));
                let now = Instant::now();
                if show_status && now >= next_status {
                    next_status = now + Duration::from_secs(1);
                    let snap = snapshot(file, &progress, &members, (t0, start), now, &mut prev, batch);
                    // Between batches nothing runs; keep the last useful line.
                    if snap.running > 0 {
                        let _ = write!(diag, "{}", status.render(&snap));
                        let _ = diag.flush();
                        printed_status = true;
                    }
                }
            }
            for (i, h) in handles {
                let outcome = h
                    .join()
                    .map_err(|_| Error::new(ErrorKind::Engine, format!("job {} thread panicked", file.jobs[i].name)))?;
                outcomes[i] = Some(outcome);
            }
            Ok(())
        })?;
    }
    if printed_status {
        let _ = writeln!(diag);
    }
    let mut jobs = Vec::with_capacity(file.jobs.len());
    for ((spec, r), outcome) in file.jobs.iter().zip(resolved).zip(outcomes) {
        let outcome = outcome.expect("every job thread was joined");
        // Clones report the same notes; say each once.
        for n in &outcome.notes {
            if !notes.contains(n) {
                let _ = writeln!(diag, "note: {n}");
                notes.push(n.clone());
            }
        }
        jobs.push(ThreadResult { spec: spec.clone(), engine: r.factory.name().to_string(), outcome });
    }
    Ok(RunResult { jobs, started, elapsed: t0.elapsed(), notes })
}

fn snapshot(
    file: &JobFile,
    progress: &[Progress],
    members: &[usize],
    (run_start, start): (Instant, Instant),
    now: Instant,
    prev: &mut (Instant, [u64; 2], [u64; 2]),
    batch: usize,
) -> Snapshot {
    let run_str: String = file.jobs.iter().zip(progress).map(|(j, p)| run_letter(j, p.state())).collect();
    let running = members
        .iter()
        .filter(|&&i| {
            matches!(progress[i].state(), ThreadState::Running | ThreadState::Ramping | ThreadState::Verifying)
        })
        .count();
    let mut bytes = [0u64; 2];
    let mut ios = [0u64; 2];
    for &i in members {
        let (b, n) = (progress[i].bytes(), progress[i].ios());
        for d in 0..2 {
            bytes[d] += b[d];
            ios[d] += n[d];
        }
    }
    let ms = u64::try_from(now.saturating_duration_since(prev.0).as_millis()).unwrap_or(0).max(1);
    let rate_kib = [0, 1].map(|d| (bytes[d] - prev.1[d]) * 1000 / ms / 1024);
    let iops = [0, 1].map(|d| (ios[d] - prev.2[d]) * 1000 / ms);
    *prev = (now, bytes, ios);
    let elapsed = now.saturating_duration_since(start);
    // ETA: the longest planned job of this batch, plus later batches' planned times.
    let this_batch = members
        .iter()
        .map(|&i| planned(&file.jobs[i]).map(|p| p.saturating_sub(elapsed)))
        .try_fold(Duration::ZERO, |acc, p| p.map(|p| acc.max(p)));
    let later = (batch + 1..)
        .take_while(|b| file.jobs.iter().any(|j| j.place.batch == *b))
        .map(|b| {
            file.jobs
                .iter()
                .filter(|j| j.place.batch == b)
                .map(planned)
                .try_fold(Duration::ZERO, |acc, p| p.map(|p| acc.max(p)))
        })
        .try_fold(Duration::ZERO, |acc, p| p.map(|p| acc + p));
    let eta = this_batch.zip(later).map(|(a, b)| a + b);
    let done = eta.map(|e| {
        // fio: elapsed / (elapsed + eta), over the whole run.
        let el = now.saturating_duration_since(run_start).as_secs_f64();
        let total = el + e.as_secs_f64();
        if total > 0.0 { el / total } else { 0.0 }
    });
    Snapshot {
        running,
        run_str,
        done,
        rate_kib,
        iops,
        eta_sec: eta.map(|e| e.as_secs() + u64::from(e.subsec_nanos() > 0)),
    }
}
