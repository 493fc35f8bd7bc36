//! The I/O unit (fio's `io_u`) and its aligned buffer.
//!
//! A job thread allocates `iodepth` units with their buffers once, before the first
//! I/O; queueing moves a unit into the engine and completion moves it back, so the
//! per-I/O path allocates nothing. Buffers are `Vec<u8>` over-allocated and sliced at
//! an aligned start, which keeps O_DIRECT happy without `unsafe`; the heap block does
//! not move while the unit travels, so an engine may hand its address to the kernel
//! (the io_uring engine does that inside the `uring` crate).

use std::fmt;

/// Data direction of an I/O unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ddir {
    /// Read `len` bytes at `offset` into the buffer.
    Read,
    /// Write `len` bytes from the buffer at `offset`.
    Write,
    /// Flush (fio's `fsync=N`); `offset` and `len` are 0.
    Sync,
}

impl Ddir {
    /// Index into `[read, write]` statistics arrays; `None` for [`Ddir::Sync`].
    pub fn rw_index(self) -> Option<usize> {
        match self {
            Ddir::Read => Some(0),
            Ddir::Write => Some(1),
            Ddir::Sync => None,
        }
    }
}

/// Why an I/O failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoError {
    /// An OS error number (`errno`).
    Os(i32),
    /// An NVMe completion status (status code type, status code).
    Nvme {
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
    },
    /// A transport or engine failure without a finer code.
    Failed(&'static str),
}

impl IoError {
    /// The `errno`-like number fio would report for this error (`err=` in the text
    /// report). NVMe errors map to EIO (5) as the Linux host does.
    pub fn errno(self) -> i32 {
        match self {
            IoError::Os(e) => e,
            IoError::Nvme { .. } | IoError::Failed(_) => 5,
        }
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoError::Os(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
            IoError::Nvme { sct, sc } => write!(f, "NVMe status sct={sct:#x} sc={sc:#x}"),
            IoError::Failed(why) => f.write_str(why),
        }
    }
}

/// What happened to an I/O unit; the engine sets it before handing the unit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoResult {
    /// Not completed yet.
    Pending,
    /// Completed; `bytes` moved (less than `len` is a short I/O).
    Done {
        /// Bytes transferred.
        bytes: u32,
    },
    /// Failed.
    Error(IoError),
}

/// A heap buffer whose usable part starts at an aligned address.
pub struct IoBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("addr", &self.as_ptr()).field("len", &self.len).finish()
    }
}

impl IoBuf {
    /// A zeroed buffer of `len` bytes starting at a multiple of `align` (a power of two).
    pub fn new(len: usize, align: usize) -> IoBuf {
        let align = align.max(1);
        assert!(align.is_power_of_two(), "buffer alignment {align} must be a power of two");
        let storage = vec![0u8; len + align];
        let addr = storage.as_ptr() as usize;
        let start = (align - addr % align) % align;
        IoBuf { storage, start, len }
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The usable bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The usable bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }

    /// Address of the first usable byte (stable for the buffer's life).
    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }

    /// Mutable address of the first usable byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
}

/// One I/O unit. The runner fills `ddir`, `offset`, `len` and the buffer; the engine
/// sets `result` (and may use `engine_data`) and returns the unit on completion.
#[derive(Debug)]
pub struct IoU {
    /// Slot number in the job's pool, `0..iodepth`; stable for the unit's life.
    pub index: u32,
    /// Direction.
    pub ddir: Ddir,
    /// Byte offset on the target.
    pub offset: u64,
    /// Transfer length in bytes (at most `buf.len()`).
    pub len: u32,
    /// The data buffer.
    pub buf: IoBuf,
    /// Set by the engine at completion.
    pub result: IoResult,
    /// Free for the engine (a command id, a registered-buffer index...).
    pub engine_data: u64,
}

impl IoU {
    /// A unit with a buffer of `buf_len` bytes aligned to `align`.
    pub fn new(index: u32, buf_len: usize, align: usize) -> IoU {
        IoU {
            index,
            ddir: Ddir::Read,
            offset: 0,
            len: 0,
            buf: IoBuf::new(buf_len, align),
            result: IoResult::Pending,
            engine_data: 0,
        }
    }

    /// The bytes this I/O transfers (`buf[..len]`).
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len as usize]
    }

    /// The bytes this I/O transfers, mutably.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len as usize;
        &mut self.buf.as_mut_slice()[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned() {
        for align in [1, 512, 4096, 65536] {
            let b = IoBuf::new(8192, align);
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!(b.len(), 8192);
        }
    }

    #[test]
    fn buffer_address_survives_a_move() {
        let io = IoU::new(3, 4096, 4096);
        let addr = io.buf.as_ptr();
        let moved = [io];
        assert_eq!(moved[0].buf.as_ptr(), addr);
    }

    #[test]
    fn data_is_the_first_len_bytes() {
        let mut io = IoU::new(0, 4096, 512);
        io.len = 512;
        io.data_mut().fill(7);
        assert_eq!(io.data().len(), 512);
        assert_eq!(io.buf.as_slice()[512], 0);
    }
}
