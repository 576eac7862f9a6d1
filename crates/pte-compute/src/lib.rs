//! Fast CPU compute primitives for pte.

mod error;
pub mod pool;

pub use error::{Error, Result};
pub use pool::ThreadPool;
