//! NHWC 2-D convolution: matrix products with implicit im2col, and depthwise
//! convolution with register accumulators over channel blocks (see the module docs of
//! [`crate::nhwc`]).

use super::Geometry;
use crate::arch::{
    depthwise_pixels, indirect_microkernel, IndirectRows, PixelTaps, Post, TileBias, INDIRECT_TAPS,
};
use crate::elementwise::{self, clamp, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Gemm, PackedB};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

/// Channels accumulated at once in registers by the depthwise and pooling loops.
pub(crate) const CB: usize = 16;
/// Taps combined per pass (larger windows take several passes).
pub(crate) const TAPS: usize = 32;

enum Algo {
    /// One product per group; `pointwise`: the input is the left operand as it is.
    Gemm {
        weights: Vec<PackedB>,
        pointwise: bool,
    },
    /// Weights `[taps, channels]`, `mult` output channels per input channel.
    Depthwise { weights: Vec<f32>, mult: usize },
}

/// A 2-D NHWC convolution prepared for repeated runs.
pub struct ConvNhwc {
    g: Geometry,
    groups: usize,
    cig: usize,
    cog: usize,
    out: [usize; 2],
    gemm: Gemm,
    algo: Algo,
    bias: Vec<f32>,
    /// Per group, its bias followed by `nr` zeros (tiles read whole panels of it).
    padded_bias: Vec<f32>,
    /// A row of zeros for the taps that fall on padding.
    zero: Vec<f32>,
    /// The clamp of the activation, fused into the kernels (infinite without one).
    min: f32,
    max: f32,
    /// Another activation, applied to each tile once it is stored.
    after: Activation,
}

impl std::fmt::Debug for ConvNhwc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvNhwc")
            .field("geometry", &self.g)
            .field("groups", &self.groups)
            .field("algorithm", &self.algorithm())
            .finish()
    }
}

impl ConvNhwc {
    /// A convolution of `groups` groups of `cig` input and `cog` output channels.
    /// Regular weights are `[groups·cog, kh, kw, cig]`; with `depthwise` (then `cig` is
    /// 1 and `cog` the channel multiplier) they are `[kh, kw, groups·cog]`. The bias has
    /// one value per output channel; `activation` follows (a clamp runs inside the
    /// kernels, others on each stored tile).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gemm: Gemm,
        g: Geometry,
        groups: usize,
        cig: usize,
        cog: usize,
        depthwise: bool,
        weights: &[f32],
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Result<Self> {
        let ((min, max), after) = match activation {
            Activation::Clamp { min, max } => ((min, max), Activation::Identity),
            Activation::Identity => ((f32::NEG_INFINITY, f32::INFINITY), Activation::Identity),
            a => ((f32::NEG_INFINITY, f32::INFINITY), a),
        };
        let out = g.output()?;
        let taps = error::mul(g.kernel[0], g.kernel[1], "kernel")?;
        let cout = error::mul(groups, cog, "output channels")?;
        let k = error::mul(taps, cig, "convolution depth")?;
        let w_len = error::mul(cout, k, "convolution weights")?;
        if groups == 0 || cig == 0 || (depthwise && cig != 1) {
            return Err(Error::InvalidParameter {
                what: format!("{groups} groups of {cig} input channels (depthwise: {depthwise})"),
            });
        }
        error::need("convolution weights", weights.len(), w_len)?;
        let bias = match bias {
            Some(b) if b.len() == cout => b.to_vec(),
            Some(b) => {
                return Err(Error::ShapeMismatch {
                    what: format!("bias of {} values for {cout} output channels", b.len()),
                })
            }
            None => vec![0.0; cout],
        };
        let weights = weights.get(..w_len).unwrap_or_default();
        let algo = if depthwise {
            Algo::Depthwise {
                weights: weights.to_vec(),
                mult: cog,
            }
        } else {
            let pointwise = g.kernel == [1, 1] && g.stride == [1, 1] && g.padding == [0; 4];
            let weights = weights
                .chunks_exact(cog * k)
                .map(|w| gemm.pack_b(MatRef::row_major(w, cog, k)?.t()))
                .collect::<Result<Vec<_>>>()?;
            Algo::Gemm { weights, pointwise }
        };
        let nr = gemm.isa().gemm_tile().1;
        let padded_bias = bias
            .chunks(cog.max(1))
            .flat_map(|b| b.iter().copied().chain(std::iter::repeat_n(0.0, nr)))
            .collect();
        Ok(Self {
            g,
            groups,
            cig,
            cog,
            out,
            gemm,
            algo,
            bias,
            padded_bias,
            zero: vec![0.0; cig.max(groups)],
            min,
            max,
            after,
        })
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

    /// Heap bytes held by the prepared weights and bias.
    pub fn bytes(&self) -> usize {
        let w = match &self.algo {
            Algo::Gemm { weights, .. } => weights.iter().map(PackedB::bytes).sum(),
            Algo::Depthwise { weights, .. } => weights.len() * 4,
        };
        w + self.bias.len() * 4
    }

    /// Elements of input and output for `batch` images.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        let cin = self.groups * self.cig;
        let cout = self.groups * self.cog;
        let x = error::mul(
            error::mul(self.g.input[0] * self.g.input[1], cin, "input")?,
            batch,
            "input",
        )?;
        let y = error::mul(
            error::mul(self.out[0] * self.out[1], cout, "output")?,
            batch,
            "output",
        )?;
        Ok((x, y))
    }

    /// Scratch (f32 elements) a run over `batch` images needs on `threads` threads.
    pub fn scratch_len(&self, _batch: usize, threads: usize) -> Result<usize> {
        match self.algo {
            Algo::Gemm { .. } => {
                let (mr, _) = self.gemm.isa().gemm_tile();
                let depth = self.g.kernel[0] * self.g.kernel[1] * self.cig;
                Ok(if self.gathers() {
                    mr * depth * threads
                } else {
                    0
                })
            }
            Algo::Depthwise { mult, .. } => {
                // Expanded input pixels when a channel feeds several outputs.
                if mult > 1 {
                    error::mul(self.groups * mult, threads, "depthwise scratch")
                } else {
                    Ok(0)
                }
            }
        }
    }

    /// Runs on `batch` NHWC images: `x` `[batch, h, w, groups·cig]`, `y`
    /// `[batch, oh, ow, groups·cog]`.
    pub fn run(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let (x_len, y_len) = self.io_len(batch)?;
        error::need("convolution input", x.len(), x_len)?;
        error::need("convolution output", y.len(), y_len)?;
        if y_len == 0 {
            return Ok(());
        }
        let (x, y) = (
            x.get(..x_len).unwrap_or_default(),
            y.get_mut(..y_len).unwrap_or_default(),
        );
        let cin = self.groups * self.cig;
        let cout = self.groups * self.cog;
        match &self.algo {
            Algo::Gemm { weights, .. } => self.indirect(pool, x, batch, y, weights, scratch),
            Algo::Depthwise { weights, mult } => {
                let row = self.out[1] * cout;
                let plane_in = self.g.input[0] * self.g.input[1] * cin;
                let per_thread = if *mult > 1 { cout } else { 0 };
                let failed = std::sync::atomic::AtomicBool::new(false);
                pool.parallel_chunks(y, row, scratch, per_thread, |r, out_row, part| {
                    let (n, oy) = (r / self.out[0], r % self.out[0]);
                    let img = x.get(n * plane_in..(n + 1) * plane_in).unwrap_or_default();
                    if self
                        .depthwise_row(img, oy, out_row, weights, *mult, part)
                        .is_err()
                    {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                })?;
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(Error::InvalidParameter {
                        what: "depthwise row failed".into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// Whether each pixel's receptive field is gathered into a contiguous row before
    /// the product: for few input channels per group, where per-tap rows would be too
    /// short to keep the micro-kernel busy (a network's first layer).
    fn gathers(&self) -> bool {
        self.cig < 16 && self.g.kernel[0] * self.g.kernel[1] > 1
    }

    /// The products of a regular convolution, per group: output pixels × output
    /// channels, the left operand read in place through each pixel's tap rows (a zero
    /// row for padding) or gathered rows ([`Self::gathers`]), the weights' packed
    /// panels as the right operand, bias and clamp fused. Threads take runs of pixel
    /// tiles; within a run, blocks of panels stay in cache while the run's tiles pass
    /// over them.
    fn indirect(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        weights: &[PackedB],
        scratch: &mut [f32],
    ) -> Result {
        let isa = self.gemm.isa();
        let (mr, nr) = isa.gemm_tile();
        let cin = self.groups * self.cig;
        let cout = self.groups * self.cog;
        let [oh, ow] = self.out;
        let ohw = oh * ow;
        let [kh, kw] = self.g.kernel;
        let taps = kh * kw;
        let depth = taps * self.cig;
        let plane_in = self.g.input[0] * self.g.input[1] * cin;
        let pixels = batch * ohw;
        let tiles = pixels.div_ceil(mr);
        // Tiles per task: enough for every thread, few enough that a task's rows stay
        // in L2.
        let per_task = tiles.div_ceil(pool.threads() * 2).clamp(1, 16);
        let panels = self.cog.div_ceil(nr);
        // Panels per block: about 64 KiB of weights.
        let block = (16384 / (depth * nr).max(1)).clamp(1, panels.max(1));
        let gather = self.gathers();
        let pointwise = matches!(
            self.algo,
            Algo::Gemm {
                pointwise: true,
                ..
            }
        );
        let per_thread = if gather { mr * depth } else { 0 };
        let zero = &self.zero;
        let failed = std::sync::atomic::AtomicBool::new(false);
        let fail = || failed.store(true, std::sync::atomic::Ordering::Relaxed);
        // The input row of pixel `p` at tap `t` for group `gi`, if inside the image.
        let source = |p: usize, t: usize, gi: usize| -> Option<&[f32]> {
            let (n, pix) = (p / ohw, p % ohw);
            let (iy, ix) = self.g.source(pix / ow, pix % ow, t / kw, t % kw)?;
            let s = n * plane_in + (iy * self.g.input[1] + ix) * cin + gi * self.cig;
            x.get(s..s + self.cig)
        };
        pool.parallel_chunks(
            y,
            per_task * mr * cout,
            scratch,
            per_thread,
            |ci, chunk, buf| {
                let m0 = ci * per_task * mr;
                let rows_here = chunk.len() / cout.max(1);
                let Ok(mut c) = MatMut::new(chunk, rows_here, cout, cout, 1) else {
                    fail();
                    return;
                };
                let mut a: [&[f32]; INDIRECT_TAPS * 12] = [&[]; INDIRECT_TAPS * 12];
                for (gi, packed) in weights.iter().enumerate() {
                    let panels_data = packed.panels();
                    let bias = self
                        .padded_bias
                        .get(gi * (self.cog + nr)..)
                        .unwrap_or_default();
                    for q0 in (0..panels).step_by(block) {
                        for mt in (0..rows_here).step_by(mr) {
                            let rows = mr.min(rows_here - mt);
                            if gather {
                                for (i, row) in
                                    buf.chunks_exact_mut(depth.max(1)).take(rows).enumerate()
                                {
                                    for (t, dst) in row.chunks_exact_mut(self.cig).enumerate() {
                                        match source(m0 + mt + i, t, gi) {
                                            Some(src) => dst.copy_from_slice(src),
                                            None => dst.fill(0.0),
                                        }
                                    }
                                }
                                let gathered: [&[f32]; 12] = std::array::from_fn(|i| {
                                    buf.get(i * depth..(i + 1) * depth).unwrap_or_default()
                                });
                                let Ok(r) = IndirectRows::new(
                                    gathered.get(..rows).unwrap_or_default(),
                                    rows,
                                    1,
                                    depth,
                                ) else {
                                    fail();
                                    return;
                                };
                                self.panels(
                                    isa,
                                    &r,
                                    panels_data,
                                    bias,
                                    &mut c,
                                    mt,
                                    gi,
                                    q0..(q0 + block).min(panels),
                                    true,
                                    true,
                                    0,
                                    &fail,
                                );
                                continue;
                            }
                            for t0 in (0..taps).step_by(INDIRECT_TAPS) {
                                let nt = INDIRECT_TAPS.min(taps - t0);
                                if pointwise {
                                    for (i, slot) in a.iter_mut().take(rows).enumerate() {
                                        let s = (m0 + mt + i) * cin + gi * self.cig;
                                        *slot = x.get(s..s + self.cig).unwrap_or(zero);
                                    }
                                } else {
                                    for t in 0..nt {
                                        for i in 0..rows {
                                            if let Some(slot) = a.get_mut(t * rows + i) {
                                                *slot =
                                                    source(m0 + mt + i, t0 + t, gi).unwrap_or(zero);
                                            }
                                        }
                                    }
                                }
                                let Ok(r) = IndirectRows::new(
                                    a.get(..nt * rows).unwrap_or_default(),
                                    rows,
                                    nt,
                                    self.cig,
                                ) else {
                                    fail();
                                    return;
                                };
                                self.panels(
                                    isa,
                                    &r,
                                    panels_data,
                                    bias,
                                    &mut c,
                                    mt,
                                    gi,
                                    q0..(q0 + block).min(panels),
                                    t0 == 0,
                                    t0 + nt == taps,
                                    t0 * self.cig,
                                    &fail,
                                );
                            }
                        }
                    }
                }
            },
        )?;
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::InvalidParameter {
                what: "convolution tile failed".into(),
            });
        }
        Ok(())
    }

    /// One tile's rows against panels `qs` of a group's weights, from depth `d0`:
    /// `first` overwrites the output, `last` adds the bias and clamps.
    #[allow(clippy::too_many_arguments)]
    fn panels(
        &self,
        isa: crate::Isa,
        r: &IndirectRows<'_>,
        panels: &crate::gemm::Panels,
        bias: &[f32],
        c: &mut MatMut<'_>,
        mt: usize,
        gi: usize,
        qs: std::ops::Range<usize>,
        first: bool,
        last: bool,
        d0: usize,
        fail: &dyn Fn(),
    ) {
        let nr = isa.gemm_tile().1;
        let rows = r.rows();
        for q in qs {
            let b = panels.panel(q).get(d0 * nr..).unwrap_or_default();
            let post = last.then(|| Post {
                bias: TileBias::Cols(bias.get(q * nr..).unwrap_or_default()),
                min: self.min,
                max: self.max,
            });
            let col = gi * self.cog + q * nr;
            let ok = if (q + 1) * nr <= self.cog {
                indirect_microkernel(isa, r, b, c, (mt, col), !first, post.as_ref())
            } else {
                // An edge panel: through a tile buffer, so that columns past the
                // group stay untouched.
                let cols = self.cog - q * nr;
                let mut tile = [0f32; 12 * 32];
                let tile = tile.get_mut(..rows * nr).unwrap_or_default();
                if !first {
                    for (i, tr) in tile.chunks_exact_mut(nr).enumerate() {
                        if let Some(src) = c.row_run(mt + i, col, cols) {
                            tr.iter_mut().zip(src.iter()).for_each(|(d, &s)| *d = s);
                        }
                    }
                }
                MatMut::row_major(tile, rows, nr)
                    .and_then(|mut tv| {
                        indirect_microkernel(isa, r, b, &mut tv, (0, 0), !first, post.as_ref())
                    })
                    .map(|()| {
                        for (i, tr) in tile.chunks_exact(nr).enumerate() {
                            if let Some(dst) = c.row_run(mt + i, col, cols) {
                                dst.iter_mut().zip(tr).for_each(|(d, &s)| *d = s);
                            }
                        }
                    })
            };
            if ok.is_err() {
                fail();
            }
            if last && self.after != Activation::Identity {
                let cols = nr.min(self.cog - q * nr);
                for i in 0..rows {
                    if let Some(run) = c.row_run(mt + i, col, cols) {
                        elementwise::activate(isa, run, self.after);
                    }
                }
            }
        }
    }

    /// One output row of a depthwise convolution: runs of pixels, each with one input
    /// row per tap (the zero row for padding), through the depthwise kernel.
    fn depthwise_row(
        &self,
        img: &[f32],
        oy: usize,
        out_row: &mut [f32],
        weights: &[f32],
        mult: usize,
        expanded: &mut [f32],
    ) -> Result {
        let c = self.groups * mult;
        let cin = self.groups;
        let [kh, kw] = self.g.kernel;
        let [ih, iw] = self.g.input;
        let isa = self.gemm.isa();
        let total = kh * kw;
        let (sh, dh, pt) = (self.g.stride[0], self.g.dilation[0], self.g.padding[0]);
        let (sw, dw, pl) = (self.g.stride[1], self.g.dilation[1], self.g.padding[3]);
        let zero = self.zero.get(..cin).unwrap_or_default();
        // The input row of tap t for output column ox.
        let tap = |ox: usize, t: usize| -> &[f32] {
            let iy = (oy * sh + (t / kw) * dh)
                .checked_sub(pt)
                .filter(|&v| v < ih);
            let ix = (ox * sw + (t % kw) * dw)
                .checked_sub(pl)
                .filter(|&v| v < iw);
            match (iy, ix) {
                (Some(iy), Some(ix)) => {
                    let p = (iy * iw + ix) * cin;
                    img.get(p..p + cin).unwrap_or(zero)
                }
                _ => zero,
            }
        };
        const SLOTS: usize = 256;
        let mut a: [&[f32]; SLOTS] = [&[]; SLOTS];
        if mult == 1 && total <= INDIRECT_TAPS {
            let run = (SLOTS / total.max(1)).clamp(1, 8);
            for (r, outs) in out_row.chunks_mut(run * c).enumerate() {
                let pixels = outs.len() / c.max(1);
                for p in 0..pixels {
                    for t in 0..total {
                        if let Some(slot) = a.get_mut(p * total + t) {
                            *slot = tap(r * run + p, t);
                        }
                    }
                }
                let taps = PixelTaps::new(&a, pixels, total, c)?;
                depthwise_pixels(
                    isa, &taps, weights, &self.bias, outs, true, true, self.min, self.max,
                )?;
                if self.after != Activation::Identity {
                    elementwise::activate(isa, outs, self.after);
                }
            }
            return Ok(());
        }
        for (ox, out) in out_row.chunks_exact_mut(c).enumerate() {
            for t0 in (0..total).step_by(INDIRECT_TAPS) {
                let nt = INDIRECT_TAPS.min(total - t0);
                let (first, last) = (t0 == 0, t0 + nt == total);
                if mult == 1 {
                    for t in 0..nt {
                        if let Some(slot) = a.get_mut(t) {
                            *slot = tap(ox, t0 + t);
                        }
                    }
                    let taps = PixelTaps::new(&a, 1, nt, c)?;
                    let w = weights.get(t0 * c..).unwrap_or_default();
                    depthwise_pixels(
                        isa, &taps, w, &self.bias, out, first, last, self.min, self.max,
                    )?;
                    if last {
                        elementwise::activate(isa, out, self.after);
                    }
                    continue;
                }
                // Each input channel feeds `mult` outputs: expand the pixel.
                let exp = expanded.get_mut(..c).unwrap_or_default();
                if first {
                    out.copy_from_slice(self.bias.get(..c).unwrap_or_default());
                }
                for t in t0..t0 + nt {
                    let px = tap(ox, t);
                    for (k, e) in exp.iter_mut().enumerate() {
                        *e = px.get(k / mult).copied().unwrap_or(0.0);
                    }
                    let w = weights.get(t * c..(t + 1) * c).unwrap_or_default();
                    for ((o, &e), &w) in out.iter_mut().zip(exp.iter()).zip(w) {
                        *o = e.mul_add(w, *o);
                    }
                }
                if last {
                    for o in out.iter_mut() {
                        *o = clamp(*o, self.min, self.max);
                    }
                    elementwise::activate(isa, out, self.after);
                }
            }
        }
        Ok(())
    }
}
