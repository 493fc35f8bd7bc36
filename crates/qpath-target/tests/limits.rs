//! The limits a connection lives under, through the sans-I/O connection: output
//! backpressure against a peer that does not read, the per-connection buffer cap,
//! the connect and PDU timeouts, and the per-host-NQN queue limit.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::time::Duration;

use nvme::opcode::io;
use nvme::tcp::{DataHeader, Digests, EncoderConfig, Header, IcReq};
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use qpath_target::limits::LimitSettings;
use support::*;

fn set(t: &qpath_target::TargetState, s: LimitSettings) {
    t.limits.set(&s).unwrap();
}

/// Admin queue up and an I/O queue (qid 1) on a fresh target.
fn io_queue(t: &std::sync::Arc<qpath_target::TargetState>) -> (Host, Host) {
    let mut admin = Host::new(t, 1);
    let cntlid = admin.admin_up(Digests::default());
    let cid = admin.cid();
    admin.admin(Sqe::set_features(cid, nvme::features::fid::NUM_QUEUES, 0x0007_0007));
    let h = Host::io_up(t, 1, cntlid, 1, Digests::default());
    (admin, h)
}

#[test]
fn a_peer_that_does_not_read_is_not_read_either() {
    let t = target();
    let (_admin, mut h) = io_queue(&t);
    assert_eq!(h.write(1, 0, &pattern(4096, 3), 8192).status, Status::SUCCESS);
    // 20,000 commands (reads and flushes) in one stream, far beyond SQSIZE: a hostile
    // peer that never reads its responses.
    let n = 20_000u16;
    let mut stream = Vec::new();
    for i in 0..n {
        let sqe = if i % 2 == 0 {
            Sqe::rw(io::READ, Cid(i), Nsid(1), 0, 8, SglDescriptor::transport(4096))
        } else {
            Sqe::flush(Cid(i), Nsid(1))
        };
        EncoderConfig::default().capsule_cmd(&mut stream, &sqe, 0);
    }
    let taken = h.feed_only(&stream);
    assert!(taken < stream.len(), "the connection stopped reading");
    assert!(h.conn.input_paused(), "paused for output");
    let queued = h.conn.queued_send_bytes();
    assert!(queued <= h.conn.buffer_bytes() + (1 << 20), "send queue bounded: {queued} bytes");
    // Now the peer reads: every command is answered, in order, with its data.
    let mut rest = &stream[taken..];
    let mut got = 0u32;
    for _ in 0..100_000 {
        while h.read_one_batch() {}
        while let Some(p) = h.recv() {
            match p.header {
                Header::C2HData(d) => assert_eq!(p.data, pattern(4096, 3), "read {:?}", d.cccid),
                Header::CapsuleResp(c) => {
                    assert_eq!(c.status, Status::SUCCESS);
                    assert_eq!(c.cid, Cid(got as u16), "in order");
                    got += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if rest.is_empty() && got == u32::from(n) {
            break;
        }
        let k = h.feed_only(rest);
        rest = &rest[k..];
    }
    assert_eq!(got, u32::from(n), "every command answered");
    assert_eq!(h.conn.buffer_bytes(), 0, "every buffer back");
}

#[test]
fn buffer_cap_per_connection_makes_commands_wait_not_fail() {
    let t = target();
    set(&t, LimitSettings { max_buffer_bytes_per_connection: Some(64 << 10), ..Default::default() });
    let (_admin, mut h) = io_queue(&t);
    // Four 32 KiB writes by R2T: two buffers fit under the cap, the others wait.
    for i in 0..4u16 {
        let sqe = Sqe::rw(io::WRITE, Cid(100 + i), Nsid(1), u64::from(i) * 64, 64, SglDescriptor::transport(32 << 10));
        h.command(&sqe, &[]);
    }
    let mut r2ts = Vec::new();
    while let Some(p) = h.recv() {
        match p.header {
            Header::R2T(r) => r2ts.push(r),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(r2ts.len(), 2, "two R2Ts under a 64 KiB cap");
    assert_eq!(h.conn.buffer_bytes(), 64 << 10);
    let mut done = 0;
    while let Some(r) = r2ts.pop() {
        let data = pattern(32 << 10, r.cccid.0 as u8);
        let mut pdu = Vec::new();
        let d = DataHeader { cccid: r.cccid, ttag: r.ttag, datao: 0, datal: 32 << 10, last: true, success: false };
        h.enc.h2c_data(&mut pdu, &d);
        pdu.extend_from_slice(&data);
        h.send(&pdu);
        while let Some(p) = h.recv() {
            match p.header {
                Header::R2T(r) => r2ts.push(r),
                Header::CapsuleResp(c) => {
                    assert_eq!(c.status, Status::SUCCESS);
                    done += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(h.conn.buffer_bytes() <= 64 << 10, "never above the cap");
    }
    assert_eq!(done, 4, "every write completed");
    assert_eq!(h.conn.buffer_bytes(), 0);
    for i in 0..4u16 {
        let (c, back) = h.read(1, u64::from(i) * 64, 32 << 10);
        assert_eq!(c.status, Status::SUCCESS);
        assert_eq!(back, pattern(32 << 10, (100 + i) as u8));
    }
}

#[test]
fn half_an_icreq_is_closed_by_the_connect_timeout() {
    let t = target();
    // Margins: a loaded machine may stretch a sleep by tens of ms.
    set(&t, LimitSettings { connect_timeout_ms: Some(300), ..Default::default() });
    let mut h = Host::new(&t, 1);
    let icreq = IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode();
    h.send(&icreq[..60]);
    h.tick();
    assert!(!h.closed());
    std::thread::sleep(Duration::from_millis(350));
    h.tick();
    assert!(h.closed(), "closed after the connect timeout");
    assert_eq!(t.limits.timeouts(), 1);
}

#[test]
fn half_a_pdu_is_closed_by_the_pdu_timeout() {
    let t = target();
    set(&t, LimitSettings { pdu_timeout_ms: Some(300), ..Default::default() });
    let (mut admin, mut h) = io_queue(&t);
    let mut pdu = Vec::new();
    EncoderConfig::default().capsule_cmd(&mut pdu, &Sqe::flush(Cid(9), Nsid(1)), 0);
    h.send(&pdu[..40]);
    h.tick();
    h.tick();
    assert!(!h.closed(), "not yet");
    std::thread::sleep(Duration::from_millis(350));
    h.tick();
    assert!(h.closed(), "closed after the PDU timeout");
    // An idle connection is not a stalled one: the admin queue stays.
    admin.tick();
    assert!(!admin.closed());
    assert_eq!(t.limits.timeouts(), 1);
}

#[test]
fn an_unanswered_r2t_is_closed_by_the_pdu_timeout() {
    let t = target();
    set(&t, LimitSettings { pdu_timeout_ms: Some(40), ..Default::default() });
    let (_admin, mut h) = io_queue(&t);
    let sqe = Sqe::rw(io::WRITE, Cid(5), Nsid(1), 0, 64, SglDescriptor::transport(32 << 10));
    h.command(&sqe, &[]);
    assert!(matches!(h.expect().header, Header::R2T(_)));
    h.tick();
    std::thread::sleep(Duration::from_millis(60));
    h.tick();
    assert!(h.closed(), "closed: the R2T was never answered");
}

#[test]
fn queues_per_host_nqn_are_limited_at_connect() {
    let t = target();
    set(&t, LimitSettings { max_connections_per_hostnqn: Some(2), ..Default::default() });
    let (admin, h1) = io_queue(&t);
    assert_eq!(t.limits.queues_of(HOSTNQN), 2);
    let mut h2 = Host::new(&t, 1);
    h2.icreq(Digests::default());
    let c = h2.connect(2, admin.cntlid, NQN, HOSTNQN, 31);
    assert_eq!(c.status, Status::CONNECT_CONTROLLER_BUSY, "third queue of the host refused");
    drop(h1);
    assert_eq!(t.limits.queues_of(HOSTNQN), 1, "a closed queue gives its place back");
    let mut h3 = Host::new(&t, 1);
    h3.icreq(Digests::default());
    assert_eq!(h3.connect(1, admin.cntlid, NQN, HOSTNQN, 31).status, Status::SUCCESS);
    assert_eq!(t.limits.queues_of(HOSTNQN), 2);
}
