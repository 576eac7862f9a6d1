//! Bilinear resampling of f32 images (PyTorch's `upsample_bilinear2d`), NCHW or NHWC,
//! the two source positions and weights of every output row and column computed once.
//!
//! Positions follow PyTorch's CPU kernel in f32 (`area_pixel_compute_scale`, half-pixel
//! centres unless `align_corners`, negative positions clamped to 0, the second
//! position clamped to the last pixel), and each output is
//! `(x₀₀·wx₀ + x₀₁·wx₁)·wy₀ + (x₁₀·wx₀ + x₁₁·wx₁)·wy₁` as there.
//!
//! NCHW: each needed input row is interpolated along the width once into a scratch row
//! (an upsampling reads every input row for several output rows), then two such rows
//! are blended per output row. NHWC: each output pixel blends four input pixels, all
//! channels at once, with the same products in the same order (the results are equal
//! bit for bit).

use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;

/// The two source positions of one output row or column and their weights.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pair {
    at: [usize; 2],
    w: [f32; 2],
}

/// A plane and one of its rows.
type PlaneRow = (usize, usize);

/// One axis: its source positions per output position.
fn axis(input: usize, output: usize, align_corners: bool, scale: Option<f64>) -> Result<Vec<Pair>> {
    let ratio: f32 = if align_corners {
        if output > 1 {
            (input as f32 - 1.0) / (output as f32 - 1.0)
        } else {
            0.0
        }
    } else {
        match scale {
            Some(s) if s > 0.0 => (1.0 / s) as f32,
            _ => input as f32 / output as f32,
        }
    };
    let mut pairs = Vec::new();
    pairs
        .try_reserve_exact(output)
        .map_err(|_| Error::OutOfMemory {
            what: "resampling positions",
            len: output,
        })?;
    let last = input.saturating_sub(1);
    pairs.extend((0..output).map(|o| {
        let src = if align_corners {
            ratio * o as f32
        } else {
            (ratio * (o as f32 + 0.5) - 0.5).max(0.0)
        };
        // `as` saturates: a huge or NaN position lands on the last pixel or 0.
        let first = (src as usize).min(last);
        let w1 = (src - first as f32).clamp(0.0, 1.0);
        Pair {
            at: [first, (first + 1).min(last)],
            w: [1.0 - w1, w1],
        }
    }));
    Ok(pairs)
}

/// A bilinear resampling from one image size to another, prepared once.
#[derive(Clone, Debug)]
pub struct Bilinear {
    input: [usize; 2],
    rows: Vec<Pair>,
    cols: Vec<Pair>,
}

impl Bilinear {
    /// From `input` to `output` (height, width); `scales` are the factors a caller
    /// gave instead of sizes, which PyTorch uses for the positions when they are
    /// positive (unless `align_corners`).
    pub fn new(
        input: [usize; 2],
        output: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Self> {
        if input.contains(&0) || output.contains(&0) {
            return Err(Error::InvalidParameter {
                what: format!("bilinear resampling from {input:?} to {output:?}"),
            });
        }
        let ([h, w], [oh, ow], [sh, sw]) = (input, output, scales);
        Ok(Bilinear {
            input,
            rows: axis(h, oh, align_corners, sh)?,
            cols: axis(w, ow, align_corners, sw)?,
        })
    }

    /// Output height and width.
    pub fn output(&self) -> [usize; 2] {
        [self.rows.len(), self.cols.len()]
    }

    /// Scratch [`Self::run_nchw`] needs on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        error::mul(2 * self.cols.len(), threads.max(1), "resampling scratch")
    }

    /// Checks that `x` and `y` hold `images` planes (or images of one channel each).
    fn check(&self, x: &[f32], y: &[f32], images: usize) -> Result {
        let [h, w] = self.input;
        let [oh, ow] = self.output();
        let pixels = |a: usize, b: usize| error::mul(error::mul(a, b, "image")?, images, "images");
        error::need("resampling input", x.len(), pixels(h, w)?)?;
        error::need("resampling output", y.len(), pixels(oh, ow)?)
    }

    /// Resamples `planes` planes of `x` (NCHW: `batch · channels` planes) into `y`.
    pub fn run_nchw(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        planes: usize,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        self.check(x, y, planes)?;
        let ([h, w], [oh, ow]) = (self.input, self.output());
        let y = y.get_mut(..planes * oh * ow).unwrap_or_default();
        let per_task = (planes * oh).div_ceil(pool.threads() * 4).max(1);
        pool.parallel_groups(y, ow, per_task, scratch, 2 * ow, |first, rows, part| {
            // Two input rows widened to the output's width, each tagged with its
            // (plane, row), kept while the next output rows read them too.
            let (e0, e1) = part.split_at_mut(ow);
            let mut slots: [(Option<PlaneRow>, &mut [f32]); 2] = [(None, e0), (None, e1)];
            for (i, out) in rows.chunks_mut(ow).enumerate() {
                let (plane, oy) = ((first + i) / oh, (first + i) % oh);
                let Some(r) = self.rows.get(oy) else { continue };
                let src = x
                    .get(plane * h * w..(plane + 1) * h * w)
                    .unwrap_or_default();
                let [ya, yb] = r.at.map(|iy| (plane, iy));
                let [s0, s1] = &mut slots;
                for (want, other) in [(ya, yb), (yb, ya)] {
                    if s0.0 != Some(want) && s1.0 != Some(want) {
                        let slot = if s0.0 == Some(other) {
                            &mut *s1
                        } else {
                            &mut *s0
                        };
                        let row = src.get(want.1 * w..(want.1 + 1) * w).unwrap_or_default();
                        widen(row, &self.cols, slot.1);
                        slot.0 = Some(want);
                    }
                }
                let (a, b) = if s0.0 == Some(ya) {
                    (&s0.1, &s1.1)
                } else {
                    (&s1.1, &s0.1)
                };
                let b = if ya == yb { a } else { b };
                let [wy0, wy1] = r.w;
                for ((o, &a), &b) in out.iter_mut().zip(a.iter()).zip(b.iter()) {
                    *o = a * wy0 + b * wy1;
                }
            }
        })
    }

    /// Resamples `images` NHWC images of `channels` channels from `x` into `y`, output
    /// rows split over the threads.
    pub fn run_nhwc(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        images: usize,
        channels: usize,
        y: &mut [f32],
    ) -> Result {
        self.check(x, y, error::mul(images, channels, "images")?)?;
        let ([h, w], [oh, ow]) = (self.input, self.output());
        let c = channels;
        if c == 0 {
            return Ok(());
        }
        let row_len = ow * c;
        let y = y.get_mut(..images * oh * row_len).unwrap_or_default();
        pool.parallel_chunks(y, row_len, &mut [0u8; 0], 0, |i, out, _| {
            let (image, oy) = (i / oh, i % oh);
            let Some(r) = self.rows.get(oy) else { return };
            let src = x
                .get(image * h * w * c..(image + 1) * h * w * c)
                .unwrap_or_default();
            let pixel = |iy: usize, ix: usize| {
                let at = (iy * w + ix) * c;
                src.get(at..at + c).unwrap_or_default()
            };
            let ([y0, y1], [wy0, wy1]) = (r.at, r.w);
            for (o, col) in out.chunks_exact_mut(c).zip(&self.cols) {
                let ([x0, x1], [wx0, wx1]) = (col.at, col.w);
                let (a, b) = (pixel(y0, x0).iter().zip(pixel(y0, x1)), pixel(y1, x0));
                for (((o, (&p00, &p01)), &p10), &p11) in
                    o.iter_mut().zip(a).zip(b).zip(pixel(y1, x1))
                {
                    *o = (p00 * wx0 + p01 * wx1) * wy0 + (p10 * wx0 + p11 * wx1) * wy1;
                }
            }
        })
    }
}

/// `e[ox] = row[x₀]·wx₀ + row[x₁]·wx₁` for every output column.
fn widen(row: &[f32], cols: &[Pair], e: &mut [f32]) {
    let v = |i: usize| row.get(i).copied().unwrap_or(0.0);
    for (e, c) in e.iter_mut().zip(cols) {
        let ([x0, x1], [w0, w1]) = (c.at, c.w);
        *e = v(x0) * w0 + v(x1) * w1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nhwc_equals_nchw_bit_for_bit() {
        let pool = ThreadPool::new(2).unwrap();
        // (input, output, align_corners, scales, images, channels)
        type Case = ([usize; 2], [usize; 2], bool, [Option<f64>; 2], usize, usize);
        let cases: &[Case] = &[
            ([1, 1], [14, 14], false, [None, None], 1, 24),
            ([14, 14], [28, 28], false, [None, None], 2, 19),
            ([7, 9], [13, 4], true, [None, None], 1, 5),
            ([5, 6], [12, 9], false, [Some(2.5), Some(1.5)], 3, 8),
            ([6, 1], [2, 3], true, [None, None], 1, 1),
        ];
        for &(input, output, align, scales, images, c) in cases {
            let b = Bilinear::new(input, output, align, scales).unwrap();
            let [h, w] = input;
            let [oh, ow] = b.output();
            let nchw: Vec<f32> = (0..images * c * h * w)
                .map(|i| ((i * 7919) % 101) as f32 / 13.0 - 3.0)
                .collect();
            let mut want = vec![0.0; images * c * oh * ow];
            let mut scratch = vec![0.0; b.scratch_len(2).unwrap()];
            b.run_nchw(&pool, &nchw, images * c, &mut want, &mut scratch)
                .unwrap();
            let mut nhwc = vec![0.0; nchw.len()];
            crate::layout::transpose(&pool, &nchw, images, c, h * w, &mut nhwc).unwrap();
            let mut got = vec![f32::NAN; want.len()];
            b.run_nhwc(&pool, &nhwc, images, c, &mut got).unwrap();
            let mut back = vec![0.0; got.len()];
            crate::layout::transpose(&pool, &got, images, oh * ow, c, &mut back).unwrap();
            let same = back
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{input:?} -> {output:?} align {align} scales {scales:?}"
            );
        }
    }
}
