//! Work too heavy for a reactor turn, done on helper threads: the Diffie-Hellman steps
//! of in-band authentication ([`crate::auth::DhWork`]).
//!
//! A DH step is one modular exponentiation: 0.6 ms for ffdhe2048, 16 ms for ffdhe8192
//! here, two per queue a host connects (and again at each re-authentication). Done on the
//! reactor it would stop every other queue of that reactor for that long, the starvation
//! seed 002's fairness work is about. So the connection hands the step to these workers
//! and the reactor goes on; the result comes back through the reactor's mailbox, the
//! same way new connections arrive, and the waiting Authentication Send is answered then.
//! This is once per transaction step, never per I/O: the cross-thread hop (~27 µs here)
//! is nothing next to the work.
//!
//! ```text
//!   reactor: exec_auth ─ Offload::submit(work, token) ─► channel ─► qpath-auth-N: work.run()
//!   reactor: mailbox ◄──────────────── reply(token, done) ─────────────┘
//!            └─ conn.on_auth_computed(slot, done) ─► response
//! ```
//!
//! The workers start on the first job (a target without DH groups never has them): at
//! most one per CPU the target was started on, up to `auth_workers` ([`MAX_WORKERS`] by
//! default; 0 keeps the steps on the reactor, the behaviour before), at nice
//! [`WORKER_NICE`] (the data path first when cores are scarce), on the CPUs of the thread
//! that made the target (reactors may be pinned; their helpers are not). They exit when
//! the target is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use crate::auth::{DhDone, DhWork};

/// Default most worker threads (`auth_workers`).
pub const MAX_WORKERS: usize = 4;

/// The workers' nice value. When every core is busy (busy-polling reactors and hosts)
/// a worker's 16 ms step must take its CPU from one of them, in scheduler slices of
/// milliseconds; at nice 10 (a tenth of a normal thread's weight) the data path keeps
/// most of it and a connect takes longer instead. `qpath lab auth-stall`, block-waiting
/// host (BENCHMARKS.md): reads over 1 ms 107 at nice 0, 33 at nice 10 (34 with the steps
/// on the reactor, whose slowest read is 16-24 ms against 5 ms here).
pub const WORKER_NICE: i32 = 10;

/// Where a connection's driver sends DH work (the reactor; tests and the fuzzer drive
/// connections without one, and the work runs inline).
pub trait Offload {
    /// Starts `work` for the request behind `token`; hands `work` back if it cannot
    /// (the caller runs it inline then).
    fn submit(&self, work: DhWork, token: u64) -> Result<(), DhWork>;
}

/// Hands a finished job back to whoever submitted it.
pub type Reply = Box<dyn FnOnce(u64, DhDone) + Send>;

struct Job {
    work: DhWork,
    token: u64,
    reply: Reply,
}

/// The target's DH workers.
pub struct AuthWorkers {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    /// The CPUs the workers may run on: the creating thread's.
    cpus: Vec<usize>,
    workers: usize,
    submitted: AtomicU64,
    computed: Arc<AtomicU64>,
}

impl std::fmt::Debug for AuthWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthWorkers")
            .field("workers", &self.workers)
            .field("submitted", &self.submitted())
            .field("computed", &self.computed())
            .finish_non_exhaustive()
    }
}

impl AuthWorkers {
    /// At most `max` workers (0: none, [`AuthWorkers::submit`] hands every job back),
    /// that will run on the calling thread's CPUs; none start yet.
    pub fn new(max: usize) -> AuthWorkers {
        let cpus = uring::current_affinity().unwrap_or_default();
        let workers = cpus.len().max(1).min(max);
        AuthWorkers {
            tx: Mutex::new(None),
            cpus,
            workers,
            submitted: AtomicU64::new(0),
            computed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Jobs handed to the workers so far.
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }

    /// Jobs the workers finished so far.
    pub fn computed(&self) -> u64 {
        self.computed.load(Ordering::Relaxed)
    }

    /// Queues `work`; `reply` gets its result on a worker thread. Hands `work` back if
    /// there are no workers or none can be started.
    pub fn submit(&self, work: DhWork, token: u64, reply: Reply) -> Result<(), DhWork> {
        if self.workers == 0 {
            return Err(work);
        }
        let mut tx = self.tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tx.is_none() {
            *tx = self.start();
        }
        let Some(sender) = tx.as_ref() else { return Err(work) };
        match sender.send(Job { work, token, reply }) {
            Ok(()) => {
                self.submitted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(mpsc::SendError(job)) => {
                // Every worker is gone (only if they panicked): start afresh next time.
                *tx = None;
                Err(job.work)
            }
        }
    }

    fn start(&self) -> Option<mpsc::Sender<Job>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..self.workers {
            let (rx, cpus, computed) = (Arc::clone(&rx), self.cpus.clone(), Arc::clone(&self.computed));
            let spawned = std::thread::Builder::new().name(format!("qpath-auth-{i}")).spawn(move || {
                if !cpus.is_empty()
                    && let Err(e) = uring::set_current_affinity(&cpus)
                {
                    tracing::warn!("authentication worker keeps its creator's CPUs: {e}");
                }
                if let Err(e) = uring::set_current_thread_nice(WORKER_NICE) {
                    tracing::warn!("authentication worker keeps its creator's priority: {e}");
                }
                loop {
                    // The lock is held only while waiting for the next job.
                    let job = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
                    let Ok(job) = job else { return };
                    let done = job.work.run();
                    computed.fetch_add(1, Ordering::Relaxed);
                    (job.reply)(job.token, done);
                }
            });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("cannot start authentication worker {i}: {e}"),
            }
        }
        (started > 0).then_some(tx)
    }
}

impl Default for AuthWorkers {
    fn default() -> Self {
        AuthWorkers::new(MAX_WORKERS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::auth::DhGroup;

    #[test]
    fn work_runs_on_a_worker_and_comes_back_with_its_token() {
        let w = AuthWorkers::default();
        assert_eq!(w.submitted(), 0);
        let (tx, rx) = mpsc::channel();
        for token in [7u64, 8] {
            let tx = tx.clone();
            let reply: Reply = Box::new(move |t, done| {
                let name = std::thread::current().name().map(str::to_string);
                let _ = tx.send((t, done, name, thread_nice()));
            });
            assert!(w.submit(DhWork::Generate(DhGroup::Ffdhe2048), token, reply).is_ok());
        }
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let (t, done, name, nice) = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a result");
            assert_eq!(nice, Some(i64::from(WORKER_NICE)), "the data path first");
            assert!(matches!(done, DhDone::Generated(Ok(Some(ref p))) if p.public().len() == 256), "{done:?}");
            assert!(name.as_deref().is_some_and(|n| n.starts_with("qpath-auth-")), "{name:?}");
            tokens.push(t);
        }
        tokens.sort_unstable();
        assert_eq!(tokens, [7, 8]);
        assert_eq!((w.submitted(), w.computed()), (2, 2));
    }

    /// The calling thread's nice value (field 19 of /proc/thread-self/stat).
    fn thread_nice() -> Option<i64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        stat.rsplit_once(") ")?.1.split_whitespace().nth(16)?.parse().ok()
    }

    #[test]
    fn zero_workers_hand_the_work_back() {
        let w = AuthWorkers::new(0);
        let back = w.submit(DhWork::Generate(DhGroup::Ffdhe2048), 1, Box::new(|_, _| {}));
        assert!(matches!(back, Err(DhWork::Generate(DhGroup::Ffdhe2048))));
        assert_eq!(w.submitted(), 0);
    }
}
