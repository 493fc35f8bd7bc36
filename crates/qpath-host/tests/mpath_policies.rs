//! Path selection policies, each on its own: pure selectors driven by
//! scripted or seeded-random sequences of select / submit / complete /
//! path-set changes, checked against brute-force oracles. No I/O, no timing.

use qpath_host::mpath::{LatencyParams, Outcome, PathClass, PathIndex, PathState, Policy, Selection, Selector};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use PathClass::{Gone, NonOptimized, Optimized, Transient};

/// Every policy, in the variants worth testing.
fn policies() -> [Policy; 5] {
    [Policy::Numa, Policy::ROUND_ROBIN, Policy::RoundRobin { rr_min_io: 4 }, Policy::QueueDepth, Policy::LATENCY]
}

fn states(classes: &[PathClass]) -> Vec<PathState> {
    classes.iter().enumerate().map(|(i, &c)| PathState::new(i as u64 + 1, c)).collect()
}

fn selector(policy: Policy, thread_index: usize, classes: &[PathClass]) -> Selector {
    let mut s = Selector::new(policy, thread_index);
    s.set_paths(&states(classes));
    s
}

fn submit(sel: &mut Selector) -> PathIndex {
    match sel.select() {
        Selection::Submit(p) => {
            sel.on_submit(p);
            p
        }
        other => panic!("{:?}: expected a path, got {other:?}", sel.policy()),
    }
}

/// The oracle for every policy: the usable paths of the best class present.
fn oracle_tier(classes: &[PathClass]) -> Vec<usize> {
    let best = classes.iter().copied().filter(|c| matches!(c, Optimized | NonOptimized)).min();
    (0..classes.len()).filter(|&i| Some(classes[i]) == best).collect()
}

fn random_classes(rng: &mut SmallRng, n: usize) -> Vec<PathClass> {
    (0..n).map(|_| [Optimized, NonOptimized, Transient, Gone][rng.random_range(0..4)]).collect()
}

#[test]
fn optimized_paths_beat_non_optimized_ones_under_every_policy() {
    let classes = [NonOptimized, Optimized, NonOptimized, Optimized, NonOptimized];
    for policy in policies() {
        for thread in 0..3 {
            let mut sel = selector(policy, thread, &classes);
            let mut outstanding = Vec::new();
            for i in 0..2000u64 {
                let p = submit(&mut sel);
                assert_eq!(classes[p.get()], Optimized, "{policy:?} thread {thread} picked {p:?}");
                outstanding.push(p);
                if i % 3 != 0 {
                    let q = outstanding.swap_remove(0);
                    sel.on_complete(q, 10_000 + i % 7 * 1000, Outcome::Done);
                }
            }
        }
    }
}

#[test]
fn non_optimized_paths_serve_when_no_optimized_path_is_usable() {
    let classes = [Transient, NonOptimized, Gone, NonOptimized];
    for policy in policies() {
        let mut sel = selector(policy, 1, &classes);
        for _ in 0..500 {
            let p = submit(&mut sel);
            assert!(matches!(p.get(), 1 | 3), "{policy:?} picked {p:?}");
            sel.on_complete(p, 20_000, Outcome::Done);
        }
    }
}

#[test]
fn unusable_paths_are_never_chosen_as_classes_change_at_random() {
    let mut rng = SmallRng::seed_from_u64(0x5eed_0001);
    for policy in policies() {
        let mut sel = Selector::new(policy, rng.random_range(0..8));
        let mut classes = random_classes(&mut rng, 6);
        sel.set_paths(&states(&classes));
        let mut outstanding: Vec<PathIndex> = Vec::new();
        for step in 0..20_000 {
            if step % 250 == 0 {
                let n = rng.random_range(1..=8);
                classes = random_classes(&mut rng, n);
                sel.set_paths(&states(&classes));
            }
            let tier = oracle_tier(&classes);
            match sel.select() {
                Selection::Submit(p) => {
                    assert!(tier.contains(&p.get()), "{policy:?}: picked {p:?} of {classes:?}");
                    sel.on_submit(p);
                    outstanding.push(p);
                }
                other => assert!(tier.is_empty(), "{policy:?}: {other:?} with tier {tier:?}"),
            }
            if !outstanding.is_empty() && rng.random_bool(0.5) {
                let q = outstanding.swap_remove(rng.random_range(0..outstanding.len()));
                sel.on_complete(q, rng.random_range(5_000..50_000), Outcome::Done);
            }
        }
    }
}

#[test]
fn requeue_while_a_path_may_come_back_and_fail_when_none_can() {
    for policy in policies() {
        let mut sel = selector(policy, 0, &[Gone, Transient, Gone]);
        assert_eq!(sel.select(), Selection::Requeue, "{policy:?}: ANA change or reconnecting");
        sel.set_paths(&states(&[Gone, Gone, Gone]));
        assert_eq!(sel.select(), Selection::Fail, "{policy:?}: every path gone for good");
        sel.set_paths(&states(&[Gone, Transient, Optimized]));
        assert_eq!(sel.select(), Selection::Submit(PathIndex(2)), "{policy:?}: a path is back");
        sel.set_paths(&[]);
        assert_eq!(sel.select(), Selection::Fail, "{policy:?}: no path at all");
        assert_eq!(Selector::new(policy, 0).select(), Selection::Fail, "{policy:?}: before any path set");
    }
}

#[test]
fn round_robin_sends_rr_min_io_ios_per_path_in_turn() {
    let classes = [Optimized, NonOptimized, Optimized, Optimized, Transient];
    for rr_min_io in [1u32, 3, 8] {
        let mut sel = selector(Policy::RoundRobin { rr_min_io }, 0, &classes);
        let picks: Vec<usize> = (0..rr_min_io as usize * 9).map(|_| submit(&mut sel).get()).collect();
        let expected: Vec<usize> = [0, 2, 3]
            .iter()
            .cycle()
            .flat_map(|&p| std::iter::repeat_n(p, rr_min_io as usize))
            .take(picks.len())
            .collect();
        assert_eq!(picks, expected, "rr_min_io {rr_min_io}");
    }
}

#[test]
fn round_robin_zero_min_io_switches_every_io_and_threads_start_apart() {
    let classes = [Optimized; 4];
    let mut a = selector(Policy::RoundRobin { rr_min_io: 0 }, 0, &classes);
    let mut b = selector(Policy::RoundRobin { rr_min_io: 0 }, 1, &classes);
    let pa: Vec<usize> = (0..6).map(|_| submit(&mut a).get()).collect();
    let pb: Vec<usize> = (0..6).map(|_| submit(&mut b).get()).collect();
    assert_eq!(pa, [0, 1, 2, 3, 0, 1]);
    assert_eq!(pb, [1, 2, 3, 0, 1, 2]);
}

#[test]
fn numa_keeps_one_path_per_thread_until_it_becomes_unusable() {
    let classes = [Optimized, NonOptimized, Optimized, Optimized];
    let picks: Vec<usize> = (0..3).map(|t| submit(&mut selector(Policy::Numa, t, &classes)).get()).collect();
    assert_eq!(picks, [0, 2, 3], "threads spread over the optimized paths");

    let mut sel = selector(Policy::Numa, 1, &classes);
    assert!((0..100).all(|_| submit(&mut sel) == PathIndex(2)));
    // Another path changing does not move the thread.
    sel.set_paths(&states(&[Transient, NonOptimized, Optimized, Optimized]));
    assert!((0..100).all(|_| submit(&mut sel) == PathIndex(2)));
    // Its own path going away does.
    sel.set_paths(&states(&[Optimized, NonOptimized, Transient, Optimized]));
    let p = submit(&mut sel);
    assert!(matches!(p.get(), 0 | 3));
    assert!((0..100).all(|_| submit(&mut sel) == p), "the new path is kept in turn");
}

#[test]
fn numa_leaves_a_non_optimized_path_when_an_optimized_one_returns() {
    let mut sel = selector(Policy::Numa, 0, &[Transient, NonOptimized]);
    assert_eq!(submit(&mut sel), PathIndex(1));
    sel.set_paths(&states(&[Optimized, NonOptimized]));
    assert_eq!(submit(&mut sel), PathIndex(0));
}

#[test]
fn queue_depth_picks_a_least_loaded_path_in_random_sequences() {
    // Property test: after any sequence of submissions (on the chosen path
    // or, as retries do, on another usable one), completions in any order
    // and path-set changes, the chosen path has the fewest of this thread's
    // I/Os in flight among the tier.
    for seed in 0..20usize {
        let mut rng = SmallRng::seed_from_u64(0x9d_0000 + seed as u64);
        let n = rng.random_range(1..=70);
        let mut classes = random_classes(&mut rng, n);
        let mut sel = selector(Policy::QueueDepth, seed, &classes);
        let mut count = vec![0u32; classes.len()];
        let mut outstanding: Vec<PathIndex> = Vec::new();
        for step in 0..5_000 {
            if rng.random_ratio(1, 400) {
                let n = rng.random_range(1..=70);
                classes = random_classes(&mut rng, n);
                sel.set_paths(&states(&classes));
                // Slots left off are gone, but their I/O still completes and is counted.
                count.resize(count.len().max(n), 0);
            }
            let tier = oracle_tier(&classes);
            let depth_target = rng.random_range(0..200);
            if outstanding.len() < depth_target || outstanding.is_empty() {
                match sel.select() {
                    Selection::Submit(p) => {
                        let min = tier.iter().map(|&i| count[i]).min().expect("a path was chosen, so the tier has one");
                        assert_eq!(count[p.get()], min, "seed {seed} step {step}: {p:?} not least loaded in {tier:?}");
                        // Now and then the I/O goes elsewhere (a retry on another usable path).
                        let p = if rng.random_ratio(1, 10) {
                            let usable: Vec<usize> = (0..classes.len())
                                .filter(|&i| matches!(classes[i], Optimized | NonOptimized))
                                .collect();
                            PathIndex(u16::try_from(usable[rng.random_range(0..usable.len())]).unwrap())
                        } else {
                            p
                        };
                        sel.on_submit(p);
                        count[p.get()] += 1;
                        outstanding.push(p);
                    }
                    other => assert!(tier.is_empty(), "seed {seed}: {other:?} with tier {tier:?}"),
                }
            } else {
                let q = outstanding.swap_remove(rng.random_range(0..outstanding.len()));
                sel.on_complete(q, 1_000, Outcome::Done);
                count[q.get()] -= 1;
            }
            for (i, &c) in count.iter().enumerate() {
                assert_eq!(sel.in_flight(PathIndex(u16::try_from(i).unwrap())), c, "seed {seed} step {step}: path {i}");
            }
        }
    }
}

#[test]
fn queue_depth_round_robins_at_queue_depth_one() {
    // Per-thread counts are all zero at every selection at QD1: ties must
    // rotate, not pin the thread to one path.
    let mut sel = selector(Policy::QueueDepth, 0, &[Optimized, Optimized, NonOptimized, Optimized]);
    let picks: Vec<usize> = (0..6)
        .map(|_| {
            let p = submit(&mut sel);
            sel.on_complete(p, 10_000, Outcome::Done);
            p.get()
        })
        .collect();
    assert_eq!(picks, [0, 1, 3, 0, 1, 3]);
}

#[test]
fn queue_depth_beyond_the_exact_depth_still_balances() {
    // Past 255 in flight per path, paths share a saturated bucket and are used in turn.
    let mut sel = selector(Policy::QueueDepth, 0, &[Optimized, Optimized]);
    for _ in 0..2000 {
        submit(&mut sel);
    }
    let (a, b) = (sel.in_flight(PathIndex(0)), sel.in_flight(PathIndex(1)));
    assert_eq!(a + b, 2000);
    assert!(a.abs_diff(b) <= 1, "{a} vs {b}");
    for _ in 0..1990 {
        sel.on_complete(PathIndex(0), 1, Outcome::Done);
        if sel.in_flight(PathIndex(0)) == 5 {
            break;
        }
    }
    assert_eq!(sel.in_flight(PathIndex(0)), 5);
    assert!((0..100).all(|_| submit(&mut sel) == PathIndex(0)), "the drained path refills first");
}

/// A closed-loop simulation at queue depth 1: each I/O completes with its
/// path's current latency before the next is selected. Returns the picks.
fn run_latency(sel: &mut Selector, latency_ns: &[u64], ios: usize) -> Vec<usize> {
    (0..ios)
        .map(|_| {
            let p = submit(sel);
            sel.on_complete(p, latency_ns[p.get()], Outcome::Done);
            p.get()
        })
        .collect()
}

fn share(picks: &[usize], path: usize) -> f64 {
    picks.iter().filter(|&&p| p == path).count() as f64 / picks.len() as f64
}

#[test]
fn latency_shifts_traffic_away_from_a_slow_path_and_back_when_it_recovers() {
    let mut sel = selector(Policy::LATENCY, 0, &[Optimized, Optimized, NonOptimized]);
    let picks = run_latency(&mut sel, &[100_000, 100_000, 10_000], 4_000);
    let even = share(&picks[2_000..], 1);
    assert!((0.45..=0.55).contains(&even), "equal paths share evenly: {even}");
    assert!(!picks.contains(&2), "the fast non-optimized path is never used");

    // Path 1 becomes 10× slower: weight 64 / 10² rounds to the minimum 1, its probe: 1/65 of the traffic.
    let picks = run_latency(&mut sel, &[100_000, 1_000_000, 10_000], 4_000);
    let slow = share(&picks[2_000..], 1);
    assert!(slow < 0.15, "the slow path keeps only probes: {slow}");
    assert!(slow > 0.0, "the slow path is still probed");
    assert_eq!(sel.latency_weight(PathIndex(0)), Some(64));
    assert_eq!(sel.latency_weight(PathIndex(1)), Some(1));

    // It recovers: the probes see it and its share comes back.
    let picks = run_latency(&mut sel, &[100_000, 100_000, 10_000], 4_000);
    let back = share(&picks[2_000..], 1);
    assert!((0.45..=0.55).contains(&back), "the recovered path earns its share back: {back}");
}

#[test]
fn latency_weights_follow_the_latency_ratio() {
    let mut sel = selector(Policy::LATENCY, 0, &[Optimized; 3]);
    let picks = run_latency(&mut sel, &[50_000, 100_000, 200_000], 20_000);
    let tail = &picks[10_000..];
    // Weights 64 × (best / latency)²: 64, 16, 4, shares 16/21, 4/21, 1/21.
    for (p, want) in [(0, 16.0 / 21.0), (1, 4.0 / 21.0), (2, 1.0 / 21.0)] {
        let got = share(tail, p);
        assert!((got - want).abs() < 0.02, "path {p}: {got} vs {want}");
    }
}

#[test]
fn latency_failing_path_loses_its_weight() {
    let mut sel = selector(Policy::LATENCY, 0, &[Optimized, Optimized]);
    run_latency(&mut sel, &[100_000, 100_000], 1_000);
    // Path 0's I/Os now fail fast: fast errors must not attract traffic.
    let picks: Vec<usize> = (0..4_000)
        .map(|_| {
            let p = submit(&mut sel);
            let outcome = if p == PathIndex(0) { Outcome::PathError } else { Outcome::Done };
            sel.on_complete(p, if p == PathIndex(0) { 1_000 } else { 100_000 }, outcome);
            p.get()
        })
        .collect();
    assert!(share(&picks[2_000..], 0) < 0.05, "failing path share {}", share(&picks[2_000..], 0));
}

#[test]
fn latency_probes_a_new_path_and_spreads_in_a_round() {
    let mut sel = selector(Policy::LATENCY, 0, &[Optimized, Optimized]);
    run_latency(&mut sel, &[100_000, 100_000], 1_000);
    let mut classes = states(&[Optimized, Optimized]);
    classes.push(PathState::new(99, Optimized));
    sel.set_paths(&classes);
    let picks = run_latency(&mut sel, &[100_000, 100_000, 100_000], 3 * 64 * 4);
    assert!(share(&picks, 2) > 0.25, "the new path is used at once: {}", share(&picks, 2));
    // Interleaved, not in bursts: no path runs more than one pass of the round in a row.
    let longest = picks.chunk_by(|a, b| a == b).map(<[usize]>::len).max().unwrap_or(0);
    assert!(longest <= 2, "longest run on one path: {longest}");
}

#[test]
fn latency_forgets_a_stale_path_and_probes_it_again() {
    let params = LatencyParams { stale_after_ios: 500, ..LatencyParams::DEFAULT };
    let mut sel = selector(Policy::Latency(params), 0, &[Optimized, Optimized]);
    run_latency(&mut sel, &[100_000, 1_000_000], 2_000);
    assert!(sel.latency_weight(PathIndex(1)).is_some_and(|w| w < 10));
    // Path 1 leaves the tier for a long time, then comes back: its old estimate is not trusted.
    sel.set_paths(&states(&[Optimized, Transient]));
    run_latency(&mut sel, &[100_000, 1_000_000], 2_000);
    sel.set_paths(&states(&[Optimized, Optimized]));
    assert_eq!(sel.latency_weight(PathIndex(1)), Some(64), "stale and idle: probed at full weight");
    assert_eq!(sel.latency_ewma_ns(PathIndex(1)), None);
}

#[test]
fn path_set_changes_mid_stream_keep_counts_and_tiers_right() {
    for policy in policies() {
        let mut sel = selector(policy, 0, &[Optimized, Optimized, NonOptimized]);
        let mut outstanding: Vec<PathIndex> = (0..12).map(|_| submit(&mut sel)).collect();
        let on = |o: &[PathIndex], p: u16| o.iter().filter(|&&q| q == PathIndex(p)).count();
        let on = |o: &[PathIndex], p: u16| u32::try_from(on(o, p)).unwrap();
        // Path 1 goes away and a new optimized path is appended, with I/O in flight.
        let mut paths = states(&[Optimized, Gone, NonOptimized]);
        paths.push(PathState::new(40, Optimized));
        sel.set_paths(&paths);
        assert_eq!(
            sel.in_flight(PathIndex(1)),
            on(&outstanding, 1),
            "{policy:?}: I/O on a removed path is still counted"
        );
        for _ in 0..200 {
            let p = submit(&mut sel);
            assert!(matches!(p.get(), 0 | 3), "{policy:?} picked {p:?}");
            outstanding.push(p);
            let q = outstanding.remove(0);
            sel.on_complete(q, 30_000, Outcome::Done);
        }
        for p in 0..4u16 {
            assert_eq!(sel.in_flight(PathIndex(p)), on(&outstanding, p), "{policy:?}: path {p}");
        }
        // Shrink below outstanding I/O: the dropped slots are gone but their I/O is still counted.
        sel.set_paths(&states(&[NonOptimized]));
        assert_eq!(sel.paths(), 1);
        assert_eq!(submit(&mut sel), PathIndex(0), "{policy:?}");
        outstanding.push(PathIndex(0));
        for q in outstanding.drain(..) {
            sel.on_complete(q, 30_000, Outcome::Done);
        }
        for p in 0..4u16 {
            assert_eq!(sel.in_flight(PathIndex(p)), 0, "{policy:?}: path {p}");
        }
    }
}

#[test]
fn switching_policy_with_io_in_flight_keeps_exact_counts() {
    let classes = [Optimized, Optimized, Optimized];
    let mut sel = selector(Policy::Numa, 0, &classes);
    let outstanding: Vec<PathIndex> = (0..10).map(|_| submit(&mut sel)).collect();
    assert!(outstanding.iter().all(|&p| p == PathIndex(0)));
    sel.set_policy(Policy::QueueDepth);
    assert_eq!(sel.policy(), Policy::QueueDepth);
    // Paths 1 and 2 are idle; path 0 has 10 in flight from before the switch.
    let picks: Vec<usize> = (0..20).map(|_| submit(&mut sel).get()).collect();
    assert_eq!(picks.iter().filter(|&&p| p == 0).count(), 0);
    for p in outstanding {
        sel.on_complete(p, 1, Outcome::Done);
    }
    assert_eq!(sel.in_flight(PathIndex(0)), 0);
    assert_eq!(submit(&mut sel), PathIndex(0), "the drained path is least loaded again");
}
