//! Data movement: views materialized as copies (permute, view, expand, slice, select,
//! squeeze, transpose, ...), concatenation and splitting, dtype and dim-order conversions
//! (`_to_copy`, `_to_dim_order_copy`, `copy_`), padding, repetition, flips, rolls,
//! `tril`, pixel (un)shuffle, and the creation ops (in `creation`).
//!
//! Data movement never dispatches on the dtype: each kernel describes where its output's
//! elements come from as a `Layout` over the input in row-major order and hands it to
//! one strided copy (`layout::copy`), which merges contiguous dimensions into `memcpy`
//! runs. Inputs and outputs of other dim orders are seen in row-major order through
//! `Dense`. Only conversions and fills are typed.

pub(crate) mod alias;
mod creation;
mod pad;

use pte_runtime::{
    normalize_dim, Arg, Args, Dims, KernelError, KernelRegistry, KernelResult, TensorInfo,
};
use smallvec::SmallVec;

use crate::layout::{as_dtype, as_dtype_piece, copy, copy_into, copy_to_contiguous, row_major};
use crate::layout::{window, Along, Dense, PARALLEL_COPY_BYTES};
use crate::layout::{Layout, Strides, Walk};
use crate::num::Elem;
use crate::util::{dim_of, dim_set, infer_sizes, numel_of, oob, prod, same_dtype, slice_bounds};
use crate::util::{to_size, wrap_index, Checked};

/// Resizes output `out` to `sizes` and fills it from input `src` (same dtype), walking
/// `walk` (whose row-major order is the output's) and reading through `layout` (over
/// the input in row-major order).
fn gather(
    args: &mut Args<'_>,
    src: usize,
    out: usize,
    sizes: &[usize],
    walk: &[usize],
    layout: &Layout,
) -> KernelResult {
    args.resize(out, sizes)?;
    let (x, y) = (args.info(src)?, args.info(out)?);
    let dtype = x.dtype;
    same_dtype(dtype, y.dtype)?;
    // A run of the input's elements, both tensors in the default order: one copy of
    // the bytes, without walking layouts (unless large enough to split over threads).
    // Views, squeezes and slices of leading dims are such runs.
    let bytes = y.nbytes();
    if x.is_contiguous() && y.is_contiguous() && bytes < PARALLEL_COPY_BYTES && is_run(walk, layout)
    {
        let start = layout.offset.checked_mul(dtype.size()).ok_or_else(oob)?;
        let mut io = args.io(&[src.into()], &[out.into()])?;
        let (inputs, outputs) = (&io.inputs, &mut io.outputs);
        let from = inputs.first().ok_or_else(oob)?.bytes();
        let from = from.get(start..start + bytes).ok_or_else(oob)?;
        return copy_run(outputs.first_mut().ok_or_else(oob)?.bytes_mut(), from);
    }
    let pool = args.pool();
    let mut io = Dense::io(args, &[src.into()], &[out.into()], &[])?;
    let input = io.bytes(0)?;
    copy_to_contiguous(pool, dtype.size(), walk, input, layout, io.bytes_mut(0)?)?;
    io.finish()
}

/// Copies `src` into `dst`, which must be as long (a fast path's run of bytes).
fn copy_run(dst: &mut [u8], src: &[u8]) -> KernelResult {
    if dst.len() != src.len() {
        return Err(oob());
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// True when `layout` walks `walk` as one run of consecutive elements (the row-major
/// strides of `walk`, wherever a dim is longer than 1).
fn is_run(walk: &[usize], layout: &Layout) -> bool {
    let dense = row_major(walk);
    walk.len() == layout.strides.len()
        && walk
            .iter()
            .zip(layout.strides.iter().zip(&dense))
            .all(|(&n, (s, d))| n <= 1 || s == d)
}

/// An output with new sizes and the input's elements in the same order.
fn reshape(args: &mut Args<'_>, out: usize, sizes: &[usize]) -> KernelResult {
    let numel = args.info(0)?.numel();
    if numel_of(sizes)? != numel {
        return Err(KernelError::invalid(format!(
            "cannot view {numel} elements as {sizes:?}"
        )));
    }
    gather(args, 0, out, sizes, sizes, &Layout::contiguous(sizes))
}

/// Output `out` as a converting, broadcasting, dim-order-aware copy of tensor `src`.
fn copy_op(args: &mut Args<'_>, src: usize, out: usize, sizes: &[usize]) -> KernelResult {
    args.resize(out, sizes)?;
    let io = args.io_strided(&[src.into()], &[out.into()])?;
    let (Some(input), Some(output)) = (io.inputs.first(), io.outputs.into_iter().next()) else {
        return Err(oob());
    };
    let mut output = output;
    copy_into(input, &mut output, io.scratch)
}

/// Output sizes and input layout of a permutation of `x`'s dims.
fn permuted(x: &TensorInfo, perm: &[usize]) -> KernelResult<(Dims, Layout)> {
    let st = row_major(&x.sizes);
    let sizes = perm.iter().map(|&d| x.sizes.at(d).copied());
    let strides = perm.iter().map(|&d| st.at(d).copied());
    Ok((
        sizes.collect::<KernelResult<_>>()?,
        Layout::new(0, strides.collect::<KernelResult<Strides>>()?),
    ))
}

fn permute_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dims = args.int_list(1)?;
    if dims.len() != x.rank() {
        return Err(KernelError::invalid(format!(
            "permutation {dims:?} for rank {}",
            x.rank()
        )));
    }
    dim_set(&dims, x.rank())?;
    let perm: Dims = dims
        .iter()
        .map(|&d| normalize_dim(d, x.rank()))
        .collect::<KernelResult<_>>()?;
    let perm = if x.rank() == 0 { Dims::new() } else { perm };
    let (sizes, layout) = permuted(x, &perm)?;
    gather(args, 0, 2, &sizes, &sizes, &layout)
}

/// One call of a chain of copies that only rearrange their input's elements (see
/// [`rearranged`]), with its arguments as the program gives them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Rearrange {
    /// `permute_copy(dims)`.
    Permute(SmallVec<[i64; 8]>),
    /// `unsqueeze_copy(dim)`.
    Unsqueeze(i64),
    /// `squeeze_copy`: the listed dims of size 1 (all with `None`).
    Squeeze(Option<SmallVec<[i64; 8]>>),
    /// `clone`, `alias_copy`, `_clone_dim_order` to the default order: no change.
    Keep,
}

impl Rearrange {
    /// Applies the step to a view of the chain's input: `sizes` and `strides` (in
    /// elements of the input) become those of the step's output.
    pub(crate) fn apply(&self, sizes: &mut Dims, strides: &mut Strides) -> KernelResult {
        match self {
            Rearrange::Permute(dims) => {
                if dims.len() != sizes.len() {
                    return Err(KernelError::invalid(format!(
                        "permutation {dims:?} for rank {}",
                        sizes.len()
                    )));
                }
                dim_set(dims, sizes.len())?;
                let perm: Dims = dims
                    .iter()
                    .map(|&d| normalize_dim(d, sizes.len()))
                    .collect::<KernelResult<_>>()?;
                let (old_sizes, old_strides) = (sizes.clone(), strides.clone());
                for (k, &d) in perm.iter().enumerate() {
                    *sizes.at_mut(k)? = *old_sizes.at(d)?;
                    *strides.at_mut(k)? = *old_strides.at(d)?;
                }
            }
            Rearrange::Unsqueeze(d) => {
                let d = normalize_dim(*d, sizes.len() + 1)?;
                sizes.insert(d, 1);
                strides.insert(d, 0);
            }
            Rearrange::Squeeze(dims) => {
                let set = match dims {
                    Some(dims) => dim_set(dims, sizes.len())?,
                    None => smallvec::smallvec![true; sizes.len()],
                };
                let keep: SmallVec<[bool; 8]> = sizes
                    .iter()
                    .zip(&set)
                    .map(|(&n, &s)| !(s && n == 1))
                    .collect();
                let mut k = keep.iter();
                sizes.retain(|_| k.next().copied().unwrap_or(true));
                let mut k = keep.iter();
                strides.retain(|_| k.next().copied().unwrap_or(true));
            }
            Rearrange::Keep => {}
        }
        Ok(())
    }
}

/// Whether a view of a contiguous input (`sizes`, `strides` in its elements) reads the
/// input's elements in order: the dims longer than 1 keep the input's row-major strides.
pub(crate) fn in_order(sizes: &[usize], strides: &[isize]) -> bool {
    let mut expected = 1isize;
    let mut in_order = true;
    for (&n, &st) in sizes.iter().zip(strides).rev().filter(|(&n, _)| n > 1) {
        in_order &= st == expected;
        expected = expected.saturating_mul(n as isize);
    }
    in_order
}

/// Output 1 as input 0 after a chain of rearranging copies, in one pass: the steps
/// compose into one strided view of the input, gathered once.
pub(crate) fn rearranged(args: &mut Args<'_>, steps: &[Rearrange]) -> KernelResult {
    let x = args.info(0)?;
    let (mut sizes, mut strides) = (x.sizes.clone(), row_major(&x.sizes));
    for step in steps {
        step.apply(&mut sizes, &mut strides)?;
    }
    gather(args, 0, 1, &sizes, &sizes, &Layout::new(0, strides))
}

/// Swaps two dims of input 0 into output `out`.
fn transpose(args: &mut Args<'_>, d0: i64, d1: i64, out: usize) -> KernelResult {
    let x = args.info(0)?;
    let mut perm: Dims = (0..x.rank()).collect();
    let (a, b) = (x.dim(d0)?, x.dim(d1)?);
    if x.rank() > 0 {
        perm.swap(a, b);
    }
    let (sizes, layout) = permuted(x, &perm)?;
    gather(args, 0, out, &sizes, &sizes, &layout)
}

fn transpose_copy(args: &mut Args<'_>) -> KernelResult {
    let (d0, d1) = (args.int(1)?, args.int(2)?);
    transpose(args, d0, d1, 3)
}

fn t_copy(args: &mut Args<'_>) -> KernelResult {
    if args.info(0)?.rank() > 2 {
        return Err(KernelError::invalid(
            "t() expects a tensor with at most 2 dimensions",
        ));
    }
    transpose(args, 0, -1, 1)
}

fn view_copy(args: &mut Args<'_>) -> KernelResult {
    let sizes = infer_sizes(&args.int_list(1)?, args.info(0)?.numel())?;
    reshape(args, 2, &sizes)
}

/// Input sizes without the size-1 dims in `squeeze`.
fn squeeze(args: &mut Args<'_>, squeeze: &[bool], out: usize) -> KernelResult {
    let x = args.info(0)?;
    let sizes: Dims = x
        .sizes
        .iter()
        .zip(squeeze)
        .filter(|&(&n, &s)| !(s && n == 1))
        .map(|(&n, _)| n)
        .collect();
    reshape(args, out, &sizes)
}

fn squeeze_dims(args: &mut Args<'_>) -> KernelResult {
    let set = dim_set(&args.int_list(1)?, args.info(0)?.rank())?;
    squeeze(args, &set, 2)
}

fn squeeze_dim(args: &mut Args<'_>) -> KernelResult {
    let set = dim_set(&[args.int(1)?], args.info(0)?.rank())?;
    squeeze(args, &set, 2)
}

fn squeeze_all(args: &mut Args<'_>) -> KernelResult {
    let set: SmallVec<[bool; 6]> = smallvec::smallvec![true; args.info(0)?.rank()];
    squeeze(args, &set, 1)
}

fn unsqueeze_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let d = normalize_dim(args.int(1)?, x.rank() + 1)?;
    let mut sizes = x.sizes.clone();
    sizes.insert(d, 1);
    reshape(args, 2, &sizes)
}

fn expand_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let req = args.int_list(1)?;
    let Some(lead) = req.len().checked_sub(x.rank()) else {
        return Err(KernelError::invalid(format!(
            "cannot expand {:?} to fewer dims {req:?}",
            x.sizes.as_slice()
        )));
    };
    let sizes: Dims = req
        .iter()
        .enumerate()
        .map(
            |(i, &r)| match i.checked_sub(lead).and_then(|j| x.sizes.get(j)) {
                None => to_size(r, "expanded size of a new leading dim"),
                Some(&n) if r == -1 || r == n as i64 => Ok(n),
                Some(1) => to_size(r, "expanded size"),
                Some(n) => Err(KernelError::invalid(format!(
                    "cannot expand dim {i} of size {n} to {r}"
                ))),
            },
        )
        .collect::<KernelResult<_>>()?;
    numel_of(&sizes)?;
    copy_op(args, 0, 3, &sizes)
}

/// Copies input 0 into output `out` with the same sizes (dtype and dim order are the
/// output's): clone, alias, detach, `_to_copy`, `_to_dim_order_copy`.
fn copy_same_sizes(args: &mut Args<'_>, out: usize) -> KernelResult {
    let sizes = args.tensor(0)?.sizes;
    copy_op(args, 0, out, &sizes)
}

/// `_to_dim_order_copy` / `_clone_dim_order`: the `dim_order` argument, when given, must
/// be the output's (which the program fixes).
fn dim_order_copy(args: &mut Args<'_>) -> KernelResult {
    if let Some(order) = args.opt_int_list(2)? {
        let out = args.info(3)?;
        if !order
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .eq(out.dim_order.iter().map(|&d| Some(d)))
        {
            return Err(KernelError::invalid(format!(
                "dim_order {order:?} differs from the output's {:?}",
                out.dim_order.as_slice()
            )));
        }
    }
    copy_same_sizes(args, 3)
}

/// `copy.out(self, src, non_blocking, out)`: `src` broadcast to `self`'s shape.
fn copy_out(args: &mut Args<'_>) -> KernelResult {
    let sizes = args.tensor(0)?.sizes;
    copy_op(args, 1, 3, &sizes)
}

/// `copy_(self, src, non_blocking)`: writes `src` (broadcast, converted) into `self`.
fn copy_in_place(args: &mut Args<'_>) -> KernelResult {
    let sizes = args.tensor(0)?.sizes;
    copy_op(args, 1, 0, &sizes)
}

/// Copies the tensors of list 0 at `items` (ascending) into output `out`, each at its
/// `(offset, extent)` along `along`, converted to the output's dtype: one `io` call per
/// [`PARTS_PER_CALL`] parts (a recurrent network's `cat` of 32 time steps made 32).
fn place(
    args: &mut Args<'_>,
    items: &[(usize, usize, usize)],
    out: usize,
    along: Along,
) -> KernelResult {
    let y = args.info(out)?;
    let dtype = y.dtype;
    // With only ones before `along`'s dim and every tensor of the output's dtype in the
    // default order, each part fills one run of the output's bytes: copied as such,
    // without walking layouts (a recurrent network stacks its steps so).
    let runs = along.outer == 1 && y.is_contiguous();
    for group in items.chunks(PARTS_PER_CALL) {
        let mut parts: SmallVec<[Arg; PARTS_PER_CALL]> = SmallVec::new();
        let mut pieces: SmallVec<[(usize, usize); PARTS_PER_CALL]> = SmallVec::new();
        let mut as_runs = runs;
        for &(j, _, _) in group {
            let t = args.info(Arg::Item(0, j))?;
            as_runs &= t.dtype == dtype && t.is_contiguous();
            parts.push(Arg::Item(0, j));
            pieces.push(as_dtype_piece(t, dtype));
        }
        if as_runs {
            let row = dtype.size() * along.inner;
            let mut io = args.io(&parts, &[out.into()])?;
            let (inputs, outputs) = (&io.inputs, &mut io.outputs);
            let dst = outputs.first_mut().ok_or_else(oob)?.bytes_mut();
            for (input, &(_, at, extent)) in inputs.iter().zip(group) {
                let to = dst.get_mut(at * row..(at + extent) * row).ok_or_else(oob)?;
                copy_run(to, input.bytes())?;
            }
            continue;
        }
        let mut io = Dense::io(args, &parts, &[out.into()], &pieces)?;
        for (k, &(_, at, extent)) in group.iter().enumerate() {
            let (info, bytes) = io.inputs.get(k).cloned().ok_or_else(oob)?;
            let data = as_dtype(&info, bytes, dtype, &mut io.scratch)?;
            let (walk, dst) = along.part(at, extent);
            let src = Layout::contiguous(&walk);
            copy(dtype.size(), &walk, data, &src, io.bytes_mut(0)?, &dst)?;
        }
        io.finish()?;
    }
    Ok(())
}

/// Parts of a `cat` or `stack` read by one `io` call: as many inputs as its views
/// hold without a heap allocation, less the output.
const PARTS_PER_CALL: usize = 7;

/// PyTorch's `cat` skips 1-D empty tensors whatever the other shapes are.
fn skipped_by_cat(t: &TensorInfo) -> bool {
    t.sizes.as_slice() == [0]
}

fn cat(args: &mut Args<'_>) -> KernelResult {
    let n = args.list_len(0)?;
    let mut first = None;
    for j in 0..n {
        let info = args.info(Arg::Item(0, j))?;
        if !skipped_by_cat(info) {
            first = Some(info);
            break;
        }
    }
    let Some(first) = first else {
        return args.resize(2, &[0]);
    };
    let dim = dim_of(first, args.int(1)?)?;
    let mut sizes = first.sizes.clone();
    *sizes.as_mut_slice().at_mut(dim)? = 0;
    let mut total = 0usize;
    for j in 0..n {
        let t = args.info(Arg::Item(0, j))?;
        if skipped_by_cat(t) {
            continue;
        }
        let matches = t.rank() == sizes.len()
            && t.sizes
                .iter()
                .zip(&sizes)
                .enumerate()
                .all(|(d, (a, b))| d == dim || a == b);
        if !matches {
            return Err(KernelError::invalid(format!(
                "cat: shapes {:?} and {:?} differ outside dim {dim}",
                first.sizes.as_slice(),
                t.sizes.as_slice()
            )));
        }
        total = total
            .checked_add(*t.sizes.at(dim)?)
            .ok_or_else(|| KernelError::invalid("cat: size overflows"))?;
    }
    *sizes.as_mut_slice().at_mut(dim)? = total;
    numel_of(&sizes)?;
    args.resize(2, &sizes)?;
    let along = Along::new(&sizes, dim);
    let mut at = 0;
    let mut group: SmallVec<[(usize, usize, usize); PARTS_PER_CALL]> = SmallVec::new();
    for j in 0..n {
        let t = args.info(Arg::Item(0, j))?;
        if !skipped_by_cat(t) {
            let extent = *t.sizes.at(dim)?;
            group.push((j, at, extent));
            at += extent;
        }
        if group.len() == PARTS_PER_CALL || (j + 1 == n && !group.is_empty()) {
            place(args, &group, 2, along)?;
            group.clear();
        }
    }
    Ok(())
}

fn stack(args: &mut Args<'_>) -> KernelResult {
    let n = args.list_len(0)?;
    if n == 0 {
        return Err(KernelError::invalid(
            "stack expects a non-empty tensor list",
        ));
    }
    let first = args.info(Arg::Item(0, 0))?;
    for j in 1..n {
        let t = args.info(Arg::Item(0, j))?;
        if t.sizes != first.sizes {
            return Err(KernelError::invalid(format!(
                "stack: shapes {:?} and {:?} differ",
                first.sizes.as_slice(),
                t.sizes.as_slice()
            )));
        }
    }
    let dim = normalize_dim(args.int(1)?, first.rank() + 1)?;
    let mut sizes = first.sizes.clone();
    sizes.insert(dim, n);
    numel_of(&sizes)?;
    args.resize(2, &sizes)?;
    let along = Along::new(&sizes, dim);
    for first in (0..n).step_by(PARTS_PER_CALL) {
        let group: SmallVec<[(usize, usize, usize); PARTS_PER_CALL]> = (first
            ..n.min(first + PARTS_PER_CALL))
            .map(|j| (j, j, 1))
            .collect();
        place(args, &group, 2, along)?;
    }
    Ok(())
}

/// The size of dim `dim` of `x`.
fn size(x: &TensorInfo, dim: usize) -> KernelResult<usize> {
    x.sizes.at(dim).copied()
}

fn slice_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(1)?)?;
    let step = args.int(4)?;
    let (start, len) = slice_bounds(size(x, dim)?, args.opt_int(2)?, args.opt_int(3)?, step)?;
    let (sizes, layout) = window(&x.sizes, dim, start, len, step as usize, false)?;
    gather(args, 0, 5, &sizes, &sizes, &layout)
}

fn select_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(1)?)?;
    let index = wrap_index(args.int(2)?, size(x, dim)?, dim)?;
    let (sizes, layout) = window(&x.sizes, dim, index, 1, 1, true)?;
    gather(args, 0, 3, &sizes, &sizes, &layout)
}

fn narrow_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(1)?)?;
    let size = size(x, dim)?;
    let start = args.int(2)?;
    let start = if start < 0 {
        start.saturating_add(size as i64)
    } else {
        start
    };
    let len = to_size(args.int(3)?, "narrow length")?;
    let start = usize::try_from(start)
        .ok()
        .filter(|&s| s.checked_add(len).is_some_and(|e| e <= size));
    let Some(start) = start else {
        return Err(KernelError::invalid(format!(
            "narrow: {} + {len} exceeds dimension size {size}",
            args.int(2)?
        )));
    };
    let (sizes, layout) = window(&x.sizes, dim, start, len, 1, false)?;
    gather(args, 0, 4, &sizes, &sizes, &layout)
}

/// Splits input 0 along `dim` into consecutive pieces of `extents` entries (with `drop`,
/// pieces of 1 lose the dim), written to the tensor list at `list` by one `io` call per
/// [`PIECES_PER_CALL`] pieces, so any number of pieces is fine and none allocates.
fn split_into(
    args: &mut Args<'_>,
    dim: usize,
    extents: &[usize],
    drop: bool,
    list: usize,
) -> KernelResult {
    let x = args.tensor(0)?;
    let count = extents.len();
    if args.list_len(list)? != count {
        return Err(KernelError::invalid(format!(
            "split into {count} pieces, but the output list holds {}",
            args.list_len(list)?
        )));
    }
    let sum = extents.iter().try_fold(0usize, |s, &e| s.checked_add(e));
    if sum != Some(size(&x, dim)?) {
        return Err(KernelError::invalid(format!(
            "split sizes {extents:?} do not sum to dimension size {}",
            size(&x, dim)?
        )));
    }
    let along = Along::new(&x.sizes, dim);
    // With only ones before `dim` and every tensor in the default order, each piece is
    // a run of the input's bytes: copied as such, without walking layouts (an LSTM step
    // cuts its gates so, between the delegate calls of its lowered program).
    let leading_ones = x
        .sizes
        .get(..dim)
        .is_some_and(|s| s.iter().all(|&d| d == 1));
    let mut runs = leading_ones && x.is_contiguous();
    let mut at = 0;
    for (group, chunk) in extents.chunks(PIECES_PER_CALL).enumerate() {
        let first = group * PIECES_PER_CALL;
        let pieces: SmallVec<[Arg; PIECES_PER_CALL]> = (first..first + chunk.len())
            .map(|j| Arg::Item(list, j))
            .collect();
        for (&piece, &e) in pieces.iter().zip(chunk) {
            let (sizes, _) = window(&x.sizes, dim, 0, e, 1, drop)?;
            args.resize(piece, &sizes)?;
            let info = args.info(piece)?;
            same_dtype(x.dtype, info.dtype)?;
            runs &= info.is_contiguous();
        }
        if runs {
            let row = x.dtype.size() * along.inner;
            let mut io = args.io(&[0.into()], &pieces)?;
            let (inputs, outputs) = (&io.inputs, &mut io.outputs);
            let input = inputs.first().ok_or_else(oob)?.bytes();
            for (out, &e) in outputs.iter_mut().zip(chunk) {
                let src = input.get(at * row..(at + e) * row).ok_or_else(oob)?;
                copy_run(out.bytes_mut(), src)?;
                at += e;
            }
            continue;
        }
        let mut io = Dense::io(args, &[0.into()], &pieces, &[])?;
        let input = io.bytes(0)?;
        for (k, &e) in chunk.iter().enumerate() {
            let (walk, src) = along.part(at, e);
            let dst = Layout::contiguous(&walk);
            copy(x.dtype.size(), &walk, input, &src, io.bytes_mut(k)?, &dst)?;
            at += e;
        }
        io.finish()?;
    }
    Ok(())
}

/// Pieces of a split written by one `io` call: as many outputs as its views hold
/// without a heap allocation.
const PIECES_PER_CALL: usize = 4;

fn split_with_sizes_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let sizes: SmallVec<[usize; 8]> = args
        .int_list(1)?
        .iter()
        .map(|&s| to_size(s, "split size"))
        .collect::<KernelResult<_>>()?;
    let dim = dim_of(x, args.int(2)?)?;
    split_into(args, dim, &sizes, false, 3)
}

fn split_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let split = to_size(args.int(1)?, "split size")?;
    let dim = dim_of(x, args.int(2)?)?;
    let size = size(x, dim)?;
    let count = if split == 0 {
        usize::from(size == 0)
    } else {
        size.div_ceil(split).max(1)
    };
    if count > args.list_len(3)? {
        return Err(KernelError::invalid(format!(
            "split of {size} by {split} makes {count} pieces, but the output list holds {}",
            args.list_len(3)?
        )));
    }
    let extents: SmallVec<[usize; 8]> = (0..count)
        .map(|k| split.min(size - (k * split).min(size)))
        .collect();
    split_into(args, dim, &extents, false, 3)
}

fn unbind_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(1)?)?;
    let n = size(x, dim)?;
    if n > args.list_len(2)? {
        return Err(KernelError::invalid(format!(
            "unbind of {n} entries, but the output list holds {}",
            args.list_len(2)?
        )));
    }
    let extents: SmallVec<[usize; 8]> = smallvec::smallvec![1; n];
    split_into(args, dim, &extents, true, 2)
}

/// `diagonal_copy.out(self, offset, dim1, dim2, out)`: the other dims, then the diagonal
/// of `dim1` and `dim2` shifted by `offset` (above the main one when positive).
fn diagonal_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let offset = args.int(1)?;
    let (d1, d2) = (dim_of(x, args.int(2)?)?, dim_of(x, args.int(3)?)?);
    if d1 == d2 {
        return Err(KernelError::invalid(format!(
            "diagonal dimensions cannot be identical: {d1}, {d2}"
        )));
    }
    let st = row_major(&x.sizes);
    let (n1, n2) = (size(x, d1)? as i128, size(x, d2)? as i128);
    let off = i128::from(offset);
    let (start1, start2) = if off >= 0 { (0, off) } else { (-off, 0) };
    let len = (n1 - start1).min(n2 - start2).max(0) as usize;
    let (s1, s2) = (*st.at(d1)?, *st.at(d2)?);
    let mut sizes = Dims::new();
    let mut strides = Strides::new();
    for (d, (&n, &s)) in x.sizes.iter().zip(&st).enumerate() {
        if d != d1 && d != d2 {
            sizes.push(n);
            strides.push(s);
        }
    }
    sizes.push(len);
    strides.push(s1 + s2);
    let start = if len == 0 {
        0
    } else {
        start1 as usize * s1 as usize + start2 as usize * s2 as usize
    };
    gather(args, 0, 4, &sizes, &sizes, &Layout::new(start, strides))
}

/// `as_strided_copy.out(self, size, stride, storage_offset?, out)`: elements of `self`'s
/// row-major data at `storage_offset + Σ index·stride` (every one inside the data).
fn as_strided_copy(args: &mut Args<'_>) -> KernelResult {
    let sizes: Dims = args
        .int_list(1)?
        .iter()
        .map(|&s| to_size(s, "as_strided size"))
        .collect::<KernelResult<_>>()?;
    let strides: Strides = args
        .int_list(2)?
        .iter()
        .map(|&s| to_size(s, "as_strided stride").map(|s| s as isize))
        .collect::<KernelResult<_>>()?;
    if strides.len() != sizes.len() {
        return Err(KernelError::invalid(format!(
            "as_strided: {} sizes but {} strides",
            sizes.len(),
            strides.len()
        )));
    }
    let offset = to_size(args.opt_int(3)?.unwrap_or(0), "storage offset")?;
    numel_of(&sizes)?;
    gather(args, 0, 4, &sizes, &sizes, &Layout::new(offset, strides))
}

/// `unfold_copy.out(self, dimension, size, step, out)`: every window of `size` entries of
/// `dimension` (starting every `step`), the windows along `dimension` and the entries of
/// each as a new last dim.
fn unfold_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = x.dim(args.int(1)?)?;
    let window = to_size(args.int(2)?, "unfold size")?;
    let step = to_size(args.int(3)?, "unfold step")?;
    let n = x.sizes.get(dim).copied().unwrap_or(1);
    if step == 0 || window > n {
        return Err(KernelError::invalid(format!(
            "unfold: size {window} must fit dim {dim} of size {n} and step {step} be positive"
        )));
    }
    let count = (n - window) / step + 1;
    let st = row_major(&x.sizes);
    let mut sizes = x.sizes.clone();
    let mut strides = st.clone();
    let along = st.get(dim).copied().unwrap_or(1);
    if let (Some(s), Some(t)) = (sizes.get_mut(dim), strides.get_mut(dim)) {
        *s = count;
        *t = along * step as isize;
    }
    sizes.push(window);
    strides.push(along);
    gather(args, 0, 4, &sizes, &sizes, &Layout::new(0, strides))
}

/// `repeat_interleave.Tensor_out(repeats, output_size?, out)`: each index `i` of the 1-d
/// `repeats`, `repeats[i]` times (`output_size`, when given, must be the total).
fn repeat_interleave(args: &mut Args<'_>) -> KernelResult {
    let r = args.tensor(0)?;
    if r.rank() > 1 || !matches!(r.dtype, pte_runtime::DType::I64 | pte_runtime::DType::I32) {
        return Err(KernelError::invalid(format!(
            "repeat_interleave takes a 1-d int64 or int32 tensor of repeats, got {} {:?}",
            r.dtype,
            r.sizes.as_slice()
        )));
    }
    let output_size = args.opt_int(1)?;
    let counts: SmallVec<[usize; 16]> = {
        let t = args.read(0)?;
        crate::dispatch_int!(r.dtype, T => {
            crate::layout::typed::<T>(t.bytes())?
                .iter()
                .map(|&v| to_size(v.to_i64(), "repeat count"))
                .collect::<KernelResult<_>>()?
        }, return Err(KernelError::dtypes(&[r.dtype])))
    };
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| KernelError::invalid("repeat_interleave: total overflows"))?;
    if let Some(o) = output_size {
        if usize::try_from(o).ok() != Some(total) {
            return Err(KernelError::invalid(format!(
                "repeat_interleave: output_size {o} differs from the total of the repeats, {total}"
            )));
        }
    }
    args.resize(2, &[total])?;
    same_dtype(r.dtype, args.tensor(2)?.dtype)?;
    let mut io = Dense::io(args, &[], &[2.into()], &[])?;
    crate::dispatch_int!(r.dtype, T => {
        let out = io.output::<T>(0)?;
        let values = counts
            .iter()
            .enumerate()
            .flat_map(|(i, &c)| std::iter::repeat_n(T::from_i64(i as i64), c));
        for (o, v) in out.iter_mut().zip(values) {
            *o = v;
        }
    }, return Err(KernelError::dtypes(&[r.dtype])));
    io.finish()
}

fn repeat(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let reps = args.int_list(1)?;
    let Some(lead) = reps.len().checked_sub(x.rank()) else {
        return Err(KernelError::invalid(format!(
            "repeat {reps:?} has fewer dims than the input's {}",
            x.rank()
        )));
    };
    let st = row_major(&x.sizes);
    // Each output dim is walked as (repetition, input index).
    let (mut sizes, mut walk, mut strides) = (Dims::new(), Walk::new(), Strides::new());
    for (i, &r) in reps.iter().enumerate() {
        let r = to_size(r, "repeat count")?;
        let (n, s) = match i.checked_sub(lead) {
            Some(j) => (size(x, j)?, *st.at(j)?),
            None => (1, 0),
        };
        sizes.push(
            r.checked_mul(n)
                .ok_or_else(|| KernelError::invalid("repeated size overflows"))?,
        );
        walk.extend([r, n]);
        strides.extend([0, s]);
    }
    numel_of(&sizes)?;
    gather(args, 0, 2, &sizes, &walk, &Layout::new(0, strides))
}

fn flip(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let set = dim_set(&args.int_list(1)?, x.rank())?;
    let mut layout = Layout::contiguous(&x.sizes);
    for ((&f, &n), st) in set.iter().zip(&x.sizes).zip(layout.strides.iter_mut()) {
        if f {
            layout.offset += n.saturating_sub(1) * *st as usize;
            *st = -*st;
        }
    }
    gather(args, 0, 2, &x.sizes, &x.sizes, &layout)
}

fn roll(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let shifts = args.int_list(1)?;
    let dims = args.int_list(2)?;
    // Without dims, the flattened tensor rolls.
    let (walk, per_dim): (Dims, SmallVec<[i64; 6]>) = match (dims.as_slice(), shifts.as_slice()) {
        ([], &[s]) => (smallvec::smallvec![x.numel()], smallvec::smallvec![s]),
        ([], _) => return Err(KernelError::invalid("roll without dims takes one shift")),
        (dims, shifts) if dims.len() == shifts.len() => {
            let mut per_dim: SmallVec<[i64; 6]> = smallvec::smallvec![0; x.rank()];
            for (&s, &d) in shifts.iter().zip(dims) {
                let d = dim_of(&x, d)?;
                let slot = per_dim.as_mut_slice().at_mut(d)?;
                *slot = slot.wrapping_add(s);
            }
            (x.sizes.clone(), per_dim)
        }
        (dims, shifts) => {
            return Err(KernelError::invalid(format!(
                "roll: {} shifts for {} dims",
                shifts.len(),
                dims.len()
            )))
        }
    };
    args.resize(3, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let st = row_major(&walk);
    // A rolled dim splits into two pieces: (source start, destination start, length).
    type Pieces = SmallVec<[(usize, usize, usize); 2]>;
    let pieces: SmallVec<[Pieces; 6]> = walk
        .iter()
        .zip(&per_dim)
        .map(|(&n, &s)| {
            let s = if n == 0 {
                0
            } else {
                s.rem_euclid(n as i64) as usize
            };
            match s {
                0 => smallvec::smallvec![(0, 0, n)],
                s => smallvec::smallvec![(0, s, n - s), (n - s, 0, s)],
            }
        })
        .collect();
    let combos: usize = pieces.iter().map(|p| p.len()).product();
    let mut io = Dense::io(args, &[0.into()], &[3.into()], &[])?;
    let input = io.bytes(0)?;
    for combo in 0..combos {
        let (mut src, mut dst) = (Layout::new(0, st.clone()), Layout::new(0, st.clone()));
        let mut region = Dims::new();
        let mut rest = combo;
        for (p, &stride) in pieces.iter().zip(&st) {
            let &(from, to, len) = p.at(rest % p.len().max(1))?;
            rest /= p.len().max(1);
            src.offset += from * stride as usize;
            dst.offset += to * stride as usize;
            region.push(len);
        }
        copy(x.dtype.size(), &region, input, &src, io.bytes_mut(0)?, &dst)?;
    }
    io.finish()
}

fn tril(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let diagonal = args.int(1)?;
    let (rows, cols) = match x.sizes.as_slice() {
        [.., r, c] => (*r, *c),
        _ => {
            return Err(KernelError::invalid(
                "tril expects a tensor with at least 2 dimensions",
            ))
        }
    };
    args.resize(2, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let esize = x.dtype.size();
    let row_bytes = cols * esize;
    let mut io = Dense::io(args, &[0.into()], &[2.into()], &[])?;
    if row_bytes > 0 {
        let src = io.bytes(0)?.chunks_exact(row_bytes);
        let dst = io.bytes_mut(0)?.chunks_exact_mut(row_bytes);
        for (i, (dst, src)) in dst.zip(src).enumerate() {
            // Row i keeps columns j <= i + diagonal; all-zero bytes are zero in every dtype.
            let keep = ((i % rows.max(1)) as i64)
                .saturating_add(diagonal)
                .saturating_add(1)
                .clamp(0, cols as i64);
            let keep = keep as usize * esize;
            let (head, tail) = dst.split_at_mut(keep.min(dst.len()));
            head.copy_from_slice(src.get(..head.len()).ok_or_else(oob)?);
            tail.fill(0);
        }
    }
    io.finish()
}

/// `pixel_shuffle` (`shuffle`) and `pixel_unshuffle` over the last three dims.
fn pixel_shuffle(args: &mut Args<'_>, shuffle: bool) -> KernelResult {
    let x = args.info(0)?;
    let r = to_size(args.int(1)?, "pixel shuffle factor")?;
    let (lead, c, h, w) = match x.sizes.as_slice() {
        [lead @ .., c, h, w] if r > 0 => (lead, *c, *h, *w),
        _ => {
            return Err(KernelError::invalid(
                "pixel (un)shuffle expects rank >= 3 and a positive factor",
            ))
        }
    };
    let b = prod(lead);
    let rr = r * r;
    let mut sizes: Dims = lead.into();
    let (walk, strides): ([usize; 6], [usize; 6]) = if shuffle {
        if c % rr != 0 {
            return Err(KernelError::invalid(format!(
                "pixel_shuffle: {c} channels are not divisible by {rr}"
            )));
        }
        let oc = c / rr;
        sizes.extend([oc, h * r, w * r]);
        // out[b, oc, h, i, w, j] = in[b, oc * r * r + i * r + j, h, w]
        (
            [b, oc, h, r, w, r],
            [c * h * w, rr * h * w, w, r * h * w, 1, h * w],
        )
    } else {
        if h % r != 0 || w % r != 0 {
            return Err(KernelError::invalid(format!(
                "pixel_unshuffle: {h}x{w} is not divisible by {r}"
            )));
        }
        let (oh, ow) = (h / r, w / r);
        sizes.extend([c * rr, oh, ow]);
        // out[b, c, i, j, oh, ow] = in[b, c, oh * r + i, ow * r + j]
        ([b, c, r, r, oh, ow], [c * h * w, h * w, w, 1, r * w, r])
    };
    gather(
        args,
        0,
        2,
        &sizes,
        &walk,
        &Layout::new(0, strides.map(|s| s as isize)),
    )
}

/// Registers this module's kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::permute_copy.out", permute_copy);
    r.register_fn("aten::view_copy.out", view_copy);
    r.register_fn("aten::expand_copy.out", expand_copy);
    r.register_fn("aten::cat.out", cat);
    r.register_fn("aten::stack.out", stack);
    r.register_fn("aten::slice_copy.Tensor_out", slice_copy);
    r.register_fn("aten::select_copy.int_out", select_copy);
    r.register_fn("aten::narrow_copy.out", narrow_copy);
    r.register_fn("aten::split_with_sizes_copy.out", split_with_sizes_copy);
    r.register_fn("aten::split_copy.Tensor_out", split_copy);
    r.register_fn("aten::unbind_copy.int_out", unbind_copy);
    r.register_fn("aten::squeeze_copy.dims_out", squeeze_dims);
    r.register_fn("aten::squeeze_copy.dim_out", squeeze_dim);
    r.register_fn("aten::squeeze_copy.out", squeeze_all);
    r.register_fn("aten::unsqueeze_copy.out", unsqueeze_copy);
    r.register_fn("aten::transpose_copy.int_out", transpose_copy);
    r.register_fn("aten::t_copy.out", t_copy);
    // clone(self, memory_format, out), _to_copy(self, non_blocking, memory_format, out).
    r.register_fn("aten::clone.out", |a| copy_same_sizes(a, 2));
    r.register_fn("aten::_to_copy.out", |a| copy_same_sizes(a, 3));
    r.register_fn("aten::alias_copy.out", |a| copy_same_sizes(a, 1));
    r.register_fn("aten::detach_copy.out", |a| copy_same_sizes(a, 1));
    r.register_fn("aten::lift_fresh_copy.out", |a| copy_same_sizes(a, 1));
    r.register_fn("dim_order_ops::_to_dim_order_copy.out", dim_order_copy);
    r.register_fn("dim_order_ops::_clone_dim_order.out", dim_order_copy);
    r.register_fn("aten::copy.out", copy_out);
    r.register_fn("aten::copy_", copy_in_place);
    r.register_fn("aten::constant_pad_nd.out", pad::constant_pad_nd);
    r.register_fn("aten::reflection_pad1d.out", |a| {
        pad::pad(a, 1, pad::Mode::Reflect)
    });
    r.register_fn("aten::reflection_pad2d.out", |a| {
        pad::pad(a, 2, pad::Mode::Reflect)
    });
    r.register_fn("aten::reflection_pad3d.out", |a| {
        pad::pad(a, 3, pad::Mode::Reflect)
    });
    r.register_fn("aten::replication_pad1d.out", |a| {
        pad::pad(a, 1, pad::Mode::Replicate)
    });
    r.register_fn("aten::replication_pad2d.out", |a| {
        pad::pad(a, 2, pad::Mode::Replicate)
    });
    r.register_fn("aten::replication_pad3d.out", |a| {
        pad::pad(a, 3, pad::Mode::Replicate)
    });
    r.register_fn("aten::diagonal_copy.out", diagonal_copy);
    r.register_fn("aten::as_strided_copy.out", as_strided_copy);
    r.register_fn("aten::unfold_copy.out", unfold_copy);
    r.register_fn("aten::repeat_interleave.Tensor_out", repeat_interleave);
    r.register_fn("et_copy::_h2d_copy.out", |a| copy_same_sizes(a, 1));
    r.register_fn("et_copy::_d2h_copy.out", |a| copy_same_sizes(a, 1));
    r.register_fn("aten::repeat.out", repeat);
    r.register_fn("aten::flip.out", flip);
    r.register_fn("aten::roll.out", roll);
    r.register_fn("aten::tril.out", tril);
    r.register_fn("aten::pixel_shuffle.out", |a| pixel_shuffle(a, true));
    r.register_fn("aten::pixel_unshuffle.out", |a| pixel_shuffle(a, false));
    creation::register(r);
}
