//! Scenario: a ring blocked in `Wait::Block` with nothing in flight is woken by a message
//! sent from another thread, and messages from several senders all arrive.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use uring::{Mailbox, Ring, RingConfig, Wait};

const PER_SENDER: u32 = 500;

fn wake_blocked_ring(busy_poll: bool) {
    let mut ring = Ring::new(RingConfig { busy_poll, ..RingConfig::default() }).expect("ring");
    let (tx, mut mailbox) = Mailbox::<&'static str>::new(&mut ring).expect("mailbox");

    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        tx.send("stop").expect("send");
    });

    let start = Instant::now();
    let delivered = ring.turn(Wait::Block { timeout: Some(Duration::from_secs(20)) }, |_, _| {}).expect("turn");
    let woke_after = start.elapsed();
    assert_eq!(delivered, 0, "the wake is internal, not a completion");
    assert!(woke_after < Duration::from_secs(10), "woken by the message, not the timeout: {woke_after:?}");
    assert!(woke_after >= Duration::from_millis(50), "did not return before the message: {woke_after:?}");

    let mut got = Vec::new();
    // The message may be visible one turn later than the wake; bound the wait.
    for _ in 0..100 {
        mailbox.drain(|m| got.push(m));
        if !got.is_empty() {
            break;
        }
        ring.turn(Wait::Block { timeout: Some(Duration::from_millis(10)) }, |_, _| {}).expect("turn");
    }
    assert_eq!(got, vec!["stop"]);
    sender.join().expect("sender");
}

#[test]
fn message_wakes_a_sleeping_ring() {
    wake_blocked_ring(false);
}

#[test]
fn message_wakes_a_busy_polling_ring() {
    wake_blocked_ring(true);
}

#[test]
fn many_senders_lose_nothing() {
    let mut ring = Ring::new(RingConfig::default()).expect("ring");
    let (tx, mut mailbox) = Mailbox::<(u8, u32)>::new(&mut ring).expect("mailbox");
    let senders: Vec<_> = (0..2u8)
        .map(|id| {
            let tx = tx.clone();
            thread::spawn(move || {
                for n in 0..PER_SENDER {
                    tx.send((id, n)).expect("send");
                }
            })
        })
        .collect();
    drop(tx);

    let mut seen = [Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen[0].len() + seen[1].len() < 2 * PER_SENDER as usize {
        assert!(Instant::now() < deadline, "messages lost");
        ring.turn(Wait::Block { timeout: Some(Duration::from_millis(100)) }, |_, _| {}).expect("turn");
        mailbox.drain(|(id, n)| seen[usize::from(id)].push(n));
    }
    for per_sender in &seen {
        assert!(per_sender.iter().copied().eq(0..PER_SENDER), "in order per sender");
    }
    for sender in senders {
        sender.join().expect("sender");
    }
}
