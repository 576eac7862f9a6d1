//! Sliding windows over one plane, shared by depthwise convolution and max pooling.
//!
//! The input plane is first copied into per-thread scratch with its rows padded (with
//! the reduction's neutral value) and split into their horizontal-stride phases
//! (`x[q], x[q + s], ...`), so that every kernel tap reads a contiguous run of a row
//! whatever the stride, padding or dilation. Each output row is then computed in
//! chunks of [`CH`] outputs held in registers: every tap combines its run into them,
//! and the chunk is stored once, after the activation.

use crate::arch::madd;
use crate::elementwise::{self, Activation};

/// Outputs computed at once in registers.
const CH: usize = 16;
/// Most kernel rows or columns handled (larger windows take another path).
pub(crate) const MAX_TAPS: usize = 64;

/// The geometry of a window sliding over an `input` plane to give `out`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Padding at the top and on the left.
    pub pad: [usize; 2],
    pub out: [usize; 2],
}

impl Window {
    /// The window of these parameters. Along an axis of one output the stride is
    /// never applied: it is taken as 1, so that the phase-split rows do not grow with
    /// a stride however large (their length would be charged for nothing).
    pub fn new(
        input: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        pad: [usize; 2],
        out: [usize; 2],
    ) -> Window {
        let one = |s: usize, o: usize| if o == 1 { 1 } else { s };
        let stride = [one(stride[0], out[0]), one(stride[1], out[1])];
        Window {
            input,
            kernel,
            stride,
            dilation,
            pad,
            out,
        }
    }

    /// Whether [`plane`] handles this window.
    pub fn supported(&self) -> bool {
        self.kernel[0] <= MAX_TAPS
            && self.kernel[1] <= MAX_TAPS
            && self.kernel[0] * self.kernel[1] <= MAX_TAPS
    }

    /// Length of one phase of a padded row: every tap's run over the output width
    /// rounded up to whole chunks.
    fn phase_len(&self) -> usize {
        let (sw, dw) = (self.stride[1], self.dilation[1]);
        (self.kernel[1] - 1) * dw / sw + self.out[1].div_ceil(CH) * CH
    }

    /// Scratch (f32) for one plane, checked.
    pub fn scratch(&self) -> Option<usize> {
        self.input[0]
            .checked_mul(self.stride[1])?
            .checked_mul(self.phase_len())
    }
}

/// How a window combines its taps.
pub(crate) trait Reduce {
    /// The value of padded positions.
    const PAD: f32;
    /// Combines value `v` (weighted by `tap`) into `acc`.
    fn step<const FMA: bool>(acc: f32, tap: f32, v: f32) -> f32;
}

/// Weighted sum (convolution).
pub(crate) struct MulAdd;
impl Reduce for MulAdd {
    const PAD: f32 = 0.0;
    #[inline(always)]
    fn step<const FMA: bool>(acc: f32, tap: f32, v: f32) -> f32 {
        madd::<FMA>(tap, v, acc)
    }
}

/// Maximum, NaN propagating (max pooling).
pub(crate) struct Max;
impl Reduce for Max {
    const PAD: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn step<const FMA: bool>(acc: f32, _tap: f32, v: f32) -> f32 {
        if v > acc || v.is_nan() {
            v
        } else {
            acc
        }
    }
}

/// Copies the input plane `x` (`h × w`) into `rows`: each row padded with `fill` by `pl` on
/// the left and split in `sw` phases of `len` (phase q holds padded columns q, q + sw,
/// ...), so that every tap reads a contiguous run.
fn pad_plane(x: &[f32], w: usize, pl: usize, sw: usize, len: usize, fill: f32, rows: &mut [f32]) {
    for (src, row) in x.chunks_exact(w).zip(rows.chunks_exact_mut(sw * len)) {
        if sw == 1 {
            let (head, rest) = row.split_at_mut(pl.min(row.len()));
            head.fill(fill);
            let (body, tail) = rest.split_at_mut(w.min(rest.len()));
            body.copy_from_slice(src.get(..body.len()).unwrap_or_default());
            tail.fill(fill);
            continue;
        }
        row.fill(fill);
        if sw == 2 {
            // Input column i is padded column i + pl: pairs (2m, 2m + 1) land in the
            // phases of parities pl and pl + 1.
            let (even, odd) = row.split_at_mut(len);
            let (first, second, f0, s0) = if pl.is_multiple_of(2) {
                (even, odd, pl / 2, pl / 2)
            } else {
                (odd, even, pl / 2, pl / 2 + 1)
            };
            let pairs = src.chunks_exact(2);
            let last = pairs.remainder().first().copied();
            let n = pairs.len();
            let (Some(a), Some(b)) = (first.get_mut(f0..f0 + n), second.get_mut(s0..s0 + n)) else {
                continue;
            };
            for ((a, b), pair) in a.iter_mut().zip(b.iter_mut()).zip(pairs) {
                if let &[p0, p1] = pair {
                    *a = p0;
                    *b = p1;
                }
            }
            if let (Some(v), Some(o)) = (last, first.get_mut(f0 + n)) {
                *o = v;
            }
        } else {
            for (i, &v) in src.iter().enumerate() {
                let col = i + pl;
                if let Some(o) = row.get_mut(col % sw * len + col / sw) {
                    *o = v;
                }
            }
        }
    }
}

/// One output row in chunks of `C` outputs kept in registers: each tap adds a run of
/// `C` values of a padded input row. `rows` holds the padded input rows the kernel
/// reaches with their taps; `offs` the start of each kernel column's run.
#[inline(always)]
#[allow(clippy::indexing_slicing)] // i < C indexes two arrays of length C
fn row_chunks<R: Reduce, const C: usize, const FMA: bool>(
    out_row: &mut [f32],
    rows: &[(&[f32], &[f32])],
    offs: &[usize],
    init: f32,
    activation: Activation,
) {
    for (c, dst) in out_row.chunks_mut(C).enumerate() {
        let c0 = c * C;
        let mut acc = [init; C];
        for &(row, row_taps) in rows {
            for (&t, &off) in row_taps.iter().zip(offs) {
                if let Some(run) = row
                    .get(off + c0..off + c0 + C)
                    .and_then(|r| <&[f32; C]>::try_from(r).ok())
                {
                    for i in 0..C {
                        acc[i] = R::step::<FMA>(acc[i], t, run[i]);
                    }
                }
            }
        }
        match <&mut [f32; C]>::try_from(&mut *dst) {
            Ok(d) => *d = acc,
            Err(_) => dst.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a),
        }
    }
    elementwise::bias_act::<FMA>(out_row, 0.0, activation);
}

/// One output plane (`out`) from one input plane: each output starts at `init` and
/// combines every tap of its window (`taps`: `kh × kw` weights, unused by [`Max`]);
/// `rows` is scratch of [`Window::scratch`] elements. Requires [`Window::supported`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn plane<R: Reduce, const FMA: bool>(
    g: &Window,
    x: &[f32],
    taps: &[f32],
    init: f32,
    activation: Activation,
    y: &mut [f32],
    rows: &mut [f32],
) {
    let ([h, w], [kh, kw], [_, ow]) = (g.input, g.kernel, g.out);
    let ([sh, sw], [dh, dw]) = (g.stride, g.dilation);
    let [pt, pl] = g.pad;
    let len = g.phase_len();
    let row_len = sw * len;
    pad_plane(x, w, pl, sw, len, R::PAD, rows);
    let rows = &*rows;
    // Padded column kx·dw is element (kx·dw) / sw of phase (kx·dw) % sw.
    let mut offs = [0usize; MAX_TAPS];
    for (kx, o) in offs.iter_mut().enumerate().take(kw) {
        let col = kx * dw;
        *o = col % sw * len + col / sw;
    }
    let offs = offs.get(..kw).unwrap_or_default();
    // The kernel rows inside the input for the current output row, with their taps.
    let mut live: [(&[f32], &[f32]); MAX_TAPS] = [(&[], &[]); MAX_TAPS];
    for (oy, out_row) in y.chunks_exact_mut(ow).enumerate() {
        let mut n = 0;
        for ky in 0..kh {
            let Some(iy) = (oy * sh + ky * dh).checked_sub(pt).filter(|&iy| iy < h) else {
                continue;
            };
            if let (Some(slot), Some(r), Some(t)) = (
                live.get_mut(n),
                rows.get(iy * row_len..(iy + 1) * row_len),
                taps.get(ky * kw..(ky + 1) * kw),
            ) {
                *slot = (r, t);
                n += 1;
            }
        }
        let live = live.get(..n).unwrap_or_default();
        row_chunks::<R, CH, FMA>(out_row, live, offs, init, activation);
    }
}
