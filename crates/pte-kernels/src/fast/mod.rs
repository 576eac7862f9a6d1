//! Fast float32 paths in front of the generic kernels, on `pte-compute`.
//!
//! [`install`] wraps some kernels of a registry. When a call site qualifies (float32
//! tensors in the default dim order, and for products and convolutions constant
//! weights), its kernel is prepared on `pte-compute` at load: weights packed once into
//! the layout the micro-kernels read (the exporter's weight transposes are folded
//! away by the runtime before this sees them), the convolution algorithm chosen by
//! shape, bias and activation fused into the product's epilogue, work split on the
//! method's thread pool, working memory taken from the method's scratch buffer (so a
//! steady-state execution allocates nothing). Any other call site gets the generic
//! kernel.
//!
//! [`install`] also sets a [`pte_runtime::Fuser`] (`fuse.rs`) that merges, when the
//! runtime finds it safe, a convolution with the zero padding before it and the batch
//! normalization, residual addition and activation after it (batch normalization
//! folded into the weights), a matrix product with its activation, a `bmm` with a
//! constant matrix expanded over its batch (one product), a max pooling whose indices nothing reads, and
//! a softmax with the calls of PyTorch's `_safe_softmax` decomposition after it, a
//! concatenation with the batch normalization and activation after it (pre-activation
//! networks such as DenseNet), a chain of copies that only rearrange elements, and a
//! chain of elementwise calls on small tensors of one size (an LSTM's gates), with the
//! product before it that only the chain reads (an LSTM step).
//!
//! A prepared fast kernel re-reads its arguments' shapes and scalars at every call and
//! prepares itself again if they changed (dynamic shapes), so it never runs on stale
//! state. Results agree with the generic kernels within float32 rounding: sums run in
//! another order, and a folded batch normalization rounds once instead of twice
//! (`tests/fast_paths.rs` compares both on many shapes).

#![forbid(unsafe_code)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]

mod conv;
mod fuse;
mod linear;
mod norm;
mod pointwise;
mod pool;
mod region;
mod resample;
mod rows;

use std::sync::Arc;

use pte_runtime::{
    Arg, Args, Charge, DType, Kernel, KernelError, KernelRegistry, KernelResult, PreparedKernel,
    TensorInfo,
};

/// A fast kernel prepared for a call site, or `None` when the fast path does not apply.
type Prepared = KernelResult<Option<Box<dyn PreparedKernel>>>;

/// Prepares a fast kernel for a call site; the generic kernel is there for the fast
/// kernel to fall back on for shapes it does not cover.
type Prepare = fn(&Args<'_>, &dyn Kernel) -> Prepared;

/// A registered kernel with a fast path in front of the generic one.
struct Fast {
    generic: Arc<dyn Kernel>,
    fast: Prepare,
}

impl Kernel for Fast {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        match (self.fast)(args, self.generic.as_ref())? {
            Some(k) => Ok(k),
            None => self.generic.prepare(args),
        }
    }
}

/// Puts the fast path `fast` in front of the kernel registered as `name`.
fn wrap(r: &mut KernelRegistry, name: &str, fast: Prepare) {
    if let Some(generic) = r.get(name).cloned() {
        r.register(name, Fast { generic, fast });
    }
}

/// Installs the fast paths and the fuser in a registry holding the generic kernels.
pub fn install(r: &mut KernelRegistry) {
    wrap(r, "aten::convolution.out", conv::prepare);
    wrap(r, "aten::addmm.out", linear::prepare_addmm);
    wrap(r, "aten::linear.out", linear::prepare_linear);
    wrap(r, "aten::mm.out", linear::prepare_mm);
    wrap(r, "aten::bmm.out", linear::prepare_bmm);
    wrap(r, "aten::max_pool2d_with_indices.out", pool::prepare_max);
    wrap(r, "aten::avg_pool2d.out", pool::prepare_avg);
    wrap(
        r,
        "aten::upsample_bilinear2d.vec_out",
        resample::prepare_bilinear,
    );
    for (name, fast) in [
        ("aten::relu.out", rows::relu as Prepare),
        ("aten::sigmoid.out", rows::sigmoid),
        ("aten::tanh.out", rows::tanh),
        ("aten::silu.out", rows::silu),
        ("aten::hardswish.out", rows::hardswish),
        ("aten::gelu.out", rows::gelu),
        ("aten::hardtanh.out", rows::hardtanh),
        ("aten::clamp.out", rows::clamp),
        ("aten::add.out", rows::add),
        ("aten::add.Scalar_out", rows::add),
        ("aten::sub.out", rows::sub),
        ("aten::sub.Scalar_out", rows::sub),
        ("aten::mul.out", rows::mul),
        ("aten::mul.Scalar_out", rows::mul),
        ("aten::_softmax.out", rows::softmax),
        ("aten::native_layer_norm.out", rows::layer_norm),
        ("aten::mean.out", rows::mean),
    ] {
        wrap(r, name, fast);
    }
    r.set_fuser(fuse::Patterns);
}

/// Metadata of argument `i` if it is a float32 tensor in the default dim order.
fn f32_tensor(args: &Args<'_>, i: usize) -> KernelResult<Option<TensorInfo>> {
    if args.kind(i)? != "Tensor" {
        return Ok(None);
    }
    let t = args.tensor(i)?;
    Ok((t.dtype == DType::F32 && t.is_contiguous()).then_some(t))
}

/// The data of a constant float32 tensor argument (`None` if it is not constant, or
/// its bytes are not aligned for `f32`).
fn constant_f32<'a>(args: &'a Args<'_>, i: usize) -> KernelResult<Option<&'a [f32]>> {
    Ok(args
        .constant(i)?
        .and_then(|b| bytemuck::try_cast_slice(b).ok()))
}

/// Charges `bytes` that a prepared kernel keeps to the method's budget.
fn charge(args: &Args<'_>, bytes: usize, what: &str) -> KernelResult<Charge> {
    args.budget()
        .charge(bytes as u64)
        .map_err(|source| KernelError::Memory {
            what: format!("{}: {what}", args.op()),
            source,
        })
}

/// Makes `held` exactly `bytes` (what a prepared kernel ended up keeping).
fn settle(args: &Args<'_>, held: &mut Charge, bytes: usize) -> KernelResult {
    held.shrink(bytes as u64);
    held.grow(bytes as u64)
        .map_err(|source| KernelError::Memory {
            what: format!("{}: prepared state", args.op()),
            source,
        })
}

/// A `pte-compute` error as a kernel error.
fn compute(e: pte_compute::Error) -> KernelError {
    KernelError::Failed(e.to_string())
}

/// `len` floats of the method's scratch memory.
fn scratch(buf: &mut pte_runtime::Buffer, len: usize) -> KernelResult<&mut [f32]> {
    buf.slice_mut::<f32>(len)
        .map_err(|source| KernelError::Memory {
            what: "working memory".into(),
            source,
        })
}

/// Argument positions as `Arg`s.
fn at(i: usize) -> Arg {
    Arg::At(i)
}

/// The first input and the first output of an `io` call as float32 slices (its two
/// lists, so that the caller may still borrow its scratch).
pub(super) fn views<'a>(
    inputs: &'a [pte_runtime::TensorData<'_>],
    outputs: &'a mut [pte_runtime::TensorDataMut<'_>],
) -> KernelResult<(&'a [f32], &'a mut [f32])> {
    let missing = || KernelError::Failed("missing tensor view".into());
    let x = inputs.first().ok_or_else(missing)?.as_slice::<f32>()?;
    let y = outputs
        .first_mut()
        .ok_or_else(missing)?
        .as_mut_slice::<f32>()?;
    Ok((x, y))
}
