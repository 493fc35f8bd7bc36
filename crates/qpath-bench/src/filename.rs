//! What a job's `filename` names: a local file or block device, a remote NVMe/TCP
//! namespace, or nothing (the `qpath` bin then starts an embedded target).
//!
//! Remote targets come in two spellings:
//!
//! - SPDK's transport ID, as used with SPDK's fio plugin:
//!   `trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2016-06.io.spdk:cnode1 ns=1`.
//!   Keys are case-insensitive and may be written `key=value` or `key:value`; fio job files
//!   escape `:` as `\:` because fio splits filename lists on `:`, so `\:` is unescaped here.
//! - A URI: `nvme+tcp://127.0.0.1:4420/nqn.2016-06.io.spdk:cnode1/1?hostnqn=...&hdgst=1&ddgst=1`
//!   (port defaults to 4420, namespace to 1, IPv6 hosts in brackets, `%XX` escapes in the NQN).
//!   `reconnect_delay=SECS` and `ctrl_loss_tmo=SECS|-1` set the controller's reconnect
//!   behaviour as `nvme connect -c/-l` do (defaults 10 and 600, as Linux);
//!   `fast_io_fail_tmo=SECS|-1` how long I/O waits for a lost controller before failing
//!   (default 5 s for bench jobs, off when the URI asks for reconnects: see
//!   [`crate::engine::remote::DEFAULT_FAST_IO_FAIL_TMO`]);
//!   `keep_alive_tmo=SECS` the keep-alive timeout (`nvme connect -k`, default 5; it also
//!   sets how long a write whose connection was lost is held before it is sent again);
//!   `tcp_congestion=NAME` the connections' TCP congestion control (`cubic`, `bbr`, ...;
//!   default the system's); `dhchap_secret=DHHC-1:..` and `dhchap_ctrl_secret=DHHC-1:..`
//!   DH-HMAC-CHAP as `nvme connect --dhchap-secret/--dhchap-ctrl-secret`;
//!   `tls_key=NVMeTLSkey-1:..` runs every queue inside TLS 1.3 as `nvme connect --tls
//!   --tls-key` (redacted from reports like the secrets); `concat=1` secure channel
//!   concatenation as `nvme connect --concat` (with `dhchap_secret`); `tls_offload=off`
//!   keeps TLS records in user space instead of handing them to kernel TLS (default
//!   auto); other keys
//!   are kept in [`RemoteTarget::extra`] for the engine.
//!
//! Multipath: a URI may name several transport addresses of the same subsystem, comma
//! separated, as multi-host database URIs do:
//! `nvme+tcp://10.0.0.1:4420,10.0.1.1:4420/nqn.2016-06.io.spdk:cnode1/1`. Each address is
//! one path (one controller) to the namespace; the `qpath` engine opens them as one
//! multipath head ([`RemoteTarget::paths`]). fio's own `:`-separated file list would need
//! every `:` of a URI escaped, so it is not used for this.
//!
//! The raw string is kept in [`Target::raw`] so an engine can re-read it untouched.

use std::path::PathBuf;

use crate::error::{Error, ErrorKind, Result};

/// The NVMe/TCP I/O port (REFERENCE: "I/O port 4420").
pub const NVME_TCP_PORT: u16 = 4420;
/// Longest NQN the NVMe spec allows (223 bytes of UTF-8).
pub const NQN_MAX: usize = 223;

/// IP address family of a remote target (`adrfam`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// `adrfam=IPv4` (NVMe discovery log value 1).
    Ipv4,
    /// `adrfam=IPv6` (value 2).
    Ipv6,
}

/// A remote NVMe/TCP namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTarget {
    /// Transport address (IP literal or host name).
    pub traddr: String,
    /// Transport service id: the TCP port.
    pub trsvcid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace id (1-based).
    pub nsid: u32,
    /// Address family.
    pub adrfam: AddressFamily,
    /// Host NQN to connect as, if given.
    pub hostnqn: Option<String>,
    /// Header digest requested (`hdgst=1`).
    pub hdgst: bool,
    /// Data digest requested (`ddgst=1`).
    pub ddgst: bool,
    /// Other `key=value` pairs, lower-cased keys, in order, for the engine to interpret.
    pub extra: Vec<(String, String)>,
    /// Further paths to the same namespace: `(traddr, trsvcid)` of each address after
    /// the first in a multipath URI (empty for one path).
    pub more_paths: Vec<(String, u16)>,
}

/// Most transport addresses one multipath URI may name.
pub const PATHS_MAX: usize = 16;

/// Where a job's I/O goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetKind {
    /// A local file or block device (fio's `\:` escapes removed).
    Local(PathBuf),
    /// A remote NVMe/TCP namespace.
    Remote(RemoteTarget),
    /// No `filename` and no `directory`: the `qpath` bin provides an embedded target.
    Embedded,
}

/// A parsed `filename` plus the text it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The parsed form.
    pub kind: TargetKind,
    /// The `filename` value exactly as written (empty for [`TargetKind::Embedded`]).
    pub raw: String,
}

impl Target {
    /// Parse a `filename` value (`None` = no filename given).
    pub fn parse(filename: Option<&str>) -> Result<Target> {
        let Some(raw) = filename else {
            return Ok(Target { kind: TargetKind::Embedded, raw: String::new() });
        };
        let kind = if raw.trim_start().starts_with("nvme+") || raw.contains("://") {
            TargetKind::Remote(RemoteTarget::parse_uri(raw.trim())?)
        } else if looks_like_spdk(raw) {
            TargetKind::Remote(RemoteTarget::parse_spdk(raw)?)
        } else {
            TargetKind::Local(parse_local(raw)?)
        };
        Ok(Target { kind, raw: raw.to_string() })
    }

    /// Whether the I/O goes over NVMe/TCP (remote or embedded).
    pub fn is_remote(&self) -> bool {
        !matches!(self.kind, TargetKind::Local(_))
    }

    /// The local path, if this is a local target.
    pub fn local_path(&self) -> Option<&std::path::Path> {
        match &self.kind {
            TargetKind::Local(p) => Some(p),
            _ => None,
        }
    }
}

fn looks_like_spdk(raw: &str) -> bool {
    raw.split_whitespace().any(|tok| {
        let lower = tok.to_ascii_lowercase();
        lower.starts_with("trtype=") || lower.starts_with("trtype:") || lower.starts_with("trtype\\:")
    })
}

fn parse_local(raw: &str) -> Result<PathBuf> {
    // fio splits `a:b` into two files; `\:` is a literal colon.
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&':') => {
                out.push(':');
                chars.next();
            }
            ':' => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "filename={raw}: several files per job (':'-separated) are not supported; \
                         escape a literal colon as '\\:'"
                    ),
                ));
            }
            _ => out.push(c),
        }
    }
    if out.is_empty() {
        return Err(Error::new(ErrorKind::Target, "empty filename"));
    }
    Ok(PathBuf::from(out))
}

/// An error about a filename, quoted with its secrets redacted.
fn target_err(raw: &str, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Target, format!("filename={}: {why}", redact_secrets(raw)))
}

/// What a URI's query may hold besides the transport ID's own keys (`hostnqn`, `hdgst`,
/// `ddgst`, `adrfam`...): the engines read these from [`RemoteTarget::extra`].
pub const URI_OPTIONS: [&str; 11] = [
    "reconnect_delay",
    "ctrl_loss_tmo",
    "fast_io_fail_tmo",
    "keep_alive_tmo",
    "tcp_congestion",
    "dhchap_secret",
    "dhchap_ctrl_secret",
    "tls_key",
    "concat",
    "tls_offload",
    "tls_identity",
];

fn parse_bool_flag(raw: &str, key: &str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(target_err(raw, format!("{key}={v} is not a boolean"))),
    }
}

impl RemoteTarget {
    fn new_empty() -> RemoteTarget {
        RemoteTarget {
            traddr: String::new(),
            trsvcid: NVME_TCP_PORT,
            subnqn: String::new(),
            nsid: 1,
            adrfam: AddressFamily::Ipv4,
            hostnqn: None,
            hdgst: false,
            ddgst: false,
            extra: Vec::new(),
            more_paths: Vec::new(),
        }
    }

    /// Number of paths (transport addresses) named.
    pub fn path_count(&self) -> usize {
        1 + self.more_paths.len()
    }

    /// One single-path target per transport address, first address first; every other
    /// field is the same.
    pub fn paths(&self) -> Vec<RemoteTarget> {
        let first = RemoteTarget { more_paths: Vec::new(), ..self.clone() };
        let mut out = vec![first.clone()];
        for (traddr, trsvcid) in &self.more_paths {
            out.push(RemoteTarget { traddr: traddr.clone(), trsvcid: *trsvcid, ..first.clone() });
        }
        out
    }

    /// Parse SPDK's transport ID form (`trtype=TCP traddr=... subnqn=... ns=1`).
    pub fn parse_spdk(raw: &str) -> Result<RemoteTarget> {
        let text = raw.replace("\\:", ":");
        let mut t = RemoteTarget::new_empty();
        let mut saw_adrfam = false;
        for tok in text.split_whitespace() {
            // `key=value` or `key:value`: split at whichever comes first.
            let split = tok.find(['=', ':']).ok_or_else(|| target_err(raw, format!("'{tok}' is not key=value")))?;
            let (key, value) = (tok[..split].to_ascii_lowercase(), &tok[split + 1..]);
            if value.is_empty() {
                return Err(target_err(raw, format!("{key} has no value")));
            }
            t.set(raw, &key, value, &mut saw_adrfam)?;
        }
        t.finish(raw, saw_adrfam)
    }

    /// The URI form of this target ([`RemoteTarget::parse_uri`] reads it back to an
    /// equal value, `extra` pairs included).
    pub fn to_uri(&self) -> String {
        let host = |a: &str| if a.contains(':') { format!("[{a}]") } else { a.to_string() };
        let mut authority = format!("{}:{}", host(&self.traddr), self.trsvcid);
        for (a, p) in &self.more_paths {
            authority.push_str(&format!(",{}:{p}", host(a)));
        }
        let mut s = format!("nvme+tcp://{authority}/{}/{}", percent_encode(&self.subnqn), self.nsid);
        let mut query: Vec<String> = Vec::new();
        if let Some(h) = &self.hostnqn {
            query.push(format!("hostnqn={}", percent_encode(h)));
        }
        if self.hdgst {
            query.push("hdgst=1".into());
        }
        if self.ddgst {
            query.push("ddgst=1".into());
        }
        for (k, v) in &self.extra {
            query.push(format!("{k}={}", percent_encode(v)));
        }
        if !query.is_empty() {
            s.push('?');
            s.push_str(&query.join("&"));
        }
        s
    }

    /// Parse `nvme+tcp://host[:port][,host[:port]...]/subnqn[/nsid][?hostnqn=..&hdgst=1&ddgst=1]`.
    pub fn parse_uri(raw: &str) -> Result<RemoteTarget> {
        let rest =
            raw.strip_prefix("nvme+tcp://").ok_or_else(|| target_err(raw, "only nvme+tcp:// URIs are supported"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut t = RemoteTarget::new_empty();
        let mut addrs = Vec::new();
        for one in authority.split(',') {
            if addrs.len() == PATHS_MAX {
                return Err(target_err(raw, format!("more than {PATHS_MAX} transport addresses")));
            }
            let (host, port, v6) = parse_host_port(raw, one.trim())?;
            if addrs.is_empty() && v6 {
                t.adrfam = AddressFamily::Ipv6;
            }
            let addr = (host.to_string(), port.unwrap_or(NVME_TCP_PORT));
            if addrs.contains(&addr) {
                return Err(target_err(raw, format!("transport address {one} is named twice")));
            }
            addrs.push(addr);
        }
        let mut addrs = addrs.into_iter();
        (t.traddr, t.trsvcid) = addrs.next().ok_or_else(|| target_err(raw, "no host"))?;
        t.more_paths = addrs.collect();
        let mut segs = path.split('/').filter(|s| !s.is_empty());
        t.subnqn = percent_decode(segs.next().unwrap_or(""))
            .ok_or_else(|| target_err(raw, "bad %-escape in the subsystem NQN"))?;
        if let Some(ns) = segs.next() {
            t.nsid = parse_nsid(raw, ns)?;
        }
        if let Some(extra) = segs.next() {
            return Err(target_err(raw, format!("unexpected path segment '{extra}' after the namespace")));
        }
        let mut saw_adrfam = t.adrfam == AddressFamily::Ipv6;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "1"));
            let v = percent_decode(v).ok_or_else(|| target_err(raw, format!("bad %-escape in {k}")))?;
            t.set(raw, &k.to_ascii_lowercase(), &v, &mut saw_adrfam)?;
        }
        // A misspelt option would otherwise be carried along and never read.
        if let Some((k, _)) = t.extra.iter().find(|(k, _)| !URI_OPTIONS.contains(&k.as_str())) {
            let hint = match target::rpc::schema::closest(k, URI_OPTIONS) {
                Some(c) => format!(" (did you mean {c}?)"),
                None => String::new(),
            };
            return Err(target_err(
                raw,
                format!(
                    "unknown option {k}{hint}; a URI takes hostnqn, hdgst, ddgst, adrfam, {}",
                    URI_OPTIONS.join(", ")
                ),
            ));
        }
        t.finish(raw, saw_adrfam)
    }

    fn set(&mut self, raw: &str, key: &str, value: &str, saw_adrfam: &mut bool) -> Result<()> {
        match key {
            "trtype" => {
                if !value.eq_ignore_ascii_case("tcp") {
                    return Err(target_err(raw, format!("trtype={value}: only TCP is supported")));
                }
            }
            "adrfam" => {
                self.adrfam = match value.to_ascii_lowercase().as_str() {
                    "ipv4" => AddressFamily::Ipv4,
                    "ipv6" => AddressFamily::Ipv6,
                    _ => return Err(target_err(raw, format!("adrfam={value}: expected IPv4 or IPv6"))),
                };
                *saw_adrfam = true;
            }
            "traddr" => self.traddr = value.to_string(),
            "trsvcid" => {
                self.trsvcid = value.parse().map_err(|_| target_err(raw, format!("trsvcid={value} is not a port")))?;
            }
            "subnqn" => self.subnqn = value.to_string(),
            "ns" | "nsid" => self.nsid = parse_nsid(raw, value)?,
            "hostnqn" => self.hostnqn = Some(value.to_string()),
            "hdgst" => self.hdgst = parse_bool_flag(raw, key, value)?,
            "ddgst" => self.ddgst = parse_bool_flag(raw, key, value)?,
            _ => {
                const EXTRA_MAX: usize = 32;
                if self.extra.len() >= EXTRA_MAX {
                    return Err(target_err(raw, "too many options"));
                }
                self.extra.push((key.to_string(), value.to_string()));
            }
        }
        Ok(())
    }

    fn finish(mut self, raw: &str, saw_adrfam: bool) -> Result<RemoteTarget> {
        if self.traddr.is_empty() {
            return Err(target_err(raw, "traddr is missing"));
        }
        if self.subnqn.is_empty() {
            return Err(target_err(raw, "subnqn is missing"));
        }
        if self.subnqn.len() > NQN_MAX {
            return Err(target_err(raw, format!("subnqn is longer than {NQN_MAX} bytes")));
        }
        if let Some(h) = &self.hostnqn
            && h.len() > NQN_MAX
        {
            return Err(target_err(raw, format!("hostnqn is longer than {NQN_MAX} bytes")));
        }
        if !saw_adrfam && self.traddr.contains(':') {
            self.adrfam = AddressFamily::Ipv6;
        }
        Ok(self)
    }
}

/// One `host[:port]` of a URI's authority: the host, the port if given, whether the
/// host is a bracketed IPv6 literal.
fn parse_host_port<'a>(raw: &str, authority: &'a str) -> Result<(&'a str, Option<u16>, bool)> {
    let (host, port, v6) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| target_err(raw, "IPv6 address has no closing ']'"))?;
        (h, after.strip_prefix(':'), true)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p), false),
            None => (authority, None, false),
        }
    };
    if host.is_empty() {
        return Err(target_err(raw, "no host"));
    }
    let port = match port {
        Some(p) => Some(p.parse().map_err(|_| target_err(raw, format!("port '{p}' is not a number")))?),
        None => None,
    };
    Ok((host, port, v6))
}

fn parse_nsid(raw: &str, v: &str) -> Result<u32> {
    match v.parse::<u32>() {
        // NSID 0 is invalid and 0xFFFFFFFF is the broadcast value (NVMe base spec §3.2.1).
        Ok(n) if n != 0 && n != u32::MAX => Ok(n),
        _ => Err(target_err(raw, format!("namespace '{v}' is not a valid NSID"))),
    }
}

/// Escape what would end a URI path segment or query value (`/ ? & # % =`, space).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if matches!(b, b'/' | b'?' | b'&' | b'#' | b'%' | b'=') || !b.is_ascii_graphic() {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `s` with the values of `dhchap_secret=`, `dhchap_ctrl_secret=` and `tls_key=` (a remote
/// URI's secrets) replaced by `<redacted>`: what a report or a log line may show
/// of a job's filename.
pub fn redact_secrets(s: &str) -> std::borrow::Cow<'_, str> {
    const KEYS: [&str; 3] = ["dhchap_secret=", "dhchap_ctrl_secret=", "tls_key="];
    if !KEYS.iter().any(|k| s.contains(k)) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some((at, key)) = KEYS.iter().filter_map(|k| rest.find(k).map(|i| (i, *k))).min() {
        out.push_str(&rest[..at + key.len()]);
        out.push_str("<redacted>");
        rest = &rest[at + key.len()..];
        let end = rest.find(|c: char| c == '&' || c == '"' || c == ',' || c.is_whitespace()).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_wherever_a_filename_is_shown() {
        let uri = "nvme+tcp://h/nqn.x:a/1?dhchap_secret=DHHC-1:01:ab/c+d==:&hdgst=1&dhchap_ctrl_secret=DHHC-1:03:xy:";
        assert_eq!(
            redact_secrets(uri),
            "nvme+tcp://h/nqn.x:a/1?dhchap_secret=<redacted>&hdgst=1&dhchap_ctrl_secret=<redacted>"
        );
        let json = format!("{{\"filename\" : \"{uri}\", \"x\": 1}}");
        let r = redact_secrets(&json);
        assert!(!r.contains("DHHC") && r.ends_with("dhchap_ctrl_secret=<redacted>\", \"x\": 1}"), "{r}");
        let spdk = "trtype=TCP traddr=h dhchap_secret=DHHC-1:00:q: ns=1";
        assert_eq!(redact_secrets(spdk), "trtype=TCP traddr=h dhchap_secret=<redacted> ns=1");
        assert!(matches!(redact_secrets("nvme+tcp://h/n/1"), std::borrow::Cow::Borrowed(_)));
        let tls = "nvme+tcp://h/nqn.x:a/1?tls_key=NVMeTLSkey-1:01:AAAA+/==:&ddgst=1";
        assert_eq!(redact_secrets(tls), "nvme+tcp://h/nqn.x:a/1?tls_key=<redacted>&ddgst=1");
    }

    #[test]
    fn spdk_form_with_escaped_colons() {
        let raw = "trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2016-06.io.spdk\\:cnode1 ns=1";
        let t = Target::parse(Some(raw)).unwrap();
        assert_eq!(t.raw, raw);
        let TargetKind::Remote(r) = t.kind else { panic!("not remote") };
        assert_eq!(r.traddr, "127.0.0.1");
        assert_eq!(r.trsvcid, 4420);
        assert_eq!(r.subnqn, "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(r.nsid, 1);
        assert_eq!(r.adrfam, AddressFamily::Ipv4);
        assert!(!r.hdgst);
    }

    #[test]
    fn spdk_form_with_colon_separators_and_extras() {
        let raw =
            "trtype:tcp traddr:10.0.0.2 trsvcid:4421 subnqn:nqn.a:b ns:2 hostnqn:nqn.h hdgst=1 ddgst=1 priority=3";
        let TargetKind::Remote(r) = Target::parse(Some(raw)).unwrap().kind else { panic!() };
        assert_eq!(r.trsvcid, 4421);
        assert_eq!(r.subnqn, "nqn.a:b");
        assert_eq!(r.nsid, 2);
        assert_eq!(r.hostnqn.as_deref(), Some("nqn.h"));
        assert!(r.hdgst && r.ddgst);
        assert_eq!(r.extra, vec![("priority".to_string(), "3".to_string())]);
    }

    #[test]
    fn a_uri_refuses_options_it_does_not_know_and_never_echoes_a_secret() {
        let e = RemoteTarget::parse_uri("nvme+tcp://h/nqn.x:a/1?ctrl_los_tmo=-1").unwrap_err().to_string();
        assert!(e.contains("unknown option ctrl_los_tmo (did you mean ctrl_loss_tmo?)"), "{e}");
        let e = RemoteTarget::parse_uri("nvme+tcp://h/nqn.x:a/1?priority=3").unwrap_err().to_string();
        assert!(e.contains("unknown option priority;"), "{e}");
        for k in URI_OPTIONS {
            assert!(RemoteTarget::parse_uri(&format!("nvme+tcp://h/nqn.x:a/1?{k}=1")).is_ok(), "{k}");
        }
        let e = RemoteTarget::parse_uri("nvme+tcp://h/nqn.x:a/1?tls_key=NVMeTLSkey-1:01:AAAA:&hdgst=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("hdgst=maybe is not a boolean") && !e.contains("AAAA"), "{e}");
    }

    #[test]
    fn uri_form() {
        let TargetKind::Remote(r) =
            Target::parse(Some("nvme+tcp://127.0.0.1:4420/nqn.2016-06.io.spdk:cnode1/1")).unwrap().kind
        else {
            panic!()
        };
        assert_eq!((r.traddr.as_str(), r.trsvcid, r.nsid), ("127.0.0.1", 4420, 1));
        assert_eq!(r.subnqn, "nqn.2016-06.io.spdk:cnode1");

        let TargetKind::Remote(r) =
            Target::parse(Some("nvme+tcp://[::1]/nqn.x%3Ay/7?hostnqn=nqn.h&ddgst=1")).unwrap().kind
        else {
            panic!()
        };
        assert_eq!(r.adrfam, AddressFamily::Ipv6);
        assert_eq!((r.traddr.as_str(), r.trsvcid, r.nsid), ("::1", 4420, 7));
        assert_eq!(r.subnqn, "nqn.x:y");
        assert!(r.ddgst && !r.hdgst);
        assert_eq!(r.hostnqn.as_deref(), Some("nqn.h"));
    }

    #[test]
    fn uri_round_trips() {
        for raw in [
            "trtype=TCP traddr=127.0.0.1 trsvcid=4421 subnqn=nqn.2026-11.io.qpath\\:default ns=2 hdgst=1",
            "nvme+tcp://[::1]:4420/nqn.x%2Fy:z/7?hostnqn=nqn.h%3Dq&ddgst=1",
        ] {
            let TargetKind::Remote(r) = Target::parse(Some(raw)).unwrap().kind else { panic!("{raw}") };
            let uri = r.to_uri();
            let TargetKind::Remote(back) = Target::parse(Some(&uri)).unwrap().kind else { panic!("{uri}") };
            assert_eq!(back, r, "{uri}");
        }
    }

    #[test]
    fn multipath_uri_names_every_path() {
        let raw = "nvme+tcp://127.0.0.1:4420,127.0.0.1:4421,[::1]/nqn.x%3Ay/3?hdgst=1";
        let TargetKind::Remote(r) = Target::parse(Some(raw)).unwrap().kind else { panic!() };
        assert_eq!((r.traddr.as_str(), r.trsvcid, r.nsid), ("127.0.0.1", 4420, 3));
        assert_eq!(r.adrfam, AddressFamily::Ipv4, "the first address decides");
        assert_eq!(r.more_paths, vec![("127.0.0.1".to_string(), 4421), ("::1".to_string(), NVME_TCP_PORT)]);
        assert_eq!(r.path_count(), 3);
        let paths = r.paths();
        assert_eq!(paths.len(), 3);
        for p in &paths {
            assert!(p.more_paths.is_empty());
            assert_eq!((p.subnqn.as_str(), p.nsid, p.hdgst), ("nqn.x:y", 3, true));
        }
        assert_eq!((paths[1].traddr.as_str(), paths[1].trsvcid), ("127.0.0.1", 4421));
        assert_eq!((paths[2].traddr.as_str(), paths[2].trsvcid), ("::1", 4420));
        let TargetKind::Remote(back) = Target::parse(Some(&r.to_uri())).unwrap().kind else { panic!() };
        assert_eq!(back, r, "{}", r.to_uri());
        assert_eq!(RemoteTarget::parse_uri("nvme+tcp://a:1/n").unwrap().paths().len(), 1);
    }

    #[test]
    fn bad_remote_targets_say_why() {
        for (raw, why) in [
            ("trtype=RDMA traddr=1.2.3.4 subnqn=n", "only TCP"),
            ("trtype=TCP subnqn=n", "traddr is missing"),
            ("trtype=TCP traddr=1.2.3.4", "subnqn is missing"),
            ("trtype=TCP traddr=1.2.3.4 subnqn=n ns=0", "valid NSID"),
            ("nvme+rdma://1.2.3.4/n", "nvme+tcp"),
            ("nvme+tcp://1.2.3.4:x/n", "port"),
            ("nvme+tcp://1.2.3.4/n/1/2", "unexpected path"),
            ("nvme+tcp://1.2.3.4:4420,1.2.3.4:4420/n", "named twice"),
            ("nvme+tcp://1.2.3.4,/n", "no host"),
        ] {
            let e = Target::parse(Some(raw)).unwrap_err();
            assert!(e.context.contains(why), "{raw}: {e}");
        }
    }

    #[test]
    fn local_paths() {
        let t = Target::parse(Some("/dev/nvme0n1")).unwrap();
        assert_eq!(t.local_path(), Some(std::path::Path::new("/dev/nvme0n1")));
        let t = Target::parse(Some("/tmp/a\\:b")).unwrap();
        assert_eq!(t.local_path(), Some(std::path::Path::new("/tmp/a:b")));
        assert_eq!(Target::parse(Some("/a:/b")).unwrap_err().kind, ErrorKind::Unsupported);
        assert_eq!(Target::parse(None).unwrap().kind, TargetKind::Embedded);
    }
}
