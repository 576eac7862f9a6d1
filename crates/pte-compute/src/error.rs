//! The crate's one error type.

/// What went wrong in a call of this crate. Every public function validates its slices,
/// strides and shapes up front and reports a mismatch here instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A matrix view does not fit in its slice.
    #[error("a {rows}x{cols} matrix with strides ({row_stride}, {col_stride}) does not fit in {len} elements")]
    ViewOutOfBounds {
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
        len: usize,
    },
    /// Distinct elements of an output view would share memory.
    #[error("output strides ({row_stride}, {col_stride}) make elements of a {rows}x{cols} matrix overlap")]
    OverlappingOutput {
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    },
    /// Operand shapes do not agree.
    #[error("shape mismatch: {what}")]
    ShapeMismatch { what: String },
    /// A buffer is shorter than the shapes require.
    #[error("{what} holds {len} elements, {needed} needed")]
    BufferTooSmall {
        what: &'static str,
        len: usize,
        needed: usize,
    },
    /// The caller's scratch buffer is too small; ask the matching `scratch_len` function.
    #[error("scratch holds {len} f32 elements, this call needs {needed}")]
    ScratchTooSmall { len: usize, needed: usize },
    /// A size computation overflowed `usize`.
    #[error("size of {what} overflows")]
    SizeOverflow { what: &'static str },
    /// The allocator could not give `len` elements for `what`.
    #[error("out of memory for {what} ({len} elements)")]
    OutOfMemory { what: &'static str, len: usize },
    /// A parameter is out of its domain (zero stride, kernel larger than the input...).
    #[error("invalid parameter: {what}")]
    InvalidParameter { what: String },
    /// A packed operand was prepared for another micro-kernel than the one asked to use it.
    #[error("operand packed for {packed} cannot be used by a {used} product")]
    PackingMismatch {
        packed: &'static str,
        used: &'static str,
    },
    /// The requested instruction set is not available on this CPU.
    #[error("instruction set {0} is not available on this CPU")]
    IsaUnavailable(&'static str),
    /// The thread pool could not start its worker threads.
    #[error("could not start a worker thread: {0}")]
    ThreadSpawn(String),
}

/// The crate's result type.
pub type Result<T = ()> = std::result::Result<T, Error>;

/// `a * b`, or [`Error::SizeOverflow`] naming `what`.
pub(crate) fn mul(a: usize, b: usize, what: &'static str) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::SizeOverflow { what })
}

/// `a + b`, or [`Error::SizeOverflow`] naming `what`.
pub(crate) fn add(a: usize, b: usize, what: &'static str) -> Result<usize> {
    a.checked_add(b).ok_or(Error::SizeOverflow { what })
}

/// Checks that a buffer holds at least `needed` elements.
pub(crate) fn need(what: &'static str, len: usize, needed: usize) -> Result {
    if len < needed {
        Err(Error::BufferTooSmall { what, len, needed })
    } else {
        Ok(())
    }
}

/// `len` f32 values lent by `staging`, or [`Error::OutOfMemory`] naming `what`.
pub(crate) fn staged<'a>(
    staging: &'a pte_alloc::Staging,
    len: usize,
    what: &'static str,
) -> Result<pte_alloc::Staged<'a, f32>> {
    staging.take(len).ok_or(Error::OutOfMemory { what, len })
}
