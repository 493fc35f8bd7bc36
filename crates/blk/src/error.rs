//! The crate's one error type. Everything here is a set-up failure (a depth,
//! a queue count, a user count out of range); the I/O path itself has no
//! `Result`s: a missing tag is `None`, and a broken invariant panics.

use std::fmt;

/// What went wrong, to match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A depth (tag-set depth or per-user depth limit) is zero or too large.
    InvalidDepth,
    /// A CPU, queue or context count is zero or too large.
    InvalidCount,
    /// A shared tag set already has as many users as tags.
    TooManyUsers,
}

/// A `blk` error: a kind plus what and where.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// Kind.
    pub kind: ErrorKind,
    /// Context: which value, which limit.
    pub context: String,
}

impl Error {
    /// An error of `kind` with `context`.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

/// Result with `blk`'s error.
pub type Result<T> = std::result::Result<T, Error>;
