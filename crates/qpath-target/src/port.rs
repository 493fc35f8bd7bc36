//! Ports: listen addresses, and the ANA state of every group as seen through each.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use nvme::{AnaGrpId, AnaState};

/// ANA groups a target reports (ANAGRPMAX and NANAGRPID).
pub const ANA_GROUPS: u32 = 32;

/// What a port serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortKind {
    /// I/O subsystems and the discovery subsystem (Linux nvmet's ports).
    Io,
    /// Only the discovery subsystem (a dedicated 8009 port).
    Discovery,
}

/// Faults injected on a port, for failover tests (settable by RPC).
///
/// `delay_us` and `stall_opcode` act on each command, so connections read them only when
/// the target is built with the `fault-injection` feature ([`PortFaults::PER_COMMAND`]);
/// without it they stay 0 (the RPC refuses other values). `refuse_connects` and
/// `drop_generation` act per accept and per tick, and always work.
#[derive(Debug, Default)]
pub struct PortFaults {
    /// Latency added to every I/O command on this port, in microseconds.
    pub delay_us: AtomicU64,
    /// Refuse new connections (closed right after accept).
    pub refuse_connects: AtomicBool,
    /// Bumped to drop every connection on the port once.
    pub drop_generation: AtomicU64,
    /// Commands with this opcode+1 (0 = none) are never completed (a stuck command).
    pub stall_opcode: AtomicU64,
}

impl PortFaults {
    /// Whether connections act on `delay_us` and `stall_opcode` (the `fault-injection`
    /// feature).
    pub const PER_COMMAND: bool = cfg!(feature = "fault-injection");
}

/// A listen address.
#[derive(Debug)]
pub struct Port {
    /// Port id (PORTID in the discovery log).
    pub id: u16,
    /// Listen address.
    pub addr: SocketAddr,
    /// What it serves.
    pub kind: PortKind,
    ana: [AtomicU8; ANA_GROUPS as usize + 1],
    ana_chgcnt: [AtomicU64; ANA_GROUPS as usize + 1],
    /// Injected faults.
    pub faults: PortFaults,
    /// Whether it speaks TLS ([`crate::tls`]).
    pub tls: crate::tls::PortTls,
    /// Set when the port is removed: its connections close on their next tick.
    removed: AtomicBool,
}

impl Port {
    /// A port with every ANA group optimized.
    pub fn new(id: u16, addr: SocketAddr, kind: PortKind) -> Port {
        Port {
            id,
            addr,
            kind,
            ana: std::array::from_fn(|_| AtomicU8::new(AnaState::Optimized as u8)),
            ana_chgcnt: std::array::from_fn(|_| AtomicU64::new(0)),
            faults: PortFaults::default(),
            tls: crate::tls::PortTls::default(),
            removed: AtomicBool::new(false),
        }
    }

    /// Whether the port was removed (its connections close; read once per connection tick).
    #[inline]
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Marks the port removed (see [`crate::registry::TargetState::remove_port`]).
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    /// The state of `group` through this port (one relaxed load: used per I/O).
    #[inline]
    pub fn ana_state(&self, group: AnaGrpId) -> AnaState {
        self.ana
            .get(usize::try_from(group.0).unwrap_or(0))
            .and_then(|s| AnaState::from_u8(s.load(Ordering::Relaxed)))
            .unwrap_or(AnaState::Inaccessible)
    }

    /// Sets the state of `group`; returns whether it changed. `chgcnt` is the
    /// target-wide ANA change count after this change.
    pub fn set_ana_state(&self, group: AnaGrpId, state: AnaState, chgcnt: u64) -> bool {
        let Some(slot) = self.ana.get(usize::try_from(group.0).unwrap_or(usize::MAX)) else { return false };
        if group.0 == 0 {
            return false;
        }
        let old = slot.swap(state as u8, Ordering::Relaxed);
        if old != state as u8 {
            self.ana_chgcnt[usize::try_from(group.0).unwrap_or(0)].store(chgcnt, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Change count of `group`.
    pub fn ana_group_chgcnt(&self, group: AnaGrpId) -> u64 {
        self.ana_chgcnt.get(usize::try_from(group.0).unwrap_or(usize::MAX)).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The TRADDR string of the discovery log.
    pub fn traddr(&self) -> String {
        self.addr.ip().to_string()
    }

    /// The TRSVCID string of the discovery log.
    pub fn trsvcid(&self) -> String {
        self.addr.port().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ana_states() {
        let p = Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io);
        assert_eq!(p.ana_state(AnaGrpId(1)), AnaState::Optimized);
        assert!(p.set_ana_state(AnaGrpId(1), AnaState::Inaccessible, 7));
        assert!(!p.set_ana_state(AnaGrpId(1), AnaState::Inaccessible, 8));
        assert_eq!(p.ana_state(AnaGrpId(1)), AnaState::Inaccessible);
        assert_eq!(p.ana_group_chgcnt(AnaGrpId(1)), 7);
        assert_eq!(p.ana_state(AnaGrpId(999)), AnaState::Inaccessible);
        assert!(!p.set_ana_state(AnaGrpId(0), AnaState::Optimized, 1));
    }
}
