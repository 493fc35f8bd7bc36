//! `qpath lab flaps --quick` (20 s of 4k randwrite + crc32c verify through a 2-path head,
//! one path down 2 s every 4 s, then the read-back) runs end to end in each local mode:
//! port faults and ANA flips by RPC, and link loss on veth links in network namespaces
//! (root only; it skips with the lab's reason otherwise). Each must end with zero I/O
//! errors, zero verify failures, every written block read back, both paths used (in a
//! phase longer than an outage cycle) and every outage run. Latency and IOPS are the lab's to report, not this test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// 20 s of writes, the read-back (flaps go on), set-up and teardown, on a busy machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs the lab; `None` when it printed a SKIP line.
fn run(mode: &str, extra: &[&str]) -> Option<Value> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "flaps", "--mode", mode, "--quick", "--size-mib", "256", "--json", "--no-plot"]).args(extra);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    if let Some(why) = stdout.lines().find(|l| l.starts_with("SKIP:")) {
        eprintln!("{why}");
        return None;
    }
    assert!(status.success(), "qpath lab flaps --mode {mode} failed:\n{stdout}\n{stderr}");
    Some(serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}")))
}

fn check(v: &Value, mode: &str, expect_reconnects: bool) {
    assert_eq!(v["lab"], format!("flaps-{mode}"));
    assert_eq!(v["mode"], mode);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "randwrite and read-back: {rows:?}");
    for r in rows {
        assert_eq!(r["errors"], 0.0, "{r}");
        assert_eq!(r["verify failures"], 0.0, "{r}");
        assert!(r["I/Os"].as_f64().unwrap() > 0.0, "{r}");
        // Both paths carry I/O over a phase that outlasts an outage cycle (4 s with
        // --quick). A shorter phase (the read-back takes 1-2 s) may fall inside one path's
        // outage: then the other path carries all of it.
        let (p1, p2) = (r["path 1 I/Os"].as_f64().unwrap(), r["path 2 I/Os"].as_f64().unwrap());
        let secs = r["I/Os"].as_f64().unwrap() / r["IOPS"].as_f64().unwrap();
        if secs >= 4.0 {
            assert!(p1 > 0.0 && p2 > 0.0, "{r}");
        } else {
            assert!(p1 + p2 > 0.0, "{r}");
        }
        assert!(r["max us"].as_f64().unwrap() >= r["p99.99 us"].as_f64().unwrap() * 0.999, "{r}");
    }
    assert_eq!(v["write"]["errors"], 0);
    assert_eq!(v["read_back"]["errors"], 0);
    let verify = &v["verify"];
    assert_eq!(verify["failures"], 0, "{verify}");
    let checked = verify["checked"].as_u64().unwrap();
    assert!(checked > 0);
    assert_eq!(verify["written"].as_u64().unwrap(), checked, "every written block was read back");
    // 20 s, one outage every 4 s from 2 s in: 4 during the writes, more during the read-back.
    let outages = v["outages"].as_array().unwrap();
    assert!(outages.len() >= 4, "{outages:?}");
    assert!(outages.iter().all(|o| o["error"].is_null()), "every down/up command worked: {outages:?}");
    assert_eq!(outages[0]["path"], 0);
    assert_eq!(outages[1]["path"], 1);
    let reconnects: Vec<u64> =
        v["controllers"].as_array().unwrap().iter().map(|c| c["reconnects"].as_u64().unwrap()).collect();
    assert_eq!(reconnects.len(), 2);
    if expect_reconnects {
        assert!(reconnects.iter().all(|&r| r >= 1), "both paths were lost and came back: {reconnects:?}");
    }
    assert_eq!(v["recovered_at_end"], true);
    assert!(v["timeline_ios_per_second"].as_array().unwrap().len() >= 20);
}

#[test]
fn flaps_by_port_fault_lose_nothing() {
    let v = run("fault", &[]).expect("fault mode needs nothing special");
    check(&v, "fault", true);
}

#[test]
fn flaps_by_ana_state_lose_nothing() {
    let v = run("ana", &[]).expect("ana mode needs nothing special");
    check(&v, "ana", false);
}

#[test]
fn flaps_by_link_loss_lose_nothing() {
    // KATO 1 s: the host notices a 2 s silent outage (keep-alive expiry) and fails over.
    let Some(v) = run("link", &["--kato", "1"]) else { return };
    check(&v, "link", true);
}
