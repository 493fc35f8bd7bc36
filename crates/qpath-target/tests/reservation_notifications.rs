//! Two hosts share a namespace. When one host's reservation command takes something from
//! the other (a release, a preempt, a clear), the other host's controller raises
//! "Reservation Log Page Available" and its Reservation Notification log page (LID 80h)
//! says what and where, one page per read; the Reservation Notification Mask feature
//! (FID 82h) silences a type per namespace for that controller only.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::features::{AsyncEvent, fid};
use nvme::log::{ResvNotification, lid, resv_notice};
use nvme::opcode::io;
use nvme::reservation::{CLEAR, PREEMPT, REGISTER, RELEASE, WRITE_EXCLUSIVE, WRITE_EXCLUSIVE_REG_ONLY};
use nvme::tcp::Digests;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use support::*;

/// A host with its admin queue and one I/O queue.
struct Peer {
    admin: Host,
    io: Host,
}

fn peer(t: &std::sync::Arc<qpath_target::TargetState>, hostid: u8) -> Peer {
    let mut admin = Host::new(t, 1);
    admin.hostid = [hostid; 16];
    let cntlid = admin.admin_up(Digests::default());
    let mut io = Host::new(t, 1);
    io.hostid = [hostid; 16];
    io.icreq(Digests::default());
    assert_eq!(io.connect(1, cntlid, NQN, HOSTNQN, 127).status, Status::SUCCESS);
    Peer { admin, io }
}

/// A reservation command with its keys as in-capsule data.
fn resv(h: &mut Host, opcode: u8, cdw10: u32, k1: u64, k2: u64) -> Status {
    let cid = h.cid();
    let mut data = k1.to_le_bytes().to_vec();
    if opcode != io::RESV_RELEASE {
        data.extend_from_slice(&k2.to_le_bytes());
    }
    let mut sqe = Sqe::new(opcode);
    sqe.set_cid(cid);
    sqe.set_nsid(Nsid(1));
    sqe.set_sgl(SglDescriptor::in_capsule(data.len() as u32));
    sqe.set_cdw(10, cdw10);
    h.command(&sqe, &data);
    h.completion(cid).0.status
}

fn read_log(h: &mut Host) -> ResvNotification {
    let cid = h.cid();
    let (c, data) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::RESERVATION, 0, false, 64, 0));
    assert_eq!(c.status, Status::SUCCESS);
    ResvNotification::decode(&data)
}

fn aer(h: &mut Host) -> Cid {
    let cid = h.cid();
    h.command(&Sqe::async_event_request(cid), &[]);
    assert!(h.recv().is_none(), "the AER waits for an event");
    cid
}

fn set_mask(h: &mut Host, nsid: Nsid, mask: u32) -> Status {
    let cid = h.cid();
    let mut sqe = Sqe::set_features(cid, fid::RESV_MASK, mask);
    sqe.set_nsid(nsid);
    h.admin(sqe).0.status
}

#[test]
fn a_host_hears_what_another_host_took_from_it() {
    let t = target();
    let mut a = peer(&t, 0xa);
    let mut b = peer(&t, 0xb);
    assert_eq!(resv(&mut a.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 1), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 2), Status::SUCCESS);
    let a_aer = aer(&mut a.admin);

    // B takes a Registrants Only reservation and releases it: A, a registrant, is told.
    let reg_only = u32::from(WRITE_EXCLUSIVE_REG_ONLY) << 8;
    assert_eq!(resv(&mut b.io, io::RESV_ACQUIRE, reg_only, 2, 0), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_RELEASE, reg_only | u32::from(RELEASE), 2, 0), Status::SUCCESS);
    a.admin.tick();
    let (c, _) = a.admin.completion(a_aer);
    assert_eq!(AsyncEvent::from_dw0(c.dw0), AsyncEvent::RESERVATION_LOG);
    assert_eq!(c.dw0, 0x0080_0006, "type 110b, information 00h, log page 80h");
    let page = read_log(&mut a.admin);
    assert_eq!(
        (page.count, page.notice, page.available, page.nsid),
        (1, resv_notice::RESERVATION_RELEASED, 0, Nsid(1))
    );
    assert_eq!(read_log(&mut a.admin), ResvNotification::default(), "read clears: an empty page");
    // B's own controller heard nothing: it made the change.
    assert_eq!(read_log(&mut b.admin), ResvNotification::default());

    // A masks Registration Preempted on namespace 1; B preempts A's registration.
    assert_eq!(set_mask(&mut a.admin, Nsid(1), 1 << 4), Status::INVALID_FIELD, "bit 4 is reserved");
    assert_eq!(set_mask(&mut a.admin, Nsid(9), 0), Status::INVALID_FIELD, "an inactive NSID");
    assert_eq!(set_mask(&mut a.admin, Nsid(1), 1 << resv_notice::REGISTRATION_PREEMPTED), Status::SUCCESS);
    let cid = a.admin.cid();
    let mut get = Sqe::get_features(cid, fid::RESV_MASK);
    get.set_nsid(Nsid(1));
    let (c, _) = a.admin.admin(get);
    assert_eq!((c.status, c.dw0), (Status::SUCCESS, 1 << resv_notice::REGISTRATION_PREEMPTED));
    let cid = b.admin.cid();
    let mut get = Sqe::get_features(cid, fid::RESV_MASK);
    get.set_nsid(Nsid(1));
    assert_eq!(b.admin.admin(get).0.dw0, 0, "the mask is A's controller's, not the namespace's");
    let a_aer = aer(&mut a.admin);
    let preempt = u32::from(WRITE_EXCLUSIVE) << 8 | u32::from(PREEMPT);
    assert_eq!(resv(&mut b.io, io::RESV_ACQUIRE, preempt, 2, 1), Status::SUCCESS);
    a.admin.tick();
    assert!(a.admin.recv().is_none(), "masked: no event");

    // Unmasked (NSID FFFFFFFFh: every namespace), A registers again and B clears.
    assert_eq!(set_mask(&mut a.admin, Nsid::BROADCAST, 0), Status::SUCCESS);
    assert_eq!(resv(&mut a.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 1), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_RELEASE, u32::from(CLEAR), 2, 0), Status::SUCCESS);
    a.admin.tick();
    let (c, _) = a.admin.completion(a_aer);
    assert_eq!(AsyncEvent::from_dw0(c.dw0), AsyncEvent::RESERVATION_LOG);
    let page = read_log(&mut a.admin);
    assert_eq!((page.count, page.notice), (2, resv_notice::RESERVATION_PREEMPTED), "the masked one made no page");

    // With RAE set the event stays masked after the read; a read without RAE re-arms it.
    assert_eq!(resv(&mut a.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 1), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 2), Status::SUCCESS);
    let a_aer = aer(&mut a.admin);
    assert_eq!(resv(&mut b.io, io::RESV_RELEASE, u32::from(CLEAR), 2, 0), Status::SUCCESS);
    a.admin.tick();
    assert_eq!(a.admin.completion(a_aer).0.dw0, 0x0080_0006);
    let cid = a.admin.cid();
    let (_, data) = a.admin.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::RESERVATION, 0, true, 64, 0));
    assert_eq!(ResvNotification::decode(&data).count, 3);
    let a_aer = aer(&mut a.admin);
    assert_eq!(resv(&mut a.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 1), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 2), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_RELEASE, u32::from(CLEAR), 2, 0), Status::SUCCESS);
    a.admin.tick();
    assert!(a.admin.recv().is_none(), "RAE kept the event masked");
    assert_eq!(read_log(&mut a.admin).count, 4, "the page is queued all the same");
    // That read had RAE clear: the next notification raises the event again.
    assert_eq!(resv(&mut a.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 1), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_REGISTER, u32::from(REGISTER), 0, 2), Status::SUCCESS);
    assert_eq!(resv(&mut b.io, io::RESV_RELEASE, u32::from(CLEAR), 2, 0), Status::SUCCESS);
    a.admin.tick();
    assert_eq!(a.admin.completion(a_aer).0.dw0, 0x0080_0006, "re-armed by the read without RAE");
    assert_eq!(read_log(&mut a.admin).count, 5);
    // An offset past the page fails and takes nothing.
    let cid = a.admin.cid();
    let (c, _) = a.admin.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::RESERVATION, 0, false, 64, 128));
    assert_eq!(c.status, Status::INVALID_FIELD);
}
