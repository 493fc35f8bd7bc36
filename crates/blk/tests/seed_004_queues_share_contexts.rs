//! Seed 004: more hardware queues than completion vectors. Here a vector is
//! a thread (a completion context): 4 CPUs submit on 4 queues (one each,
//! from the queue map), and 2 context threads drive them, 2 queues each.
//! Every I/O completes on the context that drives its queue; each context
//! polls only its own queues, and only while they have work.

use std::thread;

use blk::{
    CompletionContext, ContextId, ContextMap, ContextSpread, IoSpec, NullQueue, QueueMaps, QueueTags, QueueType, TagSet,
};

const CPUS: usize = 4;
const QUEUES: u16 = 4;
const CONTEXTS: u16 = 2;
const IOS_PER_CPU: u64 = 20_000;
const QD_PER_CPU: u64 = 16;

/// What a context thread reports: I/Os completed per CPU, and (queue, polls) per queue it drove.
struct Report {
    completed: Vec<u64>,
    polls: Vec<(u16, u64)>,
}

/// Runs one context on its own thread: submits for the CPUs whose queue it
/// drives and reaps.
fn run_context(maps: &QueueMaps, cmap: &ContextMap, id: ContextId) -> Report {
    let mut ctx: CompletionContext<NullQueue, QueueTags> = CompletionContext::new(id);
    for &q in cmap.queues_of(id) {
        ctx.add_queue(q, NullQueue::new(64, 2), QueueTags::Private(TagSet::new(64).unwrap()), 0);
    }
    // The CPUs whose default queue this context drives.
    let cpus: Vec<usize> =
        (0..CPUS).filter(|&c| cmap.context_of(maps.queue(QueueType::Default, c)) == Some(id)).collect();
    let mut submitted = [0u64; CPUS];
    let mut in_flight = [0u64; CPUS];
    let mut completed = vec![0u64; CPUS];
    let mut now = 0u64;
    while cpus.iter().any(|&c| completed[c] < IOS_PER_CPU) {
        now += 1;
        for &cpu in &cpus {
            let q = maps.queue(QueueType::Default, cpu);
            while in_flight[cpu] < QD_PER_CPU && submitted[cpu] < IOS_PER_CPU {
                let token = u64::try_from(cpu).unwrap() << 32 | submitted[cpu];
                ctx.submit(q, IoSpec::read(submitted[cpu] * 4096, 4096), token, (), now).expect("a tag per CPU's QD");
                submitted[cpu] += 1;
                in_flight[cpu] += 1;
            }
        }
        ctx.poll(now, |d| {
            let cpu = usize::try_from(d.token >> 32).unwrap();
            assert_eq!(maps.queue(QueueType::Default, cpu), d.queue, "completes on the queue it went out on");
            in_flight[cpu] -= 1;
            completed[cpu] += 1;
        });
        assert!(now < 10 * IOS_PER_CPU, "{id}: no progress");
    }
    assert_eq!(ctx.in_flight(), 0);
    let polls = ctx.hctxs().map(|h| (h.index().0, h.queue().polls())).collect();
    Report { completed, polls }
}

fn run(spread: ContextSpread) {
    let maps = QueueMaps::new(CPUS, QUEUES, 0, 0).unwrap();
    let cmap = ContextMap::new(QUEUES, CONTEXTS, spread).unwrap();
    let results: Vec<Report> = thread::scope(|s| {
        let handles: Vec<_> = (0..CONTEXTS)
            .map(|c| {
                s.spawn({
                    let (maps, cmap) = (&maps, &cmap);
                    move || run_context(maps, cmap, ContextId(c))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("context thread")).collect()
    });
    let mut total = vec![0u64; CPUS];
    for (c, Report { completed, polls }) in results.iter().enumerate() {
        let mine: Vec<u16> = cmap.queues_of(ContextId(u16::try_from(c).unwrap())).iter().map(|q| q.0).collect();
        assert_eq!(polls.iter().map(|p| p.0).collect::<Vec<_>>(), mine, "{spread:?}: context {c} holds its queues");
        for (t, n) in total.iter_mut().zip(completed) {
            *t += n;
        }
    }
    assert_eq!(total, vec![IOS_PER_CPU; CPUS], "{spread:?}: every CPU's I/O completed once");
}

#[test]
fn seed_004_four_queues_on_two_contexts_contiguous() {
    run(ContextSpread::Contiguous);
}

#[test]
fn seed_004_four_queues_on_two_contexts_round_robin() {
    run(ContextSpread::RoundRobin);
}
