//! The host queue's own cost per command, sans I/O: 32 commands submitted, their
//! batch taken and returned as a socket would, and the controller's 32 responses fed
//! back, so the figure is `HostQueue::submit` + encoding + parsing + completion, per
//! command, with no socket, ring or context.
//!
//! - `flush_32`: commands without data (capsule in, response capsule out): the
//!   submit and completion bookkeeping alone.
//! - `read512_32`: 512-byte reads answered by a C2HData PDU with SUCCESS each (the
//!   default with SQ flow control off): the data's copy into the caller's buffer too.
//!
//! Run: `cargo bench -p qpath-host --bench queue`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use nvme::opcode::io;
use nvme::tcp::{DataHeader, Digests, EncoderConfig, IcResp};
use nvme::{Cid, Cntlid, Cqe, Nsid, SglDescriptor, Sqe};
use qpath_host::queue::{DataDir, HostQueue, Io, QueueConfig, QueueState};
use uring::IoBuf;

const N: u16 = 32;

fn live() -> HostQueue {
    let cfg =
        QueueConfig::io(1, 128, Cntlid(1), "nqn.2026-11.io.qpath:bench", "nqn.2014-08.org.nvmexpress:uuid:b", [0; 16]);
    let mut q = HostQueue::new(cfg);
    drain_sends(&mut q);
    q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    let mut out = Vec::new();
    EncoderConfig::default().capsule_resp(&mut out, &Cqe::success(Cid(q.tag_space())));
    q.feed(&out);
    assert_eq!(q.state(), QueueState::Live);
    q
}

fn drain_sends(q: &mut HostQueue) {
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
}

/// Submits `N` commands made by `io(tag)`, sends them, feeds `responses`, reaps `N`.
fn round(q: &mut HostQueue, io: &mut impl FnMut(u16) -> Io, responses: &[u8], bufs: &mut Vec<IoBuf>) {
    for tag in 0..N {
        if q.submit(tag, io(tag)).is_err() {
            panic!("submit refused");
        }
    }
    drain_sends(q);
    q.feed(responses);
    let done = q.completions();
    assert_eq!(done.len(), usize::from(N));
    for d in done.drain(..) {
        if let Some(b) = d.buf {
            bufs.push(b);
        }
        black_box(d.cqe);
    }
}

fn queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("host_queue");
    let mut q = live();
    let mut flushes = Vec::new();
    for tag in 0..N {
        EncoderConfig::default().capsule_resp(&mut flushes, &Cqe::success(Cid(tag)));
    }
    let mut none = Vec::new();
    g.bench_function("flush_32", |b| {
        b.iter(|| {
            let mut io = |_| Io { sqe: Sqe::flush(Cid(0), Nsid(1)), buf: None, len: 0, dir: DataDir::None, token: 1 };
            round(&mut q, &mut io, &flushes, &mut none);
        });
    });
    let mut reads = Vec::new();
    for tag in 0..N {
        let d = DataHeader { cccid: Cid(tag), ttag: 0, datao: 0, datal: 512, last: true, success: true };
        EncoderConfig::default().c2h_data(&mut reads, &d);
        reads.extend_from_slice(&[0x5a; 512]);
    }
    let mut bufs: Vec<IoBuf> = (0..N).map(|_| IoBuf::new(4096)).collect();
    g.bench_function("read512_32", |b| {
        b.iter(|| {
            let mut pool = std::mem::take(&mut bufs);
            let mut io = |tag| {
                let sqe = Sqe::rw(io::READ, Cid(tag), Nsid(1), u64::from(tag), 0, SglDescriptor::transport(512));
                Io { sqe, buf: pool.pop(), len: 512, dir: DataDir::FromController, token: u64::from(tag) }
            };
            round(&mut q, &mut io, &reads, &mut bufs);
        });
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(40)
}

criterion_group! { name = benches; config = config(); targets = queue }
criterion_main!(benches);
