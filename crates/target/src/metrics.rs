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
//! | `qpath_target_queue_latency_seconds` | same + dir, quantile (0.5, 0.99, 0.999) | service time: the command's receive reaped to its response queued (waits for the queue's turn included; the reactor reads the clock each time it works on a connection (a receive reaped, a pass of parsing), so the commands one pass answers share their end time) |
//! | `qpath_target_port_ios_total` | port, dir | completed I/O commands through the port |
//! | `qpath_target_port_connections` | port | connections now |
//! | `qpath_target_namespace_ios_total` | subnqn, nsid, dir | completed reads/writes |
//! | `qpath_target_namespace_bytes_total` | subnqn, nsid, dir | bytes moved |
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
//! Histograms, per-namespace counters and the buffer numbers are published by
//! each reactor on its 10 ms tick; counters are read directly (relaxed).

use std::collections::BTreeMap;
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
use crate::registry::TargetState;
use crate::stats::{LatencyReport, NsCounters};

const DIRS: [(Direction, &str); 4] =
    [(Direction::Read, "read"), (Direction::Write, "write"), (Direction::Trim, "trim"), (Direction::Sync, "sync")];

/// Per-queue statistics with per-port and per-namespace aggregates, as JSON.
pub fn stats_json(state: &TargetState) -> Value {
    let mut queues = Vec::new();
    let mut ports: BTreeMap<u16, blk::QueueStats> = BTreeMap::new();
    let mut conns: BTreeMap<u16, u64> = BTreeMap::new();
    let mut nss: BTreeMap<(String, u32), NsCounters> = BTreeMap::new();
    for q in state.queue_infos() {
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
        ports.entry(q.port).or_default().merge(&lat);
        *conns.entry(q.port).or_default() += 1;
        for n in q.namespaces() {
            nss.entry((subnqn.clone(), n.nsid)).or_insert(NsCounters { nsid: n.nsid, ..Default::default() }).add(&n);
        }
    }
    let ports: Vec<Value> = ports
        .iter()
        .map(|(p, s)| {
            json!({
                "port": p, "connections": conns.get(p).copied().unwrap_or(0),
                "ios": s.ios(), "bytes": s.bytes(), "errors": s.errors(),
                "read": LatencyReport::of(s, Direction::Read), "write": LatencyReport::of(s, Direction::Write),
            })
        })
        .collect();
    let namespaces: Vec<Value> = nss.iter().map(|((nqn, _), n)| json!({"subnqn": nqn, "counters": n})).collect();
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

/// The target's metrics in Prometheus text exposition format 0.0.4.
pub fn render(state: &TargetState) -> String {
    let mut out = String::with_capacity(4096);
    let help = |out: &mut String, name: &str, kind: &str, text: &str| {
        let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
    };
    let infos = state.queue_infos();
    let label = |q: &crate::registry::QueueInfo| {
        let (subnqn, cntlid, qid) = q.binding().map_or((String::new(), 0, 0), |(s, c, q)| (s, c.0, q));
        format!(
            "port=\"{}\",subnqn=\"{}\",cntlid=\"{cntlid}\",qid=\"{qid}\",reactor=\"{}\"",
            q.port,
            esc(&subnqn),
            q.reactor
        )
    };
    help(&mut out, "qpath_target_queue_commands_total", "counter", "Commands received by the queue.");
    for q in &infos {
        let _ = writeln!(out, "qpath_target_queue_commands_total{{{}}} {}", label(q), q.stats.commands.get());
    }
    help(&mut out, "qpath_target_queue_outstanding", "gauge", "Commands in progress on the queue.");
    for q in &infos {
        let _ = writeln!(out, "qpath_target_queue_outstanding{{{}}} {}", label(q), q.stats.outstanding.get());
    }
    help(&mut out, "qpath_target_queue_errors_total", "counter", "Commands completed with an error status.");
    for q in &infos {
        let _ = writeln!(out, "qpath_target_queue_errors_total{{{}}} {}", label(q), q.stats.errors.get());
    }
    let lats: Vec<blk::QueueStats> = infos.iter().map(|q| q.latency()).collect();
    help(&mut out, "qpath_target_queue_ios_total", "counter", "Completed I/O commands by direction.");
    for (q, l) in infos.iter().zip(&lats) {
        for (d, name) in DIRS {
            let _ = writeln!(out, "qpath_target_queue_ios_total{{{},dir=\"{name}\"}} {}", label(q), l.direction(d).ios);
        }
    }
    help(&mut out, "qpath_target_queue_bytes_total", "counter", "Bytes moved by direction.");
    for (q, l) in infos.iter().zip(&lats) {
        for (d, name) in DIRS {
            let _ =
                writeln!(out, "qpath_target_queue_bytes_total{{{},dir=\"{name}\"}} {}", label(q), l.direction(d).bytes);
        }
    }
    help(&mut out, "qpath_target_queue_latency_seconds", "summary", "Command service time.");
    for (q, l) in infos.iter().zip(&lats) {
        for (d, name) in DIRS {
            let s = l.direction(d).summary();
            if s.count == 0 {
                continue;
            }
            for (qq, v) in [("0.5", s.p50_ns), ("0.99", s.p99_ns), ("0.999", s.p99_9_ns)] {
                #[allow(clippy::cast_precision_loss)]
                let secs = v as f64 / 1e9;
                let _ = writeln!(
                    out,
                    "qpath_target_queue_latency_seconds{{{},dir=\"{name}\",quantile=\"{qq}\"}} {secs}",
                    label(q)
                );
            }
        }
    }
    let js = stats_json(state);
    help(&mut out, "qpath_target_port_ios_total", "counter", "Completed I/O commands through the port.");
    help(&mut out, "qpath_target_port_connections", "gauge", "Connections on the port.");
    for p in js["ports"].as_array().into_iter().flatten() {
        let port = &p["port"];
        let _ = writeln!(out, "qpath_target_port_ios_total{{port=\"{port}\"}} {}", p["ios"]);
        let _ = writeln!(out, "qpath_target_port_connections{{port=\"{port}\"}} {}", p["connections"]);
    }
    help(&mut out, "qpath_target_namespace_ios_total", "counter", "Completed reads and writes of the namespace.");
    help(&mut out, "qpath_target_namespace_bytes_total", "counter", "Bytes read and written on the namespace.");
    for n in js["namespaces"].as_array().into_iter().flatten() {
        let nqn = esc(n["subnqn"].as_str().unwrap_or(""));
        let c = &n["counters"];
        let l = format!("subnqn=\"{nqn}\",nsid=\"{}\"", c["nsid"]);
        let _ = writeln!(out, "qpath_target_namespace_ios_total{{{l},dir=\"read\"}} {}", c["reads"]);
        let _ = writeln!(out, "qpath_target_namespace_ios_total{{{l},dir=\"write\"}} {}", c["writes"]);
        let _ = writeln!(out, "qpath_target_namespace_bytes_total{{{l},dir=\"read\"}} {}", c["read_bytes"]);
        let _ = writeln!(out, "qpath_target_namespace_bytes_total{{{l},dir=\"write\"}} {}", c["write_bytes"]);
    }
    help(&mut out, "qpath_target_namespace_reservation_type", "gauge", "Type of the reservation held (0: none).");
    help(&mut out, "qpath_target_namespace_reservation_registrants", "gauge", "Hosts registered on the namespace.");
    help(
        &mut out,
        "qpath_target_namespace_reservation_conflicts_total",
        "counter",
        "Commands refused with Reservation Conflict.",
    );
    for r in js["reservations"].as_array().into_iter().flatten() {
        let l = format!("subnqn=\"{}\",nsid=\"{}\"", esc(r["subnqn"].as_str().unwrap_or("")), r["nsid"]);
        let _ = writeln!(out, "qpath_target_namespace_reservation_type{{{l}}} {}", r["rtype"]);
        let _ = writeln!(out, "qpath_target_namespace_reservation_registrants{{{l}}} {}", r["registrants"]);
        let _ = writeln!(out, "qpath_target_namespace_reservation_conflicts_total{{{l}}} {}", r["conflicts"]);
    }
    help(&mut out, "qpath_target_reactor_buffer_bytes", "gauge", "Data buffer bytes handed out or kept idle.");
    help(&mut out, "qpath_target_reactor_buffer_allocations_total", "counter", "Data buffers allocated.");
    help(
        &mut out,
        "qpath_target_reactor_buffer_released_total",
        "counter",
        "Returned buffers freed (idle cache full).",
    );
    for r in js["reactors"].as_array().into_iter().flatten() {
        let id = &r["reactor"];
        let _ = writeln!(
            out,
            "qpath_target_reactor_buffer_bytes{{reactor=\"{id}\",state=\"outstanding\"}} {}",
            r["buffer_outstanding_bytes"]
        );
        let _ = writeln!(
            out,
            "qpath_target_reactor_buffer_bytes{{reactor=\"{id}\",state=\"cached\"}} {}",
            r["buffer_cached_bytes"]
        );
        let _ = writeln!(
            out,
            "qpath_target_reactor_buffer_allocations_total{{reactor=\"{id}\"}} {}",
            r["buffer_allocations"]
        );
        let _ =
            writeln!(out, "qpath_target_reactor_buffer_released_total{{reactor=\"{id}\"}} {}", r["buffer_released"]);
    }
    help(&mut out, "qpath_target_controllers", "gauge", "Live controllers of the subsystem.");
    for s in state.subsystems() {
        let _ = writeln!(out, "qpath_target_controllers{{subnqn=\"{}\"}} {}", esc(&s.nqn), s.controllers().len());
    }
    let w = &state.auth_workers;
    help(&mut out, "qpath_target_auth_dh_steps_total", "counter", "DH steps the authentication workers finished.");
    let _ = writeln!(out, "qpath_target_auth_dh_steps_total {}", w.computed());
    help(
        &mut out,
        "qpath_target_auth_dh_steps_abandoned_total",
        "counter",
        "DH steps skipped because their connection closed first.",
    );
    let _ = writeln!(out, "qpath_target_auth_dh_steps_abandoned_total {}", w.abandoned());
    let o = &state.auth_outcomes;
    help(
        &mut out,
        "qpath_target_auth_transactions_total",
        "counter",
        "DH-HMAC-CHAP transactions ended, by result and whether they re-authenticated a live queue.",
    );
    for (result, all, renewals) in [("accepted", &o.accepted, &o.renewed), ("refused", &o.refused, &o.renewals_refused)]
    {
        let (all, renewals) = (all.load(Ordering::Relaxed), renewals.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "qpath_target_auth_transactions_total{{result=\"{result}\",renewal=\"false\"}} {}",
            all.saturating_sub(renewals)
        );
        let _ =
            writeln!(out, "qpath_target_auth_transactions_total{{result=\"{result}\",renewal=\"true\"}} {renewals}");
    }
    help(&mut out, "qpath_target_auth_dh_steps_pending", "gauge", "DH steps queued or running on the workers.");
    let _ = writeln!(out, "qpath_target_auth_dh_steps_pending {}", w.pending());
    help(&mut out, "qpath_target_auth_dh_hosts_waiting", "gauge", "Host NQNs with DH steps queued for the workers.");
    let _ = writeln!(out, "qpath_target_auth_dh_hosts_waiting {}", w.hosts_waiting());
    out
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
                for c in l.incoming() {
                    if s2.load(Ordering::Acquire) {
                        return;
                    }
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
