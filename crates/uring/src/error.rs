//! The crate's one error type: a small kind to match on, a context string that says what
//! was being done (and, for start-up failures, what to do about it), and the OS error.
//!
//! Completions do not use this type: an operation that the kernel ran and failed reports a
//! negative errno in [`Completion::result`](crate::Completion::result). `Error` is for local
//! failures: setting the ring up, a bad argument, a submission queue that cannot be flushed.

use std::borrow::Cow;
use std::io;

/// What went wrong, to match on.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// `io_uring_setup` or a ring registration failed.
    Setup,
    /// The kernel lacks an opcode or feature this crate relies on.
    Unsupported,
    /// An argument broke a documented limit (a range out of bounds, too many segments,
    /// a length that does not fit the kernel's 32-bit field).
    InvalidArgument,
    /// The submission queue was full and flushing it to the kernel failed.
    SubmissionQueueFull,
    /// A configured limit was reached (operations in flight).
    Limit,
    /// `io_uring_enter` failed for a reason other than a timeout or a signal.
    Enter,
    /// A system call outside the ring failed (eventfd, mmap, affinity, socket options).
    Os,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            ErrorKind::Setup => "ring setup failed",
            ErrorKind::Unsupported => "kernel feature missing",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::SubmissionQueueFull => "submission queue full",
            ErrorKind::Limit => "limit reached",
            ErrorKind::Enter => "io_uring_enter failed",
            ErrorKind::Os => "system call failed",
        };
        f.write_str(name)
    }
}

/// A local failure of the ring or of one of the helpers in this crate.
///
/// `Display` prints the kind and the context; the OS error, if any, is the
/// [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {context}")]
pub struct Error {
    kind: ErrorKind,
    context: Cow<'static, str>,
    #[source]
    source: Option<io::Error>,
}

impl Error {
    /// An error with a static context and no OS source (no allocation: usable on the I/O path).
    pub(crate) const fn new(kind: ErrorKind, context: &'static str) -> Error {
        Error { kind, context: Cow::Borrowed(context), source: None }
    }

    /// An error with a context built at run time (start-up paths only: it allocates).
    pub(crate) fn with_context(kind: ErrorKind, context: String) -> Error {
        Error { kind, context: Cow::Owned(context), source: None }
    }

    /// Attaches the OS error that caused this one.
    pub(crate) fn caused_by(mut self, source: io::Error) -> Error {
        self.source = Some(source);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What was being done, and for start-up failures what to do about it.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The OS error behind this one, if any.
    pub fn os_error(&self) -> Option<&io::Error> {
        self.source.as_ref()
    }
}

impl From<Error> for io::Error {
    fn from(error: Error) -> io::Error {
        let kind = match error.kind {
            ErrorKind::InvalidArgument => io::ErrorKind::InvalidInput,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            _ => error.source.as_ref().map_or(io::ErrorKind::Other, io::Error::kind),
        };
        io::Error::new(kind, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_context_and_keeps_source() {
        let error = Error::new(ErrorKind::Setup, "io_uring_setup").caused_by(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(error.to_string(), "ring setup failed: io_uring_setup");
        assert_eq!(error.kind(), ErrorKind::Setup);
        let source = std::error::Error::source(&error).expect("source kept");
        assert!(source.to_string().contains("not permitted"), "{source}");
    }

    #[test]
    fn converts_to_io_error_with_matching_kind() {
        let error: io::Error = Error::new(ErrorKind::InvalidArgument, "range").into();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
