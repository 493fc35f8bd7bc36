//! `qpath target`.

use std::path::PathBuf;
use std::sync::Arc;

use target::config::Config;
use target::persist::{Persist, SaveMode};
use target::reactor::PollMode;
use target::rpc::RpcServer;
use target::server::Server;

use crate::sd_notify::{self, Notifier};

/// Arguments of `qpath target`.
#[derive(clap::Args, Debug)]
pub struct TargetArgs {
    /// TOML configuration (default: one 1 GiB RAM namespace on 127.0.0.1:4420 and :4421).
    #[arg(long)]
    config: Option<PathBuf>,
    /// JSON-RPC socket (overrides the config; default $XDG_RUNTIME_DIR/qpath.sock or /tmp/qpath.sock).
    #[arg(long)]
    rpc_socket: Option<PathBuf>,
    /// Reactor threads (overrides the config; 0 = one per CPU).
    #[arg(long)]
    reactors: Option<usize>,
    /// Reactor waiting: busy, adaptive or block (overrides the config).
    #[arg(long, value_parser = parse_poll)]
    poll: Option<PollMode>,
    /// CPUs to pin reactors to, e.g. "0" or "0,1".
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// Replace the listen address of a port: one IP:PORT per --listen, repeated for
    /// several ports, in the config's port order (e.g. --listen 10.0.0.1:4420 --listen
    /// 10.0.1.1:4420 for a network namespace).
    #[arg(long = "listen", value_name = "IP:PORT")]
    listen: Vec<String>,
    /// Fairness: PDUs one connection parses per reactor turn while other connections on the reactor have work (overrides the config; 0 = no limit).
    #[arg(long = "rx-budget-pdus", value_name = "PDUS")]
    rx_budget_pdus: Option<u32>,
    /// Fairness: most bytes in one send batch of a connection while other connections on the reactor have work (overrides the config; 0 = no limit).
    #[arg(long = "tx-batch-bytes", value_name = "BYTES")]
    tx_batch_bytes: Option<usize>,
    /// TCP congestion control of the connections: system (default), reno, cubic, bbr or dctcp.
    #[arg(long = "tcp-congestion", value_name = "NAME")]
    tcp_congestion: Option<target::registry::TcpCongestion>,
    /// Fairness: a reactor turn stops parsing deep queues' input this many µs after it began,
    /// to send what is ready (overrides the config; 0 = no deadline).
    #[arg(long = "tx-deadline-us", value_name = "US")]
    tx_deadline_us: Option<u64>,
    /// Threads for in-band authentication's Diffie-Hellman steps (overrides the config;
    /// 0 runs them on the reactors, stopping their other queues for each step).
    #[arg(long = "auth-workers", value_name = "N")]
    auth_workers: Option<usize>,
    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. 127.0.0.1:9420.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Save the running configuration to the --config file after every change made over
    /// RPC, before the RPC answers (atomically, the previous file kept as FILE.bak). Without
    /// it, the RPC save_config saves on demand. SIGHUP re-reads the file either way.
    #[arg(long, requires = "config")]
    persist: bool,
    /// Print the effective configuration (as JSON) and exit.
    #[arg(long)]
    print_config: bool,
    /// Check the configuration (with the other options applied) and print a summary of
    /// what would be served, then exit: nothing is started, bound, created or locked.
    /// Exits non-zero, listing every problem found, if it would not start.
    #[arg(long)]
    check: bool,
}

fn parse_poll(s: &str) -> Result<PollMode, String> {
    s.parse()
}

/// `--listen` values: each one address, no more of them than the configuration has ports.
/// Checked before anything starts.
fn check_listen(listen: &[String], ports: usize) -> Result<(), String> {
    for addr in listen {
        if addr.contains(',') || addr.split_whitespace().count() > 1 {
            return Err(format!(
                "--listen {addr:?}: one IP:PORT per --listen; repeat --listen for each port \
                 (--listen 127.0.0.1:4420 --listen 127.0.0.1:4421)"
            ));
        }
        target::server::parse_addr(addr)
            .map_err(|e| format!("--listen: {e} (expected IP:PORT, e.g. 127.0.0.1:4420)"))?;
    }
    if listen.len() > ports {
        let given = listen.len();
        let has = match ports {
            0 => "no ports".to_string(),
            1 => "1 port".to_string(),
            n => format!("{n} ports"),
        };
        return Err(format!(
            "--listen is given {given} times but the configuration has {has}: each --listen replaces the \
             address of one configured port, in order; add [[port]] tables to the --config file for more ports"
        ));
    }
    Ok(())
}

/// The command line's changes to a configuration file's contents, applied at start and to
/// the file a SIGHUP re-reads.
#[derive(Clone, Debug)]
struct Overrides {
    reactors: Option<usize>,
    poll: Option<PollMode>,
    cpus: Option<Vec<usize>>,
    rx_budget_pdus: Option<u32>,
    tcp_congestion: Option<target::registry::TcpCongestion>,
    tx_batch_bytes: Option<usize>,
    tx_deadline_us: Option<u64>,
    auth_workers: Option<usize>,
    listen: Vec<String>,
}

impl Overrides {
    fn apply(&self, cfg: &mut Config) -> Result<(), String> {
        if let Some(n) = self.reactors {
            cfg.reactor.reactors = n;
        }
        if let Some(p) = self.poll {
            cfg.reactor.poll = p;
        }
        if let Some(c) = &self.cpus {
            cfg.reactor.cpus.clone_from(c);
        }
        if let Some(v) = self.rx_budget_pdus {
            cfg.options.rx_budget_pdus = v;
        }
        if let Some(v) = self.tcp_congestion {
            cfg.options.tcp_congestion = v;
        }
        if let Some(v) = self.tx_batch_bytes {
            cfg.options.tx_batch_bytes = v;
        }
        if let Some(v) = self.tx_deadline_us {
            cfg.options.tx_deadline_us = v;
        }
        if let Some(v) = self.auth_workers {
            cfg.options.auth_workers = v;
        }
        check_listen(&self.listen, cfg.ports.len())?;
        for (port, addr) in cfg.ports.iter_mut().zip(&self.listen) {
            port.addr.clone_from(addr);
        }
        Ok(())
    }
}

pub fn run(a: TargetArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default(),
    };
    let overrides = Overrides {
        reactors: a.reactors,
        poll: a.poll,
        cpus: a.cpus.clone(),
        rx_budget_pdus: a.rx_budget_pdus,
        tcp_congestion: a.tcp_congestion,
        tx_batch_bytes: a.tx_batch_bytes,
        tx_deadline_us: a.tx_deadline_us,
        auth_workers: a.auth_workers,
        listen: a.listen.clone(),
    };
    overrides.apply(&mut cfg)?;
    if let Some(s) = a.rpc_socket {
        cfg.rpc.socket = Some(s);
    }
    if cfg.rpc.socket.is_none() {
        cfg.rpc.socket = Some(crate::default_rpc_socket());
    }
    if a.print_config {
        println!("{}", serde_json::to_string_pretty(&cfg)?);
        return Ok(());
    }
    if a.check {
        let origin = a.config.as_ref().map_or_else(|| "the embedded default".to_string(), |p| p.display().to_string());
        let report = crate::target_check::check(&cfg, a.metrics);
        print!("{}", report.summary);
        if report.problems.is_empty() {
            println!("{origin}: configuration OK; nothing was started");
            return Ok(());
        }
        let n = report.problems.len();
        return Err(format!(
            "{origin}: {n} problem{} would stop the target from starting:\n  {}",
            if n == 1 { "" } else { "s" },
            report.problems.join("\n  ")
        )
        .into());
    }
    // The metrics address is the one option whose trouble would otherwise show only after
    // the target started: try it first (bound and let go at once).
    if let Some(addr) = a.metrics {
        std::net::TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    }
    // And the RPC socket: one another target serves is never taken from it.
    if let Some(p) = &cfg.rpc.socket {
        RpcServer::check_path(p)?;
    }
    // Files the configuration creates are removed again if any part of the start fails
    // (dropping `new_files` on an early return does that); kept once everything is up.
    let (server, new_files) = cfg.start_with_new_files()?;
    let server = Arc::new(server);
    server.set_persist(Persist {
        file: a.config.clone(),
        mode: if a.persist { SaveMode::EveryChange } else { SaveMode::OnDemand },
        rpc: cfg.rpc.clone(),
        overrides: Box::new(move |c: &mut Config| {
            // Checked at start: the same list of ports applies again.
            if let Err(e) = overrides.apply(c) {
                tracing::warn!("reload: {e}");
            }
        }),
    })?;
    let _rpc = match &cfg.rpc.socket {
        Some(p) => Some(RpcServer::start(p, Arc::clone(&server))?),
        None => None,
    };
    let _metrics = match a.metrics {
        Some(addr) => {
            let st = Arc::clone(&server.state);
            let m = target::metrics::MetricsServer::start(addr, Arc::new(move || target::metrics::render(&st)))?;
            println!("metrics on http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    for f in new_files.paths() {
        println!("created {}", f.display());
    }
    new_files.keep();
    for p in server.state.ports() {
        let kind = match p.kind {
            target::port::PortKind::Io => "I/O and discovery",
            target::port::PortKind::Discovery => "discovery only",
        };
        println!("listening on {} (port {}, {kind})", p.addr, p.id);
    }
    for s in server.state.subsystems() {
        println!("serving {} with {} namespace(s)", s.nqn, s.namespaces().0.len());
    }
    if let Some(p) = &cfg.rpc.socket {
        println!("rpc socket {}", p.display());
    }
    if a.persist
        && let Some(f) = &a.config
    {
        println!("persisting every change to {}", f.display());
    }
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    // Under systemd (Type=notify): ready once every port listens and the RPC socket and
    // the metrics listener are up, which is now; the signal handlers are in place too, so
    // a reload or stop systemd sends from here on is heard.
    let notifier = Notifier::from_env();
    let notify = |state: &str| {
        if let Some(n) = &notifier {
            n.notify(state);
        }
    };
    notify(&format!("READY=1\n{}", sd_notify::status(&serving(&server))));
    // This thread sleeps until a signal arrives: it wakes for nothing else.
    let mut place = uring::placement::Helper::default();
    for signal in signals.forever() {
        if signal != SIGHUP {
            break;
        }
        // Off the CPUs polling reactors own while it reloads.
        let _ = place.refresh();
        notify("RELOADING=1");
        // SIGHUP: re-read the file and apply the difference (logged line by line; a
        // file that does not parse changes nothing).
        let outcome = match target::persist::reload(&server) {
            Ok(r) => {
                let (applied, refused) = (r.applied.len(), r.refused.len());
                eprintln!("qpath target: configuration reloaded: {applied} change(s) applied, {refused} refused");
                format!("reloaded: {applied} change(s) applied, {refused} refused")
            }
            Err(e) => {
                eprintln!("qpath target: configuration not reloaded, nothing changed: {e}");
                // Not the error itself: `systemctl status` shows STATUS to every user,
                // and a file that does not parse may be quoted around a key.
                "the last reload failed, nothing changed (see the log)".to_string()
            }
        };
        notify(&format!("READY=1\n{}", sd_notify::status(&format!("{}; {outcome}", serving(&server)))));
    }
    notify(&format!("STOPPING=1\n{}", sd_notify::status("shutting down")));
    eprintln!("qpath target: shutting down");
    if let Ok(s) = Arc::try_unwrap(server) {
        s.shutdown();
    }
    Ok(())
}

/// What the target serves, for systemd's `STATUS=` (`systemctl status`): "serving 2
/// subsystems (3 namespaces) on 127.0.0.1:4420, 127.0.0.1:4421".
fn serving(server: &Server) -> String {
    let subsystems = server.state.subsystems();
    let namespaces: usize = subsystems.iter().map(|s| s.namespaces().0.len()).sum();
    let addrs: Vec<String> = server.state.ports().iter().map(|p| p.addr.to_string()).collect();
    let on = if addrs.is_empty() { "no port".to_string() } else { addrs.join(", ") };
    format!("serving {} ({}) on {on}", counted(subsystems.len(), "subsystem"), counted(namespaces, "namespace"))
}

/// "1 subsystem", "2 subsystems".
fn counted(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn listen_takes_one_address_per_flag_and_one_flag_per_port() {
        assert!(check_listen(&l(&["127.0.0.1:4420", "[::1]:4421"]), 2).is_ok());
        assert!(check_listen(&[], 0).is_ok());
        let e = check_listen(&l(&["127.0.0.1:4420,127.0.0.1:4421"]), 2).unwrap_err();
        assert!(e.contains("one IP:PORT per --listen; repeat --listen"), "{e}");
        let e = check_listen(&l(&["127.0.0.1:4420 127.0.0.1:4421"]), 2).unwrap_err();
        assert!(e.contains("repeat --listen"), "{e}");
        let e = check_listen(&l(&["localhost"]), 2).unwrap_err();
        assert!(e.contains("\"localhost\"") && e.contains("expected IP:PORT"), "{e}");
        let e = check_listen(&l(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]), 2).unwrap_err();
        assert!(e.contains("given 3 times but the configuration has 2 ports"), "{e}");
        assert!(e.contains("add [[port]] tables"), "{e}");
        let e = check_listen(&l(&["127.0.0.1:1", "127.0.0.1:2"]), 1).unwrap_err();
        assert!(e.contains("has 1 port:"), "{e}");
    }
}
