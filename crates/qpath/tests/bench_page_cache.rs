//! `invalidate` (fio's default 1) for the file engines: before a job, the page cache of
//! its file range is dropped (`posix_fadvise(POSIX_FADV_DONTNEED)`), so a buffered psync
//! read job reads from the storage as fio's does, instead of from memory; `invalidate=0`
//! keeps the cache. The report says which.
//!
//! What is measured is where the bytes came from, not speed: the `read_bytes` of the
//! `qpath bench` process (`/proc/PID/io`: bytes fetched from the storage layer), read while
//! the process lingers after its job (`--linger`, ended by the RPC `release`). The file is
//! in the cargo target directory; on tmpfs there is no storage below the page cache, and
//! the test says SKIP.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod target_process;
use target_process::{CALL_WITHIN, Dir, rpc_at};

const FILE_BYTES: u64 = 16 << 20;

/// `read_bytes` of process `pid`.
fn read_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("read_bytes: ")).unwrap().trim().parse().unwrap()
}

/// Runs a psync sequential read of the whole file with `extra` job options, the file's
/// pages cached beforehand; returns the process's read_bytes after the job, and the report.
fn run(dir: &Dir, file: &std::path::Path, name: &str, extra: &str) -> (u64, String) {
    // Every page of the file in memory before the job.
    let cached = std::fs::read(file).unwrap();
    assert_eq!(cached.len() as u64, FILE_BYTES);
    let job = dir.path(&format!("{name}.fio"));
    std::fs::write(
        &job,
        format!("[{name}]\nfilename={}\nioengine=psync\nrw=read\nbs=1m\nsize={FILE_BYTES}\n{extra}", file.display()),
    )
    .unwrap();
    let sock = dir.path(&format!("{name}.sock"));
    let out = dir.path(&format!("{name}.txt"));
    let mut bench = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .arg("bench")
        .arg(&job)
        .arg("--rpc-socket")
        .arg(&sock)
        .arg("--linger")
        .arg("60")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let bytes = loop {
        let done = rpc_at(&sock, "bench_status", &[]).is_ok_and(|s| s.contains("\"running\": false"));
        if done {
            break read_bytes(bench.id());
        }
        if let Some(st) = bench.try_wait().unwrap() {
            panic!("qpath bench ended ({st}) before its status said so");
        }
        if Instant::now() > deadline {
            let _ = bench.kill();
            let _ = bench.wait();
            panic!("the job did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The process may end before its answer is written whole: only its exit counts.
    let _ = rpc_at(&sock, "release", &[]);
    let end = Instant::now() + CALL_WITHIN;
    let status = loop {
        if let Some(st) = bench.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > end {
            let _ = bench.kill();
            let _ = bench.wait();
            panic!("qpath bench did not end after release");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    (bytes, std::fs::read_to_string(&out).unwrap())
}

#[test]
fn invalidate_drops_the_page_cache_before_a_psync_job() {
    let dir =
        Dir(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("page-cache-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let fs = Command::new("stat").args(["-f", "-c", "%T"]).arg(&dir.0).output().unwrap();
    let fs = String::from_utf8_lossy(&fs.stdout).trim().to_string();
    if fs == "tmpfs" || fs == "ramfs" {
        println!("SKIP: {} is on {fs}: no storage below the page cache to read from", dir.0.display());
        return;
    }
    let file = dir.path("data");
    let block: Vec<u8> = (0..1u32 << 20).map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[1]).collect();
    let mut data = Vec::new();
    for _ in 0..FILE_BYTES >> 20 {
        data.extend_from_slice(&block);
    }
    std::fs::write(&file, &data).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();

    let (fresh, report) = run(&dir, &file, "invalidated", "");
    assert!(fresh >= FILE_BYTES * 9 / 10, "invalidate=1 (the default): {fresh} bytes read from the storage");
    assert!(report.contains("job invalidated: page cache invalidated before the job (invalidate=1)"), "{report}");

    let (cached, report) = run(&dir, &file, "kept", "invalidate=0\n");
    assert!(cached < FILE_BYTES / 4, "invalidate=0: {cached} bytes read from the storage, the rest from memory");
    assert!(report.contains("job kept: page cache kept (invalidate=0)"), "{report}");
}
