//! Crash consistency of the file backend: a write, a Deallocate or a Write Zeroes
//! acknowledged with FUA, or acknowledged before a Flush that completed was sent, survives
//! `kill -9` of the target and a restart on the same file, and the file's size never changes.
//!
//! Each round starts `qpath target` on the file, checks every block made durable in the
//! earlier rounds, then pipelines numbered 4 KiB writes (every fifth with FUA), Flushes, and
//! now and then a Dataset Management Deallocate of several blocks written earlier in the
//! round (several ranges in one command) or a Write Zeroes of one (with or without DEAC,
//! sometimes FUA), over a raw NVMe/TCP queue until a SIGKILL at a random point ends it.
//! After the restart a block whose zeroing was made durable reads zeros (a Deallocate only
//! where Identify's DLFEAT promises it), a block whose write was made durable reads its data
//! (or zeros, if a zeroing of it was acknowledged but not yet durable), nothing else. The
//! seed of each kill point is printed; `CRASH_SEED=N` replays one run.

#![allow(clippy::cast_possible_truncation)] // block numbers and sizes are small

use std::collections::{HashMap, HashSet};
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

/// What an acknowledged command did to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    /// Wrote its data.
    Wrote(u32),
    /// Deallocated it (zeros where DLFEAT promises them, else its data stays).
    Deallocated(u32),
    /// Wrote zeroes over it.
    Zeroed(u32),
}

enum InFlight {
    /// Commands whose effect is durable once acknowledged (FUA), or not.
    Cmd { done: Vec<Done>, fua: bool },
    /// The commands acknowledged before this Flush was sent.
    Flush(Vec<Done>),
}

/// What one round did before the kill.
struct Round {
    /// Made durable: by FUA, or by a Flush that completed.
    durable: Vec<Done>,
    /// Blocks a Deallocate or Write Zeroes was sent for (durable or not).
    zeroing_sent: Vec<u32>,
    sent: u32,
}

/// A Dataset Management Deallocate of `blocks` (one range each, in one command) or a Write
/// Zeroes of the first of them.
fn zeroing_cmd(cid: u16, blocks: &[u32], rng: &mut impl Rng) -> (Sqe, Vec<u8>, InFlight) {
    if blocks.len() > 1 {
        let data: Vec<u8> = blocks
            .iter()
            .flat_map(|&k| {
                let mut r = [0u8; 16];
                r[4..8].copy_from_slice(&1u32.to_le_bytes());
                r[8..16].copy_from_slice(&u64::from(k).to_le_bytes());
                r
            })
            .collect();
        let sgl = SglDescriptor::in_capsule(data.len() as u32);
        let sqe = Sqe::dsm_deallocate(Cid(cid), Nsid(1), blocks.len() as u32, sgl);
        let done = blocks.iter().map(|&k| Done::Deallocated(k)).collect();
        return (sqe, data, InFlight::Cmd { done, fua: false });
    }
    let fua = rng.random_ratio(1, 3);
    let mut sqe = Sqe::write_zeroes(Cid(cid), Nsid(1), u64::from(blocks[0]), 1, rng.random_bool(0.5));
    sqe.set_fua(fua);
    (sqe, Vec::new(), InFlight::Cmd { done: vec![Done::Zeroed(blocks[0])], fua })
}

/// Pipelines writes of blocks `first..first + PER_ROUND`, Flushes, Deallocates and Write
/// Zeroes of blocks whose write was acknowledged, until the connection dies (the kill) or
/// the blocks run out.
fn write_until_killed(q: &mut Peer, first: u32, rng: &mut impl Rng) -> Round {
    let mut durable = Vec::new();
    let mut acked = Vec::new();
    // Blocks whose write was acknowledged and that no zeroing has named yet: a zeroing never
    // races the block's write, and each block is zeroed at most once.
    let mut written = Vec::new();
    let mut zeroing_sent = Vec::new();
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
            } else if written.len() >= 8 && rng.random_ratio(1, 6) {
                // 1 block (Write Zeroes) or 2..=5 (Deallocate with that many ranges).
                let n = if rng.random_bool(0.5) { 1 } else { rng.random_range(2..=5) };
                let blocks: Vec<u32> =
                    (0..n).map(|_| written.swap_remove(rng.random_range(0..written.len()))).collect();
                zeroing_sent.extend_from_slice(&blocks);
                zeroing_cmd(cid, &blocks, rng)
            } else {
                let fua = next.is_multiple_of(5);
                let mut sqe =
                    Sqe::rw(io::WRITE, Cid(cid), Nsid(1), u64::from(next), 1, SglDescriptor::in_capsule(BLOCK as u32));
                sqe.set_fua(fua);
                next += 1;
                (sqe, block(next - 1), InFlight::Cmd { done: vec![Done::Wrote(next - 1)], fua })
            };
            let mut out = Vec::new();
            q.enc.capsule_cmd(&mut out, &sqe, data.len());
            out.extend_from_slice(&data);
            if q.s.write_all(&out).is_err() {
                return Round { durable, zeroing_sent, sent };
            }
            sent += 1;
            inflight.insert(cid, what);
        }
        if inflight.is_empty() {
            return Round { durable, zeroing_sent, sent };
        }
        // One response (the kill shows as EOF or a reset).
        let resp = loop {
            if let Some((h, _)) = q.parse() {
                break h;
            }
            let mut tmp = [0u8; 65536];
            match q.s.read(&mut tmp) {
                Ok(0) => return Round { durable, zeroing_sent, sent },
                Ok(n) => q.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Round { durable, zeroing_sent, sent },
            }
        };
        let Header::CapsuleResp(c) = resp else { panic!("unexpected {resp:?}") };
        assert_eq!(c.status, Status::SUCCESS, "a command failed before the kill");
        match inflight.remove(&c.cid.0).expect("a response for a command in flight") {
            InFlight::Cmd { done, fua } => {
                written.extend(done.iter().filter_map(|d| if let Done::Wrote(k) = d { Some(*k) } else { None }));
                if fua { durable.extend(done) } else { acked.extend(done) }
            }
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
    let size = u64::from(ROUNDS * PER_ROUND) * BLOCK as u64;
    // What each block made durable must read: its data, or zeros.
    let mut expect: HashMap<u32, Expect> = HashMap::new();
    let mut zeroing_sent: HashSet<u32> = HashSet::new();
    let mut dlfeat = None;
    let mut checked_total = 0usize;
    let mut zeros_total = 0usize;
    let mut rounds = 0;
    for round in 0..ROUNDS {
        // Bounded in time too: a loaded machine runs fewer rounds (at least two).
        if round >= 2 && start.elapsed() > Duration::from_secs(90) {
            break;
        }
        let port = free_port();
        let child = start_target(&dir, port);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (mut admin, cntlid) = Peer::admin(addr, 0);
        let reads_zeros = *dlfeat.get_or_insert_with(|| identify_dlfeat(&mut admin)) & 0x7 == 1;
        // Every block made durable so far reads back whole, across every earlier kill.
        let mut verify = Peer::io(addr, cntlid, 2, 31);
        check(&mut verify, &expect, &zeroing_sent, &format!("round {round} (seed {base_seed})"));
        checked_total += expect.len();
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
        let done = write_until_killed(&mut q, round * PER_ROUND, &mut rng);
        let status = killer.join().unwrap();
        assert_eq!(std::fs::metadata(dir.join("ns.img")).unwrap().len(), size, "the file's size changed");
        println!(
            "round {round} (seed {seed}): killed after {kill_after:?} ({status}); {} commands sent, \
             {} durable ({} zeroings), {} zeroings sent",
            done.sent,
            done.durable.len(),
            done.durable.iter().filter(|d| !matches!(d, Done::Wrote(_))).count(),
            done.zeroing_sent.len(),
        );
        for d in done.durable {
            match d {
                // A zeroing is sent only after the block's write was acknowledged: it wins
                // over the write whichever became durable first.
                Done::Wrote(k) => {
                    expect.entry(k).or_insert(Expect::Data);
                }
                Done::Deallocated(k) if !reads_zeros => {
                    expect.entry(k).or_insert(Expect::Data);
                }
                Done::Deallocated(k) | Done::Zeroed(k) => {
                    expect.insert(k, Expect::Zeros);
                }
            }
        }
        zeroing_sent.extend(done.zeroing_sent);
        drop((q, admin.s.shutdown(std::net::Shutdown::Both)));
        rounds += 1;
    }
    // The last round's durable blocks, checked on one more restart.
    let port = free_port();
    let mut child = start_target(&dir, port);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (_admin, cntlid) = Peer::admin(addr, 0);
    let mut verify = Peer::io(addr, cntlid, 1, 31);
    check(&mut verify, &expect, &zeroing_sent, &format!("after the last kill (seed {base_seed})"));
    checked_total += expect.len();
    zeros_total += expect.values().filter(|e| **e == Expect::Zeros).count();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(std::fs::metadata(dir.join("ns.img")).unwrap().len(), size, "the file's size changed");
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{rounds} kill -9 rounds (base seed {base_seed}, DLFEAT {:#04x}): {} blocks durable, {zeros_total} of them \
         zeroed, {checked_total} block checks, none lost",
        dlfeat.unwrap_or(0),
        expect.len()
    );
    assert!(expect.values().any(|e| *e == Expect::Data), "some writes were made durable before the kills");
    assert!(zeros_total > 0, "some zeroings were made durable before the kills");
}

/// What a block made durable reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Its data ([`block`]), or zeros if a zeroing of it was sent.
    Data,
    /// Zeros.
    Zeros,
}

/// Reads every block of `expect` and checks it.
fn check(q: &mut Peer, expect: &HashMap<u32, Expect>, zeroing_sent: &HashSet<u32>, when: &str) {
    let zeros = vec![0u8; BLOCK];
    let mut blocks: Vec<(&u32, &Expect)> = expect.iter().collect();
    blocks.sort_by_key(|(k, _)| **k);
    for (i, (&k, &e)) in blocks.into_iter().enumerate() {
        let sgl = SglDescriptor::transport(BLOCK as u32);
        let sqe = Sqe::rw(io::READ, Cid(i as u16 % 1024), Nsid(1), u64::from(k), 1, sgl);
        let (c, data) = q.cmd(&sqe, &[]);
        assert_eq!(c.status, Status::SUCCESS);
        match e {
            Expect::Zeros => assert!(data == zeros, "{when}: block {k} was zeroed durably, reads data"),
            Expect::Data if data == block(k) => {}
            Expect::Data => assert!(
                data == zeros && zeroing_sent.contains(&k),
                "{when}: durable block {k} lost or torn ({})",
                if data == zeros { "reads zeros, never zeroed" } else { "reads other data" }
            ),
        }
    }
}

/// Identify Namespace's DLFEAT of namespace 1.
fn identify_dlfeat(admin: &mut Peer) -> u8 {
    let sqe = Sqe::identify(Cid(9), nvme::identify::cns::NAMESPACE, Nsid(1), 0, 0);
    let (c, data) = admin.cmd(&sqe, &[]);
    assert_eq!(c.status, Status::SUCCESS);
    nvme::identify::IdentifyNamespace::decode(&data).dlfeat
}
