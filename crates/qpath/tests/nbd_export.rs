//! A namespace exported over NBD (`qpath nbd serve`, `blockdev::nbd`), checked with real
//! NBD clients where they exist here (QEMU's `qemu-img` and `qemu-io`, Debian's
//! `qemu-utils`) and with a raw client for what no well-behaved client sends.
//!
//! ```text
//!   target (in this process, 2 ports) ◄─ 2 paths ─ NBD server ◄─ unix socket ─ qemu-img / qemu-io / raw client
//! ```
//!
//! Tests that need `qemu-img`/`qemu-io` print `SKIP:` and pass where they are missing.

mod loopback;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use blockdev::device::{DeviceInfo, TRANSFER_CAP_DEFAULT, wait_live};
use blockdev::nbd::server::{Listen, NbdServer, ServeOptions};
use blockdev::spec::HeadSpec;
use host::context::ContextOptions;

const NQN: &str = "nqn.2026-11.io.qpath:default";

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("qpath-nbd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn path(&self, n: &str) -> PathBuf {
        self.0.join(n)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn uri(sock: &Path) -> String {
    format!("nbd+unix:///qpath?socket={}", sock.display())
}

/// Runs a command with a time bound; returns (success, stdout + stderr).
fn run(cmd: &mut Command, within: Duration) -> (bool, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut out = String::new();
            child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            child.stderr.take().unwrap().read_to_string(&mut out).unwrap();
            return (st.success(), out);
        }
        if t0.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            return (false, format!("timed out after {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn random_file(path: &Path, mib: usize, seed: u64) {
    let mut x = seed | 1;
    let mut data = vec![0u8; mib << 20];
    for c in data.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, data).unwrap();
}

/// An NBD server in this process over the two ports of `addrs`.
fn serve(
    addrs: &[std::net::SocketAddr],
    sock: &Path,
    iopolicy: &str,
) -> (Vec<Arc<host::controller::Controller>>, NbdServer) {
    serve_with(addrs, sock, |spec| spec.iopolicy = iopolicy.into())
}

/// [`serve`] with the head's spec adjusted by `tune` (after the tests' defaults: a 1 s
/// reconnect delay, 2 I/O queues).
fn serve_with(
    addrs: &[std::net::SocketAddr],
    sock: &Path,
    tune: impl FnOnce(&mut HeadSpec),
) -> (Vec<Arc<host::controller::Controller>>, NbdServer) {
    let mut spec = HeadSpec::new(addrs.iter().map(ToString::to_string).collect(), NQN);
    spec.reconnect_delay = 1;
    spec.nr_io_queues = 2;
    tune(&mut spec);
    let (ctrls, head) = spec.connect().expect("connect both paths");
    wait_live(&head, Duration::from_secs(10)).unwrap();
    let info = DeviceInfo::probe(&head, TRANSFER_CAP_DEFAULT).unwrap();
    let opts = ServeOptions {
        name: "qpath".into(),
        listen: Listen::Unix(sock.to_path_buf()),
        clients_max: 4,
        context: ContextOptions::default(),
        read_only: false,
    };
    (ctrls, NbdServer::start(head, info, opts).expect("NBD server starts"))
}

#[test]
fn qemu_img_convert_compare_and_qemu_io_through_the_cli() {
    if !have("qemu-img") || !have("qemu-io") {
        println!("SKIP: qemu-img / qemu-io not installed (Debian: qemu-utils)");
        return;
    }
    let (_server, addrs) = loopback::target(1, "256M");
    let dir = Dir::new("cli");
    let sock = dir.path("nbd.sock");
    let log = std::fs::File::create(dir.path("serve.log")).unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .args(["nbd", "serve", "-a", "127.0.0.1", "-n", NQN, "--iopolicy", "round-robin", "--socket"])
        .arg(&sock)
        .args(["-s", &addrs[0].port().to_string(), "-s", &addrs[1].port().to_string()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn qpath nbd serve");
    let t0 = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "qpath nbd serve never listened");
        std::thread::sleep(Duration::from_millis(50));
    }

    // An image written into the export and read back identical.
    let src = dir.path("src.raw");
    random_file(&src, 48, 0x5eed);
    let (ok, out) = run(
        Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(uri(&sock)),
        Duration::from_secs(120),
    );
    assert!(ok, "qemu-img convert: {out}");
    let (ok, out) = run(
        Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(uri(&sock)),
        Duration::from_secs(120),
    );
    assert!(ok && out.contains("Images are identical"), "qemu-img compare: {out}");

    // Flush, discard (reads back as zeros: the namespace says so in DLFEAT) and write zeroes.
    let script = [
        "write -P 0x5a 64M 1M",
        "flush",
        "read -P 0x5a 64M 1M",
        "discard 64M 256k",
        "read -P 0 64M 256k",
        "read -P 0x5a 65792k 768k",
        "write -z 65M 1M",
        "read -P 0 65M 1M",
        "write -P 0x77 -f 66M 64k",
        "write -z -u 67M 512k",
        "read -P 0 67M 512k",
        "read -P 0x77 66M 64k",
    ];
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for s in script {
        cmd.args(["-c", s]);
    }
    let (ok, out) = run(cmd.arg(uri(&sock)), Duration::from_secs(60));
    assert!(ok && !out.contains("Pattern verification failed") && !out.contains("failed"), "qemu-io: {out}");
    assert_eq!(out.matches("read ").count(), 6, "every read ran: {out}");

    // A read past the end is refused, and the server goes on serving.
    let (_, out) =
        run(Command::new("qemu-io").args(["-f", "raw", "-c", "read 256M 4k"]).arg(uri(&sock)), Duration::from_secs(30));
    assert!(out.contains("Input/output error") || out.contains("Invalid argument") || out.contains("failed"), "{out}");
    let (ok, out) = run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x5a 65792k 4k"]).arg(uri(&sock)),
        Duration::from_secs(30),
    );
    assert!(ok && !out.contains("failed"), "{out}");

    // SIGTERM: the server stops, says what it did, and removes its socket.
    unsafe_free_kill(serve.id());
    let t0 = Instant::now();
    while serve.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(30), "qpath nbd serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stdout = String::new();
    serve.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert!(stdout.contains("serving nqn.2026-11.io.qpath:default namespace 1"), "{stdout}");
    assert!(stdout.contains("stopped:") && stdout.contains("2 path(s)"), "{stdout}");
    assert!(!sock.exists(), "the socket is removed on exit");
}

/// SIGTERM through the `kill` command (no unsafe code in tests).
fn unsafe_free_kill(pid: u32) {
    Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
}

#[test]
fn a_path_flapping_during_qemu_img_convert_loses_nothing() {
    if !have("qemu-img") {
        println!("SKIP: qemu-img not installed (Debian: qemu-utils)");
        return;
    }
    let (server, addrs) = loopback::target(1, "256M");
    let dir = Dir::new("flap");
    let sock = dir.path("nbd.sock");
    let (ctrls, nbd) = serve(&addrs, &sock, "round-robin");
    // Port 1 goes down (connections dropped, new ones refused) for 300 ms of every 600 ms
    // while qemu-img writes; the head fails its I/O over to port 2 and reconnects.
    let port = server.state.port(1).expect("port 1");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flaps = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flapper = {
        let (port, stop, flaps) = (Arc::clone(&port), Arc::clone(&stop), Arc::clone(&flaps));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                port.faults.refuse_connects.store(true, Ordering::Relaxed);
                port.faults.drop_generation.fetch_add(1, Ordering::Relaxed);
                flaps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(300));
                port.faults.refuse_connects.store(false, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    // Three images, one after the other, each written while the path flaps.
    let t0 = Instant::now();
    let mut src = PathBuf::new();
    for round in 0..3u64 {
        src = dir.path(&format!("src{round}.raw"));
        random_file(&src, 128, 0xf1a9 + round);
        let (ok, out) = run(
            Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw", "-t", "none"])
                .arg(&src)
                .arg(uri(&sock)),
            Duration::from_secs(300),
        );
        assert!(ok, "qemu-img convert (round {round}) under path flaps: {out}");
    }
    let took = t0.elapsed();
    let flaps_writing = flaps.load(Ordering::Relaxed);
    let (ok, cmp) = run(
        Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(uri(&sock)),
        Duration::from_secs(300),
    );
    stop.store(true, Ordering::Relaxed);
    flapper.join().unwrap();
    assert!(ok && cmp.contains("Images are identical"), "qemu-img compare after flaps: {cmp}");
    assert!(flaps_writing >= 3, "only {flaps_writing} flaps happened while writing");
    let reconnects: u64 = ctrls.iter().map(|c| c.info().reconnects).sum();
    assert!(reconnects >= 1, "the flapped path reconnected at least once");
    let errors = nbd.stats.errors_total.load(Ordering::Relaxed);
    println!(
        "3 converts of 128 MiB took {took:?}; {flaps_writing} flaps while writing, {reconnects} reconnects, {errors} NBD errors"
    );
    assert_eq!(errors, 0, "no request failed");
    nbd.stop();
    blockdev::spec::disconnect(&ctrls);
}

// ------------------------------------------------------------------ raw client

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;

struct Raw(UnixStream);

impl Raw {
    fn connect(sock: &Path) -> Raw {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw(s)
    }

    fn read_n(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
        v.extend_from_slice(data);
        self.0.write_all(&v).unwrap();
    }

    /// One option reply: (type, payload).
    fn reply(&mut self) -> (u32, Vec<u8>) {
        let h = self.read_n(20).unwrap();
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        (u32::from_be_bytes(h[12..16].try_into().unwrap()), self.read_n(len).unwrap())
    }

    /// Greeting, client flags, structured replies, GO: returns the export size.
    fn negotiate(sock: &Path) -> (Raw, u64) {
        let mut c = Raw::connect(sock);
        let g = c.read_n(18).unwrap();
        assert_eq!(&g[..8], b"NBDMAGIC");
        c.0.write_all(&3u32.to_be_bytes()).unwrap();
        c.option(8, &[]);
        assert_eq!(c.reply().0, 1);
        let mut go = 5u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"qpath");
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&3u16.to_be_bytes());
        c.option(7, &go);
        let mut size = 0;
        loop {
            let (t, p) = c.reply();
            if t == 1 {
                break;
            }
            assert_eq!(t, 3, "NBD_REP_INFO");
            if p[..2] == [0, 0] {
                size = u64::from_be_bytes(p[2..10].try_into().unwrap());
            }
        }
        (c, size)
    }

    fn request(&mut self, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut v = 0x2560_9513u32.to_be_bytes().to_vec();
        v.extend_from_slice(&flags.to_be_bytes());
        v.extend_from_slice(&kind.to_be_bytes());
        v.extend_from_slice(&cookie.to_be_bytes());
        v.extend_from_slice(&offset.to_be_bytes());
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(payload);
        self.0.write_all(&v).unwrap();
    }

    /// A reply: (cookie, error, data). Simple replies, or one final structured chunk.
    fn answer(&mut self) -> (u64, u32, Vec<u8>) {
        let m = self.read_n(4).unwrap();
        if m == [0x67, 0x44, 0x66, 0x98] {
            let h = self.read_n(12).unwrap();
            return (
                u64::from_be_bytes(h[4..12].try_into().unwrap()),
                u32::from_be_bytes(h[..4].try_into().unwrap()),
                vec![],
            );
        }
        assert_eq!(m, [0x66, 0x8e, 0x33, 0xef], "structured reply magic");
        let h = self.read_n(16).unwrap();
        let kind = u16::from_be_bytes(h[2..4].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
        let p = self.read_n(len).unwrap();
        match kind {
            1 => (cookie, 0, p[8..].to_vec()),
            0x8001 => (cookie, u32::from_be_bytes(p[..4].try_into().unwrap()), p[6..].to_vec()),
            k => panic!("unexpected chunk type {k:#x}"),
        }
    }
}

#[test]
fn bad_clients_get_their_own_errors_and_nothing_else_is_affected() {
    let (_server, addrs) = loopback::target(1, "64M");
    let dir = Dir::new("bad");
    let sock = dir.path("nbd.sock");
    let (ctrls, nbd) = serve(&addrs, &sock, "numa");

    // A good client writes a block it will read back at the end.
    let (mut good, size) = Raw::negotiate(&sock);
    assert_eq!(size, 64 << 20);
    good.request(0, 1, 1, 4096, 4096, &[0x3c; 4096]);
    assert_eq!(good.answer(), (1, 0, vec![]));

    // Malformed negotiations: a wrong option magic, unknown client flags: closed, counted.
    let mut c = Raw::connect(&sock);
    c.read_n(18).unwrap();
    c.0.write_all(&1u32.to_be_bytes()).unwrap();
    c.0.write_all(&[0xde; 16]).unwrap();
    assert!(c.read_n(1).is_err(), "closed after a bad option magic");
    let mut c = Raw::connect(&sock);
    c.read_n(18).unwrap();
    c.0.write_all(&0x80u32.to_be_bytes()).unwrap();
    assert!(c.read_n(1).is_err(), "closed after unknown client flags");

    // Bad requests: each gets its error, the connection goes on.
    let (mut c, _) = Raw::negotiate(&sock);
    c.request(0, 0, 10, size, 4096, &[]); // read past the end
    assert_eq!(c.answer().1, 22, "EINVAL for a read past the end");
    c.request(0, 1, 11, size - 512, 1024, &[0; 1024]); // write past the end, payload still sent
    assert_eq!(c.answer().1, 28, "ENOSPC for a write past the end");
    c.request(0, 0, 12, 100, 512, &[]); // unaligned
    assert_eq!(c.answer().1, 22);
    c.request(0, 99, 13, 0, 512, &[]); // unknown command
    assert_eq!(c.answer().1, 22);
    c.request(0x10, 6, 14, 0, 512, &[]); // FAST_ZERO not offered
    assert_eq!(c.answer().1, 22);
    c.request(0, 0, 15, 4096, 4096, &[]); // and a good read still works on this connection
    assert_eq!(c.answer(), (15, 0, vec![0x3c; 4096]));

    // A request header with a broken magic: that client is disconnected.
    c.0.write_all(&[0u8; 28]).unwrap();
    assert!(c.read_n(1).is_err(), "closed after a broken request magic");

    // A client that goes away in the middle of a write's payload.
    let (mut c, _) = Raw::negotiate(&sock);
    let mut v = 0x2560_9513u32.to_be_bytes().to_vec();
    v.extend_from_slice(&[0, 0, 0, 1]);
    v.extend_from_slice(&77u64.to_be_bytes());
    v.extend_from_slice(&0u64.to_be_bytes());
    v.extend_from_slice(&(1u32 << 20).to_be_bytes());
    v.extend_from_slice(&[0xee; 1000]);
    c.0.write_all(&v).unwrap();
    drop(c);
    // And one that goes away with reads in flight.
    let (mut c, _) = Raw::negotiate(&sock);
    for i in 0..16 {
        c.request(0, 0, 100 + i, 0, 1 << 20, &[]);
    }
    drop(c);

    // The first client never noticed any of it.
    good.request(0, 0, 2, 4096, 4096, &[]);
    assert_eq!(good.answer(), (2, 0, vec![0x3c; 4096]));
    good.request(0, 0, 3, 0, 4096, &[]);
    let (_, e, d) = good.answer();
    assert_eq!((e, d.len()), (0, 4096));
    assert!(d.iter().all(|&b| b != 0xee) || d.iter().all(|&b| b == 0), "the half-sent write was never written");
    good.request(0, 2, 4, 0, 0, &[]); // NBD_CMD_DISC
    let t0 = Instant::now();
    // A client counts once its negotiation is done on the server's side, which may come a
    // moment after the client saw the last reply: wait for all four, then for their ends.
    while nbd.stats.clients_total.load(Ordering::Relaxed) < 4 || nbd.stats.clients_now.load(Ordering::Acquire) > 0 {
        let (total, now) =
            (nbd.stats.clients_total.load(Ordering::Relaxed), nbd.stats.clients_now.load(Ordering::Relaxed));
        assert!(t0.elapsed() < Duration::from_secs(20), "sessions did not end: {total} clients so far, {now} still on");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(nbd.stats.protocol_errors_total.load(Ordering::Relaxed), 3, "two negotiations, one request stream");
    assert_eq!(nbd.stats.clients_total.load(Ordering::Relaxed), 4);
    nbd.stop();
    blockdev::spec::disconnect(&ctrls);
}

#[test]
fn flush_and_fua_reach_a_namespace_with_a_volatile_cache_fua_without_a_flush() {
    let dir = Dir::new("flush");
    let toml = format!(
        "[[port]]\nid = 1\naddr = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"{}\"\nsize = \"16M\"\n",
        dir.path("ns.img").display()
    );
    let server = target::config::Config::parse(&toml).unwrap().start().expect("target with a file namespace");
    let addr = server.local_addr(1).unwrap();
    let sock = dir.path("nbd.sock");
    let (ctrls, nbd) = serve(&[addr], &sock, "numa");
    let syncs = || -> u64 {
        let s = target::metrics::stats_json(&server.state);
        s["ports"].as_array().unwrap().iter().map(|p| p["dirs"]["sync"]["ios"].as_u64().unwrap()).sum()
    };
    let (mut c, _) = Raw::negotiate(&sock);
    let before = syncs();
    // A write with NBD_CMD_FLAG_FUA goes as one NVMe Write with FUA (the target syncs it
    // before it answers), not as a write and a Flush: only the client's own Flush is one.
    c.request(1, 1, 2, 8192, 4096, &[0x42; 4096]);
    assert_eq!(c.answer(), (2, 0, vec![]));
    c.request(0, 3, 1, 0, 0, &[]); // NBD_CMD_FLUSH
    assert_eq!(c.answer(), (1, 0, vec![]));
    let t0 = Instant::now();
    while syncs() < before + 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the target saw no flush");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The port's counters are added on the reactor's tick (10 ms while it carries I/O):
    // a Flush sent for the FUA write before the client's would be counted by now.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(syncs() - before, 1, "the FUA write added a Flush");
    c.request(0, 0, 3, 8192, 4096, &[]);
    assert_eq!(c.answer(), (3, 0, vec![0x42; 4096]));
    drop(c);
    nbd.stop();
    blockdev::spec::disconnect(&ctrls);
    server.shutdown();
}

#[test]
fn io_fails_with_eio_after_fast_io_fail_tmo_and_works_again_after_the_reconnect() {
    let (server, addrs) = loopback::target(1, "16M");
    let dir = Dir::new("failfast");
    let sock = dir.path("nbd.sock");
    let (ctrls, nbd) = serve_with(&addrs, &sock, |spec| spec.fast_io_fail_tmo = 1);
    let (mut c, _) = Raw::negotiate(&sock);
    c.request(0, 1, 1, 0, 4096, &[0x17; 4096]);
    assert_eq!(c.answer(), (1, 0, vec![]));

    // Every path lost: I/O waits for fast_io_fail_tmo (1 s), then fails with EIO (as Linux's
    // multipath head fails a bio with no path left), never hangs.
    let ports: Vec<_> = [1, 2].iter().map(|&i| server.state.port(i).unwrap()).collect();
    for p in &ports {
        p.faults.refuse_connects.store(true, Ordering::Relaxed);
        p.faults.drop_generation.fetch_add(1, Ordering::Relaxed);
    }
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    c.request(0, 0, 2, 0, 4096, &[]);
    let (cookie, err, _) = c.answer();
    let took = t0.elapsed();
    assert_eq!((cookie, err), (2, 5), "NBD_EIO once no path is left past fast_io_fail_tmo");
    assert!(took < Duration::from_secs(10), "failed after {took:?}, not a hang");
    println!("the read failed with EIO after {took:?}");

    // The paths come back: the same client reads its data again.
    for p in &ports {
        p.faults.refuse_connects.store(false, Ordering::Relaxed);
    }
    let t0 = Instant::now();
    loop {
        c.request(0, 0, 3, 0, 4096, &[]);
        let (_, err, data) = c.answer();
        if err == 0 {
            assert_eq!(data, vec![0x17; 4096]);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the paths never came back");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(c);
    nbd.stop();
    blockdev::spec::disconnect(&ctrls);
}

/// A namespace shrunk under a connected client: NBD cannot tell the client (no such
/// message), so the export keeps its size, and requests past the namespace's new end are
/// refused one by one, with the errors of a request past the export's end: ENOSPC for a
/// write, EINVAL for a read. Within the new end everything works on the same connection.
#[test]
fn a_shrunk_namespace_refuses_requests_past_its_new_end_and_the_export_keeps_its_size() {
    let (server, addrs) = loopback::target(1, "16M");
    let dir = Dir::new("shrink");
    let sock = dir.path("nbd.sock");
    let (ctrls, nbd) = serve(&addrs, &sock, "numa");
    let (mut c, size) = Raw::negotiate(&sock);
    assert_eq!(size, 16 << 20);
    c.request(0, 1, 1, 12 << 20, 4096, &[0x77; 4096]);
    assert_eq!(c.answer(), (1, 0, vec![]), "a write past the coming end, before the shrink");
    c.request(0, 6, 2, 12 << 20, 4096, &[]);
    assert_eq!(c.answer(), (2, 0, vec![]), "zeroed again: the target shrinks only over unwritten blocks");
    let r = target::rpc::call(&server, "resize_namespace", &serde_json::json!({"nqn": NQN, "nsid": 1, "size": "8M"}));
    r.expect("the target shrinks the namespace");
    // Every controller rescans after the Namespace Attribute Changed event.
    let t0 = Instant::now();
    for ctrl in &ctrls {
        while ctrl.namespace(nvme::Nsid(1)).is_none_or(|n| n.size_bytes() != 8 << 20) {
            assert!(t0.elapsed() < Duration::from_secs(10), "the host did not see the shrink");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // The session reads the new size on its next turn: the first answer after this one.
    c.request(0, 0, 3, 0, 4096, &[]);
    assert_eq!(c.answer().1, 0);
    c.request(0, 1, 4, 12 << 20, 4096, &[0x55; 4096]);
    assert_eq!(c.answer().1, 28, "ENOSPC for a write past the new end");
    c.request(0, 0, 5, 8 << 20, 4096, &[]);
    assert_eq!(c.answer().1, 22, "EINVAL for a read past the new end");
    c.request(0, 1, 6, (8 << 20) - 4096, 4096, &[0x66; 4096]);
    assert_eq!(c.answer(), (6, 0, vec![]), "the last block within the new end is written");
    c.request(0, 0, 7, (8 << 20) - 4096, 4096, &[]);
    assert_eq!(c.answer(), (7, 0, vec![0x66; 4096]));
    // A new client is given the new size.
    let (_c2, size2) = Raw::negotiate(&sock);
    assert_eq!(size2, 8 << 20);
    nbd.stop();
    blockdev::spec::disconnect(&ctrls);
    server.shutdown();
}
