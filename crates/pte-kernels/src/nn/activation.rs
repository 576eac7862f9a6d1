//! Activations along one dimension: `_softmax`, `_log_softmax` (with `half_to_float`)
//! and `glu`, on tensors of any dim order.
//!
//! Softmax subtracts the maximum before exponentiating, so large inputs do not overflow;
//! a NaN anywhere along the dimension makes the whole slice NaN, as in PyTorch. Each
//! slice along the dim is read with the stride of the dims after it. Work is split over
//! the pool's threads by outer block.

use half::{bf16, f16};
use pte_runtime::{Args, DType, KernelError, KernelRegistry, KernelResult};

use crate::layout::Dense;
use crate::num::{Elem, Float, Real, Ring};
use crate::util::{for_each_chunk, split_at_dim, Checked};

/// Softmax (or log-softmax) of the lane `x[j * stride]` into `out[j * stride]`, `j` in
/// `0..len`.
fn softmax_lane<T: Float, O: Float + Elem<Acc = T::Acc>>(
    x: &[T],
    out: &mut [O],
    (len, stride): (usize, usize),
    log: bool,
) {
    let lane = || x.iter().step_by(stride).take(len).map(|v| v.acc());
    // NaN sticks: the whole lane becomes NaN.
    let max = lane().fold(<T::Acc as Real>::NEG_INFINITY, |m, v| {
        if m.is_nan() || !(v.is_nan() || v > m) {
            m
        } else {
            v
        }
    });
    let outs = out.iter_mut().step_by(stride).take(len);
    if log {
        let sum = lane().fold(<T::Acc as Ring>::ZERO, |s, v| s + (v - max).exp());
        let lse = sum.ln();
        for (o, v) in outs.zip(lane()) {
            *o = O::of_acc(v - max - lse);
        }
    } else {
        // The exponentials are kept in `out`, then divided by their (unrounded) sum.
        let mut sum = <T::Acc as Ring>::ZERO;
        for (o, v) in out.iter_mut().step_by(stride).take(len).zip(lane()) {
            let e = (v - max).exp();
            sum += e;
            *o = O::of_acc(e);
        }
        for o in out.iter_mut().step_by(stride).take(len) {
            *o = O::of_acc(o.acc() / sum);
        }
    }
}

fn softmax_typed<T: Float, O: Float + Elem<Acc = T::Acc>>(
    pool: &pte_compute::ThreadPool,
    x: &[T],
    out: &mut [O],
    (len, inner): (usize, usize),
    log: bool,
) -> KernelResult {
    let block = len * inner;
    let work = x.len().saturating_mul(16);
    for_each_chunk(pool, out, block, work, |b, dst| {
        let src = x.get(b * block..).unwrap_or_default();
        for i in 0..inner {
            let (Some(s), Some(d)) = (src.get(i..), dst.get_mut(i..)) else {
                return;
            };
            softmax_lane(s, d, (len, inner), log);
        }
    })
}

/// `_softmax.out` / `_log_softmax.out(self, dim, half_to_float, out)`; with
/// `half_to_float` a float16/bfloat16 input gives a float32 result.
fn softmax(args: &mut Args<'_>, log: bool) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let half_to_float = args.bool(2)?;
    let out_dtype = args.info(3)?.dtype;
    args.resize(3, &x.sizes)?;
    let (_, len, inner) = split_at_dim(&x.sizes, dim);
    let pool = args.pool();
    let mut io = Dense::io(args, &[0.into()], &[3.into()], &[])?;
    let src = io.inputs.first().map(|t| t.1).unwrap_or_default();
    let geom = (len, inner);
    match (x.dtype, out_dtype, half_to_float) {
        (DType::F16, DType::F32, true) => {
            softmax_typed::<f16, f32>(pool, crate::layout::typed(src)?, io.output(0)?, geom, log)?
        }
        (DType::BF16, DType::F32, true) => {
            softmax_typed::<bf16, f32>(pool, crate::layout::typed(src)?, io.output(0)?, geom, log)?
        }
        (a, b, false) if a == b => crate::dispatch_float!(a, T => {
            softmax_typed::<T, T>(pool, crate::layout::typed(src)?, io.output(0)?, geom, log)?
        }, return Err(KernelError::dtypes(&[a]))),
        (a, b, _) => return Err(KernelError::dtypes(&[a, b])),
    }
    io.finish()
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
    let out_dtype = args.info(2)?.dtype;
    if out_dtype != x.dtype {
        return Err(KernelError::dtypes(&[x.dtype, out_dtype]));
    }
    let mut sizes = x.sizes.clone();
    *sizes.as_mut_slice().at_mut(dim)? = len / 2;
    args.resize(2, &sizes)?;
    let pool = args.pool();
    let mut io = Dense::io(args, &[0.into()], &[2.into()], &[])?;
    let half = len / 2 * inner;
    crate::dispatch_float!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        let out = io.output::<T>(0)?;
        let work = out.len().saturating_mul(16);
        for_each_chunk(pool, out, half, work, |b, block| {
            let pair = src.get(2 * b * half..).unwrap_or_default();
            let (a, g) = pair.split_at(half.min(pair.len()));
            let one = <<T as Elem>::Acc as Ring>::ONE;
            for (o, (a, g)) in block.iter_mut().zip(a.iter().zip(g)) {
                *o = T::of_acc(a.acc() * (one / (one + (-g.acc()).exp())));
            }
        })?;
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// Registers the softmax and GLU kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::_softmax.out", |a| softmax(a, false));
    r.register_fn("aten::_log_softmax.out", |a| softmax(a, true));
    r.register_fn("aten::glu.out", glu);
}
