//! The admin thread's bell: what wakes it between turns besides its socket and its
//! keep-alive timer. A Unix stream pair rather than a channel because the thread sleeps
//! in `poll(2)` on the admin socket too; the controller holds the ringing end, so
//! dropping the controller wakes the thread (end of file) to end.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The ringing end (held by the controller; any thread rings it).
#[derive(Debug)]
pub(super) struct Bell(UnixStream);

/// The admin thread's end.
#[derive(Debug)]
pub(super) struct BellRx(UnixStream);

/// A bell and its receiver, both non-blocking.
pub(super) fn pair() -> io::Result<(Bell, BellRx)> {
    let (a, b) = UnixStream::pair()?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    Ok((Bell(a), BellRx(b)))
}

impl Bell {
    /// Wakes the admin thread. Never blocks: a full socket already holds a ring the
    /// thread has not heard yet, which is all a ring says.
    pub(super) fn ring(&self) {
        let _ = (&self.0).write(&[1]);
    }
}

impl BellRx {
    /// Sleeps until `admin` has input, the bell rings (or its controller is dropped) or
    /// `timeout` passes; whether `admin` may have input. Rings heard are consumed.
    pub(super) fn wait(&self, admin: &TcpStream, timeout: Duration) -> bool {
        match uring::wait_readable(&[admin.as_raw_fd(), self.0.as_raw_fd()], timeout) {
            Ok(ready) => {
                if ready & 0b10 != 0 {
                    let mut sink = [0u8; 64];
                    while matches!((&self.0).read(&mut sink), Ok(n) if n > 0) {}
                }
                ready & 0b01 != 0
            }
            // Let the caller take a turn and look for itself.
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    fn socket_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn sleeps_until_input_a_ring_or_the_timeout() {
        let (bell, rx) = pair().unwrap();
        let (admin, mut peer) = socket_pair();
        // Nothing: the whole timeout, no input.
        let t = Instant::now();
        assert!(!rx.wait(&admin, Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // A ring (several): wakes, no input, and the rings are consumed.
        bell.ring();
        bell.ring();
        assert!(!rx.wait(&admin, Duration::from_secs(10)));
        let t = Instant::now();
        assert!(!rx.wait(&admin, Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        // Input on the admin socket.
        peer.write_all(b"x").unwrap();
        assert!(rx.wait(&admin, Duration::from_secs(10)));
        // The controller (the bell) dropped: wakes at once.
        drop(bell);
        let t = Instant::now();
        let _ = rx.wait(&admin, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
