//! Run real fio (3.33, the Debian package) and `qpath bench` on the same job and the
//! same file, and compare the JSON key structure (key paths, nesting, value types) and
//! the sequence of text-report labels. Skips with a message when fio is not installed.
//!
//! Differences by design, excluded from the comparison:
//! - top-level `disk_util` (fio only): disk stats are not produced;
//! - top-level `qpath` (ours only): extras under a key fio does not use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use qpath_bench::{BenchArgs, EngineRegistry, JobFile, RunOptions, StatusMode};

fn fio_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("fio")).find(|p| p.is_file())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qpath-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The brief's job: psync, 4k randread and randwrite, 1 s, one file.
fn job_text(data: &Path) -> String {
    format!(
        "[global]\nioengine=psync\nfilename={}\nsize=16m\nbs=4k\nruntime=1\ntime_based\n\n\
         [rr]\nrw=randread\n\n[rw]\nrw=randwrite\n",
        data.display()
    )
}

/// Options that change the JSON's shape: group_reporting with clones, a mixed
/// workload, ramp_time, lat percentiles, a custom percentile list, a description.
fn grouped_job_text(data: &Path) -> String {
    format!(
        "[global]\nioengine=psync\nfilename={}\nsize=16m\nbs=4k\nruntime=1\ntime_based\n\
         ramp_time=200ms\ngroup_reporting\nlat_percentiles=1\npercentile_list=50:99:99.9\n\n\
         [mix]\ndescription=mixed 70/30, two clones\nrw=randrw\nrwmixread=70\nnumjobs=2\n",
        data.display()
    )
}

/// Key path -> type, with array elements folded into `[]`.
fn shape(v: &serde_json::Value, path: &str, out: &mut BTreeMap<String, &'static str>) {
    use serde_json::Value;
    let t = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(a) => {
            for x in a {
                shape(x, &format!("{path}/[]"), out);
            }
            "array"
        }
        Value::Object(o) => {
            for (k, x) in o {
                shape(x, &format!("{path}/{k}"), out);
            }
            "object"
        }
    };
    out.insert(path.to_string(), t);
}

fn run_ours(job: &Path, format: &str, output: &Path) {
    let args = BenchArgs {
        jobfile: Some(job.to_path_buf()),
        output_format: format.into(),
        output: Some(output.to_path_buf()),
        lenient: false,
        strict: false,
        job_args: Vec::new(),
    };
    let file = JobFile::load(job).unwrap();
    let opts = RunOptions { status: StatusMode::Never, ..RunOptions::default() };
    let outcome = qpath_bench::run_file(&file, &args, &EngineRegistry::with_local_engines(), &opts, &[]).unwrap();
    assert!(!outcome.failed, "our run failed");
}

fn run_fio(fio: &Path, job: &Path, format: &str, output: &Path) {
    let st = Command::new(fio)
        .arg(format!("--output-format={format}"))
        .arg(format!("--output={}", output.display()))
        .arg(job)
        .status()
        .expect("run fio");
    assert!(st.success(), "fio failed");
}

#[test]
fn json_key_structure_matches_fio() {
    json_structure_case("json", job_text, 2);
}

#[test]
fn json_key_structure_matches_fio_with_groups_and_percentiles() {
    json_structure_case("json-grouped", grouped_job_text, 1);
}

fn json_structure_case(name: &str, text: fn(&Path) -> String, jobs: usize) {
    let Some(fio) = fio_path() else {
        println!("SKIP: fio not installed");
        return;
    };
    let dir = scratch(name);
    let job = dir.join("job.fio");
    std::fs::write(&job, text(&dir.join("data"))).unwrap();
    let (fio_out, our_out) = (dir.join("fio.json"), dir.join("ours.json"));
    run_fio(&fio, &job, "json", &fio_out);
    run_ours(&job, "json", &our_out);
    let fio_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&fio_out).unwrap()).unwrap();
    let our_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&our_out).unwrap()).unwrap();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    shape(&fio_json, "", &mut a);
    shape(&our_json, "", &mut b);
    let skip = |k: &str| k.starts_with("/disk_util") || k.starts_with("/qpath");
    let mut diffs = Vec::new();
    for k in a.keys().chain(b.keys()).filter(|k| !skip(k)) {
        let (x, y) = (a.get(k), b.get(k));
        if x != y && !diffs.iter().any(|d: &String| d.starts_with(&format!("{k}:"))) {
            diffs.push(format!("{k}: fio={x:?} ours={y:?}"));
        }
    }
    for d in &diffs {
        println!("DIFF {d}");
    }
    assert!(diffs.is_empty(), "{} JSON structure differences from fio", diffs.len());
    assert_eq!(our_json["jobs"].as_array().unwrap().len(), jobs);
    assert_eq!(fio_json["jobs"].as_array().unwrap().len(), jobs);
    assert!(our_json["qpath"].is_object());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The label that starts a text-report line ("read: IOPS", "clat percentiles", ...),
/// or `None` for lines whose presence depends on the measured values.
fn label(line: &str) -> Option<String> {
    let t = line.trim_start();
    if line.starts_with("     |") || t.starts_with("lat (") || t.is_empty() {
        return None; // percentile rows and latency buckets vary with the numbers
    }
    if t.contains("(groupid=") {
        return Some("JOB (groupid=".into());
    }
    let end = t.find([':', '=']).unwrap_or(t.len());
    let mut l = t[..end].trim().to_string();
    // "clat (nsec)" vs "clat (usec)" and "bw (  KiB/s)" vs "bw (  MiB/s)" depend on the values.
    if let Some(i) = l.find(" (")
        && (l.ends_with("sec)") || l.ends_with("/s)"))
    {
        l.truncate(i);
    }
    Some(l)
}

#[test]
fn text_report_labels_match_fio() {
    let Some(fio) = fio_path() else {
        println!("SKIP: fio not installed");
        return;
    };
    let dir = scratch("text");
    let job = dir.join("job.fio");
    std::fs::write(&job, job_text(&dir.join("data"))).unwrap();
    let (fio_out, our_out) = (dir.join("fio.txt"), dir.join("ours.txt"));
    run_fio(&fio, &job, "normal", &fio_out);
    run_ours(&job, "normal", &our_out);
    let read = |p: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(p).unwrap();
        text.lines()
            // fio's disk stats are not produced; qpath's own section follows fio's lines.
            .take_while(|l| !l.starts_with("Disk stats") && *l != "qpath:")
            .filter(|l| !l.starts_with("fio-") && !l.starts_with("qpath-") && !l.starts_with("Starting "))
            .filter(|l| !l.contains("Laying out IO file"))
            .filter_map(label)
            .collect()
    };
    let (a, b) = (read(&fio_out), read(&our_out));
    if a != b {
        for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
            if x != y {
                println!("DIFF label {i}: fio={x:?} ours={y:?}");
            }
        }
    }
    assert_eq!(a, b, "text report label sequence differs from fio");
    let _ = std::fs::remove_dir_all(&dir);
}
