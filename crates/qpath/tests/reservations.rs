//! Namespace reservations end to end: hosts told apart by their Host Identifier, each
//! with its own controllers, send Reservation Register / Acquire / Release / Report
//! through user queue pairs, and the target lets each host's reads and writes through
//! (or answers Reservation Conflict) as the reservation's type says, on every path.

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::passthru::{PtCompletion, QueuePair};
use host::queue::DataDir;
use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:default";
const HOST_A: [u8; 16] = [0xa1; 16];
const HOST_B: [u8; 16] = [0xb2; 16];
const WRITE_EXCLUSIVE: u32 = 1;
const EXCLUSIVE_ACCESS: u32 = 2;
const WRITE_EXCLUSIVE_REG_ONLY: u32 = 3;

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

    /// One raw command on the user queue pair, its status and data back.
    fn command(&mut self, sqe: Sqe, data: Option<IoBuf>, len: u32, dir: DataDir) -> (Status, Option<IoBuf>) {
        self.qp.submit(sqe, data, len, dir, 7).map_err(|(e, _)| e).expect("submit");
        let mut out: Vec<PtCompletion> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.is_empty() {
            assert!(Instant::now() < deadline, "no completion");
            self.qp.poll(&mut out).expect("poll");
        }
        let c = out.pop().expect("one completion");
        (c.cqe.status, c.buf)
    }

    fn keys(&mut self, opcode: u8, cdw10: u32, k1: u64, k2: Option<u64>) -> Status {
        let len = if k2.is_some() { 16 } else { 8 };
        let mut b = IoBuf::new(4096);
        b.set_len(len);
        b[..8].copy_from_slice(&k1.to_le_bytes());
        if let Some(k2) = k2 {
            b[8..16].copy_from_slice(&k2.to_le_bytes());
        }
        let mut sqe = Sqe::new(opcode);
        sqe.set_nsid(Nsid(1));
        sqe.set_cdw(10, cdw10);
        self.command(sqe, Some(b), u32::try_from(len).unwrap(), DataDir::ToController).0
    }

    fn register(&mut self, crkey: u64, nrkey: u64, rrega: u32) -> Status {
        self.keys(io::RESV_REGISTER, rrega, crkey, Some(nrkey))
    }

    fn acquire(&mut self, crkey: u64, prkey: u64, rtype: u32, racqa: u32) -> Status {
        self.keys(io::RESV_ACQUIRE, rtype << 8 | racqa, crkey, Some(prkey))
    }

    fn release(&mut self, crkey: u64, rtype: u32, rrela: u32) -> Status {
        self.keys(io::RESV_RELEASE, rtype << 8 | rrela, crkey, None)
    }

    /// (GEN, RTYPE, [(hostid, rkey, holds)]) from the extended report.
    fn report(&mut self) -> (u32, u8, Vec<Registrant>) {
        let mut sqe = Sqe::new(io::RESV_REPORT);
        sqe.set_nsid(Nsid(1));
        sqe.set_cdw(10, 1024 / 4 - 1);
        sqe.set_cdw(11, 1);
        let (s, buf) = self.command(sqe, Some(IoBuf::new(4096)), 1024, DataDir::FromController);
        assert!(s.is_success(), "report: {s}");
        let b = buf.expect("report data");
        let n = usize::from(u16::from_le_bytes([b[5], b[6]]));
        let regs = (0..n)
            .map(|i| {
                let e = &b[64 + i * 64..][..64];
                (e[16..32].try_into().unwrap(), u64::from_le_bytes(e[8..16].try_into().unwrap()), e[2] & 1 == 1)
            })
            .collect();
        (u32::from_le_bytes(b[0..4].try_into().unwrap()), b[4], regs)
    }

    fn rw(&mut self, opcode: u8, lba: u64) -> Status {
        let sqe = Sqe::rw(opcode, Cid(0), Nsid(1), lba, 0, SglDescriptor::transport(512));
        let mut b = IoBuf::new(4096);
        b.set_len(512);
        let dir = if opcode == io::WRITE { DataDir::ToController } else { DataDir::FromController };
        self.command(sqe, Some(b), 512, dir).0
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
    let mut sqe = Sqe::new(io::RESV_REPORT);
    sqe.set_nsid(Nsid(1));
    sqe.set_cdw(10, 1024 / 4 - 1);
    let (s, _) = a.command(sqe, Some(IoBuf::new(4096)), 1024, DataDir::FromController);
    assert_eq!(s, Status::HOST_ID_INCONSISTENT);

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
    assert!(resv(a, &["release", "--crkey", "0xaaaa", "--rtype", "1"]).0);
    let (ok, text) = resv(b, &["write", "--slba", "3"]);
    assert!(ok, "released: {text}");
    server.shutdown();
}
