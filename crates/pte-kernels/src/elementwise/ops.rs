//! The element operations, each a small type with its float and/or integer form.

use super::engine::{Compare, FloatOp, IntOp};
use crate::num::{Int, Real};

/// A float constant in the compute type.
fn k<F: Real>(v: f64) -> F {
    F::of(v)
}

/// Implements `FloatOp<N>` for a type from a closure over the operand array.
macro_rules! float_op {
    ($name:ident[$n:literal] |$x:pat_param| $f:expr) => {
        impl FloatOp<$n> for $name {
            fn float<F: Real>(&self, $x: [F; $n]) -> F {
                $f
            }
        }
    };
}

/// Implements `IntOp<N>` for a type; `divides` marks the last operand as a divisor.
macro_rules! int_op {
    ($name:ident[$n:literal] $($d:ident)? |$x:pat_param| $f:expr) => {
        impl IntOp<$n> for $name {
            $(const DIVIDES: bool = int_op!(@$d);)?
            fn int<T: Int>(&self, $x: [T; $n]) -> T {
                $f
            }
        }
    };
    (@divides) => { true };
}

/// Declares unit structs with a float form and, after `;`, an integer form.
macro_rules! ops {
    ($($(#[$m:meta])* $name:ident[$n:literal] float |$x:pat_param| $f:expr
        $(; int $($d:ident)? |$y:pat_param| $i:expr)?,)*) => {$(
        $(#[$m])*
        pub struct $name;
        float_op!($name[$n] |$x| $f);
        $(int_op!($name[$n] $($d)? |$y| $i);)?
    )*};
}

ops! {
    Mul[2] float |[a, b]| a * b; int |[a, b]| a.wrapping_mul(b),
    Div[2] float |[a, b]| a / b,
    /// Division rounded toward zero.
    DivTrunc[2] float |[a, b]| (a / b).trunc(); int divides |[a, b]| a.div_trunc(b),
    /// Division rounded down (Python's `//`).
    DivFloor[2] float |[a, b]| div_floor(a, b); int divides |[a, b]| a.div_floor(b),
    /// The divisor's sign (Python's `%`), integers too (upstream 1.5.1 gives integers
    /// the dividend's sign, like C's `%`: `remainder(-183, 11)` is -7 there, 4 here).
    Remainder[2] float |[a, b]| {
        let r = a % b;
        if r != k(0.0) && ((r < k(0.0)) != (b < k(0.0))) { r + b } else { r }
    }; int divides |[a, b]| a.rem_floor(b),
    /// Remainder with the dividend's sign (C's `fmod`).
    Fmod[2] float |[a, b]| a % b; int divides |[a, b]| a.rem_trunc(b),
    Pow[2] float |[a, b]| a.powf(b); int |[a, b]| a.pow(b),
    Maximum[2] float |[a, b]| a.max_nan(b); int |[a, b]| a.max(b),
    Minimum[2] float |[a, b]| a.min_nan(b); int |[a, b]| a.min(b),
    Atan2[2] float |[a, b]| a.atan2(b),
    /// `cond ? a : b`, the condition loaded in the compute type.
    Where[3] float |[c, a, b]| if c != k(0.0) { a } else { b };
        int |[c, a, b]| if c != T::ZERO { a } else { b },

    Abs[1] float |[x]| x.abs(); int |[x]| x.wrapping_abs(),
    Neg[1] float |[x]| -x; int |[x]| x.wrapping_neg(),
    /// `max(x, 0)`, keeping NaN.
    Relu[1] float |[x]| if x < k(0.0) { k(0.0) } else { x }; int |[x]| x.max(T::ZERO),
    Floor[1] float |[x]| x.floor(); int |[x]| x,
    Ceil[1] float |[x]| x.ceil(); int |[x]| x,
    /// Round half to even.
    Round[1] float |[x]| x.round_ties_even(); int |[x]| x,
    Trunc[1] float |[x]| x.trunc(); int |[x]| x,
    /// -1, 0 or 1 (0 for NaN, as PyTorch).
    Sign[1] float |[x]| k(if x > k(0.0) { 1.0 } else if x < k(0.0) { -1.0 } else { 0.0 });
        int |[x]| x.signum(),
    IsNan[1] float |[x]| k(if x.is_nan() { 1.0 } else { 0.0 }); int |_| T::ZERO,
    IsInf[1] float |[x]| k(if x.is_infinite() { 1.0 } else { 0.0 }); int |_| T::ZERO,
    /// The scalar of `scalar_tensor`, converted to the output's dtype on loading.
    Identity[1] float |[x]| x; int |[x]| x,

    Exp[1] float |[x]| x.exp(),
    Expm1[1] float |[x]| x.exp_m1(),
    Log[1] float |[x]| x.ln(),
    Log2[1] float |[x]| x.log2(),
    Log10[1] float |[x]| x.log10(),
    Log1p[1] float |[x]| x.ln_1p(),
    Sqrt[1] float |[x]| x.sqrt(),
    Rsqrt[1] float |[x]| k::<F>(1.0) / x.sqrt(),
    Reciprocal[1] float |[x]| k::<F>(1.0) / x,
    Sin[1] float |[x]| x.sin(),
    Cos[1] float |[x]| x.cos(),
    Tan[1] float |[x]| x.tan(),
    Asin[1] float |[x]| x.asin(),
    Acos[1] float |[x]| x.acos(),
    Atan[1] float |[x]| x.atan(),
    Sinh[1] float |[x]| x.sinh(),
    Cosh[1] float |[x]| x.cosh(),
    Tanh[1] float |[x]| x.tanh(),
    Asinh[1] float |[x]| x.asinh(),
    Acosh[1] float |[x]| x.acosh(),
    Atanh[1] float |[x]| x.atanh(),
    Erf[1] float |[x]| x.erf(),
    Sigmoid[1] float |[x]| k::<F>(1.0) / (k::<F>(1.0) + (-x).exp()),
    Silu[1] float |[x]| x / (k::<F>(1.0) + (-x).exp()),
    /// `x * relu6(x + 3) / 6`.
    Hardswish[1] float |[x]| x * (x + k(3.0)).max_nan(k(0.0)).min_nan(k(6.0)) / k(6.0),
    /// `relu6(x + 3) / 6`.
    Hardsigmoid[1] float |[x]| (x + k(3.0)).max_nan(k(0.0)).min_nan(k(6.0)) / k(6.0),
    /// Exact GELU: `x/2 · (1 + erf(x/√2))`, halved first as eager PyTorch computes it
    /// (torch 2.15.0 of the reference environment, every dtype): +inf gives +inf, -inf
    /// NaN (-inf · 0), and the largest floats do not overflow.
    Gelu[1] float |[x]| x * k(0.5) * (k::<F>(1.0) + (x * k(std::f64::consts::FRAC_1_SQRT_2)).erf()),
    /// GELU's tanh approximation.
    GeluTanh[1] float |[x]| {
        let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
        let inner = k::<F>(beta) * (x + k::<F>(0.044715) * x * x * x);
        k::<F>(0.5) * x * (k::<F>(1.0) + inner.tanh())
    },
}

/// Integer-only operations; on bools (0/1) the bitwise ones are the logical ones.
pub struct BitAnd;
int_op!(BitAnd[2] | [a, b] | a & b);
pub struct BitOr;
int_op!(BitOr[2] | [a, b] | a | b);
pub struct BitXor;
int_op!(BitXor[2] | [a, b] | a ^ b);
pub struct BitNot;
int_op!(BitNot[1] | [x] | !x);
pub struct ShiftLeft;
int_op!(ShiftLeft[2] | [a, b] | a.shl(b));
pub struct ShiftRight;
int_op!(ShiftRight[2] | [a, b] | a.shr(b));
pub struct LogicalNot;
int_op!(LogicalNot[1] | [x] | if x == T::ZERO { T::ONE } else { T::ZERO });

/// Comparisons.
macro_rules! compare_ops {
    ($($name:ident: $op:tt),*) => {$(
        pub struct $name;
        impl Compare for $name {
            fn test<T: PartialOrd>(&self, a: T, b: T) -> bool {
                a $op b
            }
        }
    )*};
}
compare_ops!(Eq: ==, Ne: !=, Gt: >, Ge: >=, Lt: <, Le: <=);

/// `a + alpha * b`; `sub` is an add of `-alpha`.
pub struct Add {
    pub int: i64,
    pub float: f64,
}

impl FloatOp<2> for Add {
    fn float<F: Real>(&self, [a, b]: [F; 2]) -> F {
        a + k::<F>(self.float) * b
    }
}

impl IntOp<2> for Add {
    fn int<T: Int>(&self, [a, b]: [T; 2]) -> T {
        a.wrapping_add(T::from_i64(self.int).wrapping_mul(b))
    }
}

/// Clamps to the bounds that are present (an absent one is a placeholder operand);
/// a NaN element or bound gives NaN.
pub struct Clamp {
    pub lo: bool,
    pub hi: bool,
}

impl FloatOp<3> for Clamp {
    fn float<F: Real>(&self, [x, lo, hi]: [F; 3]) -> F {
        let x = if self.lo { x.max_nan(lo) } else { x };
        if self.hi {
            x.min_nan(hi)
        } else {
            x
        }
    }
}

impl IntOp<3> for Clamp {
    fn int<T: Int>(&self, [x, lo, hi]: [T; 3]) -> T {
        let x = if self.lo { x.max(lo) } else { x };
        if self.hi {
            x.min(hi)
        } else {
            x
        }
    }
}

/// `elu(x; alpha, scale, input_scale)`.
pub struct Elu {
    pub alpha: f64,
    pub scale: f64,
    pub input_scale: f64,
}

impl FloatOp<1> for Elu {
    fn float<F: Real>(&self, [x]: [F; 1]) -> F {
        if x <= k(0.0) {
            (x * k(self.input_scale)).exp_m1() * k(self.alpha * self.scale)
        } else {
            x * k(self.scale)
        }
    }
}

/// `log(z / (1 - z))`, `z` the input clamped to `[eps, 1 - eps]` when `eps` is given
/// (NaN stays NaN).
pub struct Logit(pub Option<f64>);

impl FloatOp<1> for Logit {
    fn float<F: Real>(&self, [x]: [F; 1]) -> F {
        let z = match self.0 {
            Some(eps) if x < k(eps) => k(eps),
            Some(eps) if x > k(1.0 - eps) => k(1.0 - eps),
            _ => x,
        };
        (z / (k::<F>(1.0) - z)).ln()
    }
}

/// `x` for positive `x`, else `x * slope`.
pub struct LeakyRelu(pub f64);

impl FloatOp<1> for LeakyRelu {
    fn float<F: Real>(&self, [x]: [F; 1]) -> F {
        if x > k(0.0) {
            x
        } else {
            x * k(self.0)
        }
    }
}

/// `log(1 + exp(beta * x)) / beta`, linear above the threshold.
pub struct Softplus {
    pub beta: f64,
    pub threshold: f64,
}

impl FloatOp<1> for Softplus {
    fn float<F: Real>(&self, [x]: [F; 1]) -> F {
        let bx = x * k(self.beta);
        if bx > k(self.threshold) {
            x
        } else {
            bx.exp().ln_1p() / k(self.beta)
        }
    }
}

/// Python's floor division of floats (PyTorch's `div_floor_floating`).
fn div_floor<F: Real>(a: F, b: F) -> F {
    if b == k(0.0) {
        return a / b;
    }
    let m = a % b;
    let mut d = (a - m) / b;
    if m != k(0.0) && ((b < k(0.0)) != (m < k(0.0))) {
        d = d - k(1.0);
    }
    if d == k(0.0) {
        return k::<F>(0.0).copysign(a / b);
    }
    let f = d.floor();
    if d - f > k(0.5) {
        f + k(1.0)
    } else {
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f2(op: &impl FloatOp<2>, a: f64, b: f64) -> f64 {
        op.float([a, b])
    }

    #[test]
    fn division_and_remainder_follow_pytorch() {
        assert_eq!(f2(&DivFloor, 7.0, -2.0), -4.0);
        assert_eq!(f2(&DivFloor, -7.5, 2.0), -4.0);
        assert!(f2(&DivFloor, -0.5, 4.0) == -1.0 && f2(&DivFloor, 0.5, 4.0) == 0.0);
        assert!(f2(&DivFloor, 0.0, -1.0).is_sign_negative());
        assert_eq!(f2(&DivTrunc, -7.0, 2.0), -3.0);
        assert_eq!(DivFloor.int([-7i64, 2]), -4);
        assert_eq!(DivTrunc.int([-7i32, 2]), -3);
        assert_eq!(DivTrunc.int([i64::MIN, -1]), i64::MIN);
        assert_eq!(f2(&Remainder, -183.0, 11.0), 4.0);
        assert_eq!(f2(&Remainder, 5.0, -3.0), -1.0);
        assert_eq!(Remainder.int([-183i64, 11]), 4);
        assert_eq!(f2(&Fmod, -5.0, 3.0), -2.0);
    }

    #[test]
    fn integer_powers() {
        assert_eq!(Pow.int([3i64, 4]), 81);
        assert_eq!(Pow.int([-2i32, 3]), -8);
        assert_eq!(Pow.int([2i64, -1]), 0);
        assert_eq!(Pow.int([-1i64, -3]), -1);
        assert_eq!(Pow.int([-1i8, -2]), 1);
        assert_eq!(Pow.int([2u8, 9]), 0);
    }

    #[test]
    fn nan_propagates() {
        let clamp = Clamp { lo: true, hi: true };
        assert!(clamp.float([f64::NAN, 0.0, 1.0]).is_nan());
        assert!(clamp.float([0.5, f64::NAN, 1.0]).is_nan());
        assert_eq!(clamp.float([5.0, 2.0, 1.0]), 1.0);
        assert_eq!(
            Clamp {
                lo: false,
                hi: true
            }
            .int([5i64, 9, 3]),
            3
        );
        assert!(f2(&Maximum, 1.0, f64::NAN).is_nan());
        assert!(f2(&Minimum, f64::NAN, 1.0).is_nan());
        assert!(Relu.float([f64::NAN]).is_nan());
        assert_eq!(Sign.float([f64::NAN]), 0.0);
    }

    #[test]
    fn activations() {
        let gelu = Gelu.float([1.0f64]);
        assert!((gelu - 0.841_344_746_068_542_9).abs() < 1e-12);
        assert_eq!(Gelu.float([f32::INFINITY]), f32::INFINITY);
        assert!(Gelu.float([f32::NEG_INFINITY]).is_nan());
        assert_eq!(Gelu.float([3e38f32]), 3e38);
        assert!((GeluTanh.float([1.0f64]) - 0.841_191_990_607_459_6).abs() < 1e-12);
        assert_eq!(Hardswish.float([1.0f32]), 1.0 * 4.0 / 6.0);
        assert_eq!(Round.float([2.5f32]), 2.0);
        assert_eq!(
            Softplus {
                beta: 1.0,
                threshold: 20.0
            }
            .float([30.0f64]),
            30.0
        );
    }
}
