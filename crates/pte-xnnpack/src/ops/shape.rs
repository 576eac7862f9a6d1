//! Data-movement nodes: copy, reshape, transpose, slice, constant padding,
//! concatenation, and bilinear resizing (NHWC).
//!
//! All but resizing move whole elements of any storage type by their byte width, so
//! one implementation serves float, 8-bit and int32 values. A transposition is reduced
//! to its simplest form (dimensions that stay adjacent merged) and runs as blocked 2-D
//! transposes when it swaps two groups of dimensions.

use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out, Storage};
use crate::graph::{Dims, Quant, Value};

/// Element width of a value's storage, for nodes that only move elements.
fn width(cx: &NodeCx<'_>, v: &Value) -> PResult<usize> {
    if matches!(v.quant, Quant::PerToken { .. }) {
        return Err(format!("moving {} values is not supported", v.dtype.name()).into());
    }
    Ok(match Storage::of(v.dtype) {
        Storage::F32 | Storage::I32 => 4,
        Storage::I8 | Storage::U8 => 1,
        Storage::Packed => {
            let _ = cx;
            return Err(format!("{} values cannot be moved", v.dtype.name()).into());
        }
    })
}

/// Checks that input and output hold the same kind of elements with the same
/// quantization (data movement does not requantize).
fn same_kind(cx: &NodeCx<'_>, x: &Value, y: &Value) -> PResult<usize> {
    let w = width(cx, x)?;
    let same = match (family(x), family(y)) {
        (Family::Float, Family::Float) => true,
        (a, b) if a == b => x.quant == y.quant,
        _ => false,
    };
    if !same || width(cx, y)? != w {
        return Err(format!("input {} and output {} differ", describe(x), describe(y)).into());
    }
    Ok(w)
}

struct Copy {
    width: usize,
    reshape: Option<Dims>,
}

impl Kernel for Copy {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        match &self.reshape {
            None => set_shape(outputs, 0, s),
            Some(target) => {
                let out = infer_shape(s, target)?;
                set_shape(outputs, 0, &out)
            }
        }
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims).saturating_mul(self.width);
        let out = outputs.first_mut().ok_or("no output")?;
        bytes_mut(out.bytes, n)?.copy_from_slice(bytes(x.bytes, n)?);
        Ok(())
    }

    fn is_view(&self) -> bool {
        true
    }
}

/// XNNPACK's reshape: at most one dimension is 0, inferred from the element count.
fn infer_shape(input: &[usize], target: &[usize]) -> KResult<Dims> {
    let total = numel(input);
    let zeros = target.iter().filter(|&&d| d == 0).count();
    let mut out: Dims = target.iter().copied().collect();
    match zeros {
        0 => {}
        1 => {
            let known: usize = target.iter().filter(|&&d| d != 0).product();
            if known == 0 || !total.is_multiple_of(known) {
                return Err(format!(
                    "cannot infer the 0 dimension of {target:?} from {total} elements"
                ));
            }
            if let Some(d) = out.iter_mut().find(|d| **d == 0) {
                *d = total / known;
            }
        }
        _ => {
            return Err(format!(
                "new shape {target:?} has more than one 0 dimension"
            ))
        }
    }
    if super::super::graph::checked_numel(&out) != Some(total) {
        return Err(format!("cannot reshape {input:?} to {target:?}"));
    }
    Ok(out)
}

/// Copy (and Clamp-free copies of the same type).
pub(crate) fn copy(cx: &NodeCx<'_>) -> PResult<Prepared> {
    let width = same_kind(cx, cx.input(0)?, cx.output(0)?)?;
    Prepared::new(Copy {
        width,
        reshape: None,
    })
}

/// StaticReshape.
pub(crate) fn reshape(cx: &NodeCx<'_>, shape: &[usize]) -> PResult<Prepared> {
    let width = same_kind(cx, cx.input(0)?, cx.output(0)?)?;
    Prepared::new(Copy {
        width,
        reshape: Some(shape.iter().copied().collect()),
    })
}

struct Transpose {
    width: usize,
    perm: Dims,
    /// The simplified problem for the current shape: dims of the input and the
    /// permutation of them, after merging.
    dims: Dims,
    sperm: Dims,
}

/// Merges input dimensions that stay adjacent and in order in the output, and drops
/// dimensions of size 1.
fn simplify(dims: &[usize], perm: &[usize]) -> (Dims, Dims) {
    // Output order of the input dims, without size-1 dims.
    let kept: Vec<usize> = perm
        .iter()
        .copied()
        .filter(|&p| dims.get(p).copied().unwrap_or(1) != 1)
        .collect();
    // Groups: runs in the output order that are consecutive input dims.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &p in &kept {
        match groups.last_mut() {
            Some(g) if g.last().is_some_and(|&l| l + 1 == p) => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    // Input order of the groups.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups.get(g).and_then(|v| v.first()).copied());
    let new_dims: Dims = order
        .iter()
        .map(|&g| {
            groups.get(g).map_or(1, |v| {
                let group: Dims = v
                    .iter()
                    .map(|&d| dims.get(d).copied().unwrap_or(1))
                    .collect();
                numel(&group)
            })
        })
        .collect();
    // sperm[k] = input group index (in new order) of output position k.
    let sperm: Dims = (0..groups.len())
        .map(|k| order.iter().position(|&g| g == k).unwrap_or(0))
        .collect();
    (new_dims, sperm)
}

impl Kernel for Transpose {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if s.len() != self.perm.len() {
            return Err(format!(
                "perm {:?} for an input of rank {}",
                self.perm,
                s.len()
            ));
        }
        let out: Dims = self
            .perm
            .iter()
            .map(|&p| s.get(p).copied().unwrap_or(0))
            .collect();
        let (d, p) = simplify(s, &self.perm);
        self.dims = d;
        self.sperm = p;
        set_shape(outputs, 0, &out)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims);
        let src = bytes(x.bytes, n.saturating_mul(self.width))?;
        let dst = bytes_mut(
            outputs.first_mut().ok_or("no output")?.bytes,
            n.saturating_mul(self.width),
        )?;
        permute(cx, src, dst, &self.dims, &self.sperm, self.width);
        Ok(())
    }
}

/// `dst` = `src` (of `dims`) with its dimensions permuted: output dim k is input dim
/// `perm[k]`.
fn permute(cx: &Cx<'_>, src: &[u8], dst: &mut [u8], dims: &[usize], perm: &[usize], w: usize) {
    let rank = dims.len();
    let identity = perm.iter().enumerate().all(|(k, &p)| k == p);
    if identity || rank <= 1 {
        dst.copy_from_slice(src.get(..dst.len()).unwrap_or_default());
        return;
    }
    // A swap of two groups [.., A, .., B] -> [.., B, .., A] with a common outer part:
    // rank 2 after merging, or rank 3 with the outermost fixed.
    let (outer, a, b) = match (rank, perm) {
        (2, [1, 0]) => (
            1,
            dims.first().copied().unwrap_or(1),
            dims.get(1).copied().unwrap_or(1),
        ),
        (3, [0, 2, 1]) => (
            dims.first().copied().unwrap_or(1),
            dims.get(1).copied().unwrap_or(1),
            dims.get(2).copied().unwrap_or(1),
        ),
        // [A, B, C] -> [B, A, C]: whole runs of C elements move (a channel shuffle's
        // groups in NCHW order); one copy per run.
        (3, [1, 0, 2]) => {
            let [a, b, c] = [0, 1, 2].map(|k| dims.get(k).copied().unwrap_or(1));
            let run = c.saturating_mul(w);
            let runs = dst.chunks_exact_mut(run.max(1)).take(a.saturating_mul(b));
            for (k, out) in runs.enumerate() {
                // Output run (j, i) is input run (i, j).
                let (j, i) = (k / a.max(1), k % a.max(1));
                let at = (i * b + j) * run;
                if let Some(s) = src.get(at..at + run) {
                    out.copy_from_slice(s);
                }
            }
            return;
        }
        _ => {
            generic_permute(src, dst, dims, perm, w);
            return;
        }
    };
    let src = src.get(..dst.len()).unwrap_or_default();
    let done = match w {
        1 => transpose_as::<u8>(cx, src, dst, (outer, a, b)),
        2 => transpose_as::<u16>(cx, src, dst, (outer, a, b)),
        4 => transpose_as::<u32>(cx, src, dst, (outer, a, b)),
        8 => transpose_as::<u64>(cx, src, dst, (outer, a, b)),
        _ => false,
    };
    if !done {
        generic_permute(src, dst, dims, perm, w);
    }
}

/// `outer` transposes of `a × b` elements of type `T` on pte-compute's transpose;
/// false if the bytes are not aligned for `T` or the sizes disagree.
fn transpose_as<T: bytemuck::Pod + Send + Sync>(
    cx: &Cx<'_>,
    src: &[u8],
    dst: &mut [u8],
    (outer, a, b): (usize, usize, usize),
) -> bool {
    match (
        bytemuck::try_cast_slice::<u8, T>(src),
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
    ) {
        (Ok(s), Ok(d)) => pte_compute::layout::transpose(cx.pool, s, outer, a, b, d).is_ok(),
        _ => false,
    }
}

/// Any permutation: the output walked in order, the input offset stepped (index
/// vectors inline: a graph's rank is at most `MAX_DIMS`, and nothing allocates).
fn generic_permute(src: &[u8], dst: &mut [u8], dims: &[usize], perm: &[usize], w: usize) {
    let rank = dims.len();
    let mut in_strides: Dims = std::iter::repeat_n(0, rank).collect();
    let mut acc = 1;
    for k in (0..rank).rev() {
        if let Some(s) = in_strides.get_mut(k) {
            *s = acc;
        }
        acc *= dims.get(k).copied().unwrap_or(1);
    }
    let out_dims: Dims = perm
        .iter()
        .map(|&p| dims.get(p).copied().unwrap_or(1))
        .collect();
    let strides: Dims = perm
        .iter()
        .map(|&p| in_strides.get(p).copied().unwrap_or(0))
        .collect();
    let inner = out_dims.last().copied().unwrap_or(1);
    let inner_stride = strides.last().copied().unwrap_or(0);
    let outer = out_dims.get(..rank.saturating_sub(1)).unwrap_or_default();
    let mut idx: Dims = std::iter::repeat_n(0, outer.len()).collect();
    for run in dst.chunks_exact_mut(inner * w) {
        let base: usize = idx.iter().zip(&strides).map(|(&i, &s)| i * s).sum();
        if inner_stride == 1 {
            if let Some(v) = src.get(base * w..(base + inner) * w) {
                run.copy_from_slice(v);
            }
        } else {
            for (j, o) in run.chunks_exact_mut(w).enumerate() {
                let so = (base + j * inner_stride) * w;
                if let Some(v) = src.get(so..so + w) {
                    o.copy_from_slice(v);
                }
            }
        }
        for k in (0..outer.len()).rev() {
            if let (Some(i), Some(&d)) = (idx.get_mut(k), outer.get(k)) {
                *i += 1;
                if *i < d {
                    break;
                }
                *i = 0;
            }
        }
    }
}

/// StaticTranspose.
pub(crate) fn transpose(cx: &NodeCx<'_>, perm: &[usize]) -> PResult<Prepared> {
    let width = same_kind(cx, cx.input(0)?, cx.output(0)?)?;
    let mut seen = [false; crate::graph::MAX_DIMS];
    for &p in perm {
        match seen.get_mut(p) {
            Some(s) if !*s => *s = true,
            _ => return Err(format!("perm {perm:?} is not a permutation").into()),
        }
    }
    Prepared::new(Transpose {
        width,
        perm: perm.iter().copied().collect(),
        dims: Dims::new(),
        sperm: Dims::new(),
    })
}

struct Slice {
    width: usize,
    offsets: Dims,
    sizes: Dims,
    /// For the current shape: begin and size per dim.
    begin: Dims,
    len: Dims,
}

impl Kernel for Slice {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if s.len() != self.offsets.len() {
            return Err(format!(
                "slice of rank {} for an input of rank {}",
                self.offsets.len(),
                s.len()
            ));
        }
        // XNNPACK's rule: end = offset + size; an end of 0 means "to the end".
        self.begin.clear();
        self.len.clear();
        for ((&d, &o), &z) in s.iter().zip(&self.offsets).zip(&self.sizes) {
            let end = o.saturating_add(z);
            let size = if end == 0 {
                d.saturating_sub(o)
            } else {
                end.saturating_sub(o)
            };
            let o = o.min(d);
            self.begin.push(o);
            self.len.push(size.min(d - o));
        }
        let l = self.len.clone();
        set_shape(outputs, 0, &l)
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let w = self.width;
        let src = bytes(x.bytes, numel(x.dims).saturating_mul(w))?;
        let n = numel(&self.len);
        let dst = bytes_mut(outputs.first_mut().ok_or("no output")?.bytes, n * w)?;
        if n == 0 {
            return Ok(());
        }
        let rank = x.dims.len();
        let mut strides: Dims = std::iter::repeat_n(0, rank).collect();
        let mut acc = w;
        for k in (0..rank).rev() {
            if let Some(s) = strides.get_mut(k) {
                *s = acc;
            }
            acc *= x.dims.get(k).copied().unwrap_or(1);
        }
        let inner = self.len.last().copied().unwrap_or(1) * w;
        let outer = self.len.get(..rank.saturating_sub(1)).unwrap_or_default();
        let mut idx: Dims = std::iter::repeat_n(0, outer.len()).collect();
        for run in dst.chunks_exact_mut(inner) {
            let off: usize = (0..rank)
                .map(|k| {
                    let i = idx.get(k).copied().unwrap_or(0);
                    (self.begin.get(k).copied().unwrap_or(0) + i)
                        * strides.get(k).copied().unwrap_or(0)
                })
                .sum();
            run.copy_from_slice(src.get(off..off + inner).ok_or("slice outside its input")?);
            for k in (0..outer.len()).rev() {
                if let (Some(i), Some(&d)) = (idx.get_mut(k), outer.get(k)) {
                    *i += 1;
                    if *i < d {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        Ok(())
    }
}

/// StaticSlice.
pub(crate) fn slice(cx: &NodeCx<'_>, offsets: &[usize], sizes: &[usize]) -> PResult<Prepared> {
    let width = same_kind(cx, cx.input(0)?, cx.output(0)?)?;
    Prepared::new(Slice {
        width,
        offsets: offsets.iter().copied().collect(),
        sizes: sizes.iter().copied().collect(),
        begin: Dims::new(),
        len: Dims::new(),
    })
}

struct Pad {
    width: usize,
    pre: Dims,
    post: Dims,
    /// The padding value as one element of the output's storage.
    fill: [u8; 4],
}

impl Kernel for Pad {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if s.len() > self.pre.len() {
            return Err(format!(
                "{} paddings for an input of rank {}",
                self.pre.len(),
                s.len()
            ));
        }
        let out: Dims = s
            .iter()
            .enumerate()
            .map(|(k, &d)| {
                d.checked_add(self.pre.get(k).copied().unwrap_or(0))
                    .and_then(|v| v.checked_add(self.post.get(k).copied().unwrap_or(0)))
                    .ok_or_else(|| "padded size overflows".to_owned())
            })
            .collect::<KResult<_>>()?;
        set_shape(outputs, 0, &out)
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let w = self.width;
        let out = outputs.first_mut().ok_or("no output")?;
        let dst = bytes_mut(out.bytes, numel(out.dims).saturating_mul(w))?;
        let src = bytes(x.bytes, numel(x.dims).saturating_mul(w))?;
        let rank = x.dims.len();
        let pads = |k: usize| {
            self.pre.get(k).copied().unwrap_or(0) + self.post.get(k).copied().unwrap_or(0)
        };
        // Swin Transformer pads by nothing wherever its windows fit: then one copy.
        if (0..rank).all(|k| pads(k) == 0) {
            dst.get_mut(..src.len())
                .ok_or("pad outside its output")?
                .copy_from_slice(src);
            return Ok(());
        }
        fill_pattern(dst, self.fill.get(..w).unwrap_or_default());
        if src.is_empty() {
            return Ok(());
        }
        let mut ostr: Dims = std::iter::repeat_n(0, rank).collect();
        let mut acc = w;
        for k in (0..rank).rev() {
            if let Some(s) = ostr.get_mut(k) {
                *s = acc;
            }
            acc *= out.dims.get(k).copied().unwrap_or(1);
        }
        // The input's runs: its trailing dims that are not padded, and the one before.
        let inner_dims = (0..rank).rev().take_while(|&k| pads(k) == 0).count();
        let first_inner = rank.saturating_sub(inner_dims + 1);
        let inner = numel(x.dims.get(first_inner..).unwrap_or_default()) * w;
        let outer = x.dims.get(..first_inner).unwrap_or_default();
        let mut idx: Dims = std::iter::repeat_n(0, outer.len()).collect();
        for run in src.chunks_exact(inner.max(1)) {
            let off: usize = (0..rank)
                .map(|k| {
                    (idx.get(k).copied().unwrap_or(0) + self.pre.get(k).copied().unwrap_or(0))
                        * ostr.get(k).copied().unwrap_or(0)
                })
                .sum();
            dst.get_mut(off..off + inner)
                .ok_or("pad outside its output")?
                .copy_from_slice(run);
            for k in (0..outer.len()).rev() {
                if let (Some(i), Some(&d)) = (idx.get_mut(k), outer.get(k)) {
                    *i += 1;
                    if *i < d {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        Ok(())
    }
}

/// Fills `dst` with copies of the element `fill` (1, 2 or 4 bytes), a cache line at a
/// time (an element at a time was a call to `memcpy` per element).
fn fill_pattern(dst: &mut [u8], fill: &[u8]) {
    match fill {
        [] => {}
        [first, rest @ ..] if rest.iter().all(|b| b == first) => dst.fill(*first),
        _ => {
            let mut line = [0u8; 64];
            for (b, f) in line.iter_mut().zip(fill.iter().cycle()) {
                *b = *f;
            }
            // 64 is a multiple of the element's width, so every line starts on one.
            for chunk in dst.chunks_mut(64) {
                chunk.copy_from_slice(line.get(..chunk.len()).unwrap_or_default());
            }
        }
    }
}

/// StaticConstantPad. The padding value is a float, quantized for 8-bit outputs.
pub(crate) fn pad(cx: &NodeCx<'_>, pre: &[usize], post: &[usize], value: f32) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let width = same_kind(cx, x, y)?;
    let mut fill = [0u8; 4];
    match family(y) {
        Family::Float => fill = value.to_le_bytes(),
        Family::QInt8 | Family::QUInt8 => {
            let (s, z) = y
                .per_tensor()
                .ok_or("padding needs per-tensor parameters")?;
            let q = if family(y) == Family::QInt8 {
                super::quant::quantize_bound::<i8>(value, s, z) as i8 as u8
            } else {
                super::quant::quantize_bound::<u8>(value, s, z) as u8
            };
            fill[0] = q;
        }
        _ => fill = (value as i32).to_le_bytes(),
    }
    Prepared::new(Pad {
        width,
        pre: pre.iter().copied().collect(),
        post: post.iter().copied().collect(),
        fill,
    })
}

struct Concat {
    width: usize,
    axis: usize,
}

impl Kernel for Concat {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let first = shape_of(inputs, 0)?;
        if self.axis >= first.len() {
            return Err(format!(
                "axis {} for inputs of rank {}",
                self.axis,
                first.len()
            ));
        }
        let mut out: Dims = first.iter().copied().collect();
        let mut total = 0usize;
        for k in 0..inputs.len() {
            let s = shape_of(inputs, k)?;
            let agree = s.len() == first.len()
                && s.iter()
                    .zip(first)
                    .enumerate()
                    .all(|(d, (a, b))| d == self.axis || a == b);
            if !agree {
                return Err(format!("input {k} of shape {s:?} does not match {first:?}"));
            }
            total = total
                .checked_add(s.get(self.axis).copied().unwrap_or(0))
                .ok_or("concatenated size overflows")?;
        }
        if let Some(d) = out.get_mut(self.axis) {
            *d = total;
        }
        set_shape(outputs, 0, &out)
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let out = outputs.first_mut().ok_or("no output")?;
        let w = self.width;
        let dims = out.dims;
        let outer = numel(dims.get(..self.axis).unwrap_or_default());
        let inner = numel(dims.get(self.axis + 1..).unwrap_or_default()) * w;
        let out_row = dims.get(self.axis).copied().unwrap_or(0) * inner;
        let dst = bytes_mut(out.bytes, numel(dims).saturating_mul(w))?;
        let mut col = 0usize;
        for k in 0..inputs.len() {
            let x = arg(inputs, k)?;
            let row = x.dims.get(self.axis).copied().unwrap_or(0) * inner;
            let src = bytes(x.bytes, numel(x.dims).saturating_mul(w))?;
            for o in 0..outer {
                let d = o * out_row + col;
                dst.get_mut(d..d + row)
                    .ok_or("concatenation outside its output")?
                    .copy_from_slice(
                        src.get(o * row..(o + 1) * row)
                            .ok_or("concatenation outside its input")?,
                    );
            }
            col += row;
        }
        Ok(())
    }
}

/// Concatenate2..5.
pub(crate) fn concatenate(cx: &NodeCx<'_>, axis: usize) -> PResult<Prepared> {
    let y = cx.output(0)?;
    let mut width = 0;
    for k in 0..cx.node.inputs.len() {
        let x = cx.input(k)?;
        width = same_kind(cx, x, y)?;
    }
    Prepared::new(Concat { width, axis })
}

struct Resize {
    height: usize,
    width: usize,
    align_corners: bool,
    legacy: bool,
    quant: Option<(bool, f32, f32, i32, i32)>,
    /// Per output column: its two input columns and the second's weight (for the
    /// input width of the last reshape).
    cols: Vec<(usize, usize, f32)>,
}

/// XNNPACK's source coordinate, lower index, upper index and weight of output index
/// `o` of `out` from an axis of `inp`.
fn coord(o: usize, inp: usize, out: usize, align: bool, legacy: bool) -> (usize, usize, f32) {
    let adjust = usize::from(align && out != 1);
    let scale = (inp - adjust) as f32 / (out - adjust) as f32;
    let max = (inp - 1) as f32;
    let x = if legacy || align {
        (o as f32 * scale).min(max)
    } else {
        (o as f32 * scale + (0.5 * scale - 0.5)).max(0.0).min(max)
    };
    let lo = x as usize;
    let hi = (lo + 1).min(inp - 1);
    (lo, hi, x - lo as f32)
}

/// Pixel `x` of an NHWC row of `c` channels (empty if outside).
fn pixel(row: &[f32], x: usize, c: usize) -> &[f32] {
    row.get(x * c..x * c + c).unwrap_or_default()
}

impl Kernel for Resize {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        let [n, h, w, c] = s else {
            return Err(format!("input {s:?} is not 4-D (NHWC)"));
        };
        if *h == 0 || *w == 0 || self.height == 0 || self.width == 0 {
            return Err("resizing from or to an empty image".into());
        }
        if [*h, *w, self.height, self.width]
            .iter()
            .any(|&d| d >= 1 << 24)
        {
            return Err("resizing dimensions must be below 2^24".into());
        }
        self.cols = (0..self.width)
            .map(|o| coord(o, *w, self.width, self.align_corners, self.legacy))
            .collect();
        set_shape(outputs, 0, &[*n, self.height, self.width, *c])
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let &[n, h, w, c] = x.dims else {
            return Err("input is not 4-D".into());
        };
        let (oh, ow) = (self.height, self.width);
        let out = outputs.first_mut().ok_or("no output")?;
        let total = n * oh * ow * c;
        let xs = &self.cols;
        if xs.len() != ow || xs.iter().any(|&(_, x1, _)| x1 >= w) {
            return Err(format!("input width {w} is not the reshaped one"));
        }
        match self.quant {
            None => {
                let src = f32s(x.bytes, n * h * w * c)?;
                let dst = f32s_mut(out.bytes, total)?;
                // Output rows over the threads; each pixel's channels as whole slices,
                // which the compiler vectorizes (XNNPACK's order of operations: along
                // the row, then between the rows, rounded after each).
                let line = w * c;
                let rows = cx
                    .pool
                    .parallel_chunks(dst, ow * c, &mut [0u8; 0], 0, |i, row, _| {
                        let (b, oy) = (i / oh.max(1), i % oh.max(1));
                        let (y0, y1, fy) = coord(oy, h, oh, self.align_corners, self.legacy);
                        let input_row = |y: usize| {
                            let at = (b * h + y) * line;
                            src.get(at..at + line).unwrap_or_default()
                        };
                        let (top, bottom) = (input_row(y0), input_row(y1));
                        let px = |r, x| pixel(r, x, c);
                        for (o, &(x0, x1, fx)) in row.chunks_exact_mut(c.max(1)).zip(xs) {
                            let (tl, tr) = (px(top, x0), px(top, x1));
                            let (bl, br) = (px(bottom, x0), px(bottom, x1));
                            let corners = tl.iter().zip(tr).zip(bl.iter().zip(br));
                            for (v, ((&a, &b), (&p, &q))) in o.iter_mut().zip(corners) {
                                let t = a + (b - a) * fx;
                                let u = p + (q - p) * fx;
                                *v = t + (u - t) * fy;
                            }
                        }
                    });
                rows.map_err(|e| e.to_string())?;
            }
            Some((signed, si, so, zi, zo)) => {
                let src = bytes(x.bytes, n * h * w * c)?;
                let dst = bytes_mut(out.bytes, total)?;
                let get = |v: u8| {
                    if signed {
                        i32::from(v as i8)
                    } else {
                        i32::from(v)
                    }
                };
                let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
                for b in 0..n {
                    for oy in 0..oh {
                        let (y0, y1, fy) = coord(oy, h, oh, self.align_corners, self.legacy);
                        for (ox, &(x0, x1, fx)) in xs.iter().enumerate() {
                            let at = |y: usize, x: usize, k: usize| {
                                src.get(((b * h + y) * w + x) * c + k)
                                    .map_or(0.0, |&v| (get(v) - zi) as f32)
                            };
                            for k in 0..c {
                                let top = at(y0, x0, k) + (at(y0, x1, k) - at(y0, x0, k)) * fx;
                                let bottom = at(y1, x0, k) + (at(y1, x1, k) - at(y1, x0, k)) * fx;
                                let v = (top + (bottom - top) * fy) * si / so;
                                let q = (super::quant::rint(v) + zo).clamp(lo, hi);
                                if let Some(d) = dst.get_mut(((b * oh + oy) * ow + ox) * c + k) {
                                    *d = q as u8;
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// StaticResizeBilinear2D (NHWC).
pub(crate) fn resize_bilinear(
    cx: &NodeCx<'_>,
    height: usize,
    width: usize,
    align_corners: bool,
    legacy: bool,
) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let quant = match (family(x), family(y)) {
        (Family::Float, Family::Float) => None,
        (a @ (Family::QInt8 | Family::QUInt8), b) if a == b => {
            let ((si, zi), (so, zo)) = x
                .per_tensor()
                .zip(y.per_tensor())
                .ok_or("resizing needs per-tensor parameters")?;
            Some((a == Family::QInt8, si, so, zi, zo))
        }
        _ => {
            return Err(format!(
                "resizing {} to {} is not supported",
                describe(x),
                describe(y)
            )
            .into())
        }
    };
    Prepared::new(Resize {
        height,
        width,
        align_corners,
        legacy,
        quant,
        cols: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_simplify() {
        // NCHW -> NHWC: [C, H*W] swapped per batch.
        let (d, p) = simplify(&[2, 3, 4, 5], &[0, 2, 3, 1]);
        assert_eq!(
            (d.as_slice(), p.as_slice()),
            (&[2, 3, 20][..], &[0, 2, 1][..])
        );
        let (d, p) = simplify(&[1, 3, 4, 5], &[0, 2, 3, 1]);
        assert_eq!((d.as_slice(), p.as_slice()), (&[3, 20][..], &[1, 0][..]));
        let (d, p) = simplify(&[2, 3], &[0, 1]);
        assert_eq!((d.as_slice(), p.as_slice()), (&[6][..], &[0][..]));
        // Merged dims whose product overflows (a hostile payload; found by fuzzing)
        // saturate, and the run's length checks refuse them.
        let (d, _) = simplify(&[usize::MAX / 2, 3, 7], &[2, 0, 1]);
        assert_eq!(d.as_slice(), &[usize::MAX, 7][..]);
    }

    #[test]
    fn permutes_match_a_reference() {
        let dims = [2usize, 3, 4, 5];
        let src: Vec<u32> = (0..120).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&src).to_vec();
        for perm in [
            [0, 2, 3, 1],
            [0, 3, 1, 2],
            [3, 2, 1, 0],
            [1, 0, 3, 2],
            [0, 1, 3, 2],
            // Merges to [1, 0, 2]: whole runs move.
            [1, 0, 2, 3],
        ] {
            let (d, p) = simplify(&dims, &perm);
            if perm == [1, 0, 2, 3] {
                assert_eq!(
                    (d.as_slice(), p.as_slice()),
                    (&[2, 3, 20][..], &[1, 0, 2][..])
                );
            }
            let mut dst = vec![0u8; bytes.len()];
            let pool = pte_compute::ThreadPool::new(1).unwrap();
            let budget = pte_runtime::MemoryBudget::new(1 << 20);
            let mut scratch = pte_runtime::Buffer::new(&budget);
            let cx = Cx {
                pool: &pool,
                scratch: &mut scratch,
            };
            permute(&cx, &bytes, &mut dst, &d, &p, 4);
            let got: &[u32] = bytemuck::cast_slice(&dst);
            let od: Vec<usize> = perm.iter().map(|&q| dims[q]).collect();
            let mut k = 0;
            for a in 0..od[0] {
                for b in 0..od[1] {
                    for c in 0..od[2] {
                        for e in 0..od[3] {
                            let mut idx = [0; 4];
                            for (pos, &v) in [a, b, c, e].iter().enumerate() {
                                idx[perm[pos]] = v;
                            }
                            let want = ((idx[0] * 3 + idx[1]) * 4 + idx[2]) * 5 + idx[3];
                            assert_eq!(got[k], want as u32, "{perm:?}");
                            k += 1;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn padding_matches_a_reference() {
        let dims = [2usize, 3, 4, 5];
        let src: Vec<u32> = (1..=120).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&src).to_vec();
        let pool = pte_compute::ThreadPool::new(1).unwrap();
        let budget = pte_runtime::MemoryBudget::new(1 << 20);
        let mut scratch = pte_runtime::Buffer::new(&budget);
        let fill = 0xdead_beef_u32;
        // Nothing (a copy), the last dims, only the first ones (whole runs move), all.
        for (pre, post) in [
            ([0, 0, 0, 0], [0, 0, 0, 0]),
            ([0, 0, 1, 2], [0, 0, 2, 0]),
            ([1, 2, 0, 0], [0, 1, 0, 0]),
            ([1, 0, 2, 1], [2, 1, 0, 3]),
        ] {
            let pad = Pad {
                width: 4,
                pre: pre.into_iter().collect(),
                post: post.into_iter().collect(),
                fill: fill.to_le_bytes(),
            };
            let od: Vec<usize> = (0..4).map(|k| dims[k] + pre[k] + post[k]).collect();
            let mut dst = vec![0u8; od.iter().product::<usize>() * 4];
            let mut cx = Cx {
                pool: &pool,
                scratch: &mut scratch,
            };
            let inputs = [Some(In {
                bytes: &bytes,
                dims: &dims,
            })];
            let mut outputs = [Out {
                bytes: &mut dst,
                dims: &od,
            }];
            pad.run(&mut cx, &inputs, &mut outputs).unwrap();
            let got: &[u32] = bytemuck::cast_slice(&dst);
            let mut k = 0;
            for a in 0..od[0] {
                for b in 0..od[1] {
                    for c in 0..od[2] {
                        for e in 0..od[3] {
                            let at = [a, b, c, e];
                            let inside =
                                (0..4).all(|d| at[d] >= pre[d] && at[d] < pre[d] + dims[d]);
                            let want = if inside {
                                let i = |d: usize| at[d] - pre[d];
                                (((i(0) * 3 + i(1)) * 4 + i(2)) * 5 + i(3) + 1) as u32
                            } else {
                                fill
                            };
                            assert_eq!(got[k], want, "{pre:?} {post:?} at {at:?}");
                            k += 1;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn reshape_infers_one_dimension() {
        assert_eq!(
            infer_shape(&[2, 3, 4], &[0, 4]).unwrap().as_slice(),
            &[6, 4]
        );
        assert!(infer_shape(&[2, 3, 4], &[0, 0]).is_err());
        assert!(infer_shape(&[2, 3, 4], &[5, 0]).is_err());
        assert!(infer_shape(&[2, 3, 4], &[2, 3]).is_err());
    }
}
