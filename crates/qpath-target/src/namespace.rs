//! Namespaces: an NSID, a block size, a backend, an ANA group, the hosts that see it,
//! and a capacity that an operator may change while hosts do I/O.
//!
//! # Capacity that changes under I/O
//!
//! The I/O path reads the capacity once per command ([`Namespace::nblocks`]: one relaxed
//! load of an atomic that only the control plane writes) and checks the command's range
//! against it; nothing else on the I/O path depends on it. A resize (`Namespace::resize`) orders
//! the change so that no command can address storage that is not there:
//!
//! * growing makes the storage bigger first (a RAM region maps more pages, a file is
//!   extended) and publishes the new capacity after;
//! * shrinking publishes the smaller capacity first (new commands past it end with LBA Out
//!   of Range), then waits out every data-changing command that may still change the
//!   cut-off blocks, then is refused while data lies past the new end (RAM: a non-zero
//!   byte; file: `SEEK_DATA` finds allocated data; the old capacity comes back), and only
//!   then gives the storage back (RAM pages are discarded but stay mapped; a file is
//!   truncated when its end lay in the cut-off range).
//!
//! The wait is the namespace's range lock ([`crate::range_lock`]) over the cut-off blocks:
//! granted once every write that passed its write gate is done (the gate's per-reactor
//! gauges drain) and no earlier write or fused operation there is registered. A write
//! checked against the old capacity but not yet at its gate (waiting for its data after an
//! R2T, for a buffer, or for QoS) checks its range again past the gate
//! ([`Namespace::still_within`]) and ends with LBA Out of Range if the shrink went
//! through: with the gate's sequentially consistent handshake, every write is either
//! waited out (and its data then stops the shrink) or sees the smaller capacity. A shrink
//! that cannot get the lock within its bound ([`SHRINK_DRAIN`]) puts the old capacity
//! back and is refused, to be asked again.
//!
//! # Visibility
//!
//! A namespace is visible to every host ([`Visibility::All`]) or only to listed host NQNs
//! ([`Visibility::Listed`], SPDK's `no_auto_visible` namespaces with `nvmf_ns_add_host`;
//! Linux nvmet has no per-host visibility). A host that does not see a namespace finds its
//! NSID inactive. Each controller holds the map of the namespaces its host sees, rebuilt
//! by the subsystem when the map or a visibility changes ([`NsMap::view_for`]), so the I/O
//! path's lookup stays one index into a table, with no lock and no per-host check.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvme::identify::{IdentifyNamespace, LbaFormat, NMIC_SHARED, NsIdDesc};
use nvme::{AnaGrpId, Nsid, Status};

use crate::backend::Backend;
use crate::error::{Error, ErrorKind};
use crate::qos::Qos;
use crate::range_lock::RangeLocks;
use crate::reservation::Reservations;

/// The highest NSID a subsystem may hold (bounds the O(1) lookup table).
pub const MAX_NSID: u32 = 1024;

/// The largest namespace, in bytes: hosts address their block devices with signed 64-bit
/// byte offsets (Linux's `loff_t`), so nothing larger can be used.
#[allow(clippy::cast_sign_loss)]
pub const MAX_SIZE_BYTES: u64 = i64::MAX as u64;

/// How long a shrink waits for the writes already at the backend to finish before it is
/// refused (they take one backend operation each; a stuck device is not waited on forever).
pub const SHRINK_DRAIN: Duration = Duration::from_secs(5);

/// Host NQNs a namespace with [`Visibility::Listed`] may list.
pub const MAX_VISIBLE_HOSTS: usize = 1024;

/// Which hosts see a namespace (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Visibility {
    /// Every host the subsystem lets in.
    #[default]
    All,
    /// Only these host NQNs (possibly none yet).
    Listed(BTreeSet<String>),
}

impl Visibility {
    /// Only `hosts`, each a valid NQN, at most [`MAX_VISIBLE_HOSTS`].
    pub fn listed<I: IntoIterator<Item = String>>(hosts: I) -> Result<Visibility, Error> {
        let mut set = BTreeSet::new();
        for h in hosts {
            check_host_nqn(&h)?;
            set.insert(h);
            if set.len() > MAX_VISIBLE_HOSTS {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("a namespace lists at most {MAX_VISIBLE_HOSTS} hosts that see it"),
                ));
            }
        }
        Ok(Visibility::Listed(set))
    }

    /// Whether `hostnqn` sees the namespace.
    pub fn includes(&self, hostnqn: &str) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Listed(hosts) => hosts.contains(hostnqn),
        }
    }
}

/// Checks a host NQN given for a namespace's visibility.
pub(crate) fn check_host_nqn(hostnqn: &str) -> Result<(), Error> {
    nvme::nqn::validate(hostnqn).map_err(|e| Error::new(ErrorKind::Config, format!("host NQN {hostnqn:?}: {e}")))
}

/// One namespace of a subsystem.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: Nsid,
    /// Storage.
    pub backend: Backend,
    /// log2 of the block size.
    pub block_shift: u8,
    /// Capacity in blocks (see the module docs: read with [`Namespace::nblocks`]).
    nblocks: AtomicU64,
    /// Which hosts see it (control plane only: controllers hold filtered maps).
    visibility: Mutex<Visibility>,
    /// ANA group.
    pub anagrpid: AnaGrpId,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
    /// UUID.
    pub uuid: [u8; 16],
    /// Configured read-only (its file is opened read-only): Write Protect Until Power Cycle
    /// from start to end, which no host can lift ([`Namespace::write_protect`]).
    pub readonly: bool,
    /// The write protection state a host set with Set Features 84h
    /// ([`nvme::features::write_protect`]); read once per writing command.
    write_protect: AtomicU32,
    /// Provisioned limits and added latency (a provisioned device, seed 003).
    pub qos: Qos,
    /// Registrations and the reservation on this namespace.
    pub resv: Reservations,
    /// I/O counters since the namespace was added (monotonic; the SMART log, metrics and
    /// the stats RPC read them). Shared so a namespace rebuilt in place keeps its counts.
    pub counters: Arc<crate::stats::NsTotals>,
    /// What keeps a fused Compare and Write atomic against other writes ([`crate::range_lock`]).
    pub locks: RangeLocks,
    /// What it was asked to be that its backend does not tell (a saved configuration
    /// writes it back: see `crate::persist`).
    pub origin: NsOrigin,
}

/// The settings a namespace was created with that its running state does not show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NsOrigin {
    /// Its `ptpl_file`.
    pub ptpl_file: Option<std::path::PathBuf>,
    /// RAM: pages faulted in at creation.
    pub prefault: bool,
    /// RAM: transparent huge pages asked for.
    pub huge_pages: bool,
    /// RAM: the `max_size` given (none: the default, the machine's memory).
    pub max_size: Option<u64>,
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
        if size > MAX_SIZE_BYTES {
            return Err(Error::new(
                ErrorKind::Config,
                format!("size {size} is beyond the largest namespace hosts can address ({MAX_SIZE_BYTES} bytes)"),
            ));
        }
        if spec.anagrpid == 0 || spec.anagrpid > crate::port::ANA_GROUPS {
            return Err(Error::new(
                ErrorKind::Config,
                format!("ANA group {} out of range 1..={}", spec.anagrpid, crate::port::ANA_GROUPS),
            ));
        }
        let (nguid, eui64, uuid) = namespace_ids(subnqn, nsid, spec.uuid);
        Ok(Namespace {
            nsid,
            backend: spec.backend,
            block_shift: u8::try_from(bs.trailing_zeros()).unwrap_or(9),
            nblocks: AtomicU64::new(nblocks),
            visibility: Mutex::new(Visibility::All),
            anagrpid: AnaGrpId(spec.anagrpid),
            nguid,
            eui64,
            uuid,
            readonly: spec.readonly,
            write_protect: AtomicU32::new(if spec.readonly {
                nvme::features::write_protect::UNTIL_POWER_CYCLE
            } else {
                nvme::features::write_protect::NONE
            }),
            qos: Qos::default(),
            resv: match &spec.ptpl_file {
                Some(path) => Reservations::persistent(path)?,
                None => Reservations::default(),
            },
            origin: NsOrigin { ptpl_file: spec.ptpl_file.clone(), ..NsOrigin::default() },
            counters: Arc::default(),
            locks: RangeLocks::default(),
        })
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift
    }

    /// Capacity in blocks: one relaxed load, once per I/O command (see the module docs).
    #[inline]
    pub fn nblocks(&self) -> u64 {
        self.nblocks.load(Ordering::Relaxed)
    }

    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nblocks() << self.block_shift
    }

    /// Whether writes are refused with "Namespace is Write Protected": configured read-only,
    /// or write protected by a host (Set Features 84h). One relaxed load per writing command.
    #[inline]
    pub fn write_protected(&self) -> bool {
        self.write_protect.load(Ordering::Relaxed) != nvme::features::write_protect::NONE
    }

    /// The Namespace Write Protection Config state (Get Features 84h).
    pub fn write_protect(&self) -> u32 {
        self.write_protect.load(Ordering::Relaxed)
    }

    /// Sets the write protection state a host asked for (Set Features 84h, NVMe Base 2.0
    /// §8.12): No Write Protect, Write Protect or Write Protect Until Power Cycle (for this
    /// target, until it restarts). Leaving Write Protect Until Power Cycle is refused, and so
    /// is Permanent Write Protect (not offered: NWPC bit 2 clear). Returns whether the state
    /// changed. Like nvmet, the state lasts as long as the target process.
    pub(crate) fn set_write_protect(&self, state: u32) -> Result<bool, Status> {
        use nvme::features::write_protect::{NONE, PROTECT, UNTIL_POWER_CYCLE};
        if !matches!(state, NONE | PROTECT | UNTIL_POWER_CYCLE) {
            return Err(Status::INVALID_FIELD);
        }
        let old = self.write_protect.load(Ordering::Relaxed);
        if old == UNTIL_POWER_CYCLE && state != UNTIL_POWER_CYCLE {
            return Err(Status::INVALID_FIELD);
        }
        if old == state {
            return Ok(false);
        }
        if state != NONE {
            // Writes completed before the change are made durable first, as nvmet does
            // (its write_protect_flush_sync): an fdatasync on the thread that runs the
            // admin command, once per change of state.
            if let Backend::File(f) = &self.backend
                && let Err(e) = f.sync()
            {
                tracing::warn!(nsid = self.nsid.0, "flush before write protecting failed: {e}");
                return Err(Status::INTERNAL);
            }
        }
        self.write_protect.store(state, Ordering::Relaxed);
        Ok(true)
    }

    /// Which hosts see it.
    pub fn visibility(&self) -> Visibility {
        self.visibility.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether `hostnqn` sees it.
    pub fn visible_to(&self, hostnqn: &str) -> bool {
        self.visibility.lock().unwrap_or_else(std::sync::PoisonError::into_inner).includes(hostnqn)
    }

    /// Replaces who sees it. Controllers learn of it when the subsystem republishes their
    /// maps ([`crate::subsystem::Subsystem`] does both under its namespace lock).
    pub(crate) fn set_visibility(&self, v: Visibility) {
        *self.visibility.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = v;
    }

    /// Changes the capacity to `size` bytes (see the module docs for the order of steps and
    /// what is refused); returns the previous size. The caller serialises resizes and tells
    /// the controllers. A file is resized here only because an operator asked for exactly
    /// this: growing extends it when it is shorter than `size`, shrinking truncates it when
    /// its end lay in the cut-off range. Block devices keep the device's size. A shrink
    /// waits up to `drain` for the writes that may still change the cut-off blocks.
    pub(crate) fn resize(&self, size: u64, drain: Duration) -> Result<u64, Error> {
        let bs = u64::from(self.block_size());
        if size == 0 {
            return Err(Error::new(ErrorKind::Config, "a namespace cannot be resized to 0 bytes"));
        }
        if !size.is_multiple_of(bs) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("{size} bytes is not a multiple of the {bs}-byte block size"),
            ));
        }
        if size > MAX_SIZE_BYTES {
            return Err(Error::new(
                ErrorKind::Config,
                format!("{size} bytes is beyond the largest namespace hosts can address ({MAX_SIZE_BYTES} bytes)"),
            ));
        }
        if let Backend::File(f) = &self.backend {
            let meta = f.file().metadata().map_err(|e| backend_err(f, &e))?;
            if !meta.file_type().is_file() {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{} is a block device: its size is the device's (resize the device instead)",
                        f.path.display()
                    ),
                ));
            }
        }
        let old = self.size_bytes();
        if size > old {
            self.grow_storage(size)?;
            self.nblocks.store(size >> self.block_shift, Ordering::Release);
        } else if size < old {
            self.shrink(size, old, drain)?;
        }
        Ok(old)
    }

    /// Whether blocks `blocks` still lie within the capacity: a data-changing command checks
    /// again once past its write gate, as a shrink may have cut them off since it arrived
    /// (see the module docs). One relaxed load.
    #[inline]
    pub fn still_within(&self, blocks: &std::ops::Range<u64>) -> bool {
        blocks.end <= self.nblocks()
    }

    /// Shrinks from `old` to `size` bytes (see the module docs): the smaller capacity, then
    /// the cut-off blocks' lock (waited for up to `drain`), then the data check, then the
    /// storage. Any refusal puts the old capacity back.
    fn shrink(&self, size: u64, old: u64, drain: Duration) -> Result<(), Error> {
        let (new_blocks, old_blocks) = (size >> self.block_shift, old >> self.block_shift);
        // SeqCst: before the lock's `active` increment, so a write that misses the lock
        // (slow path or later) reads the new capacity past its gate.
        self.nblocks.store(new_blocks, Ordering::SeqCst);
        let (hold, granted) = self.locks.lock_begin(new_blocks..old_blocks);
        let refuse = |e: Error| {
            self.nblocks.store(old_blocks, Ordering::SeqCst);
            self.locks.end(hold);
            Err(e)
        };
        if !granted && !self.wait_for(hold, drain) {
            return refuse(Error::new(
                ErrorKind::Busy,
                format!(
                    "writes to the blocks past the new end did not finish within {} ms; try again",
                    drain.as_millis()
                ),
            ));
        }
        match self.data_beyond(size, old) {
            Err(e) => return refuse(e),
            Ok(Some(at)) => {
                return refuse(Error::new(
                    ErrorKind::Config,
                    format!(
                        "block {} (byte {at}) past the new end holds data; only unwritten blocks can be cut off",
                        at >> self.block_shift
                    ),
                ));
            }
            Ok(None) => {}
        }
        self.shrink_storage(size, old);
        self.locks.end(hold);
        Ok(())
    }

    /// Polls the range lock `hold` until granted (true) or `drain` has passed (false); the
    /// control plane's thread sleeps between polls, the reactors are never waited on.
    fn wait_for(&self, hold: crate::range_lock::Hold, drain: Duration) -> bool {
        let deadline = Instant::now() + drain;
        let mut pause = Duration::from_micros(50);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return self.locks.poll(hold);
            }
            std::thread::sleep(pause.min(deadline - now));
            if self.locks.poll(hold) {
                return true;
            }
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Makes the storage at least `size` bytes, before the capacity says so.
    fn grow_storage(&self, size: u64) -> Result<(), Error> {
        match &self.backend {
            Backend::Null => Ok(()),
            Backend::Ram(region) => {
                let max = region.max_len() as u64;
                if size > max {
                    return Err(Error::new(
                        ErrorKind::Config,
                        format!(
                            "a RAM namespace grows up to its max_size, {max} bytes for this one (set when it was added)"
                        ),
                    ));
                }
                region
                    .resize(crate::us(size))
                    .map_err(|e| Error::new(ErrorKind::Backend, format!("RAM region of {size} bytes: {e}")))
            }
            Backend::File(f) => {
                let len = f.file().metadata().map_err(|e| backend_err(f, &e))?.len();
                if len < size {
                    f.file().set_len(size).map_err(|e| backend_err(f, &e))?;
                }
                Ok(())
            }
        }
    }

    /// The first byte in `from..to` that holds data: a non-zero byte (RAM), allocated
    /// data (file, `SEEK_DATA`; a file system without hole tracking reports all of it).
    fn data_beyond(&self, from: u64, to: u64) -> Result<Option<u64>, Error> {
        match &self.backend {
            Backend::Null => Ok(None),
            Backend::Ram(region) => region
                .find_nonzero(crate::us(from)..crate::us(to))
                .map(|at| at.map(|a| a as u64))
                .map_err(|e| Error::new(ErrorKind::Backend, format!("RAM region: {e}"))),
            Backend::File(f) => {
                use std::os::fd::AsFd;
                let at = uring::seek_data(f.file().as_fd(), from).map_err(|e| backend_err(f, &e))?;
                Ok(at.filter(|&a| a < to))
            }
        }
    }

    /// Gives storage past `size` back, after the capacity was lowered from `old`.
    fn shrink_storage(&self, size: u64, old: u64) {
        match &self.backend {
            Backend::Null => {}
            Backend::Ram(region) => {
                if let Err(e) = region.resize(crate::us(size)) {
                    tracing::warn!(nsid = self.nsid.0, "RAM namespace shrank, its memory not: {e}");
                }
            }
            Backend::File(f) => {
                // A file longer than the namespace keeps its bytes past the old end: they
                // were never the namespace's.
                let truncate = match f.file().metadata() {
                    Ok(m) => m.len() > size && m.len() <= old,
                    Err(_) => false,
                };
                if truncate && let Err(e) = f.file().set_len(size) {
                    tracing::warn!(nsid = self.nsid.0, path = %f.path.display(), "namespace shrank, its file not: {e}");
                }
            }
        }
    }

    /// Identify Namespace data. `accessible` is false when the path's ANA
    /// state is inaccessible or persistent loss (NUSE then reads 0, as nvmet does).
    pub fn identify(&self, accessible: bool) -> IdentifyNamespace {
        let mut lbaf = [LbaFormat::default(); 16];
        lbaf[0] = LbaFormat { ms: 0, lbads: self.block_shift, rp: 0 };
        let nblocks = self.nblocks();
        // The Copy limits the target enforces (crate::io_cmd::copy_ranges).
        let (mssrl, mcl, msrc) = crate::io_cmd::copy_limits(self);
        IdentifyNamespace {
            nsze: nblocks,
            ncap: nblocks,
            nuse: if accessible { nblocks } else { 0 },
            // Thin provisioning off. DLFEAT: what the backend guarantees ([`Backend::dlfeat`]).
            nsfeat: 0,
            nlbaf: 0,
            flbas: 0,
            nmic: NMIC_SHARED,
            rescap: crate::reservation::RESCAP | u8::from(self.resv.ptpl_capable()),
            dlfeat: self.backend.dlfeat(),
            nawupf: 0,
            noiob: 0,
            npwg: 0,
            nows: 0,
            mssrl,
            mcl,
            msrc,
            anagrpid: self.anagrpid,
            nsattr: u8::from(self.write_protected()),
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

fn backend_err(f: &crate::backend::FileBackend, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Backend, format!("{}: {e}", f.path.display()))
}

/// A namespace's identifiers (NGUID, EUI-64, UUID). Without a configured UUID they are
/// derived from the subsystem NQN and NSID, so a namespace keeps its identity across
/// target restarts (Linux multipath matches paths by them). A configured UUID other than
/// the derived one names another namespace under that NSID, so the NGUID and EUI-64
/// follow it: NVMe Base 2.x §4.7.1 wants each identifier unique to one namespace, and a
/// host (Linux `nvme_ns_ids_equal`) tells a namespace replaced under the same NSID from the
/// old one only by them. A configuration saved by the target carries the derived UUID;
/// reading it back keeps the derived NGUID too.
fn namespace_ids(subnqn: &str, nsid: Nsid, uuid: Option<[u8; 16]>) -> ([u8; 16], [u8; 8], [u8; 16]) {
    let derived = derive_ids(subnqn, nsid, None);
    match uuid {
        Some(u) if u != derived.2 => {
            let (nguid, eui64, _) = derive_ids(subnqn, nsid, Some(&u));
            (nguid, eui64, u)
        }
        _ => derived,
    }
}

/// Identifiers from the subsystem NQN, NSID and (when the namespace has its own) UUID.
fn derive_ids(subnqn: &str, nsid: Nsid, uuid: Option<&[u8; 16]>) -> ([u8; 16], [u8; 8], [u8; 16]) {
    let mut words = [0u32; 4];
    for (i, w) in words.iter_mut().enumerate() {
        let mut seed = format!("qpath/{i}/{subnqn}/{}", nsid.0);
        if let Some(u) = uuid {
            seed.push('/');
            seed.push_str(&nvme::nqn::format_uuid(u));
        }
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

    /// The namespaces `hostnqn` sees: `all` itself when it sees every one (no copy), else a
    /// filtered copy (control plane: built when the map or a visibility changes).
    pub fn view_for(all: &Arc<NsMap>, hostnqn: &str) -> Arc<NsMap> {
        if all.iter().all(|n| n.visible_to(hostnqn)) {
            return Arc::clone(all);
        }
        let mut slots = all.slots.clone();
        for s in &mut slots {
            if s.as_ref().is_some_and(|n| !n.visible_to(hostnqn)) {
                *s = None;
            }
        }
        while slots.last().is_some_and(Option::is_none) {
            slots.pop();
        }
        Arc::new(NsMap { slots })
    }

    /// NSIDs present in exactly one of the two maps, ascending.
    pub fn differences(a: &NsMap, b: &NsMap) -> Vec<Nsid> {
        let n = a.slots.len().max(b.slots.len());
        (0..n)
            .filter(|&i| a.slots.get(i).is_some_and(Option::is_some) != b.slots.get(i).is_some_and(Option::is_some))
            .filter_map(|i| u32::try_from(i).ok().map(Nsid))
            .collect()
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
        assert_eq!(a.nblocks(), 2048);
    }

    #[test]
    fn a_namespace_with_its_own_uuid_has_its_own_nguid_and_eui64() {
        let derived = Namespace::new("nqn.x", Nsid(1), spec(1 << 20)).unwrap();
        // A saved configuration carries the derived UUID: the same namespace.
        let saved =
            Namespace::new("nqn.x", Nsid(1), NamespaceSpec { uuid: Some(derived.uuid), ..spec(1 << 20) }).unwrap();
        assert_eq!((saved.nguid, saved.eui64, saved.uuid), (derived.nguid, derived.eui64, derived.uuid));
        // Another UUID under the same NSID: every identifier differs.
        let u = [7u8; 16];
        let other = Namespace::new("nqn.x", Nsid(1), NamespaceSpec { uuid: Some(u), ..spec(1 << 20) }).unwrap();
        assert_eq!(other.uuid, u);
        assert_ne!(other.nguid, derived.nguid);
        assert_ne!(other.eui64, derived.eui64);
        let again = Namespace::new("nqn.x", Nsid(1), NamespaceSpec { uuid: Some(u), ..spec(1 << 20) }).unwrap();
        assert_eq!((again.nguid, again.eui64), (other.nguid, other.eui64));
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

    #[test]
    fn views_share_the_map_unless_a_namespace_is_hidden() {
        let a = Arc::new(Namespace::new("nqn.x", Nsid(1), spec(4096)).unwrap());
        let b = Arc::new(Namespace::new("nqn.x", Nsid(2), spec(4096)).unwrap());
        b.set_visibility(Visibility::listed(["nqn.2014-08.org.example:h1".to_string()]).unwrap());
        let only_a = Arc::new(NsMap::default().with(Arc::clone(&a)));
        assert!(Arc::ptr_eq(&NsMap::view_for(&only_a, "nqn.2014-08.org.example:h2"), &only_a), "no copy");
        let all = Arc::new(only_a.with(b));
        let h1 = NsMap::view_for(&all, "nqn.2014-08.org.example:h1");
        let h2 = NsMap::view_for(&all, "nqn.2014-08.org.example:h2");
        assert!(Arc::ptr_eq(&h1, &all));
        assert_eq!(h2.iter().map(|n| n.nsid).collect::<Vec<_>>(), vec![Nsid(1)]);
        assert_eq!(NsMap::differences(&h1, &h2), vec![Nsid(2)]);
        assert!(NsMap::differences(&h2, &h2).is_empty());
    }

    #[test]
    fn visibility_lists_are_checked_and_bounded() {
        assert!(Visibility::listed(["not an nqn".to_string()]).is_err());
        let many = (0..=MAX_VISIBLE_HOSTS).map(|i| format!("nqn.2014-08.org.example:h{i}"));
        assert!(Visibility::listed(many).is_err());
        let v = Visibility::listed(["nqn.2014-08.org.example:h".to_string()]).unwrap();
        assert!(v.includes("nqn.2014-08.org.example:h") && !v.includes("nqn.2014-08.org.example:i"));
        assert!(Visibility::All.includes("anyone"));
    }

    impl Namespace {
        fn resize_now(&self, size: u64) -> Result<u64, Error> {
            self.resize(size, SHRINK_DRAIN)
        }
    }

    #[test]
    fn a_shrink_waits_for_writes_past_their_gate_and_gives_up_with_the_old_size() {
        let n = Namespace::new("nqn.x", Nsid(1), spec(1 << 20)).unwrap();
        // A write past its gate, to blocks the shrink keeps: it is waited for all the same
        // (the gauges count writes, not ranges).
        let (hold, granted) = n.locks.write_begin(0, 0..8);
        assert!(granted);
        let e = n.resize(512 << 10, Duration::from_millis(30)).unwrap_err();
        assert!(e.context.contains("did not finish") && e.context.contains("try again"), "{}", e.context);
        assert_eq!(e.kind, ErrorKind::Busy, "a caller can tell \"try again\" from a wrong request");
        assert_eq!(n.nblocks(), 2048, "the old size is back");
        assert!(!n.locks.is_active() && n.locks.entries() == 0, "the lock is given back");
        std::thread::scope(|s| {
            let shrink = s.spawn(|| n.resize(512 << 10, SHRINK_DRAIN));
            while n.nblocks() == 2048 {
                std::thread::yield_now();
            }
            // While it waits, the new size is published: a write past it is refused on
            // arrival, and one that was admitted before finds it past its gate.
            assert!(!n.still_within(&(1024..1032)) && n.still_within(&(1016..1024)));
            std::thread::sleep(Duration::from_millis(20));
            assert!(!shrink.is_finished(), "the shrink waits for the write");
            n.locks.end(hold);
            assert_eq!(shrink.join().unwrap().unwrap(), 1 << 20);
        });
        assert_eq!(n.nblocks(), 1024);
    }

    #[test]
    fn null_namespaces_resize_within_the_limits() {
        let n = Namespace::new("nqn.x", Nsid(1), spec(1 << 20)).unwrap();
        assert_eq!(n.resize_now(2 << 20).unwrap(), 1 << 20);
        assert_eq!(n.nblocks(), 4096);
        assert_eq!(n.identify(true).nsze, 4096);
        assert!(n.resize_now(0).is_err());
        assert!(n.resize_now(513).is_err());
        assert!(n.resize_now(MAX_SIZE_BYTES + 1).is_err());
        assert!(Namespace::new("nqn.x", Nsid(1), spec(1 << 63)).is_err(), "too large to address");
        assert_eq!(n.resize_now(512).unwrap(), 2 << 20);
        assert_eq!(n.nblocks(), 1);
    }
}
