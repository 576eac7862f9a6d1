//! Fast CPU compute primitives for pte.

pub mod arch;
pub mod elementwise;
mod error;
pub mod gemm;
mod mat;
mod math;
pub mod pool;

pub use arch::Isa;
pub use elementwise::Activation;
pub use error::{Error, Result};
pub use gemm::{BatchMut, BatchRef, Bias, Epilogue, Gemm, Lhs, PackedA, PackedB, Rhs};
pub use mat::{MatMut, MatRef};
pub use pool::ThreadPool;
pub mod conv;
pub use conv::{Conv2d, Conv2dParams};
pub mod pooling;
mod window;
