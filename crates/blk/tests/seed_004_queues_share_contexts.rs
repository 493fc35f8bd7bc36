//! Seed 004: more hardware queues than completion vectors. Here a vector is
//! a thread (a completion context): 4 CPUs submit on 4 queues (one each,
//! from the queue map), and 2 context threads drive them, 2 queues each.
//! The maps must send every CPU's queue to exactly one context, and give
//! each context an even share. (The host's contexts that run on these maps
//! are tested end to end in `crates/qpath/tests/spread_queues.rs`.)

use blk::{ContextId, ContextMap, ContextSpread, QueueMaps, QueueType};

const CPUS: usize = 4;
const QUEUES: u16 = 4;
const CONTEXTS: u16 = 2;

fn run(spread: ContextSpread) {
    let maps = QueueMaps::new(CPUS, QUEUES, 0, 0).unwrap();
    let cmap = ContextMap::new(QUEUES, CONTEXTS, spread).unwrap();
    let mut driven = vec![0usize; usize::from(CONTEXTS)];
    for cpu in 0..CPUS {
        let q = maps.queue(QueueType::Default, cpu);
        let c = cmap.context_of(q).expect("every queue has a context");
        assert!(cmap.queues_of(c).contains(&q), "{spread:?}: context {c} holds CPU {cpu}'s queue");
        driven[usize::from(c.0)] += 1;
    }
    assert_eq!(driven, vec![2, 2], "{spread:?}: two CPUs' queues per context");
    for c in 0..CONTEXTS {
        assert_eq!(cmap.queues_of(ContextId(c)).len(), 2, "{spread:?}: context {c} drives 2 queues");
    }
}

#[test]
fn seed_004_four_queues_on_two_contexts_contiguous() {
    run(ContextSpread::Contiguous);
}

#[test]
fn seed_004_four_queues_on_two_contexts_round_robin() {
    run(ContextSpread::RoundRobin);
}
