//! The ublk parameters of a device built on a namespace: [`DeviceInfo`] (from Identify) in
//! the kernel's terms (`struct ublk_params`, `ublk_ctrl_start_dev` turns them into the
//! gendisk's queue limits).

use uring::ublk::{BasicParams, DiscardParams, Params, attr};

use crate::device::DeviceInfo;
use crate::error::{Error, ErrorKind, Result};

/// ublk's logical block size is at most the page size (`ublk_validate_params`).
const LOGICAL_SHIFT_MAX: u8 = 12;

/// The parameters of a device over `info`: block sizes, largest request (the largest
/// transfer: `max_io_buf_bytes`), capacity, discard and write zeroes when the namespace has
/// them, a volatile write cache when it has one (the block layer then sends flushes),
/// and with it FUA: a journal's FUA write goes as one NVMe Write with FUA (NVM Command
/// Set 1.0 §3.2.6) instead of the write and a flush the block layer sends to a disk
/// without FUA. Linux's NVMe driver offers FUA on the same condition (a write cache and
/// FUA together when VWC is present, `drivers/nvme/host/core.c`); without a volatile
/// cache a completed write is durable and FUA means nothing.
pub fn params_of(info: &DeviceInfo, read_only: bool) -> Result<Params> {
    if info.block_shift > LOGICAL_SHIFT_MAX {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "namespace {} of {}: its {} B blocks are larger than ublk's 4 KiB limit; export it over NBD instead",
                info.nsid,
                info.subnqn,
                info.block_size()
            ),
        ));
    }
    let mut attrs = 0;
    if info.volatile_cache {
        attrs |= attr::VOLATILE_CACHE | attr::FUA;
    }
    if read_only || info.read_only {
        attrs |= attr::READ_ONLY;
    }
    let zero_sectors = u32::try_from((info.zero_blocks_max << info.block_shift) >> 9).unwrap_or(u32::MAX);
    let discard = (info.discard || info.write_zeroes).then(|| DiscardParams {
        discard_alignment: 0,
        discard_granularity: info.discard_granularity.max(info.block_size()),
        max_discard_sectors: if info.discard { zero_sectors } else { 0 },
        max_write_zeroes_sectors: if info.write_zeroes { zero_sectors } else { 0 },
        max_discard_segments: 1,
    });
    Ok(Params {
        basic: BasicParams {
            attrs,
            logical_bs_shift: info.block_shift,
            physical_bs_shift: info.physical_shift.max(info.block_shift),
            io_opt_shift: info.io_opt_shift.max(info.block_shift),
            io_min_shift: info.block_shift,
            max_sectors: info.max_transfer >> 9,
            chunk_sectors: 0,
            dev_sectors: info.size >> 9,
            virt_boundary_mask: 0,
        },
        discard,
        devt: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DeviceInfo {
        DeviceInfo {
            subnqn: "nqn.x:y".into(),
            nsid: 1,
            size: 1 << 30,
            block_shift: 9,
            physical_shift: 12,
            io_opt_shift: 0,
            max_transfer: 512 << 10,
            discard: true,
            discard_granularity: 512,
            write_zeroes: true,
            zero_blocks_max: 65536,
            volatile_cache: true,
            read_only: false,
        }
    }

    #[test]
    fn limits_follow_the_namespace() {
        let p = params_of(&info(), false).unwrap();
        assert_eq!(p.basic.logical_bs_shift, 9);
        assert_eq!(p.basic.physical_bs_shift, 12);
        assert_eq!(p.basic.max_sectors, 1024);
        assert_eq!(p.basic.dev_sectors, 1 << 21);
        assert_eq!(p.basic.attrs, attr::VOLATILE_CACHE | attr::FUA);
        let d = p.discard.unwrap();
        assert_eq!((d.max_discard_sectors, d.max_write_zeroes_sectors, d.max_discard_segments), (65536, 65536, 1));
    }

    #[test]
    fn what_the_namespace_lacks_is_not_promised() {
        let mut i = info();
        i.discard = false;
        i.volatile_cache = false;
        i.read_only = true;
        let p = params_of(&i, false).unwrap();
        assert_eq!(p.basic.attrs, attr::READ_ONLY, "no volatile cache: no flush, no FUA");
        assert_eq!(p.discard.unwrap().max_discard_sectors, 0);
        i.write_zeroes = false;
        assert!(params_of(&i, false).unwrap().discard.is_none());
        i.block_shift = 13;
        assert_eq!(params_of(&i, false).unwrap_err().kind, ErrorKind::Unsupported);
    }
}
