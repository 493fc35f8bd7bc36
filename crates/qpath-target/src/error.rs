//! The target's local errors (configuration, backends, sockets). NVMe
//! command failures are not errors here: they are [`nvme::Status`] values
//! sent to the host.

use std::fmt;

/// What went wrong, to match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Invalid configuration or RPC parameters.
    Config,
    /// A backend could not be opened or sized.
    Backend,
    /// A socket or io_uring setup failure.
    Io,
    /// An object named in a request does not exist.
    NotFound,
    /// An object with that name already exists.
    Exists,
    /// The request was valid but could not be carried out now (e.g. writes still in
    /// flight to blocks a shrink would cut); the same request may succeed later.
    Busy,
}

/// A target error: a kind plus context.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// Kind.
    pub kind: ErrorKind,
    /// What happened, with the object it happened to.
    pub context: String,
    /// Underlying error, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// An error of `kind` with `context`.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into(), source: None }
    }

    /// An I/O error with context.
    pub fn io(context: impl Into<String>, e: std::io::Error) -> Error {
        Error { kind: ErrorKind::Io, context: format!("{}: {e}", context.into()), source: Some(Box::new(e)) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.context)
    }
}

/// Result with the target's error.
pub type Result<T> = std::result::Result<T, Error>;
