//! Namespace administration while hosts are connected: a resize that the host's
//! controllers hear about (event, Changed Namespace List, Identify) and whose new blocks
//! take I/O at once; per-host visibility (Active Namespace List, Identify, I/O, ANA log,
//! events to that host only).

#![allow(clippy::cast_possible_truncation)] // test data sizes are small

mod support;

use std::sync::Arc;

use nvme::features::{AsyncEvent, fid};
use nvme::identify::{IdentifyNamespace, cns, decode_ns_list};
use nvme::log::{AnaLog, decode_changed_ns_list, lid};
use nvme::tcp::Digests;
use nvme::{Cid, Nsid, Sqe, Status};
use qpath_target::backend::Backend;
use qpath_target::namespace::{NamespaceSpec, Visibility};
use qpath_target::registry::TargetState;
use qpath_target::subsystem::Subsystem;
use support::*;

/// The NS attribute notice bit of Set Features Asynchronous Event Configuration.
const AEN_NS_ATTR: u32 = 1 << 8;
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000b";

fn subsystem(t: &TargetState) -> Arc<Subsystem> {
    t.subsystem(NQN).expect("the test subsystem")
}

/// An enabled admin queue of `hostnqn` with namespace-attribute events on and one AER
/// outstanding; returns the host and the AER's command id.
fn admin_with_aer(t: &Arc<TargetState>, hostnqn: &str) -> (Host, Cid) {
    let mut a = Host::new(t, 1);
    a.admin_up_as(hostnqn, Digests::default());
    let cid = a.cid();
    assert_eq!(a.admin(Sqe::set_features(cid, fid::ASYNC_EVENT, AEN_NS_ATTR)).0.status, Status::SUCCESS);
    let aer = a.cid();
    a.command(&Sqe::async_event_request(aer), &[]);
    assert!(a.recv().is_none(), "the AER is held");
    (a, aer)
}

fn identify_ns(a: &mut Host, nsid: u32) -> (Status, IdentifyNamespace, bool) {
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::NAMESPACE, Nsid(nsid), 0, 0));
    (c.status, IdentifyNamespace::decode(&data), data.iter().all(|&b| b == 0))
}

fn active_nsids(a: &mut Host) -> Vec<Nsid> {
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::identify(cid, cns::ACTIVE_NS_LIST, Nsid(0), 0, 0));
    assert_eq!(c.status, Status::SUCCESS);
    decode_ns_list(&data)
}

fn changed_nsids(a: &mut Host) -> Vec<Nsid> {
    let cid = a.cid();
    let (c, data) = a.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::CHANGED_NS, 0, false, 4096, 0));
    assert_eq!(c.status, Status::SUCCESS);
    decode_changed_ns_list(&data).expect("no overflow")
}

#[test]
fn a_grown_namespace_is_announced_and_its_new_blocks_take_io() {
    let t = target();
    let (mut a, aer) = admin_with_aer(&t, HOSTNQN);
    let mut q = Host::io_up(&t, 1, a.cntlid, 1, Digests::default());
    // The last 4 KiB of the 1 MiB namespace, and past it.
    assert_eq!(q.write(1, 2040, &pattern(4096, 7), 8192).status, Status::SUCCESS);
    assert_eq!(q.write(1, 2048, &pattern(4096, 8), 8192).status, Status::LBA_OUT_OF_RANGE);

    let (old, new) = subsystem(&t).resize_namespace(Nsid(1), 4 << 20).unwrap();
    assert_eq!((old, new), (1 << 20, 4 << 20));

    // The queue sees the new capacity at once: the capacity is read per command.
    assert_eq!(q.write(1, 2048, &pattern(4096, 8), 8192).status, Status::SUCCESS);
    assert_eq!(q.write(1, 8184, &pattern(4096, 9), 8192).status, Status::SUCCESS, "the new last 4 KiB");
    assert_eq!(q.write(1, 8185, &pattern(4096, 9), 8192).status, Status::LBA_OUT_OF_RANGE);
    let (c, back) = q.read(1, 2040, 8192);
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(&back[..4096], &pattern(4096, 7)[..], "data at the old end kept");
    assert_eq!(&back[4096..], &pattern(4096, 8)[..]);

    // The admin queue gets the event, the log names the NSID, Identify the new size.
    a.tick();
    let (c, _) = a.completion(aer);
    assert_eq!(c.dw0, AsyncEvent::NS_CHANGED.to_dw0());
    assert_eq!(changed_nsids(&mut a), vec![Nsid(1)]);
    let (s, id, _) = identify_ns(&mut a, 1);
    assert_eq!((s, id.nsze, id.ncap), (Status::SUCCESS, 8192, 8192));

    // Resizing to the same size changes nothing and raises no event.
    let aer = a.cid();
    a.command(&Sqe::async_event_request(aer), &[]);
    subsystem(&t).resize_namespace(Nsid(1), 4 << 20).unwrap();
    a.tick();
    assert!(a.recv().is_none(), "no event for a resize to the same size");
}

#[test]
fn shrinking_is_refused_while_data_lies_past_the_new_end() {
    let t = target();
    let s = subsystem(&t);
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    assert_eq!(q.write(1, 1500, &pattern(512, 3), 8192).status, Status::SUCCESS);

    let e = s.resize_namespace(Nsid(1), 512 << 10).unwrap_err();
    assert!(
        e.to_string().contains("namespace 1 of nqn.2024-01.io.qpath:test")
            && e.to_string().contains("block 1500 (byte 768000) past the new end holds data"),
        "{e}"
    );
    assert_eq!(q.read(1, 1500, 512).1, pattern(512, 3), "a refused shrink keeps the data and the size");

    // Zeroed (Write Zeroes), the blocks no longer hold data: now it shrinks.
    let cid = q.cid();
    let wz = Sqe::write_zeroes(cid, Nsid(1), 1500, 1, false);
    q.command(&wz, &[]);
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    s.resize_namespace(Nsid(1), 512 << 10).unwrap();
    assert_eq!(q.read(1, 1023, 512).0.status, Status::SUCCESS);
    assert_eq!(q.read(1, 1024, 512).0.status, Status::LBA_OUT_OF_RANGE);
    let (st, id, _) = identify_ns(&mut a, 1);
    assert_eq!((st, id.nsze), (Status::SUCCESS, 1024));

    // Grown back, the blocks past the shrink read as zeros.
    s.resize_namespace(Nsid(1), 1 << 20).unwrap();
    let (c, back) = q.read(1, 1024, 512 << 10);
    assert_eq!(c.status, Status::SUCCESS);
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn bad_resizes_are_refused_with_the_namespace_and_the_reason() {
    let t = target();
    let s = subsystem(&t);
    let msg = |size: u64| s.resize_namespace(Nsid(1), size).unwrap_err().to_string();
    assert!(msg(0).contains("cannot be resized to 0 bytes"), "{}", msg(0));
    assert!(msg(1000).contains("not a multiple of the 512-byte block size"), "{}", msg(1000));
    assert!(msg(1 << 63).contains("beyond the largest namespace"), "{}", msg(1 << 63));
    let e = s.resize_namespace(Nsid(7), 1 << 20).unwrap_err();
    assert_eq!(e.kind, qpath_target::ErrorKind::NotFound, "{e}");

    // A RAM namespace grows up to the max_size it was made with.
    s.add_namespace(NamespaceSpec {
        nsid: 2,
        backend: Backend::ram_growable(1 << 20, 2 << 20, uring::RegionOptions::default()).unwrap(),
        size: None,
        block_size: 4096,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    })
    .unwrap();
    let e = s.resize_namespace(Nsid(2), 3 << 20).unwrap_err().to_string();
    assert!(e.contains("namespace 2 of") && e.contains("grows up to its max_size, 2097152 bytes"), "{e}");
    assert!(s.resize_namespace(Nsid(2), (1 << 20) + 512).unwrap_err().to_string().contains("4096-byte block"));
    assert_eq!(s.resize_namespace(Nsid(2), 2 << 20).unwrap(), (1 << 20, 2 << 20));
    // A null namespace keeps no data: any size within the limits.
    s.add_namespace(NamespaceSpec {
        nsid: 3,
        backend: Backend::Null,
        size: Some(1 << 30),
        block_size: 512,
        anagrpid: 1,
        uuid: None,
        readonly: false,
        ptpl_file: None,
    })
    .unwrap();
    assert_eq!(s.resize_namespace(Nsid(3), 1 << 40).unwrap(), (1 << 30, 1 << 40));
    assert_eq!(s.resize_namespace(Nsid(3), 4096).unwrap(), (1 << 40, 4096));
}

/// A file namespace in a fresh directory, `len` bytes, sparse.
fn file_namespace(t: &TargetState, nsid: u32, name: &str, len: u64) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("qpath-nsadmin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    let backend = open_file(&path, Some(len)).unwrap();
    subsystem(t)
        .add_namespace(NamespaceSpec {
            nsid,
            backend: Backend::File(backend),
            size: None,
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        })
        .unwrap();
    path
}

#[test]
fn a_file_namespace_resizes_its_file_and_refuses_to_cut_data() {
    let t = target();
    let s = subsystem(&t);
    let path = file_namespace(&t, 2, "file", 2 << 20);
    let len = || std::fs::metadata(&path).unwrap().len();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());

    s.resize_namespace(Nsid(2), 4 << 20).unwrap();
    assert_eq!(len(), 4 << 20, "growing extends the file");
    assert_eq!(q.write(2, 100, &pattern(4096, 4), 8192).status, Status::SUCCESS);

    // Nothing was written past 3 MiB: on a file system that tracks holes the tail goes,
    // and the file with it.
    let f = std::fs::File::open(&path).unwrap();
    let tracks_holes = uring::seek_data(std::os::fd::AsFd::as_fd(&f), 3 << 20).unwrap().is_none();
    if tracks_holes {
        s.resize_namespace(Nsid(2), 3 << 20).unwrap();
        assert_eq!(len(), 3 << 20, "shrinking truncates the file");
        s.resize_namespace(Nsid(2), 4 << 20).unwrap();
    } else {
        println!("SKIP: this file system reports no holes (SEEK_DATA): a file namespace cannot shrink here");
    }

    assert_eq!(q.write(2, 8000, &pattern(4096, 5), 8192).status, Status::SUCCESS, "past 3 MiB");
    assert_eq!(q.read(2, 8000, 4096).1, pattern(4096, 5));
    assert_eq!(q.read(2, 100, 4096).1, pattern(4096, 4), "data below kept across the resizes");
    // Data at block 8000 (byte 4096000): a shrink below it is refused and changes nothing.
    let e = s.resize_namespace(Nsid(2), 3 << 20).unwrap_err().to_string();
    assert!(e.contains("namespace 2 of") && e.contains("past the new end holds data"), "{e}");
    assert_eq!(len(), 4 << 20, "a refused shrink leaves the file alone");
    assert_eq!(q.read(2, 8000, 4096).1, pattern(4096, 5));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_block_device_namespace_is_not_resized_needs_root() {
    if !is_root() {
        println!("SKIP: needs root for a loop device");
        return;
    }
    let dir = std::env::temp_dir().join(format!("qpath-nsadmin-{}-loop", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("loop.img");
    std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let out = std::process::Command::new("losetup").args(["-f", "--show"]).arg(&img).output();
    let dev = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            println!("SKIP: no loop device (losetup: {other:?})");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    };
    let t = target();
    let backend = open_file(std::path::Path::new(&dev), None);
    let result = backend.map(|b| {
        subsystem(&t)
            .add_namespace(NamespaceSpec {
                nsid: 2,
                backend: Backend::File(b),
                size: None,
                block_size: 512,
                anagrpid: 1,
                uuid: None,
                readonly: false,
                ptpl_file: None,
            })
            .unwrap();
        subsystem(&t).resize_namespace(Nsid(2), 8 << 20)
    });
    subsystem(&t).remove_namespace(Nsid(2)).ok();
    drop(t);
    let _ = std::process::Command::new("losetup").args(["-d", &dev]).status();
    let _ = std::fs::remove_dir_all(&dir);
    let e = result.expect("the loop device opens").unwrap_err().to_string();
    assert!(e.contains(&format!("{dev} is a block device")), "{e}");
}

/// Whether this process runs as root (its effective uid in /proc/self/status).
fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2));
    uid == Some("0")
}

#[test]
fn a_listed_namespace_is_inactive_for_other_hosts() {
    let t = target();
    let s = subsystem(&t);
    s.add_namespace_with(
        NamespaceSpec {
            nsid: 2,
            backend: Backend::ram(1 << 20).unwrap(),
            size: None,
            block_size: 512,
            anagrpid: 2,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        },
        Visibility::listed([HOSTNQN.to_string()]).unwrap(),
    )
    .unwrap();
    s.set_access(qpath_target::subsystem::HostAccess {
        allow_any: false,
        hosts: vec![HOSTNQN.to_string(), HOST_B.to_string()],
    });
    let (mut a, aer_a) = admin_with_aer(&t, HOSTNQN);
    let (mut b, aer_b) = admin_with_aer(&t, HOST_B);
    let mut qa = Host::io_up(&t, 1, a.cntlid, 1, Digests::default());
    let mut qb = Host::io_up_as(&t, 1, b.cntlid, 1, HOST_B, Digests::default());

    assert_eq!(active_nsids(&mut a), vec![Nsid(1), Nsid(2)]);
    assert_eq!(active_nsids(&mut b), vec![Nsid(1)], "host B does not see NSID 2");
    let (st, id, _) = identify_ns(&mut a, 2);
    assert_eq!((st, id.nsze), (Status::SUCCESS, 2048));
    let (st, _, zeros) = identify_ns(&mut b, 2);
    assert_eq!((st, zeros), (Status::SUCCESS, true), "an inactive NSID identifies as zeros");
    assert_eq!(qa.write(2, 0, &pattern(512, 1), 8192).status, Status::SUCCESS);
    assert_eq!(qb.write(2, 0, &pattern(512, 2), 8192).status, Status::INVALID_NS);
    assert_eq!(qb.read(2, 0, 512).0.status, Status::INVALID_NS);
    let ana_groups = |h: &mut Host| {
        let cid = h.cid();
        let (_, data) = h.admin(Sqe::get_log_page(cid, Nsid::BROADCAST, lid::ANA, 0, false, 4096, 0));
        AnaLog::decode(&data).unwrap().groups.iter().map(|g| (g.grpid.0, g.nsids.clone())).collect::<Vec<_>>()
    };
    assert_eq!(ana_groups(&mut a), vec![(1, vec![Nsid(1)]), (2, vec![Nsid(2)])]);
    assert_eq!(ana_groups(&mut b), vec![(1, vec![Nsid(1)])], "B's ANA log does not list NSID 2 or its group");

    // ns_add_host: B's controller hears about it and sees it at once; A hears nothing.
    assert!(s.set_ns_host(Nsid(2), HOST_B, true).unwrap());
    assert!(!s.set_ns_host(Nsid(2), HOST_B, true).unwrap(), "already listed: no change");
    b.tick();
    assert_eq!(b.completion(aer_b).0.dw0, AsyncEvent::NS_CHANGED.to_dw0());
    assert_eq!(changed_nsids(&mut b), vec![Nsid(2)]);
    assert_eq!(active_nsids(&mut b), vec![Nsid(1), Nsid(2)]);
    assert_eq!(qb.read(2, 0, 512).1, pattern(512, 1), "B reads what A wrote");
    a.tick();
    assert!(a.recv().is_none(), "A's view did not change: no event");

    // ns_remove_host: B's queues refuse the NSID again, and B hears of it.
    assert!(s.set_ns_host(Nsid(2), HOST_B, false).unwrap());
    assert_eq!(qb.read(2, 0, 512).0.status, Status::INVALID_NS);
    assert_eq!(active_nsids(&mut b), vec![Nsid(1)]);
    let aer_b = b.cid();
    b.command(&Sqe::async_event_request(aer_b), &[]);
    b.tick();
    assert_eq!(b.completion(aer_b).0.dw0, AsyncEvent::NS_CHANGED.to_dw0());
    assert_eq!(changed_nsids(&mut b), vec![Nsid(2)]);
    a.tick();
    assert!(a.recv().is_none());

    // A resize reaches only the controllers that see the namespace.
    let aer_b = b.cid();
    b.command(&Sqe::async_event_request(aer_b), &[]);
    s.resize_namespace(Nsid(2), 2 << 20).unwrap();
    a.tick();
    assert_eq!(a.completion(aer_a).0.dw0, AsyncEvent::NS_CHANGED.to_dw0());
    assert_eq!(changed_nsids(&mut a), vec![Nsid(2)]);
    b.tick();
    assert!(b.recv().is_none(), "B does not see NSID 2: no event for its resize");

    // A namespace every host sees takes no per-host changes; unknown NSIDs and bad NQNs fail.
    let e = s.set_ns_host(Nsid(1), HOST_B, false).unwrap_err().to_string();
    assert!(e.contains("namespace 1 of") && e.contains("visible to every host"), "{e}");
    assert_eq!(s.set_ns_host(Nsid(9), HOST_B, true).unwrap_err().kind, qpath_target::ErrorKind::NotFound);
    assert!(s.set_ns_host(Nsid(2), "not an nqn", true).is_err());
}

#[test]
fn a_controller_made_later_starts_with_its_hosts_view() {
    let t = target();
    let s = subsystem(&t);
    s.add_namespace_with(
        NamespaceSpec {
            nsid: 3,
            backend: Backend::Null,
            size: Some(1 << 20),
            block_size: 512,
            anagrpid: 1,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        },
        Visibility::listed([]).unwrap(),
    )
    .unwrap();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    assert_eq!(active_nsids(&mut a), vec![Nsid(1)], "listed for nobody: nobody sees it");
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());
    assert_eq!(q.read(3, 0, 512).0.status, Status::INVALID_NS);
    s.set_ns_host(Nsid(3), HOSTNQN, true).unwrap();
    assert_eq!(q.read(3, 0, 512).0.status, Status::SUCCESS);
    let mut a2 = Host::new(&t, 2);
    a2.admin_up(Digests::default());
    assert_eq!(active_nsids(&mut a2), vec![Nsid(1), Nsid(3)]);
}

#[test]
fn ana_changes_reach_only_hosts_that_see_a_namespace_of_the_group() {
    let t = target();
    let s = subsystem(&t);
    s.add_namespace_with(
        NamespaceSpec {
            nsid: 2,
            backend: Backend::Null,
            size: Some(1 << 20),
            block_size: 512,
            anagrpid: 2,
            uuid: None,
            readonly: false,
            ptpl_file: None,
        },
        Visibility::listed([HOSTNQN.to_string()]).unwrap(),
    )
    .unwrap();
    s.set_access(qpath_target::subsystem::HostAccess {
        allow_any: false,
        hosts: vec![HOSTNQN.to_string(), HOST_B.to_string()],
    });
    let ana_aer = |hostnqn: &str| {
        let mut h = Host::new(&t, 1);
        h.admin_up_as(hostnqn, Digests::default());
        let cid = h.cid();
        assert_eq!(h.admin(Sqe::set_features(cid, fid::ASYNC_EVENT, 1 << 11)).0.status, Status::SUCCESS);
        let aer = h.cid();
        h.command(&Sqe::async_event_request(aer), &[]);
        (h, aer)
    };
    let (mut a, aer_a) = ana_aer(HOSTNQN);
    let (mut b, _) = ana_aer(HOST_B);
    t.set_ana_state(1, nvme::AnaGrpId(2), nvme::AnaState::Inaccessible).unwrap();
    a.tick();
    assert_eq!(a.completion(aer_a).0.dw0, AsyncEvent::ANA_CHANGE.to_dw0());
    b.tick();
    assert!(b.recv().is_none(), "B sees no namespace of group 2: its ANA log did not change");
}

/// Opens (or creates, with a size) a file or device for a namespace.
fn open_file(
    path: &std::path::Path,
    size: Option<u64>,
) -> Result<qpath_target::backend::FileBackend, qpath_target::Error> {
    use qpath_target::backend::{Access, FileBackend, FileRequest};
    let req = FileRequest { path, size, grow: false, access: Access::ReadWrite, owner: "a test namespace" };
    FileBackend::open(&req).map(|(b, _)| b)
}

/// The last 16 blocks of a 4 MiB namespace, which a shrink to 3 MiB cuts off.
const TAIL_SLBA: u64 = (4 << 20) / 512 - 16;

/// Sends a Write of `data` to `slba` of `nsid` without in-capsule data: the target
/// answers with an R2T, returned here; the data is the caller's to send (or to hold back).
fn write_to_r2t(q: &mut Host, nsid: u32, slba: u64, data: &[u8]) -> (Cid, nvme::tcp::R2t) {
    let cid = q.cid();
    let nlb = u32::try_from(data.len() / 512).unwrap();
    let sgl = nvme::SglDescriptor::transport(data.len() as u32);
    q.command(&Sqe::rw(nvme::opcode::io::WRITE, cid, Nsid(nsid), slba, nlb, sgl), &[]);
    match q.expect().header {
        nvme::tcp::Header::R2T(r) => (cid, r),
        h => panic!("expected an R2T, got {h:?}"),
    }
}

/// The H2CData PDU that answers `r2t` with all of `data` (at most 64 KiB).
fn h2c_data(q: &Host, cid: Cid, r2t: &nvme::tcp::R2t, data: &[u8]) -> Vec<u8> {
    let d = nvme::tcp::DataHeader {
        cccid: cid,
        ttag: r2t.ttag,
        datao: 0,
        datal: data.len() as u32,
        last: true,
        success: false,
    };
    let mut out = Vec::new();
    let w = q.enc.h2c_data(&mut out, &d);
    out.extend_from_slice(data);
    assert!(!w.ddgst, "no data digest on this connection");
    out
}

/// Whether the file system under `path` reports holes (`SEEK_DATA`): a file namespace
/// shrinks only where it finds none.
fn tracks_holes(path: &std::path::Path, from: u64) -> bool {
    let f = std::fs::File::open(path).unwrap();
    uring::seek_data(std::os::fd::AsFd::as_fd(&f), from).unwrap().is_none()
}

/// A write to the blocks a shrink cuts off, checked against the old size on arrival, its
/// data held back by the host after the R2T while the shrink runs on another thread: when
/// the data comes, the write ends with LBA Out of Range, the file keeps its new size, and
/// a later grow shows those blocks never written. (Before, the write went through after
/// the truncation: the file grew past the namespace, and the data came back on a grow.)
#[test]
fn a_write_whose_data_arrives_after_a_shrink_is_refused_and_the_file_stays_cut() {
    let t = target();
    let s = subsystem(&t);
    let path = file_namespace(&t, 2, "held-data", 4 << 20);
    if !tracks_holes(&path, 0) {
        println!("SKIP: this file system reports no holes (SEEK_DATA): a file namespace cannot shrink here");
        return;
    }
    let len = || std::fs::metadata(&path).unwrap().len();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());

    let data = pattern(8192, 9);
    let (cid, r2t) = write_to_r2t(&mut q, 2, TAIL_SLBA, &data);
    let shrunk = std::thread::scope(|sc| sc.spawn(|| s.resize_namespace(Nsid(2), 3 << 20)).join().unwrap());
    assert_eq!(shrunk.unwrap(), (4 << 20, 3 << 20), "nothing past 3 MiB had reached the file");
    assert_eq!(len(), 3 << 20);

    let pdu = h2c_data(&q, cid, &r2t, &data);
    q.send(&pdu);
    let c = q.completion(cid).0;
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE, "the write's blocks are gone: it is not acknowledged");
    assert_eq!(len(), 3 << 20, "the file is never longer than the namespace");

    s.resize_namespace(Nsid(2), 4 << 20).unwrap();
    assert_eq!(q.read(2, TAIL_SLBA, 8192).1, vec![0; 8192], "grown back: blocks never written read zeros");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A write past its write gate whose completion the reactor has not taken yet (held here:
/// its file operation is done, the connection not told): a shrink over its blocks waits
/// for it; with a short bound it is refused, to be asked again, and changes nothing; with
/// the usual one it waits, the write is acknowledged, and the shrink then finds its data
/// and is refused. An acknowledged write is never cut off.
#[test]
fn a_shrink_waits_for_a_write_in_flight_to_the_blocks_it_cuts() {
    let t = target();
    let s = subsystem(&t);
    let path = file_namespace(&t, 2, "in-flight", 4 << 20);
    let len = || std::fs::metadata(&path).unwrap().len();
    let mut a = Host::new(&t, 1);
    let cntlid = a.admin_up(Digests::default());
    let mut q = Host::io_up(&t, 1, cntlid, 1, Digests::default());

    let data = pattern(8192, 11);
    let (cid, r2t) = write_to_r2t(&mut q, 2, TAIL_SLBA, &data);
    let pdu = h2c_data(&q, cid, &r2t, &data);
    assert_eq!(q.feed_only(&pdu), pdu.len());
    assert!(q.recv().is_none(), "the write's completion is held");

    let e = s.resize_namespace_within(Nsid(2), 3 << 20, std::time::Duration::from_millis(200)).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("namespace 2 of") && e.contains("did not finish") && e.contains("try again"), "{e}");
    assert_eq!(identify_ns(&mut a, 2).1.nsze, (4 << 20) / 512, "a refused shrink keeps the old size");
    assert_eq!(len(), 4 << 20);

    std::thread::scope(|sc| {
        let shrink = sc.spawn(|| s.resize_namespace(Nsid(2), 3 << 20));
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!shrink.is_finished(), "the shrink waits for the write in flight");
        q.pump();
        let e = shrink.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("past the new end holds data"), "{e}");
    });
    assert_eq!(q.completion(cid).0.status, Status::SUCCESS);
    assert_eq!(len(), 4 << 20, "the refused shrink left the file alone");
    assert_eq!(q.read(2, TAIL_SLBA, 8192).1, data, "the acknowledged write is kept");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
