//! Normalization: `native_layer_norm`, `native_group_norm` and batch norm (inference,
//! `_native_batch_norm_legit_no_training`, and training, `_native_batch_norm_legit`),
//! on tensors of any dim order.
//!
//! Layer and group norm normalize rows of the input (the trailing normalized dims, or a
//! batch entry's group of channels): each row's mean and biased variance are computed
//! in two passes in `f64`, then the row is normalized in the opmath type; rows are split
//! over the pool's threads. Inference batch norm applies each channel's running
//! statistics.

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult};
use smallvec::SmallVec;

use crate::layout::Dense;
use crate::num::{Elem, Float, Real, Ring};
use crate::util::{for_each_chunk, oob, prod, to_size, Checked, Scratch};

/// The tensors a kernel reads, some of them optional, and where each landed.
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
fn optional<'a, T: bytemuck::Pod>(
    io: &Dense<'a>,
    at: Option<usize>,
) -> KernelResult<Option<&'a [T]>> {
    at.map(|k| io.input::<T>(k)).transpose()
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

/// Mean and `1/sqrt(var + eps)` (biased variance) of values, NaN for none.
fn moments(values: impl Iterator<Item = f64> + Clone, eps: f64) -> (f64, f64) {
    let (n, sum) = values
        .clone()
        .fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    let count = n as f64;
    let mean = sum / count;
    let var = values.map(|v| (v - mean) * (v - mean)).sum::<f64>() / count;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Normalizes each `n`-element row of `x` into `out` and records its mean and
/// `1/sqrt(var + eps)` in `stats`; `affine(r, j)` is the (scale, shift) of element `j` of
/// row `r`.
fn normalize_rows<T: Float>(
    pool: &pte_compute::ThreadPool,
    x: &[T],
    out: &mut [T],
    stats: &mut [[f64; 2]],
    n: usize,
    eps: f64,
    affine: impl Fn(usize, usize) -> (T::Acc, T::Acc) + Sync,
) -> KernelResult {
    if n == 0 {
        // Statistics of nothing, as 0/0.
        stats.fill([f64::NAN; 2]);
        return Ok(());
    }
    let work = x.len().saturating_mul(4);
    for_each_chunk(pool, stats, 1, work, |r, s| {
        let row = x.get(r * n..(r + 1) * n).unwrap_or_default();
        if let Some(s) = s.first_mut() {
            let (mean, rstd) = moments(row.iter().map(|v| v.to_f64()), eps);
            *s = [mean, rstd];
        }
    })?;
    let stats = &*stats;
    for_each_chunk(pool, out, n, work, |r, o| {
        let row = x.get(r * n..).unwrap_or_default();
        let [mean, rstd] = stats.get(r).copied().unwrap_or([f64::NAN; 2]);
        let (mean, rstd) = (<T::Acc as Real>::of(mean), <T::Acc as Real>::of(rstd));
        for (j, (o, v)) in o.iter_mut().zip(row).enumerate() {
            let (a, b) = affine(r, j);
            *o = T::of_acc((v.acc() - mean) * rstd * a + b);
        }
    })
}

/// Writes per-row statistics to the mean and rstd outputs (positions 1 and 2 of `io`).
fn write_stats<T: Float>(io: &mut Dense<'_>, stats: &[[f64; 2]]) -> KernelResult {
    for k in 0..2 {
        let out = io.output::<T>(k + 1)?;
        if out.len() != stats.len() {
            return Err(KernelError::invalid(format!(
                "a statistics output of {} elements, expected {}",
                out.len(),
                stats.len()
            )));
        }
        for (o, s) in out.iter_mut().zip(stats) {
            *o = T::from_f64(s.get(k).copied().unwrap_or(f64::NAN));
        }
    }
    Ok(())
}

/// `native_layer_norm.out(input, normalized_shape, weight?, bias?, eps, out, mean, rstd)`:
/// normalizes over the trailing `normalized_shape` dims; mean and rstd keep the leading
/// dims with the normalized ones set to 1.
fn layer_norm(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let shape = args.int_list(1)?;
    let (lead, tail) = x
        .rank()
        .checked_sub(shape.len())
        .and_then(|a| x.sizes.split_at_checked(a))
        .filter(|(_, tail)| {
            tail.iter()
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
    let rows = prod(lead);
    let n = prod(tail);
    check_len(args, 2, n, "weight")?;
    check_len(args, 3, n, "bias")?;
    same_dtype(args, x.dtype, &[2, 3, 5, 6, 7])?;
    let mut stat: Dims = lead.into();
    stat.extend(std::iter::repeat_n(1, shape.len()));
    args.resize(5, &x.sizes)?;
    args.resize(6, &stat)?;
    args.resize(7, &stat)?;
    let mut reads = Reads::new(&[0]);
    let (wi, bi) = (reads.optional(args, 2)?, reads.optional(args, 3)?);
    let pool = args.pool();
    let writes = [Arg::At(5), Arg::At(6), Arg::At(7)];
    let mut io = Dense::io(args, &reads.0, &writes, &[Scratch::piece::<[f64; 2]>(rows)])?;
    let stats = io.scratch.take::<[f64; 2]>(rows)?;
    crate::dispatch_float!(x.dtype, T => {
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let src = io.input::<T>(0)?;
        let out = io.output::<T>(0)?;
        normalize_rows(pool, src, out, stats, n, eps, |_, j| {
            let at = |v: Option<&[T]>, d: <T as Elem>::Acc| v.and_then(|v| v.get(j)).map_or(d, |v| v.acc());
            (at(w, Ring::ONE), at(b, Ring::ZERO))
        })?;
        write_stats::<T>(&mut io, stats)?;
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
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
    let consistent = x.sizes.len() >= 2
        && x.sizes.first() == Some(&n)
        && x.sizes.get(1) == Some(&c)
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
    let pool = args.pool();
    let writes = [Arg::At(8), Arg::At(9), Arg::At(10)];
    let mut io = Dense::io(args, &reads.0, &writes, &[Scratch::piece::<[f64; 2]>(rows)])?;
    let stats = io.scratch.take::<[f64; 2]>(rows)?;
    crate::dispatch_float!(x.dtype, T => {
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let src = io.input::<T>(0)?;
        let out = io.output::<T>(0)?;
        normalize_rows(pool, src, out, stats, per_group * hxw, eps, |r, j| {
            let ch = r % group * per_group + j / hxw.max(1);
            let at = |v: Option<&[T]>, d: <T as Elem>::Acc| v.and_then(|v| v.get(ch)).map_or(d, |v| v.acc());
            (at(w, Ring::ONE), at(b, Ring::ZERO))
        })?;
        write_stats::<T>(&mut io, stats)?;
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `_native_batch_norm_legit_no_training.out(input, weight?, bias?, running_mean,
/// running_var, momentum, eps, out, save_mean, save_invstd)`: `(x - mean)·invstd·w + b`
/// per channel (dim 1). The saved statistics are empty, as upstream writes them, unless
/// the program declares them with one element per channel.
fn batch_norm(args: &mut Args<'_>) -> KernelResult {
    batch_norm_eval(args, [1, 2, 3, 4], 6, [7, 8, 9])
}

/// Batch norm by the running statistics: the weight, bias, running mean and variance at
/// `inputs`, eps at `eps`, the output and saved statistics at `outs`.
fn batch_norm_eval(
    args: &mut Args<'_>,
    inputs: [usize; 4],
    eps: usize,
    outs: [usize; 3],
) -> KernelResult {
    let x = args.tensor(0)?;
    let (c, inner) = channels(&x)?;
    let eps = args.double(eps)?;
    let [wi, bi, mi, vi] = inputs;
    for (i, what) in [
        (wi, "weight"),
        (bi, "bias"),
        (mi, "running_mean"),
        (vi, "running_var"),
    ] {
        check_len(args, i, c, what)?;
    }
    same_dtype(args, x.dtype, &[wi, bi, mi, vi, outs[0], outs[1], outs[2]])?;
    let save_sizes = |t: pte_runtime::TensorInfo| -> Dims {
        if t.rank() == 1 && t.numel() == c && c > 0 {
            t.sizes
        } else {
            smallvec::smallvec![0; t.rank()]
        }
    };
    let (save_mean, save_invstd) = (
        save_sizes(args.tensor(outs[1])?),
        save_sizes(args.tensor(outs[2])?),
    );
    args.resize(outs[0], &x.sizes)?;
    args.resize(outs[1], &save_mean)?;
    args.resize(outs[2], &save_invstd)?;
    let mut reads = Reads::new(&[0, mi, vi]);
    let (wi, bi) = (reads.optional(args, wi)?, reads.optional(args, bi)?);
    let pool = args.pool();
    let writes = outs.map(Arg::At);
    let mut io = Dense::io(args, &reads.0, &writes, &[Scratch::piece::<[f64; 2]>(c)])?;
    let stats = io.scratch.take::<[f64; 2]>(c)?;
    crate::dispatch_float!(x.dtype, T => {
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let (rm, rv) = (io.input::<T>(1)?, io.input::<T>(2)?);
        for (ch, s) in stats.iter_mut().enumerate() {
            *s = [rm.at(ch)?.to_f64(), 1.0 / (rv.at(ch)?.to_f64() + eps).sqrt()];
        }
        let src = io.input::<T>(0)?;
        let stats = &*stats;
        apply_channels::<T>(pool, src, io.output::<T>(0)?, c, inner, |ch| {
            let [mean, invstd] = stats.get(ch).copied().unwrap_or([f64::NAN; 2]);
            let at = |v: Option<&[T]>, d: f64| v.and_then(|v| v.get(ch)).map_or(d, |v| v.to_f64());
            let scale = invstd * at(w, 1.0);
            (scale, at(b, 0.0) - mean * scale)
        })?;
        for k in 0..2 {
            let out = io.output::<T>(k + 1)?;
            for (o, s) in out.iter_mut().zip(stats) {
                *o = T::from_f64(*s.get(k).ok_or_else(oob)?);
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// The sizes of a batch norm input: channels (dim 1) and elements per channel of a batch
/// entry.
fn channels(x: &pte_runtime::TensorInfo) -> KernelResult<(usize, usize)> {
    match x.sizes.as_slice() {
        [_, c, rest @ ..] => Ok((*c, prod(rest))),
        s => Err(KernelError::invalid(format!(
            "batch norm needs an (N, C, ...) input, got shape {s:?}"
        ))),
    }
}

/// `_native_batch_norm_legit.out(input, weight?, bias?, running_mean, running_var,
/// training, momentum, eps, out, save_mean, save_invstd)` (`running` true) and
/// `_native_batch_norm_legit.no_stats_out(input, weight?, bias?, training, momentum, eps,
/// out, save_mean, save_invstd)`. Training normalizes each channel by the batch's mean
/// and biased variance (saved as the mean and `1/sqrt(var + eps)`) and moves the running
/// statistics toward the batch's (the variance unbiased) by `momentum`; otherwise the
/// running statistics normalize, as in inference.
fn batch_norm_legit(args: &mut Args<'_>, running: bool) -> KernelResult {
    let first = if running { 5 } else { 3 };
    let training = args.bool(first)?;
    if !training {
        if !running {
            return Err(KernelError::invalid(
                "batch norm without running statistics must be in training mode",
            ));
        }
        return batch_norm_eval(args, [1, 2, 3, 4], first + 2, [8, 9, 10]);
    }
    let (momentum, eps) = (args.double(first + 1)?, args.double(first + 2)?);
    let outs = [first + 3, first + 4, first + 5];
    let x = args.tensor(0)?;
    let (c, inner) = channels(&x)?;
    let n = x.numel() / (c * inner).max(1);
    let count = n * inner;
    check_len(args, 1, c, "weight")?;
    check_len(args, 2, c, "bias")?;
    let mut checked = SmallVec::<[usize; 8]>::from_slice(&[1, 2, outs[0], outs[1], outs[2]]);
    if running {
        check_len(args, 3, c, "running_mean")?;
        check_len(args, 4, c, "running_var")?;
        checked.extend([3, 4]);
    }
    same_dtype(args, x.dtype, &checked)?;
    args.resize(outs[0], &x.sizes)?;
    args.resize(outs[1], &[c])?;
    args.resize(outs[2], &[c])?;
    let mut reads = Reads::new(&[0]);
    let (wi, bi) = (reads.optional(args, 1)?, reads.optional(args, 2)?);
    let mut writes: SmallVec<[Arg; 5]> = outs.iter().map(|&i| Arg::At(i)).collect();
    if running {
        writes.extend([Arg::At(3), Arg::At(4)]);
    }
    let pool = args.pool();
    let mut io = Dense::io(args, &reads.0, &writes, &[Scratch::piece::<[f64; 2]>(c)])?;
    let stats = io.scratch.take::<[f64; 2]>(c)?;
    crate::dispatch_float!(x.dtype, T => {
        let (w, b) = (optional::<T>(&io, wi)?, optional::<T>(&io, bi)?);
        let src = io.input::<T>(0)?;
        // Each channel's mean and biased variance over the batch and the spatial dims.
        for (ch, s) in stats.iter_mut().enumerate() {
            let values = (0..n).flat_map(|b| {
                src.get((b * c + ch) * inner..(b * c + ch + 1) * inner)
                    .unwrap_or_default()
                    .iter()
                    .map(|v| v.to_f64())
            });
            let (mean, invstd) = moments(values, eps);
            *s = [mean, invstd];
        }
        let stats = &*stats;
        apply_channels::<T>(pool, src, io.output::<T>(0)?, c, inner, |ch| {
            let [mean, invstd] = stats.get(ch).copied().unwrap_or([f64::NAN; 2]);
            let at = |v: Option<&[T]>, d: f64| v.and_then(|v| v.get(ch)).map_or(d, |v| v.to_f64());
            let scale = invstd * at(w, 1.0);
            (scale, at(b, 0.0) - mean * scale)
        })?;
        for k in 0..2 {
            for (o, s) in io.output::<T>(k + 1)?.iter_mut().zip(stats) {
                *o = T::from_f64(*s.get(k).ok_or_else(oob)?);
            }
        }
        if running {
            // var = 1/invstd² - eps, unbiased by n/(n - 1).
            let unbias = if count > 1 { count as f64 / (count - 1) as f64 } else { f64::NAN };
            for (o, s) in io.output::<T>(3)?.iter_mut().zip(stats) {
                *o = T::from_f64((1.0 - momentum) * o.to_f64() + momentum * s[0]);
            }
            for (o, s) in io.output::<T>(4)?.iter_mut().zip(stats) {
                let var = 1.0 / (s[1] * s[1]) - eps;
                *o = T::from_f64((1.0 - momentum) * o.to_f64() + momentum * var * unbias);
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `out = x·scale + shift` with each channel's (scale, shift) from `coef`, over planes of
/// `inner` elements of (N, C, inner) data.
fn apply_channels<T: Float>(
    pool: &pte_compute::ThreadPool,
    x: &[T],
    out: &mut [T],
    c: usize,
    inner: usize,
    coef: impl Fn(usize) -> (f64, f64) + Sync,
) -> KernelResult {
    let work = out.len().saturating_mul(2);
    for_each_chunk(pool, out, inner, work, |p, o| {
        let (scale, shift) = coef(p % c.max(1));
        let (scale, shift) = (<T::Acc as Real>::of(scale), <T::Acc as Real>::of(shift));
        let src = x.get(p * inner..).unwrap_or_default();
        for (o, v) in o.iter_mut().zip(src) {
            *o = T::of_acc(v.acc() * scale + shift);
        }
    })
}

/// Registers the normalization kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::native_layer_norm.out", layer_norm);
    r.register_fn("aten::native_group_norm.out", group_norm);
    r.register_fn("aten::_native_batch_norm_legit_no_training.out", batch_norm);
    r.register_fn("aten::_native_batch_norm_legit.out", |a| {
        batch_norm_legit(a, true)
    });
    r.register_fn("aten::_native_batch_norm_legit.no_stats_out", |a| {
        batch_norm_legit(a, false)
    });
}
