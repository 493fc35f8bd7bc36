//! Identify data structures (NVMe 2.0 §5.17.2; NVM Command Set 1.0 §4.1.5).
//!
//! Each structure is a plain Rust value with `encode()` (target side, into
//! the 4096-byte Identify buffer) and `decode()` (host side). Only the fields
//! qpath produces or consumes are named; the rest stay zero.

use crate::ids::{AnaGrpId, Cntlid, Nsid};
use crate::wire::{get_str, get_u8, get_u16, get_u32, get_u64, put_str, put_u8, put_u16, put_u32, put_u64};

/// Size of every Identify data structure.
pub const IDENTIFY_SIZE: usize = 4096;

/// Controller or Namespace Structure values (CDW10 bits 7:0).
pub mod cns {
    /// Identify Namespace (NVM).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESC_LIST: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace.
    pub const CS_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller.
    pub const CS_CONTROLLER: u8 = 0x06;
    /// I/O Command Set specific active namespace list.
    pub const CS_ACTIVE_NS_LIST: u8 = 0x07;
    /// I/O Command Set independent Identify Namespace.
    pub const CS_INDEP_NAMESPACE: u8 = 0x08;
    /// Identify I/O Command Set data structure.
    pub const IO_COMMAND_SET: u8 = 0x1c;
}

/// Command Set Identifier values.
pub mod csi {
    /// NVM command set.
    pub const NVM: u8 = 0x00;
}

/// Controller type (CNTRLTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ControllerType {
    /// Not reported (NVMe < 1.4).
    Unreported = 0,
    /// I/O controller.
    Io = 1,
    /// Discovery controller.
    Discovery = 2,
    /// Administrative controller.
    Admin = 3,
}

/// CMIC bits.
pub mod cmic {
    /// The subsystem may have more than one port.
    pub const MULTI_PORT: u8 = 1 << 0;
    /// The subsystem may have more than one controller.
    pub const MULTI_CTRL: u8 = 1 << 1;
    /// Asymmetric Namespace Access Reporting.
    pub const ANA: u8 = 1 << 3;
}

/// OAES (Optional Asynchronous Events Supported) bits.
pub mod oaes {
    /// Namespace Attribute Notices.
    pub const NS_ATTR: u32 = 1 << 8;
    /// Firmware Activation Notices.
    pub const FW_ACTIVATION: u32 = 1 << 9;
    /// ANA Change Notices.
    pub const ANA_CHANGE: u32 = 1 << 11;
    /// Discovery Log Page Change Notification.
    pub const DISCOVERY_CHANGE: u32 = 1 << 31;
}

/// ONCS (Optional NVM Command Support) bits.
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Dataset Management.
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Save/Select in Set/Get Features.
    pub const SAVE_SELECT: u16 = 1 << 4;
    /// Reservations.
    pub const RESERVATIONS: u16 = 1 << 5;
    /// Verify.
    pub const VERIFY: u16 = 1 << 7;
    /// Copy.
    pub const COPY: u16 = 1 << 8;
}

/// FUSES (Fused Operation Support) bits (NVMe Base 2.0 §5.17.2.1).
pub mod fuses {
    /// The Compare and Write fused operation.
    pub const COMPARE_AND_WRITE: u16 = 1 << 0;
}

/// OCFS (Optional Copy Formats Supported) bits (NVMe Base 2.0 §5.17.2.1).
pub mod ocfs {
    /// Copy source range entries in descriptor format 0h.
    pub const FORMAT_0: u16 = 1 << 0;
}

/// NWPC (Namespace Write Protection Capabilities) bits, Identify Controller byte 531.
pub mod nwpc {
    /// The No Write Protect and Write Protect states (Set Features 84h).
    pub const WRITE_PROTECT: u8 = 1 << 0;
    /// The Write Protect Until Power Cycle state.
    pub const UNTIL_POWER_CYCLE: u8 = 1 << 1;
    /// The Permanent Write Protect state.
    pub const PERMANENT: u8 = 1 << 2;
}

/// LPA (Log Page Attributes) bits.
pub mod lpa {
    /// SMART / Health log per namespace (an NSID other than 0h and FFFFFFFFh reads that
    /// namespace's counters).
    pub const SMART_PER_NS: u8 = 1 << 0;
    /// Commands Supported and Effects log page (LID 05h).
    pub const CMD_EFFECTS: u8 = 1 << 1;
    /// Extended data for Get Log Page (NUMDU, LPOL/LPOU).
    pub const EXTENDED_DATA: u8 = 1 << 2;
    /// Telemetry Host-Initiated and Controller-Initiated log pages.
    pub const TELEMETRY: u8 = 1 << 3;
    /// Persistent Event log page.
    pub const PERSISTENT_EVENT: u8 = 1 << 4;
    /// Log Page Support (NVMe Base 2.0 §5.17.2.1, Identify Controller LPA bit 5): the Supported Log Pages page
    /// (LID 00h), the Command Scope of each entry of the Commands Supported and Effects
    /// page, the Feature Identifiers Supported and Effects page (LID 12h) and the NVMe-MI
    /// Commands Supported and Effects page (LID 13h) — all four, one bit (libnvme
    /// `NVME_CTRL_LPA_LI0_LI5_LI12_LI13`).
    pub const LOG_PAGE_SUPPORT: u8 = 1 << 5;
}

/// Identify Controller (CNS 01h), the fields qpath uses.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IdentifyController {
    /// PCI vendor id.
    pub vid: u16,
    /// PCI subsystem vendor id.
    pub ssvid: u16,
    /// Serial number (20 ASCII characters, space padded).
    pub sn: String,
    /// Model number (40 ASCII characters).
    pub mn: String,
    /// Firmware revision (8 ASCII characters).
    pub fr: String,
    /// Recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI.
    pub ieee: [u8; 3],
    /// Controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size as a power of two of the minimum page size (0 = none).
    pub mdts: u8,
    /// Controller id.
    pub cntlid: Cntlid,
    /// Version.
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller attributes.
    pub ctratt: u32,
    /// Controller type.
    pub cntrltype: u8,
    /// Command retry delay times in 100 ms units.
    pub crdt: [u16; 3],
    /// Optional admin command support.
    pub oacs: u16,
    /// Abort command limit, 0's based.
    pub acl: u8,
    /// Asynchronous event request limit, 0's based.
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0's based.
    pub elpe: u8,
    /// Keep alive granularity in 100 ms units (0 = keep alive not supported).
    pub kas: u16,
    /// ANA transition time in seconds.
    pub anatt: u8,
    /// ANA capabilities.
    pub anacap: u8,
    /// ANA group identifier maximum.
    pub anagrpmax: u32,
    /// Number of ANA group identifiers.
    pub nanagrpid: u32,
    /// Persistent event log size in 64 KiB units.
    pub pels: u32,
    /// Command Quiesce Time, ms (NVMe Base 2.1 §3.9, TP4129): the worst case for the
    /// controller to quiesce its outstanding commands once it detected a communication
    /// loss; 0 = not reported. Hosts hold a retry of a command whose fate is unknown at
    /// least this long after the loss was detected.
    pub cqt: u16,
    /// SQ entry size: required (3:0) and maximum (7:4) as powers of two.
    pub sqes: u8,
    /// CQ entry size, same encoding.
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (the highest valid NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Fused operation support.
    pub fuses: u16,
    /// Format NVM attributes.
    pub fna: u8,
    /// Volatile write cache (bit 0 present).
    pub vwc: u8,
    /// Atomic write unit normal.
    pub awun: u16,
    /// Atomic write unit power fail.
    pub awupf: u16,
    /// Namespace Write Protection Capabilities ([`nwpc`]).
    pub nwpc: u8,
    /// Optional copy formats supported.
    pub ocfs: u16,
    /// SGL support.
    pub sgls: u32,
    /// Maximum number of allowed namespaces.
    pub mnan: u32,
    /// NVM subsystem NQN.
    pub subnqn: String,
    /// I/O queue command capsule supported size in 16-byte units (fabrics).
    pub ioccsz: u32,
    /// I/O queue response capsule supported size in 16-byte units (fabrics).
    pub iorcsz: u32,
    /// In-capsule data offset in 16-byte units (fabrics).
    pub icdoff: u16,
    /// Fabrics controller attributes (bit 0: static controller model).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors (0 = no limit).
    pub msdbd: u8,
    /// Optional fabric commands supported (bit 0: Disconnect).
    pub ofcs: u16,
}

/// SGLS bits used by NVMe/TCP.
pub mod sgls {
    /// SGLs supported, any dword alignment.
    pub const SUPPORTED: u32 = 1;
    /// Keyed SGL data block descriptor supported.
    pub const KEYED: u32 = 1 << 2;
    /// Offset addressing in SGL data block descriptors (needed for in-capsule data).
    pub const OFFSET: u32 = 1 << 20;
    /// Transport SGL data block descriptor supported.
    pub const TRANSPORT: u32 = 1 << 21;
}

impl IdentifyController {
    /// Encodes into the 4096-byte structure.
    pub fn encode(&self) -> Box<[u8; IDENTIFY_SIZE]> {
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        let b_ = &mut b[..];
        put_u16(b_, 0, self.vid);
        put_u16(b_, 2, self.ssvid);
        put_str(b_, 4, 20, self.sn.as_bytes(), b' ');
        put_str(b_, 24, 40, self.mn.as_bytes(), b' ');
        put_str(b_, 64, 8, self.fr.as_bytes(), b' ');
        put_u8(b_, 72, self.rab);
        b_[73..76].copy_from_slice(&self.ieee);
        put_u8(b_, 76, self.cmic);
        put_u8(b_, 77, self.mdts);
        put_u16(b_, 78, self.cntlid.0);
        put_u32(b_, 80, self.ver);
        put_u32(b_, 92, self.oaes);
        put_u32(b_, 96, self.ctratt);
        put_u8(b_, 111, self.cntrltype);
        put_u16(b_, 134, self.crdt[0]);
        put_u16(b_, 136, self.crdt[1]);
        put_u16(b_, 138, self.crdt[2]);
        put_u16(b_, 256, self.oacs);
        put_u8(b_, 258, self.acl);
        put_u8(b_, 259, self.aerl);
        put_u8(b_, 260, self.frmw);
        put_u8(b_, 261, self.lpa);
        put_u8(b_, 262, self.elpe);
        put_u16(b_, 320, self.kas);
        put_u8(b_, 342, self.anatt);
        put_u8(b_, 343, self.anacap);
        put_u32(b_, 344, self.anagrpmax);
        put_u32(b_, 348, self.nanagrpid);
        put_u32(b_, 352, self.pels);
        put_u16(b_, 386, self.cqt);
        put_u8(b_, 512, self.sqes);
        put_u8(b_, 513, self.cqes);
        put_u16(b_, 514, self.maxcmd);
        put_u32(b_, 516, self.nn);
        put_u16(b_, 520, self.oncs);
        put_u16(b_, 522, self.fuses);
        put_u8(b_, 524, self.fna);
        put_u8(b_, 525, self.vwc);
        put_u16(b_, 526, self.awun);
        put_u16(b_, 528, self.awupf);
        put_u8(b_, 531, self.nwpc);
        put_u16(b_, 534, self.ocfs);
        put_u32(b_, 536, self.sgls);
        put_u32(b_, 540, self.mnan);
        put_str(b_, 768, 256, self.subnqn.as_bytes(), 0);
        put_u32(b_, 1792, self.ioccsz);
        put_u32(b_, 1796, self.iorcsz);
        put_u16(b_, 1800, self.icdoff);
        put_u8(b_, 1802, self.fcatt);
        put_u8(b_, 1803, self.msdbd);
        put_u16(b_, 1804, self.ofcs);
        // Power state 0: 9 W max (NVMe requires at least one descriptor).
        put_u16(b_, 2048, 900);
        b
    }

    /// Decodes from an Identify buffer (short buffers read as zeros).
    pub fn decode(b: &[u8]) -> IdentifyController {
        let mut ieee = [0u8; 3];
        if let Some(s) = b.get(73..76) {
            ieee.copy_from_slice(s);
        }
        IdentifyController {
            vid: get_u16(b, 0),
            ssvid: get_u16(b, 2),
            sn: get_str(b, 4, 20),
            mn: get_str(b, 24, 40),
            fr: get_str(b, 64, 8),
            rab: get_u8(b, 72),
            ieee,
            cmic: get_u8(b, 76),
            mdts: get_u8(b, 77),
            cntlid: Cntlid(get_u16(b, 78)),
            ver: get_u32(b, 80),
            oaes: get_u32(b, 92),
            ctratt: get_u32(b, 96),
            cntrltype: get_u8(b, 111),
            crdt: [get_u16(b, 134), get_u16(b, 136), get_u16(b, 138)],
            oacs: get_u16(b, 256),
            acl: get_u8(b, 258),
            aerl: get_u8(b, 259),
            frmw: get_u8(b, 260),
            lpa: get_u8(b, 261),
            elpe: get_u8(b, 262),
            kas: get_u16(b, 320),
            anatt: get_u8(b, 342),
            anacap: get_u8(b, 343),
            anagrpmax: get_u32(b, 344),
            nanagrpid: get_u32(b, 348),
            pels: get_u32(b, 352),
            cqt: get_u16(b, 386),
            sqes: get_u8(b, 512),
            cqes: get_u8(b, 513),
            maxcmd: get_u16(b, 514),
            nn: get_u32(b, 516),
            oncs: get_u16(b, 520),
            fuses: get_u16(b, 522),
            fna: get_u8(b, 524),
            vwc: get_u8(b, 525),
            awun: get_u16(b, 526),
            awupf: get_u16(b, 528),
            nwpc: get_u8(b, 531),
            ocfs: get_u16(b, 534),
            sgls: get_u32(b, 536),
            mnan: get_u32(b, 540),
            subnqn: get_str(b, 768, 256),
            ioccsz: get_u32(b, 1792),
            iorcsz: get_u32(b, 1796),
            icdoff: get_u16(b, 1800),
            fcatt: get_u8(b, 1802),
            msdbd: get_u8(b, 1803),
            ofcs: get_u16(b, 1804),
        }
    }

    /// Maximum data transfer in bytes given the minimum page size (None = unlimited).
    pub fn max_transfer_bytes(&self, page_size: u32) -> Option<u64> {
        if self.mdts == 0 { None } else { Some(u64::from(page_size) << self.mdts.min(31)) }
    }

    /// In-capsule data the controller accepts on I/O queues, in bytes.
    pub fn in_capsule_data_size(&self) -> u32 {
        (self.ioccsz.saturating_mul(16)).saturating_sub(64)
    }
}

/// One LBA format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbaFormat {
    /// Metadata size per block.
    pub ms: u16,
    /// LBA data size as a power of two (9 = 512, 12 = 4096).
    pub lbads: u8,
    /// Relative performance.
    pub rp: u8,
}

/// NMIC bit 0: the namespace may be attached to several controllers at once.
pub const NMIC_SHARED: u8 = 1;

/// Identify Namespace (CNS 00h), the fields qpath uses.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Namespace size in blocks.
    pub nsze: u64,
    /// Namespace capacity in blocks.
    pub ncap: u64,
    /// Namespace utilization in blocks.
    pub nuse: u64,
    /// Namespace features (bit 0 thin provisioning, bit 4 NPWG..NOWS valid).
    pub nsfeat: u8,
    /// Number of LBA formats, 0's based.
    pub nlbaf: u8,
    /// Formatted LBA size: index into `lbaf`.
    pub flbas: u8,
    /// Multi-path I/O and namespace sharing capabilities.
    pub nmic: u8,
    /// Reservation capabilities (bits 1-6: the six reservation types; bit 7: Ignore
    /// Existing Key as in NVMe 1.3 and later; bit 0: Persist Through Power Loss).
    pub rescap: u8,
    /// Deallocate logical block features (bits 2:0 = 001b: deallocated blocks read as zeros).
    pub dlfeat: u8,
    /// Namespace atomic write unit power fail.
    pub nawupf: u16,
    /// Namespace optimal I/O boundary in blocks.
    pub noiob: u16,
    /// Namespace preferred write granularity, 0's based.
    pub npwg: u16,
    /// Namespace optimal write size, 0's based.
    pub nows: u16,
    /// Maximum single source range length of a Copy, in blocks.
    pub mssrl: u16,
    /// Maximum copy length: the most blocks one Copy may copy over all its source ranges.
    pub mcl: u32,
    /// Maximum source range count of a Copy, 0's based.
    pub msrc: u8,
    /// ANA group this namespace belongs to.
    pub anagrpid: AnaGrpId,
    /// Namespace attributes (bit 0 write protected).
    pub nsattr: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// LBA formats (only the first `nlbaf + 1` are meaningful).
    pub lbaf: [LbaFormat; 16],
}

impl IdentifyNamespace {
    /// Encodes into the 4096-byte structure.
    pub fn encode(&self) -> Box<[u8; IDENTIFY_SIZE]> {
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        let b_ = &mut b[..];
        put_u64(b_, 0, self.nsze);
        put_u64(b_, 8, self.ncap);
        put_u64(b_, 16, self.nuse);
        put_u8(b_, 24, self.nsfeat);
        put_u8(b_, 25, self.nlbaf);
        put_u8(b_, 26, self.flbas);
        put_u8(b_, 30, self.nmic);
        put_u8(b_, 31, self.rescap);
        put_u8(b_, 33, self.dlfeat);
        put_u16(b_, 36, self.nawupf);
        put_u16(b_, 46, self.noiob);
        put_u16(b_, 64, self.npwg);
        put_u16(b_, 72, self.nows);
        put_u16(b_, 74, self.mssrl);
        put_u32(b_, 76, self.mcl);
        put_u8(b_, 80, self.msrc);
        put_u32(b_, 92, self.anagrpid.0);
        put_u8(b_, 99, self.nsattr);
        b_[104..120].copy_from_slice(&self.nguid);
        b_[120..128].copy_from_slice(&self.eui64);
        for (i, f) in self.lbaf.iter().enumerate() {
            let o = 128 + i * 4;
            put_u16(b_, o, f.ms);
            put_u8(b_, o + 2, f.lbads);
            put_u8(b_, o + 3, f.rp);
        }
        b
    }

    /// Decodes from an Identify buffer.
    pub fn decode(b: &[u8]) -> IdentifyNamespace {
        let mut nguid = [0u8; 16];
        if let Some(s) = b.get(104..120) {
            nguid.copy_from_slice(s);
        }
        let mut eui64 = [0u8; 8];
        if let Some(s) = b.get(120..128) {
            eui64.copy_from_slice(s);
        }
        let mut lbaf = [LbaFormat::default(); 16];
        for (i, f) in lbaf.iter_mut().enumerate() {
            let o = 128 + i * 4;
            *f = LbaFormat { ms: get_u16(b, o), lbads: get_u8(b, o + 2), rp: get_u8(b, o + 3) };
        }
        IdentifyNamespace {
            nsze: get_u64(b, 0),
            ncap: get_u64(b, 8),
            nuse: get_u64(b, 16),
            nsfeat: get_u8(b, 24),
            nlbaf: get_u8(b, 25),
            flbas: get_u8(b, 26),
            nmic: get_u8(b, 30),
            rescap: get_u8(b, 31),
            dlfeat: get_u8(b, 33),
            nawupf: get_u16(b, 36),
            noiob: get_u16(b, 46),
            npwg: get_u16(b, 64),
            nows: get_u16(b, 72),
            mssrl: get_u16(b, 74),
            mcl: get_u32(b, 76),
            msrc: get_u8(b, 80),
            anagrpid: AnaGrpId(get_u32(b, 92)),
            nsattr: get_u8(b, 99),
            nguid,
            eui64,
            lbaf,
        }
    }

    /// The formatted block size in bytes (0 if the format is invalid).
    pub fn block_size(&self) -> u32 {
        let idx = usize::from(self.flbas & 0xf);
        match self.lbaf.get(idx) {
            Some(f) if (9..=16).contains(&f.lbads) => 1u32 << f.lbads,
            _ => 0,
        }
    }
}

/// Encodes an active namespace ID list: up to 1024 NSIDs greater than `after`, ascending.
pub fn encode_ns_list(nsids: impl IntoIterator<Item = Nsid>, after: Nsid) -> Box<[u8; IDENTIFY_SIZE]> {
    let mut b = Box::new([0u8; IDENTIFY_SIZE]);
    let mut i = 0;
    for n in nsids {
        if n.0 > after.0 && i < 1024 {
            put_u32(&mut b[..], i * 4, n.0);
            i += 1;
        }
    }
    b
}

/// Decodes a namespace ID list (stops at the first 0).
pub fn decode_ns_list(b: &[u8]) -> Vec<Nsid> {
    (0..b.len().min(IDENTIFY_SIZE) / 4).map(|i| get_u32(b, i * 4)).take_while(|&n| n != 0).map(Nsid).collect()
}

/// A namespace identification descriptor (CNS 03h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NsIdDesc {
    /// IEEE EUI-64 (NIDT 1).
    Eui64([u8; 8]),
    /// Namespace globally unique identifier (NIDT 2).
    Nguid([u8; 16]),
    /// UUID (NIDT 3).
    Uuid([u8; 16]),
    /// Command Set Identifier (NIDT 4).
    Csi(u8),
}

impl NsIdDesc {
    fn nidt_len(&self) -> (u8, usize) {
        match self {
            NsIdDesc::Eui64(_) => (1, 8),
            NsIdDesc::Nguid(_) => (2, 16),
            NsIdDesc::Uuid(_) => (3, 16),
            NsIdDesc::Csi(_) => (4, 1),
        }
    }
}

/// Encodes a namespace identification descriptor list.
pub fn encode_ns_descs(descs: &[NsIdDesc]) -> Box<[u8; IDENTIFY_SIZE]> {
    let mut b = Box::new([0u8; IDENTIFY_SIZE]);
    let mut o = 0;
    for d in descs {
        let (nidt, nidl) = d.nidt_len();
        if o + 4 + nidl > IDENTIFY_SIZE {
            break;
        }
        b[o] = nidt;
        b[o + 1] = crate::wire::len_u8(nidl);
        let v = &mut b[o + 4..o + 4 + nidl];
        match d {
            NsIdDesc::Eui64(x) => v.copy_from_slice(x),
            NsIdDesc::Nguid(x) | NsIdDesc::Uuid(x) => v.copy_from_slice(x),
            NsIdDesc::Csi(x) => v[0] = *x,
        }
        o += 4 + nidl;
    }
    b
}

/// Decodes a namespace identification descriptor list; unknown or malformed
/// descriptors end the list.
pub fn decode_ns_descs(b: &[u8]) -> Vec<NsIdDesc> {
    let mut out = Vec::new();
    let mut o = 0;
    let end = b.len().min(IDENTIFY_SIZE);
    while o + 4 <= end {
        let nidt = b[o];
        let nidl = usize::from(b[o + 1]);
        if nidt == 0 || o + 4 + nidl > end {
            break;
        }
        let v = &b[o + 4..o + 4 + nidl];
        let d = match (nidt, nidl) {
            (1, 8) => NsIdDesc::Eui64(v.try_into().unwrap_or_default()),
            (2, 16) => NsIdDesc::Nguid(v.try_into().unwrap_or_default()),
            (3, 16) => NsIdDesc::Uuid(v.try_into().unwrap_or_default()),
            (4, 1) => NsIdDesc::Csi(v[0]),
            _ => break,
        };
        out.push(d);
        o += 4 + nidl;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_round_trip_and_offsets() {
        let c = IdentifyController {
            vid: 0x1b36,
            sn: "qpath0001".into(),
            mn: "qpath".into(),
            fr: "0.1".into(),
            cmic: cmic::MULTI_PORT | cmic::MULTI_CTRL | cmic::ANA,
            mdts: 8,
            cntlid: Cntlid(3),
            ver: crate::fabrics::version(2, 0, 0),
            oaes: oaes::NS_ATTR | oaes::ANA_CHANGE,
            cntrltype: ControllerType::Io as u8,
            maxcmd: 128,
            nn: 32,
            sgls: sgls::SUPPORTED | sgls::OFFSET | sgls::TRANSPORT,
            subnqn: "nqn.2024-01.io.qpath:x".into(),
            ioccsz: (64 + 8192) / 16,
            iorcsz: 1,
            anagrpmax: 4,
            nanagrpid: 4,
            cqt: 1234,
            oncs: oncs::COMPARE | oncs::VERIFY | oncs::COPY,
            fuses: fuses::COMPARE_AND_WRITE,
            ocfs: ocfs::FORMAT_0,
            ..Default::default()
        };
        let b = c.encode();
        // SPDK struct spdk_nvme_ctrlr_data: oncs at 520, fuses at 522, ocfs at 534.
        assert_eq!(get_u16(&b[..], 520), 0x181);
        assert_eq!(get_u16(&b[..], 522), 1);
        assert_eq!(get_u16(&b[..], 534), 1);
        assert_eq!(&b[4..13], b"qpath0001");
        assert_eq!(b[23], b' ');
        assert_eq!(b[76], 0x0b);
        assert_eq!(b[77], 8);
        assert_eq!(get_u32(&b[..], 1792), (64 + 8192) / 16);
        assert_eq!(get_u16(&b[..], 386), 1234, "CQT");
        let d = IdentifyController::decode(&b[..]);
        assert_eq!(d, c);
        assert_eq!(d.in_capsule_data_size(), 8192);
        assert_eq!(d.max_transfer_bytes(4096), Some(1 << 20));
    }

    #[test]
    fn namespace_round_trip() {
        let mut n =
            IdentifyNamespace { nsze: 1 << 18, ncap: 1 << 18, nuse: 1 << 18, nmic: NMIC_SHARED, ..Default::default() };
        n.lbaf[0] = LbaFormat { ms: 0, lbads: 12, rp: 0 };
        n.nguid = [0x11; 16];
        n.anagrpid = AnaGrpId(2);
        (n.mssrl, n.mcl, n.msrc) = (256, 2048, 127);
        let b = n.encode();
        // SPDK struct spdk_nvme_ns_data: mssrl at 74, mcl at 76, msrc at 80.
        assert_eq!((get_u16(&b[..], 74), get_u32(&b[..], 76), b[80]), (256, 2048, 127));
        let d = IdentifyNamespace::decode(&b[..]);
        assert_eq!(d, n);
        assert_eq!(d.block_size(), 4096);
    }

    #[test]
    fn lists() {
        let b = encode_ns_list([Nsid(1), Nsid(2), Nsid(5)], Nsid(1));
        assert_eq!(decode_ns_list(&b[..]), vec![Nsid(2), Nsid(5)]);
        let d = [NsIdDesc::Nguid([3; 16]), NsIdDesc::Uuid([4; 16]), NsIdDesc::Csi(0)];
        assert_eq!(decode_ns_descs(&encode_ns_descs(&d)[..]), d);
        // A descriptor whose length runs past the buffer ends the list.
        let mut bad = [0u8; 8];
        bad[0] = 2;
        bad[1] = 16;
        assert!(decode_ns_descs(&bad).is_empty());
    }
}
