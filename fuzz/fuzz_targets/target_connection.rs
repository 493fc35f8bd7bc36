//! A whole target connection driven in-process: arbitrary host bytes in
//! (split at arbitrary points), PDUs out, through the same state machine the
//! socket path uses. Nothing may panic, and the target must keep its
//! invariants (it closes or keeps serving, never hangs the loop). One host NQN must
//! authenticate, so the DH-HMAC-CHAP transaction is fuzzed through the same path.
//!
//! Input: `[chunk] bytes...` feeds the bytes to a fresh connection (ICReq, Connect, ...
//! come from the input). `[0] [chunk] bytes...` first connects the connection as I/O
//! queue 1 of a controller made once at start-up, so the bytes are I/O commands (seeds:
//! corpus/target_connection/io-*): Read, Write, Compare, fused Compare and Write pairs,
//! Copy, Verify, on a RAM namespace (1) and a file namespace (2), whose file operations
//! complete as the input goes.
//!
//! The seed `admin-log-pages-and-features` connects another host, enables the controller
//! and reads every log page and feature the controller lists (the admin paths past CC.EN).

#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use nvme::fabrics::{Cc, ConnectCmd, ConnectData, PropertyCmd, prop};
use nvme::tcp::{Digests, EncoderConfig, IcReq};
use nvme::{Cid, Cntlid, QueueId};
use qpath_target::backend::{Backend, FileBackend, FileRequest, SyncFileIo};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::pool::BufPool;
use qpath_target::port::PortKind;
use qpath_target::registry::{TargetOptions, TargetState};
use qpath_target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use qpath_target::tcp::{ConnCtx, Connection};

const NQN: &str = "nqn.2026-11.io.qpath:fuzz";
/// The host of the controller the I/O-queue inputs connect to (no authentication).
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000f00d";

fn target() -> Arc<TargetState> {
    static T: OnceLock<Arc<TargetState>> = OnceLock::new();
    Arc::clone(T.get_or_init(|| {
        let t = Arc::new(TargetState::new(TargetOptions::default()));
        t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
        let s = t
            .add_subsystem(
                Subsystem::new(
                    NQN,
                    SubsysKind::Nvm,
                    "FUZZ",
                    "qpath",
                    HostAccess { allow_any: true, hosts: vec![] },
                    SubsysLimits::default(),
                )
                .unwrap(),
            )
            .unwrap();
        // This host must authenticate (DH-HMAC-CHAP): Connects naming it reach the transaction's
        // state machine (seeds: corpus/target_connection/auth-*).
        let key = nvme::auth::Secret::parse("DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:").unwrap();
        s.set_host_auth(
            "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a0a0",
            Some(qpath_target::auth::HostAuth::new(key.clone(), Some(key))),
        );
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
        // A file namespace: Compare, Compare and Write, Copy and Verify take several file
        // operations there. The file is the fuzzer's own, in the temporary directory.
        let path = std::env::temp_dir().join(format!("qpath-fuzz-target-connection-{}.img", std::process::id()));
        let file = FileBackend::open(&FileRequest::read_write(&path, Some(1 << 20), "namespace 2")).unwrap().0;
        // Open is all it needs: no file is left behind.
        let _ = std::fs::remove_file(&path);
        s.add_namespace(NamespaceSpec {
            nsid: 2,
            backend: Backend::File(file),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
        t
    }))
}

/// Runs the connection until its output is taken and its file operations are done (they
/// complete at submission; their completions are delivered here, as the reactor does).
fn settle(conn: &mut Connection, pool: &mut BufPool, fio: &mut SyncFileIo) {
    // A Copy of 128 ranges takes 130 file operations one after another.
    for _ in 0..1024 {
        let done = std::mem::take(&mut fio.done);
        let mut ctx = ConnCtx { pool, file_io: fio, token: 0, now_ns: target().now_ns(), offload: None };
        while let Some(msg) = conn.take_send() {
            let _ = msg.len();
            conn.on_send_done(msg, Ok(()), &mut ctx);
        }
        if done.is_empty() {
            return;
        }
        for (token, res, buf) in done {
            conn.on_file_done((token & 0xffff) as u16, res, buf, &mut ctx);
        }
    }
}

/// Feeds `bytes` and settles; the connection's answer is dropped.
fn say(conn: &mut Connection, pool: &mut BufPool, fio: &mut SyncFileIo, bytes: &[u8]) {
    let mut ctx = ConnCtx { pool, file_io: fio, token: 0, now_ns: target().now_ns(), offload: None };
    conn.feed(bytes, &mut ctx);
    settle(conn, pool, fio);
}

fn icreq_and_connect(qid: u16, cntlid: Cntlid) -> Vec<u8> {
    let enc = EncoderConfig::default();
    let mut out = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode().to_vec();
    let kato_ms = if qid == 0 { 120_000 } else { 0 };
    let sqe = ConnectCmd { recfmt: 0, qid: QueueId(qid), sqsize: 127, cattr: 0, kato_ms }.to_sqe(Cid(1));
    let data = ConnectData { hostid: [0xf0; 16], cntlid, subnqn: NQN.into(), hostnqn: HOSTNQN.into() }.encode();
    enc.capsule_cmd(&mut out, &sqe, data.len());
    out.extend_from_slice(&data);
    out
}

/// The controller the I/O-queue inputs join: its admin queue, connected and enabled once,
/// kept for the fuzzer's life (its keep-alive is never checked: it is never ticked).
fn controller() -> Cntlid {
    static ADMIN: OnceLock<(Mutex<Connection>, Cntlid)> = OnceLock::new();
    ADMIN
        .get_or_init(|| {
            let t = target();
            let mut conn = Connection::new(Arc::clone(&t), t.port(1).unwrap(), None, 1);
            let (mut pool, mut fio) = (BufPool::new(1 << 20, 16 << 20), SyncFileIo::default());
            say(&mut conn, &mut pool, &mut fio, &icreq_and_connect(0, Cntlid::DYNAMIC));
            let cntlid = t
                .subsystem(NQN)
                .expect("the fuzz subsystem")
                .controllers()
                .into_iter()
                .find(|c| c.hostnqn == HOSTNQN)
                .map(|c| c.cntlid)
                .expect("the admin Connect made a controller");
            let mut cc = Vec::new();
            let enable = PropertyCmd::set_sqe(Cid(2), prop::CC, false, u64::from(Cc::enable_value().0));
            EncoderConfig::default().capsule_cmd(&mut cc, &enable, 0);
            say(&mut conn, &mut pool, &mut fio, &cc);
            (Mutex::new(conn), cntlid)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    let port = t.port(1).unwrap();
    let mut conn = Connection::new(Arc::clone(&t), port, None, 0);
    let mut pool = BufPool::new(1 << 20, 16 << 20);
    let mut fio = SyncFileIo::default();
    let Some((&first, mut rest)) = data.split_first() else { return };
    let mut chunk = first;
    if first == 0 {
        // An I/O queue of the prepared controller.
        let Some((&c, r)) = rest.split_first() else { return };
        (chunk, rest) = (c, r);
        say(&mut conn, &mut pool, &mut fio, &icreq_and_connect(1, controller()));
    }
    // This byte picks chunk sizes so PDUs split at every boundary.
    let chunk = usize::from(chunk).max(1);
    while !rest.is_empty() {
        let n = chunk.min(rest.len());
        let now = t.now_ns();
        let mut ctx = ConnCtx { pool: &mut pool, file_io: &mut fio, token: 0, now_ns: now, offload: None };
        let taken = conn.feed(&rest[..n], &mut ctx);
        // Output not taken by the driver stays bounded: data buffers (capped per connection)
        // plus about one batch of PDU headers.
        let queued = conn.queued_send_bytes();
        assert!(queued <= conn.buffer_bytes() + (1 << 20), "send queue grew to {queued}");
        conn.on_timers(&mut ctx);
        conn.tick(&mut ctx);
        settle(&mut conn, &mut pool, &mut fio);
        // A paused connection resumes once its output is sent (above); one that took
        // nothing and is not paused has stopped reading (closing).
        if taken == 0 && !conn.input_paused() {
            break;
        }
        rest = &rest[taken..];
    }
    // File operations still in flight complete first (the reactor frees a connection only
    // then), then the connection is released.
    settle(&mut conn, &mut pool, &mut fio);
    let mut ctx = ConnCtx { pool: &mut pool, file_io: &mut fio, token: 0, now_ns: t.now_ns(), offload: None };
    assert_eq!(conn.file_ops_in_flight(), 0, "file operations left in flight");
    conn.release(&mut ctx);
    // Every data buffer went back to the pool (a lost one would shrink the reactor's pool for good).
    assert_eq!(conn.buffer_bytes(), 0, "buffers held after release");
    assert_eq!(pool.outstanding(), 0, "pool bytes out after release");
});
