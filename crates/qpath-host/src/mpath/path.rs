//! A path as a selector sees it: its class (from the ANA state of the
//! namespace through one controller, and that controller's link state), and
//! the per-thread counters the policies keep about it.
//!
//! ```text
//!   AnaState ──┐
//!              ├─► PathClass::of ─► Optimized | NonOptimized | Transient | Gone
//!   LinkState ─┘                     (usable: tier 1, tier 2)  (requeue)  (fail)
//! ```

use nvme::AnaState;

use crate::controller::CtrlState;

/// Most paths one multipath head may have. Indices fit a `u16` with room for
/// the selectors' "no path" marker; Linux has no fixed limit, real
/// deployments have a handful (two to eight fabrics ports per subsystem).
pub const PATHS_MAX: usize = 1024;

/// A path's position in the slice given to [`super::Selector::set_paths`].
///
/// Indices are *slots*: index `i` names the same path for as long as the
/// head keeps it there, across `set_paths` calls (see `set_paths` for how
/// paths are added and removed), so an I/O submitted on path `i` completes
/// on path `i` even if the path set changed meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathIndex(pub u16);

impl PathIndex {
    /// The index as a `usize`, to index the caller's per-path arrays.
    #[inline]
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

/// The three outcomes of path selection (Linux `nvme_find_path` returning a
/// path, `nvme_available_path` deciding between requeue and failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Send the I/O on this path.
    Submit(PathIndex),
    /// No usable path now, but one may come back (ANA change in progress,
    /// ANA inaccessible, controller reconnecting): park the I/O and retry
    /// when the path set changes.
    Requeue,
    /// No path can ever serve the I/O (all gone for good, or none at all):
    /// complete it with a path error.
    Fail,
}

/// The state of the link to the controller a path goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// The controller is live: I/O may be sent.
    Live,
    /// Not connected yet, resetting or reconnecting: may come back.
    Reconnecting,
    /// Deleted, dead (ctrl_loss_tmo), or past fast_io_fail_tmo: I/O waiting
    /// for it must fail now.
    Gone,
}

impl LinkState {
    /// The link state of a controller in `state`; `fail_fast_expired` is
    /// [`crate::controller::Controller::should_fail_io`] (Linux
    /// `NVME_CTRL_FAILFAST_EXPIRED`: a reconnecting controller whose
    /// fast_io_fail_tmo passed no longer holds I/O back).
    pub fn of(state: CtrlState, fail_fast_expired: bool) -> LinkState {
        match state {
            CtrlState::Live => LinkState::Live,
            CtrlState::New | CtrlState::Connecting | CtrlState::Resetting if !fail_fast_expired => {
                LinkState::Reconnecting
            }
            CtrlState::New | CtrlState::Connecting | CtrlState::Resetting | CtrlState::Deleting | CtrlState::Dead => {
                LinkState::Gone
            }
        }
    }
}

/// What a path is worth to a selector.
///
/// Ordered best first: a selector only ever picks from the best class that
/// has a path (never a non-optimized path while an optimized one is usable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathClass {
    /// Live controller, ANA Optimized.
    Optimized,
    /// Live controller, ANA Non-Optimized: used only when no optimized path is.
    NonOptimized,
    /// Unusable now, may come back: ANA Change or Inaccessible (NVMe 2.0
    /// §8.1.3: both may move to an accessible state), or the controller is
    /// reconnecting.
    Transient,
    /// Unusable for good: ANA Persistent Loss, controller gone, or the path
    /// was removed from the head.
    Gone,
}

impl PathClass {
    /// The class of a namespace in ANA state `ana` through a controller whose link is `link`.
    ///
    /// A live link decides by ANA state. A reconnecting link makes the path
    /// transient whatever its (stale) ANA state, except Persistent Loss; a
    /// gone link makes it gone. Linux's `nvme_available_path` requeues on any
    /// live or reconnecting controller, even in Persistent Loss; here that
    /// state fails I/O, as the spec means it ("will not become accessible").
    pub fn of(ana: AnaState, link: LinkState) -> PathClass {
        match (link, ana) {
            (LinkState::Gone, _) | (_, AnaState::PersistentLoss) => PathClass::Gone,
            (LinkState::Reconnecting, _) | (LinkState::Live, AnaState::Change | AnaState::Inaccessible) => {
                PathClass::Transient
            }
            (LinkState::Live, AnaState::Optimized) => PathClass::Optimized,
            (LinkState::Live, AnaState::NonOptimized) => PathClass::NonOptimized,
        }
    }

    /// The class of the namespace through a controller whose link is `link` and whose last
    /// scan listed it in ANA state `ana` (`None`: not listed): a namespace a live controller
    /// does not list is gone through it; through a controller that is reconnecting or gone,
    /// its link decides.
    pub fn of_listed(ana: Option<AnaState>, link: LinkState) -> PathClass {
        match ana {
            Some(ana) => PathClass::of(ana, link),
            None if link == LinkState::Live => PathClass::Gone,
            None => PathClass::of(AnaState::Inaccessible, link),
        }
    }

    /// Whether I/O may be sent on a path of this class.
    #[inline]
    pub fn is_usable(self) -> bool {
        matches!(self, PathClass::Optimized | PathClass::NonOptimized)
    }
}

/// One path as [`super::Selector::set_paths`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathState {
    /// Identity of the path in this slot (e.g. `cntlid << 32 | nsid`, or a
    /// head-wide counter). When a slot's id changes, the selector forgets
    /// what it learnt about the slot (latency history, preference); its
    /// in-flight count stays, since those I/Os still complete on the slot.
    pub id: u64,
    /// The path's class.
    pub class: PathClass,
}

impl PathState {
    /// A path `id` of class `class`.
    pub fn new(id: u64, class: PathClass) -> PathState {
        PathState { id, class }
    }
}

/// The per-thread counters a selector keeps about one path slot. Owned by one
/// thread; nothing here is shared or atomic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PathSlot {
    /// I/Os this thread submitted on the path that have not completed (exact
    /// for this thread's I/O; kept under every policy so a switch to
    /// queue-depth starts from true counts: the seed's patch miscounted when
    /// the policy changed with I/O outstanding).
    pub in_flight: u32,
    /// The path's class.
    pub class: PathClass,
    /// Whether the path is in the tier selected from (the best usable class).
    pub in_tier: bool,
    /// The path's identity (see [`PathState::id`]).
    pub id: u64,
}

impl PathSlot {
    pub(crate) fn new(state: PathState) -> PathSlot {
        PathSlot { in_flight: 0, class: state.class, in_tier: false, id: state.id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_ana_then_link() {
        use AnaState::*;
        assert_eq!(PathClass::of(Optimized, LinkState::Live), PathClass::Optimized);
        assert_eq!(PathClass::of(NonOptimized, LinkState::Live), PathClass::NonOptimized);
        assert_eq!(PathClass::of(Change, LinkState::Live), PathClass::Transient);
        assert_eq!(PathClass::of(Inaccessible, LinkState::Live), PathClass::Transient);
        assert_eq!(PathClass::of(PersistentLoss, LinkState::Live), PathClass::Gone);
        assert_eq!(PathClass::of(Optimized, LinkState::Reconnecting), PathClass::Transient);
        assert_eq!(PathClass::of(PersistentLoss, LinkState::Reconnecting), PathClass::Gone);
        assert_eq!(PathClass::of(Optimized, LinkState::Gone), PathClass::Gone);
    }

    #[test]
    fn link_state_honours_fail_fast() {
        assert_eq!(LinkState::of(CtrlState::Live, true), LinkState::Live);
        assert_eq!(LinkState::of(CtrlState::Connecting, false), LinkState::Reconnecting);
        assert_eq!(LinkState::of(CtrlState::Resetting, true), LinkState::Gone);
        assert_eq!(LinkState::of(CtrlState::Dead, false), LinkState::Gone);
        assert_eq!(LinkState::of(CtrlState::Deleting, false), LinkState::Gone);
    }

    #[test]
    fn classes_order_best_first() {
        assert!(PathClass::Optimized < PathClass::NonOptimized);
        assert!(PathClass::NonOptimized < PathClass::Transient);
        assert!(PathClass::Transient < PathClass::Gone);
    }
}
