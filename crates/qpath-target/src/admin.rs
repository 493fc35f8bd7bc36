//! Admin commands of NVM and discovery controllers (NVMe 2.0 §5; Linux
//! `admin-cmd.c` and `discovery.c` are the behaviour Linux hosts expect).
//!
//! Each handler fills the command's data buffer (already sized to the
//! transfer length the SGL asked for) and returns the completion fields.

use nvme::features::{NumQueues, fid, sel};
use nvme::identify::{
    ControllerType, IDENTIFY_SIZE, IdentifyController, cmic, cns, csi, encode_ns_descs, encode_ns_list, fuses, lpa,
    nwpc, oaes, ocfs, sgls,
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
    /// Abort command `cid` of submission queue `sqid` (NVMe Base 2.0 §5.1): the queue's
    /// owner decides whether it can, on its tick ([`crate::controller::Controller::request_abort`]).
    Abort {
        /// Submission queue id.
        sqid: u16,
        /// Command id.
        cid: u16,
    },
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
/// itself (Identify 4 KiB, Get Log Page NUMD, Get Features Host Identifier 16 bytes) so the
/// SGL can be checked against them.
pub fn c2h_len(sqe: &Sqe) -> Option<u64> {
    match sqe.opcode() {
        admin::IDENTIFY => Some(IDENTIFY_SIZE as u64),
        admin::GET_LOG_PAGE => Some(GetLogPage::from_sqe(sqe).len),
        // Host Identifier returns the 16-byte Host ID (not with Select 11b: capabilities only).
        admin::GET_FEATURES
            if (sqe.cdw(10) & 0xff) as u8 == fid::HOST_ID
                && ((sqe.cdw(10) >> 8) & 7) as u8 != sel::SUPPORTED_CAPABILITIES =>
        {
            Some(16)
        }
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
        admin::GET_FEATURES => get_features(target, ctrl, ns, sqe, out),
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
        // CDW10: SQID 15:0, CID 31:16.
        admin::ABORT if !disc => {
            Outcome::Abort { sqid: (sqe.cdw(10) & 0xffff) as u16, cid: (sqe.cdw(10) >> 16) as u16 }
        }
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
                out[8] = u8::from(n.write_protected());
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
    // VWC describes the namespaces this controller's host sees.
    let vwc = !disc && volatile_cache(&ctrl.namespaces());
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
        acl: u8::try_from(crate::controller::ABORTS_MAX - 1).unwrap_or(0),
        aerl: u8::try_from(MAX_AERS - 1).unwrap_or(0),
        frmw: 0x03,
        // Discovery controllers serve LID 70h with offsets (nvmet's discovery `id->lpa`);
        // I/O controllers every page in `supported::LOG_PAGES`, SMART per namespace too.
        lpa: if disc { lpa::EXTENDED_DATA } else { lpa::SMART_PER_NS | lpa::CMD_EFFECTS | lpa::EXTENDED_DATA },
        elpe: u8::try_from(ERROR_LOG_ENTRIES - 1).unwrap_or(0),
        kas: KAS,
        anatt: if disc { 0 } else { 10 },
        // Optimized, non-optimized, inaccessible, persistent loss and change states reported.
        anacap: if disc { 0 } else { 0x1f },
        anagrpmax: if disc { 0 } else { ANA_GROUPS },
        nanagrpid: if disc { 0 } else { ANA_GROUPS },
        pels: 0,
        // No Command Quiesce Time is promised: a file namespace's write handed to the
        // kernel before the loss was noticed finishes when the kernel says, with no bound
        // this target can give (docs/design.md, "Failover hold"). Hosts then assume one KATO.
        cqt: 0,
        sqes: (6 << 4) | 6,
        cqes: (4 << 4) | 4,
        maxcmd: s.limits.max_queue_entries,
        nn: if disc { 0 } else { MAX_NSID },
        oncs: if disc { 0 } else { crate::supported::oncs() },
        // Compare and Write, atomic against every other write to its blocks (crate::range_lock).
        fuses: if disc { 0 } else { fuses::COMPARE_AND_WRITE },
        fna: 0,
        vwc: u8::from(vwc),
        awun: 0,
        awupf: 0,
        // No Write Protect and Write Protect, and Write Protect Until Power Cycle (what a
        // configured read-only namespace is); not Permanent Write Protect.
        nwpc: if disc { 0 } else { nwpc::WRITE_PROTECT | nwpc::UNTIL_POWER_CYCLE },
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

/// Identify Controller VWC: some namespace's backend has a volatile write cache.
fn volatile_cache(ns: &NsMap) -> bool {
    ns.iter().any(|n| n.backend.volatile_cache())
}

fn get_log_page(target: &TargetState, ctrl: &Controller, ns: &NsMap, sqe: &Sqe, out: &mut [u8]) -> Outcome {
    let g = GetLogPage::from_sqe(sqe);
    if !g.offset.is_multiple_of(4) {
        return Outcome::err(Status::INVALID_FIELD);
    }
    // Pages that reading clears: an offset past them fails before anything is taken.
    let consumed_len = match g.lid {
        lid::CHANGED_NS => Some(4096),
        lid::RESERVATION => Some(nvme::log::RESV_NOTIFICATION_SIZE as u64),
        _ => None,
    };
    if !ctrl.is_discovery() && consumed_len.is_some_and(|len| g.offset > len) {
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
            lid::SMART => match smart_log(target, ctrl, ns, g.nsid) {
                Ok(page) => page.encode().to_vec(),
                Err(s) => return Outcome::err(s),
            },
            lid::SUPPORTED => crate::supported::supported_log_pages().to_vec(),
            lid::CMD_EFFECTS => match crate::supported::command_effects(g.csi) {
                Some(page) => page.encode(),
                // nvmet: a command set it does not implement is an invalid page.
                None => return Outcome::err(Status::INVALID_LOG_PAGE),
            },
            lid::FEATURE_EFFECTS => crate::supported::feature_effects(volatile_cache(ns)).to_vec(),
            // No NVMe-MI commands: every entry clear (SPDK answers the same, for LPA bit 5).
            lid::MI_EFFECTS => vec![0u8; nvme::log::CMD_EFFECTS_SIZE],
            // One slot, read-only, no image: all zero, as nvmet ("still claim to fully
            // implement this mandatory log page").
            lid::FW_SLOT => vec![0u8; 512],
            lid::CHANGED_NS => {
                let list = ctrl.take_changed_ns();
                encode_changed_ns_list(list.as_deref().unwrap_or(&[Nsid(0); 1025])).to_vec()
            }
            lid::ANA => {
                let groups_only = g.lsp & nvme::log::ANA_LSP_RGO != 0;
                let mut page = ana_log(ctrl, ns, groups_only).encode(groups_only);
                // The page's length varies; a host sizes its read by the most it can hold
                // (NANAGRPID group descriptors and NN NSIDs, from Identify) and reads that
                // in pieces (libnvme: 4 KiB each), so an offset past today's groups is still
                // inside the page: it reads zeros, as from nvmet (NVMe Base 2.0 §5.16.1.12).
                page.resize(page.len().max(ana_log_max_len(groups_only)), 0);
                page
            }
            // Each read takes the oldest notification off the queue, whatever RAE says (RAE
            // only decides whether the event is reported again).
            lid::RESERVATION => ctrl.take_reservation_log().encode().to_vec(),
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

/// The SMART / Health log (NVMe Base 2.0 §5.16.1.3): the counters of namespace `nsid`
/// (LPA bit 0), or with NSID 0h or FFFFFFFFh the sum over the subsystem's namespaces now.
/// The counters are the namespaces' own ([`crate::stats::NsTotals`]), a reactor tick
/// (10 ms) behind the I/O at most; data units are rounded up once, over the sum (nvmet
/// rounds each namespace and adds, and has no counters for file-backed namespaces).
pub fn smart_log(target: &TargetState, ctrl: &Controller, ns: &NsMap, nsid: Nsid) -> Result<SmartLog, Status> {
    let c = if nsid.0 == 0 || nsid == Nsid::BROADCAST {
        let mut sum = crate::stats::NsCounters::default();
        for n in ns.iter() {
            sum.add(&n.counters.snapshot(n.nsid.0));
        }
        sum
    } else {
        // An NSID that is not an active namespace: as nvmet.
        ns.get(nsid).ok_or(Status::INVALID_NS)?.counters.snapshot(nsid.0)
    };
    let (_, errors) = ctrl.error_log();
    Ok(SmartLog {
        critical_warning: 0,
        // No sensor: 0, as nvmet and SPDK report.
        temperature_k: 0,
        // Nothing here wears: the whole spare is left, never below its threshold.
        avail_spare: 100,
        spare_thresh: 10,
        percent_used: 0,
        data_units_read: nvme::log::data_units(c.data_read_bytes),
        data_units_written: nvme::log::data_units(c.data_written_bytes),
        host_reads: c.host_read_commands,
        host_writes: c.host_write_commands,
        // Busy time is the time with a command outstanding on any I/O queue of the
        // controller; the queues count their own latencies, not the union of them: 0.
        ctrl_busy_minutes: 0,
        // Neither power cycles nor unsafe shutdowns of the target process are recorded.
        power_cycles: 0,
        // Hours since this target process started (no power-on time survives it).
        power_on_hours: target.now_ms() / 3_600_000,
        unsafe_shutdowns: 0,
        media_errors: c.media_errors,
        num_err_log_entries: errors,
    })
}

/// The most bytes the ANA log can take (Identify Controller NANAGRPID and NN): header,
/// one descriptor per group and, unless only groups are asked for, every NSID.
fn ana_log_max_len(groups_only: bool) -> usize {
    let nsids = if groups_only { 0 } else { MAX_NSID as usize };
    nvme::log::ANA_LOG_HEADER_SIZE + ANA_GROUPS as usize * nvme::log::ANA_GROUP_DESC_SIZE + nsids * 4
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

/// Set Features (NVMe Base 2.0 §5.27) of the features in [`crate::supported::FEATURES`]:
/// the changeable ones change; the others fail with Feature Not Changeable, and Host
/// Identifier with Command Sequence Error (a Fabrics host gives it at Connect; nvmet
/// answers the same). Nothing is saveable (SV: Feature Identifier Not Saveable). As in
/// nvmet, a controller-scoped feature does not look at the NSID.
fn set_features(ctrl: &Controller, ns: &NsMap, sqe: &Sqe, now_ms: u64) -> Outcome {
    let cdw10 = sqe.cdw(10);
    let cdw11 = sqe.cdw(11);
    let f = (cdw10 & 0xff) as u8;
    if crate::supported::feature_of(f, ctrl.is_discovery(), volatile_cache(ns)).is_none() {
        return Outcome::err(Status::INVALID_FIELD);
    }
    if cdw10 & (1 << 31) != 0 {
        return Outcome::err(Status::FEATURE_NOT_SAVEABLE);
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
        fid::HOST_ID => Outcome::err(Status::COMMAND_SEQUENCE_ERROR),
        // NSID FFFFFFFFh: every namespace attached now (nvmet, SPDK).
        fid::RESV_MASK => {
            let nsid = sqe.nsid();
            let nsids: Vec<Nsid> = if nsid == Nsid::BROADCAST {
                ns.iter().map(|n| n.nsid).collect()
            } else {
                match feature_ns(ns, nsid) {
                    Ok(n) => vec![n.nsid],
                    Err(s) => return Outcome::err(s),
                }
            };
            match ctrl.set_resv_mask(nsids, cdw11) {
                Ok(()) => Outcome::ok(cdw11),
                Err(s) => Outcome::err(s),
            }
        }
        fid::RESV_PERSISTENCE => match feature_ns(ns, sqe.nsid()) {
            Ok(n) => match n.resv.set_ptpl(cdw11 & 1 == 1) {
                s if s.is_success() => Outcome::ok(cdw11 & 1),
                s => Outcome::err(s),
            },
            Err(s) => Outcome::err(s),
        },
        // One namespace this controller's host sees (NSID FFFFFFFFh is refused, as nvmet).
        fid::WRITE_PROTECT => match feature_ns(ns, sqe.nsid()) {
            Ok(n) => match ctrl.subsys.set_write_protect(n.nsid, cdw11 & 7) {
                Ok(()) => Outcome::ok(0),
                Err(s) => Outcome::err(s),
            },
            Err(s) => Outcome::err(s),
        },
        _ => Outcome::err(Status::FEATURE_NOT_CHANGEABLE),
    }
}

/// Get Features (NVMe Base 2.0 §5.15) of the features in [`crate::supported::FEATURES`]:
/// the value now (Select 11b: the supported capabilities; ONCS bit 4 is clear, so the
/// other Select values read the current value). `out` is the command's data (Host
/// Identifier only: [`c2h_len`] sized it). nvmet answers none of Power Management,
/// Temperature Threshold, Error Recovery and Write Atomicity Normal; the values here are
/// what this target does: one power state, no sensor, no error recovery time limit, no
/// atomic write guarantee beyond one block.
fn get_features(target: &TargetState, ctrl: &Controller, ns: &NsMap, sqe: &Sqe, out: &mut [u8]) -> Outcome {
    let cdw10 = sqe.cdw(10);
    let cdw11 = sqe.cdw(11);
    let f = (cdw10 & 0xff) as u8;
    let Some(feature) = crate::supported::feature_of(f, ctrl.is_discovery(), volatile_cache(ns)) else {
        return Outcome::err(Status::INVALID_FIELD);
    };
    if ((cdw10 >> 8) & 7) as u8 == sel::SUPPORTED_CAPABILITIES {
        return Outcome::ok(feature.capabilities());
    }
    match f {
        fid::ARBITRATION => Outcome::ok(arbitration_burst(target.limits.rx_budget_pdus())),
        // Power state 0 (the only one, NPSS 0); no workload hint.
        fid::POWER_MGMT => Outcome::ok(0),
        fid::TEMP_THRESHOLD => {
            // TMPSEL 0h: the composite temperature (no other sensor); THSEL 00b over, 01b under.
            let (tmpsel, thsel) = ((cdw11 >> 16) & 0xf, (cdw11 >> 20) & 3);
            match (tmpsel, thsel) {
                // 70 °C over (the recommended warning threshold, as SPDK's WCTEMP), 0 K under.
                (0, 0) => Outcome::ok(343),
                (0, 1) => Outcome::ok(0),
                _ => Outcome::err(Status::INVALID_FIELD),
            }
        }
        // No time limited error recovery; deallocated blocks are not errors (DULBE 0).
        fid::ERROR_RECOVERY | fid::WRITE_ATOMIC => Outcome::ok(0),
        fid::VOLATILE_WC => Outcome::ok(1),
        fid::NUM_QUEUES => {
            let n = u32::from(ctrl.num_io_queues());
            Outcome::ok(NumQueues { nsq: n, ncq: n }.to_dw())
        }
        fid::KATO => Outcome::ok(ctrl.kato_ms()),
        fid::ASYNC_EVENT => Outcome::ok(ctrl.aen_enabled()),
        fid::HOST_ID => {
            // EXHID (CDW11 bit 0): the 128-bit Host Identifier a Fabrics host connected with.
            if cdw11 & 1 == 0 || out.len() < 16 {
                return Outcome::err(Status::INVALID_FIELD);
            }
            out.fill(0);
            out[..16].copy_from_slice(&ctrl.hostid);
            Outcome::ok(0)
        }
        fid::RESV_MASK => feature_ns(ns, sqe.nsid()).map_or_else(Outcome::err, |n| Outcome::ok(ctrl.resv_mask(n.nsid))),
        fid::RESV_PERSISTENCE => {
            feature_ns(ns, sqe.nsid()).map_or_else(Outcome::err, |n| Outcome::ok(u32::from(n.resv.ptpl())))
        }
        fid::WRITE_PROTECT => feature_ns(ns, sqe.nsid()).map_or_else(Outcome::err, |n| Outcome::ok(n.write_protect())),
        _ => unreachable!("feature {f:#04x} is in supported::FEATURES without a Get Features answer"),
    }
}

/// The namespace a namespace-specific feature names: an active NSID of this controller's
/// host. An NSID in range that names no active namespace is Invalid Field in Command, one
/// out of range (0, FFFFFFFFh here, past NN) Invalid Namespace or Format — as nvmet and
/// QEMU's controller answer (NVMe Base 2.0 §3.2.1.4: an inactive NSID is a valid one).
fn feature_ns(ns: &NsMap, nsid: Nsid) -> Result<&std::sync::Arc<crate::namespace::Namespace>, Status> {
    match ns.get(nsid) {
        Some(n) => Ok(n),
        None if (1..=MAX_NSID).contains(&nsid.0) => Err(Status::INVALID_FIELD),
        None => Err(Status::INVALID_NS),
    }
}

/// The Arbitration feature's Arbitration Burst (bits 2:0, a power of two; 111b no limit):
/// a connection's commands are parsed at most `rx_budget_pdus` PDUs per reactor turn (0: no
/// limit); weighted round robin is not offered (CAP.AMS 0), so the weights read 0.
fn arbitration_burst(rx_budget_pdus: u32) -> u32 {
    match rx_budget_pdus {
        0 | 65.. => 7,
        b => b.next_power_of_two().trailing_zeros(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::Backend;
    use crate::namespace::NamespaceSpec;
    use crate::port::{Port, PortKind};
    use crate::registry::TargetOptions;
    use crate::stats::NsCounters;
    use crate::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};

    #[test]
    fn smart_reads_a_namespace_or_sums_them_and_rounds_data_units_once() {
        let t = TargetState::new(TargetOptions::default());
        let s = Arc::new(
            Subsystem::new("nqn.t", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).unwrap(),
        );
        for nsid in [1, 2] {
            let spec = NamespaceSpec {
                nsid,
                backend: Backend::Null,
                size: Some(1 << 20),
                block_size: 512,
                anagrpid: 1,
                uuid: None,
                readonly: false,
                ptpl_file: None,
            };
            s.add_namespace(spec).unwrap();
        }
        let (map, _) = s.namespaces();
        // 600 units read on each namespace: one data unit each, two over the sum (1200).
        for n in map.iter() {
            n.counters.add(&NsCounters {
                host_read_commands: 3,
                data_read_bytes: 600 * 512,
                media_errors: u64::from(n.nsid.0),
                ..Default::default()
            });
        }
        let p = Arc::new(Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io));
        let c = Controller::new(nvme::Cntlid(1), Arc::clone(&s), p, "nqn.h".into(), [0; 16], 5000, 0);
        let one = smart_log(&t, &c, &map, Nsid(2)).unwrap();
        assert_eq!((one.host_reads, one.data_units_read, one.media_errors), (3, 1, 2));
        let all = smart_log(&t, &c, &map, Nsid::BROADCAST).unwrap();
        assert_eq!((all.host_reads, all.data_units_read, all.media_errors), (6, 2, 3));
        assert_eq!(smart_log(&t, &c, &map, Nsid(0)).unwrap(), all);
        assert_eq!(smart_log(&t, &c, &map, Nsid(3)), Err(Status::INVALID_NS));
        assert_eq!(all.power_on_hours, 0, "the target started just now");
    }

    #[test]
    fn arbitration_burst_is_the_pdu_budget_rounded_up_to_a_power_of_two() {
        // 2^AB is the most commands one queue gets per turn: at least the budget.
        assert_eq!(arbitration_burst(1), 0);
        assert_eq!(arbitration_burst(16), 4);
        assert_eq!(arbitration_burst(20), 5);
        assert_eq!(arbitration_burst(64), 6);
        assert_eq!(arbitration_burst(65), 7, "more than 64: only \"no limit\" covers it");
        assert_eq!(arbitration_burst(0), 7, "no budget: no limit");
    }
}
