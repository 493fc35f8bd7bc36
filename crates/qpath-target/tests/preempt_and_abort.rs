//! Preempt and Abort (Reservation Acquire, RACQA 010b; NVMe Base 2.0 §8.19.7): once the
//! preempting host's command completes, no write of the preempted host lands any more.
//! A write the preempted host sent before the preempt either completes first (the preempt
//! waits it out, as Linux nvmet's `pr.c` does) or is refused with Reservation Conflict —
//! never executed after the preempt has completed.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::opcode::io;
use nvme::reservation::{PREEMPT_AND_ABORT, REGISTER, WRITE_EXCLUSIVE};
use nvme::tcp::{DataHeader, Digests, Header};
use nvme::{Nsid, SglDescriptor, Sqe, Status};
use qpath_target::backend::{Backend, FileBackend, FileRequest};
use qpath_target::namespace::NamespaceSpec;
use support::*;

/// An I/O queue of host `hostid` (its own controller), served as by reactor `reactor`.
fn io_queue(t: &std::sync::Arc<qpath_target::TargetState>, hostid: u8, reactor: usize) -> (Host, Host) {
    let mut admin = Host::new(t, 1);
    admin.hostid = [hostid; 16];
    let cntlid = admin.admin_up(Digests::default());
    let mut q = Host::on_reactor(t, 1, reactor);
    q.hostid = [hostid; 16];
    q.icreq(Digests::default());
    assert_eq!(q.connect(1, cntlid, NQN, HOSTNQN, 127).status, Status::SUCCESS);
    (admin, q)
}

/// A reservation command with its keys in the capsule.
fn resv_sqe(h: &mut Host, nsid: u32, opcode: u8, cdw10: u32, k1: u64, k2: u64) -> (Sqe, Vec<u8>) {
    let data = [k1.to_le_bytes(), k2.to_le_bytes()].concat();
    let mut sqe = Sqe::new(opcode);
    sqe.set_cid(h.cid());
    sqe.set_nsid(Nsid(nsid));
    sqe.set_sgl(SglDescriptor::in_capsule(data.len() as u32));
    sqe.set_cdw(10, cdw10);
    (sqe, data)
}

fn resv(h: &mut Host, nsid: u32, opcode: u8, cdw10: u32, k1: u64, k2: u64) -> Status {
    let (sqe, data) = resv_sqe(h, nsid, opcode, cdw10, k1, k2);
    h.command(&sqe, &data);
    h.completion(sqe.cid()).0.status
}

/// Feeds a command to the connection without running it further (no file completion is
/// delivered, no timer run): what happened at once stays visible.
fn feed_command(h: &mut Host, sqe: &Sqe, data: &[u8]) {
    let mut capsule = Vec::new();
    h.enc.capsule_cmd(&mut capsule, sqe, data.len());
    capsule.extend_from_slice(data);
    assert_eq!(h.feed_only(&capsule), capsule.len());
}

/// Host A holds Write Exclusive on `nsid` with key 0xa; host B is registered with 0xb.
fn a_holds(a: &mut Host, b: &mut Host, nsid: u32) {
    assert_eq!(resv(a, nsid, io::RESV_REGISTER, u32::from(REGISTER), 0, 0xa), Status::SUCCESS);
    assert_eq!(resv(b, nsid, io::RESV_REGISTER, u32::from(REGISTER), 0, 0xb), Status::SUCCESS);
    let acquire = u32::from(WRITE_EXCLUSIVE) << 8;
    assert_eq!(resv(a, nsid, io::RESV_ACQUIRE, acquire, 0xa, 0), Status::SUCCESS);
}

/// B preempts A and aborts (takes Write Exclusive, A's registration goes).
fn preempt_and_abort_cdw10() -> u32 {
    u32::from(PREEMPT_AND_ABORT) | u32::from(WRITE_EXCLUSIVE) << 8
}

#[test]
fn a_write_whose_data_arrives_after_the_preempt_is_refused() {
    let t = target();
    let (_aa, mut a) = io_queue(&t, 0xa, 0);
    let (_ba, mut b) = io_queue(&t, 0xb, 1);
    assert_eq!(a.write(1, 0, &pattern(4096, 1), 8192).status, Status::SUCCESS);
    a_holds(&mut a, &mut b, 1);

    // A's 64 KiB write passes the reservation check and gets its R2T; its data is held back.
    let cid = a.cid();
    let data = pattern(64 << 10, 2);
    let sqe = Sqe::rw(io::WRITE, cid, Nsid(1), 0, 128, SglDescriptor::transport(data.len() as u32));
    a.command(&sqe, &[]);
    let r2t = match a.expect().header {
        Header::R2T(r) => r,
        h => panic!("expected an R2T, got {h:?}"),
    };

    // B preempts A and aborts: it completes at once (no write has passed its gate yet).
    assert_eq!(resv(&mut b, 1, io::RESV_ACQUIRE, preempt_and_abort_cdw10(), 0xb, 0xa), Status::SUCCESS);

    // A's data arrives now: the write is refused, its blocks untouched.
    let d = DataHeader { cccid: cid, ttag: r2t.ttag, datao: 0, datal: data.len() as u32, last: true, success: false };
    let mut out = Vec::new();
    a.enc.h2c_data(&mut out, &d);
    out.extend_from_slice(&data);
    a.send(&out);
    assert_eq!(a.completion(cid).0.status, Status::RESERVATION_CONFLICT);
    let (c, back) = b.read(1, 0, 4096);
    assert_eq!((c.status, back), (Status::SUCCESS, pattern(4096, 1)), "the preempted host's write did not land");
}

#[test]
fn a_write_in_flight_is_waited_out_before_the_preempt_completes() {
    let dir = std::env::temp_dir().join(format!("qpath-preempt-abort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    let t = target();
    let file = FileBackend::open(&FileRequest::read_write(&path, Some(1 << 20), "namespace 2")).unwrap().0;
    t.subsystem(NQN)
        .unwrap()
        .add_namespace(NamespaceSpec {
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
    let (_aa, mut a) = io_queue(&t, 0xa, 0);
    let (_ba, mut b) = io_queue(&t, 0xb, 1);
    a_holds(&mut a, &mut b, 2);

    // A's write is executing: its file operation is submitted, its completion not yet in.
    let cid = a.cid();
    let data = pattern(4096, 3);
    let sqe = Sqe::rw(io::WRITE, cid, Nsid(2), 8, 8, SglDescriptor::in_capsule(4096));
    feed_command(&mut a, &sqe, &data);
    a.read_one_batch();
    assert!(a.recv().is_none(), "the write waits for its file operation");

    // B's Preempt and Abort takes the reservation, then waits for A's write.
    let (sqe, keys) = resv_sqe(&mut b, 2, io::RESV_ACQUIRE, preempt_and_abort_cdw10(), 0xb, 0xa);
    let preempt = sqe.cid();
    feed_command(&mut b, &sqe, &keys);
    for _ in 0..5 {
        b.turn();
        assert!(b.recv().is_none(), "the preempt completes only after the write it waits out");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // A new write of A is refused at once.
    assert_eq!(a.write(2, 64, &pattern(512, 4), 8192).status, Status::RESERVATION_CONFLICT);

    // A's write completes (it was admitted before the preempt), then B's preempt does.
    a.pump();
    assert_eq!(a.completion(cid).0.status, Status::SUCCESS);
    b.pump();
    assert_eq!(b.completion(preempt).0.status, Status::SUCCESS);
    let (c, back) = b.read(2, 8, 4096);
    assert_eq!((c.status, back), (Status::SUCCESS, data));
    std::fs::remove_dir_all(&dir).unwrap();
}
