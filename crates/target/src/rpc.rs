//! JSON-RPC 2.0 control socket (one request per line over a Unix socket),
//! served by a thread of its own: control plane only.
//!
//! Methods (params as JSON objects):
//!
//! | method | params | result |
//! | --- | --- | --- |
//! | `get_target` | | ports, subsystems, reactors |
//! | `list_subsystems` | | subsystems with namespaces and hosts (`host_keys`: each key's fingerprint, never the key) |
//! | `add_subsystem` | a `[[subsystem]]` table as JSON (all or nothing: a namespace that fails adds no subsystem) | `{nqn}` |
//! | `remove_subsystem` | `{nqn}` | |
//! | `add_namespace` | `{nqn, ...[[subsystem.namespace]] fields}`, e.g. `backend=file path=IMG`, with `size`, `grow:=true`, `readonly:=true` as in the config (an existing file is never shrunk, grown only with `grow:=true`, and locked while served; a file the call created is removed if it fails) | `{nsid}` |
//! | `remove_namespace` | `{nqn, nsid}` | |
//! | `resize_namespace` | `{nqn, nsid, size}` (bytes or "2G"; a multiple of the block size; RAM up to its `max_size`; shrinking refused while data lies past the new end; block devices refused) | `{nsid, size, previous_size}` |
//! | `ns_add_host` / `ns_remove_host` | `{nqn, nsid, host}` (namespaces with `visible = "listed"`; the host's controllers see it appear / go) | `{changed}` |
//! | `add_host` / `remove_host` | `{nqn, host}` (a removed host's controllers fail at once) | `{controllers_failed}` |
//! | `set_allow_any_host` | `{nqn, allow}` (false: controllers of hosts not listed fail) | `{controllers_failed}` |
//! | `set_host_auth` | `{nqn, host, dhchap_key?, dhchap_ctrl_key?, dhchap_key_file?, dhchap_ctrl_key_file?, hash?, dhgroup?}` (no key: clear; a key from a file is saved as the file's name) | |
//! | `set_ana_state` | `{port, group, state}` | `{changed}` |
//! | `set_qos` | `{nqn, nsid, iops, bytes_per_sec, delay_us}` | |
//! | `get_reservation` | `{nqn, nsid}` | `{generation, rtype, registrants: [{hostid, rkey, holds}]}` |
//! | `clear_reservation` | `{nqn, nsid}` (drops every registration and the reservation) | `{cleared_registrations}` |
//! | `add_port` | `{id, addr, kind}` | `{addr}` |
//! | `remove_port` | `{id}` (its listener and connections close; discovery controllers on other ports get a log change event) | |
//! | `add_referral` / `remove_referral` | `{address, port?, subnqn?}` (port 8009 and the discovery NQN by default) | |
//! | `set_port_fault` | `{port, delay_us?, refuse_connects?, drop_connections?, stall_opcode?}` | |
//! | `get_limits` | | limits in force, connections refused by reason, timeouts |
//! | `set_limits` | any of `{max_connections_per_port, max_connections_per_host, max_connections_per_hostnqn, connect_timeout_ms, pdu_timeout_ms, max_buffer_bytes_per_connection, rx_budget_pdus, tx_batch_bytes, tx_deadline_us}` | limits in force (the fairness budgets may be 0 = no limit) |
//! | `save_config` | `{path?}` (default: the file the target started from) — the running configuration as the TOML `--config` reads, written atomically (the previous file kept as `FILE.bak`; mode 0600 when it holds secrets inline); under `--persist` every method that changes the configuration saves it before answering | `{path, bytes, mode, inline_secrets, backup}` |
//! | `list_controllers` | | controllers |
//! | `list_queues` | | queues with counters |
//! | `stats` | | per-queue counters and latency percentiles, per-port and per-namespace aggregates |

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nvme::{AnaGrpId, AnaState, Nsid};
use serde_json::{Value, json};

use crate::config::{NamespaceConfig, SubsystemConfig, add_namespace, add_subsystem};
use crate::error::{Error, ErrorKind};
use crate::port::PortKind;
use crate::qos::QosSettings;
use crate::server::Server;
use crate::subsystem::HostAccess;

/// A running RPC server.
#[derive(Debug)]
pub struct RpcServer {
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RpcServer {
    /// Listens on `path` (replacing a stale socket file) and serves `server`.
    pub fn start(path: &Path, server: Arc<Server>) -> Result<RpcServer, Error> {
        RpcServer::start_with(path, Arc::new(move |m: &str, p: &Value| call(&server, m, p)))
    }

    /// Listens on `path` and answers every request with `handler` (the host
    /// side's statistics use the same socket protocol).
    pub fn start_with(path: &Path, handler: Arc<Handler>) -> Result<RpcServer, Error> {
        if path.exists() {
            let _ = std::fs::remove_file(path);
        }
        let listener = UnixListener::bind(path).map_err(|e| Error::io(format!("RPC socket {}", path.display()), e))?;
        let thread = std::thread::Builder::new()
            .name("qpath-rpc".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let handler = Arc::clone(&handler);
                    let _ =
                        std::thread::Builder::new().name("qpath-rpc-conn".into()).spawn(move || serve(conn, &handler));
                }
            })
            .map_err(|e| Error::io("spawn RPC thread", e))?;
        tracing::info!(socket = %path.display(), "RPC listening");
        Ok(RpcServer { path: path.to_path_buf(), thread: Some(thread) })
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        // The accept thread is detached: it ends with the process.
        drop(self.thread.take());
    }
}

/// Answers one JSON-RPC method.
pub type Handler = dyn Fn(&str, &Value) -> Result<Value, Error> + Send + Sync;

fn serve(conn: UnixStream, handler: &Arc<Handler>) {
    let Ok(w) = conn.try_clone() else { return };
    let mut w = w;
    let r = BufReader::new(conn);
    for line in r.lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        // Bound the request size: a control socket never needs megabytes.
        let resp = if line.len() > 1 << 20 {
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "request too large"}})
        } else {
            match serde_json::from_str::<Value>(&line) {
                Ok(req) => {
                    let id = req.get("id").cloned().unwrap_or(Value::Null);
                    let method = req.get("method").and_then(Value::as_str).unwrap_or("");
                    let params = req.get("params").cloned().unwrap_or(json!({}));
                    match handler(method, &params) {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(e) => {
                            let code = match e.kind {
                                ErrorKind::NotFound => -32001,
                                ErrorKind::Exists => -32002,
                                _ => -32602,
                            };
                            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": e.to_string()}})
                        }
                    }
                }
                Err(e) => json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": e.to_string()}}),
            }
        };
        if writeln!(w, "{resp}").is_err() {
            return;
        }
    }
}

fn param<T: serde::de::DeserializeOwned>(p: &Value, key: &str) -> Result<T, Error> {
    let v = p.get(key).cloned().ok_or_else(|| Error::new(ErrorKind::Config, format!("missing parameter {key:?}")))?;
    serde_json::from_value(v).map_err(|e| Error::new(ErrorKind::Config, format!("parameter {key:?}: {e}")))
}

fn opt<T: serde::de::DeserializeOwned>(p: &Value, key: &str) -> Result<Option<T>, Error> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => param(p, key).map(Some),
    }
}

/// Executes one method (exposed for in-process callers and tests). A method that changes
/// the configuration runs under the change lock and is followed by the save `--persist`
/// asks for (`crate::persist`): when that save fails, the call fails saying the change is
/// in force but not saved.
pub fn call(server: &Server, method: &str, p: &Value) -> Result<Value, Error> {
    if method == "save_config" {
        let path: Option<PathBuf> = opt(p, "path")?;
        return Ok(json!(crate::persist::save(server, path.as_deref())?));
    }
    if !crate::persist::is_change(method) {
        return dispatch(server, method, p);
    }
    let _changes = server.lock_changes();
    let result = dispatch(server, method, p)?;
    crate::persist::changed(server, method)?;
    Ok(result)
}

fn dispatch(server: &Server, method: &str, p: &Value) -> Result<Value, Error> {
    let st = &server.state;
    let sub = |p: &Value| -> Result<Arc<crate::subsystem::Subsystem>, Error> {
        let nqn: String = param(p, "nqn")?;
        st.subsystem(&nqn).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no subsystem {nqn}")))
    };
    Ok(match method {
        "get_target" => json!({
            "reactors": server.reactors(),
            "ports": st.ports().iter().map(|p| json!({"id": p.id, "addr": p.addr.to_string(), "kind": p.kind})).collect::<Vec<_>>(),
            "subsystems": st.subsystems().iter().map(|s| s.nqn.clone()).collect::<Vec<_>>(),
            "referrals": st.referrals(),
            "options": st.opts,
        }),
        "list_ports" => json!(
            st.ports()
                .iter()
                .map(|p| json!({
                    "id": p.id, "addr": p.addr.to_string(), "kind": p.kind,
                    "delay_us": p.faults.delay_us.load(Ordering::Relaxed),
                    "refuse_connects": p.faults.refuse_connects.load(Ordering::Relaxed),
                    "ana": (1..=crate::port::ANA_GROUPS).filter_map(|g| {
                        let s = p.ana_state(AnaGrpId(g));
                        (s != AnaState::Optimized).then(|| json!({"group": g, "state": s.linux_name()}))
                    }).collect::<Vec<_>>(),
                }))
                .collect::<Vec<_>>()
        ),
        "list_subsystems" => json!(
            st.subsystems()
                .iter()
                .map(|s| {
                    let (ns, _) = s.namespaces();
                    let a = s.access();
                    json!({
                        "nqn": s.nqn, "serial": s.serial, "model": s.model,
                        "allow_any_host": a.allow_any, "hosts": a.hosts, "auth_hosts": s.auth_hosts(), "host_keys": s.host_keys(),
                        "namespaces": ns.iter().map(|n| json!({
                            "nsid": n.nsid.0, "backend": format!("{:?}", n.backend), "size": n.size_bytes(),
                            "block_size": n.block_size(), "ana_group": n.anagrpid.0,
                            "uuid": nvme::nqn::format_uuid(&n.uuid), "qos": n.qos.get(),
                            "visible": match n.visibility() {
                                crate::namespace::Visibility::All => json!("all"),
                                crate::namespace::Visibility::Listed(h) => json!({"listed": h}),
                            },
                        })).collect::<Vec<_>>(),
                        "controllers": s.controllers().iter().map(|c| c.cntlid.0).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>()
        ),
        "add_subsystem" => {
            let cfg: SubsystemConfig =
                serde_json::from_value(p.clone()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
            let s = add_subsystem(st, &cfg)?;
            json!({"nqn": s.nqn})
        }
        "remove_subsystem" => {
            st.remove_subsystem(&param::<String>(p, "nqn")?)?;
            json!({})
        }
        "add_namespace" => {
            let s = sub(p)?;
            let mut q = p.clone();
            if let Some(o) = q.as_object_mut() {
                o.remove("nqn");
            }
            let cfg: NamespaceConfig =
                serde_json::from_value(q).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
            let nsid = add_namespace(&s, &cfg)?;
            json!({"nsid": nsid.0})
        }
        "remove_namespace" => {
            sub(p)?.remove_namespace(Nsid(param(p, "nsid")?))?;
            json!({})
        }
        "resize_namespace" => {
            let s = sub(p)?;
            let nsid: u32 = param(p, "nsid")?;
            let size = param::<crate::config::SizeValue>(p, "size")?.bytes()?;
            let (previous, size) = s.resize_namespace(Nsid(nsid), size)?;
            json!({"nsid": nsid, "size": size, "previous_size": previous})
        }
        "ns_add_host" | "ns_remove_host" => {
            let s = sub(p)?;
            let nsid: u32 = param(p, "nsid")?;
            let host: String = param(p, "host")?;
            let changed = s.set_ns_host(Nsid(nsid), &host, method == "ns_add_host")?;
            json!({"changed": changed})
        }
        "add_host" | "remove_host" => {
            let s = sub(p)?;
            let host: String = param(p, "host")?;
            let mut a: HostAccess = s.access();
            a.hosts.retain(|h| *h != host);
            if method == "add_host" {
                a.hosts.push(host);
            } else {
                // A removed host keeps no DH-HMAC-CHAP keys either.
                s.set_host_auth(&host, None);
            }
            let failed = st.set_host_access(&s, a);
            json!({"controllers_failed": failed})
        }
        "set_allow_any_host" => {
            let s = sub(p)?;
            let mut a: HostAccess = s.access();
            a.allow_any = param(p, "allow")?;
            let failed = st.set_host_access(&s, a);
            json!({"controllers_failed": failed})
        }
        "set_host_auth" => {
            // Allows the host and sets (or, without dhchap_key, clears) its DH-HMAC-CHAP keys.
            let s = sub(p)?;
            let host: String = param(p, "host")?;
            let cfg = crate::config::HostAuthConfig {
                nqn: host.clone(),
                dhchap_key: opt(p, "dhchap_key")?,
                dhchap_ctrl_key: opt(p, "dhchap_ctrl_key")?,
                hash: opt(p, "hash")?,
                dhgroup: opt(p, "dhgroup")?,
                dhchap_key_file: opt(p, "dhchap_key_file")?,
                dhchap_ctrl_key_file: opt(p, "dhchap_ctrl_key_file")?,
            };
            let auth = cfg.to_host_auth()?;
            let mut a: HostAccess = s.access();
            if !a.hosts.contains(&host) {
                a.hosts.push(host.clone());
                st.set_host_access(&s, a);
            }
            s.set_host_auth(&host, auth);
            json!({})
        }
        "set_ana_state" => {
            let state: String = param(p, "state")?;
            let st_ =
                AnaState::parse(&state).ok_or_else(|| Error::new(ErrorKind::Config, format!("ANA state {state:?}")))?;
            let changed = st.set_ana_state(param(p, "port")?, AnaGrpId(param(p, "group")?), st_)?;
            json!({"changed": changed})
        }
        "set_qos" => {
            let s = sub(p)?;
            let nsid: u32 = param(p, "nsid")?;
            let (map, _) = s.namespaces();
            let ns = map.get(Nsid(nsid)).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no NSID {nsid}")))?;
            let q = QosSettings {
                iops: opt(p, "iops")?.unwrap_or(0),
                bytes_per_sec: opt(p, "bytes_per_sec")?.unwrap_or(0),
                delay_us: opt(p, "delay_us")?.unwrap_or(0),
            };
            ns.qos.set(q);
            json!(q)
        }
        "get_reservation" | "clear_reservation" => {
            let s = sub(p)?;
            let nsid: u32 = param(p, "nsid")?;
            let (map, _) = s.namespaces();
            let ns = map.get(Nsid(nsid)).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no NSID {nsid}")))?;
            if method == "clear_reservation" {
                let n = ns.resv.clear().map_err(|s| {
                    Error::new(ErrorKind::Io, format!("the cleared state could not be persisted ({s})"))
                })?;
                tracing::warn!(nqn = %s.nqn, nsid, registrations = n, "reservation cleared by the operator");
                // The registrants' hosts hear that their reservation was preempted.
                crate::controller::notify_reservation(&s, Nsid(nsid), &ns.resv.take_notices());
                json!({"cleared_registrations": n})
            } else {
                json!(ns.resv.snapshot())
            }
        }
        "add_port" => {
            let kind: PortKind = opt(p, "kind")?.unwrap_or(PortKind::Io);
            let addr = crate::server::parse_addr(&param::<String>(p, "addr")?)?;
            let bound = server.add_port(param(p, "id")?, addr, kind)?;
            json!({"addr": bound.to_string()})
        }
        "remove_port" => {
            server.remove_port(param(p, "id")?)?;
            json!({})
        }
        "add_referral" | "remove_referral" => {
            let r = crate::config::ReferralConfig {
                address: param(p, "address")?,
                port: opt(p, "port")?.unwrap_or(crate::registry::DISCOVERY_TRSVCID),
                subnqn: opt(p, "subnqn")?,
            }
            .to_referral()?;
            if method == "add_referral" {
                st.add_referral(r)?;
            } else {
                st.remove_referral(&r)?;
            }
            json!({})
        }
        "set_port_fault" => {
            let id: u16 = param(p, "port")?;
            let port = st.port(id).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no port {id}")))?;
            if let Some(d) = opt::<u64>(p, "delay_us")? {
                port.faults.delay_us.store(d, Ordering::Relaxed);
            }
            if let Some(r) = opt::<bool>(p, "refuse_connects")? {
                port.faults.refuse_connects.store(r, Ordering::Relaxed);
            }
            if opt::<bool>(p, "drop_connections")?.unwrap_or(false) {
                port.faults.drop_generation.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(o) = opt::<i64>(p, "stall_opcode")? {
                let v = u64::try_from(o + 1).unwrap_or(0);
                port.faults.stall_opcode.store(v, Ordering::Relaxed);
            }
            json!({})
        }
        "get_limits" => limits_json(st),
        "set_limits" => {
            let s: crate::limits::LimitSettings =
                serde_json::from_value(p.clone()).map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
            st.limits.set(&s).map_err(|e| Error::new(ErrorKind::Config, e))?;
            limits_json(st)
        }
        "list_controllers" => {
            let mut all: Vec<_> = st.subsystems().iter().flat_map(|s| s.controllers()).map(|c| c.info()).collect();
            all.extend(st.discovery.controllers().iter().map(|c| c.info()));
            json!(all)
        }
        "list_queues" => json!(st.queues()),
        "stats" => crate::metrics::stats_json(st),
        _ => return Err(Error::new(ErrorKind::NotFound, format!("unknown method {method:?}"))),
    })
}

fn limits_json(st: &crate::registry::TargetState) -> Value {
    let refused: serde_json::Map<String, Value> =
        st.limits.refused().iter().map(|(r, n)| (r.name().to_string(), json!(n))).collect();
    json!({"limits": st.limits.get(), "refused": refused, "timeouts": st.limits.timeouts()})
}

/// A blocking client: sends one request and returns its result or error message.
pub fn client_call(socket: &Path, method: &str, params: Value) -> Result<Value, Error> {
    let mut s = UnixStream::connect(socket).map_err(|e| Error::io(format!("connect to {}", socket.display()), e))?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").map_err(|e| Error::io("write request", e))?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| Error::io("read response", e))?;
    let v: Value = serde_json::from_str(&line).map_err(|e| Error::new(ErrorKind::Io, format!("bad response: {e}")))?;
    if let Some(err) = v.get("error") {
        let msg = err.get("message").and_then(Value::as_str).unwrap_or("error");
        return Err(Error::new(ErrorKind::Config, msg.to_string()));
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}
