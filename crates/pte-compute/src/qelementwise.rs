//! Elementwise arithmetic on 8-bit quantized tensors: XNNPACK's fixed-point addition
//! and fp32-requantized multiplication (same shapes, or one operand a row repeated
//! over the other), and the maximum of a pooling window's pixels.

use crate::arch::{multiversion, requantize, Isa};
use crate::error::{self, Result};
use crate::nhwc::Geometry;
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
    /// Output row `oy` of an 8-bit max pooling of image `img` (NHWC, `channels` per
    /// pixel): each pixel's maximum over its window clamped to `bounds`, `empty` for a
    /// window all in the padding. On the best instruction set.
    fn max_pool_row(
        img: &[Self],
        g: &Geometry,
        channels: usize,
        oy: usize,
        out_row: &mut [Self],
        bounds: (Self, Self),
        empty: Self,
    );
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
    fn max_pool_row(
        img: &[i8],
        g: &Geometry,
        channels: usize,
        oy: usize,
        out_row: &mut [i8],
        bounds: (i8, i8),
        empty: i8,
    ) {
        max_pool_row_i8(Isa::best(), img, g, channels, oy, out_row, bounds, empty);
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
    fn max_pool_row(
        img: &[u8],
        g: &Geometry,
        channels: usize,
        oy: usize,
        out_row: &mut [u8],
        bounds: (u8, u8),
        empty: u8,
    ) {
        max_pool_row_u8(Isa::best(), img, g, channels, oy, out_row, bounds, empty);
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

/// Window pixels a max pooling combines per pass (larger windows take several).
const MAX_TAPS: usize = 16;

/// [`QByte::max_pool_row`]'s body: per pixel, its window's pixels listed once, then
/// their channels combined 32, 16 and 8 at a time in registers and the rest one by one
/// (a call per pixel on loops over all its channels took 0.3 ms on shufflenet's 24
/// channels of 56×56, 9× upstream's time; `vpmaxsb` needs SSE4.1 or AVX2, which the
/// baseline target lacks).
#[inline(always)]
fn max_pool_row<T: Copy + Ord>(
    img: &[T],
    g: &Geometry,
    c: usize,
    oy: usize,
    out_row: &mut [T],
    bounds: (T, T),
    empty: T,
) {
    let [kh, kw] = g.kernel;
    let iw = g.input[1];
    let total = kh * kw;
    // Filled in once per row: its slots are overwritten pixel by pixel.
    let mut taps: [&[T]; MAX_TAPS] = [&[]; MAX_TAPS];
    for (ox, out) in out_row.chunks_exact_mut(c.max(1)).enumerate() {
        let (mut held, mut any) = (0, false);
        // Taps row by row: `t / kw` divided per tap (a fifth of the time).
        let window = (0..kh).flat_map(|ky| (0..kw).map(move |kx| (ky, kx)));
        for (t, (ky, kx)) in window.enumerate() {
            if let Some((iy, ix)) = g.source(oy, ox, ky, kx) {
                let p = (iy * iw + ix) * c;
                if let (Some(slot), Some(x)) = (taps.get_mut(held), img.get(p..p + c)) {
                    *slot = x;
                    held += 1;
                }
            }
            if held == MAX_TAPS || (t + 1 == total && held > 0) {
                let list = taps.get(..held).unwrap_or_default();
                let at = max_blocks::<T, 32>(out, 0, list, bounds, any);
                let at = max_blocks::<T, 16>(out, at, list, bounds, any);
                let at = max_blocks::<T, 8>(out, at, list, bounds, any);
                max_blocks::<T, 1>(out, at, list, bounds, any);
                (held, any) = (0, true);
            }
        }
        if !any {
            out.fill(empty);
        }
    }
}

/// `out`'s channels from `c0`, `N` at a time while whole blocks remain: the maximum
/// over `taps` (and `out` itself when `accumulate`), clamped to `(lo, hi)`. Returns
/// where it stopped.
#[inline(always)]
fn max_blocks<T: Copy + Ord, const N: usize>(
    out: &mut [T],
    c0: usize,
    taps: &[&[T]],
    (lo, hi): (T, T),
    accumulate: bool,
) -> usize {
    let Some(&first) = taps.first() else {
        return c0;
    };
    let tail = out.get_mut(c0..).unwrap_or_default();
    let blocks = tail.len() / N;
    for (b, o) in tail.chunks_exact_mut(N).enumerate() {
        let at = c0 + b * N;
        let block = |x: &[T]| x.get(at..at + N).and_then(|x| <[T; N]>::try_from(x).ok());
        let Some(mut acc) = (if accumulate {
            <[T; N]>::try_from(&*o).ok()
        } else {
            block(first)
        }) else {
            continue;
        };
        for x in taps.iter().filter_map(|x| block(x)) {
            for (a, v) in acc.iter_mut().zip(x) {
                *a = (*a).max(v);
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a.max(lo).min(hi);
        }
    }
    c0 + blocks * N
}

multiversion! {
    fn max_pool_row_i8<const FMA: bool>(
        img: &[i8],
        g: &Geometry,
        c: usize,
        oy: usize,
        out_row: &mut [i8],
        bounds: (i8, i8),
        empty: i8,
    ) {
        max_pool_row(img, g, c, oy, out_row, bounds, empty);
    }
}

multiversion! {
    fn max_pool_row_u8<const FMA: bool>(
        img: &[u8],
        g: &Geometry,
        c: usize,
        oy: usize,
        out_row: &mut [u8],
        bounds: (u8, u8),
        empty: u8,
    ) {
        max_pool_row(img, g, c, oy, out_row, bounds, empty);
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
    fn max_pooling_matches_a_direct_loop() {
        use crate::nhwc::max_pool2d_q8;
        let pool = ThreadPool::new(2).unwrap();
        // Channels in blocks of 32 and 1 (70), of 16, 8 and 1 (29); windows of one
        // pass and of two (5×5: more than 16 taps); a window all in the padding.
        for (c, kernel, stride, padding) in [
            (70, [3, 3], [2, 2], [1, 1, 1, 1]),
            (29, [5, 5], [1, 2], [2, 0, 2, 1]),
            (29, [2, 2], [2, 2], [2, 2, 0, 0]),
        ] {
            let g = Geometry {
                input: [7, 6],
                kernel,
                stride,
                dilation: [1, 1],
                padding,
            };
            let [oh, ow] = g.output().unwrap();
            let x: Vec<i8> = (0..2 * 42 * c)
                .map(|i| ((i * 37 + i / 7 * 101) % 256) as u8 as i8)
                .collect();
            let want = |n: usize, oy: usize, ox: usize, ch: usize, lo: i32, hi: i32| {
                let taps = (0..kernel[0] * kernel[1])
                    .filter_map(|t| g.source(oy, ox, t / kernel[1], t % kernel[1]));
                taps.map(|(iy, ix)| i32::from(x[((n * 7 + iy) * 6 + ix) * c + ch]))
                    .max()
                    .map_or(-7, |m| m.clamp(lo, hi))
            };
            let mut y = vec![0i8; 2 * oh * ow * c];
            max_pool2d_q8(&pool, &g, c, 2, &x, &mut y, (-100, 90), -7).unwrap();
            let u: Vec<u8> = x.iter().map(|&v| (i32::from(v) + 128) as u8).collect();
            let mut yu = vec![0u8; y.len()];
            max_pool2d_q8(&pool, &g, c, 2, &u, &mut yu, (3, 250), 121).unwrap();
            for (i, (&got, &got_u)) in y.iter().zip(&yu).enumerate() {
                let (ch, px) = (i % c, i / c);
                let (n, oy, ox) = (px / (oh * ow), px / ow % oh, px % ow);
                assert_eq!(i32::from(got), want(n, oy, ox, ch, -100, 90), "{g:?} {i}");
                let shifted = want(n, oy, ox, ch, 3 - 128, 250 - 128) + 128;
                assert_eq!(i32::from(got_u), shifted, "{g:?} {i} unsigned");
            }
        }
    }
}
