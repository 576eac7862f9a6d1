//! Elementwise operators: arithmetic, comparisons, logical and bitwise ops, `where`, the
//! clamp family, unary math and activations, and `scalar_tensor`.
//!
//! PyTorch semantics: operands broadcast, and binary ops compute in PyTorch's result
//! type of their operands (tensors with dimensions first, then zero-dim tensors, then
//! scalars), integers in their own type with wrapping arithmetic, `float16`/`bfloat16`
//! through `f32`; float functions of integers compute in `float32`. Results are written
//! in the output's dtype; a float result into an integer output is an error, as is an
//! integer division by zero. Where upstream differs from PyTorch, upstream wins: integer
//! `remainder` truncates like C's `%`. Unsigned types wider than a byte are not
//! supported (PyTorch has no elementwise kernels for them either).
//!
//! Each operator is an element operation (`ops`) run by one broadcasting engine
//! (`engine`): a flat loop when every operand has the output's shape or one element
//! (on several threads for large tensors), else rows along the innermost dimensions
//! (merged where possible), with inner loops over plain slices. Operands of the
//! output's shape and dim order are read in memory order, so channels-last tensors work
//! without a copy.

mod complex;
mod engine;
mod ops;

use pte_runtime::{Args, DType, KernelError, KernelRegistry, KernelResult, Scalar};
use smallvec::SmallVec;

use engine::{check_out, float_type, map_any, map_compare, map_float, map_int, result_type};
use engine::{Compare, FloatOp, IntOp, Operand};
use ops::*;

use crate::num::Int;

/// Operands 0 and 1 (tensors or scalars).
fn two(args: &Args<'_>) -> KernelResult<[Operand; 2]> {
    Ok([Operand::at(args, 0)?, Operand::at(args, 1)?])
}

/// `op(self, other, ..., out)` computed in the promoted type.
fn binary<O: FloatOp<2> + IntOp<2>>(args: &mut Args<'_>, out: usize, op: O) -> KernelResult {
    let operands = two(args)?;
    let compute = check_out(args, result_type(args, &operands)?, out)?;
    map_any(args, operands, out, compute, &op)
}

/// A float function of two operands (`div`, `atan2`): integers promote to float32.
fn binary_float(args: &mut Args<'_>, out: usize, op: impl FloatOp<2>) -> KernelResult {
    let operands = two(args)?;
    let compute = check_out(args, float_type(result_type(args, &operands)?), out)?;
    map_float(args, operands, out, compute, &op)
}

/// `add`/`sub(self, other, alpha, out)`: `self + sign * alpha * other`; `rsub` swaps the
/// operands.
fn add(args: &mut Args<'_>, sign: i64, swap: bool) -> KernelResult {
    let [a, b] = two(args)?;
    let operands = if swap { [b, a] } else { [a, b] };
    let alpha = args.scalar(2)?;
    if complex::involved(args, &operands, 3)? {
        let k = alpha.to_f64() * sign as f64;
        return complex::binary(args, operands, 3, |a, b| a + b * k);
    }
    let compute = check_out(args, result_type(args, &operands)?, 3)?;
    if !compute.is_float() && matches!(alpha, Scalar::Double(_)) {
        return Err(KernelError::invalid(
            "alpha must be an integer for integer inputs",
        ));
    }
    if compute == DType::Bool && sign < 0 {
        return Err(KernelError::invalid(
            "subtraction of bool tensors is not supported: use logical_xor",
        ));
    }
    let op = Add {
        int: alpha.to_i64().wrapping_mul(sign),
        float: alpha.to_f64() * sign as f64,
    };
    map_any(args, operands, 3, compute, &op)
}

/// `mul(self, other, out)`, complex operands too.
fn mul(args: &mut Args<'_>) -> KernelResult {
    let operands = two(args)?;
    if complex::involved(args, &operands, 2)? {
        return complex::binary(args, operands, 2, |a, b| a * b);
    }
    binary(args, 2, Mul)
}

/// True division of operands 0 and 1 into `out`, complex operands too.
fn div(args: &mut Args<'_>, out: usize) -> KernelResult {
    let operands = two(args)?;
    if complex::involved(args, &operands, out)? {
        return complex::binary(args, operands, out, |a, b| a / b);
    }
    binary_float(args, out, Div)
}

/// `div(self, other, rounding_mode, out)`: true division for None, else rounded
/// ("trunc", "floor"), integers staying integers.
fn div_mode(args: &mut Args<'_>) -> KernelResult {
    if args.is_none(2)? {
        return div(args, 3);
    }
    let floor = match args.string(2)? {
        "trunc" => false,
        "floor" => true,
        other => {
            return Err(KernelError::invalid(format!(
                "rounding_mode must be None, \"trunc\" or \"floor\", not {other:?}"
            )))
        }
    };
    if floor {
        binary(args, 3, DivFloor)
    } else {
        binary(args, 3, DivTrunc)
    }
}

/// A comparison of two operands in their promoted type, written as 0/1.
fn compare(args: &mut Args<'_>, op: impl Compare) -> KernelResult {
    let operands = two(args)?;
    let compute = result_type(args, &operands)?;
    map_compare(args, operands, 2, compute, &op)
}

/// `bitwise_*` on integers or bools.
fn bitwise(args: &mut Args<'_>, op: impl IntOp<2>) -> KernelResult {
    let operands = two(args)?;
    let compute = check_out(args, result_type(args, &operands)?, 2)?;
    map_int(args, operands, 2, compute, &op)
}

/// `logical_*`: operands as bools (non-zero is true), output of any dtype.
fn logical(args: &mut Args<'_>, op: impl IntOp<2>) -> KernelResult {
    let operands = two(args)?;
    map_int(args, operands, 2, DType::Bool, &op)
}

/// `bitwise_not`: `!x` on integers, logical not on bools.
fn bitwise_not(args: &mut Args<'_>) -> KernelResult {
    let dtype = check_out(args, args.info(0)?.dtype, 1)?;
    let x = [Operand::Tensor(0)];
    if dtype == DType::Bool {
        map_int(args, x, 1, dtype, &LogicalNot)
    } else {
        map_int(args, x, 1, dtype, &BitNot)
    }
}

/// `where(condition, self, other, out)`, all three broadcast.
fn where_self(args: &mut Args<'_>) -> KernelResult {
    let cond = args.info(0)?.dtype;
    if !matches!(cond, DType::Bool | DType::U8) {
        return Err(KernelError::invalid(format!(
            "where expects a bool condition, not {cond}"
        )));
    }
    let [a, b] = [Operand::at(args, 1)?, Operand::at(args, 2)?];
    let compute = check_out(args, result_type(args, &[a, b])?, 3)?;
    map_any(args, [Operand::Tensor(0), a, b], 3, compute, &Where)
}

/// An optional bound of `clamp`: None, a scalar or a tensor.
fn bound(args: &Args<'_>, i: usize) -> KernelResult<Option<Operand>> {
    if args.is_none(i)? {
        Ok(None)
    } else {
        Operand::at(args, i).map(Some)
    }
}

/// `clamp(self, min, max, out)` with scalar or tensor bounds (at least one), in the
/// promoted type of the input and the bounds.
fn clamp(args: &mut Args<'_>) -> KernelResult {
    let (lo, hi) = (bound(args, 1)?, bound(args, 2)?);
    if lo.is_none() && hi.is_none() {
        return Err(KernelError::invalid("clamp needs a min or a max"));
    }
    let present: SmallVec<[Operand; 3]> = [Some(Operand::Tensor(0)), lo, hi]
        .into_iter()
        .flatten()
        .collect();
    let compute = check_out(args, result_type(args, &present)?, 3)?;
    clamp_in(args, compute, lo, hi)
}

/// `hardtanh(self, min_val, max_val, out)`: a clamp in the input's dtype.
fn hardtanh(args: &mut Args<'_>) -> KernelResult {
    let compute = check_out(args, args.info(0)?.dtype, 3)?;
    let (lo, hi) = (Operand::at(args, 1)?, Operand::at(args, 2)?);
    clamp_in(args, compute, Some(lo), Some(hi))
}

fn clamp_in(
    args: &mut Args<'_>,
    compute: DType,
    lo: Option<Operand>,
    hi: Option<Operand>,
) -> KernelResult {
    // An absent bound is a placeholder operand the operation ignores.
    let unused = Operand::Scalar(Scalar::Int(0));
    let op = Clamp {
        lo: lo.is_some(),
        hi: hi.is_some(),
    };
    let operands = [
        Operand::Tensor(0),
        saturate(lo, compute).unwrap_or(unused),
        saturate(hi, compute).unwrap_or(unused),
    ];
    map_any(args, operands, 3, compute, &op)
}

/// A scalar bound of an integer compute type (`hardtanh` of integers), limited to the
/// type's range: PyTorch compares before narrowing (`clamp(uint8, -2, 3)` keeps 0, not
/// 254). A fractional bound clamps in floating point and the result is truncated, which
/// is the same as clamping to the truncated bound (truncation is monotonic).
fn saturate(bound: Option<Operand>, compute: DType) -> Option<Operand> {
    let bound = match bound {
        Some(Operand::Scalar(Scalar::Double(v))) if compute.is_int() && !v.is_nan() => {
            // (`as` saturates infinities to the i64 range, clamped below.)
            Some(Operand::Scalar(Scalar::Int(v.trunc() as i64)))
        }
        other => other,
    };
    match bound {
        Some(Operand::Scalar(Scalar::Int(v))) if compute.is_int() => {
            let (lo, hi) =
                crate::dispatch_int!(compute, T => (T::MIN_I64, T::MAX_I64), (i64::MIN, i64::MAX));
            Some(Operand::Scalar(Scalar::Int(v.clamp(lo, hi))))
        }
        other => other,
    }
}

/// A function of one tensor in its own dtype; `bools` allows bool inputs.
fn unary<O: FloatOp<1> + IntOp<1>>(args: &mut Args<'_>, op: O, bools: bool) -> KernelResult {
    let dtype = args.info(0)?.dtype;
    if dtype == DType::Bool && !bools {
        return Err(KernelError::dtypes(&[dtype]));
    }
    let compute = check_out(args, dtype, 1)?;
    map_any(args, [Operand::Tensor(0)], 1, compute, &op)
}

/// A float function of one tensor (integers and bools promote to float32).
fn unary_float(args: &mut Args<'_>, out: usize, op: impl FloatOp<1>) -> KernelResult {
    let compute = check_out(args, float_type(args.info(0)?.dtype), out)?;
    map_float(args, [Operand::Tensor(0)], out, compute, &op)
}

/// A test of each element (`isnan`, `isinf`), written as 0/1 in the output's dtype.
fn predicate<O: FloatOp<1> + IntOp<1>>(args: &mut Args<'_>, op: O) -> KernelResult {
    let dtype = args.info(0)?.dtype;
    map_any(args, [Operand::Tensor(0)], 1, dtype, &op)
}

/// `gelu(self, approximate, out)`.
fn gelu(args: &mut Args<'_>) -> KernelResult {
    let tanh = match args.string(1)? {
        "none" => false,
        "tanh" => true,
        other => {
            return Err(KernelError::invalid(format!(
                "gelu approximate must be \"none\" or \"tanh\", not {other:?}"
            )))
        }
    };
    if tanh {
        unary_float(args, 2, GeluTanh)
    } else {
        unary_float(args, 2, Gelu)
    }
}

/// A float scalar argument.
fn real(args: &Args<'_>, i: usize) -> KernelResult<f64> {
    args.scalar(i).map(Scalar::to_f64)
}

/// `scalar_tensor(s, out)`: a 0-d tensor holding `s` in the output's dtype.
fn scalar_tensor(args: &mut Args<'_>) -> KernelResult {
    let s = args.scalar(0)?;
    let dtype = args.info(1)?.dtype;
    map_any(args, [Operand::Scalar(s)], 1, dtype, &Identity)
}

/// Registers the elementwise kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::add.out", |a| add(a, 1, false));
    r.register_fn("aten::add.Scalar_out", |a| add(a, 1, false));
    r.register_fn("aten::sub.out", |a| add(a, -1, false));
    r.register_fn("aten::sub.Scalar_out", |a| add(a, -1, false));
    r.register_fn("aten::rsub.Scalar_out", |a| add(a, -1, true));
    r.register_fn("aten::mul.out", mul);
    r.register_fn("aten::mul.Scalar_out", mul);
    r.register_fn("aten::div.out", |a| div(a, 2));
    r.register_fn("aten::div.Scalar_out", |a| div(a, 2));
    r.register_fn("aten::div.out_mode", div_mode);
    r.register_fn("aten::div.Scalar_mode_out", div_mode);
    r.register_fn("aten::remainder.Tensor_out", |a| binary(a, 2, Remainder));
    r.register_fn("aten::remainder.Scalar_out", |a| binary(a, 2, Remainder));
    r.register_fn("aten::fmod.Tensor_out", |a| binary(a, 2, Fmod));
    r.register_fn("aten::fmod.Scalar_out", |a| binary(a, 2, Fmod));
    r.register_fn("aten::pow.Tensor_Tensor_out", |a| binary(a, 2, Pow));
    r.register_fn("aten::pow.Tensor_Scalar_out", |a| binary(a, 2, Pow));
    r.register_fn("aten::pow.Scalar_out", |a| binary(a, 2, Pow));
    r.register_fn("aten::maximum.out", |a| binary(a, 2, Maximum));
    r.register_fn("aten::minimum.out", |a| binary(a, 2, Minimum));
    r.register_fn("aten::atan2.out", |a| binary_float(a, 2, Atan2));

    for overload in ["Tensor_out", "Scalar_out"] {
        let name = |op: &str| format!("aten::{op}.{overload}");
        r.register_fn(&name("eq"), |a| compare(a, Eq));
        r.register_fn(&name("ne"), |a| compare(a, Ne));
        r.register_fn(&name("gt"), |a| compare(a, Gt));
        r.register_fn(&name("ge"), |a| compare(a, Ge));
        r.register_fn(&name("lt"), |a| compare(a, Lt));
        r.register_fn(&name("le"), |a| compare(a, Le));
        r.register_fn(&name("bitwise_and"), |a| bitwise(a, BitAnd));
        r.register_fn(&name("bitwise_or"), |a| bitwise(a, BitOr));
        r.register_fn(&name("bitwise_xor"), |a| bitwise(a, BitXor));
    }
    r.register_fn("aten::bitwise_not.out", bitwise_not);
    for overload in ["Tensor_out", "Tensor_Scalar_out"] {
        let name = |d: &str| format!("aten::bitwise_{d}_shift.{overload}");
        r.register_fn(&name("left"), |a| bitwise(a, ShiftLeft));
        r.register_fn(&name("right"), |a| bitwise(a, ShiftRight));
    }
    r.register_fn("aten::floor_divide.out", |a| binary(a, 2, DivFloor));
    r.register_fn("aten::logical_and.out", |a| logical(a, BitAnd));
    r.register_fn("aten::logical_or.out", |a| logical(a, BitOr));
    r.register_fn("aten::logical_xor.out", |a| logical(a, BitXor));
    r.register_fn("aten::logical_not.out", |a| {
        map_int(a, [Operand::Tensor(0)], 1, DType::Bool, &LogicalNot)
    });
    r.register_fn("aten::where.self_out", where_self);

    r.register_fn("aten::clamp.out", clamp);
    r.register_fn("aten::clamp.Tensor_out", clamp);
    r.register_fn("aten::hardtanh.out", hardtanh);
    r.register_fn("aten::relu.out", |a| unary(a, Relu, false));

    r.register_fn("aten::abs.out", |a| {
        if a.tensor(0)?.dtype.is_complex() {
            complex::abs(a)
        } else {
            unary(a, Abs, false)
        }
    });
    r.register_fn("aten::neg.out", |a| unary(a, Neg, false));
    r.register_fn("aten::floor.out", |a| unary(a, Floor, false));
    r.register_fn("aten::ceil.out", |a| unary(a, Ceil, false));
    r.register_fn("aten::round.out", |a| unary(a, Round, false));
    r.register_fn("aten::trunc.out", |a| unary(a, Trunc, false));
    r.register_fn("aten::sign.out", |a| unary(a, Sign, true));
    r.register_fn("aten::isnan.out", |a| predicate(a, IsNan));
    r.register_fn("aten::isinf.out", |a| predicate(a, IsInf));
    r.register_fn("aten::exp.out", |a| unary_float(a, 1, Exp));
    r.register_fn("aten::expm1.out", |a| unary_float(a, 1, Expm1));
    r.register_fn("aten::log.out", |a| unary_float(a, 1, Log));
    r.register_fn("aten::log2.out", |a| unary_float(a, 1, Log2));
    r.register_fn("aten::log10.out", |a| unary_float(a, 1, Log10));
    r.register_fn("aten::log1p.out", |a| unary_float(a, 1, Log1p));
    r.register_fn("aten::sqrt.out", |a| unary_float(a, 1, Sqrt));
    r.register_fn("aten::rsqrt.out", |a| unary_float(a, 1, Rsqrt));
    r.register_fn("aten::reciprocal.out", |a| unary_float(a, 1, Reciprocal));
    r.register_fn("aten::sin.out", |a| unary_float(a, 1, Sin));
    r.register_fn("aten::cos.out", |a| unary_float(a, 1, Cos));
    r.register_fn("aten::tan.out", |a| unary_float(a, 1, Tan));
    r.register_fn("aten::asin.out", |a| unary_float(a, 1, Asin));
    r.register_fn("aten::acos.out", |a| unary_float(a, 1, Acos));
    r.register_fn("aten::atan.out", |a| unary_float(a, 1, Atan));
    r.register_fn("aten::sinh.out", |a| unary_float(a, 1, Sinh));
    r.register_fn("aten::cosh.out", |a| unary_float(a, 1, Cosh));
    r.register_fn("aten::asinh.out", |a| unary_float(a, 1, Asinh));
    r.register_fn("aten::acosh.out", |a| unary_float(a, 1, Acosh));
    r.register_fn("aten::atanh.out", |a| unary_float(a, 1, Atanh));
    // logit(self, eps?, out).
    r.register_fn("aten::logit.out", |a| {
        let eps = a.opt_double(1)?;
        unary_float(a, 2, Logit(eps))
    });
    r.register_fn("aten::tanh.out", |a| unary_float(a, 1, Tanh));
    r.register_fn("aten::sigmoid.out", |a| unary_float(a, 1, Sigmoid));
    r.register_fn("aten::erf.out", |a| unary_float(a, 1, Erf));

    r.register_fn("aten::gelu.out", gelu);
    r.register_fn("aten::hardswish.out", |a| unary_float(a, 1, Hardswish));
    r.register_fn("aten::hardsigmoid.out", |a| unary_float(a, 1, Hardsigmoid));
    r.register_fn("aten::silu.out", |a| unary_float(a, 1, Silu));
    r.register_fn("aten::elu.out", |a| {
        let op = Elu {
            alpha: real(a, 1)?,
            scale: real(a, 2)?,
            input_scale: real(a, 3)?,
        };
        unary_float(a, 4, op)
    });
    r.register_fn("aten::leaky_relu.out", |a| {
        let op = LeakyRelu(real(a, 1)?);
        unary_float(a, 2, op)
    });
    r.register_fn("aten::softplus.out", |a| {
        let op = Softplus {
            beta: real(a, 1)?,
            threshold: real(a, 2)?,
        };
        unary_float(a, 3, op)
    });

    r.register_fn("aten::scalar_tensor.out", scalar_tensor);
}
