//! The failover hold: how long a command that may still execute on a lost path waits
//! before it is sent again (NVMe Base 2.1 Command Quiesce Time, TP4129).
//!
//! ```text
//!   connection lost with a write on it ──► the write's fate on that controller is unknown
//!        │  held ≥ detection + quiesce   (reads and flushes go at once)
//!        ▼
//!   sent again on any path  ── the old controller has detected the loss (keep-alive)
//!                              and quiesced its commands: nothing of it lands later
//! ```
//!
//! A command the host aborted because its connection failed (or timed out) may still be
//! in the target's hands: received and waiting for its data, executing, or its
//! completion lost on the way back. Sent again at once on another path, a write can be
//! acknowledged, overwritten by a newer write, and then overtaken by the first copy still
//! landing on the old path: an acknowledged write is lost. The simulator found exactly
//! that (first seed 0; `qpath sim --seed 18 --no-failover-quiesce` shows it now).
//!
//! NVMe Base 2.1 §3.9 (TP4129, "Command Quiesce Time"): after communication loss the
//! host waits until the controller must have noticed it (Keep Alive Timeout: 2 × KATO
//! with command-based keep-alive, 3 × KATO when the controller does traffic-based
//! keep-alive, CTRATT.TBKAS) and then for the controller to quiesce its outstanding
//! commands (CQT in Identify Controller, in ms; 0 = not reported). Linux's patches for
//! TP4129 (2025: `nvme: delay failover by command quiesce timeout`, and the
//! `nvmef_req_hold_timeout_ms` variant of the same series, `drivers/nvme/host/`
//! `multipath.c`, `fabrics.h`) park failed-over requests on a per-controller list for
//! that time; they hold reads too, we do not: a read changes nothing, so a late copy of
//! it is harmless.
//!
//! Everything here is a pure function: the block core (`context`) and the simulator's
//! stand-in host (`qpath-sim`) both call it.

use std::time::Duration;

use nvme::Status;

use crate::context::ContextOptions;
use nvme::opcode::io as opc;

/// CTRATT bit 6: the controller restarts its keep-alive timer on any command (TBKAS).
pub const CTRATT_TBKAS: u32 = 1 << 6;

/// Whether a command with this I/O opcode changes the namespace's data (and so must not
/// run twice out of order with a later write): writes, Write Zeroes, Dataset Management
/// (deallocate), Copy, Write Uncorrectable. Compare and Write is a fused Compare + Write:
/// its Write half is a write.
#[inline]
pub fn changes_data(opcode: u8) -> bool {
    matches!(opcode, opc::WRITE | opc::WRITE_ZEROES | opc::DATASET_MANAGEMENT | opc::COPY | opc::WRITE_UNCORRECTABLE)
}

/// Whether a command that came back with `status` may still execute on its controller:
/// only a status the host made up when it gave up on the connection (the command's fate
/// there is unknown). A path error the controller itself returned (ANA inaccessible or
/// in transition, a controller pathing error) completed the command there: nothing of it
/// is left to land.
#[inline]
pub fn fate_unknown(status: Status) -> bool {
    status == Status::HOST_PATH_ERROR || status == Status::ABORTED_BY_HOST
}

/// Whether a command must be held before it is sent again: it changes data and its
/// controller may still execute it.
#[inline]
pub fn must_hold(opcode: u8, status: Status) -> bool {
    changes_data(opcode) && fate_unknown(status)
}

/// What the hold is computed from (a controller's Identify data and connect options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldInputs {
    /// Keep Alive Timeout the host asked for at Connect, ms (0 = none).
    pub kato_ms: u32,
    /// KAS from Identify Controller: the controller's keep-alive granularity, 100 ms units
    /// (it rounds KATO up to it).
    pub kas: u16,
    /// CTRATT from Identify Controller.
    pub ctratt: u32,
    /// CQT from Identify Controller, ms (0 = not reported).
    pub cqt_ms: u16,
    /// The quiesce time assumed when the controller reports no CQT (`None`: one KATO).
    pub quiesce_default: Option<Duration>,
}

/// How long a command that may still execute on a lost controller is held before it is
/// sent again: the time the controller takes to notice the loss (2 × KATO, 3 × KATO with
/// traffic-based keep-alive, KATO rounded up to KAS as the controller does) plus its
/// Command Quiesce Time (or the default). Without keep-alive (KATO 0) a controller may
/// never notice a silent loss: only the quiesce part is waited for then.
pub fn hold_time(i: HoldInputs) -> Duration {
    let kato_ms = u64::from(i.kato_ms);
    let gran = u64::from(i.kas) * 100;
    let kato_ms = if gran > 0 { kato_ms.div_ceil(gran) * gran } else { kato_ms };
    let detect_ms = if i.ctratt & CTRATT_TBKAS != 0 { 3 * kato_ms } else { 2 * kato_ms };
    let quiesce = if i.cqt_ms > 0 {
        Duration::from_millis(u64::from(i.cqt_ms))
    } else {
        i.quiesce_default.unwrap_or(Duration::from_millis(kato_ms))
    };
    Duration::from_millis(detect_ms) + quiesce
}

/// Whether `status` says the queue the command went on is no longer authenticated:
/// Authentication Required (NVMe Base 2.1, Fabrics command status values: 91h, Command
/// Specific, with DNR) on a queue that was live, so one that authenticated at its
/// bring-up. The target takes a queue's authentication away when a re-authentication
/// fails (a host still holding a rotated-out key) and answers its other commands so until
/// it closes the queue. The command was not executed: the queue is lost, not the command
/// (the DNR is the queue's, not the namespace's). A reconnect authenticates again with the
/// host's current key; another path may be authenticated now. Linux's host completes
/// such I/O with the error (its `nvme_decide_disposition` honours the DNR); qpath treats
/// it as a path error, bounded as one by `ctrl_loss_tmo` and the retry limits.
#[inline]
pub fn lost_authentication(status: Status) -> bool {
    status.with_dnr(true) == Status::AUTH_REQUIRED
}

/// What becomes of a request whose command came back with `status` (Linux
/// `nvme_decide_disposition`): the caller gets it, or it goes out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Complete it to the caller with the status.
    Complete,
    /// A multipath device: route it again (another path, or wait for one).
    Failover,
    /// A single path lost its connection: wait on the queue for the reconnect.
    Requeue,
}

/// The disposition of a request that already went through `retries` path changes
/// (multipath) or transport retries (single path). On a single path only a transport
/// failure (or a queue that lost its authentication, [`lost_authentication`]) is retried,
/// as Linux requeues the first, and not once `ctrl_gone` (the controller is dead or past
/// fast_io_fail_tmo; asked only then: it takes the controller's lock).
#[inline]
pub fn disposition(
    status: Status,
    multipath: bool,
    retries: u32,
    opts: &ContextOptions,
    ctrl_gone: impl FnOnce() -> bool,
) -> Disposition {
    if multipath {
        if (status.is_path_error() || lost_authentication(status)) && retries < opts.max_failovers {
            return Disposition::Failover;
        }
    } else if (status == Status::HOST_PATH_ERROR || lost_authentication(status))
        && retries < opts.max_retries
        && !ctrl_gone()
    {
        return Disposition::Requeue;
    }
    Disposition::Complete
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_commands_that_change_data_and_whose_fate_is_unknown_are_held() {
        for op in [opc::WRITE, opc::WRITE_ZEROES, opc::DATASET_MANAGEMENT, opc::COPY, opc::WRITE_UNCORRECTABLE] {
            assert!(must_hold(op, Status::HOST_PATH_ERROR), "opcode {op:#x}");
            assert!(must_hold(op, Status::ABORTED_BY_HOST), "opcode {op:#x}");
            // The controller answered: the command is over there.
            assert!(!must_hold(op, Status::ANA_INACCESSIBLE), "opcode {op:#x}");
            assert!(!must_hold(op, Status::ANA_TRANSITION), "opcode {op:#x}");
        }
        for op in [opc::READ, opc::FLUSH, opc::COMPARE, opc::VERIFY] {
            assert!(!must_hold(op, Status::HOST_PATH_ERROR), "opcode {op:#x}");
        }
    }

    #[test]
    fn the_hold_is_detection_plus_quiesce() {
        let base = HoldInputs { kato_ms: 5000, kas: 10, ctratt: 0, cqt_ms: 0, quiesce_default: None };
        // Command-based keep-alive: 2 × KATO, plus one KATO when no CQT is reported.
        assert_eq!(hold_time(base), Duration::from_secs(15));
        // Traffic-based: 3 × KATO.
        assert_eq!(hold_time(HoldInputs { ctratt: CTRATT_TBKAS | 1, ..base }), Duration::from_secs(20));
        // A reported CQT replaces the default.
        assert_eq!(hold_time(HoldInputs { cqt_ms: 250, ..base }), Duration::from_millis(10_250));
        assert_eq!(
            hold_time(HoldInputs { quiesce_default: Some(Duration::from_millis(100)), ..base }),
            Duration::from_millis(10_100)
        );
        // KATO is rounded up to the controller's granularity (1 s here), as it rounds it.
        assert_eq!(hold_time(HoldInputs { kato_ms: 1500, ..base }), Duration::from_secs(6));
        // No keep-alive: only the quiesce part.
        assert_eq!(hold_time(HoldInputs { kato_ms: 0, cqt_ms: 40, ..base }), Duration::from_millis(40));
    }
}
