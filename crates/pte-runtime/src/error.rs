//! The runtime's error type.

use std::time::Duration;

use pte_format::FormatError;

use crate::budget::MemoryError;

/// What a kernel reports when it cannot run; the executor adds which operator and which
/// instruction.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel has no implementation for these element types.
    #[error("unsupported dtypes: {0}")]
    UnsupportedDType(String),
    /// An argument has the wrong kind, value or shape.
    #[error("{0}")]
    InvalidArgument(String),
    /// A runtime failure that is not the arguments' fault.
    #[error("{0}")]
    Failed(String),
    /// Memory for `what` (a value, a kernel's working memory) could not be had.
    #[error("{what}: {source}")]
    Memory {
        what: String,
        #[source]
        source: MemoryError,
    },
}

impl KernelError {
    /// Shorthand for [`KernelError::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        KernelError::InvalidArgument(message.into())
    }

    /// An unsupported dtype combination, listing the dtypes.
    pub fn dtypes(dtypes: &[crate::DType]) -> Self {
        KernelError::UnsupportedDType(
            dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// The result type of kernels.
pub type KernelResult<T = ()> = std::result::Result<T, KernelError>;

/// Everything that can go wrong loading or running a program.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The file is malformed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The program is well-formed but not a valid program: bad indices, wrong value kinds,
    /// tensors outside their memory.
    #[error("invalid program: {0}")]
    InvalidProgram(String),
    /// The program uses something this runtime does not support (and upstream does not
    /// either).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Operators the program calls that no registered kernel implements.
    #[error("{} operator(s) missing from the kernel registry: {}", .0.len(), .0.join(", "))]
    MissingOperators(Vec<String>),
    /// Backends the program delegates to that are not registered.
    #[error("backend(s) not available: {}", .0.join(", "))]
    MissingBackends(Vec<String>),
    /// No method of that name.
    #[error("no method named {name:?}; the program has {available:?}")]
    NoSuchMethod {
        name: String,
        available: Vec<String>,
    },
    /// External data the program needs is absent or does not match.
    #[error("external data: {0}")]
    ExternalData(String),
    /// A caller-provided value does not fit the method.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An input was not set before execution.
    #[error("input {0} has not been set")]
    InputNotSet(usize),
    /// A kernel failed.
    #[error("{op} (chain {chain}, instruction {instruction}): {source}")]
    Kernel {
        op: String,
        chain: usize,
        instruction: usize,
        #[source]
        source: KernelError,
    },
    /// A delegate failed to load or to run. At load, the place is the delegate's first
    /// call (chain 0, instruction 0 if it has none).
    #[error("delegate {index} ({backend}, chain {chain}, instruction {instruction}): {source}")]
    Delegate {
        /// The delegate's index in the method's delegate list.
        index: usize,
        backend: String,
        chain: usize,
        instruction: usize,
        #[source]
        source: KernelError,
    },
    /// Memory for `what` could not be had while loading a method.
    #[error("{what}: {source}")]
    Memory {
        what: String,
        #[source]
        source: MemoryError,
    },
    /// The method executed more instructions than allowed (a loop that does not end).
    #[error("execution exceeded {0} instructions")]
    InstructionLimit(u64),
    /// The method jumped back more often than allowed (a loop that does not end).
    #[error(
        "execution stopped at chain {chain} instruction {instruction}: more than {limit} loop \
         iterations (raise LoadOptions::max_loop_iterations if the program loops this long)"
    )]
    LoopLimit {
        chain: usize,
        instruction: usize,
        limit: u64,
    },
    /// The execution ran past the time it was given.
    #[error("execution exceeded its time limit of {0:?}")]
    DeadlineExceeded(Duration),
    /// The execution was cancelled through a `CancelHandle`.
    #[error("execution cancelled")]
    Cancelled,
    /// An I/O failure reading inputs or writing outputs.
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

impl RuntimeError {
    pub(crate) fn invalid_program(message: impl Into<String>) -> Self {
        RuntimeError::InvalidProgram(message.into())
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        RuntimeError::InvalidArgument(message.into())
    }
}

/// The result type of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl From<planus::Error> for RuntimeError {
    fn from(e: planus::Error) -> Self {
        RuntimeError::Format(e.into())
    }
}
