//! Decomposes the operators `torch.export` leaves into core ATen, as upstream's `to_edge`
//! does (PyTorch's core decomposition table), so that every remaining operator has an
//! out-variant kernel in upstream's runtime (the table `kernels.txt`).
//!
//! Each rule is a small function from one node to the values that replace its outputs,
//! built with [`Rewriter::call`] (which decomposes what it calls in turn). Operators with
//! neither a kernel nor a rule are collected and reported together.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use crate::archive::TensorData;
use crate::dtype::DType;
use crate::error::{CompileError, Result};
use crate::import::Program;
use crate::ir::{Arg, Dim, IntArg, Node, Op, TensorMeta, ValueId};
use crate::passes::infer::{size_arg, wrap_dim};
use crate::passes::{Action, Rewriter};
use crate::schema;
use crate::sym::Expr;

/// A decomposition: the values replacing the node's outputs.
pub type Rule = fn(&mut Rewriter<'_>, &Node) -> Result<Vec<ValueId>>;

/// Most nodes a decomposition may unroll from one size (time steps, chunks): sizes come
/// from the archive.
const MAX_UNROLL: i64 = 1 << 16;

fn check_unroll(n: &Node, count: i64) -> Result<()> {
    if (0..=MAX_UNROLL).contains(&count) {
        Ok(())
    } else {
        Err(CompileError::unsupported(
            n.op.key(),
            format!("{count} pieces to unroll (at most {MAX_UNROLL})"),
        ))
    }
}

/// View operators kept until the Edge pass turns them into their `_copy` forms.
pub const VIEWS: &[(&str, &str)] = &[
    ("aten::view", "aten::view_copy"),
    ("aten::permute", "aten::permute_copy"),
    ("aten::select.int", "aten::select_copy.int"),
    ("aten::slice.Tensor", "aten::slice_copy.Tensor"),
    ("aten::expand", "aten::expand_copy"),
    ("aten::unsqueeze", "aten::unsqueeze_copy"),
    ("aten::squeeze.dims", "aten::squeeze_copy.dims"),
    ("aten::split_with_sizes", "aten::split_with_sizes_copy"),
    ("aten::unbind.int", "aten::unbind_copy.int"),
    ("aten::diagonal", "aten::diagonal_copy"),
];

fn kernels() -> &'static BTreeSet<&'static str> {
    static K: OnceLock<BTreeSet<&'static str>> = OnceLock::new();
    K.get_or_init(|| include_str!("../kernels.txt").lines().collect())
}

/// True when upstream's runtime has a kernel for this exact operator key.
pub fn has_kernel(key: &str) -> bool {
    kernels().contains(key)
}

/// True for operators that stay as they are: core operators with an out-variant kernel,
/// views with a `_copy` kernel, symbolic-size operators and control flow.
pub fn is_core(op: &Op) -> bool {
    if op.is_cond() || op.name.starts_with("executorch_prim::") {
        return true;
    }
    let key = op.key();
    if matches!(
        key.as_str(),
        "aten::sym_size.int" | "aten::sym_numel" | "aten::_local_scalar_dense"
    ) {
        return true;
    }
    if VIEWS.iter().any(|(v, _)| *v == key) {
        return true;
    }
    if rule(op).is_some() {
        return false;
    }
    schema::lookup(op)
        .and_then(|s| s.out.as_ref())
        .is_some_and(|o| has_kernel(&o.op.key()))
}

/// Runs the pass.
pub fn run(p: &mut Program) -> Result<()> {
    let mut missing = BTreeSet::new();
    Rewriter::run(p, &mut |rw, node| {
        if is_core(&node.op) {
            return Ok(Action::Keep(node));
        }
        match rule(&node.op) {
            Some(d) => Ok(Action::Replaced(d(rw, &node)?)),
            None => {
                missing.insert(node.op.key());
                Ok(Action::Keep(node))
            }
        }
    })?;
    if !missing.is_empty() {
        return Err(CompileError::NoDecomposition {
            ops: missing.into_iter().collect(),
        });
    }
    Ok(())
}

fn t(n: &Node, i: usize) -> Result<ValueId> {
    n.args
        .get(i)
        .and_then(Arg::tensor)
        .ok_or_else(|| CompileError::invalid(n.op.key(), format!("argument {i} is not a tensor")))
}

fn a(n: &Node, i: usize) -> Arg {
    n.args.get(i).cloned().unwrap_or(Arg::None)
}

fn int(n: &Node, i: usize) -> Result<i64> {
    n.args
        .get(i)
        .and_then(Arg::int)
        .ok_or_else(|| CompileError::invalid(n.op.key(), format!("argument {i} is not an int")))
}

fn ints(v: impl IntoIterator<Item = i64>) -> Arg {
    Arg::Ints(v.into_iter().map(IntArg::Const).collect())
}

fn out_meta(rw: &Rewriter<'_>, n: &Node, i: usize) -> Result<TensorMeta> {
    let v = n
        .outputs
        .get(i)
        .ok_or_else(|| CompileError::invalid(n.op.key(), "missing output"))?;
    rw.meta(*v)
}

/// The rule for an operator, if it has one.
pub fn rule(op: &Op) -> Option<Rule> {
    Some(match op.key().as_str() {
        "aten::linear" => linear,
        "aten::matmul" => matmul,
        "aten::conv1d" | "aten::conv2d" | "aten::conv3d" => conv,
        "aten::conv1d.padding" | "aten::conv2d.padding" | "aten::conv3d.padding" => conv_padding,
        "aten::conv_transpose1d"
        | "aten::conv_transpose2d.input"
        | "aten::conv_transpose3d.input" => conv_transpose,
        "aten::batch_norm" => batch_norm,
        "aten::layer_norm" => layer_norm,
        "aten::rms_norm" => rms_norm,
        "aten::logsumexp" => logsumexp,
        "aten::instance_norm" => instance_norm,
        "aten::std.dim" | "aten::std.correction" => std,
        "aten::linalg_vector_norm" => vector_norm,
        "aten::prelu" => prelu,
        "aten::mish" => mish,
        "aten::group_norm" => group_norm,
        "aten::dropout"
        | "aten::feature_dropout"
        | "aten::alpha_dropout"
        | "aten::feature_alpha_dropout" => dropout,
        "aten::contiguous"
        | "aten::lift_fresh_copy"
        | "aten::detach"
        | "aten::alias"
        | "aten::clone"
        | "aten::lift_fresh"
        | "aten::detach_copy"
        | "aten::alias_copy" => identity,
        "aten::flatten.using_ints"
        | "aten::unflatten.int"
        | "aten::reshape"
        | "aten::_unsafe_view"
        | "aten::view_as" => reshape,
        "aten::transpose.int" | "aten::swapaxes" | "aten::swapdims" => transpose,
        "aten::t" => t_op,
        "aten::squeeze.dim" | "aten::squeeze" => squeeze,
        "aten::expand_as" => expand_as,
        "aten::narrow" => narrow,
        "aten::split.Tensor" | "aten::split.sizes" | "aten::split" | "aten::chunk" => split,
        "aten::softmax.int" | "aten::log_softmax.int" | "aten::_safe_softmax" => softmax,
        "aten::silu" => silu,
        "aten::hardswish" => hardswish,
        "aten::hardsigmoid" => hardsigmoid,
        "aten::relu6" => relu6,
        "aten::adaptive_avg_pool2d" => adaptive_avg_pool2d,
        "aten::adaptive_avg_pool1d" => adaptive_avg_pool1d,
        "aten::adaptive_max_pool2d" => adaptive_max_pool2d,
        "aten::max_pool2d" => max_pool2d,
        "aten::max_pool1d" => max_pool1d,
        "aten::avg_pool1d" => avg_pool1d,
        "aten::scaled_dot_product_attention" => sdpa,
        "aten::lstm.input" => lstm,
        "aten::gru.input" => gru,
        "aten::rnn_tanh.input" | "aten::rnn_relu.input" => rnn,
        "aten::lstm_cell" => lstm_cell,
        "aten::gru_cell" => gru_cell,
        "aten::rnn_tanh_cell" | "aten::rnn_relu_cell" => rnn_cell,
        "aten::zeros_like" | "aten::ones_like" => fill_like,
        "aten::new_zeros" | "aten::new_ones" | "aten::new_full" => new_full,
        "aten::to.dtype" | "aten::to.dtype_layout" | "aten::type_as" | "aten::to.device" => {
            to_dtype
        }
        "aten::clamp_min" | "aten::clamp_max" => clamp_one,
        "aten::pad" => pad,
        "aten::square" => square,
        "aten::movedim.int" => movedim,
        "aten::sum" => sum_all,
        "aten::fill.Scalar" => fill_scalar,
        "aten::triu" => triu,
        "aten::einsum" => einsum,
        _ => return None,
    })
}

fn identity(_: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![t(n, 0)?])
}

fn dropout(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    if n.args.get(2).and_then(Arg::bool) == Some(true) {
        return Err(CompileError::unsupported(
            n.op.key(),
            "dropout in training mode (call model.eval() before export)",
        ));
    }
    identity(rw, n)
}

/// `view` to `sizes` (with symbolic sizes read from `x`).
fn view(rw: &mut Rewriter<'_>, x: ValueId, sizes: &[Dim]) -> Result<ValueId> {
    let m = rw.meta(x)?;
    if m.sizes == sizes {
        return Ok(x);
    }
    let arg = size_arg(rw, sizes, x)?;
    rw.call1("aten::view", vec![Arg::Tensor(x), arg])
}

fn reshape(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let out = out_meta(rw, n, 0)?;
    Ok(vec![view(rw, x, &out.sizes)?])
}

fn permute(rw: &mut Rewriter<'_>, x: ValueId, dims: Vec<i64>) -> Result<ValueId> {
    if dims.iter().enumerate().all(|(i, &d)| i as i64 == d) {
        return Ok(x);
    }
    rw.call1("aten::permute", vec![Arg::Tensor(x), ints(dims)])
}

fn transpose_dims(rw: &mut Rewriter<'_>, x: ValueId, a0: i64, a1: i64, op: &Op) -> Result<ValueId> {
    let r = rw.meta(x)?.rank();
    if r < 2 {
        return Ok(x);
    }
    let (d0, d1) = (wrap_dim(a0, r, op)?, wrap_dim(a1, r, op)?);
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(d0, d1);
    permute(rw, x, perm)
}

fn transpose(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![transpose_dims(
        rw,
        t(n, 0)?,
        int(n, 1)?,
        int(n, 2)?,
        &n.op,
    )?])
}

fn t_op(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![transpose_dims(rw, t(n, 0)?, 0, 1, &n.op)?])
}

fn movedim(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let r = rw.meta(x)?.rank();
    let (s, d) = (
        wrap_dim(int(n, 1)?, r, &n.op)?,
        wrap_dim(int(n, 2)?, r, &n.op)?,
    );
    let mut order: Vec<i64> = (0..r as i64).filter(|&i| i as usize != s).collect();
    order.insert(d, s as i64);
    Ok(vec![permute(rw, x, order)?])
}

fn squeeze(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let dims: Vec<i64> = match n.args.get(1) {
        Some(Arg::Int(d)) => vec![*d],
        _ => m
            .sizes
            .iter()
            .enumerate()
            .filter(|(_, d)| d.as_const() == Some(1))
            .map(|(i, _)| i as i64)
            .collect(),
    };
    Ok(vec![rw.call1(
        "aten::squeeze.dims",
        vec![Arg::Tensor(x), ints(dims)],
    )?])
}

fn expand_as(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let sizes = rw.meta(t(n, 1)?)?.sizes;
    if rw.meta(x)?.sizes == sizes {
        return Ok(vec![x]);
    }
    let arg = size_arg(rw, &sizes, t(n, 1)?)?;
    Ok(vec![rw.call1("aten::expand", vec![Arg::Tensor(x), arg])?])
}

fn narrow(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let (start, len) = (int(n, 2)?, int(n, 3)?);
    Ok(vec![rw.call1(
        "aten::slice.Tensor",
        vec![
            a(n, 0),
            a(n, 1),
            Arg::Int(start),
            Arg::Int(start + len),
            Arg::Int(1),
        ],
    )?])
}

fn split(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let dim = wrap_dim(
        n.args.get(2).and_then(Arg::int).unwrap_or(0),
        m.rank(),
        &n.op,
    )?;
    let total =
        m.sizes.get(dim).and_then(Dim::as_const).ok_or_else(|| {
            CompileError::unsupported(n.op.key(), "splitting a dynamic dimension")
        })?;
    let pieces = |each: i64| -> Result<Vec<i64>> {
        let each = each.max(1);
        check_unroll(n, total / each)?;
        Ok(chunk_sizes(total, each))
    };
    let sizes: Vec<i64> = match (n.op.key().as_str(), n.args.get(1)) {
        ("aten::chunk", Some(Arg::Int(chunks))) => {
            let chunks = (*chunks).max(1);
            pieces(total / chunks + i64::from(total % chunks != 0))?
        }
        (_, Some(Arg::Int(size))) => pieces(*size)?,
        (_, Some(list)) => list.ints().unwrap_or_default(),
        _ => return Err(CompileError::invalid(n.op.key(), "split sizes")),
    };
    rw.call(
        "aten::split_with_sizes",
        vec![Arg::Tensor(x), ints(sizes), Arg::Int(dim as i64)],
    )
}

fn chunk_sizes(total: i64, each: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut left = total;
    while left > 0 {
        out.push(each.min(left));
        left -= each;
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

fn softmax(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let mut x = t(n, 0)?;
    if let Some(Arg::ScalarType(d)) = n.args.get(2) {
        x = cast(rw, x, *d)?;
    }
    let op = if n.op.key() == "aten::log_softmax.int" {
        "aten::_log_softmax"
    } else {
        "aten::_softmax"
    };
    Ok(vec![rw.call1(
        op,
        vec![Arg::Tensor(x), a(n, 1), Arg::Bool(false)],
    )?])
}

fn cast(rw: &mut Rewriter<'_>, x: ValueId, d: DType) -> Result<ValueId> {
    if rw.meta(x)?.dtype == d {
        return Ok(x);
    }
    rw.call1(
        "aten::_to_copy",
        vec![
            Arg::Tensor(x),
            Arg::ScalarType(d),
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::Bool(false),
            Arg::None,
        ],
    )
}

fn to_dtype(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let target = out_meta(rw, n, 0)?.dtype;
    Ok(vec![cast(rw, x, target)?])
}

fn silu(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let s = rw.call1("aten::sigmoid", vec![Arg::Tensor(x)])?;
    Ok(vec![rw.call1(
        "aten::mul.Tensor",
        vec![Arg::Tensor(x), Arg::Tensor(s)],
    )?])
}

/// `hardtanh(x + 3, 0, 6) / 6`, the shared part of hardswish and hardsigmoid.
fn relu6_shifted(rw: &mut Rewriter<'_>, x: ValueId) -> Result<ValueId> {
    let p = rw.call1(
        "aten::add.Tensor",
        vec![Arg::Tensor(x), Arg::Float(3.0), Arg::Int(1)],
    )?;
    let c = rw.call1(
        "aten::hardtanh",
        vec![Arg::Tensor(p), Arg::Float(0.0), Arg::Float(6.0)],
    )?;
    rw.call1("aten::div.Tensor", vec![Arg::Tensor(c), Arg::Float(6.0)])
}

fn hardswish(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let h = relu6_shifted(rw, x)?;
    Ok(vec![rw.call1(
        "aten::mul.Tensor",
        vec![Arg::Tensor(x), Arg::Tensor(h)],
    )?])
}

fn hardsigmoid(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![relu6_shifted(rw, t(n, 0)?)?])
}

fn relu6(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![rw.call1(
        "aten::hardtanh",
        vec![a(n, 0), Arg::Float(0.0), Arg::Float(6.0)],
    )?])
}

fn clamp_one(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let args = if n.op.name == "aten::clamp_min" {
        vec![a(n, 0), a(n, 1), Arg::None]
    } else {
        vec![a(n, 0), Arg::None, a(n, 1)]
    };
    Ok(vec![rw.call1("aten::clamp", args)?])
}

/// `einsum` over one or two operands without repeated labels, as PyTorch computes it:
/// labels only one operand has and the output lacks are summed first; the rest becomes
/// `bmm([batch, left, contracted] x [batch, contracted, right])` between permutes and
/// views. `...` stands for the leading dimensions not labelled.
fn einsum(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let unsupported = |why: &str| CompileError::unsupported(n.op.key(), why.to_owned());
    let Some(Arg::Str(eq)) = n.args.first() else {
        return Err(unsupported("no equation"));
    };
    let ops = tensors(n, 1)?;
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_owned(), Some(r.to_owned())),
        None => (eq.clone(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != ops.len() || ops.is_empty() || ops.len() > 2 {
        return Err(unsupported("one or two operands"));
    }
    // Labels per operand, with `...` expanded to fresh upper-case labels.
    let mut labels: Vec<Vec<char>> = Vec::new();
    let mut ellipsis = 0usize;
    for (spec, &op) in specs.iter().zip(&ops) {
        let rank = rw.meta(op)?.rank();
        let named = spec.replace("...", "").chars().count();
        let fill = rank
            .checked_sub(named)
            .ok_or_else(|| unsupported("more labels than dimensions"))?;
        ellipsis = ellipsis.max(if spec.contains("...") { fill } else { 0 });
        let dots: String = (0..fill).map(|i| char::from(b'A' + i as u8)).collect();
        let l: Vec<char> = spec.replace("...", &dots).chars().collect();
        let repeated = l
            .iter()
            .enumerate()
            .any(|(i, c)| l.iter().take(i).any(|d| d == c));
        if l.len() != rank || repeated {
            return Err(unsupported(
                "repeated labels (diagonals) or a rank mismatch",
            ));
        }
        labels.push(l);
    }
    let dots: String = (0..ellipsis).map(|i| char::from(b'A' + i as u8)).collect();
    let out: Vec<char> = match &rhs {
        Some(r) => r.replace("...", &dots).chars().collect(),
        None => {
            // Implicit output: the ellipsis, then labels seen once, sorted.
            let mut once: Vec<char> = labels
                .iter()
                .flatten()
                .copied()
                .filter(|c| {
                    c.is_ascii_lowercase()
                        && labels.iter().flatten().filter(|d| *d == c).count() == 1
                })
                .collect();
            once.sort_unstable();
            dots.chars().chain(once).collect()
        }
    };
    // Sum out labels that only one operand has and the output does not.
    let mut vals = ops.clone();
    let all = labels.clone();
    for (i, (v, l)) in vals.iter_mut().zip(labels.iter_mut()).enumerate() {
        let others: Vec<char> = all
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, l)| l.clone())
            .collect();
        let needed = |c: &char| out.contains(c) || others.contains(c);
        let drop: Vec<i64> = l
            .iter()
            .enumerate()
            .filter(|(_, c)| !needed(c))
            .map(|(d, _)| d as i64)
            .collect();
        if !drop.is_empty() {
            *v = rw.call1(
                "aten::sum.dim_IntList",
                vec![Arg::Tensor(*v), ints(drop), Arg::Bool(false), Arg::None],
            )?;
            l.retain(|c| needed(c));
        }
    }
    let size_of = |rw: &Rewriter<'_>, v: ValueId, l: &[char], c: char| -> Result<Dim> {
        let pos = l
            .iter()
            .position(|&x| x == c)
            .ok_or_else(|| unsupported("label"))?;
        Ok(rw.meta(v)?.sizes.get(pos).cloned().unwrap_or(Dim::Const(1)))
    };
    let order = |l: &[char], want: &[char]| -> Vec<i64> {
        want.iter()
            .filter_map(|c| l.iter().position(|x| x == c))
            .map(|p| p as i64)
            .collect()
    };
    let prod = |ds: &[Dim]| {
        Dim::from_expr(
            ds.iter()
                .fold(Expr::Const(1), |acc, d| Expr::product(acc, d.to_expr())),
        )
    };
    let (a, b, la, lb) = match (vals.as_slice(), labels.as_slice()) {
        ([v], [l]) => return Ok(vec![permute(rw, *v, order(l, &out))?]),
        ([a, b], [la, lb]) => (*a, *b, la.clone(), lb.clone()),
        _ => return Err(unsupported("one or two operands")),
    };
    let batch: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| la.contains(c) && lb.contains(c))
        .collect();
    let left: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| la.contains(c) && !lb.contains(c))
        .collect();
    let right: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| lb.contains(c) && !la.contains(c))
        .collect();
    let contracted: Vec<char> = la
        .iter()
        .copied()
        .filter(|c| lb.contains(c) && !out.contains(c))
        .collect();
    let dims = |rw: &Rewriter<'_>, v: ValueId, l: &[char], cs: &[char]| -> Result<Vec<Dim>> {
        cs.iter().map(|&c| size_of(rw, v, l, c)).collect()
    };
    let (bd, ld, rd, kd) = (
        dims(rw, a, &la, &batch)?,
        dims(rw, a, &la, &left)?,
        dims(rw, b, &lb, &right)?,
        dims(rw, a, &la, &contracted)?,
    );
    let a_order: Vec<char> = batch
        .iter()
        .chain(&left)
        .chain(&contracted)
        .copied()
        .collect();
    let b_order: Vec<char> = batch
        .iter()
        .chain(&contracted)
        .chain(&right)
        .copied()
        .collect();
    let ap = permute(rw, a, order(&la, &a_order))?;
    let bp = permute(rw, b, order(&lb, &b_order))?;
    let a3 = view(rw, ap, &[prod(&bd), prod(&ld), prod(&kd)])?;
    let b3 = view(rw, bp, &[prod(&bd), prod(&kd), prod(&rd)])?;
    let y = rw.call1("aten::bmm", vec![Arg::Tensor(a3), Arg::Tensor(b3)])?;
    let y_labels: Vec<char> = batch.iter().chain(&left).chain(&right).copied().collect();
    let y_sizes: Vec<Dim> = bd.into_iter().chain(ld).chain(rd).collect();
    let y = view(rw, y, &y_sizes)?;
    Ok(vec![permute(rw, y, order(&y_labels, &out))?])
}

/// `triu(x, k)` keeps `x` where `column - row >= k`: a compile-time mask over the last two
/// dimensions (upstream has no `triu` kernel).
fn triu(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let k = n.args.get(1).and_then(Arg::int).unwrap_or(0);
    let r = m.rank();
    let (Some(rows), Some(cols)) = (
        m.sizes.get(r.wrapping_sub(2)).and_then(Dim::as_const),
        m.sizes.get(r.wrapping_sub(1)).and_then(Dim::as_const),
    ) else {
        return Err(CompileError::unsupported(
            n.op.key(),
            "triu of a dynamic or 1-D shape",
        ));
    };
    if rows
        .checked_mul(cols)
        .is_none_or(|c| !(0..=1 << 28).contains(&c))
    {
        return Err(CompileError::unsupported(
            n.op.key(),
            "a triu mask this large",
        ));
    }
    let bytes: Vec<u8> = (0..rows)
        .flat_map(|i| (0..cols).map(move |j| u8::from(j - i >= k)))
        .collect();
    let mask = rw.constant(
        "triu_mask",
        TensorData {
            dtype: DType::Bool,
            sizes: vec![rows, cols],
            bytes,
        },
    );
    Ok(vec![rw.call1(
        "aten::where.self",
        vec![Arg::Tensor(mask), Arg::Tensor(x), Arg::Int(0)],
    )?])
}

/// `fill(x, v)` is `full_like(x, v)`, which every runtime has.
fn fill_scalar(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![rw.call1(
        "aten::full_like",
        vec![
            a(n, 0),
            a(n, 1),
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::None,
        ],
    )?])
}

fn sum_all(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![rw.call1(
        "aten::sum.dim_IntList",
        vec![a(n, 0), Arg::Ints(Vec::new()), Arg::Bool(false), a(n, 1)],
    )?])
}

fn square(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![rw.call1("aten::mul.Tensor", vec![a(n, 0), a(n, 0)])?])
}

fn fill_like(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let v = if n.op.name == "aten::ones_like" { 1 } else { 0 };
    let d = out_meta(rw, n, 0)?.dtype;
    Ok(vec![rw.call1(
        "aten::full_like",
        vec![
            a(n, 0),
            Arg::Int(v),
            Arg::ScalarType(d),
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::None,
        ],
    )?])
}

fn new_full(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let out = out_meta(rw, n, 0)?;
    let (value, rest) = match n.op.name.as_str() {
        "aten::new_ones" => (Arg::Int(1), 2),
        "aten::new_zeros" => (Arg::Int(0), 2),
        _ => (a(n, 2), 3),
    };
    let _ = rest;
    let size = size_arg(rw, &out.sizes, t(n, 0)?)?;
    Ok(vec![rw.call1(
        "aten::full",
        vec![
            size,
            value,
            Arg::ScalarType(out.dtype),
            Arg::None,
            Arg::None,
            Arg::None,
        ],
    )?])
}

fn pad(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let mode = match n.args.get(2) {
        Some(Arg::Str(s)) => s.clone(),
        _ => "constant".into(),
    };
    let value = match n.args.get(3) {
        Some(Arg::Float(f)) => Arg::Float(*f),
        _ => Arg::Float(0.0),
    };
    let x = t(n, 0)?;
    let rank = rw.meta(x)?.rank();
    let npad = n.args.get(1).and_then(Arg::ints).unwrap_or_default().len() / 2;
    let op = match (mode.as_str(), npad) {
        ("constant", _) => {
            return Ok(vec![
                rw.call1("aten::constant_pad_nd", vec![a(n, 0), a(n, 1), value])?
            ])
        }
        ("reflect", 1) => "aten::reflection_pad1d",
        ("reflect", 2) => "aten::reflection_pad2d",
        ("reflect", 3) => "aten::reflection_pad3d",
        ("replicate", 1) => "aten::replication_pad1d",
        ("replicate", 2) => "aten::replication_pad2d",
        ("replicate", 3) => "aten::replication_pad3d",
        _ => {
            return Err(CompileError::unsupported(
                n.op.key(),
                format!("padding mode {mode:?} on rank {rank}"),
            ))
        }
    };
    let out = out_meta(rw, n, 0)?;
    Ok(rw.emit(
        Op::parse(op),
        vec![a(n, 0), a(n, 1)],
        "pad",
        vec![crate::ir::ValueKind::Tensor(out)],
    ))
}

/// `x @ w.T + b` for a 2-D `x`; other ranks go through a 2-D view.
fn linear(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let (x, w) = (t(n, 0)?, t(n, 1)?);
    let bias = n.args.get(2).and_then(Arg::tensor);
    let xm = rw.meta(x)?;
    let wm = rw.meta(w)?;
    let out = out_meta(rw, n, 0)?;
    let wt = permute(rw, w, vec![1, 0])?;
    if xm.rank() == 1 || wm.rank() != 2 {
        // Rare shapes: matmul handles them.
        let mm = matmul_values(rw, x, wt)?;
        return Ok(vec![match bias {
            Some(b) => rw.call1(
                "aten::add.Tensor",
                vec![Arg::Tensor(mm), Arg::Tensor(b), Arg::Int(1)],
            )?,
            None => mm,
        }]);
    }
    let k = xm.sizes.last().cloned().unwrap_or(Dim::Const(1));
    let rows = xm
        .sizes
        .iter()
        .take(xm.rank() - 1)
        .fold(Expr::Const(1), |acc, d| Expr::product(acc, d.to_expr()));
    let x2 = view(rw, x, &[Dim::from_expr(rows), k])?;
    let y = match bias {
        Some(b) => rw.call1(
            "aten::addmm",
            vec![
                Arg::Tensor(b),
                Arg::Tensor(x2),
                Arg::Tensor(wt),
                Arg::Int(1),
                Arg::Int(1),
            ],
        )?,
        None => rw.call1("aten::mm", vec![Arg::Tensor(x2), Arg::Tensor(wt)])?,
    };
    Ok(vec![view(rw, y, &out.sizes)?])
}

fn matmul(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![matmul_values(rw, t(n, 0)?, t(n, 1)?)?])
}

/// `torch.matmul` with its broadcasting rules, through `mm` and `bmm`.
pub fn matmul_values(rw: &mut Rewriter<'_>, a: ValueId, b: ValueId) -> Result<ValueId> {
    let (am, bm) = (rw.meta(a)?, rw.meta(b)?);
    let op = Op::new("aten::matmul", "");
    match (am.rank(), bm.rank()) {
        (2, 2) => rw.call1("aten::mm", vec![Arg::Tensor(a), Arg::Tensor(b)]),
        (1, 1) => {
            let p = rw.call1("aten::mul.Tensor", vec![Arg::Tensor(a), Arg::Tensor(b)])?;
            rw.call1(
                "aten::sum.dim_IntList",
                vec![Arg::Tensor(p), ints([0]), Arg::Bool(false), Arg::None],
            )
        }
        (1, _) => {
            let a2 = rw.call1("aten::unsqueeze", vec![Arg::Tensor(a), Arg::Int(0)])?;
            let r = matmul_values(rw, a2, b)?;
            rw.call1("aten::squeeze.dims", vec![Arg::Tensor(r), ints([-2])])
        }
        (_, 1) => {
            let b2 = rw.call1("aten::unsqueeze", vec![Arg::Tensor(b), Arg::Int(1)])?;
            let r = matmul_values(rw, a, b2)?;
            rw.call1("aten::squeeze.dims", vec![Arg::Tensor(r), ints([-1])])
        }
        (ra, 2) if ra > 2 => {
            // Fold the batch into the rows.
            let k = am.sizes.last().cloned().unwrap_or(Dim::Const(1));
            let rows = am
                .sizes
                .iter()
                .take(ra - 1)
                .fold(Expr::Const(1), |acc, d| Expr::product(acc, d.to_expr()));
            let a2 = view(rw, a, &[Dim::from_expr(rows), k])?;
            let y = rw.call1("aten::mm", vec![Arg::Tensor(a2), Arg::Tensor(b)])?;
            let mut sizes = am.sizes.clone();
            if let Some(last) = sizes.last_mut() {
                *last = bm.sizes.get(1).cloned().unwrap_or(Dim::Const(1));
            }
            view(rw, y, &sizes)
        }
        (ra, rb) => {
            let at = |s: &[Dim], i: usize| s.get(i).cloned().unwrap_or(Dim::Const(1));
            let batch_a = am.sizes.get(..ra - 2).unwrap_or_default();
            let batch_b = bm.sizes.get(..rb - 2).unwrap_or_default();
            let batch = crate::passes::infer::broadcast(batch_a, batch_b, &op)?;
            let (m, k) = (at(&am.sizes, ra - 2), at(&am.sizes, ra - 1));
            let nn = at(&bm.sizes, rb - 1);
            let expand = |rw: &mut Rewriter<'_>, x: ValueId, tail: [Dim; 2]| -> Result<ValueId> {
                let mut sizes = batch.clone();
                sizes.extend(tail);
                if rw.meta(x)?.sizes == sizes {
                    return Ok(x);
                }
                let arg = size_arg(rw, &sizes, x)?;
                rw.call1("aten::expand", vec![Arg::Tensor(x), arg])
            };
            let ae = expand(rw, a, [m.clone(), k.clone()])?;
            let be = expand(rw, b, [k.clone(), nn.clone()])?;
            let bsz = Dim::from_expr(
                batch
                    .iter()
                    .fold(Expr::Const(1), |acc, d| Expr::product(acc, d.to_expr())),
            );
            let a3 = view(rw, ae, &[bsz.clone(), m.clone(), k.clone()])?;
            let b3 = view(rw, be, &[bsz, k, nn.clone()])?;
            let y = rw.call1("aten::bmm", vec![Arg::Tensor(a3), Arg::Tensor(b3)])?;
            let mut sizes = batch;
            sizes.extend([m, nn]);
            view(rw, y, &sizes)
        }
    }
}

/// Arguments of `aten::convolution` besides input and weight.
struct ConvArgs {
    bias: Arg,
    stride: Arg,
    padding: Arg,
    dilation: Arg,
    transposed: bool,
    output_padding: Arg,
    groups: Arg,
}

fn conv_call(rw: &mut Rewriter<'_>, x: ValueId, w: ValueId, c: ConvArgs) -> Result<ValueId> {
    let ConvArgs {
        bias,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
    } = c;
    let spatial = rw.meta(w)?.rank().saturating_sub(2);
    let expand = |a: Arg, dflt: i64| -> Arg {
        let v = a.ints().unwrap_or_else(|| vec![dflt]);
        ints((0..spatial).map(|i| v.get(i).or(v.first()).copied().unwrap_or(dflt)))
    };
    rw.call1(
        "aten::convolution",
        vec![
            Arg::Tensor(x),
            Arg::Tensor(w),
            bias,
            expand(stride, 1),
            expand(padding, 0),
            expand(dilation, 1),
            Arg::Bool(transposed),
            expand(output_padding, 0),
            groups,
        ],
    )
}

/// Adds a leading batch dimension for unbatched convolution and pooling inputs.
fn batched(rw: &mut Rewriter<'_>, x: ValueId, want_rank: usize) -> Result<(ValueId, bool)> {
    if rw.meta(x)?.rank() + 1 == want_rank {
        Ok((
            rw.call1("aten::unsqueeze", vec![Arg::Tensor(x), Arg::Int(0)])?,
            true,
        ))
    } else {
        Ok((x, false))
    }
}

fn unbatched(rw: &mut Rewriter<'_>, y: ValueId, was: bool) -> Result<ValueId> {
    if was {
        rw.call1("aten::squeeze.dims", vec![Arg::Tensor(y), ints([0])])
    } else {
        Ok(y)
    }
}

fn conv(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let w = t(n, 1)?;
    let (x, ub) = batched(rw, t(n, 0)?, rw.meta(w)?.rank())?;
    let c = ConvArgs {
        bias: a(n, 2),
        stride: a(n, 3),
        padding: a(n, 4),
        dilation: a(n, 5),
        transposed: false,
        output_padding: ints([0]),
        groups: a(n, 6),
    };
    let y = conv_call(rw, x, w, c)?;
    Ok(vec![unbatched(rw, y, ub)?])
}

fn conv_padding(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let w = t(n, 1)?;
    let wm = rw.meta(w)?;
    let (mut x, ub) = batched(rw, t(n, 0)?, wm.rank())?;
    let spatial = wm.rank().saturating_sub(2);
    let dil = a(n, 5).ints().unwrap_or_else(|| vec![1]);
    let mode = match n.args.get(4) {
        Some(Arg::Str(s)) => s.clone(),
        _ => "valid".into(),
    };
    let mut pads = vec![0i64; spatial];
    if mode == "same" {
        let mut extra = Vec::new();
        for (i, pad) in pads.iter_mut().enumerate() {
            let k = wm.sizes.get(2 + i).and_then(Dim::as_const).unwrap_or(1);
            let d = dil.get(i).or(dil.first()).copied().unwrap_or(1);
            let total = d
                .checked_mul(k - 1)
                .ok_or_else(|| CompileError::Overflow("convolution padding".into()))?;
            *pad = total / 2;
            extra.push(total - 2 * (total / 2));
        }
        if extra.iter().any(|&e| e > 0) {
            // Odd total padding: the extra element goes on the right, as PyTorch does.
            let mut p = Vec::new();
            for e in extra.iter().rev() {
                p.extend([0, *e]);
            }
            x = rw.call1(
                "aten::constant_pad_nd",
                vec![Arg::Tensor(x), ints(p), Arg::Float(0.0)],
            )?;
        }
    }
    let c = ConvArgs {
        bias: a(n, 2),
        stride: a(n, 3),
        padding: ints(pads),
        dilation: a(n, 5),
        transposed: false,
        output_padding: ints([0]),
        groups: a(n, 6),
    };
    let y = conv_call(rw, x, w, c)?;
    Ok(vec![unbatched(rw, y, ub)?])
}

fn conv_transpose(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups, dilation)
    let w = t(n, 1)?;
    let (x, ub) = batched(rw, t(n, 0)?, rw.meta(w)?.rank())?;
    let c = ConvArgs {
        bias: a(n, 2),
        stride: a(n, 3),
        padding: a(n, 4),
        dilation: a(n, 7),
        transposed: true,
        output_padding: a(n, 5),
        groups: a(n, 6),
    };
    let y = conv_call(rw, x, w, c)?;
    Ok(vec![unbatched(rw, y, ub)?])
}

fn first_of(rw: &mut Rewriter<'_>, op: &str, args: Vec<Arg>) -> Result<ValueId> {
    let outs = rw.call(op, args)?;
    outs.first()
        .copied()
        .ok_or_else(|| CompileError::invalid(op, "no output"))
}

fn batch_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)
    let training = n.args.get(5).and_then(Arg::bool).unwrap_or(false);
    let has_stats = n.args.get(3).and_then(Arg::tensor).is_some();
    if training || !has_stats {
        return Err(CompileError::unsupported(
            n.op.key(),
            "batch norm with batch statistics (call model.eval() before export)",
        ));
    }
    Ok(vec![first_of(
        rw,
        "aten::_native_batch_norm_legit_no_training",
        vec![
            a(n, 0),
            a(n, 1),
            a(n, 2),
            a(n, 3),
            a(n, 4),
            a(n, 6),
            a(n, 7),
        ],
    )?])
}

fn layer_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    Ok(vec![first_of(
        rw,
        "aten::native_layer_norm",
        vec![a(n, 0), a(n, 1), a(n, 2), a(n, 3), a(n, 4)],
    )?])
}

/// `x * rsqrt(mean(x^2) + eps) * weight` over the trailing dimensions, computed in float32
/// for narrower floats, as PyTorch's composite kernel does; `eps` defaults to the machine
/// epsilon of the input's type.
fn rms_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let k = a(n, 1).ints().map_or(0, |s| s.len());
    if k == 0 || k > m.rank() {
        return Err(CompileError::invalid(
            n.op.key(),
            "normalized_shape must name 1 to rank trailing dimensions",
        ));
    }
    let eps = n
        .args
        .get(3)
        .and_then(Arg::number)
        .unwrap_or(match m.dtype {
            DType::Double => f64::EPSILON,
            DType::Half => 0.000_976_562_5,
            DType::Bfloat16 => 0.007_812_5,
            _ => f64::from(f32::EPSILON),
        });
    let wide = if m.dtype == DType::Double {
        DType::Double
    } else {
        DType::Float
    };
    let xw = cast(rw, x, wide)?;
    let sq = rw.call1("aten::mul.Tensor", vec![Arg::Tensor(xw), Arg::Tensor(xw)])?;
    let dims = ints((1..=k as i64).map(|d| -d));
    let ms = rw.call1(
        "aten::mean.dim",
        vec![Arg::Tensor(sq), dims, Arg::Bool(true), Arg::None],
    )?;
    let y = normalized(rw, xw, ms, eps)?;
    let y = cast(rw, y, m.dtype)?;
    Ok(vec![match n.args.get(2).and_then(Arg::tensor) {
        Some(w) => rw.call1("aten::mul.Tensor", vec![Arg::Tensor(y), Arg::Tensor(w)])?,
        None => y,
    }])
}

/// `log(sum(exp(x - m))) + m` with `m` the maximum over `dim` (zero where infinite), as
/// PyTorch decomposes it; integer inputs are computed in the default float type.
fn logsumexp(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let out = out_meta(rw, n, 0)?;
    let x = cast(rw, t(n, 0)?, out.dtype)?;
    let keepdim = n.args.get(2).and_then(Arg::bool).unwrap_or(false);
    let max = rw.call1("aten::amax", vec![Arg::Tensor(x), a(n, 1), Arg::Bool(true)])?;
    let infinite = rw.call1("aten::isinf", vec![Arg::Tensor(max)])?;
    let max = rw.call1(
        "aten::masked_fill.Scalar",
        vec![Arg::Tensor(max), Arg::Tensor(infinite), Arg::Float(0.0)],
    )?;
    let centred = rw.call1(
        "aten::sub.Tensor",
        vec![Arg::Tensor(x), Arg::Tensor(max), Arg::Int(1)],
    )?;
    let e = rw.call1("aten::exp", vec![Arg::Tensor(centred)])?;
    let s = rw.call1(
        "aten::sum.dim_IntList",
        vec![Arg::Tensor(e), a(n, 1), Arg::Bool(true), Arg::None],
    )?;
    let l = rw.call1("aten::log", vec![Arg::Tensor(s)])?;
    let y = rw.call1(
        "aten::add.Tensor",
        vec![Arg::Tensor(l), Arg::Tensor(max), Arg::Int(1)],
    )?;
    Ok(vec![if keepdim { y } else { view(rw, y, &out.sizes)? }])
}

/// `x * rsqrt(var + eps)`, the scaling every normalization shares.
fn normalized(rw: &mut Rewriter<'_>, x: ValueId, var: ValueId, eps: f64) -> Result<ValueId> {
    let shifted = rw.call1(
        "aten::add.Tensor",
        vec![Arg::Tensor(var), Arg::Float(eps), Arg::Int(1)],
    )?;
    let scale = rw.call1("aten::rsqrt", vec![Arg::Tensor(shifted)])?;
    rw.call1("aten::mul.Tensor", vec![Arg::Tensor(x), Arg::Tensor(scale)])
}

/// `x` viewed as `[C, 1, ...]` to broadcast along dim 1 of a tensor of rank `rank` (or
/// along dim 0 of a vector), as PyTorch lines up per-channel parameters.
fn per_channel(rw: &mut Rewriter<'_>, p: ValueId, rank: usize) -> Result<ValueId> {
    let c = rw.meta(p)?.sizes.first().cloned().unwrap_or(Dim::Const(1));
    let mut sizes = vec![c];
    sizes.resize(rank.saturating_sub(1).max(1), Dim::Const(1));
    view(rw, p, &sizes)
}

/// Instance norm as upstream's `to_edge` leaves it computable: each sample's channels
/// normalized over their spatial dimensions with the biased variance, or with the running
/// statistics when `use_input_stats` is false, then the affine parameters per channel.
fn instance_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // instance_norm(input, weight, bias, running_mean, running_var, use_input_stats,
    //               momentum, eps, cudnn_enabled)
    let x = t(n, 0)?;
    let rank = rw.meta(x)?.rank();
    if rank < 3 {
        return Err(CompileError::invalid(n.op.key(), "input of rank below 3"));
    }
    let eps = n.args.get(7).and_then(Arg::number).unwrap_or(1e-5);
    let input_stats = n.args.get(5).and_then(Arg::bool).unwrap_or(true);
    let (mean, var) = match (
        n.args.get(3).and_then(Arg::tensor),
        n.args.get(4).and_then(Arg::tensor),
    ) {
        (Some(m), Some(v)) if !input_stats => {
            (per_channel(rw, m, rank)?, per_channel(rw, v, rank)?)
        }
        _ => {
            let dims = ints(2..rank as i64);
            let mean = rw.call1(
                "aten::mean.dim",
                vec![Arg::Tensor(x), dims.clone(), Arg::Bool(true), Arg::None],
            )?;
            let var = rw.call1(
                "aten::var.correction",
                vec![Arg::Tensor(x), dims, Arg::Int(0), Arg::Bool(true)],
            )?;
            (mean, var)
        }
    };
    let centred = rw.call1(
        "aten::sub.Tensor",
        vec![Arg::Tensor(x), Arg::Tensor(mean), Arg::Int(1)],
    )?;
    let mut y = normalized(rw, centred, var, eps)?;
    if let Some(w) = n.args.get(1).and_then(Arg::tensor) {
        let w = per_channel(rw, w, rank)?;
        y = rw.call1("aten::mul.Tensor", vec![Arg::Tensor(y), Arg::Tensor(w)])?;
    }
    if let Some(b) = n.args.get(2).and_then(Arg::tensor) {
        let b = per_channel(rw, b, rank)?;
        y = rw.call1(
            "aten::add.Tensor",
            vec![Arg::Tensor(y), Arg::Tensor(b), Arg::Int(1)],
        )?;
    }
    Ok(vec![y])
}

/// The square root of `var.correction`; `std.dim`'s `unbiased` is a correction of 1 or 0.
fn std(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let correction = if n.op.name == "aten::std" && n.op.overload == "dim" {
        Arg::Int(i64::from(n.args.get(2).and_then(Arg::bool).unwrap_or(true)))
    } else {
        a(n, 2)
    };
    let var = rw.call1(
        "aten::var.correction",
        vec![a(n, 0), a(n, 1), correction, a(n, 3)],
    )?;
    Ok(vec![rw.call1("aten::sqrt", vec![Arg::Tensor(var)])?])
}

/// `linalg_vector_norm` by its definition: the sum of `|x|^p` to the power `1/p`, with
/// the 2-norm as the root of a sum of squares, the 1-norm as a sum of absolute values,
/// the infinity norms as extremes of absolute values and the 0-"norm" as a count.
fn vector_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let out = out_meta(rw, n, 0)?;
    if !crate::dtype::is_float(out.dtype) {
        return Err(CompileError::unsupported(
            n.op.key(),
            "a norm of a non-float type",
        ));
    }
    let x = cast(rw, t(n, 0)?, out.dtype)?;
    let ord = n.args.get(1).and_then(Arg::number).unwrap_or(2.0);
    let dims = match a(n, 2) {
        Arg::None => Arg::Ints(Vec::new()),
        d => d,
    };
    let keep = Arg::Bool(n.args.get(3).and_then(Arg::bool).unwrap_or(false));
    let abs = rw.call1("aten::abs", vec![Arg::Tensor(x)])?;
    let sum = |rw: &mut Rewriter<'_>, v: ValueId| {
        rw.call1(
            "aten::sum.dim_IntList",
            vec![Arg::Tensor(v), dims.clone(), keep.clone(), Arg::None],
        )
    };
    let y = if ord == 2.0 {
        let sq = rw.call1("aten::mul.Tensor", vec![Arg::Tensor(x), Arg::Tensor(x)])?;
        let s = sum(rw, sq)?;
        rw.call1("aten::sqrt", vec![Arg::Tensor(s)])?
    } else if ord == 1.0 {
        sum(rw, abs)?
    } else if ord.is_infinite() {
        let op = if ord > 0.0 {
            "aten::amax"
        } else {
            "aten::amin"
        };
        rw.call1(op, vec![Arg::Tensor(abs), dims.clone(), keep.clone()])?
    } else if ord == 0.0 {
        let nonzero = rw.call1("aten::ne.Scalar", vec![Arg::Tensor(abs), Arg::Int(0)])?;
        let nonzero = cast(rw, nonzero, out.dtype)?;
        sum(rw, nonzero)?
    } else {
        let p = rw.call1(
            "aten::pow.Tensor_Scalar",
            vec![Arg::Tensor(abs), Arg::Float(ord)],
        )?;
        let s = sum(rw, p)?;
        rw.call1(
            "aten::pow.Tensor_Scalar",
            vec![Arg::Tensor(s), Arg::Float(1.0 / ord)],
        )?
    };
    Ok(vec![view(rw, y, &out.sizes)?])
}

/// `where(x > 0, x, weight * x)` with the weight along the channel dimension.
fn prelu(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let w = t(n, 1)?;
    let rank = rw.meta(x)?.rank();
    let single = rw
        .meta(w)?
        .static_sizes()
        .is_some_and(|s| s.iter().product::<i64>() == 1);
    let w = if single || rank == 0 {
        w
    } else {
        per_channel(rw, w, rank)?
    };
    let scaled = rw.call1("aten::mul.Tensor", vec![Arg::Tensor(x), Arg::Tensor(w)])?;
    let positive = rw.call1("aten::gt.Scalar", vec![Arg::Tensor(x), Arg::Int(0)])?;
    Ok(vec![rw.call1(
        "aten::where.self",
        vec![Arg::Tensor(positive), Arg::Tensor(x), Arg::Tensor(scaled)],
    )?])
}

/// `x * tanh(softplus(x))`, softplus as `log1p(exp(x))` (PyTorch's kernel has no
/// threshold here: for large `x` it is `x * tanh(inf) = x`).
fn mish(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let e = rw.call1("aten::exp", vec![Arg::Tensor(x)])?;
    let sp = rw.call1("aten::log1p", vec![Arg::Tensor(e)])?;
    let th = rw.call1("aten::tanh", vec![Arg::Tensor(sp)])?;
    Ok(vec![rw.call1(
        "aten::mul.Tensor",
        vec![Arg::Tensor(x), Arg::Tensor(th)],
    )?])
}

fn group_norm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // group_norm(input, num_groups, weight, bias, eps, cudnn)
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let sizes = m
        .static_sizes()
        .ok_or_else(|| CompileError::unsupported(n.op.key(), "group norm of a dynamic shape"))?;
    let nb = sizes.first().copied().unwrap_or(1);
    let c = sizes.get(1).copied().unwrap_or(1);
    let hw = sizes
        .iter()
        .skip(2)
        .try_fold(1i64, |a, &b| a.checked_mul(b))
        .ok_or_else(|| CompileError::Overflow("group norm size".into()))?;
    Ok(vec![first_of(
        rw,
        "aten::native_group_norm",
        vec![
            a(n, 0),
            a(n, 2),
            a(n, 3),
            Arg::Int(nb),
            Arg::Int(c),
            Arg::Int(hw),
            a(n, 1),
            a(n, 4),
        ],
    )?])
}

/// Global pooling (output 1x1) is a mean over the last two dimensions, as PyTorch's
/// decomposition makes it (upstream's adaptive pooling kernel is wrong on dynamic shapes);
/// other sizes keep `_adaptive_avg_pool2d`.
fn adaptive_avg_pool2d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let (x, ub) = batched(rw, t(n, 0)?, 4)?;
    let out = a(n, 1).ints().unwrap_or_default();
    let y = if !out.is_empty() && out.iter().all(|&o| o == 1) {
        rw.call1(
            "aten::mean.dim",
            vec![Arg::Tensor(x), ints([-1, -2]), Arg::Bool(true), Arg::None],
        )?
    } else {
        rw.call1("aten::_adaptive_avg_pool2d", vec![Arg::Tensor(x), a(n, 1)])?
    };
    Ok(vec![unbatched(rw, y, ub)?])
}

fn adaptive_avg_pool1d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = rw.call1("aten::unsqueeze", vec![a(n, 0), Arg::Int(-2)])?;
    let o = a(n, 1).ints().unwrap_or_else(|| vec![1]);
    let y = rw.call1(
        "aten::_adaptive_avg_pool2d",
        vec![Arg::Tensor(x), ints([1, o.first().copied().unwrap_or(1)])],
    )?;
    Ok(vec![rw.call1(
        "aten::squeeze.dims",
        vec![Arg::Tensor(y), ints([-2])],
    )?])
}

fn adaptive_max_pool2d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = t(n, 0)?;
    let m = rw.meta(x)?;
    let o = a(n, 1).ints().unwrap_or_default();
    let r = m.rank();
    let mut k = Vec::new();
    for i in 0..2 {
        let inp = m.sizes.get(r.wrapping_sub(2) + i).and_then(Dim::as_const);
        let out = o.get(i).or(o.first()).copied();
        match (inp, out) {
            (Some(inp), Some(out)) if out > 0 && inp % out == 0 => k.push(inp / out),
            _ => {
                return Err(CompileError::unsupported(
                    n.op.key(),
                    "adaptive max pooling whose input size is not a multiple of its output size",
                ))
            }
        }
    }
    let outs = rw.call(
        "aten::max_pool2d_with_indices",
        vec![
            Arg::Tensor(x),
            ints(k.clone()),
            ints(k),
            ints([0, 0]),
            ints([1, 1]),
            Arg::Bool(false),
        ],
    )?;
    Ok(outs)
}

fn max_pool2d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let (x, ub) = batched(rw, t(n, 0)?, 4)?;
    let y = first_of(
        rw,
        "aten::max_pool2d_with_indices",
        vec![Arg::Tensor(x), a(n, 1), a(n, 2), a(n, 3), a(n, 4), a(n, 5)],
    )?;
    Ok(vec![unbatched(rw, y, ub)?])
}

fn to2d(a: Arg, one: i64) -> Arg {
    let v = a.ints().unwrap_or_default();
    ints([one, v.first().copied().unwrap_or(one)])
}

fn max_pool1d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let x = rw.call1("aten::unsqueeze", vec![a(n, 0), Arg::Int(-2)])?;
    let k = to2d(a(n, 1), 1);
    let s = if a(n, 2).ints().is_some_and(|v| !v.is_empty()) {
        to2d(a(n, 2), 1)
    } else {
        k.clone()
    };
    let y = first_of(
        rw,
        "aten::max_pool2d_with_indices",
        vec![
            Arg::Tensor(x),
            k,
            s,
            to2d(a(n, 3), 0),
            to2d(a(n, 4), 1),
            a(n, 5),
        ],
    )?;
    Ok(vec![rw.call1(
        "aten::squeeze.dims",
        vec![Arg::Tensor(y), ints([-2])],
    )?])
}

fn avg_pool1d(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // avg_pool1d(self, kernel_size, stride, padding, ceil_mode, count_include_pad)
    let x = rw.call1("aten::unsqueeze", vec![a(n, 0), Arg::Int(-2)])?;
    let k = to2d(a(n, 1), 1);
    let s = if a(n, 2).ints().is_some_and(|v| !v.is_empty()) {
        to2d(a(n, 2), 1)
    } else {
        k.clone()
    };
    let y = rw.call1(
        "aten::avg_pool2d",
        vec![
            Arg::Tensor(x),
            k,
            s,
            to2d(a(n, 3), 0),
            a(n, 4),
            a(n, 5),
            Arg::None,
        ],
    )?;
    Ok(vec![rw.call1(
        "aten::squeeze.dims",
        vec![Arg::Tensor(y), ints([-2])],
    )?])
}

/// `softmax(q @ k^T * scale + mask) @ v`.
fn sdpa(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    let (q, k, v) = (t(n, 0)?, t(n, 1)?, t(n, 2)?);
    if n.args.get(7).and_then(Arg::bool) == Some(true) {
        return Err(CompileError::unsupported(n.op.key(), "enable_gqa=True"));
    }
    if n.args
        .get(4)
        .and_then(Arg::number)
        .is_some_and(|p| p != 0.0)
    {
        return Err(CompileError::unsupported(n.op.key(), "attention dropout"));
    }
    let qm = rw.meta(q)?;
    let e = qm
        .sizes
        .last()
        .and_then(Dim::as_const)
        .ok_or_else(|| CompileError::unsupported(n.op.key(), "dynamic head size"))?;
    let scale = match n.args.get(6) {
        Some(Arg::Float(s)) => *s,
        _ => 1.0 / (e as f64).sqrt(),
    };
    let kt = transpose_dims(rw, k, -2, -1, &n.op)?;
    let scores = matmul_values(rw, q, kt)?;
    let mut attn = rw.call1(
        "aten::mul.Scalar",
        vec![Arg::Tensor(scores), Arg::Float(scale)],
    )?;
    let am = rw.meta(attn)?;
    let r = am.rank();
    if n.args.get(5).and_then(Arg::bool) == Some(true) {
        let (l, s) = (
            am.sizes.get(r - 2).and_then(Dim::as_const),
            am.sizes.get(r - 1).and_then(Dim::as_const),
        );
        let (Some(l), Some(s)) = (l, s) else {
            return Err(CompileError::unsupported(
                n.op.key(),
                "causal attention over a dynamic length",
            ));
        };
        let mask: Vec<u8> = (0..l)
            .flat_map(|i| (0..s).map(move |j| u8::from(j <= i)))
            .collect();
        let mask = rw.constant(
            "causal_mask",
            TensorData {
                dtype: DType::Bool,
                sizes: vec![l, s],
                bytes: mask,
            },
        );
        attn = masked(rw, attn, mask)?;
    }
    if let Some(mask) = n.args.get(3).and_then(Arg::tensor) {
        attn = if rw.meta(mask)?.dtype == DType::Bool {
            masked(rw, attn, mask)?
        } else {
            rw.call1(
                "aten::add.Tensor",
                vec![Arg::Tensor(attn), Arg::Tensor(mask), Arg::Int(1)],
            )?
        };
    }
    let p = rw.call1(
        "aten::_softmax",
        vec![Arg::Tensor(attn), Arg::Int(-1), Arg::Bool(false)],
    )?;
    Ok(vec![matmul_values(rw, p, v)?])
}

/// `where(mask, x, -inf)`.
fn masked(rw: &mut Rewriter<'_>, x: ValueId, mask: ValueId) -> Result<ValueId> {
    rw.call1(
        "aten::where.self",
        vec![
            Arg::Tensor(mask),
            Arg::Tensor(x),
            Arg::Float(f64::NEG_INFINITY),
        ],
    )
}

/// Weights of one recurrent layer and direction.
struct Cell {
    w_ih: ValueId,
    w_hh: ValueId,
    b_ih: Option<ValueId>,
    b_hh: Option<ValueId>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Lstm,
    Gru,
    Tanh,
    Relu,
}

impl Kind {
    fn gates(self) -> i64 {
        match self {
            Kind::Lstm => 4,
            Kind::Gru => 3,
            _ => 1,
        }
    }
}

/// `x @ w.T + b` for 2-D `x`.
fn affine(rw: &mut Rewriter<'_>, x: ValueId, w: ValueId, b: Option<ValueId>) -> Result<ValueId> {
    let wt = permute(rw, w, vec![1, 0])?;
    match b {
        Some(b) => rw.call1(
            "aten::addmm",
            vec![
                Arg::Tensor(b),
                Arg::Tensor(x),
                Arg::Tensor(wt),
                Arg::Int(1),
                Arg::Int(1),
            ],
        ),
        None => rw.call1("aten::mm", vec![Arg::Tensor(x), Arg::Tensor(wt)]),
    }
}

fn bin(rw: &mut Rewriter<'_>, op: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
    let mut args = vec![Arg::Tensor(x), Arg::Tensor(y)];
    if op != "aten::mul.Tensor" {
        args.push(Arg::Int(1));
    }
    rw.call1(op, args)
}

fn un(rw: &mut Rewriter<'_>, op: &str, x: ValueId) -> Result<ValueId> {
    rw.call1(op, vec![Arg::Tensor(x)])
}

/// One time step: new hidden state (and cell state for LSTM).
fn cell_step(
    rw: &mut Rewriter<'_>,
    kind: Kind,
    x: ValueId,
    h: ValueId,
    c: Option<ValueId>,
    w: &Cell,
) -> Result<(ValueId, Option<ValueId>)> {
    let gi = affine(rw, x, w.w_ih, w.b_ih)?;
    let gh = affine(rw, h, w.w_hh, w.b_hh)?;
    let hidden = rw
        .meta(h)?
        .sizes
        .get(1)
        .and_then(Dim::as_const)
        .unwrap_or(1);
    let split = |rw: &mut Rewriter<'_>, g: ValueId| {
        rw.call(
            "aten::split_with_sizes",
            vec![
                Arg::Tensor(g),
                ints(vec![hidden; kind.gates() as usize]),
                Arg::Int(1),
            ],
        )
    };
    match kind {
        Kind::Lstm => {
            let g = bin(rw, "aten::add.Tensor", gi, gh)?;
            let parts = split(rw, g)?;
            let [i, f, gg, o] = parts.as_slice() else {
                return Err(CompileError::invalid("lstm", "gate split"));
            };
            let (i, f, gg, o) = (
                un(rw, "aten::sigmoid", *i)?,
                un(rw, "aten::sigmoid", *f)?,
                un(rw, "aten::tanh", *gg)?,
                un(rw, "aten::sigmoid", *o)?,
            );
            let c = c.ok_or_else(|| CompileError::invalid("lstm", "no cell state"))?;
            let fc = bin(rw, "aten::mul.Tensor", f, c)?;
            let ig = bin(rw, "aten::mul.Tensor", i, gg)?;
            let c2 = bin(rw, "aten::add.Tensor", fc, ig)?;
            let tc = un(rw, "aten::tanh", c2)?;
            Ok((bin(rw, "aten::mul.Tensor", o, tc)?, Some(c2)))
        }
        Kind::Gru => {
            let pi = split(rw, gi)?;
            let ph = split(rw, gh)?;
            let ([ir, iz, in_], [hr, hz, hn]) = (pi.as_slice(), ph.as_slice()) else {
                return Err(CompileError::invalid("gru", "gate split"));
            };
            let r = bin(rw, "aten::add.Tensor", *ir, *hr)?;
            let r = un(rw, "aten::sigmoid", r)?;
            let z = bin(rw, "aten::add.Tensor", *iz, *hz)?;
            let z = un(rw, "aten::sigmoid", z)?;
            let rh = bin(rw, "aten::mul.Tensor", r, *hn)?;
            let nn = bin(rw, "aten::add.Tensor", *in_, rh)?;
            let nn = un(rw, "aten::tanh", nn)?;
            // h' = n + z * (h - n)
            let d = bin(rw, "aten::sub.Tensor", h, nn)?;
            let zd = bin(rw, "aten::mul.Tensor", z, d)?;
            Ok((bin(rw, "aten::add.Tensor", nn, zd)?, None))
        }
        Kind::Tanh | Kind::Relu => {
            let s = bin(rw, "aten::add.Tensor", gi, gh)?;
            let act = if kind == Kind::Tanh {
                "aten::tanh"
            } else {
                "aten::relu"
            };
            Ok((un(rw, act, s)?, None))
        }
    }
}

/// A multi-layer, possibly bidirectional recurrent network unrolled over a static length.
#[allow(clippy::too_many_arguments)]
fn recurrent(
    rw: &mut Rewriter<'_>,
    n: &Node,
    kind: Kind,
    input: ValueId,
    h0: ValueId,
    c0: Option<ValueId>,
    params: &[ValueId],
    has_biases: bool,
    layers: i64,
    bidirectional: bool,
    batch_first: bool,
) -> Result<Vec<ValueId>> {
    let xm = rw.meta(input)?;
    if xm.rank() != 3 {
        return Err(CompileError::unsupported(
            n.op.key(),
            "unbatched (2-D) recurrent input",
        ));
    }
    let tdim: i64 = if batch_first { 1 } else { 0 };
    let steps = xm
        .sizes
        .get(tdim as usize)
        .and_then(Dim::as_const)
        .ok_or_else(|| CompileError::unsupported(n.op.key(), "a dynamic sequence length"))?;
    check_unroll(n, steps)?;
    check_unroll(n, layers)?;
    let dirs = if bidirectional { 2 } else { 1 };
    let per = if has_biases { 4 } else { 2 };
    if params.len() as i64 != layers * dirs * per {
        return Err(CompileError::unsupported(
            n.op.key(),
            "projections (proj_size) or unexpected weights",
        ));
    }
    let mut layer_in = input;
    let mut h_last = Vec::new();
    let mut c_last = Vec::new();
    for l in 0..layers {
        let mut dir_outs = Vec::new();
        for d in 0..dirs {
            let idx = (l * dirs + d) as usize;
            let base = idx * per as usize;
            let p = |i: usize| params.get(base + i).copied();
            let w = Cell {
                w_ih: p(0).ok_or_else(|| CompileError::invalid("rnn", "weights"))?,
                w_hh: p(1).ok_or_else(|| CompileError::invalid("rnn", "weights"))?,
                b_ih: if has_biases { p(2) } else { None },
                b_hh: if has_biases { p(3) } else { None },
            };
            let mut h = rw.call1(
                "aten::select.int",
                vec![Arg::Tensor(h0), Arg::Int(0), Arg::Int(idx as i64)],
            )?;
            let mut c = match c0 {
                Some(c0) => Some(rw.call1(
                    "aten::select.int",
                    vec![Arg::Tensor(c0), Arg::Int(0), Arg::Int(idx as i64)],
                )?),
                None => None,
            };
            let mut outs = vec![0; steps as usize];
            for s in 0..steps {
                let tt = if d == 0 { s } else { steps - 1 - s };
                let x = rw.call1(
                    "aten::select.int",
                    vec![Arg::Tensor(layer_in), Arg::Int(tdim), Arg::Int(tt)],
                )?;
                let (h2, c2) = cell_step(rw, kind, x, h, c, &w)?;
                h = h2;
                c = c2;
                if let Some(slot) = outs.get_mut(tt as usize) {
                    *slot = h;
                }
            }
            h_last.push(h);
            c_last.extend(c);
            dir_outs.push(rw.call1("aten::stack", vec![Arg::Tensors(outs), Arg::Int(tdim)])?);
        }
        layer_in = if dir_outs.len() == 1 {
            dir_outs.first().copied().unwrap_or(layer_in)
        } else {
            rw.call1("aten::cat", vec![Arg::Tensors(dir_outs), Arg::Int(2)])?
        };
    }
    let mut result = vec![
        layer_in,
        rw.call1("aten::stack", vec![Arg::Tensors(h_last), Arg::Int(0)])?,
    ];
    if kind == Kind::Lstm {
        result.push(rw.call1("aten::stack", vec![Arg::Tensors(c_last), Arg::Int(0)])?);
    }
    Ok(result)
}

fn tensors(n: &Node, i: usize) -> Result<Vec<ValueId>> {
    match n.args.get(i) {
        Some(Arg::Tensors(v)) => Ok(v.clone()),
        _ => Err(CompileError::invalid(
            n.op.key(),
            format!("argument {i} is not a tensor list"),
        )),
    }
}

fn flag(n: &Node, i: usize) -> bool {
    n.args.get(i).and_then(Arg::bool).unwrap_or(false)
}

fn lstm(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // lstm.input(input, hx[], params[], has_biases, num_layers, dropout, train, bidirectional, batch_first)
    let hx = tensors(n, 1)?;
    let (Some(&h0), Some(&c0)) = (hx.first(), hx.get(1)) else {
        return Err(CompileError::invalid(n.op.key(), "hx"));
    };
    recurrent(
        rw,
        n,
        Kind::Lstm,
        t(n, 0)?,
        h0,
        Some(c0),
        &tensors(n, 2)?,
        flag(n, 3),
        int(n, 4)?,
        flag(n, 7),
        flag(n, 8),
    )
}

fn gru(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // gru.input(input, hx, params[], has_biases, num_layers, dropout, train, bidirectional, batch_first)
    recurrent(
        rw,
        n,
        Kind::Gru,
        t(n, 0)?,
        t(n, 1)?,
        None,
        &tensors(n, 2)?,
        flag(n, 3),
        int(n, 4)?,
        flag(n, 7),
        flag(n, 8),
    )
}

fn rnn(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let kind = if n.op.name == "aten::rnn_relu" {
        Kind::Relu
    } else {
        Kind::Tanh
    };
    recurrent(
        rw,
        n,
        kind,
        t(n, 0)?,
        t(n, 1)?,
        None,
        &tensors(n, 2)?,
        flag(n, 3),
        int(n, 4)?,
        flag(n, 7),
        flag(n, 8),
    )
}

fn cell_weights(n: &Node, first: usize) -> Result<Cell> {
    Ok(Cell {
        w_ih: t(n, first)?,
        w_hh: t(n, first + 1)?,
        b_ih: n.args.get(first + 2).and_then(Arg::tensor),
        b_hh: n.args.get(first + 3).and_then(Arg::tensor),
    })
}

fn lstm_cell(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    // lstm_cell(input, hx[], w_ih, w_hh, b_ih?, b_hh?) -> (h, c)
    let hx = tensors(n, 1)?;
    let (Some(&h), Some(&c)) = (hx.first(), hx.get(1)) else {
        return Err(CompileError::invalid(n.op.key(), "hx"));
    };
    let w = cell_weights(n, 2)?;
    let (h2, c2) = cell_step(rw, Kind::Lstm, t(n, 0)?, h, Some(c), &w)?;
    Ok(vec![h2, c2.unwrap_or(h2)])
}

fn gru_cell(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let w = cell_weights(n, 2)?;
    Ok(vec![
        cell_step(rw, Kind::Gru, t(n, 0)?, t(n, 1)?, None, &w)?.0,
    ])
}

fn rnn_cell(rw: &mut Rewriter<'_>, n: &Node) -> Result<Vec<ValueId>> {
    let w = cell_weights(n, 2)?;
    let kind = if n.op.name == "aten::rnn_relu_cell" {
        Kind::Relu
    } else {
        Kind::Tanh
    };
    Ok(vec![cell_step(rw, kind, t(n, 0)?, t(n, 1)?, None, &w)?.0])
}
