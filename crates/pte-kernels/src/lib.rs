//! CPU kernels for the ExecuTorch operator set, registered by operator name
//! (`aten::add.out`, `executorch_prim::et_view.default`, ...).
//!
//! [`registry`] returns a [`KernelRegistry`] holding every kernel of this crate; pass it
//! to `Program::load_method`. Kernels follow PyTorch semantics (broadcasting, type
//! promotion, negative dims, keepdim, empty tensors); a dtype combination a kernel does
//! not implement is an error naming the operator and the dtypes.
//!
//! Modules group kernels by kind: [`prim`] (scalar and size ops), [`elementwise`],
//! [`shape`] (views, copies, concatenation, creation), [`reduce`], [`index`] (gather and
//! scatter), [`linalg`] (matrix products) and [`nn`] (convolution, pooling,
//! normalization, softmax).

pub mod elementwise;
pub mod index;
pub mod linalg;
pub mod nn;
pub mod prim;
pub mod reduce;
pub mod shape;
pub mod util;

use pte_runtime::KernelRegistry;

/// A registry with every kernel of this crate.
pub fn registry() -> KernelRegistry {
    let mut r = KernelRegistry::new();
    prim::register(&mut r);
    elementwise::register(&mut r);
    shape::register(&mut r);
    reduce::register(&mut r);
    index::register(&mut r);
    linalg::register(&mut r);
    nn::register(&mut r);
    r
}
