//! The host's side of the NVMe/TCP secure channel (NVMe/TCP 1.1 §3.6, TP 8011): a
//! controller connected with a TLS key (`qpath connect --tls --tls-key ...`, a bench URI's
//! `?tls_key=...`) runs every queue, admin and I/O, inside a TLS 1.3 channel whose PSK is
//! derived from that key for the host and subsystem NQNs (`tls::psk`).
//!
//! ```text
//!   configured key ─► retained PSK (host NQN) ─► identity NVMe1R01 <host> <subsys> <digest> + TLS PSK
//!   HostQueue::new ─► ClientHello ... handshake ─► ICReq, Connect, I/O as records
//! ```
//!
//! The handshake is a state machine inside the queue (`queue/secure.rs`), so the blocking
//! bring-up, the contexts' rings and the user queue pairs drive TLS queues unchanged, and a
//! reconnect makes a new channel like a new socket. Where the kernel offers kernel TLS (and
//! `ConnectOptions::tls_offload` is auto), the blocking bring-up hands the channel's keys to
//! the kernel once it stands at a record boundary, and the queue runs its plaintext path.

/// Whether TLS queues hand their records to kernel TLS (`ConnectOptions::tls_offload`).
pub use tls::kernel::Offload as TlsOffload;
/// Which PSK identity a host presents (`HostTls::identity`).
pub use tls::psk::IdentityVersion;
use tls::psk::{ConfiguredPsk, Derivation, Identity, RetainedPsk, TlsPsk};

/// A controller's TLS settings.
#[derive(Clone, Debug)]
pub struct HostTls {
    /// The configured PSK for this host and the target.
    pub key: ConfiguredPsk,
    /// The identity version to present: 1 (with the PSK digest, NVMe/TCP 1.1; default) or
    /// 0 (what Linux hosts before 6.14 present).
    pub identity: IdentityVersion,
    /// The form of the key's derivations (`nvme gen-tls-key --compat` keys: `Compat`).
    pub derivation: Derivation,
}

impl HostTls {
    /// Settings for `key` (an interchange-format string) with the defaults.
    pub fn parse(key: &str) -> Result<HostTls, tls::Error> {
        Ok(HostTls { key: ConfiguredPsk::parse(key)?, identity: IdentityVersion::V1, derivation: Derivation::Standard })
    }

    /// What one queue of `hostnqn` to `subnqn` presents.
    pub fn for_queue(&self, hostnqn: &str, subnqn: &str) -> QueueTls {
        let r = self.key.retained(hostnqn, self.derivation);
        let identity = r.identity(self.identity, hostnqn, subnqn);
        let psk = r.tls_psk(&identity).expect("a retained key derives the PSK of its own identity");
        QueueTls { identity, psk }
    }
}

impl QueueTls {
    /// What each queue after a concatenating transaction presents: the generated PSK's
    /// identity `NVMe1G<hh> <hostnqn> <subnqn> <digest>` and the TLS PSK derived from it
    /// (NVMe/TCP 1.1 §3.6.1.3, TP 8018; Linux `nvme_auth_secure_concat`).
    pub fn generated(psk: &RetainedPsk, hostnqn: &str, subnqn: &str) -> QueueTls {
        let identity = psk.generated_identity(hostnqn, subnqn);
        let psk = psk.tls_psk(&identity).expect("a generated key derives the PSK of its own identity");
        QueueTls { identity, psk }
    }
}

/// What a queue presents in its handshake.
#[derive(Clone, Debug)]
pub struct QueueTls {
    /// The PSK identity.
    pub identity: Identity,
    /// The TLS PSK.
    pub psk: TlsPsk,
}

impl QueueTls {
    /// A client channel with these (its ClientHello queued).
    pub fn channel(&self) -> Result<tls::Channel, tls::Error> {
        let cfg = tls::ClientConfig::shared()?;
        tls::Channel::client(&cfg, self.identity.clone(), self.psk.clone())
    }
}
