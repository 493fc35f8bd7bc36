//! qpath's host as a raw NVMe client for end-to-end tests: one controller with one user
//! queue pair, and one method per command (the command goes out as built, its completion
//! comes back whole), so a test reads like the commands it sends.

#![allow(dead_code)] // each test crate uses a part
#![allow(clippy::cast_possible_truncation)] // test data sizes are small

use std::sync::Arc;
use std::time::{Duration, Instant};

use host::controller::{ConnectOptions, Controller};
use host::passthru::{PtCompletion, QueuePair};
use host::queue::{DataDir, Io};
use nvme::copy::SourceRange;
use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::IoBuf;

pub const NQN: &str = "nqn.2026-11.io.qpath:default";
pub const T: Duration = Duration::from_secs(10);

pub fn buf(data: &[u8]) -> IoBuf {
    let mut b = IoBuf::new(data.len().next_multiple_of(4096).max(4096));
    b.set_len(data.len());
    b[..].copy_from_slice(data);
    b
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| ((i % 251) as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

pub struct Host {
    pub ctrl: Arc<Controller>,
    pub qp: QueuePair,
}

impl Host {
    pub fn connect(addr: std::net::SocketAddr) -> Host {
        let mut o = ConnectOptions::new(addr, NQN);
        o.nr_io_queues = 1;
        o.nr_user_queues = 1;
        let ctrl = Controller::connect(o).expect("connect");
        let qp = QueuePair::new(&ctrl).expect("a user queue pair");
        Host { ctrl, qp }
    }

    pub fn exec(&mut self, sqe: Sqe, data: &[u8], dir: DataDir) -> PtCompletion {
        let len = u32::try_from(data.len()).unwrap();
        let b = if dir == DataDir::None { None } else { Some(buf(data)) };
        self.qp.execute(sqe, b, len, dir, T).expect("a completion")
    }

    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) {
        let nlb = u32::try_from(data.len() / 512).unwrap();
        let sqe = Sqe::rw(io::WRITE, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        assert_eq!(self.exec(sqe, data, DataDir::ToController).cqe.status, Status::SUCCESS);
    }

    pub fn read(&mut self, nsid: u32, slba: u64, len: usize) -> Vec<u8> {
        let nlb = u32::try_from(len / 512).unwrap();
        let sqe = Sqe::rw(io::READ, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        let done = self.exec(sqe, &vec![0; len], DataDir::FromController);
        assert_eq!(done.cqe.status, Status::SUCCESS);
        done.buf.unwrap()[..len].to_vec()
    }

    pub fn compare(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Status {
        let nlb = u32::try_from(data.len() / 512).unwrap();
        let sqe = Sqe::rw(io::COMPARE, Cid(0), Nsid(nsid), slba, nlb, SglDescriptor::transport(0));
        self.exec(sqe, data, DataDir::ToController).cqe.status
    }

    pub fn verify(&mut self, nsid: u32, slba: u64, nlb: u32) -> Status {
        self.exec(Sqe::verify(Cid(0), Nsid(nsid), slba, nlb), &[], DataDir::None).cqe.status
    }

    pub fn copy(&mut self, nsid: u32, sdlba: u64, ranges: &[SourceRange]) -> Status {
        let n = u32::try_from(ranges.len()).unwrap();
        let sqe = Sqe::copy(Cid(0), Nsid(nsid), sdlba, n, SglDescriptor::transport(0));
        self.exec(sqe, &SourceRange::encode_list(ranges), DataDir::ToController).cqe.status
    }

    /// Compare `expect` and Write `new` at `slba` as one fused operation: both statuses.
    pub fn caw(&mut self, nsid: u32, slba: u64, expect: &[u8], new: &[u8]) -> (Status, Status) {
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
