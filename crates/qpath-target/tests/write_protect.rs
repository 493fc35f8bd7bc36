//! Namespace write protection (Set/Get Features 84h, NVMe Base 2.0 §8.12), as Linux nvmet
//! offers it and one more state: a host write protects a namespace, every writing command
//! is then refused with Namespace is Write Protected, Identify Namespace says so (NSATTR bit
//! 0) and the hosts that see it are told (Namespace Attribute Changed); No Write Protect
//! lifts it; Write Protect Until Power Cycle (what a configured read-only namespace is)
//! stays until the target restarts.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::features::{AsyncEvent, fid, write_protect};
use nvme::identify::{IdentifyController, IdentifyNamespace, cns, nwpc};
use nvme::log::{decode_changed_ns_list, lid};
use nvme::opcode::io;
use nvme::tcp::Digests;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use qpath_target::backend::Backend;
use qpath_target::namespace::NamespaceSpec;
use support::*;

/// Namespace attribute notices (Asynchronous Event Configuration bit 8).
const AEN_NS_ATTR: u32 = 1 << 8;

fn set_wp(a: &mut Host, nsid: Nsid, state: u32) -> Status {
    let cid = a.cid();
    let mut sqe = Sqe::set_features(cid, fid::WRITE_PROTECT, state);
    sqe.set_nsid(nsid);
    a.admin(sqe).0.status
}

fn get_wp(a: &mut Host, nsid: Nsid) -> (Status, u32) {
    let cid = a.cid();
    let mut sqe = Sqe::get_features(cid, fid::WRITE_PROTECT);
    sqe.set_nsid(nsid);
    let (c, _) = a.admin(sqe);
    (c.status, c.dw0)
}

fn nsattr(a: &mut Host, nsid: u32) -> u8 {
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(nsid), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    IdentifyNamespace::decode(&data).nsattr
}

/// Write Zeroes of one block at `slba` of namespace 1.
fn write_zeroes(q: &mut Host, slba: u64) -> Status {
    let cid = q.cid();
    let mut sqe = Sqe::rw(io::WRITE_ZEROES, cid, Nsid(1), slba, 1, SglDescriptor::transport(0));
    sqe.set_sgl(SglDescriptor::transport(0));
    q.command(&sqe, &[]);
    q.completion(cid).0.status
}

fn admin_with_aer(t: &std::sync::Arc<qpath_target::TargetState>) -> (Host, Cid) {
    let mut a = Host::new(t, 1);
    a.admin_up(Digests::default());
    let cid = a.cid();
    assert_eq!(a.admin(Sqe::set_features(cid, fid::ASYNC_EVENT, AEN_NS_ATTR)).0.status, Status::SUCCESS);
    let aer = a.cid();
    a.command(&Sqe::async_event_request(aer), &[]);
    assert!(a.recv().is_none(), "the AER is held");
    (a, aer)
}

#[test]
fn a_host_write_protects_a_namespace_and_lifts_it() {
    let t = target();
    let (mut a, aer) = admin_with_aer(&t);
    let mut q = Host::io_up(&t, 1, a.cntlid, 1, Digests::default());
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::CONTROLLER, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(IdentifyController::decode(&data).nwpc, nwpc::WRITE_PROTECT | nwpc::UNTIL_POWER_CYCLE);

    assert_eq!(get_wp(&mut a, Nsid(1)), (Status::SUCCESS, write_protect::NONE));
    assert_eq!(q.write(1, 0, &pattern(4096, 1), 8192).status, Status::SUCCESS);
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::PROTECT), Status::SUCCESS);
    assert_eq!(get_wp(&mut a, Nsid(1)), (Status::SUCCESS, write_protect::PROTECT));

    // Every writing command is refused; reads go on; the data is as it was.
    assert_eq!(q.write(1, 0, &pattern(4096, 2), 8192).status, Status::NS_WRITE_PROTECTED);
    assert_eq!(write_zeroes(&mut q, 0), Status::NS_WRITE_PROTECTED);
    let (c, back) = q.read(1, 0, 4096);
    assert_eq!((c.status, back), (Status::SUCCESS, pattern(4096, 1)));
    assert_eq!(nsattr(&mut a, 1) & 1, 1, "Identify Namespace NSATTR: write protected");

    // The host is told, and the Changed Namespace List names the namespace.
    a.tick();
    let (c, _) = a.completion(aer);
    assert_eq!(c.dw0, AsyncEvent::NS_CHANGED.to_dw0());
    let cid = a.cid();
    let (c, log) = a.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::CHANGED_NS, 0, false, 4096, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(decode_changed_ns_list(&log).expect("no overflow"), vec![Nsid(1)]);

    // The same state again changes nothing; No Write Protect lifts it.
    let aer = a.cid();
    a.command(&Sqe::async_event_request(aer), &[]);
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::PROTECT), Status::SUCCESS);
    a.tick();
    assert!(a.recv().is_none(), "no event without a change");
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::NONE), Status::SUCCESS);
    assert_eq!(q.write(1, 0, &pattern(4096, 3), 8192).status, Status::SUCCESS);
    assert_eq!(nsattr(&mut a, 1) & 1, 0);

    // Until Power Cycle cannot be lifted; Permanent is not offered; one namespace at a time.
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::UNTIL_POWER_CYCLE), Status::SUCCESS);
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::NONE), Status::INVALID_FIELD);
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::PROTECT), Status::INVALID_FIELD);
    assert_eq!(q.write(1, 0, &pattern(4096, 4), 8192).status, Status::NS_WRITE_PROTECTED);
    assert_eq!(set_wp(&mut a, Nsid(1), write_protect::PERMANENT), Status::INVALID_FIELD);
    assert_eq!(set_wp(&mut a, Nsid::BROADCAST, write_protect::PROTECT), Status::INVALID_NS);
    assert_eq!(set_wp(&mut a, Nsid(9), write_protect::PROTECT), Status::INVALID_FIELD, "an inactive NSID");
    assert_eq!(get_wp(&mut a, Nsid(9)).0, Status::INVALID_FIELD);
    assert_eq!(get_wp(&mut a, Nsid(5000)).0, Status::INVALID_NS, "an NSID past NN");
}

#[test]
fn a_configured_read_only_namespace_is_protected_until_power_cycle() {
    let t = target();
    t.subsystem(NQN)
        .unwrap()
        .add_namespace(NamespaceSpec {
            nsid: 2,
            backend: Backend::ram(1 << 20).unwrap(),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: true,
            ptpl_file: None,
        })
        .unwrap();
    let mut a = Host::new(&t, 1);
    a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, a.cntlid, 1, Digests::default());
    assert_eq!(get_wp(&mut a, Nsid(2)), (Status::SUCCESS, write_protect::UNTIL_POWER_CYCLE));
    assert_eq!(nsattr(&mut a, 2) & 1, 1);
    assert_eq!(set_wp(&mut a, Nsid(2), write_protect::NONE), Status::INVALID_FIELD, "no host lifts it");
    assert_eq!(q.write(2, 0, &pattern(512, 1), 8192).status, Status::NS_WRITE_PROTECTED);
}
