//! The micro-kernel of grouped convolutions with few output channels per group
//! (regnet's are 8 wide): a product per group would fill 8 of the 32 columns of the
//! regular register tile. Here one vector holds the outputs of `q = lanes / cog`
//! groups, interleaved (lane `o · q + g` is output `o` of group `g`), and the input is
//! copied with the same interleave (channel `i` of the `q` groups side by side), so
//! that each depth step broadcasts `q` adjacent input values as one pattern and every
//! lane does useful work. A tile puts its accumulators back in channel order once,
//! before its store. The 8-bit VNNI kernel (`q8.rs`) interleaves the same way, four
//! bytes at a time; its input copy and lane orders are here.

use super::Isa;
use crate::error::{Error, Result};

/// Output pixels per tile.
pub(crate) const GROUPED_MR: usize = 12;

/// The input rows of one tile: pixel `i`'s tap `t` starts at `a[pixels[i] + taps[t]]`
/// and holds `kc` depth steps of `q` interleaved values.
#[derive(Clone, Copy)]
pub(crate) struct GroupedRows<'a> {
    pub a: &'a [f32],
    pub pixels: &'a [usize],
    pub taps: &'a [usize],
    pub kc: usize,
}

/// The output of one tile: `rows` pixels of `cols` channels (at most a vector: a last
/// block of fewer groups stores fewer), row `i` at `c[i · rs..]`, with the bias of
/// those channels and a clamp; `accumulate` adds the values already there (a
/// residual) before the bias.
// Only the x86 kernels read the epilogue (other architectures have none).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct GroupedOut<'a> {
    pub c: &'a mut [f32],
    pub cols: usize,
    pub rs: usize,
    pub bias: &'a [f32],
    pub clamp: (f32, f32),
    pub accumulate: bool,
}

/// The interleave factors the kernels of `isa` take: `q` groups per vector.
pub(crate) fn grouped_interleaves(isa: Isa) -> &'static [usize] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => &[1, 2, 4, 8],
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => &[1, 2, 4],
        _ => &[],
    }
}

/// One tile of a grouped product: for each pixel `i` and lane `l` of the block,
/// `out[i][ch(l)] (+)= Σ_t Σ_p a[pixels[i] + taps[t] + p·q + l % q] · w[(t·kc + p)·lanes + l]`,
/// `ch(l) = (l % q) · lanes / q + l / q`, then bias and clamp. Every length is checked
/// first.
pub(crate) fn grouped_microkernel(
    isa: Isa,
    q: usize,
    rows: &GroupedRows<'_>,
    w: &[f32],
    out: GroupedOut<'_>,
) -> Result {
    let lanes = isa.lanes();
    let n = rows.pixels.len();
    let reach = (|| {
        rows.pixels
            .iter()
            .max()?
            .checked_add(*rows.taps.iter().max()?)?
            .checked_add(rows.kc.checked_mul(q)?)
    })();
    let w_len = rows
        .taps
        .len()
        .checked_mul(rows.kc)
        .and_then(|v| v.checked_mul(lanes));
    let c_len = n
        .checked_sub(1)
        .and_then(|r| r.checked_mul(out.rs))
        .and_then(|v| v.checked_add(out.cols));
    let ok = (1..=GROUPED_MR).contains(&n)
        && grouped_interleaves(isa).contains(&q)
        && isa.is_available()
        && (1..=lanes).contains(&out.cols)
        && out.rs >= out.cols
        && reach.is_some_and(|r| r <= rows.a.len())
        && w_len.is_some_and(|l| l <= w.len())
        && c_len.is_some_and(|l| l <= out.c.len())
        && out.bias.len() >= out.cols;
    if !ok {
        return Err(Error::InvalidParameter {
            what: format!(
                "grouped micro-kernel call: {n} pixels, {} taps of depth {} x {q}, {} weights, {} outputs at stride {}",
                rows.taps.len(),
                rows.kc,
                w.len(),
                out.c.len(),
                out.rs
            ),
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let call = x86::Call {
            a: rows.a.as_ptr(),
            pixels: rows.pixels.as_ptr(),
            taps: (rows.taps.as_ptr(), rows.taps.len()),
            kc: rows.kc,
            w: w.as_ptr(),
            c: out.c.as_mut_ptr(),
            rs: out.rs,
            cols: out.cols,
            bias: out.bias.as_ptr(),
            clamp: out.clamp,
            accumulate: out.accumulate,
        };
        // SAFETY: every row, weight, output and bias the kernel reads or writes was
        // checked above; the instruction set is available and takes `q`.
        unsafe {
            if isa == Isa::Avx512 {
                x86::avx512(n, q, call);
            } else {
                x86::avx2(n, q, call);
            }
        }
        Ok(())
    }
    // No kernels here: `grouped_interleaves` is empty, so the check above failed.
    #[cfg(not(target_arch = "x86_64"))]
    Ok(())
}

/// Interleaves whole vectors of `src` into `dst` as the kernel reads them when each
/// block of `q` groups is one vector (`lanes / q` input channels per group): value
/// `g · lanes / q + i` of a vector to `i · q + g`. Returns the values written (none
/// where `isa` has no such kernel); the caller copies the rest.
pub(crate) fn interleave_vectors(isa: Isa, q: usize, dst: &mut [f32], src: &[f32]) -> usize {
    let n = dst.len().min(src.len()) / isa.lanes().max(1) * isa.lanes();
    if n == 0 || q == 1 || !grouped_interleaves(isa).contains(&q) || !isa.is_available() {
        return 0;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `n` values of both, a whole number of vectors; the instruction set is
    // available.
    unsafe {
        if isa == Isa::Avx512 {
            x86::interleave512(q, dst.as_mut_ptr(), src.as_ptr(), n);
        } else {
            x86::interleave256(q, dst.as_mut_ptr(), src.as_ptr(), n);
        }
        n
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Interleaves the 4-byte quads of blocks of `q` groups from `src` into `dst` as the
/// interleaved kernels read them (quads of bytes for the 8-bit kernel, `f32` values
/// for the float one), each byte shifted by `flip` (XOR): in a block
/// of `block` quads (`q` groups of `block / q`), quad `p` of group `g` goes from `g ·
/// block / q + p` to `p · q + g`. Pixels are `dst_pixel` bytes apart in `dst` (whole
/// blocks) and `src_pixel` in `src` (as many or fewer: a last block's missing groups
/// read `fill`, unshifted). Returns false, with nothing written, without AVX-512 or
/// where the shapes do not fit a vector's permutation; the caller copies instead.
pub(crate) fn interleave_quads(
    (q, block): (usize, usize),
    (flip, fill): (u8, u8),
    (dst, dst_pixel): (&mut [u8], usize),
    (src, src_pixel): (&[u8], usize),
) -> bool {
    let pixels = dst.len().checked_div(dst_pixel).unwrap_or(0);
    let fits = block > 0
        && 16 % block == 0
        && block.is_multiple_of(q)
        && dst_pixel.is_multiple_of(4 * block)
        && src_pixel.is_multiple_of(4)
        && src_pixel <= dst_pixel
        && pixels
            .checked_mul(src_pixel)
            .is_some_and(|n| n <= src.len());
    if !fits || pixels == 0 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx512.is_available() {
        // SAFETY: `pixels` pixels of `dst_pixel` bytes in `dst` and of `src_pixel` in
        // `src` (checked above); AVX-512F is available.
        unsafe {
            x86::interleave_quads512(
                (q, block),
                (flip, fill),
                (dst.as_mut_ptr(), dst_pixel),
                (src.as_ptr(), src_pixel),
                pixels,
            )
        };
        return true;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (flip, fill);
    false
}

/// For lane `j = i · q + g` of a block of `block` lanes (from `j`'s block start), the
/// lane of the source that holds it: `g · block / q + i`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::indexing_slicing)] // j < L indexes an array of length L (`get_mut` is not const)
pub(super) const fn interleaved<const L: usize>(q: usize, block: usize) -> [i32; L] {
    let mut lanes = [0; L];
    let mut j = 0;
    while j < L {
        let (base, k) = (j / block * block, j % block);
        lanes[j] = (base + (k % q) * (block / q) + k / q) as i32;
        j += 1;
    }
    lanes
}

/// [`interleaved`] over whole vectors of `L` lanes, for the interleaves the kernels
/// take computed at compile time: the copy of a grouped convolution's input permutes
/// a few vectors per pixel, and computing the order at each pixel took a third of
/// the copy (23% of regnet's 104-channel stride-2 layer).
#[cfg(target_arch = "x86_64")]
pub(super) fn whole_vectors<const L: usize>(q: usize) -> [i32; L] {
    match q {
        2 => const { interleaved::<L>(2, L) },
        4 => const { interleaved::<L>(4, L) },
        8 => const { interleaved::<L>(8, L) },
        _ => interleaved::<L>(q, L),
    }
}

/// For lane `j` of a vector of `L / q` outputs of each of `q` groups (channel order),
/// the lane of the interleaved accumulator that holds it: `(j % cog) · q + j / cog`.
#[cfg(target_arch = "x86_64")]
pub(super) fn lane_order<const L: usize>(q: usize) -> [i32; L] {
    let cog = L / q;
    std::array::from_fn(|j| ((j % cog) * q + j / cog) as i32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::indirect::x86::{
        avx2_load_first, avx2_store_first, avx512_load_first, avx512_store_first,
    };

    /// The pointers of a checked call (see `grouped_microkernel`).
    #[derive(Clone, Copy)]
    pub(super) struct Call {
        pub a: *const f32,
        pub pixels: *const usize,
        pub taps: (*const usize, usize),
        pub kc: usize,
        pub w: *const f32,
        pub c: *mut f32,
        pub rs: usize,
        pub cols: usize,
        pub bias: *const f32,
        pub clamp: (f32, f32),
        pub accumulate: bool,
    }

    /// `q` values at `p` repeated over a 512-bit vector.
    ///
    /// # Safety
    /// AVX-512F; `q` values readable at `p`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn splat512<const Q: usize>(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract; unaligned reads of exactly `Q` values.
        unsafe {
            match Q {
                1 => _mm512_set1_ps(*p),
                2 => _mm512_castpd_ps(_mm512_set1_pd(p.cast::<f64>().read_unaligned())),
                4 => _mm512_broadcast_f32x4(_mm_loadu_ps(p)),
                _ => _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p.cast()))),
            }
        }
    }

    /// `q` values at `p` repeated over a 256-bit vector.
    ///
    /// # Safety
    /// AVX2; `q` values readable at `p`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn splat256<const Q: usize>(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract; unaligned reads of exactly `Q` values.
        unsafe {
            match Q {
                1 => _mm256_set1_ps(*p),
                2 => _mm256_castpd_ps(_mm256_set1_pd(p.cast::<f64>().read_unaligned())),
                _ => _mm256_broadcast_ps(&p.cast::<__m128>().read_unaligned()),
            }
        }
    }

    /// # Safety
    /// AVX-512F; `n` values (a multiple of 16) at both pointers.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn interleave512(q: usize, dst: *mut f32, src: *const f32, n: usize) {
        // SAFETY: the caller's contract: whole vectors inside both.
        unsafe {
            let idx = _mm512_loadu_si512(super::whole_vectors::<16>(q).as_ptr().cast());
            for v in (0..n).step_by(16) {
                let x = _mm512_loadu_ps(src.add(v));
                _mm512_storeu_ps(dst.add(v), _mm512_permutexvar_ps(idx, x));
            }
        }
    }

    /// # Safety
    /// AVX2; `n` values (a multiple of 8) at both pointers.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn interleave256(q: usize, dst: *mut f32, src: *const f32, n: usize) {
        // SAFETY: the caller's contract: whole vectors inside both.
        unsafe {
            let idx = _mm256_loadu_si256(super::whole_vectors::<8>(q).as_ptr().cast());
            for v in (0..n).step_by(8) {
                let x = _mm256_loadu_ps(src.add(v));
                _mm256_storeu_ps(dst.add(v), _mm256_permutevar8x32_ps(x, idx));
            }
        }
    }

    /// # Safety
    /// AVX-512F; `pixels` pixels of `dp` bytes at `dst` and of `sp` at `src`, `dp` a
    /// multiple of `4 · block` and `sp` of 4, `sp <= dp`; `block` divides 16 and is a
    /// multiple of `q`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn interleave_quads512(
        (q, block): (usize, usize),
        (flip, fill): (u8, u8),
        (dst, dp): (*mut u8, usize),
        (src, sp): (*const u8, usize),
        pixels: usize,
    ) {
        let mask = |n: usize| u16::try_from((1u32 << n.min(16)) - 1).unwrap_or(u16::MAX);
        // Quads per pixel.
        let (dq, sq) = (dp / 4, sp / 4);
        // SAFETY: the caller's contract: each vector's lanes below the masks lie inside
        // its pixel of both; a permutation stays inside the blocks of a vector.
        unsafe {
            let idx = _mm512_loadu_si512(super::interleaved::<16>(q, block).as_ptr().cast());
            // The fill shifted back, so that the shift of every lane restores it.
            let fill = _mm512_set1_epi8((fill ^ flip) as i8);
            let flip = _mm512_set1_epi8(flip as i8);
            for px in 0..pixels {
                let (d, s) = (dst.add(px * dp), src.add(px * sp));
                for v in (0..dq).step_by(16) {
                    let x = _mm512_mask_loadu_epi32(
                        fill,
                        mask(sq.saturating_sub(v)),
                        s.add(4 * v).cast(),
                    );
                    let x = _mm512_permutexvar_epi32(idx, _mm512_xor_si512(x, flip));
                    _mm512_mask_storeu_epi32(d.add(4 * v).cast(), mask(dq - v), x);
                }
            }
        }
    }

    macro_rules! permute512 {
        ($x:expr, $idx:expr) => {
            _mm512_permutexvar_ps($idx, $x)
        };
    }

    macro_rules! permute256 {
        ($x:expr, $idx:expr) => {
            _mm256_permutevar8x32_ps($x, $idx)
        };
    }

    macro_rules! kernel {
        ($feat:literal, $name:ident, $dispatch:ident, $v:ty, $lanes:literal, $splat:ident,
         $zero:ident, $load:ident, $loadn:ident, $storen:ident, $set1:ident, $fmadd:ident, $add:ident,
         $max:ident, $min:ident, $order:ident, $permute:ident, [$($q:literal)*], [$($r:literal)*]) => {
            /// # Safety
            /// The CPU has the features; `R` pixels; the call's lengths checked by
            /// `grouped_microkernel` for them.
            #[target_feature(enable = $feat)]
            unsafe fn $name<const R: usize, const Q: usize>(k: Call) {
                let mut acc = [$zero(); R];
                let (taps, nt) = k.taps;
                for t in 0..nt {
                    // SAFETY: t < nt, i < R: the checked taps and pixels, whose rows
                    // hold kc steps of Q values.
                    unsafe {
                        let off = *taps.add(t);
                        let rows: [*const f32; R] =
                            std::array::from_fn(|i| k.a.add(*k.pixels.add(i) + off));
                        let wt = k.w.add(t * k.kc * $lanes);
                        for p in 0..k.kc {
                            let wv = $load(wt.add(p * $lanes));
                            for (x, &row) in acc.iter_mut().zip(&rows) {
                                *x = $fmadd($splat::<Q>(row.add(p * Q)), wv, *x);
                            }
                        }
                    }
                }
                // SAFETY: `lanes` indices read from a local array.
                let idx = unsafe { $order(super::lane_order::<$lanes>(Q).as_ptr().cast()) };
                let (lo, hi) = ($set1(k.clamp.0), $set1(k.clamp.1));
                // SAFETY: `cols` bias values and R rows of `cols` outputs at `rs`.
                unsafe {
                    let bias = $loadn(k.bias, k.cols);
                    for (i, &x) in acc.iter().enumerate() {
                        let cp = k.c.add(i * k.rs);
                        let mut x = $permute!(x, idx);
                        if k.accumulate {
                            x = $add(x, $loadn(cp, k.cols));
                        }
                        $storen(cp, k.cols, $min(hi, $max(lo, $add(x, bias))));
                    }
                }
            }

            /// # Safety
            /// As the kernel, with `1 <= rows <= GROUPED_MR` and `q` one of the
            /// interleaves it takes.
            pub(super) unsafe fn $dispatch(rows: usize, q: usize, k: Call) {
                /// # Safety
                /// As the kernel, with `1 <= rows <= GROUPED_MR`.
                unsafe fn tile<const Q: usize>(rows: usize, k: Call) {
                    // SAFETY: forwarded contract.
                    unsafe {
                        match rows {
                            $($r => $name::<$r, Q>(k),)*
                            _ => $name::<{ super::GROUPED_MR }, Q>(k),
                        }
                    }
                }
                // SAFETY: forwarded contract.
                unsafe {
                    match q {
                        $($q => tile::<$q>(rows, k),)*
                        _ => {}
                    }
                }
            }
        };
    }

    kernel!(
        "avx512f,avx2,fma", avx512_tile, avx512, __m512, 16, splat512,
        _mm512_setzero_ps, _mm512_loadu_ps, avx512_load_first, avx512_store_first, _mm512_set1_ps,
        _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps,
        _mm512_loadu_si512, permute512,
        [1 2 4 8], [1 2 3 4 5 6 7 8 9 10 11]
    );

    kernel!(
        "avx2,fma", avx2_tile, avx2, __m256, 8, splat256,
        _mm256_setzero_ps, _mm256_loadu_ps, avx2_load_first, avx2_store_first, _mm256_set1_ps,
        _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps,
        _mm256_loadu_si256, permute256,
        [1 2 4], [1 2 3 4 5 6 7 8 9 10 11]
    );
}
