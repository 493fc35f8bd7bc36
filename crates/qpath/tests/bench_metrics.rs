//! Issue 6, acceptance 4: `qpath bench --metrics --rpc-socket` serves the host's
//! per-queue counters (and the embedded target's) while the jobs run; a scraper
//! sees them grow monotonically and never past the job's I/O count, and at the end
//! finds exactly the I/O count the bench itself reports, on the host's queues,
//! paths and namespaces and on the target's queues. `qpath stats` reads the same
//! socket. Correctness only: nothing here measures speed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// 4 KiB blocks per job thread (64 MiB): long enough that a scrape lands mid-run.
const BLOCKS_PER_THREAD: u64 = 16 * 1024;
const THREADS_PER_PHASE: u64 = 2;
/// Bounds every wait of the test (debug build on a shared 2-core machine).
const TIMEOUT: Duration = Duration::from_secs(240);

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200 OK"), "{out}");
    out
}

/// Sum of the samples of `name` whose labels contain every one of `filters`.
fn sum(text: &str, name: &str, filters: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap_or_else(|_| panic!("bad sample: {l}")))
        .map(|v| {
            assert!(v >= 0.0 && v.fract() == 0.0, "counter {name} = {v}");
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = v as u64;
            v
        })
        .sum()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Counts {
    host_reads: u64,
    host_writes: u64,
    target_reads: u64,
    target_writes: u64,
}

fn counts(text: &str) -> Counts {
    Counts {
        host_reads: sum(text, "qpath_host_queue_ios_total", &["dir=\"read\""]),
        host_writes: sum(text, "qpath_host_queue_ios_total", &["dir=\"write\""]),
        target_reads: sum(text, "qpath_target_queue_ios_total", &["dir=\"read\""]),
        target_writes: sum(text, "qpath_target_queue_ios_total", &["dir=\"write\""]),
    }
}

#[test]
fn metrics_follow_a_bench_run_and_end_at_its_io_count() {
    let dir = std::env::temp_dir().join(format!("qpath-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let job = dir.join("job.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nbs=4k\niodepth=4\nsize={}\nnumjobs={THREADS_PER_PHASE}\n\
             [writers]\nrw=randwrite\n[readers]\nstonewall\nrw=randread\n",
            BLOCKS_PER_THREAD * 4096
        ),
    )
    .unwrap();
    let sock = dir.join("host.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["bench", job.to_str().unwrap(), "--output-format=json", "--no-baseline", "--target-poll=block"])
        .args(["--metrics", "127.0.0.1:0", "--linger", "200", "--rpc-socket", sock.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qpath bench");
    // Stderr names the metrics address; stdout carries the report.
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    let t_err = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("qpath bench: metrics on http://") {
                let _ = tx.send(a.trim_end_matches("/metrics").parse::<SocketAddr>().unwrap());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut out = child.stdout.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let Ok(addr) = rx.recv_timeout(TIMEOUT) else {
        let _ = child.kill();
        panic!("no metrics address on stderr:\n{}", t_err.join().unwrap());
    };

    // While the jobs run: counters never go backwards, never pass the job's count.
    let per_phase = BLOCKS_PER_THREAD * THREADS_PER_PHASE;
    let start = Instant::now();
    let mut last = Counts { host_reads: 0, host_writes: 0, target_reads: 0, target_writes: 0 };
    let (mut scrapes, mut mid_run) = (0, 0);
    loop {
        assert!(start.elapsed() < TIMEOUT, "the bench did not finish");
        let text = scrape(addr);
        let running = sum(&text, "qpath_bench_running", &[]) == 1;
        let c = counts(&text);
        for (now, before, what) in [
            (c.host_reads, last.host_reads, "host reads"),
            (c.host_writes, last.host_writes, "host writes"),
            (c.target_reads, last.target_reads, "target reads"),
            (c.target_writes, last.target_writes, "target writes"),
        ] {
            assert!(now >= before, "{what} went back from {before} to {now}");
            assert!(now <= per_phase, "{what} = {now}, more than the job's {per_phase}");
        }
        // Readers start after every writer finished (stonewall).
        assert!(c.host_reads == 0 || c.host_writes == per_phase, "{c:?}");
        assert_eq!(sum(&text, "qpath_host_namespace_errors_total", &[]), 0, "no I/O errors");
        last = c;
        scrapes += 1;
        if !running {
            break;
        }
        if c.host_writes + c.host_reads > 0 && c.host_reads < per_phase {
            mid_run += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(mid_run > 0, "no scrape saw the counters while I/O ran ({scrapes} scrapes)");

    // After the jobs: exact on the host at once; the target publishes on its 10 ms tick.
    let t = Instant::now();
    let text = loop {
        let text = scrape(addr);
        let c = counts(&text);
        if (c.target_reads, c.target_writes) == (per_phase, per_phase) || t.elapsed() > Duration::from_secs(10) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let c = counts(&text);
    assert_eq!(
        c,
        Counts { host_reads: per_phase, host_writes: per_phase, target_reads: per_phase, target_writes: per_phase }
    );
    for name in ["qpath_host_path_ios_total", "qpath_host_namespace_ios_total", "qpath_host_controller_ios_total"] {
        assert_eq!(sum(&text, name, &["dir=\"read\""]), per_phase, "{name}");
        assert_eq!(sum(&text, name, &["dir=\"write\""]), per_phase, "{name}");
    }
    assert_eq!(sum(&text, "qpath_host_queue_bytes_total", &["dir=\"write\""]), per_phase * 4096);
    assert_eq!(sum(&text, "qpath_host_queue_outstanding", &[]), 0);
    assert_eq!(sum(&text, "qpath_host_queue_errors_total", &[]), 0);
    assert_eq!(sum(&text, "qpath_host_controller_reconnects_total", &[]), 0);
    assert_eq!(sum(&text, "qpath_host_queue_failures_total", &[]), 0);
    assert_eq!(sum(&text, "qpath_host_contexts", &[]), 0, "every job's context is gone");
    // Each job thread owned one queue of the one controller: per-queue counts are whole jobs.
    let per_queue: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("qpath_host_queue_ios_total{") && l.contains("dir=\"write\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .filter(|&v: &u64| v > 0)
        .collect();
    assert!(!per_queue.is_empty() && per_queue.iter().all(|v| v % BLOCKS_PER_THREAD == 0), "{per_queue:?}");

    // The RPC socket says the same, and `qpath stats` prints it.
    let v = target::rpc::client_call(&sock, "stats", json!({})).unwrap();
    assert_eq!(v["side"], "host");
    assert_eq!(v["totals"]["ios"], 2 * per_phase);
    assert_eq!(v["totals"]["io_errors"], 0);
    assert_eq!(v["totals"]["reconnects"], 0);
    let t = target::rpc::client_call(&sock, "target_stats", json!({})).unwrap();
    assert_eq!(t["side"], "target");
    let table = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["stats", "--socket", sock.to_str().unwrap()])
        .output()
        .expect("qpath stats");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("host queues") && table.contains("controllers") && table.contains("paths"), "{table}");
    let table = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["stats", "--target", "--socket", sock.to_str().unwrap()])
        .output()
        .expect("qpath stats --target");
    let table = String::from_utf8_lossy(&table.stdout);
    let pools = t["reactors"].as_array().expect("the target's reactors");
    assert!(!pools.is_empty());
    for r in pools {
        let line = format!("reactor {:>2}: ", r["reactor"]);
        let line = table.lines().find(|l| l.contains(&line)).unwrap_or_else(|| panic!("{line} in\n{table}"));
        let allocated = format!("{} allocated", r["buffer_allocations"]);
        assert!(line.contains(&allocated), "{line}");
    }
    // No host authenticated with this embedded target: no DH step anywhere.
    assert_eq!(t["auth"]["dh_steps_submitted"], 0, "{t}");
    assert!(
        table.contains("  0 DH steps: 0 computed, 0 skipped (connection closed), 0 pending; 0 hosts waiting"),
        "{table}"
    );

    // Release the linger; the bench's own report has the same counts.
    target::rpc::client_call(&sock, "release", json!({})).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("qpath bench did not exit after release");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = t_err.join().unwrap();
    assert!(status.success(), "qpath bench failed:\n{stderr}");
    let report: Value = serde_json::from_str(&t_out.join().unwrap()).expect("JSON report");
    let total = |dir: &str| -> u64 {
        report["jobs"].as_array().unwrap().iter().map(|j| j[dir]["total_ios"].as_u64().unwrap()).sum()
    };
    assert_eq!((total("read"), total("write")), (per_phase, per_phase), "the bench's own count");
    for j in report["jobs"].as_array().unwrap() {
        assert_eq!(j["error"], 0);
    }
    std::fs::remove_dir_all(&dir).ok();
}
