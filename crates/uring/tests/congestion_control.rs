//! `TCP_CONGESTION` on a socket: set by name, read back, inherited by accepted sockets,
//! and an unknown name refused without changing the socket.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

#[test]
fn set_read_back_inherit_and_refuse() {
    // reno is built into every kernel with TCP and is not a distribution's default
    // (cubic, or bbr here), so reading it back shows the setting took.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    uring::set_congestion_control(listener.as_raw_fd(), "reno").unwrap();
    assert_eq!(uring::congestion_control(listener.as_raw_fd()).unwrap(), "reno");
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (accepted, _) = listener.accept().unwrap();
    assert_eq!(uring::congestion_control(accepted.as_raw_fd()).unwrap(), "reno", "accepted socket inherits");

    let before = uring::congestion_control(client.as_raw_fd()).unwrap();
    assert!(uring::set_congestion_control(client.as_raw_fd(), "no-such-cc").is_err());
    assert_eq!(uring::congestion_control(client.as_raw_fd()).unwrap(), before);
    uring::set_congestion_control(client.as_raw_fd(), "reno").unwrap();
    assert_eq!(uring::congestion_control(client.as_raw_fd()).unwrap(), "reno");
}
