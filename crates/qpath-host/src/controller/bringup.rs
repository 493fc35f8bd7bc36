//! A new association's bring-up as a step machine with no I/O, no thread and no clock of
//! its own, in the style of [`super::CtrlMachine`] and [`crate::auth::Authenticator`]:
//! [`Bringup::poll`] hands out the next admin command (or a pause, or "connect the I/O
//! queues now"), [`Bringup::on_done`] takes its completion and checks what the wire said
//! before anything uses it. Time is whatever the driver passes (ns from any origin).
//!
//! The admin queue's own connect (ICReq, Fabrics Connect, DH-HMAC-CHAP) comes before and
//! is the driver's: a [`crate::queue::HostQueue`] in both worlds. After it:
//!
//! ```text
//!   Property Get CAP ─► Property Set CC.EN ─► Property Get CSTS ─┬─ RDY ─► Identify Controller
//!        (NVMe Base 2.x §3.5.1)                 ▲   pause 2 ms ◄─┘ (until CAP.TO)      │ ioccsz, icdoff,
//!                                               └──────────────────┘                    ▼ maxcmd checked
//!   namespace scan ◄─ Set Features Async Event ◄─ ConnectIo (the driver) ◄─ Set Features Number of Queues
//!     │ Identify active NSID list (pages of 1024)
//!     │ Get Log Page ANA (when CMIC.ANA), in chunks
//!     └ Identify Namespace + Namespace Identification Descriptors, per NSID ─► Done
//! ```
//!
//! The production [`super::Controller`] drives it over a blocking admin queue; the
//! simulator drives the same machine over its simulated admin link in virtual time. The
//! namespace scan is its own machine, [`NsScan`], which a rescan (the controller
//! machine's `AnaLog` and `Rescan`) runs alone: there is one namespace scan.

use std::time::Duration;

use nvme::fabrics::{Cap, Cc, PropertyCmd, csts, prop};
use nvme::features::{NumQueues, fid};
use nvme::identify::{
    IDENTIFY_SIZE, IdentifyController, IdentifyNamespace, NsIdDesc, cmic, cns, decode_ns_descs, decode_ns_list, oaes,
};
use nvme::log::{AnaLog, decode_changed_ns_list, lid};
use nvme::{AnaState, Cid, Nsid, Sqe, Status};
use uring::IoBuf;

use super::NsInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::queue::{DataDir, Done, Io};

/// Between two reads of CSTS while waiting for RDY.
pub const CSTS_POLL: Duration = Duration::from_millis(2);
/// The largest ANA log chunk one Get Log Page asks for.
const ANA_CHUNK: usize = 64 * 1024;
/// Entries in one page of the active namespace list (NVMe Base 2.x, Identify CNS 02h: 1024 NSIDs).
const NS_LIST_PAGE: usize = 1024;
/// Pages of the active namespace list read at most: a controller that keeps handing out
/// full pages past this many namespaces is refused (the limit on a wire value).
const NS_LIST_PAGES_MAX: usize = 64;
/// The Changed Namespace List (NVMe Base 2.x §5.16.1.5): 1024 NSIDs of 4 bytes.
const CHANGED_NS_LEN: u32 = 4096;

/// What the driver does next (the `T` is the outcome: [`Brought`] or the namespaces).
#[derive(Debug)]
pub enum Next<T> {
    /// Send this admin command (any command id: the driver's queue sets its tag) and
    /// answer with [`Bringup::on_done`] (or `on_error` if it could not complete).
    Command {
        /// The command and its buffer.
        io: Io,
        /// The command's name, for errors and logs.
        what: &'static str,
    },
    /// The command handed out is outstanding.
    Wait,
    /// Nothing to send before this time (ns, on the driver's clock): poll again then.
    Sleep {
        /// When to poll again.
        until_ns: u64,
    },
    /// Connect the I/O queues 1..=`count` now, each with `entries` entries and in-capsule
    /// data up to `max_in_capsule` bytes; answer with [`Bringup::io_connected`] or
    /// [`Bringup::on_error`]. Only [`Bringup`] hands it out.
    ConnectIo {
        /// I/O queues to connect (qid 1..=count).
        count: usize,
        /// Entries per queue: the asked size, bounded by CAP.MQES + 1 and MAXCMD.
        entries: u16,
        /// In-capsule data bytes (IOCCSZ).
        max_in_capsule: usize,
    },
    /// Finished (handed out once).
    Done(T),
    /// Failed, for this reason (handed out once): the association must not go live.
    Failed(Error),
}

/// What a finished bring-up learned.
#[derive(Clone, Debug)]
pub struct Brought {
    /// Controller Capabilities.
    pub cap: Cap,
    /// Identify Controller (checked usable).
    pub id: IdentifyController,
    /// I/O queues the driver connected.
    pub io_queues: usize,
    /// Entries per I/O queue.
    pub entries: u16,
    /// The namespaces, as the scan found them.
    pub namespaces: Vec<NsInfo>,
}

/// What the bring-up asks for.
#[derive(Clone, Copy, Debug)]
pub struct BringupConfig {
    /// I/O queues to ask for (Set Features Number of Queues); at least one.
    pub want_queues: usize,
    /// Entries per I/O queue to ask for.
    pub queue_size: u16,
}

/// Where a step machine stands between its commands.
#[derive(Debug)]
enum Phase<T> {
    /// The current step's command (or action) is next.
    Ready,
    /// It was handed out; its answer is awaited.
    Outstanding,
    /// The outcome, handed out by the next poll.
    Finished(Result<T>),
    /// The outcome was handed out.
    Over,
}

impl<T> Phase<T> {
    /// The gate at the top of each machine's `poll`: `None` when the current step is to be
    /// handed out now (the phase is then `Over` until the caller sets it), else what `poll`
    /// answers (waiting, the outcome once, or a failure for a poll after it).
    fn gate(&mut self, what: &str) -> Option<Next<T>> {
        match std::mem::replace(self, Phase::Over) {
            Phase::Ready => None,
            Phase::Outstanding => {
                *self = Phase::Outstanding;
                Some(Next::Wait)
            }
            Phase::Finished(Ok(t)) => Some(Next::Done(t)),
            Phase::Finished(Err(e)) => Some(Next::Failed(e)),
            Phase::Over => Some(Next::Failed(over(what))),
        }
    }
}

/// Prefixes an error with the step it ended.
fn in_step(what: &str, e: Error) -> Error {
    Error { kind: e.kind, context: format!("{what}: {}", e.context), status: e.status }
}

/// The data a command that reads `len` bytes brought back, checked to be there.
fn data_of<'a>(what: &str, d: &'a Done, len: usize) -> Result<&'a [u8]> {
    d.buf
        .as_ref()
        .and_then(|b| b.as_full().get(..len))
        .ok_or_else(|| Error::new(ErrorKind::Protocol, format!("{what}: completed without its {len} bytes of data")))
}

/// A command that reads `len` bytes from the controller.
fn read_io(sqe: Sqe, len: usize) -> Io {
    let buf = IoBuf::new(len.max(1).next_multiple_of(4096));
    // Every length here is an Identify structure or a log chunk of at most 64 KiB.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    Io { sqe, buf: Some(buf), len, dir: DataDir::FromController, token: 0 }
}

fn plain_io(sqe: Sqe) -> Io {
    Io { sqe, buf: None, len: 0, dir: DataDir::None, token: 0 }
}

// ------------------------------------------------------------------------ enable

/// The steps of enabling a controller (NVMe Base 2.x §3.5.1): CAP, CC.EN = 1, CSTS.RDY
/// within CAP.TO. [`crate::admin::enable`] (discovery) runs it alone; [`Bringup`] first.
#[derive(Debug)]
pub struct Enable {
    step: EnableStep,
    phase: Phase<Cap>,
    cap: Option<Cap>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EnableStep {
    Cap,
    Cc,
    /// Reading CSTS until RDY, no later than `deadline_ns`; the next read not before `at_ns`.
    Csts {
        deadline_ns: u64,
        at_ns: u64,
    },
}

impl EnableStep {
    /// The step's command, for errors.
    fn what(self) -> &'static str {
        match self {
            EnableStep::Cap => "Property Get CAP",
            EnableStep::Cc => "Property Set CC",
            EnableStep::Csts { .. } => "Property Get CSTS",
        }
    }
}

impl Default for Enable {
    fn default() -> Enable {
        Enable::new()
    }
}

impl Enable {
    /// The first step: read CAP.
    pub fn new() -> Enable {
        Enable { step: EnableStep::Cap, phase: Phase::Ready, cap: None }
    }

    /// The next thing to do at `now_ns`.
    #[must_use = "the step handed out must be done"]
    pub fn poll(&mut self, now_ns: u64) -> Next<Cap> {
        if let Some(next) = self.phase.gate("enabling the controller") {
            return next;
        }
        let sqe = match self.step {
            EnableStep::Cap => PropertyCmd::get_sqe(Cid(0), prop::CAP, true),
            EnableStep::Cc => PropertyCmd::set_sqe(Cid(0), prop::CC, false, u64::from(Cc::enable_value().0)),
            EnableStep::Csts { at_ns, .. } if now_ns < at_ns => {
                self.phase = Phase::Ready;
                return Next::Sleep { until_ns: at_ns };
            }
            EnableStep::Csts { .. } => PropertyCmd::get_sqe(Cid(0), prop::CSTS, false),
        };
        self.phase = Phase::Outstanding;
        Next::Command { io: plain_io(sqe), what: self.step.what() }
    }

    /// The completion of the command handed out, at `now_ns`.
    pub fn on_done(&mut self, now_ns: u64, d: &Done) {
        if !matches!(self.phase, Phase::Outstanding) {
            self.phase = Phase::Finished(Err(out_of_step("enabling the controller")));
            return;
        }
        self.phase = match self.answer(now_ns, d) {
            Ok(None) => Phase::Ready,
            Ok(Some(cap)) => Phase::Finished(Ok(cap)),
            Err(e) => Phase::Finished(Err(e)),
        };
    }

    /// The command handed out did not complete (transport failure, driver's timeout).
    pub fn on_error(&mut self, e: Error) {
        self.phase = Phase::Finished(Err(in_step(self.step.what(), e)));
    }

    fn answer(&mut self, now_ns: u64, d: &Done) -> Result<Option<Cap>> {
        if !d.cqe.status.is_success() {
            return Err(Error::status(self.step.what(), d.cqe.status));
        }
        match self.step {
            EnableStep::Cap => {
                self.cap = Some(Cap::from_u64(d.cqe.result64()));
                self.step = EnableStep::Cc;
            }
            EnableStep::Cc => {
                // CAP.TO: the longest CSTS.RDY may take, in 500 ms units (0 read as 1).
                let to = self.cap.map_or(1, |c| u64::from(c.to.max(1)));
                let deadline_ns = now_ns.saturating_add(to * 500_000_000);
                self.step = EnableStep::Csts { deadline_ns, at_ns: now_ns };
            }
            EnableStep::Csts { deadline_ns, .. } => {
                let s = d.cqe.dw0;
                if s & csts::CFS != 0 {
                    return Err(Error::new(ErrorKind::Protocol, "controller fatal status while enabling"));
                }
                if s & csts::RDY != 0 {
                    return Ok(self.cap);
                }
                if now_ns > deadline_ns {
                    return Err(Error::new(ErrorKind::Timeout, "CSTS.RDY not set within CAP.TO"));
                }
                let at_ns = now_ns.saturating_add(u64::try_from(CSTS_POLL.as_nanos()).unwrap_or(u64::MAX));
                self.step = EnableStep::Csts { deadline_ns, at_ns };
            }
        }
        Ok(None)
    }
}

fn out_of_step(what: &str) -> Error {
    // The driver answered a command the machine did not hand out: a bug of the driver's.
    tracing::error!("{what}: a completion no command waits for");
    Error::new(ErrorKind::Protocol, format!("{what}: internal error: a completion no command waits for"))
}

fn over(what: &str) -> Error {
    Error::new(ErrorKind::Protocol, format!("{what}: internal error: polled after its outcome"))
}

// ------------------------------------------------------------------ namespace scan

/// The namespace scan (as Linux `nvme_scan_work`): the active NSID list, the ANA log
/// when the controller reports ANA (CMIC bit 3), then Identify Namespace and its
/// identification descriptors per NSID. A namespace of no blocks or an unusable format
/// is left out. A rescan after a namespace notice reads the Changed Namespace List first
/// (reading it, RAE clear, re-arms the notice; its contents are not needed: the whole
/// list is read again).
#[derive(Debug)]
pub struct NsScan {
    nanagrpid: u32,
    ana_reported: bool,
    step: ScanStep,
    phase: Phase<Vec<NsInfo>>,
    nsids: Vec<Nsid>,
    pages: usize,
    ana_log: Vec<u8>,
    ana_len: usize,
    ana: Option<AnaLog>,
    /// Index in `nsids` of the namespace being identified.
    index: usize,
    /// Its Identify Namespace, while its descriptors are read.
    ns: Option<IdentifyNamespace>,
    out: Vec<NsInfo>,
    /// What the Changed Namespace List of a rescan named, when it could be read.
    changed: Option<Vec<Nsid>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScanStep {
    ChangedList,
    ActiveList { after: Nsid },
    AnaLog,
    Identify,
    Descriptors,
}

impl NsScan {
    /// A scan of the controller `id` describes.
    pub fn new(id: &IdentifyController) -> NsScan {
        NsScan {
            nanagrpid: id.nanagrpid,
            ana_reported: id.cmic & cmic::ANA != 0,
            step: ScanStep::ActiveList { after: Nsid(0) },
            phase: Phase::Ready,
            nsids: Vec::new(),
            pages: 0,
            ana_log: Vec::new(),
            ana_len: 0,
            ana: None,
            index: 0,
            ns: None,
            out: Vec::new(),
            changed: None,
        }
    }

    /// A rescan after a namespace attribute notice: the Changed Namespace List first.
    pub fn rescan(id: &IdentifyController) -> NsScan {
        NsScan { step: ScanStep::ChangedList, ..NsScan::new(id) }
    }

    /// The NSIDs a rescan's Changed Namespace List named (`None`: not a rescan, or the list
    /// could not be read). The scan itself reads every namespace again whatever it says.
    pub fn changed(&self) -> Option<&[Nsid]> {
        self.changed.as_deref()
    }

    fn what(&self) -> &'static str {
        match self.step {
            ScanStep::ChangedList => "Get Log Page Changed Namespace List",
            ScanStep::ActiveList { .. } => "Identify active namespace list",
            ScanStep::AnaLog => "Get Log Page ANA",
            ScanStep::Identify => "Identify Namespace",
            ScanStep::Descriptors => "Identify Namespace Identification Descriptors",
        }
    }

    /// The next thing to do (the scan has no pause: `now_ns` is for symmetry).
    #[must_use = "the step handed out must be done"]
    pub fn poll(&mut self, _now_ns: u64) -> Next<Vec<NsInfo>> {
        if let Some(next) = self.phase.gate("namespace scan") {
            return next;
        }
        let io = match self.step {
            ScanStep::ChangedList => {
                let sqe = Sqe::get_log_page(Cid(0), Nsid::BROADCAST, lid::CHANGED_NS, 0, false, CHANGED_NS_LEN, 0);
                read_io(sqe, CHANGED_NS_LEN as usize)
            }
            ScanStep::ActiveList { after } => {
                read_io(Sqe::identify(Cid(0), cns::ACTIVE_NS_LIST, after, 0, 0), IDENTIFY_SIZE)
            }
            ScanStep::AnaLog => {
                let off = self.ana_log.len();
                let n = (self.ana_len - off).min(ANA_CHUNK).next_multiple_of(4);
                // n ≤ 64 KiB.
                let n32 = u32::try_from(n).unwrap_or(u32::MAX);
                read_io(Sqe::get_log_page(Cid(0), Nsid::BROADCAST, lid::ANA, 0, false, n32, off as u64), n)
            }
            ScanStep::Identify => {
                read_io(Sqe::identify(Cid(0), cns::NAMESPACE, self.nsids[self.index], 0, 0), IDENTIFY_SIZE)
            }
            ScanStep::Descriptors => {
                read_io(Sqe::identify(Cid(0), cns::NS_DESC_LIST, self.nsids[self.index], 0, 0), IDENTIFY_SIZE)
            }
        };
        self.phase = Phase::Outstanding;
        Next::Command { io, what: self.what() }
    }

    /// The completion of the command handed out.
    pub fn on_done(&mut self, d: &Done) {
        if !matches!(self.phase, Phase::Outstanding) {
            self.phase = Phase::Finished(Err(out_of_step("namespace scan")));
            return;
        }
        self.phase = match self.answer(d) {
            Ok(()) => self.next_phase(),
            Err(e) => Phase::Finished(Err(e)),
        };
    }

    /// The command handed out did not complete (transport failure, driver's timeout).
    pub fn on_error(&mut self, e: Error) {
        self.phase = Phase::Finished(Err(in_step(self.what(), e)));
    }

    /// After an answer: the next step's command, or the outcome once every NSID is done.
    fn next_phase(&mut self) -> Phase<Vec<NsInfo>> {
        if self.step == ScanStep::Identify && self.index >= self.nsids.len() {
            return Phase::Finished(Ok(std::mem::take(&mut self.out)));
        }
        Phase::Ready
    }

    fn answer(&mut self, d: &Done) -> Result<()> {
        let what = self.what();
        let ok = d.cqe.status.is_success();
        match self.step {
            // Read to re-arm the notice: whatever it says, the whole list follows.
            ScanStep::ChangedList => {
                if ok {
                    self.changed = data_of(what, d, CHANGED_NS_LEN as usize).ok().and_then(decode_changed_ns_list);
                }
                self.step = ScanStep::ActiveList { after: Nsid(0) };
            }
            ScanStep::ActiveList { after } => {
                if !ok {
                    return Err(Error::status(what, d.cqe.status));
                }
                let page = decode_ns_list(data_of(what, d, IDENTIFY_SIZE)?);
                self.pages += 1;
                // NVMe Base 2.x, Identify CNS 02h: NSIDs greater than the one asked after, ascending.
                if page.first().is_some_and(|&n| n <= after) || page.windows(2).any(|w| w[1] <= w[0]) {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!("{what}: NSIDs not ascending after {}", after.0),
                    ));
                }
                let full = page.len() == NS_LIST_PAGE;
                let last = page.last().copied();
                self.nsids.extend(page);
                match last {
                    Some(last) if full => {
                        if self.pages >= NS_LIST_PAGES_MAX {
                            return Err(Error::new(
                                ErrorKind::Protocol,
                                format!("{what}: more than {} namespaces", NS_LIST_PAGES_MAX * NS_LIST_PAGE),
                            ));
                        }
                        self.step = ScanStep::ActiveList { after: last };
                    }
                    _ => self.list_read(),
                }
            }
            ScanStep::AnaLog => {
                if !ok {
                    return Err(Error::status(what, d.cqe.status));
                }
                let off = self.ana_log.len();
                let n = (self.ana_len - off).min(ANA_CHUNK).next_multiple_of(4);
                let data = data_of(what, d, n)?;
                self.ana_log.extend_from_slice(&data[..n.min(self.ana_len - off)]);
                if self.ana_log.len() >= self.ana_len {
                    let log = AnaLog::decode(&self.ana_log)
                        .map_err(|e| Error::new(ErrorKind::Protocol, format!("ANA log: {e}")))?;
                    self.ana = Some(log);
                    self.ana_log = Vec::new();
                    self.step = ScanStep::Identify;
                }
            }
            ScanStep::Identify => {
                if !ok {
                    return Err(Error::status(format!("{what} {}", self.nsids[self.index].0), d.cqe.status));
                }
                self.ns = Some(IdentifyNamespace::decode(data_of(what, d, IDENTIFY_SIZE)?));
                self.step = ScanStep::Descriptors;
            }
            ScanStep::Descriptors => {
                // A controller without the descriptor list answers Invalid Field in Command
                // (a CNS value it does not support): the namespace has no UUID then (its
                // NGUID and EUI-64 still count). Any other error (a transport or data digest
                // error) says nothing of the UUID: the scan fails and the list read before
                // stays, as Linux's `nvme_identify_ns_descs` fails the namespace's validation.
                // Taken as "no UUID", it made the same namespace look like another one under
                // its NSID, whose device then refuses I/O for good (the simulator's seed 293).
                let unsupported = d.cqe.status.with_dnr(false) == Status::INVALID_FIELD.with_dnr(false);
                let descs = if ok {
                    decode_ns_descs(data_of(what, d, IDENTIFY_SIZE)?)
                } else if unsupported {
                    Vec::new()
                } else {
                    return Err(Error::status(format!("{what} {}", self.nsids[self.index].0), d.cqe.status));
                };
                if let Some(ns) = self.ns.take() {
                    self.found(&ns, &descs);
                }
                self.index += 1;
                self.step = ScanStep::Identify;
            }
        }
        Ok(())
    }

    /// The active list is read: the ANA log next (sized by ANAGRPMAX and the namespaces),
    /// or the namespaces.
    fn list_read(&mut self) {
        if self.ana_reported {
            let groups = usize::try_from(self.nanagrpid.max(1)).unwrap_or(1);
            self.ana_len = AnaLog::size(groups, self.nsids.len().max(NS_LIST_PAGE)).next_multiple_of(4);
            self.step = ScanStep::AnaLog;
        } else {
            self.step = ScanStep::Identify;
        }
    }

    /// A namespace identified: kept unless it has no blocks or no usable format.
    fn found(&mut self, ns: &IdentifyNamespace, descs: &[NsIdDesc]) {
        let nsid = self.nsids[self.index];
        if ns.nsze == 0 || ns.block_size() == 0 {
            tracing::debug!(nsid = nsid.0, nsze = ns.nsze, "namespace left out: no blocks or no usable format");
            return;
        }
        let state = self
            .ana
            .as_ref()
            .and_then(|l| l.groups.iter().find(|g| g.grpid == ns.anagrpid))
            .map_or(AnaState::Optimized, |g| g.state);
        let uuid = descs.iter().find_map(|d| if let NsIdDesc::Uuid(u) = d { Some(*u) } else { None });
        self.out.push(NsInfo {
            nsid,
            nsze: ns.nsze,
            block_shift: u8::try_from(ns.block_size().trailing_zeros()).unwrap_or(9),
            anagrpid: ns.anagrpid,
            ana_state: state,
            nguid: ns.nguid,
            eui64: ns.eui64,
            uuid,
            shared: ns.nmic & 1 != 0,
        });
    }
}

// ---------------------------------------------------------------------- bring-up

/// One association's bring-up after its admin queue connected (module docs).
#[derive(Debug)]
pub struct Bringup {
    cfg: BringupConfig,
    stage: Stage,
    phase: Phase<Brought>,
    cap: Option<Cap>,
    id: Option<IdentifyController>,
    io_queues: usize,
    entries: u16,
}

#[derive(Debug)]
enum Stage {
    Enable(Enable),
    IdentifyController,
    NumQueues,
    IoQueues,
    AsyncEventConfig,
    Scan(Box<NsScan>),
}

impl Bringup {
    /// A bring-up asking for what `cfg` says.
    pub fn new(cfg: BringupConfig) -> Bringup {
        Bringup {
            cfg,
            stage: Stage::Enable(Enable::new()),
            phase: Phase::Ready,
            cap: None,
            id: None,
            io_queues: 0,
            entries: 0,
        }
    }

    /// Identify Controller, once read (and found usable).
    pub fn identify(&self) -> Option<&IdentifyController> {
        self.id.as_ref()
    }

    /// The next thing to do at `now_ns`.
    #[must_use = "the step handed out must be done"]
    pub fn poll(&mut self, now_ns: u64) -> Next<Brought> {
        if let Some(next) = self.phase.gate("bring-up") {
            return next;
        }
        // A sub-machine's steps are this machine's; its outcome moves this one on.
        self.phase = Phase::Ready;
        match &mut self.stage {
            Stage::Enable(e) => match e.poll(now_ns) {
                Next::Done(cap) => {
                    self.cap = Some(cap);
                    self.stage = Stage::IdentifyController;
                    self.poll(now_ns)
                }
                n => self.forward(n),
            },
            Stage::Scan(s) => match s.poll(now_ns) {
                Next::Done(namespaces) => self.finish(namespaces),
                n => self.forward(n),
            },
            Stage::IdentifyController => {
                let io = read_io(Sqe::identify(Cid(0), cns::CONTROLLER, Nsid(0), 0, 0), IDENTIFY_SIZE);
                self.send(io, "Identify Controller")
            }
            Stage::NumQueues => {
                let want = u32::try_from(self.cfg.want_queues.max(1)).unwrap_or(u32::MAX);
                let dw = NumQueues { nsq: want, ncq: want }.to_dw();
                self.send(plain_io(Sqe::set_features(Cid(0), fid::NUM_QUEUES, dw)), "Set Features Number of Queues")
            }
            Stage::IoQueues => {
                let max_in_capsule = self.id.as_ref().map_or(0, |id| id.in_capsule_data_size() as usize);
                self.phase = Phase::Outstanding;
                Next::ConnectIo { count: self.io_queues, entries: self.entries, max_in_capsule }
            }
            Stage::AsyncEventConfig => {
                let aen = self.id.as_ref().map_or(0, want_aen);
                let sqe = Sqe::set_features(Cid(0), fid::ASYNC_EVENT, aen);
                self.send(plain_io(sqe), "Set Features Asynchronous Event Configuration")
            }
        }
    }

    fn send(&mut self, io: Io, what: &'static str) -> Next<Brought> {
        self.phase = Phase::Outstanding;
        Next::Command { io, what }
    }

    /// A sub-machine's step, handed on.
    fn forward<T>(&mut self, n: Next<T>) -> Next<Brought> {
        match n {
            Next::Command { io, what } => self.send(io, what),
            Next::Wait => {
                self.phase = Phase::Outstanding;
                Next::Wait
            }
            Next::Sleep { until_ns } => Next::Sleep { until_ns },
            Next::Failed(e) => Next::Failed(e),
            // Neither sub-machine connects queues, and their outcome is taken before.
            Next::ConnectIo { .. } | Next::Done(_) => Next::Failed(over("bring-up")),
        }
    }

    fn finish(&mut self, namespaces: Vec<NsInfo>) -> Next<Brought> {
        let (Some(cap), Some(id)) = (self.cap, self.id.take()) else {
            return Next::Failed(over("bring-up"));
        };
        Next::Done(Brought { cap, id, io_queues: self.io_queues, entries: self.entries, namespaces })
    }

    /// The completion of the command handed out, at `now_ns`.
    pub fn on_done(&mut self, now_ns: u64, d: &Done) {
        if !matches!(self.phase, Phase::Outstanding) || matches!(self.stage, Stage::IoQueues) {
            self.phase = Phase::Finished(Err(out_of_step("bring-up")));
            return;
        }
        self.phase = Phase::Ready;
        let r = match &mut self.stage {
            Stage::Enable(e) => return e.on_done(now_ns, d),
            Stage::Scan(s) => return s.on_done(d),
            Stage::IdentifyController => self.identified(d),
            Stage::NumQueues => self.queues_granted(d),
            Stage::AsyncEventConfig if d.cqe.status.is_success() => {
                self.scan();
                Ok(())
            }
            Stage::AsyncEventConfig => {
                Err(Error::status("Set Features Asynchronous Event Configuration", d.cqe.status))
            }
            Stage::IoQueues => Ok(()),
        };
        if let Err(e) = r {
            self.phase = Phase::Finished(Err(e));
        }
    }

    /// The command (or the I/O queues' connects) handed out did not complete.
    pub fn on_error(&mut self, e: Error) {
        let what = match &mut self.stage {
            // A sub-machine keeps its outcome: the next poll hands it out.
            Stage::Enable(m) => {
                self.phase = Phase::Ready;
                return m.on_error(e);
            }
            Stage::Scan(s) => {
                self.phase = Phase::Ready;
                return s.on_error(e);
            }
            // The driver's connect errors name their queue.
            Stage::IoQueues => {
                self.phase = Phase::Finished(Err(e));
                return;
            }
            Stage::IdentifyController => "Identify Controller",
            Stage::NumQueues => "Set Features Number of Queues",
            Stage::AsyncEventConfig => "Set Features Asynchronous Event Configuration",
        };
        self.phase = Phase::Finished(Err(in_step(what, e)));
    }

    /// The driver connected the I/O queues [`Next::ConnectIo`] asked for.
    pub fn io_connected(&mut self) {
        if !matches!(self.stage, Stage::IoQueues) || !matches!(self.phase, Phase::Outstanding) {
            self.phase = Phase::Finished(Err(out_of_step("bring-up")));
            return;
        }
        self.phase = Phase::Ready;
        let aen = self.id.as_ref().map_or(0, want_aen);
        if aen != 0 {
            self.stage = Stage::AsyncEventConfig;
        } else {
            self.scan();
        }
    }

    fn scan(&mut self) {
        let scan = self.id.as_ref().map(|id| Box::new(NsScan::new(id)));
        if let Some(s) = scan {
            self.stage = Stage::Scan(s);
        }
    }

    /// Identify Controller: checked before anything uses it (a controller that would
    /// make the host build broken capsules is refused).
    fn identified(&mut self, d: &Done) -> Result<()> {
        let what = "Identify Controller";
        if !d.cqe.status.is_success() {
            return Err(Error::status(what, d.cqe.status));
        }
        let id = IdentifyController::decode(data_of(what, d, IDENTIFY_SIZE)?);
        // NVMe over Fabrics: IOCCSZ counts the 64-byte SQE (4 × 16 bytes) at least; the
        // host sends in-capsule data right after the SQE (ICDOFF 0); MAXCMD bounds the
        // queue entries.
        if id.ioccsz < 4 || id.icdoff != 0 || id.maxcmd == 0 {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("unusable controller: ioccsz {} icdoff {} maxcmd {}", id.ioccsz, id.icdoff, id.maxcmd),
            ));
        }
        self.id = Some(id);
        self.stage = Stage::NumQueues;
        Ok(())
    }

    /// Number of Queues: the controller may grant fewer than asked (never more is used).
    fn queues_granted(&mut self, d: &Done) -> Result<()> {
        if !d.cqe.status.is_success() {
            return Err(Error::status("Set Features Number of Queues", d.cqe.status));
        }
        let granted = NumQueues::from_dw(d.cqe.dw0);
        let want = self.cfg.want_queues.max(1);
        self.io_queues = usize::try_from(granted.nsq.min(granted.ncq)).unwrap_or(1).min(want);
        let (mqes, maxcmd) = (self.cap.map_or(0, |c| c.mqes), self.id.as_ref().map_or(2, |id| id.maxcmd));
        // Entries: the asked queue size, bounded by CAP.MQES + 1 and MAXCMD.
        self.entries = self.cfg.queue_size.min(mqes.saturating_add(1)).min(maxcmd.max(2));
        self.stage = Stage::IoQueues;
        Ok(())
    }
}

/// The asynchronous events the host enables: namespace attribute and ANA change notices
/// the controller offers (OAES bits 8 and 11; NVMe Base 2.x, Set Features 0Bh).
fn want_aen(id: &IdentifyController) -> u32 {
    (id.oaes & (oaes::NS_ATTR | oaes::ANA_CHANGE)) & ((1 << 8) | (1 << 11))
}
