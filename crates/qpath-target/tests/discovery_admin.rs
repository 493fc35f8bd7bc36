//! The discovery service as an operator changes it: referrals in the log, the EFLAGS of
//! the current discovery entry, a persistent discovery controller (Keep Alive, discovery
//! log change events) told about referral and port changes, and a removed port whose
//! connections close.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small (the shared support module)

mod support;

use std::sync::Arc;

use nvme::fabrics::prop;
use nvme::features::{AsyncEvent, fid};
use nvme::log::{DiscoveryLog, eflags, lid, subtype};
use nvme::tcp::Digests;
use nvme::{Cid, Cntlid, Nsid, Sqe, Status};
use qpath_target::port::PortKind;
use qpath_target::registry::{Referral, TargetState};
use support::*;

/// A persistent discovery controller on `port`: KATO 5 s, discovery log change events on,
/// one AER outstanding.
fn discovery_controller(t: &Arc<TargetState>, port: u16) -> (Host, Cid) {
    let mut h = Host::new(t, port);
    h.icreq(Digests::default());
    assert_eq!(h.connect(0, Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, HOSTNQN, 31).status, Status::SUCCESS);
    let cid = h.cid();
    h.command(&nvme::fabrics::PropertyCmd::set_sqe(cid, prop::CC, false, 0x46_0001), &[]);
    assert_eq!(h.completion(cid).0.status, Status::SUCCESS);
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::set_features(cid, fid::ASYNC_EVENT, 1 << 31)).0.status, Status::SUCCESS);
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::set_features(cid, fid::KATO, 5000)).0.dw0, 5000, "KATO accepted");
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::keep_alive(cid)).0.status, Status::SUCCESS);
    let aer = h.cid();
    h.command(&Sqe::async_event_request(aer), &[]);
    assert!(h.recv().is_none(), "the AER is held");
    (h, aer)
}

fn log(h: &mut Host) -> DiscoveryLog {
    let cid = h.cid();
    let (_, hdr) = h.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, 1024, 0));
    let n = u32::try_from(DiscoveryLog::numrec(&hdr)).unwrap();
    let cid = h.cid();
    let (c, page) = h.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, 1024 * (n + 1), 0));
    assert_eq!(c.status, Status::SUCCESS);
    DiscoveryLog::decode(&page).unwrap()
}

/// The AER completes with a discovery log change; reading the log re-arms it.
fn expect_change(h: &mut Host, aer: Cid) -> DiscoveryLog {
    h.tick();
    assert_eq!(h.completion(aer).0.dw0, AsyncEvent::DISCOVERY_CHANGE.to_dw0());
    log(h)
}

#[test]
fn referrals_are_listed_and_announced() {
    let t = target();
    let (mut d, aer) = discovery_controller(&t, 1);
    let before = log(&mut d);
    let current: Vec<_> = before.entries.iter().filter(|e| e.subtype == subtype::CURRENT_DISCOVERY).collect();
    assert_eq!(current.len(), 1);
    assert_eq!(current[0].eflags, eflags::DUPRETINFO | eflags::EPCSD, "persistent discovery announced");
    assert!(before.entries.iter().filter(|e| e.subtype == subtype::NVM).all(|e| e.eflags == 0));

    let r = Referral::new("10.9.8.7".parse().unwrap(), 8009, None).unwrap();
    t.add_referral(r.clone()).unwrap();
    let after = expect_change(&mut d, aer);
    assert!(after.genctr > before.genctr, "the generation moves");
    let refs: Vec<_> = after.entries.iter().filter(|e| e.subtype == subtype::REFERRAL).collect();
    assert_eq!(refs.len(), 1);
    let e = refs[0];
    assert_eq!(
        (e.traddr.as_str(), e.trsvcid.as_str(), e.subnqn.as_str()),
        ("10.9.8.7", "8009", nvme::nqn::DISCOVERY_NQN)
    );
    assert_eq!((e.adrfam, e.trtype, e.cntlid, e.eflags), (1, 3, Cntlid::DYNAMIC, 0));

    // An IPv6 referral to an NVM subsystem elsewhere is listed as that subsystem.
    let aer = d.cid();
    d.command(&Sqe::async_event_request(aer), &[]);
    let nvm = Referral::new("fd00::5".parse().unwrap(), 4420, Some("nqn.2026-11.io.example:remote")).unwrap();
    t.add_referral(nvm.clone()).unwrap();
    let log2 = expect_change(&mut d, aer);
    let e = log2.entries.iter().find(|e| e.traddr == "fd00::5").expect("the IPv6 referral");
    assert_eq!((e.subtype, e.adrfam, e.subnqn.as_str()), (subtype::NVM, 2, "nqn.2026-11.io.example:remote"));

    assert_eq!(t.add_referral(r.clone()).unwrap_err().kind, qpath_target::ErrorKind::Exists);
    let aer = d.cid();
    d.command(&Sqe::async_event_request(aer), &[]);
    t.remove_referral(&r).unwrap();
    let log3 = expect_change(&mut d, aer);
    assert!(log3.entries.iter().all(|e| e.traddr != "10.9.8.7"));
    assert_eq!(t.remove_referral(&r).unwrap_err().kind, qpath_target::ErrorKind::NotFound);
    assert!(Referral::new("10.0.0.1".parse().unwrap(), 8009, Some("not an nqn")).is_err());
}

#[test]
fn a_removed_port_closes_its_connections_and_tells_the_other_ports() {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    let (mut d1, _) = discovery_controller(&t, 1);
    let (mut d2, aer2) = discovery_controller(&t, 2);
    assert_eq!(q.read(1, 0, 512).0.status, Status::SUCCESS);

    let removed = t.remove_port(1).unwrap();
    assert!(removed.is_removed());
    for h in [&mut a, &mut q, &mut d1] {
        h.tick();
        assert!(h.closed(), "every connection on the removed port closes");
        h.release();
    }
    assert!(t.subsystem(NQN).unwrap().controller(cntlid).is_none(), "its controller is gone");

    // The discovery controller on port 2 hears of it; the log lists only port 2 now.
    let l = expect_change(&mut d2, aer2);
    let nvm: Vec<_> = l.entries.iter().filter(|e| e.subtype == subtype::NVM).map(|e| e.portid).collect();
    assert_eq!(nvm, vec![2]);

    assert_eq!(t.remove_port(1).unwrap_err().to_string(), "no port 1", "removing twice");
    t.add_port(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io).expect("the id may be added again");
    let mut again = Host::new(&t, 1);
    again.admin_up(Digests::default());
}
