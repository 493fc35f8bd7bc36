//! `qpath lab auth-stall`: a QD1 queue on a target reactor while another host connects
//! with DH-HMAC-CHAP over ffdhe8192, the Diffie-Hellman steps on the reactor
//! (`auth_workers = 0`, the behaviour before) and on the target's workers (the default).
//!
//! ```text
//!   host context (CPU 1): QD1 4k reads on controller A ─┐
//!                                                        ▼
//!   embedded target, one reactor (CPU 0, busy poll): A's I/O queue, and each queue B connects
//!                                                        ▲
//!   connector thread (unpinned): connect B (admin + N I/O queues, ffdhe8192, both ways), delete, again
//! ```
//!
//! Every queue B connects costs the target two 8192-bit modular exponentiations (16 ms
//! each here). Each case: a fresh target, QD1 alone for `--runtime`, then QD1 while
//! `--connects` connects of B run back to back. The connector's own DH steps (the
//! host's) run on whichever core the scheduler gives them in both cases.
//!
//! `--reauth`: no B; A itself authenticates (admin + `--queues` I/O queues, the QD1
//! reads on the first), and during the second phase re-authenticates all its queues
//! `--connects` times in a row (`Controller::reauthenticate`, at nice 0: it is this
//! host's own work). The QD1 queue's transaction goes through its context beside the
//! reads; the host's DH steps run on the re-authenticating thread, never on the context.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use nvme::auth::{DhGroup, HashId, Secret};
use serde_json::{Value, json};
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, SubsystemConfig};
use target::reactor::PollMode;
use uring::{IoBuf, Wait};

use crate::result::{Cell, LabOutputArgs, LabResult};
use bench::{Error, ErrorKind, Result};

const BS: u32 = 4096;
const AUTH_NQN: &str = "nqn.2026-11.io.qpath:auth-stall";
const AUTH_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7a3c1e0b-5d2f-4b8e-9c61-0a1b2c3d4e5f";
const GROUP: DhGroup = DhGroup::Ffdhe8192;
/// How long the connects may take in all before the phase gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);
/// Nice value of the connecting host's thread.
const CONNECTOR_NICE: i32 = 19;
/// A read slower than this counts as stalled (1 ms).
const STALL_NS: u64 = 1_000_000;

/// Arguments of `qpath lab auth-stall`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthStallArgs {
    /// Seconds of QD1 alone in each case.
    #[arg(long, default_value = "2", value_parser = crate::seconds_up_to::<600>)]
    pub runtime: f64,
    /// Connects of the authenticating controller in each case.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub connects: u32,
    /// I/O queues the authenticating controller connects each time (plus its admin queue).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub queues: u16,
    /// How the QD1 host context waits for its read: `block` (sleeps in the kernel: its
    /// core is mostly idle, room for the target's helpers and the other host) or `busy`
    /// (polls: with the busy reactor every core of a 2-CPU machine is taken, so any other
    /// thread's time comes from one of them, and the nice-19 connector crawls).
    #[arg(long = "host-wait", default_value = "block", value_parser = parse_host_wait)]
    pub host_wait: HostWait,
    /// The QD1 controller itself authenticates and, during the second phase,
    /// re-authenticates its live queues `--connects` times (instead of another host
    /// connecting).
    #[arg(long)]
    pub reauth: bool,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for AuthStallArgs {
    fn default() -> Self {
        AuthStallArgs {
            runtime: 2.0,
            connects: 4,
            queues: 2,
            host_wait: HostWait::Busy,
            reauth: false,
            output: LabOutputArgs::default(),
        }
    }
}

/// `--host-wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostWait {
    /// Poll the ring.
    Busy,
    /// Sleep in `io_uring_enter` until the completion.
    Block,
}

fn parse_host_wait(s: &str) -> std::result::Result<HostWait, String> {
    match s {
        "busy" => Ok(HostWait::Busy),
        "block" => Ok(HostWait::Block),
        _ => Err(format!("{s:?}: busy or block")),
    }
}

impl HostWait {
    fn wait(self) -> Wait {
        match self {
            HostWait::Busy => Wait::Poll,
            HostWait::Block => Wait::Block { timeout: Some(Duration::from_millis(100)) },
        }
    }

    fn name(self) -> &'static str {
        match self {
            HostWait::Busy => "busy",
            HostWait::Block => "block",
        }
    }
}

/// QD1 reads of one phase.
#[derive(Debug, Clone)]
pub struct Qd1 {
    /// Completed reads.
    pub ios: u64,
    /// Failed reads.
    pub errors: u64,
    /// Seconds the phase ran.
    pub secs: f64,
    /// Latencies, ns.
    pub latency: Histogram<u64>,
}

impl Qd1 {
    fn new() -> Qd1 {
        Qd1 { ios: 0, errors: 0, secs: 0.0, latency: Histogram::new(3).expect("3 significant digits") }
    }

    /// Percentile `q` (0..1), µs.
    pub fn p_us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1e3
    }

    /// Slowest read, µs.
    pub fn max_us(&self) -> f64 {
        self.latency.max() as f64 / 1e3
    }

    /// Reads slower than [`STALL_NS`].
    pub fn stalled(&self) -> u64 {
        self.latency.count_between(STALL_NS, u64::MAX)
    }
}

/// One case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// `auth_workers` of the target.
    pub auth_workers: usize,
    /// QD1 alone.
    pub alone: Qd1,
    /// QD1 while the other host connects.
    pub during: Qd1,
    /// Connects that succeeded, and their mean time, ms.
    pub connects_ok: u32,
    /// Mean connect time, ms.
    pub connect_ms: f64,
    /// DH steps the target's workers ran.
    pub offloaded: u64,
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("auth-stall: {what}: {e}"))
}

fn target_config(auth_workers: usize, reactor_cpu: Option<usize>, key: &Secret, ctrl_key: &Secret) -> Config {
    let mut cfg = crate::one_reactor_target(reactor_cpu, PollMode::Busy);
    cfg.options.auth_workers = auth_workers;
    cfg.subsystems.push(SubsystemConfig {
        allow_any_host: false,
        hosts: vec![HostEntry::Auth(HostAuthConfig {
            nqn: AUTH_HOST.into(),
            dhchap_key: Some(key.to_string()),
            dhchap_ctrl_key: Some(ctrl_key.to_string()),
            hash: Some(HashId::Sha512.linux_name().into()),
            dhgroup: Some(GROUP.name().into()),
            ..Default::default()
        })],
        ..SubsystemConfig::open(AUTH_NQN, vec![NamespaceConfig::ram(1, "1M")])
    });
    cfg
}

/// Runs one case on a fresh target.
pub fn run_case(auth_workers: usize, args: &AuthStallArgs) -> Result<CaseResult> {
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let secret = |h| Secret::generate(Some(h), 64).map_err(|e| err("key", e));
    let (key, ctrl_key) = (secret(HashId::Sha512)?, secret(HashId::Sha512)?);
    let server = target_config(auth_workers, reactor_cpu, &key, &ctrl_key).start().map_err(|e| err("target", e))?;
    let result = (|| {
        let addr = server.local_addr(1).ok_or_else(|| err("target", "no port 1"))?;
        let keyed = |nqn: &str| {
            let mut o = ConnectOptions::new(addr, nqn);
            o.hostnqn = AUTH_HOST.into();
            o.nr_io_queues = args.queues;
            o.connect_timeout = Duration::from_secs(60);
            o.dhchap_secret = Some(key.to_string());
            o.dhchap_ctrl_secret = Some(ctrl_key.to_string());
            o
        };
        let a = if args.reauth {
            keyed(AUTH_NQN)
        } else {
            let mut o = ConnectOptions::new(addr, target::config::DEFAULT_NQN);
            o.nr_io_queues = 1;
            o
        };
        let a = Controller::connect(a).map_err(|e| err("connect", e))?;
        let mut ctx = Context::new(ContextOptions { cpu: job_cpus.first().copied(), ..ContextOptions::default() })
            .map_err(|e| err("context", e))?;
        let dev = ctx.open(&a, Nsid(1)).map_err(|e| err("open", e))?;
        let runtime = Duration::from_secs_f64(args.runtime);
        let alone = qd1(&mut ctx, dev, runtime, None, args.host_wait.wait());

        let done = Arc::new(AtomicBool::new(false));
        let connector = {
            let (done, connects, reauth, a) = (Arc::clone(&done), args.connects, args.reauth, Arc::clone(&a));
            let b = keyed(AUTH_NQN);
            std::thread::Builder::new()
                .name("auth-stall-connect".into())
                .spawn(move || {
                    // The connecting host stands for another machine: its own DH steps take
                    // what CPU this one's reactor and QD1 host leave. A's re-authentication
                    // is this host's own work, at its priority.
                    if !reauth && let Err(e) = uring::set_current_thread_nice(CONNECTOR_NICE) {
                        tracing::warn!("auth-stall: connector keeps its priority: {e}");
                    }
                    let mut times = Vec::new();
                    for _ in 0..connects {
                        let t0 = Instant::now();
                        let r = if reauth {
                            a.reauthenticate(None, Duration::from_secs(60)).and_then(|r| match r.failed.first() {
                                None => Ok(()),
                                Some((qid, e)) => {
                                    Err(host::Error::new(host::ErrorKind::Protocol, format!("I/O queue {qid}: {e}")))
                                }
                            })
                        } else {
                            Controller::connect(b.clone()).map(|c| c.delete())
                        };
                        match r {
                            Ok(()) => times.push(t0.elapsed()),
                            Err(e) => tracing::warn!(
                                "auth-stall: {} failed: {e}",
                                if reauth { "re-authentication" } else { "connect" }
                            ),
                        }
                    }
                    done.store(true, Ordering::Release);
                    times
                })
                .map_err(|e| err("spawn", e))?
        };
        let during = qd1(&mut ctx, dev, CONNECT_TIMEOUT, Some(&done), args.host_wait.wait());
        let times = connector.join().map_err(|_| err("connector", "panicked"))?;
        drop(ctx);
        a.delete();
        let n = u32::try_from(times.len()).unwrap_or(u32::MAX);
        let connect_ms = if n == 0 { 0.0 } else { times.iter().sum::<Duration>().as_secs_f64() * 1e3 / f64::from(n) };
        Ok(CaseResult {
            auth_workers,
            alone,
            during,
            connects_ok: n,
            connect_ms,
            offloaded: server.state.auth_workers.computed(),
        })
    })();
    server.shutdown();
    result
}

/// QD1 reads of block 0 until `runtime` passes or `stop` is set.
fn qd1(ctx: &mut Context, dev: DeviceId, runtime: Duration, stop: Option<&AtomicBool>, wait: Wait) -> Qd1 {
    let mut q = Qd1::new();
    let t0 = Instant::now();
    let mut buf = Some(IoBuf::new(BS as usize));
    'reads: while t0.elapsed() < runtime && !stop.is_some_and(|s| s.load(Ordering::Acquire)) {
        let b = buf.take().unwrap_or_else(|| IoBuf::new(BS as usize));
        if ctx.submit(dev, Op::Read, 0, BS, Some(b), 1).is_err() {
            q.errors += 1;
            break;
        }
        // Bounded: a read that does not come back within 10 s ends the phase.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ctx.poll(wait).is_err() || Instant::now() > deadline {
                q.errors += 1;
                break 'reads;
            }
            if let Some(c) = ctx.completions().next() {
                if c.status.is_success() {
                    q.ios += 1;
                    let _ = q.latency.record(c.latency_ns.max(1));
                } else {
                    q.errors += 1;
                }
                buf = c.buf;
                break;
            }
        }
    }
    q.secs = t0.elapsed().as_secs_f64();
    q
}

/// Runs both cases; progress lines go to `progress`.
pub fn run(args: &AuthStallArgs, progress: &mut dyn std::io::Write) -> Result<LabResult> {
    let mut results = Vec::new();
    for workers in [0, target::offload::MAX_WORKERS] {
        let what = if args.reauth { "re-authentications of A's" } else { "connects of" };
        let _ = writeln!(
            progress,
            "auth-stall: auth_workers {workers}: {:.1} s QD1 alone, then {} {what} admin + {} I/O queues",
            args.runtime, args.connects, args.queues
        );
        results.push(run_case(workers, args)?);
    }
    Ok(report(args, &results))
}

fn report(args: &AuthStallArgs, results: &[CaseResult]) -> LabResult {
    let title = if args.reauth {
        "a QD1 queue while its own controller re-authenticates"
    } else {
        "a QD1 queue while another host authenticates on the same reactor"
    };
    let mut r = LabResult::new("auth-stall", title);
    let (reactor_cpu, job_cpus) = crate::default_cpus(uring::online_cpus());
    let cpu = |c: Option<usize>| c.map_or_else(|| "unpinned".into(), |c| c.to_string());
    if args.reauth {
        r.note(format!(
            "4k reads at QD1 of block 0 on the first I/O queue of controller A (admin + {} I/O queues, DH-HMAC-CHAP \
             SHA-512, {}, bidirectional; host context on CPU {}, waiting: {}), the target's one reactor busy-polling \
             on CPU {}. During the second phase A re-authenticates all its queues {} times in a row (admin queue, then \
             the I/O queues at once; the read queue's transaction through its context): 2 DH steps per queue on the \
             target, as many on the host's re-authenticating thread. auth_workers 0 runs the target's steps on the \
             reactor; {} on the target's workers (the default).",
            args.queues,
            GROUP.name(),
            cpu(job_cpus.first().copied()),
            args.host_wait.name(),
            cpu(reactor_cpu),
            args.connects,
            target::offload::MAX_WORKERS,
        ));
    } else {
        r.note(format!(
        "4k reads at QD1 of block 0 on controller A's I/O queue (host context on CPU {}, waiting: {}), the \
         target's one reactor busy-polling on CPU {}. During the second phase another host connects a controller of admin + {} I/O queues \
         with DH-HMAC-CHAP (SHA-512, {}, bidirectional) {} times in a row, deleting it each time: 2 DH steps per \
         queue on the target, as many on the host. auth_workers 0 runs the target's steps on the reactor (before); \
         {} on the target's workers (the default).",
        cpu(job_cpus.first().copied()),
        args.host_wait.name(),
        cpu(reactor_cpu),
        args.queues,
        GROUP.name(),
        args.connects,
        target::offload::MAX_WORKERS,
    ));
    }
    r.columns(&[
        "auth_workers",
        "QD1 p50 alone",
        "QD1 max alone",
        "QD1 p50 during",
        "QD1 p99 during",
        "QD1 p99.9 during",
        "QD1 max during",
        "reads > 1 ms",
        if args.reauth { "re-authentication mean" } else { "connect mean" },
        "target DH steps offloaded",
        "errors",
    ]);
    for c in results {
        r.row(vec![
            Cell::num(c.auth_workers as f64, ""),
            Cell::num(c.alone.p_us(0.5), "us"),
            Cell::num(c.alone.max_us(), "us"),
            Cell::num(c.during.p_us(0.5), "us"),
            Cell::num(c.during.p_us(0.99), "us"),
            Cell::num(c.during.p_us(0.999), "us"),
            Cell::num(c.during.max_us(), "us"),
            Cell::num(c.during.stalled() as f64, ""),
            Cell::num(c.connect_ms, "ms"),
            Cell::num(c.offloaded as f64, ""),
            Cell::num((c.alone.errors + c.during.errors + u64::from(args.connects - c.connects_ok)) as f64, ""),
        ]);
    }
    let groups: Vec<String> = results.iter().map(|c| format!("auth_workers {}", c.auth_workers)).collect();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    r.bars(
        if args.reauth {
            "QD1 read latency while its controller re-authenticates, us"
        } else {
            "QD1 read latency while a host authenticates, us"
        },
        &groups,
        vec![
            ("p99.9".into(), results.iter().map(|c| c.during.p_us(0.999)).collect()),
            ("max".into(), results.iter().map(|c| c.during.max_us()).collect()),
        ],
    );
    let phase = |q: &Qd1| {
        json!({
            "ios": q.ios, "errors": q.errors, "secs": q.secs, "reads_over_1ms": q.stalled(),
            "lat_us": { "p50": q.p_us(0.5), "p99": q.p_us(0.99), "p99.9": q.p_us(0.999), "max": q.max_us() },
        })
    };
    let cases: Vec<Value> = results
        .iter()
        .map(|c| {
            json!({
                "auth_workers": c.auth_workers,
                "host_wait": args.host_wait.name(),
                "mode": if args.reauth { "reauth" } else { "connect" },
                "qd1_alone": phase(&c.alone),
                "qd1_during_connects": phase(&c.during),
                "connects": args.connects,
                "connects_ok": c.connects_ok,
                "connect_ms_mean": c.connect_ms,
                "target_dh_steps_offloaded": c.offloaded,
            })
        })
        .collect();
    r.extra.insert("cases".into(), Value::Array(cases));
    r
}

/// `qpath lab auth-stall`: runs, prints, and returns the result.
pub fn lab(args: &AuthStallArgs) -> Result<LabResult> {
    let r = run(args, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

/// Failed reads and failed connects over both cases.
pub fn total_errors(r: &LabResult) -> u64 {
    let Some(Value::Array(cases)) = r.extra.get("cases") else { return 0 };
    cases
        .iter()
        .map(|c| {
            let failed_connects =
                c["connects"].as_u64().unwrap_or(0).saturating_sub(c["connects_ok"].as_u64().unwrap_or(0));
            c["qd1_alone"]["errors"].as_u64().unwrap_or(0)
                + c["qd1_during_connects"]["errors"].as_u64().unwrap_or(0)
                + failed_connects
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_requires_ffdhe8192_of_the_connecting_host_only() {
        let key = Secret::generate(Some(HashId::Sha512), 64).unwrap();
        let cfg = target_config(0, Some(0), &key, &key);
        assert_eq!((cfg.reactor.reactors, cfg.options.auth_workers), (1, 0), "one reactor for every queue");
        let s = cfg.subsystems.iter().find(|s| s.nqn == AUTH_NQN).expect("the authenticating subsystem");
        let [HostEntry::Auth(h)] = &s.hosts[..] else { panic!("{:?}", s.hosts) };
        assert_eq!((h.nqn.as_str(), h.dhgroup.as_deref()), (AUTH_HOST, Some("ffdhe8192")));
        assert!(cfg.subsystems.iter().any(|s| s.nqn == target::config::DEFAULT_NQN), "A's subsystem needs no key");
    }
}
