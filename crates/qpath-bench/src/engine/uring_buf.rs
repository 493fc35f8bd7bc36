//! Units whose data lives in a [`uring::IoBuf`], the buffer type both the io_uring ring
//! and the NVMe/TCP host take by value.
//!
//! `prepare` installs one per unit ([`install`]); `queue` moves it out of the unit and
//! into the ring or the host context ([`take`]); the completion hands it back and the
//! engine puts it back ([`put`]) before returning the unit. No copy and no allocation
//! per I/O: the same heap block travels for the unit's whole life.

use crate::io_u::{ForeignBuf, IoBuf, IoU};

/// A unit's buffer: `Some` while the unit holds it, `None` while the I/O is in flight.
#[derive(Debug)]
pub struct UringBuf(Option<uring::IoBuf>);

impl ForeignBuf for UringBuf {
    fn bytes(&self) -> &[u8] {
        // The runner only looks at units the engine handed back, which hold their buffer.
        self.0.as_ref().map_or(&[], uring::IoBuf::as_full)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut().map_or(&mut [], uring::IoBuf::as_full_mut)
    }
}

/// Replace every unit's buffer with a page-aligned [`uring::IoBuf`] at least as long
/// (capacities are whole pages, so a 512-byte job gets 4 KiB buffers).
pub fn install(units: &mut [IoU]) {
    for u in units {
        let cap = u.buf.len().max(1).next_multiple_of(uring::IO_ALIGN);
        u.buf = IoBuf::foreign(Box::new(UringBuf(Some(uring::IoBuf::new(cap)))));
    }
}

/// Move the unit's buffer out, with its length set to the transfer length (what a
/// ring write sends). `None` if the unit has no `UringBuf` or it is already out.
pub fn take(unit: &mut IoU) -> Option<uring::IoBuf> {
    let len = unit.len as usize;
    let mut b = unit.buf.downcast_mut::<UringBuf>()?.0.take()?;
    b.set_len(len.min(b.capacity()));
    Some(b)
}

/// Give a buffer back to its unit.
///
/// # Panics
/// If the unit's buffer is not a [`UringBuf`] (the engine installs one in `prepare`).
pub fn put(unit: &mut IoU, buf: uring::IoBuf) {
    let slot = unit.buf.downcast_mut::<UringBuf>().expect("unit buffers are UringBufs after prepare()");
    assert!(slot.0.is_none(), "unit {} got a second buffer back", unit.index);
    slot.0 = Some(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_travel_without_copy() {
        let mut units = vec![IoU::new(0, 512, 4096), IoU::new(1, 8192, 4096)];
        install(&mut units);
        assert_eq!(units[0].buf.len(), 4096, "rounded up to a page");
        assert_eq!(units[1].buf.len(), 8192);
        units[1].len = 4096;
        units[1].data_mut().fill(9);
        let addr = units[1].buf.as_ptr();
        let b = take(&mut units[1]).unwrap();
        assert_eq!(b.len(), 4096);
        assert_eq!(b[0], 9);
        assert!(take(&mut units[1]).is_none(), "already out");
        put(&mut units[1], b);
        assert_eq!(units[1].buf.as_ptr(), addr, "the same heap block came back");
        assert_eq!(units[1].data()[4095], 9);
    }
}
