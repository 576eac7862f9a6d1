//! Depthwise convolution in NCHW: each output plane filters one input plane.
//!
//! Per output row, the row starts at the bias; each kernel tap then adds a scaled run of
//! an input row to the run of outputs it reaches (a vectorized multiply-add over the
//! output width). With a horizontal stride the input row is first split into its
//! phases (`x[p], x[p + s], ...`) so that every tap reads a contiguous run. The
//! activation runs on the finished row. Planes are split over the pool's threads.

use super::Conv2dParams;
use crate::arch::{madd, multiversion, Isa};
use crate::elementwise::{self, Activation};
use crate::error::{Error, Result};
use crate::pool::ThreadPool;

/// Input widths up to this split into phases on the stack; wider rows with a stride
/// read strided.
const MAX_PHASED: usize = 4096;

pub(crate) struct Layer<'a> {
    pub p: &'a Conv2dParams,
    pub out: [usize; 2],
    pub weights: &'a [f32],
    pub bias: &'a [f32],
    pub activation: Activation,
}

pub(crate) fn scratch_len(_p: &Conv2dParams, _out: [usize; 2], _threads: usize) -> Result<usize> {
    Ok(0)
}

pub(crate) fn run(
    isa: Isa,
    pool: &ThreadPool,
    l: &Layer<'_>,
    x: &[f32],
    y: &mut [f32],
    _scratch: &mut [f32],
) -> Result {
    let p = l.p;
    let ([h, w], [oh, ow]) = (p.input, l.out);
    let (plane_in, plane_out) = (h * w, oh * ow);
    let planes = y.len() / plane_out.max(1);
    let mult = p.out_channels / p.groups;
    let taps = p.kernel[0] * p.kernel[1];
    if plane_out == 0 {
        return Ok(());
    }
    // Tasks of whole planes, a few per thread for balance.
    let per_task = planes.div_ceil(pool.threads() * 4).max(1);
    let tasks = planes.div_ceil(per_task);
    // Tasks take the next chunk of planes (the pool runs each task once).
    let outs = std::sync::Mutex::new(y.chunks_mut(per_task * plane_out).enumerate());
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool.parallel_for(tasks, |_, _| {
        let Some((t, chunk)) = outs.lock().ok().and_then(|mut it| it.next()) else {
            return;
        };
        for (i, out) in chunk.chunks_exact_mut(plane_out).enumerate() {
            let plane = t * per_task + i;
            let oc = plane % p.out_channels;
            let ic = plane / p.out_channels * p.in_channels + oc / mult;
            let (Some(src), Some(wt)) = (
                x.get(ic * plane_in..(ic + 1) * plane_in),
                l.weights.get(oc * taps..(oc + 1) * taps),
            ) else {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            };
            let bias = l.bias.get(oc).copied().unwrap_or(0.0);
            plane_fn(isa, p, l.out, src, wt, bias, out);
            elementwise::activate(isa, out, l.activation);
        }
    });
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::InvalidParameter {
            what: "depthwise input too short".into(),
        });
    }
    Ok(())
}

multiversion! {
    /// One output plane (`oh × ow`) from one input plane (`h × w`).
    fn plane_fn<const FMA: bool>(p: &Conv2dParams, out: [usize; 2], x: &[f32], taps: &[f32], bias: f32, y: &mut [f32]) {
        let ([h, w], [kh, kw], [_, ow]) = (p.input, p.kernel, out);
        let ([sh, sw], [dh, dw]) = (p.stride, p.dilation);
        let (pt, pl) = (p.padding[0], p.padding[1]);
        // Phase q of a row holds its elements q, q + sw, ... at q * len..
        let len = w.div_ceil(sw);
        let mut phases = [0f32; MAX_PHASED];
        let phased = sw > 1 && len * sw <= MAX_PHASED;
        for (oy, row) in y.chunks_exact_mut(ow).enumerate() {
            row.fill(bias);
            for ky in 0..kh {
                let Some(iy) = (oy * sh + ky * dh).checked_sub(pt).filter(|&iy| iy < h) else {
                    continue;
                };
                let src = x.get(iy * w..(iy + 1) * w).unwrap_or_default();
                if phased {
                    for (q, phase) in phases.chunks_exact_mut(len).take(sw).enumerate() {
                        for (o, &v) in phase.iter_mut().zip(src.iter().skip(q).step_by(sw)) {
                            *o = v;
                        }
                    }
                }
                for kx in 0..kw {
                    let t = taps.get(ky * kw + kx).copied().unwrap_or(0.0);
                    // Output ox reads input column ox·sw + kx·dw - pl: valid for lo..hi.
                    let off = kx * dw;
                    let lo = pl.saturating_sub(off).div_ceil(sw);
                    let hi = (w + pl).saturating_sub(off).div_ceil(sw).min(ow);
                    if lo >= hi {
                        continue;
                    }
                    let start = lo * sw + off - pl;
                    let outs = row.get_mut(lo..hi).unwrap_or_default();
                    if sw == 1 {
                        let run = src.get(start..start + outs.len()).unwrap_or_default();
                        for (o, &v) in outs.iter_mut().zip(run) {
                            *o = madd::<FMA>(t, v, *o);
                        }
                    } else if phased {
                        let at = start % sw * len + start / sw;
                        let run = phases.get(at..at + outs.len()).unwrap_or_default();
                        for (o, &v) in outs.iter_mut().zip(run) {
                            *o = madd::<FMA>(t, v, *o);
                        }
                    } else {
                        for (o, &v) in outs.iter_mut().zip(src.iter().skip(start).step_by(sw)) {
                            *o = madd::<FMA>(t, v, *o);
                        }
                    }
                }
            }
        }
    }
}
