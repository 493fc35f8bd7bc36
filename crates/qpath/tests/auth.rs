//! DH-HMAC-CHAP in-band authentication, our host against our target over
//! loopback TCP: unidirectional and bidirectional success for every hash with
//! the null, ffdhe2048 and ffdhe3072 groups (ffdhe8192 once), and the refusals:
//! a wrong key, a missing key, a host not on the list, a host that skips the
//! transaction; discovery needs no authentication; live queues re-authenticate
//! beside their I/O after a key rotation. The target's DH steps run on its
//! authentication workers (two per queue), and a host that hangs up during one leaves
//! nothing behind.

mod loopback;

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller, CtrlState};
use host::queue::{DataDir, Io, QueueConfig, QueueState};
use host::sync::SyncQueue;
use nvme::auth::{DhGroup, HashId, Secret};
use nvme::{Cid, Nsid, Sqe, Status};
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;
use uring::{IoBuf, Wait};

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:authtest";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6d0e2b4c-1c1a-4c4e-9e55-4a7f0c0a0001";
const PLAIN_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6d0e2b4c-1c1a-4c4e-9e55-4a7f0c0a0002";

struct Keys {
    host: Secret,
    ctrl: Option<Secret>,
}

fn keys(hash: HashId, bidi: bool) -> Keys {
    Keys {
        host: Secret::generate(Some(hash), hash.len()).unwrap(),
        ctrl: bidi.then(|| Secret::generate(Some(hash), hash.len()).unwrap()),
    }
}

fn start(k: &Keys, hash: HashId, group: DhGroup) -> (Server, u16) {
    let port = free_port();
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports = vec![PortConfig::io(1, format!("127.0.0.1:{port}"))];
    c.subsystems = vec![SubsystemConfig {
        allow_any_host: false,
        hosts: vec![
            HostEntry::Nqn(PLAIN_HOST.into()),
            HostEntry::Auth(HostAuthConfig {
                nqn: HOST.into(),
                dhchap_key: Some(k.host.to_string()),
                dhchap_ctrl_key: k.ctrl.as_ref().map(ToString::to_string),
                hash: Some(hash.linux_name().into()),
                dhgroup: Some(group.name().into()),
                ..Default::default()
            }),
        ],
        ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "16M")])
    }];
    (c.start().unwrap(), port)
}

fn options(port: u16, hostnqn: &str, secret: Option<&Secret>, ctrl: Option<&Secret>) -> ConnectOptions {
    let mut o = ConnectOptions::new(format!("127.0.0.1:{port}").parse().unwrap(), NQN);
    o.hostnqn = hostnqn.into();
    o.nr_io_queues = 2;
    o.connect_timeout = Duration::from_secs(20);
    o.dhchap_secret = secret.map(ToString::to_string);
    o.dhchap_ctrl_secret = ctrl.map(ToString::to_string);
    o
}

/// Connects with the right keys, checks the controller is usable, and (when `io`) moves data.
fn connect_ok(hash: HashId, group: DhGroup, bidi: bool, io: bool) {
    let k = keys(hash, bidi);
    let (server, port) = start(&k, hash, group);
    let t0 = Instant::now();
    let ctrl = Controller::connect(options(port, HOST, Some(&k.host), k.ctrl.as_ref()))
        .unwrap_or_else(|e| panic!("{hash:?} {group:?} bidi {bidi}: {e}"));
    let took = t0.elapsed();
    assert_eq!(ctrl.state(), CtrlState::Live);
    assert_eq!(ctrl.io_queue_count(), 2);
    assert_eq!(ctrl.namespace(Nsid(1)).unwrap().size_bytes(), 16 << 20);
    eprintln!("{hash:?} {group:?} bidirectional={bidi}: admin + 2 I/O queues authenticated in {took:?}");
    // Both DH steps of each of the 3 queues ran on the target's workers, not its reactor.
    let offloaded = if group == DhGroup::Null { 0 } else { 2 * 3 };
    assert_eq!(server.state.auth_workers.computed(), offloaded, "{group:?}");
    let metrics = target::metrics::render(&server.state);
    assert!(metrics.contains(&format!("\nqpath_target_auth_dh_steps_total {offloaded}\n")), "{metrics}");
    assert!(metrics.contains("\nqpath_target_auth_dh_steps_pending 0\n"), "{metrics}");
    assert!(metrics.contains("\nqpath_target_auth_dh_hosts_waiting 0\n"), "{metrics}");
    let stats = target::metrics::stats_json(&server.state);
    let auth = &stats["auth"];
    assert_eq!((&auth["dh_steps_submitted"], &auth["dh_steps_computed"]), (&offloaded.into(), &offloaded.into()));
    assert_eq!((&auth["dh_steps_abandoned"], &auth["dh_hosts_waiting"]), (&0.into(), &0.into()), "{auth}");
    assert_eq!((&auth["transactions_accepted"], &auth["transactions_refused"]), (&3.into(), &0.into()), "{auth}");
    assert!(
        metrics.contains("\nqpath_target_auth_transactions_total{result=\"accepted\",renewal=\"false\"} 3\n"),
        "{metrics}"
    );
    if io {
        let mut ctx = Context::new(ContextOptions::default()).unwrap();
        let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
        let mut w = IoBuf::new(8192);
        w.set_len(8192);
        w.iter_mut().enumerate().for_each(|(i, b)| *b = u8::try_from(i % 251).unwrap());
        let expect = w[..].to_vec();
        ctx.submit(dev, Op::Write, 4096, 8192, Some(w), 1).map_err(|(e, _)| e).unwrap();
        let c = wait(&mut ctx, 1);
        assert!(c[0].status.is_success(), "write: {}", c[0].status);
        ctx.submit(dev, Op::Read, 4096, 8192, Some(IoBuf::new(8192)), 2).map_err(|(e, _)| e).unwrap();
        let c = wait(&mut ctx, 1);
        assert!(c[0].status.is_success());
        assert_eq!(c[0].buf.as_ref().unwrap()[..8192], expect[..]);
        drop(ctx);
    }
    ctrl.delete();
    server.shutdown();
}

fn wait(ctx: &mut Context, n: usize) -> Vec<host::context::Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        assert!(Instant::now() < deadline, "timed out");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        out.extend(ctx.completions());
    }
    out
}

fn matrix(hash: HashId) {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
        for bidi in [false, true] {
            connect_ok(hash, group, bidi, group == DhGroup::Ffdhe2048 && bidi);
        }
    }
}

#[test]
fn sha256_null_ffdhe2048_ffdhe3072_uni_and_bidirectional() {
    matrix(HashId::Sha256);
}

#[test]
fn sha384_null_ffdhe2048_ffdhe3072_uni_and_bidirectional() {
    matrix(HashId::Sha384);
}

#[test]
fn sha512_null_ffdhe2048_ffdhe3072_uni_and_bidirectional() {
    matrix(HashId::Sha512);
}

#[test]
fn sha512_ffdhe8192_bidirectional() {
    connect_ok(HashId::Sha512, DhGroup::Ffdhe8192, true, true);
}

fn connect_err(o: ConnectOptions) -> String {
    match Controller::connect(o) {
        Ok(c) => {
            c.delete();
            panic!("connected although it should not have")
        }
        Err(e) => e.to_string(),
    }
}

#[test]
fn refusals() {
    let k = keys(HashId::Sha256, true);
    let (server, port) = start(&k, HashId::Sha256, DhGroup::Ffdhe2048);
    let other = Secret::generate(Some(HashId::Sha256), 32).unwrap();

    // Wrong host key: the controller answers AUTH_Failure1.
    let e = connect_err(options(port, HOST, Some(&other), None));
    assert!(e.contains("AUTH_Failure1"), "{e}");
    // Right host key, wrong controller key: the host refuses the controller.
    let e = connect_err(options(port, HOST, Some(&k.host), Some(&other)));
    assert!(e.contains("controller's response is wrong"), "{e}");
    // No key at all, though the controller requires one.
    let e = connect_err(options(port, HOST, None, None));
    assert!(e.contains("no dhchap secret"), "{e}");
    // A host not on the list gets no further than Connect.
    let e = connect_err(options(
        port,
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000dead",
        Some(&k.host),
        None,
    ));
    assert!(e.contains("Connect refused"), "{e}");
    // A listed host without keys connects without authenticating.
    let c = Controller::connect(options(port, PLAIN_HOST, None, None)).unwrap();
    assert_eq!(c.state(), CtrlState::Live);
    c.delete();
    // Discovery asks nothing of an authenticating host.
    let log = host::discovery::discovery_log(
        format!("127.0.0.1:{port}").parse().unwrap(),
        HOST,
        [1; 16],
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(log.iter().any(|e| e.subnqn == NQN), "{log:?}");
    server.shutdown();
}

/// A raw admin queue of `HOST` on `port`, connected up to the target's request to
/// authenticate (by `deadline`), the transaction left to the test.
fn until_authenticating(port: u16, deadline: Instant) -> SyncQueue {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut cfg = QueueConfig::io(0, 32, nvme::Cntlid::DYNAMIC, NQN, HOST, [1; 16]);
    cfg.disable_sqflow = false;
    let q = SyncQueue::until_connected(s, cfg, deadline.saturating_duration_since(Instant::now())).unwrap();
    assert_eq!(q.queue().state(), QueueState::Authenticating);
    q
}

/// Polls `done` (every millisecond) until it holds; past `deadline` the test fails with `what()`.
fn wait_until(deadline: Instant, done: impl Fn() -> bool, what: impl Fn() -> String) {
    while !done() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends an AUTH_Negotiate offering every group, in the capsule, without waiting.
fn negotiate(q: &mut SyncQueue) {
    let m = nvme::auth::Message::Negotiate(nvme::auth::Negotiate::offer_all(1));
    q.submit(host::auth::send_io(&m).unwrap()).unwrap();
}

/// A host that skips the transaction: every other command gets AUTH_REQUIRED, and a
/// Receive out of turn gets AUTH_Failure1 and the connection closed.
#[test]
fn unauthenticated_queue_gets_auth_required() {
    let k = keys(HashId::Sha256, false);
    let (server, port) = start(&k, HashId::Sha256, DhGroup::Null);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut q = until_authenticating(port, deadline);
    // Pretend it authenticated and try an Identify and a Property Get.
    q.queue_mut().authenticated();
    let identify = Sqe::identify(Cid(0), nvme::identify::cns::CONTROLLER, Nsid(0), 0, 0);
    let io = Io { sqe: identify, buf: Some(IoBuf::new(4096)), len: 4096, dir: DataDir::FromController, token: 0 };
    let mut tokens = vec![q.submit(io).unwrap()];
    let prop = nvme::fabrics::PropertyCmd::get_sqe(Cid(0), nvme::fabrics::prop::CAP, true);
    tokens.push(q.submit(Io { sqe: prop, buf: None, len: 0, dir: DataDir::None, token: 0 }).unwrap());
    let mut done = Vec::new();
    while done.len() < 2 {
        q.pump(deadline).expect("no completion");
        done.extend(std::iter::from_fn(|| q.take_any()));
    }
    assert_eq!(done.iter().map(|d| d.token).collect::<std::collections::BTreeSet<_>>(), tokens.into_iter().collect());
    for d in &done {
        assert_eq!(d.cqe.status, Status::AUTH_REQUIRED, "token {}", d.token);
    }
    server.shutdown();
}

/// A host that sends its Negotiate and hangs up while the target's worker makes the
/// ffdhe8192 key pair: the connection is freed without waiting for it, the late result
/// is dropped, and the target goes on serving (the next host authenticates).
#[test]
fn a_queue_closed_during_its_dh_step_is_freed_and_its_result_dropped() {
    let k = keys(HashId::Sha512, false);
    let (server, port) = start(&k, HashId::Sha512, DhGroup::Ffdhe8192);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut r = until_authenticating(port, deadline);
    // Then hang up at once.
    negotiate(&mut r);
    let workers = &server.state.auth_workers;
    wait_until(deadline, || workers.submitted() > 0, || "the Negotiate never reached the workers".into());
    drop(r);
    // The connection goes without waiting for its step (16 ms of work)...
    let held = || server.state.queues().len();
    wait_until(deadline, || held() == 0, || format!("the closed queue is still held: {}", held()));
    eprintln!("queue freed with {} of 1 step finished", workers.computed());
    // ...whose result, if a worker had started it, comes later, to nobody (a step not
    // started yet is skipped).
    wait_until(deadline, || workers.pending() == 0, || "the step never finished".into());
    assert_eq!(workers.computed() + workers.abandoned(), 1, "{workers:?}");
    let before = workers.computed();
    let c = Controller::connect(options(port, HOST, Some(&k.host), None)).unwrap();
    assert_eq!(c.state(), CtrlState::Live);
    assert_eq!(workers.computed(), before + 2 * 3, "admin + 2 I/O queues' two steps each");
    c.delete();
    server.shutdown();
}

/// Hosts that send a Negotiate and hang up before the target's workers get to it cost
/// the workers nothing: once the connections are gone, only the steps already running
/// finish, the others are skipped (abandoned), and the target goes on.
#[test]
fn steps_of_closed_connections_are_abandoned() {
    const N: u64 = 12;
    let k = keys(HashId::Sha512, false);
    let (server, port) = start(&k, HashId::Sha512, DhGroup::Ffdhe8192);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut raws: Vec<SyncQueue> = (0..N).map(|_| until_authenticating(port, deadline)).collect();
    raws.iter_mut().for_each(negotiate);
    let workers = &server.state.auth_workers;
    wait_until(deadline, || workers.submitted() >= N, || format!("{workers:?}"));
    drop(raws);
    // A connection abandons its step when it closes, before it leaves the registry.
    let held = || server.state.queues().len();
    wait_until(deadline, || held() == 0, || format!("closed queues still held: {}", held()));
    let computed_at_close = workers.computed();
    wait_until(deadline, || workers.pending() == 0, || format!("{workers:?}"));
    eprintln!("{N} Negotiates: {computed_at_close} steps done when the last queue closed, {workers:?}");
    let running = u64::try_from(target::offload::MAX_WORKERS).unwrap();
    assert!(workers.computed() <= computed_at_close + running, "only running steps finish: {workers:?}");
    assert_eq!(workers.computed() + workers.abandoned(), N, "{workers:?}");
    let metrics = target::metrics::render(&server.state);
    let abandoned = format!("\nqpath_target_auth_dh_steps_abandoned_total {}\n", workers.abandoned());
    assert!(metrics.contains(&abandoned), "{metrics}");
    let c = Controller::connect(options(port, HOST, Some(&k.host), None)).unwrap();
    assert_eq!(c.state(), CtrlState::Live);
    c.delete();
    server.shutdown();
}

#[test]
fn rpc_sets_and_clears_keys() {
    let k = keys(HashId::Sha384, false);
    let (server, port) = start(&k, HashId::Sha384, DhGroup::Null);
    let server = Arc::new(server);
    let fresh = Secret::generate(Some(HashId::Sha384), 48).unwrap();
    target::rpc::call(
        &server,
        "set_host_auth",
        &serde_json::json!({"nqn": NQN, "host": HOST, "dhchap_key": fresh.to_string(), "dhgroup": "ffdhe2048"}),
    )
    .unwrap();
    assert!(connect_err(options(port, HOST, Some(&k.host), None)).contains("AUTH_Failure1"));
    let c = Controller::connect(options(port, HOST, Some(&fresh), None)).unwrap();
    c.delete();
    // Without a key the host is still allowed, and no longer authenticates.
    target::rpc::call(&server, "set_host_auth", &serde_json::json!({"nqn": NQN, "host": HOST})).unwrap();
    let c = Controller::connect(options(port, HOST, None, None)).unwrap();
    c.delete();
    let list = target::rpc::call(&server, "list_subsystems", &serde_json::json!({})).unwrap();
    assert_eq!(list[0]["auth_hosts"], serde_json::json!([]));
    assert!(serde_json::to_string(&list).unwrap().find("DHHC-1").is_none(), "keys never leave the target");
    if let Ok(s) = Arc::try_unwrap(server) {
        s.shutdown();
    }
}

/// The I/O of [`live_queues_reauthenticate_beside_their_io`]: 4 KiB writes and verified
/// reads, 16 in flight over two queues of 8 entries (so full, and a control command
/// must wait for an entry), until `stop`. Returns (I/Os done, I/Os done after
/// `mark` was set, failures).
fn verified_io(
    ctrl: &Arc<Controller>,
    stop: &std::sync::atomic::AtomicBool,
    mark: &std::sync::atomic::AtomicBool,
) -> (u64, u64, Vec<String>) {
    use std::sync::atomic::Ordering::Acquire;
    const BLOCKS: u64 = 64;
    let pattern = |b: u64, buf: &mut [u8]| {
        let b = b.to_le_bytes()[0];
        buf.iter_mut().enumerate().for_each(|(i, x)| *x = b ^ i.to_le_bytes()[0]);
    };
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let qkeys = ctx.attach_queues(ctrl, 2).unwrap();
    let dev = ctx.open_spread(&qkeys, Nsid(1), host::context::QueueSpread::RoundRobin).unwrap();
    // A user queue pair on the same thread: its re-authentication goes through its poll.
    let mut qp = host::passthru::QueuePair::new(ctrl).unwrap();
    let (mut raw, mut flushes, mut raw_inflight) = (Vec::new(), 0u64, 0u32);
    let (mut done, mut after, mut failures) = (0u64, 0u64, Vec::new());
    let mut next = 0u64;
    let submit = |ctx: &mut Context, n: u64| {
        let b = n % BLOCKS;
        // The first pass writes every block; then reads (checked) and rewrites alternate.
        let (op, mut buf) =
            if n < BLOCKS || n % 2 == 1 { (Op::Write, IoBuf::new(4096)) } else { (Op::Read, IoBuf::new(4096)) };
        buf.set_len(4096);
        if op == Op::Write {
            pattern(b, &mut buf);
        }
        ctx.submit(dev, op, b * 4096, 4096, Some(buf), (n << 1) | u64::from(op == Op::Read))
            .map_err(|(e, _)| e)
            .unwrap();
    };
    for _ in 0..BLOCKS.min(16) {
        submit(&mut ctx, next);
        next += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut inflight = BLOCKS.min(16);
    while inflight > 0 {
        assert!(Instant::now() < deadline, "the I/O did not finish");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(1)) }).unwrap();
        qp.poll(&mut raw).unwrap();
        for c in raw.drain(..) {
            raw_inflight -= 1;
            if !c.cqe.status.is_success() {
                failures.push(format!("user queue flush {}: {}", c.user_data, c.cqe.status));
            }
        }
        if raw_inflight == 0 && !stop.load(Acquire) {
            let flush = Sqe::flush(Cid(0), Nsid(1));
            qp.submit(flush, None, 0, DataDir::None, flushes).map_err(|(e, _)| e).unwrap();
            (flushes, raw_inflight) = (flushes + 1, 1);
        }
        let finished: Vec<_> = ctx.completions().collect();
        for c in finished {
            inflight -= 1;
            done += 1;
            if mark.load(Acquire) {
                after += 1;
            }
            let (n, read) = (c.token >> 1, c.token & 1 == 1);
            if !c.status.is_success() {
                failures.push(format!("I/O {n}: {}", c.status));
            } else if read {
                let mut want = vec![0u8; 4096];
                pattern(n % BLOCKS, &mut want);
                if c.buf.as_ref().is_none_or(|b| b[..4096] != want[..]) {
                    failures.push(format!("read {n}: wrong data"));
                }
            }
            // Reads start once the first pass has written every block.
            if !stop.load(Acquire) && (next >= BLOCKS || done + inflight < BLOCKS) {
                submit(&mut ctx, next);
                next += 1;
                inflight += 1;
            }
        }
    }
    while raw_inflight > 0 {
        assert!(Instant::now() < deadline, "the user queue's flush did not finish");
        raw_inflight -= u32::try_from(qp.poll(&mut raw).unwrap()).unwrap();
    }
    assert!(flushes > 0);
    (done, after, failures)
}

/// A live controller re-authenticates (the keys rotated on both sides, the DH group
/// with them) while its queues carry verified I/O: the admin queue, the two queues a
/// context owns (their commands go through the context beside full queues), a user
/// queue pair's (through its poll) and a parked one; nothing fails, nothing
/// reconnects, and the target computed the DH steps of five more transactions. Then a rotation to keys the target does not hold
/// is refused, the controller goes down, and comes back with those keys once the
/// target has them (reconnects use the newest keys).
#[test]
fn live_queues_reauthenticate_beside_their_io() {
    use std::sync::atomic::{AtomicBool, Ordering::Release};
    let k = keys(HashId::Sha384, true);
    let (server, port) = start(&k, HashId::Sha384, DhGroup::Ffdhe2048);
    let server = Arc::new(server);
    let mut o = options(port, HOST, Some(&k.host), k.ctrl.as_ref());
    o.nr_io_queues = 3;
    o.nr_user_queues = 1;
    o.queue_size = 8;
    o.reconnect_delay = Duration::from_millis(50);
    let ctrl = Controller::connect(o).unwrap();
    let steps = || server.state.auth_workers.computed();
    assert_eq!(steps(), 2 * 5, "admin + 3 I/O queues + a user queue, two DH steps each");

    let (stop, mark) = (AtomicBool::new(false), AtomicBool::new(false));
    let rotate = |host: &Secret, ctrl_key: &Secret, group: &str| {
        let p = serde_json::json!({"nqn": NQN, "host": HOST, "dhchap_key": host.to_string(),
            "dhchap_ctrl_key": ctrl_key.to_string(), "hash": "hmac(sha384)", "dhgroup": group});
        target::rpc::call(&server, "set_host_auth", &p).unwrap();
    };
    let fresh = keys(HashId::Sha384, true);
    let fresh_ctrl = fresh.ctrl.clone().unwrap();
    let new_keys = host::auth::DhchapKeys { host: fresh.host.clone(), ctrl: Some(fresh_ctrl.clone()) };
    let (io, report) = std::thread::scope(|s| {
        let io = s.spawn(|| verified_io(&ctrl, &stop, &mark));
        std::thread::sleep(Duration::from_millis(300));
        rotate(&fresh.host, &fresh_ctrl, "ffdhe3072");
        let report = ctrl.reauthenticate(Some(new_keys.clone()), Duration::from_secs(20));
        mark.store(true, Release);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Release);
        (io.join().unwrap(), report)
    });
    let report = report.unwrap();
    let (done, after, failures) = io;
    eprintln!(
        "re-authenticated {} I/O queues in {:?} beside {done} I/Os ({after} after it)",
        report.io_queues, report.took
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!((report.io_queues, report.failed.len()), (4, 0), "{:?}", report.failed);
    assert!(after > 0, "I/O went on after the re-authentication");
    assert_eq!(steps(), 2 * 10, "five more transactions, each with its two DH steps");
    assert_eq!(ctrl.state(), CtrlState::Live);
    assert_eq!(ctrl.info().reconnects, 0, "re-authentication is not a reconnect");
    assert_eq!((ctrl.info().reauths, ctrl.info().reauth_failures), (1, 0));
    let auth = |k: &str| target::metrics::stats_json(&server.state)["auth"][k].as_u64().unwrap();
    assert_eq!((auth("transactions_accepted"), auth("reauthentications_accepted")), (10, 5), "5 queues, twice");
    assert_eq!(ctrl.keys(), Some(new_keys));

    // A rotation to keys the target does not hold: the admin queue's transaction is refused.
    let wrong = keys(HashId::Sha384, true);
    let wrong_keys = host::auth::DhchapKeys { host: wrong.host.clone(), ctrl: wrong.ctrl.clone() };
    let e = ctrl.reauthenticate(Some(wrong_keys), Duration::from_secs(20)).unwrap_err();
    assert!(e.to_string().contains("AUTH_Failure1"), "{e}");
    assert_eq!((ctrl.info().reauths, ctrl.info().reauth_failures), (1, 1));
    // The admin queue's (the controller's reconnects with the same keys may be refused by now too).
    assert_eq!(auth("reauthentications_refused"), 1);
    assert!(auth("transactions_refused") >= 1);
    // The target closed the admin queue; the controller resets, and reconnects only once
    // the target holds the keys the host now has.
    let deadline = Instant::now() + Duration::from_secs(10);
    wait_until(deadline, || ctrl.state() != CtrlState::Live, || "still live after a failed re-authentication".into());
    std::thread::sleep(Duration::from_millis(200));
    assert_ne!(ctrl.state(), CtrlState::Live, "reconnected with keys the target does not hold");
    rotate(&wrong.host, wrong.ctrl.as_ref().unwrap(), "ffdhe2048");
    let deadline = Instant::now() + Duration::from_secs(20);
    wait_until(deadline, || ctrl.state() == CtrlState::Live, || format!("not back: {:?}", ctrl.info()));
    assert!(ctrl.info().reconnects >= 1);
    ctrl.delete();

    // A controller that never asked this host to authenticate has nothing to renew.
    let plain = Controller::connect(options(port, PLAIN_HOST, None, None)).unwrap();
    let e = plain.reauthenticate(None, Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("no DH-HMAC-CHAP secret"), "{e}");
    let e = plain.reauthenticate(Some(new_keys_for_plain()), Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("did not ask for authentication"), "{e}");
    plain.delete();
    if let Ok(s) = Arc::try_unwrap(server) {
        s.shutdown();
    }
}

fn new_keys_for_plain() -> host::auth::DhchapKeys {
    host::auth::DhchapKeys { host: Secret::generate(Some(HashId::Sha256), 32).unwrap(), ctrl: None }
}

/// `qpath connect --reauthenticate [--reauth-secret ...]`: the command line's way to it.
#[test]
fn connect_reauthenticate_on_the_command_line() {
    let k = keys(HashId::Sha256, true);
    let (server, port) = start(&k, HashId::Sha256, DhGroup::Ffdhe2048);
    let run = |extra: &[&str]| {
        let (host, ctrl) = (k.host.to_string(), k.ctrl.as_ref().unwrap().to_string());
        let port = port.to_string();
        let mut args = vec!["connect", "-a", "127.0.0.1", "-s", &port, "-n", NQN, "-q", HOST, "-i", "2"];
        args.extend(["-S", &host, "-C", &ctrl, "--reauthenticate"]);
        args.extend(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_qpath")).args(&args).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let (ok, out) = run(&[]);
    assert!(ok && out.contains("re-authenticated admin + 2 I/O queues in "), "{out}");
    let before = server.state.auth_workers.computed();
    assert_eq!(before, 2 * 2 * 3, "connect and re-authentication: two DH steps per queue each");
    // A secret the target does not hold: the admin queue is refused, the command fails.
    let other = Secret::generate(Some(HashId::Sha256), 32).unwrap().to_string();
    let (ok, out) = run(&["--reauth-secret", &other]);
    assert!(
        !ok && out.contains("re-authentication of the admin queue failed") && out.contains("AUTH_Failure1"),
        "{out}"
    );
    server.shutdown();
}
