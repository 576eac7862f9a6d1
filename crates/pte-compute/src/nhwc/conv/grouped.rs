//! Grouped convolutions with few output channels per group, on the interleaved
//! micro-kernel of [`crate::arch`] (`grouped_microkernel`): blocks of `q` groups
//! fill one vector of outputs, the input copied with its padding and each block's
//! channels interleaved, a band of output rows at a time by the thread that computes
//! it (a last block of fewer groups reads zeros for the missing ones and stores only
//! its own channels). regnet_y_400mf's 8-channel groups filled 8 of the regular
//! tile's 32 columns: its grouped layers were half of the model's time.

use crate::arch::{
    even_tiles, grouped_interleaves, grouped_microkernel, interleave_quads, interleave_vectors,
    GroupedOut, GroupedRows, Isa, GROUPED_MR,
};
use crate::conv::{scaled, Conv2dParams, ConvWeights};
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
    /// With one group per block, the copy's layout is the input's own: pixels whose
    /// windows lie wholly inside the image are read where they are, and only the
    /// others are copied, window by window.
    in_place: Option<InPlace>,
}

/// How [`Grouped`] reads the input in place (see its `in_place`).
struct InPlace {
    /// Where tap `ky · kw + kx` of a pixel is in the input, from the pixel's first tap.
    taps: Vec<usize>,
    /// Where the tap is in a window copied on its own: tap `t` at `t · c`.
    window_taps: Vec<usize>,
    /// Output rows, then columns, whose windows lie inside the image: `[first, end)`.
    inside: [[usize; 2]; 2],
}

/// What a grouped layer does after its products.
struct Epilogue<'a> {
    bias: &'a [f32],
    clamp: (f32, f32),
    rest: Activation,
    accumulate: bool,
}

/// Output pixels whose windows cross the image's border, gathered into one tile.
struct Border {
    /// Each pixel's place in its task.
    pixels: [usize; GROUPED_MR],
    count: usize,
}

impl Border {
    fn push(&mut self, pixel: usize) {
        if let Some(slot) = self.pixels.get_mut(self.count) {
            *slot = pixel;
            self.count += 1;
        }
    }
}

/// Bytes of the copy a band of output rows reads at most: the input is copied a band
/// at a time by the thread that computes it, so that the copy is still in that core's
/// cache when read. One copy of the whole image, written by all threads before any
/// output, was read back from L3 or the other core (regnet's 104-channel stride-2
/// layer: 0.30 ms in the network against 0.21 alone at one thread, 0.24 against 0.12
/// at two).
const BAND_BYTES: usize = 256 * 1024;

/// Rows of a tile that keep the one-vector-per-row kernel's multiply-adds issuing at
/// their throughput (their latency over their issue interval).
const GROUPED_BUSY_ROWS: usize = 4;

/// Output pixels a task takes at least when threads share a layer: two tiles.
const MIN_TASK_PIXELS: usize = 2 * GROUPED_MR;

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
        // Block by block, lane by lane: a lane's output channel and factor once, then
        // its weights. (Value by value, each lane's channel and factor found again,
        // regnet_x_400mf's grouped layers took 3.5 ms of its load; now 2.2.)
        let per_block = taps * cig * lanes;
        for (block, dst) in arranged.chunks_exact_mut(per_block.max(1)).enumerate() {
            for l in 0..lanes {
                let g = block * q + l % q;
                if g >= p.groups {
                    continue;
                }
                let o = g * cog + l / q;
                let factor = weights.factor(o);
                let lane = dst
                    .get_mut(l..)
                    .unwrap_or_default()
                    .iter_mut()
                    .step_by(lanes.max(1));
                let at = (0..taps).flat_map(|t| (0..cig).map(move |i| (t, i)));
                for (v, (t, i)) in lane.zip(at) {
                    *v = scaled(weights.raw((o, t, i), taps, cig, cout), factor);
                }
            }
        }
        let pixel = blocks * q * cig;
        let size = [
            p.input[0] + p.padding[0] + p.padding[2],
            p.input[1] + p.padding[1] + p.padding[3],
        ];
        let tap_offsets = |width: usize| -> Vec<usize> {
            (0..p.kernel[0])
                .flat_map(|ky| (0..p.kernel[1]).map(move |kx| (ky, kx)))
                .map(|(ky, kx)| (ky * p.dilation[0] * width + kx * p.dilation[1]) * pixel)
                .collect()
        };
        let out = p.output()?;
        // Along one axis, the outputs whose windows lie inside the input.
        let axis = |input: usize,
                    out: usize,
                    kernel: usize,
                    stride: usize,
                    dilation: usize,
                    pad: usize| {
            let stride = stride.max(1);
            let first = pad.div_ceil(stride);
            // Windows ending before the input's last row or column.
            let end = (input + pad)
                .checked_sub((kernel - 1) * dilation + 1)
                .map_or(0, |last| last / stride + 1);
            [first.min(out), end.clamp(first, out.max(first)).min(out)]
        };
        let inside = [
            axis(
                p.input[0],
                out[0],
                p.kernel[0],
                p.stride[0],
                p.dilation[0],
                p.padding[0],
            ),
            axis(
                p.input[1],
                out[1],
                p.kernel[1],
                p.stride[1],
                p.dilation[1],
                p.padding[1],
            ),
        ];
        let inner = (inside[0][1] - inside[0][0]) * (inside[1][1] - inside[1][0]);
        let border = out[0] * out[1] - inner;
        // Each border pixel copies its whole window; the padded copy, every pixel of
        // the input once: in place only where that copies less.
        let in_place = (q == 1
            && pixel == p.in_channels
            && border.saturating_mul(taps) < size[0].saturating_mul(size[1]))
        .then(|| InPlace {
            taps: tap_offsets(p.input[1]),
            window_taps: (0..taps).map(|t| t * pixel).collect(),
            inside,
        });
        Ok(Self {
            q,
            weights: arranged,
            taps: tap_offsets(size[1]),
            size,
            pixel,
            out,
            stride: p.stride[0],
            reach: (p.kernel[0] - 1) * p.dilation[0] + 1,
            in_place,
        })
    }

    /// Whether pixels inside the image are read where they are (see `in_place`).
    pub(super) fn reads_in_place(&self) -> bool {
        self.in_place.is_some()
    }

    /// Heap bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.weights.len() * 4 + self.taps.len() * 8
    }

    /// Output pixels per task when the work is split over `threads`: bands of whole
    /// rows, as many as fit [`BAND_BYTES`] of the copy, fewer when the threads need
    /// more tasks to share. Rows too few to share evenly are cut into pixels instead:
    /// regnet's 7 × 7 layers went to two threads as 4 and 3 rows and took 0.035 ms,
    /// against 0.058 on one thread; cut into pixels, 0.029 (`bench nhwc`).
    fn task_pixels(&self, threads: usize) -> usize {
        let [oh, ow] = self.out;
        let row = self.size[1]
            .saturating_mul(self.pixel)
            .saturating_mul(4)
            .max(1);
        let rows_fit = (BAND_BYTES / row).saturating_sub(self.reach) / self.stride.max(1) + 1;
        if threads < 2 {
            return rows_fit.min(oh).max(1) * ow;
        }
        let band = rows_fit
            .min(oh.div_ceil(threads * super::TASKS_PER_THREAD))
            .max(1);
        let bands = oh.div_ceil(band);
        if bands.is_multiple_of(threads) || bands >= threads * super::TASKS_PER_THREAD {
            return band * ow;
        }
        // Tasks of two tiles at least, the same number per thread; a task may start
        // inside a row and read one row more than whole rows would.
        let pixels = oh * ow;
        let per_thread = (pixels / (threads * MIN_TASK_PIXELS)).clamp(1, super::TASKS_PER_THREAD);
        let fit = rows_fit.saturating_sub(1).max(1) * ow;
        pixels.div_ceil(threads * per_thread).min(fit).max(1)
    }

    /// Rows of the copy a task of `pixels` output pixels reads at most.
    fn task_rows(&self, pixels: usize) -> usize {
        let ow = self.out[1].max(1);
        // A task that starts inside a row spans one row more than its share.
        let rows = (pixels.div_ceil(ow) + usize::from(!pixels.is_multiple_of(ow))).min(self.out[0]);
        self.band_rows(rows.max(1))
    }

    /// Rows of the copy a band of `band` output rows reads.
    fn band_rows(&self, band: usize) -> usize {
        ((band - 1) * self.stride + self.reach).min(self.size[0])
    }

    /// Scratch (f32 elements) one thread needs for a task of `pixels` output pixels:
    /// the rows of the copy it reads, or, reading in place, a tile's windows and
    /// outputs.
    fn task_scratch(&self, pixels: usize, cout: usize) -> Result<usize> {
        let what = "padded input";
        match &self.in_place {
            Some(ip) => {
                let window = error::mul(ip.window_taps.len(), self.pixel, what)?;
                error::mul(window.saturating_add(cout), GROUPED_MR, what)
            }
            None => error::mul(
                error::mul(self.task_rows(pixels), self.size[1], what)?,
                self.pixel,
                what,
            ),
        }
    }

    /// Scratch (f32 elements) a run on a pool of `threads` threads needs: a task's
    /// scratch per thread (or one larger band, for a layer small enough to stay on the
    /// calling thread).
    pub(super) fn scratch_len(&self, threads: usize, cout: usize) -> Result<usize> {
        let for_threads = |threads: usize| {
            let per_thread = self.task_scratch(self.task_pixels(threads), cout)?;
            error::mul(per_thread, threads.max(1), "padded input")
        };
        Ok(for_threads(threads)?.max(for_threads(1)?))
    }

    /// `batch` NHWC images of `x` into `y` (`(+)=` with `accumulate`), then bias,
    /// `clamp` and `rest`: bands of output rows on the pool, each thread copying the
    /// rows of the input its band reads into its part of `scratch` first (or, reading
    /// in place, only the windows of pixels at the image's border).
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
        let cout = p.out_channels;
        let work = (oh * ow)
            .saturating_mul(cout)
            .saturating_mul(self.taps.len() * p.channels_per_group().0);
        // Small layers stay on the calling thread, band after band.
        let threads = if work < (1 << 17) { 1 } else { pool.threads() };
        let per_task = self.task_pixels(threads);
        let per_thread = self.task_scratch(per_task, cout)?;
        let needed = self.scratch_len(pool.threads(), cout)?;
        let len = scratch.len();
        let scratch = scratch
            .get_mut(..needed)
            .ok_or(error::Error::ScratchTooSmall { len, needed })?;
        let epilogue = Epilogue {
            bias,
            clamp,
            rest,
            accumulate,
        };
        for (x, y) in x.chunks_exact(xi.max(1)).zip(y.chunks_exact_mut(yi.max(1))) {
            let failed = FirstError::default();
            let chunk = (per_task * cout).max(1);
            let task = |task: usize, yt: &mut [f32], scratch: &mut [f32]| {
                // One chunk of pixels per task on the pool; all of them on the calling
                // thread.
                for (k, yb) in yt.chunks_mut(chunk).enumerate() {
                    let first = (task + k) * per_task;
                    failed.keep(match &self.in_place {
                        Some(ip) => self.in_place(isa, p, ip, (x, first, yb, scratch), &epilogue),
                        None => self.copied(isa, p, (x, first, yb, scratch), &epilogue),
                    });
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

    /// The output pixels of `yb`, from pixel `first` of the image `x` on, read from
    /// the rows of the input's padded copy they need, made in `copy` first.
    fn copied(
        &self,
        isa: Isa,
        p: &Conv2dParams,
        (x, first, yb, copy): (&[f32], usize, &mut [f32], &mut [f32]),
        epilogue: &Epilogue<'_>,
    ) -> Result {
        let ow = self.out[1].max(1);
        let cout = p.out_channels.max(1);
        let pixels_here = yb.len() / cout;
        let oy0 = first / ow;
        let last_row = (first + pixels_here.max(1) - 1) / ow;
        let copy_row = (self.size[1] * self.pixel).max(1);
        let rows = self.band_rows(last_row - oy0 + 1);
        let copy = copy.get_mut(..rows * copy_row).unwrap_or_default();
        for (i, row) in copy.chunks_exact_mut(copy_row).enumerate() {
            self.copy_row(isa, p, x, oy0 * self.stride + i, row);
        }
        let copy = &*copy;
        for (r, n) in even_tiles(pixels_here, GROUPED_MR, GROUPED_BUSY_ROWS) {
            let mut pixels = [0usize; GROUPED_MR];
            for (i, at) in pixels.iter_mut().take(n).enumerate() {
                let (oy, ox) = ((first + r + i) / ow, (first + r + i) % ow);
                *at = ((oy - oy0) * self.stride * self.size[1] + ox * p.stride[1]) * self.pixel;
            }
            let pixels = pixels.get(..n).unwrap_or_default();
            let c = yb.get_mut(r * cout..(r + n) * cout).unwrap_or_default();
            self.tile(isa, p, (copy, pixels, &self.taps), c, epilogue)?;
        }
        Ok(())
    }

    /// [`Self::copied`] reading the input in place: runs of pixels whose windows lie
    /// inside the image straight from `x`, the others gathered a tile at a time, each
    /// window copied with its zeros into `scratch` and the outputs put in place after.
    fn in_place(
        &self,
        isa: Isa,
        p: &Conv2dParams,
        ip: &InPlace,
        (x, first, yb, scratch): (&[f32], usize, &mut [f32], &mut [f32]),
        epilogue: &Epilogue<'_>,
    ) -> Result {
        let ow = self.out[1].max(1);
        let cout = p.out_channels.max(1);
        let (c, width) = (self.pixel, p.input[1]);
        let [[row0, row1], [col0, col1]] = ip.inside;
        let origin = |oy: usize, ox: usize| {
            ((oy * p.stride[0] - p.padding[0]) * width + ox * p.stride[1] - p.padding[1]) * c
        };
        let mut border = Border {
            pixels: [0; GROUPED_MR],
            count: 0,
        };
        let pixels_here = yb.len() / cout;
        let mut at = 0;
        while at < pixels_here {
            let (oy, ox) = ((first + at) / ow, (first + at) % ow);
            let end = ow.min(ox + pixels_here - at);
            // This row's pixels inside, `lo..hi`; those before and after are border.
            let (lo, hi) = if (row0..row1).contains(&oy) {
                let lo = col0.clamp(ox, end);
                (lo, col1.clamp(lo, end))
            } else {
                (end, end)
            };
            for bx in (ox..lo).chain(hi..end) {
                border.push(at + bx - ox);
                if border.count == GROUPED_MR {
                    self.border_tile(
                        isa,
                        p,
                        ip,
                        (x, first, &mut *yb, &mut *scratch),
                        &mut border,
                        epilogue,
                    )?;
                }
            }
            for (r, n) in even_tiles(hi - lo, GROUPED_MR, GROUPED_BUSY_ROWS) {
                let mut pixels = [0usize; GROUPED_MR];
                for (i, px) in pixels.iter_mut().take(n).enumerate() {
                    *px = origin(oy, lo + r + i);
                }
                let pixels = pixels.get(..n).unwrap_or_default();
                let o = at + lo - ox + r;
                let c = yb.get_mut(o * cout..(o + n) * cout).unwrap_or_default();
                self.tile(isa, p, (x, pixels, &ip.taps), c, epilogue)?;
            }
            at += end - ox;
        }
        self.border_tile(isa, p, ip, (x, first, yb, scratch), &mut border, epilogue)
    }

    /// The pixels listed in `border` (then none): their windows copied with their
    /// zeros, one after another, and the tile's outputs computed aside and put back.
    fn border_tile(
        &self,
        isa: Isa,
        p: &Conv2dParams,
        ip: &InPlace,
        (x, first, yb, scratch): (&[f32], usize, &mut [f32], &mut [f32]),
        border: &mut Border,
        epilogue: &Epilogue<'_>,
    ) -> Result {
        let n = std::mem::take(&mut border.count);
        if n == 0 {
            return Ok(());
        }
        let ow = self.out[1].max(1);
        let cout = p.out_channels.max(1);
        let c = self.pixel;
        let window = ip.window_taps.len() * c;
        let (windows, outputs) = scratch.split_at_mut((GROUPED_MR * window).min(scratch.len()));
        let outputs = outputs.get_mut(..n * cout).unwrap_or_default();
        let mut pixels = [0usize; GROUPED_MR];
        let at = border.pixels.get(..n).unwrap_or_default();
        for (i, (&o, px)) in at.iter().zip(pixels.iter_mut()).enumerate() {
            *px = i * window;
            let (oy, ox) = ((first + o) / ow, (first + o) % ow);
            let dst = windows
                .get_mut(i * window..(i + 1) * window)
                .unwrap_or_default();
            let taps = (0..p.kernel[0]).flat_map(|ky| (0..p.kernel[1]).map(move |kx| (ky, kx)));
            for ((ky, kx), d) in taps.zip(dst.chunks_exact_mut(c.max(1))) {
                let iy = (oy * p.stride[0] + ky * p.dilation[0]).checked_sub(p.padding[0]);
                let ix = (ox * p.stride[1] + kx * p.dilation[1]).checked_sub(p.padding[1]);
                let src = iy
                    .zip(ix)
                    .filter(|&(iy, ix)| iy < p.input[0] && ix < p.input[1])
                    .and_then(|(iy, ix)| {
                        x.get((iy * p.input[1] + ix) * c..(iy * p.input[1] + ix + 1) * c)
                    });
                match src {
                    Some(s) => d.copy_from_slice(s),
                    None => d.fill(0.0),
                }
            }
            if epilogue.accumulate {
                if let (Some(d), Some(s)) = (
                    outputs.get_mut(i * cout..(i + 1) * cout),
                    yb.get(o * cout..(o + 1) * cout),
                ) {
                    d.copy_from_slice(s);
                }
            }
        }
        let pixels = pixels.get(..n).unwrap_or_default();
        self.tile(
            isa,
            p,
            (windows, pixels, &ip.window_taps),
            outputs,
            epilogue,
        )?;
        for (&o, s) in at.iter().zip(outputs.chunks_exact(cout)) {
            if let Some(d) = yb.get_mut(o * cout..(o + 1) * cout) {
                d.copy_from_slice(s);
            }
        }
        Ok(())
    }

    /// One tile: every block of groups of the pixels at `pixels` in `a` (each tap at
    /// its offset in `taps`) into the consecutive output rows `c`, with the epilogue.
    fn tile(
        &self,
        isa: Isa,
        p: &Conv2dParams,
        (a, pixels, taps): (&[f32], &[usize], &[usize]),
        c: &mut [f32],
        epilogue: &Epilogue<'_>,
    ) -> Result {
        let (cig, cog) = p.channels_per_group();
        let (cout, lanes) = (p.out_channels, isa.lanes());
        let (block_in, block_w) = (self.q * cig, taps.len() * cig * lanes);
        for b in 0..p.groups.div_ceil(self.q) {
            let rows = GroupedRows {
                a: a.get(b * block_in..).unwrap_or_default(),
                pixels,
                taps,
                kc: cig,
            };
            let out = GroupedOut {
                c: c.get_mut(b * lanes..).unwrap_or_default(),
                cols: (p.groups - b * self.q).min(self.q) * cog,
                rs: cout,
                bias: epilogue.bias.get(b * lanes..).unwrap_or_default(),
                clamp: epilogue.clamp,
                accumulate: epilogue.accumulate,
            };
            let w = self.weights.get(b * block_w..).unwrap_or_default();
            grouped_microkernel(isa, self.q, &rows, w, out)?;
        }
        if epilogue.rest != Activation::Identity {
            elementwise::activate(isa, c, epilogue.rest);
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
        // One group per block and no missing groups: the row as it is.
        if q == 1 && pixel == c && body.len() == src.len() {
            body.copy_from_slice(src);
            return;
        }
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
