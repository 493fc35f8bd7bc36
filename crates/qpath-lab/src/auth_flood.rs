//! `qpath lab auth-flood`: a host's connect while another host keeps the target's
//! DH-HMAC-CHAP workers busy.
//!
//! ```text
//!   flooding host (--flooders threads): TCP connect, ICReq, Connect, AUTH_Negotiate
//!       (ffdhe8192), hang up; again, as fast as the target answers ─┐
//!                                                                    ▼
//!   embedded target (one reactor): each Negotiate is one DH step (16 ms here) for its workers
//!                                                                    ▲
//!   measured host: connect admin + N I/O queues (SHA-512, ffdhe8192, both ways), delete, again
//! ```
//!
//! Each queue's Negotiate costs the target a key pair before the host has proved anything,
//! and costs the flooding host nothing: a few hundred bytes and a hang-up. A host with
//! many controllers reconnecting at once after a path flap makes the same queue of work
//! honestly. Phase one measures the host's connects on an idle target; phase two starts
//! the flood, gives it `--head-start` seconds to queue work, and measures them again. The
//! flood stops when the measured connects are done (or after `--flood-max`), and the lab
//! reports how long the workers took to finish what was queued after that.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use host::controller::{ConnectOptions, Controller};
use host::queue::QueueConfig;
use host::sync::SyncQueue;
use nvme::Cntlid;
use nvme::auth::{DhGroup, HashId, Secret};
use serde_json::json;
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, SubsystemConfig};
use target::reactor::PollMode;

use crate::result::{Cell, LabOutputArgs, LabResult};
use bench::{Error, ErrorKind, Result};

const NQN: &str = "nqn.2026-11.io.qpath:auth-flood";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:3c1f6a2e-8b7d-4e05-a9c4-5d6e7f809112";
const FLOOD_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:3c1f6a2e-8b7d-4e05-a9c4-5d6e7f809113";
const GROUP: DhGroup = DhGroup::Ffdhe8192;
/// How long the workers may take to finish the flood's queued steps before the lab
/// reports the rest as not drained.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one connect of the measured host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest one flood cycle may take (connect to Connect answered).
const CYCLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `qpath lab auth-flood`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthFloodArgs {
    /// Connects of the measured host in each phase.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub connects: u32,
    /// I/O queues the measured host connects each time (plus its admin queue).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub queues: u16,
    /// Threads of the flooding host, each opening a queue, sending its Negotiate and
    /// hanging up, again and again.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub flooders: u16,
    /// Nice value of the flood's threads: 0 (the default) takes this machine's CPU like
    /// any thread; 19 stands better for another machine, leaving the CPU to the target.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub flood_nice: i32,
    /// Seconds the flood runs before the measured host starts connecting.
    #[arg(long, default_value = "1", value_parser = crate::seconds_up_to::<60>)]
    pub head_start: f64,
    /// Most seconds the flood lasts (it ends when the measured connects are done).
    #[arg(long, default_value = "30", value_parser = crate::seconds_up_to::<600>)]
    pub flood_max: f64,
    /// Text/JSON and plot output.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for AuthFloodArgs {
    fn default() -> Self {
        AuthFloodArgs {
            connects: 3,
            queues: 2,
            flooders: 2,
            flood_nice: 0,
            head_start: 1.0,
            flood_max: 30.0,
            output: LabOutputArgs::default(),
        }
    }
}

/// The measured host's connects in one phase.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    /// Connect times of the connects that succeeded.
    pub times: Vec<Duration>,
    /// Connects that failed.
    pub failed: u32,
    /// Negotiates the flooding host sent (0 without the flood).
    pub flood_negotiates: u64,
    /// Flood cycles that failed before their Negotiate went out.
    pub flood_failed: u64,
    /// DH steps handed to the target's workers during the phase.
    pub steps_submitted: u64,
    /// DH steps the workers finished during the phase.
    pub steps_computed: u64,
    /// DH steps the workers skipped because their connection had closed.
    pub steps_abandoned: u64,
    /// Seconds from the flood's end until the workers had nothing queued or running.
    pub drain_secs: Option<f64>,
}

impl Phase {
    fn mean_ms(&self) -> f64 {
        if self.times.is_empty() {
            return 0.0;
        }
        self.times.iter().sum::<Duration>().as_secs_f64() * 1e3 / self.times.len() as f64
    }

    fn max_ms(&self) -> f64 {
        self.times.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3)
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("auth-flood: {what}: {e}"))
}

fn target_config(key: &Secret, ctrl_key: &Secret) -> Config {
    let mut cfg = crate::one_reactor_target(None, PollMode::Adaptive);
    let entry = |nqn: &str| {
        HostEntry::Auth(HostAuthConfig {
            nqn: nqn.into(),
            dhchap_key: Some(key.to_string()),
            dhchap_ctrl_key: Some(ctrl_key.to_string()),
            hash: Some(HashId::Sha512.linux_name().into()),
            dhgroup: Some(GROUP.name().into()),
            ..Default::default()
        })
    };
    cfg.subsystems.push(SubsystemConfig {
        allow_any_host: false,
        hosts: vec![entry(HOST), entry(FLOOD_HOST)],
        ..SubsystemConfig::open(NQN, vec![NamespaceConfig::ram(1, "1M")])
    });
    cfg
}

/// Runs both phases on one fresh target.
pub fn run(args: &AuthFloodArgs, progress: &mut dyn std::io::Write) -> Result<(Phase, Phase)> {
    let secret = |h| Secret::generate(Some(h), 64).map_err(|e| err("key", e));
    let (key, ctrl_key) = (secret(HashId::Sha512)?, secret(HashId::Sha512)?);
    let server = target_config(&key, &ctrl_key).start().map_err(|e| err("target", e))?;
    let result = (|| {
        let addr = server.local_addr(1).ok_or_else(|| err("target", "no port 1"))?;
        let connects = |phase: &mut Phase| {
            for _ in 0..args.connects {
                let mut o = ConnectOptions::new(addr, NQN);
                o.hostnqn = HOST.into();
                o.nr_io_queues = args.queues;
                o.connect_timeout = CONNECT_TIMEOUT;
                o.dhchap_secret = Some(key.to_string());
                o.dhchap_ctrl_secret = Some(ctrl_key.to_string());
                let t0 = Instant::now();
                match Controller::connect(o) {
                    Ok(c) => {
                        phase.times.push(t0.elapsed());
                        c.delete();
                    }
                    Err(e) => {
                        tracing::warn!("auth-flood: connect failed: {e}");
                        phase.failed += 1;
                    }
                }
            }
        };
        let workers = &server.state.auth_workers;
        let _ = writeln!(
            progress,
            "auth-flood: {} connects of admin + {} I/O queues, idle target",
            args.connects, args.queues
        );
        let mut alone = Phase::default();
        let (s0, c0) = (workers.submitted(), workers.computed());
        connects(&mut alone);
        (alone.steps_submitted, alone.steps_computed) = (workers.submitted() - s0, workers.computed() - c0);

        let _ = writeln!(
            progress,
            "auth-flood: the same while {} threads (nice {}) of another host send Negotiates and hang up ({:.1} s head start)",
            args.flooders, args.flood_nice, args.head_start
        );
        let mut flood = Phase::default();
        let (s0, c0, a0) = (workers.submitted(), workers.computed(), workers.abandoned());
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let end = Instant::now() + Duration::from_secs_f64(args.flood_max);
        let mut threads = Vec::new();
        for i in 0..args.flooders {
            let (stop, counts, nice) = (Arc::clone(&stop), Arc::clone(&counts), args.flood_nice);
            let t = std::thread::Builder::new().name(format!("auth-flood-{i}")).spawn(move || {
                if nice != 0
                    && let Err(e) = uring::set_current_thread_nice(nice)
                {
                    tracing::warn!("auth-flood: flood thread keeps its priority: {e}");
                }
                while !stop.load(Ordering::Acquire) && Instant::now() < end {
                    match negotiate_and_hang_up(addr) {
                        Ok(()) => counts.0.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            tracing::debug!("auth-flood: flood cycle failed: {e}");
                            std::thread::sleep(Duration::from_millis(1));
                            counts.1.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            });
            threads.push(t.map_err(|e| err("spawn", e))?);
        }
        std::thread::sleep(Duration::from_secs_f64(args.head_start));
        connects(&mut flood);
        stop.store(true, Ordering::Release);
        for t in threads {
            t.join().map_err(|_| err("flooder", "panicked"))?;
        }
        (flood.flood_negotiates, flood.flood_failed) =
            (counts.0.load(Ordering::Relaxed), counts.1.load(Ordering::Relaxed));
        let stopped = Instant::now();
        while workers.pending() > 0 && stopped.elapsed() < DRAIN_TIMEOUT {
            std::thread::sleep(Duration::from_millis(5));
        }
        if workers.pending() == 0 {
            flood.drain_secs = Some(stopped.elapsed().as_secs_f64());
        }
        (flood.steps_submitted, flood.steps_computed) = (workers.submitted() - s0, workers.computed() - c0);
        flood.steps_abandoned = workers.abandoned() - a0;
        Ok((alone, flood))
    })();
    server.shutdown();
    result
}

/// One flood cycle: a queue up to the target's request to authenticate, an
/// AUTH_Negotiate offering every group (the target picks ffdhe8192 and starts its key
/// pair), and a hang-up.
fn negotiate_and_hang_up(addr: SocketAddr) -> host::error::Result<()> {
    let s = TcpStream::connect_timeout(&addr, CYCLE_TIMEOUT).map_err(|e| host::error::Error::io("connect", &e))?;
    s.set_nodelay(true).map_err(|e| host::error::Error::io("TCP_NODELAY", &e))?;
    let mut cfg = QueueConfig::io(0, 32, Cntlid::DYNAMIC, NQN, FLOOD_HOST, [0x3c; 16]);
    cfg.disable_sqflow = false;
    let mut q = SyncQueue::until_connected(s, cfg, CYCLE_TIMEOUT)?;
    let negotiate = nvme::auth::Message::Negotiate(nvme::auth::Negotiate::offer_all(1));
    let io = host::auth::send_io(&negotiate)
        .ok_or_else(|| host::error::Error::new(host::error::ErrorKind::Invalid, "Negotiate too large"))?;
    // Submitted and written; dropping the queue hangs up without waiting for the answer.
    q.submit(io)?;
    Ok(())
}

/// `qpath lab auth-flood`: runs, prints, and returns the result.
pub fn lab(args: &AuthFloodArgs) -> Result<LabResult> {
    let (alone, flood) = run(args, &mut std::io::stderr())?;
    let r = report(args, &alone, &flood);
    r.emit(&args.output)?;
    Ok(r)
}

fn report(args: &AuthFloodArgs, alone: &Phase, flood: &Phase) -> LabResult {
    let mut r = LabResult::new("auth-flood", "a host's connect while another host floods the target's DH workers");
    r.note(format!(
        "The measured host connects a controller of admin + {} I/O queues with DH-HMAC-CHAP (SHA-512, {}, \
         bidirectional) {} times, deleting it each time: 2 DH steps per queue on the target, as many on the host. \
         Phase 'flood': {} threads (nice {}) of another host (allowed, keyed) open queues, send an AUTH_Negotiate \
         and hang up, again and again, from {:.1} s before the measured connects until they end. The target: one \
         reactor (adaptive), its DH workers ({} at most, one per CPU).",
        args.queues,
        GROUP.name(),
        args.connects,
        args.flooders,
        args.flood_nice,
        args.head_start,
        target::offload::MAX_WORKERS,
    ));
    r.columns(&[
        "phase",
        "connect mean",
        "connect max",
        "connects ok",
        "flood Negotiates",
        "target DH steps submitted",
        "target DH steps computed",
        "target DH steps abandoned",
        "drain after flood",
        "errors",
    ]);
    let drain = |p: &Phase| p.drain_secs.map_or(Cell::text("not drained"), |s| Cell::num(s * 1e3, "ms"));
    for (name, p) in [("alone", alone), ("flood", flood)] {
        r.row(vec![
            Cell::text(name),
            Cell::num(p.mean_ms(), "ms"),
            Cell::num(p.max_ms(), "ms"),
            Cell::num(p.times.len() as f64, ""),
            Cell::num(p.flood_negotiates as f64, ""),
            Cell::num(p.steps_submitted as f64, ""),
            Cell::num(p.steps_computed as f64, ""),
            Cell::num(p.steps_abandoned as f64, ""),
            if name == "alone" { Cell::text("-") } else { drain(p) },
            Cell::num(f64::from(p.failed), ""),
        ]);
    }
    r.bars(
        "The measured host's connect time, ms",
        &["alone", "flood"],
        vec![
            ("mean".into(), vec![alone.mean_ms(), flood.mean_ms()]),
            ("max".into(), vec![alone.max_ms(), flood.max_ms()]),
        ],
    );
    let phase = |p: &Phase| {
        json!({
            "connects": args.connects,
            "connects_ok": p.times.len(),
            "connects_failed": p.failed,
            "connect_ms": p.times.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>(),
            "connect_ms_mean": p.mean_ms(),
            "connect_ms_max": p.max_ms(),
            "flood_negotiates": p.flood_negotiates,
            "flood_cycles_failed": p.flood_failed,
            "target_dh_steps_submitted": p.steps_submitted,
            "target_dh_steps_computed": p.steps_computed,
            "target_dh_steps_abandoned": p.steps_abandoned,
            "drain_secs": p.drain_secs,
        })
    };
    r.extra.insert("alone".into(), phase(alone));
    r.extra.insert("flood".into(), phase(flood));
    r.extra.insert("flooders".into(), json!(args.flooders));
    r.extra.insert("flood_nice".into(), json!(args.flood_nice));
    r.extra.insert("queues".into(), json!(args.queues));
    r
}

/// Failed connects of the measured host in both phases.
pub fn total_errors(r: &LabResult) -> u64 {
    ["alone", "flood"].iter().map(|p| r.extra.get(*p).and_then(|v| v["connects_failed"].as_u64()).unwrap_or(0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_report_has_a_row_per_phase_and_counts_failed_connects() {
        let alone = Phase { times: vec![Duration::from_millis(300), Duration::from_millis(500)], ..Phase::default() };
        let flood = Phase {
            times: vec![Duration::from_millis(900)],
            failed: 1,
            flood_negotiates: 250,
            steps_submitted: 260,
            steps_computed: 40,
            drain_secs: None,
            ..Phase::default()
        };
        let r = report(&AuthFloodArgs::default(), &alone, &flood);
        let v = r.json();
        assert_eq!(v["rows"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["alone"]["connect_ms_mean"], 400.0);
        assert_eq!(v["flood"]["connect_ms_max"], 900.0);
        assert_eq!(v["flood"]["drain_secs"], Value::Null);
        assert_eq!(total_errors(&r), 1);
    }
}
