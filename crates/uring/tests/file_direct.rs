//! Scenario: file backend I/O at offsets: fallocate, write_at, fsync, read_at, punch hole,
//! with O_DIRECT on a temporary file (buffered if the file system refuses O_DIRECT).

mod common;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use common::{drive, pattern};
use uring::{Completion, FsyncMode, IoBuf, OpKind, Ring, RingConfig};

const BLOCK: usize = 16 * 1024;
const FILE_BYTES: u64 = 1 << 20;

fn open_direct(path: &PathBuf) -> (File, bool) {
    let direct =
        OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(file) => (file, true),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!("file system refuses O_DIRECT at {}; testing buffered I/O", path.display());
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .expect("open buffered");
            (file, false)
        }
        Err(error) => panic!("open {}: {error}", path.display()),
    }
}

/// Runs one operation to completion and returns it.
fn run(ring: &mut Ring) -> Completion {
    let mut done: Option<Completion> = None;
    drive(ring, &mut done, Duration::from_secs(10), |_, done, c| *done = Some(c), |done| done.is_some());
    done.expect("completion")
}

#[test]
fn write_fsync_read_at_offsets() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("uring-file-{}", std::process::id()));
    let (file, direct) = open_direct(&path);
    let fd = file.as_raw_fd();
    let mut ring = Ring::new(RingConfig::default()).expect("ring");

    ring.fallocate(fd, 0, 0, FILE_BYTES, 1).expect("queue fallocate");
    let c = run(&mut ring);
    assert_eq!((c.op, c.result), (OpKind::Fallocate, 0), "fallocate");

    let offsets = [0u64, 64 * 1024, FILE_BYTES - BLOCK as u64];
    for (i, &offset) in offsets.iter().enumerate() {
        let mut buf = IoBuf::new(BLOCK);
        buf.extend_from_slice(&pattern(u8::try_from(i).expect("small"), BLOCK));
        ring.write_at(fd, buf, 0..BLOCK, offset, 10 + i as u64).map_err(|(e, _)| e).expect("queue write");
        let c = run(&mut ring);
        assert_eq!(c.op, OpKind::Write);
        assert_eq!(c.token, 10 + i as u64);
        assert_eq!(usize::try_from(c.result).ok(), Some(BLOCK), "whole write (direct={direct})");
        assert_eq!(c.into_buf().expect("buffer back").len(), BLOCK);
    }

    ring.fsync(fd, FsyncMode::Data, 2).expect("queue fdatasync");
    assert_eq!(run(&mut ring).result, 0, "fdatasync");
    ring.fsync(fd, FsyncMode::Full, 3).expect("queue fsync");
    assert_eq!(run(&mut ring).result, 0, "fsync");

    for (i, &offset) in offsets.iter().enumerate() {
        ring.read_at(fd, IoBuf::new(BLOCK), BLOCK, offset, 20).map_err(|(e, _)| e).expect("queue read");
        let c = run(&mut ring);
        assert_eq!(usize::try_from(c.result).ok(), Some(BLOCK));
        let buf = c.into_buf().expect("buffer back");
        assert!(buf[..] == pattern(u8::try_from(i).expect("small"), BLOCK)[..], "data at {offset}");
    }

    // A block never written reads back as zeros (fallocate allocated it).
    ring.read_at(fd, IoBuf::new(BLOCK), BLOCK, 128 * 1024, 21).map_err(|(e, _)| e).expect("queue read");
    let buf = run(&mut ring).into_buf().expect("buffer");
    assert!(buf.iter().all(|&b| b == 0));

    // Reading at end of file is short (zero bytes), not an error.
    ring.read_at(fd, IoBuf::new(BLOCK), BLOCK, FILE_BYTES, 22).map_err(|(e, _)| e).expect("queue read");
    let c = run(&mut ring);
    assert_eq!(c.result, 0, "EOF");
    assert!(c.into_buf().expect("buffer").is_empty());

    // Deallocate (NVMe Dataset Management) maps to a punched hole that reads as zeros.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    ring.fallocate(fd, punch, 0, BLOCK as u64, 4).expect("queue punch");
    let c = run(&mut ring);
    if c.result == -libc::EOPNOTSUPP {
        eprintln!("file system cannot punch holes; skipping the deallocate check");
    } else {
        assert_eq!(c.result, 0, "punch hole");
        ring.read_at(fd, IoBuf::new(BLOCK), BLOCK, 0, 23).map_err(|(e, _)| e).expect("queue read");
        assert!(run(&mut ring).into_buf().expect("buffer").iter().all(|&b| b == 0));
    }

    drop(file);
    std::fs::remove_file(&path).expect("remove temp file");
}
