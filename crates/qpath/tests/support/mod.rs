//! A raw NVMe/TCP peer for tests over real sockets: it can say anything, in any order
//! (hostile peers), or drive a queue by hand (crash consistency).

#![allow(dead_code)] // each test crate uses a part

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Fes, Header, IcReq, Role};
use nvme::{Cid, Cntlid, Cqe, QueueId, Sqe, Status};

/// The subsystem the peer connects to.
pub const NQN: &str = "nqn.2026-11.io.qpath:peer";
/// The peer's host NQN.
pub const ATTACKER: &str = "nqn.2014-08.org.nvmexpress:uuid:0badbad0-0000-4000-8000-000000000bad";
/// How long a closing may take beyond its cause (a loaded 2-core machine).
pub const SLACK: Duration = Duration::from_secs(5);

/// A raw NVMe/TCP peer that can say anything.
pub struct Peer {
    pub s: TcpStream,
    pub enc: EncoderConfig,
    pub dec: Decoder,
    pub buf: Vec<u8>,
}

impl Peer {
    pub fn tcp(addr: SocketAddr) -> Peer {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Peer {
            s,
            enc: EncoderConfig::default(),
            dec: Decoder::new(DecoderConfig::initial(Role::Host)),
            buf: Vec::new(),
        }
    }

    pub fn icreq(addr: SocketAddr) -> Peer {
        let mut p = Peer::tcp(addr);
        p.s.write_all(&IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode()).unwrap();
        assert!(matches!(p.pdu().0, Header::IcResp(_)), "ICResp");
        p.dec.config = DecoderConfig {
            receiver: Role::Host,
            digests: Digests::default(),
            established: true,
            data_align: 4,
            max_in_capsule: 0,
            max_data_pdu: 16 << 20,
        };
        p
    }

    /// Admin queue connected, controller enabled, 4 I/O queues granted.
    pub fn admin(addr: SocketAddr, kato_ms: u32) -> (Peer, Cntlid) {
        let mut p = Peer::icreq(addr);
        let c = p.connect(0, Cntlid::DYNAMIC, 31, kato_ms);
        assert_eq!(c.status, Status::SUCCESS, "attacker admin connect");
        let cntlid = Cntlid(c.dw0 as u16);
        let cc = PropertyCmd::set_sqe(Cid(2), prop::CC, false, u64::from(Cc::enable_value().0));
        assert_eq!(p.cmd(&cc, &[]).0.status, Status::SUCCESS);
        let nq = Sqe::set_features(Cid(3), nvme::features::fid::NUM_QUEUES, 0x0003_0003);
        assert_eq!(p.cmd(&nq, &[]).0.status, Status::SUCCESS);
        (p, cntlid)
    }

    pub fn io(addr: SocketAddr, cntlid: Cntlid, qid: u16, sqsize: u16) -> Peer {
        let mut p = Peer::icreq(addr);
        assert_eq!(p.connect(qid, cntlid, sqsize, 0).status, Status::SUCCESS, "attacker I/O connect");
        p
    }

    pub fn connect(&mut self, qid: u16, cntlid: Cntlid, sqsize: u16, kato_ms: u32) -> Cqe {
        let sqe = ConnectCmd { recfmt: 0, qid: QueueId(qid), sqsize, cattr: 0, kato_ms }.to_sqe(Cid(1));
        let data = ConnectData { hostid: [0xba; 16], cntlid, subnqn: NQN.into(), hostnqn: ATTACKER.into() }.encode();
        self.cmd(&sqe, &data).0
    }

    pub fn send_cmd(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut out = Vec::new();
        self.enc.capsule_cmd(&mut out, sqe, data.len());
        out.extend_from_slice(data);
        self.s.write_all(&out).unwrap();
    }

    pub fn cmd(&mut self, sqe: &Sqe, data: &[u8]) -> (Cqe, Vec<u8>) {
        self.send_cmd(sqe, data);
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

    pub fn pdu(&mut self) -> (Header, Vec<u8>) {
        loop {
            if let Some(p) = self.parse() {
                return p;
            }
            let mut tmp = [0u8; 65536];
            let n = self.s.read(&mut tmp).unwrap();
            assert!(n > 0, "target closed the connection");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    pub fn parse(&mut self) -> Option<(Header, Vec<u8>)> {
        let Ok(Decoded::Pdu(info)) = self.dec.decode_header(&self.buf) else { return None };
        if self.buf.len() < info.layout.plen {
            return None;
        }
        let d = self.buf[info.layout.data_offset..info.layout.data_offset + info.layout.data_len].to_vec();
        self.buf.drain(..info.layout.plen);
        Some((info.header, d))
    }

    /// Reads until the target closes the connection (within `within`); returns the PDUs
    /// it sent meanwhile and how long the close took.
    pub fn until_closed(&mut self, within: Duration) -> (Vec<Header>, Duration) {
        let start = Instant::now();
        let mut tmp = [0u8; 65536];
        loop {
            let left = within.checked_sub(start.elapsed()).expect("the target did not close the connection in time");
            self.s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
            match self.s.read(&mut tmp) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => break,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!("the target did not close the connection within {within:?}")
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        let took = start.elapsed();
        let mut pdus = Vec::new();
        while let Some((h, _)) = self.parse() {
            pdus.push(h);
        }
        (pdus, took)
    }

    /// The connection ends with a C2HTermReq carrying `fes`.
    pub fn expect_term(&mut self, fes: Fes) {
        let (pdus, _) = self.until_closed(SLACK);
        match pdus.last() {
            Some(Header::C2HTermReq(t)) => assert_eq!(t.fes, fes as u16, "FES"),
            other => panic!("expected a C2HTermReq, got {other:?} (all: {pdus:?})"),
        }
    }
}
