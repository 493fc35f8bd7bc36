//! Path selection cost, measured: ns per I/O for `select + on_submit +
//! on_complete`, each policy against the two reference selectors of seed 000.
//!
//! Every thread keeps `DEPTH` I/Os in flight: one step completes its oldest
//! I/O, selects a path, and submits on it, so queue depths and counters are
//! in a steady state like a QD32 job's, not all zero. All paths are
//! optimized (the worst case for scanning selectors); completion latencies
//! differ per path (20-35 µs) so the latency policy has real weights.
//!
//! - `1_thread/<policy>/<paths>`: one thread, pinned to CPU 0.
//! - `2_threads/<policy>/<paths>`: two threads pinned to CPUs 0 and 1, each
//!   with its own `Selector` (as each context will have); the figure is the
//!   slower thread's time per step. For `ref_*` the two threads share the
//!   reference's atomics (that is what the references are), each submitting
//!   through its own hardware queue: where the seed's contention shows.
//!
//! Run: `CARGO_TARGET_DIR=/tmp/target-mpath cargo bench -p qpath-host --bench path_select`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
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

/// Something that does one I/O's worth of path selection.
trait Step: Send {
    fn step(&mut self);
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
    #[inline]
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
    #[inline]
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
    #[inline]
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
    #[inline]
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

#[derive(Clone, Copy)]
enum Subject {
    Policy(&'static str, Policy),
    SumPerQueue,
    SharedAtomic,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Policy(name, _) => name,
            Subject::SumPerQueue => "ref_sum_per_queue",
            Subject::SharedAtomic => "ref_shared_atomic",
        }
    }

    /// One stepper per thread; the references' threads share one instance.
    fn steppers(self, paths: usize, threads: usize) -> Vec<Box<dyn Step>> {
        let classes = vec![PathClass::Optimized; paths];
        match self {
            Subject::Policy(_, policy) => {
                (0..threads).map(|t| Box::new(Own::new(policy, paths, t)) as Box<dyn Step>).collect()
            }
            Subject::SumPerQueue => {
                let r = Arc::new(SumPerQueue::new(&classes, QUEUES_PER_PATH));
                (0..threads).map(|t| Box::new(SumRef::new(Arc::clone(&r), t)) as Box<dyn Step>).collect()
            }
            Subject::SharedAtomic => {
                let r = Arc::new(SharedAtomic::new(&classes));
                (0..threads).map(|_| Box::new(AtomicRef::new(Arc::clone(&r))) as Box<dyn Step>).collect()
            }
        }
    }
}

const SUBJECTS: [Subject; 6] = [
    Subject::Policy("numa", Policy::Numa),
    Subject::Policy("round_robin", Policy::ROUND_ROBIN),
    Subject::Policy("queue_depth", Policy::QueueDepth),
    Subject::Policy("latency", Policy::LATENCY),
    Subject::SumPerQueue,
    Subject::SharedAtomic,
];

/// Runs `iters` steps on one thread.
#[inline(never)]
fn run(s: &mut dyn Step, iters: u64) {
    for _ in 0..iters {
        s.step();
    }
    black_box(s);
}

fn one_thread(c: &mut Criterion) {
    let _ = pin_current_thread(0);
    let mut group = c.benchmark_group("1_thread");
    for subject in SUBJECTS {
        for paths in PATH_COUNTS {
            let mut steppers = subject.steppers(paths, 1);
            let s = &mut *steppers[0];
            group.bench_function(BenchmarkId::new(subject.name(), paths), |b| {
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    run(s, iters);
                    t.elapsed()
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
            group.bench_function(BenchmarkId::new(subject.name(), paths), |b| {
                b.iter_custom(|iters| {
                    // Fresh state per sample (set up outside the timed region); both threads
                    // start together and the slower one's time is the figure.
                    let steppers = subject.steppers(paths, 2);
                    let start = Arc::new(Barrier::new(2));
                    let handles: Vec<_> = steppers
                        .into_iter()
                        .enumerate()
                        .map(|(t, mut s)| {
                            let start = Arc::clone(&start);
                            thread::spawn(move || {
                                let _ = pin_current_thread(t % cpus);
                                start.wait();
                                let t0 = Instant::now();
                                run(&mut *s, iters);
                                t0.elapsed()
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("bench thread")).max().unwrap_or(Duration::ZERO)
                });
            });
        }
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(40)
}

criterion_group! { name = benches; config = config(); targets = one_thread, two_threads }
criterion_main!(benches);
