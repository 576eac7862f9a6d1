//! Reductions (`sum`, `mean`, `prod`, `amax`/`amin`, `any`, `var`, `max`/`min` with
//! indices, `argmax`/`argmin`) and the dim-wise scans and selections `cumsum` and `topk`,
//! on inputs of any dim order (seen in row-major order through [`Dense`]).
//!
//! Every reduction goes through one plan: normalize the reduced dims, view the input as
//! `outer × reduced × inner` (when the reduced dims are not adjacent, the input is first
//! gathered with the kept dims in front, making `inner` 1), then `fold` each
//! `(outer, inner)` lane. Lanes advance together row by row, up to 256 at a time
//! with their accumulators on the stack, so the innermost loop runs over contiguous
//! memory whichever dim is reduced. Sums, means and products accumulate in `f64` for
//! float outputs and wrapping `i64` for integer outputs, then convert to the output's
//! dtype; `max`/`min` propagate NaN and report the first index on ties, as PyTorch does.
//! Gathered inputs, accumulated results and `topk`'s sort order live in the method's
//! scratch memory, so a steady-state run allocates nothing.

mod select;

use pte_runtime::TensorInfo;
use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult, Scalar};
use smallvec::SmallVec;

use crate::layout::{copy, row_major, typed, typed_mut, Dense, Layout};
use crate::num::Elem;
use crate::util::{convert, dim_set, oob, same_dtype, split_at_dim, Checked, Scratch};

/// A reduction's input as `outer × red × inner` elements, row-major.
#[derive(Clone, Copy, Debug)]
struct Block {
    outer: usize,
    red: usize,
    inner: usize,
}

/// Which dims a reduction reduces and the sizes of its output.
struct Plan {
    reduced: SmallVec<[bool; 6]>,
    out_sizes: Dims,
}

/// Plans a reduction of `x` over `dims` (`None`: every dim).
fn plan(x: &TensorInfo, dims: Option<&[i64]>, keepdim: bool) -> KernelResult<Plan> {
    let reduced = match dims {
        Some(d) => dim_set(d, x.rank())?,
        None => smallvec::smallvec![true; x.rank()],
    };
    let out_sizes = x
        .sizes
        .iter()
        .zip(&reduced)
        .filter_map(|(&n, &r)| match (r, keepdim) {
            (false, _) => Some(n),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Ok(Plan { reduced, out_sizes })
}

/// A dim list where empty means every dim, as `sum`, `mean`, `amax` and `var` read it.
fn all_if_empty(dims: Option<&[i64]>) -> Option<&[i64]> {
    dims.filter(|d| !d.is_empty())
}

/// The input as a [`Block`] in place, when the reduced dims are adjacent (size-1 dims do
/// not count).
fn adjacent(x: &TensorInfo, reduced: &[bool]) -> Option<Block> {
    let dims: SmallVec<[(usize, bool); 6]> = x
        .sizes
        .iter()
        .zip(reduced)
        .filter(|(&n, _)| n != 1)
        .map(|(&n, &r)| (n, r))
        .collect();
    let first = dims.iter().position(|d| d.1).unwrap_or(dims.len());
    let last = dims.iter().rposition(|d| d.1).map_or(first, |l| l + 1);
    let size = |ds: &[(usize, bool)]| ds.iter().map(|d| d.0).product::<usize>();
    let (head, rest) = dims.split_at_checked(first)?;
    let (mid, tail) = rest.split_at_checked(last - first)?;
    mid.iter().all(|d| d.1).then(|| Block {
        outer: size(head),
        red: size(mid),
        inner: size(tail),
    })
}

/// The scratch piece (bytes) [`arrange`] needs: room for a gathered copy of the input
/// unless it reduces in place.
fn gather_piece(x: &TensorInfo, reduced: &[bool]) -> (usize, usize) {
    let bytes = match adjacent(x, reduced) {
        Some(_) => 0,
        None => x.nbytes(),
    };
    Scratch::piece::<u8>(bytes)
}

/// The input's bytes (row-major) as a [`Block`]: its own when the reduced dims are
/// adjacent, else gathered with the kept dims first into the piece of `scratch` that
/// [`gather_piece`] declared.
fn arrange<'a>(
    bytes: &'a [u8],
    x: &TensorInfo,
    reduced: &[bool],
    scratch: &mut Scratch<'a>,
) -> KernelResult<(Block, &'a [u8])> {
    if let Some(block) = adjacent(x, reduced) {
        return Ok((block, bytes));
    }
    let st = row_major(&x.sizes);
    let is_reduced = |d: usize| reduced.get(d).copied().unwrap_or(false);
    let order: Dims = (0..x.rank())
        .filter(|&d| !is_reduced(d))
        .chain((0..x.rank()).filter(|&d| is_reduced(d)))
        .collect();
    let walk: Dims = order
        .iter()
        .map(|&d| x.sizes.at(d).copied())
        .collect::<KernelResult<_>>()?;
    let strides: SmallVec<[isize; 8]> = order
        .iter()
        .map(|&d| st.at(d).copied())
        .collect::<KernelResult<_>>()?;
    let buf = scratch.take::<u8>(bytes.len())?;
    let src = Layout::new(0, strides);
    copy(
        x.dtype.size(),
        &walk,
        bytes,
        &src,
        buf,
        &Layout::contiguous(&walk),
    )?;
    let kept = x.rank() - reduced.iter().filter(|&&r| r).count();
    let (kept, red) = walk.split_at_checked(kept).ok_or_else(oob)?;
    let block = Block {
        outer: kept.iter().product(),
        red: red.iter().product(),
        inner: 1,
    };
    Ok((block, buf))
}

/// Lanes of `inner` that [`fold`] advances together (accumulators on the stack).
const LANES: usize = 256;

/// Folds every lane of a block: `step(acc, x, r)` for `r` in `0..red`, starting from
/// `init`, then `emit(output index, acc)`.
fn fold<T: Copy, A: Copy>(
    src: &[T],
    b: Block,
    init: A,
    step: impl Fn(&mut A, T, usize),
    mut emit: impl FnMut(usize, A),
) {
    let lane = b.red * b.inner;
    if lane == 0 {
        (0..b.outer * b.inner).for_each(|i| emit(i, init));
        return;
    }
    for (o, chunk) in src.chunks_exact(lane).take(b.outer).enumerate() {
        if b.inner == 1 {
            let mut acc = init;
            chunk
                .iter()
                .enumerate()
                .for_each(|(r, &x)| step(&mut acc, x, r));
            emit(o, acc);
            continue;
        }
        for i0 in (0..b.inner).step_by(LANES) {
            let w = LANES.min(b.inner - i0);
            let mut accs = [init; LANES];
            for (r, row) in chunk.chunks_exact(b.inner).enumerate() {
                let run = row.iter().skip(i0).take(w);
                accs.iter_mut().zip(run).for_each(|(a, &x)| step(a, x, r));
            }
            accs.iter()
                .take(w)
                .enumerate()
                .for_each(|(i, &a)| emit(o * b.inner + i0 + i, a));
        }
    }
}

/// Writes computed values to an output (bytes) of any dtype.
fn write<S: Elem>(vals: &[S], out: &mut [u8], dtype: DType) -> KernelResult {
    crate::dispatch_all!(dtype, D => {
        convert(vals, typed_mut::<D>(out)?, dtype == DType::Bool);
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// An arithmetic reduction, computed on the input converted to the output's dtype.
#[derive(Clone, Copy, PartialEq)]
enum Arith {
    Sum,
    Mean,
    Prod,
}

/// `sum`, `mean` or `prod` of input 0 over `dims` into output `out`.
fn arith(
    args: &mut Args<'_>,
    op: Arith,
    dims: Option<&[i64]>,
    keepdim: bool,
    out: usize,
) -> KernelResult {
    let x = args.tensor(0)?;
    let p = plan(&x, dims, keepdim)?;
    args.resize(out, &p.out_sizes)?;
    let od = args.info(out)?.dtype;
    if x.dtype.is_complex() || od.is_complex() {
        return complex_arith(args, op, &p, out);
    }
    if op == Arith::Mean && !od.is_float() {
        return Err(KernelError::invalid(format!(
            "mean needs a floating-point output, got {od}"
        )));
    }
    let n = args.info(out)?.numel();
    // Results accumulate as f64 or i64 (same size).
    let pieces = [gather_piece(&x, &p.reduced), Scratch::piece::<f64>(n)];
    let mut io = Dense::io(args, &[0.into()], &[out.into()], &pieces)?;
    let (block, data) = arrange(io.bytes(0)?, &x, &p.reduced, &mut io.scratch)?;
    crate::dispatch_all!(x.dtype, T => {
        let src = typed::<T>(data)?;
        let in_bool = x.dtype == DType::Bool;
        if od.is_float() {
            let res = io.scratch.take::<f64>(n)?;
            // Products round to the output's type at each step, as PyTorch multiplies
            // in it (an intermediate overflow or underflow shows); sums accumulate wide.
            let (init, f): (f64, fn(f64, f64) -> f64) = match (op, od) {
                (Arith::Prod, DType::F32) => (1.0, |a, b| f64::from((a * b) as f32)),
                (Arith::Prod, DType::F16) => (1.0, |a, b| half::f16::from_f64(a * b).to_f64()),
                (Arith::Prod, DType::BF16) => (1.0, |a, b| half::bf16::from_f64(a * b).to_f64()),
                (Arith::Prod, _) => (1.0, |a, b| a * b),
                _ => (0.0, |a, b| a + b),
            };
            fold(src, block, init, |a, v, _| *a = f(*a, v.to_f64()), |i, a| {
                if let Some(r) = res.get_mut(i) {
                    *r = a;
                }
            });
            if op == Arith::Mean {
                res.iter_mut().for_each(|v| *v /= block.red as f64);
            }
            write(res, io.bytes_mut(0)?, od)?;
        } else {
            // A bool output sums (or multiplies) the inputs as bools.
            let as_bool = od == DType::Bool || in_bool;
            let res = io.scratch.take::<i64>(n)?;
            let (init, f): (i64, fn(i64, i64) -> i64) = match op {
                Arith::Prod => (1, i64::wrapping_mul),
                _ => (0, i64::wrapping_add),
            };
            let elem = |v: T| if as_bool { i64::from(v != T::default()) } else { v.to_i64() };
            fold(src, block, init, |a, v, _| *a = f(*a, elem(v)), |i, a| {
                if let Some(r) = res.get_mut(i) {
                    *r = a;
                }
            });
            write(res, io.bytes_mut(0)?, od)?;
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// [`arith`] of a complex input into an output of the same dtype: sums (and means) in
/// `f64`, part by part (upstream sums complex tensors; products are not supported).
fn complex_arith(args: &mut Args<'_>, op: Arith, p: &Plan, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    let od = args.info(out)?.dtype;
    if od != x.dtype || op == Arith::Prod {
        return Err(KernelError::dtypes(&[x.dtype, od]));
    }
    let mut io = Dense::io(
        args,
        &[0.into()],
        &[out.into()],
        &[gather_piece(&x, &p.reduced)],
    )?;
    let (block, data) = arrange(io.bytes(0)?, &x, &p.reduced, &mut io.scratch)?;
    crate::dispatch_types!(x.dtype, P => {
        let src = typed::<[P; 2]>(data)?;
        let dst = io.output::<[P; 2]>(0)?;
        let count = block.red as f64;
        let step = |a: &mut (f64, f64), v: [P; 2], _| {
            let [re, im] = v;
            *a = (a.0 + re.to_f64(), a.1 + im.to_f64());
        };
        fold(src, block, (0.0, 0.0), step, |i, (re, im)| {
            let (re, im) = if op == Arith::Mean { (re / count, im / count) } else { (re, im) };
            if let Some(d) = dst.get_mut(i) {
                *d = [P::from_f64(re), P::from_f64(im)];
            }
        });
    }, return Err(KernelError::dtypes(&[x.dtype])), [C32 => half::f16, C64 => f32, C128 => f64]);
    io.finish()
}

/// `sum.IntList_out` / `mean.out`: `(self, dim?, keepdim, dtype?, out)`.
fn sum_mean(args: &mut Args<'_>, op: Arith) -> KernelResult {
    let dims = args.opt_int_list(1)?;
    let keepdim = args.bool(2)?;
    arith(args, op, all_if_empty(dims.as_deref()), keepdim, 4)
}

/// True when `x` is NaN (never for integers).
#[allow(clippy::eq_op)]
fn is_nan<T: PartialEq>(x: T) -> bool {
    x != x
}

/// Whether `x` replaces the running extreme `a`: NaN wins and sticks; ties keep `a`.
fn better<T: PartialOrd + Copy>(x: T, a: T, largest: bool) -> bool {
    !is_nan(a) && (is_nan(x) || if largest { x > a } else { x < a })
}

/// Errors when a max/min-like reduction has nothing to choose from.
fn check_nonempty(block: Block, op: &str) -> KernelResult {
    if block.red == 0 {
        return Err(KernelError::invalid(format!(
            "{op}: cannot reduce over an empty dimension"
        )));
    }
    Ok(())
}

/// The extremes (values and/or first indices) of input 0 over `dims` into `values` and
/// `indices` outputs (either may be absent).
fn extreme(
    args: &mut Args<'_>,
    p: &Plan,
    largest: bool,
    values: Option<usize>,
    indices: Option<usize>,
    op: &str,
) -> KernelResult {
    let x = args.tensor(0)?;
    let writes: SmallVec<[Arg; 2]> = values.iter().chain(&indices).map(|&i| i.into()).collect();
    for &w in &writes {
        args.resize(w, &p.out_sizes)?;
    }
    if let Some(v) = values {
        same_dtype(x.dtype, args.tensor(v)?.dtype)?;
    }
    if let Some(i) = indices {
        same_dtype(DType::I64, args.info(i)?.dtype)?;
    }
    let mut io = Dense::io(args, &[0.into()], &writes, &[gather_piece(&x, &p.reduced)])?;
    let (block, data) = arrange(io.bytes(0)?, &x, &p.reduced, &mut io.scratch)?;
    check_nonempty(block, op)?;
    crate::dispatch_all!(x.dtype, T => {
        let src = typed::<T>(data)?;
        let mut outs = io.outputs.iter_mut();
        let mut vals = match values {
            Some(_) => Some(typed_mut::<T>(outs.next().ok_or_else(oob)?.1)?),
            None => None,
        };
        let mut idxs = match indices {
            Some(_) => Some(typed_mut::<i64>(outs.next().ok_or_else(oob)?.1)?),
            None => None,
        };
        let step = |a: &mut (T, usize), v: T, r: usize| {
            if r == 0 || better(v, a.0, largest) {
                *a = (v, r);
            }
        };
        fold(src, block, (T::default(), 0), step, |i, (v, r)| {
            if let Some(s) = vals.as_deref_mut().and_then(|s| s.get_mut(i)) {
                *s = v;
            }
            if let Some(s) = idxs.as_deref_mut().and_then(|s| s.get_mut(i)) {
                *s = r as i64;
            }
        });
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `amax.out` / `amin.out`: `(self, dim[], keepdim, out)`; an empty list reduces all.
fn amax(args: &mut Args<'_>, largest: bool) -> KernelResult {
    let dims = args.int_list(1)?;
    let p = plan(&args.tensor(0)?, all_if_empty(Some(&dims)), args.bool(2)?)?;
    let op = if largest { "amax" } else { "amin" };
    extreme(args, &p, largest, Some(3), None, op)
}

/// `max.dim_max` / `min.dim_min`: `(self, dim, keepdim, values, indices, returns)`.
fn max_dim(args: &mut Args<'_>, largest: bool) -> KernelResult {
    let p = plan(&args.tensor(0)?, Some(&[args.int(1)?]), args.bool(2)?)?;
    let op = if largest { "max" } else { "min" };
    extreme(args, &p, largest, Some(3), Some(4), op)
}

/// `max.unary_out` / `min.unary_out`: `(self, out)`, over every element.
fn max_all(args: &mut Args<'_>, largest: bool) -> KernelResult {
    let p = plan(&args.tensor(0)?, None, false)?;
    let op = if largest { "max" } else { "min" };
    extreme(args, &p, largest, Some(1), None, op)
}

/// `argmax.out` / `argmin.out`: `(self, dim?, keepdim, out)`; no dim means the flattened
/// input (with keepdim, every dim becomes 1).
fn argmax(args: &mut Args<'_>, largest: bool) -> KernelResult {
    let x = args.info(0)?;
    let dim = args.opt_int(1)?;
    let p = plan(x, dim.as_ref().map(std::slice::from_ref), args.bool(2)?)?;
    let op = if largest { "argmax" } else { "argmin" };
    extreme(args, &p, largest, None, Some(3), op)
}

/// `any` of input 0 over a plan into output `out` (bool or uint8).
fn any(args: &mut Args<'_>, p: Plan, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    args.resize(out, &p.out_sizes)?;
    let od = args.info(out)?.dtype;
    if !matches!(od, DType::Bool | DType::U8) {
        return Err(KernelError::dtypes(&[x.dtype, od]));
    }
    let mut io = Dense::io(
        args,
        &[0.into()],
        &[out.into()],
        &[gather_piece(&x, &p.reduced)],
    )?;
    let (block, data) = arrange(io.bytes(0)?, &x, &p.reduced, &mut io.scratch)?;
    let dst = io.output::<u8>(0)?;
    crate::dispatch_all!(x.dtype, T => {
        let src = typed::<T>(data)?;
        fold(src, block, false, |a, v, _| *a |= v != T::default(), |i, a| {
            if let Some(d) = dst.get_mut(i) {
                *d = u8::from(a);
            }
        });
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `var.correction_out` (`correction`), `var.out` (`unbiased`) and
/// `var_mean.correction_out` (with the means into output 5): `(self, dim?, ..,
/// keepdim, out)`, by Welford's algorithm in `f64`.
fn var(args: &mut Args<'_>, correction: f64, with_mean: bool) -> KernelResult {
    let x = args.tensor(0)?;
    let dims = args.opt_int_list(1)?;
    let p = plan(&x, all_if_empty(dims.as_deref()), args.bool(3)?)?;
    let writes: &[Arg] = if with_mean {
        &[Arg::At(4), Arg::At(5)]
    } else {
        &[Arg::At(4)]
    };
    for &w in writes {
        args.resize(w, &p.out_sizes)?;
        let od = args.info(w)?.dtype;
        if !x.dtype.is_float() || !od.is_float() {
            return Err(KernelError::dtypes(&[x.dtype, od]));
        }
    }
    let n = args.info(4)?.numel();
    let pieces = [
        gather_piece(&x, &p.reduced),
        Scratch::piece::<f64>(n),
        Scratch::piece::<f64>(n),
    ];
    let mut io = Dense::io(args, &[0.into()], writes, &pieces)?;
    let (block, data) = arrange(io.bytes(0)?, &x, &p.reduced, &mut io.scratch)?;
    let (vars, means) = (io.scratch.take::<f64>(n)?, io.scratch.take::<f64>(n)?);
    crate::dispatch_float!(x.dtype, T => {
        let src = typed::<T>(data)?;
        let step = |(n, mean, m2): &mut (f64, f64, f64), v: T, _| {
            let v = v.to_f64();
            *n += 1.0;
            let delta = v - *mean;
            *mean += delta / *n;
            *m2 += delta * (v - *mean);
        };
        fold(src, block, (0.0, 0.0, 0.0), step, |i, (n, mean, m2)| {
            if let (Some(v), Some(m)) = (vars.get_mut(i), means.get_mut(i)) {
                *v = m2 / (n - correction).max(0.0);
                // The mean of nothing is NaN, as 0/0.
                *m = if n == 0.0 { f64::NAN } else { mean };
            }
        });
    }, return Err(KernelError::dtypes(&[x.dtype])));
    for (k, values) in [&*vars, &*means].into_iter().enumerate().take(writes.len()) {
        let dtype = io.outputs.get(k).ok_or_else(oob)?.0.dtype;
        write(values, io.bytes_mut(k)?, dtype)?;
    }
    io.finish()
}

/// `cumsum.out(self, dim, dtype?, out)`: running sums along a dim, accumulated like
/// [`arith`] sums.
fn cumsum(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    args.resize(3, &x.sizes)?;
    let od = args.info(3)?.dtype;
    let geom = split_at_dim(&x.sizes, dim);
    let n = x.numel();
    // Sums accumulate as f64 or i64 (same size).
    let mut io = Dense::io(args, &[0.into()], &[3.into()], &[Scratch::piece::<f64>(n)])?;
    crate::dispatch_all!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        if od.is_float() {
            let res = io.scratch.take::<f64>(n)?;
            scan(src, res, geom, |v| v.to_f64(), |a, b| a + b);
            write(res, io.bytes_mut(0)?, od)?;
        } else {
            let as_bool = od == DType::Bool || x.dtype == DType::Bool;
            let res = io.scratch.take::<i64>(n)?;
            let elem = |v: T| if as_bool { i64::from(v != T::default()) } else { v.to_i64() };
            scan(src, res, geom, elem, i64::wrapping_add);
            write(res, io.bytes_mut(0)?, od)?;
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// Inclusive scan of `outer × red × inner` data along `red`, each row adding to the one
/// before it.
fn scan<T: Copy, A: Copy + Default>(
    src: &[T],
    dst: &mut [A],
    (outer, red, inner): (usize, usize, usize),
    elem: impl Fn(T) -> A,
    add: impl Fn(A, A) -> A,
) {
    let lane = red * inner;
    if lane == 0 {
        return;
    }
    for (s, d) in src
        .chunks_exact(lane)
        .zip(dst.chunks_exact_mut(lane))
        .take(outer)
    {
        let mut prev: Option<&[A]> = None;
        for (srow, drow) in s.chunks_exact(inner).zip(d.chunks_exact_mut(inner)) {
            let before = prev
                .into_iter()
                .flatten()
                .copied()
                .map(Some)
                .chain(std::iter::repeat(None));
            for ((o, &v), p) in drow.iter_mut().zip(srow).zip(before) {
                *o = add(p.unwrap_or_default(), elem(v));
            }
            prev = Some(drow);
        }
    }
}

/// `topk.values(self, k, dim, largest, sorted, values, indices, returns)`: the k largest
/// (or smallest) along a dim, NaN above every number, arranged as PyTorch arranges them:
/// a partial sort when k is at most 1/64 of the dim, else a selection of the k-th element
/// with the k - 1 before it sorted when `sorted` (ties and the unsorted order follow
/// [`select`]).
fn topk(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let k = args.int(1)?;
    let dim = x.dim(args.int(2)?)?;
    let largest = args.bool(3)?;
    let sorted = args.bool(4)?;
    let (outer, red, inner) = split_at_dim(&x.sizes, dim);
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k <= red)
        .ok_or_else(|| {
            KernelError::invalid(format!(
                "topk: k = {k} is out of range for a dimension of size {red}"
            ))
        })?;
    let mut sizes = x.sizes.clone();
    if let Some(s) = sizes.get_mut(dim) {
        *s = k;
    }
    args.resize(5, &sizes)?;
    args.resize(6, &sizes)?;
    same_dtype(x.dtype, args.tensor(5)?.dtype)?;
    same_dtype(DType::I64, args.info(6)?.dtype)?;
    // One lane's positions along the dim, sorted by value.
    let pieces = [Scratch::piece::<usize>(red)];
    let mut io = Dense::io(args, &[0.into()], &[5.into(), 6.into()], &pieces)?;
    let lane = io.scratch.take::<usize>(red)?;
    crate::dispatch_all!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        let (vals, idxs) = io.outputs2::<T, i64>()?;
        for o in 0..outer {
            for i in 0..inner {
                let at = |r: usize| src.get((o * red + r) * inner + i).copied().unwrap_or_default();
                lane.iter_mut().enumerate().for_each(|(r, p)| *p = r);
                let before = |a: usize, b: usize| {
                    let (x, y) = (at(a), at(b));
                    if largest {
                        (is_nan(x) && !is_nan(y)) || x > y
                    } else {
                        (!is_nan(x) && is_nan(y)) || x < y
                    }
                };
                if k.saturating_mul(64) <= red {
                    select::partial_sort(lane, k, &before);
                } else if k > 0 {
                    select::nth_element(lane, k - 1, &before);
                    if sorted {
                        select::sort(lane, k - 1, &before);
                    }
                }
                for (j, &r) in lane.iter().take(k).enumerate() {
                    let to = (o * k + j) * inner + i;
                    *vals.at_mut(to)? = at(r);
                    *idxs.at_mut(to)? = r as i64;
                }
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// Registers this module's kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::sum.IntList_out", |a| sum_mean(a, Arith::Sum));
    r.register_fn("aten::mean.out", |a| sum_mean(a, Arith::Mean));
    // mean.dtype_out(self, dtype?, out), prod.out(self, dtype?, out).
    r.register_fn("aten::mean.dtype_out", |a| {
        arith(a, Arith::Mean, None, false, 2)
    });
    r.register_fn("aten::prod.out", |a| arith(a, Arith::Prod, None, false, 2));
    // prod.int_out(self, dim, keepdim, dtype?, out).
    r.register_fn("aten::prod.int_out", |a| {
        let (dim, keepdim) = (a.int(1)?, a.bool(2)?);
        arith(a, Arith::Prod, Some(&[dim]), keepdim, 4)
    });
    r.register_fn("aten::amax.out", |a| amax(a, true));
    r.register_fn("aten::amin.out", |a| amax(a, false));
    r.register_fn("aten::max.dim_max", |a| max_dim(a, true));
    r.register_fn("aten::min.dim_min", |a| max_dim(a, false));
    r.register_fn("aten::max.unary_out", |a| max_all(a, true));
    r.register_fn("aten::min.unary_out", |a| max_all(a, false));
    r.register_fn("aten::argmax.out", |a| argmax(a, true));
    r.register_fn("aten::argmin.out", |a| argmax(a, false));
    // any.out(self, dim, keepdim, out), any.all_out(self, out), any.dims_out(self, dim?,
    // keepdim, out) where an empty list reduces nothing.
    r.register_fn("aten::any.out", |a| {
        let p = plan(&a.tensor(0)?, Some(&[a.int(1)?]), a.bool(2)?)?;
        any(a, p, 3)
    });
    r.register_fn("aten::any.all_out", |a| {
        let p = plan(&a.tensor(0)?, None, false)?;
        any(a, p, 1)
    });
    r.register_fn("aten::any.dims_out", |a| {
        let p = plan(&a.tensor(0)?, a.opt_int_list(1)?.as_deref(), a.bool(2)?)?;
        any(a, p, 3)
    });
    r.register_fn("aten::var.correction_out", |a| {
        let c = a.opt_scalar(2)?.map_or(1.0, Scalar::to_f64);
        var(a, c, false)
    });
    r.register_fn("aten::var.out", |a| {
        let c = f64::from(u8::from(a.bool(2)?));
        var(a, c, false)
    });
    r.register_fn("aten::var_mean.correction_out", |a| {
        let c = a.opt_scalar(2)?.map_or(1.0, Scalar::to_f64);
        var(a, c, true)
    });
    r.register_fn("aten::cumsum.out", cumsum);
    r.register_fn("aten::topk.values", topk);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(sizes: &[usize]) -> TensorInfo {
        TensorInfo {
            dtype: DType::I32,
            sizes: sizes.into(),
            dim_order: (0..sizes.len()).collect(),
        }
    }

    #[test]
    fn adjacent_dims_reduce_in_place_others_are_gathered() {
        let data: Vec<i32> = (0..24).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let x = info(&[2, 3, 4]);
        let mut buf = pte_runtime::MemoryBudget::new(1 << 20).buffer(0).unwrap();
        let in_place = [false, true, true];
        assert_eq!(gather_piece(&x, &in_place), (1, 0));
        let mut scratch = Scratch::new(&mut buf, &[]).unwrap();
        let (b, d) = arrange(bytes, &x, &in_place, &mut scratch).unwrap();
        assert_eq!((b.outer, b.red, b.inner), (2, 12, 1));
        assert_eq!(d.as_ptr(), bytes.as_ptr());
        // Reducing dims 0 and 2 gathers [3, 2, 4] with the kept dim first.
        let apart = [true, false, true];
        let mut scratch = Scratch::new(&mut buf, &[gather_piece(&x, &apart)]).unwrap();
        let (b, d) = arrange(bytes, &x, &apart, &mut scratch).unwrap();
        assert_eq!((b.outer, b.red, b.inner), (3, 8, 1));
        let mut sums = [0; 3];
        fold(
            typed::<i32>(d).unwrap(),
            b,
            0,
            |a, v, _| *a += v,
            |i, a| sums[i] = a,
        );
        assert_eq!(sums, [60, 92, 124]);
    }

    #[test]
    fn extremes_keep_the_first_nan_and_the_first_tie() {
        let step = |a: &mut (f32, usize), v: f32, r: usize| {
            if r == 0 || better(v, a.0, true) {
                *a = (v, r);
            }
        };
        let block = Block {
            outer: 1,
            red: 5,
            inner: 1,
        };
        let mut got = (0.0, 0);
        fold(
            &[1.0, 3.0, 3.0, f32::NAN, f32::NAN],
            block,
            (0.0, 0),
            step,
            |_, a| got = a,
        );
        assert_eq!(got.1, 3);
        fold(&[1.0, 3.0, 3.0, 2.0, 0.0], block, (0.0, 0), step, |_, a| {
            got = a
        });
        assert_eq!(got, (3.0, 1));
    }
}
