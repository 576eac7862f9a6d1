//! Elementwise arithmetic on 8-bit quantized tensors, in XNNPACK's fixed point.

use crate::arch::{multiversion, Isa};
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

    /// `out = x + y` on signed bytes, split over the pool's threads.
    pub fn run_i8(&self, pool: &ThreadPool, x: &[i8], y: &[i8], out: &mut [i8]) -> Result {
        let n = out.len();
        error::need("quantized addition operand", x.len().min(y.len()), n)?;
        pool.parallel_chunks(out, CHUNK, &mut [0u8; 0], 0, |k, o, _| {
            let at = k * CHUNK;
            let (x, y) = (
                x.get(at..).unwrap_or_default(),
                y.get(at..).unwrap_or_default(),
            );
            add_i8(Isa::best(), *self, x, y, o);
        })
    }

    /// `out = x + y` on unsigned bytes, split over the pool's threads.
    pub fn run_u8(&self, pool: &ThreadPool, x: &[u8], y: &[u8], out: &mut [u8]) -> Result {
        let n = out.len();
        error::need("quantized addition operand", x.len().min(y.len()), n)?;
        pool.parallel_chunks(out, CHUNK, &mut [0u8; 0], 0, |k, o, _| {
            let at = k * CHUNK;
            let (x, y) = (
                x.get(at..).unwrap_or_default(),
                y.get(at..).unwrap_or_default(),
            );
            add_u8(Isa::best(), *self, x, y, o);
        })
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
    fn add_u8<const FMA: bool>(q: QAdd, x: &[u8], y: &[u8], out: &mut [u8]) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = q.apply(i32::from(a), i32::from(b), (0, 255)) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            q.run_u8(&pool, &x, &y, &mut out).unwrap();
            let mut signed = vec![0i8; n];
            let (xs, ys): (Vec<i8>, Vec<i8>) =
                x.iter().zip(&y).map(|(&a, &b)| (a as i8, b as i8)).unzip();
            q.run_i8(&pool, &xs, &ys, &mut signed).unwrap();
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
            assert!(q.run_u8(&pool, &x[..10], &y, &mut out).is_err());
        }
    }
}
