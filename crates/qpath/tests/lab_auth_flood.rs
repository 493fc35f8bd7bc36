//! `qpath lab auth-flood` runs briefly end to end: the measured host connects on an idle
//! target and under a flood of Negotiates another host hangs up on, the table's shape,
//! the JSON, the SVG plot. What it asserts holds on any machine: every connect comes up
//! (in arrival order the flood's queued steps held it past its 30 s timeout), and the
//! workers have nothing left once the flood's connections are gone (without skipping
//! their abandoned steps they had minutes of work queued). How long the connects took is
//! the lab's to report, not this test's.

use std::time::Duration;

mod run_bounded;

/// One connect of admin + 1 I/O queue per phase (ffdhe8192), a flood of at most 10 s.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

#[test]
fn auth_flood_lab_connects_through_the_flood_and_drains() {
    let args = ["--connects", "1", "--queues", "1", "--head-start", "0.3", "--flood-max", "10", "--flood-nice", "19"];
    let (v, svg) = run_bounded::run_lab("auth-flood", &args, RUN_TIMEOUT);

    assert_eq!(v["lab"], "auth-flood");
    run_bounded::full_rows(&v, 2, &["errors"]);
    assert_eq!(v["flood_nice"], 19);
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
    assert!(svg.starts_with("<svg") && svg.contains("flood"), "{svg}");
}
