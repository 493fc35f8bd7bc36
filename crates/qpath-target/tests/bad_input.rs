//! Hostile and broken input, one case each: every one gets the answer the
//! spec gives (a C2HTermReq and close, a Connect status, or a command
//! status) and a healthy connection on the same target keeps working.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::opcode::io;
use nvme::tcp::pdu::ch_offset;
use nvme::tcp::{DataHeader, Digests, EncoderConfig, Fes, Header, IcReq};
use nvme::{Cid, Cntlid, Cqe, Nsid, SglDescriptor, Sqe, Status};
use support::*;

/// A target with a healthy admin + I/O queue pair next to the connection under test.
struct Fixture {
    t: std::sync::Arc<qpath_target::TargetState>,
    _admin: Host,
    healthy: Host,
    cntlid: Cntlid,
}

fn fixture() -> Fixture {
    let t = target();
    let mut admin = Host::new(&t, 1);
    let cntlid = admin.admin_up(Digests::default());
    let cid = admin.cid();
    admin.admin(Sqe::set_features(cid, nvme::features::fid::NUM_QUEUES, 0x0007_0007));
    let mut healthy = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    assert_eq!(healthy.write(1, 0, &pattern(4096, 9), 8192).status, Status::SUCCESS);
    Fixture { t, _admin: admin, healthy, cntlid }
}

impl Fixture {
    fn healthy_still_served(&mut self) {
        let (c, data) = self.healthy.read(1, 0, 4096);
        assert_eq!(c.status, Status::SUCCESS);
        assert_eq!(data, pattern(4096, 9));
    }

    fn io_conn(&mut self, qid: u16, digests: Digests) -> Host {
        Host::io_up(&self.t, 1, self.cntlid, qid, digests)
    }
}

fn expect_term(h: &mut Host, fes: Fes, fei: u32) {
    match h.expect().header {
        Header::C2HTermReq(t) => {
            assert_eq!(t.fes, fes as u16, "FES");
            assert_eq!(t.fei, fei, "FEI");
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(h.closed(), "connection closed after the TermReq");
}

#[test]
fn oversize_plen() {
    let mut f = fixture();
    let mut h = f.io_conn(2, Digests::default());
    let mut pdu = Vec::new();
    EncoderConfig::default().capsule_cmd(&mut pdu, &Sqe::flush(Cid(1), Nsid(1)), 0);
    pdu[4..8].copy_from_slice(&(64u32 << 20).to_le_bytes());
    pdu[3] = 72;
    h.send(&pdu);
    expect_term(&mut h, Fes::InvalidHeaderField, ch_offset::PLEN);
    f.healthy_still_served();
}

#[test]
fn pdu_type_not_allowed() {
    let mut f = fixture();
    // A controller-to-host PDU sent by the host.
    let mut h = f.io_conn(2, Digests::default());
    let mut pdu = Vec::new();
    EncoderConfig::default().capsule_resp(&mut pdu, &Cqe::success(Cid(1)));
    h.send(&pdu);
    expect_term(&mut h, Fes::InvalidHeaderField, ch_offset::TYPE);
    // Anything but ICReq first is a sequence error.
    let mut h = Host::new(&f.t, 1);
    let mut pdu = Vec::new();
    EncoderConfig::default().capsule_cmd(&mut pdu, &Sqe::flush(Cid(1), Nsid(1)), 0);
    h.send(&pdu);
    expect_term(&mut h, Fes::PduSequenceError, 0);
    f.healthy_still_served();
}

#[test]
fn bad_header_digest() {
    let mut f = fixture();
    let d = Digests { header: true, data: true };
    let mut h = f.io_conn(2, d);
    let mut pdu = Vec::new();
    h.enc.capsule_cmd(&mut pdu, &Sqe::flush(Cid(5), Nsid(1)), 0);
    pdu[73] ^= 0xff;
    h.send(&pdu);
    expect_term(&mut h, Fes::HeaderDigestError, 0);
    f.healthy_still_served();
}

#[test]
fn bad_data_digest_fails_the_command_only() {
    let mut f = fixture();
    let d = Digests { header: true, data: true };
    let mut h = f.io_conn(2, d);
    let data = pattern(4096, 3);
    let sqe = Sqe::rw(io::WRITE, Cid(7), Nsid(1), 64, 8, SglDescriptor::in_capsule(4096));
    let mut pdu = Vec::new();
    h.enc.capsule_cmd(&mut pdu, &sqe, data.len());
    pdu.extend_from_slice(&data);
    pdu.extend_from_slice(&(nvme::tcp::crc32c(&data) ^ 1).to_le_bytes());
    h.send(&pdu);
    let (c, _) = h.completion(Cid(7));
    assert_eq!(c.status, Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(!h.closed());
    // The data was not written, and the connection goes on.
    let (c, back) = h.read(1, 64, 4096);
    assert_eq!(c.status, Status::SUCCESS);
    assert!(back.iter().all(|&b| b == 0));
    f.healthy_still_served();
}

#[test]
fn second_icreq() {
    let mut f = fixture();
    let mut h = f.io_conn(2, Digests::default());
    h.send(&IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode());
    expect_term(&mut h, Fes::PduSequenceError, 0);
    f.healthy_still_served();
}

#[test]
fn connect_to_unknown_nqn() {
    let mut f = fixture();
    let mut h = Host::new(&f.t, 1);
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, "nqn.2024-01.io.qpath:nope", HOSTNQN, 31);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(c.dw0, (1 << 16) | 256, "IATTR=data, IPO=SUBNQN");
    assert!(!h.closed());
    f.healthy_still_served();
}

#[test]
fn connect_from_host_not_allowed() {
    let mut f = fixture();
    let mut h = Host::new(&f.t, 1);
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, NQN, "nqn.2014-08.org.example:intruder", 31);
    assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
    assert_eq!(c.dw0, (1 << 16) | 512);
    f.healthy_still_served();
}

#[test]
fn io_connect_with_bad_cntlid() {
    let mut f = fixture();
    let mut h = Host::new(&f.t, 1);
    h.icreq(Digests::default());
    let c = h.connect(2, Cntlid(f.cntlid.0 + 100), NQN, HOSTNQN, 31);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(c.dw0, (1 << 16) | 16, "IPO=CNTLID");
    // Before Connect succeeds, other commands are refused.
    let cid = h.cid();
    h.command(&Sqe::flush(cid, Nsid(1)), &[]);
    assert_eq!(h.completion(cid).0.status, Status::INVALID_OPCODE);
    f.healthy_still_served();
}

#[test]
fn command_for_missing_namespace() {
    let mut f = fixture();
    let (c, _) = f.healthy.read(7, 0, 4096);
    assert_eq!(c.status, Status::INVALID_NS);
    assert!(c.status.dnr);
    f.healthy_still_served();
}

#[test]
fn out_of_range_lba() {
    let mut f = fixture();
    let (c, _) = f.healthy.read(1, 2047, 4096);
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE);
    let c = f.healthy.write(1, 1u64 << 60, &pattern(512, 0), 8192);
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE);
    f.healthy_still_served();
}

#[test]
fn h2c_data_for_unknown_ttag() {
    let mut f = fixture();
    let mut h = f.io_conn(2, Digests::default());
    let mut pdu = Vec::new();
    let d = DataHeader { cccid: Cid(1), ttag: 77, datao: 0, datal: 512, last: true, success: false };
    h.enc.h2c_data(&mut pdu, &d);
    pdu.extend_from_slice(&[0u8; 512]);
    h.send(&pdu);
    expect_term(&mut h, Fes::InvalidHeaderField, 10);
    f.healthy_still_served();
}

#[test]
fn h2c_data_beyond_maxh2cdata() {
    let mut f = fixture();
    let mut h = f.io_conn(2, Digests::default());
    let max = f.t.opts.maxh2cdata;
    let sqe = Sqe::rw(io::WRITE, Cid(3), Nsid(1), 0, 1024, SglDescriptor::transport(512 * 1024));
    h.command(&sqe, &[]);
    let r2t = match h.expect().header {
        Header::R2T(r) => r,
        other => panic!("{other:?}"),
    };
    let mut pdu = Vec::new();
    let d = DataHeader { cccid: Cid(3), ttag: r2t.ttag, datao: 0, datal: max + 4096, last: true, success: false };
    h.enc.h2c_data(&mut pdu, &d);
    h.send(&pdu);
    expect_term(&mut h, Fes::DataLimitExceeded, 0);
    f.healthy_still_served();
}

#[test]
fn more_commands_than_sqsize() {
    let mut f = fixture();
    let mut h = Host::new(&f.t, 1);
    h.icreq(Digests::default());
    assert_eq!(h.connect(3, f.cntlid, NQN, HOSTNQN, 3).status, Status::SUCCESS);
    // SQSIZE 3 = 4 entries. Five writes waiting for R2T data hold their slots.
    for i in 0..5u16 {
        let sqe = Sqe::rw(io::WRITE, Cid(100 + i), Nsid(1), 0, 8, SglDescriptor::transport(4096));
        let mut pdu = Vec::new();
        h.enc.capsule_cmd(&mut pdu, &sqe, 0);
        h.send(&pdu);
    }
    for _ in 0..4 {
        assert!(matches!(h.expect().header, Header::R2T(_)));
    }
    expect_term(&mut h, Fes::PduSequenceError, 0);
    f.healthy_still_served();
}
