//! 8-bit NHWC 2-D convolutions as XNNPACK computes quantized ones (qs8 and qu8
//! activations, 8-bit weights, per-channel requantization), prepared once per layer.
//!
//! `Σ (a - za) · w = Σ a · w - za · Σ w`: the second term is folded into each output
//! channel's bias at load, and taps in the padding read a row of `za` (they then add
//! `za · w`, which the folded bias takes back out). The regular convolutions' kernel
//! multiplies unsigned bytes: signed activations are shifted by 128 (their bits with
//! the top one flipped) into scratch as the layer starts, the input zero point
//! shifted alike; depthwise ones read either kind in place.
//!
//! - **Regular** convolutions (any groups) run the indirect 8-bit micro-kernel
//!   ([`crate::arch`]'s `q8_microkernel`, AVX-512 VNNI's `vpdpbusd`): each output
//!   pixel's taps are read in place through a list of rows, the weights packed in
//!   panels of 32 output channels with each group's input channels padded to a
//!   multiple of four (the input is then copied with that padding); a 1×1 stride-1
//!   convolution reads consecutive pixels through strides. Rows of the output are
//!   split over the pool's threads; the requantization happens in the kernel's store.
//!   On AVX2 the copy also widens the input to 16 bits, which the kernel multiplies
//!   in pairs of depth steps (mobilenet_v2's 8-bit program 0.72x of the time with
//!   bytes widened in the kernel, resnet18's 0.75x, one thread, interleaved).
//!   Grouped ones read each tap at a fixed offset in an input copied with its
//!   padding; on VNNI, groups of 2, 4 or 8 output channels share a vector, the
//!   panels interleaving 16 / cog groups and the copy their input quads alike
//!   (regnet_y_400mf int8: its grouped layers 1.30 → 0.8 ms, a quarter of the
//!   model's time).
//! - **Depthwise** convolutions (one input channel per group, any multiplier)
//!   accumulate each tap over a block of channels in 32 bits, then requantize the
//!   block. 3×3 and 5×5 ones with multiplier 1 run an AVX-512 row kernel with the
//!   VNNI layers (16 channels per vector, the last block masked, four pixels at a
//!   time where every tap is inside the row: 56×56×144 took 0.92 ms as a loop
//!   compiled per instruction set, 0.55 ms on it), or on AVX2 one whose taps go in
//!   pairs per `vpmaddwd` (channels a multiple of 16); the loop serves other CPUs
//!   and shapes.
//!
//! Weights with a zero point `zw` (per-tensor quint8 filters) multiply by `w - zw`,
//! which takes nine bits: a regular convolution then splits it into two signed bytes
//! (three for 255) over a depth as many times longer, each input channel copied as
//! many times.
//!
//! Sums wrap in 32 bits as XNNPACK's do; the requantization is XNNPACK's fp32 one
//! (see [`QuantParams`]), so outputs are bit-exact with upstream's.

use crate::arch::{
    self, multiversion, IndirectRows, Isa, Q8DwRow, Q8Kernel, Q8Panels, Q8Post, Q8_INTERLEAVES,
    Q8_LANES, Q8_MR, Q8_NR,
};
pub use crate::arch::{requantize, round_small};
use crate::conv::Conv2dParams;
use crate::error::{self, Error, Result};
use crate::pool::{FirstError, ThreadPool};

/// The quantization of a convolution.
#[derive(Clone, Copy, Debug)]
pub struct QuantParams<'a> {
    /// Whether activations (input and output) are signed bytes (qint8) or unsigned
    /// (quint8).
    pub signed: bool,
    /// The input's zero point, in its own type's range.
    pub input_zero: i32,
    /// The weights' zero point (signed weights: in `-128..=127`).
    pub weight_zero: i32,
    /// Per output channel: the 32-bit bias (in units of input scale × weight scale).
    pub bias: &'a [i32],
    /// Per output channel: input scale × weight scale ÷ output scale.
    pub scale: &'a [f32],
    /// The output's zero point.
    pub output_zero: i32,
    /// The output's bounds, quantized (inside its type's range).
    pub output_min: i32,
    pub output_max: i32,
}

enum Algo {
    /// Per group, panels of [`Q8_NR`] output channels: `[panel][tap][kq][NR][4]`; for
    /// [`Gather::Interleaved`], per block of groups one panel `[tap][kq][16][4]`.
    Gemm {
        panels: Vec<pte_alloc::Zeroed<i8>>,
        gather: Gather,
    },
    /// Weights `[tap][output channel]`, widened.
    Depthwise { weights: Vec<i32> },
}

/// How the micro-kernel's rows cover a receptive field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gather {
    /// A 1×1 stride-1 convolution: the output pixel's own input pixel.
    Pixel,
    /// One row per kernel row, in an input copied with its padding: a stem's few
    /// channels make each tap's row too short to keep the kernel busy.
    Rows,
    /// One row per kernel tap, each a fixed offset from the pixel in an input copied
    /// with its padding ([`QConvNhwc::tap_offsets`]). Listing every tap of every tile
    /// (once per group) cost more than the products of regnet's 8-channel groups
    /// (about 60% of the model's time), and a tenth of resnet18's and
    /// efficientnet_v2_s's dense 3×3 layers; the copy costs less.
    Table,
    /// As [`Gather::Table`], for `q` groups at a time in one interleaved panel (see
    /// [`crate::arch`]'s `Q8Panels`): groups of 2, 4 or 8 output channels fill a
    /// whole vector, and groups of 16 (`q` = 1) take one call per tile for all of
    /// them. The copy interleaves each block's input quads alike.
    Interleaved(usize),
}

/// A group's input channels (after repetition) below which a convolution with one
/// group reads whole kernel rows ([`Gather::Rows`]).
const MIN_SEGMENT: usize = 8;

/// An 8-bit convolution on NHWC images prepared for repeated runs.
pub struct QConvNhwc {
    p: Conv2dParams,
    out: [usize; 2],
    signed: bool,
    /// The byte taps in the padding read: the input zero point, shifted to unsigned
    /// for a regular convolution.
    za: u8,
    /// A group's input channels padded to a multiple of four (regular convolutions),
    /// after each is repeated `dup` times.
    cig4: usize,
    dup: usize,
    algo: Algo,
    /// Per output channel, with `za · Σ w` taken out.
    bias: Vec<i32>,
    scale: Vec<f32>,
    zero: i32,
    lo: f32,
    hi: f32,
    /// A row of `za`: what a depthwise convolution's taps in the padding read (the
    /// other algorithms read a padded copy).
    pad_row: Vec<u8>,
    /// For [`Gather::Table`], where tap `ky · kw + kx` of a pixel is in the padded copy,
    /// from the pixel's first tap.
    tap_offsets: Vec<usize>,
    kernel: Q8Kernel,
}

impl std::fmt::Debug for QConvNhwc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QConvNhwc")
            .field("params", &self.p)
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

/// Bytes of weight panels one run of the micro-kernel covers (held in L2).
const L2_PANEL_BYTES: usize = 256 * 1024;
/// Tasks a convolution's rows are split into per thread (as the float one's).
const TASKS_PER_THREAD: usize = 8;

impl QConvNhwc {
    /// Prepares a convolution of geometry `p`. `weights` are XNNPACK's layouts: `[c_out]
    /// [kh][kw][c_in / groups]` for a regular convolution, `[kh][kw][c_out]` for a
    /// depthwise one (`depthwise`: one input channel per group, `c_out / groups`
    /// outputs each).
    pub fn new(
        p: Conv2dParams,
        depthwise: bool,
        weights: &[i8],
        q: &QuantParams<'_>,
    ) -> Result<Self> {
        Self::for_kernel(p, depthwise, weights, q, Q8Kernel::best())
    }

    /// [`QConvNhwc::new`] for `kernel`, which decides the weights' layout.
    fn for_kernel(
        p: Conv2dParams,
        depthwise: bool,
        weights: &[i8],
        q: &QuantParams<'_>,
        kernel: Q8Kernel,
    ) -> Result<Self> {
        let out = p.output()?;
        let (cig, cog) = p.channels_per_group();
        let taps = error::mul(p.kernel[0], p.kernel[1], "kernel")?;
        let cout = p.out_channels;
        let bad = |what: String| Error::InvalidParameter { what };
        if depthwise && cig != 1 {
            return Err(bad(format!(
                "depthwise convolution with {cig} input channels per group"
            )));
        }
        let (lo_t, hi_t) = if q.signed { (-128, 127) } else { (0, 255) };
        let in_range = |v: i32| (lo_t..=hi_t).contains(&v);
        if !in_range(q.input_zero)
            || !(-128..=127).contains(&q.weight_zero)
            || !in_range(q.output_zero)
            || !in_range(q.output_min)
            || !in_range(q.output_max)
            || q.output_min > q.output_max
        {
            return Err(bad(format!(
                "8-bit convolution zero points {} / {} or bounds {}..{} outside the type",
                q.input_zero, q.output_zero, q.output_min, q.output_max
            )));
        }
        error::need("8-bit convolution bias", q.bias.len(), cout)?;
        error::need("8-bit convolution scales", q.scale.len(), cout)?;
        // The zero point as the kernels read it, and its byte.
        let za = if q.signed && !depthwise {
            q.input_zero + 128
        } else {
            q.input_zero
        };
        let za_byte = za as u8;
        if taps > MAX_TAPS {
            return Err(bad(format!(
                "8-bit convolution with {taps} kernel taps (at most {MAX_TAPS})"
            )));
        }
        let k = error::mul(taps, cig, "weights")?;
        error::need(
            "8-bit convolution weights",
            weights.len(),
            error::mul(cout, k, "weights")?,
        )?;
        let mut bias: Vec<i32> = q.bias.iter().take(cout).copied().collect();
        let zw = q.weight_zero;
        // Signed bytes to spell each w - zw with: two reach -256..=254, three 255.
        let dup = match (depthwise, zw) {
            (true, _) | (_, 0) => 1,
            _ if weights.iter().any(|&w| i32::from(w) - zw > 254) => 3,
            _ => 2,
        };
        let cig4 = (cig * dup).next_multiple_of(4);
        // A 1×1 stride-1 convolution reads its input in place (`Gather::Pixel`).
        let pointwise = p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == [0; 4];
        // Groups per interleaved panel: VNNI, a vector holding whole groups' outputs.
        let interleave =
            (kernel == Q8Kernel::Vnni && p.groups > 1 && dup == 1 && !depthwise && !pointwise)
                .then(|| Q8_LANES.checked_div(cog))
                .flatten()
                .filter(|&q| cog * q == Q8_LANES && Q8_INTERLEAVES.contains(&q));
        let algo = if depthwise {
            // [tap][channel] already; widened once, less the zero point.
            let w: Vec<i32> = weights
                .iter()
                .take(taps * cout)
                .map(|&v| i32::from(v) - zw)
                .collect();
            Algo::Depthwise { weights: w }
        } else {
            let kq = cig4 / 4;
            // Panel sets (one per group; interleaved, one of all groups, a panel per
            // block of `q`), their groups, and a panel's columns.
            let (sets, per_set, nr) = match interleave {
                Some(_) => (1, p.groups, Q8_LANES),
                None => (p.groups, 1, Q8_NR),
            };
            let panel = taps * kq * nr * 4;
            let panels_per_set = (per_set * cog).div_ceil(nr);
            let mut groups = Vec::with_capacity(sets);
            for set in 0..sets {
                // Cut from memory shared with other weights (in huge pages where the
                // system has them): faulted in 4 KiB at a time, the 8-bit transformer
                // encoder's panels took a fifth of its load.
                let len = error::mul(panel, panels_per_set, "packed weights")?;
                let mut packed =
                    pte_alloc::Zeroed::<i8>::try_shared(len).ok_or(Error::OutOfMemory {
                        what: "packed 8-bit weights",
                        len,
                    })?;
                // Output channel `oc` of the set's group `gs`, column `o` of that group.
                let channel = |gs: usize, o: usize| (set * per_set + gs) * cog + o;
                for (gs, o) in (0..per_set).flat_map(|gs| (0..cog).map(move |o| (gs, o))) {
                    let oc = channel(gs, o);
                    let w = weights.get(oc * k..(oc + 1) * k).unwrap_or_default();
                    let sum: i32 = w.iter().map(|&v| i32::from(v) - zw).sum();
                    if let Some(b) = bias.get_mut(oc) {
                        *b = b.wrapping_sub(za.wrapping_mul(sum));
                    }
                }
                // The panel and column of group `gs`'s column `o`: interleaved, block
                // gs / q at lane o · q + gs % q; else panel o / nr, column o % nr.
                let column = |q: usize, j: usize| match interleave {
                    Some(qi) => (q * qi + j % qi, j / qi),
                    None => (0, q * nr + j),
                };
                // Where depth step `u` of column `j` lies in a group of four depth steps.
                let pairs = kernel.widens();
                let lane = |j: usize, u: usize| arch::q8_lane(j, u, nr, pairs);
                if dup == 1 {
                    // Copied as they are (zw = 0 here), four depth steps of a column at a
                    // time, in the order they are stored. Column by column, packing took
                    // 3.6 ms of the 8-bit transformer encoder's 11 ms load; in this order
                    // the load is about 2 ms shorter.
                    // `max(1)`: no depth (no input channels) leaves no panel to fill.
                    for (q, dst) in packed.chunks_exact_mut(panel.max(1)).enumerate() {
                        let rows: [Option<&[i8]>; Q8_NR] = std::array::from_fn(|j| {
                            let (gs, o) = column(q, j);
                            (j < nr && gs < per_set && o < cog)
                                .then(|| {
                                    let oc = channel(gs, o);
                                    weights.get(oc * k..(oc + 1) * k)
                                })
                                .flatten()
                        });
                        // Group `tq` holds depth steps 4p.. of tap t, tq = t · kq + p.
                        for (tq, group) in dst.chunks_exact_mut(4 * nr).enumerate() {
                            let (t, p4) = (tq / kq, tq % kq);
                            let (from, to) =
                                (t * cig + p4 * 4, (t * cig + cig).min(t * cig + p4 * 4 + 4));
                            for (j, row) in rows.iter().take(nr).enumerate() {
                                let Some(src) = row.and_then(|r| r.get(from..to)) else {
                                    continue;
                                };
                                // Whole groups as 2- or 4-byte moves, not memcpy calls.
                                match (<[i8; 4]>::try_from(src), pairs) {
                                    (Ok([a, b, c, d]), true) => {
                                        for (at, two) in
                                            [(lane(j, 0), [a, b]), (lane(j, 2), [c, d])]
                                        {
                                            if let Some(cell) = group.get_mut(at..at + 2) {
                                                cell.copy_from_slice(&two);
                                            }
                                        }
                                    }
                                    (Ok(four), false) => {
                                        if let Some(cell) = group.get_mut(4 * j..4 * j + 4) {
                                            cell.copy_from_slice(&four);
                                        }
                                    }
                                    _ => {
                                        for (u, &v) in src.iter().enumerate() {
                                            if let Some(cell) = group.get_mut(lane(j, u)) {
                                                *cell = v;
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    groups.push(packed);
                    continue;
                }
                for (q, j) in (0..panels_per_set).flat_map(|q| (0..nr).map(move |j| (q, j))) {
                    let (gs, o) = column(q, j);
                    if gs >= per_set || o >= cog {
                        continue;
                    }
                    let oc = channel(gs, o);
                    let w = weights.get(oc * k..(oc + 1) * k).unwrap_or_default();
                    for t in 0..taps {
                        for i in 0..cig {
                            // w - zw as signed bytes that add up to it.
                            let mut rest = w.get(t * cig + i).map_or(0, |&v| i32::from(v) - zw);
                            for u in 0..dup {
                                let part = rest.clamp(-128, 127);
                                rest -= part;
                                let d = i * dup + u;
                                let at = q * panel + (t * kq + d / 4) * nr * 4 + lane(j, d % 4);
                                if let Some(slot) = packed.get_mut(at) {
                                    *slot = part as i8;
                                }
                            }
                        }
                    }
                }
                groups.push(packed);
            }
            let gather = if pointwise {
                Gather::Pixel
            } else if p.groups == 1 && cig * dup < MIN_SEGMENT && p.dilation[1] == 1 {
                Gather::Rows
            } else if let Some(q) = interleave {
                Gather::Interleaved(q)
            } else {
                Gather::Table
            };
            Algo::Gemm {
                panels: groups,
                gather,
            }
        };
        Ok(Self {
            p,
            out,
            signed: q.signed,
            za: za_byte,
            cig4,
            dup,
            algo,
            bias,
            scale: q.scale.iter().take(cout).copied().collect(),
            zero: q.output_zero,
            lo: (q.output_min - q.output_zero) as f32,
            hi: (q.output_max - q.output_zero) as f32,
            pad_row: vec![za_byte; if depthwise { p.in_channels } else { 0 }],
            tap_offsets: Vec::new(),
            kernel,
        }
        .with_tap_offsets())
    }

    /// Fills [`Self::tap_offsets`] for [`Gather::Table`] and [`Gather::Interleaved`].
    fn with_tap_offsets(mut self) -> Self {
        if let Algo::Gemm {
            gather: Gather::Table | Gather::Interleaved(_),
            ..
        } = self.algo
        {
            let p = &self.p;
            let wp = self.copied_size()[1];
            let pixel = self.copied_pixel();
            self.tap_offsets = (0..p.kernel[0])
                .flat_map(|ky| (0..p.kernel[1]).map(move |kx| (ky, kx)))
                .map(|(ky, kx)| (ky * p.dilation[0] * wp + kx * p.dilation[1]) * pixel)
                .collect();
        }
        self
    }

    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        let w = match &self.algo {
            Algo::Gemm { panels, .. } => panels.iter().map(|p| p.len()).sum(),
            Algo::Depthwise { weights } => weights.len() * 4,
        };
        w + self.bias.len() * 8 + self.pad_row.len() + self.tap_offsets.len() * 8
    }

    /// The geometry.
    pub fn params(&self) -> &Conv2dParams {
        &self.p
    }

    /// Output height and width.
    pub fn output_size(&self) -> [usize; 2] {
        self.out
    }

    /// "pointwise", "rows", "interleaved", "indirect" or "depthwise".
    pub fn algorithm(&self) -> &'static str {
        match &self.algo {
            Algo::Gemm {
                gather: Gather::Pixel,
                ..
            } => "pointwise",
            Algo::Gemm {
                gather: Gather::Rows,
                ..
            } => "rows",
            Algo::Gemm {
                gather: Gather::Interleaved(_),
                ..
            } => "interleaved",
            Algo::Gemm { .. } => "indirect",
            Algo::Depthwise { .. } => "depthwise",
        }
    }

    /// Bytes of the input and output of `batch` images.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        self.p.io_len(batch)
    }

    /// Whether the input is read as it is rather than copied into scratch: depthwise,
    /// or unsigned with channels a multiple of four, not repeated, not padded.
    fn reads_input_in_place(&self) -> bool {
        match self.algo {
            Algo::Gemm { gather, .. } => {
                !self.signed
                    && self.value_bytes() == 1
                    && self.dup == 1
                    && self.cig4 == self.p.channels_per_group().0
                    && matches!(gather, Gather::Pixel)
            }
            Algo::Depthwise { .. } => true,
        }
    }

    /// Values per pixel of the input as the kernel reads it: each group's channels
    /// padded to `cig4`, and for [`Gather::Interleaved`] whole blocks of groups.
    fn copied_values(&self) -> usize {
        let groups = match self.algo {
            Algo::Gemm {
                gather: Gather::Interleaved(q),
                ..
            } => self.p.groups.div_ceil(q).saturating_mul(q),
            _ => self.p.groups,
        };
        groups.saturating_mul(self.cig4)
    }

    /// Bytes per pixel of the input as the kernel reads it.
    fn copied_pixel(&self) -> usize {
        self.copied_values().saturating_mul(self.value_bytes())
    }

    /// Bytes of an input value as the kernel reads it: 2 for a regular convolution on
    /// a kernel that [`Q8Kernel::widens`] its rows to 16 bits.
    fn value_bytes(&self) -> usize {
        match self.algo {
            Algo::Gemm { .. } if self.kernel.widens() => 2,
            _ => 1,
        }
    }

    /// Height and width of the input as copied: with its padding for
    /// [`Gather::Rows`], [`Gather::Table`] and [`Gather::Interleaved`].
    fn copied_size(&self) -> [usize; 2] {
        let p = &self.p;
        match self.algo {
            Algo::Gemm {
                gather: Gather::Rows | Gather::Table | Gather::Interleaved(_),
                ..
            } => [
                p.input[0] + p.padding[0] + p.padding[2],
                p.input[1] + p.padding[1] + p.padding[3],
            ],
            _ => p.input,
        }
    }

    /// Bytes of scratch a run on `batch` images needs: the input, unsigned, with each
    /// group's channels padded to a multiple of four (and on AVX2 widened to 16 bits).
    pub fn scratch_len(&self, batch: usize) -> Result<usize> {
        if self.reads_input_in_place() {
            return Ok(0);
        }
        let [h, w] = self.copied_size();
        let pixels = error::mul(error::mul(h, w, "input")?, batch, "input")?;
        error::mul(pixels, self.copied_pixel(), "input")
    }

    /// Runs the convolution on `batch` NHWC images: `input` is `[batch, h, w,
    /// in_channels]` bytes (signed or unsigned as prepared), `output` `[batch, oh, ow,
    /// out_channels]` bytes of the same type; `scratch` at least
    /// [`QConvNhwc::scratch_len`] bytes.
    pub fn run(
        &self,
        pool: &ThreadPool,
        input: &[u8],
        batch: usize,
        output: &mut [u8],
        scratch: &mut [u8],
    ) -> Result {
        let (x_len, y_len) = self.io_len(batch)?;
        error::need("8-bit convolution input", input.len(), x_len)?;
        error::need("8-bit convolution output", output.len(), y_len)?;
        if y_len == 0 {
            return Ok(());
        }
        let output = output.get_mut(..y_len).unwrap_or_default();
        let x =
            self.unsigned_input(pool, input.get(..x_len).unwrap_or_default(), batch, scratch)?;
        match &self.algo {
            Algo::Gemm { panels, gather } => self.run_gemm(pool, panels, *gather, x, batch, output),
            Algo::Depthwise { weights } => self.run_depthwise(pool, weights, x, output),
        }
    }

    /// The input as the kernels read it: itself, or (regular convolutions) copied into
    /// `scratch` shifted to unsigned, each channel `dup` times, each group's channels
    /// padded to `cig4` with `za`, and for [`Gather::Rows`] the image's padding
    /// written as pixels of `za`.
    fn unsigned_input<'s>(
        &self,
        pool: &ThreadPool,
        input: &'s [u8],
        batch: usize,
        scratch: &'s mut [u8],
    ) -> Result<&'s [u8]> {
        if self.reads_input_in_place() {
            return Ok(input);
        }
        let needed = self.scratch_len(batch)?;
        let len = scratch.len();
        let dst = scratch
            .get_mut(..needed)
            .ok_or(Error::ScratchTooSmall { len, needed })?;
        let p = &self.p;
        let cig = p.channels_per_group().0;
        let flip = if self.signed { 0x80 } else { 0 };
        let wide = self.value_bytes() == 2;
        if cig == self.cig4 && self.copied_size() == p.input {
            // Only the shift (and the widening): one pass over contiguous bytes.
            let mut none = [0u8; 0];
            let chunk = COPY_CHUNK * self.value_bytes();
            pool.parallel_chunks(dst, chunk, &mut none, 0, |k, d, _| {
                let src = input.get(k * COPY_CHUNK..).unwrap_or_default();
                if wide {
                    arch::widen_bytes(d, src, flip);
                } else {
                    d.iter_mut().zip(src).for_each(|(d, &s)| *d = s ^ flip);
                }
            })?;
            return Ok(dst);
        }
        let [hp, wp] = self.copied_size();
        let row_bytes = (wp * self.copied_pixel()).max(1);
        pool.parallel_chunks(dst, row_bytes, &mut [0u8; 0], 0, |r, d, _| {
            let (n, y) = (r / hp.max(1), r % hp.max(1));
            if wide {
                // The bytes into the row's second half, then widened in place.
                let half = d.len() / 2;
                self.copy_row(input, (n, y), d.get_mut(half..).unwrap_or_default());
                arch::widen_upper_half(d);
            } else {
                self.copy_row(input, (n, y), d);
            }
        })?;
        Ok(dst)
    }

    /// Row `y` of image `n` of the copied input, as bytes: padding pixels of `za`
    /// around the shifted ones.
    fn copy_row(&self, input: &[u8], (n, y): (usize, usize), d: &mut [u8]) {
        let p = &self.p;
        let (cin, cig) = (p.in_channels, p.channels_per_group().0);
        let flip = if self.signed { 0x80 } else { 0 };
        let (top, left) = if self.copied_size() == p.input {
            (0, 0)
        } else {
            (p.padding[0], p.padding[1])
        };
        let pixel = self.copied_values();
        let interleave = match self.algo {
            Algo::Gemm {
                gather: Gather::Interleaved(q),
                ..
            } => Some(q),
            _ => None,
        };
        let src = y
            .checked_sub(top)
            .filter(|&iy| iy < p.input[0])
            .and_then(|iy| {
                let at = ((n * p.input[0] + iy) * p.input[1]) * cin;
                input.get(at..at + p.input[1] * cin)
            });
        let Some(src) = src else {
            d.iter_mut().for_each(|d| *d = self.za);
            return;
        };
        let (pad_left, rest) = d.split_at_mut((left * pixel).min(d.len()));
        pad_left.iter_mut().for_each(|d| *d = self.za);
        let (body, pad_right) = rest.split_at_mut((p.input[1] * pixel).min(rest.len()));
        pad_right.iter_mut().for_each(|d| *d = self.za);
        // A stem's pixels of 1-3 channels, padded to four: sizes known, a tight loop
        // (the general one below took 0.5 ms on a 224×224 image).
        if p.groups == 1 && self.dup == 1 && self.cig4 == 4 {
            match cin {
                1 => return widen_pixels::<1, 4>(body, src, flip, self.za),
                2 => return widen_pixels::<2, 4>(body, src, flip, self.za),
                3 => return widen_pixels::<3, 4>(body, src, flip, self.za),
                _ => {}
            }
        }
        if let Some(q) = interleave {
            return self.interleave_row(q, body, src);
        }
        if self.dup == 1 && self.cig4 == cig {
            // Channels as they are (grouped convolutions' padded copy): one pass.
            body.iter_mut().zip(src).for_each(|(d, &s)| *d = s ^ flip);
            return;
        }
        for (dp, sp) in body
            .chunks_exact_mut(pixel.max(1))
            .zip(src.chunks_exact(cin.max(1)))
        {
            for (dg, sg) in dp
                .chunks_exact_mut(self.cig4.max(1))
                .zip(sp.chunks_exact(cig.max(1)))
            {
                let (head, pad) = dg.split_at_mut((cig * self.dup).min(dg.len()));
                if self.dup == 1 {
                    head.iter_mut().zip(sg).for_each(|(d, &s)| *d = s ^ flip);
                } else {
                    for (d, &s) in head.chunks_exact_mut(self.dup).zip(sg) {
                        d.iter_mut().for_each(|d| *d = s ^ flip);
                    }
                }
                pad.iter_mut().for_each(|d| *d = self.za);
            }
        }
    }

    /// One row of pixels from `src` into `body` for [`Gather::Interleaved`]: in each
    /// block of `q` groups, quad `p` of group `g` at quad `p · q + g`, shifted to
    /// unsigned; `za` for each group's channel padding and a last block's missing
    /// groups.
    fn interleave_row(&self, q: usize, body: &mut [u8], src: &[u8]) {
        let cig = self.p.channels_per_group().0;
        let (pixel, cin) = (self.copied_pixel(), self.p.in_channels);
        let flip = if self.signed { 0x80 } else { 0 };
        // Whole quads per group: vector permutations, pixel by pixel, or over the
        // whole row where a pixel is whole blocks already.
        let (dp, sp) = if pixel == cin {
            (body.len(), src.len())
        } else {
            (pixel, cin)
        };
        if cig == self.cig4
            && arch::interleave_quads((q, q * cig / 4), (flip, self.za), (body, dp), (src, sp))
        {
            return;
        }
        let (block_in, block_out) = (q * cig, q * self.cig4);
        for (dp, sp) in body
            .chunks_exact_mut(pixel.max(1))
            .zip(src.chunks_exact(cin.max(1)))
        {
            for (d, s) in dp
                .chunks_exact_mut(block_out.max(1))
                .zip(sp.chunks(block_in.max(1)))
            {
                self.interleave_block(q, d, s, flip);
            }
        }
    }

    /// One block of [`QConvNhwc::interleave_row`]: `src` holds its groups (fewer for a
    /// last block) of `cig` channels each.
    fn interleave_block(&self, q: usize, dst: &mut [u8], src: &[u8], flip: u8) {
        let cig = self.p.channels_per_group().0;
        for (d, (p, g)) in dst
            .chunks_exact_mut(4)
            .zip((0..self.cig4 / 4).flat_map(|p| (0..q).map(move |g| (p, g))))
        {
            for (u, d) in d.iter_mut().enumerate() {
                let ch = 4 * p + u;
                *d = if ch < cig {
                    src.get(g * cig + ch).map_or(self.za, |&s| s ^ flip)
                } else {
                    self.za
                };
            }
        }
    }

    /// Regular convolutions on the micro-kernel, rows split over the pool's threads.
    fn run_gemm(
        &self,
        pool: &ThreadPool,
        panels: &[pte_alloc::Zeroed<i8>],
        gather: Gather,
        x: &[u8],
        batch: usize,
        y: &mut [u8],
    ) -> Result {
        let p = &self.p;
        let cout = p.out_channels;
        let m = error::mul(batch, self.out[0] * self.out[1], "convolution output")?;
        let tiles = m.div_ceil(Q8_MR);
        let taps = p.kernel[0] * p.kernel[1];
        let work = m.saturating_mul(cout).saturating_mul(taps * self.cig4);
        let tasks = if work < (1 << 18) {
            1
        } else {
            (pool.threads() * TASKS_PER_THREAD).min(tiles).max(1)
        };
        let rows_per_task = tiles.div_ceil(tasks) * Q8_MR;
        let failed = FirstError::default();
        pool.parallel_chunks(y, rows_per_task * cout, &mut [0u8; 0], 0, |task, yc, _| {
            let r0 = task * rows_per_task;
            failed.keep(self.gemm_rows(panels, gather, x, r0, yc));
        })?;
        failed.into_result()
    }

    /// Output pixels `r0..` into `yc` (whole pixels).
    fn gemm_rows(
        &self,
        panels: &[pte_alloc::Zeroed<i8>],
        gather: Gather,
        x: &[u8],
        r0: usize,
        yc: &mut [u8],
    ) -> Result {
        let p = &self.p;
        let (cout, cog) = (p.out_channels, p.channels_per_group().1);
        let rows_here = yc.len() / cout.max(1);
        let taps = p.kernel[0] * p.kernel[1];
        // Groups per interleaved panel (0: plain panels), its columns, and the bytes
        // of a pixel it reads.
        let (q, nr) = match gather {
            Gather::Interleaved(q) => (q, Q8_LANES),
            _ => (0, Q8_NR),
        };
        let interleaved = q > 0;
        // The bytes of a group (or block) in a pixel, and of a panel.
        let part = q.max(1) * self.cig4 * self.value_bytes();
        let pixel = self.copied_pixel();
        let panel = taps * self.cig4 * nr;
        let block = (L2_PANEL_BYTES / panel.max(1)).max(1);
        let [oh, ow] = self.out;
        let [hp, wp] = self.copied_size();
        let image = hp * wp * pixel;
        for (g, packed) in panels.iter().enumerate() {
            // The set's output channels: a group's, or (interleaved) all.
            let set_cols = if interleaved { cout } else { cog };
            let count = set_cols.div_ceil(nr);
            for q0 in (0..count).step_by(block) {
                let n = block.min(count - q0);
                let run = Q8Panels {
                    data: packed.get(q0 * panel..).unwrap_or_default(),
                    stride: panel,
                    count: n,
                    cols: set_cols.min((q0 + n) * nr) - (q0 + n - 1) * nr,
                    interleave: q,
                };
                let j0 = g * cog + q0 * nr;
                // Where the run's rows start in a pixel, and the bytes they read: the
                // group's, or (interleaved) its panels' blocks.
                let (start, kc) = if interleaved {
                    (q0 * part, n * part)
                } else {
                    (g * part, part)
                };
                let post = Q8Post {
                    bias: self.bias.get(j0..).unwrap_or_default(),
                    scale: self.scale.get(j0..).unwrap_or_default(),
                    zero: self.zero,
                    lo: self.lo,
                    hi: self.hi,
                };
                for r in (0..rows_here).step_by(Q8_MR) {
                    let rows = Q8_MR.min(rows_here - r);
                    let place = (r, j0, cout);
                    match gather {
                        Gather::Pixel => {
                            let a = x.get((r0 + r) * pixel + start..).unwrap_or_default();
                            let a = IndirectRows::strided(a, rows, 1, kc, (pixel, 0))?;
                            arch::q8_microkernel(self.kernel, &a, &run, yc, place, &post)?;
                        }
                        Gather::Table | Gather::Interleaved(_) => {
                            // Each pixel's first tap in the padded copy (the tile may
                            // span output rows), its taps the table's offsets.
                            let mut pixels = [0usize; Q8_MR];
                            let pixels = pixels.get_mut(..rows).unwrap_or_default();
                            self.first_taps(r0 + r, pixels);
                            let pixels = &*pixels;
                            let a = x.get(start..).unwrap_or_default();
                            let a = IndirectRows::table(a, pixels, &self.tap_offsets, kc)?;
                            arch::q8_microkernel(self.kernel, &a, &run, yc, place, &post)?;
                        }
                        Gather::Rows => {
                            // The tile's pixels in each output row it touches are a
                            // fixed distance apart in the padded copy; their taps are
                            // whole kernel rows.
                            let row = p.stride[1] * pixel;
                            let mut i = 0;
                            while i < rows {
                                let (n_img, pix) = (
                                    (r0 + r + i) / (oh * ow).max(1),
                                    (r0 + r + i) % (oh * ow).max(1),
                                );
                                let (oy, ox) = (pix / ow.max(1), pix % ow.max(1));
                                let len = (rows - i).min(ow - ox);
                                let at = n_img * image
                                    + (oy * p.stride[0] * wp + ox * p.stride[1]) * pixel
                                    + start;
                                let a = x.get(at..).unwrap_or_default();
                                let tap = p.dilation[0] * wp * kc;
                                let depth = p.kernel[1] * kc;
                                let a =
                                    IndirectRows::strided(a, len, p.kernel[0], depth, (row, tap))?;
                                arch::q8_microkernel(
                                    self.kernel,
                                    &a,
                                    &run,
                                    yc,
                                    (r + i, j0, cout),
                                    &post,
                                )?;
                                i += len;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Where each pixel of a run of output pixels from `first` (row-major over the
    /// batch) has its first tap in the padded copy. Stepped pixel by pixel: dividing
    /// for each one cost more than the products of a small group (regnet_x's 16
    /// channels).
    fn first_taps(&self, first: usize, out: &mut [usize]) {
        let p = &self.p;
        let [oh, ow] = self.out;
        let (oh, ow) = (oh.max(1), ow.max(1));
        let pixel = self.copied_pixel();
        let [hp, wp] = self.copied_size();
        let image = hp * wp * pixel;
        let (mut n, pix) = (first / (oh * ow), first % (oh * ow));
        let (mut oy, mut ox) = (pix / ow, pix % ow);
        for at in out {
            *at = n * image + (oy * p.stride[0] * wp + ox * p.stride[1]) * pixel;
            ox += 1;
            if ox == ow {
                ox = 0;
                oy += 1;
                if oy == oh {
                    oy = 0;
                    n += 1;
                }
            }
        }
    }

    /// Depthwise convolutions, rows of the output split over the pool's threads.
    fn run_depthwise(&self, pool: &ThreadPool, weights: &[i32], x: &[u8], y: &mut [u8]) -> Result {
        let p = &self.p;
        let c = p.out_channels;
        let row = self.out[1] * c;
        let image = p.input[0] * p.input[1] * p.in_channels;
        let isa = Isa::best();
        pool.parallel_chunks(y, row, &mut [0u8; 0], 0, |r, yr, _| {
            let (n, oy) = (r / self.out[0].max(1), r % self.out[0].max(1));
            let xi = x.get(n * image..(n + 1) * image).unwrap_or_default();
            self.depthwise_row(isa, weights, xi, oy, yr);
        })
    }

    /// Output row `oy` of one image `x`.
    fn depthwise_row(&self, isa: Isa, weights: &[i32], x: &[u8], oy: usize, y: &mut [u8]) {
        let p = &self.p;
        let (c, cin) = (p.out_channels, p.in_channels);
        let mult = c / cin.max(1);
        let [kh, kw] = p.kernel;
        if mult == 1 && kh == kw && (kh == 3 || kh == 5) {
            // The input rows of each kernel row (None: padding).
            let row_len = p.input[1] * cin;
            let rows: [Option<&[u8]>; 5] = std::array::from_fn(|ky| {
                (ky < kh)
                    .then(|| (oy * p.stride[0] + ky * p.dilation[0]).checked_sub(p.padding[0]))
                    .flatten()
                    .filter(|&iy| iy < p.input[0])
                    .and_then(|iy| x.get(iy * row_len..(iy + 1) * row_len))
            });
            let geometry = (p.input[1], p.stride[1], p.dilation[1], p.padding[1]);
            let input = (self.signed, self.za_value());
            let (w_in, stride, dilation, pad) = geometry;
            let vectorized = match rows {
                [a, b, c, _, _] if kh == 3 => {
                    let x = Q8DwRow {
                        rows: [a, b, c],
                        w_in,
                        stride,
                        dilation,
                        pad,
                    };
                    arch::q8_depthwise_row(self.kernel, &x, weights, &self.post(), input, y)
                }
                rows => {
                    let x = Q8DwRow {
                        rows,
                        w_in,
                        stride,
                        dilation,
                        pad,
                    };
                    arch::q8_depthwise_row(self.kernel, &x, weights, &self.post(), input, y)
                }
            };
            if !vectorized {
                depthwise_row_blocks(isa, kh, rows, weights, self.post(), input, geometry, y);
            }
            return;
        }
        let mut taps: [&[u8]; MAX_TAPS] = [&[]; MAX_TAPS];
        for (ox, out) in y.chunks_exact_mut(c.max(1)).enumerate() {
            for t in 0..(kh * kw).min(MAX_TAPS) {
                let at = p
                    .input_at([oy, ox], [t / kw, t % kw])
                    .map(|(iy, ix)| (iy * p.input[1] + ix) * cin);
                if let Some(s) = taps.get_mut(t) {
                    *s = at.and_then(|a| x.get(a..a + cin)).unwrap_or(&self.pad_row);
                }
            }
            let taps = taps.get(..kh * kw).unwrap_or_default();
            if mult == 1 {
                let input = (self.signed, self.za_value());
                depthwise_pixel(isa, taps, weights, self.post(), input, out);
            } else {
                for (ch, o) in out.iter_mut().enumerate() {
                    let mut acc = self.bias.get(ch).copied().unwrap_or(0);
                    for (t, tap) in taps.iter().enumerate() {
                        let b = tap.get(ch / mult).copied().unwrap_or(self.za);
                        let wv = weights.get(t * c + ch).copied().unwrap_or(0);
                        let x = byte_value(b, self.signed) - self.za_value();
                        acc = acc.wrapping_add(x.wrapping_mul(wv));
                    }
                    *o = self.post().apply(acc, ch) as u8;
                }
            }
        }
    }

    /// The input zero point as the kernels read it.
    fn za_value(&self) -> i32 {
        byte_value(self.za, self.signed)
    }

    /// The requantization of every output channel.
    fn post(&self) -> Q8Post<'_> {
        Q8Post {
            bias: &self.bias,
            scale: &self.scale,
            zero: self.zero,
            lo: self.lo,
            hi: self.hi,
        }
    }
}

/// `dst`'s pixels of `P` bytes from `src`'s of `C` (`C < P`): each byte `^ flip`,
/// then `za` up to `P`.
#[inline(always)]
fn widen_pixels<const C: usize, const P: usize>(dst: &mut [u8], src: &[u8], flip: u8, za: u8) {
    for (d, s) in dst.chunks_exact_mut(P).zip(src.chunks_exact(C)) {
        let mut px = [za; P];
        for (p, &v) in px.iter_mut().zip(s) {
            *p = v ^ flip;
        }
        d.copy_from_slice(&px);
    }
}

/// Most kernel taps (a 9 × 9 window; larger ones are refused at load).
const MAX_TAPS: usize = arch::Q8_MAX_TAPS;

/// Bytes of the input one task shifts to unsigned.
const COPY_CHUNK: usize = 64 * 1024;

/// The value of an activation byte.
#[inline(always)]
fn byte_value(b: u8, signed: bool) -> i32 {
    if signed {
        i32::from(b as i8)
    } else {
        i32::from(b)
    }
}

multiversion! {
    /// One output pixel of a depthwise convolution with multiplier 1: per block of 16
    /// channels, the bias plus each tap's products, requantized.
    fn depthwise_pixel<const FMA: bool>(
        taps: &[&[u8]],
        weights: &[i32],
        post: Q8Post<'_>,
        input: (bool, i32),
        out: &mut [u8],
    ) {
        let (signed, za) = input;
        if signed {
            depthwise_blocks::<true>(taps, weights, post, za, out);
        } else {
            depthwise_blocks::<false>(taps, weights, post, za, out);
        }
    }
}

multiversion! {
    /// One output row of a K×K depthwise convolution with multiplier 1 (K = 3 or 5),
    /// `rows` its input rows (None: padding): per block of 16 channels, the weights
    /// held while the row's pixels pass; the channels past the last block as
    /// [`depthwise_pixel`] does.
    fn depthwise_row_blocks<const FMA: bool>(
        k: usize,
        rows: [Option<&[u8]>; 5],
        weights: &[i32],
        post: Q8Post<'_>,
        input: (bool, i32),
        geometry: (usize, usize, usize, usize),
        out: &mut [u8],
    ) {
        let (signed, za) = input;
        match (k, signed) {
            (3, true) => row_blocks::<3, true>(rows, weights, post, za, geometry, out),
            (3, false) => row_blocks::<3, false>(rows, weights, post, za, geometry, out),
            (_, true) => row_blocks::<5, true>(rows, weights, post, za, geometry, out),
            (_, false) => row_blocks::<5, false>(rows, weights, post, za, geometry, out),
        }
    }
}

/// [`depthwise_row_blocks`]'s body.
#[inline(always)]
fn row_blocks<const K: usize, const SIGNED: bool>(
    rows: [Option<&[u8]>; 5],
    weights: &[i32],
    post: Q8Post<'_>,
    za: i32,
    (w_in, stride, dilation, pad): (usize, usize, usize, usize),
    out: &mut [u8],
) {
    let c = post.bias.len().min(post.scale.len());
    let ow = out.len() / c.max(1);
    let column = |ox: usize, kx: usize| arch::input_column(ox, kx, (w_in, stride, dilation, pad));
    let whole = c / LANES * LANES;
    for c0 in (0..whole).step_by(LANES) {
        // The block's weights stay in registers while the row's pixels pass.
        let w: [[[i32; LANES]; K]; K] = std::array::from_fn(|ky| {
            std::array::from_fn(|kx| block(weights, (ky * K + kx) * c + c0))
        });
        let bias: [i32; LANES] = block(post.bias, c0);
        let scale: [f32; LANES] = block(post.scale, c0);
        for ox in 0..ow {
            let mut acc = bias;
            for (wy, row) in w.iter().zip(rows) {
                let Some(row) = row else { continue };
                for (kx, wk) in wy.iter().enumerate() {
                    let Some(ix) = column(ox, kx) else { continue };
                    let x: [u8; LANES] = block(row, ix * c + c0);
                    for ((a, x), w) in acc.iter_mut().zip(x).zip(wk) {
                        *a = a.wrapping_add((byte_value(x, SIGNED) - za).wrapping_mul(*w));
                    }
                }
            }
            if let Some(o) = out.get_mut(ox * c + c0..ox * c + c0 + LANES) {
                for ((o, a), s) in o.iter_mut().zip(acc).zip(scale) {
                    *o = post.requantize(a, s) as u8;
                }
            }
        }
    }
    if whole < c {
        let mut taps: [&[u8]; 25] = [&[]; 25];
        for (ox, px) in out.chunks_exact_mut(c.max(1)).enumerate() {
            for (t, tap) in taps.iter_mut().take(K * K).enumerate() {
                let at = rows.get(t / K).copied().flatten().zip(column(ox, t % K));
                *tap = at
                    .and_then(|(row, ix)| row.get(ix * c..(ix + 1) * c))
                    .unwrap_or_default();
            }
            let tail = px.get_mut(whole..).unwrap_or_default();
            for (j, o) in tail.iter_mut().enumerate() {
                let ch = whole + j;
                let mut acc = post.bias.get(ch).copied().unwrap_or(0);
                for (t, tap) in taps.iter().enumerate() {
                    if let Some(&x) = tap.get(ch) {
                        let w = weights.get(t * c + ch).copied().unwrap_or(0);
                        acc = acc.wrapping_add((byte_value(x, SIGNED) - za).wrapping_mul(w));
                    }
                }
                *o = post.apply(acc, ch) as u8;
            }
        }
    }
}

/// [`depthwise_pixel`]'s body for activations of one signedness.
#[inline(always)]
fn depthwise_blocks<const SIGNED: bool>(
    taps: &[&[u8]],
    weights: &[i32],
    post: Q8Post<'_>,
    za: i32,
    out: &mut [u8],
) {
    let c = out.len();
    let whole = c / LANES * LANES;
    for c0 in (0..whole).step_by(LANES) {
        let mut acc: [i32; LANES] = block(post.bias, c0);
        for (t, tap) in taps.iter().enumerate() {
            let x: [u8; LANES] = block(tap, c0);
            let w: [i32; LANES] = block(weights, t * c + c0);
            for ((a, x), w) in acc.iter_mut().zip(x).zip(w) {
                *a = a.wrapping_add((byte_value(x, SIGNED) - za).wrapping_mul(w));
            }
        }
        let scale: [f32; LANES] = block(post.scale, c0);
        if let Some(o) = out.get_mut(c0..c0 + LANES) {
            for ((o, a), s) in o.iter_mut().zip(acc).zip(scale) {
                *o = post.requantize(a, s) as u8;
            }
        }
    }
    for (ch, o) in out.iter_mut().enumerate().skip(whole) {
        let mut acc = post.bias.get(ch).copied().unwrap_or(0);
        for (t, tap) in taps.iter().enumerate() {
            let x = byte_value(tap.get(ch).copied().unwrap_or(0), SIGNED) - za;
            let w = weights.get(t * c + ch).copied().unwrap_or(0);
            acc = acc.wrapping_add(x.wrapping_mul(w));
        }
        *o = post.apply(acc, ch) as u8;
    }
}

/// Channels of a depthwise block (a 512-bit vector of 32-bit sums).
const LANES: usize = 16;

/// `LANES` values of `s` from `at` (zeros past its end).
#[inline(always)]
fn block<T: Copy + Default>(s: &[T], at: usize) -> [T; LANES] {
    match s.get(at..at + LANES) {
        Some(v) => std::array::from_fn(|i| v.get(i).copied().unwrap_or_default()),
        None => [T::default(); LANES],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(7);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as u8
            })
            .collect()
    }

    /// `(geometry, depthwise)` in NHWC: input, kernel, stride, dilation, padding,
    /// groups, input and output channels per group.
    type Case = (
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 4],
        usize,
        usize,
        usize,
        bool,
    );

    #[test]
    fn convolutions_match_a_direct_sum() {
        let cases: &[Case] = &[
            // 1×1 (strided rows), channels not a multiple of four, more than a tile
            // of rows and of columns.
            ([5, 7], [1, 1], [1, 1], [1, 1], [0; 4], 1, 13, 37, false),
            ([3, 3], [1, 1], [1, 1], [1, 1], [0; 4], 1, 64, 70, false),
            // 3×3 with padding, stride 2, groups, a stem of 3 channels, 7×7 taps.
            (
                [6, 5],
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                1,
                8,
                33,
                false,
            ),
            (
                [9, 8],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 0, 1],
                1,
                3,
                16,
                false,
            ),
            ([7, 7], [3, 2], [1, 2], [2, 1], [2, 1, 0, 3], 2, 6, 5, false),
            // Grouped (tap offsets in a padded copy): regnet's 8-channel groups at
            // stride 1 and 2 over tiles that span output rows, and groups of 3.
            (
                [9, 13],
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                4,
                8,
                8,
                false,
            ),
            (
                [11, 10],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                3,
                8,
                24,
                false,
            ),
            ([6, 7], [3, 3], [1, 1], [1, 1], [0, 1, 2, 0], 5, 3, 2, false),
            // Interleaved on VNNI: 2, 4 and 8 groups per vector, a last block of fewer
            // groups (its input permuted pixel by pixel, over one and two vectors),
            // rows of whole blocks (one and two quads per group), dilation; a grouped
            // 1×1 that reads its input in place.
            (
                [10, 9],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                7,
                8,
                8,
                false,
            ),
            (
                [8, 12],
                [3, 3],
                [1, 1],
                [2, 2],
                [2, 2, 2, 2],
                8,
                4,
                4,
                false,
            ),
            (
                [7, 9],
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 0, 1, 2],
                16,
                8,
                2,
                false,
            ),
            (
                [6, 5],
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                13,
                8,
                8,
                false,
            ),
            ([5, 6], [1, 1], [1, 1], [1, 1], [0; 4], 4, 8, 8, false),
            // Groups of 16 outputs, one per panel (regnet_x's): whole quads per group,
            // and 12 input channels per group at stride 2 with uneven padding.
            (
                [7, 7],
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                5,
                16,
                16,
                false,
            ),
            (
                [9, 8],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 1, 1],
                3,
                12,
                16,
                false,
            ),
            (
                [12, 11],
                [7, 7],
                [2, 2],
                [1, 1],
                [3, 3, 3, 3],
                1,
                3,
                20,
                false,
            ),
            // Few channels read by kernel rows: vertical dilation, uneven padding.
            (
                [9, 10],
                [3, 3],
                [1, 2],
                [2, 1],
                [1, 2, 0, 1],
                1,
                2,
                9,
                false,
            ),
            // Depthwise: multiplier 1 and 2, stride, dilation, 5×5.
            ([7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 70, 1, 1, true),
            ([8, 8], [3, 3], [2, 2], [1, 1], [0, 1, 1, 0], 20, 1, 2, true),
            ([6, 6], [5, 5], [1, 1], [2, 2], [4, 4, 4, 4], 5, 1, 1, true),
            // Whole blocks of 16 on the row kernel at 5×5, stride 2; a 7×7 window on
            // the pixel kernel.
            (
                [9, 11],
                [5, 5],
                [2, 2],
                [1, 1],
                [2, 2, 2, 2],
                32,
                1,
                1,
                true,
            ),
            ([8, 9], [7, 7], [1, 1], [1, 1], [3, 3, 3, 3], 20, 1, 1, true),
            // Whole blocks of 16 on the AVX2 row kernel (taps in pairs): 3×3 with
            // padding, with stride and dilation; then a last block of fewer at
            // stride 2 and at 5×5.
            ([7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 48, 1, 1, true),
            (
                [9, 10],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                40,
                1,
                1,
                true,
            ),
            ([8, 9], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2], 24, 1, 1, true),
            (
                [10, 7],
                [3, 3],
                [2, 2],
                [2, 2],
                [2, 1, 2, 1],
                16,
                1,
                1,
                true,
            ),
        ];
        for &(input, kernel, stride, dilation, padding, groups, cig, cog, dw) in cases {
            let p = Conv2dParams {
                in_channels: groups * cig,
                out_channels: groups * cog,
                groups,
                input,
                kernel,
                stride,
                padding,
                dilation,
            };
            let cout = p.out_channels;
            let taps = kernel[0] * kernel[1];
            let wlen = if dw { taps * cout } else { cout * taps * cig };
            let w: Vec<i8> = bytes(wlen, 2).iter().map(|&b| b as i8).collect();
            let bias: Vec<i32> = (0..cout).map(|o| (o as i32 * 977) % 3001 - 1500).collect();
            let scale: Vec<f32> = (0..cout).map(|o| 1.0 / (300.0 + 17.0 * o as f32)).collect();
            let batch = 2;
            let x = bytes(batch * input[0] * input[1] * p.in_channels, 1);
            // Signed and unsigned activations; weights with zero point 0, and with one
            // that takes w - zw past a byte (to 255 with -128).
            for (signed, wz) in [
                (true, 0),
                (false, 0),
                (true, -100),
                (false, 77),
                (true, -128),
            ] {
                let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
                let q = QuantParams {
                    signed,
                    input_zero: lo + 37,
                    weight_zero: wz,
                    bias: &bias,
                    scale: &scale,
                    output_zero: lo + 101,
                    output_min: lo + 3,
                    output_max: hi - 5,
                };
                let [oh, ow] = p.output().unwrap();
                // The reference, from the definition.
                let value = |v: u8| {
                    if signed {
                        i32::from(v as i8)
                    } else {
                        i32::from(v)
                    }
                };
                let mut want = vec![0u8; batch * oh * ow * cout];
                for n in 0..batch {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            for o in 0..cout {
                                let g = o / cog;
                                let mut acc = bias[o];
                                for t in 0..taps {
                                    let (ky, kx) = (t / kernel[1], t % kernel[1]);
                                    let iy =
                                        (oy * stride[0] + ky * dilation[0]).checked_sub(padding[0]);
                                    let ix =
                                        (ox * stride[1] + kx * dilation[1]).checked_sub(padding[1]);
                                    let (Some(iy), Some(ix)) = (iy, ix) else {
                                        continue;
                                    };
                                    if iy >= input[0] || ix >= input[1] {
                                        continue;
                                    }
                                    let px = ((n * input[0] + iy) * input[1] + ix) * p.in_channels;
                                    for i in 0..cig {
                                        let xv = value(x[px + g * cig + i]) - q.input_zero;
                                        let wv = if dw {
                                            i32::from(w[t * cout + o])
                                        } else {
                                            i32::from(w[(o * taps + t) * cig + i])
                                        } - wz;
                                        acc += xv * wv;
                                    }
                                }
                                let v = (acc as f32 * scale[o])
                                    .max((q.output_min - q.output_zero) as f32)
                                    .min((q.output_max - q.output_zero) as f32);
                                let v = v.round_ties_even() as i32 + q.output_zero;
                                want[((n * oh + oy) * ow + ox) * cout + o] = v as u8;
                            }
                        }
                    }
                }
                for kernel in Q8Kernel::available() {
                    let conv = QConvNhwc::for_kernel(p, dw, &w, &q, kernel).unwrap();
                    // Groups of 2, 4 or 8 outputs share a vector on VNNI; groups of
                    // 16 fill one each.
                    let interleaves = kernel == Q8Kernel::Vnni
                        && !dw
                        && wz == 0
                        && groups > 1
                        && [2, 4, 8, 16].contains(&cog)
                        && (p.kernel != [1, 1] || stride != [1, 1] || padding != [0; 4]);
                    assert_eq!(conv.algorithm() == "interleaved", interleaves, "{p:?}");
                    for threads in [1, 2, 3] {
                        let pool = ThreadPool::new(threads).unwrap();
                        let mut y = vec![0xAAu8; want.len()];
                        let mut scratch = vec![0u8; conv.scratch_len(batch).unwrap()];
                        conv.run(&pool, &x, batch, &mut y, &mut scratch).unwrap();
                        assert_eq!(
                            y,
                            want,
                            "{} signed {signed} zw {wz} {:?} threads {threads}: {p:?}",
                            conv.algorithm(),
                            conv.kernel
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_layers_are_errors() {
        let p = Conv2dParams {
            in_channels: 4,
            out_channels: 4,
            groups: 1,
            input: [3, 3],
            kernel: [10, 10],
            stride: [1, 1],
            padding: [5; 4],
            dilation: [1, 1],
        };
        let (bias, scale) = ([0; 4], [1.0; 4]);
        let q = QuantParams {
            signed: true,
            input_zero: 0,
            weight_zero: 0,
            bias: &bias,
            scale: &scale,
            output_zero: 0,
            output_min: -128,
            output_max: 127,
        };
        // Too many taps, too few weights, a zero point outside the type.
        assert!(QConvNhwc::new(p, false, &[0; 1600], &q).is_err());
        let p = Conv2dParams {
            kernel: [3, 3],
            padding: [1; 4],
            ..p
        };
        assert!(QConvNhwc::new(p, false, &[0; 143], &q).is_err());
        let q2 = QuantParams {
            input_zero: 200,
            ..q
        };
        assert!(QConvNhwc::new(p, false, &[0; 144], &q2).is_err());
        let conv = QConvNhwc::new(p, false, &[0; 144], &q).unwrap();
        let pool = ThreadPool::new(1).unwrap();
        let mut y = [0u8; 36];
        let mut s = vec![0u8; conv.scratch_len(1).unwrap()];
        assert!(conv.run(&pool, &[0; 35], 1, &mut y, &mut s).is_err());
        assert!(conv.run(&pool, &[0; 36], 1, &mut y[..35], &mut s).is_err());
        assert!(conv.run(&pool, &[0; 36], 1, &mut y, &mut []).is_err());
    }
}
