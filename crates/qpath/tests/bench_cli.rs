//! `qpath bench` end to end: the quickstart and every seed job file in `examples/`
//! against the embedded target, an io_uring job on a local file with verify, and
//! `qpath lab baseline`. Each run's runtime is capped (`--runtime-cap`) and every run
//! is bounded by a timeout; only correctness is asserted (no errors, I/O done, verify
//! clean, the baseline and ratios present), never speed.
//!
//! The runs busy-poll the machine's CPUs, so they take turns (one at a time).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One `qpath bench` at a time: each pins a reactor and job threads and polls.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// Longest any one run may take (debug build, seed 003's 33 threads on 2 cores).
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Run `qpath` with `args`; return (exit success, stdout, stderr).
fn qpath(args: &[&str]) -> (bool, String, String) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qpath");
    let deadline = Instant::now() + RUN_TIMEOUT;
    // Read the pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for qpath") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("qpath {args:?} ran longer than {RUN_TIMEOUT:?}; stderr:\n{}", t_err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), t_out.join().unwrap(), t_err.join().unwrap())
}

/// `qpath bench` with JSON output; the parsed report.
fn bench_json(jobfile: &Path, extra: &[&str]) -> Value {
    let path = jobfile.to_str().unwrap();
    let mut args = vec!["bench", path, "--output-format=json"];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = qpath(&args);
    assert!(ok, "qpath {args:?} failed\nstderr:\n{stderr}\nstdout:\n{stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{stdout}\nstderr:\n{stderr}"))
}

/// Every reported job: no error, I/O done; verify clean where it ran.
fn check_jobs(v: &Value, expect_jobs: usize) {
    let jobs = v["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), expect_jobs, "{v}");
    for (i, j) in jobs.iter().enumerate() {
        let name = j["jobname"].as_str().unwrap_or("?");
        assert_eq!(j["error"], 0, "job {name}: {}", v["qpath"]["jobs"][i]);
        let ios = j["read"]["total_ios"].as_u64().unwrap() + j["write"]["total_ios"].as_u64().unwrap();
        assert!(ios > 0, "job {name} did no I/O");
        let iops = j["read"]["iops"].as_f64().unwrap() + j["write"]["iops"].as_f64().unwrap();
        assert!(iops > 0.0, "job {name}: zero IOPS");
        let q = &v["qpath"]["jobs"][i];
        if let Some(ver) = q.get("verify") {
            assert_eq!(ver["failures"], 0, "job {name}: {ver}");
        }
    }
}

fn engines(v: &Value) -> Vec<String> {
    v["qpath"]["jobs"].as_array().unwrap().iter().map(|j| j["engines"][0].as_str().unwrap().to_string()).collect()
}

#[test]
fn quickstart_runs_with_baseline_and_ratios() {
    let v = bench_json(&examples().join("quickstart.fio"), &["--runtime-cap", "1"]);
    check_jobs(&v, 4);
    assert_eq!(engines(&v), ["qpath"; 4]);
    let q = &v["qpath"];
    assert!(q["target"].as_str().unwrap().starts_with("embedded"), "{}", q["target"]);
    let b = &q["baseline"];
    assert!(b["ping_pong"]["round_trips"].as_u64().unwrap() > 0, "{b}");
    assert!(b["ping_pong"]["lat_mean_ns"].as_f64().unwrap() > 0.0, "{b}");
    assert!(b["stream"]["bw_bytes"].as_f64().unwrap() > 0.0, "{b}");
    assert_eq!(b["ping_pong"]["request_bytes"], 72);
    assert_eq!(b["ping_pong"]["reply_bytes"], 4144);
    let lat = &q["jobs"][0]["ratios"]["lat_mean"];
    assert!(lat["ratio"].as_f64().unwrap() > 0.0, "QD1 randread has a latency ratio: {}", q["jobs"][0]);
    let bw = &q["jobs"][2]["ratios"]["bw"];
    assert!(bw["ratio"].as_f64().unwrap() > 0.0, "128k reads have a bandwidth ratio: {}", q["jobs"][2]);
    assert!(q["jobs"][1].get("ratios").is_none(), "QD32 random reads have neither shape");
    assert!(q["jobs"][1]["reference"]["label"].as_str().unwrap().contains("SPDK"), "{}", q["jobs"][1]);
    let ver = &q["jobs"][3]["verify"];
    assert!(ver["checked"].as_u64().unwrap() > 0 && ver["failures"] == 0, "{ver}");
}

#[test]
fn quickstart_text_report_names_target_and_ratios() {
    let path = examples().join("quickstart.fio");
    let (ok, stdout, stderr) =
        qpath(&["bench", path.to_str().unwrap(), "--runtime-cap", "0.5", "--target-poll", "busy"]);
    assert!(ok, "{stderr}\n{stdout}");
    assert!(stdout.contains("randread-qd1: (groupid=0, jobs=1): err= 0"), "{stdout}");
    assert!(stdout.contains("target: embedded qpath target"), "{stdout}");
    assert!(stdout.contains("(busy)"), "--target-poll busy is reported: {stdout}");
    assert!(stdout.contains("randread-qd1: lat avg") && stdout.contains("/ ping-pong avg"), "{stdout}");
    assert!(stdout.contains("read-128k: bw") && stdout.contains("/ stream bw"), "{stdout}");
    assert!(stdout.contains("reference (not this run): SPDK"), "{stdout}");
}

/// A seed job file against the embedded target, runtime capped; the report's jobs.
fn seed(name: &str, cap: &str) -> Value {
    bench_json(&examples().join(name), &["--embedded-target", "--no-baseline", "--runtime-cap", cap])
}

#[test]
fn seed_000_qd1_512k_randread() {
    let v = seed("seed-000-qd1-512k-randread.fio", "1");
    check_jobs(&v, 1);
    assert_eq!(engines(&v), ["qpath"]);
    assert!(v["qpath"].get("baseline").is_none(), "--no-baseline");
    assert!(v["qpath"]["target"].as_str().unwrap().starts_with("embedded"));
}

#[test]
fn seed_001_passthru_and_block() {
    let v = seed("seed-001-passthru-randread.fio", "1");
    check_jobs(&v, 2);
    assert_eq!(engines(&v), ["qpath-passthru", "qpath"]);
}

#[test]
fn seed_002_tiobench() {
    // group_reporting is off: 4 stonewalled jobs x numjobs=4 = 16 reported threads.
    let v = seed("seed-002-tiobench.fio", "0.5");
    check_jobs(&v, 16);
}

#[test]
fn seed_003_wal_and_hogs_at_iodepth_10000() {
    // 32 readers at iodepth=10000 (the host context queues beyond the queue size in
    // software) and the WAL writer on namespace 2, all on a 2-core machine.
    let v = seed("seed-003-wal-and-hogs.fio", "1");
    check_jobs(&v, 33);
    let wal = &v["jobs"][32];
    assert_eq!(wal["jobname"], "wal");
    assert!(wal["write"]["io_bytes"].as_u64().unwrap() > 0, "the WAL writer wrote");
    assert!(v["qpath"]["target"].as_str().unwrap().contains("ns 2 = 4.00 GiB"), "{}", v["qpath"]["target"]);
}

#[test]
fn seed_004_per_cpu_randread() {
    let v = seed("seed-004-per-cpu-randread.fio", "1");
    check_jobs(&v, 2);
}

#[test]
fn io_uring_on_a_local_file_with_verify() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("io_uring.dat");
    let job = dir.join("io_uring.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nfilename={}\nsize=16m\nbs=4k\ndirect=1\n\
             [randwrite]\nioengine=io_uring\nrw=randwrite\niodepth=16\nverify=crc32c\nruntime=1\n\
             [libaio-read]\nstonewall\nioengine=libaio\nrw=randread\niodepth=8\nruntime=500ms\ntime_based\n",
            data.display()
        ),
    )
    .unwrap();
    let v = bench_json(&job, &[]);
    check_jobs(&v, 2);
    assert_eq!(engines(&v), ["io_uring", "io_uring"], "libaio runs on io_uring");
    let ver = &v["qpath"]["jobs"][0]["verify"];
    assert!(ver["checked"].as_u64().unwrap() > 0, "{ver}");
    assert!(v["qpath"].get("baseline").is_none(), "no baseline for local files");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lab_baseline_json() {
    let (ok, stdout, stderr) = qpath(&["lab", "baseline", "--json", "--seconds", "0.2"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["ping_pong"]["lat_p99_ns"].as_u64().unwrap() > 0, "{v}");
    assert!(v["stream"]["bw_bytes"].as_f64().unwrap() > 0.0, "{v}");
}

/// fio refuses an option it does not know (`fio: bad option`, exit 1): a job run without
/// it is a different workload. So does `qpath bench`, naming the option and its line,
/// before anything runs; `--lenient` warns and runs without it, as before.
#[test]
fn unknown_job_options_are_refused_unless_lenient() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-cli-unknown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("unknown.dat");
    let job = dir.join("unknown.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nfilename={}\nsize=1m\nbs=4k\nioengine=psync\n\n[typo]\nrw=randread\nruntime=200ms\n\
             iodpeth=32\n",
            data.display()
        ),
    )
    .unwrap();
    let path = job.to_str().unwrap();
    let (ok, stdout, stderr) = qpath(&["bench", path]);
    assert!(!ok, "an unknown option must fail the run:\n{stdout}");
    assert!(stderr.contains("[typo] iodpeth=32 (line 10)") && stderr.contains(path), "{stderr}");
    assert!(stderr.contains("--lenient"), "says how to run anyway: {stderr}");
    assert!(!stdout.contains("Starting") && !data.exists(), "nothing ran, nothing was laid out:\n{stdout}");
    let (ok, stdout, stderr) = qpath(&["bench", path, "--lenient"]);
    assert!(ok, "--lenient runs it:\n{stderr}");
    assert!(
        stderr.contains("warning: unknown options ignored (--lenient)") && stderr.contains("iodpeth=32"),
        "{stderr}"
    );
    assert!(stdout.contains("typo: (groupid=0"), "{stdout}");
    // Every job file of examples/ still runs without --lenient: they parse strictly
    // (crates/qpath-bench/tests/examples_parse.rs checks each one).
    let _ = std::fs::remove_dir_all(&dir);
}
