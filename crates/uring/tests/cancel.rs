//! Scenario: cancelling operations hands their buffers back; `close` cancels what is in
//! flight on the fd before closing it; dropping a ring with ops in flight returns.

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::time::{Duration, Instant};

use common::{drive, loopback_pair};
use uring::{Completion, IoBuf, OpKind, Ring, RingConfig};

fn collect(ring: &mut Ring, count: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    drive(ring, &mut done, Duration::from_secs(10), |_, done, c| done.push(c), |done| done.len() >= count);
    done
}

#[test]
fn cancel_by_token_returns_the_buffer() {
    let (_client, server) = loopback_pair();
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    ring.recv(server.as_raw_fd(), IoBuf::new(8192), 0..8192, 5).map_err(|(e, _)| e).expect("recv");
    ring.recv(server.as_raw_fd(), IoBuf::new(4096), 0..4096, 6).map_err(|(e, _)| e).expect("recv");
    // Let the recvs reach the kernel and park before cancelling them.
    ring.turn(uring::Wait::Poll, |_, c| panic!("nothing should complete: {c:?}")).expect("turn");

    assert_eq!(ring.cancel(99).expect("cancel unknown"), 0);
    assert_eq!(ring.cancel(5).expect("cancel"), 1);
    let done = collect(&mut ring, 1);
    assert_eq!(done[0].token, 5);
    assert_eq!(done[0].op, OpKind::Recv);
    assert_eq!(done[0].result, -libc::ECANCELED);
    assert_eq!(ring.in_flight(), 1, "the other recv is untouched");
    let buf = done.into_iter().next().and_then(Completion::into_buf).expect("buffer back");
    assert_eq!(buf.capacity(), 8192);
    assert!(buf.is_empty());
}

#[test]
fn close_cancels_in_flight_ops_then_closes() {
    let (mut client, server) = loopback_pair();
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    let fd = server.as_raw_fd();
    ring.recv(fd, IoBuf::new(4096), 0..4096, 1).map_err(|(e, _)| e).expect("recv");
    ring.turn(uring::Wait::Poll, |_, c| panic!("nothing should complete: {c:?}")).expect("turn");

    ring.close(server.into_raw_fd()).expect("close");
    let done = collect(&mut ring, 1);
    assert_eq!((done[0].token, done[0].result), (1, -libc::ECANCELED));
    assert_eq!(ring.in_flight(), 0);

    // The peer sees the connection closed.
    client.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut byte = [0u8; 1];
    assert_eq!(client.read(&mut byte).expect("read EOF"), 0);
}

#[test]
fn dropping_a_ring_with_ops_in_flight_returns_promptly() {
    let (_client, server) = loopback_pair();
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    for token in 0..4 {
        ring.recv(server.as_raw_fd(), IoBuf::new(4096), 0..4096, token).map_err(|(e, _)| e).expect("recv");
    }
    ring.turn(uring::Wait::Poll, |_, _| {}).expect("turn");
    let start = Instant::now();
    drop(ring);
    assert!(start.elapsed() < Duration::from_secs(1), "drop cancelled and reaped the recvs");
}

#[test]
fn close_during_a_stalled_send_hands_the_message_back() {
    // The peer never reads, so a 4 MiB message stalls after the socket buffers fill.
    let (_client, server) = loopback_pair();
    uring::set_send_buffer_size(server.as_raw_fd(), 64 * 1024).expect("sndbuf");
    let mut ring = Ring::new(RingConfig { send_waitall: false, ..RingConfig::default() }).expect("ring");
    let mut msg = uring::SendMsg::new();
    for _ in 0..64 {
        let mut buf = IoBuf::new(64 * 1024);
        buf.set_len(64 * 1024);
        msg.push_buf(buf, 0..64 * 1024).map_err(|(e, _)| e).expect("push");
    }
    ring.send(server.as_raw_fd(), msg, 7).map_err(|(e, _)| e).expect("send");
    for _ in 0..5 {
        ring.turn(uring::Wait::Block { timeout: Some(Duration::from_millis(20)) }, |_, c| {
            panic!("a stalled send must not complete: {c:?}")
        })
        .expect("turn");
    }
    ring.close(server.into_raw_fd()).expect("close");
    let done = collect(&mut ring, 1);
    assert_eq!((done[0].token, done[0].op), (7, OpKind::Send));
    assert_eq!(done[0].result, -libc::ECANCELED, "not everything was sent");
    let mut msg = done.into_iter().next().and_then(Completion::into_msg).expect("message back");
    assert_eq!(msg.drain_bufs().count(), 64, "every buffer handed back");
    assert_eq!(ring.in_flight(), 0);
}
