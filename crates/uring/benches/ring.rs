//! Ring overhead, measured.
//!
//! - `turn_nops/N`: queue N NOPs and turn until all N are reaped: the fixed cost of a turn
//!   plus the per-op cost of the slab and the SQ/CQ.
//! - `turn_idle`: a `Wait::Poll` turn with nothing to do plus an empty mailbox drain: the
//!   floor of a busy-polling loop (the `io_uring_enter` is skipped).
//! - `pingpong/*`: a 4 KiB read's shape over loopback TCP: a 72-byte request (a command
//!   capsule) answered by a 4,144-byte reply (a 48-byte header plus 4,096 bytes of data).
//!   `std_*` uses blocking `std::net` reads and writes on two threads; `ring_*` drives both
//!   ends through rings. `same_core` pins both threads to CPU 0; `one_thread` runs both
//!   ends on one ring (run-to-completion, no context switch); `cross_core_busy` pins them
//!   to CPUs 0 and 1 with busy-polling rings.
//! - `region_copy/4k`: a 4 KiB copy into and out of a `SharedRegion` (word atomics) next to
//!   a plain `copy_from_slice`; a 4 KiB copy out word by word and with `copy_for_send`.
//!
//! Run: `CARGO_TARGET_DIR=/tmp/target-uring cargo bench -p uring --bench ring`

#![allow(missing_docs, reason = "criterion's macros generate undocumented items")]

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uring::{Completion, IoBuf, Mailbox, Ring, RingConfig, SendMsg, SharedRegion, Wait, pin_current_thread};

const REQUEST_BYTES: usize = 72;
const REPLY_HEADER_BYTES: usize = 48;
const REPLY_DATA_BYTES: usize = 4096;
const REPLY_BYTES: usize = REPLY_HEADER_BYTES + REPLY_DATA_BYTES;

/// Upper bound on turns for one round trip, so a broken ring fails the bench instead of
/// hanging it.
const TURNS_PER_ROUND_TRIP_MAX: usize = 1_000_000;

fn turn_nops(c: &mut Criterion) {
    let mut group = c.benchmark_group("turn_nops");
    let mut ring = Ring::new(RingConfig { entries: 256, ..RingConfig::default() }).expect("ring");
    for n in [1u64, 8, 32, 128] {
        group.throughput(Throughput::Elements(n));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                for token in 0..n {
                    ring.nop(token).expect("nop");
                }
                let mut reaped = 0;
                for _ in 0..TURNS_PER_ROUND_TRIP_MAX {
                    reaped += ring.turn(Wait::Poll, |_, c| drop(black_box(c))).expect("turn");
                    if reaped as u64 == n {
                        return;
                    }
                }
                panic!("NOPs never completed");
            });
        });
    }
    group.finish();
}

fn turn_idle(c: &mut Criterion) {
    let mut group = c.benchmark_group("turn_idle");
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    let (_tx, mut mailbox) = Mailbox::<u64>::new(&mut ring).expect("mailbox");
    group.bench_function("poll_turn_and_empty_mailbox", |b| {
        b.iter(|| {
            let delivered = ring.turn(Wait::Poll, |_, c| drop(black_box(c))).expect("turn");
            black_box(
                delivered
                    + mailbox.drain(|m| {
                        black_box(m);
                    }),
            );
        });
    });
    group.finish();
}

fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    client.set_nodelay(true).expect("nodelay");
    server.set_nodelay(true).expect("nodelay");
    (client, server)
}

// Tokens for the two ends' operations.
const SERVER_RECV: u64 = 1;
const SERVER_SEND: u64 = 2;
const CLIENT_RECV: u64 = 3;
const CLIENT_SEND: u64 = 4;

/// The target side: receive a 72-byte request, answer with a 4,144-byte reply.
struct Server {
    fd: RawFd,
    reply: Option<SendMsg>,
    data: Option<IoBuf>,
    closed: bool,
}

impl Server {
    fn start(ring: &mut Ring, fd: RawFd) -> Server {
        let mut data = IoBuf::new(REPLY_DATA_BYTES);
        data.set_len(REPLY_DATA_BYTES);
        ring.recv(fd, IoBuf::new(4096), 0..4096, SERVER_RECV).map_err(|(e, _)| e).expect("recv");
        Server { fd, reply: Some(SendMsg::new()), data: Some(data), closed: false }
    }

    fn on_completion(&mut self, ring: &mut Ring, c: Completion) {
        match c.token {
            SERVER_RECV => {
                let result = c.result;
                let mut buf = c.into_buf().expect("recv buffer");
                if result <= 0 {
                    self.closed = true;
                    return;
                }
                if buf.len() >= REQUEST_BYTES {
                    assert_eq!(buf.len(), REQUEST_BYTES, "one request in flight at a time");
                    buf.clear();
                    let mut reply = self.reply.take().expect("reply idle");
                    reply.push_bytes(&[0x07; REPLY_HEADER_BYTES]);
                    let data = self.data.take().expect("data idle");
                    reply.push_buf(data, 0..REPLY_DATA_BYTES).map_err(|(e, _)| e).expect("push");
                    ring.send(self.fd, reply, SERVER_SEND).map_err(|(e, _)| e).expect("send");
                }
                let start = buf.len();
                let end = buf.capacity();
                ring.recv(self.fd, buf, start..end, SERVER_RECV).map_err(|(e, _)| e).expect("recv");
            }
            SERVER_SEND => {
                assert_eq!(usize::try_from(c.result).ok(), Some(REPLY_BYTES), "reply sent whole");
                let mut reply = c.into_msg().expect("message");
                self.data = reply.drain_bufs().next();
                self.reply = Some(reply);
            }
            other => panic!("server got token {other}"),
        }
    }
}

/// The host side: send a request, wait for the whole reply.
struct Client {
    fd: RawFd,
    request: Option<SendMsg>,
    replies: u64,
}

impl Client {
    fn start(ring: &mut Ring, fd: RawFd) -> Client {
        ring.recv(fd, IoBuf::new(8192), 0..8192, CLIENT_RECV).map_err(|(e, _)| e).expect("recv");
        Client { fd, request: Some(SendMsg::new()), replies: 0 }
    }

    fn send_request(&mut self, ring: &mut Ring) {
        let mut request = self.request.take().expect("request idle");
        request.push_bytes(&[0x04; REQUEST_BYTES]);
        ring.send(self.fd, request, CLIENT_SEND).map_err(|(e, _)| e).expect("send");
    }

    fn done(&self, replies: u64) -> bool {
        self.replies == replies && self.request.is_some()
    }

    fn on_completion(&mut self, ring: &mut Ring, c: Completion) {
        match c.token {
            CLIENT_RECV => {
                assert!(c.result > 0, "client recv failed: {}", c.result);
                let mut buf = c.into_buf().expect("recv buffer");
                if buf.len() >= REPLY_BYTES {
                    assert_eq!(buf.len(), REPLY_BYTES, "one reply in flight at a time");
                    buf.clear();
                    self.replies += 1;
                }
                let start = buf.len();
                let end = buf.capacity();
                ring.recv(self.fd, buf, start..end, CLIENT_RECV).map_err(|(e, _)| e).expect("recv");
            }
            CLIENT_SEND => {
                let mut request = c.into_msg().expect("message");
                request.clear();
                self.request = Some(request);
            }
            other => panic!("client got token {other}"),
        }
    }
}

/// Runs a ring server on its own thread until the client hangs up.
fn spawn_ring_server(stream: TcpStream, cpu: usize, busy_poll: bool) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        pin_current_thread(cpu).expect("pin server");
        let mut ring = Ring::new(RingConfig { busy_poll, ..RingConfig::default() }).expect("ring");
        let mut server = Server::start(&mut ring, stream.as_raw_fd());
        let wait = Wait::Block { timeout: Some(Duration::from_millis(100)) };
        while !server.closed {
            ring.turn(wait, |ring, c| server.on_completion(ring, c)).expect("server turn");
        }
        drop(stream);
    })
}

fn client_round_trip(ring: &mut Ring, client: &mut Client, wait: Wait) {
    let target = client.replies + 1;
    client.send_request(ring);
    for _ in 0..TURNS_PER_ROUND_TRIP_MAX {
        ring.turn(wait, |ring, c| client.on_completion(ring, c)).expect("client turn");
        if client.done(target) {
            return;
        }
    }
    panic!("round trip did not finish");
}

fn pingpong(c: &mut Criterion) {
    let mut group = c.benchmark_group("pingpong");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(4));

    for (name, server_cpu) in [("std_two_threads_same_core", 0), ("std_two_threads_cross_core", 1)] {
        pin_current_thread(0).expect("pin client");
        let (mut client, mut server) = loopback_pair();
        let server_thread = thread::spawn(move || {
            pin_current_thread(server_cpu).expect("pin server");
            let mut request = [0u8; REQUEST_BYTES];
            let reply = [0x07u8; REPLY_BYTES];
            while server.read_exact(&mut request).is_ok() {
                if server.write_all(&reply).is_err() {
                    break;
                }
            }
        });
        let request = [0x04u8; REQUEST_BYTES];
        let mut reply = [0u8; REPLY_BYTES];
        group.bench_function(name, |b| {
            b.iter(|| {
                client.write_all(&request).expect("write request");
                client.read_exact(&mut reply).expect("read reply");
            });
        });
        drop(client);
        server_thread.join().expect("server thread");
    }

    {
        pin_current_thread(0).expect("pin");
        let (client_stream, server_stream) = loopback_pair();
        let mut ring = Ring::new(RingConfig::default()).expect("ring");
        let mut server = Server::start(&mut ring, server_stream.as_raw_fd());
        let mut client = Client::start(&mut ring, client_stream.as_raw_fd());
        group.bench_function("ring_one_thread", |b| {
            b.iter(|| {
                let target = client.replies + 1;
                client.send_request(&mut ring);
                for _ in 0..TURNS_PER_ROUND_TRIP_MAX {
                    ring.turn(Wait::Poll, |ring, c| match c.token {
                        SERVER_RECV | SERVER_SEND => server.on_completion(ring, c),
                        _ => client.on_completion(ring, c),
                    })
                    .expect("turn");
                    if client.done(target) {
                        return;
                    }
                }
                panic!("round trip did not finish");
            });
        });
        let stats = ring.stats();
        eprintln!("ring_one_thread stats: {stats:?}");
        drop(ring);
    }

    for (name, server_cpu, busy_poll) in
        [("ring_two_threads_same_core", 0, false), ("ring_two_threads_cross_core_busy", 1, true)]
    {
        pin_current_thread(0).expect("pin client");
        let (client_stream, server_stream) = loopback_pair();
        let server_thread = spawn_ring_server(server_stream, server_cpu, busy_poll);
        let mut ring = Ring::new(RingConfig { busy_poll, ..RingConfig::default() }).expect("ring");
        let mut client = Client::start(&mut ring, client_stream.as_raw_fd());
        let wait = Wait::Block { timeout: Some(Duration::from_secs(1)) };
        group.bench_function(name, |b| b.iter(|| client_round_trip(&mut ring, &mut client, wait)));
        drop(ring);
        drop(client_stream);
        server_thread.join().expect("server thread");
    }
    group.finish();
}

fn region_copy(c: &mut Criterion) {
    let mut group = c.benchmark_group("region_copy");
    group.throughput(Throughput::Bytes(2 * 4096));
    let region = Arc::new(SharedRegion::new(1 << 20).expect("region"));
    let mut block = vec![0x5au8; 4096];
    group.bench_function("4k_in_and_out", |b| {
        b.iter(|| {
            region.copy_to_region(black_box(8192), &block).expect("in");
            region.copy_from_region(black_box(8192), &mut block).expect("out");
        });
    });
    group.throughput(Throughput::Bytes(4096));
    group.bench_function("4k_out_word_by_word", |b| {
        b.iter(|| region.copy_from_region(black_box(8192), &mut block).expect("out"));
    });
    group.bench_function("4k_out_for_send", |b| {
        b.iter(|| region.copy_for_send(black_box(8192), &mut block).expect("out"));
    });
    group.throughput(Throughput::Bytes(2 * 4096));
    let mut plain = vec![0u8; 1 << 20];
    group.bench_function("4k_memcpy_baseline", |b| {
        b.iter(|| {
            plain[8192..12288].copy_from_slice(black_box(&block));
            block.copy_from_slice(black_box(&plain[8192..12288]));
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1));
    targets = turn_nops, turn_idle, pingpong, region_copy
}
criterion_main!(benches);
