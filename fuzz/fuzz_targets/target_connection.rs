//! A whole target connection driven in-process: arbitrary host bytes in
//! (split at arbitrary points), PDUs out, through the same state machine the
//! socket path uses. Nothing may panic, and the target must keep its
//! invariants (it closes or keeps serving, never hangs the loop). One host NQN must
//! authenticate, so the DH-HMAC-CHAP transaction is fuzzed through the same path. The seed
//! `admin-log-pages-and-features` connects another host, enables the controller and reads
//! every log page and feature the controller lists (the admin paths past CC.EN).

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use qpath_target::backend::{Backend, SyncFileIo};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::pool::BufPool;
use qpath_target::port::PortKind;
use qpath_target::registry::{TargetOptions, TargetState};
use qpath_target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use qpath_target::tcp::{ConnCtx, Connection};

fn target() -> Arc<TargetState> {
    static T: OnceLock<Arc<TargetState>> = OnceLock::new();
    Arc::clone(T.get_or_init(|| {
        let t = Arc::new(TargetState::new(TargetOptions::default()));
        t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).unwrap();
        let s = t
            .add_subsystem(
                Subsystem::new(
                    "nqn.2026-11.io.qpath:fuzz",
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
        t
    }))
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    let port = t.port(1).unwrap();
    let mut conn = Connection::new(Arc::clone(&t), port, None, 0);
    let mut pool = BufPool::new(1 << 20, 16 << 20);
    let mut fio = SyncFileIo::default();
    // The first byte picks chunk sizes so PDUs split at every boundary.
    let Some((&chunk, mut rest)) = data.split_first() else { return };
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
        while let Some(msg) = conn.take_send() {
            let _ = msg.len();
            conn.on_send_done(msg, Ok(()), &mut ctx);
        }
        // A paused connection resumes once its output is sent (above); one that took
        // nothing and is not paused has stopped reading (closing).
        if taken == 0 && !conn.input_paused() {
            break;
        }
        rest = &rest[taken..];
    }
    let mut ctx = ConnCtx { pool: &mut pool, file_io: &mut fio, token: 0, now_ns: t.now_ns(), offload: None };
    conn.release(&mut ctx);
    // Every data buffer went back to the pool (a lost one would shrink the reactor's pool for good).
    assert_eq!(conn.buffer_bytes(), 0, "buffers held after release");
    assert_eq!(pool.outstanding(), 0, "pool bytes out after release");
});
