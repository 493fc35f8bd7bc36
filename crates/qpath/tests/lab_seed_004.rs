//! `qpath lab seed-004` runs briefly end to end: 1 queue, N queues on one context and
//! N queues on N contexts; the table's shape, the JSON with its goals and per-queue
//! counts, the SVG plot, and no I/O errors. Speed and whether the goals are met are the
//! lab's to report, not this test's.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod run_bounded;

/// Three cases of 0.5 s + 0.2 s warm-up (`--quick`), each with its own target, plus drains.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn seed_004_lab_runs_every_layout_without_errors() {
    let dir = std::env::temp_dir().join(format!("qpath-lab-seed-004-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("seed-004.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["lab", "seed-004", "--quick", "--streams", "2", "--queues", "2", "--json", "--plot"]).arg(&plot);
    let (status, stdout, stderr) = run_bounded::run(cmd, RUN_TIMEOUT);
    assert!(status.success(), "qpath lab seed-004 failed:\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(v["lab"], "seed-004");
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("32 CPUs")), "the notes say how it was scaled");
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("win mechanism")), "and where the win comes from");
    run_bounded::full_rows(&v, 3, &["errors"]);
    let goals = v["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2, "never below, and the seed's +20%");
    assert!(goals.iter().all(|g| g["ratio"].is_number() || g["ratio"].is_null()));

    let cases = v["cases"].as_array().unwrap();
    // (queues used, contexts) of (i), (ii), (iii).
    let shapes = [(1usize, 1usize), (2, 1), (2, 2)];
    assert_eq!(cases.len(), shapes.len());
    for (c, (queues, contexts)) in cases.iter().zip(shapes) {
        let name = c["case"].as_str().unwrap();
        assert_eq!(c["errors"], 0, "{name}");
        let ctxs = c["contexts"].as_array().unwrap();
        assert_eq!(ctxs.len(), contexts, "{name}: contexts");
        let mut used = Vec::new();
        for x in ctxs {
            assert_eq!(x["undrained"], 0, "{name}");
            assert!(x["ios"].as_u64().unwrap() > 0, "{name}: a context did I/O in the window");
            assert!(x["seconds"].as_f64().unwrap() > 0.0, "{name}: measured a window");
            let total = x["total_ios"].as_u64().unwrap();
            let per_queue = x["per_queue"].as_array().unwrap();
            let sum: u64 = per_queue.iter().map(|q| q["ios"].as_u64().unwrap()).sum();
            assert_eq!(sum, total, "{name}: the queues' counts add up to the context's");
            for q in per_queue {
                assert!(q["ios"].as_u64().unwrap() > 0, "{name}: queue {} carried I/O", q["queue"]);
                used.push(q["queue"].as_u64().unwrap());
            }
        }
        used.sort_unstable();
        used.dedup();
        assert_eq!(used.len(), queues, "{name}: queues that carried I/O, none owned twice");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Nq-1ctx"), "{svg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
