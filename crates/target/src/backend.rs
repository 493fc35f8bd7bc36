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
//!   write durable.
//!
//! Deallocation and zeroes ([`Zeroing`]): null reads zeros and RAM zero-fills, so both
//! report deallocated blocks as reading zeros (DLFEAT 001b). A file or block device does
//! only where `fallocate(PUNCH_HOLE)` guarantees it, which is probed at open.
//!
//! The null and RAM backends complete inline; the file backend hands an
//! [`FileOp`] to the reactor and completes later.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use uring::{IoBuf, RegionOptions, SharedRegion};

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

/// A file-backed namespace.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    /// Path, for reports.
    pub path: PathBuf,
    /// Whether the file is open with O_DIRECT.
    pub direct: bool,
    /// Size in bytes.
    pub size: u64,
    /// What deallocation and zeroing can use on it.
    pub zeroing: Zeroing,
}

impl FileBackend {
    /// Opens (creating if asked) `path`; `size` resizes a regular file when
    /// given, otherwise the file's or device's own size is used.
    pub fn open(path: &Path, size: Option<u64>, create: bool) -> Result<FileBackend, Error> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true).create(create);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        // O_DIRECT is refused (EINVAL) by tmpfs and some others: fall back to buffered I/O.
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(false).map_err(|e| io_err(path, e))?, false),
            Err(e) => return Err(io_err(path, e)),
        };
        let meta = file.metadata().map_err(|e| io_err(path, e))?;
        let size = if meta.file_type().is_file() {
            if let Some(want) = size {
                if meta.len() != want {
                    file.set_len(want).map_err(|e| io_err(path, e))?;
                }
                want
            } else {
                meta.len()
            }
        } else {
            // Block device: its size is where seeking to the end lands.
            use std::io::Seek;
            let mut f = &file;
            f.seek(std::io::SeekFrom::End(0)).map_err(|e| io_err(path, e))?
        };
        if size == 0 {
            return Err(Error::new(ErrorKind::Config, format!("{}: size is 0 (give a size)", path.display())));
        }
        let zeroing = Zeroing::probe(&file, path);
        Ok(FileBackend { file, path: path.to_path_buf(), direct, size, zeroing })
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Synchronous flush, for shutdown paths.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Backend, format!("{}: {e}", path.display()))
}

impl Backend {
    /// A RAM backend of `size` bytes.
    pub fn ram(size: u64) -> Result<Backend, Error> {
        Backend::ram_with(size, RegionOptions::default())
    }

    /// A RAM backend of `size` bytes mapped with `options` (e.g. pre-faulted).
    pub fn ram_with(size: u64, options: RegionOptions) -> Result<Backend, Error> {
        let len = usize::try_from(size).map_err(|_| Error::new(ErrorKind::Config, "RAM namespace too large"))?;
        SharedRegion::with_options(len, options)
            .map(|r| Backend::Ram(Arc::new(r)))
            .map_err(|e| Error::new(ErrorKind::Backend, format!("RAM region of {size} bytes: {e}")))
    }

    /// The backend's capacity in bytes (`None` for null, which takes its size from config).
    pub fn size(&self) -> Option<u64> {
        match self {
            Backend::Null => None,
            Backend::Ram(r) => Some(r.len() as u64),
            Backend::File(f) => Some(f.size),
        }
    }

    /// Whether writes need a Flush to become durable (reported as a volatile write cache).
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(_))
    }

    /// Whether data buffers must be page aligned (O_DIRECT).
    pub fn needs_alignment(&self) -> bool {
        matches!(self, Backend::File(f) if f.direct)
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
