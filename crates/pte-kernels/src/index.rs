//! Indexing: gathers and scatters addressed by index tensors (`index.Tensor`,
//! `index_put`, `index_select`, `embedding`, `gather`, `scatter`), writes into a window of
//! a copy (`slice_scatter`, `select_scatter`), `masked_fill`, and nearest-neighbour
//! upsampling.
//!
//! Each kernel first turns its indices into element offsets, checking every index read
//! from a tensor against its dimension (PyTorch's advanced indexing wraps negative
//! indices once; `index_select`, `embedding`, `gather` and `scatter` reject them), then
//! moves elements by offset. Moves are dtype-agnostic (elements travel as unsigned
//! integers of their size); only accumulation and scalar fills are typed.

use pte_runtime::{Arg, Args, DType, Dims, KernelError, KernelRegistry, KernelResult, TensorInfo};

use crate::shape::strided::{
    self, as_dtype, by_elem_size, row_major, scalar_as, typed, typed_mut, Layout,
};
use crate::shape::{dim_of, numel_of, same_dtype, slice_bounds, window, wrap_index};
use crate::util::{broadcast_shapes, broadcast_strides, for_each_broadcast, prod, Elem};

/// An index tensor's values.
struct Indices {
    sizes: Dims,
    values: Vec<i64>,
}

/// Reads an int64 or int32 index tensor.
fn read_indices(args: &Args<'_>, a: Arg) -> KernelResult<Indices> {
    let t = args.read(a)?;
    if !t.info.is_contiguous() {
        return Err(KernelError::invalid(
            "index tensors must have the default dim order",
        ));
    }
    let values = match t.info.dtype {
        DType::I64 => typed::<i64>(t.bytes())?.to_vec(),
        DType::I32 => typed::<i32>(t.bytes())?
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        d => {
            return Err(KernelError::invalid(format!(
                "index tensors must be int64 or int32, got {d}"
            )))
        }
    };
    Ok(Indices {
        sizes: t.info.sizes,
        values,
    })
}

/// Checks indices against `0..size` (no wrapping) and converts them.
fn in_range(values: &[i64], size: usize) -> KernelResult<Vec<usize>> {
    values
        .iter()
        .map(|&v| {
            usize::try_from(v)
                .ok()
                .filter(|&i| i < size)
                .ok_or_else(|| {
                    KernelError::invalid(format!(
                        "index {v} is out of range for a dimension of size {size}"
                    ))
                })
        })
        .collect()
}

/// Offsets of every element of `sizes` (row-major) under `strides`.
fn offsets_of(sizes: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(prod(sizes));
    for_each_broadcast(sizes, [strides], |_, [o]| out.push(o));
    out
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

/// The result of advanced indexing: its sizes and, per element, the offset it comes from
/// in the (contiguous) indexed tensor.
struct Advanced {
    sizes: Dims,
    offsets: Vec<usize>,
}

/// Plans `x[indices]` for the optional-tensor list at argument `list`: bool masks stand
/// for their nonzero coordinates, index tensors broadcast together, and the broadcast
/// shape replaces the indexed dims when they are adjacent, else leads the result.
fn advanced(args: &Args<'_>, x: &TensorInfo, list: usize) -> KernelResult<Advanced> {
    let st = row_major(&x.sizes);
    let mut indexed: Vec<(usize, Indices)> = Vec::new();
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
                let mut coords: Vec<Vec<i64>> = vec![Vec::new(); k];
                for (flat, _) in data.bytes().iter().enumerate().filter(|(_, &f)| f != 0) {
                    for (t, c) in coords.iter_mut().enumerate() {
                        c.push(((flat / mst[t] as usize) % m.sizes[t]) as i64);
                    }
                }
                for (t, values) in coords.into_iter().enumerate() {
                    indexed.push((
                        dim + t,
                        Indices {
                            sizes: smallvec::smallvec![values.len()],
                            values,
                        },
                    ));
                }
                dim += k;
            }
            Some(_) => {
                indexed.push((dim, read_indices(args, Arg::Item(list, j))?));
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
    let Some(&(first, _)) = indexed.first() else {
        return Ok(Advanced {
            sizes: x.sizes.clone(),
            offsets: (0..x.numel()).collect(),
        });
    };
    let mut bshape = Dims::new();
    for (_, ix) in &indexed {
        bshape = broadcast_shapes(&bshape, &ix.sizes)?;
    }
    let mut base = vec![0usize; numel_of(&bshape)?];
    for (d, ix) in &indexed {
        let bst = broadcast_strides(&ix.sizes, &bshape);
        let mut err = None;
        for_each_broadcast(&bshape, [&bst], |b, [o]| {
            match wrap_index(ix.values[o], x.sizes[*d], *d) {
                Ok(i) => base[b] += i * st[*d] as usize,
                Err(e) => err = err.take().or(Some(e)),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
    }
    let adjacent = indexed.windows(2).all(|w| w[1].0 == w[0].0 + 1);
    let is_indexed = |d: usize| indexed.iter().any(|(i, _)| *i == d);
    let rest = (0..x.rank()).filter(|&d| !is_indexed(d));
    let (pre, post): (Dims, Dims) = rest.partition(|&d| adjacent && d < first);
    let part = |ds: &Dims| -> (Dims, Vec<usize>) {
        let sizes: Dims = ds.iter().map(|&d| x.sizes[d]).collect();
        let strides: Dims = ds.iter().map(|&d| st[d] as usize).collect();
        let offs = offsets_of(&sizes, &strides);
        (sizes, offs)
    };
    let ((pre_sizes, pre_offs), (post_sizes, post_offs)) = (part(&pre), part(&post));
    let sizes: Dims = pre_sizes
        .iter()
        .chain(&bshape)
        .chain(&post_sizes)
        .copied()
        .collect();
    let mut offsets = Vec::with_capacity(numel_of(&sizes)?);
    for &p in &pre_offs {
        for &b in &base {
            offsets.extend(post_offs.iter().map(|&q| p + b + q));
        }
    }
    Ok(Advanced { sizes, offsets })
}

/// `index.Tensor_out(self, indices, out)`.
fn index_tensor(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let adv = advanced(args, &x, 1)?;
    args.resize(2, &adv.sizes)?;
    same_dtype(x.dtype, args.tensor(2)?.dtype)?;
    let mut io = args.io(&[0.into()], &[2.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    move_elems(
        x.dtype.size(),
        inputs[0].bytes(),
        outputs[0].bytes_mut(),
        adv.offsets.iter().copied().zip(0..),
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
fn index_put(args: &mut Args<'_>, out: usize) -> KernelResult {
    let x = args.tensor(0)?;
    let v = args.tensor(2)?;
    let accumulate = args.bool(3)?;
    same_dtype(x.dtype, v.dtype)?;
    let adv = advanced(args, &x, 1)?;
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
            match (adv.offsets.get(i).and_then(|&at| dst.get_mut(at)), vals.get(o)) {
                (Some(d), Some(&v)) => *d = if accumulate { add(*d, v, is_bool) } else { v },
                _ => ok = false,
            }
        });
        if ok { Ok(()) } else { Err(KernelError::invalid("index_put: element out of range")) }
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// `dst[o][j] = src[o][rows[j]]` over `outer` blocks of rows of `row` bytes.
fn copy_rows(
    row: usize,
    src: &[u8],
    src_rows: usize,
    dst: &mut [u8],
    outer: usize,
    rows: &[usize],
) -> KernelResult {
    if row == 0 || rows.is_empty() {
        return Ok(());
    }
    for (o, block) in dst
        .chunks_exact_mut(rows.len() * row)
        .take(outer)
        .enumerate()
    {
        for (d, &r) in block.chunks_exact_mut(row).zip(rows) {
            let at = (o * src_rows + r) * row;
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
    let idx = read_indices(args, Arg::At(2))?;
    if idx.sizes.len() > 1 {
        return Err(KernelError::invalid(
            "index_select takes a 0-D or 1-D index",
        ));
    }
    let size = x.sizes.get(dim).copied().unwrap_or(1);
    let rows = in_range(&idx.values, size)?;
    let mut sizes = x.sizes.clone();
    match sizes.get_mut(dim) {
        Some(s) => *s = rows.len(),
        None if rows.len() == 1 => {}
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
    let mut io = args.io(&[0.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    copy_rows(
        inner * x.dtype.size(),
        inputs[0].bytes(),
        size,
        outputs[0].bytes_mut(),
        outer,
        &rows,
    )
}

/// `embedding.out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out)`: rows
/// of `weight` (the training-only arguments do not matter here).
fn embedding(args: &mut Args<'_>) -> KernelResult {
    let w = args.tensor(0)?;
    if w.rank() != 2 {
        return Err(KernelError::invalid("embedding weight must be 2-D"));
    }
    let idx = read_indices(args, Arg::At(1))?;
    let rows = in_range(&idx.values, w.sizes[0])?;
    let mut sizes = idx.sizes.clone();
    sizes.push(w.sizes[1]);
    args.resize(5, &sizes)?;
    same_dtype(w.dtype, args.tensor(5)?.dtype)?;
    let mut io = args.io(&[0.into()], &[5.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    copy_rows(
        w.sizes[1] * w.dtype.size(),
        inputs[0].bytes(),
        w.sizes[0],
        outputs[0].bytes_mut(),
        1,
        &rows,
    )
}

/// For `gather`/`scatter` along `dim`: the offset in `x` of each element of `index`
/// (row-major), and the index's sizes (a 0-D tensor counts as one element of one dim).
fn along_dim(x: &TensorInfo, dim: usize, index: &Indices) -> KernelResult<(Dims, Vec<usize>)> {
    let one: Dims = smallvec::smallvec![1];
    let xs = if x.rank() == 0 { &one } else { &x.sizes };
    let is = if index.sizes.is_empty() {
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
    let rows = in_range(&index.values, xs[dim])?;
    let offsets = offsets_of(&is, &walk)
        .into_iter()
        .zip(rows)
        .map(|(o, r)| o + r * st[dim])
        .collect();
    Ok((is, offsets))
}

/// `gather.out(self, dim, index, sparse_grad, out)`.
fn gather(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = read_indices(args, Arg::At(2))?;
    let (_, offsets) = along_dim(&x, dim, &idx)?;
    args.resize(4, &idx.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let mut io = args.io(&[0.into()], &[4.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    move_elems(
        x.dtype.size(),
        inputs[0].bytes(),
        outputs[0].bytes_mut(),
        offsets.into_iter().zip(0..),
    )
}

/// `scatter.src_out(self, dim, index, src, out)` and `scatter.value_out(self, dim, index,
/// value, out)`: a copy of `self` with the places `index` names along `dim` overwritten.
fn scatter(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let dim = x.dim(args.int(1)?)?;
    let idx = read_indices(args, Arg::At(2))?;
    let (is, offsets) = along_dim(&x, dim, &idx)?;
    let src = match args.kind(3)? {
        "Tensor" => Some(args.tensor(3)?),
        _ => None,
    };
    args.resize(4, &x.sizes)?;
    same_dtype(x.dtype, args.tensor(4)?.dtype)?;
    let Some(s) = src else {
        let value = args.scalar(3)?;
        let mut io = args.io(&[0.into()], &[4.into()])?;
        let (inputs, outputs) = (&io.inputs, &mut io.outputs);
        outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
        return crate::dispatch_all!(x.dtype, T => {
            let v = scalar_as::<T>(value, x.dtype == DType::Bool);
            let dst = typed_mut::<T>(outputs[0].bytes_mut())?;
            for &o in &offsets {
                if let Some(d) = dst.get_mut(o) {
                    *d = v;
                }
            }
            Ok(())
        }, Err(KernelError::dtypes(&[x.dtype])));
    };
    same_dtype(x.dtype, s.dtype)?;
    let ss = if s.rank() == 0 {
        smallvec::smallvec![1]
    } else {
        s.sizes.clone()
    };
    if ss.len() != is.len() || is.iter().zip(&ss).any(|(i, s)| i > s) {
        return Err(KernelError::invalid(format!(
            "scatter: src of shape {:?} is smaller than the index",
            s.sizes.as_slice()
        )));
    }
    let sst: Dims = row_major(&ss).iter().map(|&v| v as usize).collect();
    let src_offsets = offsets_of(&is, &sst);
    let mut io = args.io(&[0.into(), 3.into()], &[4.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    outputs[0].bytes_mut().copy_from_slice(inputs[0].bytes());
    move_elems(
        x.dtype.size(),
        inputs[1].bytes(),
        outputs[0].bytes_mut(),
        src_offsets.into_iter().zip(offsets),
    )
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
    let data = as_dtype(&inputs[1], x.dtype)?;
    strided::copy(
        x.dtype.size(),
        sizes,
        &data,
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
        Some(args.double_list(2)?.to_vec())
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
    let ys: Vec<usize> = (0..oh).map(|o| nearest(o, h, oh, sh)).collect();
    let xs: Vec<usize> = (0..ow).map(|o| nearest(o, w, ow, sw)).collect();
    let planes = x.sizes[0] * x.sizes[1];
    let mut io = args.io(&[0.into()], &[3.into()])?;
    let (inputs, outputs) = (&io.inputs, &mut io.outputs);
    let pairs = (0..planes).flat_map(|p| {
        let (ys, xs) = (&ys, &xs);
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
    r.register_fn("aten::index.Tensor_out", index_tensor);
    r.register_fn("aten::index_put.out", |a| index_put(a, 4));
    r.register_fn("aten::index_put_", |a| index_put(a, 0));
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
