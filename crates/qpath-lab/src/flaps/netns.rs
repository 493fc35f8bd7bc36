//! Network namespaces for `qpath lab flaps --mode link`: the host and each target port in
//! a namespace of its own, every port joined to the host by a veth pair, so one path's
//! link can be taken down (`ip link set down`) while the other carries on.
//!
//! ```text
//!   netns qpflap-PID-h (host)                    netns qpflap-PID-a (target port 1)
//!     pa 10.215.1.1/24  ◄──────── veth ────────►  port 10.215.1.2/24   :4420
//!                                                 netns qpflap-PID-b (target port 2)
//!     pb 10.215.2.1/24  ◄──────── veth ────────►  port 10.215.2.2/24   :4420
//! ```
//!
//! Nothing is added to the machine's own namespace: the veth pairs are created inside the
//! host namespace with their peers placed straight into the port namespaces, and deleting
//! the three namespaces removes them. Names carry the process id, so runs do not collide;
//! namespaces left by a run that died (its process is gone) are removed at the next start.
//! Needs root and `ip` (iproute2); threads join a namespace with [`uring::enter_netns`].

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::Command;

use bench::{Error, ErrorKind, Result};

/// Prefix of every namespace this module creates.
const PREFIX: &str = "qpflap-";
/// The NVMe/TCP port each target namespace listens on.
pub const PORT: u16 = 4420;

/// Why link mode cannot run here, if it cannot (not root, no `ip`).
pub fn unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces, veth links)".into());
    }
    if !Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success()) {
        return Some("`ip` (iproute2) is not installed".into());
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Some("no network namespace support (/proc/self/ns/net)".into());
    }
    None
}

fn is_root() -> bool {
    // "Uid:\treal\teffective\tsaved\tfs"; std has no geteuid.
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
    })
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| Error::io("run ip", e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Target,
        format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()),
    ))
}

/// The three namespaces and two links of one run; removed on drop.
#[derive(Debug)]
pub struct Topology {
    host: String,
    ports: [String; 2],
}

impl Topology {
    /// Creates the namespaces and links, addresses up.
    pub fn create() -> Result<Topology> {
        remove_stale();
        let pid = std::process::id();
        let t = Topology {
            host: format!("{PREFIX}{pid}-h"),
            ports: [format!("{PREFIX}{pid}-a"), format!("{PREFIX}{pid}-b")],
        };
        // Registered for removal before anything can fail half way.
        let setup = || -> Result<()> {
            for ns in [&t.host, &t.ports[0], &t.ports[1]] {
                ip(&["netns", "add", ns])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            for (i, ns) in t.ports.iter().enumerate() {
                let local = if i == 0 { "pa" } else { "pb" };
                let (host_ip, port_ip) = (format!("{}/24", Self::host_ip(i)), format!("{}/24", Self::port_ip(i)));
                ip(&["-n", &t.host, "link", "add", local, "type", "veth", "peer", "name", "port", "netns", ns])?;
                ip(&["-n", &t.host, "addr", "add", &host_ip, "dev", local])?;
                ip(&["-n", ns, "addr", "add", &port_ip, "dev", "port"])?;
                ip(&["-n", &t.host, "link", "set", local, "up"])?;
                ip(&["-n", ns, "link", "set", "port", "up"])?;
            }
            Ok(())
        };
        setup()?;
        Ok(t)
    }

    fn host_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 215, if i == 0 { 1 } else { 2 }, 1)
    }

    fn port_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 215, if i == 0 { 1 } else { 2 }, 2)
    }

    /// The address target port `i` (0 or 1) listens on, inside its namespace.
    pub fn port_addr(i: usize) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Self::port_ip(i), PORT))
    }

    /// The namespace file of the host side.
    pub fn host_ns(&self) -> PathBuf {
        ns_file(&self.host)
    }

    /// The namespace file of target port `i`.
    pub fn port_ns(&self, i: usize) -> PathBuf {
        ns_file(&self.ports[i])
    }

    /// The host namespace's name (for `ip netns exec`).
    pub fn host_name(&self) -> &str {
        &self.host
    }

    /// Takes the link of path `i` down (`up = false`) or up, on the target's side.
    pub fn set_link(&self, i: usize, up: bool) -> Result<()> {
        ip(&["-n", &self.ports[i], "link", "set", "port", if up { "up" } else { "down" }])
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.host, &self.ports[0], &self.ports[1]] {
            if let Err(e) = ip(&["netns", "del", ns]) {
                tracing::warn!("removing network namespace {ns}: {e}");
            }
        }
    }
}

fn ns_file(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Removes namespaces of earlier runs whose process is gone.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}
