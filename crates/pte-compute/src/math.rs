//! Branch-free scalar approximations of `exp`, `tanh`, `erfc` and the activations built
//! on them, written so that a loop over a slice vectorizes (selects instead of
//! branches, integer bit tricks instead of library calls). `FMA` tells whether
//! `mul_add` is a fast instruction in the calling function ([`crate::arch::madd`]).
//!
//! Accuracy, measured against f64 in this module's tests over dense grids:
//! - `exp`: at most 2 ulp for results above `f32::MIN_POSITIVE`; results that would be
//!   subnormal flush to 0, overflow gives +inf, NaN stays NaN.
//! - `sigmoid`, `silu`, `tanh`: at most 4 ulp (relative 5e-7) where the result is
//!   normal (measured: 2.9, 3.1 and 2.5); below x = -88.4 sigmoid and silu are
//!   (signed) 0, e^-x having overflowed. Sigmoid, SiLU and softmax take a degree-5
//!   exponential with fewer instructions than `exp`'s: they are bound by their
//!   instruction count.
//! - `gelu` (erf form): absolute error at most 2.5e-7 · |x| (relative 4e-7 for x >= 0),
//!   the class of eager PyTorch's float32 kernel, which also rounds 1 + erf;
//!   `gelu_tanh`: relative 5e-6 for x >= -5 (the f32 rounding of its inner
//!   polynomial, amplified by the slope of the sigmoid).

// The constants are the published coefficients (or our fit's), kept digit for digit.
#![allow(clippy::excessive_precision)]

use crate::arch::{madd, Lanes, Scalar};

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part exact in few bits and the rest (Cody and Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds a float of magnitude below 2^22 to an integer, which
/// then sits in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;
const EXP_MAX: f32 = 88.722_83;
const EXP_MIN: f32 = -87.336_55;

/// e^x for x in `EXP_MIN..=EXP_MAX` (outside it the result is meaningless): the
/// reduction x = n·ln 2 + r ([`reduce`]), a degree-6 polynomial for e^r evaluated in
/// Estrin's scheme (a shorter chain of dependent instructions than Horner's, which is
/// what bounds a vectorized loop of it), and n as the returned integer exponent, in
/// -126..=128.
#[inline(always)]
fn exp_reduced<const FMA: bool>(x: f32) -> (f32, i32) {
    let (r, ni) = reduce::<FMA>(x);
    (expm1_poly::<FMA>(r) + 1.0, ni)
}

/// `(r, n)` with x = n·ln 2 + r, n = round(x / ln 2), |r| <= ln 2 / 2 (Cody and
/// Waite's two-part ln 2).
#[inline(always)]
fn reduce<const FMA: bool>(x: f32) -> (f32, i32) {
    let t = madd::<FMA>(x, LOG2E, ROUND);
    let n = t - ROUND;
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    (madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, x)), ni)
}

/// e^r - 1 for the reduced argument: r + r²·(c2 + c3·r + (c4 + c5·r)·r² + c6·r⁴).
#[inline(always)]
fn expm1_poly<const FMA: bool>(r: f32) -> f32 {
    let r2 = r * r;
    let lo = madd::<FMA>(1.666_666_5e-1, r, 5.000_000_1e-1);
    let mid = madd::<FMA>(8.333_452e-3, r, 4.166_579_6e-2);
    let hi = madd::<FMA>(1.987_569_1e-4, r, 1.398_199_9e-3);
    let p = madd::<FMA>(madd::<FMA>(hi, r2, mid), r2, lo);
    madd::<FMA>(p, r2, r)
}

/// e^x - 1 for x <= 0 (clamped to `EXP_MIN`; NaN stays NaN) as 2^n·(e^r - 1) + (2^n - 1):
/// near 0 (n = 0) it is the polynomial's own r + r²·…, with the relative accuracy
/// that e^x - 1 formed by a subtraction would lose.
#[inline(always)]
fn expm1_nonpositive<const FMA: bool>(x: f32) -> f32 {
    let (r, ni) = reduce::<FMA>(x.clamp(EXP_MIN, 0.0));
    let s = pow2(ni);
    madd::<FMA>(s, expm1_poly::<FMA>(r), s - 1.0)
}

/// 2^n for n in -126..=127 (a wrapping exponent field for other n).
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// e^x.
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    let (y, ni) = exp_reduced::<FMA>(x.clamp(EXP_MIN, EXP_MAX));
    // 2^n for n = 128 does not fit an exponent: use 2^127 · 2.
    let big = ni > 127;
    let y = if big { y * 2.0 } else { y } * pow2(ni - i32::from(big));
    if x > EXP_MAX {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// Coefficients of e^r ≈ 1 + r + r²·(c2 + c3·r + c4·r² + c5·r³) on |r| <= ln 2 / 2,
/// relative error 1.1e-7: one degree less than [`exp`]'s polynomial, for the
/// exponentials of sigmoid, SiLU and softmax, which are bound by their instruction
/// count (fitted by `tools/fit_exp_poly.py`, weighted least squares towards minimax).
const EXP5: [f32; 4] = [0.499_992_31, 0.166_671_14, 0.041_890_122, 0.008_312_531];

/// e^x by the degree-5 polynomial for x in -88..=89 (and NaN, which propagates
/// through the arithmetic), with 2^n made from the bits of the rounding (no integer
/// subtraction) and applied in the polynomial's last step (s + s·p). Where n = -127
/// (x below -87.98) the result is 0; where n = 128 (x above 88.38) it is +inf.
/// Written once for any [`Lanes`]: the plain loops vectorize the [`Scalar`] one.
#[inline(always)]
fn exp5<L: Lanes>(l: L, x: L::V) -> L::V {
    let t = l.mul_add(x, LOG2E, l.splat(ROUND));
    let n = l.sub(t, l.splat(ROUND));
    let s = l.pow2_of_rounded(t);
    let r = l.mul_add(n, -LN2_LO, l.mul_add(n, -LN2_HI, x));
    let r2 = l.mul(r, r);
    let q = l.fma(
        l.mul_add(r, EXP5[3], l.splat(EXP5[2])),
        r2,
        l.mul_add(r, EXP5[1], l.splat(EXP5[0])),
    );
    l.fma(s, l.fma(q, r2, r), s)
}

/// e^x for x <= 0 (and NaN) in fewer instructions than [`exp`] ([`exp5`]); below
/// `EXP_MIN` the result flushes to 0 as `exp`'s does.
#[inline(always)]
pub(crate) fn exp_nonpositive<const FMA: bool>(x: f32) -> f32 {
    let y = exp5(Scalar::<FMA>, x);
    if x < EXP_MIN {
        0.0
    } else {
        y
    }
}

/// e^-x for sigmoid and SiLU: -x clamped into the range of [`exp5`] (NaN passes), so
/// that it is 0 for x above 88 and +inf for x below -88.4.
#[inline(always)]
fn exp_neg_clamped<L: Lanes>(l: L, x: L::V) -> L::V {
    exp5(l, l.clamp(l.neg(x), -88.0, 89.0))
}

/// 1 / (1 + e^-x). e^-x overflows to +inf below x = -88.4, where the result is 0
/// (the true one is below the normal range there).
#[inline(always)]
pub(crate) fn sigmoid<L: Lanes>(l: L, x: L::V) -> L::V {
    let one = l.splat(1.0);
    l.div(one, l.add(one, exp_neg_clamped(l, x)))
}

/// x / (1 + e^-x): x · sigmoid(x) with x as the numerator. Below x = -88.4 the result
/// is -0, and -inf gives NaN (-inf / inf) as PyTorch's -inf · 0.
#[inline(always)]
pub(crate) fn silu<L: Lanes>(l: L, x: L::V) -> L::V {
    l.div(x, l.add(l.splat(1.0), exp_neg_clamped(l, x)))
}

/// tanh(x) = -m / (2 + m) for m = e^-2|x| - 1 ([`expm1_nonpositive`]), with the
/// sign of x: one exponential and one division, both without cancellation (m keeps
/// its relative accuracy near 0, 2 + m lies in 1..=2), and no branch. A Taylor
/// polynomial below |x| = 0.55 and 1 - 2 / (e^2|x| + 1) above took 1.65 ns a value
/// on the Zen 4 VM of the benchmarks (vectorized for AVX2), this 0.66 ns; its error is
/// at most 2.5 ulp where the other's was 1.4.
#[inline(always)]
pub(crate) fn tanh<const FMA: bool>(x: f32) -> f32 {
    let m = expm1_nonpositive::<FMA>(-2.0 * x.abs());
    (-m / (2.0 + m)).copysign(x)
}

/// |x| from which erf(x/√2) rounds to ±1 in float32 (1 - erf(5.6/√2) = 2.1e-8).
const GELU_CLAMP: f32 = 5.6;
/// erf(x/√2) ≈ x · P(x²) / Q(x²) on |x| <= `GELU_CLAMP`, absolute error 3.2e-7 in
/// float32 (fitted by `tools/fit_gelu_rational.py`, near-minimax). Coefficients from
/// the constant term up; Q's constant is 1.
const GELU_P: [f32; 6] = [
    0.797_884_46,
    0.068_752_177,
    0.009_414_515_5,
    0.000_347_701_02,
    1.271_305_1e-5,
    4.429_051_6e-8,
];
const GELU_Q: [f32; 5] = [
    0.252_833_78,
    0.028_940_076,
    0.001_912_976_7,
    7.510_183_8e-5,
    1.180_210_2e-6,
];

/// GELU, erf form: x/2 · (1 + erf(x/√2)) as eager PyTorch's float32 kernel forms it
/// (so +inf gives +inf, -inf NaN, and the largest floats do not overflow), with erf
/// from one rational function: about 20 instructions where an erfc with an
/// exponential took 50. Like PyTorch's, the error is absolute: at most 2.5e-7 · |x|
/// (relative 4e-7 for x >= 0); the negative tail, where the result is far below
/// that, is not resolved relatively.
#[inline(always)]
pub(crate) fn gelu<const FMA: bool>(x: f32) -> f32 {
    let u = x * x;
    let mut p = GELU_P[5];
    for &c in GELU_P[..5].iter().rev() {
        p = madd::<FMA>(p, u, c);
    }
    let mut q = GELU_Q[4];
    for &c in GELU_Q[..4].iter().rev() {
        q = madd::<FMA>(q, u, c);
    }
    q = madd::<FMA>(q, u, 1.0);
    // 1 + erf(x/√2); beyond the clamp (and for NaN, which the product below keeps)
    // exactly 2 or 0.
    let phi2 = if x.abs() < GELU_CLAMP {
        madd::<FMA>(x, p / q, 1.0)
    } else {
        1.0 + 1f32.copysign(x)
    };
    x * 0.5 * phi2
}

/// GELU, tanh form: x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))), computed as
/// x · sigmoid(2u) to avoid the cancellation of 1 + tanh for negative x.
#[inline(always)]
pub(crate) fn gelu_tanh<const FMA: bool>(x: f32) -> f32 {
    const K: f32 = 0.797_884_6;
    let u = K * madd::<FMA>(0.044_715 * x * x, x, x);
    x * sigmoid(Scalar::<FMA>, 2.0 * u)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Max error in ulp of `f` against `r` over `xs`, for results at least `floor`.
    fn max_ulp(
        xs: impl Iterator<Item = f32>,
        f: impl Fn(f32) -> f32,
        r: impl Fn(f64) -> f64,
        floor: f64,
    ) -> f64 {
        let mut worst = 0.0f64;
        for x in xs {
            let want = r(f64::from(x));
            if want.abs() < floor || !want.is_finite() {
                continue;
            }
            let ulp = f64::from(f32::EPSILON) * 2f64.powi((want.abs().log2().floor()) as i32);
            let got = f64::from(f(x));
            worst = worst.max((got - want).abs() / ulp);
        }
        worst
    }

    fn grid(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * (i as f32 / n as f32))
    }

    fn erf(x: f64) -> f64 {
        // Abramowitz-Stegun style series / continued fraction in f64 is not in std;
        // integrate the series, accurate to 1e-15 for |x| < 3, and use the asymptotic
        // complement beyond.
        if x.abs() < 3.0 {
            let mut term = x;
            let mut sum = x;
            let x2 = x * x;
            for n in 1..200 {
                term *= -x2 / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            x.signum() * (1.0 - erfc_big(x.abs()))
        }
    }

    /// erfc(x) for x >= 3 by its continued fraction.
    fn erfc_big(x: f64) -> f64 {
        let mut f = 0.0;
        for n in (1..200).rev() {
            f = (n as f64 / 2.0) / (x + f);
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / (x + f)
    }

    fn gelu_ref(x: f64) -> f64 {
        let z = -x / std::f64::consts::SQRT_2;
        let erfc = if z >= 3.0 { erfc_big(z) } else { 1.0 - erf(z) };
        0.5 * x * erfc
    }

    /// The largest errors in ulp of exp, sigmoid, SiLU and tanh against f64.
    fn ulp_errors<const FMA: bool>() -> [f64; 4] {
        let tiny = f64::from(f32::MIN_POSITIVE);
        let run = |f: &dyn Fn(f32) -> f32, r: fn(f64) -> f64, lo, hi| {
            max_ulp(grid(lo, hi, 200_000), f, r, tiny)
        };
        [
            run(&exp::<FMA>, f64::exp, -87.0, 88.7),
            run(
                &|x| sigmoid(Scalar::<FMA>, x),
                |x| 1.0 / (1.0 + (-x).exp()),
                -80.0,
                80.0,
            ),
            run(
                &|x| silu(Scalar::<FMA>, x),
                |x| x / (1.0 + (-x).exp()),
                -80.0,
                80.0,
            ),
            run(&tanh::<FMA>, f64::tanh, -10.0, 10.0),
        ]
    }

    #[test]
    fn accuracy_against_f64() {
        let tiny = f64::from(f32::MIN_POSITIVE);
        for fma in [false, true] {
            let [e, s, si, t] = if fma {
                ulp_errors::<true>()
            } else {
                ulp_errors::<false>()
            };
            assert!(e <= 2.0, "exp {e} ulp");
            assert!(s <= 4.0 && si <= 4.0, "sigmoid {s}, silu {si} ulp");
            assert!(t <= 4.0, "tanh {t} ulp");
            // Near zero tanh is x: relative accuracy holds down to tiny inputs.
            assert!(max_ulp(grid(-1e-3, 1e-3, 10_000), tanh::<true>, f64::tanh, tiny) <= 2.0);
        }
        let rel = |f: fn(f32) -> f32, r: fn(f64) -> f64, lo: f32, hi: f32| {
            grid(lo, hi, 100_000)
                .map(|x| {
                    let want = r(f64::from(x));
                    if want == 0.0 {
                        0.0
                    } else {
                        ((f64::from(f(x)) - want) / want).abs()
                    }
                })
                .fold(0.0, f64::max)
        };
        // GELU: relative on the positive side, absolute in units of |x| on both.
        for f in [gelu::<true> as fn(f32) -> f32, gelu::<false>] {
            assert!(rel(f, gelu_ref, 0.0, 10.0) < 4e-7);
            let per_x = grid(-10.0, 10.0, 400_000)
                .filter(|&x| x != 0.0)
                .map(|x| (f64::from(f(x)) - gelu_ref(f64::from(x))).abs() / f64::from(x.abs()))
                .fold(0.0, f64::max);
            assert!(per_x < 2.5e-7, "gelu error {per_x} |x|");
        }
        let gelu_tanh_ref = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        assert!(rel(gelu_tanh::<true>, gelu_tanh_ref, -5.0, 10.0) < 5e-6);
    }

    #[test]
    fn special_values() {
        assert_eq!(exp::<true>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp::<true>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<true>(100.0), f32::INFINITY);
        assert!(exp::<true>(f32::NAN).is_nan());
        assert_eq!(exp::<false>(0.0), 1.0);
        assert!(tanh::<true>(f32::NAN).is_nan());
        assert_eq!(tanh::<true>(50.0), 1.0);
        assert_eq!(tanh::<true>(-50.0), -1.0);
        assert_eq!(sigmoid(Scalar::<true>, -200.0), 0.0);
        assert_eq!(sigmoid(Scalar::<true>, 200.0), 1.0);
        assert!(
            sigmoid(Scalar::<true>, f32::NAN).is_nan() && silu(Scalar::<true>, f32::NAN).is_nan()
        );
        assert_eq!(sigmoid(Scalar::<true>, f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(Scalar::<true>, f32::INFINITY), 1.0);
        assert_eq!(silu(Scalar::<true>, f32::INFINITY), f32::INFINITY);
        // PyTorch: silu(-inf) = -inf · 0 is NaN.
        assert!(silu(Scalar::<true>, f32::NEG_INFINITY).is_nan());
        // As eager PyTorch: gelu(inf) = inf, gelu(-inf) = -inf · 0 = NaN, and x/2 is
        // formed first, so the largest floats do not overflow.
        for f in [gelu::<true> as fn(f32) -> f32, gelu::<false>] {
            assert!(f(f32::NAN).is_nan() && f(f32::NEG_INFINITY).is_nan());
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert_eq!(f(-200.0), 0.0);
            assert_eq!(f(200.0), 200.0);
            assert_eq!(f(5.6), 5.6);
            assert_eq!(f(-1e30), 0.0);
            assert_eq!(f(1e30), 1e30);
            assert_eq!(f(f32::MAX), f32::MAX);
            assert_eq!(f(0.0), 0.0);
        }
    }
}
