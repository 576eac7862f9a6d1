//! The compiler's error type.

use thiserror::Error;

/// Everything that can go wrong between reading an archive and writing a program.
#[derive(Debug, Error)]
pub enum CompileError {
    /// The archive is not a zip file we accept, or breaks a limit.
    #[error("archive: {0}")]
    Archive(String),
    /// The archive was written by a torch version or in a form this compiler does not read.
    #[error("unsupported archive: {0}")]
    Unsupported(String),
    /// The archive's JSON does not describe a valid exported program.
    #[error("invalid program in {field}: {reason}")]
    Invalid {
        /// Where (file, graph, node or field).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Operators with no decomposition into core ATen and no out variant.
    #[error(
        "no decomposition for {} operator(s): {}; run `ep = ep.run_decompositions()` before \
         `torch.export.save` to decompose them in PyTorch, or file an issue",
        ops.len(),
        ops.join(", ")
    )]
    NoDecomposition {
        /// Every such operator, sorted.
        ops: Vec<String>,
    },
    /// A construct the compiler does not handle (yet).
    #[error("not supported in {node}: {reason}")]
    NotSupported {
        /// The node (or value) concerned.
        node: String,
        /// What is not supported.
        reason: String,
    },
    /// A size, offset or count left the range the formats can hold.
    #[error("size overflow: {0}")]
    Overflow(String),
    /// Writing the program failed.
    #[error("writing the program: {0}")]
    Format(#[from] pte_format::FormatError),
}

impl CompileError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CompileError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(node: impl Into<String>, reason: impl Into<String>) -> Self {
        CompileError::NotSupported {
            node: node.into(),
            reason: reason.into(),
        }
    }
}

/// Result with [`CompileError`].
pub type Result<T, E = CompileError> = std::result::Result<T, E>;
