//! `qpath lab seed-003` runs briefly end to end: every case, the table's shape, the
//! JSON with its goals and per-case counts, the SVG plot, and no I/O errors. Speed
//! and whether the goals are met are the lab's to report, not this test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// Seven cases of (0.3 s + 0.1 s warm-up + 0.2 s hog head start + set-up and drain).
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn seed_003_lab_runs_every_case_without_errors() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-seed-003-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("seed-003.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "seed-003", "--runtime", "0.3", "--warmup", "0.1", "--json", "--plot"]).arg(&plot);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    assert!(status.success(), "qpath lab seed-003 failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(v["lab"], "seed-003");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("32 hog threads")), "the notes say how it was scaled");
    run_bounded::full_rows(&v, 7, &["errors"]);
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 5);
    assert!(goals.iter().all(|g| g["ratio"].is_number() || g["ratio"].is_null()));

    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for c in cases {
        let name = c["case"].as_str().unwrap();
        for job in ["wal", "hogs"] {
            let j = &c[job];
            let expected = !matches!((name, job), ("WAL alone", "hogs") | ("hogs alone", "wal"));
            assert_eq!(!j.is_null(), expected, "{name}: {job}");
            if j.is_null() {
                continue;
            }
            assert_eq!(j["errors"], 0, "{name}: {job}");
            assert_eq!(j["undrained"], 0, "{name}: {job}");
            // Even a starved WAL completes its writes once the hogs stop.
            assert!(j["total_ios"].as_u64().unwrap() > 0, "{name}: {job} did I/O");
            assert!(j["seconds"].as_f64().unwrap() > 0.0, "{name}: {job} measured a window");
        }
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("shared, windows"), "{svg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
