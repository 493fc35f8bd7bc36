//! An idle target sleeps: a reactor with no connection waits for its mailbox (a new
//! connection, a shutdown) instead of ticking 100 times a second, and one whose
//! connections carry no I/O ticks ten times a second. Counted as the reactor threads'
//! context switches (`/proc/self/task/*/status`), which is what an operator's `top` or
//! `powertop` sees.

mod loopback;

use std::time::Duration;

use host::controller::{ConnectOptions, Controller, CtrlState};

/// Context switches of every thread of this process named `qpath-reactor-*`, summed.
fn reactor_switches() -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = t.expect("a task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("qpath-reactor") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

fn switches_over(d: Duration) -> u64 {
    let before = reactor_switches();
    std::thread::sleep(d);
    reactor_switches() - before
}

#[test]
fn idle_reactors_sleep() {
    let (_server, addrs) = loopback::target(2, "16M");
    std::thread::sleep(Duration::from_millis(300));
    // Two reactors, no connection: a 10 ms tick would be ~200 switches a second.
    let empty = switches_over(Duration::from_secs(1));
    assert!(empty <= 10, "two reactors with no connection switched {empty} times in 1 s");

    // A controller with one I/O queue, idle (keep-alive every 5 s): after a second
    // without I/O the reactors tick every 100 ms (~10 a second each), not every 10 ms.
    let mut o = ConnectOptions::new(addrs[0], target::config::DEFAULT_NQN);
    o.nr_io_queues = 1;
    o.kato_ms = 10_000;
    let ctrl = Controller::connect(o).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let idle = switches_over(Duration::from_secs(2));
    assert!(idle <= 80, "reactors with an idle controller switched {idle} times in 2 s");
    assert_eq!(ctrl.state(), CtrlState::Live);
    ctrl.delete();
}
