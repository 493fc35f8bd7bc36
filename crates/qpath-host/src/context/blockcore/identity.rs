//! Whether the namespace a device was opened on is still the one under its NSID.
//!
//! A target's operator can remove a namespace and put another under the same NSID. Linux
//! re-reads a namespace's identifiers after a Namespace Attribute Changed event and, when
//! they differ from the ones its disk was made with, removes that disk ("identifiers
//! changed for nsid", `nvme_validate_ns` in `drivers/nvme/host/core.c`); a namespace gone
//! from the Active Namespace ID list loses its disk too (`nvme_remove_invalid_namespaces`).
//! The block core does the same with the device it keeps open: the check runs where the
//! size check runs (when a controller's change count moved), never per I/O.
//!
//! ```text
//!   Present ──(not listed)──► Removed ──(listed, same ids)──► Present
//!      │                         │
//!      └──(listed, other ids)────┴──► Replaced (for good)
//! ```

use crate::context::ctrlview::NsIds;

/// What a controller's last successful scan says of a device's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Listed under its NSID with the identifiers the device was opened on.
    Same,
    /// Not listed: the target removed it.
    Removed,
    /// Listed under its NSID with other identifiers (these): another namespace.
    Replaced(NsIds),
}

/// Compares the identifiers a device was opened on (`opened`) with those listed now
/// (`now`). A device opened without identifiers (none reported, or none known) has
/// nothing to tell a replacement by: only a removal is seen.
pub(crate) fn seen(opened: Option<NsIds>, now: Option<NsIds>) -> Seen {
    match (opened, now) {
        (_, None) => Seen::Removed,
        (Some(o), Some(n)) if !o.is_empty() && o != n => Seen::Replaced(n),
        (_, Some(_)) => Seen::Same,
    }
}

/// What the paths of a device say together (a single device's one path alone): the
/// namespace is there while one path still carries it; replaced when none does and one
/// carries another; removed when none lists it. `None`: no path to ask (not attached
/// yet), nothing learnt.
pub(crate) fn fold(paths: impl Iterator<Item = Seen>) -> Option<Seen> {
    paths.fold(None, |acc, s| match (acc, s) {
        (Some(Seen::Same), _) | (_, Seen::Same) => Some(Seen::Same),
        (Some(r @ Seen::Replaced(_)), _) => Some(r),
        (_, s) => Some(s),
    })
}

/// The state of a device's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NsPresence {
    /// Listed with the identifiers the device was opened on: its I/O goes out.
    Present,
    /// Gone from the controller's list: I/O is refused until it is listed again with the
    /// same identifiers (the same namespace back).
    Removed,
    /// Another namespace under the NSID: the device refuses I/O from then on.
    Replaced,
}

impl NsPresence {
    /// The one place the state changes, on what a scan says.
    pub(crate) fn transition(self, seen: Seen) -> NsPresence {
        match (self, seen) {
            (NsPresence::Replaced, _) | (_, Seen::Replaced(_)) => NsPresence::Replaced,
            (_, Seen::Removed) => NsPresence::Removed,
            (_, Seen::Same) => NsPresence::Present,
        }
    }

    /// Whether the device refuses I/O.
    pub(crate) fn refuses(self) -> bool {
        self != NsPresence::Present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NsIds = NsIds { nguid: [1; 16], eui64: [1; 8], uuid: Some([1; 16]) };
    /// The same NGUID and EUI-64, another UUID: what a target that derives the first two
    /// from the NSID alone gives a namespace configured with its own UUID. Linux compares
    /// all three, so does the core.
    const B: NsIds = NsIds { uuid: Some([2; 16]), ..A };

    #[test]
    fn any_identifier_that_differs_makes_another_namespace() {
        assert_eq!(seen(Some(A), Some(A)), Seen::Same);
        assert_eq!(seen(Some(A), Some(B)), Seen::Replaced(B));
        assert_eq!(seen(Some(A), Some(NsIds { nguid: [9; 16], ..A })), Seen::Replaced(NsIds { nguid: [9; 16], ..A }));
        assert_eq!(seen(Some(A), None), Seen::Removed);
        // Nothing to compare: only a removal is seen.
        let none = NsIds { nguid: [0; 16], eui64: [0; 8], uuid: None };
        assert_eq!(seen(Some(none), Some(A)), Seen::Same);
        assert_eq!(seen(None, Some(A)), Seen::Same);
        assert_eq!(seen(None, None), Seen::Removed);
    }

    #[test]
    fn replaced_is_for_good_removed_until_the_same_namespace_is_back() {
        use NsPresence::*;
        assert_eq!(Present.transition(Seen::Removed), Removed);
        assert_eq!(Removed.transition(Seen::Same), Present);
        assert_eq!(Removed.transition(Seen::Replaced(B)), Replaced);
        assert_eq!(Present.transition(Seen::Replaced(B)), Replaced);
        assert_eq!(Replaced.transition(Seen::Same), Replaced);
        assert_eq!(Replaced.transition(Seen::Removed), Replaced);
        assert!(Removed.refuses() && Replaced.refuses() && !Present.refuses());
    }

    #[test]
    fn a_multipath_namespace_is_there_while_one_path_carries_it() {
        use Seen::*;
        assert_eq!(fold([Replaced(B), Same].into_iter()), Some(Same));
        assert_eq!(fold([Same, Removed].into_iter()), Some(Same));
        assert_eq!(fold([Removed, Replaced(B)].into_iter()), Some(Replaced(B)));
        assert_eq!(fold([Replaced(B), Removed].into_iter()), Some(Replaced(B)));
        assert_eq!(fold([Removed, Removed].into_iter()), Some(Removed));
        assert_eq!(fold(std::iter::empty()), None);
    }
}
