//! `qpath lab seed-002` runs briefly end to end: the three configurations, four
//! tiobench steps each, the table's shape, the JSON with its goals, the SVG plot, and
//! no I/O errors, reconnects or failed queues by the host's own statistics, whose I/O
//! count equals the jobs'. Speed and whether the goals are met are the lab's to
//! report, not this test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// Three configurations of four 0.5 s steps, plus connects and teardown (debug build).
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn seed_002_lab_runs_every_configuration_without_errors() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-seed-002-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("seed-002.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "seed-002", "--quick", "--target-poll", "block", "--json", "--plot"]).arg(&plot);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    assert!(status.success(), "qpath lab seed-002 failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(v["lab"], "seed-002");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("scaled to")), "the notes say how it was scaled");
    run_bounded::full_rows(&v, 3, &["I/O errors", "reconnects"]);
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2);
    assert!(goals.iter().all(|g| g["ratio"].is_number()), "{goals:?}");
    assert_eq!(v["seed"]["seq_write_mibs_1_subsys"], 523.0);

    let configs = v["configurations"].as_array().unwrap();
    let subsystems: Vec<u64> = configs.iter().map(|c| c["subsystems"].as_u64().unwrap()).collect();
    assert_eq!(subsystems, [1, 2, 4]);
    for c in configs {
        let s = c["subsystems"].as_u64().unwrap();
        for k in ["job_errors", "io_errors", "reconnects", "queue_failures"] {
            assert_eq!(c[k], 0, "{s} subsystems: {k}");
        }
        let phases = c["phases"].as_array().unwrap();
        assert_eq!(phases.len(), 4, "four tiobench steps");
        for p in phases {
            assert!(p["bytes"].as_u64().unwrap() > 0 && p["seconds"].as_f64().unwrap() > 0.0, "{s}: {p}");
        }
        // The host's statistics count the same I/Os as the jobs.
        assert!(c["job_ios"].as_u64().unwrap() > 0);
        assert_eq!(c["host_queue_ios"], c["job_ios"], "{s} subsystems");
        // Round-robin heads: both ports carried I/O.
        let paths = c["paths"].as_array().unwrap();
        assert_eq!(paths.len(), 2, "{s}: {paths:?}");
        assert!(paths.iter().all(|p| p["ios"].as_u64().unwrap() > 0), "{s}: {paths:?}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("4 subsystem(s)"), "{svg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
