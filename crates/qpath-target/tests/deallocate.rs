//! Dataset Management Deallocate and Write Zeroes on every backend, through an I/O queue of
//! the in-process loopback transport (the file operations run on the real file or block
//! device with the real `fallocate`): every range of a multi-range Deallocate reads back as
//! zeros where DLFEAT promises it and nothing else changes; a bad range anywhere fails the
//! command before any range is touched; the data must hold NR x 16 bytes and at most room
//! for 256 ranges (Linux always sends 4096 bytes); 256 ranges in one command; Write Zeroes with and without DEAC; DLFEAT per backend. A regular file in a temp
//! directory (ext4 or whatever it is), one on tmpfs (punches holes but has no ZERO_RANGE),
//! and, as root, loop block devices (one that can deallocate, one whose discard is off).

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use nvme::identify::{IdentifyNamespace, cns};
use nvme::opcode::io;
use nvme::tcp::{DataHeader, Digests, Header};
use nvme::{Cqe, Nsid, SglDescriptor, Sqe, Status};
use qpath_target::backend::{Backend, FileBackend};
use qpath_target::namespace::NamespaceSpec;
use qpath_target::registry::TargetState;
use support::*;

/// Every namespace here: 1 MiB of 512-byte blocks.
const NS_BYTES: usize = 1 << 20;
const BLOCKS: u64 = (NS_BYTES / 512) as u64;

fn add_ns(t: &Arc<TargetState>, nsid: u32, backend: Backend) {
    t.subsystem(NQN)
        .unwrap()
        .add_namespace(NamespaceSpec {
            nsid,
            backend,
            size: Some(NS_BYTES as u64),
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
}

fn file_backend(path: &Path) -> Backend {
    Backend::File(open_file(path, Some(NS_BYTES as u64)))
}

/// An admin and an I/O queue of the test target.
fn queues(t: &Arc<TargetState>) -> (Host, Host) {
    let mut a = Host::new(t, 1);
    let cntlid = a.admin_up(Digests::default());
    let q = Host::io_up(t, 1, cntlid, 1, Digests::default());
    (a, q)
}

fn dlfeat(a: &mut Host, nsid: u32) -> u8 {
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(nsid), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    IdentifyNamespace::decode(&data).dlfeat
}

/// A command whose `data` goes out by R2T + H2CData (SGL: transport, `data.len()` bytes).
fn command_with_data(q: &mut Host, sqe: &Sqe, data: &[u8]) -> Cqe {
    let cid = sqe.cid();
    q.command(sqe, &[]);
    let r2t = match q.expect().header {
        Header::R2T(r) => r,
        Header::CapsuleResp(c) => return c,
        h => panic!("expected R2T, got {h:?}"),
    };
    assert_eq!(r2t.r2tl as usize, data.len());
    let d = DataHeader { cccid: cid, ttag: r2t.ttag, datao: 0, datal: data.len() as u32, last: true, success: false };
    let mut out = Vec::new();
    q.enc.h2c_data(&mut out, &d);
    out.extend_from_slice(data);
    q.send(&out);
    q.completion(cid).0
}

fn ranges(list: &[(u64, u32)]) -> Vec<u8> {
    list.iter()
        .enumerate()
        .flat_map(|(i, &(slba, nlb))| {
            let mut r = [0u8; 16];
            // Context attributes are hints: any value.
            r[0..4].copy_from_slice(&(i as u32 * 0x0101_0101).to_le_bytes());
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&slba.to_le_bytes());
            r
        })
        .collect()
}

fn deallocate(q: &mut Host, nsid: u32, list: &[(u64, u32)]) -> Status {
    let data = ranges(list);
    let cid = q.cid();
    let sqe = Sqe::dsm_deallocate(cid, Nsid(nsid), list.len() as u32, SglDescriptor::transport(data.len() as u32));
    command_with_data(q, &sqe, &data).status
}

fn write_zeroes(q: &mut Host, nsid: u32, slba: u64, nlb: u32, deac: bool) -> Status {
    let cid = q.cid();
    q.command(&Sqe::write_zeroes(cid, Nsid(nsid), slba, nlb, deac), &[]);
    q.completion(cid).0.status
}

/// What the namespace holds after `fill`: a pattern.
fn fill(q: &mut Host, nsid: u32, seed: u8) -> Vec<u8> {
    let image = pattern(NS_BYTES, seed);
    for (i, chunk) in image.chunks(128 * 1024).enumerate() {
        assert_eq!(q.write(nsid, (i * 256) as u64, chunk, 0).status, Status::SUCCESS);
    }
    image
}

fn read_all(q: &mut Host, nsid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(NS_BYTES);
    for i in 0..NS_BYTES / (128 * 1024) {
        let (c, data) = q.read(nsid, (i * 256) as u64, 128 * 1024);
        assert_eq!(c.status, Status::SUCCESS);
        out.extend_from_slice(&data);
    }
    out
}

fn zero_blocks(image: &mut [u8], slba: u64, nlb: u32) {
    image[slba as usize * 512..(slba as usize + nlb as usize) * 512].fill(0);
}

/// Asserts the namespace reads as `want`, naming the first block that differs.
fn assert_image(q: &mut Host, nsid: u32, want: &[u8], what: &str) {
    let got = read_all(q, nsid);
    if let Some(b) = (0..BLOCKS as usize).find(|&b| got[b * 512..(b + 1) * 512] != want[b * 512..(b + 1) * 512]) {
        let zeros = got[b * 512..(b + 1) * 512].iter().all(|&x| x == 0);
        panic!("{what}: block {b} differs (reads {})", if zeros { "zeros" } else { "data" });
    }
}

/// The scenario every backend whose DLFEAT promises zeros passes.
fn deallocate_and_zeroes(a: &mut Host, q: &mut Host, nsid: u32, what: &str) {
    assert_eq!(dlfeat(a, nsid), 0x09, "{what}: DLFEAT 001b + Write Zeroes Deallocate");
    let mut image = fill(q, nsid, 7);

    // Several ranges in one command, as Linux merges discards: each one reads zeros.
    let list = [(8, 8), (100, 4), (300, 0), (1000, 24), (2040, 8)];
    assert_eq!(deallocate(q, nsid, &list), Status::SUCCESS, "{what}");
    for &(slba, nlb) in &list {
        zero_blocks(&mut image, slba, nlb);
    }
    assert_image(q, nsid, &image, &format!("{what}: after a 5-range deallocate"));

    // A bad range anywhere: LBA Out of Range, and no range is touched.
    let mut bad: Vec<(u64, u32)> = (0..6).map(|i| (200 + i * 16, 8)).collect();
    bad.push((BLOCKS - 1, 2));
    assert_eq!(deallocate(q, nsid, &bad), Status::LBA_OUT_OF_RANGE, "{what}");
    assert_image(q, nsid, &image, &format!("{what}: after a refused deallocate"));

    // NR says 3 ranges, the data carries 2: refused (Data SGL Length Invalid), nothing changes.
    let data = ranges(&[(400, 8), (500, 8)]);
    let cid = q.cid();
    let sqe = Sqe::dsm_deallocate(cid, Nsid(nsid), 3, SglDescriptor::in_capsule(data.len() as u32));
    q.command(&sqe, &data);
    assert_eq!(q.completion(cid).0.status, Status::DATA_SGL_LENGTH_INVALID, "{what}");
    assert_image(q, nsid, &image, &format!("{what}: after a data length mismatch"));

    // As Linux sends it (`nvme_setup_discard`): NR ranges in a buffer with room for 256.
    // The bytes after NR ranges are not read (here: ranges out of the namespace).
    let mut data = ranges(&[(600, 8), (700, 16)]);
    data.extend(ranges(&vec![(u64::MAX - 1, 9); 254]));
    assert_eq!(data.len(), 4096);
    let cid = q.cid();
    q.command(&Sqe::dsm_deallocate(cid, Nsid(nsid), 2, SglDescriptor::in_capsule(4096)), &data);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS, "{what}: 2 ranges in 4096 bytes");
    zero_blocks(&mut image, 600, 8);
    zero_blocks(&mut image, 700, 16);
    assert_image(q, nsid, &image, &format!("{what}: after a deallocate with room for 256 ranges"));
    // More than room for 256 ranges: refused.
    let mut long = ranges(&[(800, 8)]);
    long.resize(4112, 0);
    let cid = q.cid();
    let sqe = Sqe::dsm_deallocate(cid, Nsid(nsid), 1, SglDescriptor::transport(4112));
    assert_eq!(command_with_data(q, &sqe, &long).status, Status::DATA_SGL_LENGTH_INVALID, "{what}");
    assert_image(q, nsid, &image, &format!("{what}: after a deallocate with too much data"));

    // The most ranges one command carries: 256.
    let many: Vec<(u64, u32)> = (0..256).map(|i| (i * 8 + 2, 3)).collect();
    assert_eq!(deallocate(q, nsid, &many), Status::SUCCESS, "{what}");
    for &(slba, nlb) in &many {
        zero_blocks(&mut image, slba, nlb);
    }
    assert_image(q, nsid, &image, &format!("{what}: after a 256-range deallocate"));

    // Write Zeroes, keeping the blocks allocated and deallocating them.
    let mut image = fill(q, nsid, 9);
    assert_eq!(write_zeroes(q, nsid, 17, 300, false), Status::SUCCESS, "{what}");
    zero_blocks(&mut image, 17, 300);
    assert_eq!(write_zeroes(q, nsid, 1500, 548, true), Status::SUCCESS, "{what}");
    zero_blocks(&mut image, 1500, 548);
    assert_image(q, nsid, &image, &format!("{what}: after write zeroes"));
    assert_eq!(write_zeroes(q, nsid, BLOCKS - 4, 5, true), Status::LBA_OUT_OF_RANGE, "{what}");
}

fn temp_dir(tag: &str, under: &Path) -> PathBuf {
    let dir = under.join(format!("qpath-dealloc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn ram_and_null_namespaces() {
    let t = target(); // NSID 1: RAM
    add_ns(&t, 2, Backend::Null);
    let (mut a, mut q) = queues(&t);
    deallocate_and_zeroes(&mut a, &mut q, 1, "RAM");
    assert_eq!(dlfeat(&mut a, 2), 0x09, "null: reads are zeros");
    assert_eq!(deallocate(&mut q, 2, &[(0, 8), (100, 8)]), Status::SUCCESS);
    assert_eq!(q.read(2, 0, 4096).1, vec![0u8; 4096]);
}

#[test]
fn regular_file_in_a_temp_directory() {
    let dir = temp_dir("file", &std::env::temp_dir());
    let path = dir.join("ns.img");
    let t = target();
    add_ns(&t, 2, file_backend(&path));
    let (mut a, mut q) = queues(&t);
    deallocate_and_zeroes(&mut a, &mut q, 2, "regular file");
    drop((a, q, t));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), NS_BYTES as u64, "the file's size never changes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Opening a file probes whether it punches holes without changing it: same bytes, size,
/// allocated blocks and modification time (on the temp directory's file system and tmpfs).
#[test]
fn opening_probes_without_changing_the_file() {
    use std::os::unix::fs::MetadataExt;
    for under in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        if !under.is_dir() {
            println!("SKIP: no {}", under.display());
            continue;
        }
        let dir = temp_dir("probe", &under);
        let path = dir.join("user.img");
        let data = pattern(NS_BYTES, 42);
        std::fs::write(&path, &data).unwrap();
        let past = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_times(std::fs::FileTimes::new().set_modified(past).set_accessed(past)).unwrap();
        drop(f);
        let before = std::fs::metadata(&path).unwrap();
        let b = open_file(&path, Some(NS_BYTES as u64));
        assert!(b.zeroing.punch(), "{}: this file system punches holes", under.display());
        drop(b);
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data, "{}: bytes unchanged", under.display());
        assert_eq!(after.len(), before.len());
        assert_eq!(after.blocks(), before.blocks(), "{}: allocation unchanged", under.display());
        assert_eq!(after.modified().unwrap(), past, "{}: modification time unchanged", under.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// tmpfs punches holes but refuses ZERO_RANGE: Write Zeroes without DEAC writes zeros.
#[test]
fn file_on_tmpfs_without_zero_range() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        println!("SKIP: no /dev/shm (tmpfs) here");
        return;
    }
    let dir = temp_dir("tmpfs", shm);
    let path = dir.join("ns.img");
    let t = target();
    add_ns(&t, 2, file_backend(&path));
    let (mut a, mut q) = queues(&t);
    deallocate_and_zeroes(&mut a, &mut q, 2, "file on tmpfs");
    // Zeros written, not punched: the blocks are allocated (more than one chunk of zeros).
    assert_eq!(write_zeroes(&mut q, 2, 0, 2048, false), Status::SUCCESS);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&path).unwrap().blocks() * 512, NS_BYTES as u64, "zeros written, blocks allocated");
    assert_eq!(read_all(&mut q, 2), vec![0u8; NS_BYTES]);
    drop((a, q, t));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), NS_BYTES as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loop device this test set up, detached when dropped.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn attach(backing: &Path) -> Option<Loop> {
        let out = Command::new("losetup").args(["-f", "--show"]).arg(backing).output().ok()?;
        if !out.status.success() {
            println!("SKIP: losetup -f --show failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        Some(Loop { dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()) })
    }

    fn queue_limit(&self, name: &str) -> PathBuf {
        let dev = self.dev.file_name().unwrap().to_string_lossy().into_owned();
        PathBuf::from(format!("/sys/block/{dev}/queue/{name}"))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn loop_block_devices_needs_root() {
    if !nix_root() {
        println!("SKIP: loop devices need root");
        return;
    }
    let dir = temp_dir("loop", &std::env::temp_dir());
    let backing: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("backing{i}.img"))).collect();
    for b in &backing {
        std::fs::write(b, vec![0u8; NS_BYTES]).unwrap();
    }
    let Some(able) = Loop::attach(&backing[0]) else { return };
    let Some(no_discard) = Loop::attach(&backing[1]) else { return };
    let wz = std::fs::read_to_string(able.queue_limit("write_zeroes_max_bytes")).unwrap_or_default();
    if wz.trim().parse::<u64>().unwrap_or(0) == 0 {
        println!("SKIP: this kernel's loop devices have no Write Zeroes");
        return;
    }
    // The second device can write zeroes but not deallocate: nothing is promised there.
    std::fs::write(no_discard.queue_limit("discard_max_bytes"), "0").unwrap();
    let t = target();
    add_ns(&t, 2, Backend::File(open_file(&able.dev, None)));
    add_ns(&t, 3, Backend::File(open_file(&no_discard.dev, None)));
    let (mut a, mut q) = queues(&t);
    deallocate_and_zeroes(&mut a, &mut q, 2, "loop device");

    assert_eq!(dlfeat(&mut a, 3), 0x00, "a device that cannot deallocate promises nothing");
    let mut image = fill(&mut q, 3, 3);
    // Deallocate is advisory and left undone: the data stays.
    assert_eq!(deallocate(&mut q, 3, &[(8, 8), (1000, 24)]), Status::SUCCESS);
    assert_image(&mut q, 3, &image, "deallocate on a device that cannot deallocate");
    // Write Zeroes zeroes all the same, with or without DEAC.
    assert_eq!(write_zeroes(&mut q, 3, 8, 8, true), Status::SUCCESS);
    assert_eq!(write_zeroes(&mut q, 3, 1000, 24, false), Status::SUCCESS);
    zero_blocks(&mut image, 8, 8);
    zero_blocks(&mut image, 1000, 24);
    assert_image(&mut q, 3, &image, "write zeroes on a device that cannot deallocate");
    drop((a, q, t));
    drop((able, no_discard));
    for b in &backing {
        assert_eq!(std::fs::metadata(b).unwrap().len(), NS_BYTES as u64);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn nix_root() -> bool {
    // The effective uid, without unsafe code: /proc/self/status "Uid: real effective ...".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

#[test]
fn reads_and_writes_still_work_around_a_deallocate() {
    // A read of a deallocated range and a write into it afterwards, on a regular file.
    let dir = temp_dir("rw", &std::env::temp_dir());
    let t = target();
    add_ns(&t, 2, file_backend(&dir.join("ns.img")));
    let (_a, mut q) = queues(&t);
    let data = pattern(8192, 5);
    assert_eq!(q.write(2, 64, &data, 0).status, Status::SUCCESS);
    assert_eq!(deallocate(&mut q, 2, &[(64, 4), (70, 2)]), Status::SUCCESS);
    let (_, back) = q.read(2, 64, 8192);
    assert!(back[..2048].iter().all(|&b| b == 0));
    assert_eq!(back[2048..3072], data[2048..3072]);
    assert!(back[3072..4096].iter().all(|&b| b == 0));
    assert_eq!(back[4096..], data[4096..]);
    assert_eq!(q.write(2, 64, &data, 0).status, Status::SUCCESS);
    assert_eq!(q.read(2, 64, 8192).1, data);
    let _ = io::READ;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Opens (or creates, with a size) a file or device for a namespace.
fn open_file(path: &std::path::Path, size: Option<u64>) -> FileBackend {
    let req = qpath_target::backend::FileRequest {
        path,
        size,
        grow: false,
        access: qpath_target::backend::Access::ReadWrite,
        owner: "a test namespace",
    };
    FileBackend::open(&req).unwrap().0
}
