//! Creation ops: `full`, `full_like`, `zeros`, `ones`, `empty` and `arange`. The output's
//! dtype (fixed by the program) decides how fill values and ranges are computed.

use pte_runtime::{Args, DType, Dims, KernelError, KernelRegistry, KernelResult, Scalar};

use crate::layout::{fill, typed_mut};
use crate::num::Elem;
use crate::util::{numel_of, to_size};

/// Sizes from a `SymInt[]` argument.
fn sizes_arg(args: &Args<'_>, i: usize) -> KernelResult<Dims> {
    let sizes: Dims = args
        .int_list(i)?
        .iter()
        .map(|&s| to_size(s, "size"))
        .collect::<KernelResult<_>>()?;
    numel_of(&sizes)?;
    Ok(sizes)
}

/// Output `out` with `sizes`, every element `value` (`None`: left as it is, for `empty`).
fn filled(args: &mut Args<'_>, sizes: &[usize], value: Option<Scalar>, out: usize) -> KernelResult {
    args.resize(out, sizes)?;
    let dtype = args.info(out)?.dtype;
    // Filling ignores the dim order, so any is fine.
    let mut io = args.io_strided(&[], &[out.into()])?;
    match (value, io.outputs.first_mut()) {
        (Some(v), Some(t)) => fill(dtype, t.bytes_mut(), v),
        _ => Ok(()),
    }
}

/// `full(size, fill_value, out)`, `zeros(size, out)`, `ones(size, out)`,
/// `empty(size, memory_format, out)`, `_empty_dim_order(size, dim_order, out)`.
fn new_tensor(args: &mut Args<'_>, value: Option<Scalar>, out: usize) -> KernelResult {
    let sizes = sizes_arg(args, 0)?;
    filled(args, &sizes, value, out)
}

/// `full_like(self, fill_value, memory_format, out)`.
fn full_like(args: &mut Args<'_>) -> KernelResult {
    let sizes = args.tensor(0)?.sizes;
    let value = args.scalar(1)?;
    filled(args, &sizes, Some(value), 3)
}

/// `fill.Scalar_out(self, value, out)` and `fill.Tensor_out(self, value, out)` (`value` a
/// 0-d tensor): `self`'s shape, every element `value` converted to the output's dtype.
fn fill_like(args: &mut Args<'_>) -> KernelResult {
    let sizes = args.tensor(0)?.sizes;
    let value = if args.kind(1)? == "Tensor" {
        let t = args.read(1)?;
        if t.info.rank() != 0 {
            return Err(KernelError::invalid(format!(
                "fill takes a 0-dim value tensor, got shape {:?}",
                t.info.sizes.as_slice()
            )));
        }
        crate::layout::first_scalar(t.info, t.bytes())?
    } else {
        args.scalar(1)?
    };
    filled(args, &sizes, Some(value), 2)
}

/// `arange` as PyTorch computes it: for an int64 output, length and values in integer
/// arithmetic on the truncated scalars; otherwise the length from doubles and each value
/// as `start + i * step` in double precision.
fn arange(
    args: &mut Args<'_>,
    start: Scalar,
    end: Scalar,
    step: Scalar,
    out: usize,
) -> KernelResult {
    let dtype = args.info(out)?.dtype;
    if dtype == DType::Bool {
        return Err(KernelError::dtypes(&[dtype]));
    }
    let (s, e, d) = (start.to_f64(), end.to_f64(), step.to_f64());
    if !(s.is_finite() && e.is_finite()) {
        return Err(KernelError::invalid(format!(
            "arange bounds {s} and {e} must be finite"
        )));
    }
    if d == 0.0 || d.is_nan() || (d > 0.0 && e < s) || (d < 0.0 && e > s) {
        return Err(KernelError::invalid(format!(
            "arange: step {d} is zero or inconsistent with bounds {s}..{e}"
        )));
    }
    // Integer outputs step by the truncated integer scalars.
    let (si, ei, di) = (start.to_i64(), end.to_i64(), step.to_i64());
    if !dtype.is_float() && di == 0 {
        return Err(KernelError::invalid(format!(
            "arange step {d} truncates to zero"
        )));
    }
    let len = if dtype == DType::I64 {
        let n = (ei as i128 - si as i128 + di as i128 - di.signum() as i128) / di as i128;
        n.max(0) as f64
    } else {
        ((e - s) / d).ceil()
    };
    if !(0.0..=(isize::MAX as f64)).contains(&len) {
        return Err(KernelError::invalid(format!(
            "arange length {len} is invalid"
        )));
    }
    let len = len as usize;
    args.resize(out, &[len])?;
    let mut io = args.io_strided(&[], &[out.into()])?;
    let Some(t) = io.outputs.first_mut() else {
        return Err(crate::util::oob());
    };
    crate::dispatch_all!(dtype, T => {
        let dst = typed_mut::<T>(t.bytes_mut())?;
        for (i, v) in dst.iter_mut().enumerate() {
            *v = if T::FLOAT {
                T::from_f64(s + d * i as f64)
            } else {
                T::from_i64(si.wrapping_add(di.wrapping_mul(i as i64)))
            };
        }
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// Registers the creation ops.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::full.out", |a| {
        let v = a.scalar(1)?;
        new_tensor(a, Some(v), 2)
    });
    r.register_fn("aten::full_like.out", full_like);
    r.register_fn("aten::fill.Scalar_out", fill_like);
    r.register_fn("aten::fill.Tensor_out", fill_like);
    r.register_fn("aten::zeros.out", |a| {
        new_tensor(a, Some(Scalar::Int(0)), 1)
    });
    r.register_fn("aten::ones.out", |a| new_tensor(a, Some(Scalar::Int(1)), 1));
    r.register_fn("aten::empty.out", |a| new_tensor(a, None, 2));
    r.register_fn("dim_order_ops::_empty_dim_order.out", |a| {
        new_tensor(a, None, 2)
    });
    r.register_fn("aten::arange.out", |a| {
        let end = a.scalar(0)?;
        arange(a, Scalar::Int(0), end, Scalar::Int(1), 1)
    });
    r.register_fn("aten::arange.start_out", |a| {
        let (start, end, step) = (a.scalar(0)?, a.scalar(1)?, a.scalar(2)?);
        arange(a, start, end, step, 3)
    });
}
