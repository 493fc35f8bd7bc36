//! The flap schedule and what "down" and "up" mean in each mode.
//!
//! ```text
//!   t:   0 ─── healthy ───┬─ path 0 down ─┬─ healthy ─┬─ path 1 down ─┬─ ... until the I/O ends
//!                         period - down    period       2 x period - down
//! ```
//!
//! The first outage starts one healthy interval (`period - down`) into the run, then one
//! starts every `period`, alternating between the two paths: each path must have come
//! back (reconnected, or optimized again) before the other one fails, or the I/O would
//! have no path left. While a path is down, the schedule thread watches the host's view
//! of it (a [`PathProbe`]) every 10 ms, to report how long the host took to notice the
//! outage and to use the path again.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::netns::Topology;
use bench::{Error, ErrorKind, Result};

/// How often the schedule thread samples the host's view of the paths.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Takes one of the two paths down and brings it back.
pub trait Flapper: Send {
    /// One line for the report: what a flap does.
    fn describe(&self) -> String;
    /// Path `path` (0 or 1) goes down.
    fn down(&mut self, path: usize) -> Result<()>;
    /// Path `path` comes back.
    fn up(&mut self, path: usize) -> Result<()>;
}

/// The host's view of a path: whether it would send I/O there now.
pub type PathProbe = Box<dyn Fn(usize) -> bool + Send + Sync>;

/// When outages happen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// One outage starts every `period`.
    pub period: Duration,
    /// Each lasts `down`.
    pub down: Duration,
}

impl Schedule {
    /// Start of outage `k` (0-based) after the run's start.
    pub fn down_at(&self, k: u32) -> Duration {
        self.period.saturating_sub(self.down) + self.period * k
    }

    /// The path outage `k` takes down.
    pub fn path(k: u32) -> usize {
        (k % 2) as usize
    }

    /// Outages that fit entirely in `runtime`.
    pub fn count_within(&self, runtime: Duration) -> u32 {
        let mut k = 0;
        while self.down_at(k) + self.down <= runtime && k < 100_000 {
            k += 1;
        }
        k
    }
}

/// One outage as it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct FlapRecord {
    /// Path taken down.
    pub path: usize,
    /// When, seconds since the run started.
    pub down_at_s: f64,
    /// When it was brought back.
    pub up_at_s: f64,
    /// How long after the flap the host stopped using the path, if it did while it was down.
    pub noticed_after_ms: Option<f64>,
    /// How long after the path came back the host used it again, if it did before the next flap.
    pub back_after_ms: Option<f64>,
    /// A `down` or `up` action that failed.
    pub error: Option<String>,
    /// The run ended during the outage or before the path was back in use: it says
    /// nothing about noticing or coming back (the run's end checks that both paths are).
    pub cut_short: bool,
}

impl FlapRecord {
    /// The record as JSON.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "path": self.path,
            "down_at_s": self.down_at_s,
            "up_at_s": self.up_at_s,
            "noticed_after_ms": self.noticed_after_ms,
            "back_after_ms": self.back_after_ms,
            "error": self.error,
            "cut_short": self.cut_short,
        })
    }
}

/// Runs the schedule from `t0` until `stop` is set (an outage in progress is ended at
/// once), then leaves both paths up. Returns every outage.
pub fn drive(
    flapper: &mut dyn Flapper,
    schedule: Schedule,
    t0: Instant,
    stop: &AtomicBool,
    probe: &PathProbe,
) -> Vec<FlapRecord> {
    let mut out: Vec<FlapRecord> = Vec::new();
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // Sleeps until `until` or `stop`, sampling the probe; returns when `want(path)` first
    // held (if it did) and whether `stop` ended the wait.
    let wait = |until: Instant, path: usize, want: bool| -> (Option<Instant>, bool) {
        let mut seen = None;
        loop {
            if stop.load(Ordering::Acquire) {
                return (seen, true);
            }
            let now = Instant::now();
            if seen.is_none() && probe(path) == want {
                seen = Some(now);
            }
            if now >= until {
                return (seen, false);
            }
            std::thread::sleep(PROBE_EVERY.min(until - now));
        }
    };
    let mut k = 0u32;
    loop {
        let path = Schedule::path(k);
        let (_, stopped) = wait(t0 + schedule.down_at(k), path, true);
        if stopped {
            break;
        }
        let down_at = Instant::now();
        let mut rec = FlapRecord {
            path,
            down_at_s: secs(down_at),
            up_at_s: 0.0,
            noticed_after_ms: None,
            back_after_ms: None,
            error: None,
            cut_short: false,
        };
        if let Err(e) = flapper.down(path) {
            rec.error = Some(format!("down: {e}"));
        }
        let (noticed, stopped) = wait(down_at + schedule.down, path, false);
        rec.noticed_after_ms = noticed.map(|t| ms(t - down_at));
        let up_at = Instant::now();
        if let Err(e) = flapper.up(path) {
            rec.error.get_or_insert(format!("up: {e}"));
        }
        rec.up_at_s = secs(up_at);
        rec.cut_short = stopped;
        out.push(rec);
        if stopped {
            break;
        }
        // Back: watched until the next outage starts (of the other path).
        let next = t0 + schedule.down_at(k + 1);
        let mut back = None;
        while back.is_none() && Instant::now() < next && !stop.load(Ordering::Acquire) {
            if probe(path) {
                back = Some(Instant::now());
            } else {
                std::thread::sleep(PROBE_EVERY);
            }
        }
        if let Some(last) = out.last_mut() {
            last.back_after_ms = back.map(|t| ms(t - up_at));
            last.cut_short = back.is_none() && stop.load(Ordering::Acquire);
        }
        k += 1;
    }
    out
}

/// `--mode link`: the path's veth link goes down (`ip link set port down` in the port's
/// namespace) and up again.
#[derive(Debug)]
pub struct LinkFlapper {
    /// The namespaces and links.
    pub topo: Arc<Topology>,
}

impl Flapper for LinkFlapper {
    fn describe(&self) -> String {
        "link loss: `ip link set down` on the target port's veth end, `up` after the outage".into()
    }

    fn down(&mut self, path: usize) -> Result<()> {
        self.topo.set_link(path, false)
    }

    fn up(&mut self, path: usize) -> Result<()> {
        self.topo.set_link(path, true)
    }
}

/// What an [`RpcFlapper`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcFault {
    /// `set_port_fault`: drop every connection and refuse new ones, then accept again.
    Connections,
    /// `set_ana_state`: the port's ANA group 1 becomes inaccessible, then optimized.
    Ana,
}

/// `--mode fault` and `--mode ana`: JSON-RPC calls to the target's control socket, as
/// `qpath rpc` makes them.
#[derive(Debug)]
pub struct RpcFlapper {
    /// The target's RPC socket.
    pub socket: PathBuf,
    /// Port id of each path.
    pub ports: [u16; 2],
    /// What to change.
    pub fault: RpcFault,
}

impl RpcFlapper {
    fn call(&self, method: &str, params: serde_json::Value) -> Result<()> {
        target::rpc::client_call(&self.socket, method, params)
            .map(|_| ())
            .map_err(|e| Error::new(ErrorKind::Target, format!("rpc {method}: {e}")))
    }
}

impl Flapper for RpcFlapper {
    fn describe(&self) -> String {
        match self.fault {
            RpcFault::Connections => "port fault by RPC: set_port_fault drop_connections=true refuse_connects=true, \
                                      then refuse_connects=false"
                .into(),
            RpcFault::Ana => "ANA flip by RPC: set_ana_state group=1 state=inaccessible, then optimized".into(),
        }
    }

    fn down(&mut self, path: usize) -> Result<()> {
        let port = self.ports[path];
        match self.fault {
            RpcFault::Connections => {
                self.call("set_port_fault", json!({"port": port, "refuse_connects": true, "drop_connections": true}))
            }
            RpcFault::Ana => self.call("set_ana_state", json!({"port": port, "group": 1, "state": "inaccessible"})),
        }
    }

    fn up(&mut self, path: usize) -> Result<()> {
        let port = self.ports[path];
        match self.fault {
            RpcFault::Connections => self.call("set_port_fault", json!({"port": port, "refuse_connects": false})),
            RpcFault::Ana => self.call("set_ana_state", json!({"port": port, "group": 1, "state": "optimized"})),
        }
    }
}

/// `--mode nvmet`: Linux nvmet in the vmlab guest. Each command is one TCP connection to
/// the guest's control port carrying `down N` or `up N` (N = 1 or 2, the nvmet port id);
/// the guest unlinks or relinks the subsystem in `ports/N/subsystems` (tests/vm/guest/
/// nvmet-flaps.sh). Then the flapper waits (at most 5 s) until the port refuses TCP
/// connections (down: nvmet closes a port's listener when its last subsystem is unlinked)
/// or accepts them again (up).
#[derive(Debug)]
pub struct NvmetFlapper {
    /// The guest's control address.
    pub control: SocketAddr,
    /// The two nvmet ports' addresses.
    pub ports: [SocketAddr; 2],
}

/// How long the nvmet flapper waits for a port to close or open.
const NVMET_SETTLE: Duration = Duration::from_secs(5);

impl NvmetFlapper {
    fn send(&self, line: &str) -> Result<()> {
        // The guest listens for one command at a time (busybox `nc -l` in a loop): between
        // two commands the port is closed for a moment, so connecting is retried.
        let deadline = Instant::now() + NVMET_SETTLE;
        let mut s = loop {
            match TcpStream::connect_timeout(&self.control, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::io(format!("connect to the guest's flap control {}", self.control), e));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        s.write_all(format!("{line}\n").as_bytes()).map_err(|e| Error::io("send a flap command", e))?;
        let _ = s.shutdown(std::net::Shutdown::Write);
        // The guest closes after acting; its reply (if any) is only logged.
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        tracing::debug!(line, reply = reply.trim(), "nvmet flap");
        Ok(())
    }

    fn settle(&self, path: usize, open: bool) -> Result<()> {
        let deadline = Instant::now() + NVMET_SETTLE;
        loop {
            let accepts = TcpStream::connect_timeout(&self.ports[path], Duration::from_millis(500)).is_ok();
            if accepts == open {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let what = if open { "accept connections again" } else { "stop accepting connections" };
                return Err(Error::new(
                    ErrorKind::Target,
                    format!("nvmet port {} did not {what} within {NVMET_SETTLE:?}", self.ports[path]),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Flapper for NvmetFlapper {
    fn describe(&self) -> String {
        "Linux nvmet: the subsystem's link in configfs ports/N/subsystems removed, then re-added".into()
    }

    fn down(&mut self, path: usize) -> Result<()> {
        self.send(&format!("down {}", path + 1))?;
        self.settle(path, false)
    }

    fn up(&mut self, path: usize) -> Result<()> {
        self.send(&format!("up {}", path + 1))?;
        self.settle(path, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn schedule_alternates_paths_after_a_healthy_start() {
        let s = Schedule { period: Duration::from_secs(10), down: Duration::from_secs(5) };
        assert_eq!(s.down_at(0), Duration::from_secs(5));
        assert_eq!(s.down_at(1), Duration::from_secs(15));
        assert_eq!((Schedule::path(0), Schedule::path(1), Schedule::path(2)), (0, 1, 0));
        assert_eq!(s.count_within(Duration::from_secs(120)), 12, "the issue's 2 minutes: 12 outages");
        assert_eq!(s.count_within(Duration::from_secs(9)), 0);
    }

    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl Flapper for Recorder {
        fn describe(&self) -> String {
            "records".into()
        }
        fn down(&mut self, path: usize) -> Result<()> {
            self.0.lock().unwrap().push(format!("down {path}"));
            Ok(())
        }
        fn up(&mut self, path: usize) -> Result<()> {
            self.0.lock().unwrap().push(format!("up {path}"));
            Ok(())
        }
    }

    #[test]
    fn drive_flaps_in_turn_and_times_what_the_probe_sees() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut f = Recorder(Arc::clone(&log));
        // The probe follows the recorder: a path is usable unless its last action was "down".
        let seen = Arc::clone(&log);
        let probe: PathProbe = Box::new(move |p| {
            let l = seen.lock().unwrap();
            l.iter().rev().find(|a| a.ends_with(&p.to_string())).is_none_or(|a| a.starts_with("up"))
        });
        let s = Schedule { period: Duration::from_millis(120), down: Duration::from_millis(60) };
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        let recs = std::thread::scope(|sc| {
            let h = sc.spawn(|| drive(&mut f, s, t0, &stop, &probe));
            std::thread::sleep(Duration::from_millis(400));
            stop.store(true, Ordering::Release);
            h.join().unwrap()
        });
        let l = log.lock().unwrap().clone();
        assert!(recs.len() >= 3, "{recs:?}");
        assert_eq!(&l[..4], ["down 0", "up 0", "down 1", "up 1"]);
        assert_eq!(l.len(), recs.len() * 2, "every outage was ended: {l:?}");
        for r in &recs[..2] {
            assert!(r.noticed_after_ms.is_some_and(|ms| ms < 30.0), "{r:?}");
            assert!(r.back_after_ms.is_some_and(|ms| ms < 30.0), "{r:?}");
            assert!((r.up_at_s - r.down_at_s - 0.06).abs() < 0.03, "{r:?}");
            assert!(r.error.is_none() && !r.cut_short, "{r:?}");
        }
    }
}
