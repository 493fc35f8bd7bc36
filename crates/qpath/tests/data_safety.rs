//! Data safety of file namespaces, through the `qpath` binary as a user runs it: a
//! namespace never truncates, grows or shares a user's file or device unless told to, and a
//! start that fails leaves no file behind that it created.
//!
//! Every target process here is bounded in time (`EXIT_WITHIN`, `START_WITHIN`) and killed
//! by its pid when its test ends. The block-device test needs root and `losetup` (it says
//! `SKIP:` otherwise) and detaches its loop device even when it fails.

#![allow(clippy::cast_possible_truncation)] // the support module's cntlid; pattern bytes

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};

mod loopback;
mod support;
use loopback::free_port;
use support::{NQN, Peer};

const MIB: u64 = 1 << 20;
/// A refused start must end within this long.
const EXIT_WITHIN: Duration = Duration::from_secs(20);
/// A good start must be listening within this long.
const START_WITHIN: Duration = Duration::from_secs(20);

/// A directory of its own for one test, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("qpath-data-safety-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A file of `len` bytes filled with a pattern (so a checksum shows any change).
    fn image(&self, name: &str, len: u64) -> PathBuf {
        let p = self.path(name);
        let block: Vec<u8> = (0..MIB).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut data = Vec::with_capacity(usize::try_from(len).unwrap());
        for k in 0..len.div_ceil(MIB) {
            let mut b = block.clone();
            b[..8].copy_from_slice(&k.to_le_bytes());
            data.extend_from_slice(&b);
        }
        data.truncate(usize::try_from(len).unwrap());
        std::fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Size and CRC-32C of a file's (or device's) bytes.
fn fingerprint(p: &Path) -> (u64, u32) {
    let data = std::fs::read(p).unwrap();
    (data.len() as u64, nvme::tcp::crc32c(&data))
}

/// A target config: one port, the peer's subsystem (any host), one namespace per body.
fn config(dir: &Dir, name: &str, port: u16, namespaces: &[String]) -> PathBuf {
    let mut t = format!(
        "[reactor]\nreactors = 1\npoll = \"block\"\n[[port]]\nid = 1\naddr = \"127.0.0.1:{port}\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n"
    );
    for n in namespaces {
        t += &format!("[[subsystem.namespace]]\n{n}\n");
    }
    let p = dir.path(name);
    std::fs::write(&p, t).unwrap();
    p
}

fn file_ns(path: &Path, extra: &str) -> String {
    format!("backend = \"file\"\npath = \"{}\"\n{extra}", path.display())
}

fn target_cmd(cfg: &Path, rpc: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
    c.arg("target").arg("--config").arg(cfg).arg("--rpc-socket").arg(rpc);
    c
}

/// Runs a command that must end by itself within `EXIT_WITHIN`; kills it (by its pid)
/// and fails if it does not.
fn run_bounded(mut cmd: Command) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + EXIT_WITHIN;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {EXIT_WITHIN:?} (it should have refused to start); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Runs `qpath target` that must refuse to start: returns its error text.
fn refused(cmd: Command) -> String {
    let out = run_bounded(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "exit status {:?} must say failure; stderr:\n{stderr}", out.status);
    stderr
}

/// A running `qpath target`, killed when dropped.
struct Target {
    child: Child,
    addr: SocketAddr,
    rpc: PathBuf,
    log: PathBuf,
}

impl Target {
    fn start(dir: &Dir, name: &str, namespaces: &[String]) -> Target {
        let port = free_port();
        let cfg = config(dir, &format!("{name}.toml"), port, namespaces);
        let rpc = dir.path(&format!("{name}.sock"));
        let log = dir.path(&format!("{name}.log"));
        let child = target_cmd(&cfg, &rpc)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut t = Target { child, addr: format!("127.0.0.1:{port}").parse().unwrap(), rpc, log };
        let deadline = Instant::now() + START_WITHIN;
        while TcpStream::connect(t.addr).is_err() || !t.rpc.exists() {
            if let Some(status) = t.child.try_wait().unwrap() {
                panic!("target {name} exited ({status}): {}", std::fs::read_to_string(&t.log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "target {name} did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        t
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `qpath rpc METHOD PARAMS...` against this target: Ok(stdout) or Err(stderr).
    fn rpc(&self, method: &str, params: &[&str]) -> Result<String, String> {
        let mut c = Command::new(env!("CARGO_BIN_EXE_qpath"));
        c.arg("rpc").arg("--socket").arg(&self.rpc).arg(method).args(params);
        let out = run_bounded(c);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Reads LBA `lba` (512 bytes) of namespace 1 over NVMe/TCP.
    fn read_block(&self, lba: u64) -> Vec<u8> {
        let (_admin, cntlid) = Peer::admin(self.addr, 30_000);
        let mut q = Peer::io(self.addr, cntlid, 1, 31);
        let sqe = Sqe::rw(io::READ, Cid(7), Nsid(1), lba, 1, SglDescriptor::transport(512));
        let (cqe, data) = q.cmd(&sqe, &[]);
        assert_eq!(cqe.status, Status::SUCCESS, "read of LBA {lba}");
        data
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn namespace_sizes(t: &Target) -> Vec<(u64, u64)> {
    let out = t.rpc("list_subsystems", &[]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array().unwrap()[0]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["nsid"].as_u64().unwrap(), n["size"].as_u64().unwrap()))
        .collect()
}

#[test]
fn a_smaller_size_in_the_config_is_refused_and_the_image_is_unchanged() {
    let d = Dir::new("smaller");
    let img = d.image("vol1.img", 64 * MIB);
    let before = fingerprint(&img);
    let cfg = config(&d, "t.toml", free_port(), &[file_ns(&img, "size = \"16M\"")]);
    let e = refused(target_cmd(&cfg, &d.path("t.sock")));
    let want = format!(
        "namespace 1 of {NQN}: {} is 64 MiB but size = 16 MiB asks for less; qpath never shrinks a file",
        img.display()
    );
    assert!(e.contains(&want), "the error says what and why:\n{e}");
    assert_eq!(fingerprint(&img), before, "size and contents unchanged");
}

#[test]
fn rpc_add_namespace_never_shrinks_grows_only_when_asked_and_locks_until_removed() {
    let d = Dir::new("rpc");
    let img = d.image("vol1.img", 64 * MIB);
    let before = fingerprint(&img);
    let t = Target::start(&d, "t", &["backend = \"ram\"\nsize = \"1M\"".into()]);
    let path = format!("path={}", img.display());
    let nqn = format!("nqn={NQN}");
    let e = t.rpc("add_namespace", &[&nqn, "backend=file", &path, "size=1M"]).unwrap_err();
    assert!(
        e.contains(&format!("namespace 2 of {NQN}: {} is 64 MiB but size = 1 MiB asks for less", img.display())),
        "{e}"
    );
    assert_eq!(fingerprint(&img), before, "size and contents unchanged");
    // Without a size: the whole file.
    t.rpc("add_namespace", &[&nqn, "backend=file", &path]).unwrap();
    assert_eq!(namespace_sizes(&t), vec![(1, MIB), (2, 64 * MIB)]);
    // A second namespace on the same file is refused, naming the first.
    let e = t.rpc("add_namespace", &[&nqn, "backend=file", &path]).unwrap_err();
    assert!(e.contains(&format!("already used by namespace 2 of {NQN}")), "{e}");
    // Removing the namespace lets the file go.
    t.rpc("remove_namespace", &[&nqn, "nsid:=2"]).unwrap();
    t.rpc("add_namespace", &[&nqn, "backend=file", &path, "nsid:=3"]).unwrap();
    assert_eq!(namespace_sizes(&t), vec![(1, MIB), (3, 64 * MIB)]);
    assert_eq!(fingerprint(&img), before);
    // grow=true grows a smaller file; without it a larger size is refused.
    let small = d.image("small.img", MIB);
    let small_path = format!("path={}", small.display());
    let e = t.rpc("add_namespace", &[&nqn, "backend=file", &small_path, "size=2M"]).unwrap_err();
    assert!(e.contains("asks for more") && e.contains("grow = true"), "{e}");
    assert_eq!(std::fs::metadata(&small).unwrap().len(), MIB);
    t.rpc("add_namespace", &[&nqn, "backend=file", &small_path, "size=2M", "grow:=true"]).unwrap();
    assert_eq!(std::fs::metadata(&small).unwrap().len(), 2 * MIB, "grown as asked");
    // A failed add leaves no file it created (here an invalid block size, found after).
    let new = d.path("new.img");
    let new_path = format!("path={}", new.display());
    assert!(t.rpc("add_namespace", &[&nqn, "backend=file", &new_path, "size=1M", "block_size:=1000"]).is_err());
    assert!(!new.exists(), "the failed add removed the file it created");
}

/// A removed file namespace lets its file go while a host stays connected to the
/// subsystem without a command: the file can be served again (and is then locked by the
/// new namespace), as the operator who removed it expects.
#[test]
fn a_removed_namespace_lets_its_file_go_while_an_idle_host_stays_connected() {
    let d = Dir::new("idle-host");
    let img = d.image("vol1.img", 4 * MIB);
    let t = Target::start(&d, "t", &[file_ns(&img, "")]);
    let (admin, cntlid) = Peer::admin(t.addr, 30_000);
    let mut q = Peer::io(t.addr, cntlid, 1, 31);
    // The I/O queue has used the namespace, then stays connected and silent.
    let sqe = Sqe::rw(io::READ, Cid(7), Nsid(1), 0, 1, SglDescriptor::transport(512));
    assert_eq!(q.cmd(&sqe, &[]).0.status, Status::SUCCESS);
    let nqn = format!("nqn={NQN}");
    t.rpc("remove_namespace", &[&nqn, "nsid:=1"]).unwrap();
    let path = format!("path={}", img.display());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match t.rpc("add_namespace", &[&nqn, "backend=file", &path, "nsid:=1"]) {
            Ok(_) => break,
            Err(e) => {
                assert!(e.contains("already used by namespace 1"), "{e}");
                assert!(Instant::now() < deadline, "the removed namespace still holds its file: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    assert_eq!(namespace_sizes(&t), vec![(1, 4 * MIB)]);
    drop((admin, q));
}

#[test]
fn two_namespaces_of_one_config_on_one_file_are_refused() {
    let d = Dir::new("twice");
    let img = d.image("vol1.img", 4 * MIB);
    let before = fingerprint(&img);
    let cfg = config(&d, "t.toml", free_port(), &[file_ns(&img, ""), file_ns(&img, "")]);
    let e = refused(target_cmd(&cfg, &d.path("t.sock")));
    assert!(
        e.contains(&format!("namespace 2 of {NQN}: {} is already used by namespace 1 of {NQN}", img.display())),
        "{e}"
    );
    assert_eq!(fingerprint(&img), before);
}

#[test]
fn a_second_target_process_is_refused_naming_the_first_which_keeps_serving() {
    let d = Dir::new("two-processes");
    let img = d.image("vol1.img", 4 * MIB);
    let first = Target::start(&d, "first", &[file_ns(&img, "")]);
    let cfg = config(&d, "second.toml", free_port(), &[file_ns(&img, "")]);
    let e = refused(target_cmd(&cfg, &d.path("second.sock")));
    assert!(e.contains(&format!("is locked by process {} (qpath)", first.pid())), "names the holder:\n{e}");
    // A readonly namespace elsewhere cannot share a file another process writes either.
    let cfg = config(&d, "third.toml", free_port(), &[file_ns(&img, "readonly = true")]);
    let e = refused(target_cmd(&cfg, &d.path("third.sock")));
    assert!(e.contains("is locked by process"), "{e}");
    // The first still serves the file's data.
    let on_disk = std::fs::read(&img).unwrap();
    assert_eq!(first.read_block(3), on_disk[3 * 512..4 * 512]);
    assert!(first.rpc("get_target", &[]).is_ok());
}

#[test]
fn readonly_namespaces_share_a_file_in_one_process_and_across_processes() {
    let d = Dir::new("readonly");
    let img = d.image("gold.img", 4 * MIB);
    let before = fingerprint(&img);
    let ro = file_ns(&img, "readonly = true");
    let a = Target::start(&d, "a", &[ro.clone(), ro.clone()]);
    let b = Target::start(&d, "b", &[ro]);
    assert_eq!(namespace_sizes(&a), vec![(1, 4 * MIB), (2, 4 * MIB)]);
    let on_disk = std::fs::read(&img).unwrap();
    assert_eq!(a.read_block(0), on_disk[..512]);
    assert_eq!(b.read_block(1), on_disk[512..1024]);
    // Nobody may write it while they read.
    let cfg = config(&d, "w.toml", free_port(), &[file_ns(&img, "")]);
    let e = refused(target_cmd(&cfg, &d.path("w.sock")));
    assert!(e.contains("is locked by process"), "{e}");
    drop((a, b));
    assert_eq!(fingerprint(&img), before);
}

#[test]
fn a_failed_start_leaves_no_file_it_created() {
    let d = Dir::new("leftovers");
    let new = d.path("new.img");
    // The second namespace is refused: the first one's new file goes.
    let cfg = config(&d, "t.toml", free_port(), &[file_ns(&new, "size = \"4M\""), file_ns(&new, "")]);
    let e = refused(target_cmd(&cfg, &d.path("t.sock")));
    assert!(e.contains("already used by namespace 1"), "{e}");
    assert!(!new.exists(), "the file this start created is removed");
    // A port that cannot bind.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = config(&d, "p.toml", taken.local_addr().unwrap().port(), &[file_ns(&new, "size = \"4M\"")]);
    let e = refused(target_cmd(&cfg, &d.path("p.sock")));
    assert!(e.contains("listen on"), "{e}");
    assert!(!new.exists(), "removed after the port failed");
    // An RPC socket that cannot be made (its directory does not exist).
    let cfg = config(&d, "r.toml", free_port(), &[file_ns(&new, "size = \"4M\"")]);
    let e = refused(target_cmd(&cfg, &d.path("no-such-dir/r.sock")));
    assert!(e.contains("RPC socket"), "{e}");
    assert!(!new.exists(), "removed after the RPC socket failed");
    // A file it did not create stays, whatever fails.
    let old = d.image("old.img", MIB);
    let before = fingerprint(&old);
    let cfg = config(&d, "o.toml", free_port(), &[file_ns(&old, ""), file_ns(&new, "")]);
    let e = refused(target_cmd(&cfg, &d.path("o.sock")));
    assert!(e.contains("does not exist; give size to create it"), "{e}");
    assert_eq!(fingerprint(&old), before);
    assert!(!new.exists(), "no size, no file");
}

#[test]
fn grow_true_grows_a_smaller_file_and_keeps_its_data() {
    let d = Dir::new("grow");
    let img = d.image("vol1.img", 16 * MIB);
    let head = std::fs::read(&img).unwrap();
    let cfg = config(&d, "t.toml", free_port(), &[file_ns(&img, "size = \"64M\"")]);
    let e = refused(target_cmd(&cfg, &d.path("t.sock")));
    assert!(e.contains("is 16 MiB but size = 64 MiB asks for more") && e.contains("grow = true"), "{e}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 16 * MIB, "not grown unless asked");
    let t = Target::start(&d, "g", &[file_ns(&img, "size = \"64M\"\ngrow = true")]);
    assert_eq!(namespace_sizes(&t), vec![(1, 64 * MIB)]);
    let now = std::fs::read(&img).unwrap();
    assert_eq!(now.len() as u64, 64 * MIB);
    assert!(now[..head.len()] == head[..] && now[head.len()..].iter().all(|&b| b == 0), "the data kept, zeros after");
}

/// A loop device over a file, detached when dropped (also when the test fails).
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn attach(file: &Path) -> Option<Loop> {
        let out = Command::new("losetup").arg("-f").arg("--show").arg(file).output().ok()?;
        if !out.status.success() {
            eprintln!("losetup: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(Loop { dev: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()) })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A mount, unmounted when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|u| u.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

#[test]
fn needs_root_a_block_device_is_never_resized_and_held_by_one_target() {
    if !is_root() {
        println!("SKIP: needs root (loop devices)");
        return;
    }
    if !have("losetup") {
        println!("SKIP: losetup is not installed");
        return;
    }
    let d = Dir::new("bdev");
    let backing = d.image("backing.img", 32 * MIB);
    let Some(lo) = Loop::attach(&backing) else {
        println!("SKIP: losetup -f --show failed (no free loop device?)");
        return;
    };
    let dev = lo.dev.clone();
    let before = fingerprint(&dev);
    let bdev = |extra: &str| file_ns(&dev, extra);
    // Never resized: smaller and larger sizes are refused, grow or not.
    for (size, why) in [
        ("size = \"16M\"", "is a block device of 32 MiB but size = 16 MiB asks for less"),
        (
            "size = \"64M\"\ngrow = true",
            "is a block device of 32 MiB but size = 64 MiB asks for more; a block device cannot grow",
        ),
    ] {
        let cfg = config(&d, "s.toml", free_port(), &[bdev(size)]);
        let e = refused(target_cmd(&cfg, &d.path("s.sock")));
        assert!(e.contains(&format!("namespace 1 of {NQN}: {} {why}", dev.display())), "{e}");
    }
    assert_eq!(fingerprint(&dev), before);
    assert_eq!(std::fs::metadata(&backing).unwrap().len(), 32 * MIB);
    // Served whole; a second target is refused while the first serves, naming it.
    {
        let first = Target::start(&d, "first", &[bdev("")]);
        assert_eq!(namespace_sizes(&first), vec![(1, 32 * MIB)]);
        let cfg = config(&d, "second.toml", free_port(), &[bdev("")]);
        let e = refused(target_cmd(&cfg, &d.path("second.sock")));
        assert!(
            e.contains(&format!("{} is in use: opened exclusively by process {} (qpath)", dev.display(), first.pid())),
            "{e}"
        );
        assert_eq!(first.read_block(5), before_block(&backing, 5));
    }
    // Two namespaces of one target on it: the second is refused, naming the first.
    let cfg = config(&d, "twice.toml", free_port(), &[bdev(""), bdev("")]);
    let e = refused(target_cmd(&cfg, &d.path("twice.sock")));
    assert!(
        e.contains(&format!("namespace 2 of {NQN}: {} is already used by namespace 1 of {NQN}", dev.display())),
        "{e}"
    );
    assert_eq!(fingerprint(&dev), before);
    // A mounted device is refused.
    if !have("mkfs.ext4") {
        println!("SKIP (mounted device part): mkfs.ext4 is not installed");
        return;
    }
    let mkfs = Command::new("mkfs.ext4").arg("-q").arg("-F").arg(&dev).output().unwrap();
    if !mkfs.status.success() {
        println!("SKIP (mounted device part): mkfs.ext4 failed: {}", String::from_utf8_lossy(&mkfs.stderr));
        return;
    }
    let mnt = d.path("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount").arg(&dev).arg(&mnt).output().unwrap();
    if !mounted.status.success() {
        println!("SKIP (mounted device part): mount failed: {}", String::from_utf8_lossy(&mounted.stderr));
        return;
    }
    let _mount = Mount(mnt.clone());
    let cfg = config(&d, "m.toml", free_port(), &[bdev("")]);
    let e = refused(target_cmd(&cfg, &d.path("m.sock")));
    let at = mnt.canonicalize().unwrap();
    assert!(e.contains(&format!("{} is in use: mounted at {}", dev.display(), at.display())), "{e}");
}

/// Block `lba` (512 bytes) of a file.
fn before_block(file: &Path, lba: usize) -> Vec<u8> {
    std::fs::read(file).unwrap()[lba * 512..(lba + 1) * 512].to_vec()
}
