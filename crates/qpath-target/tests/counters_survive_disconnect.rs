//! I/O, a scrape, the host disconnects, another scrape: every port and namespace `_total`
//! sample of /metrics and of the stats RPC is still there and no lower (I/O done after the
//! last tick included: a closing queue hands over what it counted), the closed queues'
//! own series are gone rather than lowered, and the exposition keeps each metric family's
//! lines together with summaries carrying `_sum` and `_count`.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::collections::BTreeMap;

use nvme::tcp::Digests;
use nvme::{Nsid, Status};
use qpath_target::metrics::{render, stats_json};
use support::*;

/// Samples by `name{labels}`, after checking the text format: a family's `# HELP` and
/// `# TYPE` come once, right before its samples, and every sample belongs to the family
/// announced last (a summary's `_sum` and `_count` included).
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut families = std::collections::BTreeSet::new();
    let (mut family, mut kind) = (String::new(), String::new());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').expect("TYPE name kind");
            assert!(families.insert(name.to_string()), "family {name} announced twice");
            (family, kind) = (name.to_string(), k.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("sample value");
        let name = key.split('{').next().unwrap();
        let ok = name == family
            || (kind == "summary" && (name == format!("{family}_sum") || name == format!("{family}_count")));
        assert!(ok, "sample {name} outside its family (last announced: {family})");
        out.insert(key.to_string(), value.parse::<f64>().expect("a number"));
    }
    out
}

#[test]
fn port_and_namespace_totals_survive_the_host_disconnecting() {
    let t = target();
    let mut h = Host::new(&t, 1);
    let cntlid = h.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    let block = pattern(4096, 3);
    for i in 0..10 {
        assert_eq!(q.write(1, i * 8, &block, 8192).status, Status::SUCCESS);
        assert_eq!(q.read(1, i * 8, 4096).0.status, Status::SUCCESS);
    }
    q.tick();
    let before = samples(&render(&t));
    assert_eq!(
        before["qpath_target_namespace_ios_total{subnqn=\"nqn.2024-01.io.qpath:test\",nsid=\"1\",dir=\"read\"}"],
        10.0
    );
    assert_eq!(before["qpath_target_port_ios_total{port=\"1\",dir=\"write\"}"], 10.0);
    let summary: Vec<_> = before.keys().filter(|k| k.starts_with("qpath_target_queue_latency_seconds_")).collect();
    assert_eq!(summary.len(), 4, "_sum and _count of reads and of writes: {summary:?}");
    let count = before.iter().find(|(k, _)| k.contains("latency_seconds_count") && k.contains("\"read\"")).unwrap();
    assert_eq!(*count.1, 10.0);
    // (The in-process clock does not move within one call: the sum's size is checked over
    // real sockets, in the qpath crate's observability test.)
    assert!(before.keys().any(|k| k.contains("latency_seconds_sum") && k.contains("\"read\"")));
    let js_before = stats_json(&t);

    // Five more reads after the last tick, then the host goes away without another tick.
    for _ in 0..5 {
        assert_eq!(q.read(1, 0, 4096).0.status, Status::SUCCESS);
    }
    q.disconnect();
    h.disconnect();
    // The reactor drops a released connection (and its queue's series with it).
    drop((q, h));
    let after = samples(&render(&t));
    for (k, v) in &before {
        let queue_series = k.contains("qid=\"");
        match after.get(k) {
            Some(a) if !queue_series => {
                if k.contains("_total{") {
                    assert!(a >= v, "{k} went down: {v} -> {a}");
                }
            }
            None if queue_series => {}
            Some(_) => panic!("{k}: the closed queue's series should be gone"),
            None => panic!("{k} disappeared after the host disconnected"),
        }
    }
    let ns_reads = "qpath_target_namespace_ios_total{subnqn=\"nqn.2024-01.io.qpath:test\",nsid=\"1\",dir=\"read\"}";
    assert_eq!(after[ns_reads], 15.0, "the reads after the last tick are handed over at close");
    assert_eq!(after["qpath_target_port_ios_total{port=\"1\",dir=\"read\"}"], 15.0);
    assert_eq!(after["qpath_target_port_connections{port=\"1\"}"], 0.0);

    // The stats RPC reads the same totals.
    let js = stats_json(&t);
    let port1 = |v: &serde_json::Value| v["ports"].as_array().unwrap().iter().find(|p| p["port"] == 1).unwrap().clone();
    assert_eq!(port1(&js_before)["ios"], 20);
    assert_eq!(port1(&js)["ios"], 25);
    assert_eq!(js["namespaces"][0]["counters"]["reads"], 15);
    assert_eq!(js["namespaces"][0]["counters"]["host_write_commands"], 10);
    assert!(js["queues"].as_array().unwrap().is_empty());

    // A new host finds the counts in the SMART log too.
    let mut h2 = Host::new(&t, 2);
    h2.admin_up(Digests::default());
    let cid = h2.cid();
    let (c, data) = h2.admin(nvme::Sqe::get_log_page(cid, Nsid(1), nvme::log::lid::SMART, 0, false, 512, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let s = nvme::log::SmartLog::decode(&data);
    assert_eq!((s.host_reads, s.host_writes), (15, 10));
}
