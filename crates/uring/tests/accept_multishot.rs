//! Scenario: one multishot accept serves several clients; each accepted fd is a distinct
//! connection; cancelling ends the multishot with `more == false`; `close` through the
//! ring closes the accepted connections.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use common::drive;
use uring::{IoBuf, OpKind, Payload, Ring, RingConfig, Wait};

const CLIENTS: usize = 6;
const ACCEPT: u64 = 100;
const RECV_BASE: u64 = 200;

#[derive(Default)]
struct State {
    accepted: Vec<RawFd>,
    greetings: Vec<u8>,
    ended: Option<i32>,
}

#[test]
fn one_accept_many_clients_then_cancel() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    ring.accept_multishot(listener.as_raw_fd(), ACCEPT).expect("arm accept");

    let mut clients: Vec<TcpStream> = (0..CLIENTS)
        .map(|i| {
            let mut stream = TcpStream::connect(addr).expect("connect");
            stream.write_all(&[u8::try_from(i).expect("small")]).expect("greet");
            stream
        })
        .collect();

    let mut state = State::default();
    drive(
        &mut ring,
        &mut state,
        Duration::from_secs(10),
        |ring, state, c| match c.token {
            ACCEPT => {
                assert_eq!(c.op, OpKind::Accept);
                assert!(c.result >= 0, "accept failed: {}", c.result);
                assert!(c.more, "multishot stays armed");
                let fd = c.result;
                let token = RECV_BASE + state.accepted.len() as u64;
                state.accepted.push(fd);
                ring.recv(fd, IoBuf::new(4096), 0..4096, token).map_err(|(e, _)| e).expect("recv");
            }
            _ => {
                assert_eq!(c.result, 1, "one greeting byte");
                let Payload::Buf(buf) = c.payload else { panic!("recv returns its buffer") };
                state.greetings.push(buf[0]);
            }
        },
        |state| state.greetings.len() == CLIENTS,
    );

    let mut greetings = state.greetings.clone();
    greetings.sort_unstable();
    let expected: Vec<u8> = (0..CLIENTS).map(|i| u8::try_from(i).expect("small")).collect();
    assert_eq!(greetings, expected, "each client accepted exactly once");
    assert_eq!(ring.in_flight(), 1, "only the accept is still armed");

    assert_eq!(ring.cancel(ACCEPT).expect("cancel"), 1);
    drive(
        &mut ring,
        &mut state,
        Duration::from_secs(10),
        |_, state, c| {
            assert_eq!(c.token, ACCEPT);
            assert!(!c.more);
            state.ended = Some(c.result);
        },
        |state| state.ended.is_some(),
    );
    assert_eq!(state.ended, Some(-libc::ECANCELED));
    assert_eq!(ring.in_flight(), 0);

    // Close the accepted connections through the ring; each client then sees EOF.
    for fd in state.accepted {
        ring.close(fd).expect("close");
    }
    ring.turn(Wait::Block { timeout: Some(Duration::from_millis(100)) }, |_, c| panic!("close is internal: {c:?}"))
        .expect("turn");
    for client in &mut clients {
        client.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut byte = [0u8; 1];
        assert_eq!(client.read(&mut byte).expect("EOF"), 0, "server side closed");
    }
}
