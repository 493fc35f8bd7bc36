//! A request slot of the block core and its lifecycle.
//!
//! ```text
//!   Free ──submit──► Waiting ──tag──► Outstanding ──completion──► Free
//!                     ▲  │  ╲          │  ▲   │
//!                     │  │   budget    │  │   └─ fate unknown, changes data ─► Held ─┐
//!                     │  │    full ──► Budget ─┘ (budget came)                      │
//!                     │  └──────── failed at once (no path, controller gone) ─► Free │
//!                     └── failed over / requeued / refused by the queue ◄───────────┘ hold over
//! ```
//!
//! Each state carries what only it has: a request on the wire its tag and send time, a
//! held one the end of its hold. What a request keeps through its whole life (its
//! operation, range, token, the queue it was last bound to) stays beside the state.

use std::time::Instant;

use uring::IoBuf;

use super::Op;
use crate::error::BadTransition;
use nvme::Nsid;

/// Where a request is in its life, with what only that part of it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReqState {
    /// In the free list.
    Free,
    /// Waiting for a path (on its device's list), a connection or a tag (on its queue's).
    Waiting,
    /// Holds a tag and waits for its device's dispatch budget
    /// (`DepthLimitOrder::AfterTag`, on its device's budget list).
    Budget {
        /// The tag it holds.
        tag: u16,
        /// Whether the tag is of the host-wide shared set (else of its queue's own).
        shared: bool,
    },
    /// Its command is on the wire.
    Outstanding(OnWire),
    /// Its connection failed and its command may still execute on the lost controller:
    /// not sent again before `until` ([`crate::failover`]); in the core's held list.
    Held {
        /// The end of the hold.
        until: Instant,
        /// The hold outlasts the controller's `ctrl_loss_tmo`: the request fails at
        /// `until` instead of being sent again.
        fails: bool,
    },
}

/// What a request on the wire has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OnWire {
    /// Its tag (the command id).
    pub tag: u16,
    /// Whether the tag is of the host-wide shared set.
    pub shared: bool,
    /// Counted in its device's `budget_used`.
    pub budgeted: bool,
    /// Generation of the reference selector that counted it at submission (0 = none).
    pub via_reference: u32,
    /// When it was sent (the poll turn's clock, in the core's nanoseconds).
    pub sent: u64,
    /// Reported once as stalled.
    pub stall_reported: bool,
}

/// A tag a request took to go on the wire, and whether it took its device's budget too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    pub tag: u16,
    pub shared: bool,
    pub budgeted: bool,
}

impl OnWire {
    /// A request sent at `sent` under `claim`.
    pub(super) fn new(claim: Claim, sent: u64) -> OnWire {
        OnWire {
            tag: claim.tag,
            shared: claim.shared,
            budgeted: claim.budgeted,
            via_reference: 0,
            sent,
            stall_reported: false,
        }
    }
}

impl ReqState {
    /// The one place a request's lifecycle changes are decided. Every other change is a
    /// bug of the core (a request completed twice, sent while held, ...): refused.
    #[must_use = "a refused transition leaves the state as it was"]
    pub(super) fn transition(self, to: ReqState) -> Result<ReqState, BadTransition<ReqState>> {
        if self.allows(&to) { Ok(to) } else { Err(BadTransition::new(self, to)) }
    }

    /// Whether [`ReqState::transition`] takes the request to `to` (by the states' kinds
    /// alone: what they carry is not looked at, nor copied).
    #[inline]
    pub(super) fn allows(&self, to: &ReqState) -> bool {
        use ReqState::*;
        matches!(
            (self, to),
            (Free, Waiting)
                | (Waiting, Budget { .. } | Outstanding(_) | Free)
                | (Budget { .. }, Outstanding(_) | Waiting)
                | (Outstanding(_), Waiting | Held { .. } | Free)
                | (Held { .. }, Waiting | Free)
        )
    }

    /// The tag the request holds, and whether it is of the shared set.
    pub(super) fn tag(&self) -> Option<(u16, bool)> {
        match *self {
            ReqState::Budget { tag, shared } => Some((tag, shared)),
            ReqState::Outstanding(w) => Some((w.tag, w.shared)),
            _ => None,
        }
    }
}

/// A request slot.
pub(super) struct Req {
    pub state: ReqState,
    pub dev: u32,
    pub op: Op,
    pub slba: u64,
    pub nlb: u32,
    pub len: u32,
    /// The caller's buffer: with the request while it is not on the wire (then with its
    /// queue's command), back to the caller at completion.
    pub buf: Option<IoBuf>,
    pub token: u64,
    /// When it was submitted (the core's nanoseconds).
    pub start: u64,
    pub retries: u32,
    /// The queue, path and namespace it was last bound to (while waiting on a queue,
    /// on the wire, held; and, for the statistics, once completed).
    pub qkey: usize,
    pub path: u16,
    pub nsid: Nsid,
    /// It went on the wire at least once (its completion is counted on its last path).
    pub was_sent: bool,
    /// Who submitted it (a spread device's queue map key).
    pub submitter: u32,
}

impl Req {
    /// A free slot.
    pub(super) fn free() -> Req {
        Req {
            state: ReqState::Free,
            dev: 0,
            op: Op::Read,
            slba: 0,
            nlb: 0,
            len: 0,
            buf: None,
            token: 0,
            start: 0,
            retries: 0,
            qkey: 0,
            path: 0,
            nsid: Nsid(0),
            was_sent: false,
            submitter: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn all(now: Instant) -> [ReqState; 5] {
        let wire = OnWire { tag: 3, shared: false, budgeted: false, via_reference: 0, sent: 7, stall_reported: false };
        [
            ReqState::Free,
            ReqState::Waiting,
            ReqState::Budget { tag: 3, shared: true },
            ReqState::Outstanding(wire),
            ReqState::Held { until: now + Duration::from_secs(1), fails: false },
        ]
    }

    fn name(s: ReqState) -> &'static str {
        match s {
            ReqState::Free => "Free",
            ReqState::Waiting => "Waiting",
            ReqState::Budget { .. } => "Budget",
            ReqState::Outstanding(_) => "Outstanding",
            ReqState::Held { .. } => "Held",
        }
    }

    #[test]
    fn request_states_change_only_along_their_lifecycle_and_refusals_name_both() {
        let legal = [
            ("Free", "Waiting"),
            ("Waiting", "Budget"),
            ("Waiting", "Outstanding"),
            ("Waiting", "Free"),
            ("Budget", "Outstanding"),
            ("Budget", "Waiting"),
            ("Outstanding", "Waiting"),
            ("Outstanding", "Held"),
            ("Outstanding", "Free"),
            ("Held", "Waiting"),
            ("Held", "Free"),
        ];
        let now = Instant::now();
        for from in all(now) {
            for to in all(now) {
                let got = from.transition(to);
                if legal.contains(&(name(from), name(to))) {
                    assert_eq!(got, Ok(to), "{from:?} -> {to:?}");
                } else {
                    assert_eq!(got, Err(BadTransition::new(from, to)), "{from:?} -> {to:?}");
                }
            }
        }
        // What the rules are for: a request completes once; a held one never goes on the
        // wire before its hold is over (it waits first, and only `release_held` does that);
        // one holding a tag for budget never gives its slot back with the tag.
        let [free, _, budget, wire, held] = all(now);
        assert!(free.transition(ReqState::Free).is_err(), "a second completion");
        assert!(held.transition(wire).is_err(), "a held write sent early");
        assert!(budget.transition(ReqState::Free).is_err(), "a tag leaked");
        let e = free.transition(ReqState::Free).unwrap_err();
        assert_eq!(e.to_string(), "state Free cannot change to Free");
    }

    #[test]
    fn a_request_slot_did_not_grow_when_its_states_took_their_data() {
        // 136 bytes on x86-64 when the state was a tag beside the fields of every state
        // (two `Option<Instant>`s among them); a slot per request, touched per I/O.
        let size = std::mem::size_of::<Req>();
        println!("size_of::<Req>() = {size}, size_of::<ReqState>() = {}", std::mem::size_of::<ReqState>());
        assert!(size <= 136, "a request slot is {size} bytes");
    }

    #[test]
    fn a_state_knows_the_tag_it_holds() {
        let [free, waiting, budget, wire, held] = all(Instant::now());
        assert_eq!(budget.tag(), Some((3, true)));
        assert_eq!(wire.tag(), Some((3, false)));
        for s in [free, waiting, held] {
            assert_eq!(s.tag(), None, "{s:?}");
        }
    }
}
