//! What the block core asks of a controller and of a multipath head: the two traits the
//! core (`BlockCore`) is generic over, implemented by [`crate::controller::Controller`]
//! and [`crate::head::Head`]. A simulator implements them with its own path state and
//! drives the production core with its own clock.
//!
//! ```text
//!   BlockCore<C: CoreController>            Controller (admin thread, sockets)
//!     per poll turn / tick:  generation, change_count, is_live, path_class
//!     when a change count moved: namespace_geometry, namespace_ids
//!     per failed command:    should_fail_io, failover_hold, ctrl_loss_tmo, report_io_failure,
//!                            request_ana_refresh
//!     logs, stall reports:   traddr, cntlid
//!   Multi<C> ─ Arc<C::Head>: generation (per poll turn), policy, reference, paths (when it moved)
//! ```
//!
//! The core is monomorphised over `C`: no dynamic call. A successful I/O calls none of
//! these; a completion with a path error calls the failure ones once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nvme::Nsid;

use crate::head::ReferenceSelector;
use crate::mpath::{PathClass, Policy};

/// A controller as the block core sees it: its connection generation and change count
/// (what its queues and paths are compared against), whether I/O waiting for it should
/// fail, how long a lost write is held, and the two reports the core makes to it.
pub trait CoreController {
    /// The multipath head whose paths are controllers of this kind.
    type Head: CoreHead<Ctrl = Self>;
    /// The connection generation: bumped at every reconnect; a queue connected under an
    /// older one is dead ([`crate::controller::Controller::generation`]).
    fn generation(&self) -> u64;
    /// Bumped when the namespaces (their sizes among them) or ANA states change, and at
    /// every state change a path's class depends on.
    fn change_count(&self) -> u64;
    /// Whether the controller is live.
    fn is_live(&self) -> bool;
    /// Whether I/O waiting for it must fail now (fast_io_fail_tmo passed, or dead).
    fn should_fail_io(&self) -> bool;
    /// How long a command that changes data, whose connection failed, waits before it
    /// is sent again ([`crate::failover`]).
    fn failover_hold(&self) -> Duration;
    /// Its `ctrl_loss_tmo`, which bounds a hold.
    fn ctrl_loss_tmo(&self) -> Option<Duration>;
    /// One of its I/O queues failed (the core calls it once per failed connection of
    /// the current generation): the controller resets.
    fn report_io_failure(&self, why: &str);
    /// A command ended with an ANA status: re-read the ANA log.
    fn request_ana_refresh(&self);
    /// The class of namespace `nsid` through this controller now (its ANA state and link).
    fn path_class(&self, nsid: Nsid) -> PathClass;
    /// Namespace `nsid`'s block shift and size in blocks, as last identified.
    fn namespace_geometry(&self, nsid: Nsid) -> Option<(u8, u64)>;
    /// Namespace `nsid`'s identifiers as the controller's last successful scan read them;
    /// `None`: that scan did not list it (the target removed it). A scan that failed
    /// leaves the last list in place: it never makes a namespace look removed.
    fn namespace_ids(&self, nsid: Nsid) -> Option<NsIds>;
    /// Its address (logs, stall reports).
    fn traddr(&self) -> SocketAddr;
    /// Its controller id (stall reports).
    fn cntlid(&self) -> u16;
}

/// The identifiers of a namespace (NVMe Base 2.1 §4.5.2, Identify Namespace NGUID and
/// EUI64 and the Namespace Identification Descriptor list's UUID): what makes it this
/// namespace and not another one the target later put under the same NSID. Compared
/// whole, as Linux compares them before it keeps a disk after a rescan
/// (`nvme_ns_ids_equal` in `drivers/nvme/host/core.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsIds {
    /// NGUID (all zeros: not reported).
    pub nguid: [u8; 16],
    /// EUI-64 (all zeros: not reported).
    pub eui64: [u8; 8],
    /// UUID, when a descriptor reported one.
    pub uuid: Option<[u8; 16]>,
}

impl NsIds {
    /// Whether the namespace reported no identifier at all: then nothing tells a
    /// replacement from the same namespace, and the core does not try.
    pub fn is_empty(&self) -> bool {
        self.nguid == [0; 16] && self.eui64 == [0; 8] && self.uuid.is_none()
    }
}

impl std::fmt::Display for NsIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |f: &mut std::fmt::Formatter<'_>, b: &[u8]| b.iter().try_for_each(|x| write!(f, "{x:02x}"));
        f.write_str("nguid ")?;
        hex(f, &self.nguid)?;
        f.write_str(" eui64 ")?;
        hex(f, &self.eui64)?;
        match &self.uuid {
            Some(u) => {
                f.write_str(" uuid ")?;
                hex(f, u)
            }
            None => f.write_str(" uuid none"),
        }
    }
}

/// A multipath head as the block core sees it: path slots of controllers, a policy, and
/// a generation that moves when either changes.
pub trait CoreHead {
    /// The controllers its paths go through.
    type Ctrl;
    /// Moves when paths or the policy change (read once per poll turn).
    fn generation(&self) -> u64;
    /// The I/O policy.
    fn policy(&self) -> Policy;
    /// Seed 000's reference selector in use, if any.
    fn reference(&self) -> Option<ReferenceSelector>;
    /// The path slots (read when the generation moved).
    fn paths(&self) -> Vec<Option<(Arc<Self::Ctrl>, Nsid)>>;
}
