//! Admin and Fabrics commands the host issues during bring-up and from its
//! admin thread, over a [`SyncQueue`].

use std::time::{Duration, Instant};

use nvme::fabrics::{Cap, Cc, PropertyCmd, csts, prop};
use nvme::identify::{
    IDENTIFY_SIZE, IdentifyController, IdentifyNamespace, NsIdDesc, cns, decode_ns_descs, decode_ns_list,
};
use nvme::log::{AnaLog, DiscoveryLog, lid};
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

/// Enables the controller (CC.EN = 1) and waits for CSTS.RDY within CAP.TO (NVMe 2.0 §3.5.1).
pub fn enable(q: &mut SyncQueue) -> Result<Cap> {
    let cap = Cap::from_u64(prop_get(q, prop::CAP, true)?);
    prop_set(q, prop::CC, false, u64::from(Cc::enable_value().0))?;
    let deadline = Instant::now() + Duration::from_millis(500 * u64::from(cap.to.max(1)));
    loop {
        let s = u32::try_from(prop_get(q, prop::CSTS, false)? & 0xffff_ffff).unwrap_or(0);
        if s & csts::CFS != 0 {
            return Err(Error::new(ErrorKind::Protocol, "controller fatal status while enabling"));
        }
        if s & csts::RDY != 0 {
            return Ok(cap);
        }
        if Instant::now() > deadline {
            return Err(Error::new(ErrorKind::Timeout, "CSTS.RDY not set within CAP.TO"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
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

/// Identify Controller.
pub fn identify_controller(q: &mut SyncQueue) -> Result<IdentifyController> {
    let (_, d) = q.read_data(Sqe::identify(Cid(0), cns::CONTROLLER, Nsid(0), 0, 0), IDENTIFY_SIZE, ADMIN_TIMEOUT)?;
    Ok(IdentifyController::decode(&d))
}

/// Every active NSID (following the list past 1024 entries).
pub fn active_namespaces(q: &mut SyncQueue) -> Result<Vec<Nsid>> {
    let mut all = Vec::new();
    let mut after = Nsid(0);
    loop {
        let (_, d) =
            q.read_data(Sqe::identify(Cid(0), cns::ACTIVE_NS_LIST, after, 0, 0), IDENTIFY_SIZE, ADMIN_TIMEOUT)?;
        let page = decode_ns_list(&d);
        let full = page.len() == 1024;
        let Some(&last) = page.last() else { break };
        all.extend(page);
        if !full {
            break;
        }
        after = last;
    }
    Ok(all)
}

/// Identify Namespace and its identification descriptors.
pub fn identify_namespace(q: &mut SyncQueue, nsid: Nsid) -> Result<(IdentifyNamespace, Vec<NsIdDesc>)> {
    let (_, d) = q.read_data(Sqe::identify(Cid(0), cns::NAMESPACE, nsid, 0, 0), IDENTIFY_SIZE, ADMIN_TIMEOUT)?;
    let id = IdentifyNamespace::decode(&d);
    let descs = match q.read_data(Sqe::identify(Cid(0), cns::NS_DESC_LIST, nsid, 0, 0), IDENTIFY_SIZE, ADMIN_TIMEOUT) {
        Ok((_, d)) => decode_ns_descs(&d),
        Err(e) if e.kind == ErrorKind::Status => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok((id, descs))
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

/// The ANA log, sized by the controller's ANAGRPMAX and the number of namespaces.
pub fn ana_log(q: &mut SyncQueue, id: &IdentifyController, nns: usize) -> Result<AnaLog> {
    let len = AnaLog::size(usize::try_from(id.nanagrpid.max(1)).unwrap_or(1), nns.max(1024));
    let d = get_log(q, lid::ANA, 0, false, len.next_multiple_of(4), 64 * 1024)?;
    AnaLog::decode(&d).map_err(|e| Error::new(ErrorKind::Protocol, format!("ANA log: {e}")))
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
