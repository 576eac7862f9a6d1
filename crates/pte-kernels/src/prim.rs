//! Prim ops: scalar arithmetic on symbolic sizes and values read from tensors, tensor size
//! queries, and the `et_view` / `et_copy_index` helpers the exporter emits for dynamic
//! shapes and loops.
//!
//! Scalar arithmetic follows Python on the exact values, as eager PyTorch's symbolic
//! values do: `int op int` stays an integer (an overflow of int64 is an error, since
//! Python's integers do not overflow), anything with a float is a float, true division
//! gives a float, floor division and modulo round toward negative infinity (the modulo
//! takes the divisor's sign, zero results too), `round` halves to even, and comparisons
//! of integers with floats are exact. Bools count as integers. A result takes its own
//! kind, whatever the program declared (the exporter declares every symbolic scalar an
//! `Int`), as upstream does.

use std::cmp::Ordering;

use pte_runtime::{Args, KernelError, KernelRegistry, KernelResult, Scalar};

use crate::util::to_size;

/// A Python number: an integer or a float.
#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn at(args: &Args<'_>, i: usize) -> KernelResult<Self> {
        Ok(match args.scalar(i)? {
            Scalar::Int(v) => Num::Int(v),
            Scalar::Bool(b) => Num::Int(i64::from(b)),
            Scalar::Double(v) => Num::Float(v),
        })
    }

    fn float(self) -> f64 {
        match self {
            Num::Int(v) => v as f64,
            Num::Float(v) => v,
        }
    }

    fn scalar(self) -> Scalar {
        match self {
            Num::Int(v) => Scalar::Int(v),
            Num::Float(v) => Scalar::Double(v),
        }
    }
}

fn overflow(op: &str) -> KernelError {
    KernelError::invalid(format!("integer overflow in {op}"))
}

fn zero_division() -> KernelError {
    KernelError::invalid("division by zero")
}

/// Python's `divmod` of floats (CPython's `float_divmod`): the floor quotient and the
/// remainder with the divisor's sign.
fn float_divmod(a: f64, b: f64) -> (f64, f64) {
    let m = a % b;
    let mut d = (a - m) / b;
    let m = if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            d -= 1.0;
            m + b
        } else {
            m
        }
    } else {
        0.0f64.copysign(b)
    };
    let q = if d != 0.0 {
        let f = d.floor();
        if d - f > 0.5 {
            f + 1.0
        } else {
            f
        }
    } else {
        0.0f64.copysign(a / b)
    };
    (q, m)
}

/// Python's `divmod` of integers: the floor quotient and the remainder with the
/// divisor's sign.
fn int_divmod(a: i64, b: i64) -> KernelResult<(i64, i64)> {
    if b == 0 {
        return Err(zero_division());
    }
    let (q, r) = (
        a.checked_div(b).ok_or_else(|| overflow("floor division"))?,
        a.wrapping_rem(b),
    );
    if r != 0 && ((r < 0) != (b < 0)) {
        Ok((q - 1, r + b))
    } else {
        Ok((q, r))
    }
}

/// The binary arithmetic of Python numbers.
#[derive(Clone, Copy)]
enum Arith {
    Add,
    Sub,
    Mul,
    TrueDiv,
    FloorDiv,
    Mod,
    Max,
    Min,
}

fn arith(op: Arith, a: Num, b: Num) -> KernelResult<Num> {
    use Arith::*;
    Ok(match (a, b) {
        (Num::Int(x), Num::Int(y)) => Num::Int(match op {
            Add => x.checked_add(y).ok_or_else(|| overflow("addition"))?,
            Sub => x.checked_sub(y).ok_or_else(|| overflow("subtraction"))?,
            Mul => x.checked_mul(y).ok_or_else(|| overflow("multiplication"))?,
            TrueDiv if y == 0 => return Err(zero_division()),
            TrueDiv => return Ok(Num::Float(x as f64 / y as f64)),
            FloorDiv => int_divmod(x, y)?.0,
            Mod => int_divmod(x, y)?.1,
            Max => x.max(y),
            Min => x.min(y),
        }),
        _ => {
            let (x, y) = (a.float(), b.float());
            Num::Float(match op {
                Add => x + y,
                Sub => x - y,
                Mul => x * y,
                TrueDiv | FloorDiv | Mod if y == 0.0 => return Err(zero_division()),
                TrueDiv => x / y,
                FloorDiv => float_divmod(x, y).0,
                Mod => float_divmod(x, y).1,
                // Python's max/min keep the first operand on ties and NaN comparisons.
                Max => {
                    if y > x {
                        y
                    } else {
                        x
                    }
                }
                Min => {
                    if y < x {
                        y
                    } else {
                        x
                    }
                }
            })
        }
    })
}

fn binary(args: &mut Args<'_>, op: Arith) -> KernelResult {
    let out = arith(op, Num::at(args, 0)?, Num::at(args, 1)?)?;
    args.set_scalar(2, out.scalar())
}

/// Python's comparison of two numbers, exact between integers and floats (None when a
/// NaN is involved: every comparison but `!=` is false).
fn cmp(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(&y),
        (Num::Int(i), Num::Float(f)) => int_float(i, f),
        (Num::Float(f), Num::Int(i)) => int_float(i, f).map(Ordering::reverse),
    }
}

/// `i` compared with `f` on their exact values.
fn int_float(i: i64, f: f64) -> Option<Ordering> {
    match (i as f64).partial_cmp(&f)? {
        // Equal after rounding `i`: `f` is an integer in i64's range (or just past it),
        // compare exactly.
        Ordering::Equal => Some(i128::from(i).cmp(&(f as i128))),
        other => Some(other),
    }
}

fn compare(args: &mut Args<'_>, test: fn(Option<Ordering>) -> bool) -> KernelResult {
    let out = test(cmp(Num::at(args, 0)?, Num::at(args, 1)?));
    args.set_scalar(2, Scalar::Bool(out))
}

/// A float rounded to an integer (`ceil`, `round`, `trunc`, `int()`): an error when it is
/// not finite or past int64.
fn to_int(v: f64, op: &str) -> KernelResult<i64> {
    if v.is_finite() && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&v) {
        Ok(v as i64)
    } else {
        Err(KernelError::invalid(format!("{op} of {v} is not an int64")))
    }
}

/// A function of one number: integers keep their value, floats are rounded by `round`.
fn rounding(args: &mut Args<'_>, round: fn(f64) -> f64, op: &str) -> KernelResult {
    let out = match Num::at(args, 0)? {
        Num::Int(v) => v,
        Num::Float(v) => to_int(round(v), op)?,
    };
    args.set_scalar(1, Scalar::Int(out))
}

fn sym_size(args: &mut Args<'_>) -> KernelResult {
    let t = args.info(0)?;
    let d = t.dim(args.int(1)?)?;
    let size = t.sizes.get(d).copied().unwrap_or(1);
    args.set_scalar(2, Scalar::Int(size as i64))
}

fn sym_numel(args: &mut Args<'_>) -> KernelResult {
    let n = args.info(0)?.numel();
    args.set_scalar(1, Scalar::Int(n as i64))
}

fn local_scalar_dense(args: &mut Args<'_>) -> KernelResult {
    let t = args.read(0)?;
    if t.info.numel() == 0 {
        return Err(KernelError::invalid(
            "_local_scalar_dense of an empty tensor",
        ));
    }
    let value = crate::layout::first_scalar(t.info, t.bytes())?;
    args.set_scalar(1, value)
}

/// `et_view(self, size, out)`: `out` becomes a view of `self` with new sizes (one may be
/// -1, inferred).
fn et_view(args: &mut Args<'_>) -> KernelResult {
    let src = args.info(0)?;
    let requested = args.int_list(1)?;
    let sizes = crate::util::infer_sizes(&requested, src.numel())?;
    args.alias(2, 0, &sizes)
}

/// `et_copy_index(copy_to, copy_from, index)`: writes `copy_from` as row `index` of
/// `copy_to`, growing `copy_to`'s first dimension to `index + 1` (how loops stack their
/// per-iteration results).
fn et_copy_index(args: &mut Args<'_>) -> KernelResult {
    let to = args.info(0)?;
    let from = args.tensor(1)?;
    let index = to_size(args.int(2)?, "et_copy_index index")?;
    if to.dtype != from.dtype {
        return Err(KernelError::dtypes(&[to.dtype, from.dtype]));
    }
    let Some((&rows, row_sizes)) = to.sizes.split_first() else {
        return Err(KernelError::invalid(
            "et_copy_index: the destination is 0-d",
        ));
    };
    if row_sizes != from.sizes.as_slice() {
        return Err(KernelError::invalid(format!(
            "cannot copy a {:?} tensor into a row of {:?}",
            from.sizes.as_slice(),
            to.sizes.as_slice()
        )));
    }
    let mut sizes = to.sizes.clone();
    if let Some(first) = sizes.first_mut() {
        *first = rows.max(index.saturating_add(1));
    }
    args.resize(0, &sizes)?;
    let row = from.nbytes();
    let mut io = args.io(&[1.into()], &[0.into()])?;
    let (Some(src), Some(dst)) = (io.inputs.first(), io.outputs.first_mut()) else {
        return Err(crate::util::oob());
    };
    let start = index.saturating_mul(row);
    dst.bytes_mut()
        .get_mut(start..start.saturating_add(row))
        .ok_or_else(|| KernelError::invalid("et_copy_index: row out of range"))?
        .copy_from_slice(src.bytes());
    Ok(())
}

/// Registers the prim ops.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::sym_size.int", sym_size);
    r.register_fn("aten::sym_numel", sym_numel);
    r.register_fn("aten::_local_scalar_dense", local_scalar_dense);
    r.register_fn("executorch_prim::et_view.default", et_view);
    r.register_fn("executorch_prim::et_copy_index.tensor", et_copy_index);
    r.register_fn("executorch_prim::add.Scalar", |a| binary(a, Arith::Add));
    r.register_fn("executorch_prim::sub.Scalar", |a| binary(a, Arith::Sub));
    r.register_fn("executorch_prim::mul.Scalar", |a| binary(a, Arith::Mul));
    r.register_fn("executorch_prim::truediv.Scalar", |a| {
        binary(a, Arith::TrueDiv)
    });
    r.register_fn("executorch_prim::floordiv.Scalar", |a| {
        binary(a, Arith::FloorDiv)
    });
    r.register_fn("executorch_prim::floordiv.int", |a| {
        binary(a, Arith::FloorDiv)
    });
    r.register_fn("executorch_prim::mod.Scalar", |a| binary(a, Arith::Mod));
    r.register_fn("executorch_prim::mod.int", |a| binary(a, Arith::Mod));
    r.register_fn("executorch_prim::sym_max.Scalar", |a| binary(a, Arith::Max));
    r.register_fn("executorch_prim::sym_min.Scalar", |a| binary(a, Arith::Min));
    r.register_fn("executorch_prim::eq.Scalar", |a| {
        compare(a, |o| o == Some(Ordering::Equal))
    });
    r.register_fn("executorch_prim::gt.Scalar", |a| {
        compare(a, |o| o == Some(Ordering::Greater))
    });
    r.register_fn("executorch_prim::ge.Scalar", |a| {
        compare(a, |o| {
            matches!(o, Some(Ordering::Greater | Ordering::Equal))
        })
    });
    r.register_fn("executorch_prim::lt.Scalar", |a| {
        compare(a, |o| o == Some(Ordering::Less))
    });
    r.register_fn("executorch_prim::le.Scalar", |a| {
        compare(a, |o| matches!(o, Some(Ordering::Less | Ordering::Equal)))
    });
    r.register_fn("executorch_prim::neg.Scalar", |a| {
        let out = match Num::at(a, 0)? {
            Num::Int(v) => Num::Int(v.checked_neg().ok_or_else(|| overflow("negation"))?),
            Num::Float(v) => Num::Float(-v),
        };
        a.set_scalar(1, out.scalar())
    });
    r.register_fn("executorch_prim::ceil.Scalar", |a| {
        rounding(a, f64::ceil, "ceil")
    });
    r.register_fn("executorch_prim::round.Scalar", |a| {
        rounding(a, f64::round_ties_even, "round")
    });
    r.register_fn("executorch_prim::trunc.Scalar", |a| {
        rounding(a, f64::trunc, "trunc")
    });
    r.register_fn("executorch_prim::sym_int.Scalar", |a| {
        rounding(a, f64::trunc, "int")
    });
    r.register_fn("executorch_prim::sym_float.Scalar", |a| {
        let v = Num::at(a, 0)?.float();
        a.set_scalar(1, Scalar::Double(v))
    });
    r.register_fn("executorch_prim::sym_not.Scalar", |a| {
        let v = a.scalar(0)?.to_bool();
        a.set_scalar(1, Scalar::Bool(!v))
    });
    r.register_fn("executorch_prim::sym_ite.Scalar", |a| {
        let c = a.scalar(0)?.to_bool();
        let v = if c { a.scalar(1)? } else { a.scalar(2)? };
        a.set_scalar(3, v)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(op: Arith, a: f64, b: f64) -> f64 {
        match arith(op, Num::Float(a), Num::Float(b)).unwrap() {
            Num::Float(v) => v,
            Num::Int(_) => f64::NAN,
        }
    }

    #[test]
    fn python_division_and_modulo() {
        assert_eq!(int_divmod(-7, 2).unwrap(), (-4, 1));
        assert_eq!(int_divmod(7, -2).unwrap(), (-4, -1));
        assert_eq!(int_divmod(-1, 3).unwrap(), (-1, 2));
        assert!(int_divmod(i64::MIN, -1).is_err());
        assert_eq!(f(Arith::Mod, 0.5, -2.0), -1.5);
        assert_eq!(f(Arith::Mod, -7.5, 2.0), 0.5);
        assert!(f(Arith::Mod, -0.0, 3.0).is_sign_positive());
        assert_eq!(f(Arith::FloorDiv, 7.5, -2.0), -4.0);
        assert!(f(Arith::FloorDiv, -0.0, 3.0).is_sign_negative());
        assert!(arith(Arith::TrueDiv, Num::Int(1), Num::Int(0)).is_err());
    }

    #[test]
    fn integers_and_floats_compare_exactly() {
        let big = 1i64 << 53;
        assert_eq!(
            cmp(Num::Int(big + 1), Num::Float(big as f64)),
            Some(Ordering::Greater)
        );
        assert_eq!(cmp(Num::Float(2.5), Num::Int(2)), Some(Ordering::Greater));
        assert_eq!(cmp(Num::Int(3), Num::Float(f64::NAN)), None);
        assert_eq!(
            cmp(Num::Int(i64::MAX), Num::Float(9.3e18)),
            Some(Ordering::Less)
        );
    }
}
