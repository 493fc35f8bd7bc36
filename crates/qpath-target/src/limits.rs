//! What a listening target allows its peers: connections per port, per host
//! address and per host NQN, how long a peer may take to finish its ICReq and
//! Connect or a PDU it started, and how many data buffer bytes one connection
//! may hold.
//!
//! ```text
//!  accept ──► admit_connection(port, address) ──► ConnTicket (held by the reactor's entry)
//!  Connect ─► admit_host(hostnqn) ──────────────► HostTicket (held by the connection)
//!                       tickets give their place back when dropped
//! ```
//!
//! Everything here is control plane: a mutex taken once per accepted connection
//! and once per Connect, never per command. Every limit can be changed at run
//! time (`set_limits` over RPC); a change applies to connections admitted
//! afterwards, the timeouts to every connection on its next tick, and the
//! fairness budgets (`rx_budget_pdus`, `tx_batch_bytes`, `tx_deadline_us`) to the
//! next reactor turn.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::registry::TargetOptions;

/// The limits in force, as RPC shows and sets them (every field optional when setting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Most connections at once on one port.
    pub max_connections_per_port: Option<usize>,
    /// Most connections at once from one host address.
    pub max_connections_per_host: Option<usize>,
    /// Most queues (admin and I/O, every subsystem) at once connected with one host NQN.
    pub max_connections_per_hostnqn: Option<usize>,
    /// ICReq and Connect must be done within this many ms of the TCP accept.
    pub connect_timeout_ms: Option<u64>,
    /// A PDU must arrive whole, and an R2T be answered, within this many ms.
    pub pdu_timeout_ms: Option<u64>,
    /// Data buffer bytes one connection may hold (R2T, read and admin data).
    pub max_buffer_bytes_per_connection: Option<usize>,
    /// Fairness: PDUs one connection parses per reactor turn while others have work (0 = no limit).
    pub rx_budget_pdus: Option<u32>,
    /// Fairness: most bytes in one send batch while others have work (0 = no limit).
    pub tx_batch_bytes: Option<usize>,
    /// Fairness: a reactor turn stops parsing input this many µs after it began (0 = never).
    pub tx_deadline_us: Option<u64>,
}

/// Why a connection or a Connect was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The port is at `max_connections_per_port`.
    Port,
    /// The peer's address is at `max_connections_per_host`.
    HostAddress,
    /// The host NQN is at `max_connections_per_hostnqn`.
    HostNqn,
}

impl Refusal {
    /// Label for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Port => "port",
            Refusal::HostAddress => "host_address",
            Refusal::HostNqn => "hostnqn",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    ports: HashMap<u16, usize>,
    addrs: HashMap<IpAddr, usize>,
    nqns: HashMap<String, usize>,
}

/// The limits and the counts they are checked against.
#[derive(Debug)]
pub struct Limits {
    max_per_port: AtomicUsize,
    max_per_addr: AtomicUsize,
    max_per_nqn: AtomicUsize,
    connect_timeout_ms: AtomicU64,
    pdu_timeout_ms: AtomicU64,
    max_buffer_bytes: AtomicUsize,
    rx_budget_pdus: AtomicU32,
    tx_batch_bytes: AtomicUsize,
    tx_deadline_us: AtomicU64,
    counts: Mutex<Counts>,
    refused: [AtomicU64; 3],
    timeouts: AtomicU64,
}

impl Limits {
    /// Limits with the values of `o`.
    pub fn new(o: &TargetOptions) -> Limits {
        Limits {
            max_per_port: AtomicUsize::new(o.max_connections_per_port),
            max_per_addr: AtomicUsize::new(o.max_connections_per_host),
            max_per_nqn: AtomicUsize::new(o.max_connections_per_hostnqn),
            connect_timeout_ms: AtomicU64::new(o.connect_timeout_ms),
            pdu_timeout_ms: AtomicU64::new(o.pdu_timeout_ms),
            max_buffer_bytes: AtomicUsize::new(o.max_buffer_bytes_per_connection),
            rx_budget_pdus: AtomicU32::new(o.rx_budget_pdus),
            tx_batch_bytes: AtomicUsize::new(o.tx_batch_bytes),
            tx_deadline_us: AtomicU64::new(o.tx_deadline_us),
            counts: Mutex::new(Counts::default()),
            refused: Default::default(),
            timeouts: AtomicU64::new(0),
        }
    }

    /// The values in force.
    pub fn get(&self) -> LimitSettings {
        LimitSettings {
            max_connections_per_port: Some(self.max_per_port.load(Ordering::Relaxed)),
            max_connections_per_host: Some(self.max_per_addr.load(Ordering::Relaxed)),
            max_connections_per_hostnqn: Some(self.max_per_nqn.load(Ordering::Relaxed)),
            connect_timeout_ms: Some(self.connect_timeout_ms()),
            pdu_timeout_ms: Some(self.pdu_timeout_ms()),
            max_buffer_bytes_per_connection: Some(self.max_buffer_bytes_per_connection()),
            rx_budget_pdus: Some(self.rx_budget_pdus()),
            tx_batch_bytes: Some(self.tx_batch_bytes()),
            tx_deadline_us: Some(self.tx_deadline_us()),
        }
    }

    /// Changes the values given (a zero count or timeout is refused: it would lock every peer
    /// out; a zero fairness budget means no limit).
    pub fn set(&self, s: &LimitSettings) -> Result<(), String> {
        let counts = [s.max_connections_per_port, s.max_connections_per_host, s.max_connections_per_hostnqn];
        let times = [s.connect_timeout_ms, s.pdu_timeout_ms];
        if counts.contains(&Some(0)) || times.contains(&Some(0)) || s.max_buffer_bytes_per_connection == Some(0) {
            return Err("limits must be at least 1".into());
        }
        let store = |a: &AtomicUsize, v: Option<usize>| v.into_iter().for_each(|v| a.store(v, Ordering::Relaxed));
        store(&self.max_per_port, s.max_connections_per_port);
        store(&self.max_per_addr, s.max_connections_per_host);
        store(&self.max_per_nqn, s.max_connections_per_hostnqn);
        store(&self.max_buffer_bytes, s.max_buffer_bytes_per_connection);
        store(&self.tx_batch_bytes, s.tx_batch_bytes);
        let store = |a: &AtomicU64, v: Option<u64>| v.into_iter().for_each(|v| a.store(v, Ordering::Relaxed));
        store(&self.connect_timeout_ms, s.connect_timeout_ms);
        store(&self.pdu_timeout_ms, s.pdu_timeout_ms);
        store(&self.tx_deadline_us, s.tx_deadline_us);
        if let Some(v) = s.rx_budget_pdus {
            self.rx_budget_pdus.store(v, Ordering::Relaxed);
        }
        tracing::info!(limits = ?self.get(), "limits changed");
        Ok(())
    }

    /// ICReq and Connect deadline, ms after accept.
    #[inline]
    pub fn connect_timeout_ms(&self) -> u64 {
        self.connect_timeout_ms.load(Ordering::Relaxed)
    }

    /// Deadline for a started PDU or an R2T, ms.
    #[inline]
    pub fn pdu_timeout_ms(&self) -> u64 {
        self.pdu_timeout_ms.load(Ordering::Relaxed)
    }

    /// Data buffer bytes a connection may hold.
    #[inline]
    pub fn max_buffer_bytes_per_connection(&self) -> usize {
        self.max_buffer_bytes.load(Ordering::Relaxed)
    }

    /// PDUs a connection parses per reactor turn (0 = no limit).
    #[inline]
    pub fn rx_budget_pdus(&self) -> u32 {
        self.rx_budget_pdus.load(Ordering::Relaxed)
    }

    /// Most bytes in one send batch (0 = no limit).
    #[inline]
    pub fn tx_batch_bytes(&self) -> usize {
        self.tx_batch_bytes.load(Ordering::Relaxed)
    }

    /// µs after which a reactor turn stops parsing input (0 = never).
    #[inline]
    pub fn tx_deadline_us(&self) -> u64 {
        self.tx_deadline_us.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn refuse(&self, why: Refusal) -> Refusal {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        why
    }

    /// Takes a place for a connection accepted on `port` from `addr`.
    pub fn admit_connection(self: &Arc<Self>, port: u16, addr: Option<IpAddr>) -> Result<ConnTicket, Refusal> {
        let mut c = self.lock();
        if c.ports.get(&port).copied().unwrap_or(0) >= self.max_per_port.load(Ordering::Relaxed) {
            return Err(self.refuse(Refusal::Port));
        }
        if let Some(a) = addr
            && c.addrs.get(&a).copied().unwrap_or(0) >= self.max_per_addr.load(Ordering::Relaxed)
        {
            return Err(self.refuse(Refusal::HostAddress));
        }
        *c.ports.entry(port).or_default() += 1;
        if let Some(a) = addr {
            *c.addrs.entry(a).or_default() += 1;
        }
        Ok(ConnTicket { limits: Arc::clone(self), port, addr })
    }

    /// Takes a place for a queue connected as `hostnqn`.
    pub fn admit_host(self: &Arc<Self>, hostnqn: &str) -> Result<HostTicket, Refusal> {
        let mut c = self.lock();
        let n = c.nqns.get(hostnqn).copied().unwrap_or(0);
        if n >= self.max_per_nqn.load(Ordering::Relaxed) {
            return Err(self.refuse(Refusal::HostNqn));
        }
        *c.nqns.entry(hostnqn.to_string()).or_default() = n + 1;
        Ok(HostTicket { limits: Arc::clone(self), hostnqn: hostnqn.to_string() })
    }

    /// Connections now on `port`.
    pub fn connections_on_port(&self, port: u16) -> usize {
        self.lock().ports.get(&port).copied().unwrap_or(0)
    }

    /// Connections now from `addr`.
    pub fn connections_from(&self, addr: IpAddr) -> usize {
        self.lock().addrs.get(&addr).copied().unwrap_or(0)
    }

    /// Queues now connected as `hostnqn`.
    pub fn queues_of(&self, hostnqn: &str) -> usize {
        self.lock().nqns.get(hostnqn).copied().unwrap_or(0)
    }

    /// Connections and Connects refused so far, by reason.
    pub fn refused(&self) -> [(Refusal, u64); 3] {
        [Refusal::Port, Refusal::HostAddress, Refusal::HostNqn]
            .map(|r| (r, self.refused[r as usize].load(Ordering::Relaxed)))
    }

    /// Connections closed by the connect or PDU timeout so far.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Counts a connection closed by a timeout.
    pub fn count_timeout(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }
}

fn release<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            m.remove(k);
        }
    }
}

/// A connection's place under the port and host-address limits; given back on drop.
#[derive(Debug)]
pub struct ConnTicket {
    limits: Arc<Limits>,
    port: u16,
    addr: Option<IpAddr>,
}

impl Drop for ConnTicket {
    fn drop(&mut self) {
        let mut c = self.limits.lock();
        release(&mut c.ports, &self.port);
        if let Some(a) = self.addr {
            release(&mut c.addrs, &a);
        }
    }
}

/// A queue's place under the host NQN limit; given back on drop.
#[derive(Debug)]
pub struct HostTicket {
    limits: Arc<Limits>,
    hostnqn: String,
}

impl Drop for HostTicket {
    fn drop(&mut self) {
        release(&mut self.limits.lock().nqns, &self.hostnqn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_count_and_give_back() {
        let o = TargetOptions { max_connections_per_port: 3, max_connections_per_host: 2, ..TargetOptions::default() };
        let l = Arc::new(Limits::new(&o));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = l.admit_connection(1, Some(a)).unwrap();
        let t2 = l.admit_connection(1, Some(a)).unwrap();
        assert_eq!(l.admit_connection(1, Some(a)).unwrap_err(), Refusal::HostAddress);
        let t3 = l.admit_connection(1, Some(b)).unwrap();
        assert_eq!(l.admit_connection(1, Some(b)).unwrap_err(), Refusal::Port);
        // Another port has its own count.
        let t4 = l.admit_connection(2, Some(b)).unwrap();
        assert_eq!((l.connections_on_port(1), l.connections_from(a), l.connections_from(b)), (3, 2, 2));
        drop((t1, t3));
        assert_eq!((l.connections_on_port(1), l.connections_from(a), l.connections_from(b)), (1, 1, 1));
        let _t5 = l.admit_connection(1, Some(a)).unwrap();
        drop((t2, t4));
        assert_eq!(l.refused()[0].1 + l.refused()[1].1, 2);
    }

    #[test]
    fn host_nqn_limit_and_runtime_changes() {
        let l = Arc::new(Limits::new(&TargetOptions::default()));
        l.set(&LimitSettings { max_connections_per_hostnqn: Some(2), ..Default::default() }).unwrap();
        let a = l.admit_host("nqn.a").unwrap();
        let _b = l.admit_host("nqn.a").unwrap();
        assert_eq!(l.admit_host("nqn.a").unwrap_err(), Refusal::HostNqn);
        let _c = l.admit_host("nqn.b").unwrap();
        drop(a);
        assert_eq!(l.queues_of("nqn.a"), 1);
        assert!(l.admit_host("nqn.a").is_ok());
        assert!(l.set(&LimitSettings { pdu_timeout_ms: Some(0), ..Default::default() }).is_err());
        l.set(&LimitSettings { pdu_timeout_ms: Some(250), ..Default::default() }).unwrap();
        assert_eq!(l.get().pdu_timeout_ms, Some(250));
        assert_eq!(l.get().max_connections_per_hostnqn, Some(2), "unchanged fields stay");
    }
}
