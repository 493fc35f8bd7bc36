//! A ublk device's life: created over a head (ADD_DEV, SET_PARAMS, queue threads, START_DEV),
//! served, then deleted (STOP_DEV, DEL_DEV) or left for a later server to take over (user
//! recovery: START_USER_RECOVERY, queue threads, END_USER_RECOVERY).
//!
//! ```text
//!            create()                         serve ...            delete()
//!   ADD_DEV ─► SET_PARAMS ─► queues fetch ─► START_DEV ─► LIVE ─► STOP_DEV ─► DEL_DEV
//!                                                         │ server killed (or detach())
//!                                                         ▼
//!               recover(): START_USER_RECOVERY ◄── QUIESCED (I/O held in the kernel)
//!                          queues fetch ─► END_USER_RECOVERY ─► LIVE
//! ```
//!
//! Devices are created with `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`: when the
//! serving process dies, the kernel keeps `/dev/ublkbN`, holds new I/O and requeues what the
//! dead server had (Linux 6.0+); a new server re-attaches and the application sees no error.
//! A device is only ever recovered over a namespace of the block size it was created
//! with, or it is refused; a namespace resized while no server ran is taken over at the
//! device's old size, which then follows the namespace ([`super::size`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use host::context::ContextOptions;
use host::head::Head;
use uring::ublk::{CONTROL_TIMEOUT, CharDev, Control, DevInfo, flags, state};

use super::params::params_of;
use super::queue::{self, QueueSetup, QueueStats};
use super::size::{self, Sizes};
use crate::device::DeviceInfo;
use crate::error::{Error, ErrorKind, Result};

/// Most queues of one device.
pub const QUEUES_MAX: u16 = 64;
/// Most tags per queue (the kernel allows 4096; each tag holds a `max_transfer` buffer).
pub const DEPTH_MAX: u16 = 1024;
/// Tags per queue unless told otherwise (Linux's default for the nvme host's I/O queues).
pub const DEPTH_DEFAULT: u16 = 128;
/// How long START_DEV / END_USER_RECOVERY may take (they wait for every queue, and
/// START_DEV reads the partition table through them).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How a device is laid out.
#[derive(Clone, Debug)]
pub struct UblkOptions {
    /// Device number (`/dev/ublkbN`); `None`: the kernel picks.
    pub dev_id: Option<u32>,
    /// Queues (one thread and completion context each).
    pub queues: u16,
    /// Tags per queue.
    pub depth: u16,
    /// Serve the device read-only.
    pub read_only: bool,
    /// Each queue's completion context.
    pub context: ContextOptions,
}

impl Default for UblkOptions {
    fn default() -> UblkOptions {
        UblkOptions {
            dev_id: None,
            queues: 1,
            depth: DEPTH_DEFAULT,
            read_only: false,
            context: ContextOptions::default(),
        }
    }
}

/// A ublk device this process serves.
pub struct UblkDevice {
    dev_id: u32,
    info: DeviceInfo,
    dev: Arc<CharDev>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The namespace's size as the queues see it; the size thread's wake-up.
    sizes: Arc<Sizes>,
    /// The size thread (from START_DEV / END_USER_RECOVERY until STOP_DEV).
    sizer: Option<JoinHandle<()>>,
    /// Per-queue counters.
    pub stats: Vec<Arc<QueueStats>>,
}

impl std::fmt::Debug for UblkDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UblkDevice").field("dev_id", &self.dev_id).finish_non_exhaustive()
    }
}

fn err(e: &uring::Error) -> Error {
    let kind = if e.kind() == uring::ErrorKind::Unsupported { ErrorKind::Unsupported } else { ErrorKind::Io };
    let cause = e.os_error().map(|s| format!(": {s}")).unwrap_or_default();
    Error::new(kind, format!("{}{cause}", e.context()))
}

fn check(opts: &UblkOptions) -> Result<()> {
    if opts.queues == 0 || opts.queues > QUEUES_MAX {
        return Err(Error::new(ErrorKind::Invalid, format!("queues: {} is not 1 to {QUEUES_MAX}", opts.queues)));
    }
    if opts.depth == 0 || opts.depth > DEPTH_MAX {
        return Err(Error::new(ErrorKind::Invalid, format!("depth: {} is not 1 to {DEPTH_MAX}", opts.depth)));
    }
    Ok(())
}

impl UblkDevice {
    /// Creates `/dev/ublkbN` over `head` (whose limits are `info`) and serves it.
    pub fn create(head: &Arc<Head>, info: &DeviceInfo, opts: &UblkOptions) -> Result<UblkDevice> {
        check(opts)?;
        let params = params_of(info, opts.read_only)?;
        let mut ctl = Control::open().map_err(|e| err(&e))?;
        let want = DevInfo {
            nr_hw_queues: opts.queues,
            queue_depth: opts.depth,
            max_io_buf_bytes: info.max_transfer,
            dev_id: opts.dev_id.unwrap_or(u32::MAX),
            ublksrv_pid: -1,
            flags: flags::USER_RECOVERY | flags::USER_RECOVERY_REISSUE | flags::CMD_IOCTL_ENCODE,
            ..DevInfo::default()
        };
        let added = ctl.add(&want).map_err(|e| {
            let mut x = err(&e);
            if e.os_error().and_then(std::io::Error::raw_os_error) == Some(libc_eexist()) {
                x = Error::new(ErrorKind::Busy, format!("ublk device {} exists already", want.dev_id));
            }
            x
        })?;
        let id = added.dev_id;
        if added.flags & flags::USER_RECOVERY == 0 {
            tracing::warn!(dev_id = id, "this kernel's ublk has no user recovery: a restarted server cannot re-attach");
        }
        let result = (|| {
            ctl.set_params(id, &params).map_err(|e| err(&e))?;
            let dev = Arc::new(CharDev::open(added, Duration::from_secs(10)).map_err(|e| err(&e))?);
            let mut d = UblkDevice::spawn(head, info, opts, id, dev)?;
            if let Err(e) = ctl.start(id, std::process::id(), START_TIMEOUT) {
                d.halt();
                return Err(err(&e));
            }
            d.follow_size(info.size)?;
            Ok(d)
        })();
        match result {
            Ok(d) => {
                tracing::info!(
                    dev_id = id,
                    queues = opts.queues,
                    depth = opts.depth,
                    size = info.size,
                    "ublk device started"
                );
                Ok(d)
            }
            Err(e) => {
                let _ = ctl.stop(id);
                let _ = ctl.delete(id, CONTROL_TIMEOUT);
                Err(e)
            }
        }
    }

    /// Takes over device `dev_id`, whose server died (state QUIESCED or FAIL_IO), over
    /// `head` (limits `info`): the device must have been created over the same namespace.
    pub fn recover(head: &Arc<Head>, info: &DeviceInfo, dev_id: u32, opts: &UblkOptions) -> Result<UblkDevice> {
        let mut ctl = Control::open().map_err(|e| err(&e))?;
        let now = ctl.dev_info(dev_id).map_err(|e| err(&e))?;
        if now.state != state::QUIESCED && now.state != state::FAIL_IO {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "ublk device {dev_id} is {} (server pid {}): only a device whose server died can be taken over",
                    state_name(now.state),
                    now.ublksrv_pid
                ),
            ));
        }
        let p = ctl.params(dev_id).map_err(|e| err(&e))?;
        // Its size may differ (the namespace was resized while no server ran): the device
        // then follows it once served. Its block size may not: every offset would move.
        if p.basic.logical_bs_shift != info.block_shift {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "ublk device {dev_id} has 2^{} B blocks; namespace {} of {} has 2^{} B blocks: not the same disk, not taking it over",
                    p.basic.logical_bs_shift, info.nsid, info.subnqn, info.block_shift
                ),
            ));
        }
        if u64::from(now.max_io_buf_bytes) < u64::from(p.basic.max_sectors) << 9 {
            return Err(Error::new(ErrorKind::Protocol, format!("ublk device {dev_id}: inconsistent limits")));
        }
        // The device keeps its own layout (queues, depth, largest request): serve it as it is.
        let opts = UblkOptions { queues: now.nr_hw_queues, depth: now.queue_depth, ..opts.clone() };
        check(&opts)?;
        let mut info = info.clone();
        info.max_transfer = info.max_transfer.min(now.max_io_buf_bytes);
        ctl.start_recovery(dev_id).map_err(|e| err(&e))?;
        let dev = Arc::new(CharDev::open(now, Duration::from_secs(10)).map_err(|e| err(&e))?);
        let mut d = UblkDevice::spawn(head, &info, &opts, dev_id, dev)?;
        if let Err(e) = ctl.end_recovery(dev_id, std::process::id(), START_TIMEOUT) {
            d.halt();
            return Err(err(&e));
        }
        d.follow_size(p.basic.dev_sectors << 9)?;
        tracing::info!(dev_id, queues = opts.queues, "ublk device recovered: this process serves it now");
        Ok(d)
    }

    /// Starts one thread per queue and waits until each has fetched all its tags.
    fn spawn(
        head: &Arc<Head>,
        info: &DeviceInfo,
        opts: &UblkOptions,
        dev_id: u32,
        dev: Arc<CharDev>,
    ) -> Result<UblkDevice> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut d = UblkDevice {
            dev_id,
            info: info.clone(),
            dev,
            threads: Vec::new(),
            stop,
            sizes: Sizes::new(opts.queues, info.size),
            sizer: None,
            stats: Vec::new(),
        };
        for q in 0..opts.queues {
            let stats = Arc::new(QueueStats::default());
            let setup = QueueSetup {
                q_id: q,
                dev: Arc::clone(&d.dev),
                head: Arc::clone(head),
                info: info.clone(),
                context: opts.context.clone(),
                stop: Arc::clone(&d.stop),
                stats: Arc::clone(&stats),
                sizes: Arc::clone(&d.sizes),
            };
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let t = std::thread::Builder::new()
                .name(format!("ublk{dev_id}q{q}"))
                .spawn(move || queue::run(setup, tx))
                .map_err(|e| Error::io("spawning a ublk queue thread", &e))?;
            d.threads.push(t);
            d.stats.push(stats);
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(Ok(())) => {}
                Ok(Err(why)) => {
                    d.halt();
                    return Err(Error::new(ErrorKind::Host, format!("ublk device {dev_id}: {why}")));
                }
                Err(_) => {
                    d.halt();
                    return Err(Error::new(ErrorKind::Io, format!("ublk device {dev_id}: queue {q} did not start")));
                }
            }
        }
        Ok(d)
    }

    /// Starts the size thread over a disk of `have` bytes (it exists now: after START_DEV
    /// or END_USER_RECOVERY). A thread that cannot start stops the queues.
    fn follow_size(&mut self, have: u64) -> Result<()> {
        let (id, sizes) = (self.dev_id, Arc::clone(&self.sizes));
        match std::thread::Builder::new().name(format!("ublk{id}size")).spawn(move || size::run(id, &sizes, have)) {
            Ok(t) => {
                self.sizer = Some(t);
                Ok(())
            }
            Err(e) => {
                self.halt();
                Err(Error::io("spawning a ublk device's size thread", &e))
            }
        }
    }

    /// The namespace's size as every queue serves it now (the device's, once the kernel
    /// followed it).
    pub fn namespace_size(&self) -> u64 {
        self.sizes.namespace_size()
    }

    /// Ends the size thread: it sends no UPDATE_SIZE after this returns.
    fn stop_sizer(&mut self) {
        self.sizes.stop();
        if let Some(t) = self.sizer.take() {
            let _ = t.join();
        }
    }

    /// The device number (`/dev/ublkbN`).
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// The block device's path.
    pub fn path(&self) -> String {
        format!("/dev/ublkb{}", self.dev_id)
    }

    /// The namespace's limits it serves with.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether every queue thread has ended (the device was stopped, by anyone).
    pub fn ended(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Stops the queue threads (they finish their NVMe commands) and waits for them.
    fn halt(&mut self) {
        self.stop_sizer();
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Removes the device: STOP_DEV (the kernel fails the device's pending fetches, the
    /// queues end), then DEL_DEV once `/dev/ublkcN` is closed.
    pub fn delete(mut self) -> Result<()> {
        let mut ctl = Control::open().map_err(|e| err(&e))?;
        // No UPDATE_SIZE once the disk is going away.
        self.stop_sizer();
        let stopped = ctl.stop(self.dev_id).map_err(|e| err(&e));
        self.halt();
        let id = self.dev_id;
        drop(self);
        stopped?;
        ctl.delete(id, CONTROL_TIMEOUT).map_err(|e| err(&e))?;
        tracing::info!(dev_id = id, "ublk device deleted");
        Ok(())
    }

    /// Stops serving without removing the device: the kernel holds its I/O until another
    /// server recovers it (what a crash does, without the crash).
    pub fn detach(mut self) {
        self.halt();
        tracing::info!(dev_id = self.dev_id, "ublk device left for another server to recover");
    }
}

impl Drop for UblkDevice {
    fn drop(&mut self) {
        self.halt();
    }
}

fn libc_eexist() -> i32 {
    17
}

/// A state's name, for messages.
pub fn state_name(s: u16) -> &'static str {
    match s {
        state::DEAD => "dead",
        state::LIVE => "live",
        state::QUIESCED => "quiesced (its server died; I/O waits)",
        state::FAIL_IO => "failing I/O (its server died)",
        _ => "in an unknown state",
    }
}

/// Stops and deletes device `dev_id`, whoever serves it (its server's queues end when
/// their fetches fail). DEL_DEV waits for that server to close `/dev/ublkcN`.
pub fn delete_device(dev_id: u32) -> Result<()> {
    let mut ctl = Control::open().map_err(|e| err(&e))?;
    ctl.dev_info(dev_id).map_err(|e| {
        if e.os_error().and_then(std::io::Error::raw_os_error) == Some(19) {
            Error::new(ErrorKind::NotFound, format!("no ublk device {dev_id}"))
        } else {
            err(&e)
        }
    })?;
    ctl.stop(dev_id).map_err(|e| err(&e))?;
    ctl.delete(dev_id, CONTROL_TIMEOUT).map_err(|e| err(&e))
}

/// One device as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Listed {
    /// Device number.
    pub dev_id: u32,
    /// State name.
    pub state: &'static str,
    /// Serving process, if any.
    pub pid: i32,
    /// Queues.
    pub queues: u16,
    /// Tags per queue.
    pub depth: u16,
    /// Capacity, bytes.
    pub size: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Created with user recovery.
    pub recovery: bool,
}

/// Every ublk device of this machine (`/sys/class/ublk-char/ublkcN`), as the kernel sees it.
pub fn list_devices() -> Result<Vec<Listed>> {
    let mut ids: Vec<u32> = match std::fs::read_dir("/sys/class/ublk-char") {
        Ok(rd) => rd.filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("ublkc")?.parse().ok()).collect(),
        Err(_) => return Ok(Vec::new()),
    };
    ids.sort_unstable();
    let mut ctl = Control::open().map_err(|e| err(&e))?;
    let mut out = Vec::new();
    for id in ids {
        let Ok(i) = ctl.dev_info(id) else { continue };
        let p = ctl.params(id).ok();
        out.push(Listed {
            dev_id: id,
            state: match i.state {
                state::DEAD => "dead",
                state::LIVE => "live",
                state::QUIESCED => "quiesced",
                state::FAIL_IO => "fail_io",
                _ => "unknown",
            },
            pid: i.ublksrv_pid,
            queues: i.nr_hw_queues,
            depth: i.queue_depth,
            size: p.map_or(0, |p| p.basic.dev_sectors << 9),
            block_size: p.map_or(0, |p| 1 << p.basic.logical_bs_shift),
            recovery: i.flags & flags::USER_RECOVERY != 0,
        });
    }
    Ok(out)
}
