//! The crate's one error type: a small kind to match on, plus context and source.

use std::fmt;

/// What went wrong, coarsely; match on this, read [`Error`]'s message for the rest.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The job file could not be read or is not valid fio ini syntax.
    JobFile,
    /// An option has a value we cannot parse or that is out of range.
    Option,
    /// A valid fio option or value that qpath does not implement (e.g. `verify=md5`).
    Unsupported,
    /// An option fio or qpath does not know (refused unless `--lenient`).
    UnknownOption,
    /// A `filename` that is neither a usable local path nor a remote target.
    Target,
    /// No engine is registered for a job, or an engine failed to set up or run.
    Engine,
    /// A local I/O error outside an engine (laying out a file, writing the report).
    Io,
    /// Data verification failed (`verify=crc32c`).
    Verify,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::JobFile => "job file",
            ErrorKind::Option => "bad option",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::UnknownOption => "unknown option",
            ErrorKind::Target => "bad target",
            ErrorKind::Engine => "engine",
            ErrorKind::Io => "i/o",
            ErrorKind::Verify => "verify",
        };
        f.write_str(s)
    }
}

/// The error type of this crate.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {context}")]
pub struct Error {
    /// What kind of failure this is.
    pub kind: ErrorKind,
    /// Where and with which values (job name, line, option, offset...).
    pub context: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error of `kind` with a human-readable context.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Error { kind, context: context.into(), source: None }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// An [`ErrorKind::Io`] error wrapping `err`.
    pub fn io(context: impl Into<String>, err: std::io::Error) -> Self {
        let context = format!("{}: {err}", context.into());
        Error::new(ErrorKind::Io, context).with_source(err)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
