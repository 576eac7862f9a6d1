//! CPU kernels for the ExecuTorch operator set, registered by operator name
//! (`aten::add.out`, `executorch_prim::et_view.default`, ...).
//!
//! [`registry`] returns a [`KernelRegistry`] holding every kernel of this crate; pass it
//! to `Program::load_method`. Kernels follow PyTorch semantics (broadcasting, type
//! promotion, negative dims, keepdim, empty tensors); a dtype combination a kernel does
//! not implement is an error naming the operator and the dtypes.
//!
//! Modules group kernels by kind: `prim` (scalar and size ops), `elementwise`, `shape`
//! (views, copies, concatenation, creation), `reduce`, `index` (gather and scatter),
//! `linalg` (matrix products), `nn` (convolution, pooling, normalization, softmax) and
//! `complex` (conjugation, FFTs), `random` and `quant` (the `quantized_decomposed`
//! family).
//! They all build on the same lower layers, which never import them: `num` (the one
//! hierarchy of numeric traits), `util` (dispatch, promotion, broadcasting, scratch
//! memory), `layout` (strided copies, dim orders) and `product` (matrix products).
//! Float32 products, convolutions, pooling and common row operations take fast paths
//! on `pte-compute` where a call allows (`fast`), with convolution, batch normalization,
//! residual and activation chains fused at load and runs of convolutions kept channels
//! last.
//!
//! No kernel panics on any input: the crate denies `unwrap`, `expect`, `panic!`,
//! `unreachable!` and unchecked indexing, and forbids `unsafe` code.

#![forbid(unsafe_code)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]
// Tests index their reference data directly; a panic there is a test failure.
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod num;
mod util;

mod layout;
mod product;

mod complex;
mod elementwise;
mod fast;
mod index;
mod linalg;
pub(crate) mod nn;
mod prim;
mod quant;
mod random;
mod reduce;
mod shape;

use pte_runtime::KernelRegistry;

/// Kernels that are not a deterministic function of their arguments writing only their
/// outputs: random numbers, updates of an input in place (by convention their names end in
/// `_`, or they update running statistics or stack loop results), uninitialized memory.
const IMPURE: &[&str] = &[
    "aten::rand.out",
    "aten::randn.out",
    "aten::native_dropout.out",
    "aten::_native_batch_norm_legit.out",
    "aten::empty.out",
    "dim_order_ops::_empty_dim_order.out",
    "executorch_prim::et_copy_index.tensor",
];

/// A registry with every kernel of this crate, float32 fast paths and fusion included
/// (see [`install_fast_paths`]); the pure ones are marked so (see
/// `KernelRegistry::mark_pure`), so that calls on constants run once at load.
pub fn registry() -> KernelRegistry {
    let mut r = reference_registry();
    install_fast_paths(&mut r);
    r
}

/// Every kernel of this crate without the fast paths and fusion: one generic
/// implementation per operator, the reference the fast paths are tested against.
pub fn reference_registry() -> KernelRegistry {
    let mut r = KernelRegistry::new();
    prim::register(&mut r);
    elementwise::register(&mut r);
    shape::register(&mut r);
    reduce::register(&mut r);
    index::register(&mut r);
    linalg::register(&mut r);
    complex::register(&mut r);
    random::register(&mut r);
    quant::register(&mut r);
    nn::register(&mut r);
    let pure: Vec<String> = r
        .names()
        .filter(|n| !n.ends_with('_') && !IMPURE.contains(n))
        .map(str::to_owned)
        .collect();
    for name in &pure {
        r.mark_pure(name);
    }
    r
}

/// Puts float32 fast paths on `pte-compute` in front of the registry's matrix product,
/// convolution and pooling kernels (packed weights, fused epilogues; call sites that
/// do not qualify keep the registered kernel), and sets the fuser that merges
/// convolution, batch normalization, residual addition and activation chains.
pub fn install_fast_paths(r: &mut KernelRegistry) {
    fast::install(r);
}
