//! Where the threads that are not on the I/O path run: off the CPUs that a spinning
//! thread owns.
//!
//! A thread that busy-polls (a `--poll busy` or adaptive reactor, a pinned bench job
//! thread) owns its CPU. Any other thread of the process that wakes there (an admin
//! thread's keep-alive turn, an acceptor, the RPC or metrics server, an authentication
//! worker, the main thread's signal poll) takes the CPU from it, and when the scheduler
//! lets it run a whole tick (4 ms at HZ=250) every I/O of that reactor waits that long:
//! a latency percentile of exactly one tick. SPDK avoids it by keeping everything else
//! off its reactor cores; this module does the same inside one process.
//!
//! Spinning threads [`claim`] their CPU (the claim ends when the guard drops); helper
//! threads call [`Helper::place`] when they start and [`Helper::refresh`] on their
//! periodic turns (one atomic load when nothing changed), which moves them to
//! [`helper_cpus`] of the process's CPUs.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// What kind of spinning thread owns a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spinner {
    /// A target reactor that polls (busy, or adaptive under load): every I/O of its
    /// connections waits while it is off its CPU.
    Reactor,
    /// A pinned job thread: only its own I/O waits while it is off its CPU.
    Job,
}

/// Claims per CPU: `(reactors, jobs)`.
static CLAIMS: Mutex<BTreeMap<usize, (u32, u32)>> = Mutex::new(BTreeMap::new());
/// Bumped at every claim and release, so helpers re-place themselves only then.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// The CPUs the process may run on, read once from its main thread.
static BASE: OnceLock<Vec<usize>> = OnceLock::new();

/// A CPU owned by a spinning thread until this drops.
#[derive(Debug)]
#[must_use = "the claim ends when the guard drops"]
pub struct Claim {
    cpu: usize,
    kind: Spinner,
}

/// Records that a thread of kind `kind` spins on `cpu`; helper threads keep off it
/// (see [`helper_cpus`]) until the returned guard drops.
pub fn claim(cpu: usize, kind: Spinner) -> Claim {
    base();
    let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    let e = claims.entry(cpu).or_default();
    match kind {
        Spinner::Reactor => e.0 += 1,
        Spinner::Job => e.1 += 1,
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Claim { cpu, kind }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = claims.get_mut(&self.cpu) {
            match self.kind {
                Spinner::Reactor => e.0 = e.0.saturating_sub(1),
                Spinner::Job => e.1 = e.1.saturating_sub(1),
            }
            if *e == (0, 0) {
                claims.remove(&self.cpu);
            }
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The CPUs claimed now: `(reactor CPUs, job CPUs)`, ascending.
pub fn claimed() -> (Vec<usize>, Vec<usize>) {
    let claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    let reactors = claims.iter().filter(|(_, c)| c.0 > 0).map(|(&cpu, _)| cpu).collect();
    let jobs = claims.iter().filter(|(_, c)| c.1 > 0).map(|(&cpu, _)| cpu).collect();
    (reactors, jobs)
}

/// Where a helper thread should run, of `base` (the process's CPUs): the CPUs no
/// spinning thread owns; when every one is owned, the job threads' CPUs (a tick taken
/// from a job delays that job's submissions, a tick taken from a reactor delays every
/// I/O it serves); when reactors own them all, `base` (nothing is better).
pub fn helper_cpus(base: &[usize], reactors: &[usize], jobs: &[usize]) -> Vec<usize> {
    let free: Vec<usize> = base.iter().copied().filter(|c| !reactors.contains(c) && !jobs.contains(c)).collect();
    if !free.is_empty() {
        return free;
    }
    let shared: Vec<usize> = base.iter().copied().filter(|c| !reactors.contains(c)).collect();
    if !shared.is_empty() {
        return shared;
    }
    base.to_vec()
}

/// The process's CPUs: its main thread's affinity when first asked (before any helper
/// was moved), all online CPUs if that cannot be read.
fn base() -> &'static [usize] {
    BASE.get_or_init(|| {
        // The main thread's id is the process id; its affinity is what the process was
        // started with (taskset, cgroup cpuset), since placement moves it only later.
        process_affinity().unwrap_or_else(|_| (0..crate::online_cpus()).collect())
    })
}

fn process_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t owned by this frame, written by the kernel for at
    // most its size; the pid names this process's main thread.
    let rc = unsafe { libc::sched_getaffinity(libc::getpid(), size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index is below CPU_SETSIZE, inside `set`.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect())
}

/// The CPUs a helper thread of this process should run on now.
pub fn current_helper_cpus() -> Vec<usize> {
    let (reactors, jobs) = claimed();
    helper_cpus(base(), &reactors, &jobs)
}

/// A helper thread's placement: call [`Helper::place`] when it starts and
/// [`Helper::refresh`] on its periodic turns.
#[derive(Debug, Default)]
pub struct Helper {
    /// The claims' generation it was last placed for (0: never).
    generation: u64,
}

impl Helper {
    /// Moves the calling thread to [`current_helper_cpus`].
    pub fn place(&mut self) -> io::Result<()> {
        self.generation = GENERATION.load(Ordering::Acquire);
        crate::set_current_affinity(&current_helper_cpus())
    }

    /// [`Helper::place`] if a claim came or went since the last placement; one atomic
    /// load otherwise. A failure is logged by the caller's choice: placement is a
    /// latency matter, never a reason to stop.
    pub fn refresh(&mut self) -> io::Result<()> {
        if GENERATION.load(Ordering::Acquire) == self.generation { Ok(()) } else { self.place() }
    }
}

/// Places the calling helper thread once (see [`Helper`]).
pub fn place_helper() -> io::Result<()> {
    Helper::default().place()
}

/// Whether a spinning thread's CPU is owned by another spinning thread too (two job
/// threads pinned to one CPU): then neither should spin through its time slice while the
/// other has completions waiting, or each waits a whole scheduler tick for its turn.
#[derive(Debug)]
pub struct Neighbours {
    cpu: Option<usize>,
    /// The claims' generation `shared` was computed for (0: never).
    generation: u64,
    shared: bool,
}

impl Neighbours {
    /// For a thread pinned to `cpu` (`None`: not pinned, never shared).
    pub fn new(cpu: Option<usize>) -> Neighbours {
        Neighbours { cpu, generation: 0, shared: false }
    }

    /// For the calling thread: its CPU if it may run on exactly one.
    pub fn current() -> Neighbours {
        Neighbours::new(crate::current_affinity().ok().filter(|c| c.len() == 1).map(|c| c[0]))
    }

    /// Whether more than one spinning thread owns the CPU: one atomic load unless a
    /// claim came or went since the last call.
    pub fn shared(&mut self) -> bool {
        let Some(cpu) = self.cpu else { return false };
        let g = GENERATION.load(Ordering::Acquire);
        if g != self.generation {
            self.generation = g;
            let claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
            self.shared = claims.get(&cpu).is_some_and(|&(r, j)| r + j > 1);
        }
        self.shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_keep_off_spinning_cpus_when_any_cpu_is_left() {
        assert_eq!(helper_cpus(&[0, 1, 2, 3], &[0], &[1]), vec![2, 3]);
        assert_eq!(helper_cpus(&[0, 1, 2, 3], &[], &[]), vec![0, 1, 2, 3]);
        assert_eq!(helper_cpus(&[1, 3], &[0], &[2]), vec![1, 3], "claims outside the process's CPUs do not matter");
    }

    #[test]
    fn with_no_free_cpu_helpers_share_a_job_cpu_not_a_reactor_cpu() {
        // The 2-CPU case: the reactor on CPU 0, the job thread on CPU 1.
        assert_eq!(helper_cpus(&[0, 1], &[0], &[1]), vec![1]);
        assert_eq!(helper_cpus(&[0, 1], &[0, 1], &[1]), vec![0, 1], "reactors everywhere: nothing is better");
        assert_eq!(helper_cpus(&[0], &[], &[0]), vec![0]);
    }

    #[test]
    fn two_spinners_on_one_cpu_are_neighbours() {
        // A CPU number no test pins to: claims are only bookkeeping.
        let cpu = 1000;
        let mut n = Neighbours::new(Some(cpu));
        let a = claim(cpu, Spinner::Job);
        assert!(!n.shared(), "one job alone on its CPU");
        let b = claim(cpu, Spinner::Job);
        assert!(n.shared(), "two jobs on one CPU");
        drop(a);
        assert!(!n.shared(), "one left");
        drop(b);
        assert!(!Neighbours::new(None).shared(), "an unpinned thread has no neighbours");
    }

    #[test]
    fn a_helper_moves_off_a_claimed_cpu_and_back_when_the_claim_ends() {
        let base = base().to_vec();
        if base.len() < 2 {
            println!("SKIP: needs two CPUs, the process has {base:?}");
            return;
        }
        let cpu = base[0];
        std::thread::spawn(move || {
            let mut helper = Helper::default();
            helper.place().expect("place");
            let claim = claim(cpu, Spinner::Reactor);
            helper.refresh().expect("refresh");
            let now = crate::current_affinity().expect("getaffinity");
            assert!(!now.contains(&cpu), "helper still allowed on the reactor's CPU {cpu}: {now:?}");
            drop(claim);
            helper.refresh().expect("refresh");
            let now = crate::current_affinity().expect("getaffinity");
            assert!(now.contains(&cpu), "helper not given back CPU {cpu} after the claim ended: {now:?}");
        })
        .join()
        .expect("helper thread");
    }
}
