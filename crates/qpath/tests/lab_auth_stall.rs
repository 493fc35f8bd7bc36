//! `qpath lab auth-stall` runs briefly end to end: both cases (the DH steps on the
//! reactor, and on the target's workers), the table's shape, the JSON with every
//! connect done and the steps counted where they ran, the SVG plot, and no failed read.
//! How long the reads stalled is the lab's to report, not this test's.

use std::time::Duration;

mod run_bounded;

/// Two cases of 0.3 s alone plus one ffdhe8192 connect of admin + 1 I/O queue each; the
/// connector runs at nice 19, so a loaded CI machine stretches it.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

#[test]
fn auth_stall_lab_counts_the_steps_where_they_ran() {
    let args = ["--runtime", "0.3", "--connects", "1", "--queues", "1"];
    let (v, svg) = run_bounded::run_lab("auth-stall", &args, RUN_TIMEOUT);

    assert_eq!(v["lab"], "auth-stall");
    run_bounded::full_rows(&v, 2, &["errors"]);
    let cases = v["cases"].as_array().unwrap();
    let workers: Vec<u64> = cases.iter().map(|c| c["auth_workers"].as_u64().unwrap()).collect();
    assert_eq!(workers, [0, 4], "before and after, in one run");
    for c in cases {
        assert_eq!(c["connects_ok"], 1, "{c}");
        assert!(c["qd1_alone"]["ios"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(c["qd1_during_connects"]["errors"], 0, "{c}");
        // Admin + 1 I/O queue, two steps each: all on the workers, or none.
        let expect = if c["auth_workers"] == 0 { 0 } else { 4 };
        assert_eq!(c["target_dh_steps_offloaded"], expect, "{c}");
    }
    assert!(svg.starts_with("<svg") && svg.contains("auth_workers 4"), "{svg}");
}

/// `--reauth`: the QD1 controller itself authenticates (admin + 1 I/O queue) and
/// re-authenticates twice while its reads go on: every transaction done, the steps
/// counted where they ran (connect and re-authentications), no failed read.
#[test]
fn auth_stall_lab_reauthenticates_the_reading_controller() {
    let args = ["--runtime", "0.3", "--connects", "2", "--queues", "1", "--reauth"];
    let (v, _) = run_bounded::run_lab("auth-stall", &args, RUN_TIMEOUT);
    run_bounded::full_rows(&v, 2, &["errors"]);
    for c in v["cases"].as_array().unwrap() {
        assert_eq!((&c["mode"], &c["connects_ok"]), (&"reauth".into(), &2.into()), "{c}");
        assert!(c["qd1_during_connects"]["ios"].as_u64().unwrap() > 0, "{c}");
        assert_eq!((&c["qd1_alone"]["errors"], &c["qd1_during_connects"]["errors"]), (&0.into(), &0.into()), "{c}");
        // Two queues, two steps each, at the connect and at each of the two re-authentications.
        let expect = if c["auth_workers"] == 0 { 0 } else { 2 * 2 * 3 };
        assert_eq!(c["target_dh_steps_offloaded"], expect, "{c}");
    }
}
