//! `qpath lab seed-000` runs briefly end to end: every policy and both reference
//! selectors, the table's shape, the JSON with its goals, per-path counts that add up to
//! each case's I/Os, the SVG plot, and no I/O errors. Speed and whether the goals are
//! met are the lab's to report, not this test's.

use std::time::Duration;

mod run_bounded;

/// A warm-up and six cases of 0.3 s, set-up and drain, and the selection timings.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn seed_000_lab_runs_every_selector_without_errors() {
    let (v, svg) = run_bounded::run_lab("seed-000", &["--runtime", "0.3", "--rounds", "1"], RUN_TIMEOUT);

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
