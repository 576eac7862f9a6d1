//! Instruction sets, the GEMM micro-kernels per instruction set, and the one place of
//! the crate where SIMD intrinsics and `unsafe` pointer arithmetic live.
//!
//! Everything here is reached through safe functions that check slice lengths before
//! entering an `unsafe` block. [`Isa::best`] picks the widest instruction set the CPU
//! supports at run time; tests run every [`Isa::available`] one against the portable
//! code.
//!
//! Two kinds of fast code live here:
//! - hand-written micro-kernels (`microkernel`): a register tile of `mr × nr` outputs
//!   accumulated over `kc` steps from packed panels of A and B;
//! - `multiversion!`: plain Rust loop bodies compiled once per instruction set (with
//!   `#[target_feature]`), so that LLVM vectorizes them with 256- or 512-bit registers
//!   and fused multiply-adds, and called through a run-time dispatch on [`Isa`];
//! - kernels generic over `Lanes` (`lanes.rs`), for arithmetic in registers that LLVM
//!   does not vectorize from plain loops.

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod generic;
mod grouped;
mod indirect;
mod lanes;
mod q8;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
pub(crate) use lanes::Avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use lanes::Wide;
pub(crate) use lanes::{Lanes, Scalar};

pub(crate) use grouped::{
    grouped_interleaves, grouped_microkernel, interleave_quads, interleave_vectors, GroupedOut,
    GroupedRows, GROUPED_MR,
};
pub(crate) use indirect::{
    depthwise_pixels, even_tiles, indirect_microkernel, IndirectRows, PanelRun, PixelTaps,
    MAX_ROW_TAPS as Q8_MAX_TAPS, MAX_TAPS as INDIRECT_TAPS,
};
pub use q8::Q8Kernel;
pub(crate) use q8::{
    input_column, q8_depthwise_row, q8_lane, q8_microkernel, widen_bytes, widen_upper_half,
    Q8DwRow, Q8Panels, Q8Post, Q8_INTERLEAVES, Q8_LANES, Q8_MR, Q8_NR,
};
pub use q8::{requantize, round_small};

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};
use crate::mat::MatMut;

/// Bit `isa as u8` set for each instruction set this CPU runs, and [`DETECTED`]; zero
/// until the first call.
static AVAILABLE: AtomicU8 = AtomicU8::new(0);
/// Marks [`AVAILABLE`] as filled in.
const DETECTED: u8 = 1 << 7;

/// The mask of [`AVAILABLE`] instruction sets, detecting them on the first call.
#[inline]
fn detected() -> u8 {
    let mask = AVAILABLE.load(Ordering::Relaxed);
    if mask != 0 {
        return mask;
    }
    let mask = Isa::ALL
        .into_iter()
        .filter(|isa| isa.detect())
        .fold(DETECTED, |m, isa| m | 1 << isa as u8);
    AVAILABLE.store(mask, Ordering::Relaxed);
    mask
}

/// An instruction set with its own micro-kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, vectorized by the compiler for the build's baseline target.
    Generic,
    /// x86-64 with AVX2 and FMA (256-bit vectors).
    Avx2,
    /// x86-64 with AVX-512F (512-bit vectors), AVX2 and FMA.
    Avx512,
    /// AArch64 with NEON (128-bit vectors); compiled and type-checked, not run here.
    Neon,
}

impl Isa {
    /// Every instruction set, narrowest first.
    pub const ALL: [Isa; 4] = [Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// Whether this CPU can run the instruction set. Kernels ask before every call
    /// (an 8 × 8 transpose, a depthwise row), so the answer is one load of a cached
    /// mask: the standard library's detection, three calls for AVX-512, took 4-6% of
    /// a depthwise layer's time.
    #[inline]
    pub fn is_available(self) -> bool {
        detected() & (1 << self as u8) != 0
    }

    /// Whether this CPU can run the instruction set, asked of the standard library.
    fn detect(self) -> bool {
        match self {
            Isa::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Isa::Avx2.detect() && std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The widest instruction set this CPU supports (detected once, then cached).
    pub fn best() -> Isa {
        Self::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Generic)
    }

    /// The instruction sets this CPU supports, narrowest first.
    pub fn available() -> impl Iterator<Item = Isa> {
        Self::ALL.into_iter().filter(|isa| isa.is_available())
    }

    /// `Ok(self)` if available, else [`Error::IsaUnavailable`].
    pub fn check(self) -> Result<Isa> {
        if self.is_available() {
            Ok(self)
        } else {
            Err(Error::IsaUnavailable(self.name()))
        }
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512f",
            Isa::Neon => "neon",
        }
    }

    /// The register tile `(mr, nr)` of this instruction set's GEMM micro-kernel.
    pub fn gemm_tile(self) -> (usize, usize) {
        match self {
            Isa::Generic => (generic::MR, generic::NR),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => (x86::AVX2_MR, x86::AVX2_NR),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => (x86::AVX512_MR, x86::AVX512_NR),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => (aarch64::MR, aarch64::NR),
            #[allow(unreachable_patterns)]
            _ => (generic::MR, generic::NR),
        }
    }

    /// The f32 lanes of one vector register (for choosing block sizes).
    pub fn lanes(self) -> usize {
        match self {
            Isa::Generic | Isa::Neon => 4,
            Isa::Avx2 => 8,
            Isa::Avx512 => 16,
        }
    }
}

/// Bias and clamp a micro-kernel applies to a tile as it stores it (after the last
/// depth block): `C = clamp(C + bias, min, max)`, NaN passing through the clamp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Post<'a> {
    pub bias: TileBias<'a>,
    pub min: f32,
    pub max: f32,
}

/// The bias of a tile: one value per row (at least `rows`) or per column (at least
/// `nr`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum TileBias<'a> {
    None,
    Rows(&'a [f32]),
    Cols(&'a [f32]),
}

/// [`Post`] as the kernels read it.
#[derive(Clone, Copy)]
pub(crate) struct RawPost {
    /// Whether to apply it at all.
    pub on: bool,
    /// Bias per row, or null.
    pub rows: *const f32,
    /// Bias per column, or null.
    pub cols: *const f32,
    pub min: f32,
    pub max: f32,
}

/// One call of a GEMM micro-kernel on the tile of `c` at `(i, j)` of `rows × nr`
/// elements (`rows <= mr`): `C (+)= Σ_p a[p * mr + r] · b[p * nr + s]` over `p < kc`
/// (`+=` when `accumulate`), then `post` if given.
///
/// Checks every length first: `a` must hold `kc * mr` values, `b` `kc * nr`, the tile
/// must lie inside `c` with contiguous columns. The instruction set must be available
/// (the GEMM driver only passes one from [`Isa::check`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn microkernel(
    isa: Isa,
    rows: usize,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut MatMut<'_>,
    (i, j): (usize, usize),
    accumulate: bool,
    post: Option<&Post<'_>>,
) -> Result {
    let (mr, nr) = isa.gemm_tile();
    let tile = c.tile_ptr(i, j, rows, nr);
    let raw = raw_post(post, rows, nr);
    let ok = rows <= mr
        && raw.is_some()
        && kc.checked_mul(mr).is_some_and(|l| a.len() >= l)
        && kc.checked_mul(nr).is_some_and(|l| b.len() >= l);
    let Some((c, rs)) = tile.filter(|_| ok && isa.is_available()) else {
        return Err(Error::InvalidParameter {
            what: format!(
                "micro-kernel call: {rows} rows (mr {mr}) at ({i}, {j}) of a {}x{} output, kc {kc}, a {}, b {}",
                c.rows(),
                c.cols(),
                a.len(),
                b.len(),
            ),
        });
    };
    let (a, b) = (a.as_ptr(), b.as_ptr());
    let Some(post) = raw else {
        return Ok(());
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: lengths and the tile checked above; the instruction set is available.
        Isa::Avx2 => unsafe { x86::avx2_kernel(rows, kc, a, b, c, rs, accumulate, post) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 => unsafe { x86::avx512_kernel(rows, kc, a, b, c, rs, accumulate, post) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Isa::Neon => unsafe { aarch64::kernel(rows, kc, a, b, c, rs, accumulate, post) },
        // SAFETY: as above.
        _ => unsafe { generic::kernel(rows, kc, a, b, c, rs, accumulate, post) },
    }
    Ok(())
}

/// [`Post`] as the kernels read it, or None when a bias is too short for the tile.
fn raw_post(post: Option<&Post<'_>>, rows: usize, nr: usize) -> Option<RawPost> {
    match post {
        None => Some(RawPost {
            on: false,
            rows: std::ptr::null(),
            cols: std::ptr::null(),
            min: 0.0,
            max: 0.0,
        }),
        Some(p) => {
            let (r, cl) = match p.bias {
                TileBias::None => (Some(std::ptr::null()), Some(std::ptr::null())),
                TileBias::Rows(v) => (
                    (v.len() >= rows).then_some(v.as_ptr()),
                    Some(std::ptr::null()),
                ),
                TileBias::Cols(v) => (
                    Some(std::ptr::null()),
                    (v.len() >= nr).then_some(v.as_ptr()),
                ),
            };
            r.zip(cl).map(|(rows, cols)| RawPost {
                on: true,
                rows,
                cols,
                min: p.min,
                max: p.max,
            })
        }
    }
}

/// Depthwise K×K convolution (K = 3 or 5) of one NHWC output row of `c >= 8` channels
/// on a hand-written kernel; `rows[ky]` is the input row of kernel row `ky` (`None` in
/// the padding), `weights` is `[K·K][c]`, the output is clamped to `[min, max]`. False
/// when this CPU or this K has no such kernel, there are fewer than 8 channels or a
/// length is off (nothing is written then).
#[allow(clippy::too_many_arguments)] // one row's geometry and data
pub(crate) fn depthwise_row<const K: usize>(
    isa: Isa,
    rows: [Option<&[f32]>; K],
    weights: &[f32],
    bias: &[f32],
    y: &mut [f32],
    geometry: (usize, usize, usize, usize, usize, usize),
    (min, max): (f32, f32),
) -> bool {
    let (c, ow, w_in, stride, dilation, pad) = geometry;
    let row_len = w_in.checked_mul(c);
    let ok = matches!(K, 3 | 5)
        && c >= 8
        && matches!(isa, Isa::Avx2 | Isa::Avx512)
        && isa.is_available()
        && stride > 0
        && row_len.is_some_and(|n| rows.iter().flatten().all(|r| r.len() >= n))
        && c.checked_mul(K * K).is_some_and(|n| weights.len() >= n)
        && bias.len() >= c
        && ow.checked_mul(c).is_some_and(|n| y.len() >= n);
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let ptr = |r: Option<&[f32]>| r.map_or(std::ptr::null(), <[f32]>::as_ptr);
        let g = x86::DwRow {
            c,
            ow,
            w_in,
            stride,
            dilation,
            pad,
            min,
            max,
        };
        let (rows, w, b, y) = (
            rows.map(ptr),
            weights.as_ptr(),
            bias.as_ptr(),
            y.as_mut_ptr(),
        );
        // Blocks of 16 channels (on AVX-512 one vector, on AVX2 two), the rest (8 or
        // none) one AVX2 vector at a time. AVX-512: 0.66-0.95 of the AVX2 kernel's time
        // on mobilenet_v2's and mnasnet's layers, timed in one process, interleaved.
        let wide = c / 16 * 16;
        let narrow = c / 8 * 8;
        // SAFETY: the instruction sets are available (Avx512 implies AVX2 and FMA), each
        // channel range spans a multiple of its lanes and ends within c (the last,
        // `c - 8..c`, starts at 0 or later since c >= 8), and every length the kernels
        // rely on was checked above.
        unsafe {
            if wide > 0 && isa == Isa::Avx512 {
                x86::dw512::depthwise_row::<K>(rows, w, b, y, g, (0, wide));
            } else if wide > 0 {
                x86::dw256x2::depthwise_row::<K>(rows, w, b, y, g, (0, wide));
            }
            x86::dw256::depthwise_row::<K>(rows, w, b, y, g, (wide, narrow));
            // Channels past the last whole block of eight: the last eight channels
            // again, overlapping channels already written with the same values.
            // Channel by channel they took twice the vector blocks' time (58
            // channels at 28 × 28: 0.039 ms, 56 channels 0.013).
            if narrow < c {
                x86::dw256::depthwise_row::<K>(rows, w, b, y, g, (c - 8, c));
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, weights, bias, y, stride, dilation, pad, min, max);
        false
    }
}

/// Input rows [`depthwise_plane_rows`] takes at most.
pub(crate) const DW_PLANE_ROWS: usize = 10;

/// Output rows `oy0..oy0 + R` (`R = out.len() / ow`, 1 to 4) of one NCHW plane of a
/// depthwise K×K convolution (K = 3, 5 or 7), stride and dilation 1, on AVX-512:
/// `rows[j]` is the input row that kernel row `j - r` reads for output row `r`, padded
/// left and right (`None` in the padding above and below), each at least `ow + K - 1`
/// values; `weights` holds the plane's `K · K` taps; outputs start at `bias`. False when
/// this CPU has no such kernel or a length is off (nothing is written then).
pub(crate) fn depthwise_plane_rows<const K: usize>(
    isa: Isa,
    rows: &[Option<&[f32]>],
    weights: &[f32],
    bias: f32,
    out: &mut [f32],
    ow: usize,
) -> bool {
    let r = out.len() / ow.max(1);
    let len = rows
        .iter()
        .flatten()
        .map(|v| v.len())
        .min()
        .unwrap_or(usize::MAX);
    let ok = matches!(K, 3 | 5 | 7)
        && isa == Isa::Avx512
        && isa.is_available()
        && ow > 0
        && (1..=4).contains(&r)
        && out.len() == r * ow
        && rows.len() == r + K - 1
        && len >= ow + K - 1
        && weights.len() >= K * K;
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut ptrs = [std::ptr::null(); DW_PLANE_ROWS];
        for (p, row) in ptrs.iter_mut().zip(rows) {
            *p = row.map_or(std::ptr::null(), <[f32]>::as_ptr);
        }
        let (w, y) = (weights.as_ptr(), out.as_mut_ptr());
        // SAFETY: AVX-512F is available; K <= 7 and r <= 4 give r + K - 1 <= 10 rows,
        // each non-null one `len >= ow + K - 1` long; the weights and `out` hold what
        // the kernel reads and writes (checked above).
        unsafe {
            match r {
                1 => x86::dw_plane::rows::<K, 1>(&ptrs, len, w, bias, y, ow),
                2 => x86::dw_plane::rows::<K, 2>(&ptrs, len, w, bias, y, ow),
                3 => x86::dw_plane::rows::<K, 3>(&ptrs, len, w, bias, y, ow),
                _ => x86::dw_plane::rows::<K, 4>(&ptrs, len, w, bias, y, ow),
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, weights, bias, out);
        false
    }
}

/// Whether [`transpose32`] has a kernel for `isa` on this CPU.
pub(crate) fn has_transpose32(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx2 | Isa::Avx512) && isa.is_available()
}

/// `dst[j·ds + i] = src[i·ss + j]` for `i < rows`, `j < cols` (32-bit values, bits
/// unchanged) on register transposes. False when this CPU has no such kernel or a
/// length is off (nothing is written then).
pub(crate) fn transpose32(
    isa: Isa,
    (src, ss): (&[u32], usize),
    (dst, ds): (&mut [u32], usize),
    rows: usize,
    cols: usize,
) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    // The last row of a block of `lines` lines of `len` values, `stride` apart, ends
    // inside `have`.
    let fits = |have: usize, lines: usize, len: usize, stride: usize| {
        (lines - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(len))
            .is_some_and(|n| have >= n)
    };
    let ok =
        has_transpose32(isa) && fits(src.len(), rows, cols, ss) && fits(dst.len(), cols, rows, ds);
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is available and both blocks lie inside their slices (checked).
        unsafe {
            x86::transpose32(
                src.as_ptr().cast(),
                ss,
                dst.as_mut_ptr().cast(),
                ds,
                rows,
                cols,
            )
        };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src, ss, dst, ds);
        false
    }
}

/// `dst[j·ds + i] = src[i·ss + j]` for `i, j < 16` (bytes) on a register transpose.
/// False when this CPU has no such kernel or a length is off (nothing is written then).
pub(crate) fn transpose16x16_bytes(src: &[u8], ss: usize, dst: &mut [u8], ds: usize) -> bool {
    let fits = |len: usize, stride: usize| {
        stride
            .checked_mul(15)
            .and_then(|v| v.checked_add(16))
            .is_some_and(|n| len >= n)
    };
    if !(fits(src.len(), ss) && fits(dst.len(), ds)) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of x86_64; both blocks lie inside their slices (checked).
        unsafe { x86::transpose16x16_bytes(src.as_ptr(), ss, dst.as_mut_ptr(), ds) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src, ss, dst, ds);
        false
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args...) -> $ret` that runs the body compiled
/// for `isa`'s instruction set. Inside the body, `$fma` is a `const bool` telling
/// whether fused multiply-add is fast (use [`crate::arch::madd`]).
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<const $fma:ident: bool>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(isa: $crate::arch::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body<const $fma: bool>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx2($($arg: $ty),*) $(-> $ret)? { body::<true>($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx512($($arg: $ty),*) $(-> $ret)? { body::<true>($($arg),*) }
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the features are present (checked at run time here).
                $crate::arch::Isa::Avx512 if $crate::arch::Isa::Avx512.is_available() => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                $crate::arch::Isa::Avx2 | $crate::arch::Isa::Avx512 if $crate::arch::Isa::Avx2.is_available() => unsafe { avx2($($arg),*) },
                // NEON is part of the AArch64 baseline, so the generic build uses it.
                #[cfg(target_arch = "aarch64")]
                $crate::arch::Isa::Neon => body::<true>($($arg),*),
                _ => body::<false>($($arg),*),
            }
        }
    };
}
pub(crate) use multiversion;

/// `a * b + c`, fused when `FMA` (then one rounding, and a single instruction in a
/// function compiled with FMA enabled); two roundings otherwise, which keeps the
/// portable build off the slow software `fmaf`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_kernel_matches_the_reference() {
        for isa in Isa::available() {
            let (mr, nr) = isa.gemm_tile();
            let kc = 37;
            let a: Vec<f32> = (0..kc * mr).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..kc * nr).map(|i| (i % 5) as f32 * 0.5).collect();
            for rows in 1..=mr {
                for accumulate in [false, true] {
                    let rs = nr + 3;
                    let mut c = vec![1.0f32; (rows + 1) * rs];
                    let mut view = MatMut::new(&mut c, rows + 1, nr + 1, rs, 1).unwrap();
                    microkernel(isa, rows, kc, &a, &b, &mut view, (1, 1), accumulate, None)
                        .unwrap();
                    let c = &c[rs + 1..];
                    for i in 0..rows {
                        for j in 0..nr {
                            let want: f32 = (0..kc).map(|p| a[p * mr + i] * b[p * nr + j]).sum();
                            let want = want + if accumulate { 1.0 } else { 0.0 };
                            assert_eq!(c[i * rs + j], want, "{isa:?} rows {rows}");
                        }
                        assert!(c[i * rs + nr..(i + 1) * rs - 1].iter().all(|&v| v == 1.0));
                    }
                }
                // Bias per row or column, then a clamp.
                let bias: Vec<f32> = (0..nr.max(mr)).map(|x| x as f32 - 3.0).collect();
                for by_row in [false, true] {
                    let post = Post {
                        bias: if by_row {
                            TileBias::Rows(&bias)
                        } else {
                            TileBias::Cols(&bias)
                        },
                        min: -20.0,
                        max: 20.0,
                    };
                    let mut c = vec![f32::NAN; rows * nr];
                    let mut view = MatMut::row_major(&mut c, rows, nr).unwrap();
                    microkernel(isa, rows, kc, &a, &b, &mut view, (0, 0), false, Some(&post))
                        .unwrap();
                    for i in 0..rows {
                        for j in 0..nr {
                            let dot: f32 = (0..kc).map(|p| a[p * mr + i] * b[p * nr + j]).sum();
                            let want = (dot + bias[if by_row { i } else { j }]).clamp(-20.0, 20.0);
                            assert_eq!(c[i * nr + j], want, "{isa:?} rows {rows} by_row {by_row}");
                        }
                    }
                }
            }
            let mut c = vec![0.0; 2 * nr];
            let mut view = MatMut::row_major(&mut c, 2, nr).unwrap();
            assert!(microkernel(isa, 3, kc, &a, &b, &mut view, (0, 0), false, None).is_err());
            assert!(microkernel(isa, 2, kc, &a, &b, &mut view, (0, 1), false, None).is_err());
            assert!(microkernel(isa, 1, kc, &a[1..], &b, &mut view, (0, 0), false, None).is_err());
            let short = Post {
                bias: TileBias::Cols(&b[..nr - 1]),
                min: 0.0,
                max: 1.0,
            };
            assert!(
                microkernel(isa, 1, kc, &a, &b, &mut view, (0, 0), false, Some(&short)).is_err()
            );
        }
    }
}
