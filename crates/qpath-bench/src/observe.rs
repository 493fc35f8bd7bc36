//! Statistics of a running benchmark for outside readers: the host's per-queue,
//! per-controller, per-path and per-namespace statistics ([`host::stats`]) and,
//! with the embedded target, the target's, over a JSON-RPC Unix socket (`qpath
//! stats --socket`) and a Prometheus `/metrics` endpoint. The servers are the
//! target's ([`target::rpc::RpcServer::start_with`], [`target::metrics::MetricsServer`]);
//! only the methods and the text differ.
//!
//! ```text
//!  job threads: Context ──publish every 100 ms──► HostStats ─┐
//!  embedded target reactors ──10 ms tick──────► TargetState ─┤
//!                                                            ├─► RPC: stats, target_stats, bench_status, release,
//!                                                            │        reauthenticate
//!                                                            └─► GET /metrics: qpath_host_*, qpath_target_*, qpath_bench_running
//! ```
//!
//! `--linger SECONDS` keeps both up after the jobs end (until the time passes or
//! a client calls `release`), so a scraper can read the final counts, which
//! are exact once every job's context has been dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use host::stats::HostStats;
use serde_json::{Value, json};
use target::error::{Error as TargetError, ErrorKind as TargetErrorKind};
use target::metrics::MetricsServer;
use target::registry::TargetState;
use target::rpc::schema::{Effect, Method, Param, Type, U32};
use target::rpc::{Caller, RpcServer};

use crate::error::{Error, ErrorKind, Result};

/// Whose statistics the endpoints serve.
#[derive(Clone)]
pub struct Sources {
    /// The host side (every `qpath` engine context of the run publishes here).
    pub host: Arc<HostStats>,
    /// The embedded target, when one runs in this process.
    pub target: Option<Arc<TargetState>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").field("host", &self.host).field("target", &self.target.is_some()).finish()
    }
}

#[derive(Default)]
struct RunState {
    running: AtomicBool,
    released: Mutex<bool>,
    cv: Condvar,
}

/// The running endpoints of one benchmark.
pub struct Endpoints {
    rpc: Option<RpcServer>,
    metrics: Option<MetricsServer>,
    state: Arc<RunState>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints").field("rpc", &self.rpc).field("metrics", &self.metrics_addr()).finish()
    }
}

/// The `/metrics` text: the host's, the embedded target's, and whether the jobs still run.
pub fn render(src: &Sources, running: bool) -> String {
    let mut out = host::metrics::render(&src.host);
    if let Some(t) = &src.target {
        out.push_str(&target::metrics::render(t));
    }
    out.push_str("# HELP qpath_bench_running 1 while the benchmark's jobs run, 0 after.\n");
    out.push_str("# TYPE qpath_bench_running gauge\n");
    out.push_str(if running { "qpath_bench_running 1\n" } else { "qpath_bench_running 0\n" });
    out
}

/// What serves one of the host side's methods: the parameters are checked and typed.
type Run = fn(&Sources, &RunState, &Value) -> std::result::Result<Value, TargetError>;

/// The host side's methods (`qpath rpc --socket host.sock --list`): `rpc_get_methods`
/// answers this table, and requests are checked against it as the target's are.
static METHODS: &[Method<Run>] = &[
    Method {
        name: "stats",
        summary: "The host's per-queue, per-controller, per-path and per-namespace statistics",
        effect: Effect::Reads,
        params: &[],
        result: "{side: \"host\", queues, controllers, paths, namespaces, ...}",
        run: stats,
    },
    Method {
        name: "target_stats",
        summary: "The embedded target's statistics, as its own stats method answers them",
        effect: Effect::Reads,
        params: &[],
        result: "{side: \"target\", queues, ports, namespaces, ...}",
        run: target_stats,
    },
    Method {
        name: "bench_status",
        summary: "Whether the benchmark's jobs still run",
        effect: Effect::Reads,
        params: &[],
        result: "{running}",
        run: bench_status,
    },
    Method {
        name: "release",
        summary: "Ends --linger: the endpoints close and the run ends",
        effect: Effect::Acts,
        params: &[],
        result: "{}",
        run: release,
    },
    Method {
        name: "reauthenticate",
        summary: "Re-authenticates the run's live controllers (DH-HMAC-CHAP), with new secrets if given",
        effect: Effect::Acts,
        params: &[
            Param::optional("ctrl", U32, "the controller's number in this run (default: every live controller)"),
            Param::optional("dhchap_secret", Type::String, "the host's new secret, DHHC-1:hh:base64:").secret(),
            Param::optional("dhchap_ctrl_secret", Type::String, "the controller's new secret (bidirectional)").secret(),
            Param::default("timeout_s", Type::Number, "30", "how long each controller may take (0.1 to 600 s)"),
        ],
        result: "[{ctrl, traddr, subnqn, ok, io_queues, ms, failed: [{qid, error}], error}]",
        run: reauthenticate,
    },
];

/// RPC `reauthenticate {ctrl?, dhchap_secret?, dhchap_ctrl_secret?, timeout_s?}`: re-authenticates
/// the run's live controllers (or controller number `ctrl`), with new secrets if given
/// ([`host::controller::Controller::reauthenticate`]), on the RPC thread: never a job's.
fn reauthenticate(src: &Sources, _: &RunState, params: &Value) -> std::result::Result<Value, TargetError> {
    let invalid = |m: String| TargetError::new(TargetErrorKind::Config, m);
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let keys = host::auth::DhchapKeys::parse(text("dhchap_secret"), text("dhchap_ctrl_secret"))
        .map_err(|e| invalid(e.to_string()))?;
    let timeout =
        Duration::from_secs_f64(params.get("timeout_s").and_then(Value::as_f64).unwrap_or(30.0).clamp(0.1, 600.0));
    let want = params.get("ctrl").and_then(Value::as_u64);
    let ctrls: Vec<_> =
        src.host.live_controllers().into_iter().filter(|(n, _)| want.is_none_or(|w| u64::from(*n) == w)).collect();
    if ctrls.is_empty() {
        return Err(TargetError::new(TargetErrorKind::NotFound, "no such live controller in this run"));
    }
    let out: Vec<Value> = ctrls
        .iter()
        .map(|(n, c)| {
            let id = json!({"ctrl": n, "traddr": c.opts.traddr.to_string(), "subnqn": c.opts.subnqn});
            let r = match c.reauthenticate(keys.clone(), timeout) {
                Ok(r) => json!({
                    "ok": r.failed.is_empty(), "io_queues": r.io_queues, "ms": r.took.as_secs_f64() * 1e3,
                    "failed": r.failed.iter().map(|(q, e)| json!({"qid": q, "error": e})).collect::<Vec<_>>(),
                }),
                Err(e) => json!({"ok": false, "error": e.to_string()}),
            };
            let (Value::Object(mut a), Value::Object(b)) = (id, r) else { unreachable!("two JSON objects") };
            a.extend(b);
            Value::Object(a)
        })
        .collect();
    Ok(Value::Array(out))
}

fn stats(src: &Sources, _: &RunState, _: &Value) -> std::result::Result<Value, TargetError> {
    Ok(host::metrics::stats_json(&src.host))
}

fn target_stats(src: &Sources, _: &RunState, _: &Value) -> std::result::Result<Value, TargetError> {
    match &src.target {
        Some(t) => Ok(target::metrics::stats_json(t)),
        None => Err(TargetError::new(TargetErrorKind::NotFound, "no embedded target in this process")),
    }
}

fn bench_status(_: &Sources, state: &RunState, _: &Value) -> std::result::Result<Value, TargetError> {
    Ok(json!({"running": state.running.load(Ordering::Acquire)}))
}

fn release(_: &Sources, state: &RunState, _: &Value) -> std::result::Result<Value, TargetError> {
    *state.released.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
    state.cv.notify_all();
    Ok(json!({}))
}

/// Answers one call from `caller` ([`target::rpc::answer`]: checked against [`METHODS`]).
fn call_as(
    src: &Sources,
    state: &RunState,
    method: &str,
    params: &Value,
    caller: Caller,
) -> std::result::Result<Value, TargetError> {
    target::rpc::answer(METHODS, method, params, caller, |m, p| (m.run)(src, state, p))
}

#[cfg(test)]
fn call(src: &Sources, state: &RunState, method: &str, params: &Value) -> std::result::Result<Value, TargetError> {
    call_as(src, state, method, params, Caller::InProcess)
}

impl Endpoints {
    /// Serves `src` on the RPC socket `rpc` and on `GET /metrics` at `metrics` (port 0
    /// picks a free one: see [`Endpoints::metrics_addr`]); either may be absent.
    pub fn start(rpc: Option<&Path>, metrics: Option<SocketAddr>, src: Sources) -> Result<Endpoints> {
        let state = Arc::new(RunState { running: AtomicBool::new(true), ..RunState::default() });
        let fail = |what: &str, e: TargetError| Error::new(ErrorKind::Io, format!("{what}: {e}"));
        let rpc = match rpc {
            Some(path) => {
                let (s, st) = (src.clone(), Arc::clone(&state));
                let handler = Arc::new(move |m: &str, p: &Value, c: Caller| call_as(&s, &st, m, p, c));
                Some(RpcServer::start_with(path, handler).map_err(|e| fail("RPC socket", e))?)
            }
            None => None,
        };
        let metrics = match metrics {
            Some(addr) => {
                let (s, st) = (src, Arc::clone(&state));
                let render = Arc::new(move || render(&s, st.running.load(Ordering::Acquire)));
                Some(MetricsServer::start(addr, render).map_err(|e| fail("metrics endpoint", e))?)
            }
            None => None,
        };
        Ok(Endpoints { rpc, metrics, state })
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::addr)
    }

    /// The jobs ended: `qpath_bench_running` turns 0, `bench_status` says so.
    pub fn finished(&self) {
        self.state.running.store(false, Ordering::Release);
    }

    /// Keeps serving for up to `linger`, or until a client calls `release`; then returns
    /// once that call is answered (the process may end right after: the caller must not
    /// be left without its answer), waiting at most a second for it.
    pub fn linger(&self, linger: Duration) {
        let deadline = Instant::now() + linger;
        let mut released = self.state.released.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while !*released {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            released = self.state.cv.wait_timeout(released, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
        drop(released);
        if let Some(rpc) = &self.rpc {
            rpc.wait_answered(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_methods_and_metrics_text() {
        let src = Sources { host: HostStats::new(), target: None };
        let st = RunState { running: AtomicBool::new(true), ..RunState::default() };
        assert_eq!(call(&src, &st, "stats", &json!({})).unwrap()["side"], "host");
        assert_eq!(call(&src, &st, "bench_status", &json!({})).unwrap()["running"], true);
        assert_eq!(call(&src, &st, "target_stats", &json!({})).unwrap_err().kind, TargetErrorKind::NotFound);
        assert!(call(&src, &st, "nope", &json!({})).is_err());
        // Its own table, checked as the target's is.
        let methods = call(&src, &st, "rpc_get_methods", &json!({})).unwrap();
        let names: Vec<&str> = methods.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["rpc_get_methods", "stats", "target_stats", "bench_status", "release", "reauthenticate"]);
        let e = call(&src, &st, "reauthenticate", &json!({"dhchap_key": "x"})).unwrap_err().to_string();
        assert!(e.contains("reauthenticate takes ctrl, dhchap_secret, dhchap_ctrl_secret, timeout_s"), "{e}");
        let e = call(&src, &st, "reauthenticate", &json!({"timeout_s": "soon"})).unwrap_err().to_string();
        assert!(e.contains("timeout_s: expected a number, got \"soon\""), "{e}");
        assert!(render(&src, true).ends_with("qpath_bench_running 1\n"));
        assert!(render(&src, false).contains("qpath_host_contexts 0"));
    }

    #[test]
    fn reauthenticate_renews_the_runs_controllers() {
        use nvme::auth::{DhGroup, HashId, Secret};
        use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};
        const NQN: &str = "nqn.2026-11.io.qpath:observe-auth";
        const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5e7a1c-2d3f-4a5b-8c6d-7e8f9a0b1c2d";
        let key = Secret::generate(Some(HashId::Sha256), 32).unwrap();
        let mut c = Config::embedded_default();
        c.ports = vec![PortConfig::io(1, "127.0.0.1:0".to_string())];
        c.subsystems = vec![SubsystemConfig {
            allow_any_host: false,
            hosts: vec![HostEntry::Auth(HostAuthConfig {
                nqn: HOST.into(),
                dhchap_key: Some(key.to_string()),
                dhchap_ctrl_key: None,
                hash: None,
                dhgroup: Some(DhGroup::Ffdhe2048.name().into()),
                ..Default::default()
            })],
            ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "1M")])
        }];
        let server = c.start().unwrap();
        let mut o = host::controller::ConnectOptions::new(server.local_addr(1).unwrap(), NQN);
        (o.hostnqn, o.nr_io_queues, o.dhchap_secret) = (HOST.into(), 2, Some(key.to_string()));
        let ctrl = host::controller::Controller::connect(o).unwrap();
        let src = Sources { host: HostStats::new(), target: None };
        let st = RunState::default();
        assert_eq!(call(&src, &st, "reauthenticate", &json!({})).unwrap_err().kind, TargetErrorKind::NotFound);
        let n = src.host.controller_number(&ctrl);
        let v = call(&src, &st, "reauthenticate", &json!({})).unwrap();
        assert_eq!((&v[0]["ctrl"], &v[0]["ok"], &v[0]["io_queues"]), (&n.into(), &true.into(), &2.into()), "{v}");
        // A secret the target does not hold: refused on the admin queue, said so.
        let other = Secret::generate(Some(HashId::Sha256), 32).unwrap().to_string();
        let v = call(&src, &st, "reauthenticate", &json!({"ctrl": n, "dhchap_secret": other})).unwrap();
        assert!(v[0]["ok"] == false && v[0]["error"].as_str().unwrap().contains("AUTH_Failure1"), "{v}");
        assert_eq!((ctrl.info().reauths, ctrl.info().reauth_failures), (1, 1));
        let bad = call(&src, &st, "reauthenticate", &json!({"dhchap_secret": "DHHC-1:00:nope:"}));
        assert_eq!(bad.unwrap_err().kind, TargetErrorKind::Config);
        ctrl.delete();
        server.shutdown();
    }

    #[test]
    fn release_ends_the_linger() {
        let dir = std::env::temp_dir().join(format!("qpath-observe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("rpc.sock");
        let src = Sources { host: HostStats::new(), target: None };
        let e = Endpoints::start(Some(&sock), Some("127.0.0.1:0".parse().unwrap()), src).unwrap();
        assert!(e.metrics_addr().is_some_and(|a| a.port() != 0));
        e.finished();
        let s2 = sock.clone();
        let t = std::thread::spawn(move || {
            assert_eq!(target::rpc::client_call(&s2, "bench_status", json!({})).unwrap()["running"], false);
            target::rpc::client_call(&s2, "release", json!({})).unwrap();
        });
        let t0 = Instant::now();
        e.linger(Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(20), "release ended the linger");
        let rpc = e.rpc.as_ref().expect("the RPC socket");
        assert!(rpc.wait_answered(Duration::ZERO), "the linger ends once release is answered, not before");
        t.join().unwrap();
        drop(e);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
