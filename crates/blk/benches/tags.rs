//! Tag allocation and queue-map lookup, measured.
//!
//! - `tag_set/*`: a private `TagSet`: `qd1` allocates and frees one tag;
//!   `qd32` keeps 32 in flight and per iteration frees the oldest and
//!   allocates one (a queue in steady state).
//! - `shared_1_thread/{policy}/*`: the same through a `TagUser` of a 128-tag
//!   `SharedTagSet`, alone.
//! - `shared_2_threads/{policy}/qd32`: two users of one 128-tag set, each on
//!   its own thread doing the qd32 loop; the time is the measuring thread's,
//!   while the other hammers the set. `private_control` does the same with
//!   two private `TagSet`s: the cost of two busy threads on two cores
//!   sharing nothing.
//! - `queue_map/lookup`: `QueueMaps::queue` for a CPU.
//!
//! Run: `cargo bench -p blk --bench tags` (the production build: `windows` only), and
//! with `--features lab-baselines` for the `unfair` and `linux_fair` baselines too.

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use blk::{QueueMaps, QueueType, SharedTagPolicy, SharedTagSet, Tag, TagAllocator, TagSet};
use criterion::{Criterion, criterion_group, criterion_main};

const SHARED_DEPTH: u16 = 128;
const QD: usize = 32;
/// The baselines exist only with the `lab-baselines` feature (`cargo bench -p blk --bench
/// tags --features lab-baselines`); without it only `windows` is measured.
#[cfg(feature = "lab-baselines")]
const POLICIES: [(SharedTagPolicy, &str); 3] = [
    (SharedTagPolicy::Unfair, "unfair"),
    (SharedTagPolicy::LinuxFair, "linux_fair"),
    (SharedTagPolicy::Windows, "windows"),
];
#[cfg(not(feature = "lab-baselines"))]
const POLICIES: [(SharedTagPolicy, &str); 1] = [(SharedTagPolicy::Windows, "windows")];

/// Fills `ring` to `QD` tags. A second user of a shared set may have to wait
/// for the first to give back its window (on its next free), so retry a while.
fn prime<T: TagAllocator>(tags: &mut T, ring: &mut VecDeque<Tag>) {
    for _ in 0..100_000_000u64 {
        if ring.len() == QD {
            return;
        }
        match tags.alloc() {
            Some(t) => ring.push_back(t),
            None => {
                tags.tick();
                thread::yield_now();
            }
        }
    }
    panic!("could not get {QD} tags");
}

/// One steady-state step: the oldest completes, a new one goes out.
#[inline]
fn step<T: TagAllocator>(tags: &mut T, ring: &mut VecDeque<Tag>) {
    let old = ring.pop_front().expect("primed");
    tags.free(old);
    ring.push_back(black_box(tags.alloc().expect("a tag was just freed")));
}

fn tag_set(c: &mut Criterion) {
    let mut g = c.benchmark_group("tag_set");
    let mut set = TagSet::new(128).unwrap();
    g.bench_function("qd1", |b| {
        b.iter(|| {
            let t = black_box(set.alloc().unwrap());
            set.free(t);
        });
    });
    let mut ring = VecDeque::with_capacity(QD);
    prime(&mut set, &mut ring);
    g.bench_function("qd32", |b| b.iter(|| step(&mut set, &mut ring)));
    g.finish();
}

fn shared_1_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("shared_1_thread");
    for (policy, name) in POLICIES {
        let set = SharedTagSet::new(SHARED_DEPTH, policy).unwrap();
        let mut user = set.register_user(None).unwrap();
        g.bench_function(format!("{name}/qd1"), |b| {
            b.iter(|| {
                let t = black_box(user.alloc().unwrap());
                user.free(t);
            });
        });
        let mut ring = VecDeque::with_capacity(QD);
        prime(&mut user, &mut ring);
        g.bench_function(format!("{name}/qd32"), |b| b.iter(|| step(&mut user, &mut ring)));
    }
    g.finish();
}

/// Measures the qd32 step on one thread while a second thread runs it on
/// its own allocator. Each thread makes its allocator itself, as the host's
/// contexts do, so their hot memory comes from different malloc arenas.
fn two_threads<T, F>(c: &mut Criterion, name: &str, make: F)
where
    T: TagAllocator,
    F: Fn() -> T + Send + Clone + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(AtomicU64::new(0));
    let mut mine = make();
    let mut ring = VecDeque::with_capacity(QD);
    prime(&mut mine, &mut ring);
    let hammer = {
        let (stop, steps) = (Arc::clone(&stop), Arc::clone(&steps));
        let make = make.clone();
        thread::spawn(move || {
            let mut other = make();
            let mut ring = VecDeque::with_capacity(QD);
            prime(&mut other, &mut ring);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1024 {
                    step(&mut other, &mut ring);
                }
                steps.fetch_add(1024, Ordering::Relaxed);
            }
        })
    };
    // Measure only once the other thread is running; a second user of a
    // shared set may need the first one's frees to get its tags.
    for _ in 0..1_000_000_000u64 {
        if steps.load(Ordering::Relaxed) > 0 {
            break;
        }
        step(&mut mine, &mut ring);
    }
    assert!(steps.load(Ordering::Relaxed) > 0, "the other thread never ran");
    let started = (Instant::now(), steps.load(Ordering::Relaxed));
    c.bench_function(&format!("shared_2_threads/{name}/qd32"), |b| b.iter(|| step(&mut mine, &mut ring)));
    let other_steps = steps.load(Ordering::Relaxed) - started.1;
    stop.store(true, Ordering::Relaxed);
    hammer.join().expect("hammer thread");
    // How hard the other side pushed meanwhile (it shares the 2 vCPUs with everything else).
    #[allow(clippy::cast_precision_loss, reason = "a rate for people to read")]
    let rate = other_steps as f64 / started.0.elapsed().as_secs_f64() / 1e6;
    eprintln!("shared_2_threads/{name}: the other thread did {rate:.1} M steps/s meanwhile");
}

fn shared_2_threads(c: &mut Criterion) {
    // The control: two private tag sets, nothing shared but the machine.
    two_threads(c, "private_control", || TagSet::new(SHARED_DEPTH).unwrap());
    for (policy, name) in POLICIES {
        let set = SharedTagSet::new(SHARED_DEPTH, policy).unwrap();
        two_threads(c, name, move || set.register_user(None).unwrap());
    }
}

fn queue_map(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue_map");
    let maps = QueueMaps::new(64, 16, 8, 4).unwrap();
    let mut cpu = 0usize;
    g.bench_function("lookup", |b| {
        b.iter(|| {
            cpu = (cpu + 1) & 63;
            black_box(maps.queue(QueueType::Read, black_box(cpu)))
        });
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = tag_set, shared_1_thread, shared_2_threads, queue_map }
criterion_main!(benches);
