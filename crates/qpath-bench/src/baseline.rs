//! The physical baseline: what plain loopback TCP does on this machine with the same
//! thread placement as the stack, so every result comes with its ratio.
//!
//! ```text
//!   server thread (pinned where the target reactor runs)     client thread (pinned where the job runs)
//!   ping-pong:  read 72 B  ──────────────────────────────────  write 72 B     (a CapsuleCmd PDU)
//!               write 4,144 B ───────────────────────────────► read 4,144 B   (C2HData 24 + 4 KiB + CapsuleResp 24)
//!   stream:     write 128 KiB, 128 KiB, ... ─────────────────► read           (the direction of a read)
//! ```
//!
//! Plain `std::net` sockets, one connection, `TCP_NODELAY` as the stack sets it. Each
//! side waits the way its counterpart in the stack does: [`WaitMode::Busy`] spins on
//! non-blocking `read`/`write` (a busy-polling reactor or host), [`WaitMode::Block`]
//! sleeps in blocking calls. The ping-pong measures each round trip (a ~1 s run is
//! ~70,000 of them); the stream counts bytes the client received over ~1 s after a
//! short warm-up. Nothing here is tuned beyond what the stack does: no socket buffer
//! sizes, no busy-poll socket options.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::stats::LatHist;

/// A 4 KiB read's request on the wire: one CapsuleCmd PDU (8-byte header + 64-byte SQE).
pub const REQUEST_BYTES: usize = 72;
/// A 4 KiB read's reply: C2HData header (24) + 4,096 bytes + CapsuleResp (24).
pub const REPLY_BYTES: usize = 4144;
/// Size of each write of the bandwidth stream (a 128 KiB read's data).
pub const STREAM_WRITE_BYTES: usize = 128 * 1024;
/// Round trips before the ping-pong starts measuring.
const WARMUP_ROUND_TRIPS: u64 = 2_000;
/// Streaming before the bandwidth is measured.
const STREAM_WARMUP: Duration = Duration::from_millis(100);
/// A side that makes no progress for this long gives up (the peer died).
const STALL: Duration = Duration::from_secs(5);

/// How one side of a baseline waits for the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin on non-blocking calls (a busy-polling reactor or host thread).
    Busy,
    /// Sleep in blocking calls (a reactor that blocks when idle).
    Block,
}

impl WaitMode {
    /// `busy` or `block`.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Busy => "busy",
            WaitMode::Block => "block",
        }
    }
}

/// Where and how the two sides run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// CPU of the server side (where the target reactor runs); `None` = not pinned.
    pub server_cpu: Option<usize>,
    /// CPU of the client side (where the job thread runs); `None` = not pinned.
    pub client_cpu: Option<usize>,
    /// How the server waits.
    pub server_wait: WaitMode,
    /// How the client waits.
    pub client_wait: WaitMode,
}

impl Default for Placement {
    /// The embedded target's placement on a machine with more than one CPU: the
    /// reactor on CPU 0, the job on CPU 1, both polling.
    fn default() -> Self {
        let multi = uring::online_cpus() > 1;
        Placement {
            server_cpu: multi.then_some(0),
            client_cpu: multi.then_some(1),
            server_wait: WaitMode::Busy,
            client_wait: WaitMode::Busy,
        }
    }
}

/// What to measure and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaselineOptions {
    /// Thread placement and waiting.
    pub placement: Placement,
    /// How long the ping-pong measures (it also stops at `round_trips_max`).
    pub ping_pong_time: Duration,
    /// Most measured round trips.
    pub round_trips_max: u64,
    /// How long the stream measures.
    pub stream_time: Duration,
    /// TCP congestion control of both sockets, by its kernel name (`None` = the system's):
    /// the same as the stack's connections, so the ratio compares like with like.
    pub tcp_congestion: Option<&'static str>,
}

impl Default for BaselineOptions {
    fn default() -> Self {
        BaselineOptions {
            placement: Placement::default(),
            ping_pong_time: Duration::from_secs(1),
            round_trips_max: 5_000_000,
            stream_time: Duration::from_secs(1),
            tcp_congestion: None,
        }
    }
}

/// Round-trip latency of a 4 KiB read's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPong {
    /// Measured round trips.
    pub round_trips: u64,
    /// Mean, ns.
    pub lat_mean_ns: f64,
    /// Fastest, ns.
    pub lat_min_ns: u64,
    /// Median, ns.
    pub lat_p50_ns: u64,
    /// 99th percentile, ns.
    pub lat_p99_ns: u64,
    /// 99.9th percentile, ns.
    pub lat_p999_ns: u64,
    /// Slowest, ns.
    pub lat_max_ns: u64,
}

/// One TCP stream's bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    /// Bytes the client received while measuring.
    pub bytes: u64,
    /// Measuring time, s.
    pub seconds: f64,
    /// Bytes per second.
    pub bw_bytes: f64,
}

/// The whole physical baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Physical {
    /// Where and how it ran.
    pub placement: Placement,
    /// TCP congestion control of its sockets (`None` = the system's).
    pub tcp_congestion: Option<&'static str>,
    /// Latency.
    pub ping_pong: PingPong,
    /// Bandwidth.
    pub stream: Stream,
}

impl Physical {
    /// One line for reports.
    pub fn describe(&self) -> String {
        let cpu = |c: Option<usize>| c.map_or_else(|| "any".to_string(), |c| c.to_string());
        let p = &self.placement;
        format!(
            "raw loopback TCP, server on CPU {} ({}), client on CPU {} ({}), congestion control {}",
            cpu(p.server_cpu),
            p.server_wait.name(),
            cpu(p.client_cpu),
            p.client_wait.name(),
            self.tcp_congestion.unwrap_or("of the system")
        )
    }
}

fn pin(cpu: Option<usize>) -> Result<()> {
    match cpu {
        Some(c) => uring::pin_current_thread(c).map_err(|e| Error::io(format!("baseline: pin to CPU {c}"), e)),
        None => Ok(()),
    }
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(format!("baseline: {what}"), e)
}

/// A socket that waits the way `mode` says.
struct Side {
    s: TcpStream,
    mode: WaitMode,
}

impl Side {
    fn new(s: TcpStream, mode: WaitMode) -> std::io::Result<Side> {
        s.set_nodelay(true)?;
        match mode {
            WaitMode::Busy => s.set_nonblocking(true)?,
            WaitMode::Block => {
                s.set_read_timeout(Some(STALL))?;
                s.set_write_timeout(Some(STALL))?;
            }
        }
        Ok(Side { s, mode })
    }

    /// Fill `buf`; `Ok(false)` if the peer closed before the first byte.
    fn read_full(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        let mut got = 0;
        let mut last = Instant::now();
        let mut spins = 0u32;
        while got < buf.len() {
            match self.s.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => return Err(IoKind::UnexpectedEof.into()),
                Ok(n) => {
                    got += n;
                    spins = 0;
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) if e.kind() == IoKind::WouldBlock && self.mode == WaitMode::Busy => {
                    spins += 1;
                    if spins.is_multiple_of(4096) {
                        if last.elapsed() > STALL {
                            return Err(IoKind::TimedOut.into());
                        }
                    } else if spins == 1 {
                        last = Instant::now();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn write_full(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut put = 0;
        let mut last = Instant::now();
        let mut spins = 0u32;
        while put < buf.len() {
            match self.s.write(&buf[put..]) {
                Ok(0) => return Err(IoKind::WriteZero.into()),
                Ok(n) => {
                    put += n;
                    spins = 0;
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) if e.kind() == IoKind::WouldBlock && self.mode == WaitMode::Busy => {
                    spins += 1;
                    if spins.is_multiple_of(4096) {
                        if last.elapsed() > STALL {
                            return Err(IoKind::TimedOut.into());
                        }
                    } else if spins == 1 {
                        last = Instant::now();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Run `server` on a pinned thread against one connection and `client` on another,
/// and return the client's result.
fn run_pair<T: Send>(
    placement: Placement,
    congestion: Option<&str>,
    server: impl FnOnce(Side) -> Result<()> + Send,
    client: impl FnOnce(Side) -> Result<T> + Send,
) -> Result<T> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("listen"))?;
    if let Some(cc) = congestion {
        // The accepted socket inherits it.
        uring::set_congestion_control(listener.as_raw_fd(), cc).map_err(io_err("TCP congestion control"))?;
    }
    let addr = listener.local_addr().map_err(io_err("local address"))?;
    std::thread::scope(|scope| {
        let srv = std::thread::Builder::new()
            .name("baseline-server".into())
            .spawn_scoped(scope, move || -> Result<()> {
                pin(placement.server_cpu)?;
                let (s, _) = listener.accept().map_err(io_err("accept"))?;
                server(Side::new(s, placement.server_wait).map_err(io_err("server socket"))?)
            })
            .map_err(io_err("spawn server"))?;
        let cli = std::thread::Builder::new()
            .name("baseline-client".into())
            .spawn_scoped(scope, move || -> Result<T> {
                pin(placement.client_cpu)?;
                let s = TcpStream::connect_timeout(&addr, STALL).map_err(io_err("connect"))?;
                if let Some(cc) = congestion {
                    uring::set_congestion_control(s.as_raw_fd(), cc).map_err(io_err("TCP congestion control"))?;
                }
                client(Side::new(s, placement.client_wait).map_err(io_err("client socket"))?)
            })
            .map_err(io_err("spawn client"))?;
        let out = cli.join().map_err(|_| Error::new(ErrorKind::Io, "baseline client panicked"))?;
        let srv = srv.join().map_err(|_| Error::new(ErrorKind::Io, "baseline server panicked"))?;
        let out = out?;
        srv?;
        Ok(out)
    })
}

/// Round trips of a 4 KiB read's shape: 72 bytes out, 4,144 bytes back.
pub fn ping_pong(opts: &BaselineOptions) -> Result<PingPong> {
    let time = opts.ping_pong_time;
    let max = opts.round_trips_max.max(1);
    run_pair(
        opts.placement,
        opts.tcp_congestion,
        |mut s| {
            let mut req = [0u8; REQUEST_BYTES];
            let reply = vec![0x5a; REPLY_BYTES];
            while s.read_full(&mut req).map_err(io_err("server read"))? {
                s.write_full(&reply).map_err(io_err("server write"))?;
            }
            Ok(())
        },
        move |mut s| {
            let req = [0xa5u8; REQUEST_BYTES];
            let mut reply = vec![0u8; REPLY_BYTES];
            let mut one = |s: &mut Side| -> Result<()> {
                s.write_full(&req).map_err(io_err("client write"))?;
                if !s.read_full(&mut reply).map_err(io_err("client read"))? {
                    return Err(Error::new(ErrorKind::Io, "baseline: server closed"));
                }
                Ok(())
            };
            for _ in 0..WARMUP_ROUND_TRIPS {
                one(&mut s)?;
            }
            let mut hist = LatHist::new();
            let (mut n, mut sum, mut min, mut max_ns) = (0u64, 0u128, u64::MAX, 0u64);
            let end = Instant::now() + time;
            while n < max {
                let t0 = Instant::now();
                one(&mut s)?;
                let t1 = Instant::now();
                let ns = u64::try_from(t1.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
                hist.record(ns);
                sum += u128::from(ns);
                min = min.min(ns);
                max_ns = max_ns.max(ns);
                n += 1;
                if t1 >= end {
                    break;
                }
            }
            let _ = s.s.shutdown(Shutdown::Both);
            let p = hist.percentiles(&[50.0, 99.0, 99.9]);
            #[allow(clippy::cast_precision_loss)] // well below 2^53 ns in total
            let mean = sum as f64 / n as f64;
            Ok(PingPong {
                round_trips: n,
                lat_mean_ns: mean,
                lat_min_ns: min,
                lat_p50_ns: p[0],
                lat_p99_ns: p[1],
                lat_p999_ns: p[2],
                lat_max_ns: max_ns,
            })
        },
    )
}

/// One stream of 128 KiB writes from the server side to the client side.
pub fn stream(opts: &BaselineOptions) -> Result<Stream> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_srv = Arc::clone(&stop);
    let time = opts.stream_time;
    run_pair(
        opts.placement,
        opts.tcp_congestion,
        move |mut s| {
            let chunk = vec![0x3cu8; STREAM_WRITE_BYTES];
            while !stop_srv.load(Ordering::Relaxed) {
                if s.write_full(&chunk).is_err() {
                    // The client closed: the measurement is over.
                    break;
                }
            }
            Ok(())
        },
        move |mut s| {
            let mut buf = vec![0u8; STREAM_WRITE_BYTES];
            let warm = Instant::now() + STREAM_WARMUP;
            while Instant::now() < warm {
                s.read_full(&mut buf).map_err(io_err("stream read"))?;
            }
            let t0 = Instant::now();
            let end = t0 + time;
            let mut bytes = 0u64;
            loop {
                if !s.read_full(&mut buf).map_err(io_err("stream read"))? {
                    return Err(Error::new(ErrorKind::Io, "baseline: stream closed early"));
                }
                bytes += STREAM_WRITE_BYTES as u64;
                if Instant::now() >= end {
                    break;
                }
            }
            let seconds = t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let _ = s.s.shutdown(Shutdown::Both);
            #[allow(clippy::cast_precision_loss)]
            let bw_bytes = bytes as f64 / seconds;
            Ok(Stream { bytes, seconds, bw_bytes })
        },
    )
}

/// Ping-pong, then stream.
pub fn measure(opts: &BaselineOptions) -> Result<Physical> {
    Ok(Physical {
        placement: opts.placement,
        tcp_congestion: opts.tcp_congestion,
        ping_pong: ping_pong(opts)?,
        stream: stream(opts)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(wait: WaitMode) -> BaselineOptions {
        BaselineOptions {
            placement: Placement { server_cpu: None, client_cpu: None, server_wait: wait, client_wait: wait },
            ping_pong_time: Duration::from_millis(50),
            round_trips_max: 500,
            stream_time: Duration::from_millis(50),
            tcp_congestion: None,
        }
    }

    #[test]
    fn both_modes_measure_something() {
        for wait in [WaitMode::Block, WaitMode::Busy] {
            let p = measure(&quick(wait)).unwrap();
            let pp = p.ping_pong;
            assert!(pp.round_trips > 0 && pp.round_trips <= 500, "{pp:?}");
            assert!(pp.lat_min_ns <= pp.lat_p50_ns && pp.lat_p50_ns <= pp.lat_p99_ns, "{pp:?}");
            assert!(pp.lat_p99_ns <= pp.lat_max_ns + pp.lat_max_ns / 100, "{pp:?}");
            assert!(p.stream.bytes >= STREAM_WRITE_BYTES as u64 && p.stream.bw_bytes > 0.0, "{:?}", p.stream);
            assert!(p.describe().contains(wait.name()));
        }
    }
}
