//! The broadcasting engine under every elementwise kernel: operands, PyTorch's result
//! type, loading inputs in the compute type, the evaluation loop, and the dispatch of an
//! element operation on the compute dtype.
//!
//! Evaluation: when every operand has the output's shape or a single element, the output
//! is one flat run (split across threads when large); otherwise it is walked row by row
//! along the last dimension, after merging the dimensions every operand steps through
//! uniformly, each operand's row being contiguous or one repeated value.
//! Runs are processed in blocks where a repeated value is read from a filled buffer, so
//! the inner loop is a plain zip of slices the compiler can vectorize. Operands converted
//! to the compute type, and results bound for an output of another dtype, live in the
//! method's scratch memory, so a steady-state run allocates nothing.

use std::array::from_fn;

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelResult, Scalar};
use pte_runtime::{TensorData, TensorDataMut, TensorInfo};
use rayon::prelude::*;
use smallvec::SmallVec;

use super::num::{Float, Int};
use crate::util::{
    broadcast_shapes, broadcast_strides, convert, for_each_broadcast, promote, Elem, Scratch,
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
    fn float<F: Float>(&self, x: [F; N]) -> F;
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
                let t = args.tensor(i)?;
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
    let to = args.tensor(out)?.dtype;
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
        check_divisor(args, operands[N - 1])?;
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
fn map<C: Elem, R: Elem, const N: usize>(
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
    for (k, op) in operands.iter().enumerate() {
        if let Operand::Tensor(i) = *op {
            let t = args.tensor(i)?;
            shape = broadcast_shapes(&shape, &t.sizes)?;
            sizes[k] = t.sizes.clone();
            infos.push(t);
            reads.push(Arg::At(i));
        }
    }
    args.resize(out, &shape)?;
    if shape.contains(&0) {
        // Nothing to compute (and empty tensors may have no aligned data to view).
        return Ok(());
    }
    // Operands of the output's shape and dim order, or of one element, can be walked in
    // memory order whatever that order is; anything else must be contiguous.
    let dst_info = args.tensor(out)?;
    let same_layout = infos.iter().all(|t| {
        t.numel() == 1 || (t.sizes == dst_info.sizes && t.dim_order == dst_info.dim_order)
    });
    let mut io = if same_layout {
        args.io_strided(&reads, &[Arg::At(out)])?
    } else {
        args.io(&reads, &[Arg::At(out)])?
    };

    // Operands of another dtype than `load_as` are converted into scratch memory, as are
    // results bound for an output of another dtype than `result`.
    let numel = io.outputs[0].info.numel();
    let mut pieces: SmallVec<[(usize, usize); 4]> = infos
        .iter()
        .filter(|t| t.dtype != load_as)
        .map(|t| Scratch::piece::<C>(t.numel()))
        .collect();
    if io.outputs[0].info.dtype != result {
        pieces.push(Scratch::piece::<R>(numel));
    }
    let mut scratch = Scratch::new(io.scratch, &pieces)?;
    let scalars: [C; N] = from_fn(|k| match operands[k] {
        Operand::Scalar(s) => scalar_as(s, load_as),
        Operand::Tensor(_) => C::default(),
    });
    let mut srcs: [&[C]; N] = from_fn(|k| std::slice::from_ref(&scalars[k]));
    let mut inputs = io.inputs.iter();
    for (src, op) in srcs.iter_mut().zip(&operands) {
        if let Operand::Tensor(_) = op {
            let t = inputs
                .next()
                .ok_or_else(|| KernelError::invalid("missing input"))?;
            *src = load(t, load_as, &mut scratch)?;
        }
    }
    let sizes: [&[usize]; N] = from_fn(|k| &sizes[k][..]);
    let dst = &mut io.outputs[0];
    if dst.info.dtype == result {
        eval(srcs, sizes, &shape, dst.as_mut_slice::<R>()?, &f);
    } else {
        let tmp = scratch.take::<R>(numel)?;
        eval(srcs, sizes, &shape, tmp, &f);
        store(tmp, dst)?;
    }
    Ok(())
}

/// A tensor's elements as `C`: its own when its dtype is `dtype`, else converted into
/// the next piece of `scratch`.
fn load<'a, C: Elem>(
    t: &TensorData<'a>,
    dtype: DType,
    scratch: &mut Scratch<'a>,
) -> KernelResult<&'a [C]> {
    if t.info.dtype == dtype {
        return t.as_slice::<C>();
    }
    let v = scratch.take::<C>(t.info.numel())?;
    crate::dispatch_all!(t.info.dtype, T => {
        convert::<T, C>(t.as_slice::<T>()?, v, dtype == DType::Bool)
    }, return Err(KernelError::dtypes(&[t.info.dtype])));
    Ok(v)
}

/// A scalar as an element of `dtype`, held as `C`.
fn scalar_as<C: Elem>(s: Scalar, dtype: DType) -> C {
    if dtype == DType::Bool {
        C::from_i64(i64::from(s.to_bool()))
    } else if C::FLOAT {
        C::from_f64(s.to_f64())
    } else {
        C::from_i64(s.to_i64())
    }
}

/// Writes results to an output of another dtype.
fn store<R: Elem>(src: &[R], dst: &mut TensorDataMut<'_>) -> KernelResult {
    let dtype = dst.info.dtype;
    crate::dispatch_all!(dtype, T => {
        convert::<R, T>(src, dst.as_mut_slice::<T>()?, dtype == DType::Bool);
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// Elements per block of the inner loop.
const BLOCK: usize = 256;
/// Outputs at least this large are computed on several threads.
const PARALLEL_MIN: usize = 1 << 16;
/// Elements per parallel task.
const PARALLEL_CHUNK: usize = 1 << 14;

/// A run of one operand: a contiguous slice, or `None` for the value repeated in its
/// fill buffer.
type Part<'a, C> = Option<&'a [C]>;

fn eval<C: Elem, R: Elem, const N: usize>(
    srcs: [&[C]; N],
    sizes: [&[usize]; N],
    shape: &[usize],
    dst: &mut [R],
    f: &(impl Fn([C; N]) -> R + Sync),
) {
    let numel = dst.len();
    if numel == 0 {
        return;
    }
    let mut fills = [[C::default(); BLOCK]; N];
    if srcs.iter().all(|s| s.len() == numel || s.len() == 1) {
        let parts: [Part<'_, C>; N] = from_fn(|k| {
            if srcs[k].len() == numel {
                Some(srcs[k])
            } else {
                fills[k] = [srcs[k][0]; BLOCK];
                None
            }
        });
        let fills = &fills;
        if numel >= PARALLEL_MIN {
            dst.par_chunks_mut(PARALLEL_CHUNK)
                .enumerate()
                .for_each(|(c, d)| {
                    let start = c * PARALLEL_CHUNK;
                    run(
                        parts.map(|p| p.map(|s| &s[start..start + d.len()])),
                        fills,
                        d,
                        f,
                    );
                });
        } else {
            run(parts, fills, dst, f);
        }
        return;
    }
    let (shape, strides) = coalesce::<N>(shape, from_fn(|k| broadcast_strides(sizes[k], shape)));
    let rank = shape.len();
    let last = shape[rank - 1];
    let outer: [&[usize]; N] = from_fn(|k| &strides[k][..rank - 1]);
    for_each_broadcast(&shape[..rank - 1], outer, |row, offsets| {
        let parts: [Part<'_, C>; N] = from_fn(|k| {
            let at = offsets[k];
            if strides[k][rank - 1] == 0 {
                fills[k][..last.min(BLOCK)].fill(srcs[k][at]);
                None
            } else {
                Some(&srcs[k][at..at + last])
            }
        });
        run(parts, &fills, &mut dst[row * last..(row + 1) * last], f);
    });
}

/// Drops size-1 dimensions and merges neighbours every operand steps through uniformly
/// (`[N, C, H, W] + [C, 1, 1]` becomes rows of `H * W`), so rows are as long as possible.
/// Needs at least one dimension larger than 1.
fn coalesce<const N: usize>(shape: &[usize], strides: [Dims; N]) -> (Dims, [Dims; N]) {
    let mut merged = Dims::new();
    let mut merged_strides: [Dims; N] = from_fn(|_| Dims::new());
    for (d, &size) in shape.iter().enumerate().filter(|&(_, &s)| s != 1) {
        let joins = |m: &[Dims; N]| (0..N).all(|k| m[k].last() == Some(&(strides[k][d] * size)));
        match merged.last_mut() {
            Some(m) if joins(&merged_strides) => {
                *m *= size;
                for (k, s) in merged_strides.iter_mut().enumerate() {
                    s.pop();
                    s.push(strides[k][d]);
                }
            }
            _ => {
                merged.push(size);
                for (k, s) in merged_strides.iter_mut().enumerate() {
                    s.push(strides[k][d]);
                }
            }
        }
    }
    (merged, merged_strides)
}

/// Computes one run of outputs, block by block.
fn run<C: Elem, R, const N: usize>(
    parts: [Part<'_, C>; N],
    fills: &[[C; BLOCK]; N],
    dst: &mut [R],
    f: &impl Fn([C; N]) -> R,
) {
    for (b, d) in dst.chunks_mut(BLOCK).enumerate() {
        let (start, n) = (b * BLOCK, d.len());
        let srcs: [&[C]; N] = from_fn(|k| match parts[k] {
            Some(s) => &s[start..start + n],
            None => &fills[k][..n],
        });
        for (i, o) in d.iter_mut().enumerate() {
            *o = f(from_fn(|k| srcs[k][i]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates `a + b` through the engine and through a plain broadcast walk.
    fn check(a: &[usize], b: &[usize]) {
        let shape = broadcast_shapes(a, b).unwrap();
        let xa: Vec<i64> = (0..a.iter().product::<usize>() as i64).collect();
        let xb: Vec<i64> = (0..b.iter().product::<usize>() as i64)
            .map(|v| v << 20)
            .collect();
        let n = shape.iter().product();
        let mut got = vec![0; n];
        eval([&xa[..], &xb[..]], [a, b], &shape, &mut got, &|[x, y]| {
            x + y
        });
        let mut want = vec![0; n];
        let (sa, sb) = (broadcast_strides(a, &shape), broadcast_strides(b, &shape));
        for_each_broadcast(&shape, [&sa, &sb], |i, [p, q]| want[i] = xa[p] + xb[q]);
        assert_eq!(got, want, "{a:?} + {b:?}");
    }

    #[test]
    fn broadcasting_matches_a_plain_walk() {
        let cases: [(&[usize], &[usize]); 10] = [
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
