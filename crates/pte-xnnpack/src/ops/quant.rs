//! XNNPACK's 8-bit quantized arithmetic: quantization of bounds, "fp32"
//! requantization (scale in f32, clamp, round half to even), and the fixed-point
//! parameters of quantized addition, so that results agree with upstream's bit for bit
//! where the same formula applies.

use pte_compute::qelementwise::{QAdd, QByte};

/// An 8-bit quantized element type (int8 or uint8).
pub(crate) trait Q8: Copy + Ord + Send + Sync + bytemuck::Pod + QByte + 'static {
    const MIN: i32;
    const MAX: i32;
    fn get(self) -> i32;
    /// From a value already in range.
    fn from_i32(v: i32) -> Self;
}

impl Q8 for i8 {
    const MIN: i32 = -128;
    const MAX: i32 = 127;
    fn get(self) -> i32 {
        i32::from(self)
    }
    fn from_i32(v: i32) -> Self {
        v.clamp(-128, 127) as i8
    }
}

impl Q8 for u8 {
    const MIN: i32 = 0;
    const MAX: i32 = 255;
    fn get(self) -> i32 {
        i32::from(self)
    }
    fn from_i32(v: i32) -> Self {
        v.clamp(0, 255) as u8
    }
}

/// `lrintf` in the default rounding mode: round half to even (saturating, NaN to 0).
/// Below 2^23 in magnitude, adding and taking away 2^23 rounds (a float's unit is 1
/// there); above, floats are integers. `round_ties_even` would do, but without SSE4.1
/// in the baseline target it is a call into libm, and one LLVM makes for every
/// element of a loop whose other branch it takes.
#[inline(always)]
pub(crate) fn rint(x: f32) -> i32 {
    const TWO_23: f32 = 8_388_608.0;
    let a = x.abs();
    let r = if a < TWO_23 { (a + TWO_23) - TWO_23 } else { a };
    r.copysign(x) as i32
}

/// XNNPACK's `xnn_q*8_quantize`: a float bound to the quantized domain, saturated.
pub(crate) fn quantize_bound<T: Q8>(value: f32, scale: f32, zero_point: i32) -> i32 {
    let v = (value / scale + zero_point as f32).clamp(T::MIN as f32, T::MAX as f32);
    // NaN bounds were refused at load; infinities saturate above.
    rint(v)
}

/// Requantization of int32 accumulators: `clamp(rint(acc · scale), min - zp, max - zp)
/// + zp`, clamping in float before rounding as XNNPACK's fp32 kernels do.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Requant {
    pub zero_point: i32,
    pub min_less_zp: f32,
    pub max_less_zp: f32,
}

impl Requant {
    /// For an output of `zero_point`, clamped to `[min, max]` (quantized bounds).
    pub(crate) fn new(zero_point: i32, min: i32, max: i32) -> Requant {
        Requant {
            zero_point,
            min_less_zp: (min - zero_point) as f32,
            max_less_zp: (max - zero_point) as f32,
        }
    }

    /// One accumulator, scaled (as pte-compute's 8-bit convolutions store theirs).
    #[inline(always)]
    pub(crate) fn apply(&self, acc: i32, scale: f32) -> i32 {
        pte_compute::qconv::requantize(
            acc,
            scale,
            (self.min_less_zp, self.max_less_zp),
            self.zero_point,
        )
    }
}

/// The quantized bounds of a node's float output bounds.
pub(crate) fn bounds<T: Q8>(min: f32, max: f32, scale: f32, zero_point: i32) -> (i32, i32) {
    (
        quantize_bound::<T>(min, scale, zero_point),
        quantize_bound::<T>(max, scale, zero_point),
    )
}

/// XNNPACK's fixed-point addition `out = a·sa/so + b·sb/so + zo` (subtraction negates
/// b's scale), exact to upstream's kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AddParams {
    bias: i32,
    a_multiplier: i32,
    b_multiplier: i32,
    shift: u32,
    output_zero_point: i32,
}

impl AddParams {
    /// From the operands' and output's quantization; `None` when the scale ratios are
    /// outside the range XNNPACK supports (2^-10 .. 2^8).
    pub(crate) fn new(
        (sa, za): (f32, i32),
        (sb, zb): (f32, i32),
        (so, zo): (f32, i32),
    ) -> Option<AddParams> {
        let a = sa / so;
        let b = sb / so;
        let (aa, ab) = (a.abs(), b.abs());
        let range = |s: f32| (2f32.powi(-10)..2f32.powi(8)).contains(&s);
        if !range(aa) || !range(ab) {
            return None;
        }
        let max = aa.max(ab);
        let exponent = ((max.to_bits() >> 23) as i32) - 127;
        let shift = u32::try_from(20 - exponent)
            .ok()
            .filter(|s| (12..=30).contains(s))?;
        let mult = |s: f32| rint(f32::from_bits(s.to_bits() + (shift << 23)));
        let am = if a.is_sign_negative() {
            -mult(aa)
        } else {
            mult(aa)
        };
        let bm = if b.is_sign_negative() {
            -mult(ab)
        } else {
            mult(ab)
        };
        let rounding = 1i32 << (shift - 1);
        Some(AddParams {
            bias: rounding
                .wrapping_sub(am.wrapping_mul(za))
                .wrapping_sub(bm.wrapping_mul(zb)),
            a_multiplier: am,
            b_multiplier: bm,
            shift,
            output_zero_point: zo,
        })
    }

    /// The addition with the node's output bounds, for the vectorized loop.
    pub(crate) fn with_bounds(&self, min: i32, max: i32) -> QAdd {
        QAdd {
            bias: self.bias,
            a_multiplier: self.a_multiplier,
            b_multiplier: self.b_multiplier,
            shift: self.shift,
            zero: self.output_zero_point,
            min,
            max,
        }
    }

    /// One element (before the node's clamp), saturated to the type.
    #[inline(always)]
    pub(crate) fn apply<T: Q8>(&self, a: i32, b: i32) -> i32 {
        let acc = self
            .bias
            .wrapping_add(a.wrapping_mul(self.a_multiplier))
            .wrapping_add(b.wrapping_mul(self.b_multiplier));
        ((acc >> self.shift) + self.output_zero_point).clamp(T::MIN, T::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requantization_rounds_half_to_even_and_clamps() {
        let r = Requant::new(3, -128, 127);
        assert_eq!(r.apply(5, 0.5), 2 + 3); // 2.5 -> 2
        assert_eq!(r.apply(7, 0.5), 4 + 3); // 3.5 -> 4
        assert_eq!(r.apply(1_000_000, 1.0), 127);
        assert_eq!(r.apply(-1_000_000, 1.0), -128);
        let r = Requant::new(0, 0, 6);
        assert_eq!(r.apply(100, 1.0), 6);
    }

    #[test]
    fn rint_rounds_as_the_library_does() {
        let mut values = vec![
            0.5f32,
            1.5,
            2.5,
            -0.5,
            -2.5,
            0.49999997,
            8_388_607.5,
            4_194_303.5,
        ];
        values.extend([
            -0.0,
            1e10,
            -1e10,
            3e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        // Every float from 2^-3 to 2^25, positive and negative, on a coarse stride.
        let mut b = 0.125f32.to_bits();
        while f32::from_bits(b) < 33_554_432.0 {
            values.extend([f32::from_bits(b), -f32::from_bits(b)]);
            b += 997;
        }
        for x in values {
            assert_eq!(rint(x), x.round_ties_even() as i32, "{x}");
            if x.abs() < 4_194_304.0 {
                assert_eq!(pte_compute::qconv::round_small(x), rint(x), "{x}");
            }
        }
    }

    #[test]
    fn bounds_saturate() {
        assert_eq!(
            bounds::<i8>(f32::NEG_INFINITY, f32::INFINITY, 0.1, 5),
            (-128, 127)
        );
        assert_eq!(bounds::<u8>(0.0, 6.0, 0.05, 10), (10, 130));
    }

    #[test]
    fn fixed_point_addition_matches_the_float_formula() {
        let p = AddParams::new((0.02, 3), (0.05, -7), (0.06, 1)).unwrap();
        for a in -128..=127 {
            for b in [-128, -50, 0, 17, 127] {
                let want = ((0.02 * (a - 3) as f64 + 0.05 * (b + 7) as f64) / 0.06 + 1.0).round();
                let got = p.apply::<i8>(a, b);
                assert!(
                    (f64::from(got) - want.clamp(-128.0, 127.0)).abs() <= 1.0,
                    "{a} {b}"
                );
            }
        }
        assert!(AddParams::new((1.0, 0), (1.0, 0), (1e-6, 0)).is_none());
    }
}
