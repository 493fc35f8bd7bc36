//! `qpath discover`, `qpath connect`, `qpath list-subsys`: nvme-cli's
//! commands for a user-space host. A user-space stack creates no kernel
//! device, so `connect` connects, reports, optionally checks I/O or holds
//! the connection, then disconnects.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use host::controller::{ConnectOptions, Controller, default_host_identity};
use host::discovery::{discover_all_tls, entry_addr, subtype_name};
use host::tls::HostTls;
use nvme::log::subtype;

/// Transport arguments shared by the host commands (nvme-cli's names).
#[derive(clap::Args, Debug, Clone)]
pub struct Transport {
    /// Transport address (IP or host name).
    #[arg(short = 'a', long, default_value = "127.0.0.1")]
    traddr: String,
    /// Transport service id, the TCP port [default: 4420]. 4420 is where `qpath target`
    /// serves discovery as well as I/O, as Linux nvmet does on every port it is given;
    /// nvme-cli's discover defaults to 8009, the port of a dedicated discovery
    /// controller: pass -s 8009 for one.
    #[arg(short = 's', long)]
    trsvcid: Option<u16>,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from the machine id).
    #[arg(short = 'q', long)]
    hostnqn: Option<String>,
    /// Host Identifier, a UUID (default: /etc/nvme/hostid, else derived from the machine id).
    /// Reservations tell hosts apart by it.
    #[arg(short = 'I', long, value_parser = parse_hostid)]
    hostid: Option<[u8; 16]>,
}

fn parse_hostid(s: &str) -> Result<[u8; 16], String> {
    nvme::nqn::parse_uuid(s).ok_or_else(|| format!("{s:?}: not a UUID"))
}

impl Transport {
    pub(crate) fn addr(&self, default_port: u16) -> Result<SocketAddr, String> {
        let port = self.trsvcid.unwrap_or(default_port);
        (self.traddr.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", self.traddr))?
            .next()
            .ok_or_else(|| format!("{} resolves to nothing", self.traddr))
    }

    pub(crate) fn identity(&self) -> (String, [u8; 16]) {
        let (nqn, id) = default_host_identity();
        (self.hostnqn.clone().unwrap_or(nqn), self.hostid.unwrap_or(id))
    }
}

/// Connection options (nvme-cli's names).
#[derive(clap::Args, Debug, Clone)]
pub struct ConnArgs {
    /// I/O queues (default: one per CPU).
    #[arg(short = 'i', long)]
    nr_io_queues: Option<u16>,
    /// Entries per I/O queue.
    #[arg(short = 'Q', long, default_value_t = 128)]
    queue_size: u16,
    /// Header digest.
    #[arg(short = 'g', long)]
    hdr_digest: bool,
    /// Data digest.
    #[arg(short = 'G', long)]
    data_digest: bool,
    /// Keep-alive timeout in seconds.
    #[arg(short = 'k', long, default_value_t = 5)]
    keep_alive_tmo: u32,
    /// Seconds between reconnect attempts.
    #[arg(short = 'c', long, default_value_t = 10)]
    reconnect_delay: u64,
    /// Seconds without a connection before the controller is deleted (-1 = forever).
    #[arg(short = 'l', long, default_value_t = 600, allow_hyphen_values = true)]
    ctrl_loss_tmo: i64,
    /// Seconds after which I/O waiting for a reconnect fails (-1 = off).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    fast_io_fail_tmo: i64,
    /// DH-HMAC-CHAP host secret (DHHC-1:..., as `nvme gen-dhchap-key` prints it).
    #[arg(short = 'S', long)]
    dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP controller secret: the controller must authenticate too.
    #[arg(short = 'C', long)]
    dhchap_ctrl_secret: Option<String>,
    /// Secure channel concatenation (as `nvme connect --concat`, Linux 6.15+): the admin
    /// queue authenticates in plaintext (needs --dhchap-secret, and a DH group on the
    /// controller's side), which makes a TLS key; then every queue runs inside TLS 1.3 with
    /// it. Every reconnect does it again. Not with --tls-key.
    #[arg(long)]
    concat: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

/// The secure channel (TLS 1.3 with a pre-shared key), as `nvme connect --tls`.
#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// Run every queue inside TLS 1.3 (needs --tls-key). `list-subsys` also uses TLS for
    /// the subsystems whose discovery entries require it.
    #[arg(long)]
    tls: bool,
    /// The configured TLS PSK: `NVMeTLSkey-1:01:...:` (`qpath gen-tls-key`, `nvme
    /// gen-tls-key`), or the path of a file holding it. Never printed.
    #[arg(long)]
    tls_key: Option<String>,
    /// The PSK identity version to present: 1 (with the PSK digest; Linux 6.14+) or 0.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    tls_identity: u8,
    /// Hand each queue's TLS records to the kernel after its handshake where the kernel
    /// offers kernel TLS (auto), or keep them in user space (off).
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    tls_offload: String,
}

impl TlsArgs {
    /// The key, when one was given (`--tls` without a key is an error).
    pub(crate) fn host_tls(&self) -> Result<Option<HostTls>, String> {
        let Some(k) = &self.tls_key else {
            return if self.tls {
                Err("--tls needs --tls-key (a key, or a file holding one)".into())
            } else {
                Ok(None)
            };
        };
        let text = if k.trim_start().starts_with("NVMeTLSkey-") {
            k.clone()
        } else {
            std::fs::read_to_string(k).map_err(|e| format!("TLS key file {k}: {e}"))?
        };
        let mut t = HostTls::parse(&text).map_err(|e| format!("TLS key: {e}"))?;
        if self.tls_identity == 0 {
            t.identity = tls::psk::IdentityVersion::V0;
        }
        Ok(Some(t))
    }
}

impl ConnArgs {
    fn options(
        &self,
        addr: SocketAddr,
        nqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        tls: Option<&HostTls>,
    ) -> ConnectOptions {
        let mut o = ConnectOptions::new(addr, nqn);
        o.hostnqn = hostnqn.to_string();
        o.hostid = hostid;
        o.nr_io_queues = self.nr_io_queues.unwrap_or(0);
        o.queue_size = self.queue_size;
        o.hdr_digest = self.hdr_digest;
        o.data_digest = self.data_digest;
        o.kato_ms = self.keep_alive_tmo.saturating_mul(1000);
        o.reconnect_delay = Duration::from_secs(self.reconnect_delay);
        o.ctrl_loss_tmo = u64::try_from(self.ctrl_loss_tmo).ok().map(Duration::from_secs);
        o.fast_io_fail_tmo = u64::try_from(self.fast_io_fail_tmo).ok().map(Duration::from_secs);
        o.dhchap_secret.clone_from(&self.dhchap_secret);
        o.dhchap_ctrl_secret.clone_from(&self.dhchap_ctrl_secret);
        o.tls = tls.cloned();
        o.concat = self.concat;
        o.tls_offload = tls::kernel::Offload::parse(&self.tls.tls_offload).unwrap_or_default();
        o
    }
}

/// `qpath discover`.
#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    transport: Transport,
    #[command(flatten)]
    tls: TlsArgs,
}

/// `qpath connect`.
#[derive(clap::Args, Debug)]
pub struct ConnectArgs {
    #[command(flatten)]
    transport: Transport,
    #[command(flatten)]
    conn: ConnArgs,
    /// Subsystem NQN.
    #[arg(short = 'n', long)]
    nqn: String,
    /// Keep the connection this many seconds before disconnecting.
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// Once connected, re-authenticate every queue of the live controller (DH-HMAC-CHAP,
    /// as Linux does when its dhchap_secret is written); fails if any queue's
    /// transaction fails.
    #[arg(long)]
    reauthenticate: bool,
    /// With --reauthenticate: the host secret to re-authenticate with (a key rotation;
    /// the controller must already hold it).
    #[arg(long, requires = "reauthenticate")]
    reauth_secret: Option<String>,
    /// With --reauthenticate: the controller secret to re-authenticate with.
    #[arg(long, requires = "reauth_secret")]
    reauth_ctrl_secret: Option<String>,
}

/// `qpath list-subsys`.
#[derive(clap::Args, Debug)]
pub struct ListSubsysArgs {
    #[command(flatten)]
    transport: Transport,
    #[command(flatten)]
    conn: ConnArgs,
}

type R = Result<(), Box<dyn std::error::Error>>;

/// Where `discover` and `list-subsys` look with no `-s`: the port the default
/// `qpath target` serves discovery on (and Linux nvmet on its usual ports), not
/// nvme-cli's 8009, which only a dedicated discovery controller listens on.
const DEFAULT_DISCOVERY_PORT: u16 = nvme::tcp::IO_PORT;

pub fn discover(a: DiscoverArgs) -> R {
    let addr = a.transport.addr(DEFAULT_DISCOVERY_PORT)?;
    let (hostnqn, hostid) = a.transport.identity();
    let tls = a.tls.host_tls()?;
    let found = discover_all_tls(addr, &hostnqn, hostid, Duration::from_secs(5), 16, tls.as_ref())
        .map_err(|e| format!("discovery at {addr}: {e}"))?;
    println!("\nDiscovery Log Number of Records {}", found.len());
    for (i, f) in found.iter().enumerate() {
        let e = &f.entry;
        println!("=====Discovery Log Entry {i}======");
        println!("trtype:  {}", if e.trtype == nvme::log::trtype::TCP { "tcp" } else { "other" });
        println!("adrfam:  {}", if e.adrfam == nvme::log::adrfam::IPV6 { "ipv6" } else { "ipv4" });
        println!("subtype: {}", subtype_name(e.subtype));
        println!("treq:    {}", if e.treq & 3 == 1 { "required" } else { "not required" });
        println!("sectype: {}", if e.tsas[0] == 2 { "tls13" } else { "none" });
        println!("portid:  {}", e.portid);
        println!("trsvcid: {}", e.trsvcid);
        println!("subnqn:  {}", e.subnqn);
        println!("traddr:  {}", e.traddr);
        println!("via:     {}", f.via);
    }
    Ok(())
}

fn print_ctrl(c: &Controller) {
    let i = c.info();
    println!(
        "{} cntlid {} {} (model {:?}, serial {:?}, fw {:?}): {} I/O queues, state {:?}",
        i.traddr, i.cntlid, i.subnqn, i.model, i.serial, i.firmware, i.io_queues, i.state
    );
    for ns in c.namespaces() {
        println!(
            "  nsid {:>4}  {:>12} bytes  {} B blocks  ANA group {} {}  nguid {}",
            ns.nsid,
            ns.size_bytes(),
            ns.block_size(),
            ns.anagrpid.0,
            ns.ana_state.linux_name(),
            nvme::nqn::hex(&ns.nguid)
        );
    }
}

pub fn connect(a: ConnectArgs) -> R {
    let addr = a.transport.addr(nvme::tcp::IO_PORT)?;
    let (hostnqn, hostid) = a.transport.identity();
    let tls = a.conn.tls.host_tls()?;
    let ctrl = Controller::connect(a.conn.options(addr, &a.nqn, &hostnqn, hostid, tls.as_ref()))?;
    print_ctrl(&ctrl);
    if a.reauthenticate {
        let keys = host::auth::DhchapKeys::parse(a.reauth_secret.as_deref(), a.reauth_ctrl_secret.as_deref())?;
        let r = ctrl.reauthenticate(keys, ctrl.opts.connect_timeout.max(Duration::from_secs(30)));
        let r = match r {
            Ok(r) if r.failed.is_empty() => r,
            Ok(r) => {
                ctrl.delete();
                let failed: Vec<String> = r.failed.iter().map(|(qid, e)| format!("queue {qid}: {e}")).collect();
                return Err(format!(
                    "re-authentication failed on {} I/O queue(s): {}",
                    failed.len(),
                    failed.join("; ")
                )
                .into());
            }
            Err(e) => {
                ctrl.delete();
                return Err(format!("re-authentication of the admin queue failed: {e}").into());
            }
        };
        println!("re-authenticated admin + {} I/O queues in {} ms", r.io_queues, r.took.as_millis());
    }
    if a.hold > 0 {
        std::thread::sleep(Duration::from_secs(a.hold));
        print_ctrl(&ctrl);
    }
    ctrl.delete();
    Ok(())
}

pub fn list_subsys(a: ListSubsysArgs) -> R {
    let addr = a.transport.addr(DEFAULT_DISCOVERY_PORT)?;
    let (hostnqn, hostid) = a.transport.identity();
    let key = a.conn.tls.host_tls()?;
    // Discovery itself inside TLS only when asked (--tls): a TLS discovery port needs it.
    let disc_tls = if a.conn.tls.tls { key.as_ref() } else { None };
    let found = discover_all_tls(addr, &hostnqn, hostid, Duration::from_secs(5), 16, disc_tls)
        .map_err(|e| format!("discovery at {addr}: {e}"))?;
    let mut ctrls: Vec<Arc<Controller>> = Vec::new();
    for f in found.iter().filter(|f| f.entry.subtype == subtype::NVM) {
        let ea = entry_addr(&f.entry)?;
        // TREQ says whether the subsystem requires TLS there (NVMe-oF 1.1 Figure 38).
        let required = f.entry.treq & 3 == 1;
        let tls = match (&key, required || a.conn.tls.tls) {
            (Some(k), true) => Some(k),
            (None, true) if required => {
                eprintln!("{} {}: requires TLS: give --tls-key", ea, f.entry.subnqn);
                continue;
            }
            _ => None,
        };
        match Controller::connect(a.conn.options(ea, &f.entry.subnqn, &hostnqn, hostid, tls)) {
            Ok(c) => ctrls.push(c),
            Err(e) => eprintln!("{} {}: {e}", ea, f.entry.subnqn),
        }
    }
    let mut nqns: Vec<String> = ctrls.iter().map(|c| c.opts.subnqn.clone()).collect();
    nqns.sort();
    nqns.dedup();
    for nqn in nqns {
        println!("{nqn}");
        println!("\\");
        for c in ctrls.iter().filter(|c| c.opts.subnqn == nqn) {
            let i = c.info();
            let ana: Vec<String> =
                c.namespaces().iter().map(|n| format!("ns{} {}", n.nsid, n.ana_state.linux_name())).collect();
            println!(
                " +- cntlid {} tcp traddr={},trsvcid={} {:?} [{}]",
                i.cntlid,
                i.traddr.ip(),
                i.traddr.port(),
                i.state,
                ana.join(", ")
            );
        }
    }
    for c in ctrls {
        c.delete();
    }
    Ok(())
}
