//! Path selection cost, measured: ns per I/O for `select + on_submit +
//! on_complete`, each policy against the two reference selectors of seed 000.
//!
//! Every thread keeps `DEPTH` I/Os in flight: one step completes its oldest
//! I/O, selects a path, and submits on it, so queue depths and counters are
//! in a steady state like a QD32 job's, not all zero. All paths are
//! optimized (the worst case for scanning selectors); completion latencies
//! differ per path (20-35 µs) so the latency policy has real weights.
//!
//! - `baseline_harness`: the ring and loop without any selection, to subtract.
//!
//! After each `2_threads` benchmark an `interference` line gives, for the
//! same thread and memory layout, its time per step while the other thread
//! was running over its time per step while the other was descheduled (by
//! other processes on the machine): 1.00 means the two threads do not slow
//! each other down. It needs some such descheduling, so on an idle machine
//! it may be missing; then compare `2_threads` with `1_thread`.
//!
//! The machine this runs on is shared (2 cores, other builds and VMs), so a
//! sample's figure is the median over its 10-50 µs chunks of steps (see
//! `Step::per_step_ns`): time slices lost to other processes drop out
//! instead of inflating the total, and two threads compare like with like.
//! - `1_thread/<policy>/<paths>`: one thread, pinned to CPU 0.
//! - `2_threads/<policy>/<paths>`: two threads pinned to CPUs 0 and 1, each
//!   with its own `Selector` (as each context will have), both running until
//!   both have done the sample's steps; the figure is the slower thread's
//!   time per step. For `ref_*` the two threads share the
//!   reference's atomics (that is what the references are), each submitting
//!   through its own hardware queue: where the seed's contention shows.
//!
//! Run: `cargo bench -p qpath-host --bench path_select`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use qpath_host::mpath::reference::{QUEUES_PER_PATH, SharedAtomic, SumPerQueue};
use qpath_host::mpath::{Outcome, PathClass, PathIndex, PathState, Policy, Selection, Selector};
use uring::{online_cpus, pin_current_thread};

/// I/Os each thread keeps in flight.
const DEPTH: usize = 32;
const _: () = assert!(DEPTH.is_power_of_two());
const PATH_COUNTS: [usize; 3] = [2, 8, 64];
/// Submitting threads in the `2_threads` group.
const THREADS: usize = 2;

/// Something that does one I/O's worth of path selection.
trait Step: Send {
    fn step(&mut self);

    /// Time per step of thread `me` of `run`, robust to the core being taken away.
    ///
    /// Runs `iters` steps in chunks of `chunk`, timing each chunk, and goes on
    /// (still timing) until every thread of the run has done its `iters`.
    /// Returns the median chunk's time per step: a chunk (10-50 µs) during
    /// which the scheduler gave the core to another process is an outlier and
    /// drops out, where a plain wall-clock total would count it. With several
    /// threads only chunks during which the others made progress count
    /// (another process may hold their core meanwhile, and contention on
    /// shared lines only happens while both run), unless there are too few.
    /// Monomorphised per stepper, so `step` inlines into the loop.
    #[inline(never)]
    fn per_step_ns(&mut self, iters: u64, chunk: u64, run: &Run, me: usize) -> Rate {
        let cap = usize::try_from(2 * iters / chunk + 16).unwrap_or(1 << 20);
        let (mut alone, mut together) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
        let mut done = 0;
        let mut counted_in = false;
        loop {
            let n = if done < iters { chunk.min(iters - done) } else { chunk };
            let others_before = run.others_progress(me);
            let t = Instant::now();
            for _ in 0..n {
                self.step();
            }
            let elapsed = t.elapsed();
            let ns = elapsed.as_nanos() as f64 / n as f64;
            done += n;
            run.progress[me].0.store(done, Ordering::Relaxed);
            let others = run.others_progress(me) - others_before;
            let list =
                if run.threads == 1 || others >= n / 2 * (run.threads as u64 - 1) { &mut together } else { &mut alone };
            if list.len() < cap {
                list.push(ns);
            }
            if done >= iters && !counted_in {
                counted_in = true;
                run.finished.fetch_add(1, Ordering::Relaxed);
            }
            if counted_in && run.finished.load(Ordering::Relaxed) >= run.threads {
                break;
            }
        }
        together.sort_by(f64::total_cmp);
        alone.sort_by(f64::total_cmp);
        let interference = (together.len() >= CHUNKS_PAIRED && alone.len() >= CHUNKS_PAIRED)
            .then(|| median(&together) / median(&alone));
        let mut list = together;
        if list.len() < CHUNKS_MIN {
            list.extend(alone);
            list.sort_by(f64::total_cmp);
        }
        Rate { ns: median(&list), interference }
    }
}

/// What [`Step::per_step_ns`] measured.
struct Rate {
    /// Time per step, ns.
    ns: f64,
    /// Time per step while the other threads ran over time per step while
    /// they did not (both medians, same thread, same memory layout), when the
    /// sample had enough chunks of each kind.
    interference: Option<f64>,
}

/// The median of a sorted, non-empty slice.
fn median(sorted: &[f64]) -> f64 {
    sorted[sorted.len() / 2]
}

/// Fewest chunks of each kind for the paired interference ratio.
const CHUNKS_PAIRED: usize = 20;

/// Fewest chunks run alongside the other threads for those alone to be left out.
const CHUNKS_MIN: usize = 5;

/// A counter alone on its cache line.
#[repr(align(64))]
struct Line(AtomicU64);

/// What the threads of one timed run share (besides a reference's counters).
struct Run {
    threads: usize,
    /// Threads that have done their steps.
    finished: AtomicUsize,
    /// Steps done per thread, published after each chunk.
    progress: Vec<Line>,
}

impl Run {
    fn new(threads: usize) -> Run {
        Run {
            threads,
            finished: AtomicUsize::new(0),
            progress: (0..threads).map(|_| Line(AtomicU64::new(0))).collect(),
        }
    }

    fn others_progress(&self, me: usize) -> u64 {
        self.progress.iter().enumerate().filter(|&(t, _)| t != me).map(|(_, l)| l.0.load(Ordering::Relaxed)).sum()
    }
}

fn latency_of(p: PathIndex) -> u64 {
    20_000 + (p.get() % 4) as u64 * 5_000
}

fn expect_path(s: Selection) -> PathIndex {
    match s {
        Selection::Submit(p) => p,
        other => panic!("benchmark paths are all usable, got {other:?}"),
    }
}

/// A thread's in-flight I/Os, oldest first.
struct Ring {
    slots: [PathIndex; DEPTH],
    head: usize,
}

impl Ring {
    /// Takes the oldest I/O's path and puts `fill()`'s path in its place.
    #[inline(always)]
    fn cycle(&mut self, fill: impl FnOnce(PathIndex) -> PathIndex) {
        let h = self.head;
        self.slots[h] = fill(self.slots[h]);
        self.head = (h + 1) & (DEPTH - 1);
    }
}

struct Own {
    sel: Selector,
    ring: Ring,
}

impl Own {
    fn new(policy: Policy, paths: usize, thread: usize) -> Own {
        let mut sel = Selector::new(policy, thread);
        let states: Vec<PathState> = (0..paths).map(|i| PathState::new(i as u64, PathClass::Optimized)).collect();
        sel.set_paths(&states);
        let slots = std::array::from_fn(|_| {
            let p = expect_path(sel.select());
            sel.on_submit(p);
            p
        });
        Own { sel, ring: Ring { slots, head: 0 } }
    }
}

impl Step for Own {
    #[inline(always)]
    fn step(&mut self) {
        let sel = &mut self.sel;
        self.ring.cycle(|old| {
            sel.on_complete(old, latency_of(old), Outcome::Done);
            let p = expect_path(sel.select());
            sel.on_submit(p);
            p
        });
    }
}

struct SumRef {
    r: Arc<SumPerQueue>,
    queue: usize,
    ring: Ring,
}

impl SumRef {
    fn new(r: Arc<SumPerQueue>, queue: usize) -> SumRef {
        let slots = std::array::from_fn(|_| {
            let p = expect_path(r.select());
            r.on_submit(p, queue);
            p
        });
        SumRef { r, queue, ring: Ring { slots, head: 0 } }
    }
}

impl Step for SumRef {
    #[inline(always)]
    fn step(&mut self) {
        let (r, q) = (&*self.r, self.queue);
        self.ring.cycle(|old| {
            r.on_complete(old, q);
            let p = expect_path(r.select());
            r.on_submit(p, q);
            p
        });
    }
}

struct AtomicRef {
    r: Arc<SharedAtomic>,
    ring: Ring,
}

impl AtomicRef {
    fn new(r: Arc<SharedAtomic>) -> AtomicRef {
        let slots = std::array::from_fn(|_| {
            let p = expect_path(r.select());
            r.on_submit(p);
            p
        });
        AtomicRef { r, ring: Ring { slots, head: 0 } }
    }
}

impl Step for AtomicRef {
    #[inline(always)]
    fn step(&mut self) {
        let r = &*self.r;
        self.ring.cycle(|old| {
            r.on_complete(old);
            let p = expect_path(r.select());
            r.on_submit(p);
            p
        });
    }
}

/// The harness alone: the in-flight ring and a fixed path, no selection.
struct Baseline {
    ring: Ring,
}

impl Step for Baseline {
    #[inline(always)]
    fn step(&mut self) {
        self.ring.cycle(|old| black_box(PathIndex(old.0 ^ 1)));
    }
}

#[derive(Clone, Copy)]
enum Subject {
    Baseline,
    Policy(&'static str, Policy),
    SumPerQueue,
    SharedAtomic,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Baseline => "baseline_harness",
            Subject::Policy(name, _) => name,
            Subject::SumPerQueue => "ref_sum_per_queue",
            Subject::SharedAtomic => "ref_shared_atomic",
        }
    }

    /// Steps per timed chunk: 10-50 µs of work, long against the ~25 ns of
    /// `Instant::now`, short against a scheduler time slice.
    fn chunk(self, paths: usize) -> u64 {
        let paths = u64::try_from(paths).unwrap_or(u64::MAX);
        match self {
            Subject::Baseline | Subject::Policy(..) => 4096,
            Subject::SharedAtomic => (8192 / paths).max(64),
            Subject::SumPerQueue => (1024 / paths).max(16),
        }
    }

    /// What the threads of one run share: the reference's counters, or nothing.
    fn shared(self, paths: usize) -> Shared {
        let classes = vec![PathClass::Optimized; paths];
        match self {
            Subject::Baseline | Subject::Policy(..) => Shared::Nothing,
            Subject::SumPerQueue => Shared::Sum(Arc::new(SumPerQueue::new(&classes, QUEUES_PER_PATH))),
            Subject::SharedAtomic => Shared::Atomic(Arc::new(SharedAtomic::new(&classes))),
        }
    }

    /// Thread `thread`'s stepper. Call it on that thread: its allocations
    /// then come from the thread's own malloc arena, as a context's would,
    /// and two threads' private state never shares a cache line.
    fn stepper(self, shared: &Shared, paths: usize, thread: usize) -> Box<dyn Step> {
        match (self, shared) {
            (Subject::Baseline, _) => Box::new(Baseline { ring: Ring { slots: [PathIndex(0); DEPTH], head: 0 } }),
            (Subject::Policy(_, policy), _) => Box::new(Own::new(policy, paths, thread)),
            (_, Shared::Sum(r)) => Box::new(SumRef::new(Arc::clone(r), thread)),
            (_, Shared::Atomic(r)) => Box::new(AtomicRef::new(Arc::clone(r))),
            (_, Shared::Nothing) => unreachable!("references always share their counters"),
        }
    }
}

enum Shared {
    Nothing,
    Sum(Arc<SumPerQueue>),
    Atomic(Arc<SharedAtomic>),
}

const SUBJECTS: [Subject; 7] = [
    Subject::Baseline,
    Subject::Policy("numa", Policy::Numa),
    Subject::Policy("round_robin", Policy::ROUND_ROBIN),
    Subject::Policy("queue_depth", Policy::QueueDepth),
    Subject::Policy("latency", Policy::LATENCY),
    Subject::SumPerQueue,
    Subject::SharedAtomic,
];

fn one_thread(c: &mut Criterion) {
    let _ = pin_current_thread(0);
    let mut group = c.benchmark_group("1_thread");
    for subject in SUBJECTS {
        for paths in PATH_COUNTS {
            let mut s = subject.stepper(&subject.shared(paths), paths, 0);
            group.bench_function(BenchmarkId::new(subject.name(), paths), |b| {
                b.iter_custom(|iters| {
                    let ns = s.per_step_ns(iters, subject.chunk(paths), &Run::new(1), 0).ns;
                    black_box(&mut *s);
                    Duration::from_secs_f64(ns * 1e-9 * iters as f64)
                });
            });
        }
    }
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let cpus = online_cpus().max(1);
    let mut group = c.benchmark_group("2_threads");
    for subject in SUBJECTS {
        for paths in PATH_COUNTS {
            let mut interference = Vec::new();
            group.bench_function(BenchmarkId::new(subject.name(), paths), |b| {
                b.iter_custom(|iters| {
                    // Fresh state per sample (set up outside the timed region). Both threads
                    // start together and run until both have done `iters` steps; each one's
                    // rate is taken while the other runs; the slower rate is the figure.
                    let shared = Arc::new(subject.shared(paths));
                    let start = Arc::new(Barrier::new(THREADS));
                    let run = Arc::new(Run::new(THREADS));
                    let handles: Vec<_> = (0..THREADS)
                        .map(|t| {
                            let (start, shared, run) = (Arc::clone(&start), Arc::clone(&shared), Arc::clone(&run));
                            thread::spawn(move || {
                                let _ = pin_current_thread(t % cpus);
                                let mut s = subject.stepper(&shared, paths, t);
                                start.wait();
                                let rate = s.per_step_ns(iters, subject.chunk(paths), &run, t);
                                black_box(&mut *s);
                                rate
                            })
                        })
                        .collect();
                    let rates: Vec<Rate> = handles.into_iter().map(|h| h.join().expect("bench thread")).collect();
                    interference.extend(rates.iter().filter_map(|r| r.interference));
                    let per_step = rates.iter().map(|r| r.ns).fold(0.0, f64::max);
                    Duration::from_secs_f64(per_step * 1e-9 * iters as f64)
                });
            });
            interference.sort_by(f64::total_cmp);
            if interference.is_empty() {
                println!("  interference: no sample had enough chunks both with and without the other thread running");
            } else {
                println!(
                    "  interference: {:.2}x (time per step while the other thread runs / while it does not, \
                     same thread; median of {})",
                    median(&interference),
                    interference.len()
                );
            }
        }
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(40)
}

criterion_group! { name = benches; config = config(); targets = one_thread, two_threads }
criterion_main!(benches);
