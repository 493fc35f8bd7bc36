//! JSON-RPC 2.0 control socket (one request per line over a Unix socket), served by a
//! thread of its own: control plane only.
//!
//! Every socket has a table of methods ([`schema::Method`]): name, one-line description,
//! what it changes, parameters (type, required or default, description, secret) and what
//! it answers. A request is checked against it before the method runs ([`answer`]): an
//! unknown method or parameter is refused with the closest name and the list, a missing
//! parameter is named, and a string is converted where the schema wants an integer,
//! number, boolean or size (so `qpath rpc remove_namespace nqn=... nsid=1` works as
//! `nsid:=1` does); a value that does not convert is refused naming the parameter, its type
//! and the value (never a secret's value). `rpc_get_methods` (SPDK's name) answers the
//! table, which `qpath rpc --list` and `qpath rpc METHOD --help` print.
//!
//! Every call that changes something (the methods below marked `config` or `state`) leaves
//! one `info` line in the log when it succeeds: the method, its parameters with every
//! secret as `<secret>`, and the caller's uid and pid (`SO_PEERCRED`). A failed call leaves
//! one `debug` line with the error.
//!
//! A socket path is never taken from a process that serves it: at start, a path that
//! accepts a connection is refused (naming that process's pid); only a stale socket (no
//! listener) is replaced, and a file that is not a socket never is.
//!
//! The target's methods ([`methods::TARGET`]; `config`: changes the configuration, saved
//! before the answer under `qpath target --persist`; `state`: acts on the running target,
//! not saved; `name?`: optional, `name = v`: default `v`):
//!
//! <!-- methods: generated from methods::TARGET by the test module_doc_lists_the_table -->
//! | method | changes | what it does | params | answers |
//! | --- | --- | --- | --- | --- |
//! | `get_target` |  | The target's reactors, ports, subsystem NQNs, referrals and options |  | `{reactors, ports: [{id, addr, kind}], subsystems: [nqn], referrals, options}` |
//! | `list_ports` |  | Each port: its address, kind, injected faults and its ANA groups that are not optimized |  | `[{id, addr, kind, delay_us, refuse_connects, ana: [{group, state}]}]` |
//! | `list_subsystems` |  | Each subsystem with its hosts, namespaces and controllers (each key as its fingerprint, never the key) |  | `[{nqn, serial, model, allow_any_host, hosts, auth_hosts, host_keys, namespaces, controllers}]` |
//! | `add_subsystem` | config | Adds a subsystem as the config file's subsystem table gives it, all or nothing; allow_any_host defaults to false: only listed hosts may connect | `nqn: string`, `serial?: string`, `model: string = "qpath"`, `allow_any_host: bool = false`, `hosts: [string or table] = []`, `ports: [integer] = []`, `max_io_queues?: integer`, `queue_size?: integer`, `namespace: [table] = []` | `{nqn, allow_any_host, hosts, warning (when no host may connect)}` |
//! | `remove_subsystem` | config | Removes a subsystem; its controllers fail | `nqn: string` | `{}` |
//! | `add_namespace` | config | Adds a namespace; an existing file is never shrunk, grown only with grow, locked while served | `nqn: string`, `nsid: integer = 0`, `backend: {null,ram,file}`, `size?: size`, `path?: string`, `grow: bool = false`, `block_size: integer = 512`, `ana_group: integer = 1`, `readonly: bool = false`, `ptpl_file?: string`, `uuid?: string`, `qos: table = {}`, `prefault: bool = false`, `huge_pages: bool = false`, `max_size?: size`, `visible: {all,listed} = "all"`, `hosts: [string] = []` | `{nsid}` |
//! | `remove_namespace` | config | Removes a namespace; hosts hear it is gone | `nqn: string`, `nsid: integer` | `{}` |
//! | `resize_namespace` | config | Changes a namespace's size while hosts use it (RAM up to max_size; shrinking refused while data lies past the new end; block devices refused) | `nqn: string`, `nsid: integer`, `size: size` | `{nsid, size, previous_size}` |
//! | `ns_add_host` | config | Lets a host see a namespace that is visible to listed hosts (its controllers see it appear) | `nqn: string`, `nsid: integer`, `host: string` | `{changed}` |
//! | `ns_remove_host` | config | Hides a namespace that is visible to listed hosts from a host (its controllers see it go) | `nqn: string`, `nsid: integer`, `host: string` | `{changed}` |
//! | `add_host` | config | Allows a host to connect to a subsystem | `nqn: string`, `host: string` | `{controllers_failed}` |
//! | `remove_host` | config | Removes a host from a subsystem's list and its keys; its controllers fail at once | `nqn: string`, `host: string` | `{controllers_failed}` |
//! | `set_allow_any_host` | config | Lets any host connect to a subsystem, or only its listed hosts (the others' controllers fail) | `nqn: string`, `allow: bool` | `{controllers_failed}` |
//! | `set_host_auth` | config | Allows a host and sets its DH-HMAC-CHAP keys (no key: clears them); keys are never answered or logged | `nqn: string`, `host: string`, `dhchap_key?: string` (secret), `dhchap_ctrl_key?: string` (secret), `dhchap_key_file?: string`, `dhchap_ctrl_key_file?: string`, `hash?: string`, `dhgroup?: string` | `{}` |
//! | `set_ana_state` | config | Sets the ANA state of a group on a port; hosts hear of the change | `port: integer`, `group: integer`, `state: {optimized,non-optimized,inaccessible,persistent-loss,change}` | `{changed}` |
//! | `set_qos` | config | Sets a namespace's provisioned limits (a limit left out is 0: none) | `nqn: string`, `nsid: integer`, `iops: integer = 0`, `bytes_per_sec: integer = 0`, `delay_us: integer = 0` | `{iops, bytes_per_sec, delay_us}` |
//! | `get_reservation` |  | A namespace's reservation and registrants, as the target holds them | `nqn: string`, `nsid: integer` | `{generation, rtype, registrants: [{hostid, rkey, holds}]}` |
//! | `clear_reservation` | state | Drops every registration and the reservation of a namespace; the registrants hear they were preempted | `nqn: string`, `nsid: integer` | `{cleared_registrations}` |
//! | `add_port` | config | Listens on a new port | `id: integer`, `addr: string`, `kind: {io,discovery} = "io"`, `tls: {none,required,allowed} = "none"`, `tls_offload: {auto,off} = "auto"` | `{addr}` |
//! | `set_port_tls` | config | Sets whether a port speaks TLS 1.3; connections accepted from now on follow it, open ones keep theirs | `id: integer`, `tls: {none,required,allowed}` | `{}` |
//! | `set_host_tls_key` | config | Allows a host and sets (adds or rotates) its TLS PSK in a subsystem (no key: removes it); the key is never answered or logged | `nqn: string`, `host: string`, `tls_key?: string` (secret), `tls_key_file?: string` | `{fingerprint}` |
//! | `remove_port` | config | Closes a port, its listener and connections; discovery controllers on other ports hear of it | `id: integer` | `{}` |
//! | `add_referral` | config | Lists another discovery service (or a subsystem elsewhere) in every port's discovery log | `address: string`, `port: integer = 8009`, `subnqn?: string` | `{}` |
//! | `remove_referral` | config | Removes a referral | `address: string`, `port: integer = 8009`, `subnqn?: string` | `{}` |
//! | `set_port_fault` | state | Injects faults on a port, for failover tests (not saved) | `port: integer`, `delay_us?: integer`, `refuse_connects?: bool`, `drop_connections: bool = false`, `stall_opcode?: integer` | `{}` |
//! | `get_limits` |  | The limits in force, connections refused by reason, and timeouts |  | `{limits, refused, timeouts}` |
//! | `set_limits` | config | Changes connection limits, timeouts and fairness budgets while the target runs | `max_connections_per_port?: integer`, `max_connections_per_host?: integer`, `max_connections_per_hostnqn?: integer`, `connect_timeout_ms?: integer`, `pdu_timeout_ms?: integer`, `max_buffer_bytes_per_connection?: integer`, `rx_budget_pdus?: integer`, `tx_batch_bytes?: integer`, `tx_deadline_us?: integer` | `{limits, refused, timeouts}` |
//! | `save_config` | state | Writes the running configuration as the TOML --config reads, atomically (the previous file kept as FILE.bak; mode 0600 with secrets inline) | `path?: string` | `{path, bytes, mode, inline_secrets, backup}` |
//! | `list_controllers` |  | Every controller, discovery ones too: subsystem, host, port, state, queues |  | `[{cntlid, subnqn, hostnqn, port, state, kato_ms, num_io_queues, io_queues}]` |
//! | `list_queues` |  | Every queue with its counters |  | `[{port, peer, reactor, stats}]` |
//! | `stats` |  | Per-queue counters and latency percentiles; per-port, per-namespace, reactor, auth and reservation totals |  | `{side, queues, ports, namespaces, reactors, auth, reservations}` |
//! <!-- end of methods -->

pub mod methods;
pub mod schema;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::error::{Error, ErrorKind};
use crate::server::Server;
use schema::{Effect, GET_METHODS, Method};

/// Who made a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A process on the socket, as the kernel names it (`SO_PEERCRED`).
    Peer(uring::PeerCredentials),
    /// A process on the socket whose credentials could not be read.
    Unknown,
    /// Code in this process ([`call`]).
    InProcess,
}

/// Answers one request on a socket: the method's name, its parameters as sent, the caller.
pub type Handler = dyn Fn(&str, &Value, Caller) -> Result<Value, Error> + Send + Sync;

/// A running RPC server.
#[derive(Debug)]
pub struct RpcServer {
    path: PathBuf,
    /// The socket file this server bound (device, inode): removed at the end only if the
    /// path still names it.
    file: (u64, u64),
    thread: Option<std::thread::JoinHandle<()>>,
    /// Requests read and not yet answered (their answer not written back).
    answering: Arc<std::sync::atomic::AtomicUsize>,
}

impl RpcServer {
    /// Listens on `path` (see [`RpcServer::start_with`]) and serves the target's methods
    /// ([`methods::TARGET`]). The accept thread holds `server` weakly: once the last other
    /// handle is gone, calls are answered with "the target has stopped".
    pub fn start(path: &Path, server: Arc<Server>) -> Result<RpcServer, Error> {
        let weak: Weak<Server> = Arc::downgrade(&server);
        RpcServer::start_with(
            path,
            Arc::new(move |m: &str, p: &Value, caller: Caller| match weak.upgrade() {
                Some(s) => call_as(&s, m, p, caller),
                None => Err(Error::new(ErrorKind::NotFound, "the target has stopped")),
            }),
        )
    }

    /// Listens on `path` and answers every request with `handler` (the host side's
    /// statistics use the same socket protocol, with their own table: see [`answer`]).
    /// A path another process serves (it accepts a connection) is refused, naming that
    /// process; a stale socket (connection refused) is replaced; anything else at the path
    /// is left alone and refused.
    pub fn start_with(path: &Path, handler: Arc<Handler>) -> Result<RpcServer, Error> {
        claim(path)?;
        let listener = UnixListener::bind(path).map_err(|e| Error::io(format!("RPC socket {}", path.display()), e))?;
        let meta =
            std::fs::symlink_metadata(path).map_err(|e| Error::io(format!("RPC socket {}", path.display()), e))?;
        let answering = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&answering);
        let thread = std::thread::Builder::new()
            .name("qpath-rpc".into())
            .spawn(move || {
                // Not on the I/O path: off the CPUs polling reactors own; its
                // connections' threads inherit the placement.
                let mut place = uring::placement::Helper::default();
                let _ = place.refresh();
                for conn in listener.incoming() {
                    let _ = place.refresh();
                    let Ok(conn) = conn else { continue };
                    let (handler, count) = (Arc::clone(&handler), Arc::clone(&count));
                    let _ = std::thread::Builder::new()
                        .name("qpath-rpc-conn".into())
                        .spawn(move || serve(conn, &handler, &count));
                }
            })
            .map_err(|e| Error::io("spawn RPC thread", e))?;
        tracing::info!(socket = %path.display(), "RPC listening");
        Ok(RpcServer { path: path.to_path_buf(), file: (meta.dev(), meta.ino()), thread: Some(thread), answering })
    }

    /// Waits up to `timeout` until every request read so far has its answer written back
    /// (a call that ends the process, such as bench's `release`, is answered before it
    /// ends). Returns whether none is left unanswered.
    pub fn wait_answered(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.answering.load(std::sync::atomic::Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// Makes `path` free for a new socket without taking it from anyone: nothing there, or a
/// stale socket (removed). A live socket and anything that is not a socket are refused.
fn claim(path: &Path) -> Result<(), Error> {
    if RpcServer::check_path(path)? {
        // Nobody listens: the socket of a process that ended without removing it.
        tracing::info!(socket = %path.display(), "replacing a stale RPC socket (nothing listens on it)");
        std::fs::remove_file(path)
            .map_err(|e| Error::io(format!("remove the stale RPC socket {}", path.display()), e))?;
    }
    Ok(())
}

impl RpcServer {
    /// Whether a server could listen on `path` without taking it from anyone, changing
    /// nothing: `Ok(false)` when nothing is there, `Ok(true)` for a stale socket (nobody
    /// listens: [`RpcServer::start_with`] replaces it), and an error naming the process
    /// when one serves it, or when something that is not a socket is there.
    pub fn check_path(path: &Path) -> Result<bool, Error> {
        let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(false) };
        let shown = path.display();
        if !meta.file_type().is_socket() {
            return Err(Error::new(
                ErrorKind::Exists,
                format!(
                    "RPC socket {shown}: something that is not a socket is there; it is left alone (choose \
                     another path with --rpc-socket)"
                ),
            ));
        }
        match UnixStream::connect(path) {
            Ok(live) => {
                let who = match uring::peer_credentials(live.as_fd()) {
                    Ok(c) if c.pid != 0 => format!("process {} (uid {})", c.pid, c.uid),
                    _ => "another process".to_string(),
                };
                Err(Error::new(
                    ErrorKind::Exists,
                    format!(
                        "RPC socket {shown}: {who} serves it (a running qpath target?); it is left to it: \
                         choose another path with --rpc-socket, or stop that process first"
                    ),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(true),
            Err(e) => Err(Error::io(format!("RPC socket {shown}: cannot tell whether another process serves it"), e)),
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        // Only our own socket: if the path was removed and bound again by another
        // process, that one's stays.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
        // The accept thread is detached: it ends with the process.
        drop(self.thread.take());
    }
}

/// Answers the requests of one connection, counting each in `answering` from its read
/// to its written answer.
fn serve(conn: UnixStream, handler: &Arc<Handler>, answering: &std::sync::atomic::AtomicUsize) {
    use std::sync::atomic::Ordering;
    let caller = match uring::peer_credentials(conn.as_fd()) {
        Ok(c) => Caller::Peer(c),
        Err(_) => Caller::Unknown,
    };
    let Ok(w) = conn.try_clone() else { return };
    let mut w = w;
    let r = BufReader::new(conn);
    for line in r.lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        answering.fetch_add(1, Ordering::AcqRel);
        let written = answer_line(&line, handler, caller, &mut w);
        answering.fetch_sub(1, Ordering::AcqRel);
        if !written {
            return;
        }
    }
}

/// Answers one request line on `w`; returns whether the answer was written.
fn answer_line(line: &str, handler: &Arc<Handler>, caller: Caller, w: &mut UnixStream) -> bool {
    // Bound the request size: a control socket never needs megabytes.
    let resp = if line.len() > 1 << 20 {
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "request too large"}})
    } else {
        match serde_json::from_str::<Value>(line) {
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let method = req.get("method").and_then(Value::as_str).unwrap_or("");
                let params = req.get("params").cloned().unwrap_or(json!({}));
                match handler(method, &params, caller) {
                    Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                    Err(e) => {
                        let code = error_code(e.kind);
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": e.to_string()}})
                    }
                }
            }
            Err(e) => json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": e.to_string()}}),
        }
    };
    writeln!(w, "{resp}").is_ok()
}

/// The JSON-RPC error codes of refusals a client can act on, in the server range: "no
/// such thing", "already there" and "busy, try again". Every other refusal is -32602
/// (invalid params). The server answers with them and the client reads them back.
const ERROR_CODES: [(ErrorKind, i64); 3] =
    [(ErrorKind::NotFound, -32001), (ErrorKind::Exists, -32002), (ErrorKind::Busy, -32003)];

/// The JSON-RPC error code of a refused call ([`ERROR_CODES`], else -32602).
fn error_code(kind: ErrorKind) -> i64 {
    ERROR_CODES.iter().find(|(k, _)| *k == kind).map_or(-32602, |(_, c)| *c)
}

/// The kind of a refusal from its JSON-RPC error code ([`ERROR_CODES`], else a wrong
/// request).
fn error_kind(code: Option<i64>) -> ErrorKind {
    ERROR_CODES.iter().find(|(_, c)| Some(*c) == code).map_or(ErrorKind::Config, |(k, _)| *k)
}

/// Answers one call with `methods`, a socket's table: `rpc_get_methods` answers the table;
/// any other name must be in it, and its parameters pass the schema ([`Method::check`])
/// before `run` gets them, typed. A successful call that changes something leaves its
/// audit line; a failed one a debug line.
pub fn answer<R>(
    methods: &[Method<R>],
    name: &str,
    params: &Value,
    caller: Caller,
    run: impl FnOnce(&Method<R>, &Value) -> Result<Value, Error>,
) -> Result<Value, Error> {
    if name == GET_METHODS {
        schema::check_get_methods(params)?;
        return Ok(schema::describe(methods));
    }
    let m = match schema::find(methods, name) {
        Ok(m) => m,
        Err(e) => {
            failed(name, &Value::Null, caller, &e);
            return Err(e);
        }
    };
    let checked = match m.check(params) {
        Ok(p) => p,
        Err(e) => {
            failed(name, &m.redacted(params), caller, &e);
            return Err(e);
        }
    };
    match run(m, &checked) {
        Ok(v) => {
            if m.effect.changes() {
                audit(m.name, &m.redacted(&checked), caller, "RPC change");
            }
            Ok(v)
        }
        Err(e) => {
            failed(name, &m.redacted(&checked), caller, &e);
            Err(e)
        }
    }
}

/// The audit line of a change: the method, its parameters without secrets, the caller.
fn audit(method: &str, params: &Value, caller: Caller, what: &str) {
    match caller {
        Caller::Peer(c) => tracing::info!(method, uid = c.uid, pid = c.pid, params = %params, "{what}"),
        Caller::Unknown => tracing::info!(method, uid = "unknown", params = %params, "{what}"),
        Caller::InProcess => tracing::info!(method, caller = "in-process", params = %params, "{what}"),
    }
}

fn failed(method: &str, params: &Value, caller: Caller, e: &Error) {
    match caller {
        Caller::Peer(c) => {
            tracing::debug!(method, uid = c.uid, pid = c.pid, params = %params, error = %e, "RPC call failed")
        }
        Caller::Unknown => tracing::debug!(method, uid = "unknown", params = %params, error = %e, "RPC call failed"),
        Caller::InProcess => {
            tracing::debug!(method, caller = "in-process", params = %params, error = %e, "RPC call failed");
        }
    }
}

/// Executes one of the target's methods in this process (for in-process callers and
/// tests): as a call on the socket, checked, typed and audited.
pub fn call(server: &Server, method: &str, p: &Value) -> Result<Value, Error> {
    call_as(server, method, p, Caller::InProcess)
}

/// Executes one of the target's methods for `caller`. A method that changes the
/// configuration runs under the change lock and is followed by the save `--persist` asks
/// for (`crate::persist`): when that save fails, the call fails saying the change is in
/// force but not saved (and the audit log says so too).
pub fn call_as(server: &Server, method: &str, p: &Value, caller: Caller) -> Result<Value, Error> {
    answer(methods::TARGET, method, p, caller, |m, p| {
        if m.effect != Effect::Configures {
            return (m.run)(server, p);
        }
        let _changes = server.lock_changes();
        let result = (m.run)(server, p)?;
        if let Err(e) = crate::persist::changed(server, m.name) {
            audit(m.name, &m.redacted(p), caller, "RPC change in force, not saved");
            return Err(e);
        }
        Ok(result)
    })
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
        return Err(Error::new(error_kind(err.get("code").and_then(Value::as_i64)), msg.to_string()));
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use schema::{Need, Type};
    use std::fmt::Write as _;

    const NQN: &str = crate::config::DEFAULT_NQN;

    /// A directory of its own for one test, removed at the end.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("qpath-rpc-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn target() -> Server {
        let mut c = Config::embedded_default();
        c.ports = vec![crate::config::PortConfig::io(1, "127.0.0.1:0")];
        c.start().unwrap()
    }

    fn type_doc(t: &Type) -> String {
        match t {
            Type::String => "string".into(),
            Type::Integer { .. } => "integer".into(),
            Type::Number => "number".into(),
            Type::Boolean => "bool".into(),
            Type::Size => "size".into(),
            Type::Enum(v) => {
                format!("{{{}}}", v.iter().map(|v| v.split('|').next().unwrap()).collect::<Vec<_>>().join(","))
            }
            Type::Array(item) => format!("[{}]", type_doc(item)),
            Type::Object(_) => "table".into(),
            Type::OneOf(types) => types.iter().map(type_doc).collect::<Vec<_>>().join(" or "),
        }
    }

    /// The module doc's table of methods, as the table says it.
    fn doc_table() -> String {
        let mut out = String::from(
            "//! | method | changes | what it does | params | answers |\n//! | --- | --- | --- | --- | --- |\n",
        );
        for m in methods::TARGET {
            let changes = match m.effect {
                Effect::Reads => "",
                Effect::Acts => "state",
                Effect::Configures => "config",
            };
            let params: Vec<String> = m
                .params
                .iter()
                .map(|p| {
                    let ty = type_doc(&p.ty);
                    let secret = if p.secret { " (secret)" } else { "" };
                    match p.need {
                        Need::Required => format!("`{}: {ty}`{secret}", p.name),
                        Need::Optional => format!("`{}?: {ty}`{secret}", p.name),
                        Need::Default(d) => format!("`{}: {ty} = {d}`{secret}", p.name),
                    }
                })
                .collect();
            let row = format!("| `{}` | {changes} | {} | {} | `{}` |", m.name, m.summary, params.join(", "), m.result);
            assert!(!row.contains("\\|"), "{row}");
            writeln!(out, "//! {}", row.trim_end()).unwrap();
        }
        out
    }

    /// The table at the top of this file is the method table: a method added, removed or
    /// changed there changes it. `QPATH_BLESS=1 cargo test -p qpath-target --lib
    /// module_doc_lists_the_table` writes it again.
    #[test]
    fn module_doc_lists_the_table() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/src/rpc.rs");
        let text = std::fs::read_to_string(file).unwrap();
        let begin = "by the test module_doc_lists_the_table -->\n";
        let end = "//! <!-- end of methods -->";
        let a = text.find(begin).expect("the begin marker") + begin.len();
        let b = text.find(end).expect("the end marker");
        let want = doc_table();
        if text[a..b] != want && std::env::var_os("QPATH_BLESS").is_some() {
            std::fs::write(file, format!("{}{want}{}", &text[..a], &text[b..])).unwrap();
            return;
        }
        assert!(text[a..b] == want, "rpc.rs's table of methods is not the table's; QPATH_BLESS=1 rewrites it:\n{want}");
        // And every method is documented once, by name.
        for m in methods::TARGET {
            assert_eq!(text[a..b].matches(&format!("| `{}` |", m.name)).count(), 1, "{}", m.name);
        }
    }

    /// `delay_us` and `stall_opcode` act per command, only with the `fault-injection`
    /// feature: without it the RPC refuses them and changes nothing (not even the faults
    /// the same call asks for that would work); with it they are set. `-1`/0 ask for no
    /// fault and are always taken.
    #[test]
    fn set_port_fault_refuses_per_command_faults_it_cannot_inject() {
        use std::sync::atomic::Ordering::Relaxed;
        let server = target();
        let port = server.state.port(1).unwrap();
        let r = call(&server, "set_port_fault", &json!({"port": 1, "delay_us": 5, "refuse_connects": true}));
        if crate::port::PortFaults::PER_COMMAND {
            r.unwrap();
            assert_eq!(port.faults.delay_us.load(Relaxed), 5);
            call(&server, "set_port_fault", &json!({"port": 1, "stall_opcode": 2})).unwrap();
            assert_eq!(port.faults.stall_opcode.load(Relaxed), 3);
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("port 1: delay_us") && e.contains("fault-injection"), "{e}");
            assert!(!port.faults.refuse_connects.load(Relaxed), "a refused call changes nothing");
            let e = call(&server, "set_port_fault", &json!({"port": 1, "stall_opcode": 2})).unwrap_err().to_string();
            assert!(e.contains("port 1: stall_opcode"), "{e}");
            let none = json!({"port": 1, "delay_us": 0, "stall_opcode": -1, "refuse_connects": true});
            call(&server, "set_port_fault", &none).unwrap();
            assert!(port.faults.refuse_connects.load(Relaxed));
        }
        assert_eq!(
            call(&server, "list_ports", &json!({})).unwrap()[0]["delay_us"],
            port.faults.delay_us.load(Relaxed),
            "list_ports shows what is in force"
        );
        server.shutdown();
    }

    #[test]
    fn rpc_get_methods_answers_the_table_without_secrets() {
        let server = target();
        let v = call(&server, GET_METHODS, &json!({})).unwrap();
        let all = v.as_array().unwrap();
        assert_eq!(all.len(), methods::TARGET.len() + 1);
        assert_eq!(all[0]["name"], GET_METHODS);
        let auth = all.iter().find(|m| m["name"] == "set_host_auth").unwrap();
        let key = auth["params"].as_array().unwrap().iter().find(|p| p["name"] == "dhchap_key").unwrap();
        assert_eq!((&key["secret"], &key["type"], &key["required"]), (&json!(true), &json!("string"), &json!(false)));
        let add = all.iter().find(|m| m["name"] == "add_subsystem").unwrap();
        assert!(add["description"].as_str().unwrap().contains("allow_any_host defaults to false"));
        assert_eq!(add["changes"], "configuration");
        assert!(
            call(&server, GET_METHODS, &json!({"current": true})).unwrap_err().to_string().contains("no parameters")
        );
        server.shutdown();
    }

    #[test]
    fn typed_by_schema_and_refused_by_name() {
        let server = target();
        // Strings convert where the schema wants a number, boolean or size.
        assert_eq!(
            call(&server, "add_namespace", &json!({"nqn": NQN, "backend": "null", "size": "1M", "nsid": "5"})).unwrap()
                ["nsid"],
            5
        );
        call(&server, "set_allow_any_host", &json!({"nqn": NQN, "allow": "true"})).unwrap();
        call(&server, "remove_namespace", &json!({"nqn": NQN, "nsid": "5"})).unwrap();
        let e = call(&server, "set_qos", &json!({"nqn": NQN, "nsid": 1, "iops_limit": 100})).unwrap_err().to_string();
        assert!(e.contains("unknown parameter \"iops_limit\" (did you mean \"iops\"?); set_qos takes nqn, nsid, iops, bytes_per_sec, delay_us"), "{e}");
        let e = call(&server, "set_limits", &json!({"rx_budget_pdus": "3x"})).unwrap_err().to_string();
        assert_eq!(e, "set_limits: rx_budget_pdus: expected an integer from 0 to 4294967295, got \"3x\"");
        let e = call(&server, "remove_namespace", &json!({"nqn": NQN})).unwrap_err().to_string();
        assert!(e.starts_with("remove_namespace: missing parameter \"nsid\""), "{e}");
        let e = call(&server, "add_subsystem", &json!({"nqn": "nqn.2026-11.io.qpath:x", "namespace": [{"backend": "ram", "size": "1M", "blocksize": 4096}]})).unwrap_err().to_string();
        assert!(e.contains("\"namespace[0].blocksize\" (did you mean \"block_size\"?)"), "{e}");
        assert!(server.state.subsystem("nqn.2026-11.io.qpath:x").is_none(), "nothing added");
        let e = call(&server, "remove_namespcae", &json!({})).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.to_string().contains("did you mean \"remove_namespace\""), "{e}");
        server.shutdown();
    }

    #[test]
    fn add_subsystem_says_when_no_host_may_connect() {
        let server = target();
        let v = call(&server, "add_subsystem", &json!({"nqn": "nqn.2026-11.io.qpath:closed"})).unwrap();
        assert_eq!(v["allow_any_host"], false);
        assert!(v["warning"].as_str().unwrap().contains("no host may connect"), "{v}");
        let v = call(&server, "add_subsystem", &json!({"nqn": "nqn.2026-11.io.qpath:open", "allow_any_host": "true"}))
            .unwrap();
        assert_eq!((&v["allow_any_host"], v.get("warning")), (&json!(true), None), "{v}");
        let host = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
        let v =
            call(&server, "add_subsystem", &json!({"nqn": "nqn.2026-11.io.qpath:listed", "hosts": [host]})).unwrap();
        assert_eq!((&v["hosts"], v.get("warning")), (&json!([host]), None), "{v}");
        server.shutdown();
    }

    /// A `tracing` subscriber writing to a buffer, for the calls made on this thread.
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Log {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn changes_leave_an_audit_line_without_secrets() {
        let server = target();
        let log = Log::default();
        let w = log.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        let peer = Caller::Peer(uring::PeerCredentials { pid: 4242, uid: 1234, gid: 5 });
        let key = nvme::auth::Secret::generate(Some(nvme::auth::HashId::Sha256), 32).unwrap().to_string();
        let host = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
        tracing::subscriber::with_default(sub, || {
            call_as(&server, "set_qos", &json!({"nqn": NQN, "nsid": "1", "iops": "100"}), peer).unwrap();
            call_as(&server, "set_host_auth", &json!({"nqn": NQN, "host": host, "dhchap_key": key}), peer).unwrap();
            let sub = json!({"nqn": "nqn.2026-11.io.qpath:a", "hosts": [{"nqn": host, "dhchap_key": key}]});
            call_as(&server, "add_subsystem", &sub, peer).unwrap();
            call_as(&server, "list_subsystems", &json!({}), peer).unwrap();
            // Refused calls: one debug line each; a secret sent where it does not belong
            // is not shown either.
            call_as(&server, "set_host_auth", &json!({"nqn": NQN, "host": host, "dhchap_secret": key}), peer)
                .unwrap_err();
            call_as(&server, "set_qos", &json!({"nqn": NQN, "nsid": 1, "iops_limit": 1}), peer).unwrap_err();
        });
        let text = log.text();
        let lines: Vec<&str> = text.lines().collect();
        let changes: Vec<&&str> = lines.iter().filter(|l| l.contains("RPC change")).collect();
        assert_eq!(changes.len(), 3, "one line per change, none for list_subsystems:\n{text}");
        assert!(
            changes.iter().all(|l| l.contains(" INFO ") && l.contains("uid=1234") && l.contains("pid=4242")),
            "{text}"
        );
        assert!(changes[0].contains("method=\"set_qos\"") && changes[0].contains("\"iops\":100"), "{text}");
        assert!(changes[1].contains("\"dhchap_key\":\"<secret>\""), "{text}");
        assert!(changes[2].contains("\"dhchap_key\":\"<secret>\""), "nested in a host table too: {text}");
        let failed: Vec<&&str> = lines.iter().filter(|l| l.contains("RPC call failed")).collect();
        assert_eq!(failed.len(), 2, "{text}");
        assert!(failed.iter().all(|l| l.contains("DEBUG") && l.contains("error=")), "{text}");
        assert!(failed[1].contains("iops_limit"), "{text}");
        let body = key.split(':').nth(2).unwrap();
        assert!(!text.contains(&key) && !text.contains(body), "a secret reached the log:\n{text}");
        server.shutdown();
    }

    #[test]
    fn a_served_socket_is_not_taken_and_a_stale_one_is_replaced() {
        let d = Dir::new("claim");
        let path = d.0.join("rpc.sock");
        let handler: Arc<Handler> =
            Arc::new(|m: &str, p: &Value, c: Caller| answer::<()>(&[], m, p, c, |_, _| Ok(Value::Null)));
        let first = RpcServer::start_with(&path, Arc::clone(&handler)).unwrap();
        let e = RpcServer::start_with(&path, Arc::clone(&handler)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Exists);
        let msg = e.to_string();
        assert!(msg.contains(&format!("process {}", std::process::id())) && msg.contains("--rpc-socket"), "{msg}");
        // The first keeps serving.
        assert!(client_call(&path, GET_METHODS, json!({})).unwrap().is_array());
        drop(first);
        assert!(!path.exists(), "its own socket is removed at the end");

        // A socket nobody listens on (its process died): replaced.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let again = RpcServer::start_with(&path, Arc::clone(&handler)).unwrap();
        assert!(client_call(&path, GET_METHODS, json!({})).is_ok());
        // Its path taken over after it was removed: the newcomer's socket stays.
        std::fs::remove_file(&path).unwrap();
        let other = UnixListener::bind(&path).unwrap();
        drop(again);
        assert!(path.exists(), "another process's socket is not removed");
        drop(other);
        std::fs::remove_file(&path).unwrap();

        // Something that is not a socket: left alone.
        std::fs::write(&path, b"user data").unwrap();
        let e = RpcServer::start_with(&path, handler).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"user data");
    }

    #[test]
    fn wait_answered_returns_once_every_call_read_has_its_answer_written() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc;
        let d = Dir::new("answered");
        let path = d.0.join("rpc.sock");
        let (entered_tx, entered) = mpsc::channel::<()>();
        let (go, go_rx) = mpsc::channel::<()>();
        let (entered_tx, go_rx) = (std::sync::Mutex::new(entered_tx), std::sync::Mutex::new(go_rx));
        let done = Arc::new(AtomicBool::new(false));
        let d2 = Arc::clone(&done);
        let handler: Arc<Handler> = Arc::new(move |_: &str, _: &Value, _: Caller| {
            entered_tx.lock().unwrap().send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
            d2.store(true, Ordering::Release);
            Ok(json!("answered"))
        });
        let s = RpcServer::start_with(&path, handler).unwrap();
        assert!(s.wait_answered(Duration::ZERO), "nothing asked, nothing owed");
        let p2 = path.clone();
        let client = std::thread::spawn(move || client_call(&p2, "slow", json!({})));
        entered.recv().unwrap();
        assert!(!s.wait_answered(Duration::from_millis(20)), "a call in its handler is not answered yet");
        go.send(()).unwrap();
        assert!(s.wait_answered(Duration::from_secs(30)));
        assert!(done.load(Ordering::Acquire), "not before the handler returned");
        assert_eq!(client.join().unwrap().unwrap(), json!("answered"));
    }

    #[test]
    fn the_socket_passes_the_callers_credentials() {
        let d = Dir::new("peer");
        let path = d.0.join("rpc.sock");
        let handler: Arc<Handler> = Arc::new(|_: &str, _: &Value, c: Caller| match c {
            Caller::Peer(p) => Ok(json!({"pid": p.pid, "uid": p.uid})),
            other => Ok(json!(format!("{other:?}"))),
        });
        let _s = RpcServer::start_with(&path, handler).unwrap();
        let v = client_call(&path, "who", json!({})).unwrap();
        assert_eq!(v["pid"], std::process::id(), "{v}");
    }

    #[test]
    fn a_refusal_keeps_its_kind_across_the_socket() {
        let d = Dir::new("kinds");
        let path = d.0.join("rpc.sock");
        let handler: Arc<Handler> = Arc::new(|m: &str, _: &Value, _: Caller| {
            let kind = match m {
                "missing" => ErrorKind::NotFound,
                "twice" => ErrorKind::Exists,
                "busy" => ErrorKind::Busy,
                _ => ErrorKind::Config,
            };
            Err(Error::new(kind, format!("refused {m}")))
        });
        let _s = RpcServer::start_with(&path, handler).unwrap();
        for (m, kind) in [
            ("missing", ErrorKind::NotFound),
            ("twice", ErrorKind::Exists),
            ("busy", ErrorKind::Busy),
            ("wrong", ErrorKind::Config),
        ] {
            let e = client_call(&path, m, json!({})).unwrap_err();
            assert_eq!((e.kind, e.context.as_str()), (kind, format!("refused {m}").as_str()));
        }
        assert_eq!(error_code(ErrorKind::Busy), -32003, "busy is not a wrong request (-32602)");
    }
}
