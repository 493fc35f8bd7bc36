//! The namespace a block device is built on, as `qpath ublk add` and `qpath nbd serve` take
//! it: `-a/-s/-n` (nvme-cli's names, several paths allowed) or one multipath URI.

use std::path::PathBuf;

use blockdev::spec::HeadSpec;

/// The paths of one namespace and how to connect them.
#[derive(clap::Args, Debug, Clone)]
pub struct HeadArgs {
    /// The namespace as a URI instead of -a/-s/-n:
    /// nvme+tcp://ADDR[:PORT][,ADDR[:PORT]...]/NQN[/NSID][?reconnect_delay=S&ctrl_loss_tmo=S&fast_io_fail_tmo=S]
    #[arg(long, conflicts_with_all = ["traddr", "nqn", "trsvcid"])]
    pub uri: Option<String>,
    /// Transport address of a path, ADDR or ADDR:PORT; repeat it for more paths.
    #[arg(short = 'a', long = "traddr")]
    pub traddr: Vec<String>,
    /// Port of the paths [default: 4420]. One -s applies to every -a; with one -a and
    /// several -s, each port is a path on that address; otherwise one -s per -a.
    #[arg(short = 's', long = "trsvcid")]
    pub trsvcid: Vec<u16>,
    /// Subsystem NQN.
    #[arg(short = 'n', long)]
    pub nqn: Option<String>,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// I/O policy over the paths: numa, round-robin, queue-depth or latency.
    #[arg(long, default_value = "numa")]
    pub iopolicy: String,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from the machine id).
    #[arg(short = 'q', long)]
    pub hostnqn: Option<String>,
    /// Host Identifier, a UUID (default: /etc/nvme/hostid, else derived from the machine id).
    #[arg(short = 'I', long)]
    pub hostid: Option<String>,
    /// I/O queues per controller (default: one per CPU).
    #[arg(short = 'i', long)]
    pub nr_io_queues: Option<u16>,
    /// Entries per I/O queue.
    #[arg(short = 'Q', long, default_value_t = 128)]
    pub queue_size: u16,
    /// Keep-alive timeout in seconds.
    #[arg(short = 'k', long, default_value_t = 5)]
    pub keep_alive_tmo: u32,
    /// Seconds between reconnect attempts of a lost path.
    #[arg(short = 'c', long, default_value_t = 10)]
    pub reconnect_delay: u64,
    /// Seconds without a connection before a path is given up (-1 = never).
    #[arg(short = 'l', long, default_value_t = 600, allow_hyphen_values = true)]
    pub ctrl_loss_tmo: i64,
    /// Seconds after which I/O waiting for a lost path fails (-1 = off: it waits for
    /// ctrl_loss_tmo).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub fast_io_fail_tmo: i64,
    /// Header digest on every queue.
    #[arg(short = 'g', long)]
    pub hdr_digest: bool,
    /// Data digest on every queue.
    #[arg(short = 'G', long)]
    pub data_digest: bool,
    /// File holding the DH-HMAC-CHAP host secret (DHHC-1:...), for targets that require
    /// in-band authentication. Only the file's path is kept (device state, `list`); the
    /// secret is read at each connect and never printed.
    #[arg(long, value_name = "FILE")]
    pub dhchap_secret_file: Option<PathBuf>,
    /// File holding the DH-HMAC-CHAP controller secret: the controller must prove itself too.
    #[arg(long, value_name = "FILE")]
    pub dhchap_ctrl_secret_file: Option<PathBuf>,
    /// File holding a TLS PSK (NVMeTLSkey-1:..., from `qpath gen-tls-key`): every queue runs
    /// inside TLS 1.3. Only the file's path is kept; the key is never printed.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// The TLS PSK identity to present: 1 (with the PSK digest; Linux 6.14+; the default)
    /// or 0 (Linux before 6.14, SPDK 24.01).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub tls_identity: Option<u8>,
    /// Secure channel concatenation (as `nvme connect --concat`): the admin queue
    /// authenticates in plaintext with --dhchap-secret-file, which makes the TLS key of every
    /// queue, anew at each connect. Not with --tls-key-file.
    #[arg(long)]
    pub concat: bool,
    /// Where a TLS queue's records are sealed after its handshake: by the kernel where it
    /// offers kernel TLS (auto, the default), or in user space (off).
    #[arg(long, value_name = "auto|off", value_parser = ["auto", "off"])]
    pub tls_offload: Option<String>,
}

impl HeadArgs {
    /// The head these arguments name.
    pub fn spec(&self) -> Result<HeadSpec, String> {
        let mut spec = match &self.uri {
            Some(uri) => from_uri(uri)?,
            None => {
                let nqn = self.nqn.clone().ok_or("-n/--nqn (or --uri) is required")?;
                HeadSpec::new(self.paths()?, &nqn)
            }
        };
        if self.uri.is_none() {
            spec.nsid = self.nsid;
        }
        spec.iopolicy.clone_from(&self.iopolicy);
        if self.hostnqn.is_some() {
            spec.hostnqn.clone_from(&self.hostnqn);
        }
        spec.hostid.clone_from(&self.hostid);
        spec.nr_io_queues = self.nr_io_queues.unwrap_or(0);
        spec.queue_size = self.queue_size;
        spec.keep_alive_tmo = self.keep_alive_tmo;
        if self.uri.is_none() {
            spec.reconnect_delay = self.reconnect_delay;
            spec.ctrl_loss_tmo = self.ctrl_loss_tmo;
            spec.fast_io_fail_tmo = self.fast_io_fail_tmo;
        }
        spec.hdr_digest |= self.hdr_digest;
        spec.data_digest |= self.data_digest;
        // Absolute, so a `qpath host` service started elsewhere reads the same files.
        let absolute = |f: &Option<PathBuf>| {
            f.as_deref().map(|f| std::path::absolute(f).map_err(|e| format!("{}: {e}", f.display()))).transpose()
        };
        spec.dhchap_secret_file = absolute(&self.dhchap_secret_file)?;
        spec.dhchap_ctrl_secret_file = absolute(&self.dhchap_ctrl_secret_file)?;
        spec.tls_key_file = absolute(&self.tls_key_file)?;
        if let Some(v) = self.tls_identity {
            spec.tls_identity = v;
        }
        spec.concat |= self.concat;
        if let Some(o) = &self.tls_offload {
            spec.tls_offload.clone_from(o);
        }
        spec.check().map_err(|e| e.to_string())?;
        Ok(spec)
    }

    fn paths(&self) -> Result<Vec<String>, String> {
        if self.traddr.is_empty() {
            return Err("-a/--traddr (or --uri) is required".into());
        }
        let with_port = |a: &str, p: u16| {
            // ADDR:PORT (a name, IPv4 or [IPv6]) keeps its port; a bare IPv6 gets brackets.
            let has_port =
                a.parse::<std::net::SocketAddr>().is_ok() || (!a.starts_with('[') && a.matches(':').count() == 1);
            if has_port {
                a.to_string()
            } else if a.contains(':') && !a.starts_with('[') {
                format!("[{a}]:{p}")
            } else {
                format!("{a}:{p}")
            }
        };
        let ports = &self.trsvcid;
        Ok(match (self.traddr.len(), ports.len()) {
            (_, 0) => self.traddr.iter().map(|a| with_port(a, nvme::tcp::IO_PORT)).collect(),
            (_, 1) => self.traddr.iter().map(|a| with_port(a, ports[0])).collect(),
            (1, _) => ports.iter().map(|&p| with_port(&self.traddr[0], p)).collect(),
            (a, p) if a == p => self.traddr.iter().zip(ports).map(|(a, &p)| with_port(a, p)).collect(),
            (a, p) => return Err(format!("{a} addresses and {p} ports: give one port, or one per address")),
        })
    }
}

fn from_uri(uri: &str) -> Result<HeadSpec, String> {
    let r = bench::filename::RemoteTarget::parse_uri(uri).map_err(|e| e.to_string())?;
    let mut paths = vec![host_port(&r.traddr, r.trsvcid)];
    paths.extend(r.more_paths.iter().map(|(a, p)| host_port(a, *p)));
    let mut spec = HeadSpec::new(paths, &r.subnqn);
    spec.nsid = r.nsid;
    spec.hostnqn = r.hostnqn;
    // Errors quote the URI with any secret in it redacted.
    let shown = bench::filename::redact_secrets(uri);
    for (k, v) in &r.extra {
        let bad = || format!("{shown}: {k}={v} is not a number of seconds");
        match k.as_str() {
            "reconnect_delay" => spec.reconnect_delay = v.parse().map_err(|_| bad())?,
            "ctrl_loss_tmo" => spec.ctrl_loss_tmo = v.parse().map_err(|_| bad())?,
            "fast_io_fail_tmo" => spec.fast_io_fail_tmo = v.parse().map_err(|_| bad())?,
            "concat" => {
                spec.concat = match v.to_ascii_lowercase().as_str() {
                    "1" | "true" | "yes" | "on" => true,
                    "0" | "false" | "no" | "off" => false,
                    _ => return Err(format!("{shown}: concat={v} is not a boolean (1 or 0)")),
                }
            }
            "tls_offload" => match tls::kernel::Offload::parse(v) {
                Some(o) => spec.tls_offload = o.name().to_string(),
                None => return Err(format!("{shown}: tls_offload={v} is not auto or off")),
            },
            "tls_identity" => {
                spec.tls_identity = match v.as_str() {
                    "0" => 0,
                    "1" => 1,
                    _ => return Err(format!("{shown}: tls_identity={v} is not 1 (with the key's digest) or 0")),
                }
            }
            "dhchap_secret" | "dhchap_ctrl_secret" | "tls_key" => {
                return Err(format!(
                    "{shown}: a block device keeps its settings (device state, `list`), so it takes \
                     secrets only from files: give --{}-file instead of {k}= in the URI",
                    k.replace('_', "-")
                ));
            }
            _ => return Err(format!("{shown}: option {k} is not one a block device takes")),
        }
    }
    spec.hdr_digest = r.hdgst;
    spec.data_digest = r.ddgst;
    Ok(spec)
}

fn host_port(a: &str, p: u16) -> String {
    if a.contains(':') { format!("[{a}]:{p}") } else { format!("{a}:{p}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        h: HeadArgs,
    }

    fn spec(args: &[&str]) -> Result<HeadSpec, String> {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map_err(|e| e.to_string())?.h.spec()
    }

    #[test]
    fn paths_from_addresses_and_ports() {
        let s = spec(&["-a", "127.0.0.1", "-s", "4420", "-s", "4421", "-n", "nqn.x:y"]).unwrap();
        assert_eq!(s.paths, ["127.0.0.1:4420", "127.0.0.1:4421"]);
        let s = spec(&["-a", "10.0.0.1", "-a", "10.0.1.1:4500", "-n", "nqn.x:y"]).unwrap();
        assert_eq!(s.paths, ["10.0.0.1:4420", "10.0.1.1:4500"]);
        assert!(spec(&["-a", "a", "-a", "b", "-s", "1", "-s", "2", "-s", "3", "-n", "n"]).is_err());
        assert!(spec(&["-a", "a"]).unwrap_err().contains("--nqn"));
    }

    #[test]
    fn uri_with_options() {
        let s =
            spec(&["--uri", "nvme+tcp://127.0.0.1:4420,127.0.0.1:4421/nqn.x:y/2?reconnect_delay=1&ctrl_loss_tmo=-1"])
                .unwrap();
        assert_eq!(s.paths, ["127.0.0.1:4420", "127.0.0.1:4421"]);
        assert_eq!((s.nsid, s.reconnect_delay, s.ctrl_loss_tmo), (2, 1, -1));
        assert!(spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?bogus=1"]).unwrap_err().contains("bogus"));
        let s = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?hdgst=1&ddgst=1"]).unwrap();
        assert!(s.hdr_digest && s.data_digest);
    }

    #[test]
    fn digests_and_secret_files() {
        let s = spec(&["-a", "h", "-n", "nqn.x:y"]).unwrap();
        assert!(!s.hdr_digest && !s.data_digest && s.tls_key_file.is_none() && s.dhchap_secret_file.is_none());
        let s = spec(&["-a", "h", "-n", "nqn.x:y", "-g", "-G", "--tls-key-file", "k", "--tls-identity", "0"]).unwrap();
        assert!(s.hdr_digest && s.data_digest);
        let k = s.tls_key_file.unwrap();
        assert!(k.is_absolute() && k.ends_with("k"), "{k:?}");
        assert_eq!(s.tls_identity, 0);
        assert!(spec(&["-a", "h", "-n", "n", "--tls-identity", "2"]).is_err());
        assert_eq!(spec(&["-a", "h", "-n", "nqn.x:y"]).unwrap().tls_offload, "auto");
        let s = spec(&["-a", "h", "-n", "nqn.x:y", "--tls-key-file", "k", "--tls-offload", "off"]).unwrap();
        assert_eq!(s.tls_offload, "off");
        assert!(spec(&["-a", "h", "-n", "nqn.x:y", "--tls-offload", "of"]).is_err());
        let s = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?tls_offload=off"]).unwrap();
        assert_eq!(s.tls_offload, "off", "the URI's choice stays when the flag is not given");
        let e = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?tls_offload=kernel"]).unwrap_err();
        assert!(e.contains("tls_offload=kernel"), "{e}");
        let s = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?tls_identity=0"]).unwrap();
        assert_eq!(s.tls_identity, 0, "the URI's choice stays when the flag is not given");
        let s = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?tls_identity=0", "--tls-identity", "1"]).unwrap();
        assert_eq!(s.tls_identity, 1, "the flag wins");
        assert_eq!(spec(&["-a", "h", "-n", "nqn.x:y"]).unwrap().tls_identity, 1, "1 by default");
        let e = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?tls_identity=v0"]).unwrap_err();
        assert!(e.contains("tls_identity=v0 is not 1"), "{e}");
        let s = spec(&["-a", "h", "-n", "n", "--dhchap-secret-file", "/s", "--dhchap-ctrl-secret-file", "/c"]).unwrap();
        assert_eq!(
            (s.dhchap_secret_file.as_deref(), s.dhchap_ctrl_secret_file.as_deref()),
            (Some("/s".as_ref()), Some("/c".as_ref()))
        );
        // A controller secret alone: the host authenticates first.
        assert!(spec(&["-a", "h", "-n", "n", "--dhchap-ctrl-secret-file", "/c"]).unwrap_err().contains("host secret"));
    }

    #[test]
    fn concat_from_the_flag_or_the_uri_with_a_secret_file() {
        let s = spec(&["-a", "h", "-n", "n", "--concat", "--dhchap-secret-file", "/s"]).unwrap();
        assert!(s.concat);
        let s = spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?concat=1", "--dhchap-secret-file", "/s"]).unwrap();
        assert!(s.concat);
        assert!(!spec(&["-a", "h", "-n", "n"]).unwrap().concat);
        assert!(spec(&["-a", "h", "-n", "n", "--concat"]).unwrap_err().contains("secret file"));
        assert!(spec(&["--uri", "nvme+tcp://h/nqn.x:y/1?concat=maybe"]).unwrap_err().contains("concat=maybe"));
    }

    #[test]
    fn secrets_in_a_uri_are_refused_without_being_echoed() {
        for (opt, file_flag) in [
            ("dhchap_secret=DHHC-1:00:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTIzNDU2Nzg=:", "--dhchap-secret-file"),
            ("tls_key=NVMeTLSkey-1:01:AAAA:", "--tls-key-file"),
        ] {
            let e = spec(&["--uri", &format!("nvme+tcp://h/nqn.x:y/1?{opt}")]).unwrap_err();
            assert!(e.contains(file_flag), "{e}");
            assert!(!e.contains("DHHC-1") && !e.contains("NVMeTLSkey"), "the error echoes the secret: {e}");
        }
    }
}
