//! Statistics reports: per-queue tables with per-port and per-namespace
//! aggregates (JSON, for `qpath stats`), Prometheus text exposition, and a
//! minimal HTTP endpoint serving `/metrics`.
//!
//! # Metric names (target)
//!
//! | name | labels | meaning |
//! | --- | --- | --- |
//! | `qpath_target_queue_commands_total` | port, subnqn, cntlid, qid, reactor | commands received |
//! | `qpath_target_queue_outstanding` | same | commands in progress now |
//! | `qpath_target_queue_errors_total` | same | commands completed with an error status |
//! | `qpath_target_queue_ios_total` | same + dir | completed I/O commands (read, write, trim, sync) |
//! | `qpath_target_queue_bytes_total` | same + dir | bytes moved |
//! | `qpath_target_queue_latency_seconds` | same + dir, quantile (0.5, 0.99, 0.999); `_sum`, `_count` | service time of the successful I/Os: the command's receive reaped to its response queued (waits for the queue's turn included; the reactor reads the clock each time it works on a connection (a receive reaped, a pass of parsing), so the commands one pass answers share their end time); `_sum` is exact, `_count` the I/Os the quantiles cover |
//! | `qpath_target_port_ios_total` | port, dir | completed I/O commands through the port, since the target started |
//! | `qpath_target_port_bytes_total` | port, dir | bytes the successful ones moved |
//! | `qpath_target_port_errors_total` | port, dir | the failed ones |
//! | `qpath_target_port_connections` | port | connections now |
//! | `qpath_target_namespace_ios_total` | subnqn, nsid, dir (read, write) | completed reads and writes (Write Zeroes counts as a write), since the namespace was added |
//! | `qpath_target_namespace_bytes_total` | subnqn, nsid, dir | bytes they moved |
//! | `qpath_target_namespace_errors_total` | subnqn, nsid | I/O commands that failed |
//! | `qpath_target_namespace_reservation_type` | subnqn, nsid | type of the reservation held, 0 none (gauge) |
//! | `qpath_target_namespace_reservation_registrants` | subnqn, nsid | hosts registered (gauge) |
//! | `qpath_target_namespace_reservation_conflicts_total` | subnqn, nsid | commands refused with Reservation Conflict |
//! | `qpath_target_controllers` | subnqn | live controllers |
//! | `qpath_target_auth_dh_steps_total` | - | DH-HMAC-CHAP Diffie-Hellman steps the authentication workers finished |
//! | `qpath_target_auth_dh_steps_abandoned_total` | - | steps skipped because their connection closed before a worker took them |
//! | `qpath_target_auth_transactions_total` | result (`accepted`, `refused`), renewal (`true`: a live queue's re-authentication) | DH-HMAC-CHAP transactions ended |
//! | `qpath_target_auth_dh_steps_pending` | - | steps handed to the workers, neither finished nor abandoned (queued or running) |
//! | `qpath_target_auth_dh_hosts_waiting` | - | host NQNs with steps queued (the workers take one step per host in turn) |
//! | `qpath_target_reactor_buffer_bytes` | reactor, state (outstanding, cached) | data buffer bytes handed out / kept idle for reuse |
//! | `qpath_target_reactor_buffer_allocations_total` | reactor | data buffers allocated |
//! | `qpath_target_reactor_buffer_released_total` | reactor | returned buffers freed because the idle cache was full |
//!
//! The queue series live as long as their connection. The port and namespace counters are
//! kept by the port (by id) and the namespace, which each connection adds its deltas to on
//! its reactor's 10 ms tick and when it closes ([`crate::stats`]): they never go down when
//! a host disconnects, and lag the I/O by at most a tick. Histograms and the buffer numbers
//! are published on the same tick; queue counters are read directly (relaxed). Each metric
//! family's `# HELP`/`# TYPE` lines are followed by all of its samples (text format 0.0.4).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use blk::Direction;
use serde_json::{Value, json};

use crate::error::Error;
use crate::registry::{QueueInfo, TargetState};
use crate::stats::{LatencyReport, NsCounters, PortCounters};

const DIRS: [(Direction, &str); 4] =
    [(Direction::Read, "read"), (Direction::Write, "write"), (Direction::Trim, "trim"), (Direction::Sync, "sync")];

/// One port's row: its monotonic totals, its connections now and the merged latency
/// histograms of those connections.
struct PortRow {
    id: u16,
    connections: u64,
    totals: PortCounters,
    latency: blk::QueueStats,
}

/// Every configured port, and every port id that has totals, with the live queues' share.
fn port_rows(state: &TargetState, infos: &[Arc<QueueInfo>]) -> Vec<PortRow> {
    let mut lat: BTreeMap<u16, blk::QueueStats> = BTreeMap::new();
    let mut conns: BTreeMap<u16, u64> = BTreeMap::new();
    for q in infos {
        lat.entry(q.port).or_default().merge(&q.latency());
        *conns.entry(q.port).or_default() += 1;
    }
    let totals: BTreeMap<u16, PortCounters> = state.all_port_totals().into_iter().collect();
    let ids: BTreeSet<u16> =
        state.ports().iter().map(|p| p.id).chain(totals.keys().copied()).chain(conns.keys().copied()).collect();
    ids.into_iter()
        .map(|id| PortRow {
            id,
            connections: conns.get(&id).copied().unwrap_or(0),
            totals: totals.get(&id).copied().unwrap_or_default(),
            latency: lat.remove(&id).unwrap_or_default(),
        })
        .collect()
}

/// Every namespace of every subsystem with its monotonic counters.
fn namespace_rows(state: &TargetState) -> Vec<(String, NsCounters)> {
    let mut rows = Vec::new();
    for s in state.subsystems() {
        let (map, _) = s.namespaces();
        rows.extend(map.iter().map(|n| (s.nqn.clone(), n.counters.snapshot(n.nsid.0))));
    }
    rows
}

/// Per-queue statistics with per-port and per-namespace totals, as JSON.
pub fn stats_json(state: &TargetState) -> Value {
    let infos = state.queue_infos();
    let mut queues = Vec::new();
    for q in &infos {
        let (subnqn, cntlid, qid) = q.binding().map_or((String::new(), 0, 0), |(s, c, q)| (s, c.0, q));
        let lat = q.latency();
        let s = q.stats.snapshot();
        let lat_json: serde_json::Map<String, Value> = DIRS
            .iter()
            .filter(|(d, _)| lat.direction(*d).ios > 0)
            .map(|(d, name)| ((*name).to_string(), json!(LatencyReport::of(&lat, *d))))
            .collect();
        queues.push(json!({
            "port": q.port, "subnqn": subnqn, "cntlid": cntlid, "qid": qid, "reactor": q.reactor,
            "peer": q.peer.map(|p| p.to_string()),
            "commands": s.commands, "outstanding": s.outstanding, "errors": s.errors,
            "reads": s.reads, "writes": s.writes, "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
            "latency": lat_json,
        }));
    }
    let ports: Vec<Value> = port_rows(state, &infos)
        .iter()
        .map(|p| {
            let t = &p.totals;
            let dirs: serde_json::Map<String, Value> = DIRS
                .iter()
                .enumerate()
                .map(|(i, (_, name))| {
                    ((*name).to_string(), json!({"ios": t.ios[i], "bytes": t.bytes[i], "errors": t.errors[i]}))
                })
                .collect();
            json!({
                "port": p.id, "connections": p.connections,
                "ios": t.ios.iter().sum::<u64>(), "bytes": t.bytes.iter().sum::<u64>(),
                "errors": t.errors.iter().sum::<u64>(), "dirs": dirs,
                // Latency of the connections open now.
                "read": LatencyReport::of(&p.latency, Direction::Read),
                "write": LatencyReport::of(&p.latency, Direction::Write),
            })
        })
        .collect();
    let namespaces: Vec<Value> =
        namespace_rows(state).into_iter().map(|(nqn, n)| json!({"subnqn": nqn, "counters": n})).collect();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let reactors: Vec<Value> = state
        .buffer_stats()
        .iter()
        .map(|b| {
            json!({
                "reactor": b.reactor, "buffer_outstanding_bytes": load(&b.outstanding_bytes),
                "buffer_cached_bytes": load(&b.cached_bytes), "buffer_allocations": load(&b.allocations),
                "buffer_released": load(&b.released),
            })
        })
        .collect();
    let w = &state.auth_workers;
    let o = &state.auth_outcomes;
    let auth = json!({
        "dh_steps_submitted": w.submitted(),
        "dh_steps_computed": w.computed(),
        "dh_steps_abandoned": w.abandoned(),
        "dh_hosts_waiting": w.hosts_waiting(),
        "transactions_accepted": load(&o.accepted),
        "reauthentications_accepted": load(&o.renewed),
        "transactions_refused": load(&o.refused),
        "reauthentications_refused": load(&o.renewals_refused),
    });
    let reservations: Vec<Value> = state
        .subsystems()
        .iter()
        .flat_map(|s| {
            let (map, _) = s.namespaces();
            map.iter()
                .map(|n| {
                    let r = n.resv.snapshot();
                    json!({
                        "subnqn": s.nqn, "nsid": n.nsid.0, "rtype": r.rtype, "registrants": r.registrants.len(),
                        "ptpl": n.resv.ptpl(), "conflicts": n.resv.conflicts(),
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    json!({
        "side": "target", "queues": queues, "ports": ports, "namespaces": namespaces, "reactors": reactors, "auth": auth,
        "reservations": reservations,
    })
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Writes one metric family: its `# HELP` and `# TYPE` lines, then every sample `samples`
/// writes (the text format keeps a family's lines together).
fn family(out: &mut String, name: &str, kind: &str, text: &str, samples: impl FnOnce(&mut String)) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
    samples(out);
}

#[allow(clippy::cast_precision_loss)] // seconds for a report
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The target's metrics in Prometheus text exposition format 0.0.4.
pub fn render(state: &TargetState) -> String {
    let mut out = String::with_capacity(4096);
    let infos = state.queue_infos();
    queue_families(&mut out, &infos);
    port_families(&mut out, state, &infos);
    namespace_families(&mut out, state);
    buffer_families(&mut out, state);
    family(&mut out, "qpath_target_controllers", "gauge", "Live controllers of the subsystem.", |o| {
        for s in state.subsystems() {
            let _ = writeln!(o, "qpath_target_controllers{{subnqn=\"{}\"}} {}", esc(&s.nqn), s.controllers().len());
        }
    });
    auth_families(&mut out, state);
    out
}

/// Per queue: commands, outstanding, errors, I/Os, bytes and latency by direction.
fn queue_families(out: &mut String, infos: &[Arc<QueueInfo>]) {
    let label = |q: &QueueInfo| {
        let (subnqn, cntlid, qid) = q.binding().map_or((String::new(), 0, 0), |(s, c, q)| (s, c.0, q));
        format!(
            "port=\"{}\",subnqn=\"{}\",cntlid=\"{cntlid}\",qid=\"{qid}\",reactor=\"{}\"",
            q.port,
            esc(&subnqn),
            q.reactor
        )
    };
    let labels: Vec<String> = infos.iter().map(|q| label(q)).collect();
    let counter = |out: &mut String, name: &str, v: &dyn Fn(&QueueInfo) -> u64| {
        for (q, l) in infos.iter().zip(&labels) {
            let _ = writeln!(out, "{name}{{{l}}} {}", v(q));
        }
    };
    family(out, "qpath_target_queue_commands_total", "counter", "Commands received by the queue.", |o| {
        counter(o, "qpath_target_queue_commands_total", &|q| q.stats.commands.get());
    });
    family(out, "qpath_target_queue_outstanding", "gauge", "Commands in progress on the queue.", |o| {
        counter(o, "qpath_target_queue_outstanding", &|q| q.stats.outstanding.get());
    });
    family(out, "qpath_target_queue_errors_total", "counter", "Commands completed with an error status.", |o| {
        counter(o, "qpath_target_queue_errors_total", &|q| q.stats.errors.get());
    });
    let lats: Vec<(blk::QueueStats, [u64; 4])> = infos.iter().map(|q| q.latency_with_sums()).collect();
    family(out, "qpath_target_queue_ios_total", "counter", "Completed I/O commands by direction.", |o| {
        for (l, (s, _)) in labels.iter().zip(&lats) {
            for (d, name) in DIRS {
                let _ = writeln!(o, "qpath_target_queue_ios_total{{{l},dir=\"{name}\"}} {}", s.direction(d).ios);
            }
        }
    });
    family(out, "qpath_target_queue_bytes_total", "counter", "Bytes moved by direction.", |o| {
        for (l, (s, _)) in labels.iter().zip(&lats) {
            for (d, name) in DIRS {
                let _ = writeln!(o, "qpath_target_queue_bytes_total{{{l},dir=\"{name}\"}} {}", s.direction(d).bytes);
            }
        }
    });
    let name = "qpath_target_queue_latency_seconds";
    family(out, name, "summary", "Service time of the successful I/O commands.", |o| {
        for (l, (s, sums)) in labels.iter().zip(&lats) {
            for (i, (d, dir)) in DIRS.iter().enumerate() {
                let sum = s.direction(*d).summary();
                if sum.count == 0 {
                    continue;
                }
                for (q, v) in [("0.5", sum.p50_ns), ("0.99", sum.p99_ns), ("0.999", sum.p99_9_ns)] {
                    let _ = writeln!(o, "{name}{{{l},dir=\"{dir}\",quantile=\"{q}\"}} {}", secs(v));
                }
                let _ = writeln!(o, "{name}_sum{{{l},dir=\"{dir}\"}} {}", secs(sums[i]));
                let _ = writeln!(o, "{name}_count{{{l},dir=\"{dir}\"}} {}", sum.count);
            }
        }
    });
}

/// Per port: I/Os, bytes and errors by direction, and connections.
fn port_families(out: &mut String, state: &TargetState, infos: &[Arc<QueueInfo>]) {
    let ports = port_rows(state, infos);
    let per_port_dir = |o: &mut String, name: &str, v: &dyn Fn(&PortCounters) -> [u64; 4]| {
        for p in &ports {
            for (i, (_, dir)) in DIRS.iter().enumerate() {
                let _ = writeln!(o, "{name}{{port=\"{}\",dir=\"{dir}\"}} {}", p.id, v(&p.totals)[i]);
            }
        }
    };
    family(out, "qpath_target_port_ios_total", "counter", "Completed I/O commands through the port.", |o| {
        per_port_dir(o, "qpath_target_port_ios_total", &|t| t.ios);
    });
    family(out, "qpath_target_port_bytes_total", "counter", "Bytes moved through the port.", |o| {
        per_port_dir(o, "qpath_target_port_bytes_total", &|t| t.bytes);
    });
    family(out, "qpath_target_port_errors_total", "counter", "Failed I/O commands through the port.", |o| {
        per_port_dir(o, "qpath_target_port_errors_total", &|t| t.errors);
    });
    family(out, "qpath_target_port_connections", "gauge", "Connections on the port.", |o| {
        for p in &ports {
            let _ = writeln!(o, "qpath_target_port_connections{{port=\"{}\"}} {}", p.id, p.connections);
        }
    });
}

/// Per namespace: I/Os, bytes, errors and the reservation's type, registrants and conflicts.
fn namespace_families(out: &mut String, state: &TargetState) {
    let nss: Vec<(String, NsCounters)> = namespace_rows(state)
        .into_iter()
        .map(|(nqn, c)| (format!("subnqn=\"{}\",nsid=\"{}\"", esc(&nqn), c.nsid), c))
        .collect();
    let ns_help = "Completed reads and writes of the namespace.";
    family(out, "qpath_target_namespace_ios_total", "counter", ns_help, |o| {
        for (l, c) in &nss {
            let _ = writeln!(o, "qpath_target_namespace_ios_total{{{l},dir=\"read\"}} {}", c.reads);
            let _ = writeln!(o, "qpath_target_namespace_ios_total{{{l},dir=\"write\"}} {}", c.writes);
        }
    });
    let ns_help = "Bytes read and written on the namespace.";
    family(out, "qpath_target_namespace_bytes_total", "counter", ns_help, |o| {
        for (l, c) in &nss {
            let _ = writeln!(o, "qpath_target_namespace_bytes_total{{{l},dir=\"read\"}} {}", c.read_bytes);
            let _ = writeln!(o, "qpath_target_namespace_bytes_total{{{l},dir=\"write\"}} {}", c.write_bytes);
        }
    });
    let ns_help = "I/O commands on the namespace that failed.";
    family(out, "qpath_target_namespace_errors_total", "counter", ns_help, |o| {
        for (l, c) in &nss {
            let _ = writeln!(o, "qpath_target_namespace_errors_total{{{l}}} {}", c.errors);
        }
    });
    let mut resv = Vec::new();
    for s in state.subsystems() {
        let (map, _) = s.namespaces();
        for n in map.iter() {
            let r = n.resv.snapshot();
            let l = format!("subnqn=\"{}\",nsid=\"{}\"", esc(&s.nqn), n.nsid.0);
            resv.push((l, r.rtype, r.registrants.len(), n.resv.conflicts()));
        }
    }
    let name = "qpath_target_namespace_reservation_type";
    family(out, name, "gauge", "Type of the reservation held (0: none).", |o| {
        for (l, rtype, _, _) in &resv {
            let _ = writeln!(o, "{name}{{{l}}} {rtype}");
        }
    });
    let name = "qpath_target_namespace_reservation_registrants";
    family(out, name, "gauge", "Hosts registered on the namespace.", |o| {
        for (l, _, n, _) in &resv {
            let _ = writeln!(o, "{name}{{{l}}} {n}");
        }
    });
    let name = "qpath_target_namespace_reservation_conflicts_total";
    family(out, name, "counter", "Commands refused with Reservation Conflict.", |o| {
        for (l, _, _, c) in &resv {
            let _ = writeln!(o, "{name}{{{l}}} {c}");
        }
    });
}

/// Per reactor: data buffer bytes, allocations and releases.
fn buffer_families(out: &mut String, state: &TargetState) {
    let buffers = state.buffer_stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let name = "qpath_target_reactor_buffer_bytes";
    family(out, name, "gauge", "Data buffer bytes handed out or kept idle.", |o| {
        for b in &buffers {
            let id = b.reactor;
            let _ = writeln!(o, "{name}{{reactor=\"{id}\",state=\"outstanding\"}} {}", load(&b.outstanding_bytes));
            let _ = writeln!(o, "{name}{{reactor=\"{id}\",state=\"cached\"}} {}", load(&b.cached_bytes));
        }
    });
    let name = "qpath_target_reactor_buffer_allocations_total";
    family(out, name, "counter", "Data buffers allocated.", |o| {
        for b in &buffers {
            let _ = writeln!(o, "{name}{{reactor=\"{}\"}} {}", b.reactor, load(&b.allocations));
        }
    });
    let name = "qpath_target_reactor_buffer_released_total";
    family(out, name, "counter", "Returned buffers freed (idle cache full).", |o| {
        for b in &buffers {
            let _ = writeln!(o, "{name}{{reactor=\"{}\"}} {}", b.reactor, load(&b.released));
        }
    });
}

/// The DH-HMAC-CHAP workers and transactions.
fn auth_families(out: &mut String, state: &TargetState) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let w = &state.auth_workers;
    let name = "qpath_target_auth_dh_steps_total";
    family(out, name, "counter", "DH steps the authentication workers finished.", |o| {
        let _ = writeln!(o, "{name} {}", w.computed());
    });
    let name = "qpath_target_auth_dh_steps_abandoned_total";
    family(out, name, "counter", "DH steps skipped because their connection closed first.", |o| {
        let _ = writeln!(o, "{name} {}", w.abandoned());
    });
    let a = &state.auth_outcomes;
    let name = "qpath_target_auth_transactions_total";
    let help = "DH-HMAC-CHAP transactions ended, by result and whether they re-authenticated a live queue.";
    family(out, name, "counter", help, |o| {
        for (result, all, renewals) in
            [("accepted", &a.accepted, &a.renewed), ("refused", &a.refused, &a.renewals_refused)]
        {
            let (all, renewals) = (load(all), load(renewals));
            let fresh = all.saturating_sub(renewals);
            let _ = writeln!(o, "{name}{{result=\"{result}\",renewal=\"false\"}} {fresh}");
            let _ = writeln!(o, "{name}{{result=\"{result}\",renewal=\"true\"}} {renewals}");
        }
    });
    let name = "qpath_target_auth_dh_steps_pending";
    family(out, name, "gauge", "DH steps queued or running on the workers.", |o| {
        let _ = writeln!(o, "{name} {}", w.pending());
    });
    let name = "qpath_target_auth_dh_hosts_waiting";
    family(out, name, "gauge", "Host NQNs with DH steps queued for the workers.", |o| {
        let _ = writeln!(o, "{name} {}", w.hosts_waiting());
    });
}

/// Renders metrics text on request.
pub type Render = dyn Fn() -> String + Send + Sync;

/// A running `/metrics` endpoint.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

impl MetricsServer {
    /// Serves `GET /metrics` on `addr` (port 0 picks one) with `render`'s text.
    pub fn start(addr: SocketAddr, render: Arc<Render>) -> Result<MetricsServer, Error> {
        let l = TcpListener::bind(addr).map_err(|e| Error::io(format!("metrics listen on {addr}"), e))?;
        let addr = l.local_addr().map_err(|e| Error::io("metrics local_addr", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("qpath-metrics".into())
            .spawn(move || {
                // Not on the I/O path: off the CPUs polling reactors own.
                let mut place = uring::placement::Helper::default();
                let _ = place.refresh();
                for c in l.incoming() {
                    if s2.load(Ordering::Acquire) {
                        return;
                    }
                    let _ = place.refresh();
                    if let Ok(c) = c {
                        answer(c, &render);
                    }
                }
            })
            .map_err(|e| Error::io("spawn metrics thread", e))?;
        tracing::info!(%addr, "metrics endpoint");
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut c: TcpStream, render: &Arc<Render>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut req = [0u8; 4096];
    let mut n = 0;
    // Read the request head (bounded), up to the blank line.
    while n < req.len() {
        match c.read(&mut req[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                n += k;
                if req[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let head = String::from_utf8_lossy(&req[..n]);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if head.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
        ("200 OK", render())
    } else {
        ("404 Not Found", "not found\n".to_string())
    };
    let _ = write!(
        c,
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
