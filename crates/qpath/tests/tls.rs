//! The NVMe/TCP secure channel (TLS 1.3 with PSKs), our host against our target over
//! loopback TCP: verified I/O on a port that requires TLS (with what `list_queues` and the
//! discovery log say), a port that allows both, discovery inside TLS, and every refusal:
//! a wrong key, an identity the target holds no key for, a plaintext ICReq to a TLS port,
//! a ClientHello to a plaintext port, a TLS 1.2 ClientHello, a corrupted record, a record
//! that opens to a malformed PDU and a Connect for another host inside the channel. Each
//! refusal closes that connection only: the verified I/O beside it goes on.

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

use loopback::free_port;

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
    let ports = [free_port(), free_port(), free_port()];
    let mut c = Config::embedded_default();
    c.reactor = ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 };
    let port = |id: u16, p: u16, tls: TlsMode| PortConfig { tls, ..PortConfig::io(id, format!("127.0.0.1:{p}")) };
    c.ports = vec![
        port(1, ports[0], TlsMode::Required),
        port(2, ports[1], TlsMode::Allowed),
        port(3, ports[2], TlsMode::None),
    ];
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
    let addr = |p: u16| format!("127.0.0.1:{p}").parse().unwrap();
    Target { server, required: addr(ports[0]), allowed: addr(ports[1]), plain: addr(ports[2]) }
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
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
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

#[test]
fn refusals_close_only_the_offending_connection() {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let t = start(&key);
    // A controller doing verified I/O all along, on the required port.
    let good = Controller::connect(options(t.required, HOST, Some(&key))).unwrap();

    // A wrong key: the handshake fails, no queue comes up.
    let wrong = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let e = Controller::connect(options(t.required, HOST, Some(&wrong))).unwrap_err().to_string();
    assert!(e.contains("TLS"), "{e}");
    // An identity the target holds no key for (a host without a key here).
    let e = Controller::connect(options(t.required, OTHER, Some(&key))).unwrap_err().to_string();
    assert!(e.contains("TLS"), "{e}");
    verified_io(&good, 21, 4);

    // A plaintext ICReq to the required port: closed, no ICResp.
    let mut s = TcpStream::connect(t.required).unwrap();
    s.write_all(&icreq()).unwrap();
    assert!(read_some(&mut s, 1).is_empty(), "no answer but the close");
    // A ClientHello (any TLS handshake record) to the plaintext port: C2HTermReq.
    let mut s = TcpStream::connect(t.plain).unwrap();
    s.write_all(&[0x16, 3, 1, 0, 200]).unwrap();
    s.write_all(&[0u8; 200]).unwrap();
    let r = read_some(&mut s, 24);
    assert_eq!(r.first(), Some(&0x03), "C2HTermReq: {r:?}");
    // A TLS 1.2-only ClientHello: protocol_version alert.
    let mut s = TcpStream::connect(t.required).unwrap();
    s.write_all(&tls12_client_hello()).unwrap();
    let r = read_some(&mut s, 7);
    assert_eq!(&r[..1], &[21], "alert record: {r:?}");
    assert_eq!(r[6], 70, "protocol_version");
    verified_io(&good, 22, 4);

    // After a real handshake: a corrupted record, a record holding a malformed PDU, and a
    // Connect for another host, each on a connection of its own.
    let tamper = |wire: &mut Vec<u8>| {
        let last = wire.len() - 1;
        wire[last] ^= 1;
    };
    let (mut s, mut ch) = handshake(t.required, &key, HOST);
    let mut wire = seal(&mut ch, &icreq());
    tamper(&mut wire);
    s.write_all(&wire).unwrap();
    let r = read_some(&mut s, 1 << 16);
    assert!(open_all(&mut ch, &r).is_empty(), "no PDU answers a forged record");
    assert!(ch.error().is_some(), "the target's alert closed the channel: {:?}", ch.error());

    let (mut s, mut ch) = handshake(t.required, &key, HOST);
    let mut bad = icreq();
    bad[2] = 64; // HLEN of an ICReq is 128
    s.write_all(&seal(&mut ch, &bad)).unwrap();
    let r = read_some(&mut s, 1 << 16);
    let plain = open_all(&mut ch, &r);
    assert_eq!(plain.first(), Some(&0x03), "a C2HTermReq inside the channel: {plain:?}");

    verified_io(&good, 23, 4);
    good.delete();
    t.server.shutdown();
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
