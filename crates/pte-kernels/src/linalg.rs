//! Matrix products: `mm`, `bmm`, `addmm` and `linear`, on [`crate::product`] (float32 on
//! `pte-compute`'s GEMM, other types in a generic loop accumulating as PyTorch does).
//! Operands of any dim order are read in row-major order ([`Dense`]); `bmm` runs one
//! product per batch entry.

use pte_runtime::{Arg, Args, DType, KernelError, KernelRegistry, KernelResult, TensorInfo};

use crate::layout::{Dense, Vals};
use crate::num::Elem;
use crate::product::{Mat, MatMut, Product, Products, Scale};
use crate::util::{broadcast_shapes, broadcast_strides, for_each_broadcast, oob, scalar_as};
use crate::util::{Checked, Scratch};

/// The common dtype of a product's tensors; products of bools are not defined.
fn common_dtype(dtypes: &[DType]) -> KernelResult<DType> {
    match dtypes.split_first() {
        Some((&d, rest)) if d != DType::Bool && rest.iter().all(|&x| x == d) => Ok(d),
        _ => Err(KernelError::dtypes(dtypes)),
    }
}

/// Runs `$body` with `$T` bound to the element type of a (non-bool) product dtype.
macro_rules! dispatch_product {
    ($dtype:expr, $T:ident => $body:expr) => {
        crate::dispatch_all!($dtype, $T => $body, Err(KernelError::dtypes(&[$dtype])))
    };
}

fn matrix(t: &TensorInfo, what: &str) -> KernelResult<(usize, usize)> {
    match t.sizes.as_slice() {
        &[r, c] => Ok((r, c)),
        s => Err(KernelError::invalid(format!(
            "{what} must be a matrix, got shape {s:?}"
        ))),
    }
}

fn inner_dims(k: usize, k2: usize, a: &[usize], b: &[usize]) -> KernelResult {
    if k == k2 {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "shapes {a:?} and {b:?} cannot be multiplied"
        )))
    }
}

/// Writes `src` (shape `src_sizes`) broadcast to `out_sizes` into `dst`.
fn broadcast_into<T: Copy>(
    dst: &mut [T],
    src: &[T],
    src_sizes: &[usize],
    out_sizes: &[usize],
) -> KernelResult {
    if broadcast_shapes(src_sizes, out_sizes)?.as_slice() != out_sizes {
        return Err(KernelError::invalid(format!(
            "bias of shape {src_sizes:?} does not broadcast to {out_sizes:?}"
        )));
    }
    if src.len() == dst.len() {
        dst.copy_from_slice(src);
        return Ok(());
    }
    // A bias per column (a row repeated): one copy per row.
    let row = out_sizes.last().copied().unwrap_or(1);
    if src.len() == row && src_sizes.last() == Some(&row) && row > 0 {
        for r in dst.chunks_exact_mut(row) {
            r.copy_from_slice(src);
        }
        return Ok(());
    }
    let strides = broadcast_strides(src_sizes, out_sizes);
    let mut ok = true;
    let mut slots = dst.iter_mut();
    for_each_broadcast(out_sizes, [&strides], |_, [o]| {
        match (slots.next(), src.get(o)) {
            (Some(d), Some(&v)) => *d = v,
            _ => ok = false,
        }
    });
    if ok {
        Ok(())
    } else {
        Err(oob())
    }
}

/// The sizes of one product `(m × k) × (k × n)`, the right operand transposed (`n × k`
/// in memory) when `rhs_t`.
struct Shape {
    m: usize,
    k: usize,
    n: usize,
    rhs_t: bool,
}

/// Runs the products of a call: `batch` products of `shape`, the inputs at positions
/// `lhs` and `rhs` of the call's reads, the output the call's only write. `prefill` writes
/// the output before the products (a broadcast bias), when `scale.beta` reads it.
fn products<T: Product>(
    args: &mut Args<'_>,
    reads: &[Arg],
    write: Arg,
    (batch, shape): (usize, Shape),
    scale: Scale<T>,
    prefill: Option<(usize, &[usize], &[usize])>,
) -> KernelResult {
    let Shape { m, k, n, rhs_t } = shape;
    let pool = args.pool();
    let engine = Products::new(pool);
    let scaled = scale.alpha != T::from_i64(1) || scale.beta.is_some_and(|b| b != T::from_i64(1));
    let len = T::scratch_len(&engine, m, n, k, scaled)?;
    let mut io = Dense::io(args, reads, &[write], &[Scratch::piece::<f32>(len)])?;
    let scratch = io.scratch.take::<f32>(len)?;
    let (x, y) = (io.input::<T>(0)?, io.input::<T>(1)?);
    let bias = match prefill {
        Some((at, sizes, out_sizes)) => Some((io.input::<T>(at)?, sizes, out_sizes)),
        None => None,
    };
    let out = io.output::<T>(0)?;
    if let Some((b, sizes, out_sizes)) = bias {
        broadcast_into(out, b, sizes, out_sizes)?;
    }
    if m * n > 0 {
        for (b, out) in out.chunks_exact_mut(m * n).take(batch).enumerate() {
            let lhs = Mat::row_major(x.span(b * m * k, m * k)?, m, k)?;
            let y = y.span(b * k * n, k * n)?;
            let rhs = if rhs_t {
                Mat::row_major(y, n, k)?.t()
            } else {
                Mat::row_major(y, k, n)?
            };
            T::product(
                &engine,
                MatMut::row_major(out, m, n)?,
                lhs,
                rhs,
                scale,
                scratch,
            )?;
        }
    }
    io.finish()
}

/// `out = lhs × rhs`.
fn plain<T: Elem>() -> Scale<T> {
    Scale {
        beta: None,
        alpha: T::from_i64(1),
    }
}

/// `batch` complex products `(m × k) × (k × n)` of inputs 0 and 1 into output 2, in
/// `f64` part by part (upstream multiplies complex matrices in `bmm`).
fn complex_products(
    args: &mut Args<'_>,
    (_, m, k, n): (usize, usize, usize, usize),
) -> KernelResult {
    let dtype = args.info(2)?.dtype;
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[2.into()], &[])?;
    let (a, b) = (Vals::input(&io, 0)?, Vals::input(&io, 1)?);
    let at = |v: Vals<'_>, i: usize| -> KernelResult<num_complex::Complex<f64>> {
        Ok(num_complex::Complex::new(v.at(2 * i)?, v.at(2 * i + 1)?))
    };
    crate::dispatch_types!(dtype, P => {
        let out = io.output::<[P; 2]>(0)?;
        for (idx, o) in out.iter_mut().enumerate() {
            let (bi, r, c) = (idx / (m * n).max(1), idx / n.max(1) % m.max(1), idx % n.max(1));
            let mut acc = num_complex::Complex::new(0.0, 0.0);
            for p in 0..k {
                acc += at(a, (bi * m + r) * k + p)? * at(b, (bi * k + p) * n + c)?;
            }
            *o = [P::from_f64(acc.re), P::from_f64(acc.im)];
        }
    }, return Err(KernelError::dtypes(&[dtype])), [C32 => half::f16, C64 => f32, C128 => f64]);
    io.finish()
}

/// `mm.out(self, mat2, out)`.
fn mm(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.info(0)?, args.info(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.info(2)?.dtype])?;
    let ((m, k), (k2, n)) = (matrix(a, "self")?, matrix(b, "mat2")?);
    inner_dims(k, k2, &a.sizes, &b.sizes)?;
    args.resize(2, &[m, n])?;
    if dtype.is_complex() {
        return complex_products(args, (1, m, k, n));
    }
    let shape = Shape {
        m,
        k,
        n,
        rhs_t: false,
    };
    dispatch_product!(dtype, T => products::<T>(args, &[0.into(), 1.into()], 2.into(), (1, shape), plain(), None))
}

/// `bmm.out(self, mat2, out)`: one product per batch entry.
fn bmm(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.info(0)?, args.info(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.info(2)?.dtype])?;
    let (batch, m, k, n) = match (a.sizes.as_slice(), b.sizes.as_slice()) {
        (&[ba, m, k], &[bb, k2, n]) if ba == bb && k == k2 => (ba, m, k, n),
        (sa, sb) => {
            return Err(KernelError::invalid(format!(
                "bmm needs shapes [b, m, k] and [b, k, n], got {sa:?} and {sb:?}"
            )))
        }
    };
    args.resize(2, &[batch, m, n])?;
    if dtype.is_complex() {
        return complex_products(args, (batch, m, k, n));
    }
    let shape = Shape {
        m,
        k,
        n,
        rhs_t: false,
    };
    dispatch_product!(dtype, T => products::<T>(args, &[0.into(), 1.into()], 2.into(), (batch, shape), plain(), None))
}

/// `addmm.out(self, mat1, mat2, beta, alpha, out)`: `beta·self + alpha·(mat1 × mat2)`,
/// `self` broadcast to the product's shape and ignored when `beta` is 0 (as PyTorch:
/// NaN and infinities in it do not propagate).
fn addmm(args: &mut Args<'_>) -> KernelResult {
    let (bias, a, b) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let (beta, alpha) = (args.scalar(3)?, args.scalar(4)?);
    let dtype = common_dtype(&[bias.dtype, a.dtype, b.dtype, args.info(5)?.dtype])?;
    let ((m, k), (k2, n)) = (matrix(&a, "mat1")?, matrix(&b, "mat2")?);
    inner_dims(k, k2, &a.sizes, &b.sizes)?;
    args.resize(5, &[m, n])?;
    let use_bias = beta.to_f64() != 0.0;
    let shape = Shape {
        m,
        k,
        n,
        rhs_t: false,
    };
    let reads = [Arg::At(1), Arg::At(2), Arg::At(0)];
    let reads = if use_bias { &reads[..] } else { &reads[..2] };
    let out_sizes = [m, n];
    let prefill = use_bias.then_some((2, &bias.sizes[..], &out_sizes[..]));
    dispatch_product!(dtype, T => {
        let scale = Scale {
            beta: use_bias.then(|| scalar_as::<T>(beta, false)),
            alpha: scalar_as::<T>(alpha, false),
        };
        products::<T>(args, reads, 5.into(), (1, shape), scale, prefill)
    })
}

/// `linear.out(input, weight, bias?, out)`: `input × weightᵀ + bias` over the last dim of
/// `input`, the weight read transposed in place.
fn linear(args: &mut Args<'_>) -> KernelResult {
    let (x, w) = (args.info(0)?, args.info(1)?);
    let bias = args.opt_tensor(2)?;
    let bias_dtype = bias.as_ref().map_or(x.dtype, |b| b.dtype);
    let dtype = common_dtype(&[x.dtype, w.dtype, args.info(3)?.dtype, bias_dtype])?;
    let (n, k) = matrix(w, "weight")?;
    let (&k2, lead) = x
        .sizes
        .split_last()
        .ok_or_else(|| KernelError::invalid("linear input must have at least one dimension"))?;
    inner_dims(k2, k, &x.sizes, &w.sizes)?;
    let m: usize = lead.iter().product();
    let mut out_sizes = x.sizes.clone();
    if let Some(last) = out_sizes.last_mut() {
        *last = n;
    }
    args.resize(3, &out_sizes)?;
    let shape = Shape {
        m,
        k,
        n,
        rhs_t: true,
    };
    let reads = [Arg::At(0), Arg::At(1), Arg::At(2)];
    let reads = if bias.is_some() {
        &reads[..]
    } else {
        &reads[..2]
    };
    let prefill = bias.as_ref().map(|b| (2, &b.sizes[..], &out_sizes[..]));
    dispatch_product!(dtype, T => {
        let scale = Scale {
            beta: bias.is_some().then(|| T::from_i64(1)),
            alpha: T::from_i64(1),
        };
        products::<T>(args, reads, 3.into(), (1, shape), scale, prefill)
    })
}

/// The `p`-norm distance of two rows, in `f64`: the count of differing elements for
/// `p = 0`, the largest difference for `p = ∞`, `(Σ |a - b|^p)^(1/p)` otherwise.
fn distance<T: Elem>(a: &[T], b: &[T], p: f64) -> f64 {
    let diffs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x.to_f64() - y.to_f64()).abs());
    if p == 0.0 {
        diffs.filter(|&d| d != 0.0).count() as f64
    } else if p == f64::INFINITY {
        diffs.fold(0.0, |m: f64, d| if d.is_nan() || d > m { d } else { m })
    } else if p == 1.0 {
        diffs.sum()
    } else if p == 2.0 {
        diffs.map(|d| d * d).sum::<f64>().sqrt()
    } else {
        diffs.map(|d| d.powf(p)).sum::<f64>().powf(1.0 / p)
    }
}

/// A non-negative `p` of a distance.
fn check_p(p: f64, op: &str) -> KernelResult {
    if p >= 0.0 {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "{op}: p must be non-negative, got {p}"
        )))
    }
}

/// A `[..., rows, cols]` tensor's batch sizes, rows and columns.
fn rows_of(t: &TensorInfo) -> KernelResult<(&[usize], usize, usize)> {
    match t.sizes.as_slice() {
        [batch @ .., r, m] => Ok((batch, *r, *m)),
        s => Err(KernelError::invalid(format!(
            "cdist takes tensors of at least 2 dims, got {s:?}"
        ))),
    }
}

/// `_cdist_forward.out(x1, x2, p, compute_mode?, out)`: the distance between every row of
/// `x1` (`[..., P, M]`) and every row of `x2` (`[..., R, M]`), batch dims broadcast.
fn cdist(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    let p = args.double(2)?;
    check_p(p, "cdist")?;
    let dtype = common_dtype(&[a.dtype, b.dtype, args.info(4)?.dtype])?;
    let ((ba, pr, m), (bb, rr, m2)) = (rows_of(&a)?, rows_of(&b)?);
    if m != m2 {
        return Err(KernelError::invalid(format!(
            "cdist: rows of {m} and {m2} elements"
        )));
    }
    let batch = broadcast_shapes(ba, bb)?;
    let mut sizes = batch.clone();
    sizes.extend([pr, rr]);
    crate::util::numel_of(&sizes)?;
    args.resize(4, &sizes)?;
    let (sa, sb) = (broadcast_strides(ba, &batch), broadcast_strides(bb, &batch));
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[4.into()], &[])?;
    crate::dispatch_float!(dtype, T => {
        let (x, y) = (io.input::<T>(0)?, io.input::<T>(1)?);
        let mut out = io.output::<T>(0)?.iter_mut();
        let mut ok = true;
        for_each_broadcast(&batch, [&sa, &sb], |_, [i, j]| {
            let (x0, y0) = (i * pr * m, j * rr * m);
            for r in 0..pr {
                for q in 0..rr {
                    let (u, v) = (x.get(x0 + r * m..x0 + (r + 1) * m), y.get(y0 + q * m..y0 + (q + 1) * m));
                    match (out.next(), u, v) {
                        (Some(o), Some(u), Some(v)) => *o = T::from_f64(distance(u, v, p)),
                        _ => ok = false,
                    }
                }
            }
        });
        if !ok {
            return Err(oob());
        }
    }, return Err(KernelError::dtypes(&[dtype])));
    io.finish()
}

/// `_pdist_forward.out(self, p, out)`: the distances between rows `i < j` of `self`
/// (`[N, M]`), in order.
fn pdist(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let p = args.double(1)?;
    check_p(p, "pdist")?;
    let dtype = common_dtype(&[x.dtype, args.info(2)?.dtype])?;
    let (n, m) = matrix(x, "pdist input")?;
    let pairs = n * n.saturating_sub(1) / 2;
    args.resize(2, &[pairs])?;
    let mut io = Dense::io(args, &[0.into()], &[2.into()], &[])?;
    crate::dispatch_float!(dtype, T => {
        let x = io.input::<T>(0)?;
        let rows = || x.chunks_exact(m.max(1)).take(n);
        let pairs = rows().enumerate().flat_map(|(i, u)| rows().skip(i + 1).map(move |v| (u, v)));
        for (o, (u, v)) in io.output::<T>(0)?.iter_mut().zip(pairs) {
            *o = T::from_f64(if m == 0 { 0.0 } else { distance(u, v, p) });
        }
    }, return Err(KernelError::dtypes(&[dtype])));
    io.finish()
}

/// Registers the matrix product kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::_cdist_forward.out", cdist);
    r.register_fn("aten::_pdist_forward.out", pdist);
    r.register_fn("aten::mm.out", mm);
    r.register_fn("aten::bmm.out", bmm);
    r.register_fn("aten::addmm.out", addmm);
    r.register_fn("aten::linear.out", linear);
}
