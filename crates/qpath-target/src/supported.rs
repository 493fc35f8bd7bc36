//! What an I/O controller supports, each in one table: the commands it executes
//! ([`COMMANDS`], read back as the Commands Supported and Effects log page, LID 05h, and as
//! the command bits of Identify Controller ONCS), the log pages it serves ([`LOG_PAGES`],
//! the Supported Log Pages page, LID 00h) and the features it answers ([`FEATURES`], the
//! Feature Identifiers Supported and Effects page, LID 12h).
//!
//! ```text
//!   COMMANDS ──► LID 05h (ACS/IOCS), ONCS, how SMART counts each I/O opcode
//!   LOG_PAGES ─► LID 00h              FEATURES ─► LID 12h, Get Features SEL 11b
//! ```
//!
//! A new command, page or feature is one row here plus its handler. The tests below hold
//! the rows and the handlers ([`crate::admin::execute`], [`crate::io_cmd::plan`]) to each
//! other over all 256 opcodes, so neither can claim what the other does not do.
//!
//! Identify Controller LPA bit 5 would promise LID 00h, the Command Scope of every entry
//! of LID 05h, LID 12h and LID 13h (NVMe Base 2.0 §5.17.2.1), as SPDK (`lib/nvmf/ctrlr.c`)
//! does. Like Linux nvmet, this target serves LID 00h, 12h (with scopes) and 13h (empty:
//! no NVMe-MI commands) without setting the bit, and puts no scope in LID 05h: a Linux
//! host prints "IO command:NN has unusual effects" once for an I/O passthrough command
//! whose entry carries more than CSUPP and LBCC.

use nvme::features::{capabilities, fid};
use nvme::identify::oncs;
use nvme::log::{
    CommandEffects, ID_TABLE_SIZE, cmd_effects as ce, encode_id_table, fid_effects as fe, lid, lid_support,
};
use nvme::opcode::{admin, io};

/// The command set an opcode belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandSet {
    /// Admin commands (ACS entries).
    Admin,
    /// NVM Command Set I/O commands (IOCS entries for CSI 00h).
    Nvm,
}

/// How the SMART / Health log counts a completed I/O command (NVMe Base 1.4 §5.14.1.2,
/// 2.0 §5.16.1.3: Data Units Read and Host Read Commands count Read and Compare; Data
/// Units Written and Host Write Commands count Write, and "Write Uncorrectable and Write
/// Zeroes commands shall not impact" them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smart {
    /// Not counted.
    None,
    /// A host read command; its logical blocks are data read.
    Read,
    /// A host write command; its logical blocks are data written.
    Write,
}

/// One supported command.
#[derive(Clone, Copy, Debug)]
pub struct Command {
    /// Admin or NVM.
    pub set: CommandSet,
    /// Opcode.
    pub opcode: u8,
    /// Its name in the specification.
    pub name: &'static str,
    /// Its Commands Supported and Effects entry ([`nvme::log::cmd_effects`]; CSUPP is
    /// added for every row).
    pub effects: u32,
    /// The Identify Controller ONCS bit that announces it (0 for mandatory commands).
    pub oncs: u16,
    /// How the SMART / Health log counts it.
    pub smart: Smart,
}

const fn cmd(set: CommandSet, opcode: u8, name: &'static str, effects: u32, oncs: u16, smart: Smart) -> Command {
    Command { set, opcode, name, effects, oncs, smart }
}

use CommandSet::{Admin, Nvm};

/// Every command an I/O controller executes. Effects as Linux nvmet reports them: CSUPP,
/// and LBCC where the command can change what a read returns (Write, Write Zeroes, Copy,
/// and Dataset Management: deallocated blocks read as zeros here, DLFEAT 001b); no Command
/// Scope (a Linux host warns "IO command:NN has unusual effects" for an I/O entry with
/// more than CSUPP and LBCC, and nvmet sets none; so Identify Controller LPA bit 5, which
/// promises a scope on every entry, stays clear). Compare, Verify and the Compare of a fused
/// Compare and Write read; the Write of the pair is the Write row.
pub const COMMANDS: &[Command] = &[
    cmd(Admin, admin::GET_LOG_PAGE, "Get Log Page", 0, 0, Smart::None),
    cmd(Admin, admin::IDENTIFY, "Identify", 0, 0, Smart::None),
    cmd(Admin, admin::ABORT, "Abort", 0, 0, Smart::None),
    cmd(Admin, admin::SET_FEATURES, "Set Features", 0, 0, Smart::None),
    cmd(Admin, admin::GET_FEATURES, "Get Features", 0, 0, Smart::None),
    cmd(Admin, admin::ASYNC_EVENT_REQUEST, "Asynchronous Event Request", 0, 0, Smart::None),
    cmd(Admin, admin::KEEP_ALIVE, "Keep Alive", 0, 0, Smart::None),
    cmd(Nvm, io::FLUSH, "Flush", 0, 0, Smart::None),
    cmd(Nvm, io::WRITE, "Write", ce::LBCC, 0, Smart::Write),
    cmd(Nvm, io::READ, "Read", 0, 0, Smart::Read),
    cmd(Nvm, io::COMPARE, "Compare", 0, oncs::COMPARE, Smart::Read),
    cmd(Nvm, io::WRITE_ZEROES, "Write Zeroes", ce::LBCC, oncs::WRITE_ZEROES, Smart::None),
    cmd(Nvm, io::DATASET_MANAGEMENT, "Dataset Management", ce::LBCC, oncs::DSM, Smart::None),
    cmd(Nvm, io::VERIFY, "Verify", 0, oncs::VERIFY, Smart::None),
    cmd(Nvm, io::RESV_REGISTER, "Reservation Register", 0, oncs::RESERVATIONS, Smart::None),
    cmd(Nvm, io::RESV_REPORT, "Reservation Report", 0, oncs::RESERVATIONS, Smart::None),
    cmd(Nvm, io::RESV_ACQUIRE, "Reservation Acquire", 0, oncs::RESERVATIONS, Smart::None),
    cmd(Nvm, io::RESV_RELEASE, "Reservation Release", 0, oncs::RESERVATIONS, Smart::None),
    cmd(Nvm, io::COPY, "Copy", ce::LBCC, oncs::COPY, Smart::None),
];

/// The row of `opcode` in `set`, if the controller executes it.
pub fn command(set: CommandSet, opcode: u8) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.set == set && c.opcode == opcode)
}

/// How SMART counts each I/O opcode, looked up per completion (built from [`COMMANDS`]
/// at compile time: no search on the I/O path).
pub const SMART_BY_OPCODE: [Smart; 256] = {
    let mut t = [Smart::None; 256];
    let mut i = 0;
    while i < COMMANDS.len() {
        if matches!(COMMANDS[i].set, Nvm) {
            t[COMMANDS[i].opcode as usize] = COMMANDS[i].smart;
        }
        i += 1;
    }
    t
};

/// The command bits of Identify Controller ONCS: those of the commands in [`COMMANDS`].
pub fn oncs() -> u16 {
    COMMANDS.iter().fold(0, |a, c| a | c.oncs)
}

/// The Commands Supported and Effects page for I/O Command Set `csi` (CDW14 bits 31:24 of
/// the Get Log Page); `None` for a command set this target does not implement.
pub fn command_effects(csi: u8) -> Option<CommandEffects> {
    if csi != nvme::identify::csi::NVM {
        return None;
    }
    let mut page = CommandEffects::default();
    for c in COMMANDS {
        let table = match c.set {
            Admin => &mut page.admin,
            Nvm => &mut page.io,
        };
        table[usize::from(c.opcode)] = ce::CSUPP | c.effects;
    }
    Some(page)
}

/// One served log page.
#[derive(Clone, Copy, Debug)]
pub struct LogPage {
    /// Log page identifier.
    pub lid: u8,
    /// Its name.
    pub name: &'static str,
}

/// Every log page an I/O controller serves ([`crate::admin`] builds each).
pub const LOG_PAGES: &[LogPage] = &[
    LogPage { lid: lid::SUPPORTED, name: "Supported Log Pages" },
    LogPage { lid: lid::ERROR, name: "Error Information" },
    LogPage { lid: lid::SMART, name: "SMART / Health Information" },
    LogPage { lid: lid::FW_SLOT, name: "Firmware Slot Information" },
    LogPage { lid: lid::CHANGED_NS, name: "Changed Namespace List" },
    LogPage { lid: lid::CMD_EFFECTS, name: "Commands Supported and Effects" },
    LogPage { lid: lid::ANA, name: "Asymmetric Namespace Access" },
    LogPage { lid: lid::FEATURE_EFFECTS, name: "Feature Identifiers Supported and Effects" },
    LogPage { lid: lid::MI_EFFECTS, name: "NVMe-MI Commands Supported and Effects" },
    LogPage { lid: lid::RESERVATION, name: "Reservation Notification" },
];

/// The Supported Log Pages page (LID 00h).
pub fn supported_log_pages() -> [u8; ID_TABLE_SIZE] {
    encode_id_table(LOG_PAGES.iter().map(|p| (p.lid, lid_support::LSUPP)))
}

/// What a feature applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The controller (the NSID of Get/Set Features is not looked at, as in nvmet).
    Controller,
    /// A namespace named by the NSID.
    Namespace,
}

/// When a feature is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requires {
    /// Always.
    Nothing,
    /// Only when Identify Controller reports a volatile write cache (VWC bit 0).
    VolatileWriteCache,
}

/// One supported feature.
#[derive(Clone, Copy, Debug)]
pub struct Feature {
    /// Feature identifier.
    pub fid: u8,
    /// Its name.
    pub name: &'static str,
    /// What it applies to.
    pub scope: Scope,
    /// Set Features may change it (else Feature Not Changeable, or the status the
    /// specification gives the feature).
    pub changeable: bool,
    /// Discovery controllers answer it too.
    pub discovery: bool,
    /// When it is there.
    pub requires: Requires,
}

const fn feature(fid: u8, name: &'static str, scope: Scope, changeable: bool, discovery: bool) -> Feature {
    Feature { fid, name, scope, changeable, discovery, requires: Requires::Nothing }
}

/// Every feature Get Features answers: the mandatory ones of an NVM I/O controller, the
/// ones the Identify data advertise (VWC, reservations) and those a Fabrics host uses.
/// Compared with nvmet's `nvmet_execute_get_features`: nvmet answers neither Power
/// Management, Temperature Threshold, Error Recovery nor Write Atomicity Normal ("we
/// don't have a useful way to implement them"); this target reports their fixed values.
pub const FEATURES: &[Feature] = &[
    feature(fid::ARBITRATION, "Arbitration", Scope::Controller, false, false),
    feature(fid::POWER_MGMT, "Power Management", Scope::Controller, false, false),
    feature(fid::TEMP_THRESHOLD, "Temperature Threshold", Scope::Controller, false, false),
    // Namespace specific since DULBE (NVMe Base 2.0), as SPDK reports it.
    feature(fid::ERROR_RECOVERY, "Error Recovery", Scope::Namespace, false, false),
    Feature {
        requires: Requires::VolatileWriteCache,
        ..feature(fid::VOLATILE_WC, "Volatile Write Cache", Scope::Controller, false, false)
    },
    feature(fid::NUM_QUEUES, "Number of Queues", Scope::Controller, true, false),
    feature(fid::WRITE_ATOMIC, "Write Atomicity Normal", Scope::Controller, false, false),
    feature(fid::ASYNC_EVENT, "Asynchronous Event Configuration", Scope::Controller, true, true),
    feature(fid::KATO, "Keep Alive Timer", Scope::Controller, true, true),
    feature(fid::HOST_ID, "Host Identifier", Scope::Controller, false, false),
    feature(fid::RESV_MASK, "Reservation Notification Mask", Scope::Namespace, true, false),
    feature(fid::RESV_PERSISTENCE, "Reservation Persistence", Scope::Namespace, true, false),
    feature(fid::WRITE_PROTECT, "Namespace Write Protection Config", Scope::Namespace, true, false),
];

/// The row of `fid` for a controller (`discovery`) whose Identify data report a volatile
/// write cache or not (`vwc`), if it answers that feature.
pub fn feature_of(fid: u8, discovery: bool, vwc: bool) -> Option<&'static Feature> {
    FEATURES.iter().find(|f| {
        f.fid == fid
            && (!discovery || f.discovery)
            && match f.requires {
                Requires::Nothing => true,
                Requires::VolatileWriteCache => vwc,
            }
    })
}

impl Feature {
    /// Get Features with Select 11b: the supported capabilities (none is saveable).
    pub fn capabilities(&self) -> u32 {
        let ns = if self.scope == Scope::Namespace { capabilities::NS_SPECIFIC } else { 0 };
        ns | if self.changeable { capabilities::CHANGEABLE } else { 0 }
    }

    /// Its Feature Identifiers Supported and Effects entry.
    pub fn effects(&self) -> u32 {
        fe::FSUPP
            | match self.scope {
                Scope::Controller => fe::CSCPE,
                Scope::Namespace => fe::NSCPE,
            }
    }
}

/// The Feature Identifiers Supported and Effects page (LID 12h) of an I/O controller.
pub fn feature_effects(vwc: bool) -> [u8; ID_TABLE_SIZE] {
    encode_id_table(FEATURES.iter().filter_map(|f| feature_of(f.fid, false, vwc)).map(|f| (f.fid, f.effects())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};

    use super::*;
    use crate::admin::{Outcome, execute};
    use crate::backend::Backend;
    use crate::controller::Controller;
    use crate::namespace::{Namespace, NamespaceSpec};
    use crate::port::{Port, PortKind};
    use crate::registry::{TargetOptions, TargetState};
    use crate::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};

    fn ns() -> Namespace {
        let spec = NamespaceSpec {
            nsid: 1,
            backend: Backend::ram(1 << 20).unwrap(),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        };
        Namespace::new("nqn.t", Nsid(1), spec).unwrap()
    }

    #[test]
    fn every_io_opcode_plan_accepts_is_in_the_table_and_no_other() {
        let n = ns();
        let p = Port::new(1, "127.0.0.1:1".parse().unwrap(), PortKind::Io);
        for op in 0..=255u8 {
            if op == admin::FABRICS {
                continue;
            }
            let mut sqe = Sqe::rw(op, Cid(1), Nsid(1), 0, 0, SglDescriptor::transport(512));
            sqe.set_cdw(10, 0);
            let planned = crate::io_cmd::plan(&sqe, Some(&n), &p, 1 << 20);
            let in_table = command(Nvm, op).is_some();
            assert_eq!(
                planned != Err(Status::INVALID_OPCODE),
                in_table,
                "I/O opcode {op:#04x}: executed and listed in supported::COMMANDS must agree"
            );
        }
    }

    #[test]
    fn every_admin_opcode_execute_accepts_is_in_the_table_and_no_other() {
        let t = TargetState::new(TargetOptions::default());
        let s = Arc::new(
            Subsystem::new("nqn.t", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).unwrap(),
        );
        let p = Arc::new(Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io));
        let c = Controller::new(nvme::Cntlid(1), Arc::clone(&s), p, "nqn.h".into(), [0; 16], 5000, 0);
        let (map, _) = s.namespaces();
        let mut out = vec![0u8; 4096];
        for op in 0..=255u8 {
            if op == admin::FABRICS {
                continue;
            }
            let sqe = Sqe::new(op);
            let r = execute(&t, &c, &map, &sqe, &mut out, 0, 0);
            let refused = r == Outcome::Complete(Status::INVALID_OPCODE, 0, 0);
            assert_eq!(
                !refused,
                command(Admin, op).is_some(),
                "admin opcode {op:#04x}: executed and listed in supported::COMMANDS must agree"
            );
        }
    }

    #[test]
    fn every_listed_log_page_is_served_and_no_other() {
        let t = TargetState::new(TargetOptions::default());
        let s = Arc::new(
            Subsystem::new("nqn.t", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).unwrap(),
        );
        let p = Arc::new(Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io));
        let c = Controller::new(nvme::Cntlid(1), Arc::clone(&s), p, "nqn.h".into(), [0; 16], 5000, 0);
        let (map, _) = s.namespaces();
        let mut out = vec![0u8; 4096];
        for l in 0..=255u8 {
            let sqe = Sqe::get_log_page(Cid(1), Nsid::BROADCAST, l, 0, false, 4096, 0);
            let served = execute(&t, &c, &map, &sqe, &mut out, 0, 0) == Outcome::Complete(Status::SUCCESS, 0, 0);
            let listed = LOG_PAGES.iter().any(|p| p.lid == l);
            assert_eq!(served, listed, "LID {l:#04x}: served and listed in supported::LOG_PAGES must agree");
        }
    }

    #[test]
    fn every_feature_in_the_table_answers_get_and_set_as_its_row_says_and_no_other() {
        let t = TargetState::new(TargetOptions::default());
        let s = Arc::new(
            Subsystem::new("nqn.t", SubsysKind::Nvm, "1", "m", HostAccess::default(), SubsysLimits::default()).unwrap(),
        );
        s.add_namespace(NamespaceSpec {
            nsid: 1,
            backend: Backend::ram(1 << 20).unwrap(),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
        let p = Arc::new(Port::new(1, "127.0.0.1:4420".parse().unwrap(), PortKind::Io));
        let c = Controller::new(nvme::Cntlid(1), Arc::clone(&s), p, "nqn.h".into(), [7; 16], 5000, 0);
        let (map, _) = s.namespaces();
        let mut out = vec![0u8; 16];
        for f in 0..=255u8 {
            let row = feature_of(f, false, false);
            let mut get = Sqe::get_features(Cid(1), f);
            get.set_nsid(Nsid(1));
            get.set_cdw(11, 1); // EXHID, for the Host Identifier
            let got = execute(&t, &c, &map, &get, &mut out, 0, 0);
            let Outcome::Complete(status, _, _) = got else { panic!("FID {f:#04x}: {got:?}") };
            assert_eq!(status.is_success(), row.is_some(), "FID {f:#04x}: Get Features answers iff it is in FEATURES");
            if f == fid::HOST_ID {
                assert_eq!(out, [7; 16], "the Host Identifier of the Connect");
            }
            get.set_cdw(10, u32::from(f) | u32::from(nvme::features::sel::SUPPORTED_CAPABILITIES) << 8);
            let caps = execute(&t, &c, &map, &get, &mut out, 0, 0);
            match row {
                Some(r) => assert_eq!(caps, Outcome::Complete(Status::SUCCESS, r.capabilities(), 0), "FID {f:#04x}"),
                None => assert_eq!(caps, Outcome::Complete(Status::INVALID_FIELD, 0, 0), "FID {f:#04x}"),
            }
            let mut set = Sqe::set_features(Cid(2), f, 0);
            set.set_nsid(Nsid(1));
            let Outcome::Complete(status, _, _) = execute(&t, &c, &map, &set, &mut out, 0, 0) else { unreachable!() };
            let expected = match row {
                None => Some(Status::INVALID_FIELD),
                Some(r) if r.fid == fid::HOST_ID => Some(Status::COMMAND_SEQUENCE_ERROR),
                Some(r) if !r.changeable => Some(Status::FEATURE_NOT_CHANGEABLE),
                Some(_) => None,
            };
            match expected {
                Some(e) => assert_eq!(status, e, "Set Features FID {f:#04x}"),
                None => assert!(status.is_success(), "Set Features FID {f:#04x}: changeable, got {status}"),
            }
            set.set_cdw(10, u32::from(f) | 1 << 31);
            let Outcome::Complete(status, _, _) = execute(&t, &c, &map, &set, &mut out, 0, 0) else { unreachable!() };
            let expected = if row.is_some() { Status::FEATURE_NOT_SAVEABLE } else { Status::INVALID_FIELD };
            assert_eq!(status, expected, "Save of FID {f:#04x}");
        }
    }

    #[test]
    fn effects_page_lists_the_table_with_csupp_and_no_scope() {
        let e = command_effects(0).unwrap();
        for c in COMMANDS {
            let v = match c.set {
                Admin => e.admin[usize::from(c.opcode)],
                Nvm => e.io[usize::from(c.opcode)],
            };
            assert_eq!(v & ce::CSUPP, ce::CSUPP, "{}", c.name);
            assert_eq!(
                v & !(ce::CSUPP | ce::LBCC),
                0,
                "{}: CSUPP and LBCC only, as nvmet (Linux warns otherwise)",
                c.name
            );
        }
        let listed = e.admin.iter().chain(e.io.iter()).filter(|&&v| v != 0).count();
        assert_eq!(listed, COMMANDS.len());
        assert_eq!(e.io[usize::from(io::WRITE)] & ce::LBCC, ce::LBCC);
        assert_eq!(e.io[usize::from(io::READ)] & ce::LBCC, 0);
        assert!(command_effects(2).is_none(), "no Zoned Namespace command set");
        assert_eq!(SMART_BY_OPCODE[usize::from(io::READ)], Smart::Read);
        assert_eq!(SMART_BY_OPCODE[usize::from(io::WRITE_ZEROES)], Smart::None);
        assert_eq!(
            oncs(),
            oncs::COMPARE | oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS | oncs::VERIFY | oncs::COPY
        );
    }

    #[test]
    fn supported_log_pages_and_feature_effects_follow_their_tables() {
        let lids = nvme::log::decode_id_table(&supported_log_pages());
        for l in 0..=255u8 {
            let listed = LOG_PAGES.iter().any(|p| p.lid == l);
            assert_eq!(lids[usize::from(l)] == lid_support::LSUPP, listed, "LID {l:#04x}");
        }
        let fids = nvme::log::decode_id_table(&feature_effects(false));
        assert_eq!(fids[usize::from(fid::VOLATILE_WC)], 0, "no volatile write cache, no feature 06h");
        assert_eq!(fids[usize::from(fid::RESV_MASK)], fe::FSUPP | fe::NSCPE);
        assert_eq!(fids[usize::from(fid::KATO)], fe::FSUPP | fe::CSCPE);
        let fids = nvme::log::decode_id_table(&feature_effects(true));
        assert_eq!(fids[usize::from(fid::VOLATILE_WC)], fe::FSUPP | fe::CSCPE);
        assert!(feature_of(fid::NUM_QUEUES, true, false).is_none(), "discovery: KATO and AEC only");
        assert!(feature_of(fid::KATO, true, false).is_some());
    }
}
