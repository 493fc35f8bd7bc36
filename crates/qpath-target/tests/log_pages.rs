//! A host reads every log page the controller lists in its Supported Log Pages page after
//! real I/O, and checks what each says: the SMART counters of each namespace and of the
//! controller, the error log entry of a command that failed, the effects of the commands
//! it ran, and the Identify Controller bits that announce the pages.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use nvme::features::fid;
use nvme::identify::{IdentifyController, cns, lpa, oncs};
use nvme::log::{
    AnaLog, CMD_EFFECTS_SIZE, CommandEffects, ErrorLogEntry, ID_TABLE_SIZE, ResvNotification, SmartLog, cmd_effects,
    decode_id_table, fid_effects, lid, lid_support,
};
use nvme::opcode::{admin, io};
use nvme::tcp::Digests;
use nvme::{Nsid, SglDescriptor, Sqe, Status};
use qpath_target::backend::Backend;
use qpath_target::namespace::NamespaceSpec;
use support::*;

/// The length to read each page with: its whole size.
fn page_len(l: u8) -> u32 {
    match l {
        lid::SUPPORTED | lid::FEATURE_EFFECTS => ID_TABLE_SIZE as u32,
        lid::ERROR => 64 * 64,
        lid::SMART | lid::FW_SLOT => 512,
        lid::CHANGED_NS => 4096,
        lid::CMD_EFFECTS | lid::MI_EFFECTS => CMD_EFFECTS_SIZE as u32,
        lid::ANA => 4096,
        lid::RESERVATION => 64,
        other => panic!("the test does not know page {other:#04x}: add it"),
    }
}

fn log_page(h: &mut Host, nsid: Nsid, l: u8) -> (Status, Vec<u8>) {
    let cid = h.cid();
    let (c, data) = h.admin(Sqe::get_log_page(cid, nsid, l, 0, false, page_len(l), 0));
    (c.status, data)
}

fn smart(h: &mut Host, nsid: Nsid) -> SmartLog {
    let (s, data) = log_page(h, nsid, lid::SMART);
    assert_eq!(s, Status::SUCCESS, "SMART for NSID {:#x}", nsid.0);
    SmartLog::decode(&data)
}

#[test]
fn every_advertised_log_page_reads_back_after_io() {
    let t = target();
    // A second namespace with 4 KiB blocks: per-namespace SMART counts stay apart, and its
    // data units are counted in 512-byte units.
    let s = t.subsystem(NQN).unwrap();
    s.add_namespace(NamespaceSpec {
        nsid: 2,
        backend: Backend::ram(1 << 20).unwrap(),
        size: None,
        block_size: 4096,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    })
    .unwrap();
    let mut h = Host::new(&t, 1);
    let cntlid = h.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());

    // Identify Controller announces the pages: SMART per namespace, effects, extended
    // data, Log Page Support; ONCS the optional commands the effects page lists.
    let cid = h.cid();
    let (_, data) = h.admin(Sqe::identify(cid, cns::CONTROLLER, Nsid(0), 0, 0));
    let id = IdentifyController::decode(&data);
    assert_eq!(id.lpa, lpa::SMART_PER_NS | lpa::CMD_EFFECTS | lpa::EXTENDED_DATA, "no LPA bit 5: no scopes (as nvmet)");
    assert_eq!(id.elpe, 63);

    // Real I/O: 3 writes and 2 reads of 4 KiB on namespace 1, one 8 KiB write and one
    // read on namespace 2, a Write Zeroes (not counted by SMART), and a read past the end.
    let block = pattern(4096, 7);
    for i in 0..3 {
        assert_eq!(q.write(1, i * 8, &block, 8192).status, Status::SUCCESS);
    }
    for i in 0..2 {
        assert_eq!(q.read(1, i * 8, 4096).0.status, Status::SUCCESS);
    }
    let big = pattern(8192, 9);
    let cid = q.cid();
    let w = Sqe::rw(io::WRITE, cid, Nsid(2), 0, 2, SglDescriptor::in_capsule(8192));
    q.command(&w, &big);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let cid = q.cid();
    q.command(&Sqe::rw(io::READ, cid, Nsid(2), 0, 1, SglDescriptor::transport(4096)), &[]);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let cid = q.cid();
    q.command(&Sqe::write_zeroes(cid, Nsid(1), 100, 7, false), &[]);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    let bad_cid = q.cid();
    q.command(&Sqe::rw(io::READ, bad_cid, Nsid(1), 2047, 2, SglDescriptor::transport(1024)), &[]);
    let (bad, _) = q.completion(bad_cid);
    assert_eq!(bad.status, Status::LBA_OUT_OF_RANGE);
    assert!(bad.more, "the completion says an Error Information entry describes it (More)");
    // The queue publishes its counters on its tick.
    q.tick();

    let (st, data) = log_page(&mut h, Nsid::BROADCAST, lid::SUPPORTED);
    assert_eq!(st, Status::SUCCESS);
    let supported = decode_id_table(&data);
    let lids: Vec<u8> = (0..=255u8).filter(|l| supported[usize::from(*l)] & lid_support::LSUPP != 0).collect();
    assert_eq!(
        lids,
        [
            lid::SUPPORTED,
            lid::ERROR,
            lid::SMART,
            lid::FW_SLOT,
            lid::CHANGED_NS,
            lid::CMD_EFFECTS,
            lid::ANA,
            lid::FEATURE_EFFECTS,
            lid::MI_EFFECTS,
            lid::RESERVATION,
        ]
    );
    for l in lids {
        let (st, data) = log_page(&mut h, Nsid::BROADCAST, l);
        assert_eq!(st, Status::SUCCESS, "page {l:#04x} is listed, so it reads");
        assert_eq!(data.len(), page_len(l) as usize);
        match l {
            lid::SUPPORTED => assert_eq!(decode_id_table(&data), supported),
            lid::ERROR => {
                // The read past the end is the newest entry, and the only one.
                let e = ErrorLogEntry::decode(&data[..64]);
                assert_eq!((e.error_count, e.sqid, e.cid, e.nsid, e.lba), (1, 1, bad_cid.0, 1, 2047));
                assert_eq!(Status::from_wire(e.status), Status::LBA_OUT_OF_RANGE);
                assert_eq!(e.param_error_location, 40, "CDW10: the SLBA");
                assert!(data[64..].iter().all(|&b| b == 0), "one error so far");
            }
            lid::SMART => {
                let all = SmartLog::decode(&data);
                // Namespace 1: 3 × 4 KiB written, 2 × 4 KiB read; namespace 2: 8 KiB, 4 KiB.
                assert_eq!((all.host_writes, all.host_reads), (4, 3), "Write Zeroes is not a host write");
                assert_eq!((all.data_units_written, all.data_units_read), (1, 1), "(40 and 24 units) / 1000, up");
                assert_eq!((all.num_err_log_entries, all.media_errors), (1, 0));
                assert_eq!((all.temperature_k, all.avail_spare, all.unsafe_shutdowns), (0, 100, 0));
            }
            lid::FW_SLOT | lid::MI_EFFECTS => assert!(data.iter().all(|&b| b == 0), "page {l:#04x}"),
            lid::CHANGED_NS => {} // Namespace 2 was added before this controller: nothing pending.
            lid::CMD_EFFECTS => {
                let e = CommandEffects::decode(&data);
                assert_eq!(e.admin[usize::from(admin::GET_LOG_PAGE)] & cmd_effects::CSUPP, cmd_effects::CSUPP);
                assert_eq!(e.io[usize::from(io::WRITE)], cmd_effects::CSUPP | cmd_effects::LBCC);
                assert_eq!(e.io[usize::from(io::READ)], cmd_effects::CSUPP);
                assert_eq!(e.admin[0x80], 0, "no Format NVM");
                // ONCS announces the optional commands the page lists, and no other.
                for (bit, ops) in [
                    (oncs::DSM, &[io::DATASET_MANAGEMENT][..]),
                    (oncs::WRITE_ZEROES, &[io::WRITE_ZEROES]),
                    (oncs::RESERVATIONS, &[io::RESV_REGISTER, io::RESV_ACQUIRE, io::RESV_RELEASE, io::RESV_REPORT]),
                    (oncs::COMPARE, &[io::COMPARE]),
                ] {
                    for op in ops {
                        let listed = e.io[usize::from(*op)] & cmd_effects::CSUPP != 0;
                        assert_eq!(listed, id.oncs & bit != 0, "opcode {op:#04x} and ONCS {bit:#x}");
                    }
                }
            }
            lid::ANA => assert_eq!(AnaLog::decode(&data).unwrap().groups[0].nsids, [Nsid(1), Nsid(2)]),
            // No reservation changed: an empty page (reservation_notifications.rs fills it).
            lid::RESERVATION => assert_eq!(ResvNotification::decode(&data), ResvNotification::default()),
            lid::FEATURE_EFFECTS => {
                let f = decode_id_table(&data);
                assert_eq!(f[usize::from(fid::NUM_QUEUES)], fid_effects::FSUPP | fid_effects::CSCPE);
                assert_eq!(f[usize::from(fid::RESV_MASK)], fid_effects::FSUPP | fid_effects::NSCPE);
                assert_eq!(f[usize::from(fid::VOLATILE_WC)], 0, "RAM namespaces: no volatile write cache");
            }
            _ => unreachable!(),
        }
    }

    // Per namespace (LPA bit 0): each namespace's own counters; NSID 0 is the whole controller.
    let ns1 = smart(&mut h, Nsid(1));
    assert_eq!((ns1.host_writes, ns1.host_reads, ns1.data_units_written, ns1.data_units_read), (3, 2, 1, 1));
    let ns2 = smart(&mut h, Nsid(2));
    assert_eq!((ns2.host_writes, ns2.host_reads), (1, 1));
    assert_eq!(smart(&mut h, Nsid(0)), smart(&mut h, Nsid::BROADCAST));
    let (st, _) = log_page(&mut h, Nsid(9), lid::SMART);
    assert_eq!(st, Status::INVALID_NS, "no namespace 9");

    // Data units are thousands of 512-byte units, rounded up: 1000 units read is one data
    // unit, 1008 are two.
    for i in 0..123 {
        assert_eq!(q.read(1, 16 + (i % 100) * 8, 4096).0.status, Status::SUCCESS);
    }
    q.tick();
    let ns1 = smart(&mut h, Nsid(1));
    assert_eq!((ns1.host_reads, ns1.data_units_read), (125, 1), "125 reads × 8 units = 1000 units");
    assert_eq!(q.read(1, 0, 4096).0.status, Status::SUCCESS);
    q.tick();
    assert_eq!(smart(&mut h, Nsid(1)).data_units_read, 2, "1008 units");

    // Command effects for a command set this controller has none of: the page is invalid.
    let cid = h.cid();
    let mut sqe = Sqe::get_log_page(cid, Nsid::BROADCAST, lid::CMD_EFFECTS, 0, false, 4096, 0);
    sqe.set_cdw(14, 2 << 24);
    assert_eq!(h.admin(sqe).0.status, Status::INVALID_LOG_PAGE);
    // A page the controller does not list.
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::get_log_page(cid, Nsid(0), 0x06, 0, false, 512, 0)).0.status, Status::INVALID_LOG_PAGE);
}

#[test]
fn a_failed_admin_command_is_logged_with_its_field() {
    let t = target();
    let mut h = Host::new(&t, 1);
    h.admin_up(Digests::default());
    let cid = h.cid();
    assert_eq!(h.admin(Sqe::get_log_page(cid, Nsid(0), 0x42, 0, false, 512, 0)).0.status, Status::INVALID_LOG_PAGE);
    let (_, data) = log_page(&mut h, Nsid::BROADCAST, lid::ERROR);
    let e = ErrorLogEntry::decode(&data[..64]);
    assert_eq!((e.error_count, e.sqid, e.cid, e.lba, e.param_error_location), (1, 0, cid.0, 0, 40));
    assert_eq!(Status::from_wire(e.status), Status::INVALID_LOG_PAGE);
    assert_eq!(smart(&mut h, Nsid::BROADCAST).num_err_log_entries, 1);
}

#[test]
fn a_backend_read_failure_is_a_media_error() {
    // A file-backed namespace whose file shrinks under the target: reading past the new end
    // is a short read, which fails with Unrecovered Read Error (a media status).
    let dir = std::env::temp_dir().join(format!("qpath-logs-media-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let t = target();
    use qpath_target::backend::{Access, FileBackend, FileRequest};
    let req = FileRequest { path: &path, size: None, grow: false, access: Access::ReadWrite, owner: "namespace 3" };
    let (file, _) = FileBackend::open(&req).unwrap();
    t.subsystem(NQN)
        .unwrap()
        .add_namespace(NamespaceSpec {
            nsid: 3,
            backend: Backend::File(file),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
    let mut h = Host::new(&t, 1);
    let cntlid = h.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    assert_eq!(q.read(3, 1024, 4096).0.status, Status::SUCCESS);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    let (c, _) = q.read(3, 1024, 4096);
    assert_eq!(c.status.sct, nvme::Sct::Media, "{}", c.status);
    q.tick();
    let ns3 = smart(&mut h, Nsid(3));
    assert_eq!((ns3.media_errors, ns3.host_reads), (1, 1), "the failed read is an error, not a host read");
    assert_eq!(smart(&mut h, Nsid(1)).media_errors, 0);
    assert_eq!(smart(&mut h, Nsid::BROADCAST).media_errors, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// libnvme reads the ANA log in 4 KiB pieces up to the most it can hold (from Identify's
/// NANAGRPID and NN): a piece past today's groups reads zeros instead of failing, so
/// `nvme ana-log` works (it failed with Invalid Field in Command).
#[test]
fn the_ana_log_reads_in_pieces_up_to_its_largest_size() {
    let t = target();
    let mut h = Host::new(&t, 1);
    h.admin_up(Digests::default());
    let cid = h.cid();
    let (c, first) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, true, 4096, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let log = nvme::log::AnaLog::decode(&first).unwrap();
    assert_eq!(log.groups.len(), 1);
    assert_eq!(log.groups[0].nsids, [Nsid(1)]);
    // 16 + 32 groups x 32 + 1024 NSIDs x 4 = 5136 bytes at most: the second piece.
    let cid = h.cid();
    let (c, rest) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, true, 1040, 4096));
    assert_eq!(c.status, Status::SUCCESS, "an offset inside the largest page");
    assert!(rest.iter().all(|&b| b == 0));
    let cid = h.cid();
    let (c, _) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, true, 4, 5140));
    assert_eq!(c.status, Status::INVALID_FIELD, "past the largest page");
}

/// A Compare that does not match fails with a Media status (Compare Failure) but is no
/// media or data integrity error: SMART does not count it as one (it counted it).
#[test]
fn a_miscompare_is_not_a_media_error() {
    let t = target();
    let mut h = Host::new(&t, 1);
    let cntlid = h.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    assert_eq!(q.write(1, 0, &pattern(512, 1), 8192).status, Status::SUCCESS);
    let cid = q.cid();
    q.command(&Sqe::rw(io::COMPARE, cid, Nsid(1), 0, 1, SglDescriptor::in_capsule(512)), &pattern(512, 2));
    assert_eq!(q.completion(cid).0.status, Status::COMPARE_FAILURE);
    q.tick();
    let s = smart(&mut h, Nsid(1));
    assert_eq!((s.media_errors, s.num_err_log_entries), (0, 1), "logged as an error, not counted as media");
}
