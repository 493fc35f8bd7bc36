//! Namespace reservations (NVMe Base 2.x §8.19, NVM Command Set 1.x §3.2.4): the
//! Reservation Register, Acquire, Release and Report commands, and the access each
//! reservation type leaves to other hosts.
//!
//! Hosts are told apart by their Host Identifier (the Connect's HOSTID): every
//! controller of one host shares its registration, as in Linux nvmet (`pr.c`), whose
//! choices this follows where the specification leaves room (IEKEY refused on Acquire
//! and Release, Flush counted with the writes, the extended report only).
//!
//! ```text
//!   I/O path, per command (read or write group):
//!     word = resv.word (one atomic load)   no holder -> allowed (no lock)
//!     word == connection's cached word     -> the cached verdict (no lock)
//!     otherwise                            -> lock, verdict for this host, cache it
//!   Register / Acquire / Release: lock, change, word = (epoch + 1) << 8 | holder's type
//! ```
//!
//! Persist Through Power Loss (RESCAP bit 0) where the namespace has a `ptpl_file`: once a
//! host turns it on (Register with CPTPL 11b, or Set Features 83h), every change is written
//! there (a new file, fsync, rename, fsync of the directory) before the command completes,
//! and a target that restarts, or was killed, reads it back before the namespace takes I/O.
//! A change that cannot be written is undone and fails with Internal Error. The write runs
//! on the reactor: reservation commands are rare control commands, and a fenced cluster
//! needs the state durable before the host hears "done".
//!
//! Reservation notifications (NVMe Base 2.0 §8.19, Linux nvmet `pr.c`): a change that
//! takes something from another host leaves a [`Notice`] for it, which the caller hands to
//! that host's controllers ([`crate::controller::notify_reservation`]; each keeps its
//! Reservation Notification log page, LID 80h, and raises the asynchronous event):
//!
//! | change | who is told | notice |
//! | --- | --- | --- |
//! | a preempt unregisters hosts | each unregistered host but the preempting one | Registration Preempted |
//! | the holder releases a reservation that is not Write Exclusive / Exclusive Access | every other registrant | Reservation Released |
//! | the holder of a Registrants Only reservation unregisters | every other registrant | Reservation Released |
//! | a preempt changes the type (holder preempting itself, or taking it over by its key) | every registrant but the preempting host | Reservation Released |
//! | Release with Clear (or the operator's `clear_reservation`) | every registrant but the clearing host | Reservation Preempted |
//!
//! Not done: Preempt and Abort aborts nothing (it preempts: a command of the preempted host
//! already executing completes).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nvme::Status;
use nvme::log::resv_notice;
use nvme::nqn::{hex, parse_uuid};
use nvme::opcode::io;

use crate::error::{Error, ErrorKind};

pub use nvme::reservation::{
    EXCLUSIVE_ACCESS, EXCLUSIVE_ACCESS_ALL_REGS, EXCLUSIVE_ACCESS_REG_ONLY, REPORT_ENTRY, REPORT_HEADER,
    WRITE_EXCLUSIVE, WRITE_EXCLUSIVE_ALL_REGS, WRITE_EXCLUSIVE_REG_ONLY,
};

/// Identify Namespace RESCAP: the six types and Ignore Existing Key as in NVMe 1.3 and
/// later; bit 0 (Persist Through Power Loss) is added for namespaces with a `ptpl_file`.
pub const RESCAP: u8 = 0xfe;

/// CNTLID reported for registrants: qpath's controllers are dynamic, one registration
/// stands for every controller of its host (0xffff, as nvmet reports).
const CNTLID_DYNAMIC: u16 = 0xffff;

/// What a command does to the namespace, for the access check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Reads the namespace's data.
    Read,
    /// Changes the namespace's data (Flush counted here, as in nvmet).
    Write,
    /// Not checked (the reservation commands check their own keys).
    Other,
}

/// The access group of an I/O opcode (NVMe Base 2.0 §8.19.1, "Command Behavior in the
/// Presence of a Reservation": Compare, Read and Verify read; Copy writes its destination
/// — it reads its sources too, but a host that may write may read). The two halves of a
/// Compare and Write are checked one by one: the Compare reads, the Write writes.
pub fn group(opcode: u8) -> Group {
    match opcode {
        io::READ | io::COMPARE | io::VERIFY => Group::Read,
        io::WRITE | io::WRITE_ZEROES | io::DATASET_MANAGEMENT | io::FLUSH | io::WRITE_UNCORRECTABLE | io::COPY => {
            Group::Write
        }
        _ => Group::Other,
    }
}

/// Whether a host may run a command of `group` under a reservation of type `rtype`
/// (0 = none), given whether it holds the reservation and whether it is registered.
fn allowed(rtype: u8, holder: bool, registrant: bool, group: Group) -> bool {
    if group == Group::Other || rtype == 0 || holder {
        return true;
    }
    match rtype {
        WRITE_EXCLUSIVE => group != Group::Write,
        EXCLUSIVE_ACCESS => false,
        WRITE_EXCLUSIVE_REG_ONLY | WRITE_EXCLUSIVE_ALL_REGS => group != Group::Write || registrant,
        EXCLUSIVE_ACCESS_REG_ONLY | EXCLUSIVE_ACCESS_ALL_REGS => registrant,
        _ => true,
    }
}

fn all_registrants(rtype: u8) -> bool {
    matches!(rtype, WRITE_EXCLUSIVE_ALL_REGS | EXCLUSIVE_ACCESS_ALL_REGS)
}

/// A connection's last verdict, so a host working under a reservation that does not
/// change takes no lock per command.
#[derive(Clone, Copy, Debug, Default)]
pub struct AccessCache {
    nsid: u32,
    word: u64,
    read: bool,
    write: bool,
}

/// A host to tell of a change ([`Reservations::take_notices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The host's Host Identifier: every controller of that host in the subsystem is told.
    pub hostid: [u8; 16],
    /// The Reservation Notification Log Page Type ([`nvme::log::resv_notice`]).
    pub notice: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Registrant {
    hostid: [u8; 16],
    rkey: u64,
}

#[derive(Clone, Debug, Default)]
struct Inner {
    /// In registration order (an All Registrants reservation reports every one as holder).
    registrants: Vec<Registrant>,
    /// The holder's Host Identifier (for the All Registrants types: any registrant holds
    /// it; this is the one that acquired it, or the next when it left).
    holder: Option<[u8; 16]>,
    rtype: u8,
    /// The report's GEN: bumped by a successful Register, a preempt and a Clear.
    generation: u32,
    /// Bumped by every change, published in `word`.
    epoch: u64,
    /// PTPL: the state survives power loss (written to the file at every change).
    ptpl: bool,
    /// Hosts to tell of the changes made since the caller last took them (undone with the
    /// change when it cannot be persisted). Bounded: one per registrant per command.
    notices: Vec<Notice>,
}

impl Inner {
    fn find(&self, hostid: &[u8; 16]) -> Option<usize> {
        self.registrants.iter().position(|r| &r.hostid == hostid)
    }

    fn is_holder(&self, hostid: &[u8; 16]) -> bool {
        match self.holder {
            None => false,
            Some(_) if all_registrants(self.rtype) => self.find(hostid).is_some(),
            Some(h) => &h == hostid,
        }
    }

    fn verdict(&self, hostid: &[u8; 16], group: Group) -> bool {
        let rtype = if self.holder.is_some() { self.rtype } else { 0 };
        allowed(rtype, self.is_holder(hostid), self.find(hostid).is_some(), group)
    }

    /// Tells every registrant but `except` of a change.
    fn notify_registrants(&mut self, notice: u8, except: &[u8; 16]) {
        for r in &self.registrants {
            if &r.hostid != except {
                self.notices.push(Notice { hostid: r.hostid, notice });
            }
        }
    }

    /// Removes registrant `i`; a holder that leaves ends its reservation unless the
    /// type is All Registrants and registrants remain (a Registrants Only reservation
    /// ending so is a Reservation Released for the other registrants).
    fn unregister_at(&mut self, i: usize) {
        let gone = self.registrants.remove(i);
        if self.holder == Some(gone.hostid) {
            self.holder = match self.registrants.first() {
                Some(next) if all_registrants(self.rtype) => Some(next.hostid),
                _ => None,
            };
            if matches!(self.rtype, WRITE_EXCLUSIVE_REG_ONLY | EXCLUSIVE_ACCESS_REG_ONLY) {
                self.notify_registrants(resv_notice::RESERVATION_RELEASED, &gone.hostid);
            }
        }
    }

    /// A Release with Clear by `by` (none: the operator): no reservation, no registrant, a
    /// new generation; the other registrants' reservation was preempted.
    fn clear(&mut self, by: Option<&[u8; 16]>) {
        for r in &self.registrants {
            if by != Some(&r.hostid) {
                self.notices.push(Notice { hostid: r.hostid, notice: resv_notice::RESERVATION_PREEMPTED });
            }
        }
        self.registrants.clear();
        self.holder = None;
        self.rtype = 0;
        self.generation = self.generation.wrapping_add(1);
    }

    /// Unregisters every host holding `rkey` but `keep` (a preempt by `by`: the others
    /// removed are told their registration was preempted); false when none held it.
    fn unregister_key(&mut self, rkey: u64, keep: Option<&[u8; 16]>, by: &[u8; 16]) -> bool {
        let mut any = false;
        let mut i = 0;
        while i < self.registrants.len() {
            let r = self.registrants[i];
            if r.rkey == rkey && keep != Some(&r.hostid) {
                self.unregister_at(i);
                if &r.hostid != by {
                    self.notices.push(Notice { hostid: r.hostid, notice: resv_notice::REGISTRATION_PREEMPTED });
                }
                any = true;
            } else {
                i += 1;
            }
        }
        any
    }
}

/// A namespace's reservation state for operators.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// The report's GEN.
    pub generation: u32,
    /// The reservation's type, 0 when none is held.
    pub rtype: u8,
    /// In registration order.
    pub registrants: Vec<SnapshotRegistrant>,
}

/// One registrant of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotRegistrant {
    /// Host Identifier, 32 hex digits.
    pub hostid: String,
    /// Its key.
    pub rkey: u64,
    /// Holds the reservation.
    pub holds: bool,
}

/// One namespace's reservation state.
#[derive(Debug)]
pub struct Reservations {
    /// `epoch << 8 | type`, the type 0 while nobody holds a reservation: all the I/O
    /// path reads when the namespace is not reserved.
    word: AtomicU64,
    inner: Mutex<Inner>,
    /// Where the state persists when PTPL is on (none: not PTPL capable, or the namespace
    /// was removed), with this namespace's claim on the file.
    file: Mutex<Option<(PathBuf, Claim)>>,
    /// Commands refused with Reservation Conflict (counted on that path only).
    conflicts: AtomicU64,
}

/// The persisted state (`ptpl_file`, JSON).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Saved {
    ptpl: bool,
    generation: u32,
    rtype: u8,
    /// Host Identifier of the holder, 32 hex digits.
    holder: Option<String>,
    registrants: Vec<SavedRegistrant>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedRegistrant {
    hostid: String,
    rkey: u64,
}

/// The directory `path` is in (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a new
/// file beside it, fsync, rename over it, fsync of the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir_of(path))?.sync_all()
}

/// The `ptpl_file`s of this process's namespaces (canonical), each used by one namespace.
static PTPL_FILES: Mutex<std::collections::BTreeSet<PathBuf>> = Mutex::new(std::collections::BTreeSet::new());

/// A claim on a `ptpl_file`, given back when dropped.
#[derive(Debug)]
struct Claim(PathBuf);

impl Drop for Claim {
    fn drop(&mut self) {
        PTPL_FILES.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.0);
    }
}

/// Each namespace's epochs start in a range of their own, so a connection's cached word
/// can never match a namespace that replaced the one it was taken from under the same NSID.
static EPOCH_BASE: AtomicU64 = AtomicU64::new(0);

impl Default for Reservations {
    fn default() -> Self {
        Reservations::with(Inner::default(), None)
    }
}

fn key_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

impl Reservations {
    fn with(mut inner: Inner, file: Option<(PathBuf, Claim)>) -> Reservations {
        inner.epoch = EPOCH_BASE.fetch_add(1 << 24, Ordering::Relaxed);
        let r = Reservations {
            word: AtomicU64::new(0),
            inner: Mutex::new(inner),
            file: Mutex::new(file),
            conflicts: AtomicU64::new(0),
        };
        r.publish(&mut r.lock());
        r
    }

    /// PTPL capable reservations kept in `path`: the state saved there, if PTPL was on
    /// when it was written, is the state now. A file that cannot be read is an error (a
    /// namespace must not come up unreserved that a cluster had fenced).
    pub fn persistent(path: &Path) -> Result<Reservations, Error> {
        let err = |what: String| Error::new(ErrorKind::Config, format!("ptpl_file {}: {what}", path.display()));
        // Two namespaces writing one file would each overwrite the other's state.
        let key = std::fs::canonicalize(dir_of(path))
            .map_err(|e| err(e.to_string()))?
            .join(path.file_name().unwrap_or_default());
        if !PTPL_FILES.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone()) {
            return Err(err("already used by another namespace".into()));
        }
        let claimed = Claim(key);
        let saved = match std::fs::read(path) {
            Ok(b) => serde_json::from_slice::<Saved>(&b).map_err(|e| err(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved::default(),
            Err(e) => return Err(err(e.to_string())),
        };
        let mut inner = Inner::default();
        if saved.ptpl {
            for r in &saved.registrants {
                let hostid = parse_uuid(&r.hostid).ok_or_else(|| err(format!("host id {:?}", r.hostid)))?;
                inner.registrants.push(Registrant { hostid, rkey: r.rkey });
            }
            inner.holder = match &saved.holder {
                Some(h) => Some(parse_uuid(h).ok_or_else(|| err(format!("holder {h:?}")))?),
                None => None,
            };
            if !(0..=EXCLUSIVE_ACCESS_ALL_REGS).contains(&saved.rtype) {
                return Err(err(format!("reservation type {}", saved.rtype)));
            }
            inner.rtype = saved.rtype;
            inner.generation = saved.generation;
            inner.ptpl = true;
        }
        Ok(Reservations::with(inner, Some((path.to_path_buf(), claimed))))
    }

    fn file(&self) -> std::sync::MutexGuard<'_, Option<(PathBuf, Claim)>> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The namespace left its subsystem: stop writing its file and give it back, so a
    /// namespace added in its place may take it (a connection may hold the removed one a
    /// little longer; it must not write over its successor's state).
    pub fn detach(&self) {
        let _g = self.lock();
        self.file().take();
    }

    /// Whether the state can persist through power loss (Identify Namespace RESCAP bit 0).
    pub fn ptpl_capable(&self) -> bool {
        self.file().is_some()
    }

    /// Whether it does now (the report's PTPLS, Get Features 83h).
    pub fn ptpl(&self) -> bool {
        self.lock().ptpl
    }

    /// Set Features 83h: persistence on or off.
    pub fn set_ptpl(&self, on: bool) -> Status {
        if on && !self.ptpl_capable() {
            return Status::INVALID_FIELD;
        }
        let mut g = self.lock();
        let before = g.clone();
        g.ptpl = on;
        self.commit(&mut g, &before)
    }

    /// Makes a change final: written to the file if PTPL is (or was) on, then published
    /// to the I/O path; a change the file did not take is undone.
    fn commit(&self, g: &mut Inner, before: &Inner) -> Status {
        let file = self.file();
        if let Some((path, _)) = &*file
            && (g.ptpl || before.ptpl)
        {
            let saved = Saved {
                ptpl: g.ptpl,
                generation: g.generation,
                rtype: if g.holder.is_some() { g.rtype } else { 0 },
                holder: g.holder.as_ref().map(|h| hex(h)),
                registrants: g
                    .registrants
                    .iter()
                    .map(|r| SavedRegistrant { hostid: hex(&r.hostid), rkey: r.rkey })
                    .collect(),
            };
            let written =
                serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other).and_then(|b| write_durably(path, &b));
            if let Err(e) = written {
                tracing::error!(file = %path.display(), error = %e, "reservation change not persisted: undone");
                let epoch = g.epoch;
                *g = before.clone();
                g.epoch = epoch;
                return Status::INTERNAL;
            }
        }
        self.publish(g);
        Status::SUCCESS
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a change to the I/O path.
    fn publish(&self, g: &mut Inner) {
        g.epoch += 1;
        let rtype = if g.holder.is_some() { g.rtype } else { 0 };
        self.word.store(g.epoch << 8 | u64::from(rtype), Ordering::Release);
    }

    /// Checks a command of `group` from host `hostid` on namespace `nsid` (the cache is
    /// the connection's).
    #[inline]
    pub fn check(&self, nsid: u32, hostid: &[u8; 16], group: Group, cache: &mut AccessCache) -> Result<(), Status> {
        if group == Group::Other {
            return Ok(());
        }
        let word = self.word.load(Ordering::Acquire);
        if word & 0xff == 0 {
            return Ok(());
        }
        if cache.nsid != nsid || cache.word != word {
            let g = self.lock();
            *cache = AccessCache {
                nsid,
                word: self.word.load(Ordering::Acquire),
                read: g.verdict(hostid, Group::Read),
                write: g.verdict(hostid, Group::Write),
            };
        }
        let ok = if group == Group::Read { cache.read } else { cache.write };
        if ok {
            return Ok(());
        }
        self.conflicts.fetch_add(1, Ordering::Relaxed);
        Err(Status::RESERVATION_CONFLICT)
    }

    /// Commands refused with Reservation Conflict so far.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// Reservation Register (CDW10: RREGA 2:0, IEKEY 3, CPTPL 31:30; data: CRKEY, NRKEY).
    pub fn register(&self, hostid: &[u8; 16], cdw10: u32, data: &[u8]) -> Status {
        let (Some(crkey), Some(nrkey)) = (key_at(data, 0), key_at(data, 8)) else {
            return Status::DATA_SGL_LENGTH_INVALID;
        };
        let iekey = cdw10 & (1 << 3) != 0;
        // CPTPL: 00b no change, 10b persistence off, 11b on (PTPL capable only).
        let ptpl = match cdw10 >> 30 {
            0b00 => None,
            0b10 => Some(false),
            0b11 if self.ptpl_capable() => Some(true),
            _ => return Status::INVALID_FIELD,
        };
        let mut g = self.lock();
        let before = g.clone();
        let me = g.find(hostid);
        let status = match (cdw10 & 7, me) {
            (0, Some(i)) if g.registrants[i].rkey == nrkey => Status::SUCCESS,
            (0, Some(_)) => Status::RESERVATION_CONFLICT,
            (0, None) => {
                g.registrants.push(Registrant { hostid: *hostid, rkey: nrkey });
                Status::SUCCESS
            }
            (1, Some(i)) if iekey || g.registrants[i].rkey == crkey => {
                g.unregister_at(i);
                Status::SUCCESS
            }
            (2, Some(i)) if iekey || g.registrants[i].rkey == crkey => {
                g.registrants[i].rkey = nrkey;
                Status::SUCCESS
            }
            (1 | 2, _) => Status::RESERVATION_CONFLICT,
            _ => Status::INVALID_FIELD,
        };
        if !status.is_success() {
            return status;
        }
        g.generation = g.generation.wrapping_add(1);
        if let Some(on) = ptpl {
            g.ptpl = on;
        }
        self.commit(&mut g, &before)
    }

    /// Reservation Acquire (CDW10: RACQA 2:0, IEKEY 3, RTYPE 15:8; data: CRKEY, PRKEY).
    pub fn acquire(&self, hostid: &[u8; 16], cdw10: u32, data: &[u8]) -> Status {
        let (Some(crkey), Some(prkey)) = (key_at(data, 0), key_at(data, 8)) else {
            return Status::DATA_SGL_LENGTH_INVALID;
        };
        let rtype = ((cdw10 >> 8) & 0xff) as u8;
        if cdw10 & (1 << 3) != 0 || !(WRITE_EXCLUSIVE..=EXCLUSIVE_ACCESS_ALL_REGS).contains(&rtype) {
            return Status::INVALID_FIELD;
        }
        let mut g = self.lock();
        let before = g.clone();
        match g.find(hostid) {
            Some(i) if g.registrants[i].rkey == crkey => {}
            _ => return Status::RESERVATION_CONFLICT,
        }
        let status = match cdw10 & 7 {
            0 => match g.holder {
                None => {
                    g.holder = Some(*hostid);
                    g.rtype = rtype;
                    Status::SUCCESS
                }
                Some(_) if g.is_holder(hostid) && g.rtype == rtype => Status::SUCCESS,
                Some(_) => Status::RESERVATION_CONFLICT,
            },
            1 | 2 => {
                let s = Self::preempt(&mut g, hostid, rtype, prkey);
                if s.is_success() {
                    g.generation = g.generation.wrapping_add(1);
                }
                s
            }
            _ => Status::INVALID_FIELD,
        };
        if !status.is_success() {
            return status;
        }
        self.commit(&mut g, &before)
    }

    fn preempt(g: &mut Inner, hostid: &[u8; 16], rtype: u8, prkey: u64) -> Status {
        let conflict_if_none = |any: bool| if any { Status::SUCCESS } else { Status::RESERVATION_CONFLICT };
        let Some(holder) = g.holder else {
            // No reservation: preempting only unregisters the hosts holding PRKEY.
            return conflict_if_none(g.unregister_key(prkey, None, hostid));
        };
        if all_registrants(g.rtype) {
            if prkey == 0 {
                // Every other registrant goes; the preempting host holds the new reservation.
                g.holder = Some(*hostid);
                g.rtype = rtype;
                let others: Vec<[u8; 16]> = g.registrants.iter().map(|r| r.hostid).filter(|h| h != hostid).collect();
                g.registrants.retain(|r| &r.hostid == hostid);
                for h in others {
                    g.notices.push(Notice { hostid: h, notice: resv_notice::REGISTRATION_PREEMPTED });
                }
                return Status::SUCCESS;
            }
            return conflict_if_none(g.unregister_key(prkey, None, hostid));
        }
        if &holder == hostid {
            if g.rtype != rtype {
                g.notify_registrants(resv_notice::RESERVATION_RELEASED, hostid);
            }
            g.rtype = rtype;
            return Status::SUCCESS;
        }
        let holder_key = g.find(&holder).map(|i| g.registrants[i].rkey);
        if holder_key == Some(prkey) {
            let changed = g.rtype != rtype;
            g.holder = Some(*hostid);
            g.rtype = rtype;
            g.unregister_key(prkey, Some(hostid), hostid);
            if changed {
                g.notify_registrants(resv_notice::RESERVATION_RELEASED, hostid);
            }
            return Status::SUCCESS;
        }
        if prkey == 0 {
            return Status::INVALID_FIELD;
        }
        conflict_if_none(g.unregister_key(prkey, None, hostid))
    }

    /// Reservation Release (CDW10: RRELA 2:0, IEKEY 3, RTYPE 15:8; data: CRKEY).
    pub fn release(&self, hostid: &[u8; 16], cdw10: u32, data: &[u8]) -> Status {
        let Some(crkey) = key_at(data, 0) else {
            return Status::DATA_SGL_LENGTH_INVALID;
        };
        if cdw10 & (1 << 3) != 0 {
            return Status::INVALID_FIELD;
        }
        let rtype = ((cdw10 >> 8) & 0xff) as u8;
        let mut g = self.lock();
        let before = g.clone();
        match g.find(hostid) {
            Some(i) if g.registrants[i].rkey == crkey => {}
            _ => return Status::RESERVATION_CONFLICT,
        }
        let status = match cdw10 & 7 {
            // Releasing what one does not hold does nothing, successfully.
            0 if !g.is_holder(hostid) => Status::SUCCESS,
            0 if g.rtype != rtype => Status::INVALID_FIELD,
            0 => {
                // Registrants of the other types had access through it: they are told.
                if !matches!(g.rtype, WRITE_EXCLUSIVE | EXCLUSIVE_ACCESS) {
                    g.notify_registrants(resv_notice::RESERVATION_RELEASED, hostid);
                }
                g.holder = None;
                g.rtype = 0;
                Status::SUCCESS
            }
            1 => {
                g.clear(Some(hostid));
                Status::SUCCESS
            }
            _ => Status::INVALID_FIELD,
        };
        if !status.is_success() {
            return status;
        }
        self.commit(&mut g, &before)
    }

    /// The state as an operator sees it (RPC `get_reservation`).
    pub fn snapshot(&self) -> Snapshot {
        let g = self.lock();
        Snapshot {
            generation: g.generation,
            rtype: if g.holder.is_some() { g.rtype } else { 0 },
            registrants: g
                .registrants
                .iter()
                .map(|r| SnapshotRegistrant { hostid: hex(&r.hostid), rkey: r.rkey, holds: g.is_holder(&r.hostid) })
                .collect(),
        }
    }

    /// Drops every registration and the reservation, as a Release with Clear would
    /// (RPC `clear_reservation`: the administrator's way out when the host holding a
    /// reservation is gone for good). Returns how many registrations there were.
    pub fn clear(&self) -> Result<usize, Status> {
        let mut g = self.lock();
        let before = g.clone();
        let n = g.registrants.len();
        g.clear(None);
        match self.commit(&mut g, &before) {
            s if s.is_success() => Ok(n),
            s => Err(s),
        }
    }

    /// The hosts to tell of the changes made since the last call (the caller of a
    /// Register, Acquire, Release or clear takes them right after it, and hands them to
    /// [`crate::controller::notify_reservation`]).
    pub fn take_notices(&self) -> Vec<Notice> {
        std::mem::take(&mut self.lock().notices)
    }

    /// The Reservation Report's data length: CDW10 is NUMD, 0's based dwords.
    pub fn report_len(cdw10: u32) -> u64 {
        4 * (u64::from(cdw10) + 1)
    }

    /// Reservation Report (CDW10 NUMD, CDW11 bit 0 EDS) into `out` (zeroed by the caller,
    /// [`Self::report_len`] bytes): the header, then one 64-byte entry per registrant that fits.
    pub fn report(&self, cdw11: u32, out: &mut [u8]) -> Status {
        if cdw11 & 1 == 0 {
            // Host Identifiers here are 128-bit: only the extended structure carries them.
            return Status::HOST_ID_INCONSISTENT;
        }
        if out.len() < REPORT_HEADER {
            return Status::INVALID_FIELD;
        }
        let g = self.lock();
        let rtype = if g.holder.is_some() { g.rtype } else { 0 };
        out[0..4].copy_from_slice(&g.generation.to_le_bytes());
        out[4] = rtype;
        let n = u16::try_from(g.registrants.len()).unwrap_or(u16::MAX);
        out[5..7].copy_from_slice(&n.to_le_bytes());
        out[9] = u8::from(g.ptpl);
        for (r, e) in g.registrants.iter().zip(out[REPORT_HEADER..].chunks_exact_mut(REPORT_ENTRY)) {
            e[0..2].copy_from_slice(&CNTLID_DYNAMIC.to_le_bytes());
            e[2] = u8::from(g.is_holder(&r.hostid));
            e[8..16].copy_from_slice(&r.rkey.to_le_bytes());
            e[16..32].copy_from_slice(&r.hostid);
        }
        Status::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [0xa; 16];
    const B: [u8; 16] = [0xb; 16];
    const C: [u8; 16] = [0xc; 16];

    fn keys(k1: u64, k2: u64) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&k1.to_le_bytes());
        d[8..].copy_from_slice(&k2.to_le_bytes());
        d
    }

    fn register(r: &Reservations, h: &[u8; 16], nrkey: u64) -> Status {
        r.register(h, 0, &keys(0, nrkey))
    }

    fn acquire(r: &Reservations, h: &[u8; 16], crkey: u64, rtype: u8) -> Status {
        r.acquire(h, u32::from(rtype) << 8, &keys(crkey, 0))
    }

    fn preempt(r: &Reservations, h: &[u8; 16], crkey: u64, prkey: u64, rtype: u8) -> Status {
        r.acquire(h, u32::from(rtype) << 8 | 1, &keys(crkey, prkey))
    }

    fn can(r: &Reservations, h: &[u8; 16], g: Group) -> bool {
        r.check(1, h, g, &mut AccessCache::default()).is_ok()
    }

    #[test]
    fn every_type_leaves_other_hosts_the_access_the_specification_gives() {
        // (type, registrant's read, registrant's write, stranger's read, stranger's write)
        let table = [
            (WRITE_EXCLUSIVE, true, false, true, false),
            (EXCLUSIVE_ACCESS, false, false, false, false),
            (WRITE_EXCLUSIVE_REG_ONLY, true, true, true, false),
            (EXCLUSIVE_ACCESS_REG_ONLY, true, true, false, false),
            (WRITE_EXCLUSIVE_ALL_REGS, true, true, true, false),
            (EXCLUSIVE_ACCESS_ALL_REGS, true, true, false, false),
        ];
        for (rtype, rr, rw, sr, sw) in table {
            let r = Reservations::default();
            assert!(register(&r, &A, 1).is_success());
            assert!(register(&r, &B, 2).is_success());
            assert!(acquire(&r, &A, 1, rtype).is_success(), "type {rtype}");
            assert!(can(&r, &A, Group::Read) && can(&r, &A, Group::Write), "the holder, type {rtype}");
            assert_eq!((can(&r, &B, Group::Read), can(&r, &B, Group::Write)), (rr, rw), "registrant, type {rtype}");
            assert_eq!((can(&r, &C, Group::Read), can(&r, &C, Group::Write)), (sr, sw), "stranger, type {rtype}");
            assert!(can(&r, &C, Group::Other), "reservation commands are never blocked");
            if !sw {
                let denied = r.check(1, &C, Group::Write, &mut AccessCache::default());
                assert_eq!(denied, Err(Status::RESERVATION_CONFLICT));
            }
        }
    }

    #[test]
    fn register_unregister_and_replace_check_the_current_key() {
        let r = Reservations::default();
        assert!(register(&r, &A, 7).is_success());
        assert!(register(&r, &A, 7).is_success(), "the same key again is no change");
        assert_eq!(register(&r, &A, 8), Status::RESERVATION_CONFLICT, "another key needs Replace");
        assert_eq!(r.register(&A, 2, &keys(9, 8)), Status::RESERVATION_CONFLICT, "wrong current key");
        assert!(r.register(&A, 2, &keys(7, 8)).is_success());
        assert!(r.register(&A, 2 | 1 << 3, &keys(0, 9)).is_success(), "IEKEY skips the check");
        assert_eq!(r.register(&B, 1, &keys(0, 0)), Status::RESERVATION_CONFLICT, "B never registered");
        assert!(r.register(&A, 1, &keys(9, 0)).is_success());
        assert_eq!(r.register(&A, 5, &keys(0, 1)), Status::INVALID_FIELD, "no such action");
        assert_eq!(r.register(&A, 3 << 30, &keys(0, 1)), Status::INVALID_FIELD, "no persistence through power loss");
        assert_eq!(r.register(&A, 0, &[0u8; 8]), Status::DATA_SGL_LENGTH_INVALID);
    }

    #[test]
    fn acquire_and_release_follow_the_holder_and_its_type() {
        let r = Reservations::default();
        assert_eq!(acquire(&r, &A, 1, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "not registered");
        register(&r, &A, 1);
        register(&r, &B, 2);
        assert_eq!(acquire(&r, &A, 2, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "wrong key");
        assert_eq!(acquire(&r, &A, 1, 7), Status::INVALID_FIELD, "no type 7");
        assert_eq!(r.acquire(&A, 1 << 8 | 1 << 3, &keys(1, 0)), Status::INVALID_FIELD, "IEKEY refused");
        assert!(acquire(&r, &A, 1, WRITE_EXCLUSIVE).is_success());
        assert!(acquire(&r, &A, 1, WRITE_EXCLUSIVE).is_success(), "again, same type");
        assert_eq!(acquire(&r, &A, 1, EXCLUSIVE_ACCESS), Status::RESERVATION_CONFLICT, "another type needs a preempt");
        assert_eq!(acquire(&r, &B, 2, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "A holds it");
        assert!(r.release(&B, 1 << 8, &keys(2, 0)).is_success(), "B releasing what it does not hold: no-op");
        assert!(!can(&r, &B, Group::Write));
        assert_eq!(r.release(&A, u32::from(EXCLUSIVE_ACCESS) << 8, &keys(1, 0)), Status::INVALID_FIELD);
        assert!(r.release(&A, 1 << 8, &keys(1, 0)).is_success());
        assert!(can(&r, &C, Group::Write), "released");
        assert!(acquire(&r, &B, 2, EXCLUSIVE_ACCESS).is_success());
        assert!(!can(&r, &A, Group::Read));
        assert!(r.release(&A, 1, &keys(1, 0)).is_success(), "Clear");
        assert!(can(&r, &A, Group::Read) && can(&r, &C, Group::Write));
        assert_eq!(acquire(&r, &B, 2, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "Clear unregistered B too");
    }

    #[test]
    fn preempt_takes_the_reservation_and_unregisters_the_preempted() {
        let r = Reservations::default();
        register(&r, &A, 1);
        register(&r, &B, 2);
        register(&r, &C, 1);
        acquire(&r, &A, 1, WRITE_EXCLUSIVE);
        // B preempts A's key: A and C (same key) are gone, B holds a new type.
        assert!(preempt(&r, &B, 2, 1, EXCLUSIVE_ACCESS).is_success());
        assert!(!can(&r, &A, Group::Read) && !can(&r, &C, Group::Read));
        assert_eq!(acquire(&r, &A, 1, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "A is unregistered");
        // The holder preempting itself changes the type.
        assert!(preempt(&r, &B, 2, 2, WRITE_EXCLUSIVE).is_success());
        assert!(can(&r, &A, Group::Read) && !can(&r, &A, Group::Write));
        // A key nobody holds.
        register(&r, &A, 5);
        assert_eq!(preempt(&r, &A, 5, 99, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT);
        assert_eq!(preempt(&r, &A, 5, 0, WRITE_EXCLUSIVE), Status::INVALID_FIELD, "PRKEY 0 outside All Registrants");
        // Without a reservation a preempt only unregisters.
        r.release(&B, 1 << 8, &keys(2, 0));
        assert!(preempt(&r, &A, 5, 2, WRITE_EXCLUSIVE).is_success());
        assert!(can(&r, &C, Group::Write), "still no reservation");
        assert_eq!(acquire(&r, &B, 2, WRITE_EXCLUSIVE), Status::RESERVATION_CONFLICT, "B was unregistered");
    }

    #[test]
    fn an_all_registrants_reservation_outlives_the_registrant_that_took_it() {
        let r = Reservations::default();
        register(&r, &A, 1);
        register(&r, &B, 2);
        acquire(&r, &A, 1, WRITE_EXCLUSIVE_ALL_REGS);
        assert!(acquire(&r, &B, 2, WRITE_EXCLUSIVE_ALL_REGS).is_success(), "every registrant holds it");
        assert!(r.register(&A, 1, &keys(1, 0)).is_success(), "A leaves");
        assert!(!can(&r, &A, Group::Write) && can(&r, &B, Group::Write), "B still holds it");
        assert!(r.register(&B, 1, &keys(2, 0)).is_success(), "the last registrant leaves");
        assert!(can(&r, &A, Group::Write), "no reservation is left");
        // Preempt with PRKEY 0 under All Registrants: the others go.
        register(&r, &A, 1);
        register(&r, &B, 2);
        acquire(&r, &A, 1, EXCLUSIVE_ACCESS_ALL_REGS);
        assert!(preempt(&r, &B, 2, 0, WRITE_EXCLUSIVE).is_success());
        assert!(can(&r, &A, Group::Read) && !can(&r, &A, Group::Write), "A unregistered, B holds Write Exclusive");
        // A holder that unregisters from a non-All-Registrants reservation ends it.
        assert!(r.register(&B, 1, &keys(2, 0)).is_success());
        assert!(can(&r, &A, Group::Write));
    }

    #[test]
    fn the_report_lists_every_registrant_and_the_holder() {
        let r = Reservations::default();
        register(&r, &A, 0x1111);
        register(&r, &B, 0x2222);
        acquire(&r, &B, 0x2222, WRITE_EXCLUSIVE_REG_ONLY);
        let mut out = vec![0u8; usize::try_from(Reservations::report_len(63)).unwrap()];
        assert_eq!(out.len(), 256);
        assert_eq!(r.report(0, &mut out), Status::HOST_ID_INCONSISTENT, "the 64-bit structure");
        assert!(r.report(1, &mut out).is_success());
        assert_eq!(u32::from_le_bytes(out[0..4].try_into().unwrap()), 2, "two registrations");
        assert_eq!(out[4], WRITE_EXCLUSIVE_REG_ONLY);
        assert_eq!(u16::from_le_bytes([out[5], out[6]]), 2);
        let e = |i: usize| &out[REPORT_HEADER + i * REPORT_ENTRY..][..REPORT_ENTRY];
        assert_eq!((e(0)[2], &e(0)[16..32], u64::from_le_bytes(e(0)[8..16].try_into().unwrap())), (0, &A[..], 0x1111));
        assert_eq!((e(1)[2], &e(1)[16..32], u64::from_le_bytes(e(1)[8..16].try_into().unwrap())), (1, &B[..], 0x2222));
        assert_eq!(u16::from_le_bytes([e(0)[0], e(0)[1]]), 0xffff);
        // A short buffer gets the count of all registrants and the entries that fit.
        let mut short = vec![0u8; REPORT_HEADER + REPORT_ENTRY];
        assert!(r.report(1, &mut short).is_success());
        assert_eq!(u16::from_le_bytes([short[5], short[6]]), 2);
        assert_eq!(&short[REPORT_HEADER + 16..REPORT_HEADER + 32], &A[..]);
        assert_eq!(r.report(1, &mut [0u8; 32]), Status::INVALID_FIELD);
    }

    fn told(r: &Reservations) -> Vec<([u8; 16], u8)> {
        let mut v: Vec<_> = r.take_notices().into_iter().map(|n| (n.hostid, n.notice)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn changes_that_take_something_from_other_hosts_tell_them() {
        use nvme::log::resv_notice::*;
        let r = Reservations::default();
        for (h, k) in [(&A, 1), (&B, 2), (&C, 3)] {
            register(&r, h, k);
        }
        assert!(told(&r).is_empty(), "registering tells nobody");
        acquire(&r, &A, 1, WRITE_EXCLUSIVE_REG_ONLY);
        assert!(told(&r).is_empty());
        // B preempts A by A's key, same type: A's registration is gone.
        assert!(preempt(&r, &B, 2, 1, WRITE_EXCLUSIVE_REG_ONLY).is_success());
        assert_eq!(told(&r), [(A, REGISTRATION_PREEMPTED)]);
        // B, the holder, changes the type: the other registrant hears of a release.
        assert!(preempt(&r, &B, 2, 2, EXCLUSIVE_ACCESS_REG_ONLY).is_success());
        assert_eq!(told(&r), [(C, RESERVATION_RELEASED)]);
        // B releases a Registrants Only reservation: C is told, B is not.
        register(&r, &A, 1);
        assert!(r.release(&B, u32::from(EXCLUSIVE_ACCESS_REG_ONLY) << 8, &keys(2, 0)).is_success());
        assert_eq!(told(&r), [(A, RESERVATION_RELEASED), (C, RESERVATION_RELEASED)]);
        // Releasing Write Exclusive tells nobody: registrants had no access through it.
        acquire(&r, &C, 3, WRITE_EXCLUSIVE);
        assert!(r.release(&C, u32::from(WRITE_EXCLUSIVE) << 8, &keys(3, 0)).is_success());
        assert!(told(&r).is_empty());
        // The holder of a Registrants Only reservation unregisters: the reservation ends.
        acquire(&r, &C, 3, WRITE_EXCLUSIVE_REG_ONLY);
        assert!(r.register(&C, 1, &keys(3, 0)).is_success());
        assert_eq!(told(&r), [(A, RESERVATION_RELEASED), (B, RESERVATION_RELEASED)]);
        // Preempt with PRKEY 0 under All Registrants: the others' registrations go.
        register(&r, &C, 3);
        acquire(&r, &A, 1, EXCLUSIVE_ACCESS_ALL_REGS);
        assert!(preempt(&r, &B, 2, 0, WRITE_EXCLUSIVE).is_success());
        assert_eq!(told(&r), [(A, REGISTRATION_PREEMPTED), (C, REGISTRATION_PREEMPTED)]);
        // Clear: every other registrant's reservation was preempted.
        register(&r, &A, 1);
        assert!(r.release(&B, 1, &keys(2, 0)).is_success());
        assert_eq!(told(&r), [(A, RESERVATION_PREEMPTED)]);
        // The operator's clear tells every registrant.
        register(&r, &A, 1);
        register(&r, &B, 2);
        assert_eq!(r.clear(), Ok(2));
        assert_eq!(told(&r), [(A, RESERVATION_PREEMPTED), (B, RESERVATION_PREEMPTED)]);
    }

    /// A directory of this test's own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qpath-resv-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const CPTPL_ON: u32 = 0b11 << 30;
    const CPTPL_OFF: u32 = 0b10 << 30;

    #[test]
    fn persistence_through_power_loss_survives_a_restart_once_a_host_turns_it_on() {
        let dir = scratch("ptpl");
        let path = dir.join("ns1.resv");
        assert_eq!(Reservations::default().register(&A, CPTPL_ON, &keys(0, 1)), Status::INVALID_FIELD, "not capable");
        let r = Reservations::persistent(&path).unwrap();
        assert!(r.ptpl_capable() && !r.ptpl());
        assert_eq!(r.register(&A, 0b01 << 30, &keys(0, 1)), Status::INVALID_FIELD, "CPTPL 01b is reserved");
        assert!(register(&r, &B, 2).is_success());
        assert!(!path.exists(), "nothing is written while PTPL is off");
        assert!(r.register(&A, CPTPL_ON, &keys(0, 1)).is_success());
        assert!(acquire(&r, &A, 1, WRITE_EXCLUSIVE).is_success());
        assert!(r.ptpl() && path.exists());
        let mut out = [0u8; 256];
        assert!(r.report(1, &mut out).is_success());
        assert_eq!(out[9], 1, "PTPLS");
        // The target restarts: the state comes back as it was.
        drop(r);
        let r = Reservations::persistent(&path).unwrap();
        assert!(r.ptpl());
        let mut again = [0u8; 256];
        assert!(r.report(1, &mut again).is_success());
        assert_eq!(out, again, "the same report after the restart");
        assert!(!can(&r, &C, Group::Write) && can(&r, &A, Group::Write));
        // Turned off: a restart starts from nothing.
        assert!(r.register(&B, CPTPL_OFF, &keys(0, 2)).is_success(), "B registers its key again, PTPL off");
        drop(r);
        let r = Reservations::persistent(&path).unwrap();
        assert!(!r.ptpl() && can(&r, &C, Group::Write));
        assert!(r.set_ptpl(true).is_success() && r.ptpl());
        assert_eq!(Reservations::default().set_ptpl(true), Status::INVALID_FIELD);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_that_cannot_be_persisted_is_undone_and_a_bad_file_refused() {
        let dir = scratch("undone");
        let path = dir.join("gone").join("ns1.resv");
        std::fs::create_dir(dir.join("gone")).unwrap();
        let r = Reservations::persistent(&path).unwrap();
        assert!(r.register(&A, CPTPL_ON, &keys(0, 1)).is_success());
        assert!(register(&r, &B, 2).is_success());
        std::fs::remove_dir_all(dir.join("gone")).unwrap();
        assert_eq!(acquire(&r, &A, 1, EXCLUSIVE_ACCESS), Status::INTERNAL, "the file cannot be written");
        assert_eq!(r.release(&A, 1, &keys(1, 0)), Status::INTERNAL, "nor can a Clear be");
        assert!(r.take_notices().is_empty(), "a change undone tells nobody (B would have heard of the Clear)");
        assert!(can(&r, &C, Group::Read), "so the reservation was not taken");
        assert_eq!(r.snapshot().rtype, 0);
        let twice = dir.join("twice.resv");
        let first = Reservations::persistent(&twice).unwrap();
        assert!(Reservations::persistent(&dir.join(".").join("twice.resv")).is_err(), "one file, one namespace");
        drop(first);
        let second = Reservations::persistent(&twice).unwrap();
        assert!(second.register(&A, CPTPL_ON, &keys(0, 1)).is_success(), "free again once that namespace is gone");
        // A namespace removed from its subsystem gives its file to the one added in its place
        // and never writes it again.
        second.detach();
        let third = Reservations::persistent(&twice).unwrap();
        assert!(third.ptpl(), "the state the removed namespace left");
        assert_eq!(second.register(&B, 0, &keys(0, 2)), Status::SUCCESS);
        drop(third);
        assert!(!Reservations::persistent(&twice).unwrap().snapshot().registrants.iter().any(|r| r.rkey == 2));
        std::fs::write(dir.join("bad.resv"), b"{ not json").unwrap();
        assert!(Reservations::persistent(&dir.join("bad.resv")).is_err());
        std::fs::write(
            dir.join("type.resv"),
            br#"{"ptpl":true,"generation":1,"rtype":9,"holder":null,"registrants":[]}"#,
        )
        .unwrap();
        assert!(Reservations::persistent(&dir.join("type.resv")).is_err(), "no reservation type 9");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cached_verdict_is_dropped_when_the_reservation_changes() {
        let r = Reservations::default();
        let mut cache = AccessCache::default();
        register(&r, &A, 1);
        acquire(&r, &A, 1, WRITE_EXCLUSIVE);
        assert_eq!(r.check(1, &B, Group::Write, &mut cache), Err(Status::RESERVATION_CONFLICT));
        assert!(r.check(1, &B, Group::Read, &mut cache).is_ok(), "same word: from the cache");
        register(&r, &B, 2);
        preempt(&r, &B, 2, 1, WRITE_EXCLUSIVE);
        assert!(r.check(1, &B, Group::Write, &mut cache).is_ok(), "B holds it now");
        // Another namespace with the same word value must not reuse the verdict.
        let other = Reservations::default();
        register(&other, &A, 1);
        acquire(&other, &A, 1, EXCLUSIVE_ACCESS);
        let mut shared = AccessCache::default();
        assert!(r.check(1, &B, Group::Read, &mut shared).is_ok());
        assert_eq!(other.check(2, &B, Group::Read, &mut shared), Err(Status::RESERVATION_CONFLICT));
    }
}
