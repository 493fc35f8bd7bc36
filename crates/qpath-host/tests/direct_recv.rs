//! Large C2H payloads are received straight into the command's buffer (one copy):
//! the data and its digest come out right however the stream is cut, and a command
//! aborted while its buffer is in a receive finishes when the buffer comes back.

#![allow(clippy::cast_possible_truncation)]

use nvme::opcode::io;
use nvme::tcp::{DataHeader, Digests, EncoderConfig, IcResp};
use nvme::{Cid, Cntlid, Cqe, Nsid, SglDescriptor, Sqe, Status};
use qpath_host::queue::{DIRECT_RECV_MIN, DataDir, HostQueue, Io, QueueConfig, QueueState};
use uring::IoBuf;

const LEN: usize = 128 * 1024;

/// A live I/O queue (ICResp and Connect answered) with the given digests.
fn live(digests: Digests) -> HostQueue {
    let cfg =
        QueueConfig::io(1, 8, Cntlid(1), "nqn.2026-11.io.qpath:direct", "nqn.2014-08.org.nvmexpress:uuid:d", [0; 16]);
    let mut q = HostQueue::new(QueueConfig { digests, ..cfg });
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
    q.feed(&IcResp { pfv: 0, cpda: 0, digests, maxh2cdata: 65536 }.encode());
    let mut out = Vec::new();
    EncoderConfig { digests, data_align: 4 }.capsule_resp(&mut out, &Cqe::success(Cid(q.tag_space())));
    q.feed(&out);
    assert_eq!(q.state(), QueueState::Live, "{:?}", q.error());
    q
}

fn read(q: &mut HostQueue, tag: u16) {
    let sqe = Sqe::rw(io::READ, Cid(0), Nsid(1), 0, 255, SglDescriptor::transport(LEN as u32));
    let io = Io { sqe, buf: Some(IoBuf::new(LEN)), len: LEN as u32, dir: DataDir::FromController, token: 7 };
    q.submit(tag, io).map_err(|(e, _)| e).unwrap();
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
}

/// The controller's bytes for one read: a C2HData PDU with SUCCESS (and its digest).
fn c2h(digests: Digests, tag: u16, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let d = DataHeader { cccid: Cid(tag), ttag: 0, datao: 0, datal: data.len() as u32, last: true, success: true };
    let w = EncoderConfig { digests, data_align: 4 }.c2h_data(&mut out, &d);
    out.extend_from_slice(data);
    if w.ddgst {
        out.extend_from_slice(&nvme::tcp::crc32c(data).to_le_bytes());
    }
    out
}

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// Plays the controller's bytes the way a socket would hand them over: each receive
/// gets at most `cut` bytes of what the queue asks for, and direct receives are counted.
fn deliver(q: &mut HostQueue, mut bytes: &[u8], cut: usize) -> usize {
    let mut direct = 0;
    while !bytes.is_empty() {
        let (mut buf, range) = q.take_recv_buf().expect("queue wants input");
        if buf.capacity() == LEN {
            direct += 1;
        }
        let n = range.len().min(cut).min(bytes.len());
        buf.as_full_mut()[range.start..range.start + n].copy_from_slice(&bytes[..n]);
        // What the ring does: the length becomes the end of the received bytes; the
        // context hands the queue the length before the receive.
        buf.set_len(range.start);
        q.on_recv(buf, n);
        bytes = &bytes[n..];
    }
    direct
}

#[test]
fn payload_lands_in_the_callers_buffer_with_and_without_digests() {
    for data_digest in [false, true] {
        for cut in [1000, 4096, 65536, usize::MAX] {
            let digests = Digests { header: data_digest, data: data_digest };
            let mut q = live(digests);
            read(&mut q, 3);
            let data = pattern();
            let direct = deliver(&mut q, &c2h(digests, 3, &data), cut);
            assert!(direct > 0, "cut {cut}, digests {data_digest}: no direct receive");
            let done: Vec<_> = q.completions().drain(..).collect();
            assert_eq!(done.len(), 1, "cut {cut}");
            assert_eq!(done[0].cqe.status, Status::SUCCESS, "cut {cut}, digests {data_digest}");
            let buf = done[0].buf.as_ref().expect("buffer back");
            assert_eq!(buf.len(), LEN);
            assert!(buf[..] == data[..], "cut {cut}, digests {data_digest}: data differs");
        }
    }
}

#[test]
fn a_bad_data_digest_is_caught_on_a_direct_payload() {
    let digests = Digests { header: false, data: true };
    let mut q = live(digests);
    read(&mut q, 0);
    let mut bytes = c2h(digests, 0, &pattern());
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    assert!(deliver(&mut q, &bytes, 8192) > 0);
    let done: Vec<_> = q.completions().drain(..).collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
}

#[test]
fn small_payloads_go_through_the_receive_buffer() {
    let digests = Digests::default();
    let mut q = live(digests);
    let len = DIRECT_RECV_MIN - 4096;
    let sqe = Sqe::rw(io::READ, Cid(0), Nsid(1), 0, 0, SglDescriptor::transport(len as u32));
    let io = Io { sqe, buf: Some(IoBuf::new(LEN)), len: len as u32, dir: DataDir::FromController, token: 1 };
    q.submit(1, io).map_err(|(e, _)| e).unwrap();
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
    let data = &pattern()[..len];
    assert_eq!(deliver(&mut q, &c2h(digests, 1, data), 1024), 0, "direct receive for a small payload");
    let done: Vec<_> = q.completions().drain(..).collect();
    assert_eq!(done[0].cqe.status, Status::SUCCESS);
    assert!(done[0].buf.as_ref().unwrap()[..] == *data);
}

#[test]
fn abort_during_a_direct_receive_waits_for_the_buffer() {
    let digests = Digests::default();
    let mut q = live(digests);
    read(&mut q, 5);
    let bytes = c2h(digests, 5, &pattern());
    // Header and the first bytes through the receive buffer, then the queue asks for the rest directly.
    deliver(&mut q, &bytes[..2048], usize::MAX);
    let (buf, range) = q.take_recv_buf().unwrap();
    assert_eq!(buf.capacity(), LEN, "expected the command's buffer");
    assert_eq!(range.end, LEN);
    // The connection fails while the receive is in flight.
    q.set_failed("test: connection lost");
    q.abort_all(Status::HOST_PATH_ERROR);
    assert!(q.completions().is_empty(), "finished while its buffer was in a receive");
    q.on_recv_none(buf);
    let done: Vec<_> = q.completions().drain(..).collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].cqe.status, Status::HOST_PATH_ERROR);
    assert_eq!(done[0].buf.as_ref().map(IoBuf::capacity), Some(LEN), "buffer not handed back");
}
