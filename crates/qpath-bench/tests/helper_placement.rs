//! Threads that are not on the I/O path keep off the CPU a polling reactor owns: with
//! the embedded target's reactor on CPU 0 (adaptive polling) and a job thread pinned to
//! CPU 1, the target's acceptors and a host controller's admin thread may not run on
//! CPU 0, and run on CPU 1 (the job's) only when no other CPU is left.

use std::time::{Duration, Instant};

use host::controller::{ConnectOptions, Controller};
use qpath_bench::embedded_target::{self as embedded, Embedded, EmbeddedOptions};
use target::reactor::PollMode;

/// `(thread name, CPUs it may run on)` of every thread of this process.
fn threads() -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim().to_string();
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let Some(list) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) else { continue };
        out.push((comm, parse_list(list.trim())));
    }
    out
}

/// "0-2,5" -> [0, 1, 2, 5].
fn parse_list(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}

/// The threads whose name starts with `prefix` and that may run on `cpu`.
fn on_cpu(prefix: &str, cpu: usize) -> Vec<(String, Vec<usize>)> {
    threads().into_iter().filter(|(n, cpus)| n.starts_with(prefix) && cpus.contains(&cpu)).collect()
}

#[test]
fn helper_threads_keep_off_the_reactors_cpu_and_share_the_jobs_only_when_none_is_left() {
    let mine = uring::current_affinity().unwrap();
    if !(mine.contains(&0) && mine.contains(&1)) {
        println!("SKIP: needs CPUs 0 and 1, this process has {mine:?}");
        return;
    }
    let others_left = mine.iter().any(|&c| c > 1);
    let target = Embedded::start(EmbeddedOptions {
        poll: PollMode::Adaptive,
        reactor_cpu: Some(0),
        namespaces: vec![(1, embedded::NAMESPACE_BYTES_MIN)],
        tcp_congestion: target::registry::TcpCongestion::System,
    })
    .unwrap();
    let addr = target.addrs()[0];
    // A job thread as `qpath bench` pins it (CPU 1); it connects, so without placement
    // the admin thread would inherit its CPU, and the acceptors have the process's. It
    // lives (its CPU claimed) until the checks are done.
    let pin = qpath_bench::cmd::pin_hook();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let job = std::thread::spawn(move || {
        pin(&[1]).unwrap();
        let ctrl = Controller::connect(ConnectOptions::new(addr, target::config::DEFAULT_NQN)).unwrap();
        ready_tx.send(uring::current_affinity().unwrap()).unwrap();
        let _ = done_rx.recv();
        ctrl
    });
    assert_eq!(ready_rx.recv().unwrap(), vec![1], "the job thread is pinned to CPU 1");
    // And one from this unpinned thread: its admin thread would inherit every CPU.
    let other = Controller::connect(ConnectOptions::new(addr, target::config::DEFAULT_NQN)).unwrap();

    // Helpers place themselves on their next turn: the admin thread within 20 ms, the
    // acceptors after the connection they accepted. With a CPU other than 0 and 1 left,
    // they keep off the job's CPU too; on two CPUs they share it.
    // Servers started after the reactor, as `qpath target` starts them: they place
    // themselves before their first connection.
    let render: std::sync::Arc<target::metrics::Render> = std::sync::Arc::new(String::new);
    let metrics = target::metrics::MetricsServer::start("127.0.0.1:0".parse().unwrap(), render).unwrap();
    let owned: &[usize] = if others_left { &[0, 1] } else { &[0] };
    let offending = || -> Vec<(String, Vec<usize>)> {
        let mut v = Vec::new();
        for &cpu in owned {
            v.extend(on_cpu("qpath-accept", cpu));
            v.extend(on_cpu("qpath-admin", cpu));
            v.extend(on_cpu("qpath-metrics", cpu));
        }
        v
    };
    // A new thread takes its name a moment after it starts: wait for the names too.
    let named = || {
        let all = threads();
        let has = |p: &str| all.iter().filter(|(n, _)| n.starts_with(p)).count();
        has("qpath-admin") == 2 && has("qpath-accept") > 0 && has("qpath-metrics") == 1
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut bad = offending();
    while !(bad.is_empty() && named()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        bad = offending();
    }
    let all = threads();
    let admins = all.iter().filter(|(n, _)| n.starts_with("qpath-admin")).count();
    assert_eq!(admins, 2, "both controllers' admin threads run: {all:?}");
    assert!(all.iter().any(|(n, _)| n.starts_with("qpath-accept")), "acceptors run: {all:?}");
    assert!(all.iter().any(|(n, _)| n.starts_with("qpath-metrics")), "the metrics server runs: {all:?}");
    assert!(bad.is_empty(), "helper threads allowed on CPUs {owned:?} that spinning threads own: {bad:?}");
    let reactor: Vec<_> = all.iter().filter(|(n, _)| n.starts_with("qpath-reactor")).collect();
    assert!(
        !reactor.is_empty() && reactor.iter().all(|(_, c)| c == &vec![0]),
        "the reactor stays on CPU 0: {reactor:?}"
    );

    done_tx.send(()).unwrap();
    let ctrl = job.join().unwrap();
    drop(metrics);
    ctrl.delete();
    other.delete();
    target.shutdown();
}
