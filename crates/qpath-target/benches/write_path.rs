//! One 4 KiB write through a target connection, from the capsule's bytes to the
//! response's, on a RAM namespace: parse, checks, range-lock gate, copy into the region,
//! CapsuleResp (no socket: the in-process driver path the reactor also runs).
//! `read_4k` is the same for a read (no gate), for comparison.
//!
//! Before/after a change to the I/O path, run it on both commits in one session.
//!
//! Run: `cargo bench -p qpath-target --bench write_path`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::opcode::io;
use nvme::tcp::{Digests, EncoderConfig, IcReq};
use nvme::{Cid, Cntlid, Nsid, QueueId, SglDescriptor, Sqe};
use qpath_target::backend::{Backend, SyncFileIo};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::pool::BufPool;
use qpath_target::port::PortKind;
use qpath_target::registry::{TargetOptions, TargetState};
use qpath_target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use qpath_target::tcp::{ConnCtx, Connection};

const NQN: &str = "nqn.2026-11.io.qpath:bench";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000beef";

struct Driver {
    t: Arc<TargetState>,
    conn: Connection,
    pool: BufPool,
    fio: SyncFileIo,
}

impl Driver {
    fn new(t: &Arc<TargetState>) -> Driver {
        let conn = Connection::new(Arc::clone(t), t.port(1).unwrap(), None, 0);
        Driver { t: Arc::clone(t), conn, pool: BufPool::new(1 << 20, 64 << 20), fio: SyncFileIo::default() }
    }

    /// Feeds `bytes`, then hands every queued send back as sent; the bytes sent.
    fn say(&mut self, bytes: &[u8]) -> usize {
        let mut ctx =
            ConnCtx { pool: &mut self.pool, file_io: &mut self.fio, token: 0, now_ns: self.t.now_ns(), offload: None };
        assert_eq!(self.conn.feed(bytes, &mut ctx), bytes.len());
        let mut sent = 0;
        while let Some(msg) = self.conn.take_send() {
            sent += msg.len();
            self.conn.on_send_done(msg, Ok(()), &mut ctx);
        }
        sent
    }
}

fn connect(qid: u16, cntlid: Cntlid) -> Vec<u8> {
    let mut out = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode().to_vec();
    let sqe = ConnectCmd { recfmt: 0, qid: QueueId(qid), sqsize: 127, cattr: 0, kato_ms: 0 }.to_sqe(Cid(1));
    let data = ConnectData { hostid: [0xbe; 16], cntlid, subnqn: NQN.into(), hostnqn: HOSTNQN.into() }.encode();
    EncoderConfig::default().capsule_cmd(&mut out, &sqe, data.len());
    out.extend_from_slice(&data);
    out
}

/// A target with a 64 MiB RAM namespace, a live controller and an I/O queue to it.
fn setup() -> (Driver, Driver) {
    let t = Arc::new(TargetState::new(TargetOptions::default()));
    t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
    let s = t
        .add_subsystem(
            Subsystem::new(
                NQN,
                SubsysKind::Nvm,
                "BENCH",
                "qpath",
                HostAccess { allow_any: true, hosts: vec![] },
                SubsysLimits::default(),
            )
            .unwrap(),
        )
        .unwrap();
    s.add_namespace(NamespaceSpec {
        nsid: 1,
        backend: Backend::ram(64 << 20).unwrap(),
        size: None,
        block_size: 512,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    })
    .unwrap();
    let mut admin = Driver::new(&t);
    admin.say(&connect(0, Cntlid::DYNAMIC));
    let cntlid = s.controllers()[0].cntlid;
    let mut cc = Vec::new();
    let enable = PropertyCmd::set_sqe(Cid(2), prop::CC, false, u64::from(Cc::enable_value().0));
    EncoderConfig::default().capsule_cmd(&mut cc, &enable, 0);
    admin.say(&cc);
    let mut q = Driver::new(&t);
    q.say(&connect(1, cntlid));
    (admin, q)
}

fn bench(c: &mut Criterion) {
    let (_admin, mut q) = setup();
    let mut g = c.benchmark_group("write_path");
    let mut write = Vec::new();
    let sqe = Sqe::rw(io::WRITE, Cid(7), Nsid(1), 64, 8, SglDescriptor::in_capsule(4096));
    EncoderConfig::default().capsule_cmd(&mut write, &sqe, 4096);
    write.extend_from_slice(&[0x5a; 4096]);
    // CapsuleResp: 24 bytes.
    assert_eq!(q.say(&write), 24, "the write completes");
    g.bench_function("write_4k_in_capsule", |b| b.iter(|| q.say(&write)));
    let mut read = Vec::new();
    let sqe = Sqe::rw(io::READ, Cid(8), Nsid(1), 64, 8, SglDescriptor::transport(4096));
    EncoderConfig::default().capsule_cmd(&mut read, &sqe, 0);
    assert!(q.say(&read) > 4096, "the read returns its data");
    g.bench_function("read_4k", |b| b.iter(|| q.say(&read)));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
