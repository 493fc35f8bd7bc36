//! A host brings up an admin queue, enables the controller and reads the
//! structures Linux reads at connect time; a discovery controller lists
//! every (subsystem, port) pair.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::fabrics::prop;
use nvme::features::{NumQueues, fid};
use nvme::identify::{IdentifyController, IdentifyNamespace, NsIdDesc, cns, decode_ns_descs, decode_ns_list};
use nvme::log::{AnaLog, DiscoveryLog, lid, subtype};
use nvme::tcp::Digests;
use nvme::{AnaState, Cntlid, Nsid, Sqe, Status};
use support::*;

#[test]
fn admin_queue_identify_and_logs() {
    let t = target();
    let mut h = Host::new(&t, 1);
    let cntlid = h.admin_up(Digests::default());
    assert!(cntlid.0 >= 1);
    let cap = nvme::fabrics::Cap::from_u64(h.prop_get(prop::CAP, true));
    assert_eq!(cap.mqes, 1023);
    assert!(cap.css_nvm);
    assert_eq!(h.prop_get(prop::VS, false), 0x0002_0000);

    let cid = h.cid();
    let (c, data) = h.admin(Sqe::identify(cid, cns::CONTROLLER, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let id = IdentifyController::decode(&data);
    assert_eq!(id.subnqn, NQN);
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(id.sn, "QPTEST0001");
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.cmic & 0x0b, 0x0b);
    assert!(id.maxcmd > 0);

    let cid = h.cid();
    let (c, data) = h.admin(Sqe::identify(cid, cns::ACTIVE_NS_LIST, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(decode_ns_list(&data), vec![Nsid(1)]);

    let cid = h.cid();
    let (_, data) = h.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(1), 0, 0));
    let ns = IdentifyNamespace::decode(&data);
    assert_eq!(ns.nsze, 2048);
    assert_eq!(ns.block_size(), 512);
    assert_eq!(ns.anagrpid.0, 1);

    let cid = h.cid();
    let (_, data) = h.admin(Sqe::identify(cid, cns::NS_DESC_LIST, Nsid(1), 0, 0));
    let d = decode_ns_descs(&data);
    assert!(d.iter().any(|x| matches!(x, NsIdDesc::Nguid(g) if *g == ns.nguid)));

    // An inactive NSID reads as zeros; the broadcast NSID is invalid.
    let cid = h.cid();
    let (c, data) = h.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(9), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert!(data.iter().all(|&b| b == 0));
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid::BROADCAST, 0, 0)).0.status, Status::INVALID_NS);

    let cid = h.cid();
    let (c, _) = h.admin(Sqe::set_features(cid, fid::NUM_QUEUES, NumQueues { nsq: 4, ncq: 4 }.to_dw()));
    assert_eq!(NumQueues::from_dw(c.dw0), NumQueues { nsq: 4, ncq: 4 });

    let cid = h.cid();
    let (c, data) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, false, 4096, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let ana = AnaLog::decode(&data).unwrap();
    assert_eq!(ana.groups.len(), 1);
    assert_eq!(ana.groups[0].state, AnaState::Optimized);
    assert_eq!(ana.groups[0].nsids, vec![Nsid(1)]);

    let cid = h.cid();
    assert_eq!(h.admin(Sqe::get_log_page(cid, Nsid(0), 0x42, 0, false, 512, 0)).0.status, Status::INVALID_LOG_PAGE);
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::keep_alive(cid)).0.status, Status::SUCCESS);
}

#[test]
fn discovery_lists_both_ports() {
    let t = target();
    let mut h = Host::new(&t, 2);
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, HOSTNQN, 31);
    assert_eq!(c.status, Status::SUCCESS);
    let cid = h.cid();
    h.command(&nvme::fabrics::PropertyCmd::set_sqe(cid, prop::CC, false, 0x46_0001), &[]);
    assert_eq!(h.completion(cid).0.status, Status::SUCCESS);
    let cid = h.cid();
    let (c, data) = h.admin(Sqe::identify(cid, cns::CONTROLLER, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(IdentifyController::decode(&data).cntrltype, 2);
    // nvme-cli reads the header first, then the whole page.
    let cid = h.cid();
    let (_, hdr) = h.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, 1024, 0));
    let n = DiscoveryLog::numrec(&hdr);
    assert_eq!(n, 3, "two NVM entries and the current discovery subsystem");
    let cid = h.cid();
    let len = 1024 * (1 + n as u32);
    let (_, page) = h.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, len, 0));
    let log = DiscoveryLog::decode(&page).unwrap();
    let nvm: Vec<_> = log.entries.iter().filter(|e| e.subtype == subtype::NVM).collect();
    assert_eq!(nvm.len(), 2);
    assert!(nvm.iter().all(|e| e.subnqn == NQN && e.traddr == "127.0.0.1"));
    let ports: Vec<_> = nvm.iter().map(|e| e.trsvcid.as_str()).collect();
    assert_eq!(ports, ["4420", "4421"]);
    // Discovery controllers do not serve NVM admin commands.
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::identify(cid, cns::ACTIVE_NS_LIST, Nsid(0), 0, 0)).0.status, Status::INVALID_FIELD);

    // A host that may not reach the subsystem sees only the discovery entry.
    let mut other = Host::new(&t, 1);
    other.icreq(Digests::default());
    assert_eq!(
        other.connect(0, Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, "nqn.2014-08.org.example:stranger", 31).status,
        Status::SUCCESS
    );
    let cid = other.cid();
    other.command(&nvme::fabrics::PropertyCmd::set_sqe(cid, prop::CC, false, 0x46_0001), &[]);
    other.completion(cid);
    let cid = other.cid();
    let (_, hdr) = other.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, 1024, 0));
    assert_eq!(DiscoveryLog::numrec(&hdr), 1);
}
