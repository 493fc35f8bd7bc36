//! The host's local errors. NVMe statuses are values in completions, not errors.

use std::fmt;

/// What went wrong, to match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Socket or io_uring failure.
    Io,
    /// The controller broke the protocol or refused a step of bring-up.
    Protocol,
    /// A command completed with an error status during bring-up or an admin call.
    Status,
    /// A deadline passed.
    Timeout,
    /// Bad arguments (address, NQN, options).
    Invalid,
    /// The controller is gone (ctrl_loss_tmo expired or deleted).
    Gone,
    /// The namespace a device was opened on is gone: the target removed it, or put
    /// another namespace under its NSID.
    NamespaceGone,
    /// No resource (queue, tag) is free.
    Busy,
}

/// A host error: a kind plus context.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// Kind.
    pub kind: ErrorKind,
    /// Context: what, where (address, queue, command).
    pub context: String,
    /// The status, for `ErrorKind::Status`.
    pub status: Option<nvme::Status>,
}

impl Error {
    /// An error of `kind` with `context`.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into(), status: None }
    }

    /// A command failed with `status`.
    pub fn status(context: impl Into<String>, status: nvme::Status) -> Error {
        Error { kind: ErrorKind::Status, context: format!("{}: {status}", context.into()), status: Some(status) }
    }

    /// An I/O error with context.
    pub fn io(context: impl Into<String>, e: &std::io::Error) -> Error {
        let kind = if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
            ErrorKind::Timeout
        } else {
            ErrorKind::Io
        };
        Error::new(kind, format!("{}: {e}", context.into()))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

/// A lifecycle change a state machine refuses ([`crate::controller::CtrlState::transition`],
/// [`crate::queue::QueueState::transition`]): the convention every state machine of both
/// ends follows (see [`nvme::state`]).
pub use nvme::state::BadTransition;

/// Result with the host's error.
pub type Result<T> = std::result::Result<T, Error>;
