//! What a block device built on a multipath head promises its users, taken from the
//! namespace's Identify data (NVMe Base 2.0 §5.17.2.1 Identify Controller, NVM Command Set
//! 1.0 §4.1.5.1 Identify Namespace), the way Linux's `nvme_update_disk_info` /
//! `nvme_config_discard` set a gendisk's queue limits:
//!
//! | limit | from |
//! | --- | --- |
//! | logical block size | LBA format in use (FLBAS) |
//! | physical block size, optimal I/O | NPWG, NOWS when NSFEAT bit 4 says they are valid |
//! | largest transfer | MDTS (units of 4 KiB: CAP.MPSMIN is 0 on every NVMe/TCP controller we know), at most 65,536 blocks (NLB is 16 bits) and the caller's cap |
//! | discard | ONCS bit 2 (Dataset Management); granularity NPDG when valid, else one block; at most 65,536 blocks per command |
//! | write zeroes | ONCS bit 3; at most 65,536 blocks per command |
//! | volatile write cache | VWC bit 0: then flushes are sent; without it writes are durable when they complete |
//! | read-only | NSATTR bit 0 (write protected) |
//!
//! A limit is only ever promised when the namespace states it (the project's rule: nothing
//! advertised that is not true).

use std::sync::Arc;
use std::time::Duration;

use host::controller::Controller;
use host::head::Head;
use host::queue::{DataDir, Io};
use nvme::identify::{IDENTIFY_SIZE, IdentifyNamespace, cns, oncs};
use nvme::{Cid, Nsid, Sqe};
use uring::IoBuf;

use crate::error::{Error, ErrorKind, Result};

/// Most blocks one NVMe read, write, Write Zeroes or single-range Deallocate carries here
/// (the NLB field of reads, writes and Write Zeroes is 16 bits, 0's based; the host
/// context applies the same bound to every command).
pub const BLOCKS_PER_COMMAND_MAX: u64 = 65_536;

/// The default cap on one transfer: what one request may move, whatever MDTS allows. Each
/// ublk tag owns a buffer of this size, so it bounds memory per queue (depth x this).
pub const TRANSFER_CAP_DEFAULT: u32 = 512 << 10;

/// Limits of a block device over one namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Subsystem NQN.
    pub subnqn: String,
    /// NSID (through the first path).
    pub nsid: u32,
    /// Capacity in bytes.
    pub size: u64,
    /// log2 of the logical block size.
    pub block_shift: u8,
    /// log2 of the physical block size (NPWG), at least `block_shift`.
    pub physical_shift: u8,
    /// log2 of the optimal I/O size (NOWS), 0 when the namespace does not say.
    pub io_opt_shift: u8,
    /// Largest read or write, bytes (a multiple of the block size).
    pub max_transfer: u32,
    /// Dataset Management (deallocate) supported.
    pub discard: bool,
    /// Discard granularity, bytes.
    pub discard_granularity: u32,
    /// Write Zeroes supported.
    pub write_zeroes: bool,
    /// Most blocks one Deallocate or Write Zeroes command covers.
    pub zero_blocks_max: u64,
    /// A volatile write cache is present: flushes matter.
    pub volatile_cache: bool,
    /// The namespace is write protected.
    pub read_only: bool,
}

impl DeviceInfo {
    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.block_shift
    }

    /// Number of logical blocks.
    pub fn blocks(&self) -> u64 {
        self.size >> self.block_shift
    }

    /// The limits of `head`'s namespace, read with one Identify Namespace through the first
    /// live path (control plane; blocks for one admin round trip). `transfer_cap` bounds the
    /// largest transfer (it is rounded down to whole blocks and to at least 4 KiB).
    pub fn probe(head: &Arc<Head>, transfer_cap: u32) -> Result<DeviceInfo> {
        let paths: Vec<(Arc<Controller>, Nsid)> = head.paths().into_iter().flatten().collect();
        let mut last = None;
        for (ctrl, nsid) in paths.iter().filter(|(c, _)| c.is_live()).chain(paths.iter()) {
            match identify_namespace(ctrl, *nsid) {
                Ok(ns) => return DeviceInfo::from_identify(head, ctrl, *nsid, &ns, transfer_cap),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::new(ErrorKind::Host, format!("namespace of {}: the head has no path", head.subnqn))
        }))
    }

    fn from_identify(head: &Head, ctrl: &Controller, nsid: Nsid, raw: &[u8], transfer_cap: u32) -> Result<DeviceInfo> {
        let ns = IdentifyNamespace::decode(raw);
        let id = ctrl.identify();
        let info = ctrl.namespace(nsid).ok_or_else(|| {
            Error::new(ErrorKind::Host, format!("namespace {nsid} of {} is not known to its controller", head.subnqn))
        })?;
        let bs = info.block_shift;
        if !(9..=16).contains(&bs) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("namespace {nsid} of {}: block size 2^{bs} is not 512 B to 64 KiB", head.subnqn),
            ));
        }
        // NSFEAT bit 4: NPWG, NPDG, NPDA, NOWS are valid (NVM Command Set 1.0 Figure 97).
        let opt_valid = ns.nsfeat & (1 << 4) != 0;
        let npdg = u16::from_le_bytes([raw[66], raw[67]]);
        let pow2_blocks = |v: u16| {
            let n = u32::from(v) + 1;
            if n.is_power_of_two() { u8::try_from(n.trailing_zeros()).unwrap_or(0) } else { 0 }
        };
        let physical_shift = if opt_valid { bs + pow2_blocks(ns.npwg) } else { bs }.min(16);
        let io_opt_shift = if opt_valid && ns.nows != 0 { bs + pow2_blocks(ns.nows) } else { 0 };
        let block = 1u64 << bs;
        let mdts_bytes = if id.mdts == 0 { u64::MAX } else { 4096u64 << id.mdts.min(20) };
        let cap = u64::from(transfer_cap.max(4096));
        let max_transfer = mdts_bytes.min(BLOCKS_PER_COMMAND_MAX * block).min(cap) / block * block;
        let discard = id.oncs & oncs::DSM != 0;
        let granularity = if opt_valid { block * (u64::from(npdg) + 1) } else { block };
        Ok(DeviceInfo {
            subnqn: head.subnqn.clone(),
            nsid: nsid.0,
            size: info.size_bytes(),
            block_shift: bs,
            physical_shift,
            io_opt_shift,
            max_transfer: u32::try_from(max_transfer.max(block)).unwrap_or(u32::MAX),
            discard,
            discard_granularity: u32::try_from(granularity).unwrap_or(u32::MAX),
            write_zeroes: id.oncs & oncs::WRITE_ZEROES != 0,
            // The context takes a command's length in bytes as a u32.
            zero_blocks_max: BLOCKS_PER_COMMAND_MAX.min((1u64 << 31) >> bs),
            volatile_cache: id.vwc & 1 != 0,
            read_only: ns.nsattr & 1 != 0,
        })
    }
}

/// Identify Namespace (CNS 00h) through `ctrl`'s admin queue; the raw 4096 bytes.
fn identify_namespace(ctrl: &Controller, nsid: Nsid) -> Result<Vec<u8>> {
    let io = Io {
        sqe: Sqe::identify(Cid(0), cns::NAMESPACE, nsid, 0, 0),
        buf: Some(IoBuf::new(IDENTIFY_SIZE)),
        len: u32::try_from(IDENTIFY_SIZE).expect("4096 fits"),
        dir: DataDir::FromController,
        token: 0,
    };
    let what = format!("Identify Namespace {nsid} through {}", ctrl.opts.traddr);
    let done = ctrl.admin_command(io).map_err(|e| Error::host(&what, &e))?;
    if !done.cqe.status.is_success() {
        return Err(Error::new(ErrorKind::Host, format!("{what}: {}", done.cqe.status)));
    }
    let buf = done.buf.ok_or_else(|| Error::new(ErrorKind::Host, format!("{what}: no data came back")))?;
    Ok(buf.as_full()[..IDENTIFY_SIZE].to_vec())
}

/// How long [`wait_live`] waits by default for a head's first live path.
pub const LIVE_WAIT_DEFAULT: Duration = Duration::from_secs(30);

/// Waits until at least one path of `head` is live (a device is only created over a head
/// that can serve I/O now), or `timeout` passes.
pub fn wait_live(head: &Head, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if head.paths().iter().flatten().any(|(c, _)| c.is_live()) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::new(
                ErrorKind::Host,
                format!("no live path to {} within {} s", head.subnqn, timeout.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
