//! Which copies move no data: calls whose output is a run of their input's elements in
//! the same order, so that the runtime may point the output at the input's bytes and
//! skip the call (see `pte_runtime::Alias`).
//!
//! Both tensors must have the default dim order and one dtype, and the output exactly
//! the shape the operator gives (a program whose shapes disagree keeps its call, and
//! the kernel reports the error). Then:
//! - `view_copy`, `unsqueeze_copy`, `squeeze_copy`, `alias_copy`, `detach_copy`, `clone`,
//!   `_clone_dim_order` keep every element in place;
//! - `expand_copy` does when it repeats nothing (the same number of elements);
//! - `permute_copy` does when the dimensions longer than 1 keep their order;
//! - `select_copy` and `slice_copy` (step 1) read one run when every dimension before
//!   the selected one has size 1, and so does each output of `split_copy`,
//!   `split_with_sizes_copy` and `unbind_copy` (one alias per output).

use pte_runtime::{normalize_dim, Alias, Call, Dims, Graph, TensorInfo};

use super::{in_order, Rearrange};
use crate::layout::row_major;
use crate::util::{dim_set, infer_sizes, slice_bounds, wrap_index};

/// Whether a `_clone_dim_order` call's `dim_order` argument asks for the default order
/// (None, or `0, 1, ..`); None when it is neither None nor a list of ints.
pub(crate) fn default_dim_order(g: &Graph<'_>, order: u32) -> Option<bool> {
    Some(
        g.is_none(order)
            || g.int_list(order)?
                .iter()
                .enumerate()
                .all(|(i, &d)| usize::try_from(d) == Ok(i)),
    )
}

/// The aliases among a method's calls.
pub(crate) fn propose(g: &Graph<'_>) -> Vec<Alias> {
    let mut out = Vec::new();
    for c in g.calls() {
        match alias(g, c) {
            Some(a) => out.push(a),
            None => out.extend(pieces(g, c).unwrap_or_default()),
        }
    }
    out
}

/// One alias per output of a split into pieces along a dimension that only dimensions
/// of size 1 precede: every piece is a run of the input (the runtime elides the call
/// only with all of them).
fn pieces(g: &Graph<'_>, c: &Call<'_>) -> Option<Vec<Alias>> {
    let (&input, &list) = (c.args.first()?, c.args.last()?);
    let outs = g.tensor_list(list)?;
    let x = g.tensor(input)?;
    if !x.is_contiguous() {
        return None;
    }
    let arg = |i: usize| c.args.get(i).copied();
    let dim = |i: usize| normalize_dim(g.int(arg(i)?)?, x.rank()).ok();
    let (d, keep_dim, lens): (usize, bool, Vec<usize>) = match c.op {
        "aten::split_with_sizes_copy.out" => {
            let lens = g.int_list(arg(1)?)?;
            let lens = lens.iter().map(|&s| usize::try_from(s).ok());
            (dim(2)?, true, lens.collect::<Option<_>>()?)
        }
        "aten::split_copy.Tensor_out" => {
            let d = dim(2)?;
            let size = *x.sizes.get(d)?;
            let step = usize::try_from(g.int(arg(1)?)?).ok().filter(|&s| s > 0)?;
            // As many pieces as outputs, before listing them (sizes come from the file).
            (size.div_ceil(step) == outs.len()).then_some(())?;
            let lens = (0..size).step_by(step).map(|s| step.min(size - s));
            (d, true, lens.collect())
        }
        "aten::unbind_copy.int_out" => {
            let d = dim(1)?;
            (*x.sizes.get(d)? == outs.len()).then_some(())?;
            (d, false, vec![1; outs.len()])
        }
        _ => return None,
    };
    let total = lens.iter().try_fold(0usize, |t, &l| t.checked_add(l))?;
    if lens.len() != outs.len() || total != *x.sizes.get(d)? {
        return None;
    }
    let mut start = 0;
    let mut aliases = Vec::with_capacity(outs.len());
    for (&output, &len) in outs.iter().zip(&lens) {
        let y = g.tensor(output)?;
        let mut sizes = x.sizes.clone();
        if keep_dim {
            *sizes.get_mut(d)? = len;
        } else {
            sizes.remove(d);
        }
        if y.dtype != x.dtype || !y.is_contiguous() || y.sizes != sizes {
            return None;
        }
        aliases.push(Alias {
            call: c.id,
            input,
            output,
            offset: leading_run(&x, d, start)?,
        });
        start += len;
    }
    Some(aliases)
}

fn alias(g: &Graph<'_>, c: &Call<'_>) -> Option<Alias> {
    let (&input, &output) = (c.args.first()?, c.args.last()?);
    if c.args.get(c.args.len().checked_sub(2)?) != Some(&output) {
        return None;
    }
    let (x, y) = (g.tensor(input)?, g.tensor(output)?);
    if x.dtype != y.dtype || !x.is_contiguous() || !y.is_contiguous() {
        return None;
    }
    let arg = |i: usize| c.args.get(i).copied();
    let int = |i: usize| arg(i).and_then(|v| g.int(v));
    let ints = |i: usize| arg(i).and_then(|v| g.int_list(v));
    let (sizes, offset) = match c.op {
        "aten::view_copy.out" => (infer_sizes(&ints(1)?, x.numel()).ok()?, 0),
        "aten::unsqueeze_copy.out" => {
            let d = normalize_dim(int(1)?, x.rank() + 1).ok()?;
            let mut s = x.sizes.clone();
            s.insert(d, 1);
            (s, 0)
        }
        "aten::squeeze_copy.out" => (squeezed(&x, |_| true), 0),
        "aten::squeeze_copy.dim_out" => {
            let d = normalize_dim(int(1)?, x.rank()).ok()?;
            (squeezed(&x, |i| i == d), 0)
        }
        "aten::squeeze_copy.dims_out" => {
            let set = dim_set(&ints(1)?, x.rank()).ok()?;
            (squeezed(&x, |i| set.get(i) == Some(&true)), 0)
        }
        "aten::alias_copy.out" | "aten::detach_copy.out" | "aten::clone.out" => {
            (x.sizes.clone(), 0)
        }
        "dim_order_ops::_clone_dim_order.out" => {
            // The requested dim order, if any, must be the output's (the default).
            (default_dim_order(g, arg(2)?)?.then(|| x.sizes.clone())?, 0)
        }
        "aten::expand_copy.out" => {
            let want = ints(1)?;
            let lead = want.len().checked_sub(x.rank())?;
            let mut s = Dims::new();
            for (i, &w) in want.iter().enumerate() {
                let have = i.checked_sub(lead).and_then(|j| x.sizes.get(j).copied());
                s.push(match (w, have) {
                    (-1, Some(h)) => h,
                    (w, _) => usize::try_from(w).ok()?,
                });
            }
            (s, 0)
        }
        "aten::permute_copy.out" => {
            let (mut s, mut strides) = (x.sizes.clone(), row_major(&x.sizes));
            Rearrange::Permute(ints(1)?)
                .apply(&mut s, &mut strides)
                .ok()?;
            (in_order(&s, &strides).then_some(s)?, 0)
        }
        "aten::select_copy.int_out" => {
            let d = normalize_dim(int(1)?, x.rank()).ok()?;
            let size = *x.sizes.get(d)?;
            let index = wrap_index(int(2)?, size, d).ok()?;
            let mut s = x.sizes.clone();
            s.remove(d);
            (s, leading_run(&x, d, index)?)
        }
        "aten::slice_copy.Tensor_out" => {
            let d = normalize_dim(int(1)?, x.rank()).ok()?;
            let size = *x.sizes.get(d)?;
            let bound = |i: usize| {
                let v = arg(i)?;
                if g.is_none(v) {
                    Some(None)
                } else {
                    g.int(v).map(Some)
                }
            };
            if int(4)? != 1 {
                return None;
            }
            let (start, len) = slice_bounds(size, bound(2)?, bound(3)?, 1).ok()?;
            let mut s = x.sizes.clone();
            *s.get_mut(d)? = len;
            (s, leading_run(&x, d, start)?)
        }
        _ => return None,
    };
    let fits = offset
        .checked_add(y.numel())
        .is_some_and(|e| e <= x.numel());
    (sizes == y.sizes && fits).then_some(Alias {
        call: c.id,
        input,
        output,
        offset,
    })
}

/// The sizes without the dimensions of size 1 that `drop` selects.
fn squeezed(x: &TensorInfo, drop: impl Fn(usize) -> bool) -> Dims {
    x.sizes
        .iter()
        .enumerate()
        .filter(|&(i, &s)| !(s == 1 && drop(i)))
        .map(|(_, &s)| s)
        .collect()
}

/// The offset of index `i` along dimension `d` when the dimensions before it have size
/// 1 (so that what follows is one run); None otherwise.
fn leading_run(x: &TensorInfo, d: usize, i: usize) -> Option<usize> {
    let (before, from) = x.sizes.split_at(d);
    if before.iter().any(|&s| s != 1) {
        return None;
    }
    let inner = from
        .get(1..)?
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))?;
    i.checked_mul(inner)
}
