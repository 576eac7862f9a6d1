//! Indexing: gathers and scatters addressed by index tensors (`index.Tensor`,
//! `index_put`, `index_select`, `embedding`, `gather`, `scatter`), writes into a window of
//! a copy (`slice_scatter`, `select_scatter`), `masked_fill`, `masked_select`,
//! `masked_scatter` and `nonzero`.
//!
//! Each kernel turns its indices into element offsets, checking every index read from a
//! tensor against its dimension before moving anything (PyTorch's advanced indexing wraps
//! negative indices once; `index_select`, `embedding`, `gather` and `scatter` reject
//! them), then moves elements by offset. Moves are dtype-agnostic (elements travel as
//! unsigned integers of their size); only accumulation and scalar fills are typed. Data
//! tensors of any dim order are seen in row-major order ([`Dense`]).
//!
//! Nothing is allocated in steady state: advanced indexing (`index.Tensor`, `index_put`)
//! plans its offsets, factored as (leading dims, broadcast indices, trailing dims), in
//! buffers each call site keeps across executions ([`Stateful`]); the other kernels read
//! their index tensor in place.

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult};
use pte_runtime::{Charge, MemoryError, TensorInfo};
use smallvec::SmallVec;

use crate::layout::{
    as_dtype, as_dtype_piece, by_elem_size, copy, row_major, typed, typed_mut, window, Dense,
    Layout,
};
use crate::num::Elem;
use crate::util::{broadcast_shapes, broadcast_strides, dim_of, for_each_broadcast, numel_of};
use crate::util::{oob, same_dtype, scalar_as, slice_bounds, split_at_dim};
use crate::util::{wrap_index, Checked, Scratch, Stateful};

/// The values of an int64 or int32 index tensor, read in place.
#[derive(Clone, Copy)]
enum IndexData<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl<'a> IndexData<'a> {
    fn of(info: &TensorInfo, bytes: &'a [u8]) -> KernelResult<Self> {
        check_index_dtype(info)?;
        Ok(match info.dtype {
            DType::I64 => IndexData::I64(typed(bytes)?),
            _ => IndexData::I32(typed(bytes)?),
        })
    }

    /// Input `k` of a [`Dense`] view.
    fn input(io: &Dense<'a>, k: usize) -> KernelResult<Self> {
        let (info, bytes) = io.inputs.get(k).ok_or_else(oob)?;
        Self::of(info, bytes)
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

/// Makes room for `additional` more elements in `v`, charging the growth to `charge`
/// first (the buffers of advanced indexing grow with the index tensors they hold).
fn reserve<T>(v: &mut Vec<T>, additional: usize, charge: &mut Charge) -> KernelResult {
    let needed = v.len().checked_add(additional).ok_or_else(too_many)?;
    if needed <= v.capacity() {
        return Ok(());
    }
    let bytes = (needed - v.capacity())
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(too_many)? as u64;
    let memory = |source| KernelError::Memory {
        what: "indexing plan".into(),
        source,
    };
    charge
        .grow(charge.bytes().saturating_add(bytes))
        .map_err(memory)?;
    v.try_reserve_exact(needed - v.len())
        .map_err(|_| memory(MemoryError::AllocFailed { requested: bytes }))
}

fn too_many() -> KernelError {
    KernelError::invalid("indexing plan size overflows")
}

/// Appends the values of the index tensor `a` to `values`; returns its sizes.
fn read_indices(
    args: &Args<'_>,
    a: Arg,
    values: &mut Vec<i64>,
    charge: &mut Charge,
) -> KernelResult<Dims> {
    let t = args.read(a)?;
    if !t.info.is_contiguous() {
        return Err(KernelError::invalid(
            "index tensors must have the default dim order",
        ));
    }
    reserve(values, t.info.numel(), charge)?;
    values.extend(IndexData::of(t.info, t.bytes())?.iter());
    Ok(t.info.sizes.clone())
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
fn offsets_of(
    sizes: &[usize],
    strides: &[usize],
    out: &mut Vec<usize>,
    charge: &mut Charge,
) -> KernelResult {
    out.clear();
    reserve(out, numel_of(sizes)?, charge)?;
    for_each_broadcast(sizes, [strides], |_, [o]| out.push(o));
    Ok(())
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
    /// The memory the buffers hold, charged to the method's budget.
    charge: Option<Charge>,
}

/// An index tensor of advanced indexing: the dim it indexes, its sizes, and where its
/// values start in [`Buffers::values`].
struct Indexed {
    dim: usize,
    sizes: Dims,
    start: usize,
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
}

/// Appends the coordinates of the non-zero elements of a mask (of `sizes`, row-major
/// bytes) to `values`, one run of `count` per mask dim; returns `count`.
fn mask_coordinates(
    mask: &[u8],
    sizes: &[usize],
    values: &mut Vec<i64>,
    charge: &mut Charge,
) -> KernelResult<usize> {
    let set = || {
        mask.iter()
            .enumerate()
            .filter(|(_, &f)| f != 0)
            .map(|(i, _)| i)
    };
    let count = set().count();
    let total = count.checked_mul(sizes.len()).ok_or_else(too_many)?;
    reserve(values, total, charge)?;
    let strides = row_major(sizes);
    for (&n, &st) in sizes.iter().zip(&strides) {
        values.extend(set().map(|flat| ((flat / st.max(1) as usize) % n.max(1)) as i64));
    }
    Ok(count)
}

/// Plans `x[indices]` for the optional-tensor list at argument `list` into `bufs`: bool
/// masks stand for their nonzero coordinates, index tensors broadcast together, and the
/// broadcast shape replaces the indexed dims when they are adjacent, else leads the
/// result. Returns the result's sizes.
fn advanced(
    args: &Args<'_>,
    x: &TensorInfo,
    list: usize,
    bufs: &mut Buffers,
) -> KernelResult<Dims> {
    let st = row_major(&x.sizes);
    let mut indexed: SmallVec<[Indexed; 6]> = SmallVec::new();
    if bufs.charge.is_none() {
        let charge = args
            .budget()
            .charge(0)
            .map_err(|source| KernelError::Memory {
                what: "indexing plan".into(),
                source,
            })?;
        bufs.charge = Some(charge);
    }
    let charge = bufs.charge.as_mut().ok_or_else(oob)?;
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
                let start = bufs.values.len();
                let count = mask_coordinates(data.bytes(), &m.sizes, &mut bufs.values, charge)?;
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
                let sizes = read_indices(args, Arg::Item(list, j), &mut bufs.values, charge)?;
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
        for v in [&mut bufs.pre, &mut bufs.base, &mut bufs.post] {
            v.clear();
            reserve(v, 1, charge)?;
        }
        bufs.pre.push(0);
        bufs.base.push(0);
        reserve(&mut bufs.post, x.numel(), charge)?;
        bufs.post.extend(0..x.numel());
        return Ok(x.sizes.clone());
    };
    let mut bshape = Dims::new();
    for ix in &indexed {
        bshape = broadcast_shapes(&bshape, &ix.sizes)?;
    }
    bufs.base.clear();
    let count = numel_of(&bshape)?;
    reserve(&mut bufs.base, count, charge)?;
    bufs.base.resize(count, 0);
    for ix in &indexed {
        let bst = broadcast_strides(&ix.sizes, &bshape);
        let values = bufs.values.get(ix.start..).unwrap_or_default();
        let (size, stride) = (*x.sizes.at(ix.dim)?, *st.at(ix.dim)? as usize);
        let mut err = None;
        let mut base = bufs.base.iter_mut();
        for_each_broadcast(&bshape, [&bst], |_, [o]| {
            let picked = values.get(o).ok_or_else(oob);
            match (
                base.next(),
                picked.and_then(|&v| wrap_index(v, size, ix.dim)),
            ) {
                (Some(b), Ok(i)) => *b += i * stride,
                (_, Err(e)) => err = err.take().or(Some(e)),
                (None, Ok(_)) => err = err.take().or(Some(oob())),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
    }
    let adjacent = indexed.windows(2).all(|w| match w {
        [a, b] => b.dim == a.dim + 1,
        _ => true,
    });
    let is_indexed = |d: usize| indexed.iter().any(|ix| ix.dim == d);
    let rest = (0..x.rank()).filter(|&d| !is_indexed(d));
    let (pre, post): (Dims, Dims) = rest.partition(|&d| adjacent && d < first);
    let part = |ds: &Dims, offsets: &mut Vec<usize>, charge: &mut Charge| -> KernelResult<Dims> {
        let sizes: Dims = ds
            .iter()
            .map(|&d| x.sizes.at(d).copied())
            .collect::<KernelResult<_>>()?;
        let strides: Dims = ds
            .iter()
            .map(|&d| st.at(d).map(|&s| s as usize))
            .collect::<KernelResult<_>>()?;
        offsets_of(&sizes, &strides, offsets, charge)?;
        Ok(sizes)
    };
    let pre_sizes = part(&pre, &mut bufs.pre, charge)?;
    let post_sizes = part(&post, &mut bufs.post, charge)?;
    let sizes: Dims = pre_sizes
        .iter()
        .chain(&bshape)
        .chain(&post_sizes)
        .copied()
        .collect();
    numel_of(&sizes)?;
    Ok(sizes)
}

/// `index.Tensor_out(self, indices, out)`.
fn index_tensor(args: &mut Args<'_>, bufs: &mut Buffers) -> KernelResult {
    let x = args.tensor(0)?;
    let sizes = advanced(args, &x, 1, bufs)?;
    args.resize(2, &sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let mut io = Dense::io(args, &[0.into()], &[2.into()], &[])?;
    let src = io.bytes(0)?;
    move_elems(
        x.dtype.size(),
        src,
        io.bytes_mut(0)?,
        bufs.offsets().zip(0..),
    )?;
    io.finish()
}

/// `a + b` in a tensor's dtype (bools: or).
fn add<T: Elem>(a: T, b: T, is_bool: bool) -> T {
    if is_bool {
        T::from_i64(i64::from(a != T::default() || b != T::default()))
    } else {
        T::of_acc(crate::num::Ring::add(a.acc(), b.acc()))
    }
}

/// `index_put(self, indices, values, accumulate)` into output `out`; `out` 0 is `self`
/// (the in-place `index_put_`).
fn index_put(args: &mut Args<'_>, bufs: &mut Buffers, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    let v = args.info(2)?;
    let accumulate = args.bool(3)?;
    same_dtype(x.dtype, v.dtype)?;
    let sizes = advanced(args, &x, 1, bufs)?;
    if broadcast_shapes(&v.sizes, &sizes)? != sizes {
        return Err(KernelError::invalid(format!(
            "values of shape {:?} do not broadcast to the indexed shape {:?}",
            v.sizes.as_slice(),
            sizes.as_slice()
        )));
    }
    let vst = broadcast_strides(&v.sizes, &sizes);
    args.resize(out, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(out)?.dtype)?;
    let reads: &[Arg] = if out == 0 {
        &[Arg::At(2)]
    } else {
        &[Arg::At(2), Arg::At(0)]
    };
    let mut io = Dense::io(args, reads, &[out.into()], &[])?;
    let values = io.bytes(0)?;
    if out != 0 {
        let src = io.bytes(1)?;
        io.bytes_mut(0)?.copy_from_slice(src);
    }
    let is_bool = x.dtype == DType::Bool;
    crate::dispatch_all!(x.dtype, T => {
        let vals = typed::<T>(values)?;
        let dst = io.output::<T>(0)?;
        let mut ok = true;
        let mut targets = bufs.offsets();
        for_each_broadcast(&sizes, [&vst], |_, [o]| {
            match (targets.next().and_then(|at| dst.get_mut(at)), vals.get(o)) {
                (Some(d), Some(&v)) => *d = if accumulate { add(*d, v, is_bool) } else { v },
                _ => ok = false,
            }
        });
        if !ok {
            return Err(KernelError::invalid("index_put: element out of range"));
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
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
            d.copy_from_slice(src.span(at, row)?);
        }
    }
    Ok(())
}

/// `index_select.out(self, dim, index, out)`.
fn index_select(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.info(2)?;
    check_index_dtype(idx)?;
    if idx.rank() > 1 {
        return Err(KernelError::invalid(
            "index_select takes a 0-D or 1-D index",
        ));
    }
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
    let (outer, size, inner) = split_at_dim(&x.sizes, dim);
    let mut io = Dense::io(args, &[0.into(), 2.into()], &[3.into()], &[])?;
    let (src, index) = (io.bytes(0)?, IndexData::input(&io, 1)?);
    copy_rows(
        inner * x.dtype.size(),
        src,
        size,
        io.bytes_mut(0)?,
        outer,
        index,
    )?;
    io.finish()
}

/// `embedding.out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out)`: rows
/// of `weight` (the training-only arguments do not matter here).
fn embedding(args: &mut Args<'_>) -> KernelResult {
    let w = args.tensor(0)?;
    let &[rows, cols] = w.sizes.as_slice() else {
        return Err(KernelError::invalid("embedding weight must be 2-D"));
    };
    let idx = args.info(1)?;
    check_index_dtype(idx)?;
    let mut sizes = idx.sizes.clone();
    sizes.push(cols);
    args.resize(5, &sizes)?;
    same_dtype(w.dtype, args.tensor(5)?.dtype)?;
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[5.into()], &[])?;
    let (src, index) = (io.bytes(0)?, IndexData::input(&io, 1)?);
    copy_rows(cols * w.dtype.size(), src, rows, io.bytes_mut(0)?, 1, index)?;
    io.finish()
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

/// Sizes with a 0-d tensor seen as one element of one dim.
fn at_least_1d(sizes: &[usize]) -> Dims {
    if sizes.is_empty() {
        smallvec::smallvec![1]
    } else {
        sizes.into()
    }
}

fn along_dim(x: &TensorInfo, dim: usize, index: &TensorInfo) -> KernelResult<AlongDim> {
    check_index_dtype(index)?;
    let (xs, is) = (at_least_1d(&x.sizes), at_least_1d(&index.sizes));
    let fits = is.len() == xs.len()
        && is
            .iter()
            .zip(&xs)
            .enumerate()
            .all(|(d, (i, x))| d == dim || i <= x);
    if !fits {
        return Err(KernelError::invalid(format!(
            "index of shape {:?} does not fit a tensor of shape {:?} along dim {dim}",
            index.sizes.as_slice(),
            x.sizes.as_slice()
        )));
    }
    let st: Dims = row_major(&xs).iter().map(|&s| s as usize).collect();
    let mut walk = st.clone();
    *walk.as_mut_slice().at_mut(dim)? = 0;
    Ok(AlongDim {
        sizes: is,
        walk,
        step: *st.at(dim)?,
        len: *xs.at(dim)?,
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
    let mut io = Dense::io(args, &[0.into(), 2.into()], &[4.into()], &[])?;
    let (src, index) = (io.bytes(0)?, IndexData::input(&io, 1)?);
    let dst = io.bytes_mut(0)?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        let mut ok = true;
        along.each(index, &along.contiguous(), |at, i| match (src.get(at), dst.get_mut(i)) {
            (Some(&v), Some(d)) => *d = v,
            _ => ok = false,
        })?;
        if ok { Ok(()) } else { Err(KernelError::invalid("gather: element out of range")) }
    })?;
    io.finish()
}

/// `scatter.src_out(self, dim, index, src, out)` and `scatter.value_out(self, dim, index,
/// value, out)`: a copy of `self` with the places `index` names along `dim` overwritten.
fn scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.info(2)?;
    let along = along_dim(&x, dim, idx)?;
    let src = match args.kind(3)? {
        "Tensor" => Some(args.tensor(3)?),
        _ => None,
    };
    args.resize(4, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let Some(s) = src else {
        let value = args.scalar(3)?;
        let mut io = Dense::io(args, &[0.into(), 2.into()], &[4.into()], &[])?;
        let (input, index) = (io.bytes(0)?, IndexData::input(&io, 1)?);
        io.bytes_mut(0)?.copy_from_slice(input);
        crate::dispatch_all!(x.dtype, T => {
            let v = scalar_as::<T>(value, x.dtype == DType::Bool);
            let dst = io.output::<T>(0)?;
            along.each(index, &along.contiguous(), |at, _| {
                if let Some(d) = dst.get_mut(at) {
                    *d = v;
                }
            })?;
        }, return Err(KernelError::dtypes(&[x.dtype])));
        return io.finish();
    };
    same_dtype(x.dtype, s.dtype)?;
    let ss = at_least_1d(&s.sizes);
    if ss.len() != along.sizes.len() || along.sizes.iter().zip(&ss).any(|(i, s)| i > s) {
        return Err(KernelError::invalid(format!(
            "scatter: src of shape {:?} is smaller than the index",
            s.sizes.as_slice()
        )));
    }
    // Each index element takes src at the same position.
    let sst: Dims = row_major(&ss).iter().map(|&v| v as usize).collect();
    let mut io = Dense::io(args, &[0.into(), 2.into(), 3.into()], &[4.into()], &[])?;
    let (input, index, src) = (io.bytes(0)?, IndexData::input(&io, 1)?, io.bytes(2)?);
    let dst = io.bytes_mut(0)?;
    dst.copy_from_slice(input);
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        let mut ok = true;
        along.each(index, &sst, |at, from| match (src.get(from), dst.get_mut(at)) {
            (Some(&v), Some(d)) => *d = v,
            _ => ok = false,
        })?;
        if ok { Ok(()) } else { Err(KernelError::invalid("scatter: element out of range")) }
    })?;
    io.finish()
}

/// `scatter_add.out(self, dim, index, src, out)`: a copy of `self` to which each element of
/// `src` (at the index's positions) is added at the place `index` names along `dim`.
fn scatter_add(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = args.info(2)?;
    let along = along_dim(&x, dim, idx)?;
    let s = args.info(3)?;
    same_dtype(x.dtype, s.dtype)?;
    let ss = at_least_1d(&s.sizes);
    if ss.len() != along.sizes.len() || along.sizes.iter().zip(&ss).any(|(i, s)| i > s) {
        return Err(KernelError::invalid(format!(
            "scatter_add: src of shape {:?} is smaller than the index",
            s.sizes.as_slice()
        )));
    }
    args.resize(4, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let sst: Dims = row_major(&ss).iter().map(|&v| v as usize).collect();
    // PyTorch sums float16 and bfloat16 in float32 and rounds once at the end.
    let wide = matches!(x.dtype, DType::F16 | DType::BF16);
    let n = if wide { x.numel() } else { 0 };
    let pieces = [Scratch::piece::<f32>(n)];
    let mut io = Dense::io(args, &[0.into(), 2.into(), 3.into()], &[4.into()], &pieces)?;
    let (input, index) = (io.bytes(0)?, IndexData::input(&io, 1)?);
    io.bytes_mut(0)?.copy_from_slice(input);
    let acc = io.scratch.take::<f32>(n)?;
    let is_bool = x.dtype == DType::Bool;
    let range = || KernelError::invalid("scatter_add: element out of range");
    crate::dispatch_all!(x.dtype, T => {
        let src = io.input::<T>(2)?;
        let dst = io.output::<T>(0)?;
        let mut ok = true;
        if wide {
            for (a, d) in acc.iter_mut().zip(dst.iter()) {
                *a = d.to_f64() as f32;
            }
            along.each(index, &sst, |at, from| match (src.get(from), acc.get_mut(at)) {
                (Some(&v), Some(a)) => *a += v.to_f64() as f32,
                _ => ok = false,
            })?;
            for (d, a) in dst.iter_mut().zip(acc.iter()) {
                *d = T::from_f64(f64::from(*a));
            }
        } else {
            along.each(index, &sst, |at, from| match (src.get(from), dst.get_mut(at)) {
                (Some(&v), Some(d)) => *d = add(*d, v, is_bool),
                _ => ok = false,
            })?;
        }
        if !ok {
            return Err(range());
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `self` and a bool `mask` broadcast together: the shape and both operands' strides.
fn masked_shape(x: &TensorInfo, m: &TensorInfo, op: &str) -> KernelResult<(Dims, Dims, Dims)> {
    if !matches!(m.dtype, DType::Bool | DType::U8) {
        return Err(KernelError::invalid(format!(
            "{op}: the mask must be bool, got {}",
            m.dtype
        )));
    }
    let sizes = broadcast_shapes(&x.sizes, &m.sizes)?;
    let (xs, ms) = (
        broadcast_strides(&x.sizes, &sizes),
        broadcast_strides(&m.sizes, &sizes),
    );
    Ok((sizes, xs, ms))
}

/// `masked_select.out(self, mask, out)`: the elements of `self` (broadcast with `mask`)
/// where the mask is true, in row-major order, as a 1-d tensor.
fn masked_select(args: &mut Args<'_>) -> KernelResult {
    let (x, m) = (args.tensor(0)?, args.tensor(1)?);
    let (sizes, xs, ms) = masked_shape(&x, &m, "masked_select")?;
    let count = {
        let mask = args.read(1)?;
        // Read in the mask's own layout (its dim order), broadcast to `sizes`.
        let own = crate::layout::broadcast_layout(mask.info, &sizes)?;
        let own: Dims = own.strides.iter().map(|&s| s as usize).collect();
        let mask = typed::<u8>(mask.bytes())?;
        let mut count = 0usize;
        for_each_broadcast(&sizes, [&own], |_, [b]| {
            count += usize::from(mask.get(b).is_some_and(|&f| f != 0));
        });
        count
    };
    args.resize(2, &[count])?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[2.into()], &[])?;
    let (src, mask) = (io.bytes(0)?, io.input::<u8>(1)?);
    let dst = io.bytes_mut(0)?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        let mut slots = dst.iter_mut();
        let mut ok = true;
        for_each_broadcast(&sizes, [&xs, &ms], |_, [a, b]| {
            if mask.get(b).is_some_and(|&f| f != 0) {
                match (slots.next(), src.get(a)) {
                    (Some(d), Some(&v)) => *d = v,
                    _ => ok = false,
                }
            }
        });
        if ok { Ok(()) } else { Err(oob()) }
    })?;
    io.finish()
}

/// `masked_scatter.out(self, mask, source, out)`: `self` (broadcast with `mask`) with the
/// places where the mask is true taking the elements of `source` in order.
fn masked_scatter(args: &mut Args<'_>) -> KernelResult {
    let (x, m, s) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let (sizes, xs, ms) = masked_shape(&x, &m, "masked_scatter")?;
    same_dtype(x.dtype, s.dtype)?;
    args.resize(3, &sizes)?;
    same_dtype(x.dtype, args.tensor(3)?.dtype)?;
    let mut io = Dense::io(args, &[0.into(), 1.into(), 2.into()], &[3.into()], &[])?;
    let (src, mask, source) = (io.bytes(0)?, io.input::<u8>(1)?, io.bytes(2)?);
    let dst = io.bytes_mut(0)?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, source, dst) = (typed::<E>(src)?, typed::<E>(source)?, typed_mut::<E>(dst)?);
        let (mut slots, mut next) = (dst.iter_mut(), source.iter());
        let (mut ok, mut short) = (true, false);
        for_each_broadcast(&sizes, [&xs, &ms], |_, [a, b]| {
            let value = if mask.get(b).is_some_and(|&f| f != 0) {
                let v = next.next().copied();
                short |= v.is_none();
                v
            } else {
                src.get(a).copied()
            };
            match (slots.next(), value) {
                (Some(d), Some(v)) => *d = v,
                _ => ok = false,
            }
        });
        if short {
            return Err(KernelError::invalid(format!(
                "masked_scatter: the mask selects more elements than source's {}",
                source.len()
            )));
        }
        if ok { Ok(()) } else { Err(oob()) }
    })?;
    io.finish()
}

/// `nonzero.out(self, out)`: the coordinates of the non-zero elements (NaN counts) in
/// row-major order, one row of `rank` int64 each.
fn nonzero(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let count = {
        let t = args.read(0)?;
        crate::dispatch_all!(x.dtype, T => {
            typed::<T>(t.bytes())?.iter().filter(|&&v| v != T::default()).count()
        }, return Err(KernelError::dtypes(&[x.dtype])))
    };
    let rank = x.rank();
    args.resize(1, &[count, rank])?;
    same_dtype(DType::I64, args.info(1)?.dtype)?;
    let mut io = Dense::io(args, &[0.into()], &[1.into()], &[])?;
    let st = row_major(&x.sizes);
    crate::dispatch_all!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        let out = io.output::<i64>(0)?;
        let set = src.iter().enumerate().filter(|(_, &v)| v != T::default());
        for (row, (flat, _)) in out.chunks_exact_mut(rank.max(1)).zip(set) {
            for ((c, &s), &n) in row.iter_mut().zip(&st).zip(&x.sizes) {
                *c = ((flat / (s as usize).max(1)) % n.max(1)) as i64;
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
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
    let piece = as_dtype_piece(&s, x.dtype);
    let mut io = Dense::io(args, &[0.into(), src.into()], &[out.into()], &[piece])?;
    let input = io.bytes(0)?;
    io.bytes_mut(0)?.copy_from_slice(input);
    let (info, bytes) = io.inputs.get(1).cloned().ok_or_else(oob)?;
    let data = as_dtype(&info, bytes, x.dtype, &mut io.scratch)?;
    let dense = Layout::contiguous(sizes);
    copy(
        x.dtype.size(),
        sizes,
        data,
        &dense,
        io.bytes_mut(0)?,
        layout,
    )?;
    io.finish()
}

/// `slice_scatter.out(self, src, dim, start, end, step, out)`.
fn slice_scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(2)?)?;
    let step = args.int(5)?;
    let size = *x.sizes.at(dim)?;
    let (start, len) = slice_bounds(size, args.opt_int(3)?, args.opt_int(4)?, step)?;
    let (sizes, layout) = window(&x.sizes, dim, start, len, step as usize, false)?;
    embed(args, 1, 6, &sizes, &layout)
}

/// `select_scatter.out(self, src, dim, index, out)`.
fn select_scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let dim = dim_of(x, args.int(2)?)?;
    let index = wrap_index(args.int(3)?, *x.sizes.at(dim)?, dim)?;
    let (sizes, layout) = window(&x.sizes, dim, index, 1, 1, true)?;
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
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[3.into()], &[])?;
    let mask = io.input::<u8>(1)?;
    crate::dispatch_all!(x.dtype, T => {
        let v = scalar_as::<T>(value, x.dtype == DType::Bool);
        let src = io.input::<T>(0)?;
        let mut dst = io.output::<T>(0)?.iter_mut();
        let mut ok = true;
        for_each_broadcast(&sizes, [&xs, &ms], |_, [a, b]| {
            match (dst.next(), src.get(a), mask.get(b)) {
                (Some(d), Some(&s), Some(&f)) => *d = if f != 0 { v } else { s },
                _ => ok = false,
            }
        });
        if !ok {
            return Err(oob());
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
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
    r.register_fn("aten::scatter_add.out", scatter_add);
    r.register_fn("aten::masked_select.out", masked_select);
    r.register_fn("aten::masked_scatter.out", masked_scatter);
    r.register_fn("aten::nonzero.out", nonzero);
    r.register_fn("aten::slice_scatter.out", slice_scatter);
    r.register_fn("aten::select_scatter.out", select_scatter);
    r.register_fn("aten::masked_fill.Scalar_out", masked_fill);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_coordinates_are_row_major() {
        let mut v = Vec::new();
        let mut charge = pte_runtime::MemoryBudget::new(1 << 20).charge(0).unwrap();
        let count = mask_coordinates(&[0, 1, 1, 0, 0, 1], &[2, 3], &mut v, &mut charge).unwrap();
        assert_eq!(count, 3);
        assert_eq!(v, [0, 0, 1, 1, 2, 2]);
    }
}
