//! Random operators: `rand` (uniform in `[0, 1)`), `randn` (standard normal) and
//! `native_dropout` (each element kept with probability `1 - p`, kept ones scaled by
//! `1 / (1 - p)`, as PyTorch; upstream does not scale).
//!
//! Numbers come from xoshiro256** streams, a fresh one per call, seeded by SplitMix64
//! from a process-wide counter: calls (and call sites) never repeat each other's
//! numbers, and a process makes the same sequence of calls give the same numbers.
//! Uniform floats take as many random bits as their type's precision, so none rounds up
//! to 1; normal ones come from the Box-Muller transform in `f64`.

use std::sync::atomic::{AtomicU64, Ordering};

use pte_runtime::{Args, DType, Dims, KernelError, KernelRegistry, KernelResult};

use crate::layout::Dense;
use crate::num::Elem;
use crate::util::{numel_of, to_size};

/// The next stream's seed.
static SEED: AtomicU64 = AtomicU64::new(0x005e_ed0f_9e37_79b9);

/// SplitMix64, to spread a counter into well-mixed state words.
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256**.
struct Rng([u64; 4]);

impl Rng {
    /// A stream no other call shares.
    fn fresh() -> Self {
        let mut s = SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        Rng([
            splitmix(&mut s),
            splitmix(&mut s),
            splitmix(&mut s),
            splitmix(&mut s),
        ])
    }

    fn next(&mut self) -> u64 {
        let [a, b, c, d] = &mut self.0;
        let out = b.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = *b << 17;
        *c ^= *a;
        *d ^= *b;
        *b ^= *c;
        *a ^= *d;
        *c ^= t;
        *d = d.rotate_left(45);
        out
    }

    /// A uniform value in `[0, 1)` with `bits` random bits.
    fn uniform(&mut self, bits: u32) -> f64 {
        (self.next() >> (64 - bits)) as f64 / (1u64 << bits) as f64
    }
}

/// Random bits a uniform value of `dtype` takes: its significand's precision.
fn precision(dtype: DType) -> KernelResult<u32> {
    match dtype {
        DType::F64 => Ok(53),
        DType::F32 => Ok(24),
        DType::F16 => Ok(11),
        DType::BF16 => Ok(8),
        other => Err(KernelError::dtypes(&[other])),
    }
}

/// `rand.out(size, out)` (`normal` false) and `randn.out(size, out)`.
fn random(args: &mut Args<'_>, normal: bool) -> KernelResult {
    let sizes: Dims = args
        .int_list(0)?
        .iter()
        .map(|&s| to_size(s, "size"))
        .collect::<KernelResult<_>>()?;
    numel_of(&sizes)?;
    args.resize(1, &sizes)?;
    let dtype = args.info(1)?.dtype;
    let bits = precision(dtype)?;
    let mut rng = Rng::fresh();
    let mut draw = || {
        if normal {
            // Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
            let (u1, u2) = (1.0 - rng.uniform(53), rng.uniform(53));
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        } else {
            rng.uniform(bits)
        }
    };
    let mut io = Dense::io(args, &[], &[1.into()], &[])?;
    crate::dispatch_float!(dtype, T => {
        for o in io.output::<T>(0)? {
            *o = T::from_f64(draw());
        }
    }, return Err(KernelError::dtypes(&[dtype])));
    io.finish()
}

/// `native_dropout.out(input, p, train?, out, mask)`: in training (`train` true or
/// None), each element kept with probability `1 - p` and scaled by `1 / (1 - p)`, the
/// others 0, `mask` saying which were kept; otherwise the input and an all-true mask.
fn native_dropout(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let p = args.double(1)?;
    let train = args.opt_bool(2)?.unwrap_or(true);
    if !(0.0..=1.0).contains(&p) {
        return Err(KernelError::invalid(format!(
            "dropout probability must be in [0, 1], got {p}"
        )));
    }
    args.resize(3, &x.sizes)?;
    args.resize(4, &x.sizes)?;
    let (out, mask) = (args.info(3)?.dtype, args.info(4)?.dtype);
    if out != x.dtype {
        return Err(KernelError::dtypes(&[x.dtype, out]));
    }
    let keep = 1.0 - p;
    // PyTorch scales by 0 rather than dividing by zero when everything is dropped.
    let scale = if keep == 0.0 { 0.0 } else { 1.0 / keep };
    let mut rng = Rng::fresh();
    let mut io = Dense::io(args, &[0.into()], &[3.into(), 4.into()], &[])?;
    crate::dispatch_float!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        crate::dispatch_all!(mask, M => {
            let (values, kept) = io.outputs2::<T, M>()?;
            for ((o, k), &v) in values.iter_mut().zip(kept.iter_mut()).zip(src) {
                let keep_it = !train || rng.uniform(53) < keep;
                *k = M::from_i64(i64::from(keep_it));
                *o = match (train, keep_it) {
                    (false, _) => v,
                    (true, true) => T::from_f64(v.to_f64() * scale),
                    (true, false) => T::default(),
                };
            }
        }, return Err(KernelError::dtypes(&[x.dtype, mask])));
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// Registers the random kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::rand.out", |a| random(a, false));
    r.register_fn("aten::randn.out", |a| random(a, true));
    r.register_fn("aten::native_dropout.out", native_dropout);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_and_uniforms_stay_below_one() {
        let (mut a, mut b) = (Rng::fresh(), Rng::fresh());
        assert_ne!(a.next(), b.next());
        let mut r = Rng([u64::MAX; 4]);
        for bits in [8, 11, 24, 53] {
            assert!(r.uniform(bits) < 1.0);
        }
        let n = 100_000;
        let mean = (0..n).map(|_| a.uniform(53)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
    }
}
