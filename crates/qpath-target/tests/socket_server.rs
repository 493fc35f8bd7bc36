//! The reactor path over real loopback sockets: a blocking NVMe/TCP host
//! talks to a running server with several reactors and queues.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::opcode::io;
use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Header, IcReq, Role};
use nvme::{Cid, Cntlid, Cqe, Nsid, QueueId, SglDescriptor, Sqe, Status};
use qpath_target::port::PortKind;
use qpath_target::reactor::{PollMode, ReactorOptions};
use qpath_target::server::Server;
use support::{HOSTNQN, NQN, pattern};

struct SockHost {
    s: TcpStream,
    enc: EncoderConfig,
    dec: Decoder,
    buf: Vec<u8>,
}

impl SockHost {
    fn connect(addr: std::net::SocketAddr, digests: Digests) -> SockHost {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut h = SockHost {
            s,
            enc: EncoderConfig { digests, data_align: 4 },
            dec: Decoder::new(DecoderConfig::initial(Role::Host)),
            buf: Vec::new(),
        };
        h.s.write_all(&IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 }.encode()).unwrap();
        assert!(matches!(h.pdu().0, Header::IcResp(_)));
        h.dec.config = DecoderConfig {
            receiver: Role::Host,
            digests,
            established: true,
            data_align: 4,
            max_in_capsule: 0,
            max_data_pdu: 16 << 20,
        };
        h
    }

    fn pdu(&mut self) -> (Header, Vec<u8>) {
        loop {
            if let Ok(Decoded::Pdu(info)) = self.dec.decode_header(&self.buf)
                && self.buf.len() >= info.layout.plen
            {
                let d = self.buf[info.layout.data_offset..info.layout.data_offset + info.layout.data_len].to_vec();
                self.buf.drain(..info.layout.plen);
                return (info.header, d);
            }
            let mut tmp = [0u8; 65536];
            let n = self.s.read(&mut tmp).unwrap();
            assert!(n > 0, "target closed the connection");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    fn cmd(&mut self, sqe: &Sqe, data: &[u8]) -> (Cqe, Vec<u8>) {
        let mut out = Vec::new();
        let w = self.enc.capsule_cmd(&mut out, sqe, data.len());
        out.extend_from_slice(data);
        if w.ddgst {
            out.extend_from_slice(&nvme::tcp::crc32c(data).to_le_bytes());
        }
        self.s.write_all(&out).unwrap();
        let mut got = Vec::new();
        loop {
            match self.pdu() {
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

    fn connect_queue(&mut self, qid: u16, cntlid: Cntlid) -> Cqe {
        let sqe = ConnectCmd {
            recfmt: 0,
            qid: QueueId(qid),
            sqsize: 127,
            cattr: 0,
            kato_ms: if qid == 0 { 5000 } else { 0 },
        }
        .to_sqe(Cid(1));
        let data = ConnectData { hostid: [1; 16], cntlid, subnqn: NQN.into(), hostnqn: HOSTNQN.into() }.encode();
        self.cmd(&sqe, &data).0
    }
}

#[test]
fn io_over_sockets_on_several_reactors() {
    let server_state = {
        let t = Arc::new(qpath_target::TargetState::new(qpath_target::TargetOptions::default()));
        let s = t
            .add_subsystem(
                qpath_target::subsystem::Subsystem::new(
                    NQN,
                    qpath_target::subsystem::SubsysKind::Nvm,
                    "S1",
                    "m",
                    qpath_target::subsystem::HostAccess { allow_any: true, hosts: vec![] },
                    Default::default(),
                )
                .unwrap(),
            )
            .unwrap();
        s.add_namespace(qpath_target::namespace::NamespaceSpec {
            nsid: 1,
            backend: qpath_target::backend::Backend::ram(8 << 20).unwrap(),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
        t
    };
    let server = Server::start(
        Arc::clone(&server_state),
        ReactorOptions { reactors: 2, cpus: vec![], poll: PollMode::Block, spin_us: 0 },
    )
    .unwrap();
    let addr = server.add_port(1, "127.0.0.1:0".parse().unwrap(), PortKind::Io).unwrap();

    let mut admin = SockHost::connect(addr, Digests::default());
    let c = admin.connect_queue(0, Cntlid::DYNAMIC);
    assert_eq!(c.status, Status::SUCCESS);
    let cntlid = Cntlid(c.dw0 as u16);
    let (c, _) = admin.cmd(&PropertyCmd::set_sqe(Cid(2), prop::CC, false, u64::from(Cc::enable_value().0)), &[]);
    assert_eq!(c.status, Status::SUCCESS);

    let mut threads = Vec::new();
    for qid in 1..=4u16 {
        threads.push(std::thread::spawn(move || {
            let digests = if qid % 2 == 0 { Digests { header: true, data: true } } else { Digests::default() };
            let mut q = SockHost::connect(addr, digests);
            assert_eq!(q.connect_queue(qid, cntlid).status, Status::SUCCESS);
            for i in 0..50u32 {
                let lba = u64::from(qid) * 2048 + u64::from(i) * 16;
                let len = if i % 3 == 0 { 64 * 1024 } else { 8192 };
                let data = pattern(len, (i + u32::from(qid)) as u8);
                let sgl = if len <= 8192 {
                    SglDescriptor::in_capsule(len as u32)
                } else {
                    SglDescriptor::transport(len as u32)
                };
                let w = Sqe::rw(io::WRITE, Cid(10), Nsid(1), lba, (len / 512) as u32, sgl);
                if len <= 8192 {
                    assert_eq!(q.cmd(&w, &data).0.status, Status::SUCCESS);
                } else {
                    let mut out = Vec::new();
                    q.enc.capsule_cmd(&mut out, &w, 0);
                    q.s.write_all(&out).unwrap();
                    let (h, _) = q.pdu();
                    let Header::R2T(r) = h else { panic!("{h:?}") };
                    let mut out = Vec::new();
                    let d = nvme::tcp::DataHeader {
                        cccid: Cid(10),
                        ttag: r.ttag,
                        datao: 0,
                        datal: len as u32,
                        last: true,
                        success: false,
                    };
                    let wr = q.enc.h2c_data(&mut out, &d);
                    out.extend_from_slice(&data);
                    if wr.ddgst {
                        out.extend_from_slice(&nvme::tcp::crc32c(&data).to_le_bytes());
                    }
                    q.s.write_all(&out).unwrap();
                    let (h, _) = q.pdu();
                    let Header::CapsuleResp(c) = h else { panic!("{h:?}") };
                    assert_eq!(c.status, Status::SUCCESS);
                }
                let r =
                    Sqe::rw(io::READ, Cid(11), Nsid(1), lba, (len / 512) as u32, SglDescriptor::transport(len as u32));
                let (c, back) = q.cmd(&r, &[]);
                assert_eq!(c.status, Status::SUCCESS);
                assert!(back == data, "qid {qid} i {i}");
            }
            q
        }));
    }
    let hosts: Vec<SockHost> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let queues = server_state.queues();
    assert_eq!(queues.len(), 5);
    let reactors: std::collections::BTreeSet<usize> = queues.iter().map(|q| q.reactor).collect();
    assert_eq!(reactors.len(), 2, "connections spread over both reactors");
    assert_eq!(queues.iter().map(|q| q.stats.reads).sum::<u64>(), 200);
    drop(hosts);
    drop(admin);
    server.shutdown();
}
