//! NHWC 2-D convolution: matrix products with implicit im2col, and depthwise
//! convolution with register accumulators over channel blocks (see the module docs of
//! [`crate::nhwc`]).

use super::Geometry;
use crate::arch::{madd, multiversion, Isa};
use crate::elementwise::{clamp, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Bias, Epilogue, Gemm, Lines, PackedB, Side};
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
    min: f32,
    max: f32,
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
    /// one value per output channel; outputs are clamped to `[min, max]`.
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
        min: f32,
        max: f32,
    ) -> Result<Self> {
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
        Ok(Self {
            g,
            groups,
            cig,
            cog,
            out,
            gemm,
            algo,
            bias,
            min,
            max,
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

    fn activation(&self) -> Activation {
        if self.min == f32::NEG_INFINITY && self.max == f32::INFINITY {
            Activation::Identity
        } else {
            Activation::Clamp {
                min: self.min,
                max: self.max,
            }
        }
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
    pub fn scratch_len(&self, batch: usize, threads: usize) -> Result<usize> {
        match self.algo {
            Algo::Gemm { .. } => {
                let m = error::mul(
                    error::mul(self.out[0], self.out[1], "pixels")?,
                    batch,
                    "pixels",
                )?;
                let k = self.g.kernel[0] * self.g.kernel[1] * self.cig;
                self.gemm.scratch_len(m, self.cog, k, false, true, threads)
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
        let m = batch * self.out[0] * self.out[1];
        match &self.algo {
            Algo::Gemm { weights, pointwise } => {
                let act = self.activation();
                for (gi, packed) in weights.iter().enumerate() {
                    let bias = self
                        .bias
                        .get(gi * self.cog..(gi + 1) * self.cog)
                        .unwrap_or_default();
                    let epi = Epilogue {
                        accumulate: false,
                        bias: Bias::Col(bias),
                        activation: act,
                    };
                    let c = MatMut::new(
                        y.get_mut(gi * self.cog..).unwrap_or_default(),
                        m,
                        self.cog,
                        cout,
                        1,
                    )?;
                    let b = Side::<MatRef<'_>>::Packed(packed.panels());
                    if *pointwise {
                        let a = MatRef::new(
                            x.get(gi * self.cig..).unwrap_or_default(),
                            m,
                            self.cig,
                            cin,
                            1,
                        )?;
                        self.gemm
                            .run_sides(pool, c, Side::Lines(&a), b, &epi, scratch)?;
                    } else {
                        let a = Im2col {
                            g: &self.g,
                            out: self.out,
                            x,
                            cin,
                            c0: gi * self.cig,
                            cig: self.cig,
                            pixels: m,
                        };
                        self.gemm
                            .run_sides(pool, c, Side::Lines(&a), b, &epi, scratch)?;
                    }
                }
                Ok(())
            }
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

    /// One output row of a depthwise convolution.
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
        let iw = self.g.input[1];
        let isa = self.gemm.isa();
        for (ox, out) in out_row.chunks_exact_mut(c).enumerate() {
            let mut taps: [Option<&[f32]>; TAPS] = [None; TAPS];
            let mut rows: [usize; TAPS] = [0; TAPS];
            let mut n = 0usize;
            let mut first = true;
            let total = kh * kw;
            for t in 0..total {
                let (ky, kx) = (t / kw, t % kw);
                if let Some((iy, ix)) = self.g.source(oy, ox, ky, kx) {
                    let p = (iy * iw + ix) * cin;
                    if let (Some(slot), Some(row)) = (taps.get_mut(n), rows.get_mut(n)) {
                        *slot = img.get(p..p + cin);
                        *row = t;
                        n += 1;
                    }
                }
                if n == TAPS || t + 1 == total {
                    let last = t + 1 == total;
                    if mult == 1 {
                        dw_pixel(
                            isa,
                            out,
                            taps.get(..n).unwrap_or_default(),
                            rows.get(..n).unwrap_or_default(),
                            weights,
                            &self.bias,
                            first,
                            last,
                            self.min,
                            self.max,
                        );
                    } else {
                        // Each input channel feeds `mult` outputs: expand the pixel.
                        let exp = expanded.get_mut(..c).unwrap_or_default();
                        if first {
                            out.copy_from_slice(self.bias.get(..c).unwrap_or_default());
                        }
                        for (tap, &t) in taps.iter().take(n).zip(rows.iter()) {
                            if let Some(px) = tap {
                                for (k, e) in exp.iter_mut().enumerate() {
                                    *e = px.get(k / mult).copied().unwrap_or(0.0);
                                }
                                let w = weights.get(t * c..(t + 1) * c).unwrap_or_default();
                                for ((o, &e), &w) in out.iter_mut().zip(exp.iter()).zip(w) {
                                    *o = e.mul_add(w, *o);
                                }
                            }
                        }
                        if last {
                            for o in out.iter_mut() {
                                *o = clamp(*o, self.min, self.max);
                            }
                        }
                    }
                    first = false;
                    n = 0;
                }
            }
        }
        Ok(())
    }
}

multiversion! {
    /// One depthwise output pixel over a pass of taps: `out = (first ? bias : out) +
    /// Σ taps[i] · w[rows[i]]`, clamped on the `last` pass; 16 channels at a time.
    fn dw_pixel<const FMA: bool>(
        out: &mut [f32],
        taps: &[Option<&[f32]>],
        rows: &[usize],
        w: &[f32],
        bias: &[f32],
        first: bool,
        last: bool,
        min: f32,
        max: f32,
    ) {
        let c = out.len();
        let mut c0 = 0;
        while c0 < c {
            let len = CB.min(c - c0);
            let mut acc = [0f32; CB];
            let init = if first { bias.get(c0..c0 + len) } else { out.get(c0..c0 + len) };
            if let Some(init) = init {
                for (a, &b) in acc.iter_mut().zip(init) {
                    *a = b;
                }
            }
            if len == CB {
                for (tap, &t) in taps.iter().zip(rows) {
                    let (Some(Some(x)), Some(wt)) = (
                        tap.map(|p| p.get(c0..c0 + CB).and_then(|s| <&[f32; CB]>::try_from(s).ok())),
                        w.get(t * c + c0..t * c + c0 + CB).and_then(|s| <&[f32; CB]>::try_from(s).ok()),
                    ) else {
                        continue;
                    };
                    for ((a, &xv), &wv) in acc.iter_mut().zip(x).zip(wt) {
                        *a = madd::<FMA>(xv, wv, *a);
                    }
                }
            } else {
                for (tap, &t) in taps.iter().zip(rows) {
                    let (Some(Some(x)), Some(wt)) = (
                        tap.map(|p| p.get(c0..c0 + len)),
                        w.get(t * c + c0..t * c + c0 + len),
                    ) else {
                        continue;
                    };
                    for ((a, &xv), &wv) in acc.iter_mut().zip(x).zip(wt) {
                        *a = madd::<FMA>(xv, wv, *a);
                    }
                }
            }
            if let Some(o) = out.get_mut(c0..c0 + len) {
                for (o, &a) in o.iter_mut().zip(&acc) {
                    *o = if last { clamp(a, min, max) } else { a };
                }
            }
            c0 += len;
        }
    }
}

/// The implicit im2col matrix of a group over all images: lines are output pixels
/// (image-major), depth runs over taps then the group's input channels.
struct Im2col<'a> {
    g: &'a Geometry,
    out: [usize; 2],
    x: &'a [f32],
    /// Channels of an input pixel, the group's first one, and the group's count.
    cin: usize,
    c0: usize,
    cig: usize,
    pixels: usize,
}

impl Lines for Im2col<'_> {
    fn lines(&self) -> usize {
        self.pixels
    }

    fn depth(&self) -> usize {
        self.g.kernel[0] * self.g.kernel[1] * self.cig
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
        let [oh, ow] = self.out;
        let [ih, iw] = self.g.input;
        let kw = self.g.kernel[1];
        let plane = ih * iw * self.cin;
        let panels = len.div_ceil(w);
        let dst = dst.get_mut(..panels * kc * w).unwrap_or_default();
        for (q, panel) in dst.chunks_exact_mut(kc * w).enumerate() {
            for r in 0..w {
                let line = l0 + q * w + r;
                if line >= l0 + len {
                    // Past the block: zero lines.
                    for p in 0..kc {
                        if let Some(v) = panel.get_mut(p * w + r) {
                            *v = 0.0;
                        }
                    }
                    continue;
                }
                let (n, pix) = (line / (oh * ow), line % (oh * ow));
                let (oy, ox) = (pix / ow, pix % ow);
                let img = self.x.get(n * plane..(n + 1) * plane).unwrap_or_default();
                let mut p = 0;
                while p < kc {
                    let depth = k0 + p;
                    let (tap, ci) = (depth / self.cig, depth % self.cig);
                    let run = (self.cig - ci).min(kc - p);
                    let src = self
                        .g
                        .source(oy, ox, tap / kw, tap % kw)
                        .and_then(|(iy, ix)| {
                            let s = (iy * iw + ix) * self.cin + self.c0 + ci;
                            img.get(s..s + run)
                        });
                    match src {
                        Some(s) => {
                            for (j, &v) in s.iter().enumerate() {
                                if let Some(d) = panel.get_mut((p + j) * w + r) {
                                    *d = v;
                                }
                            }
                        }
                        None => {
                            for j in 0..run {
                                if let Some(d) = panel.get_mut((p + j) * w + r) {
                                    *d = 0.0;
                                }
                            }
                        }
                    }
                    p += run;
                }
            }
        }
    }
}
