//! Controllers shared by the job threads of one run: one connection per distinct remote
//! target, made by the first job thread that needs it.
//!
//! ```text
//!  JobFile ──plan──► per target: job threads, passthru threads, deepest iodepth
//!                      │
//!  job thread k: Controllers::get(remote) ──► Arc<Controller> (connect once, under a lock)
//!                      └─► Context::open attaches one I/O queue of its own
//! ```
//!
//! Every job thread attaches its own I/O queue, so a controller asks for at least as
//! many queues as job threads use it (`nr_io_queues = max(cpus, threads)`, counted over
//! the whole run so stonewalled batches never wait for a queue to come back), plus one
//! user queue per `qpath-passthru` thread. The queue size follows the deepest job
//! (`iodepth` clamped to 128..=1024): deeper jobs queue the rest in the host context.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use host::controller::{ConnectOptions, Controller};
use host::stats::HostStats;

use crate::error::{Error, ErrorKind, Result};
use crate::filename::{RemoteTarget, TargetKind};
use crate::job::{JobFile, JobSpec};

/// Linux's default I/O queue size (REFERENCE: "queue size: host 128").
pub const QUEUE_SIZE_MIN: u16 = 128;
/// Our target's largest queue (its `max_queue_entries`).
pub const QUEUE_SIZE_MAX: u16 = 1024;
/// Most commands all of a controller's queues may have outstanding, when jobs are
/// deeper than [`QUEUE_SIZE_MIN`] (4 queues of 1024, 32 of 128).
pub const OUTSTANDING_MAX: u32 = 4096;
/// Most I/O queues one controller is asked for (the target's per-controller cap).
pub const IO_QUEUES_MAX: u16 = 128;
/// A bench job's `fast_io_fail_tmo` unless its URI or options say otherwise: I/O that
/// waits for a lost controller to come back fails after this long, so a job whose target
/// went away ends about this long after, with an error that names the target. (`nvme
/// connect` has it off and Linux's `ctrl_loss_tmo` is 600 s: a job would wait for the
/// runner's stall timeout instead.) A URI that asks for reconnects (`reconnect_delay`,
/// `ctrl_loss_tmo`) keeps Linux's default, off: its I/O waits for the reconnect it asked for.
pub const DEFAULT_FAST_IO_FAIL_TMO: Duration = Duration::from_secs(5);

/// What distinguishes two controllers: where, which subsystem, as whom, with which digests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ControllerKey {
    /// `traddr:trsvcid` as written (resolved at connect time).
    pub addr: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN (`None` = the machine's default identity).
    pub hostnqn: Option<String>,
    /// Header digest.
    pub hdgst: bool,
    /// Data digest.
    pub ddgst: bool,
    /// `reconnect_delay=SECS` from the URI (`nvme connect -c`), checked at connect.
    pub reconnect_delay: Option<String>,
    /// `ctrl_loss_tmo=SECS` from the URI (`nvme connect -l`; -1 = forever), checked at connect.
    pub ctrl_loss_tmo: Option<String>,
    /// `fast_io_fail_tmo=SECS` from the URI or the job option (`nvme connect
    /// --fast_io_fail_tmo`; -1 = off), checked at connect; `None`: see [`fast_io_fail_tmo`].
    pub fast_io_fail_tmo: Option<String>,
    /// `keep_alive_tmo=SECS` from the URI (`nvme connect -k`; default 5), checked at connect.
    pub keep_alive_tmo: Option<String>,
    /// `tcp_congestion=NAME` from the URI: the connections' TCP congestion control.
    pub tcp_congestion: Option<String>,
    /// `dhchap_secret=DHHC-1:..` from the URI (`nvme connect --dhchap-secret`).
    pub dhchap_secret: Option<Secret>,
    /// `dhchap_ctrl_secret=DHHC-1:..` from the URI (`--dhchap-ctrl-secret`).
    pub dhchap_ctrl_secret: Option<Secret>,
    /// `tls_key=NVMeTLSkey-1:..` from the URI (`nvme connect --tls --tls-key`): every
    /// queue runs inside TLS 1.3.
    pub tls_key: Option<Secret>,
    /// `concat=1` from the URI (`nvme connect --concat`): secure channel concatenation,
    /// the TLS key made by the admin queue's DH-HMAC-CHAP transaction (needs `dhchap_secret`).
    pub concat: Option<String>,
    /// `tls_offload=auto|off` from the URI: kernel TLS for those queues where the kernel
    /// offers it (default auto), or records in user space.
    pub tls_offload: Option<String>,
    /// `tls_identity=0|1` from the URI: the PSK identity to present, 1 (with the PSK's
    /// digest, the default) or 0 (what Linux hosts before 6.14 and SPDK 24.01 present).
    pub tls_identity: Option<String>,
}

/// A DH-HMAC-CHAP secret from a URI: compared as written, never printed.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl ControllerKey {
    /// The key of a job's remote target; the `hostnqn` engine option applies when the
    /// filename does not name one.
    pub fn of(remote: &RemoteTarget, job: Option<&JobSpec>) -> ControllerKey {
        let hostnqn = remote
            .hostnqn
            .clone()
            .or_else(|| job.and_then(|j| j.engine_option("hostnqn").flatten()).map(str::to_string));
        let host = if remote.traddr.contains(':') { format!("[{}]", remote.traddr) } else { remote.traddr.clone() };
        ControllerKey {
            addr: format!("{host}:{}", remote.trsvcid),
            subnqn: remote.subnqn.clone(),
            hostnqn,
            hdgst: remote.hdgst || digest_option(job, "header"),
            ddgst: remote.ddgst || digest_option(job, "data"),
            reconnect_delay: uri_option(remote, "reconnect_delay"),
            ctrl_loss_tmo: uri_option(remote, "ctrl_loss_tmo"),
            fast_io_fail_tmo: uri_option(remote, "fast_io_fail_tmo")
                .or_else(|| job.and_then(|j| j.engine_option("fast_io_fail_tmo").flatten()).map(str::to_string)),
            keep_alive_tmo: uri_option(remote, "keep_alive_tmo"),
            tcp_congestion: uri_option(remote, "tcp_congestion"),
            dhchap_secret: uri_option(remote, "dhchap_secret").map(Secret),
            dhchap_ctrl_secret: uri_option(remote, "dhchap_ctrl_secret").map(Secret),
            tls_key: uri_option(remote, "tls_key").map(Secret),
            concat: uri_option(remote, "concat"),
            tls_offload: uri_option(remote, "tls_offload"),
            tls_identity: uri_option(remote, "tls_identity"),
        }
    }
}

/// The last `key=value` of the filename's extra options.
fn uri_option(remote: &RemoteTarget, key: &str) -> Option<String> {
    remote.extra.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// The `fast_io_fail_tmo` a controller of `key` gets: the URI's or the job's, else
/// [`DEFAULT_FAST_IO_FAIL_TMO`] unless the URI asks for reconnects (then off, as Linux).
/// `None` = off.
pub fn fast_io_fail_tmo(key: &ControllerKey) -> Result<Option<Duration>> {
    match &key.fast_io_fail_tmo {
        Some(v) => parse_secs("fast_io_fail_tmo", v, true),
        None if key.reconnect_delay.is_some() || key.ctrl_loss_tmo.is_some() => Ok(None),
        None => Ok(Some(DEFAULT_FAST_IO_FAIL_TMO)),
    }
}

/// The keep-alive timeout a controller of `key` asks for, ms (`None`: the default). 0 turns
/// keep-alive off, as `nvme connect -k 0` does, and with it the part of a write's failover
/// hold that waits for the target to notice a lost connection.
pub fn kato_ms(key: &ControllerKey) -> Result<Option<u32>> {
    let Some(v) = &key.keep_alive_tmo else { return Ok(None) };
    let kato = parse_secs("keep_alive_tmo", v, false)?.unwrap_or_default();
    Ok(Some(u32::try_from(kato.as_millis()).unwrap_or(u32::MAX)))
}

/// Checks a `fast_io_fail_tmo` job option (seconds, or -1 = off) when the job file is read.
pub fn check_fast_io_fail_tmo(value: Option<&str>) -> std::result::Result<(), String> {
    let v = value.ok_or("needs a value: seconds, or -1 for off")?;
    parse_secs("fast_io_fail_tmo", v, true).map(drop).map_err(|e| e.context)
}

/// Seconds as `nvme connect` takes them (`-1` only where `forever` is allowed).
fn parse_secs(key: &str, value: &str, forever: bool) -> Result<Option<Duration>> {
    match value.parse::<i64>() {
        Ok(-1) if forever => Ok(None),
        Ok(s) if (0..=86_400).contains(&s) => Ok(Some(Duration::from_secs(s.unsigned_abs()))),
        _ => Err(Error::new(
            ErrorKind::Target,
            format!("{key}={value}: expected seconds 0..=86400{}", if forever { " or -1" } else { "" }),
        )),
    }
}

/// SPDK's fio plugin spells digests `digest_enable=HEADER|DATA|BOTH`.
fn digest_option(job: Option<&JobSpec>, which: &str) -> bool {
    let Some(v) = job.and_then(|j| j.engine_option("digest_enable").flatten()) else { return false };
    let v = v.to_ascii_lowercase();
    v == which || v == "both"
}

/// How to connect one controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectPlan {
    /// Block-core I/O queues (0 = one per CPU).
    pub nr_io_queues: u16,
    /// User queues for `qpath-passthru` threads.
    pub nr_user_queues: u16,
    /// Entries per queue.
    pub queue_size: u16,
}

impl Default for ConnectPlan {
    fn default() -> Self {
        ConnectPlan { nr_io_queues: 0, nr_user_queues: 0, queue_size: QUEUE_SIZE_MIN }
    }
}

/// Whether a job goes through a user queue (`qpath-passthru`) rather than the block core.
pub fn wants_passthru(job: &JobSpec) -> bool {
    matches!(job.ioengine.as_deref(), Some("io_uring_cmd" | "qpath-passthru"))
}

/// Entries per queue for jobs as deep as `depth` over `queues` queues: the deepest
/// job's iodepth within 128..=1024, but no more than [`OUTSTANDING_MAX`] commands over
/// all queues (what one target reactor is asked to hold at once; deeper jobs queue
/// the rest in the host context, as Linux queues beyond its 128 tags in blk-mq).
pub fn queue_size_for(depth: u32, queues: u16) -> u16 {
    let fair = OUTSTANDING_MAX / u32::from(queues.max(1));
    let size = depth.min(fair).clamp(u32::from(QUEUE_SIZE_MIN), u32::from(QUEUE_SIZE_MAX));
    u16::try_from(size).unwrap_or(QUEUE_SIZE_MIN)
}

/// One plan per remote target of `file`.
pub fn plan(file: &JobFile) -> BTreeMap<ControllerKey, ConnectPlan> {
    let cpus = u16::try_from(uring::online_cpus()).unwrap_or(1);
    let mut out: BTreeMap<ControllerKey, (u16, u16, u32)> = BTreeMap::new();
    for j in &file.jobs {
        let TargetKind::Remote(r) = &j.target.kind else { continue };
        // A multipath job attaches a queue of every path's controller.
        for path in r.paths() {
            let e = out.entry(ControllerKey::of(&path, Some(j))).or_insert((0, 0, 0));
            if wants_passthru(j) {
                e.1 = e.1.saturating_add(1);
            } else {
                e.0 = e.0.saturating_add(1);
            }
            e.2 = e.2.max(j.iodepth);
        }
    }
    out.into_iter()
        .map(|(k, (threads, user, depth))| {
            let queue_size = queue_size_for(depth, threads + user);
            // Block queues leave room for the user queues under the per-controller cap.
            let nr_io_queues = threads.max(cpus).min(IO_QUEUES_MAX.saturating_sub(user).max(1));
            (k, ConnectPlan { nr_io_queues, nr_user_queues: user, queue_size })
        })
        .collect()
}

/// Whether a first connect that failed with `kind`, `elapsed` after the first attempt,
/// is tried again after `opts.reconnect_delay`: while `ctrl_loss_tmo` lasts (`None`:
/// forever), and only for what a later attempt can fix (a socket error, a timeout, a
/// connection closed in the handshake), not for a refusal (a status, bad options).
fn retry_first_connect(kind: host::error::ErrorKind, elapsed: Duration, opts: &ConnectOptions) -> bool {
    use host::error::ErrorKind as K;
    matches!(kind, K::Io | K::Timeout | K::Protocol | K::Busy)
        && opts.ctrl_loss_tmo.is_none_or(|tmo| elapsed + opts.reconnect_delay <= tmo)
}

/// The controllers of one run, connected on first use.
#[derive(Default)]
pub struct Controllers {
    plans: BTreeMap<ControllerKey, ConnectPlan>,
    live: Mutex<BTreeMap<ControllerKey, Arc<Controller>>>,
    /// Where the run's controllers and `qpath` engine contexts publish their statistics.
    stats: Arc<HostStats>,
    /// TCP congestion control for targets whose URI does not name one (`None` = the system's).
    tcp_congestion: Option<String>,
}

impl std::fmt::Debug for Controllers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controllers").field("plans", &self.plans).finish_non_exhaustive()
    }
}

impl Controllers {
    /// Controllers for the jobs of `file` (nothing connects yet).
    pub fn for_jobs(file: &JobFile) -> Controllers {
        Controllers {
            plans: plan(file),
            live: Mutex::new(BTreeMap::new()),
            stats: HostStats::new(),
            tcp_congestion: None,
        }
    }

    /// Connections use this TCP congestion control unless a target's URI names one
    /// (`qpath bench --tcp-congestion`).
    #[must_use]
    pub fn with_tcp_congestion(mut self, name: Option<&str>) -> Controllers {
        self.tcp_congestion = name.map(str::to_string);
        self
    }

    /// The plan for `key` (defaults for targets the job file did not name).
    pub fn plan_for(&self, key: &ControllerKey) -> ConnectPlan {
        self.plans.get(key).copied().unwrap_or_default()
    }

    /// The controller for a job's remote target, connecting it on first use. Job
    /// threads that need the same one wait for that connect instead of making their own.
    pub fn get(&self, remote: &RemoteTarget, job: Option<&JobSpec>) -> Result<Arc<Controller>> {
        let key = ControllerKey::of(remote, job);
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = live.get(&key) {
            return Ok(Arc::clone(c));
        }
        let opts = self.connect_options(&key)?;
        // A URI that asks for reconnects (reconnect_delay or ctrl_loss_tmo) gets them from
        // the first connect on: a target restarting, or dropping connections, while the job
        // starts is the same fault as one during the job. Without them a failed first
        // connect fails the job at once, as `nvme connect` does.
        let retry = key.reconnect_delay.is_some() || key.ctrl_loss_tmo.is_some();
        let started = Instant::now();
        let ctrl = loop {
            match Controller::connect(opts.clone()) {
                Ok(c) => break c,
                Err(e) if retry && retry_first_connect(e.kind, started.elapsed(), &opts) => {
                    tracing::warn!(addr = %key.addr, subnqn = %key.subnqn, "first connect failed, retrying in {:?}: {e}", opts.reconnect_delay);
                    std::thread::sleep(opts.reconnect_delay);
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Engine,
                        format!("connect to {} ({}): {e}", key.addr, key.subnqn),
                    ));
                }
            }
        };
        live.insert(key, Arc::clone(&ctrl));
        self.stats.controller_number(&ctrl);
        Ok(ctrl)
    }

    fn connect_options(&self, key: &ControllerKey) -> Result<ConnectOptions> {
        let addr: SocketAddr = key
            .addr
            .to_socket_addrs()
            .map_err(|e| Error::new(ErrorKind::Target, format!("{}: {e}", key.addr)))?
            .next()
            .ok_or_else(|| Error::new(ErrorKind::Target, format!("{} resolves to no address", key.addr)))?;
        let plan = self.plan_for(key);
        let mut o = ConnectOptions::new(addr, &key.subnqn);
        if let Some(h) = &key.hostnqn {
            o.hostnqn.clone_from(h);
        }
        o.hdr_digest = key.hdgst;
        o.data_digest = key.ddgst;
        if let Some(v) = &key.reconnect_delay {
            o.reconnect_delay = parse_secs("reconnect_delay", v, false)?.unwrap_or_default();
        }
        if let Some(v) = &key.ctrl_loss_tmo {
            o.ctrl_loss_tmo = parse_secs("ctrl_loss_tmo", v, true)?;
        }
        o.fast_io_fail_tmo = fast_io_fail_tmo(key)?;
        if let Some(ms) = kato_ms(key)? {
            o.kato_ms = ms;
        }
        o.tcp_congestion = key.tcp_congestion.clone().or_else(|| self.tcp_congestion.clone());
        o.dhchap_secret = key.dhchap_secret.as_ref().map(|s| s.0.clone());
        o.dhchap_ctrl_secret = key.dhchap_ctrl_secret.as_ref().map(|s| s.0.clone());
        o.tls = match &key.tls_key {
            Some(k) => {
                let mut t = host::tls::HostTls::parse(&k.0)
                    .map_err(|e| Error::new(ErrorKind::Target, format!("{}: tls_key: {e}", key.addr)))?;
                t.identity = match key.tls_identity.as_deref() {
                    None | Some("1") => host::tls::IdentityVersion::V1,
                    Some("0") => host::tls::IdentityVersion::V0,
                    Some(v) => {
                        return Err(Error::new(
                            ErrorKind::Target,
                            format!("{}: tls_identity={v}: 1 (with the key's digest) or 0 (without)", key.addr),
                        ));
                    }
                };
                Some(t)
            }
            None if key.tls_identity.is_some() => {
                return Err(Error::new(ErrorKind::Target, format!("{}: tls_identity needs tls_key", key.addr)));
            }
            None => None,
        };
        o.concat = match key.concat.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("0" | "false" | "no" | "off") => false,
            Some("1" | "true" | "yes" | "on") => true,
            Some(v) => {
                return Err(Error::new(
                    ErrorKind::Target,
                    format!("{}: concat={v} is not a boolean (1 or 0)", key.addr),
                ));
            }
        };
        if let Some(v) = &key.tls_offload {
            o.tls_offload = host::tls::TlsOffload::parse(v)
                .ok_or_else(|| Error::new(ErrorKind::Target, format!("{}: tls_offload={v}: auto or off", key.addr)))?;
        }
        o.nr_io_queues = plan.nr_io_queues;
        o.nr_user_queues = plan.nr_user_queues;
        o.queue_size = plan.queue_size;
        Ok(o)
    }

    /// The run's host statistics (`qpath bench --rpc-socket/--metrics` serve them).
    pub fn stats(&self) -> &Arc<HostStats> {
        &self.stats
    }

    /// Controllers connected so far, with their keys.
    pub fn connected(&self) -> Vec<(ControllerKey, Arc<Controller>)> {
        let live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        live.iter().map(|(k, c)| (k.clone(), Arc::clone(c))).collect()
    }

    /// Disconnect every controller (after the run, before an embedded target stops).
    pub fn disconnect_all(&self) {
        let all = std::mem::take(&mut *self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for c in all.into_values() {
            c.delete();
        }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.disconnect_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plan_per_target_with_a_queue_per_thread() {
        let f = JobFile::parse(
            "[global]\nsize=1m\n\
             [a]\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1\nnumjobs=33\niodepth=10000\n\
             [b]\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/2\niodepth=3\n\
             [c]\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1\nioengine=io_uring_cmd\niodepth=128\n\
             [d]\nfilename=trtype=TCP traddr=127.0.0.1 trsvcid=4421 subnqn=nqn.x:a ns=1\n\
             [e]\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1?hdgst=1\n",
            "t",
        )
        .unwrap();
        let p = plan(&f);
        assert_eq!(p.len(), 3, "{p:?}");
        let k = ControllerKey {
            addr: "127.0.0.1:4420".into(),
            subnqn: "nqn.x:a".into(),
            hostnqn: None,
            hdgst: false,
            ddgst: false,
            reconnect_delay: None,
            ctrl_loss_tmo: None,
            fast_io_fail_tmo: None,
            keep_alive_tmo: None,
            tcp_congestion: None,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls_key: None,
            concat: None,
            tls_offload: None,
            tls_identity: None,
        };
        let a = p[&k];
        assert_eq!(a.nr_io_queues, 34, "33 hogs and the WAL writer share one controller");
        assert_eq!(a.nr_user_queues, 1);
        assert_eq!(a.queue_size, QUEUE_SIZE_MIN, "35 queues share 4096 outstanding commands");
        let d = ControllerKey { addr: "127.0.0.1:4421".into(), ..k.clone() };
        assert_eq!(p[&d].queue_size, QUEUE_SIZE_MIN);
        assert!(p[&d].nr_io_queues >= 1);
        assert!(p.contains_key(&ControllerKey { hdgst: true, ..k }));
    }

    #[test]
    fn keep_alive_tmo_from_the_uri() {
        let key = |q: &str| {
            let f = JobFile::parse(&format!("[a]\nsize=1m\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}\n"), "t")
                .unwrap();
            plan(&f).into_keys().next().unwrap()
        };
        assert_eq!(kato_ms(&key("")).unwrap(), None, "the controller's default");
        assert_eq!(kato_ms(&key("?keep_alive_tmo=2")).unwrap(), Some(2_000));
        assert_eq!(kato_ms(&key("?keep_alive_tmo=0")).unwrap(), Some(0), "off, as nvme connect -k 0");
        for bad in ["?keep_alive_tmo=-1", "?keep_alive_tmo=soon", "?keep_alive_tmo=100000"] {
            let e = kato_ms(&key(bad)).unwrap_err().to_string();
            assert!(e.contains("keep_alive_tmo"), "{bad}: {e}");
        }
    }

    #[test]
    fn uri_secrets_reach_the_connect_and_never_a_log() {
        let secret = "DHHC-1:01:ZmFrZS1zZWNy+XQtb2Yt/GhpcnR5LXR3by1ieXRlcyEhIQ==:";
        let f = JobFile::parse(
            &format!("[a]\nsize=1m\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1?dhchap_secret={secret}\n"),
            "t",
        )
        .unwrap();
        let p = plan(&f);
        let k = p.keys().next().unwrap();
        assert_eq!(k.dhchap_secret.as_ref().map(|s| s.0.as_str()), Some(secret), "the whole secret: '+', '/', '='");
        assert!(k.dhchap_ctrl_secret.is_none());
        assert!(!format!("{k:?}").contains("ZmFrZS"), "{k:?}");
    }

    #[test]
    fn multipath_jobs_plan_a_queue_on_every_path() {
        let f = JobFile::parse(
            "[a]\nsize=1m\nnumjobs=2\nfilename=nvme+tcp://127.0.0.1:4420,127.0.0.1:4421/nqn.x:a/1\n",
            "t",
        )
        .unwrap();
        let p = plan(&f);
        assert_eq!(p.len(), 2, "{p:?}");
        for (k, c) in &p {
            assert!(c.nr_io_queues >= 2, "{k:?}: one queue per job thread on each path");
        }
    }

    #[test]
    fn reconnect_options_in_the_uri_reach_the_controller() {
        let c = Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap());
        let key = |q: &str| {
            let t = RemoteTarget::parse_uri(&format!("nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}")).unwrap();
            ControllerKey::of(&t, None)
        };
        let o = c.connect_options(&key("?reconnect_delay=1&ctrl_loss_tmo=30")).unwrap();
        assert_eq!(o.reconnect_delay, Duration::from_secs(1));
        assert_eq!(o.ctrl_loss_tmo, Some(Duration::from_secs(30)));
        let o = c.connect_options(&key("?ctrl_loss_tmo=-1")).unwrap();
        assert_eq!(o.ctrl_loss_tmo, None, "-1: retry forever, as nvme connect -l -1");
        let d = c.connect_options(&key("")).unwrap();
        assert_eq!(d.reconnect_delay, Duration::from_secs(10), "Linux's default");
        assert_eq!(d.ctrl_loss_tmo, Some(Duration::from_secs(600)));
        for bad in ["?reconnect_delay=-1", "?reconnect_delay=soon", "?ctrl_loss_tmo=-2", "?ctrl_loss_tmo=99999999"] {
            assert!(c.connect_options(&key(bad)).is_err(), "{bad}");
        }
        assert_ne!(key("?reconnect_delay=1"), key(""), "different reconnect options: different controllers");
    }

    #[test]
    fn fast_io_fail_tmo_defaults_to_a_prompt_end_unless_reconnects_are_asked_for() {
        let c = Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap());
        let key = |q: &str| {
            let t = RemoteTarget::parse_uri(&format!("nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}")).unwrap();
            ControllerKey::of(&t, None)
        };
        assert_eq!(c.connect_options(&key("")).unwrap().fast_io_fail_tmo, Some(DEFAULT_FAST_IO_FAIL_TMO));
        assert_eq!(
            c.connect_options(&key("?fast_io_fail_tmo=2")).unwrap().fast_io_fail_tmo,
            Some(Duration::from_secs(2))
        );
        assert_eq!(c.connect_options(&key("?fast_io_fail_tmo=-1")).unwrap().fast_io_fail_tmo, None, "-1: off");
        assert_eq!(c.connect_options(&key("?ctrl_loss_tmo=60")).unwrap().fast_io_fail_tmo, None, "waits as asked");
        assert_eq!(
            c.connect_options(&key("?ctrl_loss_tmo=60&fast_io_fail_tmo=3")).unwrap().fast_io_fail_tmo,
            Some(Duration::from_secs(3))
        );
        assert!(c.connect_options(&key("?fast_io_fail_tmo=soon")).is_err());
        // The job option, when the URI says nothing; the URI wins.
        let f = JobFile::parse(
            "[a]\nsize=1m\nfast_io_fail_tmo=7\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1\n\
             [b]\nsize=1m\nfast_io_fail_tmo=7\nfilename=nvme+tcp://127.0.0.1:4420/nqn.x:a/1?fast_io_fail_tmo=1\n",
            "t",
        )
        .unwrap();
        let tmo = |i: usize| {
            let TargetKind::Remote(r) = &f.jobs[i].target.kind else { panic!() };
            fast_io_fail_tmo(&ControllerKey::of(r, Some(&f.jobs[i]))).unwrap()
        };
        assert_eq!(tmo(0), Some(Duration::from_secs(7)));
        assert_eq!(tmo(1), Some(Duration::from_secs(1)));
        assert!(JobFile::parse("[a]\nsize=1m\nfast_io_fail_tmo=later\n", "t").is_err(), "checked when read");
    }

    #[test]
    fn a_first_connect_is_retried_for_faults_a_retry_can_fix_while_ctrl_loss_tmo_lasts() {
        use host::error::ErrorKind as K;
        let mut o = ConnectOptions::new("127.0.0.1:4420".parse().unwrap(), "nqn.x:a");
        o.reconnect_delay = Duration::from_secs(1);
        o.ctrl_loss_tmo = Some(Duration::from_secs(10));
        let s = Duration::from_secs;
        for k in [K::Io, K::Timeout, K::Protocol, K::Busy] {
            assert!(retry_first_connect(k, s(0), &o), "{k:?}");
            assert!(retry_first_connect(k, s(9), &o), "{k:?}: 9 s + 1 s is still within 10 s");
            assert!(!retry_first_connect(k, Duration::from_millis(9_001), &o), "{k:?}: past ctrl_loss_tmo");
        }
        for k in [K::Status, K::Invalid, K::Gone] {
            assert!(!retry_first_connect(k, s(0), &o), "{k:?}: a refusal is not retried");
        }
        o.ctrl_loss_tmo = None;
        assert!(retry_first_connect(K::Io, s(86_400), &o), "ctrl_loss_tmo=-1: forever");
    }

    #[test]
    fn tcp_congestion_from_the_uri_or_the_run() {
        let key = |q: &str| {
            let t = RemoteTarget::parse_uri(&format!("nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}")).unwrap();
            ControllerKey::of(&t, None)
        };
        let plain = Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap());
        assert_eq!(plain.connect_options(&key("")).unwrap().tcp_congestion, None, "the system's");
        let o = plain.connect_options(&key("?tcp_congestion=reno")).unwrap();
        assert_eq!(o.tcp_congestion.as_deref(), Some("reno"));
        let run =
            Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap()).with_tcp_congestion(Some("cubic"));
        assert_eq!(run.connect_options(&key("")).unwrap().tcp_congestion.as_deref(), Some("cubic"));
        let o = run.connect_options(&key("?tcp_congestion=reno")).unwrap();
        assert_eq!(o.tcp_congestion.as_deref(), Some("reno"), "the URI wins");
    }

    #[test]
    fn concat_from_the_uri() {
        let key = |q: &str| {
            let t = RemoteTarget::parse_uri(&format!("nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}")).unwrap();
            ControllerKey::of(&t, None)
        };
        let c = Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap());
        assert!(!c.connect_options(&key("")).unwrap().concat);
        assert!(c.connect_options(&key("?concat=1&dhchap_secret=DHHC-1:00:x:")).unwrap().concat);
        assert!(c.connect_options(&key("?concat")).unwrap().concat, "a bare key is 1");
        assert!(!c.connect_options(&key("?concat=0")).unwrap().concat);
        let e = c.connect_options(&key("?concat=maybe")).unwrap_err().to_string();
        assert!(e.contains("concat=maybe is not a boolean"), "{e}");
        assert_ne!(key("?concat=1"), key(""), "a concatenating controller is another controller");
    }

    #[test]
    fn tls_identity_from_the_uri() {
        let key = |q: &str| {
            let t = RemoteTarget::parse_uri(&format!("nvme+tcp://127.0.0.1:4420/nqn.x:a/1{q}")).unwrap();
            ControllerKey::of(&t, None)
        };
        let c = Controllers::for_jobs(&JobFile::parse("[a]\nsize=1m\n", "t").unwrap());
        let k = "tls_key=NVMeTLSkey-1:01:cXBhdGgtdGxzLWJlbmNobWFyay1rZXktbm90LXNlY3LHGjqK:";
        let version = |q: &str| c.connect_options(&key(q)).map(|o| o.tls.map(|t| t.identity));
        use host::tls::IdentityVersion as V;
        assert_eq!(version(&format!("?{k}")).unwrap(), Some(V::V1), "1 by default");
        assert_eq!(version(&format!("?{k}&tls_identity=1")).unwrap(), Some(V::V1));
        assert_eq!(version(&format!("?{k}&tls_identity=0")).unwrap(), Some(V::V0));
        let e = version(&format!("?{k}&tls_identity=2")).unwrap_err().to_string();
        assert!(e.contains("tls_identity=2: 1 (with the key's digest) or 0"), "{e}");
        let e = version("?tls_identity=0").unwrap_err().to_string();
        assert!(e.contains("tls_identity needs tls_key"), "{e}");
        assert_ne!(key(&format!("?{k}&tls_identity=0")), key(&format!("?{k}")), "another identity, another controller");
    }

    #[test]
    fn queue_sizes_follow_depth_within_bounds() {
        assert_eq!(queue_size_for(1, 1), QUEUE_SIZE_MIN);
        assert_eq!(queue_size_for(512, 2), 512);
        assert_eq!(queue_size_for(10_000, 1), QUEUE_SIZE_MAX);
        assert_eq!(queue_size_for(10_000, 8), 512);
        assert_eq!(queue_size_for(10_000, 64), QUEUE_SIZE_MIN);
    }

    #[test]
    fn hostnqn_and_digests_from_engine_options() {
        let f = JobFile::parse(
            "[a]\nsize=1m\nfilename=nvme+tcp://[::1]/nqn.x:a/1\nhostnqn=nqn.h\ndigest_enable=BOTH\n",
            "t",
        )
        .unwrap();
        let TargetKind::Remote(r) = &f.jobs[0].target.kind else { panic!() };
        let k = ControllerKey::of(r, Some(&f.jobs[0]));
        assert_eq!(k.addr, "[::1]:4420");
        assert_eq!(k.hostnqn.as_deref(), Some("nqn.h"));
        assert!(k.hdgst && k.ddgst);
    }
}
