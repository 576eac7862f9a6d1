//! Grouped convolutions with few output channels per group, on the interleaved
//! micro-kernel of [`crate::arch`] (`grouped_microkernel`): blocks of `q` groups
//! fill one vector of outputs, the input copied once per image with its padding and
//! each block's channels interleaved (a last block of fewer groups reads zeros for
//! the missing ones and stores only its own channels). regnet_y_400mf's 8-channel groups filled 8 of
//! the regular tile's 32 columns: its grouped layers were half of the model's time.

use crate::arch::{
    grouped_interleaves, grouped_microkernel, interleave_vectors, GroupedOut, GroupedRows, Isa,
    GROUPED_MR,
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
}

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
        })
    }

    /// Heap bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.weights.len() * 4 + self.taps.len() * 8
    }

    /// Scratch (f32 elements) a run needs: one image's copy.
    pub(super) fn scratch_len(&self) -> Result<usize> {
        let [h, w] = self.size;
        error::mul(
            error::mul(h, w, "padded input")?,
            self.pixel,
            "padded input",
        )
    }

    /// `batch` NHWC images of `x` into `y` (`(+)=` with `accumulate`), then bias,
    /// `clamp` and `rest`.
    #[allow(clippy::too_many_arguments)] // a convolution's operands and epilogue
    pub(super) fn run(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        p: &Conv2dParams,
        out: [usize; 2],
        (x, y, scratch): (&[f32], &mut [f32], &mut [f32]),
        bias: &[f32],
        (clamp, rest, accumulate): ((f32, f32), Activation, bool),
    ) -> Result {
        let (xi, yi) = p.io_len(1)?;
        let needed = self.scratch_len()?;
        let len = scratch.len();
        let copy = scratch
            .get_mut(..needed)
            .ok_or(error::Error::ScratchTooSmall { len, needed })?;
        let (cig, cog) = p.channels_per_group();
        let (cout, lanes) = (p.out_channels, isa.lanes());
        let (block_in, block_w) = (self.q * cig, self.taps.len() * cig * lanes);
        let [oh, ow] = out;
        let tiles = (oh * ow).div_ceil(GROUPED_MR);
        let work = (oh * ow)
            .saturating_mul(cout)
            .saturating_mul(block_w / lanes.max(1));
        let tasks = if work < (1 << 17) {
            1
        } else {
            (pool.threads() * super::TASKS_PER_THREAD).min(tiles).max(1)
        };
        let rows_per_task = tiles.div_ceil(tasks) * GROUPED_MR;
        for (x, y) in x.chunks_exact(xi.max(1)).zip(y.chunks_exact_mut(yi.max(1))) {
            self.copy(pool, isa, p, x, copy)?;
            let copy = &*copy;
            let failed = FirstError::default();
            pool.parallel_chunks(y, rows_per_task * cout, &mut [0u8; 0], 0, |task, yc, _| {
                let r0 = task * rows_per_task;
                let rows_here = yc.len() / cout.max(1);
                for r in (0..rows_here).step_by(GROUPED_MR) {
                    let n = GROUPED_MR.min(rows_here - r);
                    let mut pixels = [0usize; GROUPED_MR];
                    for (i, at) in pixels.iter_mut().take(n).enumerate() {
                        let (oy, ox) = ((r0 + r + i) / ow.max(1), (r0 + r + i) % ow.max(1));
                        *at = (oy * p.stride[0] * self.size[1] + ox * p.stride[1]) * self.pixel;
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
                            c: yc.get_mut(r * cout + b * lanes..).unwrap_or_default(),
                            cols: (p.groups - b * self.q).min(self.q) * cog,
                            rs: cout,
                            bias: bias.get(b * lanes..).unwrap_or_default(),
                            clamp,
                            accumulate,
                        };
                        let w = self.weights.get(b * block_w..).unwrap_or_default();
                        failed.keep(grouped_microkernel(isa, self.q, &rows, w, out));
                    }
                    if let Some(run) = yc.get_mut(r * cout..(r + n) * cout) {
                        if rest != Activation::Identity {
                            elementwise::activate(isa, run, rest);
                        }
                    }
                }
            })?;
            failed.into_result()?;
        }
        Ok(())
    }

    /// One NHWC image into `copy`: its padding zeros, each block's channels
    /// interleaved (channel `i` of group `g` at `i · q + g`, zeros for a last block's
    /// missing groups), rows on the pool.
    fn copy(
        &self,
        pool: &ThreadPool,
        isa: Isa,
        p: &Conv2dParams,
        x: &[f32],
        copy: &mut [f32],
    ) -> Result {
        let c = p.in_channels;
        let [top, left] = [p.padding[0], p.padding[1]];
        let (q, cig, pixel) = (self.q, p.channels_per_group().0, self.pixel);
        let row_len = p.input[1] * c;
        pool.parallel_chunks(
            copy,
            (self.size[1] * pixel).max(1),
            &mut [0u8; 0],
            0,
            |py, row, _| {
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
            },
        )
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
