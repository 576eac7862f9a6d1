//! Fast CPU compute primitives for pte: packed f32 matrix products with fused epilogues,
//! convolution algorithms, pooling, vectorized elementwise math, and a fork-join thread
//! pool in which the caller takes part.
//!
//! The crate knows no file format, tensor type or operator: it works on `f32` slices,
//! shapes and strides. The operator kernels (`pte-kernels`) and the XNNPACK-compatible
//! backend call it. Every entry point validates its slices and strides against the
//! shapes and returns an [`Error`] instead of panicking.
//!
//! # How a kernel uses it
//!
//! At method load, for each node with constant weights:
//! 1. pick the engine once: [`Gemm::new`] (the best instruction set of this CPU);
//! 2. prepare: [`Gemm::pack_b`] / [`Gemm::pack_a`] for a linear layer's weight,
//!    [`Conv2d::new`] for a convolution (chooses the algorithm, packs or keeps the
//!    weights, stores bias and activation);
//! 3. ask the scratch size ([`Gemm::scratch_len`], [`Conv2d::scratch_len`],
//!    [`pooling::Pool2dParams::scratch_len`], [`Gemm::batched_scratch_len`]) for the
//!    pool's thread count, charge it to the memory budget, and keep one buffer of the
//!    largest size (scratch is only used during a call, so nodes can share it).
//!
//! At each execution: [`Gemm::run`], [`Conv2d::run`], [`pooling::max_pool2d`], ... with
//! the [`ThreadPool`] and the scratch. A steady-state call allocates nothing (tested
//! with a counting allocator in `tests/no_alloc.rs`).
//!
//! ```
//! use pte_compute::{Activation, Bias, Epilogue, Gemm, Lhs, MatMut, MatRef, Rhs, ThreadPool};
//! # fn main() -> pte_compute::Result {
//! let (m, k, n) = (4, 3, 2);
//! let weight = vec![0.5f32; n * k]; // a linear layer's weight, [n, k]
//! let bias = vec![1.0f32; n];
//! let gemm = Gemm::new();
//! let packed = gemm.pack_b(MatRef::row_major(&weight, n, k)?.t())?; // once, at load
//! let pool = ThreadPool::new(2)?;
//! let mut scratch = vec![0.0; gemm.scratch_len(m, n, k, false, true, pool.threads())?];
//! let x = vec![1.0f32; m * k];
//! let mut y = vec![0.0f32; m * n];
//! let epilogue = Epilogue { accumulate: false, bias: Bias::Col(&bias), activation: Activation::RELU };
//! gemm.run(&pool, MatMut::row_major(&mut y, m, n)?, Lhs::Mat(MatRef::row_major(&x, m, k)?),
//!          Rhs::Packed(&packed), &epilogue, &mut scratch)?;
//! assert_eq!(y, vec![2.5; m * n]);
//! # Ok(()) }
//! ```
//!
//! # Primitives and their optimisations
//!
//! - [`ThreadPool`]: fork-join `parallel_for` over task indices; the caller runs tasks
//!   too; one thread, one task, a nested call or a busy pool run inline with no
//!   hand-off; workers spin 50 µs then park (not while the pool is held: a method holds
//!   its pool while it executes); each thread starts on its own contiguous
//!   share of the tasks and steals from the back of others' shares once done (the same
//!   data stays with the same thread from one call to the next); per-thread scratch parts ([`ThreadPool::parallel_for_scratch`]). About 0.1 µs per
//!   call on one thread and 0.1-0.4 µs on two, against 5-7 µs for rayon's
//!   `install` + `par_iter` (see BENCHMARKS.md).
//! - [`Gemm`]: BLIS-style blocking (kc = 256, mc ≈ 120, nc = 2048) over register-tile
//!   micro-kernels selected at run time: AVX-512F 12×32, AVX2+FMA 6×16, NEON 8×8
//!   (compiled for aarch64, not run here), portable 4×16. Operands packed once at load
//!   ([`PackedA`], [`PackedB`]) are read in place; others are packed per block into
//!   caller scratch (a copy for contiguous lines, a vectorized transposition
//!   otherwise). Edge rows run a kernel of exactly that many rows. The epilogue (bias
//!   per row or column, clamp, sigmoid, tanh, GELU, SiLU, hard-swish, beta = 0 or 1)
//!   runs on each tile while it is in L1. Threads split the larger of m and n in
//!   tiles. A 1-row product with a strided right operand skips packing.
//! - [`Gemm::run_batched`]: attention-shaped batches run one product per task, each
//!   single-threaded with its thread's scratch.
//! - [`Conv2d`] (NCHW, groups, stride, asymmetric padding, dilation; 1-D as height 1):
//!   1×1 stride-1 convolutions are a plain product with the input as the right
//!   operand (no im2col); others gather receptive fields straight into the product's
//!   packed panels (implicit im2col, no column matrix); depthwise convolutions run on
//!   padded, stride-phase-split rows with 16 outputs accumulated in registers per tap
//!   (a sliding-window engine shared with max pooling). Bias and activation
//!   are fused. Weights are packed once by [`Conv2d::new`]. [`ConvTranspose2d`]: one
//!   product per image and group with the transposed weights packed once, then
//!   col2im (output padding, groups, dilation). Both convolutions and [`nhwc`]'s drop
//!   the kernel rows and columns that read only padding at every output pixel (an
//!   atrous 3×3 on a map smaller than its dilation is a 1×1).
//! - [`nhwc`]: convolution (indirect products, depthwise rows of 16 channels per
//!   AVX-512 vector or 8 per AVX2 one, Winograd F(4×4, 3×3) and
//!   F(2×2, 3×3) for regular 3×3 stride-1 layers on images large enough), transposed
//!   convolution and pooling on channels-last images, for the XNNPACK delegate and for
//!   chains of convolutions the kernels keep channels last; [`layout`] converts at the
//!   ends.
//! - [`qconv`]: 8-bit NHWC convolutions with XNNPACK's quantized semantics: an
//!   indirect 12×32 micro-kernel on AVX-512 VNNI (unsigned activations times signed
//!   weights, requantized in the store; portable elsewhere), stems read by kernel rows
//!   and grouped convolutions by fixed tap offsets of a padded copy, depthwise rows over blocks of 16 channels; [`qgemm`]: int8
//!   products with int32 results for dynamically quantized layers;
//!   [`qelementwise`]: XNNPACK's fixed-point 8-bit addition and fp32-requantized
//!   multiplication (same shapes, or a row repeated over the other operand) and the
//!   window maximum, vectorized.
//! - [`resample`]: bilinear upsampling (PyTorch's positions), each input row widened
//!   once and blended into the output rows that read it.
//! - [`pooling`]: max pooling on the same window engine (NaN propagating), with
//!   indices, average pooling (PyTorch's divisors, `ceil_mode`), global average.
//! - [`elementwise`]: activations, binary operations with a per-channel vector,
//!   softmax, log-softmax and layer normalization of rows, every loop compiled once
//!   per instruction set; `exp`, `tanh`, sigmoid, SiLU within 4 ulp, GELU within
//!   2.5e-7·|x| as PyTorch's float32 kernel (bounds in `math.rs`, tested against f64).
//!
//! # Why not the `gemm` crate
//!
//! `gemm` 0.19 (used by the kernels before this crate) allocates its packing buffers on
//! every call, cannot take an operand packed once at load time nor caller memory, has
//! no fused bias or activation, and without its `x86-v4` feature does not use AVX-512.
//! Measured in the same runs on the development machine (BENCHMARKS.md, 1 thread): on
//! 1024³, 144-148 GFLOP/s with the AVX-512 kernel against 91 for `gemm`, and 90-93 with
//! the AVX2 kernel (parity: both at the AVX2 peak); on the 64-token linear layers of a
//! transformer encoder with the weight packed at load, 143-163 against 47-84 (AVX2
//! kernel: 62-97 against 57-89); resnet18's convolutions in 31.9 ms on 1 thread and
//! 18.0 ms on 2, against 60.2 and 45.3 ms for im2col + `gemm`. On an AVX2-only machine
//! the large-product throughput alone would not justify the replacement; the
//! allocation-free calls, load-time packing and fused epilogues do.
//!
//! # Safety
//!
//! `unsafe` lives in three places, each block with its argument: the SIMD
//! micro-kernels and vector lanes ([`arch`], behind [`arch`]'s safe checked wrappers;
//! an AVX2 lane value exists only once the CPU has been checked), the thread pool
//! (a job's closure is shared with workers by pointer while its caller waits; private
//! scratch parts per thread), and [`MatMut`] (a raw-pointer view so that threads can
//! write disjoint tiles of one output).
//!
//! # Not done
//!
//! Winograd for the NCHW [`Conv2d`] (the NHWC one has it), a blocked channel layout
//! (NCHWc), f16/bf16 products, an AVX2 8-bit product kernel (CPUs without AVX-512
//! VNNI run the portable one). NEON is compiled and type-checked only (no aarch64
//! machine to run it); the Winograd transforms run one lane at a time there.

#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)]
// Tests index their reference data directly; a panic there is a test failure.
#![cfg_attr(test, allow(clippy::indexing_slicing))]

pub mod arch;
pub mod broadcast;
pub mod conv;
pub mod elementwise;
mod error;
pub mod gemm;
pub mod layout;
mod mat;
mod math;
pub mod nhwc;
pub mod pool;
pub mod pooling;
pub mod qconv;
pub mod qelementwise;
pub mod qgemm;
pub mod resample;
pub mod unary;
mod window;

pub use arch::Isa;
pub use conv::{
    Conv2d, Conv2dParams, ConvTranspose2d, ConvTranspose2dParams, ConvWeights, WeightLayout,
};
pub use elementwise::Activation;
pub use error::{Error, Result};
pub use gemm::{BatchMut, BatchRef, Bias, Epilogue, Gemm, Lhs, PackedA, PackedB, Rhs, SlabsB};
pub use mat::{MatMut, MatRef};
pub use pool::ThreadPool;
pub use pte_alloc::{Staged, Staging};
