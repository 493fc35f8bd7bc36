//! Get and Set Features of every feature an I/O controller answers, over the wire: the
//! values it reports, the Host Identifier's data, the supported capabilities (Select 11b),
//! and the statuses of what cannot change; a discovery controller answers only Keep Alive
//! Timer and Asynchronous Event Configuration.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::fabrics::prop;
use nvme::features::{NumQueues, capabilities, fid, sel};
use nvme::tcp::Digests;
use nvme::{Cntlid, Nsid, SglDescriptor, Sqe, Status};
use support::*;

fn get(h: &mut Host, f: u8, cdw11: u32, nsid: Nsid) -> (Status, u32) {
    let cid = h.cid();
    let mut sqe = Sqe::get_features(cid, f);
    sqe.set_cdw(11, cdw11);
    sqe.set_nsid(nsid);
    let (c, _) = h.admin(sqe);
    (c.status, c.dw0)
}

fn set(h: &mut Host, f: u8, cdw10_high: u32, cdw11: u32) -> Status {
    let cid = h.cid();
    let mut sqe = Sqe::set_features(cid, f, cdw11);
    sqe.set_cdw(10, u32::from(f) | cdw10_high);
    h.admin(sqe).0.status
}

#[test]
fn get_and_set_features_of_an_io_controller() {
    let t = target();
    let mut h = Host::new(&t, 1);
    h.hostid = *b"qpath-hostid-016";
    h.admin_up(Digests::default());

    // The mandatory features and those a Fabrics host uses answer with what the target does.
    assert_eq!(get(&mut h, fid::ARBITRATION, 0, Nsid(0)), (Status::SUCCESS, 4), "16 PDUs per turn: burst 2^4");
    assert_eq!(get(&mut h, fid::POWER_MGMT, 0, Nsid(0)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::TEMP_THRESHOLD, 0, Nsid(0)), (Status::SUCCESS, 343), "composite, over");
    assert_eq!(get(&mut h, fid::TEMP_THRESHOLD, 1 << 20, Nsid(0)), (Status::SUCCESS, 0), "composite, under");
    assert_eq!(get(&mut h, fid::TEMP_THRESHOLD, 1 << 16, Nsid(0)).0, Status::INVALID_FIELD, "no sensor 1");
    assert_eq!(get(&mut h, fid::ERROR_RECOVERY, 0, Nsid(1)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::WRITE_ATOMIC, 0, Nsid(0)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::KATO, 0, Nsid(0)), (Status::SUCCESS, 5000));
    assert_eq!(get(&mut h, fid::ASYNC_EVENT, 0, Nsid(0)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::RESV_PERSISTENCE, 0, Nsid(1)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::RESV_MASK, 0, Nsid(1)), (Status::SUCCESS, 0));
    assert_eq!(get(&mut h, fid::RESV_MASK, 0, Nsid(5)).0, Status::INVALID_FIELD, "an inactive NSID");
    assert_eq!(get(&mut h, fid::RESV_MASK, 0, Nsid(5000)).0, Status::INVALID_NS, "an NSID past NN");
    // RAM namespaces have no volatile write cache: Identify VWC is 0, and so is feature 06h.
    assert_eq!(get(&mut h, fid::VOLATILE_WC, 0, Nsid(0)).0, Status::INVALID_FIELD);
    assert_eq!(get(&mut h, fid::IRQ_COALESCE, 0, Nsid(0)).0, Status::INVALID_FIELD, "not for Fabrics (nvmet)");

    // Host Identifier: the 16 bytes the host connected with (EXHID must be set).
    let cid = h.cid();
    let mut sqe = Sqe::get_features(cid, fid::HOST_ID);
    sqe.set_cdw(11, 1);
    sqe.set_sgl(SglDescriptor::transport(16));
    let (c, data) = h.admin(sqe);
    assert_eq!((c.status, data.as_slice()), (Status::SUCCESS, &b"qpath-hostid-016"[..]));
    let cid = h.cid();
    let mut sqe = Sqe::get_features(cid, fid::HOST_ID);
    sqe.set_sgl(SglDescriptor::transport(16));
    assert_eq!(h.admin(sqe).0.status, Status::INVALID_FIELD, "a 64-bit Host Identifier was never given");

    // Supported capabilities: changeable and namespace specific bits, nothing saveable.
    let sel3 = u32::from(sel::SUPPORTED_CAPABILITIES) << 8;
    let cid = h.cid();
    let mut sqe = Sqe::get_features(cid, fid::NUM_QUEUES);
    sqe.set_cdw(10, u32::from(fid::NUM_QUEUES) | sel3);
    assert_eq!(h.admin(sqe).0.dw0, capabilities::CHANGEABLE);
    let cid = h.cid();
    let mut sqe = Sqe::get_features(cid, fid::RESV_MASK);
    sqe.set_cdw(10, u32::from(fid::RESV_MASK) | sel3);
    sqe.set_nsid(Nsid(1));
    assert_eq!(h.admin(sqe).0.dw0, capabilities::CHANGEABLE | capabilities::NS_SPECIFIC);

    // Set Features: the changeable ones change ...
    assert_eq!(set(&mut h, fid::ASYNC_EVENT, 0, 1 << 11), Status::SUCCESS);
    assert_eq!(get(&mut h, fid::ASYNC_EVENT, 0, Nsid(0)).1, 1 << 11);
    assert_eq!(set(&mut h, fid::ASYNC_EVENT, 0, 1 << 9), Status::INVALID_FIELD, "no firmware events");
    assert_eq!(set(&mut h, fid::KATO, 0, 12_345), Status::SUCCESS);
    assert_eq!(get(&mut h, fid::KATO, 0, Nsid(0)).1, 13_000, "rounded up to KAS");
    let q = NumQueues { nsq: 4, ncq: 4 }.to_dw();
    assert_eq!(set(&mut h, fid::NUM_QUEUES, 0, q), Status::SUCCESS);
    assert_eq!(get(&mut h, fid::NUM_QUEUES, 0, Nsid(0)).1, q);
    // ... the others say why not.
    for f in [fid::ARBITRATION, fid::POWER_MGMT, fid::TEMP_THRESHOLD, fid::ERROR_RECOVERY, fid::WRITE_ATOMIC] {
        assert_eq!(set(&mut h, f, 0, 0), Status::FEATURE_NOT_CHANGEABLE, "FID {f:#04x}");
    }
    assert_eq!(set(&mut h, fid::HOST_ID, 0, 1), Status::COMMAND_SEQUENCE_ERROR, "given at Connect");
    assert_eq!(set(&mut h, fid::KATO, 1 << 31, 5000), Status::FEATURE_NOT_SAVEABLE);
    assert_eq!(set(&mut h, 0x7e, 0, 0), Status::INVALID_FIELD, "no such feature");
    assert_eq!(set(&mut h, fid::RESV_PERSISTENCE, 0, 1), Status::INVALID_NS, "NSID 0 names no namespace");
}

#[test]
fn a_discovery_controller_answers_keep_alive_and_event_configuration_only() {
    let t = target();
    let mut h = Host::new(&t, 1);
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, HOSTNQN, 31);
    assert_eq!(c.status, Status::SUCCESS);
    let cid = h.cid();
    h.command(&nvme::fabrics::PropertyCmd::set_sqe(cid, prop::CC, false, 0x46_0001), &[]);
    assert_eq!(h.completion(cid).0.status, Status::SUCCESS);
    assert_eq!(get(&mut h, fid::KATO, 0, Nsid(0)).0, Status::SUCCESS);
    assert_eq!(set(&mut h, fid::ASYNC_EVENT, 0, 1 << 31), Status::SUCCESS, "discovery log change");
    assert_eq!(set(&mut h, fid::ASYNC_EVENT, 0, 1 << 11), Status::INVALID_FIELD);
    for f in [fid::NUM_QUEUES, fid::ARBITRATION, fid::TEMP_THRESHOLD, fid::RESV_MASK] {
        assert_eq!(get(&mut h, f, 0, Nsid(0)).0, Status::INVALID_FIELD, "FID {f:#04x}");
        assert_eq!(set(&mut h, f, 0, 0), Status::INVALID_FIELD, "FID {f:#04x}");
    }
    // Discovery controllers serve the discovery log only.
    let cid = h.cid();
    let sqe = Sqe::get_log_page(cid, Nsid(0), nvme::log::lid::SUPPORTED, 0, false, 1024, 0);
    assert_eq!(h.admin(sqe).0.status, Status::INVALID_FIELD);
}
