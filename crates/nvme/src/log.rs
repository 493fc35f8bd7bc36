//! Log pages (NVMe 2.0 §5.16): the Get Log Page command and the pages qpath serves or reads.

use crate::ids::{AnaGrpId, Cntlid, Nsid};
use crate::sqe::Sqe;
use crate::wire::{get_str, get_u8, get_u16, get_u32, get_u64, put_str, put_u8, put_u16, put_u32, put_u64};

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FW_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const CMD_EFFECTS: u8 = 0x05;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0c;
    /// Discovery (NVMe-oF).
    pub const DISCOVERY: u8 = 0x70;
}

/// A decoded Get Log Page command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    /// Log page identifier.
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain Asynchronous Event: when clear, reading the page re-arms its event.
    pub rae: bool,
    /// Bytes to return.
    pub len: u64,
    /// Byte offset into the page.
    pub offset: u64,
    /// Namespace, for namespace-scoped pages.
    pub nsid: Nsid,
}

impl GetLogPage {
    /// Decodes CDW10-13 (NUMDL/NUMDU are a 0's based dword count; LPOL/LPOU a byte offset).
    pub fn from_sqe(s: &Sqe) -> GetLogPage {
        let cdw10 = s.cdw(10);
        let numd = u64::from(cdw10 >> 16) | (u64::from(s.cdw(11) & 0xffff) << 16);
        GetLogPage {
            lid: (cdw10 & 0xff) as u8,
            lsp: ((cdw10 >> 8) & 0x7f) as u8,
            rae: cdw10 & (1 << 15) != 0,
            len: (numd + 1) * 4,
            offset: u64::from(s.cdw(12)) | (u64::from(s.cdw(13)) << 32),
            nsid: s.nsid(),
        }
    }
}

/// ANA states (NVMe 2.0 §8.1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum AnaState {
    /// ANA Optimized.
    Optimized = 0x01,
    /// ANA Non-Optimized.
    NonOptimized = 0x02,
    /// ANA Inaccessible.
    Inaccessible = 0x03,
    /// ANA Persistent Loss.
    PersistentLoss = 0x04,
    /// ANA Change (in transition).
    Change = 0x0f,
}

impl AnaState {
    /// Decodes the low nibble of the state byte.
    pub fn from_u8(v: u8) -> Option<AnaState> {
        match v & 0x0f {
            0x01 => Some(AnaState::Optimized),
            0x02 => Some(AnaState::NonOptimized),
            0x03 => Some(AnaState::Inaccessible),
            0x04 => Some(AnaState::PersistentLoss),
            0x0f => Some(AnaState::Change),
            _ => None,
        }
    }

    /// Whether I/O may be sent to a namespace in this state.
    pub fn is_accessible(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }

    /// The name Linux prints in sysfs `ana_state`.
    pub fn linux_name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    /// Parses the Linux sysfs names (and a few short forms).
    pub fn parse(s: &str) -> Option<AnaState> {
        match s {
            "optimized" | "opt" => Some(AnaState::Optimized),
            "non-optimized" | "non_optimized" | "nonopt" => Some(AnaState::NonOptimized),
            "inaccessible" => Some(AnaState::Inaccessible),
            "persistent-loss" | "persistent_loss" => Some(AnaState::PersistentLoss),
            "change" => Some(AnaState::Change),
            _ => None,
        }
    }
}

/// One ANA group descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroupDesc {
    /// Group id.
    pub grpid: AnaGrpId,
    /// Change count of this group.
    pub chgcnt: u64,
    /// State of the group as seen through the controller that returns the page.
    pub state: AnaState,
    /// Namespaces in the group (omitted when LSP bit 0, "RGO", is set).
    pub nsids: Vec<Nsid>,
}

/// The ANA log page (LID 0Ch).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AnaLog {
    /// Change count of the whole page.
    pub chgcnt: u64,
    /// Group descriptors.
    pub groups: Vec<AnaGroupDesc>,
}

/// LSP bit 0 of the ANA log: Return Groups Only.
pub const ANA_LSP_RGO: u8 = 1;

impl AnaLog {
    /// Encodes the page (NSID lists dropped when `groups_only`).
    pub fn encode(&self, groups_only: bool) -> Vec<u8> {
        let mut out = vec![0u8; 16];
        put_u64(&mut out, 0, self.chgcnt);
        put_u16(&mut out, 8, u16::try_from(self.groups.len()).unwrap_or(u16::MAX));
        for g in &self.groups {
            let n = if groups_only { 0 } else { g.nsids.len() };
            let base = out.len();
            out.resize(base + 32 + n * 4, 0);
            put_u32(&mut out, base, g.grpid.0);
            put_u32(&mut out, base + 4, u32::try_from(n).unwrap_or(u32::MAX));
            put_u64(&mut out, base + 8, g.chgcnt);
            put_u8(&mut out, base + 16, g.state as u8);
            if !groups_only {
                for (i, ns) in g.nsids.iter().enumerate() {
                    put_u32(&mut out, base + 32 + i * 4, ns.0);
                }
            }
        }
        out
    }

    /// Decodes a page, bounded by the buffer: a descriptor that claims more
    /// NSIDs than fit ends the decode with an error.
    pub fn decode(b: &[u8]) -> Result<AnaLog, LogDecodeError> {
        if b.len() < 16 {
            return Err(LogDecodeError::Truncated);
        }
        let ngrps = usize::from(get_u16(b, 8));
        let mut log = AnaLog { chgcnt: get_u64(b, 0), groups: Vec::with_capacity(ngrps.min(1024)) };
        let mut o = 16usize;
        for _ in 0..ngrps {
            if o + 32 > b.len() {
                return Err(LogDecodeError::Truncated);
            }
            let nnsids = get_u32(b, o + 4) as usize;
            let end = nnsids.checked_mul(4).and_then(|x| x.checked_add(o + 32)).ok_or(LogDecodeError::Truncated)?;
            if end > b.len() {
                return Err(LogDecodeError::Truncated);
            }
            let state = AnaState::from_u8(get_u8(b, o + 16)).ok_or(LogDecodeError::BadValue { offset: o + 16 })?;
            log.groups.push(AnaGroupDesc {
                grpid: AnaGrpId(get_u32(b, o)),
                chgcnt: get_u64(b, o + 8),
                state,
                nsids: (0..nnsids).map(|i| Nsid(get_u32(b, o + 32 + i * 4))).collect(),
            });
            o = end;
        }
        Ok(log)
    }

    /// Size in bytes of the header plus `ngroups` descriptors and `nnsids` NSIDs.
    pub fn size(ngroups: usize, nnsids: usize) -> usize {
        16 + ngroups * 32 + nnsids * 4
    }
}

/// A log page could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogDecodeError {
    /// The page is shorter than its own header says.
    #[error("log page truncated")]
    Truncated,
    /// A field holds a value the spec does not define.
    #[error("invalid value at byte {offset}")]
    BadValue {
        /// Byte offset of the field.
        offset: usize,
    },
}

/// Transport types in discovery entries.
pub mod trtype {
    /// RDMA.
    pub const RDMA: u8 = 1;
    /// Fibre Channel.
    pub const FC: u8 = 2;
    /// TCP.
    pub const TCP: u8 = 3;
    /// Intra-host loop.
    pub const LOOP: u8 = 254;
}

/// Address families in discovery entries.
pub mod adrfam {
    /// IPv4.
    pub const IPV4: u8 = 1;
    /// IPv6.
    pub const IPV6: u8 = 2;
}

/// Discovery entry subsystem types.
pub mod subtype {
    /// A referral to another discovery service.
    pub const REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The current discovery subsystem.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Discovery log page entry flags (EFLAGS; NVMe Base 2.0, Discovery Log Page Entry).
pub mod eflags {
    /// Duplicate Returned Information: connecting to this entry's discovery controller
    /// returns the same information as the controller that reported it.
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery: the discovery controller keeps
    /// a connection alive (Keep Alive) and reports log changes (Asynchronous Event Request).
    pub const EPCSD: u16 = 1 << 1;
}

/// Size of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_SIZE: usize = 1024;

/// One discovery log page entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type.
    pub trtype: u8,
    /// Address family.
    pub adrfam: u8,
    /// Subsystem type.
    pub subtype: u8,
    /// Transport requirements (bits 1:0 secure channel: 1 required, 2 not required).
    pub treq: u8,
    /// Port id.
    pub portid: u16,
    /// Controller id (0xFFFF: dynamic).
    pub cntlid: Cntlid,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags (bit 0 duplicate returned information, bit 1 explicit persistent connection support).
    pub eflags: u16,
    /// Transport service id (the TCP port as decimal text).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address.
    pub traddr: String,
    /// Transport specific address subtype (TCP: byte 0 = security type).
    pub tsas: [u8; 256],
}

impl DiscoveryEntry {
    /// Encodes into 1024 bytes.
    pub fn encode(&self, b: &mut [u8]) {
        put_u8(b, 0, self.trtype);
        put_u8(b, 1, self.adrfam);
        put_u8(b, 2, self.subtype);
        put_u8(b, 3, self.treq);
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid.0);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_str(b, 32, 32, self.trsvcid.as_bytes(), b' ');
        put_str(b, 256, 256, self.subnqn.as_bytes(), 0);
        put_str(b, 512, 256, self.traddr.as_bytes(), b' ');
        if let Some(t) = b.get_mut(768..1024) {
            t.copy_from_slice(&self.tsas);
        }
    }

    /// Decodes from 1024 bytes.
    pub fn decode(b: &[u8]) -> DiscoveryEntry {
        let mut tsas = [0u8; 256];
        if let Some(t) = b.get(768..1024) {
            tsas.copy_from_slice(t);
        }
        DiscoveryEntry {
            trtype: get_u8(b, 0),
            adrfam: get_u8(b, 1),
            subtype: get_u8(b, 2),
            treq: get_u8(b, 3),
            portid: get_u16(b, 4),
            cntlid: Cntlid(get_u16(b, 6)),
            asqsz: get_u16(b, 8),
            eflags: get_u16(b, 10),
            trsvcid: get_str(b, 32, 32),
            subnqn: get_str(b, 256, 256),
            traddr: get_str(b, 512, 256),
            tsas,
        }
    }
}

/// The discovery log page (LID 70h).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DiscoveryLog {
    /// Generation counter: changes whenever the entries change.
    pub genctr: u64,
    /// Record format (0).
    pub recfmt: u16,
    /// Entries.
    pub entries: Vec<DiscoveryEntry>,
}

impl DiscoveryLog {
    /// Encodes the whole page.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; DISCOVERY_RECORD_SIZE * (1 + self.entries.len())];
        put_u64(&mut out, 0, self.genctr);
        put_u64(&mut out, 8, self.entries.len() as u64);
        put_u16(&mut out, 16, self.recfmt);
        for (i, e) in self.entries.iter().enumerate() {
            let o = DISCOVERY_RECORD_SIZE * (i + 1);
            e.encode(&mut out[o..o + DISCOVERY_RECORD_SIZE]);
        }
        out
    }

    /// Number of records the header announces.
    pub fn numrec(header: &[u8]) -> u64 {
        get_u64(header, 8)
    }

    /// Decodes a page; entries beyond the buffer are an error.
    pub fn decode(b: &[u8]) -> Result<DiscoveryLog, LogDecodeError> {
        if b.len() < DISCOVERY_RECORD_SIZE {
            return Err(LogDecodeError::Truncated);
        }
        let numrec = get_u64(b, 8);
        let avail = (b.len() / DISCOVERY_RECORD_SIZE - 1) as u64;
        if numrec > avail {
            return Err(LogDecodeError::Truncated);
        }
        let entries = (0..usize::try_from(numrec).unwrap_or(0))
            .map(|i| {
                let o = DISCOVERY_RECORD_SIZE * (i + 1);
                DiscoveryEntry::decode(&b[o..o + DISCOVERY_RECORD_SIZE])
            })
            .collect();
        Ok(DiscoveryLog { genctr: get_u64(b, 0), recfmt: get_u16(b, 16), entries })
    }
}

/// Size of one error information log entry.
pub const ERROR_LOG_ENTRY_SIZE: usize = 64;

/// One Error Information log entry (LID 01h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ErrorLogEntry {
    /// Unique, increasing error count (0 = empty entry).
    pub error_count: u64,
    /// Submission queue id.
    pub sqid: u16,
    /// Command id.
    pub cid: u16,
    /// Status field (the 15 status bits shifted as in a CQE).
    pub status: u16,
    /// Parameter error location (byte in bits 7:0, bit in 10:8; 0xFFFF = n/a).
    pub param_error_location: u16,
    /// LBA of the error.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorLogEntry {
    /// Encodes into 64 bytes.
    pub fn encode(&self, b: &mut [u8]) {
        put_u64(b, 0, self.error_count);
        put_u16(b, 8, self.sqid);
        put_u16(b, 10, self.cid);
        put_u16(b, 12, self.status);
        put_u16(b, 14, self.param_error_location);
        put_u64(b, 16, self.lba);
        put_u32(b, 24, self.nsid);
    }

    /// Decodes from 64 bytes.
    pub fn decode(b: &[u8]) -> ErrorLogEntry {
        ErrorLogEntry {
            error_count: get_u64(b, 0),
            sqid: get_u16(b, 8),
            cid: get_u16(b, 10),
            status: get_u16(b, 12),
            param_error_location: get_u16(b, 14),
            lba: get_u64(b, 16),
            nsid: get_u32(b, 24),
        }
    }
}

/// Size of the SMART / Health log.
pub const SMART_LOG_SIZE: usize = 512;

/// SMART / Health Information (LID 02h), the counters a fabrics target can report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SmartLog {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature in kelvins.
    pub temperature_k: u16,
    /// Available spare, percent.
    pub avail_spare: u8,
    /// Available spare threshold, percent.
    pub spare_thresh: u8,
    /// Percentage used.
    pub percent_used: u8,
    /// Data units read, in thousands of 512-byte units.
    pub data_units_read: u64,
    /// Data units written, in thousands of 512-byte units.
    pub data_units_written: u64,
    /// Host read commands.
    pub host_reads: u64,
    /// Host write commands.
    pub host_writes: u64,
    /// Power on hours.
    pub power_on_hours: u64,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u64,
    /// Media and data integrity errors.
    pub media_errors: u64,
    /// Number of error information log entries.
    pub num_err_log_entries: u64,
}

impl SmartLog {
    /// Encodes into 512 bytes (128-bit counters keep their high half zero).
    pub fn encode(&self) -> [u8; SMART_LOG_SIZE] {
        let mut b = [0u8; SMART_LOG_SIZE];
        put_u8(&mut b, 0, self.critical_warning);
        put_u16(&mut b, 1, self.temperature_k);
        put_u8(&mut b, 3, self.avail_spare);
        put_u8(&mut b, 4, self.spare_thresh);
        put_u8(&mut b, 5, self.percent_used);
        put_u64(&mut b, 32, self.data_units_read);
        put_u64(&mut b, 48, self.data_units_written);
        put_u64(&mut b, 64, self.host_reads);
        put_u64(&mut b, 80, self.host_writes);
        put_u64(&mut b, 128, self.power_on_hours);
        put_u64(&mut b, 144, self.unsafe_shutdowns);
        put_u64(&mut b, 160, self.media_errors);
        put_u64(&mut b, 176, self.num_err_log_entries);
        b
    }

    /// Decodes from 512 bytes.
    pub fn decode(b: &[u8]) -> SmartLog {
        SmartLog {
            critical_warning: get_u8(b, 0),
            temperature_k: get_u16(b, 1),
            avail_spare: get_u8(b, 3),
            spare_thresh: get_u8(b, 4),
            percent_used: get_u8(b, 5),
            data_units_read: get_u64(b, 32),
            data_units_written: get_u64(b, 48),
            host_reads: get_u64(b, 64),
            host_writes: get_u64(b, 80),
            power_on_hours: get_u64(b, 128),
            unsafe_shutdowns: get_u64(b, 144),
            media_errors: get_u64(b, 160),
            num_err_log_entries: get_u64(b, 176),
        }
    }
}

/// Changed Namespace List (LID 04h): up to 1024 NSIDs; a list that overflowed
/// has 0xFFFFFFFF as its first entry.
pub fn encode_changed_ns_list(nsids: &[Nsid]) -> [u8; 4096] {
    let mut b = [0u8; 4096];
    if nsids.len() > 1024 {
        put_u32(&mut b, 0, 0xffff_ffff);
    } else {
        for (i, n) in nsids.iter().enumerate() {
            put_u32(&mut b, i * 4, n.0);
        }
    }
    b
}

/// Reads a Changed Namespace List; `None` means "more than 1024 changed: rescan all".
pub fn decode_changed_ns_list(b: &[u8]) -> Option<Vec<Nsid>> {
    if get_u32(b, 0) == 0xffff_ffff {
        return None;
    }
    Some(crate::identify::decode_ns_list(b))
}

/// Copies `[offset, offset+len)` of a log page into `out`, zero-filling past its end
/// (NVMe 2.0 §5.16: data beyond the page reads as zero... unless the offset itself is
/// past the end, which is an error the caller reports).
pub fn slice_page(page: &[u8], offset: u64, out: &mut [u8]) {
    out.fill(0);
    let Ok(off) = usize::try_from(offset) else {
        return;
    };
    if off < page.len() {
        let n = (page.len() - off).min(out.len());
        out[..n].copy_from_slice(&page[off..off + n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ana_log_round_trip() {
        let log = AnaLog {
            chgcnt: 3,
            groups: vec![
                AnaGroupDesc {
                    grpid: AnaGrpId(1),
                    chgcnt: 2,
                    state: AnaState::Optimized,
                    nsids: vec![Nsid(1), Nsid(2)],
                },
                AnaGroupDesc { grpid: AnaGrpId(2), chgcnt: 1, state: AnaState::Inaccessible, nsids: vec![] },
            ],
        };
        let b = log.encode(false);
        assert_eq!(b.len(), AnaLog::size(2, 2));
        assert_eq!(AnaLog::decode(&b).unwrap(), log);
        let go = AnaLog::decode(&log.encode(true)).unwrap();
        assert!(go.groups.iter().all(|g| g.nsids.is_empty()));
    }

    #[test]
    fn ana_log_rejects_lying_counts() {
        let mut b = AnaLog {
            chgcnt: 1,
            groups: vec![AnaGroupDesc { grpid: AnaGrpId(1), chgcnt: 0, state: AnaState::Optimized, nsids: vec![] }],
        }
        .encode(false);
        put_u32(&mut b, 16 + 4, u32::MAX);
        assert_eq!(AnaLog::decode(&b), Err(LogDecodeError::Truncated));
        put_u16(&mut b, 8, 9);
        assert!(AnaLog::decode(&b).is_err());
    }

    #[test]
    fn discovery_round_trip() {
        let e = DiscoveryEntry {
            trtype: trtype::TCP,
            adrfam: adrfam::IPV4,
            subtype: subtype::NVM,
            treq: 2,
            portid: 1,
            cntlid: Cntlid(0xffff),
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.2024-01.io.qpath:a".into(),
            traddr: "127.0.0.1".into(),
            tsas: [0; 256],
        };
        let log = DiscoveryLog { genctr: 7, recfmt: 0, entries: vec![e.clone(), e] };
        let b = log.encode();
        assert_eq!(b.len(), 3 * 1024);
        assert_eq!(&b[1024 + 32..1024 + 36], b"4420");
        assert_eq!(DiscoveryLog::decode(&b).unwrap(), log);
        assert_eq!(DiscoveryLog::decode(&b[..2048]), Err(LogDecodeError::Truncated));
    }

    #[test]
    fn get_log_page_decode() {
        let s = Sqe::get_log_page(crate::Cid(1), Nsid(0xffff_ffff), lid::ANA, 1, false, 1 << 20, 4096);
        let g = GetLogPage::from_sqe(&s);
        assert_eq!((g.lid, g.lsp, g.rae, g.len, g.offset), (lid::ANA, 1, false, 1 << 20, 4096));
    }

    #[test]
    fn slicing() {
        let page = [1u8, 2, 3, 4];
        let mut out = [9u8; 6];
        slice_page(&page, 2, &mut out);
        assert_eq!(out, [3, 4, 0, 0, 0, 0]);
        slice_page(&page, u64::MAX, &mut out);
        assert_eq!(out, [0; 6]);
    }
}
