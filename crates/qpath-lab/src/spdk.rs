//! `qpath lab spdk`: qpath side by side with SPDK on this machine, one target at a time.
//!
//! Four columns, each a client against a target over loopback NVMe/TCP, the target's one
//! reactor busy-polling on CPU 0 and the client on CPU 1, a 256 MiB RAM namespace of
//! 4 KiB blocks (SPDK's malloc bdev, qpath's prefaulted RAM backend):
//!
//! ```text
//!   SPDK perf ──► SPDK nvmf_tgt     the reference pair
//!   SPDK perf ──► qpath target      the target alone
//!   qpath bench ─► SPDK nvmf_tgt    the host alone
//!   qpath bench ─► qpath target     the full stack
//! ```
//!
//! Five workloads (4k random reads at QD1, 32 and 128, 4k random writes at QD32, 128k
//! sequential reads at QD16), each cell the median of `--rounds` rounds. A round starts one
//! target as a child process, runs both clients against it (`spdk_nvme_perf` as a child,
//! its summary parsed; `qpath bench`'s qpath engine in this process), stops the target by
//! its pid, then does the same with the other target; rounds alternate which target and
//! which client go first (A B, B A, ...), so drift over the run favours neither. Each
//! cell's max/min over its rounds is printed beside its median, and the acceptance —
//! ratios against SPDK's own pair, spread per cell — with PASS or FAIL.
//!
//! SPDK is the user's build (`--spdk-dir`); the project never builds or ships it. Without
//! it, the lab runs the qpath column alone and says which columns it left out and why.
//!
//! `--tls`: every connection of every column runs inside TLS 1.3 (NVMe/TCP 1.1 §3.6), with a
//! PSK made for the run (hash 01, SHA-256) and the identity SPDK 24.01 presents and looks
//! up, `NVMe0R01 <hostnqn> <subnqn>`. The key goes to SPDK in a file of mode 0600 (as
//! `nvmf_subsystem_add_host --psk` and perf's `--psk-path` take it) and to qpath in its
//! configuration and job; it is never printed. Running the lab with and without `--tls`
//! gives each stack's cost of TLS; the two cross columns show the stacks interoperate.

pub mod perf;
pub mod process;
pub mod table;

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use bench::engine::EngineRegistry;
use bench::engine::remote::Controllers;
use bench::job::JobFile;
use bench::run::{RunOptions, StatusMode};
use bench::{Error, ErrorKind, Result};
use target::config::{Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, SubsystemConfig};
use target::reactor::{PollMode, ReactorOptions};

use crate::result::{Cell, Goal, LabOutputArgs, LabResult};
use perf::SpdkMemory;
use process::TargetProcess;
use table::{CellStats, Check, CheckKind, Client, Column, Measure, Sample, TargetKind, WORKLOADS, Workload};

/// The subsystem both targets serve.
pub const NQN: &str = "nqn.2026-11.io.qpath:lab-spdk";
/// The namespace's size (the issue's 256 MiB malloc bdev).
const NAMESPACE_MIB: u32 = 256;
/// Its block size.
const BLOCK_BYTES: u32 = 4096;
/// Most rounds.
const ROUNDS_MAX: u32 = 20;
/// Memory of nvmf_tgt without hugepages: the namespace plus its buffer pools.
const TGT_NO_HUGE_MIB: u32 = 1024;
/// Memory of spdk_nvme_perf without hugepages.
const PERF_NO_HUGE_MIB: u32 = 512;
/// A client run may take this much longer than its warm-up and duration (connect,
/// teardown, a loaded machine) before it is killed.
const CLIENT_SLACK: Duration = Duration::from_secs(60);
/// The host NQN of `--tls` runs (its PSK is bound to it).
pub const TLS_HOSTNQN: &str = "nqn.2026-11.io.qpath:lab-spdk-host";
/// What nvmf_tgt logs once its listener is up (`nvmf/tcp.c`).
const SPDK_LISTENING: &str = "Target Listening on";

fn parse_rounds(s: &str) -> std::result::Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=ROUNDS_MAX).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a number of rounds in 1..={ROUNDS_MAX}")),
    }
}

fn parse_warmup(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: a number of seconds in [0, 60]")),
    }
}

/// Arguments of `qpath lab spdk`.
#[derive(Debug, Clone, clap::Args)]
pub struct SpdkArgs {
    /// An SPDK build or install: its nvmf_tgt and spdk_nvme_perf are looked for in
    /// DIR/build/bin, DIR/build/examples and DIR/bin. Without it, only the qpath column runs.
    #[arg(long = "spdk-dir", value_name = "DIR")]
    pub spdk_dir: Option<PathBuf>,
    /// Seconds each cell is measured, per round (whole seconds when SPDK runs: perf takes no fraction).
    #[arg(long, default_value = "5", value_parser = crate::seconds_up_to::<600>)]
    pub duration: f64,
    /// Seconds of warm-up before each measurement (0: none).
    #[arg(long, default_value = "1", value_parser = parse_warmup)]
    pub warmup: f64,
    /// Rounds; each cell is the median of its rounds.
    #[arg(long, default_value = "3", value_parser = parse_rounds)]
    pub rounds: u32,
    /// CPU of the target's reactor (default 0 on a multi-CPU machine).
    #[arg(long = "target-cpu")]
    pub target_cpu: Option<usize>,
    /// CPU of the client (default 1 on a multi-CPU machine).
    #[arg(long = "client-cpu")]
    pub client_cpu: Option<usize>,
    /// Every connection inside TLS 1.3, with a PSK made for the run (both targets require
    /// it; the clients present the older identity, which SPDK 24.01 expects).
    #[arg(long)]
    pub tls: bool,
    /// Text/JSON output (no plot: the table is the result).
    #[command(flatten)]
    pub output: LabOutputArgs,
}

impl Default for SpdkArgs {
    fn default() -> Self {
        SpdkArgs {
            spdk_dir: None,
            duration: 5.0,
            warmup: 1.0,
            rounds: 3,
            target_cpu: None,
            client_cpu: None,
            tls: false,
            output: LabOutputArgs::default(),
        }
    }
}

/// SPDK's two programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpdkBins {
    /// The target.
    pub nvmf_tgt: PathBuf,
    /// The client.
    pub perf: PathBuf,
}

/// Finds nvmf_tgt and spdk_nvme_perf under `dir`, or says why the SPDK columns cannot run.
pub fn find_spdk(dir: Option<&Path>) -> std::result::Result<SpdkBins, String> {
    let Some(dir) = dir else {
        return Err("no SPDK build was given (--spdk-dir DIR)".into());
    };
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let places = [dir.join("build/bin"), dir.join("build/examples"), dir.join("bin")];
    let find = |name: &str| places.iter().map(|p| p.join(name)).find(|p| p.is_file());
    // Before SPDK 20.01 the client was build/examples/perf.
    let perf = find("spdk_nvme_perf").or_else(|| find("perf"));
    match (find("nvmf_tgt"), perf) {
        (Some(nvmf_tgt), Some(perf)) => Ok(SpdkBins { nvmf_tgt, perf }),
        (t, p) => {
            let missing: Vec<&str> = [(t.is_none(), "nvmf_tgt"), (p.is_none(), "spdk_nvme_perf")]
                .into_iter()
                .filter_map(|(m, n)| m.then_some(n))
                .collect();
            Err(format!(
                "{}: no {} in build/bin, build/examples or bin (is SPDK built there?)",
                dir.display(),
                missing.join(" and no ")
            ))
        }
    }
}

/// Hugepages free now, in MiB (from /proc/meminfo).
fn free_hugepages_mib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:") * field("Hugepagesize:") / 1024
}

/// Hugepages when enough are free for both SPDK processes; otherwise anonymous memory.
/// The lab never changes the system's hugepage settings.
fn spdk_memory() -> (SpdkMemory, SpdkMemory, String) {
    let need = u64::from(TGT_NO_HUGE_MIB + PERF_NO_HUGE_MIB);
    let free = free_hugepages_mib();
    // DPDK maps its hugepages from a hugetlbfs mount.
    let mounted = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.lines().any(|l| l.contains(" hugetlbfs ")));
    if !mounted {
        let note = "SPDK memory: --no-huge (no hugetlbfs is mounted; mount -t hugetlbfs nodev /dev/hugepages and \
                    echo 1024 > /proc/sys/vm/nr_hugepages give SPDK hugepages)";
        return (
            SpdkMemory::NoHuge { mib: TGT_NO_HUGE_MIB },
            SpdkMemory::NoHuge { mib: PERF_NO_HUGE_MIB },
            note.into(),
        );
    }
    if free >= need {
        (SpdkMemory::Huge, SpdkMemory::Huge, format!("SPDK memory: hugepages ({free} MiB free)"))
    } else {
        (
            SpdkMemory::NoHuge { mib: TGT_NO_HUGE_MIB },
            SpdkMemory::NoHuge { mib: PERF_NO_HUGE_MIB },
            format!(
                "SPDK memory: --no-huge (only {free} MiB of hugepages free, {need} needed; \
                 echo 1024 > /proc/sys/vm/nr_hugepages gives SPDK hugepages)"
            ),
        )
    }
}

/// The SPDK target's JSON configuration: a 256 MiB malloc bdev of 4 KiB blocks as
/// namespace 1 of [`NQN`], open to any host, on TCP at `addr`; with `psk_file`, open only
/// to [`TLS_HOSTNQN`] with that PSK, on a listener that requires TLS (SPDK 24.01's
/// `secure_channel`, `nvmf_subsystem_add_host`'s `psk`).
pub fn spdk_config(addr: SocketAddr, psk_file: Option<&Path>) -> Value {
    let mut v = spdk_config_plain(addr);
    let Some(psk) = psk_file else { return v };
    let nvmf = v["subsystems"][1]["config"].as_array_mut().expect("built above");
    nvmf[1]["params"]["allow_any_host"] = json!(false);
    nvmf[3]["params"]["secure_channel"] = json!(true);
    nvmf.push(json!({ "method": "nvmf_subsystem_add_host",
                      "params": { "nqn": NQN, "host": TLS_HOSTNQN, "psk": psk.display().to_string() } }));
    v
}

fn spdk_config_plain(addr: SocketAddr) -> Value {
    let blocks = u64::from(NAMESPACE_MIB) * (1 << 20) / u64::from(BLOCK_BYTES);
    json!({
        "subsystems": [
            { "subsystem": "bdev", "config": [
                { "method": "bdev_malloc_create",
                  "params": { "name": "Malloc0", "num_blocks": blocks, "block_size": BLOCK_BYTES } },
                { "method": "bdev_wait_for_examine" }
            ]},
            { "subsystem": "nvmf", "config": [
                { "method": "nvmf_create_transport", "params": { "trtype": "TCP" } },
                { "method": "nvmf_create_subsystem",
                  "params": { "nqn": NQN, "allow_any_host": true, "serial_number": "QPATHLAB0001",
                              "model_number": "SPDK bdev Controller" } },
                { "method": "nvmf_subsystem_add_ns",
                  "params": { "nqn": NQN, "namespace": { "bdev_name": "Malloc0", "nsid": 1 } } },
                { "method": "nvmf_subsystem_add_listener",
                  "params": { "nqn": NQN, "listen_address": {
                      "trtype": "TCP", "adrfam": "IPv4", "traddr": addr.ip().to_string(),
                      "trsvcid": addr.port().to_string() } } }
            ]}
        ]
    })
}

/// The qpath target's configuration: the same namespace (RAM, prefaulted as SPDK's malloc
/// bdev is allocated whole), one port at `addr`, one busy-polling reactor on `cpu`; with
/// `tls_key`, the port requires TLS and only [`TLS_HOSTNQN`] with that key may connect.
pub fn qpath_config(addr: SocketAddr, cpu: Option<usize>, tls_key: Option<&str>) -> Config {
    let mut cfg = Config::embedded_default();
    let mut port = PortConfig::io(1, addr.to_string());
    if tls_key.is_some() {
        port.tls = target::tls::TlsMode::Required;
    }
    cfg.ports = vec![port];
    cfg.reactor = ReactorOptions { reactors: 1, cpus: cpu.into_iter().collect(), poll: PollMode::Busy, spin_us: 0 };
    let mut ns = NamespaceConfig::ram(1, &format!("{NAMESPACE_MIB}M"));
    ns.block_size = BLOCK_BYTES;
    ns.prefault = true;
    let mut sub = SubsystemConfig::open(NQN, vec![ns]);
    if let Some(key) = tls_key {
        sub.allow_any_host = false;
        sub.hosts = vec![HostEntry::Auth(HostAuthConfig {
            nqn: TLS_HOSTNQN.into(),
            tls_key: Some(key.into()),
            ..HostAuthConfig::default()
        })];
    }
    cfg.subsystems = vec![sub];
    cfg
}

/// A loopback address nothing listens on now.
fn free_addr() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("bind an ephemeral loopback port", e))?;
    l.local_addr().map_err(|e| Error::io("an ephemeral port's address", e))
}

/// How a run is laid out, after the options are checked.
#[derive(Debug, Clone)]
struct Plan {
    duration: Duration,
    warmup: Duration,
    rounds: u32,
    target_cpu: Option<usize>,
    client_cpu: Option<usize>,
    spdk: std::result::Result<SpdkBins, String>,
    tgt_mem: SpdkMemory,
    perf_mem: SpdkMemory,
    /// `--tls`: the run's configured PSK (interchange format); never printed.
    tls_key: Option<zeroize::Zeroizing<String>>,
    notes: Vec<String>,
}

fn plan(args: &SpdkArgs) -> Result<Plan> {
    let (target_default, clients) = crate::default_cpus(uring::online_cpus());
    let target_cpu = args.target_cpu.or(target_default);
    let client_cpu = args.client_cpu.or(clients.first().copied());
    let spdk = find_spdk(args.spdk_dir.as_deref());
    let mut notes = Vec::new();
    let (tgt_mem, perf_mem) = if spdk.is_ok() {
        for (what, v) in [("--duration", args.duration), ("--warmup", args.warmup)] {
            if v.fract() != 0.0 {
                return Err(Error::new(
                    ErrorKind::Option,
                    format!("{what} {v}: spdk_nvme_perf takes whole seconds; give a whole number to compare with SPDK"),
                ));
            }
        }
        for (what, cpu) in [("--target-cpu", target_cpu), ("--client-cpu", client_cpu)] {
            if cpu.is_none_or(|c| c >= 128) {
                return Err(Error::new(
                    ErrorKind::Option,
                    format!(
                        "{what}: SPDK's processes need a CPU each (0..127); this machine has {}",
                        uring::online_cpus()
                    ),
                ));
            }
        }
        let (t, p, note) = spdk_memory();
        notes.push(note);
        (t, p)
    } else {
        (SpdkMemory::Huge, SpdkMemory::Huge)
    };
    if let Err(why) = &spdk {
        notes.push(format!(
            "SPDK columns NOT RUN: {why}. Only qpath bench → qpath tgt ran; no ratio against SPDK was taken."
        ));
    }
    let cpu = |c: Option<usize>| c.map_or_else(|| "unpinned".to_string(), |c| format!("CPU {c}"));
    notes.push(format!(
        "one target at a time, its reactor busy-polling on {}; clients on {}; {NAMESPACE_MIB} MiB RAM namespace, \
         {BLOCK_BYTES}-byte blocks; {} s per cell after {} s of warm-up; {} round(s), targets and clients alternating",
        cpu(target_cpu),
        cpu(client_cpu),
        args.duration,
        args.warmup,
        args.rounds
    ));
    // Other work on the machine shows in the spreads; say how busy it was.
    let tls_key = if args.tls {
        let key = tls::psk::ConfiguredPsk::generate(tls::psk::PskHash::Sha256)
            .map_err(|e| Error::new(ErrorKind::Target, format!("a TLS key for the run: {e}")))?;
        notes.push(format!(
            "TLS 1.3 on every connection: a key made for this run (hash 01, TLS_AES_128_GCM_SHA256), \
             host {TLS_HOSTNQN}, identity version 0 (NVMe0R01, as SPDK 24.01 presents it); \
             records sealed in user space by both stacks (this machine's kernel has no tls ULP)"
        ));
        Some(key.to_interchange())
    } else {
        None
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    if let Some(one_min) = load.split_whitespace().next() {
        notes.push(format!(
            "load average at start: {one_min} on {} CPUs (other work on the machine widens the spreads)",
            uring::online_cpus()
        ));
    }
    let cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    if !cc.trim().is_empty() {
        notes.push(format!("TCP congestion control: {} (the system's, for both stacks)", cc.trim()));
    }
    Ok(Plan {
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        rounds: args.rounds,
        target_cpu,
        client_cpu,
        spdk,
        tgt_mem,
        perf_mem,
        tls_key,
        notes,
    })
}

/// `--tls`: the key in a file SPDK reads (mode 0600: SPDK refuses a PSK file others may read).
fn write_psk_file(plan: &Plan, dir: &Path) -> Result<Option<PathBuf>> {
    let Some(key) = &plan.tls_key else { return Ok(None) };
    let path = dir.join("tls.psk");
    write_private(&path, key.as_bytes())?;
    Ok(Some(path))
}

/// Starts one target on a fresh loopback port.
fn start_target(kind: TargetKind, plan: &Plan, qpath_exe: &Path, dir: &Path) -> Result<TargetProcess> {
    let addr = free_addr()?;
    match kind {
        TargetKind::Qpath => {
            let cfg_path = dir.join("qpath-target.toml");
            let key = plan.tls_key.as_ref().map(|k| k.as_str());
            let text = target::persist::to_toml(&qpath_config(addr, plan.target_cpu, key))
                .map_err(|e| Error::new(ErrorKind::Target, format!("the qpath target's configuration: {e}")))?;
            write_private(&cfg_path, text.as_bytes())?;
            let mut cmd = Command::new(qpath_exe);
            cmd.arg("target").arg("--config").arg(&cfg_path).arg("--rpc-socket").arg(dir.join("qpath.sock"));
            cmd.env("RUST_LOG", "warn");
            TargetProcess::start("qpath target", cmd, addr, dir.join("qpath-target.log"), None)
        }
        TargetKind::Spdk => {
            let bins = plan.spdk.as_ref().expect("SPDK targets start only when SPDK was found");
            let cfg_path = dir.join("nvmf_tgt.json");
            let psk = plan.tls_key.is_some().then(|| dir.join("tls.psk"));
            let text =
                serde_json::to_string_pretty(&spdk_config(addr, psk.as_deref())).expect("a JSON value serialises");
            std::fs::write(&cfg_path, text).map_err(|e| Error::io(format!("write {}", cfg_path.display()), e))?;
            let cpu = plan.target_cpu.expect("checked by plan");
            let mut cmd = Command::new(&bins.nvmf_tgt);
            cmd.arg("-m").arg(perf::core_mask(cpu)).arg("-c").arg(&cfg_path).arg("-r").arg(dir.join("spdk.sock"));
            cmd.args(plan.tgt_mem.args());
            TargetProcess::start("SPDK nvmf_tgt", cmd, addr, dir.join("nvmf_tgt.log"), Some(SPDK_LISTENING))
        }
    }
}

/// Writes a file only its owner may read (the PSK file, and the qpath target's configuration,
/// which holds the key), in the run's own directory ([`run_dir`]), replacing one the run
/// wrote before.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    f.write_all(bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// `qpath bench`'s job for one workload against `addr`. Random workloads draw their offsets
/// without fio's random map, as perf draws them (`rand_r`, no record of the blocks done), so
/// that both clients do the same work per I/O.
fn bench_job(w: &Workload, plan: &Plan, addr: SocketAddr) -> String {
    let cpus = plan.client_cpu.map_or_else(String::new, |c| format!("cpus_allowed={c}\n"));
    let map = if w.pattern.random() { "norandommap\n" } else { "" };
    let ramp = if plan.warmup.is_zero() { String::new() } else { format!("ramp_time={}ms\n", plan.warmup.as_millis()) };
    format!(
        "[{name}]\nioengine=qpath\nfilename=nvme+tcp://{addr}/{NQN}/1{tls}\nrw={rw}\nbs={bs}\niodepth={qd}\n\
         direct=1\nthread\nhipri\n{map}{cpus}time_based\nruntime={ms}ms\n{ramp}size={NAMESPACE_MIB}m\n",
        name = w.name.replace(' ', "-"),
        rw = w.pattern.word(),
        bs = w.bs,
        qd = w.qd,
        ms = plan.duration.as_millis().max(1),
        tls = plan
            .tls_key
            .as_ref()
            .map_or_else(String::new, |k| format!("?hostnqn={TLS_HOSTNQN}&tls_key={}&tls_identity=0", k.as_str())),
    )
}

/// One `qpath bench` run in this process (the qpath host, busy-polling as perf does).
fn run_bench(w: &Workload, plan: &Plan, addr: SocketAddr) -> Result<Measure> {
    let file = JobFile::parse(&bench_job(w, plan, addr), "lab-spdk")?;
    let ctrls = Arc::new(Controllers::for_jobs(&file));
    let registry = EngineRegistry::with_all_engines(&ctrls);
    let opts = RunOptions { pin: Some(crate::pin_hook()), status: StatusMode::Never, ..RunOptions::default() };
    let result = bench::run::run_jobs(&file, &registry, &opts, &mut std::io::sink());
    drop(registry);
    ctrls.disconnect_all();
    let result = result?;
    let job = result.jobs.first().ok_or_else(|| Error::new(ErrorKind::Engine, "qpath bench: no job ran"))?;
    if let Some(e) = &job.outcome.error {
        return Err(Error::new(ErrorKind::Engine, format!("qpath bench, {}: {}", w.name, e.message)));
    }
    let d = job
        .outcome
        .stat
        .dirs
        .iter()
        .find(|d| d.io_bytes > 0)
        .ok_or_else(|| Error::new(ErrorKind::Engine, format!("qpath bench, {}: no I/O completed", w.name)))?;
    let secs = d.runtime_ms as f64 / 1e3;
    let lat = if d.lat.samples > 0 { &d.lat } else { &d.clat };
    Ok(Measure {
        iops: d.io_bytes as f64 / f64::from(w.bs) / secs,
        mib_s: d.io_bytes as f64 / f64::from(1 << 20) / secs,
        lat_us: lat.mean / 1e3,
    })
}

/// One `spdk_nvme_perf` run, as a child on the client CPU.
fn run_perf(w: &Workload, plan: &Plan, addr: SocketAddr, dir: &Path) -> Result<Measure> {
    let bins = plan.spdk.as_ref().expect("perf runs only when SPDK was found");
    // Whole seconds of at most 600 and 60 (checked by the options).
    let secs = u32::try_from(plan.duration.as_secs()).unwrap_or(u32::MAX);
    let warmup = u32::try_from(plan.warmup.as_secs()).unwrap_or(u32::MAX);
    let cpu = plan.client_cpu.expect("checked by plan");
    let mut cmd = Command::new(&bins.perf);
    let mut args = perf::args(w, secs, warmup, cpu, addr, NQN, plan.perf_mem);
    if plan.tls_key.is_some() {
        perf::add_tls(&mut args, TLS_HOSTNQN, &dir.join("tls.psk"));
    }
    cmd.args(args);
    let (out, err) = (dir.join("perf.out"), dir.join("perf.err"));
    let status = process::run_bounded("spdk_nvme_perf", cmd, &out, &err, plan.duration + plan.warmup + CLIENT_SLACK)?;
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    if !status.success() {
        return Err(Error::new(
            ErrorKind::Engine,
            format!(
                "spdk_nvme_perf, {}: exited {status}; its output:\n{}\n{}",
                w.name,
                stdout.trim(),
                process::log_tail(&err)
            ),
        ));
    }
    perf::parse_total(&stdout).map_err(|e| Error::new(ErrorKind::Engine, format!("{}: {e}", w.name)))
}

/// Runs the table and builds the report (does not print it). `qpath_exe` is the `qpath`
/// program that serves the qpath target.
pub fn run(args: &SpdkArgs, qpath_exe: &Path, progress: &mut dyn std::io::Write) -> Result<Report> {
    let plan = plan(args)?;
    for n in &plan.notes {
        let _ = writeln!(progress, "spdk: {n}");
    }
    let dir = run_dir()?;
    let result = write_psk_file(&plan, &dir).and_then(|_| run_rounds(&plan, qpath_exe, &dir, progress));
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        let _ = writeln!(progress, "spdk: logs kept in {}", dir.display());
    }
    let samples = result?;
    Ok(Report::new(&plan, samples))
}

/// A new directory only this user may enter, for the run's configurations, key and logs:
/// never one that was there before (another's files, or links planted in the shared
/// temporary directory, are never written through).
fn run_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let base = std::env::temp_dir();
    let pid = std::process::id();
    let mut last = None;
    for n in 0..100 {
        let dir = base.join(if n == 0 { format!("qpath-lab-spdk-{pid}") } else { format!("qpath-lab-spdk-{pid}-{n}") });
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(dir),
            Err(e) => return Err(Error::io(format!("create {}", dir.display()), e)),
        }
    }
    let dir = last.unwrap_or(base);
    Err(Error::io(
        format!("create a run directory like {} (100 names taken)", dir.display()),
        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
    ))
}

fn run_rounds(plan: &Plan, qpath_exe: &Path, dir: &Path, progress: &mut dyn std::io::Write) -> Result<Vec<Sample>> {
    let with_spdk = plan.spdk.is_ok();
    let mut samples = Vec::new();
    for round in 0..plan.rounds {
        let flip = round % 2 == 1;
        let targets: Vec<TargetKind> = match (with_spdk, flip) {
            (false, _) => vec![TargetKind::Qpath],
            (true, false) => vec![TargetKind::Spdk, TargetKind::Qpath],
            (true, true) => vec![TargetKind::Qpath, TargetKind::Spdk],
        };
        let clients: Vec<Client> = match (with_spdk, flip) {
            (false, _) => vec![Client::Bench],
            (true, false) => vec![Client::Perf, Client::Bench],
            (true, true) => vec![Client::Bench, Client::Perf],
        };
        for kind in targets {
            let mut t = start_target(kind, plan, qpath_exe, dir)?;
            let pid = t.pid().map_or_else(String::new, |p| format!(", pid {p}"));
            let _ =
                writeln!(progress, "spdk: round {}/{}: {} started on {}{pid}", round + 1, plan.rounds, t.name, t.addr);
            for (wi, w) in WORKLOADS.iter().enumerate() {
                for client in &clients {
                    let column = Column { client: *client, target: kind };
                    let _ =
                        writeln!(progress, "spdk: round {}/{}: {}: {}", round + 1, plan.rounds, column.name(), w.name);
                    let m = match client {
                        Client::Perf => run_perf(w, plan, t.addr, dir),
                        Client::Bench => run_bench(w, plan, t.addr),
                    };
                    t.check_alive()?;
                    samples.push(Sample { workload: wi, column, round, measure: m? });
                }
            }
            t.stop()?;
        }
    }
    Ok(samples)
}

/// The lab's outcome: every round's sample, each cell's statistics, the checks.
#[derive(Debug, Clone)]
pub struct Report {
    /// Every run.
    pub samples: Vec<Sample>,
    /// `[workload][column]`.
    pub cells: Vec<[Option<CellStats>; 4]>,
    /// The acceptance checks that could be made.
    pub checks: Vec<Check>,
    /// Why the SPDK columns did not run, when they did not.
    pub spdk_skipped: Option<String>,
    /// How it ran.
    pub notes: Vec<String>,
    /// Every connection was inside TLS 1.3.
    pub tls: bool,
}

impl Report {
    fn new(plan: &Plan, samples: Vec<Sample>) -> Report {
        let cells = table::cells(&samples);
        let checks = table::checks(&cells);
        Report {
            samples,
            cells,
            checks,
            spdk_skipped: plan.spdk.as_ref().err().cloned(),
            notes: plan.notes.clone(),
            tls: plan.tls_key.is_some(),
        }
    }

    fn title(&self) -> String {
        let over = if self.tls { "NVMe/TCP in TLS 1.3" } else { "NVMe/TCP" };
        format!("qpath side by side with SPDK ({over} over loopback)")
    }

    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.pass()).count()
    }

    /// The text report: notes, the table (median and ×max/min per cell), every check with
    /// PASS or FAIL.
    pub fn text(&self) -> String {
        let mut s = format!("spdk: {}\n", self.title());
        for n in &self.notes {
            let _ = writeln!(s, "  {n}");
        }
        s.push('\n');
        s.push_str(&table::text_table(&self.cells));
        let _ = writeln!(s, "(each cell: median of its rounds, then ×max/min over them)\n");
        for c in &self.checks {
            let bound = format!("{} {}", if c.at_most { "<=" } else { ">=" }, c.bound);
            let _ = writeln!(s, "{}  {} = {} ({bound})", c.verdict(), c.what(), ratio_text(c.ratio));
        }
        if self.cells.iter().flatten().flatten().any(|c| c.rounds < 2) {
            let _ = writeln!(s, "cells of one round have no spread to judge (--rounds 3 for the acceptance)");
        }
        if self.checks.is_empty() {
            let _ = writeln!(s, "no check could be made");
        } else {
            let _ = writeln!(s, "\n{} of {} checks passed", self.checks.len() - self.failed(), self.checks.len());
        }
        if let Some(why) = &self.spdk_skipped {
            let _ = writeln!(s, "SPDK columns NOT RUN: {why}");
        }
        s
    }

    /// The same as a lab result (rows per measured cell, goals per check) for `--json`.
    pub fn lab_result(&self) -> LabResult {
        let mut r = LabResult::new("spdk", self.title());
        for n in &self.notes {
            r.note(n.clone());
        }
        r.columns(&["workload", "column", "unit", "median", "min", "max", "spread", "rounds"]);
        for (w, row) in self.cells.iter().enumerate() {
            let wl = WORKLOADS[w];
            for (c, cell) in Column::ALL.iter().zip(row) {
                let Some(st) = cell else { continue };
                let unit = wl.metric.unit();
                r.row(vec![
                    Cell::text(wl.name),
                    Cell::text(c.key()),
                    Cell::text(unit),
                    Cell::num(st.median, unit),
                    Cell::num(st.min, unit),
                    Cell::num(st.max, unit),
                    Cell::num(st.spread(), ""),
                    Cell::num(st.rounds as f64, ""),
                ]);
            }
        }
        for c in &self.checks {
            let (value, base) = self.check_sides(c);
            r.goal(if c.at_most {
                Goal::at_most(c.what(), value, base, c.bound)
            } else {
                Goal::at_least(c.what(), value, base, c.bound)
            });
        }
        r.extra.insert("spdk_run".into(), json!(self.spdk_skipped.is_none()));
        if let Some(why) = &self.spdk_skipped {
            r.extra.insert("spdk_skipped".into(), json!(why));
        }
        let samples: Vec<Value> = self
            .samples
            .iter()
            .map(|s| {
                json!({ "workload": WORKLOADS[s.workload].name, "column": s.column.key(), "round": s.round,
                        "iops": s.measure.iops, "mib_s": s.measure.mib_s, "lat_us": s.measure.lat_us })
            })
            .collect();
        r.extra.insert("samples".into(), Value::Array(samples));
        r
    }

    /// The value and baseline a check's ratio came from.
    fn check_sides(&self, c: &Check) -> (f64, f64) {
        let row = &self.cells[c.workload];
        let med = |col: Column| {
            let i = Column::ALL.iter().position(|x| *x == col).expect("every column is listed");
            row[i].map_or(f64::NAN, |s| s.median)
        };
        match c.kind {
            CheckKind::Ratio(scope) => (med(scope.column()), med(Column::PERF_SPDK)),
            CheckKind::Spread(col) => {
                let i = Column::ALL.iter().position(|x| *x == col).expect("every column is listed");
                row[i].map_or((f64::NAN, f64::NAN), |s| (s.max, s.min))
            }
        }
    }

    /// Prints it as `opts` asks: the text report, or the lab result's JSON.
    pub fn emit(&self, opts: &LabOutputArgs) -> Result<()> {
        if opts.json {
            let opts = LabOutputArgs { no_plot: true, plot: None, ..opts.clone() };
            self.lab_result().emit(&opts)?;
            return Ok(());
        }
        let text = self.text();
        match &opts.output {
            Some(p) => std::fs::write(p, text).map_err(|e| Error::io(format!("write {}", p.display()), e)),
            None => std::io::stdout().lock().write_all(text.as_bytes()).map_err(|e| Error::io("write lab report", e)),
        }
    }
}

fn ratio_text(r: f64) -> String {
    if r.is_finite() { format!("{r:.3}") } else { "not measured".into() }
}

/// Runs the lab and prints its report (`qpath lab spdk`).
pub fn lab(args: &SpdkArgs, qpath_exe: &Path) -> Result<Report> {
    let r = run(args, qpath_exe, &mut std::io::stderr())?;
    r.emit(&args.output)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_gets_a_new_private_directory_and_never_writes_through_an_existing_one() {
        use std::os::unix::fs::PermissionsExt as _;
        let (a, b) = (run_dir().unwrap(), run_dir().unwrap());
        assert_ne!(a, b, "the second run's directory is a new one");
        for d in [&a, &b] {
            assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700);
        }
        write_private(&b.join("tls.psk"), b"key").unwrap();
        assert_eq!(std::fs::metadata(b.join("tls.psk")).unwrap().permissions().mode() & 0o777, 0o600);
        for d in [a, b] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn without_a_dir_or_binaries_spdk_is_not_found_and_the_reason_says_so() {
        assert!(find_spdk(None).unwrap_err().contains("--spdk-dir"));
        let dir = std::env::temp_dir().join(format!("qpath-lab-spdk-find-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("build/bin")).unwrap();
        let why = find_spdk(Some(&dir)).unwrap_err();
        assert!(why.contains("no nvmf_tgt and no spdk_nvme_perf"), "{why}");
        std::fs::write(dir.join("build/bin/nvmf_tgt"), "").unwrap();
        let why = find_spdk(Some(&dir)).unwrap_err();
        assert!(why.contains("no spdk_nvme_perf") && !why.contains("nvmf_tgt"), "{why}");
        std::fs::write(dir.join("build/bin/spdk_nvme_perf"), "").unwrap();
        let b = find_spdk(Some(&dir)).unwrap();
        assert_eq!(b.perf, dir.join("build/bin/spdk_nvme_perf"));
        assert!(find_spdk(Some(&dir.join("nowhere"))).unwrap_err().contains("not a directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn both_targets_serve_the_same_namespace() {
        let addr: SocketAddr = "127.0.0.1:4999".parse().unwrap();
        let v = spdk_config(addr, None);
        let bdev = &v["subsystems"][0]["config"][0]["params"];
        assert_eq!(bdev["num_blocks"].as_u64().unwrap() * bdev["block_size"].as_u64().unwrap(), 256 << 20);
        let listener = &v["subsystems"][1]["config"][3]["params"]["listen_address"];
        assert_eq!((listener["traddr"].as_str(), listener["trsvcid"].as_str()), (Some("127.0.0.1"), Some("4999")));
        let c = qpath_config(addr, Some(0), None);
        c.build_state().unwrap();
        let ns = &c.subsystems[0].namespaces[0];
        assert_eq!((ns.block_size, ns.prefault), (4096, true));
        assert_eq!(c.subsystems[0].nqn, NQN);
        assert_eq!((c.reactor.reactors, c.reactor.poll, c.reactor.cpus.clone()), (1, PollMode::Busy, vec![0]));
        // It goes to the child as TOML, which must read back.
        let text = target::persist::to_toml(&c).unwrap();
        assert!(text.contains("prefault = true") && text.contains("127.0.0.1:4999"), "{text}");
    }

    #[test]
    fn the_bench_job_matches_the_perf_run() {
        let plan = Plan {
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            rounds: 3,
            target_cpu: Some(0),
            client_cpu: Some(1),
            spdk: Err("none".into()),
            tgt_mem: SpdkMemory::Huge,
            perf_mem: SpdkMemory::Huge,
            tls_key: None,
            notes: vec![],
        };
        let text = bench_job(&WORKLOADS[3], &plan, "127.0.0.1:4420".parse().unwrap());
        let f = JobFile::parse(&text, "t").unwrap();
        assert_eq!(f.jobs.len(), 1);
        for want in
            ["rw=randwrite", "bs=4096", "iodepth=32", "cpus_allowed=1", "runtime=5000ms", "ramp_time=1000ms", "hipri"]
        {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(f.jobs[0].norandommap, "random offsets drawn without a map, as perf draws them: {text}");
        let seq = WORKLOADS.iter().find(|w| !w.pattern.random()).expect("a sequential workload");
        let f = JobFile::parse(&bench_job(seq, &plan, "127.0.0.1:4420".parse().unwrap()), "t").unwrap();
        assert!(!f.jobs[0].norandommap, "a sequential job keeps fio's default");
        assert!(text.contains(&format!("filename=nvme+tcp://127.0.0.1:4420/{NQN}/1\n")), "{text}");
        let key = tls::psk::ConfiguredPsk::generate(tls::psk::PskHash::Sha256).unwrap().to_interchange();
        let tls_plan = Plan { tls_key: Some(key.clone()), ..plan };
        let text = bench_job(&WORKLOADS[3], &tls_plan, "127.0.0.1:4420".parse().unwrap());
        let f = JobFile::parse(&text, "t").unwrap();
        assert_eq!(f.jobs.len(), 1);
        let uri = format!("/{NQN}/1?hostnqn={TLS_HOSTNQN}&tls_key={}&tls_identity=0\n", key.as_str());
        assert!(text.contains(&uri), "the job connects as the key's host, with the older identity");
    }

    /// With a key, both targets require TLS and admit only the lab's host with that key.
    #[test]
    fn tls_targets_require_the_channel_and_the_key() {
        let addr: SocketAddr = "127.0.0.1:4999".parse().unwrap();
        let v = spdk_config(addr, Some(Path::new("/d/tls.psk")));
        let nvmf = v["subsystems"][1]["config"].as_array().unwrap();
        assert_eq!(nvmf[1]["params"]["allow_any_host"], json!(false));
        assert_eq!(nvmf[3]["params"]["secure_channel"], json!(true));
        assert_eq!(nvmf[4]["method"], "nvmf_subsystem_add_host");
        assert_eq!(nvmf[4]["params"]["host"], TLS_HOSTNQN);
        assert_eq!(nvmf[4]["params"]["psk"], "/d/tls.psk");
        let key = tls::psk::ConfiguredPsk::generate(tls::psk::PskHash::Sha256).unwrap().to_interchange();
        let c = qpath_config(addr, Some(0), Some(key.as_str()));
        c.build_state().unwrap();
        assert_eq!(c.ports[0].tls, target::tls::TlsMode::Required);
        let sub = &c.subsystems[0];
        assert!(!sub.allow_any_host);
        assert_eq!(sub.hosts.len(), 1);
        assert_eq!(sub.hosts[0].nqn(), TLS_HOSTNQN);
        let text = target::persist::to_toml(&c).unwrap();
        assert!(text.contains("tls = \"required\"") && text.contains(key.as_str()), "the child reads its key back");
    }
}
