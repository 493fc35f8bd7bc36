//! The block layer's own cost per I/O: submit and reap through a
//! `CompletionContext` over a `NullQueue` (no transport), at QD 32.
//! Per iteration, 32 I/Os go out and come back; the reported time is per
//! batch (divide by 32, or read the elements/s throughput).
//!
//! - `private_tags`: the queue has its own `TagSet`.
//! - `shared_windows`: the queue is a user of a `SharedTagSet` (`Windows`).
//!
//! Run: `CARGO_TARGET_DIR=/tmp/target-blk cargo bench -p blk --bench context`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::time::Duration;

use blk::{
    CompletionContext, ContextId, IoSpec, NullQueue, QueueIndex, QueueTags, SharedTagPolicy, SharedTagSet, TagSet,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const QD: u64 = 32;

fn round(ctx: &mut CompletionContext<NullQueue, QueueTags>, now: &mut u64) {
    *now += 1;
    for i in 0..QD {
        ctx.submit(QueueIndex(0), IoSpec::read(i * 4096, 4096), i, (), *now).expect("QD fits");
    }
    let mut n = 0;
    while n < QD {
        *now += 1;
        ctx.poll(*now, |d| {
            black_box(d.token);
            n += 1;
        });
    }
}

fn context(c: &mut Criterion) {
    let mut g = c.benchmark_group("context");
    g.throughput(Throughput::Elements(QD));
    let shared = SharedTagSet::new(128, SharedTagPolicy::Windows).unwrap();
    let variants = [
        ("private_tags", QueueTags::Private(TagSet::new(128).unwrap())),
        ("shared_windows", QueueTags::Shared(shared.register_user(None).unwrap())),
    ];
    for (name, tags) in variants {
        let mut ctx = CompletionContext::new(ContextId(0));
        ctx.add_queue(QueueIndex(0), NullQueue::new(128, 1), tags, 0);
        let mut now = 0;
        g.bench_function(format!("{name}/qd32"), |b| b.iter(|| round(&mut ctx, &mut now)));
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = context }
criterion_main!(benches);
