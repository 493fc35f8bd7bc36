//! `qpath lab flaps`: path flaps that lose nothing (issue 4, acceptance 3).
//!
//! A 4k random write with `verify=crc32c` blocks runs through one multipath head with two
//! paths while one path goes down for `down` seconds every `period` (5 s every 10 s by
//! default, for the issue's 2 minutes), alternating between the paths; then every block
//! the writes left is read back and checked, flaps continuing. It reports I/O errors,
//! verify failures, the worst completion latency and p99.99, I/O per path, failovers,
//! reconnects, and for every outage how long the host took to stop using the path and to
//! use it again.
//!
//! ```text
//!   lab thread ── schedule: down(path) ... up(path) ──► the mode's flapper
//!                                                         link:  ip link set down/up (netns + veth, root)
//!   I/O thread (host netns in link mode)                  fault: rpc set_port_fault drop + refuse
//!     Controller ×2 ─► Head (round-robin) ─► Context      ana:   rpc set_ana_state inaccessible/optimized
//!     writer: randwrite QD16 4k + verify, read-back       nvmet: guest configfs unlink/relink (vmlab)
//!        │ NVMe/TCP, two paths
//!        ▼
//!   qpath target in this process (link, fault, ana)  or  Linux nvmet in the vmlab guest (nvmet)
//! ```

pub mod flapper;
pub mod netns;
pub mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions};
use host::controller::{ConnectOptions, Controller, CtrlState};
use host::head::Head;
use host::mpath::Policy;
use nvme::{AnaState, Nsid};
use serde_json::json;
use target::config::{Config, DEFAULT_NQN, SizeValue};
use target::port::PortKind;
use target::reactor::{PollMode, ReactorOptions};
use target::server::Server;

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use bench::{Error, ErrorKind, Result};
use flapper::{FlapRecord, Flapper, LinkFlapper, NvmetFlapper, PathProbe, RpcFault, RpcFlapper, Schedule};
use netns::Topology;
use writer::{WriterOptions, WriterReport};

/// How a path goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlapMode {
    /// The path's veth link goes down (`ip link set down`): the target's ports and the host
    /// in network namespaces of their own (needs root).
    Link,
    /// The target's port fault injection: drop every connection, refuse new ones.
    Fault,
    /// The port's ANA group goes inaccessible, then optimized again.
    Ana,
    /// Linux nvmet in the vmlab guest: the port's subsystem link removed and re-added.
    Nvmet,
}

impl FlapMode {
    fn name(self) -> &'static str {
        match self {
            FlapMode::Link => "link",
            FlapMode::Fault => "fault",
            FlapMode::Ana => "ana",
            FlapMode::Nvmet => "nvmet",
        }
    }
}

fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    match s {
        "numa" => Ok(Policy::Numa),
        "round-robin" => Ok(Policy::ROUND_ROBIN),
        "queue-depth" => Ok(Policy::QueueDepth),
        "latency" => Ok(Policy::LATENCY),
        _ => Err(format!("{s:?}: numa, round-robin, queue-depth or latency")),
    }
}

/// Arguments of `qpath lab flaps`.
#[derive(Debug, Clone, clap::Args)]
pub struct FlapsArgs {
    /// How a path goes down: link (veth in network namespaces; root), fault (port fault
    /// injection by RPC), ana (ANA group inaccessible by RPC), nvmet (Linux nvmet in the
    /// vmlab guest; give --path twice and --control).
    #[arg(long, value_enum)]
    pub mode: FlapMode,
    /// Seconds of random writes (the issue: 2 minutes); the read-back pass follows.
    #[arg(long, default_value = "120", value_parser = crate::seconds_up_to::<86400>)]
    pub runtime: f64,
    /// One outage starts every PERIOD seconds.
    #[arg(long, default_value = "10", value_parser = crate::seconds_up_to::<86400>)]
    pub period: f64,
    /// Each outage lasts DOWN seconds.
    #[arg(long, default_value = "5", value_parser = crate::seconds_up_to::<86400>)]
    pub down: f64,
    /// A short run: 20 s of writes, a 2 s outage every 4 s.
    #[arg(long)]
    pub quick: bool,
    /// I/Os in flight.
    #[arg(long, default_value = "16")]
    pub iodepth: u32,
    /// MiB of the namespace the writes spread over (and the read-back reads).
    #[arg(long = "size-mib", default_value = "1024")]
    pub size_mib: u64,
    /// The head's I/O policy: numa, round-robin, queue-depth or latency.
    #[arg(long, default_value = "round-robin", value_parser = parse_policy)]
    pub policy: Policy,
    /// Keep-alive timeout, seconds (`nvme connect -k`; Linux's default 5): a keep-alive
    /// unanswered this long resets the controller, which is how a lost link is noticed.
    #[arg(long, default_value = "5", value_parser = crate::seconds_up_to::<86400>)]
    pub kato: f64,
    /// Seconds between reconnect attempts (`nvme connect --reconnect-delay`; Linux's
    /// default 10 would keep a path down for longer than the outage).
    #[arg(long = "reconnect-delay", default_value = "1", value_parser = crate::seconds_up_to::<86400>)]
    pub reconnect_delay: f64,
    /// nvmet: the target's two addresses, path 1 then path 2.
    #[arg(long = "path", value_name = "ADDR:PORT")]
    pub paths: Vec<SocketAddr>,
    /// nvmet: the subsystem NQN (default: the vmlab guest's).
    #[arg(long)]
    pub nqn: Option<String>,
    /// nvmet: the guest's flap control address (tests/vm/guest/nvmet-flaps.sh).
    #[arg(long, value_name = "ADDR:PORT")]
    pub control: Option<SocketAddr>,
    /// Output options.
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl FlapsArgs {
    /// Defaults for `mode` (what `qpath lab flaps --mode MODE` runs).
    pub fn new(mode: FlapMode) -> FlapsArgs {
        FlapsArgs {
            mode,
            runtime: 120.0,
            period: 10.0,
            down: 5.0,
            quick: false,
            iodepth: 16,
            size_mib: 1024,
            policy: Policy::ROUND_ROBIN,
            kato: 5.0,
            reconnect_delay: 1.0,
            paths: Vec::new(),
            nqn: None,
            control: None,
            output: LabOutputArgs::default(),
        }
    }

    /// (runtime, schedule) after `--quick`.
    fn plan(&self) -> Result<(Duration, Schedule)> {
        let (runtime, period, down) =
            if self.quick { (20.0, 4.0, 2.0) } else { (self.runtime, self.period, self.down) };
        if down >= period {
            return Err(Error::new(ErrorKind::Option, format!("--down {down} must be shorter than --period {period}")));
        }
        let s = Schedule { period: Duration::from_secs_f64(period), down: Duration::from_secs_f64(down) };
        Ok((Duration::from_secs_f64(runtime), s))
    }
}

/// The subsystem the vmlab guest's nvmet serves (`../shared/vmlab/guest/target-serve.sh`).
pub const VMLAB_NQN: &str = "nqn.2024-01.io.vmlab:ram0";

/// What `qpath lab flaps` produced.
#[derive(Debug)]
pub enum FlapsOutcome {
    /// The lab ran.
    Ran(Box<LabResult>),
    /// It cannot run on this machine (the reason).
    Skipped(String),
}

/// The target side of a run.
enum Side {
    /// Our target in this process, with its RPC socket; link mode adds the namespaces.
    Local { server: Arc<Server>, rpc: Option<target::rpc::RpcServer>, socket: PathBuf, topo: Option<Arc<Topology>> },
    /// A remote target (nvmet in the guest).
    Remote,
}

fn target_err(what: &str, e: &impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("flaps: {what}: {e}"))
}

fn reactor_options() -> ReactorOptions {
    let cpu0 = if uring::online_cpus() > 1 { vec![0] } else { Vec::new() };
    ReactorOptions {
        reactors: 1,
        cpus: cpu0,
        poll: PollMode::Adaptive,
        spin_us: bench::embedded_target::ADAPTIVE_SPIN_US,
    }
}

/// The embedded default target, one RAM namespace of `bytes`, on `ports` (id, address).
fn target_config(bytes: u64, ports: &[(u16, SocketAddr)]) -> Config {
    let mut cfg = Config::embedded_default();
    let template = cfg.ports[0].clone();
    cfg.ports = ports
        .iter()
        .map(|(id, addr)| {
            let mut p = template.clone();
            p.id = *id;
            p.addr = addr.to_string();
            p
        })
        .collect();
    cfg.reactor = reactor_options();
    cfg.subsystems[0].namespaces[0].size = Some(SizeValue::Bytes(bytes));
    cfg
}

fn rpc_socket() -> PathBuf {
    std::env::temp_dir().join(format!("qpath-flaps-{}.sock", std::process::id()))
}

/// Starts our target for `mode`: on loopback, or (link) with each port in its namespace.
fn start_local(mode: FlapMode, bytes: u64) -> Result<(Side, [SocketAddr; 2], Option<PathBuf>)> {
    let (server, addrs, topo, host_ns) = if mode == FlapMode::Link {
        let topo = Arc::new(Topology::create()?);
        let (a, b) = (Topology::port_addr(0), Topology::port_addr(1));
        // Port 1 binds in namespace a (the reactor starts there too: it serves sockets of
        // any namespace), port 2 in namespace b.
        let ns_a = topo.port_ns(0);
        let server = std::thread::spawn(move || -> Result<Server> {
            uring::enter_netns(&ns_a).map_err(|e| Error::io("enter the port 1 namespace", e))?;
            target_config(bytes, &[(1, a)]).start().map_err(|e| target_err("start the target", &e))
        })
        .join()
        .map_err(|_| Error::new(ErrorKind::Target, "flaps: the target start thread panicked"))??;
        let server = Arc::new(server);
        let ns_b = topo.port_ns(1);
        let s2 = Arc::clone(&server);
        std::thread::spawn(move || -> Result<SocketAddr> {
            uring::enter_netns(&ns_b).map_err(|e| Error::io("enter the port 2 namespace", e))?;
            s2.add_port(2, b, PortKind::Io).map_err(|e| target_err("add port 2", &e))
        })
        .join()
        .map_err(|_| Error::new(ErrorKind::Target, "flaps: the port 2 thread panicked"))??;
        let host_ns = topo.host_ns();
        (server, [a, b], Some(topo), Some(host_ns))
    } else {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("a socket address");
        let server = target_config(bytes, &[(1, any), (2, any)]).start().map_err(|e| target_err("start", &e))?;
        let addr = |id| server.local_addr(id).ok_or_else(|| Error::new(ErrorKind::Target, "flaps: a port is missing"));
        let addrs = [addr(1)?, addr(2)?];
        (Arc::new(server), addrs, None, None)
    };
    let socket = rpc_socket();
    // The socket's accept thread outlives the RpcServer value (it is detached): it holds
    // the target weakly, so the run can still shut the target down.
    let rpc = target::rpc::RpcServer::start(&socket, Arc::clone(&server)).map_err(|e| target_err("RPC socket", &e))?;
    Ok((Side::Local { server, rpc: Some(rpc), socket, topo }, addrs, host_ns))
}

/// Everything the I/O thread measured.
struct IoOutcome {
    report: WriterReport,
    /// Per path: (address, reconnects, state at the end, last error).
    ctrls: Vec<(SocketAddr, u64, CtrlState, Option<String>)>,
    /// Whether both paths were usable again after the last outage (within 60 s).
    recovered: bool,
}

fn usable(c: &Controller, nsid: Nsid) -> bool {
    c.is_live()
        && c.namespace(nsid).is_some_and(|n| matches!(n.ana_state, AnaState::Optimized | AnaState::NonOptimized))
}

/// Runs the lab.
pub fn run(args: &FlapsArgs) -> Result<FlapsOutcome> {
    let (runtime, schedule) = args.plan()?;
    if args.mode == FlapMode::Link
        && let Some(why) = netns::unavailable()
    {
        return Ok(FlapsOutcome::Skipped(format!("flaps --mode link: {why}")));
    }
    let bytes = args.size_mib.max(1) << 20;
    let (side, addrs, host_ns, nqn) = match args.mode {
        FlapMode::Nvmet => {
            let [a, b] = args.paths[..] else {
                return Err(Error::new(
                    ErrorKind::Option,
                    "flaps --mode nvmet: give --path twice (the two nvmet ports)",
                ));
            };
            if args.control.is_none() {
                return Err(Error::new(
                    ErrorKind::Option,
                    "flaps --mode nvmet: give --control (the guest's flap control)",
                ));
            }
            (Side::Remote, [a, b], None, args.nqn.clone().unwrap_or_else(|| VMLAB_NQN.to_string()))
        }
        mode => {
            let (side, addrs, host_ns) = start_local(mode, bytes)?;
            (side, addrs, host_ns, DEFAULT_NQN.to_string())
        }
    };
    let mut flapper: Box<dyn Flapper> = match (&side, args.mode) {
        (Side::Local { topo: Some(topo), .. }, FlapMode::Link) => Box::new(LinkFlapper { topo: Arc::clone(topo) }),
        (Side::Local { socket, .. }, FlapMode::Fault) => {
            Box::new(RpcFlapper { socket: socket.clone(), ports: [1, 2], fault: RpcFault::Connections })
        }
        (Side::Local { socket, .. }, FlapMode::Ana) => {
            Box::new(RpcFlapper { socket: socket.clone(), ports: [1, 2], fault: RpcFault::Ana })
        }
        (Side::Remote, FlapMode::Nvmet) => {
            Box::new(NvmetFlapper { control: args.control.expect("checked above"), ports: addrs })
        }
        _ => return Err(Error::new(ErrorKind::Target, "flaps: no flapper for this mode and target")),
    };
    let load_before = load_average();
    let stop = AtomicBool::new(false);
    let (started_tx, started_rx) = mpsc::channel::<(Instant, Vec<Arc<Controller>>)>();
    let (flaps_done_tx, flaps_done_rx) = mpsc::channel::<()>();
    let io_cpu = if uring::online_cpus() > 1 && args.mode != FlapMode::Nvmet { Some(1) } else { None };
    let opts = ConnectOptions {
        kato_ms: u32::try_from(Duration::from_secs_f64(args.kato).as_millis()).unwrap_or(u32::MAX),
        reconnect_delay: Duration::from_secs_f64(args.reconnect_delay),
        nr_io_queues: 1,
        ..ConnectOptions::new(addrs[0], &nqn)
    };
    let wopts = WriterOptions { iodepth: args.iodepth, bs: 4096, blocks: bytes / 4096, seed: 0x000f_1a95 };
    let policy = args.policy;
    let (io, flaps) = std::thread::scope(|s| {
        let stop = &stop;
        let io = s.spawn(move || -> Result<IoOutcome> {
            if let Some(ns) = &host_ns {
                uring::enter_netns(ns).map_err(|e| Error::io("enter the host namespace", e))?;
            }
            let result = io_thread(addrs, &opts, policy, io_cpu, wopts, runtime, stop, &started_tx, &flaps_done_rx);
            // However the I/O ended, the schedule must stop.
            stop.store(true, Ordering::Release);
            drop(started_tx);
            result
        });
        let flaps = match started_rx.recv() {
            Ok((t0, ctrls)) => {
                let nsid = Nsid(1);
                let probe: PathProbe = Box::new(move |p| usable(&ctrls[p], nsid));
                let recs = flapper::drive(flapper.as_mut(), schedule, t0, stop, &probe);
                Some(recs)
            }
            Err(_) => None,
        };
        let _ = flaps_done_tx.send(());
        (io.join(), flaps)
    });
    let io = io.map_err(|_| Error::new(ErrorKind::Engine, "flaps: the I/O thread panicked"));
    let load_after = load_average();
    // Stop the target (link mode: from the host namespace, where its ports are reachable).
    if let Side::Local { server, rpc, topo, socket } = side {
        drop(rpc);
        let _ = std::fs::remove_file(&socket);
        match Arc::try_unwrap(server) {
            Ok(server) => {
                let ns = topo.as_ref().map(|t| t.host_ns());
                let _ = std::thread::spawn(move || {
                    if let Some(ns) = ns
                        && let Err(e) = uring::enter_netns(&ns)
                    {
                        tracing::warn!("flaps: cannot enter the host namespace to stop the target: {e}");
                    }
                    server.shutdown();
                })
                .join();
            }
            Err(_) => tracing::warn!("flaps: the target is still referenced; left running until exit"),
        }
        drop(topo);
    }
    let io = io??;
    let flaps = flaps.unwrap_or_default();
    let r = result(args, runtime, schedule, flapper.describe(), &io, &flaps, (load_before, load_after), &nqn, addrs);
    Ok(FlapsOutcome::Ran(Box::new(r)))
}

#[allow(clippy::too_many_arguments)] // one call site: the lab's I/O thread
fn io_thread(
    addrs: [SocketAddr; 2],
    opts: &ConnectOptions,
    policy: Policy,
    cpu: Option<usize>,
    wopts: WriterOptions,
    runtime: Duration,
    stop: &AtomicBool,
    started: &mpsc::Sender<(Instant, Vec<Arc<Controller>>)>,
    flaps_done: &mpsc::Receiver<()>,
) -> Result<IoOutcome> {
    let mut ctrls = Vec::with_capacity(2);
    for a in addrs {
        let o = ConnectOptions { traddr: a, ..opts.clone() };
        ctrls.push(
            Controller::connect(o).map_err(|e| Error::new(ErrorKind::Engine, format!("flaps: connect to {a}: {e}")))?,
        );
    }
    let cleanup = |ctrls: &[Arc<Controller>]| ctrls.iter().for_each(|c| c.delete());
    let heads = Head::build(&ctrls, policy);
    let Some(head) = heads.iter().find(|h| h.path_count() == 2) else {
        cleanup(&ctrls);
        return Err(Error::new(
            ErrorKind::Target,
            "flaps: the two addresses do not serve one namespace (no 2-path head)",
        ));
    };
    let outcome = (|| {
        let mut ctx = Context::new(ContextOptions { cpu, max_requests: 1024, ..ContextOptions::default() })
            .map_err(|e| Error::new(ErrorKind::Engine, format!("flaps: context: {e}")))?;
        let dev = ctx.open_head(head).map_err(|e| Error::new(ErrorKind::Engine, format!("flaps: open head: {e}")))?;
        let t0 = Instant::now();
        let _ = started.send((t0, ctrls.clone()));
        let w = writer::Writer::new(&mut ctx, dev, wopts, t0)?;
        let report = w.run(runtime)?;
        stop.store(true, Ordering::Release);
        // Wait for the schedule to bring every path back, then for the host to use them.
        let _ = flaps_done.recv_timeout(Duration::from_secs(60));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut recovered = false;
        while Instant::now() < deadline {
            let _ = ctx.poll(uring::Wait::Block { timeout: Some(Duration::from_millis(10)) });
            if ctrls.iter().all(|c| usable(c, Nsid(1))) {
                recovered = true;
                break;
            }
        }
        let infos = ctrls
            .iter()
            .map(|c| {
                let i = c.info();
                (i.traddr, i.reconnects, i.state, i.last_error)
            })
            .collect();
        Ok(IoOutcome { report, ctrls: infos, recovered })
    })();
    cleanup(&ctrls);
    outcome
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[allow(clippy::cast_precision_loss)] // counts fit f64's 53 bits in practice
fn f(v: u64) -> f64 {
    v as f64
}

#[allow(clippy::too_many_arguments)] // one call site
fn result(
    args: &FlapsArgs,
    runtime: Duration,
    schedule: Schedule,
    what: String,
    io: &IoOutcome,
    flaps: &[FlapRecord],
    load: (Option<f64>, Option<f64>),
    nqn: &str,
    addrs: [SocketAddr; 2],
) -> LabResult {
    let rep = &io.report;
    let mut r = LabResult::new(
        format!("flaps-{}", args.mode.name()),
        "4k randwrite + crc32c verify through a 2-path head while one path goes down, then a read-back",
    );
    r.note(format!(
        "the goal's scenario is one path down for 5 s every 10 s during a 2-minute randwrite; here {:.0} s of writes, a {:.1} s \
         outage every {:.1} s ({} outages), alternating paths, then the read-back (outages continue)",
        runtime.as_secs_f64(),
        schedule.down.as_secs_f64(),
        schedule.period.as_secs_f64(),
        flaps.len()
    ));
    r.note(format!("outage: {what}"));
    let target = match args.mode {
        FlapMode::Nvmet => format!("Linux nvmet {nqn} at {} and {}", addrs[0], addrs[1]),
        FlapMode::Link => format!(
            "qpath target in this process, port 1 {} in its own network namespace, port 2 {} in another, \
             the host in a third, joined by veth pairs; 1 reactor on CPU 0",
            addrs[0], addrs[1]
        ),
        _ => format!("qpath target in this process on {} and {}, 1 reactor on CPU 0", addrs[0], addrs[1]),
    };
    r.note(format!("target: {target}; RAM namespace, writes over its first {} MiB", args.size_mib));
    r.note(format!(
        "host: one thread (run-to-completion context, {}), QD {} 4 KiB, policy {:?}, kato {} s, reconnect_delay {} s, \
         ctrl_loss_tmo 600 s, fast_io_fail_tmo off",
        if args.mode == FlapMode::Nvmet { "not pinned" } else { "CPU 1 when there are 2+" },
        args.iodepth,
        args.policy,
        args.kato,
        args.reconnect_delay
    ));
    r.note(format!(
        "scaled to this 2-core machine: {}; load average {} before, {} after",
        if args.mode == FlapMode::Nvmet {
            "the host shares it with the QEMU guest (TCG) that runs nvmet"
        } else {
            "target and host share it (reactor CPU 0, host CPU 1)"
        },
        load.0.map_or("?".into(), |l| format!("{l:.2}")),
        load.1.map_or("?".into(), |l| format!("{l:.2}"))
    ));
    // Outages the run's end cut short count in neither column (nor in the goals' baseline).
    let whole: Vec<&FlapRecord> = flaps.iter().filter(|f| !f.cut_short).collect();
    let noticed: Vec<f64> = whole.iter().filter_map(|f| f.noticed_after_ms).collect();
    let back: Vec<f64> = whole.iter().filter_map(|f| f.back_after_ms).collect();
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    r.note(format!(
        "outages: {} run ({} cut short by the run's end), of the others {} noticed by the host while down (slowest \
         after {:.0} ms) and {} back in use before the next (slowest after {:.0} ms); {} flap command errors",
        flaps.len(),
        flaps.len() - whole.len(),
        noticed.len(),
        max(&noticed),
        back.len(),
        max(&back),
        flaps.iter().filter(|f| f.error.is_some()).count()
    ));
    let reconnects: Vec<String> = io.ctrls.iter().map(|c| format!("{} {}", c.0, c.1)).collect();
    r.note(format!(
        "failovers (commands sent again after a path error): {}; reconnects per path: {}; both paths usable at the \
         end: {}",
        rep.failovers,
        reconnects.join(", "),
        io.recovered
    ));
    r.columns(&[
        "phase",
        "I/Os",
        "errors",
        "verify failures",
        "IOPS",
        "p50 us",
        "p99.99 us",
        "max us",
        "path 1 I/Os",
        "path 2 I/Os",
    ]);
    let us = |ns: u64| f(ns) / 1e3;
    let per_path_end: Vec<u64> = rep.paths.iter().map(|p| p.ios).collect();
    let path = |v: &[u64], i: usize| f(v.get(i).copied().unwrap_or(0));
    let read_paths: Vec<u64> =
        per_path_end.iter().enumerate().map(|(i, e)| e - rep.write_paths.get(i).copied().unwrap_or(0)).collect();
    for (name, st, failures, paths) in [
        ("randwrite during flaps", &rep.write, 0, &rep.write_paths),
        ("read-back + verify", &rep.read, rep.verify_failures, &read_paths),
    ] {
        r.row(vec![
            Cell::text(name),
            Cell::num(f(st.ios), "I/Os"),
            Cell::num(f(st.errors), ""),
            Cell::num(f(failures), ""),
            Cell::num(st.iops(), "IOPS"),
            Cell::num(us(st.percentile_ns(50.0)), "us"),
            Cell::num(us(st.percentile_ns(99.99)), "us"),
            Cell::num(us(st.lat.max), "us"),
            Cell::num(path(paths, 0), "I/Os"),
            Cell::num(path(paths, 1), "I/Os"),
        ]);
    }
    let ios = rep.write.ios + rep.read.ios;
    let errors = rep.write.errors + rep.read.errors;
    r.goal(Goal::at_most("I/O errors / I/Os", f(errors), f(ios), 0.0));
    r.goal(Goal::at_most("verify failures / blocks read back", f(rep.verify_failures), f(rep.verify_checked), 0.0));
    r.goal(Goal::at_least("blocks read back / blocks written", f(rep.verify_checked), f(rep.blocks_written), 1.0));
    let n = f(whole.len() as u64);
    if args.mode == FlapMode::Link && args.kato >= schedule.down.as_secs_f64() {
        // A silent link is noticed only by the keep-alive, after KATO to 1.5 x KATO: an
        // outage shorter than that is ridden out (the I/O waits, TCP retransmits).
        r.note(format!(
            "not a goal here: noticing an outage (kato {} s >= the {:.1} s outage; the I/O waits for the link)",
            args.kato,
            schedule.down.as_secs_f64()
        ));
    } else {
        r.goal(Goal::at_least("outages the host noticed / whole outages", f(noticed.len() as u64), n, 1.0));
        r.goal(Goal::at_least("paths back in use after an outage / whole outages", f(back.len() as u64), n, 1.0));
    }
    let secs = rep.timeline.len();
    let labels: Vec<String> = (0..secs).map(|i| if i % 10 == 0 { i.to_string() } else { String::new() }).collect();
    let label_refs: Vec<&str> = labels.iter().map(String::as_str).collect();
    let series = (0..2)
        .map(|p| (format!("path {}", p + 1), rep.timeline.iter().map(|t| f(t.get(p).copied().unwrap_or(0))).collect()))
        .collect();
    r.bars("I/Os completed per second (x: seconds since start)", &label_refs, series);
    r.extra.insert("mode".into(), json!(args.mode.name()));
    r.extra.insert("write".into(), rep.write.json());
    r.extra.insert("read_back".into(), rep.read.json());
    r.extra.insert(
        "verify".into(),
        json!({
            "written": rep.blocks_written,
            "checked": rep.verify_checked,
            "failures": rep.verify_failures,
            "first": rep.first_mismatch,
        }),
    );
    r.extra.insert(
        "paths".into(),
        json!(rep.paths.iter().map(|p| json!({"traddr": p.traddr.to_string(), "ios": p.ios})).collect::<Vec<_>>()),
    );
    r.extra.insert("failovers".into(), json!(rep.failovers));
    r.extra.insert(
        "controllers".into(),
        json!(io.ctrls
            .iter()
            .map(|c| json!({"traddr": c.0.to_string(), "reconnects": c.1, "state": format!("{:?}", c.2), "last_error": c.3}))
            .collect::<Vec<_>>()),
    );
    r.extra.insert("outages".into(), json!(flaps.iter().map(FlapRecord::json).collect::<Vec<_>>()));
    r.extra.insert("timeline_ios_per_second".into(), json!(rep.timeline));
    r.extra.insert("recovered_at_end".into(), json!(io.recovered));
    r
}

/// I/O errors, verify failures and written blocks the read-back did not check, in a result
/// from [`run`] (non-zero fails the command).
pub fn losses(r: &LabResult) -> u64 {
    let n = |k: &str| r.extra.get(k).and_then(|v| v["errors"].as_u64()).unwrap_or(0);
    let v = |k: &str| r.extra.get("verify").and_then(|v| v[k].as_u64()).unwrap_or(0);
    n("write") + n("read_back") + v("failures") + v("written").saturating_sub(v("checked"))
}
