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
use crate::arch::{self, madd, multiversion, Isa, Post, TileBias};
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
    /// A few input channels and no horizontal dilation (a stem): the input is copied
    /// with its padding, so that a whole kernel row of a pixel's receptive field is
    /// one run of `kw · c_in` values for the indirect micro-kernel.
    Rows { weights: PackedB },
}

/// How the indirect micro-kernel's segments cover a receptive field.
#[derive(Clone, Copy)]
enum Gather {
    /// One segment per kernel tap: a run of a group's channels, padding read as zeros.
    Taps,
    /// One segment per kernel row, in an input copied with its padding, `width` pixels
    /// wide.
    Rows { width: usize },
}

/// A convolution layer in NHWC prepared for repeated runs.
pub struct Conv2dNhwc {
    p: Conv2dParams,
    out: [usize; 2],
    gemm: Gemm,
    algo: Algo,
    bias: Vec<f32>,
    activation: Activation,
    /// A row of zeros (one group's input channels), the padding of the indirect kernel.
    zero: Vec<f32>,
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
        let rows = cig < MIN_INDIRECT_DEPTH
            && p.groups == 1
            && p.dilation[1] == 1
            && arch::has_indirect(gemm.isa());
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
            match packed.pop() {
                Some(weights) if rows && packed.is_empty() => Algo::Rows { weights },
                last => {
                    packed.extend(last);
                    Algo::Gemm {
                        weights: packed,
                        pointwise,
                    }
                }
            }
        };
        Ok(Self {
            p,
            out,
            gemm,
            algo,
            bias,
            activation,
            zero: vec![0.0; cig],
        })
    }

    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        let w = match &self.algo {
            Algo::Gemm { weights, .. } => weights.iter().map(PackedB::bytes).sum(),
            Algo::Depthwise { weights } => weights.len() * 4,
            Algo::Rows { weights } => weights.bytes(),
        };
        w + (self.bias.len() + self.zero.len()) * 4
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
            Algo::Rows { .. } => "rows",
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
        match &self.algo {
            Algo::Gemm { .. } if self.indirect() => Ok(0),
            Algo::Gemm { .. } => self.gemm.scratch_len(n, cog, k, false, true, threads),
            Algo::Depthwise { .. } => Ok(0),
            // One image with its padding.
            Algo::Rows { .. } => {
                let p = &self.p;
                let h = p.input[0] + p.padding[0] + p.padding[2];
                let w = p.input[1] + p.padding[1] + p.padding[3];
                error::mul(
                    error::mul(h, w, "padded input")?,
                    p.in_channels,
                    "padded input",
                )
            }
        }
    }

    /// Scratch (f32 elements) [`Conv2dNhwc::run_nchw`] needs for `batch` images.
    pub fn nchw_scratch_len(&self, batch: usize, threads: usize) -> Result<usize> {
        let own = self.scratch_len(threads)?;
        match self.algo {
            Algo::Rows { .. } => Ok(own),
            _ => error::add(own, self.io_len(batch)?.0, "scratch"),
        }
    }

    /// Like [`Conv2dNhwc::run`] with the input in NCHW (the output is NHWC): the first
    /// convolution of a chain reads the program's tensor as it is.
    #[allow(clippy::too_many_arguments)] // `run`'s arguments
    pub fn run_nchw(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        residual: Option<&[f32]>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        if let Algo::Rows { .. } = self.algo {
            return self.run_inner(pool, input, true, batch, residual, output, scratch);
        }
        let x_len = self.io_len(batch)?.0;
        error::need("convolution input", input.len(), x_len)?;
        let len = scratch.len();
        let needed = self.nchw_scratch_len(batch, pool.threads())?;
        let (x, rest) = scratch
            .get_mut(..needed)
            .ok_or(Error::ScratchTooSmall { len, needed })?
            .split_at_mut(x_len);
        let p = &self.p;
        crate::layout::nchw_to_nhwc(
            self.gemm.isa(),
            input.get(..x_len).unwrap_or_default(),
            batch,
            p.in_channels,
            p.input[0] * p.input[1],
            x,
        )?;
        self.run_inner(pool, x, false, batch, residual, output, rest)
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
        self.run_inner(pool, input, false, batch, residual, output, scratch)
    }

    /// `run`, the input in NCHW when `nchw` (only for [`Algo::Nchw`]).
    #[allow(clippy::too_many_arguments)] // `run`'s arguments and the input's layout
    fn run_inner(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        nchw: bool,
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
            Algo::Rows { weights } => {
                let (xi, yi) = self.io_len(1)?;
                let len = scratch.len();
                let needed = self.scratch_len(pool.threads())?;
                let padded = scratch
                    .get_mut(..needed)
                    .ok_or(Error::ScratchTooSmall { len, needed })?;
                let wp = p.input[1] + p.padding[1] + p.padding[3];
                let c = p.in_channels;
                for (n, (x, y)) in input
                    .chunks_exact(xi.max(1))
                    .zip(output.chunks_exact_mut(yi.max(1)))
                    .enumerate()
                    .take(batch)
                {
                    padded.fill(0.0);
                    let pixels = p.input[0] * p.input[1];
                    for iy in 0..p.input[0] {
                        let at = ((iy + p.padding[0]) * wp + p.padding[1]) * c;
                        let dst = padded.get_mut(at..at + p.input[1] * c).unwrap_or_default();
                        if nchw {
                            for (ix, px) in dst.chunks_exact_mut(c).enumerate() {
                                for (ch, v) in px.iter_mut().enumerate() {
                                    *v = x
                                        .get(ch * pixels + iy * p.input[1] + ix)
                                        .copied()
                                        .unwrap_or(0.0);
                                }
                            }
                        } else {
                            let src = x.get(iy * p.input[1] * c..(iy + 1) * p.input[1] * c);
                            dst.copy_from_slice(src.unwrap_or_default());
                        }
                    }
                    if let Some(r) = residual.and_then(|r| r.get(n * yi..(n + 1) * yi)) {
                        y.copy_from_slice(r);
                    }
                    let gather = Gather::Rows { width: wp };
                    self.run_indirect(
                        pool,
                        std::slice::from_ref(weights),
                        padded,
                        1,
                        residual.is_some(),
                        y,
                        gather,
                    )?;
                }
                Ok(())
            }
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
            Algo::Gemm { weights, .. } if self.indirect() => {
                if let Some(r) = residual.and_then(|r| r.get(..y_len)) {
                    output.copy_from_slice(r);
                }
                self.run_indirect(
                    pool,
                    weights,
                    input,
                    batch,
                    residual.is_some(),
                    output,
                    Gather::Taps,
                )
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

impl Conv2dNhwc {
    /// Whether products run on the indirect micro-kernel: where the CPU has one, and a
    /// group has enough input channels that a run of them outweighs fetching its row
    /// (a stem convolution of 3 channels packs its receptive fields instead).
    fn indirect(&self) -> bool {
        arch::has_indirect(self.gemm.isa())
    }

    /// The products on the indirect micro-kernel: tiles of `mr` output pixels × `nr`
    /// output channels, each pixel's receptive field read in place through a table of
    /// row offsets (one run of a group's input channels per kernel tap), the weights'
    /// panels streamed from cache. Rows of the output are split over the pool's
    /// threads; output channels go in blocks of panels that stay in L2.
    #[allow(clippy::too_many_arguments)] // one call site; the operands of one product
    fn run_indirect(
        &self,
        pool: &ThreadPool,
        weights: &[PackedB],
        x: &[f32],
        batch: usize,
        accumulate: bool,
        y: &mut [f32],
        gather: Gather,
    ) -> Result {
        let p = &self.p;
        let isa = self.gemm.isa();
        let (mr, nr) = isa.gemm_tile();
        let cig = p.channels_per_group().0;
        let taps = p.kernel[0] * p.kernel[1];
        let (cout, ohw) = (p.out_channels, self.out[0] * self.out[1]);
        let m = error::mul(batch, ohw, "convolution output")?;
        let ((min, max), extra) = match self.activation {
            Activation::Clamp { min, max } => ((min, max), Activation::Identity),
            a => ((f32::NEG_INFINITY, f32::INFINITY), a),
        };
        let tiles = m.div_ceil(mr);
        let work = m.saturating_mul(cout).saturating_mul(cig * taps);
        let tasks = if work < (1 << 17) {
            1
        } else {
            (pool.threads() * 3).min(tiles).max(1)
        };
        let rows_per_task = tiles.div_ceil(tasks) * mr;
        // Panels of weights per block: a block stays in L2 while tiles stream past.
        let panel_bytes = (taps * cig * nr * 4).max(1);
        let block = (L2_WEIGHTS / panel_bytes).max(1);
        let failed = std::sync::atomic::AtomicBool::new(false);
        pool.parallel_chunks(y, rows_per_task * cout, &mut [0u8; 0], 0, |task, yc, _| {
            let r0 = task * rows_per_task;
            if self
                .indirect_rows(weights, x, r0, yc, accumulate, (min, max), block, gather)
                .is_err()
            {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if extra != Activation::Identity {
                elementwise::activate(isa, yc, extra);
            }
        })?;
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::InvalidParameter {
                what: "indirect convolution failed".into(),
            });
        }
        Ok(())
    }

    /// Output rows (pixels) `r0..` into `yc` (whole rows of `out_channels`).
    #[allow(clippy::too_many_arguments)]
    fn indirect_rows(
        &self,
        weights: &[PackedB],
        x: &[f32],
        r0: usize,
        yc: &mut [f32],
        accumulate: bool,
        (min, max): (f32, f32),
        block: usize,
        gather: Gather,
    ) -> Result {
        let p = &self.p;
        let isa = self.gemm.isa();
        let (mr, nr) = isa.gemm_tile();
        let (cig, cog) = p.channels_per_group();
        // Segments of the receptive field and depths per segment.
        let (taps, k) = match gather {
            Gather::Taps => (p.kernel[0] * p.kernel[1], cig),
            Gather::Rows { .. } => (p.kernel[0], p.kernel[1] * cig),
        };
        let cout = p.out_channels;
        let rows_here = yc.len() / cout.max(1);
        let mut c = MatMut::row_major(yc, rows_here, cout)?;
        let panels = cog.div_ceil(nr);
        let ohw = self.out[0] * self.out[1];
        let image = p.input[0] * p.input[1] * p.in_channels;
        let mut offsets = [arch::ZERO_ROW; arch::MAX_SEGMENTS * 12];
        let mut padded = [0f32; 32];
        for (g, b) in weights.iter().enumerate() {
            for q0 in (0..panels).step_by(block) {
                for r in (0..rows_here).step_by(mr) {
                    let rows = mr.min(rows_here - r);
                    for t0 in (0..taps).step_by(arch::MAX_SEGMENTS) {
                        let seg = arch::MAX_SEGMENTS.min(taps - t0);
                        // The row offsets of this tile's pixels for taps t0..t0 + seg.
                        for i in 0..rows {
                            let pixel = r0 + r + i;
                            let (n, pix) = (pixel / ohw, pixel % ohw);
                            let (oy, ox) = (pix / self.out[1], pix % self.out[1]);
                            for t in 0..seg {
                                let o = match gather {
                                    Gather::Taps => {
                                        let (ky, kx) =
                                            ((t0 + t) / p.kernel[1], (t0 + t) % p.kernel[1]);
                                        let iy = (oy * p.stride[0] + ky * p.dilation[0])
                                            .checked_sub(p.padding[0])
                                            .filter(|&v| v < p.input[0]);
                                        let ix = (ox * p.stride[1] + kx * p.dilation[1])
                                            .checked_sub(p.padding[1])
                                            .filter(|&v| v < p.input[1]);
                                        match (iy, ix) {
                                            (Some(iy), Some(ix)) => {
                                                n * image
                                                    + (iy * p.input[1] + ix) * p.in_channels
                                                    + g * cig
                                            }
                                            _ => arch::ZERO_ROW,
                                        }
                                    }
                                    // The padded copy of one image: every run is inside.
                                    Gather::Rows { width } => {
                                        let iy = oy * p.stride[0] + (t0 + t) * p.dilation[0];
                                        (iy * width + ox * p.stride[1]) * p.in_channels
                                    }
                                };
                                if let Some(slot) = offsets.get_mut(t * mr + i) {
                                    *slot = o;
                                }
                            }
                        }
                        let last = t0 + seg == taps;
                        let table =
                            arch::RowTable::new(isa, x, &self.zero, &offsets, (seg, k, rows))
                                .ok_or_else(|| Error::InvalidParameter {
                                    what: "convolution input too short for its receptive fields"
                                        .into(),
                                })?;
                        for q in q0..panels.min(q0 + block) {
                            let j = g * cog + q * nr;
                            let cols = nr.min(cog - q * nr);
                            let (panel, _) = b.panels().block(q * nr, t0 * k);
                            let bias = self.bias.get(j..).unwrap_or_default();
                            let bias = if bias.len() >= nr {
                                bias
                            } else {
                                padded.iter_mut().zip(bias).for_each(|(d, &v)| *d = v);
                                &padded[..]
                            };
                            let post = last.then_some(Post {
                                bias: TileBias::Cols(bias),
                                min,
                                max,
                            });
                            let acc = accumulate || t0 > 0;
                            if cols == nr {
                                arch::indirect_microkernel(
                                    isa,
                                    &table,
                                    panel,
                                    &mut c,
                                    (r, j),
                                    acc,
                                    post.as_ref(),
                                )?;
                            } else {
                                // A partial panel of channels: through a tile buffer.
                                let mut tile = [0f32; 12 * 32];
                                let mut t = MatMut::row_major(&mut tile, rows, nr)?;
                                for i in 0..rows {
                                    if let (Some(src), Some(dst)) =
                                        (c.row_run(r + i, j, cols), t.row_run(i, 0, cols))
                                    {
                                        dst.copy_from_slice(src);
                                    }
                                }
                                arch::indirect_microkernel(
                                    isa,
                                    &table,
                                    panel,
                                    &mut t,
                                    (0, 0),
                                    acc,
                                    post.as_ref(),
                                )?;
                                for i in 0..rows {
                                    if let (Some(dst), Some(src)) =
                                        (c.row_run(r + i, j, cols), t.row_run(i, 0, cols))
                                    {
                                        dst.copy_from_slice(src);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Fewest input channels per group for the indirect micro-kernel.
const MIN_INDIRECT_DEPTH: usize = 8;

/// Bytes of packed weights a block of output channels may take (half a typical L2).
const L2_WEIGHTS: usize = 256 * 1024;

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
        if cig < MIN_INDIRECT_DEPTH {
            // A few channels per tap (a stem convolution): value by value, without a
            // call per run.
            let p = self.p;
            let [kh, kw] = p.kernel;
            for (q, panel) in dst
                .chunks_exact_mut(kc * w)
                .take(len.div_ceil(w))
                .enumerate()
            {
                let first = l0 + q * w;
                let valid = w.min(l0 + len - first);
                panel.fill(0.0);
                for l in 0..valid {
                    let pixel = first + l;
                    let (oy, ox) = (pixel / self.out[1], pixel % self.out[1]);
                    for ky in 0..kh {
                        let Some(iy) = (oy * p.stride[0] + ky * p.dilation[0])
                            .checked_sub(p.padding[0])
                            .filter(|&v| v < p.input[0])
                        else {
                            continue;
                        };
                        for kx in 0..kw {
                            let Some(ix) = (ox * p.stride[1] + kx * p.dilation[1])
                                .checked_sub(p.padding[1])
                                .filter(|&v| v < p.input[1])
                            else {
                                continue;
                            };
                            // Depths (ky, kx, 0..cig) inside this block.
                            let d0 = (ky * kw + kx) * cig;
                            if d0 + cig <= k0 || d0 >= k0 + kc {
                                continue;
                            }
                            let at = (iy * p.input[1] + ix) * p.in_channels;
                            let src = self.x.get(at..at + cig).unwrap_or_default();
                            for (ci, &v) in src.iter().enumerate() {
                                if let Some(o) = (d0 + ci)
                                    .checked_sub(k0)
                                    .filter(|&d| d < kc)
                                    .and_then(|d| panel.get_mut(d * w + l))
                                {
                                    *o = v;
                                }
                            }
                        }
                    }
                }
            }
            return;
        }
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

/// Channels of one depthwise block: one 256-bit vector, so that a 3×3 kernel's nine
/// weight vectors, the accumulator and an input vector stay in registers.
const DW: usize = 8;

/// One output row `oy` of a depthwise convolution in NHWC: for each block of [`DW`]
/// channels, the kernel's weights are held in registers while the row's pixels
/// stream past; taps in the padding are skipped.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one row's geometry and data
fn depthwise_block_row<const FMA: bool, const KH: usize, const KW: usize>(
    p: &Conv2dParams,
    ow: usize,
    x: &[f32],
    weights: &[f32],
    bias: &[f32],
    act: Activation,
    oy: usize,
    y: &mut [f32],
) {
    let c = p.out_channels;
    let w_in = p.input[1];
    let row_len = w_in * c;
    let rows: [Option<&[f32]>; KH] = std::array::from_fn(|ky| {
        (oy * p.stride[0] + ky * p.dilation[0])
            .checked_sub(p.padding[0])
            .filter(|&iy| iy < p.input[0])
            .and_then(|iy| x.get(iy * row_len..(iy + 1) * row_len))
    });
    let vec_at = |s: &[f32], at: usize| -> [f32; DW] {
        s.get(at..at + DW)
            .and_then(|v| <[f32; DW]>::try_from(v).ok())
            .unwrap_or([0.0; DW])
    };
    let mut c0 = 0;
    while c0 + DW <= c {
        let wv: [[[f32; DW]; KW]; KH] = std::array::from_fn(|ky| {
            std::array::from_fn(|kx| vec_at(weights, (ky * KW + kx) * c + c0))
        });
        let bv = vec_at(bias, c0);
        for (ox, out) in y.chunks_exact_mut(c).enumerate().take(ow) {
            let mut acc = bv;
            for (row, wrow) in rows.iter().zip(&wv) {
                let Some(row) = row else { continue };
                for (kx, w) in wrow.iter().enumerate() {
                    let Some(ix) = (ox * p.stride[1] + kx * p.dilation[1])
                        .checked_sub(p.padding[1])
                        .filter(|&ix| ix < w_in)
                    else {
                        continue;
                    };
                    let xv = vec_at(row, ix * c + c0);
                    for ((a, &xv), &wv) in acc.iter_mut().zip(&xv).zip(w) {
                        *a = madd::<FMA>(xv, wv, *a);
                    }
                }
            }
            if act != Activation::Identity {
                elementwise::bias_act::<FMA>(&mut acc, 0.0, act);
            }
            if let Some(dst) = out.get_mut(c0..c0 + DW) {
                dst.copy_from_slice(&acc);
            }
        }
        c0 += DW;
    }
    if c0 < c {
        depthwise_general::<FMA>(p, ow, x, weights, bias, act, oy, y, c0);
    }
}

/// Any kernel size, channels `from..`: one pixel and one channel at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one row's geometry and data
fn depthwise_general<const FMA: bool>(
    p: &Conv2dParams,
    ow: usize,
    x: &[f32],
    weights: &[f32],
    bias: &[f32],
    act: Activation,
    oy: usize,
    y: &mut [f32],
    from: usize,
) {
    let c = p.out_channels;
    let ([h, w], [kh, kw]) = (p.input, p.kernel);
    for (ox, out) in y.chunks_exact_mut(c).enumerate().take(ow) {
        for (ch, o) in out.iter_mut().enumerate().skip(from) {
            let mut acc = bias.get(ch).copied().unwrap_or(0.0);
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
                    let xv = x.get((iy * w + ix) * c + ch).copied().unwrap_or(0.0);
                    let wv = weights.get((ky * kw + kx) * c + ch).copied().unwrap_or(0.0);
                    acc = madd::<FMA>(xv, wv, acc);
                }
            }
            *o = crate::elementwise::act::<FMA>(act, acc);
        }
    }
}

multiversion! {
    /// One output row `oy` of a depthwise convolution in NHWC, compiled loops.
    fn depthwise_compiled<const FMA: bool>(p: &Conv2dParams, out: [usize; 2], x: &[f32], weights: &[f32], bias: &[f32], act: Activation, oy: usize, y: &mut [f32]) -> Result {
        let need = p.input[0] * p.input[1] * p.in_channels;
        if x.len() < need || weights.len() < p.kernel[0] * p.kernel[1] * p.out_channels {
            return Err(Error::InvalidParameter { what: "depthwise input too short".into() });
        }
        match p.kernel {
            [3, 3] => depthwise_block_row::<FMA, 3, 3>(p, out[1], x, weights, bias, act, oy, y),
            [5, 5] => depthwise_block_row::<FMA, 5, 5>(p, out[1], x, weights, bias, act, oy, y),
            _ => depthwise_general::<FMA>(p, out[1], x, weights, bias, act, oy, y, 0),
        }
        Ok(())
    }
}

/// One output row of a depthwise convolution: the hand-written 3×3 kernel where there
/// is one (channels in blocks of eight, a clamp fused), else the compiled loops.
#[allow(clippy::too_many_arguments)] // one row's geometry and data
fn depthwise_row(
    isa: Isa,
    p: &Conv2dParams,
    out: [usize; 2],
    x: &[f32],
    weights: &[f32],
    bias: &[f32],
    act: Activation,
    oy: usize,
    y: &mut [f32],
) -> Result {
    let c = p.out_channels;
    if p.kernel == [3, 3] && c >= 8 {
        let row_len = p.input[1] * c;
        let rows: [Option<&[f32]>; 3] = std::array::from_fn(|ky| {
            (oy * p.stride[0] + ky * p.dilation[0])
                .checked_sub(p.padding[0])
                .filter(|&iy| iy < p.input[0])
                .and_then(|iy| x.get(iy * row_len..(iy + 1) * row_len))
        });
        let (clamp, rest) = match act {
            Activation::Clamp { min, max } => ((min, max), Activation::Identity),
            a => ((f32::NEG_INFINITY, f32::INFINITY), a),
        };
        let geometry = (
            c,
            out[1],
            p.input[1],
            p.stride[1],
            p.dilation[1],
            p.padding[1],
        );
        if crate::arch::depthwise3x3_row(isa, rows, weights, bias, y, geometry, clamp) {
            let done = c / 8 * 8;
            if done < c {
                depthwise_tail(isa, p, out, x, weights, bias, act, oy, y, done);
            }
            if rest != Activation::Identity {
                for px in y.chunks_exact_mut(c).take(out[1]) {
                    elementwise::activate(isa, px.get_mut(..done).unwrap_or_default(), rest);
                }
            }
            return Ok(());
        }
    }
    depthwise_compiled(isa, p, out, x, weights, bias, act, oy, y)
}

multiversion! {
    /// Channels `from..` of one output row (after the hand-written kernel).
    fn depthwise_tail<const FMA: bool>(p: &Conv2dParams, out: [usize; 2], x: &[f32], weights: &[f32], bias: &[f32], act: Activation, oy: usize, y: &mut [f32], from: usize) {
        depthwise_general::<FMA>(p, out[1], x, weights, bias, act, oy, y, from);
    }
}
