//! NHWC 2-D convolution prepared once per layer (see the module docs of
//! [`crate::nhwc`]): indirect products for regular convolutions, a direct loop over
//! channel blocks for depthwise ones, residual and activation fused.

use crate::arch::{
    self, depthwise_pixels, even_tiles, indirect_microkernel, IndirectRows, Isa, PanelRun,
    PixelTaps, Post, TileBias, INDIRECT_TAPS,
};
use crate::conv::{bias_or_zeros, Conv2dParams, ConvWeights, WeightLayout};
use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Gemm, PackedB, L2_PANEL_BYTES};
use crate::layout::interleave_lines;
use crate::mat::{MatMut, MatRef, MAX_PARTS};
use crate::pool::FirstError;
use crate::pool::ThreadPool;
use pte_alloc::Staging;

mod grouped;
mod winograd;

use grouped::Grouped;
use winograd::{Variant, Winograd};

enum Algo {
    /// One product per group, weights packed as `K × c_out/groups`, K ordered (kernel
    /// tap, input channel); `pointwise`: each output pixel reads one input pixel.
    Gemm {
        weights: Vec<PackedB>,
        pointwise: bool,
    },
    /// Weights as `[kh·kw][channels]`.
    Depthwise { weights: Vec<f32> },
    /// A 3×3 stride-1 convolution by Winograd's minimal filtering ([`winograd`]).
    Winograd(Winograd),
    /// A few input channels and no horizontal dilation (a network's stem): the input
    /// is copied with its padding, so that a whole kernel row of a pixel's receptive
    /// field is one run of `kw · c_in` values for the indirect micro-kernel.
    Rows { weights: PackedB },
    /// Few output channels per group: blocks of groups on the interleaved kernel
    /// ([`grouped`]).
    Grouped(Grouped),
}

/// How the indirect micro-kernel's segments cover a receptive field.
#[derive(Clone, Copy)]
enum Gather {
    /// A pointwise convolution: one segment, the output pixel's own input pixel.
    Pixel,
    /// One segment per kernel tap: a run of a group's channels, padding read as zeros.
    Taps,
    /// One segment per kernel row, in an input copied with its padding, `width` pixels
    /// wide.
    Rows { width: usize },
}

/// A 2-D convolution on NHWC images prepared for repeated runs.
pub struct ConvNhwc {
    p: Conv2dParams,
    out: [usize; 2],
    gemm: Gemm,
    algo: Algo,
    bias: Vec<f32>,
    activation: Activation,
    /// A row of zeros as long as a pixel's channels: what taps in the padding read
    /// (a block of groups' channels at once).
    zero: Vec<f32>,
    /// The indirect kernel may skip a tap that reads only padding: the convolution
    /// is padded and every weight is finite (else PyTorch's zero times infinity
    /// gives NaN). The weights as given, before a folded per-channel factor: PyTorch
    /// applies batch normalization to the sum, after the padding was multiplied.
    /// Not scanned for the other algorithms, which never skip a tap (reading all a
    /// network's weights once more from memory took 2-4 ms of a load).
    finite: bool,
}

impl std::fmt::Debug for ConvNhwc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvNhwc")
            .field("params", &self.p)
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

impl ConvNhwc {
    /// Prepares a convolution of geometry `p` with `weights`, an optional bias per
    /// output channel, and an activation applied after the bias (and residual); large
    /// weights are packed on the threads of `pool`, rearranged first in temporaries
    /// from `staging`. Runs of `weights.data()` whose values are packed are handed to
    /// `consumed` as soon as they are (a slab of output channels at a time, for the
    /// layers packed for a product), so that a caller reading them from a mapped file
    /// can give their pages back before the rest is packed.
    #[allow(clippy::too_many_arguments)] // the layer, and what preparing it may use
    pub fn new(
        pool: &ThreadPool,
        staging: &Staging,
        gemm: Gemm,
        p: Conv2dParams,
        weights: ConvWeights<'_>,
        bias: Option<&[f32]>,
        activation: Activation,
        consumed: &mut dyn FnMut(&[f32]),
    ) -> Result<Self> {
        let trimmed = crate::conv::trim_padding_taps(&p, &weights)?;
        // Whether the weights are finite matters to padded layers alone (see
        // `finite`), checked slab by slab as they are packed: read again afterwards, a
        // large weight given back slab by slab would be mapped in whole once more.
        let padded = p.padding != [0; 4];
        let (mut scanned, mut finite) = (0, true);
        let mut report = |part: &[f32]| {
            if padded {
                finite &= crate::conv::all_finite(part);
                scanned += part.len();
            }
            // Values of a trimmed copy are not the caller's.
            if trimmed.is_none() {
                consumed(part);
            }
        };
        let (p, weights) = match &trimmed {
            Some((q, kept)) => (*q, weights.with_data(kept)),
            None => (p, weights),
        };
        let out = p.output()?;
        let (cig, cog) = p.channels_per_group();
        let (taps, k) = weights.check(&p)?;
        let bias = bias_or_zeros(bias, p.out_channels)?;
        let cout = p.out_channels;
        let depthwise = cig == 1 && cog == 1 && p.groups > 1;
        let algo = if let Some(variant) = Variant::choose(&p, out) {
            let weight = |o, t, i| weights.at((o, t, i), taps, cig, cout);
            Algo::Winograd(Winograd::new(&gemm, pool, &p, variant, weight)?)
        } else if depthwise {
            // [tap][channel], allocated once (a flattened iterator's collect grows).
            let mut arranged = Vec::with_capacity(weights.data().len());
            for t in 0..taps {
                arranged.extend((0..cout).map(|o| weights.at((o, t, 0), taps, 1, cout)));
            }
            Algo::Depthwise { weights: arranged }
        } else if Grouped::applies(gemm.isa(), &p) {
            Algo::Grouped(Grouped::new(gemm.isa(), &p, &weights)?)
        } else {
            let mut packed = Vec::with_capacity(p.groups);
            for g in 0..p.groups {
                // B is K × cog, K ordered (tap, input channel): packed from the stored
                // weights when each output channel's are one such run, else from a
                // reordered copy.
                let group = g * cog * k..(g + 1) * cog * k;
                let mut b = match (
                    weights.channel_runs(g * cog, cog, k, taps),
                    weights.layout(),
                ) {
                    (Some(runs), _) => gemm.pack_bt_on(pool, runs, cog, k, &mut report)?,
                    (None, WeightLayout::Oihw) => {
                        // Each output channel's [cig][taps] to [taps][cig] (runs again),
                        // a slab of channels at a time.
                        let stored = weights.data().get(group).unwrap_or_default();
                        let mut slabs = gemm.slabs_b(pool, k, cog)?;
                        let most = slabs.next_columns().map_or(0, |c| c.len() * k);
                        let mut reordered = error::staged(staging, most, "reordered weights")?;
                        while let Some(cols) = slabs.next_columns() {
                            let part = stored.get(cols.start * k..cols.end * k);
                            let temp = reordered.get_mut(..cols.len() * k);
                            let (Some(part), Some(temp)) = (part, temp) else {
                                return Err(Error::ShapeMismatch {
                                    what: format!("{} weights for {cog} × {k}", stored.len()),
                                });
                            };
                            crate::layout::transpose(pool, part, cols.len(), cig, taps, temp)?;
                            slabs.pack(MatRef::row_major(temp, cols.len(), k)?)?;
                            report(part);
                        }
                        slabs.finish()?
                    }
                    (None, _) => {
                        let mut reordered = error::staged(staging, k * cog, "reordered weights")?;
                        for (d, row) in reordered.chunks_exact_mut(cog.max(1)).enumerate() {
                            let (t, i) = (d / cig, d % cig);
                            for (co, v) in row.iter_mut().enumerate() {
                                *v = weights.raw((g * cog + co, t, i), taps, cig, cout);
                            }
                        }
                        gemm.pack_b_on(pool, MatRef::row_major(&reordered, k, cog)?)?
                    }
                };
                if let Some(s) = weights.scale() {
                    b.scale_columns(s.get(g * cog..(g + 1) * cog).unwrap_or_default())?;
                }
                packed.push(b);
            }
            let pointwise = p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == [0; 4];
            let rows = cig < MIN_SEGMENT && p.groups == 1 && p.dilation[1] == 1 && !pointwise;
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
        let finite = matches!(
            algo,
            Algo::Gemm {
                pointwise: false,
                ..
            } | Algo::Rows { .. }
        ) && p.padding != [0; 4]
            && if scanned == weights.data().len() {
                finite
            } else {
                crate::conv::all_finite(weights.data())
            };
        Ok(Self {
            p,
            out,
            gemm,
            algo,
            bias,
            activation,
            zero: vec![0.0; p.in_channels],
            finite,
        })
    }

    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        let w = match &self.algo {
            Algo::Gemm { weights, .. } => weights.iter().map(PackedB::bytes).sum(),
            Algo::Depthwise { weights } => weights.len() * 4,
            Algo::Rows { weights } => weights.bytes(),
            Algo::Winograd(w) => w.bytes(),
            Algo::Grouped(g) => g.bytes(),
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

    /// "pointwise", "indirect", "depthwise", "rows", "grouped", "winograd-2x2" or
    /// "winograd-4x4".
    pub fn algorithm(&self) -> &'static str {
        match &self.algo {
            Algo::Gemm {
                pointwise: true, ..
            } => "pointwise",
            Algo::Gemm { .. } => "indirect",
            Algo::Depthwise { .. } => "depthwise",
            Algo::Rows { .. } => "rows",
            Algo::Grouped(g) if g.reads_in_place() => "grouped-in-place",
            Algo::Grouped(_) => "grouped",
            Algo::Winograd(w) => w.name(),
        }
    }

    /// Elements of the input and output of a batch of `batch` images.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        self.p.io_len(batch)
    }

    /// Scratch (f32 elements) a run on a pool of `threads` threads needs.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        match &self.algo {
            Algo::Gemm { .. } | Algo::Depthwise { .. } => Ok(0),
            Algo::Winograd(w) => w.scratch_len(&self.gemm, &self.p, threads),
            Algo::Grouped(g) => g.scratch_len(threads, self.p.out_channels),
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

    /// Scratch (f32 elements) [`ConvNhwc::run_nchw`] needs for `batch` images on
    /// `threads` threads.
    pub fn nchw_scratch_len(&self, batch: usize, threads: usize) -> Result<usize> {
        let own = self.scratch_len(threads)?;
        match self.algo {
            Algo::Rows { .. } => Ok(own),
            _ => error::add(own, self.io_len(batch)?.0, "scratch"),
        }
    }

    /// Like [`ConvNhwc::run`] with the input in NCHW (the output is NHWC): the first
    /// convolution of a chain reads the program's tensor as it is.
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
        crate::layout::transpose(
            pool,
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

    /// `run`, the input in NCHW when `nchw` (only for [`Algo::Rows`], which copies it).
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
        let residual = residual.and_then(|r| r.get(..y_len));
        let p = &self.p;
        match &self.algo {
            Algo::Rows { weights } => {
                let (xi, yi) = self.io_len(1)?;
                let len = scratch.len();
                let needed = self.scratch_len(1)?;
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
                    let pixels = p.input[0] * p.input[1];
                    let [top, left] = [p.padding[0], p.padding[1]];
                    // Padding is zeroed and the image copied in, each value once, rows
                    // on the pool's threads.
                    let mut none = [0u8; 0];
                    pool.parallel_chunks(padded, (wp * c).max(1), &mut none, 0, |py, row, _| {
                        let Some(iy) = py.checked_sub(top).filter(|&iy| iy < p.input[0]) else {
                            row.fill(0.0);
                            return;
                        };
                        let (pad, rest) = row.split_at_mut(left * c);
                        pad.fill(0.0);
                        let (dst, pad) = rest.split_at_mut(p.input[1] * c);
                        pad.fill(0.0);
                        if nchw {
                            let line = |ch: usize| {
                                let at = ch * pixels + iy * p.input[1];
                                x.get(at..at + p.input[1]).unwrap_or_default()
                            };
                            // An image's 1 to 4 channels (RGB, grey) interleave in
                            // register shuffles (value by value, mobilenet_v3_large's
                            // stem took 0.25 ms in the network, now 0.22).
                            match c {
                                1 => interleave_lines([line(0)], dst),
                                2 => interleave_lines([line(0), line(1)], dst),
                                3 => interleave_lines([line(0), line(1), line(2)], dst),
                                4 => interleave_lines([line(0), line(1), line(2), line(3)], dst),
                                _ => {
                                    for ch in 0..c {
                                        let src = line(ch);
                                        for (d, &v) in dst.iter_mut().skip(ch).step_by(c).zip(src) {
                                            *d = v;
                                        }
                                    }
                                }
                            }
                        } else {
                            let src = x.get(iy * p.input[1] * c..(iy + 1) * p.input[1] * c);
                            for (d, &v) in dst.iter_mut().zip(src.unwrap_or_default()) {
                                *d = v;
                            }
                        }
                    })?;
                    let gather = Gather::Rows { width: wp };
                    self.run_indirect(
                        pool,
                        std::slice::from_ref(weights),
                        padded,
                        1,
                        residual.map(|r| r.get(n * yi..(n + 1) * yi).unwrap_or_default()),
                        y,
                        gather,
                    )?;
                }
                Ok(())
            }
            Algo::Depthwise { weights } => {
                self.run_depthwise(pool, input, weights, residual, output)
            }
            Algo::Winograd(w) => {
                self.run_winograd(w, pool, input, batch, residual, output, scratch)
            }
            Algo::Grouped(g) => {
                if let Some(r) = residual {
                    output.copy_from_slice(r);
                }
                let (clamp, rest) = self.clamp_and_rest(residual.is_some());
                let x = input.get(..x_len).unwrap_or_default();
                let epilogue = (clamp, rest, residual.is_some());
                let io = (x, output, scratch);
                g.run(pool, self.isa(), p, io, &self.bias, epilogue)
            }
            Algo::Gemm { weights, pointwise } => {
                // Without padding and with each kernel row one run of input (a strided
                // 1×1 projection, say), a tile's pixels in an output row are a fixed
                // distance apart in the input itself: they are read in place, one
                // image at a time, as from a padded copy, rather than listed tile by
                // tile (regnet's 32-channel 1×1 stride-2 layer: 69 → 93 GFLOP/s).
                if !*pointwise && p.groups == 1 && p.padding == [0; 4] && p.dilation[1] == 1 {
                    let (xi, yi) = self.io_len(1)?;
                    let gather = Gather::Rows { width: p.input[1] };
                    for (n, (x, y)) in input
                        .chunks_exact(xi.max(1))
                        .zip(output.chunks_exact_mut(yi.max(1)))
                        .enumerate()
                    {
                        let r = residual.map(|r| r.get(n * yi..(n + 1) * yi).unwrap_or_default());
                        self.run_indirect(pool, weights, x, 1, r, y, gather)?;
                    }
                    return Ok(());
                }
                let gather = if *pointwise {
                    Gather::Pixel
                } else {
                    Gather::Taps
                };
                self.run_indirect(pool, weights, input, batch, residual, output, gather)
            }
        }
    }

    /// The clamp fused in the kernels' stores and the activation that follows them:
    /// a clamp is fused unless a residual comes before it.
    fn clamp_and_rest(&self, residual: bool) -> ((f32, f32), Activation) {
        match self.activation {
            Activation::Clamp { min, max } if !residual => ((min, max), Activation::Identity),
            a => ((f32::NEG_INFINITY, f32::INFINITY), a),
        }
    }

    /// A depthwise convolution, rows of the output split over the pool's threads.
    fn run_depthwise(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        weights: &[f32],
        residual: Option<&[f32]>,
        output: &mut [f32],
    ) -> Result {
        let p = &self.p;
        let isa = self.gemm.isa();
        let (clamp, rest) = self.clamp_and_rest(residual.is_some());
        let row = self.out[1] * p.out_channels;
        let image = p.input[0] * p.input[1] * p.in_channels;
        let failed = FirstError::default();
        let row_len = p.input[1] * p.in_channels;
        pool.parallel_chunks(output, row, &mut [0u8; 0], 0, |r, y, _| {
            let (n, oy) = (r / self.out[0], r % self.out[0]);
            let x = input.get(n * image..(n + 1) * image).unwrap_or_default();
            let rows = |iy: usize| x.get(iy * row_len..(iy + 1) * row_len);
            let rest = if residual.is_none() {
                rest
            } else {
                Activation::Identity
            };
            failed.keep(self.depthwise_output_row(isa, &rows, weights, clamp, rest, oy, y));
        })?;
        failed.into_result()?;
        if let Some(r) = residual {
            elementwise::add_vector_activate(isa, output, r, self.activation)?;
        }
        Ok(())
    }

    /// Output row `oy` of a depthwise convolution, clamped, then `rest` applied; input
    /// row `iy` is `rows(iy)`.
    #[allow(clippy::too_many_arguments)] // one row's operands and epilogue
    fn depthwise_output_row<'x>(
        &self,
        isa: Isa,
        rows: &impl Fn(usize) -> Option<&'x [f32]>,
        weights: &[f32],
        clamp: (f32, f32),
        rest: Activation,
        oy: usize,
        y: &mut [f32],
    ) -> Result {
        self.depthwise_row(isa, rows, weights, clamp, oy, y)?;
        if rest != Activation::Identity {
            elementwise::activate(isa, y, rest);
        }
        Ok(())
    }

    /// Output row `oy` of a K×K depthwise convolution on the hand-written row kernel;
    /// false when it does not apply (nothing is written then).
    fn depthwise_row_kernel<'x, const K: usize>(
        &self,
        isa: Isa,
        source: &impl Fn(usize) -> Option<&'x [f32]>,
        weights: &[f32],
        clamp: (f32, f32),
        oy: usize,
        out_row: &mut [f32],
    ) -> bool {
        let p = &self.p;
        let rows: [Option<&[f32]>; K] = std::array::from_fn(|ky| {
            (oy * p.stride[0] + ky * p.dilation[0])
                .checked_sub(p.padding[0])
                .filter(|&iy| iy < p.input[0])
                .and_then(source)
        });
        let geometry = (
            p.out_channels,
            self.out[1],
            p.input[1],
            p.stride[1],
            p.dilation[1],
            p.padding[1],
        );
        arch::depthwise_row(isa, rows, weights, &self.bias, out_row, geometry, clamp)
    }

    /// One output row `oy` of a depthwise convolution: the hand-written 3×3 or 5×5
    /// row kernel (measured faster than the general kernel at every width from 7) on
    /// 8 channels or more, in whole blocks of eight and the last eight again
    /// (shufflenet's 58 and 116 channels ran on the general kernel, its taps gathered
    /// pixel by pixel: 2.3× the time of the blocked row; then with the channels past
    /// the blocks one at a time, still 3×); other windows as runs of pixels, each with
    /// one input row per tap (the zero row for padding), through the channel-blocked
    /// kernel.
    fn depthwise_row<'x>(
        &self,
        isa: Isa,
        source: &impl Fn(usize) -> Option<&'x [f32]>,
        weights: &[f32],
        (min, max): (f32, f32),
        oy: usize,
        out_row: &mut [f32],
    ) -> Result {
        let p = &self.p;
        let c = p.out_channels;
        let [kh, kw] = p.kernel;
        let [ih, iw] = p.input;
        if kh == kw && c >= 8 {
            let done = match kh {
                3 => self.depthwise_row_kernel::<3>(isa, source, weights, (min, max), oy, out_row),
                5 => self.depthwise_row_kernel::<5>(isa, source, weights, (min, max), oy, out_row),
                _ => false,
            };
            if done {
                return Ok(());
            }
        }
        let total = kh * kw;
        let zero = self.zero.get(..c).unwrap_or_default();
        // The input pixel of tap t for output column ox.
        let tap = |ox: usize, t: usize| -> &[f32] {
            let iy = (oy * p.stride[0] + (t / kw) * p.dilation[0])
                .checked_sub(p.padding[0])
                .filter(|&v| v < ih);
            let ix = (ox * p.stride[1] + (t % kw) * p.dilation[1])
                .checked_sub(p.padding[1])
                .filter(|&v| v < iw);
            match (iy.and_then(source), ix) {
                (Some(row), Some(ix)) => row.get(ix * c..(ix + 1) * c).unwrap_or(zero),
                _ => zero,
            }
        };
        const SLOTS: usize = 256;
        let mut a: [&[f32]; SLOTS] = [&[]; SLOTS];
        if total <= INDIRECT_TAPS {
            let run = (SLOTS / total.max(1)).clamp(1, 8);
            for (r, outs) in out_row.chunks_mut(run * c).enumerate() {
                let pixels = outs.len() / c.max(1);
                for px in 0..pixels {
                    for t in 0..total {
                        if let Some(slot) = a.get_mut(px * total + t) {
                            *slot = tap(r * run + px, t);
                        }
                    }
                }
                let taps = PixelTaps::new(&a, pixels, total, c)?;
                depthwise_pixels(isa, &taps, weights, &self.bias, outs, true, true, min, max)?;
            }
            return Ok(());
        }
        // Large windows: passes of INDIRECT_TAPS taps, accumulating in the output.
        for (ox, out) in out_row.chunks_exact_mut(c).enumerate() {
            for t0 in (0..total).step_by(INDIRECT_TAPS) {
                let nt = INDIRECT_TAPS.min(total - t0);
                for (t, slot) in a.iter_mut().take(nt).enumerate() {
                    *slot = tap(ox, t0 + t);
                }
                let taps = PixelTaps::new(&a, 1, nt, c)?;
                let w = weights.get(t0 * c..).unwrap_or_default();
                let (first, last) = (t0 == 0, t0 + nt == total);
                depthwise_pixels(isa, &taps, w, &self.bias, out, first, last, min, max)?;
            }
        }
        Ok(())
    }

    /// The products on the indirect micro-kernel: tiles of `mr` output pixels × `nr`
    /// output channels, each pixel's receptive field read in place through a list of
    /// rows (one run of a group's input channels per kernel tap, or per kernel row for
    /// [`Gather::Rows`]), the weights' panels streamed from cache in blocks that stay
    /// in L2 while the row tiles pass. Threads split the output's rows, or its
    /// channels when the weights are the larger operand ([`Self::splits_channels`]).
    /// With a `residual` (as long as `y`), each task first copies its part of it into
    /// its part of `y`, and its products add to it: the copy runs on every thread, and
    /// leaves what the products read in cache.
    #[allow(clippy::too_many_arguments)] // one product's operands and how to read them
    fn run_indirect(
        &self,
        pool: &ThreadPool,
        weights: &[PackedB],
        x: &[f32],
        batch: usize,
        residual: Option<&[f32]>,
        y: &mut [f32],
        gather: Gather,
    ) -> Result {
        let accumulate = residual.is_some();
        let p = &self.p;
        let (mr, nr) = self.gemm.isa().gemm_tile();
        let cig = p.channels_per_group().0;
        let taps = p.kernel[0] * p.kernel[1];
        let (cout, ohw) = (p.out_channels, self.out[0] * self.out[1]);
        let m = error::mul(batch, ohw, "convolution output")?;
        let epilogue = self.clamp_and_rest(false);
        let work = m.saturating_mul(cout).saturating_mul(cig * taps);
        let threads = if work < (1 << 17) { 1 } else { pool.threads() };
        let block = self.panel_block();
        let failed = FirstError::default();
        if self.splits_channels(weights, x.len(), threads) {
            let panels = cout.div_ceil(nr);
            let tasks = (threads * TASKS_PER_THREAD).min(MAX_PARTS).min(panels);
            let per_task = panels.div_ceil(tasks.max(1));
            let tasks = panels.div_ceil(per_task.max(1));
            // Channel tasks the threads cannot share evenly are cut by rows too, one
            // band per thread: inception's 160 channels are 5 panels, which went to
            // two threads as 3 and 2 (7×1 at 12 × 12: 0.48 ms on one thread, 0.30 on
            // two).
            let bands = if tasks % threads != 0 && tasks * threads <= MAX_PARTS {
                threads
            } else {
                1
            };
            let band = m.div_ceil(mr).div_ceil(bands) * mr;
            let parts = MatMut::row_major(y, m, cout)?.into_grid(band, per_task * nr);
            pool.parallel_for(tasks * bands, |u, _| {
                let (b, t) = (u / tasks, u % tasks);
                let cols = t * per_task..((t + 1) * per_task).min(panels);
                if let Some(mut c) = parts.take(u) {
                    let (r0, j0, width) = (b * band, t * per_task * nr, c.cols());
                    if let Some(r) = residual {
                        for i in 0..c.rows() {
                            let at = (r0 + i) * cout + j0;
                            let src = r.get(at..at + width);
                            if let (Some(dst), Some(src)) = (c.row_run(i, 0, width), src) {
                                dst.copy_from_slice(src);
                            }
                        }
                    }
                    let run = (x, r0, accumulate, epilogue, block, gather);
                    failed.keep(self.indirect_rows(weights, run, c, cols));
                }
            });
            return failed.into_result();
        }
        // Tasks of a few row tiles, even on one thread: a task's input rows stay in
        // L2 while its blocks of panels pass.
        let tiles = m.div_ceil(mr);
        let tasks = if work < (1 << 17) {
            1
        } else {
            (threads * TASKS_PER_THREAD).min(tiles).max(1)
        };
        let rows_per_task = tiles.div_ceil(tasks) * mr;
        let panels = 0..p.channels_per_group().1.div_ceil(nr);
        pool.parallel_chunks(y, rows_per_task * cout, &mut [0u8; 0], 0, |task, yc, _| {
            let at = task * rows_per_task * cout;
            if let Some(r) = residual.and_then(|r| r.get(at..at + yc.len())) {
                yc.copy_from_slice(r);
            }
            let rows = yc.len() / cout.max(1);
            let c = MatMut::row_major(yc, rows, cout);
            let run = (x, task * rows_per_task, accumulate, epilogue, block, gather);
            failed.keep(c.and_then(|c| self.indirect_rows(weights, run, c, panels.clone())));
        })?;
        failed.into_result()
    }

    /// Whether threads split the output channels rather than the rows: when the
    /// weights (one group) outgrow L2 and the input is smaller than them, a split by
    /// rows would stream every weight from memory once per task, a split by channels
    /// streams each once and re-reads the smaller input per task. Each thread gets two
    /// panels at least.
    fn splits_channels(&self, weights: &[PackedB], input_len: usize, threads: usize) -> bool {
        let [b] = weights else { return false };
        let (b, x) = (b.bytes(), input_len.saturating_mul(4));
        let panels = self.p.out_channels.div_ceil(self.gemm.isa().gemm_tile().1);
        b > 2 * L2_PANEL_BYTES && x < b && (threads == 1 || panels >= 2 * threads)
    }

    /// Panels of weights per block: a block stays in L2 while tiles stream past.
    fn panel_block(&self) -> usize {
        let p = &self.p;
        let nr = self.gemm.isa().gemm_tile().1;
        let panel_bytes = (p.kernel[0] * p.kernel[1] * p.channels_per_group().0 * nr * 4).max(1);
        (L2_PANEL_BYTES / panel_bytes).max(1)
    }

    /// The instruction set the convolution's kernels use.
    pub(crate) fn isa(&self) -> Isa {
        self.gemm.isa()
    }

    /// Whether this is a 1×1 stride-1 convolution run as a product over pixels.
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self.algo,
            Algo::Gemm {
                pointwise: true,
                ..
            }
        )
    }

    /// Whether this is a depthwise convolution (one channel per group).
    pub fn is_depthwise(&self) -> bool {
        matches!(self.algo, Algo::Depthwise { .. })
    }

    /// Output row `oy` of a depthwise convolution with no residual into `y`, input row
    /// `iy` read as `rows(iy)` (None: padding), on the calling thread.
    pub(crate) fn depthwise_row_from<'x>(
        &self,
        rows: &impl Fn(usize) -> Option<&'x [f32]>,
        oy: usize,
        y: &mut [f32],
    ) -> Result {
        let Algo::Depthwise { weights } = &self.algo else {
            return Err(Error::InvalidParameter {
                what: format!("{} convolution run as a depthwise row", self.algorithm()),
            });
        };
        error::need(
            "depthwise output row",
            y.len(),
            self.out[1] * self.p.out_channels,
        )?;
        let (clamp, rest) = self.clamp_and_rest(false);
        let isa = self.gemm.isa();
        self.depthwise_output_row(isa, rows, weights, clamp, rest, oy, y)
    }

    /// A pointwise convolution's output pixels `first..` of the batch into `out`
    /// (whole pixels of `out_channels`), reading the input `x` of the whole batch, on
    /// the calling thread; `out` (+)= with `accumulate`, then bias and activation.
    pub(crate) fn pointwise_pixels(
        &self,
        x: &[f32],
        first: usize,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result {
        let Algo::Gemm {
            weights,
            pointwise: true,
        } = &self.algo
        else {
            return Err(Error::InvalidParameter {
                what: format!("{} convolution run over pixels", self.algorithm()),
            });
        };
        let end = out.len() / self.p.out_channels.max(1) * self.p.in_channels;
        error::need("pointwise input", x.len(), first * self.p.in_channels + end)?;
        let epilogue = self.clamp_and_rest(false);
        let run = (
            x,
            first,
            accumulate,
            epilogue,
            self.panel_block(),
            Gather::Pixel,
        );
        let c = MatMut::row_major(
            out,
            out.len() / self.p.out_channels.max(1),
            self.p.out_channels,
        )?;
        let panels = self.p.out_channels.div_ceil(self.gemm.isa().gemm_tile().1);
        self.indirect_rows(weights, run, c, 0..panels)
    }

    /// Output rows (pixels) `r0..` into `c` (rows of the output from `r0`, its
    /// columns from panel `cols.start` of each group), for panels `cols` of the
    /// groups; the clamp is fused in the micro-kernel's stores, the activation `rest`
    /// applied to each tile of rows once its last panel is stored, while the rows are
    /// still in cache.
    fn indirect_rows(
        &self,
        weights: &[PackedB],
        (x, r0, accumulate, ((min, max), rest), block, gather): IndirectRun<'_>,
        mut c: MatMut<'_>,
        cols: std::ops::Range<usize>,
    ) -> Result {
        let p = &self.p;
        let isa = self.gemm.isa();
        let (mr, nr) = isa.gemm_tile();
        let (cig, cog) = p.channels_per_group();
        // Segments of the receptive field and depths per segment.
        let (taps, k) = match gather {
            Gather::Pixel => (1, cig),
            Gather::Taps => (p.kernel[0] * p.kernel[1], cig),
            Gather::Rows { .. } => (p.kernel[0], p.kernel[1] * cig),
        };
        let rows_here = c.rows();
        // A row tile takes a block of groups whose weights stay in L2 together, so that
        // its gathering is done once for all of them and its input pixels are read
        // channel after channel. One group at a time, each over every tile, re-gathered
        // every tile per group and read a group's channels of pixels a row apart, which
        // share a few sets of L1 (resnext50's 32 groups of 16 channels at 14 × 14:
        // 0.74-0.83 ms on one thread, in blocks of 16 groups 0.56-0.58).
        let groups = weights.len();
        let group_bytes = weights.first().map_or(1, PackedB::bytes).max(1);
        let blocks = groups.div_ceil((L2_PANEL_BYTES / group_bytes).max(1));
        let inner = groups.div_ceil(blocks.max(1));
        // The gathered rows' offsets and slices, for `Gather::Taps` only: filled in
        // (12 KiB) on first use, not on every call (1×1 products in bands of a few
        // rows call here often: the fill took a tenth of their time).
        let mut lists = None;
        for go in (0..groups).step_by(inner.max(1)) {
            let block_groups = go..(go + inner).min(groups);
            for q0 in cols.clone().step_by(block) {
                let count = block.min(cols.end - q0);
                let tile = TileProduct {
                    isa,
                    cols: (q0, count, nr, cog, cols.start * nr),
                    accumulate,
                    clamp: (min, max),
                };
                // Pixels and kernel rows are read at fixed distances: one call takes a
                // strip of tiles. Gathered taps are listed tile by tile.
                let strip = match gather {
                    Gather::Pixel | Gather::Rows { .. } => STRIP_TILES * mr,
                    Gather::Taps => mr,
                };
                for (r, rows) in even_tiles(rows_here, strip, strip) {
                    for t0 in (0..taps).step_by(INDIRECT_TAPS) {
                        let seg = INDIRECT_TAPS.min(taps - t0);
                        let whole = TapRun::of(t0, seg, taps);
                        if let Gather::Pixel = gather {
                            // The tile's pixels are consecutive in the input.
                            let ch = p.in_channels;
                            for g in block_groups.clone() {
                                let Some(b) = weights.get(g) else { continue };
                                let a = x.get((r0 + r) * ch + g * cig..).unwrap_or_default();
                                let list = IndirectRows::strided(a, rows, 1, k, (ch, 0))?;
                                tile.run(&self.bias, b, &list, &mut c, (r, g * cog), whole)?;
                            }
                            continue;
                        }
                        if let (Gather::Rows { width }, Some(b)) = (gather, weights.first()) {
                            // The tile's pixels in each output row it touches are a
                            // fixed distance apart in the padded input. Output rows of
                            // one pixel (a 1-d convolution along the height, as
                            // XNNPACK programs write `conv1d`) all are: the tile is
                            // not cut at each row.
                            let [ow, ch] = [self.out[1].max(1), p.in_channels];
                            let row = if ow == 1 {
                                p.stride[0] * width * ch
                            } else {
                                p.stride[1] * ch
                            };
                            let tap = p.dilation[0] * width * ch;
                            let mut i = 0;
                            while i < rows {
                                let (oy, ox) = ((r0 + r + i) / ow, (r0 + r + i) % ow);
                                let n = if ow == 1 {
                                    rows - i
                                } else {
                                    (rows - i).min(ow - ox)
                                };
                                let at = ((oy * p.stride[0] + t0 * p.dilation[0]) * width
                                    + ox * p.stride[1])
                                    * ch;
                                let a = x.get(at..).unwrap_or_default();
                                let list = IndirectRows::strided(a, n, seg, k, (row, tap))?;
                                tile.run(&self.bias, b, &list, &mut c, (r + i, 0), whole)?;
                                i += n;
                            }
                            continue;
                        }
                        // This tile's rows for taps t0..t0 + seg: the channels of the
                        // block's groups, listed once and read group by group (a
                        // list per group of 16 channels took as long as its products).
                        let span = (block_groups.len() - 1) * cig + k;
                        let first_channel = block_groups.start * cig;
                        let (mut pixels, mut offsets) = ([0; MAX_MR], [0; INDIRECT_TAPS]);
                        let pixels = pixels.get_mut(..rows).unwrap_or_default();
                        let offsets = offsets.get_mut(..seg).unwrap_or_default();
                        if self.window_inside(r0 + r, (t0, seg), pixels, offsets) {
                            // No tap reads padding: each row is a pixel's offset plus
                            // a tap's, nothing to list.
                            let a = x.get(first_channel..).unwrap_or_default();
                            let table = IndirectRows::table(a, pixels, offsets, span)?;
                            for g in block_groups.clone() {
                                let Some(b) = weights.get(g) else { continue };
                                let list = table.columns((g - block_groups.start) * cig, k)?;
                                tile.run(&self.bias, b, &list, &mut c, (r, g * cog), whole)?;
                            }
                            continue;
                        }
                        let (at, a) = lists.get_or_insert_with(|| {
                            let a: [&[f32]; INDIRECT_TAPS * MAX_MR] = [&[]; INDIRECT_TAPS * MAX_MR];
                            ([None; INDIRECT_TAPS * MAX_MR], a)
                        });
                        self.gather_offsets(gather, r0 + r, rows, (t0, seg), at);
                        // A window listed at once skips the runs of taps that read
                        // only padding for every pixel of the tile (DeepLab's atrous
                        // 3×3 with dilation 12 on a 14×14 map: the middle tap alone
                        // for most pixels).
                        let skip = self.finite
                            && seg == taps
                            && reading_runs(at, rows, seg).next().is_some();
                        let zero = self.zero.get(..span).unwrap_or_default();
                        for (slot, &o) in a.iter_mut().zip(at.iter()).take(seg * rows) {
                            let o = o.map(|o: usize| o + first_channel);
                            *slot = o.and_then(|o| x.get(o..o + span)).unwrap_or(zero);
                        }
                        for g in block_groups.clone() {
                            let Some(b) = weights.get(g) else { continue };
                            let from = (g - block_groups.start) * cig;
                            let product = |run: TapRun, c: &mut MatMut<'_>| {
                                let first = (run.first - t0) * rows;
                                let list = a.get(first..first + run.count * rows);
                                let list = IndirectRows::new(
                                    list.unwrap_or_default(),
                                    rows,
                                    run.count,
                                    span,
                                )?
                                .columns(from, k)?;
                                tile.run(&self.bias, b, &list, c, (r, g * cog), run)
                            };
                            if !skip {
                                product(whole, &mut c)?;
                                continue;
                            }
                            let mut runs = reading_runs(at, rows, seg).peekable();
                            let mut opens = true;
                            while let Some((ta, tb)) = runs.next() {
                                let run = TapRun {
                                    first: t0 + ta,
                                    count: tb - ta,
                                    opens,
                                    closes: runs.peek().is_none(),
                                };
                                product(run, &mut c)?;
                                opens = false;
                            }
                        }
                    }
                    let complete = block_groups.end == groups && q0 + block >= cols.end;
                    if complete && rest != Activation::Identity {
                        // The strip at once when its rows are contiguous (a call per
                        // row of 16 channels cost more than the activation).
                        if let Some(run) = c.rows_run(r, rows) {
                            elementwise::activate(isa, run, rest);
                        } else {
                            for i in r..r + rows {
                                if let Some(row) = c.row_run(i, 0, c.cols()) {
                                    elementwise::activate(isa, row, rest);
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether every one of `pixels.len()` output pixels from `first` reads its whole
    /// window inside the image; if so, `pixels[i]` is where pixel `i`'s window starts
    /// in the input (its first channel) and `offsets[t]` how far tap `t0 + t` is from
    /// there.
    fn window_inside(
        &self,
        first: usize,
        (t0, seg): (usize, usize),
        pixels: &mut [usize],
        offsets: &mut [usize],
    ) -> bool {
        let p = &self.p;
        let ([h, w], c) = (p.input, p.in_channels);
        let [kh, kw] = p.kernel;
        // The window's last row and column, from its first.
        let reach_y = kh.saturating_sub(1) * p.dilation[0];
        let reach_x = kw.saturating_sub(1) * p.dilation[1];
        for (slot, [n, oy, ox]) in pixels.iter_mut().zip(self.pixels_from(first)) {
            let iy = (oy * p.stride[0])
                .checked_sub(p.padding[0])
                .filter(|&iy| iy + reach_y < h);
            let ix = (ox * p.stride[1])
                .checked_sub(p.padding[1])
                .filter(|&ix| ix + reach_x < w);
            let (Some(iy), Some(ix)) = (iy, ix) else {
                return false;
            };
            *slot = ((n * h + iy) * w + ix) * c;
        }
        for (t, o) in (t0..t0 + seg).zip(offsets.iter_mut()) {
            let (ky, kx) = (t / kw.max(1), t % kw.max(1));
            *o = (ky * p.dilation[0] * w + kx * p.dilation[1]) * c;
        }
        true
    }

    /// Output pixels `[image, row, column]` from pixel `first` on, counted through,
    /// not divided out: the divisions cost more than the gathering.
    fn pixels_from(&self, first: usize) -> impl Iterator<Item = [usize; 3]> {
        let [oh, ow] = self.out.map(|v| v.max(1));
        let (n, pix) = (first / (oh * ow), first % (oh * ow));
        std::iter::successors(Some([n, pix / ow, pix % ow]), move |&[n, oy, ox]| {
            Some(if ox + 1 < ow {
                [n, oy, ox + 1]
            } else if oy + 1 < oh {
                [n, oy + 1, 0]
            } else {
                [n + 1, 0, 0]
            })
        })
    }

    /// Where each of `rows` output pixels from `first` reads its taps `t0..t0 + seg`
    /// (`at[t * rows + i]`): the offset in the input of the first channel (of group
    /// 0), `None` for padding.
    fn gather_offsets(
        &self,
        gather: Gather,
        first: usize,
        rows: usize,
        (t0, seg): (usize, usize),
        at: &mut [Option<usize>],
    ) {
        let p = &self.p;
        let image = p.input[0] * p.input[1] * p.in_channels;
        let kw = p.kernel[1].max(1);
        for (i, [n, oy, ox]) in self.pixels_from(first).take(rows).enumerate() {
            let (mut ky, mut kx) = (t0 / kw, t0 % kw);
            for t in 0..seg {
                let o = match gather {
                    Gather::Taps => p
                        .input_at([oy, ox], [ky, kx])
                        .map(|(iy, ix)| n * image + (iy * p.input[1] + ix) * p.in_channels),
                    // Read through strides instead (`indirect_rows`).
                    Gather::Pixel | Gather::Rows { .. } => None,
                };
                if let Some(slot) = at.get_mut(t * rows + i) {
                    *slot = o;
                }
                kx += 1;
                if kx == kw {
                    (kx, ky) = (0, ky + 1);
                }
            }
        }
    }
}

/// A product's input, its first output row, whether it adds to the output, the
/// epilogue (clamp, then activation), panels per block, and how rows are gathered.
type IndirectRun<'x> = (
    &'x [f32],
    usize,
    bool,
    ((f32, f32), Activation),
    usize,
    Gather,
);

/// One block of panels of a convolution's product, applied tile by tile.
struct TileProduct {
    isa: Isa,
    /// The block's first panel, its panels, nr, the output channels per group, and the
    /// output channel at the view's first column.
    cols: (usize, usize, usize, usize, usize),
    accumulate: bool,
    clamp: (f32, f32),
}

/// Kernel taps `first..first + count` of a tile's product, whether they are the first
/// it adds (else the output holds a partial sum) and the last (the bias and clamp are
/// applied with them).
#[derive(Clone, Copy, Debug)]
struct TapRun {
    first: usize,
    count: usize,
    opens: bool,
    closes: bool,
}

impl TapRun {
    /// Taps `t0..t0 + seg` of a window of `taps`, every tap multiplied.
    fn of(t0: usize, seg: usize, taps: usize) -> Self {
        TapRun {
            first: t0,
            count: seg,
            opens: t0 == 0,
            closes: t0 + seg == taps,
        }
    }
}

/// The runs `a..b` of taps `0..seg` that read the input for some pixel of a tile, from
/// its listed input offsets (`at`, tap by tap, `rows` per tap; `None` in the padding).
fn reading_runs(
    at: &[Option<usize>],
    rows: usize,
    seg: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let reads = move |t: usize| {
        at.get(t * rows..(t + 1) * rows)
            .is_some_and(|r| r.iter().any(Option::is_some))
    };
    let mut t = 0;
    std::iter::from_fn(move || {
        while t < seg && !reads(t) {
            t += 1;
        }
        let start = t;
        while t < seg && reads(t) {
            t += 1;
        }
        (start < t).then_some((start, t))
    })
}

impl TileProduct {
    /// The tile of `rows` (their rows of the left operand) for the kernel taps
    /// `taps`, at output row `i` and the first channel `g0` of its group.
    fn run(
        &self,
        bias: &[f32],
        weights: &PackedB,
        rows: &IndirectRows<'_>,
        c: &mut MatMut<'_>,
        (i, g0): (usize, usize),
        taps: TapRun,
    ) -> Result {
        let (q0, count, nr, cog, j_view) = self.cols;
        let k = rows.depth();
        let j = g0 + q0 * nr;
        let (data, stride) = weights.panels().block(q0 * nr, taps.first * k);
        let run = PanelRun {
            data,
            stride,
            count,
            cols: nr.min(cog - (q0 + count - 1) * nr),
        };
        let (min, max) = self.clamp;
        let post = taps.closes.then(|| Post {
            bias: TileBias::Cols(bias.get(j..).unwrap_or_default()),
            min,
            max,
        });
        let acc = self.accumulate || !taps.opens;
        indirect_microkernel(self.isa, rows, &run, c, (i, j - j_view), acc, post.as_ref())
    }
}

/// Input channels per group below which a stem convolution reads whole kernel rows
/// of a padded copy ([`Algo::Rows`]): runs of a few channels per tap leave the
/// micro-kernel fetching rows more than multiplying.
const MIN_SEGMENT: usize = 8;

/// Largest mr of any micro-kernel.
const MAX_MR: usize = 12;

/// Register tiles one call of the micro-kernel takes down a strip of pixels (the
/// call's checks and set-up cost as much as a tile of a thin product: a fifth of a
/// stem convolution's time); the activation after the product then finds the strip
/// still in cache.
const STRIP_TILES: usize = 8;

/// Tasks a convolution's rows are split into per thread: enough that a thread the
/// system holds back (a shared machine) delays a small part of the layer while the
/// others take its tasks (3 per thread measured 6-10% slower at 2 threads under load;
/// depthwise rows, split by the pool's default, showed no difference).
const TASKS_PER_THREAD: usize = 8;
