//! Admin and Fabrics commands the host issues during bring-up and from its
//! admin thread, over a [`SyncQueue`].

use std::time::{Duration, Instant};

use nvme::fabrics::{Cap, Cc, PropertyCmd, csts, prop};
use nvme::log::{DiscoveryLog, lid};
use nvme::{Cid, Nsid, Sqe};

use crate::auth::Exchange as _;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::SyncQueue;

/// Admin command timeout.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Property Get.
pub fn prop_get(q: &mut SyncQueue, offset: u32, size8: bool) -> Result<u64> {
    Ok(q.command(PropertyCmd::get_sqe(Cid(0), offset, size8), ADMIN_TIMEOUT)?.result64())
}

/// Property Set.
pub fn prop_set(q: &mut SyncQueue, offset: u32, size8: bool, value: u64) -> Result<()> {
    q.command(PropertyCmd::set_sqe(Cid(0), offset, size8, value), ADMIN_TIMEOUT).map(|_| ())
}

/// Enables the controller (CC.EN = 1) and waits for CSTS.RDY within CAP.TO (NVMe 2.0 §3.5.1):
/// the steps of [`crate::controller::bringup::Enable`], which a bring-up takes too.
pub fn enable(q: &mut SyncQueue) -> Result<Cap> {
    let mut m = crate::controller::bringup::Enable::new();
    crate::controller::drive(q, &mut m, |_, _, _| Err(Error::new(ErrorKind::Protocol, "enabling connects no queue")))
}

/// Normal shutdown (CC.SHN = 01b), waiting briefly for CSTS.SHST = complete.
pub fn shutdown(q: &mut SyncQueue) -> Result<()> {
    prop_set(q, prop::CC, false, u64::from(Cc::enable_value().0 | (1 << 14)))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let s = u32::try_from(prop_get(q, prop::CSTS, false)? & 0xffff_ffff).unwrap_or(0);
        if s & csts::SHST_MASK == csts::SHST_COMPLETE {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Reads a whole log page of `len` bytes, in chunks of at most `chunk` bytes.
pub fn get_log(q: &mut SyncQueue, lid_: u8, lsp: u8, rae: bool, len: usize, chunk: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let n = (len - out.len()).min(chunk).next_multiple_of(4);
        let sqe = Sqe::get_log_page(
            Cid(0),
            Nsid::BROADCAST,
            lid_,
            lsp,
            rae,
            u32::try_from(n).map_err(|_| Error::new(ErrorKind::Invalid, "log too large"))?,
            out.len() as u64,
        );
        let (_, d) = q.read_data(sqe, n, ADMIN_TIMEOUT)?;
        out.extend_from_slice(&d[..n.min(len - out.len())]);
    }
    Ok(out)
}

/// The discovery log: header first, then every record, re-read if the generation changed (NVMe-oF 1.1 §5.3).
pub fn discovery_log(q: &mut SyncQueue) -> Result<DiscoveryLog> {
    for _ in 0..10 {
        let hdr = get_log(q, lid::DISCOVERY, 0, false, 1024, 4096)?;
        let numrec = DiscoveryLog::numrec(&hdr);
        if numrec > 4096 {
            return Err(Error::new(ErrorKind::Protocol, format!("discovery log claims {numrec} records")));
        }
        let n = usize::try_from(numrec).unwrap_or(0);
        let page = get_log(q, lid::DISCOVERY, 0, false, 1024 * (n + 1), 64 * 1024)?;
        let again = get_log(q, lid::DISCOVERY, 0, false, 1024, 4096)?;
        if again[..8] == page[..8] {
            return DiscoveryLog::decode(&page)
                .map_err(|e| Error::new(ErrorKind::Protocol, format!("discovery log: {e}")));
        }
    }
    Err(Error::new(ErrorKind::Protocol, "discovery log kept changing while being read"))
}
