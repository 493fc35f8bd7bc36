//! The one convention every lifecycle state machine in qpath follows: a state decides
//! its own changes with `transition(self, to) -> Result<S, BadTransition<S>>`
//! (`#[must_use]`), and whoever applies a change handles a refusal loudly, in release
//! builds too: logged at error level, then the thing whose state it is fails (a queue,
//! a connection, an authentication transaction), because its driver and the protocol
//! no longer agree on where it stands.

use std::fmt;

/// A lifecycle change a state machine refuses. Never expected: the code that asked for
/// it and the state machine disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("state {from:?} cannot change to {to:?}")]
pub struct BadTransition<S: fmt::Debug> {
    /// The state it was in (and stays in).
    pub from: S,
    /// The state asked for.
    pub to: S,
}

impl<S: fmt::Debug> BadTransition<S> {
    /// The refusal of `from` → `to`.
    pub fn new(from: S, to: S) -> Self {
        BadTransition { from, to }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_both_states() {
        #[derive(Debug)]
        enum S {
            Idle,
            Busy,
        }
        assert_eq!(BadTransition::new(S::Idle, S::Busy).to_string(), "state Idle cannot change to Busy");
    }
}
