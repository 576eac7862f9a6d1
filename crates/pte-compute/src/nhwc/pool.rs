//! NHWC pooling: each output pixel combines the input pixels of its window, 16
//! channels at a time in registers.

use super::Geometry;
use crate::arch::{multiversion, Isa};
use crate::elementwise::clamp;
use crate::error::{self, Result};
use crate::pool::ThreadPool;

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

multiversion! {
    /// Combines a pass of window pixels into `out` (initialized on the `first` pass),
    /// 16 channels at a time (then one at a time); the `last` pass scales by `scale`
    /// (averages) and clamps.
    fn pool_pixel<const FMA: bool>(
        out: &mut [f32],
        taps: &[&[f32]],
        max_pool: bool,
        first: bool,
        last: bool,
        scale: f32,
        min: f32,
        max: f32,
    ) {
        let neutral = if max_pool { f32::NEG_INFINITY } else { 0.0 };
        let blocks = out.len() / CB;
        for (b, o) in out.chunks_exact_mut(CB).enumerate() {
            let mut acc = [neutral; CB];
            if !first {
                acc.copy_from_slice(o);
            }
            combine(&mut acc, taps, b * CB, max_pool);
            for (o, &a) in o.iter_mut().zip(&acc) {
                *o = if last { clamp(a * scale, min, max) } else { a };
            }
        }
        let c0 = blocks * CB;
        for (i, o) in out.iter_mut().enumerate().skip(c0) {
            let mut acc = [if first { neutral } else { *o }];
            combine(&mut acc, taps, i, max_pool);
            *o = if last { clamp(acc[0] * scale, min, max) } else { acc[0] };
        }
    }
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
    let [oh, ow] = g.output()?;
    let [ih, iw] = g.input;
    let plane = error::mul(error::mul(ih, iw, "input")?, channels, "input")?;
    error::need("pooling input", x.len(), error::mul(plane, batch, "input")?)?;
    let out_len = error::mul(
        error::mul(error::mul(oh, ow, "output")?, channels, "output")?,
        batch,
        "output",
    )?;
    error::need("pooling output", y.len(), out_len)?;
    let y = y.get_mut(..out_len).unwrap_or_default();
    if out_len == 0 {
        return Ok(());
    }
    let [kh, kw] = g.kernel;
    let row = ow * channels;
    pool.parallel_chunks(y, row, &mut [0f32; 0], 0, |r, out_row, _| {
        let (n, oy) = (r / oh, r % oh);
        let img = x.get(n * plane..(n + 1) * plane).unwrap_or_default();
        for (ox, out) in out_row.chunks_exact_mut(channels).enumerate() {
            let mut taps: [&[f32]; TAPS] = [&[]; TAPS];
            let mut count = 0usize;
            let mut n_taps = 0usize;
            let mut first = true;
            let total = kh * kw;
            // Averages divide by the taps inside the image: count them first.
            if kind == PoolKind::Average {
                count = (0..total)
                    .filter(|&t| g.source(oy, ox, t / kw, t % kw).is_some())
                    .count();
            }
            let scale = if kind == PoolKind::Average {
                1.0 / count.max(1) as f32
            } else {
                1.0
            };
            for t in 0..total {
                if let Some((iy, ix)) = g.source(oy, ox, t / kw, t % kw) {
                    let p = (iy * iw + ix) * channels;
                    if let Some(slot) = taps.get_mut(n_taps) {
                        *slot = img.get(p..p + channels).unwrap_or_default();
                        n_taps += 1;
                    }
                }
                if n_taps == TAPS || t + 1 == total {
                    pool_pixel(
                        isa,
                        out,
                        taps.get(..n_taps).unwrap_or_default(),
                        kind == PoolKind::Max,
                        first,
                        t + 1 == total,
                        scale,
                        min,
                        max,
                    );
                    first = false;
                    n_taps = 0;
                }
            }
        }
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
