//! A live queue's control command (a re-authentication's Authentication Send or
//! Receive) rides on the queue's reserved tag, beside the caller's commands, and never
//! takes the outstanding count past the submission queue's size: the controller has no
//! room for more (our target fails the connection, NVMe-oF flow control).

use nvme::tcp::{Digests, EncoderConfig, IcResp};
use nvme::{Cid, Cntlid, Cqe, Nsid, Sqe, Status};
use qpath_host::queue::{DataDir, HostQueue, Io, QueueConfig, QueueState, SubmitError};

const ENTRIES: u16 = 8;

/// A new I/O queue of `ENTRIES` entries (its ICReq queued, nothing answered).
fn fresh() -> HostQueue {
    HostQueue::new(QueueConfig::io(
        1,
        ENTRIES,
        Cntlid(1),
        "nqn.2026-11.io.qpath:ctl",
        "nqn.2014-08.org.nvmexpress:uuid:c",
        [0; 16],
    ))
}

fn live() -> HostQueue {
    let mut q = fresh();
    flush(&mut q);
    q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    let connect = q.tag_space();
    respond(&mut q, connect, Status::SUCCESS);
    assert_eq!(q.state(), QueueState::Live, "{:?}", q.error());
    q
}

fn flush(q: &mut HostQueue) {
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
}

fn respond(q: &mut HostQueue, tag: u16, status: Status) {
    let mut out = Vec::new();
    EncoderConfig::default().capsule_resp(&mut out, &Cqe::with_status(Cid(tag), status));
    q.feed(&out);
}

fn cmd(token: u64) -> Io {
    Io { sqe: Sqe::flush(Cid(0), Nsid(1)), buf: None, len: 0, dir: DataDir::None, token }
}

#[test]
fn the_control_command_waits_for_an_entry_and_then_holds_it() {
    let mut q = live();
    let ctl = q.control_tag();
    assert_eq!(ctl, ENTRIES, "one past the caller's tags (the Connect's, free once live)");
    for tag in 0..ENTRIES {
        q.submit(tag, cmd(u64::from(tag))).map_err(|(e, _)| e).unwrap();
    }
    // The SQ is full: the control command waits.
    let (e, io) = q.submit_control(cmd(99)).unwrap_err();
    assert_eq!(e, SubmitError::Full);
    respond(&mut q, 3, Status::SUCCESS);
    let done: Vec<_> = q.completions().drain(..).map(|d| d.tag).collect();
    assert_eq!(done, [3]);
    q.submit_control(io).map_err(|(e, _)| e).unwrap();
    assert_eq!(q.outstanding(), usize::from(ENTRIES));
    // While it is out, the freed caller's tag cannot take the entry back.
    let (e, io3) = q.submit(3, cmd(3)).unwrap_err();
    assert_eq!(e, SubmitError::Full);
    // One control command at a time.
    assert_eq!(q.submit_control(cmd(98)).unwrap_err().0, SubmitError::BadTag(ctl));
    flush(&mut q);
    respond(&mut q, ctl, Status::SUCCESS);
    let d = q.completions().pop().unwrap();
    assert_eq!((d.tag, d.token, d.cqe.status), (ctl, 99, Status::SUCCESS));
    q.submit(3, io3).map_err(|(e, _)| e).unwrap();
    // A control command in flight when the queue fails comes back like the others.
    respond(&mut q, 5, Status::SUCCESS);
    assert_eq!(q.completions().drain(..).map(|d| d.tag).collect::<Vec<_>>(), [5]);
    q.submit_control(cmd(97)).map_err(|(e, _)| e).unwrap();
    q.set_failed("test");
    q.abort_all(Status::HOST_PATH_ERROR);
    let mut back: Vec<_> = q.completions().drain(..).map(|d| (d.tag, d.cqe.status)).collect();
    back.sort_unstable_by_key(|&(tag, _)| tag);
    assert_eq!(back.len(), usize::from(ENTRIES), "7 of the caller's and the control command: {back:?}");
    assert!(back.iter().all(|&(_, s)| s == Status::HOST_PATH_ERROR), "{back:?}");
    assert_eq!(back.last().map(|&(tag, _)| tag), Some(ctl));
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn control_commands_need_a_live_queue() {
    let mut q = fresh();
    assert_eq!(q.submit_control(cmd(1)).unwrap_err().0, SubmitError::NotLive);
}

/// The Connect shares the reserved tag but is no command of the caller's: a queue that
/// fails before its Connect is answered aborts nothing (found by fuzzing: the abort
/// counted the Connect out of an empty outstanding count), and a response for the
/// reserved tag when no control command holds it is a protocol error, not a completion.
#[test]
fn the_connect_on_the_reserved_tag_is_never_a_completion() {
    let mut q = fresh();
    flush(&mut q);
    q.feed(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    flush(&mut q);
    assert_eq!(q.state(), QueueState::AwaitConnect);
    q.set_failed("test");
    q.abort_all(Status::HOST_PATH_ERROR);
    assert!(q.completions().is_empty());
    assert_eq!(q.outstanding(), 0);

    let mut q = live();
    let ctl = q.control_tag();
    respond(&mut q, ctl, Status::SUCCESS);
    assert!(q.completions().is_empty());
    assert_eq!(q.state(), QueueState::Failed, "a response for a tag nobody holds");
}
