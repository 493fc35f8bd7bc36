//! Namespace reservations end to end: hosts told apart by their Host Identifier, each
//! with its own controllers, send Reservation Register / Acquire / Release / Report
//! through user queue pairs, and the target lets each host's reads and writes through
//! (or answers Reservation Conflict) as the reservation's type says, on every path.

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::passthru::QueuePair;
use host::queue::DataDir;
use host::reservation::{self, EXCLUSIVE_ACCESS, ReservationStatus, WRITE_EXCLUSIVE, WRITE_EXCLUSIVE_REG_ONLY};
use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:default";
const HOST_A: [u8; 16] = [0xa1; 16];
const HOST_B: [u8; 16] = [0xb2; 16];

/// A registrant as the extended report lists it: Host Identifier, key, holds the reservation.
type Registrant = ([u8; 16], u64, bool);

struct Host {
    ctrl: Arc<Controller>,
    qp: QueuePair,
}

impl Host {
    fn connect(addr: std::net::SocketAddr, hostid: [u8; 16]) -> Host {
        let mut o = ConnectOptions::new(addr, NQN);
        o.hostnqn = format!("nqn.2014-08.org.nvmexpress:uuid:{:02x}{:02x}", hostid[0], hostid[1]);
        o.hostid = hostid;
        o.nr_io_queues = 1;
        o.nr_user_queues = 1;
        let ctrl = Controller::connect(o).expect("connect");
        let qp = QueuePair::new(&ctrl).expect("a user queue pair");
        Host { ctrl, qp }
    }

    /// One command on the user queue pair, its status and data back.
    fn command(&mut self, c: reservation::Command) -> (Status, Option<IoBuf>) {
        let done = self.qp.execute(c.sqe, Some(c.data), c.len, c.dir, Duration::from_secs(10)).expect("completion");
        (done.cqe.status, done.buf)
    }

    fn register(&mut self, crkey: u64, nrkey: u64, rrega: u8) -> Status {
        self.command(reservation::register(Nsid(1), rrega, crkey, nrkey, false)).0
    }

    fn acquire(&mut self, crkey: u64, prkey: u64, rtype: u8, racqa: u8) -> Status {
        self.command(reservation::acquire(Nsid(1), racqa, rtype, crkey, prkey)).0
    }

    fn release(&mut self, crkey: u64, rtype: u8, rrela: u8) -> Status {
        self.command(reservation::release(Nsid(1), rrela, rtype, crkey)).0
    }

    /// (GEN, RTYPE, [(hostid, rkey, holds)]) from the extended report.
    fn report(&mut self) -> (u32, u8, Vec<Registrant>) {
        let (s, buf) = self.command(reservation::report(Nsid(1), 1024));
        assert!(s.is_success(), "report: {s}");
        let r = ReservationStatus::parse(buf.as_deref().expect("report data")).expect("a whole header");
        assert_eq!(usize::from(r.regctl), r.registrants.len(), "every registrant fits in 1 KiB");
        (r.generation, r.rtype, r.registrants.iter().map(|e| (e.hostid, e.rkey, e.holds)).collect())
    }

    fn rw(&mut self, opcode: u8, lba: u64) -> Status {
        let sqe = Sqe::rw(opcode, Cid(0), Nsid(1), lba, 0, SglDescriptor::transport(512));
        let mut b = IoBuf::new(4096);
        b.set_len(512);
        let dir = if opcode == io::WRITE { DataDir::ToController } else { DataDir::FromController };
        let done = self.qp.execute(sqe, Some(b), 512, dir, Duration::from_secs(10)).expect("completion");
        done.cqe.status
    }
}

fn access(h: &mut Host) -> (bool, bool) {
    (h.rw(io::READ, 8).is_success(), h.rw(io::WRITE, 8).is_success())
}

#[test]
fn hosts_register_acquire_preempt_and_release_across_paths() {
    let (server, addrs) = loopback::target(1, "16M");
    let mut a = Host::connect(addrs[0], HOST_A);
    // Host A's second controller, on the other port: the same host, the same registration.
    let mut a2 = Host::connect(addrs[1], HOST_A);
    let mut b = Host::connect(addrs[1], HOST_B);
    let id = a.ctrl.identify();
    assert_ne!(id.oncs & nvme::identify::oncs::RESERVATIONS, 0, "ONCS advertises reservations");

    assert!(a.register(0, 0xaaaa, 0).is_success());
    assert!(b.register(0, 0xbbbb, 0).is_success());
    assert_eq!(a2.register(0, 0x1234, 0), Status::RESERVATION_CONFLICT, "host A is registered with another key");
    let (generation, rtype, regs) = b.report();
    assert_eq!((generation, rtype), (2, 0));
    assert_eq!(regs, vec![(HOST_A, 0xaaaa, false), (HOST_B, 0xbbbb, false)]);

    // Write Exclusive by A: B reads but may not write; A writes through either controller.
    assert!(a.acquire(0xaaaa, 0, WRITE_EXCLUSIVE, 0).is_success());
    assert_eq!(access(&mut b), (true, false));
    assert_eq!(b.rw(io::WRITE, 8), Status::RESERVATION_CONFLICT);
    assert_eq!(access(&mut a), (true, true));
    assert_eq!(access(&mut a2), (true, true), "the holder is the host, not one controller");
    assert_eq!(b.acquire(0xbbbb, 0, WRITE_EXCLUSIVE, 0), Status::RESERVATION_CONFLICT, "held by A");
    let (_, rtype, regs) = b.report();
    assert_eq!(rtype, 1);
    assert_eq!(regs[0], (HOST_A, 0xaaaa, true));

    // The block path of host B gets the conflict too, as a final status (DNR): no retry,
    // no failover to the other path.
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&b.ctrl, Nsid(1)).unwrap();
    let mut w = IoBuf::new(4096);
    w.set_len(4096);
    ctx.submit(dev, Op::Write, 0, 4096, Some(w), 1).map_err(|(e, _)| e).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        assert!(Instant::now() < deadline, "the block write never completed");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        if let Some(c) = ctx.completions().next() {
            break c;
        }
    };
    assert_eq!(done.status, Status::RESERVATION_CONFLICT);
    drop(ctx);
    // Three writes of host B refused so far, in the statistics and /metrics.
    let stats = target::metrics::stats_json(&server.state);
    let r = &stats["reservations"][0];
    assert_eq!((r["nsid"].as_u64(), r["rtype"].as_u64(), r["registrants"].as_u64()), (Some(1), Some(1), Some(2)));
    assert_eq!(r["conflicts"], 3, "{r}");
    let text = target::metrics::render(&server.state);
    assert!(
        text.contains(&format!("qpath_target_namespace_reservation_conflicts_total{{subnqn=\"{NQN}\",nsid=\"1\"}} 3"))
    );
    assert!(text.contains(&format!("qpath_target_namespace_reservation_type{{subnqn=\"{NQN}\",nsid=\"1\"}} 1")));

    // Registrants Only: B, registered, writes again.
    assert!(a.acquire(0xaaaa, 0xaaaa, WRITE_EXCLUSIVE_REG_ONLY, 1).is_success(), "the holder changes its type");
    assert_eq!(access(&mut b), (true, true));

    // B preempts A: A is unregistered and B holds Exclusive Access, so A can neither
    // read nor write, on either controller.
    assert!(b.acquire(0xbbbb, 0xaaaa, EXCLUSIVE_ACCESS, 1).is_success());
    assert_eq!(access(&mut a), (false, false));
    assert_eq!(access(&mut a2), (false, false));
    assert_eq!(a.acquire(0xaaaa, 0, WRITE_EXCLUSIVE, 0), Status::RESERVATION_CONFLICT, "A's key is gone");
    let (_, rtype, regs) = a.report();
    assert_eq!((rtype, regs), (2, vec![(HOST_B, 0xbbbb, true)]));

    // Release with the wrong type is refused; with the right one everyone has access again.
    assert_eq!(b.release(0xbbbb, WRITE_EXCLUSIVE, 0), Status::INVALID_FIELD);
    assert!(b.release(0xbbbb, EXCLUSIVE_ACCESS, 0).is_success());
    assert_eq!(access(&mut a), (true, true));
    // Clear drops every registration.
    assert!(b.release(0xbbbb, 0, 1).is_success());
    let (_, rtype, regs) = a.report();
    assert_eq!((rtype, regs.len()), (0, 0));

    // The 64-bit report format cannot carry 128-bit Host Identifiers.
    let mut c = reservation::report(Nsid(1), 1024);
    c.sqe.set_cdw(11, 0);
    assert_eq!(a.command(c).0, Status::HOST_ID_INCONSISTENT);

    drop((a.qp, a2.qp, b.qp));
    for c in [a.ctrl, a2.ctrl, b.ctrl] {
        c.delete();
    }
    server.shutdown();
}

/// `qpath resv` as a script uses it: one process per command, each its own controller,
/// the host told apart by `--hostid`; a refused command exits non-zero.
#[test]
fn the_command_line_registers_acquires_reports_and_is_refused() {
    let (server, addrs) = loopback::target(1, "16M");
    let port = addrs[0].port().to_string();
    let resv = |hostid: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_qpath"))
            .args(["resv", "-a", "127.0.0.1", "-s", &port, "-n", NQN, "--hostid", hostid])
            .args(args)
            .output()
            .expect("run qpath resv");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let a = "a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1";
    let b = "b2b2b2b2-b2b2-b2b2-b2b2-b2b2b2b2b2b2";
    assert!(resv(a, &["register", "--nrkey", "0xaaaa"]).0);
    assert!(resv(a, &["acquire", "--crkey", "0xaaaa", "--rtype", "1"]).0);
    let (ok, text) = resv(b, &["write", "--slba", "3"]);
    assert!(!ok, "host B's write under A's Write Exclusive: {text}");
    assert!(text.contains("RESERVATION_CONFLICT"), "{text}");
    let (ok, text) = resv(b, &["read", "--slba", "3"]);
    assert!(ok, "reads stay open under Write Exclusive: {text}");
    let (ok, text) = resv(b, &["--json", "report"]);
    assert!(ok, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).expect("JSON");
    assert_eq!(report["rtype"], 1);
    assert_eq!(report["regctl"], 1);
    assert_eq!(report["regctlext"][0]["rkey"], 0xaaaa);
    assert_eq!(report["regctlext"][0]["rcsts"], 1);
    assert_eq!(report["regctlext"][0]["hostid"], a.replace('-', ""));
    let (ok, text) = resv(b, &["release", "--crkey", "1", "--rtype", "1"]);
    assert!(!ok && text.contains("RESERVATION_CONFLICT"), "B is not registered: {text}");
    // The operator's view and way out: the RPC reports the holder and clears it.
    let nsid = serde_json::json!({"nqn": NQN, "nsid": 1});
    let r = target::rpc::call(&server, "get_reservation", &nsid).expect("get_reservation");
    assert_eq!(r["rtype"], 1);
    assert_eq!(r["registrants"][0]["hostid"], a.replace('-', ""));
    assert_eq!(r["registrants"][0]["holds"], true);
    let r = target::rpc::call(&server, "clear_reservation", &nsid).expect("clear_reservation");
    assert_eq!(r["cleared_registrations"], 1);
    assert_eq!(target::rpc::call(&server, "get_reservation", &nsid).unwrap()["rtype"], 0);
    let (ok, text) = resv(a, &["release", "--crkey", "0xaaaa", "--rtype", "1"]);
    assert!(!ok && text.contains("RESERVATION_CONFLICT"), "A's registration went with the clear: {text}");
    let (ok, text) = resv(b, &["write", "--slba", "3"]);
    assert!(ok, "released: {text}");
    server.shutdown();
}

/// Persist Through Power Loss: a file-backed namespace with a `ptpl_file`, a host that
/// turns it on while registering, then the target stops and a new one starts from the
/// same configuration: the reservation and the registrations are back before any I/O,
/// so another host is still fenced and the holder still writes.
#[test]
fn a_reservation_persists_through_a_target_restart() {
    use target::config::{Config, NamespaceConfig, SizeValue};
    use target::reactor::{PollMode, ReactorOptions};

    let dir = std::env::temp_dir().join(format!("qpath-ptpl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = Config::embedded_default();
    cfg.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    for p in &mut cfg.ports {
        p.addr = "127.0.0.1:0".into();
    }
    cfg.subsystems[0].namespaces = vec![NamespaceConfig {
        backend: "file".into(),
        path: Some(dir.join("ns1.img")),
        size: Some(SizeValue::Text("16M".into())),
        ptpl_file: Some(dir.join("ns1.resv")),
        ..NamespaceConfig::ram(1, "16M")
    }];
    let start = |cfg: &Config| {
        let server = cfg.clone().start().expect("the target starts");
        let addr = server.state.ports()[0].addr;
        (server, addr)
    };

    let (server, addr) = start(&cfg);
    let mut a = Host::connect(addr, HOST_A);
    let c = reservation::register(Nsid(1), reservation::REGISTER, 0, 0xaaaa, false).cptpl(3);
    assert!(a.command(c).0.is_success(), "PTPL on with the registration");
    assert!(a.acquire(0xaaaa, 0, WRITE_EXCLUSIVE, 0).is_success());
    let (_, rtype, regs) = a.report();
    assert_eq!((rtype, regs), (1, vec![(HOST_A, 0xaaaa, true)]));
    drop(a.qp);
    a.ctrl.delete();
    server.shutdown();

    let (server, addr) = start(&cfg);
    let mut b = Host::connect(addr, HOST_B);
    assert_eq!(b.rw(io::WRITE, 8), Status::RESERVATION_CONFLICT, "still fenced after the restart");
    assert!(b.rw(io::READ, 8).is_success());
    let (s, buf) = b.command(reservation::report(Nsid(1), 1024));
    assert!(s.is_success());
    let r = ReservationStatus::parse(buf.as_deref().unwrap()).unwrap();
    assert!(r.ptpls, "the report says the state persists");
    assert_eq!((r.rtype, r.holder().map(|h| (h.hostid, h.rkey))), (1, Some((HOST_A, 0xaaaa))));
    let mut a = Host::connect(addr, HOST_A);
    assert!(a.rw(io::WRITE, 8).is_success(), "the holder writes after the restart");
    // Turning it off: the next restart starts with no reservation.
    let c = reservation::register(Nsid(1), reservation::REGISTER, 0, 0xaaaa, false).cptpl(2);
    assert!(a.command(c).0.is_success());
    for h in [a, b] {
        drop(h.qp);
        h.ctrl.delete();
    }
    server.shutdown();
    let (server, addr) = start(&cfg);
    let mut b = Host::connect(addr, HOST_B);
    assert!(b.rw(io::WRITE, 8).is_success(), "PTPL was off: nothing came back");
    drop(b.qp);
    b.ctrl.delete();
    server.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}
