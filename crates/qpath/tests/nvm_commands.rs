//! Compare, fused Compare and Write, Copy and Verify end to end: qpath's host sends them on
//! user queue pairs (a fused pair with `QueuePair::submit_fused`) to the embedded target
//! over TCP, its reactors run them on a RAM and a file namespace, and two hosts on two
//! threads increment one counter block by Compare and Write without losing an update.

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod loopback;

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::controller::{ConnectOptions, Controller};
use host::passthru::{PtCompletion, QueuePair};
use host::queue::{DataDir, Io};
use nvme::copy::SourceRange;
use nvme::identify::{fuses, oncs};
use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use target::backend::{Backend, FileBackend, FileRequest};
use target::namespace::NamespaceSpec;
use uring::IoBuf;

const NQN: &str = "nqn.2026-11.io.qpath:default";
const RAM: u32 = 1;
const FILE: u32 = 2;
const T: Duration = Duration::from_secs(10);

fn buf(data: &[u8]) -> IoBuf {
    let mut b = IoBuf::new(data.len().next_multiple_of(4096).max(4096));
    b.set_len(data.len());
    b[..].copy_from_slice(data);
    b
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| ((i % 251) as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

struct Host {
    ctrl: Arc<Controller>,
    qp: QueuePair,
}

impl Host {
    fn connect(addr: std::net::SocketAddr) -> Host {
        let mut o = ConnectOptions::new(addr, NQN);
        o.nr_io_queues = 1;
        o.nr_user_queues = 1;
        let ctrl = Controller::connect(o).expect("connect");
        let qp = QueuePair::new(&ctrl).expect("a user queue pair");
        Host { ctrl, qp }
    }

    fn exec(&mut self, sqe: Sqe, data: &[u8], dir: DataDir) -> PtCompletion {
        let len = u32::try_from(data.len()).unwrap();
        let b = if dir == DataDir::None { None } else { Some(buf(data)) };
        self.qp.execute(sqe, b, len, dir, T).expect("a completion")
    }

    fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) {
        let nlb = u32::try_from(data.len() / 512).unwrap();
        let sqe = Sqe::rw(io::WRITE, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        assert_eq!(self.exec(sqe, data, DataDir::ToController).cqe.status, Status::SUCCESS);
    }

    fn read(&mut self, nsid: u32, slba: u64, len: usize) -> Vec<u8> {
        let nlb = u32::try_from(len / 512).unwrap();
        let sqe = Sqe::rw(io::READ, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        let done = self.exec(sqe, &vec![0; len], DataDir::FromController);
        assert_eq!(done.cqe.status, Status::SUCCESS);
        done.buf.unwrap()[..len].to_vec()
    }

    fn compare(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Status {
        let nlb = u32::try_from(data.len() / 512).unwrap();
        let sqe = Sqe::rw(io::COMPARE, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        self.exec(sqe, data, DataDir::ToController).cqe.status
    }

    fn verify(&mut self, nsid: u32, slba: u64, nlb: u32) -> Status {
        self.exec(Sqe::verify(Cid(0), Nsid(nsid), slba, nlb), &[], DataDir::None).cqe.status
    }

    fn copy(&mut self, nsid: u32, sdlba: u64, ranges: &[SourceRange]) -> Status {
        let n = u32::try_from(ranges.len()).unwrap();
        let sqe = Sqe::copy(Cid(0), Nsid(nsid), sdlba, n, SglDescriptor::transport(0));
        self.exec(sqe, &SourceRange::encode_list(ranges), DataDir::ToController).cqe.status
    }

    /// Compare `expect` and Write `new` at `slba` as one fused operation: both statuses.
    fn caw(&mut self, nsid: u32, slba: u64, expect: &[u8], new: &[u8]) -> (Status, Status) {
        let nlb = u32::try_from(expect.len() / 512).unwrap();
        let len = u32::try_from(expect.len()).unwrap();
        let cmd = |opcode, data: &[u8], token| Io {
            sqe: Sqe::rw(opcode, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0)),
            buf: Some(buf(data)),
            len,
            dir: DataDir::ToController,
            token,
        };
        self.qp.submit_fused(cmd(io::COMPARE, expect, 1), cmd(io::WRITE, new, 2)).map_err(|b| b.0).unwrap();
        let mut done = Vec::new();
        let deadline = Instant::now() + T;
        while done.len() < 2 {
            assert!(Instant::now() < deadline, "the fused pair did not complete");
            self.qp.poll(&mut done).unwrap();
        }
        done.sort_by_key(|c| c.user_data);
        (done[0].cqe.status, done[1].cqe.status)
    }
}

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
