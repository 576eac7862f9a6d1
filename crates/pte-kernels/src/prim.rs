//! Prim ops: scalar arithmetic on symbolic sizes, tensor size queries, and the
//! `et_view` / `et_copy_index` helpers the exporter emits for dynamic shapes and loops.

use pte_runtime::{Args, KernelError, KernelRegistry, KernelResult, Scalar};

use crate::util::to_size;

fn binary(
    args: &mut Args<'_>,
    int: fn(i64, i64) -> KernelResult<Scalar>,
    float: fn(f64, f64) -> Scalar,
) -> KernelResult {
    let (a, b) = (args.scalar(0)?, args.scalar(1)?);
    let out = match (a, b) {
        (Scalar::Int(x), Scalar::Int(y)) => int(x, y)?,
        (Scalar::Bool(_), _) | (_, Scalar::Bool(_)) => {
            return Err(KernelError::invalid(format!(
                "{a:?} and {b:?}: expected numbers"
            )))
        }
        _ => float(a.to_f64(), b.to_f64()),
    };
    args.set_scalar(2, out)
}

fn compare(
    args: &mut Args<'_>,
    int: fn(&i64, &i64) -> bool,
    float: fn(&f64, &f64) -> bool,
) -> KernelResult {
    let out = match (args.scalar(0)?, args.scalar(1)?) {
        (Scalar::Int(x), Scalar::Int(y)) => int(&x, &y),
        (Scalar::Bool(x), Scalar::Bool(y)) => int(&i64::from(x), &i64::from(y)),
        (a, b) => float(&a.to_f64(), &b.to_f64()),
    };
    args.set_scalar(2, Scalar::Bool(out))
}

fn nonzero(y: i64) -> KernelResult<i64> {
    if y == 0 {
        Err(KernelError::invalid("integer division by zero"))
    } else {
        Ok(y)
    }
}

/// Python's floor division of floats, keeping `a == (a // b) * b + a % b`.
fn floor_div(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return if a.is_sign_negative() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    let m = a % b;
    let d = (a - m) / b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        d - 1.0
    } else {
        d
    }
}

fn unary(args: &mut Args<'_>, int: fn(i64) -> Scalar, float: fn(f64) -> Scalar) -> KernelResult {
    let out = match args.scalar(0)? {
        Scalar::Int(x) => int(x),
        Scalar::Bool(x) => int(i64::from(x)),
        Scalar::Double(x) => float(x),
    };
    args.set_scalar(1, out)
}

fn sym_size(args: &mut Args<'_>) -> KernelResult {
    let t = args.tensor(0)?;
    let d = t.dim(args.int(1)?)?;
    let size = t.sizes.get(d).copied().unwrap_or(1);
    args.set_scalar(2, Scalar::Int(size as i64))
}

fn sym_numel(args: &mut Args<'_>) -> KernelResult {
    let n = args.tensor(0)?.numel();
    args.set_scalar(1, Scalar::Int(n as i64))
}

fn local_scalar_dense(args: &mut Args<'_>) -> KernelResult {
    let t = args.read(0)?;
    if t.info.numel() == 0 {
        return Err(KernelError::invalid(
            "_local_scalar_dense of an empty tensor",
        ));
    }
    let value = crate::layout::first_scalar(&t.info, t.bytes())?;
    args.set_scalar(1, value)
}

/// `et_view(self, size, out)`: `out` becomes a view of `self` with new sizes (one may be
/// -1, inferred).
fn et_view(args: &mut Args<'_>) -> KernelResult {
    let src = args.tensor(0)?;
    let requested = args.int_list(1)?;
    let sizes = crate::util::infer_sizes(&requested, src.numel())?;
    args.alias(2, 0, &sizes)
}

/// `et_copy_index(copy_to, copy_from, index)`: writes `copy_from` as row `index` of
/// `copy_to`, growing `copy_to`'s first dimension to `index + 1` (how loops stack their
/// per-iteration results).
fn et_copy_index(args: &mut Args<'_>) -> KernelResult {
    let to = args.tensor(0)?;
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
    r.register_fn("executorch_prim::add.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_add(y))),
            |x, y| Scalar::Double(x + y),
        )
    });
    r.register_fn("executorch_prim::sub.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_sub(y))),
            |x, y| Scalar::Double(x - y),
        )
    });
    r.register_fn("executorch_prim::mul.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_mul(y))),
            |x, y| Scalar::Double(x * y),
        )
    });
    r.register_fn("executorch_prim::truediv.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Double(x as f64 / y as f64)),
            |x, y| Scalar::Double(x / y),
        )
    });
    r.register_fn("executorch_prim::floordiv.Scalar", |a| {
        binary(
            a,
            |x, y| {
                Ok(Scalar::Int(
                    x.wrapping_div(nonzero(y)?)
                        - i64::from(x.wrapping_rem(y) != 0 && (x < 0) != (y < 0)),
                ))
            },
            |x, y| Scalar::Double(floor_div(x, y)),
        )
    });
    r.register_fn("executorch_prim::floordiv.int", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_div(nonzero(y)?))),
            |x, y| Scalar::Double((x / y).trunc()),
        )
    });
    r.register_fn("executorch_prim::mod.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_rem(nonzero(y)?))),
            |x, y| Scalar::Double(x % y),
        )
    });
    r.register_fn("executorch_prim::mod.int", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.wrapping_rem(nonzero(y)?))),
            |x, y| Scalar::Double(x % y),
        )
    });
    r.register_fn("executorch_prim::eq.Scalar", |a| {
        compare(a, i64::eq, f64::eq)
    });
    r.register_fn("executorch_prim::gt.Scalar", |a| {
        compare(a, i64::gt, f64::gt)
    });
    r.register_fn("executorch_prim::ge.Scalar", |a| {
        compare(a, i64::ge, f64::ge)
    });
    r.register_fn("executorch_prim::lt.Scalar", |a| {
        compare(a, i64::lt, f64::lt)
    });
    r.register_fn("executorch_prim::le.Scalar", |a| {
        compare(a, i64::le, f64::le)
    });
    r.register_fn("executorch_prim::neg.Scalar", |a| {
        unary(a, |x| Scalar::Int(x.wrapping_neg()), |x| Scalar::Double(-x))
    });
    r.register_fn("executorch_prim::ceil.Scalar", |a| {
        unary(a, Scalar::Int, |x| Scalar::Int(x.ceil() as i64))
    });
    r.register_fn("executorch_prim::round.Scalar", |a| {
        unary(a, Scalar::Int, |x| Scalar::Int(x.round_ties_even() as i64))
    });
    r.register_fn("executorch_prim::trunc.Scalar", |a| {
        unary(a, Scalar::Int, |x| Scalar::Int(x.trunc() as i64))
    });
    r.register_fn("executorch_prim::sym_float.Scalar", |a| {
        unary(a, |x| Scalar::Double(x as f64), Scalar::Double)
    });
    r.register_fn("executorch_prim::sym_int.Scalar", |a| {
        unary(a, Scalar::Int, |x| Scalar::Int(x as i64))
    });
    r.register_fn("executorch_prim::sym_not.Scalar", |a| {
        let v = a.scalar(0)?.to_bool();
        a.set_scalar(1, Scalar::Bool(!v))
    });
    r.register_fn("executorch_prim::sym_max.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.max(y))),
            |x, y| Scalar::Double(x.max(y)),
        )
    });
    r.register_fn("executorch_prim::sym_min.Scalar", |a| {
        binary(
            a,
            |x, y| Ok(Scalar::Int(x.min(y))),
            |x, y| Scalar::Double(x.min(y)),
        )
    });
    r.register_fn("executorch_prim::sym_ite.Scalar", |a| {
        let c = a.scalar(0)?.to_bool();
        let v = if c { a.scalar(1)? } else { a.scalar(2)? };
        a.set_scalar(3, v)
    });
}
