//! systemd's service notification protocol (sd_notify(3)), for `qpath target` and `qpath
//! host` run as `Type=notify` services: one datagram of newline-separated `KEY=VALUE` lines to the Unix
//! socket systemd names in `$NOTIFY_SOCKET` (a path, or an abstract name written with a
//! leading `@`). Without that variable (not under systemd) every call does nothing.
//!
//! systemd reads only one of `READY=1`, `RELOADING=1` and `STOPPING=1` per datagram (the
//! first of them in that order), so each goes in a datagram of its own; `STATUS=` rides
//! along with any. The variable is left set: nothing the target starts is confused by it.
//! A message that cannot be sent is logged once and the target goes on: systemd then
//! says why the service did not start (its start timeout), and the log says what failed.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};

/// The longest `STATUS=` text sent; longer ones are cut (systemd shows it on one line of
/// `systemctl status`).
const STATUS_LEN_MAX: usize = 512;

/// Where systemd listens for this service's notifications.
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// A send already failed and was logged.
    failed: AtomicBool,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names, `None` when it is unset or empty. A value that
    /// is neither a path nor an `@` name (systemd 253's `vsock:`) is logged and ignored.
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let name = name.to_string_lossy();
        match Notifier::new(&name) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("NOTIFY_SOCKET={name}: {e}; systemd will not hear that the target is ready");
                None
            }
        }
    }

    /// The notifier of a `$NOTIFY_SOCKET` value: `/path` or `@abstract-name`.
    pub fn new(name: &str) -> std::io::Result<Option<Notifier>> {
        let addr = if name.is_empty() {
            return Ok(None);
        } else if let Some(abstract_name) = name.strip_prefix('@') {
            SocketAddr::from_abstract_name(abstract_name.as_bytes())?
        } else if name.starts_with('/') {
            SocketAddr::from_pathname(name)?
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "only a socket path or an @abstract name is understood",
            ));
        };
        Ok(Some(Notifier { sock: UnixDatagram::unbound()?, addr, failed: AtomicBool::new(false) }))
    }

    /// Sends `state` (lines of `KEY=VALUE`) as one datagram.
    pub fn notify(&self, state: &str) {
        if let Err(e) = self.sock.send_to_addr(state.as_bytes(), &self.addr)
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            tracing::warn!("cannot notify systemd ({:?}): {e}", self.addr);
        }
    }
}

/// `STATUS=text` with the text cut to [`STATUS_LEN_MAX`] bytes (at a character boundary)
/// and kept on one line.
pub fn status(text: &str) -> String {
    let mut end = text.len().min(STATUS_LEN_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("STATUS={}", text[..end].replace('\n', " "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn receive(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1024];
        let n = sock.recv(&mut buf).expect("a notification within 5 s");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn a_path_socket_receives_each_message_as_one_datagram() {
        let dir = std::env::temp_dir().join(format!("qpath-sd-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap()).unwrap().expect("a notifier");
        n.notify("READY=1\nSTATUS=serving");
        n.notify("STOPPING=1");
        assert_eq!(receive(&listener), "READY=1\nSTATUS=serving");
        assert_eq!(receive(&listener), "STOPPING=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        let name = format!("qpath-sd-notify-test-{}", std::process::id());
        let listener = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        let n = Notifier::new(&format!("@{name}")).unwrap().expect("a notifier");
        n.notify("RELOADING=1");
        assert_eq!(receive(&listener), "RELOADING=1");
    }

    #[test]
    fn no_socket_no_notifier_and_unknown_kinds_are_refused() {
        assert!(Notifier::new("").unwrap().is_none());
        let e = Notifier::new("vsock:2:1234").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
    }

    #[test]
    fn a_dead_socket_does_not_stop_the_caller() {
        let n = Notifier::new("/nonexistent-qpath-dir/notify.sock").unwrap().expect("a notifier");
        n.notify("READY=1");
        n.notify("READY=1");
        assert!(n.failed.load(Ordering::Relaxed));
    }

    #[test]
    fn status_is_one_bounded_line() {
        assert_eq!(status("serving 1 subsystem"), "STATUS=serving 1 subsystem");
        assert_eq!(status("a\nb"), "STATUS=a b");
        let long = "é".repeat(400);
        let s = status(&long);
        assert!(s.len() <= "STATUS=".len() + STATUS_LEN_MAX, "{}", s.len());
        assert!(s.ends_with('é'));
    }
}
