//! Numeric traits the element operations are written against: integers compute in their
//! own type with wrapping arithmetic (as upstream's C++ does), floats in `f32` or `f64`.

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Sub};

use crate::util::Elem;

/// Integer element types (`u8` also holds bools as 0/1).
pub trait Int:
    Elem
    + Ord
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + Not<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    fn wrapping_add(self, o: Self) -> Self;
    fn wrapping_sub(self, o: Self) -> Self;
    fn wrapping_mul(self, o: Self) -> Self;
    fn wrapping_neg(self) -> Self;
    fn wrapping_abs(self) -> Self;
    fn signum(self) -> Self;
    /// Truncating division; 0 for a zero divisor, which kernels reject beforehand.
    fn div_trunc(self, o: Self) -> Self;
    /// Remainder of [`Int::div_trunc`] (C's `%`); 0 for a zero divisor.
    fn rem_trunc(self, o: Self) -> Self;

    /// Floor division (Python's `//`).
    fn div_floor(self, o: Self) -> Self {
        let q = self.div_trunc(o);
        if self.rem_trunc(o) != Self::ZERO && ((self < Self::ZERO) != (o < Self::ZERO)) {
            q.wrapping_sub(Self::ONE)
        } else {
            q
        }
    }

    /// `self ** e` by squaring; negative exponents follow PyTorch (1 and -1 keep their
    /// magnitude, everything else gives 0).
    fn pow(self, e: Self) -> Self {
        let two = Self::from_i64(2);
        if e < Self::ZERO {
            return if self == Self::ONE {
                Self::ONE
            } else if self == Self::ONE.wrapping_neg() {
                if e.rem_trunc(two) == Self::ZERO {
                    Self::ONE
                } else {
                    self
                }
            } else {
                Self::ZERO
            };
        }
        let (mut base, mut e, mut acc) = (self, e, Self::ONE);
        while e != Self::ZERO {
            if e.rem_trunc(two) != Self::ZERO {
                acc = acc.wrapping_mul(base);
            }
            base = base.wrapping_mul(base);
            e = e.div_trunc(two);
        }
        acc
    }
}

macro_rules! int_impl {
    ($($t:ty: $abs:expr, $signum:expr;)*) => {$(
        impl Int for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn wrapping_add(self, o: Self) -> Self { <$t>::wrapping_add(self, o) }
            fn wrapping_sub(self, o: Self) -> Self { <$t>::wrapping_sub(self, o) }
            fn wrapping_mul(self, o: Self) -> Self { <$t>::wrapping_mul(self, o) }
            fn wrapping_neg(self) -> Self { <$t>::wrapping_neg(self) }
            fn wrapping_abs(self) -> Self { $abs(self) }
            fn signum(self) -> Self { $signum(self) }
            fn div_trunc(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_div(o) } }
            fn rem_trunc(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_rem(o) } }
        }
    )*};
}
int_impl! {
    u8: |x| x, |x: u8| x.min(1);
    i8: i8::wrapping_abs, i8::signum;
    i16: i16::wrapping_abs, i16::signum;
    i32: i32::wrapping_abs, i32::signum;
    i64: i64::wrapping_abs, i64::signum;
}

/// Floating-point compute types (`f32`, also for the half types, and `f64`).
pub trait Float:
    Elem
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    fn abs(self) -> Self;
    fn exp(self) -> Self;
    fn exp_m1(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn log2(self) -> Self;
    fn log10(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tan(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn trunc(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_infinite(self) -> bool;
    fn powf(self, e: Self) -> Self;
    fn atan2(self, o: Self) -> Self;
    fn copysign(self, sign: Self) -> Self;

    /// The maximum, NaN if either is NaN (PyTorch's `maximum` and clamp bounds).
    fn max_nan(self, o: Self) -> Self {
        if self.is_nan() || self > o {
            self
        } else {
            o
        }
    }

    /// The minimum, NaN if either is NaN.
    fn min_nan(self, o: Self) -> Self {
        if self.is_nan() || self < o {
            self
        } else {
            o
        }
    }
}

macro_rules! float_impl {
    ($t:ty, $erf:path) => {
        impl Float for $t {
            float_impl!(@fwd $t: abs exp exp_m1 ln ln_1p log2 log10 sqrt sin cos tan tanh floor
                        ceil round_ties_even trunc);
            fn erf(self) -> Self { $erf(self) }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            fn is_infinite(self) -> bool { <$t>::is_infinite(self) }
            fn powf(self, e: Self) -> Self { <$t>::powf(self, e) }
            fn atan2(self, o: Self) -> Self { <$t>::atan2(self, o) }
            fn copysign(self, sign: Self) -> Self { <$t>::copysign(self, sign) }
        }
    };
    (@fwd $t:ty: $($f:ident)*) => {
        $(fn $f(self) -> Self { <$t>::$f(self) })*
    };
}
float_impl!(f32, libm::erff);
float_impl!(f64, libm::erf);
