//! Thread and file-descriptor helpers: CPU pinning, per-thread CPU time, socket options on
//! raw fds, and an eventfd wrapper. Thin, checked wrappers over libc.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Converts a libc `-1`-on-error return into `io::Result`.
fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc == -1 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} beyond CPU_SETSIZE")));
    }
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE` (checked above), so the bit index is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid, initialised cpu_set_t owned by this frame for the call;
    // pid 0 means the calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) })?;
    Ok(())
}

/// The CPUs the calling thread may run on (`sched_getaffinity`), ascending.
pub fn current_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t owned by this frame, written by the kernel for
    // at most its size; pid 0 means the calling thread.
    cvt(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) })?;
    // SAFETY: every index is below CPU_SETSIZE, inside `set`.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect())
}

/// Lets the calling thread run on any of `cpus` (`sched_setaffinity`); e.g. a helper
/// thread started by a pinned thread takes back the process's CPUs this way.
pub fn set_current_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} beyond CPU_SETSIZE")));
        }
        // SAFETY: `cpu < CPU_SETSIZE` (checked above), so the bit index is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid, initialised cpu_set_t owned by this frame for the call;
    // pid 0 means the calling thread. An empty set is refused by the kernel (EINVAL).
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) })?;
    Ok(())
}

/// Sets the calling thread's nice value (`setpriority(PRIO_PROCESS, 0, nice)`: on Linux
/// it applies to the calling thread only). Raising it needs no privilege.
pub fn set_current_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: plain system call on the calling thread; no memory is passed.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) })?;
    Ok(())
}

/// The calling thread's nice value (field 19 of `/proc/thread-self/stat`).
pub fn current_thread_nice() -> io::Result<i32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/thread-self/stat");
    // The command name (field 2) may hold spaces; the fields after it do not.
    let (_, fields) = stat.rsplit_once(") ").ok_or_else(bad)?;
    fields.split_whitespace().nth(16).and_then(|f| f.parse().ok()).ok_or_else(bad)
}

/// Moves the calling thread into the network namespace at `path` (`setns(2)` with
/// `CLONE_NEWNET`, e.g. `/run/netns/NAME` as `ip netns add` makes it). Only this thread
/// moves; threads it spawns afterwards start in the new namespace, and sockets it creates
/// belong to it for their whole life. Needs CAP_SYS_ADMIN (root). Failover tests use it
/// to put a target's ports and a host in namespaces of their own, joined by veth links.
pub fn enter_netns(path: &std::path::Path) -> io::Result<()> {
    let file = std::fs::File::open(path)?;
    // SAFETY: `file` is an open descriptor owned by this frame for the whole call;
    // setns only reads it, and CLONE_NEWNET makes the kernel check that it is a
    // network namespace (EINVAL otherwise).
    cvt(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Raises the soft limit on open file descriptors to at least `want` (up to
/// the hard limit, which a privileged process also raises). Returns the new
/// soft limit. Servers with thousands of connections need this; the default
/// soft limit is often 1,024.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    // SAFETY: `rlimit` is two integers; all-zero is valid and is overwritten below.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a valid out-pointer owned by this frame for the call.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) })?;
    if lim.rlim_cur >= want {
        return Ok(lim.rlim_cur);
    }
    let mut new = libc::rlimit { rlim_cur: want.min(lim.rlim_max), rlim_max: lim.rlim_max };
    if lim.rlim_max < want {
        // Only a privileged process may raise the hard limit; try, else settle for the hard limit.
        let try_hard = libc::rlimit { rlim_cur: want, rlim_max: want };
        // SAFETY: `try_hard` is a valid, initialised rlimit owned by this frame for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const try_hard) } == 0 {
            return Ok(want);
        }
        new.rlim_cur = lim.rlim_max;
    }
    // SAFETY: `new` is a valid, initialised rlimit owned by this frame for the call.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const new) })?;
    Ok(new.rlim_cur)
}

/// Number of CPUs currently online (`sysconf(_SC_NPROCESSORS_ONLN)`).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Bytes of physical memory (`sysconf(_SC_PHYS_PAGES)` times the page size), if known.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(pages).ok()?.checked_mul(u64::try_from(page).ok()?)
}

/// The first offset at or after `offset` where the file holds data (`lseek(SEEK_DATA)`),
/// or `None` when only a hole follows up to its end (`ENXIO`). File systems without hole
/// tracking report everything before the end as data. Moves the file's position, which
/// positioned reads and writes do not use.
pub fn seek_data(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off_t"))?;
    // SAFETY: `fd` is borrowed, so it is open for the call; lseek touches no memory of ours.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, libc::SEEK_DATA) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(e) };
    }
    Ok(u64::try_from(r).ok())
}

/// CPU time the calling thread has used, split by where it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Time in user space.
    pub user: Duration,
    /// Time in the kernel (system calls, including `io_uring_enter` and its task work).
    pub sys: Duration,
}

/// CPU time used by the calling thread (`getrusage(RUSAGE_THREAD)`).
pub fn thread_cpu_time() -> io::Result<CpuTime> {
    // SAFETY: `rusage` is plain integers; all-zero is valid and is overwritten below.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer owned by this frame for the call.
    cvt(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) })?;
    let duration = |tv: libc::timeval| {
        Duration::new(u64::try_from(tv.tv_sec).unwrap_or(0), u32::try_from(tv.tv_usec).unwrap_or(0) * 1000)
    };
    Ok(CpuTime { user: duration(usage.ru_utime), sys: duration(usage.ru_stime) })
}

/// CPU time the calling thread has run, to the nanosecond (`clock_gettime(
/// CLOCK_THREAD_CPUTIME_ID)`: the scheduler's own runtime count, where `getrusage` may be
/// sampled at the timer tick). For measuring short operations on a busy machine.
pub fn thread_cpu_clock() -> io::Result<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer owned by this frame for the call.
    cvt(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) })?;
    Ok(Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0)))
}

/// Sets or clears `O_NONBLOCK` on `fd`.
///
/// Sockets driven by the [`Ring`](crate::Ring) do not need it: the ring never blocks on an
/// fd (it arms an internal poll instead).
pub fn set_nonblocking(fd: RawFd, nonblocking: bool) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) reads the flags of `fd`; an invalid fd gives EBADF.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if nonblocking { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: as above, F_SETFL with an integer argument.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// Sets or clears `O_DIRECT` on an open file (`F_SETFL`): I/O then bypasses the page cache.
/// A file system that cannot do direct I/O refuses with `EINVAL`, as `open(O_DIRECT)` would.
pub fn set_direct_io(fd: RawFd, direct: bool) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFL) reads the flags of `fd`; an invalid fd gives EBADF.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if direct { flags | libc::O_DIRECT } else { flags & !libc::O_DIRECT };
    // SAFETY: as above, F_SETFL with an integer argument.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// Drops the page cache of `len` bytes at `offset` of the file open as `fd`
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; `len` 0 means to the end of the file), so the
/// next reads of that range go to the storage. Clean pages go at once; the kernel starts
/// writing back dirty ones and drops them only once clean. On tmpfs the pages are the
/// storage and stay. fio does this before each job (`invalidate=1`, its default).
pub fn fadvise_dontneed(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "offset or length beyond off_t");
    let offset = libc::off_t::try_from(offset).map_err(|_| too_big())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_big())?;
    // SAFETY: plain system call on `fd` (an invalid fd gives EBADF); no memory is passed.
    let rc = unsafe { libc::posix_fadvise(fd, offset, len, libc::POSIX_FADV_DONTNEED) };
    // posix_fadvise returns the error number itself, not -1 and errno.
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

/// A whole-file lock on an open file description (`F_OFD_SETLK`, Linux 3.15+): it belongs
/// to the open file, not to a process or thread, so a second `open` of the same file in the
/// same process conflicts like another process would, and the lock goes when the last fd
/// of that open file is closed (or the process dies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileLock {
    /// A read lock: others may hold read locks at the same time, nobody a write lock.
    Shared,
    /// A write lock: nobody else may hold any lock on the file.
    Exclusive,
}

/// Who holds a lock that conflicts with one asked for ([`file_lock_holder`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockHolder {
    /// A classic POSIX record lock of this process id.
    Process(u32),
    /// An open-file-description lock: it belongs to an open file, not a process, so the
    /// kernel gives no pid (it reports -1, in `/proc/locks` too); `/proc/PID/fdinfo/FD`
    /// lists such locks under the fd that holds them.
    OpenFile,
}

fn whole_file(lock: FileLock) -> libc::flock {
    let l_type = match lock {
        FileLock::Shared => libc::F_RDLCK,
        FileLock::Exclusive => libc::F_WRLCK,
    };
    // SAFETY: `flock` is plain integers; all-zero is a valid value: offset 0 and length 0
    // (the whole file, however long it grows) and l_pid 0, as F_OFD_* require.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::c_short::try_from(l_type).expect("lock types fit a short");
    fl.l_whence = libc::c_short::try_from(libc::SEEK_SET).expect("SEEK_SET fits a short");
    fl
}

/// Takes `lock` on the whole file open as `fd`, without waiting. A conflicting lock held
/// through another open file (this process's or another's) gives an error of kind
/// `WouldBlock`. The fd must be open for reading (shared) or for writing (exclusive).
pub fn try_lock_file(fd: RawFd, lock: FileLock) -> io::Result<()> {
    let fl = whole_file(lock);
    // SAFETY: `fl` is a valid flock owned by this frame, read by the kernel for the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &raw const fl) };
    match cvt(rc) {
        // POSIX allows either errno for "somebody else holds it".
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Err(io::Error::from(io::ErrorKind::WouldBlock)),
        r => r.map(drop),
    }
}

/// Who holds a lock on `fd`'s file that conflicts with `lock` (`F_OFD_GETLK`); `None` when
/// nobody does.
pub fn file_lock_holder(fd: RawFd, lock: FileLock) -> io::Result<Option<LockHolder>> {
    let mut fl = whole_file(lock);
    // SAFETY: `fl` is a valid flock owned by this frame, read and written by the kernel.
    cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &raw mut fl) })?;
    if i32::from(fl.l_type) == libc::F_UNLCK {
        return Ok(None);
    }
    Ok(Some(match u32::try_from(fl.l_pid) {
        Ok(pid) if pid > 0 => LockHolder::Process(pid),
        _ => LockHolder::OpenFile,
    }))
}

fn set_int_option(fd: RawFd, level: libc::c_int, name: libc::c_int, value: i32) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).expect("4 fits socklen_t");
    // SAFETY: `value` lives in this frame for the call and `len` is its size.
    cvt(unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), len) })?;
    Ok(())
}

fn get_int_option(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>()).expect("4 fits socklen_t");
    // SAFETY: `value` and `len` are out-pointers owned by this frame for the call.
    cvt(unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &raw mut len) })?;
    Ok(value)
}

/// Sets or clears `TCP_NODELAY` (NVMe/TCP sends whole PDUs; Nagle only adds latency).
pub fn set_nodelay(fd: RawFd, nodelay: bool) -> io::Result<()> {
    set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, i32::from(nodelay))
}

/// Sets `SO_LINGER` to on with a zero timeout: closing the socket then sends a RST and
/// drops whatever is still queued to send, instead of delivering it later. An NVMe/TCP
/// host wants this (Linux's `sock_no_linger` in `nvme_tcp_alloc_queue`): a command it has
/// failed over to another path must never reach the target afterwards through the
/// retransmissions of a queue it closed.
pub fn set_linger_zero(fd: RawFd) -> io::Result<()> {
    let value = libc::linger { l_onoff: 1, l_linger: 0 };
    let len = libc::socklen_t::try_from(size_of::<libc::linger>()).expect("linger fits socklen_t");
    // SAFETY: `value` lives in this frame for the call and `len` is its size.
    cvt(unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&raw const value).cast(), len) })?;
    Ok(())
}

/// Sleeps until one of `fds` is readable (or at end of file, or in error) or `timeout`
/// passes (rounded up to a millisecond); which of them are, as bits of the result (bit
/// `i` for `fds[i]`, at most 64). An interrupted sleep returns with no bit set. For
/// control-plane threads that wait on a socket and a wake-up at once (`poll(2)`), never
/// the I/O path.
pub fn wait_readable(fds: &[RawFd], timeout: std::time::Duration) -> io::Result<u64> {
    const MAX: usize = 64;
    if fds.len() > MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "more than 64 descriptors"));
    }
    let mut set = [libc::pollfd { fd: -1, events: 0, revents: 0 }; MAX];
    for (p, &fd) in set.iter_mut().zip(fds) {
        *p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    }
    let ms = i32::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
    let n = libc::nfds_t::try_from(fds.len()).expect("at most 64 descriptors");
    // SAFETY: `set` holds `n` initialised pollfd and lives for the whole call.
    let r = unsafe { libc::poll(set.as_mut_ptr(), n, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(set[..fds.len()].iter().enumerate().filter(|(_, p)| p.revents != 0).fold(0, |m, (i, _)| m | 1 << i))
}

/// Sets the socket's TCP congestion control (`TCP_CONGESTION`) by its kernel name: `reno`,
/// `cubic`, `bbr`, ... (`/proc/sys/net/ipv4/tcp_available_congestion_control`). An unknown
/// or unloaded name fails (`ENOENT`) and leaves the socket as it was. Sockets accepted on a
/// listening socket inherit its setting.
pub fn set_congestion_control(fd: RawFd, name: &str) -> io::Result<()> {
    let len = libc::socklen_t::try_from(name.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "congestion control name too long"))?;
    // SAFETY: `name` lives in this frame for the call and `len` is its length; the kernel
    // copies at most TCP_CA_NAME_MAX bytes and needs no terminating NUL.
    cvt(unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), len) })?;
    Ok(())
}

/// The socket's TCP congestion control, by its kernel name.
pub fn congestion_control(fd: RawFd) -> io::Result<String> {
    let mut name = [0u8; 32];
    let mut len = libc::socklen_t::try_from(name.len()).expect("32 fits socklen_t");
    // SAFETY: `name` and `len` are out-pointers owned by this frame; the kernel writes at
    // most `len` bytes.
    cvt(unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &raw mut len)
    })?;
    let n = usize::try_from(len).unwrap_or(0).min(name.len());
    let end = name[..n].iter().position(|&b| b == 0).unwrap_or(n);
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Sets `SO_SNDBUF` (the kernel doubles the value and applies its minimum).
pub fn set_send_buffer_size(fd: RawFd, bytes: usize) -> io::Result<()> {
    let value = i32::try_from(bytes).unwrap_or(i32::MAX);
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, value)
}

/// Sets `SO_RCVBUF` (the kernel doubles the value and applies its minimum).
pub fn set_recv_buffer_size(fd: RawFd, bytes: usize) -> io::Result<()> {
    let value = i32::try_from(bytes).unwrap_or(i32::MAX);
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, value)
}

/// Reads `SO_SNDBUF` as the kernel applied it.
pub fn send_buffer_size(fd: RawFd) -> io::Result<usize> {
    let value = get_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
    Ok(usize::try_from(value).unwrap_or(0))
}

/// The credentials of the process at the other end of a connected Unix socket, as the
/// kernel recorded them when that end connected or listened (`SO_PEERCRED`, unix(7)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id (in this process's pid namespace; 0 when the peer is in one this
    /// process cannot see).
    pub pid: u32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// Who is at the other end of the connected Unix socket `fd` (`SO_PEERCRED`). For a
/// client's socket that is the server that listens; for an accepted one, the client.
pub fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>()).expect("ucred fits socklen_t");
    // SAFETY: `cred` and `len` are out-pointers owned by this frame for the call; `len`
    // is `cred`'s size, so the kernel writes no more than that.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &raw mut len)
    })?;
    if usize::try_from(len).ok() != Some(size_of::<libc::ucred>()) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "SO_PEERCRED: short answer"));
    }
    Ok(PeerCredentials { pid: u32::try_from(cred.pid).unwrap_or(0), uid: cred.uid, gid: cred.gid })
}

/// An owned, non-blocking, close-on-exec eventfd: a counter another thread can bump to
/// make a poll on it fire.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates an eventfd with counter 0 (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let raw = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(EventFd { fd })
    }

    /// Adds `n` to the counter. A counter at its maximum (`EAGAIN`) already wakes any
    /// poller, so that case is reported as success.
    pub fn write(&self, n: u64) -> io::Result<()> {
        let bytes = n.to_ne_bytes();
        // SAFETY: writes 8 bytes from `bytes`, which lives in this frame for the call.
        let rc = unsafe { libc::write(self.fd.as_raw_fd(), bytes.as_ptr().cast(), 8) };
        if rc == 8 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::WouldBlock { Ok(()) } else { Err(error) }
    }

    /// Reads and resets the counter; `Ok(0)` if it was already zero.
    pub fn read(&self) -> io::Result<u64> {
        let mut bytes = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `bytes`, owned by this frame for the call.
        let rc = unsafe { libc::read(self.fd.as_raw_fd(), bytes.as_mut_ptr().cast(), 8) };
        if rc == 8 {
            return Ok(u64::from_ne_bytes(bytes));
        }
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(error) }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `fallocate(fd, mode, offset, len)`, synchronously (`mode` as in `fallocate(2)`:
/// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_ZERO_RANGE`, ...). For start-up
/// probes and synchronous executors; the I/O path queues [`Ring::fallocate`](crate::Ring::fallocate).
pub fn fallocate(fd: RawFd, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "fallocate offset or length beyond i64");
    let offset = libc::off64_t::try_from(offset).map_err(|_| too_big())?;
    let len = libc::off64_t::try_from(len).map_err(|_| too_big())?;
    // SAFETY: plain system call on `fd`; no memory is passed. An invalid fd gives EBADF.
    cvt(unsafe { libc::fallocate64(fd, mode, offset, len) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn ofd_locks_conflict_between_open_files_of_one_process() {
        let path = std::env::temp_dir().join(format!("uring-ofd-{}", std::process::id()));
        let open = || std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path);
        let (a, b) = (open().unwrap(), open().unwrap());
        try_lock_file(a.as_raw_fd(), FileLock::Exclusive).unwrap();
        let e = try_lock_file(b.as_raw_fd(), FileLock::Shared).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "a second open file conflicts: {e}");
        assert_eq!(file_lock_holder(b.as_raw_fd(), FileLock::Shared).unwrap(), Some(LockHolder::OpenFile));
        drop(a);
        assert_eq!(file_lock_holder(b.as_raw_fd(), FileLock::Exclusive).unwrap(), None, "closing releases it");
        try_lock_file(b.as_raw_fd(), FileLock::Shared).unwrap();
        let c = open().unwrap();
        try_lock_file(c.as_raw_fd(), FileLock::Shared).unwrap();
        assert!(try_lock_file(c.as_raw_fd(), FileLock::Exclusive).is_err(), "b's read lock stays");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn seek_data_finds_written_blocks_and_not_holes() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        let path = std::env::temp_dir().join(format!("qpath-seek-data-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_all_at(b"data", 5 << 20).unwrap();
        let first = seek_data(f.as_fd(), 0).unwrap();
        let after = seek_data(f.as_fd(), 6 << 20).unwrap();
        std::fs::remove_file(&path).unwrap();
        // A file system that tracks holes finds the block at 5 MiB; one that does not
        // reports data right away. Past the last data there is none on either.
        assert!(first.is_some_and(|o| o == 0 || (o <= 5 << 20 && o > 4 << 20)), "{first:?}");
        assert!(after.is_none() || after == Some(6 << 20), "{after:?}");
        assert!(physical_memory().is_some_and(|m| m > 0));
    }

    #[test]
    fn fadvise_dontneed_checks_its_arguments() {
        let path = std::env::temp_dir().join(format!("uring-fadvise-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        fadvise_dontneed(f.as_raw_fd(), 0, 0).expect("the whole file");
        fadvise_dontneed(f.as_raw_fd(), 4096, 4096).expect("a range");
        assert!(fadvise_dontneed(f.as_raw_fd(), u64::MAX, 1).is_err(), "beyond off_t");
        assert!(fadvise_dontneed(-1, 0, 0).is_err(), "EBADF");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn eventfd_counts_and_resets() {
        let efd = EventFd::new().expect("eventfd");
        assert_eq!(efd.read().expect("read"), 0);
        efd.write(2).expect("write");
        efd.write(3).expect("write");
        assert_eq!(efd.read().expect("read"), 5);
        assert_eq!(efd.read().expect("read"), 0);
    }

    #[test]
    fn pin_and_cpu_time() {
        assert!(online_cpus() >= 1);
        pin_current_thread(0).expect("pin to cpu 0");
        assert!(pin_current_thread(1 << 20).is_err());
        let start = thread_cpu_time().expect("rusage");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        let end = thread_cpu_time().expect("rusage");
        assert!(end.user + end.sys >= start.user + start.sys);
    }

    #[test]
    fn affinity_round_trip() {
        let all = current_affinity().expect("getaffinity");
        assert!(!all.is_empty() && all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
        std::thread::spawn(move || {
            pin_current_thread(all[0]).expect("pin");
            assert_eq!(current_affinity().expect("getaffinity"), vec![all[0]]);
            set_current_affinity(&all).expect("widen again");
            assert_eq!(current_affinity().expect("getaffinity"), all);
            assert!(set_current_affinity(&[]).is_err(), "an empty set is refused");
            assert!(set_current_affinity(&[1 << 20]).is_err());
        })
        .join()
        .expect("affinity thread");
    }

    #[test]
    fn nice_applies_to_the_calling_thread_only() {
        let nice = || current_thread_nice().expect("nice");
        let before = nice();
        std::thread::spawn(move || {
            set_current_thread_nice(before + 5).expect("setpriority");
            assert_eq!(nice(), before + 5);
        })
        .join()
        .expect("nice thread");
        assert_eq!(nice(), before, "the spawning thread keeps its own");
    }

    #[test]
    fn socket_options_apply() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let stream = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let fd = stream.as_raw_fd();
        set_nodelay(fd, true).expect("nodelay");
        assert!(stream.nodelay().expect("get nodelay"));
        set_send_buffer_size(fd, 4096).expect("sndbuf");
        assert!(send_buffer_size(fd).expect("get sndbuf") < 64 * 1024);
        set_recv_buffer_size(fd, 4096).expect("rcvbuf");
        set_linger_zero(fd).expect("linger");
        let mut lg = libc::linger { l_onoff: 0, l_linger: 7 };
        let mut len = libc::socklen_t::try_from(size_of::<libc::linger>()).unwrap();
        // SAFETY: `lg` and `len` are out-pointers owned by this frame for the call.
        let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&raw mut lg).cast(), &raw mut len) };
        assert_eq!((rc, lg.l_onoff, lg.l_linger), (0, 1, 0), "linger on, zero timeout");
        set_nonblocking(fd, true).expect("nonblocking");
        set_nonblocking(fd, false).expect("blocking");
        assert!(set_nodelay(-1, true).is_err());
    }

    #[test]
    fn peer_credentials_name_the_other_end() {
        use std::os::fd::AsFd;
        use std::os::unix::net::UnixStream;
        let (a, b) = UnixStream::pair().expect("socketpair");
        let me = peer_credentials(a.as_fd()).expect("SO_PEERCRED");
        assert_eq!(me.pid, std::process::id(), "both ends are this process");
        // This process's own ids, as /proc says them ("Uid:\treal\teffective...").
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let id = |key: &str| -> u32 {
            let line = status.lines().find(|l| l.starts_with(key)).expect("a Uid/Gid line");
            line.split_whitespace().nth(2).expect("effective id").parse().expect("a number")
        };
        assert_eq!((me.uid, me.gid), (id("Uid:"), id("Gid:")));
        assert_eq!(peer_credentials(b.as_fd()).expect("SO_PEERCRED"), me);
        // Not a Unix socket: the kernel says so.
        let file = std::fs::File::open("/proc/self/status").expect("open");
        assert!(peer_credentials(file.as_fd()).is_err(), "a file has no peer");
    }

    #[test]
    fn enter_netns_checks_the_file() {
        std::thread::spawn(|| {
            assert!(enter_netns(std::path::Path::new("/dev/null")).is_err(), "not a namespace file");
            assert!(enter_netns(std::path::Path::new("/nonexistent/netns")).is_err());
            // The thread's own namespace: allowed with CAP_SYS_ADMIN, EPERM without.
            match enter_netns(std::path::Path::new("/proc/self/ns/net")) {
                Ok(()) => {}
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}"),
            }
        })
        .join()
        .expect("netns thread");
    }
}
