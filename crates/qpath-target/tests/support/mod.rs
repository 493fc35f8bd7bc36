//! A scripted NVMe/TCP host driving a target [`Connection`] in-process: the
//! loopback transport for target tests (bytes in, PDUs out, no socket).

#![allow(dead_code)]

use std::sync::Arc;

use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::opcode::io;
use nvme::tcp::{
    DataHeader, Decoded, Decoder, DecoderConfig, Digests, EncoderConfig, Header, IcReq, PduInfo, Role, crc32c,
};
use nvme::{Cid, Cntlid, Cqe, Nsid, QueueId, SglDescriptor, Sqe, Status};
use qpath_target::auth::DhWork;
use qpath_target::backend::{Backend, SyncFileIo};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::offload::{Offload, Waiter};
use qpath_target::pool::BufPool;
use qpath_target::port::PortKind;
use qpath_target::registry::{TargetOptions, TargetState};
use qpath_target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use qpath_target::tcp::{ConnCtx, ConnState, Connection};

pub const NQN: &str = "nqn.2024-01.io.qpath:test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";

/// A target with ports 1 (I/O) and 2 (I/O) and one 1 MiB RAM namespace (512-byte blocks).
pub fn target() -> Arc<TargetState> {
    target_with(TargetOptions::default())
}

/// [`target`] with these options.
pub fn target_with(opts: TargetOptions) -> Arc<TargetState> {
    let t = Arc::new(TargetState::new(opts));
    t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
    t.add_port(2, "127.0.0.1:4421".parse().unwrap(), PortKind::Io).unwrap();
    let s = t
        .add_subsystem(
            Subsystem::new(
                NQN,
                SubsysKind::Nvm,
                "QPTEST0001",
                "qpath test",
                HostAccess { allow_any: false, hosts: vec![HOSTNQN.to_string()] },
                SubsysLimits::default(),
            )
            .unwrap(),
        )
        .unwrap();
    s.add_namespace(NamespaceSpec {
        nsid: 1,
        backend: Backend::ram(1 << 20).unwrap(),
        size: None,
        block_size: 512,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    })
    .unwrap();
    t
}

/// A received PDU: the header and its data.
#[derive(Debug, Clone)]
pub struct Pdu {
    pub header: Header,
    pub data: Vec<u8>,
}

/// A driver that takes a connection's Diffie-Hellman steps and holds them until the
/// test runs them ([`Host::finish_offloaded`]), as the reactor's workers would later.
#[derive(Default)]
pub struct HeldOffload {
    pub jobs: std::cell::RefCell<Vec<(DhWork, u64)>>,
}

impl Offload for HeldOffload {
    fn submit(&self, work: DhWork, token: u64, _host: &str, _waiter: &Waiter) -> Result<(), DhWork> {
        self.jobs.borrow_mut().push((work, token));
        Ok(())
    }
}

pub struct Host {
    pub target: Arc<TargetState>,
    /// `None`: the connection runs its Diffie-Hellman steps inline.
    pub offload: Option<HeldOffload>,
    pub conn: Connection,
    pub pool: BufPool,
    pub fio: SyncFileIo,
    pub enc: EncoderConfig,
    pub dec: Decoder,
    pub inbox: Vec<u8>,
    pub next_cid: u16,
    pub cntlid: Cntlid,
    /// The Host Identifier this host's Connects carry.
    pub hostid: [u8; 16],
}

impl Host {
    pub fn new(target: &Arc<TargetState>, port: u16) -> Host {
        Host::on_reactor(target, port, 0)
    }

    /// A host whose connection is served as if by reactor `reactor` (its range-lock gauge).
    pub fn on_reactor(target: &Arc<TargetState>, port: u16, reactor: usize) -> Host {
        let p = target.port(port).unwrap();
        Host {
            target: Arc::clone(target),
            offload: None,
            conn: Connection::new(Arc::clone(target), p, None, reactor),
            pool: BufPool::new(1 << 20, 64 << 20),
            fio: SyncFileIo::default(),
            enc: EncoderConfig::default(),
            dec: Decoder::new(DecoderConfig::initial(Role::Host)),
            inbox: Vec::new(),
            next_cid: 1,
            cntlid: Cntlid(0),
            hostid: [1; 16],
        }
    }

    /// Closes the connection and releases it, as the reactor does when the peer goes away.
    pub fn disconnect(&mut self) {
        self.ctx_run(|c, ctx| {
            c.close("the test host disconnected");
            c.release(ctx);
        });
    }

    fn ctx_run(&mut self, f: impl FnOnce(&mut Connection, &mut ConnCtx<'_>)) {
        let now = self.target.now_ns();
        let offload = self.offload.as_ref().map(|o| o as &dyn Offload);
        let mut ctx = ConnCtx { pool: &mut self.pool, file_io: &mut self.fio, token: 0, now_ns: now, offload };
        f(&mut self.conn, &mut ctx);
    }

    /// Runs the Diffie-Hellman steps the held offload took and hands their results to
    /// the connection (as the reactor does with its workers' replies); how many.
    pub fn finish_offloaded(&mut self) -> usize {
        let jobs: Vec<_> = self.offload.as_ref().map(|o| o.jobs.borrow_mut().drain(..).collect()).unwrap_or_default();
        let n = jobs.len();
        for (work, token) in jobs {
            let done = work.run();
            self.ctx_run(|c, ctx| c.on_auth_computed((token & 0xffff) as u16, done, ctx));
        }
        self.pump();
        n
    }

    /// Runs the connection until it has nothing more to do: file completions,
    /// due timers and sends.
    pub fn pump(&mut self) {
        // Time, not turns: a request waiting on another thread's range lock is retried from
        // the timers until that thread gives the blocks back.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let done: Vec<_> = self.fio.done.drain(..).collect();
            let mut progressed = !done.is_empty();
            for (token, res, buf) in done {
                self.ctx_run(|c, ctx| c.on_file_done((token & 0xffff) as u16, res, buf, ctx));
            }
            self.ctx_run(|c, ctx| c.on_timers(ctx));
            if let Some(msg) = self.conn.take_send() {
                self.inbox.extend_from_slice(&msg.to_vec());
                self.ctx_run(|c, ctx| c.on_send_done(msg, Ok(()), ctx));
                progressed = true;
            }
            // A timer may have started file operations (a range-lock retry): deliver them.
            progressed |= !self.fio.done.is_empty();
            if !progressed && self.conn.next_timer().is_none() {
                return;
            }
            if !progressed {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        panic!("connection did not settle");
    }

    /// One pass of what [`Host::pump`] repeats: file completions, due timers, one send
    /// batch into the inbox. For a connection with a request that waits on purpose.
    pub fn turn(&mut self) {
        let done: Vec<_> = self.fio.done.drain(..).collect();
        for (token, res, buf) in done {
            self.ctx_run(|c, ctx| c.on_file_done((token & 0xffff) as u16, res, buf, ctx));
        }
        self.ctx_run(|c, ctx| c.on_timers(ctx));
        self.read_one_batch();
    }

    /// Feeds bytes without sending anything back (a peer that does not read); returns how
    /// many the connection took.
    pub fn feed_only(&mut self, bytes: &[u8]) -> usize {
        let mut n = 0;
        self.ctx_run(|c, ctx| n = c.feed(bytes, ctx));
        n
    }

    /// Takes one queued send batch into the inbox, as a reading peer would.
    pub fn read_one_batch(&mut self) -> bool {
        let Some(msg) = self.conn.take_send() else { return false };
        self.inbox.extend_from_slice(&msg.to_vec());
        self.ctx_run(|c, ctx| c.on_send_done(msg, Ok(()), ctx));
        true
    }

    /// What the driver does once a connection has closed: releases its binding (an admin
    /// queue's controller is deleted) and buffers.
    pub fn release(&mut self) {
        self.ctx_run(|c, ctx| c.release(ctx));
    }

    pub fn tick(&mut self) {
        self.ctx_run(|c, ctx| c.tick(ctx));
        self.pump();
    }

    /// The connection's tick alone, its output taken into the inbox (no timers run, no file
    /// completion delivered).
    pub fn ctx_tick_only(&mut self) {
        self.ctx_run(|c, ctx| c.tick(ctx));
        while self.read_one_batch() {}
    }

    pub fn send(&mut self, mut bytes: &[u8]) {
        loop {
            let mut n = 0;
            self.ctx_run(|c, ctx| n = c.feed(bytes, ctx));
            bytes = &bytes[n..];
            self.pump();
            // Stop when all went in, or the connection reads no more (closing); a pause for
            // queued output ends in pump, which sends it.
            if bytes.is_empty() || (n == 0 && !self.conn.input_paused()) {
                return;
            }
        }
    }

    /// The next PDU the target sent, if a whole one arrived.
    pub fn recv(&mut self) -> Option<Pdu> {
        match self.dec.decode_header(&self.inbox) {
            Ok(Decoded::NeedMore(_)) => None,
            Ok(Decoded::Pdu(PduInfo { header, layout })) => {
                if self.inbox.len() < layout.plen {
                    return None;
                }
                let data = self.inbox[layout.data_offset..layout.data_offset + layout.data_len].to_vec();
                if layout.ddgst {
                    let d = &self.inbox[layout.data_offset + layout.data_len..layout.plen];
                    assert_eq!(u32::from_le_bytes(d.try_into().unwrap()), crc32c(&data), "data digest from target");
                }
                self.inbox.drain(..layout.plen);
                Some(Pdu { header, data })
            }
            Err(e) => panic!("target sent an invalid PDU: {e:?} {:02x?}", &self.inbox[..self.inbox.len().min(32)]),
        }
    }

    pub fn expect(&mut self) -> Pdu {
        self.recv().expect("a PDU from the target")
    }

    pub fn closed(&self) -> bool {
        self.conn.state() == ConnState::Closed
    }

    pub fn icreq(&mut self, digests: Digests) {
        self.send(&IcReq { pfv: 0, hpda: 0, digests, maxr2t: 0 }.encode());
        match self.expect().header {
            Header::IcResp(r) => {
                assert_eq!(r.digests, digests);
                assert_eq!(r.cpda, 0);
                self.established(digests);
            }
            h => panic!("expected ICResp, got {h:?}"),
        }
    }

    /// The encoder and decoder of an established queue with `digests` (after the ICResp).
    pub fn established(&mut self, digests: Digests) {
        self.enc = EncoderConfig { digests, data_align: 4 };
        self.dec.config = DecoderConfig {
            receiver: Role::Host,
            digests,
            established: true,
            data_align: 4,
            max_in_capsule: 0,
            max_data_pdu: 16 << 20,
        };
    }

    pub fn cid(&mut self) -> Cid {
        self.next_cid = self.next_cid.wrapping_add(1);
        Cid(self.next_cid)
    }

    /// Sends a command with optional in-capsule data.
    pub fn command(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut out = Vec::new();
        let w = self.enc.capsule_cmd(&mut out, sqe, data.len());
        out.extend_from_slice(data);
        if w.ddgst {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        self.send(&out);
    }

    /// Waits for the CQE of `cid`, collecting C2H data on the way.
    pub fn completion(&mut self, cid: Cid) -> (Cqe, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            let p = self.expect();
            match p.header {
                Header::C2HData(d) => {
                    assert_eq!(d.cccid, cid);
                    assert_eq!(d.datao as usize, data.len());
                    data.extend_from_slice(&p.data);
                    if d.success {
                        return (Cqe::success(cid), data);
                    }
                }
                Header::CapsuleResp(c) => {
                    assert_eq!(c.cid, cid, "completion for another command");
                    return (c, data);
                }
                Header::R2T(r) => panic!("unexpected R2T {r:?}"),
                h => panic!("unexpected {h:?}"),
            }
        }
    }

    pub fn connect(&mut self, qid: u16, cntlid: Cntlid, subnqn: &str, hostnqn: &str, sqsize: u16) -> Cqe {
        let cid = self.cid();
        let sqe =
            ConnectCmd { recfmt: 0, qid: QueueId(qid), sqsize, cattr: 0, kato_ms: if qid == 0 { 5000 } else { 0 } }
                .to_sqe(cid);
        let data = ConnectData { hostid: self.hostid, cntlid, subnqn: subnqn.into(), hostnqn: hostnqn.into() }.encode();
        self.command(&sqe, &data);
        self.completion(cid).0
    }

    pub fn prop_get(&mut self, offset: u32, size8: bool) -> u64 {
        let cid = self.cid();
        self.command(&PropertyCmd::get_sqe(cid, offset, size8), &[]);
        let (c, _) = self.completion(cid);
        assert_eq!(c.status, Status::SUCCESS);
        c.result64()
    }

    /// ICReq, admin Connect, CC.EN=1 and wait for RDY: returns the cntlid.
    pub fn admin_up(&mut self, digests: Digests) -> Cntlid {
        self.admin_up_as(HOSTNQN, digests)
    }

    /// [`Host::admin_up`] with another host NQN.
    pub fn admin_up_as(&mut self, hostnqn: &str, digests: Digests) -> Cntlid {
        self.icreq(digests);
        let c = self.connect(0, Cntlid::DYNAMIC, NQN, hostnqn, 31);
        assert_eq!(c.status, Status::SUCCESS, "admin connect");
        let cntlid = Cntlid((c.dw0 & 0xffff) as u16);
        let cid = self.cid();
        self.command(&PropertyCmd::set_sqe(cid, prop::CC, false, u64::from(Cc::enable_value().0)), &[]);
        assert_eq!(self.completion(cid).0.status, Status::SUCCESS);
        assert_eq!(self.prop_get(prop::CSTS, false) & 1, 1, "CSTS.RDY");
        self.cntlid = cntlid;
        cntlid
    }

    /// An I/O queue connection for an enabled controller.
    pub fn io_up(target: &Arc<TargetState>, port: u16, cntlid: Cntlid, qid: u16, digests: Digests) -> Host {
        Host::io_up_as(target, port, cntlid, qid, HOSTNQN, digests)
    }

    /// [`Host::io_up`] for a controller of another host NQN.
    pub fn io_up_as(
        target: &Arc<TargetState>,
        port: u16,
        cntlid: Cntlid,
        qid: u16,
        hostnqn: &str,
        digests: Digests,
    ) -> Host {
        let mut h = Host::new(target, port);
        h.icreq(digests);
        let c = h.connect(qid, cntlid, NQN, hostnqn, 127);
        assert_eq!(c.status, Status::SUCCESS, "I/O connect");
        h.cntlid = cntlid;
        h
    }

    pub fn admin(&mut self, sqe: Sqe) -> (Cqe, Vec<u8>) {
        let cid = sqe.cid();
        self.command(&sqe, &[]);
        self.completion(cid)
    }

    /// Write with in-capsule data when it fits in `icd`, else R2T + H2CData.
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], icd: usize) -> Cqe {
        let cid = self.cid();
        let nlb = u32::try_from(data.len() / 512).unwrap();
        if data.len() <= icd {
            let sqe = Sqe::rw(io::WRITE, cid, Nsid(nsid), slba, nlb, SglDescriptor::in_capsule(data.len() as u32));
            self.command(&sqe, data);
            return self.completion(cid).0;
        }
        let sqe = Sqe::rw(io::WRITE, cid, Nsid(nsid), slba, nlb, SglDescriptor::transport(data.len() as u32));
        self.command(&sqe, &[]);
        let p = self.expect();
        let r2t = match p.header {
            Header::R2T(r) => r,
            Header::CapsuleResp(c) => return c,
            h => panic!("expected R2T, got {h:?}"),
        };
        assert_eq!(r2t.cccid, cid);
        assert_eq!(r2t.r2tl as usize, data.len());
        // Split into H2CData PDUs of at most 64 KiB.
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(64 * 1024);
            let d = DataHeader {
                cccid: cid,
                ttag: r2t.ttag,
                datao: off as u32,
                datal: n as u32,
                last: off + n == data.len(),
                success: false,
            };
            let mut out = Vec::new();
            let w = self.enc.h2c_data(&mut out, &d);
            out.extend_from_slice(&data[off..off + n]);
            if w.ddgst {
                out.extend_from_slice(&crc32c(&data[off..off + n]).to_le_bytes());
            }
            self.send(&out);
            off += n;
        }
        self.completion(cid).0
    }

    /// Sends `cmds` back to back in one stream write (as a host sends a fused pair), each
    /// with its host-to-controller data in the capsule when it fits in `icd`, else through
    /// R2T and H2CData; answers the R2Ts and returns every CQE, in the order of `cmds`.
    /// The SGL of each command is set here; its CID must be unique.
    pub fn batch(&mut self, cmds: &[(Sqe, &[u8])], icd: usize) -> Vec<Cqe> {
        let mut out = Vec::new();
        for (sqe, data) in cmds {
            let mut sqe = *sqe;
            let len = data.len() as u32;
            if !data.is_empty() && data.len() <= icd {
                sqe.set_sgl(SglDescriptor::in_capsule(len));
                let w = self.enc.capsule_cmd(&mut out, &sqe, data.len());
                out.extend_from_slice(data);
                if w.ddgst {
                    out.extend_from_slice(&crc32c(data).to_le_bytes());
                }
            } else {
                sqe.set_sgl(SglDescriptor::transport(len));
                self.enc.capsule_cmd(&mut out, &sqe, 0);
            }
        }
        self.send(&out);
        let mut cqes: Vec<Option<Cqe>> = vec![None; cmds.len()];
        while cqes.iter().any(Option::is_none) {
            let p = self.expect();
            match p.header {
                Header::R2T(r) => {
                    let (_, data) = cmds.iter().find(|(s, _)| s.cid() == r.cccid).expect("R2T for a command sent");
                    let range = r.r2to as usize..(r.r2to + r.r2tl) as usize;
                    let d = DataHeader {
                        cccid: r.cccid,
                        ttag: r.ttag,
                        datao: r.r2to,
                        datal: r.r2tl,
                        last: true,
                        success: false,
                    };
                    let mut pdu = Vec::new();
                    let w = self.enc.h2c_data(&mut pdu, &d);
                    pdu.extend_from_slice(&data[range.clone()]);
                    if w.ddgst {
                        pdu.extend_from_slice(&crc32c(&data[range]).to_le_bytes());
                    }
                    self.send(&pdu);
                }
                Header::CapsuleResp(c) => {
                    let i = cmds.iter().position(|(s, _)| s.cid() == c.cid).expect("completion of a command sent");
                    assert!(cqes[i].is_none(), "two completions for cid {}", c.cid.0);
                    cqes[i] = Some(c);
                }
                h => panic!("unexpected {h:?}"),
            }
        }
        cqes.into_iter().map(|c| c.unwrap()).collect()
    }

    pub fn read(&mut self, nsid: u32, slba: u64, len: usize) -> (Cqe, Vec<u8>) {
        let cid = self.cid();
        let sqe = Sqe::rw(io::READ, cid, Nsid(nsid), slba, (len / 512) as u32, SglDescriptor::transport(len as u32));
        self.command(&sqe, &[]);
        self.completion(cid)
    }
}

/// A deterministic pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}
