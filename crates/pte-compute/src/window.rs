//! Sliding windows over one plane, shared by depthwise convolution and max pooling.
//!
//! The input plane is first copied into per-thread scratch with its rows padded (with
//! the reduction's neutral value) and split into their horizontal-stride phases
//! (`x[q], x[q + s], ...`), so that every kernel tap reads a contiguous run of a row
//! whatever the stride, padding or dilation. Each output row is then computed in
//! chunks of [`CH`] outputs held in registers: every tap combines its run into them,
//! and the chunk is stored once, after the activation. A weighted sum on AVX2 takes
//! four output rows at a time, each with its own chain of multiply-adds; on AVX-512, at
//! stride 1, its shifted runs are cut in registers from two loads per input row.

use crate::arch::{self, madd, multiversion, Isa};
#[cfg(target_arch = "x86_64")]
use crate::arch::{Avx2, Lanes, Wide};
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

/// The input plane `x` copied into `rows` as [`pad_plane`] lays it out; returns the
/// length of one padded row and, per kernel column, where its run starts in a row.
fn pad_and_offsets(
    g: &Window,
    x: &[f32],
    fill: f32,
    rows: &mut [f32],
) -> (usize, [usize; MAX_TAPS]) {
    let (sw, dw) = (g.stride[1], g.dilation[1]);
    let len = g.phase_len();
    pad_plane(x, g.input[1], g.pad[1], sw, len, fill, rows);
    // Padded column kx·dw is element (kx·dw) / sw of phase (kx·dw) % sw.
    let mut offs = [0usize; MAX_TAPS];
    for (kx, o) in offs.iter_mut().enumerate().take(g.kernel[1]) {
        let col = kx * dw;
        *o = col % sw * len + col / sw;
    }
    (sw * len, offs)
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
    let ([h, _], [kh, kw], [_, ow]) = (g.input, g.kernel, g.out);
    let (sh, dh, pt) = (g.stride[0], g.dilation[0], g.pad[0]);
    let (row_len, offs) = pad_and_offsets(g, x, R::PAD, rows);
    let rows = &*rows;
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

/// Output rows a weighted window computes together in [`weighted_plane`].
const ROWS: usize = 4;

/// [`plane`] for a weighted sum ([`MulAdd`]) on explicit vectors, [`ROWS`] output rows
/// at a time. Where `plane` keeps one chain of dependent multiply-adds per chunk (a 7×7
/// kernel: 49 in a row, latency-bound), here each row of a group has its own chain and
/// each tap, loaded once, serves them all: convnext's 7×7 layers went from 21 to 28
/// GFLOP/s at 56×56, 14 to 21 at 14×14 (`bench depthwise`, one thread). What bounds it
/// now is loads of runs that straddle two cache lines (aligned runs measured 42).
// Only the AVX2 kernels run it (other targets take `weighted_plane_loop`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_plane<L: Lanes>(
    l: L,
    g: &Window,
    x: &[f32],
    taps: &[f32],
    init: f32,
    y: &mut [f32],
    rows: &mut [f32],
) {
    let ow = g.out[1];
    let (row_len, offs) = pad_and_offsets(g, x, 0.0, rows);
    let padded = Padded {
        rows,
        row_len,
        g,
        offs: offs.get(..g.kernel[1]).unwrap_or_default(),
        taps,
    };
    if ow == 0 {
        return;
    }
    for (group, out) in y.chunks_mut(ROWS * ow).enumerate() {
        let oy0 = group * ROWS;
        match out.len() / ow {
            4 => row_group::<L, 4>(l, &padded, oy0, init, out),
            3 => row_group::<L, 3>(l, &padded, oy0, init, out),
            2 => row_group::<L, 2>(l, &padded, oy0, init, out),
            _ => row_group::<L, 1>(l, &padded, oy0, init, out),
        }
    }
}

/// [`weighted_plane`] for square 3×3, 5×5 and 7×7 kernels at stride and dilation 1 on
/// the AVX-512 kernel that cuts a row's shifted runs from two loads
/// ([`arch::depthwise_plane_rows`]): convnext_tiny's 7×7 layers at 56 × 56, one thread,
/// 0.94 -> 0.52 ms, 3×3 at 56 × 56 0.31 -> 0.17 (`bench layer`). False (nothing
/// written) for any other layer or CPU.
fn weighted_plane_shifted(
    isa: Isa,
    g: &Window,
    x: &[f32],
    taps: &[f32],
    init: f32,
    y: &mut [f32],
    rows: &mut [f32],
) -> bool {
    let k = g.kernel[0];
    let fits = isa == Isa::Avx512
        && g.stride == [1, 1]
        && g.dilation == [1, 1]
        && g.kernel[1] == k
        && matches!(k, 3 | 5 | 7)
        && g.out[1] > 0;
    if !fits {
        return false;
    }
    let (row_len, _) = pad_and_offsets(g, x, 0.0, rows);
    let ([h, _], ow, top) = (g.input, g.out[1], g.pad[0]);
    let rows = &*rows;
    for (group, out) in y.chunks_mut(ROWS * ow).enumerate() {
        let oy0 = group * ROWS;
        let n = out.len() / ow + k - 1;
        let mut src: [Option<&[f32]>; arch::DW_PLANE_ROWS] = [None; arch::DW_PLANE_ROWS];
        for (j, s) in src.iter_mut().enumerate().take(n) {
            *s = (oy0 + j)
                .checked_sub(top)
                .filter(|&iy| iy < h)
                .and_then(|iy| rows.get(iy * row_len..(iy + 1) * row_len));
        }
        let src = src.get(..n).unwrap_or_default();
        let done = match k {
            3 => arch::depthwise_plane_rows::<3>(isa, src, taps, init, out, ow),
            5 => arch::depthwise_plane_rows::<5>(isa, src, taps, init, out, ow),
            _ => arch::depthwise_plane_rows::<7>(isa, src, taps, init, out, ow),
        };
        if !done {
            return false;
        }
    }
    true
}

/// A plane laid out by [`pad_and_offsets`], with the kernel's taps.
#[cfg(target_arch = "x86_64")]
struct Padded<'a> {
    rows: &'a [f32],
    row_len: usize,
    g: &'a Window,
    offs: &'a [usize],
    taps: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
impl Padded<'_> {
    /// The padded input row that kernel row `ky` reads for output row `oy`; empty
    /// where that row is padding.
    #[inline(always)]
    fn row(&self, oy: usize, ky: usize) -> &[f32] {
        let (sh, dh, pt, h) = (
            self.g.stride[0],
            self.g.dilation[0],
            self.g.pad[0],
            self.g.input[0],
        );
        (oy * sh + ky * dh)
            .checked_sub(pt)
            .filter(|&iy| iy < h)
            .and_then(|iy| self.rows.get(iy * self.row_len..(iy + 1) * self.row_len))
            .unwrap_or_default()
    }
}

/// `R` output rows from `oy0` (`out`, `R × ow`), chunk by chunk: per kernel tap, one
/// multiply-add into each row's accumulator, from that row's run of the tap's input row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn row_group<L: Lanes, const R: usize>(
    l: L,
    p: &Padded<'_>,
    oy0: usize,
    init: f32,
    out: &mut [f32],
) {
    let ([kh, kw], ow) = (p.g.kernel, p.g.out[1]);
    for c0 in (0..ow).step_by(L::LANES) {
        let mut acc = [l.splat(init); R];
        for (ky, taps) in p.taps.chunks_exact(kw).take(kh).enumerate() {
            let mut src: [&[f32]; R] = [&[]; R];
            for (r, s) in src.iter_mut().enumerate() {
                *s = p.row(oy0 + r, ky);
            }
            for (&t, &off) in taps.iter().zip(p.offs) {
                for (a, row) in acc.iter_mut().zip(&src) {
                    // In bounds but where the row is padding: runs end within a
                    // phase, rounded up to whole chunks of CH.
                    if let Some(run) = row.get(off + c0..off + c0 + L::LANES) {
                        *a = l.mul_add(l.load(run), t, *a);
                    }
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            if let Some(d) = out.get_mut(r * ow + c0..(r + 1) * ow) {
                l.store(*a, d);
            }
        }
    }
}

multiversion! {
    /// [`plane`] for a weighted sum, compiled for each instruction set.
    fn weighted_plane_loop<const FMA: bool>(g: &Window, x: &[f32], taps: &[f32], init: f32, activation: Activation, y: &mut [f32], rows: &mut [f32]) {
        plane::<MulAdd, FMA>(g, x, taps, init, activation, y, rows);
    }
}

/// One output plane of a weighted window (depthwise convolution), as [`plane`] with
/// [`MulAdd`], on the widest explicit vectors `isa` allows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted(
    isa: Isa,
    g: &Window,
    x: &[f32],
    taps: &[f32],
    init: f32,
    activation: Activation,
    y: &mut [f32],
    rows: &mut [f32],
) {
    if weighted_plane_shifted(isa, g, x, taps, init, y, rows) {
        return elementwise::add_scalar_activate(isa, y, 0.0, activation);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = Avx2::new().filter(|_| isa != Isa::Generic) {
        // Runs of 16 lanes stay inside a phase, which is whole chunks of CH.
        const { assert!(CH.is_multiple_of(16)) };
        let l = Wide::<_, 2>(s);
        s.vectorize(
            #[inline(always)]
            || weighted_plane(l, g, x, taps, init, y, rows),
        );
        // Apart, so that its constants do not take registers from the accumulators.
        return elementwise::add_scalar_activate(isa, y, 0.0, activation);
    }
    weighted_plane_loop(isa, g, x, taps, init, activation, y, rows);
}
