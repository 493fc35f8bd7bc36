//! What the range-lock gate costs a write on the target (`RangeLocks::write_begin` and
//! `end`, once per Write, Write Zeroes, DSM deallocate and Copy destination; see
//! `crate::range_lock`).
//!
//! - `fast_path`: no fused operation active on the namespace: a gauge increment, a load,
//!   a gauge decrement.
//! - `baseline_harness`: the loop alone, to subtract.
//! - `2_threads/fast_path`: the same on CPUs 0 and 1 at once, two reactors' gauges of one
//!   namespace (separate cache lines: nothing bounces); the slower thread's time per write.
//! - `slow_path_lock_elsewhere`: while a fused operation holds other blocks of the
//!   namespace, a write registers its range under the mutex (only then).
//!
//! The whole write through a connection is `write_path` (`--bench write_path`).
//!
//! Run: `cargo bench -p qpath-target --bench range_lock`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use qpath_target::range_lock::RangeLocks;

fn write(l: &RangeLocks, shard: usize) {
    let (hold, granted) = l.write_begin(black_box(shard), black_box(8..16));
    debug_assert!(granted);
    l.end(black_box(hold));
}

/// Runs `iters` gated writes on each of two threads pinned to CPUs 0 and 1 (gauges 0 and
/// 1 of one namespace); the slower one's time.
fn two_threads(l: &Arc<RangeLocks>, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(2));
    let spawn = |cpu: usize| {
        let (l, start) = (Arc::clone(l), Arc::clone(&start));
        std::thread::spawn(move || {
            let _ = uring::pin_current_thread(cpu);
            start.wait();
            let t = Instant::now();
            for _ in 0..iters {
                write(&l, cpu);
            }
            t.elapsed()
        })
    };
    let (a, b) = (spawn(0), spawn(1));
    a.join().expect("thread 0").max(b.join().expect("thread 1"))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("range_lock_write_gate");
    let l = RangeLocks::default();
    g.bench_function("baseline_harness", |b| {
        b.iter(|| {
            black_box((black_box(0usize), black_box(8u64..16)));
            black_box(&l);
        });
    });
    g.bench_function("fast_path", |b| b.iter(|| write(&l, 0)));
    let shared = Arc::new(RangeLocks::default());
    g.bench_function("2_threads/fast_path", |b| b.iter_custom(|iters| two_threads(&shared, iters)));
    let (lock, granted) = l.lock_begin(1000..1008);
    assert!(granted);
    g.bench_function("slow_path_lock_elsewhere", |b| b.iter(|| write(&l, 0)));
    l.end(lock);
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
