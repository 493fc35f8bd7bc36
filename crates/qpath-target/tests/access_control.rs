//! Per-subsystem allowed host NQNs: enforced at Connect on admin and I/O queues, reflected
//! in what each host's discovery log shows, and changed at run time through the RPC
//! (`add_host`, `remove_host`, `set_allow_any_host`): a host added can connect and see the
//! subsystem at once; a host removed loses its live controller and queues, cannot
//! reconnect, and no longer sees the subsystem; other hosts are not disturbed.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::sync::Arc;

use nvme::fabrics::{PropertyCmd, prop};
use nvme::log::lid;
use nvme::log::{DiscoveryLog, subtype};
use nvme::tcp::Digests;
use nvme::{Cntlid, Nsid, Sqe, Status};
use qpath_target::TargetState;
use qpath_target::reactor::{PollMode, ReactorOptions};
use qpath_target::rpc;
use qpath_target::server::Server;
use serde_json::json;
use support::*;

const NQN2: &str = "nqn.2024-01.io.qpath:second";
const B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000b";

/// Ports 1 and 2; NQN allows HOSTNQN only, NQN2 allows B only; a server for the RPC.
fn lab() -> (Arc<TargetState>, Server) {
    let t = target();
    let server =
        Server::start(Arc::clone(&t), ReactorOptions { reactors: 1, cpus: vec![], poll: PollMode::Block, spin_us: 0 })
            .unwrap();
    let sub2 = json!({"nqn": NQN2, "allow_any_host": false, "hosts": [B],
                      "namespace": [{"backend": "ram", "size": "1M"}]});
    rpc::call(&server, "add_subsystem", &sub2).unwrap();
    (t, server)
}

/// An admin queue of `hostnqn` on `subnqn`, enabled, or the Connect status that refused it.
fn admin(t: &Arc<TargetState>, subnqn: &str, hostnqn: &str) -> Result<Host, Status> {
    let mut h = Host::new(t, 1);
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, subnqn, hostnqn, 31);
    if c.status != Status::SUCCESS {
        assert!(!h.closed(), "a refused Connect leaves the queue to the host");
        return Err(c.status);
    }
    h.cntlid = Cntlid(c.dw0 as u16);
    let cid = h.cid();
    h.command(&PropertyCmd::set_sqe(cid, prop::CC, false, 0x46_0001), &[]);
    assert_eq!(h.completion(cid).0.status, Status::SUCCESS);
    Ok(h)
}

fn io_queue(t: &Arc<TargetState>, cntlid: Cntlid, subnqn: &str, hostnqn: &str) -> Result<Host, Status> {
    let mut h = Host::new(t, 1);
    h.icreq(Digests::default());
    let c = h.connect(1, cntlid, subnqn, hostnqn, 31);
    if c.status != Status::SUCCESS {
        return Err(c.status);
    }
    Ok(h)
}

/// The NVM subsystems `hostnqn`'s discovery log lists (one entry per port).
fn discovered(t: &Arc<TargetState>, hostnqn: &str) -> Vec<String> {
    let mut h = admin(t, nvme::nqn::DISCOVERY_NQN, hostnqn).expect("any host may discover");
    let cid = h.cid();
    let (c, page) = h.admin(Sqe::get_log_page(cid, Nsid(0), lid::DISCOVERY, 0, false, 1024 * 8, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let log = DiscoveryLog::decode(&page).unwrap();
    let mut nqns: Vec<String> = log
        .entries
        .iter()
        .filter(|e| e.subtype == subtype::NVM)
        .map(|e| format!("{}@{}", e.subnqn, e.portid))
        .collect();
    nqns.sort();
    nqns
}

fn call(server: &Server, method: &str, p: serde_json::Value) -> serde_json::Value {
    rpc::call(server, method, &p).unwrap()
}

#[test]
fn connect_and_discovery_follow_the_allowed_hosts() {
    let (t, _server) = lab();
    // Each host reaches only its own subsystem, on admin and I/O queues.
    let mut a = admin(&t, NQN, HOSTNQN).unwrap();
    let b = admin(&t, NQN2, B).unwrap();
    assert_eq!(admin(&t, NQN2, HOSTNQN).err(), Some(Status::CONNECT_INVALID_HOST));
    assert_eq!(admin(&t, NQN, B).err(), Some(Status::CONNECT_INVALID_HOST));
    // An I/O queue under someone else's controller is refused, whatever NQN it names.
    assert!(io_queue(&t, a.cntlid, NQN, B).is_err(), "B on A's controller");
    assert_eq!(io_queue(&t, b.cntlid, NQN2, HOSTNQN).err(), Some(Status::CONNECT_INVALID_HOST), "A on B's controller");
    let mut q = io_queue(&t, a.cntlid, NQN, HOSTNQN).unwrap();
    assert_eq!(q.write(1, 0, &pattern(4096, 1), 8192).status, Status::SUCCESS);
    // Discovery: each host sees what it may reach, a stranger nothing.
    assert_eq!(discovered(&t, HOSTNQN), [format!("{NQN}@1"), format!("{NQN}@2")]);
    assert_eq!(discovered(&t, B), [format!("{NQN2}@1"), format!("{NQN2}@2")]);
    assert!(discovered(&t, "nqn.2014-08.org.example:stranger").is_empty());
    a.tick();
    assert!(!a.closed());
}

#[test]
fn hosts_changed_at_run_time_by_rpc() {
    let (t, server) = lab();
    let mut a = admin(&t, NQN, HOSTNQN).unwrap();
    let mut aq = io_queue(&t, a.cntlid, NQN, HOSTNQN).unwrap();
    assert_eq!(aq.write(1, 0, &pattern(4096, 2), 8192).status, Status::SUCCESS);

    // Added: B connects (admin and I/O) and discovers NQN too.
    assert_eq!(admin(&t, NQN, B).err(), Some(Status::CONNECT_INVALID_HOST));
    call(&server, "add_host", json!({"nqn": NQN, "host": B}));
    let mut b = admin(&t, NQN, B).unwrap();
    let mut bq = io_queue(&t, b.cntlid, NQN, B).unwrap();
    let (c, data) = bq.read(1, 0, 4096);
    assert_eq!((c.status, data), (Status::SUCCESS, pattern(4096, 2)));
    assert_eq!(discovered(&t, B), [format!("{NQN2}@1"), format!("{NQN2}@2"), format!("{NQN}@1"), format!("{NQN}@2")]);

    // Removed: B's live controller fails, its queues close, a reconnect is refused, and
    // its discovery log no longer lists NQN. A is not disturbed.
    let r = call(&server, "remove_host", json!({"nqn": NQN, "host": B}));
    assert_eq!(r["controllers_failed"], 1);
    b.tick();
    bq.tick();
    assert!(b.closed() && bq.closed(), "the removed host's queues are closed");
    assert_eq!(admin(&t, NQN, B).err(), Some(Status::CONNECT_INVALID_HOST));
    assert!(io_queue(&t, b.cntlid, NQN, B).is_err(), "no I/O queue under the failed controller");
    assert_eq!(discovered(&t, B), [format!("{NQN2}@1"), format!("{NQN2}@2")]);
    a.tick();
    aq.tick();
    assert!(!a.closed() && !aq.closed());
    let (c, data) = aq.read(1, 0, 4096);
    assert_eq!((c.status, data), (Status::SUCCESS, pattern(4096, 2)));

    // allow_any_host: on, anyone connects and sees it; off again, those not listed fail.
    let r = call(&server, "set_allow_any_host", json!({"nqn": NQN, "allow": true}));
    assert_eq!(r["controllers_failed"], 0);
    let mut c1 = admin(&t, NQN, B).unwrap();
    assert!(discovered(&t, "nqn.2014-08.org.example:stranger").contains(&format!("{NQN}@1")));
    let r = call(&server, "set_allow_any_host", json!({"nqn": NQN, "allow": false}));
    assert_eq!(r["controllers_failed"], 1, "B's controller, not A's");
    c1.tick();
    assert!(c1.closed());
    a.tick();
    assert!(!a.closed());
    assert!(discovered(&t, "nqn.2014-08.org.example:stranger").is_empty());
}
