//! The running target: reactor threads plus one acceptor thread per port.
//!
//! Accepting is control plane: an acceptor blocks in `accept(2)`, applies
//! the port's connection limits ([`crate::limits`]) and fault switches, and
//! hands the socket with its place under the limits to a reactor (round-robin)
//! through its mailbox. The reactor owns it from then on.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use uring::MailboxSender;

use crate::error::{Error, ErrorKind};
use crate::port::{Port, PortKind};
use crate::reactor::{self, NewConn, ReactorHandle, ReactorMsg, ReactorOptions};
use crate::registry::TargetState;

struct Acceptor {
    port: Arc<Port>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Stops accepting and joins the thread; its listening socket closes with it.
    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.port.addr, std::time::Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running target.
pub struct Server {
    /// The shared state (subsystems, ports, controllers).
    pub state: Arc<TargetState>,
    reactors: Vec<ReactorHandle>,
    senders: Arc<Vec<MailboxSender<ReactorMsg>>>,
    next: Arc<AtomicUsize>,
    acceptors: Mutex<Vec<Acceptor>>,
    reactor_opts: ReactorOptions,
    /// Held by every change of the configuration (a changing RPC and its save, a reload),
    /// so each save writes a state no other change is halfway through.
    changes: Mutex<()>,
    /// Where and when the configuration is saved (none: only on demand, to a path given).
    persist: std::sync::OnceLock<crate::persist::Persist>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("reactors", &self.reactors.len()).finish_non_exhaustive()
    }
}

impl Server {
    /// Starts the reactors. Ports are added with [`Server::add_port`].
    pub fn start(state: Arc<TargetState>, opts: ReactorOptions) -> Result<Server, Error> {
        let n = if opts.reactors == 0 { uring::online_cpus().max(1) } else { opts.reactors };
        let mut reactors = Vec::with_capacity(n);
        for i in 0..n {
            reactors.push(reactor::spawn(i, Arc::clone(&state), opts.clone())?);
        }
        let senders = Arc::new(reactors.iter().map(|r| r.sender.clone()).collect());
        tracing::info!(reactors = n, poll = ?opts.poll, "target started");
        Ok(Server {
            state,
            reactors,
            senders,
            next: Arc::new(AtomicUsize::new(0)),
            acceptors: Mutex::new(Vec::new()),
            reactor_opts: opts,
            changes: Mutex::new(()),
            persist: std::sync::OnceLock::new(),
        })
    }

    /// The reactor settings it started with.
    pub fn reactor_options(&self) -> &ReactorOptions {
        &self.reactor_opts
    }

    /// Sets where and when its configuration is saved (once; later calls are refused).
    pub fn set_persist(&self, p: crate::persist::Persist) -> Result<(), Error> {
        self.persist.set(p).map_err(|_| Error::new(ErrorKind::Exists, "the configuration file is already set"))
    }

    /// Where and when its configuration is saved, if set.
    pub fn persist(&self) -> Option<&crate::persist::Persist> {
        self.persist.get()
    }

    /// Serialises changes of the configuration (see the field's docs).
    pub fn lock_changes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Binds `addr` (port 0 picks a free port) and serves it as port `id`.
    /// Returns the bound address.
    pub fn add_port(&self, id: u16, addr: SocketAddr, kind: PortKind) -> Result<SocketAddr, Error> {
        self.add_port_tls(id, addr, kind, crate::tls::TlsMode::None)
    }

    /// [`Server::add_port`] for a port with TLS setting `tls`, in force before it accepts.
    pub fn add_port_tls(
        &self,
        id: u16,
        addr: SocketAddr,
        kind: PortKind,
        tls: crate::tls::TlsMode,
    ) -> Result<SocketAddr, Error> {
        self.add_port_secure(id, addr, kind, tls, crate::tls::TlsOffload::Auto)
    }

    /// [`Server::add_port_tls`] with the port's kernel TLS setting (`tls_offload`).
    pub fn add_port_secure(
        &self,
        id: u16,
        addr: SocketAddr,
        kind: PortKind,
        tls: crate::tls::TlsMode,
        offload: crate::tls::TlsOffload,
    ) -> Result<SocketAddr, Error> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::io(format!("listen on {addr}"), e))?;
        if let Some(cc) = self.state.opts.tcp_congestion.name() {
            // Accepted connections inherit it from the listening socket.
            uring::set_congestion_control(listener.as_raw_fd(), cc)
                .map_err(|e| Error::io(format!("TCP congestion control {cc:?} on {addr}"), e))?;
        }
        let local = listener.local_addr().map_err(|e| Error::io("local_addr", e))?;
        let port = self.state.add_port(id, local, kind)?;
        port.tls.set(tls);
        port.tls.set_offload(offload);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            let state = Arc::clone(&self.state);
            let senders = Arc::clone(&self.senders);
            let next = Arc::clone(&self.next);
            let port = Arc::clone(&port);
            std::thread::Builder::new()
                .name(format!("qpath-accept-{id}"))
                .spawn(move || accept_loop(&listener, &port, &state, &senders, &next, &stop))
                .map_err(|e| Error::io("spawn acceptor", e))?
        };
        tracing::info!(port = id, %local, ?kind, tls = tls.name(), tls_offload = offload.name(), "listening");
        self.acceptors.lock().unwrap_or_else(|e| e.into_inner()).push(Acceptor { port, stop, thread: Some(thread) });
        Ok(local)
    }

    /// Stops serving port `id`: its listener closes, its connections close on their next
    /// tick (their controllers go as when a link goes), and discovery controllers on the
    /// other ports get a discovery-log-change event. The id (and address) may be added
    /// again; subsystems limited to it (`ports = [...]`) are reachable through it again then.
    pub fn remove_port(&self, id: u16) -> Result<(), Error> {
        let acceptor = {
            let mut list = self.acceptors.lock().unwrap_or_else(|e| e.into_inner());
            let i = list
                .iter()
                .position(|a| a.port.id == id)
                .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no port {id}")))?;
            list.remove(i)
        };
        acceptor.stop();
        self.state.remove_port(id)?;
        Ok(())
    }

    /// The bound address of port `id`.
    pub fn local_addr(&self, id: u16) -> Option<SocketAddr> {
        self.state.port(id).map(|p| p.addr)
    }

    /// Number of reactor threads.
    pub fn reactors(&self) -> usize {
        self.reactors.len()
    }

    /// Stops accepting, closes every connection and joins every thread.
    pub fn shutdown(self) {
        let acceptors = std::mem::take(&mut *self.acceptors.lock().unwrap_or_else(|e| e.into_inner()));
        for a in acceptors {
            a.stop();
        }
        for r in self.reactors {
            r.shutdown();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    port: &Arc<Port>,
    state: &TargetState,
    senders: &[MailboxSender<ReactorMsg>],
    next: &AtomicUsize,
    stop: &AtomicBool,
) {
    let mut refused = 0u64;
    let mut last_warn = None;
    // Not on the I/O path: off the CPUs polling reactors own (placed again after each
    // wake-up if a reactor came or went).
    let mut place = uring::placement::Helper::default();
    loop {
        if let Err(e) = place.refresh() {
            tracing::debug!(port = port.id, "acceptor keeps its CPUs: {e}");
        }
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(port = port.id, "accept failed: {e}");
                // EMFILE and friends: back off instead of spinning.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        if port.faults.refuse_connects.load(Ordering::Relaxed) {
            drop(stream);
            continue;
        }
        let ticket = match state.limits.admit_connection(port.id, Some(peer.ip())) {
            Ok(t) => t,
            Err(why) => {
                // Closed at once; the warning is rate-limited (a flood must not flood the log too).
                refused += 1;
                if last_warn.is_none_or(|t: std::time::Instant| t.elapsed() >= std::time::Duration::from_secs(1)) {
                    tracing::warn!(port = port.id, %peer, limit = why.name(), refused, "connection limit reached: refusing");
                    last_warn = Some(std::time::Instant::now());
                    refused = 0;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let k = next.fetch_add(1, Ordering::Relaxed) % senders.len().max(1);
        let msg = ReactorMsg::Conn(Box::new(NewConn { stream, port: Arc::clone(port), peer: Some(peer), ticket }));
        if senders.get(k).map(|s| s.send(msg)).is_none() {
            tracing::error!("no reactor to take the connection");
        }
    }
}

/// Parses "ip:port" or "[ipv6]:port".
pub fn parse_addr(s: &str) -> Result<SocketAddr, Error> {
    s.parse().map_err(|e| Error::new(ErrorKind::Config, format!("address {s:?}: {e}")))
}
