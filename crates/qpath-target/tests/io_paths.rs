//! Reads and writes through an I/O queue: in-capsule and R2T writes, reads
//! back, with and without digests; flush, write zeroes, deallocate; ANA
//! states gating I/O; an ANA change raising an AEN; keep-alive teardown.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::features::fid;
use nvme::log::{AnaLog, lid};
use nvme::opcode::io;
use nvme::tcp::{Digests, Header};
use nvme::{AnaGrpId, AnaState, Nsid, SglDescriptor, Sqe, Status};
use support::*;

fn io_round_trip(digests: Digests) {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(digests);
    let mut q = Host::io_up(&t, 1, cntlid, 1, digests);
    for (slba, len) in [(0u64, 4096usize), (8, 512), (100, 8192), (200, 128 * 1024), (1000, 512 * 1024)] {
        let data = pattern(len, slba as u8);
        let c = q.write(1, slba, &data, 8192);
        assert_eq!(c.status, Status::SUCCESS, "write {len} at {slba}");
        let (c, back) = q.read(1, slba, len);
        assert_eq!(c.status, Status::SUCCESS);
        assert!(back == data, "read back {len} at {slba}");
    }
}

#[test]
fn io_without_digests() {
    io_round_trip(Digests::default());
}

#[test]
fn io_with_header_and_data_digests() {
    io_round_trip(Digests { header: true, data: true });
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    q.write(1, 0, &pattern(8192, 1), 8192);
    let cid = q.cid();
    q.command(&Sqe::flush(cid, Nsid(1)), &[]);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let cid = q.cid();
    q.command(&Sqe::write_zeroes(cid, Nsid(1), 0, 8, false), &[]);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let (_, back) = q.read(1, 0, 8192);
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert_eq!(&back[4096..], &pattern(8192, 1)[4096..]);
    // DSM deallocate of blocks 8..16 through in-capsule range data.
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&8u64.to_le_bytes());
    let cid = q.cid();
    q.command(&Sqe::dsm_deallocate(cid, Nsid(1), 1, SglDescriptor::in_capsule(16)), &range);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let (_, back) = q.read(1, 0, 8192);
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn ana_inaccessible_fails_io_and_raises_aen() {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let cid = a.cid();
    assert_eq!(a.admin(Sqe::set_features(cid, fid::ASYNC_EVENT, 1 << 11)).0.status, Status::SUCCESS);
    let aer = a.cid();
    a.command(&Sqe::async_event_request(aer), &[]);
    assert!(a.recv().is_none(), "the AER is held");
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());

    t.set_ana_state(1, AnaGrpId(1), AnaState::Inaccessible).unwrap();
    let (c, _) = q.read(1, 0, 4096);
    assert_eq!(c.status, Status::ANA_INACCESSIBLE);
    assert!(c.status.is_path_error());

    a.tick();
    let (c, _) = a.completion(aer);
    assert_eq!(c.dw0, nvme::features::AsyncEvent::ANA_CHANGE.to_dw0());
    let cid = a.cid();
    let (_, data) = a.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, false, 4096, 0));
    assert_eq!(AnaLog::decode(&data).unwrap().groups[0].state, AnaState::Inaccessible);

    // The other port still sees the group optimized.
    let mut a2 = Host::new(&t, 2);
    let c2 = a2.admin_up(Digests::default());
    let mut q2 = Host::io_up(&t, 2, c2, 1, Digests::default());
    assert_eq!(q2.read(1, 0, 4096).0.status, Status::SUCCESS);

    t.set_ana_state(1, AnaGrpId(1), AnaState::NonOptimized).unwrap();
    assert_eq!(q.read(1, 0, 4096).0.status, Status::SUCCESS);
}

#[test]
fn keep_alive_timeout_tears_down_controller() {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    let cid = a.cid();
    assert_eq!(a.admin(Sqe::set_features(cid, fid::KATO, 1000)).0.dw0, 1000);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    a.tick();
    assert!(a.closed(), "admin queue closed after keep-alive timeout");
    q.tick();
    assert!(q.closed(), "I/O queue closed with its controller");
    // The controller id is gone: a new I/O queue Connect for it fails.
    let mut late = Host::new(&t, 1);
    late.icreq(Digests::default());
    assert_eq!(late.connect(2, cntlid, NQN, HOSTNQN, 31).status, Status::CONNECT_INVALID_PARAMETERS);
}

#[test]
fn queue_limits_and_controller_reset() {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let cid = a.cid();
    a.admin(Sqe::set_features(cid, fid::NUM_QUEUES, 0x0001_0001));
    let _q1 = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    let mut q = Host::new(&t, 1);
    q.icreq(Digests::default());
    // QID 3 is beyond the 2 queues granted; QID 1 is taken.
    assert_eq!(q.connect(3, cntlid, NQN, HOSTNQN, 31).status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(q.connect(1, cntlid, NQN, HOSTNQN, 31).status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(q.connect(2, cntlid, NQN, HOSTNQN, 4000).status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(q.connect(2, cntlid, NQN, HOSTNQN, 31).status, Status::SUCCESS);
    // CC.EN = 0 resets the controller: I/O queues close.
    let cid = a.cid();
    a.command(&nvme::fabrics::PropertyCmd::set_sqe(cid, nvme::fabrics::prop::CC, false, 0), &[]);
    assert_eq!(a.completion(cid).0.status, Status::SUCCESS);
    q.tick();
    assert!(q.closed());
    let _ = io::READ;
    let _ = Header::IcReq;
}
