//! NHWC transposed 2-D convolution: for a block of input pixels, one product gives
//! every (tap, output channel) contribution of each pixel; the contributions are then
//! added into the output pixels they reach (col2im), which start at the bias.

use crate::elementwise::clamp;
use crate::error::{self, Error, Result};
use crate::gemm::{Bias, Epilogue, Gemm, Lhs, PackedB, Rhs};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

/// Input pixels per product (bounds the column buffer).
const BLOCK: usize = 256;

/// A transposed convolution prepared for repeated runs.
#[derive(Debug)]
pub struct DeconvNhwc {
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    /// Top, right, bottom, left: cropped from the full output.
    padding: [usize; 4],
    out: [usize; 2],
    groups: usize,
    cig: usize,
    cog: usize,
    gemm: Gemm,
    /// Per group: `[cig, taps·cog]`.
    weights: Vec<PackedB>,
    bias: Vec<f32>,
    min: f32,
    max: f32,
}

impl DeconvNhwc {
    /// Weights are `[groups·cog, kh, kw, cig]`; the output is `stride·(in - 1) +
    /// adjustment + dilated kernel - padding` per axis.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gemm: Gemm,
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        padding: [usize; 4],
        adjustment: [usize; 2],
        groups: usize,
        cig: usize,
        cog: usize,
        weights: &[f32],
        bias: Option<&[f32]>,
        min: f32,
        max: f32,
    ) -> Result<Self> {
        let bad = |what: String| Error::InvalidParameter { what };
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) || groups == 0 {
            return Err(bad(format!(
                "kernel {kernel:?}, stride {stride:?}, dilation {dilation:?}, {groups} groups"
            )));
        }
        let axis =
            |input: usize, stride: usize, adj: usize, kernel: usize, dil: usize, pads: usize| {
                let full = input
                    .saturating_sub(1)
                    .checked_mul(stride)
                    .and_then(|v| v.checked_add(adj))
                    .and_then(|v| v.checked_add((kernel - 1).checked_mul(dil)? + 1))
                    .ok_or(Error::SizeOverflow {
                        what: "deconvolution output",
                    })?;
                full.checked_sub(pads)
                    .ok_or_else(|| bad(format!("padding {padding:?} exceeds the output")))
            };
        let [pt, pr, pb, pl] = padding;
        let out = [
            axis(
                input[0],
                stride[0],
                adjustment[0],
                kernel[0],
                dilation[0],
                pt + pb,
            )?,
            axis(
                input[1],
                stride[1],
                adjustment[1],
                kernel[1],
                dilation[1],
                pl + pr,
            )?,
        ];
        let taps = error::mul(kernel[0], kernel[1], "kernel")?;
        let cout = error::mul(groups, cog, "output channels")?;
        let per_group = error::mul(error::mul(cog, taps, "weights")?, cig, "weights")?;
        error::need(
            "deconvolution weights",
            weights.len(),
            error::mul(per_group, groups, "weights")?,
        )?;
        let bias = crate::conv::bias_or_zeros(bias, cout)?;
        let n = taps * cog;
        let mut packed = Vec::with_capacity(groups);
        let mut t = vec![0f32; cig * n];
        for gi in 0..groups {
            // B[ci, tap·cog + oc] = W[g·cog + oc, tap, ci].
            for oc in 0..cog {
                for tap in 0..taps {
                    for ci in 0..cig {
                        let src = ((gi * cog + oc) * taps + tap) * cig + ci;
                        if let (Some(d), Some(&v)) =
                            (t.get_mut(ci * n + tap * cog + oc), weights.get(src))
                        {
                            *d = v;
                        }
                    }
                }
            }
            packed.push(gemm.pack_b(MatRef::row_major(&t, cig, n)?)?);
        }
        Ok(Self {
            input,
            kernel,
            stride,
            dilation,
            padding,
            out,
            groups,
            cig,
            cog,
            gemm,
            weights: packed,
            bias,
            min,
            max,
        })
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.weights.iter().map(PackedB::bytes).sum::<usize>() + self.bias.len() * 4
    }

    fn cols(&self) -> usize {
        self.kernel[0] * self.kernel[1] * self.cog
    }

    /// Scratch (f32) for a run on `threads` threads: the column buffer and the product's.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let cols = error::mul(BLOCK, self.cols(), "deconvolution columns")?;
        let g = self
            .gemm
            .scratch_len(BLOCK, self.cols(), self.cig, false, true, threads)?;
        error::add(cols, g, "deconvolution scratch")
    }

    /// Runs on `batch` NHWC images.
    pub fn run(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let cin = self.groups * self.cig;
        let cout = self.groups * self.cog;
        let [ih, iw] = self.input;
        let [oh, ow] = self.out;
        let pixels = error::mul(ih * iw, batch, "input")?;
        error::need(
            "deconvolution input",
            x.len(),
            error::mul(pixels, cin, "input")?,
        )?;
        let y_len = error::mul(error::mul(oh * ow, cout, "output")?, batch, "output")?;
        error::need("deconvolution output", y.len(), y_len)?;
        let y = y.get_mut(..y_len).unwrap_or_default();
        for px in y.chunks_exact_mut(cout.max(1)) {
            px.copy_from_slice(self.bias.get(..cout).unwrap_or_default());
        }
        let ncols = self.cols();
        let need = self.scratch_len(pool.threads())?;
        error::need("deconvolution scratch", scratch.len(), need)?;
        let (colbuf, gscratch) = scratch.split_at_mut(BLOCK * ncols);
        let [kh, kw] = self.kernel;
        for (gi, packed) in self.weights.iter().enumerate() {
            let mut p0 = 0;
            while p0 < pixels {
                let m = BLOCK.min(pixels - p0);
                let a = MatRef::new(
                    x.get(p0 * cin + gi * self.cig..).unwrap_or_default(),
                    m,
                    self.cig,
                    cin,
                    1,
                )?;
                let c =
                    MatMut::row_major(colbuf.get_mut(..m * ncols).unwrap_or_default(), m, ncols)?;
                self.gemm.run(
                    pool,
                    c,
                    Lhs::Mat(a),
                    Rhs::Packed(packed),
                    &Epilogue {
                        accumulate: false,
                        bias: Bias::None,
                        activation: Default::default(),
                    },
                    gscratch,
                )?;
                for r in 0..m {
                    let p = p0 + r;
                    let (n, iy, ix) = (p / (ih * iw), p % (ih * iw) / iw, p % iw);
                    for ky in 0..kh {
                        let Some(oy) = (iy * self.stride[0] + ky * self.dilation[0])
                            .checked_sub(self.padding[0])
                            .filter(|&v| v < oh)
                        else {
                            continue;
                        };
                        for kx in 0..kw {
                            let Some(ox) = (ix * self.stride[1] + kx * self.dilation[1])
                                .checked_sub(self.padding[3])
                                .filter(|&v| v < ow)
                            else {
                                continue;
                            };
                            let src = colbuf
                                .get(r * ncols + (ky * kw + kx) * self.cog..)
                                .unwrap_or_default();
                            let d = ((n * oh + oy) * ow + ox) * cout + gi * self.cog;
                            if let Some(dst) = y.get_mut(d..d + self.cog) {
                                for (o, &v) in dst.iter_mut().zip(src) {
                                    *o += v;
                                }
                            }
                        }
                    }
                }
                p0 += m;
            }
        }
        if self.min != f32::NEG_INFINITY || self.max != f32::INFINITY {
            for v in y.iter_mut() {
                *v = clamp(*v, self.min, self.max);
            }
        }
        Ok(())
    }
}
