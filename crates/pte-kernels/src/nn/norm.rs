//! Normalization: `native_layer_norm`, `_native_batch_norm_legit_no_training` and
//! `native_group_norm`.
//!
//! Layer and group norm compute each row's mean and biased variance in two passes (sums
//! over eight lanes, which vectorize), then normalize; rows are split over threads.
//! Inference batch norm applies each channel's running statistics plane by plane.
//!
//! The runtime's views hold two outputs and four inputs without allocating, so each
//! kernel takes its tensors in two `io` calls: the statistics (or, for batch norm, each
//! channel's scale and shift) pass between them in the method's scratch memory.

use pte_runtime::{
    Arg, Args, Buffer, DType, Dims, Element, Io, KernelError, KernelRegistry, KernelResult,
    TensorDataMut,
};
use rayon::prelude::*;
use smallvec::SmallVec;

use super::{for_each_chunk, Float, Real};
use crate::linalg::PARALLEL_WORK;
use crate::util::{prod, to_size, Elem, Scratch};

/// The tensors a kernel reads, some of them optional.
struct Reads(SmallVec<[Arg; 6]>);

impl Reads {
    fn new(required: &[usize]) -> Self {
        Self(required.iter().map(|&i| Arg::At(i)).collect())
    }

    /// Adds argument `i` unless it is None; returns its position among the reads.
    fn optional(&mut self, args: &Args<'_>, i: usize) -> KernelResult<Option<usize>> {
        if args.is_none(i)? {
            return Ok(None);
        }
        self.0.push(Arg::At(i));
        Ok(Some(self.0.len() - 1))
    }
}

/// The data of an optional read.
fn optional<'a, T: Element>(io: &Io<'a>, at: Option<usize>) -> KernelResult<Option<&'a [T]>> {
    at.map(|k| io.inputs[k].as_slice::<T>()).transpose()
}

/// `N` slices of `len` elements of `T` in the method's scratch memory: the same ones (with
/// what they hold) at each call with the same `len`, so one `io` call can leave values
/// there for the next.
fn kept<T: bytemuck::Pod, const N: usize>(
    scratch: &mut Buffer,
    len: usize,
) -> KernelResult<[&mut [T]; N]> {
    let mut s = Scratch::new(scratch, &[Scratch::piece::<T>(len); N])?;
    let mut pieces: [&mut [T]; N] = std::array::from_fn(|_| Default::default());
    for p in &mut pieces {
        *p = s.take::<T>(len)?;
    }
    Ok(pieces)
}

/// Copies `src` into an output of as many elements.
fn copy_to<T: Element>(dst: &mut TensorDataMut<'_>, src: &[T]) -> KernelResult {
    let dst = dst.as_mut_slice::<T>()?;
    if dst.len() != src.len() {
        return Err(KernelError::invalid(format!(
            "a statistics output of {} elements, expected {}",
            dst.len(),
            src.len()
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// Writes the two per-row statistics that [`kept`] holds (`rows` each) to outputs `outs`.
fn write_stats<T: Element>(args: &mut Args<'_>, rows: usize, outs: [usize; 2]) -> KernelResult {
    let mut io = args.io(&[], &[outs[0].into(), outs[1].into()])?;
    let [mean, rstd] = kept::<T, 2>(io.scratch, rows)?;
    let [a, b] = &mut io.outputs[..] else {
        return Err(KernelError::invalid(
            "normalization needs two statistics outputs",
        ));
    };
    copy_to(a, mean)?;
    copy_to(b, rstd)
}

/// Every tensor argument that is present has dtype `dtype`.
fn same_dtype(args: &Args<'_>, dtype: DType, indices: &[usize]) -> KernelResult {
    for &i in indices {
        if let Some(t) = args.opt_tensor(i)? {
            if t.dtype != dtype {
                return Err(KernelError::dtypes(&[dtype, t.dtype]));
            }
        }
    }
    Ok(())
}

/// Checks that an optional per-feature tensor has `n` elements.
fn check_len(args: &Args<'_>, i: usize, n: usize, what: &str) -> KernelResult {
    match args.opt_tensor(i)? {
        Some(t) if t.numel() != n => Err(KernelError::invalid(format!(
            "{what} has shape {:?}, expected {n} elements",
            t.sizes.as_slice()
        ))),
        _ => Ok(()),
    }
}

/// `Σ f(v)` over a row, in eight independent lanes.
fn lane_sum<T: Float>(row: &[T], f: impl Fn(T::Acc) -> T::Acc) -> T::Acc {
    let zero = <T::Acc as Real>::ZERO;
    let mut lanes = [zero; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += f(v.acc());
        }
    }
    rest.iter()
        .fold(lanes.iter().fold(zero, |a, &b| a + b), |a, v| {
            a + f(v.acc())
        })
}

/// Normalizes each `n`-element row of `x` into `out` and records its mean and
/// `1/sqrt(var + eps)`; `affine(r, j)` is the (scale, shift) of element `j` of row `r`.
fn normalize_rows<T: Float>(
    x: &[T],
    out: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
    n: usize,
    eps: f64,
    affine: impl Fn(usize, usize) -> (T::Acc, T::Acc) + Send + Sync,
) {
    if n == 0 {
        // Statistics of nothing, as 0/0.
        mean.fill(T::from_f64(f64::NAN));
        rstd.fill(T::from_f64(f64::NAN));
        return;
    }
    let count = <T::Acc as Real>::of(n as f64);
    let eps = <T::Acc as Real>::of(eps);
    let row = |((r, (o, m)), s): ((usize, (&mut [T], &mut T)), &mut T)| {
        let src = &x[r * n..][..n];
        let mu = lane_sum(src, |v| v) / count;
        let var = lane_sum(src, |v| (v - mu) * (v - mu)) / count;
        let inv = <T::Acc as Real>::ONE / (var + eps).sqrt();
        for (j, (o, v)) in o.iter_mut().zip(src).enumerate() {
            let (a, b) = affine(r, j);
            *o = T::of_acc((v.acc() - mu) * inv * a + b);
        }
        *m = T::of_acc(mu);
        *s = T::of_acc(inv);
    };
    if x.len() >= PARALLEL_WORK / 8 {
        out.par_chunks_mut(n)
            .zip(mean.par_iter_mut())
            .enumerate()
            .zip(rstd.par_iter_mut())
            .for_each(row);
    } else {
        out.chunks_mut(n)
            .zip(mean.iter_mut())
            .enumerate()
            .zip(rstd.iter_mut())
            .for_each(row);
    }
}

/// `native_layer_norm.out(input, normalized_shape, weight?, bias?, eps, out, mean, rstd)`:
/// normalizes over the trailing `normalized_shape` dims; mean and rstd keep the leading
/// dims with the normalized ones set to 1.
fn layer_norm(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let shape = args.int_list(1)?;
    let axis = x
        .rank()
        .checked_sub(shape.len())
        .filter(|&a| {
            x.sizes[a..]
                .iter()
                .zip(&shape)
                .all(|(&s, &n)| i64::try_from(s) == Ok(n))
        })
        .ok_or_else(|| {
            KernelError::invalid(format!(
                "normalized shape {shape:?} does not end input shape {:?}",
                x.sizes.as_slice()
            ))
        })?;
    let eps = args.double(4)?;
    let n = prod(&x.sizes[axis..]);
    check_len(args, 2, n, "weight")?;
    check_len(args, 3, n, "bias")?;
    same_dtype(args, x.dtype, &[2, 3, 5, 6, 7])?;
    let mut stat: Dims = x.sizes[..axis].into();
    stat.extend(std::iter::repeat_n(1, shape.len()));
    args.resize(5, &x.sizes)?;
    args.resize(6, &stat)?;
    args.resize(7, &stat)?;
    let mut reads = Reads::new(&[0]);
    let (wi, bi) = (reads.optional(args, 2)?, reads.optional(args, 3)?);
    let rows = prod(&stat);
    crate::dispatch_float!(x.dtype, T => {
        let mut io = args.io(&reads.0, &[5.into()])?;
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let src = io.inputs[0].as_slice::<T>()?;
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let [mean, rstd] = kept::<T, 2>(io.scratch, rows)?;
        normalize_rows(src, out, mean, rstd, n, eps, |_, j| {
            (w.map_or(Real::ONE, |w| w[j].acc()), b.map_or(Real::ZERO, |b| b[j].acc()))
        });
        drop(io);
        write_stats::<T>(args, rows, [6, 7])
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// `native_group_norm.out(input, weight?, bias?, N, C, HxW, group, eps, out, mean, rstd)`:
/// each batch entry's channels split into `group` groups normalized together; mean and
/// rstd are (N, group).
fn group_norm(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (n, c, hxw) = (
        to_size(args.int(3)?, "N")?,
        to_size(args.int(4)?, "C")?,
        to_size(args.int(5)?, "HxW")?,
    );
    let group = to_size(args.int(6)?, "group")?;
    let eps = args.double(7)?;
    let consistent = x.rank() >= 2
        && x.sizes[0] == n
        && x.sizes[1] == c
        && n.checked_mul(c).and_then(|v| v.checked_mul(hxw)) == Some(x.numel());
    if !consistent || group == 0 || c % group != 0 {
        return Err(KernelError::invalid(format!(
            "group norm of {group} groups does not fit input {:?} as N={n}, C={c}, HxW={hxw}",
            x.sizes.as_slice()
        )));
    }
    check_len(args, 1, c, "weight")?;
    check_len(args, 2, c, "bias")?;
    same_dtype(args, x.dtype, &[1, 2, 8, 9, 10])?;
    args.resize(8, &x.sizes)?;
    args.resize(9, &[n, group])?;
    args.resize(10, &[n, group])?;
    let mut reads = Reads::new(&[0]);
    let (wi, bi) = (reads.optional(args, 1)?, reads.optional(args, 2)?);
    let per_group = c / group;
    let rows = n * group;
    crate::dispatch_float!(x.dtype, T => {
        let mut io = args.io(&reads.0, &[8.into()])?;
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let src = io.inputs[0].as_slice::<T>()?;
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let [mean, rstd] = kept::<T, 2>(io.scratch, rows)?;
        normalize_rows(src, out, mean, rstd, per_group * hxw, eps, |r, j| {
            let ch = r % group * per_group + j / hxw;
            (w.map_or(Real::ONE, |w| w[ch].acc()), b.map_or(Real::ZERO, |b| b[ch].acc()))
        });
        drop(io);
        write_stats::<T>(args, rows, [9, 10])
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// `_native_batch_norm_legit_no_training.out(input, weight?, bias?, running_mean,
/// running_var, momentum, eps, out, save_mean, save_invstd)`: `(x - mean)·invstd·w + b`
/// per channel (dim 1). The saved statistics are empty, as upstream writes them, unless
/// the program declares them with one element per channel.
fn batch_norm(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    if x.rank() < 2 {
        return Err(KernelError::invalid(format!(
            "batch norm needs an (N, C, ...) input, got shape {:?}",
            x.sizes.as_slice()
        )));
    }
    let (c, inner) = (x.sizes[1], prod(&x.sizes[2..]));
    let eps = args.double(6)?;
    for (i, what) in [
        (1, "weight"),
        (2, "bias"),
        (3, "running_mean"),
        (4, "running_var"),
    ] {
        check_len(args, i, c, what)?;
    }
    same_dtype(args, x.dtype, &[1, 2, 3, 4, 7, 8, 9])?;
    let save_sizes = |t: pte_runtime::TensorInfo| -> Dims {
        if t.rank() == 1 && t.numel() == c && c > 0 {
            t.sizes
        } else {
            smallvec::smallvec![0; t.rank()]
        }
    };
    let (save_mean, save_invstd) = (save_sizes(args.tensor(8)?), save_sizes(args.tensor(9)?));
    args.resize(7, &x.sizes)?;
    args.resize(8, &save_mean)?;
    args.resize(9, &save_invstd)?;
    // First each channel's mean, scale and shift (into scratch) and the saved
    // statistics, then the normalized output.
    let mut reads = Reads::new(&[3, 4]);
    let (wi, bi) = (reads.optional(args, 1)?, reads.optional(args, 2)?);
    crate::dispatch_float!(x.dtype, T => {
        let mut io = args.io(&reads.0, &[8.into(), 9.into()])?;
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let (rm, rv) = (io.inputs[0].as_slice::<T>()?, io.inputs[1].as_slice::<T>()?);
        let invstd = |ch: usize| 1.0 / (rv[ch].to_f64() + eps).sqrt();
        let [mean, scale, shift] = kept::<<T as Float>::Acc, 3>(io.scratch, c)?;
        for ch in 0..c {
            mean[ch] = rm[ch].acc();
            scale[ch] = <<T as Float>::Acc as Real>::of(invstd(ch)) * w.map_or(Real::ONE, |w| w[ch].acc());
            shift[ch] = b.map_or(Real::ZERO, |b| b[ch].acc());
        }
        let [sm, si] = &mut io.outputs[..] else {
            return Err(KernelError::invalid("batch norm needs three outputs"));
        };
        for (ch, (m, s)) in sm.as_mut_slice::<T>()?.iter_mut().zip(si.as_mut_slice::<T>()?).enumerate() {
            *m = rm[ch];
            *s = T::from_f64(invstd(ch));
        }
        drop(io);
        let mut io = args.io(&[0.into()], &[7.into()])?;
        let [mean, scale, shift] = kept::<<T as Float>::Acc, 3>(io.scratch, c)?;
        let src = io.inputs[0].as_slice::<T>()?;
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let work = out.len();
        for_each_chunk(out, inner, work, |p, o| {
            let ch = p % c;
            for (o, v) in o.iter_mut().zip(&src[p * inner..][..inner]) {
                *o = T::of_acc((v.acc() - mean[ch]) * scale[ch] + shift[ch]);
            }
        });
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// Registers the normalization kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::native_layer_norm.out", layer_norm);
    r.register_fn("aten::native_group_norm.out", group_norm);
    r.register_fn("aten::_native_batch_norm_legit_no_training.out", batch_norm);
}
