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
//! The null and RAM backends complete inline; the file backend hands an
//! [`FileOp`] to the reactor and completes later.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        Ok(FileBackend { file, path: path.to_path_buf(), direct, size })
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

    /// Whether writes need a Flush to become durable (reported as a volatile write cache).
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(_))
    }

    /// Whether data buffers must be page aligned (O_DIRECT).
    pub fn needs_alignment(&self) -> bool {
        matches!(self, Backend::File(f) if f.direct)
    }
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
            FileOp::Fallocate { file, len, offset, .. } => {
                // Portable fallback: write zeros.
                let zeros = [0u8; 4096];
                let mut r = Ok(0);
                let mut done = 0u64;
                while done < len && r.is_ok() {
                    let n = (len - done).min(zeros.len() as u64);
                    r = file.write_all_at(&zeros[..usize::try_from(n).unwrap_or(0)], offset + done).map(|()| 0);
                    done += n;
                }
                self.done.push((token, r, None));
            }
        }
        Ok(())
    }
}
