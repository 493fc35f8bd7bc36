//! Namespace backends: where a namespace's blocks live.
//!
//! - [`Backend::Null`] keeps no data: reads return zeros, writes are dropped.
//!   It measures the transport alone.
//! - [`Backend::Ram`] keeps data in a [`uring::SharedRegion`] that every
//!   reactor thread reads and writes directly (a memcpy, no syscall); reads
//!   without a data digest are sent straight from the region (the kernel's
//!   copy into the socket is the only one).
//! - [`Backend::File`] is a file or block device driven through the
//!   reactor's io_uring, opened with `O_DIRECT` where the file system accepts
//!   it (buffered otherwise). Flush is `fdatasync`: it makes every completed
//!   write durable. It never resizes a file unless told to, and holds a lock on
//!   it for as long as it lives, so one file backs one namespace ([`FileRequest`]).
//!
//! Deallocation and zeroes ([`Zeroing`]): null reads zeros and RAM zero-fills, so both
//! report deallocated blocks as reading zeros (DLFEAT 001b). A file or block device does
//! only where `fallocate(PUNCH_HOLE)` guarantees it, which is probed at open.
//!
//! The null and RAM backends complete inline; the file backend hands an
//! [`FileOp`] to the reactor and completes later.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uring::{FileLock, IoBuf, LockHolder, RegionOptions, SharedRegion};

use crate::error::{Error, ErrorKind};

/// A namespace's storage.
pub enum Backend {
    /// No storage.
    Null,
    /// Memory shared by all reactors.
    Ram(Arc<SharedRegion>),
    /// A file or block device.
    File(FileBackend),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Null => write!(f, "null"),
            Backend::Ram(r) => write!(f, "ram({} bytes)", r.len()),
            Backend::File(b) => write!(f, "file({}, direct={})", b.path.display(), b.direct),
        }
    }
}

/// What a namespace may do to its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and write: the file is open `O_RDWR` under an exclusive lock.
    ReadWrite,
    /// Read only: the file is open `O_RDONLY` under a shared lock, which other read-only
    /// namespaces (of this target or another process) may hold too.
    ReadOnly,
}

/// What [`FileBackend::open`] opens, and on what terms.
///
/// The rules (Linux nvmet and SPDK's aio/uring bdevs also take a file's or device's own
/// size and never resize it):
/// - an existing file or device is never shrunk, and never grown unless `grow` says so
///   (a regular file only: a block device cannot grow); without `size` its own size is used;
/// - a missing file is created only when `size` is given, with `O_CREAT | O_EXCL`, so a
///   file that appears meanwhile is never clobbered;
/// - one file backs one namespace: it is locked (an open-file-description lock on the whole
///   file, and for a block device opened read-write the kernel's exclusive claim, `O_EXCL`)
///   for as long as the [`FileBackend`] lives.
#[derive(Clone, Copy, Debug)]
pub struct FileRequest<'a> {
    /// A regular file or a block device.
    pub path: &'a Path,
    /// The size asked for, in bytes; `None`: the file's or device's own.
    pub size: Option<u64>,
    /// A regular file smaller than `size` may be grown to it.
    pub grow: bool,
    /// Read-write or read-only.
    pub access: Access,
    /// Who opens it, for errors and for the table of held files: "namespace 1 of nqn...".
    pub owner: &'a str,
}

impl<'a> FileRequest<'a> {
    /// A read-write file or device of `size` bytes (`None`: its own), created when missing
    /// and a size is given, never grown, for `owner`.
    pub fn read_write(path: &'a Path, size: Option<u64>, owner: &'a str) -> FileRequest<'a> {
        FileRequest { path, size, grow: false, access: Access::ReadWrite, owner }
    }
}

/// A file-backed namespace.
#[derive(Debug)]
pub struct FileBackend {
    // Field order is drop order: the file (and with it the lock) goes before the entry in
    // the table of held files, so the table never misses a file that is still locked.
    file: File,
    claim: Claim,
    /// Path, for reports.
    pub path: PathBuf,
    /// Whether the file is open with O_DIRECT.
    pub direct: bool,
    /// Size in bytes.
    pub size: u64,
    /// Read-write or read-only.
    pub access: Access,
    /// What deallocation and zeroing can use on it.
    pub zeroing: Zeroing,
}

impl FileBackend {
    /// Opens (or creates) and locks the file `req` names, after the rules of
    /// [`FileRequest`]. When the file was created here, the second value says so, to be
    /// removed again if the rest of the start fails ([`NewFiles`]).
    pub fn open(req: &FileRequest<'_>) -> Result<(FileBackend, Option<NewFile>), Error> {
        check_request(req)?;
        let (file, kind, new) = open_or_create(req)?;
        match settle(req, file, kind, new.is_some()) {
            Ok(b) => Ok((b, new)),
            Err(e) => {
                // A file this call created is not left behind by its failure.
                if let Some(n) = new {
                    n.remove();
                }
                Err(e)
            }
        }
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Synchronous flush, for shutdown paths.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Marks the file's holder as removed (its namespace left its subsystem) in the table
    /// of held files: the file stays open, and locked, until the last command that may use
    /// it is done, and an error about it then says so.
    pub fn retire(&self) {
        self.claim.retire();
    }
}

/// Refusals that need no look at the file.
fn check_request(req: &FileRequest<'_>) -> Result<(), Error> {
    let refuse = |why: &str| Err(config_err(req, why));
    if req.size == Some(0) {
        return refuse("size = 0 (give the size in bytes, or remove size to use the whole file)");
    }
    if req.grow && req.size.is_none() {
        return refuse("grow = true needs a size to grow to");
    }
    if req.grow && req.access == Access::ReadOnly {
        return refuse("a readonly namespace never changes its file (remove grow)");
    }
    Ok(())
}

/// Kind of the thing a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Regular,
    Block,
}

fn kind_of(req: &FileRequest<'_>, meta: &std::fs::Metadata) -> Result<Kind, Error> {
    let t = meta.file_type();
    if t.is_file() {
        Ok(Kind::Regular)
    } else if t.is_block_device() {
        Ok(Kind::Block)
    } else {
        Err(config_err(req, &format!("{} is neither a regular file nor a block device", req.path.display())))
    }
}

/// Opens the file (creating it when missing and `size` is given) without O_DIRECT; the
/// returned [`NewFile`] says it was created here.
fn open_or_create(req: &FileRequest<'_>) -> Result<(File, Kind, Option<NewFile>), Error> {
    let path = req.path;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return create(req),
        Err(e) => return Err(io_err(req, e)),
    };
    let kind = kind_of(req, &meta)?;
    let key = FileKey::of(&meta, kind);
    let mut o = OpenOptions::new();
    o.read(true);
    if req.access == Access::ReadWrite {
        o.write(true);
        if kind == Kind::Block {
            // The kernel's exclusive claim: refused while the device is mounted, part of a
            // device-mapper or md array, or claimed by another exclusive opener.
            o.custom_flags(libc::O_EXCL);
        }
    }
    match o.open(path) {
        Ok(f) => Ok((f, kind, None)),
        // A block device this process claimed answers "busy" (O_EXCL): the table says who.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && kind == Kind::Block => match held_by(key, req.access) {
            Some(holder) => Err(in_use_here(req, &holder)),
            None => Err(Error::new(
                ErrorKind::Backend,
                format!("{}: {} is in use: {}", req.owner, path.display(), bdev_user(&meta)),
            )),
        },
        Err(e) => Err(io_err(req, e)),
    }
}

fn create(req: &FileRequest<'_>) -> Result<(File, Kind, Option<NewFile>), Error> {
    let path = req.path.display();
    let Some(size) = req.size else {
        return Err(config_err(req, &format!("{path} does not exist; give size to create it")));
    };
    if req.access == Access::ReadOnly {
        return Err(config_err(
            req,
            &format!("{path} does not exist, and a readonly namespace never creates its file"),
        ));
    }
    // O_CREAT | O_EXCL: a file that appeared since the look above is refused, not clobbered.
    // 0600: the file will hold a host's disk.
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(req.path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            config_err(req, &format!("{path} appeared while qpath was about to create it; left as it is"))
        } else {
            io_err(req, e)
        }
    })?;
    let meta = file.metadata().map_err(|e| io_err(req, e))?;
    tracing::info!(file = %path, size, owner = req.owner, "created the namespace's file");
    Ok((file, Kind::Regular, Some(NewFile { path: req.path.to_path_buf(), dev: meta.dev(), ino: meta.ino() })))
}

/// Locks the open file, settles its size and turns on O_DIRECT.
fn settle(req: &FileRequest<'_>, file: File, kind: Kind, created: bool) -> Result<FileBackend, Error> {
    let meta = file.metadata().map_err(|e| io_err(req, e))?;
    if kind_of(req, &meta)? != kind {
        // The path was replaced between the look and the open: its open flags were chosen
        // for the other kind (O_EXCL for a block device).
        return Err(config_err(req, &format!("{} changed while it was being opened", req.path.display())));
    }
    let claim = Claim::take(req, &file, &meta, kind)?;
    let size = settle_size(req, &file, &meta, kind, created)?;
    // O_DIRECT is refused (EINVAL) by some file systems (tmpfs before Linux 6.6, ...):
    // buffered I/O then, made durable by Flush as well.
    let direct = match uring::set_direct_io(file.as_raw_fd(), true) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
        Err(e) => return Err(io_err(req, e)),
    };
    let zeroing = Zeroing::probe(&file, req.path);
    Ok(FileBackend { file, claim, path: req.path.to_path_buf(), direct, size, access: req.access, zeroing })
}

/// The size the namespace gets; grows a regular file when (and only when) asked to.
fn settle_size(
    req: &FileRequest<'_>,
    file: &File,
    meta: &std::fs::Metadata,
    kind: Kind,
    created: bool,
) -> Result<u64, Error> {
    let path = req.path.display();
    let have = match kind {
        Kind::Regular => meta.len(),
        Kind::Block => {
            // A block device's size is where seeking to its end lands.
            use std::io::Seek;
            let mut f = file;
            f.seek(std::io::SeekFrom::End(0)).map_err(|e| io_err(req, e))?
        }
    };
    let what = match kind {
        Kind::Regular => format!("{path} is {}", human(have)),
        Kind::Block => format!("{path} is a block device of {}", human(have)),
    };
    let Some(want) = req.size else {
        if have == 0 {
            return Err(config_err(req, &format!("{path} is empty; give size and grow = true to make it a disk")));
        }
        return Ok(have);
    };
    if created {
        file.set_len(want).map_err(|e| io_err(req, e))?;
        return Ok(want);
    }
    if want == have {
        return Ok(want);
    }
    if want < have {
        let fix = match kind {
            Kind::Regular => "qpath never shrinks a file (remove size to use the whole file)",
            Kind::Block => "qpath uses a block device whole (remove size)",
        };
        return Err(config_err(req, &format!("{what} but size = {} asks for less; {fix}", human(want))));
    }
    match kind {
        Kind::Block => Err(config_err(
            req,
            &format!("{what} but size = {} asks for more; a block device cannot grow (remove size)", human(want)),
        )),
        Kind::Regular if !req.grow => Err(config_err(
            req,
            &format!(
                "{what} but size = {} asks for more; qpath grows a file only when told to \
                 (add grow = true to grow it, or remove size to use it as it is)",
                human(want)
            ),
        )),
        Kind::Regular => {
            file.set_len(want).map_err(|e| io_err(req, e))?;
            tracing::info!(file = %path, from = have, to = want, owner = req.owner, "grew the namespace's file (grow = true)");
            Ok(want)
        }
    }
}

/// A size for people: "64 MiB", "1 GiB", "1536 bytes".
fn human(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.trailing_zeros() >= shift {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

fn config_err(req: &FileRequest<'_>, why: &str) -> Error {
    Error::new(ErrorKind::Config, format!("{}: {why}", req.owner))
}

fn io_err(req: &FileRequest<'_>, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Backend, format!("{}: {}: {e}", req.owner, req.path.display()))
}

/// A file as the kernel knows it: a block device by its device number (two device nodes
/// of one disk are one disk), anything else by file system and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKey {
    Inode { dev: u64, ino: u64 },
    Device { rdev: u64 },
}

impl FileKey {
    fn of(meta: &std::fs::Metadata, kind: Kind) -> FileKey {
        match kind {
            Kind::Regular => FileKey::Inode { dev: meta.dev(), ino: meta.ino() },
            Kind::Block => FileKey::Device { rdev: meta.rdev() },
        }
    }
}

/// One file held by a namespace of this process.
#[derive(Debug)]
struct Held {
    id: u64,
    key: FileKey,
    owner: String,
    access: Access,
    retired: bool,
}

/// Files held by this process's namespaces. The lock on a file tells another opener that
/// someone holds it, not who; this table names the namespace when it is one of ours.
/// (Process-wide, not per target: two targets in one process conflict on the lock too.)
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static NEXT_CLAIM: AtomicU64 = AtomicU64::new(1);

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Who in this process holds `key` in a way that conflicts with `access`.
fn held_by(key: FileKey, access: Access) -> Option<String> {
    conflict(&held(), key, access)
}

/// The holder in `table` of `key` that conflicts with `access`: readers share, a writer
/// shares with nobody.
fn conflict(table: &[Held], key: FileKey, access: Access) -> Option<String> {
    table.iter().find(|h| h.key == key && (h.access == Access::ReadWrite || access == Access::ReadWrite)).map(|h| {
        if h.retired { format!("{} (removed; open until its last command is done)", h.owner) } else { h.owner.clone() }
    })
}

fn in_use_here(req: &FileRequest<'_>, holder: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "{}: {} is already used by {holder} of this target; one file backs one namespace \
             (two would be two disks sharing blocks; two readonly namespaces may share one)",
            req.owner,
            req.path.display()
        ),
    )
}

/// A namespace's hold on its file: the entry in the table of held files (the lock itself
/// belongs to the open file and goes when it closes).
#[derive(Debug)]
struct Claim {
    id: u64,
}

/// How long a lock held by no live process is waited for: a process killed a moment ago
/// keeps its files until the kernel has finished the I/O it left in flight (its io_uring
/// is torn down asynchronously), so a target restarted at once after `kill -9` finds its
/// file still locked by nobody it can name.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(10);
const LOCK_WAIT_STEP: Duration = Duration::from_millis(20);

impl Claim {
    /// Takes the lock on `file` and records it, refusing when another namespace (of this
    /// process or another) holds it.
    fn take(req: &FileRequest<'_>, file: &File, meta: &std::fs::Metadata, kind: Kind) -> Result<Claim, Error> {
        let key = FileKey::of(meta, kind);
        let lock = match req.access {
            Access::ReadWrite => FileLock::Exclusive,
            Access::ReadOnly => FileLock::Shared,
        };
        let deadline = Instant::now() + LOCK_WAIT_MAX;
        let mut waited = false;
        loop {
            // Checked and recorded under the table's mutex, so two namespaces of this
            // process racing for one file cannot both pass the check.
            let mut table = held();
            if let Some(owner) = conflict(&table, key, req.access) {
                // An entry whose file is still open holds a conflicting lock on it. If the
                // lock can be taken, the entry's file was closed and unlinked, and this
                // file got its inode number (the entry goes just after its file closes):
                // a stale entry, not a holder.
                match uring::try_lock_file(file.as_raw_fd(), lock) {
                    Ok(()) => {
                        table.retain(|h| h.key != key);
                        return Ok(Claim::record(&mut table, key, req));
                    }
                    Err(_) => {
                        drop(table);
                        return Err(in_use_here(req, &owner));
                    }
                }
            }
            match uring::try_lock_file(file.as_raw_fd(), lock) {
                Ok(()) => return Ok(Claim::record(&mut table, key, req)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => drop(table),
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Backend,
                        format!(
                            "{}: cannot lock {} ({e}); qpath exports only a file it can lock, so that no \
                             other program or target writes it at the same time",
                            req.owner,
                            req.path.display()
                        ),
                    ));
                }
            }
            // A live holder is named at once; a lock nobody holds any more goes soon.
            let holder = if waited { None } else { lock_holder(file, lock, meta) };
            if holder.is_some() || Instant::now() >= deadline {
                let who = holder.unwrap_or_else(|| "another process".into());
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "{}: {} is locked by {who}; one file backs one namespace at a time \
                         (stop the other user, or export the file read-only from both)",
                        req.owner,
                        req.path.display()
                    ),
                ));
            }
            if !waited {
                tracing::info!(file = %req.path.display(), owner = req.owner, "locked by no process left: waiting for the kernel to let it go (a process that just died leaves its I/O to finish)");
                waited = true;
            }
            std::thread::sleep(LOCK_WAIT_STEP);
        }
    }

    /// Records a hold whose lock is taken.
    fn record(table: &mut Vec<Held>, key: FileKey, req: &FileRequest<'_>) -> Claim {
        let id = NEXT_CLAIM.fetch_add(1, Ordering::Relaxed);
        table.push(Held { id, key, owner: req.owner.to_string(), access: req.access, retired: false });
        Claim { id }
    }

    fn retire(&self) {
        if let Some(h) = held().iter_mut().find(|h| h.id == self.id) {
            h.retired = true;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        held().retain(|h| h.id != self.id);
    }
}

/// Names the process holding a lock on `file` that conflicts with `lock`: the kernel gives
/// the pid of a POSIX lock; an open-file-description lock (qpath's, QEMU's) has none, so
/// `/proc/*/fdinfo` (which lists each fd's locks) is searched for it. `None`: no process
/// this user can see holds it.
fn lock_holder(file: &File, lock: FileLock, meta: &std::fs::Metadata) -> Option<String> {
    let pid = match uring::file_lock_holder(file.as_raw_fd(), lock) {
        Ok(Some(LockHolder::Process(pid))) => Some(pid),
        _ => ofd_lock_holder(meta.dev(), meta.ino()),
    }?;
    Some(match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => format!("process {pid} ({})", comm.trim()),
        Err(_) => format!("process {pid}"),
    })
}

/// Bounds on the /proc walk (an error path only, but a host may run many processes).
const PROC_PIDS_MAX: usize = 1 << 16;
const PROC_FDS_MAX: usize = 1 << 20;

/// The pid whose fd holds an open-file-description lock on (dev, ino), from the `lock:`
/// lines of `/proc/PID/fdinfo/FD` ("lock: 1: OFDLCK ADVISORY WRITE -1 fe:00:1234 0 EOF";
/// the device as the kernel's major:minor in hex). Processes whose fdinfo this user may not
/// read are skipped.
fn ofd_lock_holder(dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino} ", dev_major(dev), dev_minor(dev));
    let mut fds = 0usize;
    for entry in std::fs::read_dir("/proc").ok()?.flatten().take(PROC_PIDS_MAX) {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(dir) = std::fs::read_dir(entry.path().join("fdinfo")) else { continue };
        for fd in dir.flatten() {
            fds += 1;
            if fds > PROC_FDS_MAX {
                return None;
            }
            let Ok(text) = std::fs::read_to_string(fd.path()) else { continue };
            if text.lines().any(|l| l.starts_with("lock:") && l.contains("OFDLCK") && l.contains(&want)) {
                return Some(pid);
            }
        }
    }
    None
}

/// glibc's gnu_dev_major / gnu_dev_minor.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn dev_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

/// Why a block device refuses an exclusive open: where it is mounted, which device
/// (device mapper, md) holds it, or which process has it locked.
fn bdev_user(meta: &std::fs::Metadata) -> String {
    let (major, minor) = (dev_major(meta.rdev()), dev_minor(meta.rdev()));
    // /proc/self/mountinfo: "36 35 7:0 / /mnt rw,relatime - ext4 /dev/loop0 rw".
    if let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") {
        let dev = format!("{major}:{minor}");
        let mounts: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split(' ').collect::<Vec<_>>().get(2..5).filter(|f| f[0] == dev).map(|f| f[2]))
            .collect();
        if !mounts.is_empty() {
            return format!("mounted at {}", mounts.join(", "));
        }
    }
    if let Ok(dir) = std::fs::read_dir(format!("/sys/dev/block/{major}:{minor}/holders")) {
        let holders: Vec<String> = dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        if !holders.is_empty() {
            return format!("held by {}", holders.join(", "));
        }
    }
    if let Some(pid) = ofd_lock_holder(meta.dev(), meta.ino()) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        return format!("opened exclusively by process {pid} ({})", comm.trim());
    }
    "opened exclusively by another program (a mount in another namespace, a device mapper, \
     an md array, another qpath)"
        .into()
}

/// A file a namespace's start created, to remove again when that start fails.
#[derive(Debug)]
pub struct NewFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl NewFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file, if the path still names the file created (and nothing else).
    fn remove(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => match std::fs::remove_file(&self.path) {
                Ok(()) => tracing::info!(file = %self.path.display(), "removed the file a failed start created"),
                Err(e) => {
                    tracing::warn!(file = %self.path.display(), "cannot remove the file a failed start created: {e}")
                }
            },
            Ok(_) => {
                tracing::warn!(file = %self.path.display(), "not removed: no longer the file the failed start created")
            }
            Err(_) => {}
        }
    }
}

/// The files one start (a configuration's, or one RPC call's) created: removed when this
/// is dropped, unless [`NewFiles::keep`] says the start succeeded.
#[derive(Debug, Default)]
pub struct NewFiles {
    files: Vec<NewFile>,
}

impl NewFiles {
    /// Records a created file.
    pub fn push(&mut self, f: NewFile) {
        self.files.push(f);
    }

    /// The created files, oldest first.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(NewFile::path)
    }

    /// The start succeeded: keep the files.
    pub fn keep(mut self) {
        self.files.clear();
    }
}

impl Drop for NewFiles {
    fn drop(&mut self) {
        for f in self.files.drain(..).rev() {
            f.remove();
        }
    }
}

impl Backend {
    /// A RAM backend of `size` bytes that may grow up to the machine's memory.
    pub fn ram(size: u64) -> Result<Backend, Error> {
        Backend::ram_with(size, RegionOptions::default())
    }

    /// A RAM backend of `size` bytes mapped with `options` (e.g. pre-faulted), that may grow
    /// up to the machine's memory ([`default_ram_max_size`]).
    pub fn ram_with(size: u64, options: RegionOptions) -> Result<Backend, Error> {
        Backend::ram_growable(size, default_ram_max_size(size), options)
    }

    /// A RAM backend of `size` bytes that a resize may grow up to `max_size` bytes: the
    /// address space is reserved now, memory is used as it grows ([`uring::SharedRegion`]).
    pub fn ram_growable(size: u64, max_size: u64, options: RegionOptions) -> Result<Backend, Error> {
        if max_size < size {
            return Err(Error::new(
                ErrorKind::Config,
                format!("max_size {max_size} is smaller than the RAM namespace's size {size}"),
            ));
        }
        let too_large = || Error::new(ErrorKind::Config, "RAM namespace too large");
        let len = usize::try_from(size).map_err(|_| too_large())?;
        let max_len = usize::try_from(max_size).map_err(|_| too_large())?;
        SharedRegion::growable(len, max_len, options)
            .map(|r| Backend::Ram(Arc::new(r)))
            .map_err(|e| Error::new(ErrorKind::Backend, format!("RAM region of {size} bytes (up to {max_size}): {e}")))
    }

    /// The backend's capacity in bytes (`None` for null, which takes its size from config).
    pub fn size(&self) -> Option<u64> {
        match self {
            Backend::Null => None,
            Backend::Ram(r) => Some(r.len() as u64),
            Backend::File(f) => Some(f.size),
        }
    }

    /// Its namespace left its subsystem: a file backend's hold on its file says so (the
    /// file stays open until the commands that may still use it are done).
    pub fn retire(&self) {
        if let Backend::File(f) = self {
            f.retire();
        }
    }

    /// Whether writes need a Flush to become durable (reported as a volatile write cache).
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(_))
    }

    /// Identify Namespace DLFEAT (NVM Command Set 1.0 §4.1.5.1, Figure 97): bits 2:0 = 001b
    /// "a deallocated logical block reads as all zeros", bit 3 "Write Zeroes supports the
    /// Deallocate bit". Null reads zeros and RAM zero-fills, so both are 09h; a file or block
    /// device only where deallocating punches a hole that reads back as zeros, else 00h
    /// (deallocated blocks read as anything: Deallocate is then a no-op, see [`Zeroing`]).
    pub fn dlfeat(&self) -> u8 {
        const READS_ZEROS: u8 = 0b001;
        const WZ_DEALLOCATE: u8 = 1 << 3;
        match self {
            Backend::Null | Backend::Ram(_) => READS_ZEROS | WZ_DEALLOCATE,
            Backend::File(f) if f.zeroing.punch() => READS_ZEROS | WZ_DEALLOCATE,
            Backend::File(_) => 0,
        }
    }
}

/// How a file or block device deallocates and zeroes, decided at open and only ever
/// narrowed afterwards (when the kernel answers `EOPNOTSUPP` to a mode it took before).
///
/// - Deallocate (Dataset Management, Write Zeroes with DEAC) is
///   `fallocate(PUNCH_HOLE | KEEP_SIZE)`, used only where [`punch`](Self::punch) says it
///   reads back as zeros; elsewhere Dataset Management's Deallocate is a no-op (it is
///   advisory) and DLFEAT says nothing is promised.
///   - Regular file: a punched hole reads as zeros (`fallocate(2)`); whether the file
///     system punches at all is probed at open by punching one block beyond the end of
///     the file with KEEP_SIZE, which changes no byte and no size (`EOPNOTSUPP` where
///     unsupported).
///   - Block device: the kernel turns the punch into a Write Zeroes that may unmap and
///     fails it, never writing zeros itself, where the device has no Write Zeroes (Linux
///     `block/fops.c`, `blkdev_fallocate`: `BLKDEV_ZERO_NOFALLBACK`). So it reads back as
///     zeros whenever it succeeds. It is used only when the queue limits in sysfs say the
///     device writes zeroes *and* can deallocate (`write_zeroes_unmap_max_bytes`, or
///     `discard_max_bytes` on kernels without it): a device that can only write zeros
///     would write every deallocated block. A plain discard (`BLKDISCARD`) is never used:
///     it guarantees nothing about what reads return.
/// - Write Zeroes without DEAC keeps the blocks allocated: `fallocate(ZERO_RANGE |
///   KEEP_SIZE)` (a block device falls back to writing zeros in the kernel); where the
///   file system has no ZERO_RANGE (tmpfs), the connection writes a zeroed buffer in
///   bounded chunks instead. With DEAC it punches where that reads as zeros, and zeroes as
///   without DEAC elsewhere.
///
/// Linux nvmet differs (`drivers/nvme/target/io-cmd-file.c`, `io-cmd-bdev.c`,
/// `admin-cmd.c`): it reports DLFEAT 00h, deallocates range by range and stops at the first
/// range out of the namespace after punching the ones before it, and its Write Zeroes is
/// ZERO_RANGE only (no fallback: it fails on tmpfs) or `blkdev_issue_zeroout`. SPDK
/// (`lib/nvmf/ctrlr_bdev.c`) unmaps every range through its bdev layer, counting the
/// completions per request as we do, without checking the ranges first. We check every
/// range before touching any, and promise zeros where the backend keeps the promise so
/// that Linux hosts use Write Zeroes with DEAC (`nvme_update_ns_info_block`).
#[derive(Debug)]
pub struct Zeroing {
    punch: AtomicBool,
    zero_range: AtomicBool,
}

/// One block: the length of the probe punched beyond the end of a regular file.
const PROBE_LEN: u64 = 4096;

impl Zeroing {
    /// Decides what `file` (opened read-write from `path`) supports, without changing it.
    pub fn probe(file: &File, path: &Path) -> Zeroing {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileTypeExt;
        let (punch, why) = match file.metadata() {
            Ok(m) if m.file_type().is_block_device() => bdev_punch_zeroes(&m),
            Ok(m) => {
                // Beyond the end, with KEEP_SIZE: no byte, no block and no size changes. The
                // file systems still stamp the inode modified (ext4, tmpfs): the access and
                // modification times are put back (the change time cannot be).
                let mode = falloc::PUNCH_HOLE | falloc::KEEP_SIZE;
                let punched = uring::fallocate(file.as_raw_fd(), mode, m.len(), PROBE_LEN);
                if let (Ok(accessed), Ok(modified)) = (m.accessed(), m.modified()) {
                    let times = std::fs::FileTimes::new().set_accessed(accessed).set_modified(modified);
                    if let Err(e) = file.set_times(times) {
                        tracing::debug!(path = %path.display(), "cannot restore the file's times after the probe: {e}");
                    }
                }
                match punched {
                    Ok(()) => (true, "the file system punches holes".to_string()),
                    Err(e) => (false, format!("the file system does not punch holes ({e})")),
                }
            }
            Err(e) => (false, format!("cannot stat it ({e})")),
        };
        if punch {
            tracing::info!(path = %path.display(), "{why}: deallocated blocks read as zeros (DLFEAT 001b)");
        } else {
            tracing::info!(
                path = %path.display(),
                "{why}: Dataset Management deallocation is a no-op and DLFEAT promises nothing"
            );
        }
        Zeroing { punch: AtomicBool::new(punch), zero_range: AtomicBool::new(true) }
    }

    /// Whether deallocation punches holes that read back as zeros.
    pub fn punch(&self) -> bool {
        self.punch.load(Ordering::Relaxed)
    }

    /// Whether `fallocate(ZERO_RANGE)` is worth trying (not refused yet).
    pub fn zero_range(&self) -> bool {
        self.zero_range.load(Ordering::Relaxed)
    }

    /// The kernel refused `mode` with `EOPNOTSUPP` (a device whose Write Zeroes was
    /// disabled after an error, a file system that lost a feature): stop using it. DLFEAT
    /// answers 00h from then on if it was the punch.
    pub fn refused(&self, mode: i32, path: &Path) {
        if mode & falloc::PUNCH_HOLE != 0 && self.punch.swap(false, Ordering::Relaxed) {
            tracing::warn!(path = %path.display(), "punching holes is no longer supported: deallocation is a no-op from now on");
        }
        if mode & falloc::ZERO_RANGE != 0 && self.zero_range.swap(false, Ordering::Relaxed) {
            tracing::info!(path = %path.display(), "no fallocate(ZERO_RANGE) here: Write Zeroes writes zeros");
        }
    }
}

/// Whether a punch on the block device of `meta` deallocates and reads back as zeros, from
/// its queue limits (`/sys/dev/block/MAJ:MIN/queue`, or the whole disk's for a partition).
fn bdev_punch_zeroes(meta: &std::fs::Metadata) -> (bool, String) {
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    let dev = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let queue = if dev.join("queue").is_dir() { dev.join("queue") } else { dev.join("../queue") };
    let limit = |name: &str| -> Option<u64> { std::fs::read_to_string(queue.join(name)).ok()?.trim().parse().ok() };
    let (Some(write_zeroes), Some(discard)) = (limit("write_zeroes_max_bytes"), limit("discard_max_bytes")) else {
        return (false, format!("the queue limits of block device {major}:{minor} cannot be read"));
    };
    // Linux 6.17+: whether Write Zeroes may unmap; older kernels: whether it can discard.
    let unmaps = limit("write_zeroes_unmap_max_bytes").is_some_and(|n| n > 0) || discard > 0;
    let why =
        format!("block device {major}:{minor}: write_zeroes_max_bytes {write_zeroes}, discard_max_bytes {discard}");
    (write_zeroes > 0 && unmaps, why)
}

/// How far a RAM namespace of `size` bytes may grow unless its `max_size` says otherwise:
/// the machine's physical memory (a RAM namespace larger than that could not be backed),
/// and never less than `size`. Only address space is reserved for it, no memory.
pub fn default_ram_max_size(size: u64) -> u64 {
    uring::physical_memory().unwrap_or(size).max(size)
}

/// fallocate modes used for Write Zeroes and Deallocate.
pub mod falloc {
    /// FALLOC_FL_KEEP_SIZE.
    pub const KEEP_SIZE: i32 = 0x01;
    /// FALLOC_FL_PUNCH_HOLE.
    pub const PUNCH_HOLE: i32 = 0x02;
    /// FALLOC_FL_ZERO_RANGE.
    pub const ZERO_RANGE: i32 = 0x10;
}

/// An asynchronous operation on a file backend. The file is borrowed for
/// the submission only: the connection that submits keeps the namespace (and
/// so the open file) alive until the operation completes.
#[derive(Debug)]
pub enum FileOp<'a> {
    /// Read `len` bytes at `offset` into `buf[..len]`.
    Read {
        /// The file.
        file: &'a File,
        /// Destination.
        buf: IoBuf,
        /// Bytes.
        len: usize,
        /// File offset.
        offset: u64,
    },
    /// Write `buf[..len]` at `offset`.
    Write {
        /// The file.
        file: &'a File,
        /// Source.
        buf: IoBuf,
        /// Bytes.
        len: usize,
        /// File offset.
        offset: u64,
    },
    /// fdatasync.
    Sync {
        /// The file.
        file: &'a File,
    },
    /// fallocate.
    Fallocate {
        /// The file.
        file: &'a File,
        /// Mode bits ([`falloc`]).
        mode: i32,
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
    },
}

/// Something that executes [`FileOp`]s and later reports their completion
/// to the connection with the same `token` (the reactor's io_uring, or a
/// synchronous executor in tests).
pub trait FileIo {
    /// Starts `op`. On failure the op's buffer (if any) comes back.
    fn submit(&mut self, op: FileOp<'_>, token: u64) -> Result<(), (std::io::Error, Option<IoBuf>)>;
}

/// Executes file operations synchronously with positioned syscalls, queueing
/// their completions for the caller to deliver. Used by tests, fuzzing and the
/// in-process loopback transport.
#[derive(Default)]
pub struct SyncFileIo {
    /// Completed operations: (token, result, buffer).
    pub done: Vec<(u64, std::io::Result<usize>, Option<IoBuf>)>,
}

impl FileIo for SyncFileIo {
    fn submit(&mut self, op: FileOp<'_>, token: u64) -> Result<(), (std::io::Error, Option<IoBuf>)> {
        use std::os::unix::fs::FileExt;
        match op {
            FileOp::Read { file, mut buf, len, offset } => {
                let n = len.min(buf.capacity());
                buf.set_len(n);
                let r = file.read_exact_at(&mut buf[..n], offset).map(|()| n);
                self.done.push((token, r, Some(buf)));
            }
            FileOp::Write { file, buf, len, offset } => {
                let n = len.min(buf.len());
                let r = file.write_all_at(&buf[..n], offset).map(|()| n);
                self.done.push((token, r, Some(buf)));
            }
            FileOp::Sync { file } => self.done.push((token, file.sync_data().map(|()| 0), None)),
            FileOp::Fallocate { file, mode, offset, len } => {
                // The real system call: its refusals (EOPNOTSUPP on tmpfs' ZERO_RANGE, ...)
                // reach the connection, which falls back as it does over the ring.
                use std::os::fd::AsRawFd;
                let r = uring::fallocate(file.as_raw_fd(), mode, offset, len).map(|()| 0);
                self.done.push((token, r, None));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{FileExt, PermissionsExt};

    /// A directory of its own for one test, removed at the end.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("qpath-backend-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }

        /// A file of `len` bytes with a pattern at its start and end.
        fn image(&self, name: &str, len: u64) -> PathBuf {
            let p = self.0.join(name);
            let f = File::create(&p).unwrap();
            f.set_len(len).unwrap();
            f.write_all_at(b"head", 0).unwrap();
            f.write_all_at(b"tail", len - 4).unwrap();
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const MIB: u64 = 1 << 20;
    const OWNER: &str = "namespace 1 of nqn.2026-11.io.qpath:t";

    fn req(path: &Path, size: Option<u64>) -> FileRequest<'_> {
        FileRequest { path, size, grow: false, access: Access::ReadWrite, owner: OWNER }
    }

    fn open(r: &FileRequest<'_>) -> Result<FileBackend, Error> {
        FileBackend::open(r).map(|(b, _)| b)
    }

    fn len(p: &Path) -> u64 {
        std::fs::metadata(p).unwrap().len()
    }

    fn pattern_intact(p: &Path, size: u64) -> bool {
        let f = File::open(p).unwrap();
        let (mut head, mut tail) = ([0u8; 4], [0u8; 4]);
        f.read_exact_at(&mut head, 0).unwrap();
        f.read_exact_at(&mut tail, size - 4).unwrap();
        &head == b"head" && &tail == b"tail"
    }

    #[test]
    fn a_smaller_size_is_refused_and_the_file_is_not_truncated() {
        let d = Dir::new("smaller");
        let img = d.image("vol1.img", 64 * MIB);
        let e = open(&req(&img, Some(16 * MIB))).unwrap_err().to_string();
        assert_eq!(len(&img), 64 * MIB, "the file keeps its size");
        assert!(pattern_intact(&img, 64 * MIB));
        for part in [OWNER, &img.display().to_string(), "is 64 MiB", "size = 16 MiB asks for less", "never shrinks"] {
            assert!(e.contains(part), "{e:?} names {part:?}");
        }
        let e = open(&FileRequest { grow: true, ..req(&img, Some(16 * MIB)) }).unwrap_err().to_string();
        assert!(e.contains("asks for less"), "grow never shrinks: {e}");
        assert_eq!(len(&img), 64 * MIB);
    }

    #[test]
    fn a_larger_size_grows_a_file_only_with_grow() {
        let d = Dir::new("larger");
        let img = d.image("vol1.img", 16 * MIB);
        let e = open(&req(&img, Some(64 * MIB))).unwrap_err().to_string();
        assert!(e.contains("is 16 MiB but size = 64 MiB asks for more") && e.contains("grow = true"), "{e}");
        assert_eq!(len(&img), 16 * MIB, "not grown without grow");
        let b = open(&FileRequest { grow: true, ..req(&img, Some(64 * MIB)) }).unwrap();
        assert_eq!((b.size, len(&img)), (64 * MIB, 64 * MIB), "grown to size");
        assert!(pattern_intact(&img, 16 * MIB), "growing keeps the data");
    }

    #[test]
    fn an_equal_size_or_none_uses_the_file_as_it_is() {
        let d = Dir::new("equal");
        let img = d.image("vol1.img", 8 * MIB);
        let (b, created) = FileBackend::open(&req(&img, Some(8 * MIB))).unwrap();
        assert!(created.is_none(), "an existing file is not new");
        assert_eq!(b.size, 8 * MIB);
        drop(b);
        assert_eq!(open(&req(&img, None)).unwrap().size, 8 * MIB, "no size: the file's own");
        assert!(pattern_intact(&img, 8 * MIB));
        let empty = d.0.join("empty.img");
        File::create(&empty).unwrap();
        let e = open(&req(&empty, None)).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        assert!(open(&req(&img, Some(0))).unwrap_err().to_string().contains("size = 0"));
    }

    #[test]
    fn a_new_file_needs_a_size_and_is_created_exclusively() {
        let d = Dir::new("new");
        let img = d.0.join("new.img");
        let e = open(&req(&img, None)).unwrap_err().to_string();
        assert!(e.contains("does not exist; give size to create it") && e.contains(OWNER), "{e}");
        assert!(!img.exists(), "nothing created without a size");
        let e = open(&FileRequest { access: Access::ReadOnly, ..req(&img, Some(MIB)) }).unwrap_err().to_string();
        assert!(e.contains("readonly namespace never creates"), "{e}");
        assert!(!img.exists());
        let (b, created) = FileBackend::open(&req(&img, Some(4 * MIB))).unwrap();
        assert_eq!(created.as_ref().map(NewFile::path), Some(img.as_path()));
        assert_eq!((b.size, len(&img)), (4 * MIB, 4 * MIB));
        assert_eq!(std::fs::metadata(&img).unwrap().permissions().mode() & 0o777, 0o600, "a disk is private");
        // Created with O_CREAT | O_EXCL: a name that exists (even as a dangling link) is
        // never created over.
        let link = d.0.join("link.img");
        std::os::unix::fs::symlink(d.0.join("nowhere"), &link).unwrap();
        let e = open(&req(&link, Some(MIB))).unwrap_err().to_string();
        assert!(e.contains("appeared while qpath was about to create it"), "{e}");
        assert!(!d.0.join("nowhere").exists(), "the link's target is not created");
        // A creation that fails after the file exists (here: a length no file can have)
        // leaves nothing behind.
        let huge = d.0.join("huge.img");
        assert!(open(&req(&huge, Some(1 << 63))).is_err());
        assert!(!huge.exists(), "the file this open created is removed with its failure");
    }

    /// The access mode of an fd, from the kernel's own account of it.
    fn fd_access_mode(f: &File) -> i32 {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).unwrap();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap().trim();
        i32::from_str_radix(flags, 8).unwrap() & libc::O_ACCMODE
    }

    #[test]
    fn readonly_opens_the_file_read_only() {
        let d = Dir::new("readonly");
        let img = d.image("ro.img", MIB);
        let ro = open(&FileRequest { access: Access::ReadOnly, ..req(&img, None) }).unwrap();
        assert_eq!(fd_access_mode(ro.file()), libc::O_RDONLY, "O_RDONLY");
        assert_eq!(ro.access, Access::ReadOnly);
        assert!(ro.file().write_all_at(b"x", 0).is_err(), "the target cannot write it");
        assert!(pattern_intact(&img, MIB));
        let rw = d.image("rw.img", MIB);
        assert_eq!(fd_access_mode(open(&req(&rw, None)).unwrap().file()), libc::O_RDWR);
        let e = open(&FileRequest { access: Access::ReadOnly, grow: true, ..req(&img, Some(2 * MIB)) })
            .unwrap_err()
            .to_string();
        assert!(e.contains("readonly namespace never changes its file"), "{e}");
        assert_eq!(len(&img), MIB);
    }

    /// A file closed and unlinked frees its inode number before its table entry goes; a new
    /// file that gets the number is not refused for that entry (nobody holds its lock).
    #[test]
    fn a_stale_entry_of_a_reused_inode_number_does_not_refuse_a_new_file() {
        let d = Dir::new("stale-entry");
        let img = d.image("new.img", MIB);
        let meta = std::fs::metadata(&img).unwrap();
        let key = FileKey::of(&meta, Kind::Regular);
        held().push(Held {
            id: u64::MAX,
            key,
            owner: "namespace 9 of nqn.gone".into(),
            access: Access::ReadWrite,
            retired: false,
        });
        let b = open(&req(&img, None)).expect("the stale entry is not a holder");
        assert_eq!(held().iter().filter(|h| h.key == key).count(), 1, "the stale entry replaced");
        // A real holder (the lock is held) is still refused.
        let e = open(&req(&img, None)).unwrap_err().to_string();
        assert!(e.contains("already used by namespace 1"), "{e}");
        drop(b);
    }

    #[test]
    fn one_file_backs_one_namespace_unless_both_are_readonly() {
        let d = Dir::new("lock");
        let img = d.image("shared.img", MIB);
        let first = open(&req(&img, None)).unwrap();
        let second = FileRequest { owner: "namespace 2 of nqn.2026-11.io.qpath:u", ..req(&img, None) };
        let e = open(&second).unwrap_err().to_string();
        assert!(e.starts_with("namespace 2 of nqn.2026-11.io.qpath:u: "), "{e}");
        assert!(e.contains(&format!("is already used by {OWNER} of this target")), "names the holder: {e}");
        let ro = FileRequest { access: Access::ReadOnly, ..second };
        assert!(open(&ro).is_err(), "a readonly namespace cannot share a writable one's file");
        first.retire();
        let e = open(&second).unwrap_err().to_string();
        assert!(e.contains("(removed; open until its last command is done)"), "{e}");
        drop(first);
        let a = open(&ro).unwrap();
        let b = open(&FileRequest { owner: "namespace 3 of nqn.2026-11.io.qpath:u", ..ro }).unwrap();
        assert_eq!((a.size, b.size), (MIB, MIB), "readonly namespaces share");
        let e = open(&second).unwrap_err().to_string();
        assert!(e.contains("already used by namespace 2 of nqn.2026-11.io.qpath:u"), "{e}");
    }

    #[test]
    fn the_hold_goes_with_the_backend() {
        let d = Dir::new("release");
        let img = d.image("a.img", MIB);
        let key = FileKey::of(&std::fs::metadata(&img).unwrap(), Kind::Regular);
        let b = open(&req(&img, None)).unwrap();
        assert_eq!(held_by(key, Access::ReadOnly).as_deref(), Some(OWNER));
        drop(b);
        assert_eq!(held_by(key, Access::ReadWrite), None, "the table entry went with the backend");
        let f = File::open(&img).unwrap();
        assert_eq!(uring::file_lock_holder(f.as_raw_fd(), FileLock::Exclusive).unwrap(), None, "and the lock");
        open(&req(&img, None)).unwrap();
    }

    #[test]
    fn a_lock_held_elsewhere_is_refused_naming_its_process() {
        let d = Dir::new("elsewhere");
        let img = d.image("a.img", MIB);
        // Another holder of an open-file-description lock, outside the table: as another
        // qpath process would be. /proc/PID/fdinfo names the holder (this process here).
        let other = OpenOptions::new().read(true).write(true).open(&img).unwrap();
        uring::try_lock_file(other.as_raw_fd(), FileLock::Shared).unwrap();
        let e = open(&req(&img, None)).unwrap_err().to_string();
        let me = std::process::id();
        assert!(e.contains(&format!("is locked by process {me} (")), "{e}");
        let ro = open(&FileRequest { access: Access::ReadOnly, ..req(&img, None) }).unwrap();
        drop((other, ro));
        open(&req(&img, None)).unwrap();
    }

    #[test]
    fn only_files_and_block_devices() {
        let d = Dir::new("kinds");
        let e = open(&req(&d.0, None)).unwrap_err().to_string();
        assert!(e.contains("neither a regular file nor a block device"), "{e}");
        let e = open(&req(Path::new("/dev/null"), Some(MIB))).unwrap_err().to_string();
        assert!(e.contains("neither a regular file nor a block device"), "{e}");
        assert!(open(&FileRequest { grow: true, ..req(&d.0.join("x"), None) }).is_err(), "grow needs a size");
    }

    #[test]
    fn new_files_are_removed_unless_kept() {
        let d = Dir::new("newfiles");
        let (a, b) = (d.0.join("a.img"), d.0.join("b.img"));
        let mut new = NewFiles::default();
        for p in [&a, &b] {
            let (backend, created) = FileBackend::open(&req(p, Some(MIB))).unwrap();
            new.push(created.unwrap());
            drop(backend);
        }
        drop(new);
        assert!(!a.exists() && !b.exists(), "a failed start leaves no file it created");
        let mut new = NewFiles::default();
        let (_backend, created) = FileBackend::open(&req(&a, Some(MIB))).unwrap();
        new.push(created.unwrap());
        // The path now names another file: that one is not the start's to remove.
        std::fs::remove_file(&a).unwrap();
        File::create(&a).unwrap().write_all(b"someone else's").unwrap();
        drop(new);
        assert!(a.exists(), "only the file created is removed");
        let mut new = NewFiles::default();
        let (_backend, created) = FileBackend::open(&req(&b, Some(MIB))).unwrap();
        new.push(created.unwrap());
        new.keep();
        assert!(b.exists(), "kept");
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human(64 * MIB), "64 MiB");
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536), "1536 bytes");
        assert_eq!(human(3 << 10), "3 KiB");
    }
}
