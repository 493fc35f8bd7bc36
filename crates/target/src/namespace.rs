//! Namespaces: an NSID, a block size, a backend and an ANA group.

use std::sync::Arc;

use nvme::identify::{IdentifyNamespace, LbaFormat, NMIC_SHARED, NsIdDesc};
use nvme::{AnaGrpId, Nsid};

use crate::backend::Backend;
use crate::error::{Error, ErrorKind};
use crate::qos::Qos;
use crate::range_lock::RangeLocks;
use crate::reservation::Reservations;

/// The highest NSID a subsystem may hold (bounds the O(1) lookup table).
pub const MAX_NSID: u32 = 1024;

/// One namespace of a subsystem.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: Nsid,
    /// Storage.
    pub backend: Backend,
    /// log2 of the block size.
    pub block_shift: u8,
    /// Capacity in blocks.
    pub nblocks: u64,
    /// ANA group.
    pub anagrpid: AnaGrpId,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
    /// UUID.
    pub uuid: [u8; 16],
    /// Rejects writes with "Namespace is Write Protected".
    pub readonly: bool,
    /// Provisioned limits and added latency (a provisioned device, seed 003).
    pub qos: Qos,
    /// Registrations and the reservation on this namespace.
    pub resv: Reservations,
    /// What keeps a fused Compare and Write atomic against other writes ([`crate::range_lock`]).
    pub locks: RangeLocks,
}

/// Parameters of a new namespace.
#[derive(Debug)]
pub struct NamespaceSpec {
    /// NSID (0 = first free).
    pub nsid: u32,
    /// Storage.
    pub backend: Backend,
    /// Size in bytes (required for null; for others, defaults to the backend's size).
    pub size: Option<u64>,
    /// Block size in bytes (512 or 4096; default 512).
    pub block_size: u32,
    /// ANA group (default 1).
    pub anagrpid: u32,
    /// UUID; derived from the subsystem NQN and NSID when absent.
    pub uuid: Option<[u8; 16]>,
    /// Read-only.
    pub readonly: bool,
    /// Where reservations persist through power loss (PTPL capable); none: they do not.
    pub ptpl_file: Option<std::path::PathBuf>,
}

impl Namespace {
    /// Builds a namespace of subsystem `subnqn` from a spec with its NSID decided.
    pub fn new(subnqn: &str, nsid: Nsid, spec: NamespaceSpec) -> Result<Namespace, Error> {
        let bs = spec.block_size;
        if !(bs.is_power_of_two() && (512..=65536).contains(&bs)) {
            return Err(Error::new(ErrorKind::Config, format!("block size {bs} is not a power of two in 512..=65536")));
        }
        let size = match (spec.size, spec.backend.size()) {
            (Some(s), Some(b)) if s > b => {
                return Err(Error::new(ErrorKind::Config, format!("size {s} exceeds the backend's {b} bytes")));
            }
            (Some(s), _) => s,
            (None, Some(b)) => b,
            (None, None) => return Err(Error::new(ErrorKind::Config, "a null namespace needs a size")),
        };
        let nblocks = size / u64::from(bs);
        if nblocks == 0 {
            return Err(Error::new(ErrorKind::Config, format!("size {size} is smaller than one block")));
        }
        if spec.anagrpid == 0 || spec.anagrpid > crate::port::ANA_GROUPS {
            return Err(Error::new(
                ErrorKind::Config,
                format!("ANA group {} out of range 1..={}", spec.anagrpid, crate::port::ANA_GROUPS),
            ));
        }
        let (nguid, eui64, derived_uuid) = derive_ids(subnqn, nsid);
        Ok(Namespace {
            nsid,
            backend: spec.backend,
            block_shift: u8::try_from(bs.trailing_zeros()).unwrap_or(9),
            nblocks,
            anagrpid: AnaGrpId(spec.anagrpid),
            nguid,
            eui64,
            uuid: spec.uuid.unwrap_or(derived_uuid),
            readonly: spec.readonly,
            qos: Qos::default(),
            resv: match &spec.ptpl_file {
                Some(path) => Reservations::persistent(path)?,
                None => Reservations::default(),
            },
            locks: RangeLocks::default(),
        })
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift
    }

    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nblocks << self.block_shift
    }

    /// Identify Namespace data. `accessible` is false when the path's ANA
    /// state is inaccessible or persistent loss (NUSE then reads 0, as nvmet does).
    pub fn identify(&self, accessible: bool) -> IdentifyNamespace {
        let mut lbaf = [LbaFormat::default(); 16];
        lbaf[0] = LbaFormat { ms: 0, lbads: self.block_shift, rp: 0 };
        // The Copy limits the target enforces (crate::io_cmd::copy_ranges).
        let (mssrl, mcl, msrc) = crate::io_cmd::copy_limits(self);
        IdentifyNamespace {
            nsze: self.nblocks,
            ncap: self.nblocks,
            nuse: if accessible { self.nblocks } else { 0 },
            // Thin provisioning off; deallocated blocks read as zeros (DLFEAT 001b, bit 3: WZ dealloc).
            nsfeat: 0,
            nlbaf: 0,
            flbas: 0,
            nmic: NMIC_SHARED,
            rescap: crate::reservation::RESCAP | u8::from(self.resv.ptpl_capable()),
            dlfeat: 0x09,
            nawupf: 0,
            noiob: 0,
            npwg: 0,
            nows: 0,
            mssrl,
            mcl,
            msrc,
            anagrpid: self.anagrpid,
            nsattr: u8::from(self.readonly),
            nguid: self.nguid,
            eui64: self.eui64,
            lbaf,
        }
    }

    /// Namespace identification descriptors (CNS 03h): UUID, NGUID, EUI-64, CSI.
    pub fn descriptors(&self) -> [NsIdDesc; 4] {
        [NsIdDesc::Uuid(self.uuid), NsIdDesc::Nguid(self.nguid), NsIdDesc::Eui64(self.eui64), NsIdDesc::Csi(0)]
    }
}

/// Stable identifiers from the subsystem NQN and NSID, so a namespace keeps
/// its identity across target restarts (Linux multipath matches paths by them).
fn derive_ids(subnqn: &str, nsid: Nsid) -> ([u8; 16], [u8; 8], [u8; 16]) {
    let mut words = [0u32; 4];
    for (i, w) in words.iter_mut().enumerate() {
        let seed = format!("qpath/{i}/{subnqn}/{}", nsid.0);
        *w = nvme::tcp::crc32c(seed.as_bytes());
    }
    let mut nguid = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        nguid[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    let mut eui64 = [0u8; 8];
    eui64.copy_from_slice(&nguid[8..16]);
    let mut uuid = nguid;
    uuid.rotate_left(5);
    uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4
    uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
    (nguid, eui64, uuid)
}

/// A subsystem's namespaces, indexed by NSID for O(1) lookup on the I/O path.
/// Immutable: changes publish a new map (see [`crate::subsystem::Subsystem`]).
#[derive(Debug, Default)]
pub struct NsMap {
    slots: Vec<Option<Arc<Namespace>>>,
}

impl NsMap {
    /// The namespace with this NSID.
    #[inline]
    pub fn get(&self, nsid: Nsid) -> Option<&Arc<Namespace>> {
        self.slots.get(usize::try_from(nsid.0).ok()?)?.as_ref()
    }

    /// Every namespace, by ascending NSID.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.slots.iter().flatten()
    }

    /// Number of namespaces.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy with `ns` added (replacing one with the same NSID).
    pub fn with(&self, ns: Arc<Namespace>) -> NsMap {
        let idx = usize::try_from(ns.nsid.0).unwrap_or(0);
        let mut slots = self.slots.clone();
        if slots.len() <= idx {
            slots.resize(idx + 1, None);
        }
        slots[idx] = Some(ns);
        NsMap { slots }
    }

    /// A copy without `nsid`.
    pub fn without(&self, nsid: Nsid) -> NsMap {
        let mut slots = self.slots.clone();
        if let Some(s) = slots.get_mut(usize::try_from(nsid.0).unwrap_or(usize::MAX)) {
            *s = None;
        }
        while slots.last().is_some_and(Option::is_none) {
            slots.pop();
        }
        NsMap { slots }
    }

    /// The lowest NSID not in use.
    pub fn first_free(&self) -> Option<Nsid> {
        (1..=MAX_NSID).map(Nsid).find(|n| self.get(*n).is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: u64) -> NamespaceSpec {
        NamespaceSpec {
            nsid: 0,
            backend: Backend::Null,
            size: Some(size),
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        }
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = Namespace::new("nqn.x", Nsid(1), spec(1 << 20)).unwrap();
        let b = Namespace::new("nqn.x", Nsid(1), spec(1 << 20)).unwrap();
        let c = Namespace::new("nqn.x", Nsid(2), spec(1 << 20)).unwrap();
        assert_eq!(a.nguid, b.nguid);
        assert_ne!(a.nguid, c.nguid);
        assert_eq!(a.uuid[6] >> 4, 4);
        assert_eq!(a.nblocks, 2048);
    }

    #[test]
    fn map_ops() {
        let ns = Arc::new(Namespace::new("nqn.x", Nsid(3), spec(4096)).unwrap());
        let m = NsMap::default().with(ns);
        assert!(m.get(Nsid(3)).is_some());
        assert!(m.get(Nsid(2)).is_none());
        assert!(m.get(Nsid(u32::MAX)).is_none());
        assert_eq!(m.first_free(), Some(Nsid(1)));
        assert!(m.without(Nsid(3)).is_empty());
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(Namespace::new("nqn.x", Nsid(1), NamespaceSpec { block_size: 1000, ..spec(4096) }).is_err());
        assert!(Namespace::new("nqn.x", Nsid(1), NamespaceSpec { anagrpid: 0, ..spec(4096) }).is_err());
        assert!(Namespace::new("nqn.x", Nsid(1), NamespaceSpec { size: None, ..spec(4096) }).is_err());
        assert!(Namespace::new("nqn.x", Nsid(1), spec(100)).is_err());
    }
}
