//! The block-device layer's local errors. What a request returns to its caller (an errno,
//! an NBD error) is a value in a reply, not one of these.

use std::fmt;

/// What went wrong, to match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A socket, file or io_uring call failed.
    Io,
    /// The kernel lacks something this needs (a module, a feature); the context says what to do.
    Unsupported,
    /// Bad arguments (a name, a size, a device number).
    Invalid,
    /// The peer broke its protocol (NBD negotiation, a ublk descriptor).
    Protocol,
    /// The NVMe side: connecting, identifying, opening the head.
    Host,
    /// No such device, or it is gone.
    NotFound,
    /// Something else holds what was asked for (a device number, a socket path).
    Busy,
}

/// A block-device layer error: a kind, what it was about, and the cause.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// Kind.
    pub kind: ErrorKind,
    /// What and where: the device, the export, the socket, the step.
    pub context: String,
}

impl Error {
    /// An error of `kind` with `context`.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into() }
    }

    /// An I/O error with context.
    pub fn io(context: impl fmt::Display, e: &std::io::Error) -> Error {
        Error::new(ErrorKind::Io, format!("{context}: {e}"))
    }

    /// A host error with context.
    pub fn host(context: impl fmt::Display, e: &host::Error) -> Error {
        Error::new(ErrorKind::Host, format!("{context}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

/// Result with this crate's error.
pub type Result<T> = std::result::Result<T, Error>;
