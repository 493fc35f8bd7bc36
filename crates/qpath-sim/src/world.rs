//! One simulated run: the real target connections and the real host queues over
//! simulated links, a simulated disk and a virtual clock, every choice drawn from one
//! seed. See the crate docs for what is real and what is simulated.

// Every size here is bounded by the simulated namespace (96 KiB at most) and its two paths: the
// casts to the wire's u16/u32 fields cannot truncate.
#![allow(clippy::cast_possible_truncation)]

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use host::context::blockcore::BlockCore;
use host::context::ctrlview::CoreController;
use host::context::ctrlview::NsIds;
use host::context::{ContextOptions, DeviceId, Op};
use host::controller::NsInfo;
use host::controller::bringup::{Bringup, BringupConfig, Brought, Next, NsScan};
use host::mpath::Policy;
use host::queue::{DataDir, Done, HostQueue, Io, QueueConfig, QueueState};
use nvme::identify::IdentifyController;
use nvme::tcp::{CommonHeader, Digests, PduType};
use nvme::{AnaGrpId, AnaState, Cid, Cntlid, Nsid, Sqe, Status};
use target::backend::{Backend, FileBackend, FileRequest};
use target::namespace::{Namespace, NamespaceSpec};
use target::pool::BufPool;
use target::port::PortKind;
use target::registry::{TargetOptions, TargetState};
use target::subsystem::{HostAccess, SubsysKind, SubsysLimits, Subsystem};
use target::tcp::{ConnCtx, ConnState, Connection};
use uring::IoBuf;

use crate::ctrl::{NSID, SimCtrl};
use crate::disk::{BLOCK, Disks, SimDisk};
use crate::faults::{Fault, Faults};
use crate::net::{Dir, Link};
use crate::oracle::Oracle;
use crate::rng::Rng;

mod auth;
use auth::{AuthRun, SimAuth, TOKEN_AUTH};

const NQN: &str = "nqn.2026-11.io.qpath:sim";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5e1d0000-0000-4000-8000-000000000001";
const HOSTID: [u8; 16] = [0x5e; 16];
/// Another host of the namespace: a cluster peer that preempts this host's reservation.
const OTHER_HOSTID: [u8; 16] = [0x07; 16];
/// Reservation keys of this host and of the other.
const KEY: u64 = 0x5e5e_0001;
const OTHER_KEY: u64 = 0x0707_0002;
/// Reservation type Write Exclusive (NVMe Base 2.x §8.1.22): only the holder writes,
/// everyone reads.
const RESV_WRITE_EXCLUSIVE: u8 = 1;
/// Blocks of the simulated namespace: few, so I/Os meet on the same blocks.
pub const NS_BLOCKS: usize = 128;
/// The namespace's size stays within these (blocks) when the seed resizes it.
const MIN_BLOCKS: usize = 32;
const MAX_BLOCKS: usize = 192;
/// The ports, one path each.
const PORTS: [u16; 2] = [1, 2];
const ANA_GROUP: AnaGrpId = AnaGrpId(1);
/// I/O queue entries per path.
const IO_ENTRIES: u16 = 8;
/// Application I/Os in flight at most.
const APP_DEPTH: usize = 6;
/// Largest I/O in blocks (12 KiB: past the 8 KiB in-capsule limit, so writes use R2T too).
const MAX_NLB: usize = 24;
/// An I/O (or a bring-up step) outstanding this long resets its path's controller
/// (Linux `io_timeout` runs error recovery).
const IO_TIMEOUT_NS: u64 = 1_000_000_000;
/// Path failovers per I/O before it fails to the application.
const MAX_FAILOVERS: u32 = 1000;
/// Request slots of the host's block core: the application's depth and the read-back,
/// with room to spare (a request that cannot get a slot is a violation here).
const CORE_REQUESTS: usize = 64;
/// The block core's periodic work (`Context` ticks it every 10 ms).
const CORE_TICK_NS: u64 = 10_000_000;
/// The Command Quiesce Time the host assumes when a controller reports none
/// (the production host's `ConnectOptions::command_quiesce_time`; our target reports
/// none): `None`, one KATO, as in production. The hold itself is the production
/// [`host::failover::hold_time`] of what the real target's Identify Controller says.
const QUIESCE_DEFAULT: Option<std::time::Duration> = None;
/// The target connections' periodic tick (the reactor's).
const TICK_NS: u64 = 10_000_000;
/// How often a path whose namespace is not accessible re-reads the ANA log.
const ANA_POLL_NS: u64 = 20_000_000;
/// Virtual time the drain after the fault phase may take (an I/O times out in 1 s, a
/// reconnect takes at most 50 ms: a healed world that has not drained by then never will).
const DRAIN_NS: u64 = 30_000_000_000;
/// Steps the drain may take, whatever the virtual time.
const DRAIN_STEPS: u64 = 300_000;
/// Admin command tokens: the production bring-up's commands, the production namespace
/// scan's (a rescan or ANA re-read the controller machine asks for), the Keep Alive and
/// the Asynchronous Event Request (kept only in seeds that resize).
const TOKEN_BRINGUP: u64 = 1;
const TOKEN_SCAN: u64 = 2;
const TOKEN_KA: u64 = 3;
const TOKEN_AER: u64 = 5;
/// Their command ids on the admin queue (one of each outstanding at most).
const TAG_BRINGUP: u16 = 0;
const TAG_SCAN: u16 = 1;
const TAG_KA: u16 = 2;
const TAG_AER: u16 = 5;
/// Keep Alive Timeout the admin Connect asks for; the host sends a Keep Alive every half
/// of it (as Linux does), and the target tears the controller down when it passes.
const KATO_MS: u32 = 1500;
/// The controllers' `reconnect_delay`: between failed connect attempts (the first after a
/// reset goes at once, as the production admin thread's).
const RECONNECT_DELAY: Duration = Duration::from_millis(20);
/// The controllers' `ctrl_loss_tmo`: the production default.
const CTRL_LOSS_TMO: Duration = Duration::from_secs(600);
/// In the seeds with port outages, a `ctrl_loss_tmo` some outages outlast.
const OUTAGE_CTRL_LOSS_TMO: Duration = Duration::from_secs(3);
/// A port outage lasts this long at most (ns).
const OUTAGE_MAX_NS: u64 = 6_000_000_000;
/// An admin-link silence (the controller's answers stop, its I/O link keeps flowing)
/// lasts between these (ns): past one and a half KATO, so only the keep-alive's expiry
/// can end it.
const ADMIN_SILENCE_NS: (u64, u64) = (2_400_000_000, 4_500_000_000);
/// An outage of both ports at once lasts between these (ns): past `ctrl_loss_tmo` (3 s in
/// these seeds) plus the time the host takes to see both paths gone (a keep-alive's expiry
/// or an I/O timeout) and the check's slack, so a controller that is never given up is seen.
const BOTH_PORTS_NS: (u64, u64) = (7_000_000_000, 9_000_000_000);
/// Namespace faults: the operator gives the namespace back, or puts another in its place,
/// between these (ns) after removing it (the replacement only once the host let go).
const NS_GAP_NS: (u64, u64) = (50_000_000, 2_000_000_000);
/// An application whose submission was refused (its namespace gone) waits this long (ns)
/// before its next one, as one that retries a device it lost would, rather than spending its
/// whole workload on refusals within a moment.
const APP_BACKOFF_NS: u64 = 10_000_000;
/// A restore the target refuses while the removed namespace still holds its file (a
/// command on it in flight) is tried again this much later (ns).
const NS_RETRY_NS: u64 = 10_000_000;

/// Slack of the checks on the controller machine's deadlines: the scheduler may run
/// other ready actions before a due one.
const DEADLINE_SLACK_NS: u64 = 100_000_000;

/// How a run is made.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The seed: the whole schedule follows from it.
    pub seed: u64,
    /// Scheduler steps with faults; then the run heals and drains.
    pub steps: u64,
    /// Keep every event's line.
    pub trace: bool,
    /// Hold a write that failed with its connection for the controller's failover hold
    /// ([`host::failover`], the production host's rule and time) before it is sent again.
    /// Without the hold, a write still in flight at the old path's disk can land after its
    /// retry was acknowledged and overwritten (a "ghost write").
    pub failover_quiesce: bool,
    /// Let the operator shrink the namespace while writes to the blocks cut off are in
    /// flight. The target's shrink publishes the smaller size, waits out the writes past
    /// their write gate (here, where this thread also runs the target, it does not wait:
    /// such a shrink is refused) and only then looks for data and cuts; a write that
    /// reaches its gate later ends with LBA Out of Range. Before that fix a write in flight
    /// landed after the cut, extending the file past the namespace (seed 17).
    /// Off: the simulated operator puts such a shrink off, as before (see docs/design.md).
    pub shrink_under_writes: bool,
    /// The fault families the run draws (all by default: [`Faults::ALL`]).
    pub faults: Faults,
}

/// Counts of what a run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Scheduler steps taken (fault phase and drain).
    pub steps: u64,
    /// Virtual time at the end, ns.
    pub virtual_ns: u64,
    /// Application I/Os completed.
    pub ios: u64,
    /// Of those, failed to the application.
    pub io_errors: u64,
    /// I/Os sent again on a path after a path error.
    pub requeues: u64,
    /// Connections reset by the fault injector.
    pub resets: u64,
    /// Link directions stalled.
    pub stalls: u64,
    /// Admin links silenced toward the host while their I/O links flow.
    pub admin_silences: u64,
    /// Outages of both ports at once.
    pub both_port_outages: u64,
    /// Target crashes (each followed by a restart).
    pub crashes: u64,
    /// ANA state changes.
    pub ana_changes: u64,
    /// Slow-disk periods.
    pub slow_disk: u64,
    /// Bits flipped on the wire (only with header and data digests on).
    pub bit_flips: u64,
    /// Path controller resets (any cause) and reconnects.
    pub path_resets: u64,
    /// Reconnects started.
    pub reconnects: u64,
    /// Controllers the target tore down because keep-alive expired.
    pub keep_alive_timeouts: u64,
    /// Bytes carried by the simulated links.
    pub bytes: u64,
    /// Times another host preempted this host's reservation (and it took it back).
    pub preemptions: u64,
    /// Namespace resizes the target made (an operator's resize RPC).
    pub resizes: u64,
    /// Of the resizes asked for, those the target refused (a shrink over data).
    pub resizes_refused: u64,
    /// DH-HMAC-CHAP transactions the host's queues completed (bring-up and re-authentication).
    pub auths: u64,
    /// Transactions that failed (refused, timed out or cut off): each reset its path.
    pub auth_failures: u64,
    /// Re-authentications of live queues started.
    pub reauths: u64,
    /// Times the operator rotated the host's keys.
    pub key_rotations: u64,
    /// Times the operator removed the namespace.
    pub ns_removals: u64,
    /// Times the operator gave the same namespace back (its data, its UUID).
    pub ns_restores: u64,
    /// Times the operator put another namespace under its NSID.
    pub ns_replacements: u64,
    /// Application submissions the host refused at once (its namespace gone).
    pub refused: u64,
}

/// The first invariant a run broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The step at which it was seen.
    pub step: u64,
    /// What broke.
    pub what: String,
}

/// What a run found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Counts.
    pub summary: Summary,
    /// The first broken invariant, if any.
    pub violation: Option<Violation>,
    /// FNV-1a of every event line: equal for equal seeds.
    pub trace_hash: u64,
    /// Every event line, when asked for.
    pub trace: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ROp {
    Read,
    Write { fua: bool },
    Flush,
}

/// A request as the simulator sees it from outside the block core: submitted, on the
/// wire of a path (as the bytes that went out show), or completed to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RState {
    Queued,
    Inflight { path: usize, tag: u16 },
    Done,
}

#[derive(Debug)]
struct Req {
    op: ROp,
    lba: usize,
    nlb: usize,
    wid: u64,
    buf: Option<IoBuf>,
    state: RState,
    /// Times its command went out on a path (the block core sends it again after a
    /// path error).
    sends: u32,
    submit_seq: u64,
    /// The reservation epoch its last attempt was sent in, if the other host held the
    /// reservation then.
    sent_preempted: Option<u64>,
    /// The namespace's largest and smallest size (blocks) from the send of its last
    /// attempt to its completion: it may succeed only within the first, and be refused as
    /// out of range only past the second.
    room: usize,
    low: usize,
    /// A shrink cut blocks of this write off while its last attempt was in flight.
    cut: bool,
    /// The namespace was not on the target at some time from the send of its last attempt
    /// to its completion (it may end with Invalid Namespace).
    ns_gone: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No association; the controller machine says when to connect.
    Down,
    /// Admin queue handshake (ICReq, Connect, in-band authentication).
    Connecting,
    /// The production bring-up's admin steps ([`Bringup`]): enable, identify, queues,
    /// events, the namespace scan.
    BringingUp,
    /// The I/O queue's handshake, which the bring-up asked for.
    IoConnecting,
    /// Up.
    Live,
}

struct HostConn {
    q: HostQueue,
    link: usize,
    /// The in-band authentication transaction under way on the queue.
    auth: Option<AuthRun>,
}

struct Path {
    port: u16,
    phase: Phase,
    phase_since_ns: u64,
    admin: Option<HostConn>,
    /// The I/O queue while it connects; then the block core has it.
    io: Option<HostConn>,
    /// The I/O queue's connection in the block core (its key there) and its link.
    io_conn: Option<(usize, usize)>,
    /// The in-band authentication transaction under way on that queue (a
    /// re-authentication: its commands go under the queue's reserved tag, beside the
    /// core's I/O).
    io_auth: Option<AuthRun>,
    /// The namespace's ANA state as this path last read it (`Change` until read).
    ana: AnaState,
    next_ana_poll_ns: u64,
    /// The production bring-up of the association under way, and when it asked to be
    /// polled again (its pause between CSTS reads).
    bringup: Option<Bringup>,
    bringup_wake_ns: Option<u64>,
    /// The association's Identify Controller, as its bring-up read it (what a scan sizes
    /// its ANA log read by).
    id: Option<IdentifyController>,
    /// The production namespace scan under way for the controller machine, and the
    /// commands (`AnaLog`, `Rescan`) it and the scans queued behind it answer, in order.
    scan: Option<Box<NsScan>>,
    scan_for: Vec<host::controller::AdminCmd>,
    /// When the scan's command in flight was sent.
    scan_sent_ns: Option<u64>,
    /// The target's ANA mark of this path's port when the bring-up or the scan under way
    /// started ([`World::ana_mark`]).
    ana_mark: Option<(u64, u64)>,
    /// The target's count of namespace changes (removals and additions) then.
    ns_mark: Option<u64>,
    /// Its controller: the production controller machine, and the host's I/O side's view
    /// (generation, change count, class, geometry, failover hold).
    ctrl: Arc<SimCtrl>,
    /// The namespace changed (at this time) while the path's controller had the Namespace
    /// Attribute Changed notice enabled on the target: it owes this host an event, or
    /// (while an earlier one masks it) a Changed Namespace List that names the namespace.
    event_owed: Option<u64>,
    /// Since when the admin link has carried nothing toward the host (a stall).
    silent_since: Option<u64>,
    /// The controller generation the I/O queue in the block core was installed under.
    io_generation: u64,
    /// I/O queues of older associations the block core still holds, with their link and
    /// generation: as in production, a reset the controller machine decides (a keep-alive
    /// expiry, an admin command's timeout) leaves them to the core, which fails a queue of
    /// an older generation at its next tick (only in the seeds with controller faults;
    /// elsewhere the simulator fails them at the reset, as before).
    retired: Vec<(usize, usize, u64)>,
}

struct TConn {
    id: u64,
    link: usize,
    conn: Connection,
    next_tick_ns: u64,
}

struct Target {
    state: Option<Arc<TargetState>>,
    conns: Vec<TConn>,
    pool: BufPool,
    restart_at_ns: Option<u64>,
    next_conn_id: u64,
}

/// A file the namespace's real backend opens and locks (never read or written by a run),
/// removed when the run ends.
struct ScratchFile(std::path::PathBuf);

impl ScratchFile {
    /// A new file in the temporary directory: never one that was there (someone's file, or a
    /// link planted there, is neither written through nor removed by the run).
    fn create() -> ScratchFile {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut last = None;
        for _ in 0..100 {
            let n = RUN.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("qpath-sim-{}-{n}.img", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(_) => return ScratchFile(path),
                Err(e) => last = Some((path, e)),
            }
        }
        let (path, e) = last.expect("tried at least once");
        panic!("the simulated namespace's scratch file {}: {e}", path.display());
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The host end of a link.
#[derive(Clone, Copy, Debug)]
enum HostEnd {
    Admin,
    /// An I/O queue still connecting (the simulator's).
    IoConnecting,
    /// An I/O queue in the block core, by its connection key there.
    Io(usize),
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Deliver(usize, Dir),
    Disk(usize),
    /// An operation of the replacing namespace's disk.
    OtherDisk(usize),
    Timers(usize),
    Tick(usize),
    Submit,
    /// A path's controller machine has a deadline due.
    Ctrl(usize),
    /// A path's bring-up pause is over.
    Bringup(usize),
    AnaPoll(usize),
    BitFlip,
    Restart,
    Fault,
    /// The host block core's periodic work.
    CoreTick,
    RotateKeys,
    HostKeys,
}

/// Which namespace the operator has under NSID 1: a setting, kept across a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NsOnTarget {
    /// The one the host's device was opened on (its data on `World::disk`).
    Original,
    /// None: the operator removed it.
    Removed,
    /// Another namespace (new UUID, its own file and disk).
    Replacement,
}

/// What the operator does after removing the namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NsBack {
    /// Gives the same namespace back: its file (data kept), its UUID passed explicitly.
    Same,
    /// Puts a new namespace (a new UUID, a fresh file) under NSID 1, once the host let go.
    Other,
}

/// A namespace fault drawn from the seed: when the removal comes and what follows it.
#[derive(Clone, Copy, Debug)]
struct NsFault {
    back: NsBack,
    /// Once no more than this many I/Os are left to issue.
    at: u64,
    /// The return comes this long (ns) after the removal at the earliest.
    gap_ns: u64,
}

/// The namespace that replaced the original one: its file, disk and UUID.
struct OtherNs {
    file: ScratchFile,
    ino: u64,
    disk: SimDisk,
    uuid: [u8; 16],
}

/// The simulated world.
pub struct World {
    opts: Options,
    rng: Rng,
    net_rng: Rng,
    now: u64,
    clock: Arc<AtomicU64>,
    links: Vec<Link>,
    target: Target,
    disk: SimDisk,
    file: ScratchFile,
    paths: Vec<Path>,
    /// The production host block core, over the paths' controller views.
    core: BlockCore<SimCtrl>,
    /// The multipath device the application submits to.
    dev: DeviceId,
    /// Each path's queue in the core.
    qkeys: Vec<usize>,
    /// The core's time: `base` plus the virtual nanoseconds.
    base: Instant,
    next_core_tick_ns: u64,
    /// The digests every queue asks for (from the seed).
    digests: Digests,
    /// Where bits flip (its own stream: see `World::new`).
    flip_rng: Rng,
    /// Reservation faults: their own stream, on in about half the seeds.
    resv_rng: Rng,
    reservations: bool,
    /// This host holds the namespace's reservation (else the other host preempted it).
    resv_ours: bool,
    /// Bumped whenever the reservation changes hands.
    resv_epoch: u64,
    /// Namespace resizes: their own stream, on in about half the seeds.
    ns_rng: Rng,
    resizes: bool,
    /// Port outages (a port goes silent: every link through it stalls both ways and new
    /// connections hang): their own stream, in about a quarter of the seeds, which also
    /// get a `ctrl_loss_tmo` some outages outlast.
    outage_rng: Rng,
    outages: bool,
    ctrl_loss_tmo: Duration,
    /// Until when each port is silent (ns).
    port_silent_until: [u64; 2],
    /// Controller faults: their own stream. In about half the seeds an admin link goes
    /// silent toward the host while the path's I/O link keeps flowing (mostly on a path
    /// with no I/O in flight), and a reset the controller machine decides leaves the old
    /// I/O queue to the block core.
    ctrl_rng: Rng,
    ctrl_faults: bool,
    /// In those seeds, two admin-link silences also come in the drain after the fault
    /// phase, where no other fault resets the path before its keep-alive expires: once no
    /// more than these counts of I/Os are left to issue (smallest first) and a path is live.
    admin_silence_at: Vec<u64>,
    /// In about one seed in eight, both ports go silent once for longer than
    /// `ctrl_loss_tmo`, late in the workload (most of it is issued in the drain after the
    /// fault phase): once no more than this many I/Os are left to issue and one is in flight.
    /// The controllers are given up then, so what is left of the workload and the read-back
    /// fail with a path error.
    both_ports_at: Option<u64>,
    /// Until when both ports are silent (ns): the heal at the end of the fault phase lets
    /// such an outage run its course (it is the check of `ctrl_loss_tmo`).
    both_silent_until: u64,
    /// Since when no path's controller has been live (ns).
    no_path_since: Option<u64>,
    /// In-band authentication: on in a share of seeds (its own stream).
    auth: Option<SimAuth>,
    /// Namespace removal, then the same namespace back or another in its place: its own
    /// stream, in about one seed in eight, late in the workload.
    nsf_rng: Rng,
    ns_fault: Option<NsFault>,
    /// The namespace's return that is due (what comes back, from when).
    ns_back: Option<(NsBack, u64)>,
    ns_on_target: NsOnTarget,
    /// Removals and additions of namespace 1 so far (what a scan's read is checked by).
    ns_changes: u64,
    /// The original namespace's identifiers (its UUID among them) on the target, once it started.
    first_ids: Option<NsIds>,
    /// The namespace that replaced it, once there is one.
    other: Option<OtherNs>,
    /// The device refused a submission because its namespace was replaced.
    refused_replaced: bool,
    /// The application submits nothing before this (ns): it backs off after a refusal.
    app_pause_until: u64,
    /// The namespace's size on the target, blocks (an operator's setting: kept across a
    /// restart).
    ns_blocks: usize,
    /// The size the host last read (Identify Namespace), blocks: the application's I/O
    /// stays within it.
    host_blocks: usize,
    /// The namespace's size in the target's saved configuration, bytes.
    saved_bytes: u64,
    reqs: Vec<Req>,
    busy: Vec<bool>,
    active: usize,
    oracle: Oracle,
    seq: u64,
    next_wid: u64,
    to_issue: u64,
    faults: bool,
    step: u64,
    drain_steps: u64,
    sum: Summary,
    violation: Option<Violation>,
    hash: u64,
    trace: Vec<String>,
    line: String,
}

static RUN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The step the run on this thread is at, for the report of a panic.
    pub(crate) static STEP: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl World {
    /// A world for `opts`, target up, paths about to connect.
    pub fn new(opts: Options) -> World {
        let mut rng = Rng::new(opts.seed);
        let net_rng = rng.fork();
        let disk = SimDisk::new(NS_BLOCKS * BLOCK, MAX_BLOCKS * BLOCK, rng.fork());
        let file = ScratchFile::create();
        let policy = match rng.below(3) {
            0 => Policy::RoundRobin { rr_min_io: 1 },
            1 => Policy::QueueDepth,
            _ => Policy::Numa,
        };
        let to_issue = opts.steps / 8 + 16;
        // Choices added after seeds were recorded draw from streams of their own, so the
        // schedules of those seeds stay as they were where the new choice changes nothing.
        let d = Rng::new(opts.seed ^ 0xd16e_5700).below(4);
        let digests = Digests { header: d & 1 != 0, data: d & 2 != 0 };
        let flip_rng = Rng::new(opts.seed ^ 0xb17f_11b5);
        let mut resv_rng = Rng::new(opts.seed ^ 0x7e5e_7a71);
        let reservations = resv_rng.chance(500_000) && opts.faults.has(Fault::Reservation);
        let mut ns_rng = Rng::new(opts.seed ^ 0x2e51_2e21);
        let resizes = ns_rng.chance(500_000) && opts.faults.has(Fault::Resize);
        let mut outage_rng = Rng::new(opts.seed ^ 0x0c71_1055);
        let outages = outage_rng.chance(250_000) && opts.faults.has(Fault::Outage);
        let mut ctrl_rng = Rng::new(opts.seed ^ 0xad41_5e1e);
        let ctrl_faults = ctrl_rng.chance(500_000) && opts.faults.has(Fault::Controller);
        let mut admin_silence_at: Vec<u64> = if ctrl_faults {
            (0..2).map(|_| to_issue / 4 + ctrl_rng.below(to_issue / 2)).collect()
        } else {
            Vec::new()
        };
        admin_silence_at.sort_unstable();
        let both_ports_at = ctrl_rng
            .chance(125_000)
            .then(|| to_issue / 16 + ctrl_rng.below(to_issue / 16 + 1))
            .filter(|_| opts.faults.has(Fault::Controller));
        let ctrl_loss_tmo = if outages || both_ports_at.is_some() { OUTAGE_CTRL_LOSS_TMO } else { CTRL_LOSS_TMO };
        let mut nsf_rng = Rng::new(opts.seed ^ 0x4e5f_4a11);
        let ns_fault = nsf_rng
            .chance(125_000)
            .then(|| NsFault {
                back: if nsf_rng.chance(500_000) { NsBack::Same } else { NsBack::Other },
                at: to_issue / 8 + nsf_rng.below(to_issue / 8 + 1),
                gap_ns: nsf_rng.range(NS_GAP_NS.0, NS_GAP_NS.1),
            })
            .filter(|_| opts.faults.has(Fault::Namespace));
        // The host's production block core; its clock is `base` plus the virtual time:
        // only differences of it are ever read. Its paths and device come once the target
        // is up (the device is opened on the namespace the target has).
        let base = Instant::now();
        let clock = Arc::new(AtomicU64::new(0));
        let core_opts = ContextOptions {
            max_requests: CORE_REQUESTS,
            io_timeout: Duration::from_nanos(IO_TIMEOUT_NS),
            max_failovers: MAX_FAILOVERS,
            ..ContextOptions::default()
        };
        let core = BlockCore::new(core_opts, base);
        let mut w = World {
            opts,
            rng,
            net_rng,
            now: 0,
            clock,
            links: Vec::new(),
            target: Target {
                state: None,
                conns: Vec::new(),
                pool: BufPool::new(1 << 20, 16 << 20),
                restart_at_ns: None,
                next_conn_id: 1,
            },
            disk,
            file,
            paths: Vec::new(),
            core,
            dev: DeviceId(u32::MAX),
            qkeys: Vec::new(),
            base,
            next_core_tick_ns: CORE_TICK_NS,
            digests,
            flip_rng,
            resv_rng,
            reservations,
            resv_ours: false,
            resv_epoch: 0,
            ns_rng,
            resizes,
            outage_rng,
            outages,
            ctrl_loss_tmo,
            port_silent_until: [0; 2],
            ctrl_rng,
            ctrl_faults,
            admin_silence_at,
            both_ports_at,
            both_silent_until: 0,
            no_path_since: Some(0),
            auth: SimAuth::draw(opts.seed, opts.steps),
            nsf_rng,
            ns_fault,
            ns_back: None,
            ns_on_target: NsOnTarget::Original,
            ns_changes: 0,
            first_ids: None,
            other: None,
            refused_replaced: false,
            app_pause_until: 0,
            ns_blocks: NS_BLOCKS,
            host_blocks: NS_BLOCKS,
            saved_bytes: (NS_BLOCKS * BLOCK) as u64,
            reqs: Vec::new(),
            busy: vec![false; MAX_BLOCKS],
            active: 0,
            oracle: Oracle::new(MAX_BLOCKS),
            seq: 0,
            next_wid: 1,
            to_issue,
            faults: true,
            step: 0,
            drain_steps: u64::MAX,
            sum: Summary::default(),
            violation: None,
            hash: 0xcbf2_9ce4_8422_2325,
            trace: Vec::new(),
            line: String::new(),
        };
        w.event(format_args!("seed {} policy {policy:?} {digests:?} ios {to_issue}", opts.seed));
        if outages {
            w.event(format_args!("ports may go silent; ctrl_loss_tmo {} ms", ctrl_loss_tmo.as_millis()));
        }
        if ctrl_faults {
            w.event(format_args!("admin links may go silent toward the host"));
        }
        if let Some(s) = both_ports_at {
            let ms = ctrl_loss_tmo.as_millis();
            w.event(format_args!("both ports go silent with {s} I/Os left to issue; ctrl_loss_tmo {ms} ms"));
        }
        if let Some(a) = &w.auth {
            let what = a.describe();
            w.event(format_args!("the subsystem requires DH-HMAC-CHAP of the host: {what}"));
        }
        if let Some(f) = ns_fault {
            let what = if f.back == NsBack::Same { "gives it back" } else { "puts another in its place" };
            w.event(format_args!("the operator removes the namespace with {} I/Os left to issue and {what}", f.at));
        }
        w.start_target();
        // The host: one controller view per path, assuming the namespace the application
        // opens is the target's (as configured) until a scan reads it; a multipath head
        // over them; a queue of each in the core, and the head's device.
        let assumed = NsInfo {
            nsid: NSID,
            nsze: NS_BLOCKS as u64,
            block_shift: BLOCK.trailing_zeros() as u8,
            anagrpid: ANA_GROUP,
            ana_state: AnaState::Change,
            nguid: w.first_ids.map_or([0; 16], |i| i.nguid),
            eui64: w.first_ids.map_or([0; 8], |i| i.eui64),
            uuid: w.first_ids.and_then(|i| i.uuid),
            shared: true,
        };
        let ctrls: Vec<Arc<SimCtrl>> = (0..PORTS.len())
            .map(|i| {
                let cfg = host::controller::MachineConfig {
                    traddr: std::net::SocketAddr::from(([127, 0, 0, 1], 4420 + i as u16)),
                    kato: Duration::from_millis(u64::from(KATO_MS)),
                    reconnect_delay: RECONNECT_DELAY,
                    ctrl_loss_tmo: Some(ctrl_loss_tmo),
                    fast_io_fail_tmo: None,
                    // The event request is kept only where the namespace changes.
                    aer: resizes || ns_fault.is_some(),
                };
                SimCtrl::new(cfg, Arc::clone(&w.clock), assumed.clone(), opts.failover_quiesce)
            })
            .collect();
        let head = crate::ctrl::head(NQN, policy, &ctrls);
        w.qkeys = ctrls.iter().map(|c| w.core.add_queue(c, 0).expect("a queue of the simulated controller")).collect();
        let slots = ctrls.iter().zip(&w.qkeys).map(|(c, &q)| Some((Arc::clone(c), NSID, q))).collect();
        w.dev = w
            .core
            .open_multi(&head, slots, BLOCK.trailing_zeros() as u8, NS_BLOCKS as u64, 0, base)
            .expect("the simulated multipath device");
        for (port, ctrl) in PORTS.iter().zip(ctrls) {
            w.paths.push(Path {
                port: *port,
                phase: Phase::Down,
                phase_since_ns: 0,
                admin: None,
                io: None,
                io_conn: None,
                io_auth: None,
                ana: AnaState::Change,
                next_ana_poll_ns: 0,
                bringup: None,
                bringup_wake_ns: None,
                id: None,
                scan: None,
                scan_for: Vec::new(),
                scan_sent_ns: None,
                ana_mark: None,
                ns_mark: None,
                ctrl,
                event_owed: None,
                silent_since: None,
                io_generation: 0,
                retired: Vec::new(),
            });
        }
        w
    }

    fn event(&mut self, args: std::fmt::Arguments<'_>) {
        self.line.clear();
        let _ = write!(self.line, "{} {} ", self.step, self.now);
        let _ = self.line.write_fmt(args);
        for b in self.line.bytes().chain([b'\n']) {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        if self.opts.trace {
            self.trace.push(self.line.clone());
        }
    }

    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.event(format_args!("VIOLATION {what}"));
            self.violation = Some(Violation { step: self.step, what });
        }
    }

    // ------------------------------------------------------------------ target

    fn start_target(&mut self) {
        let state = Arc::new(TargetState::with_virtual_clock(TargetOptions::default(), Arc::clone(&self.clock)));
        for (i, port) in PORTS.iter().enumerate() {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 4420 + i as u16));
            state.add_port(*port, addr, PortKind::Io).expect("a port of the simulated target");
        }
        let subsys = Subsystem::new(
            NQN,
            SubsysKind::Nvm,
            "QPSIM0001",
            "qpath sim",
            HostAccess { allow_any: true, hosts: vec![] },
            SubsysLimits::default(),
        )
        .expect("the simulated subsystem");
        let subsys = state.add_subsystem(subsys).expect("the simulated subsystem");
        // The namespace the operator has configured (none once removed).
        if self.ns_on_target != NsOnTarget::Removed
            && let Err(e) = self.add_namespace(&subsys, self.ns_on_target)
        {
            self.violate(format!("the target cannot start its namespace again: {e}"));
            return;
        }
        self.target.state = Some(state);
        self.target.restart_at_ns = None;
        // The operator's keys are part of the saved configuration: every start has them.
        self.configure_target_auth();
        if self.reservations {
            // Reservations are volatile here (no PTPL file): the host's bring-up registers
            // and reserves again after every start.
            self.resv_ours = false;
            self.reservation_change();
        }
    }

    /// Adds namespace 1 to `subsys` as the operator configured it (`which`): the original,
    /// on its file, with its size in the saved configuration (the file's length when it was
    /// last saved: persist.rs saves a file namespace's size so, after every change such as
    /// a resize) and, once known, its UUID (a saved configuration carries it; a restore
    /// passes it explicitly); or the replacement on its own file with its own UUID.
    fn add_namespace(&mut self, subsys: &Subsystem, which: NsOnTarget) -> Result<(), String> {
        let owner = format!("namespace 1 of {NQN}");
        let (path, size, uuid) = match which {
            NsOnTarget::Original => {
                if self.resizes {
                    // The file is this disk's, as it is now.
                    self.copy_disk_to_file(self.disk.size());
                }
                (self.file.0.clone(), self.saved_bytes, self.first_ids.and_then(|i| i.uuid))
            }
            NsOnTarget::Replacement => {
                let Some(o) = &self.other else { return Err("no replacing namespace".to_string()) };
                (o.file.0.clone(), (NS_BLOCKS * BLOCK) as u64, Some(o.uuid))
            }
            NsOnTarget::Removed => return Ok(()),
        };
        let req = FileRequest { grow: true, ..FileRequest::read_write(&path, Some(size), &owner) };
        let backend = FileBackend::open(&req).map(|(b, _)| b).map_err(|e| {
            let len = std::fs::metadata(&path).map_or(0, |m| m.len()) / BLOCK as u64;
            format!("{e} ({len} blocks in the file, {} in the saved configuration)", size / BLOCK as u64)
        })?;
        subsys
            .add_namespace(NamespaceSpec {
                nsid: 1,
                backend: Backend::File(backend),
                size: None,
                block_size: BLOCK as u32,
                anagrpid: ANA_GROUP.0,
                uuid,
                readonly: false,
                ptpl_file: None,
            })
            .map_err(|e| e.to_string())?;
        if which == NsOnTarget::Original && self.first_ids.is_none() {
            let ns = subsys.namespaces().0.get(NSID).cloned().expect("the namespace just added");
            self.first_ids = Some(ids_of(&ns));
        }
        Ok(())
    }

    /// The namespace the target has under NSID 1 now.
    fn target_ns(&self) -> Option<Arc<Namespace>> {
        self.target.state.as_ref()?.subsystem(NQN)?.namespaces().0.get(NSID).cloned()
    }

    /// The identifiers of the namespace the target has under NSID 1 now.
    fn target_ids(&self) -> Option<NsIds> {
        self.target_ns().as_deref().map(ids_of)
    }

    /// The reservation changes hands: this host registers and reserves the namespace
    /// (Write Exclusive), taking it back from the other host if it has it; or the other
    /// host registers and preempts it. The target's real reservation logic, called as
    /// its command handlers call it (the hosts' Reservation commands are not sent over
    /// the simulated links).
    fn reservation_change(&mut self) {
        // The reservation is the original namespace's: one put in its place is never the
        // device's to write, and one removed has none.
        if self.ns_on_target != NsOnTarget::Original {
            return;
        }
        let Some(ns) = self.target_ns() else { return };
        let keys = |c: u64, p: u64| {
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&c.to_le_bytes());
            d[8..].copy_from_slice(&p.to_le_bytes());
            d
        };
        // RACQA 0 acquires, 1 preempts; RTYPE Write Exclusive; no key to preempt at first.
        let (who, key, other_key, racqa) = if self.resv_ours {
            (OTHER_HOSTID, OTHER_KEY, KEY, 1)
        } else {
            let held = ns.resv.snapshot().rtype != 0;
            (HOSTID, KEY, OTHER_KEY, u32::from(held))
        };
        let registered = ns.resv.register(&who, 0, &keys(0, key));
        let acquired = ns.resv.acquire(&who, racqa | (u32::from(RESV_WRITE_EXCLUSIVE) << 8), &keys(key, other_key));
        if !registered.is_success() || !acquired.is_success() {
            self.violate(format!("the reservation did not change hands: register {registered}, acquire {acquired}"));
            return;
        }
        self.resv_ours = !self.resv_ours;
        self.resv_epoch += 1;
        if self.resv_ours {
            self.event(format_args!("reservation: this host holds it"));
        } else {
            self.sum.preemptions += 1;
            self.event(format_args!("fault: another host preempts the reservation"));
        }
    }

    /// An operator resizes the namespace: the target's real `resize_namespace` (what the
    /// RPC of that name calls), which grows the file, or shrinks it only where no data lies
    /// past the new end, and tells every controller (Namespace Attribute Changed, the
    /// Changed Namespace List). Half the shrinks aim anywhere (mostly refused once the
    /// workload wrote there), half just past the last block the disk holds data in (an
    /// operator who looked first), so both outcomes are common.
    fn resize_namespace(&mut self) {
        if self.ns_on_target != NsOnTarget::Original {
            return;
        }
        let Some(sub) = self.target.state.as_ref().and_then(|s| s.subsystem(NQN)) else { return };
        let old = self.ns_blocks;
        let roll = self.ns_rng.below(4);
        let new = if roll < 2 && old < MAX_BLOCKS {
            self.ns_rng.range(old as u64 + 1, MAX_BLOCKS as u64) as usize
        } else if roll == 2 && old > MIN_BLOCKS {
            self.ns_rng.range(old.saturating_sub(40).max(MIN_BLOCKS) as u64, old as u64 - 1) as usize
        } else {
            let used = (0..old).rev().find(|&b| self.disk.block_wid(b) != 0).map_or(0, |b| b + 1);
            let to = used.next_multiple_of(8).max(MIN_BLOCKS);
            if to >= old {
                return;
            }
            to
        };
        if new < old && !self.opts.shrink_under_writes {
            let writing = self
                .reqs
                .iter()
                .any(|r| r.state != RState::Done && matches!(r.op, ROp::Write { .. }) && r.lba + r.nlb > new);
            if writing || self.disk.writes_past(new * BLOCK) {
                self.event(format_args!("fault: shrink from {old} to {new} blocks put off: writes there in flight"));
                return;
            }
        }
        // The real resize looks at the real file (its length, and `SEEK_DATA` past the new
        // end): give it this disk's length and data first.
        self.copy_disk_to_file(new.min(old) * BLOCK);
        // The writes a shrink waits for run on this thread: it is refused at once while one
        // is past its write gate (what a real shrink does when they outlast its bound).
        match sub.resize_namespace_within(Nsid(1), (new * BLOCK) as u64, std::time::Duration::ZERO) {
            Err(e) => {
                self.sum.resizes_refused += 1;
                self.event(format_args!("fault: resize from {old} to {new} blocks refused"));
                if new > old {
                    self.violate(format!("the target refused to grow the namespace from {old} to {new} blocks: {e}"));
                }
            }
            Ok((prev, _)) => {
                self.sum.resizes += 1;
                self.event(format_args!("fault: namespace resized from {old} to {new} blocks"));
                if prev != (old * BLOCK) as u64 {
                    self.violate(format!("the target's namespace had {prev} bytes, not the {old} blocks last set"));
                    return;
                }
                // The data rule: a shrink cuts off only blocks nothing was written to.
                if let Some(blk) = (new..old).find(|&b| self.disk.block_wid(b) != 0) {
                    let w = self.disk.block_wid(blk);
                    self.violate(format!("a shrink to {new} blocks succeeded though block {blk} held write {w}"));
                    return;
                }
                let len = std::fs::metadata(&self.file.0).map(|m| m.len()).unwrap_or_else(|e| {
                    panic!("the simulated namespace's scratch file {}: {e}", self.file.0.display())
                });
                self.disk.set_len(usize::try_from(len).unwrap_or(usize::MAX));
                self.saved_bytes = len;
                if new < old {
                    self.oracle.cut(new..MAX_BLOCKS);
                }
                for r in &mut self.reqs {
                    if let RState::Inflight { .. } = r.state {
                        r.room = r.room.max(new);
                        r.low = r.low.min(new);
                        r.cut |= matches!(r.op, ROp::Write { .. }) && r.lba + r.nlb > new;
                    }
                }
                self.ns_blocks = new;
                self.owe_ns_event(&sub);
            }
        }
    }

    /// Namespace 1 changed on the target: NVMe Base 2.x §5.2 (Asynchronous Event
    /// Request): each controller with the notice enabled owes its host the event.
    fn owe_ns_event(&mut self, sub: &Subsystem) {
        for p in 0..self.paths.len() {
            let enabled = self.paths[p]
                .admin
                .as_ref()
                .and_then(|c| sub.controller(c.q.cntlid()))
                .is_some_and(|c| c.aen_enabled() & nvme::identify::oaes::NS_ATTR != 0);
            if enabled && self.paths[p].event_owed.is_none() {
                self.paths[p].event_owed = Some(self.now);
            }
        }
    }

    /// The operator removes namespace 1: the target's real `remove_namespace` (what the RPC
    /// of that name calls). Commands the target is executing on it complete; a later one
    /// gets Invalid Namespace; every controller is told (Namespace Attribute Changed). What
    /// comes back, and when, is the fault's.
    fn remove_ns(&mut self, f: NsFault) {
        let Some(sub) = self.target.state.as_ref().and_then(|s| s.subsystem(NQN)) else { return };
        if let Err(e) = sub.remove_namespace(NSID) {
            self.violate(format!("the target refused to remove namespace 1: {e}"));
            return;
        }
        self.ns_on_target = NsOnTarget::Removed;
        self.ns_changes += 1;
        self.sum.ns_removals += 1;
        for r in &mut self.reqs {
            if let RState::Inflight { .. } = r.state {
                r.ns_gone = true;
            }
        }
        self.owe_ns_event(&sub);
        self.ns_back = Some((f.back, self.now + f.gap_ns));
        self.event(format_args!("fault: the operator removes namespace 1"));
    }

    /// Whether the host let go of the removed namespace, as an operator who waits before
    /// reusing its NSID sees it: every live controller lists no namespace 1 (none scanning),
    /// the others are down (their next bring-up reads what the target has then), and no
    /// command of the device is left on any queue, old associations' included.
    fn host_let_go(&self) -> bool {
        self.paths.iter().all(|p| match p.phase {
            Phase::Down => true,
            Phase::Live => p.scan.is_none() && p.retired.is_empty() && p.ctrl.namespace_ids(NSID).is_none(),
            _ => false,
        }) && self.core.in_flight() == 0
    }

    /// The removed namespace's return, once due: the same namespace (its file, with the
    /// data it had, and its UUID passed explicitly, as an operator restoring it would; tried
    /// again a little later while the target still holds that file for a command on the
    /// removed one), or a new one under NSID 1 (a new UUID, a fresh file and disk), once
    /// the host let go of the old.
    fn ns_return(&mut self) {
        let Some((back, at)) = self.ns_back else { return };
        if self.now < at {
            return;
        }
        let Some(sub) = self.target.state.as_ref().and_then(|s| s.subsystem(NQN)) else { return };
        match back {
            NsBack::Same => {
                if let Err(e) = self.add_namespace(&sub, NsOnTarget::Original) {
                    self.event(format_args!("the target refuses namespace 1 back for now: {e}"));
                    self.ns_back = Some((back, self.now + NS_RETRY_NS));
                    return;
                }
                self.ns_on_target = NsOnTarget::Original;
                self.sum.ns_restores += 1;
                self.event(format_args!("fault: the operator gives namespace 1 back (its file, its UUID)"));
            }
            NsBack::Other => {
                if !self.host_let_go() {
                    return;
                }
                if self.other.is_none() {
                    use std::os::unix::fs::MetadataExt as _;
                    let file = ScratchFile::create();
                    let ino = std::fs::metadata(&file.0)
                        .map(|m| m.ino())
                        .unwrap_or_else(|e| panic!("the replacing namespace's scratch file {}: {e}", file.0.display()));
                    let disk = SimDisk::new(NS_BLOCKS * BLOCK, MAX_BLOCKS * BLOCK, self.nsf_rng.fork());
                    // A new UUID, as the target's RPC draws one (version 4, RFC 9562 §5.4).
                    let mut uuid = [0u8; 16];
                    for b in &mut uuid {
                        *b = self.nsf_rng.below(256) as u8;
                    }
                    uuid[6] = (uuid[6] & 0x0f) | 0x40;
                    uuid[8] = (uuid[8] & 0x3f) | 0x80;
                    self.other = Some(OtherNs { file, ino, disk, uuid });
                }
                if let Err(e) = self.add_namespace(&sub, NsOnTarget::Replacement) {
                    self.violate(format!("the target refused a new namespace under NSID 1: {e}"));
                    return;
                }
                self.ns_on_target = NsOnTarget::Replacement;
                self.sum.ns_replacements += 1;
                self.event(format_args!("fault: the operator puts a new namespace under NSID 1"));
            }
        }
        self.ns_back = None;
        self.ns_changes += 1;
        self.owe_ns_event(&sub);
        if self.reservations && back == NsBack::Same {
            // A namespace added anew has no reservation: this host takes it again.
            self.resv_ours = false;
            self.reservation_change();
        }
    }

    /// Gives the real file (which the target's resize and open look at, outside the I/O
    /// path) this disk's length, and its data from byte `from` on.
    fn copy_disk_to_file(&self, from: usize) {
        let opened = std::fs::OpenOptions::new().write(true).open(&self.file.0);
        let synced = opened.and_then(|f| self.disk.copy_to(&f, from));
        if let Err(e) = synced {
            panic!("the simulated namespace's scratch file {}: {e}", self.file.0.display());
        }
    }

    fn with_conn<R>(&mut self, i: usize, f: impl FnOnce(&mut Connection, &mut ConnCtx<'_>) -> R) -> R {
        let t = &mut self.target.conns[i];
        let mut disks = Disks { first: &mut self.disk, other: self.other.as_mut().map(|o| (&mut o.disk, o.ino)) };
        let mut ctx = ConnCtx {
            pool: &mut self.target.pool,
            file_io: &mut disks,
            token: t.id << 16,
            now_ns: self.now,
            offload: None,
        };
        f(&mut t.conn, &mut ctx)
    }

    fn accept(&mut self, port: u16, link: usize) {
        let Some(state) = self.target.state.clone() else {
            // Nobody listens: the connection is refused.
            self.links[link].reset();
            return;
        };
        let p = state.port(port).expect("the simulated port");
        // A silent port: the connection's packets go nowhere until the outage ends.
        let silent = self.port_silent_until[PORTS.iter().position(|&q| q == port).unwrap_or(0)];
        if silent > self.now {
            self.links[link].to_target.stalled_until_ns = silent;
            self.links[link].to_host.stalled_until_ns = silent;
        }
        let id = self.target.next_conn_id;
        self.target.next_conn_id += 1;
        let conn = Connection::new(state, p, None, 0);
        self.target.conns.push(TConn { id, link, conn, next_tick_ns: self.now + TICK_NS });
    }

    fn crash_target(&mut self) {
        self.sum.crashes += 1;
        for t in std::mem::take(&mut self.target.conns) {
            self.links[t.link].reset();
        }
        self.target.state = None;
        self.target.pool = BufPool::new(1 << 20, 16 << 20);
        for what in self.disk.crash() {
            self.event(format_args!("crash: disk {what}"));
        }
        let other = self.other.as_mut().map(|o| o.disk.crash()).unwrap_or_default();
        for what in other {
            self.event(format_args!("crash: the replacing namespace's disk {what}"));
        }
        self.oracle.crashed();
        let at = self.now + self.rng.range(1_000_000, 50_000_000);
        self.target.restart_at_ns = Some(at);
        self.event(format_args!("target crash, restart at {at}"));
    }

    // -------------------------------------------------------------------- host

    fn new_link(&mut self) -> usize {
        self.links.push(Link::default());
        self.links.len() - 1
    }

    fn reconnect(&mut self, p: usize) {
        self.sum.reconnects += 1;
        let link = self.new_link();
        let port = self.paths[p].port;
        self.accept(port, link);
        let mut cfg = QueueConfig::io(0, 32, Cntlid::DYNAMIC, NQN, HOSTNQN, HOSTID);
        cfg.tag_space = 32;
        cfg.kato_ms = KATO_MS;
        cfg.digests = self.digests;
        let path = &mut self.paths[p];
        path.admin = Some(HostConn { q: HostQueue::new(cfg), link, auth: None });
        path.phase = Phase::Connecting;
        path.phase_since_ns = self.now;
        path.ana = AnaState::Change;
        self.event(format_args!("path {p} reconnect (link {link})"));
    }

    /// The path's association failed: a live controller's machine resets it (its
    /// queues fail, their I/O is requeued or failed, its connections close, and it
    /// reconnects); a bring-up under way ends and the machine tries again later.
    fn fail_path(&mut self, p: usize, why: &str) {
        if self.paths[p].phase == Phase::Down {
            return;
        }
        self.sum.path_resets += 1;
        self.event(format_args!("path {p} reset: {why}"));
        let now = self.now;
        let ctrl = Arc::clone(&self.paths[p].ctrl);
        if ctrl.machine().is_live() {
            ctrl.machine().on_lost(now, why);
            self.ctrl_step(p);
        } else {
            self.tear_down(p, why);
            ctrl.machine().on_connected(now, Err(why.to_string()));
        }
    }

    /// Steps path `p`'s controller machine: does every action it hands out now.
    fn ctrl_step(&mut self, p: usize) {
        let ctrl = Arc::clone(&self.paths[p].ctrl);
        while let Some(a) = ctrl.poll() {
            match a {
                host::controller::Action::Connect => self.reconnect(p),
                host::controller::Action::TearDown => {
                    let why = ctrl.machine().last_error().unwrap_or("reset").to_string();
                    if self.ctrl_faults {
                        self.retire_io(p, &why);
                    }
                    self.tear_down(p, &why);
                }
                host::controller::Action::Send(cmd) => self.admin_send(p, cmd),
                host::controller::Action::Delete { .. } | host::controller::Action::Lost => {
                    self.event(format_args!("path {p} controller given up ({a:?})"));
                    self.tear_down(p, "controller given up");
                }
            }
        }
    }

    /// Sends an admin command path `p`'s controller machine asked for.
    fn admin_send(&mut self, p: usize, cmd: host::controller::AdminCmd) {
        use host::controller::AdminCmd;
        let sent = match cmd {
            AdminCmd::KeepAlive => {
                let io = Io { sqe: Sqe::keep_alive(Cid(0)), buf: None, len: 0, dir: DataDir::None, token: TOKEN_KA };
                self.paths[p].admin.as_mut().is_some_and(|c| c.q.submit(TAG_KA, io).is_ok())
            }
            AdminCmd::AsyncEventRequest => self.arm_event(p),
            // As the production driver: the production namespace scan (a rescan reads the
            // Changed Namespace List first, which re-arms the event).
            AdminCmd::AnaLog | AdminCmd::Rescan => return self.start_scan(p, cmd),
        };
        if !sent {
            self.paths[p].ctrl.machine().on_admin_done(cmd, false);
        }
    }

    /// A reset the controller machine decided: as the production admin thread, it drops
    /// the admin queue and leaves the I/O queue, still working, to the block core, which
    /// fails it at its next tick once it sees the controller's newer generation.
    fn retire_io(&mut self, p: usize, why: &str) {
        let path = &mut self.paths[p];
        let Some((ckey, link)) = path.io_conn else { return };
        let working = self.core.queue_mut(ckey).is_some_and(|q| q.state() != QueueState::Failed);
        if !working || self.link_lost(link) {
            return;
        }
        let path = &mut self.paths[p];
        path.io_conn = None;
        path.io_auth = None;
        path.retired.push((ckey, link, path.io_generation));
        self.event(format_args!("path {p} reset ({why}): its I/O queue (link {link}) is left to the block core"));
    }

    /// Path `p`'s I/O queues of older associations: their completions go to the core;
    /// one that failed (the core's tick) or lost its link is failed over and closed.
    fn service_retired(&mut self, p: usize) {
        let mut i = 0;
        while i < self.paths[p].retired.len() {
            let (ckey, link, _) = self.paths[p].retired[i];
            let now = self.at();
            let mut control = Vec::new();
            self.core.deliver(ckey, false, now, |d| control.push(d));
            self.core.dispatch_after_service(self.qkeys[p], now);
            self.flush_decided();
            // A re-authentication's commands end with their transaction, dropped at the reset.
            if let Some(d) = control.iter().find(|d| d.token != TOKEN_AUTH) {
                let what = format!("path {p}: a control completion (token {}) no authentication sent", d.token);
                self.violate(what);
                return;
            }
            self.take_completions();
            let failed = self.core.queue_mut(ckey).is_none_or(|q| q.state() == QueueState::Failed);
            if failed || self.link_lost(link) {
                self.paths[p].retired.swap_remove(i);
                self.close_retired(p, ckey, link, "connection lost");
            } else {
                i += 1;
            }
        }
    }

    /// Fails, frees and closes an I/O queue of an older association of path `p`.
    fn close_retired(&mut self, p: usize, ckey: usize, link: usize, why: &str) {
        self.fail_io_conn(p, ckey, why);
        self.event(format_args!("path {p}: its old I/O queue (link {link}) closed"));
        self.close_link(link);
        self.take_completions();
    }

    /// Fails and frees path `p`'s I/O connection `ckey` as `Context` fails a connection:
    /// the queue gives its commands back with a path error, and the core fails them over,
    /// holds or requeues them. An authentication command ends with its transaction,
    /// dropped with the queue; any other control completion is a violation.
    fn fail_io_conn(&mut self, p: usize, ckey: usize, why: &str) {
        if let Some(q) = self.core.queue_mut(ckey)
            && q.state() != QueueState::Failed
        {
            q.set_failed(why);
        }
        let now = self.at();
        let mut control = Vec::new();
        if let Some(why) = self.core.abort_conn(ckey) {
            self.core.fail_conn(ckey, &why, now, |d| control.push(d));
        }
        self.core.free_conn(ckey);
        if let Some(d) = control.iter().find(|d| d.token != TOKEN_AUTH) {
            let what = format!("path {p}: a control completion (token {}) no authentication sent", d.token);
            self.violate(what);
        }
    }

    /// Drops path `p`'s association: its queues fail (their I/O is requeued or failed)
    /// and its connections close.
    fn tear_down(&mut self, p: usize, why: &str) {
        let path = &mut self.paths[p];
        path.phase = Phase::Down;
        // The bring-up and the scans end with their admin queue.
        path.bringup = None;
        path.bringup_wake_ns = None;
        path.scan = None;
        path.scan_for.clear();
        path.scan_sent_ns = None;
        // A new controller reads the namespace at its bring-up.
        path.event_owed = None;
        let mut links = Vec::new();
        if let Some(c) = path.io.take() {
            links.push(c.link);
        }
        let conn = path.io_conn.take();
        // A transaction under way on the I/O queue ends with it.
        path.io_auth = None;
        if let Some(c) = path.admin.take() {
            links.push(c.link);
        }
        // The core sees the path down before its commands fail over.
        self.view_changed(p);
        if let Some((ckey, link)) = conn {
            self.fail_io_conn(p, ckey, why);
            // This reset is the one it reports.
            let _ = self.paths[p].ctrl.take_io_failure();
            links.push(link);
        }
        for l in links {
            self.close_link(l);
        }
        self.take_completions();
    }

    /// The host closes a connection: its end resets (Linux closes with SO_LINGER 0), and
    /// the target's connection learns of it, unless the link toward the target is stalled
    /// (a partition): then the reset is lost and only the target's own timers (keep-alive)
    /// end that connection.
    fn close_link(&mut self, l: usize) {
        let rst_lost = self.links[l].to_target.stalled_until_ns > self.now;
        self.links[l].reset();
        self.links[l].host_closed = true;
        if rst_lost {
            self.event(format_args!("link {l}: the host's reset is lost in the partition"));
            return;
        }
        if let Some(i) = self.target.conns.iter().position(|t| t.link == l) {
            self.with_conn(i, |c, _| c.close("peer closed the connection"));
        }
    }

    /// Target connections whose host end is gone.
    fn orphans(&self) -> usize {
        self.target.conns.iter().filter(|t| self.links[t.link].host_closed || self.links[t.link].down).count()
    }

    /// Gives path `p`'s controller view the host's state now: the ANA state last read,
    /// and live while the controller is up with its I/O queue live.
    fn sync_ctrl(&mut self, p: usize) {
        let (phase, conn) = (self.paths[p].phase, self.paths[p].io_conn);
        let io_live = conn.and_then(|(k, _)| self.core.queue_mut(k)).is_some_and(|q| q.state() == QueueState::Live);
        let path = &self.paths[p];
        path.ctrl.set_state(path.ana, phase == Phase::Live && io_live);
    }

    /// Path `p`'s state changed (ANA read, up, down): its controller view follows and
    /// the core re-reads its paths at once, before it routes anything else.
    fn view_changed(&mut self, p: usize) {
        self.sync_ctrl(p);
        let now = self.at();
        self.core.refresh_all_paths(now);
    }

    /// The core's clock now.
    fn at(&self) -> Instant {
        self.base + Duration::from_nanos(self.now)
    }

    /// Acts on what the I/O side reported to path `p`'s controller: a reset, an ANA
    /// log read.
    fn take_ctrl_reports(&mut self, p: usize) {
        if let Some(why) = self.paths[p].ctrl.take_io_failure() {
            self.fail_path(p, &why);
        }
        if self.paths[p].ctrl.take_ana_refresh() {
            self.paths[p].ana = AnaState::Change;
            self.view_changed(p);
            self.paths[p].ctrl.machine().request_ana_refresh();
        }
        self.ctrl_step(p);
    }

    /// The production host's failover hold for a controller that identified itself
    /// with `id` (as the production `Controller` sets it at every (re)connect).
    fn failover_hold(id: &IdentifyController) -> std::time::Duration {
        host::failover::hold_time(host::failover::HoldInputs {
            kato_ms: KATO_MS,
            kas: id.kas,
            ctratt: id.ctratt,
            cqt_ms: id.cqt,
            quiesce_default: QUIESCE_DEFAULT,
        })
    }

    /// The target's ANA state of path `p`'s port can be told from its mark: the target's
    /// restarts so far and the ANA change count of the namespace's group on that port.
    /// `None` while the target is down.
    fn ana_mark(&self, p: usize) -> Option<(u64, u64)> {
        let state = self.target.state.as_ref()?;
        let port = state.port(self.paths[p].port)?;
        Some((self.sum.crashes, port.ana_group_chgcnt(ANA_GROUP)))
    }

    /// A scan (the bring-up's or the machine's) of path `p` starts: what the target has
    /// now, which its reads are checked against if it does not change meanwhile.
    fn mark_scan_start(&mut self, p: usize) {
        self.paths[p].ana_mark = self.ana_mark(p);
        self.paths[p].ns_mark = Some(self.ns_changes);
    }

    /// A scan (the bring-up's or the machine's) read ANA state `read` for the namespace
    /// through path `p`: if the target's state of that port did not change while the scan
    /// ran, the host must have read it as it is (the production scan's lookup of the
    /// namespace's group in the ANA log).
    fn check_ana_read(&mut self, p: usize, read: AnaState) {
        let Some(mark) = self.paths[p].ana_mark.take() else { return };
        if self.ana_mark(p) != Some(mark) {
            return;
        }
        let port = self.paths[p].port;
        let truth = self.target.state.as_ref().and_then(|s| s.port(port)).map(|pt| pt.ana_state(ANA_GROUP));
        if let Some(truth) = truth.filter(|&t| t != read) {
            self.violate(format!(
                "path {p} read ANA {} for the namespace while port {port} was {} throughout the read",
                read.linux_name(),
                truth.linux_name()
            ));
        }
    }

    /// Path `p`'s admin queue is up: the production bring-up starts on it.
    fn start_bringup(&mut self, p: usize) {
        let cfg = BringupConfig { want_queues: 1, queue_size: IO_ENTRIES };
        self.mark_scan_start(p);
        let path = &mut self.paths[p];
        path.bringup = Some(Bringup::new(cfg));
        path.phase = Phase::BringingUp;
        path.phase_since_ns = self.now;
        self.drive_bringup(p);
    }

    /// Does what path `p`'s bring-up hands out now: a command goes out on the admin
    /// queue, a pause is kept, the I/O queue starts to connect, or the association goes
    /// live (or fails).
    fn drive_bringup(&mut self, p: usize) {
        let now = self.now;
        let path = &mut self.paths[p];
        let Some(m) = path.bringup.as_mut() else { return };
        match m.poll(now) {
            Next::Command { mut io, what } => {
                io.token = TOKEN_BRINGUP;
                let sent = path.admin.as_mut().is_some_and(|c| c.q.submit(TAG_BRINGUP, io).is_ok());
                // Each step has an I/O timeout of its own (as `ADMIN_TIMEOUT` per command).
                path.phase_since_ns = now;
                self.event(format_args!("path {p} bring-up: {what}"));
                if !sent {
                    self.fail_path(p, &format!("{what} could not be sent"));
                }
            }
            Next::Wait => {}
            Next::Sleep { until_ns } => path.bringup_wake_ns = Some(until_ns),
            Next::ConnectIo { count, entries, max_in_capsule } => {
                if count != 1 {
                    self.violate(format!(
                        "path {p}: the bring-up asks for {count} I/O queues, the simulator asked for 1"
                    ));
                    return;
                }
                let cntlid = path.admin.as_ref().map_or(Cntlid(0), |c| c.q.cntlid());
                let link = self.new_link();
                self.accept(self.paths[p].port, link);
                let mut cfg = QueueConfig::io(1, entries, cntlid, NQN, HOSTNQN, HOSTID);
                cfg.digests = self.digests;
                cfg.max_in_capsule = max_in_capsule;
                let path = &mut self.paths[p];
                path.io = Some(HostConn { q: HostQueue::new(cfg), link, auth: None });
                path.phase = Phase::IoConnecting;
                path.phase_since_ns = self.now;
                self.event(format_args!("path {p} bring-up: I/O queue of {entries} entries (link {link})"));
            }
            Next::Done(b) => self.go_live(p, b),
            Next::Failed(e) => {
                let why = format!("bring-up failed: {e}");
                self.fail_path(p, &why);
            }
        }
    }

    /// The bring-up's pause (between CSTS reads) is over.
    fn bringup_wake(&mut self, p: usize) {
        self.paths[p].bringup_wake_ns = None;
        self.drive_bringup(p);
    }

    /// What path `p`'s scan found for the simulated namespace (`Some(None)`: not listed),
    /// checked against the target: while no namespace was removed or added from the scan's
    /// start to its end, it must have read the one the target has (identifiers and all), or
    /// its absence. Then checked before use as the production host's scan checks what it
    /// keeps: its size within what the operator may set, its blocks the disk's. `None`
    /// (after a violation) if not usable.
    fn the_namespace(&mut self, p: usize, namespaces: &[NsInfo]) -> Option<Option<NsInfo>> {
        let found = namespaces.iter().find(|n| n.nsid == NSID);
        if self.paths[p].ns_mark.take() == Some(self.ns_changes) && self.target.state.is_some() {
            let read = found.map(NsInfo::ids);
            let truth = self.target_ids();
            if read != truth {
                let show = |i: Option<NsIds>| i.map_or_else(|| "not listed".to_string(), |i| i.to_string());
                self.violate(format!(
                    "path {p}: the namespace scan read namespace 1 as {} while the target had {} throughout the scan",
                    show(read),
                    show(truth)
                ));
                return None;
            }
        }
        let Some(ns) = found else { return Some(None) };
        if !usize::try_from(ns.nsze).is_ok_and(|n| (MIN_BLOCKS..=MAX_BLOCKS).contains(&n)) {
            self.violate(format!("path {p}: Identify Namespace reports {} blocks", ns.nsze));
            return None;
        }
        if ns.block_size() as usize != BLOCK {
            self.violate(format!("path {p}: Identify Namespace reports {}-byte blocks", ns.block_size()));
            return None;
        }
        Some(Some(ns.clone()))
    }

    /// The host learns the namespace from a scan (`None`: not listed): its identifiers,
    /// size and ANA state.
    fn learn_namespace(&mut self, p: usize, ns: Option<&NsInfo>) {
        let was = self.paths[p].ctrl.namespace_ids(NSID);
        self.paths[p].ctrl.listed(ns);
        let now = self.paths[p].ctrl.namespace_ids(NSID);
        if was != now {
            match now {
                None => self.event(format_args!("path {p} reads: no namespace 1")),
                Some(i) if Some(i) == self.first_ids => self.event(format_args!("path {p} reads namespace 1")),
                Some(_) => self.event(format_args!("path {p} reads another namespace under NSID 1")),
            }
        }
        let Some(ns) = ns else { return };
        let (nsze, ana) = (ns.nsze, ns.ana_state);
        let n = nsze as usize;
        if n != self.host_blocks {
            self.event(format_args!("path {p} reads the namespace's size: {n} blocks"));
            self.host_blocks = n;
        }
        if ana != self.paths[p].ana {
            self.event(format_args!("path {p} reads ANA {}", ana.linux_name()));
        }
        self.paths[p].ana = ana;
        self.paths[p].next_ana_poll_ns = self.now + ANA_POLL_NS;
    }

    /// The bring-up finished: the host knows the namespace, the I/O queue goes to the
    /// block core (as the production controller hands `Context` a queue it connected),
    /// and the machine is told the association is live.
    fn go_live(&mut self, p: usize, b: Brought) {
        let Some(found) = self.the_namespace(p, &b.namespaces) else { return };
        match &found {
            Some(ns) => self.check_ana_read(p, ns.ana_state),
            None => self.paths[p].ana_mark = None,
        }
        let path = &mut self.paths[p];
        path.bringup = None;
        let cntlid = path.admin.as_ref().map_or(Cntlid(0), |c| c.q.cntlid());
        path.ctrl.enabled(cntlid.0, World::failover_hold(&b.id));
        path.id = Some(b.id);
        let Some(c) = path.io.take() else {
            self.violate(format!("path {p}: the bring-up finished without its I/O queue"));
            return;
        };
        path.phase = Phase::Live;
        self.learn_namespace(p, found.as_ref());
        // As the controller hands `Context` a queue it connected: installed under the
        // controller's generation, its waiting requests go out on it.
        let generation = self.paths[p].ctrl.generation();
        // NVMe Base 2.x §3.9: a new association; the core tells the queues of the old one
        // by their older generation (and fails them at its tick).
        if let Some(&(_, l, g)) = self.paths[p].retired.iter().find(|r| r.2 >= generation) {
            self.violate(format!(
                "path {p}: its new association has generation {generation}, not newer than the \
                 old I/O queue (link {l}, generation {g}) the block core still holds"
            ));
            return;
        }
        // The core has not ticked since the reset: its old queues go now, before the new
        // one takes their place.
        for (ckey, l, _) in std::mem::take(&mut self.paths[p].retired) {
            self.close_retired(p, ckey, l, "controller reset");
        }
        let now = self.at();
        let ckey = self.core.install(self.qkeys[p], c.q, generation, now);
        self.paths[p].io_conn = Some((ckey, c.link));
        self.paths[p].io_generation = generation;
        self.paths[p].io_auth = c.auth;
        self.event(format_args!("path {p} live"));
        let ctrl = Arc::clone(&self.paths[p].ctrl);
        ctrl.machine().on_connected(self.now, Ok(()));
        self.view_changed(p);
        self.ctrl_step(p);
        self.flush_path(p);
    }

    /// The controller machine asks for an ANA re-read or a rescan: the production
    /// namespace scan runs (after the one under way, if any); with no live association
    /// to run it on, the command fails at once.
    fn start_scan(&mut self, p: usize, cmd: host::controller::AdminCmd) {
        let path = &mut self.paths[p];
        let Some(id) = path.id.as_ref().filter(|_| path.admin.is_some() && path.phase == Phase::Live) else {
            path.ctrl.machine().on_admin_done(cmd, false);
            return;
        };
        path.scan_for.push(cmd);
        if path.scan.is_none() {
            let rescan = cmd == host::controller::AdminCmd::Rescan;
            path.scan = Some(Box::new(if rescan { NsScan::rescan(id) } else { NsScan::new(id) }));
            self.mark_scan_start(p);
            self.drive_scan(p);
        }
    }

    /// Does what path `p`'s scan hands out now.
    fn drive_scan(&mut self, p: usize) {
        let path = &mut self.paths[p];
        let Some(scan) = path.scan.as_mut() else { return };
        match scan.poll(self.now) {
            Next::Command { mut io, .. } => {
                io.token = TOKEN_SCAN;
                if path.admin.as_mut().is_some_and(|c| c.q.submit(TAG_SCAN, io).is_ok()) {
                    path.scan_sent_ns = Some(self.now);
                } else {
                    self.scan_done(p, None);
                }
            }
            Next::Done(ns) => self.scan_done(p, Some(ns)),
            Next::Failed(e) => {
                self.event(format_args!("path {p}: the namespace scan failed: {e}"));
                self.scan_done(p, None);
            }
            Next::Wait | Next::Sleep { .. } | Next::ConnectIo { .. } => {}
        }
    }

    /// Path `p`'s scan ended (`None`: failed): the machine's command it answers is done,
    /// the host learns what it found, and the next scan queued starts.
    fn scan_done(&mut self, p: usize, found: Option<Vec<NsInfo>>) {
        let path = &mut self.paths[p];
        path.scan_sent_ns = None;
        let Some(scan) = path.scan.take() else { return };
        if path.scan_for.is_empty() {
            self.violate(format!("path {p}: a namespace scan ended that no command of the controller asked for"));
            return;
        }
        let cmd = path.scan_for.remove(0);
        if let Some(list) = scan.changed() {
            let list: Vec<u32> = list.iter().map(|n| n.0).collect();
            // NVMe Base 2.x §5.16.1.5: a change while the event was masked (until this read)
            // is in the list; the Identify behind this read sees it.
            if list.contains(&NSID.0) {
                self.paths[p].event_owed = None;
            }
            self.event(format_args!("path {p} changed namespaces {list:?}"));
        }
        let learned = match found {
            Some(ns) => self.the_namespace(p, &ns),
            None => None,
        };
        if self.violation.is_some() {
            return;
        }
        self.paths[p].ctrl.machine().on_admin_done(cmd, learned.is_some());
        match learned {
            Some(found) => {
                match &found {
                    Some(ns) => self.check_ana_read(p, ns.ana_state),
                    None => self.paths[p].ana_mark = None,
                }
                if self.violation.is_some() {
                    return;
                }
                self.learn_namespace(p, found.as_ref());
                self.view_changed(p);
            }
            None => self.event(format_args!("path {p}: the namespace scan ({cmd:?}) could not be read")),
        }
        if let Some(&next) = self.paths[p].scan_for.first() {
            self.paths[p].scan_for.remove(0);
            self.start_scan(p, next);
        }
    }

    fn admin_done(&mut self, p: usize, d: Done) {
        match d.token {
            TOKEN_BRINGUP => {
                let Some(m) = self.paths[p].bringup.as_mut() else {
                    self.violate(format!("path {p}: a bring-up completion with no bring-up under way"));
                    return;
                };
                m.on_done(self.now, &d);
                self.drive_bringup(p);
            }
            TOKEN_SCAN => {
                let path = &mut self.paths[p];
                path.scan_sent_ns = None;
                let Some(scan) = path.scan.as_mut() else {
                    self.violate(format!("path {p}: a scan completion with no scan under way"));
                    return;
                };
                scan.on_done(&d);
                self.drive_scan(p);
            }
            TOKEN_KA => {
                let ok = d.cqe.status.is_success();
                self.paths[p].ctrl.machine().on_admin_done(host::controller::AdminCmd::KeepAlive, ok);
            }
            TOKEN_AER if d.cqe.status.is_success() => {
                let ev = nvme::features::AsyncEvent::from_dw0(d.cqe.dw0);
                self.event(format_args!("path {p} event {ev:?}"));
                if ev == nvme::features::AsyncEvent::NS_CHANGED {
                    self.paths[p].event_owed = None;
                }
                // The machine re-arms the request and rescans on a namespace notice.
                self.paths[p].ctrl.machine().on_event(ev);
            }
            TOKEN_AER => {
                let aer = host::controller::AdminCmd::AsyncEventRequest;
                self.paths[p].ctrl.machine().on_admin_done(aer, false);
            }
            t => self.violate(format!("path {p}: an admin completion carries token {t}, which no command had")),
        }
    }

    /// Whether the event request went out.
    fn arm_event(&mut self, p: usize) -> bool {
        let io = Io { sqe: Sqe::async_event_request(Cid(0)), buf: None, len: 0, dir: DataDir::None, token: TOKEN_AER };
        self.paths[p].admin.as_mut().is_some_and(|c| c.q.submit(TAG_AER, io).is_ok())
    }

    /// Sends what the block core gave path `p`'s I/O queue, watching the commands that
    /// go out: each must be for a request the core has on the wire there, and the path
    /// must be one the host may send on (checked against the host's own view, its last
    /// ANA log read and its queues, not through the core's classes, so a wrong class is
    /// caught too).
    fn flush_io(&mut self, p: usize) {
        let Some((ckey, link)) = self.paths[p].io_conn else { return };
        self.flush_conn(p, ckey, link);
    }

    /// Sends what the core's connection `ckey` of path `p` queued over `link` (a link that
    /// is down fails the send), checking each command capsule as it goes.
    fn flush_conn(&mut self, p: usize, ckey: usize, link: usize) {
        while let Some(msg) = self.core.queue_mut(ckey).and_then(HostQueue::take_send) {
            let bytes = msg.to_vec();
            let down = self.links[link].down;
            if !down {
                self.links[link].to_target.send(&bytes, self.now, &mut self.net_rng);
            }
            let r = if down { Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)) } else { Ok(()) };
            if let Some(q) = self.core.queue_mut(ckey) {
                q.on_send_done(msg, r);
            }
            if !down {
                self.commands_sent(p, ckey, &bytes);
            }
        }
    }

    /// Sends what path `p`'s I/O queues of older associations queued (the data of writes
    /// in flight there; a new command there is checked as any other, and breaks the rule
    /// that commands go only on a live path).
    fn flush_retired(&mut self, p: usize) {
        for i in 0..self.paths[p].retired.len() {
            let (ckey, link, _) = self.paths[p].retired[i];
            self.flush_conn(p, ckey, link);
        }
    }

    /// The command capsules in bytes path `p`'s I/O queue sent (its sends carry whole PDUs).
    fn commands_sent(&mut self, p: usize, ckey: usize, mut b: &[u8]) {
        // A re-authentication's commands go under the queue's reserved tag: no request's.
        let control_tag = self.core.queue_mut(ckey).map(|q| q.control_tag());
        while let Some(ch) = CommonHeader::peek(b) {
            let plen = ch.plen as usize;
            if plen < 12 || plen > b.len() {
                return;
            }
            if ch.pdu_type == PduType::CapsuleCmd as u8 {
                let cid = u16::from_le_bytes([b[10], b[11]]);
                if Some(cid) != control_tag {
                    self.command_sent(p, ckey, cid);
                }
                if self.violation.is_some() {
                    return;
                }
            }
            b = &b[plen..];
        }
    }

    fn command_sent(&mut self, p: usize, ckey: usize, cid: u16) {
        let Some(ri) = self.core.token_on_wire(ckey, cid).map(|t| t as usize).filter(|&ri| ri < self.reqs.len()) else {
            self.violate(format!("path {p}: command {cid} went out for no request the host has on the wire"));
            return;
        };
        let (ana, phase) = (self.paths[p].ana, self.paths[p].phase);
        if !ana.is_accessible() || phase != Phase::Live {
            self.violate(format!("I/O {ri} was sent on path {p}, whose namespace is {} ({phase:?})", ana.linux_name()));
            return;
        }
        if self.reqs[ri].state == RState::Done {
            self.violate(format!("I/O {ri} was sent on path {p} after it completed"));
            return;
        }
        let r = &mut self.reqs[ri];
        r.sends += 1;
        r.state = RState::Inflight { path: p, tag: cid };
        r.sent_preempted = (self.reservations && !self.resv_ours).then_some(self.resv_epoch);
        (r.room, r.low, r.cut) = (self.ns_blocks, self.ns_blocks, false);
        r.ns_gone = self.ns_on_target != NsOnTarget::Original;
        let sends = r.sends;
        if sends > 1 {
            self.sum.requeues += 1;
            self.event(format_args!("io {ri} sent again ({sends}) on path {p} tag {cid}"));
        } else {
            self.event(format_args!("io {ri} sent on path {p} tag {cid}"));
        }
    }

    /// What the block core queued on any path while it handled a delivery goes out now,
    /// checked against the host's view of that path as the core saw it when it decided
    /// (a completion later in the same delivery may ask for an ANA read, which turns the
    /// view to "change": seed 334 at 20,000 steps).
    fn flush_decided(&mut self) {
        for q in 0..self.paths.len() {
            self.flush_io(q);
            self.flush_retired(q);
        }
    }

    /// Hands the core path `p`'s I/O completions (after bytes came in or a send
    /// finished), then fails the path if its queue failed or its link is gone.
    fn service_io(&mut self, p: usize) {
        let Some((ckey, link)) = self.paths[p].io_conn else { return };
        let now = self.at();
        let mut control = Vec::new();
        self.core.deliver(ckey, false, now, |d| control.push(d));
        self.core.dispatch_after_service(self.qkeys[p], now);
        self.flush_decided();
        // The queue's reserved tag carries only a re-authentication's commands.
        for d in control {
            if d.token == TOKEN_AUTH {
                self.auth_done(p, false, d);
            } else {
                self.violate(format!("path {p}: a control completion (token {}) no authentication sent", d.token));
                return;
            }
        }
        self.take_completions();
        let failed = self
            .core
            .queue_mut(ckey)
            .filter(|q| q.state() == QueueState::Failed)
            .map(|q| q.error().unwrap_or("queue failed").to_string());
        if let Some(why) = failed {
            self.auth_cut_off(p);
            self.fail_path(p, &why);
        } else if self.link_lost(link) {
            self.auth_cut_off(p);
            self.fail_path(p, "connection lost");
        }
    }

    /// The connections the core touched (a tick's timeout, a failure): serviced.
    fn service_touched(&mut self) {
        for _ in 0..4 {
            let touched = self.core.take_touched();
            if touched.is_empty() {
                return;
            }
            for ckey in touched {
                if let Some(p) = self.paths.iter().position(|x| x.io_conn.is_some_and(|(k, _)| k == ckey)) {
                    self.service_io(p);
                } else if let Some(p) = self.paths.iter().position(|x| x.retired.iter().any(|r| r.0 == ckey)) {
                    self.service_retired(p);
                }
            }
        }
    }

    /// Once per turn, as `Context::poll`: the core follows the namespace's size and the
    /// paths, and the application learns the device's size.
    fn sync_core(&mut self) {
        for p in 0..self.paths.len() {
            self.sync_ctrl(p);
        }
        let now = self.at();
        self.core.refresh_sizes();
        self.core.refresh_all_paths(now);
        for a in self.core.take_attaches() {
            // The head's slots never change: every path has its queue from the start.
            let what = format!("the core asks for a queue of path slot {} it has", a.slot);
            self.violate(what);
        }
        let _ = self.core.take_stalls();
        let blocks = self.core.capacity(self.dev).map_or(0, |n| n as usize);
        if blocks != self.host_blocks {
            self.event(format_args!("the host's device has {blocks} blocks"));
            self.host_blocks = blocks;
        }
    }

    /// What the core completed goes to the application.
    fn take_completions(&mut self) {
        let done: Vec<host::context::Completion> = self.core.completions().collect();
        for c in done {
            let ri = usize::try_from(c.token).unwrap_or(usize::MAX);
            if ri >= self.reqs.len() {
                self.violate(format!("a completion carries token {}, which no I/O had", c.token));
                return;
            }
            self.reqs[ri].buf = c.buf;
            if self.reqs[ri].op != ROp::Flush && self.reqs[ri].buf.is_none() {
                self.violate(format!("I/O {ri}: its buffer did not come back with its completion"));
            }
            self.app_done(ri, c.status);
        }
    }

    // --------------------------------------------------------------------- app

    fn app_submit(&mut self) {
        let roll = self.rng.below(100);
        let nlb = 1 + self.rng.index(MAX_NLB);
        let lba = self.rng.index(self.host_blocks - nlb + 1);
        // A share of the writes go with FUA: durable at their acknowledgement (the oracle
        // counts them so), through the target's real FUA path (its write, then its sync).
        let op = match roll {
            0..45 => ROp::Write { fua: self.rng.chance(300_000) },
            45..92 => ROp::Read,
            _ => ROp::Flush,
        };
        self.start(op, lba, nlb);
    }

    /// Starts an application I/O if its blocks are free; whether it started.
    fn start(&mut self, op: ROp, lba: usize, nlb: usize) -> bool {
        let blocks = lba..lba + nlb;
        if op != ROp::Flush && self.busy[blocks.clone()].iter().any(|&b| b) {
            return false;
        }
        let ri = self.reqs.len();
        let mut wid = 0;
        let buf = match op {
            ROp::Flush => None,
            ROp::Read => Some(IoBuf::new((nlb * BLOCK).next_multiple_of(4096))),
            ROp::Write { .. } => {
                wid = self.next_wid;
                self.next_wid += 1;
                let mut b = IoBuf::new((nlb * BLOCK).next_multiple_of(4096));
                let mut block = [0u8; BLOCK];
                for k in blocks.clone() {
                    block[..8].copy_from_slice(&wid.to_le_bytes());
                    block[8..16].copy_from_slice(&(k as u64).to_le_bytes());
                    block[16..].fill(wid as u8);
                    b.extend_from_slice(&block);
                }
                Some(b)
            }
        };
        if op != ROp::Flush {
            self.busy[blocks].fill(true);
        }
        self.seq += 1;
        self.reqs.push(Req {
            op,
            lba,
            nlb,
            wid,
            buf,
            state: RState::Queued,
            sends: 0,
            submit_seq: self.seq,
            sent_preempted: None,
            room: 0,
            low: 0,
            cut: false,
            ns_gone: false,
        });
        self.active += 1;
        self.event(format_args!("io {ri} {op:?} lba {lba} nlb {nlb} wid {wid}"));
        let (cop, len) = match op {
            ROp::Flush => (Op::Flush, 0),
            ROp::Read => (Op::Read, nlb * BLOCK),
            ROp::Write { fua: false } => (Op::Write, nlb * BLOCK),
            ROp::Write { fua: true } => (Op::WriteFua, nlb * BLOCK),
        };
        let buf = self.reqs[ri].buf.take();
        let now = self.at();
        match self.core.submit(self.dev, 0, cop, (lba * BLOCK) as u64, len as u32, buf, ri as u64, now) {
            Err((e, buf)) if e.kind == host::ErrorKind::NamespaceGone => {
                self.reqs[ri].buf = buf;
                self.refused(ri, &e.context);
            }
            Err((e, buf)) => {
                self.reqs[ri].buf = buf;
                self.violate(format!(
                    "the host's block core refused I/O {ri} ({op:?}, blocks {lba}..{}): {e}",
                    lba + nlb
                ));
            }
            Ok(()) if self.refused_replaced => {
                self.violate(format!(
                    "the host took I/O {ri} ({op:?}) though its device refused I/O before because another namespace \
                     is under its NSID"
                ));
            }
            Ok(()) => {}
        }
        true
    }

    /// The host refused application I/O `ri` at submission, its namespace gone (`why`): it
    /// ends there (counted, never completed later). Checked: only after the operator
    /// removed the namespace; "replaced" only once another namespace is under its NSID, and
    /// for good from then on; "removed" never once the same namespace is back and every
    /// path's controller lists it again.
    fn refused(&mut self, ri: usize, why: &str) {
        let r = &mut self.reqs[ri];
        r.state = RState::Done;
        let (op, lba, nlb) = (r.op, r.lba, r.nlb);
        if op != ROp::Flush {
            self.busy[lba..lba + nlb].fill(false);
        }
        self.active -= 1;
        self.sum.refused += 1;
        self.app_pause_until = self.now + APP_BACKOFF_NS;
        self.event(format_args!("io {ri} refused: {why}"));
        let replaced = why.contains("replaced");
        if self.sum.ns_removals == 0 {
            self.violate(format!("the host refused I/O {ri} though the namespace was never removed: {why}"));
        } else if replaced && self.sum.ns_replacements == 0 {
            self.violate(format!(
                "the host refused I/O {ri} as if its namespace were replaced, though the target only removed it: {why}"
            ));
        } else if replaced {
            self.refused_replaced = true;
        } else if self.ns_on_target == NsOnTarget::Original
            && self.paths.iter().any(|p| p.phase == Phase::Live)
            && self.paths.iter().all(|p| {
                let dead = p.ctrl.machine().state() == host::controller::CtrlState::Dead;
                dead || (p.phase == Phase::Live && p.ctrl.namespace_ids(NSID) == self.first_ids)
            })
        {
            self.violate(format!(
                "the host refused I/O {ri} though namespace 1 is back and every path's controller lists it with the \
                 identifiers the device was opened on: {why}"
            ));
        }
    }

    fn app_done(&mut self, ri: usize, status: Status) {
        self.seq += 1;
        self.active -= 1;
        self.sum.ios += 1;
        let r = &mut self.reqs[ri];
        if r.state == RState::Done {
            self.violate(format!("I/O {ri} completed twice to the application"));
            return;
        }
        r.state = RState::Done;
        let (op, lba, nlb, wid, submit_seq) = (r.op, r.lba, r.nlb, r.wid, r.submit_seq);
        if op != ROp::Flush {
            self.busy[lba..lba + nlb].fill(false);
        }
        self.event(format_args!("io {ri} done {status}"));
        let (room, low, cut, ns_gone) =
            (self.reqs[ri].room, self.reqs[ri].low, self.reqs[ri].cut, self.reqs[ri].ns_gone);
        let end = lba + nlb;
        if status.is_success() && op != ROp::Flush && end > room {
            self.violate(format!(
                "I/O {ri} (blocks {lba}..{end}) succeeded, though the namespace had at most {room} blocks from its send \
                 to its completion"
            ));
            return;
        }
        if status.is_success() && cut {
            self.violate(format!(
                "write {wid} (I/O {ri}, blocks {lba}..{end}) succeeded, though a shrink cut blocks of it off while it \
                 was in flight: the data acknowledged is not kept"
            ));
            return;
        }
        if status == Status::LBA_OUT_OF_RANGE {
            if op == ROp::Flush || end <= low {
                self.violate(format!(
                    "I/O {ri} (blocks {lba}..{end}) was refused as out of range, though the namespace had {low} \
                     blocks or more from its send to its completion"
                ));
                return;
            }
        } else if !status.is_success()
            && !status.is_path_error()
            && status != Status::RESERVATION_CONFLICT
            && (status != Status::INVALID_NS || !ns_gone)
            && (op == ROp::Flush || end <= low)
        {
            self.violate(format!("I/O {ri} ({op:?}, blocks {lba}..{end}, within the namespace) failed: {status}"));
            return;
        }
        if !status.is_success() {
            self.sum.io_errors += 1;
            if status == Status::LBA_OUT_OF_RANGE && self.reqs[ri].sends <= 1 {
                // NVMe Base 2.x §3.3.3.2.1 (LBA Out of Range): the command did nothing.
                if let ROp::Write { .. } = op
                    && self.disk.executed(wid)
                {
                    self.violate(format!(
                        "write {wid} (I/O {ri}) was refused as out of range but the disk executed it"
                    ));
                }
                return;
            }
            if status == Status::INVALID_NS && self.reqs[ri].sends <= 1 {
                // Sent once, to an NSID the target had no namespace under: nothing ran, so
                // the blocks keep what they held (the oracle is unchanged across the gap).
                if let ROp::Write { .. } = op
                    && (self.disk.executed(wid) || self.other.as_ref().is_some_and(|o| o.disk.executed(wid)))
                {
                    self.violate(format!(
                        "write {wid} (I/O {ri}) was refused with Invalid Namespace but a disk executed it"
                    ));
                }
                return;
            }
            if status == Status::RESERVATION_CONFLICT {
                // NVMe Base 2.x §8.1.22: a command refused for a conflict did nothing.
                let failovers = self.reqs[ri].sends.saturating_sub(1);
                match op {
                    ROp::Read => {
                        self.violate(format!(
                            "read (I/O {ri}) refused for a reservation conflict: Write Exclusive allows reads"
                        ));
                        return;
                    }
                    ROp::Write { .. } if failovers == 0 => {
                        if self.disk.executed(wid) {
                            self.violate(format!(
                                "write {wid} (I/O {ri}) was refused for a reservation conflict but the disk executed it"
                            ));
                        }
                        // Not executed: the blocks keep what they held (no uncertainty).
                        return;
                    }
                    _ => {}
                }
            }
            if let ROp::Write { .. } = op {
                // An earlier attempt (lost with its connection) may have landed.
                self.oracle.write_uncertain(lba..lba + nlb, wid);
            }
            return;
        }
        match op {
            ROp::Write { fua } => {
                if !self.disk.executed(wid) {
                    self.violate(format!("write {wid} (I/O {ri}) was acknowledged but no path executed it"));
                }
                if self.reqs[ri].sent_preempted == Some(self.resv_epoch) {
                    self.violate(format!(
                        "write {wid} (I/O {ri}) succeeded, though another host held the reservation (Write \
                         Exclusive) from its send to its completion"
                    ));
                }
                self.oracle.write_acked(lba..lba + nlb, wid, fua, self.seq);
            }
            ROp::Flush => self.oracle.flushed(submit_seq),
            ROp::Read => self.check_read(ri),
        }
    }

    fn check_read(&mut self, ri: usize) {
        let r = &self.reqs[ri];
        let Some(buf) = r.buf.as_ref() else { return };
        let data = buf.as_full();
        for k in 0..r.nlb {
            let blk = r.lba + k;
            let b = &data[k * BLOCK..(k + 1) * BLOCK];
            let wid = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
            let lba = u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8]));
            let whole = if wid == 0 {
                b.iter().all(|&x| x == 0)
            } else {
                lba == blk as u64 && b[16..].iter().all(|&x| x == wid as u8)
            };
            let allowed = self.oracle.allowed(blk);
            if !whole || !allowed.contains(&wid) {
                let what = format!(
                    "read (I/O {ri}) of block {blk} returned write {wid}{}; the block may hold only {allowed:?}",
                    if whole { "" } else { " (torn or misplaced)" }
                );
                self.violate(what);
                return;
            }
        }
    }

    // ---------------------------------------------------------------- schedule

    fn actions(&mut self, out: &mut Vec<Action>) {
        out.clear();
        for (i, l) in self.links.iter().enumerate() {
            if l.down {
                continue;
            }
            if l.to_target.ready(self.now) {
                out.push(Action::Deliver(i, Dir::ToTarget));
            }
            if l.to_host.ready(self.now) {
                out.push(Action::Deliver(i, Dir::ToHost));
            }
        }
        out.extend(self.disk.due().into_iter().map(Action::Disk));
        if let Some(o) = &self.other {
            out.extend(o.disk.due().into_iter().map(Action::OtherDisk));
        }
        for (i, t) in self.target.conns.iter().enumerate() {
            if t.conn.next_timer().is_some_and(|d| d <= self.now) {
                out.push(Action::Timers(i));
            }
            if t.next_tick_ns <= self.now {
                out.push(Action::Tick(i));
            }
        }
        if self.to_issue > 0 && self.active < APP_DEPTH && self.now >= self.app_pause_until {
            out.push(Action::Submit);
        }
        for (p, path) in self.paths.iter().enumerate() {
            if path.phase == Phase::Live && !path.ana.is_accessible() && path.next_ana_poll_ns <= self.now {
                out.push(Action::AnaPoll(p));
            }
            if path.ctrl.machine().next_deadline().is_some_and(|t| t <= self.now) {
                out.push(Action::Ctrl(p));
            }
            if path.bringup_wake_ns.is_some_and(|t| t <= self.now) {
                out.push(Action::Bringup(p));
            }
        }
        if self.target.restart_at_ns.is_some_and(|t| t <= self.now) {
            out.push(Action::Restart);
        }
        if self.next_core_tick_ns <= self.now {
            out.push(Action::CoreTick);
        }
        if let Some(a) = &self.auth {
            if self.faults
                && self.opts.faults.has(Fault::KeyRotation)
                && a.rotate_at_step.is_some_and(|s| self.step >= s)
            {
                out.push(Action::RotateKeys);
            }
            if a.host_update_at.is_some_and(|t| t <= self.now) {
                out.push(Action::HostKeys);
            }
        }
        if self.faults && self.rng.chance(20_000) {
            out.push(Action::Fault);
        }
        // Both digests cover every byte a receiver acts on (the ICReq/ICResp exchange
        // aside, which carries no command): a flipped bit must be caught, never used.
        if self.faults
            && self.opts.faults.has(Fault::BitFlip)
            && self.digests.header
            && self.digests.data
            && self.flip_rng.chance(3_000)
        {
            out.push(Action::BitFlip);
        }
    }

    fn next_due(&self) -> Option<u64> {
        let links = self.links.iter().filter(|l| !l.down).flat_map(|l| [l.to_target.next_due(), l.to_host.next_due()]);
        let conns = self.target.conns.iter().flat_map(|t| [t.conn.next_timer(), Some(t.next_tick_ns)]);
        let paths = self.paths.iter().map(|p| match p.phase {
            Phase::Live if !p.ana.is_accessible() => Some(p.next_ana_poll_ns),
            _ => None,
        });
        let ka = self.paths.iter().flat_map(|p| [p.ctrl.machine().next_deadline(), p.bringup_wake_ns]);
        links
            .chain(conns)
            .chain(paths)
            .chain(ka)
            .chain([self.disk.next_due(), self.target.restart_at_ns, Some(self.next_core_tick_ns), self.auth_due()])
            .chain([self.other.as_ref().and_then(|o| o.disk.next_due()), self.ns_back.map(|b| b.1)])
            .chain([(self.to_issue > 0).then_some(self.app_pause_until)])
            .flatten()
            .filter(|&t| t > self.now)
            .min()
    }

    fn run_action(&mut self, a: Action) {
        match a {
            Action::Deliver(l, Dir::ToTarget) => {
                let Some(i) = self.target.conns.iter().position(|t| t.link == l) else { return };
                let Some((mut buf, range)) = self.target.conns[i].conn.take_recv_buf() else { return };
                let n = self.links[l].to_target.recv(&mut buf.as_full_mut()[range], &mut self.net_rng);
                self.event(format_args!("link {l} -> target {n} bytes"));
                self.with_conn(i, |c, ctx| c.on_recv(buf, n, ctx));
            }
            Action::Deliver(l, Dir::ToHost) => {
                let Some((p, which)) = self.host_conn_of(l) else { return };
                let link = &mut self.links[l];
                let path = &mut self.paths[p];
                let q = match which {
                    HostEnd::Admin => path.admin.as_mut().map(|c| &mut c.q),
                    HostEnd::IoConnecting => path.io.as_mut().map(|c| &mut c.q),
                    HostEnd::Io(ckey) => self.core.queue_mut(ckey),
                };
                let Some(q) = q else { return };
                let Some((mut buf, range)) = q.take_recv_buf() else { return };
                let n = link.to_host.recv(&mut buf.as_full_mut()[range], &mut self.net_rng);
                q.on_recv(buf, n);
                self.event(format_args!("link {l} -> host {n} bytes"));
            }
            Action::Disk(i) | Action::OtherDisk(i) => {
                let disk = match (a, self.other.as_mut()) {
                    (Action::OtherDisk(_), Some(o)) => &mut o.disk,
                    _ => &mut self.disk,
                };
                let what = disk.describe(i);
                let (token, res, buf) = disk.complete(i);
                let id = token >> 16;
                let slot = (token & 0xffff) as u16;
                self.event(format_args!("disk {what} done (conn {id} slot {slot}) {:?}", res.as_ref().ok()));
                if let Some(i) = self.target.conns.iter().position(|t| t.id == id) {
                    self.with_conn(i, |c, ctx| c.on_file_done(slot, res, buf, ctx));
                }
            }
            Action::Timers(i) => self.with_conn(i, |c, ctx| c.on_timers(ctx)),
            Action::Tick(i) => {
                self.target.conns[i].next_tick_ns = self.now + TICK_NS;
                self.with_conn(i, |c, ctx| c.tick(ctx));
            }
            Action::Submit => {
                if self.app_submit_one() {
                    self.to_issue -= 1;
                }
            }
            Action::Ctrl(p) => self.ctrl_step(p),
            Action::Bringup(p) => {
                self.bringup_wake(p);
                self.flush_path(p);
            }
            Action::AnaPoll(p) => {
                // The simulator's own: a path whose namespace is not accessible re-reads
                // the ANA log (its target sends no ANA change notice).
                self.paths[p].next_ana_poll_ns = self.now + ANA_POLL_NS;
                self.paths[p].ctrl.machine().request_ana_refresh();
                self.ctrl_step(p);
            }
            Action::Restart => {
                self.event(format_args!("target restart"));
                self.start_target();
            }
            Action::Fault => self.fault(),
            Action::CoreTick => {
                self.next_core_tick_ns = self.now + CORE_TICK_NS;
                let now = self.at();
                self.core.tick(now);
            }
            Action::RotateKeys => self.rotate_keys(),
            Action::HostKeys => self.update_host_keys(),
            Action::BitFlip => {
                let live: Vec<usize> = (0..self.links.len()).filter(|&l| !self.links[l].down).collect();
                if live.is_empty() {
                    return;
                }
                let l = live[self.flip_rng.index(live.len())];
                let d = if self.flip_rng.chance(500_000) { Dir::ToHost } else { Dir::ToTarget };
                self.links[l].pipe(d).corrupt_next = true;
                self.event(format_args!("fault: link {l} {d:?} flips a bit of its next bytes"));
            }
        }
    }

    fn app_submit_one(&mut self) -> bool {
        let before = self.reqs.len();
        self.app_submit();
        self.reqs.len() > before
    }

    fn host_conn_of(&self, l: usize) -> Option<(usize, HostEnd)> {
        self.paths.iter().enumerate().find_map(|(p, path)| {
            if path.admin.as_ref().is_some_and(|c| c.link == l) {
                Some((p, HostEnd::Admin))
            } else if path.io.as_ref().is_some_and(|c| c.link == l) {
                Some((p, HostEnd::IoConnecting))
            } else if let Some(&(ckey, _, _)) = path.retired.iter().find(|r| r.1 == l) {
                Some((p, HostEnd::Io(ckey)))
            } else {
                path.io_conn.filter(|&(_, link)| link == l).map(|(ckey, _)| (p, HostEnd::Io(ckey)))
            }
        })
    }

    fn fault(&mut self) {
        let roll = self.rng.below(100);
        let family = match roll {
            0..30 => Fault::Reset,
            30..50 => Fault::Stall,
            50..60 => Fault::Crash,
            60..85 => Fault::Ana,
            _ => Fault::SlowDisk,
        };
        if self.opts.faults.has(family) && !self.link_or_target_fault(roll) {
            return;
        }
        if self.reservations && self.resv_rng.chance(100_000) {
            self.reservation_change();
        }
        if self.resizes && self.ns_rng.chance(100_000) {
            self.resize_namespace();
        }
        if self.outages && self.outage_rng.chance(50_000) {
            self.port_outage();
        }
        if self.ctrl_faults && self.ctrl_rng.chance(50_000) {
            self.admin_silence();
        }
    }

    /// The fault `fault` rolled (`roll` of 0..100): a link reset or stall, a target crash,
    /// an ANA change or a slow disk. False: nothing could be done (no live link, no
    /// target), and the fault's turn ends there.
    fn link_or_target_fault(&mut self, roll: u64) -> bool {
        match roll {
            0..30 => {
                let live: Vec<usize> = (0..self.links.len()).filter(|&l| !self.links[l].down).collect();
                if live.is_empty() {
                    return false;
                }
                let l = live[self.rng.index(live.len())];
                self.sum.resets += 1;
                self.event(format_args!("fault: link {l} reset"));
                self.links[l].reset();
                if let Some(i) = self.target.conns.iter().position(|t| t.link == l) {
                    self.with_conn(i, |c, _| c.close("peer closed the connection"));
                }
            }
            30..50 => {
                let live: Vec<usize> = (0..self.links.len()).filter(|&l| !self.links[l].down).collect();
                if live.is_empty() {
                    return false;
                }
                let l = live[self.rng.index(live.len())];
                let d = if self.rng.chance(500_000) { Dir::ToHost } else { Dir::ToTarget };
                let until = self.now + self.rng.range(1_000_000, 2_000_000_000);
                self.sum.stalls += 1;
                self.event(format_args!("fault: link {l} {d:?} stalls until {until}"));
                self.links[l].pipe(d).stalled_until_ns = until;
            }
            50..60 => {
                if self.target.state.is_some() {
                    self.crash_target();
                }
            }
            60..85 => {
                let Some(state) = self.target.state.clone() else { return false };
                let port = PORTS[self.rng.index(PORTS.len())];
                let s = [AnaState::Optimized, AnaState::NonOptimized, AnaState::Inaccessible, AnaState::Change]
                    [self.rng.index(4)];
                self.sum.ana_changes += 1;
                self.event(format_args!("fault: port {port} ANA {}", s.linux_name()));
                let _ = state.set_ana_state(port, ANA_GROUP, s);
            }
            _ => {
                self.disk.slow = !self.disk.slow;
                self.sum.slow_disk += u64::from(self.disk.slow);
                let slow = self.disk.slow;
                self.event(format_args!("fault: disk slow {slow}"));
            }
        }
        true
    }

    /// A path's admin link goes silent toward the host (the target gets the keep-alives
    /// and answers them; the answers wait), while its I/O link keeps flowing: only the
    /// keep-alive's expiry ends it, the block core's I/O timeout does not (mostly a path
    /// with no I/O in flight is chosen, where no I/O could time out anyway).
    fn admin_silence(&mut self) {
        let live: Vec<usize> = (0..self.paths.len()).filter(|&p| self.paths[p].phase == Phase::Live).collect();
        if live.is_empty() {
            return;
        }
        let idle: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&p| {
                let conn = self.paths[p].io_conn;
                conn.and_then(|(k, _)| self.core.queue_mut(k)).is_none_or(|q| q.outstanding() == 0)
            })
            .collect();
        let from = if idle.is_empty() || self.ctrl_rng.chance(200_000) { &live } else { &idle };
        let p = from[self.ctrl_rng.index(from.len())];
        let Some(l) = self.paths[p].admin.as_ref().map(|c| c.link) else { return };
        let until = self.now + self.ctrl_rng.range(ADMIN_SILENCE_NS.0, ADMIN_SILENCE_NS.1);
        let pipe = &mut self.links[l].to_host;
        pipe.stalled_until_ns = pipe.stalled_until_ns.max(until);
        self.sum.admin_silences += 1;
        self.event(format_args!("fault: path {p}'s admin link {l} silent toward the host until {until}"));
    }

    /// Both ports go silent at once for longer than `ctrl_loss_tmo`: every I/O must end
    /// with a path error once the host gives both controllers up, none may wait for ever.
    fn both_ports_silent(&mut self) {
        let until = self.now + self.ctrl_rng.range(BOTH_PORTS_NS.0, BOTH_PORTS_NS.1);
        self.sum.both_port_outages += 1;
        self.both_silent_until = until;
        self.event(format_args!("fault: both ports silent until {until}"));
        for i in 0..PORTS.len() {
            self.silence_port(i, until);
        }
    }

    /// A port goes silent for a while: every link of the path through it stalls both
    /// ways (so the host's resets are lost too), and new connections hang until it ends.
    fn port_outage(&mut self) {
        let i = self.outage_rng.index(PORTS.len());
        let until = self.now + self.outage_rng.range(500_000_000, OUTAGE_MAX_NS);
        self.silence_port(i, until);
    }

    /// Port `i` is silent until `until`: every link of its path, and every new one.
    fn silence_port(&mut self, i: usize, until: u64) {
        self.port_silent_until[i] = self.port_silent_until[i].max(until);
        self.event(format_args!("fault: port {} silent until {until}", PORTS[i]));
        let path = &self.paths[i];
        let links: Vec<usize> = [path.admin.as_ref(), path.io.as_ref()]
            .into_iter()
            .flatten()
            .map(|c| c.link)
            .chain(path.io_conn.map(|(_, l)| l))
            .chain(path.retired.iter().map(|&(_, l, _)| l))
            .collect();
        for l in links {
            let link = &mut self.links[l];
            link.to_target.stalled_until_ns = link.to_target.stalled_until_ns.max(until);
            link.to_host.stalled_until_ns = link.to_host.stalled_until_ns.max(until);
        }
    }

    /// The namespace that replaced the one the host's device was opened on gets nothing
    /// from that device: no write, and no other command either (the only host here is that
    /// device's).
    fn check_other_disk(&mut self) {
        let Some(o) = &self.other else { return };
        if o.disk.submitted > 0 {
            let (w, n) = (o.disk.writes, o.disk.submitted);
            self.violate(format!(
                "the namespace that replaced the device's under NSID 1 received {w} writes ({n} commands in all) from \
                 the device"
            ));
        }
    }

    /// The controller machine's deadlines, checked from outside: a live path whose
    /// controller has answered nothing for more than one and a half KATO (a keep-alive
    /// goes at half of it and expires a KATO later) has been reset; while no path is
    /// live, no I/O waits past `ctrl_loss_tmo` (plus a bring-up's timeout, which ends an
    /// attempt under way, and a tick of the block core).
    fn check_ctrl_deadlines(&mut self) {
        if self.paths.iter().any(|p| p.ctrl.machine().is_live()) {
            self.no_path_since = None;
        } else if self.no_path_since.is_none() {
            self.no_path_since = Some(self.now);
        }
        if let Some(t) = self.no_path_since {
            let bound = t + self.ctrl_loss_tmo.as_nanos() as u64 + IO_TIMEOUT_NS + 2 * CORE_TICK_NS + DEADLINE_SLACK_NS;
            if self.now > bound
                && let Some(ri) = self.reqs.iter().position(|r| r.state != RState::Done)
            {
                self.violate(format!(
                    "I/O {ri} still waits {} ms after every path became unusable (ctrl_loss_tmo {} ms)",
                    (self.now - t) / 1_000_000,
                    self.ctrl_loss_tmo.as_millis()
                ));
                return;
            }
        }
        let kato_ns = u64::from(KATO_MS) * 1_000_000;
        for p in 0..self.paths.len() {
            let path = &mut self.paths[p];
            let silent = path.admin.as_ref().map(|c| self.links[c.link].to_host.stalled_until_ns > self.now);
            path.silent_since = match (silent, path.silent_since) {
                (Some(true), Some(t)) => Some(t),
                (Some(true), None) => Some(self.now),
                _ => None,
            };
            if path.phase == Phase::Live
                && let Some(t) = path.silent_since
                && self.now - t > kato_ns * 3 / 2 + DEADLINE_SLACK_NS
            {
                self.violate(format!(
                    "path {p}: its controller has answered nothing for {} ms and the host still has it live \
                     (KATO {KATO_MS} ms)",
                    (self.now - t) / 1_000_000
                ));
                return;
            }
        }
    }

    /// After every action: each end sends what it queued, notices closed connections,
    /// and the host moves its paths and dispatches.
    fn settle(&mut self) {
        self.settle_target();
        for p in 0..self.paths.len() {
            self.settle_path(p);
        }
        self.service_touched();
        self.sync_core();
        for p in 0..self.paths.len() {
            self.take_ctrl_reports(p);
        }
        self.take_completions();
        if !self.faults
            && self.admin_silence_at.last().is_some_and(|&n| self.to_issue <= n)
            && self.paths.iter().any(|p| p.phase == Phase::Live)
        {
            self.admin_silence_at.pop();
            self.admin_silence();
        }
        if self.both_ports_at.is_some_and(|n| self.to_issue <= n) && self.active > 0 {
            self.both_ports_at = None;
            self.both_ports_silent();
        }
        if let Some(f) = self.ns_fault
            && self.to_issue <= f.at
            && self.target.state.is_some()
        {
            self.ns_fault = None;
            self.remove_ns(f);
        }
        self.ns_return();
        self.check_other_disk();
        self.check_ctrl_deadlines();
        // What the core queued goes out now.
        for p in 0..self.paths.len() {
            self.flush_path(p);
        }
        let _ = self.core.take_flushes();
    }

    fn settle_target(&mut self) {
        let mut i = 0;
        while i < self.target.conns.len() {
            let l = self.target.conns[i].link;
            while let Some(msg) = self.target.conns[i].conn.take_send() {
                let ok = !self.links[l].down;
                if ok {
                    self.links[l].to_host.send(&msg.to_vec(), self.now, &mut self.net_rng);
                }
                let r = if ok { Ok(()) } else { Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)) };
                self.with_conn(i, |c, ctx| c.on_send_done(msg, r, ctx));
            }
            let t = &self.target.conns[i];
            if t.conn.state() == ConnState::Closed && t.conn.file_ops_in_flight() == 0 {
                self.with_conn(i, |c, ctx| c.release(ctx));
                let t = self.target.conns.swap_remove(i);
                self.links[l].target_closed = true;
                self.sum.keep_alive_timeouts += u64::from(t.conn.close_reason() == Some("keep-alive timeout"));
                if t.conn.close_reason() == Some("in-band authentication failed") {
                    self.auth_refused_link(l);
                }
                self.event(format_args!("target conn {} on link {l} released: {:?}", t.id, t.conn.close_reason()));
                continue;
            }
            i += 1;
        }
    }

    fn flush_path(&mut self, p: usize) {
        self.flush_io(p);
        self.flush_retired(p);
        let path = &mut self.paths[p];
        for c in [path.admin.as_mut(), path.io.as_mut()].into_iter().flatten() {
            while let Some(msg) = c.q.take_send() {
                let link = &mut self.links[c.link];
                if link.down {
                    c.q.on_send_done(msg, Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
                } else {
                    link.to_target.send(&msg.to_vec(), self.now, &mut self.net_rng);
                    c.q.on_send_done(msg, Ok(()));
                }
            }
        }
    }

    fn link_lost(&self, l: usize) -> bool {
        let link = &self.links[l];
        link.down || (link.target_closed && link.to_host.is_empty())
    }

    fn settle_path(&mut self, p: usize) {
        self.flush_path(p);
        // Completions first: a queue that failed still hands back what completed.
        self.service_io(p);
        self.service_retired(p);
        let path = &mut self.paths[p];
        let admin_done: Vec<Done> =
            path.admin.as_mut().map(|c| c.q.completions().drain(..).collect()).unwrap_or_default();
        // The I/O queue's completions while it connects: only its authentication's.
        let io_done: Vec<Done> = path.io.as_mut().map(|c| c.q.completions().drain(..).collect()).unwrap_or_default();
        for d in io_done {
            if d.token == TOKEN_AUTH {
                self.auth_done(p, false, d);
            } else {
                self.violate(format!("path {p}: a completion (token {}) on an I/O queue still connecting", d.token));
                return;
            }
        }
        for d in admin_done {
            if d.token == TOKEN_AUTH {
                self.auth_done(p, true, d);
            } else {
                self.admin_done(p, d);
            }
        }
        let path = &self.paths[p];
        if path.phase == Phase::Down {
            return;
        }
        let lost = [path.admin.as_ref(), path.io.as_ref()].into_iter().flatten().any(|c| self.link_lost(c.link));
        let failed =
            [path.admin.as_ref(), path.io.as_ref()].into_iter().flatten().any(|c| c.q.state() == QueueState::Failed);
        if lost || failed {
            self.auth_cut_off(p);
            self.fail_path(p, if lost { "connection lost" } else { "queue failed" });
            return;
        }
        if !self.drive_auth(p, true) || !self.drive_auth(p, false) {
            return;
        }
        let path = &self.paths[p];
        // The admin reads' timeout (the I/O's is the block core's, at its tick; the keep-alive's
        // is the controller machine's, KATO).
        let oldest = path.scan_sent_ns;
        let stuck_bringup = path.phase != Phase::Live && self.now - path.phase_since_ns > IO_TIMEOUT_NS;
        if stuck_bringup || oldest.is_some_and(|t| self.now - t > IO_TIMEOUT_NS) {
            path.ctrl.report_io_failure("command timeout");
            self.take_ctrl_reports(p);
            return;
        }
        // An admin queue that works (a stalled one fails its keep-alive within one and a
        // half KATO: sent at half of it, expired a KATO later) carries the event well
        // within that and an I/O timeout.
        if let Some(t) = path.event_owed
            && self.now - t > u64::from(KATO_MS) * 1_500_000 + IO_TIMEOUT_NS
        {
            self.violate(format!(
                "path {p}: the namespace changed while its controller had the namespace-changed notice enabled, \
                 and no event came in {} ms",
                (self.now - t) / 1_000_000
            ));
            return;
        }
        let path = &mut self.paths[p];
        match path.phase {
            Phase::Connecting if path.admin.as_ref().is_some_and(|c| c.q.state() == QueueState::Live) => {
                self.start_bringup(p);
                self.flush_path(p);
            }
            Phase::IoConnecting if path.io.as_ref().is_some_and(|c| c.q.state() == QueueState::Live) => {
                path.phase = Phase::BringingUp;
                path.phase_since_ns = self.now;
                if let Some(m) = path.bringup.as_mut() {
                    m.io_connected();
                }
                self.drive_bringup(p);
                self.flush_path(p);
            }
            _ => {}
        }
    }

    // --------------------------------------------------------------------- run

    fn one_step(&mut self, acts: &mut Vec<Action>) -> bool {
        self.step += 1;
        STEP.set(self.step);
        self.now += self.rng.below(20_000);
        self.clock.store(self.now, Ordering::Relaxed);
        self.set_disk_clock();
        self.actions(acts);
        if acts.is_empty() {
            let Some(t) = self.next_due() else { return false };
            self.now = t;
            self.clock.store(self.now, Ordering::Relaxed);
            self.set_disk_clock();
            return true;
        }
        let a = acts[self.rng.index(acts.len())];
        self.run_action(a);
        self.settle();
        true
    }

    fn set_disk_clock(&mut self) {
        self.disk.now_ns = self.now;
        if let Some(o) = &mut self.other {
            o.disk.now_ns = self.now;
        }
    }

    fn heal(&mut self) {
        self.faults = false;
        self.disk.slow = false;
        for l in &mut self.links {
            l.to_target.stalled_until_ns = 0;
            l.to_host.stalled_until_ns = 0;
        }
        self.port_silent_until = [0; 2];
        if self.both_silent_until > self.now {
            for i in 0..PORTS.len() {
                self.silence_port(i, self.both_silent_until);
            }
        }
        if let Some(state) = &self.target.state {
            for port in PORTS {
                let _ = state.set_ana_state(port, ANA_GROUP, AnaState::Optimized);
            }
        }
        if self.reservations && !self.resv_ours {
            self.reservation_change();
        }
        self.event(format_args!("heal"));
    }

    fn idle(&self) -> bool {
        self.active == 0 && self.to_issue == 0
    }

    /// Runs the whole schedule: the fault phase, the heal and drain, a read of every
    /// block, and the final checks.
    pub fn run(&mut self) {
        let mut acts = Vec::new();
        while self.step < self.opts.steps && self.violation.is_none() {
            if !self.one_step(&mut acts) {
                break;
            }
        }
        self.heal();
        let deadline = self.now + DRAIN_NS;
        self.drain_steps = self.step + DRAIN_STEPS;
        self.drain(deadline, false, &mut acts);
        // Read every block back.
        let mut lba = 0;
        while lba < self.host_blocks && self.violation.is_none() {
            let nlb = MAX_NLB.min(self.host_blocks - lba);
            if self.start(ROp::Read, lba, nlb) {
                lba += nlb;
            } else if self.now >= deadline || self.step >= self.drain_steps {
                // An I/O that never completed holds these blocks: the final checks say which.
                break;
            }
            self.drain(deadline, false, &mut acts);
        }
        // The target's own timers end what the host's lost resets did not.
        self.drain(self.now + DRAIN_NS, true, &mut acts);
        self.final_checks();
        self.sum.steps = self.step;
        self.sum.virtual_ns = self.now;
        self.sum.bytes = self.links.iter().map(|l| l.to_target.bytes + l.to_host.bytes).sum();
        self.sum.bit_flips = self.links.iter().map(|l| l.to_target.flips + l.to_host.flips).sum();
    }

    /// Runs until the world is settled ([`World::settled`]), the deadline, or the step limit.
    fn drain(&mut self, deadline: u64, orphans: bool, acts: &mut Vec<Action>) {
        while !self.settled(orphans) && self.now < deadline && self.step < self.drain_steps && self.violation.is_none()
        {
            if !self.one_step(acts) {
                break;
            }
        }
    }

    /// The application is idle, every path is up (or given up) with nothing of its own
    /// under way, no link that is up is stalled, and, with `orphans`, no target connection
    /// of a closed link is left.
    fn settled(&self, orphans: bool) -> bool {
        self.idle()
            && self.paths.iter().all(|p| {
                // A controller given up (ctrl_loss_tmo) stays down: it is settled too.
                (p.phase == Phase::Live || p.ctrl.machine().state() == host::controller::CtrlState::Dead)
                    && p.scan.is_none()
                    && p.event_owed.is_none()
                    && p.retired.is_empty()
            })
            && !self.auth_busy()
            && self.ns_fault.is_none()
            && self.ns_back.is_none()
            && !self.silent_links()
            && (!orphans || self.orphans() == 0)
    }

    /// Whether a link still up is stalled (the heal ends every stall but those of the
    /// controller faults in the drain: an admin link's silence, both ports out), so the
    /// drain lets the host see it through.
    fn silent_links(&self) -> bool {
        self.links.iter().any(|l| !l.down && l.to_target.stalled_until_ns.max(l.to_host.stalled_until_ns) > self.now)
    }

    fn final_checks(&mut self) {
        if self.violation.is_some() {
            return;
        }
        if let Some(ri) = self.reqs.iter().position(|r| r.state != RState::Done) {
            self.violate(format!("I/O {ri} never completed ({:?})", self.reqs[ri].state));
            return;
        }
        if self.core.in_flight() != 0 {
            let n = self.core.in_flight();
            self.violate(format!("the host's block core still holds {n} requests at the end"));
            return;
        }
        for p in 0..self.paths.len() {
            let conn = self.paths[p].io_conn;
            let outstanding = conn.and_then(|(k, _)| self.core.queue_mut(k)).map_or(0, |q| q.outstanding());
            if outstanding != 0 {
                self.violate(format!("path {p}: {outstanding} queue commands still held at the end"));
                return;
            }
            if let Some(&(_, l, g)) = self.paths[p].retired.first() {
                let now = self.paths[p].ctrl.generation();
                self.violate(format!(
                    "path {p}: the block core still holds an I/O queue of an old association at the end \
                     (link {l}, generation {g}; the controller's is {now})"
                ));
                return;
            }
        }
        if let Some(ri) = self.reqs.iter().position(|r| r.op != ROp::Flush && r.buf.is_none()) {
            self.violate(format!("I/O {ri}: its buffer never came back"));
            return;
        }
        let other = self.other.as_ref().map_or(0, |o| o.disk.in_flight());
        if self.disk.in_flight() + other != 0 {
            let n = self.disk.in_flight() + other;
            self.violate(format!("{n} disk operations still in flight at the end"));
            return;
        }
        if let Some(t) = self.target.conns.iter().find(|t| self.links[t.link].host_closed || self.links[t.link].down) {
            let what = format!(
                "target connection {} of a closed link is still held at the end ({:?}, {}, {} file operations)",
                t.id,
                t.conn.state(),
                t.conn.close_reason().unwrap_or("not closed"),
                t.conn.file_ops_in_flight()
            );
            self.violate(what);
            return;
        }
        if let Some(p) = self.paths.iter().position(|p| p.event_owed.is_some()) {
            self.violate(format!(
                "path {p}: the namespace changed while its controller had the namespace-changed notice enabled, \
                 and no event came"
            ));
            return;
        }
        // A host whose every controller was given up (ctrl_loss_tmo) reads nothing more.
        let all_lost = self.paths.iter().all(|p| p.ctrl.machine().state() == host::controller::CtrlState::Dead);
        if let Some((back, _)) = self.ns_back {
            self.violate(format!("the namespace's return ({back:?}) never came: the host never let go of it"));
            return;
        }
        let replaced = self.ns_on_target == NsOnTarget::Replacement;
        if self.host_blocks != self.ns_blocks && !all_lost && !replaced {
            let (h, t) = (self.host_blocks, self.ns_blocks);
            self.violate(format!("the host believes the namespace has {h} blocks; the target has {t}"));
            return;
        }
        self.auth_final_checks();
        if self.violation.is_some() {
            return;
        }
        let held = self.target.pool.outstanding();
        let conn_bytes: usize = self.target.conns.iter().map(|t| t.conn.buffer_bytes()).sum();
        if held != 0 && conn_bytes == 0 {
            self.violate(format!("the target's buffer pool has {held} bytes handed out and no connection holds any"));
        }
    }

    /// The report of a finished run.
    pub fn report(self) -> Report {
        Report {
            seed: self.opts.seed,
            summary: self.sum,
            violation: self.violation,
            trace_hash: self.hash,
            trace: self.trace,
        }
    }
}

/// A target namespace's identifiers, as a host's scan reads them.
fn ids_of(ns: &Namespace) -> NsIds {
    NsIds { nguid: ns.nguid, eui64: ns.eui64, uuid: Some(ns.uuid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_file_is_always_new_and_a_file_already_there_is_left_as_it_was() {
        let n = RUN.load(Ordering::Relaxed);
        let theirs: Vec<_> = (n..n + 3)
            .map(|k| std::env::temp_dir().join(format!("qpath-sim-{}-{k}.img", std::process::id())))
            .collect();
        for p in &theirs {
            std::fs::write(p, b"someone's data").unwrap();
        }
        let mine = ScratchFile::create();
        assert!(!theirs.contains(&mine.0), "{} was there before", mine.0.display());
        assert_eq!(std::fs::metadata(&mine.0).unwrap().len(), 0);
        drop(mine);
        for p in &theirs {
            assert_eq!(std::fs::read(p).unwrap(), b"someone's data", "{}", p.display());
            std::fs::remove_file(p).unwrap();
        }
    }
}
