//! Host statistics reports: JSON for `qpath stats` (same shape as the target's
//! where the two overlap: `queues` with `subnqn`, `cntlid`, `qid`, `commands`,
//! `outstanding`, `errors`, `reads`, `writes`, `latency`; `namespaces` with
//! `counters`) and Prometheus text exposition format 0.0.4, both from a
//! [`HostSnapshot`]. Serving them (a Unix socket, `GET /metrics`) is the
//! embedding program's business (`qpath bench --rpc-socket --metrics`).
//!
//! # Metric names (host)
//!
//! Labels: `ctrl` is the host's number for a controller (0, 1, ... in order of
//! first use, stable across reconnects), `traddr` its address, `subnqn` its
//! subsystem, `qid` the I/O queue id, `nsid` a namespace, `dir` one of read,
//! write, trim, sync.
//!
//! | name | labels | meaning |
//! | --- | --- | --- |
//! | `qpath_host_queue_ios_total` | ctrl, traddr, subnqn, qid, dir | I/Os completed on the queue (successes and errors) |
//! | `qpath_host_queue_bytes_total` | same + dir | bytes moved by successful I/Os |
//! | `qpath_host_queue_errors_total` | ctrl, traddr, subnqn, qid | I/Os completed with an error status |
//! | `qpath_host_queue_outstanding` | same | commands on the wire |
//! | `qpath_host_queue_waiting` | same | requests waiting for a tag or a connection |
//! | `qpath_host_queue_requeues_total` | same | requests sent around again (path error, reconnect) |
//! | `qpath_host_queue_busy_total` | same | submissions that found no free tag |
//! | `qpath_host_queue_connects_total` | same | connections installed (first one and reconnects) |
//! | `qpath_host_queue_failures_total` | same | connections that failed under I/O |
//! | `qpath_host_queue_latency_seconds` | same + dir, quantile (0.5, 0.99, 0.999); `_sum` (exact), `_count` | submit to completion, successful I/Os |
//! | `qpath_host_controller_info` | ctrl, traddr, subnqn, cntlid, state | always 1 |
//! | `qpath_host_controller_live` | ctrl, traddr, subnqn | 1 when live |
//! | `qpath_host_controller_reconnects_total` | same | association resets that reconnected |
//! | `qpath_host_controller_reauths_total` | same + result (`ok`, `failed`) | re-authentications of the live controller (`failed`: a queue's transaction failed) |
//! | `qpath_host_controller_ios_total` | same + dir | I/Os over its queues |
//! | `qpath_host_controller_errors_total` | same | errors over its queues |
//! | `qpath_host_path_ios_total` | subnqn, nsid, ctrl, traddr, dir | I/Os whose last try was this path |
//! | `qpath_host_path_bytes_total` | same + dir | bytes |
//! | `qpath_host_path_errors_total` | subnqn, nsid, ctrl, traddr | errors |
//! | `qpath_host_path_latency_seconds` | same + dir, quantile | submit to completion |
//! | `qpath_host_namespace_ios_total` | subnqn, nsid, dir | I/Os of the namespace (all paths, all contexts) |
//! | `qpath_host_namespace_bytes_total` | same + dir | bytes |
//! | `qpath_host_namespace_errors_total` | subnqn, nsid | I/Os failed to the caller (no-path failures included) |
//! | `qpath_host_namespace_latency_seconds` | same + dir, quantile | submit to completion |
//! | `qpath_host_contexts` | | contexts publishing now |
//!
//! Counters come from the contexts' last publish (every
//! `ContextOptions::stats_interval`, and when a context is dropped), so they lag
//! the I/O by at most one interval and only grow.

use std::fmt::Write as _;

use blk::{Direction, QueueStats};
use serde_json::{Value, json};

use crate::stats::{HostSnapshot, HostStats};

const DIRS: [(Direction, &str); 4] =
    [(Direction::Read, "read"), (Direction::Write, "write"), (Direction::Trim, "trim"), (Direction::Sync, "sync")];

#[allow(clippy::cast_precision_loss)] // report values
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// One direction's latency as JSON (µs), the target's `LatencyReport` shape.
fn latency_json(s: &QueueStats, dir: Direction) -> Value {
    let d = s.direction(dir);
    let sum = d.summary();
    json!({
        "ios": d.ios, "mean_us": sum.mean_ns / 1000.0, "p50_us": us(sum.p50_ns), "p99_us": us(sum.p99_ns),
        "p99_9_us": us(sum.p99_9_ns), "max_us": us(sum.max_ns),
    })
}

/// Latency per direction that saw I/O.
fn latency_map(s: &QueueStats) -> Value {
    let m: serde_json::Map<String, Value> = DIRS
        .iter()
        .filter(|(d, _)| s.direction(*d).ios > 0)
        .map(|(d, name)| ((*name).to_string(), latency_json(s, *d)))
        .collect();
    Value::Object(m)
}

fn io_counts(s: &QueueStats) -> Value {
    let r = s.direction(Direction::Read);
    let w = s.direction(Direction::Write);
    json!({
        "ios": s.ios(), "bytes": s.bytes(), "errors": s.errors(),
        "reads": r.ios, "writes": w.ios, "read_bytes": r.bytes, "write_bytes": w.bytes,
    })
}

fn with(mut base: Value, extra: Value) -> Value {
    if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
        b.extend(e);
    }
    base
}

/// The host's statistics as JSON (the `stats` method of a host RPC socket).
pub fn stats_json(hub: &HostStats) -> Value {
    snapshot_json(&hub.snapshot())
}

/// A snapshot as JSON.
pub fn snapshot_json(s: &HostSnapshot) -> Value {
    let queues: Vec<Value> = s
        .queues
        .iter()
        .map(|q| {
            let st = &q.totals.stats;
            with(
                json!({
                    "ctrl": q.ctrl, "traddr": q.traddr.to_string(), "subnqn": q.subnqn, "cntlid": q.cntlid,
                    "qid": q.qid, "context": q.context, "connected": q.connected,
                    "secure_channel": q.secure_channel.map(|s| s.to_string()),
                    "commands": st.ios() + q.outstanding, "outstanding": q.outstanding, "waiting": q.waiting,
                    "requeues": st.requeues, "busy": st.busy,
                    "connects": q.totals.connects, "failures": q.totals.failures, "latency": latency_map(st),
                }),
                io_counts(st),
            )
        })
        .collect();
    let controllers: Vec<Value> = s
        .controllers
        .iter()
        .map(|c| {
            with(
                json!({
                    "ctrl": c.ctrl, "traddr": c.traddr.to_string(), "subnqn": c.subnqn, "cntlid": c.cntlid,
                    "state": format!("{:?}", c.state).to_lowercase(), "present": c.present,
                    "reconnects": c.reconnects, "io_queues": c.io_queues, "queues_used": c.queues_used,
                    "reauths": c.reauths, "reauth_failures": c.reauth_failures, "admin_wakeups": c.admin_wakeups,
                    "outstanding": c.outstanding, "failures": c.totals.failures, "last_error": c.last_error,
                }),
                io_counts(&c.totals.stats),
            )
        })
        .collect();
    let paths: Vec<Value> = s
        .paths
        .iter()
        .map(|p| {
            with(
                json!({
                    "subnqn": p.subnqn, "namespace_nsid": p.namespace_nsid, "nsid": p.nsid, "ctrl": p.ctrl,
                    "traddr": p.traddr.map(|a| a.to_string()), "latency": latency_map(&p.stats),
                }),
                io_counts(&p.stats),
            )
        })
        .collect();
    let namespaces: Vec<Value> = s
        .namespaces
        .iter()
        .map(|n| {
            let r = n.stats.direction(Direction::Read);
            let w = n.stats.direction(Direction::Write);
            json!({
                "subnqn": n.subnqn, "multipath": n.multipath, "paths": n.paths, "devices_open": n.devices_open,
                "no_path_errors": n.no_path_errors,
                "counters": {
                    "nsid": n.nsid, "reads": r.ios, "writes": w.ios, "read_bytes": r.bytes, "write_bytes": w.bytes,
                    "errors": n.errors(),
                },
                "latency": latency_map(&n.stats),
            })
        })
        .collect();
    json!({
        "side": "host", "contexts": s.contexts_live,
        "queues": queues, "controllers": controllers, "paths": paths, "namespaces": namespaces,
        "totals": {
            "ios": s.queue_ios(), "io_errors": s.io_errors(), "reconnects": s.reconnects(),
            "queue_failures": s.queue_failures(),
        },
    })
}

/// Escapes a Prometheus label value.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
}

/// A summary's quantiles, and its `_sum` (exact, seconds) and `_count` (the successful I/Os
/// the quantiles cover), per direction.
fn quantiles(out: &mut String, name: &str, labels: &str, s: &QueueStats) {
    #[allow(clippy::cast_precision_loss)]
    let secs = |ns: u64| ns as f64 / 1e9;
    for (d, dname) in DIRS {
        let x = s.direction(d);
        let sum = x.summary();
        if sum.count == 0 {
            continue;
        }
        for (q, v) in [("0.5", sum.p50_ns), ("0.99", sum.p99_ns), ("0.999", sum.p99_9_ns)] {
            let _ = writeln!(out, "{name}{{{labels},dir=\"{dname}\",quantile=\"{q}\"}} {}", secs(v));
        }
        let _ = writeln!(out, "{name}_sum{{{labels},dir=\"{dname}\"}} {}", secs(x.latency_ns_sum));
        let _ = writeln!(out, "{name}_count{{{labels},dir=\"{dname}\"}} {}", sum.count);
    }
}

fn per_dir(out: &mut String, name: &str, labels: &str, s: &QueueStats, bytes: bool) {
    for (d, dname) in DIRS {
        let x = s.direction(d);
        let v = if bytes { x.bytes } else { x.ios };
        let _ = writeln!(out, "{name}{{{labels},dir=\"{dname}\"}} {v}");
    }
}

/// The host's metrics in Prometheus text exposition format 0.0.4.
pub fn render(hub: &HostStats) -> String {
    render_snapshot(&hub.snapshot())
}

/// A snapshot in Prometheus text exposition format 0.0.4.
pub fn render_snapshot(s: &HostSnapshot) -> String {
    let mut out = String::with_capacity(4096 + 2048 * s.queues.len());
    queue_families(&mut out, s);
    controller_families(&mut out, s);
    path_families(&mut out, s);
    namespace_families(&mut out, s);
    help(&mut out, "qpath_host_contexts", "gauge", "Contexts publishing statistics now.");
    let _ = writeln!(out, "qpath_host_contexts {}", s.contexts_live);
    out
}

/// Per queue: I/Os, bytes, errors, outstanding, waiting, requeues, busy, connects,
/// failures and latency.
fn queue_families(out: &mut String, s: &HostSnapshot) {
    let qlabels: Vec<String> = s
        .queues
        .iter()
        .map(|q| format!("ctrl=\"{}\",traddr=\"{}\",subnqn=\"{}\",qid=\"{}\"", q.ctrl, q.traddr, esc(&q.subnqn), q.qid))
        .collect();
    help(out, "qpath_host_queue_ios_total", "counter", "I/Os completed on the queue, by direction.");
    for (q, l) in s.queues.iter().zip(&qlabels) {
        per_dir(out, "qpath_host_queue_ios_total", l, &q.totals.stats, false);
    }
    help(out, "qpath_host_queue_bytes_total", "counter", "Bytes moved by successful I/Os, by direction.");
    for (q, l) in s.queues.iter().zip(&qlabels) {
        per_dir(out, "qpath_host_queue_bytes_total", l, &q.totals.stats, true);
    }
    let scalar =
        |out: &mut String, name: &str, kind: &str, text: &str, f: &dyn Fn(&crate::stats::QueueSnapshot) -> u64| {
            help(out, name, kind, text);
            for (q, l) in s.queues.iter().zip(&qlabels) {
                let _ = writeln!(out, "{name}{{{l}}} {}", f(q));
            }
        };
    scalar(out, "qpath_host_queue_errors_total", "counter", "I/Os completed with an error status.", &|q| {
        q.totals.stats.errors()
    });
    scalar(out, "qpath_host_queue_outstanding", "gauge", "Commands on the wire.", &|q| q.outstanding);
    scalar(out, "qpath_host_queue_waiting", "gauge", "Requests waiting for a tag or a connection.", &|q| q.waiting);
    scalar(out, "qpath_host_queue_requeues_total", "counter", "Requests sent around again.", &|q| {
        q.totals.stats.requeues
    });
    scalar(out, "qpath_host_queue_busy_total", "counter", "Submissions that found no free tag.", &|q| {
        q.totals.stats.busy
    });
    scalar(out, "qpath_host_queue_connects_total", "counter", "Connections installed on the queue.", &|q| {
        q.totals.connects
    });
    scalar(out, "qpath_host_queue_failures_total", "counter", "Connections that failed under I/O.", &|q| {
        q.totals.failures
    });
    help(out, "qpath_host_queue_latency_seconds", "summary", "I/O latency, submit to completion.");
    for (q, l) in s.queues.iter().zip(&qlabels) {
        quantiles(out, "qpath_host_queue_latency_seconds", l, &q.totals.stats);
    }
}

/// Per controller: identity and state, liveness, reconnects, re-authentications, I/Os, errors.
fn controller_families(out: &mut String, s: &HostSnapshot) {
    let clabels: Vec<String> = s
        .controllers
        .iter()
        .map(|c| format!("ctrl=\"{}\",traddr=\"{}\",subnqn=\"{}\"", c.ctrl, c.traddr, esc(&c.subnqn)))
        .collect();
    help(out, "qpath_host_controller_info", "gauge", "Controller identity and state (always 1).");
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let state = format!("{:?}", c.state).to_lowercase();
        let _ = writeln!(out, "qpath_host_controller_info{{{l},cntlid=\"{}\",state=\"{state}\"}} 1", c.cntlid);
    }
    help(out, "qpath_host_controller_live", "gauge", "1 when the controller is live.");
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let live = u8::from(c.present && c.state == crate::controller::CtrlState::Live);
        let _ = writeln!(out, "qpath_host_controller_live{{{l}}} {live}");
    }
    help(out, "qpath_host_controller_reconnects_total", "counter", "Association resets that reconnected.");
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let _ = writeln!(out, "qpath_host_controller_reconnects_total{{{l}}} {}", c.reconnects);
    }
    help(
        out,
        "qpath_host_controller_reauths_total",
        "counter",
        "Re-authentications of the live controller, by result (failed: a queue's transaction failed).",
    );
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let _ = writeln!(out, "qpath_host_controller_reauths_total{{{l},result=\"ok\"}} {}", c.reauths);
        let _ = writeln!(out, "qpath_host_controller_reauths_total{{{l},result=\"failed\"}} {}", c.reauth_failures);
    }
    help(
        out,
        "qpath_host_controller_admin_wakeups_total",
        "counter",
        "Times the controller's admin thread woke (keep-alives, answers, events, requests).",
    );
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let _ = writeln!(out, "qpath_host_controller_admin_wakeups_total{{{l}}} {}", c.admin_wakeups);
    }
    help(out, "qpath_host_controller_ios_total", "counter", "I/Os completed over the controller's queues.");
    for (c, l) in s.controllers.iter().zip(&clabels) {
        per_dir(out, "qpath_host_controller_ios_total", l, &c.totals.stats, false);
    }
    help(out, "qpath_host_controller_errors_total", "counter", "Errors over the controller's queues.");
    for (c, l) in s.controllers.iter().zip(&clabels) {
        let _ = writeln!(out, "qpath_host_controller_errors_total{{{l}}} {}", c.totals.stats.errors());
    }
}

/// Per path of a namespace: I/Os, bytes, errors and latency.
fn path_families(out: &mut String, s: &HostSnapshot) {
    let plabels: Vec<String> = s
        .paths
        .iter()
        .map(|p| {
            let traddr = p.traddr.map_or_else(String::new, |a| a.to_string());
            format!("subnqn=\"{}\",nsid=\"{}\",ctrl=\"{}\",traddr=\"{traddr}\"", esc(&p.subnqn), p.nsid, p.ctrl)
        })
        .collect();
    help(out, "qpath_host_path_ios_total", "counter", "I/Os whose last try was this path, by direction.");
    for (p, l) in s.paths.iter().zip(&plabels) {
        per_dir(out, "qpath_host_path_ios_total", l, &p.stats, false);
    }
    help(out, "qpath_host_path_bytes_total", "counter", "Bytes moved through the path, by direction.");
    for (p, l) in s.paths.iter().zip(&plabels) {
        per_dir(out, "qpath_host_path_bytes_total", l, &p.stats, true);
    }
    help(out, "qpath_host_path_errors_total", "counter", "I/Os that failed after their last try on the path.");
    for (p, l) in s.paths.iter().zip(&plabels) {
        let _ = writeln!(out, "qpath_host_path_errors_total{{{l}}} {}", p.stats.errors());
    }
    help(out, "qpath_host_path_latency_seconds", "summary", "I/O latency through the path, submit to completion.");
    for (p, l) in s.paths.iter().zip(&plabels) {
        quantiles(out, "qpath_host_path_latency_seconds", l, &p.stats);
    }
}

/// Per namespace: I/Os, bytes, errors and latency.
fn namespace_families(out: &mut String, s: &HostSnapshot) {
    let nlabels: Vec<String> =
        s.namespaces.iter().map(|n| format!("subnqn=\"{}\",nsid=\"{}\"", esc(&n.subnqn), n.nsid)).collect();
    help(out, "qpath_host_namespace_ios_total", "counter", "I/Os of the namespace, by direction.");
    for (n, l) in s.namespaces.iter().zip(&nlabels) {
        per_dir(out, "qpath_host_namespace_ios_total", l, &n.stats, false);
    }
    help(out, "qpath_host_namespace_bytes_total", "counter", "Bytes moved on the namespace, by direction.");
    for (n, l) in s.namespaces.iter().zip(&nlabels) {
        per_dir(out, "qpath_host_namespace_bytes_total", l, &n.stats, true);
    }
    help(out, "qpath_host_namespace_errors_total", "counter", "I/Os of the namespace that failed to the caller.");
    for (n, l) in s.namespaces.iter().zip(&nlabels) {
        let _ = writeln!(out, "qpath_host_namespace_errors_total{{{l}}} {}", n.errors());
    }
    help(out, "qpath_host_namespace_latency_seconds", "summary", "I/O latency, submit to completion.");
    for (n, l) in s.namespaces.iter().zip(&nlabels) {
        quantiles(out, "qpath_host_namespace_latency_seconds", l, &n.stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{ControllerSnapshot, NamespaceSnapshot, PathSnapshot, QueueSnapshot, QueueTotals};

    fn sample() -> HostSnapshot {
        let mut st = QueueStats::new();
        for i in 0..100 {
            st.record(Direction::Read, 4096, 20_000 + i, blk::Outcome::Success);
        }
        st.record(Direction::Write, 4096, 30_000, blk::Outcome::Error);
        let traddr = "127.0.0.1:4420".parse().unwrap();
        let totals = QueueTotals { stats: st.clone(), connects: 1, failures: 0 };
        HostSnapshot {
            contexts_live: 1,
            queues: vec![QueueSnapshot {
                ctrl: 0,
                traddr,
                subnqn: "nqn.x:\"q\"".into(),
                cntlid: 3,
                qid: 1,
                context: Some(0),
                connected: true,
                outstanding: 2,
                waiting: 0,
                secure_channel: Some(crate::stats::SecureChannel {
                    record_path: "tls1.3-kernel",
                    suite: "TLS_AES_128_GCM_SHA256",
                }),
                totals: totals.clone(),
            }],
            controllers: vec![ControllerSnapshot {
                ctrl: 0,
                traddr,
                subnqn: "nqn.x:\"q\"".into(),
                cntlid: 3,
                state: crate::controller::CtrlState::Live,
                present: true,
                reconnects: 0,
                reauths: 2,
                reauth_failures: 1,
                admin_wakeups: 7,
                io_queues: 2,
                queues_used: 1,
                outstanding: 2,
                last_error: None,
                totals,
            }],
            paths: vec![PathSnapshot {
                subnqn: "nqn.x:\"q\"".into(),
                namespace_nsid: 1,
                nsid: 1,
                ctrl: 0,
                traddr: Some(traddr),
                stats: st.clone(),
            }],
            namespaces: vec![NamespaceSnapshot {
                subnqn: "nqn.x:\"q\"".into(),
                nsid: 1,
                multipath: false,
                paths: 1,
                devices_open: 1,
                no_path_errors: 1,
                stats: st,
            }],
        }
    }

    #[test]
    fn json_has_the_target_columns_and_host_sections() {
        let v = snapshot_json(&sample());
        assert_eq!(v["side"], "host");
        let q = &v["queues"][0];
        assert_eq!((q["reads"].as_u64(), q["writes"].as_u64(), q["errors"].as_u64()), (Some(100), Some(1), Some(1)));
        assert_eq!(q["commands"], 103, "completed plus outstanding");
        assert_eq!(q["secure_channel"], "tls1.3-kernel TLS_AES_128_GCM_SHA256", "the record path and suite");
        assert!(q["latency"]["read"]["p99_us"].as_f64().unwrap() > 19.0);
        assert!(q["latency"].get("trim").is_none(), "idle directions are left out");
        assert_eq!(v["controllers"][0]["state"], "live");
        assert_eq!((&v["controllers"][0]["reauths"], &v["controllers"][0]["reauth_failures"]), (&2.into(), &1.into()));
        assert_eq!(v["controllers"][0]["admin_wakeups"], 7);
        assert_eq!(v["namespaces"][0]["counters"]["errors"], 2, "no-path failures count as errors");
        assert_eq!(v["totals"]["io_errors"], 2);
    }

    #[test]
    fn prometheus_text_is_well_formed() {
        let text = render_snapshot(&sample());
        let mut families = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                assert!(families.insert(rest.split(' ').next().unwrap().to_string()), "one TYPE per family: {line}");
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let name = series.split('{').next().unwrap();
            // A summary's _sum and _count samples belong to its family.
            let family = ["_sum", "_count"]
                .iter()
                .find_map(|sfx| name.strip_suffix(sfx).filter(|f| families.contains(*f)))
                .unwrap_or(name);
            assert!(families.contains(family), "{line} has no TYPE line before it");
            assert_eq!(series.matches('{').count(), series.matches('}').count(), "{line}");
        }
        assert!(text.contains(
            "qpath_host_queue_ios_total{ctrl=\"0\",traddr=\"127.0.0.1:4420\",subnqn=\"nqn.x:\\\"q\\\"\",qid=\"1\",dir=\"read\"} 100"
        ));
        assert!(text.contains("qpath_host_namespace_errors_total{subnqn=\"nqn.x:\\\"q\\\"\",nsid=\"1\"} 2"));
        assert!(text.contains("qpath_host_queue_latency_seconds{") && text.contains("quantile=\"0.99\""));
        let reauths =
            "qpath_host_controller_reauths_total{ctrl=\"0\",traddr=\"127.0.0.1:4420\",subnqn=\"nqn.x:\\\"q\\\"\"";
        assert!(text.contains(&format!("{reauths},result=\"ok\"}} 2")), "{text}");
        assert!(text.contains(&format!("{reauths},result=\"failed\"}} 1")), "{text}");
        assert!(text.contains(
            "qpath_host_controller_admin_wakeups_total{ctrl=\"0\",traddr=\"127.0.0.1:4420\",subnqn=\"nqn.x:\\\"q\\\"\"} 7"
        ));
    }
}
