//! Secure channel concatenation (NVMe Base 2.1 §8.3.4.5, TP 8018) against our target over
//! loopback TCP.
//!
//! With a host made by hand from the spec's formulas: DH-HMAC-CHAP with SC_C `NEWTLSPSK`
//! on a plaintext admin queue of a port that allows TLS, then, as the Linux host does, the
//! admin queue again and an I/O queue inside TLS keyed with the generated PSK (`NVMe1G01
//! <hostnqn> <subnqn> <digest>`): neither asks for a second transaction (no ATR), and
//! verified I/O runs. A second transaction replaces the PSK (the first one's identity is no
//! longer found); removing the host's DH-HMAC-CHAP keys withdraws it; an identity the target
//! generated nothing for is refused.
//!
//! With our host (`ConnectOptions::concat`, `qpath connect --concat`): connected, every
//! queue the target lists runs inside TLS after one transaction, verified I/O, a reset
//! concatenates again (a new PSK: the old one keys nothing any more) and I/O goes on, a
//! re-authentication replaces the PSK on the admin queue only; a wrong secret, a target that
//! holds the null group for the host, and options that cannot concatenate are refused.

mod loopback;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nvme::auth::dhchap::{self, ResponseInput, Role};
use nvme::auth::ffdhe::DhKeyPair;
use nvme::auth::{AuthCmd, CONNECT_AUTHREQ_ATR, DhGroup, HashId, Message, Negotiate, Reply, Secret, sc_c};
use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::opcode::io;
use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Header, IcReq, PduInfo, Role as TcpRole};
use nvme::{Cid, Cntlid, Cqe, Nsid, QueueId, SglDescriptor, Sqe, Status};
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;
use target::tls::TlsMode;
use tls::psk::{Identity, IdentityVersion, PskHash, RetainedPsk, TlsPsk};

use loopback::free_port;

const NQN: &str = "nqn.2026-11.io.qpath:concat";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5c0c4a7e-0000-4000-8000-00000000c0c0";
const KEY: &str = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";

fn start() -> (Server, SocketAddr) {
    start_with(|_| {})
}

fn start_with_group(dhgroup: &str) -> (Server, SocketAddr) {
    start_with(|h| h.dhgroup = Some(dhgroup.into()))
}

/// The target with the host's entry (key KEY, group ffdhe2048) changed by `host`.
fn start_with(host: impl FnOnce(&mut HostAuthConfig)) -> (Server, SocketAddr) {
    let mut h = HostAuthConfig {
        nqn: HOST.into(),
        dhchap_key: Some(KEY.into()),
        dhgroup: Some("ffdhe2048".into()),
        ..Default::default()
    };
    host(&mut h);
    let port = free_port();
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    c.ports = vec![PortConfig { tls: TlsMode::Allowed, ..PortConfig::io(1, format!("127.0.0.1:{port}")) }];
    c.subsystems = vec![SubsystemConfig {
        allow_any_host: false,
        hosts: vec![HostEntry::Auth(h)],
        ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "4M")])
    }];
    let server = c.start().unwrap();
    (server, format!("127.0.0.1:{port}").parse().unwrap())
}

/// One NVMe/TCP queue by hand, plaintext or inside a TLS channel.
struct Wire {
    s: TcpStream,
    ch: Option<tls::Channel>,
    dec: Decoder,
    enc: EncoderConfig,
    inbox: Vec<u8>,
    cid: u16,
}

impl Wire {
    fn plain(addr: SocketAddr) -> Wire {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Wire::new(s, None)
    }

    /// A TLS channel with this identity and PSK: `None` when the target refuses the handshake.
    fn tls(addr: SocketAddr, identity: Identity, psk: TlsPsk) -> Option<Wire> {
        let mut ch = tls::Channel::client(&tls::ClientConfig::shared().unwrap(), identity, psk).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 4096];
        for _ in 0..10 {
            while let Ok(Some(m)) = ch.take_send(|| None) {
                let _ = s.write_all(&m.to_vec());
                ch.on_send_done(m, Ok(()));
            }
            if ch.is_open() {
                return Some(Wire::new(s, Some(ch)));
            }
            if ch.error().is_some() {
                return None;
            }
            let n = s.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return None;
            }
            tls::channel::feed(&mut ch, &buf[..n]);
        }
        None
    }

    fn new(s: TcpStream, ch: Option<tls::Channel>) -> Wire {
        let mut w = Wire {
            s,
            ch,
            dec: Decoder::new(DecoderConfig::initial(TcpRole::Host)),
            enc: EncoderConfig::default(),
            inbox: Vec::new(),
            cid: 0,
        };
        w.send(&IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode());
        let Header::IcResp(_) = w.recv().0 else { panic!("no ICResp") };
        w.enc = EncoderConfig { digests: Digests::default(), data_align: 4 };
        w.dec.config = DecoderConfig {
            receiver: TcpRole::Host,
            digests: Digests::default(),
            established: true,
            data_align: 4,
            max_in_capsule: 0,
            max_data_pdu: 16 << 20,
        };
        w
    }

    fn send(&mut self, bytes: &[u8]) {
        let wire = match &mut self.ch {
            None => bytes.to_vec(),
            Some(ch) => {
                let mut m = uring::SendMsg::new();
                m.push_bytes(bytes);
                let mut pending = Some(m);
                let msg = ch.take_send(|| pending.take()).unwrap().unwrap();
                let wire = msg.to_vec();
                ch.on_send_done(msg, Ok(()));
                wire
            }
        };
        self.s.write_all(&wire).unwrap();
    }

    fn fill(&mut self) {
        let mut buf = vec![0u8; 1 << 16];
        let n = self.s.read(&mut buf).unwrap();
        assert!(n > 0, "the target closed the connection");
        match &mut self.ch {
            None => self.inbox.extend_from_slice(&buf[..n]),
            Some(ch) => {
                let mut off = 0;
                let mut plain = vec![0u8; 1 << 16];
                loop {
                    let took = tls::channel::feed(ch, &buf[off..n]);
                    off += took;
                    let got = ch.read(&mut plain);
                    self.inbox.extend_from_slice(&plain[..got]);
                    if took == 0 && got == 0 {
                        break;
                    }
                }
            }
        }
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        for _ in 0..1000 {
            if let Ok(Decoded::Pdu(PduInfo { header, layout })) = self.dec.decode_header(&self.inbox)
                && self.inbox.len() >= layout.plen
            {
                let data = self.inbox[layout.data_offset..layout.data_offset + layout.data_len].to_vec();
                self.inbox.drain(..layout.plen);
                return (header, data);
            }
            self.fill();
        }
        panic!("no PDU");
    }

    fn next_cid(&mut self) -> Cid {
        self.cid += 1;
        Cid(self.cid)
    }

    fn command(&mut self, sqe: &Sqe, data: &[u8]) -> (Cqe, Vec<u8>) {
        let mut out = Vec::new();
        self.enc.capsule_cmd(&mut out, sqe, data.len());
        out.extend_from_slice(data);
        self.send(&out);
        let mut got = Vec::new();
        loop {
            match self.recv() {
                (Header::C2HData(d), data) => {
                    got.extend_from_slice(&data);
                    if d.success {
                        return (Cqe::success(sqe.cid()), got);
                    }
                }
                (Header::CapsuleResp(c), _) => return (c, got),
                (h, _) => panic!("unexpected {h:?}"),
            }
        }
    }

    fn connect(&mut self, qid: u16, cntlid: Cntlid) -> Cqe {
        let cid = self.next_cid();
        let kato_ms = if qid == 0 { 30_000 } else { 0 };
        let sqe = ConnectCmd { recfmt: 0, qid: QueueId(qid), sqsize: 31, cattr: 0, kato_ms }.to_sqe(cid);
        let data = ConnectData { hostid: [7; 16], cntlid, subnqn: NQN.into(), hostnqn: HOST.into() }.encode();
        self.command(&sqe, &data).0
    }

    fn auth_send(&mut self, m: &Message) -> Status {
        let b = m.encode();
        let len = u32::try_from(b.len()).unwrap();
        let cid = self.next_cid();
        let mut sqe = AuthCmd::dhchap(len).send_sqe(cid);
        sqe.set_sgl(SglDescriptor::in_capsule(len));
        self.command(&sqe, &b).0.status
    }

    fn auth_receive(&mut self) -> Message {
        let cid = self.next_cid();
        let (cqe, data) = self.command(&AuthCmd::dhchap(4096).receive_sqe(cid), &[]);
        assert_eq!(cqe.status, Status::SUCCESS);
        Message::decode(&data).unwrap()
    }

    fn prop_get(&mut self, offset: u32, size8: bool) -> (Status, u64) {
        let cid = self.next_cid();
        let c = self.command(&PropertyCmd::get_sqe(cid, offset, size8), &[]).0;
        (c.status, u64::from(c.dw0) | (u64::from(c.dw1) << 32))
    }
}

/// The concatenating transaction on a plaintext admin queue, the host side computed from
/// NVMe Base 2.1 §8.3.4.5: the generated PSK `HMAC(Ks, C1 || C2)` the host keeps.
fn concatenate(addr: SocketAddr) -> RetainedPsk {
    let mut w = Wire::plain(addr);
    let c = w.connect(0, Cntlid::DYNAMIC);
    assert_eq!(c.status, Status::SUCCESS);
    assert_ne!(c.dw0 & CONNECT_AUTHREQ_ATR, 0, "a plaintext admin queue authenticates");
    let mut n = Negotiate::offer_all(3);
    n.sc_c = sc_c::NEWTLSPSK;
    assert_eq!(w.auth_send(&Message::Negotiate(n)), Status::SUCCESS);
    let Message::Challenge(ch) = w.auth_receive() else { panic!("no challenge") };
    let hash = HashId::from_id(ch.hash_id).unwrap();
    assert_eq!((hash, ch.dh_group), (HashId::Sha256, DhGroup::Ffdhe2048.id()));
    let mine = DhKeyPair::generate(DhGroup::Ffdhe2048).unwrap().unwrap();
    let ks = mine.shared_secret(&ch.dhv).unwrap();
    let ca = dhchap::challenge(hash, Some(&ks), &ch.c1);
    let key = Secret::parse(KEY).unwrap().transformed(HOST);
    let r1 = dhchap::response_sc(
        Role::Host,
        &ResponseInput { hash, key: &key, challenge: &ca, seqnum: ch.seqnum, tid: 3, hostnqn: HOST, subnqn: NQN },
        sc_c::NEWTLSPSK,
    );
    let mut c2 = vec![0u8; hash.len()];
    nvme::auth::fill_random(&mut c2).unwrap();
    // SEQNUM 0 with C2: no controller authentication, C2 only feeds the PSK (as Linux sends).
    let reply = Reply { tid: 3, r1, c2: Some(c2.clone()), seqnum: 0, dhv: mine.public().to_vec() };
    assert_eq!(w.auth_send(&Message::Reply(reply)), Status::SUCCESS);
    let Message::Success1(s) = w.auth_receive() else { panic!("no Success1") };
    assert!(s.r2.is_none());
    assert_eq!(w.prop_get(prop::CAP, true).0, Status::SUCCESS, "authenticated");
    RetainedPsk::from_bytes(PskHash::Sha256, &dhchap::generated_psk(hash, &ks, &ch.c1, &c2))
}

/// The generated identity and TLS PSK (Linux `nvme_auth_derive_tls_psk`).
fn generated(psk: &RetainedPsk) -> (Identity, TlsPsk) {
    let mut id = psk.identity(IdentityVersion::V1, HOST, NQN);
    id.generated = true;
    let tls = psk.tls_psk(&id).unwrap();
    (id, tls)
}

#[test]
fn concatenated_queues_inside_tls_need_no_second_transaction() {
    let (server, addr) = start();
    // Nothing generated yet: the identity is unknown.
    let unknown = RetainedPsk::from_bytes(PskHash::Sha256, &[0x42; 32]);
    let (id, psk) = generated(&unknown);
    assert!(Wire::tls(addr, id, psk).is_none(), "no PSK generated for this host yet");

    let first = concatenate(addr);
    let (id, psk) = generated(&first);
    assert_eq!(id.to_string().split(' ').next(), Some("NVMe1G01"));
    // The admin queue again, inside TLS: no ATR, and it serves at once.
    let mut admin = Wire::tls(addr, id.clone(), psk.clone()).expect("the generated identity is found");
    let c = admin.connect(0, Cntlid::DYNAMIC);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(c.dw0 & CONNECT_AUTHREQ_ATR, 0, "no second transaction inside the generated channel");
    let cntlid = Cntlid((c.dw0 & 0xffff) as u16);
    let cid = admin.next_cid();
    let cc = PropertyCmd::set_sqe(cid, prop::CC, false, u64::from(Cc::enable_value().0));
    assert_eq!(admin.command(&cc, &[]).0.status, Status::SUCCESS);
    let mut ready = false;
    for _ in 0..100 {
        if admin.prop_get(prop::CSTS, false).1 & 1 == 1 {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ready, "CSTS.RDY");
    // An I/O queue inside TLS with the same PSK: no ATR, verified I/O.
    let mut ioq = Wire::tls(addr, id.clone(), psk.clone()).unwrap();
    let c = ioq.connect(1, cntlid);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(c.dw0 & CONNECT_AUTHREQ_ATR, 0);
    for (slba, seed) in [(0u64, 3u8), (64, 9)] {
        let data: Vec<u8> = (0..4096u32).map(|i| u8::try_from((i + u32::from(seed)) % 251).unwrap()).collect();
        let cid = ioq.next_cid();
        let w = Sqe::rw(io::WRITE, cid, Nsid(1), slba, 8, SglDescriptor::in_capsule(4096));
        assert_eq!(ioq.command(&w, &data).0.status, Status::SUCCESS);
        let cid = ioq.next_cid();
        let r = Sqe::rw(io::READ, cid, Nsid(1), slba, 8, SglDescriptor::transport(4096));
        let (cqe, back) = ioq.command(&r, &[]);
        assert_eq!(cqe.status, Status::SUCCESS);
        assert_eq!(back, data, "read back what was written at {slba}");
    }
    drop((admin, ioq));

    // A reconnect concatenates again: the new PSK replaces the first.
    let second = concatenate(addr);
    let (old_id, old_psk) = generated(&first);
    assert!(Wire::tls(addr, old_id, old_psk).is_none(), "the replaced PSK no longer keys a channel");
    let (id2, psk2) = generated(&second);
    let mut again = Wire::tls(addr, id2.clone(), psk2.clone()).expect("the new PSK keys a channel");
    let c = again.connect(0, Cntlid::DYNAMIC);
    assert_eq!((c.status, c.dw0 & CONNECT_AUTHREQ_ATR), (Status::SUCCESS, 0));
    drop(again);

    // The host's DH-HMAC-CHAP keys removed: its generated PSK keys nothing any more.
    let p = serde_json::json!({ "nqn": NQN, "host": HOST, "dhchap_key": null });
    target::rpc::call(&server, "set_host_auth", &p).unwrap();
    assert!(Wire::tls(addr, id2, psk2).is_none(), "a host without keys keeps no generated PSK");
    server.shutdown();
}

// ------------------------------------------------------------------ our host

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller, CtrlState};
use uring::{IoBuf, Wait};

fn host_options(addr: SocketAddr, secret: Option<&str>) -> ConnectOptions {
    let mut o = ConnectOptions::new(addr, NQN);
    o.hostnqn = HOST.into();
    o.nr_io_queues = 2;
    o.connect_timeout = Duration::from_secs(10);
    o.reconnect_delay = Duration::from_millis(50);
    o.ctrl_loss_tmo = Some(Duration::from_secs(20));
    o.dhchap_secret = secret.map(Into::into);
    o.concat = true;
    o
}

/// Writes `blocks` 4 KiB blocks of a pattern from `seed` through a context and reads them back.
fn verified_io(ctrl: &std::sync::Arc<Controller>, seed: u8, blocks: u64) {
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(ctrl, Nsid(1)).unwrap();
    let byte = |i: u64, j: usize| seed.wrapping_add(u8::try_from((i + j as u64) % 251).unwrap());
    for i in 0..blocks {
        let mut data = IoBuf::new(4096);
        data.set_len(4096);
        for (j, b) in data.iter_mut().enumerate() {
            *b = byte(i, j);
        }
        let mut done = Vec::new();
        ctx.submit(dev, Op::Write, i * 8192, 4096, Some(data), 1).map_err(|(e, _)| e).unwrap();
        while done.is_empty() {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(10)) }).unwrap();
            done.extend(ctx.completions());
        }
        ctx.submit(dev, Op::Read, i * 8192, 4096, Some(IoBuf::new(4096)), 2).map_err(|(e, _)| e).unwrap();
        while done.len() < 2 {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(10)) }).unwrap();
            done.extend(ctx.completions());
        }
        assert!(done.iter().all(|c| c.status.is_success()), "{:?}", done.iter().map(|c| c.status).collect::<Vec<_>>());
        let read = done.iter().find(|c| c.token == 2).unwrap();
        for (j, &x) in read.buf.as_ref().unwrap().iter().enumerate() {
            assert_eq!(x, byte(i, j), "block {i} byte {j}");
        }
    }
}

fn auth_stat(server: &Server, k: &str) -> u64 {
    target::metrics::stats_json(&server.state)["auth"][k].as_u64().unwrap()
}

/// What the target's `list_queues` says: (queues, of which inside TLS 1.3 with the
/// SHA-256 suite, writes counted on those).
/// The target's queue count once it settles at `want` (a connection the host closed stays
/// listed until the target's reactor sees its end), or whatever it is after 5 s.
fn queues_settled(server: &Server, want: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while tls_queues(server).0 != want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    tls_queues(server).0
}

fn tls_queues(server: &Server) -> (usize, usize, u64) {
    tls_queues_of(server, "TLS_AES_128_GCM_SHA256")
}

/// [`tls_queues`] with another suite.
fn tls_queues_of(server: &Server, suite: &str) -> (usize, usize, u64) {
    let v = target::rpc::call(server, "list_queues", &serde_json::json!({})).unwrap();
    let q = v.as_array().unwrap();
    let want = format!("tls1.3-user {suite}");
    let tls: Vec<_> = q.iter().filter(|q| q["secure_channel"].as_str() == Some(want.as_str())).collect();
    (q.len(), tls.len(), tls.iter().map(|q| q["stats"]["writes"].as_u64().unwrap()).sum())
}

#[test]
fn our_host_concatenates_runs_io_inside_tls_and_concatenates_again_after_a_reset() {
    let (server, addr) = start();
    let ctrl = Controller::connect(host_options(addr, Some(KEY))).unwrap();
    // One transaction (the plaintext admin queue's), then admin + 2 I/O queues inside TLS.
    assert_eq!(auth_stat(&server, "transactions_accepted"), 1, "no second DH-HMAC-CHAP inside the channel");
    assert_eq!(queues_settled(&server, 3), 3, "the plaintext admin queue is gone");
    assert_eq!(tls_queues(&server).1, 3, "admin and I/O queues, all inside TLS");
    verified_io(&ctrl, 5, 8);
    // The writes are counted on the TLS queues (published on the reactor's 10 ms tick).
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(tls_queues(&server).2, 8, "{:?}", tls_queues(&server));

    // A reset (as when a queue fails): the generated PSK goes with the association, so the
    // reconnect concatenates again in plaintext and comes back inside TLS with a new PSK.
    ctrl.report_io_failure("test: reset the controller");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !(ctrl.state() == CtrlState::Live && ctrl.info().reconnects >= 1) {
        assert!(std::time::Instant::now() < deadline, "not reconnected: {:?}", ctrl.info());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(auth_stat(&server, "transactions_accepted"), 2, "the reconnect concatenated again");
    assert_eq!(tls_queues(&server).1, 3);
    verified_io(&ctrl, 9, 8);

    // Re-authentication: the admin queue only, inside TLS, with REPLACETLSPSK (as Linux).
    let r = ctrl.reauthenticate(None, Duration::from_secs(20)).unwrap();
    assert_eq!((r.io_queues, r.failed.len()), (0, 0), "I/O queues inside the channel do not re-authenticate");
    assert_eq!(auth_stat(&server, "reauthentications_accepted"), 1);
    verified_io(&ctrl, 13, 2);
    ctrl.delete();
    server.shutdown();
}

#[test]
fn our_host_with_a_wrong_secret_is_refused() {
    let (server, addr) = start();
    let wrong = Secret::generate(None, 32).unwrap().to_string();
    let e = Controller::connect(host_options(addr, Some(&wrong))).unwrap_err().to_string();
    assert!(e.contains("queue 0 authentication"), "{e}");
    assert!(!e.contains("DHHC-1") && !e.contains(&wrong[10..30]), "no secret in the error: {e}");
    assert_eq!(auth_stat(&server, "transactions_accepted"), 0);
    assert_eq!(tls_queues(&server).1, 0, "no channel was keyed");
    server.shutdown();
}

#[test]
fn our_host_refuses_the_null_group_before_its_response() {
    let (server, addr) = start_with_group("null");
    let e = Controller::connect(host_options(addr, Some(KEY))).unwrap_err().to_string();
    assert!(e.contains("needs a DH group"), "{e}");
    // The target refused the Negotiate (which offered no null group): no response was sent.
    assert_eq!(auth_stat(&server, "transactions_accepted"), 0);
    server.shutdown();
}

#[test]
fn concat_without_a_secret_or_with_a_tls_key_is_refused_before_connecting() {
    // Nothing listens there: a refusal that connected first would say so.
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let e = Controller::connect(host_options(addr, None)).unwrap_err();
    assert_eq!(e.kind, host::error::ErrorKind::Invalid);
    assert!(e.to_string().contains("needs a DH-HMAC-CHAP secret"), "{e}");
    let mut o = host_options(addr, Some(KEY));
    o.tls = Some(
        host::tls::HostTls::parse(&tls::psk::ConfiguredPsk::generate(PskHash::Sha256).unwrap().to_interchange())
            .unwrap(),
    );
    let e = Controller::connect(o).unwrap_err();
    assert_eq!(e.kind, host::error::ErrorKind::Invalid);
    assert!(e.to_string().contains("cannot be combined"), "{e}");
}

/// A target that holds SHA-384 and a controller key for the host: the concatenating
/// transaction runs with SHA-384 (the host offers SHA-256 and SHA-384, the target takes
/// its configured hash) and proves the controller too (S2 nonzero, R2 checked); its
/// generated PSK is of SHA-384 and keys every queue's TLS_AES_256_GCM_SHA384.
#[test]
fn our_host_concatenates_with_a_controller_key_and_a_target_set_to_sha384() {
    let ctrl_key = Secret::generate(None, 32).unwrap().to_string();
    let (server, addr) = start_with(|h| {
        h.hash = Some("hmac(sha384)".into());
        h.dhchap_ctrl_key = Some(ctrl_key.clone());
        h.dhgroup = Some("ffdhe3072".into());
    });
    let mut o = host_options(addr, Some(KEY));
    o.dhchap_ctrl_secret = Some(ctrl_key.clone());
    let ctrl = Controller::connect(o).unwrap();
    assert_eq!(auth_stat(&server, "transactions_accepted"), 1);
    let aes256 = tls_queues_of(&server, "TLS_AES_256_GCM_SHA384");
    assert_eq!(aes256.1, 3, "{aes256:?}");
    verified_io(&ctrl, 21, 4);
    ctrl.delete();
    // A wrong controller key: the controller's proof is refused, nothing connects.
    let mut o = host_options(addr, Some(KEY));
    o.dhchap_ctrl_secret = Some(Secret::generate(None, 32).unwrap().to_string());
    let e = Controller::connect(o).unwrap_err().to_string();
    assert!(e.contains("the controller's response is wrong"), "{e}");
    server.shutdown();
}

/// A block device's head (`qpath ublk add --concat`, `qpath nbd serve --concat`) takes its
/// secret from a file and concatenates like `connect --concat`; without a secret file, or
/// with a TLS key file, the spec is refused before connecting.
#[test]
fn a_block_device_head_concatenates_with_its_secret_from_a_file() {
    let (server, addr) = start();
    let dir = std::env::temp_dir().join(format!("qpath-concat-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("dhchap.key");
    std::fs::write(&secret_file, format!("{KEY}\n")).unwrap();
    let mut spec = blockdev::spec::HeadSpec::new(vec![addr.to_string()], NQN);
    spec.hostnqn = Some(HOST.into());
    spec.nr_io_queues = 2;
    spec.ctrl_loss_tmo = 0;
    spec.concat = true;
    let e = spec.check().unwrap_err().to_string();
    assert!(e.contains("needs a DH-HMAC-CHAP secret file"), "{e}");
    spec.dhchap_secret_file = Some(secret_file.clone());
    let (ctrls, head) = spec.connect().unwrap();
    assert_eq!(head.path_count(), 1);
    assert_eq!(tls_queues(&server).1, 3, "admin + 2 I/O queues inside TLS");
    verified_io(&ctrls[0], 17, 4);
    blockdev::spec::disconnect(&ctrls);
    spec.tls_key_file = Some(dir.join("tls.key"));
    assert!(spec.check().is_err(), "concatenation makes its own TLS key");
    std::fs::remove_dir_all(&dir).unwrap();
    server.shutdown();
}
