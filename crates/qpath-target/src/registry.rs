//! The target's shared state: ports, subsystems, the discovery subsystem,
//! ANA change counting and the queue registry that RPC reads.
//!
//! Everything here is control plane: it is touched on Connect, admin
//! commands, RPC and once per connection, never per I/O.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use nvme::features::AsyncEvent;
use nvme::log::{DiscoveryEntry, DiscoveryLog, adrfam, eflags, subtype, trtype};
use nvme::{AnaGrpId, AnaState, Cntlid};

use crate::error::{Error, ErrorKind};
use crate::limits::Limits;
use crate::port::{ANA_GROUPS, Port, PortKind};
use crate::stats::{QueueStats, QueueStatsSnapshot};
use crate::subsystem::{HostAccess, SubsysKind, Subsystem};

/// TCP congestion control of the target's connections (`TCP_CONGESTION`, set on each
/// port's listening socket and inherited by the connections it accepts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TcpCongestion {
    /// The system's default (`net.ipv4.tcp_congestion_control`).
    #[default]
    System,
    /// Reno.
    Reno,
    /// CUBIC (Linux's default).
    Cubic,
    /// BBR: paces its sends, which on short-RTT links (loopback, one rack) costs
    /// request/response streams bandwidth (see BENCHMARKS.md).
    Bbr,
    /// DCTCP (needs ECN on the path).
    Dctcp,
}

impl TcpCongestion {
    /// The kernel's name, `None` for the system default.
    pub fn name(self) -> Option<&'static str> {
        match self {
            TcpCongestion::System => None,
            TcpCongestion::Reno => Some("reno"),
            TcpCongestion::Cubic => Some("cubic"),
            TcpCongestion::Bbr => Some("bbr"),
            TcpCongestion::Dctcp => Some("dctcp"),
        }
    }
}

impl std::str::FromStr for TcpCongestion {
    type Err = String;

    /// `system`, `reno`, `cubic`, `bbr` or `dctcp` (command-line options).
    fn from_str(s: &str) -> Result<TcpCongestion, String> {
        match s {
            "system" => Ok(TcpCongestion::System),
            "reno" => Ok(TcpCongestion::Reno),
            "cubic" => Ok(TcpCongestion::Cubic),
            "bbr" => Ok(TcpCongestion::Bbr),
            "dctcp" => Ok(TcpCongestion::Dctcp),
            _ => Err(format!("{s:?}: system, reno, cubic, bbr or dctcp")),
        }
    }
}

/// Transport and queue limits of the whole target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TargetOptions {
    /// In-capsule data accepted on I/O queues, bytes (IOCCSZ = 4 + this / 16).
    pub in_capsule_data_size: u32,
    /// MDTS as a power of two of 4 KiB pages (8 = 1 MiB).
    pub mdts: u8,
    /// MAXH2CDATA: most data in one H2CData PDU, bytes.
    pub maxh2cdata: u32,
    /// Receive buffer per connection, bytes.
    pub rx_buffer_size: usize,
    /// Data buffer bytes a reactor may have outstanding.
    pub buffer_pool_bytes: usize,
    /// A connection that has not completed ICReq and Connect within this many ms is closed
    /// (a peer that connects and sends nothing, or half an ICReq, holds nothing longer).
    pub connect_timeout_ms: u64,
    /// A connection that started a PDU and sent no whole PDU since, or that owes H2CData
    /// for an R2T and sent none, for this many ms is closed.
    pub pdu_timeout_ms: u64,
    /// Most connections at once on one port.
    pub max_connections_per_port: usize,
    /// Most connections at once from one host address.
    pub max_connections_per_host: usize,
    /// Most queues (admin and I/O, over every subsystem) at once with one host NQN.
    pub max_connections_per_hostnqn: usize,
    /// Data buffer bytes one connection may hold at once (R2T, read and admin data); its
    /// commands wait for its own buffers beyond this. In-capsule data is not counted: it
    /// is bounded by the queue size times `in_capsule_data_size`.
    pub max_buffer_bytes_per_connection: usize,
    /// Fairness: PDUs one connection parses per reactor turn; the rest of its input waits
    /// for its next turn, after the other ready connections' (0 = no limit). It applies only
    /// while another connection of the reactor has work (work-conserving; see `reactor`).
    /// Linux nvmet-tcp receives 8 per pass, always.
    pub rx_budget_pdus: u32,
    /// Fairness: most bytes in one send batch, and so sent per connection per turn (one
    /// batch in flight each); responses beyond it wait for the next batch (0 = no limit).
    /// Like the PDU budget, only while another connection of the reactor has work.
    pub tx_batch_bytes: usize,
    /// Fairness: a reactor turn stops parsing received input this many µs after it began
    /// and goes back to the ring to send what is ready (at least one connection is served
    /// per turn; 0 = no deadline). Linux nvme-tcp's io_work deadline, in µs since seed 002.
    pub tx_deadline_us: u64,
    /// TCP congestion control of every port's connections (default: the system's).
    pub tcp_congestion: TcpCongestion,
    /// Threads that run in-band authentication's Diffie-Hellman steps (up to one per CPU;
    /// see [`crate::offload`]); 0 runs them on the reactor, which stops its other queues
    /// for each (16 ms per ffdhe8192 step here).
    pub auth_workers: usize,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            in_capsule_data_size: 8192,
            mdts: 8,
            maxh2cdata: 256 * 1024,
            rx_buffer_size: 64 * 1024,
            buffer_pool_bytes: 256 << 20,
            connect_timeout_ms: 10_000,
            pdu_timeout_ms: 30_000,
            max_connections_per_port: 4096,
            max_connections_per_host: 2048,
            max_connections_per_hostnqn: 2048,
            max_buffer_bytes_per_connection: 16 << 20,
            rx_budget_pdus: 16,
            tx_batch_bytes: 64 * 1024,
            tx_deadline_us: 50,
            tcp_congestion: TcpCongestion::System,
            auth_workers: crate::offload::MAX_WORKERS,
        }
    }
}

impl TargetOptions {
    /// Largest transfer in bytes.
    pub fn max_transfer(&self) -> usize {
        4096usize << self.mdts
    }
}

/// What RPC shows about one queue.
#[derive(Debug)]
pub struct QueueInfo {
    /// Port the connection came in on.
    pub port: u16,
    /// Peer address.
    pub peer: Option<SocketAddr>,
    /// Reactor thread that owns it.
    pub reactor: usize,
    /// Counters.
    pub stats: QueueStats,
    /// The secure channel, once its handshake is done: record path and cipher suite (the
    /// path changes once, when the kernel takes the records over).
    pub secure_channel: Mutex<Option<String>>,
    binding: Mutex<Option<(String, Cntlid, u16)>>,
    /// Latency histograms and the exact latency sums of their I/Os, merged in by the owner
    /// on its tick.
    published: Mutex<Published>,
}

/// What a queue's owner has published: its histograms since the queue started, and the
/// sum of the latencies they hold by direction ([`blk::Direction::ALL`] order, ns).
#[derive(Debug, Default)]
struct Published {
    stats: blk::QueueStats,
    latency_ns_sum: [u64; 4],
}

/// A queue as `list_queues` reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct QueueReport {
    /// Port id.
    pub port: u16,
    /// Peer address.
    pub peer: String,
    /// Reactor index.
    pub reactor: usize,
    /// Subsystem NQN (empty before Connect).
    pub subnqn: String,
    /// Controller id.
    pub cntlid: u16,
    /// Queue id.
    pub qid: u16,
    /// The secure channel ("tls1.3-user TLS_AES_128_GCM_SHA256", "tls1.3-kernel ..." once
    /// the kernel seals and opens its records), none for plaintext.
    pub secure_channel: Option<String>,
    /// Counters.
    pub stats: QueueStatsSnapshot,
}

impl QueueInfo {
    /// Merges the owner's latest statistics and the latency sums of their successful I/Os
    /// (and resets both).
    pub fn publish(&self, local: &mut blk::QueueStats, latency_ns_sum: &mut [u64; 4]) {
        let mut g = self.published.lock().unwrap_or_else(|e| e.into_inner());
        g.stats.merge(local);
        for (t, v) in g.latency_ns_sum.iter_mut().zip(latency_ns_sum.iter_mut()) {
            *t = t.wrapping_add(std::mem::take(v));
        }
        local.reset();
    }

    /// A copy of the published histograms.
    pub fn latency(&self) -> blk::QueueStats {
        self.published.lock().unwrap_or_else(|e| e.into_inner()).stats.clone()
    }

    /// A copy of the published histograms with the exact latency sum (ns) of the I/Os in
    /// each direction's histogram ([`blk::Direction::ALL`] order).
    pub fn latency_with_sums(&self) -> (blk::QueueStats, [u64; 4]) {
        let g = self.published.lock().unwrap_or_else(|e| e.into_inner());
        (g.stats.clone(), g.latency_ns_sum)
    }

    /// The queue's binding: (subsystem NQN, controller id, queue id).
    pub fn binding(&self) -> Option<(String, Cntlid, u16)> {
        self.binding.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the queue's binding after Connect.
    pub fn bind(&self, subnqn: &str, cntlid: Cntlid, qid: u16) {
        *self.binding.lock().unwrap_or_else(|e| e.into_inner()) = Some((subnqn.to_string(), cntlid, qid));
    }

    fn report(&self) -> QueueReport {
        let b = self.binding.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (subnqn, cntlid, qid) = b.unwrap_or((String::new(), Cntlid(0), 0));
        QueueReport {
            port: self.port,
            peer: self.peer.map(|p| p.to_string()).unwrap_or_default(),
            reactor: self.reactor,
            subnqn,
            cntlid: cntlid.0,
            qid,
            secure_channel: self.secure_channel.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone(),
            stats: self.stats.snapshot(),
        }
    }
}

/// Referrals a discovery log may list at once.
pub const MAX_REFERRALS: usize = 64;

/// The well-known NVMe/TCP discovery port (IANA 8009), a referral's default.
pub const DISCOVERY_TRSVCID: u16 = 8009;

/// A referral: another discovery service (or an NVM subsystem elsewhere) that this
/// target's discovery log points hosts to (nvmet's `ports/N/referrals`, SPDK's
/// `nvmf_discovery_add_referral`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Referral {
    /// Its IP address (TRADDR; ADRFAM follows from it).
    pub address: std::net::IpAddr,
    /// Its TCP port (TRSVCID).
    pub port: u16,
    /// The NQN to connect to there (the discovery NQN unless it refers to an NVM subsystem).
    pub subnqn: String,
}

impl Referral {
    /// A referral, checked: a valid NQN.
    pub fn new(address: std::net::IpAddr, port: u16, subnqn: Option<&str>) -> Result<Referral, Error> {
        let subnqn = subnqn.unwrap_or(nvme::nqn::DISCOVERY_NQN).to_string();
        nvme::nqn::validate(&subnqn)
            .map_err(|e| Error::new(ErrorKind::Config, format!("referral subnqn {subnqn:?}: {e}")))?;
        Ok(Referral { address, port, subnqn })
    }

    /// How the discovery log names it: SUBTYPE 1 (referral to a discovery service) for the
    /// discovery NQN, 2 (NVM subsystem) otherwise, as SPDK does (`spdk_nvmf_tgt_add_referral`).
    pub fn subtype(&self) -> u8 {
        if self.subnqn == nvme::nqn::DISCOVERY_NQN { subtype::REFERRAL } else { subtype::NVM }
    }
}

impl std::fmt::Display for Referral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.subnqn, SocketAddr::new(self.address, self.port))
    }
}

/// The target's shared state.
#[derive(Debug)]
pub struct TargetState {
    /// Options.
    pub opts: TargetOptions,
    /// Connection limits and timeouts in force (changeable at run time).
    pub limits: Arc<Limits>,
    ports: RwLock<Vec<Arc<Port>>>,
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    referrals: RwLock<Vec<Referral>>,
    /// The discovery subsystem.
    pub discovery: Arc<Subsystem>,
    ana_chgcnt: AtomicU64,
    disc_genctr: AtomicU64,
    epoch: Instant,
    /// A simulator's virtual clock (ns since the target epoch) in place of `epoch`:
    /// `now_ns` reads it, so a simulated run never reads the wall clock.
    virtual_now_ns: Option<Arc<AtomicU64>>,
    queues: Mutex<Vec<Weak<QueueInfo>>>,
    /// Each reactor's data buffers, published on its tick.
    buffers: Mutex<Vec<Arc<BufferStats>>>,
    /// Each port's monotonic I/O totals, by port id (kept when the port goes, so a port
    /// added again under its id continues its counts).
    port_totals: Mutex<std::collections::BTreeMap<u16, Arc<crate::stats::PortTotals>>>,
    /// Where the reactors send the Diffie-Hellman steps of in-band authentication.
    pub auth_workers: crate::offload::AuthWorkers,
    /// How in-band authentication transactions ended.
    pub auth_outcomes: crate::auth::AuthCounters,
    /// The TLS server configuration, made on the first TLS connection ([`crate::tls`]).
    pub tls: crate::tls::TargetTls,
}

/// One reactor's data buffer pool, as its reactor last published it (every 10 ms tick;
/// nothing per I/O).
#[derive(Debug, Default)]
pub struct BufferStats {
    /// The reactor's index.
    pub reactor: usize,
    /// Bytes in buffers handed out now.
    pub outstanding_bytes: AtomicU64,
    /// Bytes in idle buffers kept for reuse (at most `buffer_pool_bytes`).
    pub cached_bytes: AtomicU64,
    /// Buffers allocated so far.
    pub allocations: AtomicU64,
    /// Returned buffers freed because keeping them would pass the cap.
    pub released: AtomicU64,
}

impl BufferStats {
    /// Copies the pool's numbers (the owning reactor, on its tick).
    pub fn publish(&self, pool: &crate::pool::BufPool) {
        self.outstanding_bytes.store(pool.outstanding() as u64, Ordering::Relaxed);
        self.cached_bytes.store(pool.cached() as u64, Ordering::Relaxed);
        self.allocations.store(pool.allocations, Ordering::Relaxed);
        self.released.store(pool.released, Ordering::Relaxed);
    }
}

impl TargetState {
    /// An empty target.
    pub fn new(opts: TargetOptions) -> TargetState {
        TargetState {
            opts,
            limits: Arc::new(Limits::new(&opts)),
            ports: RwLock::new(Vec::new()),
            subsystems: RwLock::new(Vec::new()),
            referrals: RwLock::new(Vec::new()),
            discovery: Arc::new(Subsystem::discovery()),
            ana_chgcnt: AtomicU64::new(1),
            disc_genctr: AtomicU64::new(1),
            epoch: Instant::now(),
            virtual_now_ns: None,
            queues: Mutex::new(Vec::new()),
            buffers: Mutex::new(Vec::new()),
            port_totals: Mutex::new(std::collections::BTreeMap::new()),
            auth_workers: crate::offload::AuthWorkers::new(opts.auth_workers),
            auth_outcomes: crate::auth::AuthCounters::default(),
            tls: crate::tls::TargetTls::default(),
        }
    }

    /// An empty target whose time is `clock` (ns since its epoch), advanced by its driver:
    /// the deterministic simulator (`qpath sim`) runs the target on virtual time.
    pub fn with_virtual_clock(opts: TargetOptions, clock: Arc<AtomicU64>) -> TargetState {
        TargetState { virtual_now_ns: Some(clock), ..TargetState::new(opts) }
    }

    /// Nanoseconds since the target started (monotonic).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        if let Some(v) = &self.virtual_now_ns {
            return v.load(Ordering::Relaxed);
        }
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Milliseconds since the target started.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Adds a port.
    pub fn add_port(&self, id: u16, addr: SocketAddr, kind: PortKind) -> Result<Arc<Port>, Error> {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if ports.iter().any(|p| p.id == id) {
            return Err(Error::new(ErrorKind::Exists, format!("port id {id} exists")));
        }
        if ports.iter().any(|p| p.addr == addr) {
            return Err(Error::new(ErrorKind::Exists, format!("port address {addr} exists")));
        }
        let p = Arc::new(Port::new(id, addr, kind));
        ports.push(Arc::clone(&p));
        self.bump_discovery();
        Ok(p)
    }

    /// Every port.
    pub fn ports(&self) -> Vec<Arc<Port>> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The port with this id.
    pub fn port(&self, id: u16) -> Option<Arc<Port>> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).iter().find(|p| p.id == id).cloned()
    }

    /// Removes port `id`: its connections close on their next tick (their controllers go
    /// as when the link goes), and discovery controllers get a discovery-log-change event
    /// (those on other ports are the ones left to read it). The id may be added again.
    /// The listener is the server's to stop ([`crate::server::Server::remove_port`]).
    pub fn remove_port(&self, id: u16) -> Result<Arc<Port>, Error> {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        let i = ports
            .iter()
            .position(|p| p.id == id)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no port {id}")))?;
        let p = ports.remove(i);
        drop(ports);
        p.mark_removed();
        tracing::info!(port = id, addr = %p.addr, "port removed");
        self.bump_discovery();
        Ok(p)
    }

    /// Adds a referral to the discovery log (every port's); discovery controllers get a
    /// discovery-log-change event.
    pub fn add_referral(&self, r: Referral) -> Result<(), Error> {
        let mut refs = self.referrals.write().unwrap_or_else(|e| e.into_inner());
        if refs.contains(&r) {
            return Err(Error::new(ErrorKind::Exists, format!("referral to {r} exists")));
        }
        if refs.len() >= MAX_REFERRALS {
            return Err(Error::new(ErrorKind::Config, format!("at most {MAX_REFERRALS} referrals")));
        }
        tracing::info!(referral = %r, "referral added");
        refs.push(r);
        drop(refs);
        self.bump_discovery();
        Ok(())
    }

    /// Removes a referral; discovery controllers get a discovery-log-change event.
    pub fn remove_referral(&self, r: &Referral) -> Result<(), Error> {
        let mut refs = self.referrals.write().unwrap_or_else(|e| e.into_inner());
        let i = refs
            .iter()
            .position(|x| x == r)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no referral to {r}")))?;
        refs.remove(i);
        drop(refs);
        tracing::info!(referral = %r, "referral removed");
        self.bump_discovery();
        Ok(())
    }

    /// Every referral.
    pub fn referrals(&self) -> Vec<Referral> {
        self.referrals.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds a subsystem.
    pub fn add_subsystem(&self, s: Subsystem) -> Result<Arc<Subsystem>, Error> {
        let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
        if s.nqn == nvme::nqn::DISCOVERY_NQN || subs.iter().any(|x| x.nqn == s.nqn) {
            return Err(Error::new(ErrorKind::Exists, format!("subsystem {} exists", s.nqn)));
        }
        let s = Arc::new(s);
        subs.push(Arc::clone(&s));
        drop(subs);
        self.bump_discovery();
        Ok(s)
    }

    /// Removes a subsystem; its controllers fail.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<(), Error> {
        let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
        let i = subs
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no subsystem {nqn}")))?;
        let s = subs.remove(i);
        drop(subs);
        for ns in s.namespaces().0.iter() {
            ns.backend.retire();
        }
        for c in s.controllers() {
            c.fail("subsystem removed");
        }
        self.bump_discovery();
        Ok(())
    }

    /// The subsystem (or the discovery subsystem) with this NQN.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == nvme::nqn::DISCOVERY_NQN {
            return Some(Arc::clone(&self.discovery));
        }
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).iter().find(|s| s.nqn == nqn).cloned()
    }

    /// Every NVM subsystem.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The target-wide ANA change count.
    pub fn ana_chgcnt(&self) -> u64 {
        self.ana_chgcnt.load(Ordering::Relaxed)
    }

    /// Sets the state of ANA group `group` on port `port_id` and sends an
    /// ANA change event to every controller on that port whose subsystem has
    /// a namespace in the group.
    pub fn set_ana_state(&self, port_id: u16, group: AnaGrpId, state: AnaState) -> Result<bool, Error> {
        if group.0 == 0 || group.0 > ANA_GROUPS {
            return Err(Error::new(ErrorKind::Config, format!("ANA group {} out of range 1..={ANA_GROUPS}", group.0)));
        }
        let port = self.port(port_id).ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no port {port_id}")))?;
        let cnt = self.ana_chgcnt.fetch_add(1, Ordering::Relaxed) + 1;
        if !port.set_ana_state(group, state, cnt) {
            return Ok(false);
        }
        tracing::info!(port = port_id, group = group.0, state = state.linux_name(), "ANA state changed");
        for s in self.subsystems() {
            for c in s.controllers() {
                // Only controllers whose host sees a namespace of the group: the others'
                // ANA logs do not change.
                if c.port.id == port_id && c.namespaces().iter().any(|n| n.anagrpid == group) {
                    c.add_event(AsyncEvent::ANA_CHANGE);
                }
            }
        }
        Ok(true)
    }

    /// Replaces `s`'s allowed hosts. Revoking is immediate: the controllers of hosts no
    /// longer allowed fail (their queues close on the next tick, and a reconnect is refused),
    /// and discovery controllers get a discovery-log-change event, since what a host's log
    /// shows may have changed. Returns how many controllers failed.
    pub fn set_host_access(&self, s: &Subsystem, access: HostAccess) -> usize {
        s.set_access(access);
        let mut failed = 0;
        for c in s.controllers() {
            if !s.allows_host(&c.hostnqn) {
                tracing::info!(subnqn = %s.nqn, hostnqn = %c.hostnqn, cntlid = c.cntlid.0, "host no longer allowed");
                c.fail("host no longer allowed");
                failed += 1;
            }
        }
        self.bump_discovery();
        failed
    }

    /// Something discovery logs show changed (a subsystem's ports): discovery controllers
    /// get a discovery-log-change event.
    pub fn discovery_changed(&self) {
        self.bump_discovery();
    }

    fn bump_discovery(&self) {
        self.disc_genctr.fetch_add(1, Ordering::Relaxed);
        for c in self.discovery.controllers() {
            c.add_event(AsyncEvent::DISCOVERY_CHANGE);
        }
    }

    /// The discovery log `hostnqn` sees through `via`: one entry per
    /// (subsystem it may reach, I/O port the subsystem is on), the current discovery
    /// subsystem through `via`, then the referrals.
    pub fn discovery_log(&self, hostnqn: &str, via: &Port) -> DiscoveryLog {
        let mut entries = Vec::new();
        let ports = self.ports();
        let entry = |p: &Port, st: u8, nqn: &str| DiscoveryEntry {
            trtype: trtype::TCP,
            adrfam: if p.addr.is_ipv4() { adrfam::IPV4 } else { adrfam::IPV6 },
            subtype: st,
            // TREQ and TSAS's SECTYPE: what the port's TLS setting promises.
            treq: p.tls.get().treq(),
            portid: p.id,
            cntlid: Cntlid::DYNAMIC,
            asqsz: 32,
            eflags: 0,
            trsvcid: p.trsvcid(),
            subnqn: nqn.to_string(),
            traddr: p.traddr(),
            tsas: {
                let mut t = [0u8; 256];
                t[0] = p.tls.get().sectype();
                t
            },
        };
        for s in self.subsystems() {
            if s.kind != SubsysKind::Nvm || !s.allows_host(hostnqn) {
                continue;
            }
            for p in ports.iter().filter(|p| p.kind == PortKind::Io && s.on_port(p.id)) {
                entries.push(entry(p, subtype::NVM, &s.nqn));
            }
        }
        // The discovery subsystem itself, reachable through the port asked on
        // (NVMe-oF 1.1 §5.3: "current discovery subsystem" entry). Its EFLAGS say what
        // this discovery controller does, as SPDK sets them (ctrlr_discovery.c; Linux
        // nvmet leaves them 0): connecting to it returns this same log (DUPRETINFO), and
        // it keeps explicit persistent connections, with Keep Alive and discovery log
        // change events (EPCSD).
        let mut current = entry(via, subtype::CURRENT_DISCOVERY, nvme::nqn::DISCOVERY_NQN);
        current.eflags = eflags::DUPRETINFO | eflags::EPCSD;
        entries.push(current);
        // Referrals, as nvmet lists a port's referrals: the remote address and port, the
        // NQN to connect to there, no port id of ours, nothing promised about that service.
        for r in self.referrals() {
            entries.push(DiscoveryEntry {
                trtype: trtype::TCP,
                adrfam: if r.address.is_ipv4() { adrfam::IPV4 } else { adrfam::IPV6 },
                subtype: r.subtype(),
                treq: 0x02,
                portid: 0,
                cntlid: Cntlid::DYNAMIC,
                asqsz: 32,
                eflags: 0,
                trsvcid: r.port.to_string(),
                subnqn: r.subnqn.clone(),
                traddr: r.address.to_string(),
                tsas: [0; 256],
            });
        }
        DiscoveryLog { genctr: self.disc_genctr.load(Ordering::Relaxed), recfmt: 0, entries }
    }

    /// Registers a new connection's queue info.
    pub fn register_queue(&self, port: u16, peer: Option<SocketAddr>, reactor: usize) -> Arc<QueueInfo> {
        let q = Arc::new(QueueInfo {
            port,
            peer,
            reactor,
            stats: QueueStats::default(),
            secure_channel: Mutex::new(None),
            binding: Mutex::new(None),
            published: Mutex::new(Published::default()),
        });
        let mut list = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() > 64 && list.len().is_power_of_two() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(Arc::downgrade(&q));
        q
    }

    /// A reactor's buffer statistics, registered when it starts (control plane).
    pub fn register_buffers(&self, reactor: usize) -> Arc<BufferStats> {
        let b = Arc::new(BufferStats { reactor, ..BufferStats::default() });
        self.buffers.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&b));
        b
    }

    /// Port `id`'s totals, made at its first connection (control plane: once per connection).
    pub fn port_totals(&self, id: u16) -> Arc<crate::stats::PortTotals> {
        let mut g = self.port_totals.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(g.entry(id).or_default())
    }

    /// Every port's totals that a connection has made, by port id.
    pub fn all_port_totals(&self) -> Vec<(u16, crate::stats::PortCounters)> {
        let g = self.port_totals.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().map(|(id, t)| (*id, t.snapshot())).collect()
    }

    /// Every reactor's buffer statistics.
    pub fn buffer_stats(&self) -> Vec<Arc<BufferStats>> {
        self.buffers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every live queue's info (for statistics).
    pub fn queue_infos(&self) -> Vec<Arc<QueueInfo>> {
        let mut list = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Every live queue.
    pub fn queues(&self) -> Vec<QueueReport> {
        let mut list = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).map(|q| q.report()).collect()
    }
}
