//! A host-wide shared tag set over two namespaces of one controller, with a LUN
//! depth on the busy one, in both orders (`DepthLimitOrder`): the depth caps the tags
//! the device holds (qpath's order), or is a budget taken after the tag (Linux SCSI,
//! seed 003), where the busy device sits on every tag and the other waits.
//!
//! The busy namespace is provisioned at 200 IOPS by the target, so its I/O stays
//! outstanding long enough to look at. Two contexts on this one thread: what is
//! asserted follows from the order of events, not from timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blk::{SharedTagPolicy, SharedTagSet};
use host::context::{Completion, Context, ContextOptions, DepthLimitOrder, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use target::config::{Config, NamespaceConfig, SizeValue};
use target::qos::QosSettings;
use target::reactor::{PollMode, ReactorOptions};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:lun-depth";
const DEPTH: u16 = 16;
const LUN_DEPTH: u16 = 4;
const BUSY_IOS: u64 = 40;

fn start_target() -> target::server::Server {
    let mut cfg = Config::embedded_default();
    cfg.ports.truncate(1);
    cfg.ports[0].addr = "127.0.0.1:0".into();
    cfg.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    let sub = &mut cfg.subsystems[0];
    sub.nqn = NQN.into();
    let template = sub.namespaces[0].clone();
    let ns = |nsid, iops| NamespaceConfig {
        nsid,
        size: Some(SizeValue::Text("64M".into())),
        qos: QosSettings { iops, bytes_per_sec: 0, delay_us: 0 },
        ..template.clone()
    };
    sub.namespaces = vec![ns(1, 200), ns(2, 0)];
    cfg.start().unwrap()
}

fn context(set: &Arc<SharedTagSet>, order: DepthLimitOrder) -> Context {
    Context::new(ContextOptions {
        max_requests: 64,
        shared_tags: Some(Arc::clone(set)),
        depth_limit_order: order,
        ..ContextOptions::default()
    })
    .unwrap()
}

fn read(ctx: &mut Context, dev: DeviceId, i: u64) {
    ctx.submit(dev, Op::Read, (i % 1024) * 4096, 4096, Some(IoBuf::new(4096)), i).map_err(|(e, _)| e).unwrap();
}

fn reap(ctx: &mut Context) -> Vec<Completion> {
    ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(1)) }).unwrap();
    ctx.completions().collect()
}

/// Commands the target has outstanding now, over every queue.
fn target_outstanding(server: &target::server::Server) -> u64 {
    server.state.queue_infos().iter().map(|q| q.stats.outstanding.get()).sum()
}

/// What [`run`] saw.
struct Seen {
    /// Tags the busy device and the other held right after submission.
    held: (u16, u16),
    /// Busy reads completed when the other read completed.
    busy_done_before_other: u64,
    /// Most commands the target had outstanding at once.
    on_the_wire_max: u64,
}

/// Submits `BUSY_IOS` reads on the busy device and one on the other, and runs them.
fn run(order: DepthLimitOrder) -> Seen {
    let server = start_target();
    let mut o = ConnectOptions::new(server.local_addr(1).unwrap(), NQN);
    o.nr_io_queues = 2;
    o.tag_space = Some(DEPTH);
    let ctrl = Controller::connect(o).unwrap();
    let set = SharedTagSet::new(DEPTH, SharedTagPolicy::Unfair).unwrap();
    let mut busy = context(&set, order);
    let mut other = context(&set, order);
    let busy_dev = busy.open_limited(&ctrl, Nsid(1), Some(LUN_DEPTH)).unwrap();
    let other_dev = other.open_limited(&ctrl, Nsid(2), Some(LUN_DEPTH)).unwrap();
    for i in 0..BUSY_IOS {
        read(&mut busy, busy_dev, i);
    }
    read(&mut other, other_dev, 0);
    let held = (busy.tags_held(busy_dev).unwrap(), other.tags_held(other_dev).unwrap());
    let (mut busy_done, mut other_done_at, mut on_the_wire_max) = (0u64, None, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while busy_done < BUSY_IOS || other_done_at.is_none() {
        assert!(Instant::now() < deadline, "{order:?}: I/O did not finish ({busy_done} busy, other {other_done_at:?})");
        for c in reap(&mut busy) {
            assert!(c.status.is_success(), "{order:?}: busy read failed: {:?}", c.status);
            busy_done += 1;
        }
        for c in reap(&mut other) {
            assert!(c.status.is_success(), "{order:?}: read failed: {:?}", c.status);
            other_done_at = Some(busy_done);
        }
        on_the_wire_max = on_the_wire_max.max(target_outstanding(&server));
    }
    assert_eq!(busy.tags_held(busy_dev), Some(0), "{order:?}: unfair users keep no tags when done");
    assert_eq!(set.pooled(), u32::from(DEPTH), "{order:?}: every tag back in the pool");
    drop((busy, other));
    ctrl.delete();
    server.shutdown();
    Seen { held, busy_done_before_other: other_done_at.unwrap(), on_the_wire_max }
}

#[test]
fn lun_depth_before_tag_leaves_the_rest_of_the_set_free() {
    let seen = run(DepthLimitOrder::BeforeTag);
    assert_eq!(seen.held.0, LUN_DEPTH, "the busy device holds only its LUN depth");
    assert_eq!(seen.held.1, 1, "the other device got a tag at once");
    let most = u64::from(LUN_DEPTH) + 1;
    assert!(seen.on_the_wire_max <= most, "{} on the wire, at most {most}", seen.on_the_wire_max);
}

#[test]
fn lun_depth_after_tag_lets_a_busy_device_hold_every_tag() {
    let seen = run(DepthLimitOrder::AfterTag);
    assert_eq!(seen.held.0, DEPTH, "the busy device holds the whole set");
    assert_eq!(seen.held.1, 0, "nothing left for the other device");
    // The budget still holds what goes out: LUN_DEPTH busy reads (and the other's one).
    let most = u64::from(LUN_DEPTH) + 1;
    assert!(seen.on_the_wire_max <= most, "{} on the wire, at most {most}", seen.on_the_wire_max);
    let busy_done = seen.busy_done_before_other;
    // Without fairness the busy context takes every tag back as it frees it while it
    // has requests waiting: the other device gets one only when fewer than DEPTH
    // busy reads are left.
    assert!(busy_done > BUSY_IOS - u64::from(DEPTH), "the other read finished after {busy_done} busy reads");
}
