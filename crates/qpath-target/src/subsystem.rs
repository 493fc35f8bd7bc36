//! NVM subsystems: an NQN, identity strings, the hosts allowed in, the ports
//! it is exposed on, its namespaces and its controllers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use nvme::{Cntlid, Nsid};

use crate::auth::HostAuth;
use crate::controller::Controller;
use crate::error::{Error, ErrorKind};
use crate::namespace::{Namespace, NamespaceSpec, NsMap, NsOrigin, Visibility};

/// What kind of subsystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubsysKind {
    /// An NVM subsystem with namespaces.
    Nvm,
    /// The discovery subsystem.
    Discovery,
}

/// Who may connect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostAccess {
    /// Any host NQN may connect (only when configured so).
    pub allow_any: bool,
    /// Allowed host NQNs.
    pub hosts: Vec<String>,
}

impl HostAccess {
    /// Whether `hostnqn` may connect.
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any || self.hosts.iter().any(|h| h == hostnqn)
    }
}

/// Limits of a subsystem's controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubsysLimits {
    /// I/O queues a controller may create.
    pub max_io_queues: u16,
    /// Entries per queue (CAP.MQES + 1).
    pub max_queue_entries: u16,
    /// Controllers the subsystem may have at once.
    pub max_controllers: u16,
}

impl Default for SubsysLimits {
    fn default() -> Self {
        // Linux nvmet: 128 queues; queue size up to 1024 (Linux host accepts 16..=1024).
        SubsysLimits { max_io_queues: 128, max_queue_entries: 1024, max_controllers: 1024 }
    }
}

/// A host's DH-HMAC-CHAP settings as RPC shows them: fingerprints of the keys (equal keys,
/// equal fingerprints; nothing of the key can be learned from one), never the keys.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HostKeyInfo {
    /// Host NQN.
    pub nqn: String,
    /// Preferred hash.
    pub hash: &'static str,
    /// Required DH group.
    pub dhgroup: &'static str,
    /// Fingerprint of the host key.
    pub key_fingerprint: String,
    /// Fingerprint of the controller key, if any.
    pub ctrl_key_fingerprint: Option<String>,
    /// The file the host key came from, if it came from one.
    pub key_file: Option<String>,
    /// The file the controller key came from, if it came from one.
    pub ctrl_key_file: Option<String>,
}

/// A secret's fingerprint: the first 8 bytes of SHA-256 over a label and the secret's
/// `DHHC-1` text, in hex (one-way: it tells whether two keys are the same, nothing more).
pub fn fingerprint(secret: &nvme::auth::Secret) -> String {
    let text = format!("qpath key fingerprint\n{secret}");
    let d = nvme::auth::dhchap::digest(nvme::auth::HashId::Sha256, text.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// An NVM (or the discovery) subsystem.
#[derive(Debug)]
pub struct Subsystem {
    /// NQN.
    pub nqn: String,
    /// Kind.
    pub kind: SubsysKind,
    /// Serial number (20 chars max).
    pub serial: String,
    /// Model number (40 chars max).
    pub model: String,
    /// Firmware revision (8 chars max).
    pub firmware: String,
    /// Controller limits.
    pub limits: SubsysLimits,
    access: RwLock<HostAccess>,
    /// DH-HMAC-CHAP keys by host NQN (hosts without an entry do not authenticate).
    auth: RwLock<BTreeMap<String, Arc<HostAuth>>>,
    /// TLS PSKs by host NQN ([`crate::tls`]): hosts without one cannot open a TLS channel.
    tls_keys: RwLock<BTreeMap<String, Arc<crate::tls::HostTlsKey>>>,
    /// Port ids this subsystem is exposed on (empty: every I/O port).
    ports: RwLock<Vec<u16>>,
    ns: Mutex<Arc<NsMap>>,
    /// Serialises resizes; held while a shrink waits for writes, when `ns` must stay free
    /// (admin commands on the reactors take it, and the writes waited for run there).
    resizing: Mutex<()>,
    ns_gen: AtomicU64,
    ctrls: Mutex<CtrlTable>,
}

#[derive(Debug, Default)]
struct CtrlTable {
    next: u16,
    live: BTreeMap<u16, Weak<Controller>>,
}

impl Subsystem {
    /// A new subsystem.
    pub fn new(
        nqn: &str,
        kind: SubsysKind,
        serial: &str,
        model: &str,
        access: HostAccess,
        limits: SubsysLimits,
    ) -> Result<Subsystem, Error> {
        nvme::nqn::validate(nqn).map_err(|e| Error::new(ErrorKind::Config, format!("subsystem NQN {nqn:?}: {e}")))?;
        if serial.len() > 20 || !serial.is_ascii() {
            return Err(Error::new(ErrorKind::Config, format!("serial {serial:?}: at most 20 ASCII characters")));
        }
        if model.len() > 40 || !model.is_ascii() {
            return Err(Error::new(ErrorKind::Config, format!("model {model:?}: at most 40 ASCII characters")));
        }
        Ok(Subsystem {
            nqn: nqn.to_string(),
            kind,
            serial: serial.to_string(),
            model: model.to_string(),
            firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            limits,
            access: RwLock::new(access),
            auth: RwLock::new(BTreeMap::new()),
            tls_keys: RwLock::new(BTreeMap::new()),
            ports: RwLock::new(Vec::new()),
            ns: Mutex::new(Arc::new(NsMap::default())),
            resizing: Mutex::new(()),
            ns_gen: AtomicU64::new(1),
            ctrls: Mutex::new(CtrlTable { next: 1, live: BTreeMap::new() }),
        })
    }

    /// The discovery subsystem.
    pub fn discovery() -> Subsystem {
        let mut s = Subsystem::new(
            nvme::nqn::DISCOVERY_NQN,
            SubsysKind::Discovery,
            "qpath-discovery",
            "qpath discovery",
            HostAccess { allow_any: true, hosts: vec![] },
            SubsysLimits::default(),
        )
        .unwrap_or_else(|e| unreachable!("the discovery NQN is valid: {e}"));
        s.limits.max_io_queues = 0;
        s
    }

    /// Whether `hostnqn` may connect.
    pub fn allows_host(&self, hostnqn: &str) -> bool {
        self.access.read().unwrap_or_else(|e| e.into_inner()).allows(hostnqn)
    }

    /// Replaces the host access list.
    pub fn set_access(&self, access: HostAccess) {
        *self.access.write().unwrap_or_else(|e| e.into_inner()) = access;
    }

    /// The host access list.
    pub fn access(&self) -> HostAccess {
        self.access.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets (or with `None` removes) a host's DH-HMAC-CHAP keys. Queues
    /// connected later authenticate with them; live ones keep their state.
    pub fn set_host_auth(&self, hostnqn: &str, auth: Option<HostAuth>) {
        let mut m = self.auth.write().unwrap_or_else(|e| e.into_inner());
        match auth {
            Some(a) => m.insert(hostnqn.to_string(), Arc::new(a)),
            None => m.remove(hostnqn),
        };
    }

    /// Sets (or with `None` removes) a host's TLS PSK. Handshakes from now on use it;
    /// channels already open keep theirs (as Linux's keyring keys).
    pub fn set_host_tls_key(&self, hostnqn: &str, key: Option<crate::tls::HostTlsKey>) {
        let mut m = self.tls_keys.write().unwrap_or_else(|e| e.into_inner());
        match key {
            Some(k) => m.insert(hostnqn.to_string(), Arc::new(k)),
            None => m.remove(hostnqn),
        };
    }

    /// A host's TLS PSK, if it has one here.
    pub fn host_tls_key(&self, hostnqn: &str) -> Option<Arc<crate::tls::HostTlsKey>> {
        self.tls_keys.read().unwrap_or_else(|e| e.into_inner()).get(hostnqn).cloned()
    }

    /// Every host's TLS PSK, by host NQN.
    pub fn host_tls_keys(&self) -> Vec<(String, Arc<crate::tls::HostTlsKey>)> {
        self.tls_keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(h, k)| (h.clone(), Arc::clone(k)))
            .collect()
    }

    /// A host's DH-HMAC-CHAP keys, if it must authenticate.
    pub fn host_auth(&self, hostnqn: &str) -> Option<Arc<HostAuth>> {
        self.auth.read().unwrap_or_else(|e| e.into_inner()).get(hostnqn).cloned()
    }

    /// Host NQNs that must authenticate.
    pub fn auth_hosts(&self) -> Vec<String> {
        self.auth.read().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// Every host's DH-HMAC-CHAP settings, by host NQN.
    pub fn host_auths(&self) -> Vec<(String, Arc<HostAuth>)> {
        self.auth.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(h, a)| (h.clone(), Arc::clone(a))).collect()
    }

    /// What RPC shows of the hosts' keys: fingerprints, never the secrets.
    pub fn host_keys(&self) -> Vec<HostKeyInfo> {
        self.host_auths()
            .into_iter()
            .map(|(nqn, a)| HostKeyInfo {
                nqn,
                hash: a.hash.linux_name(),
                dhgroup: a.dhgroup.name(),
                key_fingerprint: fingerprint(&a.host_key),
                ctrl_key_fingerprint: a.ctrl_key.as_ref().map(fingerprint),
                key_file: a.key_files.host.as_ref().map(|p| p.display().to_string()),
                ctrl_key_file: a.key_files.ctrl.as_ref().map(|p| p.display().to_string()),
            })
            .collect()
    }

    /// The ports it is limited to (empty: every I/O port).
    pub fn ports(&self) -> Vec<u16> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Restricts the subsystem to these ports (empty = every I/O port).
    pub fn set_ports(&self, ports: Vec<u16>) {
        *self.ports.write().unwrap_or_else(|e| e.into_inner()) = ports;
    }

    /// Whether the subsystem is reachable through `port_id`.
    pub fn on_port(&self, port_id: u16) -> bool {
        let p = self.ports.read().unwrap_or_else(|e| e.into_inner());
        p.is_empty() || p.contains(&port_id)
    }

    /// The namespace map and its generation: every namespace, whoever sees it (control
    /// plane: RPC, statistics). Queues use their controller's map instead
    /// ([`Subsystem::namespaces_of`]).
    pub fn namespaces(&self) -> (Arc<NsMap>, u64) {
        let m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        (Arc::clone(&m), self.ns_gen.load(Ordering::Acquire))
    }

    /// The namespaces `ctrl`'s host sees and the generation they are at least as new as.
    /// Queues cache both and re-read them when [`Subsystem::ns_generation`] moves: the
    /// generation is read first and bumped only after every controller's map is replaced,
    /// so a cached map is never older than the generation cached with it.
    pub fn namespaces_of(&self, ctrl: &Controller) -> (Arc<NsMap>, u64) {
        let g = self.ns_gen.load(Ordering::Acquire);
        (ctrl.namespaces(), g)
    }

    /// Current namespace generation (one relaxed load of a read-mostly line).
    #[inline]
    pub fn ns_generation(&self) -> u64 {
        self.ns_gen.load(Ordering::Relaxed)
    }

    /// Adds a namespace every host sees; returns its NSID.
    pub fn add_namespace(&self, spec: NamespaceSpec) -> Result<Nsid, Error> {
        self.add_namespace_with(spec, Visibility::All)
    }

    /// Adds a namespace that the hosts `visibility` names see; returns its NSID. Their
    /// controllers get a namespace-attribute-changed event.
    pub fn add_namespace_with(&self, spec: NamespaceSpec, visibility: Visibility) -> Result<Nsid, Error> {
        self.add_namespace_from(spec, visibility, NsOrigin::default())
    }

    /// [`Subsystem::add_namespace_with`], recording the RAM settings it was made with
    /// (`origin`; its `ptpl_file` is the spec's) for a saved configuration.
    pub fn add_namespace_from(
        &self,
        spec: NamespaceSpec,
        visibility: Visibility,
        origin: NsOrigin,
    ) -> Result<Nsid, Error> {
        let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let nsid = if spec.nsid == 0 {
            m.first_free().ok_or_else(|| Error::new(ErrorKind::Config, "no free NSID"))?
        } else {
            Nsid(spec.nsid)
        };
        if nsid.0 == 0 || nsid.0 > crate::namespace::MAX_NSID {
            return Err(Error::new(ErrorKind::Config, format!("NSID {nsid} out of range 1..=1024")));
        }
        if m.get(nsid).is_some() {
            return Err(Error::new(ErrorKind::Exists, format!("{}: NSID {nsid} exists", self.nqn)));
        }
        let mut ns = Namespace::new(&self.nqn, nsid, spec)?;
        ns.origin = NsOrigin { ptpl_file: ns.origin.ptpl_file.take(), ..origin };
        // Set before anyone can see it: a host outside the list never sees it appear.
        ns.set_visibility(visibility);
        let next = Arc::new(m.with(Arc::new(ns)));
        self.publish(&mut m, next, None);
        Ok(nsid)
    }

    /// Removes a namespace. In-flight I/O to it completes; new I/O gets Invalid Namespace.
    pub fn remove_namespace(&self, nsid: Nsid) -> Result<(), Error> {
        let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ns) = m.get(nsid) else {
            return Err(Error::new(ErrorKind::NotFound, format!("{}: no NSID {nsid}", self.nqn)));
        };
        ns.resv.detach();
        ns.backend.retire();
        let next = Arc::new(m.without(nsid));
        self.publish(&mut m, next, None);
        Ok(())
    }

    /// Changes namespace `nsid`'s capacity to `size` bytes while hosts may do I/O to it
    /// (`Namespace::resize` says what is refused); returns (previous, new) size. Every
    /// controller that sees it gets a namespace-attribute-changed event with the NSID in
    /// its Changed Namespace List, as nvmet's `revalidate_size` does (configfs.c), so hosts
    /// read the new size without reconnecting.
    pub fn resize_namespace(&self, nsid: Nsid, size: u64) -> Result<(u64, u64), Error> {
        self.resize_namespace_within(nsid, size, crate::namespace::SHRINK_DRAIN)
    }

    /// [`Subsystem::resize_namespace`], with a shrink waiting up to `drain` for the writes
    /// that may still change the blocks it cuts off (a caller that runs the reactors
    /// itself, as the simulator does, passes zero: such a shrink is refused at once).
    pub fn resize_namespace_within(&self, nsid: Nsid, size: u64, drain: Duration) -> Result<(u64, u64), Error> {
        let _one_at_a_time = self.resizing.lock().unwrap_or_else(|e| e.into_inner());
        let ns = self
            .ns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(nsid)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{}: no NSID {nsid}", self.nqn)))?;
        let old = ns.resize(size, drain).map_err(|e| {
            Error::new(
                e.kind,
                format!("namespace {nsid} of {}: cannot resize to {size} bytes: {}", self.nqn, e.context),
            )
        })?;
        if old != size {
            tracing::info!(subnqn = %self.nqn, nsid = nsid.0, from = old, to = size, "namespace resized");
            let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
            // Removed or replaced meanwhile: that change told the controllers already.
            if m.get(nsid).is_some_and(|n| Arc::ptr_eq(n, &ns)) {
                let same = Arc::clone(&m);
                self.publish(&mut m, same, Some(nsid));
            }
        }
        Ok((old, size))
    }

    /// Sets namespace `nsid`'s write protection state (Set Features 84h from a host that sees
    /// it: [`Namespace::set_write_protect`]); a change reaches every controller that sees the
    /// namespace as Namespace Attribute Changed (Identify NSATTR bit 0 changed), as nvmet's
    /// `nvmet_set_feat_write_protect` does.
    pub fn set_write_protect(&self, nsid: Nsid, state: u32) -> Result<(), nvme::Status> {
        let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let ns = m.get(nsid).cloned().ok_or(nvme::Status::INVALID_NS)?;
        if ns.set_write_protect(state)? {
            tracing::info!(subnqn = %self.nqn, nsid = nsid.0, state, "namespace write protection changed by a host");
            let same = Arc::clone(&m);
            self.publish(&mut m, same, Some(nsid));
        }
        Ok(())
    }

    /// Replaces who sees namespace `nsid` (every host, or the listed ones); returns whether
    /// that changed. The controllers whose host gains or loses it get a namespace-attribute-
    /// changed event, as with [`Subsystem::set_ns_host`] (a reload uses this).
    pub fn set_ns_visibility(&self, nsid: Nsid, visibility: Visibility) -> Result<bool, Error> {
        if let Visibility::Listed(hosts) = &visibility {
            for h in hosts {
                crate::namespace::check_host_nqn(h)?;
            }
            if hosts.len() > crate::namespace::MAX_VISIBLE_HOSTS {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "namespace {nsid} of {}: at most {} hosts may be listed",
                        self.nqn,
                        crate::namespace::MAX_VISIBLE_HOSTS
                    ),
                ));
            }
        }
        let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let ns = m
            .get(nsid)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{}: no NSID {nsid}", self.nqn)))?;
        if ns.visibility() == visibility {
            return Ok(false);
        }
        ns.set_visibility(visibility);
        tracing::info!(subnqn = %self.nqn, nsid = nsid.0, "namespace visibility replaced");
        let same = Arc::clone(&m);
        self.publish(&mut m, same, None);
        Ok(true)
    }

    /// Makes namespace `nsid` visible (or not) to `hostnqn`; returns whether that changed.
    /// Only namespaces with [`Visibility::Listed`] take per-host changes (SPDK refuses them
    /// on auto-visible namespaces too). The host's controllers get a namespace-attribute-
    /// changed event; no other controller does.
    pub fn set_ns_host(&self, nsid: Nsid, hostnqn: &str, visible: bool) -> Result<bool, Error> {
        crate::namespace::check_host_nqn(hostnqn)?;
        let mut m = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let ns = m
            .get(nsid)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{}: no NSID {nsid}", self.nqn)))?;
        let Visibility::Listed(mut hosts) = ns.visibility() else {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "namespace {nsid} of {} is visible to every host (visible = \"all\"): hosts are listed only for visible = \"listed\"",
                    self.nqn
                ),
            ));
        };
        let changed = if visible { hosts.insert(hostnqn.to_string()) } else { hosts.remove(hostnqn) };
        if hosts.len() > crate::namespace::MAX_VISIBLE_HOSTS {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "namespace {nsid} of {}: at most {} hosts may be listed",
                    self.nqn,
                    crate::namespace::MAX_VISIBLE_HOSTS
                ),
            ));
        }
        if changed {
            ns.set_visibility(Visibility::Listed(hosts));
            tracing::info!(subnqn = %self.nqn, nsid = nsid.0, hostnqn, visible, "namespace visibility changed");
            let same = Arc::clone(&m);
            self.publish(&mut m, same, None);
        }
        Ok(changed)
    }

    /// Installs `next` as the namespace map (the caller holds the lock, `current`): gives
    /// every controller the map of what its host sees, tells each one about the NSIDs
    /// that appeared or disappeared for it (and `touched`, a namespace that changed, if
    /// it sees it), then bumps the generation so queues re-read their maps.
    fn publish(&self, current: &mut Arc<NsMap>, next: Arc<NsMap>, touched: Option<Nsid>) {
        *current = next;
        for c in self.controllers() {
            let view = NsMap::view_for(current, &c.hostnqn);
            let old = c.set_namespaces(Arc::clone(&view));
            let mut changed = NsMap::differences(&old, &view);
            if let Some(n) = touched
                && view.get(n).is_some()
                && !changed.contains(&n)
            {
                changed.push(n);
            }
            for n in changed {
                c.namespace_changed(n);
            }
        }
        self.ns_gen.fetch_add(1, Ordering::Release);
    }

    /// Allocates a controller id and registers the controller built by `make`, with the
    /// map of the namespaces its host sees. The namespace lock is held throughout (before
    /// the controller table's, as everywhere), so a change published meanwhile either
    /// finds the controller registered or is already in the map it starts with.
    pub fn register_controller(&self, make: impl FnOnce(Cntlid) -> Arc<Controller>) -> Option<Arc<Controller>> {
        let ns = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = self.ctrls.lock().unwrap_or_else(|e| e.into_inner());
        t.live.retain(|_, w| w.strong_count() > 0);
        if t.live.len() >= usize::from(self.limits.max_controllers) {
            return None;
        }
        // Dynamic controller ids: 1..=0xFFEF, never reusing a live one (NVMe-oF 1.1 §3.3).
        let mut id = t.next;
        for _ in 0..=Cntlid::MAX_DYNAMIC {
            if id == 0 || id > Cntlid::MAX_DYNAMIC {
                id = 1;
            }
            if !t.live.contains_key(&id) {
                break;
            }
            id += 1;
        }
        t.next = id.wrapping_add(1);
        let ctrl = make(Cntlid(id));
        ctrl.set_namespaces(NsMap::view_for(&ns, &ctrl.hostnqn));
        t.live.insert(id, Arc::downgrade(&ctrl));
        Some(ctrl)
    }

    /// The live controller with this id.
    pub fn controller(&self, cntlid: Cntlid) -> Option<Arc<Controller>> {
        let t = self.ctrls.lock().unwrap_or_else(|e| e.into_inner());
        t.live.get(&cntlid.0).and_then(Weak::upgrade).filter(|c| !c.is_dead())
    }

    /// Every live controller.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        let t = self.ctrls.lock().unwrap_or_else(|e| e.into_inner());
        t.live.values().filter_map(Weak::upgrade).filter(|c| !c.is_dead()).collect()
    }

    /// Forgets a controller (when its admin queue goes away).
    pub fn unregister_controller(&self, cntlid: Cntlid) {
        self.ctrls.lock().unwrap_or_else(|e| e.into_inner()).live.remove(&cntlid.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_access() {
        let a = HostAccess { allow_any: false, hosts: vec!["nqn.h1".into()] };
        assert!(a.allows("nqn.h1"));
        assert!(!a.allows("nqn.h2"));
        assert!(HostAccess { allow_any: true, hosts: vec![] }.allows("anything"));
    }

    #[test]
    fn identity_limits() {
        let ok = |s: &str, m: &str| {
            Subsystem::new("nqn.x", SubsysKind::Nvm, s, m, HostAccess::default(), SubsysLimits::default())
        };
        assert!(ok("1234", "model").is_ok());
        assert!(ok(&"9".repeat(21), "model").is_err());
        assert!(ok("1", &"m".repeat(41)).is_err());
        assert!(
            Subsystem::new("bad", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).is_err()
        );
    }
}
