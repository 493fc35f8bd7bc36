//! Seed 003: a busy device and a slow journal device share one tag set of
//! 170 (nr_requests 170, LUN queue depths 70 and 10). The journal writes at
//! QD3; the busy device reads at an unbounded queue depth.
//!
//! Linux SCSI allocated the tag before checking the LUN budget, so the busy
//! device could sit on all 170 tags and the journal crawled (5 MB/s against
//! 29 alone). Here the limit is enforced at allocation, so with the seed's
//! limits no policy starves; the starvation appears when the busy device
//! has no limit, and there the fair policies keep the journal at full speed.
//!
//! A seeded simulation in rounds. In a round a tenth of the busy device's
//! I/Os complete one by one, each of its 32 jobs (fio's `numjobs=32`, each
//! with a deep queue) submits all it can once, and the journal reaps and
//! submits once, all in a random order. A journal write takes two rounds.

mod common;

use blk::{SharedTagPolicy, SharedTagSet, Tag, TagUser};
use common::Rng;

const DEPTH: u16 = 170;
const ROUNDS: u64 = 20_000;
const JOURNAL_QD: usize = 3;
const JOURNAL_ROUNDS_PER_IO: u64 = 2;
const BUSY_JOBS: usize = 32;

/// Journal writes completed in `ROUNDS` rounds.
fn journal_ios(policy: SharedTagPolicy, busy_limit: Option<u16>, with_busy: bool, seed: u64) -> u64 {
    let set = SharedTagSet::new(DEPTH, policy).unwrap();
    let mut busy: TagUser = set.register_user(busy_limit).unwrap();
    let mut journal: TagUser = set.register_user(Some(10)).unwrap();
    let mut busy_tags: Vec<Tag> = Vec::new();
    let mut journal_tags: Vec<(Tag, u64)> = Vec::new();
    let mut rng = Rng::new(seed);
    let mut done = 0;
    let mut events: Vec<u8> = Vec::new();
    for round in 0..ROUNDS {
        // 0: one busy completion, 1: one busy job submits, 2: journal reaps, 3: journal submits.
        let completions = (busy_tags.len() / 10).max(1);
        events.clear();
        events.extend(std::iter::repeat_n(0u8, completions));
        events.extend(std::iter::repeat_n(1u8, BUSY_JOBS));
        events.extend([2, 3]);
        for i in (1..events.len()).rev() {
            events.swap(i, rng.below(i + 1));
        }
        for &e in &events {
            match e {
                0 if !busy_tags.is_empty() => {
                    let t = busy_tags.swap_remove(rng.below(busy_tags.len()));
                    busy.free(t);
                }
                1 if with_busy => {
                    while let Some(t) = busy.alloc() {
                        busy_tags.push(t);
                    }
                }
                2 => {
                    journal_tags.retain(|&(t, issued)| {
                        let finished = issued + JOURNAL_ROUNDS_PER_IO <= round;
                        if finished {
                            journal.free(t);
                            done += 1;
                        }
                        !finished
                    });
                }
                3 => {
                    while journal_tags.len() < JOURNAL_QD {
                        let Some(t) = journal.alloc() else { break };
                        journal_tags.push((t, round));
                    }
                }
                _ => {}
            }
        }
        if round % 4 == 3 {
            busy.tick();
            journal.tick();
        }
    }
    done
}

#[test]
fn seed_003_journal_throughput_per_policy() {
    // Alone, nothing competes for the tags: the policy makes no difference.
    let alone = journal_ios(SharedTagPolicy::Windows, None, false, 1);
    // QD3, two rounds per write, so about 1.5 writes per round when alone.
    assert!(alone > ROUNDS, "{alone}");
    for policy in common::policies() {
        let limited = journal_ios(policy, Some(70), true, 1);
        let unlimited = journal_ios(policy, None, true, 1);
        eprintln!(
            "{policy:?}: journal alone {alone}, beside a busy device with LUN depth 70: {limited}, without a limit: {unlimited}"
        );
        assert!(limited * 100 >= alone * 95, "{policy:?}: the limit alone prevents starvation");
        if common::is_unfair(policy) {
            assert!(unlimited * 100 < alone * 50, "{policy:?}: the journal starves ({unlimited} of {alone})");
        } else {
            assert!(unlimited * 100 >= alone * 95, "{policy:?}: the journal keeps its pace ({unlimited} of {alone})");
        }
    }
}
