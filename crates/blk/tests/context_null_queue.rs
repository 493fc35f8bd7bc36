//! A completion context driving in-memory queues: only busy queues are
//! polled, tags and requests go around, the caller's data comes back, and
//! refusals, tag exhaustion and failures land in the statistics.

use blk::{
    CompletionContext, ContextId, Direction, IoSpec, NullQueue, NullStatus, QueueIndex, QueueTags, SubmitError, TagSet,
};

type Ctx = CompletionContext<NullQueue<Option<Vec<u8>>>, QueueTags>;

fn context(queues: u16, depth: u16, latency_polls: u32) -> Ctx {
    let mut ctx = Ctx::new(ContextId(0));
    for q in 0..queues {
        let tags = QueueTags::Private(TagSet::new(depth).unwrap());
        ctx.add_queue(QueueIndex(q), NullQueue::new(depth, latency_polls), tags, 3);
    }
    ctx
}

#[test]
fn polls_only_queues_with_work_and_returns_the_buffer() {
    let mut ctx = context(4, 8, 2);
    let tag = ctx.submit(QueueIndex(2), IoSpec::read(8192, 4096), 42, Some(vec![0; 4096]), 1_000).unwrap();
    assert_eq!(ctx.active_queues().collect::<Vec<_>>(), vec![QueueIndex(2)]);
    assert_eq!(ctx.in_flight(), 1);

    let mut done = Vec::new();
    assert_eq!(ctx.poll(2_000, |d| done.push(d)), 0, "latency of two polls");
    assert_eq!(ctx.poll(5_000, |d| done.push(d)), 1);
    let d = done.pop().unwrap();
    assert_eq!((d.queue, d.tag, d.token, d.status, d.latency_ns), (QueueIndex(2), tag, 42, NullStatus::Success, 4_000));
    assert_eq!(d.ext.map(|b| b.len()), Some(4096), "the buffer comes back");
    assert_eq!(ctx.active_queues().count(), 0, "an idle queue leaves the interest list");
    // Only queue 2 was ever polled, and not after it went idle.
    ctx.poll(6_000, |_| unreachable!("nothing in flight"));
    for q in [0, 1, 3] {
        assert_eq!(ctx.hctx(QueueIndex(q)).unwrap().queue().polls(), 0);
    }
    assert_eq!(ctx.hctx(QueueIndex(2)).unwrap().queue().polls(), 2);
    let s = ctx.hctx(QueueIndex(2)).unwrap().stats().direction(Direction::Read).summary();
    assert_eq!((s.count, s.max_ns), (1, 4_000));
}

#[test]
fn tag_exhaustion_refusal_and_failures_are_counted() {
    let mut ctx = context(1, 4, 1);
    let q = QueueIndex(0);
    for i in 0..4 {
        ctx.submit(q, IoSpec::write(0, 512), i, None, 0).unwrap();
    }
    let (err, ext) = ctx.submit(q, IoSpec::write(0, 512), 9, Some(vec![7]), 0).unwrap_err();
    assert_eq!((err, ext), (SubmitError::NoTag, Some(vec![7])), "the caller's data comes back");
    assert_eq!(ctx.poll(1, |_| {}), 4);

    ctx.hctx_mut(q).unwrap().queue_mut().set_refusing(true);
    let (err, _) = ctx.submit(q, IoSpec::flush(), 10, None, 0).unwrap_err();
    assert_eq!(err, SubmitError::Refused);
    assert_eq!(ctx.hctx(q).unwrap().in_flight(), 0, "a refused request gives its tag back");
    assert_eq!(ctx.submit(QueueIndex(5), IoSpec::flush(), 0, None, 0).unwrap_err().0, SubmitError::UnknownQueue);

    let stats = ctx.stats();
    assert_eq!((stats.busy, stats.requeues, stats.ios()), (1, 1, 4));
}

#[test]
fn failures_go_to_errors_not_latency() {
    let mut ctx = Ctx::new(ContextId(0));
    let tags = QueueTags::Private(TagSet::new(16).unwrap());
    ctx.add_queue(QueueIndex(0), NullQueue::new(16, 1).fail_every(2), tags, 0);
    for i in 0..10 {
        ctx.submit(QueueIndex(0), IoSpec::read(0, 4096), i, None, 0).unwrap();
    }
    let mut failed = 0;
    ctx.poll(100, |d| failed += usize::from(d.status == NullStatus::Failed));
    let r = ctx.stats();
    let r = r.direction(Direction::Read);
    assert_eq!((failed, r.ios, r.errors, r.latency().len(), r.bytes), (5, 10, 5, 5, 5 * 4096));
}

#[test]
fn many_rounds_at_full_depth_recycle_tags() {
    let mut ctx = context(3, 32, 3);
    let mut token = 0u64;
    let mut completed = 0usize;
    for now in 0..2_000u64 {
        for q in 0..3 {
            while ctx.submit(QueueIndex(q), IoSpec::read(token * 4096, 4096), token, None, now).is_ok() {
                token += 1;
            }
        }
        ctx.poll(now, |d| {
            completed += 1;
            assert!(d.latency_ns <= 3, "completes within its three polls");
        });
        assert!(ctx.in_flight() <= 3 * 32);
    }
    assert!(completed > 50_000, "{completed}");
    assert_eq!(ctx.stats().ios(), u64::try_from(completed).unwrap());
}
