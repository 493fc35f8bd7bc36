//! Everything the target advertises works, on every kind of namespace: this test reads
//! Identify Controller and Identify Namespace through qpath's host, walks every bit the
//! target sets in ONCS, FUSES, OCFS, LPA, OACS, NWPC, VWC, DLFEAT and RESCAP and the
//! limits it gives (MDTS, MSSRL, MCL, MSRC), and exercises each one on a RAM namespace, a
//! file namespace and (as root, through a loop device) a block-device namespace. A bit it
//! does not know how to exercise fails the test: a new promise needs a new check here.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod loopback;
mod raw_host;

use host::queue::{DataDir, Io};
use nvme::copy::SourceRange;
use nvme::features::{fid, write_protect};
use nvme::identify::{IdentifyNamespace, cns, fuses, lpa, nwpc, ocfs, oncs};
use nvme::log::{SmartLog, lid};
use nvme::opcode::io;
use nvme::reservation::{ACQUIRE, REGISTER, RELEASE, REPLACE, UNREGISTER};
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use raw_host::{Host, NQN, buf, pattern};
use target::backend::{Backend, FileBackend, FileRequest};
use target::namespace::NamespaceSpec;

const RAM: u32 = 1;
const FILE: u32 = 2;
const BLOCK: u32 = 3;
const BS: usize = 512;

/// The bits this test knows how to exercise; any other set bit fails it.
const ONCS_EXERCISED: u16 =
    oncs::COMPARE | oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS | oncs::VERIFY | oncs::COPY;
const LPA_EXERCISED: u8 = lpa::SMART_PER_NS | lpa::CMD_EFFECTS | lpa::EXTENDED_DATA;

fn admin(h: &Host, sqe: Sqe, len: u32) -> (Status, u32, Vec<u8>) {
    let dir = if len == 0 { DataDir::None } else { DataDir::FromController };
    let b = (len > 0).then(|| buf(&vec![0; len as usize]));
    let done = h.ctrl.admin_command(Io { sqe, buf: b, len, dir, token: 0 }).expect("an admin completion");
    let data = done.buf.map(|b| b[..len as usize].to_vec()).unwrap_or_default();
    (done.cqe.status, done.cqe.dw0, data)
}

fn identify_ns(h: &Host, nsid: u32) -> IdentifyNamespace {
    let (s, _, data) = admin(h, Sqe::identify(Cid(0), cns::NAMESPACE, Nsid(nsid), 0, 0), 4096);
    assert_eq!(s, Status::SUCCESS);
    IdentifyNamespace::decode(&data)
}

fn set_feature(h: &Host, f: u8, nsid: u32, value: u32) -> Status {
    let mut sqe = Sqe::set_features(Cid(0), f, value);
    sqe.set_nsid(Nsid(nsid));
    admin(h, sqe, 0).0
}

fn io_status(h: &mut Host, sqe: Sqe, data: &[u8]) -> Status {
    let dir = if data.is_empty() { DataDir::None } else { DataDir::ToController };
    h.exec(sqe, data, dir).cqe.status
}

fn resv(h: &mut Host, nsid: u32, opcode: u8, cdw10: u32, keys: &[u64]) -> Status {
    let data: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    let mut sqe = Sqe::new(opcode);
    sqe.set_nsid(Nsid(nsid));
    sqe.set_cdw(10, cdw10);
    sqe.set_sgl(SglDescriptor::transport(0));
    io_status(h, sqe, &data)
}

/// Exercises what Identify Namespace `nsid` promises, and the controller-wide command bits
/// on it.
fn exercise_namespace(h: &mut Host, nsid: u32, id_oncs: u16, id_fuses: u16, mdts_bytes: usize) {
    let id = identify_ns(h, nsid);
    let what = format!("namespace {nsid}");
    assert_eq!(1usize << id.lbaf[0].lbads, BS, "{what}: this test writes 512-byte blocks");
    let a = pattern(64 << 10, nsid as u8);
    h.write(nsid, 0, &a);
    assert!(h.read(nsid, 0, a.len()) == a, "{what}: write and read");
    assert_eq!(io_status(h, Sqe::flush(Cid(0), Nsid(nsid)), &[]), Status::SUCCESS, "{what}: flush");

    // MDTS: a transfer of exactly MDTS works, one block more is refused.
    let big = pattern(mdts_bytes, 9);
    h.write(nsid, 0, &big);
    assert!(h.read(nsid, 0, mdts_bytes) == big, "{what}: an MDTS-sized transfer");
    let over = Sqe::rw(io::WRITE, Cid(0), Nsid(nsid), 0, (mdts_bytes / BS + 1) as u32, SglDescriptor::transport(0));
    assert_eq!(io_status(h, over, &vec![1; mdts_bytes + BS]), Status::INVALID_FIELD, "{what}: MDTS + 1 block");
    h.write(nsid, 0, &a);

    if id_oncs & oncs::COMPARE != 0 {
        assert_eq!(h.compare(nsid, 0, &a[..8192]), Status::SUCCESS, "{what}: Compare");
        assert_eq!(h.compare(nsid, 1, &a[..8192]), Status::COMPARE_FAILURE, "{what}: Compare");
    }
    if id_fuses & fuses::COMPARE_AND_WRITE != 0 {
        let new = pattern(4096, 0x77);
        assert_eq!(h.caw(nsid, 0, &a[..4096], &new), (Status::SUCCESS, Status::SUCCESS), "{what}: CAW");
        assert_eq!(h.caw(nsid, 0, &a[..4096], &new), (Status::COMPARE_FAILURE, Status::FUSED_FAILED));
        h.write(nsid, 0, &a[..4096]);
    }
    if id_oncs & oncs::VERIFY != 0 {
        assert_eq!(h.verify(nsid, 0, 128), Status::SUCCESS, "{what}: Verify");
    }
    if id_oncs & oncs::COPY != 0 {
        // OCFS format 0 within the namespace's MSSRL, MCL and MSRC; one more range, refused.
        let n = u32::from(id.msrc) + 1;
        assert!(u64::from(n) * 2 <= u64::from(id.mcl) && id.mssrl >= 2, "{what}: copy limits {id:?}");
        let ranges: Vec<SourceRange> = (0..n).map(|i| SourceRange { slba: u64::from(i % 64) * 2, nlb: 2 }).collect();
        assert_eq!(h.copy(nsid, 4096, &ranges), Status::SUCCESS, "{what}: Copy of MSRC + 1 ranges");
        // Ranges 0 and 1 are blocks 0..2 and 2..4: the destination starts with blocks 0..4.
        let got = h.read(nsid, 4096, 4 * BS);
        assert!(got == a[..4 * BS], "{what}: Copy's data");
        let too_many: Vec<SourceRange> = (0..=n).map(|i| SourceRange { slba: u64::from(i), nlb: 1 }).collect();
        assert_eq!(h.copy(nsid, 4096, &too_many), Status::COMMAND_SIZE_LIMIT_EXCEEDED, "{what}: MSRC");
        let long = [SourceRange { slba: 0, nlb: u32::from(id.mssrl) + 1 }];
        assert_eq!(h.copy(nsid, 8192, &long), Status::COMMAND_SIZE_LIMIT_EXCEEDED, "{what}: MSSRL");
    }
    // DLFEAT 2:0 = 001b: deallocated blocks read as zeros; bit 3: Write Zeroes may deallocate.
    let zeros_after_dealloc = id.dlfeat & 7 == 1;
    assert!(id.dlfeat & 7 <= 1 && id.dlfeat & !0x0f == 0, "{what}: DLFEAT {:#x}", id.dlfeat);
    if id_oncs & oncs::DSM != 0 {
        h.write(nsid, 0, &a);
        let mut ranges = vec![0u8; 4096];
        for (i, (slba, nlb)) in [(8u64, 8u32), (32, 16), (100, 4)].iter().enumerate() {
            ranges[i * 16 + 4..i * 16 + 8].copy_from_slice(&nlb.to_le_bytes());
            ranges[i * 16 + 8..i * 16 + 16].copy_from_slice(&slba.to_le_bytes());
        }
        let sqe = Sqe::dsm_deallocate(Cid(0), Nsid(nsid), 3, SglDescriptor::transport(0));
        assert_eq!(io_status(h, sqe, &ranges[..48]), Status::SUCCESS, "{what}: Deallocate");
        let back = h.read(nsid, 0, 128 * BS);
        for (slba, nlb) in [(8usize, 8usize), (32, 16), (100, 4)] {
            let got = &back[slba * BS..(slba + nlb) * BS];
            if zeros_after_dealloc {
                assert!(got.iter().all(|&b| b == 0), "{what}: DLFEAT promises zeros at {slba}");
            }
        }
        assert!(back[16 * BS..32 * BS] == a[16 * BS..32 * BS], "{what}: blocks between the ranges kept");
    }
    if id_oncs & oncs::WRITE_ZEROES != 0 {
        for deallocate in [false, id.dlfeat & 8 != 0] {
            h.write(nsid, 0, &a);
            let sqe = Sqe::write_zeroes(Cid(0), Nsid(nsid), 16, 8, deallocate);
            assert_eq!(io_status(h, sqe, &[]), Status::SUCCESS, "{what}: Write Zeroes (DEAC {deallocate})");
            let back = h.read(nsid, 8, 24 * BS);
            assert!(back[8 * BS..16 * BS].iter().all(|&b| b == 0), "{what}: Write Zeroes reads zeros");
            assert!(back[..8 * BS] == a[8 * BS..16 * BS], "{what}: the blocks before kept");
        }
    }
    if id_oncs & oncs::RESERVATIONS != 0 {
        // Every reservation type RESCAP lists (bits 1..=6) can be acquired and released.
        assert_eq!(resv(h, nsid, io::RESV_REGISTER, u32::from(REGISTER), &[0, 0xabc]), Status::SUCCESS);
        if id.rescap & 0x80 != 0 {
            // Ignore Existing Key: a Replace with IEKEY set needs no current key.
            let replace = u32::from(REPLACE) | 1 << 3;
            assert_eq!(resv(h, nsid, io::RESV_REGISTER, replace, &[0x999, 0xabc]), Status::SUCCESS, "{what}: IEKEY");
            let replace = u32::from(REPLACE);
            assert_eq!(resv(h, nsid, io::RESV_REGISTER, replace, &[0x999, 0xabc]), Status::RESERVATION_CONFLICT);
        }
        for rtype in 1..=6u8 {
            if id.rescap & (1 << rtype) == 0 {
                continue;
            }
            let cdw10 = u32::from(ACQUIRE) | u32::from(rtype) << 8;
            assert_eq!(resv(h, nsid, io::RESV_ACQUIRE, cdw10, &[0xabc, 0]), Status::SUCCESS, "{what}: type {rtype}");
            let cdw10 = u32::from(RELEASE) | u32::from(rtype) << 8;
            assert_eq!(resv(h, nsid, io::RESV_RELEASE, cdw10, &[0xabc]), Status::SUCCESS, "{what}: type {rtype}");
        }
        if id.rescap & 1 != 0 {
            // Persist Through Power Loss: the feature can be turned on and off.
            assert_eq!(set_feature(h, fid::RESV_PERSISTENCE, nsid, 1), Status::SUCCESS, "{what}: PTPL");
            assert_eq!(set_feature(h, fid::RESV_PERSISTENCE, nsid, 0), Status::SUCCESS);
        }
        let cdw10 = u32::from(UNREGISTER) | 1 << 3;
        assert_eq!(resv(h, nsid, io::RESV_REGISTER, cdw10, &[0, 0]), Status::SUCCESS, "{what}: unregister");
    }
}

fn exercise_controller(h: &mut Host, nsids: &[u32]) {
    let id = h.ctrl.identify();
    assert_eq!(id.oncs & !ONCS_EXERCISED, 0, "ONCS {:#x}: a bit this test does not exercise", id.oncs);
    assert_eq!(id.fuses & !fuses::COMPARE_AND_WRITE, 0, "FUSES {:#x}", id.fuses);
    assert_eq!(id.ocfs & !ocfs::FORMAT_0, 0, "OCFS {:#x}", id.ocfs);
    assert_eq!(id.oacs, 0, "OACS {:#x}: no optional admin command is exercised here", id.oacs);
    assert_eq!(id.lpa & !LPA_EXERCISED, 0, "LPA {:#x}", id.lpa);
    assert_eq!(id.nwpc & !(nwpc::WRITE_PROTECT | nwpc::UNTIL_POWER_CYCLE), 0, "NWPC {:#x}", id.nwpc);
    if id.ocfs & ocfs::FORMAT_0 != 0 {
        assert_ne!(id.oncs & oncs::COPY, 0, "OCFS without Copy");
    }
    let mdts_bytes = 4096usize << id.mdts;
    for &nsid in nsids {
        exercise_namespace(h, nsid, id.oncs, id.fuses, mdts_bytes);
    }
    let nsid = nsids[0];
    // LPA bit 0: SMART per namespace; bit 1: the effects page; bit 2: offsets.
    if id.lpa & lpa::SMART_PER_NS != 0 {
        let sqe = Sqe::get_log_page(Cid(0), Nsid(nsid), lid::SMART, 0, false, 512, 0);
        let (s, _, data) = admin(h, sqe, 512);
        assert_eq!(s, Status::SUCCESS);
        assert!(SmartLog::decode(&data).host_writes > 0, "namespace {nsid}'s SMART counts its writes");
    }
    if id.lpa & lpa::CMD_EFFECTS != 0 {
        let (s, _, data) =
            admin(h, Sqe::get_log_page(Cid(0), Nsid::BROADCAST, lid::CMD_EFFECTS, 0, false, 4096, 0), 4096);
        assert_eq!(s, Status::SUCCESS);
        let e = nvme::log::CommandEffects::decode(&data);
        for (bit, opcode) in [(oncs::COMPARE, io::COMPARE), (oncs::VERIFY, io::VERIFY), (oncs::COPY, io::COPY)] {
            if id.oncs & bit != 0 {
                assert_eq!(e.io[usize::from(opcode)] & 1, 1, "the effects page lists opcode {opcode:#x}");
            }
        }
    }
    if id.lpa & lpa::EXTENDED_DATA != 0 {
        // A page whose content does not move between two reads (the SMART counters do: each
        // queue publishes its counts at its tick), read whole and from an offset: the I/O
        // command effects, which start at byte 1024.
        let page = |off: u64, len: u32| {
            admin(h, Sqe::get_log_page(Cid(0), Nsid::BROADCAST, lid::CMD_EFFECTS, 0, false, len, off), len)
        };
        let whole = page(0, 4096).2;
        let (s, _, part) = page(1024, 64);
        assert_eq!(s, Status::SUCCESS);
        assert!(part.iter().any(|&b| b != 0), "the I/O commands' effects are not all zero");
        assert_eq!(part[..64], whole[1024..1088], "a log page read from an offset");
    }
    // NWPC: write protection, and a host cannot lift Until Power Cycle (not tried here:
    // it would last until the target restarts).
    if id.nwpc & nwpc::WRITE_PROTECT != 0 {
        assert_eq!(set_feature(h, fid::WRITE_PROTECT, nsid, write_protect::PROTECT), Status::SUCCESS);
        let w = Sqe::rw(io::WRITE, Cid(0), Nsid(nsid), 0, 1, SglDescriptor::transport(0));
        assert_eq!(io_status(h, w, &[0; BS]), Status::NS_WRITE_PROTECTED);
        assert_eq!(set_feature(h, fid::WRITE_PROTECT, nsid, write_protect::NONE), Status::SUCCESS);
        h.write(nsid, 0, &[0; BS]);
    }
    // VWC: a volatile write cache is flushed by Flush (exercised above on every namespace).
    assert!(id.vwc <= 1, "VWC {:#x}", id.vwc);
}

struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A loop device over a file, detached when dropped.
struct Loop {
    dev: String,
    _file: TempFile,
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn loop_device(dir: &std::path::Path) -> Result<Loop, String> {
    // SAFETY-free check: geteuid through /proc is enough for a test.
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    if !root {
        return Err("not root".into());
    }
    let path = dir.join(format!("qpath-advertised-{}-block.img", std::process::id()));
    std::fs::write(&path, vec![0u8; 16 << 20]).map_err(|e| e.to_string())?;
    let file = TempFile(path);
    let out = std::process::Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&file.0)
        .output()
        .map_err(|e| format!("losetup: {e}"))?;
    if !out.status.success() {
        return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(Loop { dev: String::from_utf8_lossy(&out.stdout).trim().to_string(), _file: file })
}

fn add_file_namespace(server: &target::server::Server, nsid: u32, path: &std::path::Path, size: Option<u64>) {
    let owner = format!("namespace {nsid}");
    let fb = FileBackend::open(&FileRequest::read_write(path, size, &owner)).expect("the namespace's file").0;
    let spec = NamespaceSpec {
        nsid,
        backend: Backend::File(fb),
        size: None,
        block_size: BS as u32,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    };
    server.state.subsystem(NQN).unwrap().add_namespace(spec).expect("add the namespace");
}

#[test]
fn every_advertised_bit_works_on_ram_file_and_block_device_namespaces_needs_root_for_block() {
    let (server, addrs) = loopback::target(2, "16M");
    let dir = std::env::temp_dir();
    let file = TempFile(dir.join(format!("qpath-advertised-{}-file.img", std::process::id())));
    add_file_namespace(&server, FILE, &file.0, Some(16 << 20));
    let mut nsids = vec![RAM, FILE];
    let lo = match loop_device(&dir) {
        Ok(lo) => {
            add_file_namespace(&server, BLOCK, std::path::Path::new(&lo.dev), None);
            nsids.push(BLOCK);
            Some(lo)
        }
        Err(why) => {
            println!("SKIP: the block-device namespace ({why}); RAM and file namespaces are checked");
            None
        }
    };
    let mut h = Host::connect(addrs[0]);
    exercise_controller(&mut h, &nsids);
    drop(h.qp);
    h.ctrl.delete();
    server.shutdown();
    drop(lo);
}
