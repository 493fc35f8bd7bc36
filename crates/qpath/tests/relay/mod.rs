//! A TCP relay between a host and a target port that a test can freeze (it stops
//! forwarding: a silent path) or cut (every connection it carries closes at once, in
//! the middle of whatever PDU is passing).

#![allow(dead_code)] // each test crate uses a part

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A TCP relay that can go silent.
pub struct Relay {
    pub addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    /// Bumped when a freeze ends: connections opened before it are closed.
    epoch: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(upstream: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let (frozen, epoch, stop) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (f, e, s) = (Arc::clone(&frozen), Arc::clone(&epoch), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                let Ok((down, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let Ok(up) = TcpStream::connect(upstream) else { continue };
                let born = e.load(Ordering::Acquire);
                for (from, to) in [(down.try_clone().unwrap(), up.try_clone().unwrap()), (up, down)] {
                    let (f, e, s) = (Arc::clone(&f), Arc::clone(&e), Arc::clone(&s));
                    std::thread::spawn(move || pump(&from, &to, &f, &e, born, &s));
                }
            }
        });
        Relay { addr, frozen, epoch, stop }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    pub fn thaw(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.frozen.store(false, Ordering::Release);
    }

    /// Closes every connection it carries now (new ones are relayed again).
    pub fn cut(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Copies `from` to `to` unless frozen; a connection older than the last freeze is closed.
fn pump(from: &TcpStream, to: &TcpStream, frozen: &AtomicBool, epoch: &AtomicU64, born: u64, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut from_r, mut to_w) = (from, to);
    loop {
        if stop.load(Ordering::Acquire) || epoch.load(Ordering::Acquire) != born {
            break;
        }
        if frozen.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match from_r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
