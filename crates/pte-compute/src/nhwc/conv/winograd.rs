//! Winograd's minimal filtering for 3×3 stride-1 convolutions (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016).
//!
//! F(m×m, 3×3) computes an m×m block of outputs from an α×α input tile, α = m + 2:
//! per input channel the tile becomes α² values `V = Bᵀ d B`; the weights become,
//! once at load, α² matrices of input × output channels `U = G g Gᵀ`; one matrix
//! product per tile position, `M = V · U` over all input channels, runs on the GEMM
//! micro-kernel; `Aᵀ M A` turns the α² sums into the m×m outputs, with the bias,
//! residual and clamp applied on the way to the output. Multiplications per output
//! and channel pair fall from 9 to α²/m²: 4 for F(2×2, 3×3), 2.25 for F(4×4, 3×3);
//! the transforms cost time linear in the channels (the products are quadratic) and
//! the transformed weights take α²/9 times the space.
//!
//! Tiles go in blocks whose transformed inputs and products stay in L2; a thread
//! takes a band of whole tile rows, so it writes its own rows of the output. When
//! one block covers the image, threads split the products by tile position instead.
//!
//! Rounding: F(2×2) only adds in its data transforms and halves the weights; F(4×4)
//! scales by up to 8 and 16/15, which costs a bit or two (measured against a float64
//! direct convolution in the tests; its interpolation points are chosen for it, see
//! `G4`).

use super::ConvNhwc;
#[cfg(target_arch = "x86_64")]
use crate::arch::Avx2;
use crate::arch::{Isa, Lanes, Scalar};
use crate::conv::Conv2dParams;
use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::gemm::{Epilogue, Gemm, PackedB};
use crate::mat::{MatMut, MatRef};
use crate::pool::{FirstError, ThreadPool};

/// Which F(m×m, 3×3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    /// F(2×2, 3×3): 4×4 tiles.
    F2,
    /// F(4×4, 3×3): 6×6 tiles.
    F4,
}

impl Variant {
    /// Outputs per tile side.
    fn m(self) -> usize {
        match self {
            Variant::F2 => 2,
            Variant::F4 => 4,
        }
    }

    /// Inputs per tile side.
    fn alpha(self) -> usize {
        self.m() + 2
    }

    /// The variant for a convolution of geometry `p` with output size `out`, if one
    /// pays: a regular 3×3, stride 1, no dilation, enough channels that the products
    /// outweigh the transforms, and enough tiles that each transformed weight is
    /// used often (on a small image the larger weights cost more to stream than the
    /// multiplications they save).
    pub(super) fn choose(p: &Conv2dParams, out: [usize; 2]) -> Option<Self> {
        let regular = p.groups == 1
            && p.kernel == [3, 3]
            && p.stride == [1, 1]
            && p.dilation == [1, 1]
            && p.in_channels >= MIN_CHANNELS
            && p.out_channels >= MIN_CHANNELS;
        let pixels = out[0].saturating_mul(out[1]);
        if !regular || pixels < F2_MIN_PIXELS {
            None
        } else if pixels < F4_MIN_PIXELS {
            Some(Variant::F2)
        } else {
            Some(Variant::F4)
        }
    }
}

/// Channels (in and out) below which the transforms cost more than they save.
const MIN_CHANNELS: usize = 16;
/// Output pixels from which F(4×4) is used, and from which F(2×2) is.
const F4_MIN_PIXELS: usize = 24 * 24;
const F2_MIN_PIXELS: usize = 12 * 12;
// Not for resnet's 7 × 7 layers (512 channels in and out) either: alone in a loop,
// F(2×2) took them from 1.9 to 1.5 ms, but in the model, where the weights come from
// memory at each execution, their 16/9 times larger weights made them 3.3 → 3.5-4.0 ms.
/// f32 values of a block's transformed inputs and products: about half of a
/// 512 KiB L2.
const BLOCK_VALUES: usize = 64 * 1024;

/// f32 values between consecutive tiles of a block beyond their α² rows of channels:
/// a tile's values are a multiple of 4 KiB for common channel counts, and the
/// product reads the same position of 12 tiles at once, rows that would otherwise
/// all fall in one set of L1 (resnet's 14 × 14 layer: 84 → 140 GFLOP/s).
const TILE_SKEW: usize = 16;

/// f32 values from one tile of a block to the next: `positions` rows of `channels`
/// and the skew.
fn tile_stride(positions: usize, channels: usize) -> Result<usize> {
    error::add(
        error::mul(positions, channels, "winograd tile")?,
        TILE_SKEW,
        "winograd tile",
    )
}

/// A convolution's transformed weights.
pub(super) struct Winograd {
    variant: Variant,
    /// One packed `in_channels × out_channels` matrix per tile position (row-major
    /// over the α×α positions).
    weights: Vec<PackedB>,
    /// Tiles per block.
    block: usize,
}

impl Winograd {
    /// Transforms `weight(o, tap, i)` (output channel, tap of the 3×3 window in
    /// row-major order, input channel) for `variant`, in f64, straight into the
    /// product's panels, on the threads of `pool`.
    pub(super) fn new(
        gemm: &Gemm,
        pool: &ThreadPool,
        p: &Conv2dParams,
        variant: Variant,
        weight: impl Fn(usize, usize, usize) -> f32 + Sync,
    ) -> Result<Self> {
        let (cin, cout) = (p.in_channels, p.out_channels);
        let alpha = variant.alpha();
        let g: &[[f64; 3]] = match variant {
            Variant::F2 => &G2,
            Variant::F4 => &G4,
        };
        let positions = alpha * alpha;
        let len = error::mul(
            error::mul(positions, cin, "winograd weights")?,
            cout,
            "winograd weights",
        )?;
        // One packed `cin × cout` operand per position, computed into place: no
        // intermediate copy of the transformed weights (resnet18's 31 MB of them, and a
        // pass to pack them, were a fifth of its load). A task takes one panel of `nr`
        // output channels, in every position's operand; in it, OB output channels at a
        // time so that the f64 arithmetic runs on vectors and each store is a
        // contiguous run, the input channels in order, so that each output channel's
        // weights are read in memory order (OIHW).
        const OB: usize = 8;
        let mut weights = (0..positions)
            .map(|_| gemm.zeroed_b(cin, cout))
            .collect::<Result<Vec<_>>>()?;
        let mut nr = 0;
        let mut tasks: Vec<Vec<&mut [f32]>> = Vec::new();
        for b in &mut weights {
            let (runs, w) = b.panels_mut();
            nr = w;
            tasks.resize_with(runs.len(), Vec::new);
            for (task, run) in tasks.iter_mut().zip(runs) {
                task.push(run);
            }
        }
        pool.parallel_chunks(&mut tasks, 1, &mut [0u8; 0], 0, |q, task, _| {
            let Some(runs) = task.first_mut() else {
                return;
            };
            let panel = q * nr..((q + 1) * nr).min(cout);
            for i in 0..cin {
                for o0 in panel.clone().step_by(OB) {
                    let n = OB.min(panel.end - o0);
                    // w[r][c][lane]: tap (r, c) of output channel o0 + lane.
                    let mut w = [[[0.0f64; OB]; 3]; 3];
                    for (r, wr) in w.iter_mut().enumerate() {
                        for (c, wc) in wr.iter_mut().enumerate() {
                            for (lane, v) in wc.iter_mut().enumerate().take(n) {
                                *v = f64::from(weight(o0 + lane, r * 3 + c, i));
                            }
                        }
                    }
                    let at = i * nr + (o0 - panel.start);
                    // Row a of G w, then its product with row b of G.
                    for (a, ga) in g.iter().enumerate() {
                        let mut rw = [[0.0f64; OB]; 3];
                        for (k, wk) in ga.iter().zip(&w) {
                            for (acc, x) in rw.iter_mut().zip(wk) {
                                acc.iter_mut().zip(x).for_each(|(acc, x)| *acc += k * x);
                            }
                        }
                        for (b, gb) in g.iter().enumerate() {
                            let mut v = [0.0f64; OB];
                            for (x, k) in rw.iter().zip(gb) {
                                v.iter_mut().zip(x).for_each(|(v, x)| *v += x * k);
                            }
                            let run = runs
                                .get_mut(a * alpha + b)
                                .and_then(|r| r.get_mut(at..at + n));
                            if let Some(dst) = run {
                                dst.iter_mut().zip(&v).for_each(|(d, v)| *d = *v as f32);
                            }
                        }
                    }
                }
            }
        })?;
        // Blocks sized for L2, unless the weights outweigh an image's transformed
        // inputs and products: then the whole image is one block, so that each
        // transformed weight is streamed once per image rather than once per block
        // (resnet's 14 × 14 and 28 × 28 layers), the block's values streaming instead.
        let (mr, _) = gemm.isa().gemm_tile();
        let per_tile = positions * (cin + cout);
        let [oh, ow] = p.output()?;
        let image = oh.div_ceil(variant.m()) * ow.div_ceil(variant.m());
        let block = if len > image.saturating_mul(per_tile) {
            image.next_multiple_of(mr)
        } else {
            (BLOCK_VALUES / per_tile.max(1) / mr).clamp(2, 8) * mr
        };
        Ok(Self {
            variant,
            weights,
            block,
        })
    }

    /// Heap bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.weights.iter().map(PackedB::bytes).sum()
    }

    /// "winograd-2x2" or "winograd-4x4".
    pub(super) fn name(&self) -> &'static str {
        match self.variant {
            Variant::F2 => "winograd-2x2",
            Variant::F4 => "winograd-4x4",
        }
    }

    /// Scratch (f32 elements) per thread: a block's transformed inputs and products,
    /// and the product's own.
    fn per_thread(&self, gemm: &Gemm, p: &Conv2dParams) -> Result<usize> {
        let (cin, cout) = (p.in_channels, p.out_channels);
        let positions = self.variant.alpha().pow(2);
        let values = error::mul(
            self.block,
            error::add(
                tile_stride(positions, cin)?,
                tile_stride(positions, cout)?,
                "winograd scratch",
            )?,
            "winograd scratch",
        )?;
        error::add(
            values,
            gemm.caller_scratch_len(self.block, cout, cin)?,
            "winograd scratch",
        )
    }

    /// Scratch (f32 elements) a run on `threads` threads needs.
    pub(super) fn scratch_len(
        &self,
        gemm: &Gemm,
        p: &Conv2dParams,
        threads: usize,
    ) -> Result<usize> {
        error::mul(
            self.per_thread(gemm, p)?,
            threads.max(1),
            "winograd scratch",
        )
    }
}

impl ConvNhwc {
    /// Runs the convolution through `w` on `batch` NHWC images (see [`ConvNhwc::run`]).
    ///
    /// Each image's tile rows are split into one band per thread, unless one block
    /// covers the image (its transformed weights outweigh its tiles) on more than one
    /// thread: then every band would stream all the weights, so the image goes in
    /// three passes instead — inputs transformed by tiles, the products split by tile
    /// position (each thread streams its positions' weights alone), outputs by bands.
    #[allow(clippy::too_many_arguments)] // `run`'s arguments and the transformed weights
    pub(super) fn run_winograd(
        &self,
        w: &Winograd,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        residual: Option<&[f32]>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let p = &self.p;
        let m = w.variant.m();
        let [oh, ow] = self.out;
        let (xi, yi) = self.io_len(1)?;
        let per_thread = w.per_thread(&self.gemm, p)?;
        let band_rows = oh.div_ceil(m).div_ceil(pool.threads()).max(1);
        let tile_row = m * ow * p.out_channels;
        let phased = pool.threads() > 1 && w.block >= oh.div_ceil(m) * ow.div_ceil(m);
        let failed = FirstError::default();
        for n in 0..batch {
            let x = input.get(n * xi..(n + 1) * xi).unwrap_or_default();
            let r = residual.and_then(|r| r.get(n * yi..(n + 1) * yi));
            let y = output.get_mut(n * yi..(n + 1) * yi).unwrap_or_default();
            if phased {
                self.winograd_phased(w, pool, x, r, y, scratch)?;
                continue;
            }
            pool.parallel_groups(
                y,
                tile_row,
                band_rows,
                scratch,
                per_thread,
                |first, band, part| {
                    let r = r.and_then(|r| r.get(first * tile_row..first * tile_row + band.len()));
                    failed.keep(self.winograd_band(w, x, first, r, band, part));
                },
            )?;
        }
        failed.into_result()
    }

    /// One image in three passes on the pool (see [`Self::run_winograd`]): `scratch`
    /// holds the image's transformed inputs and products, then each thread's scratch
    /// for the product.
    fn winograd_phased(
        &self,
        w: &Winograd,
        pool: &ThreadPool,
        x: &[f32],
        residual: Option<&[f32]>,
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let p = &self.p;
        let (m, positions) = (w.variant.m(), w.variant.alpha().pow(2));
        let (cin, cout) = (p.in_channels, p.out_channels);
        let [oh, ow] = self.out;
        let tiles = oh.div_ceil(m) * ow.div_ceil(m);
        let (v_tile, m_tile) = (tile_stride(positions, cin)?, tile_stride(positions, cout)?);
        let v_len = error::mul(tiles, v_tile, "winograd scratch")?;
        let m_len = error::mul(tiles, m_tile, "winograd scratch")?;
        let len = scratch.len();
        let too_small = || Error::ScratchTooSmall {
            len,
            needed: v_len.saturating_add(m_len),
        };
        let (vbuf, rest) = scratch.split_at_mut_checked(v_len).ok_or_else(too_small)?;
        let (mbuf, gemm_scratch) = rest.split_at_mut_checked(m_len).ok_or_else(too_small)?;
        let failed = FirstError::default();
        let mut none = [0f32; 0];
        pool.parallel_chunks(vbuf, v_tile, &mut none, 0, |t, dst, _| {
            self.winograd_inputs(w, x, 0, t, 1, dst);
        })?;
        let products = MatMut::new(mbuf, tiles, positions * cout, m_tile, 1)?;
        let parts = products.into_parts(true, cout);
        let per_thread = self.gemm.caller_scratch_len(tiles, cout, cin)?;
        let vbuf = &*vbuf;
        pool.parallel_for_scratch(positions, gemm_scratch, per_thread, |q, part| {
            let (Some(u), Some(c)) = (w.weights.get(q), parts.take(q)) else {
                failed.keep(Err(Error::InvalidParameter {
                    what: format!("winograd: no weights or products for tile position {q}"),
                }));
                return;
            };
            let a = vbuf.get(q * cin..).unwrap_or_default();
            failed.keep(
                MatRef::new(a, tiles, cin, v_tile, 1)
                    .and_then(|a| self.gemm.run_on_caller(c, a, u, &Epilogue::default(), part)),
            );
        })?;
        failed.into_result()?;
        let tiles_wide = ow.div_ceil(m);
        let tile_row = m * ow * cout;
        let band_rows = oh.div_ceil(m).div_ceil(pool.threads()).max(1);
        let mbuf = &*mbuf;
        pool.parallel_groups(y, tile_row, band_rows, &mut none, 0, |first, band, _| {
            let r = residual.and_then(|r| r.get(first * tile_row..first * tile_row + band.len()));
            let src = mbuf.get(first * tiles_wide * m_tile..).unwrap_or_default();
            let rows = band.len() / (ow * cout).max(1);
            let tb = rows.div_ceil(m) * tiles_wide;
            self.winograd_outputs(w, src, (0, tb), r, band);
        })
    }

    /// The tile rows from `first` of one image into `band` (those rows of the output,
    /// `residual` the same rows of the residual), in blocks of tiles.
    fn winograd_band(
        &self,
        w: &Winograd,
        x: &[f32],
        first: usize,
        residual: Option<&[f32]>,
        band: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let p = &self.p;
        let (m, positions) = (w.variant.m(), w.variant.alpha().pow(2));
        let (cin, cout) = (p.in_channels, p.out_channels);
        let ow = self.out[1];
        let tiles_wide = ow.div_ceil(m);
        let rows = band.len() / (ow * cout).max(1);
        let tiles = rows.div_ceil(m) * tiles_wide;
        let (v_tile, m_tile) = (tile_stride(positions, cin)?, tile_stride(positions, cout)?);
        let (v_len, m_len) = (w.block * v_tile, w.block * m_tile);
        let (vbuf, rest) = scratch.split_at_mut(v_len.min(scratch.len()));
        let (mbuf, gemm_scratch) = rest.split_at_mut(m_len.min(rest.len()));
        // Blocks of equal size: a last block of a few tiles would stream every
        // weight for them alone.
        let blocks = tiles.div_ceil(w.block.max(1));
        let even = tiles.div_ceil(blocks.max(1));
        for t0 in (0..tiles).step_by(even.max(1)) {
            let tb = even.min(tiles - t0);
            self.winograd_inputs(w, x, first * m, t0, tb, vbuf);
            // One product per tile position.
            for (q, u) in w.weights.iter().enumerate() {
                let a = vbuf.get(q * cin..).unwrap_or_default();
                let a = MatRef::new(a, tb, cin, v_tile, 1)?;
                let c = mbuf.get_mut(q * cout..).unwrap_or_default();
                let c = MatMut::new(c, tb, cout, m_tile, 1)?;
                self.gemm
                    .run_on_caller(c, a, u, &Epilogue::default(), gemm_scratch)?;
            }
            self.winograd_outputs(w, mbuf, (t0, tb), residual, band);
        }
        Ok(())
    }

    /// Transforms tiles `t0..t0 + tb` of the tile rows from output row `y0` into
    /// `dst`: tile-major, each tile's α² positions of `cin` values in a row (a
    /// position-major layout put the stores of a tile 2-4 KiB apart, where they
    /// conflict in L1's sets).
    fn winograd_inputs(
        &self,
        w: &Winograd,
        x: &[f32],
        y0: usize,
        t0: usize,
        tb: usize,
        dst: &mut [f32],
    ) {
        let p = &self.p;
        let isa = self.gemm.isa();
        let (m, alpha) = (w.variant.m(), w.variant.alpha());
        let positions = alpha * alpha;
        let cin = p.in_channels;
        let [ih, iw] = p.input;
        let tiles_wide = self.out[1].div_ceil(m);
        let v_tile = tile_stride(positions, cin).unwrap_or(usize::MAX);
        let zero = self.zero.get(..cin).unwrap_or_default();
        for t in 0..tb {
            let (ty, tx) = ((t0 + t) / tiles_wide, (t0 + t) % tiles_wide);
            let (iy0, ix0) = (y0 + ty * m, tx * m);
            let mut taps: [&[f32]; 36] = [&[]; 36];
            for (k, tap) in taps.iter_mut().take(positions).enumerate() {
                let iy = (iy0 + k / alpha)
                    .checked_sub(p.padding[0])
                    .filter(|&v| v < ih);
                let ix = (ix0 + k % alpha)
                    .checked_sub(p.padding[1])
                    .filter(|&v| v < iw);
                *tap = match iy.zip(ix) {
                    Some((iy, ix)) => {
                        let at = (iy * iw + ix) * cin;
                        x.get(at..at + cin).unwrap_or(zero)
                    }
                    None => zero,
                };
            }
            let dst = dst.get_mut(t.saturating_mul(v_tile)..).unwrap_or_default();
            let taps = taps.get(..positions).unwrap_or_default();
            input(isa, w.variant, taps, cin, dst, cin);
        }
    }

    /// Turns the products of tiles `t0..t0 + tb` (of `src`, tile-major) into the
    /// outputs of `band`, with bias, residual and activation.
    fn winograd_outputs(
        &self,
        w: &Winograd,
        src: &[f32],
        (t0, tb): (usize, usize),
        residual: Option<&[f32]>,
        band: &mut [f32],
    ) {
        let p = &self.p;
        let isa = self.gemm.isa();
        let m = w.variant.m();
        let cout = p.out_channels;
        let ow = self.out[1];
        let tiles_wide = ow.div_ceil(m);
        let rows = band.len() / (ow * cout).max(1);
        let m_tile = tile_stride(w.variant.alpha().pow(2), cout).unwrap_or(usize::MAX);
        let (min, max, rest) = match self.activation {
            Activation::Clamp { min, max } => (min, max, Activation::Identity),
            a => (f32::NEG_INFINITY, f32::INFINITY, a),
        };
        for t in 0..tb {
            let (ty, tx) = ((t0 + t) / tiles_wide, (t0 + t) % tiles_wide);
            let mut at = [None; 16];
            for (k, slot) in at.iter_mut().take(m * m).enumerate() {
                let (oy, ox) = (ty * m + k / m, tx * m + k % m);
                if oy < rows && ox < ow {
                    *slot = Some((oy * ow + ox) * cout);
                }
            }
            let tile = Outputs {
                at: at.get(..m * m).unwrap_or_default(),
                bias: &self.bias,
                residual,
                min,
                max,
            };
            let src = src.get(t.saturating_mul(m_tile)..).unwrap_or_default();
            output(isa, w.variant, src, cout, cout, &tile, band);
            if rest != Activation::Identity {
                for &o in at.iter().flatten() {
                    if let Some(px) = band.get_mut(o..o + cout) {
                        elementwise::activate(isa, px, rest);
                    }
                }
            }
        }
    }
}

/// Most f32 lanes of a vector the transforms run on.
const MAX_LANES: usize = 16;

/// Where a tile's outputs go: `at[i·m + j]`, the offset of output pixel (i, j) of the
/// tile in the band (None past the image's edge), and what is added and clamped.
struct Outputs<'a> {
    at: &'a [Option<usize>],
    bias: &'a [f32],
    residual: Option<&'a [f32]>,
    min: f32,
    max: f32,
}

/// G of F(2×2, 3×3) (interpolation points 0, ±1) and of F(4×4, 3×3) (points 0, ±1,
/// 1/2 and -2, which Barabasz et al. found to round about half as much as the usual
/// 0, ±1, ±2: "Error analysis and improving the accuracy of Winograd convolution for
/// deep neural networks", 2020). Largest difference of the whole network's output
/// from a float64 run, ±2 → these (without Winograd): inception_v3 1.03e-3 → 0.94e-3
/// (0.43e-3), wide_resnet50_2 9.6e-5 → 7.6e-5 (4.0e-5), resnet18 4.8e-6 → 2.9e-6
/// (2.5e-6). The divisions that are not by powers of two are here, in the weights,
/// rounded once.
const G2: [[f64; 3]; 4] = [
    [1.0, 0.0, 0.0],
    [0.5, 0.5, 0.5],
    [0.5, -0.5, 0.5],
    [0.0, 0.0, 1.0],
];
const G4: [[f64; 3]; 6] = [
    [1.0, 0.0, 0.0],
    [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
    [-1.0 / 3.0, 1.0 / 3.0, -1.0 / 3.0],
    [-16.0 / 15.0, -8.0 / 15.0, -4.0 / 15.0],
    [1.0 / 15.0, -2.0 / 15.0, 4.0 / 15.0],
    [0.0, 0.0, 1.0],
];

/// The one-dimensional transforms of a variant, applied to the rows and then to the
/// columns of a tile.
trait Transform<const A: usize, const M: usize> {
    /// Bᵀ d.
    fn input<S: Lanes>(s: S, d: [S::V; A]) -> [S::V; A];
    /// Aᵀ m.
    fn output<S: Lanes>(s: S, m: [S::V; A]) -> [S::V; M];
}

struct F2;
struct F4;

impl Transform<4, 2> for F2 {
    #[inline(always)]
    fn input<S: Lanes>(s: S, [d0, d1, d2, d3]: [S::V; 4]) -> [S::V; 4] {
        [s.sub(d0, d2), s.add(d1, d2), s.sub(d2, d1), s.sub(d1, d3)]
    }

    #[inline(always)]
    fn output<S: Lanes>(s: S, [m0, m1, m2, m3]: [S::V; 4]) -> [S::V; 2] {
        [s.add(s.add(m0, m1), m2), s.sub(s.sub(m1, m2), m3)]
    }
}

impl Transform<6, 4> for F4 {
    #[inline(always)]
    fn input<S: Lanes>(s: S, [d0, d1, d2, d3, d4, d5]: [S::V; 6]) -> [S::V; 6] {
        let (d31, d42) = (s.sub(d3, d1), s.sub(d4, d2));
        let (s41, d41) = (s.add(d4, d1), s.sub(d4, d1));
        [
            s.mul_add(d31, 1.5, s.mul_add(d2, -2.0, s.add(d0, d4))),
            s.mul_add(d3, 2.5, s.mul_add(d2, 0.5, d41)),
            s.mul_add(d2, -2.5, s.mul_add(d3, 0.5, s41)),
            s.mul_add(d31, 2.0, d42),
            s.mul_add(d31, -0.5, d42),
            s.mul_add(d42, 1.5, s.mul_add(d3, -2.0, s.add(d1, d5))),
        ]
    }

    #[inline(always)]
    fn output<S: Lanes>(s: S, [m0, m1, m2, m3, m4, m5]: [S::V; 6]) -> [S::V; 4] {
        let (s12, d12) = (s.add(m1, m2), s.sub(m1, m2));
        [
            s.add(s.add(m0, s12), s.add(m3, m4)),
            s.mul_add(m4, -2.0, s.mul_add(m3, 0.5, d12)),
            s.mul_add(m4, 4.0, s.mul_add(m3, 0.25, s12)),
            s.add(s.mul_add(m4, -8.0, s.mul_add(m3, 0.125, d12)), m5),
        ]
    }
}

/// `Bᵀ d B` of one tile, `taps` its A×A input pixels (row-major, each `channels`
/// long); position q's channels go to `out[q·stride..]`. Rows first, into `out`,
/// then columns in place: a few vectors live at a time, no tile-sized temporaries.
#[inline(always)]
fn input_tile<S: Lanes, T: Transform<A, M>, const A: usize, const M: usize>(
    s: S,
    taps: &[&[f32]],
    channels: usize,
    out: &mut [f32],
    stride: usize,
) {
    for c in (0..channels).step_by(S::LANES) {
        let lanes = (channels - c).min(S::LANES);
        for i in 0..A {
            let row: [S::V; A] = std::array::from_fn(|j| {
                s.load(
                    taps.get(i * A + j)
                        .and_then(|t| t.get(c..))
                        .unwrap_or_default(),
                )
            });
            for (j, v) in T::input(s, row).into_iter().enumerate() {
                let at = (i * A + j) * stride + c;
                s.store(v, out.get_mut(at..at + lanes).unwrap_or_default());
            }
        }
        for j in 0..A {
            let col: [S::V; A] = std::array::from_fn(|i| {
                s.load(out.get((i * A + j) * stride + c..).unwrap_or_default())
            });
            for (i, v) in T::input(s, col).into_iter().enumerate() {
                let at = (i * A + j) * stride + c;
                s.store(v, out.get_mut(at..at + lanes).unwrap_or_default());
            }
        }
    }
}

/// `Aᵀ M A` of one tile, position q's channels at `src[q·stride..]` (overwritten:
/// the row pass goes back into it), plus bias and residual, clamped, into the tile's
/// output pixels.
#[inline(always)]
fn output_tile<S: Lanes, T: Transform<A, M>, const A: usize, const M: usize>(
    s: S,
    src: &[f32],
    stride: usize,
    channels: usize,
    tile: &Outputs<'_>,
    band: &mut [f32],
) {
    for c in (0..channels).step_by(S::LANES) {
        let lanes = (channels - c).min(S::LANES);
        // Rows first, into `rows` (M values of each of the A rows, vectors apart): the
        // products stay as they are, for other threads may read them.
        const { assert!(S::LANES <= MAX_LANES) };
        let mut rows = [0f32; 6 * 4 * MAX_LANES];
        for a in 0..A {
            let row: [S::V; A] = std::array::from_fn(|b| {
                s.load(src.get((a * A + b) * stride + c..).unwrap_or_default())
            });
            for (j, v) in T::output(s, row).into_iter().enumerate() {
                let at = (a * M + j) * S::LANES;
                s.store(v, rows.get_mut(at..at + S::LANES).unwrap_or_default());
            }
        }
        let bias = s.load(tile.bias.get(c..).unwrap_or_default());
        for j in 0..M {
            let col: [S::V; A] = std::array::from_fn(|a| {
                s.load(rows.get((a * M + j) * S::LANES..).unwrap_or_default())
            });
            for (i, v) in T::output(s, col).into_iter().enumerate() {
                let Some(o) = tile.at.get(i * M + j).copied().flatten() else {
                    continue;
                };
                let at = o + c;
                let mut v = s.add(v, bias);
                if let Some(r) = tile.residual {
                    v = s.add(v, s.load(r.get(at..at + lanes).unwrap_or_default()));
                }
                let v = s.clamp(v, tile.min, tile.max);
                s.store(v, band.get_mut(at..at + lanes).unwrap_or_default());
            }
        }
    }
}

/// The input transform of `variant` on the widest lanes `isa` allows.
fn input(
    isa: Isa,
    variant: Variant,
    taps: &[&[f32]],
    channels: usize,
    out: &mut [f32],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = Avx2::new().filter(|_| isa != Isa::Generic) {
        return s.vectorize(
            #[inline(always)]
            || match variant {
                Variant::F2 => input_tile::<_, F2, 4, 2>(s, taps, channels, out, stride),
                Variant::F4 => input_tile::<_, F4, 6, 4>(s, taps, channels, out, stride),
            },
        );
    }
    let _ = isa; // only read on x86-64
    match variant {
        Variant::F2 => input_tile::<_, F2, 4, 2>(Scalar::<false>, taps, channels, out, stride),
        Variant::F4 => input_tile::<_, F4, 6, 4>(Scalar::<false>, taps, channels, out, stride),
    }
}

/// The output transform of `variant` on the widest lanes `isa` allows.
fn output(
    isa: Isa,
    variant: Variant,
    src: &[f32],
    stride: usize,
    channels: usize,
    tile: &Outputs<'_>,
    band: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = Avx2::new().filter(|_| isa != Isa::Generic) {
        return s.vectorize(
            #[inline(always)]
            || match variant {
                Variant::F2 => output_tile::<_, F2, 4, 2>(s, src, stride, channels, tile, band),
                Variant::F4 => output_tile::<_, F4, 6, 4>(s, src, stride, channels, tile, band),
            },
        );
    }
    let _ = isa; // only read on x86-64
    match variant {
        Variant::F2 => {
            output_tile::<_, F2, 4, 2>(Scalar::<false>, src, stride, channels, tile, band)
        }
        Variant::F4 => {
            output_tile::<_, F4, 6, 4>(Scalar::<false>, src, stride, channels, tile, band)
        }
    }
}
