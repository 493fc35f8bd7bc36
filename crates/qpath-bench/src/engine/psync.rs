//! The local synchronous engines: `psync` (`pread`/`pwrite`) and `sync`
//! (`lseek` + `read`/`write`), as fio's engines of the same names.
//!
//! Both finish each I/O inside `queue`, so `iodepth` has no effect with them (fio
//! warns the same way). `direct=1` opens with `O_DIRECT`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::time::Duration;

use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued};
use crate::error::{Error, ErrorKind, Result};
use crate::io_u::{Ddir, IoError, IoResult, IoU};

/// How many times an I/O interrupted by a signal is retried.
const EINTR_RETRIES: u32 = 8;

/// Which system calls to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `pread`/`pwrite`.
    Positional,
    /// `lseek` then `read`/`write`.
    SeekThenIo,
}

/// Factory for `pread`/`pwrite` engines (`ioengine=psync`).
#[derive(Debug)]
pub struct PsyncFactory;

/// Factory for `lseek` + `read`/`write` engines (`ioengine=sync`).
#[derive(Debug)]
pub struct SyncFactory;

impl EngineFactory for PsyncFactory {
    fn name(&self) -> &str {
        "psync"
    }
    fn create(&self, _ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        Ok(Box::new(LocalSync { mode: Mode::Positional, file: None }))
    }
}

impl EngineFactory for SyncFactory {
    fn name(&self) -> &str {
        "sync"
    }
    fn create(&self, _ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        Ok(Box::new(LocalSync { mode: Mode::SeekThenIo, file: None }))
    }
}

/// A synchronous engine over a local file or block device.
#[derive(Debug)]
struct LocalSync {
    mode: Mode,
    file: Option<File>,
}

fn os_err(e: &std::io::Error) -> IoError {
    IoError::Os(e.raw_os_error().unwrap_or(5))
}

impl LocalSync {
    fn do_io(&self, unit: &mut IoU) -> IoResult {
        let Some(file) = self.file.as_ref() else {
            return IoResult::Error(IoError::Failed("engine not open"));
        };
        let offset = unit.offset;
        let ddir = unit.ddir;
        let mode = self.mode;
        if ddir == Ddir::Sync {
            return match file.sync_all() {
                Ok(()) => IoResult::Done { bytes: 0 },
                Err(e) => IoResult::Error(os_err(&e)),
            };
        }
        let mut tries = 0;
        loop {
            let r = match (mode, ddir) {
                (Mode::Positional, Ddir::Read) => file.read_at(unit.data_mut(), offset),
                (Mode::Positional, _) => file.write_at(unit.data(), offset),
                (Mode::SeekThenIo, d) => {
                    let mut f = file;
                    f.seek(SeekFrom::Start(offset))
                        .and_then(|_| if d == Ddir::Read { f.read(unit.data_mut()) } else { f.write(unit.data()) })
                }
            };
            match r {
                Ok(n) => {
                    return IoResult::Done { bytes: u32::try_from(n).unwrap_or(u32::MAX) };
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted && tries < EINTR_RETRIES => tries += 1,
                Err(e) => return IoResult::Error(os_err(&e)),
            }
        }
    }
}

impl Engine for LocalSync {
    fn name(&self) -> &str {
        match self.mode {
            Mode::Positional => "psync",
            Mode::SeekThenIo => "sync",
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { sync: true, buf_align: 1, polled: false, max_depth: 0, flush: true }
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let (file, info) = open_local(self.name(), ctx)?;
        self.file = Some(file);
        Ok(info)
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        unit.result = self.do_io(unit);
        Queued::Completed
    }

    fn getevents(&mut self, _units: &mut [IoU], _min: usize, _max: usize, _timeout: Option<Duration>) -> Result<usize> {
        Ok(0)
    }

    fn event(&mut self, index: usize) -> u32 {
        panic!("{}: event({index}) called on a synchronous engine, which never queues", self.name());
    }

    fn close(&mut self) -> Result<()> {
        self.file = None;
        Ok(())
    }
}

/// Open a job's local file or block device as the local engines do: read-write if the
/// job writes, `O_DIRECT` for `direct=1`; the size of a block device is where seeking
/// to its end lands.
pub(crate) fn open_local(engine: &str, ctx: &EngineCtx<'_>) -> Result<(File, FileInfo)> {
    let path = ctx.target.local_path().ok_or_else(|| {
        Error::new(ErrorKind::Engine, format!("{engine}: needs a local filename, not '{}'", ctx.target.raw))
    })?;
    let mut opts = OpenOptions::new();
    opts.read(true);
    if ctx.job.writes() {
        opts.write(true);
    }
    if ctx.job.direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path).map_err(|e| Error::io(format!("{engine}: open {}", path.display()), e))?;
    let meta = file.metadata().map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    let size = if meta.file_type().is_block_device() {
        let mut f = &file;
        f.seek(SeekFrom::End(0)).map_err(|e| Error::io(format!("size of {}", path.display()), e))?
    } else {
        meta.len()
    };
    Ok((file, FileInfo { size, block_size: 512 }))
}
