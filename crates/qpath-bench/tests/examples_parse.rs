//! Every job file in the repository's `examples/` parses without unknown options and
//! resolves to the engines and targets its comments promise; the local one runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use qpath_bench::engine::{Engine, EngineCtx, EngineFactory, EngineRegistry};
use qpath_bench::run::{RunOptions, StatusMode, run_jobs};
use qpath_bench::{Error, ErrorKind, JobFile, Result, TargetKind};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn load(name: &str) -> JobFile {
    let f = JobFile::load(&examples_dir().join(name)).unwrap();
    f.check_strict().unwrap_or_else(|e| panic!("{name}: {e}"));
    f
}

/// Stand-ins for the engines the qpath bin registers.
struct Named(&'static str);
impl EngineFactory for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn create(&self, _ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        Err(Error::new(ErrorKind::Engine, "stand-in"))
    }
}

fn registry() -> EngineRegistry {
    let mut r = EngineRegistry::with_local_engines();
    r.register(Arc::new(Named("qpath")));
    r.register(Arc::new(Named("qpath-passthru")));
    r
}

fn engines(f: &JobFile) -> Vec<String> {
    let r = registry();
    f.jobs.iter().map(|j| r.resolve(j).unwrap().factory.name().to_string()).collect()
}

fn remote(f: &JobFile, i: usize) -> &qpath_bench::RemoteTarget {
    match &f.jobs[i].target.kind {
        TargetKind::Remote(r) => r,
        other => panic!("job {i} is not remote: {other:?}"),
    }
}

#[test]
fn all_examples_parse_strictly() {
    let mut n = 0;
    for e in std::fs::read_dir(examples_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "fio") {
            let f = JobFile::load(&p).unwrap();
            assert!(f.unknown.is_empty(), "{}: {:?}", p.display(), f.unknown_line());
            n += 1;
        }
    }
    assert!(n >= 7, "expected the seed, quickstart and local-file examples, found {n}");
}

#[test]
fn seed_000() {
    let f = load("seed-000-qd1-512k-randread.fio");
    assert_eq!(f.jobs.len(), 1);
    assert_eq!(engines(&f), ["qpath"]);
    let j = &f.jobs[0];
    assert_eq!((j.bs[0].0, j.iodepth, j.rw_str()), (512 << 10, 1, "randread"));
    assert_eq!(j.cpus_allowed.as_ref().unwrap().cpus, vec![1]);
    assert_eq!(remote(&f, 0).subnqn, "nqn.2026-11.io.qpath:default");
}

#[test]
fn seed_001() {
    let f = load("seed-001-passthru-randread.fio");
    assert_eq!(engines(&f), ["qpath-passthru", "qpath"]);
    for j in &f.jobs {
        assert_eq!((j.bs[0].0, j.iodepth), (512, 128));
        assert_eq!(j.iodepth_batch_submit, 32);
        assert_eq!((j.iodepth_batch_complete_min, j.iodepth_batch_complete_max), (32, 32));
        assert_eq!(j.engine_option("hipri"), Some(None));
        assert!(j.engine_option("fixedbufs").is_some() && j.engine_option("registerfiles").is_some());
    }
    assert!(!f.jobs[0].direct && f.jobs[1].direct);
    assert_eq!(f.jobs[0].engine_option("cmd_type"), Some(Some("nvme")));
    assert_eq!(f.jobs[1].place.batch, 1);
}

#[test]
fn seed_002_tiobench() {
    let f = load("seed-002-tiobench.fio");
    assert_eq!(f.jobs.len(), 16);
    let groups: Vec<usize> = f.jobs.iter().map(|j| j.place.groupid).collect();
    assert_eq!(groups, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    assert!(f.jobs.iter().all(|j| j.runtime == Some(Duration::from_secs(60)) && j.size == Some(512 << 20)));
    assert_eq!(remote(&f, 0).subnqn, "nqn.2026-11.io.qpath:default");
    assert!(engines(&f).iter().all(|e| e == "qpath"));
}

#[test]
fn seed_003_wal_and_hogs() {
    let f = load("seed-003-wal-and-hogs.fio");
    assert_eq!(f.jobs.len(), 33);
    assert_eq!(remote(&f, 0).nsid, 1);
    assert_eq!(remote(&f, 32).nsid, 2);
    assert_eq!(f.jobs[0].iodepth, 10000);
    assert_eq!(f.jobs[32].filesize, Some(4 << 30));
    assert!(f.jobs.iter().all(|j| j.place.groupid == 0), "no stonewall: one group");
}

#[test]
fn seed_004_per_cpu() {
    let f = load("seed-004-per-cpu-randread.fio");
    let cpus: Vec<Vec<usize>> = f.jobs.iter().map(|j| j.cpus_for_thread().unwrap()).collect();
    assert_eq!(cpus, [vec![0], vec![1]]);
    assert!(f.jobs.iter().all(|j| j.iodepth == 64 && j.direct));
}

#[test]
fn quickstart_needs_the_embedded_target() {
    let f = load("quickstart.fio");
    assert!(f.needs_embedded_target());
    assert_eq!(engines(&f), ["qpath"; 4]);
    let shapes: Vec<(&str, u64, u32)> = f.jobs.iter().map(|j| (j.rw_str(), j.max_bs(), j.iodepth)).collect();
    assert_eq!(
        shapes,
        [("randread", 4096, 1), ("randread", 4096, 32), ("read", 128 << 10, 16), ("randwrite", 4096, 32)],
        "QD1 and sequential jobs give the baseline ratios"
    );
    assert_eq!(f.jobs[3].verify, qpath_bench::job::VerifyKind::Crc32c);
    let total: f64 = f.jobs.iter().map(|j| j.runtime.unwrap().as_secs_f64()).sum();
    assert!(total <= 12.0, "quickstart stays short: {total} s of jobs");
}

#[test]
fn local_file_runs() {
    let mut f = load("local-file.fio");
    assert_eq!(engines(&f), ["psync", "psync"]);
    let dir = std::env::temp_dir().join(format!("qpath-bench-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for j in &mut f.jobs {
        // Shorter and in a private directory, otherwise as written.
        j.runtime = Some(Duration::from_millis(200));
        j.target.kind = TargetKind::Local(dir.join("data"));
    }
    let opts = RunOptions { status: StatusMode::Never, ..RunOptions::default() };
    let run = run_jobs(&f, &registry(), &opts, &mut std::io::sink()).unwrap();
    assert!(!run.failed(), "{:?}", run.jobs.iter().map(|j| &j.outcome.error).collect::<Vec<_>>());
    assert!(run.jobs[1].outcome.stat.verify.checked > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
