//! The TOML configuration of `qpath target --config FILE`, and the embedded
//! default `qpath target` serves with no arguments.
//!
//! ```toml
//! [options]                      # transport limits (all optional)
//! in_capsule_data_size = 8192
//! rx_budget_pdus = 16            # fairness per connection per reactor turn (0 = no limit)
//! tx_batch_bytes = 65536
//! tx_deadline_us = 50
//! auth_workers = 4               # threads for DH-HMAC-CHAP's DH steps (0 = on the reactor)
//! max_connections_per_port = 4096     # limits on what peers may hold (defaults shown,
//! max_connections_per_host = 2048     #   see crate::limits; changeable at run time by
//! max_connections_per_hostnqn = 2048  #   the set_limits RPC)
//! connect_timeout_ms = 10000          # ICReq + Connect within this long of accept
//! pdu_timeout_ms = 30000              # a started PDU or an R2T must be finished
//! max_buffer_bytes_per_connection = 16777216
//! [reactor]
//! reactors = 2                   # default: one per CPU
//! poll = "adaptive"              # busy | adaptive | block
//! [rpc]
//! socket = "/run/qpath.sock"
//! [[port]]
//! id = 1
//! addr = "127.0.0.1:4420"
//! [[port]]
//! id = 3
//! addr = "127.0.0.1:8009"
//! kind = "discovery"             # a dedicated discovery port
//! [[subsystem]]
//! nqn = "nqn.2026-11.io.qpath:vol1"
//! allow_any_host = false
//! hosts = [
//!   "nqn.2014-08.org.nvmexpress:uuid:...",       # allowed, no authentication
//!   { nqn = "nqn.2014-08.org.nvmexpress:uuid:...",  # allowed, must authenticate (DH-HMAC-CHAP)
//!     dhchap_key = "DHHC-1:01:...:",              # the host's secret (nvme gen-dhchap-key)
//!     dhchap_ctrl_key = "DHHC-1:03:...:",         # optional: the controller authenticates too
//!     hash = "sha384",                            # optional: preferred hash (default sha256)
//!     dhgroup = "ffdhe3072" },                    # optional: required DH group (default null)
//!   { nqn = "nqn.2014-08.org.nvmexpress:uuid:...",
//!     dhchap_key_file = "/etc/qpath/host1.key",   # the secret read from a file (at start
//!     dhchap_ctrl_key_file = "/etc/qpath/ctrl1.key" },  #   and SIGHUP); a save names the file
//! ]
//! [[subsystem.namespace]]
//! backend = "file"               # null | ram | file
//! path = "/var/lib/qpath/vol1.img"   # a regular file or a block device (see "File namespaces")
//! size = "10G"                   # file: optional; without it the file's or device's own size
//! grow = false                   # file: true lets size grow a smaller existing regular file
//! readonly = false               # true: opened O_RDONLY; readonly namespaces may share a file
//! ana_group = 1
//! ptpl_file = "/var/lib/qpath/vol1.resv"   # reservations persist through restarts once a
//!                                          #   host asks (CPTPL); see crate::reservation
//! [[subsystem.namespace]]
//! backend = "ram"
//! size = "1G"
//! max_size = "8G"                # ram: resize_namespace grows it up to this (default: the
//!                                #   machine's memory; address space only, no memory, is
//!                                #   reserved for it at start)
//! prefault = true                # ram: fault every page in at start (no first-touch faults)
//! huge_pages = true              # ram: transparent huge pages (MADV_HUGEPAGE, best effort)
//! [[subsystem.namespace]]
//! backend = "null"
//! size = "1T"
//! visible = "listed"             # only the hosts in `hosts` see it (default "all": every
//! hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]   # host the subsystem lets in);
//!                                #   the RPCs ns_add_host / ns_remove_host change the list
//! [[ana]]
//! port = 2
//! group = 1
//! state = "non-optimized"
//! [[referral]]                   # in every port's discovery log: another discovery
//! address = "10.0.0.2"           #   service, which hosts (nvme discover, qpath discover)
//! port = 8009                    #   follow; port defaults to 8009 and subnqn to the
//! subnqn = "nqn.2014-08.org.nvmexpress.discovery"   # discovery NQN (another NQN: an NVM
//!                                #   subsystem at that address)
//! ```
//!
//! # File namespaces
//!
//! qpath never changes the size of an existing file or device on its own (as Linux nvmet
//! and SPDK's aio/uring bdevs, it takes the size it finds):
//!
//! | the file | no `size` | `size` = its size | `size` larger | `size` smaller |
//! | --- | --- | --- | --- | --- |
//! | regular file | its size | used | refused; grown with `grow = true` | refused |
//! | block device | its size | used | refused (cannot grow) | refused |
//! | missing | refused | - | created (`O_CREAT \| O_EXCL`, mode 0600) | - |
//!
//! A file is held by one namespace at a time, in this process or any other: a whole-file
//! OFD lock (`fcntl(F_OFD_SETLK)`; shared for `readonly` namespaces, which may share a
//! file), and for a block device opened read-write the kernel's exclusive claim (`O_EXCL`:
//! refused while it is mounted). The error names the holder. The lock goes when the
//! namespace is removed and its last command is done. If a start fails (a namespace
//! refused, a port that cannot bind), the files it created are removed; files it did not
//! create are never touched. See `docs/robustness.md`, "Data safety".
//!
//! A namespace's size can change while hosts use it (RPC `resize_namespace`; see
//! [`crate::namespace`]); a file namespace's file is resized then, and only then. The RPC
//! rewrites this file only under `qpath target --persist` (or when `save_config` is
//! called): then the saved `size` is the file's new size. Otherwise, after a file
//! namespace grew, a `size` still naming the old size is refused at the next start
//! (smaller than the file); leave `size` out (the file's is used) or set the new one.
//!
//! # Saved configurations
//!
//! `save_config` and `--persist` write this same schema from the running target
//! ([`crate::persist`]), with every value explicit (sizes in bytes, NSIDs, UUIDs, serials,
//! queue limits, the limits in force under `[options]`), a first comment saying it was
//! written by qpath and when, and mode 0600 when a DH-HMAC-CHAP secret is inline. SIGHUP
//! re-reads the file and applies the difference.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvme::auth::{DhGroup, HashId, Secret};
use nvme::{AnaGrpId, AnaState};
use serde::{Deserialize, Serialize};

use crate::auth::{HostAuth, KeyFiles};
use crate::backend::{Access, Backend, FileBackend, FileRequest, NewFiles};
use crate::error::{Error, ErrorKind};
use crate::namespace::{NamespaceSpec, NsOrigin, Visibility};
use crate::port::PortKind;
use crate::qos::QosSettings;
use crate::reactor::ReactorOptions;
use crate::registry::{TargetOptions, TargetState};
use crate::server::Server;
use crate::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use uring::RegionOptions;

/// The NQN of the embedded default subsystem.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.qpath:default";

/// The whole configuration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Transport limits.
    #[serde(default)]
    pub options: TargetOptions,
    /// Reactor threads.
    #[serde(default)]
    pub reactor: ReactorOptions,
    /// The JSON-RPC control socket.
    #[serde(default)]
    pub rpc: RpcConfig,
    /// Listen addresses.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortConfig>,
    /// NVM subsystems.
    #[serde(default, rename = "subsystem")]
    pub subsystems: Vec<SubsystemConfig>,
    /// ANA states other than optimized.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ana: Vec<AnaConfig>,
    /// Referrals listed in the discovery log.
    #[serde(default, rename = "referral", skip_serializing_if = "Vec::is_empty")]
    pub referrals: Vec<ReferralConfig>,
}

/// A referral to another discovery service (or an NVM subsystem elsewhere).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferralConfig {
    /// IP address (no host names: the discovery log carries an address and its family).
    pub address: String,
    /// TCP port (default 8009, the discovery port).
    #[serde(default = "default_referral_port")]
    pub port: u16,
    /// NQN to connect to there (default: the discovery NQN).
    pub subnqn: Option<String>,
}

fn default_referral_port() -> u16 {
    crate::registry::DISCOVERY_TRSVCID
}

impl ReferralConfig {
    /// The checked referral.
    pub fn to_referral(&self) -> Result<crate::registry::Referral, Error> {
        let address = self.address.trim().parse().map_err(|e| {
            Error::new(ErrorKind::Config, format!("referral address {:?}: {e} (an IPv4 or IPv6 address)", self.address))
        })?;
        crate::registry::Referral::new(address, self.port, self.subnqn.as_deref())
    }
}

/// RPC socket.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcConfig {
    /// Unix socket path (none = no RPC server).
    pub socket: Option<PathBuf>,
}

/// A port.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// Port id (1..=65535).
    pub id: u16,
    /// "ip:port".
    pub addr: String,
    /// What it serves.
    #[serde(default = "default_kind")]
    pub kind: PortKind,
    /// TLS: "none" (default), "required" (TLS 1.3 only) or "allowed" (both); see
    /// `crate::tls`. Hosts need a `tls_key` in the subsystems they reach.
    #[serde(default, skip_serializing_if = "is_no_tls")]
    pub tls: crate::tls::TlsMode,
    /// Kernel TLS for its TLS connections: "auto" (default: where the kernel offers it) or
    /// "off" (records in user space).
    #[serde(default, skip_serializing_if = "is_auto_offload")]
    pub tls_offload: crate::tls::TlsOffload,
}

fn is_auto_offload(t: &crate::tls::TlsOffload) -> bool {
    *t == crate::tls::TlsOffload::Auto
}

fn is_no_tls(t: &crate::tls::TlsMode) -> bool {
    *t == crate::tls::TlsMode::None
}

fn default_kind() -> PortKind {
    PortKind::Io
}

impl PortConfig {
    /// An I/O port (with discovery) on `addr` ("127.0.0.1:4420"; port 0 picks a free one).
    pub fn io(id: u16, addr: impl Into<String>) -> PortConfig {
        PortConfig {
            id,
            addr: addr.into(),
            kind: PortKind::Io,
            tls: crate::tls::TlsMode::None,
            tls_offload: crate::tls::TlsOffload::Auto,
        }
    }
}

/// A subsystem.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    /// NQN.
    pub nqn: String,
    /// Serial number (default: derived from the NQN).
    pub serial: Option<String>,
    /// Model number.
    #[serde(default = "default_model")]
    pub model: String,
    /// Let any host connect (only when set).
    #[serde(default)]
    pub allow_any_host: bool,
    /// Allowed hosts: NQNs, or tables that also give DH-HMAC-CHAP keys.
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    /// Port ids to expose on (empty = every I/O port).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// I/O queues per controller.
    pub max_io_queues: Option<u16>,
    /// Entries per queue (CAP.MQES + 1).
    pub queue_size: Option<u16>,
    /// Namespaces.
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
}

/// An allowed host: its NQN, or a table with its DH-HMAC-CHAP settings.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum HostEntry {
    /// Allowed without authentication.
    Nqn(String),
    /// Allowed; authenticates when `dhchap_key` is set.
    Auth(HostAuthConfig),
}

impl HostEntry {
    /// The host NQN.
    pub fn nqn(&self) -> &str {
        match self {
            HostEntry::Nqn(n) => n,
            HostEntry::Auth(a) => &a.nqn,
        }
    }
}

/// A host's DH-HMAC-CHAP settings (Linux configfs `hosts/<nqn>/dhchap_*`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostAuthConfig {
    /// Host NQN.
    pub nqn: String,
    /// The host's secret, `DHHC-1:<hh>:<base64>:`.
    pub dhchap_key: Option<String>,
    /// The controller's secret (bidirectional authentication when the host asks).
    pub dhchap_ctrl_key: Option<String>,
    /// A file holding the host's secret (instead of `dhchap_key`), read at start and at
    /// every reload: a saved configuration names the file again, never the secret.
    pub dhchap_key_file: Option<PathBuf>,
    /// A file holding the controller's secret (instead of `dhchap_ctrl_key`).
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// Preferred hash: sha256 (default), sha384, sha512 (or "hmac(sha256)" ...).
    pub hash: Option<String>,
    /// Required DH group: null (default), ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192.
    pub dhgroup: Option<String>,
    /// The host's configured TLS PSK, `NVMeTLSkey-1:<hh>:<base64>:` (`qpath gen-tls-key`,
    /// `nvme gen-tls-key`), for TLS ports.
    pub tls_key: Option<String>,
    /// A file holding the TLS PSK (instead of `tls_key`), read at start and at every
    /// reload: a saved configuration names the file again, never the key.
    pub tls_key_file: Option<PathBuf>,
}

impl HostAuthConfig {
    /// The host's TLS PSK, if it has one (reading the key file). Errors name the host and
    /// the file, never the key.
    pub fn to_tls_key(&self) -> Result<Option<crate::tls::HostTlsKey>, Error> {
        let bad = |what: &str, e: String| Error::new(ErrorKind::Config, format!("host {}: {what}: {e}", self.nqn));
        let key = match (&self.tls_key, &self.tls_key_file) {
            (Some(_), Some(_)) => return Err(bad("tls_key", "give tls_key or tls_key_file, not both".into())),
            (Some(k), None) => tls::psk::ConfiguredPsk::parse(k).map_err(|e| bad("tls_key", e.to_string()))?,
            (None, Some(f)) => {
                let what = format!("tls_key_file {}", f.display());
                let text = zeroize::Zeroizing::new(std::fs::read_to_string(f).map_err(|e| bad(&what, e.to_string()))?);
                tls::psk::ConfiguredPsk::parse(&text).map_err(|e| bad(&what, e.to_string()))?
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(crate::tls::HostTlsKey { key, file: self.tls_key_file.clone() }))
    }

    /// Checks the settings (reading the key files): `None` when the host has no key (it
    /// does not authenticate). Errors name the host and the file, never a secret.
    pub fn to_host_auth(&self) -> Result<Option<HostAuth>, Error> {
        let bad = |what: &str, e: String| Error::new(ErrorKind::Config, format!("host {}: {what}: {e}", self.nqn));
        let secret = |s: &str, what: &str| Secret::parse(s).map_err(|e| bad(what, e.to_string()));
        let key = |inline: &Option<String>, file: &Option<PathBuf>, what: &str| -> Result<Option<Secret>, Error> {
            match (inline, file) {
                (Some(_), Some(_)) => Err(bad(what, format!("give {what} or {what}_file, not both"))),
                (Some(k), None) => secret(k, what).map(Some),
                (None, Some(f)) => {
                    let what_file = format!("{what}_file {}", f.display());
                    let text = std::fs::read_to_string(f).map_err(|e| bad(&what_file, e.to_string()))?;
                    secret(&text, &what_file).map(Some)
                }
                (None, None) => Ok(None),
            }
        };
        let host_key = key(&self.dhchap_key, &self.dhchap_key_file, "dhchap_key")?;
        let ctrl_key = key(&self.dhchap_ctrl_key, &self.dhchap_ctrl_key_file, "dhchap_ctrl_key")?;
        let Some(host_key) = host_key else {
            if ctrl_key.is_some() {
                return Err(bad("dhchap_ctrl_key", "needs dhchap_key (the host authenticates first)".into()));
            }
            return Ok(None);
        };
        let mut a = HostAuth::new(host_key, ctrl_key);
        a.key_files = KeyFiles { host: self.dhchap_key_file.clone(), ctrl: self.dhchap_ctrl_key_file.clone() };
        if let Some(h) = &self.hash {
            a.hash = HashId::parse(h).ok_or_else(|| bad("hash", format!("{h:?}: sha256, sha384 or sha512")))?;
        }
        if let Some(g) = &self.dhgroup {
            a.dhgroup = DhGroup::parse(g).ok_or_else(|| bad("dhgroup", format!("{g:?}: null or ffdhe2048..8192")))?;
        }
        Ok(Some(a))
    }
}

fn default_model() -> String {
    "qpath".to_string()
}

impl SubsystemConfig {
    /// A subsystem any host may use, on every port, with these namespaces and the
    /// defaults for everything else (the config file's defaults).
    pub fn open(nqn: impl Into<String>, namespaces: Vec<NamespaceConfig>) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.into(),
            serial: None,
            model: default_model(),
            allow_any_host: true,
            hosts: vec![],
            ports: vec![],
            max_io_queues: None,
            queue_size: None,
            namespaces,
        }
    }
}

impl NamespaceConfig {
    /// A RAM namespace of `size` ("64M", "1G", bytes as text) with the config file's
    /// defaults: 512-byte blocks, ANA group 1, writable, no limits.
    pub fn ram(nsid: u32, size: &str) -> NamespaceConfig {
        NamespaceConfig {
            nsid,
            backend: "ram".into(),
            size: Some(SizeValue::Text(size.into())),
            path: None,
            block_size: default_block_size(),
            ana_group: default_group(),
            readonly: false,
            uuid: None,
            qos: QosSettings::default(),
            prefault: false,
            huge_pages: false,
            ptpl_file: None,
            grow: false,
            max_size: None,
            visible: VisibleTo::All,
            hosts: vec![],
        }
    }

    /// Which hosts see it: `visible` with `hosts`, checked.
    pub fn visibility(&self) -> Result<Visibility, Error> {
        match self.visible {
            VisibleTo::All if !self.hosts.is_empty() => Err(Error::new(
                ErrorKind::Config,
                "a namespace's hosts list who sees it with visible = \"listed\" (it is \"all\")",
            )),
            VisibleTo::All => Ok(Visibility::All),
            VisibleTo::Listed => Visibility::listed(self.hosts.iter().cloned()),
        }
    }
}

/// Which hosts see a namespace, as the configuration says it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VisibleTo {
    /// Every host the subsystem lets in.
    #[default]
    All,
    /// Only the namespace's `hosts` (and those `ns_add_host` adds).
    Listed,
}

/// A namespace.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// NSID (default: next free).
    #[serde(default)]
    pub nsid: u32,
    /// null | ram | file.
    pub backend: String,
    /// Size ("1G", "512M", bytes); required for null and ram. A file namespace without it
    /// takes its file's or block device's size; with it, an existing file must be that
    /// large (it is never shrunk, and grown only with `grow`), and a missing file is
    /// created that large.
    pub size: Option<SizeValue>,
    /// File or block device path (file backend).
    pub path: Option<PathBuf>,
    /// File backend: an existing regular file smaller than `size` is grown to it (without
    /// this, such a size is refused). A block device never grows.
    #[serde(default)]
    pub grow: bool,
    /// Block size in bytes.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// ANA group.
    #[serde(default = "default_group")]
    pub ana_group: u32,
    /// Read-only.
    #[serde(default)]
    pub readonly: bool,
    /// Where this namespace's reservations persist through power loss, once a host asks
    /// for it (Register with CPTPL, Set Features 83h): a JSON file rewritten durably at
    /// every change and read back at start (SPDK's `ptpl_file`). Without it reservations
    /// live as long as the target process.
    #[serde(default)]
    pub ptpl_file: Option<PathBuf>,
    /// UUID (default: derived from the subsystem NQN and NSID; over RPC, a random one). A UUID
    /// of its own gives the namespace its own NGUID and EUI-64 too.
    pub uuid: Option<String>,
    /// Provisioned limits.
    #[serde(default)]
    pub qos: QosSettings,
    /// RAM backend: fault every page in at creation (`MAP_POPULATE`), so no I/O pays for a
    /// first-touch page fault and zeroing, as on a device whose media exists up front
    /// (SPDK's malloc bdev is allocated whole too). Costs the whole size in RSS at once.
    #[serde(default)]
    pub prefault: bool,
    /// RAM backend: ask for transparent huge pages (`MADV_HUGEPAGE`; best effort), fewer
    /// TLB misses when I/O spreads over a large namespace.
    #[serde(default)]
    pub huge_pages: bool,
    /// RAM backend: the largest size `resize_namespace` may grow it to (default: the
    /// machine's physical memory). Its address space is reserved at creation; memory is
    /// used only as the namespace grows.
    #[serde(default)]
    pub max_size: Option<SizeValue>,
    /// Which hosts see it: `all` (default) or `listed` (only `hosts`).
    #[serde(default)]
    pub visible: VisibleTo,
    /// With `visible = "listed"`: the host NQNs that see it (at most 1024).
    #[serde(default)]
    pub hosts: Vec<String>,
}

fn default_block_size() -> u32 {
    512
}

fn default_group() -> u32 {
    1
}

/// A size as a number of bytes or a string with a suffix.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum SizeValue {
    /// Bytes.
    Bytes(u64),
    /// "1G", "512MiB", "4096".
    Text(String),
}

// Written out rather than derived (`untagged`), so that a wrong value is refused with what
// a size looks like instead of serde's "did not match any variant of untagged enum".
impl<'de> Deserialize<'de> for SizeValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SizeValue, D::Error> {
        struct Size;
        impl serde::de::Visitor<'_> for Size {
            type Value = SizeValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size: a number of bytes (4096) or a string with a unit (\"512M\", \"1G\")")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SizeValue, E> {
                Ok(SizeValue::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SizeValue, E> {
                u64::try_from(v)
                    .map(SizeValue::Bytes)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SizeValue, E> {
                Ok(SizeValue::Text(v.to_string()))
            }
        }
        d.deserialize_any(Size)
    }
}

// As for sizes: an NQN string, or a table whose own errors (an unknown or missing field)
// are shown, instead of "did not match any variant of untagged enum".
impl<'de> Deserialize<'de> for HostEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<HostEntry, D::Error> {
        struct Host;
        impl<'de> serde::de::Visitor<'de> for Host {
            type Value = HostEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a host NQN, or a table { nqn = \"...\", dhchap_key = \"DHHC-1:...\", ... }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HostEntry, E> {
                Ok(HostEntry::Nqn(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<HostEntry, A::Error> {
                HostAuthConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(HostEntry::Auth)
            }
        }
        d.deserialize_any(Host)
    }
}

impl SizeValue {
    /// Bytes.
    pub fn bytes(&self) -> Result<u64, Error> {
        match self {
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(t) => parse_size(t),
        }
    }
}

/// Parses "4096", "4k", "1G", "512MiB", "1.5G" (binary units).
pub fn parse_size(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(Error::new(ErrorKind::Config, format!("size {s:?}: unknown unit"))),
    };
    let v: f64 = num.parse().map_err(|_| Error::new(ErrorKind::Config, format!("size {s:?}: not a number")))?;
    let bytes = v * mult as f64;
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(Error::new(ErrorKind::Config, format!("size {s:?} out of range")));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// A non-optimized ANA state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnaConfig {
    /// Port id.
    pub port: u16,
    /// ANA group.
    pub group: u32,
    /// optimized | non-optimized | inaccessible | persistent-loss | change.
    pub state: String,
}

impl Config {
    /// Reads and checks a TOML file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        Config::parse(&text).map_err(|e| Error::new(e.kind, format!("{}: {}", path.display(), e.context)))
    }

    /// Parses TOML text. An error names the line and column, not the text there: the line
    /// may hold a DH-HMAC-CHAP secret, and errors reach logs.
    pub fn parse(text: &str) -> Result<Config, Error> {
        toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}: ")
            });
            Error::new(ErrorKind::Config, format!("{}{}", at.unwrap_or_default(), e.message().trim_end()))
        })
    }

    /// The embedded default: one subsystem with a 1 GiB RAM namespace on
    /// 127.0.0.1:4420 and 127.0.0.1:4421 (discovery on both), any host allowed.
    pub fn embedded_default() -> Config {
        Config {
            options: TargetOptions::default(),
            reactor: ReactorOptions::default(),
            rpc: RpcConfig::default(),
            ports: vec![PortConfig::io(1, "127.0.0.1:4420"), PortConfig::io(2, "127.0.0.1:4421")],
            subsystems: vec![SubsystemConfig::open(DEFAULT_NQN, vec![NamespaceConfig::ram(1, "1G")])],
            ana: vec![],
            referrals: vec![],
        }
    }

    /// Builds the target state (subsystems, namespaces) — ports are bound by [`Config::start`].
    /// When it fails, the files it created are removed.
    pub fn build_state(&self) -> Result<Arc<TargetState>, Error> {
        let mut new = NewFiles::default();
        let state = self.build_state_into(&mut new)?;
        new.keep();
        Ok(state)
    }

    fn build_state_into(&self, new: &mut NewFiles) -> Result<Arc<TargetState>, Error> {
        let o = &self.options;
        let limits = [o.max_connections_per_port, o.max_connections_per_host, o.max_connections_per_hostnqn];
        if limits.contains(&0)
            || o.connect_timeout_ms == 0
            || o.pdu_timeout_ms == 0
            || o.max_buffer_bytes_per_connection == 0
        {
            return Err(Error::new(ErrorKind::Config, "connection limits and timeouts must be at least 1"));
        }
        let state = Arc::new(TargetState::new(self.options));
        for s in &self.subsystems {
            add_subsystem_into(&state, s, new)?;
        }
        for r in &self.referrals {
            state.add_referral(r.to_referral()?)?;
        }
        Ok(state)
    }

    /// Builds everything and starts serving. When it fails, nothing of it stays: the
    /// threads are stopped, the files are unlocked and the files it created are removed.
    pub fn start(&self) -> Result<Server, Error> {
        let (server, new) = self.start_with_new_files()?;
        new.keep();
        Ok(server)
    }

    /// [`Config::start`], returning also the files it created: they are removed when the
    /// [`NewFiles`] drops, unless the caller, once the rest of its start-up (an RPC socket,
    /// a metrics listener) succeeded too, calls [`NewFiles::keep`].
    pub fn start_with_new_files(&self) -> Result<(Server, NewFiles), Error> {
        let mut new = NewFiles::default();
        let state = self.build_state_into(&mut new)?;
        let server = Server::start(state, self.reactor.clone())?;
        if let Err(e) = self.serve(&server) {
            // The reactors hold the state, and with it every namespace's open file and lock.
            server.shutdown();
            return Err(e);
        }
        Ok((server, new))
    }

    fn serve(&self, server: &Server) -> Result<(), Error> {
        for p in &self.ports {
            let addr = crate::server::parse_addr(&p.addr)?;
            server.add_port_secure(p.id, addr, p.kind, p.tls, p.tls_offload)?;
        }
        for a in &self.ana {
            let st = AnaState::parse(&a.state)
                .ok_or_else(|| Error::new(ErrorKind::Config, format!("ANA state {:?}", a.state)))?;
            server.state.set_ana_state(a.port, AnaGrpId(a.group), st)?;
        }
        Ok(())
    }
}

/// Adds a configured subsystem (also used by RPC). When it fails, nothing of it stays:
/// the subsystem is not added and the files it created are removed.
pub fn add_subsystem(state: &TargetState, s: &SubsystemConfig) -> Result<Arc<Subsystem>, Error> {
    let mut new = NewFiles::default();
    let sub = add_subsystem_into(state, s, &mut new)?;
    new.keep();
    Ok(sub)
}

/// [`add_subsystem`], recording the files it creates in `new`.
fn add_subsystem_into(state: &TargetState, s: &SubsystemConfig, new: &mut NewFiles) -> Result<Arc<Subsystem>, Error> {
    let serial = s.serial.clone().unwrap_or_else(|| format!("{:08X}", nvme::tcp::crc32c(s.nqn.as_bytes())));
    let mut limits = SubsysLimits::default();
    if let Some(q) = s.max_io_queues {
        limits.max_io_queues = q.max(1);
    }
    if let Some(q) = s.queue_size {
        limits.max_queue_entries = q.clamp(2, 4096);
    }
    let access =
        HostAccess { allow_any: s.allow_any_host, hosts: s.hosts.iter().map(|h| h.nqn().to_string()).collect() };
    let sub = Subsystem::new(&s.nqn, SubsysKind::Nvm, &serial, &s.model, access, limits)?;
    for h in &s.hosts {
        if let HostEntry::Auth(a) = h {
            sub.set_host_auth(&a.nqn, a.to_host_auth()?);
            sub.set_host_tls_key(&a.nqn, a.to_tls_key()?);
        }
    }
    sub.set_ports(s.ports.clone());
    if state.subsystem(&s.nqn).is_some() {
        return Err(Error::new(ErrorKind::Exists, format!("subsystem {} exists", s.nqn)));
    }
    // Namespaces first, the subsystem in the target last: a namespace that fails leaves
    // no half-built subsystem behind (and its files unlocked when `sub` drops).
    for n in &s.namespaces {
        add_namespace_into(&sub, n, new)?;
    }
    state.add_subsystem(sub)
}

/// Adds a configured namespace (also used by RPC). When it fails, a file it created is
/// removed again.
pub fn add_namespace(sub: &Subsystem, n: &NamespaceConfig) -> Result<nvme::Nsid, Error> {
    let mut new = NewFiles::default();
    let nsid = add_namespace_into(sub, n, &mut new)?;
    new.keep();
    Ok(nsid)
}

/// [`add_namespace`], recording the file it creates in `new`.
fn add_namespace_into(sub: &Subsystem, n: &NamespaceConfig, new: &mut NewFiles) -> Result<nvme::Nsid, Error> {
    // The NSID is decided before the backend opens, so errors and the table of held files
    // can name the namespace (Subsystem::add_namespace checks it again under its lock).
    let nsid = match n.nsid {
        0 => sub.namespaces().0.first_free().ok_or_else(|| Error::new(ErrorKind::Config, "no free NSID"))?,
        id => nvme::Nsid(id),
    };
    if nsid.0 > crate::namespace::MAX_NSID {
        return Err(Error::new(
            ErrorKind::Config,
            format!("NSID {nsid} out of range 1..={}", crate::namespace::MAX_NSID),
        ));
    }
    if sub.namespaces().0.get(nsid).is_some() {
        return Err(Error::new(ErrorKind::Exists, format!("{}: NSID {nsid} exists", sub.nqn)));
    }
    let owner = format!("namespace {nsid} of {}", sub.nqn);
    let size = n.size.as_ref().map(SizeValue::bytes).transpose()?;
    if n.grow && n.backend != "file" {
        return Err(Error::new(ErrorKind::Config, format!("{owner}: grow applies to file namespaces only")));
    }
    // Checked before a backend is opened (a file may be created or sized then).
    let visibility = n.visibility()?;
    let max_size = n.max_size.as_ref().map(SizeValue::bytes).transpose()?;
    if max_size.is_some() && n.backend != "ram" {
        return Err(Error::new(ErrorKind::Config, format!("{owner}: max_size is for ram namespaces")));
    }
    let backend = match n.backend.as_str() {
        "null" => Backend::Null,
        "ram" => {
            let size =
                size.ok_or_else(|| Error::new(ErrorKind::Config, format!("{owner}: a ram namespace needs a size")))?;
            let options = RegionOptions { populate: n.prefault, huge_pages: n.huge_pages };
            match max_size {
                Some(max) => Backend::ram_growable(size, max, options)?,
                None => Backend::ram_with(size, options)?,
            }
        }
        "file" => {
            let path = n
                .path
                .as_ref()
                .ok_or_else(|| Error::new(ErrorKind::Config, format!("{owner}: a file namespace needs a path")))?;
            let access = if n.readonly { Access::ReadOnly } else { Access::ReadWrite };
            let (file, created) = FileBackend::open(&FileRequest { path, size, grow: n.grow, access, owner: &owner })?;
            if let Some(c) = created {
                new.push(c);
            }
            Backend::File(file)
        }
        other => return Err(Error::new(ErrorKind::Config, format!("{owner}: backend {other:?}: null, ram or file"))),
    };
    let uuid = n.uuid.as_deref().map(parse_uuid).transpose()?;
    let origin = NsOrigin { ptpl_file: None, prefault: n.prefault, huge_pages: n.huge_pages, max_size };
    let nsid = sub.add_namespace_from(
        NamespaceSpec {
            nsid: nsid.0,
            backend,
            size,
            block_size: n.block_size,
            anagrpid: n.ana_group,
            uuid,
            readonly: n.readonly,
            ptpl_file: n.ptpl_file.clone(),
        },
        visibility,
        origin,
    )?;
    let (map, _) = sub.namespaces();
    if let Some(ns) = map.get(nsid) {
        ns.qos.set(n.qos);
    }
    Ok(nsid)
}

fn parse_uuid(s: &str) -> Result<[u8; 16], Error> {
    nvme::nqn::parse_uuid(s).ok_or_else(|| Error::new(ErrorKind::Config, format!("UUID {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("3 parsecs").is_err());
    }

    /// A port's `tls_offload`: auto unless it says "off", anything else refused, and a
    /// saved configuration writes it only when it is not the default.
    #[test]
    fn tls_offload_parses_defaults_and_saves() {
        let port = |extra: &str| format!("[[port]]\nid = 1\naddr = \"127.0.0.1:4420\"\ntls = \"required\"\n{extra}");
        let c = Config::parse(&port("tls_offload = \"off\"\n")).unwrap();
        assert_eq!(c.ports[0].tls_offload, crate::tls::TlsOffload::Off);
        let d = Config::parse(&port("")).unwrap();
        assert_eq!(d.ports[0].tls_offload, crate::tls::TlsOffload::Auto);
        assert!(Config::parse(&port("tls_offload = \"on\"\n")).is_err());
        let saved = toml::to_string(&c.ports[0]).unwrap();
        assert!(saved.contains("tls_offload = \"off\""), "{saved}");
        assert!(!toml::to_string(&d.ports[0]).unwrap().contains("tls_offload"));
    }

    #[test]
    fn fairness_options_parse_and_default() {
        let c = Config::parse("[options]\nrx_budget_pdus = 8\ntx_batch_bytes = 32768\ntx_deadline_us = 0\n").unwrap();
        assert_eq!((c.options.rx_budget_pdus, c.options.tx_batch_bytes, c.options.tx_deadline_us), (8, 32768, 0));
        let d = Config::parse("[options]\n").unwrap().options;
        assert_eq!((d.rx_budget_pdus, d.tx_batch_bytes, d.tx_deadline_us), (16, 64 * 1024, 50));
        assert!(Config::parse("[options]\ntx_deadline_us = -1\n").is_err(), "a negative deadline is refused");
        assert_eq!(d.auth_workers, crate::offload::MAX_WORKERS);
        assert_eq!(Config::parse("[options]\nauth_workers = 0\n").unwrap().options.auth_workers, 0);
    }

    #[test]
    fn parse_full_config() {
        let c = Config::parse(
            r#"
            [options]
            in_capsule_data_size = 4096
            [reactor]
            reactors = 1
            poll = "busy"
            [[port]]
            id = 1
            addr = "127.0.0.1:4420"
            [[port]]
            id = 3
            addr = "127.0.0.1:8009"
            kind = "discovery"
            [[subsystem]]
            nqn = "nqn.2026-11.io.qpath:a"
            hosts = ["nqn.h"]
            [[subsystem.namespace]]
            backend = "null"
            size = "1G"
            qos = { iops = 3500, bytes_per_sec = 170000000 }
            [[subsystem.namespace]]
            backend = "ram"
            size = "4M"
            prefault = true
            huge_pages = true
            [[ana]]
            port = 1
            group = 1
            state = "non-optimized"
            "#,
        )
        .unwrap();
        assert_eq!(c.options.in_capsule_data_size, 4096);
        assert_eq!(c.ports[1].kind, PortKind::Discovery);
        assert_eq!(c.subsystems[0].namespaces[0].qos.iops, 3500);
        assert!(!c.subsystems[0].namespaces[0].prefault, "lazy unless asked");
        assert!(c.subsystems[0].namespaces[1].prefault);
        let state = c.build_state().unwrap();
        let s = state.subsystem("nqn.2026-11.io.qpath:a").unwrap();
        assert!(!s.allows_host("nqn.other"));
        let (nss, _) = s.namespaces();
        assert_eq!(nss.len(), 2);
        let ram = nss.iter().find(|n| n.size_bytes() == 4 << 20).expect("the pre-faulted RAM namespace");
        assert_eq!(ram.block_size(), 512);
    }

    #[test]
    fn host_auth_entries() {
        let key = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        let c = Config::parse(&format!(
            r#"
            [[subsystem]]
            nqn = "nqn.2026-11.io.qpath:a"
            hosts = ["nqn.plain", {{ nqn = "nqn.auth", dhchap_key = "{key}", dhchap_ctrl_key = "{key}", hash = "sha512", dhgroup = "ffdhe3072" }}]
            "#
        ))
        .unwrap();
        let state = c.build_state().unwrap();
        let s = state.subsystem("nqn.2026-11.io.qpath:a").unwrap();
        assert!(s.allows_host("nqn.plain") && s.allows_host("nqn.auth"));
        assert!(s.host_auth("nqn.plain").is_none());
        let a = s.host_auth("nqn.auth").unwrap();
        assert_eq!((a.hash, a.dhgroup, a.ctrl_key.is_some()), (HashId::Sha512, DhGroup::Ffdhe3072, true));
        // A bad key, hash or group is a configuration error, not a silent "no authentication".
        for bad in [
            r#"{ nqn = "h", dhchap_key = "DHHC-1:01:AAAA:" }"#,
            r#"{ nqn = "h", dhchap_ctrl_key = "x" }"#,
            r#"{ nqn = "h", dhchap_key = "KEY", hash = "md5" }"#,
            r#"{ nqn = "h", dhchap_key = "KEY", dhgroup = "ffdhe1024" }"#,
            r#"{ nqn = "h", dhchap_key = "KEY", colour = 1 }"#,
        ] {
            let t = format!("[[subsystem]]\nnqn = \"nqn.2026-11.io.qpath:b\"\nhosts = [{}]\n", bad.replace("KEY", key));
            assert!(Config::parse(&t).and_then(|c| c.build_state().map(|_| ())).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_from_options() {
        let c = Config::parse("[options]\nmax_connections_per_hostnqn = 3\npdu_timeout_ms = 500\n").unwrap();
        let s = c.build_state().unwrap();
        let l = s.limits.get();
        assert_eq!((l.max_connections_per_hostnqn, l.pdu_timeout_ms), (Some(3), Some(500)));
        assert_eq!(l.max_connections_per_port, Some(TargetOptions::default().max_connections_per_port));
        let zero = Config::parse("[options]\nconnect_timeout_ms = 0\n").unwrap();
        assert!(zero.build_state().is_err(), "a zero timeout would lock every peer out");
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(Config::parse("[[port]]\nid = 1\naddr = \"x\"\ncolour = 3\n").is_err());
    }

    #[test]
    fn a_parse_error_names_the_line_not_its_text() {
        let key = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        let text = format!("[[subsystem]]\nnqn = \"nqn.x\"\nhosts = [{{ nqn = \"h\", dhchap_key = \"{key}\" ]\n");
        let e = Config::parse(&text).unwrap_err().to_string();
        assert!(e.starts_with("line 3, column "), "{e}");
        assert!(!e.contains("ia6zGodOr4SEG0Zzaw398"), "a secret in an error: {e}");
    }

    #[test]
    fn keys_from_files() {
        let d = Dir::new("keyfiles");
        let key = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        let f = d.0.join("host.key");
        std::fs::write(&f, format!("{key}\n")).unwrap();
        let host = |extra: &str| format!("[[subsystem]]\nnqn = \"{NQN}\"\nhosts = [{{ nqn = \"nqn.h\", {extra} }}]\n");
        let c = Config::parse(&host(&format!(
            "dhchap_key_file = \"{}\", dhchap_ctrl_key_file = \"{}\"",
            f.display(),
            f.display()
        )))
        .unwrap();
        let state = c.build_state().unwrap();
        let a = state.subsystem(NQN).unwrap().host_auth("nqn.h").unwrap();
        assert_eq!(a.host_key, Secret::parse(key).unwrap());
        assert_eq!(a.key_files.host.as_deref(), Some(f.as_path()));
        assert!(a.ctrl_key.is_some());
        let both = host(&format!("dhchap_key = \"{key}\", dhchap_key_file = \"{}\"", f.display()));
        assert!(err(&Config::parse(&both).unwrap()).contains("not both"));
        let missing = host(&format!("dhchap_key_file = \"{}\"", d.0.join("none").display()));
        let e = err(&Config::parse(&missing).unwrap());
        assert!(e.contains("dhchap_key_file") && e.contains("none"), "{e}");
        std::fs::write(&f, "DHHC-1:01:AAAA:").unwrap();
        let e = err(&Config::parse(&host(&format!("dhchap_key_file = \"{}\"", f.display()))).unwrap());
        assert!(e.contains(&f.display().to_string()) && !e.contains("AAAA"), "{e}");
    }

    /// A directory of its own for one test, removed at the end.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("qpath-config-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }

        fn image(&self, name: &str, len: u64) -> PathBuf {
            let p = self.0.join(name);
            std::fs::File::create(&p).unwrap().set_len(len).unwrap();
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const NQN: &str = "nqn.2026-11.io.qpath:vol1";

    /// A config with one subsystem whose namespaces are the given TOML bodies.
    fn config(namespaces: &[String]) -> Config {
        let mut t = format!("[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n");
        for n in namespaces {
            t += &format!("[[subsystem.namespace]]\n{n}\n");
        }
        Config::parse(&t).unwrap()
    }

    fn file_ns(path: &Path, extra: &str) -> String {
        format!("backend = \"file\"\npath = \"{}\"\n{extra}", path.display())
    }

    fn err(c: &Config) -> String {
        c.build_state().map(|_| ()).unwrap_err().to_string()
    }

    #[test]
    fn a_file_namespace_never_truncates_and_grows_only_with_grow() {
        let d = Dir::new("grow");
        let img = d.image("vol1.img", 64 << 20);
        let e = err(&config(&[file_ns(&img, "size = \"16M\"")]));
        assert!(e.starts_with(&format!("namespace 1 of {NQN}: {} is 64 MiB but size = 16 MiB", img.display())), "{e}");
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
        let e = err(&config(&[file_ns(&img, "size = \"128M\"")]));
        assert!(e.contains("asks for more") && e.contains("grow = true"), "{e}");
        let c = config(&[file_ns(&img, "size = \"128M\"\ngrow = true")]);
        assert!(c.subsystems[0].namespaces[0].grow);
        let state = c.build_state().unwrap();
        let (map, _) = state.subsystem(NQN).unwrap().namespaces();
        assert_eq!(map.get(nvme::Nsid(1)).unwrap().size_bytes(), 128 << 20);
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 128 << 20, "grown as asked");
        drop((map, state));
        let state = config(&[file_ns(&img, "")]).build_state().unwrap();
        assert_eq!(state.subsystem(NQN).unwrap().namespaces().0.get(nvme::Nsid(1)).unwrap().size_bytes(), 128 << 20);
        assert!(
            err(&config(&["backend = \"ram\"\nsize = \"1M\"\ngrow = true".into()])).contains("file namespaces only")
        );
    }

    #[test]
    fn two_namespaces_on_one_file_are_refused_naming_the_first() {
        let d = Dir::new("twice");
        let img = d.image("vol1.img", 1 << 20);
        let e = err(&config(&[file_ns(&img, ""), file_ns(&img, "")]));
        assert!(e.starts_with(&format!("namespace 2 of {NQN}: ")), "{e}");
        assert!(e.contains(&format!("already used by namespace 1 of {NQN}")), "{e}");
        // Two readonly namespaces may share it.
        let state =
            config(&[file_ns(&img, "readonly = true"), file_ns(&img, "readonly = true")]).build_state().unwrap();
        assert_eq!(state.subsystem(NQN).unwrap().namespaces().0.len(), 2);
    }

    #[test]
    fn a_failed_start_leaves_no_file_it_created() {
        let d = Dir::new("leftovers");
        let (new_a, new_b) = (d.0.join("a.img"), d.0.join("b.img"));
        let old = d.image("old.img", 8 << 20);
        let bad = config(&[
            file_ns(&new_a, "size = \"4M\""),
            file_ns(&new_b, "size = \"4M\""),
            file_ns(&old, "size = \"1M\""),
        ]);
        assert!(err(&bad).contains("namespace 3 of"));
        assert!(!new_a.exists() && !new_b.exists(), "the files this start created are gone");
        assert_eq!(std::fs::metadata(&old).unwrap().len(), 8 << 20, "the file it did not create stays as it was");
        // A port that cannot bind fails the start after the namespaces were built.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = config(&[file_ns(&new_a, "size = \"4M\"")]);
        c.reactor.reactors = 1;
        c.ports = vec![PortConfig::io(1, taken.local_addr().unwrap().to_string())];
        assert!(c.start().is_err());
        assert!(!new_a.exists(), "removed after a port failed to bind");
        // A failure inside one RPC add_namespace (an invalid block size, found after the
        // file was created) removes its file too, and leaves the target as it was.
        let state = config(&[]).build_state().unwrap();
        let sub = state.subsystem(NQN).unwrap();
        let mut n =
            NamespaceConfig { backend: "file".into(), path: Some(new_b.clone()), ..NamespaceConfig::ram(0, "4M") };
        n.block_size = 1000;
        assert!(add_namespace(&sub, &n).is_err());
        assert!(!new_b.exists() && sub.namespaces().0.is_empty());
        n.block_size = 4096;
        assert_eq!(add_namespace(&sub, &n).unwrap(), nvme::Nsid(1));
        assert!(new_b.exists(), "a namespace that started keeps its file");
    }

    #[test]
    fn a_subsystem_that_fails_is_not_left_half_built() {
        let d = Dir::new("half");
        let img = d.image("vol1.img", 1 << 20);
        let state = config(&[]).build_state().unwrap();
        let held = state.subsystem(NQN).unwrap();
        add_namespace(
            &held,
            &NamespaceConfig {
                backend: "file".into(),
                path: Some(img.clone()),
                size: None,
                ..NamespaceConfig::ram(0, "1M")
            },
        )
        .unwrap();
        let other = "nqn.2026-11.io.qpath:vol2";
        let mut s = SubsystemConfig::open(other, vec![NamespaceConfig::ram(1, "1M")]);
        s.namespaces.push(NamespaceConfig {
            backend: "file".into(),
            path: Some(img),
            size: None,
            ..NamespaceConfig::ram(2, "1M")
        });
        let e = add_subsystem(&state, &s).unwrap_err().to_string();
        assert!(e.contains(&format!("namespace 2 of {other}")) && e.contains(&format!("namespace 1 of {NQN}")), "{e}");
        assert!(state.subsystem(other).is_none(), "no half-built subsystem");
    }

    #[test]
    fn embedded_default_builds() {
        let c = Config::embedded_default();
        let s = c.build_state().unwrap();
        let sub = s.subsystem(DEFAULT_NQN).unwrap();
        assert_eq!(sub.namespaces().0.get(nvme::Nsid(1)).unwrap().size_bytes(), 1 << 30);
    }
}
