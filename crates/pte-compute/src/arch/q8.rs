//! The 8-bit product micro-kernel of quantized convolutions: unsigned 8-bit
//! activations read in place through [`IndirectRows`], times signed 8-bit weights
//! packed in panels, summed in 32 bits and requantized to 8 bits as they are stored.
//!
//! A panel holds [`Q8_NR`] output channels over the whole depth, in groups of four
//! depth steps: `b[((t · kq + p) · NR + j) · 4 + u]` is depth step `4p + u` of tap `t`
//! for column `j` (`kq` groups per tap; steps past the depth are zero). This is the
//! operand layout of AVX-512 VNNI's `vpdpbusd`, which adds four products of unsigned
//! and signed bytes to each 32-bit lane; each row then reads four bytes at a time, so
//! rows hold `4 · kq` readable bytes.
//!
//! The AVX2 kernel, which has no such instruction, multiplies 16-bit values in pairs
//! (`vpmaddwd`). Its rows are the activations widened to 16 bits beforehand (little
//! endian, `8 · kq` bytes), and each group of four depth steps of its panels holds
//! two pairs: `b[((t · kq + p) · 2 + h) · NR · 2 + 2j + u]` is depth step `4p + 2h +
//! u` (see [`q8_lane`]). A row's pair is then one 32-bit
//! broadcast and a pair of columns one sum, where widening bytes in the kernel took
//! two shuffles per row and depth group and a horizontal add per store (32-bit
//! sums of 12 rows × 32 columns: 42 → 57 multiply-adds per ns, in cache).
//!
//! The store follows XNNPACK's fp32 requantization: `acc` (starting at the column's
//! bias) is converted to f32, scaled by the column's scale, clamped to the output's
//! bounds less its zero point, rounded half to even, offset by the zero point and
//! stored as its low byte (the bounds keep it in the output type's range).
//!
//! Grouped convolutions with few output channels per group (regnet's 8) would fill 8
//! of a panel's 32 columns. On VNNI their panels can instead be interleaved, as the
//! float kernel of `grouped.rs` is: one vector of 16 columns holds the outputs of `q`
//! groups (lane `o · q + g` is output `o` of group `g`), each row holds the `q` groups'
//! depth steps quad by quad (quad `p` of group `g` at bytes `4 · (p · q + g)`), and
//! each depth step broadcasts the `4 · q` bytes as one pattern.

use super::indirect::IndirectRows;
#[cfg(target_arch = "x86_64")]
use super::Isa;
use crate::error::{Error, Result};

/// Output channels of a panel.
pub(crate) const Q8_NR: usize = 32;
/// Rows of a tile: the VNNI kernel keeps `12 × 2` accumulators.
pub(crate) const Q8_MR: usize = 12;

/// Consecutive panels one call multiplies: `count` panels `stride` bytes apart, every
/// one [`Q8_NR`] columns wide but the last, of which only `cols` are stored.
/// `interleave` is 0, or the `q` groups (1, 2, 4 or 8, VNNI only) of each interleaved
/// panel, [`Q8_LANES`] columns wide (see the module docs), their stored columns in
/// channel order; panel `k` then reads the `k`-th of `count` equal parts of each row.
/// One group per panel (16 output channels, regnet_x's) takes all of a tile's groups
/// in one call, as interleaved groups do: a call per group and tile was a fifth of
/// such a layer.
#[derive(Clone, Copy)]
pub(crate) struct Q8Panels<'a> {
    pub data: &'a [i8],
    pub stride: usize,
    pub count: usize,
    pub cols: usize,
    pub interleave: usize,
}

/// Columns of an interleaved panel: one vector of 32-bit sums.
pub(crate) const Q8_LANES: usize = 16;

/// The groups per interleaved panel the VNNI kernel takes.
pub(crate) const Q8_INTERLEAVES: [usize; 4] = [1, 2, 4, 8];

/// The requantization of a tile's columns (from its first): per-column bias and
/// scale, output zero point, and the clamp bounds less the zero point.
#[derive(Clone, Copy)]
pub(crate) struct Q8Post<'a> {
    pub bias: &'a [i32],
    pub scale: &'a [f32],
    pub zero: i32,
    pub lo: f32,
    pub hi: f32,
}

impl Q8Post<'_> {
    /// The sum of column `j` requantized: the scalar form of the store.
    #[inline]
    pub(crate) fn apply(&self, acc: i32, j: usize) -> i32 {
        self.requantize(acc, self.scale.get(j).copied().unwrap_or(0.0))
    }

    /// `acc` requantized with `scale` (see [`requantize`]).
    #[inline(always)]
    pub(crate) fn requantize(&self, acc: i32, scale: f32) -> i32 {
        requantize(acc, scale, (self.lo, self.hi), self.zero)
    }
}

/// XNNPACK's fp32 requantization of one sum: `acc · scale`, clamped to `lo..=hi` (the
/// output bounds less the zero point, within ±2^22), rounded half to even, plus
/// `zero`.
#[inline(always)]
pub fn requantize(acc: i32, scale: f32, (lo, hi): (f32, f32), zero: i32) -> i32 {
    // Compared rather than `max`/`min`, which keep the other operand of a NaN and
    // cost a test per lane to do so: the product is a number here.
    let v = acc as f32 * scale;
    let v = if v > lo { v } else { lo };
    round_small(if v < hi { v } else { hi }) + zero
}

/// `x` (below 2^22 in magnitude) rounded half to even: adding 1.5 · 2^23 moves it
/// where a float's unit is 1, so the addition rounds. Exact, and a loop of it
/// vectorizes, where a float to integer conversion does not (and `round_ties_even`
/// is a call into libm without SSE4.1 in the baseline target).
#[inline(always)]
pub fn round_small(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// Where depth step `u` (of four) of column `j` lies in a panel's group of four depth
/// steps of `nr` columns: `4j + u`, or in pairs (`[2][nr][2]`) for a kernel that
/// [`Q8Kernel::widens`].
pub(crate) fn q8_lane(j: usize, u: usize, nr: usize, pairs: bool) -> usize {
    if pairs {
        (u / 2) * 2 * nr + 2 * j + u % 2
    } else {
        4 * j + u
    }
}

/// `src`'s bytes, each XORed with `flip`, widened to 16-bit little-endian values at
/// the start of `dst` (the rows of a kernel that [`Q8Kernel::widens`]), as many as
/// it holds.
pub(crate) fn widen_bytes(dst: &mut [u8], src: &[u8], flip: u8) {
    let n = src.len().min(dst.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        // SAFETY: `dst` holds 2n bytes, `src` n, and they do not overlap (borrows);
        // AVX2 is available.
        unsafe { x86::widen(dst.as_mut_ptr(), src.as_ptr(), n, flip) };
        return;
    }
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&[s ^ flip, 0]);
    }
}

/// The bytes of `d`'s second half widened in place, as [`widen_bytes`] without a
/// flip, over the whole of `d` (of even length; a last odd byte is left).
pub(crate) fn widen_upper_half(d: &mut [u8]) {
    let n = d.len() / 2;
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        // SAFETY: `d` holds 2n bytes, the source the n from n; the kernel reads each
        // block before writing its widened values, which end before the first byte
        // it has not read (see `x86::widen`); AVX2 is available.
        unsafe {
            let p = d.as_mut_ptr();
            x86::widen(p, p.add(n), n, 0);
        }
        return;
    }
    // Front to back: value i is read before pair i is written, and pair i ends
    // at 2i + 2 <= n + i + 1, where the next value is.
    for i in 0..n {
        let v = d.get(n + i).copied().unwrap_or(0);
        if let Some(pair) = d.get_mut(2 * i..2 * i + 2) {
            pair.copy_from_slice(&[v, 0]);
        }
    }
}

/// The 8-bit product kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q8Kernel {
    /// Portable Rust.
    Portable,
    /// AVX2: activations widened to 16 bits beforehand, weights in the kernel,
    /// pairs multiplied and added (`vpmaddwd`), a 6 × 16 tile.
    Avx2,
    /// AVX-512 F, BW, VL and VNNI: four byte products added per lane (`vpdpbusd`), a
    /// 12 × 32 tile.
    Vnni,
}

impl Q8Kernel {
    const ALL: [Q8Kernel; 3] = [Q8Kernel::Portable, Q8Kernel::Avx2, Q8Kernel::Vnni];

    /// Whether this CPU runs it.
    pub fn is_available(self) -> bool {
        match self {
            Q8Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::Avx2 => Isa::Avx2.is_available(),
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::Vnni => {
                Isa::Avx512.is_available()
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether its rows hold 16-bit values and its panels pairs of depth steps (see
    /// the module docs), rather than bytes and groups of four.
    pub(crate) fn widens(self) -> bool {
        self == Q8Kernel::Avx2
    }

    /// The fastest this CPU runs.
    pub fn best() -> Q8Kernel {
        Self::ALL
            .into_iter()
            .rev()
            .find(|k| k.is_available())
            .unwrap_or(Q8Kernel::Portable)
    }

    /// Those this CPU runs.
    pub fn available() -> impl Iterator<Item = Q8Kernel> {
        Self::ALL.into_iter().filter(|k| k.is_available())
    }
}

/// One row tile of an 8-bit product across a run of panels: for each panel `q`,
/// `out[(i0 + i) · rs + j0 + q · NR + j] = requant(bias[j] + Σ_t Σ_k a[t·rows + i][k] ·
/// b[q][t][k][j])`. Every length is checked first: the rows hold `4 · kq` bytes
/// (`kq = rows.depth() / 4`), each panel `taps · kq · NR · 4` bytes, the tile lies
/// inside `out`, and the post covers its columns.
pub(crate) fn q8_microkernel(
    kernel: Q8Kernel,
    a: &IndirectRows<'_, u8>,
    b: &Q8Panels<'_>,
    out: &mut [u8],
    (i0, j0, rs): (usize, usize, usize),
    post: &Q8Post<'_>,
) -> Result {
    let (rows, taps, kc) = a.shape();
    let q = b.interleave;
    let interleaved = q != 0;
    // Columns of a panel, and the depth groups of four it reads (of each group).
    let (nr, part) = if interleaved {
        (Q8_LANES, 4 * q * b.count)
    } else if kernel.widens() {
        (Q8_NR, 8)
    } else {
        (Q8_NR, 4)
    };
    let kq = kc.checked_div(part).unwrap_or(0);
    let width = b
        .count
        .checked_sub(1)
        .and_then(|q| q.checked_mul(nr))
        .and_then(|w| w.checked_add(b.cols));
    let panel_len = taps.checked_mul(kq).and_then(|v| v.checked_mul(nr * 4));
    let b_len = b
        .count
        .checked_sub(1)
        .and_then(|q| q.checked_mul(b.stride))
        .zip(panel_len)
        .and_then(|(start, len)| start.checked_add(len));
    let end = width.and_then(|w| {
        (i0 + rows)
            .checked_sub(1)?
            .checked_mul(rs)?
            .checked_add(j0)?
            .checked_add(w)
    });
    let ok = (1..=Q8_MR).contains(&rows)
        && kernel.is_available()
        && part > 0
        && kc.is_multiple_of(part)
        && (1..=nr).contains(&b.cols)
        && (!interleaved
            || (Q8_INTERLEAVES.contains(&q) && kernel == Q8Kernel::Vnni && kernel.is_available()))
        && b_len.is_some_and(|l| b.data.len() >= l)
        && width.is_some_and(|w| post.bias.len() >= w && post.scale.len() >= w && w <= rs)
        && end.is_some_and(|e| e <= out.len());
    if !ok {
        return Err(Error::InvalidParameter {
            what: format!(
                "8-bit micro-kernel call: {rows} rows, {taps} taps of depth {kc}, {} panels (interleave {q}) of b {}, output {} at ({i0}, {j0}) stride {rs}",
                b.count,
                b.data.len(),
                out.len()
            ),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if kernel != Q8Kernel::Portable {
        use super::indirect::Ptrs;
        let panels = (b.data.as_ptr(), b.stride, b.count, b.cols);
        // SAFETY: the tile's offset is inside `out` (checked above).
        let c = unsafe { out.as_mut_ptr().add(i0 * rs + j0) };
        let raw = x86::RawQ8::from(post);
        let shape = (rows, taps, kq);
        // SAFETY: the rows as checked by `IndirectRows`, every other length above,
        // and the CPU has the kernel's features (interleaved panels: VNNI, checked).
        unsafe {
            match (kernel, a.ptrs()) {
                (Q8Kernel::Vnni, Ptrs::List(p)) => x86::vnni(shape, q, p, panels, c, rs, raw),
                (Q8Kernel::Vnni, Ptrs::Strided(p)) => x86::vnni(shape, q, p, panels, c, rs, raw),
                (Q8Kernel::Vnni, Ptrs::Table(p)) => x86::vnni(shape, q, p, panels, c, rs, raw),
                (_, Ptrs::List(p)) => x86::avx2(shape, p, panels, c, rs, raw),
                (_, Ptrs::Strided(p)) => x86::avx2(shape, p, panels, c, rs, raw),
                (_, Ptrs::Table(p)) => x86::avx2(shape, p, panels, c, rs, raw),
            }
        }
        return Ok(());
    }
    portable(a, b, out, (i0, j0, rs), post);
    Ok(())
}

/// The portable kernel (no `unsafe`): what runs on CPUs with neither AVX2 nor VNNI.
fn portable(
    a: &IndirectRows<'_, u8>,
    b: &Q8Panels<'_>,
    out: &mut [u8],
    (i0, j0, rs): (usize, usize, usize),
    post: &Q8Post<'_>,
) {
    let (rows, taps, kc) = a.shape();
    let kq = kc / 4;
    for q in 0..b.count {
        let panel = b.data.get(q * b.stride..).unwrap_or_default();
        let cols = if q + 1 == b.count { b.cols } else { Q8_NR };
        for i in 0..rows {
            let mut acc = [0i32; Q8_NR];
            for (j, s) in acc.iter_mut().enumerate() {
                *s = post.bias.get(q * Q8_NR + j).copied().unwrap_or(0);
            }
            for t in 0..taps {
                let x = a.row(t, i);
                let bt = panel.get(t * kq * Q8_NR * 4..).unwrap_or_default();
                for (p, bp) in bt.chunks_exact(Q8_NR * 4).take(kq).enumerate() {
                    let xs = x.get(4 * p..4 * p + 4).unwrap_or_default();
                    for (s, w) in acc.iter_mut().zip(bp.chunks_exact(4)) {
                        for (&xv, &wv) in xs.iter().zip(w) {
                            *s = s.wrapping_add(i32::from(xv) * i32::from(wv));
                        }
                    }
                }
            }
            let at = (i0 + i) * rs + j0 + q * Q8_NR;
            let row = out.get_mut(at..at + cols).unwrap_or_default();
            for (j, (o, &s)) in row.iter_mut().zip(&acc).enumerate() {
                *o = post.apply(s, q * Q8_NR + j) as u8;
            }
        }
    }
}

/// The input of one output row of a K×K depthwise convolution with multiplier 1:
/// the K input rows (`None`: padding) of `w_in · c` bytes each, and the row's
/// horizontal geometry (input width, stride, dilation, left padding).
// Only the x86 kernel reads the geometry (other architectures run the loop).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) struct Q8DwRow<'a, const K: usize> {
    pub rows: [Option<&'a [u8]>; K],
    pub w_in: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad: usize,
}

/// The input column of tap `kx` of output pixel `ox` of a depthwise row, if inside
/// the row: `(w_in, stride, dilation, pad)` is the row's horizontal geometry.
#[inline(always)]
pub(crate) fn input_column(
    ox: usize,
    kx: usize,
    (w_in, stride, dilation, pad): (usize, usize, usize, usize),
) -> Option<usize> {
    (ox * stride + kx * dilation)
        .checked_sub(pad)
        .filter(|&ix| ix < w_in)
}

/// One output row of a K×K depthwise convolution with multiplier 1:
/// `out[ox · c + ch] = requant(bias[ch] + Σ_taps (x - za) · w[tap · c + ch])`,
/// activations signed or unsigned bytes, weights 32-bit values within ±32767 (8-bit
/// weights less their zero point), padded taps skipped. On AVX-512 (F, BW, VL and
/// VNNI: [`Q8Kernel::Vnni`]) the channels past the last block of 32 run masked; on AVX2
/// ([`Q8Kernel::Avx2`]) the channels must be whole vectors. Returns false (nothing
/// written) for another kernel or when a length does not fit: the caller then runs
/// the portable loop.
pub(crate) fn q8_depthwise_row<const K: usize>(
    kernel: Q8Kernel,
    x: &Q8DwRow<'_, K>,
    weights: &[i32],
    post: &Q8Post<'_>,
    (signed, za): (bool, i32),
    out: &mut [u8],
) -> bool {
    let c = post.bias.len().min(post.scale.len());
    let Some(row_len) = x.w_in.checked_mul(c) else {
        return false;
    };
    let avx2 = kernel == Q8Kernel::Avx2 && c >= 16;
    let ok = (kernel == Q8Kernel::Vnni || avx2)
        && kernel.is_available()
        && K <= 5
        && c > 0
        && out.len().is_multiple_of(c)
        && x.stride > 0
        && weights.len() / c >= K * K
        && x.rows.iter().flatten().all(|r| r.len() >= row_len);
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let rows = x.rows.map(|r| r.map_or(std::ptr::null(), <[u8]>::as_ptr));
        let raw = x86::RawQ8::from(post);
        let geometry = (x.w_in, x.stride, x.dilation, x.pad);
        let (w, y, ow) = (weights.as_ptr(), out.as_mut_ptr(), out.len() / c);
        // SAFETY: the CPU has AVX-512 F, BW, VL and VNNI (VNNI's kernel is available), or
        // AVX2 with `c` at least 16; every row present holds `w_in · c` bytes,
        // `weights` `K² · c` values (within ±32767: the contract), the post `c`,
        // `out` `ow · c` bytes (checked above); the kernel reads only columns below
        // `w_in`.
        unsafe {
            let y = (y, ow);
            // Stride 1 and 2 without dilation as constants, so that the taps are read
            // at fixed offsets (and on VNNI the taps pixels of a group share loaded
            // and widened once); 0: the row's own.
            macro_rules! by_stride {
                ($kernel:ident) => {
                    match (signed, x.stride, x.dilation) {
                        (true, 1, 1) => {
                            x86::$kernel::<K, true, 1>(rows, w, c, raw, za, geometry, y)
                        }
                        (true, 2, 1) => {
                            x86::$kernel::<K, true, 2>(rows, w, c, raw, za, geometry, y)
                        }
                        (true, ..) => x86::$kernel::<K, true, 0>(rows, w, c, raw, za, geometry, y),
                        (false, 1, 1) => {
                            x86::$kernel::<K, false, 1>(rows, w, c, raw, za, geometry, y)
                        }
                        (false, 2, 1) => {
                            x86::$kernel::<K, false, 2>(rows, w, c, raw, za, geometry, y)
                        }
                        (false, ..) => {
                            x86::$kernel::<K, false, 0>(rows, w, c, raw, za, geometry, y)
                        }
                    }
                };
            }
            if avx2 {
                by_stride!(depthwise_row_avx2);
            } else {
                by_stride!(depthwise_row);
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (weights, post, signed, za, out);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::indirect::RowPtrs;
    use super::Q8_NR;

    /// [`super::Q8Post`] as pointers to the tile's first column.
    #[derive(Clone, Copy)]
    pub(super) struct RawQ8 {
        pub bias: *const i32,
        pub scale: *const f32,
        pub zero: i32,
        pub lo: f32,
        pub hi: f32,
    }

    impl From<&super::Q8Post<'_>> for RawQ8 {
        fn from(post: &super::Q8Post<'_>) -> Self {
            RawQ8 {
                bias: post.bias.as_ptr(),
                scale: post.scale.as_ptr(),
                zero: post.zero,
                lo: post.lo,
                hi: post.hi,
            }
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI; `a` gives `rows` (`1..=12`) rows of
    /// `4 · kq` bytes for each of `taps` taps; panel `k < panels` of `b` holds `taps ·
    /// kq · NR · 4` bytes from `b + k · stride`; `c` the tile `(i, j) -> c[i · rs + j]`,
    /// `i < rows`, `j < (panels - 1) · NR + cols` (`1 <= cols <= NR`); the post's bias
    /// and scale hold as many values. `q > 0` (1, 2, 4 or 8): interleaved panels of
    /// `q` groups, 16 columns and `taps · kq · 64` bytes each, panel `k` reading bytes
    /// `4 · q · kq · k..` of each row.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn vnni<A: RowPtrs<u8>>(
        (rows, taps, kq): (usize, usize, usize),
        q: usize,
        a: A,
        b: (*const i8, usize, usize, usize),
        c: *mut u8,
        rs: usize,
        post: RawQ8,
    ) {
        macro_rules! rows {
            ($q:literal: $($r:literal)*) => {
                match rows {
                    // SAFETY: forwarded contract, `rows` rows.
                    $($r => unsafe { tile::<$r, A, $q>(taps, kq, a, b, c, rs, post) },)*
                    // SAFETY: as above (rows is at most 12).
                    _ => unsafe { tile::<12, A, $q>(taps, kq, a, b, c, rs, post) },
                }
            };
        }
        match q {
            0 => rows!(0: 1 2 3 4 5 6 7 8 9 10 11),
            1 => rows!(1: 1 2 3 4 5 6 7 8 9 10 11),
            2 => rows!(2: 1 2 3 4 5 6 7 8 9 10 11),
            4 => rows!(4: 1 2 3 4 5 6 7 8 9 10 11),
            _ => rows!(8: 1 2 3 4 5 6 7 8 9 10 11),
        }
    }

    /// The `R`-row tile across the panels (of `Q` interleaved groups each when `Q >
    /// 0`).
    ///
    /// # Safety
    /// As [`vnni`]'s, with `R` rows and `q = Q`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile<const R: usize, A: RowPtrs<u8>, const Q: usize>(
        taps: usize,
        kq: usize,
        a: A,
        (b, stride, panels, cols): (*const i8, usize, usize, usize),
        c: *mut u8,
        rs: usize,
        post: RawQ8,
    ) {
        // Columns of a panel: two vectors, or one of interleaved groups.
        let nr = if Q == 0 { Q8_NR } else { super::Q8_LANES };
        for k in 0..panels {
            let n = if k + 1 < panels { nr } else { cols };
            // SAFETY: k < panels: panel k, its part of the rows, its columns of the tile
            // and of the post.
            unsafe {
                let post = RawQ8 {
                    bias: post.bias.add(k * nr),
                    scale: post.scale.add(k * nr),
                    ..post
                };
                // Interleaved panels read their own blocks of each row.
                let skip = 4 * Q * kq * k;
                let args = (taps, kq, a, b.add(k * stride), skip);
                let ck = c.add(k * nr);
                if Q > 0 || n <= 16 {
                    put::<R, 1, A, Q>(args, (ck, rs, n), post);
                } else {
                    put::<R, 2, A, 0>(args, (ck, rs, n - 16), post);
                }
            }
        }
    }

    /// `4 · Q` bytes at `p` repeated over a vector: one depth step of `Q` interleaved
    /// groups.
    ///
    /// # Safety
    /// AVX-512F; `4 · Q` bytes readable at `p`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn splat_quads<const Q: usize>(p: *const u8) -> __m512i {
        // SAFETY: the caller's contract; unaligned reads of exactly `4 · Q` bytes.
        unsafe {
            match Q {
                1 => _mm512_set1_epi32(p.cast::<i32>().read_unaligned()),
                2 => _mm512_set1_epi64(p.cast::<i64>().read_unaligned()),
                4 => _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())),
                _ => _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())),
            }
        }
    }

    /// One panel: the first `W` vectors of 16 columns of the `R`-row tile at `c`, of
    /// which the last has `last` columns, reading each row from byte `skip`; `Q > 0`:
    /// one interleaved panel of `Q` groups (`W` is 1), its sums put back in channel
    /// order before the store when `Q > 1`.
    ///
    /// # Safety
    /// As [`tile`]'s for one panel at `b`; `c` holds `16 · (W - 1) + last` bytes per
    /// row, and the post as many values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn put<const R: usize, const W: usize, A: RowPtrs<u8>, const Q: usize>(
        (taps, kq, a, b, skip): (usize, usize, A, *const i8, usize),
        (c, rs, last): (*mut u8, usize, usize),
        post: RawQ8,
    ) {
        let mask = |v: usize| -> __mmask16 {
            if v + 1 < W {
                u16::MAX
            } else {
                u16::try_from((1u32 << last.min(16)) - 1).unwrap_or(u16::MAX)
            }
        };
        // Bytes of a panel per depth group of four.
        let step = if Q == 0 { Q8_NR * 4 } else { 64 };
        // SAFETY: the first `16 · (W - 1) + last` columns of the post are readable;
        // masked lanes are not read.
        let bias: [__m512i; W] = std::array::from_fn(|v| unsafe {
            _mm512_maskz_loadu_epi32(mask(v), post.bias.add(16 * v))
        });
        // Interleaved: the bias in the accumulators' lane order, and the order back.
        let (to_lanes, to_channels) = if Q <= 1 {
            (_mm512_setzero_si512(), _mm512_setzero_si512())
        } else {
            // SAFETY: 16 indices read from local arrays.
            unsafe {
                (
                    _mm512_loadu_si512(
                        super::super::grouped::interleaved::<16>(Q, 16)
                            .as_ptr()
                            .cast(),
                    ),
                    _mm512_loadu_si512(super::super::grouped::lane_order::<16>(Q).as_ptr().cast()),
                )
            }
        };
        let bias = if Q <= 1 {
            bias
        } else {
            bias.map(|b| _mm512_permutexvar_epi32(to_lanes, b))
        };
        let mut acc = [bias; R];
        for t in 0..taps {
            // SAFETY: t < taps, i < R: rows the source holds.
            let rows: [*const u8; R] = std::array::from_fn(|i| unsafe { a.row(t, i, R).add(skip) });
            // SAFETY: inside the panel: tap t's groups start at t · kq · step.
            let bt = unsafe { b.add(t * kq * step) };
            for p in 0..kq {
                // SAFETY: p < kq: 4 · Q bytes inside each row, 64 · W inside the panel.
                unsafe {
                    let bp = bt.add(p * step);
                    let bv: [__m512i; W] =
                        std::array::from_fn(|v| _mm512_loadu_si512(bp.add(64 * v).cast()));
                    for (row, &ap) in acc.iter_mut().zip(&rows) {
                        let av = if Q == 0 {
                            splat_quads::<1>(ap.add(4 * p))
                        } else {
                            splat_quads::<Q>(ap.add(4 * Q * p))
                        };
                        for (x, &y) in row.iter_mut().zip(&bv) {
                            *x = _mm512_dpbusd_epi32(*x, av, y);
                        }
                    }
                }
            }
        }
        let (lo, hi) = (_mm512_set1_ps(post.lo), _mm512_set1_ps(post.hi));
        let zero = _mm512_set1_epi32(post.zero);
        // SAFETY: as for the bias.
        let scale: [__m512; W] = std::array::from_fn(|v| unsafe {
            _mm512_maskz_loadu_ps(mask(v), post.scale.add(16 * v))
        });
        for (i, row) in acc.iter().enumerate() {
            for (v, (&x, &s)) in row.iter().zip(&scale).enumerate() {
                let x = if Q <= 1 {
                    x
                } else {
                    _mm512_permutexvar_epi32(to_channels, x)
                };
                let f = _mm512_mul_ps(_mm512_cvtepi32_ps(x), s);
                let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), zero);
                // SAFETY: row i < R and the vector's first columns are inside the tile.
                unsafe {
                    _mm_mask_storeu_epi8(
                        c.add(i * rs + 16 * v).cast(),
                        mask(v),
                        _mm512_cvtepi32_epi8(q),
                    );
                }
            }
        }
    }

    /// # Safety
    /// As [`vnni`]'s, with AVX2 for the features, `q` = 0, rows of `8 · kq` bytes
    /// (16-bit values) and panels in pairs (the module docs).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2<A: RowPtrs<u8>>(
        (rows, taps, kq): (usize, usize, usize),
        a: A,
        (b, stride, panels, cols): (*const i8, usize, usize, usize),
        c: *mut u8,
        rs: usize,
        post: RawQ8,
    ) {
        for q in 0..panels {
            let n = if q + 1 < panels { Q8_NR } else { cols };
            for h in 0..n.div_ceil(16) {
                let width = (n - 16 * h).min(16);
                let mut i = 0;
                while i < rows {
                    // Up to six rows a call; seven to eleven as two near-equal calls
                    // (a call of one row multiplies at the latency of its sums).
                    let left = rows - i;
                    let r = if left > 6 { left.div_ceil(2) } else { left };
                    // SAFETY: rows i..i + r and columns 16h.. of panel q are inside the
                    // tile, its panel and its post (the contract).
                    unsafe {
                        let at = (a, b.add(q * stride + 32 * h), (i, rows));
                        let out = (c.add(i * rs + q * Q8_NR + 16 * h), rs, width);
                        let post = RawQ8 {
                            bias: post.bias.add(q * Q8_NR + 16 * h),
                            scale: post.scale.add(q * Q8_NR + 16 * h),
                            ..post
                        };
                        match r {
                            6 => avx2_put::<6, A>(taps, kq, at, out, post),
                            5 => avx2_put::<5, A>(taps, kq, at, out, post),
                            4 => avx2_put::<4, A>(taps, kq, at, out, post),
                            3 => avx2_put::<3, A>(taps, kq, at, out, post),
                            2 => avx2_put::<2, A>(taps, kq, at, out, post),
                            _ => avx2_put::<1, A>(taps, kq, at, out, post),
                        }
                    }
                    i += r;
                }
            }
        }
    }

    /// `R` rows from `i` × 16 columns of one panel's half at `b`: per pair of depth
    /// steps, the half's 16 columns widened to 16 bits (two vectors of eight
    /// columns), each row's pair broadcast and multiplied with them (`vpmaddwd`: the
    /// pair's two products added per column); `width` columns stored.
    ///
    /// # Safety
    /// As [`avx2`]'s for rows `i..i + R` and this half's columns; `c` holds `width`
    /// bytes per row, the post as many values.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn avx2_put<const R: usize, A: RowPtrs<u8>>(
        taps: usize,
        kq: usize,
        (a, b, (i, rows)): (A, *const i8, (usize, usize)),
        (c, rs, width): (*mut u8, usize, usize),
        post: RawQ8,
    ) {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for t in 0..taps {
            // SAFETY: t < taps, i + r < rows: rows the source holds.
            let row: [*const u8; R] = std::array::from_fn(|r| unsafe { a.row(t, i + r, rows) });
            // SAFETY: inside the panel: tap t's groups start at t · kq · NR · 4.
            let bt = unsafe { b.add(t * kq * Q8_NR * 4) };
            for p in 0..2 * kq {
                // SAFETY: p < 2 · kq: 32 bytes of this half of pair p, and four bytes
                // (one pair of 16-bit values) of each row.
                unsafe {
                    let bp = bt.add(p * Q8_NR * 2);
                    let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.cast()));
                    let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(16).cast()));
                    for (acc, &ap) in acc.iter_mut().zip(&row) {
                        let x = _mm256_set1_epi32(ap.add(4 * p).cast::<i32>().read_unaligned());
                        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(x, w0));
                        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(x, w1));
                    }
                }
            }
        }
        // A whole half's bias and scale loaded in place; a partial one's copied out
        // first.
        let (bias, scale) = if width == 16 {
            // SAFETY: the post holds `width` = 16 values.
            unsafe {
                (
                    [0, 8].map(|o| _mm256_loadu_si256(post.bias.add(o).cast())),
                    [0, 8].map(|o| _mm256_loadu_ps(post.scale.add(o))),
                )
            }
        } else {
            let mut bias = [0i32; 16];
            let mut scale = [0f32; 16];
            // SAFETY: the post holds `width` values.
            unsafe {
                std::ptr::copy_nonoverlapping(post.bias, bias.as_mut_ptr(), width.min(16));
                std::ptr::copy_nonoverlapping(post.scale, scale.as_mut_ptr(), width.min(16));
            }
            // SAFETY: eight values of each stack array from 0 and 8.
            unsafe {
                (
                    [0, 8].map(|o| _mm256_loadu_si256(bias.as_ptr().add(o).cast())),
                    [0, 8].map(|o| _mm256_loadu_ps(scale.as_ptr().add(o))),
                )
            }
        };
        let (lo, hi) = (_mm256_set1_ps(post.lo), _mm256_set1_ps(post.hi));
        let zero = _mm256_set1_epi32(post.zero);
        for (r, acc) in acc.iter().enumerate() {
            let mut q = [_mm256_setzero_si256(); 2];
            for (((q, &s), &b), &sc) in q.iter_mut().zip(acc).zip(&bias).zip(&scale) {
                let f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s, b)), sc);
                let f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
                *q = _mm256_add_epi32(_mm256_cvtps_epi32(f), zero);
            }
            // The low byte of each value, columns in order: the clamp keeps every
            // value in its type's range, so packing to 16 bits changes none, and the
            // mask keeps the byte a signed value stores (a vector store instead of
            // one byte at a time: mobilenet_v2's 8-bit program 0.91-0.95 of the time at
            // one thread, interleaved).
            let bytes = low_bytes(q[0], q[1]);
            // SAFETY: row r < R and columns 0..width: inside the tile.
            unsafe {
                let row = c.add(r * rs);
                if width == 16 {
                    _mm_storeu_si128(row.cast(), bytes);
                } else {
                    let mut part = [0u8; 16];
                    _mm_storeu_si128(part.as_mut_ptr().cast(), bytes);
                    std::ptr::copy_nonoverlapping(part.as_ptr(), row, width.min(16));
                }
            }
        }
    }

    /// `n` bytes from `src`, XORed with `flip`, widened to 16 bits at `dst`, 16 at a
    /// time, each block read before its 32 bytes are written (then the rest one by
    /// one, likewise).
    ///
    /// # Safety
    /// AVX2 is available; `src` holds `n` bytes and `dst` `2n`; they do not overlap,
    /// or `src` is `dst + n` (block `b` then writes up to `32b + 32 <= n + 16b + 16`,
    /// where the first byte not yet read is).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen(dst: *mut u8, src: *const u8, n: usize, flip: u8) {
        let f = _mm_set1_epi8(flip as i8);
        let blocks = n / 16;
        for b in 0..blocks {
            // SAFETY: bytes 16b..16b + 16 of the source, 32b..32b + 32 of the
            // destination: inside both (the contract), read before written.
            unsafe {
                let x = _mm_xor_si128(_mm_loadu_si128(src.add(16 * b).cast()), f);
                _mm256_storeu_si256(dst.add(32 * b).cast(), _mm256_cvtepu8_epi16(x));
            }
        }
        for i in 16 * blocks..n {
            // SAFETY: i < n; read before the pair is written.
            unsafe {
                let v = *src.add(i) ^ flip;
                *dst.add(2 * i) = v;
                *dst.add(2 * i + 1) = 0;
            }
        }
    }

    /// The low bytes of sixteen 32-bit values held as `packs` orders them: `q0`'s
    /// lanes 0-3 then `q1`'s 0-3, then `q0`'s 4-7 and `q1`'s 4-7; each value must
    /// lie in -32768..=32767.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn ordered_low_bytes(q0: __m256i, q1: __m256i) -> __m128i {
        let words = _mm256_and_si256(_mm256_packs_epi32(q0, q1), _mm256_set1_epi16(0xFF));
        _mm_packus_epi16(
            _mm256_castsi256_si128(words),
            _mm256_extracti128_si256::<1>(words),
        )
    }

    /// The low bytes of sixteen 32-bit values (eight in `q0`, then eight in `q1`), in
    /// order; each value must lie in -32768..=32767 (packing to 16 bits keeps it).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn low_bytes(q0: __m256i, q1: __m256i) -> __m128i {
        let words = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(q0, q1));
        let words = _mm256_and_si256(words, _mm256_set1_epi16(0xFF));
        _mm_packus_epi16(
            _mm256_castsi256_si128(words),
            _mm256_extracti128_si256::<1>(words),
        )
    }

    /// Where tap `t` of output pixel `ox` of a depthwise row reads: its row and input
    /// column, or None for padding, a row absent, and the filler past the K² taps that
    /// completes the last pair. `inside`: every tap of the pixel lies inside the row
    /// (the caller checked), so the column needs no check.
    #[inline(always)]
    fn tap_source<const K: usize>(
        rows: &[*const u8; K],
        ox: usize,
        t: usize,
        inside: bool,
        (w_in, stride, dilation, pad): (usize, usize, usize, usize),
    ) -> Option<(*const u8, usize)> {
        let row = rows
            .get(t / K)
            .copied()
            .filter(|r| t < K * K && !r.is_null())?;
        let ix = if inside {
            ox * stride + (t % K) * dilation - pad
        } else {
            super::input_column(ox, t % K, (w_in, stride, dilation, pad))?
        };
        Some((row, ix))
    }

    /// [`super::q8_depthwise_row`]'s AVX2 kernel, 16 channels at a time: the taps go
    /// in pairs, each pair's differences `x - za` and weights interleaved as 16-bit
    /// values, so that one `vpmaddwd` adds both taps' products per channel (where a
    /// tap at a time took two 32-bit multiplications, `vpmulld`, per 16 channels).
    /// Differences of 8-bit values and 8-bit zero points fit in 16 bits; so must the
    /// weights. Pixels whose every tap lies inside the row read their taps at fixed
    /// offsets, without a column's checks (which took two thirds of mobilenet_v2's
    /// 8-bit depthwise layers).
    ///
    /// A last block of fewer than 16 channels is the last 16 again (their outputs
    /// written twice, the same values): mobilenet_v3's 72, 120, 184 and 200 channels
    /// ran on the loop.
    ///
    /// # Safety
    /// AVX2 is available; `c` is at least 16; each non-null row holds `w_in · c`
    /// bytes, `w` `K² · c` values within ±32767, the post `c`, `y` `ow · c` bytes;
    /// `stride > 0`; `K` is at most 5; `S` is 0, or the stride with a dilation of 1.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn depthwise_row_avx2<const K: usize, const SIGNED: bool, const S: usize>(
        rows: [*const u8; K],
        w: *const i32,
        c: usize,
        post: RawQ8,
        za: i32,
        (w_in, stride, dilation, pad): (usize, usize, usize, usize),
        (y, ow): (*mut u8, usize),
    ) {
        // S > 0: the stride is S and the dilation 1 (the caller's match), as constants.
        let (stride, dilation) = if S > 0 { (S, 1) } else { (stride, dilation) };
        let taps = K * K;
        let pairs = taps.div_ceil(2);
        let zav = _mm256_set1_epi16(za as i16);
        let (lo, hi) = (_mm256_set1_ps(post.lo), _mm256_set1_ps(post.hi));
        let zero = _mm256_set1_epi32(post.zero);
        let geometry = (w_in, stride, dilation, pad);
        // Pixels whose K taps lie inside the row: ox·s ≥ pad and ox·s + (K-1)·d - pad
        // < w_in.
        let first = pad.div_ceil(stride);
        let interior_end = (w_in + pad)
            .checked_sub((K - 1) * dilation)
            .map_or(0, |v| v.div_ceil(stride))
            .min(ow);
        for c0 in (0..c).step_by(16) {
            let c0 = c0.min(c - 16);
            // Tap t's 16 weights from channel c0 as 16-bit values, in order.
            let weights = |t: usize| {
                if t >= taps {
                    return _mm256_setzero_si256();
                }
                // SAFETY: t < K², channels c0..c0 + 16 ≤ c.
                let (a, b) = unsafe {
                    let at = w.add(t * c + c0);
                    (
                        _mm256_loadu_si256(at.cast()),
                        _mm256_loadu_si256(at.add(8).cast()),
                    )
                };
                _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(a, b))
            };
            // Each pair's weights interleaved as `unpack` interleaves its differences
            // (13 pairs: a 5×5 window).
            let mut wp = [[_mm256_setzero_si256(); 2]; 13];
            for (p, wp) in wp.iter_mut().enumerate().take(pairs) {
                let (a, b) = (weights(2 * p), weights(2 * p + 1));
                *wp = [_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b)];
            }
            // SAFETY: channels c0..c0 + 16 ≤ c of the post.
            let (bias, scale) = unsafe {
                (
                    [0, 8].map(|o| _mm256_loadu_si256(post.bias.add(c0 + o).cast())),
                    [0, 8].map(|o| _mm256_loadu_ps(post.scale.add(c0 + o))),
                )
            };
            // In the sums' order: channels 0-3 and 8-11, then 4-7 and 12-15.
            let bias = [
                _mm256_permute2x128_si256::<0x20>(bias[0], bias[1]),
                _mm256_permute2x128_si256::<0x31>(bias[0], bias[1]),
            ];
            let scale = [
                _mm256_permute2f128_ps::<0x20>(scale[0], scale[1]),
                _mm256_permute2f128_ps::<0x31>(scale[0], scale[1]),
            ];
            // x - za of the 16 channels from c0 of pixel ix of a row.
            let load = |row: *const u8, ix: usize| {
                // SAFETY: the callers pass ix < w_in: the row's pixel ix, channels
                // c0.. below c.
                let xb = unsafe { _mm_loadu_si128(row.add(ix * c + c0).cast()) };
                let xv = if SIGNED {
                    _mm256_cvtepi8_epi16(xb)
                } else {
                    _mm256_cvtepu8_epi16(xb)
                };
                _mm256_sub_epi16(xv, zav)
            };
            // Tap t at pixel ox: checked, zero in the padding; or inside the row.
            let tap = |ox: usize, t: usize, inside: bool| {
                tap_source(&rows, ox, t, inside, geometry)
                    .map_or(_mm256_setzero_si256(), |(row, ix)| load(row, ix))
            };
            let checked = |ox: usize, t: usize| tap(ox, t, false);
            let inside = |ox: usize, t: usize| tap(ox, t, true);
            let put = |ox: usize, diff: &dyn Fn(usize, usize) -> __m256i| {
                let (mut acc_lo, mut acc_hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for (p, [wl, wh]) in wp.iter().enumerate().take(pairs) {
                    let (a, b) = (diff(ox, 2 * p), diff(ox, 2 * p + 1));
                    acc_lo = _mm256_add_epi32(
                        acc_lo,
                        _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), *wl),
                    );
                    acc_hi = _mm256_add_epi32(
                        acc_hi,
                        _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), *wh),
                    );
                }
                // Channels 0-3 and 8-11 are in acc_lo, 4-7 and 12-15 in acc_hi: packed
                // to 16 bits together, they are in order.
                let mut q = [_mm256_setzero_si256(); 2];
                for (((q, s), b), sc) in q.iter_mut().zip([acc_lo, acc_hi]).zip(bias).zip(scale) {
                    let f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s, b)), sc);
                    let f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
                    *q = _mm256_add_epi32(_mm256_cvtps_epi32(f), zero);
                }
                let [q0, q1] = q;
                // SAFETY: ox < ow: the pixel's channels c0..c0 + 16, inside `y`.
                unsafe { _mm_storeu_si128(y.add(ox * c + c0).cast(), ordered_low_bytes(q0, q1)) };
            };
            for ox in 0..ow {
                if (first..interior_end).contains(&ox) {
                    put(ox, &inside);
                } else {
                    put(ox, &checked);
                }
            }
        }
    }

    /// [`super::q8_depthwise_row`]'s AVX-512 kernel, 32 channels at a time (the last
    /// block masked): as the AVX2 kernel, the taps go in pairs, each pair's
    /// differences `x - za` and weights interleaved as 16-bit values, and one
    /// `vpdpwssd` adds both taps' products per channel to the sum. Where a tap at a time
    /// widened its bytes to 32 bits and multiplied them by `vpmulld` (two micro-ops on
    /// one port) for 16 channels, mobilenet_v2's 8-bit depthwise layers took 42% of its
    /// time.
    ///
    /// # Safety
    /// AVX-512 F, BW, VL and VNNI are available; each non-null row holds `w_in · c`
    /// bytes, `w` `K² · c` values within ±32767, the post `c`, `y` `ow · c` bytes;
    /// `stride > 0`; `K` is at most 5; `S` is 0, or the stride with a dilation of 1.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn depthwise_row<const K: usize, const SIGNED: bool, const S: usize>(
        rows: [*const u8; K],
        w: *const i32,
        c: usize,
        post: RawQ8,
        za: i32,
        (w_in, stride, dilation, pad): (usize, usize, usize, usize),
        (y, ow): (*mut u8, usize),
    ) {
        // S > 0: the stride is S and the dilation 1 (the caller's match), as constants.
        let (stride, dilation) = if S > 0 { (S, 1) } else { (stride, dilation) };
        let taps = K * K;
        let pairs = taps.div_ceil(2);
        let zav = _mm512_set1_epi16(za as i16);
        let (lo, hi) = (_mm512_set1_ps(post.lo), _mm512_set1_ps(post.hi));
        let zero = _mm512_set1_epi32(post.zero);
        // Unpacking 16-bit values interleaves within 128-bit lanes: the sums of the
        // low halves hold channels 0-3, 8-11, 16-19 and 24-27 of the block, those of
        // the high halves 4-7, 12-15, 20-23 and 28-31.
        let order = [
            _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
            _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31),
        ];
        let geometry = (w_in, stride, dilation, pad);
        // Pixels whose K taps lie inside the row: ox·s ≥ pad and ox·s + (K-1)·d - pad
        // < w_in.
        let first = pad.div_ceil(stride);
        let interior_end = (w_in + pad)
            .checked_sub((K - 1) * dilation)
            .map_or(0, |v| v.div_ceil(stride))
            .min(ow);
        for c0 in (0..c).step_by(32) {
            let n = (c - c0).min(32);
            let m = u32::MAX >> (32 - n);
            // The block's two halves of 16 channels.
            let halves = (m as u16, (m >> 16) as u16);
            // 32 values of 32 bits from `p` (channel c0), the lanes past `n` zero.
            // SAFETY (the callers): `p` holds the block's `n` values; masked lanes
            // are not read.
            let load32 = |p: *const i32| unsafe {
                [(halves.0, 0), (halves.1, 16)]
                    .map(|(h, o)| _mm512_maskz_loadu_epi32(h, p.wrapping_add(o).cast()))
            };
            // Tap t's 32 weights as 16-bit values, in order.
            let weights = |t: usize| {
                if t >= taps {
                    return _mm512_setzero_si512();
                }
                // SAFETY: t < K², channels c0..c0 + n ≤ c.
                let [a, b] = load32(unsafe { w.add(t * c + c0) });
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm512_cvtepi32_epi16(a)),
                    _mm512_cvtepi32_epi16(b),
                )
            };
            let mut wp = [[_mm512_setzero_si512(); 2]; 13];
            for (p, wp) in wp.iter_mut().enumerate().take(pairs) {
                let (a, b) = (weights(2 * p), weights(2 * p + 1));
                *wp = [_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b)];
            }
            // SAFETY: channels c0..c0 + n ≤ c of the post.
            let ([b0, b1], [s0, s1]) = unsafe {
                (
                    load32(post.bias.add(c0)),
                    load32(post.scale.add(c0).cast()).map(|v| _mm512_castsi512_ps(v)),
                )
            };
            let bias = order.map(|i| _mm512_permutex2var_epi32(b0, i, b1));
            let scale = order.map(|i| _mm512_permutex2var_ps(s0, i, s1));
            // x - za of the block's channels of pixel ix of a row.
            let load = |row: *const u8, ix: usize| {
                // SAFETY: the callers pass ix < w_in: the row's pixel ix, channels
                // c0..c0 + n; masked lanes are not read.
                let xb = unsafe { _mm256_maskz_loadu_epi8(m, row.add(ix * c + c0).cast()) };
                let xv = if SIGNED {
                    _mm512_cvtepi8_epi16(xb)
                } else {
                    _mm512_cvtepu8_epi16(xb)
                };
                _mm512_sub_epi16(xv, zav)
            };
            // Tap t at pixel ox: checked, zero in the padding; or inside the row.
            let tap = |ox: usize, t: usize, inside: bool| {
                tap_source(&rows, ox, t, inside, geometry)
                    .map_or(_mm512_setzero_si512(), |(row, ix)| load(row, ix))
            };
            let checked = |ox: usize, t: usize| tap(ox, t, false);
            let inside = |ox: usize, t: usize| tap(ox, t, true);
            // The sums of pixel ox, its taps read by `diff`.
            let sums = |ox: usize, diff: &dyn Fn(usize, usize) -> __m512i| {
                let [mut acc_lo, mut acc_hi] = bias;
                for (p, [wl, wh]) in wp.iter().enumerate().take(pairs) {
                    let (a, b) = (diff(ox, 2 * p), diff(ox, 2 * p + 1));
                    acc_lo = _mm512_dpwssd_epi32(acc_lo, _mm512_unpacklo_epi16(a, b), *wl);
                    acc_hi = _mm512_dpwssd_epi32(acc_hi, _mm512_unpackhi_epi16(a, b), *wh);
                }
                [acc_lo, acc_hi]
            };
            let put = |ox: usize, [acc_lo, acc_hi]: [__m512i; 2]| {
                let requantize = |s: __m512i, sc: __m512| {
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), sc);
                    let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                    _mm512_add_epi32(_mm512_cvtps_epi32(f), zero)
                };
                let (q0, q1) = (requantize(acc_lo, scale[0]), requantize(acc_hi, scale[1]));
                // Packed to 16 bits together (lane by lane), the halves' channels are
                // in order; the clamp keeps every value a byte.
                let bytes = _mm512_cvtepi16_epi8(_mm512_packs_epi32(q0, q1));
                // SAFETY: ox < ow: the pixel's channels c0..c0 + n, inside `y`.
                unsafe { _mm256_mask_storeu_epi8(y.add(ox * c + c0).cast(), m, bytes) };
            };
            // Two pixels inside the row at a time: their sums are independent chains.
            let mut ox = 0;
            while ox < ow {
                if ox >= first && ox + 2 <= interior_end {
                    let (a, b) = (sums(ox, &inside), sums(ox + 1, &inside));
                    put(ox, a);
                    put(ox + 1, b);
                    ox += 2;
                } else {
                    put(ox, sums(ox, &checked));
                    ox += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_gives_each_byte_as_a_16_bit_value() {
        for n in [0, 1, 15, 16, 17, 47, 100] {
            let src: Vec<u8> = (0..n).map(|i| (i * 37 + 5) as u8).collect();
            let want: Vec<u8> = src.iter().flat_map(|&v| [v ^ 0x80, 0]).collect();
            let mut dst = vec![0xAA; 2 * n + 3];
            widen_bytes(&mut dst, &src, 0x80);
            assert_eq!(dst[..2 * n], want[..], "{n} bytes");
            assert!(dst[2 * n..].iter().all(|&v| v == 0xAA), "{n} bytes");
            let mut d = vec![0xAA; 2 * n];
            d[n..].copy_from_slice(&src);
            widen_upper_half(&mut d);
            let plain: Vec<u8> = src.iter().flat_map(|&v| [v, 0]).collect();
            assert_eq!(d, plain, "{n} bytes in place");
        }
    }
}
