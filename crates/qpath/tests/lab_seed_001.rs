//! `qpath lab seed-001` runs briefly end to end: both paths at both block sizes, the
//! table's shape, the JSON with its goals and per-run samples, the SVG plot, and no
//! I/O errors. Speed and whether the goals are met are the lab's to report, not this
//! test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// Four runs of 0.5 s (`--quick`) plus connects, set-up and the target's start.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn seed_001_lab_runs_both_paths_without_errors() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-seed-001-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("seed-001.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "seed-001", "--quick", "--json", "--plot"]).arg(&plot);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    assert!(status.success(), "qpath lab seed-001 failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(v["lab"], "seed-001");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("t/io_uring")), "the notes say how it was scaled");
    // Two paths at two block sizes.
    run_bounded::full_rows(&v, 4, &["errors"]);
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 4, "IOPS and host capacity at each block size");
    assert!(goals.iter().all(|g| g["ratio"].is_number() || g["ratio"].is_null()));

    let samples = v["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 4, "one round of each case");
    let mut seen = Vec::new();
    for s in samples {
        let path = s["path"].as_str().unwrap();
        let bs = s["bs"].as_u64().unwrap();
        seen.push((path.to_string(), bs));
        assert_eq!(s["errors"], 0, "{s}");
        assert!(s["ios"].as_u64().unwrap() > 0, "{path} bs={bs} did I/O");
        assert!(s["runtime_ms"].as_u64().unwrap() > 0, "{path} bs={bs} measured a runtime");
        // The meter polled: the host's time is accounted for, not guessed.
        assert!(s["polls"].as_u64().unwrap() > 0, "{path} bs={bs} polled");
        assert!(s["empty_polls"].as_u64().unwrap() <= s["polls"].as_u64().unwrap());
    }
    seen.sort();
    let expected: Vec<(String, u64)> =
        [("qpath", 512), ("qpath", 4096), ("qpath-passthru", 512), ("qpath-passthru", 4096)]
            .iter()
            .map(|&(p, b)| (p.to_string(), b))
            .collect();
    assert_eq!(seen, expected);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("passthru"), "{svg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
