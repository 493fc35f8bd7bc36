//! Compare, fused Compare and Write, Copy and Verify end to end: qpath's host sends them on
//! user queue pairs (a fused pair with `QueuePair::submit_fused`) to the embedded target
//! over TCP, its reactors run them on a RAM and a file namespace, and two hosts on two
//! threads increment one counter block by Compare and Write without losing an update.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod loopback;
mod raw_host;

use nvme::Status;
use nvme::copy::SourceRange;
use nvme::identify::{fuses, oncs};
use target::backend::{Backend, FileBackend, FileRequest};
use target::namespace::NamespaceSpec;

use raw_host::{Host, NQN, pattern};

const RAM: u32 = 1;
const FILE: u32 = 2;

/// A file namespace beside the default RAM one; the file is removed when dropped.
struct FileNs(std::path::PathBuf);

impl FileNs {
    fn add(server: &target::server::Server, test: &str) -> FileNs {
        let path = std::env::temp_dir().join(format!("qpath-nvm-e2e-{test}-{}.img", std::process::id()));
        let fb = FileBackend::open(&FileRequest::read_write(&path, Some(16 << 20), "a test namespace"))
            .expect("the file namespace's file")
            .0;
        let spec = NamespaceSpec {
            nsid: FILE,
            backend: Backend::File(fb),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        };
        server.state.subsystem(NQN).unwrap().add_namespace(spec).expect("add the file namespace");
        FileNs(path)
    }
}

impl Drop for FileNs {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn host_sends_compare_compare_and_write_copy_and_verify() {
    let (server, addrs) = loopback::target(2, "16M");
    let _file = FileNs::add(&server, "commands");
    let mut h = Host::connect(addrs[0]);
    let id = h.ctrl.identify();
    assert_eq!(id.oncs & (oncs::COMPARE | oncs::VERIFY | oncs::COPY), oncs::COMPARE | oncs::VERIFY | oncs::COPY);
    assert_eq!(id.fuses, fuses::COMPARE_AND_WRITE);
    for nsid in [RAM, FILE] {
        let a = pattern(64 * 1024, 1);
        h.write(nsid, 0, &a);
        assert_eq!(h.compare(nsid, 0, &a), Status::SUCCESS, "namespace {nsid}");
        assert_eq!(h.compare(nsid, 1, &a), Status::COMPARE_FAILURE);
        assert_eq!(h.verify(nsid, 0, 32768), Status::SUCCESS, "16 MiB: more than MDTS");
        assert_eq!(h.verify(nsid, 32767, 2), Status::LBA_OUT_OF_RANGE);
        // Copy blocks 0..128 to 1000 and 8..16 after them, inside the target.
        let ranges = [SourceRange { slba: 0, nlb: 128 }, SourceRange { slba: 8, nlb: 8 }];
        assert_eq!(h.copy(nsid, 1000, &ranges), Status::SUCCESS);
        let mut want = a.clone();
        want.extend_from_slice(&a[8 * 512..16 * 512]);
        assert_eq!(h.read(nsid, 1000, want.len()), want);
        // Compare and Write.
        let new = pattern(4096, 2);
        assert_eq!(h.caw(nsid, 0, &new, &new), (Status::COMPARE_FAILURE, Status::FUSED_FAILED));
        assert_eq!(h.read(nsid, 0, 4096), a[..4096]);
        assert_eq!(h.caw(nsid, 0, &a[..4096], &new), (Status::SUCCESS, Status::SUCCESS));
        assert_eq!(h.read(nsid, 0, 4096), new);
    }
    drop(h.qp);
    h.ctrl.delete();
    server.shutdown();
}

/// Two hosts, each on its own thread, queue and connection (the target deals connections
/// to its two reactors in turn), increment a counter block by Compare and Write: every
/// increment that succeeded is in the final count.
#[test]
fn two_hosts_increment_a_counter_by_compare_and_write() {
    let (server, addrs) = loopback::target(2, "16M");
    let _file = FileNs::add(&server, "counter");
    let per_host = 200u64;
    for nsid in [RAM, FILE] {
        let mut h = Host::connect(addrs[0]);
        h.write(nsid, 0, &[0; 512]);
        let hosts: Vec<_> = addrs
            .iter()
            .map(|&addr| {
                std::thread::spawn(move || {
                    let mut h = Host::connect(addr);
                    let (mut done, mut miscompares) = (0, 0u64);
                    while done < per_host {
                        let block = h.read(nsid, 0, 512);
                        let v = u64::from_le_bytes(block[..8].try_into().unwrap());
                        let mut next = vec![0u8; 512];
                        next[..8].copy_from_slice(&(v + 1).to_le_bytes());
                        match h.caw(nsid, 0, &block, &next) {
                            (Status::SUCCESS, Status::SUCCESS) => done += 1,
                            (Status::COMPARE_FAILURE, Status::FUSED_FAILED) => miscompares += 1,
                            other => panic!("compare and write: {other:?}"),
                        }
                    }
                    drop(h.qp);
                    h.ctrl.delete();
                    miscompares
                })
            })
            .collect();
        let miscompares: u64 = hosts.into_iter().map(|t| t.join().unwrap()).sum();
        let block = h.read(nsid, 0, 512);
        let v = u64::from_le_bytes(block[..8].try_into().unwrap());
        assert_eq!(v, per_host * addrs.len() as u64, "namespace {nsid}: increments lost ({miscompares} miscompares)");
        drop(h.qp);
        h.ctrl.delete();
    }
    server.shutdown();
}
