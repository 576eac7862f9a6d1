//! 2-D convolution (f32, NCHW), prepared once per layer and run many times.
//!
//! [`Conv2d::new`] validates the geometry, chooses an algorithm and arranges the
//! weights for it:
//! - **pointwise** (1×1, stride 1, no padding): per group, `out (c_out × hw) =
//!   W (c_out × c_in) · x (c_in × hw)` with W packed once; the input is read as the
//!   right operand directly, no im2col.
//! - **implicit im2col**: the same product with K = c_in·kh·kw, the receptive fields
//!   gathered straight into the GEMM's packed panels block by block (`Im2col`), so
//!   no column matrix is ever materialized; W packed once.
//! - **depthwise** (one input channel per group): a direct loop per output row that
//!   accumulates each tap over a run of outputs, vectorized over the output width
//!   (`depthwise`).
//!
//! Bias and an [`Activation`] are fused into the product's epilogue (or the depthwise
//! row loop). A 1-D convolution is a 2-D one of height 1. Scratch comes from the
//! caller ([`Conv2d::scratch_len`]); a run allocates nothing.

mod depthwise;
mod transposed;
mod trim;

pub(crate) use trim::trim_padding_taps;

pub use transposed::{ConvTranspose2d, ConvTranspose2dParams};

use crate::arch::Isa;
use crate::elementwise::Activation;
use crate::error::{self, Error, Result};
use crate::gemm::{Bias, Epilogue, Gemm, Lines, PackedA, PackedB, Side};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

/// The geometry of a 2-D convolution; index 0 of each pair is the height, 1 the width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Input channels (all groups).
    pub in_channels: usize,
    /// Output channels (all groups).
    pub out_channels: usize,
    /// Groups: input and output channels are split in this many independent parts.
    pub groups: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Zero padding: top, left, bottom, right.
    pub padding: [usize; 4],
    /// Dilation.
    pub dilation: [usize; 2],
}

impl Conv2dParams {
    /// The input row and column that tap `(ky, kx)` of output pixel `(oy, ox)` reads,
    /// `None` in the padding.
    #[inline]
    pub fn input_at(&self, [oy, ox]: [usize; 2], [ky, kx]: [usize; 2]) -> Option<(usize, usize)> {
        let iy = (oy * self.stride[0] + ky * self.dilation[0])
            .checked_sub(self.padding[0])
            .filter(|&v| v < self.input[0])?;
        let ix = (ox * self.stride[1] + kx * self.dilation[1])
            .checked_sub(self.padding[1])
            .filter(|&v| v < self.input[1])?;
        Some((iy, ix))
    }

    /// Output height and width, or an error for an invalid geometry.
    pub fn output(&self) -> Result<[usize; 2]> {
        let g = self;
        let bad = |what: String| Error::InvalidParameter { what };
        if g.groups == 0
            || !g.in_channels.is_multiple_of(g.groups)
            || !g.out_channels.is_multiple_of(g.groups)
            || g.stride.contains(&0)
            || g.dilation.contains(&0)
            || g.kernel.contains(&0)
        {
            return Err(bad(format!(
                "convolution of {} to {} channels in {} groups, kernel {:?}, stride {:?}, dilation {:?}",
                g.in_channels, g.out_channels, g.groups, g.kernel, g.stride, g.dilation
            )));
        }
        let [pt, pl, pb, pr] = g.padding;
        let axis = |input: usize, kernel: usize, stride: usize, dilation: usize, pads: usize| {
            let extent = (kernel - 1)
                .checked_mul(dilation)
                .and_then(|v| v.checked_add(1));
            match (extent, input.checked_add(pads)) {
                (Some(e), Some(p)) if p >= e => Ok((p - e) / stride + 1),
                _ => Err(bad(format!(
                    "kernel {:?} with dilation {:?} is larger than the padded input {:?}",
                    g.kernel, g.dilation, g.input
                ))),
            }
        };
        let ([h, w], [kh, kw], [sh, sw], [dh, dw]) = (g.input, g.kernel, g.stride, g.dilation);
        let pads = |a: usize, b: usize| {
            a.checked_add(b)
                .ok_or(Error::SizeOverflow { what: "padding" })
        };
        let out = [
            axis(h, kh, sh, dh, pads(pt, pb)?)?,
            axis(w, kw, sw, dw, pads(pl, pr)?)?,
        ];
        Ok(out)
    }

    pub(crate) fn channels_per_group(&self) -> (usize, usize) {
        (
            self.in_channels / self.groups,
            self.out_channels / self.groups,
        )
    }

    /// Kernel taps, depth of one group's product (`taps · in_channels / groups`), and
    /// the weights' length; errors if `weights` is not that long.
    pub(crate) fn weight_dims(&self, weights: usize) -> Result<(usize, usize)> {
        let taps = error::mul(self.kernel[0], self.kernel[1], "convolution kernel")?;
        let k = error::mul(self.channels_per_group().0, taps, "convolution depth")?;
        let w_len = error::mul(self.out_channels, k, "convolution weights")?;
        if w_len == 0 {
            return Err(Error::ShapeMismatch {
                what: "a convolution without output channels or without taps".into(),
            });
        }
        if weights != w_len {
            return Err(Error::ShapeMismatch {
                what: format!("convolution weights of {weights} elements, {w_len} expected"),
            });
        }
        Ok((taps, k))
    }

    /// Elements of the input and output of a batch of `batch` images (either layout).
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        let [oh, ow] = self.output()?;
        let x = error::mul(
            error::mul(self.input[0], self.input[1], "input")?,
            self.in_channels,
            "input",
        )?;
        let y = error::mul(error::mul(oh, ow, "output")?, self.out_channels, "output")?;
        Ok((
            error::mul(x, batch, "input")?,
            error::mul(y, batch, "output")?,
        ))
    }
}

/// How a convolution's weights are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// PyTorch's `[out_channels, in_channels / groups, kh, kw]`.
    Oihw,
    /// Channels last, `[out_channels, kh, kw, in_channels / groups]` (XNNPACK's
    /// regular convolution).
    Ohwi,
    /// `[kh, kw, out_channels]`, for one input channel per group (XNNPACK's depthwise
    /// convolution).
    Hwo,
}

/// Convolution weights as the prepared convolutions take them: a layout, and
/// optionally a factor per output channel (a batch normalization folded in) applied
/// while the weights are arranged, so that no scaled copy is ever made.
#[derive(Clone, Copy, Debug)]
pub struct ConvWeights<'a> {
    data: &'a [f32],
    layout: WeightLayout,
    scale: Option<&'a [f64]>,
}

impl<'a> ConvWeights<'a> {
    /// Weights in PyTorch's `[out_channels, in_channels / groups, kh, kw]`.
    pub fn oihw(data: &'a [f32]) -> Self {
        Self::new(data, WeightLayout::Oihw)
    }

    /// Channels-last weights, `[out_channels, kh, kw, in_channels / groups]`.
    pub fn ohwi(data: &'a [f32]) -> Self {
        Self::new(data, WeightLayout::Ohwi)
    }

    /// Depthwise weights, `[kh, kw, out_channels]`.
    pub fn hwo(data: &'a [f32]) -> Self {
        Self::new(data, WeightLayout::Hwo)
    }

    /// The same layout and scale over other values (the same weights rearranged).
    pub(crate) fn with_data<'b>(&self, data: &'b [f32]) -> ConvWeights<'b>
    where
        'a: 'b,
    {
        ConvWeights { data, ..*self }
    }

    fn new(data: &'a [f32], layout: WeightLayout) -> Self {
        Self {
            data,
            layout,
            scale: None,
        }
    }

    /// The same weights with output channel `o`'s multiplied by `scale[o]` (in f64,
    /// rounded once to f32); `scale` must have one factor per output channel.
    pub fn scaled(self, scale: &'a [f64]) -> Self {
        Self {
            scale: Some(scale),
            ..self
        }
    }

    /// The values as stored, before any scale.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// The layout.
    pub fn layout(&self) -> WeightLayout {
        self.layout
    }

    /// The factor per output channel, if any.
    pub fn scale(&self) -> Option<&'a [f64]> {
        self.scale
    }

    /// Checks the weights against geometry `p`: their length, the layout's constraint
    /// and the scale's length. Returns (taps, depth of one group's product).
    pub(crate) fn check(&self, p: &Conv2dParams) -> Result<(usize, usize)> {
        let dims = p.weight_dims(self.data.len())?;
        let cig = p.channels_per_group().0;
        if self.layout == WeightLayout::Hwo && cig != 1 {
            return Err(Error::ShapeMismatch {
                what: format!("depthwise weights for {cig} input channels per group"),
            });
        }
        match self.scale {
            Some(s) if s.len() != p.out_channels => Err(Error::ShapeMismatch {
                what: format!(
                    "{} weight factors for {} output channels",
                    s.len(),
                    p.out_channels
                ),
            }),
            _ => Ok(dims),
        }
    }

    /// The stored weight of output channel `o` at tap `t` (of `taps`) for input
    /// channel `i` of its group (of `cig`), with `cout` output channels in all.
    pub(crate) fn raw(
        &self,
        (o, t, i): (usize, usize, usize),
        taps: usize,
        cig: usize,
        cout: usize,
    ) -> f32 {
        let at = match self.layout {
            WeightLayout::Oihw => (o * cig + i) * taps + t,
            WeightLayout::Ohwi => (o * taps + t) * cig + i,
            WeightLayout::Hwo => t * cout + o,
        };
        self.data.get(at).copied().unwrap_or(0.0)
    }

    /// [`Self::raw`] times output channel `o`'s factor.
    pub(crate) fn at(
        &self,
        at: (usize, usize, usize),
        taps: usize,
        cig: usize,
        cout: usize,
    ) -> f32 {
        scaled(self.raw(at, taps, cig, cout), self.factor(at.0))
    }

    /// Output channel `o`'s factor, if the weights have one.
    pub(crate) fn factor(&self, o: usize) -> Option<f64> {
        self.scale.and_then(|s| s.get(o)).copied()
    }

    /// Output channels `o0..o0 + n`'s weights, each run of `k` contiguous in the
    /// order (tap, input channel), when the layout stores them so: OHWI, or OIHW with
    /// a single tap. Unscaled.
    pub(crate) fn channel_runs(
        &self,
        o0: usize,
        n: usize,
        k: usize,
        taps: usize,
    ) -> Option<&'a [f32]> {
        let contiguous = match self.layout {
            WeightLayout::Ohwi => true,
            WeightLayout::Oihw => taps == 1,
            WeightLayout::Hwo => false,
        };
        let start = o0.checked_mul(k)?;
        contiguous.then(|| self.data.get(start..start.checked_add(n.checked_mul(k)?)?))?
    }
}

/// A weight times its output channel's factor (see [`ConvWeights::factor`]), rounded
/// once.
pub(crate) fn scaled(w: f32, factor: Option<f64>) -> f32 {
    factor.map_or(w, |s| (f64::from(w) * s) as f32)
}

/// Whether every value is finite. Block by block, with no exit inside a block, so
/// that the scan vectorizes: stopping at the first value that is not (`all`) ran
/// value by value, about 4 ms of mobilenet_v2's 34 ms load in a profile.
pub(crate) fn all_finite(values: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    values.chunks(1024).all(|block| {
        block
            .iter()
            .map(|v| v.to_bits() & EXPONENT)
            .fold(0, u32::max)
            < EXPONENT
    })
}

/// A bias of `channels` values (zeros when there is none), checked.
pub(crate) fn bias_or_zeros(bias: Option<&[f32]>, channels: usize) -> Result<Vec<f32>> {
    match bias {
        Some(b) if b.len() == channels => Ok(b.to_vec()),
        Some(b) => Err(Error::ShapeMismatch {
            what: format!("bias of {} values for {channels} output channels", b.len()),
        }),
        None => Ok(vec![0.0; channels]),
    }
}

enum Algo {
    /// Products per group with packed weights; `implicit` builds the pixels' operand
    /// from receptive fields, else the input is that operand.
    Gemm {
        weights: GemmWeights,
        implicit: bool,
    },
    /// Direct depthwise loop; weights as given (c_out × kh × kw).
    Depthwise { weights: Vec<f32> },
}

/// A layer's weights packed for the product, per group.
enum GemmWeights {
    /// Output channels as the product's rows: `out (c_out × pixels) = W · cols`.
    ChannelRows(Vec<PackedA>),
    /// Output pixels as the product's rows: `outᵀ (pixels × c_out) = colsᵀ · Wᵀ`,
    /// written through a transposed view of the output. For layers of few pixels (1-D
    /// convolutions over audio frames), whose pixels as the product's columns would
    /// leave much of the last column tile empty: wav2letter's 51 frames fill 51 of 64
    /// columns, but 51 of 54 rows.
    PixelRows(Vec<PackedB>),
}

/// Whether a product of `channels` output channels by `pixels` output pixels fills the
/// micro-kernel's tiles better with pixels as rows (by more than a tenth: the
/// transposed output is stored through strided views).
fn pixel_rows(gemm: &Gemm, channels: usize, pixels: usize) -> bool {
    let (mr, nr) = gemm.isa().gemm_tile();
    let fill = |n: usize, tile: usize| n as f64 / n.next_multiple_of(tile.max(1)).max(1) as f64;
    let by_channels = fill(channels, mr) * fill(pixels, nr);
    let by_pixels = fill(pixels, mr) * fill(channels, nr);
    by_pixels > 1.1 * by_channels
}

/// A convolution layer prepared for repeated runs: weights arranged, algorithm chosen.
pub struct Conv2d {
    p: Conv2dParams,
    out: [usize; 2],
    gemm: Gemm,
    algo: Algo,
    bias: Vec<f32>,
    activation: Activation,
}

impl std::fmt::Debug for Conv2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conv2d")
            .field("params", &self.p)
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

impl Conv2d {
    /// Prepares a convolution with `weights` in PyTorch's layout (`[out_channels,
    /// in_channels / groups, kh, kw]`, optionally scaled per output channel), an
    /// optional bias per output channel and an activation applied after the bias, for
    /// the product engine `gemm`; large weights are packed on the threads of `pool`.
    pub fn new(
        pool: &ThreadPool,
        gemm: Gemm,
        p: Conv2dParams,
        weights: ConvWeights<'_>,
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Result<Self> {
        let trimmed = trim_padding_taps(&p, &weights)?;
        let (p, weights) = match &trimmed {
            Some((q, kept)) => (*q, weights.with_data(kept)),
            None => (p, weights),
        };
        let out = p.output()?;
        let (cig, cog) = p.channels_per_group();
        let (taps, k) = weights.check(&p)?;
        if weights.layout() != WeightLayout::Oihw {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "{:?} weights for an NCHW convolution (OIHW expected)",
                    weights.layout()
                ),
            });
        }
        let bias = bias_or_zeros(bias, p.out_channels)?;
        let algo = if cig == 1 && p.groups > 1 && depthwise::window(&p, out).supported() {
            let mut arranged = Vec::with_capacity(weights.data().len());
            for o in 0..p.out_channels {
                arranged.extend((0..taps).map(|t| weights.at((o, t, 0), taps, 1, p.out_channels)));
            }
            Algo::Depthwise { weights: arranged }
        } else {
            let implicit = !(p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == [0; 4]);
            let per_group = weights.data().chunks_exact(cog * k).enumerate();
            let scale = |g: usize| {
                weights
                    .scale()
                    .map(|s| s.get(g * cog..(g + 1) * cog).unwrap_or_default())
            };
            let packed = if pixel_rows(&gemm, cog, out[0] * out[1]) {
                let mut packed = Vec::with_capacity(p.groups);
                for (g, w) in per_group {
                    let mut b = gemm.pack_b_on(pool, MatRef::row_major(w, cog, k)?.t())?;
                    if let Some(s) = scale(g) {
                        b.scale_columns(s)?;
                    }
                    packed.push(b);
                }
                GemmWeights::PixelRows(packed)
            } else {
                let mut packed = Vec::with_capacity(p.groups);
                for (g, w) in per_group {
                    let mut a = gemm.pack_a_on(pool, MatRef::row_major(w, cog, k)?)?;
                    if let Some(s) = scale(g) {
                        a.scale_rows(s)?;
                    }
                    packed.push(a);
                }
                GemmWeights::ChannelRows(packed)
            };
            Algo::Gemm {
                weights: packed,
                implicit,
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

    /// Heap bytes held by the prepared weights and bias (for memory budgets).
    pub fn bytes(&self) -> usize {
        let weights = match &self.algo {
            Algo::Gemm {
                weights: GemmWeights::ChannelRows(w),
                ..
            } => w.iter().map(PackedA::bytes).sum(),
            Algo::Gemm {
                weights: GemmWeights::PixelRows(w),
                ..
            } => w.iter().map(PackedB::bytes).sum(),
            Algo::Depthwise { weights } => weights.len() * std::mem::size_of::<f32>(),
        };
        weights + self.bias.len() * std::mem::size_of::<f32>()
    }

    /// The geometry.
    pub fn params(&self) -> &Conv2dParams {
        &self.p
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// The algorithm chosen: "pointwise", "im2col" or "depthwise".
    pub fn algorithm(&self) -> &'static str {
        match self.algo {
            Algo::Gemm {
                implicit: false, ..
            } => "pointwise",
            Algo::Gemm { implicit: true, .. } => "im2col",
            Algo::Depthwise { .. } => "depthwise",
        }
    }

    /// Elements of the input and output of a batch of `batch`.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        self.p.io_len(batch)
    }

    /// Scratch (f32 elements) a run needs on `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let (cig, cog) = self.p.channels_per_group();
        let k = cig * self.p.kernel[0] * self.p.kernel[1];
        let n = self.out[0] * self.out[1];
        match self.algo {
            Algo::Gemm {
                weights: GemmWeights::ChannelRows(_),
                ..
            } => self.gemm.scratch_len(cog, n, k, true, false, threads),
            Algo::Gemm {
                weights: GemmWeights::PixelRows(_),
                ..
            } => {
                let product = self.gemm.scratch_len(n, cog, k, false, true, threads)?;
                let transposed = error::mul(n, cog, "convolution output")?;
                product.checked_add(transposed).ok_or(Error::SizeOverflow {
                    what: "convolution scratch",
                })
            }
            Algo::Depthwise { .. } => depthwise::scratch_len(&self.p, self.out, threads),
        }
    }

    /// Runs the convolution on `batch` images: `input` is `[batch, in_channels, h, w]`,
    /// `output` `[batch, out_channels, oh, ow]`, both contiguous.
    pub fn run(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        self.run_inner(pool, input, batch, None, output, scratch)
    }

    /// Like [`Conv2d::run`], adding `residual` (shaped as the output) before the
    /// activation: `output = act(conv(input) + bias + residual)`, e.g. a residual
    /// block's shortcut. Products accumulate onto the residual in their epilogue.
    pub fn run_add(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        residual: &[f32],
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        self.run_inner(pool, input, batch, Some(residual), output, scratch)
    }

    fn run_inner(
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
        let p = &self.p;
        let (cig, cog) = p.channels_per_group();
        let hw = p.input[0] * p.input[1];
        let ohw = self.out[0] * self.out[1];
        match &self.algo {
            Algo::Depthwise { weights } => {
                let y = output.get_mut(..y_len).unwrap_or_default();
                depthwise::run(
                    self.gemm.isa(),
                    pool,
                    &depthwise::Layer {
                        p,
                        out: self.out,
                        weights,
                        bias: &self.bias,
                        activation: if residual.is_some() {
                            Activation::Identity
                        } else {
                            self.activation
                        },
                    },
                    input.get(..x_len).unwrap_or_default(),
                    y,
                    scratch,
                )?;
                // Rare (depthwise layers seldom end a residual block): a second pass.
                match residual.and_then(|r| r.get(..y_len)) {
                    Some(r) => crate::elementwise::add_vector_activate(
                        self.gemm.isa(),
                        y,
                        r,
                        self.activation,
                    ),
                    None => Ok(()),
                }
            }
            Algo::Gemm { weights, implicit } => {
                for (b, (x_b, y_b)) in input
                    .chunks_exact(p.in_channels * hw)
                    .zip(output.chunks_exact_mut(p.out_channels * ohw))
                    .take(batch)
                    .enumerate()
                {
                    for (g, (x_g, y_g)) in x_b
                        .chunks_exact(cig * hw)
                        .zip(y_b.chunks_exact_mut(cog * ohw))
                        .enumerate()
                    {
                        if let Some(r) = residual {
                            let at = b * p.out_channels * ohw + g * cog * ohw;
                            let r = r.get(at..at + cog * ohw).unwrap_or_default();
                            error::need("convolution residual", r.len(), y_g.len())?;
                            y_g.copy_from_slice(r);
                        }
                        let group = (weights, g, residual.is_some());
                        if *implicit {
                            let cols = Im2col {
                                p,
                                out: self.out,
                                x: x_g,
                            };
                            self.group_product(pool, group, &cols, y_g, scratch)?;
                        } else {
                            let x = MatRef::row_major(x_g, cig, hw)?.t();
                            self.group_product(pool, group, &x, y_g, scratch)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Group `g`'s product of its weights and `pixels` (lines: output pixels, depth:
    /// the receptive field) into `y` (`c_out × pixels` of the group), onto the residual
    /// already in `y` when `accumulate`.
    fn group_product<L: Lines>(
        &self,
        pool: &ThreadPool,
        (weights, g, accumulate): (&GemmWeights, usize, bool),
        pixels: &L,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let (_, cog) = self.p.channels_per_group();
        let ohw = self.out[0] * self.out[1];
        let missing = || Error::InvalidParameter {
            what: "missing group weights".into(),
        };
        let bias = self.bias.get(g * cog..(g + 1) * cog).unwrap_or_default();
        let epi = |bias| Epilogue {
            accumulate,
            bias,
            activation: self.activation,
        };
        match weights {
            GemmWeights::ChannelRows(w) => {
                let a = Side::<L>::Packed(w.get(g).ok_or_else(missing)?.panels());
                let c = MatMut::row_major(y, cog, ohw)?;
                let epi = epi(Bias::Row(bias));
                self.gemm
                    .run_sides(pool, c, a, Side::Lines(pixels), &epi, scratch)
            }
            GemmWeights::PixelRows(w) => {
                let b = Side::<L>::Packed(w.get(g).ok_or_else(missing)?.panels());
                // The product in row-major scratch, then transposed into place: tiles
                // stored through a transposed view of the output went through a tile
                // buffer at every depth block (wav2letter: 54 -> 66 ms).
                let len = scratch.len();
                let (t, rest) =
                    scratch
                        .split_at_mut_checked(ohw * cog)
                        .ok_or(Error::ScratchTooSmall {
                            len,
                            needed: ohw * cog,
                        })?;
                if accumulate {
                    crate::layout::transpose(pool, y, 1, cog, ohw, t)?;
                }
                let c = MatMut::row_major(t, ohw, cog)?;
                let epi = epi(Bias::Col(bias));
                self.gemm
                    .run_sides(pool, c, Side::Lines(pixels), b, &epi, rest)?;
                crate::layout::transpose(pool, t, 1, ohw, cog, y)
            }
        }
    }

    /// The instruction set the layer runs with.
    pub fn isa(&self) -> Isa {
        self.gemm.isa()
    }
}

/// The implicit im2col matrix of one image and group, seen as lines (output pixels) ×
/// depth (input channel, kernel row, kernel column).
struct Im2col<'a> {
    p: &'a Conv2dParams,
    out: [usize; 2],
    /// The group's input channels, `cig × h × w`.
    x: &'a [f32],
}

impl Lines for Im2col<'_> {
    fn lines(&self) -> usize {
        self.out[0] * self.out[1]
    }

    fn depth(&self) -> usize {
        self.p.channels_per_group().0 * self.p.kernel[0] * self.p.kernel[1]
    }

    #[allow(clippy::too_many_arguments)] // the block's coordinates and the panel width
    fn pack(
        &self,
        _isa: Isa,
        l0: usize,
        len: usize,
        k0: usize,
        kc: usize,
        w: usize,
        dst: &mut [f32],
    ) {
        let p = self.p;
        let ([h, wd], [kh, kw], [_, ow]) = (p.input, p.kernel, self.out);
        let ([sh, sw], [dh, dw]) = (p.stride, p.dilation);
        let (pt, pl) = (p.padding[0], p.padding[1]);
        let mut row = [0f32; ROW];
        for (d, depth) in (k0..k0 + kc).enumerate() {
            let (c, ky, kx) = (depth / (kh * kw), depth / kw % kh, depth % kw);
            let plane = self.x.get(c * h * wd..(c + 1) * h * wd).unwrap_or_default();
            // The input column of output column ox is ox·sw + kx·dw - pl: valid for
            // ox in lo..hi.
            let off = kx * dw;
            let lo = pl.saturating_sub(off).div_ceil(sw);
            let hi = (wd + pl).saturating_sub(off).div_ceil(sw).min(ow);
            // Pixels l0..l0 + len, in chunks of at most ROW.
            let mut done = 0;
            while done < len {
                let n = ROW.min(len - done);
                let buf = row.get_mut(..n).unwrap_or_default();
                let mut pixel = l0 + done;
                let mut rest = &mut buf[..];
                while !rest.is_empty() {
                    let (oy, ox0) = (pixel / ow, pixel % ow);
                    let seg_len = (ow - ox0).min(rest.len());
                    let (seg, tail) = rest.split_at_mut(seg_len);
                    let iy = (oy * sh + ky * dh).checked_sub(pt).filter(|&iy| iy < h);
                    let (a, b) = (
                        lo.clamp(ox0, ox0 + seg_len) - ox0,
                        hi.clamp(ox0, ox0 + seg_len) - ox0,
                    );
                    match iy {
                        Some(iy) if a < b => {
                            let (head, body) = seg.split_at_mut(a);
                            head.fill(0.0);
                            let (body, after) = body.split_at_mut(b - a);
                            after.fill(0.0);
                            let start = iy * wd + (ox0 + a) * sw + off - pl;
                            let src = plane.get(start..).unwrap_or_default();
                            if sw == 1 {
                                body.copy_from_slice(src.get(..body.len()).unwrap_or_default());
                            } else {
                                body.iter_mut()
                                    .zip(src.iter().step_by(sw))
                                    .for_each(|(o, &v)| *o = v);
                            }
                        }
                        _ => seg.fill(0.0),
                    }
                    pixel += seg_len;
                    rest = tail;
                }
                // Scatter the run into the panels at depth d.
                for (i, chunk) in buf.chunks(w).enumerate() {
                    let q = (done / w) + i;
                    if let Some(out) = dst.get_mut(q * kc * w + d * w..q * kc * w + (d + 1) * w) {
                        if chunk.len() == w {
                            out.copy_from_slice(chunk);
                        } else {
                            out.fill(0.0);
                            out.iter_mut().zip(chunk).for_each(|(o, &v)| *o = v);
                        }
                    }
                }
                done += n;
            }
        }
    }
}

/// Pixels gathered at once per depth (a multiple of every panel width).
const ROW: usize = 1024;

#[cfg(test)]
mod tests;
