//! A depthwise convolution with the pointwise convolutions around it (the inverted
//! residual block of mobilenet_v2, efficientnet, mnasnet and mobilenet_v3: expand
//! 1×1, depthwise k×k, project 1×1) run band by band of output rows, so that the
//! expanded tensors, six times wider than the block's input and output, never leave
//! the cache.
//!
//! Each thread takes a band of the depthwise convolution's output rows. It expands
//! the input rows a row needs into a ring of `kh` rows and the rows expanded ahead
//! with them (a row narrower than the register tiles fill well goes with the next
//! one or more, [`MAX_AHEAD`]; each row is expanded once per band;
//! a band's first rows recompute the `kh - stride` rows its neighbour also expands),
//! runs the depthwise row from the ring, and collects a few rows for the projection,
//! which writes them to the output with the residual. Written out layer by layer, the
//! expanded tensors of mobilenet_v2's first blocks (4.8 MB at 112×112×96) went to
//! memory and back: in the network its 3×3 stride-2 depthwise layer took 0.47 ms
//! against 0.17 ms with its input in cache.

use super::ConvNhwc;
use crate::error::{self, Error, Result};
use crate::pool::{FirstError, ThreadPool};

/// Most kernel rows of a chained depthwise convolution.
const MAX_KERNEL_ROWS: usize = 8;

/// Most input rows expanded per call. Rows are expanded ahead, a few at a time, when
/// one row leaves the register tiles partly empty: a row of 28 pixels fills 3 tiles
/// of 12 to 78%, two rows 5 tiles to 93% (`bench chain`, mobilenet_v2's 28 × 28
/// blocks at one thread: 0.28 → 0.20 ms). No more rows than that: a larger ring
/// leaves L1 (4 rows of 28 at a time made shufflenet_v2 no faster).
const MAX_AHEAD: usize = 4;

/// The share of a call's register tiles its pixels must fill (per cent) for no more
/// rows to be expanded with it.
const FILLED_PERCENT: usize = 90;

/// Most rows of the ring: the kernel's rows and those expanded ahead.
const MAX_SLOTS: usize = MAX_KERNEL_ROWS + MAX_AHEAD - 1;

/// Output pixels the projection takes per call, at least: rows are collected until
/// they hold this many (a row of a 7×7 image is less than one register tile wide).
const PROJECT_PIXELS: usize = 64;

/// Register tiles of pixels an expanded input row must fill for the chain to run
/// band by band (see [`DepthwiseChain::splits_well`]).
const MIN_ROW_TILES: usize = 2;

/// Depthwise output rows per band below which a multi-threaded run does not split
/// further (each band recomputes `kh - stride` expanded rows).
const MIN_BAND_ROWS: usize = 8;

/// An optional pointwise expansion, a depthwise convolution and an optional pointwise
/// projection, each one's output the next one's only input.
#[derive(Clone, Copy, Debug)]
pub struct DepthwiseChain<'a> {
    expand: Option<&'a ConvNhwc>,
    depthwise: &'a ConvNhwc,
    project: Option<&'a ConvNhwc>,
}

impl<'a> DepthwiseChain<'a> {
    /// The chain, if the layers fit together: a depthwise convolution with no
    /// vertical dilation and at most [`MAX_KERNEL_ROWS`] kernel rows, pointwise
    /// convolutions whose channels and image sizes meet it, and at least one of them.
    /// (No error value: callers ask at every execution, which must not allocate.)
    pub fn new(
        expand: Option<&'a ConvNhwc>,
        depthwise: &'a ConvNhwc,
        project: Option<&'a ConvNhwc>,
    ) -> Option<Self> {
        let d = depthwise.params();
        let fits_before = expand.is_none_or(|e| {
            let p = e.params();
            e.is_pointwise() && p.out_channels == d.in_channels && p.input == d.input
        });
        let fits_after = project.is_none_or(|q| {
            let p = q.params();
            q.is_pointwise()
                && p.in_channels == d.out_channels
                && p.input == depthwise.output_size()
        });
        let ok = depthwise.is_depthwise()
            && d.dilation[0] == 1
            && d.kernel[0] <= MAX_KERNEL_ROWS
            && (expand.is_some() || project.is_some())
            && fits_before
            && fits_after;
        ok.then_some(Self {
            expand,
            depthwise,
            project,
        })
    }

    /// Whether running band by band beats running the layers one by one, for `batch`
    /// images on `threads` threads. Each band expands `kh - stride` rows its
    /// neighbour also expands, which on a 7×7 image with a 5×5 kernel doubled the
    /// expansion at 2 threads. And the expansion multiplies one input row at a time:
    /// a row narrower than two register tiles leaves the tiles partly empty and
    /// streams all the expansion's weights once per row (mnasnet's 7×7 blocks, 1152
    /// channels: 0.73-0.80 ms each band by band). The layers of such small images
    /// stay in cache one by one anyway.
    pub fn splits_well(&self, batch: usize, threads: usize) -> bool {
        let wide = self
            .expand
            .is_none_or(|e| e.params().input[1] >= MIN_ROW_TILES * e.isa().gemm_tile().0);
        wide && (threads <= 1 || batch * self.depthwise.output_size()[0] >= threads * MIN_BAND_ROWS)
    }

    /// Elements of the chain's input and output for `batch` images.
    pub fn io_len(&self, batch: usize) -> Result<(usize, usize)> {
        let first = self.expand.unwrap_or(self.depthwise);
        let last = self.project.unwrap_or(self.depthwise);
        Ok((first.io_len(batch)?.0, last.io_len(batch)?.1))
    }

    /// Scratch (f32 elements) a run on a pool of `threads` threads needs.
    pub fn scratch_len(&self, threads: usize) -> Result<usize> {
        let (ring, rows) = self.per_thread()?;
        error::mul(
            error::add(ring, rows, "chain scratch")?,
            threads,
            "chain scratch",
        )
    }

    /// Per thread: the ring of expanded input rows, and the depthwise rows collected
    /// for the projection.
    fn per_thread(&self) -> Result<(usize, usize)> {
        let d = self.depthwise.params();
        let [_, ow] = self.depthwise.output_size();
        let ring = match self.expand {
            Some(_) => error::mul(self.ring_rows() * d.input[1], d.in_channels, "chain ring")?,
            None => 0,
        };
        let rows = match self.project {
            Some(_) => error::mul(self.project_rows() * ow, d.out_channels, "chain rows")?,
            None => 0,
        };
        Ok((ring, rows))
    }

    /// Input rows the expansion takes per call, at most: the fewest that fill the
    /// register tiles well, if any.
    fn expand_rows(&self) -> usize {
        let Some(expand) = self.expand else { return 1 };
        let width = self.depthwise.params().input[1].max(1);
        let mr = expand.isa().gemm_tile().0.max(1);
        let filled = |rows: usize| 100 * rows * width / (rows * width).next_multiple_of(mr);
        (1..=MAX_AHEAD)
            .find(|&rows| filled(rows) >= FILLED_PERCENT)
            .unwrap_or_else(|| (1..=MAX_AHEAD).max_by_key(|&r| filled(r)).unwrap_or(1))
    }

    /// Rows of the ring of expanded input rows: a kernel's rows and those expanded
    /// ahead, so that every row a depthwise row reads and every row expanded with it
    /// has a slot of its own.
    fn ring_rows(&self) -> usize {
        self.depthwise.params().kernel[0] + self.expand_rows() - 1
    }

    /// Depthwise output rows the projection takes per call.
    fn project_rows(&self) -> usize {
        PROJECT_PIXELS.div_ceil(self.depthwise.output_size()[1].max(1))
    }

    /// Runs the chain on `batch` NHWC images: `output = last(… first(input))`, with
    /// `residual` (shaped as the output) added before the projection's activation.
    pub fn run(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        batch: usize,
        residual: Option<&[f32]>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> Result {
        let (x_len, y_len) = self.io_len(batch)?;
        error::need("chain input", input.len(), x_len)?;
        error::need("chain output", output.len(), y_len)?;
        if let Some(r) = residual {
            if self.project.is_none() {
                return Err(Error::InvalidParameter {
                    what: "depthwise chain: a residual without a projection".into(),
                });
            }
            error::need("chain residual", r.len(), y_len)?;
        }
        let threads = pool.threads();
        let (ring, rows) = self.per_thread()?;
        let per_thread = ring + rows;
        let len = scratch.len();
        let needed = self.scratch_len(threads)?;
        let scratch = scratch
            .get_mut(..needed)
            .ok_or(Error::ScratchTooSmall { len, needed })?;
        let last = self.project.unwrap_or(self.depthwise);
        let [oh, ow] = self.depthwise.output_size();
        let row = ow * last.params().out_channels;
        let total = batch * oh;
        let tasks = if threads == 1 {
            1
        } else if total >= 2 * threads * MIN_BAND_ROWS {
            2 * threads
        } else {
            threads
        };
        let band = total.div_ceil(tasks).max(1);
        let output = output.get_mut(..y_len).unwrap_or_default();
        let failed = FirstError::default();
        pool.parallel_groups(
            output,
            row.max(1),
            band,
            scratch,
            per_thread,
            |r0, y, part| {
                let (ring, collected) = part.split_at_mut(ring.min(part.len()));
                let residual = residual.and_then(|r| r.get(r0 * row..r0 * row + y.len()));
                failed.keep(self.band(input, r0, y, residual, ring, collected));
            },
        )?;
        failed.into_result()
    }

    /// Depthwise output rows `r0..` of the batch (`y` holds their outputs of the last
    /// layer, `residual` the matching residual rows).
    fn band(
        &self,
        x: &[f32],
        r0: usize,
        y: &mut [f32],
        residual: Option<&[f32]>,
        ring: &mut [f32],
        collected: &mut [f32],
    ) -> Result {
        let d = self.depthwise.params();
        let [ih, iw] = d.input;
        let [oh, ow] = self.depthwise.output_size();
        let (kh, c) = (d.kernel[0], d.in_channels);
        let in_row = iw * c;
        let mid_row = ow * d.out_channels;
        let last = self.project.unwrap_or(self.depthwise);
        let out_row = ow * last.params().out_channels;
        let rows_here = y.len() / out_row.max(1);
        let per_call = self.project_rows();
        let (slots, ahead) = (self.ring_rows(), self.expand_rows());
        // The band's last output row: input rows past what it reads are not expanded.
        let (n_last, oy_last) = (
            (r0 + rows_here).saturating_sub(1) / oh.max(1),
            (r0 + rows_here).saturating_sub(1) % oh.max(1),
        );
        // The batch's input row each ring slot holds.
        let mut held = [usize::MAX; MAX_SLOTS];
        let mut pending = 0;
        for k in 0..rows_here {
            let (n, oy) = ((r0 + k) / oh.max(1), (r0 + k) % oh.max(1));
            let first = (oy * d.stride[0]).saturating_sub(d.padding[0]);
            let end = (oy * d.stride[0] + kh).saturating_sub(d.padding[0]).min(ih);
            if let Some(expand) = self.expand {
                let stop = if n == n_last {
                    oy_last
                } else {
                    oh.saturating_sub(1)
                };
                let needed = (stop * d.stride[0] + kh)
                    .saturating_sub(d.padding[0])
                    .min(ih);
                let mut iy = first;
                while iy < end {
                    let slot = iy % slots;
                    if held.get(slot) == Some(&(n * ih + iy)) {
                        iy += 1;
                        continue;
                    }
                    // Rows from `iy` in consecutive slots: within `slots` rows of
                    // `first`, so apart from the rows the window still reads.
                    let count = ahead
                        .min(slots - slot)
                        .min(needed.saturating_sub(iy))
                        .max(1);
                    let (Some(h), Some(dst)) = (
                        held.get_mut(slot..slot + count),
                        ring.get_mut(slot * in_row..(slot + count) * in_row),
                    ) else {
                        break;
                    };
                    expand.pointwise_pixels(x, (n * ih + iy) * iw, dst, false)?;
                    for (j, h) in h.iter_mut().enumerate() {
                        *h = n * ih + iy + j;
                    }
                    iy += count;
                }
            }
            let ring: &[f32] = ring;
            let image = x.get(n * ih * in_row..(n + 1) * ih * in_row);
            let source = |iy: usize| -> Option<&[f32]> {
                match self.expand {
                    Some(_) => {
                        let slot = iy % slots;
                        let ready = held.get(slot) == Some(&(n * ih + iy));
                        ring.get(slot * in_row..(slot + 1) * in_row)
                            .filter(|_| ready)
                    }
                    None => image?.get(iy * in_row..(iy + 1) * in_row),
                }
            };
            let Some(project) = self.project else {
                let dst = y
                    .get_mut(k * out_row..(k + 1) * out_row)
                    .unwrap_or_default();
                self.depthwise.depthwise_row_from(&source, oy, dst)?;
                continue;
            };
            let dst = collected.get_mut(pending * mid_row..(pending + 1) * mid_row);
            self.depthwise
                .depthwise_row_from(&source, oy, dst.unwrap_or_default())?;
            pending += 1;
            if pending == per_call || k + 1 == rows_here {
                let start = (k + 1 - pending) * out_row;
                let out = y.get_mut(start..(k + 1) * out_row).unwrap_or_default();
                if let Some(r) = residual.and_then(|r| r.get(start..start + out.len())) {
                    out.copy_from_slice(r);
                }
                let mid = collected.get(..pending * mid_row).unwrap_or_default();
                project.pointwise_pixels(mid, 0, out, residual.is_some())?;
                pending = 0;
            }
        }
        Ok(())
    }
}
