//! The control socket of a `qpath host` process: JSON-RPC 2.0, one request per line, as
//! the target's (`qpath rpc --socket PATH METHOD key=value ...` talks to either).
//!
//! | method | does | params | result |
//! | --- | --- | --- | --- |
//! | `ublk_add` | connects a namespace's paths and creates `/dev/ublkbN` over them | `paths: [HOST:PORT]`, `subnqn`, `nsid? = 1`, `iopolicy? = numa`, `hostnqn?`, `hostid?`, `nr_io_queues?`, `queue_size? = 128`, `keep_alive_tmo? = 5`, `reconnect_delay? = 10`, `ctrl_loss_tmo? = 600`, `fast_io_fail_tmo? = -1`, `dev_id?`, `queues? = 1`, `depth? = 128`, `max_transfer? = 524288`, `read_only? = false`, `name?` | `{dev_id, path, size, block_size, ...}` |
//! | `ublk_del` | deletes a device (`STOP_DEV`, `DEL_DEV`) and disconnects its paths | `dev_id` or `name` | `{}` |
//! | `ublk_list` | every ublk device of the machine; those served here with their namespace and counters; configured devices not served, with why | | `[{dev_id, state, pid, ...}]` |
//!
//! Under `qpath host --config FILE --persist`, `ublk_add` and `ublk_del` change FILE before
//! they answer ([`crate::host_config`]); a device that could not be created stays in it.
//! | `rpc_get_methods` | this table | | `[{name, description}]` |
//!
//! The socket is created mode 0600 (root's, or the owner's); a path another process serves
//! is refused and only a stale socket is replaced. Every call that changes something is
//! logged with the caller's uid and pid.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::error::{Error, ErrorKind, Result};
use crate::service::{AddOptions, Service, invalid};
use crate::spec::HeadSpec;

/// Longest request line read.
const LINE_MAX: usize = 64 << 10;

const METHODS: &[(&str, &str)] = &[
    ("ublk_add", "Connect a namespace's paths and create /dev/ublkbN over them"),
    ("ublk_del", "Delete a ublk device (by dev_id or name) and disconnect its paths"),
    ("ublk_list", "Every ublk device; those served here with namespace, paths and counters"),
    ("rpc_get_methods", "The methods of this socket"),
];

const ADD_KEYS: &[&str] = &["dev_id", "queues", "depth", "max_transfer", "read_only"];

/// Splits `ublk_add`'s flat params into the head and the device options.
pub fn split_add_params(p: &Value) -> Result<(HeadSpec, AddOptions)> {
    let Some(obj) = p.as_object() else { return Err(invalid("ublk_add takes an object of parameters")) };
    let (mut spec, mut opts) = (Map::new(), Map::new());
    for (k, v) in obj {
        if ADD_KEYS.contains(&k.as_str()) {
            opts.insert(k.clone(), v.clone());
        } else {
            spec.insert(k.clone(), v.clone());
        }
    }
    let spec: HeadSpec = serde_json::from_value(Value::Object(spec)).map_err(|e| invalid(unknown_key_named(&e)))?;
    let opts: AddOptions =
        serde_json::from_value(Value::Object(opts)).map_err(|e| invalid(format!("ublk_add: {e}")))?;
    spec.check()?;
    opts.check()?;
    Ok((spec, opts))
}

/// The head's refusal of a key it does not know lists the head's keys only; the device's
/// (`queues`, `depth`...) and `name` belong to the list too, or a misspelt `queues` would
/// be answered with every key but the one meant.
fn unknown_key_named(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.strip_prefix("unknown field ").and_then(|t| t.split_once(", expected one of ")) {
        Some((key, spec_keys)) => {
            let spec_keys = spec_keys.split(" at line ").next().unwrap_or(spec_keys);
            let more: Vec<String> = ADD_KEYS.iter().chain(&["name"]).map(|k| format!("`{k}`")).collect();
            format!("ublk_add: unknown key {key}; the keys are {spec_keys}, {}", more.join(", "))
        }
        None => format!("ublk_add: {text}"),
    }
}

/// `ublk_add`'s optional `name`, taken out of its params.
fn take_name(p: &Value) -> Result<(Option<String>, Value)> {
    let mut p = p.clone();
    let name = match p.as_object_mut().and_then(|m| m.remove("name")) {
        None => None,
        Some(Value::String(n)) => {
            crate::host_config::check_name(&n)?;
            Some(n)
        }
        Some(_) => return Err(invalid("name: expected a string")),
    };
    Ok((name, p))
}

fn call(svc: &Service, method: &str, p: &Value) -> Result<Value> {
    match method {
        "ublk_add" => {
            let (name, p) = take_name(p)?;
            let (spec, opts) = split_add_params(&p)?;
            svc.ublk_add_configured(name, &spec, &opts)
        }
        "ublk_del" => {
            if let Some(name) = p.get("name") {
                let name = name.as_str().ok_or_else(|| invalid("name: expected a string"))?;
                svc.ublk_del_named(name)?;
                return Ok(json!({}));
            }
            let id = p
                .get("dev_id")
                .and_then(Value::as_u64)
                .ok_or_else(|| invalid("ublk_del needs dev_id (an integer) or name"))?;
            let id = u32::try_from(id).map_err(|_| invalid("dev_id out of range"))?;
            svc.ublk_del_configured(id)?;
            Ok(json!({}))
        }
        "ublk_list" => svc.ublk_list(),
        "rpc_get_methods" => {
            Ok(Value::Array(METHODS.iter().map(|(n, d)| json!({"name": n, "description": d, "params": []})).collect()))
        }
        other => Err(Error::new(
            ErrorKind::Invalid,
            format!("no method {other:?}; methods: {}", METHODS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")),
        )),
    }
}

/// A running control socket.
pub struct RpcServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer").field("path", &self.path).finish_non_exhaustive()
    }
}

impl RpcServer {
    /// Listens on `path` for `svc`.
    pub fn start(path: &Path, svc: Arc<Service>) -> Result<RpcServer> {
        let listener = crate::nbd::server::bind_unix(&path.to_path_buf())?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("{}: permissions", path.display()), &e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("control socket", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("host-rpc".into())
                .spawn(move || accept_loop(&listener, &svc, &stop))
                .map_err(|e| Error::io("spawning the control thread", &e))?
        };
        Ok(RpcServer { path: path.to_path_buf(), stop, thread: Some(thread) })
    }

    /// Stops listening and removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: &UnixListener, svc: &Arc<Service>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let svc = Arc::clone(svc);
                let _ = std::thread::Builder::new().name("host-rpc-conn".into()).spawn(move || serve_conn(s, &svc));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                svc.reap();
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_conn(s: UnixStream, svc: &Service) {
    let _ = s.set_nonblocking(false);
    let who = uring::peer_credentials(s.as_fd())
        .map_or_else(|_| "unknown".to_string(), |c| format!("uid {} pid {}", c.uid, c.pid));
    let Ok(mut out) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::Read::take(&mut r, LINE_MAX as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') && line.len() >= LINE_MAX {
            let _ = writeln!(
                out,
                "{}",
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "request line too long"}})
            );
            return;
        }
        let reply = match serde_json::from_str::<Value>(line.trim()) {
            Err(e) => {
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("not JSON: {e}")}})
            }
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let method = req.get("method").and_then(Value::as_str).unwrap_or("");
                let params = req.get("params").cloned().unwrap_or_else(|| json!({}));
                let changes = matches!(method, "ublk_add" | "ublk_del");
                match call(svc, method, &params) {
                    Ok(v) => {
                        if changes {
                            tracing::info!(method, caller = %who, params = %params, "control call");
                        }
                        json!({"jsonrpc": "2.0", "id": id, "result": v})
                    }
                    Err(e) => {
                        tracing::debug!(method, caller = %who, error = %e, "control call refused");
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": e.to_string()}})
                    }
                }
            }
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

/// One call to a control socket (for the command line); the result, or the error's message.
pub fn call_socket(path: &Path, method: &str, params: &Value, timeout: Duration) -> std::result::Result<Value, String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").map_err(|e| format!("{}: {e}", path.display()))?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(|e| format!("{}: no answer: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("{}: bad answer: {e}", path.display()))?;
    if let Some(e) = v.get("error") {
        return Err(e.get("message").and_then(Value::as_str).unwrap_or("error").to_string());
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_params_split_and_checked() {
        let p = json!({"paths": ["127.0.0.1:4420"], "subnqn": "nqn.x:y", "queues": 2, "ctrl_loss_tmo": -1});
        let (s, o) = split_add_params(&p).unwrap();
        assert_eq!((s.ctrl_loss_tmo, o.queues, o.depth), (-1, 2, 128));
        let bad = json!({"paths": ["a:1"], "subnqn": "n", "quues": 2});
        let e = split_add_params(&bad).unwrap_err().context;
        // A misspelt key is answered with every key, the device's and the name among them.
        assert!(e.contains("unknown key `quues`") && e.contains("`queues`") && e.contains("`paths`"), "{e}");
        assert!(e.contains("`name`") && e.contains("`depth`") && !e.contains(" at line "), "{e}");
        assert!(split_add_params(&json!({"paths": [], "subnqn": "n"})).is_err());
    }
}
