//! SIGHUP re-reads the configuration file and applies the difference without touching what
//! the difference does not name. A namespace added to the file appears (a controller of the
//! host gets the Namespace Attribute Changed event and finds the NSID in the Changed
//! Namespace List; our host's controller rescans and sees it), a host removed from the file
//! loses its controllers, and another host's verified writes and reads go on throughout,
//! without an error or a reconnect: both its own I/O loop and a `qpath bench` job with
//! crc32c verification, each on its half of the namespace. A file that does not parse changes nothing, and under
//! `--persist` a reload never rewrites the operator's file.

mod loopback;
mod operated_target;
mod run_bounded;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, Op};
use host::controller::{ConnectOptions, Controller};
use host::queue::{DataDir, Io, QueueConfig};
use host::sync::SyncQueue;
use nvme::features::{AsyncEvent, fid};
use nvme::{Nsid, Sqe};
use operated_target::{Dir, TargetProcess, wait_for};
use serde_json::{Value, json};
use uring::{IoBuf, Wait};

const NQN: &str = "nqn.2026-11.io.qpath:reloaded";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b";

fn config(port: u16, hosts: &[&str], extra_ns: &str) -> String {
    let hosts: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n[[subsystem]]\nnqn = \"{NQN}\"\nhosts = [{}]\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"16M\"\n{extra_ns}",
        hosts.join(", ")
    )
}

fn connect(addr: SocketAddr, hostnqn: &str) -> Arc<Controller> {
    let mut o = ConnectOptions::new(addr, NQN);
    o.hostnqn = hostnqn.to_string();
    o.nr_io_queues = 1;
    o.kato_ms = 5000;
    o.reconnect_delay = Duration::from_millis(200);
    o.ctrl_loss_tmo = Some(Duration::from_secs(1));
    Controller::connect(o).unwrap_or_else(|e| panic!("{hostnqn} connects: {e}"))
}

/// Verified I/O until `stop` (at most 60 s) on the namespace's first 8 MiB (the bench job
/// has the rest): writes a block, reads it back, compares; counts the round trips and the
/// errors (a failed command or a block that came back different).
fn io_loop(ctrl: &Arc<Controller>, stop: &AtomicBool, done: &AtomicU64) -> u64 {
    let mut ctx = Context::new(ContextOptions::default()).unwrap();
    let dev = ctx.open(ctrl, Nsid(1)).unwrap();
    let mut errors = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut run = |op: Op, offset: u64, buf: IoBuf| -> Option<IoBuf> {
        if ctx.submit(dev, op, offset, 4096, Some(buf), 1).is_err() {
            return None;
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).ok()?;
            if let Some(c) = ctx.completions().next() {
                return if c.status.is_success() { c.buf } else { None };
            }
        }
        None
    };
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let offset = (i % 2048) * 4096;
        let byte = u8::try_from(i % 251).unwrap();
        let mut b = IoBuf::new(4096);
        b.set_len(4096);
        b.fill(byte);
        let ok = run(Op::Write, offset, b).is_some()
            && run(Op::Read, offset, IoBuf::new(4096)).is_some_and(|r| r.iter().all(|&x| x == byte));
        if !ok {
            errors += 1;
        }
        i += 1;
        done.store(i, Ordering::Relaxed);
    }
    errors
}

#[test]
fn sighup_adds_a_namespace_and_drops_a_removed_host_while_io_goes_on() {
    let d = Dir::new("sighup");
    let (f, sock, log) = (d.path("target.toml"), d.path("rpc.sock"), d.path("target.log"));
    let port = loopback::free_port();
    std::fs::write(&f, config(port, &[HOST_A, HOST_B], "")).unwrap();
    let t = TargetProcess::start(&["--config", f.to_str().unwrap(), "--persist"], &sock, &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));

    // Host A: verified I/O in the background, on a controller of our host.
    let a = connect(addr, HOST_A);
    let generation = a.generation();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let io = {
        let (a, stop, done) = (Arc::clone(&a), Arc::clone(&stop), Arc::clone(&done));
        std::thread::spawn(move || io_loop(&a, &stop, &done))
    };
    // Host A again: an admin queue of its own, with namespace attribute notices on and an
    // Asynchronous Event Request outstanding.
    let mut cfg = QueueConfig::io(0, 32, nvme::Cntlid::DYNAMIC, NQN, HOST_A, [0xa; 16]);
    cfg.kato_ms = 10_000;
    let mut q = SyncQueue::connect(addr, cfg, Duration::from_secs(5)).unwrap();
    host::admin::enable(&mut q).unwrap();
    let bit = AsyncEvent::NS_CHANGED.config_bit().unwrap();
    q.command(Sqe::set_features(nvme::Cid(0), fid::ASYNC_EVENT, bit), Duration::from_secs(5)).unwrap();
    let aer = q
        .submit(Io { sqe: Sqe::async_event_request(nvme::Cid(0)), buf: None, len: 0, dir: DataDir::None, token: 0 })
        .unwrap();
    // Host B: to be removed.
    let b = connect(addr, HOST_B);
    wait_for("host A's I/O is under way", 20, || done.load(Ordering::Relaxed) >= 20);
    // Host A's bench job: randrw with crc32c verification on the namespace's second half,
    // running across the reload.
    let bench_sock = d.path("bench.sock");
    let uri = format!("nvme+tcp://127.0.0.1:{port}/{NQN}/1?hostnqn={HOST_A}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qpath"));
    cmd.args(["bench", "--output-format=json", "--rpc-socket"]).arg(&bench_sock).args([
        "--",
        "--name=across-reload",
        "--ioengine=qpath",
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=8",
        "--offset=8M",
        "--size=8M",
        "--time_based",
        "--runtime=6",
        "--verify=crc32c",
        &format!("--filename={uri}"),
    ]);
    let job = std::thread::spawn(move || run_bounded::run(cmd, Duration::from_secs(120)));
    let hosts_a_ctrls = || -> Vec<Value> {
        let list = t.call("list_controllers", json!({}));
        list.as_array().unwrap().iter().filter(|c| c["hostnqn"] == HOST_A).cloned().collect()
    };
    wait_for("the bench job's controller is connected", 30, || hosts_a_ctrls().len() >= 3);
    let cntlids_before: Vec<Value> = hosts_a_ctrls().iter().map(|c| c["cntlid"].clone()).collect();

    // The operator edits the file: a namespace added, host B removed. SIGHUP.
    let edited = config(port, &[HOST_A], "[[subsystem.namespace]]\nnsid = 2\nbackend = \"ram\"\nsize = \"8M\"\n");
    std::fs::write(&f, &edited).unwrap();
    let before_hup = done.load(Ordering::Relaxed);
    t.signal("HUP");

    // The event reaches host A's admin queue, and the changed list names NSID 2.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ev = loop {
        if let Some(done) = q.take(aer) {
            break done;
        }
        q.pump(deadline).expect("the Asynchronous Event Request completes in time");
    };
    assert_eq!(ev.cqe.dw0, AsyncEvent::NS_CHANGED.to_dw0(), "a Namespace Attribute Changed event");
    let list = host::admin::get_log(&mut q, nvme::log::lid::CHANGED_NS, 0, false, 4096, 4096).unwrap();
    let nsids: Vec<u32> =
        list.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).take_while(|&n| n != 0).collect();
    assert_eq!(nsids, vec![2], "the Changed Namespace List");
    // Our host's controller rescans on the same event and sees it.
    wait_for("host A's controller sees NSID 2", 10, || a.namespace(Nsid(2)).is_some());
    // Host B's controllers are failed, as remove_host does; nothing of B is left.
    wait_for("host B's controller leaves the live state", 10, || !b.is_live());
    wait_for("no controller of host B on the target", 10, || {
        let list = t.call("list_controllers", json!({}));
        list.as_array().unwrap().iter().all(|c| c["hostnqn"] != HOST_B)
    });

    // Host A's I/O went on through it all.
    wait_for("host A's I/O goes on after the reload", 20, || done.load(Ordering::Relaxed) >= before_hup + 200);
    let cntlids_after: Vec<Value> = hosts_a_ctrls().iter().map(|c| c["cntlid"].clone()).collect();
    assert_eq!(cntlids_after, cntlids_before, "host A's controllers (its own and the job's) are the same ones");
    stop.store(true, Ordering::Relaxed);
    let errors = io.join().unwrap();
    assert_eq!(errors, 0, "host A's verified I/O had errors across the reload");
    assert_eq!(a.generation(), generation, "host A never reconnected");
    assert!(a.is_live());
    let (status, stdout, stderr) = job.join().unwrap();
    assert!(status.success(), "the bench job failed across the reload\nstderr:\n{stderr}");
    let out: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{stdout}"));
    let j = &out["jobs"][0];
    assert_eq!(j["error"], 0, "{j}");
    assert!(j["read"]["total_ios"].as_u64().unwrap() > 0 && j["write"]["total_ios"].as_u64().unwrap() > 0, "{j}");

    // Under --persist, a reload does not write the operator's file.
    assert_eq!(std::fs::read_to_string(&f).unwrap(), edited);
    assert!(!d.path("target.toml.bak").exists());
    // A file that does not parse changes nothing.
    std::fs::write(&f, "[[subsystem]\nnqn = ").unwrap();
    t.signal("HUP");
    wait_for("the refused reload is logged", 10, || {
        t.log_text().contains("configuration not reloaded, nothing changed")
    });
    let subs = t.call("list_subsystems", json!({}));
    assert_eq!(subs[0]["namespaces"].as_array().unwrap().len(), 2);
    assert_eq!(subs[0]["hosts"], json!([HOST_A]));
    assert!(a.is_live() && a.generation() == generation);
    a.delete();
    b.delete();
}
