//! The fuser: groups of consecutive calls that one fast kernel runs as one call.
//!
//! - [`constant_pad_nd` of zeros on the spatial axes →] `convolution` [→
//!   `_native_batch_norm_legit_no_training`] [→ activation | → `add` (a residual) [→
//!   activation]]: one convolution with the padding added to its own (a causal
//!   convolution's), the normalization folded into its weights, the addition and
//!   activation in its epilogue;
//! - `addmm` / `linear` / `mm` with a constant weight → activation;
//! - `expand_copy` of a constant matrix over a batch → `bmm` reading it [→
//!   activation]: one product of all the batch's rows, the matrix never repeated;
//! - `permute_copy` transposing a constant 2-d weight → `addmm` / `mm` reading it [→
//!   activation]: the weight is packed from its stored layout, the transpose never
//!   runs (folding defers it, see [`Fuser::defer_folding`]);
//! - `max_pool2d_with_indices` whose indices nothing reads → max pooling alone;
//! - consecutive `permute_copy` / `unsqueeze_copy` / `squeeze_copy` / `clone` calls,
//!   each reading the one before, that move data: one strided copy (attention exports
//!   chains of four);
//! - `cat` along dim 1 → `_native_batch_norm_legit_no_training` [→ activation], or the
//!   normalization and activation alone: one pass from the parts (`norm.rs`);
//! - `_softmax` over the last dimension → PyTorch's decomposition of `_safe_softmax`
//!   (`eq(x, -inf)`, `logical_not`, `any`, `logical_not`, `full_like(0)`, `where`: rows
//!   of -inf only become zeros), as attention exports it: one safe softmax;
//! - consecutive `split_with_sizes_copy`, `sigmoid`, `tanh`, `relu`, `add`, `sub`,
//!   `mul` calls on tensors of one size of at most 4096 values (an LSTM's gates): one
//!   elementwise chain (`pointwise.rs`);
//! - a product with a constant weight [after the weight's transpose] → such a chain
//!   that reads it and nothing else does (an LSTM step): the product goes to scratch
//!   memory and the chain runs in the same call.
//!
//! Activations: `relu`, `hardtanh`, `clamp` with both bounds, `sigmoid`, `gelu`, and
//! `x · sigmoid(x)` written as `sigmoid` then `mul` (SiLU as exported).
//!
//! Each proposal is checked here for what the fast kernel needs (float32, default dim
//! order, constant weights); the runtime then takes it only if the values the group
//! computes internally are used by nothing else.

use std::sync::Arc;

use pte_runtime::{
    Alias, Args, Call, CallId, DType, Fuser, Fusion, Graph, Kernel, KernelResult, PreparedKernel,
};

use super::conv::{self, Act, Layout};
use super::linear::{self, Op};
use super::pool;
use crate::shape::Rearrange;

pub(super) struct Patterns;

impl Fuser for Patterns {
    fn aliases(&self, g: &Graph<'_>) -> Vec<Alias> {
        crate::shape::alias::propose(g)
    }

    fn defer_folding(&self, g: &Graph<'_>) -> Vec<CallId> {
        let calls = g.calls();
        (0..calls.len())
            .filter_map(|i| {
                let rest = calls.get(i..)?;
                let c = rest.first()?;
                let defer = match c.op {
                    "aten::permute_copy.out" => transposed_product(g, rest).is_some(),
                    "aten::expand_copy.out" => repeated_matrix(g, rest).is_some(),
                    _ => false,
                };
                defer.then_some(c.id)
            })
            .collect()
    }

    fn fuse(&self, g: &Graph<'_>) -> Vec<Fusion> {
        let calls = g.calls();
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(c) = calls.get(i) {
            let rest = calls.get(i..).unwrap_or_default();
            let found = match c.op {
                "aten::convolution.out" | "aten::constant_pad_nd.out" => {
                    super::region::propose(g, rest).or_else(|| conv_chain(g, rest))
                }
                "aten::permute_copy.out" => {
                    transposed_product(g, rest).or_else(|| copy_chain(g, rest))
                }
                "aten::unsqueeze_copy.out"
                | "aten::squeeze_copy.out"
                | "aten::squeeze_copy.dim_out"
                | "aten::squeeze_copy.dims_out"
                | "aten::clone.out"
                | "aten::alias_copy.out"
                | "dim_order_ops::_clone_dim_order.out" => copy_chain(g, rest),
                "aten::expand_copy.out" => broadcast_product(g, rest),
                "aten::addmm.out" => product_chain(g, rest, Op::Addmm),
                "aten::linear.out" => product_chain(g, rest, Op::Linear),
                "aten::mm.out" => product_chain(g, rest, Op::Mm),
                "aten::max_pool2d_with_indices.out" => max_pool(g, c),
                "aten::_softmax.out" => safe_softmax(g, rest),
                "aten::cat.out" | "aten::_native_batch_norm_legit_no_training.out" => {
                    super::norm::propose(g, rest)
                }
                "aten::split_with_sizes_copy.out"
                | "aten::sigmoid.out"
                | "aten::tanh.out"
                | "aten::relu.out"
                | "aten::add.out"
                | "aten::sub.out"
                | "aten::mul.out" => super::pointwise::propose(g, rest),
                _ => None,
            };
            match found {
                Some(f) => {
                    i += f.calls.len();
                    out.push(f);
                }
                None => i += 1,
            }
        }
        out
    }
}

/// Argument `i` of a call.
pub(super) fn arg(c: &Call<'_>, i: usize) -> Option<u32> {
    c.args.get(i).copied()
}

/// The single output of a call following the calling convention (listed twice last).
pub(super) fn single_output(c: &Call<'_>) -> Option<u32> {
    match c.args {
        [.., a, b] if a == b => Some(*a),
        _ => None,
    }
}

/// True for a float32 tensor in the default dim order.
pub(super) fn is_f32(g: &Graph<'_>, v: u32) -> bool {
    g.tensor(v)
        .is_some_and(|t| t.dtype == DType::F32 && t.is_contiguous())
}

/// True for a constant float32 tensor, or None when `optional`.
fn is_const_f32(g: &Graph<'_>, v: u32, optional: bool) -> bool {
    (optional && g.is_none(v)) || (is_f32(g, v) && g.is_constant(v))
}

/// An activation applied to `v` by the calls at the start of `calls`: the activation,
/// the scalar arguments it reads (appended to the fused call's arguments from
/// position `next`), its output, and how many calls it spans.
pub(super) fn activation(
    g: &Graph<'_>,
    calls: &[Call<'_>],
    v: u32,
    next: usize,
) -> Option<(Act, Vec<u32>, u32, usize)> {
    let c = calls.first()?;
    if arg(c, 0) != Some(v) {
        return None;
    }
    let out = single_output(c)?;
    if !is_f32(g, out) {
        return None;
    }
    match c.op {
        "aten::relu.out" => Some((Act::Relu, vec![], out, 1)),
        "aten::leaky_relu.out" => {
            let slope = arg(c, 1).filter(|&s| g.double(s).is_some())?;
            Some((Act::LeakyRelu { slope: next }, vec![slope], out, 1))
        }
        "aten::hardtanh.out" | "aten::clamp.out" => {
            let (min, max, out, n) = clamp_chain(g, calls, v)?;
            let (min_pos, max_pos) = (next, next + 1);
            let act = if g.is_none(min) || g.is_none(max) {
                Act::ClampOptional {
                    min: min_pos,
                    max: max_pos,
                }
            } else {
                Act::Clamp {
                    min: min_pos,
                    max: max_pos,
                }
            };
            Some((act, vec![min, max], out, n))
        }
        "aten::add.out" => {
            let (act, out, n) = hard_activation(g, calls, v)?;
            Some((act, vec![], out, n))
        }
        "aten::gelu.out" => {
            let approximate = arg(c, 1).filter(|&s| g.string(s).is_some())?;
            Some((Act::Gelu { approximate: next }, vec![approximate], out, 1))
        }
        "aten::sigmoid.out" => {
            // x · sigmoid(x), in either order, is SiLU.
            let silu = calls.get(1).filter(|m| {
                m.op == "aten::mul.out"
                    && ((arg(m, 0) == Some(v) && arg(m, 1) == Some(out))
                        || (arg(m, 0) == Some(out) && arg(m, 1) == Some(v)))
            });
            match silu
                .and_then(single_output)
                .filter(|&o| is_f32(g, o) && same_shape(g, o, v))
            {
                Some(o) => Some((Act::Silu, vec![], o, 2)),
                None => Some((Act::Sigmoid, vec![], out, 1)),
            }
        }
        _ => None,
    }
}

/// `x + 3 → relu6 → (· x) → / 6`, hardswish as exporters decompose it (hardsigmoid
/// without the product), the 3 and 6 as scalars or one-element constant tensors: the
/// activation, its output and the calls it spans.
fn hard_activation(g: &Graph<'_>, calls: &[Call<'_>], x: u32) -> Option<(Act, u32, usize)> {
    let constant = |v: Option<u32>| v.and_then(|v| g.double(v).or_else(|| g.scalar_constant(v)));
    let add = calls.first()?;
    let alpha = arg(add, 2).and_then(|a| g.double(a));
    if arg(add, 0) != Some(x) || constant(arg(add, 1)) != Some(3.0) || alpha != Some(1.0) {
        return None;
    }
    let shifted = single_output(add)?;
    let (clamped, n) = relu6(g, calls.get(1..)?, shifted)?;
    let mut taken = 1 + n;
    let (act, numerator) = match calls.get(taken) {
        Some(m)
            if m.op == "aten::mul.out"
                && ((arg(m, 0) == Some(x) && arg(m, 1) == Some(clamped))
                    || (arg(m, 0) == Some(clamped) && arg(m, 1) == Some(x))) =>
        {
            taken += 1;
            (Act::HardSwish, single_output(m)?)
        }
        _ => (Act::HardSigmoid, clamped),
    };
    let div = calls.get(taken)?;
    if div.op != "aten::div.out"
        || arg(div, 0) != Some(numerator)
        || constant(arg(div, 1)) != Some(6.0)
    {
        return None;
    }
    let out = single_output(div)?;
    let inner = [shifted, clamped, numerator];
    let fits = |o: u32| is_f32(g, o) && same_shape(g, o, x);
    (inner.iter().all(|&o| fits(o) && only_here(g, o)) && fits(out)).then_some((
        act,
        out,
        taken + 1,
    ))
}

/// True for a value read once, by the next call of a matched chain, and by no view:
/// the chain may drop it (else the runtime would refuse the whole fusion).
fn only_here(g: &Graph<'_>, v: u32) -> bool {
    g.uses(v) == 2 && !g.is_aliased(v)
}

/// `clamp` or `hardtanh` of `x` at the start of `calls`, two calls when a clamp with no
/// upper bound is followed by one with no lower bound (relu6 as some exporters write
/// it; NaN passes both, as it passes one clamp): the bounds (scalars or `None`), the
/// output and the calls taken.
fn clamp_chain(g: &Graph<'_>, calls: &[Call<'_>], x: u32) -> Option<(u32, u32, u32, usize)> {
    let is_clamp = |c: &&Call<'_>| matches!(c.op, "aten::clamp.out" | "aten::hardtanh.out");
    let first = calls
        .first()
        .filter(is_clamp)
        .filter(|c| arg(c, 0) == Some(x))?;
    let out = single_output(first)?;
    let bound =
        |c: &Call<'_>, i: usize| arg(c, i).filter(|&s| g.double(s).is_some() || g.is_none(s));
    let (min, max) = (bound(first, 1)?, bound(first, 2)?);
    let upper = calls.get(1).filter(|m| {
        m.op == "aten::clamp.out"
            && arg(m, 0) == Some(out)
            && only_here(g, out)
            && g.is_none(max)
            && arg(m, 1).is_some_and(|s| g.is_none(s))
    });
    match upper.and_then(|m| Some((bound(m, 2)?, single_output(m)?))) {
        Some((max, o)) if is_f32(g, o) && same_shape(g, o, x) => Some((min, max, o, 2)),
        _ => Some((min, max, out, 1)),
    }
}

/// `clamp(x, 0, 6)` (or hardtanh) at the start of `calls`, in one call or two
/// ([`clamp_chain`]): the output and the calls taken.
fn relu6(g: &Graph<'_>, calls: &[Call<'_>], x: u32) -> Option<(u32, usize)> {
    let (min, max, out, n) = clamp_chain(g, calls, x)?;
    (g.double(min) == Some(0.0) && g.double(max) == Some(6.0)).then_some((out, n))
}

fn same_shape(g: &Graph<'_>, a: u32, b: u32) -> bool {
    matches!((g.tensor(a), g.tensor(b)), (Some(x), Some(y)) if x.sizes == y.sizes)
}

/// A convolution chain matched at the start of some calls: `[constant_pad_nd →]
/// convolution [→ batch norm] [→ activation | → add [→ activation]]`.
pub(super) struct ConvChain {
    /// Argument positions (in the arguments it was matched into).
    pub layout: Layout,
    pub ids: Vec<CallId>,
    pub names: Vec<&'static str>,
    /// The convolution's input, the added tensor, the chain's output.
    pub x: u32,
    pub residual: Option<u32>,
    pub out: u32,
}

/// Matches a convolution chain at the start of `calls`, appending its arguments (the
/// convolution's nine, the pads of a `constant_pad_nd` of zeros before it that it
/// alone reads, batch normalization's five, the residual, the activation's scalars,
/// the output) to `args`. With `transposed`, a transposed convolution, which
/// takes no residual (an addition after it is left to the caller).
pub(super) fn match_conv(
    g: &Graph<'_>,
    calls: &[Call<'_>],
    args: &mut Vec<u32>,
    transposed: bool,
) -> Option<ConvChain> {
    let (pad, calls) = match calls.split_first() {
        Some((p, rest)) if p.op == "aten::constant_pad_nd.out" && !transposed => (Some(p), rest),
        _ => (None, calls),
    };
    let c = calls.first()?;
    if c.op != "aten::convolution.out" {
        return None;
    }
    let (mut x, w, b) = (arg(c, 0)?, arg(c, 1)?, arg(c, 2)?);
    // Zeros padded before the convolution and read by it alone: its own padding.
    let padded = match pad {
        Some(p) => {
            let (src, pads, value) = (arg(p, 0)?, arg(p, 1)?, arg(p, 2)?);
            let rank = g.tensor(x)?.rank();
            let ok = single_output(p) == Some(x)
                && g.uses(x) == 2
                && !g.is_aliased(x)
                && g.double(value) == Some(0.0)
                && is_f32(g, src)
                && g.tensor(src)?.rank() == rank
                && g.int_list(pads)
                    .is_some_and(|l| conv::extra_padding(&l, rank.saturating_sub(2)).is_some());
            if !ok {
                return None;
            }
            x = src;
            Some((p.id, pads))
        }
        None => None,
    };
    let rank = g.tensor(x)?.rank();
    let qualifies = is_f32(g, x)
        && matches!(rank, 3 | 4)
        && is_const_f32(g, w, false)
        && g.tensor(w)?.rank() == rank
        && is_const_f32(g, b, true)
        && g.bool(arg(c, 6)?) == Some(transposed)
        && (3..8).all(|i| i == 6 || arg(c, i).and_then(|l| g.int_list(l)).is_some())
        && arg(c, 8).and_then(|v| g.int(v)).is_some();
    let mut v = arg(c, 9).filter(|&o| qualifies && is_f32(g, o))?;
    let start = args.len();
    args.extend_from_slice(c.args.get(..9)?);
    *args.get_mut(start)? = x;
    let mut m = ConvChain {
        layout: Layout {
            conv: start,
            bn: None,
            residual: None,
            act: Act::None,
            out: 0,
            pad: None,
        },
        ids: vec![c.id],
        names: vec!["convolution"],
        x,
        residual: None,
        out: v,
    };
    if let Some((id, pads)) = padded {
        m.layout.pad = Some(args.len());
        args.push(pads);
        m.ids.insert(0, id);
        m.names.insert(0, "pad");
    }
    let mut at = 1;
    if let Some(bn) = calls
        .get(at)
        .filter(|n| n.op == "aten::_native_batch_norm_legit_no_training.out")
    {
        let params = bn.args.get(1..5)?;
        let eps = arg(bn, 6)?;
        let ok = arg(bn, 0) == Some(v)
            && params
                .iter()
                .enumerate()
                .all(|(i, &p)| is_const_f32(g, p, i < 2))
            && g.double(eps).is_some()
            && arg(bn, 7).is_some_and(|o| is_f32(g, o));
        if ok {
            m.layout.bn = Some(args.len());
            args.extend_from_slice(params);
            args.push(eps);
            v = arg(bn, 7)?;
            m.ids.push(bn.id);
            m.names.push("batch_norm");
            at += 1;
        }
    }
    let rest = calls.get(at..).unwrap_or_default();
    if let Some((act, scalars, out, n)) = activation(g, rest, v, args.len()) {
        m.layout.act = act;
        args.extend(scalars);
        v = out;
        m.ids.extend(rest.iter().take(n).map(|c| c.id));
        m.names.push("activation");
    } else if let Some(add) = rest
        .first()
        .filter(|a| a.op == "aten::add.out" && !transposed)
    {
        let alpha_one = arg(add, 2).and_then(|a| g.double(a)) == Some(1.0);
        let other = match (arg(add, 0), arg(add, 1)) {
            (Some(a), Some(r)) if a == v => Some(r),
            (Some(r), Some(a)) if a == v => Some(r),
            _ => None,
        };
        let out = single_output(add);
        if let (Some(r), Some(out), true) = (other, out, alpha_one) {
            if r != v && is_f32(g, r) && same_shape(g, r, v) && is_f32(g, out) {
                m.layout.residual = Some(args.len());
                m.residual = Some(r);
                args.push(r);
                v = out;
                m.ids.push(add.id);
                m.names.push("add");
                let after = rest.get(1..).unwrap_or_default();
                if let Some((act, scalars, out, n)) = activation(g, after, v, args.len()) {
                    m.layout.act = act;
                    args.extend(scalars);
                    v = out;
                    m.ids.extend(after.iter().take(n).map(|c| c.id));
                    m.names.push("activation");
                }
            }
        }
    }
    m.layout.out = args.len();
    m.out = v;
    args.push(v);
    Some(m)
}

/// A convolution chain of at least two calls as one fused call (NCHW).
fn conv_chain(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let mut args = Vec::new();
    let m = match_conv(g, calls, &mut args, false)?;
    if m.ids.len() == 1 {
        return None;
    }
    args.push(m.out);
    Some(Fusion {
        calls: m.ids,
        name: format!("fused {}", m.names.join("+")),
        kernel: Arc::new(FusedConv(m.layout)),
        args,
    })
}

struct FusedConv(Layout);

impl Kernel for FusedConv {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        conv::prepare_fused(args, self.0)
    }
}

/// A product with a constant weight followed by an activation.
fn product_chain(g: &Graph<'_>, calls: &[Call<'_>], op: Op) -> Option<Fusion> {
    let (c, rest) = calls.split_first()?;
    let w = arg(c, op.weight())?;
    if !is_const_f32(g, w, false) {
        return None;
    }
    product_fusion(g, None, c, rest, op, w)
}

/// The transpose of a constant 2-d weight that the product right after it reads as its
/// right operand [→ activation]: the product packs the weight transposed, so the
/// transpose is never computed (constant folding leaves it for this, see
/// [`Fuser::defer_folding`]).
fn transposed_product(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let (t, rest) = calls.split_first()?;
    let (p, rest) = rest.split_first()?;
    let (w, dims, wt) = (arg(t, 0)?, arg(t, 1)?, single_output(t)?);
    let transpose = g
        .int_list(dims)
        .is_some_and(|d| matches!(d.as_slice(), [1 | -1, 0 | -2]));
    let op = match p.op {
        "aten::addmm.out" => Op::Addmm,
        "aten::mm.out" => Op::Mm,
        _ => return None,
    };
    // Read by the product alone (the transpose lists it twice as its output).
    let only_weight = arg(p, op.weight()) == Some(wt)
        && p.args.iter().filter(|&&a| a == wt).count() == 1
        && g.uses(wt) == 2;
    let matrix = g.tensor(w).is_some_and(|t| t.sizes.len() == 2);
    if !(transpose && only_weight && matrix && is_const_f32(g, w, false) && is_f32(g, wt)) {
        return None;
    }
    product_fusion(g, Some(Before::Transpose(t)), p, rest, op, w)
}

/// The call a fused product reads its right operand through.
#[derive(Clone, Copy)]
enum Before<'c, 'a> {
    /// `permute_copy` transposing a constant weight: packed from its stored layout.
    Transpose(&'c Call<'a>),
    /// `expand_copy` repeating a constant matrix over a batch: never materialized.
    Expand(&'c Call<'a>),
}

impl<'c, 'a> Before<'c, 'a> {
    fn call(self) -> &'c Call<'a> {
        match self {
            Before::Transpose(c) | Before::Expand(c) => c,
        }
    }
}

/// `expand_copy` repeating a constant matrix (`[k, n]`, or with leading ones) over a
/// batch, read only by the `bmm` right after it as its right operand [→ activation]:
/// one product of all the batch's rows (`Op::Broadcast`). `linear` on a tensor that is
/// not contiguous exports this way (attention's input projection on a batch of
/// sequences in `nn.MultiheadAttention`), repeating the weight once per row.
fn broadcast_product(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let (e, p, rest) = repeated_matrix(g, calls)?;
    let w = arg(e, 0)?;
    if !is_const_f32(g, w, false) {
        return None;
    }
    product_fusion(g, Some(Before::Expand(e)), p, rest, Op::Broadcast, w)
}

/// The `expand_copy` of a matrix and the `bmm` reading it that start `calls` (see
/// [`broadcast_product`]), and the calls after them; the matrix may not be constant
/// yet (folding defers the expansion, or it would repeat the matrix in memory).
fn repeated_matrix<'c, 'a>(
    g: &Graph<'_>,
    calls: &'c [Call<'a>],
) -> Option<(&'c Call<'a>, &'c Call<'a>, &'c [Call<'a>])> {
    let (e, rest) = calls.split_first()?;
    let (p, rest) = rest.split_first()?;
    if p.op != "aten::bmm.out" {
        return None;
    }
    let (w, expanded, rhs) = (arg(e, 0)?, single_output(e)?, arg(p, 1)?);
    let (wt, et, rt) = (g.tensor(w)?, g.tensor(expanded)?, g.tensor(rhs)?);
    // The weight is one matrix, repeated whole: the expansion's and the product's
    // right operand (the expansion or a view of it) end with the weight's two sizes.
    let lead = wt.rank().checked_sub(2)?;
    let (ones, matrix) = wt.sizes.split_at(lead);
    let repeats =
        |t: &pte_runtime::TensorInfo| t.rank() >= 2 && t.sizes.get(t.rank() - 2..) == Some(matrix);
    let read_once = p.args.iter().filter(|&&a| a == rhs).count() == 1
        && arg(p, 0) != Some(rhs)
        && (rhs == expanded || (g.is_view_of(rhs, expanded) && et.numel() == rt.numel()));
    let ok = ones.iter().all(|&d| d == 1)
        && repeats(&et)
        && repeats(&rt)
        && rt.rank() == 3
        && read_once
        && g.uses(expanded) == if rhs == expanded { 2 } else { 1 }
        && g.uses(rhs) == 1 + u32::from(rhs == expanded)
        && is_f32(g, w)
        && is_f32(g, expanded);
    ok.then_some((e, p, rest))
}

/// The fused call of product `c` with `weight` as its right operand [read transposed,
/// after the `transpose` call], followed by the activation that `rest` starts with,
/// or else by the elementwise chain there that reads it (`pointwise::after_product`);
/// without a transpose one of them is required (a product alone needs no fusion).
fn product_fusion(
    g: &Graph<'_>,
    before: Option<Before<'_, '_>>,
    c: &Call<'_>,
    rest: &[Call<'_>],
    op: Op,
    weight: u32,
) -> Option<Fusion> {
    let transposed = matches!(before, Some(Before::Transpose(_)));
    let n_args = op.arguments();
    let v = single_output(c)?;
    if !is_f32(g, v) {
        return None;
    }
    let mut args: Vec<u32> = c.args.get(..n_args)?.to_vec();
    *args.get_mut(op.weight())? = weight;
    let mut ids: Vec<_> = before.iter().map(|b| b.call().id).collect();
    ids.push(c.id);
    let product_name = format!(
        "fused {}{}",
        match before {
            Some(Before::Transpose(_)) => "permute+",
            Some(Before::Expand(_)) => "expand+",
            None => "",
        },
        c.op.trim_start_matches("aten::").trim_end_matches(".out"),
    );
    let (act, scalars, out, n) = match product_activation(g, rest, v, n_args) {
        Some(found) => found,
        None => {
            let product = super::pointwise::ProductCalls {
                ids: ids.clone(),
                args: args.clone(),
                op,
                transposed,
                out: v,
                name: product_name.clone(),
            };
            if let Some(f) = super::pointwise::after_product(g, rest, product) {
                return Some(f);
            }
            // A product alone needs no fusion unless it reads through a call before it.
            before?;
            (Act::None, Vec::new(), v, 0)
        }
    };
    args.extend(scalars);
    let out_at = args.len();
    args.extend([out, out]);
    ids.extend(rest.iter().take(n).map(|c| c.id));
    Some(Fusion {
        calls: ids,
        name: format!("{product_name}{}", if n > 0 { "+activation" } else { "" }),
        kernel: Arc::new(FusedProduct {
            op,
            act,
            out: out_at,
            transposed,
        }),
        args,
    })
}

/// The activation the calls at the start of `rest` apply to product output `v` (see
/// [`activation`]).
fn product_activation(
    g: &Graph<'_>,
    rest: &[Call<'_>],
    v: u32,
    next: usize,
) -> Option<(Act, Vec<u32>, u32, usize)> {
    // The activation may read the product through an elided view (a reshape of the
    // same elements): the fused call then writes the activation's shape.
    let x = rest.first().and_then(|c| arg(c, 0))?;
    let same_elements = |a: u32, b: u32| {
        matches!((g.tensor(a), g.tensor(b)), (Some(s), Some(t))
            if s.sizes.iter().product::<usize>() == t.sizes.iter().product::<usize>())
    };
    if x != v && !(g.is_view_of(x, v) && is_f32(g, x) && same_elements(x, v)) {
        return None;
    }
    activation(g, rest, x, next)
}

struct FusedProduct {
    op: Op,
    act: Act,
    out: usize,
    /// The weight argument is the transpose of the product's right operand.
    transposed: bool,
}

impl Kernel for FusedProduct {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        linear::prepare_fused(args, self.op, self.act, self.out, self.transposed)
    }
}

/// `max_pool2d_with_indices` as a call without its indices output, when the runtime
/// finds that nothing reads them.
fn max_pool(g: &Graph<'_>, c: &Call<'_>) -> Option<Fusion> {
    let (x, values) = (arg(c, 0)?, arg(c, 6)?);
    if !is_f32(g, x) || !is_f32(g, values) {
        return None;
    }
    let mut args: Vec<u32> = c.args.get(..6)?.to_vec();
    args.extend([values, values]);
    Some(Fusion {
        calls: vec![c.id],
        name: "max_pool2d".into(),
        kernel: Arc::new(MaxPoolValues),
        args,
    })
}

struct MaxPoolValues;

/// The rearrangement a call makes of its input, if it only rearranges it.
fn rearrangement(g: &Graph<'_>, c: &Call<'_>) -> Option<Rearrange> {
    let ints = |i: usize| arg(c, i).and_then(|v| g.int_list(v));
    Some(match c.op {
        "aten::permute_copy.out" => Rearrange::Permute(ints(1)?),
        "aten::unsqueeze_copy.out" => Rearrange::Unsqueeze(g.int(arg(c, 1)?)?),
        "aten::squeeze_copy.out" => Rearrange::Squeeze(None),
        "aten::squeeze_copy.dim_out" => {
            Rearrange::Squeeze(Some(smallvec::smallvec![g.int(arg(c, 1)?)?]))
        }
        "aten::squeeze_copy.dims_out" => Rearrange::Squeeze(Some(ints(1)?)),
        "aten::clone.out" | "aten::alias_copy.out" => Rearrange::Keep,
        "dim_order_ops::_clone_dim_order.out" => {
            // Only to the default dim order (the output is checked contiguous below).
            crate::shape::alias::default_dim_order(g, arg(c, 2)?)?.then_some(Rearrange::Keep)?
        }
        _ => return None,
    })
}

/// Consecutive calls that only rearrange elements, each reading the previous one's
/// output and nothing else reading it: one gather from the first input. Proposed
/// only when the chain moves data (a chain that keeps the elements in order is left
/// to alias elision, which makes it free).
fn copy_chain(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let x = arg(calls.first()?, 0)?;
    let t = g.tensor(x)?;
    if !t.is_contiguous() {
        return None;
    }
    let (mut sizes, mut strides) = (t.sizes.clone(), crate::layout::row_major(&t.sizes));
    let (mut steps, mut ids, mut out) = (Vec::new(), Vec::new(), x);
    for c in calls {
        let Some(step) = (arg(c, 0) == Some(out))
            .then(|| rearrangement(g, c))
            .flatten()
        else {
            break;
        };
        let Some((y, yt)) = single_output(c).and_then(|y| Some((y, g.tensor(y)?))) else {
            break;
        };
        let (mut s, mut st) = (sizes.clone(), strides.clone());
        if step.apply(&mut s, &mut st).is_err()
            || yt.sizes != s
            || yt.dtype != t.dtype
            || !yt.is_contiguous()
        {
            break;
        }
        (sizes, strides, out) = (s, st, y);
        steps.push(step);
        ids.push(c.id);
        // A value read elsewhere ends the chain (the group's own two references: its
        // producer and the next call).
        if g.uses(y) != 2 {
            break;
        }
    }
    (steps.len() >= 2 && !crate::shape::in_order(&sizes, &strides)).then(|| Fusion {
        calls: ids,
        name: "fused copies".into(),
        kernel: Arc::new(CopyChain(steps)),
        args: vec![x, out, out],
    })
}

/// A chain of rearranging copies run as one (`(x, out, out)`); it keeps nothing per
/// call site, so each site runs a copy of it.
#[derive(Clone)]
struct CopyChain(Vec<Rearrange>);

impl Kernel for CopyChain {
    fn prepare(&self, _: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        Ok(Box::new(self.clone()))
    }
}

impl PreparedKernel for CopyChain {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        crate::shape::rearranged(args, &self.0)
    }
}

/// A `_softmax` over the last dimension of `x` followed by the calls of PyTorch's
/// `_safe_softmax` decomposition: `m = eq(x, -inf)`, `all(m, dim, keepdim)` written as
/// `logical_not(any(logical_not(m)))`, `z = full_like(softmax, 0)`,
/// `where(all, z, softmax)`.
fn safe_softmax(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let [softmax, eq, not_masked, any, all, zeros, pick, ..] = calls else {
        return None;
    };
    let (x, dim, s) = (arg(softmax, 0)?, arg(softmax, 1)?, single_output(softmax)?);
    let rank = g.tensor(x)?.sizes.len() as i64;
    let last = |d: u32| {
        g.int(d)
            .is_some_and(|d| rank > 0 && (d == -1 || d == rank - 1))
    };
    let reads = |c: &Call<'_>, op: &str, i: usize, v: Option<u32>| {
        c.op == op && v.is_some() && arg(c, i) == v
    };
    let out = single_output(pick)?;
    let matched = softmax.op == "aten::_softmax.out"
        && g.bool(arg(softmax, 2)?) == Some(false)
        && last(dim)
        && is_f32(g, x)
        && is_f32(g, s)
        && is_f32(g, out)
        && reads(eq, "aten::eq.Scalar_out", 0, Some(x))
        && g.double(arg(eq, 1)?) == Some(f64::NEG_INFINITY)
        && reads(not_masked, "aten::logical_not.out", 0, single_output(eq))
        && reads(any, "aten::any.out", 0, single_output(not_masked))
        && last(arg(any, 1)?)
        && g.bool(arg(any, 2)?) == Some(true)
        && reads(all, "aten::logical_not.out", 0, single_output(any))
        && reads(zeros, "aten::full_like.out", 0, Some(s))
        && g.double(arg(zeros, 1)?) == Some(0.0)
        && reads(pick, "aten::where.self_out", 0, single_output(all))
        && arg(pick, 1) == single_output(zeros)
        && arg(pick, 2) == Some(s);
    matched.then(|| Fusion {
        calls: [softmax, eq, not_masked, any, all, zeros, pick]
            .map(|c| c.id)
            .to_vec(),
        name: "fused safe softmax".into(),
        kernel: Arc::new(super::rows::SafeSoftmax),
        args: vec![x, dim, out, out],
    })
}

impl Kernel for MaxPoolValues {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        pool::prepare_max_values(args)
    }
}
