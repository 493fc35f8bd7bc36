//! The NVMe/TCP secure channel: TLS 1.3 with pre-shared keys (NVMe/TCP transport 1.1 §3.6,
//! TP 8011), between qpath's target and host and with Linux (nvmet and the host, whose
//! handshakes `tlshd` runs) and SPDK.
//!
//! ```text
//!   psk        configured PSK (NVMeTLSkey-1) → retained PSK → identity + TLS PSK
//!   handshake  OpenSSL over memory: ClientHello ... Finished, never blocking a thread
//!   record     AES-GCM record protection (ring's AES-GCM: VAES or AES-NI), sans-I/O
//!   channel    one connection's channel between the socket driver and the NVMe/TCP queue
//!   kernel     kernel TLS (TCP_ULP "tls"): the keys handed to the kernel after the handshake
//! ```
//!
//! ```
//! use std::sync::Arc;
//! use tls::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};
//! use tls::{Channel, ClientConfig, PskLookup, ServerConfig};
//!
//! // One configured key, as `qpath gen-tls-key` or `nvme gen-tls-key` prints it.
//! let key = ConfiguredPsk::generate(PskHash::Sha256)?;
//! let (host, subsys) = ("nqn.2014-08.org.nvmexpress:uuid:h1", "nqn.2026-11.io.qpath:s1");
//! struct Store(ConfiguredPsk);
//! impl PskLookup for Store {
//!     fn lookup(&self, id: &tls::psk::Identity) -> Option<tls::psk::TlsPsk> {
//!         self.0.retained(&id.hostnqn, Derivation::Standard).tls_psk(id)
//!     }
//! }
//! let server_cfg = ServerConfig::new(Arc::new(Store(key.clone())))?;
//! let retained = key.retained(host, Derivation::Standard);
//! let identity = retained.identity(IdentityVersion::V1, host, subsys);
//! let psk = retained.tls_psk(&identity).expect("our own identity");
//! let mut client = Channel::client(&*ClientConfig::shared()?, identity, psk)?;
//! let mut server = Channel::server(&server_cfg)?;
//! tls::channel::pump(&mut client, &mut server);
//! assert!(client.is_open() && server.is_open());
//! # Ok::<(), tls::Error>(())
//! ```

pub mod channel;
pub mod handshake;
pub mod kernel;
pub mod psk;
pub mod record;

pub use channel::{Channel, ChannelStats};
pub use handshake::{ClientConfig, PskLookup, ServerConfig};

/// What kind of failure an [`Error`] is.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A key that does not parse or fit.
    Key,
    /// A PSK identity that does not parse or fit.
    Identity,
    /// The handshake failed.
    Handshake,
    /// A record failed (its alert is in [`Error::alert`]).
    Record,
    /// OpenSSL or this crate failed unexpectedly.
    Internal,
}

/// An error of the secure channel. Its text never holds key material.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{msg}")]
pub struct Error {
    kind: ErrorKind,
    msg: String,
    alert: Option<u8>,
}

impl Error {
    fn new(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error { kind, msg: msg.into(), alert: None }
    }

    pub(crate) fn key(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Key, msg)
    }

    pub(crate) fn identity(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Identity, msg)
    }

    pub(crate) fn handshake(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Handshake, msg)
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, msg)
    }

    pub(crate) fn record(alert: u8, msg: impl Into<String>) -> Error {
        Error { kind: ErrorKind::Record, msg: msg.into(), alert: Some(alert) }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The alert description a record error sends (RFC 8446 §6.2).
    pub fn alert(&self) -> Option<u8> {
        self.alert
    }
}
