//! Scenario: a loopback echo through `recv`/`send` where the ring's sends go short.
//!
//! The ring sends one 2 MiB `SendMsg` (header bytes plus 32 owned 64 KiB buffers) on a
//! socket with a small `SO_SNDBUF` to a client that starts reading late, so the kernel
//! accepts the message in many pieces. The completion must still report the whole
//! message; the client then echoes everything back and the ring receives it with `recv`.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::Duration;

use common::{drive, loopback_pair, pattern};
use uring::{IoBuf, Payload, Ring, RingConfig, SendMsg, TaskRun, set_nodelay, set_send_buffer_size};

const CHUNK: usize = 64 * 1024;
const CHUNKS: usize = 32;
const HEADER: &[u8] = b"qpath-echo-header";
const SEND: u64 = 1;
const RECV: u64 = 2;

#[derive(Default)]
struct State {
    sent: Option<(i32, SendMsg)>,
    received: Vec<u8>,
    eof: bool,
}

fn echo_with_short_sends(send_waitall: bool, task_run: TaskRun) -> uring::RingStats {
    echo(send_waitall, task_run, false)
}

/// The echo; `without_waitall`: the send goes by [`Ring::send_without_waitall`].
fn echo(send_waitall: bool, task_run: TaskRun, without_waitall: bool) -> uring::RingStats {
    let (mut client, server) = loopback_pair();
    let fd = server.as_raw_fd();
    // A socket buffer far smaller than the message forces short sends. (Shrinking the
    // receiver's SO_RCVBUF too, or going below ~64 KiB on loopback's 64 KiB MSS, makes TCP
    // itself crawl through zero-window probes; that measures TCP, not the ring.)
    set_send_buffer_size(fd, 64 * 1024).expect("small SO_SNDBUF");
    set_nodelay(fd, true).expect("nodelay");
    client.set_nodelay(true).expect("nodelay");

    let mut expected = HEADER.to_vec();
    let mut msg = SendMsg::new();
    msg.push_bytes(HEADER);
    for i in 0..CHUNKS {
        let data = pattern(u8::try_from(i).expect("small"), CHUNK);
        expected.extend_from_slice(&data);
        let mut buf = IoBuf::new(CHUNK);
        buf.extend_from_slice(&data);
        msg.push_buf(buf, 0..CHUNK).map_err(|(e, _)| e).expect("push");
    }
    assert_eq!(msg.len(), expected.len());

    let total = expected.len();
    let client_thread = thread::spawn(move || {
        // Start late so the ring's first sendmsg finds the socket buffer full.
        thread::sleep(Duration::from_millis(50));
        let mut got = vec![0u8; total];
        client.read_exact(&mut got).expect("client read");
        client.write_all(&got).expect("client echo");
        client.shutdown(std::net::Shutdown::Write).expect("shutdown");
        got
    });

    let mut ring = Ring::new(RingConfig { send_waitall, task_run, ..RingConfig::default() }).expect("ring");
    if without_waitall {
        ring.send_without_waitall(fd, msg, SEND).map_err(|(e, _)| e).expect("queue send");
    } else {
        ring.send(fd, msg, SEND).map_err(|(e, _)| e).expect("queue send");
    }
    ring.recv(fd, IoBuf::new(CHUNK), 0..CHUNK, RECV).map_err(|(e, _)| e).expect("queue recv");

    let mut state = State::default();
    drive(
        &mut ring,
        &mut state,
        Duration::from_secs(30),
        |ring, state, c| match (c.token, c.payload) {
            (SEND, Payload::Msg(msg)) => state.sent = Some((c.result, msg)),
            (RECV, Payload::Buf(mut buf)) => {
                assert!(c.result >= 0, "recv failed: {}", c.result);
                if c.result == 0 {
                    state.eof = true;
                    return;
                }
                state.received.extend_from_slice(&buf);
                buf.clear();
                ring.recv(fd, buf, 0..CHUNK, RECV).map_err(|(e, _)| e).expect("re-arm recv");
            }
            (token, payload) => panic!("unexpected completion {token} {payload:?}"),
        },
        |state| state.sent.is_some() && state.eof,
    );

    let (result, mut msg) = state.sent.take().expect("send completed");
    assert_eq!(usize::try_from(result).ok(), Some(total), "completion reports the whole message");
    let bufs: Vec<IoBuf> = msg.drain_bufs().collect();
    assert_eq!(bufs.len(), CHUNKS, "every buffer handed back");
    assert!(msg.is_empty());

    let client_saw = client_thread.join().expect("client thread");
    assert!(client_saw == expected, "client received the message intact and in order");
    assert!(state.received == expected, "ring received the echo intact");
    ring.stats()
}

#[test]
fn short_sends_are_finished_by_the_ring() {
    let stats = echo_with_short_sends(false, TaskRun::Deferred);
    assert!(stats.short_sends > 0, "a small SO_SNDBUF must force short sends: {stats:?}");
}

#[test]
fn waitall_sends_complete_whole() {
    let stats = echo_with_short_sends(true, TaskRun::Deferred);
    eprintln!("with MSG_WAITALL: {stats:?}");
}

/// A send that asks for no `MSG_WAITALL` (kernel TLS refuses the flag) on a ring that uses
/// it: the kernel hands the short sends back, and the ring finishes them.
#[test]
fn a_send_without_waitall_is_finished_by_the_ring() {
    let with = echo(true, TaskRun::Deferred, false);
    let without = echo(true, TaskRun::Deferred, true);
    eprintln!("ring with MSG_WAITALL: {with:?}; one send without it: {without:?}");
    assert!(without.short_sends > 0, "the send went without MSG_WAITALL: {without:?}");
}

#[test]
fn short_sends_in_the_fallback_task_run_modes() {
    for mode in [TaskRun::Cooperative, TaskRun::Plain] {
        let stats = echo_with_short_sends(false, mode);
        assert!(stats.short_sends > 0, "{mode:?}: {stats:?}");
    }
}
