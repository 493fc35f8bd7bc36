//! `qpath lab auth-flood` runs briefly end to end: the measured host connects on an idle
//! target and under a flood of Negotiates another host hangs up on, the table's shape,
//! the JSON, the SVG plot. What it asserts holds on any machine: every connect comes up
//! (in arrival order the flood's queued steps held it past its 30 s timeout), and the
//! workers have nothing left once the flood's connections are gone (without skipping
//! their abandoned steps they had minutes of work queued). How long the connects took is
//! the lab's to report, not this test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// One connect of admin + 1 I/O queue per phase (ffdhe8192), a flood of at most 10 s.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

#[test]
fn auth_flood_lab_connects_through_the_flood_and_drains() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-auth-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("auth-flood.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "auth-flood", "--connects", "1", "--queues", "1", "--head-start", "0.3", "--flood-max", "10"])
        .args(["--json", "--plot"])
        .arg(&plot);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    assert!(status.success(), "qpath lab auth-flood failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(v["lab"], "auth-flood");
    let columns = v["columns"].as_array().unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in rows {
        assert_eq!(r.as_object().unwrap().len(), columns.len());
        assert_eq!(r["errors"], 0.0, "{r}");
    }
    let (alone, flood) = (&v["alone"], &v["flood"]);
    for p in [alone, flood] {
        assert_eq!(p["connects_ok"], 1, "{p}");
        assert_eq!(p["connect_ms"].as_array().map(Vec::len), Some(1), "{p}");
    }
    // Admin + 1 I/O queue, two steps each, on an idle target.
    assert_eq!((&alone["target_dh_steps_submitted"], &alone["target_dh_steps_computed"]), (&4.into(), &4.into()));
    assert_eq!(alone["flood_negotiates"], 0);
    let sent = flood["flood_negotiates"].as_u64().unwrap();
    let submitted = flood["target_dh_steps_submitted"].as_u64().unwrap();
    let computed = flood["target_dh_steps_computed"].as_u64().unwrap();
    let abandoned = flood["target_dh_steps_abandoned"].as_u64().unwrap();
    eprintln!("flood: {sent} Negotiates, {submitted} steps submitted, {computed} computed, {abandoned} abandoned");
    assert!(sent > 0, "{flood}");
    // Each Negotiate the target read became a step (a hang-up may beat it to the reactor).
    assert!(submitted >= 4 && submitted <= sent + 4, "{flood}");
    assert!(flood["drain_secs"].as_f64().is_some(), "the workers drained: {flood}");
    assert_eq!(computed + abandoned, submitted, "{flood}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("flood"), "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}
