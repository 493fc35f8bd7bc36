//! What a device is built on: the paths of one namespace and how to connect them. A
//! [`HeadSpec`] is what `qpath ublk add` / `qpath nbd serve` take on the command line, what
//! the RPC takes as parameters, and what a ublk device's state file keeps so a restarted
//! `qpath` can connect the same head again (user recovery).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use host::controller::{ConnectOptions, Controller, default_host_identity};
use host::head::Head;
use host::mpath::Policy;
use nvme::Nsid;

use crate::error::{Error, ErrorKind, Result};

/// Most paths one head may have.
pub const PATHS_MAX: usize = 16;

/// One namespace, its paths, and the connection options (nvme-cli's names and defaults).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadSpec {
    /// Transport addresses of the paths, `HOST:PORT` each.
    pub paths: Vec<String>,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID.
    #[serde(default = "one")]
    pub nsid: u32,
    /// I/O policy: numa, round-robin, queue-depth or latency.
    #[serde(default = "numa")]
    pub iopolicy: String,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from the machine id).
    #[serde(default)]
    pub hostnqn: Option<String>,
    /// Host Identifier as a UUID (default: /etc/nvme/hostid, else derived).
    #[serde(default)]
    pub hostid: Option<String>,
    /// I/O queues per controller (0: one per CPU).
    #[serde(default)]
    pub nr_io_queues: u16,
    /// Entries per I/O queue.
    #[serde(default = "queue_size")]
    pub queue_size: u16,
    /// Keep-alive timeout, seconds.
    #[serde(default = "kato")]
    pub keep_alive_tmo: u32,
    /// Seconds between reconnect attempts.
    #[serde(default = "reconnect_delay")]
    pub reconnect_delay: u64,
    /// Seconds without a connection before a controller is given up (-1: never).
    #[serde(default = "ctrl_loss_tmo")]
    pub ctrl_loss_tmo: i64,
    /// Seconds after which I/O waiting for a lost path fails (-1: off).
    #[serde(default = "minus_one")]
    pub fast_io_fail_tmo: i64,
    /// Header digest on every queue (`nvme connect -g`).
    #[serde(default)]
    pub hdr_digest: bool,
    /// Data digest on every queue (`nvme connect -G`).
    #[serde(default)]
    pub data_digest: bool,
    /// File holding the DH-HMAC-CHAP host secret (`DHHC-1:..`). The spec keeps the path,
    /// never the secret: it is read at each connect, so a spec can be printed, sent over the
    /// control socket and kept in a device's state file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret_file: Option<PathBuf>,
    /// File holding the DH-HMAC-CHAP controller secret: the controller must prove itself too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret_file: Option<PathBuf>,
    /// File holding the TLS PSK in the interchange format (`NVMeTLSkey-1:..`): every queue
    /// runs inside TLS 1.3 (`nvme connect --tls --tls-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// The TLS PSK identity to present: 1 (with the PSK digest; Linux 6.14+) or 0.
    #[serde(default = "tls_identity")]
    pub tls_identity: u8,
    /// Secure channel concatenation (`nvme connect --concat`): the admin queue's
    /// DH-HMAC-CHAP transaction (its secret from `dhchap_secret_file`) makes the TLS key of
    /// every queue, anew at each connect.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub concat: bool,
    /// `auto`: a TLS queue hands its records to the kernel after the handshake where the
    /// kernel offers kernel TLS; `off`: they stay in user space (`--tls-offload`).
    #[serde(default = "tls_offload", skip_serializing_if = "is_auto")]
    pub tls_offload: String,
}

fn one() -> u32 {
    1
}
fn numa() -> String {
    "numa".into()
}
fn queue_size() -> u16 {
    128
}
fn kato() -> u32 {
    5
}
fn reconnect_delay() -> u64 {
    10
}
fn ctrl_loss_tmo() -> i64 {
    600
}
fn minus_one() -> i64 {
    -1
}
fn tls_identity() -> u8 {
    1
}
fn tls_offload() -> String {
    "auto".into()
}
fn is_auto(s: &str) -> bool {
    s == "auto"
}

/// Reads a secret from `file` (surrounding whitespace dropped). Errors name the file and
/// the reason, never what the file holds.
fn read_secret(file: &Path, what: &str) -> Result<String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::new(ErrorKind::Invalid, format!("{what} file {}: {e}", file.display())))?;
    Ok(text.trim().to_string())
}

/// Secrets read from a spec's files for one connect.
struct Secrets {
    dhchap: Option<String>,
    dhchap_ctrl: Option<String>,
    tls: Option<host::tls::HostTls>,
}

impl HeadSpec {
    /// A spec with nvme-cli's defaults for `paths` of `subnqn`.
    pub fn new(paths: Vec<String>, subnqn: &str) -> HeadSpec {
        HeadSpec {
            paths,
            subnqn: subnqn.to_string(),
            nsid: one(),
            iopolicy: numa(),
            hostnqn: None,
            hostid: None,
            nr_io_queues: 0,
            queue_size: queue_size(),
            keep_alive_tmo: kato(),
            reconnect_delay: reconnect_delay(),
            ctrl_loss_tmo: ctrl_loss_tmo(),
            fast_io_fail_tmo: minus_one(),
            hdr_digest: false,
            data_digest: false,
            dhchap_secret_file: None,
            dhchap_ctrl_secret_file: None,
            tls_key_file: None,
            tls_identity: tls_identity(),
            concat: false,
            tls_offload: tls_offload(),
        }
    }

    /// The policy named by `iopolicy`.
    pub fn policy(&self) -> Result<Policy> {
        parse_policy(&self.iopolicy)
    }

    /// Checks the spec without connecting anything.
    pub fn check(&self) -> Result<()> {
        if self.paths.is_empty() || self.paths.len() > PATHS_MAX {
            return Err(Error::new(ErrorKind::Invalid, format!("a head needs 1 to {PATHS_MAX} paths")));
        }
        if self.subnqn.is_empty() || self.subnqn.len() > 223 {
            return Err(Error::new(ErrorKind::Invalid, "the subsystem NQN must be 1 to 223 bytes"));
        }
        if self.nsid == 0 || self.nsid == u32::MAX {
            return Err(Error::new(ErrorKind::Invalid, format!("nsid {} is not a namespace", self.nsid)));
        }
        self.policy()?;
        if let Some(h) = &self.hostid {
            nvme::nqn::parse_uuid(h)
                .ok_or_else(|| Error::new(ErrorKind::Invalid, format!("hostid {h:?}: not a UUID")))?;
        }
        if tls::kernel::Offload::parse(&self.tls_offload).is_none() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("tls_offload {:?}: expected auto or off", self.tls_offload),
            ));
        }
        if self.tls_identity > 1 {
            return Err(Error::new(ErrorKind::Invalid, format!("tls_identity {}: expected 0 or 1", self.tls_identity)));
        }
        if self.concat && (self.dhchap_secret_file.is_none() || self.tls_key_file.is_some()) {
            return Err(Error::new(
                ErrorKind::Invalid,
                "secure channel concatenation needs a DH-HMAC-CHAP secret file and makes its own TLS key \
                 (no TLS key file)",
            ));
        }
        for (f, what) in [
            (&self.dhchap_secret_file, "DH-HMAC-CHAP secret file"),
            (&self.dhchap_ctrl_secret_file, "DH-HMAC-CHAP controller secret file"),
            (&self.tls_key_file, "TLS key file"),
        ] {
            // A secret given where its file's path belongs would be kept and shown as a
            // path: refused without repeating it.
            let p = f.as_deref().map(Path::to_string_lossy).unwrap_or_default();
            if p.contains("DHHC-1:") || p.contains("NVMeTLSkey-") {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    format!("{what}: give the path of a file that holds the secret, not the secret itself"),
                ));
            }
        }
        if self.dhchap_ctrl_secret_file.is_some() && self.dhchap_secret_file.is_none() {
            return Err(Error::new(
                ErrorKind::Invalid,
                "a DH-HMAC-CHAP controller secret needs a host secret too (the host authenticates first)",
            ));
        }
        Ok(())
    }

    /// Reads and checks the secrets the spec's files hold.
    fn secrets(&self) -> Result<Secrets> {
        let file = |f: &Option<PathBuf>, what| f.as_deref().map(|f| read_secret(f, what)).transpose();
        let dhchap = file(&self.dhchap_secret_file, "DH-HMAC-CHAP secret")?;
        let dhchap_ctrl = file(&self.dhchap_ctrl_secret_file, "DH-HMAC-CHAP controller secret")?;
        // Checked here so a bad file is refused before any path connects; the parse error
        // says what is wrong with the format, never what the secret is.
        let check = |secret: &Option<String>, f: &Option<PathBuf>| match (secret, f) {
            (Some(secret), Some(f)) => nvme::auth::Secret::parse(secret)
                .map(drop)
                .map_err(|e| Error::new(ErrorKind::Invalid, format!("DH-HMAC-CHAP secret file {}: {e}", f.display()))),
            _ => Ok(()),
        };
        check(&dhchap, &self.dhchap_secret_file)?;
        check(&dhchap_ctrl, &self.dhchap_ctrl_secret_file)?;
        let tls = match &self.tls_key_file {
            None => None,
            Some(f) => {
                // The key's text is wiped when dropped, as the target does with its key files.
                let text = zeroize::Zeroizing::new(read_secret(f, "TLS key")?);
                let mut t = host::tls::HostTls::parse(&text)
                    .map_err(|e| Error::new(ErrorKind::Invalid, format!("TLS key file {}: {e}", f.display())))?;
                if self.tls_identity == 0 {
                    t.identity = tls::psk::IdentityVersion::V0;
                }
                Some(t)
            }
        };
        Ok(Secrets { dhchap, dhchap_ctrl, tls })
    }

    fn options(&self, addr: SocketAddr, secrets: &Secrets) -> Result<ConnectOptions> {
        let (nqn, id) = default_host_identity();
        let mut o = ConnectOptions::new(addr, &self.subnqn);
        o.hostnqn = self.hostnqn.clone().unwrap_or(nqn);
        o.hostid = match &self.hostid {
            Some(h) => nvme::nqn::parse_uuid(h)
                .ok_or_else(|| Error::new(ErrorKind::Invalid, format!("hostid {h:?}: not a UUID")))?,
            None => id,
        };
        o.nr_io_queues = self.nr_io_queues;
        o.queue_size = self.queue_size;
        o.kato_ms = self.keep_alive_tmo.saturating_mul(1000);
        o.reconnect_delay = Duration::from_secs(self.reconnect_delay);
        o.ctrl_loss_tmo = u64::try_from(self.ctrl_loss_tmo).ok().map(Duration::from_secs);
        o.fast_io_fail_tmo = u64::try_from(self.fast_io_fail_tmo).ok().map(Duration::from_secs);
        o.hdr_digest = self.hdr_digest;
        o.data_digest = self.data_digest;
        o.dhchap_secret.clone_from(&secrets.dhchap);
        o.dhchap_ctrl_secret.clone_from(&secrets.dhchap_ctrl);
        o.tls.clone_from(&secrets.tls);
        o.concat = self.concat;
        o.tls_offload = tls::kernel::Offload::parse(&self.tls_offload).unwrap_or_default();
        Ok(o)
    }

    /// Connects every path (in parallel) and groups them into the namespace's head. Every
    /// path must connect, as `nvme connect` must for each; later losses are the head's to
    /// absorb.
    pub fn connect(&self) -> Result<(Vec<Arc<Controller>>, Arc<Head>)> {
        self.check()?;
        let secrets = self.secrets()?;
        let mut opts = Vec::new();
        for p in &self.paths {
            let addr = p
                .to_socket_addrs()
                .map_err(|e| Error::new(ErrorKind::Invalid, format!("path {p}: {e}")))?
                .next()
                .ok_or_else(|| Error::new(ErrorKind::Invalid, format!("path {p} resolves to nothing")))?;
            opts.push((p.clone(), self.options(addr, &secrets)?));
        }
        let results: Vec<(String, host::Result<Arc<Controller>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = opts.into_iter().map(|(p, o)| s.spawn(move || (p, Controller::connect(o)))).collect();
            handles.into_iter().map(|h| h.join().expect("connect thread")).collect()
        });
        let mut ctrls = Vec::new();
        let mut failed = Vec::new();
        for (p, r) in results {
            match r {
                Ok(c) => ctrls.push(c),
                Err(e) => failed.push(format!("{p}: {e}")),
            }
        }
        if !failed.is_empty() {
            for c in &ctrls {
                c.delete();
            }
            return Err(Error::new(
                ErrorKind::Host,
                format!("connecting {} failed: {}", self.subnqn, failed.join("; ")),
            ));
        }
        let nsid = Nsid(self.nsid);
        let head = Head::build(&ctrls, self.policy()?)
            .into_iter()
            .find(|h| h.paths().iter().flatten().any(|(c, n)| Arc::ptr_eq(c, &ctrls[0]) && *n == nsid));
        let Some(head) = head else {
            for c in &ctrls {
                c.delete();
            }
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("{} has no namespace {} with a unique identifier through {}", self.subnqn, nsid, self.paths[0]),
            ));
        };
        if head.path_count() < ctrls.len() {
            tracing::warn!(
                subnqn = %self.subnqn, nsid = self.nsid, paths = head.path_count(), controllers = ctrls.len(),
                "not every controller reaches the namespace with the same identifier: fewer paths than addresses"
            );
        }
        Ok((ctrls, head))
    }
}

/// Parses an I/O policy name (Linux's iopolicy names, plus `latency`).
pub fn parse_policy(name: &str) -> Result<Policy> {
    match name.trim().to_ascii_lowercase().as_str() {
        "numa" => Ok(Policy::Numa),
        "round-robin" | "round_robin" => Ok(Policy::RoundRobin { rr_min_io: 1 }),
        "queue-depth" | "queue_depth" => Ok(Policy::QueueDepth),
        "latency" => Ok(Policy::LATENCY),
        other => Err(Error::new(
            ErrorKind::Invalid,
            format!("iopolicy {other:?}: expected numa, round-robin, queue-depth or latency"),
        )),
    }
}

/// Disconnects a head's controllers.
pub fn disconnect(ctrls: &[Arc<Controller>]) {
    for c in ctrls {
        c.delete();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_defaults() {
        let s: HeadSpec = serde_json::from_str(r#"{"paths": ["127.0.0.1:4420"], "subnqn": "nqn.x:y"}"#).unwrap();
        assert_eq!(s, HeadSpec::new(vec!["127.0.0.1:4420".into()], "nqn.x:y"));
        let back: HeadSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<HeadSpec>(r#"{"paths": [], "subnqn": "n", "typo": 1}"#).is_err());
    }

    #[test]
    fn checks() {
        let mut s = HeadSpec::new(vec!["127.0.0.1:4420".into()], "nqn.x:y");
        assert!(s.check().is_ok());
        s.iopolicy = "fastest".into();
        assert!(s.check().unwrap_err().context.contains("iopolicy"));
        s.iopolicy = "queue-depth".into();
        s.nsid = 0;
        assert!(s.check().is_err());
        s.nsid = 1;
        s.paths.clear();
        assert!(s.check().is_err());
        s.paths.push("a:1".into());
        s.hostid = Some("not-a-uuid".into());
        assert!(s.check().unwrap_err().context.contains("UUID"));
        s.hostid = None;
        s.tls_key_file = Some("/home/u/NVMeTLSkey-1:01:AAAA:".into());
        let e = s.check().unwrap_err().context;
        assert!(e.contains("not the secret itself") && !e.contains("AAAA"), "{e}");
        s.tls_key_file = None;
        s.tls_identity = 2;
        assert!(s.check().is_err());
        s.tls_identity = 1;
        s.dhchap_ctrl_secret_file = Some("/c".into());
        assert!(s.check().unwrap_err().context.contains("host secret"));
    }

    /// `tls_offload` reaches the controller's options, is checked, and a spec saved before
    /// it existed (device state files) reads back as `auto`.
    #[test]
    fn tls_offload_is_checked_kept_and_defaults_to_auto() {
        let mut s = HeadSpec::new(vec!["127.0.0.1:4420".into()], "nqn.x:y");
        let none = Secrets { dhchap: None, dhchap_ctrl: None, tls: None };
        let addr = "127.0.0.1:4420".parse().unwrap();
        assert_eq!(s.options(addr, &none).unwrap().tls_offload, tls::kernel::Offload::Auto);
        assert!(!serde_json::to_string(&s).unwrap().contains("tls_offload"), "auto is not written");
        s.tls_offload = "off".into();
        assert!(s.check().is_ok());
        assert_eq!(s.options(addr, &none).unwrap().tls_offload, tls::kernel::Offload::Off);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<HeadSpec>(&json).unwrap().tls_offload, "off");
        s.tls_offload = "kernel".into();
        assert!(s.check().unwrap_err().context.contains("tls_offload \"kernel\""));
        let old = r#"{"paths":["127.0.0.1:4420"],"subnqn":"nqn.x:y"}"#;
        assert_eq!(serde_json::from_str::<HeadSpec>(old).unwrap().tls_offload, "auto");
    }

    /// A spec keeps secret files by path: its JSON (device state files, RPC answers) never
    /// holds a secret, and a file that holds something else is refused naming the file only.
    #[test]
    fn secrets_are_read_from_files_and_never_kept() {
        let dir = std::env::temp_dir().join(format!("qpath-spec-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("host.key");
        let secret = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
        std::fs::write(&good, format!("{secret}\n")).unwrap();
        let bad = dir.join("bad.key");
        std::fs::write(&bad, "hunter2-not-a-secret\n").unwrap();
        let mut s = HeadSpec::new(vec!["127.0.0.1:4420".into()], "nqn.x:y");
        s.dhchap_secret_file = Some(good.clone());
        let got = s.secrets().unwrap();
        assert_eq!(got.dhchap.as_deref(), Some(secret), "read and trimmed");
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("host.key") && !json.contains("DHHC"), "{json}");
        assert_eq!(serde_json::from_str::<HeadSpec>(&json).unwrap(), s);
        s.dhchap_secret_file = Some(bad.clone());
        let e = s.secrets().err().unwrap().context;
        assert!(e.contains("bad.key") && !e.contains("hunter2"), "{e}");
        s.dhchap_secret_file = None;
        s.tls_key_file = Some(bad);
        let e = s.secrets().err().unwrap().context;
        assert!(e.contains("TLS key file") && e.contains("bad.key") && !e.contains("hunter2"), "{e}");
        s.tls_key_file = Some(dir.join("missing.key"));
        assert!(s.secrets().err().unwrap().context.contains("missing.key"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
