//! The running configuration, saved and re-read: what an operator changed over RPC
//! survives a restart, and an edited file is applied without one.
//!
//! ```text
//!   running state ──running_config()──► Config ──to_toml()──► file (atomic, .bak kept)
//!   file ──Config::load──► Config ──reload(): difference with running_config()──► the
//!                                      RPC-level operations (TargetState, Subsystem, Server)
//! ```
//!
//! * **Save** ([`save`], RPC `save_config`, and after every change under `--persist`): the
//!   configuration is derived from what runs, not from a log of the calls that made it:
//!   ports as bound, the limits in force, every subsystem with its hosts and keys, every
//!   namespace with its size as it is now, QoS, visibility, ANA states, referrals. It is
//!   written as the TOML `qpath target --config` reads ([`crate::config`]), atomically: a new
//!   file in the same directory, fsync, the previous file kept as `FILE.bak` (a hard link),
//!   rename over the old one, fsync of the directory. A crash at any point leaves the old
//!   file or the new one whole, never a mix.
//! * **Secrets**: a DH-HMAC-CHAP key read from a file (`dhchap_key_file`) is saved as that
//!   file's name; a key given inline is saved inline, and the file then gets mode 0600 and
//!   the save's log line says so. No log line, RPC answer or error carries a key.
//! * **Reload** ([`reload`], SIGHUP): the file is read again and the difference with what
//!   runs is applied through the same operations the RPCs use, touching nothing the
//!   difference does not name: connections of hosts and namespaces it leaves alone go on.
//!   What cannot change live is refused for that object, with a log line naming it; a file
//!   that does not parse or check changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvme::{AnaGrpId, AnaState, Nsid};

use crate::backend::Backend;
use crate::config::{
    AnaConfig, Config, HostAuthConfig, HostEntry, NamespaceConfig, PortConfig, ReferralConfig, RpcConfig, SizeValue,
    SubsystemConfig, VisibleTo, add_namespace, add_subsystem,
};
use crate::error::{Error, ErrorKind};
use crate::limits::LimitSettings;
use crate::namespace::Visibility;
use crate::port::ANA_GROUPS;
use crate::server::Server;
use crate::subsystem::{HostAccess, Subsystem};

/// When the configuration is saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveMode {
    /// Only when asked (`save_config`).
    OnDemand,
    /// After every change, before the change's RPC answers (`--persist`).
    EveryChange,
}

/// Changes the command line makes to a configuration file's contents (`--listen`, ...):
/// applied at start and again to the file a reload reads.
pub type Overrides = dyn Fn(&mut Config) + Send + Sync;

/// Where and when a running target's configuration is saved.
pub struct Persist {
    /// The file the target started from (and reloads, and saves to by default).
    pub file: Option<PathBuf>,
    /// When it is saved.
    pub mode: SaveMode,
    /// The RPC settings in force (not part of the target's state).
    pub rpc: RpcConfig,
    /// The command line's changes to the file's contents.
    pub overrides: Box<Overrides>,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist").field("file", &self.file).field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// What a save did, as RPC answers it (no secret in it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Saved {
    /// The file written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: usize,
    /// Its mode (octal text, "0600").
    pub mode: String,
    /// Whether it holds DH-HMAC-CHAP secrets inline (and so has mode 0600).
    pub inline_secrets: bool,
    /// The previous file, kept as it was (none when there was no previous file).
    pub backup: Option<PathBuf>,
}

/// The running configuration: everything [`Config::start`] needs to build this target again.
pub fn running_config(server: &Server) -> Result<Config, Error> {
    let st = &server.state;
    let mut options = st.opts;
    let l = st.limits.get();
    options.max_connections_per_port = l.max_connections_per_port.unwrap_or(options.max_connections_per_port);
    options.max_connections_per_host = l.max_connections_per_host.unwrap_or(options.max_connections_per_host);
    options.max_connections_per_hostnqn = l.max_connections_per_hostnqn.unwrap_or(options.max_connections_per_hostnqn);
    options.connect_timeout_ms = l.connect_timeout_ms.unwrap_or(options.connect_timeout_ms);
    options.pdu_timeout_ms = l.pdu_timeout_ms.unwrap_or(options.pdu_timeout_ms);
    options.max_buffer_bytes_per_connection =
        l.max_buffer_bytes_per_connection.unwrap_or(options.max_buffer_bytes_per_connection);
    options.rx_budget_pdus = l.rx_budget_pdus.unwrap_or(options.rx_budget_pdus);
    options.tx_batch_bytes = l.tx_batch_bytes.unwrap_or(options.tx_batch_bytes);
    options.tx_deadline_us = l.tx_deadline_us.unwrap_or(options.tx_deadline_us);
    let ports = st.ports();
    let mut ana = Vec::new();
    for p in &ports {
        for g in 1..=ANA_GROUPS {
            let s = p.ana_state(AnaGrpId(g));
            if s != AnaState::Optimized {
                ana.push(AnaConfig { port: p.id, group: g, state: s.linux_name().to_string() });
            }
        }
    }
    let subsystems = st.subsystems().iter().map(|s| subsystem_config(s)).collect::<Result<Vec<_>, _>>()?;
    Ok(Config {
        options,
        reactor: server.reactor_options().clone(),
        rpc: server.persist().map(|p| p.rpc.clone()).unwrap_or_default(),
        ports: ports
            .iter()
            .map(|p| PortConfig {
                id: p.id,
                addr: p.addr.to_string(),
                kind: p.kind,
                tls: p.tls.get(),
                tls_offload: p.tls.offload(),
            })
            .collect(),
        subsystems,
        ana,
        referrals: st
            .referrals()
            .into_iter()
            .map(|r| ReferralConfig { address: r.address.to_string(), port: r.port, subnqn: Some(r.subnqn) })
            .collect(),
    })
}

/// A host's entry as a save writes it: its NQN, or a table with its DH-HMAC-CHAP keys.
fn host_entry(a: Option<&Arc<crate::auth::HostAuth>>, nqn: String) -> HostEntry {
    let Some(a) = a else { return HostEntry::Nqn(nqn) };
    HostEntry::Auth(HostAuthConfig {
        dhchap_key: a.key_files.host.is_none().then(|| a.host_key.to_string()),
        dhchap_key_file: a.key_files.host.clone(),
        dhchap_ctrl_key: if a.key_files.ctrl.is_none() { a.ctrl_key.as_ref().map(ToString::to_string) } else { None },
        dhchap_ctrl_key_file: a.key_files.ctrl.clone(),
        hash: Some(a.hash.linux_name().to_string()),
        dhgroup: Some(a.dhgroup.name().to_string()),
        nqn,
        tls_key: None,
        tls_key_file: None,
    })
}

fn subsystem_config(s: &Subsystem) -> Result<SubsystemConfig, Error> {
    let access = s.access();
    let auths: BTreeMap<String, _> = s.host_auths().into_iter().collect();
    let tls_keys: BTreeMap<String, _> = s.host_tls_keys().into_iter().collect();
    let mut listed: Vec<String> = access.hosts.clone();
    // Keys of a host not in the list (it gets in through allow_any_host): listed on
    // restore, which lets in no one more than allow_any_host already does.
    for h in auths.keys().chain(tls_keys.keys()) {
        if !listed.contains(h) {
            listed.push(h.clone());
        }
    }
    let hosts = listed
        .into_iter()
        .map(|nqn| {
            let mut e = host_entry(auths.get(&nqn), nqn);
            if let HostEntry::Nqn(n) = &e
                && tls_keys.contains_key(n)
            {
                e = HostEntry::Auth(HostAuthConfig { nqn: n.clone(), ..HostAuthConfig::default() });
            }
            let key = tls_keys.get(e.nqn()).cloned();
            if let (HostEntry::Auth(a), Some(k)) = (&mut e, key) {
                // A key from a file stays a reference to its file; an inline key is written inline.
                a.tls_key_file = k.file.clone();
                a.tls_key = k.file.is_none().then(|| k.key.to_interchange().to_string());
            }
            e
        })
        .collect();
    let (map, _) = s.namespaces();
    let mut namespaces = Vec::new();
    for n in map.iter() {
        let (backend, path, size) = match &n.backend {
            Backend::Null => ("null", None, n.size_bytes()),
            Backend::Ram(r) => ("ram", None, r.len() as u64),
            Backend::File(f) => {
                // The file's size as it is now (after a resize, the new one): a start
                // refuses a size that differs from an existing file's.
                let meta = f.file().metadata().map_err(|e| {
                    Error::io(format!("namespace {} of {}: size of {}", n.nsid, s.nqn, f.path.display()), e)
                })?;
                let size = if meta.file_type().is_file() { meta.len() } else { f.size };
                ("file", Some(f.path.clone()), size)
            }
        };
        let (visible, ns_hosts) = match n.visibility() {
            Visibility::All => (VisibleTo::All, vec![]),
            Visibility::Listed(h) => (VisibleTo::Listed, h.into_iter().collect()),
        };
        namespaces.push(NamespaceConfig {
            nsid: n.nsid.0,
            backend: backend.to_string(),
            size: Some(SizeValue::Bytes(size)),
            path,
            grow: false,
            block_size: n.block_size(),
            ana_group: n.anagrpid.0,
            readonly: n.readonly,
            ptpl_file: n.origin.ptpl_file.clone(),
            uuid: Some(nvme::nqn::format_uuid(&n.uuid)),
            qos: n.qos.get(),
            prefault: n.origin.prefault,
            huge_pages: n.origin.huge_pages,
            max_size: n.origin.max_size.map(SizeValue::Bytes),
            visible,
            hosts: ns_hosts,
        });
    }
    Ok(SubsystemConfig {
        nqn: s.nqn.clone(),
        serial: Some(s.serial.clone()),
        model: s.model.clone(),
        allow_any_host: access.allow_any,
        hosts,
        ports: s.ports(),
        max_io_queues: Some(s.limits.max_io_queues),
        queue_size: Some(s.limits.max_queue_entries),
        namespaces,
    })
}

/// Whether `c` holds a DH-HMAC-CHAP secret inline (not as a file's name).
pub fn has_inline_secrets(c: &Config) -> bool {
    c.subsystems.iter().flat_map(|s| &s.hosts).any(|h| match h {
        HostEntry::Nqn(_) => false,
        HostEntry::Auth(a) => a.dhchap_key.is_some() || a.dhchap_ctrl_key.is_some() || a.tls_key.is_some(),
    })
}

/// `c` as the TOML text a save writes: a comment saying who wrote it and when, then the
/// configuration.
pub fn to_toml(c: &Config) -> Result<String, Error> {
    let body = toml::to_string(c).map_err(|e| Error::new(ErrorKind::Config, format!("configuration as TOML: {e}")))?;
    let mut text = format!(
        "# Written by qpath {} at {} from the running target (save_config).\n",
        env!("CARGO_PKG_VERSION"),
        uring::file::utc_rfc3339(std::time::SystemTime::now())
    );
    if has_inline_secrets(c) {
        text += "# It holds DH-HMAC-CHAP secrets: keep it mode 0600.\n";
    }
    text += "\n";
    text += &body;
    Ok(text)
}

/// Saves the running configuration to `path`, or to the file the target started from.
/// The caller holds [`Server::lock_changes`].
pub fn save_locked(server: &Server, path: Option<&Path>) -> Result<Saved, Error> {
    let path = match (path, server.persist().and_then(|p| p.file.as_deref())) {
        (Some(p), _) | (None, Some(p)) => p.to_path_buf(),
        (None, None) => {
            return Err(Error::new(
                ErrorKind::Config,
                "save_config: the target started from no configuration file: give a path",
            ));
        }
    };
    let c = running_config(server)?;
    let inline_secrets = has_inline_secrets(&c);
    let text = to_toml(&c)?;
    let mode = if inline_secrets {
        0o600
    } else {
        std::fs::metadata(&path).map_or(0o644, |m| m.permissions().mode() & 0o7777)
    };
    let backup = uring::file::write_atomically(&path, &text, mode).map_err(|e| {
        let kind = if e.source.kind() == std::io::ErrorKind::InvalidInput { ErrorKind::Config } else { ErrorKind::Io };
        Error::new(kind, format!("save the configuration to {}: {e}", path.display()))
    })?;
    if inline_secrets {
        tracing::info!(file = %path.display(), mode = "0600", "configuration saved; it holds DH-HMAC-CHAP secrets inline, so only its owner may read it");
    } else {
        tracing::info!(file = %path.display(), mode = format!("{mode:04o}"), "configuration saved");
    }
    Ok(Saved { path, bytes: text.len(), mode: format!("{mode:04o}"), inline_secrets, backup })
}

/// [`save_locked`], taking the change lock.
pub fn save(server: &Server, path: Option<&Path>) -> Result<Saved, Error> {
    let _changes = server.lock_changes();
    save_locked(server, path)
}

/// Called after RPC `method` changed the configuration (with the change lock held): under
/// [`SaveMode::EveryChange`] saves it, and a failed save fails the call with an error that
/// says the change is in force but not saved, and why.
pub fn changed(server: &Server, method: &str) -> Result<(), Error> {
    let Some(p) = server.persist() else { return Ok(()) };
    if p.mode != SaveMode::EveryChange {
        return Ok(());
    }
    save_locked(server, None).map(|_| ()).map_err(|e| {
        tracing::error!(method, "a change is in force but not saved: {}", e.context);
        Error::new(e.kind, format!("{method}: the change is in force but not saved: {}", e.context))
    })
}

/// What a reload did: one line per change applied and per object it could not change.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reloaded {
    /// Changes applied.
    pub applied: Vec<String>,
    /// Objects left as they run, and why.
    pub refused: Vec<String>,
}

impl Reloaded {
    fn applied(&mut self, what: String) {
        tracing::info!("reload: {what}");
        self.applied.push(what);
    }

    fn refused(&mut self, what: String) {
        tracing::warn!("reload: {what}");
        self.refused.push(what);
    }

    fn result(&mut self, what: String, r: Result<(), Error>) {
        match r {
            Ok(()) => self.applied(what),
            Err(e) => self.refused(format!("{what}: not applied: {e}")),
        }
    }
}

/// Reads the file the target started from again and applies the difference with what
/// runs (see the module docs). A file that does not parse or check changes nothing.
pub fn reload(server: &Server) -> Result<Reloaded, Error> {
    let p = server
        .persist()
        .and_then(|p| p.file.as_ref().map(|f| (f, p)))
        .ok_or_else(|| Error::new(ErrorKind::Config, "reload: the target started from no configuration file"))?;
    let (file, persist) = p;
    let mut next = Config::load(file).map_err(|e| {
        tracing::error!("reload of {} refused, nothing changed: {e}", file.display());
        e
    })?;
    (persist.overrides)(&mut next);
    let _changes = server.lock_changes();
    let checked = check(&next).map_err(|e| {
        tracing::error!("reload of {} refused, nothing changed: {e}", file.display());
        Error::new(e.kind, format!("{}: {}", file.display(), e.context))
    })?;
    let now = running_config(server)?;
    let mut out = Reloaded::default();
    apply(server, &now, &next, &checked, &mut out);
    tracing::info!(
        file = %file.display(),
        applied = out.applied.len(),
        refused = out.refused.len(),
        "configuration reloaded"
    );
    Ok(out)
}

/// A new configuration's values that need checking before anything is applied.
struct Checked {
    ana: BTreeMap<(u16, u32), AnaState>,
    referrals: Vec<crate::registry::Referral>,
    auth: BTreeMap<(String, String), Option<crate::auth::HostAuth>>,
    tls_keys: BTreeMap<(String, String), Option<crate::tls::HostTlsKey>>,
    addrs: BTreeMap<u16, std::net::SocketAddr>,
}

fn check(c: &Config) -> Result<Checked, Error> {
    let o = &c.options;
    let limits = [o.max_connections_per_port, o.max_connections_per_host, o.max_connections_per_hostnqn];
    if limits.contains(&0)
        || o.connect_timeout_ms == 0
        || o.pdu_timeout_ms == 0
        || o.max_buffer_bytes_per_connection == 0
    {
        return Err(Error::new(ErrorKind::Config, "connection limits and timeouts must be at least 1"));
    }
    let mut addrs = BTreeMap::new();
    for p in &c.ports {
        if addrs.insert(p.id, crate::server::parse_addr(&p.addr)?).is_some() {
            return Err(Error::new(ErrorKind::Config, format!("port id {} given twice", p.id)));
        }
    }
    let mut ana = BTreeMap::new();
    for a in &c.ana {
        let s = AnaState::parse(&a.state)
            .ok_or_else(|| Error::new(ErrorKind::Config, format!("ANA state {:?}", a.state)))?;
        if a.group == 0 || a.group > ANA_GROUPS {
            return Err(Error::new(ErrorKind::Config, format!("ANA group {} out of range 1..={ANA_GROUPS}", a.group)));
        }
        ana.insert((a.port, a.group), s);
    }
    let referrals = c.referrals.iter().map(ReferralConfig::to_referral).collect::<Result<Vec<_>, _>>()?;
    let mut auth = BTreeMap::new();
    let mut tls_keys = BTreeMap::new();
    let mut nqns = BTreeSet::new();
    for s in &c.subsystems {
        if !nqns.insert(s.nqn.as_str()) {
            return Err(Error::new(ErrorKind::Config, format!("subsystem {} given twice", s.nqn)));
        }
        for h in &s.hosts {
            let a = match h {
                HostEntry::Nqn(_) => None,
                HostEntry::Auth(a) => a.to_host_auth()?,
            };
            auth.insert((s.nqn.clone(), h.nqn().to_string()), a);
            let k = match h {
                HostEntry::Nqn(_) => None,
                HostEntry::Auth(a) => a.to_tls_key()?,
            };
            tls_keys.insert((s.nqn.clone(), h.nqn().to_string()), k);
        }
        for n in &s.namespaces {
            n.visibility()?;
            n.size.as_ref().map(SizeValue::bytes).transpose()?;
            n.max_size.as_ref().map(SizeValue::bytes).transpose()?;
        }
    }
    Ok(Checked { ana, referrals, auth, tls_keys, addrs })
}

/// The NSIDs a start would give `namespaces` (0 = the first one free, in order).
fn resolve_nsids(namespaces: &[NamespaceConfig]) -> Vec<u32> {
    let mut used: BTreeSet<u32> = namespaces.iter().map(|n| n.nsid).filter(|&n| n != 0).collect();
    namespaces
        .iter()
        .map(|n| {
            if n.nsid != 0 {
                return n.nsid;
            }
            let free = (1..=crate::namespace::MAX_NSID).find(|i| !used.contains(i)).unwrap_or(0);
            used.insert(free);
            free
        })
        .collect()
}

/// The options a start sets for good (the rest are limits `set_limits` changes live).
fn fixed_options(o: &crate::registry::TargetOptions) -> crate::registry::TargetOptions {
    let d = crate::registry::TargetOptions::default();
    crate::registry::TargetOptions {
        max_connections_per_port: d.max_connections_per_port,
        max_connections_per_host: d.max_connections_per_host,
        max_connections_per_hostnqn: d.max_connections_per_hostnqn,
        connect_timeout_ms: d.connect_timeout_ms,
        pdu_timeout_ms: d.pdu_timeout_ms,
        max_buffer_bytes_per_connection: d.max_buffer_bytes_per_connection,
        rx_budget_pdus: d.rx_budget_pdus,
        tx_batch_bytes: d.tx_batch_bytes,
        tx_deadline_us: d.tx_deadline_us,
        ..*o
    }
}

fn apply(server: &Server, now: &Config, next: &Config, checked: &Checked, out: &mut Reloaded) {
    let st = &server.state;
    // Settings only a start applies.
    if fixed_options(&now.options) != fixed_options(&next.options) {
        out.refused("options other than the connection limits and fairness budgets change at the next start".into());
    }
    if format!("{:?}", now.reactor) != format!("{:?}", next.reactor) {
        out.refused("reactor settings change at the next start".into());
    }
    // Limits.
    let limits = LimitSettings {
        max_connections_per_port: Some(next.options.max_connections_per_port),
        max_connections_per_host: Some(next.options.max_connections_per_host),
        max_connections_per_hostnqn: Some(next.options.max_connections_per_hostnqn),
        connect_timeout_ms: Some(next.options.connect_timeout_ms),
        pdu_timeout_ms: Some(next.options.pdu_timeout_ms),
        max_buffer_bytes_per_connection: Some(next.options.max_buffer_bytes_per_connection),
        rx_budget_pdus: Some(next.options.rx_budget_pdus),
        tx_batch_bytes: Some(next.options.tx_batch_bytes),
        tx_deadline_us: Some(next.options.tx_deadline_us),
    };
    if st.limits.get() != limits {
        out.result("limits".into(), st.limits.set(&limits).map_err(|e| Error::new(ErrorKind::Config, e)));
    }
    apply_ports(server, now, next, checked, out);
    // Subsystems: removed, changed, added.
    let wanted: BTreeMap<&str, &SubsystemConfig> = next.subsystems.iter().map(|s| (s.nqn.as_str(), s)).collect();
    for s in &now.subsystems {
        if !wanted.contains_key(s.nqn.as_str()) {
            out.result(format!("subsystem {} removed", s.nqn), st.remove_subsystem(&s.nqn));
        }
    }
    for s in &next.subsystems {
        match (now.subsystems.iter().find(|x| x.nqn == s.nqn), st.subsystem(&s.nqn)) {
            (Some(old), Some(sub)) => apply_subsystem(&sub, old, s, checked, server, out),
            _ => out.result(format!("subsystem {} added", s.nqn), add_subsystem(st, s).map(|_| ())),
        }
    }
    // ANA states, on every port now there.
    for p in st.ports() {
        for g in 1..=ANA_GROUPS {
            let want = checked.ana.get(&(p.id, g)).copied().unwrap_or(AnaState::Optimized);
            if p.ana_state(AnaGrpId(g)) != want {
                out.result(
                    format!("ANA group {g} on port {}: {}", p.id, want.linux_name()),
                    st.set_ana_state(p.id, AnaGrpId(g), want).map(|_| ()),
                );
            }
        }
    }
    for (port, g) in checked.ana.keys() {
        if st.port(*port).is_none() {
            out.refused(format!("ANA group {g} on port {port}: no such port"));
        }
    }
    // Referrals.
    let running = st.referrals();
    for r in running.iter().filter(|r| !checked.referrals.contains(r)) {
        out.result(format!("referral to {r} removed"), st.remove_referral(r));
    }
    for r in checked.referrals.iter().filter(|r| !running.contains(r)) {
        out.result(format!("referral to {r} added"), st.add_referral(r.clone()));
    }
}

fn apply_ports(server: &Server, now: &Config, next: &Config, checked: &Checked, out: &mut Reloaded) {
    let same = |a: &PortConfig, b: &PortConfig| {
        let (Ok(x), Some(y)) = (crate::server::parse_addr(&a.addr), checked.addrs.get(&b.id)) else { return false };
        // Port 0 in the file asks for any free port: the one bound is as good.
        a.kind == b.kind && x.ip() == y.ip() && (y.port() == 0 || x.port() == y.port())
    };
    for p in &now.ports {
        match next.ports.iter().find(|n| n.id == p.id) {
            Some(n) if same(p, n) => {
                if let Some(port) = server.state.port(p.id)
                    && port.tls.get() != n.tls
                {
                    // New connections follow it; open ones keep what they have.
                    port.tls.set(n.tls);
                    server.state.discovery_changed();
                    out.applied(format!("port {}: tls {}", p.id, n.tls.name()));
                }
            }
            _ => out.result(format!("port {} ({}) removed", p.id, p.addr), server.remove_port(p.id)),
        }
    }
    for n in &next.ports {
        if server.state.port(n.id).is_none() {
            let addr = checked.addrs[&n.id];
            out.result(
                format!("port {} ({}) added", n.id, n.addr),
                server.add_port_secure(n.id, addr, n.kind, n.tls, n.tls_offload).map(|_| ()),
            );
        }
    }
}

fn apply_subsystem(
    sub: &Arc<Subsystem>,
    old: &SubsystemConfig,
    new: &SubsystemConfig,
    checked: &Checked,
    server: &Server,
    out: &mut Reloaded,
) {
    let st = &server.state;
    let nqn = &new.nqn;
    // Identity and queue limits are fixed for a subsystem's life (hosts cache them).
    let fixed = [
        ("serial", new.serial.as_ref().is_some_and(|s| Some(s) != old.serial.as_ref())),
        ("model", new.model != old.model),
        ("max_io_queues", new.max_io_queues.is_some_and(|q| Some(q.max(1)) != old.max_io_queues)),
        ("queue_size", new.queue_size.is_some_and(|q| Some(q.clamp(2, 4096)) != old.queue_size)),
    ];
    for (what, changed) in fixed {
        if changed {
            out.refused(format!(
                "subsystem {nqn}: {what} changes at the next start (or remove and add the subsystem): not applied"
            ));
        }
    }
    // Hosts: the access list, then the keys.
    let access =
        HostAccess { allow_any: new.allow_any_host, hosts: new.hosts.iter().map(|h| h.nqn().to_string()).collect() };
    let running = sub.access();
    let as_set = |a: &HostAccess| (a.allow_any, a.hosts.iter().cloned().collect::<BTreeSet<_>>());
    if as_set(&running) != as_set(&access) {
        for h in running.hosts.iter().filter(|h| !access.hosts.contains(h)) {
            // A removed host keeps no keys either (as remove_host).
            sub.set_host_auth(h, None);
        }
        let failed = st.set_host_access(sub, access.clone());
        out.applied(format!(
            "subsystem {nqn}: hosts {:?}, any host {} ({failed} controllers failed)",
            access.hosts, access.allow_any
        ));
    }
    let keys: BTreeMap<String, _> = sub.host_auths().into_iter().collect();
    for h in &access.hosts {
        let want = checked.auth.get(&(nqn.clone(), h.clone())).cloned().flatten();
        if keys.get(h).map(|a| a.as_ref()) != want.as_ref() {
            let what = if want.is_some() { "keys set" } else { "keys cleared" };
            sub.set_host_auth(h, want);
            out.applied(format!("subsystem {nqn}: host {h}: DH-HMAC-CHAP {what}"));
        }
    }
    for h in keys.keys().filter(|h| !access.hosts.contains(h)) {
        sub.set_host_auth(h, None);
        out.applied(format!("subsystem {nqn}: host {h}: DH-HMAC-CHAP keys cleared"));
    }
    let tls_now: BTreeMap<String, _> = sub.host_tls_keys().into_iter().collect();
    for h in &access.hosts {
        let want = checked.tls_keys.get(&(nqn.clone(), h.clone())).cloned().flatten();
        if tls_now.get(h).map(|k| k.as_ref()) != want.as_ref() {
            let what = if want.is_some() { "set" } else { "cleared" };
            sub.set_host_tls_key(h, want);
            out.applied(format!("subsystem {nqn}: host {h}: TLS key {what}"));
        }
    }
    for h in tls_now.keys().filter(|h| !access.hosts.contains(h)) {
        sub.set_host_tls_key(h, None);
        out.applied(format!("subsystem {nqn}: host {h}: TLS key cleared"));
    }
    if sub.ports() != new.ports {
        sub.set_ports(new.ports.clone());
        st.discovery_changed();
        out.applied(format!("subsystem {nqn}: ports {:?}", new.ports));
    }
    // Namespaces.
    let nsids = resolve_nsids(&new.namespaces);
    for o in &old.namespaces {
        if !nsids.contains(&o.nsid) {
            out.result(format!("namespace {} of {nqn} removed", o.nsid), sub.remove_namespace(Nsid(o.nsid)));
        }
    }
    for (n, &nsid) in new.namespaces.iter().zip(&nsids) {
        let mut n = n.clone();
        n.nsid = nsid;
        match old.namespaces.iter().find(|o| o.nsid == nsid) {
            None => out.result(format!("namespace {nsid} of {nqn} added"), add_namespace(sub, &n).map(|_| ())),
            Some(o) => apply_namespace(sub, o, &n, out),
        }
    }
}

/// What of a namespace a reload cannot change in place: a difference here means the
/// namespace is removed and added again.
fn fixed_part(n: &NamespaceConfig, running: &NamespaceConfig) -> Vec<&'static str> {
    let mut d = Vec::new();
    let bytes = |v: &Option<SizeValue>| v.as_ref().and_then(|s| s.bytes().ok());
    let uuid = |s: &Option<String>| s.as_deref().and_then(nvme::nqn::parse_uuid);
    if n.backend != running.backend {
        d.push("backend");
    }
    if n.backend == "file" && n.path != running.path {
        d.push("path");
    }
    if n.block_size != running.block_size {
        d.push("block_size");
    }
    if n.ana_group != running.ana_group {
        d.push("ana_group");
    }
    if n.readonly != running.readonly {
        d.push("readonly");
    }
    if n.ptpl_file != running.ptpl_file {
        d.push("ptpl_file");
    }
    if n.uuid.is_some() && uuid(&n.uuid) != uuid(&running.uuid) {
        d.push("uuid");
    }
    if n.backend == "ram"
        && (n.prefault != running.prefault
            || n.huge_pages != running.huge_pages
            || bytes(&n.max_size) != bytes(&running.max_size))
    {
        d.push("RAM settings");
    }
    d
}

fn apply_namespace(sub: &Subsystem, running: &NamespaceConfig, n: &NamespaceConfig, out: &mut Reloaded) {
    let nqn = &sub.nqn;
    let nsid = Nsid(n.nsid);
    let fixed = fixed_part(n, running);
    if !fixed.is_empty() {
        // Cannot change in place: the namespace goes and comes back (hosts see it go and
        // come back through their Changed Namespace List).
        let what = format!("namespace {nsid} of {nqn} ({} changed) removed and added again", fixed.join(", "));
        let r = sub.remove_namespace(nsid).and_then(|()| add_again(sub, n));
        out.result(what, r);
        return;
    }
    if let Some(size) = n.size.as_ref().and_then(|s| s.bytes().ok())
        && Some(size) != running.size.as_ref().and_then(|s| s.bytes().ok())
    {
        out.result(
            format!("namespace {nsid} of {nqn} resized to {size} bytes"),
            sub.resize_namespace(nsid, size).map(|_| ()),
        );
    }
    if n.qos != running.qos {
        let (map, _) = sub.namespaces();
        if let Some(ns) = map.get(nsid) {
            ns.qos.set(n.qos);
            out.applied(format!("namespace {nsid} of {nqn}: QoS {:?}", n.qos));
        }
    }
    if n.visible != running.visible || n.hosts.iter().collect::<BTreeSet<_>>() != running.hosts.iter().collect() {
        let r = n.visibility().and_then(|v| sub.set_ns_visibility(nsid, v)).map(|_| ());
        out.result(format!("namespace {nsid} of {nqn}: visibility"), r);
    }
}

/// Adds a namespace that was just removed: its file may still be held for a moment by the
/// commands that were in flight on the old one, so a refusal is tried again for a second.
fn add_again(sub: &Subsystem, n: &NamespaceConfig) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match add_namespace(sub, n) {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::call;
    use serde_json::json;

    const NQN: &str = "nqn.2026-11.io.qpath:persist";
    const NQN2: &str = "nqn.2026-11.io.qpath:persist2";
    const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
    const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b";
    const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c";

    /// A directory of its own for one test, removed at the end.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("qpath-persist-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn key() -> String {
        nvme::auth::Secret::generate(Some(nvme::auth::HashId::Sha256), 32).unwrap().to_string()
    }

    /// The configuration without its first comment lines (the time it was written).
    fn body(c: &Config) -> String {
        let t = to_toml(c).unwrap();
        t.lines().skip_while(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n")
    }

    fn start(text: &str) -> Server {
        Config::parse(text).unwrap().start().unwrap()
    }

    fn rpc(s: &Server, m: &str, p: serde_json::Value) -> serde_json::Value {
        call(s, m, &p).unwrap_or_else(|e| panic!("{m}: {e}"))
    }

    /// Every field a save writes, changed from its default by the config or by an RPC,
    /// comes back the same after TOML → parse → start → save.
    #[test]
    fn the_running_state_round_trips_through_toml() {
        let d = Dir::new("round");
        let (img, ptpl, keyfile, ctrlfile) =
            (d.0.join("vol.img"), d.0.join("vol.resv"), d.0.join("host.key"), d.0.join("ctrl.key"));
        let (file_key, file_ctrl, inline) = (key(), key(), key());
        std::fs::write(&keyfile, format!("{file_key}\n")).unwrap();
        std::fs::write(&ctrlfile, &file_ctrl).unwrap();
        let text = format!(
            r#"
            [options]
            in_capsule_data_size = 4096
            [reactor]
            reactors = 1
            poll = "block"
            [[port]]
            id = 1
            addr = "127.0.0.1:0"
            [[port]]
            id = 2
            addr = "127.0.0.1:0"
            [[port]]
            id = 7
            addr = "127.0.0.1:0"
            kind = "discovery"
            [[subsystem]]
            nqn = "{NQN}"
            serial = "SER1"
            model = "persisted"
            hosts = ["{HOST_A}", {{ nqn = "{HOST_B}", dhchap_key_file = "{}", dhchap_ctrl_key_file = "{}", hash = "sha384", dhgroup = "ffdhe2048" }}]
            ports = [1, 2]
            max_io_queues = 4
            queue_size = 64
            [[subsystem.namespace]]
            nsid = 3
            backend = "file"
            path = "{}"
            size = "1M"
            block_size = 4096
            ana_group = 2
            ptpl_file = "{}"
            [[subsystem.namespace]]
            nsid = 5
            backend = "ram"
            size = "2M"
            max_size = "8M"
            prefault = true
            huge_pages = true
            uuid = "12345678-9abc-4def-8123-456789abcdef"
            [[subsystem.namespace]]
            nsid = 6
            backend = "null"
            size = "1G"
            readonly = true
            visible = "listed"
            hosts = ["{HOST_A}"]
            "#,
            keyfile.display(),
            ctrlfile.display(),
            img.display(),
            ptpl.display(),
        );
        let s = start(&text);
        // Changes made over RPC, one of each kind that a save must carry.
        rpc(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 3, "size": "2M"}));
        rpc(&s, "resize_namespace", json!({"nqn": NQN, "nsid": 5, "size": "4M"}));
        rpc(&s, "set_qos", json!({"nqn": NQN, "nsid": 5, "iops": 900, "bytes_per_sec": 1_000_000, "delay_us": 7}));
        rpc(&s, "ns_add_host", json!({"nqn": NQN, "nsid": 6, "host": HOST_C}));
        rpc(&s, "set_host_auth", json!({"nqn": NQN, "host": HOST_C, "dhchap_key": inline, "hash": "sha512"}));
        rpc(&s, "set_ana_state", json!({"port": 2, "group": 2, "state": "inaccessible"}));
        rpc(&s, "set_ana_state", json!({"port": 1, "group": 3, "state": "non-optimized"}));
        rpc(&s, "add_referral", json!({"address": "192.0.2.7", "port": 4420, "subnqn": NQN2}));
        rpc(&s, "set_limits", json!({"max_connections_per_hostnqn": 33, "pdu_timeout_ms": 1234, "tx_deadline_us": 0}));
        rpc(
            &s,
            "add_subsystem",
            json!({"nqn": NQN2, "allow_any_host": true, "namespace": [{"backend": "ram", "size": "1M"}]}),
        );
        let before = running_config(&s).unwrap();
        let saved = body(&before);
        let (a_keys, a_subs) = (s.state.subsystem(NQN).unwrap().host_keys(), s.state.subsystems().len());
        s.shutdown();

        // What the text says, field by field (what the round trip compares is only as
        // good as what is in it).
        for want in [
            "in_capsule_data_size = 4096",
            "max_connections_per_hostnqn = 33",
            "pdu_timeout_ms = 1234",
            "tx_deadline_us = 0",
            "serial = \"SER1\"",
            "model = \"persisted\"",
            "ports = [1, 2]",
            "max_io_queues = 4",
            "queue_size = 64",
            &format!("dhchap_key_file = \"{}\"", keyfile.display()),
            &format!("dhchap_ctrl_key_file = \"{}\"", ctrlfile.display()),
            "hash = \"hmac(sha384)\"",
            "dhgroup = \"ffdhe2048\"",
            &format!("dhchap_key = \"{inline}\""),
            "size = 2097152",
            "block_size = 4096",
            "ana_group = 2",
            &format!("ptpl_file = \"{}\"", ptpl.display()),
            "size = 4194304",
            "max_size = 8388608",
            "prefault = true",
            "huge_pages = true",
            "uuid = \"12345678-9abc-4def-8123-456789abcdef\"",
            "readonly = true",
            "visible = \"listed\"",
            &format!("hosts = [\"{HOST_A}\", \"{HOST_C}\"]"),
            "iops = 900",
            "bytes_per_sec = 1000000",
            "delay_us = 7",
            "state = \"inaccessible\"",
            "state = \"non-optimized\"",
            "address = \"192.0.2.7\"",
            &format!("subnqn = \"{NQN2}\""),
            "kind = \"discovery\"",
        ] {
            assert!(saved.contains(want), "the saved configuration lacks {want:?}:\n{saved}");
        }
        assert!(!saved.contains(&file_key) && !saved.contains(&file_ctrl), "keys from files stay in their files");
        assert!(to_toml(&before).unwrap().starts_with("# Written by qpath "));

        // Parse it and start from it: the same state, saved again, is the same text.
        let again = Config::parse(&to_toml(&before).unwrap()).unwrap().start().unwrap();
        let after = running_config(&again).unwrap();
        assert_eq!(body(&after), saved, "running → TOML → running changed something");
        assert_eq!(again.state.subsystem(NQN).unwrap().host_keys(), a_keys, "same keys (fingerprints)");
        assert_eq!(again.state.subsystems().len(), a_subs);
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 2 << 20, "the file has its resized size");
        again.shutdown();
    }

    #[test]
    fn a_save_is_atomic_keeps_a_backup_and_hides_inline_secrets() {
        let d = Dir::new("atomic");
        let f = d.0.join("target.toml");
        let s = start(&format!(
            "[reactor]\nreactors = 1\npoll = \"block\"\n[[subsystem]]\nnqn = \"{NQN}\"\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1M\"\n"
        ));
        let e = save(&s, None).unwrap_err().to_string();
        assert!(e.contains("started from no configuration file") && e.contains("give a path"), "{e}");
        let first = save(&s, Some(&f)).unwrap();
        assert_eq!((first.backup.as_ref(), first.inline_secrets, first.mode.as_str()), (None, false, "0644"));
        let old = std::fs::read_to_string(&f).unwrap();
        let secret = key();
        rpc(&s, "set_host_auth", json!({"nqn": NQN, "host": HOST_A, "dhchap_key": secret}));
        let second = save(&s, Some(&f)).unwrap();
        assert!(second.inline_secrets);
        assert_eq!(second.backup.as_deref(), Some(d.0.join("target.toml.bak").as_path()));
        assert_eq!(std::fs::read_to_string(d.0.join("target.toml.bak")).unwrap(), old, "the previous file kept");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a file with a secret inline is its owner's only");
        assert!(std::fs::read_to_string(&f).unwrap().contains(&secret));
        assert!(!serde_json::to_string(&second).unwrap().contains(&secret), "the answer holds no secret");
        let leftovers: Vec<_> = std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 2, "only the file and its .bak: {leftovers:?}");
        // Saved through a link, the link stays and the file it names is replaced.
        let link = d.0.join("link.toml");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let previous = std::fs::read_to_string(&f).unwrap();
        save(&s, Some(&link)).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "still a link");
        assert_eq!(std::fs::read_to_string(d.0.join("target.toml.bak")).unwrap(), previous, "the file it names kept");
        std::fs::remove_file(&link).unwrap();
        // A directory that is not there: the error says where and why, nothing is written.
        let e = save(&s, Some(&d.0.join("missing/target.toml"))).unwrap_err().to_string();
        assert!(e.contains("missing/target.toml") && e.contains("No such file"), "{e}");
        assert!(!e.contains(&secret));
        s.shutdown();
    }

    #[test]
    fn under_persist_every_change_is_saved_and_a_failed_save_fails_the_change() {
        let d = Dir::new("every");
        let f = d.0.join("target.toml");
        let text = format!(
            "[reactor]\nreactors = 1\npoll = \"block\"\n[[subsystem]]\nnqn = \"{NQN}\"\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1M\"\n"
        );
        std::fs::write(&f, &text).unwrap();
        let s = Config::load(&f).unwrap().start().unwrap();
        s.set_persist(Persist {
            file: Some(f.clone()),
            mode: SaveMode::EveryChange,
            rpc: RpcConfig::default(),
            overrides: Box::new(|_| {}),
        })
        .unwrap();
        rpc(&s, "add_host", json!({"nqn": NQN, "host": HOST_A}));
        assert!(std::fs::read_to_string(&f).unwrap().contains(HOST_A), "saved before the answer");
        assert_eq!(std::fs::read_to_string(d.0.join("target.toml.bak")).unwrap(), text);
        // Reading methods do not save.
        std::fs::remove_file(&f).unwrap();
        rpc(&s, "list_subsystems", json!({}));
        assert!(!f.exists());
        // A save that cannot be made: the change is in force, the answer says it is not saved.
        std::fs::create_dir(&f).unwrap();
        let e = call(&s, "add_host", &json!({"nqn": NQN, "host": HOST_B})).unwrap_err().to_string();
        assert!(e.starts_with("add_host: the change is in force but not saved: "), "{e}");
        assert!(e.contains(&f.display().to_string()), "{e}");
        assert!(s.state.subsystem(NQN).unwrap().allows_host(HOST_B), "in force");
        s.shutdown();
    }

    #[test]
    fn a_reload_applies_the_difference_and_refuses_what_cannot_change() {
        let d = Dir::new("reload");
        let f = d.0.join("target.toml");
        let base = |extra: &str, ns: &str| {
            format!(
                "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:0\"\n{extra}[[subsystem]]\nnqn = \"{NQN}\"\nserial = \"S1\"\nhosts = [\"{HOST_A}\", \"{HOST_B}\"]\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1M\"\n{ns}"
            )
        };
        std::fs::write(&f, base("", "")).unwrap();
        let s = Config::load(&f).unwrap().start().unwrap();
        s.set_persist(Persist {
            file: Some(f.clone()),
            mode: SaveMode::OnDemand,
            rpc: RpcConfig::default(),
            overrides: Box::new(|_| {}),
        })
        .unwrap();
        let port1 = s.local_addr(1).unwrap();
        // A file that does not parse changes nothing.
        std::fs::write(&f, "[[subsystem]\n").unwrap();
        assert!(reload(&s).is_err());
        assert_eq!(s.state.subsystem(NQN).unwrap().namespaces().0.len(), 1);
        // One that parses but names a bad key changes nothing either.
        std::fs::write(
            &f,
            base("", "").replace(
                &format!("\"{HOST_B}\""),
                &format!("{{ nqn = \"{HOST_B}\", dhchap_key = \"DHHC-1:01:AAAA:\" }}"),
            ),
        )
        .unwrap();
        let e = reload(&s).unwrap_err().to_string();
        assert!(e.contains(HOST_B) && !e.contains("AAAA"), "{e}");
        // A namespace added, one resized, a host removed, a key, QoS, a limit, a referral,
        // an ANA state, a second port; a serial change refused.
        let secret = key();
        let next = base(
            "[options]\nmax_connections_per_host = 9\n[[port]]\nid = 2\naddr = \"127.0.0.1:0\"\n[[ana]]\nport = 2\ngroup = 1\nstate = \"non-optimized\"\n[[referral]]\naddress = \"192.0.2.1\"\n",
            "qos = { iops = 77 }\n[[subsystem.namespace]]\nnsid = 2\nbackend = \"null\"\nsize = \"1M\"\n",
        )
        .replace("size = \"1M\"\nqos", "size = \"2M\"\nqos")
        .replace(&format!("\"{HOST_B}\""), &format!("{{ nqn = \"{HOST_C}\", dhchap_key = \"{secret}\" }}"))
        .replace("serial = \"S1\"", "serial = \"S2\"");
        std::fs::write(&f, &next).unwrap();
        let r = reload(&s).unwrap();
        let sub = s.state.subsystem(NQN).unwrap();
        let (map, _) = sub.namespaces();
        assert_eq!(map.get(Nsid(1)).unwrap().size_bytes(), 2 << 20, "{r:?}");
        assert_eq!(map.get(Nsid(1)).unwrap().qos.get().iops, 77);
        assert!(map.get(Nsid(2)).is_some(), "{r:?}");
        assert!(sub.allows_host(HOST_A) && !sub.allows_host(HOST_B) && sub.allows_host(HOST_C));
        assert!(sub.host_auth(HOST_C).is_some());
        assert_eq!(s.state.limits.get().max_connections_per_host, Some(9));
        assert_eq!(s.state.referrals().len(), 1);
        assert_eq!(s.state.port(2).unwrap().ana_state(AnaGrpId(1)), AnaState::NonOptimized);
        assert_eq!(s.local_addr(1), Some(port1), "port 1 untouched (port 0 in the file: any)");
        assert_eq!(sub.serial, "S1");
        assert_eq!(r.refused.len(), 1, "{r:?}");
        assert!(r.refused[0].contains("serial") && r.refused[0].contains(NQN), "{r:?}");
        assert!(r.applied.iter().all(|l| !l.contains(&secret)), "no secret in what a reload says");
        // Reloading the same file again changes nothing.
        let r = reload(&s).unwrap();
        assert!(r.applied.is_empty(), "{r:?}");
        // A port and a namespace removed, a backend changed (removed and added again).
        std::fs::write(
            &f,
            next.replace("nsid = 2\nbackend = \"null\"", "nsid = 2\nbackend = \"ram\"")
                .replace("[[port]]\nid = 2\naddr = \"127.0.0.1:0\"\n", "")
                .replace("[[ana]]\nport = 2\ngroup = 1\nstate = \"non-optimized\"\n", ""),
        )
        .unwrap();
        let r = reload(&s).unwrap();
        assert!(s.state.port(2).is_none(), "{r:?}");
        assert!(matches!(sub.namespaces().0.get(Nsid(2)).unwrap().backend, Backend::Ram(_)), "{r:?}");
        assert!(r.applied.iter().any(|l| l.contains("backend changed")), "{r:?}");
        s.shutdown();
    }
}
