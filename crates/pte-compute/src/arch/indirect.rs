//! Indirect GEMM micro-kernels (XNNPACK's "igemm" idea): the left operand is not
//! packed but read in place through a list of row pointers per tap, so that a
//! convolution over NHWC images multiplies its input pixels directly (a 1×1
//! convolution has one tap whose rows are the input pixels; a k×k one has k·k taps
//! whose rows are the pixels each output pixel reads, or a zero row for padding).
//!
//! The right operand is a packed panel of [`crate::Gemm::pack_b`] (depth-major, `nr`
//! columns per depth step), its depth ordered tap by tap: `b[(t·kc + k)·nr + j]`.
//! The register tiles and the store through bias and clamp are those of the direct
//! kernels (`x86.rs`, `generic.rs`).

use super::{Isa, Post, RawPost, TileBias};
use crate::error::{Error, Result};
use crate::mat::MatMut;

/// Taps one call combines (larger windows take several calls, accumulating).
pub(crate) const MAX_TAPS: usize = 32;
/// Largest mr of any instruction set.
const MAX_MR: usize = 12;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::RawPost;

    macro_rules! kernel {
        ($feat:literal, $name:ident, $dispatch:ident, $v:ty, $mr:expr, $nr:expr, $lanes:expr,
         $zero:ident, $load:ident, $store:ident, $set1:ident, $fmadd:ident, $add:ident, $max:ident, $min:ident,
         [$($r:literal)*]) => {
            /// # Safety
            /// The CPU has the features; `a` holds `taps * R` slices of at least `kc`
            /// values (row `i` of tap `t` at `a[t * R + i]`); `b` holds
            /// `taps * kc * NR` values; `c` the tile `(i, j) -> c[i * rs + j]`, `i < R`,
            /// `j < NR`; a non-null `post.cols` holds NR values (rows bias unused).
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name<const R: usize>(
                taps: usize,
                kc: usize,
                a: *const &[f32],
                b: *const f32,
                c: *mut f32,
                rs: usize,
                accumulate: bool,
                post: RawPost,
            ) {
                const V: usize = $nr / $lanes;
                let mut acc = [[$zero(); V]; R];
                for t in 0..taps {
                    // SAFETY: t < taps: the pointers of this tap are inside `a`.
                    let rows: [*const f32; R] = std::array::from_fn(|i| unsafe { (*a.add(t * R + i)).as_ptr() });
                    // SAFETY: t * kc + p < taps * kc: inside `b`.
                    let bt = unsafe { b.add(t * kc * $nr) };
                    for p in 0..kc {
                        // SAFETY: p < kc: inside each row and the panel.
                        unsafe {
                            let bp = bt.add(p * $nr);
                            let bv: [$v; V] = std::array::from_fn(|v| $load(bp.add(v * $lanes)));
                            for (row, &ap) in acc.iter_mut().zip(&rows) {
                                let av = $set1(*ap.add(p));
                                for (x, &y) in row.iter_mut().zip(&bv) {
                                    *x = $fmadd(av, y, *x);
                                }
                            }
                        }
                    }
                }
                let (lo, hi) = ($set1(post.min), $set1(post.max));
                for (i, row) in acc.iter().enumerate() {
                    for (v, &x) in row.iter().enumerate() {
                        // SAFETY: inside the tile; a column bias holds NR values.
                        unsafe {
                            let cp = c.add(i * rs + v * $lanes);
                            let mut x = if accumulate { $add(x, $load(cp)) } else { x };
                            if post.on {
                                if !post.cols.is_null() {
                                    x = $add(x, $load(post.cols.add(v * $lanes)));
                                }
                                x = $min(hi, $max(lo, x));
                            }
                            $store(cp, x);
                        }
                    }
                }
            }

            /// # Safety
            /// As the kernel, with `1 <= rows <= MR`.
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn $dispatch(
                rows: usize,
                taps: usize,
                kc: usize,
                a: *const &[f32],
                b: *const f32,
                c: *mut f32,
                rs: usize,
                accumulate: bool,
                post: RawPost,
            ) {
                // SAFETY: forwarded contract.
                unsafe {
                    match rows {
                        $($r => $name::<$r>(taps, kc, a, b, c, rs, accumulate, post),)*
                        _ => $name::<$mr>(taps, kc, a, b, c, rs, accumulate, post),
                    }
                }
            }
        };
    }

    kernel!(
        "avx2,fma", avx2_tile, avx2, __m256, 6, 16, 8,
        _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
        _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps,
        [1 2 3 4 5]
    );

    kernel!(
        "avx512f,avx2,fma", avx512_tile, avx512, __m512, 12, 32, 16,
        _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
        _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps,
        [1 2 3 4 5 6 7 8 9 10 11]
    );
}

/// The portable kernel over rows given as slices (no `unsafe`): what the compiler
/// vectorizes for the baseline target, and the reference of the tests.
#[allow(clippy::too_many_arguments)]
fn portable<const NR: usize>(
    rows: usize,
    taps: usize,
    kc: usize,
    a: &[&[f32]],
    b: &[f32],
    c: &mut MatMut<'_>,
    (i0, j0): (usize, usize),
    accumulate: bool,
    post: Option<&Post<'_>>,
) {
    let mut acc = [[0f32; NR]; MAX_MR];
    for t in 0..taps {
        let bt = b.get(t * kc * NR..).unwrap_or_default();
        for (i, row) in acc.iter_mut().enumerate().take(rows) {
            let x = a.get(t * rows + i).copied().unwrap_or_default();
            for (p, bp) in bt.chunks_exact(NR).take(kc).enumerate() {
                let xv = x.get(p).copied().unwrap_or(0.0);
                for (s, &y) in row.iter_mut().zip(bp) {
                    *s += xv * y;
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(rows) {
        let Some(out) = c.row_run(i0 + i, j0, NR) else {
            continue;
        };
        for (j, (o, &s)) in out.iter_mut().zip(row).enumerate() {
            let mut x = if accumulate { *o + s } else { s };
            if let Some(p) = post {
                if let TileBias::Cols(v) = p.bias {
                    x += v.get(j).copied().unwrap_or(0.0);
                }
                x = crate::elementwise::clamp(x, p.min, p.max);
            }
            *o = x;
        }
    }
}

/// The rows of one tile of an indirect product, checked once: `taps · rows` slices of
/// at least `kc` values, row `i` of tap `t` at `t · rows + i`.
#[derive(Clone, Copy)]
pub(crate) struct IndirectRows<'a> {
    a: &'a [&'a [f32]],
    rows: usize,
    taps: usize,
    kc: usize,
}

impl<'a> IndirectRows<'a> {
    /// Checks the lengths.
    pub(crate) fn new(a: &'a [&'a [f32]], rows: usize, taps: usize, kc: usize) -> Result<Self> {
        let n = taps.saturating_mul(rows);
        match a.get(..n) {
            Some(a) if taps <= MAX_TAPS && rows <= MAX_MR && a.iter().all(|r| r.len() >= kc) => {
                Ok(Self { a, rows, taps, kc })
            }
            _ => Err(Error::InvalidParameter {
                what: format!(
                    "indirect rows: {taps} taps x {rows} rows of depth {kc}, {} slices given",
                    a.len()
                ),
            }),
        }
    }
}

/// One tile of an indirect product: `C[i][j] (+)= Σ_t Σ_k a[t·rows + i][k] · b[(t·kc +
/// k)·nr + j]` for the `rows × nr` tile of `c` at `(i, j)` (`+=` when `accumulate`),
/// then the post (column bias and clamp) if given. Every length is checked first:
/// `a` holds `taps · rows` rows of at least `kc` values, `b` `taps · kc · nr` values,
/// the tile lies inside `c` with contiguous columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn indirect_microkernel(
    isa: Isa,
    rows_in: &IndirectRows<'_>,
    b: &[f32],
    c: &mut MatMut<'_>,
    (i, j): (usize, usize),
    accumulate: bool,
    post: Option<&Post<'_>>,
) -> Result {
    let IndirectRows { a, rows, taps, kc } = *rows_in;
    let (mr, nr) = isa.gemm_tile();
    let ok = rows >= 1
        && rows <= mr
        && taps
            .checked_mul(kc)
            .and_then(|v| v.checked_mul(nr))
            .is_some_and(|l| b.len() >= l)
        && post.is_none_or(|p| match p.bias {
            TileBias::Cols(v) => v.len() >= nr,
            TileBias::None => true,
            TileBias::Rows(_) => false,
        });
    let tile = c.tile_ptr(i, j, rows, nr);
    let Some((cp, rs)) = tile.filter(|_| ok && isa.is_available()) else {
        return Err(Error::InvalidParameter {
            what: format!(
                "indirect micro-kernel call: {rows} rows (mr {mr}), {taps} taps of depth {kc}, {} rows given, b {}",
                a.len(),
                b.len()
            ),
        });
    };
    let raw = RawPost {
        on: post.is_some(),
        rows: std::ptr::null(),
        cols: match post.map(|p| p.bias) {
            Some(TileBias::Cols(v)) => v.as_ptr(),
            _ => std::ptr::null(),
        },
        min: post.map_or(0.0, |p| p.min),
        max: post.map_or(0.0, |p| p.max),
    };
    let _ = (cp, rs, raw);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            // SAFETY: every length checked above or by `IndirectRows::new`; the
            // instruction set is available.
            unsafe {
                if isa == Isa::Avx512 {
                    x86::avx512(
                        rows,
                        taps,
                        kc,
                        a.as_ptr(),
                        b.as_ptr(),
                        cp,
                        rs,
                        accumulate,
                        raw,
                    );
                } else {
                    x86::avx2(
                        rows,
                        taps,
                        kc,
                        a.as_ptr(),
                        b.as_ptr(),
                        cp,
                        rs,
                        accumulate,
                        raw,
                    );
                }
            }
        }
        _ => match nr {
            8 => portable::<8>(rows, taps, kc, a, b, c, (i, j), accumulate, post),
            32 => portable::<32>(rows, taps, kc, a, b, c, (i, j), accumulate, post),
            _ => portable::<16>(rows, taps, kc, a, b, c, (i, j), accumulate, post),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_kernel_matches_the_portable_one() {
        for isa in Isa::available() {
            let (mr, nr) = isa.gemm_tile();
            let (taps, kc) = (3, 7);
            let src: Vec<f32> = (0..200).map(|v| (v % 13) as f32 * 0.25 - 1.0).collect();
            let rows_data: Vec<&[f32]> = (0..taps * mr).map(|r| &src[(r * 5) % 150..]).collect();
            let b: Vec<f32> = (0..taps * kc * nr).map(|v| (v % 7) as f32 - 3.0).collect();
            let bias: Vec<f32> = (0..nr).map(|v| v as f32).collect();
            for rows in 1..=mr {
                let a: Vec<&[f32]> = (0..taps)
                    .flat_map(|t| (0..rows).map(move |i| (t, i)))
                    .map(|(t, i)| rows_data[t * mr + i])
                    .collect();
                let post = Post {
                    bias: TileBias::Cols(&bias),
                    min: -40.0,
                    max: 40.0,
                };
                for accumulate in [false, true] {
                    let mut want = vec![1.0f32; rows * nr];
                    let mut got = want.clone();
                    let mut wv = MatMut::row_major(&mut want, rows, nr).unwrap();
                    match nr {
                        8 => portable::<8>(
                            rows,
                            taps,
                            kc,
                            &a,
                            &b,
                            &mut wv,
                            (0, 0),
                            accumulate,
                            Some(&post),
                        ),
                        32 => portable::<32>(
                            rows,
                            taps,
                            kc,
                            &a,
                            &b,
                            &mut wv,
                            (0, 0),
                            accumulate,
                            Some(&post),
                        ),
                        _ => portable::<16>(
                            rows,
                            taps,
                            kc,
                            &a,
                            &b,
                            &mut wv,
                            (0, 0),
                            accumulate,
                            Some(&post),
                        ),
                    }
                    let mut gv = MatMut::row_major(&mut got, rows, nr).unwrap();
                    let r = IndirectRows::new(&a, rows, taps, kc).unwrap();
                    indirect_microkernel(isa, &r, &b, &mut gv, (0, 0), accumulate, Some(&post))
                        .unwrap();
                    for (x, y) in got.iter().zip(&want) {
                        assert!(
                            (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                            "{isa:?} rows {rows}: {x} vs {y}"
                        );
                    }
                }
            }
            let mut c = vec![0.0; nr];
            let mut v = MatMut::row_major(&mut c, 1, nr).unwrap();
            assert!(IndirectRows::new(&[&src[..4]], 1, 1, 8).is_err());
            assert!(IndirectRows::new(&[&src[..4]], 2, 1, 1).is_err());
            let one = [&src[..4]];
            let r = IndirectRows::new(&one, 1, 1, 4).unwrap();
            assert!(indirect_microkernel(isa, &r, &b[..3], &mut v, (0, 0), false, None).is_err());
        }
    }
}

/// The pixels of a depthwise convolution (or pooling) tile: for each of `pixels`
/// output pixels, `taps` input pixel rows of at least `channels` values each
/// (`a[p · taps + t]`), checked once.
#[derive(Clone, Copy)]
pub(crate) struct PixelTaps<'a> {
    a: &'a [&'a [f32]],
    pixels: usize,
    taps: usize,
    channels: usize,
}

impl<'a> PixelTaps<'a> {
    /// Checks the lengths.
    pub(crate) fn new(
        a: &'a [&'a [f32]],
        pixels: usize,
        taps: usize,
        channels: usize,
    ) -> Result<Self> {
        let n = pixels.saturating_mul(taps);
        match a.get(..n) {
            Some(a) if a.iter().all(|r| r.len() >= channels) => Ok(Self {
                a,
                pixels,
                taps,
                channels,
            }),
            _ => Err(Error::InvalidParameter {
                what: format!(
                    "pixel taps: {pixels} pixels x {taps} taps of {channels} channels, {} rows given",
                    a.len()
                ),
            }),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_dw {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA are available; `a` holds `pixels · taps` pointers to `c` values;
    /// `w` `taps · c` values (tap-major); `bias` `c`; `out` `pixels · c`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn depthwise(
        pixels: usize,
        taps: usize,
        c: usize,
        a: *const &[f32],
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
        first: bool,
        last: bool,
        min: f32,
        max: f32,
    ) {
        let (lo, hi) = (_mm256_set1_ps(min), _mm256_set1_ps(max));
        for p in 0..pixels {
            // SAFETY: p < pixels: its taps and output are inside `a` and `out`.
            unsafe {
                let rows = a.add(p * taps);
                let o = out.add(p * c);
                let init = if first { bias } else { o as *const f32 };
                let mut c0 = 0;
                while c0 + 16 <= c {
                    let mut x0 = _mm256_loadu_ps(init.add(c0));
                    let mut x1 = _mm256_loadu_ps(init.add(c0 + 8));
                    for t in 0..taps {
                        let r = (*rows.add(t)).as_ptr().add(c0);
                        let wt = w.add(t * c + c0);
                        x0 = _mm256_fmadd_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(wt), x0);
                        x1 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(r.add(8)),
                            _mm256_loadu_ps(wt.add(8)),
                            x1,
                        );
                    }
                    if last {
                        x0 = _mm256_min_ps(hi, _mm256_max_ps(lo, x0));
                        x1 = _mm256_min_ps(hi, _mm256_max_ps(lo, x1));
                    }
                    _mm256_storeu_ps(o.add(c0), x0);
                    _mm256_storeu_ps(o.add(c0 + 8), x1);
                    c0 += 16;
                }
                while c0 + 8 <= c {
                    let mut x0 = _mm256_loadu_ps(init.add(c0));
                    for t in 0..taps {
                        let r = (*rows.add(t)).as_ptr().add(c0);
                        x0 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(r),
                            _mm256_loadu_ps(w.add(t * c + c0)),
                            x0,
                        );
                    }
                    if last {
                        x0 = _mm256_min_ps(hi, _mm256_max_ps(lo, x0));
                    }
                    _mm256_storeu_ps(o.add(c0), x0);
                    c0 += 8;
                }
                while c0 < c {
                    let mut x = *init.add(c0);
                    for t in 0..taps {
                        x = (*(*rows.add(t)).as_ptr().add(c0)).mul_add(*w.add(t * c + c0), x);
                    }
                    if last {
                        x = crate::elementwise::clamp(x, min, max);
                    }
                    *o.add(c0) = x;
                    c0 += 1;
                }
            }
        }
    }
}

/// Depthwise products of a tile of pixels: `out[p][ch] = (first ? bias[ch] :
/// out[p][ch]) + Σ_t a[p][t][ch] · w[t][ch]`, clamped to `[min, max]` when `last`.
/// Lengths are checked: `w` holds `taps · channels` values, `bias` and each output
/// pixel `channels`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn depthwise_pixels(
    isa: Isa,
    a: &PixelTaps<'_>,
    w: &[f32],
    bias: &[f32],
    out: &mut [f32],
    first: bool,
    last: bool,
    min: f32,
    max: f32,
) -> Result {
    let PixelTaps {
        a,
        pixels,
        taps,
        channels: c,
    } = *a;
    let ok = taps.checked_mul(c).is_some_and(|l| w.len() >= l)
        && bias.len() >= c
        && pixels.checked_mul(c).is_some_and(|l| out.len() >= l);
    if !ok {
        return Err(Error::InvalidParameter {
            what: format!("depthwise tile of {pixels} pixels, {taps} taps, {c} channels"),
        });
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_available() => {
            // SAFETY: lengths checked above and by `PixelTaps::new`; AVX2 is available.
            unsafe {
                x86_dw::depthwise(
                    pixels,
                    taps,
                    c,
                    a.as_ptr(),
                    w.as_ptr(),
                    bias.as_ptr(),
                    out.as_mut_ptr(),
                    first,
                    last,
                    min,
                    max,
                );
            }
        }
        _ => {
            for (p, o) in out.chunks_exact_mut(c.max(1)).take(pixels).enumerate() {
                if first {
                    o.copy_from_slice(bias.get(..c).unwrap_or_default());
                }
                for t in 0..taps {
                    let (Some(r), Some(wt)) = (a.get(p * taps + t), w.get(t * c..(t + 1) * c))
                    else {
                        continue;
                    };
                    for ((o, &x), &wv) in o.iter_mut().zip(r.iter()).zip(wt) {
                        *o = x.mul_add(wv, *o);
                    }
                }
                if last {
                    for v in o.iter_mut() {
                        *v = crate::elementwise::clamp(*v, min, max);
                    }
                }
            }
        }
    }
    Ok(())
}
