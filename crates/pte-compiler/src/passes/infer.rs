//! Output descriptions (dtype, sizes) of the operators passes create.
//!
//! Nodes read from the archive keep the descriptions torch recorded; nodes made by
//! decompositions get theirs here, with symbolic sizes carried through as expressions.

use crate::dtype::{self, DType, ScalarKind};
use crate::error::{CompileError, Result};
use crate::ir::{Arg, Dim, IntArg, Op, TensorMeta, ValueId};
use crate::passes::Rewriter;
use crate::sym::Expr;

fn bad(op: &Op, why: impl Into<String>) -> CompileError {
    CompileError::invalid(op.key(), why)
}

/// Wraps a possibly negative dimension index.
pub fn wrap_dim(d: i64, rank: usize, op: &Op) -> Result<usize> {
    let r = rank.max(1) as i64;
    let w = if d < 0 { d + r } else { d };
    if (0..r).contains(&w) {
        Ok(w as usize)
    } else {
        Err(bad(
            op,
            format!("dimension {d} out of range for rank {rank}"),
        ))
    }
}

/// Broadcasts two shapes (numpy rules).
pub fn broadcast(a: &[Dim], b: &[Dim], op: &Op) -> Result<Vec<Dim>> {
    let n = a.len().max(b.len());
    let get = |s: &[Dim], i: usize| -> Dim {
        let off = n - s.len();
        if i < off {
            Dim::Const(1)
        } else {
            s.get(i - off).cloned().unwrap_or(Dim::Const(1))
        }
    };
    (0..n)
        .map(|i| {
            let (x, y) = (get(a, i), get(b, i));
            match (x.as_const(), y.as_const()) {
                (Some(1), _) => Ok(y),
                (_, Some(1)) => Ok(x),
                (Some(p), Some(q)) if p != q => {
                    Err(bad(op, format!("cannot broadcast {p} with {q}")))
                }
                _ => Ok(x),
            }
        })
        .collect()
}

/// The sizes an int-list argument gives, symbolic elements resolved to their expressions.
pub fn int_list(rw: &Rewriter<'_>, a: &Arg, op: &Op) -> Result<Vec<Dim>> {
    match a {
        Arg::Ints(v) => v
            .iter()
            .map(|i| match i {
                IntArg::Const(c) => Ok(Dim::Const(*c)),
                IntArg::Sym(s) => match rw.p.graph.value(*s).map(|v| &v.kind) {
                    Some(crate::ir::ValueKind::SymInt(e)) => Ok(Dim::from_expr(e.clone())),
                    _ => Err(bad(op, "int list element is not a SymInt")),
                },
            })
            .collect(),
        Arg::Int(v) => Ok(vec![Dim::Const(*v)]),
        _ => Err(bad(op, format!("expected an int list, got {a:?}"))),
    }
}

fn ints(a: Option<&Arg>, op: &Op) -> Result<Vec<i64>> {
    match a {
        Some(Arg::Int(v)) => Ok(vec![*v]),
        Some(a) => a.ints().ok_or_else(|| bad(op, "expected constant ints")),
        None => Err(bad(op, "missing argument")),
    }
}

fn int(a: Option<&Arg>, op: &Op) -> Result<i64> {
    a.and_then(Arg::int)
        .ok_or_else(|| bad(op, "expected an int"))
}

/// Resolves `-1` in view sizes against the input's element count.
fn view_sizes(input: &[Dim], sizes: Vec<Dim>, op: &Op) -> Result<Vec<Dim>> {
    let Some(pos) = sizes.iter().position(|d| d.as_const() == Some(-1)) else {
        return Ok(sizes);
    };
    let total = input
        .iter()
        .fold(Expr::Const(1), |acc, d| Expr::product(acc, d.to_expr()));
    let known = sizes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != pos)
        .fold(Expr::Const(1), |acc, (_, d)| {
            Expr::product(acc, d.to_expr())
        });
    let inferred = match (total.as_const(), known.as_const()) {
        (Some(t), Some(k)) if k != 0 && t % k == 0 => Dim::Const(t / k),
        (Some(_), Some(_)) => return Err(bad(op, "view sizes do not match the input")),
        _ => {
            // Symbolic: divide out a matching factor when possible.
            let cancel = input.iter().find(|d| d.as_const().is_none()).cloned();
            match (cancel, known.as_const(), total_static_part(input)) {
                (Some(sym), Some(k), Some(rest)) if k != 0 && rest % k == 0 => {
                    Dim::from_expr(Expr::product(Expr::Const(rest / k), sym.to_expr()))
                }
                _ => Dim::from_expr(Expr::floordiv(total, known)),
            }
        }
    };
    let mut sizes = sizes;
    if let Some(slot) = sizes.get_mut(pos) {
        *slot = inferred;
    }
    Ok(sizes)
}

/// Product of the static sizes when exactly one size is symbolic.
fn total_static_part(input: &[Dim]) -> Option<i64> {
    if input.iter().filter(|d| d.as_const().is_none()).count() != 1 {
        return None;
    }
    input
        .iter()
        .filter_map(Dim::as_const)
        .try_fold(1i64, |a, b| a.checked_mul(b))
}

fn reduce_dims(sizes: &[Dim], dims: &[i64], keepdim: bool, op: &Op) -> Result<Vec<Dim>> {
    let rank = sizes.len();
    let dims: Vec<usize> = if dims.is_empty() {
        (0..rank).collect()
    } else {
        dims.iter()
            .map(|&d| wrap_dim(d, rank, op))
            .collect::<Result<_>>()?
    };
    Ok(sizes
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (dims.contains(&i), keepdim) {
            (true, true) => Some(Dim::Const(1)),
            (true, false) => None,
            (false, _) => Some(d.clone()),
        })
        .collect())
}

/// Checked arithmetic on window parameters (they come from the archive).
fn ck(v: Option<i64>, op: &Op) -> Result<i64> {
    v.ok_or_else(|| CompileError::Overflow(format!("{}: window arithmetic", op.key())))
}

fn pool_out(size: &Dim, k: i64, s: i64, p: i64, d: i64, ceil: bool, op: &Op) -> Result<Dim> {
    if s <= 0 || k <= 0 || d <= 0 || p < 0 {
        return Err(bad(
            op,
            "kernel, stride and dilation must be positive, padding not negative",
        ));
    }
    // floor((size + 2p - d(k-1) - 1 + (ceil ? s-1 : 0)) / s) + 1
    let span = ck(d.checked_mul(k - 1), op)?;
    let c = ck(
        p.checked_mul(2)
            .and_then(|x| x.checked_sub(span))
            .and_then(|x| x.checked_sub(1))
            .and_then(|x| x.checked_add(if ceil { s - 1 } else { 0 })),
        op,
    )?;
    let num = Expr::sum(size.to_expr(), Expr::Const(c));
    let mut out = Expr::sum(Expr::floordiv(num, Expr::Const(s)), Expr::Const(1));
    if ceil {
        // The last window must start inside the input or the left padding.
        if let (Some(o), Some(n)) = (out.as_const(), size.as_const()) {
            if (o - 1).checked_mul(s) >= n.checked_add(p) {
                out = Expr::Const(o - 1);
            }
        }
    }
    Ok(Dim::from_expr(out))
}

/// Output descriptions of `op` applied to `args`.
pub fn infer(rw: &Rewriter<'_>, op: &Op, args: &[Arg]) -> Result<Vec<TensorMeta>> {
    let t = |i: usize| -> Result<TensorMeta> {
        match args.get(i) {
            Some(Arg::Tensor(v)) => rw.meta(*v),
            _ => Err(bad(op, format!("argument {i} is not a tensor"))),
        }
    };
    let scalar_kind = |a: &Arg| match a {
        Arg::Float(_) | Arg::SymFloat(_) => ScalarKind::Float,
        Arg::Bool(_) | Arg::SymBool(_) => ScalarKind::Bool,
        _ => ScalarKind::Int,
    };
    let with_dtype = |mut m: TensorMeta, d: DType| {
        m.dtype = d;
        Ok(vec![m])
    };
    let contig = |d: DType, s: Vec<Dim>| TensorMeta::contiguous(d, s);
    let key = op.key();
    match key.as_str() {
        "aten::relu"
        | "aten::sigmoid"
        | "aten::tanh"
        | "aten::neg"
        | "aten::exp"
        | "aten::log"
        | "aten::sqrt"
        | "aten::rsqrt"
        | "aten::abs"
        | "aten::erf"
        | "aten::hardtanh"
        | "aten::clamp"
        | "aten::gelu"
        | "aten::leaky_relu"
        | "aten::elu"
        | "aten::reciprocal"
        | "aten::_softmax"
        | "aten::_log_softmax"
        | "aten::clone"
        | "aten::alias"
        | "aten::alias_copy"
        | "aten::detach"
        | "aten::detach_copy"
        | "aten::log1p"
        | "aten::expm1"
        | "aten::sin"
        | "aten::cos"
        | "aten::floor"
        | "aten::ceil"
        | "aten::round"
        | "aten::sign"
        | "aten::constant_pad_nd.unused"
        | "dim_order_ops::_clone_dim_order"
        | "aten::cumsum"
        | "aten::tril"
        | "aten::flip"
        | "aten::masked_fill.Scalar"
        | "aten::fill.Scalar"
        | "aten::pow.Tensor_Scalar"
        | "aten::add.Scalar"
        | "aten::sub.Scalar"
        | "aten::mul.Scalar"
        | "aten::div.Scalar"
        | "aten::copy"
        | "aten::select_scatter"
        | "aten::slice_scatter"
        | "aten::full_like"
        | "aten::index_put"
        | "aten::rsub.Scalar" => {
            let m = t(0)?;
            let dt = match key.as_str() {
                "aten::add.Scalar" | "aten::sub.Scalar" | "aten::mul.Scalar"
                | "aten::rsub.Scalar" => dtype::promote_with_scalar(
                    m.dtype,
                    args.get(1).map_or(ScalarKind::Int, scalar_kind),
                ),
                "aten::div.Scalar" => dtype::promote_with_scalar(m.dtype, ScalarKind::Float),
                "aten::full_like" => match args.get(2) {
                    Some(Arg::ScalarType(d)) => *d,
                    _ => m.dtype,
                },
                _ => m.dtype,
            };
            with_dtype(m, dt)
        }
        "aten::logical_not" | "aten::isnan" | "aten::isinf" | "aten::eq.Scalar"
        | "aten::ne.Scalar" | "aten::gt.Scalar" | "aten::ge.Scalar" | "aten::lt.Scalar"
        | "aten::le.Scalar" => with_dtype(t(0)?, DType::Bool),
        "aten::eq.Tensor" | "aten::ne.Tensor" | "aten::gt.Tensor" | "aten::ge.Tensor"
        | "aten::lt.Tensor" | "aten::le.Tensor" | "aten::logical_and" | "aten::logical_or" => {
            let (a, b) = (t(0)?, t(1)?);
            Ok(vec![contig(
                DType::Bool,
                broadcast(&a.sizes, &b.sizes, op)?,
            )])
        }
        "aten::add.Tensor"
        | "aten::sub.Tensor"
        | "aten::mul.Tensor"
        | "aten::maximum"
        | "aten::minimum"
        | "aten::div.Tensor"
        | "aten::pow.Tensor_Tensor"
        | "aten::atan2" => {
            let a = t(0)?;
            let (bs, bd) = match args.get(1) {
                Some(Arg::Tensor(v)) => {
                    let m = rw.meta(*v)?;
                    (m.sizes, Some(m.dtype))
                }
                _ => (Vec::new(), None),
            };
            let mut d = match bd {
                Some(bd) => dtype::promote(a.dtype, bd),
                None => dtype::promote_with_scalar(
                    a.dtype,
                    args.get(1).map_or(ScalarKind::Int, scalar_kind),
                ),
            };
            if key == "aten::div.Tensor" && !dtype::is_float(d) {
                d = DType::Float;
            }
            Ok(vec![contig(d, broadcast(&a.sizes, &bs, op)?)])
        }
        "aten::where.self" => {
            // Either value may still be a number (the Edge pass makes it a tensor).
            let c = t(0)?;
            let (a, b) = (t(1).ok(), t(2).ok());
            let mut s = c.sizes.clone();
            for m in [&a, &b].into_iter().flatten() {
                s = broadcast(&s, &m.sizes, op)?;
            }
            let d = match (&a, &b) {
                (Some(a), Some(b)) => dtype::promote(a.dtype, b.dtype),
                (Some(m), None) | (None, Some(m)) => m.dtype,
                (None, None) => DType::Float,
            };
            Ok(vec![contig(d, s)])
        }
        "aten::_to_copy" | "dim_order_ops::_to_dim_order_copy" => {
            let m = t(0)?;
            let d = match args.get(1) {
                Some(Arg::ScalarType(d)) => *d,
                _ => m.dtype,
            };
            with_dtype(m, d)
        }
        "aten::view" | "aten::view_copy" | "aten::_unsafe_view" | "aten::reshape" => {
            let m = t(0)?;
            let sizes = view_sizes(
                &m.sizes,
                int_list(rw, args.get(1).unwrap_or(&Arg::None), op)?,
                op,
            )?;
            Ok(vec![contig(m.dtype, sizes)])
        }
        "aten::expand" | "aten::expand_copy" => {
            let m = t(0)?;
            let sizes = int_list(rw, args.get(1).unwrap_or(&Arg::None), op)?;
            let off = sizes.len().saturating_sub(m.rank());
            let out = sizes
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if d.as_const() == Some(-1) {
                        m.sizes
                            .get(i.wrapping_sub(off))
                            .cloned()
                            .unwrap_or(Dim::Const(1))
                    } else {
                        d.clone()
                    }
                })
                .collect();
            Ok(vec![contig(m.dtype, out)])
        }
        "aten::permute" | "aten::permute_copy" => {
            let m = t(0)?;
            let dims = ints(args.get(1), op)?;
            let sizes = dims
                .iter()
                .map(|&d| {
                    Ok(m.sizes
                        .get(wrap_dim(d, m.rank(), op)?)
                        .cloned()
                        .unwrap_or(Dim::Const(1)))
                })
                .collect::<Result<_>>()?;
            Ok(vec![contig(m.dtype, sizes)])
        }
        "aten::unsqueeze" | "aten::unsqueeze_copy" => {
            let mut m = t(0)?;
            let d = wrap_dim(int(args.get(1), op)?, m.rank() + 1, op)?;
            m.sizes.insert(d.min(m.sizes.len()), Dim::Const(1));
            Ok(vec![contig(m.dtype, m.sizes)])
        }
        "aten::squeeze.dims" | "aten::squeeze_copy.dims" => {
            let m = t(0)?;
            let dims: Vec<usize> = ints(args.get(1), op)?
                .into_iter()
                .map(|d| wrap_dim(d, m.rank(), op))
                .collect::<Result<_>>()?;
            let sizes = m
                .sizes
                .iter()
                .enumerate()
                .filter(|(i, d)| !(dims.contains(i) && d.as_const() == Some(1)))
                .map(|(_, d)| d.clone())
                .collect();
            Ok(vec![contig(m.dtype, sizes)])
        }
        "aten::select.int" | "aten::select_copy.int" => {
            let mut m = t(0)?;
            let d = wrap_dim(int(args.get(1), op)?, m.rank(), op)?;
            m.sizes.remove(d.min(m.sizes.len().saturating_sub(1)));
            Ok(vec![contig(m.dtype, m.sizes)])
        }
        "aten::slice.Tensor" | "aten::slice_copy.Tensor" => {
            let mut m = t(0)?;
            let d = wrap_dim(int(args.get(1), op)?, m.rank(), op)?;
            let size = m.sizes.get(d).cloned().unwrap_or(Dim::Const(0));
            let n = size
                .as_const()
                .ok_or_else(|| bad(op, "slice of a dynamic dimension"))?;
            let clampi = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
            let start = clampi(args.get(2).and_then(Arg::int).unwrap_or(0));
            let end = clampi(args.get(3).and_then(Arg::int).unwrap_or(n));
            let step = args.get(4).and_then(Arg::int).unwrap_or(1).max(1);
            let len = if end > start {
                (end - start).saturating_add(step - 1) / step
            } else {
                0
            };
            if let Some(s) = m.sizes.get_mut(d) {
                *s = Dim::Const(len);
            }
            Ok(vec![contig(m.dtype, m.sizes)])
        }
        "aten::split_with_sizes" | "aten::split_with_sizes_copy" => {
            let m = t(0)?;
            let d = wrap_dim(args.get(2).and_then(Arg::int).unwrap_or(0), m.rank(), op)?;
            ints(args.get(1), op)?
                .into_iter()
                .map(|s| {
                    let mut sizes = m.sizes.clone();
                    if let Some(x) = sizes.get_mut(d) {
                        *x = Dim::Const(s);
                    }
                    Ok(contig(m.dtype, sizes))
                })
                .collect()
        }
        "aten::unbind.int" | "aten::unbind_copy.int" => {
            let m = t(0)?;
            let d = wrap_dim(args.get(1).and_then(Arg::int).unwrap_or(0), m.rank(), op)?;
            let n = m
                .sizes
                .get(d)
                .and_then(Dim::as_const)
                .filter(|n| (0..=1 << 16).contains(n))
                .ok_or_else(|| bad(op, "unbind of a dynamic or very large dimension"))?;
            let mut sizes = m.sizes.clone();
            sizes.remove(d);
            Ok((0..n).map(|_| contig(m.dtype, sizes.clone())).collect())
        }
        "aten::mm" => {
            let (a, b) = (t(0)?, t(1)?);
            let s = vec![
                a.sizes.first().cloned().unwrap_or(Dim::Const(1)),
                b.sizes.get(1).cloned().unwrap_or(Dim::Const(1)),
            ];
            Ok(vec![contig(a.dtype, s)])
        }
        "aten::addmm" => {
            let (a, b) = (t(1)?, t(2)?);
            let s = vec![
                a.sizes.first().cloned().unwrap_or(Dim::Const(1)),
                b.sizes.get(1).cloned().unwrap_or(Dim::Const(1)),
            ];
            Ok(vec![contig(a.dtype, s)])
        }
        "aten::bmm" => {
            let (a, b) = (t(0)?, t(1)?);
            let s = vec![
                a.sizes.first().cloned().unwrap_or(Dim::Const(1)),
                a.sizes.get(1).cloned().unwrap_or(Dim::Const(1)),
                b.sizes.get(2).cloned().unwrap_or(Dim::Const(1)),
            ];
            Ok(vec![contig(a.dtype, s)])
        }
        "aten::mean.dim"
        | "aten::sum.dim_IntList"
        | "aten::amax"
        | "aten::amin"
        | "aten::any.dim"
        | "aten::any.dims"
        | "aten::var.correction" => {
            let m = t(0)?;
            let dims = match args.get(1) {
                Some(Arg::None) | None => Vec::new(),
                a => ints(a, op)?,
            };
            let keep_idx = if key == "aten::var.correction" { 3 } else { 2 };
            let keep = args.get(keep_idx).and_then(Arg::bool).unwrap_or(false);
            let d = if key.starts_with("aten::any") {
                DType::Bool
            } else {
                m.dtype
            };
            Ok(vec![contig(d, reduce_dims(&m.sizes, &dims, keep, op)?)])
        }
        "aten::convolution" => {
            let (x, w) = (t(0)?, t(1)?);
            let stride = ints(args.get(3), op)?;
            let pad = ints(args.get(4), op)?;
            let dil = ints(args.get(5), op)?;
            let transposed = args.get(6).and_then(Arg::bool).unwrap_or(false);
            let out_pad = ints(args.get(7), op)?;
            let groups = int(args.get(8), op)?;
            let spatial = x.rank().saturating_sub(2);
            let at =
                |v: &[i64], i: usize, dflt: i64| v.get(i).or(v.first()).copied().unwrap_or(dflt);
            let mut sizes = vec![x.sizes.first().cloned().unwrap_or(Dim::Const(1))];
            let oc = if transposed {
                Dim::from_expr(Expr::product(
                    w.sizes.get(1).map_or(Expr::Const(1), Dim::to_expr),
                    Expr::Const(groups),
                ))
            } else {
                w.sizes.first().cloned().unwrap_or(Dim::Const(1))
            };
            sizes.push(oc);
            for i in 0..spatial {
                let k = w
                    .sizes
                    .get(2 + i)
                    .and_then(Dim::as_const)
                    .ok_or_else(|| bad(op, "dynamic kernel size"))?;
                let inp = x.sizes.get(2 + i).cloned().unwrap_or(Dim::Const(1));
                let (s, p, d) = (at(&stride, i, 1), at(&pad, i, 0), at(&dil, i, 1));
                sizes.push(if transposed {
                    let op_ = at(&out_pad, i, 0);
                    Dim::from_expr(Expr::sum(
                        Expr::product(Expr::sum(inp.to_expr(), Expr::Const(-1)), Expr::Const(s)),
                        Expr::Const(ck(
                            d.checked_mul(k - 1)
                                .and_then(|x| x.checked_sub(p.checked_mul(2)?))
                                .and_then(|x| x.checked_add(op_))
                                .and_then(|x| x.checked_add(1)),
                            op,
                        )?),
                    ))
                } else {
                    pool_out(&inp, k, s, p, d, false, op)?
                });
            }
            Ok(vec![contig(x.dtype, sizes)])
        }
        "aten::max_pool2d_with_indices" | "aten::avg_pool2d" => {
            let x = t(0)?;
            let k = ints(args.get(1), op)?;
            let s = ints(args.get(2), op)?;
            let p = ints(args.get(3), op)?;
            let is_max = key == "aten::max_pool2d_with_indices";
            let d = if is_max {
                ints(args.get(4), op)?
            } else {
                vec![1]
            };
            let ceil = args
                .get(if is_max { 5 } else { 4 })
                .and_then(Arg::bool)
                .unwrap_or(false);
            let at =
                |v: &[i64], i: usize, dflt: i64| v.get(i).or(v.first()).copied().unwrap_or(dflt);
            let r = x.rank();
            if r < 3 {
                return Err(bad(op, "pooling needs a rank 3 or 4 input"));
            }
            let mut sizes = x.sizes.clone();
            for i in 0..2 {
                let idx = r - 2 + i;
                let kk = at(&k, i, 1);
                let ss = if s.is_empty() { kk } else { at(&s, i, kk) };
                if let Some(slot) = sizes.get_mut(idx) {
                    *slot = pool_out(
                        &x.sizes.get(idx).cloned().unwrap_or(Dim::Const(1)),
                        kk,
                        ss,
                        at(&p, i, 0),
                        at(&d, i, 1),
                        ceil,
                        op,
                    )?;
                }
            }
            let out = contig(x.dtype, sizes.clone());
            if is_max {
                Ok(vec![out, contig(DType::Long, sizes)])
            } else {
                Ok(vec![out])
            }
        }
        "aten::_adaptive_avg_pool2d" => {
            let x = t(0)?;
            let o = ints(args.get(1), op)?;
            let mut sizes = x.sizes.clone();
            let r = sizes.len();
            if r < 3 {
                return Err(bad(op, "pooling needs a rank 3 or 4 input"));
            }
            for i in 0..2 {
                if let Some(slot) = sizes.get_mut(r - 2 + i) {
                    *slot = Dim::Const(o.get(i).or(o.first()).copied().unwrap_or(1));
                }
            }
            Ok(vec![contig(x.dtype, sizes)])
        }
        "aten::_native_batch_norm_legit_no_training" => {
            let x = t(0)?;
            let empty = contig(x.dtype, vec![Dim::Const(0)]);
            Ok(vec![x.clone(), empty.clone(), empty])
        }
        "aten::native_layer_norm" => {
            let x = t(0)?;
            let n = ints(args.get(1), op)?.len();
            let keep = x.rank().saturating_sub(n);
            let stat: Vec<Dim> = x
                .sizes
                .iter()
                .enumerate()
                .map(|(i, d)| if i < keep { d.clone() } else { Dim::Const(1) })
                .collect();
            Ok(vec![
                x.clone(),
                contig(x.dtype, stat.clone()),
                contig(x.dtype, stat),
            ])
        }
        "aten::native_group_norm" => {
            let x = t(0)?;
            let g = int(args.get(6), op)?;
            let stat = vec![
                x.sizes.first().cloned().unwrap_or(Dim::Const(1)),
                Dim::Const(g),
            ];
            Ok(vec![
                x.clone(),
                contig(x.dtype, stat.clone()),
                contig(x.dtype, stat),
            ])
        }
        "aten::cat" | "aten::stack" => {
            let Some(Arg::Tensors(vs)) = args.first() else {
                return Err(bad(op, "expected a tensor list"));
            };
            let metas: Vec<TensorMeta> = vs.iter().map(|&v| rw.meta(v)).collect::<Result<_>>()?;
            let first = metas
                .first()
                .cloned()
                .ok_or_else(|| bad(op, "empty tensor list"))?;
            let dtype = metas
                .iter()
                .fold(first.dtype, |d, m| dtype::promote(d, m.dtype));
            let stack = key == "aten::stack";
            let rank = first.rank() + usize::from(stack);
            let d = wrap_dim(args.get(1).and_then(Arg::int).unwrap_or(0), rank, op)?;
            let mut sizes = first.sizes.clone();
            if stack {
                sizes.insert(d.min(sizes.len()), Dim::Const(metas.len() as i64));
            } else {
                let total = metas
                    .iter()
                    .filter(|m| m.rank() == first.rank())
                    .fold(Expr::Const(0), |acc, m| {
                        Expr::sum(acc, m.sizes.get(d).map_or(Expr::Const(0), Dim::to_expr))
                    });
                if let Some(s) = sizes.get_mut(d) {
                    *s = Dim::from_expr(total);
                }
            }
            Ok(vec![contig(dtype, sizes)])
        }
        "aten::constant_pad_nd" => {
            let m = t(0)?;
            let pad = ints(args.get(1), op)?;
            let mut sizes = m.sizes.clone();
            let r = sizes.len();
            for (i, pair) in pad.chunks(2).enumerate() {
                if i >= r {
                    break;
                }
                let idx = r - 1 - i;
                if let Some(s) = sizes.get_mut(idx) {
                    let add = ck(pair.iter().try_fold(0i64, |a, &b| a.checked_add(b)), op)?;
                    *s = Dim::from_expr(Expr::sum(s.to_expr(), Expr::Const(add)));
                }
            }
            Ok(vec![contig(m.dtype, sizes)])
        }
        "aten::full" => {
            let sizes = int_list(rw, args.first().unwrap_or(&Arg::None), op)?;
            let d = match args.get(2) {
                Some(Arg::ScalarType(d)) => *d,
                _ => match args.get(1) {
                    Some(Arg::Float(_)) => DType::Float,
                    Some(Arg::Bool(_)) => DType::Bool,
                    _ => DType::Long,
                },
            };
            Ok(vec![contig(d, sizes)])
        }
        "aten::upsample_nearest2d.vec" => {
            let x = t(0)?;
            let mut sizes = x.sizes.clone();
            let r = sizes.len();
            if r != 4 {
                return Err(bad(op, "upsampling needs a rank 4 input"));
            }
            match args.get(1) {
                Some(Arg::Ints(_)) => {
                    for (i, v) in ints(args.get(1), op)?.into_iter().enumerate() {
                        if let Some(s) = sizes.get_mut(r - 2 + i) {
                            *s = Dim::Const(v);
                        }
                    }
                }
                _ => {
                    let Some(Arg::Floats(f)) = args.get(2) else {
                        return Err(bad(op, "no output size or scale"));
                    };
                    for (i, sc) in f.iter().enumerate() {
                        if let Some(s) = sizes.get_mut(r - 2 + i) {
                            let n = s.as_const().ok_or_else(|| bad(op, "dynamic input"))?;
                            *s = Dim::Const((n as f64 * sc).floor() as i64);
                        }
                    }
                }
            }
            Ok(vec![contig(x.dtype, sizes)])
        }
        _ => Err(CompileError::unsupported(
            key,
            "the compiler has no shape function for this operator",
        )),
    }
}

/// Shapes of a value, as an int-list argument: numbers for static sizes, and for symbolic
/// ones `SymInt` values computed at run time from `source`'s sizes (`sym_size.int`, then
/// prim arithmetic for expressions). Upstream's `et_view` does not infer `-1`, so none is
/// used.
pub fn size_arg(rw: &mut Rewriter<'_>, sizes: &[Dim], source: ValueId) -> Result<Arg> {
    let mut out = Vec::new();
    let mut cache = Vec::new();
    for d in sizes {
        match d.as_const() {
            Some(c) => out.push(IntArg::Const(c)),
            None => out.push(IntArg::Sym(materialize(
                rw,
                &d.to_expr(),
                source,
                &mut cache,
                0,
            )?)),
        }
    }
    Ok(Arg::Ints(out))
}

/// A `SymInt` value computing `e` from the sizes of `source`.
fn materialize(
    rw: &mut Rewriter<'_>,
    e: &Expr,
    source: ValueId,
    cache: &mut Vec<(Expr, ValueId)>,
    depth: usize,
) -> Result<ValueId> {
    let unsupported = || {
        CompileError::unsupported(
            "view",
            format!("size {e} cannot be computed from the sizes of the input"),
        )
    };
    if depth > 32 {
        return Err(unsupported());
    }
    if let Some((_, v)) = cache.iter().find(|(x, _)| x == e) {
        return Ok(*v);
    }
    let src = rw.meta(source)?;
    let sym = |rw: &mut Rewriter<'_>, op: &str, args: Vec<Arg>| -> ValueId {
        let ids = rw.emit(
            Op::parse(op),
            args,
            "sym",
            vec![crate::ir::ValueKind::SymInt(e.clone())],
        );
        ids.first().copied().unwrap_or_default()
    };
    let operand =
        |rw: &mut Rewriter<'_>, x: &Expr, cache: &mut Vec<(Expr, ValueId)>| -> Result<Arg> {
            Ok(match x.as_const() {
                Some(c) => Arg::Int(c),
                None => Arg::SymInt(materialize(rw, x, source, cache, depth + 1)?),
            })
        };
    let v = if let Some(pos) = src.sizes.iter().position(|s| s.to_expr() == *e) {
        sym(
            rw,
            "aten::sym_size.int",
            vec![Arg::Tensor(source), Arg::Int(pos as i64)],
        )
    } else {
        match e {
            Expr::Add(t) | Expr::Mul(t) if t.len() >= 2 => {
                let op = if matches!(e, Expr::Add(_)) {
                    "executorch_prim::add.Scalar"
                } else {
                    "executorch_prim::mul.Scalar"
                };
                let mut acc = operand(rw, t.first().ok_or_else(unsupported)?, cache)?;
                for x in t.iter().skip(1) {
                    let b = operand(rw, x, cache)?;
                    acc = Arg::SymInt(sym(rw, op, vec![acc, b]));
                }
                match acc {
                    Arg::SymInt(v) => v,
                    _ => return Err(unsupported()),
                }
            }
            Expr::FloorDiv(a, b) => {
                let (a, b) = (operand(rw, a, cache)?, operand(rw, b, cache)?);
                sym(rw, "executorch_prim::floordiv.Scalar", vec![a, b])
            }
            _ => return Err(unsupported()),
        }
    };
    cache.push((e.clone(), v));
    Ok(v)
}
