//! Golden test: with the statistics of seed 000's fio run, the text report reproduces
//! fio's output line for line (fio 3.19's layout, which 3.33 keeps for these lines).
//! Percentile values depend on the histogram (fio's log-linear buckets vs our HDR
//! histogram), so those lines are compared with digits masked; everything else exactly.

use qpath_bench::job::JobFile;
use qpath_bench::report::text::{group_status, job_headers, job_status};
use qpath_bench::report::{JobReport, group_stats};
use qpath_bench::stats::{LatHist, LatStat, ThreadStat};

const SEED_JOB: &str = "[global]\nioengine=libaio\nrandrepeat=1\ndirect=1\ngroup_reporting\nblocksize=512k\n\
    iodepth=1\nnumjobs=1\nruntime=15\ntime_based\nrw=randread\n\n[JOB1]\ncpus_allowed=1\nfilename=/dev/nvme4n1\n";

fn seed_output() -> Vec<String> {
    // The excerpt ends before fio's "Disk stats" block, after its blank separator line.
    include_str!("data/seed-000-fio-3.19.txt").trim_end().lines().map(str::to_string).collect()
}

/// The seed's job, measured: 7359 reads of 512 KiB in 15001 ms.
fn seed_report() -> JobReport {
    let file = JobFile::parse(SEED_JOB, "seed-000").unwrap();
    let spec = &file.jobs[0];
    let n = 7359u64;
    let mut st = ThreadStat::with_hists([true, false], false, true, false, false);
    {
        let d = &mut st.dirs[0];
        d.io_bytes = n * 512 * 1024;
        d.total_ios = n;
        d.runtime_ms = 15001;
        d.slat = LatStat::from_summary(70_000, 598_000, 78_350.0, 7_760.0, n);
        d.clat = LatStat::from_summary(1_662_000, 2_743_000, 1_958_350.0, 135_180.0, n);
        d.lat = LatStat::from_summary(1_739_000, 2_901_000, 2_036_920.0, 135_450.0, n);
        d.bw = LatStat::from_summary(248_832, 254_976, 251_490.55, 1_468.84, 29);
        d.iops = LatStat::from_summary(486, 498, 491.17, 2.90, 29);
        // Put samples at fio's reported percentile values.
        let points = [
            (1.0, 1729),
            (5.0, 1778),
            (10.0, 1811),
            (20.0, 1844),
            (30.0, 1876),
            (40.0, 1909),
            (50.0, 1942),
            (60.0, 1975),
            (70.0, 2008),
            (80.0, 2057),
            (90.0, 2147),
            (95.0, 2212),
            (99.0, 2376),
            (99.5, 2442),
            (99.9, 2540),
            (99.95, 2671),
            (99.99, 2737),
            (100.0, 2743),
        ];
        let h: &mut LatHist = d.clat_hist.as_mut().unwrap();
        let mut placed = 0u64;
        for (p, us) in points {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let upto = ((p / 100.0) * n as f64).ceil() as u64;
            if upto > placed {
                h.record_n(us * 1000 - 999, upto - placed);
                placed = upto;
            }
        }
    }
    st.lat_m[0] = 5054; // 2=68.68%
    st.lat_m[1] = 2305; // 4=31.32%
    st.usr_us = 28_000;
    st.sys_us = 612_000;
    st.ctx = 7359;
    st.minf = 138;
    st.total_run_time_ms = 15001;
    st.io_u_map[0] = n;
    st.io_u_submit[1] = n;
    st.io_u_complete[1] = n;
    st.total_submit = n;
    st.total_complete = n;
    JobReport {
        name: spec.name.clone(),
        description: None,
        groupid: 0,
        members: 1,
        error: 0,
        verror: String::new(),
        pid: 185_197,
        options: spec.options.clone(),
        stat: st,
        clat_percentiles: spec.clat_percentiles,
        lat_percentiles: spec.lat_percentiles,
        slat_percentiles: spec.slat_percentiles,
        percentile_list: spec.percentile_list.clone(),
        percentile_precision: spec.percentile_precision,
        sig_figs: spec.sig_figs,
        kb_base: spec.kb_base,
        latency_depth: spec.iodepth,
        engines: vec!["libaio".into()],
        targets: vec![spec.target.raw.clone()],
        shape: (spec.rw_str().into(), 512 * 1024, 1),
        multipath: None,
        page_cache: None,
        fast_io_fail_tmo_s: None,
    }
}

fn mask_digits(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_digit() { '9' } else { c }).collect()
}

#[test]
fn header_lines_match_seed_000() {
    let file = JobFile::parse(SEED_JOB, "seed-000").unwrap();
    let jobs: Vec<_> = file.jobs.iter().map(|j| (j, "libaio")).collect();
    let ours = job_headers(&jobs, "fio-3.19");
    let ours: Vec<&str> = ours.lines().collect();
    let want = seed_output();
    assert_eq!(ours[0], want[0]);
    assert_eq!(ours[1], want[1]);
    // Deliberate difference: jobs run as threads, so we say so.
    assert_eq!(want[2], "Starting 1 process");
    assert_eq!(ours[2], "Starting 1 thread");
}

#[test]
fn job_and_group_blocks_match_seed_000() {
    let r = seed_report();
    let groups = group_stats(std::slice::from_ref(&r), 1);
    let mut out = String::from("\n");
    job_status(&mut out, &r, &groups[0], "Mon Oct  2 15:22:39 2023");
    group_status(&mut out, &groups[0]);
    let ours: Vec<&str> = out.lines().collect();
    let want = seed_output();
    // The report starts after "Starting 1 process".
    let want: Vec<&str> = want[3..].iter().map(String::as_str).collect();
    let mut diffs = Vec::new();
    for (i, (o, w)) in ours.iter().zip(want.iter()).enumerate() {
        let percentile_row = w.starts_with("     |");
        let same = if percentile_row { mask_digits(o) == mask_digits(w) } else { o == w };
        if !same {
            diffs.push(format!("line {i}:\n  fio : {w:?}\n  ours: {o:?}"));
        }
    }
    if ours.len() != want.len() {
        diffs.push(format!("{} lines vs fio's {}", ours.len(), want.len()));
    }
    assert!(diffs.is_empty(), "text layout differs from fio:\n{}\n--- ours ---\n{out}", diffs.join("\n"));
}

#[test]
fn json_of_the_seed_report_has_fio_units_and_baseline_ratios() {
    use qpath_bench::report::{Baseline, Report};
    let r = seed_report();
    let groups = group_stats(std::slice::from_ref(&r), 1);
    let rep = Report {
        version: "qpath-test".into(),
        time: std::time::UNIX_EPOCH,
        elapsed_sec: 16,
        global_options: vec![("rw".into(), Some("randread".into())), ("time_based".into(), None)],
        jobs: vec![r],
        groups,
        notes: vec!["a note".into()],
        baselines: vec![Baseline {
            label: "reference".into(),
            rw: "randread".into(),
            bs: 512 * 1024,
            iodepth: 1,
            iops: 980.0,
            lat_mean_ns: Some(1_018_460.0),
        }],
        physical: None,
        target: None,
    };
    let text = qpath_bench::report::json::render(&rep, false);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let read = &v["jobs"][0]["read"];
    // fio units: bytes, KiB, KiB/s, ms, ns.
    assert_eq!(read["io_bytes"], 7359u64 * 512 * 1024);
    assert_eq!(read["io_kbytes"], 7359u64 * 512);
    assert_eq!(read["bw"], 251_170);
    assert_eq!(read["runtime"], 15001);
    assert_eq!(read["slat_ns"]["min"], 70_000);
    assert_eq!(read["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap().div_ceil(1000), 2376);
    assert_eq!(read["bw_samples"], 29);
    assert_eq!(v["time"], "Thu Jan  1 00:00:00 1970");
    assert_eq!(v["global options"]["rw"], "randread");
    assert!(v["global options"].get("time_based").is_none(), "fio drops options without a value");
    let b = &v["qpath"]["jobs"][0]["reference"];
    assert!((b["iops_ratio"].as_f64().unwrap() - 490.567 / 980.0).abs() < 1e-3, "{b}");
    assert!((b["lat_ratio"].as_f64().unwrap() - 2.0).abs() < 1e-3, "{b}");
    assert_eq!(v["qpath"]["notes"][0], "a note");
    assert!(text.contains("\"iops\" : 490.567296,"), "fio prints floats with %f");
}
