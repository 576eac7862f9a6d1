//! Indexing: gathers and scatters addressed by index tensors (`index.Tensor`,
//! `index_put`, `index_select`, `embedding`, `gather`, `scatter`), writes into a window of
//! a copy (`slice_scatter`, `select_scatter`), `masked_fill`, and nearest-neighbour
//! upsampling.
//!
//! Each kernel turns its indices into element offsets, checking every index read from a
//! tensor against its dimension before moving anything (PyTorch's advanced indexing wraps
//! negative indices once; `index_select`, `embedding`, `gather` and `scatter` reject
//! them), then moves elements by offset. Moves are dtype-agnostic (elements travel as
//! unsigned integers of their size); only accumulation and scalar fills are typed.
//!
//! Nothing is allocated in steady state: advanced indexing (`index.Tensor`, `index_put`)
//! plans its offsets, factored as (leading dims, broadcast indices, trailing dims), in
//! buffers each call site keeps across executions ([`Stateful`]); the other kernels read
//! their index tensor in place.

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult};
use pte_runtime::{TensorData, TensorInfo};
use smallvec::SmallVec;

use crate::shape::strided::{
    self, as_dtype, as_dtype_piece, by_elem_size, row_major, scalar_as, typed, typed_mut, Layout,
};
use crate::shape::{dim_of, numel_of, same_dtype, slice_bounds, window, wrap_index};
use crate::util::{broadcast_shapes, broadcast_strides, for_each_broadcast, prod, Elem};
use crate::util::{Scratch, Stateful};

/// The values of an int64 or int32 index tensor, read in place.
#[derive(Clone, Copy)]
enum IndexData<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl<'a> IndexData<'a> {
    fn of(t: &TensorData<'a>) -> KernelResult<Self> {
        check_index_dtype(&t.info)?;
        Ok(match t.info.dtype {
            DType::I64 => IndexData::I64(typed(t.bytes())?),
            _ => IndexData::I32(typed(t.bytes())?),
        })
    }

    fn len(self) -> usize {
        match self {
            IndexData::I64(v) => v.len(),
            IndexData::I32(v) => v.len(),
        }
    }

    fn iter(self) -> impl Iterator<Item = i64> + 'a {
        let (wide, narrow) = match self {
            IndexData::I64(v) => (v, &[][..]),
            IndexData::I32(v) => (&[][..], v),
        };
        wide.iter()
            .copied()
            .chain(narrow.iter().map(|&v| i64::from(v)))
    }
}

/// Index tensors are int64 or int32.
fn check_index_dtype(t: &TensorInfo) -> KernelResult {
    match t.dtype {
        DType::I64 | DType::I32 => Ok(()),
        d => Err(KernelError::invalid(format!(
            "index tensors must be int64 or int32, got {d}"
        ))),
    }
}

/// Appends the values of the index tensor `a` to `values`; returns its sizes.
fn read_indices(args: &Args<'_>, a: Arg, values: &mut Vec<i64>) -> KernelResult<Dims> {
    let t = args.read(a)?;
    if !t.info.is_contiguous() {
        return Err(KernelError::invalid(
            "index tensors must have the default dim order",
        ));
    }
    values.extend(IndexData::of(&t)?.iter());
    Ok(t.info.sizes)
}

/// Checks an index against `0..size` (no wrapping) and converts it.
fn in_range(v: i64, size: usize) -> KernelResult<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < size)
        .ok_or_else(|| {
            KernelError::invalid(format!(
                "index {v} is out of range for a dimension of size {size}"
            ))
        })
}

/// Sets `out` to the offsets of every element of `sizes` (row-major) under `strides`.
fn offsets_of(sizes: &[usize], strides: &[usize], out: &mut Vec<usize>) {
    out.clear();
    for_each_broadcast(sizes, [strides], |_, [o]| out.push(o));
}

/// Moves elements: `dst[d] = src[s]` for each `(s, d)` pair, checked.
fn move_elems(
    esize: usize,
    src: &[u8],
    dst: &mut [u8],
    pairs: impl Iterator<Item = (usize, usize)>,
) -> KernelResult {
    by_elem_size!(esize, E => {
        let (s, d) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        for (i, j) in pairs {
            match (s.get(i), d.get_mut(j)) {
                (Some(&v), Some(slot)) => *slot = v,
                _ => return Err(KernelError::invalid(format!("element {i} -> {j} is out of range"))),
            }
        }
        Ok(())
    })
}

/// Working memory of advanced indexing, kept by each call site across executions.
#[derive(Default)]
struct Buffers {
    /// The values of every index tensor (and mask coordinate), one after another.
    values: Vec<i64>,
    /// Offsets of the elements the broadcast indices pick.
    base: Vec<usize>,
    /// Offsets along the dims before and after the indexed ones in the result.
    pre: Vec<usize>,
    post: Vec<usize>,
}

/// An index tensor of advanced indexing: the dim it indexes, its sizes, and where its
/// values start in [`Buffers::values`].
struct Indexed {
    dim: usize,
    sizes: Dims,
    start: usize,
}

/// The result of advanced indexing: element `(p, b, q)` of the result (`pre`, broadcast
/// index and `post` dims, flattened) comes from offset `pre[p] + base[b] + post[q]` of the
/// (contiguous) indexed tensor, from the [`Buffers`] it was planned in.
struct Advanced {
    sizes: Dims,
}

impl Buffers {
    /// The source offset of each element of the result, in order.
    fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.pre.iter().flat_map(move |&p| {
            self.base
                .iter()
                .flat_map(move |&b| self.post.iter().map(move |&q| p + b + q))
        })
    }

    /// The source offset of element `i` of a non-empty result.
    fn offset(&self, i: usize) -> Option<usize> {
        let (nb, nq) = (self.base.len(), self.post.len());
        let p = self.pre.get(i / nb.checked_mul(nq).filter(|&n| n > 0)?)?;
        Some(p + self.base.get(i / nq % nb)? + self.post.get(i % nq)?)
    }
}

/// Plans `x[indices]` for the optional-tensor list at argument `list` into `bufs`: bool
/// masks stand for their nonzero coordinates, index tensors broadcast together, and the
/// broadcast shape replaces the indexed dims when they are adjacent, else leads the
/// result.
fn advanced(
    args: &Args<'_>,
    x: &TensorInfo,
    list: usize,
    bufs: &mut Buffers,
) -> KernelResult<Advanced> {
    let st = row_major(&x.sizes);
    let mut indexed: SmallVec<[Indexed; 6]> = SmallVec::new();
    bufs.values.clear();
    let mut dim = 0;
    for j in 0..args.list_len(list)? {
        match args.opt_list_item(list, j)? {
            None => dim += 1,
            Some(m) if matches!(m.dtype, DType::Bool | DType::U8) => {
                let k = m.rank();
                if k == 0 || x.sizes.get(dim..dim + k) != Some(&m.sizes[..]) {
                    return Err(KernelError::invalid(format!(
                        "mask of shape {:?} does not match the indexed shape {:?} at dim {dim}",
                        m.sizes.as_slice(),
                        x.sizes.as_slice()
                    )));
                }
                let data = args.read(Arg::Item(list, j))?;
                if !m.is_contiguous() {
                    return Err(KernelError::invalid(
                        "masks must have the default dim order",
                    ));
                }
                // The mask's nonzero coordinates, one index tensor per mask dim.
                let mst = row_major(&m.sizes);
                let set = data.bytes().iter().enumerate().filter(|(_, &f)| f != 0);
                let count = set.clone().count();
                let start = bufs.values.len();
                bufs.values.resize(start + k * count, 0);
                for (n, (flat, _)) in set.enumerate() {
                    for t in 0..k {
                        let c = (flat / mst[t] as usize) % m.sizes[t];
                        bufs.values[start + t * count + n] = c as i64;
                    }
                }
                for t in 0..k {
                    indexed.push(Indexed {
                        dim: dim + t,
                        sizes: smallvec::smallvec![count],
                        start: start + t * count,
                    });
                }
                dim += k;
            }
            Some(_) => {
                let start = bufs.values.len();
                let sizes = read_indices(args, Arg::Item(list, j), &mut bufs.values)?;
                indexed.push(Indexed { dim, sizes, start });
                dim += 1;
            }
        }
    }
    if dim > x.rank() {
        return Err(KernelError::invalid(format!(
            "{dim} indices for a tensor of rank {}",
            x.rank()
        )));
    }
    let Some(first) = indexed.first().map(|ix| ix.dim) else {
        // Nothing indexed: the tensor itself.
        bufs.pre.clear();
        bufs.pre.push(0);
        bufs.base.clear();
        bufs.base.push(0);
        bufs.post.clear();
        bufs.post.extend(0..x.numel());
        return Ok(Advanced {
            sizes: x.sizes.clone(),
        });
    };
    let mut bshape = Dims::new();
    for ix in &indexed {
        bshape = broadcast_shapes(&bshape, &ix.sizes)?;
    }
    bufs.base.clear();
    bufs.base.resize(numel_of(&bshape)?, 0);
    for ix in &indexed {
        let bst = broadcast_strides(&ix.sizes, &bshape);
        let values = &bufs.values[ix.start..];
        let (base, d) = (&mut bufs.base, ix.dim);
        let mut err = None;
        for_each_broadcast(&bshape, [&bst], |b, [o]| {
            match wrap_index(values[o], x.sizes[d], d) {
                Ok(i) => base[b] += i * st[d] as usize,
                Err(e) => err = err.take().or(Some(e)),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
    }
    let adjacent = indexed.windows(2).all(|w| w[1].dim == w[0].dim + 1);
    let is_indexed = |d: usize| indexed.iter().any(|ix| ix.dim == d);
    let rest = (0..x.rank()).filter(|&d| !is_indexed(d));
    let (pre, post): (Dims, Dims) = rest.partition(|&d| adjacent && d < first);
    let part = |ds: &Dims, offsets: &mut Vec<usize>| -> Dims {
        let sizes: Dims = ds.iter().map(|&d| x.sizes[d]).collect();
        let strides: Dims = ds.iter().map(|&d| st[d] as usize).collect();
        offsets_of(&sizes, &strides, offsets);
        sizes
    };
    let (pre_sizes, post_sizes) = (part(&pre, &mut bufs.pre), part(&post, &mut bufs.post));
    let sizes: Dims = pre_sizes
        .iter()
        .chain(&bshape)
        .chain(&post_sizes)
        .copied()
        .collect();
    numel_of(&sizes)?;
    Ok(Advanced { sizes })
}

/// `index.Tensor_out(self, indices, out)`.
fn index_tensor(args: &mut Args<'_>, bufs: &mut Buffers) -> KernelResult {
    let x = args.tensor(0)?;
    let adv = advanced(args, &x, 1, bufs)?;
    args.resize(2, &adv.sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let mut io = args.io(&[0.into()], &[2.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    move_elems(
        x.dtype.size(),
        inputs[0].bytes(),
        outputs[0].bytes_mut(),
        bufs.offsets().zip(0..),
    )
}

/// `a + b` in a tensor's dtype (bools: or).
fn add<T: Elem>(a: T, b: T, is_bool: bool) -> T {
    if is_bool {
        T::from_i64(i64::from(a != T::default() || b != T::default()))
    } else if T::FLOAT {
        T::from_f64(a.to_f64() + b.to_f64())
    } else {
        T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
    }
}

/// `index_put(self, indices, values, accumulate)` into output `out`; `out` 0 is `self`
/// (the in-place `index_put_`).
fn index_put(args: &mut Args<'_>, bufs: &mut Buffers, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    let v = args.tensor(2)?;
    let accumulate = args.bool(3)?;
    same_dtype(x.dtype, v.dtype)?;
    let adv = advanced(args, &x, 1, bufs)?;
    if broadcast_shapes(&v.sizes, &adv.sizes)? != adv.sizes {
        return Err(KernelError::invalid(format!(
            "values of shape {:?} do not broadcast to the indexed shape {:?}",
            v.sizes.as_slice(),
            adv.sizes.as_slice()
        )));
    }
    let vst = broadcast_strides(&v.sizes, &adv.sizes);
    args.resize(out, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(out)?.dtype)?;
    let reads: &[Arg] = if out == 0 {
        &[Arg::At(2)]
    } else {
        &[Arg::At(0), Arg::At(2)]
    };
    let mut io = args.io(reads, &[out.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    if out != 0 {
        outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
    }
    let values = inputs[reads.len() - 1].bytes();
    let is_bool = x.dtype == DType::Bool;
    crate::dispatch_all!(x.dtype, T => {
        let vals = typed::<T>(values)?;
        let dst = typed_mut::<T>(outputs[0].bytes_mut())?;
        let mut ok = true;
        for_each_broadcast(&adv.sizes, [&vst], |i, [o]| {
            match (bufs.offset(i).and_then(|at| dst.get_mut(at)), vals.get(o)) {
                (Some(d), Some(&v)) => *d = if accumulate { add(*d, v, is_bool) } else { v },
                _ => ok = false,
            }
        });
        if ok { Ok(()) } else { Err(KernelError::invalid("index_put: element out of range")) }
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// `dst[o][j] = src[o][rows[j]]` over `outer` blocks of rows of `row` bytes, `rows`
/// checked against `0..src_rows` first.
fn copy_rows(
    row: usize,
    src: &[u8],
    src_rows: usize,
    dst: &mut [u8],
    outer: usize,
    rows: IndexData<'_>,
) -> KernelResult {
    for r in rows.iter() {
        in_range(r, src_rows)?;
    }
    if row == 0 || rows.len() == 0 {
        return Ok(());
    }
    for (o, block) in dst
        .chunks_exact_mut(rows.len() * row)
        .take(outer)
        .enumerate()
    {
        for (d, r) in block.chunks_exact_mut(row).zip(rows.iter()) {
            let at = (o * src_rows + r as usize) * row;
            let s = src
                .get(at..at + row)
                .ok_or_else(|| KernelError::invalid(format!("row {r} is out of range")))?;
            d.copy_from_slice(s);
        }
    }
    Ok(())
}

/// `index_select.out(self, dim, index, out)`.
fn index_select(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.tensor(2)?;
    check_index_dtype(&idx)?;
    if idx.rank() > 1 {
        return Err(KernelError::invalid(
            "index_select takes a 0-D or 1-D index",
        ));
    }
    let size = x.sizes.get(dim).copied().unwrap_or(1);
    let mut sizes = x.sizes.clone();
    match sizes.get_mut(dim) {
        Some(s) => *s = idx.numel(),
        None if idx.numel() == 1 => {}
        None => {
            return Err(KernelError::invalid(
                "index_select of a 0-D tensor takes one index",
            ))
        }
    }
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let (outer, inner) = match x.rank() {
        0 => (1, 1),
        _ => (prod(&x.sizes[..dim]), prod(&x.sizes[dim + 1..])),
    };
    let mut io = args.io(&[0.into(), 2.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    copy_rows(
        inner * x.dtype.size(),
        inputs[0].bytes(),
        size,
        outputs[0].bytes_mut(),
        outer,
        IndexData::of(&inputs[1])?,
    )
}

/// `embedding.out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out)`: rows
/// of `weight` (the training-only arguments do not matter here).
fn embedding(args: &mut Args<'_>) -> KernelResult {
    let w = args.tensor(0)?;
    if w.rank() != 2 {
        return Err(KernelError::invalid("embedding weight must be 2-D"));
    }
    let idx = args.tensor(1)?;
    check_index_dtype(&idx)?;
    let mut sizes = idx.sizes.clone();
    sizes.push(w.sizes[1]);
    args.resize(5, &sizes)?;
    same_dtype(w.dtype, args.tensor(5)?.dtype)?;
    let mut io = args.io(&[0.into(), 1.into()], &[5.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    copy_rows(
        w.sizes[1] * w.dtype.size(),
        inputs[0].bytes(),
        w.sizes[0],
        outputs[0].bytes_mut(),
        1,
        IndexData::of(&inputs[1])?,
    )
}

/// Where `gather`/`scatter` along `dim` find their elements in `x`: the index's sizes (a
/// 0-D tensor counts as one element of one dim) and the strides of `x` (row-major) with
/// the one of `dim`, which the index values step along, set apart.
struct AlongDim {
    sizes: Dims,
    walk: Dims,
    step: usize,
    len: usize,
}

fn along_dim(x: &TensorInfo, dim: usize, index: &TensorInfo) -> KernelResult<AlongDim> {
    check_index_dtype(index)?;
    let one: Dims = smallvec::smallvec![1];
    let xs = if x.rank() == 0 { &one } else { &x.sizes };
    let is = if index.rank() == 0 {
        one.clone()
    } else {
        index.sizes.clone()
    };
    if is.len() != xs.len() || (0..xs.len()).any(|d| d != dim && is[d] > xs[d]) {
        return Err(KernelError::invalid(format!(
            "index of shape {:?} does not fit a tensor of shape {:?} along dim {dim}",
            index.sizes.as_slice(),
            x.sizes.as_slice()
        )));
    }
    let st: Dims = row_major(xs).iter().map(|&s| s as usize).collect();
    let mut walk = st.clone();
    walk[dim] = 0;
    Ok(AlongDim {
        sizes: is,
        walk,
        step: st[dim],
        len: xs[dim],
    })
}

impl AlongDim {
    /// Row-major strides of the index's sizes: the offset of each index element in a
    /// contiguous tensor of its shape.
    fn contiguous(&self) -> Dims {
        row_major(&self.sizes).iter().map(|&s| s as usize).collect()
    }

    /// Calls `f(at, other)` for each element of the index (row-major): `at` is the offset
    /// in `x` it names, `other` its offset under `strides` (the index's shape) in another
    /// tensor. Every index value is checked first.
    fn each(
        &self,
        index: IndexData<'_>,
        strides: &[usize],
        mut f: impl FnMut(usize, usize),
    ) -> KernelResult {
        for v in index.iter() {
            in_range(v, self.len)?;
        }
        let mut values = index.iter();
        for_each_broadcast(&self.sizes, [&self.walk, strides], |_, [o, other]| {
            if let Some(v) = values.next() {
                f(o + v as usize * self.step, other);
            }
        });
        Ok(())
    }
}

/// `gather.out(self, dim, index, sparse_grad, out)`.
fn gather(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.tensor(2)?;
    let along = along_dim(&x, dim, &idx)?;
    args.resize(4, &idx.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let mut io = args.io(&[0.into(), 2.into()], &[4.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    let index = IndexData::of(&inputs[1])?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(inputs[0].bytes())?, typed_mut::<E>(outputs[0].bytes_mut())?);
        let mut ok = true;
        along.each(index, &along.contiguous(), |at, i| match (src.get(at), dst.get_mut(i)) {
            (Some(&v), Some(d)) => *d = v,
            _ => ok = false,
        })?;
        if ok { Ok(()) } else { Err(KernelError::invalid("gather: element out of range")) }
    })
}

/// `scatter.src_out(self, dim, index, src, out)` and `scatter.value_out(self, dim, index,
/// value, out)`: a copy of `self` with the places `index` names along `dim` overwritten.
fn scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.tensor(2)?;
    let along = along_dim(&x, dim, &idx)?;
    let src = match args.kind(3)? {
        "Tensor" => Some(args.tensor(3)?),
        _ => None,
    };
    args.resize(4, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let Some(s) = src else {
        let value = args.scalar(3)?;
        let mut io = args.io(&[0.into(), 2.into()], &[4.into()])?;
        let (inputs, outputs) = (&io.inputs, &mut io.outputs);
        outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
        let index = IndexData::of(&inputs[1])?;
        return crate::dispatch_all!(x.dtype, T => {
            let v = scalar_as::<T>(value, x.dtype == DType::Bool);
            let dst = typed_mut::<T>(outputs[0].bytes_mut())?;
            along.each(index, &along.contiguous(), |at, _| {
                if let Some(d) = dst.get_mut(at) {
                    *d = v;
                }
            })
        }, Err(KernelError::dtypes(&[x.dtype])));
    };
    same_dtype(x.dtype, s.dtype)?;
    let ss = if s.rank() == 0 {
        smallvec::smallvec![1]
    } else {
        s.sizes.clone()
    };
    if ss.len() != along.sizes.len() || along.sizes.iter().zip(&ss).any(|(i, s)| i > s) {
        return Err(KernelError::invalid(format!(
            "scatter: src of shape {:?} is smaller than the index",
            s.sizes.as_slice()
        )));
    }
    // Each index element takes src at the same position.
    let sst: Dims = row_major(&ss).iter().map(|&v| v as usize).collect();
    let mut io = args.io(&[0.into(), 2.into(), 3.into()], &[4.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
    let index = IndexData::of(&inputs[1])?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(inputs[2].bytes())?, typed_mut::<E>(outputs[0].bytes_mut())?);
        let mut ok = true;
        along.each(index, &sst, |at, from| match (src.get(from), dst.get_mut(at)) {
            (Some(&v), Some(d)) => *d = v,
            _ => ok = false,
        })?;
        if ok { Ok(()) } else { Err(KernelError::invalid("scatter: element out of range")) }
    })
}

/// Output `out` as a copy of `self` with `src` (converted to its dtype) written into the
/// window `sizes`/`layout` of it.
fn embed(
    args: &mut Args<'_>,
    src: usize,
    out: usize,
    sizes: &[usize],
    layout: &Layout,
) -> KernelResult {
    let x = args.tensor(0)?;
    let s = args.tensor(src)?;
    if s.sizes.as_slice() != sizes {
        return Err(KernelError::invalid(format!(
            "src of shape {:?} does not match the window {sizes:?}",
            s.sizes.as_slice()
        )));
    }
    args.resize(out, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(out)?.dtype)?;
    let mut io = args.io(&[0.into(), src.into()], &[out.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
    let mut scratch = Scratch::new(io.scratch, &[as_dtype_piece(&inputs[1].info, x.dtype)])?;
    let data = as_dtype(&inputs[1], x.dtype, &mut scratch)?;
    strided::copy(
        x.dtype.size(),
        sizes,
        data,
        &Layout::contiguous(sizes),
        outputs[0].bytes_mut(),
        layout,
    )
}

/// `slice_scatter.out(self, src, dim, start, end, step, out)`.
fn slice_scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(2)?)?;
    let step = args.int(5)?;
    let (start, len) = slice_bounds(x.sizes[dim], args.opt_int(3)?, args.opt_int(4)?, step)?;
    let (sizes, layout) = window(&x, dim, start, len, step as usize, false);
    embed(args, 1, 6, &sizes, &layout)
}

/// `select_scatter.out(self, src, dim, index, out)`.
fn select_scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = dim_of(&x, args.int(2)?)?;
    let index = wrap_index(args.int(3)?, x.sizes[dim], dim)?;
    let (sizes, layout) = window(&x, dim, index, 1, 1, true);
    embed(args, 1, 4, &sizes, &layout)
}

/// `masked_fill.Scalar_out(self, mask, value, out)`: `self` and `mask` broadcast together.
fn masked_fill(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let m = args.tensor(1)?;
    let value = args.scalar(2)?;
    if !matches!(m.dtype, DType::Bool | DType::U8) {
        return Err(KernelError::dtypes(&[x.dtype, m.dtype]));
    }
    let sizes = broadcast_shapes(&x.sizes, &m.sizes)?;
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let (xs, ms) = (
        broadcast_strides(&x.sizes, &sizes),
        broadcast_strides(&m.sizes, &sizes),
    );
    let mut io = args.io(&[0.into(), 1.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    let mask = typed::<u8>(inputs[1].bytes())?;
    crate::dispatch_all!(x.dtype, T => {
        let v = scalar_as::<T>(value, x.dtype == DType::Bool);
        let src = typed::<T>(inputs[0].bytes())?;
        let dst = typed_mut::<T>(outputs[0].bytes_mut())?;
        for_each_broadcast(&sizes, [&xs, &ms], |i, [a, b]| dst[i] = if mask[b] != 0 { v } else { src[a] });
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// PyTorch's nearest source index for output index `o` (`nearest_idx`), computed in
/// `f32` like upstream.
fn nearest(o: usize, input: usize, output: usize, scale: Option<f64>) -> usize {
    if output == input {
        o
    } else if output == 2 * input {
        o >> 1
    } else {
        let s = match scale {
            Some(s) if s > 0.0 => (1.0 / s) as f32,
            _ => input as f32 / output as f32,
        };
        ((o as f32 * s).floor() as usize).min(input - 1)
    }
}

/// `upsample_nearest2d.vec_out(input, output_size?, scale_factors?, out)` on NCHW input.
fn upsample_nearest2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    if x.rank() != 4 {
        return Err(KernelError::invalid(
            "upsample_nearest2d expects a 4-D input",
        ));
    }
    let (h, w) = (x.sizes[2], x.sizes[3]);
    let output_size = args.opt_int_list(1)?;
    let scales = if args.is_none(2)? {
        None
    } else {
        Some(args.double_list(2)?)
    };
    let ((oh, ow), (sh, sw)) = match (output_size, scales) {
        (Some(os), None) if os.len() == 2 => (
            (
                crate::util::to_size(os[0], "output size")?,
                crate::util::to_size(os[1], "output size")?,
            ),
            (None, None),
        ),
        (None, Some(sf)) if sf.len() == 2 => {
            let size = |n: usize, f: f64| {
                let v = (n as f64 * f).floor();
                if v.is_finite() && v >= 0.0 && v < usize::MAX as f64 {
                    Ok(v as usize)
                } else {
                    Err(KernelError::invalid(format!("scale factor {f} is invalid")))
                }
            };
            (
                (size(h, sf[0])?, size(w, sf[1])?),
                (Some(sf[0]), Some(sf[1])),
            )
        }
        _ => {
            return Err(KernelError::invalid(
                "upsample_nearest2d takes exactly one of two output sizes or two scale factors",
            ))
        }
    };
    if h == 0 || w == 0 || oh == 0 || ow == 0 {
        return Err(KernelError::invalid(format!(
            "upsample_nearest2d: sizes {h}x{w} -> {oh}x{ow} must be positive"
        )));
    }
    let sizes = [x.sizes[0], x.sizes[1], oh, ow];
    numel_of(&sizes)?;
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let planes = x.sizes[0] * x.sizes[1];
    let mut io = args.io(&[0.into()], &[3.into()])?;
    // The source row of each output row and the source column of each output column.
    let pieces = [Scratch::piece::<usize>(oh), Scratch::piece::<usize>(ow)];
    let mut scratch = Scratch::new(io.scratch, &pieces)?;
    let (ys, xs) = (scratch.take::<usize>(oh)?, scratch.take::<usize>(ow)?);
    ys.iter_mut()
        .enumerate()
        .for_each(|(o, y)| *y = nearest(o, h, oh, sh));
    xs.iter_mut()
        .enumerate()
        .for_each(|(o, x)| *x = nearest(o, w, ow, sw));
    let (ys, xs) = (&*ys, &*xs);
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    let pairs = (0..planes).flat_map(|p| {
        ys.iter().enumerate().flat_map(move |(oy, &y)| {
            xs.iter()
                .enumerate()
                .map(move |(ox, &xx)| ((p * h + y) * w + xx, (p * oh + oy) * ow + ox))
        })
    });
    move_elems(
        x.dtype.size(),
        inputs[0].bytes(),
        outputs[0].bytes_mut(),
        pairs,
    )
}

/// Registers this module's kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register("aten::index.Tensor_out", Stateful(index_tensor));
    r.register("aten::index_put.out", Stateful(|a, b| index_put(a, b, 4)));
    r.register("aten::index_put_", Stateful(|a, b| index_put(a, b, 0)));
    r.register_fn("aten::index_select.out", index_select);
    r.register_fn("aten::embedding.out", embedding);
    r.register_fn("aten::gather.out", gather);
    r.register_fn("aten::scatter.src_out", scatter);
    r.register_fn("aten::scatter.value_out", scatter);
    r.register_fn("aten::slice_scatter.out", slice_scatter);
    r.register_fn("aten::select_scatter.out", select_scatter);
    r.register_fn("aten::masked_fill.Scalar_out", masked_fill);
    r.register_fn("aten::upsample_nearest2d.vec_out", upsample_nearest2d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_source_indices_follow_pytorch() {
        let idx = |input, output, scale| -> Vec<usize> {
            (0..output)
                .map(|o| nearest(o, input, output, scale))
                .collect()
        };
        assert_eq!(idx(3, 6, None), [0, 0, 1, 1, 2, 2]);
        assert_eq!(idx(4, 6, Some(1.5)), [0, 0, 1, 2, 2, 3]);
        assert_eq!(idx(5, 3, None), [0, 1, 3]);
    }
}
