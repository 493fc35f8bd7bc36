//! The embedded target: our NVMe/TCP target in the bench's own process, so a job file
//! without a `filename` (or one naming the default subsystem, with
//! `--embedded-target`) runs anywhere.
//!
//! ```text
//!   qpath bench process
//!   ┌────────────────────────────────────────────────────────────────────┐
//!   │ reactor thread (CPU 0)  ◄── loopback TCP, 2 ephemeral ports ──►  job threads (CPU 1..)
//!   │   RAM namespaces 1..=N sized to the jobs (1 GiB at least)         │
//!   └────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! It is `target::config::Config::embedded_default()` with three changes: the two ports
//! listen on `127.0.0.1:0` (any free port, so runs never collide with a `qpath target`
//! on 4420), one reactor pinned to CPU 0 when there is more than one CPU, and one RAM
//! namespace per NSID the jobs use, each sized to the largest `offset + size` (or
//! `filesize`) of its jobs. RAM namespaces are mapped lazily, so a large namespace
//! costs memory only where jobs write; each is still bounded by the memory available
//! at start.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use target::config::{Config, DEFAULT_NQN, NamespaceConfig, SizeValue};
use target::reactor::{PollMode, ReactorOptions};
use target::registry::TcpCongestion;
use target::server::Server;

use crate::error::{Error, ErrorKind, Result};
use crate::filename::{RemoteTarget, Target, TargetKind};
use crate::job::JobFile;

/// Smallest RAM namespace (the embedded default's size).
pub const NAMESPACE_BYTES_MIN: u64 = 1 << 30;
/// Memory left to everything else when namespaces are bounded by available memory.
const MEMORY_HEADROOM: u64 = 1 << 30;
/// How long the adaptive reactor spins after its last completion (the target's default).
pub const ADAPTIVE_SPIN_US: u64 = 200;

/// How to run the embedded target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// How the reactor waits.
    pub poll: PollMode,
    /// CPU of the reactor (`None` = not pinned).
    pub reactor_cpu: Option<usize>,
    /// `(nsid, bytes)` of each RAM namespace.
    pub namespaces: Vec<(u32, u64)>,
    /// TCP congestion control of its connections.
    pub tcp_congestion: TcpCongestion,
}

/// A running embedded target.
pub struct Embedded {
    server: Server,
    addrs: [SocketAddr; 2],
    /// Port ids of `addrs`.
    port_ids: [u16; 2],
    opts: EmbeddedOptions,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").field("addrs", &self.addrs).field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// Whether `r` names the embedded default subsystem on this machine (what the seed job
/// files in `examples/` point at: `qpath target`'s default on 127.0.0.1:4420).
pub fn names_default_subsystem(r: &RemoteTarget) -> bool {
    r.subnqn == DEFAULT_NQN && matches!(r.traddr.as_str(), "127.0.0.1" | "localhost" | "::1")
}

/// Which job threads go to the embedded target, and the namespace each uses: jobs
/// without a filename (namespace 1), and with `redirect_default` also jobs naming the
/// default subsystem on loopback (their own namespace).
pub fn embedded_jobs(file: &JobFile, redirect_default: bool) -> Vec<(usize, u32)> {
    file.jobs
        .iter()
        .enumerate()
        .filter_map(|(i, j)| match &j.target.kind {
            TargetKind::Embedded => Some((i, 1)),
            TargetKind::Remote(r) if redirect_default && names_default_subsystem(r) => Some((i, r.nsid)),
            _ => None,
        })
        .collect()
}

/// `MemAvailable` from `/proc/meminfo`, bytes.
pub fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The namespaces the embedded target needs for `jobs` (from [`embedded_jobs`]): each
/// NSID used, sized to its jobs (at least [`NAMESPACE_BYTES_MIN`], whole MiBs, at most
/// `memory_bytes` less a headroom), namespace 1 always. Notes say what was bounded.
pub fn plan_namespaces(
    file: &JobFile,
    jobs: &[(usize, u32)],
    memory_bytes: Option<u64>,
) -> (Vec<(u32, u64)>, Vec<String>) {
    let mut need: BTreeMap<u32, u64> = BTreeMap::new();
    need.insert(1, NAMESPACE_BYTES_MIN);
    for &(i, nsid) in jobs {
        let j = &file.jobs[i];
        let bytes = j.filesize.unwrap_or(0).max(j.offset + j.size.unwrap_or(0));
        let e = need.entry(nsid).or_insert(NAMESPACE_BYTES_MIN);
        *e = (*e).max(bytes);
    }
    let limit = memory_bytes.map(|m| m.saturating_sub(MEMORY_HEADROOM).max(NAMESPACE_BYTES_MIN));
    let mut notes = Vec::new();
    let plan = need
        .into_iter()
        .map(|(nsid, bytes)| {
            let mut size = bytes.max(NAMESPACE_BYTES_MIN).next_multiple_of(1 << 20);
            if let Some(l) = limit
                && size > l
            {
                notes.push(format!(
                    "embedded target: namespace {nsid} needs {} MiB but only {} MiB of memory are available; \
                     it is {} MiB",
                    size >> 20,
                    l >> 20,
                    l >> 20
                ));
                size = l & !((1 << 20) - 1);
            }
            (nsid, size)
        })
        .collect();
    (plan, notes)
}

fn target_err(what: &str, e: &impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("embedded target: {what}: {e}"))
}

impl Embedded {
    /// Start serving.
    pub fn start(opts: EmbeddedOptions) -> Result<Embedded> {
        let mut cfg = Config::embedded_default();
        for p in &mut cfg.ports {
            p.addr = "127.0.0.1:0".into();
        }
        cfg.options.tcp_congestion = opts.tcp_congestion;
        let spin_us = if opts.poll == PollMode::Adaptive { ADAPTIVE_SPIN_US } else { 0 };
        cfg.reactor =
            ReactorOptions { reactors: 1, cpus: opts.reactor_cpu.into_iter().collect(), poll: opts.poll, spin_us };
        let template = cfg.subsystems[0].namespaces[0].clone();
        cfg.subsystems[0].namespaces = opts
            .namespaces
            .iter()
            .map(|&(nsid, bytes)| NamespaceConfig { nsid, size: Some(SizeValue::Bytes(bytes)), ..template.clone() })
            .collect();
        let server = cfg.start().map_err(|e| target_err("start", &e))?;
        let ids: Vec<u16> = cfg.ports.iter().map(|p| p.id).collect();
        let addr = |id: u16| {
            server.local_addr(id).ok_or_else(|| Error::new(ErrorKind::Target, format!("embedded target: no port {id}")))
        };
        let addrs = [addr(ids[0])?, addr(ids[1])?];
        Ok(Embedded { server, addrs, port_ids: [ids[0], ids[1]], opts })
    }

    /// The target port behind `addrs()[path]` (its fault switches: `delay_us`,
    /// `refuse_connects`, `drop_generation`, `stall_opcode`).
    ///
    /// # Panics
    ///
    /// If `path` is not 0 or 1.
    pub fn port(&self, path: usize) -> std::sync::Arc<target::port::Port> {
        self.server.state.port(self.port_ids[path]).expect("the embedded target's ports are never removed")
    }

    /// The two bound addresses.
    pub fn addrs(&self) -> [SocketAddr; 2] {
        self.addrs
    }

    /// The options it runs with.
    pub fn options(&self) -> &EmbeddedOptions {
        &self.opts
    }

    /// The target's state (its statistics: `target::metrics`).
    pub fn state(&self) -> std::sync::Arc<target::registry::TargetState> {
        std::sync::Arc::clone(&self.server.state)
    }

    /// The URI of namespace `nsid` on the first port.
    pub fn uri(&self, nsid: u32) -> String {
        format!("nvme+tcp://{}/{DEFAULT_NQN}/{nsid}", self.addrs[0])
    }

    /// Point `file`'s `jobs` (from [`embedded_jobs`]) at this target, keeping each job's
    /// namespace, host NQN and digests. A job with `paths=2`, or whose filename named
    /// two paths, gets both ports as two paths of a multipath head.
    pub fn redirect(&self, file: &mut JobFile, jobs: &[(usize, u32)]) -> Result<()> {
        for &(i, nsid) in jobs {
            let Some(Target { kind: TargetKind::Remote(mut r), .. }) = Target::parse(Some(&self.uri(nsid))).ok() else {
                return Err(Error::new(ErrorKind::Target, "embedded target: its own URI does not parse"));
            };
            let job = &file.jobs[i];
            let named = match &job.target.kind {
                TargetKind::Remote(old) => old.path_count(),
                _ => 1,
            };
            let paths = crate::engine::mpath::paths_of(job)?.unwrap_or(named);
            if paths > self.addrs.len() {
                return Err(Error::new(
                    ErrorKind::Option,
                    format!("job {}: paths={paths}, but the embedded target has {} ports", job.name, self.addrs.len()),
                ));
            }
            r.more_paths = self.addrs[1..paths].iter().map(|a| (a.ip().to_string(), a.port())).collect();
            if let TargetKind::Remote(old) = &file.jobs[i].target.kind {
                r.hostnqn.clone_from(&old.hostnqn);
                r.hdgst = old.hdgst;
                r.ddgst = old.ddgst;
            }
            let uri = r.to_uri();
            file.jobs[i].target = Target { kind: TargetKind::Remote(r), raw: uri };
        }
        Ok(())
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let o = &self.opts;
        let poll = match o.poll {
            PollMode::Busy => "busy".to_string(),
            PollMode::Adaptive => format!("adaptive, spin {ADAPTIVE_SPIN_US} us"),
            PollMode::Block => "block".to_string(),
        };
        let cpu = o.reactor_cpu.map_or_else(|| "unpinned".to_string(), |c| format!("on CPU {c}"));
        let ns: Vec<String> = o
            .namespaces
            .iter()
            .map(|(n, b)| format!("ns {n} = {:.2} GiB RAM", *b as f64 / f64::from(1u32 << 30)))
            .collect();
        format!(
            "embedded qpath target in this process: {DEFAULT_NQN} on {} and {}, 1 reactor {cpu} ({poll}), {}",
            self.addrs[0],
            self.addrs[1],
            ns.join(", ")
        )
    }

    /// Stop serving (after every controller disconnected).
    pub fn shutdown(self) {
        self.server.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_follow_the_jobs() {
        let f = JobFile::parse(
            "[a]\nsize=256m\n\
             [b]\nfilesize=10G\nfilename=nvme+tcp://127.0.0.1:4420/nqn.2026-11.io.qpath:default/1\n\
             [c]\nfilesize=4G\nfilename=nvme+tcp://127.0.0.1:4420/nqn.2026-11.io.qpath:default/2\n\
             [d]\nsize=1m\nfilename=nvme+tcp://10.0.0.1:4420/nqn.2026-11.io.qpath:default/3\n",
            "t",
        )
        .unwrap();
        assert_eq!(embedded_jobs(&f, false), vec![(0, 1)]);
        let jobs = embedded_jobs(&f, true);
        assert_eq!(jobs, vec![(0, 1), (1, 1), (2, 2)], "a non-loopback address is not ours");
        let (plan, notes) = plan_namespaces(&f, &jobs, Some(64 << 30));
        assert_eq!(plan, vec![(1, 10 << 30), (2, 4 << 30)]);
        assert!(notes.is_empty());
        let (plan, notes) = plan_namespaces(&f, &jobs, Some(6 << 30));
        assert_eq!(plan, vec![(1, 5 << 30), (2, 4 << 30)]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        let (plan, _) = plan_namespaces(&f, &embedded_jobs(&f, false), None);
        assert_eq!(plan, vec![(1, NAMESPACE_BYTES_MIN)], "at least the default's 1 GiB");
    }

    #[test]
    fn paths_option_names_both_ports() {
        let s = Embedded::start(EmbeddedOptions {
            poll: PollMode::Block,
            reactor_cpu: None,
            namespaces: vec![(1, NAMESPACE_BYTES_MIN)],
            tcp_congestion: TcpCongestion::System,
        })
        .unwrap();
        let mut f = JobFile::parse(
            "[one]\nsize=1m\n\
             [two]\nsize=1m\npaths=2\n\
             [named]\nsize=1m\nfilename=nvme+tcp://127.0.0.1:4420,127.0.0.1:4421/nqn.2026-11.io.qpath:default/1\n\
             [three]\nsize=1m\npaths=3\n",
            "t",
        )
        .unwrap();
        let jobs = embedded_jobs(&f, true);
        assert!(s.redirect(&mut f, &jobs).unwrap_err().context.contains("has 2 ports"));
        f.jobs.pop();
        s.redirect(&mut f, &jobs[..3]).unwrap();
        let remote = |i: usize| match &f.jobs[i].target.kind {
            TargetKind::Remote(r) => r.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(remote(0).path_count(), 1);
        for i in [1, 2] {
            let r = remote(i);
            let addrs: Vec<String> = r.paths().iter().map(|p| format!("{}:{}", p.traddr, p.trsvcid)).collect();
            assert_eq!(addrs, vec![s.addrs()[0].to_string(), s.addrs()[1].to_string()], "job {i}");
        }
        s.port(1).faults.delay_us.store(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.port(1).addr, s.addrs()[1]);
        s.shutdown();
    }
}
