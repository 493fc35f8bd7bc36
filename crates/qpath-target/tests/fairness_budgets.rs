//! Fairness budgets of one connection (issue 6): the PDU budget cuts an input pass and
//! keeps the rest for the connection's next turn, `tx_batch_bytes` splits a flood's
//! responses into bounded send batches, a pass of one PDU marks a queue shallow, and
//! budgets of 0 mean no limit. Driven in-process, byte by byte, no reactor or socket.

#![allow(clippy::cast_possible_truncation)] // test sizes are small

mod support;

use nvme::opcode::io;
use nvme::tcp::{Digests, Header};
use nvme::{Nsid, SglDescriptor, Sqe, Status};
use qpath_target::registry::TargetOptions;
use qpath_target::tcp::ConnCtx;
use support::{Host, target_with};

/// An I/O queue (with its admin queue, kept alive) on a target with `opts`.
fn io_queue(opts: TargetOptions) -> (Host, Host) {
    let t = target_with(opts);
    let mut admin = Host::new(&t, 1);
    let cntlid = admin.admin_up(Digests::default());
    let q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    (admin, q)
}

/// `n` read commands of `len` bytes, back to back as a deep host sends them.
fn reads(q: &mut Host, n: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let cid = q.cid();
        let slba = (i * len / 512) as u64 % 1024;
        let sqe = Sqe::rw(io::READ, cid, Nsid(1), slba, (len / 512) as u32, SglDescriptor::transport(len as u32));
        q.enc.capsule_cmd(&mut out, &sqe, 0);
    }
    out
}

/// Hands `bytes` to the connection as one receive would, without parsing them.
fn receive(q: &mut Host, bytes: &[u8]) {
    let now = q.target.now_ns();
    receive_at(q, bytes, now);
}

/// [`receive`] reaped with the reactor's clock at `now_ns`.
fn receive_at(q: &mut Host, bytes: &[u8], now_ns: u64) {
    let (mut buf, range) = q.conn.take_recv_buf().expect("the connection wants input");
    assert!(range.len() >= bytes.len(), "test input fits one receive");
    buf.as_full_mut()[range.start..range.start + bytes.len()].copy_from_slice(bytes);
    q.conn.queue_input(buf, bytes.len(), now_ns);
}

/// One turn of the connection's input: a `process_input` pass.
fn pass(q: &mut Host) {
    let now = q.target.now_ns();
    pass_at(q, now);
}

/// [`pass`] with the reactor's clock at `now_ns`.
fn pass_at(q: &mut Host, now_ns: u64) {
    let mut ctx = ConnCtx { pool: &mut q.pool, file_io: &mut q.fio, token: 0, now_ns, offload: None };
    q.conn.process_input(&mut ctx);
}

/// Sends every queued batch to the inbox; returns each batch's length.
fn drain_sends(q: &mut Host) -> Vec<usize> {
    let mut lens = Vec::new();
    while let Some(msg) = q.conn.take_send() {
        lens.push(msg.len());
        q.inbox.extend_from_slice(&msg.to_vec());
        let now = q.target.now_ns();
        let mut ctx = ConnCtx { pool: &mut q.pool, file_io: &mut q.fio, token: 0, now_ns: now, offload: None };
        q.conn.on_send_done(msg, Ok(()), &mut ctx);
    }
    lens
}

/// Turns of parsing and sending until the received input is all served (at most 100):
/// each batch's length, and the reads completed.
fn serve_input(q: &mut Host) -> (Vec<usize>, usize) {
    let mut batches = Vec::new();
    let mut done = 0;
    for _ in 0..100 {
        pass(q);
        batches.extend(drain_sends(q));
        done += completions(q);
        if !q.conn.has_input() && !q.conn.input_paused() {
            break;
        }
    }
    (batches, done)
}

/// Successful read completions in the inbox (C2HData data with its CapsuleResp).
fn completions(q: &mut Host) -> usize {
    let mut n = 0;
    while let Some(p) = q.recv() {
        match p.header {
            Header::C2HData(_) => {}
            Header::CapsuleResp(c) => {
                assert_eq!(c.status, Status::SUCCESS, "read {:?}", c.cid);
                n += 1;
            }
            h => panic!("unexpected {h:?}"),
        }
    }
    n
}

#[test]
fn the_pdu_budget_cuts_a_pass_and_the_rest_waits_for_the_next_turn() {
    let opts = TargetOptions { rx_budget_pdus: 16, tx_batch_bytes: 0, ..TargetOptions::default() };
    let (_admin, mut q) = io_queue(opts);
    let input = reads(&mut q, 40, 512);
    receive(&mut q, &input);
    assert!(q.conn.has_input());

    let mut per_pass = Vec::new();
    let mut done = 0;
    while q.conn.has_input() {
        // No receive is armed while parsed input waits: TCP holds the rest back.
        assert!(q.conn.take_recv_buf().is_none(), "no receive while input waits");
        pass(&mut q);
        drain_sends(&mut q);
        let n = completions(&mut q);
        per_pass.push(n);
        done += n;
        assert!(per_pass.len() <= 3, "40 PDUs take 3 passes of 16: {per_pass:?}");
    }
    assert_eq!(per_pass, [16, 16, 8], "PDUs parsed per pass");
    assert_eq!(done, 40);
    let s = q.conn.info().stats.snapshot();
    assert_eq!(s.rx_pass_pdus_max, 16, "no pass parsed more than the budget");
    assert_eq!(s.rx_budget_stops, 2, "the budget stopped two passes");
    assert!(q.conn.is_deep(), "a queue that hit its budget is deep");
    // The queue wants input again once everything is parsed.
    assert!(q.conn.take_recv_buf().is_some());
}

#[test]
fn a_budget_of_zero_parses_everything_in_one_pass() {
    let opts = TargetOptions { rx_budget_pdus: 0, tx_batch_bytes: 0, ..TargetOptions::default() };
    let (_admin, mut q) = io_queue(opts);
    let input = reads(&mut q, 40, 512);
    receive(&mut q, &input);
    pass(&mut q);
    assert!(!q.conn.has_input());
    let lens = drain_sends(&mut q);
    assert_eq!(lens.len(), 1, "one batch without a byte limit: {lens:?}");
    assert_eq!(completions(&mut q), 40);
    let s = q.conn.info().stats.snapshot();
    assert_eq!((s.rx_pass_pdus_max, s.rx_budget_stops), (40, 0));
}

#[test]
fn tx_batch_bytes_splits_a_flood_into_bounded_batches() {
    let cap = 16 * 1024;
    let opts = TargetOptions { rx_budget_pdus: 0, tx_batch_bytes: cap, ..TargetOptions::default() };
    let (_admin, mut q) = io_queue(opts);
    let input = reads(&mut q, 32, 4096);
    receive(&mut q, &input);
    let (batches, done) = serve_input(&mut q);
    assert_eq!(done, 32);
    // 4 KiB responses (4,096 + 48 bytes): three fit under 16 KiB, a fourth would not.
    assert!(batches.len() >= 32 / 3, "batches {batches:?}");
    for &b in &batches {
        assert!(b <= cap, "a batch of {b} bytes is over tx_batch_bytes {cap}");
    }
}

#[test]
fn a_qd1_queue_is_shallow() {
    let (_admin, mut q) = io_queue(TargetOptions::default());
    for _ in 0..4 {
        let input = reads(&mut q, 1, 4096);
        receive(&mut q, &input);
        pass(&mut q);
        assert!(!q.conn.is_deep(), "one PDU per pass: shallow");
        drain_sends(&mut q);
        assert_eq!(completions(&mut q), 1);
    }
    let s = q.conn.info().stats.snapshot();
    assert_eq!((s.rx_pass_pdus_max, s.rx_budget_stops), (1, 0));
}

#[test]
fn budgets_changed_at_run_time_apply_to_the_next_pass() {
    use qpath_target::limits::LimitSettings;
    let opts = TargetOptions { rx_budget_pdus: 0, tx_batch_bytes: 0, ..TargetOptions::default() };
    let (_admin, mut q) = io_queue(opts);
    // What `set_limits` over RPC does: a PDU budget of 10 where there was none.
    q.target.limits.set(&LimitSettings { rx_budget_pdus: Some(10), ..Default::default() }).unwrap();
    assert_eq!(q.target.limits.get().rx_budget_pdus, Some(10));
    let input = reads(&mut q, 25, 512);
    receive(&mut q, &input);
    let mut per_pass = Vec::new();
    while q.conn.has_input() && per_pass.len() < 10 {
        pass(&mut q);
        drain_sends(&mut q);
        per_pass.push(completions(&mut q));
    }
    assert_eq!(per_pass, [10, 10, 5], "PDUs parsed per pass under the new budget");
    // Then a send batch limit: a flood's responses leave in bounded batches.
    let cap = 8 * 1024;
    q.target
        .limits
        .set(&LimitSettings { rx_budget_pdus: Some(0), tx_batch_bytes: Some(cap), ..Default::default() })
        .unwrap();
    let input = reads(&mut q, 16, 4096);
    receive(&mut q, &input);
    let (batches, done) = serve_input(&mut q);
    assert_eq!(done, 16);
    assert!(batches.len() >= 8, "16 responses of 4 KiB in batches of 8 KiB: {batches:?}");
    assert!(batches.iter().all(|&l| l <= cap + 4096 + 128), "batches bounded by the new size: {batches:?}");
}

#[test]
fn service_time_counts_the_turns_a_command_waited_behind_the_budget() {
    // 40 RAM reads received together at t0 and parsed 16, 16 and 8 in three turns 1, 3
    // and 6 ms later: each read's service time runs from its receipt, so it shows the
    // turns it waited, though executing a RAM read takes no time on the turn's clock.
    let opts = TargetOptions { rx_budget_pdus: 16, tx_batch_bytes: 0, ..TargetOptions::default() };
    let (_admin, mut q) = io_queue(opts);
    let input = reads(&mut q, 40, 512);
    let t0 = q.target.now_ns();
    receive_at(&mut q, &input, t0);
    let mut per_pass = Vec::new();
    for ms in [1, 3, 6] {
        pass_at(&mut q, t0 + ms * 1_000_000);
        drain_sends(&mut q);
        per_pass.push(completions(&mut q));
    }
    assert_eq!(per_pass, [16, 16, 8]);
    let s = q.conn.info().stats.snapshot();
    assert_eq!((s.reads, s.commands), (40, 41), "the queue's Connect is a command too");
    // 16 x 1 ms + 16 x 3 ms + 8 x 6 ms = 112 ms over 41 commands (the Connect waited 0)
    assert_eq!(s.latency_ns_mean, 112_000_000 / 41, "mean service time");

    // A command received in the turn it is parsed in has no wait to show.
    let input = reads(&mut q, 1, 512);
    let t1 = t0 + 10_000_000;
    receive_at(&mut q, &input, t1);
    pass_at(&mut q, t1);
    drain_sends(&mut q);
    assert_eq!(completions(&mut q), 1);
    let s = q.conn.info().stats.snapshot();
    assert_eq!(s.latency_ns_mean, 112_000_000 / 42, "the 41st read added 0 ns to the sum");
}

#[test]
fn a_connection_alone_on_its_driver_is_not_held_by_the_budgets() {
    // The defaults (16 PDUs a pass, 64 KiB batches) with no other connection waiting: the
    // whole input is parsed in one pass and the responses leave in one batch.
    let opts = TargetOptions::default();
    let (_admin, mut q) = io_queue(opts);
    q.conn.set_contended(false);
    let input = reads(&mut q, 40, 4096);
    receive(&mut q, &input);
    pass(&mut q);
    assert!(!q.conn.has_input(), "one pass parses all 40 PDUs");
    let lens = drain_sends(&mut q);
    assert_eq!(completions(&mut q), 40);
    assert_eq!(lens.len(), 1, "one batch of 40 responses: {lens:?}");
    assert!(lens[0] > 64 * 1024, "the batch is not cut at tx_batch_bytes: {lens:?}");
    let s = q.conn.info().stats.snapshot();
    // Only the Connect's pass, before the driver said the queue was alone, counts.
    assert_eq!((s.rx_pass_pdus_max, s.rx_budget_stops), (1, 0), "the passes alone are not counted, none cut");

    // Another connection wants the driver: small reads are parsed 16 PDUs a pass, and 4 KiB
    // reads' responses leave in batches of at most 64 KiB.
    q.conn.set_contended(true);
    let input = reads(&mut q, 40, 512);
    receive(&mut q, &input);
    let mut per_pass = Vec::new();
    while q.conn.has_input() && per_pass.len() < 10 {
        pass(&mut q);
        drain_sends(&mut q);
        per_pass.push(completions(&mut q));
    }
    assert_eq!(per_pass, [16, 16, 8], "PDUs parsed per pass while contended");
    let s = q.conn.info().stats.snapshot();
    assert_eq!((s.rx_pass_pdus_max, s.rx_budget_stops), (16, 2));
    let input = reads(&mut q, 40, 4096);
    receive(&mut q, &input);
    let (batches, done) = serve_input(&mut q);
    assert_eq!(done, 40);
    assert!(batches.len() >= 3 && batches.iter().all(|&b| b <= 64 * 1024), "batches {batches:?}");
}
