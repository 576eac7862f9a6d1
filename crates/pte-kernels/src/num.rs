//! The numeric traits every kernel is written against, in one hierarchy:
//!
//! - [`Elem`]: any element type a tensor holds and kernels compute on (the integers,
//!   `u8` also for bools, and the four float types), with PyTorch's conversions and the
//!   type it accumulates in ([`Elem::Acc`]);
//! - [`Ring`]: the accumulation types (`i64` with wrapping arithmetic, `f32`, `f64`);
//! - [`Real`]: the float compute types `f32` and `f64`, with their math;
//! - [`Float`]: the float element types, which compute in a [`Real`] (float16 and
//!   bfloat16 in `f32`, PyTorch's "opmath" type);
//! - [`Int`]: the integer element types, computing in their own type with wrapping
//!   arithmetic (as upstream's C++ does).
//!
//! Complex numbers are `num_complex::Complex` over a [`Real`] (see the `complex` module).

use std::fmt::Debug;
use std::ops::{Add, AddAssign, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Sub};

use half::{bf16, f16};
use pte_runtime::Element;

/// Element types kernels compute on, with conversions as PyTorch makes them.
pub trait Elem: Element + Copy + Default + PartialEq + PartialOrd + Debug {
    /// True for floating-point types.
    const FLOAT: bool;
    /// The type sums and products of this type accumulate in.
    type Acc: Ring;
    fn acc(self) -> Self::Acc;
    /// Rounds (floats) or wraps (integers) an accumulated value to this type.
    fn of_acc(v: Self::Acc) -> Self;
    fn to_f64(self) -> f64;
    /// A float converted as PyTorch does on x86: floats round to nearest; integers of 32
    /// bits or fewer truncate toward zero through `int32` (out of range and NaN give
    /// `i32::MIN`, then the low bits are kept), 64-bit ones through `int64` likewise.
    fn from_f64(v: f64) -> Self;
    /// As an integer: floats truncate toward zero like [`Elem::from_f64`] into `i64`.
    fn to_i64(self) -> i64;
    /// An integer converted with wrapping (floats round to nearest).
    fn from_i64(v: i64) -> Self;
}

/// The accumulation types: a commutative ring under `add` and `mul` (wrapping for `i64`).
pub trait Ring: Copy + Default + PartialOrd + Debug + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

/// x86's `cvttsd2si` into 32 bits: truncation, `i32::MIN` when out of range or NaN.
fn trunc_i32(v: f64) -> i32 {
    if v > -2_147_483_649.0 && v < 2_147_483_648.0 {
        v as i32
    } else {
        i32::MIN
    }
}

/// x86's `cvttsd2si` into 64 bits: truncation, `i64::MIN` when out of range or NaN.
fn trunc_i64(v: f64) -> i64 {
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v) {
        v as i64
    } else {
        i64::MIN
    }
}

/// The unsigned 64-bit conversion compilers emit on x86-64: values of 2^63 and above
/// are converted after subtracting 2^63, then the top bit is set.
fn trunc_u64(v: f64) -> u64 {
    const TOP: f64 = 9_223_372_036_854_775_808.0;
    if v >= TOP {
        (trunc_i64(v - TOP) as u64) ^ (1 << 63)
    } else {
        trunc_i64(v) as u64
    }
}

macro_rules! int_elem {
    ($($t:ty: $from_f64:expr;)*) => {$(
        impl Elem for $t {
            const FLOAT: bool = false;
            type Acc = i64;
            fn acc(self) -> i64 { self as i64 }
            fn of_acc(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { $from_f64(v) as $t }
            fn to_i64(self) -> i64 { self as i64 }
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
int_elem! {
    u8: trunc_i32;
    i8: trunc_i32;
    i16: trunc_i32;
    u16: trunc_i32;
    i32: trunc_i32;
    u32: trunc_i64;
    i64: trunc_i64;
    u64: trunc_u64;
}

macro_rules! float_elem {
    ($($t:ty: $acc:ty, $to:expr, $from:expr;)*) => {$(
        impl Elem for $t {
            const FLOAT: bool = true;
            type Acc = $acc;
            fn acc(self) -> $acc { $to(self) }
            fn of_acc(v: $acc) -> Self { $from(v) }
            fn to_f64(self) -> f64 { f64::from(self) }
            fn from_f64(v: f64) -> Self { <$t>::from_f64_value(v) }
            fn to_i64(self) -> i64 { trunc_i64(f64::from(self)) }
            fn from_i64(v: i64) -> Self { <$t>::from_f64_value(v as f64) }
        }
    )*};
}

/// Rounding an `f64` to each float type (`half`'s conversions round to nearest even).
trait FromF64 {
    fn from_f64_value(v: f64) -> Self;
}
impl FromF64 for f32 {
    fn from_f64_value(v: f64) -> Self {
        v as f32
    }
}
impl FromF64 for f64 {
    fn from_f64_value(v: f64) -> Self {
        v
    }
}
impl FromF64 for f16 {
    fn from_f64_value(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl FromF64 for bf16 {
    fn from_f64_value(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

float_elem! {
    f32: f32, |v| v, |v| v;
    f64: f64, |v| v, |v| v;
    f16: f32, f16::to_f32, f16::from_f32;
    bf16: f32, bf16::to_f32, bf16::from_f32;
}

impl Ring for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
}

/// The float compute types (`f32`, also for the half types, and `f64`) and their math.
pub trait Real:
    Elem<Acc = Self>
    + Ring
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
    + AddAssign
{
    const NEG_INFINITY: Self;
    /// Rounds an `f64` to this type.
    fn of(v: f64) -> Self;
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
    fn asin(self) -> Self;
    fn acos(self) -> Self;
    fn atan(self) -> Self;
    fn sinh(self) -> Self;
    fn cosh(self) -> Self;
    fn tanh(self) -> Self;
    fn asinh(self) -> Self;
    fn acosh(self) -> Self;
    fn atanh(self) -> Self;
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

macro_rules! real_impl {
    ($t:ident, $erf:path, $asinh:path, $acosh:path, $atanh:path) => {
        impl Ring for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
        }
        impl Real for $t {
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            fn of(v: f64) -> Self { v as $t }
            real_impl!(@fwd $t: abs exp exp_m1 ln ln_1p log2 log10 sqrt sin cos tan asin acos atan
                        sinh cosh tanh floor ceil round_ties_even trunc);
            fn erf(self) -> Self { $erf(self) }
            // std's inverse hyperbolic functions overflow for large arguments.
            fn asinh(self) -> Self { $asinh(self) }
            fn acosh(self) -> Self { $acosh(self) }
            fn atanh(self) -> Self { $atanh(self) }
            fn is_nan(self) -> bool { $t::is_nan(self) }
            fn is_infinite(self) -> bool { $t::is_infinite(self) }
            fn powf(self, e: Self) -> Self { $t::powf(self, e) }
            fn atan2(self, o: Self) -> Self { $t::atan2(self, o) }
            fn copysign(self, sign: Self) -> Self { $t::copysign(self, sign) }
        }
    };
    (@fwd $t:ty: $($f:ident)*) => {
        $(fn $f(self) -> Self { <$t>::$f(self) })*
    };
}
real_impl!(f32, libm::erff, libm::asinhf, libm::acoshf, libm::atanhf);
real_impl!(f64, libm::erf, libm::asinh, libm::acosh, libm::atanh);

/// Floating-point element types; they compute in `Acc`, a [`Real`].
pub trait Float: Elem<Acc: Real> + Send + Sync {}
impl Float for f32 {}
impl Float for f64 {}
impl Float for f16 {}
impl Float for bf16 {}

/// Integer element types (`u8` also holds bools as 0/1), in wrapping arithmetic.
pub trait Int:
    Elem<Acc = i64>
    + Ord
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + Not<Output = Self>
    + Send
    + Sync
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
    /// PyTorch's `<<`: 0 when the shift is negative or at least the bit width.
    fn shl(self, n: Self) -> Self;
    /// PyTorch's `>>`: arithmetic for signed types; a negative shift, or one past the
    /// bit width (less the sign bit), shifts every bit out (leaving the sign).
    fn shr(self, n: Self) -> Self;
    /// The type's range as `i64` (`u64`'s top clipped).
    const MIN_I64: i64;
    const MAX_I64: i64;

    /// Remainder with the divisor's sign (Python's `%`, PyTorch's `remainder`).
    fn rem_floor(self, o: Self) -> Self {
        let r = self.rem_trunc(o);
        if r != Self::ZERO && ((r < Self::ZERO) != (o < Self::ZERO)) {
            r.wrapping_add(o)
        } else {
            r
        }
    }

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
            fn shl(self, n: Self) -> Self {
                match u32::try_from(n.to_i64()) {
                    Ok(n) if n < <$t>::BITS => self.wrapping_shl(n),
                    _ => 0,
                }
            }
            fn shr(self, n: Self) -> Self {
                let max = <$t>::BITS - u32::from(<$t>::MIN != 0);
                match u32::try_from(n.to_i64()) {
                    Ok(n) if n < max => self >> n,
                    _ => self.checked_shr(max).unwrap_or(0),
                }
            }
            const MIN_I64: i64 = <$t>::MIN as i64;
            const MAX_I64: i64 = if <$t>::BITS >= 64 { i64::MAX } else { <$t>::MAX as i64 };
        }
    )*};
}
int_impl! {
    u8: |x| x, |x: u8| x.min(1);
    u16: |x| x, |x: u16| x.min(1);
    u32: |x| x, |x: u32| x.min(1);
    u64: |x| x, |x: u64| x.min(1);
    i8: i8::wrapping_abs, i8::signum;
    i16: i16::wrapping_abs, i16::signum;
    i32: i32::wrapping_abs, i32::signum;
    i64: i64::wrapping_abs, i64::signum;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_to_int_conversions_follow_pytorch_on_x86() {
        // Through int32 for narrow types: 3e9 is out of int32's range, giving its minimum,
        // whose low bits are 0; -300.7 truncates to -300, whose low byte is 212.
        assert_eq!(i16::from_f64(3e9), 0);
        assert_eq!(u8::from_f64(-300.7), 212);
        assert_eq!(i8::from_f64(-163.4), 93);
        assert_eq!(i32::from_f64(f64::NAN), i32::MIN);
        assert_eq!(i32::from_f64(3e9), i32::MIN);
        assert_eq!(i64::from_f64(3e9), 3_000_000_000);
        assert_eq!(i64::from_f64(1e20), i64::MIN);
        assert_eq!(u8::from_f64(f64::INFINITY), 0);
        assert_eq!(i64::from_f64(-0.5), 0);
    }

    #[test]
    fn integer_semantics() {
        assert_eq!(Int::div_floor(-7i64, 2), -4);
        assert_eq!(Int::pow(3i64, 4), 81);
        assert_eq!(Int::pow(2i64, -1), 0);
        assert_eq!(Int::pow(-1i8, -3), -1);
        assert_eq!(Int::pow(2u8, 9), 0);
        assert_eq!(Int::rem_floor(-7i32, 2), 1);
        assert_eq!(Int::rem_floor(7i8, -2), -1);
        assert_eq!(Int::shl(-100i32, 32), 0);
        assert_eq!(Int::shl(1i32, -1), 0);
        assert_eq!(Int::shl(3i8, 7), -128);
        assert_eq!(Int::shr(-100i32, 32), -1);
        assert_eq!(Int::shr(-100i64, 63), -1);
        assert_eq!(Int::shr(100i64, 70), 0);
        assert_eq!(Int::shr(200u8, 8), 0);
        assert_eq!(Int::shr(200u8, 7), 1);
    }
}
