//! The broadcasting engine under every elementwise kernel: operands, PyTorch's result
//! type, loading inputs in the compute type, the evaluation loop, and the dispatch of an
//! element operation on the compute dtype.
//!
//! Evaluation: when every operand has the output's shape or a single element, the output
//! is one flat run (split across the pool's threads when large); otherwise it is walked
//! row by row along the last dimension, after merging the dimensions every operand steps
//! through uniformly, each operand's row being contiguous or one repeated value.
//! Runs are processed in blocks where a repeated value is read from a filled buffer, so
//! the inner loop is a plain zip of slices the compiler can vectorize. Operands of the
//! output's shape and dim order are read in memory order, so tensors that share any dim
//! order need no copy; others of another dim order are gathered in row-major order
//! first. Operands converted to the compute type, and results bound for an output of
//! another dtype, live in the method's scratch memory, so a steady-state run allocates
//! nothing.

use std::array::from_fn;

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelResult, Scalar, TensorInfo};
use smallvec::SmallVec;

use crate::layout::{typed, typed_mut, Dense};
use crate::num::{Elem, Int, Real};
use crate::util::{
    broadcast_shapes, broadcast_strides, compute_error, convert, for_each_broadcast, oob, promote,
    scalar_as, Scratch,
};

/// An operand of an elementwise operator: a tensor argument or a scalar.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    Tensor(usize),
    Scalar(Scalar),
}

impl Operand {
    /// Argument `i`, a tensor or a scalar (the `Tensor` and `Scalar` overloads share
    /// their kernels).
    pub fn at(args: &Args<'_>, i: usize) -> KernelResult<Self> {
        if args.kind(i)? == "Tensor" {
            Ok(Operand::Tensor(i))
        } else {
            args.scalar(i).map(Operand::Scalar)
        }
    }
}

/// An element operation on floats, computed in `f32` (also for the half types) or `f64`.
pub trait FloatOp<const N: usize>: Sync {
    fn float<F: Real>(&self, x: [F; N]) -> F;
}

/// An element operation on integers, computed in their own type (bools as 0/1 bytes).
pub trait IntOp<const N: usize>: Sync {
    /// True when the last operand is a divisor, which must not be zero.
    const DIVIDES: bool = false;
    fn int<T: Int>(&self, x: [T; N]) -> T;
}

/// A comparison, computed in the operands' promoted type.
pub trait Compare: Sync {
    fn test<T: PartialOrd>(&self, a: T, b: T) -> bool;
}

/// PyTorch's `result_type`: tensors with dimensions decide, zero-dim tensors and then
/// scalars only when of a higher category (bool < integer < float); a float scalar
/// counts as float32.
pub fn result_type(args: &Args<'_>, operands: &[Operand]) -> KernelResult<DType> {
    let (mut dims, mut zero_dim, mut scalars) = (None, None, None);
    for op in operands {
        let (class, dtype) = match *op {
            Operand::Tensor(i) => {
                let t = args.info(i)?;
                let class = if t.rank() == 0 {
                    &mut zero_dim
                } else {
                    &mut dims
                };
                (class, t.dtype)
            }
            Operand::Scalar(Scalar::Double(_)) => (&mut scalars, DType::F32),
            Operand::Scalar(s) => (&mut scalars, s.dtype()),
        };
        *class = Some(match *class {
            Some(d) => promote(d, dtype)?,
            None => dtype,
        });
    }
    let lower = combine(zero_dim, scalars)?;
    combine(dims, lower)?.ok_or_else(|| KernelError::invalid("an operator needs an operand"))
}

/// Combines the result of a higher-priority class of operands with a lower one.
fn combine(higher: Option<DType>, lower: Option<DType>) -> KernelResult<Option<DType>> {
    Ok(match (higher, lower) {
        (Some(h), Some(l)) if !h.is_float() && (h == DType::Bool || l.is_float()) => {
            Some(promote(h, l)?)
        }
        (h, l) => h.or(l),
    })
}

/// The floating type an operation on `dtype` computes in (integers and bools: float32).
pub fn float_type(dtype: DType) -> DType {
    if dtype.is_float() {
        dtype
    } else {
        DType::F32
    }
}

/// Checks that a result computed as `compute` may be written to argument `out`, as
/// PyTorch does (no float into an integer, no number into a bool).
pub fn check_out(args: &Args<'_>, compute: DType, out: usize) -> KernelResult<DType> {
    let to = args.info(out)?.dtype;
    let narrowing =
        (compute.is_float() && !to.is_float()) || (compute != DType::Bool && to == DType::Bool);
    if narrowing {
        return Err(KernelError::invalid(format!(
            "result type {compute} cannot be written to an output of type {to}"
        )));
    }
    Ok(compute)
}

/// Runs a float operation computed as `compute` (a float dtype).
pub fn map_float<const N: usize>(
    args: &mut Args<'_>,
    operands: [Operand; N],
    out: usize,
    compute: DType,
    op: &impl FloatOp<N>,
) -> KernelResult {
    use DType::*;
    match compute {
        F32 | F16 | BF16 => map::<f32, f32, N>(args, operands, out, F32, F32, |x| op.float(x)),
        F64 => map::<f64, f64, N>(args, operands, out, F64, F64, |x| op.float(x)),
        other => Err(KernelError::dtypes(&[other])),
    }
}

/// Binds `$T` to the Rust type of an integer compute dtype. Unsigned types wider than a
/// byte are left out, as PyTorch has no elementwise kernels for them.
macro_rules! int_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        crate::dispatch_types!($dtype, $T => $body, Err(KernelError::dtypes(&[$dtype])), [
            U8 => u8, I8 => i8, I16 => i16, I32 => i32, I64 => i64
        ])
    };
}

/// Runs an integer operation computed as `compute` (an integer dtype or bool).
pub fn map_int<const N: usize, O: IntOp<N>>(
    args: &mut Args<'_>,
    operands: [Operand; N],
    out: usize,
    compute: DType,
    op: &O,
) -> KernelResult {
    if O::DIVIDES {
        if let Some(&divisor) = operands.last() {
            check_divisor(args, divisor)?;
        }
    }
    if compute == DType::Bool {
        // Bools compute as 0/1 bytes; a non-zero result is true.
        let f = |x: [u8; N]| u8::from(op.int(x) != 0);
        return map::<u8, u8, N>(args, operands, out, DType::Bool, DType::Bool, f);
    }
    int_type!(compute, T => map::<T, T, N>(args, operands, out, compute, compute, |x| op.int(x)))
}

/// Runs an operation with float and integer forms in the form `compute` asks for.
pub fn map_any<const N: usize, O: FloatOp<N> + IntOp<N>>(
    args: &mut Args<'_>,
    operands: [Operand; N],
    out: usize,
    compute: DType,
    op: &O,
) -> KernelResult {
    if compute.is_float() {
        map_float(args, operands, out, compute, op)
    } else {
        map_int(args, operands, out, compute, op)
    }
}

/// Runs a comparison computed as `compute`, giving 0/1 for the output.
pub fn map_compare(
    args: &mut Args<'_>,
    operands: [Operand; 2],
    out: usize,
    compute: DType,
    op: &impl Compare,
) -> KernelResult {
    use DType::*;
    match compute {
        F32 | F16 | BF16 => map::<f32, u8, 2>(args, operands, out, F32, Bool, |[a, b]| {
            u8::from(op.test(a, b))
        }),
        F64 => map::<f64, u8, 2>(args, operands, out, F64, Bool, |[a, b]| {
            u8::from(op.test(a, b))
        }),
        Bool => map::<u8, u8, 2>(args, operands, out, Bool, Bool, |[a, b]| {
            u8::from(op.test(a, b))
        }),
        _ => int_type!(compute, T => {
            map::<T, u8, 2>(args, operands, out, compute, Bool, |[a, b]| u8::from(op.test(a, b)))
        }),
    }
}

/// Integer division by zero is an error (the divisor is read before computing).
fn check_divisor(args: &Args<'_>, divisor: Operand) -> KernelResult {
    let zero = match divisor {
        Operand::Scalar(s) => s.to_f64() == 0.0,
        Operand::Tensor(i) => {
            let t = args.read(i)?;
            crate::dispatch_all!(t.info.dtype, T => {
                t.as_slice::<T>()?.iter().any(|&v| v.to_f64() == 0.0)
            }, return Err(KernelError::dtypes(&[t.info.dtype])))
        }
    };
    if zero {
        return Err(KernelError::invalid("integer division by zero"));
    }
    Ok(())
}

/// Computes `out[i] = f(operands at i)` over the broadcast shape of the operands, which
/// are read as `C` (converted unless their dtype is `load_as`). `R` holds results of
/// dtype `result`, converted when the output has another dtype.
fn map<C: Elem + Send + Sync, R: Elem + Send, const N: usize>(
    args: &mut Args<'_>,
    operands: [Operand; N],
    out: usize,
    load_as: DType,
    result: DType,
    f: impl Fn([C; N]) -> R + Sync,
) -> KernelResult {
    let mut shape = Dims::new();
    let mut sizes: [Dims; N] = from_fn(|_| Dims::new());
    let mut infos: SmallVec<[TensorInfo; 3]> = SmallVec::new();
    let mut reads: SmallVec<[Arg; 3]> = SmallVec::new();
    for (op, size) in operands.iter().zip(sizes.iter_mut()) {
        if let Operand::Tensor(i) = *op {
            let t = args.tensor(i)?;
            shape = broadcast_shapes(&shape, &t.sizes)?;
            *size = t.sizes.clone();
            infos.push(t);
            reads.push(Arg::At(i));
        }
    }
    args.resize(out, &shape)?;
    if shape.contains(&0) {
        // Nothing to compute (and empty tensors may have no aligned data to view).
        return Ok(());
    }
    let pool = args.pool();
    // Operands of the output's shape and dim order, or of one element, can be walked in
    // memory order whatever that order is; anything else is read in row-major order.
    let dst_info = args.tensor(out)?;
    let same_layout = infos.iter().all(|t| {
        t.numel() == 1 || (t.sizes == dst_info.sizes && t.dim_order == dst_info.dim_order)
    });
    // Operands of another dtype than `load_as` are converted into scratch memory, as are
    // results bound for an output of another dtype than `result`.
    let numel = dst_info.numel();
    let mut pieces: SmallVec<[(usize, usize); 4]> = infos
        .iter()
        .filter(|t| t.dtype != load_as)
        .map(|t| Scratch::piece::<C>(t.numel()))
        .collect();
    if dst_info.dtype != result {
        pieces.push(Scratch::piece::<R>(numel));
    }
    let writes = [Arg::At(out)];
    let mut io = if same_layout {
        Dense::memory_order(args, &reads, &writes, &pieces)?
    } else {
        Dense::io(args, &reads, &writes, &pieces)?
    };
    let scalars: [C; N] = operands.map(|op| match op {
        Operand::Scalar(s) => scalar_as(s, load_as == DType::Bool),
        Operand::Tensor(_) => C::default(),
    });
    let mut srcs: [&[C]; N] = [&[]; N];
    let mut inputs = io.inputs.iter();
    for ((src, op), scalar) in srcs.iter_mut().zip(&operands).zip(&scalars) {
        *src = match op {
            Operand::Tensor(_) => {
                let (info, bytes) = inputs
                    .next()
                    .ok_or_else(|| KernelError::invalid("missing input"))?;
                load(info, bytes, load_as, &mut io.scratch)?
            }
            Operand::Scalar(_) => std::slice::from_ref(scalar),
        };
    }
    let sizes: [&[usize]; N] = sizes.each_ref().map(|s| &s[..]);
    let tmp = if dst_info.dtype != result {
        Some(io.scratch.take::<R>(numel)?)
    } else {
        None
    };
    let (_, dst) = io.outputs.first_mut().ok_or_else(oob)?;
    match tmp {
        None => eval(pool, srcs, sizes, &shape, typed_mut::<R>(dst)?, &f)?,
        Some(tmp) => {
            eval(pool, srcs, sizes, &shape, tmp, &f)?;
            store(tmp, dst, dst_info.dtype)?;
        }
    }
    io.finish()
}

/// A tensor's elements as `C`: its own when its dtype is `dtype`, else converted into
/// the next piece of `scratch`.
fn load<'a, C: Elem>(
    info: &TensorInfo,
    bytes: &'a [u8],
    dtype: DType,
    scratch: &mut Scratch<'a>,
) -> KernelResult<&'a [C]> {
    if info.dtype == dtype {
        return typed::<C>(bytes);
    }
    let v = scratch.take::<C>(info.numel())?;
    crate::dispatch_all!(info.dtype, T => {
        convert::<T, C>(typed::<T>(bytes)?, v, dtype == DType::Bool)
    }, return Err(KernelError::dtypes(&[info.dtype])));
    Ok(v)
}

/// Writes results to an output of another dtype.
fn store<R: Elem>(src: &[R], dst: &mut [u8], dtype: DType) -> KernelResult {
    crate::dispatch_all!(dtype, T => {
        convert::<R, T>(src, typed_mut::<T>(dst)?, dtype == DType::Bool);
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// Elements per block of the inner loop.
const BLOCK: usize = 256;
/// Outputs at least this large are computed on several threads.
const PARALLEL_MIN: usize = 1 << 13;
/// Elements per parallel task.
const PARALLEL_CHUNK: usize = 1 << 12;

/// A run of one operand: a contiguous slice, or `None` for the value repeated in its
/// fill buffer.
type Part<'a, C> = Option<&'a [C]>;

fn eval<C: Elem + Sync, R: Send, const N: usize>(
    pool: &pte_compute::ThreadPool,
    srcs: [&[C]; N],
    sizes: [&[usize]; N],
    shape: &[usize],
    dst: &mut [R],
    f: &(impl Fn([C; N]) -> R + Sync),
) -> KernelResult {
    let numel = dst.len();
    if numel == 0 {
        return Ok(());
    }
    let mut fills = [[C::default(); BLOCK]; N];
    if srcs.iter().all(|s| s.len() == numel || s.len() == 1) {
        let mut parts: [Part<'_, C>; N] = [None; N];
        for ((part, fill), src) in parts.iter_mut().zip(fills.iter_mut()).zip(srcs) {
            if src.len() == numel {
                *part = Some(src);
            } else {
                *fill = [src.first().copied().unwrap_or_default(); BLOCK];
            }
        }
        let fills = &fills;
        if numel < PARALLEL_MIN {
            return run(parts, fills, dst, f);
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        pool.parallel_chunks(dst, PARALLEL_CHUNK, &mut [0u8; 0], 0, |c, d, _| {
            let start = c * PARALLEL_CHUNK;
            let parts = parts.map(|p| p.and_then(|s| s.get(start..start + d.len())));
            if run(parts, fills, d, f).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .map_err(compute_error)?;
        return if failed.into_inner() {
            Err(oob())
        } else {
            Ok(())
        };
    }
    let (shape, strides) = coalesce::<N>(shape, sizes.map(|s| broadcast_strides(s, shape)));
    let Some((&last, outer_shape)) = shape.split_last() else {
        return Err(oob());
    };
    let inner: [bool; N] = strides
        .each_ref()
        .map(|s| s.last().copied().unwrap_or(0) != 0);
    let outer: [&[usize]; N] = strides
        .each_ref()
        .map(|s| s.split_last().map_or(&[][..], |s| s.1));
    let mut rows = dst.chunks_exact_mut(last);
    let mut result = Ok(());
    for_each_broadcast(outer_shape, outer, |_, offsets| {
        let Some(row) = rows.next() else {
            result = Err(oob());
            return;
        };
        let mut parts: [Part<'_, C>; N] = [None; N];
        let operands = parts
            .iter_mut()
            .zip(fills.iter_mut())
            .zip(srcs.iter().zip(offsets));
        for (((part, fill), (src, at)), &steps) in operands.zip(&inner) {
            if steps {
                *part = src.get(at..at + last);
                if part.is_none() {
                    result = Err(oob());
                }
            } else {
                let v = src.get(at).copied().unwrap_or_default();
                fill.iter_mut().take(last).for_each(|x| *x = v);
            }
        }
        if result.is_ok() {
            result = run(parts, &fills, row, f);
        }
    });
    result
}

/// Drops size-1 dimensions and merges neighbours every operand steps through uniformly
/// (`[N, C, H, W] + [C, 1, 1]` becomes rows of `H * W`), so rows are as long as possible.
/// Needs at least one dimension larger than 1.
fn coalesce<const N: usize>(shape: &[usize], strides: [Dims; N]) -> (Dims, [Dims; N]) {
    let mut merged = Dims::new();
    let mut merged_strides: [Dims; N] = from_fn(|_| Dims::new());
    let stride = |k: usize, d: usize| strides.get(k).and_then(|s| s.get(d)).copied().unwrap_or(0);
    for (d, &size) in shape.iter().enumerate().filter(|&(_, &s)| s != 1) {
        let joins = merged_strides
            .iter()
            .enumerate()
            .all(|(k, m)| m.last() == Some(&(stride(k, d) * size)));
        match merged.last_mut() {
            Some(m) if joins => {
                *m *= size;
                for (k, s) in merged_strides.iter_mut().enumerate() {
                    s.pop();
                    s.push(stride(k, d));
                }
            }
            _ => {
                merged.push(size);
                for (k, s) in merged_strides.iter_mut().enumerate() {
                    s.push(stride(k, d));
                }
            }
        }
    }
    if merged.is_empty() {
        // Every dim is 1: one element.
        merged.push(1);
        for s in &mut merged_strides {
            s.push(0);
        }
    }
    (merged, merged_strides)
}

/// Computes one run of outputs, block by block.
fn run<C: Copy, R, const N: usize>(
    parts: [Part<'_, C>; N],
    fills: &[[C; BLOCK]; N],
    dst: &mut [R],
    f: &impl Fn([C; N]) -> R,
) -> KernelResult {
    for (b, d) in dst.chunks_mut(BLOCK).enumerate() {
        let (start, n) = (b * BLOCK, d.len());
        // Built without early returns: `apply` checks the lengths, and the loop then
        // vectorizes (an early return here keeps it scalar).
        let srcs: [&[C]; N] = from_fn(|k| match (parts.get(k), fills.get(k)) {
            (Some(Some(p)), _) => p.get(start..start + n).unwrap_or_default(),
            (_, Some(fill)) => fill.get(..n).unwrap_or_default(),
            _ => &[],
        });
        apply(srcs, d, f)?;
    }
    Ok(())
}

/// `d[i] = f(srcs[..][i])`; every source holds at least `d.len()` elements.
#[allow(clippy::indexing_slicing)] // every slice is first cut to `d`'s length, checked
fn apply<C: Copy, R, const N: usize>(
    srcs: [&[C]; N],
    d: &mut [R],
    f: &impl Fn([C; N]) -> R,
) -> KernelResult {
    let n = d.len();
    if srcs.iter().any(|s| s.len() < n) {
        return Err(oob());
    }
    // Slices of exactly `n` elements: the loop then needs no bounds checks and
    // vectorizes.
    let srcs = srcs.map(|s| &s[..n]);
    for (i, o) in d.iter_mut().enumerate() {
        *o = f(srcs.map(|s| s[i]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates `a + b` through the engine and through a plain broadcast walk.
    fn check(a: &[usize], b: &[usize]) {
        let pool = pte_compute::ThreadPool::new(2).unwrap();
        let shape = broadcast_shapes(a, b).unwrap();
        let xa: Vec<i64> = (0..a.iter().product::<usize>() as i64).collect();
        let xb: Vec<i64> = (0..b.iter().product::<usize>() as i64)
            .map(|v| v << 20)
            .collect();
        let n = shape.iter().product();
        let mut got = vec![0; n];
        eval(
            &pool,
            [&xa[..], &xb[..]],
            [a, b],
            &shape,
            &mut got,
            &|[x, y]| x + y,
        )
        .unwrap();
        let mut want = vec![0; n];
        let (sa, sb) = (broadcast_strides(a, &shape), broadcast_strides(b, &shape));
        for_each_broadcast(&shape, [&sa, &sb], |i, [p, q]| want[i] = xa[p] + xb[q]);
        assert_eq!(got, want, "{a:?} + {b:?}");
    }

    #[test]
    fn broadcasting_matches_a_plain_walk() {
        let cases: [(&[usize], &[usize]); 11] = [
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[1], &[5]),
            (&[5, 1, 300], &[1, 7, 1]),
            (&[2, 1, 3, 1], &[1, 4, 1, 5]),
            (&[300, 300], &[300, 1]),
            (&[70_000], &[1]),
            (&[2, 70_000], &[2, 70_000]),
            (&[3, 0], &[1]),
            (&[], &[]),
            (&[1, 1], &[1]),
        ];
        for (a, b) in cases {
            check(a, b);
            check(b, a);
        }
    }

    #[test]
    fn coalescing_merges_uniform_dimensions() {
        let shape = [2, 3, 4, 5];
        let strides = [
            broadcast_strides(&shape, &shape),
            broadcast_strides(&[3, 1, 1], &shape),
        ];
        let (merged, s) = coalesce(&shape, strides);
        assert_eq!(merged.as_slice(), &[2, 3, 20]);
        assert_eq!(s[0].as_slice(), &[60, 20, 1]);
        assert_eq!(s[1].as_slice(), &[0, 1, 0]);
    }
}
