//! `qpath lab seed-000` runs briefly end to end: every policy and both reference
//! selectors, the table's shape, the JSON with its goals, per-path counts that add up to
//! each case's I/Os, the SVG plot, and no I/O errors. Speed and whether the goals are
//! met are the lab's to report, not this test's.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A warm-up and six cases of 0.3 s, set-up and drain, and the selection timings.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs `qpath lab <args>` with a plot into a fresh directory; returns the JSON and the SVG.
pub fn run_lab(name: &str, args: &[&str]) -> (Value, String) {
    let dir = std::env::temp_dir().join(format!("qpath-lab-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join(format!("{name}.svg"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .arg("lab")
        .arg(name)
        .args(args)
        .args(["--json", "--plot"])
        .arg(&plot)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qpath");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("qpath lab {name} ran longer than {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (t_out.join().unwrap(), t_err.join().unwrap());
    assert!(status.success(), "qpath lab {name} failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let svg = std::fs::read_to_string(&plot).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (v, svg)
}

#[test]
fn seed_000_lab_runs_every_selector_without_errors() {
    let (v, svg) = run_lab("seed-000", &["--runtime", "0.3", "--rounds", "1"]);

    assert_eq!(v["lab"], "seed-000");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("scaled to this 2-core machine")), "{notes:?}");
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("78.35 us (summing)")), "the seed's numbers: {notes:?}");
    let columns = v["columns"].as_array().unwrap();
    let rows = v["rows"].as_array().unwrap();
    let policies = ["numa", "round-robin", "queue-depth", "latency", "ref-sum-queues", "ref-shared-atomic"];
    assert_eq!(rows.len(), policies.len(), "{rows:?}");
    for (r, p) in rows.iter().zip(policies) {
        assert_eq!(r.as_object().unwrap().len(), columns.len());
        assert_eq!(r["policy"], p);
        assert_eq!(r["errors"], 0.0, "{r}");
    }
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 6);
    assert!(goals.iter().all(|g| g["ratio"].is_number() || g["ratio"].is_null()));

    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), policies.len());
    for (c, p) in cases.iter().zip(policies) {
        assert_eq!(c["policy"], p);
        assert_eq!(c["error"], 0, "{c}");
        let ios = c["total_ios"].as_u64().unwrap();
        assert!(ios > 0, "{p} did I/O");
        assert!(c["slat_mean_ns"].as_f64().unwrap() > 0.0, "{p}: slat measured");
        assert!(c["clat_mean_ns"].as_f64().unwrap() > 0.0, "{p}: clat measured");
        assert!(c["selection_ns"].as_f64().unwrap() > 0.0, "{p}: selection timed");
        assert!(c["selection_ns_64_paths"].as_f64().unwrap() > 0.0, "{p}: selection timed at 64 paths");
        let paths = c["paths"].as_array().unwrap();
        assert_eq!(paths.len(), 2, "{p}: {paths:?}");
        let on_paths: u64 = paths.iter().map(|x| x["ios"].as_u64().unwrap()).sum();
        assert_eq!(on_paths, ios, "{p}: per-path counts add up to the I/Os");
        let bytes: u64 = paths.iter().map(|x| x["io_bytes"].as_u64().unwrap()).sum();
        assert_eq!(bytes, ios * 512 * 1024, "{p}: 512 KiB each");
    }
    // Round-robin alternates; the references see both paths idle at QD1 and pick path 1.
    let rr = &cases[1]["paths"];
    assert!(rr[0]["ios"].as_u64().unwrap() > 0 && rr[1]["ios"].as_u64().unwrap() > 0, "{rr}");
    assert!(svg.starts_with("<svg") && svg.contains("ref-shared-atomic"), "{svg}");
}
