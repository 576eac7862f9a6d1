//! 2-D convolution in NHWC (channels last), prepared once per layer: the layout in
//! which a chain of convolutions runs without any copy of its activations.
//!
//! With the pixels as the rows of the product, `out (pixels × c_out) = im2col(x)
//! (pixels × K) · W (K × c_out)` writes NHWC directly, the weights are the right
//! operand packed once ([`PackedB`], K ordered as (kernel row, kernel column, input
//! channel)), and the bias is a per-column bias fused in the epilogue:
//! - **pointwise** (1×1, stride 1, no padding): the input is the left operand as it
//!   is (`pixels × c_in`, rows contiguous);
//! - **implicit im2col**: the left operand's panels are gathered block by block from
//!   the receptive fields, a run of `c_in` contiguous values per pixel and kernel tap
//!   (padding reads as zeros), never materialized whole;
//! - **depthwise** (one input channel per group, no channel multiplier): a direct
//!   loop per output pixel, vectorized over the channels, the weights rearranged as
//!   (kernel tap, channel).
//!
//! Bias, a residual and an [`Activation`] are fused. See [`crate::layout`] for the
//! conversions at the ends of a chain.

use super::Conv2dParams;
use crate::arch::{madd, multiversion, Isa};
use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{pack_rows, Bias, Epilogue, Gemm, Lines, PackedB, Side};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

enum Algo {
    /// One product per group, weights packed as `K × c_out/groups`.
    Gemm {
        weights: Vec<PackedB>,
        pointwise: bool,
    },
    /// Weights as `[kh·kw][channels]`.
    Depthwise { weights: Vec<f32> },
}

/// A convolution layer in NHWC prepared for repeated runs.
pub struct Conv2dNhwc {
    p: Conv2dParams,
    out: [usize; 2],
    gemm: Gemm,
    algo: Algo,
    bias: Vec<f32>,
    activation: Activation,
}

impl std::fmt::Debug for Conv2dNhwc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conv2dNhwc")
            .field("params", &self.p)
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

impl Conv2dNhwc {
    /// Prepares a convolution with `weights` in PyTorch's layout `[out_channels,
    /// in_channels / groups, kh, kw]`, an optional bias per output channel, and an
    /// activation applied after bias (and residual).
    pub fn new(
        gemm: Gemm,
        p: Conv2dParams,
        weights: &[f32],
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Result<Self> {
        let out = p.output()?;
        let (cig, cog) = p.channels_per_group();
        let taps = error::mul(p.kernel[0], p.kernel[1], "convolution kernel")?;
        let k = error::mul(cig, taps, "convolution depth")?;
        let w_len = error::mul(p.out_channels, k, "convolution weights")?;
        if weights.len() != w_len {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "convolution weights of {} elements, {w_len} expected",
                    weights.len()
                ),
            });
        }
        let bias = match bias {
            Some(b) if b.len() == p.out_channels => b.to_vec(),
            Some(b) => {
                return Err(Error::ShapeMismatch {
                    what: format!(
                        "bias of {} values for {} output channels",
                        b.len(),
                        p.out_channels
                    ),
                })
            }
            None => vec![0.0; p.out_channels],
        };
        let algo = if cig == 1 && cog == 1 && p.groups > 1 {
            // [c][tap] -> [tap][c]
            let c = p.out_channels;
            let mut t = vec![0.0; w_len];
            for (ch, w) in weights.chunks_exact(taps).enumerate() {
                for (tap, &v) in w.iter().enumerate() {
                    if let Some(d) = t.get_mut(tap * c + ch) {
                        *d = v;
                    }
                }
            }
            Algo::Depthwise { weights: t }
        } else {
            // Per group, [cog][cig][tap] -> K × cog with K ordered (tap, ci).
            let mut reordered = vec![0.0; k * cog];
            let mut packed = Vec::with_capacity(p.groups);
            for w in weights.chunks_exact(cog * k) {
                for (co, wc) in w.chunks_exact(k).enumerate() {
                    for (ci, wt) in wc.chunks_exact(taps).enumerate() {
                        for (tap, &v) in wt.iter().enumerate() {
                            if let Some(d) = reordered.get_mut((tap * cig + ci) * cog + co) {
                                *d = v;
                            }
                        }
                    }
                }
                packed.push(gemm.pack_b(MatRef::row_major(&reordered, k, cog)?)?);
            }
            let pointwise = p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == [0; 4];
            Algo::Gemm {
                weights: packed,
                pointwise,
            }
        };
        Ok(Self {
            p,
            out,
            gemm,
            algo,
            bias,
            activation,
        })
    }

    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        let w = match &self.algo {
            Algo::Gemm { weights, .. } => weights.iter().map(PackedB::bytes).sum(),
            Algo::Depthwise { weights } => weights.len() * 4,
        };
        w + self.bias.len() * 4
    }

    /// The geometry.
    pub fn params(&self) -> &Conv2dParams {
        &self.p
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// "pointwise", "im2col" or "depthwise".
    pub fn algorithm(&self) -> &'static str {
        match self.algo {
            Algo::Gemm {
                pointwise: true, ..
            } => "pointwise",
            Algo::Gemm { .. } => "im2col",
            Algo::Depthwise { .. } => "depthwise",
        }
    }

    /// Elements of the input and output of a batch of `batch` images.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        let p = &self.p;
        let x = error::mul(p.input[0] * p.input[1], p.in_channels, "input")?;
        let y = error::mul(self.out[0] * self.out[1], p.out_channels, "output")?;
        Ok((
            error::mul(x, batch, "input")?,
            error::mul(y, batch, "output")?,
        ))
    }

    /// Scratch (f32 elements) a run needs on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let (cig, cog) = self.p.channels_per_group();
        let k = cig * self.p.kernel[0] * self.p.kernel[1];
        let n = self.out[0] * self.out[1];
        match self.algo {
            Algo::Gemm { .. } => self.gemm.scratch_len(n, cog, k, false, true, threads),
            Algo::Depthwise { .. } => Ok(0),
        }
    }

    /// Runs the convolution on `batch` NHWC images: `input` is `[batch, h, w,
    /// in_channels]`, `output` `[batch, oh, ow, out_channels]`; with `residual` (shaped
    /// as the output), `output = act(conv(input) + bias + residual)`.
    pub fn run(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        residual: Option<&[f32]>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let (x_len, y_len) = self.io_len(batch)?;
        error::need("convolution input", input.len(), x_len)?;
        error::need("convolution output", output.len(), y_len)?;
        if let Some(r) = residual {
            error::need("convolution residual", r.len(), y_len)?;
        }
        if y_len == 0 {
            return Ok(());
        }
        let output = output.get_mut(..y_len).unwrap_or_default();
        let p = &self.p;
        let isa = self.gemm.isa();
        match &self.algo {
            Algo::Depthwise { weights } => {
                let act = if residual.is_some() {
                    Activation::Identity
                } else {
                    self.activation
                };
                let row = self.out[1] * p.out_channels;
                let failed = std::sync::atomic::AtomicBool::new(false);
                pool.parallel_chunks(output, row, &mut [0u8; 0], 0, |r, y, _| {
                    let (n, oy) = (r / self.out[0], r % self.out[0]);
                    let x = input
                        .get(n * p.input[0] * p.input[1] * p.in_channels..)
                        .unwrap_or_default();
                    if depthwise_row(isa, p, self.out, x, weights, &self.bias, act, oy, y).is_err()
                    {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                })?;
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(Error::InvalidParameter {
                        what: "depthwise convolution input too short".into(),
                    });
                }
                if let Some(r) = residual.and_then(|r| r.get(..y_len)) {
                    elementwise::add_vector_activate(isa, output, r, self.activation)?;
                }
                Ok(())
            }
            Algo::Gemm { weights, pointwise } => {
                if let Some(r) = residual.and_then(|r| r.get(..y_len)) {
                    output.copy_from_slice(r);
                }
                let (cig, cog) = p.channels_per_group();
                let (hw, ohw) = (p.input[0] * p.input[1], self.out[0] * self.out[1]);
                for (x_b, y_b) in input
                    .chunks_exact(hw * p.in_channels)
                    .zip(output.chunks_exact_mut(ohw * p.out_channels))
                    .take(batch)
                {
                    for (g, b) in weights.iter().enumerate() {
                        let epi = Epilogue {
                            accumulate: residual.is_some(),
                            bias: Bias::Col(self.bias.get(g * cog..).unwrap_or_default()),
                            activation: self.activation,
                        };
                        let y_g = y_b.get_mut(g * cog..).unwrap_or_default();
                        let c = MatMut::new(y_g, ohw, cog, p.out_channels, 1)?;
                        let b_side = Side::<MatRef<'_>>::Packed(b.panels());
                        let x_g = x_b.get(g * cig..).unwrap_or_default();
                        if *pointwise {
                            let a = MatRef::new(x_g, ohw, cig, p.in_channels, 1)?;
                            self.gemm
                                .run_sides(pool, c, Side::Lines(&a), b_side, &epi, scratch)?;
                        } else {
                            let a = Im2colNhwc {
                                p,
                                out: self.out,
                                x: x_g,
                            };
                            self.gemm
                                .run_sides(pool, c, Side::Lines(&a), b_side, &epi, scratch)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// The implicit im2col matrix of one image and group in NHWC: lines are output pixels,
/// depth is (kernel row, kernel column, input channel of the group).
struct Im2colNhwc<'a> {
    p: &'a Conv2dParams,
    out: [usize; 2],
    /// The image from the group's first channel on (rows of `in_channels`).
    x: &'a [f32],
}

impl Im2colNhwc<'_> {
    /// The run of channels `c0..c0 + n` of tap `tap` for output pixel `pixel`, or an
    /// empty run in the padding.
    fn run(&self, pixel: usize, tap: usize, c0: usize, n: usize) -> &[f32] {
        let p = self.p;
        let (oy, ox) = (pixel / self.out[1], pixel % self.out[1]);
        let (ky, kx) = (tap / p.kernel[1], tap % p.kernel[1]);
        let iy = (oy * p.stride[0] + ky * p.dilation[0]).checked_sub(p.padding[0]);
        let ix = (ox * p.stride[1] + kx * p.dilation[1]).checked_sub(p.padding[1]);
        match (iy, ix) {
            (Some(iy), Some(ix)) if iy < p.input[0] && ix < p.input[1] => {
                let at = (iy * p.input[1] + ix) * p.in_channels + c0;
                self.x.get(at..at + n).unwrap_or_default()
            }
            _ => &[],
        }
    }
}

impl Lines for Im2colNhwc<'_> {
    fn lines(&self) -> usize {
        self.out[0] * self.out[1]
    }

    fn depth(&self) -> usize {
        self.p.channels_per_group().0 * self.p.kernel[0] * self.p.kernel[1]
    }

    #[allow(clippy::too_many_arguments)] // the block's coordinates and the panel width
    fn pack(
        &self,
        isa: Isa,
        l0: usize,
        len: usize,
        k0: usize,
        kc: usize,
        w: usize,
        dst: &mut [f32],
    ) {
        let cig = self.p.channels_per_group().0.max(1);
        let mut rows: [&[f32]; MAX_W] = [&[]; MAX_W];
        let rows = rows.get_mut(..w).unwrap_or_default();
        for (q, panel) in dst
            .chunks_exact_mut(kc * w)
            .take(len.div_ceil(w))
            .enumerate()
        {
            let first = l0 + q * w;
            let valid = w.min(l0 + len - first);
            // Depth segments that stay within one kernel tap.
            let mut d = k0;
            while d < k0 + kc {
                let (tap, c0) = (d / cig, d % cig);
                let n = (cig - c0).min(k0 + kc - d);
                for (l, r) in rows.iter_mut().enumerate() {
                    *r = if l < valid {
                        self.run(first + l, tap, c0, n)
                    } else {
                        &[]
                    };
                }
                let out = panel.get_mut((d - k0) * w..(d - k0 + n) * w);
                pack_rows(isa, rows, n, out.unwrap_or_default());
                d += n;
            }
        }
    }
}

/// Widest panel of any micro-kernel.
const MAX_W: usize = 32;

/// Channels accumulated at once by the depthwise loop (in registers).
const DW_BLOCK: usize = 64;

multiversion! {
    /// One output row `oy` of a depthwise convolution in NHWC.
    fn depthwise_row<const FMA: bool>(p: &Conv2dParams, out: [usize; 2], x: &[f32], weights: &[f32], bias: &[f32], act: Activation, oy: usize, y: &mut [f32]) -> Result {
        let c = p.out_channels;
        let ([h, w], [kh, kw]) = (p.input, p.kernel);
        for (ox, y_px) in y.chunks_exact_mut(c).enumerate().take(out[1]) {
            let mut c0 = 0;
            while c0 < c {
                let cb = DW_BLOCK.min(c - c0);
                let mut acc = [0f32; DW_BLOCK];
                let acc = acc.get_mut(..cb).unwrap_or_default();
                acc.copy_from_slice(bias.get(c0..c0 + cb).unwrap_or_default());
                for ky in 0..kh {
                    let Some(iy) = (oy * p.stride[0] + ky * p.dilation[0])
                        .checked_sub(p.padding[0])
                        .filter(|&iy| iy < h)
                    else {
                        continue;
                    };
                    for kx in 0..kw {
                        let Some(ix) = (ox * p.stride[1] + kx * p.dilation[1])
                            .checked_sub(p.padding[1])
                            .filter(|&ix| ix < w)
                        else {
                            continue;
                        };
                        let at = (iy * w + ix) * c + c0;
                        let wt = (ky * kw + kx) * c + c0;
                        let (Some(xs), Some(ws)) = (x.get(at..at + cb), weights.get(wt..wt + cb)) else {
                            return Err(Error::InvalidParameter { what: "depthwise input too short".into() });
                        };
                        for ((a, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                            *a = madd::<FMA>(xv, wv, *a);
                        }
                    }
                }
                let dst = y_px.get_mut(c0..c0 + cb).unwrap_or_default();
                dst.copy_from_slice(acc);
                if act != Activation::Identity {
                    elementwise::bias_act::<FMA>(dst, 0.0, act);
                }
                c0 += cb;
            }
        }
        Ok(())
    }
}
