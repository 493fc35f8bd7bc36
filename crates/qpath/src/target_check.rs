//! `qpath target --check`: what a configuration would serve, and every problem that
//! would stop it from starting, found without starting anything: no port is bound, no
//! file is opened for writing, created or locked, no memory is mapped.
//!
//! The checks are those the target makes when it starts that need nothing but the
//! configuration and a look at the file system (addresses, sizes, backends, NSIDs, keys,
//! ANA states, and the size rules of file namespaces from `target::config`'s "File
//! namespaces"). What only a start can tell (a port in use, a file locked by another
//! process, memory) is left to the start, which refuses and cleans up by itself.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use target::config::{Config, HostEntry, NamespaceConfig, SizeValue};
use target::port::PortKind;

/// The outcome of a check.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// What would be served, a line each.
    pub summary: String,
    /// Problems that would stop the start, each naming its thing.
    pub problems: Vec<String>,
}

/// Checks `cfg` (with the command-line options already applied); `metrics` is the
/// `--metrics` address.
pub fn check(cfg: &Config, metrics: Option<SocketAddr>) -> CheckReport {
    let mut r = CheckReport::default();
    let s = &mut r.summary;
    let p = &mut r.problems;
    let o = &cfg.options;
    if [o.max_connections_per_port, o.max_connections_per_host, o.max_connections_per_hostnqn].contains(&0)
        || o.connect_timeout_ms == 0
        || o.pdu_timeout_ms == 0
        || o.max_buffer_bytes_per_connection == 0
    {
        p.push("[options]: connection limits and timeouts must be at least 1".into());
    }
    let reactors = if cfg.reactor.reactors == 0 { "one per CPU".to_string() } else { cfg.reactor.reactors.to_string() };
    let poll = format!("{:?}", cfg.reactor.poll).to_ascii_lowercase();
    let _ = writeln!(s, "reactors: {reactors}, poll {poll}");
    match &cfg.rpc.socket {
        Some(sock) => {
            let _ = writeln!(s, "rpc socket: {}", sock.display());
            check_socket(sock, p);
        }
        None => {
            let _ = writeln!(s, "rpc socket: none");
        }
    }
    if let Some(m) = metrics {
        let _ = writeln!(s, "metrics: http://{m}/metrics");
    }
    if cfg.ports.is_empty() {
        p.push("no [[port]]: the target would listen nowhere".into());
    }
    let mut ids = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    for port in &cfg.ports {
        let kind = match port.kind {
            PortKind::Io => "I/O and discovery",
            PortKind::Discovery => "discovery only",
        };
        let _ = writeln!(s, "port {}: {} ({kind})", port.id, port.addr);
        if !ids.insert(port.id) {
            p.push(format!("port {}: the id is used twice", port.id));
        }
        match target::server::parse_addr(&port.addr) {
            Ok(a) if a.port() != 0 && !addrs.insert(a) => p.push(format!("port {}: {a} is used twice", port.id)),
            Ok(_) => {}
            Err(e) => p.push(format!("port {}: {e} (expected IP:PORT)", port.id)),
        }
    }
    let mut nqns = BTreeSet::new();
    let mut files: Vec<(PathBuf, bool, String)> = Vec::new();
    for sub in &cfg.subsystems {
        let access = if sub.allow_any_host {
            "any host".to_string()
        } else {
            let auth = sub.hosts.iter().filter(|h| matches!(h, HostEntry::Auth(a) if a.dhchap_key.is_some())).count();
            format!("{} host(s), {auth} authenticating", sub.hosts.len())
        };
        let ports = if sub.ports.is_empty() { "every I/O port".to_string() } else { format!("ports {:?}", sub.ports) };
        let _ = writeln!(s, "subsystem {}: {access}, on {ports}", sub.nqn);
        if !nqns.insert(sub.nqn.as_str()) {
            p.push(format!("subsystem {}: listed twice", sub.nqn));
        }
        if !sub.allow_any_host && sub.hosts.is_empty() {
            p.push(format!("subsystem {}: no host may connect (allow_any_host = false and no hosts)", sub.nqn));
        }
        for id in &sub.ports {
            if !ids.contains(id) {
                p.push(format!("subsystem {}: port {id} is not configured", sub.nqn));
            }
        }
        for h in &sub.hosts {
            if let HostEntry::Auth(a) = h
                && let Err(e) = a.to_host_auth()
            {
                p.push(format!("subsystem {}: {e}", sub.nqn));
            }
        }
        let mut nsids = BTreeSet::new();
        let mut next = 1u32;
        for ns in &sub.namespaces {
            let nsid = if ns.nsid == 0 {
                while nsids.contains(&next) {
                    next += 1;
                }
                next
            } else {
                ns.nsid
            };
            let owner = format!("namespace {nsid} of {}", sub.nqn);
            if !nsids.insert(nsid) {
                p.push(format!("{owner}: the NSID is used twice"));
            }
            if nsid > target::namespace::MAX_NSID {
                p.push(format!("{owner}: NSID out of range 1..={}", target::namespace::MAX_NSID));
            }
            let line = namespace(ns, &owner, p, &mut files);
            let _ = writeln!(s, "  {owner}: {line}");
        }
    }
    for a in &cfg.ana {
        let _ = writeln!(s, "ANA group {} on port {}: {}", a.group, a.port, a.state);
        if nvme::AnaState::parse(&a.state).is_none() {
            p.push(format!(
                "[[ana]] port {} group {}: state {:?}: optimized, non-optimized, inaccessible, persistent-loss or change",
                a.port, a.group, a.state
            ));
        }
        if !ids.contains(&a.port) {
            p.push(format!("[[ana]] port {}: no such port", a.port));
        }
    }
    // A file is held by one namespace at a time; readonly namespaces may share one.
    for (i, (path, readonly, owner)) in files.iter().enumerate() {
        if let Some((_, _, first)) = files[..i].iter().find(|(q, ro, _)| q == path && !(*ro && *readonly)) {
            p.push(format!(
                "{owner}: {} is also used by {first} (only readonly namespaces may share a file)",
                path.display()
            ));
        }
    }
    r
}

/// One namespace's summary; its problems go to `p`, its file (if any) to `files`.
fn namespace(
    ns: &NamespaceConfig,
    owner: &str,
    p: &mut Vec<String>,
    files: &mut Vec<(PathBuf, bool, String)>,
) -> String {
    let size = match ns.size.as_ref().map(SizeValue::bytes).transpose() {
        Ok(s) => s,
        Err(e) => {
            p.push(format!("{owner}: {e}"));
            None
        }
    };
    let bs = ns.block_size;
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        p.push(format!("{owner}: block_size {bs} is not a power of two in 512..=65536"));
    }
    if let Some(u) = &ns.uuid
        && nvme::nqn::parse_uuid(u).is_none()
    {
        p.push(format!("{owner}: uuid {u:?} is not a UUID"));
    }
    if ns.grow && ns.backend != "file" {
        p.push(format!("{owner}: grow applies to file namespaces only"));
    }
    let ro = if ns.readonly { ", read-only" } else { "" };
    let shown = |b: u64| format!("{b} bytes ({})", human(b));
    match ns.backend.as_str() {
        "null" | "ram" => {
            match size {
                Some(b) if b < u64::from(bs) => p.push(format!("{owner}: size {b} is smaller than one block")),
                Some(_) => {}
                None if ns.size.is_none() => p.push(format!("{owner}: a {} namespace needs a size", ns.backend)),
                None => {}
            }
            format!("{}, {}{ro}", ns.backend, size.map_or_else(|| "no size".into(), shown))
        }
        "file" => {
            let Some(path) = &ns.path else {
                p.push(format!("{owner}: a file namespace needs a path"));
                return "file, no path".into();
            };
            files.push((path.clone(), ns.readonly, owner.to_string()));
            format!("file {}{ro}: {}", path.display(), file_state(path, size, ns.grow, owner, p))
        }
        other => {
            p.push(format!("{owner}: backend {other:?}: null, ram or file"));
            format!("backend {other:?}")
        }
    }
}

/// What is at a file namespace's path, and what the start would do with it (the rules of
/// `target::config`'s "File namespaces": never shrunk, grown only with `grow`, created only
/// with a `size`).
fn file_state(path: &Path, size: Option<u64>, grow: bool, owner: &str, p: &mut Vec<String>) -> String {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && !dir.is_dir()
            {
                p.push(format!("{owner}: {}: the directory {} does not exist", path.display(), dir.display()));
                return "missing".into();
            }
            return match size {
                Some(b) => format!("missing, would be created with {b} bytes ({})", human(b)),
                None => {
                    p.push(format!("{owner}: {} does not exist and no size is given to create it", path.display()));
                    "missing".into()
                }
            };
        }
        Err(e) => {
            p.push(format!("{owner}: {}: {e}", path.display()));
            return "unreadable".into();
        }
    };
    let (kind, len) = if meta.file_type().is_block_device() {
        match block_device_size(path) {
            Ok(len) => ("block device", len),
            Err(e) => {
                p.push(format!("{owner}: {}: {e}", path.display()));
                return "block device of unknown size".into();
            }
        }
    } else if meta.is_file() {
        ("regular file", meta.len())
    } else {
        p.push(format!("{owner}: {} is neither a regular file nor a block device", path.display()));
        return "not a file".into();
    };
    let have = format!("{kind} of {len} bytes ({})", human(len));
    match size {
        Some(want) if want < len => {
            p.push(format!(
                "{owner}: size {want} is smaller than {} ({len} bytes): qpath never shrinks a file or device",
                path.display()
            ));
        }
        Some(want) if want > len && kind == "block device" => {
            p.push(format!("{owner}: size {want} is larger than the block device {} ({len} bytes)", path.display()));
        }
        Some(want) if want > len && !grow => {
            p.push(format!(
                "{owner}: size {want} is larger than {} ({len} bytes); grow = true lets the start grow it",
                path.display()
            ));
        }
        Some(want) if want > len => return format!("{have}, would be grown to {want} bytes"),
        _ => {}
    }
    have
}

/// A block device's size: where seeking to its end lands (opened read-only, nothing written).
fn block_device_size(path: &Path) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    std::fs::File::open(path)?.seek(SeekFrom::End(0))
}

/// An RPC socket path that a running target already serves would be taken from it.
fn check_socket(sock: &Path, p: &mut Vec<String>) {
    if let Some(dir) = sock.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        p.push(format!("rpc socket {}: the directory {} does not exist", sock.display(), dir.display()));
    }
    if std::os::unix::net::UnixStream::connect(sock).is_ok() {
        p.push(format!("rpc socket {}: another process is serving it (a running qpath target?)", sock.display()));
    }
}

/// 1 GiB, 512 MiB, 4 KiB, 100 B: the largest binary unit that divides evenly, else one decimal.
fn human(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, unit) in UNITS {
        if b >= unit {
            #[allow(clippy::cast_precision_loss)] // a display value
            let v = b as f64 / unit as f64;
            return if b.is_multiple_of(unit) { format!("{} {name}", b / unit) } else { format!("{v:.1} {name}") };
        }
    }
    format!("{b} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(toml: &str) -> Vec<String> {
        check(&Config::parse(toml).unwrap(), None).problems
    }

    #[test]
    fn the_embedded_default_is_fine() {
        let mut c = Config::embedded_default();
        c.rpc.socket = None;
        let r = check(&c, None);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(r.summary.contains("port 1: 127.0.0.1:4420"), "{}", r.summary);
        assert!(r.summary.contains("ram, 1073741824 bytes (1 GiB)"), "{}", r.summary);
    }

    #[test]
    fn every_problem_is_listed_naming_its_thing() {
        let missing = std::env::temp_dir().join(format!("qpath-check-missing-{}.img", std::process::id()));
        let p = problems(&format!(
            "[[port]]\nid = 1\naddr = \"127.0.0.1:99999\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:4421\"\n\
             [[subsystem]]\nnqn = \"nqn.x:a\"\nallow_any_host = true\nports = [7]\n\
             [[subsystem.namespace]]\nbackend = \"ram\"\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"disk\"\nsize = \"1G\"\n\
             [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1Q\"\nblock_size = 1000\n\
             [[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\n\
             [[subsystem.namespace]]\nbackend = \"file\"\npath = \"/nonexistent/qpath-check.img\"\nsize = \"1M\"\n\
             [[ana]]\nport = 9\ngroup = 1\nstate = \"sideways\"\n",
            missing.display()
        ));
        let all = p.join("\n");
        for want in [
            "port 1: address \"127.0.0.1:99999\"",
            "port 1: the id is used twice",
            "subsystem nqn.x:a: port 7 is not configured",
            "namespace 1 of nqn.x:a: a ram namespace needs a size",
            "namespace 1 of nqn.x:a: the NSID is used twice",
            "backend \"disk\": null, ram or file",
            "size \"1Q\": unknown unit",
            "block_size 1000",
            "qpath-check-missing-",
            "does not exist and no size is given",
            "/nonexistent/qpath-check.img: the directory /nonexistent does not exist",
            "state \"sideways\"",
            "[[ana]] port 9: no such port",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
    }

    #[test]
    fn file_namespaces_follow_the_size_rules_without_touching_the_file() {
        let dir = std::env::temp_dir().join(format!("qpath-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("a.img");
        std::fs::write(&img, vec![7u8; 1 << 20]).unwrap();
        let cfg = |extra: &str| {
            format!(
                "[[port]]\nid = 1\naddr = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.x:f\"\nallow_any_host = true\n\
                 [[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\n{extra}",
                img.display()
            )
        };
        assert!(problems(&cfg("")).is_empty());
        assert!(problems(&cfg("size = \"512K\""))[0].contains("never shrinks"));
        assert!(problems(&cfg("size = \"2M\""))[0].contains("grow = true"));
        let r = check(&Config::parse(&cfg("size = \"2M\"\ngrow = true")).unwrap(), None);
        assert!(r.problems.is_empty() && r.summary.contains("would be grown to 2097152 bytes"), "{}", r.summary);
        let two = cfg("[[subsystem.namespace]]\nbackend = \"file\"\n") + &format!("path = \"{}\"\n", img.display());
        assert!(problems(&two).iter().any(|e| e.contains("also used by namespace 1")), "{:?}", problems(&two));
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 20, "the file is untouched");
        let missing = dir.join("new.img");
        let text = cfg("size = \"4M\"").replace("a.img", "new.img");
        let r = check(&Config::parse(&text).unwrap(), None);
        assert!(
            r.problems.is_empty() && r.summary.contains("missing, would be created with 4194304 bytes"),
            "{}",
            r.summary
        );
        assert!(!missing.exists(), "a check creates nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(100), "100 B");
    }
}
