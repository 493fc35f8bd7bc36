//! A controller's admin thread sleeps between turns: it wakes for its keep-alives, the
//! admin queue's answers and events, and the requests of other threads (which ring it),
//! not every 20 ms as it did. An idle host with many controllers costs nothing, and a
//! request is served at once instead of at the next turn. The keep-alives still go out
//! in time: the target does not fail an idle controller.

mod loopback;

use std::time::Duration;

use host::controller::{ConnectOptions, Controller, CtrlState};
use host::queue::{DataDir, Io};
use nvme::log::lid;
use nvme::{Cid, Nsid, Sqe};
use uring::IoBuf;

#[test]
fn an_idle_controller_wakes_for_keep_alives_and_requests_only() {
    let (_server, addrs) = loopback::target(1, "16M");
    let mut o = ConnectOptions::new(addrs[0], target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    // A keep-alive every 600 ms: the target fails the controller if one is late.
    o.kato_ms = 1200;
    let ctrl = Controller::connect(o).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let before = ctrl.info().admin_wakeups;
    std::thread::sleep(Duration::from_secs(3));
    let woke = ctrl.info().admin_wakeups - before;
    // About two per keep-alive (sending it, its answer): ~10 in 3 s. A thread that woke
    // every 20 ms would have woken well over 100 times.
    assert!(woke <= 20, "the admin thread woke {woke} times in 3 s of idleness");
    assert!(woke >= 3, "no keep-alive went out in 3 s ({woke} wake-ups)");
    let info = ctrl.info();
    assert_eq!(info.state, CtrlState::Live, "an idle controller stays live: {:?}", info.last_error);
    assert_eq!(info.reconnects, 0, "the target did not fail the idle controller");

    // A request from another thread rings the bell and is served.
    let sqe = Sqe::get_log_page(Cid(0), Nsid::BROADCAST, lid::SMART, 0, false, 512, 0);
    let io = Io { sqe, buf: Some(IoBuf::new(4096)), len: 512, dir: DataDir::FromController, token: 0 };
    let d = ctrl.admin_command(io).expect("Get Log Page completes");
    assert!(d.cqe.status.is_success(), "{}", d.cqe.status);
    assert!(ctrl.info().admin_wakeups > before + woke, "the request woke the thread");
    ctrl.delete();
    assert_eq!(ctrl.state(), CtrlState::Dead);
}
