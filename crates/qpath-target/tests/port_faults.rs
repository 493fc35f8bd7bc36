//! The faults a port injects per command (`set_port_fault`'s `stall_opcode` and
//! `delay_us`), which connections act on only when the target is built with the
//! `fault-injection` feature: with it a stuck opcode is never answered and a delay holds
//! each completion until it is due; without it the same settings change nothing a command
//! does (and the RPC refuses them: `rpc.rs`'s tests). `cargo test --workspace` builds the
//! target with the feature (the `qpath` binary turns it on); `cargo test -p qpath-target`
//! without it.

#![allow(clippy::cast_possible_truncation)] // the shared test support's sizes are small

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvme::opcode::io;
use nvme::tcp::Digests;
use nvme::{Nsid, SglDescriptor, Sqe, Status};
use qpath_target::TargetState;
use qpath_target::port::PortFaults;
use support::*;

/// A target, its admin queue (kept: it holds the controller) and an I/O queue on port 1.
fn setup() -> (Arc<TargetState>, Host, Host) {
    let t = target();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    (t, a, q)
}

#[test]
fn a_stuck_opcode_is_never_answered_when_built_in() {
    let (t, _a, mut q) = setup();
    assert_eq!(q.write(1, 0, &pattern(4096, 1), 8192).status, Status::SUCCESS);
    let faults = &t.port(1).unwrap().faults;
    faults.stall_opcode.store(u64::from(io::READ) + 1, Ordering::Relaxed);
    let cid = q.cid();
    q.command(&Sqe::rw(io::READ, cid, Nsid(1), 0, 8, SglDescriptor::transport(4096)), &[]);
    if PortFaults::PER_COMMAND {
        assert!(q.recv().is_none(), "the read is stuck");
        assert_eq!(q.write(1, 8, &pattern(4096, 2), 8192).status, Status::SUCCESS, "other opcodes are answered");
    } else {
        let (c, data) = q.completion(cid);
        assert_eq!(c.status, Status::SUCCESS, "without fault injection built in, the read is answered");
        assert_eq!(data, pattern(4096, 1));
    }
    // Cleared: the next read is answered either way.
    faults.stall_opcode.store(0, Ordering::Relaxed);
    let (c, data) = q.read(1, 0, 4096);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(data, pattern(4096, 1));
}

#[test]
fn a_delay_holds_every_completion_when_built_in() {
    let (t, _a, mut q) = setup();
    const DELAY: Duration = Duration::from_secs(1);
    let faults = &t.port(1).unwrap().faults;
    faults.delay_us.store(u64::try_from(DELAY.as_micros()).unwrap(), Ordering::Relaxed);
    let cid = q.cid();
    let data = pattern(4096, 3);
    let mut capsule = Vec::new();
    q.enc.capsule_cmd(&mut capsule, &Sqe::rw(io::WRITE, cid, Nsid(1), 0, 8, SglDescriptor::in_capsule(4096)), 4096);
    capsule.extend_from_slice(&data);
    let sent = Instant::now();
    assert_eq!(q.feed_only(&capsule), capsule.len());
    // One pass: a RAM write executes at once, and its completion goes out now unless held.
    q.turn();
    if PortFaults::PER_COMMAND {
        assert!(q.recv().is_none(), "the completion is held");
        q.pump();
        assert!(sent.elapsed() >= DELAY, "answered after {:?}, the delay is {DELAY:?}", sent.elapsed());
    }
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    faults.delay_us.store(0, Ordering::Relaxed);
    assert_eq!(q.read(1, 0, 4096).1, data);
}
