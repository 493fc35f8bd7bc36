//! Target statistics: per-queue counters and latency percentiles over RPC,
//! and Prometheus counters over HTTP that match the host's own I/O count.

mod loopback;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use target::metrics::MetricsServer;
use uring::{IoBuf, Wait};

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200 OK"), "{out}");
    out
}

fn sum_metric(text: &str, name: &str, filter: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn metrics_and_stats_count_every_io() {
    let (server, _ports) = loopback::target(2, "16M");
    let st = Arc::clone(&server.state);
    let metrics =
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::new(move || target::metrics::render(&st))).unwrap();
    let addr = server.state.port(1).unwrap().addr;
    let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
    o.nr_io_queues = 2;
    let ctrl = Controller::connect(o).unwrap();
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    let (reads, writes) = (300u64, 200u64);
    let mut done = 0;
    for i in 0..reads + writes {
        let (op, mut b) = if i < writes { (Op::Write, IoBuf::new(4096)) } else { (Op::Read, IoBuf::new(4096)) };
        b.set_len(4096);
        ctx.submit(dev, op, (i % 1024) * 4096, 4096, Some(b), i).map_err(|(e, _)| e).unwrap();
        if i % 16 == 15 {
            let t = Instant::now();
            while done <= i - 8 && t.elapsed() < Duration::from_secs(10) {
                ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
                for c in ctx.completions() {
                    assert!(c.status.is_success());
                    done += 1;
                }
            }
        }
    }
    let t = Instant::now();
    while done < reads + writes && t.elapsed() < Duration::from_secs(10) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        done += ctx.completions().count() as u64;
    }
    assert_eq!(done, reads + writes);
    // Histograms are published on the reactors' 10 ms tick.
    std::thread::sleep(Duration::from_millis(50));
    let text = scrape(metrics.addr());
    assert_eq!(sum_metric(&text, "qpath_target_queue_ios_total", "dir=\"read\""), reads);
    assert_eq!(sum_metric(&text, "qpath_target_queue_ios_total", "dir=\"write\""), writes);
    assert_eq!(sum_metric(&text, "qpath_target_namespace_ios_total", "dir=\"read\""), reads);
    assert!(text.contains("qpath_target_queue_latency_seconds{"), "latency quantiles exported");
    // Summaries carry `_count` (the I/Os the quantiles cover) and the exact `_sum` of their
    // service times (seconds).
    assert_eq!(sum_metric(&text, "qpath_target_queue_latency_seconds_count", "dir=\"read\""), reads);
    let read_secs: f64 = text
        .lines()
        .filter(|l| l.starts_with("qpath_target_queue_latency_seconds_sum") && l.contains("dir=\"read\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(read_secs > 0.0 && read_secs < 10.0 * reads as f64, "{read_secs}");
    let js = target::metrics::stats_json(&server.state);
    let q_reads: u64 = js["queues"].as_array().unwrap().iter().map(|q| q["reads"].as_u64().unwrap()).sum();
    assert_eq!(q_reads, reads);
    let io_q = js["queues"].as_array().unwrap().iter().find(|q| q["reads"].as_u64().unwrap() > 0).unwrap();
    assert!(io_q["latency"]["read"]["p99_us"].as_f64().unwrap() > 0.0);
    // Each reactor's data buffers, published on the same tick: one line per reactor,
    // buffers were allocated (for the writes' in-capsule data), and the idle ones stay
    // under the pool's cap.
    assert_eq!(text.matches("qpath_target_reactor_buffer_allocations_total{").count(), 2, "{text}");
    assert_eq!(text.matches("qpath_target_reactor_buffer_bytes{").count(), 4, "outstanding and cached per reactor");
    assert!(sum_metric(&text, "qpath_target_reactor_buffer_allocations_total", "") > 0);
    let cap = target::registry::TargetOptions::default().buffer_pool_bytes as u64;
    for r in js["reactors"].as_array().unwrap() {
        assert!(r["buffer_cached_bytes"].as_u64().unwrap() <= cap, "{r}");
    }
    // The host side counts the same I/Os per queue.
    let host_ios: u64 = ctx.queue_stats().map(|(_, _, s)| s.ios()).sum();
    assert_eq!(host_ios, reads + writes);
    drop(ctx);
    ctrl.delete();
    drop(metrics);
    server.shutdown();
}

/// Checks `text` with the Prometheus project's own exposition-format parser (the Python
/// `prometheus_client`, installed by `scripts/install-deps.sh`): every family parses, and
/// every summary has `_sum` and `_count` beside its quantiles. Returns the samples as
/// "name{labels}" -> value, or `None` (with a printed SKIP) when the parser is not installed.
fn parse_with_prometheus(text: &str) -> Option<std::collections::BTreeMap<String, f64>> {
    let script = r#"
import sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("SKIP")
    sys.exit(0)
for fam in text_string_to_metric_families(sys.stdin.read()):
    names = {s.name for s in fam.samples}
    if fam.type == "summary" and fam.samples:
        assert fam.name + "_sum" in names and fam.name + "_count" in names, "summary %s lacks _sum/_count" % fam.name
    if fam.type == "counter":
        assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
    for s in fam.samples:
        labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()))
        print("%s{%s} %r" % (s.name, labels, s.value))
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Prometheus parser refused the exposition: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if stdout.trim() == "SKIP" {
        println!("SKIP: python3's prometheus_client is not installed (scripts/install-deps.sh installs it)");
        return None;
    }
    Some(
        stdout
            .lines()
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

/// Both sides' /metrics parse with Prometheus's own parser, every summary has `_sum` and
/// `_count`, and no `_total` goes down or disappears when a host disconnects (they were
/// summed from live queues, so their samples vanished with the queues and `rate()` broke).
#[test]
fn metrics_parse_as_prometheus_and_totals_survive_a_disconnect() {
    let (server, _ports) = loopback::target(2, "16M");
    let addr = server.state.port(1).unwrap().addr;
    let hub = host::stats::HostStats::new();
    let ctrl = Controller::connect(ConnectOptions::new(addr, target::config::DEFAULT_NQN)).unwrap();
    let mut ctx = Context::new(ContextOptions { stats: Some(Arc::clone(&hub)), ..ContextOptions::default() }).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    for i in 0..64u64 {
        let mut b = IoBuf::new(4096);
        b.set_len(4096);
        let op = if i % 2 == 0 { Op::Write } else { Op::Read };
        ctx.submit(dev, op, (i % 32) * 4096, 4096, Some(b), i).map_err(|(e, _)| e).unwrap();
        let t = Instant::now();
        while ctx.completions().count() == 0 && t.elapsed() < Duration::from_secs(10) {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        }
    }
    ctx.publish_stats();
    std::thread::sleep(Duration::from_millis(50)); // the reactors publish on their tick
    let before_target = target::metrics::render(&server.state);
    let before_host = host::metrics::render(&hub);
    drop(ctx);
    ctrl.delete();
    std::thread::sleep(Duration::from_millis(100));
    let after_target = target::metrics::render(&server.state);
    for (side, before, after) in [("target", &before_target, &after_target), ("host", &before_host, &before_host)] {
        let (Some(b), Some(a)) = (parse_with_prometheus(before), parse_with_prometheus(after)) else { return };
        assert!(b.keys().any(|k| k.contains("_total{")), "{side}: counters present");
        for (k, v) in b.iter().filter(|(k, _)| k.contains("_total{") && !k.contains("_queue_")) {
            let now = a.get(k).unwrap_or_else(|| panic!("{side}: {k} disappeared after the disconnect"));
            assert!(now >= v, "{side}: {k} went down from {v} to {now}");
        }
    }
    assert!(before_host.contains("qpath_host_queue_latency_seconds_sum{"), "host summaries have _sum");
    server.shutdown();
}
