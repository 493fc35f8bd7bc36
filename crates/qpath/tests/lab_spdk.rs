//! `qpath lab spdk` runs end to end. Without SPDK (no `--spdk-dir`, or a directory without
//! its programs) it runs the qpath column alone, with real numbers, and says plainly that
//! the SPDK columns were not run and why. With an SPDK build named by `QPATH_LAB_SPDK_DIR`
//! it runs all four columns briefly (skipped, saying so, without it). Speed and whether the
//! acceptance passes are the lab's to report, not this test's.

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// Five workloads of 0.3 s against a qpath target started as a child process.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Five workloads × four columns of 1 s + 1 s warm-up, two target starts each way.
const SPDK_RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// The lab's targets busy-poll CPU 0: one run at a time, not one per test thread.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lab(args: &[&str], timeout: Duration) -> (String, String) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "spdk"]).args(args);
    let (status, stdout, stderr) = run_bounded::run(cmd, timeout);
    assert!(status.success(), "qpath lab spdk failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The number in a text table cell such as `812345 (1 round)`.
fn cell_number(cell: &str) -> f64 {
    cell.split_whitespace().next().unwrap().parse().unwrap_or_else(|e| panic!("{cell:?}: {e}"))
}

#[test]
fn without_spdk_the_qpath_column_runs_and_the_report_says_why_the_others_did_not() {
    let (out, err) = lab(&["--duration", "0.3", "--warmup", "0", "--rounds", "1"], RUN_TIMEOUT);
    let why = "SPDK columns NOT RUN: no SPDK build was given (--spdk-dir DIR)";
    assert!(out.contains(why), "{out}");
    assert!(err.contains(why), "the progress says it at the start too: {err}");
    let rows: Vec<&str> = out.lines().filter(|l| ["4k rand", "128k read"].iter().any(|w| l.starts_with(w))).collect();
    assert_eq!(rows.len(), 5, "{out}");
    for row in rows {
        // Three SPDK columns not run, the qpath one measured in its single round.
        assert_eq!(row.matches("not run").count(), 3, "{row}");
        let qpath = row.rsplit("  ").next().unwrap().trim();
        assert!(qpath.ends_with("(1 round)"), "{row}");
        assert!(cell_number(qpath) > 0.0, "{row}");
    }
    assert!(!out.contains("PASS") && !out.contains("FAIL"), "one round and no SPDK: nothing to judge: {out}");
}

#[test]
fn an_spdk_dir_without_its_programs_is_named_with_the_reason_and_json_carries_it() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-spdk-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let (out, _) =
        lab(&["--spdk-dir", d, "--duration", "0.3", "--warmup", "0", "--rounds", "2", "--json"], RUN_TIMEOUT);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["lab"], "spdk");
    assert_eq!(v["spdk_run"], false);
    let why = v["spdk_skipped"].as_str().unwrap();
    assert!(why.contains(d) && why.contains("no nvmf_tgt and no spdk_nvme_perf"), "{why}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "one row per workload, the qpath column only");
    for r in rows {
        assert_eq!(r["column"], "bench_qpath");
        assert_eq!(r["rounds"], 2.0);
        assert!(r["median"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["spread"].as_f64().unwrap() >= 1.0, "{r}");
    }
    // Two rounds: each cell's spread is judged; no ratio against SPDK is.
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 5);
    assert!(goals.iter().all(|g| g["what"].as_str().unwrap().contains("spread")));
    assert_eq!(v["samples"].as_array().unwrap().len(), 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn with_an_spdk_build_from_env_all_four_columns_run() {
    let Some(spdk) = std::env::var_os("QPATH_LAB_SPDK_DIR") else {
        println!("SKIP: QPATH_LAB_SPDK_DIR does not name an SPDK build (nvmf_tgt, spdk_nvme_perf)");
        return;
    };
    let spdk = spdk.into_string().unwrap();
    let (out, _) =
        lab(&["--spdk-dir", &spdk, "--duration", "1", "--warmup", "1", "--rounds", "1", "--json"], SPDK_RUN_TIMEOUT);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["spdk_run"], true, "{out}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20, "five workloads × four columns");
    for r in rows {
        assert!(r["median"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Three ratios per workload against perf → SPDK; one round: no spread judged.
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 15);
    assert!(goals.iter().all(|g| g["ratio"].as_f64().unwrap() > 0.0), "{goals:?}");
}

/// `--tls` without SPDK: the qpath column runs inside TLS 1.3 (the target requires it, so
/// a number means the channel stood), the report says so, and the run's key is nowhere in
/// what the lab prints.
#[test]
fn with_tls_the_qpath_column_runs_in_the_channel_and_the_key_stays_out_of_the_report() {
    let (out, err) = lab(&["--tls", "--duration", "0.3", "--warmup", "0", "--rounds", "1"], RUN_TIMEOUT);
    assert!(out.contains("NVMe/TCP in TLS 1.3 over loopback"), "{out}");
    assert!(out.contains("TLS 1.3 on every connection"), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| ["4k rand", "128k read"].iter().any(|w| l.starts_with(w))).collect();
    assert_eq!(rows.len(), 5, "{out}");
    for row in rows {
        let qpath = row.rsplit("  ").next().unwrap().trim();
        assert!(cell_number(qpath) > 0.0, "{row}");
    }
    for text in [&out, &err] {
        assert!(!text.contains("NVMeTLSkey-1"), "no key in the lab's output: {text}");
    }
}

#[test]
fn with_an_spdk_build_from_env_all_four_columns_run_in_tls() {
    let Some(spdk) = std::env::var_os("QPATH_LAB_SPDK_DIR") else {
        println!("SKIP: QPATH_LAB_SPDK_DIR does not name an SPDK build (nvmf_tgt, spdk_nvme_perf)");
        return;
    };
    let spdk = spdk.into_string().unwrap();
    let (out, err) = lab(
        &["--spdk-dir", &spdk, "--tls", "--duration", "1", "--warmup", "1", "--rounds", "1", "--json"],
        SPDK_RUN_TIMEOUT,
    );
    assert!(!out.contains("NVMeTLSkey-1") && !err.contains("NVMeTLSkey-1"), "no key in the lab's output");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["spdk_run"], true, "{out}");
    // Every column, the two cross ones included: each stack's host in TLS with the other's
    // target, the older identity, one key.
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20, "five workloads × four columns");
    for r in rows {
        assert!(r["median"].as_f64().unwrap() > 0.0, "{r}");
    }
}
