//! Admin commands of NVM and discovery controllers (NVMe 2.0 §5; Linux
//! `admin-cmd.c` and `discovery.c` are the behaviour Linux hosts expect).
//!
//! Each handler fills the command's data buffer (already sized to the
//! transfer length the SGL asked for) and returns the completion fields.

use nvme::features::{NumQueues, fid};
use nvme::identify::{
    ControllerType, IDENTIFY_SIZE, IdentifyController, cmic, cns, csi, encode_ns_descs, encode_ns_list, fuses, lpa,
    oaes, ocfs, oncs, sgls,
};
use nvme::log::{AnaGroupDesc, AnaLog, GetLogPage, SmartLog, encode_changed_ns_list, lid, slice_page};
use nvme::opcode::admin;
use nvme::{AnaGrpId, Nsid, Sqe, Status};

use crate::controller::{AEN_SUPPORTED, Controller, ERROR_LOG_ENTRIES, KAS, MAX_AERS};
use crate::namespace::{MAX_NSID, NsMap};
use crate::port::ANA_GROUPS;
use crate::registry::TargetState;

/// The result of an admin command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Complete now with this status and result dwords.
    Complete(Status, u32, u32),
    /// An Asynchronous Event Request: held until an event occurs.
    Aer,
}

impl Outcome {
    fn ok(dw0: u32) -> Outcome {
        Outcome::Complete(Status::SUCCESS, dw0, 0)
    }
    fn err(s: Status) -> Outcome {
        Outcome::Complete(s, 0, 0)
    }
}

/// The data transfer an admin command needs: `Some(len)` controller-to-host
/// bytes, or `None` for commands without data. Lengths come from the command
/// itself (Identify 4 KiB, Get Log Page NUMD) so the SGL can be checked against them.
pub fn c2h_len(sqe: &Sqe) -> Option<u64> {
    match sqe.opcode() {
        admin::IDENTIFY => Some(IDENTIFY_SIZE as u64),
        admin::GET_LOG_PAGE => Some(GetLogPage::from_sqe(sqe).len),
        _ => None,
    }
}

/// Executes an admin command (not a Fabrics one) on `ctrl`.
pub fn execute(
    target: &TargetState,
    ctrl: &Controller,
    ns: &NsMap,
    sqe: &Sqe,
    out: &mut [u8],
    outstanding_aers: usize,
    now_ms: u64,
) -> Outcome {
    let disc = ctrl.is_discovery();
    match sqe.opcode() {
        admin::IDENTIFY => identify(target, ctrl, ns, sqe, out),
        admin::GET_LOG_PAGE => get_log_page(target, ctrl, ns, sqe, out),
        admin::SET_FEATURES => set_features(ctrl, ns, sqe, now_ms),
        admin::GET_FEATURES => get_features(ctrl, ns, sqe),
        admin::ASYNC_EVENT_REQUEST => {
            if outstanding_aers >= MAX_AERS {
                Outcome::err(Status::AER_LIMIT_EXCEEDED)
            } else {
                Outcome::Aer
            }
        }
        admin::KEEP_ALIVE => {
            if ctrl.kato_ms() == 0 {
                Outcome::err(Status::KEEP_ALIVE_INVALID)
            } else {
                ctrl.touch(now_ms);
                Outcome::ok(0)
            }
        }
        // A minimal Abort: the command is never found (DW0 bit 0 = not aborted), as nvmet does.
        admin::ABORT if !disc => Outcome::ok(1),
        _ => Outcome::err(Status::INVALID_OPCODE),
    }
}

fn identify(target: &TargetState, ctrl: &Controller, ns: &NsMap, sqe: &Sqe, out: &mut [u8]) -> Outcome {
    let cdw10 = sqe.cdw(10);
    let c = (cdw10 & 0xff) as u8;
    let command_set = (sqe.cdw(11) >> 24) as u8;
    let nsid = sqe.nsid();
    out.fill(0);
    let mut put = |b: &[u8]| {
        let n = b.len().min(out.len());
        out[..n].copy_from_slice(&b[..n]);
    };
    if ctrl.is_discovery() {
        return match c {
            cns::CONTROLLER => {
                put(&identify_controller(target, ctrl)[..]);
                Outcome::ok(0)
            }
            _ => Outcome::err(Status::INVALID_FIELD),
        };
    }
    let accessible = |n: &crate::namespace::Namespace| ctrl.port.ana_state(n.anagrpid).is_accessible();
    match c {
        cns::NAMESPACE => {
            if nsid == Nsid::BROADCAST {
                return Outcome::err(Status::INVALID_NS);
            }
            // An inactive NSID returns zeros (NVMe 2.0 §5.17.2.1).
            if let Some(n) = ns.get(nsid) {
                put(&n.identify(accessible(n)).encode()[..]);
            }
            Outcome::ok(0)
        }
        cns::CONTROLLER => {
            put(&identify_controller(target, ctrl)[..]);
            Outcome::ok(0)
        }
        cns::ACTIVE_NS_LIST | cns::CS_ACTIVE_NS_LIST => {
            if nsid.0 >= 0xffff_fffe {
                return Outcome::err(Status::INVALID_NS);
            }
            if c == cns::CS_ACTIVE_NS_LIST && command_set != csi::NVM {
                return Outcome::ok(0);
            }
            put(&encode_ns_list(ns.iter().map(|n| n.nsid), nsid)[..]);
            Outcome::ok(0)
        }
        cns::NS_DESC_LIST => match ns.get(nsid) {
            Some(n) => {
                put(&encode_ns_descs(&n.descriptors())[..]);
                Outcome::ok(0)
            }
            None => Outcome::err(Status::INVALID_NS),
        },
        cns::CS_NAMESPACE | cns::CS_CONTROLLER if command_set != csi::NVM => Outcome::err(Status::INVALID_FIELD),
        // NVM command set specific structures: all fields zero (no limits beyond MDTS), as nvmet.
        cns::CS_NAMESPACE => {
            if ns.get(nsid).is_some() {
                Outcome::ok(0)
            } else {
                Outcome::err(Status::INVALID_NS)
            }
        }
        cns::CS_CONTROLLER => Outcome::ok(0),
        cns::CS_INDEP_NAMESPACE => match ns.get(nsid) {
            Some(n) => {
                // I/O Command Set Independent Identify Namespace (NVMe 2.0 Figure 319).
                out[1] = nvme::identify::NMIC_SHARED;
                out[4..8].copy_from_slice(&n.anagrpid.0.to_le_bytes());
                out[8] = u8::from(n.readonly);
                out[12..14].copy_from_slice(&u16::try_from(n.nsid.0).unwrap_or(0).to_le_bytes());
                out[14] = 1; // NSTAT: namespace ready
                Outcome::ok(0)
            }
            None => Outcome::err(Status::INVALID_NS),
        },
        _ => Outcome::err(Status::INVALID_FIELD),
    }
}

/// Identify Controller for `ctrl`.
pub fn identify_controller(target: &TargetState, ctrl: &Controller) -> Box<[u8; IDENTIFY_SIZE]> {
    let s = &ctrl.subsys;
    let disc = ctrl.is_discovery();
    let o = &target.opts;
    let (ns_count, vwc) = if disc {
        (0, false)
    } else {
        let (m, _) = s.namespaces();
        (m.len(), m.iter().any(|n| n.backend.volatile_cache()))
    };
    let _ = ns_count;
    IdentifyController {
        vid: 0,
        ssvid: 0,
        sn: s.serial.clone(),
        mn: s.model.clone(),
        fr: s.firmware.clone(),
        rab: 6,
        ieee: [0; 3],
        cmic: if disc { 0 } else { cmic::MULTI_PORT | cmic::MULTI_CTRL | cmic::ANA },
        mdts: o.mdts,
        cntlid: ctrl.cntlid,
        ver: ctrl.vs(),
        oaes: if disc { oaes::DISCOVERY_CHANGE } else { oaes::NS_ATTR | oaes::ANA_CHANGE },
        // Host id 128-bit (bit 0) and traffic-based keep alive (bit 6), as nvmet.
        ctratt: 1 | (1 << 6),
        cntrltype: if disc { ControllerType::Discovery as u8 } else { ControllerType::Io as u8 },
        crdt: [0; 3],
        oacs: 0,
        acl: 3,
        aerl: u8::try_from(MAX_AERS - 1).unwrap_or(0),
        frmw: 0x03,
        lpa: lpa::SMART_PER_NS | lpa::EXTENDED_DATA,
        elpe: u8::try_from(ERROR_LOG_ENTRIES - 1).unwrap_or(0),
        kas: KAS,
        anatt: if disc { 0 } else { 10 },
        // Optimized, non-optimized, inaccessible, persistent loss and change states reported.
        anacap: if disc { 0 } else { 0x1f },
        anagrpmax: if disc { 0 } else { ANA_GROUPS },
        nanagrpid: if disc { 0 } else { ANA_GROUPS },
        pels: 0,
        sqes: (6 << 4) | 6,
        cqes: (4 << 4) | 4,
        maxcmd: s.limits.max_queue_entries,
        nn: if disc { 0 } else { MAX_NSID },
        oncs: if disc {
            0
        } else {
            oncs::COMPARE | oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS | oncs::VERIFY | oncs::COPY
        },
        // Compare and Write, atomic against every other write to its blocks (crate::range_lock).
        fuses: if disc { 0 } else { fuses::COMPARE_AND_WRITE },
        fna: 0,
        vwc: u8::from(vwc),
        awun: 0,
        awupf: 0,
        // Copy source ranges in format 0h only (limits per namespace: MSSRL, MCL, MSRC).
        ocfs: if disc { 0 } else { ocfs::FORMAT_0 },
        sgls: sgls::SUPPORTED | sgls::OFFSET | sgls::TRANSPORT,
        mnan: if disc { 0 } else { MAX_NSID },
        subnqn: s.nqn.clone(),
        ioccsz: (64 + o.in_capsule_data_size) / 16,
        iorcsz: 1,
        icdoff: 0,
        fcatt: 0,
        msdbd: 1,
        ofcs: 0,
    }
    .encode()
}

fn get_log_page(target: &TargetState, ctrl: &Controller, ns: &NsMap, sqe: &Sqe, out: &mut [u8]) -> Outcome {
    let g = GetLogPage::from_sqe(sqe);
    if !g.offset.is_multiple_of(4) {
        return Outcome::err(Status::INVALID_FIELD);
    }
    let page: Vec<u8> = if ctrl.is_discovery() {
        if g.lid != lid::DISCOVERY {
            return Outcome::err(Status::INVALID_FIELD);
        }
        target.discovery_log(&ctrl.hostnqn, &ctrl.port).encode()
    } else {
        match g.lid {
            lid::ERROR => {
                let (entries, _) = ctrl.error_log();
                let mut p = vec![0u8; ERROR_LOG_ENTRIES * nvme::log::ERROR_LOG_ENTRY_SIZE];
                for (i, e) in entries.iter().enumerate() {
                    let o = i * nvme::log::ERROR_LOG_ENTRY_SIZE;
                    e.encode(&mut p[o..o + nvme::log::ERROR_LOG_ENTRY_SIZE]);
                }
                p
            }
            lid::SMART => {
                let (_, errors) = ctrl.error_log();
                SmartLog {
                    temperature_k: 300,
                    avail_spare: 100,
                    spare_thresh: 10,
                    num_err_log_entries: errors,
                    ..Default::default()
                }
                .encode()
                .to_vec()
            }
            lid::FW_SLOT => vec![0u8; 512],
            lid::CHANGED_NS => {
                let list = ctrl.take_changed_ns();
                encode_changed_ns_list(list.as_deref().unwrap_or(&[Nsid(0); 1025])).to_vec()
            }
            lid::ANA => ana_log(ctrl, ns, g.lsp & nvme::log::ANA_LSP_RGO != 0).encode(g.lsp & 1 != 0),
            _ => return Outcome::err(Status::INVALID_LOG_PAGE),
        }
    };
    if g.offset > page.len() as u64 {
        return Outcome::err(Status::INVALID_FIELD);
    }
    slice_page(&page, g.offset, out);
    if !g.rae {
        ctrl.log_read(g.lid);
    }
    Outcome::ok(0)
}

/// The ANA log as seen through `ctrl`'s port: every group that has a
/// namespace in the subsystem, with the port's state for it.
pub fn ana_log(ctrl: &Controller, ns: &NsMap, _groups_only: bool) -> AnaLog {
    let mut groups: Vec<AnaGroupDesc> = Vec::new();
    for g in 1..=ANA_GROUPS {
        let grp = AnaGrpId(g);
        let nsids: Vec<Nsid> = ns.iter().filter(|n| n.anagrpid == grp).map(|n| n.nsid).collect();
        if nsids.is_empty() {
            continue;
        }
        groups.push(AnaGroupDesc {
            grpid: grp,
            chgcnt: ctrl.port.ana_group_chgcnt(grp),
            state: ctrl.port.ana_state(grp),
            nsids,
        });
    }
    let chgcnt = groups.iter().map(|g| g.chgcnt).max().unwrap_or(0);
    AnaLog { chgcnt, groups }
}

fn set_features(ctrl: &Controller, ns: &NsMap, sqe: &Sqe, now_ms: u64) -> Outcome {
    let cdw10 = sqe.cdw(10);
    let cdw11 = sqe.cdw(11);
    if cdw10 & (1 << 31) != 0 {
        return Outcome::err(Status::FEATURE_NOT_SAVEABLE);
    }
    let f = (cdw10 & 0xff) as u8;
    if ctrl.is_discovery() && !matches!(f, fid::KATO | fid::ASYNC_EVENT) {
        return Outcome::err(Status::INVALID_FIELD);
    }
    match f {
        fid::NUM_QUEUES => {
            let q = NumQueues::from_dw(cdw11);
            if cdw11 & 0xffff == 0xffff || cdw11 >> 16 == 0xffff {
                return Outcome::err(Status::INVALID_FIELD);
            }
            let granted = u32::from(ctrl.set_num_queues(q.nsq, q.ncq));
            Outcome::ok(NumQueues { nsq: granted, ncq: granted }.to_dw())
        }
        fid::KATO => Outcome::ok(ctrl.set_kato_ms(cdw11, now_ms)),
        fid::ASYNC_EVENT => {
            let allowed = if ctrl.is_discovery() { 1 << 31 } else { AEN_SUPPORTED & !(1 << 31) };
            if cdw11 & !allowed != 0 {
                return Outcome::err(Status::INVALID_FIELD);
            }
            match ctrl.set_aen_enabled(cdw11) {
                Ok(v) => Outcome::ok(v),
                Err(s) => Outcome::err(s),
            }
        }
        // Fabrics hosts identify themselves at Connect (nvmet answers the same).
        fid::HOST_ID => Outcome::err(Status::COMMAND_SEQUENCE_ERROR),
        fid::RESV_PERSISTENCE => match ns.get(sqe.nsid()) {
            Some(n) => match n.resv.set_ptpl(cdw11 & 1 == 1) {
                s if s.is_success() => Outcome::ok(cdw11 & 1),
                s => Outcome::err(s),
            },
            None => Outcome::err(Status::INVALID_NS),
        },
        fid::VOLATILE_WC | fid::ARBITRATION | fid::POWER_MGMT | fid::TEMP_THRESHOLD | fid::ERROR_RECOVERY => {
            Outcome::err(Status::FEATURE_NOT_CHANGEABLE)
        }
        _ => Outcome::err(Status::INVALID_FIELD),
    }
}

fn get_features(ctrl: &Controller, ns: &NsMap, sqe: &Sqe) -> Outcome {
    let cdw10 = sqe.cdw(10);
    let f = (cdw10 & 0xff) as u8;
    let sel = (cdw10 >> 8) & 7;
    if sel == 3 {
        // Supported capabilities: bit 2 changeable.
        let changeable = matches!(f, fid::NUM_QUEUES | fid::KATO | fid::ASYNC_EVENT | fid::RESV_PERSISTENCE);
        return Outcome::ok(if changeable { 1 << 2 } else { 0 });
    }
    match f {
        fid::NUM_QUEUES if !ctrl.is_discovery() => {
            let n = u32::from(ctrl.num_io_queues());
            Outcome::ok(NumQueues { nsq: n, ncq: n }.to_dw())
        }
        fid::KATO => Outcome::ok(ctrl.kato_ms()),
        fid::ASYNC_EVENT => Outcome::ok(ctrl.aen_enabled()),
        fid::VOLATILE_WC if !ctrl.is_discovery() => {
            Outcome::ok(u32::from(ns.iter().any(|n| n.backend.volatile_cache())))
        }
        fid::ARBITRATION | fid::POWER_MGMT | fid::ERROR_RECOVERY | fid::WRITE_ATOMIC if !ctrl.is_discovery() => {
            Outcome::ok(0)
        }
        // Composite temperature threshold: 70 °C in kelvins.
        fid::TEMP_THRESHOLD if !ctrl.is_discovery() => Outcome::ok(343),
        fid::RESV_PERSISTENCE if !ctrl.is_discovery() => match ns.get(sqe.nsid()) {
            Some(n) => Outcome::ok(u32::from(n.resv.ptpl())),
            None => Outcome::err(Status::INVALID_NS),
        },
        _ => Outcome::err(Status::INVALID_FIELD),
    }
}
