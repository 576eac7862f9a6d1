//! NHWC pooling: each output pixel combines the input pixels of its window, 16
//! channels at a time in registers.

use super::Geometry;
use crate::arch::{multiversion, Isa};
use crate::elementwise::clamp;
use crate::error::{self, Result};
use crate::pool::ThreadPool;
use crate::qelementwise::QByte;

/// What a pooling computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The maximum over the window (NaN if the window holds one, as PyTorch).
    Max,
    /// The mean over the window's positions inside the image (padding excluded).
    Average,
    /// The window's sum over its positions inside the image and its padding
    /// (PyTorch's `count_include_pad`). As in PyTorch, the trailing padding is taken
    /// to be as wide as the leading one: positions a `ceil_mode` window reaches beyond
    /// it do not count.
    AverageCountingPadding,
    /// The window's sum over a fixed divisor (PyTorch's `divisor_override`).
    AverageOver(usize),
}

impl PoolKind {
    /// What output `(oy, ox)`'s sum (or maximum) is multiplied by, its window's
    /// positions inside the image being `ys` and `xs`.
    fn scale(self, g: &Geometry, (oy, ox): (usize, usize), (ys, xs): (Span, Span)) -> f32 {
        // Positions from the window's start up to the end of the padded image.
        let padded = |o: usize, [input, kernel, stride, dilation, pad]: [usize; 5]| {
            (input + 2 * pad)
                .checked_sub(o * stride + 1)
                .map_or(0, |room| (room / dilation.max(1) + 1).min(kernel))
        };
        let along = |a: usize| {
            let pad = if a == 0 { g.padding[0] } else { g.padding[3] };
            let at = |v: [usize; 2]| if a == 0 { v[0] } else { v[1] };
            [at(g.input), at(g.kernel), at(g.stride), at(g.dilation), pad]
        };
        let count = match self {
            PoolKind::Max => return 1.0,
            PoolKind::Average => ys.count * xs.count,
            PoolKind::AverageCountingPadding => padded(oy, along(0)) * padded(ox, along(1)),
            PoolKind::AverageOver(d) => d,
        };
        1.0 / count.max(1) as f32
    }
}

/// The input rows and columns a window reads along one axis: `count` positions from
/// `first`, `step` apart, the window's taps from `tap0` (those in the padding left out).
#[derive(Clone, Copy)]
struct Span {
    first: usize,
    count: usize,
    step: usize,
}

impl Span {
    /// The positions of output `o`'s window inside an axis of `len` positions.
    fn of(o: usize, stride: usize, pad: usize, kernel: usize, dilation: usize, len: usize) -> Self {
        let start = o * stride;
        let step = dilation.max(1);
        // Taps before the image: those with start + k * step < pad.
        let skip = pad.saturating_sub(start).div_ceil(step).min(kernel);
        let first = (start + skip * step).saturating_sub(pad);
        let count = if first < len {
            ((len - 1 - first) / step + 1).min(kernel - skip)
        } else {
            0
        };
        Span { first, count, step }
    }
}

/// Channels `c0..c0 + N` of one output pixel whose window covers input rows `ys` and
/// columns `xs`: the maximum (NaN if one is NaN, as PyTorch) or the sum, in
/// registers.
#[inline(always)]
fn window<const N: usize>(
    img: &[f32],
    (iw, channels): (usize, usize),
    (ys, xs): (Span, Span),
    c0: usize,
    max_pool: bool,
) -> [f32; N] {
    let mut acc = [if max_pool { f32::NEG_INFINITY } else { 0.0 }; N];
    for r in 0..ys.count {
        let iy = ys.first + r * ys.step;
        for k in 0..xs.count {
            let p = (iy * iw + xs.first + k * xs.step) * channels + c0;
            // A whole block as an array: the loop compiles to a few vector instructions.
            let Some(x) = img
                .get(p..p + N)
                .and_then(|x| <&[f32; N]>::try_from(x).ok())
            else {
                continue;
            };
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = if max_pool {
                    if v > *a || v.is_nan() {
                        v
                    } else {
                        *a
                    }
                } else {
                    *a + v
                };
            }
        }
    }
    acc
}

/// Channels `c0..` of one output pixel `out`, `N` at a time while whole blocks remain,
/// scaled (averages) and clamped; returns where it stopped.
#[inline(always)]
fn window_blocks<const N: usize>(
    img: &[f32],
    dims: (usize, usize),
    spans: (Span, Span),
    out: &mut [f32],
    c0: usize,
    max_pool: bool,
    (scale, min, max): (f32, f32, f32),
) -> usize {
    let tail = out.get_mut(c0..).unwrap_or_default();
    let blocks = tail.len() / N;
    for (b, o) in tail.chunks_exact_mut(N).enumerate() {
        let acc = window::<N>(img, dims, spans, c0 + b * N, max_pool);
        for (o, &a) in o.iter_mut().zip(&acc) {
            *o = clamp(a * scale, min, max);
        }
    }
    c0 + blocks * N
}

multiversion! {
    /// Output row `oy` of one image `img` into `out_row`: each pixel combines its
    /// window's pixels inside the image, read in place, 16 channels at a time in
    /// registers, then 8, 4 and one (shufflenet's 24 channels); averages scale by
    /// what their kind divides by. Where each pixel gathered a list of its taps and
    /// combined them for every block of channels, shufflenet's 3×3 max pooling of 24
    /// channels at 112×112 took 0.16 ms, now 0.12 (`bench maxpool`; 16 channels
    /// 0.135 → 0.074). Splitting the chain of dependent selects by window row, or
    /// noting NaNs apart from a plain maximum, measured no faster.
    fn pool_row<const FMA: bool>(
        img: &[f32],
        g: &Geometry,
        channels: usize,
        kind: PoolKind,
        oy: usize,
        out_row: &mut [f32],
        min: f32,
        max: f32,
    ) {
        let [kh, kw] = g.kernel;
        let [ih, iw] = g.input;
        let [pt, _, _, pl] = g.padding;
        let max_pool = kind == PoolKind::Max;
        let ys = Span::of(oy, g.stride[0], pt, kh, g.dilation[0], ih);
        let dims = (iw, channels);
        for (ox, out) in out_row.chunks_exact_mut(channels.max(1)).enumerate() {
            let xs = Span::of(ox, g.stride[1], pl, kw, g.dilation[1], iw);
            let post = (kind.scale(g, (oy, ox), (ys, xs)), min, max);
            let spans = (ys, xs);
            let c = window_blocks::<16>(img, dims, spans, out, 0, max_pool, post);
            let c = window_blocks::<8>(img, dims, spans, out, c, max_pool, post);
            let c = window_blocks::<4>(img, dims, spans, out, c, max_pool, post);
            window_blocks::<1>(img, dims, spans, out, c, max_pool, post);
        }
    }
}

/// 8-bit max pooling of `batch` NHWC images of `channels` channels: `x` `[batch, h, w,
/// c]` into `y` `[batch, oh, ow, c]`, each output the maximum over its window clamped
/// to `bounds` (the input's quantization kept), `empty` for a window all in the
/// padding; rows on the pool.
#[allow(clippy::too_many_arguments)]
pub fn max_pool2d_q8<T: QByte>(
    pool: &ThreadPool,
    g: &Geometry,
    channels: usize,
    batch: usize,
    x: &[T],
    y: &mut [T],
    bounds: (T, T),
    empty: T,
) -> Result {
    pool_rows(pool, g, channels, batch, (x, y), |img, oy, out_row| {
        T::max_pool_row(img, g, channels, oy, out_row, bounds, empty);
    })
}

/// Checks the lengths of a pooling of `batch` NHWC images and runs `row(image, oy,
/// output row)` for every output row, rows on the pool.
fn pool_rows<T: Send + Sync>(
    pool: &ThreadPool,
    g: &Geometry,
    channels: usize,
    batch: usize,
    (x, y): (&[T], &mut [T]),
    row: impl Fn(&[T], usize, &mut [T]) + Sync,
) -> Result {
    let [oh, ow] = g.output()?;
    let [ih, iw] = g.input;
    let plane = error::mul(error::mul(ih, iw, "input")?, channels, "input")?;
    error::need("pooling input", x.len(), error::mul(plane, batch, "input")?)?;
    let row_len = error::mul(ow, channels, "output")?;
    let out_len = error::mul(error::mul(row_len, oh, "output")?, batch, "output")?;
    error::need("pooling output", y.len(), out_len)?;
    let y = y.get_mut(..out_len).unwrap_or_default();
    pool.parallel_chunks(y, row_len, &mut [0u8; 0], 0, |r, out_row, _| {
        let (n, oy) = (r / oh, r % oh);
        let img = x.get(n * plane..(n + 1) * plane).unwrap_or_default();
        row(img, oy, out_row);
    })
}

/// Pools `batch` NHWC images of `channels` channels: `x` `[batch, h, w, c]` into `y`
/// `[batch, oh, ow, c]`, clamped to `[min, max]`.
#[allow(clippy::too_many_arguments)]
pub fn pool2d(
    isa: Isa,
    pool: &ThreadPool,
    kind: PoolKind,
    g: &Geometry,
    channels: usize,
    batch: usize,
    x: &[f32],
    y: &mut [f32],
    min: f32,
    max: f32,
) -> Result {
    pool_rows(pool, g, channels, batch, (x, y), |img, oy, out_row| {
        pool_row(isa, img, g, channels, kind, oy, out_row, min, max);
    })
}

multiversion! {
    /// `acc += ` every row of `x` (rows as long as `acc`), in order: one call per
    /// image, not per pixel (a call per 16-channel pixel cost twice the sums).
    fn add_rows<const FMA: bool>(acc: &mut [f32], x: &[f32]) {
        for row in x.chunks_exact(acc.len().max(1)) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v;
            }
        }
    }
}

/// Means over the `pixels` rows of each of `batch` images of `channels` channels:
/// `x` `[batch, pixels, channels]` into `y` `[batch, channels]`, clamped.
#[allow(clippy::too_many_arguments)]
pub fn global_avg_pool(
    isa: Isa,
    batch: usize,
    pixels: usize,
    channels: usize,
    x: &[f32],
    y: &mut [f32],
    min: f32,
    max: f32,
) -> Result {
    let plane = error::mul(pixels, channels, "input")?;
    error::need("pooling input", x.len(), error::mul(plane, batch, "input")?)?;
    error::need(
        "pooling output",
        y.len(),
        error::mul(batch, channels, "output")?,
    )?;
    if channels == 0 {
        return Ok(());
    }
    let scale = 1.0 / pixels.max(1) as f32;
    for (img, out) in x
        .chunks_exact(plane.max(1))
        .zip(y.chunks_exact_mut(channels))
        .take(batch)
    {
        out.fill(0.0);
        add_rows(isa, out, img);
        for o in out.iter_mut() {
            *o = clamp(*o * scale, min, max);
        }
    }
    Ok(())
}
