//! Crash consistency of the file backend: a write acknowledged with FUA, or acknowledged
//! before a Flush that completed was sent, survives `kill -9` of the target and a restart
//! on the same file.
//!
//! Each round starts `qpath target` on the file, checks every block made durable in the
//! earlier rounds, then pipelines numbered 4 KiB writes (every fifth with FUA) and Flushes
//! over a raw NVMe/TCP queue until a SIGKILL at a random point ends it. The seed of each
//! kill point is printed; `CRASH_SEED=N` replays one run.

#![allow(clippy::cast_possible_truncation)] // block numbers and sizes are small

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvme::opcode::io;
use nvme::tcp::Header;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use rand::{Rng, SeedableRng};

mod loopback;
mod support;
use loopback::free_port;
use support::{NQN, Peer};

const BLOCK: usize = 4096;
/// Blocks one round may write (each block is written once, in one round only).
const PER_ROUND: u32 = 2048;
const ROUNDS: u32 = 12;
/// Commands in flight at once.
const WINDOW: usize = 16;

fn start_target(dir: &Path, port: u16) -> Child {
    let cfg = dir.join("target.toml");
    let text = format!(
        "[reactor]\nreactors = 1\npoll = \"block\"\n\
         [[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"{}\"\nblock_size = 4096\n",
        dir.join("ns.img").display(),
        u64::from(ROUNDS * PER_ROUND) * BLOCK as u64,
    );
    std::fs::write(&cfg, text).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qpath"))
        .arg("target")
        .arg("--config")
        .arg(&cfg)
        .arg("--rpc-socket")
        .arg(dir.join("rpc.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "the target did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Block `k`'s content: its number in every 8 bytes, mixed with the position.
fn block(k: u32) -> Vec<u8> {
    (0..BLOCK / 8).flat_map(|i| (u64::from(k) << 32 | i as u64 ^ 0x5eed_0000).to_le_bytes()).collect()
}

enum InFlight {
    Write {
        k: u32,
        fua: bool,
    },
    /// The writes acknowledged before this Flush was sent.
    Flush(Vec<u32>),
}

/// Pipelines writes of blocks `first..first + PER_ROUND` and Flushes until the connection
/// dies (the kill) or the blocks run out; returns the blocks made durable.
fn write_until_killed(q: &mut Peer, first: u32, rng: &mut impl Rng) -> (Vec<u32>, u32) {
    let mut durable = Vec::new();
    let mut acked = Vec::new();
    let mut inflight: HashMap<u16, InFlight> = HashMap::new();
    let mut next = first;
    let mut cid = 0u16;
    let mut sent = 0u32;
    q.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    loop {
        while inflight.len() < WINDOW && next < first + PER_ROUND {
            cid = (cid + 1) % 1024;
            let (sqe, data, what) = if !acked.is_empty() && rng.random_ratio(1, 8) {
                (Sqe::flush(Cid(cid), Nsid(1)), Vec::new(), InFlight::Flush(std::mem::take(&mut acked)))
            } else {
                let fua = next.is_multiple_of(5);
                let mut sqe =
                    Sqe::rw(io::WRITE, Cid(cid), Nsid(1), u64::from(next), 1, SglDescriptor::in_capsule(BLOCK as u32));
                sqe.set_fua(fua);
                next += 1;
                (sqe, block(next - 1), InFlight::Write { k: next - 1, fua })
            };
            let mut out = Vec::new();
            q.enc.capsule_cmd(&mut out, &sqe, data.len());
            out.extend_from_slice(&data);
            if q.s.write_all(&out).is_err() {
                return (durable, sent);
            }
            sent += 1;
            inflight.insert(cid, what);
        }
        if inflight.is_empty() {
            return (durable, sent);
        }
        // One response (the kill shows as EOF or a reset).
        let resp = loop {
            if let Some((h, _)) = q.parse() {
                break h;
            }
            let mut tmp = [0u8; 65536];
            match q.s.read(&mut tmp) {
                Ok(0) => return (durable, sent),
                Ok(n) => q.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return (durable, sent),
            }
        };
        let Header::CapsuleResp(c) = resp else { panic!("unexpected {resp:?}") };
        assert_eq!(c.status, Status::SUCCESS, "a write or flush failed before the kill");
        match inflight.remove(&c.cid.0).expect("a response for a command in flight") {
            InFlight::Write { k, fua: true } => durable.push(k),
            InFlight::Write { k, fua: false } => acked.push(k),
            InFlight::Flush(covered) => durable.extend(covered),
        }
    }
}

#[test]
fn acknowledged_flushed_writes_survive_kill_9() {
    let dir = std::env::temp_dir().join(format!("qpath-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base_seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    let start = Instant::now();
    let mut durable: Vec<u32> = Vec::new();
    let mut checked_total = 0usize;
    let mut rounds = 0;
    for round in 0..ROUNDS {
        // Bounded in time too: a loaded machine runs fewer rounds (at least two).
        if round >= 2 && start.elapsed() > Duration::from_secs(90) {
            break;
        }
        let port = free_port();
        let child = start_target(&dir, port);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (admin, cntlid) = Peer::admin(addr, 0);
        // Every block made durable so far reads back whole, across every earlier kill.
        let mut verify = Peer::io(addr, cntlid, 2, 31);
        for (i, &k) in durable.iter().enumerate() {
            let sqe = Sqe::rw(
                io::READ,
                Cid(i as u16 % 1024),
                Nsid(1),
                u64::from(k),
                1,
                SglDescriptor::transport(BLOCK as u32),
            );
            let (c, data) = verify.cmd(&sqe, &[]);
            assert_eq!(c.status, Status::SUCCESS);
            assert!(data == block(k), "round {round}: durable block {k} lost or torn (seed {base_seed})");
        }
        checked_total += durable.len();
        drop(verify);

        let seed = base_seed + u64::from(round);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let kill_after = Duration::from_millis(rng.random_range(5..300));
        let killer = std::thread::spawn(move || {
            let mut child = child;
            std::thread::sleep(kill_after);
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap()
        });
        let mut q = Peer::io(addr, cntlid, 1, 31);
        let (made_durable, sent) = write_until_killed(&mut q, round * PER_ROUND, &mut rng);
        let status = killer.join().unwrap();
        println!(
            "round {round} (seed {seed}): killed after {kill_after:?} ({status}); {sent} commands sent, \
             {} blocks durable",
            made_durable.len()
        );
        durable.extend(made_durable);
        drop((q, admin.s.shutdown(std::net::Shutdown::Both)));
        rounds += 1;
    }
    // The last round's durable blocks, checked on one more restart.
    let port = free_port();
    let mut child = start_target(&dir, port);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (_admin, cntlid) = Peer::admin(addr, 0);
    let mut verify = Peer::io(addr, cntlid, 1, 31);
    for (i, &k) in durable.iter().enumerate() {
        let sqe =
            Sqe::rw(io::READ, Cid(i as u16 % 1024), Nsid(1), u64::from(k), 1, SglDescriptor::transport(BLOCK as u32));
        let (c, data) = verify.cmd(&sqe, &[]);
        assert_eq!(c.status, Status::SUCCESS);
        assert!(data == block(k), "durable block {k} lost or torn after the last kill (seed {base_seed})");
    }
    checked_total += durable.len();
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{rounds} kill -9 rounds (base seed {base_seed}): {} blocks durable, {checked_total} block checks, none lost",
        durable.len()
    );
    assert!(!durable.is_empty(), "some writes were made durable before the kills");
}
