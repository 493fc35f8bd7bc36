//! The Abort command (NVMe Base 2.0 §5.1): a command that has not started executing — held
//! by its namespace's provisioned rate, or waiting for its data after an R2T — is aborted
//! (it completes with Command Abort Requested and changes nothing, and the Abort's DW0 bit 0
//! is 0); a command that ran, or no command at all, is reported not aborted (bit 0 = 1).
//! The admin queue asks; the I/O queue that holds the command answers on its tick.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::opcode::{admin, io};
use nvme::tcp::{DataHeader, Digests, Header};
use nvme::{Cid, Cntlid, Nsid, SglDescriptor, Sqe, Status};
use qpath_target::qos::QosSettings;
use support::*;

fn abort_sqe(h: &mut Host, sqid: u16, cid: Cid) -> Sqe {
    let mut sqe = Sqe::new(admin::ABORT);
    sqe.set_cid(h.cid());
    sqe.set_cdw(10, u32::from(sqid) | u32::from(cid.0) << 16);
    sqe
}

/// Feeds a command without running the connection further (no timers, no file completions).
fn feed(h: &mut Host, sqe: &Sqe, data: &[u8]) {
    let mut capsule = Vec::new();
    h.enc.capsule_cmd(&mut capsule, sqe, data.len());
    capsule.extend_from_slice(data);
    assert_eq!(h.feed_only(&capsule), capsule.len());
}

/// Sends an Abort and lets the I/O queue answer on its tick; the Abort's completion.
fn abort(a: &mut Host, q: &mut Host, sqid: u16, cid: Cid) -> (Status, u32) {
    let sqe = abort_sqe(a, sqid, cid);
    feed(a, &sqe, &[]);
    q.ctx_tick_only();
    a.pump();
    let (c, _) = a.completion(sqe.cid());
    (c.status, c.dw0)
}

fn setup() -> (std::sync::Arc<qpath_target::TargetState>, Host, Host, Cntlid) {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    (t, a, q, cntlid)
}

#[test]
fn a_command_held_by_the_provisioned_rate_is_aborted() {
    let (t, mut a, mut q, _) = setup();
    assert_eq!(q.write(1, 0, &pattern(4096, 1), 8192).status, Status::SUCCESS);
    let ns = t.subsystem(NQN).unwrap().namespaces().0.get(Nsid(1)).cloned().unwrap();
    // One I/O per second: the next write is held for about a second, not executed.
    ns.qos.set(QosSettings { iops: 1, bytes_per_sec: 0, delay_us: 0 });
    let cid = q.cid();
    let sqe = Sqe::rw(io::WRITE, cid, Nsid(1), 0, 8, SglDescriptor::in_capsule(4096));
    feed(&mut q, &sqe, &pattern(4096, 2));
    assert!(q.recv().is_none(), "held by the rate");

    assert_eq!(abort(&mut a, &mut q, 1, cid), (Status::SUCCESS, 0), "aborted");
    q.read_one_batch();
    assert_eq!(q.completion(cid).0.status, Status::ABORT_REQUESTED);
    ns.qos.set(QosSettings::default());
    let (c, back) = q.read(1, 0, 4096);
    assert_eq!((c.status, back), (Status::SUCCESS, pattern(4096, 1)), "the aborted write changed nothing");
}

#[test]
fn the_timer_of_an_aborted_command_does_not_run_the_next_one_in_its_slot_early() {
    let (t, mut a, mut q, _) = setup();
    let ns = t.subsystem(NQN).unwrap().namespaces().0.get(Nsid(1)).cloned().unwrap();
    // One I/O per second: the first write is held until about 1 s from now, the next until 2 s.
    ns.qos.set(QosSettings { iops: 1, bytes_per_sec: 0, delay_us: 0 });
    let first = q.cid();
    feed(&mut q, &Sqe::rw(io::WRITE, first, Nsid(1), 0, 8, SglDescriptor::in_capsule(4096)), &pattern(4096, 1));
    let held_at = std::time::Instant::now();
    assert_eq!(abort(&mut a, &mut q, 1, first), (Status::SUCCESS, 0), "aborted");
    q.read_one_batch();
    assert_eq!(q.completion(first).0.status, Status::ABORT_REQUESTED);

    // The next command takes the freed slot; the aborted one's timer (due at 1 s) is still set.
    let next = q.cid();
    feed(&mut q, &Sqe::rw(io::WRITE, next, Nsid(1), 0, 8, SglDescriptor::in_capsule(4096)), &pattern(4096, 2));
    std::thread::sleep(std::time::Duration::from_millis(1400).saturating_sub(held_at.elapsed()));
    let checked_at = held_at.elapsed();
    q.turn();
    if checked_at < std::time::Duration::from_millis(1900) {
        assert!(q.recv().is_none(), "held by the rate until its own time, not run by the old timer");
    } else {
        // The thread woke too late to tell the old timer (1 s) from the command's own (2 s).
        println!("SKIP: the timer check woke {checked_at:?} after the hold began (a loaded machine)");
    }
    q.pump();
    assert_eq!(q.completion(next).0.status, Status::SUCCESS);
    ns.qos.set(QosSettings::default());
}

#[test]
fn a_write_waiting_for_its_data_is_aborted_and_never_runs() {
    let (_t, mut a, mut q, _) = setup();
    assert_eq!(q.write(1, 0, &pattern(8192, 1), 8192).status, Status::SUCCESS);
    let cid = q.cid();
    let data = pattern(64 << 10, 2);
    q.command(&Sqe::rw(io::WRITE, cid, Nsid(1), 0, 128, SglDescriptor::transport(data.len() as u32)), &[]);
    let Header::R2T(r2t) = q.expect().header else { panic!("expected an R2T") };

    assert_eq!(abort(&mut a, &mut q, 1, cid), (Status::SUCCESS, 0), "aborted before its data came");
    assert!(q.recv().is_none(), "it completes once its data is in");
    let d = DataHeader { cccid: cid, ttag: r2t.ttag, datao: 0, datal: data.len() as u32, last: true, success: false };
    let mut out = Vec::new();
    q.enc.h2c_data(&mut out, &d);
    out.extend_from_slice(&data);
    q.send(&out);
    assert_eq!(q.completion(cid).0.status, Status::ABORT_REQUESTED);
    let (c, back) = q.read(1, 0, 8192);
    assert_eq!((c.status, back), (Status::SUCCESS, pattern(8192, 1)), "its data was not written");
}

#[test]
fn what_ran_or_does_not_exist_is_not_aborted() {
    let (_t, mut a, mut q, _) = setup();
    let cid = q.cid();
    q.command(&Sqe::rw(io::WRITE, cid, Nsid(1), 0, 8, SglDescriptor::in_capsule(4096)), &pattern(4096, 3));
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    assert_eq!(abort(&mut a, &mut q, 1, cid), (Status::SUCCESS, 1), "a command that completed");
    assert_eq!(abort(&mut a, &mut q, 1, Cid(999)), (Status::SUCCESS, 1), "no such command");
    assert_eq!(abort(&mut a, &mut q, 0, Cid(1)), (Status::SUCCESS, 1), "an admin command (they run at once)");
    assert_eq!(abort(&mut a, &mut q, 7, Cid(1)), (Status::SUCCESS, 1), "no such queue");
}

#[test]
fn at_most_acl_plus_one_aborts_wait_at_once() {
    let (_t, mut a, mut q, _) = setup();
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, nvme::identify::cns::CONTROLLER, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let acl = usize::from(nvme::identify::IdentifyController::decode(&data).acl);
    let mut waiting = Vec::new();
    for _ in 0..=acl {
        let sqe = abort_sqe(&mut a, 1, Cid(500));
        feed(&mut a, &sqe, &[]);
        waiting.push(sqe.cid());
    }
    let sqe = abort_sqe(&mut a, 1, Cid(500));
    feed(&mut a, &sqe, &[]);
    a.read_one_batch();
    assert_eq!(a.completion(sqe.cid()).0.status, Status::ABORT_COMMAND_LIMIT_EXCEEDED);
    q.ctx_tick_only();
    a.pump();
    for cid in waiting {
        assert_eq!(a.completion(cid).0.dw0, 1, "answered: not found");
    }
}
