//! Scale: 250 controllers with 4 I/O queues each (1,000 I/O queues, 1,250
//! connections) on one `qpath target` process, I/O on every queue without
//! errors, and the target's memory per queue (printed; recorded in BENCHMARKS.md).

mod loopback;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use host::context::{Context, ContextOptions, DeviceId, Op};
use host::controller::{ConnectOptions, Controller};
use nvme::Nsid;
use uring::{IoBuf, Wait};

use loopback::free_port;

const CONTROLLERS: usize = 250;
const QUEUES: u16 = 4;

struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn thousand_io_queues_on_one_target() {
    uring::raise_fd_limit(8192).unwrap();
    let dir = std::env::temp_dir().join(format!("qpath-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let cfg = dir.join("target.toml");
    std::fs::write(
        &cfg,
        format!(
            "[reactor]\nreactors = 2\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\
             [[subsystem]]\nnqn = \"nqn.2026-11.io.qpath:many\"\nallow_any_host = true\nmax_io_queues = 8\n\
             [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1G\"\n"
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["target", "--config"])
        .arg(&cfg)
        .arg("--rpc-socket")
        .arg(dir.join("rpc.sock"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let target = Target(child);
    let pid = target.0.id();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "target did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    let rss_idle = rss_kib(pid);

    let t = Instant::now();
    let mut ctrls: Vec<Arc<Controller>> = Vec::with_capacity(CONTROLLERS);
    for _ in 0..CONTROLLERS {
        let mut o = ConnectOptions::new(addr, "nqn.2026-11.io.qpath:many");
        o.nr_io_queues = QUEUES;
        o.queue_size = 32;
        o.kato_ms = 30_000;
        ctrls.push(Controller::connect(o).unwrap());
    }
    let connect_time = t.elapsed();
    let total: usize = ctrls.iter().map(|c| c.io_queue_count()).sum();
    assert_eq!(total, CONTROLLERS * usize::from(QUEUES));

    // One context drives every queue (a completion context with 1,000 queues).
    let mut ctx = Context::new(ContextOptions { max_requests: 8192, ..Default::default() }).unwrap();
    let mut devs: Vec<DeviceId> = Vec::new();
    for c in &ctrls {
        let ns = c.namespace(Nsid(1)).unwrap();
        for q in 0..QUEUES {
            let qkey = ctx.attach_index(c, q).unwrap();
            devs.push(ctx.open_on(qkey, Nsid(1), ns.block_shift, ns.nsze, None).unwrap());
        }
    }
    let rss_connected = rss_kib(pid);
    let mut submitted = 0u64;
    for (i, d) in devs.iter().enumerate() {
        for k in 0..2u64 {
            let op = if k == 0 { Op::Write } else { Op::Read };
            let mut b = IoBuf::new(4096);
            b.set_len(4096);
            ctx.submit(*d, op, (i as u64 % 1000) * 4096, 4096, Some(b), submitted).map_err(|(e, _)| e).unwrap();
            submitted += 1;
        }
    }
    let mut done = 0u64;
    let t = Instant::now();
    while done < submitted {
        assert!(t.elapsed() < Duration::from_secs(60), "{done} of {submitted} completed");
        ctx.poll(Wait::Block { timeout: Some(Duration::from_millis(5)) }).unwrap();
        for c in ctx.completions() {
            assert!(c.status.is_success(), "I/O error: {}", c.status);
            done += 1;
        }
    }
    // Let every queue publish its statistics (histograms are allocated on first I/O).
    std::thread::sleep(Duration::from_millis(100));
    let rss_after_io = rss_kib(pid);
    let controllers =
        target::rpc::client_call(&dir.join("rpc.sock"), "list_controllers", serde_json::json!({})).unwrap();
    assert_eq!(controllers.as_array().unwrap().len(), CONTROLLERS);
    let queues = target::rpc::client_call(&dir.join("rpc.sock"), "list_queues", serde_json::json!({})).unwrap();
    assert_eq!(queues.as_array().unwrap().len(), CONTROLLERS * (1 + usize::from(QUEUES)));
    let conns = (CONTROLLERS * (1 + usize::from(QUEUES))) as f64;
    let per_conn = rss_connected.saturating_sub(rss_idle) as f64 / conns;
    let per_conn_io = rss_after_io.saturating_sub(rss_idle) as f64 / conns;
    eprintln!(
        "many_queues: {CONTROLLERS} controllers, {total} I/O queues, connected in {:.2} s; target RSS idle {rss_idle} KiB, \
         connected {rss_connected} KiB ({per_conn:.1} KiB per connection), after I/O on every queue \
         {rss_after_io} KiB ({per_conn_io:.1} KiB per connection); {submitted} I/Os, 0 errors",
        connect_time.as_secs_f64(),
    );
    drop(ctx);
    for c in &ctrls {
        c.delete();
    }
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
