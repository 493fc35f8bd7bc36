//! What the reservation check costs every read and write on the target
//! (`Reservations::check`, called once per I/O command before it executes).
//!
//! - `unreserved`: nobody holds a reservation: one atomic load.
//! - `reserved_cached`: a reservation held, this connection's verdict cached: two loads
//!   and a compare.
//! - `replace_then_check` minus `replace_only`: a check right after the reservation changed
//!   locks and recomputes its verdict (what each queue's next command pays after a
//!   Register/Acquire/Release).
//! - `baseline_harness`: the loop alone, to subtract.
//! - `2_threads/*`: the same check on CPUs 0 and 1 at once, as two reactors serving one
//!   namespace do; the figure is the slower thread's time per check. Both threads only
//!   read the shared word, so the cache line is not bounced.
//!
//! - `reservation_persisted/replace`: one change with persistence through power loss on
//!   (the `ptpl_file` rewritten with two fsyncs, under the target directory's filesystem).
//!
//! Run: `cargo bench -p qpath-target --bench reservation`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use nvme::Status;
use qpath_target::reservation::{AccessCache, Group, Reservations, WRITE_EXCLUSIVE_REG_ONLY};

const HOLDER: [u8; 16] = [0xa; 16];
const OTHER: [u8; 16] = [0xb; 16];

fn keys(k1: u64, k2: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&k1.to_le_bytes());
    d[8..].copy_from_slice(&k2.to_le_bytes());
    d
}

fn reserved() -> Reservations {
    let r = Reservations::default();
    assert!(r.register(&HOLDER, 0, &keys(0, 1)).is_success());
    assert!(r.register(&OTHER, 0, &keys(0, 2)).is_success());
    assert!(r.acquire(&HOLDER, u32::from(WRITE_EXCLUSIVE_REG_ONLY) << 8, &keys(1, 0)).is_success());
    r
}

fn check(r: &Reservations, cache: &mut AccessCache) -> Result<(), Status> {
    r.check(black_box(1), black_box(&OTHER), black_box(Group::Write), cache)
}

/// Runs `iters` checks on each of two threads pinned to CPUs 0 and 1; the slower one's time.
fn two_threads(r: &Arc<Reservations>, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(2));
    let spawn = |cpu: usize| {
        let (r, start) = (Arc::clone(r), Arc::clone(&start));
        std::thread::spawn(move || {
            let _ = uring::pin_current_thread(cpu);
            let mut cache = AccessCache::default();
            start.wait();
            let t = Instant::now();
            for _ in 0..iters {
                let _ = black_box(check(&r, &mut cache));
            }
            t.elapsed()
        })
    };
    let (a, b) = (spawn(0), spawn(1));
    a.join().expect("thread 0").max(b.join().expect("thread 1"))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("reservation_check");
    let free = Reservations::default();
    let mut cache = AccessCache::default();
    g.bench_function("baseline_harness", |b| {
        b.iter(|| {
            black_box((black_box(1u32), black_box(&OTHER), black_box(Group::Write)));
            black_box(&mut cache);
        });
    });
    g.bench_function("unreserved", |b| b.iter(|| check(&free, &mut cache)));
    let held = reserved();
    let mut cache = AccessCache::default();
    assert!(check(&held, &mut cache).is_ok(), "a registrant writes under Registrants Only");
    g.bench_function("reserved_cached", |b| b.iter(|| check(&held, &mut cache)));
    // A key replace changes nothing the check depends on but the epoch, so the check after
    // it must lock and recompute: (replace + check) - (replace alone) is that check's cost.
    let mut key = 2u64;
    let mut replace = move |r: &Reservations| {
        assert!(r.register(&OTHER, 2, &keys(key, key ^ 1)).is_success());
        key ^= 1;
    };
    g.bench_function("replace_only", |b| b.iter(|| replace(&held)));
    let mut cache = AccessCache::default();
    g.bench_function("replace_then_check", |b| {
        b.iter(|| {
            replace(&held);
            check(&held, &mut cache)
        });
    });
    let free = Arc::new(Reservations::default());
    g.bench_function("2_threads/unreserved", |b| b.iter_custom(|iters| two_threads(&free, iters)));
    let held = Arc::new(reserved());
    g.bench_function("2_threads/reserved_cached", |b| b.iter_custom(|iters| two_threads(&held, iters)));
    g.finish();

    // A change with persistence through power loss on: the state file written and fsynced
    // (twice: the file, then its directory) before the command completes, on the reactor.
    let mut g = c.benchmark_group("reservation_persisted");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reservation-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let persisted = Reservations::persistent(&dir.join("ns1.resv")).expect("PTPL capable");
    assert!(persisted.register(&HOLDER, 0b11 << 30, &keys(0, 1)).is_success(), "PTPL on");
    let mut key = 1u64;
    g.bench_function("replace", |b| {
        b.iter(|| {
            assert!(persisted.register(&HOLDER, 2, &keys(key, key ^ 1)).is_success());
            key ^= 1;
        });
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
