//! Loads and executes ExecuTorch programs (`.pte`, with `.ptd` data) as upstream
//! ExecuTorch 1.5.1 does.
//!
//! A [`Program`] opens a file (memory-mapped by default) and lists its methods and their
//! metadata. [`Program::load_method`] builds a [`Method`]: it allocates the planned
//! buffers once, places every tensor at its planned offset (bounds-checked), uses
//! constants in place from the file, resolves external constants from `.ptd` files with
//! an exact layout check, restores mutable state from the program, looks up every
//! operator in a [`KernelRegistry`] (reporting all missing ones at once) and every
//! delegate in a [`BackendRegistry`], runs the calls that compute only from constants
//! once, takes the fusions and the elisions of data-preserving copies that the
//! registry's [`Fuser`] proposes and the runtime finds safe, and prepares each
//! call's kernel. [`Method::execute`]
//! runs the instruction chains with upstream's semantics, bounded by an instruction cap, a
//! loop limit, an optional time limit and a [`CancelHandle`].
//!
//! Everything a method allocates (planned buffers, other tensors, kernel and delegate
//! memory) is charged to one [`MemoryBudget`] before it is allocated, and allocated
//! fallibly; see `docs/security.md` for what a hostile program can and cannot do.
//!
//! This crate knows no operator: kernels come from a registry (the `pte-kernels` crate
//! provides the standard set). Kernels see their call through [`Args`]: scalars,
//! tensor metadata, resizing of outputs, and non-aliasing views of tensor data.
//!
//! ```no_run
//! # fn kernels() -> pte_runtime::KernelRegistry { unimplemented!() }
//! use pte_runtime::{EValue, Program, Tensor};
//! let program = Program::open("model.pte")?;   // read into memory
//! let mut method = program.load_method("forward", &kernels())?;
//! method.set_input(0, &EValue::Tensor(Tensor::from_slice(&[3, 4], &[0f32; 12])?))?;
//! method.execute()?;
//! let outputs = method.outputs()?;
//! # Ok::<(), pte_runtime::RuntimeError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]

mod alias;
mod args;
mod budget;
mod dtype;
mod error;
mod fold;
mod fuse;
mod memory;
mod method;
pub mod npy;
mod program;
mod registry;
mod reuse;
mod tensor;
mod value;
mod workspace;

pub use args::{
    normalize_dim, Arg, Args, Io, Scalar, TensorData, TensorDataMut, TensorInfo, INLINE_READS,
    INLINE_WRITES, MANY_READS, MANY_WRITES,
};
pub use budget::{default_memory_limit, Buffer, Charge, MemoryBudget, MemoryError};
pub use dtype::{DType, Element};
pub use error::{KernelError, KernelResult, Result, RuntimeError};
pub use fuse::{Alias, Call, CallId, Fuser, Fusion, Graph};
pub use memory::{range_within, SharedBytes, SourceBytes};
pub use method::{
    CancelHandle, LoadOptions, Method, ProfileEntry, MAX_INSTRUCTIONS, MIN_LOOP_ITERATIONS,
};
pub use program::{MethodMeta, Program, TensorMeta, ValueMeta, MAX_SCHEMA_VERSION};
pub use registry::{
    ArgDecl, Backend, BackendRegistry, DelegateCall, DelegateInit, Kernel, KernelFn,
    KernelRegistry, NamedData, PartProfile, PreparedKernel, StepTimes,
};
pub use reuse::DerivedStates;
pub use tensor::{contiguous_dim_order, strides_for, AlignedBuf, Dims, Tensor, MAX_RANK};
pub use value::{Dynamism, EValue};
pub use workspace::{WorkBuffers, Workspace};
