//! The secure channel on the target (NVMe/TCP 1.1 §3.6, TP 8011): per port `tls = "none" |
//! "required" | "allowed"` (Linux nvmet's `addr_tsas` and `addr_treq`), TLS PSKs found from
//! the keys each subsystem holds for its hosts, and the channel a connection runs its
//! NVMe/TCP queue inside.
//!
//! ```text
//!   accept ─► first byte 0x16 (TLS handshake record)? ── required/allowed ─► TLS channel
//!            └─ anything else (an ICReq starts with 0x00) ── none/allowed ─► plaintext
//!                                                       └─ required ─► closed
//!   ClientHello identity "NVMe<v>R<hh> <hostnqn> <subnqn> [<digest>]"    hh: 01 or 02, the key's hash
//!     └─ the subsystem's key for that host (discovery: any subsystem's key for the host)
//!        → retained PSK → TLS PSK; no key (or one of the other hash): the handshake fails
//!        (alert), the log says why, nothing else runs
//!   ClientHello identity "NVMe1G<hh> <hostnqn> <subnqn> <digest>"
//!     └─ the PSK the host's last secure channel concatenation generated in that subsystem
//!        (held in memory only, while the host keeps its DH-HMAC-CHAP keys there)
//!        → TLS PSK; its queues owe no second DH-HMAC-CHAP transaction
//!   Connect inside the channel: its host and subsystem NQNs must be the identity's
//! ```
//!
//! Records are sealed and opened on the reactor that owns the connection, in user space
//! (`tls::record`), until the kernel takes them over (`tls::kernel`, the port's
//! `tls_offload`, `Link::Kernel`); the handshake is OpenSSL's over memory, one step per
//! received segment, so no reactor ever blocks on it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use tls::psk::{ConfiguredPsk, Derivation, Identity, TlsPsk};
use tls::{Channel, PskLookup, ServerConfig};

use crate::registry::TargetState;

/// Whether a port speaks TLS (nvmet `addr_tsas` none / tls1.3 with `addr_treq`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plaintext NVMe/TCP only; a ClientHello gets a C2HTermReq.
    #[default]
    None,
    /// TLS 1.3 only: anything but a ClientHello is refused.
    Required,
    /// Both: a ClientHello starts TLS, an ICReq plaintext.
    Allowed,
}

impl TlsMode {
    fn to_u8(self) -> u8 {
        match self {
            TlsMode::None => 0,
            TlsMode::Required => 1,
            TlsMode::Allowed => 2,
        }
    }

    fn from_u8(v: u8) -> TlsMode {
        match v {
            1 => TlsMode::Required,
            2 => TlsMode::Allowed,
            _ => TlsMode::None,
        }
    }

    /// The name in the configuration and RPC answers.
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::None => "none",
            TlsMode::Required => "required",
            TlsMode::Allowed => "allowed",
        }
    }

    /// TREQ of the port's discovery log entries (NVMe-oF 1.1 Figure 38, bits 1:0: 01b a
    /// secure channel is required, 10b not required).
    pub fn treq(self) -> u8 {
        match self {
            TlsMode::Required => 0x01,
            TlsMode::None | TlsMode::Allowed => 0x02,
        }
    }

    /// SECTYPE, TSAS byte 0 of the port's TCP discovery entries (NVMe/TCP 1.1 §3.6: 0 no
    /// security, 2 TLS 1.3).
    pub fn sectype(self) -> u8 {
        match self {
            TlsMode::None => 0,
            TlsMode::Required | TlsMode::Allowed => 2,
        }
    }
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<TlsMode, String> {
        match s {
            "none" => Ok(TlsMode::None),
            "required" => Ok(TlsMode::Required),
            "allowed" => Ok(TlsMode::Allowed),
            _ => Err(format!("{s:?}: none, required or allowed")),
        }
    }
}

/// Whether a port's TLS connections hand their records to the kernel after the handshake
/// (`tls_offload`; `tls::kernel`): "auto" where the kernel offers it (the default), "off"
/// to keep them in user space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsOffload {
    /// Kernel TLS where the kernel takes the keys, else user space.
    #[default]
    Auto,
    /// Records always in user space.
    Off,
}

impl TlsOffload {
    /// The channel layer's setting.
    pub fn to_kernel(self) -> tls::kernel::Offload {
        match self {
            TlsOffload::Auto => tls::kernel::Offload::Auto,
            TlsOffload::Off => tls::kernel::Offload::Off,
        }
    }

    /// The name in the configuration and RPC answers.
    pub fn name(self) -> &'static str {
        self.to_kernel().name()
    }
}

/// A port's TLS mode and offload setting, changeable while it serves (read once per
/// accepted connection).
#[derive(Debug, Default)]
pub struct PortTls(AtomicU8, std::sync::atomic::AtomicBool);

impl PortTls {
    /// The mode.
    pub fn get(&self) -> TlsMode {
        TlsMode::from_u8(self.0.load(Ordering::Relaxed))
    }

    /// Sets the mode: connections accepted from now on follow it.
    pub fn set(&self, mode: TlsMode) {
        self.0.store(mode.to_u8(), Ordering::Relaxed);
    }

    /// The offload setting.
    pub fn offload(&self) -> TlsOffload {
        if self.1.load(Ordering::Relaxed) { TlsOffload::Off } else { TlsOffload::Auto }
    }

    /// Sets the offload setting: connections accepted from now on follow it.
    pub fn set_offload(&self, offload: TlsOffload) {
        self.1.store(offload == TlsOffload::Off, Ordering::Relaxed);
    }
}

/// A host's configured TLS PSK in a subsystem (Linux: the key nvme-cli derives into the
/// `.nvme` keyring for this host and subsystem).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTlsKey {
    /// The configured PSK.
    pub key: ConfiguredPsk,
    /// The file it came from (`tls_key_file`), if any: a save names the file, not the key.
    pub file: Option<PathBuf>,
}

/// Finds TLS PSKs in the target's subsystems.
struct KeyStore(Weak<TargetState>);

impl PskLookup for KeyStore {
    fn lookup(&self, id: &Identity) -> Option<TlsPsk> {
        let target = self.0.upgrade()?;
        if id.generated {
            // Secure channel concatenation made it; its identity is always of version 1
            // (Linux `nvme_tls_psk_refresh`), whose digest `tls_psk` checks.
            id.digest.as_ref()?;
            target.subsystem(&id.subnqn)?.host_auth(&id.hostnqn)?;
            return target.tls.generated.get(&id.hostnqn, &id.subnqn)?.tls_psk(id);
        }
        let key = if id.subnqn == nvme::nqn::DISCOVERY_NQN {
            target.subsystems().iter().find_map(|s| s.host_tls_key(&id.hostnqn))
        } else {
            target.subsystem(&id.subnqn)?.host_tls_key(&id.hostnqn)
        }?;
        key.key.retained(&id.hostnqn, Derivation::Standard).tls_psk(id)
    }

    /// A key for the host and subsystem of the other hash than the identity names: say so
    /// (the host was given a key of hash 01 and the target one of hash 02, or the reverse).
    fn refusal(&self, id: &Identity) -> Option<String> {
        let target = self.0.upgrade()?;
        let hash = if id.generated {
            target.tls.generated.get(&id.hostnqn, &id.subnqn)?.hash()
        } else if id.subnqn == nvme::nqn::DISCOVERY_NQN {
            target.subsystems().iter().find_map(|s| s.host_tls_key(&id.hostnqn))?.key.hash()
        } else {
            target.subsystem(&id.subnqn)?.host_tls_key(&id.hostnqn)?.key.hash()
        };
        (hash != id.hash).then(|| {
            format!(
                "identity {id} names hash {:02}, and the TLS key for host {} in {} is of hash {:02} ({}); \
                 give both ends the same key",
                id.hash.id(),
                id.hostnqn,
                id.subnqn,
                hash.id(),
                hash.suite().name()
            )
        })
    }
}

/// The target's TLS server configuration, made on the first TLS connection.
#[derive(Debug, Default)]
pub struct TargetTls {
    server: OnceLock<Result<Arc<ServerConfig>, String>>,
    /// The PSKs secure channel concatenation generated.
    pub generated: GeneratedPsks,
}

/// The PSK secure channel concatenation last generated for each host and subsystem (NVMe
/// Base 2.1 §8.3.4.5.9; Linux nvmet keeps it in its keyring and `ctrl->tls_key`). In
/// memory only: never saved, logged or answered over RPC, gone with the process (the host
/// then authenticates again on plaintext). One per pair, a new one replacing the last, and
/// only hosts with DH-HMAC-CHAP keys make them, so the configuration bounds the map.
/// Control plane: touched per transaction and per TLS handshake, never per I/O.
#[derive(Default)]
pub struct GeneratedPsks(std::sync::Mutex<std::collections::HashMap<(String, String), tls::psk::RetainedPsk>>);

impl std::fmt::Debug for GeneratedPsks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedPsks").field("pairs", &self.len()).finish_non_exhaustive()
    }
}

impl GeneratedPsks {
    /// Keeps `psk` for the pair, replacing the one before.
    pub fn insert(&self, hostnqn: &str, subnqn: &str, psk: tls::psk::RetainedPsk) {
        let mut m = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.insert((hostnqn.to_string(), subnqn.to_string()), psk);
    }

    /// The pair's PSK.
    pub fn get(&self, hostnqn: &str, subnqn: &str) -> Option<tls::psk::RetainedPsk> {
        let m = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.get(&(hostnqn.to_string(), subnqn.to_string())).cloned()
    }

    /// How many pairs hold one.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TargetTls {
    fn server(&self, target: &Arc<TargetState>) -> Result<Arc<ServerConfig>, String> {
        self.server
            .get_or_init(|| {
                tracing::info!("{}", tls::kernel::describe(tls::kernel::Offload::Auto));
                ServerConfig::new(Arc::new(KeyStore(Arc::downgrade(target)))).map(Arc::new).map_err(|e| e.to_string())
            })
            .clone()
    }
}

/// Where a connection's secure channel is.
#[derive(Debug)]
pub enum Link {
    /// The port takes both: the first byte received decides.
    Sniff,
    /// The port requires TLS: the first byte must start a handshake record.
    Require,
    /// TLS runs in user space (or failed: the channel says why).
    Tls(Box<Channel>),
    /// The kernel seals and opens the records (`TCP_ULP` "tls"): the queue's bytes pass as
    /// on a plaintext connection.
    Kernel(Box<KernelLink>),
}

/// What stays of a channel the kernel took over.
#[derive(Debug)]
pub struct KernelLink {
    /// The PSK identity the channel was made with.
    pub identity: Identity,
    /// Its cipher suite.
    pub suite: tls::record::Suite,
}

/// The first byte of a TLS handshake record (a ClientHello's record).
pub const TLS_HANDSHAKE: u8 = 0x16;

/// The link a connection accepted on a port in `mode` starts with.
pub fn link_for(mode: TlsMode) -> Option<Link> {
    match mode {
        TlsMode::None => None,
        TlsMode::Required => Some(Link::Require),
        TlsMode::Allowed => Some(Link::Sniff),
    }
}

/// A server channel for a connection that sent a ClientHello.
pub fn channel(target: &Arc<TargetState>) -> Result<Channel, String> {
    let cfg = target.tls.server(target)?;
    Channel::server(&cfg).map_err(|e| e.to_string())
}

/// The Connect inside a TLS channel must come from the identity's host, for the identity's
/// subsystem (or the discovery subsystem with the host's own key): `None` when it does,
/// else why not.
pub fn connect_mismatch(identity: &Identity, hostnqn: &str, subnqn: &str) -> Option<String> {
    if identity.hostnqn != hostnqn {
        return Some(format!("Connect from host {hostnqn} in a TLS channel of host {}", identity.hostnqn));
    }
    if identity.subnqn != subnqn && subnqn != nvme::nqn::DISCOVERY_NQN {
        return Some(format!("Connect to {subnqn} in a TLS channel for {}", identity.subnqn));
    }
    None
}

/// What `list_queues` says of a channel: the record path and the cipher suite.
pub fn describe(path: tls::kernel::RecordPath, suite: Option<tls::record::Suite>) -> String {
    format!("{} {}", path.name(), suite.map_or("?", |s| s.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_give_treq_and_sectype() {
        assert_eq!((TlsMode::None.treq(), TlsMode::None.sectype()), (2, 0));
        assert_eq!((TlsMode::Required.treq(), TlsMode::Required.sectype()), (1, 2));
        assert_eq!((TlsMode::Allowed.treq(), TlsMode::Allowed.sectype()), (2, 2));
        let p = PortTls::default();
        assert_eq!(p.get(), TlsMode::None);
        p.set(TlsMode::Allowed);
        assert_eq!(p.get(), TlsMode::Allowed);
        assert_eq!(p.offload(), TlsOffload::Auto, "kernel TLS where offered, by default");
        p.set_offload(TlsOffload::Off);
        assert_eq!((p.get(), p.offload()), (TlsMode::Allowed, TlsOffload::Off));
        assert_eq!("required".parse::<TlsMode>(), Ok(TlsMode::Required));
        assert!("tls".parse::<TlsMode>().is_err());
    }

    #[test]
    fn connect_must_match_the_identity() {
        let id = Identity::parse(b"NVMe0R01 nqn.h nqn.s").unwrap();
        assert_eq!(connect_mismatch(&id, "nqn.h", "nqn.s"), None);
        assert_eq!(connect_mismatch(&id, "nqn.h", nvme::nqn::DISCOVERY_NQN), None);
        assert!(connect_mismatch(&id, "nqn.other", "nqn.s").is_some());
        assert!(connect_mismatch(&id, "nqn.h", "nqn.s2").is_some());
    }
}
