//! The block core without a ring or a TCP socket: real `HostQueue`s, brought up and
//! answered with PDUs from the `nvme` crate's encoders, real tag sets and failover
//! decisions, and a clock the test moves. The controllers are the test's own
//! ([`TestCtrl`], a [`CoreController`] whose state the test sets), as a simulator's are.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvme::tcp::{CommonHeader, Digests, EncoderConfig, IcResp, PduType};
use nvme::{Cid, Cntlid, Cqe, Nsid, Status};
use uring::IoBuf;

use super::*;
use crate::context::ctrlview::{CoreController, CoreHead, NsIds};
use crate::context::req::ReqState;
use crate::context::{ContextOptions, DevKind, DeviceId, Multi, Op};
use crate::head::ReferenceSelector;
use crate::mpath::{PathClass, Policy, Selector};
use crate::queue::{HostQueue, QueueConfig, QueueState};

const SUBNQN: &str = "nqn.2026-11.io.qpath:core";

/// A live I/O queue of `entries` commands: ICReq answered, Connect answered.
fn live_queue(entries: u16) -> HostQueue {
    let mut q =
        HostQueue::new(QueueConfig::io(1, entries, Cntlid(1), SUBNQN, "nqn.2014-08.org.nvmexpress:uuid:core", [0; 16]));
    take_sent(&mut q);
    q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    take_sent(&mut q);
    let mut out = Vec::new();
    EncoderConfig::default().capsule_resp(&mut out, &Cqe::success(Cid(q.tag_space())));
    q.feed(&out);
    assert_eq!(q.state(), QueueState::Live, "{:?}", q.error());
    q
}

/// The bytes the queue sends, each batch completed at once.
fn take_sent(q: &mut HostQueue) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(m) = q.take_send() {
        out.extend_from_slice(&m.to_vec());
        q.on_send_done(m, Ok(()));
    }
    out
}

/// (opcode, command id) of every command capsule in a byte stream.
fn commands(b: &[u8]) -> Vec<(u8, u16)> {
    capsules(b).into_iter().map(|(op, cid, _)| (op, cid)).collect()
}

/// (opcode, command id, Force Unit Access) of every command capsule in a byte stream:
/// FUA as the target reads it, CDW12 bit 30 of the capsule's SQE (which starts after
/// the 8-byte common header; CDW12 at byte 48 of it).
fn capsules(mut b: &[u8]) -> Vec<(u8, u16, bool)> {
    let mut cmds = Vec::new();
    while let Some(ch) = CommonHeader::peek(b) {
        if ch.pdu_type == PduType::CapsuleCmd as u8 {
            let cdw12 = u32::from_le_bytes([b[56], b[57], b[58], b[59]]);
            cmds.push((b[8], u16::from_le_bytes([b[10], b[11]]), cdw12 & (1 << 30) != 0));
        }
        b = &b[ch.plen as usize..];
    }
    cmds
}

/// A controller as the test sets it: live until it is lost, namespace 1 of 2048
/// 512-byte blocks, optimized through it while it is live.
#[derive(Debug)]
struct TestCtrl {
    traddr: SocketAddr,
    generation: AtomicU64,
    change_count: AtomicU64,
    live: AtomicBool,
    /// Past fast_io_fail_tmo (or dead): waiting I/O fails.
    fail_io: AtomicBool,
    hold: Duration,
    ctrl_loss_tmo: Option<Duration>,
    io_failures: AtomicU32,
    ana_refreshes: AtomicU32,
    nsze: AtomicU64,
    /// Namespace 1's identifiers as the last scan listed them; `None`: not listed.
    ids: Mutex<Option<NsIds>>,
}

/// Namespace 1's identifiers when the test starts.
const IDS_A: NsIds = NsIds { nguid: [0xa1; 16], eui64: [0xa2; 8], uuid: Some([0xa3; 16]) };
/// Another namespace's.
const IDS_B: NsIds = NsIds { nguid: [0xb1; 16], eui64: [0xb2; 8], uuid: Some([0xb3; 16]) };

impl TestCtrl {
    fn new(port: u16, hold: Duration, ctrl_loss_tmo: Option<Duration>) -> Arc<TestCtrl> {
        Arc::new(TestCtrl {
            traddr: SocketAddr::from(([127, 0, 0, 1], port)),
            generation: AtomicU64::new(1),
            change_count: AtomicU64::new(1),
            live: AtomicBool::new(true),
            fail_io: AtomicBool::new(false),
            hold,
            ctrl_loss_tmo,
            io_failures: AtomicU32::new(0),
            ana_refreshes: AtomicU32::new(0),
            nsze: AtomicU64::new(2048),
            ids: Mutex::new(Some(IDS_A)),
        })
    }

    /// The controller lost its connection (reconnecting); `fail_io`: and is past
    /// fast_io_fail_tmo.
    fn lose(&self, fail_io: bool) {
        self.live.store(false, Relaxed);
        self.fail_io.store(fail_io, Relaxed);
    }

    /// Namespace 1 now has `nsze` blocks (a rescan after Namespace Attribute Changed).
    fn resize(&self, nsze: u64) {
        self.nsze.store(nsze, Relaxed);
        self.change_count.fetch_add(1, Relaxed);
    }

    /// A rescan lists namespace 1 with `ids` (`None`: not at all).
    fn list(&self, ids: Option<NsIds>) {
        *self.ids.lock().unwrap() = ids;
        self.change_count.fetch_add(1, Relaxed);
    }

    fn listed(&self) -> bool {
        self.ids.lock().unwrap().is_some()
    }

    fn io_failure_reported(&self) -> bool {
        self.io_failures.load(Relaxed) > 0
    }
}

impl CoreController for TestCtrl {
    type Head = TestHead;

    fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    fn change_count(&self) -> u64 {
        self.change_count.load(Relaxed)
    }

    fn is_live(&self) -> bool {
        self.live.load(Relaxed)
    }

    fn should_fail_io(&self) -> bool {
        self.fail_io.load(Relaxed)
    }

    fn failover_hold(&self) -> Duration {
        self.hold
    }

    fn ctrl_loss_tmo(&self) -> Option<Duration> {
        self.ctrl_loss_tmo
    }

    fn report_io_failure(&self, _why: &str) {
        self.io_failures.fetch_add(1, Relaxed);
    }

    fn request_ana_refresh(&self) {
        self.ana_refreshes.fetch_add(1, Relaxed);
    }

    fn path_class(&self, nsid: Nsid) -> PathClass {
        match (nsid == Nsid(1) && self.listed(), self.live.load(Relaxed), self.fail_io.load(Relaxed)) {
            (false, _, _) | (_, false, true) => PathClass::Gone,
            (true, true, _) => PathClass::Optimized,
            (true, false, false) => PathClass::Transient,
        }
    }

    fn namespace_geometry(&self, nsid: Nsid) -> Option<(u8, u64)> {
        (nsid == Nsid(1) && self.listed()).then(|| (9, self.nsze.load(Relaxed)))
    }

    fn namespace_ids(&self, nsid: Nsid) -> Option<NsIds> {
        if nsid == Nsid(1) { *self.ids.lock().unwrap() } else { None }
    }

    fn traddr(&self) -> SocketAddr {
        self.traddr
    }

    fn cntlid(&self) -> u16 {
        1
    }
}

/// A multipath head of test controllers.
struct TestHead {
    generation: AtomicU64,
    policy: Policy,
    paths: Mutex<Slots>,
}

/// A head's path slots.
type Slots = Vec<Option<(Arc<TestCtrl>, Nsid)>>;

impl CoreHead for TestHead {
    type Ctrl = TestCtrl;

    fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    fn policy(&self) -> Policy {
        self.policy
    }

    fn reference(&self) -> Option<ReferenceSelector> {
        None
    }

    fn paths(&self) -> Slots {
        self.paths.lock().unwrap().clone()
    }
}

fn buf() -> Option<IoBuf> {
    Some(IoBuf::new(4096))
}

/// One single-path device (namespace 1, 2048 blocks of 512 bytes) on one queue of one
/// controller, its connection live.
struct Rig {
    core: BlockCore<TestCtrl>,
    ctrl: Arc<TestCtrl>,
    qkey: usize,
    ckey: usize,
    dev: DeviceId,
    t0: Instant,
}

impl Rig {
    fn new(entries: u16, opts: ContextOptions, ctrl_loss_tmo: Option<Duration>, hold: Duration) -> Rig {
        let t0 = Instant::now();
        let mut core = BlockCore::new(opts, t0);
        let ctrl = TestCtrl::new(4420, hold, ctrl_loss_tmo);
        let qkey = core.add_queue(&ctrl, 0).unwrap();
        let dev = core.new_device(DevKind::Single { qkey, nsid: Nsid(1) }, 9, 2048, None).unwrap();
        let ckey = core.install(qkey, live_queue(entries), ctrl.generation(), t0);
        Rig { core, ctrl, qkey, ckey, dev, t0 }
    }

    fn simple(entries: u16) -> Rig {
        Rig::new(entries, ContextOptions::default(), None, Duration::ZERO)
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn submit(&mut self, op: Op, block: u64, token: u64, ms: u64) {
        let (len, b) = match op {
            Op::Read | Op::Write | Op::WriteFua => (4096, buf()),
            Op::Deallocate | Op::WriteZeroes | Op::WriteZeroesFua => (4096, None),
            Op::Flush => (0, None),
        };
        let now = self.at(ms);
        self.core.submit(self.dev, 0, op, block * 4096, len, b, token, now).map_err(|(e, _)| e).unwrap();
    }

    fn queue(&mut self) -> &mut HostQueue {
        &mut self.core.conns[self.ckey].as_mut().expect("a connection").q
    }

    /// The commands the core handed the queue since the last look: (opcode, cid).
    fn sent(&mut self) -> Vec<(u8, u16)> {
        commands(&take_sent(self.queue()))
    }

    /// The same with each one's FUA bit.
    fn sent_fua(&mut self) -> Vec<(u8, u16, bool)> {
        capsules(&take_sent(self.queue()))
    }

    /// The controller answers command `cid` with `status`; the core takes the completions.
    fn answer(&mut self, cid: u16, status: Status, ms: u64) {
        let mut out = Vec::new();
        EncoderConfig::default().capsule_resp(&mut out, &Cqe::with_status(Cid(cid), status));
        self.queue().feed(&out);
        let now = self.at(ms);
        self.core.deliver(self.ckey, false, now, |d| panic!("a control completion: {d:?}"));
        self.core.dispatch_after_service(self.qkey, now);
    }

    /// The connection fails as the context fails it (its socket side aside).
    fn lose_connection(&mut self, ms: u64) {
        self.queue().set_failed("link down");
        let why = self.core.abort_conn(self.ckey).unwrap();
        let now = self.at(ms);
        self.core.fail_conn(self.ckey, &why, now, |_| {});
        self.core.free_conn(self.ckey);
    }

    /// A new connection of the queue (the controller reconnected).
    fn reconnect(&mut self, entries: u16, ms: u64) {
        let now = self.at(ms);
        self.ckey = self.core.install(self.qkey, live_queue(entries), self.ctrl.generation(), now);
    }

    fn done(&mut self) -> Vec<(u64, Status)> {
        self.core.done.drain(..).map(|c| (c.token, c.status)).collect()
    }

    /// The request slot of the caller's `token`.
    fn rid_of(&self, token: u64) -> u32 {
        u32::try_from(self.core.reqs.iter().position(|r| r.token == token).unwrap()).unwrap()
    }

    /// [`try_submit`] at `ms`.
    fn try_io(&mut self, op: Op, block: u64, token: u64, ms: u64) -> std::result::Result<(), (ErrorKind, String)> {
        let now = self.at(ms);
        try_submit(&mut self.core, self.dev, op, block, token, now)
    }

    fn waiting(&self) -> usize {
        self.core.queues[self.qkey].waiting.len()
    }
}

const R: u8 = nvme::opcode::io::READ;
const W: u8 = nvme::opcode::io::WRITE;

#[test]
fn out_of_order_completions_reach_the_caller_with_their_tokens_and_buffers() {
    let mut rig = Rig::simple(8);
    for token in 0..4 {
        rig.submit(Op::Read, token, 100 + token, 0);
    }
    let sent = rig.sent();
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|&(op, _)| op == R));
    // The controller answers the last first, and one of them with an error.
    let cids: Vec<u16> = sent.iter().map(|&(_, c)| c).collect();
    rig.answer(cids[3], Status::SUCCESS, 1);
    rig.answer(cids[1], Status::LBA_OUT_OF_RANGE, 2);
    rig.answer(cids[0], Status::SUCCESS, 3);
    rig.answer(cids[2], Status::SUCCESS, 4);
    let done: Vec<_> = rig.core.done.drain(..).map(|c| (c.token, c.status, c.buf.is_some(), c.latency_ns)).collect();
    assert_eq!(
        done.iter().map(|&(t, s, b, _)| (t, s, b)).collect::<Vec<_>>(),
        [
            (103, Status::SUCCESS, true),
            (101, Status::LBA_OUT_OF_RANGE, true),
            (100, Status::SUCCESS, true),
            (102, Status::SUCCESS, true)
        ]
    );
    // Latency is submit to completion on the caller's clock: 1..4 ms here.
    assert_eq!(done.iter().map(|d| d.3 / 1_000_000).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(rig.core.in_flight(), 0);
    assert!(rig.core.reqs.iter().all(|r| r.state == ReqState::Free));
}

#[test]
fn out_of_tags_requests_wait_on_their_queue_and_go_out_in_order_as_tags_free() {
    let mut rig = Rig::simple(2);
    for token in 0..5 {
        rig.submit(Op::Write, token, token, 0);
    }
    let first = rig.sent();
    assert_eq!(first.len(), 2, "two tags");
    assert_eq!(rig.waiting(), 3);
    let mut order = Vec::new();
    let mut pending: Vec<u16> = first.iter().map(|&(_, c)| c).collect();
    let mut ms = 1;
    while let Some(cid) = pending.pop() {
        rig.answer(cid, Status::SUCCESS, ms);
        ms += 1;
        order.extend(rig.done());
        let next = rig.sent();
        assert!(next.len() <= 1, "one tag freed, one command out: {next:?}");
        pending.extend(next.iter().map(|&(_, c)| c));
    }
    // Each completes once; the waiting ones went out (and so completed) in the order
    // they were submitted, each after a tag came back.
    let tokens: Vec<u64> = order.iter().map(|&(t, _)| t).collect();
    assert_eq!(tokens.iter().filter(|&&t| t >= 2).copied().collect::<Vec<_>>(), [2, 3, 4]);
    let mut all = tokens.clone();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3, 4]);
    assert_eq!(rig.core.in_flight(), 0);
    assert_eq!(rig.waiting(), 0);
}

#[test]
fn a_lost_connection_requeues_its_commands_and_a_reconnect_sends_them_again_once() {
    let mut rig = Rig::simple(8);
    rig.submit(Op::Read, 0, 1, 0);
    rig.submit(Op::Flush, 0, 2, 0);
    assert_eq!(rig.sent().len(), 2);
    rig.lose_connection(5);
    assert!(rig.done().is_empty(), "a single path waits for the reconnect");
    assert_eq!(rig.waiting(), 2);
    assert!(rig.ctrl.io_failure_reported(), "the controller is told to reset");
    // Submitted meanwhile: waits too.
    rig.submit(Op::Read, 1, 3, 6);
    assert_eq!(rig.waiting(), 3);
    rig.reconnect(8, 10);
    let again = rig.sent();
    assert_eq!(again.iter().map(|&(op, _)| op).collect::<Vec<_>>(), [R, nvme::opcode::io::FLUSH, R]);
    for (_, cid) in again {
        rig.answer(cid, Status::SUCCESS, 11);
    }
    let mut done = rig.done();
    done.sort_unstable_by_key(|&(t, _)| t);
    assert_eq!(done, [(1, Status::SUCCESS), (2, Status::SUCCESS), (3, Status::SUCCESS)]);
    assert_eq!(rig.core.reqs.iter().filter(|r| r.retries > 0).count(), 2, "the two that were on the wire");
    assert_eq!(rig.core.in_flight(), 0);
}

#[test]
fn transport_retries_run_out_into_a_path_error() {
    let opts = ContextOptions { max_retries: 2, ..ContextOptions::default() };
    let mut rig = Rig::new(4, opts, None, Duration::ZERO);
    rig.submit(Op::Read, 0, 7, 0);
    for round in 0..2 {
        assert_eq!(rig.sent().len(), 1, "round {round}");
        rig.lose_connection(1);
        assert!(rig.done().is_empty(), "retry {round} of 2");
        rig.reconnect(4, 2);
    }
    assert_eq!(rig.sent().len(), 1);
    rig.lose_connection(3);
    assert_eq!(rig.done(), [(7, Status::HOST_PATH_ERROR)], "max_retries reached");
    assert_eq!(rig.core.in_flight(), 0);
}

#[test]
fn requests_waiting_for_a_controller_past_fast_io_fail_tmo_fail_at_the_next_tick() {
    let mut rig = Rig::simple(4);
    rig.submit(Op::Read, 0, 1, 0);
    rig.sent();
    rig.lose_connection(1);
    rig.submit(Op::Read, 1, 2, 2);
    assert_eq!(rig.waiting(), 2);
    rig.core.tick(rig.at(3));
    assert!(rig.done().is_empty(), "the controller is not past fast_io_fail_tmo yet");
    rig.ctrl.lose(true);
    rig.core.tick(rig.at(4));
    assert_eq!(rig.done(), [(1, Status::HOST_PATH_ERROR), (2, Status::HOST_PATH_ERROR)]);
    assert_eq!(rig.core.in_flight(), 0);
    // A new submission waits no more: its queue has no connection and the controller is
    // gone, so it fails at the next tick as well.
    rig.submit(Op::Read, 2, 3, 5);
    rig.core.tick(rig.at(6));
    assert_eq!(rig.done(), [(3, Status::HOST_PATH_ERROR)]);
}

#[test]
fn a_write_whose_connection_failed_is_not_sent_again_before_its_hold_ends() {
    let hold = Duration::from_secs(5);
    let mut rig = Rig::new(4, ContextOptions::default(), None, hold);
    rig.submit(Op::Write, 0, 1, 0);
    rig.submit(Op::Read, 1, 2, 0);
    assert_eq!(rig.sent().len(), 2);
    rig.lose_connection(100);
    rig.reconnect(4, 200);
    // The read goes at once (a late copy of a read changes nothing); the write is held.
    assert_eq!(rig.sent().iter().map(|&(op, _)| op).collect::<Vec<_>>(), [R]);
    assert!(matches!(rig.core.reqs.iter().find(|r| r.token == 1).unwrap().state, ReqState::Held { .. }));
    rig.core.tick(rig.at(5099));
    assert!(rig.sent().is_empty(), "still within the hold (lost at 100 ms, hold 5 s)");
    rig.core.tick(rig.at(5100));
    let sent = rig.sent();
    assert_eq!(sent.iter().map(|&(op, _)| op).collect::<Vec<_>>(), [W], "sent again once the hold is over");
    rig.answer(sent[0].1, Status::SUCCESS, 5101);
    let done = rig.done();
    assert!(done.contains(&(1, Status::SUCCESS)), "{done:?}");
}

#[test]
fn a_fua_write_carries_fua_on_the_wire_and_a_plain_write_does_not() {
    let mut rig = Rig::simple(8);
    rig.submit(Op::Write, 0, 1, 0);
    rig.submit(Op::WriteFua, 1, 2, 0);
    rig.submit(Op::WriteZeroes, 2, 3, 0);
    rig.submit(Op::WriteZeroesFua, 3, 4, 0);
    rig.submit(Op::Read, 4, 5, 0);
    let wz = nvme::opcode::io::WRITE_ZEROES;
    let sent: Vec<(u8, bool)> = rig.sent_fua().iter().map(|&(op, _, fua)| (op, fua)).collect();
    assert_eq!(sent, [(W, false), (W, true), (wz, false), (wz, true), (R, false)]);
}

#[test]
fn a_requeued_fua_write_still_carries_fua_when_it_is_sent_again() {
    // A lost connection requeues the write; sent again after the reconnect (and after
    // its failover hold), it must still ask for durability, or its acknowledgement
    // would promise what the target did not do.
    let hold = Duration::from_secs(1);
    let mut rig = Rig::new(4, ContextOptions::default(), None, hold);
    rig.submit(Op::WriteFua, 0, 1, 0);
    assert_eq!(rig.sent_fua().iter().map(|&(op, _, fua)| (op, fua)).collect::<Vec<_>>(), [(W, true)]);
    rig.lose_connection(10);
    rig.reconnect(4, 20);
    assert!(rig.sent().is_empty(), "held");
    rig.core.tick(rig.at(1010));
    let again = rig.sent_fua();
    assert_eq!(again.iter().map(|&(op, _, fua)| (op, fua)).collect::<Vec<_>>(), [(W, true)], "FUA kept");
    rig.answer(again[0].1, Status::SUCCESS, 1011);
    assert_eq!(rig.done(), [(1, Status::SUCCESS)]);
}

#[test]
fn a_multipath_fua_write_failed_over_to_the_other_path_still_carries_fua() {
    let mut mp = multipath(ContextOptions::default(), Duration::ZERO);
    let t0 = mp.t0;
    mp.core.submit(mp.dev, 0, Op::WriteFua, 0, 4096, buf(), 9, t0).map_err(|(e, _)| e).unwrap();
    let first: Vec<_> =
        (0..2).map(|p| capsules(&take_sent(&mut mp.core.conns[mp.ckeys[p]].as_mut().unwrap().q))).collect();
    let path = if first[0].is_empty() { 1 } else { 0 };
    assert_eq!(first[path].iter().map(|&(op, _, fua)| (op, fua)).collect::<Vec<_>>(), [(W, true)]);
    mp.lose(path, t0 + Duration::from_millis(1));
    mp.core.tick(t0 + Duration::from_millis(2));
    let other = 1 - path;
    let moved = capsules(&take_sent(&mut mp.core.conns[mp.ckeys[other]].as_mut().unwrap().q));
    assert_eq!(moved.iter().map(|&(op, _, fua)| (op, fua)).collect::<Vec<_>>(), [(W, true)], "FUA kept");
}

#[test]
fn authentication_required_fails_the_queue_and_the_io_goes_again_after_the_reconnect_unheld() {
    // The target took the queue's authentication away (a re-authentication with a key it
    // no longer holds failed): it answers the queue's commands with Authentication
    // Required (DNR) until it closes it. Not executed, so not held; not the application's
    // error: the queue is lost, and the reconnect authenticates again.
    let hold = Duration::from_secs(5);
    let mut rig = Rig::new(4, ContextOptions::default(), None, hold);
    rig.submit(Op::WriteFua, 0, 1, 0);
    rig.submit(Op::Read, 1, 2, 0);
    let sent = rig.sent();
    assert_eq!(sent.len(), 2);
    rig.answer(sent[0].1, Status::AUTH_REQUIRED, 1);
    assert!(rig.done().is_empty(), "not completed to the caller");
    assert_eq!(rig.queue().state(), QueueState::Failed, "the queue is failed for its owner to close");
    assert!(rig.core.take_touched().contains(&rig.ckey));
    // The owner closes the failed connection: the read still on it is requeued too, and
    // the controller is told to reset.
    rig.lose_connection(2);
    assert!(rig.ctrl.io_failure_reported());
    rig.reconnect(4, 3);
    let again = rig.sent_fua();
    assert_eq!(
        again.iter().map(|&(op, _, fua)| (op, fua)).collect::<Vec<_>>(),
        [(W, true), (R, false)],
        "the refused write goes at once (it was not executed), with its FUA; the read too"
    );
    for &(_, cid, _) in &again {
        rig.answer(cid, Status::SUCCESS, 4);
    }
    let mut done = rig.done();
    done.sort_unstable_by_key(|&(t, _)| t);
    assert_eq!(done, [(1, Status::SUCCESS), (2, Status::SUCCESS)]);
}

#[test]
fn authentication_required_until_the_retries_run_out_reaches_the_caller() {
    let opts = ContextOptions { max_retries: 1, ..ContextOptions::default() };
    let mut rig = Rig::new(4, opts, None, Duration::ZERO);
    rig.submit(Op::Read, 0, 7, 0);
    let cid = rig.sent()[0].1;
    rig.answer(cid, Status::AUTH_REQUIRED, 1);
    rig.lose_connection(2);
    rig.reconnect(4, 3);
    let cid = rig.sent()[0].1;
    rig.answer(cid, Status::AUTH_REQUIRED, 4);
    assert_eq!(rig.done(), [(7, Status::AUTH_REQUIRED)], "max_retries reached: bounded as a path error");
}

#[test]
fn a_multipath_io_refused_for_authentication_goes_to_the_other_path() {
    let mut mp = multipath(ContextOptions::default(), Duration::from_secs(5));
    let t0 = mp.t0;
    mp.core.submit(mp.dev, 0, Op::Write, 0, 4096, buf(), 9, t0).map_err(|(e, _)| e).unwrap();
    let first: Vec<_> = (0..2).map(|p| mp.sent(p)).collect();
    let path = if first[0].is_empty() { 1 } else { 0 };
    let ck = mp.ckeys[path];
    let mut out = Vec::new();
    EncoderConfig::default().capsule_resp(&mut out, &Cqe::with_status(Cid(first[path][0].1), Status::AUTH_REQUIRED));
    mp.core.conns[ck].as_mut().unwrap().q.feed(&out);
    mp.core.deliver(ck, false, t0 + Duration::from_millis(1), |_| {});
    assert!(mp.core.done.is_empty(), "not completed to the caller");
    assert_eq!(mp.core.conns[ck].as_ref().unwrap().q.state(), QueueState::Failed);
    // The owner closes the failed connection; the write, not executed, is not held.
    mp.lose(path, t0 + Duration::from_millis(2));
    let moved = mp.sent(1 - path);
    assert_eq!(moved.iter().map(|&(op, _)| op).collect::<Vec<_>>(), [W], "on the other path at once");
}

#[test]
fn a_hold_longer_than_ctrl_loss_tmo_fails_the_write_then_without_sending_it() {
    let hold = Duration::from_secs(10);
    let mut rig = Rig::new(4, ContextOptions::default(), Some(Duration::from_secs(3)), hold);
    rig.submit(Op::Write, 0, 1, 0);
    rig.sent();
    rig.lose_connection(0);
    rig.reconnect(4, 1);
    rig.core.tick(rig.at(2999));
    assert!(rig.done().is_empty() && rig.sent().is_empty());
    rig.core.tick(rig.at(3000));
    assert_eq!(rig.done(), [(1, Status::HOST_PATH_ERROR)]);
    assert!(rig.sent().is_empty(), "never sent again");
    assert_eq!(rig.core.in_flight(), 0);
}

#[test]
fn a_held_write_fails_at_once_when_its_single_path_controller_is_past_fast_io_fail_tmo() {
    let hold = Duration::from_secs(10);
    let mut rig = Rig::new(4, ContextOptions::default(), None, hold);
    rig.submit(Op::Deallocate, 0, 1, 0);
    assert_eq!(rig.sent().iter().map(|&(op, _)| op).collect::<Vec<_>>(), [nvme::opcode::io::DATASET_MANAGEMENT]);
    rig.lose_connection(0);
    rig.core.tick(rig.at(10));
    assert!(rig.done().is_empty(), "held");
    rig.ctrl.lose(true);
    rig.core.tick(rig.at(20));
    assert_eq!(rig.done(), [(1, Status::HOST_PATH_ERROR)], "failing is always safe, sending early is not");
}

#[test]
fn an_io_timeout_fails_the_queue_and_a_stall_is_reported_once() {
    let opts = ContextOptions {
        io_timeout: Duration::from_secs(2),
        stall_threshold: Duration::from_secs(1),
        ..ContextOptions::default()
    };
    let mut rig = Rig::new(4, opts, None, Duration::ZERO);
    rig.submit(Op::Read, 0, 1, 0);
    let cid = rig.sent()[0].1;
    rig.core.tick(rig.at(1000));
    assert!(rig.core.stalls.is_empty(), "not older than the threshold yet");
    rig.core.tick(rig.at(1001));
    rig.core.tick(rig.at(1500));
    let stalls = std::mem::take(&mut rig.core.stalls);
    assert_eq!(stalls.len(), 1, "once");
    assert_eq!((stalls[0].qid, stalls[0].cid, stalls[0].opcode), (1, cid, R));
    assert_eq!(stalls[0].queue_outstanding, 1);
    assert!(rig.core.touched.is_empty() && rig.queue().state() == QueueState::Live);
    rig.core.tick(rig.at(2001));
    assert_eq!(rig.queue().state(), QueueState::Failed, "the controller resets");
    assert_eq!(rig.core.touched, [rig.ckey]);
    // The context then fails the connection: the read waits for the reconnect.
    rig.lose_connection(2002);
    assert!(rig.done().is_empty());
    assert_eq!(rig.waiting(), 1);
}

#[test]
fn a_controller_reset_fails_the_queues_of_its_old_generation() {
    let mut rig = Rig::simple(4);
    rig.submit(Op::Read, 0, 1, 0);
    rig.sent();
    rig.core.tick(rig.at(10));
    assert_eq!(rig.queue().state(), QueueState::Live);
    // The admin thread reconnected (keep-alive lost): this connection is of the old generation.
    rig.core.conns[rig.ckey].as_mut().unwrap().ctrl_generation = 0;
    rig.core.tick(rig.at(20));
    assert_eq!(rig.queue().state(), QueueState::Failed);
    rig.lose_connection(21);
    assert!(!rig.ctrl.io_failure_reported(), "an old generation's failure resets nothing");
    assert_eq!(rig.waiting(), 1);
}

#[test]
fn a_deallocate_carries_its_range_in_a_reused_buffer() {
    let mut rig = Rig::simple(4);
    for round in 0..3 {
        rig.submit(Op::Deallocate, 3, 10 + round, 0);
        let sent = rig.sent();
        assert_eq!(sent.len(), 1);
        rig.answer(sent[0].1, Status::SUCCESS, 1);
        assert_eq!(rig.done(), [(10 + round, Status::SUCCESS)]);
        assert_eq!(rig.core.dsm_bufs.len(), 1, "one range buffer, kept for the next");
    }
}

#[test]
fn a_completion_for_a_request_not_on_the_wire_under_that_tag_is_not_its_own() {
    let mut rig = Rig::simple(4);
    rig.submit(Op::Read, 0, 1, 0);
    let cid = rig.sent()[0].1;
    let rid = rig.rid_of(1);
    assert!(rig.core.on_wire(rid, cid).is_some());
    assert!(rig.core.on_wire(rid, cid + 1).is_none(), "another tag");
    assert!(rig.core.on_wire(u32::MAX, cid).is_none(), "a token out of range");
    rig.answer(cid, Status::SUCCESS, 1);
    assert!(rig.core.on_wire(rid, cid).is_none(), "completed");
}

#[test]
fn a_second_completion_is_refused_and_changes_nothing() {
    let mut rig = Rig::simple(4);
    rig.submit(Op::Flush, 0, 1, 0);
    let cid = rig.sent()[0].1;
    rig.answer(cid, Status::SUCCESS, 1);
    assert_eq!(rig.done(), [(1, Status::SUCCESS)]);
    let free = rig.core.free_reqs.len();
    let rid = rig.rid_of(1);
    rig.core.complete(rid, Status::SUCCESS);
    assert!(rig.done().is_empty(), "no second completion");
    assert_eq!(rig.core.free_reqs.len(), free, "the slot is not freed twice");
}

#[test]
fn a_held_request_sent_early_is_refused_before_it_reaches_the_wire() {
    let mut rig = Rig::new(4, ContextOptions::default(), None, Duration::from_secs(5));
    rig.submit(Op::Write, 0, 1, 0);
    rig.sent();
    rig.lose_connection(0);
    rig.reconnect(4, 1);
    let rid = rig.rid_of(1);
    assert!(matches!(rig.core.reqs[rid as usize].state, ReqState::Held { .. }));
    // A bug sends it anyway: the core refuses, fails it, and nothing goes out.
    rig.core.send_bound(rid);
    assert!(rig.sent().is_empty(), "nothing on the wire");
    assert_eq!(rig.done(), [(1, Status::INTERNAL)]);
    assert_eq!(rig.core.queues[rig.qkey].tags.in_flight(), 0, "its tag went back");
    // Its hold ending later finds it gone from the held list's view: nothing more.
    rig.core.tick(rig.at(6000));
    assert!(rig.done().is_empty() && rig.sent().is_empty());
}

#[test]
fn a_shared_tag_sets_depth_limit_caps_a_device_and_its_waiters_go_in_order() {
    let set = blk::SharedTagSet::new(8, blk::SharedTagPolicy::default()).unwrap();
    let opts = ContextOptions { shared_tags: Some(set), ..ContextOptions::default() };
    let t0 = Instant::now();
    let mut core = BlockCore::new(opts, t0);
    let ctrl = TestCtrl::new(4420, Duration::ZERO, None);
    let qkey = core.add_queue(&ctrl, 0).unwrap();
    let dev = core.new_device(DevKind::Single { qkey, nsid: Nsid(1) }, 9, 2048, Some(2)).unwrap();
    let ckey = core.install(qkey, live_queue(16), ctrl.generation(), t0);
    for token in 0..5u64 {
        core.submit(dev, 0, Op::Read, token * 4096, 4096, buf(), token, t0).map_err(|(e, _)| e).unwrap();
    }
    fn q(core: &mut BlockCore<TestCtrl>, ckey: usize) -> &mut HostQueue {
        &mut core.conns[ckey].as_mut().unwrap().q
    }
    let first = commands(&take_sent(q(&mut core, ckey)));
    assert_eq!(first.len(), 2, "the device's limit");
    assert_eq!(core.devices[dev.0 as usize].waiting.len(), 3);
    let mut pending: Vec<u16> = first.iter().map(|&(_, c)| c).collect();
    let mut tokens = Vec::new();
    while let Some(cid) = pending.pop() {
        let mut out = Vec::new();
        EncoderConfig::default().capsule_resp(&mut out, &Cqe::success(Cid(cid)));
        q(&mut core, ckey).feed(&out);
        core.deliver(ckey, false, t0, |_| {});
        core.dispatch_after_service(qkey, t0);
        let next = commands(&take_sent(q(&mut core, ckey)));
        assert!(next.len() <= 1, "one tag back, one waiter out: {next:?}");
        assert!(
            core.devices[dev.0 as usize].tags.as_ref().map_or(0, blk::TagUser::in_flight) <= 2,
            "never beyond the device's limit"
        );
        pending.extend(next.iter().map(|&(_, c)| c));
        tokens.extend(core.done.drain(..).map(|c| c.token));
    }
    // The waiters went out, and so completed, in the order they were submitted.
    assert_eq!(tokens.iter().filter(|&&t| t >= 2).copied().collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(tokens.len(), 5);
    assert_eq!(core.in_flight(), 0);
}

/// Linux SCSI's order (seed 003's baseline): a request takes a shared tag, then waits
/// for its device's budget holding it.
#[test]
#[cfg(feature = "lab-baselines")]
fn after_tag_a_request_holds_its_tag_while_it_waits_for_budget() {
    let set = blk::SharedTagSet::new(8, blk::SharedTagPolicy::default()).unwrap();
    let opts = ContextOptions {
        shared_tags: Some(set),
        depth_limit_order: DepthLimitOrder::AfterTag,
        ..ContextOptions::default()
    };
    let mut rig = Rig::new(16, opts, None, Duration::ZERO);
    // The rig's device has no limit: a second one on the same queue has a budget of 1.
    let qkey = rig.qkey;
    let dev = rig.core.new_device(DevKind::Single { qkey, nsid: Nsid(1) }, 9, 2048, Some(1)).unwrap();
    rig.dev = dev;
    for token in 0..3 {
        rig.submit(Op::Read, token, token, 0);
    }
    let first = rig.sent();
    assert_eq!(first.len(), 1, "one budget");
    let tags_held = |rig: &Rig| rig.core.devices[dev.0 as usize].tags.as_ref().map_or(0, blk::TagUser::in_flight);
    let budget_waiting =
        |rig: &Rig| rig.core.reqs.iter().filter(|r| matches!(r.state, ReqState::Budget { .. })).count();
    assert_eq!((tags_held(&rig), budget_waiting(&rig)), (3, 2), "the waiters hold their tags");
    rig.answer(first[0].1, Status::SUCCESS, 1);
    assert_eq!(rig.done(), [(0, Status::SUCCESS)]);
    let second = rig.sent();
    assert_eq!(second.len(), 1, "the budget came back: the next waiter goes");
    assert_eq!((tags_held(&rig), budget_waiting(&rig)), (2, 1));
    // The connection goes: the one on the wire waits for the reconnect; the one waiting
    // for budget gives its tag back at the next tick and waits on the queue too.
    rig.lose_connection(2);
    rig.core.tick(rig.at(3));
    assert_eq!((tags_held(&rig), budget_waiting(&rig)), (0, 0));
    assert_eq!(rig.waiting(), 2);
    rig.reconnect(16, 4);
    assert_eq!(rig.sent().len(), 1, "still one budget");
    assert_eq!((tags_held(&rig), budget_waiting(&rig)), (2, 1));
    assert!(rig.done().is_empty());
}

/// A multipath device over two controllers, each on its own queue of the core.
struct Multipath {
    core: BlockCore<TestCtrl>,
    ctrls: [Arc<TestCtrl>; 2],
    ckeys: [usize; 2],
    dev: DeviceId,
    t0: Instant,
}

fn multipath(opts: ContextOptions, hold: Duration) -> Multipath {
    let t0 = Instant::now();
    let mut core = BlockCore::new(opts, t0);
    let policy = Policy::RoundRobin { rr_min_io: 1 };
    let head = Arc::new(TestHead { generation: AtomicU64::new(1), policy, paths: Mutex::new(Vec::new()) });
    let mut ctrls = Vec::new();
    let mut paths = Vec::new();
    let mut ckeys = [0; 2];
    for (i, port) in [4420u16, 4421].into_iter().enumerate() {
        let c = TestCtrl::new(port, hold, None);
        head.paths.lock().unwrap().push(Some((Arc::clone(&c), Nsid(1))));
        let qkey = core.add_queue(&c, 0).unwrap();
        ckeys[i] = core.install(qkey, live_queue(8), c.generation(), t0);
        paths.push(Some(LocalPath::new(Arc::clone(&c), Nsid(1), qkey)));
        ctrls.push(c);
    }
    let m = Multi {
        sel: Selector::new(policy, 0),
        reference: None,
        ref_gen: 1,
        paths,
        seen: 0,
        seen_head: head.generation.load(Relaxed),
        ios: vec![0; 2],
        bytes: vec![0; 2],
        head,
    };
    core.has_multi = true;
    let dev = core.new_device(DevKind::Multi(Box::new(m)), 9, 2048, None).unwrap();
    core.refresh_device(dev.0 as usize, t0);
    let ctrls: [Arc<TestCtrl>; 2] = ctrls.try_into().unwrap();
    Multipath { core, ctrls, ckeys, dev, t0 }
}

impl Multipath {
    fn sent(&mut self, path: usize) -> Vec<(u8, u16)> {
        commands(&take_sent(&mut self.core.conns[self.ckeys[path]].as_mut().unwrap().q))
    }

    fn lose(&mut self, path: usize, now: Instant) {
        let ckey = self.ckeys[path];
        self.core.conns[ckey].as_mut().unwrap().q.set_failed("link down");
        let why = self.core.abort_conn(ckey).unwrap();
        self.core.fail_conn(ckey, &why, now, |_| {});
        self.core.free_conn(ckey);
        self.ctrls[path].lose(false);
        self.core.refresh_all_paths(now);
    }
}

#[test]
fn a_multipath_device_sends_a_lost_paths_reads_on_the_other_path_at_once() {
    let mut mp = multipath(ContextOptions::default(), Duration::from_secs(5));
    let t0 = mp.t0;
    for token in 0..4u64 {
        mp.core.submit(mp.dev, 0, Op::Read, token * 4096, 4096, buf(), token, t0).map_err(|(e, _)| e).unwrap();
    }
    let (a, b) = (mp.sent(0), mp.sent(1));
    assert_eq!((a.len(), b.len()), (2, 2), "round robin over both paths");
    mp.lose(0, t0 + Duration::from_millis(1));
    let moved = mp.sent(1);
    assert_eq!(moved.len(), 2, "path 0's reads fail over to path 1 at once");
    assert!(mp.core.done.is_empty());
    let mut out = Vec::new();
    for &(_, cid) in b.iter().chain(&moved) {
        EncoderConfig::default().capsule_resp(&mut out, &Cqe::success(Cid(cid)));
    }
    let ck = mp.ckeys[1];
    mp.core.conns[ck].as_mut().unwrap().q.feed(&out);
    mp.core.deliver(ck, false, t0 + Duration::from_millis(2), |_| {});
    let mut tokens: Vec<u64> = mp.core.done.drain(..).map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, [0, 1, 2, 3], "each once");
    assert_eq!(mp.core.in_flight(), 0);
}

#[test]
fn a_multipath_write_is_held_before_it_fails_over_and_failovers_run_out() {
    let opts = ContextOptions { max_failovers: 1, ..ContextOptions::default() };
    let mut mp = multipath(opts, Duration::from_secs(5));
    let t0 = mp.t0;
    mp.core.submit(mp.dev, 0, Op::Write, 0, 4096, buf(), 9, t0).map_err(|(e, _)| e).unwrap();
    let path = if mp.sent(0).is_empty() { 1 } else { 0 };
    let other = 1 - path;
    mp.lose(path, t0);
    assert!(mp.sent(other).is_empty(), "held, not failed over at once");
    mp.core.tick(t0 + Duration::from_millis(4999));
    assert!(mp.sent(other).is_empty());
    mp.core.tick(t0 + Duration::from_secs(5));
    assert_eq!(mp.sent(other).len(), 1, "failed over once its hold ended");
    // That path goes too: the one failover it had is used, the write fails.
    mp.lose(other, t0 + Duration::from_secs(6));
    mp.core.tick(t0 + Duration::from_secs(12));
    let done: Vec<(u64, Status)> = mp.core.done.drain(..).map(|c| (c.token, c.status)).collect();
    assert_eq!(done, [(9, Status::HOST_PATH_ERROR)]);
}

#[test]
fn a_device_follows_its_namespaces_size_a_grow_at_once_a_shrink_at_the_next_poll_turn() {
    let mut rig = Rig::simple(8);
    let try_read = |rig: &mut Rig, block: u64| {
        let now = rig.at(1);
        rig.core.submit(rig.dev, 0, Op::Read, block * 4096, 4096, buf(), block, now).map_err(|(e, _)| e.to_string())
    };
    // 2048 blocks of 512 bytes: 256 of 4 KiB.
    assert_eq!(try_read(&mut rig, 256), Err("beyond the end of the device".into()));
    // Grown (the controller rescanned): a read past the old end goes out without waiting
    // for a poll turn, the refusal's own look at the change count finds the new size.
    rig.ctrl.resize(4096);
    assert_eq!(try_read(&mut rig, 256), Ok(()));
    assert_eq!(rig.sent().len(), 1);
    assert_eq!(rig.core.devices[rig.dev.0 as usize].nsze, 4096);
    // Shrunk: refused locally from the next poll turn on (no I/O reads the size anew).
    rig.ctrl.resize(1024);
    rig.core.refresh_sizes();
    assert_eq!(try_read(&mut rig, 128), Err("beyond the end of the device".into()));
    assert_eq!(try_read(&mut rig, 127), Ok(()));
    // Nothing moved: a poll turn's check reads no namespace (the key is unchanged).
    let seen = rig.core.devices[rig.dev.0 as usize].size_seen;
    rig.core.refresh_sizes();
    assert_eq!(rig.core.devices[rig.dev.0 as usize].size_seen, seen);
}

#[test]
fn a_multipath_device_takes_the_smallest_size_its_live_paths_report() {
    let mut mp = multipath(ContextOptions::default(), Duration::ZERO);
    let dev = mp.dev.0 as usize;
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 2048);
    // One controller rescanned after a grow, the other not yet: the old end holds.
    mp.ctrls[0].resize(4096);
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 2048);
    mp.ctrls[1].resize(4096);
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 4096);
    // A shrink seen through one path is enough to refuse past the new end.
    mp.ctrls[1].resize(1024);
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 1024);
    // A path that is down keeps its last size (4096): it does not hold the device back
    // from a grow the live path saw.
    mp.ctrls[0].lose(false);
    mp.ctrls[1].resize(8192);
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 8192);
    // With no path live, the smallest any reports.
    mp.ctrls[1].lose(false);
    mp.ctrls[1].resize(8192);
    mp.core.refresh_sizes();
    assert_eq!(mp.core.devices[dev].nsze, 4096);
}

#[test]
fn an_ana_error_asks_its_controller_for_the_ana_log_and_the_read_takes_the_other_path() {
    let mut mp = multipath(ContextOptions::default(), Duration::ZERO);
    let t0 = mp.t0;
    mp.core.submit(mp.dev, 0, Op::Read, 0, 4096, buf(), 5, t0).map_err(|(e, _)| e).unwrap();
    let path = if mp.sent(0).is_empty() { 1 } else { 0 };
    let mut out = Vec::new();
    EncoderConfig::default().capsule_resp(&mut out, &Cqe::with_status(Cid(0), Status::ANA_INACCESSIBLE));
    let ck = mp.ckeys[path];
    mp.core.conns[ck].as_mut().unwrap().q.feed(&out);
    mp.core.deliver(ck, false, t0, |_| {});
    assert_eq!(mp.ctrls[path].ana_refreshes.load(Relaxed), 1, "the controller re-reads its ANA log");
    assert_eq!(mp.ctrls[1 - path].ana_refreshes.load(Relaxed), 0);
    assert_eq!(mp.sent(1 - path).len(), 1, "failed over to the other path");
    assert!(mp.core.done.is_empty());
}

/// Submits a 4 KiB `op` at `block` of `dev`; the refusal's kind and text if refused.
fn try_submit(
    core: &mut BlockCore<TestCtrl>,
    dev: DeviceId,
    op: Op,
    block: u64,
    token: u64,
    now: Instant,
) -> std::result::Result<(), (ErrorKind, String)> {
    let (len, b) = if op == Op::Flush { (0, None) } else { (4096, buf()) };
    core.submit(dev, 0, op, block * 4096, len, b, token, now).map_err(|(e, _)| (e.kind, e.to_string()))
}

#[test]
fn a_namespace_replaced_under_its_nsid_fails_what_waits_and_the_device_refuses_io_for_good() {
    let mut rig = Rig::simple(8);
    rig.core.refresh_sizes();
    rig.submit(Op::Write, 0, 1, 0);
    assert_eq!(rig.sent().len(), 1);
    // The connection goes: the write waits for the reconnect; another write waits too.
    rig.lose_connection(1);
    rig.submit(Op::Write, 1, 2, 2);
    assert_eq!(rig.waiting(), 2);
    // A rescan lists another namespace (new NGUID) under NSID 1: at the poll turn both
    // waiting writes fail, neither goes to the new namespace when the queue is back.
    rig.ctrl.list(Some(IDS_B));
    rig.core.refresh_sizes();
    let mut done = rig.done();
    done.sort_unstable_by_key(|&(t, _)| t);
    assert_eq!(done, [(1, Status::HOST_PATH_ERROR), (2, Status::HOST_PATH_ERROR)]);
    assert_eq!(rig.waiting(), 0);
    rig.reconnect(8, 3);
    assert!(rig.sent().is_empty(), "nothing sent to the namespace that replaced it");
    for op in [Op::Write, Op::Read, Op::Flush] {
        let (kind, why) = rig.try_io(op, 0, 3, 4).unwrap_err();
        assert_eq!(kind, ErrorKind::NamespaceGone, "{op:?}");
        assert!(why.contains("namespace 1 was replaced"), "{why}");
    }
    // For good: even a rescan that shows the old identifiers again opens nothing.
    rig.ctrl.list(Some(IDS_A));
    rig.core.refresh_sizes();
    assert_eq!(rig.try_io(Op::Read, 0, 4, 5).unwrap_err().0, ErrorKind::NamespaceGone);
    assert!(rig.sent().is_empty() && rig.done().is_empty());
    assert_eq!(rig.core.in_flight(), 0);
}

#[test]
fn a_write_on_the_wire_when_its_namespace_was_replaced_is_not_sent_again_after_a_path_error() {
    let mut rig = Rig::simple(8);
    rig.submit(Op::Write, 0, 1, 0);
    let cid = rig.sent()[0].1;
    rig.ctrl.list(Some(IDS_B));
    rig.core.refresh_sizes();
    // It was on the wire before the host knew: its path error ends it, no retry.
    rig.answer(cid, Status::HOST_PATH_ERROR, 1);
    assert_eq!(rig.done(), [(1, Status::HOST_PATH_ERROR)]);
    assert!(rig.sent().is_empty());
    assert_eq!(rig.waiting(), 0);
}

#[test]
fn a_removed_namespace_fails_io_at_once_and_the_same_namespace_back_takes_io_again() {
    let mut rig = Rig::simple(8);
    rig.core.refresh_sizes();
    rig.lose_connection(0);
    rig.submit(Op::Read, 0, 1, 1);
    assert_eq!(rig.waiting(), 1);
    // Gone from the controller's list: the waiting read fails (does not hang), a new one
    // is refused at submission.
    rig.ctrl.list(None);
    rig.core.refresh_sizes();
    assert_eq!(rig.done(), [(1, Status::HOST_PATH_ERROR)]);
    let (kind, why) = rig.try_io(Op::Write, 0, 2, 2).unwrap_err();
    assert_eq!(kind, ErrorKind::NamespaceGone);
    assert!(why.contains("namespace 1 was removed"), "{why}");
    rig.reconnect(8, 3);
    assert!(rig.sent().is_empty());
    // Listed again with the identifiers the device was opened on: the same namespace.
    // The submission finds it back without waiting for a poll turn.
    rig.ctrl.list(Some(IDS_A));
    assert_eq!(rig.try_io(Op::Write, 0, 3, 4), Ok(()));
    let sent = rig.sent();
    assert_eq!(sent.len(), 1);
    rig.answer(sent[0].1, Status::SUCCESS, 5);
    assert_eq!(rig.done(), [(3, Status::SUCCESS)]);
    // Removed, then another namespace under the NSID: replaced, for good.
    rig.ctrl.list(None);
    rig.core.refresh_sizes();
    rig.ctrl.list(Some(IDS_B));
    rig.core.refresh_sizes();
    rig.ctrl.list(Some(IDS_A));
    let (kind, why) = rig.try_io(Op::Read, 0, 4, 6).unwrap_err();
    assert!(kind == ErrorKind::NamespaceGone && why.contains("replaced"), "{why}");
}

#[test]
fn a_change_that_keeps_the_namespace_does_not_refuse_io() {
    // A controller's change count moves for many reasons (ANA, reconnects, a resize, a
    // rescan that listed the same namespace): only its identifiers decide.
    let mut rig = Rig::simple(8);
    rig.ctrl.resize(4096);
    rig.core.refresh_sizes();
    rig.ctrl.list(Some(IDS_A));
    rig.core.refresh_sizes();
    assert_eq!(rig.try_io(Op::Read, 300, 1, 1), Ok(()));
    assert_eq!(rig.sent().len(), 1);
}

#[test]
fn a_multipath_path_whose_namespace_was_replaced_leaves_the_path_set_and_the_device_refuses_when_none_is_left() {
    let mut mp = multipath(ContextOptions::default(), Duration::ZERO);
    let t0 = mp.t0;
    mp.core.refresh_sizes();
    // Path 0's controller lists another namespace under NSID 1; path 1's the device's.
    mp.ctrls[0].list(Some(IDS_B));
    mp.core.refresh_sizes();
    mp.core.refresh_all_paths(t0);
    for token in 0..4u64 {
        assert_eq!(try_submit(&mut mp.core, mp.dev, Op::Write, token, token, t0), Ok(()));
    }
    assert!(mp.sent(0).is_empty(), "nothing to the replaced namespace");
    let on_1 = mp.sent(1);
    assert_eq!(on_1.len(), 4, "all on the path that still carries the namespace");
    // Path 1's goes too: no path carries the namespace, the device refuses.
    mp.ctrls[1].list(Some(IDS_B));
    mp.core.refresh_sizes();
    mp.core.refresh_all_paths(t0);
    let (kind, why) = try_submit(&mut mp.core, mp.dev, Op::Write, 0, 9, t0).unwrap_err();
    assert!(kind == ErrorKind::NamespaceGone && why.contains("replaced"), "{why}");
    // The writes on the wire come back with a path error: none is sent again.
    let mut out = Vec::new();
    for &(_, cid) in &on_1 {
        EncoderConfig::default().capsule_resp(&mut out, &Cqe::with_status(Cid(cid), Status::HOST_PATH_ERROR));
    }
    let ck = mp.ckeys[1];
    mp.core.conns[ck].as_mut().unwrap().q.feed(&out);
    mp.core.deliver(ck, false, t0, |_| {});
    mp.core.tick(t0 + Duration::from_millis(100));
    assert!(mp.sent(0).is_empty() && mp.sent(1).is_empty());
    let done: Vec<Status> = mp.core.done.drain(..).map(|c| c.status).collect();
    assert_eq!(done, [Status::HOST_PATH_ERROR; 4]);
    assert_eq!(mp.core.in_flight(), 0);
}
