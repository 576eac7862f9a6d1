//! Complex tensors: `_conj_physical`, `view_as_real_copy`, and the real FFTs `_fft_r2c`
//! and `_fft_c2r` (what `torch.fft.rfft`, `irfft`, `rfftn`, ... export to).
//!
//! A complex tensor's data is its parts, real then imaginary, so kernels read and write
//! complex tensors as real ones of twice the elements. The transforms compute in `f64`:
//! one complex transform per lane along each transformed dim, by an iterative radix-2
//! FFT for power-of-two lengths and Bluestein's chirp-z algorithm (three power-of-two
//! FFTs of at least `2n - 1`) for the others, so work is `O(n log n)` per lane for every
//! length.

use num_complex::Complex;
use pte_runtime::{Args, Dims, KernelError, KernelRegistry, KernelResult};
use smallvec::SmallVec;

use crate::layout::Dense;
use crate::num::Elem;
use crate::util::{complex_part, dim_set, numel_of, oob, split_at_dim, to_size, Scratch};

type C = Complex<f64>;

/// Runs `$body` with `$P` bound to the part type of complex dtype `$dtype`.
macro_rules! dispatch_parts {
    ($dtype:expr, $P:ident => $body:expr, $other:expr) => {
        crate::dispatch_types!($dtype, $P => $body, $other, [
            C32 => half::f16, C64 => f32, C128 => f64
        ])
    };
}

/// `_conj_physical.out(self, out)`: the complex conjugate (a real tensor is copied).
fn conj_physical(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    args.resize(1, &x.sizes)?;
    let out = args.info(1)?.dtype;
    if out != x.dtype {
        return Err(KernelError::dtypes(&[x.dtype, out]));
    }
    let mut io = Dense::io(args, &[0.into()], &[1.into()], &[])?;
    let src = io.bytes(0)?;
    io.bytes_mut(0)?.copy_from_slice(src);
    if x.dtype.is_complex() {
        dispatch_parts!(x.dtype, P => {
            for pair in io.output::<P>(0)?.chunks_exact_mut(2) {
                if let [_, im] = pair {
                    *im = -*im;
                }
            }
        }, return Err(KernelError::dtypes(&[x.dtype])));
    }
    io.finish()
}

/// `view_as_real_copy.out(self, out)`: a complex tensor's parts as a new last dim of 2.
fn view_as_real(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let out = args.info(1)?.dtype;
    if !x.dtype.is_complex() || out != complex_part(x.dtype) {
        return Err(KernelError::dtypes(&[x.dtype, out]));
    }
    let mut sizes = x.sizes.clone();
    sizes.push(2);
    args.resize(1, &sizes)?;
    let mut io = Dense::io(args, &[0.into()], &[1.into()], &[])?;
    let src = io.bytes(0)?;
    io.bytes_mut(0)?.copy_from_slice(src);
    io.finish()
}

/// In-place iterative radix-2 FFT of a power-of-two length (`inverse`: the conjugate
/// transform, unscaled).
fn radix2(buf: &mut [C], inverse: bool) {
    let n = buf.len();
    if n < 2 {
        return;
    }
    let bits = n.trailing_zeros();
    for i in 0..n {
        let j = i.reverse_bits() >> (usize::BITS - bits);
        if j > i {
            buf.swap(i, j);
        }
    }
    let sign = if inverse { 1.0 } else { -1.0 };
    let mut len = 2;
    while len <= n {
        let step = C::from_polar(1.0, sign * 2.0 * std::f64::consts::PI / len as f64);
        for block in buf.chunks_exact_mut(len) {
            let (lo, hi) = block.split_at_mut(len / 2);
            let mut w = C::new(1.0, 0.0);
            for (k, (a, b)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                // Recomputed every 16 steps so rounding does not drift over long blocks.
                if k % 16 == 0 {
                    w = C::from_polar(
                        1.0,
                        sign * 2.0 * std::f64::consts::PI * k as f64 / len as f64,
                    );
                }
                let t = *b * w;
                *b = *a - t;
                *a += t;
                w *= step;
            }
        }
        len *= 2;
    }
}

/// Scratch (complex elements) [`transform`] needs for a length `n`.
fn work_len(n: usize) -> KernelResult<usize> {
    if n.is_power_of_two() || n < 2 {
        return Ok(0);
    }
    let m = n
        .checked_mul(2)
        .and_then(|v| v.checked_next_power_of_two())
        .ok_or_else(|| KernelError::invalid(format!("an FFT of length {n} is too long")))?;
    m.checked_mul(2)
        .ok_or_else(|| KernelError::invalid(format!("an FFT of length {n} is too long")))
}

/// In-place complex DFT of any length (`inverse`: the conjugate transform, unscaled),
/// with `work` of at least [`work_len`] elements.
fn transform(buf: &mut [C], inverse: bool, work: &mut [C]) -> KernelResult {
    let n = buf.len();
    if n.is_power_of_two() || n < 2 {
        radix2(buf, inverse);
        return Ok(());
    }
    // Bluestein: x_k w_k convolved with conj(w), w_k = exp(∓iπk²/n), as a cyclic
    // convolution of a power-of-two length m >= 2n - 1.
    let m = work.len() / 2;
    let (a, b) = work.split_at_mut(m);
    let sign = if inverse { 1.0 } else { -1.0 };
    let chirp = |k: usize| {
        // k² mod 2n keeps the angle exact for long transforms.
        let r = (k as u128 * k as u128 % (2 * n as u128)) as f64;
        C::from_polar(1.0, sign * std::f64::consts::PI * r / n as f64)
    };
    a.fill(C::new(0.0, 0.0));
    b.fill(C::new(0.0, 0.0));
    for (k, (ak, x)) in a.iter_mut().zip(buf.iter()).enumerate() {
        *ak = *x * chirp(k);
    }
    for k in 0..n {
        let w = chirp(k).conj();
        *b.get_mut(k).ok_or_else(oob)? = w;
        if k > 0 {
            *b.get_mut(m - k).ok_or_else(oob)? = w;
        }
    }
    radix2(a, false);
    radix2(b, false);
    for (x, y) in a.iter_mut().zip(b.iter()) {
        *x *= *y;
    }
    radix2(a, true);
    let scale = 1.0 / m as f64;
    for (k, (x, c)) in buf.iter_mut().zip(a.iter()).enumerate() {
        *x = chirp(k) * *c * scale;
    }
    Ok(())
}

/// Transforms every lane along `dim` of `data` (row-major `sizes`), each copied into
/// `lane` first.
fn along(
    data: &mut [C],
    sizes: &[usize],
    dim: usize,
    inverse: bool,
    lane: &mut [C],
    work: &mut [C],
) -> KernelResult {
    let (outer, n, inner) = split_at_dim(sizes, dim);
    let lane = lane.get_mut(..n).ok_or_else(oob)?;
    for o in 0..outer {
        for i in 0..inner {
            let base = o * n * inner + i;
            for (k, v) in lane.iter_mut().enumerate() {
                *v = *data.get(base + k * inner).ok_or_else(oob)?;
            }
            transform(lane, inverse, work)?;
            for (k, v) in lane.iter().enumerate() {
                *data.get_mut(base + k * inner).ok_or_else(oob)? = *v;
            }
        }
    }
    Ok(())
}

/// The normalization factor of `normalization` (0: none, 1: `1/sqrt(n)`, 2: `1/n`) for a
/// transform of `n` points.
fn scale(normalization: i64, n: usize) -> KernelResult<f64> {
    match normalization {
        0 => Ok(1.0),
        1 => Ok(1.0 / (n as f64).sqrt()),
        2 => Ok(1.0 / n as f64),
        other => Err(KernelError::invalid(format!(
            "FFT normalization must be 0, 1 or 2, got {other}"
        ))),
    }
}

/// The transformed dims of an FFT, in the order given, each once, and the last of them.
fn fft_dims(list: &[i64], rank: usize) -> KernelResult<(SmallVec<[usize; 4]>, usize)> {
    dim_set(list, rank)?;
    let dims: SmallVec<[usize; 4]> = list
        .iter()
        .map(|&d| pte_runtime::normalize_dim(d, rank))
        .collect::<KernelResult<_>>()?;
    let last = *dims
        .last()
        .ok_or_else(|| KernelError::invalid("an FFT needs at least one dim"))?;
    if rank == 0 {
        return Err(KernelError::invalid("an FFT needs a tensor with dims"));
    }
    Ok((dims, last))
}

/// Scratch pieces for transforms along `dims` of `sizes`: the lane and the work buffer.
fn lane_pieces(sizes: &[usize], dims: &[usize]) -> KernelResult<(usize, usize)> {
    let mut lane = 0;
    let mut work = 0;
    for &d in dims {
        let n = sizes.get(d).copied().ok_or_else(oob)?;
        lane = lane.max(n);
        work = work.max(work_len(n)?);
    }
    Ok((lane, work))
}

/// `_fft_r2c.out(self, dim, normalization, onesided, out)`: the DFT of a real tensor over
/// `dim`, the last of them halved (`n/2 + 1` entries) when `onesided`.
fn fft_r2c(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (dims, last) = fft_dims(&args.int_list(1)?, x.rank())?;
    let normalization = args.int(2)?;
    let onesided = args.bool(3)?;
    let od = args.info(4)?.dtype;
    if !x.dtype.is_float() || !od.is_complex() {
        return Err(KernelError::dtypes(&[x.dtype, od]));
    }
    let points = dims
        .iter()
        .map(|&d| x.sizes.get(d).copied().unwrap_or(1))
        .product();
    let factor = scale(normalization, points)?;
    let mut sizes = x.sizes.clone();
    let n = x.sizes.get(last).copied().ok_or_else(oob)?;
    if onesided {
        *sizes.get_mut(last).ok_or_else(oob)? = n / 2 + 1;
    }
    numel_of(&sizes)?;
    args.resize(4, &sizes)?;
    let total = x.numel();
    let (lane, work) = lane_pieces(&x.sizes, &dims)?;
    let pieces = [
        Scratch::piece::<C>(total),
        Scratch::piece::<C>(lane),
        Scratch::piece::<C>(work),
    ];
    let mut io = Dense::io(args, &[0.into()], &[4.into()], &pieces)?;
    let data = io.scratch.take::<C>(total)?;
    let (lane, work) = (io.scratch.take::<C>(lane)?, io.scratch.take::<C>(work)?);
    crate::dispatch_float!(x.dtype, T => {
        for (d, v) in data.iter_mut().zip(io.input::<T>(0)?) {
            *d = C::new(v.to_f64(), 0.0);
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    for &d in &dims {
        along(data, &x.sizes, d, false, lane, work)?;
    }
    // The kept entries along the last dim, scaled, as parts.
    let kept = *sizes.get(last).ok_or_else(oob)?;
    let (outer, _, inner) = split_at_dim(&x.sizes, last);
    dispatch_parts!(od, P => {
        let out = io.output::<P>(0)?;
        let mut picked = out.chunks_exact_mut(2);
        let mut ok = true;
        let walk = |o: usize, k: usize, i: usize| (o * n + k) * inner + i;
        for o in 0..outer {
            for k in 0..kept {
                for i in 0..inner {
                    match (picked.next(), data.get(walk(o, k, i))) {
                        (Some(pair), Some(v)) => {
                            if let [re, im] = pair {
                                *re = P::from_f64(v.re * factor);
                                *im = P::from_f64(v.im * factor);
                            }
                        }
                        _ => ok = false,
                    }
                }
            }
        }
        if !ok {
            return Err(oob());
        }
    }, return Err(KernelError::dtypes(&[od])));
    io.finish()
}

/// `_fft_c2r.out(self, dim, normalization, last_dim_size, out)`: the inverse DFT over `dim`
/// of a Hermitian-symmetric signal given by its first half along the last of them,
/// `last_dim_size` real points there.
fn fft_c2r(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (dims, last) = fft_dims(&args.int_list(1)?, x.rank())?;
    let normalization = args.int(2)?;
    let n = to_size(args.int(3)?, "last_dim_size")?;
    let od = args.info(4)?.dtype;
    if !x.dtype.is_complex() || od != complex_part(x.dtype) || n == 0 {
        return Err(KernelError::invalid(format!(
            "_fft_c2r takes a complex input, gives its real part type and a positive size: got {}, {od}, {n}",
            x.dtype
        )));
    }
    let mut sizes = x.sizes.clone();
    let m = x.sizes.get(last).copied().ok_or_else(oob)?;
    *sizes.get_mut(last).ok_or_else(oob)? = n;
    numel_of(&sizes)?;
    args.resize(4, &sizes)?;
    let points: usize = dims
        .iter()
        .map(|&d| sizes.get(d).copied().unwrap_or(1))
        .product();
    let factor = scale(normalization, points)?;
    let total = x.numel();
    let mut all: Dims = x.sizes.clone();
    *all.get_mut(last).ok_or_else(oob)? = n.max(m);
    let (lane, work) = lane_pieces(&all, &dims)?;
    let pieces = [
        Scratch::piece::<C>(total),
        Scratch::piece::<C>(lane),
        Scratch::piece::<C>(work),
    ];
    let mut io = Dense::io(args, &[0.into()], &[4.into()], &pieces)?;
    let data = io.scratch.take::<C>(total)?;
    let (lane, work) = (io.scratch.take::<C>(lane)?, io.scratch.take::<C>(work)?);
    dispatch_parts!(x.dtype, P => {
        for (d, pair) in data.iter_mut().zip(io.input::<P>(0)?.chunks_exact(2)) {
            if let [re, im] = pair {
                *d = C::new(re.to_f64(), im.to_f64());
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    // The other dims first, then the last as a complex-to-real transform.
    for &d in dims.iter().filter(|&&d| d != last) {
        along(data, &x.sizes, d, true, lane, work)?;
    }
    let (outer, _, inner) = split_at_dim(&x.sizes, last);
    let lane = lane.get_mut(..n).ok_or_else(oob)?;
    crate::dispatch_float!(od, T => {
        let out = io.output::<T>(0)?;
        for o in 0..outer {
            for i in 0..inner {
                // The full spectrum: the given half, the rest its mirror's conjugate.
                for (k, v) in lane.iter_mut().enumerate() {
                    let half = if k <= n / 2 { k } else { n - k };
                    let given = if half < m {
                        *data.get((o * m + half) * inner + i).ok_or_else(oob)?
                    } else {
                        C::new(0.0, 0.0)
                    };
                    *v = if k <= n / 2 { given } else { given.conj() };
                }
                transform(lane, true, work)?;
                for (k, v) in lane.iter().enumerate() {
                    *out.get_mut((o * n + k) * inner + i).ok_or_else(oob)? = T::from_f64(v.re * factor);
                }
            }
        }
    }, return Err(KernelError::dtypes(&[od])));
    io.finish()
}

/// Registers the complex kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::_conj_physical.out", conj_physical);
    r.register_fn("aten::view_as_real_copy.out", view_as_real);
    r.register_fn("aten::_fft_r2c.out", fft_r2c);
    r.register_fn("aten::_fft_c2r.out", fft_c2r);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dft(x: &[C], inverse: bool) -> Vec<C> {
        let n = x.len();
        let sign = if inverse { 1.0 } else { -1.0 };
        (0..n)
            .map(|k| {
                x.iter()
                    .enumerate()
                    .map(|(j, v)| {
                        let a = sign * 2.0 * std::f64::consts::PI * (j * k % n) as f64 / n as f64;
                        *v * C::from_polar(1.0, a)
                    })
                    .sum()
            })
            .collect()
    }

    #[test]
    fn transforms_of_any_length_match_the_definition() {
        for n in [1, 2, 3, 5, 6, 8, 12, 17, 64, 100] {
            let x: Vec<C> = (0..n)
                .map(|i| C::new((i as f64 * 0.7).sin(), (i as f64 * 1.3).cos()))
                .collect();
            for inverse in [false, true] {
                let mut got = x.clone();
                let mut work = vec![C::new(0.0, 0.0); work_len(n).unwrap()];
                transform(&mut got, inverse, &mut work).unwrap();
                for (a, b) in got.iter().zip(dft(&x, inverse)) {
                    assert!((a - b).norm() < 1e-9 * n as f64, "n={n}: {a} vs {b}");
                }
            }
        }
    }
}
