//! 2-D max and average pooling over NCHW planes, and global average pooling.
//!
//! Output sizes follow PyTorch (`ceil_mode` included: a last window must start inside
//! the input or its left padding). Max pooling without indices runs on padded,
//! stride-phase-split rows in chunks of outputs held in registers, as depthwise
//! convolution does (the `window` module; NaN propagates as in PyTorch). With indices, or
//! for averages, each output scans its window. Planes are split over the pool's
//! threads.

use crate::arch::{multiversion, Isa};
use crate::elementwise::Activation;
use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;
use crate::window::{self, Max, Window, MAX_TAPS};

/// The geometry of a pooling window; index 0 of each pair is the height, 1 the width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dParams {
    /// Input height and width.
    pub input: [usize; 2],
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Padding on each side (at most half the window, as PyTorch requires).
    pub padding: [usize; 2],
    /// Dilation (max pooling only; 1 for averages).
    pub dilation: [usize; 2],
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
}

/// How an average is divided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgOptions {
    /// Count padded positions in the divisor (PyTorch's default).
    pub count_include_pad: bool,
    /// Divide by this instead (PyTorch's `divisor_override`).
    pub divisor_override: Option<usize>,
}

impl Pool2dParams {
    /// The same windows for [`crate::nhwc::pool2d`]: PyTorch's output size, a
    /// `ceil_mode` extra row or column as padding at the bottom or right (no max
    /// reads it: every window starts inside the input or its top/left padding).
    pub fn nhwc_geometry(&self) -> Result<crate::nhwc::Geometry> {
        let out = self.output()?;
        // Padded extent the output's last window reaches, beyond the input and its
        // leading padding (never less than the trailing padding PyTorch adds).
        let extra = |out: usize, s: usize, k: usize, d: usize, i: usize, p: usize| {
            (out - 1)
                .checked_mul(s)
                .and_then(|v| v.checked_add((k - 1).checked_mul(d)?))
                .and_then(|v| v.checked_add(1))
                .map(|reach| reach.saturating_sub(i + p).max(p))
                .ok_or(Error::SizeOverflow {
                    what: "pooling window",
                })
        };
        let (s, k, d, i, p) = (
            self.stride,
            self.kernel,
            self.dilation,
            self.input,
            self.padding,
        );
        let bottom = extra(out[0], s[0], k[0], d[0], i[0], p[0])?;
        let right = extra(out[1], s[1], k[1], d[1], i[1], p[1])?;
        let [ph, pw] = self.padding;
        Ok(crate::nhwc::Geometry {
            input: self.input,
            kernel: self.kernel,
            stride: self.stride,
            dilation: self.dilation,
            padding: [ph, right, bottom, pw],
        })
    }

    /// Output height and width, PyTorch's `pooling_output_shape`.
    pub fn output(&self) -> Result<[usize; 2]> {
        let axis = |i: usize, k: usize, s: usize, p: usize, d: usize| {
            if k == 0 || s == 0 || d == 0 || p > k / 2 {
                return Err(Error::InvalidParameter {
                    what: format!("pooling window {k}, stride {s}, dilation {d}, padding {p} (at most half the window)"),
                });
            }
            let (i, k, s, p, d) = (i as i128, k as i128, s as i128, p as i128, d as i128);
            let span = i + 2 * p - d * (k - 1) - 1 + if self.ceil_mode { s - 1 } else { 0 };
            let mut n = span.div_euclid(s) + 1;
            if self.ceil_mode && (n - 1) * s >= i + p {
                n -= 1;
            }
            usize::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::InvalidParameter {
                    what: format!("pooling leaves no output of an input of {i}"),
                })
        };
        let ([h, w], [kh, kw], [sh, sw], [ph, pw], [dh, dw]) = (
            self.input,
            self.kernel,
            self.stride,
            self.padding,
            self.dilation,
        );
        let out = [axis(h, kh, sh, ph, dh)?, axis(w, kw, sw, pw, dw)?];
        Ok(out)
    }

    fn window(&self, out: [usize; 2]) -> Window {
        Window::new(
            self.input,
            self.kernel,
            self.stride,
            self.dilation,
            self.padding,
            out,
        )
    }

    /// Scratch (f32 elements) [`max_pool2d`] needs on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let per = self
            .window(self.output()?)
            .scratch()
            .ok_or(Error::SizeOverflow {
                what: "pooling scratch",
            })?;
        error::mul(per, threads, "pooling scratch")
    }

    /// The input range a window of output `o` covers on `axis` (clipped to the input),
    /// its first tap (possibly in the padding) and the window end clipped to the
    /// padded input (for PyTorch's average divisor).
    fn span(&self, axis: usize, o: usize) -> (isize, usize, usize, isize) {
        let pick = |v: [usize; 2]| if axis == 0 { v[0] } else { v[1] };
        let (input, kernel, stride, pad, dilation) = (
            pick(self.input),
            pick(self.kernel),
            pick(self.stride),
            pick(self.padding),
            pick(self.dilation),
        );
        let start = (o * stride) as isize - pad as isize;
        let extent = ((kernel - 1) * dilation + 1) as isize;
        let end = (start + extent).min(input as isize);
        let padded_end = (start + extent).min((input + pad) as isize);
        (
            start,
            start.max(0) as usize,
            end.max(0) as usize,
            padded_end,
        )
    }
}

fn planes_of(p: &Pool2dParams, out: [usize; 2], x: &[f32], y: &[f32]) -> Result<usize> {
    let (pi, po) = (
        error::mul(p.input[0], p.input[1], "pooling input")?,
        out[0] * out[1],
    );
    let planes = x.len().checked_div(pi).unwrap_or(0);
    if x.len() != planes * pi || y.len() != error::mul(planes, po, "pooling output")? {
        return Err(Error::ShapeMismatch {
            what: format!(
                "pooling {} input values of {:?} planes into {} outputs of {out:?}",
                x.len(),
                p.input,
                y.len()
            ),
        });
    }
    Ok(planes)
}

/// Max pooling of every `h × w` plane of `x` into `y` (`oh × ow` planes); with
/// `indices`, also the flat index (within its plane) of each maximum, as PyTorch's
/// `max_pool2d_with_indices`. `scratch` holds at least [`Pool2dParams::scratch_len`]
/// elements.
pub fn max_pool2d(
    isa: Isa,
    pool: &ThreadPool,
    p: &Pool2dParams,
    x: &[f32],
    y: &mut [f32],
    indices: Option<&mut [i64]>,
    scratch: &mut [f32],
) -> Result {
    let out = p.output()?;
    planes_of(p, out, x, y)?;
    let ([h, w], [oh, ow]) = (p.input, out);
    let (pi, po) = (h * w, oh * ow);
    let y_len = y.len();
    match indices {
        Some(idx) => {
            error::need("pooling indices", idx.len(), y.len())?;
            // Values and indices of a plane together; tasks take the next plane.
            let queue = std::sync::Mutex::new(y.chunks_mut(po).zip(idx.chunks_mut(po)).enumerate());
            pool.parallel_for(y_planes(y_len, po), |_, _| {
                let Some((plane, (vals, at))) = queue.lock().ok().and_then(|mut q| q.next()) else {
                    return;
                };
                let src = x.get(plane * pi..(plane + 1) * pi).unwrap_or_default();
                for (o, (v, i)) in vals.iter_mut().zip(at.iter_mut()).enumerate() {
                    let (best, arg) = window_max(p, src, o / ow, o % ow);
                    *v = best;
                    *i = arg as i64;
                }
            });
            Ok(())
        }
        None if p.window(out).supported() => {
            let g = p.window(out);
            let per_thread = g.scratch().ok_or(Error::SizeOverflow {
                what: "pooling scratch",
            })?;
            pool.parallel_chunks(y, po, scratch, per_thread, |plane, outs, rows| {
                let src = x.get(plane * pi..(plane + 1) * pi).unwrap_or_default();
                max_plane(isa, &g, src, outs, rows);
            })
        }
        None => pool.parallel_chunks(y, po, &mut [0u8; 0], 0, |plane, outs, _| {
            let src = x.get(plane * pi..(plane + 1) * pi).unwrap_or_default();
            for (o, v) in outs.iter_mut().enumerate() {
                *v = window_max(p, src, o / ow, o % ow).0;
            }
        }),
    }
}

fn y_planes(len: usize, plane: usize) -> usize {
    len.checked_div(plane).unwrap_or(0)
}

/// The maximum of a window and its flat index (as PyTorch: the first maximum wins ties,
/// a NaN wins over anything, the last NaN over earlier ones).
fn window_max(p: &Pool2dParams, src: &[f32], oy: usize, ox: usize) -> (f32, usize) {
    let w = p.input[1];
    let (sy, _, _, _) = p.span(0, oy);
    let (sx, _, _, _) = p.span(1, ox);
    let (mut best, mut at) = (f32::NEG_INFINITY, 0);
    let mut first = true;
    for ky in 0..p.kernel[0] {
        let iy = sy + (ky * p.dilation[0]) as isize;
        if iy < 0 || iy >= p.input[0] as isize {
            continue;
        }
        for kx in 0..p.kernel[1] {
            let ix = sx + (kx * p.dilation[1]) as isize;
            if ix < 0 || ix >= w as isize {
                continue;
            }
            let i = iy as usize * w + ix as usize;
            let v = src.get(i).copied().unwrap_or(f32::NAN);
            if first || v > best || v.is_nan() {
                best = v;
                at = i;
                first = false;
            }
        }
    }
    (best, at)
}

multiversion! {
    /// One max-pooled plane (see [`crate::window`]).
    fn max_plane<const FMA: bool>(g: &Window, src: &[f32], y: &mut [f32], rows: &mut [f32]) {
        window::plane::<Max, FMA>(g, src, &ONES, f32::NEG_INFINITY, Activation::Identity, y, rows);
    }
}

/// Unused weights of the max-pooling window (the reduction ignores them).
const ONES: [f32; MAX_TAPS] = [1.0; MAX_TAPS];

/// Average pooling of every `h × w` plane of `x` into `y` (dilation must be 1).
pub fn avg_pool2d(
    pool: &ThreadPool,
    p: &Pool2dParams,
    opts: AvgOptions,
    x: &[f32],
    y: &mut [f32],
) -> Result {
    if p.dilation != [1, 1] || opts.divisor_override == Some(0) {
        return Err(Error::InvalidParameter {
            what: format!(
                "average pooling with dilation {:?} and divisor {:?}",
                p.dilation, opts.divisor_override
            ),
        });
    }
    let out = p.output()?;
    planes_of(p, out, x, y)?;
    let ([h, w], [_, ow]) = (p.input, out);
    pool.parallel_chunks(y, out[0] * ow, &mut [0u8; 0], 0, |plane, outs, _| {
        let src = x
            .get(plane * h * w..(plane + 1) * h * w)
            .unwrap_or_default();
        for (o, v) in outs.iter_mut().enumerate() {
            let (sy, y0, y1, py) = p.span(0, o / ow);
            let (sx, x0, x1, px) = p.span(1, o % ow);
            let mut sum = 0.0f32;
            for iy in y0..y1 {
                sum += src
                    .get(iy * w + x0..iy * w + x1.max(x0))
                    .unwrap_or_default()
                    .iter()
                    .sum::<f32>();
            }
            let count = match opts.divisor_override {
                Some(d) => d,
                None if opts.count_include_pad => ((py - sy) * (px - sx)) as usize,
                None => (y1.saturating_sub(y0)) * (x1.saturating_sub(x0)),
            };
            *v = if count == 0 {
                f32::NAN
            } else {
                sum / count as f32
            };
        }
    })
}

multiversion! {
    fn plane_mean<const FMA: bool>(x: &[f32]) -> f32 {
        let mut lanes = [0f32; 16];
        let chunks = x.chunks_exact(16);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += v;
            }
        }
        (lanes.iter().sum::<f32>() + tail) / x.len() as f32
    }
}

/// Mean of each plane of `plane_len` values of `x` into `y` (one value per plane).
pub fn global_avg_pool(isa: Isa, x: &[f32], plane_len: usize, y: &mut [f32]) -> Result {
    if plane_len == 0 || x.len() != error::mul(y.len(), plane_len, "global pooling input")? {
        return Err(Error::ShapeMismatch {
            what: format!("{} values as {} planes of {plane_len}", x.len(), y.len()),
        });
    }
    for (o, plane) in y.iter_mut().zip(x.chunks_exact(plane_len)) {
        *o = plane_mean(isa, plane);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index arithmetic mirrors the definition
mod tests {
    use super::*;
    use crate::gemm::tests::values;

    fn params(
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Pool2dParams {
        Pool2dParams {
            input,
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
        }
    }

    fn cases() -> Vec<Pool2dParams> {
        vec![
            params([112, 112], [3, 3], [2, 2], [1, 1], [1, 1], false),
            params([7, 9], [2, 2], [2, 2], [0, 0], [1, 1], true),
            params([10, 11], [3, 2], [1, 3], [1, 1], [1, 1], false),
            params([9, 9], [3, 3], [2, 2], [1, 0], [2, 1], true),
            params([5, 6], [5, 6], [1, 1], [2, 3], [1, 1], false),
            params([8, 13], [4, 4], [3, 3], [2, 2], [1, 1], true),
            // a window too large for the row-chunk path
            params([20, 20], [9, 9], [1, 1], [4, 4], [1, 1], false),
        ]
    }

    #[test]
    fn output_sizes_follow_pytorch() {
        assert_eq!(cases()[0].output().unwrap(), [56, 56]);
        assert_eq!(cases()[1].output().unwrap(), [4, 5]);
        // ceil mode drops a window starting in the right padding
        assert_eq!(
            params([6, 6], [2, 2], [2, 2], [1, 1], [1, 1], true)
                .output()
                .unwrap(),
            [4, 4]
        );
        assert!(params([6, 6], [2, 2], [2, 2], [2, 2], [1, 1], false)
            .output()
            .is_err());
        assert!(params([1, 1], [3, 3], [1, 1], [0, 0], [1, 1], false)
            .output()
            .is_err());
    }

    #[test]
    fn pools_match_a_reference() {
        let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
        for (n, p) in cases().iter().enumerate() {
            let out = p.output().unwrap();
            let planes = 3;
            let mut x = values(planes * p.input[0] * p.input[1], n as u32);
            x[5] = f32::NAN;
            let len = planes * out[0] * out[1];
            for isa in Isa::available() {
                for pool in &pools {
                    let mut y = vec![0.0; len];
                    let mut yi = vec![0.0; len];
                    let mut idx = vec![0i64; len];
                    let mut s = vec![f32::NAN; p.scratch_len(pool.threads()).unwrap()];
                    max_pool2d(isa, pool, p, &x, &mut y, None, &mut s).unwrap();
                    max_pool2d(isa, pool, p, &x, &mut yi, Some(&mut idx), &mut s).unwrap();
                    for o in 0..len {
                        let plane = o / (out[0] * out[1]);
                        let r = o % (out[0] * out[1]);
                        let (want, at) = window_max(
                            p,
                            &x[plane * p.input[0] * p.input[1]..],
                            r / out[1],
                            r % out[1],
                        );
                        assert_eq!(y[o].to_bits(), want.to_bits(), "case {n} at {o}");
                        assert_eq!(yi[o].to_bits(), want.to_bits());
                        assert_eq!(idx[o], at as i64);
                        assert!(want.is_nan() || x[plane * p.input[0] * p.input[1] + at] == want);
                    }
                    if p.dilation == [1, 1] {
                        for include in [false, true] {
                            let opts = AvgOptions {
                                count_include_pad: include,
                                divisor_override: None,
                            };
                            avg_pool2d(pool, p, opts, &x, &mut y).unwrap();
                            for o in 0..len {
                                let plane = o / (out[0] * out[1]);
                                let (oy, ox) = (o % (out[0] * out[1]) / out[1], o % out[1]);
                                let (mut s, mut c) = (0.0f64, 0usize);
                                for ky in 0..p.kernel[0] {
                                    for kx in 0..p.kernel[1] {
                                        let iy = (oy * p.stride[0] + ky) as isize
                                            - p.padding[0] as isize;
                                        let ix = (ox * p.stride[1] + kx) as isize
                                            - p.padding[1] as isize;
                                        let in_pad = iy < (p.input[0] + p.padding[0]) as isize
                                            && ix < (p.input[1] + p.padding[1]) as isize;
                                        if iy >= 0
                                            && ix >= 0
                                            && iy < p.input[0] as isize
                                            && ix < p.input[1] as isize
                                        {
                                            s += f64::from(
                                                x[(plane * p.input[0] + iy as usize) * p.input[1]
                                                    + ix as usize],
                                            );
                                            c += 1;
                                        } else if include && in_pad {
                                            c += 1;
                                        }
                                    }
                                }
                                let want = s / c as f64;
                                assert!(
                                    want.is_nan() && y[o].is_nan()
                                        || (f64::from(y[o]) - want).abs() < 1e-5,
                                    "case {n} avg at {o}: {} vs {want}",
                                    y[o]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn global_average() {
        let x = values(3 * 49, 1);
        let mut y = [0.0; 3];
        global_avg_pool(Isa::best(), &x, 49, &mut y).unwrap();
        for (c, &v) in y.iter().enumerate() {
            let want: f64 = x[c * 49..(c + 1) * 49]
                .iter()
                .map(|&v| f64::from(v))
                .sum::<f64>()
                / 49.0;
            assert!((f64::from(v) - want).abs() < 1e-6);
        }
        assert!(global_avg_pool(Isa::best(), &x, 50, &mut y).is_err());
    }

    #[test]
    fn nhwc_pooling_matches_nchw() {
        use crate::nhwc::{global_avg_pool as global_nhwc, pool2d, PoolKind};
        let pool = ThreadPool::new(2).unwrap();
        for isa in Isa::available() {
            for (n, p) in cases().into_iter().enumerate() {
                let (batch, c) = (2, [3, 70][n % 2]);
                let [oh, ow] = p.output().unwrap();
                let (hw, ohw) = (p.input[0] * p.input[1], oh * ow);
                let mut x = values(batch * c * hw, n as u32);
                x[5] = f32::NAN;
                let mut want = vec![0.0; batch * c * ohw];
                let mut scratch = vec![0.0; p.scratch_len(2).unwrap()];
                max_pool2d(isa, &pool, &p, &x, &mut want, None, &mut scratch).unwrap();
                let mut xn = vec![0.0; x.len()];
                crate::layout::transpose(&pool, &x, batch, c, hw, &mut xn).unwrap();
                let mut yn = vec![0.0; want.len()];
                let g = p.nhwc_geometry().unwrap();
                assert_eq!(g.output().unwrap(), [oh, ow], "case {n}");
                let (lo, hi) = (f32::NEG_INFINITY, f32::INFINITY);
                pool2d(
                    isa,
                    &pool,
                    PoolKind::Max,
                    &g,
                    c,
                    batch,
                    &xn,
                    &mut yn,
                    lo,
                    hi,
                )
                .unwrap();
                let mut got = vec![0.0; want.len()];
                crate::layout::transpose(&pool, &yn, batch, ohw, c, &mut got).unwrap();
                for (o, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a == b || (a.is_nan() && b.is_nan()),
                        "case {n} at {o}: {a} vs {b}"
                    );
                }
                let mut g = vec![0.0; batch * c];
                global_nhwc(isa, batch, hw, c, &xn, &mut g, lo, hi).unwrap();
                let mut w = vec![0.0; batch * c];
                global_avg_pool(isa, &x, hw, &mut w).unwrap();
                for (a, b) in g.iter().zip(&w) {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()));
                }
            }
        }
    }
}
