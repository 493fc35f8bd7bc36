//! `qpath nbd serve`: a listener (Unix socket or TCP) and one thread per client. Each
//! client thread owns a host completion context with the head open on it: the client's
//! socket and the head's NVMe/TCP queues share that context's io_uring
//! ([`super::session`]).
//!
//! ```text
//!   accept thread ──(one per connection)──► client thread k
//!                                           negotiation: blocking, NEGOTIATION_TIMEOUT
//!                                           Context::new + open_head (its own I/O queues)
//!                                           Session::run until the client goes away
//! ```
//!
//! A client takes one I/O queue of every path's controller for as long as it is connected,
//! so the number of clients at once is bounded by the controllers' I/O queues (and by
//! `clients_max`); a client beyond it is closed at once and counted in
//! `refused_clients_total`. A Unix socket path another process serves is refused; a
//! stale socket left by a crash is replaced; anything that is not a socket is never
//! touched.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions};
use host::head::Head;

use super::handshake::{Closed, Export, Handshake, Outcome};
use super::request::{Limits, PAYLOAD_HARD_MAX};
use super::session::Session;
use super::wire::flags;
use crate::device::DeviceInfo;
use crate::error::{Error, ErrorKind, Result};

/// How long a client may take to negotiate before it is disconnected.
pub const NEGOTIATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Clients served at once unless told otherwise.
pub const CLIENTS_MAX_DEFAULT: usize = 16;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A Unix stream socket at this path (`nbd+unix:///NAME?socket=PATH`).
    Unix(PathBuf),
    /// A TCP address (`nbd://HOST:PORT/NAME`; NBD's port is 10809).
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The export's name (clients may also ask for the empty, default name).
    pub name: String,
    /// Where to listen.
    pub listen: Listen,
    /// Clients at once.
    pub clients_max: usize,
    /// Each client's completion context (ring size, requests, timers).
    pub context: ContextOptions,
    /// Serve the export read-only.
    pub read_only: bool,
}

/// Counters of a running server (never reset; `_total` ones never go down).
#[derive(Debug, Default)]
pub struct NbdStats {
    /// Clients that reached the transmission phase.
    pub clients_total: AtomicU64,
    /// Clients connected now.
    pub clients_now: AtomicU64,
    /// Clients closed at once: no I/O queue left, or `clients_max` reached.
    pub refused_clients_total: AtomicU64,
    /// Clients that broke the protocol (negotiation or transmission).
    pub protocol_errors_total: AtomicU64,
    /// Requests answered.
    pub requests_total: AtomicU64,
    /// Requests answered with an error.
    pub errors_total: AtomicU64,
}

/// A running NBD server.
pub struct NbdServer {
    listen: Listen,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// The server's counters.
    pub stats: Arc<NbdStats>,
}

impl std::fmt::Debug for NbdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdServer").field("listen", &self.listen).finish_non_exhaustive()
    }
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The export `info` is served as.
pub fn export_of(info: &DeviceInfo, name: &str, read_only: bool) -> Export {
    let mut f = flags::HAS_FLAGS | flags::SEND_FLUSH | flags::SEND_FUA | flags::SEND_DF;
    if info.discard {
        f |= flags::SEND_TRIM;
    }
    if info.write_zeroes {
        f |= flags::SEND_WRITE_ZEROES;
    }
    if read_only || info.read_only {
        f |= flags::READ_ONLY;
    }
    Export {
        name: name.to_string(),
        description: format!("qpath: namespace {} of {}", info.nsid, info.subnqn),
        size: info.size,
        flags: f,
        block_min: info.block_size(),
        block_preferred: (1u32 << info.physical_shift).max(4096),
        payload_max: PAYLOAD_HARD_MAX,
    }
}

/// Binds `path`, replacing only a stale socket (nobody answers on it).
pub(crate) fn bind_unix(path: &PathBuf) -> Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{}: exists and is not a socket; not replacing it", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{}: another process serves this socket; not replacing it", path.display()),
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| Error::io(format!("{}: removing the stale socket", path.display()), &e))?;
    }
    UnixListener::bind(path).map_err(|e| Error::io(format!("{}: bind", path.display()), &e))
}

impl NbdServer {
    /// Binds `opts.listen` and serves `head` (whose limits are `info`) until [`NbdServer::stop`].
    pub fn start(head: Arc<Head>, info: DeviceInfo, opts: ServeOptions) -> Result<NbdServer> {
        let listener = match &opts.listen {
            Listen::Unix(p) => Listener::Unix(bind_unix(p)?, p.clone()),
            Listen::Tcp(a) => Listener::Tcp(TcpListener::bind(a).map_err(|e| Error::io(format!("bind {a}"), &e))?),
        };
        let listen = match &listener {
            Listener::Unix(_, p) => Listen::Unix(p.clone()),
            Listener::Tcp(l) => Listen::Tcp(l.local_addr().map_err(|e| Error::io("local address", &e))?),
        };
        match &listener {
            Listener::Unix(l, _) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
        .map_err(|e| Error::io("listener", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(NbdStats::default());
        let export = export_of(&info, &opts.name, opts.read_only);
        tracing::info!(%listen, export = %opts.name, size = info.size, block_size = info.block_size(), "NBD server listening");
        let accept = {
            let (stop, stats) = (Arc::clone(&stop), Arc::clone(&stats));
            std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(listener, head, info, export, opts, stop, stats))
                .map_err(|e| Error::io("spawn the accept thread", &e))?
        };
        Ok(NbdServer { listen, stop, accept: Some(accept), stats })
    }

    /// Where it listens (the bound port for `127.0.0.1:0`).
    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    /// A handle that stops the server when set (signal handlers).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Stops accepting, ends every client (their commands in flight complete first) and
    /// removes the Unix socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Waits until the stop flag is set (by a signal handler), then stops.
    pub fn wait(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[allow(clippy::too_many_arguments)]
fn accept_loop(
    listener: Listener,
    head: Arc<Head>,
    info: DeviceInfo,
    export: Export,
    opts: ServeOptions,
    stop: Arc<AtomicBool>,
    stats: Arc<NbdStats>,
) {
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let accepted = match &listener {
            Listener::Unix(l, _) => l.accept().map(|(s, _)| (Stream::Unix(s), "unix socket".to_string())),
            Listener::Tcp(l) => l.accept().map(|(s, a)| {
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s), a.to_string())
            }),
        };
        clients.retain(|c| !c.is_finished());
        match accepted {
            Ok((stream, peer)) => {
                if clients.len() >= opts.clients_max {
                    tracing::warn!(%peer, clients_max = opts.clients_max, "NBD client refused: the server serves its most clients");
                    stats.refused_clients_total.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let (head, info, export, copts) =
                    (Arc::clone(&head), info.clone(), export.clone(), opts.context.clone());
                let (stop, stats) = (Arc::clone(&stop), Arc::clone(&stats));
                let spawned = std::thread::Builder::new()
                    .name("nbd-client".into())
                    .spawn(move || client(stream, &peer, &head, info, export, copts, &stop, &stats));
                match spawned {
                    Ok(t) => clients.push(t),
                    Err(e) => tracing::warn!(error = %e, "NBD client refused: no thread for it"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                tracing::warn!(error = %e, "NBD accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    for c in clients {
        let _ = c.join();
    }
    if let Listener::Unix(_, p) = &listener {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("NBD server stopped");
}

/// The limits of a transmission phase: DF only with structured replies.
fn limits_for(export: &Export, structured: bool) -> Limits {
    let f = export.flags;
    Limits {
        size: export.size,
        block_min: export.block_min,
        payload_max: export.payload_max,
        flags: if structured { f } else { f & !flags::SEND_DF },
        structured,
    }
}

/// Negotiates with one client (blocking, bounded by [`NEGOTIATION_TIMEOUT`]); returns the
/// limits of its transmission phase and any bytes it sent after the negotiation.
fn negotiate(stream: &mut Stream, export: &Export) -> std::result::Result<(Limits, Vec<u8>), String> {
    let deadline = Instant::now() + NEGOTIATION_TIMEOUT;
    let mut hs = Handshake::new(export.clone());
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let out = std::mem::take(hs.output());
        stream.write_all(&out).map_err(|e| format!("sending: {e}"))?;
        match hs.outcome().clone() {
            Outcome::Negotiating => {}
            Outcome::Transmission(n) => return Ok((limits_for(export, n.structured), Vec::new())),
            Outcome::Closed(Closed::Aborted) => return Err("the client aborted the negotiation".into()),
            Outcome::Closed(Closed::Protocol(why)) => return Err(format!("protocol error: {why}")),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no export chosen within {} s", NEGOTIATION_TIMEOUT.as_secs()));
        }
        stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        let n = stream.read(&mut buf).map_err(|e| format!("receiving: {e}"))?;
        if n == 0 {
            return Err("the client closed the connection during the negotiation".into());
        }
        let used = hs.feed(&buf[..n]);
        if used < n && matches!(hs.outcome(), Outcome::Transmission(_)) {
            let out = std::mem::take(hs.output());
            stream.write_all(&out).map_err(|e| format!("sending: {e}"))?;
            let Outcome::Transmission(neg) = hs.outcome().clone() else { unreachable!("checked above") };
            return Ok((limits_for(export, neg.structured), buf[used..n].to_vec()));
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn client(
    mut stream: Stream,
    peer: &str,
    head: &Arc<Head>,
    info: DeviceInfo,
    export: Export,
    copts: ContextOptions,
    stop: &Arc<AtomicBool>,
    stats: &NbdStats,
) {
    // The context first: without a queue of our own there is nothing to serve with.
    let mut ctx = match Context::new(copts) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "NBD client refused: no completion context");
            stats.refused_clients_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let dev = match ctx.open_head(head) {
        Ok(d) => d,
        Err(e) if e.kind == host::error::ErrorKind::Busy => {
            tracing::warn!(%peer, error = %e, "NBD client refused: no free I/O queue on the namespace's controllers (each client takes one per path; connect with more I/O queues)");
            stats.refused_clients_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "NBD client refused: the namespace cannot be opened");
            stats.refused_clients_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    // Each client is given the namespace's size as its context reads it now (it may have
    // been resized since the server started); NBD cannot tell it of a later change.
    let export = Export { size: ctx.capacity(dev), ..export };
    let (lim, early) = match negotiate(&mut stream, &export) {
        Ok(x) => x,
        Err(why) => {
            if why.starts_with("protocol error") {
                stats.protocol_errors_total.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "NBD negotiation failed: {why}");
            } else {
                tracing::info!(%peer, "NBD negotiation ended: {why}");
            }
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    stats.clients_total.fetch_add(1, Ordering::Relaxed);
    stats.clients_now.fetch_add(1, Ordering::Relaxed);
    tracing::info!(%peer, structured = lim.structured, "NBD client in transmission");
    let mut session = Session::new(&mut ctx, dev, stream.fd(), info, lim, Arc::clone(stop));
    session.preload(&early);
    let report = session.run();
    // The session's totals are in before it stops counting as a client: whoever sees
    // clients_now fall sees them.
    stats.requests_total.fetch_add(report.requests, Ordering::Relaxed);
    stats.errors_total.fetch_add(report.errors, Ordering::Relaxed);
    let protocol_error = report.end.starts_with("protocol error");
    if protocol_error {
        stats.protocol_errors_total.fetch_add(1, Ordering::Relaxed);
    }
    stats.clients_now.fetch_sub(1, Ordering::Release);
    if protocol_error {
        tracing::warn!(%peer, requests = report.requests, "NBD client disconnected: {}", report.end);
    } else if report.abandoned > 0 {
        tracing::warn!(%peer, requests = report.requests, abandoned = report.abandoned,
            "NBD client went away with requests in flight: {}", report.end);
    } else {
        tracing::info!(%peer, requests = report.requests, errors = report.errors, "NBD client done: {}", report.end);
    }
    drop(ctx);
    drop(stream);
}
