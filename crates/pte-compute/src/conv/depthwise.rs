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

pub(crate) struct Layer<'a> {
    pub p: &'a Conv2dParams,
    pub out: [usize; 2],
    pub weights: &'a [f32],
    pub bias: &'a [f32],
    pub activation: Activation,
}

/// Outputs computed at once in registers.
const CH: usize = 16;

/// Length of one phase of a padded input row: enough for every tap's run over the
/// output width rounded up to whole [`CH`] chunks.
fn phase_len(p: &Conv2dParams, ow: usize) -> usize {
    let (sw, dw) = (p.stride[1], p.dilation[1]);
    (p.kernel[1] - 1) * dw / sw + ow.div_ceil(CH) * CH
}

/// Scratch per thread: the input plane with its rows padded and split in phases.
fn per_thread(p: &Conv2dParams, ow: usize) -> usize {
    p.input[0] * p.stride[1] * phase_len(p, ow)
}

pub(crate) fn scratch_len(p: &Conv2dParams, out: [usize; 2], threads: usize) -> Result<usize> {
    let per = crate::error::mul(p.input[0], p.stride[1], "depthwise scratch")
        .and_then(|v| crate::error::mul(v, phase_len(p, out[1]), "depthwise scratch"))?;
    crate::error::mul(per, threads, "depthwise scratch")
}

pub(crate) fn run(
    isa: Isa,
    pool: &ThreadPool,
    l: &Layer<'_>,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) -> Result {
    let p = l.p;
    let ([h, w], [oh, ow]) = (p.input, l.out);
    let (plane_in, plane_out) = (h * w, oh * ow);
    let mult = p.out_channels / p.groups;
    let taps = p.kernel[0] * p.kernel[1];
    if plane_out == 0 {
        return Ok(());
    }
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool.parallel_chunks(
        y,
        plane_out,
        scratch,
        per_thread(p, ow),
        |plane, out, rows| {
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
            plane_fn(isa, p, l.out, src, wt, bias, l.activation, out, rows);
        },
    )?;
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::InvalidParameter {
            what: "depthwise input too short".into(),
        });
    }
    Ok(())
}

/// Copies the input plane `x` (`h × w`) into `rows`: each row zero-padded by `pl` on
/// the left and split in `sw` phases of `len` (phase q holds padded columns q, q + sw,
/// ...), so that every tap reads a contiguous run.
fn pad_plane(x: &[f32], w: usize, pl: usize, sw: usize, len: usize, rows: &mut [f32]) {
    for (src, row) in x.chunks_exact(w).zip(rows.chunks_exact_mut(sw * len)) {
        if sw == 1 {
            let (head, rest) = row.split_at_mut(pl.min(row.len()));
            head.fill(0.0);
            let (body, tail) = rest.split_at_mut(w.min(rest.len()));
            body.copy_from_slice(src.get(..body.len()).unwrap_or_default());
            tail.fill(0.0);
            continue;
        }
        row.fill(0.0);
        if sw == 2 {
            // Input column i is padded column i + pl: pairs (2m, 2m + 1) land in the
            // phases of parities pl and pl + 1.
            let (even, odd) = row.split_at_mut(len);
            let (first, second, f0, s0) = if pl.is_multiple_of(2) {
                (even, odd, pl / 2, pl / 2)
            } else {
                (odd, even, pl / 2, pl / 2 + 1)
            };
            let pairs = src.chunks_exact(2);
            let last = pairs.remainder().first().copied();
            let n = pairs.len();
            let (Some(a), Some(b)) = (first.get_mut(f0..f0 + n), second.get_mut(s0..s0 + n)) else {
                continue;
            };
            for ((a, b), pair) in a.iter_mut().zip(b.iter_mut()).zip(pairs) {
                *a = pair[0];
                *b = pair[1];
            }
            if let (Some(v), Some(o)) = (last, first.get_mut(f0 + n)) {
                *o = v;
            }
        } else {
            for (i, &v) in src.iter().enumerate() {
                let col = i + pl;
                if let Some(o) = row.get_mut(col % sw * len + col / sw) {
                    *o = v;
                }
            }
        }
    }
}

/// Most taps of a kernel whose offsets are precomputed (larger kernels compute them
/// as they go).
pub(crate) const MAX_TAPS: usize = 64;

/// One output row in chunks of `C` outputs kept in registers: each tap adds a run of
/// `C` values of a padded input row. `rows` holds the padded input rows the kernel
/// reaches with their taps; `offs` the start of each kernel column's run.
#[inline(always)]
fn row_chunks<const C: usize, const FMA: bool>(
    out_row: &mut [f32],
    rows: &[(&[f32], &[f32])],
    offs: &[usize],
    bias: f32,
    activation: Activation,
) {
    for (c, dst) in out_row.chunks_mut(C).enumerate() {
        let c0 = c * C;
        let mut acc = [bias; C];
        for &(row, row_taps) in rows {
            for (&t, &off) in row_taps.iter().zip(offs) {
                if let Some(run) = row
                    .get(off + c0..off + c0 + C)
                    .and_then(|r| <&[f32; C]>::try_from(r).ok())
                {
                    for i in 0..C {
                        acc[i] = madd::<FMA>(t, run[i], acc[i]);
                    }
                }
            }
        }
        match <&mut [f32; C]>::try_from(&mut *dst) {
            Ok(d) => *d = acc,
            Err(_) => dst.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a),
        }
    }
    elementwise::bias_act::<FMA>(out_row, 0.0, activation);
}

multiversion! {
    /// One output plane (`oh × ow`) from one input plane (`h × w`), `rows` the
    /// per-thread scratch for the padded plane.
    fn plane_fn<const FMA: bool>(p: &Conv2dParams, out: [usize; 2], x: &[f32], taps: &[f32], bias: f32, activation: Activation, y: &mut [f32], rows: &mut [f32]) {
        let ([h, w], [kh, kw], [_, ow]) = (p.input, p.kernel, out);
        let ([sh, sw], [dh, dw]) = (p.stride, p.dilation);
        let (pt, pl) = (p.padding[0], p.padding[1]);
        let len = phase_len(p, ow);
        let row_len = sw * len;
        pad_plane(x, w, pl, sw, len, rows);
        let rows = &*rows;
        // Padded column kx·dw is element (kx·dw) / sw of phase (kx·dw) % sw.
        let mut offs = [0usize; MAX_TAPS];
        for (kx, o) in offs.iter_mut().enumerate().take(kw) {
            let col = kx * dw;
            *o = col % sw * len + col / sw;
        }
        let offs = offs.get(..kw).unwrap_or_default();
        // The kernel rows inside the input for the current output row, with their taps.
        let mut live: [(&[f32], &[f32]); MAX_TAPS] = [(&[], &[]); MAX_TAPS];
        for (oy, out_row) in y.chunks_exact_mut(ow).enumerate() {
            let mut n = 0;
            for ky in 0..kh {
                let Some(iy) = (oy * sh + ky * dh).checked_sub(pt).filter(|&iy| iy < h) else {
                    continue;
                };
                if let (Some(slot), Some(r), Some(t)) = (
                    live.get_mut(n),
                    rows.get(iy * row_len..(iy + 1) * row_len),
                    taps.get(ky * kw..(ky + 1) * kw),
                ) {
                    *slot = (r, t);
                    n += 1;
                }
            }
            let live = live.get(..n).unwrap_or_default();
            row_chunks::<CH, FMA>(out_row, live, offs, bias, activation);
        }
    }
}
