//! Data movement and creation: views materialized as copies (permute, view, expand, slice,
//! select, squeeze, transpose, ...), concatenation and splitting, dtype and dim-order
//! conversions (`_to_copy`, `_to_dim_order_copy`, `copy_`), padding, repetition, flips,
//! rolls, `tril`, pixel (un)shuffle, and the creation ops (in `creation`).
//!
//! Data movement never dispatches on the dtype: each kernel describes where its output's
//! elements come from as a `Layout` over the input and hands it to one strided copy
//! (`strided::copy`), which merges contiguous dimensions into `memcpy` runs. Only
//! conversions and fills are typed.

mod creation;
pub(crate) mod strided;

use pte_runtime::{
    normalize_dim, Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult, TensorInfo,
};
use smallvec::SmallVec;

use crate::util::{infer_sizes, prod, to_size, Scratch};
use strided::{as_dtype, as_dtype_piece, copy, copy_into, row_major, Layout, Strides, Walk};

/// Errors unless two tensors share a dtype (views and moves never convert).
pub(crate) fn same_dtype(a: DType, b: DType) -> KernelResult {
    if a == b {
        Ok(())
    } else {
        Err(KernelError::dtypes(&[a, b]))
    }
}

/// A dim of a tensor that must have at least one dimension.
pub(crate) fn dim_of(info: &TensorInfo, d: i64) -> KernelResult<usize> {
    if info.rank() == 0 {
        return Err(KernelError::invalid(
            "dimension specified for a 0-dim tensor",
        ));
    }
    info.dim(d)
}

/// Normalizes a list of dims (each once) against a rank.
pub(crate) fn dim_set(dims: &[i64], rank: usize) -> KernelResult<SmallVec<[bool; 6]>> {
    let mut set: SmallVec<[bool; 6]> = smallvec::smallvec![false; rank];
    for &d in dims {
        let n = normalize_dim(d, rank)?;
        if rank == 0 {
            continue;
        }
        if std::mem::replace(&mut set[n], true) {
            return Err(KernelError::invalid(format!(
                "dim {d} appears more than once in {dims:?}"
            )));
        }
    }
    Ok(set)
}

/// PyTorch's slice clamping: the first index and the length of `start:end:step` over a
/// dimension of `size`.
pub(crate) fn slice_bounds(
    size: usize,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> KernelResult<(usize, usize)> {
    if step <= 0 {
        return Err(KernelError::invalid(format!(
            "slice step must be positive, got {step}"
        )));
    }
    let n = size as i128;
    let clamp = |v: Option<i64>, default: i128| {
        let v = v.map_or(default, |v| if v < 0 { v as i128 + n } else { v as i128 });
        v.clamp(0, n)
    };
    let start = clamp(start, 0);
    let end = clamp(end, n).max(start);
    let len = (end - start + step as i128 - 1) / step as i128;
    Ok((start as usize, len as usize))
}

/// A negative index wrapped once into `0..size`.
pub(crate) fn wrap_index(index: i64, size: usize, dim: usize) -> KernelResult<usize> {
    let i = if index < 0 {
        index as i128 + size as i128
    } else {
        index as i128
    };
    if i < 0 || i >= size as i128 {
        return Err(KernelError::invalid(format!(
            "index {index} is out of bounds for dimension {dim} with size {size}"
        )));
    }
    Ok(i as usize)
}

/// Checked product of sizes.
pub(crate) fn numel_of(sizes: &[usize]) -> KernelResult<usize> {
    sizes
        .iter()
        .try_fold(1usize, |a, &s| a.checked_mul(s))
        .ok_or_else(|| KernelError::invalid(format!("shape {sizes:?} has too many elements")))
}

/// Resizes output `out` to `sizes` and fills it from input `src` (same dtype), walking
/// `walk` (whose row-major order is the output's) and reading through `layout`.
fn gather(
    args: &mut Args<'_>,
    src: usize,
    out: usize,
    sizes: &[usize],
    walk: &[usize],
    layout: &Layout,
) -> KernelResult {
    args.resize(out, sizes)?;
    let dtype = args.tensor(src)?.dtype;
    same_dtype(dtype, args.tensor(out)?.dtype)?;
    let mut io = args.io(&[src.into()], &[out.into()])?;
    let input = io.inputs[0].bytes();
    copy(
        dtype.size(),
        walk,
        input,
        layout,
        io.outputs[0].bytes_mut(),
        &Layout::contiguous(walk),
    )
}

/// An output with new sizes and the input's elements in the same order.
fn reshape(args: &mut Args<'_>, out: usize, sizes: &[usize]) -> KernelResult {
    let numel = args.tensor(0)?.numel();
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
    let mut io = args.io_strided(&[src.into()], &[out.into()])?;
    copy_into(&io.inputs[0], &mut io.outputs[0], io.scratch)
}

/// Output sizes and input layout of a permutation of `x`'s dims.
fn permuted(x: &TensorInfo, perm: &[usize]) -> (Dims, Layout) {
    let st = row_major(&x.sizes);
    (
        perm.iter().map(|&d| x.sizes[d]).collect(),
        Layout::new(0, perm.iter().map(|&d| st[d])),
    )
}

fn permute_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
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
    let (sizes, layout) = permuted(&x, &perm);
    gather(args, 0, 2, &sizes, &sizes, &layout)
}

/// Swaps two dims of input 0 into output `out`.
fn transpose(args: &mut Args<'_>, d0: i64, d1: i64, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    let mut perm: Dims = (0..x.rank()).collect();
    let (a, b) = (x.dim(d0)?, x.dim(d1)?);
    if x.rank() > 0 {
        perm.swap(a, b);
    }
    let (sizes, layout) = permuted(&x, &perm);
    gather(args, 0, out, &sizes, &sizes, &layout)
}

fn transpose_copy(args: &mut Args<'_>) -> KernelResult {
    let (d0, d1) = (args.int(1)?, args.int(2)?);
    transpose(args, d0, d1, 3)
}

fn t_copy(args: &mut Args<'_>) -> KernelResult {
    if args.tensor(0)?.rank() > 2 {
        return Err(KernelError::invalid(
            "t() expects a tensor with at most 2 dimensions",
        ));
    }
    transpose(args, 0, -1, 1)
}

fn view_copy(args: &mut Args<'_>) -> KernelResult {
    let sizes = infer_sizes(&args.int_list(1)?, args.tensor(0)?.numel())?;
    reshape(args, 2, &sizes)
}

/// Input sizes without the size-1 dims in `squeeze`.
fn squeeze(args: &mut Args<'_>, squeeze: &[bool], out: usize) -> KernelResult {
    let x = args.tensor(0)?;
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
    let set = dim_set(&args.int_list(1)?, args.tensor(0)?.rank())?;
    squeeze(args, &set, 2)
}

fn squeeze_dim(args: &mut Args<'_>) -> KernelResult {
    let set = dim_set(&[args.int(1)?], args.tensor(0)?.rank())?;
    squeeze(args, &set, 2)
}

fn squeeze_all(args: &mut Args<'_>) -> KernelResult {
    let set: SmallVec<[bool; 6]> = smallvec::smallvec![true; args.tensor(0)?.rank()];
    squeeze(args, &set, 1)
}

fn unsqueeze_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let d = normalize_dim(args.int(1)?, x.rank() + 1)?;
    let mut sizes = x.sizes.clone();
    sizes.insert(d, 1);
    reshape(args, 2, &sizes)
}

fn expand_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
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
        .map(|(i, &r)| match i.checked_sub(lead).map(|j| x.sizes[j]) {
            None => to_size(r, "expanded size of a new leading dim"),
            Some(n) if r == -1 || r == n as i64 => Ok(n),
            Some(1) => to_size(r, "expanded size"),
            Some(n) => Err(KernelError::invalid(format!(
                "cannot expand dim {i} of size {n} to {r}"
            ))),
        })
        .collect::<KernelResult<_>>()?;
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
        let out = args.tensor(3)?;
        if !order
            .iter()
            .map(|&d| d as usize)
            .eq(out.dim_order.iter().copied())
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

/// A tensor seen as `outer × total × inner` around the dim that `cat`, `stack` and the
/// splits work along.
#[derive(Clone, Copy)]
struct Along {
    outer: usize,
    total: usize,
    inner: usize,
}

impl Along {
    fn new(sizes: &[usize], dim: usize) -> Self {
        Along {
            outer: prod(&sizes[..dim]),
            total: sizes[dim],
            inner: prod(&sizes[dim + 1..]),
        }
    }

    /// Where entries `at..at + extent` of the dim sit: the walk and the layout.
    fn part(self, at: usize, extent: usize) -> ([usize; 2], Layout) {
        let layout = Layout::new(at * self.inner, [(self.total * self.inner) as isize, 1]);
        ([self.outer, extent * self.inner], layout)
    }
}

/// Writes `input` (converted to the output's dtype) at entries `at..at + extent` of the
/// dim of output `out` seen as `along`. Inputs go one `io` call each, so any number of
/// them is fine.
fn place(
    args: &mut Args<'_>,
    input: Arg,
    out: usize,
    along: Along,
    at: usize,
    extent: usize,
) -> KernelResult {
    let dtype = args.tensor(out)?.dtype;
    let mut io = args.io(&[input], &[out.into()])?;
    let piece = as_dtype_piece(&io.inputs[0].info, dtype);
    let mut scratch = Scratch::new(io.scratch, &[piece])?;
    let data = as_dtype(&io.inputs[0], dtype, &mut scratch)?;
    let (walk, dst) = along.part(at, extent);
    let src = Layout::contiguous(&walk);
    copy(
        dtype.size(),
        &walk,
        data,
        &src,
        io.outputs[0].bytes_mut(),
        &dst,
    )
}

/// PyTorch's `cat` skips 1-D empty tensors whatever the other shapes are.
fn skipped_by_cat(t: &TensorInfo) -> bool {
    t.sizes.as_slice() == [0]
}

fn cat(args: &mut Args<'_>) -> KernelResult {
    let n = args.list_len(0)?;
    let mut first = None;
    for j in 0..n {
        let info = args.tensor(Arg::Item(0, j))?;
        if !skipped_by_cat(&info) {
            first = Some(info);
            break;
        }
    }
    let Some(first) = first else {
        return args.resize(2, &[0]);
    };
    let dim = dim_of(&first, args.int(1)?)?;
    let mut sizes = first.sizes.clone();
    sizes[dim] = 0;
    for j in 0..n {
        let t = args.tensor(Arg::Item(0, j))?;
        if skipped_by_cat(&t) {
            continue;
        }
        let matches =
            t.rank() == sizes.len() && (0..sizes.len()).all(|d| d == dim || t.sizes[d] == sizes[d]);
        if !matches {
            return Err(KernelError::invalid(format!(
                "cat: shapes {:?} and {:?} differ outside dim {dim}",
                first.sizes.as_slice(),
                t.sizes.as_slice()
            )));
        }
        sizes[dim] += t.sizes[dim];
    }
    args.resize(2, &sizes)?;
    let along = Along::new(&sizes, dim);
    let mut at = 0;
    for j in 0..n {
        let t = args.tensor(Arg::Item(0, j))?;
        if !skipped_by_cat(&t) {
            place(args, Arg::Item(0, j), 2, along, at, t.sizes[dim])?;
            at += t.sizes[dim];
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
    let first = args.tensor(Arg::Item(0, 0))?;
    for j in 1..n {
        let t = args.tensor(Arg::Item(0, j))?;
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
    args.resize(2, &sizes)?;
    let along = Along::new(&sizes, dim);
    for j in 0..n {
        place(args, Arg::Item(0, j), 2, along, j, 1)?;
    }
    Ok(())
}

/// Sizes and layout of the `len` entries of `dim` from `start` (every `step`-th) of a
/// contiguous `x`; with `drop`, the dim is removed (`len` must be 1).
pub(crate) fn window(
    x: &TensorInfo,
    dim: usize,
    start: usize,
    len: usize,
    step: usize,
    drop: bool,
) -> (Dims, Layout) {
    let mut sizes = x.sizes.clone();
    let mut st: Strides = row_major(&x.sizes);
    let offset = start * st[dim] as usize;
    if drop {
        sizes.remove(dim);
        st.remove(dim);
    } else {
        sizes[dim] = len;
        st[dim] *= step as isize;
    }
    (sizes, Layout::new(offset, st))
}

fn slice_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(1)?)?;
    let step = args.int(4)?;
    let (start, len) = slice_bounds(x.sizes[dim], args.opt_int(2)?, args.opt_int(3)?, step)?;
    let (sizes, layout) = window(&x, dim, start, len, step as usize, false);
    gather(args, 0, 5, &sizes, &sizes, &layout)
}

fn select_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(1)?)?;
    let index = wrap_index(args.int(2)?, x.sizes[dim], dim)?;
    let (sizes, layout) = window(&x, dim, index, 1, 1, true);
    gather(args, 0, 3, &sizes, &sizes, &layout)
}

fn narrow_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(1)?)?;
    let size = x.sizes[dim];
    let start = args.int(2)?;
    let start = if start < 0 {
        start + size as i64
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
    let (sizes, layout) = window(&x, dim, start, len, 1, false);
    gather(args, 0, 4, &sizes, &sizes, &layout)
}

/// Splits input 0 along `dim` into `count` consecutive pieces, piece `j` of `extent(j)`
/// entries (with `drop`, pieces of 1 lose the dim), written to the tensor list at `list`
/// one `io` call each, so any number of pieces is fine.
fn split_into(
    args: &mut Args<'_>,
    dim: usize,
    count: usize,
    extent: impl Fn(usize) -> usize,
    drop: bool,
    list: usize,
) -> KernelResult {
    let x = args.tensor(0)?;
    if args.list_len(list)? != count {
        return Err(KernelError::invalid(format!(
            "split into {count} pieces, but the output list holds {}",
            args.list_len(list)?
        )));
    }
    let sum = (0..count).try_fold(0usize, |s, j| s.checked_add(extent(j)));
    if sum != Some(x.sizes[dim]) {
        return Err(KernelError::invalid(format!(
            "split sizes do not sum to dimension size {}",
            x.sizes[dim]
        )));
    }
    let along = Along::new(&x.sizes, dim);
    let mut at = 0;
    for j in 0..count {
        let e = extent(j);
        let (sizes, _) = window(&x, dim, 0, e, 1, drop);
        let piece = Arg::Item(list, j);
        args.resize(piece, &sizes)?;
        same_dtype(x.dtype, args.tensor(piece)?.dtype)?;
        let mut io = args.io(&[0.into()], &[piece])?;
        let (walk, src) = along.part(at, e);
        let input = io.inputs[0].bytes();
        let dst = Layout::contiguous(&walk);
        copy(
            x.dtype.size(),
            &walk,
            input,
            &src,
            io.outputs[0].bytes_mut(),
            &dst,
        )?;
        at += e;
    }
    Ok(())
}

fn split_with_sizes_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let sizes = args.int_list(1)?;
    for &s in &sizes {
        to_size(s, "split size")?;
    }
    let dim = dim_of(&x, args.int(2)?)?;
    split_into(args, dim, sizes.len(), |j| sizes[j] as usize, false, 3)
}

fn split_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let split = to_size(args.int(1)?, "split size")?;
    let dim = dim_of(&x, args.int(2)?)?;
    let size = x.sizes[dim];
    if split == 0 {
        return split_into(args, dim, usize::from(size == 0), |_| 0, false, 3);
    }
    let count = size.div_ceil(split).max(1);
    let extent = |k: usize| split.min(size - (k * split).min(size));
    split_into(args, dim, count, extent, false, 3)
}

fn unbind_copy(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(1)?)?;
    split_into(args, dim, x.sizes[dim], |_| 1, true, 2)
}

fn constant_pad_nd(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let pad = args.int_list(1)?;
    let value = args.scalar(2)?;
    let rank = x.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return Err(KernelError::invalid(format!(
            "padding {pad:?} does not fit a rank-{rank} tensor"
        )));
    }
    let mut sizes = x.sizes.clone();
    // The part of the input that survives (negative pads crop), where it starts in the
    // input and where it lands in the output.
    let mut region = x.sizes.clone();
    let (mut from, mut to): (Dims, Dims) =
        (smallvec::smallvec![0; rank], smallvec::smallvec![0; rank]);
    for (k, p) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - k;
        let (lo, hi) = (p[0] as i128, p[1] as i128);
        let n = x.sizes[d] as i128;
        let new = n + lo + hi;
        if new < 0 {
            return Err(KernelError::invalid(format!(
                "padding {pad:?} makes dim {d} of size {n} negative"
            )));
        }
        sizes[d] =
            usize::try_from(new).map_err(|_| KernelError::invalid("padded size overflows"))?;
        from[d] = (-lo).clamp(0, n) as usize;
        to[d] = lo.clamp(0, new) as usize;
        region[d] = (n - (-lo).max(0) - (-hi).max(0)).max(0) as usize;
    }
    numel_of(&sizes)?;
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let mut io = args.io(&[0.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    strided::fill(&mut outputs[0], value)?;
    let (sst, dst) = (row_major(&x.sizes), row_major(&sizes));
    let offset = |at: &Dims, st: &Strides| {
        at.iter()
            .zip(st)
            .map(|(&i, &s)| i * s as usize)
            .sum::<usize>()
    };
    let src = Layout::new(offset(&from, &sst), sst.iter().copied());
    let dstl = Layout::new(offset(&to, &dst), dst.iter().copied());
    copy(
        x.dtype.size(),
        &region,
        inputs[0].bytes(),
        &src,
        outputs[0].bytes_mut(),
        &dstl,
    )
}

fn repeat(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
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
        let (n, s) = i.checked_sub(lead).map_or((1, 0), |j| (x.sizes[j], st[j]));
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
    for (d, _) in set.iter().enumerate().filter(|(_, &f)| f) {
        layout.offset += x.sizes[d].saturating_sub(1) * layout.strides[d] as usize;
        layout.strides[d] = -layout.strides[d];
    }
    gather(args, 0, 2, &x.sizes, &x.sizes, &layout)
}

fn roll(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let shifts = args.int_list(1)?;
    let dims = args.int_list(2)?;
    // Without dims, the flattened tensor rolls.
    let (walk, per_dim): (Dims, SmallVec<[i64; 6]>) = if dims.is_empty() {
        if shifts.len() != 1 {
            return Err(KernelError::invalid("roll without dims takes one shift"));
        }
        (
            smallvec::smallvec![x.numel()],
            smallvec::smallvec![shifts[0]],
        )
    } else {
        if shifts.len() != dims.len() {
            return Err(KernelError::invalid(format!(
                "roll: {} shifts for {} dims",
                shifts.len(),
                dims.len()
            )));
        }
        let mut per_dim: SmallVec<[i64; 6]> = smallvec::smallvec![0; x.rank()];
        for (&s, &d) in shifts.iter().zip(&dims) {
            let d = dim_of(&x, d)?;
            per_dim[d] = per_dim[d].wrapping_add(s);
        }
        (x.sizes.clone(), per_dim)
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
            match if n == 0 {
                0
            } else {
                s.rem_euclid(n as i64) as usize
            } {
                0 => smallvec::smallvec![(0, 0, n)],
                s => smallvec::smallvec![(0, s, n - s), (n - s, 0, s)],
            }
        })
        .collect();
    let combos: usize = pieces.iter().map(|p| p.len()).product();
    let mut io = args.io(&[0.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    for combo in 0..combos {
        let (mut src, mut dst) = (Layout::new(0, st.clone()), Layout::new(0, st.clone()));
        let mut region = Dims::new();
        let mut rest = combo;
        for (d, p) in pieces.iter().enumerate() {
            let (from, to, len) = p[rest % p.len()];
            rest /= p.len();
            src.offset += from * st[d] as usize;
            dst.offset += to * st[d] as usize;
            region.push(len);
        }
        copy(
            x.dtype.size(),
            &region,
            inputs[0].bytes(),
            &src,
            outputs[0].bytes_mut(),
            &dst,
        )?;
    }
    Ok(())
}

fn tril(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let diagonal = args.int(1)?;
    if x.rank() < 2 {
        return Err(KernelError::invalid(
            "tril expects a tensor with at least 2 dimensions",
        ));
    }
    args.resize(2, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let (rows, cols) = (x.sizes[x.rank() - 2], x.sizes[x.rank() - 1]);
    let row_bytes = cols * x.dtype.size();
    let mut io = args.io(&[0.into()], &[2.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    if row_bytes == 0 {
        return Ok(());
    }
    let src = inputs[0].bytes().chunks_exact(row_bytes);
    for (i, (dst, src)) in outputs[0]
        .bytes_mut()
        .chunks_exact_mut(row_bytes)
        .zip(src)
        .enumerate()
    {
        // Row i keeps columns j <= i + diagonal; all-zero bytes are zero in every dtype.
        let keep = ((i % rows) as i64)
            .saturating_add(diagonal)
            .saturating_add(1)
            .clamp(0, cols as i64);
        let keep = keep as usize * x.dtype.size();
        dst[..keep].copy_from_slice(&src[..keep]);
        dst[keep..].fill(0);
    }
    Ok(())
}

/// `pixel_shuffle` (`shuffle`) and `pixel_unshuffle` over the last three dims.
fn pixel_shuffle(args: &mut Args<'_>, shuffle: bool) -> KernelResult {
    let x = args.tensor(0)?;
    let r = to_size(args.int(1)?, "pixel shuffle factor")?;
    let rank = x.rank();
    if rank < 3 || r == 0 {
        return Err(KernelError::invalid(
            "pixel (un)shuffle expects rank >= 3 and a positive factor",
        ));
    }
    let (c, h, w) = (x.sizes[rank - 3], x.sizes[rank - 2], x.sizes[rank - 1]);
    let b = prod(&x.sizes[..rank - 3]);
    let rr = r * r;
    let mut sizes = x.sizes.clone();
    let (walk, strides): ([usize; 6], [usize; 6]) = if shuffle {
        if c % rr != 0 {
            return Err(KernelError::invalid(format!(
                "pixel_shuffle: {c} channels are not divisible by {rr}"
            )));
        }
        let oc = c / rr;
        sizes[rank - 3..].copy_from_slice(&[oc, h * r, w * r]);
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
        sizes[rank - 3..].copy_from_slice(&[c * rr, oh, ow]);
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
    r.register_fn("aten::constant_pad_nd.out", constant_pad_nd);
    r.register_fn("aten::repeat.out", repeat);
    r.register_fn("aten::flip.out", flip);
    r.register_fn("aten::roll.out", roll);
    r.register_fn("aten::tril.out", tril);
    r.register_fn("aten::pixel_shuffle.out", |a| pixel_shuffle(a, true));
    r.register_fn("aten::pixel_unshuffle.out", |a| pixel_shuffle(a, false));
    creation::register(r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_clamp_like_pytorch() {
        assert_eq!(slice_bounds(5, Some(-2), None, 1).unwrap(), (3, 2));
        assert_eq!(slice_bounds(5, Some(1), Some(i64::MAX), 2).unwrap(), (1, 2));
        assert_eq!(slice_bounds(5, Some(4), Some(2), 1).unwrap(), (4, 0));
        assert_eq!(slice_bounds(5, Some(-9), Some(9), 3).unwrap(), (0, 2));
        assert!(slice_bounds(5, None, None, 0).is_err());
    }

    #[test]
    fn indices_wrap_once() {
        assert_eq!(wrap_index(-1, 4, 0).unwrap(), 3);
        assert!(wrap_index(-5, 4, 0).is_err());
        assert!(wrap_index(4, 4, 0).is_err());
    }

    #[test]
    fn dim_sets_reject_repeats() {
        assert_eq!(
            dim_set(&[0, -1], 3).unwrap().as_slice(),
            &[true, false, true]
        );
        assert!(dim_set(&[1, -2], 3).is_err());
        assert!(dim_set(&[0], 0).unwrap().is_empty());
    }
}
