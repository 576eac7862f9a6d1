//! Matrix products: `mm`, `bmm`, `addmm` and `linear`, on [`crate::product`] (float32 on
//! `pte-compute`'s GEMM, other types in a generic loop accumulating as PyTorch does).
//! Operands of any dim order are read in row-major order ([`Dense`]); `bmm` runs one
//! product per batch entry.

use pte_runtime::{Arg, Args, DType, KernelError, KernelRegistry, KernelResult, TensorInfo};

use crate::layout::Dense;
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

/// `mm.out(self, mat2, out)`.
fn mm(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.tensor(2)?.dtype])?;
    let ((m, k), (k2, n)) = (matrix(&a, "self")?, matrix(&b, "mat2")?);
    inner_dims(k, k2, &a.sizes, &b.sizes)?;
    args.resize(2, &[m, n])?;
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
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.tensor(2)?.dtype])?;
    let (batch, m, k, n) = match (a.sizes.as_slice(), b.sizes.as_slice()) {
        (&[ba, m, k], &[bb, k2, n]) if ba == bb && k == k2 => (ba, m, k, n),
        (sa, sb) => {
            return Err(KernelError::invalid(format!(
                "bmm needs shapes [b, m, k] and [b, k, n], got {sa:?} and {sb:?}"
            )))
        }
    };
    args.resize(2, &[batch, m, n])?;
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
    let dtype = common_dtype(&[bias.dtype, a.dtype, b.dtype, args.tensor(5)?.dtype])?;
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
    let (x, w) = (args.tensor(0)?, args.tensor(1)?);
    let bias = args.opt_tensor(2)?;
    let bias_dtype = bias.as_ref().map_or(x.dtype, |b| b.dtype);
    let dtype = common_dtype(&[x.dtype, w.dtype, args.tensor(3)?.dtype, bias_dtype])?;
    let (n, k) = matrix(&w, "weight")?;
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

/// Registers the matrix product kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::mm.out", mm);
    r.register_fn("aten::bmm.out", bmm);
    r.register_fn("aten::addmm.out", addmm);
    r.register_fn("aten::linear.out", linear);
}
