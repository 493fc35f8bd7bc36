//! The I/O unit (fio's `io_u`) and its aligned buffer.
//!
//! A job thread allocates `iodepth` units with their buffers once, before the first
//! I/O, and keeps them in one table by index: the engine is handed a unit to start and
//! completes it in place, so the per-I/O path allocates and moves no unit. Buffers are
//! `Vec<u8>` over-allocated and sliced at an aligned start, which keeps O_DIRECT happy
//! without `unsafe`; the heap block does not move, so an engine may hand its address to
//! the kernel (the io_uring and NVMe/TCP engines install `uring::IoBuf`s instead, which
//! move into the ring or the host and back: [`crate::engine::uring_buf`]).

use std::fmt;
use std::time::Instant;

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

/// Memory an engine provides for a unit's data, installed once in
/// [`Engine::prepare`](crate::engine::Engine::prepare) with [`IoBuf::foreign`].
///
/// This lets an engine use its own buffer type (the `uring` crate's `IoBuf`, which its
/// ring takes by value; a host's registered memory) without copying or allocating per
/// I/O: the engine reaches its type with [`IoBuf::downcast_mut`], may move the inner
/// buffer out while the I/O is in flight (e.g. keep an `Option<uring::IoBuf>` inside),
/// and must put it back before returning the unit.
pub trait ForeignBuf: std::any::Any + Send {
    /// The whole buffer.
    fn bytes(&self) -> &[u8];
    /// The whole buffer, mutably.
    fn bytes_mut(&mut self) -> &mut [u8];
}

enum Storage {
    /// Over-allocated vector; the usable part starts at `start`.
    Owned { storage: Vec<u8>, start: usize },
    /// Engine-provided memory.
    Foreign(Box<dyn ForeignBuf>),
}

/// A unit's data buffer: an aligned heap block (the default) or engine-provided memory.
pub struct IoBuf {
    storage: Storage,
    len: usize,
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.storage {
            Storage::Owned { .. } => "owned",
            Storage::Foreign(_) => "foreign",
        };
        f.debug_struct("IoBuf").field("kind", &kind).field("len", &self.len).finish()
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
        IoBuf { storage: Storage::Owned { storage, start }, len }
    }

    /// Wrap engine-provided memory; the usable length is `buf.bytes().len()`.
    pub fn foreign(buf: Box<dyn ForeignBuf>) -> IoBuf {
        let len = buf.bytes().len();
        IoBuf { storage: Storage::Foreign(buf), len }
    }

    /// The engine's own buffer type, if this is a foreign buffer of type `T`.
    pub fn downcast_mut<T: ForeignBuf>(&mut self) -> Option<&mut T> {
        match &mut self.storage {
            Storage::Foreign(b) => {
                let any: &mut dyn std::any::Any = &mut **b;
                any.downcast_mut::<T>()
            }
            Storage::Owned { .. } => None,
        }
    }

    /// Shared access to the engine's own buffer type.
    pub fn downcast_ref<T: ForeignBuf>(&self) -> Option<&T> {
        match &self.storage {
            Storage::Foreign(b) => {
                let any: &dyn std::any::Any = &**b;
                any.downcast_ref::<T>()
            }
            Storage::Owned { .. } => None,
        }
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
        match &self.storage {
            Storage::Owned { storage, start } => &storage[*start..*start + self.len],
            Storage::Foreign(b) => b.bytes(),
        }
    }

    /// The usable bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Owned { storage, start } => &mut storage[*start..*start + self.len],
            Storage::Foreign(b) => b.bytes_mut(),
        }
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
/// sets `result` (and may use `engine_data`) when the I/O completes.
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
    /// When the job loop last prepared the unit (fio's `start_time`, slat's start): an
    /// engine whose stack stamps submissions may take it instead of reading the clock.
    pub prepared: Instant,
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
            prepared: Instant::now(),
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

    struct EngineBuf(Option<Vec<u8>>);
    impl ForeignBuf for EngineBuf {
        fn bytes(&self) -> &[u8] {
            self.0.as_deref().unwrap_or(&[])
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            self.0.as_deref_mut().unwrap_or(&mut [])
        }
    }

    #[test]
    fn engines_can_install_and_lend_their_own_buffers() {
        let mut io = IoU::new(0, 4096, 4096);
        io.buf = IoBuf::foreign(Box::new(EngineBuf(Some(vec![1u8; 8192]))));
        assert_eq!(io.buf.len(), 8192);
        io.len = 16;
        assert_eq!(io.data(), &[1u8; 16]);
        // Lend the inner buffer out (as to a ring) and put it back: no allocation.
        let inner = io.buf.downcast_mut::<EngineBuf>().unwrap().0.take().unwrap();
        assert_eq!(inner.len(), 8192);
        io.buf.downcast_mut::<EngineBuf>().unwrap().0 = Some(inner);
        assert!(io.buf.downcast_ref::<EngineBuf>().is_some());
        assert!(IoBuf::new(64, 1).downcast_ref::<EngineBuf>().is_none());
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
