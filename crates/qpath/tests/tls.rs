//! The NVMe/TCP secure channel (TLS 1.3 with PSKs), our host against our target over
//! loopback TCP: verified I/O on a port that requires TLS (with what `list_queues` and the
//! discovery log say), a port that allows both, discovery inside TLS, and every refusal:
//! a wrong key, an identity the target holds no key for, a plaintext ICReq to a TLS port,
//! a ClientHello to a plaintext port, a TLS 1.2 ClientHello, a corrupted, a truncated and
//! a too short record, a record that opens to a malformed PDU and a Connect for another
//! host inside the channel, each its own test. Each refusal closes that connection only,
//! with the alert or C2HTermReq it calls for, executes nothing (the Connect it carries
//! makes no controller; an intact one does), and the verified I/O beside it goes on.
//! Keys of hash 02 (SHA-384, TLS_AES_256_GCM_SHA384) get verified I/O too, with the suite
//! on both ends' queue views, and their refusals: a wrong key, and a host whose key is of
//! the other hash than the target's, which the target's log explains.

mod loopback;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::tls::HostTls;
use nvme::Nsid;
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;
use target::tls::TlsMode;
use tls::psk::{ConfiguredPsk, IdentityVersion, PskHash};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:tlstest";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7a1e2b4c-1c1a-4c4e-9e55-4a7f0c0a0001";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:7a1e2b4c-1c1a-4c4e-9e55-4a7f0c0a0002";

struct Target {
    server: Server,
    required: SocketAddr,
    allowed: SocketAddr,
    plain: SocketAddr,
}

fn start(key: &ConfiguredPsk) -> Target {
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    // Port 0: the kernel picks each listener's port, so no other test's connection can take
    // it between a probe and the bind (a workspace run once failed to start here).
    let port = |id: u16, tls: TlsMode| PortConfig { tls, ..PortConfig::io(id, "127.0.0.1:0") };
    c.ports = vec![port(1, TlsMode::Required), port(2, TlsMode::Allowed), port(3, TlsMode::None)];
    c.subsystems = vec![SubsystemConfig {
        allow_any_host: false,
        hosts: vec![
            HostEntry::Auth(HostAuthConfig {
                nqn: HOST.into(),
                tls_key: Some(key.to_interchange().to_string()),
                ..Default::default()
            }),
            HostEntry::Nqn(OTHER.into()),
        ],
        ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "16M")])
    }];
    let server = c.start().unwrap();
    let addr = |id: u16| server.local_addr(id).expect("a listening port");
    Target { required: addr(1), allowed: addr(2), plain: addr(3), server }
}

fn options(addr: SocketAddr, hostnqn: &str, key: Option<&ConfiguredPsk>) -> ConnectOptions {
    let mut o = ConnectOptions::new(addr, NQN);
    o.hostnqn = hostnqn.into();
    o.nr_io_queues = 2;
    o.connect_timeout = Duration::from_secs(10);
    o.ctrl_loss_tmo = Some(Duration::ZERO);
    o.tls = key.map(|k| HostTls { key: k.clone(), identity: IdentityVersion::V1, derivation: Default::default() });
    o
}

fn pattern(i: u64, j: usize) -> u8 {
    u8::try_from((i + j as u64) % 251).unwrap()
}

/// Writes `blocks` 4 KiB blocks of a pattern from `seed` and reads them back.
fn verified_io(ctrl: &std::sync::Arc<Controller>, seed: u8, blocks: u64) {
    verified_io_in(&mut Context::new(ContextOptions::default()).unwrap(), ctrl, seed, blocks);
}

/// [`verified_io`] in a given context.
fn verified_io_in(ctx: &mut Context, ctrl: &std::sync::Arc<Controller>, seed: u8, blocks: u64) {
    let dev = ctx.open(ctrl, Nsid(1)).unwrap();
    for i in 0..blocks {
        let mut data = IoBuf::new(if i % 4 == 3 { 131072 } else { 4096 });
        let len = data.capacity();
        data.set_len(len);
        for (j, b) in data.iter_mut().enumerate() {
            *b = seed.wrapping_add(pattern(i, j));
        }
        // The read goes out once the write is done (two commands in flight are unordered).
        let mut done = Vec::new();
        ctx.submit(dev, Op::Write, i * 262_144, u32::try_from(len).unwrap(), Some(data), 1)
            .map_err(|(e, _)| e)
            .unwrap();
        while done.is_empty() {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(10)) }).unwrap();
            done.extend(ctx.completions());
        }
        ctx.submit(dev, Op::Read, i * 262_144, u32::try_from(len).unwrap(), Some(IoBuf::new(len)), 2)
            .map_err(|(e, _)| e)
            .unwrap();
        while done.len() < 2 {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(10)) }).unwrap();
            done.extend(ctx.completions());
        }
        let read = done.iter().find(|c| c.token == 2).unwrap();
        assert!(done.iter().all(|c| c.status.is_success()), "{:?}", done.iter().map(|c| c.status).collect::<Vec<_>>());
        let b = read.buf.as_ref().unwrap();
        for (j, &x) in b.iter().enumerate() {
            assert_eq!(x, seed.wrapping_add(pattern(i, j)), "block {i} byte {j}");
        }
    }
}

#[test]
fn verified_io_inside_tls_on_required_and_allowed_ports() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    let ctrl = Controller::connect(options(t.required, HOST, Some(&key))).unwrap();
    verified_io(&ctrl, 7, 16);
    // Every queue of ours on the required port runs TLS, and says so.
    let queues: Vec<_> = t.server.state.queues().into_iter().filter(|q| q.port == 1).collect();
    assert_eq!(queues.len(), 3, "admin + 2 I/O queues");
    for q in &queues {
        assert_eq!(q.secure_channel.as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"), "{q:?}");
    }
    // The allowed port takes TLS and plaintext; version 0 identities (Linux 6.7..6.13) too.
    let mut o = options(t.allowed, HOST, Some(&key));
    o.tls.as_mut().unwrap().identity = IdentityVersion::V0;
    let v0 = Controller::connect(o).unwrap();
    verified_io(&v0, 9, 4);
    let plain = Controller::connect(options(t.allowed, OTHER, None)).unwrap();
    verified_io(&plain, 11, 4);
    assert!(t.server.state.queues().iter().any(|q| q.port == 2 && q.secure_channel.is_none()));
    for c in [ctrl, v0, plain] {
        c.delete();
    }
    t.server.shutdown();
}

#[test]
fn discovery_inside_tls_reports_treq_and_tsas() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    let tls = HostTls::parse(&key.to_interchange()).unwrap();
    let entries =
        host::discovery::discovery_log_tls(t.required, HOST, [1; 16], Duration::from_secs(10), Some(&tls)).unwrap();
    let by_port = |id: u16| entries.iter().find(|e| e.portid == id && e.subnqn == NQN).unwrap();
    // TREQ bits 1:0: 01b required, 10b not required; TSAS SECTYPE: 2 = TLS 1.3, 0 = none.
    assert_eq!((by_port(1).treq & 3, by_port(1).tsas[0]), (1, 2));
    assert_eq!((by_port(2).treq & 3, by_port(2).tsas[0]), (2, 2));
    assert_eq!((by_port(3).treq & 3, by_port(3).tsas[0]), (2, 0));
    // Without TLS the required port's discovery controller is not reachable.
    assert!(host::discovery::discovery_log(t.required, HOST, [1; 16], Duration::from_secs(3)).is_err());
    t.server.shutdown();
}

/// Reads until EOF or `limit` bytes (bounded by a 5 s timeout).
fn read_some(s: &mut TcpStream, limit: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < limit {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

fn icreq() -> Vec<u8> {
    nvme::tcp::IcReq { pfv: 0, hpda: 0, digests: Default::default(), maxr2t: 0 }.encode().to_vec()
}

/// A target with a controller of `HOST` doing verified I/O on the required port: every
/// refusal below runs beside it and must leave it (and the target) untouched.
fn start_with_witness() -> (Target, ConfiguredPsk, std::sync::Arc<Controller>) {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    let good = Controller::connect(options(t.required, HOST, Some(&key))).unwrap();
    verified_io(&good, 21, 2);
    (t, key, good)
}

/// After a refusal: the witness still does verified I/O, a new TLS controller connects, and
/// the target holds exactly `controllers` controllers of the subsystem (nothing the refused
/// connection sent made one).
fn unaffected(t: &Target, key: &ConfiguredPsk, good: &std::sync::Arc<Controller>, controllers: usize) {
    assert_eq!(io_controllers(t), controllers, "the refused connection created no controller");
    verified_io(good, 22, 2);
    let again = Controller::connect(options(t.required, HOST, Some(key))).unwrap();
    verified_io(&again, 23, 1);
    again.delete();
}

/// The subsystem's controllers (discovery controllers aside), from `list_controllers`.
fn io_controllers(t: &Target) -> usize {
    let v = target::rpc::call(&t.server, "list_controllers", &serde_json::json!({})).unwrap();
    v.as_array().unwrap().iter().filter(|c| c["subnqn"] == NQN).count()
}

/// The first record the peer sent, if it is an alert: its description (RFC 8446 §6).
fn alert_of(wire: &[u8]) -> Option<u8> {
    (wire.len() >= 7 && wire[0] == 21).then(|| wire[6])
}

/// A client handshake that is expected to fail: what the target sent before it closed,
/// and the client channel's error.
fn failed_handshake(addr: SocketAddr, key: &ConfiguredPsk, v: IdentityVersion, hostnqn: &str) -> (Vec<u8>, String) {
    let q = HostTls { key: key.clone(), identity: v, derivation: Default::default() }.for_queue(hostnqn, NQN);
    let mut ch = q.channel().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..10 {
        while let Ok(Some(m)) = ch.take_send(|| None) {
            let _ = s.write_all(&m.to_vec());
            ch.on_send_done(m, Ok(()));
        }
        assert!(!ch.is_open(), "the handshake succeeded");
        if ch.error().is_some() {
            break;
        }
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        tls::channel::feed(&mut ch, &buf[..n]);
    }
    got.extend(read_some(&mut s, 1 << 16));
    (got, ch.error().unwrap_or("closed").to_string())
}

/// A Fabrics Connect for `HOST`'s admin queue: the command capsule and its 1024 bytes.
fn connect_capsule() -> Vec<u8> {
    let cmd = nvme::fabrics::ConnectCmd { recfmt: 0, qid: nvme::QueueId(0), sqsize: 31, cattr: 0, kato_ms: 0 };
    let data = nvme::fabrics::ConnectData {
        hostid: [9; 16],
        cntlid: nvme::Cntlid::DYNAMIC,
        subnqn: NQN.into(),
        hostnqn: HOST.into(),
    }
    .encode();
    let mut out = Vec::new();
    nvme::tcp::EncoderConfig::default().capsule_cmd(&mut out, &cmd.to_sqe(nvme::Cid(1)), data.len());
    out.extend_from_slice(&data);
    out
}

/// A channel through its handshake and the ICReq/ICResp exchange inside it: the next PDU
/// is the Connect.
fn channel_after_icreq(addr: SocketAddr, key: &ConfiguredPsk) -> (TcpStream, tls::Channel) {
    let (mut s, mut ch) = handshake(addr, key, HOST);
    s.write_all(&seal(&mut ch, &icreq())).unwrap();
    let mut plain = Vec::new();
    let mut buf = [0u8; 4096];
    while plain.len() < 128 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the ICResp");
        plain.extend(open_all(&mut ch, &buf[..n]));
    }
    assert_eq!(plain[0], 0x01, "an ICResp inside the channel");
    (s, ch)
}

/// The control for the in-channel refusals: the same Connect, sealed intact, makes a
/// controller (so "no controller" below means the refused record was not executed).
#[test]
fn an_intact_connect_record_creates_a_controller() {
    let (t, key, good) = start_with_witness();
    let before = io_controllers(&t);
    let (mut s, mut ch) = channel_after_icreq(t.required, &key);
    s.write_all(&seal(&mut ch, &connect_capsule())).unwrap();
    let mut plain = Vec::new();
    let mut buf = [0u8; 4096];
    while plain.len() < 24 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the Connect response");
        plain.extend(open_all(&mut ch, &buf[..n]));
    }
    assert_eq!(plain[0], 0x05, "a CapsuleResp: {plain:?}");
    assert_eq!(io_controllers(&t), before + 1);
    drop(s);
    good.delete();
    t.server.shutdown();
}

/// A wrong PSK. With the identity of version 1 its digest (an HMAC of the PSK) names no
/// PSK the target holds: handshake_failure. With the older identity without digest
/// (version 0, same name for any key) the target finds its PSK for it and the binder does
/// not verify (RFC 8446 §4.2.11): OpenSSL 3.0 sends illegal_parameter there (§6.2 would
/// name decrypt_error; 3.2+ send that). Either way the target closes.
#[test]
fn refused_wrong_psk() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let wrong = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let (wire, err) = failed_handshake(t.required, &wrong, IdentityVersion::V1, HOST);
    assert_eq!(alert_of(&wire), Some(40), "handshake_failure alert: {wire:?} ({err})");
    let (wire, err) = failed_handshake(t.required, &wrong, IdentityVersion::V0, HOST);
    let binder = alert_of(&wire);
    assert!(binder == Some(47) || binder == Some(51), "illegal_parameter or decrypt_error alert: {wire:?} ({err})");
    let e = Controller::connect(options(t.required, HOST, Some(&wrong))).unwrap_err().to_string();
    assert!(e.contains("TLS"), "{e}");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// An identity the target holds no PSK for (a host of the subsystem without a key): no PSK
/// is selected and, with no certificate either, the handshake fails with an alert.
#[test]
fn refused_unknown_identity() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let (wire, err) = failed_handshake(t.required, &key, IdentityVersion::V1, OTHER);
    assert_eq!(alert_of(&wire), Some(40), "handshake_failure alert: {wire:?} ({err})");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A ClientHello that offers only TLS 1.2: a protocol_version alert (RFC 8446 §4.2.1).
#[test]
fn refused_tls12_client_hello() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let mut s = TcpStream::connect(t.required).unwrap();
    s.write_all(&tls12_client_hello()).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert_eq!(alert_of(&r), Some(70), "protocol_version alert: {r:?}");
    assert_eq!(r.len(), 7, "the alert and nothing else, then the close");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A plaintext ICReq to a port that requires TLS: closed without an answer (no ICResp, so
/// nothing of NVMe/TCP is spoken outside the channel).
#[test]
fn refused_plaintext_icreq_on_a_required_port() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let mut s = TcpStream::connect(t.required).unwrap();
    s.write_all(&icreq()).unwrap();
    s.write_all(&connect_capsule()).unwrap();
    assert!(read_some(&mut s, 1).is_empty(), "no answer but the close");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A TLS ClientHello to a port without TLS: a C2HTermReq (Invalid PDU Header Field, the
/// PDU type at byte 0), then the close.
#[test]
fn refused_client_hello_on_a_plaintext_port() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let q = HostTls::parse(&key.to_interchange()).unwrap().for_queue(HOST, NQN);
    let mut ch = q.channel().unwrap();
    let hello = ch.take_send(|| None).unwrap().unwrap().to_vec();
    assert_eq!(hello[0], 22, "a handshake record");
    let mut s = TcpStream::connect(t.plain).unwrap();
    s.write_all(&hello).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert_eq!(r.first(), Some(&0x03), "C2HTermReq: {r:?}");
    let fes = u16::from_le_bytes([r[8], r[9]]);
    assert_eq!(fes, 1, "FES: Invalid PDU Header Field");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A record whose ciphertext was changed on the way (one bit of its tag): bad_record_mac,
/// the Connect inside it never runs.
#[test]
fn refused_corrupted_record() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let (mut s, mut ch) = channel_after_icreq(t.required, &key);
    let mut wire = seal(&mut ch, &connect_capsule());
    let last = wire.len() - 1;
    wire[last] ^= 1;
    s.write_all(&wire).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert!(open_all(&mut ch, &r).is_empty(), "no PDU answers a forged record");
    let e = ch.error().unwrap_or("").to_string();
    assert!(e.contains("alert 20"), "the target's bad_record_mac alert: {e:?}");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A record cut short by the peer's close: nothing of it is opened or executed.
#[test]
fn refused_truncated_record() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let (mut s, mut ch) = channel_after_icreq(t.required, &key);
    let wire = seal(&mut ch, &connect_capsule());
    s.write_all(&wire[..wire.len() / 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert!(open_all(&mut ch, &r).is_empty(), "no answer to half a record: {r:?}");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A record shorter than its own authentication tag: decode_error.
#[test]
fn refused_record_shorter_than_its_tag() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let (mut s, mut ch) = channel_after_icreq(t.required, &key);
    s.write_all(&[23, 3, 3, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert!(open_all(&mut ch, &r).is_empty());
    let e = ch.error().unwrap_or("").to_string();
    assert!(e.contains("alert 50"), "the target's decode_error alert: {e:?}");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A record that opens to a malformed PDU (a Connect capsule whose HLEN is wrong): a
/// C2HTermReq inside the channel, the close, and no controller.
#[test]
fn refused_record_holding_a_malformed_pdu() {
    let (t, key, good) = start_with_witness();
    let n = io_controllers(&t);
    let (mut s, mut ch) = channel_after_icreq(t.required, &key);
    let mut bad = connect_capsule();
    bad[2] = 64; // HLEN of a command capsule is 72
    s.write_all(&seal(&mut ch, &bad)).unwrap();
    let r = read_some(&mut s, 1 << 16);
    let plain = open_all(&mut ch, &r);
    assert_eq!(plain.first(), Some(&0x03), "a C2HTermReq inside the channel: {plain:?}");
    let fes = u16::from_le_bytes([plain[8], plain[9]]);
    assert_eq!(fes, 1, "FES: Invalid PDU Header Field");
    unaffected(&t, &key, &good, n);
    good.delete();
    t.server.shutdown();
}

/// A controller that closes during the handshake without an alert (Linux's tlshd does when
/// it holds no PSK for the identity): the host's error says it happened in the handshake.
#[test]
fn a_close_during_the_handshake_is_reported_as_a_tls_failure() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(hello[0], 22, "a ClientHello record");
        let mut body = vec![0u8; usize::from(u16::from_be_bytes([hello[3], hello[4]]))];
        s.read_exact(&mut body).unwrap();
        // Closed (FIN) after the ClientHello: no ServerHello, no alert.
    });
    let e = Controller::connect(options(addr, HOST, Some(&key))).unwrap_err().to_string();
    peer.join().unwrap();
    assert!(e.contains("TLS handshake") && e.contains("no PSK"), "{e}");
}

#[test]
fn connect_must_match_the_identity() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    // The channel is HOST's; the Connect inside it says OTHER (allowed in the subsystem).
    let r = key.retained(HOST, Default::default());
    let id = r.identity(IdentityVersion::V1, HOST, NQN);
    let q = host::tls::QueueTls { psk: r.tls_psk(&id).unwrap(), identity: id };
    let mut cfg = host::queue::QueueConfig::io(0, 32, nvme::Cntlid::DYNAMIC, NQN, OTHER, [2; 16]);
    cfg.tls = Some(q);
    let e = host::sync::SyncQueue::connect(t.required, cfg, Duration::from_secs(5)).unwrap_err().to_string();
    assert!(e.contains("0x184") || e.contains("INVALID_HOST") || e.contains("invalid host"), "{e}");
    t.server.shutdown();
}

fn tls12_client_hello() -> Vec<u8> {
    let mut hello = vec![1, 0, 0, 0, 3, 3];
    hello.extend_from_slice(&[7; 32]);
    hello.extend_from_slice(&[0, 0, 2, 0x00, 0xa8, 1, 0]);
    let len = u32::try_from(hello.len() - 4).unwrap().to_be_bytes();
    hello[1..4].copy_from_slice(&len[1..]);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&u16::try_from(hello.len()).unwrap().to_be_bytes());
    rec.extend_from_slice(&hello);
    rec
}

/// A client channel through its handshake over a real socket.
fn handshake(addr: SocketAddr, key: &ConfiguredPsk, hostnqn: &str) -> (TcpStream, tls::Channel) {
    let q = HostTls::parse(&key.to_interchange()).unwrap().for_queue(hostnqn, NQN);
    let mut ch = q.channel().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    for _ in 0..10 {
        while let Ok(Some(m)) = ch.take_send(|| None) {
            s.write_all(&m.to_vec()).unwrap();
            ch.on_send_done(m, Ok(()));
        }
        if ch.is_open() {
            return (s, ch);
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the target closed during the handshake");
        tls::channel::feed(&mut ch, &buf[..n]);
    }
    panic!("no handshake");
}

fn seal(ch: &mut tls::Channel, bytes: &[u8]) -> Vec<u8> {
    let mut m = uring::SendMsg::new();
    m.push_bytes(bytes);
    let mut pending = Some(m);
    let msg = ch.take_send(|| pending.take()).unwrap().unwrap();
    let wire = msg.to_vec();
    ch.on_send_done(msg, Ok(()));
    wire
}

fn open_all(ch: &mut tls::Channel, wire: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut buf = vec![0u8; 1 << 16];
    while off < wire.len() {
        let took = tls::channel::feed(ch, &wire[off..]);
        off += took;
        let n = ch.read(&mut buf);
        out.extend_from_slice(&buf[..n]);
        if took == 0 && n == 0 {
            break;
        }
    }
    out
}

#[test]
fn keys_rotate_over_rpc_and_persist_by_reference() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    let call = |m: &str, p: serde_json::Value| target::rpc::call(&t.server, m, &p);
    // Rotate: the new key works for new connections, the old one no longer does.
    let dir = std::env::temp_dir().join(format!("qpath-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("host.tlskey");
    let new = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    std::fs::write(&file, format!("{}\n", &*new.to_interchange())).unwrap();
    let r = call("set_host_tls_key", serde_json::json!({"nqn": NQN, "host": HOST, "tls_key_file": file})).unwrap();
    assert_eq!(r["fingerprint"], new.fingerprint());
    assert!(Controller::connect(options(t.required, HOST, Some(&key))).is_err(), "the old key is gone");
    let c = Controller::connect(options(t.required, HOST, Some(&new))).unwrap();
    verified_io(&c, 31, 2);
    c.delete();
    // Answers and saves carry fingerprints and file names, never a key.
    let subs = call("list_subsystems", serde_json::json!({})).unwrap().to_string();
    assert!(subs.contains(&new.fingerprint()) && !subs.contains(&new.to_interchange()[16..40]), "{subs}");
    let saved = target::persist::to_toml(&target::persist::running_config(&t.server).unwrap()).unwrap();
    assert!(saved.contains("tls_key_file") && saved.contains("tls = \"required\""), "{saved}");
    assert!(!saved.contains(&new.to_interchange()[16..40]), "a key from a file is saved as its file");
    // Removing the key closes the door to new TLS connections of that host.
    call("set_host_tls_key", serde_json::json!({"nqn": NQN, "host": HOST})).unwrap();
    assert!(Controller::connect(options(t.required, HOST, Some(&new))).is_err());
    // A port switched to TLS by RPC refuses plaintext from then on.
    call("set_port_tls", serde_json::json!({"id": 3, "tls": "required"})).unwrap();
    assert!(Controller::connect(options(t.plain, OTHER, None)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
    t.server.shutdown();
}

/// A block device's head (`qpath ublk add`, `qpath nbd serve`, the `qpath host` service)
/// reads its TLS key from a file at connect and runs every queue inside TLS, with both
/// digests; a file that holds no key is refused naming the file, not what it holds.
#[test]
fn a_block_device_head_connects_inside_tls_with_its_key_from_a_file() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    let dir = std::env::temp_dir().join(format!("qpath-tls-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("tls.key");
    std::fs::write(&key_file, format!("{}\n", key.to_interchange().as_str())).unwrap();
    let mut spec = blockdev::spec::HeadSpec::new(vec![t.required.to_string()], NQN);
    spec.hostnqn = Some(HOST.into());
    spec.nr_io_queues = 2;
    spec.ctrl_loss_tmo = 0;
    spec.hdr_digest = true;
    spec.data_digest = true;
    spec.tls_key_file = Some(key_file.clone());
    let (ctrls, head) = spec.connect().unwrap();
    assert_eq!(head.path_count(), 1);
    verified_io(&ctrls[0], 5, 8);
    let queues: Vec<_> = t.server.state.queues().into_iter().filter(|q| q.port == 1).collect();
    assert_eq!(queues.len(), 3, "admin + 2 I/O queues");
    assert!(queues.iter().all(|q| q.secure_channel.is_some()), "{queues:?}");
    blockdev::spec::disconnect(&ctrls);

    std::fs::write(&key_file, "no-key-here\n").unwrap();
    let e = spec.connect().err().unwrap().to_string();
    assert!(e.contains("tls.key") && !e.contains("no-key-here"), "{e}");
    // Without its key the head cannot reach a port that requires TLS, and the error says
    // what the port probably wants.
    spec.tls_key_file = None;
    let e = spec.connect().err().unwrap().to_string();
    assert!(e.contains("does the port require TLS"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
    t.server.shutdown();
}

/// What the target's reactors log (INFO and up), for the tests that read a refusal's
/// reason there: installed once for this test binary.
fn target_log() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    #[derive(Clone)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LOG: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Sink(std::sync::Arc::clone(&buf));
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::set_global_default(sub).expect("the only subscriber of this test binary");
        buf
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&target_log().lock().unwrap()).into_owned()
}

/// A key of hash 02 on both ends: verified I/O inside TLS_AES_256_GCM_SHA384 on the
/// required port (identity version 1) and the allowed port (version 0), the suite in the
/// target's `list_queues` answer and in the host's queue statistics.
#[test]
fn verified_io_inside_tls_with_a_sha384_key() {
    let key = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
    let t = start(&key);
    let ctrl = Controller::connect(options(t.required, HOST, Some(&key))).unwrap();
    let hub = host::stats::HostStats::new();
    let mut ctx =
        Context::new(ContextOptions { stats: Some(std::sync::Arc::clone(&hub)), ..Default::default() }).unwrap();
    verified_io_in(&mut ctx, &ctrl, 41, 16);
    let v = target::rpc::call(&t.server, "list_queues", &serde_json::json!({})).unwrap();
    let ours: Vec<_> = v.as_array().unwrap().iter().filter(|q| q["port"] == 1).collect();
    assert_eq!(ours.len(), 3, "admin + 2 I/O queues: {v}");
    for q in &ours {
        assert_eq!(q["secure_channel"], "tls1.3-user TLS_AES_256_GCM_SHA384", "{q}");
    }
    ctx.publish_stats();
    let snap = hub.snapshot();
    let mine: Vec<_> = snap.queues.iter().filter(|q| q.traddr == t.required).collect();
    assert!(!mine.is_empty(), "the I/O queues: {:?}", snap.queues);
    for q in mine {
        assert_eq!(q.secure_channel.as_ref().map(|s| s.suite), Some("TLS_AES_256_GCM_SHA384"), "{q:?}");
    }
    drop(ctx);
    let mut o = options(t.allowed, HOST, Some(&key));
    o.tls.as_mut().unwrap().identity = IdentityVersion::V0;
    let v0 = Controller::connect(o).unwrap();
    verified_io(&v0, 43, 4);
    let port2: Vec<_> = t.server.state.queues().into_iter().filter(|q| q.port == 2).collect();
    assert!(
        !port2.is_empty()
            && port2.iter().all(|q| q.secure_channel.as_deref() == Some("tls1.3-user TLS_AES_256_GCM_SHA384")),
        "{port2:?}"
    );
    for c in [ctrl, v0] {
        c.delete();
    }
    t.server.shutdown();
}

/// A wrong key of hash 02 is refused as one of hash 01 is (`refused_wrong_psk`): version 1,
/// no PSK for its digest (handshake_failure); version 0, the binder does not verify.
#[test]
fn refused_wrong_sha384_psk() {
    let key = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
    let t = start(&key);
    let good = Controller::connect(options(t.required, HOST, Some(&key))).unwrap();
    let n = io_controllers(&t);
    let wrong = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
    let (wire, err) = failed_handshake(t.required, &wrong, IdentityVersion::V1, HOST);
    assert_eq!(alert_of(&wire), Some(40), "handshake_failure alert: {wire:?} ({err})");
    let (wire, err) = failed_handshake(t.required, &wrong, IdentityVersion::V0, HOST);
    let binder = alert_of(&wire);
    assert!(binder == Some(47) || binder == Some(51), "illegal_parameter or decrypt_error alert: {wire:?} ({err})");
    assert_eq!(io_controllers(&t), n, "nothing connected");
    verified_io(&good, 45, 2);
    good.delete();
    t.server.shutdown();
}

/// A host with a key of hash 01 against a target that holds a key of hash 02 for it (and
/// the reverse): the handshake fails (handshake_failure), and the target's log says the
/// two keys are of different hashes, without either key.
#[test]
fn refused_a_key_of_the_other_hash_with_the_reason() {
    target_log();
    let k384 = ConfiguredPsk::generate(PskHash::Sha384).unwrap();
    let k256 = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    for (target_key, host_key) in [(&k384, &k256), (&k256, &k384)] {
        let t = start(target_key);
        let (wire, err) = failed_handshake(t.required, host_key, IdentityVersion::V1, HOST);
        assert_eq!(alert_of(&wire), Some(40), "handshake_failure alert: {wire:?} ({err})");
        let e = Controller::connect(options(t.required, HOST, Some(host_key))).unwrap_err().to_string();
        assert!(e.contains("TLS"), "{e}");
        assert_eq!(io_controllers(&t), 0);
        t.server.shutdown();
        let (theirs, ours) = (host_key.hash().id(), target_key.hash().id());
        let want = format!("names hash {theirs:02}, and the TLS key for host {HOST} in {NQN} is of hash {ours:02}");
        let text = log_text();
        assert!(text.contains(&want), "{want}\nnot in the log:\n{text}");
        for k in [&k384, &k256] {
            let ki = k.to_interchange();
            assert!(!text.contains(&ki[16..40]), "no key in the log");
        }
    }
}
