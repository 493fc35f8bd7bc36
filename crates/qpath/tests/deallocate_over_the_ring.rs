//! Deallocate and Write Zeroes through the real reactors and their io_uring (the target's
//! socket path), on a regular file in a temp directory and on a tmpfs file (which punches
//! holes but refuses ZERO_RANGE, so Write Zeroes falls back to writes of zeros over the
//! ring): many 256-range Deallocates in flight at once, every range reads zeros, nothing
//! else changes, the files keep their size.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nvme::identify::{IdentifyNamespace, cns};
use nvme::opcode::io;
use nvme::tcp::Header;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};

mod support;
use support::{NQN, Peer};

const BLOCK: usize = 4096;
const BLOCKS: u64 = 4096;
const NS_BYTES: u64 = BLOCKS * BLOCK as u64;

fn start(paths: &[PathBuf]) -> (target::server::Server, SocketAddr) {
    let mut text = format!(
        "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:0\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n"
    );
    for p in paths {
        text += &format!(
            "[[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"{NS_BYTES}\"\nblock_size = {BLOCK}\n",
            p.display()
        );
    }
    let server = target::config::Config::parse(&text).unwrap().start().unwrap();
    let addr = server.state.ports()[0].addr;
    (server, addr)
}

fn block(k: u64, seed: u8) -> Vec<u8> {
    (0..BLOCK).map(|i| (k as u8).wrapping_mul(31) ^ (i as u8) ^ seed).collect()
}

fn rw(q: &mut Peer, nsid: u32, cid: u16, op: u8, slba: u64, data: &[u8], nlb: u32) -> (Status, Vec<u8>) {
    let sgl = if op == io::WRITE {
        SglDescriptor::in_capsule(data.len() as u32)
    } else {
        SglDescriptor::transport(nlb * BLOCK as u32)
    };
    let (c, back) = q.cmd(&Sqe::rw(op, Cid(cid), Nsid(nsid), slba, nlb, sgl), data);
    (c.status, back)
}

fn dsm_data(list: &[(u64, u32)]) -> Vec<u8> {
    list.iter()
        .flat_map(|&(slba, nlb)| {
            let mut r = [0u8; 16];
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&slba.to_le_bytes());
            r
        })
        .collect()
}

fn scenario(q: &mut Peer, admin: &mut Peer, nsid: u32, path: &Path) {
    let what = path.display();
    let (c, id) = admin.cmd(&Sqe::identify(Cid(7), cns::NAMESPACE, Nsid(nsid), 0, 0), &[]);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(IdentifyNamespace::decode(&id).dlfeat, 0x09, "{what}: punching holes reads zeros here");
    // Every block holds data.
    let mut want: Vec<Vec<u8>> = (0..BLOCKS).map(|k| block(k, nsid as u8)).collect();
    for k in 0..BLOCKS {
        assert_eq!(rw(q, nsid, (k % 1000) as u16, io::WRITE, k, &want[k as usize], 1).0, Status::SUCCESS);
    }
    // 8 Deallocates of 256 ranges each, all in flight at once: block 2 of every 8-block
    // group in the first, 3 in the second... (1 block per range, 2048 punches in all).
    let mut cids = Vec::new();
    for cmd in 0..8u64 {
        let list: Vec<(u64, u32)> = (0..256).map(|i| (i * 16 + cmd * 2, 1)).collect();
        let data = dsm_data(&list);
        let cid = 2000 + cmd as u16;
        q.send_cmd(&Sqe::dsm_deallocate(Cid(cid), Nsid(nsid), 256, SglDescriptor::in_capsule(4096)), &data);
        cids.push(cid);
        for (slba, _) in list {
            want[slba as usize] = vec![0; BLOCK];
        }
    }
    while !cids.is_empty() {
        let (h, _) = q.pdu();
        let Header::CapsuleResp(c) = h else { panic!("unexpected {h:?}") };
        assert_eq!(c.status, Status::SUCCESS, "{what}: deallocate");
        cids.retain(|&x| x != c.cid.0);
    }
    // Write Zeroes without DEAC over 600 blocks (more than one 128 KiB chunk where zeros are
    // written), and with DEAC over 40.
    let mut wz = Sqe::write_zeroes(Cid(3000), Nsid(nsid), 1001, 600, false);
    assert_eq!(q.cmd(&wz, &[]).0.status, Status::SUCCESS, "{what}: write zeroes");
    wz = Sqe::write_zeroes(Cid(3001), Nsid(nsid), 3001, 40, true);
    assert_eq!(q.cmd(&wz, &[]).0.status, Status::SUCCESS, "{what}: write zeroes, DEAC");
    for k in (1001..1601).chain(3001..3041) {
        want[k] = vec![0; BLOCK];
    }
    // Read everything back, 32 blocks at a time.
    for first in (0..BLOCKS).step_by(32) {
        let (s, back) = rw(q, nsid, 4000, io::READ, first, &[], 32);
        assert_eq!(s, Status::SUCCESS);
        for (i, got) in back.chunks(BLOCK).enumerate() {
            let k = first as usize + i;
            assert!(got == want[k], "{what}: block {k} reads {}", if got[0] == 0 { "zeros" } else { "data" });
        }
    }
}

#[test]
fn many_256_range_deallocates_and_write_zeroes_over_io_uring() {
    let dir = std::env::temp_dir().join(format!("qpath-dealloc-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut paths = vec![dir.join("ns.img")];
    let shm = Path::new("/dev/shm").join(format!("qpath-dealloc-ring-{}.img", std::process::id()));
    if Path::new("/dev/shm").is_dir() {
        paths.push(shm.clone());
    } else {
        println!("SKIP: no /dev/shm (tmpfs): the tmpfs half is not run");
    }
    let (server, addr) = start(&paths);
    let (mut admin, cntlid) = Peer::admin(addr, 0);
    let mut q = Peer::io(addr, cntlid, 1, 127);
    for (i, p) in paths.iter().enumerate() {
        scenario(&mut q, &mut admin, i as u32 + 1, p);
        // tmpfs answered the ring's ZERO_RANGE with EOPNOTSUPP, and zeros were written instead.
        let (map, _) = server.state.subsystem(NQN).unwrap().namespaces();
        let ns = map.get(Nsid(i as u32 + 1)).unwrap();
        let target::backend::Backend::File(f) = &ns.backend else { panic!("a file namespace") };
        assert_eq!(f.zeroing.zero_range(), !p.starts_with("/dev/shm"), "{}: ZERO_RANGE offered", p.display());
    }
    drop((q, admin));
    server.shutdown();
    for p in &paths {
        assert_eq!(std::fs::metadata(p).unwrap().len(), NS_BYTES, "{}: size changed", p.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&shm);
}
