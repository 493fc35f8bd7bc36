//! A multipath bench job (`paths=2`) over the embedded target's two ports: while it runs,
//! one port drops every connection and refuses reconnects for a while. The job ends with
//! zero I/O errors and zero verify failures, and its per-path counts add up to its I/Os.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use qpath_bench::embedded_target::{self as embedded, Embedded, EmbeddedOptions};
use qpath_bench::engine::EngineRegistry;
use qpath_bench::engine::remote::Controllers;
use qpath_bench::{JobFile, Report, RunOptions, StatusMode};
use target::reactor::PollMode;

const JOB: &str = "\
[global]
ioengine=qpath
bs=4k
iodepth=8
size=16m
time_based
runtime=3s
paths=2
mpath_policy=round-robin

[writer]
rw=randwrite
verify=crc32c

[reader]
rw=randread
offset=32m
";

#[test]
fn a_dropped_path_fails_no_io_of_a_multipath_job() {
    let target = Embedded::start(EmbeddedOptions {
        poll: PollMode::Block,
        reactor_cpu: None,
        namespaces: vec![(1, embedded::NAMESPACE_BYTES_MIN)],
        tcp_congestion: target::registry::TcpCongestion::System,
    })
    .unwrap();
    let mut file = JobFile::parse(JOB, "mpath-drop").unwrap();
    file.check_strict().unwrap();
    let jobs = embedded::embedded_jobs(&file, false);
    assert_eq!(jobs.len(), 2, "both jobs go to the embedded target");
    target.redirect(&mut file, &jobs).unwrap();
    let ctrls = Arc::new(Controllers::for_jobs(&file));
    let registry = EngineRegistry::with_all_engines(&ctrls);
    let opts = RunOptions { status: StatusMode::Never, ..RunOptions::default() };

    let port = target.port(1);
    let result = std::thread::scope(|s| {
        let run = s.spawn(|| qpath_bench::run::run_jobs(&file, &registry, &opts, &mut std::io::sink()));
        // Path 2 goes away 1 s in (connections dropped, reconnects refused) and comes back 1 s later.
        std::thread::sleep(Duration::from_secs(1));
        port.faults.refuse_connects.store(true, Ordering::SeqCst);
        port.faults.drop_generation.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(1));
        port.faults.refuse_connects.store(false, Ordering::SeqCst);
        run.join().unwrap()
    });
    drop(registry);
    ctrls.disconnect_all();
    target.shutdown();
    let report = Report::from_run(&file, &result.unwrap());

    assert_eq!(report.jobs.len(), 2);
    for r in &report.jobs {
        assert_eq!(r.error, 0, "job {}: {}", r.name, r.verror);
        let ios: u64 = r.stat.dirs.iter().map(|d| d.total_ios).sum();
        assert!(ios > 0, "job {} did I/O", r.name);
        let m = r.multipath.as_ref().unwrap_or_else(|| panic!("job {} reports its paths", r.name));
        assert_eq!(m.policy, "round-robin");
        assert_eq!(m.paths.len(), 2, "{m:?}");
        assert!(m.paths.iter().all(|p| p.ios > 0), "round-robin used both paths before the drop: {m:?}");
        assert!(m.paths[0].ios > m.paths[1].ios, "path 1 alone served while path 2 was down: {m:?}");
        assert_eq!(m.total_ios(), ios, "job {}: every I/O completed on exactly one path: {m:?}", r.name);
        let bytes: u64 = r.stat.dirs.iter().map(|d| d.io_bytes).sum();
        assert_eq!(m.paths.iter().map(|p| p.bytes).sum::<u64>(), bytes, "job {}", r.name);
    }
    // The counts are in qpath's part of both reports; fio's own fields stay as fio has them.
    let text = qpath_bench::report::text::render(&report);
    assert!(text.contains("multipath writer: policy=round-robin, 2 paths"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&qpath_bench::report::json::render(&report, false)).unwrap();
    let paths = &json["qpath"]["jobs"][0]["multipath"]["paths"];
    assert_eq!(paths.as_array().map(Vec::len), Some(2), "{json}");
    assert!(json["jobs"][0].get("multipath").is_none(), "fio's job object is untouched");
}
