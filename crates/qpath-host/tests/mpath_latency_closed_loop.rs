//! The latency policy in a closed loop, as a job at a fixed queue depth drives it: a
//! fixed number of I/Os is always in flight, and each completion is followed at once
//! by the next submission. One path is much slower than the other (issue 4's
//! acceptance 4: one path delayed by the target). The latency policy must keep fewer
//! of the slots waiting on the slow path than queue-depth does, and so complete at
//! least as many I/Os in the same time; round-robin is the worst of the three.
//!
//! Simulated time, fixed per-path service times: no I/O, no clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use qpath_host::mpath::{Outcome, PathClass, PathIndex, PathState, Policy, Selection, Selector};

/// I/Os in flight at all times (one job thread at iodepth 32).
const DEPTH: usize = 32;
/// Simulated time each run covers, ns.
const HORIZON_NS: u64 = 200_000_000;

/// What a closed-loop run did: completions per path, and the time-averaged number of
/// I/Os in flight on the slow path (path 1).
struct Run {
    completions: [u64; 2],
    slow_in_flight_mean: f64,
}

fn run(policy: Policy, service_ns: [u64; 2]) -> Run {
    let mut sel = Selector::new(policy, 0);
    sel.set_paths(&[PathState::new(1, PathClass::Optimized), PathState::new(2, PathClass::Optimized)]);
    let mut pending: BinaryHeap<Reverse<(u64, u64, u16)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut submit = |sel: &mut Selector, pending: &mut BinaryHeap<Reverse<(u64, u64, u16)>>, now: u64| {
        let Selection::Submit(p) = sel.select() else { panic!("both paths are usable") };
        sel.on_submit(p);
        seq += 1;
        pending.push(Reverse((now + service_ns[p.get()], seq, p.0)));
    };
    for _ in 0..DEPTH {
        submit(&mut sel, &mut pending, 0);
    }
    let mut completions = [0u64; 2];
    // The slow path's in-flight count integrated over time (count × ns).
    let (mut slow_area, mut last) = (0u128, 0u64);
    while let Some(Reverse((now, _, p))) = pending.pop() {
        if now > HORIZON_NS {
            break;
        }
        slow_area += u128::from(sel.in_flight(PathIndex(1))) * u128::from(now - last);
        last = now;
        sel.on_complete(PathIndex(p), service_ns[usize::from(p)], Outcome::Done);
        completions[usize::from(p)] += 1;
        submit(&mut sel, &mut pending, now);
    }
    #[allow(clippy::cast_precision_loss)]
    let slow_in_flight_mean = slow_area as f64 / last.max(1) as f64;
    Run { completions, slow_in_flight_mean }
}

#[test]
fn latency_keeps_fewer_slots_on_a_slow_path_than_queue_depth_and_completes_more() {
    // Path 0: 100 us per I/O; path 1: 100 us + the lab's 2 ms delay.
    let service = [100_000, 2_100_000];
    let rr = run(Policy::ROUND_ROBIN, service);
    let qd = run(Policy::QueueDepth, service);
    let lat = run(Policy::LATENCY, service);
    let total = |r: &Run| r.completions.iter().sum::<u64>();
    // Queue-depth evens out in-flight counts: half the slots wait on the slow path.
    assert!(
        (f64::from(u32::try_from(DEPTH).unwrap()) / 2.0 - qd.slow_in_flight_mean).abs() < 1.5,
        "queue-depth: {}",
        qd.slow_in_flight_mean
    );
    // Latency gives a path 21x slower only its probe, 1 I/O in a round of 65; each holds
    // its slot 21x longer, so about a quarter of the slots: half of queue-depth's.
    assert!(
        lat.slow_in_flight_mean < qd.slow_in_flight_mean * 0.6,
        "latency: {} of {DEPTH} slots on the slow path, queue-depth {}",
        lat.slow_in_flight_mean,
        qd.slow_in_flight_mean
    );
    assert!(lat.completions[1] > 0, "the slow path is still probed");
    assert!(total(&lat) >= total(&qd), "latency {} vs queue-depth {}", total(&lat), total(&qd));
    assert!(total(&qd) > total(&rr), "queue-depth {} vs round-robin {}", total(&qd), total(&rr));
}

#[test]
fn latency_slot_shares_follow_the_inverse_latency_when_paths_are_close() {
    // Path 1 is 2x slower: it should hold about a third of the slots (1/2 : 1), not half.
    let lat = run(Policy::LATENCY, [100_000, 200_000]);
    let share = lat.slow_in_flight_mean / f64::from(u32::try_from(DEPTH).unwrap());
    assert!((0.25..=0.42).contains(&share), "slow path's share of the slots: {share}");
    let total = lat.completions.iter().sum::<u64>();
    let qd = run(Policy::QueueDepth, [100_000, 200_000]);
    assert!(total >= qd.completions.iter().sum::<u64>(), "latency {total} vs queue-depth {:?}", qd.completions);
}

#[test]
fn latency_never_piles_more_in_flight_on_a_path_than_on_the_fastest() {
    // Both paths measured equal, then path 1's I/Os stop completing (a stall the
    // estimate cannot see: no completion, no sample). Its weight stays full, but it may
    // not hold more of the thread's I/Os than the fastest path does.
    let mut sel = Selector::new(Policy::LATENCY, 0);
    sel.set_paths(&[PathState::new(1, PathClass::Optimized), PathState::new(2, PathClass::Optimized)]);
    for _ in 0..1_000 {
        let Selection::Submit(p) = sel.select() else { panic!("both paths are usable") };
        sel.on_submit(p);
        sel.on_complete(p, 100_000, Outcome::Done);
    }
    let mut stuck = 0;
    for _ in 0..1_000 {
        let Selection::Submit(p) = sel.select() else { panic!("both paths are usable") };
        sel.on_submit(p);
        if p == PathIndex(0) {
            sel.on_complete(p, 100_000, Outcome::Done);
        } else {
            stuck += 1;
        }
    }
    assert_eq!(sel.in_flight(PathIndex(1)), stuck);
    assert!(stuck <= 1, "{stuck} I/Os piled on the stalled path");
}
