//! Grouped convolutions with few output channels per group, on the interleaved
//! micro-kernel of [`crate::arch`] (`grouped_microkernel`): blocks of `q` groups
//! fill one vector of outputs, the input copied with its padding and each block's
//! channels interleaved, a band of output rows at a time by the thread that computes
//! it (a last block of fewer groups reads zeros for the missing ones and stores only
//! its own channels). regnet_y_400mf's 8-channel groups filled 8 of the regular
//! tile's 32 columns: its grouped layers were half of the model's time.

use crate::arch::{
    grouped_interleaves, grouped_microkernel, interleave_quads, interleave_vectors, GroupedOut,
    GroupedRows, Isa, GROUPED_MR,
};
use crate::conv::{Conv2dParams, ConvWeights};
use crate::elementwise::{self, Activation};
use crate::error::{self, Result};
use crate::pool::{FirstError, ThreadPool};

/// A grouped convolution's weights in blocks of `q` groups, and where its taps are.
pub(super) struct Grouped {
    /// Groups per vector.
    q: usize,
    /// Per block: `[tap][input channel][lane]`, lane `o · q + g` holding output `o`
    /// of the block's group `g`.
    weights: pte_alloc::Zeroed<f32>,
    /// Where tap `ky · kw + kx` of a pixel is in the copy, from the pixel's first tap.
    taps: Vec<usize>,
    /// The copy's height and width (the input with its padding).
    size: [usize; 2],
    /// Values per pixel of the copy: whole blocks of `q` groups.
    pixel: usize,
    /// Output rows and columns.
    out: [usize; 2],
    /// Rows of the copy between one output row's window and the next's.
    stride: usize,
    /// Rows of the copy one output row's window spans.
    reach: usize,
}

/// Bytes of the copy a band of output rows reads at most: the input is copied a band
/// at a time by the thread that computes it, so that the copy is still in that core's
/// cache when read. One copy of the whole image, written by all threads before any
/// output, was read back from L3 or the other core (regnet's 104-channel stride-2
/// layer: 0.30 ms in the network against 0.21 alone at one thread, 0.24 against 0.12
/// at two).
const BAND_BYTES: usize = 256 * 1024;

impl Grouped {
    /// Whether `isa`'s kernels take this convolution: a vector holds a whole number
    /// of groups' outputs, and one output channel per group is not a depthwise
    /// convolution.
    pub(super) fn applies(isa: Isa, p: &Conv2dParams) -> bool {
        Self::interleave(isa, p).is_some()
    }

    fn interleave(isa: Isa, p: &Conv2dParams) -> Option<usize> {
        let (cig, cog) = p.channels_per_group();
        let lanes = isa.lanes();
        if p.groups < 2 || cog == 0 || (cig == 1 && cog == 1) || !lanes.is_multiple_of(cog) {
            return None;
        }
        let q = lanes / cog;
        grouped_interleaves(isa).contains(&q).then_some(q)
    }

    /// Arranges `weights` for `isa`'s kernel (see [`Self::applies`]).
    pub(super) fn new(isa: Isa, p: &Conv2dParams, weights: &ConvWeights<'_>) -> Result<Self> {
        let q = Self::interleave(isa, p).ok_or_else(|| error::Error::InvalidParameter {
            what: format!("grouped kernel for {p:?} on {}", isa.name()),
        })?;
        let (cig, cog) = p.channels_per_group();
        let (taps, cout, lanes) = (p.kernel[0] * p.kernel[1], p.out_channels, isa.lanes());
        let blocks = p.groups.div_ceil(q);
        // As many values as the weights and a last block's missing groups (checked
        // against the geometry by the caller).
        let what = "grouped convolution weights";
        let len = error::mul(
            error::mul(blocks, taps, what)?,
            error::mul(cig, lanes, what)?,
            what,
        )?;
        let mut arranged = pte_alloc::Zeroed::<f32>::try_shared(len)
            .ok_or(error::Error::OutOfMemory { what, len })?;
        let runs =
            (0..blocks).flat_map(|b| (0..taps).flat_map(move |t| (0..cig).map(move |i| (b, t, i))));
        for ((block, t, i), run) in runs.zip(arranged.chunks_exact_mut(lanes.max(1))) {
            for (l, v) in run.iter_mut().enumerate() {
                let g = block * q + l % q;
                let o = g * cog + l / q;
                if g < p.groups {
                    *v = weights.at((o, t, i), taps, cig, cout);
                }
            }
        }
        let pixel = blocks * q * cig;
        let size = [
            p.input[0] + p.padding[0] + p.padding[2],
            p.input[1] + p.padding[1] + p.padding[3],
        ];
        let taps = (0..p.kernel[0])
            .flat_map(|ky| (0..p.kernel[1]).map(move |kx| (ky, kx)))
            .map(|(ky, kx)| (ky * p.dilation[0] * size[1] + kx * p.dilation[1]) * pixel)
            .collect();
        Ok(Self {
            q,
            weights: arranged,
            taps,
            size,
            pixel,
            out: p.output()?,
            stride: p.stride[0],
            reach: (p.kernel[0] - 1) * p.dilation[0] + 1,
        })
    }

    /// Heap bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.weights.len() * 4 + self.taps.len() * 8
    }

    /// Output rows per band when the work is split over `threads`: as many as fit
    /// [`BAND_BYTES`] of the copy, fewer when the threads need more bands to share.
    fn band(&self, threads: usize) -> usize {
        let row = self.size[1]
            .saturating_mul(self.pixel)
            .saturating_mul(4)
            .max(1);
        let rows_fit = (BAND_BYTES / row).saturating_sub(self.reach) / self.stride.max(1) + 1;
        let share = if threads > 1 {
            self.out[0].div_ceil(threads * super::TASKS_PER_THREAD)
        } else {
            self.out[0]
        };
        rows_fit.min(share).max(1)
    }

    /// Rows of the copy a band of `band` output rows reads.
    fn band_rows(&self, band: usize) -> usize {
        ((band - 1) * self.stride + self.reach).min(self.size[0])
    }

    /// Scratch (f32 elements) a run on a pool of `threads` threads needs: a band of
    /// the copy per thread (or one larger band, for a layer small enough to stay on
    /// the calling thread).
    pub(super) fn scratch_len(&self, threads: usize) -> Result<usize> {
        let for_threads = |threads: usize| {
            let rows = self.band_rows(self.band(threads));
            let what = "padded input";
            let band = error::mul(error::mul(rows, self.size[1], what)?, self.pixel, what)?;
            error::mul(band, threads.max(1), what)
        };
        Ok(for_threads(threads)?.max(for_threads(1)?))
    }

    /// `batch` NHWC images of `x` into `y` (`(+)=` with `accumulate`), then bias,
    /// `clamp` and `rest`: bands of output rows on the pool, each thread copying the
    /// rows of the input its band reads into its part of `scratch` first.
    #[allow(clippy::too_many_arguments)] // a convolution's operands and epilogue
    pub(super) fn run(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        p: &Conv2dParams,
        (x, y, scratch): (&[f32], &mut [f32], &mut [f32]),
        bias: &[f32],
        (clamp, rest, accumulate): ((f32, f32), Activation, bool),
    ) -> Result {
        let (xi, yi) = p.io_len(1)?;
        let [oh, ow] = self.out;
        let (cig, cog) = p.channels_per_group();
        let (cout, lanes) = (p.out_channels, isa.lanes());
        let (block_in, block_w) = (self.q * cig, self.taps.len() * cig * lanes);
        let work = (oh * ow)
            .saturating_mul(cout)
            .saturating_mul(block_w / lanes.max(1));
        // Small layers stay on the calling thread, band after band.
        let threads = if work < (1 << 17) { 1 } else { pool.threads() };
        let band = self.band(threads);
        let per_thread = self.band_rows(band) * self.size[1] * self.pixel;
        let needed = self.scratch_len(pool.threads())?;
        let len = scratch.len();
        let scratch = scratch
            .get_mut(..needed)
            .ok_or(error::Error::ScratchTooSmall { len, needed })?;
        let row_out = ow * cout;
        for (x, y) in x.chunks_exact(xi.max(1)).zip(y.chunks_exact_mut(yi.max(1))) {
            let failed = FirstError::default();
            let chunk = (band * row_out).max(1);
            let task = |task: usize, yt: &mut [f32], copy: &mut [f32]| {
                // One band per task on the pool; all of them on the calling thread.
                for (k, yb) in yt.chunks_mut(chunk).enumerate() {
                    let oy0 = (task + k) * band;
                    let py0 = oy0 * self.stride;
                    let rows = self.band_rows(yb.len() / row_out.max(1));
                    let copy_row = (self.size[1] * self.pixel).max(1);
                    let copy = copy.get_mut(..rows * copy_row).unwrap_or_default();
                    for (i, row) in copy.chunks_exact_mut(copy_row).enumerate() {
                        self.copy_row(isa, p, x, py0 + i, row);
                    }
                    let copy = &*copy;
                    let pixels_here = yb.len() / cout.max(1);
                    for r in (0..pixels_here).step_by(GROUPED_MR) {
                        let n = GROUPED_MR.min(pixels_here - r);
                        let mut pixels = [0usize; GROUPED_MR];
                        for (i, at) in pixels.iter_mut().take(n).enumerate() {
                            let (oy, ox) = ((r + i) / ow.max(1), (r + i) % ow.max(1));
                            *at = (oy * self.stride * self.size[1] + ox * p.stride[1]) * self.pixel;
                        }
                        let pixels = pixels.get(..n).unwrap_or_default();
                        for b in 0..p.groups.div_ceil(self.q) {
                            let rows = GroupedRows {
                                a: copy.get(b * block_in..).unwrap_or_default(),
                                pixels,
                                taps: &self.taps,
                                kc: cig,
                            };
                            let out = GroupedOut {
                                c: yb.get_mut(r * cout + b * lanes..).unwrap_or_default(),
                                cols: (p.groups - b * self.q).min(self.q) * cog,
                                rs: cout,
                                bias: bias.get(b * lanes..).unwrap_or_default(),
                                clamp,
                                accumulate,
                            };
                            let w = self.weights.get(b * block_w..).unwrap_or_default();
                            failed.keep(grouped_microkernel(isa, self.q, &rows, w, out));
                        }
                        if let Some(run) = yb.get_mut(r * cout..(r + n) * cout) {
                            if rest != Activation::Identity {
                                elementwise::activate(isa, run, rest);
                            }
                        }
                    }
                }
            };
            if threads == 1 {
                task(0, y, scratch);
            } else {
                pool.parallel_chunks(y, chunk, scratch, per_thread, task)?;
            }
            failed.into_result()?;
        }
        Ok(())
    }

    /// Row `py` of one NHWC image's copy into `row`: its padding zeros, each block's
    /// channels interleaved (channel `i` of group `g` at `i · q + g`, zeros for a last
    /// block's missing groups).
    fn copy_row(&self, isa: Isa, p: &Conv2dParams, x: &[f32], py: usize, row: &mut [f32]) {
        let c = p.in_channels;
        let [top, left] = [p.padding[0], p.padding[1]];
        let (q, cig, pixel) = (self.q, p.channels_per_group().0, self.pixel);
        let row_len = p.input[1] * c;
        let src = py
            .checked_sub(top)
            .filter(|&iy| iy < p.input[0])
            .and_then(|iy| x.get(iy * row_len..(iy + 1) * row_len));
        let Some(src) = src else {
            row.fill(0.0);
            return;
        };
        let (pad, rest) = row.split_at_mut((left * pixel).min(row.len()));
        pad.fill(0.0);
        let (body, pad) = rest.split_at_mut((p.input[1] * pixel).min(rest.len()));
        pad.fill(0.0);
        // Every pixel of the row in one call, a last block's missing groups zeros (a
        // call per pixel and the tail value by value were a third of regnet's
        // 104-channel stride-2 layer).
        if interleave_quads(
            (q, q * cig),
            (0, 0),
            (bytemuck::cast_slice_mut(body), pixel * 4),
            (bytemuck::cast_slice(src), c * 4),
        ) {
            return;
        }
        if pixel == c {
            interleave(isa, q, cig, body, src);
            return;
        }
        for (d, s) in body
            .chunks_exact_mut(pixel.max(1))
            .zip(src.chunks_exact(c.max(1)))
        {
            let (whole, last) = s.split_at(s.len() / (q * cig).max(1) * q * cig);
            let (d, tail) = d.split_at_mut(whole.len().min(d.len()));
            interleave(isa, q, cig, d, whole);
            // The last block: its groups, then zeros.
            for (i, d) in tail.chunks_exact_mut(q).enumerate() {
                for (g, d) in d.iter_mut().enumerate() {
                    *d = last.get(g * cig + i).copied().unwrap_or(0.0);
                }
            }
        }
    }
}

/// Whole blocks of `q` groups of `cig` channels from `src` into `dst`, channel `i` of
/// group `g` at `i · q + g`: a permutation per vector when a block is one, else value
/// by value.
fn interleave(isa: Isa, q: usize, cig: usize, dst: &mut [f32], src: &[f32]) {
    let done = if q * cig == isa.lanes() {
        interleave_vectors(isa, q, dst, src)
    } else {
        0
    };
    let dst = dst.get_mut(done..).unwrap_or_default();
    let src = src.get(done..).unwrap_or_default();
    match q {
        1 => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s),
        2 => interleave_values::<2>(dst, src, cig),
        4 => interleave_values::<4>(dst, src, cig),
        _ => interleave_values::<8>(dst, src, cig),
    }
}

/// [`interleave`] value by value.
fn interleave_values<const Q: usize>(dst: &mut [f32], src: &[f32], cig: usize) {
    let block = Q * cig;
    for (d, s) in dst
        .chunks_exact_mut(block.max(1))
        .zip(src.chunks_exact(block.max(1)))
    {
        for (i, d) in d.chunks_exact_mut(Q).enumerate() {
            for (g, d) in d.iter_mut().enumerate() {
                *d = s.get(g * cig + i).copied().unwrap_or(0.0);
            }
        }
    }
}
