//! Log pages (NVMe 2.0 §5.16): the Get Log Page command and the pages qpath serves or reads.

use crate::ids::{AnaGrpId, Cntlid, Nsid};
use crate::sqe::Sqe;
use crate::wire::{get_str, get_u8, get_u16, get_u32, get_u64, put_str, put_u8, put_u16, put_u32, put_u64};

/// Log page identifiers.
pub mod lid {
    /// Supported Log Pages (NVMe Base 2.0 §5.16.1.1).
    pub const SUPPORTED: u8 = 0x00;
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
    /// Feature Identifiers Supported and Effects.
    pub const FEATURE_EFFECTS: u8 = 0x12;
    /// NVMe-MI Commands Supported and Effects.
    pub const MI_EFFECTS: u8 = 0x13;
    /// Discovery (NVMe-oF).
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification (an I/O Command Set specific page).
    pub const RESERVATION: u8 = 0x80;
}

/// Size of the pages that hold one dword per identifier, 256 of them: Supported Log
/// Pages (per LID) and Feature Identifiers Supported and Effects (per FID).
pub const ID_TABLE_SIZE: usize = 1024;

/// Size of the Commands Supported and Effects page (256 admin dwords, 256 I/O dwords,
/// 2048 reserved bytes) and of the NVMe-MI Commands Supported and Effects page.
pub const CMD_EFFECTS_SIZE: usize = 4096;

/// LID Supported and Effects data structure, one per entry of the Supported Log Pages
/// page (NVMe Base 2.0 §5.16.1.1).
pub mod lid_support {
    /// LSUPP: the log page is supported.
    pub const LSUPP: u32 = 1 << 0;
    /// IOS: Index Offset Supported (offsets in entries rather than bytes).
    pub const IOS: u32 = 1 << 1;
}

/// Commands Supported and Effects data structure, one per opcode (NVMe Base 2.0
/// §5.16.1.6; the same layout as Linux `NVME_CMD_EFFECTS_*`, SPDK
/// `spdk_nvme_cmds_and_effect_entry`).
pub mod cmd_effects {
    /// CSUPP: the command is supported.
    pub const CSUPP: u32 = 1 << 0;
    /// LBCC: the command may change the contents of logical blocks.
    pub const LBCC: u32 = 1 << 1;
    /// NCC: the command may change namespace capabilities.
    pub const NCC: u32 = 1 << 2;
    /// NIC: the command may change the number of namespaces or their attachment.
    pub const NIC: u32 = 1 << 3;
    /// CCC: the command may change controller capabilities.
    pub const CCC: u32 = 1 << 4;
    /// CSE 001b: submit only with no other command outstanding to the same namespace.
    pub const CSE_SAME_NS: u32 = 1 << 16;
    /// CSE 010b: submit only with no other command outstanding to any namespace.
    pub const CSE_ANY_NS: u32 = 2 << 16;
    /// Command Scope: the command acts on namespaces (CSP bit 0).
    pub const NSCPE: u32 = 1 << 20;
    /// Command Scope: the command acts on the controller (CSP bit 1).
    pub const CSCPE: u32 = 1 << 21;
    /// Command Scope: the command acts on the NVM subsystem (CSP bit 5).
    pub const NSSCPE: u32 = 1 << 25;
}

/// FID Supported and Effects data structure, one per entry of the Feature Identifiers
/// Supported and Effects page (NVMe Base 2.0 §5.16.1, LID 12h; Linux `NVME_FIS_*`).
pub mod fid_effects {
    /// FSUPP: the feature is supported.
    pub const FSUPP: u32 = 1 << 0;
    /// UDCC: changing the feature may change user data.
    pub const UDCC: u32 = 1 << 1;
    /// NCC: changing the feature may change namespace capabilities.
    pub const NCC: u32 = 1 << 2;
    /// NIC: changing the feature may change the namespace inventory.
    pub const NIC: u32 = 1 << 3;
    /// CCC: changing the feature may change controller capabilities.
    pub const CCC: u32 = 1 << 4;
    /// Feature Scope: the feature is namespace specific (FSP bit 0).
    pub const NSCPE: u32 = 1 << 20;
    /// Feature Scope: the feature applies to the controller (FSP bit 1).
    pub const CSCPE: u32 = 1 << 21;
    /// Feature Scope: the feature applies to the NVM subsystem (FSP bit 5).
    pub const NSSCPE: u32 = 1 << 25;
}

/// A page of one dword per identifier (LID, FID): `entries` set, the rest zero.
pub fn encode_id_table(entries: impl IntoIterator<Item = (u8, u32)>) -> [u8; ID_TABLE_SIZE] {
    let mut b = [0u8; ID_TABLE_SIZE];
    for (id, v) in entries {
        put_u32(&mut b, usize::from(id) * 4, v);
    }
    b
}

/// Reads a page of one dword per identifier (missing entries of a short buffer read 0).
pub fn decode_id_table(b: &[u8]) -> [u32; 256] {
    std::array::from_fn(|i| if b.len() >= i * 4 + 4 { get_u32(b, i * 4) } else { 0 })
}

/// The Commands Supported and Effects page (LID 05h): one dword per admin opcode, one
/// per I/O opcode of the command set asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandEffects {
    /// Admin Command Supported (ACS0..ACS255).
    pub admin: [u32; 256],
    /// I/O Command Supported (IOCS0..IOCS255).
    pub io: [u32; 256],
}

impl Default for CommandEffects {
    fn default() -> Self {
        CommandEffects { admin: [0; 256], io: [0; 256] }
    }
}

impl CommandEffects {
    /// Encodes the 4096-byte page.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CMD_EFFECTS_SIZE];
        for (i, v) in self.admin.iter().chain(self.io.iter()).enumerate() {
            put_u32(&mut b, i * 4, *v);
        }
        b
    }

    /// Decodes a page (entries past a short buffer read 0).
    pub fn decode(b: &[u8]) -> CommandEffects {
        let admin = decode_id_table(b);
        let io = decode_id_table(b.get(ID_TABLE_SIZE..).unwrap_or(&[]));
        CommandEffects { admin, io }
    }
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
    /// Command Set Identifier (CDW14 bits 31:24), for command set specific pages.
    pub csi: u8,
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
            csi: (s.cdw(14) >> 24) as u8,
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
/// Bytes of the ANA log's header.
pub const ANA_LOG_HEADER_SIZE: usize = 16;
/// Bytes of one ANA group descriptor, before its NSIDs.
pub const ANA_GROUP_DESC_SIZE: usize = 32;

impl AnaLog {
    /// Encodes the page (NSID lists dropped when `groups_only`).
    pub fn encode(&self, groups_only: bool) -> Vec<u8> {
        let mut out = vec![0u8; ANA_LOG_HEADER_SIZE];
        put_u64(&mut out, 0, self.chgcnt);
        put_u16(&mut out, 8, u16::try_from(self.groups.len()).unwrap_or(u16::MAX));
        for g in &self.groups {
            let n = if groups_only { 0 } else { g.nsids.len() };
            let base = out.len();
            out.resize(base + ANA_GROUP_DESC_SIZE + n * 4, 0);
            put_u32(&mut out, base, g.grpid.0);
            put_u32(&mut out, base + 4, u32::try_from(n).unwrap_or(u32::MAX));
            put_u64(&mut out, base + 8, g.chgcnt);
            put_u8(&mut out, base + 16, g.state as u8);
            if !groups_only {
                for (i, ns) in g.nsids.iter().enumerate() {
                    put_u32(&mut out, base + ANA_GROUP_DESC_SIZE + i * 4, ns.0);
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
    /// Transport Type of the transport the error is related to (the discovery log's
    /// TRTYPE values; 0 when the error is not transport related).
    pub trtype: u8,
}

/// Parameter Error Location when no single field is at fault (NVMe Base 2.0 §5.16.1.2).
pub const NO_ERROR_LOCATION: u16 = 0xffff;

/// A Parameter Error Location: bits 7:0 the byte of the command, bits 10:8 the bit.
pub const fn error_location(byte: u8, bit: u8) -> u16 {
    (byte as u16) | (((bit & 7) as u16) << 8)
}

impl ErrorLogEntry {
    /// Encodes into 64 bytes (NVMe Base 2.0 §5.16.1.2: error count 0-7, SQID 8-9, CID
    /// 10-11, status field 12-13 (bits 15:1 the CQE's status, bit 0 the phase tag), parameter
    /// error location 14-15, LBA 16-23, NSID 24-27, vendor specific information 28,
    /// TRTYPE 29, command specific information 32-39, transport specific 40-41).
    pub fn encode(&self, b: &mut [u8]) {
        put_u64(b, 0, self.error_count);
        put_u16(b, 8, self.sqid);
        put_u16(b, 10, self.cid);
        put_u16(b, 12, self.status);
        put_u16(b, 14, self.param_error_location);
        put_u64(b, 16, self.lba);
        put_u32(b, 24, self.nsid);
        put_u8(b, 29, self.trtype);
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
            trtype: get_u8(b, 29),
        }
    }
}

/// Size of the SMART / Health log.
pub const SMART_LOG_SIZE: usize = 512;

/// SMART / Health Information (LID 02h, NVMe Base 2.0 §5.16.1.3), the counters a fabrics
/// target can report. The 128-bit counters keep their high half zero.
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
    /// Controller busy time, minutes.
    pub ctrl_busy_minutes: u64,
    /// Power cycles.
    pub power_cycles: u64,
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
        put_u64(&mut b, 96, self.ctrl_busy_minutes);
        put_u64(&mut b, 112, self.power_cycles);
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
            ctrl_busy_minutes: get_u64(b, 96),
            power_cycles: get_u64(b, 112),
            power_on_hours: get_u64(b, 128),
            unsafe_shutdowns: get_u64(b, 144),
            media_errors: get_u64(b, 160),
            num_err_log_entries: get_u64(b, 176),
        }
    }
}

/// SMART Data Units: thousands of 512-byte units, rounded up (NVMe Base 2.0 §5.16.1.3:
/// 1 stands for 1 to 1,000 units; other block sizes are converted to 512-byte units).
pub fn data_units(bytes: u64) -> u64 {
    (bytes / 512).div_ceil(1000)
}

/// Size of one Reservation Notification log page.
pub const RESV_NOTIFICATION_SIZE: usize = 64;

/// Reservation Notification Log Page Type values (and the bit of each in the Reservation
/// Notification Mask feature, FID 82h: `1 << type`).
pub mod resv_notice {
    /// Empty log page: nothing was waiting.
    pub const EMPTY: u8 = 0;
    /// Registration Preempted: another host's preempt removed this host's registration.
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    /// Reservation Released: the holder released or gave up a reservation whose type
    /// gives registrants access.
    pub const RESERVATION_RELEASED: u8 = 2;
    /// Reservation Preempted: another host cleared the reservation and registrations.
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// One Reservation Notification log page (LID 80h): reading it takes the oldest waiting
/// notification off the controller's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ResvNotification {
    /// Log Page Count: increments with every notification, wraps to 1; 0 is an empty page.
    /// A jump of more than one means notifications were lost.
    pub count: u64,
    /// Reservation Notification Log Page Type ([`resv_notice`]).
    pub notice: u8,
    /// Number of Available Log Pages: how many more wait after this one (at most 255).
    pub available: u8,
    /// The namespace it is about.
    pub nsid: Nsid,
}

impl ResvNotification {
    /// Encodes the 64-byte page (count 0-7, type 8, available 9, NSID 12-15).
    pub fn encode(&self) -> [u8; RESV_NOTIFICATION_SIZE] {
        let mut b = [0u8; RESV_NOTIFICATION_SIZE];
        put_u64(&mut b, 0, self.count);
        put_u8(&mut b, 8, self.notice);
        put_u8(&mut b, 9, self.available);
        put_u32(&mut b, 12, self.nsid.0);
        b
    }

    /// Decodes a page.
    pub fn decode(b: &[u8]) -> ResvNotification {
        ResvNotification {
            count: get_u64(b, 0),
            notice: get_u8(b, 8),
            available: get_u8(b, 9),
            nsid: Nsid(get_u32(b, 12)),
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
    fn id_tables_and_command_effects_round_trip() {
        let t = encode_id_table([(lid::SUPPORTED, lid_support::LSUPP), (lid::RESERVATION, lid_support::LSUPP)]);
        // Entry n at byte 4n, little-endian (Linux `struct nvme_supported_log`).
        assert_eq!(&t[0..4], &[1, 0, 0, 0]);
        assert_eq!(&t[0x80 * 4..0x80 * 4 + 4], &[1, 0, 0, 0]);
        let d = decode_id_table(&t);
        assert_eq!(d.iter().filter(|&&v| v != 0).count(), 2);
        let mut e = CommandEffects::default();
        e.admin[0x02] = cmd_effects::CSUPP | cmd_effects::CSCPE;
        e.io[0x01] = cmd_effects::CSUPP | cmd_effects::LBCC | cmd_effects::NSCPE;
        let b = e.encode();
        assert_eq!(b.len(), CMD_EFFECTS_SIZE);
        // IOCS1 at byte 1024 + 4: 0x0010_0003 (nvme-cli prints "00100003").
        assert_eq!(get_u32(&b, 1024 + 4), 0x0010_0003);
        assert_eq!(CommandEffects::decode(&b), e);
    }

    #[test]
    fn reservation_notification_and_error_entry_layouts() {
        let n = ResvNotification { count: 7, notice: resv_notice::RESERVATION_RELEASED, available: 2, nsid: Nsid(3) };
        let b = n.encode();
        assert_eq!((b[8], b[9], get_u32(&b, 12)), (2, 2, 3));
        assert_eq!(ResvNotification::decode(&b), n);
        let e = ErrorLogEntry {
            error_count: 1,
            sqid: 1,
            cid: 9,
            status: 0x4002 << 1,
            param_error_location: error_location(40, 0),
            lba: 77,
            nsid: 1,
            trtype: trtype::TCP,
        };
        let mut b = [0u8; ERROR_LOG_ENTRY_SIZE];
        e.encode(&mut b);
        assert_eq!(b[29], 3);
        assert_eq!(ErrorLogEntry::decode(&b), e);
        assert_eq!(error_location(39, 4), 0x0427);
    }

    #[test]
    fn data_units_round_up_to_thousands_of_512_byte_units() {
        assert_eq!(data_units(0), 0);
        assert_eq!(data_units(512), 1);
        assert_eq!(data_units(512 * 1000), 1);
        assert_eq!(data_units(512 * 1001), 2);
        assert_eq!(data_units(4096 * 1000), 8);
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
