//! Activations along one dimension: `_softmax`, `_log_softmax` (with `half_to_float`)
//! and `glu`.
//!
//! Softmax subtracts the maximum before exponentiating, so large inputs do not overflow;
//! a NaN anywhere along the dimension makes the whole slice NaN, as in PyTorch. Slices
//! along the last dim are contiguous rows; other dims are read with a stride. Work is
//! split over threads by outer block.

use half::{bf16, f16};
use pte_runtime::{Args, DType, KernelError, KernelRegistry, KernelResult};

use super::{for_each_chunk, Float, Real};
use crate::util::prod;

/// Sizes around `dim`: (outer, dim, inner); a rank-0 tensor is one element.
fn split_at_dim(sizes: &[usize], dim: usize) -> (usize, usize, usize) {
    match sizes.get(dim) {
        Some(&len) => (prod(&sizes[..dim]), len, prod(&sizes[dim + 1..])),
        None => (1, 1, 1),
    }
}

/// Softmax (or log-softmax) of the `len` values `x[j * stride]` into `out[j * stride]`.
fn softmax_slice<T: Float, O: Float<Acc = T::Acc>>(
    x: &[T],
    out: &mut [O],
    len: usize,
    stride: usize,
    log: bool,
) {
    let at = |j: usize| x[j * stride].acc();
    let mut max = <T::Acc as Real>::NEG_INFINITY;
    for j in 0..len {
        let v = at(j);
        if v > max || v.is_nan() {
            max = v;
        }
    }
    let mut sum = <T::Acc as Real>::ZERO;
    if log {
        for j in 0..len {
            sum += (at(j) - max).exp();
        }
        let lse = sum.ln();
        for j in 0..len {
            out[j * stride] = O::of_acc(at(j) - max - lse);
        }
    } else {
        // The exponentials are kept in `out`, then divided by their (unrounded) sum.
        for j in 0..len {
            let e = (at(j) - max).exp();
            sum += e;
            out[j * stride] = O::of_acc(e);
        }
        for j in 0..len {
            let o = &mut out[j * stride];
            *o = O::of_acc(o.acc() / sum);
        }
    }
}

fn softmax_typed<T: Float, O: Float<Acc = T::Acc>>(
    x: &[T],
    out: &mut [O],
    sizes: &[usize],
    dim: usize,
    log: bool,
) {
    let (_, len, inner) = split_at_dim(sizes, dim);
    let work = x.len().saturating_mul(16);
    for_each_chunk(out, len * inner, work, |b, block| {
        let src = &x[b * len * inner..][..len * inner];
        for i in 0..inner {
            softmax_slice(&src[i..], &mut block[i..], len, inner, log);
        }
    });
}

/// `_softmax.out` / `_log_softmax.out(self, dim, half_to_float, out)`; with
/// `half_to_float` a float16/bfloat16 input gives a float32 result.
fn softmax(args: &mut Args<'_>, log: bool) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let half_to_float = args.bool(2)?;
    let out_dtype = args.tensor(3)?.dtype;
    args.resize(3, &x.sizes)?;
    let mut io = args.io(&[0.into()], &[3.into()])?;
    let src = &io.inputs[0];
    let dst = &mut io.outputs[0];
    match (x.dtype, out_dtype, half_to_float) {
        (DType::F16, DType::F32, true) => {
            softmax_typed::<f16, f32>(src.as_slice()?, dst.as_mut_slice()?, &x.sizes, dim, log);
            Ok(())
        }
        (DType::BF16, DType::F32, true) => {
            softmax_typed::<bf16, f32>(src.as_slice()?, dst.as_mut_slice()?, &x.sizes, dim, log);
            Ok(())
        }
        (a, b, false) if a == b => crate::dispatch_float!(a, T => {
            softmax_typed::<T, T>(src.as_slice()?, dst.as_mut_slice()?, &x.sizes, dim, log);
            Ok(())
        }, Err(KernelError::dtypes(&[a]))),
        (a, b, _) => Err(KernelError::dtypes(&[a, b])),
    }
}

/// `glu.out(self, dim, out)`: splits `dim` in halves `a`, `b` and gives `a · sigmoid(b)`.
fn glu(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    if x.rank() == 0 {
        return Err(KernelError::invalid("glu does not take a rank-0 tensor"));
    }
    let dim = x.dim(args.int(1)?)?;
    let (_, len, inner) = split_at_dim(&x.sizes, dim);
    if len % 2 != 0 {
        return Err(KernelError::invalid(format!(
            "glu halves dim {dim}, which has odd size {len}"
        )));
    }
    let out_dtype = args.tensor(2)?.dtype;
    if out_dtype != x.dtype {
        return Err(KernelError::dtypes(&[x.dtype, out_dtype]));
    }
    let mut sizes = x.sizes.clone();
    sizes[dim] = len / 2;
    args.resize(2, &sizes)?;
    let mut io = args.io(&[0.into()], &[2.into()])?;
    let half = len / 2 * inner;
    crate::dispatch_float!(x.dtype, T => {
        let src = io.inputs[0].as_slice::<T>()?;
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let work = out.len().saturating_mul(16);
        for_each_chunk(out, half, work, |b, block| {
            let (a, g) = src[2 * b * half..][..2 * half].split_at(half);
            for (o, (a, g)) in block.iter_mut().zip(a.iter().zip(g)) {
                let one = <<T as Float>::Acc as Real>::ONE;
                *o = T::of_acc(a.acc() * (one / (one + (-g.acc()).exp())));
            }
        });
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// Registers the softmax and GLU kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::_softmax.out", |a| softmax(a, false));
    r.register_fn("aten::_log_softmax.out", |a| softmax(a, true));
    r.register_fn("aten::glu.out", glu);
}
