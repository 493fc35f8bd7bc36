//! The kernel TLS module's one system call, `setsockopt(2)` with a byte buffer (the crate's
//! only `unsafe` outside the record layer's OpenSSL calls).

use std::os::fd::RawFd;

/// `setsockopt(fd, level, name, value, value.len())`.
pub(super) fn setsockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &[u8]) -> std::io::Result<()> {
    let len = libc::socklen_t::try_from(value.len()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `value` is a live slice of `len` bytes borrowed for the call; the kernel only
    // reads it during the call and keeps no pointer to it. `fd` is an open descriptor the
    // caller owns (a bad one is EBADF, not undefined behaviour).
    let r = unsafe { libc::setsockopt(fd, level, name, value.as_ptr().cast(), len) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
