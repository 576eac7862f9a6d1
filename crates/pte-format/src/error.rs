//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a file.
///
/// Every variant says what was wrong and where, so that a message about a malformed file
/// can be acted on without a hex editor.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file ends before a structure that must be there.
    #[error("file is too short: {what} needs {needed} bytes, the file has {len}")]
    TooShort {
        what: &'static str,
        needed: u64,
        len: u64,
    },
    /// The 4-byte file identifier at offset 4 is not the expected one.
    #[error("not {expected}: the identifier at offset 4 is {found:?}{hint}")]
    WrongIdentifier {
        expected: &'static str,
        found: String,
        hint: &'static str,
    },
    /// The identifier names another version of the format than this crate reads.
    #[error("unsupported {format} version: identifier {found:?}, this build reads {supported:?}")]
    UnsupportedVersion {
        format: &'static str,
        found: String,
        supported: &'static str,
    },
    /// A header field is malformed.
    #[error("bad {header} header: {field} = {value} ({reason})")]
    BadHeader {
        header: &'static str,
        field: &'static str,
        value: u64,
        reason: &'static str,
    },
    /// The flatbuffer itself is malformed: a bad offset, length, enum value, union tag or
    /// string.
    #[error("malformed flatbuffer in {table}.{field} (table at offset {offset:#x}): {reason}")]
    Flatbuffer {
        table: &'static str,
        field: &'static str,
        offset: u64,
        reason: String,
    },
    /// The flatbuffer has more structure than its size can justify (shared sub-objects
    /// referenced over and over); walking it would take unbounded time or memory.
    #[error("flatbuffer is too complex: walking it exceeds a budget of {budget} units for a {len}-byte file")]
    TooComplex { budget: u64, len: u64 },
    /// A field the format requires is missing.
    #[error("{field} is missing")]
    Missing { field: String },
    /// An offset, size or index read from the file points outside of what it refers to.
    #[error("{field} = {value} is out of bounds (limit {limit})")]
    OutOfBounds {
        field: String,
        value: u64,
        limit: u64,
    },
    /// Arithmetic on sizes or offsets from the file would overflow.
    #[error("{field}: size arithmetic overflows")]
    Overflow { field: String },
    /// A value is present and in bounds but not allowed.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Reading a file from disk failed.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FormatError {
    pub(crate) fn out_of_bounds(field: impl Into<String>, value: u64, limit: u64) -> Self {
        FormatError::OutOfBounds {
            field: field.into(),
            value,
            limit,
        }
    }

    pub(crate) fn overflow(field: impl Into<String>) -> Self {
        FormatError::Overflow {
            field: field.into(),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FormatError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn missing(field: impl Into<String>) -> Self {
        FormatError::Missing {
            field: field.into(),
        }
    }
}

impl From<planus::Error> for FormatError {
    fn from(e: planus::Error) -> Self {
        let table = e
            .source_location
            .type_
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches("Ref");
        FormatError::Flatbuffer {
            table,
            field: e.source_location.method,
            offset: e.source_location.byte_offset as u64,
            reason: e.error_kind.to_string(),
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
