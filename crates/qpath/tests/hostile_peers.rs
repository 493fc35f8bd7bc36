//! Hostile peers over real TCP sockets against a running target, one attack per test,
//! while our host runs verified I/O on the same target (one reactor, so the attacker and
//! the healthy queues share a thread) the whole time: the healthy host must see no error
//! and no reconnect, and every attacking connection must be closed, by its answer (a
//! C2HTermReq) or by a timeout, without the target holding anything afterwards.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

use std::io::Write;
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller, CtrlState};
use nvme::opcode::io;
use nvme::tcp::{DataHeader, Digests, Fes, Header, IcReq};
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use rand::{Rng, SeedableRng};
use target::config::{Config, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;
use uring::{IoBuf, Wait};

mod loopback;
mod support;
use loopback::free_port;
use support::{NQN, Peer, SLACK};

/// The connect and PDU timeouts of the target under attack, ms.
const TIMEOUT_MS: u64 = 400;

struct Lab {
    server: Server,
    addr: SocketAddr,
    ctrl: Arc<Controller>,
    generation: u64,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<u64>>,
}

fn lab() -> Lab {
    let port = free_port();
    let mut c = Config::embedded_default();
    c.options.connect_timeout_ms = TIMEOUT_MS;
    c.options.pdu_timeout_ms = TIMEOUT_MS;
    // One reactor: the attacker shares the thread that serves the healthy host.
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports = vec![PortConfig::io(1, format!("127.0.0.1:{port}"))];
    c.subsystems = vec![SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "64M")])];
    let server = c.start().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut o = ConnectOptions::new(addr, NQN);
    o.nr_io_queues = 2;
    o.kato_ms = 2000;
    o.reconnect_delay = Duration::from_millis(200);
    let ctrl = Controller::connect(o).unwrap();
    let generation = ctrl.generation();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Some(healthy_io(Arc::clone(&ctrl), Arc::clone(&stop)));
    Lab { server, addr, ctrl, generation, stop, worker }
}

fn pattern(len: usize, seed: u64) -> IoBuf {
    let mut b = IoBuf::new(len.next_multiple_of(4096));
    b.set_len(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8;
    }
    b
}

/// Writes and reads back (verifying) sizes from 4 KiB to 128 KiB, four at a time, until
/// stopped (bounded: at most 2 minutes); panics on any error. Returns the verified count.
fn healthy_io(ctrl: Arc<Controller>, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut ctx = Context::new(ContextOptions::default()).unwrap();
        let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
        let end = Instant::now() + Duration::from_secs(120);
        let mut verified = 0u64;
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            let mut expect = Vec::new();
            for k in 0..4u64 {
                let seed = round * 4 + k;
                let len = 4096usize << (seed % 6);
                let offset = k << 22 | (round % 16) << 18;
                let b = pattern(len, seed);
                expect.push((offset, len, b[..len].to_vec()));
                ctx.submit(dev, Op::Write, offset, len as u32, Some(b), k).map_err(|(e, _)| e).unwrap();
            }
            for c in wait(&mut ctx, 4) {
                assert!(c.status.is_success(), "healthy write failed: {}", c.status);
            }
            for (k, (offset, len, _)) in expect.iter().enumerate() {
                let b = IoBuf::new(len.next_multiple_of(4096));
                ctx.submit(dev, Op::Read, *offset, *len as u32, Some(b), k as u64).map_err(|(e, _)| e).unwrap();
            }
            for c in wait(&mut ctx, 4) {
                assert!(c.status.is_success(), "healthy read failed: {}", c.status);
                let (_, len, data) = &expect[c.token as usize];
                assert!(c.buf.as_ref().unwrap().as_full()[..*len] == data[..], "healthy read returned other data");
                verified += 1;
            }
            round += 1;
        }
        verified
    })
}

fn wait(ctx: &mut Context, n: usize) -> Vec<host::context::Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        assert!(Instant::now() < deadline, "healthy I/O stalled ({} of {n} done)", out.len());
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        out.extend(ctx.completions());
    }
    out
}

impl Lab {
    /// Stops the healthy host and checks it saw no error, no reconnect, and did I/O
    /// after the attack too; then that the target holds only the healthy queues.
    fn finish(mut self) {
        // A little healthy I/O after the attack is over, on the same connection.
        std::thread::sleep(Duration::from_millis(200));
        self.stop.store(true, Ordering::Relaxed);
        let verified = self.worker.take().unwrap().join().expect("healthy I/O failed");
        assert!(verified > 0, "the healthy host did verified I/O");
        assert_eq!(self.ctrl.state(), CtrlState::Live, "healthy controller live");
        assert_eq!(self.ctrl.generation(), self.generation, "healthy controller never reconnected");
        // Admin + 2 I/O queues of the healthy host; the attackers' places are all back.
        let deadline = Instant::now() + SLACK;
        while self.server.state.limits.connections_on_port(1) != 3 {
            assert!(Instant::now() < deadline, "{} connections left on the port", {
                self.server.state.limits.connections_on_port(1)
            });
            std::thread::sleep(Duration::from_millis(20));
        }
        self.ctrl.delete();
        println!("healthy host verified {verified} reads during the attack");
    }
}

#[test]
fn slowloris_never_finishing_icreq_is_closed_by_the_connect_timeout() {
    let lab = lab();
    let icreq = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode();
    // Twenty peers, each trickling its ICReq a byte at a time: it would take 6 s to finish.
    let mut peers: Vec<Peer> = (0..20).map(|_| Peer::tcp(lab.addr)).collect();
    let start = Instant::now();
    let mut open = peers.len();
    for i in 0..icreq.len() {
        if start.elapsed() > Duration::from_millis(TIMEOUT_MS) + SLACK || open == 0 {
            break;
        }
        open = 0;
        for p in &mut peers {
            if p.s.write_all(&icreq[i..=i]).is_ok() {
                open += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in &mut peers {
        let (pdus, _) = p.until_closed(SLACK);
        assert!(pdus.is_empty(), "no ICResp for an unfinished ICReq: {pdus:?}");
    }
    assert!(start.elapsed() < Duration::from_millis(TIMEOUT_MS) + 2 * SLACK);
    assert!(lab.server.state.limits.timeouts() >= 20, "closed by a timeout");
    lab.finish();
}

#[test]
fn half_sent_pdus_are_closed_by_the_pdu_timeout() {
    let lab = lab();
    let (mut admin, cntlid) = Peer::admin(lab.addr, 10_000);
    let mut q = Peer::io(lab.addr, cntlid, 1, 31);
    // Half a command capsule on the I/O queue.
    let mut pdu = Vec::new();
    q.enc.capsule_cmd(&mut pdu, &Sqe::flush(Cid(9), Nsid(1)), 0);
    q.s.write_all(&pdu[..40]).unwrap();
    // Half the data an R2T asked for on a second queue.
    let mut w = Peer::io(lab.addr, cntlid, 2, 31);
    w.send_cmd(&Sqe::rw(io::WRITE, Cid(4), Nsid(1), 0, 64, SglDescriptor::transport(32 << 10)), &[]);
    let Header::R2T(r2t) = w.pdu().0 else { panic!("R2T") };
    let mut h2c = Vec::new();
    let d = DataHeader { cccid: Cid(4), ttag: r2t.ttag, datao: 0, datal: 32 << 10, last: true, success: false };
    w.enc.h2c_data(&mut h2c, &d);
    h2c.extend_from_slice(&[7u8; 16 << 10]);
    w.s.write_all(&h2c).unwrap();
    let start = Instant::now();
    for p in [&mut q, &mut w] {
        let (pdus, _) = p.until_closed(Duration::from_millis(TIMEOUT_MS) + SLACK);
        assert!(pdus.is_empty(), "nothing answered: {pdus:?}");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(TIMEOUT_MS / 2), "closed by the timeout, not at once ({took:?})");
    }
    assert!(lab.server.state.limits.timeouts() >= 2);
    // The attacker's idle admin queue is not a stalled one.
    assert_eq!(admin.cmd(&Sqe::keep_alive(Cid(5)), &[]).0.status, Status::SUCCESS);
    drop(admin);
    lab.finish();
}

#[test]
fn random_bytes_are_refused() {
    let lab = lab();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    for i in 0..24 {
        // Half the peers first say a valid ICReq, then garbage.
        let mut p = if i % 2 == 0 { Peer::tcp(lab.addr) } else { Peer::icreq(lab.addr) };
        let mut junk = vec![0u8; rng.random_range(1..64 << 10)];
        rng.fill(&mut junk[..]);
        // The target may close before taking it all.
        let _ = p.s.write_all(&junk);
        let _ = p.s.shutdown(Shutdown::Write).ok();
        p.until_closed(Duration::from_millis(TIMEOUT_MS) + SLACK);
    }
    lab.finish();
}

#[test]
fn huge_plen_is_refused_before_anything_is_buffered() {
    let lab = lab();
    let (admin, cntlid) = Peer::admin(lab.addr, 0);
    for plen in [u32::MAX, 0x8000_0000, 64 << 20] {
        let mut q = Peer::io(lab.addr, cntlid, 1, 31);
        let mut pdu = Vec::new();
        q.enc.capsule_cmd(&mut pdu, &Sqe::flush(Cid(1), Nsid(1)), 0);
        pdu[4..8].copy_from_slice(&plen.to_le_bytes());
        q.s.write_all(&pdu).unwrap();
        q.expect_term(Fes::InvalidHeaderField);
    }
    // Before ICReq too.
    let mut p = Peer::tcp(lab.addr);
    let mut icreq = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode();
    icreq[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    p.s.write_all(&icreq).unwrap();
    p.until_closed(SLACK);
    drop(admin);
    lab.finish();
}

#[test]
fn data_beyond_maxh2cdata_is_refused() {
    let lab = lab();
    let (admin, cntlid) = Peer::admin(lab.addr, 0);
    let mut q = Peer::io(lab.addr, cntlid, 1, 31);
    let max = lab.server.state.opts.maxh2cdata;
    q.send_cmd(&Sqe::rw(io::WRITE, Cid(3), Nsid(1), 0, 1024, SglDescriptor::transport(512 << 10)), &[]);
    let Header::R2T(r2t) = q.pdu().0 else { panic!("R2T") };
    let mut pdu = Vec::new();
    let d = DataHeader { cccid: Cid(3), ttag: r2t.ttag, datao: 0, datal: max + 4096, last: true, success: false };
    q.enc.h2c_data(&mut pdu, &d);
    q.s.write_all(&pdu).unwrap();
    q.expect_term(Fes::DataLimitExceeded);
    drop(admin);
    lab.finish();
}

#[test]
fn h2c_data_for_an_unknown_ttag_is_refused() {
    let lab = lab();
    let (admin, cntlid) = Peer::admin(lab.addr, 0);
    for ttag in [77u16, 0, u16::MAX] {
        let mut q = Peer::io(lab.addr, cntlid, 1, 31);
        let mut pdu = Vec::new();
        let d = DataHeader { cccid: Cid(1), ttag, datao: 0, datal: 512, last: true, success: false };
        q.enc.h2c_data(&mut pdu, &d);
        pdu.extend_from_slice(&[0u8; 512]);
        q.s.write_all(&pdu).unwrap();
        q.expect_term(Fes::InvalidHeaderField);
    }
    drop(admin);
    lab.finish();
}

#[test]
fn more_commands_than_sqsize_are_refused() {
    let lab = lab();
    let (admin, cntlid) = Peer::admin(lab.addr, 0);
    // SQSIZE 3 = 4 entries; eight writes that wait for R2T data hold their slots.
    let mut q = Peer::io(lab.addr, cntlid, 1, 3);
    let mut all = Vec::new();
    for i in 0..8u16 {
        let sqe = Sqe::rw(io::WRITE, Cid(100 + i), Nsid(1), 0, 8, SglDescriptor::transport(4096));
        q.enc.capsule_cmd(&mut all, &sqe, 0);
    }
    q.s.write_all(&all).unwrap();
    let (pdus, _) = q.until_closed(SLACK);
    assert_eq!(pdus.iter().filter(|h| matches!(h, Header::R2T(_))).count(), 4, "{pdus:?}");
    assert!(matches!(pdus.last(), Some(Header::C2HTermReq(t)) if t.fes == Fes::PduSequenceError as u16), "{pdus:?}");
    drop(admin);
    lab.finish();
}

#[test]
fn commands_after_a_keep_alive_timeout_are_not_served() {
    let lab = lab();
    let (mut admin, cntlid) = Peer::admin(lab.addr, 300);
    let mut q = Peer::io(lab.addr, cntlid, 1, 31);
    // No Keep Alive: the controller is torn down and both queues closed.
    let (_, took) = admin.until_closed(Duration::from_millis(300) + SLACK);
    assert!(took >= Duration::from_millis(150), "closed by KATO, not at once ({took:?})");
    // The I/O queue's commands get no answer (its controller is gone); it is closed.
    let _ = q.s.write_all(&{
        let mut v = Vec::new();
        q.enc.capsule_cmd(&mut v, &Sqe::rw(io::READ, Cid(1), Nsid(1), 0, 8, SglDescriptor::transport(4096)), 0);
        v
    });
    let (pdus, _) = q.until_closed(SLACK);
    assert!(!pdus.iter().any(|h| matches!(h, Header::CapsuleResp(_) | Header::C2HData(_))), "{pdus:?}");
    // A reconnect to that controller is refused.
    let mut again = Peer::icreq(lab.addr);
    assert_ne!(again.connect(1, cntlid, 31, 0).status, Status::SUCCESS, "controller gone");
    drop(again);
    lab.finish();
}

/// Target-side sockets of `port` still open (ESTABLISHED, or CLOSE_WAIT: the peer left and
/// the target did not close), from /proc/net/tcp.
fn target_sockets(port: u16) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{port:04X}");
    let n = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(1)?, *f.get(3)?))
        })
        .filter(|(addr, st)| addr.ends_with(&local) && matches!(*st, "01" | "08"))
        .count();
    Some(n)
}

#[test]
fn a_thousand_connections_opened_and_dropped() {
    let lab = lab();
    let start = Instant::now();
    let icreq = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode();
    let mut done = 0;
    for i in 0..1000 {
        if start.elapsed() > Duration::from_secs(120) {
            break;
        }
        match i % 4 {
            0 => drop(Peer::tcp(lab.addr)),
            1 => {
                let mut p = Peer::tcp(lab.addr);
                let _ = p.s.write_all(&icreq[..64]);
            }
            2 => drop(Peer::icreq(lab.addr)),
            _ => {
                // A whole admin queue, then gone without a word.
                let (p, _) = Peer::admin(lab.addr, 0);
                drop(p);
            }
        }
        done += 1;
    }
    println!("{done} connections in {:?}", start.elapsed());
    assert_eq!(done, 1000, "all within the time bound");
    // Everything given back: the port's places (checked in finish), the attackers' controllers,
    // and the target's sockets (other tests share this process's descriptors, so the kernel's
    // socket table is what tells: none left open on the target's side but the healthy three).
    let deadline = Instant::now() + SLACK;
    let s = lab.server.state.subsystem(NQN).unwrap();
    while s.controllers().len() != 1 {
        assert!(Instant::now() < deadline, "{} controllers left", s.controllers().len());
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(mut open) = target_sockets(lab.addr.port()) {
        while open != 3 {
            assert!(Instant::now() < deadline, "{open} target sockets open on the port");
            std::thread::sleep(Duration::from_millis(20));
            open = target_sockets(lab.addr.port()).unwrap_or(3);
        }
    } else {
        println!("no /proc/net/tcp: the target's socket count is not checked");
    }
    lab.finish();
}

#[test]
fn a_peer_that_never_reads_its_responses_is_not_read_either() {
    let lab = lab();
    let (admin, cntlid) = Peer::admin(lab.addr, 0);
    let mut q = Peer::io(lab.addr, cntlid, 1, 127);
    // 20,000 4 KiB reads (80 MB of responses) sent without reading a byte back.
    let n = 20_000u32;
    let mut all = Vec::new();
    for i in 0..n {
        let sqe = Sqe::rw(io::READ, Cid((i % 4096) as u16), Nsid(1), 0, 8, SglDescriptor::transport(4096));
        q.enc.capsule_cmd(&mut all, &sqe, 0);
    }
    let mut w = q.s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let writer = std::thread::spawn(move || w.write_all(&all).map(|()| w));
    std::thread::sleep(Duration::from_secs(1));
    // Now read: every command is answered, and the writer gets through.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done = 0u32;
    while done < n {
        assert!(Instant::now() < deadline, "only {done} of {n} answered: the target stopped serving the queue");
        match q.pdu() {
            (Header::C2HData(d), data) => {
                assert_eq!(data.len(), 4096);
                done += u32::from(d.success);
            }
            (Header::CapsuleResp(c), _) => {
                assert_eq!(c.status, Status::SUCCESS);
                done += 1;
            }
            (h, _) => panic!("unexpected {h:?}"),
        }
    }
    writer.join().unwrap().expect("the target read every command once its responses were read");
    drop((q, admin));
    lab.finish();
}
