//! Transposed 2-D convolution (f32, NCHW), the gradient of a convolution with respect
//! to its input: per image and group, `columns (c_out/g·kh·kw × h·w) = Wᵀ · x` as one
//! product with Wᵀ packed once, then col2im adds every column entry to the output
//! position it lands on (output planes split over the threads), then the activation.

use crate::arch::multiversion;
use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Epilogue, Gemm, PackedA, Side};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

/// The geometry of a transposed convolution (PyTorch's `ConvTranspose2d`); index 0 of
/// each pair is the height, 1 the width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dParams {
    /// Input channels (all groups).
    pub in_channels: usize,
    /// Output channels (all groups).
    pub out_channels: usize,
    /// Groups.
    pub groups: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Padding removed from each side of the full output.
    pub padding: [usize; 2],
    /// Extra rows and columns at the bottom and right (below the stride or dilation).
    pub output_padding: [usize; 2],
    /// Dilation.
    pub dilation: [usize; 2],
}

impl ConvTranspose2dParams {
    /// Output height and width: `(i - 1)·s - 2p + d·(k - 1) + output_padding + 1`.
    pub fn output(&self) -> Result<[usize; 2]> {
        let g = self;
        let bad = |what: String| Error::InvalidParameter { what };
        if g.groups == 0
            || !g.in_channels.is_multiple_of(g.groups)
            || !g.out_channels.is_multiple_of(g.groups)
            || g.stride.contains(&0)
            || g.dilation.contains(&0)
            || g.kernel.contains(&0)
            || g.input.contains(&0)
            || g.output_padding
                .iter()
                .zip(g.stride.iter().zip(&g.dilation))
                .any(|(&o, (&s, &d))| o >= s.max(d))
        {
            return Err(bad(format!("transposed convolution {g:?}")));
        }
        let axis = |input: usize,
                    kernel: usize,
                    stride: usize,
                    dilation: usize,
                    pad: usize,
                    extra: usize| {
            let full = (input - 1)
                .checked_mul(stride)
                .and_then(|v| v.checked_add((kernel - 1).checked_mul(dilation)?))
                .and_then(|v| v.checked_add(extra + 1))
                .ok_or(Error::SizeOverflow {
                    what: "transposed convolution output",
                })?;
            full.checked_sub(2 * pad)
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("padding {:?} leaves no output", g.padding)))
        };
        let ([h, w], [kh, kw], [sh, sw], [dh, dw]) = (g.input, g.kernel, g.stride, g.dilation);
        let ([ph, pw], [eh, ew]) = (g.padding, g.output_padding);
        let out = [axis(h, kh, sh, dh, ph, eh)?, axis(w, kw, sw, dw, pw, ew)?];
        Ok(out)
    }
}

/// A transposed convolution prepared for repeated runs.
#[derive(Debug)]
pub struct ConvTranspose2d {
    p: ConvTranspose2dParams,
    out: [usize; 2],
    gemm: Gemm,
    /// Wᵀ per group: (c_out/g·kh·kw) × (c_in/g).
    weights: Vec<PackedA>,
    bias: Vec<f32>,
    activation: Activation,
}

impl ConvTranspose2d {
    /// Prepares a layer with `weights` of shape `[in_channels, out_channels / groups,
    /// kh, kw]` (PyTorch's layout), an optional bias per output channel and an
    /// activation.
    pub fn new(
        gemm: Gemm,
        p: ConvTranspose2dParams,
        weights: &[f32],
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Result<Self> {
        let out = p.output()?;
        let (cig, cog) = (p.in_channels / p.groups, p.out_channels / p.groups);
        let rows = error::mul(
            cog,
            error::mul(p.kernel[0], p.kernel[1], "kernel")?,
            "transposed weights",
        )?;
        let needed = error::mul(p.in_channels, rows, "transposed weights")?;
        if weights.len() != needed {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "transposed convolution weights of {} elements, {needed} expected",
                    weights.len()
                ),
            });
        }
        let bias = super::bias_or_zeros(bias, p.out_channels)?;
        let weights = weights
            .chunks_exact(cig * rows)
            .map(|w| gemm.pack_a(MatRef::row_major(w, cig, rows)?.t()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            p,
            out,
            gemm,
            weights,
            bias,
            activation,
        })
    }

    /// Heap bytes held by the prepared weights and bias (for memory budgets).
    pub fn bytes(&self) -> usize {
        self.weights.iter().map(PackedA::bytes).sum::<usize>()
            + self.bias.len() * std::mem::size_of::<f32>()
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// Elements of the input and output of a batch of `batch`.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        let p = &self.p;
        let x = error::mul(p.input[0] * p.input[1], p.in_channels, "input")?;
        let y = error::mul(
            error::mul(self.out[0], self.out[1], "output")?,
            p.out_channels,
            "output",
        )?;
        Ok((
            error::mul(x, batch, "input")?,
            error::mul(y, batch, "output")?,
        ))
    }

    fn columns_len(&self) -> Result<usize> {
        let p = &self.p;
        let rows = p.out_channels / p.groups * p.kernel[0] * p.kernel[1];
        error::mul(
            rows,
            p.input[0] * p.input[1],
            "transposed convolution columns",
        )
    }

    /// Scratch (f32 elements) a run needs on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let p = &self.p;
        let (cig, cog) = (p.in_channels / p.groups, p.out_channels / p.groups);
        let rows = cog * p.kernel[0] * p.kernel[1];
        let gemm =
            self.gemm
                .scratch_len(rows, p.input[0] * p.input[1], cig, true, false, threads)?;
        error::add(self.columns_len()?, gemm, "transposed convolution scratch")
    }

    /// Runs on `batch` images: `input` `[batch, in_channels, h, w]`, `output`
    /// `[batch, out_channels, oh, ow]`.
    pub fn run(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let (x_len, y_len) = self.io_len(batch)?;
        error::need("transposed convolution input", input.len(), x_len)?;
        error::need("transposed convolution output", output.len(), y_len)?;
        let needed = self.scratch_len(pool.threads())?;
        if scratch.len() < needed {
            return Err(Error::ScratchTooSmall {
                len: scratch.len(),
                needed,
            });
        }
        let p = &self.p;
        let (cig, cog) = (p.in_channels / p.groups, p.out_channels / p.groups);
        let (hw, ohw) = (p.input[0] * p.input[1], self.out[0] * self.out[1]);
        let rows = cog * p.kernel[0] * p.kernel[1];
        let (cols, gemm_scratch) = scratch.split_at_mut(self.columns_len()?);
        let isa = self.gemm.isa();
        for (x_b, y_b) in input
            .chunks_exact(p.in_channels * hw)
            .zip(output.chunks_exact_mut(p.out_channels * ohw))
            .take(batch)
        {
            for (g, (x_g, y_g)) in x_b
                .chunks_exact(cig * hw)
                .zip(y_b.chunks_exact_mut(cog * ohw))
                .enumerate()
            {
                let a = self.weights.get(g).ok_or_else(|| Error::InvalidParameter {
                    what: "missing group weights".into(),
                })?;
                let b = MatRef::row_major(x_g, cig, hw)?.t();
                let c = MatMut::row_major(cols, rows, hw)?;
                self.gemm.run_sides(
                    pool,
                    c,
                    Side::<MatRef<'_>>::Packed(a.panels()),
                    Side::Lines(&b),
                    &Epilogue::default(),
                    gemm_scratch,
                )?;
                let cols = &*cols;
                pool.parallel_chunks(y_g, ohw, &mut [0u8; 0], 0, |oc, plane, _| {
                    plane.fill(self.bias.get(g * cog + oc).copied().unwrap_or(0.0));
                    let per = p.kernel[0] * p.kernel[1] * hw;
                    col2im(
                        isa,
                        p,
                        self.out,
                        cols.get(oc * per..(oc + 1) * per).unwrap_or_default(),
                        plane,
                    );
                    elementwise::activate(isa, plane, self.activation);
                })?;
            }
        }
        Ok(())
    }
}

multiversion! {
    /// Adds one output channel's columns (`kh·kw × h·w`) to its plane.
    fn col2im<const FMA: bool>(p: &ConvTranspose2dParams, out: [usize; 2], cols: &[f32], plane: &mut [f32]) {
        let ([h, w], [kh, kw], [oh, ow]) = (p.input, p.kernel, out);
        let ([sh, sw], [dh, dw], [ph, pw]) = (p.stride, p.dilation, p.padding);
        for ky in 0..kh {
            for kx in 0..kw {
                let src = cols.get((ky * kw + kx) * h * w..(ky * kw + kx + 1) * h * w).unwrap_or_default();
                // Input column ix lands on output column ix·sw + kx·dw - pw: valid for lo..hi.
                let off = kx * dw;
                let lo = pw.saturating_sub(off).div_ceil(sw);
                let hi = (ow + pw).saturating_sub(off).div_ceil(sw).min(w);
                for (iy, row) in src.chunks_exact(w).enumerate() {
                    let Some(oy) = (iy * sh + ky * dh).checked_sub(ph).filter(|&o| o < oh) else {
                        continue;
                    };
                    if lo >= hi {
                        continue;
                    }
                    let dst = plane.get_mut(oy * ow..(oy + 1) * ow).unwrap_or_default();
                    let start = lo * sw + off - pw;
                    let run = row.get(lo..hi).unwrap_or_default();
                    if sw == 1 {
                        for (d, &v) in dst.iter_mut().skip(start).zip(run) {
                            *d += v;
                        }
                    } else {
                        for (d, &v) in dst.iter_mut().skip(start).step_by(sw).zip(run) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Isa;
    use crate::gemm::tests::values;

    #[allow(clippy::too_many_arguments)]
    fn params(
        c_in: usize,
        c_out: usize,
        groups: usize,
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        output_padding: [usize; 2],
        dilation: [usize; 2],
    ) -> ConvTranspose2dParams {
        ConvTranspose2dParams {
            in_channels: c_in,
            out_channels: c_out,
            groups,
            input,
            kernel,
            stride,
            padding,
            output_padding,
            dilation,
        }
    }

    #[test]
    fn transposed_convolutions_match_the_reference() {
        let cases = [
            params(4, 6, 1, [5, 6], [3, 3], [2, 2], [1, 1], [1, 0], [1, 1]),
            params(3, 2, 1, [4, 4], [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]),
            params(4, 4, 2, [6, 5], [2, 3], [1, 3], [0, 1], [0, 2], [2, 1]),
            params(2, 3, 1, [1, 9], [1, 5], [1, 2], [0, 2], [0, 1], [1, 1]),
            params(6, 6, 6, [7, 7], [3, 3], [2, 2], [1, 1], [1, 1], [1, 1]),
        ];
        let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
        for isa in Isa::available() {
            let gemm = Gemm::with_isa(isa).unwrap();
            for (n, p) in cases.iter().enumerate() {
                let (cig, cog) = (p.in_channels / p.groups, p.out_channels / p.groups);
                let w = values(p.in_channels * cog * p.kernel[0] * p.kernel[1], n as u32);
                let bias = values(p.out_channels, 50 + n as u32);
                let act = [Activation::Identity, Activation::RELU][n % 2];
                let layer = ConvTranspose2d::new(gemm, *p, &w, Some(&bias), act).unwrap();
                let batch = 1 + n % 2;
                let (xl, yl) = layer.io_len(batch).unwrap();
                let x = values(xl, 90 + n as u32);
                let [oh, ow] = layer.output_size();
                // Reference: scatter every input value through the kernel, in f64.
                let mut want = vec![0.0f64; yl];
                for b in 0..batch {
                    for oc in 0..p.out_channels {
                        for i in 0..oh * ow {
                            want[(b * p.out_channels + oc) * oh * ow + i] = f64::from(bias[oc]);
                        }
                    }
                    for ic in 0..p.in_channels {
                        let g = ic / cig;
                        for iy in 0..p.input[0] {
                            for ix in 0..p.input[1] {
                                let v = f64::from(
                                    x[((b * p.in_channels + ic) * p.input[0] + iy) * p.input[1]
                                        + ix],
                                );
                                for o in 0..cog {
                                    for ky in 0..p.kernel[0] {
                                        for kx in 0..p.kernel[1] {
                                            let oy = (iy * p.stride[0] + ky * p.dilation[0])
                                                as isize
                                                - p.padding[0] as isize;
                                            let ox = (ix * p.stride[1] + kx * p.dilation[1])
                                                as isize
                                                - p.padding[1] as isize;
                                            if oy < 0
                                                || ox < 0
                                                || oy >= oh as isize
                                                || ox >= ow as isize
                                            {
                                                continue;
                                            }
                                            let wv = f64::from(
                                                w[((ic * cog + o) * p.kernel[0] + ky)
                                                    * p.kernel[1]
                                                    + kx],
                                            );
                                            let oc = g * cog + o;
                                            want[(b * p.out_channels + oc) * oh * ow
                                                + oy as usize * ow
                                                + ox as usize] += v * wv;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                for pool in &pools {
                    let mut y = vec![f32::NAN; yl];
                    let mut s = vec![f32::NAN; layer.scratch_len(pool.threads()).unwrap()];
                    layer.run(pool, &x, batch, &mut y, &mut s).unwrap();
                    for (i, (&got, &wv)) in y.iter().zip(&want).enumerate() {
                        let wv = f64::from(act.apply_scalar(wv as f32));
                        assert!(
                            (f64::from(got) - wv).abs() < 1e-4,
                            "{isa:?} case {n} at {i}: {got} vs {wv}"
                        );
                    }
                }
            }
        }
        assert!(
            params(2, 2, 1, [3, 3], [3, 3], [2, 2], [0, 0], [2, 0], [1, 1])
                .output()
                .is_err()
        );
        assert!(
            params(2, 2, 1, [1, 1], [1, 1], [1, 1], [1, 1], [0, 0], [1, 1])
                .output()
                .is_err()
        );
    }
}
