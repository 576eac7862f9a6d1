//! Pooling nodes over NHWC images: max, average (over the taps inside the image),
//! argmax (index within the window) and global average.

use pte_compute::nhwc::{global_avg_pool, max_pool2d_q8, pool2d, Geometry, PoolKind};
use pte_compute::{Isa, ThreadPool};

use super::quant::{self, Q8};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, i32s_mut, numel, set_shape, shape_of,
    Family, KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::{Datatype, Dims, PoolGeometry};

fn geometry(g: &PoolGeometry, input: [usize; 2]) -> Geometry {
    let u = |v: u32| v as usize;
    Geometry {
        input,
        kernel: [u(g.window[0]), u(g.window[1])],
        stride: [u(g.stride[0]), u(g.stride[1])],
        dilation: [u(g.dilation[0]), u(g.dilation[1])],
        padding: g.padding.map(u),
    }
}

/// `[n, h, w, c]` of a 4-D input.
fn nhwc(s: &[usize]) -> KResult<[usize; 4]> {
    match *s {
        [n, h, w, c] => Ok([n, h, w, c]),
        _ => Err(format!("input {s:?} is not 4-D (NHWC)")),
    }
}

/// How 8-bit pooling maps input to output values.
#[derive(Clone, Copy)]
struct QuantMap {
    signed: bool,
    si: f32,
    zi: i32,
    so: f32,
    zo: i32,
    lo: i32,
    hi: i32,
}

struct Pool {
    kind: PoolKind,
    g: PoolGeometry,
    geo: Option<Geometry>,
    min: f32,
    max: f32,
    quant: Option<QuantMap>,
    isa: Isa,
}

impl Kernel for Pool {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, c] = nhwc(shape_of(inputs, 0)?)?;
        let geo = geometry(&self.g, [h, w]);
        let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
        self.geo = Some(geo);
        set_shape(outputs, 0, &[n, oh, ow, c])
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let [n, _, _, c] = nhwc(x.dims)?;
        let geo = self.geo.as_ref().ok_or("not reshaped")?;
        let out = outputs.first_mut().ok_or("no output")?;
        let total = numel(out.dims);
        match self.quant {
            None => pool2d(
                self.isa,
                cx.pool,
                self.kind,
                geo,
                c,
                n,
                f32s(x.bytes, numel(x.dims))?,
                f32s_mut(out.bytes, total)?,
                self.min,
                self.max,
            )
            .map_err(|e| e.to_string()),
            Some(q) if q.signed => quant_pool::<i8>(cx.pool, self.kind, geo, c, x, out, total, q),
            Some(q) => quant_pool::<u8>(cx.pool, self.kind, geo, c, x, out, total, q),
        }
    }
}

/// Channels an 8-bit average pool sums at once.
const AVG_BLOCK: usize = 64;

#[allow(clippy::too_many_arguments)]
fn quant_pool<T: Q8>(
    pool: &ThreadPool,
    kind: PoolKind,
    geo: &Geometry,
    c: usize,
    x: &In<'_>,
    out: &mut Out<'_>,
    total: usize,
    q: QuantMap,
) -> KResult {
    let src: &[T] = bytemuck::cast_slice(bytes(x.bytes, numel(x.dims))?);
    let dst: &mut [T] = bytemuck::cast_slice_mut(bytes_mut(out.bytes, total)?);
    if kind == PoolKind::Max {
        // Max pooling keeps the input's parameters (checked at load); an empty window
        // (all padding) gives the zero point.
        let bounds = (T::from_i32(q.lo), T::from_i32(q.hi));
        let empty = T::from_i32(q.zo.clamp(q.lo, q.hi));
        let batch = x.dims.first().copied().unwrap_or(1);
        return max_pool2d_q8(pool, geo, c, batch, src, dst, bounds, empty)
            .map_err(|e| e.to_string());
    }
    let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
    let [ih, iw] = geo.input;
    let [kh, kw] = geo.kernel;
    let mut none = [0u8; 0];
    // One output row per chunk; each pixel averages its window's input pixels.
    let rows = pool.parallel_chunks(dst, (ow * c).max(1), &mut none, 0, |r, row, _| {
        let (b, oy) = (r / oh.max(1), r % oh.max(1));
        let pixel = |iy: usize, ix: usize| {
            let at = ((b * ih + iy) * iw + ix) * c;
            src.get(at..at + c).unwrap_or_default()
        };
        for (ox, o) in row.chunks_exact_mut(c.max(1)).enumerate() {
            let taps = (0..kh * kw).filter_map(|t| geo.source(oy, ox, t / kw, t % kw));
            let count = taps.clone().count().max(1) as f32;
            for (c0, block) in o.chunks_mut(AVG_BLOCK).enumerate() {
                let mut sum = [0i32; AVG_BLOCK];
                for (iy, ix) in taps.clone() {
                    let p = pixel(iy, ix).get(c0 * AVG_BLOCK..).unwrap_or_default();
                    for (s, &v) in sum.iter_mut().zip(p).take(block.len()) {
                        *s += v.get() - q.zi;
                    }
                }
                for (d, &s) in block.iter_mut().zip(&sum) {
                    let v = quant::rint(s as f32 / count * q.si / q.so) + q.zo;
                    *d = T::from_i32(v.clamp(q.lo, q.hi));
                }
            }
        }
    });
    rows.map_err(|e| e.to_string())
}

fn prepare_pool(cx: &NodeCx<'_>, g: &PoolGeometry, kind: PoolKind) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    if g.window.contains(&0) || g.stride.contains(&0) || g.dilation.contains(&0) {
        return Err(format!(
            "window {:?}, stride {:?} and dilation {:?} must be positive",
            g.window, g.stride, g.dilation
        )
        .into());
    }
    let quant = match (family(x), family(y)) {
        (Family::Float, Family::Float) => None,
        (a @ (Family::QInt8 | Family::QUInt8), b) if a == b => {
            let ((si, zi), (so, zo)) = x
                .per_tensor()
                .zip(y.per_tensor())
                .ok_or("8-bit pooling needs per-tensor parameters")?;
            if kind == PoolKind::Max && (si, zi) != (so, zo) {
                return Err("8-bit max pooling needs the same parameters in and out".into());
            }
            let signed = a == Family::QInt8;
            let (lo, hi) = if signed {
                quant::bounds::<i8>(min, max, so, zo)
            } else {
                quant::bounds::<u8>(min, max, so, zo)
            };
            Some(QuantMap {
                signed,
                si,
                zi,
                so,
                zo,
                lo,
                hi,
            })
        }
        _ => {
            return Err(format!(
                "pooling {} to {} is not supported",
                describe(x),
                describe(y)
            )
            .into())
        }
    };
    Prepared::new(Pool {
        kind,
        g: *g,
        geo: None,
        min,
        max,
        quant,
        isa: Isa::best(),
    })
}

/// MaxPooling2d.
pub(crate) fn max_pooling(cx: &NodeCx<'_>, g: &PoolGeometry) -> PResult<Prepared> {
    prepare_pool(cx, g, PoolKind::Max)
}

/// AvgPooling2d (XNNPACK's average pooling has no dilation: the field is ignored).
pub(crate) fn avg_pooling(cx: &NodeCx<'_>, g: &PoolGeometry) -> PResult<Prepared> {
    let g = PoolGeometry {
        dilation: [1, 1],
        ..*g
    };
    prepare_pool(cx, &g, PoolKind::Average)
}

struct ArgMax {
    g: PoolGeometry,
    geo: Option<Geometry>,
}

impl Kernel for ArgMax {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, c] = nhwc(shape_of(inputs, 0)?)?;
        let geo = geometry(&self.g, [h, w]);
        let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
        self.geo = Some(geo);
        set_shape(outputs, 0, &[n, oh, ow, c])?;
        set_shape(outputs, 1, &[n, oh, ow, c])
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let [n, ih, iw, c] = nhwc(x.dims)?;
        let geo = self.geo.as_ref().ok_or("not reshaped")?;
        let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
        let [kh, kw] = geo.kernel;
        let src = f32s(x.bytes, numel(x.dims))?;
        let total = n * oh * ow * c;
        let (first, rest) = outputs.split_first_mut().ok_or("no outputs")?;
        let values = f32s_mut(first.bytes, total)?;
        let indices = i32s_mut(rest.first_mut().ok_or("no index output")?.bytes, total)?;
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..c {
                        // The first maximum wins; its index is its position in the window.
                        let mut best: Option<(f32, usize)> = None;
                        for t in 0..kh * kw {
                            let Some((iy, ix)) = geo.source(oy, ox, t / kw, t % kw) else {
                                continue;
                            };
                            let v = src
                                .get(((b * ih + iy) * iw + ix) * c + ch)
                                .copied()
                                .unwrap_or(f32::NAN);
                            if best.is_none_or(|(m, _)| v > m) {
                                best = Some((v, t));
                            }
                        }
                        let o = ((b * oh + oy) * ow + ox) * c + ch;
                        let (v, t) = best.unwrap_or((f32::NAN, 0));
                        if let (Some(dv), Some(di)) = (values.get_mut(o), indices.get_mut(o)) {
                            *dv = v;
                            *di = t as i32;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// ArgMaxPooling2d (float values, int32 indices).
pub(crate) fn argmax_pooling(cx: &NodeCx<'_>, g: &PoolGeometry) -> PResult<Prepared> {
    let (x, v, i) = (cx.input(0)?, cx.output(0)?, cx.output(1)?);
    if !cx.all_float(&[x, v]) || i.dtype != Datatype::Int32 {
        return Err(format!(
            "argmax pooling of {} to {}, {} is not supported",
            describe(x),
            describe(v),
            describe(i)
        )
        .into());
    }
    if g.window.contains(&0) {
        return Err("the window must not be empty".into());
    }
    Prepared::new(ArgMax { g: *g, geo: None })
}

struct GlobalAvg {
    keep_dims: bool,
    min: f32,
    max: f32,
    quant: Option<QuantMap>,
    isa: Isa,
}

impl Kernel for GlobalAvg {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if s.len() < 3 {
            return Err(format!("input {s:?} has fewer than 3 dimensions"));
        }
        let r = s.len();
        let out: Dims = if self.keep_dims {
            s.iter()
                .enumerate()
                .map(|(k, &d)| if k == r - 3 || k == r - 2 { 1 } else { d })
                .collect()
        } else {
            s.iter()
                .enumerate()
                .filter(|&(k, _)| k != r - 3 && k != r - 2)
                .map(|(_, &d)| d)
                .collect()
        };
        set_shape(outputs, 0, &out)
    }

    fn run(&self, _cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let r = x.dims.len();
        let c = x.dims.last().copied().unwrap_or(1);
        let pixels = x.dims.get(r.saturating_sub(3)).copied().unwrap_or(1)
            * x.dims.get(r.saturating_sub(2)).copied().unwrap_or(1);
        let batch = numel(x.dims.get(..r.saturating_sub(3)).unwrap_or_default());
        let out = outputs.first_mut().ok_or("no output")?;
        match self.quant {
            None => global_avg_pool(
                self.isa,
                batch,
                pixels,
                c,
                f32s(x.bytes, numel(x.dims))?,
                f32s_mut(out.bytes, batch * c)?,
                self.min,
                self.max,
            )
            .map_err(|e| e.to_string()),
            Some(q) => {
                let src = bytes(x.bytes, numel(x.dims))?;
                let dst = bytes_mut(out.bytes, batch * c)?;
                if q.signed {
                    quantized_means::<i8>(
                        q,
                        bytemuck::cast_slice(src),
                        bytemuck::cast_slice_mut(dst),
                        (batch, pixels, c),
                    );
                } else {
                    quantized_means::<u8>(q, src, dst, (batch, pixels, c));
                }
                Ok(())
            }
        }
    }
}

/// Channels whose sums one pass over the pixels accumulates (on the stack).
const MEAN_CHANNELS: usize = 256;

/// The 8-bit means over the pixels of `batch` images of `pixels` × `c` values, as
/// XNNPACK's sum reduction computes them: the sum of the stored values times (si /
/// so) · (1 / n), plus zo − (n · zi) · that scale, in f32, rounded to nearest even. A
/// mean on a tie (k + ½ steps) rounds as that sum does, which is not always as the
/// exact mean does. Sums run pixel by pixel over blocks of channels (pte-compute's
/// column sums, compiled per instruction set: 5× faster than the baseline loop).
fn quantized_means<T: Q8>(
    q: QuantMap,
    src: &[T],
    dst: &mut [T],
    (batch, pixels, c): (usize, usize, usize),
) {
    let scale = (q.si / q.so) * (1.0 / pixels.max(1) as f32);
    let offset = q.zo as f32 - (pixels as i64 * i64::from(q.zi)) as f32 * scale;
    for b in 0..batch {
        for c0 in (0..c).step_by(MEAN_CHANNELS) {
            let w = MEAN_CHANNELS.min(c - c0);
            let mut sums = [0i32; MEAN_CHANNELS];
            let image = src.get(b * pixels * c + c0..(b + 1) * pixels * c);
            let sums_here = sums.get_mut(..w).unwrap_or_default();
            T::column_sums(sums_here, image.unwrap_or_default(), c);
            let out = dst.get_mut(b * c + c0..b * c + c0 + w).unwrap_or_default();
            for (d, &sum) in out.iter_mut().zip(&sums) {
                let v = quant::rint(sum as f32 * scale + offset).clamp(q.lo, q.hi);
                *d = T::from_i32(v);
            }
        }
    }
}

/// GlobalAvgPooling2d: the mean over the two dimensions before the last.
pub(crate) fn global_avg_pooling(cx: &NodeCx<'_>, keep_dims: bool) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    let quant = match (family(x), family(y)) {
        (Family::Float, Family::Float) => None,
        (a @ (Family::QInt8 | Family::QUInt8), b) if a == b => {
            let ((si, zi), (so, zo)) = x
                .per_tensor()
                .zip(y.per_tensor())
                .ok_or("8-bit pooling needs per-tensor parameters")?;
            let signed = a == Family::QInt8;
            let (lo, hi) = if signed {
                quant::bounds::<i8>(min, max, so, zo)
            } else {
                quant::bounds::<u8>(min, max, so, zo)
            };
            Some(QuantMap {
                signed,
                si,
                zi,
                so,
                zo,
                lo,
                hi,
            })
        }
        _ => {
            return Err(format!(
                "pooling {} to {} is not supported",
                describe(x),
                describe(y)
            )
            .into())
        }
    };
    Prepared::new(GlobalAvg {
        keep_dims,
        min,
        max,
        quant,
        isa: Isa::best(),
    })
}
