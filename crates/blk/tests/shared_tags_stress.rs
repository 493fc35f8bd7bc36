//! Shared tag sets under real threads: three users on three threads (two
//! busy, one light), a fixed number of operations each. A table of claim
//! flags, one per tag, catches a tag handed to two users at once; a global
//! counter catches more than D in flight. Bounded by operation counts, not
//! time.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use blk::{SharedTagOptions, SharedTagSet, Tag, TagUser};
use common::Rng;

const DEPTH: u16 = 64;
const BUSY_OPS: usize = 200_000;
const LIGHT_COMPLETIONS: usize = 20_000;
/// Failed allocations the light user may see before the test calls it stuck.
const LIGHT_ATTEMPTS_MAX: usize = 200_000_000;

struct Checker {
    claimed: Vec<AtomicBool>,
    in_flight: AtomicU32,
    in_flight_max: AtomicU32,
}

impl Checker {
    fn alloc(&self, t: Tag) {
        assert!(!self.claimed[t.index()].swap(true, Ordering::AcqRel), "{t} handed to two users at once");
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.in_flight_max.fetch_max(now, Ordering::Relaxed);
    }

    fn free(&self, t: Tag) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(self.claimed[t.index()].swap(false, Ordering::AcqRel), "{t} freed but not claimed");
    }
}

fn busy(mut user: TagUser, check: &Checker, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut tags: Vec<Tag> = Vec::with_capacity(usize::from(DEPTH));
    let mut want = usize::from(DEPTH);
    for op in 0..BUSY_OPS {
        if op % 1_000 == 0 {
            want = rng.below(usize::from(DEPTH)) + 1;
        }
        if tags.len() < want && rng.chance(3, 5) {
            if let Some(t) = user.alloc() {
                check.alloc(t);
                tags.push(t);
            }
        } else if !tags.is_empty() {
            let t = tags.swap_remove(rng.below(tags.len()));
            check.free(t);
            user.free(t);
        }
        if op % 64 == 0 {
            user.tick();
        }
    }
    for t in tags {
        check.free(t);
        user.free(t);
    }
}

fn light(mut user: TagUser, check: &Checker) -> usize {
    let mut completed = 0;
    let mut attempts = 0;
    let mut tags: Vec<Tag> = Vec::with_capacity(4);
    while completed < LIGHT_COMPLETIONS {
        while tags.len() < 4 {
            match user.alloc() {
                Some(t) => {
                    check.alloc(t);
                    tags.push(t);
                }
                None => {
                    attempts += 1;
                    assert!(attempts < LIGHT_ATTEMPTS_MAX, "light user stuck: {completed} completions");
                    user.tick();
                    thread::yield_now();
                    break;
                }
            }
        }
        if let Some(t) = tags.pop() {
            check.free(t);
            user.free(t);
            completed += 1;
        }
    }
    for t in tags {
        check.free(t);
        user.free(t);
    }
    attempts
}

#[test]
fn three_threads_never_share_a_tag_or_exceed_the_depth() {
    for policy in common::policies() {
        let options = SharedTagOptions { batch_max: 8, idle_ticks: 2 };
        let set = SharedTagSet::with_options(DEPTH, policy, options).unwrap();
        let check = Arc::new(Checker {
            claimed: (0..DEPTH).map(|_| AtomicBool::new(false)).collect(),
            in_flight: AtomicU32::new(0),
            in_flight_max: AtomicU32::new(0),
        });
        let start = Arc::new(Barrier::new(3));
        let mut handles = Vec::new();
        for seed in 0..2u64 {
            let (user, check, start) = (set.register_user(None).unwrap(), Arc::clone(&check), Arc::clone(&start));
            handles.push(thread::spawn(move || {
                start.wait();
                busy(user, &check, seed);
                0
            }));
        }
        let (user, check2, start2) = (set.register_user(Some(4)).unwrap(), Arc::clone(&check), Arc::clone(&start));
        handles.push(thread::spawn(move || {
            start2.wait();
            light(user, &check2)
        }));
        let results: Vec<usize> = handles.into_iter().map(|h| h.join().expect("no thread panicked")).collect();
        assert!(check.in_flight_max.load(Ordering::Relaxed) <= u32::from(DEPTH), "{policy:?}");
        assert_eq!(check.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(set.pooled(), u32::from(DEPTH), "{policy:?}: every tag back in the pool");
        assert_eq!(set.users(), 0);
        eprintln!(
            "{policy:?}: in flight at most {}, light user's failed attempts {}",
            check.in_flight_max.load(Ordering::Relaxed),
            results[2]
        );
    }
}
