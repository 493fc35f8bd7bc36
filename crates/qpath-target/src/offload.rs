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
//!   reactor: exec_auth ─ Offload::submit(work, token, host) ─► turns by host ─► qpath-auth-N: work.run()
//!   reactor: mailbox ◄──────────────── reply(token, done) ─────────────┘
//!            └─ conn.on_auth_computed(slot, done) ─► response
//! ```
//!
//! The workers start on the first job (a target without DH groups never has them): at
//! most one per CPU the target was started on, up to `auth_workers` ([`MAX_WORKERS`] by
//! default; 0 keeps the steps on the reactor, the behaviour before), at nice
//! [`WORKER_NICE`] (the data path first when cores are scarce), on the CPUs of the thread
//! that made the target (reactors may be pinned; their helpers are not). They exit when
//! the target is dropped. Queued steps are taken one host NQN at a time in turn, so a
//! host with hundreds of queues authenticating at once delays another host's connect by
//! at most one step of its own (see `Turns`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

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
    /// Starts `work` for the request behind `token`, a step of host NQN `host`'s
    /// transaction that `waiter` may abandon; hands `work` back if it cannot (the caller
    /// runs it inline then).
    fn submit(&self, work: DhWork, token: u64, host: &str, waiter: &Waiter) -> Result<(), DhWork>;
}

/// Whether a connection still waits for its steps. One that closes abandons them, and
/// a step not started by then is skipped: a host that sends a Negotiate and hangs up
/// costs the workers nothing once it has gone (without this, `qpath lab auth-flood`'s
/// flood left the workers minutes of steps for connections long closed).
#[derive(Debug, Clone, Default)]
pub struct Waiter(Arc<AtomicBool>);

impl Waiter {
    /// Nobody waits any more.
    pub fn abandon(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Waiter::abandon`] was called.
    pub fn abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Hands a finished job back to whoever submitted it.
pub type Reply = Box<dyn FnOnce(u64, DhDone) + Send>;

struct Job {
    work: DhWork,
    token: u64,
    waiter: Waiter,
    reply: Reply,
}

/// Queued jobs, taken one host at a time in turn.
///
/// Each queue has at most one step waiting, so the queue is as long as the queues
/// authenticating at once; one host can make that hundreds (many controllers
/// reconnecting together after a path flap, or a host restarting Negotiate on many
/// connections, which costs it nothing and the target a step each). Taken in arrival
/// order, every other host's connect would wait behind all of them (256 ffdhe8192 steps
/// are 4 s of both cores here). Taken by host in turn, another host waits for at most one
/// step of each host with work queued; the host NQN is the one the queue's Connect named
/// (the secret that proves it is checked in this very transaction, so a host claiming
/// another's NQN shares that one's turn, as with any per-host limit before the proof).
struct Turns<T> {
    /// Queued jobs by host NQN; a host with none has no entry.
    by_host: HashMap<Box<str>, VecDeque<T>>,
    /// The hosts with queued jobs, the next one to serve first.
    order: VecDeque<Box<str>>,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Turns { by_host: HashMap::new(), order: VecDeque::new() }
    }
}

impl<T> Turns<T> {
    /// Queues `job` behind `host`'s others; a host with nothing queued takes the last turn.
    fn push(&mut self, host: &str, job: T) {
        if let Some(q) = self.by_host.get_mut(host) {
            q.push_back(job);
            return;
        }
        self.by_host.insert(host.into(), VecDeque::from([job]));
        self.order.push_back(host.into());
    }

    /// The oldest job of the host whose turn it is; the host goes to the back of the turns
    /// while it has more.
    fn pop(&mut self) -> Option<T> {
        while let Some(host) = self.order.pop_front() {
            let Some(q) = self.by_host.get_mut(&host) else { continue };
            let job = q.pop_front();
            if q.is_empty() {
                self.by_host.remove(&host);
            } else {
                self.order.push_back(host);
            }
            if job.is_some() {
                return job;
            }
        }
        None
    }

    fn hosts(&self) -> usize {
        self.by_host.len()
    }
}

#[derive(Default)]
struct Queue {
    turns: Turns<Job>,
    /// Set when the target is dropped: the workers exit.
    stop: bool,
}

/// What the workers and the target share.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Workers running; 0 before the first job (and if every one has died).
    alive: AtomicUsize,
    computed: AtomicU64,
    abandoned: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker: takes jobs in turn until the target is dropped.
    fn work(&self) {
        loop {
            let job = {
                let mut q = self.lock();
                loop {
                    if q.stop {
                        return;
                    }
                    if let Some(job) = q.turns.pop() {
                        break job;
                    }
                    q = self.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            if job.waiter.abandoned() {
                // The connection closed while the step waited: nobody reads the result.
                self.abandoned.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let done = job.work.run();
            self.computed.fetch_add(1, Ordering::Relaxed);
            (job.reply)(job.token, done);
        }
    }
}

/// Counts a worker out however it ends (a panicking step included), so the next job
/// starts new ones instead of waiting for none.
struct Alive<'a>(&'a AtomicUsize);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The target's DH workers.
pub struct AuthWorkers {
    shared: Arc<Shared>,
    /// The CPUs the workers may run on: the creating thread's.
    cpus: Vec<usize>,
    workers: usize,
    submitted: AtomicU64,
}

impl std::fmt::Debug for AuthWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthWorkers")
            .field("workers", &self.workers)
            .field("submitted", &self.submitted())
            .field("computed", &self.computed())
            .field("abandoned", &self.abandoned())
            .finish_non_exhaustive()
    }
}

impl AuthWorkers {
    /// At most `max` workers (0: none, [`AuthWorkers::submit`] hands every job back),
    /// that will run on the calling thread's CPUs; none start yet.
    pub fn new(max: usize) -> AuthWorkers {
        let cpus = uring::current_affinity().unwrap_or_default();
        let workers = cpus.len().max(1).min(max);
        AuthWorkers { shared: Arc::default(), cpus, workers, submitted: AtomicU64::new(0) }
    }

    /// Jobs handed to the workers so far.
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Relaxed)
    }

    /// Jobs the workers finished so far.
    pub fn computed(&self) -> u64 {
        self.shared.computed.load(Ordering::Relaxed)
    }

    /// Jobs skipped because their connection had closed before a worker took them.
    pub fn abandoned(&self) -> u64 {
        self.shared.abandoned.load(Ordering::Relaxed)
    }

    /// Jobs queued or running: submitted, neither computed nor abandoned yet.
    pub fn pending(&self) -> u64 {
        self.submitted().saturating_sub(self.computed() + self.abandoned())
    }

    /// Hosts with jobs queued (not counting the ones running).
    pub fn hosts_waiting(&self) -> usize {
        self.shared.lock().turns.hosts()
    }

    /// Queues `work`, a step of host NQN `host`'s transaction, behind the steps of the
    /// hosts whose turn comes first; `reply` gets its result on a worker thread, unless
    /// `waiter` is abandoned before a worker takes it (then it is dropped). Hands `work`
    /// back if there are no workers or none can be started.
    pub fn submit(&self, work: DhWork, token: u64, host: &str, waiter: Waiter, reply: Reply) -> Result<(), DhWork> {
        if self.workers == 0 {
            return Err(work);
        }
        let mut q = self.shared.lock();
        if self.shared.alive.load(Ordering::Acquire) == 0 && self.start() == 0 {
            return Err(work);
        }
        q.turns.push(host, Job { work, token, waiter, reply });
        drop(q);
        self.shared.ready.notify_one();
        self.submitted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the workers (the queue's lock held, so only once); returns how many started.
    fn start(&self) -> usize {
        let mut started = 0;
        for i in 0..self.workers {
            let (shared, cpus) = (Arc::clone(&self.shared), self.cpus.clone());
            shared.alive.fetch_add(1, Ordering::AcqRel);
            let spawned = std::thread::Builder::new().name(format!("qpath-auth-{i}")).spawn(move || {
                let _alive = Alive(&shared.alive);
                if !cpus.is_empty()
                    && let Err(e) = uring::set_current_affinity(&cpus)
                {
                    tracing::warn!("authentication worker keeps its creator's CPUs: {e}");
                }
                let _ = uring::placement::place_helper(); // off polling reactors' CPUs
                if let Err(e) = uring::set_current_thread_nice(WORKER_NICE) {
                    tracing::warn!("authentication worker keeps its creator's priority: {e}");
                }
                shared.work();
            });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    self.shared.alive.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!("cannot start authentication worker {i}: {e}");
                }
            }
        }
        started
    }
}

impl Drop for AuthWorkers {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.ready.notify_all();
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
    use std::sync::mpsc;

    #[test]
    fn work_runs_on_a_worker_and_comes_back_with_its_token() {
        let w = AuthWorkers::default();
        assert_eq!(w.submitted(), 0);
        let (tx, rx) = mpsc::channel();
        for token in [7u64, 8] {
            let tx = tx.clone();
            let reply: Reply = Box::new(move |t, done| {
                let name = std::thread::current().name().map(str::to_string);
                let _ = tx.send((t, done, name, uring::current_thread_nice().ok()));
            });
            assert!(
                w.submit(DhWork::Generate(DhGroup::Ffdhe2048), token, "nqn.host", Waiter::default(), reply).is_ok()
            );
        }
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let (t, done, name, nice) = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a result");
            assert_eq!(nice, Some(WORKER_NICE), "the data path first");
            assert!(matches!(done, DhDone::Generated(Ok(Some(ref p))) if p.public().len() == 256), "{done:?}");
            assert!(name.as_deref().is_some_and(|n| n.starts_with("qpath-auth-")), "{name:?}");
            tokens.push(t);
        }
        tokens.sort_unstable();
        assert_eq!(tokens, [7, 8]);
        assert_eq!((w.submitted(), w.computed()), (2, 2));
    }

    #[test]
    fn zero_workers_hand_the_work_back() {
        let w = AuthWorkers::new(0);
        let back =
            w.submit(DhWork::Generate(DhGroup::Ffdhe2048), 1, "nqn.host", Waiter::default(), Box::new(|_, _| {}));
        assert!(matches!(back, Err(DhWork::Generate(DhGroup::Ffdhe2048))));
        assert_eq!(w.submitted(), 0);
    }

    #[test]
    fn turns_take_one_job_per_host_in_turn() {
        let mut t = Turns::default();
        assert_eq!(t.pop(), None::<u32>);
        for j in 0..4 {
            t.push("a", 10 + j);
        }
        t.push("b", 20);
        t.push("b", 21);
        assert_eq!(t.pop(), Some(10));
        // A host that arrives now takes the last turn, after the hosts already waiting.
        t.push("c", 30);
        assert_eq!(t.hosts(), 3);
        let rest: Vec<u32> = std::iter::from_fn(|| t.pop()).collect();
        assert_eq!(rest, [20, 11, 30, 21, 12, 13]);
        assert_eq!(t.hosts(), 0);
        assert!(t.order.is_empty(), "no host keeps a turn without jobs");
        // Once served out, a host starts afresh.
        t.push("a", 14);
        assert_eq!((t.pop(), t.pop()), (Some(14), None));
    }

    /// One worker, with every reply's token sent to a channel.
    struct OneWorker {
        w: AuthWorkers,
        done_tx: mpsc::Sender<u64>,
        done_rx: mpsc::Receiver<u64>,
    }

    impl OneWorker {
        fn new() -> OneWorker {
            let (done_tx, done_rx) = mpsc::channel();
            OneWorker { w: AuthWorkers::new(1), done_tx, done_rx }
        }

        /// Queues a step of `host` whose reply sends `token`.
        fn submit(&self, host: &str, token: u64, waiter: Waiter) {
            let tx = self.done_tx.clone();
            let reply: Reply = Box::new(move |t, _| {
                let _ = tx.send(t);
            });
            assert!(self.w.submit(DhWork::Generate(DhGroup::Ffdhe2048), token, host, waiter, reply).is_ok());
        }

        /// Runs a step (token 0) whose reply then holds the worker until the returned
        /// sender sends, so that the steps queued meanwhile wait; returns once it holds.
        fn hold(&self, waiter: Waiter) -> mpsc::Sender<()> {
            let (gate_tx, gate_rx) = mpsc::channel::<()>();
            let tx = self.done_tx.clone();
            let reply: Reply = Box::new(move |t, _| {
                let _ = tx.send(t);
                let _ = gate_rx.recv_timeout(std::time::Duration::from_secs(30));
            });
            assert!(self.w.submit(DhWork::Generate(DhGroup::Ffdhe2048), 0, "nqn.gate", waiter, reply).is_ok());
            assert_eq!(self.next(), 0, "the worker holds the gate");
            gate_tx
        }

        /// The next reply's token.
        fn next(&self) -> u64 {
            self.done_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a result")
        }
    }

    /// One host with many steps queued (many queues authenticating at once) makes
    /// another host's step wait for one of its steps, not all of them.
    #[test]
    fn a_host_with_many_steps_waiting_delays_another_by_one() {
        let one = OneWorker::new();
        let gate = one.hold(Waiter::default());
        for token in 1..=6 {
            one.submit("nqn.busy", token, Waiter::default());
        }
        one.submit("nqn.other", 100, Waiter::default());
        one.submit("nqn.third", 200, Waiter::default());
        one.submit("nqn.other", 101, Waiter::default());
        assert_eq!(one.w.hosts_waiting(), 3, "busy, other and third wait");
        gate.send(()).unwrap();
        let order: Vec<u64> = (0..9).map(|_| one.next()).collect();
        // In arrival order the other two hosts would come after all of busy's steps.
        assert_eq!(order, [1, 100, 200, 2, 101, 3, 4, 5, 6]);
        assert_eq!((one.w.submitted(), one.w.computed()), (10, 10));
        assert_eq!(one.w.hosts_waiting(), 0);
    }

    /// Steps whose connection closed while they were queued are skipped, their replies
    /// dropped; a step already running finishes.
    #[test]
    fn abandoned_steps_are_skipped() {
        let one = OneWorker::new();
        let gate_waiter = Waiter::default();
        let gate = one.hold(gate_waiter.clone());
        let waiters: Vec<Waiter> = (1..=4).map(|_| Waiter::default()).collect();
        for (token, waiter) in (1u64..).zip(&waiters) {
            one.submit("h", token, waiter.clone());
        }
        // Abandoning the running step changes nothing; steps 1 and 3 are skipped.
        gate_waiter.abandon();
        waiters[0].abandon();
        waiters[2].abandon();
        let w = &one.w;
        assert_eq!(w.pending(), 4, "the gate's step is computed, its reply holds the worker");
        gate.send(()).unwrap();
        assert_eq!((one.next(), one.next()), (2, 4));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while w.pending() > 0 {
            assert!(std::time::Instant::now() < deadline, "{w:?}");
            std::thread::yield_now();
        }
        assert_eq!((w.submitted(), w.computed(), w.abandoned()), (5, 3, 2));
        assert!(one.done_rx.try_recv().is_err(), "no reply for an abandoned step");
    }
}
