//! Helpers shared by the integration tests: a loopback socket pair and a bounded driver
//! that turns a ring until a condition holds.

#![allow(dead_code, reason = "each test file uses a subset")]

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use uring::{Completion, Ring, Wait};

/// A connected loopback pair: `(client, server)`.
pub fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    (client, server)
}

/// Turns `ring` (blocking up to 50 ms per turn), handing each completion to `on`, until
/// `done(state)` holds. Panics after `limit`: every test loop is bounded in time.
pub fn drive<S>(
    ring: &mut Ring,
    state: &mut S,
    limit: Duration,
    mut on: impl FnMut(&mut Ring, &mut S, Completion),
    done: impl Fn(&S) -> bool,
) {
    let deadline = Instant::now() + limit;
    while !done(state) {
        assert!(Instant::now() < deadline, "condition not reached within {limit:?}");
        ring.turn(Wait::Block { timeout: Some(Duration::from_millis(50)) }, |ring, c| on(ring, state, c))
            .expect("turn");
    }
}

/// A deterministic byte pattern, different per `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i: usize| i.to_le_bytes()[0].wrapping_mul(31).wrapping_add(seed)).collect()
}
