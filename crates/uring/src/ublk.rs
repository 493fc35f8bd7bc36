//! Linux ublk, the user space block driver (`drivers/block/ublk_drv.c`, Linux 6.0+;
//! ABI in `include/uapi/linux/ublk_cmd.h`): the kernel side of a `/dev/ublkbN` whose I/O a
//! process serves through io_uring `URING_CMD`s on `/dev/ublkcN`.
//!
//! ```text
//!   Control (/dev/ublk-control, its own SQE128 ring, blocking):
//!     ADD_DEV ─► SET_PARAMS ─► [queues fetch] ─► START_DEV ... STOP_DEV ─► DEL_DEV
//!     (after the server died: START_USER_RECOVERY ─► [queues fetch] ─► END_USER_RECOVERY)
//!   CharDev (/dev/ublkcN, opened once per server process)
//!     map_queue(q) ─► Descriptors: the kernel's per-tag I/O descriptors, read-only
//!   Ring::ublk_fetch / ublk_commit_and_fetch (on the queue thread's own ring):
//!     FETCH(tag, buffer) ... CQE: a request is in Descriptors[tag], a write's data in the
//!     buffer ─► serve it ─► COMMIT_AND_FETCH(tag, result, buffer): a read's data is copied
//!     out of the buffer, and the tag waits for its next request
//! ```
//!
//! Memory: each tag's buffer is an [`IoBuf`](crate::IoBuf) owned by the ring's op slot for as long as
//! its FETCH or COMMIT_AND_FETCH is in flight; the kernel copies a write's data into it
//! before the CQE and a read's data out of it while the commit is submitted, both while
//! the op owns it. The buffer must hold `max_io_buf_bytes` of the device: checked at
//! submission. Control commands point the kernel at a heap buffer that stays alive until
//! their CQE; one whose wait times out leaks its buffer rather than free memory the kernel
//! may still write.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::error::{Error, ErrorKind};

/// The control device.
pub const CONTROL_PATH: &str = "/dev/ublk-control";
/// Most tags of one queue (`UBLK_MAX_QUEUE_DEPTH`).
pub const QUEUE_DEPTH_MAX: u16 = 4096;
/// Largest buffer one I/O may use (`1 << UBLK_IO_BUF_BITS`: 32 MiB).
pub const IO_BUF_BYTES_MAX: u32 = 1 << 25;
/// Bytes of one I/O descriptor (`struct ublksrv_io_desc`).
pub const IO_DESC_SIZE: usize = 24;

const IOC_READ: u32 = 2;
const IOC_RW: u32 = 3;
/// `struct ublksrv_ctrl_cmd`.
const CTRL_CMD_SIZE: u32 = 32;
/// `struct ublksrv_io_cmd`.
const IO_CMD_SIZE: u32 = 16;

/// `_IOC(dir, 'u', nr, size)`.
const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | ((b'u' as u32) << 8) | nr
}

/// Control command opcodes (ioctl-encoded; legacy plain numbers are not used).
pub mod cmd {
    use super::{CTRL_CMD_SIZE, IO_CMD_SIZE, IOC_READ, IOC_RW, ioc};
    /// `UBLK_U_CMD_GET_DEV_INFO`.
    pub const GET_DEV_INFO: u32 = ioc(IOC_READ, 0x02, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_ADD_DEV`.
    pub const ADD_DEV: u32 = ioc(IOC_RW, 0x04, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_DEL_DEV`.
    pub const DEL_DEV: u32 = ioc(IOC_RW, 0x05, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_START_DEV`.
    pub const START_DEV: u32 = ioc(IOC_RW, 0x06, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_STOP_DEV`.
    pub const STOP_DEV: u32 = ioc(IOC_RW, 0x07, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_SET_PARAMS`.
    pub const SET_PARAMS: u32 = ioc(IOC_RW, 0x08, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_GET_PARAMS`.
    pub const GET_PARAMS: u32 = ioc(IOC_READ, 0x09, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_START_USER_RECOVERY`.
    pub const START_USER_RECOVERY: u32 = ioc(IOC_RW, 0x10, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_END_USER_RECOVERY`.
    pub const END_USER_RECOVERY: u32 = ioc(IOC_RW, 0x11, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_GET_FEATURES`.
    pub const GET_FEATURES: u32 = ioc(IOC_READ, 0x13, CTRL_CMD_SIZE);
    /// `UBLK_U_CMD_UPDATE_SIZE` (Linux 6.16+, offered when GET_FEATURES has
    /// [`super::flags::UPDATE_SIZE`]): the disk's new capacity, sectors in `data[0]`.
    pub const UPDATE_SIZE: u32 = ioc(IOC_RW, 0x15, CTRL_CMD_SIZE);
    /// `UBLK_U_IO_FETCH_REQ`.
    pub const FETCH_REQ: u32 = ioc(IOC_RW, 0x20, IO_CMD_SIZE);
    /// `UBLK_U_IO_COMMIT_AND_FETCH_REQ`.
    pub const COMMIT_AND_FETCH_REQ: u32 = ioc(IOC_RW, 0x21, IO_CMD_SIZE);
}

/// Device feature flags (`UBLK_F_*`).
pub mod flags {
    /// `UBLK_F_URING_CMD_COMP_IN_TASK`.
    pub const URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
    /// `UBLK_F_USER_RECOVERY`: the device survives its server; a new one re-attaches.
    pub const USER_RECOVERY: u64 = 1 << 3;
    /// `UBLK_F_USER_RECOVERY_REISSUE`: requests the dead server held are issued again.
    pub const USER_RECOVERY_REISSUE: u64 = 1 << 4;
    /// `UBLK_F_CMD_IOCTL_ENCODE`.
    pub const CMD_IOCTL_ENCODE: u64 = 1 << 6;
    /// `UBLK_F_UPDATE_SIZE`: a feature of the driver, not of a device (GET_FEATURES says
    /// whether [`super::cmd::UPDATE_SIZE`] exists; ADD_DEV need not ask for it).
    pub const UPDATE_SIZE: u64 = 1 << 10;
}

/// Device states (`UBLK_S_DEV_*`).
pub mod state {
    /// No disk.
    pub const DEAD: u16 = 0;
    /// Serving.
    pub const LIVE: u16 = 1;
    /// The server died; I/O waits for a new one (user recovery).
    pub const QUIESCED: u16 = 2;
    /// The server died; I/O fails until a new one attaches.
    pub const FAIL_IO: u16 = 3;
}

/// Request operations (`UBLK_IO_OP_*`).
pub mod op {
    /// Read.
    pub const READ: u8 = 0;
    /// Write.
    pub const WRITE: u8 = 1;
    /// Flush the volatile cache.
    pub const FLUSH: u8 = 2;
    /// Discard.
    pub const DISCARD: u8 = 3;
    /// Write same (never sent to a device without it).
    pub const WRITE_SAME: u8 = 4;
    /// Write zeroes.
    pub const WRITE_ZEROES: u8 = 5;
}

/// Request flags (`UBLK_IO_F_*`, bits 8..31 of `op_flags`).
pub mod io_flags {
    /// Force unit access.
    pub const FUA: u32 = 1 << 13;
    /// Write zeroes must not deallocate.
    pub const NOUNMAP: u32 = 1 << 15;
}

/// Basic parameter attributes (`UBLK_ATTR_*`).
pub mod attr {
    /// Read-only disk.
    pub const READ_ONLY: u32 = 1 << 0;
    /// Rotational medium.
    pub const ROTATIONAL: u32 = 1 << 1;
    /// A volatile write cache: flushes are sent.
    pub const VOLATILE_CACHE: u32 = 1 << 2;
    /// Writes may carry FUA.
    pub const FUA: u32 = 1 << 3;
}

const PARAM_BASIC: u32 = 1 << 0;
const PARAM_DISCARD: u32 = 1 << 1;
const PARAM_DEVT: u32 = 1 << 2;

/// `struct ublksrv_ctrl_dev_info` (64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    /// Hardware queues.
    pub nr_hw_queues: u16,
    /// Tags per queue.
    pub queue_depth: u16,
    /// [`state`].
    pub state: u16,
    /// Largest buffer one request uses.
    pub max_io_buf_bytes: u32,
    /// Device number (`u32::MAX` in ADD_DEV: the kernel picks).
    pub dev_id: u32,
    /// The serving process, -1 when none.
    pub ublksrv_pid: i32,
    /// [`flags`].
    pub flags: u64,
    /// For the server's own use; the driver keeps it.
    pub ublksrv_flags: u64,
    /// Owner, stored by the kernel.
    pub owner_uid: u32,
    /// Owner group, stored by the kernel.
    pub owner_gid: u32,
}

impl DevInfo {
    /// Bytes on the wire.
    pub const SIZE: usize = 64;

    /// Encodes into the kernel's layout (little-endian, as x86 and arm64 are).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..2].copy_from_slice(&self.nr_hw_queues.to_le_bytes());
        b[2..4].copy_from_slice(&self.queue_depth.to_le_bytes());
        b[4..6].copy_from_slice(&self.state.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_io_buf_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.dev_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.ublksrv_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.flags.to_le_bytes());
        b[32..40].copy_from_slice(&self.ublksrv_flags.to_le_bytes());
        b[40..44].copy_from_slice(&self.owner_uid.to_le_bytes());
        b[44..48].copy_from_slice(&self.owner_gid.to_le_bytes());
        b
    }

    /// Decodes the kernel's layout.
    pub fn decode(b: &[u8; Self::SIZE]) -> DevInfo {
        DevInfo {
            nr_hw_queues: le16(b, 0),
            queue_depth: le16(b, 2),
            state: le16(b, 4),
            max_io_buf_bytes: le32(b, 8),
            dev_id: le32(b, 12),
            ublksrv_pid: le32(b, 16).cast_signed(),
            flags: le64(b, 24),
            ublksrv_flags: le64(b, 32),
            owner_uid: le32(b, 40),
            owner_gid: le32(b, 44),
        }
    }
}

/// `struct ublk_param_basic`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BasicParams {
    /// [`attr`].
    pub attrs: u32,
    /// log2 of the logical block size (9..=12: at most the page size).
    pub logical_bs_shift: u8,
    /// log2 of the physical block size.
    pub physical_bs_shift: u8,
    /// log2 of the optimal I/O size.
    pub io_opt_shift: u8,
    /// log2 of the minimum I/O size.
    pub io_min_shift: u8,
    /// Largest request, 512-byte sectors (at most `max_io_buf_bytes / 512`).
    pub max_sectors: u32,
    /// Chunk size, sectors (0: none).
    pub chunk_sectors: u32,
    /// Capacity, sectors.
    pub dev_sectors: u64,
    /// Virtual boundary mask (0: none).
    pub virt_boundary_mask: u64,
}

/// `struct ublk_param_discard`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscardParams {
    /// Discard alignment, bytes.
    pub discard_alignment: u32,
    /// Discard granularity, bytes (must not be 0).
    pub discard_granularity: u32,
    /// Largest discard, sectors (0: no discard).
    pub max_discard_sectors: u32,
    /// Largest write zeroes, sectors (0: no write zeroes).
    pub max_write_zeroes_sectors: u32,
    /// Discard segments per request (must be 1 when discard is on).
    pub max_discard_segments: u16,
}

/// `struct ublk_param_devt` (read-only: the kernel fills it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevtParams {
    /// `/dev/ublkcN` major.
    pub char_major: u32,
    /// `/dev/ublkcN` minor.
    pub char_minor: u32,
    /// `/dev/ublkbN` major (0 before START_DEV).
    pub disk_major: u32,
    /// `/dev/ublkbN` minor.
    pub disk_minor: u32,
}

/// The parameters this crate sets and reads (`struct ublk_params`, up to the devt part).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// Always sent.
    pub basic: BasicParams,
    /// Discard and write zeroes, if any.
    pub discard: Option<DiscardParams>,
    /// Filled by GET_PARAMS.
    pub devt: Option<DevtParams>,
}

/// Bytes of `struct ublk_params` up to the end of its devt part.
const PARAMS_LEN: usize = 76;

impl Params {
    /// Encodes for SET_PARAMS (header, basic, discard; devt is the kernel's).
    pub fn encode(&self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        let types = PARAM_BASIC | if self.discard.is_some() { PARAM_DISCARD } else { 0 };
        // Sent up to the end of discard: devt may not be set.
        b[0..4].copy_from_slice(&60u32.to_le_bytes());
        b[4..8].copy_from_slice(&types.to_le_bytes());
        let p = &self.basic;
        b[8..12].copy_from_slice(&p.attrs.to_le_bytes());
        b[12] = p.logical_bs_shift;
        b[13] = p.physical_bs_shift;
        b[14] = p.io_opt_shift;
        b[15] = p.io_min_shift;
        b[16..20].copy_from_slice(&p.max_sectors.to_le_bytes());
        b[20..24].copy_from_slice(&p.chunk_sectors.to_le_bytes());
        b[24..32].copy_from_slice(&p.dev_sectors.to_le_bytes());
        b[32..40].copy_from_slice(&p.virt_boundary_mask.to_le_bytes());
        if let Some(d) = &self.discard {
            b[40..44].copy_from_slice(&d.discard_alignment.to_le_bytes());
            b[44..48].copy_from_slice(&d.discard_granularity.to_le_bytes());
            b[48..52].copy_from_slice(&d.max_discard_sectors.to_le_bytes());
            b[52..56].copy_from_slice(&d.max_write_zeroes_sectors.to_le_bytes());
            b[56..58].copy_from_slice(&d.max_discard_segments.to_le_bytes());
        }
        b
    }

    /// Decodes what GET_PARAMS returned.
    pub fn decode(b: &[u8; PARAMS_LEN]) -> Params {
        let types = le32(b, 4);
        let basic = BasicParams {
            attrs: le32(b, 8),
            logical_bs_shift: b[12],
            physical_bs_shift: b[13],
            io_opt_shift: b[14],
            io_min_shift: b[15],
            max_sectors: le32(b, 16),
            chunk_sectors: le32(b, 20),
            dev_sectors: le64(b, 24),
            virt_boundary_mask: le64(b, 32),
        };
        let discard = (types & PARAM_DISCARD != 0).then(|| DiscardParams {
            discard_alignment: le32(b, 40),
            discard_granularity: le32(b, 44),
            max_discard_sectors: le32(b, 48),
            max_write_zeroes_sectors: le32(b, 52),
            max_discard_segments: le16(b, 56),
        });
        let devt = (types & PARAM_DEVT != 0).then(|| DevtParams {
            char_major: le32(b, 60),
            char_minor: le32(b, 64),
            disk_major: le32(b, 68),
            disk_minor: le32(b, 72),
        });
        Params { basic, discard, devt }
    }
}

/// One request as the kernel describes it (`struct ublksrv_io_desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoDesc {
    /// [`op`].
    pub op: u8,
    /// [`io_flags`] (bits 8..31 of `op_flags`, in place: compare with `io_flags::*`).
    pub flags: u32,
    /// Length, 512-byte sectors.
    pub nr_sectors: u32,
    /// Start, 512-byte sectors.
    pub start_sector: u64,
    /// The buffer address the kernel used (ours).
    pub addr: u64,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn os(context: String, e: std::io::Error) -> Error {
    Error::with_context(ErrorKind::Os, context).caused_by(e)
}

/// `/dev/ublk-control` and the SQE128 ring its commands go through (control plane: each
/// call blocks until the kernel answers or its timeout passes).
pub struct Control {
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    file: File,
    next: u64,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

/// How long control commands wait by default (START_DEV and END_USER_RECOVERY wait for
/// every queue to fetch; DEL_DEV for the server to close the char device).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

impl Control {
    /// Opens the control device; says what to do when ublk is not there.
    pub fn open() -> Result<Control, Error> {
        let file = OpenOptions::new().read(true).write(true).open(CONTROL_PATH).map_err(|e| {
            let what = if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{CONTROL_PATH} is missing: this kernel has no ublk driver loaded (modprobe ublk_drv; Linux 6.0+ with CONFIG_BLK_DEV_UBLK)"
                )
            } else {
                format!("opening {CONTROL_PATH} (ublk needs root, or CAP_SYS_ADMIN)")
            };
            Error::with_context(ErrorKind::Unsupported, what).caused_by(e)
        })?;
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(8)
            .map_err(|e| Error::new(ErrorKind::Setup, "io_uring with 128-byte SQEs for ublk control").caused_by(e))?;
        Ok(Control { uring, file, next: 1 })
    }

    /// Runs one control command. `buf` is what `addr`/`len` point at (in and out).
    fn command(
        &mut self,
        cmd_op: u32,
        dev_id: u32,
        data0: u64,
        buf: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<i32, Error> {
        // The kernel reads and writes a buffer of our own, which lives until the CQE (or
        // forever, if the wait gives up).
        let mut owned: Option<Box<[u8]>> = buf.as_ref().map(|b| b.to_vec().into_boxed_slice());
        let (addr, len) = match owned.as_mut() {
            Some(b) => (b.as_mut_ptr() as u64, u16::try_from(b.len()).unwrap_or(u16::MAX)),
            None => (0, 0),
        };
        let mut c = [0u8; 80];
        c[0..4].copy_from_slice(&dev_id.to_le_bytes());
        c[4..6].copy_from_slice(&u16::MAX.to_le_bytes()); // queue_id: not a queue command
        c[6..8].copy_from_slice(&len.to_le_bytes());
        c[8..16].copy_from_slice(&addr.to_le_bytes());
        c[16..24].copy_from_slice(&data0.to_le_bytes());
        let token = self.next;
        self.next += 1;
        let entry = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), cmd_op).cmd(c).build().user_data(token);
        // SAFETY: the SQE points at `owned` (a heap buffer moved nowhere until the CQE with
        // `token` is reaped below; if the wait gives up, it is leaked, never freed) and at
        // nothing else; the fd is `self.file`, open for the ring's life.
        unsafe { self.uring.submission().push(&entry) }
            .map_err(|_| Error::new(ErrorKind::SubmissionQueueFull, "ublk control ring full"))?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(cqe) = self.uring.completion().find(|c| c.user_data() == token) {
                if let (Some(out), Some(b)) = (buf, owned.as_ref()) {
                    out.copy_from_slice(b);
                }
                return Ok(cqe.result());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                std::mem::forget(owned);
                return Err(Error::with_context(
                    ErrorKind::Os,
                    format!(
                        "ublk control command {cmd_op:#x} for device {dev_id}: no answer within {} s",
                        timeout.as_secs()
                    ),
                ));
            }
            let ts = types::Timespec::from(left);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.uring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    std::mem::forget(owned);
                    return Err(os(format!("io_uring_enter for ublk control command {cmd_op:#x}"), e));
                }
            }
        }
    }

    fn checked(
        &mut self,
        what: &str,
        cmd_op: u32,
        dev_id: u32,
        data0: u64,
        buf: Option<&mut [u8]>,
        t: Duration,
    ) -> Result<i32, Error> {
        let r = self.command(cmd_op, dev_id, data0, buf, t)?;
        if r < 0 {
            return Err(os(format!("ublk {what} of device {dev_id}"), std::io::Error::from_raw_os_error(-r)));
        }
        Ok(r)
    }

    /// The features this kernel's ublk driver offers ([`flags`]).
    pub fn features(&mut self) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        self.checked("GET_FEATURES", cmd::GET_FEATURES, u32::MAX, 0, Some(&mut b), CONTROL_TIMEOUT)?;
        Ok(u64::from_le_bytes(b))
    }

    /// ADD_DEV: creates `/dev/ublkcN`; returns the device as the kernel set it up.
    pub fn add(&mut self, info: &DevInfo) -> Result<DevInfo, Error> {
        let mut b = info.encode();
        self.checked("ADD_DEV", cmd::ADD_DEV, info.dev_id, 0, Some(&mut b), CONTROL_TIMEOUT)?;
        Ok(DevInfo::decode(&b))
    }

    /// GET_DEV_INFO.
    pub fn dev_info(&mut self, dev_id: u32) -> Result<DevInfo, Error> {
        let mut b = [0u8; DevInfo::SIZE];
        self.checked("GET_DEV_INFO", cmd::GET_DEV_INFO, dev_id, 0, Some(&mut b), CONTROL_TIMEOUT)?;
        Ok(DevInfo::decode(&b))
    }

    /// SET_PARAMS (before START_DEV).
    pub fn set_params(&mut self, dev_id: u32, p: &Params) -> Result<(), Error> {
        let mut b = p.encode();
        self.checked("SET_PARAMS", cmd::SET_PARAMS, dev_id, 0, Some(&mut b), CONTROL_TIMEOUT).map(drop)
    }

    /// GET_PARAMS.
    pub fn params(&mut self, dev_id: u32) -> Result<Params, Error> {
        let mut b = [0u8; PARAMS_LEN];
        b[0..4].copy_from_slice(&u32::try_from(PARAMS_LEN).expect("76").to_le_bytes());
        self.checked("GET_PARAMS", cmd::GET_PARAMS, dev_id, 0, Some(&mut b), CONTROL_TIMEOUT)?;
        Ok(Params::decode(&b))
    }

    /// START_DEV: the kernel waits until every queue has fetched all its tags, then adds
    /// `/dev/ublkbN` (reading its partition table through the queues).
    pub fn start(&mut self, dev_id: u32, pid: u32, timeout: Duration) -> Result<(), Error> {
        self.checked("START_DEV", cmd::START_DEV, dev_id, u64::from(pid), None, timeout).map(drop)
    }

    /// STOP_DEV: removes `/dev/ublkbN`; the server's fetches end with `-ENODEV`.
    pub fn stop(&mut self, dev_id: u32) -> Result<(), Error> {
        self.checked("STOP_DEV", cmd::STOP_DEV, dev_id, 0, None, CONTROL_TIMEOUT).map(drop)
    }

    /// DEL_DEV: removes the device once its server has closed `/dev/ublkcN`.
    pub fn delete(&mut self, dev_id: u32, timeout: Duration) -> Result<(), Error> {
        self.checked("DEL_DEV", cmd::DEL_DEV, dev_id, 0, None, timeout).map(drop)
    }

    /// UPDATE_SIZE: the disk `/dev/ublkbN` takes a new capacity of `sectors` (512 B) at
    /// once (`set_capacity_and_notify`: a uevent, and openers see the new size). Only
    /// while the disk exists, between START_DEV and STOP_DEV: kernels before the fix that
    /// checks for a disk (`ublk_ctrl_set_size` answering ENODEV) dereference a null one.
    pub fn update_size(&mut self, dev_id: u32, sectors: u64) -> Result<(), Error> {
        self.checked("UPDATE_SIZE", cmd::UPDATE_SIZE, dev_id, sectors, None, CONTROL_TIMEOUT).map(drop)
    }

    /// START_USER_RECOVERY: a device whose server died (state QUIESCED or FAIL_IO) takes
    /// a new server.
    pub fn start_recovery(&mut self, dev_id: u32) -> Result<(), Error> {
        self.checked("START_USER_RECOVERY", cmd::START_USER_RECOVERY, dev_id, 0, None, CONTROL_TIMEOUT).map(drop)
    }

    /// END_USER_RECOVERY: waits until every queue of the new server fetched, then I/O
    /// (held since the old server died) flows again.
    pub fn end_recovery(&mut self, dev_id: u32, pid: u32, timeout: Duration) -> Result<(), Error> {
        self.checked("END_USER_RECOVERY", cmd::END_USER_RECOVERY, dev_id, u64::from(pid), None, timeout).map(drop)
    }
}

/// `/dev/ublkcN`, opened by the serving process (the kernel allows one opener).
pub struct CharDev {
    file: File,
    info: DevInfo,
}

impl std::fmt::Debug for CharDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CharDev").field("dev_id", &self.info.dev_id).finish_non_exhaustive()
    }
}

impl CharDev {
    /// Opens `/dev/ublkc<dev_id>` of a device `info` describes (as ADD_DEV or GET_DEV_INFO
    /// returned it), waiting up to `wait` for the node to appear.
    pub fn open(info: DevInfo, wait: Duration) -> Result<CharDev, Error> {
        let path = format!("/dev/ublkc{}", info.dev_id);
        let deadline = Instant::now() + wait;
        loop {
            match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(file) => return Ok(CharDev { file, info }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(os(format!("opening {path}"), e)),
            }
        }
    }

    /// The device as the kernel describes it.
    pub fn info(&self) -> &DevInfo {
        &self.info
    }

    /// The file descriptor.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Maps queue `q_id`'s I/O descriptors (read-only; the kernel writes them).
    pub fn map_queue(&self, q_id: u16) -> Result<Descriptors, Error> {
        if q_id >= self.info.nr_hw_queues {
            return Err(Error::new(ErrorKind::InvalidArgument, "ublk queue id past the device's queues"));
        }
        let page = crate::region::page_size();
        let len = (usize::from(self.info.queue_depth) * IO_DESC_SIZE).next_multiple_of(page);
        let stride = (usize::from(QUEUE_DEPTH_MAX) * IO_DESC_SIZE).next_multiple_of(page);
        let offset = libc::off_t::try_from(usize::from(q_id) * stride)
            .map_err(|_| Error::new(ErrorKind::InvalidArgument, "ublk queue offset"))?;
        // SAFETY: a new read-only shared mapping at an address the kernel chooses, of the
        // queue's descriptor area (ublk_ch_mmap checks the offset and the size); it touches
        // no existing memory, and the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.fd(),
                offset,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(os(
                format!("mapping the I/O descriptors of queue {q_id} of /dev/ublkc{}", self.info.dev_id),
                std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(raw.cast::<u8>()).expect("mmap returned null without failing");
        Ok(Descriptors { base, len, depth: self.info.queue_depth })
    }
}

/// One queue's I/O descriptors, mapped read-only from `/dev/ublkcN`.
pub struct Descriptors {
    base: NonNull<u8>,
    len: usize,
    depth: u16,
}

// SAFETY: the mapping is owned by this value alone (unmapped on drop) and is only read;
// moving it to the queue thread that reads it moves that ownership.
unsafe impl Send for Descriptors {}

impl std::fmt::Debug for Descriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Descriptors").field("depth", &self.depth).finish_non_exhaustive()
    }
}

impl Descriptors {
    /// The descriptor of `tag` (read after that tag's fetch completed, while the server
    /// owns it: the kernel does not write it then).
    pub fn get(&self, tag: u16) -> Option<IoDesc> {
        if tag >= self.depth {
            return None;
        }
        let at = usize::from(tag) * IO_DESC_SIZE;
        let mut b = [0u8; IO_DESC_SIZE];
        for (i, byte) in b.iter_mut().enumerate() {
            // SAFETY: `at + i < depth * IO_DESC_SIZE <= len`: inside the mapping this value
            // owns. Volatile: the kernel writes the area outside the Rust memory model.
            *byte = unsafe { std::ptr::read_volatile(self.base.as_ptr().add(at + i)) };
        }
        let op_flags = le32(&b, 0);
        Some(IoDesc {
            op: op_flags.to_le_bytes()[0],
            flags: op_flags & !0xff,
            nr_sectors: le32(&b, 4),
            start_sector: le64(&b, 8),
            addr: le64(&b, 16),
        })
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `map_queue` created, owned by this value.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The 16-byte `struct ublksrv_io_cmd` of an I/O command.
pub(crate) fn io_cmd(q_id: u16, tag: u16, result: i32, addr: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0..2].copy_from_slice(&q_id.to_le_bytes());
    c[2..4].copy_from_slice(&tag.to_le_bytes());
    c[4..8].copy_from_slice(&result.to_le_bytes());
    c[8..16].copy_from_slice(&addr.to_le_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_match_the_uapi_header() {
        // _IOWR('u', 0x04, struct ublksrv_ctrl_cmd) etc., as computed by the C macros.
        assert_eq!(cmd::ADD_DEV, 0xc020_7504);
        assert_eq!(cmd::GET_DEV_INFO, 0x8020_7502);
        assert_eq!(cmd::START_USER_RECOVERY, 0xc020_7510);
        assert_eq!(cmd::FETCH_REQ, 0xc010_7520);
        assert_eq!(cmd::COMMIT_AND_FETCH_REQ, 0xc010_7521);
        // _IOWR('u', 0x15, struct ublksrv_ctrl_cmd); _IOR('u', 0x13, ...).
        assert_eq!(cmd::UPDATE_SIZE, 0xc020_7515);
        assert_eq!(cmd::GET_FEATURES, 0x8020_7513);
        assert_eq!(flags::UPDATE_SIZE, 0x400);
    }

    #[test]
    fn dev_info_and_params_round_trip() {
        let i = DevInfo {
            nr_hw_queues: 2,
            queue_depth: 128,
            state: state::LIVE,
            max_io_buf_bytes: 512 << 10,
            dev_id: 7,
            ublksrv_pid: -1,
            flags: flags::USER_RECOVERY | flags::CMD_IOCTL_ENCODE,
            ublksrv_flags: 9,
            owner_uid: 0,
            owner_gid: 0,
        };
        assert_eq!(DevInfo::decode(&i.encode()), i);
        let p = Params {
            basic: BasicParams {
                attrs: attr::VOLATILE_CACHE,
                logical_bs_shift: 9,
                physical_bs_shift: 12,
                io_opt_shift: 0,
                io_min_shift: 9,
                max_sectors: 1024,
                chunk_sectors: 0,
                dev_sectors: 1 << 21,
                virt_boundary_mask: 0,
            },
            discard: Some(DiscardParams {
                discard_alignment: 0,
                discard_granularity: 512,
                max_discard_sectors: 65536,
                max_write_zeroes_sectors: 65536,
                max_discard_segments: 1,
            }),
            devt: None,
        };
        let b = p.encode();
        assert_eq!(le32(&b, 0), 60);
        assert_eq!(Params::decode(&b), p);
        assert_eq!(io_cmd(1, 2, -5, 0x1000), [1, 0, 2, 0, 0xfb, 0xff, 0xff, 0xff, 0, 0x10, 0, 0, 0, 0, 0, 0]);
    }
}
