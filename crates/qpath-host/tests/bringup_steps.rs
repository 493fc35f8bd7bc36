//! The controller's bring-up step machine ([`qpath_host::controller::bringup`]), driven
//! in virtual time against a scripted controller: the commands in the order the real
//! bring-up sends them, and what it refuses or leaves out (CSTS.RDY past CAP.TO, an
//! unusable Identify Controller, fewer queues granted, a namespace of no blocks, an ANA
//! log that cannot be read).

// The scripted controller's values are small: its casts to the wire's fields cannot truncate.
#![allow(clippy::cast_possible_truncation)]

use std::collections::HashMap;

use nvme::fabrics::csts;
use nvme::identify::{IdentifyController, IdentifyNamespace, LbaFormat, NsIdDesc, cmic, cns, oaes};
use nvme::log::{AnaGroupDesc, AnaLog};
use nvme::{AnaGrpId, AnaState, Cid, Cqe, Nsid, Status};
use qpath_host::controller::NsInfo;
use qpath_host::controller::bringup::{Bringup, BringupConfig, Brought, Next, NsScan};
use qpath_host::queue::{Done, Io};
use qpath_host::{Error, ErrorKind};

/// Virtual time one command takes, ns.
const RTT_NS: u64 = 50_000;

/// A controller that answers the bring-up's commands from a script.
struct Fake {
    /// CAP: MQES (0's based) and TO (500 ms units).
    mqes: u16,
    to: u8,
    /// CSTS reads before RDY (`None`: never).
    ready_after: Option<u32>,
    csts_reads: u32,
    fatal: bool,
    id: IdentifyController,
    /// Number of Queues granted (1's based; `None`: as many as asked).
    granted: Option<u32>,
    nsids: Vec<u32>,
    ns: HashMap<u32, IdentifyNamespace>,
    ana: Result<AnaLog, Status>,
    /// The Namespace Identification Descriptor list (an error status when unsupported).
    descs: Result<Vec<NsIdDesc>, Status>,
    changed_status: Status,
    /// What the Changed Namespace List names.
    changed: Vec<u32>,
    /// Every command's name, in order.
    sent: Vec<String>,
}

fn namespace(nsze: u64, grp: u32, nguid: u8) -> IdentifyNamespace {
    let mut lbaf = [LbaFormat::default(); 16];
    lbaf[0].lbads = 12;
    IdentifyNamespace {
        nsze,
        ncap: nsze,
        anagrpid: AnaGrpId(grp),
        nguid: [nguid; 16],
        nmic: 1,
        lbaf,
        ..Default::default()
    }
}

impl Fake {
    fn new() -> Fake {
        let id = IdentifyController {
            ioccsz: 4 + 8192 / 16,
            maxcmd: 64,
            cmic: cmic::ANA,
            nanagrpid: 2,
            oaes: oaes::NS_ATTR | oaes::ANA_CHANGE,
            ..Default::default()
        };
        let ana = AnaLog {
            chgcnt: 1,
            groups: vec![
                AnaGroupDesc { grpid: AnaGrpId(1), chgcnt: 1, state: AnaState::Optimized, nsids: vec![Nsid(1)] },
                AnaGroupDesc { grpid: AnaGrpId(2), chgcnt: 1, state: AnaState::NonOptimized, nsids: vec![Nsid(2)] },
            ],
        };
        Fake {
            mqes: 127,
            to: 2,
            ready_after: Some(3),
            csts_reads: 0,
            fatal: false,
            id,
            granted: None,
            nsids: vec![1, 2],
            ns: HashMap::from([(1, namespace(1000, 1, 0x11)), (2, namespace(2000, 2, 0x22))]),
            ana: Ok(ana),
            descs: Ok(vec![NsIdDesc::Uuid([0x33; 16])]),
            changed_status: Status::SUCCESS,
            changed: Vec::new(),
            sent: Vec::new(),
        }
    }

    fn answer(&mut self, mut io: Io, what: &str) -> Done {
        self.sent.push(what.to_string());
        let mut cqe = Cqe::success(Cid(0));
        let mut data: Vec<u8> = Vec::new();
        let sqe = io.sqe;
        match what {
            "Property Get CAP" => {
                let cap = u64::from(self.mqes) | (u64::from(self.to) << 24);
                (cqe.dw0, cqe.dw1) = (cap as u32, (cap >> 32) as u32);
            }
            "Property Set CC" => {}
            "Property Get CSTS" => {
                self.csts_reads += 1;
                let rdy = self.ready_after.is_some_and(|n| self.csts_reads > n);
                cqe.dw0 = if self.fatal {
                    csts::CFS
                } else if rdy {
                    csts::RDY
                } else {
                    0
                };
            }
            "Identify Controller" => data = self.id.encode().to_vec(),
            "Set Features Number of Queues" => {
                let asked = (sqe.cdw(11) & 0xffff) + 1;
                let g = self.granted.unwrap_or(asked) - 1;
                cqe.dw0 = g | (g << 16);
            }
            "Set Features Asynchronous Event Configuration" => {
                assert_eq!(sqe.cdw(11), oaes::NS_ATTR | oaes::ANA_CHANGE, "the notices the controller offers");
            }
            "Get Log Page Changed Namespace List" => {
                cqe = Cqe::with_status(Cid(0), self.changed_status);
                data = self.changed.iter().flat_map(|n| n.to_le_bytes()).collect();
            }
            "Identify active namespace list" => {
                assert_eq!(sqe.cdw(10) & 0xff, u32::from(cns::ACTIVE_NS_LIST));
                let after = sqe.nsid().0;
                let page: Vec<Nsid> = self.nsids.iter().filter(|&&n| n > after).take(1024).map(|&n| Nsid(n)).collect();
                data = nvme::identify::encode_ns_list(page, Nsid(after)).to_vec();
            }
            "Get Log Page ANA" => match &self.ana {
                Ok(log) => {
                    // NUMDL/NUMDU and the offset (CDW12/13) say which part.
                    let numd = ((sqe.cdw(10) >> 16) | ((sqe.cdw(11) & 0xffff) << 16)) + 1;
                    let off = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
                    let mut full = log.encode(false);
                    full.resize(full.len().max(off as usize + numd as usize * 4), 0);
                    data = full[off as usize..off as usize + numd as usize * 4].to_vec();
                }
                Err(s) => cqe = Cqe::with_status(Cid(0), *s),
            },
            "Identify Namespace" => {
                data = self.ns.get(&sqe.nsid().0).cloned().unwrap_or_default().encode().to_vec();
            }
            "Identify Namespace Identification Descriptors" => match &self.descs {
                Ok(d) => data = nvme::identify::encode_ns_descs(d).to_vec(),
                Err(s) => cqe = Cqe::with_status(Cid(0), *s),
            },
            other => panic!("the bring-up sent a command the script does not know: {other}"),
        }
        if let Some(b) = io.buf.as_mut() {
            assert!(data.len() <= b.capacity(), "{what}: {} bytes do not fit the buffer", data.len());
            b.as_full_mut()[..data.len()].copy_from_slice(&data);
        }
        Done { token: 0, tag: 0, cqe, buf: io.buf }
    }
}

/// What a run of the machine showed.
struct Run {
    out: Result<Brought, Error>,
    /// Virtual time at the end, ns.
    now: u64,
    sleeps: u32,
    /// The I/O queue connects asked for: (count, entries, in-capsule bytes).
    connects: Vec<(usize, u16, usize)>,
}

fn cfg() -> BringupConfig {
    BringupConfig { want_queues: 4, queue_size: 128 }
}

/// Drives `m` against `f` in virtual time, as a driver does.
fn run(f: &mut Fake, cfg: BringupConfig) -> Run {
    let mut m = Bringup::new(cfg);
    let mut r = Run { out: Err(Error::new(ErrorKind::Protocol, "not run")), now: 0, sleeps: 0, connects: Vec::new() };
    for _ in 0..100_000 {
        match m.poll(r.now) {
            Next::Command { io, what } => {
                let d = f.answer(io, what);
                r.now += RTT_NS;
                m.on_done(r.now, &d);
            }
            Next::Sleep { until_ns } => {
                assert!(until_ns > r.now, "a sleep into the past");
                r.sleeps += 1;
                r.now = until_ns;
            }
            Next::ConnectIo { count, entries, max_in_capsule } => {
                r.connects.push((count, entries, max_in_capsule));
                m.io_connected();
            }
            Next::Wait => panic!("nothing is outstanding between polls here"),
            Next::Done(b) => {
                r.out = Ok(b);
                break;
            }
            Next::Failed(e) => {
                r.out = Err(e);
                break;
            }
        }
    }
    r
}

fn names(f: &Fake) -> Vec<&str> {
    f.sent.iter().map(String::as_str).collect()
}

#[test]
fn a_normal_bring_up_takes_the_real_steps_in_order_and_learns_every_namespace() {
    let mut f = Fake::new();
    let r = run(&mut f, cfg());
    let b = r.out.expect("the bring-up succeeds");
    let mut want = vec!["Property Get CAP", "Property Set CC"];
    want.extend(["Property Get CSTS"; 4]);
    want.extend([
        "Identify Controller",
        "Set Features Number of Queues",
        "Set Features Asynchronous Event Configuration",
        "Identify active namespace list",
        "Get Log Page ANA",
        "Identify Namespace",
        "Identify Namespace Identification Descriptors",
        "Identify Namespace",
        "Identify Namespace Identification Descriptors",
    ]);
    assert_eq!(names(&f), want);
    assert_eq!(r.sleeps, 3, "one pause between CSTS reads until RDY");
    // Entries: the asked 128, MQES + 1 = 128, MAXCMD 64.
    assert_eq!(r.connects, vec![(4, 64, 8192)], "the I/O queues connect after Number of Queues");
    assert_eq!((b.io_queues, b.entries, b.cap.mqes, b.id.maxcmd), (4, 64, 127, 64));
    let uuid = Some([0x33; 16]);
    let ns1 = NsInfo {
        nsid: Nsid(1),
        nsze: 1000,
        block_shift: 12,
        anagrpid: AnaGrpId(1),
        ana_state: AnaState::Optimized,
        nguid: [0x11; 16],
        eui64: [0; 8],
        uuid,
        shared: true,
    };
    let ns2 = NsInfo {
        nsid: Nsid(2),
        nsze: 2000,
        anagrpid: AnaGrpId(2),
        ana_state: AnaState::NonOptimized,
        nguid: [0x22; 16],
        ..ns1.clone()
    };
    assert_eq!(b.namespaces, vec![ns1, ns2]);
}

#[test]
fn csts_rdy_that_never_comes_fails_at_cap_to() {
    let mut f = Fake::new();
    f.ready_after = None;
    f.to = 3; // 1.5 s
    let r = run(&mut f, cfg());
    let e = r.out.expect_err("the controller never became ready");
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("CSTS.RDY not set within CAP.TO"), "{e}");
    assert!(r.now > 1_500_000_000, "gave up at {} ns, before CAP.TO", r.now);
    assert!(r.now < 1_510_000_000, "gave up at {} ns, long after CAP.TO", r.now);
    assert_eq!(f.sent.last().map(String::as_str), Some("Property Get CSTS"), "nothing after the last CSTS read");
    assert!(r.connects.is_empty());
}

#[test]
fn a_controller_fatal_status_while_enabling_fails_at_once() {
    let mut f = Fake::new();
    f.fatal = true;
    let e = run(&mut f, cfg()).out.expect_err("CFS");
    assert!(e.to_string().contains("controller fatal status"), "{e}");
    assert_eq!(f.csts_reads, 1);
}

#[test]
fn an_unusable_identify_controller_is_refused_before_any_queue_is_asked_for() {
    for (ioccsz, icdoff, maxcmd) in [(3, 0, 64), (516, 1, 64), (516, 0, 0)] {
        let mut f = Fake::new();
        (f.id.ioccsz, f.id.icdoff, f.id.maxcmd) = (ioccsz, icdoff, maxcmd);
        let r = run(&mut f, cfg());
        let e = r.out.expect_err("unusable");
        assert_eq!(e.kind, ErrorKind::Protocol);
        assert_eq!(e.to_string(), format!("unusable controller: ioccsz {ioccsz} icdoff {icdoff} maxcmd {maxcmd}"));
        assert_eq!(f.sent.last().map(String::as_str), Some("Identify Controller"));
        assert!(r.connects.is_empty());
    }
}

#[test]
fn fewer_queues_granted_than_asked_connect_only_those_and_never_more_than_asked() {
    let mut f = Fake::new();
    f.granted = Some(3);
    let r = run(&mut f, BringupConfig { want_queues: 8, queue_size: 32 });
    let b = r.out.expect("the bring-up succeeds");
    assert_eq!(r.connects, vec![(3, 32, 8192)]);
    assert_eq!(b.io_queues, 3);
    let mut f = Fake::new();
    f.granted = Some(16);
    let r = run(&mut f, BringupConfig { want_queues: 2, queue_size: 32 });
    assert_eq!(r.connects, vec![(2, 32, 8192)], "a controller granting more gets what was asked");
}

#[test]
fn a_namespace_whose_identify_says_no_blocks_is_left_out() {
    let mut f = Fake::new();
    f.nsids = vec![1, 2, 3];
    f.ns.insert(2, namespace(0, 1, 0x44));
    f.ns.insert(3, namespace(3000, 1, 0x55));
    let b = run(&mut f, cfg()).out.expect("the bring-up succeeds");
    let got: Vec<(u32, u64)> = b.namespaces.iter().map(|n| (n.nsid.0, n.nsze)).collect();
    assert_eq!(got, vec![(1, 1000), (3, 3000)]);
}

#[test]
fn an_ana_log_that_cannot_be_read_fails_the_bring_up() {
    let mut f = Fake::new();
    f.ana = Err(Status::INVALID_FIELD);
    let e = run(&mut f, cfg()).out.expect_err("no ANA log");
    assert_eq!(e.kind, ErrorKind::Status);
    assert_eq!(e.status, Some(Status::INVALID_FIELD));
    assert!(e.to_string().starts_with("Get Log Page ANA"), "{e}");
    assert_eq!(f.sent.last().map(String::as_str), Some("Get Log Page ANA"), "no namespace identified after it");
}

#[test]
fn a_controller_without_ana_gets_no_ana_log_read_and_its_namespaces_are_optimized() {
    let mut f = Fake::new();
    f.id.cmic = 0;
    f.ana = Err(Status::INVALID_FIELD);
    let b = run(&mut f, cfg()).out.expect("the bring-up succeeds");
    assert!(!names(&f).contains(&"Get Log Page ANA"));
    assert!(b.namespaces.iter().all(|n| n.ana_state == AnaState::Optimized));
}

#[test]
fn no_notice_offered_means_no_async_event_configuration() {
    let mut f = Fake::new();
    f.id.oaes = 0;
    run(&mut f, cfg()).out.expect("the bring-up succeeds");
    assert!(!names(&f).contains(&"Set Features Asynchronous Event Configuration"));
}

#[test]
fn a_transport_error_ends_the_bring_up_naming_the_step() {
    let mut m = Bringup::new(cfg());
    let Next::Command { what, .. } = m.poll(0) else { panic!("CAP first") };
    assert_eq!(what, "Property Get CAP");
    m.on_error(Error::new(ErrorKind::Timeout, "queue 0: no answer in time"));
    let Next::Failed(e) = m.poll(1) else { panic!("failed") };
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(e.to_string(), "Property Get CAP: queue 0: no answer in time");
}

#[test]
fn a_connect_failure_of_the_driver_ends_the_bring_up_with_its_error() {
    let mut f = Fake::new();
    let mut m = Bringup::new(cfg());
    let mut now = 0;
    let e = loop {
        match m.poll(now) {
            Next::Command { io, what } => {
                let d = f.answer(io, what);
                now += RTT_NS;
                m.on_done(now, &d);
            }
            Next::Sleep { until_ns } => now = until_ns,
            Next::ConnectIo { .. } => m.on_error(Error::new(ErrorKind::Io, "I/O queue 2: connection refused")),
            Next::Failed(e) => break e,
            n => panic!("unexpected {n:?}"),
        }
    };
    assert_eq!(e.to_string(), "I/O queue 2: connection refused");
    assert_eq!(f.sent.last().map(String::as_str), Some("Set Features Number of Queues"));
}

#[test]
fn a_completion_no_command_waits_for_fails_the_bring_up() {
    let mut f = Fake::new();
    let mut m = Bringup::new(cfg());
    let Next::Command { io, what } = m.poll(0) else { panic!("CAP first") };
    let d = f.answer(io, what);
    m.on_done(1, &d);
    // The same answer again: the machine waits for no command now.
    m.on_done(2, &d);
    assert!(matches!(m.poll(3), Next::Failed(_)));
}

/// Drives a scan alone, as a rescan does.
fn scan(f: &mut Fake, mut s: NsScan) -> Result<Vec<NsInfo>, Error> {
    for _ in 0..100_000 {
        match s.poll(0) {
            Next::Command { io, what } => {
                let d = f.answer(io, what);
                s.on_done(&d);
            }
            Next::Done(ns) => return Ok(ns),
            Next::Failed(e) => return Err(e),
            n => panic!("a scan hands out commands only: {n:?}"),
        }
    }
    panic!("the scan never ended")
}

#[test]
fn a_rescan_reads_the_changed_list_first_then_scans_as_the_bring_up() {
    let mut f = Fake::new();
    f.changed_status = Status::INVALID_FIELD;
    f.descs = Err(Status::INVALID_FIELD);
    let id = f.id.clone();
    let ns = scan(&mut f, NsScan::rescan(&id)).expect("a changed list that cannot be read does not end the rescan");
    assert_eq!(
        names(&f)[..3],
        ["Get Log Page Changed Namespace List", "Identify active namespace list", "Get Log Page ANA"]
    );
    assert_eq!(ns.len(), 2);
    assert!(ns.iter().all(|n| n.uuid.is_none()), "no descriptor list: no UUID, the namespace stays");
}

/// Only Invalid Field in Command says the controller has no descriptor list: another error
/// on it (a data digest error is a transient transport error) fails the scan, so the UUID
/// read before is kept rather than taken as absent (which makes the namespace look replaced).
#[test]
fn a_descriptor_list_lost_to_a_transport_error_fails_the_scan_instead_of_dropping_the_uuid() {
    let mut f = Fake::new();
    f.descs = Err(Status::TRANSIENT_TRANSPORT_ERROR);
    let id = f.id.clone();
    let e = scan(&mut f, NsScan::new(&id)).expect_err("the UUID is unknown, not absent");
    assert!(e.to_string().contains("Identification Descriptors"), "{e}");
    f.descs = Err(Status::INVALID_FIELD.with_dnr(false));
    let ns = scan(&mut f, NsScan::new(&id)).expect("a controller without the list");
    assert!(ns.iter().all(|n| n.uuid.is_none()));
}

#[test]
fn a_rescan_tells_what_the_changed_list_named() {
    let mut f = Fake::new();
    f.changed = vec![2];
    let id = f.id.clone();
    let mut s = NsScan::rescan(&id);
    loop {
        match s.poll(0) {
            Next::Command { io, what } => {
                let d = f.answer(io, what);
                s.on_done(&d);
            }
            Next::Done(ns) => {
                assert_eq!(ns.len(), 2, "every namespace read again, not only the changed one");
                break;
            }
            n => panic!("{n:?}"),
        }
    }
    assert_eq!(s.changed(), Some(&[Nsid(2)][..]));
    let mut f = Fake::new();
    let id = f.id.clone();
    let mut s = NsScan::new(&id);
    while let Next::Command { io, what } = s.poll(0) {
        let d = f.answer(io, what);
        s.on_done(&d);
    }
    assert_eq!(s.changed(), None, "a scan at bring-up reads no changed list");
}

#[test]
fn an_active_list_longer_than_a_page_is_followed() {
    let mut f = Fake::new();
    f.id.cmic = 0;
    f.nsids = (1..=1500).collect();
    for n in 3..=1500 {
        f.ns.insert(n, namespace(u64::from(n), 1, 0));
    }
    let id = f.id.clone();
    let ns = scan(&mut f, NsScan::new(&id)).expect("scan");
    assert_eq!(ns.len(), 1500);
    assert_eq!(names(&f).iter().filter(|n| **n == "Identify active namespace list").count(), 2);
}

#[test]
fn an_ana_log_larger_than_one_chunk_is_read_in_chunks() {
    let mut f = Fake::new();
    // 17,000 NSIDs in the log's sizing: past the 64 KiB chunk.
    f.nsids = (1..=17_000).collect();
    f.id.nanagrpid = 1;
    let empty = namespace(0, 1, 0);
    for n in 3..=17_000 {
        f.ns.insert(n, empty.clone());
    }
    let id = f.id.clone();
    let ns = scan(&mut f, NsScan::new(&id)).expect("scan");
    assert_eq!(names(&f).iter().filter(|n| **n == "Get Log Page ANA").count(), 2);
    assert_eq!(ns.len(), 2, "the namespaces of no blocks left out");
    assert_eq!(ns[1].ana_state, AnaState::NonOptimized);
}
