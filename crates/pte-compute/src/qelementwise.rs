//! Elementwise arithmetic on 8-bit quantized tensors: XNNPACK's fixed-point addition
//! and fp32-requantized multiplication (same shapes, or one operand a row repeated
//! over the other), and the maximum of a pooling window's pixels.

use crate::arch::{multiversion, requantize, Isa};
use crate::error::{self, Result};
use crate::pool::ThreadPool;

/// Elements per task of a threaded call.
const CHUNK: usize = 16 * 1024;

/// XNNPACK's quantized addition of two same-shape operands: `((bias + a ·
/// a_multiplier + b · b_multiplier) >> shift) + zero`, the sum wrapping in 32 bits,
/// the shift arithmetic, then clamped to the output type and to `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QAdd {
    pub bias: i32,
    pub a_multiplier: i32,
    pub b_multiplier: i32,
    /// Below 32.
    pub shift: u32,
    pub zero: i32,
    pub min: i32,
    pub max: i32,
}

impl QAdd {
    /// One element, clamped to `lo..=hi` (the type's range) and the bounds.
    #[inline(always)]
    fn apply(&self, a: i32, b: i32, (lo, hi): (i32, i32)) -> i32 {
        let acc = self
            .bias
            .wrapping_add(a.wrapping_mul(self.a_multiplier))
            .wrapping_add(b.wrapping_mul(self.b_multiplier));
        let v = (acc >> (self.shift & 31)).wrapping_add(self.zero);
        v.max(lo).max(self.min).min(hi).min(self.max)
    }

    /// `out = x + y` on bytes (signed or unsigned), split over the pool's threads.
    pub fn run<T: QByte>(&self, pool: &ThreadPool, x: &[T], y: &[T], out: &mut [T]) -> Result {
        by_chunks(pool, x, y, out, |x, y, o| T::add(*self, x, y, o))
    }

    /// The same addition with the operands' roles exchanged.
    pub fn swapped(self) -> QAdd {
        QAdd {
            a_multiplier: self.b_multiplier,
            b_multiplier: self.a_multiplier,
            ..self
        }
    }

    /// `out = x + row` with `row` repeated over `x`'s rows of `row.len()` elements (the
    /// row is the operand b), split over the pool's threads.
    pub fn run_rows<T: QByte>(
        &self,
        pool: &ThreadPool,
        x: &[T],
        row: &[T],
        out: &mut [T],
    ) -> Result {
        by_rows(pool, x, row, out, |x, row, o| T::add(*self, x, row, o))
    }
}

/// XNNPACK's quantized multiplication: `(a - a_zero) · (b - b_zero)` requantized in
/// fp32 by `scale` (the operands' scales over the output's), rounded half to even,
/// plus `zero`, clamped to `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QMul {
    pub a_zero: i32,
    pub b_zero: i32,
    pub scale: f32,
    pub zero: i32,
    pub min: i32,
    pub max: i32,
}

impl QMul {
    /// One element (the bounds within the type's range).
    #[inline(always)]
    pub fn apply(&self, a: i32, b: i32) -> i32 {
        let bounds = ((self.min - self.zero) as f32, (self.max - self.zero) as f32);
        requantize(
            (a - self.a_zero) * (b - self.b_zero),
            self.scale,
            bounds,
            self.zero,
        )
    }

    /// The same multiplication with the operands' roles exchanged.
    pub fn swapped(self) -> QMul {
        QMul {
            a_zero: self.b_zero,
            b_zero: self.a_zero,
            ..self
        }
    }

    /// `out = x · y` on same-shape bytes, split over the pool's threads.
    pub fn run<T: QByte>(&self, pool: &ThreadPool, x: &[T], y: &[T], out: &mut [T]) -> Result {
        by_chunks(pool, x, y, out, |x, y, o| T::mul(*self, x, y, o))
    }

    /// `out = x · row` with `row` repeated over `x`'s rows (a squeeze-excitation gate
    /// on NHWC pixels), split over the pool's threads.
    pub fn run_rows<T: QByte>(
        &self,
        pool: &ThreadPool,
        x: &[T],
        row: &[T],
        out: &mut [T],
    ) -> Result {
        by_rows(pool, x, row, out, |x, row, o| T::mul(*self, x, row, o))
    }
}

/// `f(x, y, out)` over same-shape chunks of [`CHUNK`] elements, one per task.
fn by_chunks<T: Copy + Send + Sync>(
    pool: &ThreadPool,
    x: &[T],
    y: &[T],
    out: &mut [T],
    f: impl Fn(&[T], &[T], &mut [T]) + Sync,
) -> Result {
    error::need("quantized operand", x.len().min(y.len()), out.len())?;
    pool.parallel_chunks(out, CHUNK, &mut [0u8; 0], 0, |k, o, _| {
        let at = k * CHUNK;
        f(
            x.get(at..).unwrap_or_default(),
            y.get(at..).unwrap_or_default(),
            o,
        );
    })
}

/// `f(x_row, row, out_row)` for every row of `row.len()` elements, whole rows per task.
fn by_rows<T: Copy + Send + Sync>(
    pool: &ThreadPool,
    x: &[T],
    row: &[T],
    out: &mut [T],
    f: impl Fn(&[T], &[T], &mut [T]) + Sync,
) -> Result {
    let (n, w) = (out.len(), row.len());
    error::need("quantized operand", x.len(), n)?;
    if w == 0 || !n.is_multiple_of(w) {
        return Err(error::Error::InvalidParameter {
            what: format!("{n} elements are not rows of {w}"),
        });
    }
    let chunk = (CHUNK / w).max(1) * w;
    pool.parallel_chunks(out, chunk, &mut [0u8; 0], 0, |k, o, _| {
        let x = x.get(k * chunk..).unwrap_or_default();
        for (o, x) in o.chunks_mut(w).zip(x.chunks(w)) {
            f(x, row, o);
        }
    })
}

/// An 8-bit quantized element: `i8` or `u8`.
pub trait QByte: Copy + Send + Sync + sealed::Sealed {
    /// [`QAdd`] over one chunk, on the best instruction set.
    fn add(q: QAdd, x: &[Self], y: &[Self], out: &mut [Self]);
    /// [`QMul`] over one chunk, on the best instruction set.
    fn mul(q: QMul, x: &[Self], y: &[Self], out: &mut [Self]);
    /// [`max_pixel`] on the best instruction set.
    fn max(taps: &[&[Self]], out: &mut [Self], bounds: (Self, Self), accumulate: bool);
    /// `out = clamp(round(x · inv_scale), lo, hi) + zero` (`lo`, `hi`: the type's range
    /// less `zero`), ties to even; NaN becomes the type's lowest value, as XNNPACK's
    /// max and min give. On the best instruction set.
    fn quantize(x: &[f32], out: &mut [Self], inv_scale: f32, zero: i32);
    /// `out = (x - zero) · scale`, on the best instruction set.
    fn dequantize(x: &[Self], out: &mut [f32], scale: f32, zero: i32);
    /// `sums[j] += row[j]` for each row of `x` (`stride` values apart, the last one
    /// possibly shorter), wrapping: column sums of a mean, on the best instruction set.
    fn column_sums(sums: &mut [i32], x: &[Self], stride: usize);
}

/// One value of [`QByte::quantize`], before the zero point: `lo`, `hi` bound it.
#[inline(always)]
fn quantized(v: f32, inv_scale: f32, (lo, hi): (f32, f32)) -> i32 {
    crate::arch::round_small((v * inv_scale).max(lo).min(hi))
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i8 {}
    impl Sealed for u8 {}
}

impl QByte for i8 {
    fn add(q: QAdd, x: &[i8], y: &[i8], out: &mut [i8]) {
        add_i8(Isa::best(), q, x, y, out);
    }
    fn mul(q: QMul, x: &[i8], y: &[i8], out: &mut [i8]) {
        mul_i8(Isa::best(), q, x, y, out);
    }
    fn max(taps: &[&[i8]], out: &mut [i8], (lo, hi): (i8, i8), accumulate: bool) {
        max_taps_i8(Isa::best(), taps, out, lo, hi, accumulate);
    }
    fn quantize(x: &[f32], out: &mut [i8], inv_scale: f32, zero: i32) {
        let bounds = ((-128 - zero) as f32, (127 - zero) as f32);
        quantize_i8(Isa::best(), x, out, inv_scale, bounds, zero);
    }
    fn dequantize(x: &[i8], out: &mut [f32], scale: f32, zero: i32) {
        dequantize_i8(Isa::best(), x, out, scale, zero);
    }
    fn column_sums(sums: &mut [i32], x: &[i8], stride: usize) {
        column_sums_i8(Isa::best(), sums, x, stride);
    }
}

impl QByte for u8 {
    fn add(q: QAdd, x: &[u8], y: &[u8], out: &mut [u8]) {
        add_u8(Isa::best(), q, x, y, out);
    }
    fn mul(q: QMul, x: &[u8], y: &[u8], out: &mut [u8]) {
        mul_u8(Isa::best(), q, x, y, out);
    }
    fn max(taps: &[&[u8]], out: &mut [u8], (lo, hi): (u8, u8), accumulate: bool) {
        max_taps_u8(Isa::best(), taps, out, lo, hi, accumulate);
    }
    fn quantize(x: &[f32], out: &mut [u8], inv_scale: f32, zero: i32) {
        let bounds = ((0 - zero) as f32, (255 - zero) as f32);
        quantize_u8(Isa::best(), x, out, inv_scale, bounds, zero);
    }
    fn dequantize(x: &[u8], out: &mut [f32], scale: f32, zero: i32) {
        dequantize_u8(Isa::best(), x, out, scale, zero);
    }
    fn column_sums(sums: &mut [i32], x: &[u8], stride: usize) {
        column_sums_u8(Isa::best(), sums, x, stride);
    }
}

multiversion! {
    fn column_sums_i8<const FMA: bool>(sums: &mut [i32], x: &[i8], stride: usize) {
        for row in x.chunks(stride.max(1)) {
            for (s, &v) in sums.iter_mut().zip(row) {
                *s = s.wrapping_add(i32::from(v));
            }
        }
    }
}

multiversion! {
    fn column_sums_u8<const FMA: bool>(sums: &mut [i32], x: &[u8], stride: usize) {
        for row in x.chunks(stride.max(1)) {
            for (s, &v) in sums.iter_mut().zip(row) {
                *s = s.wrapping_add(i32::from(v));
            }
        }
    }
}

multiversion! {
    fn quantize_i8<const FMA: bool>(x: &[f32], out: &mut [i8], inv_scale: f32, bounds: (f32, f32), zero: i32) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (quantized(v, inv_scale, bounds) + zero) as i8;
        }
    }
}

multiversion! {
    fn quantize_u8<const FMA: bool>(x: &[f32], out: &mut [u8], inv_scale: f32, bounds: (f32, f32), zero: i32) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (quantized(v, inv_scale, bounds) + zero) as u8;
        }
    }
}

multiversion! {
    fn dequantize_i8<const FMA: bool>(x: &[i8], out: &mut [f32], scale: f32, zero: i32) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (i32::from(v) - zero) as f32 * scale;
        }
    }
}

multiversion! {
    fn dequantize_u8<const FMA: bool>(x: &[u8], out: &mut [f32], scale: f32, zero: i32) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (i32::from(v) - zero) as f32 * scale;
        }
    }
}

multiversion! {
    fn add_i8<const FMA: bool>(q: QAdd, x: &[i8], y: &[i8], out: &mut [i8]) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = q.apply(i32::from(a), i32::from(b), (-128, 127)) as i8;
        }
    }
}

multiversion! {
    fn mul_i8<const FMA: bool>(q: QMul, x: &[i8], y: &[i8], out: &mut [i8]) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = q.apply(i32::from(a), i32::from(b)).clamp(-128, 127) as i8;
        }
    }
}

multiversion! {
    fn mul_u8<const FMA: bool>(q: QMul, x: &[u8], y: &[u8], out: &mut [u8]) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = q.apply(i32::from(a), i32::from(b)).clamp(0, 255) as u8;
        }
    }
}

multiversion! {
    fn add_u8<const FMA: bool>(q: QAdd, x: &[u8], y: &[u8], out: &mut [u8]) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = q.apply(i32::from(a), i32::from(b), (0, 255)) as u8;
        }
    }
}

/// Max pooling of one output pixel: `out[j] = clamp(max_t taps[t][j], lo, hi)`, the
/// maximum also over `out`'s own values when `accumulate` (a window of more taps than
/// one call takes). `out` is left as it is when `taps` is empty and not accumulating.
pub fn max_pixel<T: QByte>(taps: &[&[T]], out: &mut [T], bounds: (T, T), accumulate: bool) {
    T::max(taps, out, bounds, accumulate);
}

/// [`max_pixel`]'s body: tap by tap over the whole pixel, loops that vectorize (`vpmaxsb`
/// needs SSE4.1 or AVX2, which the baseline target lacks).
#[inline(always)]
fn max_taps<T: Copy + Ord>(taps: &[&[T]], out: &mut [T], lo: T, hi: T, accumulate: bool) {
    let rest = match (accumulate, taps.split_first()) {
        (false, Some((first, rest))) => {
            for (o, &v) in out.iter_mut().zip(*first) {
                *o = v;
            }
            rest
        }
        (false, None) => return,
        (true, _) => taps,
    };
    for tap in rest {
        for (o, &v) in out.iter_mut().zip(*tap) {
            *o = (*o).max(v);
        }
    }
    for o in out.iter_mut() {
        *o = (*o).max(lo).min(hi);
    }
}

multiversion! {
    fn max_taps_i8<const FMA: bool>(taps: &[&[i8]], out: &mut [i8], lo: i8, hi: i8, accumulate: bool) {
        max_taps(taps, out, lo, hi, accumulate);
    }
}

multiversion! {
    fn max_taps_u8<const FMA: bool>(taps: &[&[u8]], out: &mut [u8], lo: u8, hi: u8, accumulate: bool) {
        max_taps(taps, out, lo, hi, accumulate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_ties_to_even_and_saturate() {
        // Enough values for the vector loops and a remainder.
        let base = [
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            200.0,
            -200.0,
            f32::NAN,
            f32::INFINITY,
            -1e9,
        ];
        let x: Vec<f32> = base.iter().cycle().take(37).copied().collect();
        let mut q = vec![0i8; x.len()];
        i8::quantize(&x, &mut q, 1.0, 10);
        let want = [10, 12, 12, 10, 8, 127, -128, -128, 127, -128];
        for (i, (&v, &w)) in q.iter().zip(want.iter().cycle()).enumerate() {
            assert_eq!(v, w, "i8 value {i}: {}", x[i]);
        }
        let mut u = vec![0u8; x.len()];
        u8::quantize(&x, &mut u, 2.0, 128);
        let want = [129, 131, 133, 127, 123, 255, 0, 0, 255, 0];
        for (i, (&v, &w)) in u.iter().zip(want.iter().cycle()).enumerate() {
            assert_eq!(v, w, "u8 value {i}: {}", x[i]);
        }
        let mut f = vec![0f32; x.len()];
        i8::dequantize(&q, &mut f, 0.25, 10);
        for (i, (&v, &b)) in f.iter().zip(&q).enumerate() {
            assert_eq!(v, (f32::from(b) - 10.0) * 0.25, "i8 value {i}");
        }
        u8::dequantize(&u, &mut f, 0.5, 128);
        for (i, (&v, &b)) in f.iter().zip(&u).enumerate() {
            assert_eq!(v, (f32::from(b) - 128.0) * 0.5, "u8 value {i}");
        }
    }

    #[test]
    fn additions_match_the_scalar_definition_on_every_thread_count() {
        let q = QAdd {
            bias: (1 << 19) - 3 * 700_000 + 11 * 300_000,
            a_multiplier: 700_000,
            b_multiplier: -300_000,
            shift: 20,
            zero: 5,
            min: -100,
            max: 90,
        };
        let n = 40_000;
        let x: Vec<u8> = (0..n).map(|i| (i * 37 % 251) as u8).collect();
        let y: Vec<u8> = (0..n).map(|i| (i * 91 % 241) as u8).collect();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            let mut out = vec![0u8; n];
            q.run(&pool, &x, &y, &mut out).unwrap();
            let mut signed = vec![0i8; n];
            let (xs, ys): (Vec<i8>, Vec<i8>) =
                x.iter().zip(&y).map(|(&a, &b)| (a as i8, b as i8)).unzip();
            q.run(&pool, &xs, &ys, &mut signed).unwrap();
            for i in 0..n {
                let want = |a: i32, b: i32, lo: i32, hi: i32| {
                    let acc = q.bias + a * q.a_multiplier + b * q.b_multiplier;
                    ((acc >> q.shift) + q.zero)
                        .clamp(lo, hi)
                        .clamp(q.min, q.max)
                };
                let u = want(i32::from(x[i]), i32::from(y[i]), 0, 255);
                assert_eq!(i32::from(out[i]), u, "u8 element {i}");
                let s = want(i32::from(xs[i]), i32::from(ys[i]), -128, 127);
                assert_eq!(i32::from(signed[i]), s, "i8 element {i}");
            }
            assert!(q.run(&pool, &x[..10], &y, &mut out).is_err());
        }
    }

    #[test]
    fn multiplications_match_the_float_definition_same_shape_and_by_rows() {
        let q = QMul {
            a_zero: -7,
            b_zero: 12,
            scale: 0.0123,
            zero: -3,
            min: -120,
            max: 100,
        };
        // XNNPACK's definition: the product in int32, times the scale in f32, rounded
        // half to even after clamping, plus the zero point.
        let want = |a: i32, b: i32, q: QMul| {
            let v = ((a - q.a_zero) * (b - q.b_zero)) as f32 * q.scale;
            let lo = (q.min - q.zero) as f32;
            let hi = (q.max - q.zero) as f32;
            v.clamp(lo, hi).round_ties_even() as i32 + q.zero
        };
        let (rows, w) = (1500, 40);
        let n = rows * w;
        let x: Vec<i8> = (0..n).map(|i| (i * 37 % 251) as u8 as i8).collect();
        let y: Vec<i8> = (0..n).map(|i| (i * 91 % 241) as u8 as i8).collect();
        let row = &y[..w];
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            let mut out = vec![0i8; n];
            q.run(&pool, &x, &y, &mut out).unwrap();
            for i in 0..n {
                let e = want(i32::from(x[i]), i32::from(y[i]), q);
                assert_eq!(i32::from(out[i]), e, "element {i}");
            }
            // The row as operand b, then as operand a (the swapped multiplication).
            q.run_rows(&pool, &x, row, &mut out).unwrap();
            let mut swapped = vec![0i8; n];
            q.swapped().run_rows(&pool, &x, row, &mut swapped).unwrap();
            for i in 0..n {
                let (a, b) = (i32::from(x[i]), i32::from(row[i % w]));
                assert_eq!(i32::from(out[i]), want(a, b, q), "row element {i}");
                assert_eq!(i32::from(swapped[i]), want(b, a, q), "swapped {i}");
            }
            let u: Vec<u8> = x.iter().map(|&v| v as u8).collect();
            let ur: Vec<u8> = row.iter().map(|&v| v as u8).collect();
            let qu = QMul {
                min: 3,
                max: 250,
                zero: 128,
                ..q
            };
            let mut out_u = vec![0u8; n];
            qu.run_rows(&pool, &u, &ur, &mut out_u).unwrap();
            for i in 0..n {
                let e = want(i32::from(u[i]), i32::from(ur[i % w]), qu);
                assert_eq!(i32::from(out_u[i]), e.clamp(0, 255), "u8 element {i}");
            }
            assert!(q.run_rows(&pool, &x[..n - 1], row, &mut out).is_err());
            assert!(q.run_rows(&pool, &x, &y[..w + 1], &mut out).is_err());
        }
    }

    #[test]
    fn additions_by_rows_repeat_the_row() {
        let q = QAdd {
            bias: 1 << 19,
            a_multiplier: 700_000,
            b_multiplier: 300_000,
            shift: 20,
            zero: 5,
            min: -128,
            max: 127,
        };
        let (rows, w) = (700, 48);
        let x: Vec<i8> = (0..rows * w).map(|i| (i * 37 % 251) as u8 as i8).collect();
        let row: Vec<i8> = (0..w).map(|i| (i * 91 % 241) as u8 as i8).collect();
        let tiled: Vec<i8> = (0..rows * w).map(|i| row[i % w]).collect();
        let pool = ThreadPool::new(2).unwrap();
        let (mut by_rows, mut full) = (vec![0i8; rows * w], vec![0i8; rows * w]);
        q.run_rows(&pool, &x, &row, &mut by_rows).unwrap();
        q.run(&pool, &x, &tiled, &mut full).unwrap();
        assert_eq!(by_rows, full);
    }

    #[test]
    fn window_maxima_are_clamped_and_accumulate() {
        let taps: Vec<Vec<i8>> = (0..5)
            .map(|t| {
                (0..70)
                    .map(|j| ((j * 37 + t * 101) % 256) as u8 as i8)
                    .collect()
            })
            .collect();
        let refs: Vec<&[i8]> = taps.iter().map(Vec::as_slice).collect();
        let want: Vec<i8> = (0..70)
            .map(|j| refs.iter().map(|t| t[j]).max().unwrap().clamp(-100, 90))
            .collect();
        let mut out = vec![0i8; 70];
        max_pixel(&refs, &mut out, (-100, 90), false);
        assert_eq!(out, want);
        // Two calls, the second accumulating.
        let mut split = vec![0i8; 70];
        max_pixel(&refs[..2], &mut split, (-128, 127), false);
        max_pixel(&refs[2..], &mut split, (-100, 90), true);
        assert_eq!(split, want);
        let unsigned: Vec<Vec<u8>> = taps
            .iter()
            .map(|t| t.iter().map(|&v| v as u8).collect())
            .collect();
        let urefs: Vec<&[u8]> = unsigned.iter().map(Vec::as_slice).collect();
        let mut out = vec![0u8; 70];
        max_pixel(&urefs, &mut out, (3, 250), false);
        for (j, &o) in out.iter().enumerate() {
            assert_eq!(o, urefs.iter().map(|t| t[j]).max().unwrap().clamp(3, 250));
        }
    }
}
