//! The crate's error type: what is wrong and where (payload field, value, node).

use pte_runtime::{KernelError, MemoryError};

/// Why a payload cannot be loaded or a graph cannot run.
#[derive(Debug, thiserror::Error)]
pub enum XnnError {
    /// The payload's header or flatbuffer is malformed.
    #[error("payload: {0}")]
    Payload(String),
    /// A field of the graph table is invalid.
    #[error("graph: {0}")]
    Graph(String),
    /// A value (by its id) is invalid.
    #[error("value {id}: {message}")]
    Value { id: u32, message: String },
    /// A constant data entry is invalid or missing.
    #[error("constant data entry {index}: {message}")]
    Constant { index: u32, message: String },
    /// A node is invalid, unsupported, or failed to run.
    #[error("node {index} ({kind}, debug handle {debug_handle}): {message}")]
    Node {
        index: usize,
        kind: &'static str,
        debug_handle: u32,
        message: String,
    },
    /// The delegate call's arguments do not match the graph's inputs and outputs.
    #[error("arguments: {0}")]
    Arguments(String),
    /// The payload needs more work to parse than its size justifies.
    #[error("payload too complex: parsing it would take more than {0} steps")]
    TooComplex(u64),
    /// Memory for `what` could not be had.
    #[error("{what}: {source}")]
    Memory {
        what: String,
        #[source]
        source: MemoryError,
    },
}

/// The result type of this crate.
pub type Result<T, E = XnnError> = std::result::Result<T, E>;

impl XnnError {
    pub(crate) fn payload(message: impl Into<String>) -> Self {
        XnnError::Payload(message.into())
    }

    pub(crate) fn graph(message: impl Into<String>) -> Self {
        XnnError::Graph(message.into())
    }

    pub(crate) fn value(id: u32, message: impl Into<String>) -> Self {
        XnnError::Value {
            id,
            message: message.into(),
        }
    }

    pub(crate) fn memory(what: impl Into<String>, source: MemoryError) -> Self {
        XnnError::Memory {
            what: what.into(),
            source,
        }
    }
}

impl From<XnnError> for KernelError {
    fn from(e: XnnError) -> Self {
        match e {
            XnnError::Memory { what, source } => KernelError::Memory { what, source },
            other => KernelError::InvalidArgument(other.to_string()),
        }
    }
}

/// A flatbuffer access failed: the buffer is malformed where `what` points.
pub(crate) fn fb(what: &str) -> impl Fn(planus::Error) -> XnnError + '_ {
    move |e| XnnError::Payload(format!("{what}: {e}"))
}

/// [`fb`] with the field's name made only on an error (names with indices, read for
/// every value and node of every payload).
pub(crate) fn fb_at(what: impl Fn() -> String) -> impl Fn(planus::Error) -> XnnError {
    move |e| XnnError::Payload(format!("{}: {e}", what()))
}
