//! A blocking turn that submits a send does not wake for the send's completion alone
//! (`RingConfig::send_hold`): a send that fits the socket buffer completes inside the
//! `io_uring_enter` that submits it, so waking for "one completion" would return at once
//! and cost a second system call to wait for the answer. The turn waits for the send's
//! completion plus one more, and io_uring's minimum wait (Linux 6.12) bounds how long
//! the send's completion is held when nothing else comes.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use common::loopback_pair;
use uring::{IoBuf, OpKind, Ring, RingConfig, SendMsg, Wait};

const SEND: u64 = 1;
const RECV: u64 = 2;

fn ring(send_hold: Option<Duration>) -> Option<Ring> {
    let ring = Ring::new(RingConfig { entries: 8, send_hold, ..RingConfig::default() }).expect("io_uring");
    if !ring.features().min_wait {
        println!("SKIP: this kernel's io_uring has no minimum wait (IORING_FEAT_MIN_TIMEOUT, Linux 6.12)");
        return None;
    }
    Some(ring)
}

fn ping() -> SendMsg {
    let mut msg = SendMsg::new();
    msg.push_bytes(b"ping");
    msg
}

/// One blocking turn; the kinds it delivered, in order.
fn turn(ring: &mut Ring, timeout: Option<Duration>) -> Vec<OpKind> {
    let mut kinds = Vec::new();
    ring.turn(Wait::Block { timeout }, |_, c| {
        assert!(c.result >= 0, "{c:?}");
        kinds.push(c.op);
    })
    .expect("turn");
    kinds
}

#[test]
fn a_blocking_turn_reaps_a_send_and_its_answer_with_one_system_call() {
    let Some(mut ring) = ring(Some(Duration::from_secs(2))) else { return };
    let (mut peer, sock) = loopback_pair();
    // The peer answers 20 ms after it reads the request: long after the send completed.
    let answer = thread::spawn(move || {
        let mut req = [0u8; 4];
        peer.read_exact(&mut req).expect("peer read");
        thread::sleep(Duration::from_millis(20));
        peer.write_all(b"pong").expect("peer write");
        peer
    });
    ring.recv(sock.as_raw_fd(), IoBuf::new(4096), 0..64, RECV).map_err(|(e, _)| e).expect("recv");
    ring.send(sock.as_raw_fd(), ping(), SEND).map_err(|(e, _)| e).expect("send");
    let kinds = turn(&mut ring, Some(Duration::from_secs(10)));
    assert_eq!(kinds, [OpKind::Send, OpKind::Recv], "the send and the answer in one turn");
    let stats = ring.stats();
    assert_eq!((stats.enters, stats.held_waits), (1, 1), "{stats:?}");
    drop(answer.join());
}

#[test]
fn a_held_send_completion_comes_back_after_the_hold_when_nothing_else_completes() {
    let Some(mut ring) = ring(Some(Duration::from_millis(50))) else { return };
    let (_peer, sock) = loopback_pair();
    // No receive armed and no answer: the send's completion is the only one there is.
    ring.send(sock.as_raw_fd(), ping(), SEND).map_err(|(e, _)| e).expect("send");
    let start = Instant::now();
    let kinds = turn(&mut ring, Some(Duration::from_secs(20)));
    assert_eq!(kinds, [OpKind::Send]);
    // Bounded by the hold (50 ms), not the turn's 20 s timeout; the margin is for a loaded machine.
    assert!(start.elapsed() < Duration::from_secs(10), "held {:?}", start.elapsed());
    assert_eq!(ring.stats().held_waits, 1);
}

#[test]
fn without_a_hold_or_a_timeout_longer_than_it_a_turn_wakes_for_the_send_alone() {
    for (hold, timeout) in [
        (None, Some(Duration::from_secs(10))),
        (Some(Duration::from_secs(2)), None),
        (Some(Duration::from_secs(2)), Some(Duration::from_secs(1))),
    ] {
        let Some(mut ring) = ring(hold) else { return };
        let (mut peer, sock) = loopback_pair();
        ring.recv(sock.as_raw_fd(), IoBuf::new(4096), 0..64, RECV).map_err(|(e, _)| e).expect("recv");
        ring.send(sock.as_raw_fd(), ping(), SEND).map_err(|(e, _)| e).expect("send");
        assert_eq!(turn(&mut ring, timeout), [OpKind::Send], "hold {hold:?}, timeout {timeout:?}");
        assert_eq!(ring.stats().held_waits, 0);
        // The answer wakes the next turn.
        let mut req = [0u8; 4];
        peer.read_exact(&mut req).expect("peer read");
        peer.write_all(b"pong").expect("peer write");
        assert_eq!(turn(&mut ring, Some(Duration::from_secs(10))), [OpKind::Recv]);
    }
}

/// Two sockets with answers due, one receive armed on each; the peers answer `gaps` after
/// the test starts (`None`: never). Returns the sockets and the peers, to keep open.
type Peers = (Vec<std::net::TcpStream>, Vec<thread::JoinHandle<std::net::TcpStream>>);
fn two_answers(ring: &mut Ring, gaps: [Option<Duration>; 2]) -> Peers {
    let (mut socks, mut peers) = (Vec::new(), Vec::new());
    for (i, gap) in gaps.into_iter().enumerate() {
        let (mut peer, sock) = loopback_pair();
        ring.recv(sock.as_raw_fd(), IoBuf::new(4096), 0..64, RECV + i as u64).map_err(|(e, _)| e).expect("recv");
        socks.push(sock);
        peers.push(thread::spawn(move || {
            if let Some(gap) = gap {
                thread::sleep(gap);
                peer.write_all(b"pong").expect("peer write");
            }
            peer
        }));
    }
    (socks, peers)
}

#[test]
fn a_turn_told_two_answers_are_due_reaps_both_receives_with_one_system_call() {
    let Some(mut ring) = ring(Some(Duration::from_secs(2))) else { return };
    // The second socket answers 30 ms after the first, no send in the turn.
    let peers = two_answers(&mut ring, [Some(Duration::from_millis(5)), Some(Duration::from_millis(35))]);
    ring.hold_for(2, None);
    let kinds = turn(&mut ring, Some(Duration::from_secs(10)));
    assert_eq!(kinds, [OpKind::Recv, OpKind::Recv], "both answers in one turn");
    assert_eq!((ring.stats().enters, ring.stats().held_waits), (1, 1), "{:?}", ring.stats());
    drop(ring);
    for p in peers.1 {
        drop(p.join());
    }
}

#[test]
fn a_turn_told_one_answer_is_due_wakes_for_the_first_receive() {
    let Some(mut ring) = ring(Some(Duration::from_secs(2))) else { return };
    let peers = two_answers(&mut ring, [Some(Duration::from_millis(5)), Some(Duration::from_millis(300))]);
    ring.hold_for(1, None);
    assert_eq!(turn(&mut ring, Some(Duration::from_secs(10))), [OpKind::Recv], "no send: not held");
    assert_eq!(ring.stats().held_waits, 0);
    assert_eq!(turn(&mut ring, Some(Duration::from_secs(10))), [OpKind::Recv]);
    drop(ring);
    for p in peers.1 {
        drop(p.join());
    }
}

#[test]
fn an_answer_that_does_not_come_holds_the_other_no_longer_than_the_hold() {
    let Some(mut ring) = ring(Some(Duration::from_secs(15))) else { return };
    let peers = two_answers(&mut ring, [Some(Duration::from_millis(5)), None]);
    // The owner's hold (50 ms) replaces the configured one (15 s).
    ring.hold_for(2, Some(Duration::from_millis(50)));
    let start = Instant::now();
    assert_eq!(turn(&mut ring, Some(Duration::from_secs(30))), [OpKind::Recv]);
    // Bounded by the hold (50 ms), not the configured 15 s nor the turn's 30 s timeout; the
    // margin is for a loaded machine.
    assert!(start.elapsed() < Duration::from_secs(10), "held {:?}", start.elapsed());
    assert_eq!(ring.stats().held_waits, 1);
    drop(ring);
    for p in peers.1 {
        drop(p.join());
    }
}
