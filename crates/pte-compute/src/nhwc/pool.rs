//! NHWC pooling: each output pixel combines the input pixels of its window, 16
//! channels at a time in registers.

use super::Geometry;
use crate::arch::{multiversion, Isa};
use crate::elementwise::clamp;
use crate::error::{self, Result};
use crate::pool::ThreadPool;
use crate::qelementwise::QByte;

/// Channels combined at once in registers.
const CB: usize = 16;
/// Window pixels combined per pass (larger windows take several passes).
const TAPS: usize = 32;

/// What a pooling computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The maximum over the window (NaN if the window holds one, as PyTorch).
    Max,
    /// The mean over the window's positions inside the image (padding excluded).
    Average,
}

/// Combines the window pixels `taps` (their channels `c0..c0 + N`) into `acc`.
#[inline(always)]
fn combine<const N: usize>(acc: &mut [f32; N], taps: &[&[f32]], c0: usize, max_pool: bool) {
    for x in taps {
        // A whole block as an array: the loop compiles to a few vector instructions.
        let Some(x) = x
            .get(c0..c0 + N)
            .and_then(|x| <&[f32; N]>::try_from(x).ok())
        else {
            continue;
        };
        if max_pool {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = if v > *a || v.is_nan() { v } else { *a };
            }
        } else {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a += v;
            }
        }
    }
}

/// Combines the window pixels `taps` into `out`'s channels from `c0`, `N` at a time,
/// while whole blocks remain; returns where it stopped.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one pass's operands and epilogue
fn pool_blocks<const N: usize>(
    out: &mut [f32],
    c0: usize,
    taps: &[&[f32]],
    max_pool: bool,
    (first, last): (bool, bool),
    scale: f32,
    (min, max): (f32, f32),
) -> usize {
    let neutral = if max_pool { f32::NEG_INFINITY } else { 0.0 };
    let tail = out.get_mut(c0..).unwrap_or_default();
    let blocks = tail.len() / N;
    for (b, o) in tail.chunks_exact_mut(N).enumerate() {
        let mut acc = [neutral; N];
        if !first {
            acc.copy_from_slice(o);
        }
        combine(&mut acc, taps, c0 + b * N, max_pool);
        for (o, &a) in o.iter_mut().zip(&acc) {
            *o = if last { clamp(a * scale, min, max) } else { a };
        }
    }
    c0 + blocks * N
}

multiversion! {
    /// Output row `oy` of one image `img` into `out_row`: each pixel combines its
    /// window's pixels in passes of up to [`TAPS`], 16 channels at a time, then 8, 4
    /// and one (shufflenet's 24 channels left a third of them to a scalar loop, and a
    /// call per pixel dispatched on the instruction set: its 3×3 max pooling took
    /// 0.4 ms); the last pass scales (averages) and clamps.
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
        let iw = g.input[1];
        let total = kh * kw;
        let max_pool = kind == PoolKind::Max;
        // Filled in once per row, not per pixel (its 512 bytes cost a fifth of the
        // time).
        let mut taps: [&[f32]; TAPS] = [&[]; TAPS];
        for (ox, out) in out_row.chunks_exact_mut(channels.max(1)).enumerate() {
            // Averages divide by the taps inside the image.
            let scale = if max_pool {
                1.0
            } else {
                let inside = (0..total)
                    .filter(|&t| g.source(oy, ox, t / kw, t % kw).is_some())
                    .count();
                1.0 / inside.max(1) as f32
            };
            let mut n_taps = 0usize;
            let mut first = true;
            // Taps row by row: `t / kw` divided per tap (a fifth of the time).
            let window = (0..kh).flat_map(|ky| (0..kw).map(move |kx| (ky, kx)));
            for (t, (ky, kx)) in window.enumerate() {
                if let Some((iy, ix)) = g.source(oy, ox, ky, kx) {
                    let p = (iy * iw + ix) * channels;
                    if let Some(slot) = taps.get_mut(n_taps) {
                        *slot = img.get(p..p + channels).unwrap_or_default();
                        n_taps += 1;
                    }
                }
                if n_taps == TAPS || t + 1 == total {
                    let taps = taps.get(..n_taps).unwrap_or_default();
                    let pass = (first, t + 1 == total);
                    let c = pool_blocks::<CB>(out, 0, taps, max_pool, pass, scale, (min, max));
                    let c = pool_blocks::<8>(out, c, taps, max_pool, pass, scale, (min, max));
                    let c = pool_blocks::<4>(out, c, taps, max_pool, pass, scale, (min, max));
                    pool_blocks::<1>(out, c, taps, max_pool, pass, scale, (min, max));
                    first = false;
                    n_taps = 0;
                }
            }
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
