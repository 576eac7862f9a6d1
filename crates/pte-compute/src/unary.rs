//! Elementwise f32 functions of one operand, each followed by a clamp, compiled once
//! per instruction set: the unary operators of XNNPACK-style graphs that the
//! activations of [`crate::elementwise`] do not cover.
//!
//! `exp` and ELU use the vectorizable approximation of `math` (2 ulp); `log`, `sin`
//! and `cos` call the standard library per element (correctly rounded or within 1 ulp,
//! not vectorized: they are rare in the graphs this serves).

use crate::arch::{multiversion, Isa, Scalar};
use crate::elementwise::{act, clamp, Activation};
use crate::error::{Error, Result};
use crate::math;

/// A function of one operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryFn {
    /// `|x|`.
    Abs,
    /// `-x`.
    Negate,
    /// `x²`.
    Square,
    /// `√x`.
    Sqrt,
    /// `1 / √x`.
    Rsqrt,
    /// Round toward -inf.
    Floor,
    /// Round toward +inf.
    Ceil,
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `sin x`.
    Sin,
    /// `cos x`.
    Cos,
    /// `x` for `x > 0`, else `alpha · (e^x - 1)`.
    Elu { alpha: f32 },
    /// `x` for `x >= 0`, else `slope · x`.
    LeakyRelu { slope: f32 },
    /// An activation of [`crate::elementwise`] (identity, sigmoid, tanh, GELU, ...).
    Act(Activation),
}

impl UnaryFn {
    /// The function of one value (the portable reference).
    pub fn apply_scalar(self, x: f32) -> f32 {
        eval::<false>(self, x)
    }
}

#[inline(always)]
fn eval<const FMA: bool>(f: UnaryFn, x: f32) -> f32 {
    match f {
        UnaryFn::Abs => x.abs(),
        UnaryFn::Negate => -x,
        UnaryFn::Square => x * x,
        UnaryFn::Sqrt => x.sqrt(),
        UnaryFn::Rsqrt => 1.0 / x.sqrt(),
        UnaryFn::Floor => x.floor(),
        UnaryFn::Ceil => x.ceil(),
        UnaryFn::Exp => math::exp::<FMA>(x),
        UnaryFn::Log => x.ln(),
        UnaryFn::Sin => x.sin(),
        UnaryFn::Cos => x.cos(),
        UnaryFn::Elu { alpha } => {
            let e = alpha * (math::exp::<FMA>(x) - 1.0);
            if x > 0.0 {
                x
            } else {
                e
            }
        }
        UnaryFn::LeakyRelu { slope } => {
            if x >= 0.0 {
                x
            } else {
                x * slope
            }
        }
        UnaryFn::Act(a) => act::<FMA>(a, x),
    }
}

/// Runs `$body` over `out`/`x` with one loop per function so that each vectorizes.
macro_rules! per_fn {
    ($f:expr, $fma:ident, $out:ident, $x:ident, $min:ident, $max:ident) => {
        match $f {
            UnaryFn::Act(a) => match a {
                Activation::Sigmoid => {
                    each!($out, $x, $min, $max, |v| math::sigmoid(Scalar::<$fma>, v))
                }
                Activation::Tanh => each!($out, $x, $min, $max, |v| math::tanh::<$fma>(v)),
                Activation::Gelu => each!($out, $x, $min, $max, |v| math::gelu::<$fma>(v)),
                // A constant activation per loop: the match in `act` folds away and the
                // loop vectorizes (a hardswish matched per element took 1.6 ns).
                Activation::HardSwish => {
                    each!($out, $x, $min, $max, |v| act::<$fma>(
                        Activation::HardSwish,
                        v
                    ))
                }
                Activation::HardSwishFused => {
                    each!($out, $x, $min, $max, |v| act::<$fma>(
                        Activation::HardSwishFused,
                        v
                    ))
                }
                Activation::HardSigmoid => {
                    each!($out, $x, $min, $max, |v| act::<$fma>(
                        Activation::HardSigmoid,
                        v
                    ))
                }
                Activation::Silu => {
                    each!($out, $x, $min, $max, |v| act::<$fma>(Activation::Silu, v))
                }
                other => each!($out, $x, $min, $max, |v| act::<$fma>(other, v)),
            },
            UnaryFn::Abs => each!($out, $x, $min, $max, |v: f32| v.abs()),
            UnaryFn::Negate => each!($out, $x, $min, $max, |v: f32| -v),
            UnaryFn::Square => each!($out, $x, $min, $max, |v: f32| v * v),
            UnaryFn::Sqrt => each!($out, $x, $min, $max, |v: f32| v.sqrt()),
            UnaryFn::Exp => each!($out, $x, $min, $max, |v| math::exp::<$fma>(v)),
            other => each!($out, $x, $min, $max, |v| eval::<$fma>(other, v)),
        }
    };
}

macro_rules! each {
    ($out:ident, $x:ident, $min:ident, $max:ident, $f:expr) => {{
        let f = $f;
        for (o, &v) in $out.iter_mut().zip($x) {
            *o = clamp(f(v), $min, $max);
        }
    }};
}

multiversion! {
    fn unary_loop<const FMA: bool>(f: UnaryFn, x: &[f32], out: &mut [f32], min: f32, max: f32) {
        per_fn!(f, FMA, out, x, min, max);
    }
}

/// `out[i] = clamp(f(x[i]), min, max)` (NaN passes the clamp); `x` and `out` of the
/// same length.
pub fn unary(isa: Isa, f: UnaryFn, x: &[f32], out: &mut [f32], min: f32, max: f32) -> Result {
    if x.len() != out.len() {
        return Err(Error::ShapeMismatch {
            what: format!("unary input of {} elements into {}", x.len(), out.len()),
        });
    }
    unary_loop(isa, f, x, out, min, max);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instruction_set_matches_the_reference() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.037).collect();
        let fns = [
            UnaryFn::Abs,
            UnaryFn::Negate,
            UnaryFn::Square,
            UnaryFn::Sqrt,
            UnaryFn::Rsqrt,
            UnaryFn::Floor,
            UnaryFn::Ceil,
            UnaryFn::Exp,
            UnaryFn::Log,
            UnaryFn::Sin,
            UnaryFn::Cos,
            UnaryFn::Elu { alpha: 0.7 },
            UnaryFn::LeakyRelu { slope: 0.01 },
            UnaryFn::Act(Activation::Sigmoid),
            UnaryFn::Act(Activation::Tanh),
            UnaryFn::Act(Activation::Gelu),
            UnaryFn::Act(Activation::HardSwish),
            UnaryFn::Act(Activation::HardSwishFused),
        ];
        for isa in Isa::available() {
            for f in fns {
                let mut out = vec![0.0; x.len()];
                unary(isa, f, &x, &mut out, -3.0, 5.0).unwrap();
                for (&v, &o) in x.iter().zip(&out) {
                    let want = f.apply_scalar(v).clamp(-3.0, 5.0);
                    let mut tol = 4.0 * f32::EPSILON * want.abs().max(1e-30);
                    if f == UnaryFn::Act(Activation::Gelu) {
                        // Absolute in units of |x| (see `math`), each side.
                        tol += 5e-7 * v.abs();
                    }
                    if f == UnaryFn::Act(Activation::HardSwishFused) {
                        // The fused and the plain multiply-add round `x/6 + 1/2` apart.
                        tol += f32::EPSILON * v.abs();
                    }
                    assert!(
                        (o - want).abs() <= tol || (o.is_nan() && want.is_nan()),
                        "{isa:?} {f:?}({v}) = {o}, want {want}"
                    );
                }
            }
        }
        assert!(unary(Isa::Generic, UnaryFn::Abs, &x, &mut [0.0; 3], 0.0, 1.0).is_err());
    }

    #[test]
    fn reference_values() {
        assert_eq!(UnaryFn::Elu { alpha: 2.0 }.apply_scalar(1.5), 1.5);
        assert!(
            (UnaryFn::Elu { alpha: 2.0 }.apply_scalar(-1.0) - 2.0 * ((-1.0f32).exp() - 1.0)).abs()
                < 1e-6
        );
        assert_eq!(UnaryFn::LeakyRelu { slope: 0.5 }.apply_scalar(-2.0), -1.0);
        assert_eq!(UnaryFn::Rsqrt.apply_scalar(4.0), 0.5);
        assert_eq!(UnaryFn::Floor.apply_scalar(-1.5), -2.0);
        assert_eq!(UnaryFn::Ceil.apply_scalar(-1.5), -1.0);
        // Hardswish: zero up to -3, the identity from 3, PyTorch's values within a
        // rounding between (XNNPACK's formula).
        let hs = UnaryFn::Act(Activation::HardSwishFused);
        assert_eq!(hs.apply_scalar(-3.5), -0.0);
        assert_eq!(hs.apply_scalar(-3.0), -0.0);
        assert_eq!(hs.apply_scalar(3.0), 3.0);
        assert_eq!(hs.apply_scalar(7.25), 7.25);
        assert!(hs.apply_scalar(f32::NAN).is_nan());
        for x in [-2.5f32, -1.0, 0.3, 1.0, 2.9] {
            let torch = UnaryFn::Act(Activation::HardSwish).apply_scalar(x);
            assert!(
                (hs.apply_scalar(x) - torch).abs() <= 2.0 * f32::EPSILON * x.abs(),
                "{x}"
            );
        }
    }
}
