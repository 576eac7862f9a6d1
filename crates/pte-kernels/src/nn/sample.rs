//! Resampling of (N, C, H, W) inputs of any dim order: `upsample_nearest2d`,
//! `upsample_bilinear2d`, the antialiased `_upsample_bilinear2d_aa`, and
//! `grid_sampler_2d` (bilinear, nearest and bicubic; zeros, border and reflection
//! padding), with PyTorch's coordinate rules (`area_pixel_compute_scale`, half-pixel
//! centers unless `align_corners`, `grid_sampler_compute_source_index`).
//!
//! Interpolations are separable or per output pixel; every weight is computed in `f64`
//! and outputs accumulate in `f64`.

use pte_runtime::{Args, KernelError, KernelResult};

use crate::layout::{by_elem_size, typed, typed_mut, Dense};
use crate::num::Elem;
use crate::util::{numel_of, oob, same_dtype, to_size, Checked, Scratch};

/// The (N, C, H, W) sizes of an input.
fn nchw(sizes: &[usize], op: &str) -> KernelResult<[usize; 4]> {
    match sizes {
        &[n, c, h, w] => Ok([n, c, h, w]),
        s => Err(KernelError::invalid(format!(
            "{op} expects a 4-D input, got {s:?}"
        ))),
    }
}

/// The output sizes of an upsampling: `output_size` (two entries) or the input sizes
/// times `scales` (rounded down), and the scales as given.
pub(crate) fn out_size(
    args: &Args<'_>,
    sizes_at: usize,
    scales_at: usize,
    [h, w]: [usize; 2],
    op: &str,
) -> KernelResult<([usize; 2], [Option<f64>; 2])> {
    let output_size = args.opt_int_list(sizes_at)?;
    let scales = if args.is_none(scales_at)? {
        None
    } else {
        Some(args.double_list(scales_at)?)
    };
    match (output_size.as_deref(), scales) {
        (Some(&[a, b]), None) => Ok((
            [to_size(a, "output size")?, to_size(b, "output size")?],
            [None, None],
        )),
        (None, Some(&[fa, fb])) => {
            let size = |n: usize, f: f64| {
                let v = (n as f64 * f).floor();
                if v.is_finite() && v >= 0.0 && v < usize::MAX as f64 {
                    Ok(v as usize)
                } else {
                    Err(KernelError::invalid(format!(
                        "{op}: scale factor {f} is invalid"
                    )))
                }
            };
            Ok(([size(h, fa)?, size(w, fb)?], [Some(fa), Some(fb)]))
        }
        _ => Err(KernelError::invalid(format!(
            "{op} takes exactly one of two output sizes or two scale factors"
        ))),
    }
}

/// PyTorch's `area_pixel_compute_scale`: input pixels per output pixel.
fn pixel_scale(input: usize, output: usize, align_corners: bool, scale: Option<f64>) -> f64 {
    if align_corners {
        if output > 1 {
            (input as f64 - 1.0) / (output as f64 - 1.0)
        } else {
            0.0
        }
    } else {
        match scale {
            Some(s) if s > 0.0 => 1.0 / s,
            _ => input as f64 / output as f64,
        }
    }
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
        ((o as f32 * s).floor() as usize).min(input.saturating_sub(1))
    }
}

/// Checks the input and output of a resampling and resizes the output: `[n, c, oh, ow]`.
fn prepare(args: &mut Args<'_>, out: usize, sizes: [usize; 4], op: &str) -> KernelResult {
    let [_, _, h, w] = nchw(&args.info(0)?.sizes, op)?;
    let [_, _, oh, ow] = sizes;
    if h == 0 || w == 0 || oh == 0 || ow == 0 {
        return Err(KernelError::invalid(format!(
            "{op}: sizes {h}x{w} -> {oh}x{ow} must be positive"
        )));
    }
    numel_of(&sizes)?;
    args.resize(out, &sizes)?;
    same_dtype(args.info(0)?.dtype, args.info(out)?.dtype)
}

/// `upsample_nearest2d.vec_out(input, output_size?, scale_factors?, out)`.
fn upsample_nearest2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let [n, c, h, w] = nchw(&x.sizes, "upsample_nearest2d")?;
    let ([oh, ow], [sh, sw]) = out_size(args, 1, 2, [h, w], "upsample_nearest2d")?;
    prepare(args, 3, [n, c, oh, ow], "upsample_nearest2d")?;
    let mut io = Dense::io(args, &[0.into()], &[3.into()], &[])?;
    let src = io.bytes(0)?;
    let dst = io.bytes_mut(0)?;
    by_elem_size!(x.dtype.size(), E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        for (p, plane) in dst.chunks_exact_mut(oh * ow).enumerate() {
            let s = src.span(p * h * w, h * w)?;
            for oy in 0..oh {
                let iy = nearest(oy, h, oh, sh);
                // A row reading the same input row as the one before is a copy of it.
                if oy > 0 && nearest(oy - 1, h, oh, sh) == iy {
                    let from = (oy - 1) * ow;
                    plane.span(from, 2 * ow)?;
                    plane.copy_within(from..from + ow, from + ow);
                    continue;
                }
                let sr = s.span(iy * w, w)?;
                let row = plane.get_mut(oy * ow..(oy + 1) * ow).ok_or_else(oob)?;
                if ow == 2 * w {
                    // `nearest` is exactly `ox / 2` then.
                    for (pair, &v) in row.chunks_exact_mut(2).zip(sr) {
                        pair.fill(v);
                    }
                } else {
                    for (ox, o) in row.iter_mut().enumerate() {
                        *o = *sr.at(nearest(ox, w, ow, sw))?;
                    }
                }
            }
        }
        Ok(())
    })?;
    io.finish()
}

/// How an axis of a bilinear resampling weighs its input.
#[derive(Clone, Copy)]
enum Filter {
    /// Plain bilinear: PyTorch's `area_pixel_compute_source_index` (clamped at 0 with
    /// half-pixel centers) and the next pixel.
    Linear { align_corners: bool },
    /// Antialiased: PyTorch's triangle filter, widened by the scale when downsampling,
    /// weights normalized to sum to 1.
    Antialias,
}

/// One axis of a resampling: `output` positions from `input` pixels, `scale` input
/// pixels per output pixel.
#[derive(Clone, Copy)]
struct Axis {
    input: usize,
    output: usize,
    scale: f64,
    filter: Filter,
}

impl Axis {
    /// The first input pixel output `o` reads and how many it reads.
    fn span(&self, o: usize) -> (usize, usize) {
        match self.filter {
            Filter::Linear { align_corners } => {
                let i0 = (self.source(o, align_corners) as usize).min(self.input - 1);
                (i0, if i0 + 1 < self.input { 2 } else { 1 })
            }
            Filter::Antialias => {
                let support = self.scale.max(1.0);
                let center = self.scale * (o as f64 + 0.5);
                let first = ((center - support + 0.5) as i64).max(0) as usize;
                let end = ((center + support + 0.5) as i64).clamp(0, self.input as i64) as usize;
                (first, end.saturating_sub(first))
            }
        }
    }

    fn source(&self, o: usize, align_corners: bool) -> f64 {
        if align_corners {
            self.scale * o as f64
        } else {
            (self.scale * (o as f64 + 0.5) - 0.5).max(0.0)
        }
    }

    /// The weights of output `o`'s pixels ([`Axis::span`]) into `w`.
    fn weights(&self, o: usize, w: &mut [f64]) {
        let (first, _) = self.span(o);
        match self.filter {
            Filter::Linear { align_corners } => {
                let l1 = self.source(o, align_corners) - first as f64;
                match w {
                    [a, b] => {
                        *a = 1.0 - l1;
                        *b = l1;
                    }
                    [a] => *a = 1.0,
                    _ => {}
                }
            }
            Filter::Antialias => {
                let invscale = if self.scale >= 1.0 {
                    1.0 / self.scale
                } else {
                    1.0
                };
                let center = self.scale * (o as f64 + 0.5);
                for (j, v) in w.iter_mut().enumerate() {
                    let x = ((first + j) as f64 - center + 0.5) * invscale;
                    *v = (1.0 - x.abs()).max(0.0);
                }
                let total: f64 = w.iter().sum();
                if total > 0.0 {
                    w.iter_mut().for_each(|v| *v /= total);
                }
            }
        }
    }

    /// Taps over all outputs (the size of the weights table).
    fn taps(&self) -> KernelResult<usize> {
        (0..self.output).try_fold(0usize, |t, o| {
            t.checked_add(self.span(o).1)
                .ok_or_else(|| KernelError::invalid("resampling taps overflow"))
        })
    }

    /// Each output's `[first pixel, count, offset in weights, 0]` into `spans` and the
    /// weights into `weights`.
    fn fill(&self, spans: &mut [[usize; 4]], weights: &mut [f64]) -> KernelResult {
        let mut at = 0;
        for (o, span) in spans.iter_mut().enumerate() {
            let (first, count) = self.span(o);
            self.weights(o, weights.get_mut(at..at + count).ok_or_else(oob)?);
            *span = [first, count, at, 0];
            at += count;
        }
        Ok(())
    }
}

/// Resamples each plane separably: output `(oy, ox)` = Σ input pixels of the two axes'
/// spans, times their weights.
fn separable<T: Elem>(
    src: &[T],
    dst: &mut [T],
    [h, w, oh, ow]: [usize; 4],
    (ys, wy): (&[[usize; 4]], &[f64]),
    (xs, wx): (&[[usize; 4]], &[f64]),
) -> KernelResult {
    for (p, plane) in dst.chunks_exact_mut(oh * ow).enumerate() {
        let s = src.span(p * h * w, h * w)?;
        for (row, &[y0, ny, oy, _]) in plane.chunks_exact_mut(ow).zip(ys) {
            for (o, &[x0, nx, ox, _]) in row.iter_mut().zip(xs) {
                let mut acc = 0.0;
                for (i, a) in wy.span(oy, ny)?.iter().enumerate() {
                    let r = s.span((y0 + i) * w, w)?;
                    for (j, b) in wx.span(ox, nx)?.iter().enumerate() {
                        acc += r.at(x0 + j)?.to_f64() * a * b;
                    }
                }
                *o = T::from_f64(acc);
            }
        }
    }
    Ok(())
}

/// A bilinear resampling of input 0 into output `out` of `sizes` along axes `ay`, `ax`.
fn bilinear(
    args: &mut Args<'_>,
    out: usize,
    sizes: [usize; 4],
    [ay, ax]: [Axis; 2],
    op: &str,
) -> KernelResult {
    let x = args.tensor(0)?;
    prepare(args, out, sizes, op)?;
    let [_, _, oh, ow] = sizes;
    let (ty, tx) = (ay.taps()?, ax.taps()?);
    let pieces = [
        Scratch::piece::<[usize; 4]>(oh),
        Scratch::piece::<[usize; 4]>(ow),
        Scratch::piece::<f64>(ty),
        Scratch::piece::<f64>(tx),
    ];
    let mut io = Dense::io(args, &[0.into()], &[out.into()], &pieces)?;
    let (ys, xs) = (
        io.scratch.take::<[usize; 4]>(oh)?,
        io.scratch.take::<[usize; 4]>(ow)?,
    );
    let (wy, wx) = (io.scratch.take::<f64>(ty)?, io.scratch.take::<f64>(tx)?);
    ay.fill(ys, wy)?;
    ax.fill(xs, wx)?;
    let [h, w] = [ay.input, ax.input];
    crate::dispatch_float!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        separable(src, io.output::<T>(0)?, [h, w, oh, ow], (ys, wy), (xs, wx))?;
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `upsample_bilinear2d.vec_out(input, output_size?, align_corners, scale_factors?, out)`.
fn upsample_bilinear2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let [n, c, h, w] = nchw(&x.sizes, "upsample_bilinear2d")?;
    let align_corners = args.bool(2)?;
    let ([oh, ow], [sh, sw]) = out_size(args, 1, 3, [h, w], "upsample_bilinear2d")?;
    let filter = Filter::Linear { align_corners };
    let axis = |input, output, scale| Axis {
        input,
        output,
        scale: pixel_scale(input, output, align_corners, scale),
        filter,
    };
    let axes = [axis(h, oh, sh), axis(w, ow, sw)];
    bilinear(args, 4, [n, c, oh, ow], axes, "upsample_bilinear2d")
}

/// `_upsample_bilinear2d_aa.out(self, output_size, align_corners, scales_h?, scales_w?,
/// out)`.
fn upsample_bilinear2d_aa(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let [n, c, h, w] = nchw(&x.sizes, "_upsample_bilinear2d_aa")?;
    let size = args.int_list(1)?;
    let &[oh, ow] = size.as_slice() else {
        return Err(KernelError::invalid(format!(
            "_upsample_bilinear2d_aa takes two output sizes, got {size:?}"
        )));
    };
    let (oh, ow) = (to_size(oh, "output size")?, to_size(ow, "output size")?);
    let align_corners = args.bool(2)?;
    let (sh, sw) = (args.opt_double(3)?, args.opt_double(4)?);
    let axis = |input, output, scale| Axis {
        input,
        output,
        scale: pixel_scale(input, output, align_corners, scale),
        filter: Filter::Antialias,
    };
    let axes = [axis(h, oh, sh), axis(w, ow, sw)];
    bilinear(args, 5, [n, c, oh, ow], axes, "_upsample_bilinear2d_aa")
}

/// Grid sampling's padding modes.
#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// PyTorch's `reflect_coordinates`: `x` reflected into `[low/2, high/2]`.
fn reflect(x: f64, twice_low: f64, twice_high: f64) -> f64 {
    if twice_low == twice_high {
        return 0.0;
    }
    let min = twice_low / 2.0;
    let span = (twice_high - twice_low) / 2.0;
    let x = (x - min).abs();
    let extra = x % span;
    if (x / span).floor() as i64 % 2 == 0 {
        extra + min
    } else {
        span - extra + min
    }
}

/// A sampling coordinate moved by the padding mode (`compute_coordinates`).
fn pad_coordinate(x: f64, size: usize, padding: Padding, align_corners: bool) -> f64 {
    let clip = |x: f64| x.max(0.0).min(size as f64 - 1.0);
    match padding {
        Padding::Zeros => x,
        Padding::Border => clip(x),
        Padding::Reflection if align_corners => clip(reflect(x, 0.0, 2.0 * (size as f64 - 1.0))),
        Padding::Reflection => clip(reflect(x, -1.0, 2.0 * size as f64 - 1.0)),
    }
}

/// A normalized grid coordinate (-1..1) in input pixels (`grid_sampler_unnormalize`).
fn unnormalize(g: f64, size: usize, align_corners: bool) -> f64 {
    if align_corners {
        (g + 1.0) / 2.0 * (size as f64 - 1.0)
    } else {
        ((g + 1.0) * size as f64 - 1.0) / 2.0
    }
}

/// The cubic convolution weights of PyTorch's bicubic interpolation (A = -0.75) for a
/// fractional position `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// `grid_sampler_2d.out(input, grid, interpolation_mode, padding_mode, align_corners,
/// out)`: `out[n, c, i, j]` samples plane `(n, c)` at `grid[n, i, j]` (x then y, -1..1).
fn grid_sampler_2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let g = args.info(1)?;
    let [n, c, h, w] = nchw(&x.sizes, "grid_sampler_2d")?;
    let (oh, ow) = match g.sizes.as_slice() {
        &[gn, oh, ow, 2] if gn == n => (oh, ow),
        s => {
            return Err(KernelError::invalid(format!(
                "grid_sampler_2d: the grid must be [{n}, H, W, 2], got {s:?}"
            )))
        }
    };
    let mode = args.int(2)?;
    let padding = match args.int(3)? {
        0 => Padding::Zeros,
        1 => Padding::Border,
        2 => Padding::Reflection,
        p => {
            return Err(KernelError::invalid(format!(
                "grid_sampler_2d: padding mode {p}"
            )))
        }
    };
    if !(0..=2).contains(&mode) {
        return Err(KernelError::invalid(format!(
            "grid_sampler_2d: interpolation mode {mode}"
        )));
    }
    let ac = args.bool(4)?;
    same_dtype(x.dtype, g.dtype)?;
    if h == 0 || w == 0 {
        return Err(KernelError::invalid(
            "grid_sampler_2d: the input planes are empty",
        ));
    }
    let sizes = [n, c, oh, ow];
    numel_of(&sizes)?;
    args.resize(5, &sizes)?;
    same_dtype(x.dtype, args.tensor(5)?.dtype)?;
    let mut io = Dense::io(args, &[0.into(), 1.into()], &[5.into()], &[])?;
    crate::dispatch_float!(x.dtype, T => {
        let (src, grid) = (io.input::<T>(0)?, io.input::<T>(1)?);
        let dst = io.output::<T>(0)?;
        // (An empty grid gives an empty output: no plane.)
        for (p, plane) in dst.chunks_exact_mut((oh * ow).max(1)).enumerate() {
            let (b, s) = (p / c.max(1), src.span(p * h * w, h * w)?);
            let value = |ix: i64, iy: i64| -> f64 {
                if (0..w as i64).contains(&ix) && (0..h as i64).contains(&iy) {
                    s.get(iy as usize * w + ix as usize).map_or(0.0, |v| v.to_f64())
                } else {
                    0.0
                }
            };
            for (k, o) in plane.iter_mut().enumerate() {
                let at = (b * oh * ow + k) * 2;
                let (gx, gy) = (grid.at(at)?.to_f64(), grid.at(at + 1)?.to_f64());
                let (ux, uy) = (unnormalize(gx, w, ac), unnormalize(gy, h, ac));
                let v = match mode {
                    // Bilinear: the four neighbours of the padded coordinate.
                    0 => {
                        let (ix, iy) = (pad_coordinate(ux, w, padding, ac), pad_coordinate(uy, h, padding, ac));
                        let (x0, y0) = (ix.floor(), iy.floor());
                        let (tx, ty) = (ix - x0, iy - y0);
                        let (x0, y0) = (x0 as i64, y0 as i64);
                        value(x0, y0) * (1.0 - tx) * (1.0 - ty)
                            + value(x0 + 1, y0) * tx * (1.0 - ty)
                            + value(x0, y0 + 1) * (1.0 - tx) * ty
                            + value(x0 + 1, y0 + 1) * tx * ty
                    }
                    // Nearest: the padded coordinate rounded half to even.
                    1 => {
                        let (ix, iy) = (pad_coordinate(ux, w, padding, ac), pad_coordinate(uy, h, padding, ac));
                        value(ix.round_ties_even() as i64, iy.round_ties_even() as i64)
                    }
                    // Bicubic: 4x4 taps around the unpadded coordinate, each tap padded.
                    _ => {
                        let (x0, y0) = (ux.floor(), uy.floor());
                        let (wx, wy) = (cubic_weights(ux - x0), cubic_weights(uy - y0));
                        let tap = |dx: f64, dy: f64| {
                            let tx = pad_coordinate(x0 + dx, w, padding, ac);
                            let ty = pad_coordinate(y0 + dy, h, padding, ac);
                            value(tx as i64, ty as i64)
                        };
                        let mut acc = 0.0;
                        for (j, wyj) in wy.iter().enumerate() {
                            let row: f64 = wx
                                .iter()
                                .enumerate()
                                .map(|(i, wxi)| tap(i as f64 - 1.0, j as f64 - 1.0) * wxi)
                                .sum();
                            acc += row * wyj;
                        }
                        acc
                    }
                };
                *o = T::from_f64(v);
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// Registers the resampling kernels.
pub fn register(r: &mut pte_runtime::KernelRegistry) {
    r.register_fn("aten::upsample_nearest2d.vec_out", upsample_nearest2d);
    r.register_fn("aten::upsample_bilinear2d.vec_out", upsample_bilinear2d);
    r.register_fn("aten::_upsample_bilinear2d_aa.out", upsample_bilinear2d_aa);
    r.register_fn("aten::grid_sampler_2d.out", grid_sampler_2d);
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

    #[test]
    fn coordinates_reflect_and_weights_sum_to_one() {
        assert_eq!(reflect(-1.5, -1.0, 7.0), 0.5);
        assert_eq!(reflect(4.5, -1.0, 7.0), 2.5);
        assert_eq!(pad_coordinate(5.0, 4, Padding::Border, false), 3.0);
        let w = cubic_weights(0.3);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let axis = Axis {
            input: 12,
            output: 4,
            scale: 3.0,
            filter: Filter::Antialias,
        };
        let (_, count) = axis.span(1);
        let mut weights = vec![0.0; count];
        axis.weights(1, &mut weights);
        assert!((weights.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
}
