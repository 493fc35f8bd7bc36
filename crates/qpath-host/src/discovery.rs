//! Discovery (NVMe-oF 1.1 §5): read the discovery log of a discovery
//! controller and follow referrals to other discovery services.

use std::collections::BTreeSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use nvme::log::{DiscoveryEntry, subtype, trtype};

use crate::admin;
use crate::error::{Error, ErrorKind, Result};
use crate::queue::QueueConfig;
use crate::sync::SyncQueue;

/// Reads the discovery log at `addr` (no keep-alive: a one-shot discovery controller).
pub fn discovery_log(
    addr: SocketAddr,
    hostnqn: &str,
    hostid: [u8; 16],
    timeout: Duration,
) -> Result<Vec<DiscoveryEntry>> {
    discovery_log_tls(addr, hostnqn, hostid, timeout, None)
}

/// [`discovery_log`], inside a TLS channel made with `tls` when given (a discovery port
/// that requires TLS: the identity names the discovery NQN).
pub fn discovery_log_tls(
    addr: SocketAddr,
    hostnqn: &str,
    hostid: [u8; 16],
    timeout: Duration,
    tls: Option<&crate::tls::HostTls>,
) -> Result<Vec<DiscoveryEntry>> {
    let mut cfg = QueueConfig::io(0, 32, nvme::Cntlid::DYNAMIC, nvme::nqn::DISCOVERY_NQN, hostnqn, hostid);
    cfg.disable_sqflow = false;
    cfg.tls = tls.map(|t| t.for_queue(hostnqn, nvme::nqn::DISCOVERY_NQN));
    let mut q = SyncQueue::connect(addr, cfg, timeout)?;
    admin::enable(&mut q)?;
    let log = admin::discovery_log(&mut q)?;
    let _ = admin::shutdown(&mut q);
    Ok(log.entries)
}

/// The address of a TCP discovery entry.
pub fn entry_addr(e: &DiscoveryEntry) -> Result<SocketAddr> {
    if e.trtype != trtype::TCP {
        return Err(Error::new(ErrorKind::Invalid, format!("transport type {} is not TCP", e.trtype)));
    }
    let port: u16 =
        e.trsvcid.trim().parse().map_err(|_| Error::new(ErrorKind::Invalid, format!("trsvcid {:?}", e.trsvcid)))?;
    (e.traddr.trim(), port)
        .to_socket_addrs()
        .map_err(|err| Error::new(ErrorKind::Invalid, format!("traddr {:?}: {err}", e.traddr)))?
        .next()
        .ok_or_else(|| Error::new(ErrorKind::Invalid, format!("traddr {:?} resolves to nothing", e.traddr)))
}

/// One discovered entry and the discovery service it came from.
#[derive(Clone, Debug)]
pub struct Found {
    /// The discovery controller that reported it.
    pub via: SocketAddr,
    /// The entry.
    pub entry: DiscoveryEntry,
}

/// Discovers from `addr` and every referral reachable from it (each service
/// visited once, at most `max_services`).
pub fn discover_all(
    addr: SocketAddr,
    hostnqn: &str,
    hostid: [u8; 16],
    timeout: Duration,
    max_services: usize,
) -> Result<Vec<Found>> {
    discover_all_tls(addr, hostnqn, hostid, timeout, max_services, None)
}

/// [`discover_all`], each discovery controller reached inside a TLS channel made with `tls`
/// when given.
pub fn discover_all_tls(
    addr: SocketAddr,
    hostnqn: &str,
    hostid: [u8; 16],
    timeout: Duration,
    max_services: usize,
    tls: Option<&crate::tls::HostTls>,
) -> Result<Vec<Found>> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![addr];
    let mut out = Vec::new();
    let mut first_err = None;
    while let Some(a) = todo.pop() {
        if !seen.insert(a) || seen.len() > max_services {
            continue;
        }
        match discovery_log_tls(a, hostnqn, hostid, timeout, tls) {
            Ok(entries) => {
                for e in entries {
                    if e.subtype == subtype::REFERRAL
                        && let Ok(r) = entry_addr(&e)
                    {
                        todo.push(r);
                    }
                    out.push(Found { via: a, entry: e });
                }
            }
            Err(e) if a == addr => return Err(e),
            Err(e) => {
                tracing::warn!(referral = %a, "discovery failed: {e}");
                first_err.get_or_insert(e);
            }
        }
    }
    Ok(out)
}

/// Human name of a discovery entry's subtype, as nvme-cli prints it.
pub fn subtype_name(st: u8) -> &'static str {
    match st {
        subtype::REFERRAL => "referral",
        subtype::NVM => "nvme subsystem",
        subtype::CURRENT_DISCOVERY => "current discovery subsystem",
        _ => "unknown",
    }
}
