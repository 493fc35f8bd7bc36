//! Compare, fused Compare and Write, Copy and Verify through an I/O queue, on RAM, file
//! and null namespaces: what each command does to the blocks, and every error status
//! (NVM Command Set 1.0 §3.2; NVMe Base 2.0 §3.4.2 fused operations). Identify advertises
//! them (ONCS, FUSES, OCFS; MSSRL, MCL, MSRC) with the limits enforced here.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use nvme::copy::SourceRange;
use nvme::identify::{IdentifyController, IdentifyNamespace, cns, fuses, ocfs, oncs};
use nvme::opcode::{fuse, io};
use nvme::tcp::Digests;
use nvme::{Nsid, SglDescriptor, Sqe, Status};
use qpath_target::backend::{Backend, FileBackend, FileRequest};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::registry::{TargetOptions, TargetState};
use support::*;

const RAM: u32 = 1;
const FILE: u32 = 2;
const NULL: u32 = 3;
const RAM_RO: u32 = 4;
const ICD: usize = 8192;
const NS_BYTES: u64 = 1 << 20;

/// A file removed when the test ends.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!("qpath-nvm-{tag}-{}-{n}.img", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spec(nsid: u32, backend: Backend, readonly: bool) -> NamespaceSpec {
    NamespaceSpec {
        nsid,
        backend,
        size: Some(NS_BYTES),
        block_size: 512,
        anagrpid: 1,
        uuid: None,
        readonly,
        ptpl_file: None,
    }
}

/// The test target (RAM namespace 1) with a file namespace 2, a null namespace 3 and a
/// read-only RAM namespace 4, all 1 MiB of 512-byte blocks.
fn setup(opts: TargetOptions, tag: &str) -> (Arc<TargetState>, TempFile) {
    let t = target_with(opts);
    let file = TempFile::new(tag);
    let s = t.subsystem(NQN).unwrap();
    let fb = FileBackend::open(&FileRequest::read_write(&file.0, Some(NS_BYTES), "a test namespace")).unwrap().0;
    s.add_namespace(spec(FILE, Backend::File(fb), false)).unwrap();
    s.add_namespace(spec(NULL, Backend::Null, false)).unwrap();
    s.add_namespace(spec(RAM_RO, Backend::ram(NS_BYTES).unwrap(), true)).unwrap();
    (t, file)
}

fn queue(t: &Arc<TargetState>) -> (Host, Host) {
    let mut a = Host::new(t, 1);
    let cntlid = a.admin_up(Digests::default());
    let q = Host::io_up(t, 1, cntlid, 1, Digests::default());
    (a, q)
}

fn compare(q: &mut Host, nsid: u32, slba: u64, data: &[u8]) -> Status {
    let cid = q.cid();
    let sqe = Sqe::rw(io::COMPARE, cid, Nsid(nsid), slba, (data.len() / 512) as u32, SglDescriptor::transport(0));
    q.batch(&[(sqe, data)], ICD)[0].status
}

/// A fused Compare and Write of `expect` -> `new` at `slba`: the two statuses.
fn caw(q: &mut Host, nsid: u32, slba: u64, expect: &[u8], new: &[u8]) -> (Status, Status) {
    let (c, w) = caw_pair(q, nsid, slba, expect.len());
    let cqes = q.batch(&[(c, expect), (w, new)], ICD);
    (cqes[0].status, cqes[1].status)
}

fn caw_pair(q: &mut Host, nsid: u32, slba: u64, len: usize) -> (Sqe, Sqe) {
    let nlb = (len / 512) as u32;
    let mut c = Sqe::rw(io::COMPARE, q.cid(), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
    c.set_fuse(fuse::FIRST);
    let mut w = Sqe::rw(io::WRITE, q.cid(), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
    w.set_fuse(fuse::SECOND);
    (c, w)
}

fn verify(q: &mut Host, nsid: u32, slba: u64, nlb: u32) -> Status {
    let cid = q.cid();
    q.batch(&[(Sqe::verify(cid, Nsid(nsid), slba, nlb), &[])], ICD)[0].status
}

fn copy(q: &mut Host, nsid: u32, sdlba: u64, ranges: &[(u64, u32)]) -> Status {
    let list: Vec<SourceRange> = ranges.iter().map(|&(slba, nlb)| SourceRange { slba, nlb }).collect();
    let data = SourceRange::encode_list(&list);
    let cid = q.cid();
    let sqe = Sqe::copy(cid, Nsid(nsid), sdlba, list.len() as u32, SglDescriptor::transport(0));
    q.batch(&[(sqe, &data)], ICD)[0].status
}

fn read(q: &mut Host, nsid: u32, slba: u64, len: usize) -> Vec<u8> {
    let (c, d) = q.read(nsid, slba, len);
    assert_eq!(c.status, Status::SUCCESS, "read {len} at {slba} of namespace {nsid}");
    d
}

fn write(q: &mut Host, nsid: u32, slba: u64, data: &[u8]) {
    assert_eq!(q.write(nsid, slba, data, ICD).status, Status::SUCCESS, "write at {slba} of namespace {nsid}");
}

#[test]
fn identify_advertises_the_commands_and_copy_limits() {
    let (t, _f) = setup(TargetOptions::default(), "identify");
    let (mut a, _q) = queue(&t);
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::CONTROLLER, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let id = IdentifyController::decode(&data);
    for bit in [oncs::COMPARE, oncs::VERIFY, oncs::COPY, oncs::DSM, oncs::WRITE_ZEROES] {
        assert_ne!(id.oncs & bit, 0, "ONCS bit {bit:#x}");
    }
    assert_eq!(id.fuses, fuses::COMPARE_AND_WRITE);
    assert_eq!(id.ocfs, ocfs::FORMAT_0);
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(FILE), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    let ns = IdentifyNamespace::decode(&data);
    // 1 MiB per Copy at most: 2048 blocks of 512 bytes; 128 ranges (0's based 127).
    assert_eq!((ns.mssrl, ns.mcl, ns.msrc), (2048, 2048, 127));
}

fn compare_on(nsid: u32) {
    let (t, _f) = setup(TargetOptions::default(), "compare");
    let (_a, mut q) = queue(&t);
    let small = pattern(4096, 3);
    let large = pattern(64 * 1024, 9);
    if nsid == NULL {
        // Null blocks read as zeros.
        assert_eq!(compare(&mut q, nsid, 0, &[0; 4096]), Status::SUCCESS);
        assert_eq!(compare(&mut q, nsid, 0, &small), Status::COMPARE_FAILURE);
        return;
    }
    write(&mut q, nsid, 8, &small);
    write(&mut q, nsid, 100, &large);
    assert_eq!(compare(&mut q, nsid, 8, &small), Status::SUCCESS, "in-capsule");
    assert_eq!(compare(&mut q, nsid, 100, &large), Status::SUCCESS, "through R2T");
    let mut off_by_one = large.clone();
    off_by_one[64 * 1024 - 1] ^= 1;
    assert_eq!(compare(&mut q, nsid, 100, &off_by_one), Status::COMPARE_FAILURE, "last byte differs");
    assert_eq!(compare(&mut q, nsid, 9, &small), Status::COMPARE_FAILURE, "other blocks");
    let (c, _) = q.read(nsid, 100, 64 * 1024);
    assert_eq!(c.status, Status::SUCCESS, "the queue still serves");
}

#[test]
fn compare_ram() {
    compare_on(RAM);
}

#[test]
fn compare_file() {
    compare_on(FILE);
}

#[test]
fn compare_null() {
    compare_on(NULL);
}

#[test]
fn compare_errors() {
    let opts = TargetOptions { mdts: 2, ..TargetOptions::default() };
    let (t, _f) = setup(opts, "compare-errors");
    let (_a, mut q) = queue(&t);
    assert_eq!(compare(&mut q, RAM, 2047, &[0; 1024]), Status::LBA_OUT_OF_RANGE);
    assert_eq!(compare(&mut q, RAM, u64::MAX, &[0; 512]), Status::LBA_OUT_OF_RANGE);
    assert_eq!(compare(&mut q, 9, 0, &[0; 512]), Status::INVALID_NS);
    // MDTS 2 is 16 KiB.
    assert_eq!(compare(&mut q, RAM, 0, &[0; 16 * 1024]), Status::SUCCESS);
    assert_eq!(compare(&mut q, RAM, 0, &[0; 20 * 1024]), Status::INVALID_FIELD, "beyond MDTS");
    // Compare reads: allowed on a read-only namespace.
    assert_eq!(compare(&mut q, RAM_RO, 0, &[0; 512]), Status::SUCCESS);
    // The SGL must carry NLB blocks.
    let cid = q.cid();
    let sqe = Sqe::rw(io::COMPARE, cid, Nsid(RAM), 0, 2, SglDescriptor::in_capsule(512));
    q.command(&sqe, &[0; 512]);
    assert_eq!(q.completion(cid).0.status, Status::DATA_SGL_LENGTH_INVALID);
}

fn caw_on(nsid: u32) {
    let (t, _f) = setup(TargetOptions::default(), "caw");
    let (_a, mut q) = queue(&t);
    let old = if nsid == NULL { vec![0; 4096] } else { pattern(4096, 1) };
    let new = pattern(4096, 2);
    if nsid != NULL {
        write(&mut q, nsid, 16, &old);
    }
    // A miscompare writes nothing.
    assert_eq!(caw(&mut q, nsid, 16, &new, &new), (Status::COMPARE_FAILURE, Status::FUSED_FAILED));
    if nsid != NULL {
        assert_eq!(read(&mut q, nsid, 16, 4096), old, "nothing written after a miscompare");
    }
    assert_eq!(caw(&mut q, nsid, 16, &old, &new), (Status::SUCCESS, Status::SUCCESS));
    if nsid == NULL {
        return;
    }
    assert_eq!(read(&mut q, nsid, 16, 4096), new);
    // Now the old data miscompares, the new compares.
    assert_eq!(caw(&mut q, nsid, 16, &old, &old), (Status::COMPARE_FAILURE, Status::FUSED_FAILED));
    assert_eq!(caw(&mut q, nsid, 16, &new, &old), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(read(&mut q, nsid, 16, 4096), old);
    // Through R2T, and with FUA on the Write.
    let big_old = pattern(32 * 1024, 5);
    let big_new = pattern(32 * 1024, 6);
    write(&mut q, nsid, 512, &big_old);
    let (c, mut w) = caw_pair(&mut q, nsid, 512, big_old.len());
    w.set_fua(true);
    let cqes = q.batch(&[(c, &big_old), (w, &big_new)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(read(&mut q, nsid, 512, big_new.len()), big_new);
    // Blocks next to the range are untouched.
    assert_eq!(read(&mut q, nsid, 8, 4096)[..4096], [0; 4096][..]);
}

#[test]
fn compare_and_write_ram() {
    caw_on(RAM);
}

#[test]
fn compare_and_write_file() {
    caw_on(FILE);
}

#[test]
fn compare_and_write_null() {
    caw_on(NULL);
}

/// Every way a fused pair can be malformed, on one queue that keeps serving.
#[test]
fn fused_pairing_errors() {
    let (t, _f) = setup(TargetOptions::default(), "fused");
    let (_a, mut q) = queue(&t);
    let data = pattern(4096, 7);
    write(&mut q, RAM, 0, &data);
    let read_cmd = |q: &mut Host, fuse_bits: u8| {
        let mut r = Sqe::rw(io::READ, q.cid(), Nsid(RAM), 0, 8, SglDescriptor::transport(4096));
        r.set_fuse(fuse_bits);
        r
    };

    // The Compare is not followed by its Write: Missing Fused Command; the Read runs.
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    let r = read_cmd(&mut q, fuse::NONE);
    q.command(&c.with_in_capsule(4096), &data);
    q.command(&r, &[]);
    assert_eq!(q.completion(c.cid()).0.status, Status::FUSED_MISSING);
    let (cqe, back) = q.completion(r.cid());
    assert_eq!((cqe.status, back), (Status::SUCCESS, data.clone()));

    // A Write with FUSE 10b and no Compare before it.
    let (_, w) = caw_pair(&mut q, RAM, 0, 4096);
    assert_eq!(q.batch(&[(w, &data)], ICD)[0].status, Status::FUSED_MISSING);

    // The second command is not a Write.
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    let r = read_cmd(&mut q, fuse::SECOND);
    q.command(&c.with_in_capsule(4096), &data);
    q.command(&r, &[]);
    assert_eq!(q.completion(c.cid()).0.status, Status::FUSED_MISSING);
    assert_eq!(q.completion(r.cid()).0.status, Status::INVALID_FIELD);

    // A Write over other blocks, or in another namespace: both Invalid Field.
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    let (_, w) = caw_pair(&mut q, RAM, 8, 4096);
    let cqes = q.batch(&[(c, &data), (w, &data)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::INVALID_FIELD, Status::INVALID_FIELD));
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    let (_, w) = caw_pair(&mut q, FILE, 0, 4096);
    let cqes = q.batch(&[(c, &data), (w, &data)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::INVALID_FIELD, Status::INVALID_FIELD));
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    let (_, w) = caw_pair(&mut q, RAM, 0, 2048);
    let cqes = q.batch(&[(c, &data), (w, &data[..2048])], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::INVALID_FIELD, Status::INVALID_FIELD), "other NLB");

    // Only a Compare opens a fused operation; its Write then fails with it.
    let (_, mut first) = caw_pair(&mut q, RAM, 0, 4096);
    first.set_fuse(fuse::FIRST);
    let (_, w) = caw_pair(&mut q, RAM, 0, 4096);
    let cqes = q.batch(&[(first, &data), (w, &data)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::INVALID_FIELD, Status::FUSED_FAILED));

    // The Compare fails its own checks: the Write fails with it, nothing written.
    let (c, w) = caw_pair(&mut q, RAM, 2047, 4096);
    let cqes = q.batch(&[(c, &data), (w, &[9; 4096])], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::LBA_OUT_OF_RANGE, Status::FUSED_FAILED));

    // The Write fails its own checks (read-only namespace: Compare may, Write may not).
    let (c, w) = caw_pair(&mut q, RAM_RO, 0, 4096);
    let cqes = q.batch(&[(c, &[0; 4096]), (w, &data)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::FUSED_FAILED, Status::NS_WRITE_PROTECTED));

    // FUSE 11b is reserved.
    let r = read_cmd(&mut q, 0b11);
    q.command(&r, &[]);
    assert_eq!(q.completion(r.cid()).0.status, Status::INVALID_FIELD);

    // Bad NSID on both.
    let (c, w) = caw_pair(&mut q, 9, 0, 4096);
    let cqes = q.batch(&[(c, &data), (w, &data)], ICD);
    assert_eq!((cqes[0].status, cqes[1].status), (Status::INVALID_NS, Status::FUSED_FAILED));

    // After all that, a good pair still works and nothing above wrote.
    assert_eq!(read(&mut q, RAM, 0, 4096), data);
    assert_eq!(caw(&mut q, RAM, 0, &data, &[1; 4096]), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(read(&mut q, RAM, 0, 4096), vec![1; 4096]);
}

/// A connection whose buffer cap holds one transfer: the Compare's data waits for its
/// Write, so the Write's R2T buffer (and the file read the compare needs) cannot wait for
/// the Compare's buffer to come back.
#[test]
fn compare_and_write_within_a_one_transfer_buffer_cap() {
    let opts = TargetOptions { max_buffer_bytes_per_connection: 4096, ..TargetOptions::default() };
    let (t, _f) = setup(opts, "caw-cap");
    let (_a, mut q) = queue(&t);
    for nsid in [RAM, FILE] {
        let (old, new) = (pattern(4096, 41), pattern(4096, 42));
        write(&mut q, nsid, 0, &old);
        let (c, w) = caw_pair(&mut q, nsid, 0, 4096);
        // ICD 0: both through R2T.
        let cqes = q.batch(&[(c, &old), (w, &new)], 0);
        assert_eq!((cqes[0].status, cqes[1].status), (Status::SUCCESS, Status::SUCCESS), "namespace {nsid}");
        assert_eq!(read(&mut q, nsid, 0, 4096), new);
        // A Compare and a Copy need a buffer beside their data too.
        let cid = q.cid();
        let sqe = Sqe::rw(io::COMPARE, cid, Nsid(nsid), 0, 8, SglDescriptor::transport(0));
        assert_eq!(q.batch(&[(sqe, &new)], 0)[0].status, Status::SUCCESS);
        assert_eq!(copy(&mut q, nsid, 100, &[(0, 8)]), Status::SUCCESS);
        assert_eq!(read(&mut q, nsid, 100, 4096), new);
    }
    assert_eq!(q.conn.buffer_bytes(), 0);
}

/// A Compare whose Write never comes ends with Missing Fused Command after the PDU timeout.
#[test]
fn fused_first_alone_times_out() {
    let opts = TargetOptions { pdu_timeout_ms: 50, ..TargetOptions::default() };
    let (t, _f) = setup(opts, "fused-timeout");
    let (_a, mut q) = queue(&t);
    let (c, _) = caw_pair(&mut q, RAM, 0, 4096);
    q.command(&c.with_in_capsule(4096), &[0; 4096]);
    assert!(q.recv().is_none(), "the Compare waits for its Write");
    std::thread::sleep(std::time::Duration::from_millis(80));
    q.tick();
    assert_eq!(q.completion(c.cid()).0.status, Status::FUSED_MISSING);
    assert!(!q.closed());
    // A late Write has no Compare to go with.
    let (_, w) = caw_pair(&mut q, RAM, 0, 4096);
    assert_eq!(q.batch(&[(w, &[0; 4096])], ICD)[0].status, Status::FUSED_MISSING);
}

fn verify_on(nsid: u32) {
    // MDTS 0 (4 KiB): a 1 MiB Verify reads 256 chunks on a file.
    let (t, _f) = setup(TargetOptions { mdts: 0, ..TargetOptions::default() }, "verify");
    let (_a, mut q) = queue(&t);
    assert_eq!(verify(&mut q, nsid, 0, 2048), Status::SUCCESS, "the whole namespace");
    assert_eq!(verify(&mut q, nsid, 2047, 1), Status::SUCCESS);
    let mut fua = Sqe::verify(q.cid(), Nsid(nsid), 0, 8);
    fua.set_fua(true);
    assert_eq!(q.batch(&[(fua, &[])], ICD)[0].status, Status::SUCCESS, "with FUA");
    assert_eq!(verify(&mut q, nsid, 2047, 2), Status::LBA_OUT_OF_RANGE);
    assert_eq!(verify(&mut q, nsid, u64::MAX, 1), Status::LBA_OUT_OF_RANGE);
}

#[test]
fn verify_ram() {
    verify_on(RAM);
}

#[test]
fn verify_file() {
    verify_on(FILE);
}

#[test]
fn verify_null() {
    verify_on(NULL);
}

#[test]
fn verify_errors() {
    let (t, file) = setup(TargetOptions::default(), "verify-errors");
    let (_a, mut q) = queue(&t);
    assert_eq!(verify(&mut q, 9, 0, 1), Status::INVALID_NS);
    assert_eq!(verify(&mut q, RAM_RO, 0, 8), Status::SUCCESS, "a read: allowed on a read-only namespace");
    // Verify takes no data: an SGL with a length is refused.
    let cid = q.cid();
    let mut v = Sqe::verify(cid, Nsid(RAM), 0, 1);
    v.set_sgl(SglDescriptor::transport(512));
    q.command(&v, &[]);
    assert_eq!(q.completion(cid).0.status, Status::DATA_SGL_LENGTH_INVALID);
    // Blocks the file no longer holds cannot be read: the file shrank under the namespace.
    std::fs::OpenOptions::new().write(true).open(&file.0).unwrap().set_len(NS_BYTES / 2).unwrap();
    assert_eq!(verify(&mut q, FILE, 0, 1024), Status::SUCCESS, "the half still there");
    assert_eq!(verify(&mut q, FILE, 1000, 100), Status::UNRECOVERED_READ_ERROR);
}

fn copy_on(nsid: u32) {
    let (t, _f) = setup(TargetOptions::default(), "copy");
    let (_a, mut q) = queue(&t);
    let a = pattern(4096, 11);
    let b = pattern(150 * 1024, 12);
    let c = pattern(1024, 13);
    write(&mut q, nsid, 0, &a);
    write(&mut q, nsid, 100, &b);
    write(&mut q, nsid, 900, &c);
    // One range.
    assert_eq!(copy(&mut q, nsid, 1000, &[(0, 8)]), Status::SUCCESS);
    // Three ranges, concatenated in order at the destination (the 150 KiB one is read in
    // pieces on a file).
    assert_eq!(copy(&mut q, nsid, 1200, &[(900, 2), (0, 8), (100, 300)]), Status::SUCCESS);
    if nsid == NULL {
        return;
    }
    assert_eq!(read(&mut q, nsid, 1000, 4096), a);
    let mut want = c.clone();
    want.extend_from_slice(&a);
    want.extend_from_slice(&b);
    assert_eq!(read(&mut q, nsid, 1200, want.len()), want);
    // Sources that overlap the destination copy as they were before the Copy: block 0..8
    // moved up by 4, and 900..902 appended.
    let mut before = read(&mut q, nsid, 0, 4096);
    before.extend_from_slice(&c);
    assert_eq!(copy(&mut q, nsid, 4, &[(0, 8), (900, 2)]), Status::SUCCESS);
    assert_eq!(read(&mut q, nsid, 4, before.len()), before);
    // The 128 ranges MSRC allows; FUA.
    let ranges: Vec<(u64, u32)> = (0..128).map(|i| (i, 1)).collect();
    let mut expect = read(&mut q, nsid, 0, 128 * 512);
    let list: Vec<SourceRange> = ranges.iter().map(|&(slba, nlb)| SourceRange { slba, nlb }).collect();
    let mut cp = Sqe::copy(q.cid(), Nsid(nsid), 1600, 128, SglDescriptor::transport(0));
    cp.set_fua(true);
    assert_eq!(q.batch(&[(cp, &SourceRange::encode_list(&list))], ICD)[0].status, Status::SUCCESS);
    assert_eq!(read(&mut q, nsid, 1600, expect.len()), expect);
    // The most blocks MCL allows in one Copy: 2048 of 2048 (the whole namespace onto itself).
    expect = read(&mut q, nsid, 0, NS_BYTES as usize);
    assert_eq!(copy(&mut q, nsid, 0, &[(0, 1024), (1024, 1024)]), Status::SUCCESS);
    assert_eq!(read(&mut q, nsid, 0, NS_BYTES as usize), expect);
}

#[test]
fn copy_ram() {
    copy_on(RAM);
}

#[test]
fn copy_file() {
    copy_on(FILE);
}

#[test]
fn copy_null() {
    copy_on(NULL);
}

#[test]
fn copy_errors() {
    let (t, _f) = setup(TargetOptions::default(), "copy-errors");
    let (_a, mut q) = queue(&t);
    let dest = pattern(4096, 21);
    write(&mut q, RAM, 500, &dest);
    let unchanged = |q: &mut Host| assert_eq!(read(q, RAM, 500, 4096), dest, "nothing written");
    // LBA out of range in a source or in the destination: nothing written.
    assert_eq!(copy(&mut q, RAM, 500, &[(0, 4), (2047, 2)]), Status::LBA_OUT_OF_RANGE);
    assert_eq!(copy(&mut q, RAM, 2047, &[(0, 2)]), Status::LBA_OUT_OF_RANGE);
    assert_eq!(copy(&mut q, RAM, u64::MAX, &[(0, 1)]), Status::LBA_OUT_OF_RANGE);
    unchanged(&mut q);
    // Too many ranges (MSRC 127: 128), a range too long (MSSRL 2048), too long in all (MCL).
    let many: Vec<(u64, u32)> = (0..129).map(|i| (i, 1)).collect();
    assert_eq!(copy(&mut q, RAM, 500, &many), Status::COMMAND_SIZE_LIMIT_EXCEEDED);
    let s = copy(&mut q, FILE, 0, &[(0, 2049)]);
    assert_eq!(s, Status::COMMAND_SIZE_LIMIT_EXCEEDED, "one range beyond MSSRL");
    assert_eq!(copy(&mut q, RAM, 500, &[(0, 2000), (0, 49)]), Status::COMMAND_SIZE_LIMIT_EXCEEDED, "MCL");
    unchanged(&mut q);
    // Read-only namespace, unknown namespace, descriptor format 1h.
    assert_eq!(copy(&mut q, RAM_RO, 0, &[(8, 1)]), Status::NS_WRITE_PROTECTED);
    assert_eq!(copy(&mut q, 9, 0, &[(8, 1)]), Status::INVALID_NS);
    let data = SourceRange::encode_list(&[SourceRange { slba: 0, nlb: 1 }]);
    let mut f1 = Sqe::copy(q.cid(), Nsid(RAM), 500, 1, SglDescriptor::transport(0));
    f1.set_cdw(12, f1.cdw(12) | (1 << 8));
    assert_eq!(q.batch(&[(f1, &data)], ICD)[0].status, Status::INVALID_FIELD);
    // The data must be NR entries of 32 bytes.
    let cid = q.cid();
    let short = Sqe::copy(cid, Nsid(RAM), 500, 2, SglDescriptor::in_capsule(32));
    q.command(&short, &data);
    assert_eq!(q.completion(cid).0.status, Status::DATA_SGL_LENGTH_INVALID);
    unchanged(&mut q);
}

/// A namespace replaced under its NSID while a Copy on it is between file operations:
/// the Copy ends (Invalid Namespace) and writes nothing to the namespace that took the NSID.
#[test]
fn a_copy_does_not_continue_on_a_namespace_that_replaced_its_own() {
    let (t, _f) = setup(TargetOptions::default(), "copy-replaced");
    let (_a, mut q) = queue(&t);
    write(&mut q, FILE, 0, &pattern(8192, 51));
    let list = SourceRange::encode_list(&[SourceRange { slba: 0, nlb: 8 }, SourceRange { slba: 8, nlb: 8 }]);
    let cid = q.cid();
    let cp = Sqe::copy(cid, Nsid(FILE), 100, 2, SglDescriptor::in_capsule(64));
    let mut bytes = Vec::new();
    q.enc.capsule_cmd(&mut bytes, &cp, 64);
    bytes.extend_from_slice(&list);
    // The Copy's first read is done, its completion not yet delivered.
    q.feed_only(&bytes);
    let s = t.subsystem(NQN).unwrap();
    s.remove_namespace(Nsid(FILE)).unwrap();
    let other = TempFile::new("copy-replaced-new");
    let fb = FileBackend::open(&FileRequest::read_write(&other.0, Some(NS_BYTES), "a test namespace")).unwrap().0;
    s.add_namespace(spec(FILE, Backend::File(fb), false)).unwrap();
    // The next command makes the queue see the new namespace map.
    let (c, _) = q.read(RAM, 0, 512);
    assert_eq!(c.status, Status::SUCCESS);
    q.pump();
    assert_eq!(q.completion(cid).0.status, Status::INVALID_NS);
    assert_eq!(read(&mut q, FILE, 100, 8192), vec![0; 8192], "nothing written to the new namespace");
}

/// The range of one fused Compare and Write is held against writes from other queues:
/// a queue's write to those blocks waits until the fused operation ends (file backend:
/// the operation spans file completions the test delivers one queue at a time).
#[test]
fn a_write_waits_for_a_compare_and_write_on_another_queue() {
    let (t, _f) = setup(TargetOptions::default(), "caw-vs-write");
    let (_a, mut q1) = queue(&t);
    let mut a2 = Host::new(&t, 1);
    let cntlid = a2.admin_up(Digests::default());
    let mut q2 = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    let old = pattern(4096, 31);
    write(&mut q1, FILE, 0, &old);
    let ns = t.subsystem(NQN).unwrap().namespaces().0.get(Nsid(FILE)).cloned().unwrap();
    // Lock blocks 4..12 as a fused operation of another reactor would.
    let (hold, granted) = ns.locks.lock_begin(4..12);
    assert!(granted);
    // A write overlapping it waits (retried from the timers), one beside it does not.
    let cid = q2.cid();
    let w = Sqe::rw(io::WRITE, cid, Nsid(FILE), 8, 8, SglDescriptor::in_capsule(4096));
    let ccid = q2.cid();
    let beside = Sqe::rw(io::WRITE, ccid, Nsid(FILE), 12, 8, SglDescriptor::in_capsule(4096));
    let mut bytes = Vec::new();
    q2.enc.capsule_cmd(&mut bytes, &w, 4096);
    bytes.extend_from_slice(&[7; 4096]);
    q2.enc.capsule_cmd(&mut bytes, &beside, 4096);
    bytes.extend_from_slice(&[8; 4096]);
    q2.feed_only(&bytes);
    q2.turn();
    assert_eq!(q2.completion(ccid).0.status, Status::SUCCESS, "the write beside the lock ran");
    assert!(q2.conn.next_timer().is_some(), "the overlapping write waits on the timers");
    std::thread::sleep(std::time::Duration::from_millis(2));
    q2.turn();
    assert!(q2.recv().is_none(), "still waiting after retries");
    // A Compare and Write of blocks 0..8 overlaps too: it waits as well, behind the write.
    let (c, w1) = caw_pair(&mut q1, FILE, 0, 4096);
    let mut bytes = Vec::new();
    q1.enc.capsule_cmd(&mut bytes, &c.with_in_capsule(4096), 4096);
    bytes.extend_from_slice(&old);
    q1.enc.capsule_cmd(&mut bytes, &w1.with_in_capsule(4096), 4096);
    bytes.extend_from_slice(&[5; 4096]);
    q1.feed_only(&bytes);
    q1.turn();
    assert!(q1.recv().is_none(), "the fused operation waits for the blocks");
    assert!(q1.conn.next_timer().is_some());
    ns.locks.end(hold);
    q2.pump();
    assert_eq!(q2.completion(cid).0.status, Status::SUCCESS);
    q1.pump();
    assert_eq!(q1.completion(c.cid()).0.status, Status::SUCCESS);
    assert_eq!(q1.completion(w1.cid()).0.status, Status::SUCCESS);
    assert_eq!(read(&mut q1, FILE, 0, 4096), vec![5; 4096]);
    assert_eq!(read(&mut q1, FILE, 8, 4096), vec![7; 4096]);
    assert!(!ns.locks.is_active() && ns.locks.entries() == 0, "every hold given back");
}

/// Two queues on two threads (two reactor gauges) increment a counter block by fused
/// Compare and Write (read it, Compare it, Write it + 1, again on a miscompare) while a
/// third writes the blocks beside it: no increment may be lost, on RAM and on a file.
fn caw_hammer(nsid: u32) {
    let (t, _f) = setup(TargetOptions::default(), "hammer");
    let mut admin = Host::new(&t, 1);
    let cntlid = admin.admin_up(Digests::default());
    let mk = |qid: u16, reactor: usize| {
        // Each queue on its own reactor's gauge.
        let mut h = Host::on_reactor(&t, 1, reactor);
        h.icreq(Digests::default());
        let c = h.connect(qid, cntlid, NQN, HOSTNQN, 127);
        assert_eq!(c.status, Status::SUCCESS);
        h
    };
    let mut q0 = mk(1, 0);
    write(&mut q0, nsid, 0, &[0; 512]);
    let per_thread = 300u64;
    let counter = |mut q: Host| {
        std::thread::spawn(move || {
            let mut done = 0;
            let mut miscompares = 0u64;
            while done < per_thread {
                let block = read(&mut q, nsid, 0, 512);
                let v = u64::from_le_bytes(block[..8].try_into().unwrap());
                let mut next = vec![0; 512];
                next[..8].copy_from_slice(&(v + 1).to_le_bytes());
                next[8..16].copy_from_slice(&(v + 1).to_le_bytes());
                match caw(&mut q, nsid, 0, &block, &next) {
                    (Status::SUCCESS, Status::SUCCESS) => done += 1,
                    (Status::COMPARE_FAILURE, Status::FUSED_FAILED) => miscompares += 1,
                    other => panic!("compare and write: {other:?}"),
                }
            }
            miscompares
        })
    };
    let a = counter(mk(2, 1));
    let b = counter(mk(3, 2));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut q, stop) = (mk(4, 3), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(1);
                write(&mut q, nsid, 1, &[n; 4096]);
            }
        })
    };
    let miscompares = a.join().unwrap() + b.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let block = read(&mut q0, nsid, 0, 512);
    let v = u64::from_le_bytes(block[..8].try_into().unwrap());
    assert_eq!(v, 2 * per_thread, "increments lost ({miscompares} miscompares)");
    assert_eq!(&block[8..16], &block[..8], "a torn counter block");
    eprintln!("{} increments, {miscompares} miscompares", 2 * per_thread);
}

#[test]
fn compare_and_write_hammer_ram() {
    caw_hammer(RAM);
}

#[test]
fn compare_and_write_hammer_file() {
    caw_hammer(FILE);
}

trait InCapsule {
    fn with_in_capsule(&self, len: u32) -> Sqe;
}

impl InCapsule for Sqe {
    fn with_in_capsule(&self, len: u32) -> Sqe {
        let mut s = *self;
        s.set_sgl(SglDescriptor::in_capsule(len));
        s
    }
}
