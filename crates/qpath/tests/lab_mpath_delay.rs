//! `qpath lab mpath-delay` runs briefly end to end: the healthy reference and the three
//! policies with path 2 delayed by the target, the table's shape, the JSON with its
//! goals, per-path counts that add up to each case's I/Os, the SVG plot, and no I/O
//! errors. Which policy is faster is the lab's to report, not this test's.

use std::time::Duration;

mod run_bounded;

/// A warm-up and four cases of 0.3 s, with set-up and drain.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn mpath_delay_lab_runs_every_policy_without_errors() {
    let (v, svg) = run_bounded::run_lab(
        "mpath-delay",
        &["--runtime", "0.3", "--rounds", "1", "--jobs", "2", "--iodepth", "8"],
        RUN_TIMEOUT,
    );

    assert_eq!(v["lab"], "mpath-delay");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("scaled to this 2-core machine")), "{notes:?}");
    let columns = v["columns"].as_array().unwrap();
    let rows = v["rows"].as_array().unwrap();
    let cases = ["no delay, round-robin", "round-robin", "queue-depth", "latency"];
    assert_eq!(rows.len(), cases.len(), "{rows:?}");
    for (r, name) in rows.iter().zip(cases) {
        assert_eq!(r.as_object().unwrap().len(), columns.len());
        assert_eq!(r["case"], name);
        assert_eq!(r["errors"], 0.0, "{r}");
    }
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 3, "latency >= queue-depth, both > round-robin: {goals:?}");
    assert!(goals.iter().all(|g| g["ratio"].is_number()), "{goals:?}");

    let json_cases = v["cases"].as_array().unwrap();
    assert_eq!(json_cases.len(), cases.len());
    for (c, name) in json_cases.iter().zip(cases) {
        assert_eq!(c["policy"], name);
        assert_eq!(c["error"], 0, "{c}");
        assert_eq!(c["path2_delay_us"], if name.starts_with("no delay") { 0 } else { 2000 }, "{name}");
        let ios = c["total_ios"].as_u64().unwrap();
        assert!(ios > 0, "{name} did I/O");
        let paths = c["paths"].as_array().unwrap();
        assert_eq!(paths.len(), 2, "{name}: {paths:?}");
        let per_path: Vec<u64> = paths.iter().map(|x| x["ios"].as_u64().unwrap()).collect();
        assert_eq!(per_path.iter().sum::<u64>(), ios, "{name}: per-path counts add up to the I/Os");
        let bytes: u64 = paths.iter().map(|x| x["io_bytes"].as_u64().unwrap()).sum();
        assert_eq!(bytes, ios * 4096, "{name}: 4 KiB each");
        if name.contains("round-robin") {
            // Each of the 2 job threads alternates, so the paths differ by at most one I/O per thread.
            assert!(per_path[0].abs_diff(per_path[1]) <= 2, "{name}: {per_path:?}");
        }
    }
    assert!(svg.starts_with("<svg") && svg.contains("queue-depth"), "{svg}");
}
