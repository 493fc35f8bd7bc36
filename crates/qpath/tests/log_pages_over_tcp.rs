//! Our host, over TCP to the embedded target's reactors: after real I/O it reads the
//! Supported Log Pages page and the SMART / Health page; after it disconnects, a new
//! controller still reads every I/O in the namespace's counters (the reactor handed the
//! closing queue's last counts over).

mod loopback;

use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::queue::{DataDir, Io};
use nvme::log::{SmartLog, decode_id_table, lid, lid_support};
use nvme::{Cid, Nsid, Sqe};
use uring::{IoBuf, Wait};

fn log_page(ctrl: &Controller, nsid: Nsid, l: u8, len: u32) -> Vec<u8> {
    let sqe = Sqe::get_log_page(Cid(0), nsid, l, 0, false, len, 0);
    let io = Io { sqe, buf: Some(IoBuf::new(4096)), len, dir: DataDir::FromController, token: 0 };
    let d = ctrl.admin_command(io).expect("Get Log Page completes");
    assert!(d.cqe.status.is_success(), "LID {l:#04x}: {}", d.cqe.status);
    d.buf.expect("the data buffer").as_full()[..len as usize].to_vec()
}

#[test]
fn smart_counts_every_io_and_keeps_them_after_the_host_leaves() {
    let (server, addrs) = loopback::target(1, "16M");
    let ctrl = Controller::connect(ConnectOptions::new(addrs[0], target::config::DEFAULT_NQN)).unwrap();
    let supported = decode_id_table(&log_page(&ctrl, Nsid::BROADCAST, lid::SUPPORTED, 1024));
    for l in [lid::ERROR, lid::SMART, lid::CMD_EFFECTS, lid::RESERVATION] {
        assert_eq!(supported[usize::from(l)] & lid_support::LSUPP, lid_support::LSUPP, "LID {l:#04x}");
    }
    // SMART per namespace, the effects page, extended data; bit 5 (a scope on every effects
    // entry) stays clear, as nvmet's.
    assert_eq!(ctrl.identify().lpa, 0x07, "SMART per namespace, effects, extended data");

    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(&ctrl, Nsid(1)).unwrap();
    let (writes, reads) = (64u64, 32u64);
    let mut done = 0;
    for i in 0..writes + reads {
        let op = if i < writes { Op::Write } else { Op::Read };
        let mut b = IoBuf::new(4096);
        b.set_len(4096);
        ctx.submit(dev, op, (i % writes) * 4096, 4096, Some(b), i).map_err(|(e, _)| e).unwrap();
        // Writes complete before the reads of the same blocks are sent.
        if i + 1 == writes || i + 1 == writes + reads {
            let t = Instant::now();
            while done <= i && t.elapsed() < Duration::from_secs(10) {
                ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
                for c in ctx.completions() {
                    assert!(c.status.is_success());
                    done += 1;
                }
            }
        }
    }
    assert_eq!(done, writes + reads);
    // The queue publishes on its reactor's 10 ms tick.
    std::thread::sleep(Duration::from_millis(50));
    let s = SmartLog::decode(&log_page(&ctrl, Nsid(1), lid::SMART, 512));
    assert_eq!((s.host_writes, s.host_reads), (writes, reads));
    // 64 × 8 units written: 512 units, one data unit (rounded up); 256 units read: one.
    assert_eq!((s.data_units_written, s.data_units_read), (1, 1));

    // A last read the tick has not published, then the host goes away.
    let mut b = IoBuf::new(4096);
    b.set_len(4096);
    ctx.submit(dev, Op::Read, 0, 4096, Some(b), 999).map_err(|(e, _)| e).unwrap();
    let t = Instant::now();
    let mut last = 0;
    while last == 0 && t.elapsed() < Duration::from_secs(10) {
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(2)) }).unwrap();
        last += ctx.completions().count();
    }
    drop(ctx);
    ctrl.delete();
    let again = Controller::connect(ConnectOptions::new(addrs[1], target::config::DEFAULT_NQN)).unwrap();
    let t = Instant::now();
    let mut s = SmartLog::decode(&log_page(&again, Nsid::BROADCAST, lid::SMART, 512));
    // The closing queue's counts land when its reactor releases it (at most a tick or two).
    while s.host_reads < reads + 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        s = SmartLog::decode(&log_page(&again, Nsid::BROADCAST, lid::SMART, 512));
    }
    assert_eq!((s.host_writes, s.host_reads), (writes, reads + 1), "nothing lost when the host left");
    again.delete();
    server.shutdown();
}
